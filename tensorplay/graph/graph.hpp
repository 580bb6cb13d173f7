// tensorplay/graph/graph.hpp: Graph: capture work on a stream, compile it, replay it, change it.
//
// Graph keeps the public API and forwards to its parts, in graph/detail/:
//   capture_session.hpp      an open capture: begin, end, abandon, bodies, pool routing
//   conditional_builder.hpp  conditional nodes and their bodies
//   executable.hpp           the executable and all that must agree with it: the graphs it runs
//                            and was compiled from, the staging nodes, the plan cache
//   staging_nodes.hpp, staging.hpp  stage_and_launch: the staging nodes and the copy semantics
//   retained.hpp             what the graphs and executables keep alive (retain, the pool)
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/detail/random_epoch.hpp>
#include <tensorplay/detail/thread_streams.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/conditional_handle.hpp>
#include <tensorplay/graph/detail/capture_session.hpp>
#include <tensorplay/graph/detail/conditional_builder.hpp>
#include <tensorplay/graph/detail/staging_nodes.hpp>
#include <tensorplay/graph/detail/executable.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/detail/rebind.hpp>
#include <tensorplay/graph/detail/retained.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/graph/detail/staging.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <concepts>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tensorplay {

//! When Graph::capture_end compiles the executable.
enum class Instantiate { Now, Later };

//! The kinds of conditional node a ConditionalScope opens.
enum class ConditionalKind { If, While };

template <ConditionalKind K>
class ConditionalScope;

class Graph;

namespace detail {
TENSORPLAY_DECL const ConditionalBodies* recorded_bodies(const Graph& graph) noexcept;  // declared again after Graph

//! A file path: std::filesystem::path (native char), std::string, or a C string.
template <class P>
concept PathLike = std::convertible_to<const P&, const char*> || requires(const P& p) {
  { p.c_str() } -> std::convertible_to<const char*>;
};

template <PathLike P>
const char* path_c_str(const P& path) noexcept {
  if constexpr (std::convertible_to<const P&, const char*>) return path;
  else return path.c_str();
}

//! A tuple of lvalue references to the elements of `t` (references and temporaries alike).
template <class... T>
std::tuple<std::remove_reference_t<T>&...> tie_all(std::tuple<T...>& t) noexcept {
  return std::apply([](auto&... x) { return std::tuple<std::remove_reference_t<T>&...>(x...); }, t);
}
}  // namespace detail

//! A CUDA graph: capture work issued to a stream, compile it when capture ends, replay it.
//!
//!     tensorplay::Graph graph;
//!     graph.capture([&](tensorplay::StreamRef s) { step<<<blocks, threads, 0, s>>>(x.data()); });
//!     for (int i = 0; i < 1000; ++i) graph.replay(stream);
//!
//! Inside a capture (and inside every conditional body) current_stream() is the stream being
//! captured, and tensors allocated there come from the graph's pool, whose memory stays valid
//! and reserved for as long as the graph or such a tensor is alive.
//!
//! A Graph is move-only. One thread at a time may capture into it, update it, or call
//! stage_and_launch; replay(stream) may be called from any thread. Graphs that share a pool must
//! replay in the order they were captured and never concurrently. Destroying a Graph never waits
//! for replays still running on the GPU.
class Graph {
 public:
  Graph() noexcept;
  // (noexcept: a bundle is made only for a given pool, and bad_alloc there ends the program)
  explicit Graph(GraphOptions options) noexcept;

  // ---- capture --------------------------------------------------------------------------

  //! Starts capturing work issued to the capture stream (see CaptureOptions::stream), which
  //! becomes the current stream of its device until capture_end.
  //! \throws usage_error when a capture is open, the graph already holds one (reset() first),
  //!         the stream is already capturing, or the pool cannot be used. Nothing is left
  //!         capturing then, and another capture on the stream is left alone.
  void capture_begin(const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current());

  //! Ends the capture and compiles the executable.
  //! \throws usage_error without an open capture or with a conditional body still open;
  //!         cuda_error (with CUDA's status) when the capture was invalidated: the graph and
  //!         the stream are usable afterwards and the graph can capture again.
  void capture_end(tensorplay::source_location where = tensorplay::source_location::current());
  //! capture_end, compiling now or at instantiate() (Instantiate::Later): for captures that must
  //! all end before any is compiled, as on several devices from one thread, where CUDA refuses
  //! to instantiate while the thread has another capture open.
  void capture_end(Instantiate when, tensorplay::source_location where = tensorplay::source_location::current());

  //! capture_begin, then body(capture stream) or body(), then capture_end. If the body throws,
  //! the capture is abandoned (no stream is left capturing) and the exception propagates.
  template <class F>
  void capture(F&& body, const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    capture_begin(options, where);
    run_body(body);
    capture_end(where);
  }

