// tensorplay/detail/reaper.hpp: destroys objects retained by graphs (Graph::retain), on a thread
// of the library's own.
//
// CUDA releases a user object when the last graph, executable and launch that hold it are gone,
// and calls its destructor callback on an internal thread that must not call CUDA. A retained
// object's destructor may well call CUDA (ncclCommDestroy, a DeviceTensor giving its memory
// back), so the callback only hands the object to this thread, which destroys it.
#pragma once

#include <tensorplay/version.hpp>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

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

class Reaper {
 public:
  static Reaper& instance() {
    static auto* reaper = new Reaper;  // leaked on purpose: callbacks may come during exit
    return *reaper;
  }

  //! Called from CUDA's callback thread: no CUDA here, only a queue.
  static void enqueue(void* box) noexcept {
    Reaper& r = instance();
    {
      std::lock_guard lock(r.mutex_);
      r.queue_.push_back(static_cast<RetainedBox*>(box));
    }
    r.ready_.notify_one();
  }

  //! Blocks until every object handed over so far is destroyed (tests).
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
  }

 private:
  Reaper() {
    std::thread([this] { run(); }).detach();
  }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return !queue_.empty(); });
      RetainedBox* box = queue_.front();
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      delete box;  // the user's destructor, which may call CUDA
      lock.lock();
      --busy_;
      if (queue_.empty() && busy_ == 0) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable idle_;
  std::deque<RetainedBox*> queue_;
  int busy_ = 0;
};

}  // namespace tensorplay::detail
