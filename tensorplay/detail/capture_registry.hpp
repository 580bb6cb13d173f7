// tensorplay/detail/capture_registry.hpp: which capture sequence allocates from which pool.
//
// A capture registers its sequence id (and the ids of its conditional bodies) with the pool it
// captures into. An allocation asks the registry where to go: no open capture, or a stream
// that is not capturing, means the default pool of the device; otherwise the pool registered
// for the stream's capture sequence.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Identifies one capture sequence (cudaStreamGetCaptureInfo's id); 0 means "not capturing".
using CaptureSeq = unsigned long long;

class CaptureContext;  // pool.hpp: what an open capture allocates from

class CaptureRegistry {
 public:
  static CaptureRegistry& instance() {
    static auto* registry = new CaptureRegistry;  // leaked on purpose: pools die after main returns
    return *registry;
  }

  //! True while any tensorplay capture is open. The one check on the allocation fast path.
  [[nodiscard]] bool any_open() const noexcept { return open_.load(std::memory_order_acquire) != 0; }

  //! A capture (`body == false`) or a conditional body inside one starts; allocations on its
  //! streams go through `context`, and its streams belong to `device`.
  void add(CaptureSeq seq, CaptureContext* context, int device, bool body) {
    std::lock_guard lock(mutex_);
    entries_.push_back({seq, context, device});
    if (!body) open_.fetch_add(1, std::memory_order_acq_rel);
  }

  //! The capture or body ended. When the last capture ends, deferred cudaFrees run.
  void remove(CaptureSeq seq, bool body) noexcept {
    std::vector<std::pair<int, void*>> due;
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].seq != seq) continue;
        entries_[i] = entries_.back();
        entries_.pop_back();
        break;
      }
      if (!body && open_.fetch_sub(1, std::memory_order_acq_rel) == 1) due.swap(buried_);
    }
    for (auto [device, ptr] : due) free_segment(device, ptr);
  }

  [[nodiscard]] CaptureContext* find(CaptureSeq seq) const {
    std::lock_guard lock(mutex_);
    for (const Entry& e : entries_)
      if (e.seq == seq) return e.context;
    return nullptr;
  }

  //! The device of a registered capture sequence, or -1.
  [[nodiscard]] int device_of(CaptureSeq seq) const {
    std::lock_guard lock(mutex_);
    for (const Entry& e : entries_)
      if (e.seq == seq) return e.device;
    return -1;
  }

  //! Frees device memory now, or once no capture is open: cudaFree synchronises the device,
  //! which would invalidate a capture in progress.
  void release_segments(int device, const std::vector<void*>& segments) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (any_open()) {
        for (void* s : segments) buried_.emplace_back(device, s);
        return;
      }
    }
    for (void* s : segments) free_segment(device, s);
  }

  //! Frees what waits for the end of captures, if none is open now (a cudaMalloc retry path).
  void drain() noexcept {
    std::vector<std::pair<int, void*>> due;
    {
      std::lock_guard lock(mutex_);
      if (any_open()) return;
      due.swap(buried_);
    }
    for (auto [device, ptr] : due) free_segment(device, ptr);
  }

 private:
  static void free_segment(int device, void* ptr) noexcept {
    int current = -1;
    (void)cudaGetDevice(&current);
    if (current != device) (void)cudaSetDevice(device);
    (void)cudaFree(ptr);
    if (current != device && current >= 0) (void)cudaSetDevice(current);
    (void)cudaGetLastError();
  }

  // Few captures are open at once: a vector beats a hash map, and allocates nothing per capture.
  struct Entry {
    CaptureSeq seq;
    CaptureContext* context;
    int device;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::atomic<int> open_{0};
  std::vector<std::pair<int, void*>> buried_;
};

}  // namespace tensorplay::detail
