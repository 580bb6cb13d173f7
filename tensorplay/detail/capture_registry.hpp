// tensorplay/detail/capture_registry.hpp: which capture sequence allocates from which pool.
//
// A capture registers its stream (and the sequence ids of its conditional bodies) with the
// context that knows its pool. An allocation asks the registry where to go: no open capture, or
// a stream that is not capturing, means the default pool of the device; otherwise the pool
// registered for the stream's capture sequence.
//
// The sequence id of a capture is asked of CUDA only when a lookup needs it (the capture's
// first allocation, say), not when the capture begins: most captures allocate nothing, and
// the query costs about as much as the rest of capture_begin's bookkeeping together.
//
// For the capture doctor (capture_doctor.hpp) each capture and body also keeps where it was
// asked for, its thread and mode, and where the doctor's evidence stood when it began; the
// last few that ended are kept too, so that a failure can name a capture that is already over
// (another thread's, whose call broke this one): those that failed, and those during which
// some evidence arrived (remove_capture).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_doctor_watch.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

class CaptureContext;  // capture_context.hpp: what an open capture allocates from

//! What owns an open capture: the registry asks it to abandon the capture when the capture's
//! stream is about to be destroyed (stream_lifetime.hpp), so that no capture outlives its stream.
class CaptureOwner {
 public:
  //! Ends every open body and the capture, discarding what was captured. Runs before the
  //! stream is destroyed, on the thread destroying it.
  virtual void abandon_because_stream_destroyed() noexcept = 0;

 protected:
  CaptureOwner() = default;
  CaptureOwner(const CaptureOwner&) = default;
  CaptureOwner& operator=(const CaptureOwner&) = default;
  ~CaptureOwner() = default;
};

//! What the capture doctor knows of a capture or of a conditional body.
struct CaptureRecord {
  static constexpr std::uint64_t still_open = UINT64_MAX;
  CaptureSeq seq = 0;                      // 0: not asked of CUDA (yet)
  cudaStream_t origin = nullptr;           // the capture's origin stream (a body's: its capture's)
  bool body = false;
  std::size_t depth = 0;                   // a body's nesting depth: 1 directly inside the capture
  tensorplay::source_location where{};     // where capture_begin (or the body) was asked for
  ThreadId thread;                         // the thread that began it
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::uint64_t opened = 0;                // CaptureEvidence::mark() when it began
  std::uint64_t closed = still_open;       // ... when it ended
};

class CaptureRegistry {
 public:
  //! Ended captures and bodies kept for the doctor: a failure names at most the one capture
  //! that took part, usually ended moments ago; 32 covers a busy process's last moments.
  static constexpr std::size_t ended_kept = 32;

  TENSORPLAY_PROCESS_WIDE static CaptureRegistry& instance();

  //! True while any tensorplay capture is open. The one check on the allocation fast path.
  [[nodiscard]] bool any_open() const noexcept;

  //! A capture on `stream` starts; allocations on its streams go through `context`, and its
  //! streams belong to `device`. `seq` may be 0 (not asked yet): it is then asked of CUDA
  //! when a lookup first needs it.
  //! `where` and `mode` are for the capture doctor: where the capture was asked for, its mode.
  void add_capture(CaptureContext* context, CaptureOwner* owner, cudaStream_t stream, CaptureSeq seq, int device,
                   const tensorplay::source_location& where = {}, cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal);

  //! A conditional body (sequence `seq`) of the capture that registered `context` starts.
  void add_body(CaptureContext* context, CaptureSeq seq, int device);

  //! Where the body of sequence `seq` was asked for (for the capture doctor's messages).
  void locate_body(CaptureSeq seq, const tensorplay::source_location& where) noexcept;

  //! The body ended.
  void remove_body(CaptureSeq seq) noexcept;

  //! Every open capture and body, then the last ones that ended (most recent last), for the
  //! capture doctor. Never asks CUDA anything (the driver-log callback must not wait on it).
  [[nodiscard]] std::vector<CaptureRecord> records() const;

  //! The capture that registered `context` ended (its bodies are gone already); `failed`: it
  //! did not end well. When the last capture ends, deferred cudaFrees run.
  //! Its record joins the ended ones when the doctor may still ask for it: it failed, or some
  //! evidence arrived while it was open (a call it made may have broken another capture). A
  //! capture that ended well with no evidence on record takes part in no failure, and skipping
  //! the copy keeps the ring's cache lines off the path of every capture.
  void remove_capture(CaptureContext* context, bool failed = true) noexcept;

