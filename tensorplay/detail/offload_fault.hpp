// tensorplay/detail/offload_fault.hpp: a test-only seam that makes the Nth CUDA call made by
// Pool::offload / Pool::restore (and by an offloadable pool's segment mapping) fail, to walk every
// error path of a sleep/wake cycle.
//
// Like fault_injection.hpp, compiled in only when TENSORPLAY_FAULT_INJECTION is defined (to 1)
// before any tensorplay header in every translation unit of a test binary; otherwise take() is a
// constant false. The calls are counted as one sequence, whatever their kind, because the claim
// under test is "a failure at any call of the cycle leaves the pool whole".
//
//     tensorplay::detail::offload_fault::arm(3);   // the third call fails
//     pool.offload(stream);                        // throws cuda_error naming that call
//     bool hit = tensorplay::detail::offload_fault::fired();
#pragma once

#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#if defined(TENSORPLAY_FAULT_INJECTION) && TENSORPLAY_FAULT_INJECTION
#include <atomic>
#endif

namespace tensorplay::detail::offload_fault {

#if defined(TENSORPLAY_FAULT_INJECTION) && TENSORPLAY_FAULT_INJECTION

struct State {
  std::atomic<long> countdown{0};  // 0: disarmed
  std::atomic<bool> fired{false};
  std::atomic<long> calls{0};
};

inline State& state() noexcept {
  static State s;
  return s;
}

//! The next `nth` call (1-based) of the sequence fails; the others succeed.
inline void arm(long nth) noexcept {
  state().fired = false;
  state().countdown = nth;
}
inline void disarm() noexcept { state().countdown = 0; }
//! Whether the armed failure happened.
[[nodiscard]] inline bool fired() noexcept { return state().fired; }
//! Calls counted since the last reset (failed ones included).
[[nodiscard]] inline long calls() noexcept { return state().calls; }
inline void reset_counts() noexcept { state().calls = 0; }

//! Counts one call; true when this one must fail.
inline bool take() noexcept {
  State& s = state();
  ++s.calls;
  if (s.countdown.load(std::memory_order_relaxed) <= 0) return false;
  if (--s.countdown != 0) return false;
  s.fired = true;
  return true;
}

#else

constexpr bool take() noexcept { return false; }

#endif

}  // namespace tensorplay::detail::offload_fault