  // update() reads the caller's CaptureOptions inline: g++ 12's false positive on their disengaged
  // std::optional members (options.hpp says which) is off here too.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  //! Captures `body` again, with this graph's pool and capture mode, and makes the executable
  //! run the new work: patched in place (cudaGraphExecUpdate) when CUDA accepts the new graph,
  //! compiled anew when it refuses (a changed topology, say, or launch attributes such as
  //! cluster dimensions that an update cannot carry). CUDA decides, not the library. A staged
  //! executable's staging nodes are carried over; retained objects stay retained.
  //!
  //!     auto r = graph.update([&](tensorplay::StreamRef s) { step<<<g, b, 0, s>>>(new_ptr, n); });
  //!
  //! \throws usage_error before any capture, or while a capture is open (the graph stays usable).
  //!         If the body throws, or CUDA invalidates the new capture, the exception propagates
  //!         and the graph still replays its old work.
  template <class F>
  UpdateResult update(F&& body, const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    if (is_capturing()) detail::throw_usage("update: a capture is open on this graph; call capture_end first");
    if (!exec_.holds_graph()) detail::throw_usage("update: nothing has been captured yet; capture the graph first");
    if (options.pool && !(*options.pool == pool_))
      detail::throw_usage("update: a new version captures into the graph's own pool; CaptureOptions::pool must be empty");
    CaptureOptions same = options;
    same.capture_error_mode = options.capture_error_mode.value_or(mode_);
    begin_session(same, pool_.impl(), where);
    run_body(body);
    rethrow_deferred();  // a ConditionalScope in the body that could not close its body
    detail::CapturedGraph captured = end_session(where);
    has_conditionals_ = captured.conditionals;
    const UpdateResult result = exec_.update(std::move(captured.graph), keep_.needed(), upload_stream(), where, std::move(captured.conditional_bodies));
    keep_kept(where);  // an object retained by the body: the executable must hold it too
    return result;
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

  //! Compiles the executable if that has not happened (capture_end does it): otherwise a no-op.
  void instantiate(tensorplay::source_location where = tensorplay::source_location::current());

  // ---- replay ---------------------------------------------------------------------------

  //! Launches the graph on this thread's current stream of the graph's device.
  void replay(tensorplay::source_location where = tensorplay::source_location::current());

  //! Launches the graph on `stream` (which must belong to the graph's device). This costs what
  //! cudaGraphLaunch costs. While `stream` is being captured (by another Graph or by raw CUDA
  //! calls), the graph is added to that capture as a child-graph node instead, and the outer
  //! graph keeps what this one needs (its pool, its retained objects) for as long as it lives.
  void replay(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current());

  //! Abandons an open capture, destroys the graph and executable, and drops the pool reference
  //! and the retained objects (each lives on until the last launch that can use it completes).
  void reset() noexcept;

  // ---- lifetime of what the graph uses ----------------------------------------------------

  //! Keeps `object` alive until this Graph is destroyed or reset(), and until the last launch
  //! of every executable made from it has completed (CUDA user objects). Its destructor runs on
  //! a thread of tensorplay's, so it may call CUDA (ncclCommDestroy, say).
  //!
  //!     graph.retain(std::shared_ptr<Communicator>(comm));   // a shared object
  //!     graph.retain(std::move(workspace));                   // any move-only object
  //! The first object retained after capture_end compiles the executable again; later ones join
  //! what the executable already holds (retained.hpp).
  template <class T>
  void retain(std::shared_ptr<T> object, tensorplay::source_location where = tensorplay::source_location::current()) {
    keep_.add(std::move(object));
    if (!is_capturing()) keep_kept(where);
  }
  template <class T>
    requires(!std::is_lvalue_reference_v<T>)
  void retain(T&& object, tensorplay::source_location where = tensorplay::source_location::current()) {
    keep_.add(std::forward<T>(object));
    if (!is_capturing()) keep_kept(where);
  }

  // ---- state ----------------------------------------------------------------------------

  //! The pool this graph captures into: the configured one, the one of its last capture, or
  //! (before any capture) a fresh private pool made now, so that other graphs can share it.
  [[nodiscard]] Pool pool() const;
  [[nodiscard]] PoolId pool_id() const;

  //! Makes debug_dump write every node attribute (kernel parameters, handles, ...).
  void enable_debug_mode() noexcept;

  //! Writes the captured graph as a DOT file: node types, kernel and conditional parameters
  //! (every attribute after enable_debug_mode). After the first stage_and_launch the graph
  //! begins with the staging nodes.
  //! `path`: a std::filesystem::path, a std::string or a C string (a template, so that this
  //! header does not pay for the filesystem header).
  //! \throws usage_error before any capture has ended.
  template <detail::PathLike Path>
  void debug_dump(const Path& path, tensorplay::source_location where = tensorplay::source_location::current()) const {
    debug_dump(path, debug_ ? DotFlags::Verbose : DotFlags::KernelParams | DotFlags::ConditionalParams, where);
  }
  //! Writes the captured graph as a DOT file with the given details.
  template <detail::PathLike Path>
  void debug_dump(const Path& path, DotFlags flags, tensorplay::source_location where = tensorplay::source_location::current()) const {
    if (!exec_.holds_graph()) detail::throw_usage("debug_dump: no capture has ended yet, so there is no graph to dump");
    TENSORPLAY_CHECK(cudaGraphDebugDotPrint(exec_.graph(), detail::path_c_str(path), detail::to_cuda(flags)), where);
  }

  //! Where work is captured right now: the innermost open conditional body, else the capture
  //! stream; a default StreamRef when not capturing.
  [[nodiscard]] StreamRef capture_stream() const noexcept;
  [[nodiscard]] bool is_capturing() const noexcept;
  [[nodiscard]] bool is_instantiated() const noexcept;
  //! The device of the captured graph; -1 before the first capture ended.
  [[nodiscard]] int device() const noexcept;
  //! Number of open conditional bodies.
  [[nodiscard]] std::size_t conditional_depth() const noexcept;

  //! Number of top-level nodes of the captured graph (the two staging nodes included, once staged).
  [[nodiscard]] std::size_t node_count(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! The CUDA handles, for calls tensorplay does not wrap (null before capture / instantiation).
  [[nodiscard]] cudaGraph_t native_graph() const noexcept;
  [[nodiscard]] cudaGraphExec_t native_exec() const noexcept;

  //! The device memory the driver took for this graph's executable, the staging nodes included
  //! (they are in the graph); 0 before the executable is compiled and after reset(). Modelled
  //! from the graph, not measured: CUDA reports no memory per executable (docs/design.md,
  //! "Memory", says how close). Walks the graph: not for a replay loop.
  [[nodiscard]] std::size_t executable_bytes(tensorplay::source_location where = tensorplay::source_location::current()) const;

  // ---- conditional nodes, imperative form -------------------------------------------------

  //! Opens the body of an if node: captured work up to end_capture_to_conditional_node runs,
  //! at replay, only when `pred` is true at that point of the graph.
  template <class P>
  void begin_capture_to_if_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    open_conditional(cudaGraphCondTypeIf, pred, "begin_capture_to_if_node", where);
  }

  //! Opens the body of a while node: it runs while `pred` is true. Refresh the handle at the
  //! end of the body with set_conditional_handle_for_current_node (while_ does that for you).
  template <class P>
  void begin_capture_to_while_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    open_conditional(cudaGraphCondTypeWhile, pred, "begin_capture_to_while_node", where);
  }