  //! Abandons every capture whose origin stream is `stream` (it is about to be destroyed).
  void abandon_captures_on(cudaStream_t stream) noexcept;

  //! The context registered for capture sequence `seq`, or null.
  [[nodiscard]] CaptureContext* find(CaptureSeq seq);

  //! The device of a registered capture sequence, or -1.
  [[nodiscard]] int device_of(CaptureSeq seq);

  //! Frees device memory now, or once no capture is open: cudaFree synchronises the device,
  //! which would invalidate a capture in progress.
  void release_segments(int device, const std::vector<void*>& segments) noexcept;

  //! Frees pinned host memory (cudaHostAlloc) now, or once no capture is open, for the same reason.
  void release_host(void* ptr) noexcept;

  //! Frees what waits for the end of captures, if none is open now (a cudaMalloc retry path).
  void drain() noexcept;

 private:
  //! Memory whose free waits for the end of captures: device memory of `device`, or pinned host memory.
  struct Buried {
    static constexpr int host = -1;
    int device;
    void* ptr;
  };

  static void free_now(const Buried& b) noexcept;

  // Few captures are open at once: a vector beats a hash map, and allocates nothing per capture.
  struct Entry {
    CaptureSeq seq;        // 0: a capture whose id nobody has asked for yet
    cudaStream_t stream;   // a capture's origin stream; null for a conditional body
    CaptureContext* context;
    CaptureOwner* owner;   // null for a conditional body
    int device;
    CaptureRecord record;  // for the capture doctor
  };

  // The entry of sequence `seq`. Captures whose id is not known yet are asked first, and only
  // when no known id matches. Called with the mutex held.
  Entry* lookup(CaptureSeq seq);

  // Removes the first entry that matches, keeping its record among the ended ones if `keep` says so.
  template <class Pred, class Keep = bool (*)(const Entry&)>
  void erase_first(Pred pred, Keep keep = [](const Entry&) { return true; }) noexcept {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!pred(entries_[i])) continue;
      if (keep(entries_[i])) {
        CaptureRecord& ended = ended_[ended_count_++ % ended_kept];
        ended = entries_[i].record;
        ended.seq = entries_[i].seq;
        ended.closed = CaptureEvidence::instance().mark();
      }
      if (i + 1 != entries_.size()) entries_[i] = entries_.back();
      entries_.pop_back();
      return;
    }
  }
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<int> open_{0};
  std::vector<Buried> buried_;
  std::array<CaptureRecord, ended_kept> ended_{};  // a ring: the last ended_kept that ended
  std::size_t ended_count_ = 0;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/device_guard.hpp>
#include <tensorplay/detail/thread_id.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL CaptureRegistry& CaptureRegistry::instance() {
  static auto* registry = new CaptureRegistry;  // leaked on purpose: pools die after main returns
  return *registry;
}

TENSORPLAY_DECL bool CaptureRegistry::any_open() const noexcept { return open_.load(std::memory_order_acquire) != 0; }

TENSORPLAY_DECL void CaptureRegistry::add_capture(CaptureContext* context, CaptureOwner* owner, cudaStream_t stream, CaptureSeq seq, int device,
    const tensorplay::source_location& where, cudaStreamCaptureMode mode) {
  CaptureDoctorWatch::instance().start();  // once per process; safe inside the capture (probed)
  CaptureRecord record;
  record.origin = stream;
  record.where = where;
  record.thread = this_thread_id();
  record.mode = mode;
  record.opened = CaptureEvidence::instance().mark();
  std::lock_guard lock(mutex_);
  entries_.push_back({seq, stream, context, owner, device, record});
  open_.store(open_.load(std::memory_order_relaxed) + 1, std::memory_order_release);  // writers hold the mutex
}

TENSORPLAY_DECL void CaptureRegistry::add_body(CaptureContext* context, CaptureSeq seq, int device) {
  std::lock_guard lock(mutex_);
  CaptureRecord record;
  record.body = true;
  record.thread = this_thread_id();
  record.opened = CaptureEvidence::instance().mark();
  record.depth = 1;
  for (const Entry& e : entries_) {
    if (e.context != context) continue;
    if (e.stream != nullptr) {
      record.origin = e.stream;
      record.mode = e.record.mode;
    } else {
      ++record.depth;
    }
  }
  entries_.push_back({seq, nullptr, context, nullptr, device, record});
}

