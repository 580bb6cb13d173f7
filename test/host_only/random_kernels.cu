// test/host_only/random_kernels.cu: see random_kernels.hpp.
#include "random_kernels.hpp"

#include <tensorplay/random.cuh>

#include <curand_kernel.h>

namespace host_only_random {
namespace {

__global__ void draw_kernel(float* out, std::size_t n, tensorplay::PhiloxArgs args) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const tensorplay::PhiloxSeedOffset so = tensorplay::unpack(args);
  curandStatePhilox4_32_10_t state;
  curand_init(so.seed, i, so.offset, &state);
  out[i] = curand_uniform(&state);
}

}  // namespace

void draw(float* out, std::size_t n, tensorplay::PhiloxArgs args, cudaStream_t stream) {
  draw_kernel<<<static_cast<unsigned>(n / 256 + 1), 256, 0, stream>>>(out, n, args);
}

}  // namespace host_only_random
