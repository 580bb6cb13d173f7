// tensorplay/detail/offload_image.hpp: the host copy of an offloaded pool: its live blocks, as
// runs of adjacent live bytes, packed into one pinned buffer.
//
// The buffer outlives a restore: the next offload of the pool reuses it when it is large enough.
// Pinning fresh memory runs at a fraction of the copy's speed (the pages are faulted in, zeroed
// and locked), so a loop that sleeps and wakes pays it once, not at every sleep. It goes with
// the pool.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/vmm_api.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Bytes [device, device + bytes) of the pool, kept at host_ + offset while offloaded.
struct HostRun {
  char* device = nullptr;
  std::size_t bytes = 0;
  std::size_t offset = 0;
};

class HostImage {
 public:
  HostImage() = default;
  HostImage(const HostImage&) = delete;
  HostImage& operator=(const HostImage&) = delete;
  ~HostImage();

  //! Makes room for `runs` (keeping the buffer when it is large enough) and takes them as the
  //! image's layout. On failure the image holds no runs.
  VmmStatus plan(std::vector<HostRun> runs) noexcept;

  //! Enqueues the copies device -> host on `stream`.
  [[nodiscard]] VmmStatus copy_out(cudaStream_t stream) const noexcept;

  //! Enqueues the copies host -> device on `stream`.
  [[nodiscard]] VmmStatus copy_in(cudaStream_t stream) const noexcept;

  //! Bytes of live blocks in the image.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  //! Pinned bytes held (kept between sleeps).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  void free_buffer() noexcept;

  char* host_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t bytes_ = 0;
  std::vector<HostRun> runs_;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL HostImage::~HostImage() { free_buffer(); }

TENSORPLAY_DECL VmmStatus HostImage::plan(std::vector<HostRun> runs) noexcept {
  runs_.clear();
  std::size_t bytes = 0;
  for (HostRun& r : runs) {
    r.offset = bytes;
    bytes += r.bytes;
  }
  if (bytes > capacity_) {
    free_buffer();
    RelaxedCaptureMode relaxed;  // a capture on another thread must not be disturbed
    void* host = nullptr;
    VmmStatus status = runtime_call("cudaHostAlloc (Pool::offload host copy)", cudaErrorMemoryAllocation,
                                    [&] { return cudaHostAlloc(&host, bytes, cudaHostAllocDefault); });
    if (!status.ok()) return status;
    host_ = static_cast<char*>(host);
    capacity_ = bytes;
  }
  runs_ = std::move(runs);
  bytes_ = bytes;
  return {};
}

TENSORPLAY_DECL VmmStatus HostImage::copy_out(cudaStream_t stream) const noexcept {
  for (const HostRun& r : runs_) {
    VmmStatus status = runtime_call("cudaMemcpyAsync (Pool::offload, device to host)", cudaErrorLaunchFailure, [&] {
      return cudaMemcpyAsync(host_ + r.offset, r.device, r.bytes, cudaMemcpyDeviceToHost, stream);
    });
    if (!status.ok()) return status;
  }
  return {};
}

TENSORPLAY_DECL VmmStatus HostImage::copy_in(cudaStream_t stream) const noexcept {
  for (const HostRun& r : runs_) {
    VmmStatus status = runtime_call("cudaMemcpyAsync (Pool::restore, host to device)", cudaErrorLaunchFailure, [&] {
      return cudaMemcpyAsync(r.device, host_ + r.offset, r.bytes, cudaMemcpyHostToDevice, stream);
    });
    if (!status.ok()) return status;
  }
  return {};
}

TENSORPLAY_DECL void HostImage::free_buffer() noexcept {
  if (host_ != nullptr) CaptureRegistry::instance().release_host(host_);
  host_ = nullptr;
  capacity_ = 0;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
