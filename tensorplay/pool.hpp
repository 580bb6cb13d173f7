// tensorplay/pool.hpp: PoolId, Pool, graph_pool_handle, PoolAllocator, and allocation routing.
#pragma once

#include <tensorplay/detail/caching_allocator.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/graph_api.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/stream.hpp>

#include <thrust/device_ptr.h>

#include <cuda_runtime_api.h>

#include <array>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <source_location>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tensorplay {

//! Names one pool. Default-constructed, it names none. Comparable, hashable, printable.
class PoolId {
 public:
  constexpr PoolId() noexcept = default;
  constexpr PoolId(int device, std::uint64_t serial) noexcept : device_(device), serial_(serial) {}

  [[nodiscard]] constexpr int device() const noexcept { return device_; }
  [[nodiscard]] constexpr std::uint64_t serial() const noexcept { return serial_; }
  //! False for the default-constructed id, which names no pool.
  constexpr explicit operator bool() const noexcept { return serial_ != 0; }

  friend constexpr bool operator==(PoolId, PoolId) noexcept = default;
  friend std::ostream& operator<<(std::ostream& os, PoolId id) {
    if (!id) return os << "PoolId(none)";
    return os << "PoolId(device " << id.device_ << ", #" << id.serial_ << ')';
  }

 private:
  int device_ = -1;
  std::uint64_t serial_ = 0;
};

namespace detail {

//! Every live pool by serial (for Pool(PoolId)), and the process-wide default pool per device.
class PoolDirectory {
 public:
  static PoolDirectory& instance() {
    static auto* directory = new PoolDirectory;  // leaked on purpose, like the default pools
    return *directory;
  }

  std::shared_ptr<PoolImpl> make_graph_pool(int device) {
    std::lock_guard lock(mutex_);
    const std::uint64_t serial = ++last_serial_;
    std::shared_ptr<PoolImpl> pool(new PoolImpl(device, serial, PoolImpl::Kind::Graph), [](PoolImpl* p) {
      PoolDirectory::instance().forget(p->serial());
      delete p;
    });
    live_[serial] = pool;
    return pool;
  }

  std::shared_ptr<PoolImpl> find(std::uint64_t serial) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(serial);
    return it == live_.end() ? nullptr : it->second.lock();
  }

  //! The default pool of `device`. Never destroyed (a tensor in a static object may still
  //! free into it during exit); at exit its unused memory goes back to CUDA, while the
  //! runtime is still loaded: the handler is registered after the runtime's own.
  const std::shared_ptr<PoolImpl>& default_pool(int device) {
    std::shared_ptr<PoolImpl>& slot = defaults_[device];
    if (!ready_[device].load(std::memory_order_acquire)) {
      std::lock_guard lock(mutex_);
      if (!ready_[device].load(std::memory_order_relaxed)) {
        const std::uint64_t serial = ++last_serial_;
        slot = std::shared_ptr<PoolImpl>(new PoolImpl(device, serial, PoolImpl::Kind::Default));
        live_[serial] = slot;
        if (!exit_handler_) exit_handler_ = std::atexit([] { PoolDirectory::instance().release_unused_default_memory(); }) == 0;
        ready_[device].store(true, std::memory_order_release);
      }
    }
    return slot;
  }

  //! Gives CUDA back the default pools' memory that no tensor uses. Returns the bytes released.
  std::size_t release_unused_default_memory() noexcept {
    if (CaptureRegistry::instance().any_open()) return 0;  // cudaFree would break the capture
    std::size_t bytes = 0;
    for (int device = 0; device < max_devices; ++device)
      if (ready_[device].load(std::memory_order_acquire)) bytes += defaults_[device]->release_unused_segments();
    return bytes;
  }

 private:
  void forget(std::uint64_t serial) {
    std::lock_guard lock(mutex_);
    live_.erase(serial);
  }

  std::mutex mutex_;
  std::uint64_t last_serial_ = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<PoolImpl>> live_;
  std::array<std::shared_ptr<PoolImpl>, max_devices> defaults_{};
  std::array<std::atomic<bool>, max_devices> ready_{};
  bool exit_handler_ = false;
};

