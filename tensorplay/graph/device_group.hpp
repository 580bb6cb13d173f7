// tensorplay/graph/device_group.hpp: DeviceGroupGraph: one Graph per device, captured together by
// one thread, replayed together.
//
// Work that spans devices from one thread (kernels on every GPU interleaved with NCCL collectives
// issued in ncclGroupStart/ncclGroupEnd) must be captured with every device's capture open at
// once: the grouped NCCL call issues work to all the streams at its ncclGroupEnd. CUDA also
// refuses to instantiate a graph while the same thread still has a capture open on another
// device (thread_local and global modes), so every capture ends before any is compiled.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

//! One Graph, with a private pool, per device of a group; captured together, replayed together.
//!
//! capture() begins a capture on every device first, on a stream the group owns for that device
//! (or on streams you give it), then runs the body while all the captures are open, on the
//! calling thread, then ends every capture, then compiles each graph. The body has two forms:
//!
//!   - per device: body(int device, StreamRef stream), called once per device in the order of
//!     devices(), with that device current (and `stream` its current stream). One thread can
//!     issue grouped NCCL calls across the bodies: ncclGroupStart() in the first, ncclGroupEnd()
//!     in the last. NCCL issues grouped collectives at ncclGroupEnd, after all that the bodies
//!     captured: in this form, collectives come last in each body.
//!
//!         tensorplay::DeviceGroupGraph group({0, 1});
//!         group.capture([&](int device, tensorplay::StreamRef s) {
//!           const std::size_t i = group.index_of(device);
//!           grad<<<blocks, threads, 0, s>>>(x[i].data(), g[i].data());
//!           if (i == 0) ncclGroupStart();
//!           ncclAllReduce(g[i].data(), g[i].data(), n, ncclFloat, ncclSum, comm[i], s);
//!           if (i + 1 == group.devices().size()) ncclGroupEnd();
//!         });
//!
//!   - one step: body(std::span<const StreamRef> streams), called once with every capture
//!     stream (streams[i] for devices()[i]), for steps that interleave kernels and grouped
//!     collectives (kernel on every device, all-reduce, kernel on every device, ...). The
//!     current device is left as it was: make devices()[i] current before launching a kernel
//!     on streams[i] (StreamGuard(streams[i]) does), or before opening a conditional body on
//!     graph(devices()[i]) (cudaSetDevice; a StreamGuard would hide the body's stream).
//!
//! Streams: the group's own non-blocking streams (stream(device)) unless capture() is given
//! others. Replay on any streams of the right devices; the group's own are convenient.
//!
//! Replaying launches each device's graph on its stream, with that device current (the calling
//! thread's current device is restored afterwards); the host does not wait. Graphs of a
//! group share nothing but their capture: each has its own pool, and stays usable on its own
//! through graph(device). A DeviceGroupGraph is move-only and works for any number of devices.
class DeviceGroupGraph {
 public:
  //! A group over `devices` (each at most once, in the order bodies and replay streams use).
  //! No CUDA call is made here: streams are created at the first capture.
  //! \throws usage_error for an empty list, a repeated or negative device, or a pool in
  //!         `options` (a pool belongs to one device: each graph gets a private one).
  explicit DeviceGroupGraph(std::vector<int> devices, GraphOptions options = {});

  DeviceGroupGraph(DeviceGroupGraph&&) noexcept = default;
  //! Takes `other`'s graphs and streams; what this group held is destroyed (graphs first).
  DeviceGroupGraph& operator=(DeviceGroupGraph&& other) noexcept;
  DeviceGroupGraph(const DeviceGroupGraph&) = delete;
  DeviceGroupGraph& operator=(const DeviceGroupGraph&) = delete;
  //! Destroys the graphs first (never waiting for replays still running), then the streams.
  ~DeviceGroupGraph() = default;

  //! Captures `body` on every device, on the group's own streams (see the class comment).
  //! If anything throws (the body, a capture CUDA invalidated, an instantiation CUDA refused),
  //! every capture of the group is abandoned and every graph reset (nothing is left capturing)
  //! and the exception propagates; the group can capture again.
  //! \throws usage_error when the group already holds captured graphs (reset() first).
  template <class F>
  void capture(F&& body, tensorplay::source_location where = tensorplay::source_location::current()) {
    std::vector<StreamRef> streams = own_streams(where);
    capture_on(body, streams, where);
  }

