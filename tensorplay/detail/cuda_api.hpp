// tensorplay/detail/cuda_api.hpp: the CUDA runtime calls whose signatures changed in CUDA 13, and
// the calls a test can make fail (fault_injection.hpp). Each returns the cudaError_t; callers
// check it (error.hpp) or, in noexcept paths, handle it.
//
// CUDA 12.3-12.9 spell the edge-data variants with a _v2/_v3 suffix; CUDA 13 folded them into
// the plain names. (Only the CUDA 13 branch is compiled and run in this project's CI and GPU suite.)
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tensorplay::detail {

//! Identifies one capture sequence (cudaStreamGetCaptureInfo's id); 0 means "not capturing".
using CaptureSeq = unsigned long long;

struct CaptureInfo {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CaptureSeq seq = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* dependencies = nullptr;
  std::size_t dependency_count = 0;
};

TENSORPLAY_DECL cudaError_t get_capture_info(cudaStream_t stream, CaptureInfo& info) noexcept;

//! Only the capture sequence id (cheaper than the full query, which lists dependencies).
//! `seq` is 0 when the stream is not capturing.
TENSORPLAY_DECL cudaError_t get_capture_seq(cudaStream_t stream, CaptureSeq& seq) noexcept;

//! The capture sequence id of `stream`; 0 when it is not capturing or CUDA cannot tell (that
//! error is cleared: the caller goes on as for a stream that is not capturing).
TENSORPLAY_DECL CaptureSeq capture_seq_or_zero(cudaStream_t stream) noexcept;

//! Whether `stream` is capturing (active or invalidated); false when CUDA cannot tell.
TENSORPLAY_DECL bool is_capturing_or_false(cudaStream_t stream) noexcept;

TENSORPLAY_DECL cudaError_t set_capture_dependencies(cudaStream_t stream, cudaGraphNode_t* nodes, std::size_t count) noexcept;

TENSORPLAY_DECL cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
                            std::size_t count, cudaGraphNodeParams* params) noexcept;

TENSORPLAY_DECL cudaError_t add_dependencies(cudaGraph_t graph, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
                                    const cudaGraphEdgeData* edges, std::size_t count) noexcept;

TENSORPLAY_DECL cudaError_t get_edges(cudaGraph_t graph, cudaGraphNode_t* from, cudaGraphNode_t* to, cudaGraphEdgeData* edges,
                             std::size_t* count) noexcept;

// ---- the calls a test can make fail ---------------------------------------------------------
// Each fails, when fault::take() says so, the way CUDA fails it: nothing happens, except for
// end_capture, whose failure still ends the capture.

TENSORPLAY_DECL cudaError_t malloc_device(void** ptr, std::size_t bytes) noexcept;

TENSORPLAY_DECL cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) noexcept;

TENSORPLAY_DECL cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept;

TENSORPLAY_DECL cudaError_t instantiate(cudaGraphExec_t* exec, cudaGraph_t graph, cudaGraphInstantiateParams* params) noexcept;

TENSORPLAY_DECL cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t stream) noexcept;

TENSORPLAY_DECL cudaError_t launch_kernel(const cudaLaunchConfig_t& config, const void* kernel, void** args) noexcept;

TENSORPLAY_DECL cudaError_t exec_set_kernel_params(cudaGraphExec_t exec, cudaGraphNode_t node,
                                          const cudaKernelNodeParams& params) noexcept;

TENSORPLAY_DECL cudaError_t exec_set_node_enabled(cudaGraphExec_t exec, cudaGraphNode_t node, bool enabled) noexcept;

TENSORPLAY_DECL cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) noexcept;

TENSORPLAY_DECL cudaError_t exec_update(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) noexcept;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/fault_injection.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL cudaError_t get_capture_info(cudaStream_t stream, CaptureInfo& info) noexcept {
#if CUDART_VERSION >= 13000
  return cudaStreamGetCaptureInfo(stream, &info.status, &info.seq, &info.graph, &info.dependencies, nullptr,
                                  &info.dependency_count);
#else
  return cudaStreamGetCaptureInfo_v2(stream, &info.status, &info.seq, &info.graph, &info.dependencies,
                                     &info.dependency_count);
#endif
}

TENSORPLAY_DECL cudaError_t get_capture_seq(cudaStream_t stream, CaptureSeq& seq) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  seq = 0;
  const cudaError_t result = cudaStreamGetCaptureInfo(stream, &status, &seq);
  if (status == cudaStreamCaptureStatusNone) seq = 0;
  return result;
}