//! What an open capture allocates from. A graph with no pool of its own gets a fresh private
//! pool on the first allocation of its capture: most captures allocate nothing, and making a
//! pool for each would cost them a third of a microsecond.
class CaptureContext {
 public:
  //! A capture on `stream` starts: `pool` is the graph's pool, or null for "make one when
  //! needed"; `seq` is the capture's sequence id, or 0 when CUDA has not been asked yet.
  //! Called before the context is registered: no other thread can reach it yet.
  void open(int device, cudaStream_t stream, CaptureSeq seq, std::shared_ptr<PoolImpl> pool) noexcept {
    device_ = device;
    stream_ = stream;
    seq_ = seq;
    bodies_.clear();
    pool_ = std::move(pool);
  }

  //! The capture's pool, made now if it has none yet.
  std::shared_ptr<PoolImpl> pool() {
    std::lock_guard lock(mutex_);
    if (!pool_) {
      auto pool = PoolDirectory::instance().make_graph_pool(device_);
      (void)pool->try_begin_capture(sequence());  // a fresh pool: nobody else captures into it
      for (CaptureSeq body : bodies_) pool->add_body_sequence(body);
      pool_ = std::move(pool);
    }
    return pool_;
  }

  void body_opened(CaptureSeq seq) {
    std::lock_guard lock(mutex_);
    bodies_.push_back(seq);
    if (pool_) pool_->add_body_sequence(seq);
  }

  //! A body closed; `parent_seq` 0 means the capture itself is its parent.
  void body_closed(CaptureSeq body_seq, cudaStream_t body_stream, CaptureSeq parent_seq, cudaStream_t parent_stream) noexcept {
    std::lock_guard lock(mutex_);
    std::erase(bodies_, body_seq);
    if (pool_) pool_->end_body_sequence(body_seq, body_stream, parent_seq != 0 ? parent_seq : sequence(), parent_stream);
  }

  //! The capture ended: the pool (null if none was made) settles what the capture freed.
  std::shared_ptr<PoolImpl> close() noexcept {
    std::lock_guard lock(mutex_);
    if (pool_) pool_->end_capture();
    bodies_.clear();
    return std::move(pool_);
  }

 private:
  // The capture's sequence id, asked of CUDA the first time it is needed. Mutex held.
  CaptureSeq sequence() noexcept {
    if (seq_ == 0) seq_ = capture_seq_or_zero(stream_);
    return seq_;
  }

  std::mutex mutex_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  CaptureSeq seq_ = 0;              // 0 until asked (see sequence())
  std::vector<CaptureSeq> bodies_;  // open conditional bodies
  std::shared_ptr<PoolImpl> pool_;
};

//! Where an allocation on `stream` goes: the pool of the capture the stream belongs to, or
//! the default pool of the stream's device when the stream is not being captured.
struct Route {
  std::shared_ptr<PoolImpl> pool;
  CaptureSeq seq;
};

//! `device_of()` is asked only when the default pool is the answer: the device of a
//! capturing stream is the capture's (and CUDA will not tell it while the stream captures).
template <class DeviceOf>
Route route_allocation(cudaStream_t stream, DeviceOf&& device_of, const std::source_location& where) {
  (void)where;
  auto& registry = CaptureRegistry::instance();
  if (registry.any_open()) {
    // An error means not capturing: e.g. the legacy stream next to a capture.
    if (const CaptureSeq seq = capture_seq_or_zero(stream); seq != 0) {
      if (CaptureContext* context = registry.find(seq)) return {context->pool(), seq};
      throw_usage(
          "allocation on a stream that is being captured, but not by a tensorplay::Graph: capture "
          "with Graph::capture_begin so that the memory comes from the graph's pool");
    }
  }
  return {PoolDirectory::instance().default_pool(device_of()), 0};
}

//! One allocation: keeps its pool alive, gives the block back on destruction.
class PoolBlock {
 public:
  PoolBlock() noexcept = default;
  template <class DeviceOf>
  PoolBlock(std::size_t bytes, cudaStream_t stream, DeviceOf&& device_of, const std::source_location& where) {
    Route route = route_allocation(stream, device_of, where);
    block_ = route.pool->allocate(bytes, stream, route.seq, where);
    pool_ = std::move(route.pool);
  }
  //! For use on this thread's current stream of the current device.
  static PoolBlock on_current_stream(std::size_t bytes, const std::source_location& where) {
    const int device = current_device(where);
    return PoolBlock(bytes, current_stream(device), [device] { return device; }, where);
  }

