// tensorplay/graph/detail/conditional_builder.hpp: conditional nodes inside an open capture: what a
// predicate or switch index may be, the kernel that copies it into the node's handle, creating
// the node, and capturing its bodies.
//
// How a body is built (capture_session.hpp says why): the node is created first, directly in the
// graph that will hold it (the capture's graph at the top level, the enclosing node's body graph
// inside a body). Its bodies are then captured as captures of their own; when one closes, its
// nodes and edges are copied into the node's body graph. A conditional node opened inside a body
// is represented in that body's capture by an empty node, replaced by the real node at the copy.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_doctor.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/random_epoch.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/capture_session.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#include <tensorplay/graph/detail/device_predicates.cuh>
#endif

namespace tensorplay::detail {

//! True for `[=] __device__ (...) {...}` closures (nvcc --extended-lambda). In the host pass
//! their call operator is invisible, so the type, not a call, has to tell.
template <class F>
inline constexpr bool is_extended_device_lambda_v =
#if defined(__CUDACC_EXTENDED_LAMBDA__)
    __nv_is_extended_device_lambda_closure_type(F) || __nv_is_extended_host_device_lambda_closure_type(F);
#else
    false;
#endif

//! Something evaluated on the GPU, at its point in the graph, instead of a tensor: an extended
//! __device__ lambda or a functor with a device-callable operator(). Passed to a kernel by value;
//! its result type is checked where the kernel is compiled. Needs nvcc (the kernel is the
//! caller's): host-only translation units use tensor predicates.
template <class F>
concept DeviceCallable =
    !Tensor<F> && std::is_class_v<std::remove_cvref_t<F>> && std::is_copy_constructible_v<std::remove_cvref_t<F>> &&
    (is_extended_device_lambda_v<std::remove_cvref_t<F>> || std::is_invocable_v<const std::remove_cvref_t<F>&>);

//! A device callable returning bool: `[=] __device__ { return *residual > tolerance; }`.
template <class F>
concept DevicePredicate =
    DeviceCallable<F> && (is_extended_device_lambda_v<std::remove_cvref_t<F>> ||
                          std::is_invocable_r_v<bool, const std::remove_cvref_t<F>&>);

template <class P>
concept Predicate = ScalarPredicate<P> || DevicePredicate<P>;

//! A one-element integral device tensor (switch_'s index).
template <class T>
concept IndexTensor =
    ContiguousTensor<T> && !RuntimeTyped<T> && std::integral<element_t<T>> && !std::same_as<element_t<T>, bool>;

//! A device callable returning an integer (switch_'s index).
template <class F>
concept DeviceIndex = DeviceCallable<F> && (is_extended_device_lambda_v<std::remove_cvref_t<F>> ||
                                            std::integral<std::invoke_result_t<const std::remove_cvref_t<F>&>>);

template <class I>
concept SwitchIndex = IndexTensor<I> || DeviceIndex<I>;

//! The constraints of Graph's conditional-node calls, named so that a compiler's note on a
//! refused call says what is expected; generic code sees them (requires { g.if_(p, body); }).
template <class P>
concept BoolTensorOrDevicePredicate = Predicate<P>;
template <class I>
concept IntegralTensorOrDeviceIndex = SwitchIndex<I>;

//! Compile-time check of a predicate's type, with the message users see.
template <class P>
consteval bool check_predicate_type() {
  static_assert(Predicate<P>,
                "tensorplay: the predicate must be a one-element device tensor of bool (DeviceTensor<bool>, "
                "thrust::device_vector<bool>, std::span<bool> over device memory) or a __device__ callable "
                "returning bool (nvcc --extended-lambda)");
  return true;
}

//! Calls a body as body(stream) when it takes a stream, else as body().
template <class F>
void call_body(F& body, StreamRef stream) {
  if constexpr (std::is_invocable_v<F&, StreamRef>) {
    body(stream);
  } else {
    static_assert(std::is_invocable_v<F&>, "tensorplay: a body must be callable as body(StreamRef) or body()");
    body();
  }
}

//! Why if_else_ and switch_ can or cannot run: both need CUDA 12.8 in the runtime and the driver.
TENSORPLAY_DECL void require_multi_body_conditionals(int runtime_version, int driver_version, const char* what);

TENSORPLAY_DECL void require_multi_body_conditionals(const char* what, const tensorplay::source_location& where);

//! Checks that a one-element tensor lives on `device` (or is managed) and returns its address.
template <ContiguousTensor T>
const void* checked_scalar(const T& t, int device, const char* what, const char* role, const tensorplay::source_location& where) {
  if (tensor_size(t) != 1)
    throw_usage(std::string(what) + ": the " + role + " must have exactly one element; it has " +
                std::to_string(tensor_size(t)));
  const void* ptr = tensor_data(t);
  if (ptr == nullptr) throw_usage(std::string(what) + ": the " + role + " has no memory");
  if constexpr (KnowsDevice<T>) {
    if (traits_of<T>::device(t) != device)
      throw_usage(std::string(what) + ": the " + role + " lives on device " + std::to_string(traits_of<T>::device(t)) +
                  ", the capture on device " + std::to_string(device));
  } else {
    const PointerInfo info = pointer_info(ptr, where);
    if (!info.device_accessible())
      throw_usage(std::string(what) + ": the " + role + " is not device-accessible memory (host memory?)");
    if (info.type == cudaMemoryTypeDevice && info.device != device)
      throw_usage(std::string(what) + ": the " + role + " lives on device " + std::to_string(info.device) +
                  ", the capture on device " + std::to_string(device));
  }
  return ptr;
}

//! Checks a predicate or index before anything is captured; returns what the set-handle kernel
//! reads (null for a device callable: nothing to check at run time).
template <class P>
const void* checked_condition(const P& pred, int device, const char* what, const tensorplay::source_location& where) {
  if constexpr (ScalarPredicate<P>) {
    if (!has_element_type(pred, DType::Bool))
      throw_usage(std::string(what) + ": the predicate's element type is " + element_name(pred) + "; it must be bool");
    return checked_scalar(pred, device, what, "predicate", where);
  } else if constexpr (IndexTensor<P>) {
    return checked_scalar(pred, device, what, "index", where);
  } else {
    return nullptr;
  }
}

//! True when the next node captured on `stream` would depend on exactly one kernel node, on a
//! device with programmatic dependent launch (compute capability 9.0 or newer): the set-handle
//! kernel is then captured with a programmatic edge, and its launch overlaps that kernel's end.
TENSORPLAY_DECL bool follows_one_kernel(cudaStream_t stream, int device) noexcept;

//! Captures, on `stream`, the kernel that copies the predicate (or index) into `handle`.
template <class P>
void capture_set_handle(cudaStream_t stream, int device, cudaGraphConditionalHandle handle, const P& pred,
                        const void* checked, const tensorplay::source_location& where) {
  const bool programmatic = follows_one_kernel(stream, device);
  if constexpr (ScalarPredicate<P> || IndexTensor<P>) {
    using Value = std::conditional_t<ScalarPredicate<P>, bool, element_t<P>>;
    (void)pred;  // checked: its address, read by the kernel
    const KernelLibrary& library = KernelLibrary::on(device, where);
    void* args[] = {&handle, &checked};
    launch(reinterpret_cast<const void*>(library.set_handle<Value>()), dim3(1), dim3(1), stream, programmatic, args,
           "cudaLaunchKernelEx (tensorplay set-handle kernel)", where);
  } else {
#if defined(__CUDACC__)
    using F = std::remove_cvref_t<P>;
    F callable(pred);
    void* args[] = {&handle, &callable};
    launch(reinterpret_cast<const void*>(&set_handle_from_callable<F>), dim3(1), dim3(1), stream, programmatic, args,
           "cudaLaunchKernelEx (tensorplay set-handle kernel)", where);
#else
    static_assert(sizeof(P) == 0, "tensorplay: a __device__ callable predicate needs nvcc; use a bool tensor");
#endif
  }
}

//! A conditional node just created: its body graphs (owned by CUDA with the node) and its handle.
struct ConditionalNode {
  cudaGraph_t* bodies;
  cudaGraphConditionalHandle handle;
};

//! The graph a conditional node made now at the current point of `session` goes into: the
//! capture's own graph at the top level, the enclosing node's body graph inside a body.
//! `info` receives the capture's state on the current stream.
//! \throws capture_error when the capture was invalidated earlier.
TENSORPLAY_DECL cudaGraph_t conditional_holder(CaptureSession& session, CaptureInfo& info, const tensorplay::source_location& where);

//! Adds a conditional node of `type` with `size` bodies, whose handle is `handle` (made in
//! `holder`), at the current point of `session`, after the nodes `info` names.
TENSORPLAY_DECL ConditionalNode insert_conditional_node(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                                        cudaGraphConditionalHandle handle, cudaGraph_t holder,
                                                        const CaptureInfo& info, const tensorplay::source_location& where);

//! Creates, at the current point of `session`, a conditional node of `type` with `size` bodies
//! (conditional_builder.hpp's header says where each lives). `make_handle(holder, stream)` gives
//! its handle: it may capture work on `stream` first (the set-handle kernel).
template <class MakeHandle>
ConditionalNode add_conditional_node_with(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                          MakeHandle&& make_handle, const tensorplay::source_location& where) {
  return session.abandon_on_throw([&] {
    CaptureInfo info;
    const cudaGraph_t holder = conditional_holder(session, info, where);
    const cudaGraphConditionalHandle handle = make_handle(holder, session.current());
    TENSORPLAY_CHECK(get_capture_info(session.current(), info), where);  // after what make_handle captured
    return insert_conditional_node(session, type, size, handle, holder, info, where);
  });
}

//! A conditional node whose handle the library sets: a set-handle kernel that copies the
//! predicate (or index) into a new handle, then the node.
template <class P>
ConditionalNode add_conditional_node(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                     const P& pred, const char* what, const tensorplay::source_location& where) {
  const void* checked = checked_condition(pred, session.device(), what, where);
  return add_conditional_node_with(
      session, type, size,
      [&](cudaGraph_t holder, cudaStream_t stream) {
        cudaGraphConditionalHandle handle = 0;
        TENSORPLAY_CHECK(cudaGraphConditionalHandleCreate(&handle, holder, 0, 0), where);
        capture_set_handle(stream, session.device(), handle, pred, checked, where);
        return handle;
      },
      where);
}

//! A conditional node whose handle the user's kernels set (Graph::conditional_handle): no kernel
//! of the library's. `serial` is the capture that made the handle.
TENSORPLAY_DECL ConditionalNode add_conditional_node(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                                     cudaGraphConditionalHandle handle, std::uint64_t serial, const char* what,
                                                     const tensorplay::source_location& where);

//! Makes a handle for a node at the current point of `session`, assigned `default_value` at every
//! launch of the graph that holds it (cudaGraphCondAssignDefault).
TENSORPLAY_DECL cudaGraphConditionalHandle make_conditional_handle(CaptureSession& session, unsigned default_value,
                                                                   const tensorplay::source_location& where);

//! Whether `graph` holds a conditional node at its top level (such a graph cannot be a child graph).
TENSORPLAY_DECL bool has_conditional_nodes(cudaGraph_t graph, const tensorplay::source_location& where);

//! Starts capturing a body of a node: a capture of its own on the stream of the next depth.
TENSORPLAY_DECL void open_body(CaptureSession& session, cudaGraph_t slot, cudaGraphConditionalHandle handle,
                      const tensorplay::source_location& where);

//! Copies one node of a closed body's capture into `to`; returns the copy.
TENSORPLAY_DECL cudaGraphNode_t copy_node(cudaGraphNode_t node, cudaGraph_t to, const tensorplay::source_location& where);

//! Moves what a closed body captured (`from`) into its node's body graph `to`: nodes, then edges
//! with their data (programmatic edges included). Empty nodes that stand for nested conditional
//! nodes map to those nodes, which already live in `to`.
TENSORPLAY_DECL void move_body(cudaGraph_t from, cudaGraph_t to, const std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>>& nested,
                      const tensorplay::source_location& where);

//! Ends the innermost body's capture and moves its work into its node. On failure the whole
//! capture is abandoned (only the body, under CaptureSession::KeepOpenOnFailure) and the error
//! propagates (cuda_error when CUDA invalidated it).
TENSORPLAY_DECL void close_body(CaptureSession& session, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/graph_topology.hpp>
#include <tensorplay/detail/handles.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void require_multi_body_conditionals(int runtime_version, int driver_version, const char* what) {
  constexpr int needed = 12080;
  if (runtime_version < needed || driver_version < needed)
    throw_usage(std::string(what) + " needs CUDA 12.8 or newer in both the runtime and the driver (runtime " +
                std::to_string(runtime_version) + ", driver " + std::to_string(driver_version) + ")");
}

TENSORPLAY_DECL void require_multi_body_conditionals(const char* what, const tensorplay::source_location& where) {
  int runtime = 0;
  int driver = 0;
  TENSORPLAY_CHECK(cudaRuntimeGetVersion(&runtime), where);
  TENSORPLAY_CHECK(cudaDriverGetVersion(&driver), where);
#if CUDART_VERSION < 12080
  runtime = CUDART_VERSION;  // compiled against headers without multi-body conditionals
#endif
  require_multi_body_conditionals(runtime, driver, what);
}

TENSORPLAY_DECL bool follows_one_kernel(cudaStream_t stream, int device) noexcept {
  if (compute_capability_major(device) < 9) return false;
  CaptureInfo info;
  if (get_capture_info(stream, info) != cudaSuccess || info.dependency_count != 1) {
    (void)cudaGetLastError();
    return false;
  }
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  if (cudaGraphNodeGetType(info.dependencies[0], &type) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return type == cudaGraphNodeTypeKernel;
}

TENSORPLAY_DECL bool has_conditional_nodes(cudaGraph_t graph, const tensorplay::source_location& where) {
  std::size_t count = 0;
  TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nullptr, &count), where);
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), where);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    TENSORPLAY_CHECK(cudaGraphNodeGetType(node, &type), where);
    if (type == cudaGraphNodeTypeConditional) return true;
  }
  return false;
}

