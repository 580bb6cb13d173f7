// tensorplay/detail/pool_directory.hpp: every live pool, the default pool of each device, where
// an allocation goes (routing), and PoolBlock, one allocation that keeps its pool alive.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/caching_allocator.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Every live pool by serial (for Pool(PoolId)), and the process-wide default pool per device.
class PoolDirectory {
 public:
  TENSORPLAY_PROCESS_WIDE static PoolDirectory& instance();

  //! A new graph pool of `device`; `offloadable`: its segments come from reserved address ranges
  //! that Pool::offload / Pool::restore can release and back again (offload.hpp).
  //! \throws cuda_error when an offloadable pool cannot be had (no virtual memory management).
  std::shared_ptr<PoolImpl> make_graph_pool(int device, bool offloadable = false,
                                            const tensorplay::source_location& where = tensorplay::source_location::current());

  std::shared_ptr<PoolImpl> find(std::uint64_t serial);

  //! The default pool of `device`. Never destroyed (a tensor in a static object may still
  //! free into it during exit); at exit its unused memory goes back to CUDA, while the
  //! runtime is still loaded: the handler is registered after the runtime's own.
  const std::shared_ptr<PoolImpl>& default_pool(int device);

  //! `stream` is about to be destroyed: every pool replaces its references to the stream by an
  //! event recorded on it now (caching_allocator.hpp explains why).
  void retire_stream(cudaStream_t stream) noexcept;

  //! Gives CUDA back the default pools' memory that no tensor uses. Returns the bytes released.
  std::size_t release_unused_default_memory() noexcept;

 private:
  using Entry = std::pair<std::uint64_t, std::weak_ptr<PoolImpl>>;
  // The first entry whose serial is not below `serial`. Mutex held.
  std::vector<Entry>::iterator position(std::uint64_t serial);

  void forget(std::uint64_t serial);

  std::mutex mutex_;
  std::uint64_t last_serial_ = 0;
  // Live pools by serial, in increasing serial order (serials only grow, so appending keeps it
  // sorted): a binary search finds one.
  std::vector<Entry> live_;
  std::array<std::shared_ptr<PoolImpl>, max_devices> defaults_{};
  std::array<std::atomic<bool>, max_devices> ready_{};
  bool exit_handler_ = false;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL PoolDirectory& PoolDirectory::instance() {
  static auto* directory = new PoolDirectory;  // leaked on purpose, like the default pools
  return *directory;
}

TENSORPLAY_DECL std::shared_ptr<PoolImpl> PoolDirectory::make_graph_pool(int device, bool offloadable,
    const tensorplay::source_location& where) {
  std::unique_ptr<OffloadState> offload;
  if (offloadable) offload = std::make_unique<OffloadState>(device, where);  // before any pool exists: a throw leaves none
  std::lock_guard lock(mutex_);
  const std::uint64_t serial = ++last_serial_;
  std::shared_ptr<PoolImpl> pool(new PoolImpl(device, serial, PoolImpl::Kind::Graph), [](PoolImpl* p) {
    PoolDirectory::instance().forget(p->serial());
    delete p;
  });
  if (offload) pool->make_offloadable(std::move(offload));
  live_.emplace_back(serial, pool);
  return pool;
}

TENSORPLAY_DECL std::shared_ptr<PoolImpl> PoolDirectory::find(std::uint64_t serial) {
  std::lock_guard lock(mutex_);
  auto it = position(serial);
  return it == live_.end() || it->first != serial ? nullptr : it->second.lock();
}

TENSORPLAY_DECL const std::shared_ptr<PoolImpl>& PoolDirectory::default_pool(int device) {
  const auto index = static_cast<std::size_t>(device);
  std::shared_ptr<PoolImpl>& slot = defaults_[index];
  if (!ready_[index].load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    if (!ready_[index].load(std::memory_order_relaxed)) {
      const std::uint64_t serial = ++last_serial_;
      slot = std::shared_ptr<PoolImpl>(new PoolImpl(device, serial, PoolImpl::Kind::Default));
      live_.emplace_back(serial, slot);
      if (!exit_handler_) exit_handler_ = std::atexit([] { PoolDirectory::instance().release_unused_default_memory(); }) == 0;
      ready_[index].store(true, std::memory_order_release);
    }
  }
  return slot;
}

TENSORPLAY_DECL void PoolDirectory::retire_stream(cudaStream_t stream) noexcept {
  std::vector<std::shared_ptr<PoolImpl>> pools;
  {
    std::lock_guard lock(mutex_);
    for (auto& [serial, weak] : live_)
      if (auto pool = weak.lock()) pools.push_back(std::move(pool));
  }
  auto make_marker = [stream]() -> std::shared_ptr<const StreamEndMarker> {
    if (is_capturing_or_false(stream)) return nullptr;  // an event recorded now would be captured
    auto marker = std::make_shared<StreamEndMarker>();
    RelaxedCaptureMode relaxed;  // creating and recording an event must not disturb a capture elsewhere
    DeviceGuard on_stream_device(stream_device_or_none(stream), DeviceGuard::quiet);  // events record on their own device's streams
    if (cudaEventCreateWithFlags(&marker->event, cudaEventDisableTiming) != cudaSuccess ||
        event_record(marker->event, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return marker;
  };
  for (auto& pool : pools) pool->retire_stream(stream, make_marker);
}

TENSORPLAY_DECL std::size_t PoolDirectory::release_unused_default_memory() noexcept {
  if (CaptureRegistry::instance().any_open()) return 0;  // cudaFree would break the capture
  std::size_t bytes = 0;
  for (std::size_t device = 0; device < defaults_.size(); ++device)
    if (ready_[device].load(std::memory_order_acquire)) bytes += defaults_[device]->release_unused_segments();
  return bytes;
}

TENSORPLAY_DECL auto PoolDirectory::position(std::uint64_t serial) -> std::vector<Entry>::iterator {
  const std::size_t i =
      lower_bound_index(live_.data(), live_.size(), serial, [](const Entry& entry, std::uint64_t s) { return entry.first < s; });
  return live_.begin() + static_cast<std::ptrdiff_t>(i);
}

TENSORPLAY_DECL void PoolDirectory::forget(std::uint64_t serial) {
  std::lock_guard lock(mutex_);
  if (auto it = position(serial); it != live_.end() && it->first == serial) live_.erase(it);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
