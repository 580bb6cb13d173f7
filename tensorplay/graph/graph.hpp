// tensorplay/graph/graph.hpp: Graph: capture work on a stream, compile it, replay it, change it.
//
// Graph keeps the public API and forwards to its parts:
//   capture_session.hpp      an open capture: begin, end, abandon, bodies, pool routing
//   conditional_builder.hpp  conditional nodes and their bodies
//   executable.hpp           instantiation (with CUDA's reasons), upload, in-place update
//   copy_node.hpp, staging.hpp  stage_and_launch: the copy node and the copy semantics
//   retained.hpp             objects that live as long as the graph (Graph::retain)
#pragma once

#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/detail/thread_streams.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/capture_session.hpp>
#include <tensorplay/graph/conditional_builder.hpp>
#include <tensorplay/graph/copy_node.hpp>
#include <tensorplay/graph/executable.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/retained.hpp>
#include <tensorplay/graph/staging.hpp>
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

//! The kinds of conditional node a ConditionalScope opens.
enum class ConditionalKind { If, While };

template <ConditionalKind K>
class ConditionalScope;

namespace detail {
struct GraphAccess;

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
  Graph() noexcept : Graph(GraphOptions{}) {}
  explicit Graph(GraphOptions options) noexcept : options_(std::move(options)), pool_(options_.pool) {}

  // ---- capture --------------------------------------------------------------------------

  //! Starts capturing work issued to the capture stream (see CaptureOptions::stream), which
  //! becomes the current stream of its device until capture_end.
  //! \throws usage_error when a capture is open, the graph already holds one (reset() first),
  //!         the stream is already capturing, or the pool cannot be used. Nothing is left
  //!         capturing then, and another capture on the stream is left alone.
  void capture_begin(const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    if (is_capturing()) detail::throw_usage("capture_begin: this graph is already capturing; call capture_end first");
    if (graph_)
      detail::throw_usage("capture_begin: this graph already holds a captured graph; call reset() before capturing again "
                          "(or update() to capture a new version)");
    begin_session(options, pool_.impl(), where);
  }

  //! Ends the capture and compiles the executable.
  //! \throws usage_error without an open capture or with a conditional body still open;
  //!         cuda_error (with CUDA's status) when the capture was invalidated: the graph and
  //!         the stream are usable afterwards and the graph can capture again.
  void capture_end(tensorplay::source_location where = tensorplay::source_location::current()) {
    end_without_compiling(where);
    compile(where);
  }

  //! capture_begin, then body(capture stream) or body(), then capture_end. If the body throws,
  //! the capture is abandoned (no stream is left capturing) and the exception propagates.
  template <class F>
  void capture(F&& body, const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    capture_begin(options, where);
    run_body(body);
    capture_end(where);
  }

  //! Captures `body` again, with this graph's pool and capture mode, and makes the executable
  //! run the new work: patched in place (cudaGraphExecUpdate) when CUDA accepts the new graph,
  //! compiled anew when it refuses (a changed topology, say, or launch attributes such as
  //! cluster dimensions that an update cannot carry). CUDA decides, not the library. A staged
  //! executable's copy node is carried over; retained objects stay retained.
  //!
  //!     auto r = graph.update([&](tensorplay::StreamRef s) { step<<<g, b, 0, s>>>(new_ptr, n); });
  //!
  //! \throws usage_error before any capture, or while a capture is open (the graph stays usable).
  //!         If the body throws, or CUDA invalidates the new capture, the exception propagates
  //!         and the graph still replays its old work.
  template <class F>
  UpdateResult update(F&& body, const CaptureOptions& options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    if (is_capturing()) detail::throw_usage("update: a capture is open on this graph; call capture_end first");
    if (!graph_) detail::throw_usage("update: nothing has been captured yet; capture the graph first");
    if (options.pool && !(*options.pool == pool_))
      detail::throw_usage("update: a new version captures into the graph's own pool; CaptureOptions::pool must be empty");
    CaptureOptions same = options;
    same.capture_error_mode = options.capture_error_mode.value_or(mode_);
    begin_session(same, pool_.impl(), where);
    run_body(body);
    detail::GraphHandle graph = end_session(where);
    return replace(std::move(graph), where);
  }

