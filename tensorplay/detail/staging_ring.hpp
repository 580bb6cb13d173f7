// tensorplay/detail/staging_ring.hpp: where stage_and_launch puts each call's sources for the copy
// node to read, so that a call changes no kernel parameter.
//
// The ring is mapped host memory: config::staging_ring_slots slots of up to copy_table_max
// source pointers, each tagged with the call's sequence number. The host writes slot s % slots
// for call s before launching; the graph's fetch node, whose launches run one after another,
// reads the slot named by a counter in device memory (RingDeviceState), copies the sources next
// to it for the copy node, then advances the counter and publishes it in mapped host memory
// (RingStatus::consumed), so that the host knows which slots it may write again. A ring that is
// full (the GPU is `slots` calls behind) says so; stage_and_launch then copies with a launch of
// its own instead of waiting.
//
// A ring outlives its Graph while launches that read it may still run: the copy kernel publishes
// each call as done (RingStatus::done), and a ring whose Graph is gone waits in the graveyard
// until every call launched with it is done; then the next Graph that stages may reuse it. A user object of the graph would do the same, but
// an executable that holds one costs every launch about 2 us more of host time (measured on the
// H200: 3.98 against 2.02 us per replay), replays without staging included.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

class StagingRing {
 public:
  //! Allocates the ring (pinned host memory) and its device state (device memory of `device`),
  //! and zeroes the state on `stream`, in order before any launch there.
  StagingRing(int device, cudaStream_t stream, const tensorplay::source_location& where);

  //! Empties the ring for a new Graph: no slot named, no call taken. The device state is zeroed
  //! on `stream`, in order before any launch there. Only for a ring that nothing reads.
  void restart(cudaStream_t stream, const tensorplay::source_location& where);

  [[nodiscard]] int device() const noexcept { return device_; }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing();

  static constexpr int slots = config::staging_ring_slots;

  //! The ring, the device state and the status as the kernels see them (device addresses).
  [[nodiscard]] const kernels::RingSlot* device_ring() const noexcept;
  [[nodiscard]] kernels::RingDeviceState* device_state() const noexcept { return state_; }
  [[nodiscard]] kernels::RingStatus* device_status() const noexcept;

  //! Whether call `sequence` may write its slot: the fetch node has taken the call that used it before.
  [[nodiscard]] bool has_room(unsigned long long sequence) const noexcept;

  //! Whether every call before `sequence` is done: nothing reads the ring any more.
  [[nodiscard]] bool idle(unsigned long long sequence) const noexcept;

  //! Writes call `sequence`'s `count` sources, source_at(i) for each i, into its slot. Call
  //! has_room first.
  template <class SourceAt>
  void write(unsigned long long sequence, int count, SourceAt source_at) noexcept {
    kernels::RingSlot& s = slot(static_cast<int>(sequence % slots));
    for (int i = 0; i < count; ++i) s.sources[i] = source_at(i);
    std::atomic_ref<unsigned long long>(s.sequence).store(sequence, std::memory_order_release);
  }

 private:
  static constexpr std::size_t status_offset() noexcept { return sizeof(kernels::RingSlot) * slots; }
  static constexpr std::size_t bytes() noexcept { return status_offset() + 64; }
  kernels::RingSlot& slot(int s) noexcept;
  kernels::RingStatus& status() const noexcept;

  // cudaFree and cudaFreeHost synchronise: while a capture is open anywhere, they wait for its end.
  void release() noexcept;

  int device_;
  unsigned char* host_ = nullptr;
  unsigned char* mapped_ = nullptr;
  kernels::RingDeviceState* state_ = nullptr;
};

//! Rings whose Graph is gone. A ring retired while launches that read it may still run waits
//! here until they are done; a ring nothing reads is kept as a spare, and the next Graph that
//! stages on its device takes it. Rings are never freed while the process runs: freeing pinned
//! and device memory synchronises the device, and a Graph must not wait for replays still running
//! when it dies. At exit the rings go back to CUDA (an atexit handler, registered after the
//! runtime's own, so that it runs first).
class RingGraveyard {
 public:
  TENSORPLAY_PROCESS_WIDE static RingGraveyard& instance();

  //! A ring for a Graph staging on `device`: a spare (emptied on `stream`) or a new one.
  std::unique_ptr<StagingRing> take(int device, cudaStream_t stream, const tensorplay::source_location& where);

  //! Takes `ring`, after `sequence` calls were launched with it.
  void retire(std::unique_ptr<StagingRing> ring, unsigned long long sequence) noexcept;

  //! Moves the retired rings whose calls are done to the spares.
  void sweep() noexcept;

  //! Retired rings still waiting for their calls, and spares.
  [[nodiscard]] std::size_t waiting();
  [[nodiscard]] std::size_t spares();

 private:
  struct Grave {
    std::unique_ptr<StagingRing> ring;
    unsigned long long sequence;
  };

  void sweep_locked() noexcept;

  // Frees the spares and the rings whose calls are done; the others are left to the driver.
  void release_at_exit() noexcept;

