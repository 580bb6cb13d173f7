// tensorplay/detail/fault_injection.hpp: a test-only seam that makes the library's Nth CUDA call
// of one kind fail, to walk every error path of a workload.
//
// Compiled in only when TENSORPLAY_FAULT_INJECTION is defined (to 1) before any tensorplay
// header, in every translation unit of the program (a test binary). Otherwise `take()` is a
// constant `false` and the calls in cuda_api.hpp compile to the plain CUDA calls: the seam costs
// nothing in normal builds.
//
//     tensorplay::detail::fault::arm(tensorplay::detail::fault::Site::Instantiate, 2);
//     // ... the second instantiation fails as CUDA would fail it ...
//     bool hit = tensorplay::detail::fault::fired();
#pragma once

#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#if defined(TENSORPLAY_FAULT_INJECTION) && TENSORPLAY_FAULT_INJECTION
#include <array>
#include <atomic>
#endif

namespace tensorplay::detail::fault {

//! The kinds of CUDA call a test can make fail.
enum class Site : int {
  Allocate,      //!< cudaMalloc of a pool segment
  BeginCapture,  //!< cudaStreamBeginCapture (captures and conditional bodies)
  EndCapture,    //!< cudaStreamEndCapture (the capture ends, the call reports failure)
  Instantiate,   //!< cudaGraphInstantiateWithParams
  Launch,        //!< cudaGraphLaunch and the library's own kernel launches
  SetParams,     //!< cudaGraphExecKernelNodeSetParams / cudaGraphNodeSetEnabled of the copy node
  EventRecord,   //!< cudaEventRecord of the pool's completion events
  Update,        //!< cudaGraphExecUpdate
  Count
};

//! The status an injected failure reports: what CUDA returns when such a call fails for real.
constexpr cudaError_t injected_status(Site site) noexcept {
  switch (site) {
    case Site::Allocate: return cudaErrorMemoryAllocation;
    case Site::BeginCapture: return cudaErrorIllegalState;
    case Site::EndCapture: return cudaErrorStreamCaptureInvalidated;
    case Site::Instantiate: return cudaErrorInvalidValue;
    case Site::Launch: return cudaErrorLaunchOutOfResources;
    case Site::SetParams: return cudaErrorInvalidValue;
    case Site::EventRecord: return cudaErrorInvalidResourceHandle;
    case Site::Update: return cudaErrorGraphExecUpdateFailure;
    case Site::Count: break;
  }
  return cudaErrorUnknown;
}

#if defined(TENSORPLAY_FAULT_INJECTION) && TENSORPLAY_FAULT_INJECTION

struct State {
  std::atomic<int> armed{-1};
  std::atomic<long> countdown{0};
  std::atomic<bool> fired{false};
  std::array<std::atomic<long>, static_cast<int>(Site::Count)> calls{};
};

inline State& state() noexcept {
  static State s;
  return s;
}

//! The next `nth` call (1-based) of kind `site` fails; earlier ones and other kinds succeed.
inline void arm(Site site, long nth) noexcept {
  state().fired = false;
  state().countdown = nth;
  state().armed = static_cast<int>(site);
}
inline void disarm() noexcept { state().armed = -1; }
//! Whether the armed failure happened.
[[nodiscard]] inline bool fired() noexcept { return state().fired; }
//! Calls of kind `site` seen since the last reset (failed ones included).
[[nodiscard]] inline long calls(Site site) noexcept { return state().calls[static_cast<int>(site)]; }
inline void reset_counts() noexcept {
  for (auto& c : state().calls) c = 0;
}

//! Counts a call of kind `site`; true when this one must fail.
inline bool take(Site site) noexcept {
  State& s = state();
  ++s.calls[static_cast<int>(site)];
  if (s.armed.load(std::memory_order_relaxed) != static_cast<int>(site)) return false;
  if (--s.countdown != 0) return false;
  s.armed = -1;
  s.fired = true;
  return true;
}

#else

constexpr bool take(Site) noexcept { return false; }

#endif

}  // namespace tensorplay::detail::fault
