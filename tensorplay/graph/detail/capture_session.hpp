// tensorplay/graph/detail/capture_session.hpp: one open capture of a Graph: begin, end, abandon, the
// open conditional bodies, and the bookkeeping that routes the capture's allocations.
//
// Conditional bodies are captured as captures of their own (cudaStreamBeginCapture on a body
// stream), not into the conditional node's body graph directly: when CUDA invalidates a capture
// in which bodies were captured straight into node-owned graphs (cudaStreamBeginCaptureToGraph),
// every way of ending those captures crashes the driver or leaves streams capturing for good
// (probed on the H200, driver 580). Independent captures end cleanly whatever happened, and a
// closed body's work is moved into its node then (conditional_builder.hpp).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/exec_memory.hpp>
#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/capture_doctor.hpp>
#include <tensorplay/detail/thread_streams.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! An open conditional body: its own capture, and where its work goes when it closes.
struct BodyCapture {
  cudaStream_t stream = nullptr;               // the body's capture stream (one per depth)
  CaptureSeq seq = 0;                          // the body capture's sequence id
  cudaGraphConditionalHandle handle = 0;       // the handle of the node the body belongs to
  cudaGraph_t slot = nullptr;                  // the node's body graph
  //! Conditional nodes opened inside this body: the empty node standing for each in this body's
  //! capture, and the real node, created directly in `slot`.
  std::vector<std::pair<cudaGraphNode_t, cudaGraphNode_t>> nested;
};

//! What a capture captured.
struct CapturedGraph {
  GraphHandle graph;
  int device = -1;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::shared_ptr<PoolImpl> pool;  // what the capture allocated from (null: nothing, and it had none)
  bool conditionals = false;       // it holds conditional nodes (CUDA refuses such a child graph)
  ConditionalBodies conditional_bodies;  // the bodies of its conditional nodes (exec_memory.hpp)
};

//! A number no capture of the process had before (CaptureSession::serial).
TENSORPLAY_PROCESS_WIDE TENSORPLAY_DECL std::uint64_t next_capture_serial() noexcept;

//! Why a capture is no longer open.
enum class CaptureEnd { Open, Ended, Abandoned, StreamDestroyed };

class CaptureSession final : public CaptureOwner {
 public:
  CaptureSession() = default;
  CaptureSession(const CaptureSession&) = delete;
  CaptureSession& operator=(const CaptureSession&) = delete;
  //! Abandons a capture still open: no stream is left capturing.
  ~CaptureSession();

  //! Begins capturing on `stream`. On any throw nothing is capturing and nothing is registered.
  //! \throws usage_error when `stream` already captures (checked before CUDA is asked: a
  //!         refused cudaStreamBeginCapture would invalidate the other capture), or `pool` is
  //!         busy with another capture; cuda_error when CUDA refuses.
  void begin(cudaStream_t stream, int device, cudaStreamCaptureMode mode, std::shared_ptr<PoolImpl> pool,
             const tensorplay::source_location& where);

  //! Ends the capture and returns what it captured.
  //! \throws usage_error with a body still open; cuda_error when CUDA invalidated the capture
  //!         (the capture is over either way).
  CapturedGraph end(const tensorplay::source_location& where);

  //! Ends every open body and the capture, and discards what was captured. Never throws.
  void abandon() noexcept;

  //! Runs `f`; if it throws, abandons the capture and rethrows. The one place where a failure
  //! inside a capture turns into "nothing is left capturing" (unless kept open, below).
  //! A cuda_error whose status says the capture is broken (the library's own next call is often
  //! the first to see it) becomes the capture_error that names the call that broke it.
  template <class F>
  decltype(auto) abandon_on_throw(F&& f) {
    try {
      return f();
    } catch (const capture_error&) {
      if (!keep_open_on_failure_) abandon();
      throw;
    } catch (const cuda_error& e) {
      if (is_capture_failure(e.status())) rethrow_as_capture_error(e);
      if (!keep_open_on_failure_) abandon();
      throw;
    } catch (...) {
      if (!keep_open_on_failure_) abandon();
      throw;
    }
  }

  //! Throws the capture_error for `e` (a call that failed because the capture is broken),
  //! abandoning the capture first unless it is kept open.
  [[noreturn]] void rethrow_as_capture_error(const cuda_error& e);

