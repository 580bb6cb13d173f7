// tensorplay/detail/driver_api.hpp: the few driver API calls the runtime API lacks, reached
// through cudaGetDriverEntryPointByVersion (no link against libcuda, no <cuda.h>).
//
// cudaGraphKernelNodeGetParams cannot describe a kernel node whose kernel is a cudaKernel_t (the
// library's own kernels, loaded with cudaLibraryLoadData) or a CUfunction (libraries that launch
// through the driver API): it fails with cudaErrorInvalidDeviceFunction (seen on the H200). The
// driver's cuGraphKernelNodeGetParams returns every kind, and cuGraphAddKernelNode takes it back.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

namespace tensorplay::detail {

//! CUDA_KERNEL_NODE_PARAMS_v2 of <cuda.h>: the driver's ABI, member for member.
struct DriverKernelNodeParams {
  void* func;
  unsigned int grid_x, grid_y, grid_z;
  unsigned int block_x, block_y, block_z;
  unsigned int shared_mem_bytes;
  void** kernel_params;
  void** extra;
  void* kernel;
  void* context;
};

//! The driver's entry point `symbol`, of the version whose parameters the caller's type mirrors.
//! \throws cuda_error when the driver has no such function.
TENSORPLAY_DECL void* driver_entry_point(const char* symbol, int version, const tensorplay::source_location& where);

//! Sets `out` to the driver's entry point `symbol` of `version` (a function pointer type F).
template <int Version, class F>
void resolve_driver(const char* symbol, F& out, const tensorplay::source_location& where) {
  out = reinterpret_cast<F>(driver_entry_point(symbol, Version, where));
}

class DriverApi {
 public:
  using StreamIsCapturing = int (*)(cudaStream_t, cudaStreamCaptureStatus*);
  using GetKernelParams = int (*)(cudaGraphNode_t, DriverKernelNodeParams*);
  using AddKernelNode = int (*)(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, std::size_t,
                                const DriverKernelNodeParams*);
  using SetKernelParams = int (*)(cudaGraphNode_t, const DriverKernelNodeParams*);
  using ExecSetKernelParams = int (*)(cudaGraphExec_t, cudaGraphNode_t, const DriverKernelNodeParams*);

  TENSORPLAY_PROCESS_WIDE static const DriverApi& get(const tensorplay::source_location& where);

  StreamIsCapturing stream_is_capturing = nullptr;
  GetKernelParams kernel_node_get_params = nullptr;
  AddKernelNode add_kernel_node = nullptr;
  // Graph::rebind (graph/detail/rebind.hpp): kernel nodes of every kind, the library's own included.
  SetKernelParams kernel_node_set_params = nullptr;
  ExecSetKernelParams exec_kernel_node_set_params = nullptr;

 private:
  explicit DriverApi(const tensorplay::source_location& where);

  template <class F>
  static void resolve(const char* symbol, F& out, const tensorplay::source_location& where) {
    resolve_driver<12000>(symbol, out, where);  // the _v2 entry points, which DriverKernelNodeParams mirrors
  }
};

//! Whether `stream` is capturing, asked of the driver directly: Graph::replay asks before every
//! launch, and the runtime's wrapper of the same query costs as much again. CUstreamCaptureStatus
//! and cudaStreamCaptureStatus have the same values. False when the driver cannot tell.
TENSORPLAY_DECL bool stream_is_capturing(cudaStream_t stream, const tensorplay::source_location& where);

//! Runs a driver call; throws cuda_error naming it when it fails (CUresult codes share their
//! values with cudaError_t for the errors these calls return).
TENSORPLAY_DECL void check_driver(int result, const char* call, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL void* driver_entry_point(const char* symbol, int version, const tensorplay::source_location& where) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check(cudaGetDriverEntryPointByVersion(symbol, &fn, static_cast<unsigned>(version), cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion", where);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    check(cudaErrorSymbolNotFound, "cudaGetDriverEntryPointByVersion (driver function not found)", where);
  return fn;
}

TENSORPLAY_DECL const DriverApi& DriverApi::get(const tensorplay::source_location& where) {
  static const DriverApi api(where);  // a throw leaves it unresolved: the next call retries
  return api;
}

TENSORPLAY_DECL DriverApi::DriverApi(const tensorplay::source_location& where) {
  resolve("cuStreamIsCapturing", stream_is_capturing, where);
  resolve("cuGraphKernelNodeGetParams", kernel_node_get_params, where);
  resolve("cuGraphAddKernelNode", add_kernel_node, where);
  resolve("cuGraphKernelNodeSetParams", kernel_node_set_params, where);
  resolve("cuGraphExecKernelNodeSetParams", exec_kernel_node_set_params, where);
}

TENSORPLAY_DECL bool stream_is_capturing(cudaStream_t stream, const tensorplay::source_location& where) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // The runtime's legacy and per-thread handles mean the same to the driver.
  if (DriverApi::get(where).stream_is_capturing(stream, &status) != 0) return false;
  return status != cudaStreamCaptureStatusNone;
}

TENSORPLAY_DECL void check_driver(int result, const char* call, const tensorplay::source_location& where) {
  if (result != 0) check(static_cast<cudaError_t>(result), call, where);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
