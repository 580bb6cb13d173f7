// test/host_only/kernels.hpp: kernels of the host-only test, compiled by nvcc in kernels.cu and
// called from host_only_test.cpp (compiled by g++ / clang++), as a real engine keeps its kernels
// in .cu files and its step loop in .cpp files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace host_only {

//! out[i] = a * in[i] + b, on `stream` (captured when the stream captures).
void affine(const int* in, int* out, std::size_t n, int a, int b, cudaStream_t stream);
//! *counter -= 1; *more = *counter > 0; *sum += step.
void count_down(int* counter, bool* more, int* sum, int step, cudaStream_t stream);
//! *counter -= 1; *sum += step; sets `loop` (a conditional handle made in a .cpp file) to
//! *counter > 0, as kernels written for raw CUDA graphs do.
void count_down_setting(int* counter, int* sum, int step, cudaGraphConditionalHandle loop, cudaStream_t stream);

}  // namespace host_only
