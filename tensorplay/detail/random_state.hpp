// tensorplay/detail/random_state.hpp: what a RandomState (random.hpp) holds, and its draws.
//
// The counter {seed, next offset} lives in device memory (random_arena.hpp) and only kernels
// change it, each in the order of its stream: an eager draw launches the advance kernel on the
// draw's stream, a captured draw puts an advance node into the graph (random_segment.hpp), and
// set_seed launches the reset kernel. Eager launches and replays therefore take offsets in the
// order they run, and a replay costs no host work. The host keeps only the seed it was given.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/random_segment.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace tensorplay::detail {

class RandomStateImpl {
 public:
  //! A sequence on the current device, at offset 0 of `seed`. Loads the library's kernels now,
  //! so that no capture pays for it (loading synchronises the device).
  RandomStateImpl(std::uint64_t seed, const tensorplay::source_location& where);

  RandomStateImpl(const RandomStateImpl&) = delete;
  RandomStateImpl& operator=(const RandomStateImpl&) = delete;
  //! The counter stays (graphs may still advance it); the ring goes to the spares.
  ~RandomStateImpl();

  [[nodiscard]] int device() const noexcept { return device_; }

  //! `increment` offsets for the next launch on `stream` (of this state's device).
  Draw next(std::uint64_t increment, cudaStream_t stream, const tensorplay::source_location& where);

  [[nodiscard]] std::uint64_t seed() const;

  //! Launches the reset kernel on `stream` (not capturing).
  void set_seed(std::uint64_t seed, cudaStream_t stream, const tensorplay::source_location& where);

  //! The counter's offset, once every eager draw and reseed issued so far has run.
  [[nodiscard]] std::uint64_t offset(const tensorplay::source_location& where) const;

 private:
  Draw eager(std::uint64_t increment, cudaStream_t stream, const tensorplay::source_location& where);

  int device_;
  const KernelLibrary* library_;
  RandomArena* arena_;
  kernels::RandomCounter* counter_;
  std::unique_ptr<EagerRing> ring_;
  std::uint64_t seed_;
  RandomSegments segments_;
  mutable std::mutex mutex_;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/detail/random_arena.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL RandomStateImpl::RandomStateImpl(std::uint64_t seed, const tensorplay::source_location& where) : device_(current_device(where)),
      library_(&KernelLibrary::on(device_, where)),
      arena_(&RandomArena::on(device_)),
      counter_(arena_->take_counter(seed, where)),
      ring_(arena_->take_ring(where)),
      seed_(seed) {}

TENSORPLAY_DECL RandomStateImpl::~RandomStateImpl() {
  arena_->give_back(std::move(ring_));
  arena_->sweep();
}

TENSORPLAY_DECL Draw RandomStateImpl::next(std::uint64_t increment, cudaStream_t stream, const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  arena_->sweep();
  if (!stream_is_capturing(stream, where)) return eager(increment, stream, where);
  CaptureInfo info;
  TENSORPLAY_CHECK(capture_info_with_edges(stream, info), where);
  if (info.status != cudaStreamCaptureStatusActive)
    check(cudaErrorStreamCaptureInvalidated, "RandomState::next (the capture was invalidated earlier)", where);
  return segments_.draw(counter_, *library_, *arena_, device_, stream, info, increment, where);
}

TENSORPLAY_DECL std::uint64_t RandomStateImpl::seed() const {
  std::lock_guard lock(mutex_);
  return seed_;
}

TENSORPLAY_DECL void RandomStateImpl::set_seed(std::uint64_t seed, cudaStream_t stream, const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  if (stream_is_capturing(stream, where))
    throw_usage("RandomState::set_seed: the stream is being captured; reseed outside captures (graphs read the "
                "seed and the offset at every replay, so they follow a reseed made eagerly)");
  DeviceGuard guard(device_, where);
  unsigned long long value = seed;
  void* args[] = {&counter_, &value};
  launch(reinterpret_cast<const void*>(library_->random_reset()), dim3(1), dim3(1), stream, false, args,
         "cudaLaunchKernelEx (tensorplay random reset kernel)", where);
  ring_->issued(stream, where);
  seed_ = seed;
}

TENSORPLAY_DECL std::uint64_t RandomStateImpl::offset(const tensorplay::source_location& where) const {
  std::lock_guard lock(mutex_);
  ring_->wait(where);
  return arena_->read_offset(counter_, where);
}

TENSORPLAY_DECL Draw RandomStateImpl::eager(std::uint64_t increment, cudaStream_t stream, const tensorplay::source_location& where) {
  DeviceGuard guard(device_, where);  // the legacy stream is the current device's
  kernels::RandomSlot* slot = ring_->next(where);
  unsigned long long value = increment;
  void* args[] = {&counter_, &slot, &value};
  launch(reinterpret_cast<const void*>(library_->random_advance()), dim3(1), dim3(1), stream, false, args,
         "cudaLaunchKernelEx (tensorplay random advance kernel)", where);
  ring_->launched(stream, where);
  return {slot, 0};
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
