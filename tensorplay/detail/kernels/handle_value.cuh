// tensorplay/detail/kernels/handle_value.cuh: the value a set-handle kernel writes into a
// conditional handle. Device code: included by library_kernels.cu (the fatbin) and by
// graph/detail/device_predicates.cuh (nvcc translation units).
#pragma once

#include <climits>
#include <type_traits>

namespace tensorplay::detail::kernels {

//! The handle value for a predicate or an index. A negative index, or one past what the handle
//! can hold, selects no body: a switch node runs nothing for an out-of-range value.
template <class V>
__device__ __forceinline__ unsigned int handle_value(V value) {
  if constexpr (std::is_same_v<V, bool>) {
    return value ? 1u : 0u;
  } else {
    constexpr unsigned long long none = UINT_MAX;
    if constexpr (std::is_signed_v<V>) {
      if (value < 0) return static_cast<unsigned int>(none);
    }
    const auto wide = static_cast<unsigned long long>(value);
    return static_cast<unsigned int>(wide < none ? wide : none);
  }
}

//! Waits for the kernel this one depends on when both were captured with a programmatic edge
//! (the launch overlaps the previous kernel's end); a no-op otherwise.
__device__ __forceinline__ void wait_for_upstream_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

}  // namespace tensorplay::detail::kernels
