// tensorplay/detail/capture_context.hpp: what an open capture allocates from, and where an
// allocation goes (the pool of the capture its stream belongs to, or the device's default pool).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

class PoolImpl;  // detail/caching_allocator.hpp
struct Block;

//! What an open capture allocates from. A graph with no pool of its own gets a fresh private
//! pool on the first allocation of its capture: most captures allocate nothing, and making a
//! pool for each would cost them a third of a microsecond.
class CaptureContext {
 public:
  //! A capture on `stream` starts: `pool` is the graph's pool, or null for "make one when
  //! needed"; `seq` is the capture's sequence id, or 0 when CUDA has not been asked yet.
  //! Called before the context is registered: no other thread can reach it yet.
  void open(int device, cudaStream_t stream, CaptureSeq seq, std::shared_ptr<PoolImpl> pool) noexcept;

  //! The stream the capture began on (its bodies are captures of their own, on other streams).
  [[nodiscard]] cudaStream_t origin() const noexcept { return stream_; }

  //! The capture's pool, made now if it has none yet.
  std::shared_ptr<PoolImpl> pool();

  void body_opened(CaptureSeq seq);

  //! A body closed; `parent_seq` 0 means the capture itself is its parent.
  void body_closed(CaptureSeq body_seq, cudaStream_t body_stream, CaptureSeq parent_seq, cudaStream_t parent_stream) noexcept;

  //! The capture ended: the pool (null if none was made) settles what the capture freed.
  std::shared_ptr<PoolImpl> close() noexcept;

 private:
  // The capture's sequence id, asked of CUDA the first time it is needed. Mutex held.
  CaptureSeq sequence() noexcept;

  std::mutex mutex_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  CaptureSeq seq_ = 0;              // 0 until asked (see sequence())
  std::vector<CaptureSeq> bodies_;  // open conditional bodies
  std::shared_ptr<PoolImpl> pool_;
};

//! The device of an allocation's stream, asked of a caller's callable only when the default
//! pool is the answer (the device of a capturing stream is the capture's, and CUDA will not
//! tell it while the stream captures). Refers to the callable: lives no longer than the call.
class DeviceQuery {
 public:
  template <class F>
  explicit DeviceQuery(const F& f) noexcept
      : context_(&f), call_([](const void* context) { return (*static_cast<const F*>(context))(); }) {}
  int operator()() const { return call_(context_); }

 private:
  const void* context_;
  int (*call_)(const void*);
};

//! One allocation: keeps its pool alive, gives the block back on destruction.
class PoolBlock {
 public:
  PoolBlock() noexcept = default;
  //! `bytes` for use on `stream`, from the pool of the capture `stream` belongs to, or else
  //! from the default pool of the device `device_of()` names.
  PoolBlock(std::size_t bytes, cudaStream_t stream, DeviceQuery device_of, const tensorplay::source_location& where);
  template <class DeviceOf>
  PoolBlock(std::size_t bytes, cudaStream_t stream, const DeviceOf& device_of, const tensorplay::source_location& where)
      : PoolBlock(bytes, stream, DeviceQuery(device_of), where) {}
  //! For use on this thread's current stream of the current device.
  static PoolBlock on_current_stream(std::size_t bytes, const tensorplay::source_location& where);

  PoolBlock(PoolBlock&& other) noexcept;
  PoolBlock& operator=(PoolBlock&& other) noexcept;
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;
  ~PoolBlock();

  [[nodiscard]] void* ptr() const noexcept;
  [[nodiscard]] const std::shared_ptr<PoolImpl>& pool() const noexcept { return pool_; }
  //! The device of the pool's memory; -1 when empty.
  [[nodiscard]] int device() const noexcept;
  void record_use(cudaStream_t stream) const;

