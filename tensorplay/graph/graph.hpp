// tensorplay/graph/graph.hpp: Graph: capture work on a stream, compile it, replay it.
#pragma once

#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/conditional_kernels.hpp>
#include <tensorplay/detail/copy_kernels.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/graph_api.hpp>
#include <tensorplay/detail/launch.hpp>
#include <tensorplay/detail/staging.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>

#include <cuda_runtime.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

//! The kinds of conditional node a ConditionalScope opens.
enum class ConditionalKind { If, While };

namespace detail {

//! True for `[=] __device__ (...) {...}` closures (nvcc --extended-lambda). In the host pass
//! their call operator is invisible, so the type, not a call, has to tell.
template <class F>
inline constexpr bool is_extended_device_lambda_v =
#if defined(__CUDACC_EXTENDED_LAMBDA__)
    __nv_is_extended_device_lambda_closure_type(F) || __nv_is_extended_host_device_lambda_closure_type(F);
#else
    false;
#endif

//! Something evaluated on the GPU, at its point in the graph, instead of a tensor:
//! an extended __device__ lambda or a functor with a device-callable operator(). Passed to
//! a kernel by value; its result type is checked where the kernel is compiled.
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
inline void require_multi_body_conditionals(int runtime_version, int driver_version, const char* what) {
  constexpr int needed = 12080;
  if (runtime_version < needed || driver_version < needed)
    throw_usage(std::string(what) + " needs CUDA 12.8 or newer in both the runtime and the driver (runtime " +
                std::to_string(runtime_version) + ", driver " + std::to_string(driver_version) + ")");
}

inline void require_multi_body_conditionals(const char* what, const std::source_location& where) {
  int runtime = 0;
  int driver = 0;
  TENSORPLAY_CHECK(cudaRuntimeGetVersion(&runtime), where);
  TENSORPLAY_CHECK(cudaDriverGetVersion(&driver), where);
#if CUDART_VERSION < 12080
  runtime = CUDART_VERSION;  // compiled against headers without multi-body conditionals
#endif
  require_multi_body_conditionals(runtime, driver, what);
}

//! Checks that a one-element tensor lives on `device` (or is managed) and returns its address.
template <ContiguousTensor T>
const void* checked_scalar(const T& t, int device, const char* what, const char* role, const std::source_location& where) {
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
//! A Graph is move-only. One thread at a time may capture into it or call stage_and_launch;
//! replay(stream) may be called from any thread. Graphs that share a pool must replay in the
//! order they were captured and never concurrently.
class Graph {
 public:
  Graph() noexcept : Graph(GraphOptions{}) {}
  explicit Graph(GraphOptions options) noexcept : options_(std::move(options)), pool_(options_.pool) {}

  Graph(Graph&& other) noexcept : Graph() { swap(other); }
  Graph& operator=(Graph&& other) noexcept {
    Graph moved(std::move(other));
    swap(moved);
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  //! Abandons an open capture (no stream is left capturing) and frees the graph.
  ~Graph() { reset(); }

  void swap(Graph& other) noexcept {
    std::swap(exec_, other.exec_);
    std::swap(graph_, other.graph_);
    std::swap(device_, other.device_);
    std::swap(debug_, other.debug_);
    std::swap(abandoned_, other.abandoned_);
    std::swap(capturing_, other.capturing_);
    std::swap(options_, other.options_);
    std::swap(pool_, other.pool_);
    std::swap(capture_, other.capture_);
    std::swap(body_streams_, other.body_streams_);
    std::swap(staging_, other.staging_);
  }

  // ---- capture --------------------------------------------------------------------------

  //! Starts capturing work issued to the capture stream (see CaptureOptions::stream), which
  //! becomes the current stream of its device until capture_end.
  //! \throws usage_error when a capture is open, the graph already holds one (reset() first),
  //!         the stream is already capturing, or the pool cannot be used.
  void capture_begin(const CaptureOptions& options = {}, std::source_location where = std::source_location::current()) {
    if (capturing_) detail::throw_usage("capture_begin: this graph is already capturing; call capture_end first");
    if (graph_ != nullptr)
      detail::throw_usage("capture_begin: this graph already holds a captured graph; call reset() before capturing again");

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

    // The capture's pool: the one asked for, the graph's own, or (null) a private one made
    // on the capture's first allocation.
    std::shared_ptr<detail::PoolImpl> pool = options.pool ? options.pool->impl() : pool_.impl();
    if (pool) {
      if (pool->kind() != detail::PoolImpl::Kind::Graph)
        detail::throw_usage("capture_begin: a device's default pool cannot hold a graph's memory; use graph_pool_handle()");
      if (pool->device() != device)
        detail::throw_usage("capture_begin: the pool belongs to device " + std::to_string(pool->device()) +
                            ", the capture stream to device " + std::to_string(device));
    }

    const cudaStreamCaptureMode mode = detail::to_cuda(options.capture_error_mode.value_or(options_.capture_error_mode));
    if (const cudaError_t begun = cudaStreamBeginCapture(stream, mode); begun != cudaSuccess) {
      (void)cudaGetLastError();
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone)
        detail::throw_usage("capture_begin: the stream is already being captured (nested captures need their own stream)");
      detail::check(begun, "cudaStreamBeginCapture", where);
    }
    // The capture's sequence id: a pool of the graph's must know it now; otherwise it is
    // asked of CUDA only if the capture allocates (see CaptureRegistry).
    unsigned long long seq = 0;
    if (pool) {
      if (const cudaError_t st = detail::get_capture_seq(stream, seq); st != cudaSuccess) {
        discard_capture(stream);
        detail::check(st, "cudaStreamGetCaptureInfo", where);
      }
      if (!pool->try_begin_capture(seq)) {
        discard_capture(stream);
        detail::throw_usage("capture_begin: another graph is capturing into this pool right now; captures that share a pool must not overlap");
      }
    }

    if (!capture_) capture_ = std::make_unique<Capture>();  // kept for later captures: no allocation each time
    Capture& capture = *capture_;
    capture.stream = stream;
    capture.device = device;
    capture.mode = mode;
    capture.previous_current = current_stream(device);
    capture.bodies.clear();
    capture.context.open(device, stream, seq, std::move(pool));
    detail::CaptureRegistry::instance().add_capture(&capture.context, stream, seq, device);
    detail::set_current_stream(device, stream);
    capturing_ = true;
    device_ = device;
    abandoned_ = false;
  }

  //! Ends the capture and compiles the executable.
  //! \throws usage_error without an open capture or with a conditional body still open;
  //!         cuda_error (with CUDA's status) when the capture was invalidated: the graph and
  //!         the stream are usable afterwards and the graph can capture again.
  void capture_end(std::source_location where = std::source_location::current()) {
    if (!capturing_)
      detail::throw_usage(abandoned_ ? "capture_end: the capture was abandoned after an error inside it; capture again"
                                     : "capture_end without capture_begin");
    if (!capture_->bodies.empty())
      detail::throw_usage("capture_end: " + std::to_string(capture_->bodies.size()) +
                          " conditional body(ies) still open; call end_capture_to_conditional_node first");
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(capture_->stream, &graph);
    std::shared_ptr<detail::PoolImpl> pool = finish_capture();
    if (status != cudaSuccess) {
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      pool_ = options_.pool;
      device_ = -1;
      detail::check(status, "cudaStreamEndCapture", where);
    }
    if (pool) pool_ = Pool(std::move(pool));
    graph_ = graph;
    instantiate(where);
  }

  //! capture_begin, then body(capture stream) or body(), then capture_end. If the body throws,
  //! the capture is abandoned (no stream is left capturing) and the exception propagates.
  template <class F>
  void capture(F&& body, const CaptureOptions& options = {}, std::source_location where = std::source_location::current()) {
    capture_begin(options, where);
    run_body(body);
    capture_end(where);
  }

  //! Compiles the executable if that has not happened (capture_end does it): otherwise a no-op.
  //! No device switch: each node carries its device, and the current one plays no part
  //! (tested with a capture on device 1 while device 0 is current).
  void instantiate(std::source_location where = std::source_location::current()) {
    if (exec_ != nullptr) return;
    if (graph_ == nullptr) detail::throw_usage("instantiate: nothing has been captured yet");
    TENSORPLAY_CHECK(cudaGraphInstantiate(&exec_, graph_, cudaGraphInstantiateFlagAutoFreeOnLaunch), where);
  }

  // ---- replay ---------------------------------------------------------------------------

  //! Launches the graph on this thread's current stream of the graph's device.
  void replay(std::source_location where = std::source_location::current()) {
    require_executable("replay", where);
    on_current_stream([&](cudaStream_t stream) { TENSORPLAY_CHECK(cudaGraphLaunch(exec_, stream), where); }, where);
  }

  //! Launches the graph on `stream` (which must belong to the graph's device). No lookups:
  //! this costs what cudaGraphLaunch costs.
  void replay(StreamRef stream, std::source_location where = std::source_location::current()) {
    require_executable("replay", where);
    TENSORPLAY_CHECK(cudaGraphLaunch(exec_, stream.get()), where);
  }

  //! Abandons an open capture, destroys the graph and executable, and drops the pool
  //! reference (the pool's memory goes back to CUDA once no tensor uses it either).
  void reset() noexcept {
    if (capturing_) abort_capture();
    staging_.reset();
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(std::exchange(exec_, nullptr));
    if (graph_ != nullptr) (void)cudaGraphDestroy(std::exchange(graph_, nullptr));
    pool_ = options_.pool;
    device_ = -1;
  }

  // ---- state ----------------------------------------------------------------------------

  //! The pool this graph captures into: the configured one, the one of its last capture, or
  //! (before any capture) a fresh private pool made now, so that other graphs can share it.
  [[nodiscard]] Pool pool() const {
    if (capturing_) return Pool(capture_->context.pool());
    if (!pool_) pool_ = graph_pool_handle();
    return pool_;
  }
  [[nodiscard]] PoolId pool_id() const { return pool().id(); }

  //! Makes debug_dump write every node attribute (kernel parameters, handles, ...).
  void enable_debug_mode() noexcept { debug_ = true; }

  //! Writes the captured graph as a DOT file.
  //! \throws usage_error before any capture has ended.
  void debug_dump(const std::filesystem::path& path, std::source_location where = std::source_location::current()) const {
    if (graph_ == nullptr) detail::throw_usage("debug_dump: no capture has ended yet, so there is no graph to dump");
    constexpr unsigned plain = cudaGraphDebugDotFlagsKernelNodeParams | cudaGraphDebugDotFlagsMemcpyNodeParams |
                               cudaGraphDebugDotFlagsMemsetNodeParams | cudaGraphDebugDotFlagsConditionalNodeParams;
    const unsigned flags = debug_ ? cudaGraphDebugDotFlagsVerbose : plain;
    TENSORPLAY_CHECK(cudaGraphDebugDotPrint(graph_, path.c_str(), flags), where);
  }

  //! Where work is captured right now: the innermost open conditional body, else the capture
  //! stream; a default StreamRef when not capturing.
  [[nodiscard]] StreamRef capture_stream() const noexcept {
    if (!capturing_) return {};
    return capture_->bodies.empty() ? capture_->stream : capture_->bodies.back().stream;
  }
  [[nodiscard]] bool is_capturing() const noexcept { return capturing_; }
  [[nodiscard]] bool is_instantiated() const noexcept { return exec_ != nullptr; }
  //! The device of the captured graph; -1 before the first capture_begin.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! Number of open conditional bodies.
  [[nodiscard]] std::size_t conditional_depth() const noexcept { return capturing_ ? capture_->bodies.size() : 0; }

  //! Number of top-level nodes of the captured graph.
  [[nodiscard]] std::size_t node_count(std::source_location where = std::source_location::current()) const {
    if (graph_ == nullptr) detail::throw_usage("node_count: no capture has ended yet");
    std::size_t count = 0;
    TENSORPLAY_CHECK(cudaGraphGetNodes(graph_, nullptr, &count), where);
    return count;
  }

  //! The CUDA handles, for calls tensorplay does not wrap (null before capture / instantiation).
  [[nodiscard]] cudaGraph_t native_graph() const noexcept { return graph_; }
  [[nodiscard]] cudaGraphExec_t native_exec() const noexcept { return exec_; }

  // ---- conditional nodes, imperative form -------------------------------------------------

  //! Opens the body of an if node: captured work up to end_capture_to_conditional_node runs,
  //! at replay, only when `pred` is true at that point of the graph.
  template <class P>
    requires detail::Predicate<P>
  void begin_capture_to_if_node(const P& pred, std::source_location where = std::source_location::current()) {
    open_conditional_body(cudaGraphCondTypeIf, pred, "begin_capture_to_if_node", where);
  }

  //! Opens the body of a while node: it runs while `pred` is true. Refresh the handle at the
  //! end of the body with set_conditional_handle_for_current_node (while_ does that for you).
  template <class P>
    requires detail::Predicate<P>
  void begin_capture_to_while_node(const P& pred, std::source_location where = std::source_location::current()) {
    open_conditional_body(cudaGraphCondTypeWhile, pred, "begin_capture_to_while_node", where);
  }

  //! Captures, at this point of the innermost body, a kernel that copies `pred` into that
  //! body's conditional handle.
  template <class P>
    requires detail::Predicate<P>
  void set_conditional_handle_for_current_node(const P& pred,
                                               std::source_location where = std::source_location::current()) {
    constexpr const char* what = "set_conditional_handle_for_current_node";
    require_open_body(what);
    const Body& body = capture_->bodies.back();
    sample(body.stream, body.handle, pred, what, where);
  }

  //! Closes the innermost conditional body; capture continues on its parent stream.
  void end_capture_to_conditional_node(std::source_location where = std::source_location::current()) {
    require_open_body("end_capture_to_conditional_node");
    close_body(where);
  }

  // ---- conditional nodes, lambda form --------------------------------------------------------

  //! `body` runs at replay only when `pred` is true. body(StreamRef) or body().
  template <class P, class F>
    requires detail::Predicate<P>
  void if_(const P& pred, F&& body, std::source_location where = std::source_location::current()) {
    begin_capture_to_if_node(pred, where);
    run_body(body);
    end_capture_to_conditional_node(where);
  }

  //! `body` runs while `pred` is true; `pred` is re-read after every iteration.
  template <class P, class F>
    requires detail::Predicate<P>
  void while_(const P& pred, F&& body, std::source_location where = std::source_location::current()) {
    begin_capture_to_while_node(pred, where);
    run_body(body);
    set_conditional_handle_for_current_node(pred, where);
    end_capture_to_conditional_node(where);
  }

  //! `then_body` when `pred` is true, else `else_body`. Needs CUDA 12.8.
  template <class P, class F, class G>
    requires detail::Predicate<P>
  void if_else_(const P& pred, F&& then_body, G&& else_body, std::source_location where = std::source_location::current()) {
    constexpr const char* what = "if_else_";
    detail::require_multi_body_conditionals(what, where);
    const ConditionalNode node = add_conditional_node(cudaGraphCondTypeIf, 2, pred, what, where);
    capture_body(node.bodies[0], node.handle, then_body, where);
    capture_body(node.bodies[1], node.handle, else_body, where);
  }

  //! Runs bodies[index] (none when the index is out of range or negative). `index` is a
  //! one-element integral device tensor, or a device callable returning an integer. Needs CUDA 12.8.
  template <class Index, class... Fs>
    requires(detail::IndexTensor<Index> || detail::DeviceIndex<Index>)
  void switch_(const Index& index, Fs&&... bodies) {
    static_assert(sizeof...(Fs) > 0, "switch_: give at least one body");
    const auto where = std::source_location::current();
    constexpr const char* what = "switch_";
    detail::require_multi_body_conditionals(what, where);
    const ConditionalNode node = add_conditional_node(cudaGraphCondTypeSwitch, sizeof...(Fs), index, what, where);
    std::size_t i = 0;
    (capture_body(node.bodies[i++], node.handle, bodies, where), ...);
  }

  // ---- staging ------------------------------------------------------------------------------

  //! Copies every input onto its static buffer, then replays, all in order on `stream`;
  //! the host does not wait. Pairs that are contiguous, of one element type and on the graph's
  //! device are copied together by one kernel node in front of the graph (one cudaGraphLaunch
  //! whatever their number); others get full copy semantics (conversion, strided or host
  //! sources, peer copies) before the launch. Every check runs before anything is issued.
  //!
  //!     graph.stage_and_launch(std::tie(static_x, static_y), std::tie(x, y), stream);
  //!
  //! The first call with batched pairs compiles a second executable (the graph behind the copy
  //! node); replay() and stage_and_launch of one graph must not run concurrently.
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs, StreamRef stream,
                        std::source_location where = std::source_location::current()) {
    static_assert(sizeof...(S) == sizeof...(I),
                  "stage_and_launch: static_inputs and inputs must have the same number of elements");
    if constexpr (sizeof...(S) == sizeof...(I)) {
      static_assert((detail::check_stage_pair<std::remove_cvref_t<S>, std::remove_cvref_t<I>>() && ...));
      require_executable("stage_and_launch", where);
      constexpr std::size_t n = sizeof...(S);
      std::array<detail::StagePlan, n> plans;
      [&]<std::size_t... k>(std::index_sequence<k...>) {
        ((plans[k] = detail::plan_pair(k, std::get<k>(static_inputs), std::get<k>(inputs), device_, where)), ...);
      }(std::index_sequence_for<S...>{});

      std::size_t batched = 0;
      for (const detail::StagePlan& plan : plans) batched += plan.kind == detail::StageKind::Batched;
      if (batched == 0) {
        issue_fallbacks(plans, static_inputs, inputs, stream, where);
        TENSORPLAY_CHECK(cudaGraphLaunch(exec_, stream.get()), where);
        return;
      }
      Staging& staging = prepare_staging(where);
      detail::CopyTable& table = staging.table;
      table.count = 0;
      table.first_tile[0] = 0;
      [&]<std::size_t... k>(std::index_sequence<k...>) {
        (
            [&] {
              if (plans[k].kind != detail::StageKind::Batched) return;
              if (table.count == detail::copy_table_capacity) flush_table(table, stream, where);
              detail::add_entry(table, std::get<k>(static_inputs), std::get<k>(inputs));
            }(),
            ...);
      }(std::index_sequence_for<S...>{});
      issue_fallbacks(plans, static_inputs, inputs, stream, where);
      launch_staged(staging, stream, where);
    }
  }

  //! stage_and_launch on this thread's current stream of the graph's device (like replay()).
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs,
                        std::source_location where = std::source_location::current()) {
    require_executable("stage_and_launch", where);
    on_current_stream([&](cudaStream_t stream) { stage_and_launch(static_inputs, inputs, StreamRef(stream), where); },
                      where);
  }