TENSORPLAY_DECL CaptureSeq capture_seq_or_zero(cudaStream_t stream) noexcept {
  CaptureSeq seq = 0;
  if (get_capture_seq(stream, seq) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return seq;
}

TENSORPLAY_DECL bool is_capturing_or_false(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

TENSORPLAY_DECL cudaError_t set_capture_dependencies(cudaStream_t stream, cudaGraphNode_t* nodes, std::size_t count) noexcept {
#if CUDART_VERSION >= 13000
  return cudaStreamUpdateCaptureDependencies(stream, nodes, nullptr, count, cudaStreamSetCaptureDependencies);
#else
  return cudaStreamUpdateCaptureDependencies_v2(stream, nodes, nullptr, count, cudaStreamSetCaptureDependencies);
#endif
}

TENSORPLAY_DECL cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    std::size_t count, cudaGraphNodeParams* params) noexcept {
#if CUDART_VERSION >= 13000
  return cudaGraphAddNode(node, graph, dependencies, nullptr, count, params);
#else
  return cudaGraphAddNode_v2(node, graph, dependencies, nullptr, count, params);
#endif
}

TENSORPLAY_DECL cudaError_t add_dependencies(cudaGraph_t graph, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
    const cudaGraphEdgeData* edges, std::size_t count) noexcept {
#if CUDART_VERSION >= 13000
  return cudaGraphAddDependencies(graph, from, to, edges, count);
#else
  return cudaGraphAddDependencies_v2(graph, from, to, edges, count);
#endif
}

TENSORPLAY_DECL cudaError_t get_edges(cudaGraph_t graph, cudaGraphNode_t* from, cudaGraphNode_t* to, cudaGraphEdgeData* edges,
    std::size_t* count) noexcept {
#if CUDART_VERSION >= 13000
  return cudaGraphGetEdges(graph, from, to, edges, count);
#else
  return cudaGraphGetEdges_v2(graph, from, to, edges, count);
#endif
}

TENSORPLAY_DECL cudaError_t malloc_device(void** ptr, std::size_t bytes) noexcept {
  if (fault::take(fault::Site::Allocate)) return fault::injected_status(fault::Site::Allocate);
  return cudaMalloc(ptr, bytes);
}

TENSORPLAY_DECL cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) noexcept {
  if (fault::take(fault::Site::BeginCapture)) return fault::injected_status(fault::Site::BeginCapture);
  return cudaStreamBeginCapture(stream, mode);
}

TENSORPLAY_DECL cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept {
  const cudaError_t status = cudaStreamEndCapture(stream, graph);
  if (fault::take(fault::Site::EndCapture)) {
    if (*graph != nullptr) (void)cudaGraphDestroy(*graph);
    *graph = nullptr;
    return fault::injected_status(fault::Site::EndCapture);
  }
  return status;
}

TENSORPLAY_DECL cudaError_t instantiate(cudaGraphExec_t* exec, cudaGraph_t graph, cudaGraphInstantiateParams* params) noexcept {
  if (fault::take(fault::Site::Instantiate)) {
    params->result_out = cudaGraphInstantiateError;
    params->errNode_out = nullptr;
    return fault::injected_status(fault::Site::Instantiate);
  }
  return cudaGraphInstantiateWithParams(exec, graph, params);
}

TENSORPLAY_DECL cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  if (fault::take(fault::Site::Launch)) return fault::injected_status(fault::Site::Launch);
  return cudaGraphLaunch(exec, stream);
}

TENSORPLAY_DECL cudaError_t launch_kernel(const cudaLaunchConfig_t& config, const void* kernel, void** args) noexcept {
  if (fault::take(fault::Site::Launch)) return fault::injected_status(fault::Site::Launch);
  return cudaLaunchKernelExC(&config, kernel, args);
}

TENSORPLAY_DECL cudaError_t exec_set_kernel_params(cudaGraphExec_t exec, cudaGraphNode_t node,
    const cudaKernelNodeParams& params) noexcept {
  if (fault::take(fault::Site::SetParams)) return fault::injected_status(fault::Site::SetParams);
  return cudaGraphExecKernelNodeSetParams(exec, node, &params);
}

TENSORPLAY_DECL cudaError_t exec_set_node_enabled(cudaGraphExec_t exec, cudaGraphNode_t node, bool enabled) noexcept {
  if (fault::take(fault::Site::SetParams)) return fault::injected_status(fault::Site::SetParams);
  return cudaGraphNodeSetEnabled(exec, node, enabled ? 1u : 0u);
}

TENSORPLAY_DECL cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) noexcept {
  if (fault::take(fault::Site::EventRecord)) return fault::injected_status(fault::Site::EventRecord);
  return cudaEventRecord(event, stream);
}

TENSORPLAY_DECL cudaError_t exec_update(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) noexcept {
  if (fault::take(fault::Site::Update)) {
    info->result = cudaGraphExecUpdateError;
    info->errorNode = nullptr;
    info->errorFromNode = nullptr;
    return fault::injected_status(fault::Site::Update);
  }
  return cudaGraphExecUpdate(exec, graph, info);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