  //! capture() on your streams: streams[i] (of device devices()[i]) for devices()[i].
  //! \throws usage_error when streams.size() differs from devices().size().
  template <class F>
  void capture(F&& body, std::span<const StreamRef> streams, tensorplay::source_location where = tensorplay::source_location::current()) {
    require_size("capture", streams.size());
    capture_on(body, streams, where);
  }

  //! Launches each device's graph, graphs()[i] on streams[i], in the order of devices(); the
  //! host does not wait. streams[i] must belong to devices()[i].
  //! \throws usage_error when streams.size() differs from devices().size(), or before a capture.
  void replay(std::span<const StreamRef> streams, tensorplay::source_location where = tensorplay::source_location::current());

  //! Launches each device's graph on this thread's current stream of its device.
  void replay(tensorplay::source_location where = tensorplay::source_location::current());

  //! Abandons open captures, destroys every graph and executable, drops their pools and retained
  //! objects (each lives until the last launch that can use it completes). Never waits.
  void reset() noexcept;

  //! The graph of `device`. \throws usage_error for a device not in the group.
  [[nodiscard]] Graph& graph(int device);
  [[nodiscard]] const Graph& graph(int device) const;

  //! The devices, in the order given to the constructor.
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return devices_; }
  [[nodiscard]] std::size_t size() const noexcept;

  //! Position of `device` in devices(). \throws usage_error for a device not in the group.
  [[nodiscard]] std::size_t index_of(int device) const;

  //! The group's own stream for `device` (made on first use): where capture() captures, and a
  //! convenient stream to replay on.
  [[nodiscard]] StreamRef stream(int device, tensorplay::source_location where = tensorplay::source_location::current());

  //! True while a capture of the group is open (inside capture()'s body).
  [[nodiscard]] bool is_capturing() const noexcept;
  //! True once every device's graph has an executable.
  [[nodiscard]] bool is_instantiated() const noexcept;

 private:
  template <class F>
  void capture_on(F& body, std::span<const StreamRef> streams, const tensorplay::source_location& where) {
    if (is_capturing()) detail::throw_usage("DeviceGroupGraph::capture: a capture of this group is already open");
    for (const Graph& graph : graphs_)
      if (graph.native_graph() != nullptr)
        detail::throw_usage("DeviceGroupGraph::capture: the group already holds captured graphs; call reset() first");
    try {
      // With its device current, a legacy default stream resolves to that device (Graph then
      // captures on that device's side stream).
      for_each_on_device(
          [&](std::size_t i) {
            if (const int device = streams[i].device(where); device != devices_[i])
              detail::throw_usage("DeviceGroupGraph::capture: stream " + std::to_string(i) + " belongs to device " +
                                  std::to_string(device) + ", not to device " + std::to_string(devices_[i]));
            graphs_[i].capture_begin({.stream = streams[i]}, where);
          },
          where);
      std::vector<StreamRef> capturing(graphs_.size());
      for (std::size_t i = 0; i < graphs_.size(); ++i) capturing[i] = graphs_[i].capture_stream();
      run_body(body, std::span<const StreamRef>(capturing), where);
      // Every capture ends before any is compiled (see the header comment).
      for_each_on_device([&](std::size_t i) { graphs_[i].capture_end(Instantiate::Later, where); }, where);
      for_each_on_device([&](std::size_t i) { graphs_[i].instantiate(where); }, where);
    } catch (...) {
      reset();
      throw;
    }
  }

  template <class F>
  void run_body(F& body, std::span<const StreamRef> streams, const tensorplay::source_location& where) {
    if constexpr (std::is_invocable_v<F&, std::span<const StreamRef>>) {
      body(streams);
    } else {
      static_assert(std::is_invocable_v<F&, int, StreamRef>,
                    "tensorplay: a DeviceGroupGraph body must be callable as body(int device, StreamRef stream) or "
                    "body(std::span<const StreamRef> streams)");
      for_each_on_device([&](std::size_t i) { body(devices_[i], streams[i]); }, where);
    }
  }

  // Calls f(i) for every device in order, with devices_[i] current (launches and instantiation go
  // to the current device's context), then makes the caller's device current again (also if f
  // switched devices itself). Switches only when the device changes.
  template <class F>
  void for_each_on_device(F&& f, const tensorplay::source_location& where) {
    detail::DeviceGuard guard;  // the caller's device, made current again at the end
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      guard.set(devices_[i], where);
      f(i);
    }
  }

  std::vector<StreamRef> own_streams(const tensorplay::source_location& where);

  void require_size(const char* what, std::size_t count) const;

  void require_instantiated(const char* what) const;

  std::vector<int> devices_;
  std::vector<Stream> streams_;  // the group's capture streams, made at the first capture
  std::vector<Graph> graphs_;    // graphs_[i] for devices_[i]; destroyed before streams_
};

}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay {

TENSORPLAY_DECL DeviceGroupGraph::DeviceGroupGraph(std::vector<int> devices, GraphOptions options) : devices_(std::move(devices)) {
  if (devices_.empty()) detail::throw_usage("DeviceGroupGraph: the device list is empty");
  if (options.pool)
    detail::throw_usage("DeviceGroupGraph: GraphOptions::pool must be empty (a pool belongs to one device; each "
                        "device's graph captures into a private pool of its own)");
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const int device = devices_[i];
    if (device < 0 || device >= detail::max_devices)
      detail::throw_usage("DeviceGroupGraph: device " + std::to_string(device) + " is not a device id (0 to " +
                          std::to_string(detail::max_devices - 1) + ")");
    for (std::size_t j = 0; j < i; ++j)
      if (devices_[j] == device)
        detail::throw_usage("DeviceGroupGraph: device " + std::to_string(device) + " is listed twice");
  }
  graphs_.reserve(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) graphs_.emplace_back(options);
}