  //! For use on `stream`.
  static PoolBlock on_stream(std::size_t bytes, StreamRef stream, const std::source_location& where) {
    return PoolBlock(bytes, stream.get(), [&] { return stream.device(where); }, where);
  }

  PoolBlock(PoolBlock&& other) noexcept
      : pool_(std::move(other.pool_)), block_(std::exchange(other.block_, nullptr)) {}
  PoolBlock& operator=(PoolBlock&& other) noexcept {
    PoolBlock moved(std::move(other));
    std::swap(pool_, moved.pool_);
    std::swap(block_, moved.block_);
    return *this;
  }
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;
  ~PoolBlock() {
    if (block_ != nullptr) pool_->free(block_);
  }

  [[nodiscard]] void* ptr() const noexcept { return block_ == nullptr ? nullptr : block_->ptr; }
  [[nodiscard]] const std::shared_ptr<PoolImpl>& pool() const noexcept { return pool_; }
  void record_use(cudaStream_t stream) const {
    if (block_ != nullptr) pool_->record_use(block_, stream);
  }

 private:
  std::shared_ptr<PoolImpl> pool_;
  Block* block_ = nullptr;
};

//! Blocks handed out through PoolAllocator, found again by address on deallocate.
class AllocatorTable {
 public:
  static AllocatorTable& instance() {
    static auto* table = new AllocatorTable;
    return *table;
  }
  void insert(PoolBlock block) {
    void* ptr = block.ptr();
    std::lock_guard lock(mutex_);
    blocks_.emplace(ptr, std::move(block));
  }
  //! Removes and returns the block at `ptr`; destroying the result frees it.
  PoolBlock extract(void* ptr) noexcept {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return {};
    PoolBlock block = std::move(it->second);
    blocks_.erase(it);
    return block;
  }
  bool record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(const_cast<void*>(ptr));
    if (it == blocks_.end()) return false;
    it->second.record_use(stream);
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, PoolBlock> blocks_;
};

}  // namespace detail

//! A shared handle to one private pool of device memory. Copyable; empty when default-constructed.
//!
//! A pool hands its memory only to allocations made while a graph captures into it, caches
//! what they free, and gives its memory back to CUDA when the last Pool handle, Graph and
//! tensor that use it are gone. Graphs that share a pool must replay in the order they were
//! captured and never concurrently: a later graph may reuse memory an earlier one freed.
//!
//!     tensorplay::Pool shared = tensorplay::graph_pool_handle();
//!     tensorplay::Graph first({.pool = shared}), second({.pool = shared});
class Pool {
 public:
  Pool() noexcept = default;

  //! The live pool named by `id`; throws usage_error if there is none (never was, or died).
  explicit Pool(PoolId id, std::source_location where = std::source_location::current()) {
    (void)where;
    if (id) impl_ = detail::PoolDirectory::instance().find(id.serial());
    if (!impl_) {
      std::string text = "Pool(PoolId): no live pool has the id ";
      text += id ? std::to_string(id.serial()) : std::string("none");
      text += " (ids come from Pool::id() or Graph::pool_id(), and a pool dies with its last user)";
      detail::throw_usage(std::move(text));
    }
  }

  [[nodiscard]] bool empty() const noexcept { return impl_ == nullptr; }
  explicit operator bool() const noexcept { return impl_ != nullptr; }

  [[nodiscard]] PoolId id() const noexcept { return impl_ ? PoolId(impl_->device(), impl_->serial()) : PoolId(); }
  //! The device of the pool's memory; -1 for an empty handle.
  [[nodiscard]] int device() const noexcept { return impl_ ? impl_->device() : -1; }
  //! Bytes obtained from cudaMalloc and not yet given back.
  [[nodiscard]] std::size_t reserved_bytes() const { return impl_ ? impl_->reserved_bytes() : 0; }
  //! Bytes handed to live allocations (rounded to the pool's 512-byte granularity).
  [[nodiscard]] std::size_t allocated_bytes() const { return impl_ ? impl_->allocated_bytes() : 0; }
  //! Number of handles, graphs and tensors that keep this pool alive (diagnostics).
  [[nodiscard]] long use_count() const noexcept { return impl_.use_count(); }

  friend bool operator==(const Pool& a, const Pool& b) noexcept { return a.impl_ == b.impl_; }
  friend std::ostream& operator<<(std::ostream& os, const Pool& pool) { return os << "Pool(" << pool.id() << ')'; }

