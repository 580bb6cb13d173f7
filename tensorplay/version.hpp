// tensorplay/version.hpp: the library's version and the toolchain it needs.
#pragma once

#include <cuda_runtime_api.h>

#define TENSORPLAY_VERSION_MAJOR 0
#define TENSORPLAY_VERSION_MINOR 2
#define TENSORPLAY_VERSION_PATCH 0

#if __cplusplus < 202002L
#error "tensorplay needs C++20: compile with -std=c++20"
#endif

#if CUDART_VERSION < 12040
#error "tensorplay needs CUDA 12.4 or newer (conditional nodes captured from streams)"
#endif