  //! While one lives, a failure does not abandon the capture: a body whose capture cannot end is
  //! dropped and the enclosing captures stay open, so that work issued afterwards is still
  //! captured (and thrown away at capture_end), never run. For ConditionalScope's destructor,
  //! which cannot throw and after which the caller goes on issuing work.
  class KeepOpenOnFailure {
   public:
    explicit KeepOpenOnFailure(CaptureSession& session) noexcept;
    KeepOpenOnFailure(const KeepOpenOnFailure&) = delete;
    KeepOpenOnFailure& operator=(const KeepOpenOnFailure&) = delete;
    ~KeepOpenOnFailure();

   private:
    CaptureSession& session_;
    bool before_;
  };
  [[nodiscard]] bool keeps_open_on_failure() const noexcept { return keep_open_on_failure_; }

  void abandon_because_stream_destroyed() noexcept override;

  [[nodiscard]] bool is_open() const noexcept;
  //! How the last capture ended (Open while it is open).
  [[nodiscard]] CaptureEnd how_ended() const noexcept;
  [[nodiscard]] cudaStream_t origin() const noexcept { return stream_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStreamCaptureMode mode() const noexcept { return mode_; }
  //! Where work is captured now: the innermost open body, else the origin stream.
  [[nodiscard]] cudaStream_t current() const noexcept;
  [[nodiscard]] std::size_t depth() const noexcept;
  //! A conditional node was added to the capture.
  void note_conditional() noexcept;
  //! The bodies of a conditional node just made (CUDA 13.0 cannot list them from the node).
  void record_bodies(cudaGraphNode_t node, const cudaGraph_t* bodies, unsigned count);
  [[nodiscard]] std::vector<BodyCapture>& bodies() noexcept { return bodies_; }
  [[nodiscard]] CaptureContext& context() noexcept { return context_; }

  //! Which capture this is: a number no other capture of the process had (0: never begun).
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }

  //! A handle made for the user (Graph::conditional_handle) in graph `holder`.
  void issue_handle(cudaGraphConditionalHandle handle, cudaGraph_t holder);

  //! A node about to be made in graph `holder` takes the user's handle (`handle`, made by the
  //! capture numbered `serial`).
  //! \throws usage_error for a handle that names no node, was made by another capture or graph,
  //!         belongs to another graph level (a handle is made where its node goes), or was
  //!         already taken by a node.
  void claim_handle(cudaGraphConditionalHandle handle, std::uint64_t serial, cudaGraph_t holder, const char* what);

  //! The stream of the body at nesting `depth` (made on first use, reused by later captures).
  cudaStream_t body_stream(std::size_t depth, const tensorplay::source_location& where);

  //! Registers a body that began capturing on `body.stream`, and makes its stream current.
  void push_body(BodyCapture body);

  //! Unregisters the innermost body (whose capture has ended) and returns it. What it allocated
  //! now belongs to the parent stream.
  BodyCapture pop_body() noexcept;

 private:
  // Ends a capture that was just begun and is to be thrown away.
  static void discard(cudaStream_t stream) noexcept;

  void abandon_as(CaptureEnd why) noexcept;

  // Restores the current stream, unregisters, lets the pool settle what the capture freed.
  // `failed`: the doctor may be asked about it (the registry keeps its record).
  std::shared_ptr<PoolImpl> finish(CaptureEnd why, bool restore_current = true, bool failed = true) noexcept;