 private:
  // Calls f(stream) with this thread's current stream of the graph's device. The legacy default
  // stream (null) belongs to whatever device is current: the graph's device is made current for it.
  template <class F>
  void on_current_stream(F&& f, const std::source_location& where) const {
    const cudaStream_t stream = current_stream(device_);
    if (stream == nullptr) {
      detail::DeviceGuard guard(device_, where);
      f(stream);
    } else {
      f(stream);
    }
  }

  struct Body {
    cudaStream_t stream = nullptr;
    unsigned long long seq = 0;
    cudaGraphConditionalHandle handle = 0;
    cudaStream_t previous_current = nullptr;
  };

  struct Capture {
    cudaStream_t stream = nullptr;
    int device = 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    cudaStream_t previous_current = nullptr;
    std::vector<Body> bodies;  // open conditional bodies, innermost last
    detail::CaptureContext context;  // the pool; registered for the capture's sequences
  };

  //! The graph with a copy node in front of all its roots, compiled on first use.
  struct Staging {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t copy_node = nullptr;
    unsigned max_blocks = 1;
    detail::CopyTable table;

    Staging() = default;
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    ~Staging() {
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
  };

  void require_executable(const char* what, const std::source_location&) const {
    if (exec_ == nullptr) [[unlikely]] {
      if (capturing_) detail::throw_usage(std::string(what) + ": the graph is still capturing; call capture_end first");
      detail::throw_usage(std::string(what) + ": nothing has been captured (call capture_begin/capture_end or capture first)");
    }
  }

