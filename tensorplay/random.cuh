// tensorplay/random.cuh: unpack, the kernel's side of RandomState (random.hpp). nvcc only.
//
//     __global__ void noise(float* out, std::size_t n, tp::PhiloxArgs args) {
//       const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
//       const tp::PhiloxSeedOffset so = tp::unpack(args);
//       curandStatePhilox4_32_10_t state;
//       curand_init(so.seed, i, so.offset, &state);   // subsequence i, past what earlier launches took
//       if (i < n) out[i] = curand_uniform(&state);
//     }
#pragma once

#include <tensorplay/error.hpp>
#include <tensorplay/random.hpp>

#include <cuda_runtime_api.h>

namespace tensorplay {

//! The seed and the first offset of the launch that was given `args`. On the device it reads the
//! slot the advance before the launch wrote (the same value in every thread). On the host (for
//! tests and debugging) it copies the slot with cudaMemcpy: call it once the draw's stream has
//! run the advance (synchronise it first).
__host__ __device__ inline PhiloxSeedOffset unpack(const PhiloxArgs& args) {
#if defined(__CUDA_ARCH__)
  const detail::kernels::RandomSlot slot = *args.slot;
  return {slot.seed, slot.base + args.intra};
#else
  detail::kernels::RandomSlot slot{};
  detail::check(cudaMemcpy(&slot, args.slot, sizeof slot, cudaMemcpyDeviceToHost), "cudaMemcpy (tensorplay::unpack on the host)",
                tensorplay::source_location::current());
  return {slot.seed, slot.base + args.intra};
#endif
}

}  // namespace tensorplay
