// tensorplay/detail/device.hpp: current-device queries and a guard that switches device only when needed.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/device_guard.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

namespace tensorplay::detail {

using config::max_devices;

TENSORPLAY_DECL int current_device(const tensorplay::source_location& where);

//! The major compute capability of `device` (cached; 0 if it cannot be read).
TENSORPLAY_DECL int compute_capability_major(int device) noexcept;

//! Number of usable devices; 0 when the runtime reports any error (no driver, no GPU).
TENSORPLAY_DECL int device_count() noexcept;

//! The device a stream belongs to. The legacy and per-thread default streams belong to the
//! current device. CUDA refuses cudaStreamGetDevice on a stream that is being captured; the
//! device of a capture tensorplay began is in the capture registry, any other capturing
//! stream is taken to be on the current device.
TENSORPLAY_DECL int stream_device(cudaStream_t stream, const tensorplay::source_location& where);

//! The device of a stream that is not capturing, or -1 when CUDA cannot say (before CUDA 12.8,
//! or for the legacy stream). Never throws.
TENSORPLAY_DECL int stream_device_or_none(cudaStream_t stream) noexcept;

//! Runs `cudaMalloc`-like calls without disturbing a capture that another stream has open:
//! switches this thread to relaxed capture mode for its lifetime (gpu.md: global and
//! thread_local captures refuse cudaMalloc from the capturing thread, global ones from any).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept;
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
  ~RelaxedCaptureMode();

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL int current_device(const tensorplay::source_location& where) {
  int device = 0;
  TENSORPLAY_CHECK(cudaGetDevice(&device), where);
  if (device < 0 || device >= max_devices) [[unlikely]]
    throw_usage("device " + std::to_string(device) + " is beyond the supported " + std::to_string(max_devices));
  return device;
}

TENSORPLAY_DECL int compute_capability_major(int device) noexcept {
  static std::atomic<int> cache[max_devices] = {};
  int major = cache[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cache[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

TENSORPLAY_DECL int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

TENSORPLAY_DECL int stream_device(cudaStream_t stream, const tensorplay::source_location& where) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return current_device(where);
#if CUDART_VERSION >= 12080
  int device = 0;
  const cudaError_t status = cudaStreamGetDevice(stream, &device);
  if (status == cudaSuccess) return device;
  if (status != cudaErrorStreamCaptureUnsupported && status != cudaErrorStreamCaptureImplicit)
    check(status, "cudaStreamGetDevice", where);
  (void)cudaGetLastError();
  if (const CaptureSeq seq = capture_seq_or_zero(stream); seq != 0) {
    if (const int registered = CaptureRegistry::instance().device_of(seq); registered >= 0) return registered;
  }
  return current_device(where);
#else
  return current_device(where);
#endif
}

TENSORPLAY_DECL int stream_device_or_none(cudaStream_t stream) noexcept {
#if CUDART_VERSION >= 12080
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return -1;
  int device = -1;
  if (cudaStreamGetDevice(stream, &device) == cudaSuccess) return device;
  (void)cudaGetLastError();
#else
  (void)stream;
#endif
  return -1;
}

TENSORPLAY_DECL RelaxedCaptureMode::RelaxedCaptureMode() noexcept { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

TENSORPLAY_DECL RelaxedCaptureMode::~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