TENSORPLAY_DECL void CaptureRegistry::locate_body(CaptureSeq seq, const tensorplay::source_location& where) noexcept {
  std::lock_guard lock(mutex_);
  for (Entry& e : entries_)
    if (e.stream == nullptr && e.seq == seq) e.record.where = where;
}

TENSORPLAY_DECL void CaptureRegistry::remove_body(CaptureSeq seq) noexcept {
  std::lock_guard lock(mutex_);
  erase_first([seq](const Entry& e) { return e.stream == nullptr && e.seq == seq; });
}

TENSORPLAY_DECL std::vector<CaptureRecord> CaptureRegistry::records() const {
  std::lock_guard lock(mutex_);
  std::vector<CaptureRecord> out;
  out.reserve(entries_.size() + ended_kept);
  for (const Entry& e : entries_) {
    out.push_back(e.record);
    out.back().seq = e.seq;
  }
  const std::size_t kept = ended_count_ < ended_kept ? ended_count_ : ended_kept;
  for (std::size_t i = ended_count_ - kept; i < ended_count_; ++i) out.push_back(ended_[i % ended_kept]);
  return out;
}

TENSORPLAY_DECL void CaptureRegistry::remove_capture(CaptureContext* context, bool failed) noexcept {
  std::vector<Buried> due;
  {
    std::lock_guard lock(mutex_);
    erase_first([context](const Entry& e) { return e.stream != nullptr && e.context == context; },
                [failed](const Entry& e) { return failed || CaptureEvidence::instance().mark() != e.record.opened; });
    const int open = open_.load(std::memory_order_relaxed) - 1;
    open_.store(open, std::memory_order_release);
    if (open == 0) due.swap(buried_);
  }
  for (const Buried& b : due) free_now(b);
}

TENSORPLAY_DECL void CaptureRegistry::abandon_captures_on(cudaStream_t stream) noexcept {
  if (!any_open()) return;
  std::vector<CaptureOwner*> owners;
  {
    std::lock_guard lock(mutex_);
    for (const Entry& e : entries_)
      if (e.stream == stream && e.owner != nullptr) owners.push_back(e.owner);
  }
  // Outside the lock: abandoning unregisters the capture.
  for (CaptureOwner* owner : owners) owner->abandon_because_stream_destroyed();
}

TENSORPLAY_DECL CaptureContext* CaptureRegistry::find(CaptureSeq seq) {
  std::lock_guard lock(mutex_);
  const Entry* e = lookup(seq);
  return e != nullptr ? e->context : nullptr;
}

TENSORPLAY_DECL int CaptureRegistry::device_of(CaptureSeq seq) {
  std::lock_guard lock(mutex_);
  const Entry* e = lookup(seq);
  return e != nullptr ? e->device : -1;
}

TENSORPLAY_DECL void CaptureRegistry::release_segments(int device, const std::vector<void*>& segments) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (any_open()) {
      for (void* s : segments) buried_.push_back({device, s});
      return;
    }
  }
  for (void* s : segments) free_now({device, s});
}

TENSORPLAY_DECL void CaptureRegistry::release_host(void* ptr) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (any_open()) {
      buried_.push_back({Buried::host, ptr});
      return;
    }
  }
  free_now({Buried::host, ptr});
}

TENSORPLAY_DECL void CaptureRegistry::drain() noexcept {
  std::vector<Buried> due;
  {
    std::lock_guard lock(mutex_);
    if (any_open()) return;
    due.swap(buried_);
  }
  for (const Buried& b : due) free_now(b);
}

TENSORPLAY_DECL void CaptureRegistry::free_now(const Buried& b) noexcept {
  if (b.device == Buried::host) {
    (void)cudaFreeHost(b.ptr);
    (void)cudaGetLastError();
    return;
  }
  DeviceGuard on_device(b.device, DeviceGuard::quiet);
  (void)cudaFree(b.ptr);
  (void)cudaGetLastError();
}

TENSORPLAY_DECL auto CaptureRegistry::lookup(CaptureSeq seq) -> Entry* {
  if (seq == 0) return nullptr;
  for (Entry& e : entries_)
    if (e.seq == seq) return &e;
  Entry* found = nullptr;
  for (Entry& e : entries_) {
    if (e.seq != 0) continue;
    const CaptureSeq id = capture_seq_or_zero(e.stream);
    if (id == 0) continue;  // ending right now, on another thread: not what is looked for
    e.seq = id;
    if (id == seq) found = &e;
  }
  return found;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