 private:
  std::shared_ptr<PoolImpl> pool_;
  Block* block_ = nullptr;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/caching_allocator.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/pool_directory.hpp>
#include <tensorplay/detail/thread_streams.hpp>

namespace tensorplay::detail {

//! Where an allocation on `stream` goes: the pool of the capture the stream belongs to, or
//! the default pool of the stream's device when the stream is not being captured.
struct Route {
  std::shared_ptr<PoolImpl> pool;
  CaptureSeq seq;
};

//! `device_of()` is asked only when the default pool is the answer: the device of a
//! capturing stream is the capture's (and CUDA will not tell it while the stream captures).
TENSORPLAY_DECL Route route_allocation(cudaStream_t stream, const DeviceQuery& device_of, const tensorplay::source_location& where) {
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

TENSORPLAY_DECL PoolBlock::PoolBlock(std::size_t bytes, cudaStream_t stream, DeviceQuery device_of, const tensorplay::source_location& where) {
  Route route = route_allocation(stream, device_of, where);
  block_ = route.pool->allocate(bytes, stream, route.seq, where);
  pool_ = std::move(route.pool);
}

TENSORPLAY_DECL void CaptureContext::open(int device, cudaStream_t stream, CaptureSeq seq, std::shared_ptr<PoolImpl> pool) noexcept {
  device_ = device;
  stream_ = stream;
  seq_ = seq;
  bodies_.clear();
  pool_ = std::move(pool);
}

TENSORPLAY_DECL std::shared_ptr<PoolImpl> CaptureContext::pool() {
  std::lock_guard lock(mutex_);
  if (!pool_) {
    auto pool = PoolDirectory::instance().make_graph_pool(device_);
    (void)pool->try_begin_capture(sequence());  // a fresh pool: nobody else captures into it
    for (CaptureSeq body : bodies_) pool->add_body_sequence(body);
    pool_ = std::move(pool);
  }
  return pool_;
}

TENSORPLAY_DECL void CaptureContext::body_opened(CaptureSeq seq) {
  std::lock_guard lock(mutex_);
  bodies_.push_back(seq);
  if (pool_) pool_->add_body_sequence(seq);
}

TENSORPLAY_DECL void CaptureContext::body_closed(CaptureSeq body_seq, cudaStream_t body_stream, CaptureSeq parent_seq, cudaStream_t parent_stream) noexcept {
  std::lock_guard lock(mutex_);
  std::erase(bodies_, body_seq);
  if (pool_) pool_->end_body_sequence(body_seq, body_stream, parent_seq != 0 ? parent_seq : sequence(), parent_stream);
}

TENSORPLAY_DECL std::shared_ptr<PoolImpl> CaptureContext::close() noexcept {
  std::lock_guard lock(mutex_);
  if (pool_) pool_->end_capture();
  bodies_.clear();
  return std::move(pool_);
}

TENSORPLAY_DECL CaptureSeq CaptureContext::sequence() noexcept {
  if (seq_ == 0) seq_ = capture_seq_or_zero(stream_);
  return seq_;
}

TENSORPLAY_DECL PoolBlock PoolBlock::on_current_stream(std::size_t bytes, const tensorplay::source_location& where) {
  const int device = current_device(where);
  return PoolBlock(bytes, thread_streams().current[static_cast<std::size_t>(device)], [device] { return device; }, where);
}

TENSORPLAY_DECL PoolBlock::PoolBlock(PoolBlock&& other) noexcept : pool_(std::move(other.pool_)), block_(std::exchange(other.block_, nullptr)) {}

TENSORPLAY_DECL PoolBlock& PoolBlock::operator=(PoolBlock&& other) noexcept {
  PoolBlock moved(std::move(other));
  std::swap(pool_, moved.pool_);
  std::swap(block_, moved.block_);
  return *this;
}

TENSORPLAY_DECL PoolBlock::~PoolBlock() {
  if (block_ != nullptr) pool_->free(block_);
}

TENSORPLAY_DECL int PoolBlock::device() const noexcept { return pool_ ? pool_->device() : -1; }

TENSORPLAY_DECL void* PoolBlock::ptr() const noexcept { return block_ == nullptr ? nullptr : block_->ptr; }

TENSORPLAY_DECL void PoolBlock::record_use(cudaStream_t stream) const {
  if (block_ != nullptr) pool_->record_use(block_, stream);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
