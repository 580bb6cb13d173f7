// tensorplay/detail/reaper.hpp: destroys objects retained by graphs (Graph::retain), on a thread
// of the library's own.
//
// CUDA releases a user object when the last graph, executable and launch that hold it are gone,
// and calls its destructor callback on an internal thread that must not call CUDA. A retained
// object's destructor may well call CUDA (ncclCommDestroy, a DeviceTensor giving its memory
// back), so the callback only hands the object to this thread, which destroys it.
//
// At exit the reaper stops: an exit handler lets the destructor it is running finish, and the
// reaper destroys nothing more. What is still queued is left to the operating system, rather than
// destroyed while the exit handlers, static destructors and the CUDA runtime's teardown run.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! A type-erased retained object.
struct RetainedBox {
  virtual ~RetainedBox() = default;
};

template <class T>
struct RetainedValue final : RetainedBox {
  explicit RetainedValue(T&& v) : value(std::move(v)) {}
  T value;
};

// The thread is a POSIX thread woken through std::atomic wait/notify: <thread> and
// <condition_variable> would cost every translation unit that includes tensorplay a second of
// compile time.
class Reaper {
 public:
  TENSORPLAY_PROCESS_WIDE static Reaper& instance();

  //! Called from CUDA's callback thread: no CUDA here, only a queue.
  static void enqueue(void* box) noexcept;

  //! Blocks until every object handed over so far is destroyed (or, once the process is
  //! exiting, left undestroyed).
  void drain() noexcept;

 private:
  Reaper();

  static void* run(void* self);
  static void stop_at_exit() noexcept;

  std::mutex mutex_;                  // guards queue_
  std::vector<RetainedBox*> queue_;
  std::atomic<unsigned> pending_{0};  // handed over and not destroyed yet
  std::mutex destroying_;             // held by the reaper while it destroys a batch
  std::atomic<bool> exiting_{false};  // set by the exit handler: destroy nothing more
  pthread_t thread_{};
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL Reaper& Reaper::instance() {
  static auto* reaper = new Reaper;  // leaked on purpose: callbacks may come during exit
  return *reaper;
}

TENSORPLAY_DECL void Reaper::enqueue(void* box) noexcept {
  Reaper& r = instance();
  {
    // Counted under the lock that the reaper takes the queue with, so that it never takes a box
    // before the box is counted (its fetch_sub would wrap the count for a moment, and it would spin).
    std::lock_guard lock(r.mutex_);
    r.queue_.push_back(static_cast<RetainedBox*>(box));
    r.pending_.fetch_add(1, std::memory_order_release);
  }
  r.pending_.notify_all();
}

TENSORPLAY_DECL void Reaper::drain() noexcept {
  for (unsigned left = pending_.load(std::memory_order_acquire); left != 0; left = pending_.load(std::memory_order_acquire))
    pending_.wait(left);
}

TENSORPLAY_DECL Reaper::Reaper() {
  // Registered when the reaper starts, once CUDA has made a user object: this handler runs before
  // the exit handlers and static destructors registered earlier, the CUDA runtime's among them.
  (void)std::atexit(&Reaper::stop_at_exit);
  if (pthread_create(&thread_, nullptr, &Reaper::run, this) == 0) pthread_detach(thread_);
}

TENSORPLAY_DECL void Reaper::stop_at_exit() noexcept {
  Reaper& r = instance();
  r.exiting_.store(true);
  if (pthread_equal(pthread_self(), r.thread_)) return;  // exit() called by a destructor the reaper runs
  std::lock_guard wait(r.destroying_);                   // the destructor running now finishes
}

TENSORPLAY_DECL void* Reaper::run(void* self) {
  auto* reaper = static_cast<Reaper*>(self);
  // Relaxed capture mode for good: what this thread destroys (graphs, retained objects) must
  // never invalidate a capture running on another thread.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  std::vector<RetainedBox*> batch;
  for (;;) {
    reaper->pending_.wait(0, std::memory_order_acquire);
    {
      std::lock_guard lock(reaper->mutex_);
      batch.swap(reaper->queue_);
    }
    {
      std::lock_guard destroying(reaper->destroying_);
      for (RetainedBox* box : batch) {
        if (reaper->exiting_.load()) break;  // the rest goes with the process
        delete box;                          // the user's destructor, which may call CUDA
      }
    }
    reaper->pending_.fetch_sub(static_cast<unsigned>(batch.size()), std::memory_order_release);
    reaper->pending_.notify_all();
    batch.clear();
  }
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