TENSORPLAY_DECL cudaGraph_t conditional_holder(CaptureSession& session, CaptureInfo& info, const tensorplay::source_location& where) {
  const cudaStream_t stream = session.current();
  TENSORPLAY_CHECK(get_capture_info(stream, info), where);
  if (info.status != cudaStreamCaptureStatusActive)
    throw_capture_failure_on(cudaErrorStreamCaptureInvalidated, "cudaStreamGetCaptureInfo (the capture was invalidated earlier)",
                             stream, where);
  return session.depth() == 0 ? info.graph : session.bodies().back().slot;
}

TENSORPLAY_DECL ConditionalNode insert_conditional_node(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                                        cudaGraphConditionalHandle handle, cudaGraph_t holder,
                                                        const CaptureInfo& info, const tensorplay::source_location& where) {
  const cudaStream_t parent = session.current();
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = size;
  cudaGraphNode_t node = nullptr;
  session.note_conditional();
  note_conditional_node();  // RandomState: draws after the node start a new segment (random_epoch.hpp)
  if (session.depth() == 0) {
    TENSORPLAY_CHECK(add_node(&node, holder, info.dependencies, info.dependency_count, &params), where);
    TENSORPLAY_CHECK(set_capture_dependencies(parent, &node, 1), where);
  } else {
    // The real node has no edges yet; an empty node marks its place in the body's capture.
    TENSORPLAY_CHECK(add_node(&node, holder, nullptr, 0, &params), where);
    cudaGraphNode_t mark = nullptr;
    TENSORPLAY_CHECK(cudaGraphAddEmptyNode(&mark, info.graph, info.dependencies, info.dependency_count), where);
    TENSORPLAY_CHECK(set_capture_dependencies(parent, &mark, 1), where);
    session.bodies().back().nested.emplace_back(mark, node);
  }
  session.record_bodies(node, params.conditional.phGraph_out, size);
  return ConditionalNode{params.conditional.phGraph_out, handle};
}

