// tensorplay/stream.hpp: StreamRef, Stream, and the per-thread, per-device current stream.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <utility>

namespace tensorplay {

//! A non-owning stream handle. Converts implicitly from and to `cudaStream_t`.
//!
//! A default-constructed StreamRef names the legacy default stream (handle 0). Construction
//! from `int` or `nullptr` is deleted so that `replay(0)` cannot pick a stream by accident:
//! write `StreamRef{}` or `cudaStreamLegacy` for the legacy default stream.
//!
//! A StreamRef made from a Stream also remembers the stream's device, so asking for it costs
//! no CUDA call; one made from a bare handle asks CUDA when the device is needed.
class StreamRef {
 public:
  constexpr StreamRef() noexcept = default;
  constexpr StreamRef(cudaStream_t stream) noexcept : stream_(stream) {}  // NOLINT: implicit by design
  //! `device` must be the stream's device.
  constexpr StreamRef(cudaStream_t stream, int device) noexcept : stream_(stream), device_(device) {}
  StreamRef(int) = delete;
  StreamRef(std::nullptr_t) = delete;

  [[nodiscard]] constexpr cudaStream_t get() const noexcept { return stream_; }
  constexpr operator cudaStream_t() const noexcept { return stream_; }  // NOLINT: implicit by design

  //! True for the legacy default stream, which can never be captured.
  [[nodiscard]] constexpr bool is_legacy_default() const noexcept {
    return stream_ == nullptr || stream_ == cudaStreamLegacy;
  }

  //! The device this stream belongs to (the current device for the default streams).
  [[nodiscard]] int device(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! True while work issued to this stream is being captured into a graph.
  [[nodiscard]] bool is_capturing(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! Blocks the host until all work issued to this stream has completed.
  void synchronize(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! Same stream handle (the remembered device plays no part).
  friend constexpr bool operator==(StreamRef a, StreamRef b) noexcept { return a.stream_ == b.stream_; }

 protected:
  cudaStream_t stream_ = nullptr;
  int device_ = -1;  // -1: not known yet (ask CUDA)
};

//! An owning, non-blocking stream. Move-only; destroying it never waits for its work.
//!
//! It may die before what uses it: a Graph still capturing on it has its capture abandoned
//! (capture_end then throws usage_error), and tensors whose last use ran on it wait for that
//! work through an event before their memory is reused.
//!
//! Without a usable GPU the constructor throws `cuda_error`, whose message says so.
class Stream : public StreamRef {
 public:
  //! A new non-blocking stream on the current device.
  explicit Stream(tensorplay::source_location where = tensorplay::source_location::current());

  //! A new non-blocking stream on `device`. The current device is left unchanged.
  explicit Stream(int device, tensorplay::source_location where = tensorplay::source_location::current());

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  [[nodiscard]] int device() const noexcept { return device_; }

  //! Gives up ownership: the caller must destroy the returned handle.
  [[nodiscard]] cudaStream_t release() noexcept;

  //! Destroys the stream now (work already issued still completes). A capture still open on
  //! it is abandoned first; this thread's current-stream slots naming it are cleared.
  void reset() noexcept;
};

//! This thread's current stream on the current device; the legacy default stream unless a
//! StreamGuard or an open capture made another one current.
[[nodiscard]] TENSORPLAY_DECL StreamRef current_stream(tensorplay::source_location where = tensorplay::source_location::current());

//! This thread's current stream on `device`.
[[nodiscard]] TENSORPLAY_DECL StreamRef current_stream(int device) noexcept;

//! Makes `stream` (and its device) current for this thread; restores both on destruction.
//!
//!     tensorplay::Stream s;
//!     { tensorplay::StreamGuard guard(s); launch_work(tensorplay::current_stream()); }  // runs on s
class StreamGuard {
 public:
  explicit StreamGuard(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current());
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  ~StreamGuard();

 private:
  int device_;
  detail::DeviceGuard on_device_;  // restores the caller's device after the stream
  cudaStream_t previous_stream_;
};

}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/thread_streams.hpp>

namespace tensorplay {

TENSORPLAY_DECL int StreamRef::device(tensorplay::source_location where) const {
  return device_ >= 0 ? device_ : detail::stream_device(stream_, where);
}

TENSORPLAY_DECL bool StreamRef::is_capturing(tensorplay::source_location where) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TENSORPLAY_CHECK(cudaStreamIsCapturing(stream_, &status), where);
  return status != cudaStreamCaptureStatusNone;
}

TENSORPLAY_DECL void StreamRef::synchronize(tensorplay::source_location where) const {
  TENSORPLAY_CHECK(cudaStreamSynchronize(stream_), where);
}

TENSORPLAY_DECL Stream::Stream(tensorplay::source_location where) : Stream(detail::current_device(where), where) {}

TENSORPLAY_DECL Stream::Stream(int device, tensorplay::source_location where) {
  detail::DeviceGuard guard(device, where);
  TENSORPLAY_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where);
  device_ = device;
}

TENSORPLAY_DECL Stream::Stream(Stream&& other) noexcept : StreamRef(std::exchange(other.stream_, nullptr), other.device_) {}

TENSORPLAY_DECL Stream& Stream::operator=(Stream&& other) noexcept {
  Stream moved(std::move(other));
  std::swap(stream_, moved.stream_);
  std::swap(device_, moved.device_);
  return *this;
}

TENSORPLAY_DECL Stream::~Stream() { reset(); }

TENSORPLAY_DECL cudaStream_t Stream::release() noexcept { return std::exchange(stream_, nullptr); }

TENSORPLAY_DECL void Stream::reset() noexcept {
  if (stream_ == nullptr) return;
  const cudaStream_t stream = std::exchange(stream_, nullptr);
  detail::thread_streams().forget(stream);
  detail::destroy_stream(stream);
}

TENSORPLAY_DECL StreamRef current_stream(tensorplay::source_location where) {
  return detail::thread_streams().current[static_cast<std::size_t>(detail::current_device(where))];
}

TENSORPLAY_DECL StreamRef current_stream(int device) noexcept { return detail::thread_streams().current[static_cast<std::size_t>(device)]; }

TENSORPLAY_DECL StreamGuard::StreamGuard(StreamRef stream, tensorplay::source_location where) : device_(stream.device(where)),
      on_device_(device_, where),
      previous_stream_(detail::thread_streams().current[static_cast<std::size_t>(device_)]) {
  detail::set_current_stream(device_, stream);
}

TENSORPLAY_DECL StreamGuard::~StreamGuard() { detail::set_current_stream(device_, previous_stream_); }

}  // namespace tensorplay
#endif  // TENSORPLAY_DEFINE_BODIES