  //! Compiles the executable if that has not happened (capture_end does it): otherwise a no-op.
  void instantiate(tensorplay::source_location where = tensorplay::source_location::current()) {
    if (exec_) return;
    if (!graph_) detail::throw_usage("instantiate: nothing has been captured yet");
    compile(where);
  }

  // ---- replay ---------------------------------------------------------------------------

  //! Launches the graph on this thread's current stream of the graph's device.
  void replay(tensorplay::source_location where = tensorplay::source_location::current()) {
    require_executable("replay", where);
    on_current_stream([&](cudaStream_t stream) { replay(StreamRef(stream), where); }, where);
  }

  //! Launches the graph on `stream` (which must belong to the graph's device). This costs what
  //! cudaGraphLaunch costs. While `stream` is being captured (by another Graph or by raw CUDA
  //! calls), the graph is added to that capture as a child-graph node instead, and the outer
  //! graph keeps what this one needs (its pool, its retained objects) for as long as it lives.
  void replay(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current()) {
    require_executable("replay", where);
    if (detail::stream_is_capturing(stream.get(), where)) [[unlikely]]
      return add_to_capture(stream.get(), where);
    launch_unstaged(stream.get(), where);
  }

  //! Abandons an open capture, destroys the graph and executable, and drops the pool reference
  //! and the retained objects (each lives on until the last launch that can use it completes).
  void reset() noexcept {
    if (session_) session_->abandon();
    staging_.reset();
    exec_.reset();
    origin_.reset();
    graph_.reset();
    retained_.clear();
    retained_in_exec_ = 0;
    pool_ = options_.pool;
    device_ = -1;
    has_conditionals_ = false;
  }

  // ---- lifetime of what the graph uses ----------------------------------------------------

  //! Keeps `object` alive until this Graph is destroyed or reset(), and until the last launch
  //! of every executable made from it has completed (CUDA user objects). Its destructor runs on
  //! a thread of tensorplay's, so it may call CUDA (ncclCommDestroy, say).
  //!
  //!     graph.retain(std::shared_ptr<Communicator>(comm));   // a shared object
  //!     graph.retain(std::move(workspace));                   // any move-only object
  //! Free before capture_end; once the executable exists, each call compiles it again (CUDA
  //! gives an executable references only to what its graph held when it was compiled).
  template <class T>
  void retain(std::shared_ptr<T> object, tensorplay::source_location where = tensorplay::source_location::current()) {
    retained_.add(std::move(object), graph_.get(), where);
    if (!is_capturing()) hold_retained_in_executable(where);
  }
  template <class T>
    requires(!std::is_lvalue_reference_v<T>)
  void retain(T&& object, tensorplay::source_location where = tensorplay::source_location::current()) {
    retained_.add(std::forward<T>(object), graph_.get(), where);
    if (!is_capturing()) hold_retained_in_executable(where);
  }

  // ---- state ----------------------------------------------------------------------------

  //! The pool this graph captures into: the configured one, the one of its last capture, or
  //! (before any capture) a fresh private pool made now, so that other graphs can share it.
  [[nodiscard]] Pool pool() const {
    if (is_capturing()) return Pool(session_->context().pool());
    if (!pool_) pool_ = graph_pool_handle();
    return pool_;
  }
  [[nodiscard]] PoolId pool_id() const { return pool().id(); }

  //! Makes debug_dump write every node attribute (kernel parameters, handles, ...).
  void enable_debug_mode() noexcept { debug_ = true; }

