// test/host_only/kernels.cu: see kernels.hpp.
#include "kernels.hpp"

namespace host_only {
namespace {

__global__ void affine_kernel(const int* in, int* out, std::size_t n, int a, int b) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i] + b;
}

__global__ void count_down_kernel(int* counter, bool* more, int* sum, int step) {
  *sum += step;
  *counter -= 1;
  *more = *counter > 0;
}

__global__ void count_down_setting_kernel(int* counter, int* sum, int step, cudaGraphConditionalHandle loop) {
  *sum += step;
  *counter -= 1;
  cudaGraphSetConditional(loop, *counter > 0 ? 1u : 0u);
}

}  // namespace

void count_down_setting(int* counter, int* sum, int step, cudaGraphConditionalHandle loop, cudaStream_t stream) {
  count_down_setting_kernel<<<1, 1, 0, stream>>>(counter, sum, step, loop);
}

void affine(const int* in, int* out, std::size_t n, int a, int b, cudaStream_t stream) {
  affine_kernel<<<static_cast<unsigned>(n / 256 + 1), 256, 0, stream>>>(in, out, n, a, b);
}

void count_down(int* counter, bool* more, int* sum, int step, cudaStream_t stream) {
  count_down_kernel<<<1, 1, 0, stream>>>(counter, more, sum, step);
}

}  // namespace host_only
