// tensorplay/detail/thread_streams.hpp: this thread's current stream per device, and the side
// streams captures use when the current stream is the legacy default stream.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/stream_lifetime.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <source_location>

namespace tensorplay::detail {

//! This thread's streams, one slot per device. A null `current` slot means the legacy default stream.
struct ThreadStreams {
  std::array<cudaStream_t, config::max_devices> current{};
  std::array<OwnedStream, config::max_devices> side{};  // created on first capture from the default stream

  //! `stream` is being destroyed: slots naming it fall back to the legacy default stream.
  void forget(cudaStream_t stream) noexcept {
    for (cudaStream_t& slot : current)
      if (slot == stream) slot = nullptr;
  }
};

inline ThreadStreams& thread_streams() noexcept {
  thread_local ThreadStreams streams;
  return streams;
}

inline void set_current_stream(int device, cudaStream_t stream) noexcept { thread_streams().current[device] = stream; }

//! This thread's side stream on `device`: where captures go when the current stream is the
//! legacy default stream, which cannot be captured.
inline cudaStream_t side_stream(int device, const std::source_location& where) {
  OwnedStream& slot = thread_streams().side[device];
  if (slot.get() == nullptr) {
    DeviceGuard guard(device, where);
    RelaxedCaptureMode relaxed;  // creating a stream must not disturb a capture on another stream
    cudaStream_t stream = nullptr;
    TENSORPLAY_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where);
    slot = OwnedStream(stream);
  }
  return slot.get();
}

}  // namespace tensorplay::detail