  template <class F>
  void run_body(F& body) {
    try {
      detail::call_body(body, capture_stream());
    } catch (...) {
      abort_capture();
      throw;
    }
  }

  // Ends a capture that was just begun and is to be thrown away.
  static void discard_capture(cudaStream_t stream) noexcept {
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }

  // Book-keeping shared by capture_end and abort_capture: restore the current stream,
  // unregister, let the pool settle what the capture freed. Returns the capture's pool
  // (null if it allocated nothing and the graph had none).
  std::shared_ptr<detail::PoolImpl> finish_capture() noexcept {
    detail::set_current_stream(capture_->device, capture_->previous_current);
    std::shared_ptr<detail::PoolImpl> pool = capture_->context.close();
    detail::CaptureRegistry::instance().remove_capture(&capture_->context);
    capturing_ = false;
    return pool;
  }

  //! Ends every open body and the capture, discards what was captured. Never throws.
  void abort_capture() noexcept {
    if (!capturing_) return;
    auto& registry = detail::CaptureRegistry::instance();
    while (!capture_->bodies.empty()) {
      Body& body = capture_->bodies.back();
      cudaGraph_t graph = nullptr;  // owned by its conditional node: not destroyed here
      (void)cudaStreamEndCapture(body.stream, &graph);
      registry.remove_body(body.seq);
      detail::set_current_stream(capture_->device, body.previous_current);
      capture_->bodies.pop_back();
    }
    discard_capture(capture_->stream);
    (void)finish_capture();
    pool_ = options_.pool;
    device_ = -1;
    abandoned_ = true;
  }

