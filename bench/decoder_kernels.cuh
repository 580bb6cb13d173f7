// bench/decoder_kernels.cuh: bench/memory's decoder-like step, its shape and its element-wise
// kernels; also used by tools/probes/exec_memory_probe.cu, which measures the executables of the
// same graphs in raw CUDA.
#pragma once

#include <algorithm>
#include <cstddef>

namespace decoder {

//! The batch sizes of the ladder, the model's width, its feed-forward width and its layers.
inline constexpr std::size_t ladder[] = {1,   2,   4,   8,   12,  16,  24,  32,  40,  48,  56,  64,  80,  96,  112, 128,
                                         144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512};
inline constexpr int hidden = 4096;
inline constexpr int ffn = 4 * hidden;
inline constexpr int layers = 8;

__global__ void affine(const float* in, float* out, std::size_t n, float a, float b) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i] + b;
}
__global__ void gated(const float* up, const float* gate, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = up[i] * gate[i] / (1.0f + __expf(-gate[i]));
}
__global__ void add_into(float* h, const float* t, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    h[i] += t[i];
}

//! Blocks of 256 threads for n elements, at most 2048 (the kernels loop over the rest).
inline unsigned blocks(std::size_t n) { return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 2048)); }

}  // namespace decoder