  //! Writes the captured graph as a DOT file: node types, kernel and conditional parameters
  //! (every attribute after enable_debug_mode). After the first stage_and_launch the graph
  //! begins with the copy node.
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
    if (!graph_) detail::throw_usage("debug_dump: no capture has ended yet, so there is no graph to dump");
    TENSORPLAY_CHECK(cudaGraphDebugDotPrint(graph_.get(), detail::path_c_str(path), detail::to_cuda(flags)), where);
  }

  //! Where work is captured right now: the innermost open conditional body, else the capture
  //! stream; a default StreamRef when not capturing.
  [[nodiscard]] StreamRef capture_stream() const noexcept {
    if (!is_capturing()) return {};
    return StreamRef(session_->current(), session_->device());
  }
  [[nodiscard]] bool is_capturing() const noexcept { return session_ && session_->is_open(); }
  [[nodiscard]] bool is_instantiated() const noexcept { return static_cast<bool>(exec_); }
  //! The device of the captured graph; -1 before the first capture_begin.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! Number of open conditional bodies.
  [[nodiscard]] std::size_t conditional_depth() const noexcept { return is_capturing() ? session_->depth() : 0; }

  //! Number of top-level nodes of the captured graph (the copy node included, once staged).
  [[nodiscard]] std::size_t node_count(tensorplay::source_location where = tensorplay::source_location::current()) const {
    if (!graph_) detail::throw_usage("node_count: no capture has ended yet");
    std::size_t count = 0;
    TENSORPLAY_CHECK(cudaGraphGetNodes(graph_.get(), nullptr, &count), where);
    return count;
  }

  //! The CUDA handles, for calls tensorplay does not wrap (null before capture / instantiation).
  [[nodiscard]] cudaGraph_t native_graph() const noexcept { return graph_.get(); }
  [[nodiscard]] cudaGraphExec_t native_exec() const noexcept { return exec_.get(); }

  // ---- conditional nodes, imperative form -------------------------------------------------

  //! Opens the body of an if node: captured work up to end_capture_to_conditional_node runs,
  //! at replay, only when `pred` is true at that point of the graph.
  template <class P>
  void begin_capture_to_if_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
    open_conditional(cudaGraphCondTypeIf, pred, "begin_capture_to_if_node", where);
  }

  //! Opens the body of a while node: it runs while `pred` is true. Refresh the handle at the
  //! end of the body with set_conditional_handle_for_current_node (while_ does that for you).
  template <class P>
  void begin_capture_to_while_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
    open_conditional(cudaGraphCondTypeWhile, pred, "begin_capture_to_while_node", where);
  }

  //! Captures, at this point of the innermost body, a kernel that copies `pred` into that
  //! body's conditional handle.
  template <class P>
  void set_conditional_handle_for_current_node(const P& pred, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
    constexpr const char* what = "set_conditional_handle_for_current_node";
    require_open_body(what, where);
    const detail::BodyCapture& body = session_->bodies().back();
    const void* checked = detail::checked_condition(pred, session_->device(), what, where);
    session_->abandon_on_throw(
        [&] { detail::capture_set_handle(body.stream, session_->device(), body.handle, pred, checked, where); });
  }

  //! Closes the innermost conditional body; capture continues on its parent stream.
  void end_capture_to_conditional_node(tensorplay::source_location where = tensorplay::source_location::current()) {
    require_open_body("end_capture_to_conditional_node", where);
    detail::close_body(*session_, where);
  }

  // ---- conditional nodes, lambda form --------------------------------------------------------

  //! `body` runs at replay only when `pred` is true. body(StreamRef) or body().
  template <class P, class F>
  void if_(const P& pred, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
    begin_capture_to_if_node(pred, where);
    run_body(body);
    end_capture_to_conditional_node(where);
  }

  //! `body` runs while `pred` is true; `pred` is re-read after every iteration.
  template <class P, class F>
  void while_(const P& pred, F&& body, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
    begin_capture_to_while_node(pred, where);
    run_body(body);
    set_conditional_handle_for_current_node(pred, where);
    end_capture_to_conditional_node(where);
  }

  //! `then_body` when `pred` is true, else `else_body`. Needs CUDA 12.8.
  template <class P, class F, class G>
  void if_else_(const P& pred, F&& then_body, G&& else_body, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_predicate_type<P>());
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
  void switch_(const Index& index, Fs&&... bodies) {
    static_assert(detail::check_index_type<Index>());
    static_assert(sizeof...(Fs) > 0, "switch_: give at least one body");
    const auto where = tensorplay::source_location::current();
    constexpr const char* what = "switch_";
    require_open_capture(what, where);
    detail::require_multi_body_conditionals(what, where);
    const detail::ConditionalNode node = add_conditional(cudaGraphCondTypeSwitch, sizeof...(Fs), index, what, where);
    std::size_t i = 0;
    (capture_body(node.bodies[i++], node.handle, bodies, where), ...);
  }

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
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs, StreamRef stream,
                        tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(sizeof...(S) == sizeof...(I),
                  "stage_and_launch: static_inputs and inputs must have the same number of elements");
    if constexpr (sizeof...(S) == sizeof...(I)) {
      static_assert((detail::check_stage_pair<std::remove_cvref_t<S>, std::remove_cvref_t<I>>() && ...));
      require_executable("stage_and_launch", where);
      if (detail::stream_is_capturing(stream.get(), where)) [[unlikely]]
        detail::throw_usage("stage_and_launch: the stream is being captured; stage outside the capture, or replay() "
                            "the graph inside it (a child graph) after copying the inputs there");
      if constexpr ((detail::DevicePair<std::remove_cvref_t<S>, std::remove_cvref_t<I>> && ...) &&
                    sizeof...(S) <= static_cast<std::size_t>(config::copy_table_max)) {
        // The common case: the static buffers of the last call, every pair copied by the copy
        // node, whose plan stands. Only the sources change (same_batched_plan, restage).
        std::array<const void*, sizeof...(S)> sources;
        if (staging_ && detail::same_batched_plan(static_inputs, inputs, device_, static_order_, sources) &&
            staging_->node.restage(exec_.get(), sources.data(), static_cast<int>(sizeof...(S)), where)) {
          detail::check(detail::graph_launch(exec_.get(), stream.get()), "cudaGraphLaunch", where);
          staging_->node.launched();
          return;
        }
      }
      const auto plans = detail::plan_pairs(static_inputs, inputs, device_, static_order_, where);

      std::size_t batched = 0;
      std::size_t skipped = 0;
      for (const detail::StagePlan& plan : plans) {
        batched += plan.kind == detail::StageKind::Batched;
        skipped += plan.kind == detail::StageKind::Skip;
      }
      const bool all_batched = batched + skipped == sizeof...(S);  // the common case: no pass over the others
      if (batched == 0) {
        issue_unbatched(plans, static_inputs, inputs, stream, where);
        launch_unstaged(stream.get(), where);  // checked above: an executable, a stream not capturing
        return;
      }
      Staging& staging = prepare_staging(stream.get(), where);
      detail::CopyBatch& batch = staging.batch;
      batch.start(batched < static_cast<std::size_t>(config::copy_table_max) ? batched : config::copy_table_max);
      [&]<std::size_t... k>(std::index_sequence<k...>) {
        (
            [&] {
              if (plans[k].kind != detail::StageKind::Batched) return;
              if (batch.full()) {  // more pairs than one table holds: copy a full table first
                staging.node.launch_now(batch, stream.get(), where);
                batch.start(batch.count());
              }
              const auto& dst = std::get<k>(static_inputs);
              batch.add(tensor_data(std::get<k>(inputs)), tensor_data(dst),
                        tensor_size(dst) * sizeof(element_t<std::remove_cvref_t<decltype(dst)>>));
            }(),
            ...);
      }(std::index_sequence_for<S...>{});
      if (!all_batched) issue_unbatched(plans, static_inputs, inputs, stream, where);
      const bool by_node = staging.node.stage(exec_.get(), batch, stream.get(), where);
      detail::check(detail::graph_launch(exec_.get(), stream.get()), "cudaGraphLaunch", where);
      if (by_node) staging.node.launched();
      // Every pair went through the copy node, whose plan is now this call's static buffers.
      static_order_.batched_plan = by_node && batched == sizeof...(S);
    }
  }

  //! stage_and_launch on this thread's current stream of the graph's device (like replay()).
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs,
                        tensorplay::source_location where = tensorplay::source_location::current()) {
    require_executable("stage_and_launch", where);
    on_current_stream([&](cudaStream_t stream) { stage_and_launch(static_inputs, inputs, StreamRef(stream), where); },
                      where);
  }

 private:
  template <ConditionalKind>
  friend class ConditionalScope;
  friend struct detail::GraphAccess;

  // capture_end without compiling (instantiate() compiles later): for captures that must all
  // end before any is compiled (DeviceGroupGraph), or whose graphs share one executable.
  void end_without_compiling(const tensorplay::source_location& where) {
    if (deferred_error_ && is_capturing()) {
      session_->abandon();
      std::rethrow_exception(std::exchange(deferred_error_, nullptr));
    }
    deferred_error_ = nullptr;  // kept by a capture abandoned since, whose error was thrown then
    require_open_capture("capture_end", where);
    graph_ = end_session(where);
    device_ = capture_device_;
    mode_ = capture_mode_;
    has_conditionals_ = capturing_conditionals_;
    retained_.retain_on(graph_.get(), where);
  }

  // A ConditionalScope could not close its body (in its destructor): capture_end rethrows.
  void defer_error(std::exception_ptr error) noexcept {
    if (!deferred_error_) deferred_error_ = std::move(error);
  }

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

  // ---- capture internals ----------------------------------------------------------------

  void begin_session(const CaptureOptions& options, std::shared_ptr<detail::PoolImpl> pool, const tensorplay::source_location& where) {
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
      if (pool->kind() != detail::PoolImpl::Kind::Graph)
        detail::throw_usage("capture_begin: a device's default pool cannot hold a graph's memory; use graph_pool_handle()");
      if (pool->device() != device)
        detail::throw_usage("capture_begin: the pool belongs to device " + std::to_string(pool->device()) +
                            ", the capture stream to device " + std::to_string(device));
    }
    const cudaStreamCaptureMode mode = detail::to_cuda(options.capture_error_mode.value_or(options_.capture_error_mode));
    if (!session_) session_ = std::make_unique<detail::CaptureSession>();  // kept: no allocation per capture
    session_->begin(stream, device, mode, std::move(pool), where);
    deferred_error_ = nullptr;
    capturing_conditionals_ = false;
    capture_device_ = device;
    capture_mode_ = options.capture_error_mode.value_or(options_.capture_error_mode);
  }

  // Ends the open session; returns the captured graph. On failure the graph's state is as before
  // the capture began (a first capture: no pool, no device).
  detail::GraphHandle end_session(const tensorplay::source_location& where) {
    std::pair<detail::GraphHandle, std::shared_ptr<detail::PoolImpl>> ended;
    try {
      ended = session_->end(where);
    } catch (const usage_error&) {
      throw;  // a body is still open: the capture goes on
    } catch (...) {
      if (!graph_) pool_ = options_.pool;
      throw;
    }
    if (ended.second && !graph_) pool_ = Pool(std::move(ended.second));
    return std::move(ended.first);
  }

  void compile(const tensorplay::source_location& where) { instantiate_exec(graph_.get(), upload_stream(), where); }

  // Where a new executable is uploaded: GraphOptions::upload, on the stream captured last.
  [[nodiscard]] std::optional<cudaStream_t> upload_stream() const noexcept {
    if (!options_.upload) return std::nullopt;
    return session_ ? session_->origin() : nullptr;
  }

  // update(): the new version replaces the old one in the executable.
  UpdateResult replace(detail::GraphHandle graph, const tensorplay::source_location& where) {
    retained_.retain_on(graph.get(), where);
    detail::StagingNodes copy;
    if (staging_) copy = staging_->node.add_to(graph.get(), device_, where);
    UpdateResult result;
    if (exec_ && exec_.try_update(graph.get(), result, where)) {
      result.outcome = UpdateOutcome::Updated;
      // The copy node is named by the graph the executable was instantiated from: keep it. Its
      // parameters are now the new graph's node's (no plan).
      if (staging_) {
        if (!origin_) origin_ = std::move(graph_);
        staging_->node.recompiled();
      }
    } else {
      result.outcome = UpdateOutcome::Reinstantiated;
      origin_.reset();
      if (staging_) staging_->node.adopt(copy);
      exec_.reset();
      instantiate_exec(graph.get(), upload_stream(), where);
    }
    graph_ = std::move(graph);
    has_conditionals_ = capturing_conditionals_;
    hold_retained_in_executable(where);  // objects retained by the update's body
    return result;
  }

  // Launches the executable on `stream` (not capturing) with the staging nodes off: they must
  // not copy again what the last stage_and_launch staged.
  void launch_unstaged(cudaStream_t stream, const tensorplay::source_location& where) {
    if (staging_ && staging_->node.enabled()) [[unlikely]]
      staging_->node.disable(exec_.get(), where);
    detail::check(detail::graph_launch(exec_.get(), stream), "cudaGraphLaunch", where);
  }

  template <class F>
  void run_body(F& body) {
    session_->abandon_on_throw([&] { detail::call_body(body, capture_stream()); });
  }

  // A conditional node with `size` bodies at the current point of the capture.
  template <class P>
  detail::ConditionalNode add_conditional(cudaGraphConditionalNodeType type, unsigned size, const P& pred,
                                          const char* what, const tensorplay::source_location& where) {
    const detail::ConditionalNode node = detail::add_conditional_node(*session_, type, size, pred, what, where);
    capturing_conditionals_ = true;
    return node;
  }

  template <class P>
  void open_conditional(cudaGraphConditionalNodeType type, const P& pred, const char* what, const tensorplay::source_location& where) {
    require_open_capture(what, where);
    const detail::ConditionalNode node = add_conditional(type, 1, pred, what, where);
    detail::open_body(*session_, node.bodies[0], node.handle, where);
  }

  // Captures `body` into one body of a conditional node (if_else_, switch_).
  template <class F>
  void capture_body(cudaGraph_t slot, cudaGraphConditionalHandle handle, F& body, const tensorplay::source_location& where) {
    detail::open_body(*session_, slot, handle, where);
    run_body(body);
    detail::close_body(*session_, where);
  }

  void require_open_capture(const char* what, const tensorplay::source_location&) const {
    if (is_capturing()) return;
    if (session_ && session_->how_ended() == detail::CaptureEnd::StreamDestroyed)
      detail::throw_usage(std::string(what) + ": the capture was abandoned because its stream was destroyed; capture again");
    if (session_ && session_->how_ended() == detail::CaptureEnd::Abandoned)
      detail::throw_usage(std::string(what) + ": the capture was abandoned after an error inside it; capture again");
    detail::throw_usage(std::string(what) + ": no capture is open on this graph (call capture_begin first)");
  }
  void require_open_body(const char* what, const tensorplay::source_location& where) const {
    require_open_capture(what, where);
    if (session_->depth() == 0) detail::throw_usage(std::string(what) + ": no conditional body is open");
  }
  void require_executable(const char* what, const tensorplay::source_location&) const {
    if (!exec_) [[unlikely]] {
      if (is_capturing()) detail::throw_usage(std::string(what) + ": the graph is still capturing; call capture_end first");
      if (graph_) detail::throw_usage(std::string(what) + ": the graph has no executable (its instantiation failed); "
                                                          "call instantiate() or capture again");
      detail::throw_usage(std::string(what) + ": nothing has been captured (call capture_begin/capture_end or capture first)");
    }
  }

  // Calls f(stream) with this thread's current stream of the graph's device. The legacy default
  // stream (null) belongs to whatever device is current: the graph's device is made current for it.
  template <class F>
  void on_current_stream(F&& f, const tensorplay::source_location& where) const {
    const cudaStream_t stream = current_stream(device_);
    if (stream == nullptr) {
      detail::DeviceGuard guard(device_, where);
      f(stream);
    } else {
      f(stream);
    }
  }

  // replay(stream) while `stream` captures: a child-graph node in that capture, which keeps this
  // graph's pool and retained objects alive for as long as the outer graph lives.
  void add_to_capture(cudaStream_t stream, const tensorplay::source_location& where) {
    if (has_conditionals_)
      detail::throw_usage("replay: the stream is being captured, and this graph holds conditional nodes, which CUDA "
                          "does not allow in a child graph; replay it outside the capture, or capture its work "
                          "into the outer graph directly");
    detail::CaptureInfo info;
    TENSORPLAY_CHECK(detail::get_capture_info(stream, info), where);
    if (info.status != cudaStreamCaptureStatusActive)
      detail::check(cudaErrorStreamCaptureInvalidated, "replay into a capture (the capture was invalidated earlier)", where);
    cudaGraphNode_t node = nullptr;
    TENSORPLAY_CHECK(cudaGraphAddChildGraphNode(&node, info.graph, info.dependencies, info.dependency_count, graph_.get()),
                     where);
    TENSORPLAY_CHECK(detail::set_capture_dependencies(stream, &node, 1), where);
    retained_.retain_on(info.graph, where);
    if (pool_) detail::RetainedObjects::retain_copy(pool_, info.graph, where);
  }

  // ---- retained objects and the executable --------------------------------------------------

  // Every compile goes through here: the executable holds the objects retained so far.
  void instantiate_exec(cudaGraph_t graph, std::optional<cudaStream_t> upload, const tensorplay::source_location& where) {
    exec_.instantiate(graph, upload, where);
    retained_in_exec_ = retained_.size();
  }

  // An executable holds references to the user objects its graph held when it was compiled, and
  // CUDA adds none later (an in-place update neither). Objects retained since then are given to
  // it by compiling it again, from the graph it was compiled from, so that they outlive its launches.
  void hold_retained_in_executable(const tensorplay::source_location& where) {
    if (!exec_ || retained_.size() == retained_in_exec_) return;
    const cudaGraph_t source = origin_ ? origin_.get() : graph_.get();
    if (origin_) retained_.retain_since(retained_in_exec_, source, where);
    instantiate_exec(source, std::nullopt, where);
    if (staging_) staging_->node.recompiled();
  }

  // ---- staging internals ----------------------------------------------------------------

  struct Staging {
    detail::CopyNode node;
    detail::CopyBatch batch;
  };

  // The copy node, made on the first stage_and_launch that batches: added to the graph, which
  // is compiled again with it (CUDA allows a graph with conditional nodes one executable).
  Staging& prepare_staging(cudaStream_t stream, const tensorplay::source_location& where) {
    if (staging_) return *staging_;
    auto staging = std::make_unique<Staging>(Staging{detail::CopyNode(detail::RingGraveyard::instance().take(device_, stream, where)), {}});
    staging->node.adopt(staging->node.add_to(graph_.get(), device_, where));
    instantiate_exec(graph_.get(), std::nullopt, where);
    staging_ = std::move(staging);
    return *staging_;
  }

  template <std::size_t N, class StaticTuple, class InputTuple>
  void issue_unbatched(const std::array<detail::StagePlan, N>& plans, const StaticTuple& statics, const InputTuple& inputs,
                       StreamRef stream, const tensorplay::source_location& where) {
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      (detail::issue_unbatched(plans[k], std::get<k>(statics), std::get<k>(inputs), device_, stream.get(), where), ...);
    }(std::make_index_sequence<N>{});
  }

  // Hot members first: replay reads exec_ and staging_ only.
  detail::Executable exec_;
  std::unique_ptr<Staging> staging_;
  GraphOptions options_;
  mutable Pool pool_;
  detail::GraphHandle graph_;   // the latest captured graph
  detail::GraphHandle origin_;  // the graph exec_ was compiled from, kept while update() replaced graph_
                                // and the copy node (named by this graph) is in use
  detail::RetainedObjects retained_;
  std::size_t retained_in_exec_ = 0;  // how many of retained_'s objects the executable holds
  detail::StaticOrder static_order_;  // stage_and_launch's static buffers, sorted (staging.hpp)
  int device_ = -1;
  int capture_device_ = -1;
  CaptureErrorMode mode_ = CaptureErrorMode::Global;
  CaptureErrorMode capture_mode_ = CaptureErrorMode::Global;
  bool debug_ = false;
  bool has_conditionals_ = false;        // CUDA refuses such a graph as a child graph
  bool capturing_conditionals_ = false;  // the open capture made conditional nodes
  std::exception_ptr deferred_error_;  // what a ConditionalScope's destructor could not throw
  std::unique_ptr<detail::CaptureSession> session_;  // destroyed first: abandons an open capture
};

namespace detail {

//! What other parts of the library (DeviceGroupGraph, GraphBuckets) need of a Graph beyond its
//! public API.
struct GraphAccess {
  //! Ends the capture without compiling; Graph::instantiate() compiles later.
  static void end_capture_only(Graph& graph, const tensorplay::source_location& where) { graph.end_without_compiling(where); }
  //! The Graph's pool object (its implementation), to keep alive beside its executables.
  static const std::shared_ptr<PoolImpl>& pool_impl(const Graph& graph) noexcept { return graph.pool_.impl(); }
};

}  // namespace detail
}  // namespace tensorplay