TENSORPLAY_DECL ConditionalNode add_conditional_node(CaptureSession& session, cudaGraphConditionalNodeType type, unsigned size,
                                                     cudaGraphConditionalHandle handle, std::uint64_t serial, const char* what,
                                                     const tensorplay::source_location& where) {
  return add_conditional_node_with(
      session, type, size,
      [&](cudaGraph_t holder, cudaStream_t) {
        session.claim_handle(handle, serial, holder, what);
        return handle;
      },
      where);
}

TENSORPLAY_DECL cudaGraphConditionalHandle make_conditional_handle(CaptureSession& session, unsigned default_value,
                                                                   const tensorplay::source_location& where) {
  return session.abandon_on_throw([&] {
    CaptureInfo info;
    const cudaGraph_t holder = conditional_holder(session, info, where);
    cudaGraphConditionalHandle handle = 0;
    TENSORPLAY_CHECK(cudaGraphConditionalHandleCreate(&handle, holder, default_value, cudaGraphCondAssignDefault), where);
    session.issue_handle(handle, holder);
    return handle;
  });
}

TENSORPLAY_DECL void open_body(CaptureSession& session, cudaGraph_t slot, cudaGraphConditionalHandle handle,
    const tensorplay::source_location& where) {
  session.abandon_on_throw([&] {
    const cudaStream_t stream = session.body_stream(session.depth(), where);
    if (const cudaError_t status = begin_capture(stream, session.mode()); status != cudaSuccess)
      throw_begin_failure(status, "cudaStreamBeginCapture (conditional body)", where);
    CaptureSeq seq = 0;
    if (const cudaError_t status = get_capture_seq(stream, seq); status != cudaSuccess) {
      GraphHandle ignored;
      (void)end_capture(stream, ignored.out());
      check(status, "cudaStreamGetCaptureInfo", where);
    }
    BodyCapture body;
    body.stream = stream;
    body.seq = seq;
    body.handle = handle;
    body.slot = slot;
    session.push_body(std::move(body));
    CaptureRegistry::instance().locate_body(seq, where);  // for capture_error's message
  });
}

