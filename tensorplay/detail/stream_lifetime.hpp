// tensorplay/detail/stream_lifetime.hpp: what happens before a stream the library knows is destroyed.
//
// A tensorplay::Stream (or one of the library's own side and body streams) may die while things
// still refer to it: a Graph capturing on it, tensors whose last use ran on it. Destroying the
// handle first and touching it later crashes the driver. So, before cudaStreamDestroy:
//   1. every tensorplay capture whose origin is this stream is abandoned (no stream is left
//      capturing, the Graph reports usage_error at capture_end);
//   2. every pool replaces its references to the stream by an event recorded on it now.
// Raw cudaStream_t handles the library did not create cannot be tracked: they must outlive the
// captures begun on them and the tensors allocated on them (docs/design.md says so).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/handles.hpp>

#include <cuda_runtime_api.h>

namespace tensorplay::detail {

//! Settles everything that refers to `stream`, then destroys it. Never throws.
TENSORPLAY_DECL void destroy_stream(cudaStream_t stream) noexcept;

TENSORPLAY_DECL cudaError_t destroy_owned_stream(cudaStream_t stream) noexcept;

//! Owns a stream the library created for itself (side streams, conditional-body streams).
using OwnedStream = UniqueHandle<cudaStream_t, &destroy_owned_stream>;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/pool_directory.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void destroy_stream(cudaStream_t stream) noexcept {
  if (stream == nullptr) return;
  CaptureRegistry::instance().abandon_captures_on(stream);
  PoolDirectory::instance().retire_stream(stream);
  (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
}

TENSORPLAY_DECL cudaError_t destroy_owned_stream(cudaStream_t stream) noexcept {
  destroy_stream(stream);
  return cudaSuccess;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