  void require_open_capture(const char* what) const {
    if (!capturing_) detail::throw_usage(std::string(what) + ": conditional nodes can only be captured inside an open capture");
  }
  void require_open_body(const char* what) const {
    if (!capturing_ || capture_->bodies.empty()) detail::throw_usage(std::string(what) + ": no conditional body is open");
  }

  // Checks a predicate or index before anything is captured; returns what the set-handle kernel reads.
  template <class P>
  const void* checked_predicate(const P& pred, const char* what, const std::source_location& where) const {
    if constexpr (ScalarPredicate<P>) {
      if (!detail::has_element_type(pred, DType::Bool))
        detail::throw_usage(std::string(what) + ": the predicate's element type is " + detail::element_name(pred) +
                            "; it must be bool");
      return detail::checked_scalar(pred, capture_->device, what, "predicate", where);
    } else if constexpr (detail::IndexTensor<P>) {
      return detail::checked_scalar(pred, capture_->device, what, "index", where);
    } else {
      return nullptr;  // a device callable: nothing to check at run time
    }
  }

  // Captures, on `stream`, the kernel that copies the predicate (tensor or callable) into `handle`.
  // When it follows exactly one kernel node (a while body's last kernel, say), it is captured
  // with a programmatic edge: its launch overlaps that kernel's end (Hopper and newer).
  template <class P>
  void sample_checked(cudaStream_t stream, cudaGraphConditionalHandle handle, const P& pred, const void* checked,
                      const std::source_location& where) {
    const bool programmatic = follows_one_kernel(stream);
    if constexpr (ScalarPredicate<P>) {
      detail::launch(&detail::set_handle_from_value<bool>, dim3(1), dim3(1), stream, where, programmatic, handle,
                     static_cast<const bool*>(checked));
    } else if constexpr (detail::IndexTensor<P>) {
      using Index = element_t<P>;
      detail::launch(&detail::set_handle_from_value<Index>, dim3(1), dim3(1), stream, where, programmatic, handle,
                     static_cast<const Index*>(checked));
    } else {
      using F = std::remove_cvref_t<P>;
      detail::launch(&detail::set_handle_from_callable<F>, dim3(1), dim3(1), stream, where, programmatic, handle, F(pred));
    }
  }