TENSORPLAY_DECL cudaGraphNode_t copy_node(cudaGraphNode_t node, cudaGraph_t to, const tensorplay::source_location& where) {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  TENSORPLAY_CHECK(cudaGraphNodeGetType(node, &type), where);
  cudaGraphNode_t copy = nullptr;
  switch (type) {
    case cudaGraphNodeTypeKernel: {
      // Through the driver: the runtime cannot describe kernels loaded from libraries (driver_api.hpp).
      const DriverApi& driver = DriverApi::get(where);
      DriverKernelNodeParams params{};
      check_driver(driver.kernel_node_get_params(node, &params), "cuGraphKernelNodeGetParams", where);
      check_driver(driver.add_kernel_node(&copy, to, nullptr, 0, &params), "cuGraphAddKernelNode", where);
      TENSORPLAY_CHECK(cudaGraphKernelNodeCopyAttributes(copy, node), where);
      return copy;
    }
    case cudaGraphNodeTypeMemset: {
      cudaMemsetParams params{};
      TENSORPLAY_CHECK(cudaGraphMemsetNodeGetParams(node, &params), where);
      TENSORPLAY_CHECK(cudaGraphAddMemsetNode(&copy, to, nullptr, 0, &params), where);
      return copy;
    }
    case cudaGraphNodeTypeMemcpy: {
      cudaMemcpy3DParms params{};
      TENSORPLAY_CHECK(cudaGraphMemcpyNodeGetParams(node, &params), where);
      TENSORPLAY_CHECK(cudaGraphAddMemcpyNode(&copy, to, nullptr, 0, &params), where);
      return copy;
    }
    case cudaGraphNodeTypeEmpty:
      TENSORPLAY_CHECK(cudaGraphAddEmptyNode(&copy, to, nullptr, 0), where);
      return copy;
    case cudaGraphNodeTypeGraph: {
      // CUDA refuses a graph that a node owns (what cudaGraphChildGraphNodeGetGraph returns) as
      // a child of a conditional body, and accepts a copy of it that nothing owns.
      cudaGraph_t child = nullptr;
      TENSORPLAY_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child), where);
      GraphHandle own;
      TENSORPLAY_CHECK(cudaGraphClone(own.out(), child), where);
      if (const cudaError_t status = cudaGraphAddChildGraphNode(&copy, to, nullptr, 0, own.get()); status != cudaSuccess) {
        (void)cudaGetLastError();
        // Seen with a replayed graph of NCCL collectives: CUDA accepts the collectives in the
        // body directly, not inside a child graph.
        if (status == cudaErrorNotSupported)
          throw conditional_body_error("tensorplay: CUDA does not accept this child graph (a replayed Graph) inside a conditional body "
                      "(cudaGraphAddChildGraphNode: operation not supported); capture its work into the body directly");
        check(status, "cudaGraphAddChildGraphNode", where);
      }
      return copy;
    }
    default:
      throw conditional_body_error("tensorplay: a conditional body may hold only kernels, memsets, memcpys, empty nodes, child graphs and "
                  "conditional nodes (CUDA's rule); this one captured a " +
                  std::string(tensorplay::to_string(type)) + " node");
  }
}

