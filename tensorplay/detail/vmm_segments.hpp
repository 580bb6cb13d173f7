// tensorplay/detail/vmm_segments.hpp: the segments of an offloadable pool: each one an address
// range reserved for the pool's lifetime, backed by physical memory that can be released and
// created again at the same addresses (CUDA virtual memory management, vmm_api.hpp).
//
// A segment's state is three facts that only ever change one call at a time: it has physical
// memory (a handle), that memory is mapped at the range, and the range is accessible. back() and
// evict() move it up or down from wherever it is, so a sleep or wake that failed half way can
// simply be called again.
//
// Unmapping synchronises like cudaFree (cuda.h: "\note_sync"), so, as for cudaFree (see
// CaptureRegistry::release_segments), segments whose pool dies while a capture is open are
// released once no capture is open: at the next offloadable pool made, offload, restore or pool
// destruction outside captures.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/vmm_api.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

struct VmmSegment {
  VmmAddress base = 0;
  std::size_t bytes = 0;   // reserved, and mapped when backed
  VmmHandle handle = 0;    // 0: no physical memory
  bool mapped = false;     // the handle is mapped at [base, base + bytes)
  bool accessible = false; // access granted since the last map
};

//! Releases a segment entirely, ignoring errors (destruction paths): unmaps, releases its
//! physical memory, frees the reservation.
TENSORPLAY_DECL void release_segment_now(const VmmApi& api, const VmmSegment& s) noexcept;

//! Segments whose release waits for the end of every open capture (see the header comment).
class VmmGraveyard {
 public:
  TENSORPLAY_PROCESS_WIDE static VmmGraveyard& instance();
  void bury(const VmmApi& api, VmmSegment s) noexcept;
  //! Releases what waits, if no capture is open now.
  void drain() noexcept;

 private:
  std::mutex mutex_;
  const VmmApi* api_ = nullptr;
  std::vector<VmmSegment> buried_;
};

//! The segments of one offloadable pool, on one device. Not thread-safe: the pool's mutex guards it.
class VmmSegments {
 public:
  //! \throws cuda_error when the driver lacks virtual memory management or the device refuses it.
  VmmSegments(int device, const tensorplay::source_location& where);
  VmmSegments(const VmmSegments&) = delete;
  VmmSegments& operator=(const VmmSegments&) = delete;
  ~VmmSegments();

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }

  //! A new segment of at least `bytes`, backed and accessible: the backend's allocate for an
  //! offloadable pool. Runs on the pool's device, possibly inside a capture (relaxed mode, like
  //! cudaMalloc in cuda_backend). On failure nothing is left reserved.
  VmmStatus allocate(void** ptr, std::size_t bytes) noexcept;

  //! The segments starting at `bases` go entirely (the backend's release).
  void release(const std::vector<void*>& bases) noexcept;

  //! Gives up the segment's physical memory; the address range stays reserved.
  VmmStatus evict(VmmSegment& s) noexcept;

  //! Backs the segment's address range with physical memory again, read-write on every device
  //! that may access it. Its contents are undefined until copied in.
  VmmStatus back(VmmSegment& s) noexcept;

  //! evict() for undoing a failed restore: not a call of the test seam's sequence, errors
  //! ignored (the segment then stays backed, and the next restore skips it).
  void drop(VmmSegment& s) noexcept;

  [[nodiscard]] std::vector<VmmSegment>& segments() noexcept { return segments_; }

  //! Device memory the segments hold now.
  [[nodiscard]] std::size_t backed_bytes() const noexcept;

 private:
  void retire(const VmmSegment& s) noexcept;
  void release_all() noexcept;

  const VmmApi* api_;
  int device_;
  std::size_t granularity_ = 0;
  VmmAllocationProp prop_{};
  std::vector<VmmAccessDesc> access_;
  std::vector<VmmSegment> segments_;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void release_segment_now(const VmmApi& api, const VmmSegment& s) noexcept {
  if (s.mapped) (void)api.unmap(s.base, s.bytes);
  if (s.handle != 0) (void)api.release(s.handle);
  (void)api.address_free(s.base, s.bytes);
}

TENSORPLAY_DECL VmmGraveyard& VmmGraveyard::instance() {
  static auto* graveyard = new VmmGraveyard;  // leaked on purpose, like the capture registry
  return *graveyard;
}

TENSORPLAY_DECL void VmmGraveyard::bury(const VmmApi& api, VmmSegment s) noexcept {
  std::lock_guard lock(mutex_);
  api_ = &api;
  try {
    buried_.push_back(s);
  } catch (...) {
    release_segment_now(api, s);  // out of host memory: better now than never
  }
}

TENSORPLAY_DECL void VmmGraveyard::drain() noexcept {
  std::vector<VmmSegment> due;
  const VmmApi* api = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (buried_.empty() || CaptureRegistry::instance().any_open()) return;
    due.swap(buried_);
    api = api_;
  }
  for (const VmmSegment& s : due) release_segment_now(*api, s);
}