TENSORPLAY_DECL DeviceGroupGraph& DeviceGroupGraph::operator=(DeviceGroupGraph&& other) noexcept {
  DeviceGroupGraph moved(std::move(other));
  std::swap(devices_, moved.devices_);
  std::swap(streams_, moved.streams_);
  std::swap(graphs_, moved.graphs_);
  return *this;
}

TENSORPLAY_DECL void DeviceGroupGraph::replay(std::span<const StreamRef> streams, tensorplay::source_location where) {
  require_size("replay", streams.size());
  require_instantiated("replay");
  for_each_on_device([&](std::size_t i) { graphs_[i].replay(streams[i], where); }, where);
}

TENSORPLAY_DECL void DeviceGroupGraph::replay(tensorplay::source_location where) {
  require_instantiated("replay");
  for_each_on_device([&](std::size_t i) { graphs_[i].replay(where); }, where);
}

TENSORPLAY_DECL void DeviceGroupGraph::reset() noexcept {
  for (Graph& graph : graphs_) graph.reset();
}

TENSORPLAY_DECL Graph& DeviceGroupGraph::graph(int device) { return graphs_[index_of(device)]; }

TENSORPLAY_DECL const Graph& DeviceGroupGraph::graph(int device) const { return graphs_[index_of(device)]; }

TENSORPLAY_DECL std::size_t DeviceGroupGraph::size() const noexcept { return devices_.size(); }

TENSORPLAY_DECL std::size_t DeviceGroupGraph::index_of(int device) const {
  for (std::size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i] == device) return i;
  detail::throw_usage("DeviceGroupGraph: device " + std::to_string(device) + " is not in this group");
}

TENSORPLAY_DECL StreamRef DeviceGroupGraph::stream(int device, tensorplay::source_location where) {
  return own_streams(where)[index_of(device)];
}

TENSORPLAY_DECL bool DeviceGroupGraph::is_capturing() const noexcept {
  for (const Graph& graph : graphs_)
    if (graph.is_capturing()) return true;
  return false;
}

TENSORPLAY_DECL bool DeviceGroupGraph::is_instantiated() const noexcept {
  for (const Graph& graph : graphs_)
    if (!graph.is_instantiated()) return false;
  return true;
}

TENSORPLAY_DECL std::vector<StreamRef> DeviceGroupGraph::own_streams(const tensorplay::source_location& where) {
  while (streams_.size() < devices_.size()) streams_.emplace_back(devices_[streams_.size()], where);
  return {streams_.begin(), streams_.end()};
}

TENSORPLAY_DECL void DeviceGroupGraph::require_size(const char* what, std::size_t count) const {
  if (count != devices_.size())
    detail::throw_usage(std::string("DeviceGroupGraph::") + what + ": " + std::to_string(count) + " stream(s) for " +
                        std::to_string(devices_.size()) + " device(s); give one per device, in the order of devices()");
}

TENSORPLAY_DECL void DeviceGroupGraph::require_instantiated(const char* what) const {
  if (is_instantiated()) [[likely]]
    return;
  if (is_capturing())
    detail::throw_usage(std::string("DeviceGroupGraph::") + what + ": the group is still capturing");
  detail::throw_usage(std::string("DeviceGroupGraph::") + what +
                      ": nothing has been captured (capture() first, again after a failed capture or reset())");
}

}  // namespace tensorplay
#endif  // TENSORPLAY_DEFINE_BODIES