TENSORPLAY_DECL void move_body(cudaGraph_t from, cudaGraph_t to, const std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>>& nested,
    const tensorplay::source_location& where) {
  GraphTopology topology(from, where);
  // copies[i]: the copy of topology.nodes[i] in `to`.
  std::vector<cudaGraphNode_t> copies;
  copies.reserve(topology.nodes.size());
  for (cudaGraphNode_t node : topology.nodes) {
    cudaGraphNode_t copy = nullptr;
    for (auto [mark, real] : nested)
      if (mark == node) copy = real;
    copies.push_back(copy != nullptr ? copy : copy_node(node, to, where));
  }
  const std::size_t edges = topology.edge_count();
  if (edges == 0) return;
  for (std::size_t i = 0; i < edges; ++i) {
    topology.from[i] = copies[topology.index_of(topology.from[i])];
    topology.to[i] = copies[topology.index_of(topology.to[i])];
  }
  TENSORPLAY_CHECK(add_dependencies(to, topology.from.data(), topology.to.data(), topology.data.data(), edges), where);
}

TENSORPLAY_DECL void close_body(CaptureSession& session, const tensorplay::source_location& where) {
  GraphHandle captured;
  const BodyCapture body = [&] {
    const cudaError_t status = end_capture(session.bodies().back().stream, captured.out());
    BodyCapture closed = session.pop_body();
    if (status != cudaSuccess) {
      if (!session.keeps_open_on_failure()) session.abandon();
      throw_end_failure(status, "cudaStreamEndCapture (conditional body)", session.origin(), closed.seq, where);
    }
    return closed;
  }();
  session.abandon_on_throw([&] { move_body(captured.get(), body.slot, body.nested, where); });
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
