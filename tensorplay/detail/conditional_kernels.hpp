// tensorplay/detail/conditional_kernels.hpp: one-thread kernels that set a conditional handle.
//
// A conditional node reads its handle when it starts; these kernels, captured just before the
// node (and at the end of a while body), copy the user's predicate or index into the handle.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <type_traits>

namespace tensorplay::detail {

//! The handle value for a predicate or an index. A negative index, or one past what the
//! handle can hold, selects no body: a switch node runs nothing for an out-of-range value.
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

//! Waits for the kernel this one depends on when both were captured with a programmatic
//! edge (the launch overlaps the previous kernel's end); a no-op otherwise.
__device__ __forceinline__ void wait_for_upstream_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Kernels are templates so that including this header in several translation units defines
// them once (weak symbols), as CUB does.
template <class V>
__global__ void set_handle_from_value(cudaGraphConditionalHandle handle, const V* value) {
  wait_for_upstream_kernel();
  cudaGraphSetConditional(handle, handle_value(*value));
}

template <class F>
__global__ void set_handle_from_callable(cudaGraphConditionalHandle handle, F f) {
  using Result = std::remove_cv_t<decltype(f())>;
  static_assert(std::is_integral_v<Result>, "a device predicate must return bool, a switch index an integer");
  wait_for_upstream_kernel();
  cudaGraphSetConditional(handle, handle_value(f()));
}

}  // namespace tensorplay::detail
