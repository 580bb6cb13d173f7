// test/host_only/random_kernels.hpp: the kernel of the host-only RandomState test, compiled by nvcc
// in random_kernels.cu and launched from random_host_test.cpp (compiled by g++): the kernel that
// calls unpack needs nvcc, next() does not.
#pragma once

#include <tensorplay/random.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace host_only_random {

//! out[i] = curand_uniform of subsequence i at the launch's offset, on `stream`.
void draw(float* out, std::size_t n, tensorplay::PhiloxArgs args, cudaStream_t stream);

}  // namespace host_only_random
