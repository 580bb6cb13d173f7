// tensorplay/detail/offload.hpp: sleep and wake of an offloadable pool: what Pool::offload and
// Pool::restore do once the pool (caching_allocator.hpp) has said which bytes are live and which
// work may still use them.
//
// Every step either completes or leaves the pool in one of its two states, with every byte
// intact, and the error says which:
//   offload: wait for the users -> copy the live runs to the host -> wait for the copies: a
//            failure here leaves the pool on the device, untouched. Then each segment's physical
//            memory is released: a failure here leaves the pool offloaded (the host copy is
//            complete), with the segments it could not release still holding device memory.
//   restore: back every segment again -> copy the runs back -> wait for the copies: a failure
//            anywhere releases what this call backed, and leaves the pool offloaded.
// Both return once their copies are complete: offload must wait before it may release the
// memory, and after restore the pool is whole for every stream, not only for `stream`.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/offload_image.hpp>
#include <tensorplay/detail/vmm_segments.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! What must complete before the pool's blocks are copied: the streams and events of their uses.
struct PendingWork {
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
};

//! The memory of an offloadable pool: its segments and, while it sleeps, the host copy.
class OffloadState {
 public:
  //! \throws cuda_error when the device cannot give virtual memory management.
  OffloadState(int device, const tensorplay::source_location& where);

  [[nodiscard]] VmmSegments& segments() noexcept { return segments_; }
  [[nodiscard]] const HostImage& image() const noexcept { return image_; }
  //! Whether the blocks live in the host copy (the pool is offloaded).
  [[nodiscard]] bool on_host() const noexcept { return on_host_; }

  //! Copies `runs` (the live blocks) to the host after `work` and what `stream` already has
  //! queued, then releases the segments' physical memory. `pool` names the pool in errors.
  void offload(std::vector<HostRun> runs, const PendingWork& work, cudaStream_t stream, const std::string& pool,
               const tensorplay::source_location& where);

  //! Backs every segment again at its addresses and copies the runs back, in order on `stream`.
  void restore(cudaStream_t stream, const std::string& pool, const tensorplay::source_location& where);

 private:
  static VmmStatus synchronize(cudaStream_t stream, const char* name) noexcept;
  static void quiet_synchronize(cudaStream_t stream) noexcept;

  VmmSegments segments_;
  HostImage image_;
  bool on_host_ = false;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/vmm_api.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL OffloadState::OffloadState(int device, const tensorplay::source_location& where) : segments_(device, where) {}

TENSORPLAY_DECL void OffloadState::offload(std::vector<HostRun> runs, const PendingWork& work, cudaStream_t stream, const std::string& pool,
    const tensorplay::source_location& where) {
  VmmGraveyard::instance().drain();
  auto stays_resident = [&](const VmmStatus& s) {
    throw cuda_error(s.status, std::string(s.call) + "; " + pool + " stays on the device, every block intact", where);
  };
  for (cudaStream_t s : work.streams) {
    if (s == stream || is_capturing_or_false(s)) continue;  // a capturing stream runs nothing of ours
    const VmmStatus status = runtime_call("cudaStreamSynchronize (Pool::offload: a stream that used the pool)",
                                          cudaErrorLaunchFailure, [&] { return cudaStreamSynchronize(s); });
    if (!status.ok()) stays_resident(status);
  }
  for (cudaEvent_t e : work.events) {
    const VmmStatus status = runtime_call("cudaEventSynchronize (Pool::offload: a use of the pool)", cudaErrorLaunchFailure,
                                          [&] { return cudaEventSynchronize(e); });
    if (!status.ok()) stays_resident(status);
  }
  if (VmmStatus status = image_.plan(std::move(runs)); !status.ok()) stays_resident(status);
  if (VmmStatus status = image_.copy_out(stream); !status.ok()) {
    quiet_synchronize(stream);  // the copies already issued write into the host copy
    stays_resident(status);
  }
  if (VmmStatus status = synchronize(stream, "cudaStreamSynchronize (Pool::offload: the copies)"); !status.ok()) {
    quiet_synchronize(stream);  // a failed wait proves nothing: no copy may outlive this call
    stays_resident(status);
  }

  on_host_ = true;  // from here on the host copy is whole: whatever fails, the pool is offloaded
  VmmStatus first_failure;
  std::size_t kept = 0;
  for (VmmSegment& s : segments_.segments()) {
    const VmmStatus status = segments_.evict(s);
    if (status.ok()) continue;
    if (first_failure.ok()) first_failure = status;
    kept += s.bytes;
  }
  if (!first_failure.ok())
    throw cuda_error(first_failure.status,
                     std::string(first_failure.call) + "; " + pool + " is offloaded (every block is in host memory), but " +
                         std::to_string(kept) + " bytes of its device memory could not be released; restore works as usual",
                     where);
}

TENSORPLAY_DECL void OffloadState::restore(cudaStream_t stream, const std::string& pool, const tensorplay::source_location& where) {
  VmmGraveyard::instance().drain();
  std::vector<VmmSegment*> backed_now;  // undone if this call fails
  auto stays_offloaded = [&](const VmmStatus& s) {
    for (VmmSegment* b : backed_now) segments_.drop(*b);
    throw cuda_error(s.status,
                     std::string(s.call) + "; " + pool + " stays offloaded, every block intact in host memory (restore may be called again)",
                     where);
  };
  for (VmmSegment& s : segments_.segments()) {
    if (s.handle != 0 && s.mapped && s.accessible) continue;  // kept by an offload that could not release it
    backed_now.push_back(&s);
    if (VmmStatus status = segments_.back(s); !status.ok()) stays_offloaded(status);
  }
  if (VmmStatus status = image_.copy_in(stream); !status.ok()) {
    quiet_synchronize(stream);  // no copy may still write into memory about to be released
    stays_offloaded(status);
  }
  if (VmmStatus status = synchronize(stream, "cudaStreamSynchronize (Pool::restore: the copies)"); !status.ok()) {
    quiet_synchronize(stream);  // a failed wait proves nothing: no copy may still write into what is released
    stays_offloaded(status);
  }
  on_host_ = false;
}

TENSORPLAY_DECL VmmStatus OffloadState::synchronize(cudaStream_t stream, const char* name) noexcept {
  return runtime_call(name, cudaErrorLaunchFailure, [&] { return cudaStreamSynchronize(stream); });
}

TENSORPLAY_DECL void OffloadState::quiet_synchronize(cudaStream_t stream) noexcept {
  if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