TENSORPLAY_DECL VmmSegments::VmmSegments(int device, const tensorplay::source_location& where) : api_(&VmmApi::get(where)), device_(device) {
  prop_.type = vmm_allocation_pinned;
  prop_.location = {vmm_location_device, device};
  check_driver(api_->granularity(&granularity_, &prop_, vmm_granularity_minimum),
               "cuMemGetAllocationGranularity (offloadable pool)", where);
  if (granularity_ == 0) granularity_ = config::pool_small_segment;
  // Access for the pool's device, and for every device that could reach cudaMalloc'd memory
  // of it through peer access: VMM mappings are accessible only where access was granted.
  access_.push_back({{vmm_location_device, device}, vmm_access_read_write});
  const int count = device_count();
  for (int peer = 0; peer < count; ++peer) {
    int can = 0;
    if (peer == device) continue;
    if (cudaDeviceCanAccessPeer(&can, peer, device) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (can != 0) access_.push_back({{vmm_location_device, peer}, vmm_access_read_write});
  }
  VmmGraveyard::instance().drain();
}

TENSORPLAY_DECL VmmSegments::~VmmSegments() { release_all(); }

TENSORPLAY_DECL VmmStatus VmmSegments::allocate(void** ptr, std::size_t bytes) noexcept {
  RelaxedCaptureMode relaxed;
  VmmSegment s;
  s.bytes = (bytes + granularity_ - 1) / granularity_ * granularity_;
  VmmStatus status = vmm_call("cuMemAddressReserve (offloadable pool segment)", cudaErrorMemoryAllocation,
                              [&] { return api_->address_reserve(&s.base, s.bytes, granularity_, 0, 0); });
  if (!status.ok()) return status;
  status = back(s);
  if (!status.ok()) {
    release_segment_now(*api_, s);
    return status;
  }
  try {
    segments_.push_back(s);
  } catch (...) {
    release_segment_now(*api_, s);
    return {cudaErrorMemoryAllocation, "std::vector::push_back (offloadable pool segment)"};
  }
  *ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(s.base));
  return {};
}

TENSORPLAY_DECL void VmmSegments::release(const std::vector<void*>& bases) noexcept {
  for (void* p : bases) {
    const auto base = static_cast<VmmAddress>(reinterpret_cast<std::uintptr_t>(p));
    auto it = segments_.begin();
    while (it != segments_.end() && it->base != base) ++it;
    if (it == segments_.end()) continue;
    retire(*it);
    segments_.erase(it);
  }
}

TENSORPLAY_DECL VmmStatus VmmSegments::evict(VmmSegment& s) noexcept {
  if (s.mapped) {
    VmmStatus status = vmm_call("cuMemUnmap (Pool::offload)", cudaErrorInvalidValue, [&] { return api_->unmap(s.base, s.bytes); });
    if (!status.ok()) return status;
    s.mapped = false;
    s.accessible = false;
  }
  if (s.handle != 0) {
    VmmStatus status = vmm_call("cuMemRelease (Pool::offload)", cudaErrorInvalidValue, [&] { return api_->release(s.handle); });
    if (!status.ok()) return status;
    s.handle = 0;
  }
  return {};
}

TENSORPLAY_DECL VmmStatus VmmSegments::back(VmmSegment& s) noexcept {
  if (s.handle == 0) {
    VmmStatus status = vmm_call("cuMemCreate (offloadable pool segment)", cudaErrorMemoryAllocation,
                                [&] { return api_->create(&s.handle, s.bytes, &prop_, 0); });
    if (!status.ok()) {
      s.handle = 0;
      return status;
    }
  }
  if (!s.mapped) {
    VmmStatus status = vmm_call("cuMemMap (offloadable pool segment)", cudaErrorMemoryAllocation,
                                [&] { return api_->map(s.base, s.bytes, 0, s.handle, 0); });
    if (!status.ok()) return status;
    s.mapped = true;
  }
  if (!s.accessible) {
    VmmStatus status = vmm_call("cuMemSetAccess (offloadable pool segment)", cudaErrorInvalidValue,
                                [&] { return api_->set_access(s.base, s.bytes, access_.data(), access_.size()); });
    if (!status.ok()) return status;
    s.accessible = true;
  }
  return {};
}

TENSORPLAY_DECL void VmmSegments::drop(VmmSegment& s) noexcept {
  if (s.mapped && api_->unmap(s.base, s.bytes) == 0) {
    s.mapped = false;
    s.accessible = false;
  }
  if (!s.mapped && s.handle != 0 && api_->release(s.handle) == 0) s.handle = 0;
}

TENSORPLAY_DECL std::size_t VmmSegments::backed_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const VmmSegment& s : segments_)
    if (s.handle != 0) bytes += s.bytes;
  return bytes;
}

TENSORPLAY_DECL void VmmSegments::retire(const VmmSegment& s) noexcept {
  if (CaptureRegistry::instance().any_open()) {
    VmmGraveyard::instance().bury(*api_, s);
    return;
  }
  DeviceGuard on_device(device_, DeviceGuard::quiet);
  release_segment_now(*api_, s);
}

TENSORPLAY_DECL void VmmSegments::release_all() noexcept {
  for (const VmmSegment& s : segments_) retire(s);
  segments_.clear();
  VmmGraveyard::instance().drain();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