  // True when the next node captured on `stream` would depend on exactly one kernel node,
  // on a device with programmatic dependent launch (compute capability 9.0 or newer).
  bool follows_one_kernel(cudaStream_t stream) const noexcept {
    if (detail::compute_capability_major(capture_->device) < 9) return false;
    detail::CaptureInfo info;
    if (detail::get_capture_info(stream, info) != cudaSuccess || info.dependency_count != 1) {
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

  template <class P>
  void sample(cudaStream_t stream, cudaGraphConditionalHandle handle, const P& pred, const char* what,
              const std::source_location& where) {
    const void* checked = checked_predicate(pred, what, where);
    try {
      sample_checked(stream, handle, pred, checked, where);
    } catch (...) {
      abort_capture();
      throw;
    }
  }

  struct ConditionalNode {
    cudaGraph_t* bodies;  // owned by CUDA, valid with the node
    cudaGraphConditionalHandle handle;
  };

  // Adds, on the innermost stream, a set-handle kernel and a conditional node with `size`
  // bodies after it.
  template <class P>
  ConditionalNode add_conditional_node(cudaGraphConditionalNodeType type, unsigned size, const P& pred, const char* what,
                                    const std::source_location& where) {
    require_open_capture(what);
    const void* checked = checked_predicate(pred, what, where);
    const cudaStream_t parent = capture_stream();
    try {
      detail::CaptureInfo info;
      TENSORPLAY_CHECK(detail::get_capture_info(parent, info), where);
      if (info.status != cudaStreamCaptureStatusActive)
        detail::check(cudaErrorStreamCaptureInvalidated, "cudaStreamGetCaptureInfo (capture invalidated earlier)", where);
      cudaGraphConditionalHandle handle = 0;
      TENSORPLAY_CHECK(cudaGraphConditionalHandleCreate(&handle, info.graph, 0, 0), where);
      sample_checked(parent, handle, pred, checked, where);
      TENSORPLAY_CHECK(detail::get_capture_info(parent, info), where);
      cudaGraphNodeParams params{};
      params.type = cudaGraphNodeTypeConditional;
      params.conditional.handle = handle;
      params.conditional.type = type;
      params.conditional.size = size;
      cudaGraphNode_t node = nullptr;
      TENSORPLAY_CHECK(detail::add_node(&node, info.graph, info.dependencies, info.dependency_count, &params), where);
      TENSORPLAY_CHECK(detail::set_capture_dependencies(parent, &node, 1), where);
      return {params.conditional.phGraph_out, handle};
    } catch (...) {
      abort_capture();
      throw;
    }
  }

  template <class P>
  void open_conditional_body(cudaGraphConditionalNodeType type, const P& pred, const char* what,
                             const std::source_location& where) {
    const ConditionalNode node = add_conditional_node(type, 1, pred, what, where);
    open_body(node.bodies[0], node.handle, where);
  }

  // Captures `body` into one body graph of a conditional node (if_else_, switch_).
  template <class F>
  void capture_body(cudaGraph_t body_graph, cudaGraphConditionalHandle handle, F& body, const std::source_location& where) {
    open_body(body_graph, handle, where);
    run_body(body);
    close_body(where);
  }

  // Starts capturing into a body graph on the stream of the next nesting depth.
  void open_body(cudaGraph_t body_graph, cudaGraphConditionalHandle handle, const std::source_location& where) {
    try {
      const std::size_t depth = capture_->bodies.size();
      while (body_streams_.size() <= depth) {
        detail::RelaxedCaptureMode relaxed;  // creating a stream must not disturb the capture
        body_streams_.emplace_back(capture_->device, where);
      }
      const cudaStream_t stream = body_streams_[depth].get();
      TENSORPLAY_CHECK(cudaStreamBeginCaptureToGraph(stream, body_graph, nullptr, nullptr, 0, capture_->mode), where);
      unsigned long long seq = 0;
      if (const cudaError_t st = detail::get_capture_seq(stream, seq); st != cudaSuccess) {
        cudaGraph_t ignored = nullptr;
        (void)cudaStreamEndCapture(stream, &ignored);
        detail::check(st, "cudaStreamGetCaptureInfo", where);
      }
      detail::CaptureRegistry::instance().add_body(&capture_->context, seq, capture_->device);
      capture_->context.body_opened(seq);
      capture_->bodies.push_back({stream, seq, handle, current_stream(capture_->device)});
      detail::set_current_stream(capture_->device, stream);
    } catch (...) {
      abort_capture();
      throw;
    }
  }

  // Ends the innermost body's capture; what it allocated now belongs to the parent stream.
  void close_body(const std::source_location& where) {
    const Body body = capture_->bodies.back();
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(body.stream, &graph);
    capture_->bodies.pop_back();
    const bool nested = !capture_->bodies.empty();
    const cudaStream_t parent_stream = nested ? capture_->bodies.back().stream : capture_->stream;
    const unsigned long long parent_seq = nested ? capture_->bodies.back().seq : 0;  // 0: the capture's own
    capture_->context.body_closed(body.seq, body.stream, parent_seq, parent_stream);
    detail::CaptureRegistry::instance().remove_body(body.seq);
    detail::set_current_stream(capture_->device, body.previous_current);
    if (status != cudaSuccess) {
      abort_capture();
      detail::check(status, "cudaStreamEndCapture (conditional body)", where);
    }
  }

  // ---- staging internals ----------------------------------------------------------------

  template <std::size_t N, class StaticTuple, class InputTuple>
  void issue_fallbacks(const std::array<detail::StagePlan, N>& plans, const StaticTuple& statics,
                       const InputTuple& inputs, StreamRef stream, const std::source_location& where) {
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      (detail::issue_fallback(plans[k], std::get<k>(statics), std::get<k>(inputs), device_, stream.get(), where), ...);
    }(std::make_index_sequence<N>{});
  }

  Staging& prepare_staging(const std::source_location& where) {
    if (staging_) return *staging_;
    auto staging = std::make_unique<Staging>();
    detail::DeviceGuard guard(device_, where);
    int sms = 1;
    TENSORPLAY_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), where);
    staging->max_blocks = static_cast<unsigned>(sms) * 8;  // 8 blocks of 256 threads fill an SM
    TENSORPLAY_CHECK(cudaGraphClone(&staging->graph, graph_), where);
    std::size_t root_count = 0;
    TENSORPLAY_CHECK(cudaGraphGetRootNodes(staging->graph, nullptr, &root_count), where);
    std::vector<cudaGraphNode_t> roots(root_count);
    if (root_count != 0) TENSORPLAY_CHECK(cudaGraphGetRootNodes(staging->graph, roots.data(), &root_count), where);
    void* args[1] = {&staging->table};
    const cudaKernelNodeParams params = copy_node_params(1, args);
    TENSORPLAY_CHECK(cudaGraphAddKernelNode(&staging->copy_node, staging->graph, nullptr, 0, &params), where);
    if (root_count != 0) {
      const std::vector<cudaGraphNode_t> from(root_count, staging->copy_node);
      TENSORPLAY_CHECK(detail::add_dependencies(staging->graph, from.data(), roots.data(), root_count), where);
    }
    TENSORPLAY_CHECK(cudaGraphInstantiate(&staging->exec, staging->graph, cudaGraphInstantiateFlagAutoFreeOnLaunch), where);
    staging_ = std::move(staging);
    return *staging_;
  }

