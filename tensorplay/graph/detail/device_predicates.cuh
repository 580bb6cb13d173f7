// tensorplay/graph/detail/device_predicates.cuh: the set-handle kernel for __device__ callable
// predicates. Only nvcc translation units include it (conditional_builder.hpp): the kernel is
// instantiated for the caller's callable type, so it cannot be precompiled into the library's
// fatbin. Tensor predicates use the fatbin's kernels instead, in every translation unit.
#pragma once

#include <tensorplay/version.hpp>

#include <cuda_runtime.h>

#include <tensorplay/detail/kernels/handle_value.cuh>

#include <type_traits>

namespace tensorplay::detail {

// A template, so that including this header in several translation units defines it once.
template <class F>
__global__ void set_handle_from_callable(cudaGraphConditionalHandle handle, F f) {
  using Result = std::remove_cv_t<decltype(f())>;
  static_assert(std::is_integral_v<Result>, "tensorplay: a device predicate must return bool, a switch index an integer");
  kernels::wait_for_upstream_kernel();
  cudaGraphSetConditional(handle, kernels::handle_value(f()));
}

}  // namespace tensorplay::detail
