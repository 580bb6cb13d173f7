// tensorplay/detail/capture_retain.hpp: giving an open capture an object to keep.
//
// A tensorplay conditional body is captured as a capture of its own, whose graph is destroyed
// once its nodes moved into the conditional node (conditional_builder.hpp). A user object
// retained on that temporary graph would die with it while the nodes that need it live on, so
// objects for a body go to the graph of the capture that holds the body: the graph that becomes
// the executable.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

namespace tensorplay::detail {

//! The graph that will keep what the capture running on `stream` needs: the capture's own
//! graph, or, for a tensorplay conditional body, the graph of the capture the body belongs to.
//! \throws capture_error when `stream` is not capturing (or the capture was invalidated).
TENSORPLAY_DECL cudaGraph_t keeping_graph(cudaStream_t stream, const tensorplay::source_location& where);

//! Gives `object` (one reference, moved) to the graph that keeps what `stream`'s capture needs
//! (keeping_graph). On failure the reference is released.
TENSORPLAY_DECL void retain_on_capture(cudaStream_t stream, cudaUserObject_t object, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/capture_doctor.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL cudaGraph_t keeping_graph(cudaStream_t stream, const tensorplay::source_location& where) {
  CaptureInfo info;
  TENSORPLAY_CHECK(get_capture_info(stream, info), where);
  if (info.status != cudaStreamCaptureStatusActive)
    throw_capture_failure_on(cudaErrorStreamCaptureInvalidated, "cudaStreamGetCaptureInfo (the capture was invalidated earlier)",
                             stream, where);
  CaptureContext* context = CaptureRegistry::instance().find(info.seq);
  if (context == nullptr || context->origin() == stream) return info.graph;
  CaptureInfo root;
  TENSORPLAY_CHECK(get_capture_info(context->origin(), root), where);
  if (root.status != cudaStreamCaptureStatusActive)
    throw_capture_failure_on(cudaErrorStreamCaptureInvalidated, "cudaStreamGetCaptureInfo (the capture was invalidated earlier)",
                             context->origin(), where);
  return root.graph;
}

TENSORPLAY_DECL void retain_on_capture(cudaStream_t stream, cudaUserObject_t object, const tensorplay::source_location& where) {
  cudaGraph_t graph = nullptr;
  try {
    graph = keeping_graph(stream, where);
  } catch (...) {
    (void)cudaUserObjectRelease(object, 1);
    throw;
  }
  if (const cudaError_t status = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove); status != cudaSuccess) {
    (void)cudaUserObjectRelease(object, 1);
    check(status, "cudaGraphRetainUserObject", where);
  }
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