  cudaStream_t stream_ = nullptr;
  int device_ = -1;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeGlobal;
  const ThreadStreams* owner_thread_ = nullptr;  // the capturing thread (its current-stream table)
  std::atomic<CaptureEnd> end_{CaptureEnd::Ended};
  std::vector<BodyCapture> bodies_;       // open conditional bodies, innermost last
  //! Handles made for the user in this capture: the graph each belongs to, and whether a node took it.
  struct IssuedHandle {
    cudaGraphConditionalHandle handle;
    cudaGraph_t holder;
    bool taken;
  };
  std::vector<IssuedHandle> issued_;
  std::uint64_t serial_ = 0;
  bool keep_open_on_failure_ = false;     // see KeepOpenOnFailure
  ConditionalBodies conditional_bodies_;  // the conditional nodes' bodies (exec_memory.hpp)
  bool conditionals_ = false;             // the capture made conditional nodes
  std::vector<OwnedStream> body_streams_; // one per nesting depth, reused by later captures
  CaptureContext context_;                // the pool; registered for the capture's sequences
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_doctor.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/stream_lifetime.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL CaptureSession::~CaptureSession() { abandon(); }

TENSORPLAY_DECL void CaptureSession::begin(cudaStream_t stream, int device, cudaStreamCaptureMode mode, std::shared_ptr<PoolImpl> pool,
    const tensorplay::source_location& where) {
  if (stream_is_capturing(stream, where))
    throw_usage("capture_begin: the stream is already being captured (nested captures need their own stream)");
  // The library's own kernels (conditional nodes, staging) are loaded now, while no capture is
  // open, if they were not yet: loading them synchronises the device, which invalidates
  // captures on other threads, thread-local ones included (memcheck run 32 of thread_test saw
  // one invalidated when the first if_ of one thread loaded them). After the first time this is
  // one atomic load. A failure here is left for the first use of the kernels to report.
  if (!KernelLibrary::ready_on(device) && !CaptureRegistry::instance().any_open()) {
    try {
      (void)KernelLibrary::on(device, where);
    } catch (const cuda_error&) {
      (void)cudaGetLastError();
    }
  }
  if (const cudaError_t status = begin_capture(stream, mode); status != cudaSuccess)
    throw_begin_failure(status, "cudaStreamBeginCapture", where);
  // The capture's sequence id: a pool of the graph's must know it now; otherwise it is asked of
  // CUDA only if the capture allocates (see CaptureRegistry).
  CaptureSeq seq = 0;
  if (pool) {
    if (const cudaError_t status = get_capture_seq(stream, seq); status != cudaSuccess) {
      discard(stream);
      check(status, "cudaStreamGetCaptureInfo", where);
    }
    if (!pool->try_begin_capture(seq)) {
      discard(stream);
      throw_usage("capture_begin: another graph is capturing into this pool right now; captures that share a pool must not overlap");
    }
  }
  stream_ = stream;
  device_ = device;
  mode_ = mode;
  owner_thread_ = &thread_streams();
  bodies_.clear();
  issued_.clear();
  serial_ = next_capture_serial();
  conditionals_ = false;
  conditional_bodies_.clear();
  context_.open(device, stream, seq, std::move(pool));
  CaptureRegistry::instance().add_capture(&context_, this, stream, seq, device, where, mode);
  thread_streams().push(device, stream);
  end_.store(CaptureEnd::Open, std::memory_order_release);
}

TENSORPLAY_DECL CapturedGraph CaptureSession::end(const tensorplay::source_location& where) {
  if (!bodies_.empty())
    throw_usage("capture_end: " + std::to_string(bodies_.size()) +
                " conditional body(ies) still open; call end_capture_to_conditional_node first");
  for (const IssuedHandle& issued : issued_) {
    if (issued.taken) continue;
    abandon();
    throw_usage("capture_end: a handle made by conditional_handle() was given to no conditional node; give each "
                "handle to exactly one if_, while_, if_else_, switch_ or scope (the capture was abandoned)");
  }
  GraphHandle graph;
  const cudaError_t status = end_capture(stream_, graph.out());
  std::shared_ptr<PoolImpl> pool = finish(CaptureEnd::Ended, true, status != cudaSuccess);
  if (status != cudaSuccess) throw_end_failure(status, "cudaStreamEndCapture", stream_, 0, where);  // says why it broke
  return {std::move(graph), device_, mode_, std::move(pool), conditionals_, std::move(conditional_bodies_)};
}

TENSORPLAY_DECL void CaptureSession::abandon() noexcept { abandon_as(CaptureEnd::Abandoned); }

TENSORPLAY_DECL CaptureSession::KeepOpenOnFailure::KeepOpenOnFailure(CaptureSession& session) noexcept : session_(session), before_(std::exchange(session.keep_open_on_failure_, true)) {}

TENSORPLAY_DECL CaptureSession::KeepOpenOnFailure::~KeepOpenOnFailure() { session_.keep_open_on_failure_ = before_; }

TENSORPLAY_DECL void CaptureSession::abandon_because_stream_destroyed() noexcept { abandon_as(CaptureEnd::StreamDestroyed); }

TENSORPLAY_DECL bool CaptureSession::is_open() const noexcept { return end_.load(std::memory_order_acquire) == CaptureEnd::Open; }

TENSORPLAY_DECL CaptureEnd CaptureSession::how_ended() const noexcept { return end_.load(std::memory_order_acquire); }

TENSORPLAY_DECL cudaStream_t CaptureSession::current() const noexcept { return bodies_.empty() ? stream_ : bodies_.back().stream; }

TENSORPLAY_DECL std::size_t CaptureSession::depth() const noexcept { return bodies_.size(); }

TENSORPLAY_DECL void CaptureSession::note_conditional() noexcept { conditionals_ = true; }

TENSORPLAY_DECL void CaptureSession::record_bodies(cudaGraphNode_t node, const cudaGraph_t* bodies, unsigned count) { conditional_bodies_.add(node, bodies, count); }

TENSORPLAY_DECL void CaptureSession::rethrow_as_capture_error(const cuda_error& e) {
  const CaptureSeq body = bodies_.empty() ? 0 : bodies_.back().seq;
  const cudaStream_t origin = stream_;
  if (!keep_open_on_failure_) abandon();
  throw_capture_failure(e.status(), e.call().c_str(), origin, body, e.where());
}

TENSORPLAY_DECL std::uint64_t next_capture_serial() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

TENSORPLAY_DECL void CaptureSession::issue_handle(cudaGraphConditionalHandle handle, cudaGraph_t holder) {
  issued_.push_back({handle, holder, false});
}

TENSORPLAY_DECL void CaptureSession::claim_handle(cudaGraphConditionalHandle handle, std::uint64_t serial, cudaGraph_t holder,
                                                  const char* what) {
  if (serial == 0)
    throw_usage(std::string(what) + ": the ConditionalHandle names no node (default-constructed); make it with "
                "Graph::conditional_handle() inside the capture");
  if (serial != serial_)
    throw_usage(std::string(what) + ": the ConditionalHandle was made by another graph or by a capture that has ended; "
                "make it with conditional_handle() of this graph, in this capture");
  for (IssuedHandle& issued : issued_) {
    if (issued.handle != handle || issued.holder != holder) continue;
    if (issued.taken)
      throw_usage(std::string(what) + ": the ConditionalHandle already belongs to another conditional node; CUDA "
                  "gives each handle to one node, so make one handle per node");
    issued.taken = true;
    return;
  }
  throw_usage(std::string(what) + ": the ConditionalHandle was made at another level of the graph (inside or outside "
              "a conditional body); make it at the level where its node goes, in the same body");
}

TENSORPLAY_DECL cudaStream_t CaptureSession::body_stream(std::size_t depth, const tensorplay::source_location& where) {
  while (body_streams_.size() <= depth) {
    DeviceGuard guard(device_, where);
    RelaxedCaptureMode relaxed;  // creating a stream must not disturb the capture
    cudaStream_t stream = nullptr;
    TENSORPLAY_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), where);
    body_streams_.emplace_back(stream);
  }
  return body_streams_[depth].get();
}

