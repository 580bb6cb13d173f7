// tensorplay/detail/graph_api.hpp: graph-building runtime calls whose signatures changed in CUDA 13.
//
// CUDA 12.3-12.9 spell the edge-data variants with a _v2/_v3 suffix; CUDA 13 folded them into
// the plain names. tensorplay never passes edge data, so both spellings reduce to one call.
// (Only the CUDA 13 branch is compiled and run in this project's CI and GPU suite.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tensorplay::detail {

struct CaptureInfo {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long seq = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* dependencies = nullptr;
  std::size_t dependency_count = 0;
};

inline cudaError_t get_capture_info(cudaStream_t stream, CaptureInfo& info) noexcept {
#if CUDART_VERSION >= 13000
  return cudaStreamGetCaptureInfo(stream, &info.status, &info.seq, &info.graph, &info.dependencies, nullptr,
                                  &info.dependency_count);
#else
  return cudaStreamGetCaptureInfo_v2(stream, &info.status, &info.seq, &info.graph, &info.dependencies,
                                     &info.dependency_count);
#endif
}

//! Only the capture sequence id (cheaper than the full query, which lists dependencies).
//! `seq` is 0 when the stream is not capturing.
inline cudaError_t get_capture_seq(cudaStream_t stream, unsigned long long& seq) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  seq = 0;
  const cudaError_t result = cudaStreamGetCaptureInfo(stream, &status, &seq);
  if (status == cudaStreamCaptureStatusNone) seq = 0;
  return result;
}

//! The capture sequence id of `stream`; 0 when it is not capturing or CUDA cannot tell (that
//! error is cleared: the caller goes on as for a stream that is not capturing).
inline unsigned long long capture_seq_or_zero(cudaStream_t stream) noexcept {
  unsigned long long seq = 0;
  if (get_capture_seq(stream, seq) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return seq;
}

inline cudaError_t set_capture_dependencies(cudaStream_t stream, cudaGraphNode_t* nodes, std::size_t count) noexcept {
#if CUDART_VERSION >= 13000
  return cudaStreamUpdateCaptureDependencies(stream, nodes, nullptr, count, cudaStreamSetCaptureDependencies);
#else
  return cudaStreamUpdateCaptureDependencies(stream, nodes, count, cudaStreamSetCaptureDependencies);
#endif
}

inline cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
                            std::size_t count, cudaGraphNodeParams* params) noexcept {
#if CUDART_VERSION >= 13000
  return cudaGraphAddNode(node, graph, dependencies, nullptr, count, params);
#else
  return cudaGraphAddNode(node, graph, dependencies, count, params);
#endif
}

inline cudaError_t add_dependencies(cudaGraph_t graph, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
                                    std::size_t count) noexcept {
#if CUDART_VERSION >= 13000
  return cudaGraphAddDependencies(graph, from, to, nullptr, count);
#else
  return cudaGraphAddDependencies(graph, from, to, count);
#endif
}

}  // namespace tensorplay::detail
