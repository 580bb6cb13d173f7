// tensorplay/detail/vmm_api.hpp: CUDA's virtual memory management calls (reserve an address range,
// create physical memory, map it there, unmap it, release it), reached through the driver's entry
// points like driver_api.hpp (no libcuda link, no <cuda.h>).
//
// Offloadable pools need them: a captured kernel holds raw pointers, so memory released while a
// pool sleeps must come back at the same addresses, which only a reservation kept apart from its
// physical memory allows. Each call returns a VmmStatus naming the call, and counts as one call
// of offload_fault.hpp's test seam.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/offload_fault.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tensorplay::detail {

// <cuda.h>'s types, member for member (test/offload_test.cu checks the layouts against it).
using VmmHandle = unsigned long long;  // CUmemGenericAllocationHandle
using VmmAddress = unsigned long long;  // CUdeviceptr

struct VmmLocation {  // CUmemLocation
  int type;           // CUmemLocationType
  int id;
};
struct VmmAllocationProp {  // CUmemAllocationProp
  int type;                  // CUmemAllocationType
  int requested_handle_types;  // CUmemAllocationHandleType
  VmmLocation location;
  void* win32_handle_meta_data;
  struct {
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
  } alloc_flags;
};
struct VmmAccessDesc {  // CUmemAccessDesc
  VmmLocation location;
  int flags;  // CUmemAccess_flags
};

inline constexpr int vmm_allocation_pinned = 1;      // CU_MEM_ALLOCATION_TYPE_PINNED
inline constexpr int vmm_location_device = 1;        // CU_MEM_LOCATION_TYPE_DEVICE
inline constexpr int vmm_access_read_write = 3;      // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
inline constexpr int vmm_granularity_minimum = 0;    // CU_MEM_ALLOC_GRANULARITY_MINIMUM

//! The outcome of one call: the status and, on failure, the call's name.
struct VmmStatus {
  cudaError_t status = cudaSuccess;
  const char* call = nullptr;
  [[nodiscard]] bool ok() const noexcept { return status == cudaSuccess; }
};

class VmmApi {
 public:
  //! \throws cuda_error when the driver lacks one of the calls (resolved once per process).
  TENSORPLAY_PROCESS_WIDE static const VmmApi& get(const tensorplay::source_location& where);

  int (*address_reserve)(VmmAddress*, std::size_t, std::size_t, VmmAddress, unsigned long long) = nullptr;
  int (*address_free)(VmmAddress, std::size_t) = nullptr;
  int (*create)(VmmHandle*, std::size_t, const VmmAllocationProp*, unsigned long long) = nullptr;
  int (*release)(VmmHandle) = nullptr;
  int (*map)(VmmAddress, std::size_t, std::size_t, VmmHandle, unsigned long long) = nullptr;
  int (*unmap)(VmmAddress, std::size_t) = nullptr;
  int (*set_access)(VmmAddress, std::size_t, const VmmAccessDesc*, std::size_t) = nullptr;
  int (*granularity)(std::size_t*, const VmmAllocationProp*, int) = nullptr;

 private:
  explicit VmmApi(const tensorplay::source_location& where);
  template <class F>
  static void resolve(const char* symbol, F& out, const tensorplay::source_location& where) {
    resolve_driver<12000>(symbol, out, where);  // one signature since CUDA 10.2
  }
};

//! Runs one driver call of the test seam's sequence: `injected` is what an injected failure
//! reports (what the call returns when it fails for real). CUresult and cudaError_t share the
//! values of the errors these calls return.
template <class Call>
VmmStatus vmm_call(const char* name, cudaError_t injected, Call&& call) noexcept {
  if (offload_fault::take()) return {injected, name};
  const int result = call();
  return {static_cast<cudaError_t>(result), result == 0 ? nullptr : name};
}

//! Runs one runtime call of the test seam's sequence; clears the runtime's last error on failure.
template <class Call>
VmmStatus runtime_call(const char* name, cudaError_t injected, Call&& call) noexcept {
  if (offload_fault::take()) return {injected, name};
  const cudaError_t result = call();
  if (result != cudaSuccess) (void)cudaGetLastError();
  return {result, result == cudaSuccess ? nullptr : name};
}

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL const VmmApi& VmmApi::get(const tensorplay::source_location& where) {
  static const VmmApi api(where);  // a throw leaves it unresolved: the next call retries
  return api;
}

TENSORPLAY_DECL VmmApi::VmmApi(const tensorplay::source_location& where) {
  resolve("cuMemAddressReserve", address_reserve, where);
  resolve("cuMemAddressFree", address_free, where);
  resolve("cuMemCreate", create, where);
  resolve("cuMemRelease", release, where);
  resolve("cuMemMap", map, where);
  resolve("cuMemUnmap", unmap, where);
  resolve("cuMemSetAccess", set_access, where);
  resolve("cuMemGetAllocationGranularity", granularity, where);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
