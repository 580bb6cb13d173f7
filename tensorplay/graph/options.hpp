// tensorplay/graph/options.hpp: CaptureErrorMode, GraphOptions, CaptureOptions, DotFlags, and
// the result of Graph::update.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

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
[[nodiscard]] TENSORPLAY_DECL CaptureErrorMode capture_error_mode_from_string(std::string_view text);

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
  //! Upload the executable to the device when capture ends (cudaGraphUpload), and when update()
  //! compiles anew, so that the first replay costs what later ones cost. It also makes update()
  //! cheaper before the first replay: CUDA patches an executable that was never uploaded nor
  //! launched about 3x slower (1000 kernels on the H200: 410 against 130 us).
  bool upload = false;
};

// g++ 12 at -O1 and above reports the disengaged std::optional members of a CaptureOptions temporary as
// maybe used uninitialized once IPA modref has seen the callee (GCC bug 80635): false, so off here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
//! Per-capture overrides of a Graph's settings.
//! Every member has a default member initialiser, so that `{.stream = s}` leaves the others out
//! without a -Wmissing-field-initializers warning.
struct CaptureOptions {
  std::optional<Pool> pool = std::nullopt;
  std::optional<CaptureErrorMode> capture_error_mode = std::nullopt;
  //! Default: the current stream, or this thread's side stream when that is the legacy
  //! default stream (which cannot be captured).
  std::optional<StreamRef> stream = std::nullopt;
  //! Upload the executable when this capture ends (GraphOptions::upload for this capture).
  std::optional<bool> upload = std::nullopt;
};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

//! What Graph::update did.
enum class UpdateOutcome {
  Updated,         //!< the executable was patched in place (cudaGraphExecUpdate)
  Reinstantiated,  //!< CUDA refused the update (the topology changed, say): compiled anew
};

//! Why update() did what it did. A user can log why an update fell back:
//!
//!     auto r = graph.update(step);
//!     if (r.outcome == tensorplay::UpdateOutcome::Reinstantiated) log(r.reason, r.error_node);
struct UpdateResult {
  UpdateOutcome outcome = UpdateOutcome::Updated;
  //! cudaGraphExecUpdateSuccess when updated in place; otherwise CUDA's reason.
  cudaGraphExecUpdateResult reason = cudaGraphExecUpdateSuccess;
  //! The type of the node CUDA refused, when it names one.
  std::optional<cudaGraphNodeType> error_node = std::nullopt;
};

//! What debug_dump writes, besides the graph's structure (cudaGraphDebugDotFlags).
enum class DotFlags : unsigned {
  Default = 0,            //!< node types and edges
  Verbose = 1,            //!< every attribute of every node
  KernelParams = 2,       //!< kernel names, grids and parameters
  Handles = 4,            //!< CUDA handles of nodes, graphs and events
  ConditionalParams = 8,  //!< conditional handles, types and body counts
};
[[nodiscard]] constexpr DotFlags operator|(DotFlags a, DotFlags b) noexcept {
  return static_cast<DotFlags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
[[nodiscard]] constexpr bool has_flag(DotFlags set, DotFlags flag) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(flag)) != 0;
}

[[nodiscard]] constexpr std::string_view to_string(cudaGraphNodeType type) noexcept {
  switch (type) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeExtSemaphoreSignal: return "external semaphore signal";
    case cudaGraphNodeTypeExtSemaphoreWait: return "external semaphore wait";
    case cudaGraphNodeTypeMemAlloc: return "memory allocation";
    case cudaGraphNodeTypeMemFree: return "memory free";
    case cudaGraphNodeTypeConditional: return "conditional";
    default: return "unknown";
  }
}

[[nodiscard]] constexpr std::string_view to_string(cudaGraphExecUpdateResult result) noexcept {
  switch (result) {
    case cudaGraphExecUpdateSuccess: return "success";
    case cudaGraphExecUpdateError: return "error";
    case cudaGraphExecUpdateErrorTopologyChanged: return "topology changed";
    case cudaGraphExecUpdateErrorNodeTypeChanged: return "node type changed";
    case cudaGraphExecUpdateErrorFunctionChanged: return "kernel function changed";
    case cudaGraphExecUpdateErrorParametersChanged: return "parameters changed in a way that cannot be updated";
    case cudaGraphExecUpdateErrorNotSupported: return "not supported";
    case cudaGraphExecUpdateErrorUnsupportedFunctionChange: return "unsupported kernel function change";
    case cudaGraphExecUpdateErrorAttributesChanged: return "launch attributes changed";
    default: return "unknown";
  }
}

namespace detail {

constexpr unsigned to_cuda(DotFlags flags) noexcept {
  unsigned out = 0;
  if (has_flag(flags, DotFlags::Verbose)) out |= cudaGraphDebugDotFlagsVerbose;
  if (has_flag(flags, DotFlags::KernelParams)) out |= cudaGraphDebugDotFlagsKernelNodeParams;
  if (has_flag(flags, DotFlags::Handles)) out |= cudaGraphDebugDotFlagsHandles;
  if (has_flag(flags, DotFlags::ConditionalParams)) out |= cudaGraphDebugDotFlagsConditionalNodeParams;
  return out;
}

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

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay {

TENSORPLAY_DECL CaptureErrorMode capture_error_mode_from_string(std::string_view text) {
  if (text == "global") return CaptureErrorMode::Global;
  if (text == "thread_local") return CaptureErrorMode::ThreadLocal;
  if (text == "relaxed") return CaptureErrorMode::Relaxed;
  detail::throw_usage("capture_error_mode_from_string: unknown mode \"" + std::string(text) +
                      "\" (expected \"global\", \"thread_local\" or \"relaxed\")");
}

}  // namespace tensorplay
#endif  // TENSORPLAY_DEFINE_BODIES