  //! Opens the body of an if node whose handle the user's kernels set (conditional_handle): the
  //! body runs when the handle's value is non-zero when the node is reached. No kernel of the
  //! library's is added.
  void begin_capture_to_if_node(ConditionalHandle handle, tensorplay::source_location where = tensorplay::source_location::current()) {
    open_conditional(cudaGraphCondTypeIf, handle, "begin_capture_to_if_node", where);
  }

  //! Opens the body of a while node whose handle the user's kernels set: the body's own kernels
  //! set it to 0 to stop (nothing refreshes it for them). With conditional_handle(1) the body
  //! runs at least once (a do-while).
  void begin_capture_to_while_node(ConditionalHandle handle, tensorplay::source_location where = tensorplay::source_location::current()) {
    open_conditional(cudaGraphCondTypeWhile, handle, "begin_capture_to_while_node", where);
  }

  //! Captures, at this point of the innermost body, a kernel that copies `pred` into that
  //! body's conditional handle.
  template <class P>
  void set_conditional_handle_for_current_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    constexpr const char* what = "set_conditional_handle_for_current_node";
    require_open_body(what, where);
    const detail::BodyCapture& body = session_->bodies().back();
    const void* checked = detail::checked_condition(pred, session_->device(), what, where);
    session_->abandon_on_throw(
        [&] { detail::capture_set_handle(body.stream, session_->device(), body.handle, pred, checked, where); });
  }

  //! Closes the innermost conditional body; capture continues on its parent stream.
  void end_capture_to_conditional_node(tensorplay::source_location where = tensorplay::source_location::current());

  // ---- conditional nodes, lambda form --------------------------------------------------------

  //! `body` runs at replay only when `pred` is true. body(StreamRef) or body().
  template <class P, class F>
  void if_(const P& pred, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    begin_capture_to_if_node(pred, where);
    run_body(body);
    end_capture_to_conditional_node(where);
  }

  //! `body` runs while `pred` is true; `pred` is re-read after every iteration.
  template <class P, class F>
  void while_(const P& pred, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    begin_capture_to_while_node(pred, where);
    run_body(body);
    set_conditional_handle_for_current_node(pred, where);
    end_capture_to_conditional_node(where);
  }

  //! `then_body` when `pred` is true, else `else_body`. Needs CUDA 12.8.
  template <class P, class F, class G>
  void if_else_(const P& pred, F&& then_body, G&& else_body, tensorplay::source_location where = tensorplay::source_location::current()) requires detail::BoolTensorOrDevicePredicate<P> {
    constexpr const char* what = "if_else_";
    require_open_capture(what, where);
    detail::require_multi_body_conditionals(what, where);
    const detail::ConditionalNode node = add_conditional(cudaGraphCondTypeIf, 2, pred, what, where);
    capture_body(node.bodies[0], node.handle, then_body, where);
    capture_body(node.bodies[1], node.handle, else_body, where);
  }

  //! Runs bodies[index] (none when the index is out of range or negative). `index` is a
  //! one-element integral device tensor, or a device callable returning an integer. Needs CUDA 12.8.
  template <class Index, class... Fs>
  void switch_(const Index& index, Fs&&... bodies) requires detail::IntegralTensorOrDeviceIndex<Index> {
    static_assert(sizeof...(Fs) > 0, "switch_: give at least one body");
    const auto where = tensorplay::source_location::current();
    constexpr const char* what = "switch_";
    require_open_capture(what, where);
    detail::require_multi_body_conditionals(what, where);
    const detail::ConditionalNode node = add_conditional(cudaGraphCondTypeSwitch, sizeof...(Fs), index, what, where);
    std::size_t i = 0;
    (capture_body(node.bodies[i++], node.handle, bodies, where), ...);
  }

  // ---- conditional nodes whose handles the user's kernels set -------------------------------

  //! A handle for one conditional node of this graph, made at the current point of the capture
  //! (top level or the innermost open body: the node must go at the same level). Its value is
  //! `default_value` at every launch of the graph (cudaGraphCondAssignDefault) until a kernel
  //! sets it: conditional_handle(1) with while_ is a do-while loop.
  //!
  //!     auto h = graph.conditional_handle();
  //!     decide<<<1, 1, 0, s>>>(x.data(), h);        // calls h.set(x[0] > 0)
  //!     graph.if_(h, [&](tensorplay::StreamRef s) { act<<<g, b, 0, s>>>(x.data()); });
  //!
  //! \throws usage_error without an open capture (nothing is left capturing).
  [[nodiscard]] ConditionalHandle conditional_handle(unsigned default_value = 0,
                                                     tensorplay::source_location where = tensorplay::source_location::current());

  //! `body` runs when the handle's value is non-zero when the node is reached. The user's kernels
  //! set it; the library adds no kernel. Each handle goes to one node.
  //! \throws usage_error for a handle of another graph, capture or level, or one already used
  //!         (the capture is abandoned: nothing is left capturing).
  template <class F>
  void if_(ConditionalHandle handle, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) {
    begin_capture_to_if_node(handle, where);
    run_body(body);
    end_capture_to_conditional_node(where);
  }

  //! `body` runs while the handle's value is non-zero; the body's kernels set it (the library
  //! does not refresh it). With conditional_handle(1), a do-while.
  template <class F>
  void while_(ConditionalHandle handle, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) {
    begin_capture_to_while_node(handle, where);
    run_body(body);
    end_capture_to_conditional_node(where);
  }

  //! `then_body` when the handle's value is non-zero, else `else_body`. Needs CUDA 12.8.
  template <class F, class G>
  void if_else_(ConditionalHandle handle, F&& then_body, G&& else_body,
                tensorplay::source_location where = tensorplay::source_location::current()) {
    constexpr const char* what = "if_else_";
    require_open_capture(what, where);
    detail::require_multi_body_conditionals(what, where);
    const detail::ConditionalNode node = detail::add_conditional_node(*session_, cudaGraphCondTypeIf, 2, handle.handle_, handle.capture_, what, where);
    capture_body(node.bodies[0], node.handle, then_body, where);
    capture_body(node.bodies[1], node.handle, else_body, where);
  }

  //! Runs bodies[value] for the handle's value (none when it is out of range). Needs CUDA 12.8.
  template <class... Fs>
  void switch_(ConditionalHandle handle, Fs&&... bodies) {
    static_assert(sizeof...(Fs) > 0, "switch_: give at least one body");
    const auto where = tensorplay::source_location::current();
    constexpr const char* what = "switch_";
    require_open_capture(what, where);
    detail::require_multi_body_conditionals(what, where);
    const detail::ConditionalNode node =
        detail::add_conditional_node(*session_, cudaGraphCondTypeSwitch, sizeof...(Fs), handle.handle_, handle.capture_, what, where);
    std::size_t i = 0;
    (capture_body(node.bodies[i++], node.handle, bodies, where), ...);
  }

  // ---- graphs built elsewhere -----------------------------------------------------------------

  //! Takes ownership of `graph` (built node by node with the CUDA API, or by another library) and
  //! compiles it for the current device (uploading it when GraphOptions::upload says so). Replay,
  //! replay inside another capture, stage_and_launch onto its buffers, retain, debug_dump,
  //! executable_bytes, node_count, update(body) and reset then work as for a captured graph.
  //! The graph belongs to this Graph from the call on, also when compiling it throws (the Graph
  //! then holds it uncompiled: instantiate() tries again, reset() destroys it).
  //!
  //!     cudaGraph_t built;  cudaGraphCreate(&built, 0);  cudaGraphAddKernelNode(..., built, ...);
  //!     tensorplay::Graph graph;
  //!     graph.adopt(built);          // do not destroy `built` yourself
  //!     graph.replay(stream);
  //!
  //! \throws usage_error for a null graph, while a capture is open, or when the Graph already
  //!         holds a graph (reset() first); cuda_error when CUDA cannot compile it.
  void adopt(cudaGraph_t graph, tensorplay::source_location where = tensorplay::source_location::current());

  // ---- staging ------------------------------------------------------------------------------

  //! Copies every input onto its static buffer, then replays, all in order on `stream`; the host
  //! does not wait. Pairs that are contiguous, of one element type and on the graph's device
  //! are copied together by one kernel node in front of the graph (one cudaGraphLaunch whatever
  //! their number); others get full copy semantics (conversion, strided, host and peer
  //! sources) before the launch. Every check runs before anything is issued; an input that
  //! overlaps a static buffer, and a static buffer named twice, throw usage_error.
  //!
  //!     graph.stage_and_launch(std::tie(static_x, static_y), std::tie(x, y), stream);
  //!
  //! Works on every graph the library captures, conditional nodes included. replay() and
  //! stage_and_launch of one graph must not run concurrently.
  //!
  //! Both tuples may hold temporaries (std::forward_as_tuple(std::span<const float>(p, n))) as
  //! well as references (std::tie).
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S...> static_inputs, std::tuple<I...> inputs, StreamRef stream,
                        tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(sizeof...(S) == sizeof...(I),
                  "stage_and_launch: static_inputs and inputs must have the same number of elements");
    if constexpr (sizeof...(S) == sizeof...(I)) {
      static_assert((detail::check_stage_pair<std::remove_cvref_t<S>, std::remove_cvref_t<I>>() && ...));
      require_executable("stage_and_launch", where);
      require_resident("stage_and_launch");
      if (detail::stream_is_capturing(stream.get(), where)) [[unlikely]]
        detail::throw_usage("stage_and_launch: the stream is being captured; stage outside the capture, or replay() "
                            "the graph inside it (a child graph) after copying the inputs there");
      exec_.stage_and_launch(detail::tie_all(static_inputs), detail::tie_all(inputs), stream.get(), where);
    }
  }

  //! stage_and_launch on this thread's current stream of the graph's device (like replay()).
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S...> static_inputs, std::tuple<I...> inputs,
                        tensorplay::source_location where = tensorplay::source_location::current()) {
    require_executable("stage_and_launch", where);
    on_current_stream([&](cudaStream_t stream) { stage_and_launch(detail::tie_all(static_inputs), detail::tie_all(inputs), StreamRef(stream), where); },
                      where);
  }

  // ---- pointing the graph at other memory ---------------------------------------------------

  //! Makes every node of the executable that uses memory of `from` use the same offset of `to`
  //! from the next launch on: kernel arguments (also pointers inside struct arguments and
  //! pointers into the middle of the buffer; not an end pointer one past the last element, which
  //! may be the next buffer's start), 1-D copies and memsets, in conditional bodies and child
  //! graphs too. Nothing is copied or captured: one set-params call per node, found in an index
  //! of the executable's pointer words built at the first rebind. Launches already queued keep
  //! what they had.
  //!
  //!     graph.rebind(input_a, input_b);   // the next replay reads input_b where it read input_a
  //!
  //! - `to` has the element type of `from` and at least its size, lives on the graph's device,
  //!   and does not overlap `from`. rebind does not keep `to` alive (retain does); once launches
  //!   that used `from` are done, `from` may be freed.
  //! - stage_and_launch stages into the buffers the graph uses now: a static buffer named as
  //!   captured (or as an earlier rebind named it) is copied to where rebind moved it.
  //! - update(body) and a new capture start from the pointers their body uses: earlier rebinds
  //!   are forgotten.
  //! - replay(stream) inside another capture adds the graph as it runs now (its rebinds
  //!   included); the outer graph keeps that copy, which later rebinds of this graph leave alone.
  //! - Pointers in device memory (a pointer array of a batched GEMM), pointers a kernel computes
  //!   and end pointers stay as they are (docs/guide.md, "Pointing a graph at other memory").
  //! - rebind, replay and stage_and_launch of one graph must not run concurrently.
  //!
  //! \returns how many nodes changed: 0 when no node uses `from` (nothing changed then).
  //! \throws usage_error before any capture, while a capture is open, for bad arguments, and when
  //!         a node that uses `from` cannot change (a 2-D copy): nothing has changed then.
  template <ContiguousTensor From, ContiguousTensor To>
  RebindResult rebind(const From& from, const To& to, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_rebind_types<From, To>());
    if (is_capturing()) detail::throw_usage("rebind: a capture is open on this graph; rebind after capture_end");
    require_executable("rebind", where);
    return exec_.rebind(detail::rebind_request(from, to, exec_.device(), "rebind", where), where);
  }

  friend struct detail::RebindAccess;  // GraphBuckets, PiecewiseGraph: rebind across their graphs

 private:
  template <ConditionalKind>
  friend class ConditionalScope;
  friend const detail::ConditionalBodies* detail::recorded_bodies(const Graph& graph) noexcept;  // for the memory model

  // capture_end without compiling (instantiate() compiles later): for captures that must all
  // end before any is compiled (DeviceGroupGraph), or whose graphs share one executable.
  void end_without_compiling(const tensorplay::source_location& where);

  // What a ConditionalScope's destructor could not throw: the capture is abandoned and the error
  // thrown by capture_end or update (found by the model test: update() used to drop it, and the
  // update succeeded without the failed body).
  void rethrow_deferred();

  // A ConditionalScope could not close its body (in its destructor): capture_end rethrows.
  void defer_error(std::exception_ptr error) noexcept;

  // A ConditionalScope's end: closes the bodies opened inside it and left open, runs `refresh`
  // (a WhileScope re-reads its predicate), then closes the scope's own body at `depth`. Never
  // throws: a failure is kept for capture_end, and the capture stays open (a failed body is
  // dropped) so that what the caller issues after the scope is captured and discarded, not run
  // eagerly on a stream that stopped capturing.
  template <class Refresh>
  void close_scope(std::size_t depth, Refresh&& refresh, const tensorplay::source_location& where) noexcept {
    if (!is_capturing() || session_->depth() < depth) return;  // abandoned meanwhile
    detail::CaptureSession::KeepOpenOnFailure keep(*session_);
    auto attempt = [&](auto&& step) {
      try {
        step();
      } catch (...) {
        defer_error(std::current_exception());
      }
    };
    while (is_capturing() && session_->depth() > depth) attempt([&] { detail::close_body(*session_, where); });
    if (!is_capturing() || session_->depth() != depth) return;
    if (!deferred_error_) attempt(refresh);
    attempt([&] { detail::close_body(*session_, where); });
  }

  // An offloaded pool (Pool::offload) has no device memory behind its addresses. One relaxed
  // load on the replay path (PoolImpl::offloaded).
  void require_resident(const char* what) const;

  // ---- capture internals ----------------------------------------------------------------

  void begin_session(const CaptureOptions& options, std::shared_ptr<detail::PoolImpl> pool, const tensorplay::source_location& where);

  // Ends the open session and returns what it captured (given the Graph's keep-alive bundle when
  // that holds objects). A capture that allocated into a pool the Graph does not hold (its first
  // capture, with CaptureOptions::pool or not, or an update of a graph whose captures allocated
  // nothing so far) gives the Graph that pool: the executable's memory then lives as long as the
  // Graph.
  detail::CapturedGraph end_session(const tensorplay::source_location& where);

  // Once the Graph retained an object, the graph it runs and its executable hold the keep-alive
  // bundle: given to the graph, and compiled again if the executable was compiled without it.
  void keep_kept(const tensorplay::source_location& where);

  void compile(const tensorplay::source_location& where);

  // Where a new executable is uploaded: GraphOptions::upload, on the stream captured last.
  [[nodiscard]] std::optional<cudaStream_t> upload_stream() const noexcept;

  static constexpr CaptureErrorMode from_cuda(cudaStreamCaptureMode mode) noexcept {
    switch (mode) {
      case cudaStreamCaptureModeThreadLocal: return CaptureErrorMode::ThreadLocal;
      case cudaStreamCaptureModeRelaxed: return CaptureErrorMode::Relaxed;
      default: return CaptureErrorMode::Global;
    }
  }

  template <class F>
  void run_body(F& body) {
    session_->abandon_on_throw([&] { detail::call_body(body, capture_stream()); });
  }

  // A conditional node with `size` bodies at the current point of the capture.
  template <class P>
  detail::ConditionalNode add_conditional(cudaGraphConditionalNodeType type, unsigned size, const P& pred,
                                          const char* what, const tensorplay::source_location& where) {
    return detail::add_conditional_node(*session_, type, size, pred, what, where);
  }

  template <class P>
  void open_conditional(cudaGraphConditionalNodeType type, const P& pred, const char* what, const tensorplay::source_location& where) {
    require_open_capture(what, where);
    const detail::ConditionalNode node = add_conditional(type, 1, pred, what, where);
    detail::open_body(*session_, node.bodies[0], node.handle, where);
  }

  void open_conditional(cudaGraphConditionalNodeType type, ConditionalHandle handle, const char* what,
                        const tensorplay::source_location& where) {
    require_open_capture(what, where);
    const detail::ConditionalNode node = detail::add_conditional_node(*session_, type, 1, handle.handle_, handle.capture_, what, where);
    detail::open_body(*session_, node.bodies[0], node.handle, where);
  }

  // Captures `body` into one body of a conditional node (if_else_, switch_).
  template <class F>
  void capture_body(cudaGraph_t slot, cudaGraphConditionalHandle handle, F& body, const tensorplay::source_location& where) {
    detail::open_body(*session_, slot, handle, where);
    run_body(body);
    detail::close_body(*session_, where);
  }

  void require_open_capture(const char* what, const tensorplay::source_location&) const;
  void require_open_body(const char* what, const tensorplay::source_location& where) const;
  void require_executable(const char* what, const tensorplay::source_location&) const;

  // Calls f(stream) with this thread's current stream of the graph's device. The legacy default
  // stream (null) belongs to whatever device is current: the graph's device is made current for it.
  template <class F>
  void on_current_stream(F&& f, const tensorplay::source_location& where) const {
    const cudaStream_t stream = current_stream(exec_.device());
    if (stream == nullptr) {
      detail::DeviceGuard guard(exec_.device(), where);
      f(stream);
    } else {
      f(stream);
    }
  }

  // replay(stream) while `stream` captures: a child-graph node in that capture. The capture's
  // graph (for a conditional body, the graph of the capture holding it) gets the keep-alive
  // bundle, so that this graph's pool and retained objects live as long as the outer graph.
  void add_to_capture(cudaStream_t stream, const tensorplay::source_location& where);

  // Hot member first: replay reads exec_ only.
  detail::Executable exec_;
  GraphOptions options_;
  mutable Pool pool_;               // the pool captures go into (empty until one is needed)
  mutable detail::KeepAlive keep_;  // retained objects and the pool, held by graphs and executables
  std::optional<bool> capture_upload_;  // CaptureOptions::upload of the last capture (over GraphOptions::upload)
  CaptureErrorMode mode_ = CaptureErrorMode::Global;  // the last capture's: update() captures with it
  bool debug_ = false;
  bool has_conditionals_ = false;   // CUDA refuses such a graph as a child graph
  std::exception_ptr deferred_error_;  // what a ConditionalScope's destructor could not throw
  std::unique_ptr<detail::CaptureSession> session_;  // destroyed first: abandons an open capture
};

