// tensorplay/detail/thread_streams.hpp: this thread's current stream per device, and the side
// streams captures use when the current stream is the legacy default stream.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/stream_lifetime.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <vector>

namespace tensorplay::detail {

//! This thread's streams, one slot per device. A null `current` slot means the legacy default stream.
struct ThreadStreams {
  std::array<cudaStream_t, config::max_devices> current{};
  std::array<OwnedStream, config::max_devices> side{};  // created on first capture from the default stream

  //! A stream made current for the time of a capture or body, and what was current before.
  struct Override {
    int device;
    cudaStream_t stream;
    cudaStream_t previous;
  };
  std::vector<Override> overrides;  // innermost last

  //! Makes `stream` current on `device` until pop(device, stream).
  void push(int device, cudaStream_t stream);

  //! Undoes push(device, stream), also when the pushes are not undone in reverse order (two
  //! captures on one thread that end in the order they began): a later override of the same
  //! device then inherits what this one replaced, and the current stream stays the later one's.
  void pop(int device, cudaStream_t stream) noexcept;

  //! `stream` is being destroyed: slots naming it fall back to the legacy default stream.
  void forget(cudaStream_t stream) noexcept;
};

TENSORPLAY_PROCESS_WIDE TENSORPLAY_DECL ThreadStreams& thread_streams() noexcept;

TENSORPLAY_DECL void set_current_stream(int device, cudaStream_t stream) noexcept;

//! This thread's side stream on `device`: where captures go when the current stream is the
//! legacy default stream, which cannot be captured.
TENSORPLAY_DECL cudaStream_t side_stream(int device, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/device.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void ThreadStreams::push(int device, cudaStream_t stream) {
  overrides.push_back({device, stream, current[static_cast<std::size_t>(device)]});
  current[static_cast<std::size_t>(device)] = stream;
}

TENSORPLAY_DECL void ThreadStreams::pop(int device, cudaStream_t stream) noexcept {
  for (std::size_t i = overrides.size(); i-- > 0;) {
    const Override o = overrides[i];
    if (o.device != device || o.stream != stream) continue;
    bool covered = false;
    for (std::size_t j = i + 1; j < overrides.size(); ++j) {
      if (overrides[j].device != device) continue;
      overrides[j].previous = o.previous;
      covered = true;
      break;
    }
    if (!covered) current[static_cast<std::size_t>(device)] = o.previous;
    overrides.erase(overrides.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

TENSORPLAY_DECL void ThreadStreams::forget(cudaStream_t stream) noexcept {
  for (cudaStream_t& slot : current)
    if (slot == stream) slot = nullptr;
}

TENSORPLAY_DECL ThreadStreams& thread_streams() noexcept {
  thread_local ThreadStreams streams;
  return streams;
}

TENSORPLAY_DECL void set_current_stream(int device, cudaStream_t stream) noexcept { thread_streams().current[static_cast<std::size_t>(device)] = stream; }

TENSORPLAY_DECL cudaStream_t side_stream(int device, const tensorplay::source_location& where) {
  OwnedStream& slot = thread_streams().side[static_cast<std::size_t>(device)];
  if (slot.get() == nullptr) {
    DeviceGuard guard(device, where);
    RelaxedCaptureMode relaxed;  // creating a stream must not disturb a capture on another stream
    cudaStream_t stream = nullptr;
    TENSORPLAY_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), where);
    slot = OwnedStream(stream);
  }
  return slot.get();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