  std::mutex mutex_;
  std::vector<Grave> graves_;
  std::vector<std::unique_ptr<StagingRing>> spares_;
  bool exit_handler_ = false;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL StagingRing::StagingRing(int device, cudaStream_t stream, const tensorplay::source_location& where) : device_(device) {
  DeviceGuard guard(device, where);
  RelaxedCaptureMode relaxed;  // a global-mode capture on another thread must not be disturbed
  void* host = nullptr;
  TENSORPLAY_CHECK(cudaHostAlloc(&host, bytes(), cudaHostAllocMapped | cudaHostAllocPortable), where);
  host_ = static_cast<unsigned char*>(host);
  try {
    void* mapped = nullptr;
    TENSORPLAY_CHECK(cudaHostGetDevicePointer(&mapped, host, 0), where);
    mapped_ = static_cast<unsigned char*>(mapped);
    void* state = nullptr;
    TENSORPLAY_CHECK(cudaMalloc(&state, sizeof(kernels::RingDeviceState)), where);
    state_ = static_cast<kernels::RingDeviceState*>(state);
    restart(stream, where);
  } catch (...) {
    release();
    throw;
  }
}

TENSORPLAY_DECL void StagingRing::restart(cudaStream_t stream, const tensorplay::source_location& where) {
  std::memset(host_, 0, bytes());
  for (int s = 0; s < slots; ++s) slot(s).sequence = ~0ull;  // no call names a slot yet
  TENSORPLAY_CHECK(cudaMemsetAsync(state_, 0, sizeof(kernels::RingDeviceState), stream), where);
}

TENSORPLAY_DECL StagingRing::~StagingRing() { release(); }

TENSORPLAY_DECL const kernels::RingSlot* StagingRing::device_ring() const noexcept {
  return reinterpret_cast<const kernels::RingSlot*>(mapped_);
}

TENSORPLAY_DECL kernels::RingStatus* StagingRing::device_status() const noexcept {
  return reinterpret_cast<kernels::RingStatus*>(mapped_ + status_offset());
}

TENSORPLAY_DECL bool StagingRing::has_room(unsigned long long sequence) const noexcept {
  const unsigned long long consumed =
      std::atomic_ref<unsigned long long>(status().consumed).load(std::memory_order_acquire);
  return sequence - consumed < static_cast<unsigned long long>(slots);
}

TENSORPLAY_DECL bool StagingRing::idle(unsigned long long sequence) const noexcept {
  return std::atomic_ref<unsigned long long>(status().done).load(std::memory_order_acquire) == sequence;
}

TENSORPLAY_DECL kernels::RingSlot& StagingRing::slot(int s) noexcept { return reinterpret_cast<kernels::RingSlot*>(host_)[s]; }

TENSORPLAY_DECL kernels::RingStatus& StagingRing::status() const noexcept { return *reinterpret_cast<kernels::RingStatus*>(host_ + status_offset()); }

TENSORPLAY_DECL void StagingRing::release() noexcept {
  if (state_ != nullptr) CaptureRegistry::instance().release_segments(device_, {static_cast<void*>(state_)});
  if (host_ != nullptr) CaptureRegistry::instance().release_host(host_);
  state_ = nullptr;
  host_ = nullptr;
}

TENSORPLAY_DECL RingGraveyard& RingGraveyard::instance() {
  static auto* graveyard = new RingGraveyard;  // leaked on purpose: Graphs may die after main returns
  return *graveyard;
}

TENSORPLAY_DECL std::unique_ptr<StagingRing> RingGraveyard::take(int device, cudaStream_t stream, const tensorplay::source_location& where) {
  std::unique_ptr<StagingRing> ring;
  {
    std::lock_guard lock(mutex_);
    sweep_locked();
    if (!exit_handler_) exit_handler_ = std::atexit([] { RingGraveyard::instance().release_at_exit(); }) == 0;
    for (std::size_t i = 0; i < spares_.size(); ++i) {
      if (spares_[i]->device() != device) continue;
      ring = std::move(spares_[i]);
      spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  if (!ring) return std::make_unique<StagingRing>(device, stream, where);
  try {
    ring->restart(stream, where);
  } catch (...) {
    retire(std::move(ring), 0);  // back to the spares: nothing reads it
    throw;
  }
  return ring;
}

TENSORPLAY_DECL void RingGraveyard::retire(std::unique_ptr<StagingRing> ring, unsigned long long sequence) noexcept {
  std::lock_guard lock(mutex_);
  sweep_locked();
  try {
    if (ring->idle(sequence)) spares_.push_back(std::move(ring));
    else graves_.push_back({std::move(ring), sequence});
  } catch (...) {
    (void)ring.release();  // no memory to remember it: leaked rather than freed under a launch
  }
}

TENSORPLAY_DECL void RingGraveyard::sweep() noexcept {
  std::lock_guard lock(mutex_);
  sweep_locked();
}

TENSORPLAY_DECL std::size_t RingGraveyard::waiting() {
  std::lock_guard lock(mutex_);
  return graves_.size();
}

TENSORPLAY_DECL std::size_t RingGraveyard::spares() {
  std::lock_guard lock(mutex_);
  return spares_.size();
}

TENSORPLAY_DECL void RingGraveyard::sweep_locked() noexcept {
  for (std::size_t i = 0; i < graves_.size();) {
    if (!graves_[i].ring->idle(graves_[i].sequence)) {
      ++i;
      continue;
    }
    try {
      spares_.push_back(std::move(graves_[i].ring));
    } catch (...) {
      (void)graves_[i].ring.release();
    }
    graves_[i] = std::move(graves_.back());
    graves_.pop_back();
  }
}

TENSORPLAY_DECL void RingGraveyard::release_at_exit() noexcept {
  std::lock_guard lock(mutex_);
  sweep_locked();
  spares_.clear();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
