// test/odr.hpp: what the two translation units odr_a.cu and odr_b.cu define, for odr_test.cu.
//
// Both include <tensorplay/graph.hpp>, so each holds its own copy of the library's inline
// functions, templates and function-local statics. Linked into one binary they must not clash
// (no duplicate symbols: the library's kernels must be templates or have internal linkage) and
// must share one copy of the library's process-wide state: the capture registry, the pools and
// each thread's current stream. A header that gave a TU its own copy (a `static` or
// anonymous-namespace variable, say) would fail these tests.
#pragma once

#include <tensorplay/graph.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace odr {

//! The kernel each translation unit defines for itself: out[i] = its formula of (i, value).
using WriteKernel = void (*)(float* out, std::size_t n, float value);

//! The formulas of odr_a.cu and odr_b.cu (different, so that a mix-up shows).
__host__ __device__ inline float formula_a(std::size_t i, float value) { return value * static_cast<float>(i); }
__host__ __device__ inline float formula_b(std::size_t i, float value) { return value + static_cast<float>(i); }

//! What one capture-and-replay round produced.
struct Replayed {
  std::vector<float> sums;          // the accumulator after the replays
  tensorplay::PoolId scratch_pool;  // pool of the tensor allocated inside the capture
  tensorplay::PoolId graph_pool;
};

// Defined in odr_a.cu / odr_b.cu (by ODR_TRANSLATION_UNIT below). capture_and_replay_*: a
// graph that writes the TU's formula into a tensor allocated inside the capture and adds that
// tensor to an accumulator (zeroed before), replayed `replays` times. allocate_*: a tensor
// allocated on the current stream. write_*: the TU's kernel on the current stream.
// parse_mode_*: capture_error_mode_from_string.
Replayed capture_and_replay_a(std::size_t n, float value, int replays);
Replayed capture_and_replay_b(std::size_t n, float value, int replays);
tensorplay::DeviceTensor<float> allocate_a(std::size_t n);
tensorplay::DeviceTensor<float> allocate_b(std::size_t n);
void write_a(tensorplay::DeviceTensor<float>& out, float value);
void write_b(tensorplay::DeviceTensor<float>& out, float value);
tensorplay::CaptureErrorMode parse_mode_a(std::string_view text);
tensorplay::CaptureErrorMode parse_mode_b(std::string_view text);

// ---- shared by both translation units (inline: one definition in the binary) ------------

template <class T>  // a template, so that both TUs may define it
__global__ void accumulate_kernel(T* sums, const T* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    sums[i] += x[i];
}

inline unsigned blocks_for(std::size_t n) { return static_cast<unsigned>(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024); }

//! Runs `write` over `out` on the current stream.
inline void write_on_current_stream(WriteKernel write, tensorplay::DeviceTensor<float>& out, float value) {
  write<<<blocks_for(out.size()), 256, 0, tensorplay::current_stream()>>>(out.data(), out.size(), value);
  if (cudaGetLastError() != cudaSuccess) throw std::runtime_error("odr: kernel launch failed");
}

inline Replayed capture_and_replay(WriteKernel write, std::size_t n, float value, int replays) {
  tensorplay::Stream stream;
  tensorplay::DeviceTensor<float> sums(n, stream);
  sums.copy_from_host(std::vector<float>(n, 0.0f), stream);
  tensorplay::DeviceTensor<float> scratch;
  tensorplay::Graph graph;
  graph.capture(
      [&] {
        scratch = tensorplay::DeviceTensor<float>(n);  // from the graph's pool
        write_on_current_stream(write, scratch, value);
        accumulate_kernel<<<blocks_for(n), 256, 0, tensorplay::current_stream()>>>(sums.data(), scratch.data(), n);
      },
      {.stream = stream});
  for (int r = 0; r < replays; ++r) graph.replay(stream);
  return {sums.to_host(stream), scratch.pool().id(), graph.pool_id()};
}

}  // namespace odr

//! The whole of odr_a.cu (unit a) and odr_b.cu (unit b): a kernel of the unit's own, with
//! internal linkage and the same name in both, and the unit's functions declared above.
#define ODR_TRANSLATION_UNIT(unit)                                                                          \
  namespace {                                                                                               \
  __global__ void write_kernel(float* out, std::size_t n, float value) {                                    \
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;                         \
         i += std::size_t{gridDim.x} * blockDim.x)                                                          \
      out[i] = odr::formula_##unit(i, value);                                                               \
  }                                                                                                         \
  }                                                                                                         \
  namespace odr {                                                                                           \
  Replayed capture_and_replay_##unit(std::size_t n, float value, int replays) {                             \
    return capture_and_replay(&write_kernel, n, value, replays);                                            \
  }                                                                                                         \
  tensorplay::DeviceTensor<float> allocate_##unit(std::size_t n) { return tensorplay::DeviceTensor<float>(n); } \
  void write_##unit(tensorplay::DeviceTensor<float>& out, float value) {                                    \
    write_on_current_stream(&write_kernel, out, value);                                                     \
  }                                                                                                         \
  tensorplay::CaptureErrorMode parse_mode_##unit(std::string_view text) {                                   \
    return tensorplay::capture_error_mode_from_string(text);                                                \
  }                                                                                                         \
  }