  static cudaKernelNodeParams copy_node_params(unsigned blocks, void** args) noexcept {
    cudaKernelNodeParams params{};
    params.func = reinterpret_cast<void*>(&detail::batched_copy_kernel<>);
    params.gridDim = dim3(blocks);
    params.blockDim = dim3(detail::copy_block_threads);
    params.sharedMemBytes = 0;
    params.kernelParams = args;  // the table is copied out of here when the params are set
    params.extra = nullptr;
    return params;
  }

  unsigned grid_for(const Staging& staging, const detail::CopyTable& table) const noexcept {
    const std::size_t tiles = table.first_tile[table.count];
    return static_cast<unsigned>(tiles < staging.max_blocks ? (tiles == 0 ? 1 : tiles) : staging.max_blocks);
  }

  // More batched pairs than one table holds: copy a full table with a plain launch first.
  void flush_table(detail::CopyTable& table, StreamRef stream, const std::source_location& where) {
    detail::launch(&detail::batched_copy_kernel<>, dim3(grid_for(*staging_, table)), dim3(detail::copy_block_threads),
                   stream.get(), where, false, table);
    table.count = 0;
    table.first_tile[0] = 0;
  }

  void launch_staged(Staging& staging, StreamRef stream, const std::source_location& where) {
    void* args[1] = {&staging.table};
    const cudaKernelNodeParams params = copy_node_params(grid_for(staging, staging.table), args);
    TENSORPLAY_CHECK(cudaGraphExecKernelNodeSetParams(staging.exec, staging.copy_node, &params), where);
    TENSORPLAY_CHECK(cudaGraphLaunch(staging.exec, stream.get()), where);
  }

  // Hot members first: replay reads exec_ only.
  cudaGraphExec_t exec_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  int device_ = -1;
  bool debug_ = false;
  bool abandoned_ = false;
  bool capturing_ = false;
  GraphOptions options_;
  mutable Pool pool_;
  std::unique_ptr<Capture> capture_;  // the open capture's state (kept allocated between captures)
  std::vector<Stream> body_streams_;  // one per nesting depth, reused by later captures
  std::unique_ptr<Staging> staging_;
};

}  // namespace tensorplay
