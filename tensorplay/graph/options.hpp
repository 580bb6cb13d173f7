// tensorplay/graph/options.hpp: CaptureErrorMode, GraphOptions, CaptureOptions.
#pragma once

#include <tensorplay/error.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <string_view>

namespace tensorplay {

//! Which CUDA calls a capture refuses, in this thread and in others (cudaStreamCaptureMode).
//!   Global:      unsafe calls (cudaMalloc, synchronisation, ...) from any thread that is not
//!                in relaxed mode invalidate the capture.
//!   ThreadLocal: only unsafe calls from the capturing thread do.
//!   Relaxed:     none are refused; only a stream synchronisation still breaks the capture.
//! tensorplay's own allocations never break a capture, whatever the mode.
enum class CaptureErrorMode { Global, ThreadLocal, Relaxed };

//! "global" | "thread_local" | "relaxed"; anything else throws usage_error.
[[nodiscard]] inline CaptureErrorMode capture_error_mode_from_string(std::string_view text) {
  if (text == "global") return CaptureErrorMode::Global;
  if (text == "thread_local") return CaptureErrorMode::ThreadLocal;
  if (text == "relaxed") return CaptureErrorMode::Relaxed;
  detail::throw_usage("capture_error_mode_from_string: unknown mode \"" + std::string(text) +
                      "\" (expected \"global\", \"thread_local\" or \"relaxed\")");
}

[[nodiscard]] constexpr std::string_view to_string(CaptureErrorMode mode) noexcept {
  switch (mode) {
    case CaptureErrorMode::Global: return "global";
    case CaptureErrorMode::ThreadLocal: return "thread_local";
    case CaptureErrorMode::Relaxed: return "relaxed";
  }
  return "global";
}

//! Settings a Graph keeps for all its captures.
struct GraphOptions {
  //! Accepted for code written against PyTorch's CUDAGraph: tensorplay always compiles the
  //! executable when capture ends and always keeps the captured graph (for debug_dump).
  bool keep_graph = false;
  //! Empty: each capture goes into a fresh private pool.
  Pool pool = {};
  CaptureErrorMode capture_error_mode = CaptureErrorMode::Global;
};

//! Per-capture overrides of a Graph's settings.
struct CaptureOptions {
  std::optional<Pool> pool;
  std::optional<CaptureErrorMode> capture_error_mode;
  //! Default: the current stream, or this thread's side stream when that is the legacy
  //! default stream (which cannot be captured).
  std::optional<StreamRef> stream;
};

namespace detail {

constexpr cudaStreamCaptureMode to_cuda(CaptureErrorMode mode) noexcept {
  switch (mode) {
    case CaptureErrorMode::Global: return cudaStreamCaptureModeGlobal;
    case CaptureErrorMode::ThreadLocal: return cudaStreamCaptureModeThreadLocal;
    case CaptureErrorMode::Relaxed: return cudaStreamCaptureModeRelaxed;
  }
  return cudaStreamCaptureModeGlobal;
}

}  // namespace detail
}  // namespace tensorplay