  //! Gives CUDA back the memory of the default pools that no tensor uses (like PyTorch's
  //! empty_cache). Graph pools keep theirs: graphs may still use it. Returns the bytes released.
  static std::size_t release_unused_default_memory() noexcept {
    return detail::PoolDirectory::instance().release_unused_default_memory();
  }

  //! The default pool of `device`, which serves allocations made outside any capture.
  static Pool default_for(int device) {
    Pool pool;
    pool.impl_ = detail::PoolDirectory::instance().default_pool(device);
    return pool;
  }

  // Internal: tensorplay's own types reach the implementation through this.
  [[nodiscard]] const std::shared_ptr<detail::PoolImpl>& impl() const noexcept { return impl_; }
  explicit Pool(std::shared_ptr<detail::PoolImpl> impl) noexcept : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::PoolImpl> impl_;
};

//! A new private pool on the current device, not yet used by any graph. Pass it to several
//! graphs (GraphOptions::pool or CaptureOptions::pool) to let them share memory.
[[nodiscard]] inline Pool graph_pool_handle(std::source_location where = std::source_location::current()) {
  return Pool(detail::PoolDirectory::instance().make_graph_pool(detail::current_device(where)));
}

//! A Thrust-compatible allocator drawing from the same pools as DeviceTensor: the capture's
//! pool while the stream is captured, else the default pool of the current device.
//!
//!     thrust::device_vector<float, tensorplay::PoolAllocator<float>> v(n);
//!     tensorplay::PoolAllocator<char> temp(stream);
//!     thrust::sort(thrust::cuda::par_nosync(temp).on(stream), v.begin(), v.end());
//!
//! A default-constructed allocator uses the current stream at each allocation; one built
//! from a stream uses that stream.
template <class T>
class PoolAllocator {
 public:
  using value_type = T;
  using pointer = thrust::device_ptr<T>;
  using const_pointer = thrust::device_ptr<const T>;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using is_always_equal = std::true_type;
  template <class U>
  struct rebind {
    using other = PoolAllocator<U>;
  };

  PoolAllocator() noexcept = default;
  explicit PoolAllocator(StreamRef stream) noexcept : stream_(stream), has_stream_(true) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& other) noexcept  // NOLINT: rebinding copies are implicit
      : stream_(other.stream()), has_stream_(other.has_stream()) {}

  [[nodiscard]] pointer allocate(std::size_t n) {
    const auto where = std::source_location::current();
    detail::PoolBlock block = has_stream_ ? detail::PoolBlock::on_stream(n * sizeof(T), stream_, where)
                                          : detail::PoolBlock::on_current_stream(n * sizeof(T), where);
    T* ptr = static_cast<T*>(block.ptr());
    detail::AllocatorTable::instance().insert(std::move(block));
    return pointer(ptr);
  }

  void deallocate(pointer p, std::size_t) noexcept {
    (void)detail::AllocatorTable::instance().extract(static_cast<void*>(p.get()));
  }

  [[nodiscard]] StreamRef stream() const noexcept { return stream_; }
  [[nodiscard]] bool has_stream() const noexcept { return has_stream_; }

  template <class U>
  friend bool operator==(const PoolAllocator&, const PoolAllocator<U>&) noexcept {
    return true;  // any instance can free what another allocated: blocks are found by address
  }

 private:
  StreamRef stream_{};
  bool has_stream_ = false;
};

//! Declares that memory from PoolAllocator is used on `stream` too (besides the stream it was
//! allocated on), so that the pool does not hand it out again before that use completes.
//! For DeviceTensor, call its record_stream member. Throws usage_error for other pointers.
inline void record_stream(const void* pool_allocated, StreamRef stream,
                          std::source_location where = std::source_location::current()) {
  (void)where;
  if (!detail::AllocatorTable::instance().record_use(pool_allocated, stream))
    detail::throw_usage("record_stream: the pointer was not allocated by a tensorplay::PoolAllocator");
}

}  // namespace tensorplay

template <>
struct std::hash<tensorplay::PoolId> {
  std::size_t operator()(tensorplay::PoolId id) const noexcept {
    return std::hash<std::uint64_t>{}(id.serial()) ^ (static_cast<std::size_t>(id.device()) << 56);
  }
};