namespace detail {

//! The bodies of the conditional nodes of the graph `graph` holds, which CUDA cannot list from
//! the node: what GraphBuckets::estimate needs of a Graph beyond its public API (the
//! executable-memory model, detail/exec_memory.hpp; graph/detail/bucket_memory.hpp).
TENSORPLAY_DECL const ConditionalBodies* recorded_bodies(const Graph& graph) noexcept;

}  // namespace detail
}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay {

TENSORPLAY_DECL Graph::Graph() noexcept : Graph(GraphOptions{}) {}

TENSORPLAY_DECL Graph::Graph(GraphOptions options) noexcept : options_(std::move(options)), pool_(options_.pool) { keep_.set_pool(pool_.impl()); }

TENSORPLAY_DECL void Graph::capture_begin(const CaptureOptions& options, tensorplay::source_location where) {
  if (is_capturing()) detail::throw_usage("capture_begin: this graph is already capturing; call capture_end first");
  if (exec_.holds_graph())
    detail::throw_usage("capture_begin: this graph already holds a captured graph; call reset() before capturing again "
                        "(or update() to capture a new version)");
  begin_session(options, pool_.impl(), where);
}

TENSORPLAY_DECL void Graph::capture_end(tensorplay::source_location where) {
  capture_end(Instantiate::Now, where);
}

TENSORPLAY_DECL void Graph::capture_end(Instantiate when, tensorplay::source_location where) {
  end_without_compiling(where);
  if (when == Instantiate::Now) compile(where);
}

TENSORPLAY_DECL void Graph::instantiate(tensorplay::source_location where) {
  if (exec_.compiled()) return;
  if (!exec_.holds_graph()) detail::throw_usage("instantiate: nothing has been captured yet");
  keep_kept(where);
  compile(where);
}

TENSORPLAY_DECL void Graph::replay(tensorplay::source_location where) {
  require_executable("replay", where);
  on_current_stream([&](cudaStream_t stream) { replay(StreamRef(stream), where); }, where);
}

TENSORPLAY_DECL void Graph::replay(StreamRef stream, tensorplay::source_location where) {
  require_executable("replay", where);
  require_resident("replay");
  if (detail::stream_is_capturing(stream.get(), where)) [[unlikely]]
    return add_to_capture(stream.get(), where);
  exec_.launch(stream.get(), where);
}

TENSORPLAY_DECL void Graph::reset() noexcept {
  if (session_) session_->abandon();
  exec_.reset();
  keep_.clear();
  pool_ = options_.pool;
  keep_.set_pool(pool_.impl());
  has_conditionals_ = false;
  capture_upload_.reset();
}

TENSORPLAY_DECL Pool Graph::pool() const {
  if (is_capturing()) return Pool(session_->context().pool());
  if (!pool_) {
    pool_ = graph_pool_handle();
    keep_.set_pool(pool_.impl());
  }
  return pool_;
}

TENSORPLAY_DECL PoolId Graph::pool_id() const { return pool().id(); }

TENSORPLAY_DECL void Graph::enable_debug_mode() noexcept { debug_ = true; }

TENSORPLAY_DECL StreamRef Graph::capture_stream() const noexcept {
  if (!is_capturing()) return {};
  return StreamRef(session_->current(), session_->device());
}

TENSORPLAY_DECL bool Graph::is_capturing() const noexcept { return session_ && session_->is_open(); }

TENSORPLAY_DECL bool Graph::is_instantiated() const noexcept { return exec_.compiled(); }

TENSORPLAY_DECL int Graph::device() const noexcept { return exec_.device(); }

TENSORPLAY_DECL std::size_t Graph::conditional_depth() const noexcept { return is_capturing() ? session_->depth() : 0; }

TENSORPLAY_DECL std::size_t Graph::node_count(tensorplay::source_location where) const {
  if (!exec_.holds_graph()) detail::throw_usage("node_count: no capture has ended yet");
  std::size_t count = 0;
  TENSORPLAY_CHECK(cudaGraphGetNodes(exec_.graph(), nullptr, &count), where);
  return count;
}

TENSORPLAY_DECL cudaGraph_t Graph::native_graph() const noexcept { return exec_.graph(); }

TENSORPLAY_DECL cudaGraphExec_t Graph::native_exec() const noexcept { return exec_.get(); }

TENSORPLAY_DECL std::size_t Graph::executable_bytes(tensorplay::source_location where) const {
  return exec_.bytes(where);
}

TENSORPLAY_DECL ConditionalHandle Graph::conditional_handle(unsigned default_value, tensorplay::source_location where) {
  require_open_capture("conditional_handle", where);
  return ConditionalHandle(detail::make_conditional_handle(*session_, default_value, where), session_->serial());
}

TENSORPLAY_DECL void Graph::adopt(cudaGraph_t graph, tensorplay::source_location where) {
  if (graph == nullptr) detail::throw_usage("adopt: the graph is null");
  if (is_capturing()) detail::throw_usage("adopt: a capture is open on this graph; call capture_end first");
  if (exec_.holds_graph())
    detail::throw_usage("adopt: this graph already holds a graph; call reset() first (the graph given was not taken)");
  const int device = detail::current_device(where);
  detail::GraphHandle owned(graph);
  const bool conditionals = detail::has_conditional_nodes(graph, where);
  if (keep_.needed()) keep_.retain_on(graph, where);
  capture_upload_.reset();
  has_conditionals_ = conditionals;
  exec_.hold(std::move(owned), device, keep_.needed());
  std::optional<cudaStream_t> upload;
  if (options_.upload) upload = nullptr;
  exec_.compile(upload, where);
}

TENSORPLAY_DECL void Graph::end_capture_to_conditional_node(tensorplay::source_location where) {
  require_open_body("end_capture_to_conditional_node", where);
  detail::close_body(*session_, where);
}

TENSORPLAY_DECL void Graph::end_without_compiling(const tensorplay::source_location& where) {
  rethrow_deferred();
  require_open_capture("capture_end", where);
  detail::CapturedGraph captured = end_session(where);
  mode_ = from_cuda(captured.mode);
  has_conditionals_ = captured.conditionals;
  exec_.hold(std::move(captured.graph), captured.device, keep_.needed(), std::move(captured.conditional_bodies));
}

TENSORPLAY_DECL void Graph::rethrow_deferred() {
  if (deferred_error_ && is_capturing()) {
    session_->abandon();
    std::rethrow_exception(std::exchange(deferred_error_, nullptr));
  }
  deferred_error_ = nullptr;  // kept by a capture abandoned since, whose error was thrown then
}

TENSORPLAY_DECL void Graph::defer_error(std::exception_ptr error) noexcept {
  if (!deferred_error_) deferred_error_ = std::move(error);
}

TENSORPLAY_DECL void Graph::require_resident(const char* what) const {
  if (const auto& pool = pool_.impl(); pool && pool->offloaded()) [[unlikely]]
    pool->require_resident(what);
}

TENSORPLAY_DECL void Graph::begin_session(const CaptureOptions& options, std::shared_ptr<detail::PoolImpl> pool, const tensorplay::source_location& where) {
  int device = 0;
  cudaStream_t stream = nullptr;
  if (options.stream) {
    device = options.stream->device(where);
    stream = options.stream->get();
  } else {
    device = detail::current_device(where);
    stream = current_stream(device);
  }
  if (stream == nullptr || stream == cudaStreamLegacy) stream = detail::side_stream(device, where);
  if (options.pool) pool = options.pool->impl();
  if (pool) {
    pool->require_resident("capture_begin");
    if (pool->kind() != detail::PoolImpl::Kind::Graph)
      detail::throw_usage("capture_begin: a device's default pool cannot hold a graph's memory; use graph_pool_handle()");
    if (pool->device() != device)
      detail::throw_usage("capture_begin: the pool belongs to device " + std::to_string(pool->device()) +
                          ", the capture stream to device " + std::to_string(device));
  }
  const cudaStreamCaptureMode mode = detail::to_cuda(options.capture_error_mode.value_or(options_.capture_error_mode));
  if (!session_) session_ = std::make_unique<detail::CaptureSession>();  // kept: no allocation per capture
  session_->begin(stream, device, mode, std::move(pool), where);
  capture_upload_ = options.upload;
  deferred_error_ = nullptr;
}

TENSORPLAY_DECL detail::CapturedGraph Graph::end_session(const tensorplay::source_location& where) {
  detail::CapturedGraph captured = session_->end(where);
  if (captured.pool && captured.pool != pool_.impl()) {  // CaptureOptions::pool of a first capture, too
    pool_ = Pool(captured.pool);
    keep_.set_pool(captured.pool);
  }
  if (keep_.needed()) keep_.retain_on(captured.graph.get(), where);
  return captured;
}

TENSORPLAY_DECL void Graph::keep_kept(const tensorplay::source_location& where) {
  if (!exec_.holds_graph() || !keep_.needed()) return;
  if (!exec_.graph_keeps()) {
    keep_.retain_on(exec_.graph(), where);
    exec_.graph_now_keeps();
  }
  if (exec_.compiled() && !exec_.exec_keeps()) exec_.compile(std::nullopt, where);
}

TENSORPLAY_DECL void Graph::compile(const tensorplay::source_location& where) { exec_.compile(upload_stream(), where); }

TENSORPLAY_DECL std::optional<cudaStream_t> Graph::upload_stream() const noexcept {
  if (!capture_upload_.value_or(options_.upload)) return std::nullopt;
  return session_ ? session_->origin() : nullptr;
}

TENSORPLAY_DECL void Graph::require_open_capture(const char* what, const tensorplay::source_location&) const {
  if (is_capturing()) return;
  if (session_ && session_->how_ended() == detail::CaptureEnd::StreamDestroyed)
    detail::throw_usage(std::string(what) + ": the capture was abandoned because its stream was destroyed; capture again");
  if (session_ && session_->how_ended() == detail::CaptureEnd::Abandoned)
    detail::throw_usage(std::string(what) + ": the capture was abandoned after an error inside it; capture again");
  detail::throw_usage(std::string(what) + ": no capture is open on this graph (call capture_begin first)");
}

TENSORPLAY_DECL void Graph::require_open_body(const char* what, const tensorplay::source_location& where) const {
  require_open_capture(what, where);
  if (session_->depth() == 0) detail::throw_usage(std::string(what) + ": no conditional body is open");
}

TENSORPLAY_DECL void Graph::require_executable(const char* what, const tensorplay::source_location&) const {
  if (!exec_.compiled()) [[unlikely]] {
    if (is_capturing()) detail::throw_usage(std::string(what) + ": the graph is still capturing; call capture_end first");
    if (exec_.holds_graph()) detail::throw_usage(std::string(what) + ": the graph has no executable (its instantiation failed); "
                                                                     "call instantiate() or capture again");
    detail::throw_usage(std::string(what) + ": nothing has been captured (call capture_begin/capture_end or capture first)");
  }
}

TENSORPLAY_DECL void Graph::add_to_capture(cudaStream_t stream, const tensorplay::source_location& where) {
  if (has_conditionals_)
    detail::throw_usage("replay: the stream is being captured, and this graph holds conditional nodes, which CUDA "
                        "does not allow in a child graph; replay it outside the capture, or capture its work "
                        "into the outer graph directly");
  keep_.retain_on_capture(stream, where);  // checks that the capture is still active
  detail::CaptureInfo info;
  TENSORPLAY_CHECK(detail::get_capture_info(stream, info), where);
  if (info.status != cudaStreamCaptureStatusActive)
    detail::throw_capture_failure_on(cudaErrorStreamCaptureInvalidated, "replay into a capture (the capture was invalidated earlier)",
                                     stream, where);
  cudaGraphNode_t node = nullptr;
  TENSORPLAY_CHECK(cudaGraphAddChildGraphNode(&node, info.graph, info.dependencies, info.dependency_count, exec_.current_graph(where)),
                   where);
  TENSORPLAY_CHECK(detail::set_capture_dependencies(stream, &node, 1), where);
  detail::note_conditional_node();  // RandomState: draws after this child graph start a new segment
}
}  // namespace tensorplay

namespace tensorplay::detail {

TENSORPLAY_DECL const ConditionalBodies* recorded_bodies(const Graph& graph) noexcept { return &graph.exec_.bodies(); }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