TENSORPLAY_DECL void CaptureSession::push_body(BodyCapture body) {
  CaptureRegistry::instance().add_body(&context_, body.seq, device_);
  context_.body_opened(body.seq);
  thread_streams().push(device_, body.stream);
  bodies_.push_back(std::move(body));
}

TENSORPLAY_DECL BodyCapture CaptureSession::pop_body() noexcept {
  BodyCapture body = std::move(bodies_.back());
  bodies_.pop_back();
  const cudaStream_t parent_stream = current();
  const CaptureSeq parent_seq = bodies_.empty() ? 0 : bodies_.back().seq;  // 0: the capture's own
  context_.body_closed(body.seq, body.stream, parent_seq, parent_stream);
  CaptureRegistry::instance().remove_body(body.seq);
  thread_streams().pop(device_, body.stream);
  return body;
}

TENSORPLAY_DECL void CaptureSession::discard(cudaStream_t stream) noexcept {
  GraphHandle graph;
  (void)end_capture(stream, graph.out());
  (void)cudaGetLastError();
}

TENSORPLAY_DECL void CaptureSession::abandon_as(CaptureEnd why) noexcept {
  if (!is_open()) return;
  const bool same_thread = owner_thread_ == &thread_streams();
  while (!bodies_.empty()) {
    BodyCapture& body = bodies_.back();
    discard(body.stream);  // its own capture: ends cleanly whatever state CUDA left it in
    CaptureRegistry::instance().remove_body(body.seq);
    if (same_thread) thread_streams().pop(device_, body.stream);
    bodies_.pop_back();
  }
  discard(stream_);
  (void)finish(why, same_thread);
}

TENSORPLAY_DECL std::shared_ptr<PoolImpl> CaptureSession::finish(CaptureEnd why, bool restore_current, bool failed) noexcept {
  if (restore_current) thread_streams().pop(device_, stream_);
  std::shared_ptr<PoolImpl> pool = context_.close();
  CaptureRegistry::instance().remove_capture(&context_, failed);
  end_.store(why, std::memory_order_release);
  return pool;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
