// test/odr_so.hpp: the C interface of odr_so.cu, built twice as a shared library:
// libodr_so_default.so (default symbol visibility) and libodr_so_hidden.so
// (-fvisibility=hidden). odr_so_test.cu loads both while a Graph of the executable captures.
// Only C types cross the boundary: with hidden visibility the library's tensorplay types are
// not the executable's.
#pragma once

#include <cstddef>

#define ODR_SO_EXPORT __attribute__((visibility("default")))

extern "C" {

//! What odr_so_allocate_in_capture saw and got.
struct OdrSoAllocation {
  int pool_device = -1;  // the PoolId of the tensor's pool, as two integers
  unsigned long long pool_serial = 0;
  void* current_stream = nullptr;  // this thread's current stream, as the library sees it
  int error = 0;                   // 0: allocated; 1: tensorplay::usage_error; 2: another exception
  char message[512] = {};          // the exception's what()
};

//! Allocates a tensorplay::DeviceTensor<float> of `elements` on the current stream. Returns it
//! (give it back with odr_so_release), or null when the allocation threw (`out->error`).
ODR_SO_EXPORT void* odr_so_allocate_in_capture(std::size_t elements, OdrSoAllocation* out);
ODR_SO_EXPORT void odr_so_release(void* tensor);

using OdrSoAllocate = void* (*)(std::size_t, OdrSoAllocation*);
using OdrSoRelease = void (*)(void*);

}  // extern "C"
