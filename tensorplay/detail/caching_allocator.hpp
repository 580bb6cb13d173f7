// tensorplay/detail/caching_allocator.hpp: PoolImpl, the caching device allocator behind Pool.
//
// A pool owns cudaMalloc'd segments and carves them into blocks (best fit, split, coalesce).
// Its addresses never move, and its memory goes back to CUDA only when the pool dies, so an
// address baked into a graph stays valid and exclusive for as long as the graph holds the pool.
//
// The delicate part is *when a freed block may be handed out again*. Each free block carries
// a reuse key:
//   - stream key (stream S, capture sequence Q): reusable by an allocation on S within the
//     same sequence (Q = 0: outside any capture). Stream order makes that safe, both in eager
//     execution and inside a captured graph, where stream order becomes graph edges.
//   - settled: nothing issued or captured so far can still touch it (fresh memory, or every
//     use has completed); reusable by any allocation on any stream. In a graph pool, blocks
//     freed by a capture become settled when that capture ends: graphs that share a pool
//     replay in capture order and never concurrently (the documented contract).
//   - pending: eager uses may still be running; reuse waits for events recorded on every
//     stream that used it (the allocation stream and those declared with record_use).
//   - deferred: freed inside a capture after being used on another stream; not reusable
//     until the capture ends.
//
// Streams die before the memory used on them (a tensor kept after the tensorplay::Stream it was
// allocated on). Before a Stream is destroyed, retire_stream() records one event on it and
// replaces every reference to the stream by that event, so that no CUDA call ever names a
// destroyed stream, and a new stream that happens to get the same handle cannot match a stale key.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/offload.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace tensorplay::detail {

//! An event recorded on a stream just before it was destroyed: work issued to that stream has
//! completed once the event has. Shared by every block that referred to the stream.
struct StreamEndMarker {
  cudaEvent_t event = nullptr;
  StreamEndMarker() = default;
  StreamEndMarker(const StreamEndMarker&) = delete;
  StreamEndMarker& operator=(const StreamEndMarker&) = delete;
  ~StreamEndMarker();
};

struct PendingUse {
  cudaStream_t stream = nullptr;  // null when the use was on a stream that no longer exists
  cudaEvent_t event = nullptr;    // null until recorded (recording waits while the stream captures)
  std::shared_ptr<const StreamEndMarker> ended;  // the destroyed stream's last event
};

struct Block {
  enum class State : std::uint8_t { Allocated, Free, Pending, Deferred };

  char* ptr = nullptr;
  std::size_t size = 0;
  Block* prev = nullptr;  // neighbours inside one segment, in address order
  Block* next = nullptr;
  State state = State::Free;
  bool settled = false;
  cudaStream_t stream = nullptr;  // the allocation stream (free blocks: part of the reuse key);
                                  // null once that stream was destroyed (see `ended`)
  CaptureSeq seq = 0;             // capture sequence of the allocation or of the free
  std::vector<cudaStream_t> uses; // other live streams that used the block (record_use)
  std::vector<std::shared_ptr<const StreamEndMarker>> ended;  // destroyed streams that used it
  std::vector<PendingUse> pending;
};

// Sizes (config.hpp says why): everything is rounded to 512 bytes; small requests share 2 MiB
// segments, mid-size ones 20 MiB segments.
inline constexpr std::size_t round_bytes = config::pool_round_bytes;
inline constexpr std::size_t small_request = config::pool_small_request;
inline constexpr std::size_t small_segment = config::pool_small_segment;
inline constexpr std::size_t mid_request = config::pool_mid_request;
inline constexpr std::size_t mid_segment = config::pool_mid_segment;

constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

//! What PoolImpl::counters reads (Pool::stats gives it as PoolStats).
struct PoolCounters {
  std::size_t reserved_bytes = 0;
  std::size_t allocated_bytes = 0;
  std::size_t peak_allocated_bytes = 0;
  std::size_t segments = 0;
};

//! The handle the pool keeps for a stream. Handle 0 names the legacy default stream, which is a
//! stream like any other here (tensorplay's streams do not synchronise with it); null in a block
//! or a pending use means "no stream any more", so the legacy stream is kept as cudaStreamLegacy.
TENSORPLAY_DECL cudaStream_t pool_stream_key(cudaStream_t stream) noexcept;

constexpr std::size_t segment_size_for(std::size_t bytes) noexcept {
  if (bytes <= small_request) return small_segment;
  if (bytes < mid_request) return mid_segment;
  return round_up(bytes, small_segment);
}

//! Where a pool's memory comes from and how it learns what a stream is capturing. The CUDA
//! backend is the only one the library uses; tests substitute host memory to check the
//! block bookkeeping without a GPU.
struct AllocatorBackend {
  cudaError_t (*allocate)(void** ptr, std::size_t bytes);  // called on the pool's device
  void (*release)(int device, const std::vector<void*>& segments);
  CaptureSeq (*capture_seq)(cudaStream_t stream);  // 0 when the stream is not capturing
};

TENSORPLAY_DECL CaptureSeq cuda_capture_seq(cudaStream_t stream) noexcept;

inline const AllocatorBackend cuda_backend{
    [](void** ptr, std::size_t bytes) {
      RelaxedCaptureMode relaxed;  // a global-mode capture elsewhere must not be invalidated
      return malloc_device(ptr, bytes);
    },
    [](int device, const std::vector<void*>& segments) { CaptureRegistry::instance().release_segments(device, segments); },
    &cuda_capture_seq,
};

class PoolImpl {
 public:
  enum class Kind : std::uint8_t { Default, Graph };

  PoolImpl(int device, std::uint64_t serial, Kind kind, const AllocatorBackend& backend = cuda_backend) noexcept;
  PoolImpl(const PoolImpl&) = delete;
  PoolImpl& operator=(const PoolImpl&) = delete;

  ~PoolImpl();

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }
  [[nodiscard]] Kind kind() const noexcept { return kind_; }

  [[nodiscard]] std::size_t reserved_bytes() const;
  [[nodiscard]] std::size_t allocated_bytes() const;

  //! The pool's ledger in one read under the mutex (Pool::stats): reserved as reserved_bytes()
  //! says, live bytes, their high-water mark, and the segments behind the reservation.
  [[nodiscard]] PoolCounters counters() const;
  //! Starts the high-water mark again from the bytes allocated now.
  void reset_peak() noexcept;

  //! A block of at least `bytes` for use on `stream`, within capture sequence `seq` (0: eager).
  Block* allocate(std::size_t bytes, cudaStream_t stream, CaptureSeq seq, const tensorplay::source_location& where);

  //! Gives `block` back. Never throws: it runs in destructors.
  void free(Block* block) noexcept;

  //! `stream` is about to be destroyed: every reference to it is replaced by an event recorded
  //! on it now (one per pool, shared by the blocks). `make_marker` records that event; it returns
  //! null when it cannot (the stream captures), and the blocks then wait for the pool's end.
  template <class MakeMarker>
  void retire_stream(cudaStream_t stream, MakeMarker&& make_marker) noexcept {
    std::lock_guard lock(mutex_);
    std::shared_ptr<const StreamEndMarker> marker;
    bool asked = false;
    auto get_marker = [&] {
      if (!asked) {
        asked = true;
        marker = make_marker();
      }
      return marker;
    };
    std::vector<Block*> now_pending;
    auto wait_for_marker = [&](Block* b) {
      if (auto m = get_marker()) b->ended.push_back(std::move(m));
      else b->seq = never_reused;
    };
    for_each_block([&](Block* b) {
      const bool used_there = std::erase(b->uses, stream) > 0;
      if (used_there && b->state == Block::State::Allocated && b->stream != stream) wait_for_marker(b);
      if (b->stream != stream) return;
      switch (b->state) {
        case Block::State::Allocated:
          b->stream = nullptr;
          wait_for_marker(b);
          return;
        case Block::State::Free:
          if (b->settled) return;  // keyed by no stream
          free_.erase(b);
          b->stream = nullptr;
          b->state = Block::State::Pending;
          b->pending.clear();
          if (auto m = get_marker()) b->pending.push_back({nullptr, nullptr, std::move(m)});
          else b->seq = never_reused;
          now_pending.push_back(b);
          return;
        case Block::State::Pending:
        case Block::State::Deferred:
          b->stream = nullptr;
          return;
      }
    });
    for (Block* b : pending_) {
      for (PendingUse& use : b->pending) {
        if (use.stream != stream) continue;
        use.stream = nullptr;
        if (use.event == nullptr) {
          // Not recorded yet (the stream was capturing when the block was freed).
          if (auto m = get_marker()) use.ended = std::move(m);
          else b->seq = never_reused;
        }
      }
    }
    for (Block* b : now_pending) pending_.push_back(b);
  }

  //! Declares that `block` is used on `stream` too, besides its allocation stream.
  void record_use(Block* block, cudaStream_t stream);

  //! Gives CUDA back every segment no block of which is in use. Only for the default pools:
  //! a graph pool's free memory may still be baked into a graph. Returns the bytes released.
  std::size_t release_unused_segments() noexcept;

  //! Calls f(ptr, size, is_allocated) for every block, in address order per segment (checks, diagnostics).
  template <class F>
  void visit_blocks(F&& f) const {
    std::lock_guard lock(mutex_);
    for (const Block* head : segments_)
      for (const Block* b = head; b != nullptr; b = b->next)
        f(static_cast<const void*>(b->ptr), b->size, b->state == Block::State::Allocated);
  }

  //! Number of blocks in the free set (checks).
  [[nodiscard]] std::size_t free_block_count() const;

  // ---- sleep and wake (offloadable pools: offload.hpp) ------------------------------------

  //! Makes the pool offloadable: its segments come from `state` (reserved address ranges). Called
  //! once, before the pool is shared or has a segment.
  void make_offloadable(std::unique_ptr<OffloadState> state) noexcept;
  [[nodiscard]] bool offloadable() const noexcept { return offload_ != nullptr; }

  //! Whether the pool's blocks are in host memory now. One relaxed load, for replay's check.
  [[nodiscard]] bool offloaded() const noexcept;

  //! \throws usage_error naming the pool when it is offloaded; `what` names the refused call.
  void require_resident(const char* what) const;

  //! Pool::offload: after the work queued on `stream` and the pool's tracked uses, copies every
  //! live block to host memory and releases the device memory; the addresses stay reserved.
  void offload(cudaStream_t stream, const tensorplay::source_location& where);

  //! Pool::restore: backs the reserved addresses with device memory again and copies every block back.
  void restore(cudaStream_t stream, const tensorplay::source_location& where);

  // ---- capture bookkeeping (graph pools) ------------------------------------------------

  //! Marks the start of a capture into this pool. One capture at a time per pool.
  [[nodiscard]] bool try_begin_capture(CaptureSeq seq);

  //! A conditional body opened inside the capture: allocations on its stream use sequence `seq`.
  void add_body_sequence(CaptureSeq seq);

  //! A body closed: everything it allocated now belongs to the parent stream and sequence,
  //! because the body's conditional node completes before later work on the parent stream.
  void end_body_sequence(CaptureSeq body_seq, cudaStream_t body_stream, CaptureSeq parent_seq,
                         cudaStream_t parent_stream) noexcept;

  //! The capture ended (or was abandoned): every block it freed becomes reusable by later captures.
  void end_capture() noexcept;

 private:
  static std::uintptr_t bits(const void* p) noexcept;

  // ---- sleep and wake internals -----------------------------------------------------------

  [[nodiscard]] std::string name() const;

  [[noreturn]] void throw_offloaded(const char* what) const;

  // Mutex held. Mapping and unmapping synchronise like cudaFree: not while anything captures.
  void check_can_change_residence(const char* what, cudaStream_t stream) const;

  // Keeps offloaded_ equal to where the blocks are, however offload or restore ends.
  struct FollowResidence {
    PoolImpl& pool;
    ~FollowResidence();
  };

  // Mutex held. The live blocks as runs of adjacent live bytes, and what may still use them:
  // the streams that allocated or used them (record_use), the events of uses on streams that no
  // longer exist, and the events of blocks freed while eager work may still touch them.
  void collect_live(std::vector<HostRun>& runs, PendingWork& work) const;

  // Mutex held, on the pool's device: a new segment from the reserved address ranges.
  void allocate_offloadable(void** ptr, std::size_t bytes, const tensorplay::source_location& where);

  struct FreeOrder {
    static auto key(const Block* b) noexcept {
      return std::make_tuple(b->settled, bits(b->stream), b->seq, b->size, bits(b->ptr));
    }
    bool operator()(const Block* a, const Block* b) const noexcept;
  };

  template <class F>
  void for_each_block(F&& f) {
    for (Block* head : segments_)
      for (Block* b = head; b != nullptr;) f(std::exchange(b, b->next));
  }

  Block* find(bool settled, cudaStream_t stream, CaptureSeq seq, std::size_t size);

  Block* take_free(cudaStream_t stream, CaptureSeq seq, std::size_t size);

  Block* new_segment(std::size_t size, const tensorplay::source_location& where);

  //! Cuts an allocated block down to `size`; the rest becomes a free block with its old key.
  void split(Block* block, std::size_t size);

  static bool same_key(const Block* a, const Block* b) noexcept;

  //! Changes a block's reuse key in place, without merging (safe while walking a segment).
  void rekey(Block* b, bool settled, cudaStream_t stream, CaptureSeq seq);

  //! Merges every run of adjacent free blocks that share a key.
  void coalesce();

  //! Merges b's next neighbour into b: the neighbour leaves the free set and is deleted.
  //! b itself must not be in the free set (its size changes).
  void absorb_next(Block* b);

  //! Puts a block into the free set under its current key, merging with free neighbours of the same key.
  void insert_free(Block* b);

  //! Frees a block that nothing can touch any more: any stream may reuse it.
  void settle_and_insert(Block* b);

  cudaEvent_t spare_event();

  //! Records the event of a pending use, unless its stream is being captured right now (then
  //! a later poll records it: an event recorded later covers at least the same work).
  bool try_record(PendingUse& use) noexcept;

  //! Moves pending blocks whose uses have all completed into the free set. Relaxed capture
  //! mode: this runs inside captures (an allocation in a capture polls), and CUDA refuses
  //! cudaEventQuery and cudaEventRecord from a thread with a capture open (thread_local and
  //! global modes), which would invalidate that capture; the events here are eager ones.
  void poll_pending() noexcept;

  // The `seq` of a block whose last use cannot be waited for (its stream was destroyed while a
  // capture not made by tensorplay ran on it): the block is never handed out again.
  static constexpr CaptureSeq never_reused = ~CaptureSeq{0};

  const int device_;
  const std::uint64_t serial_;
  const Kind kind_;
  const AllocatorBackend* backend_;
  mutable std::mutex mutex_;
  std::vector<Block*> segments_;  // first block of each segment
  std::set<Block*, FreeOrder> free_;
  std::vector<Block*> pending_;
  std::vector<Block*> deferred_;
  std::vector<cudaEvent_t> spare_events_;
  std::vector<CaptureSeq> capture_seqs_;  // the open capture's sequences: main first, then open bodies
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
  std::size_t peak_allocated_ = 0;  // the most allocated_ has been (since reset_peak)
  // Offloadable pools only: their segments and host copy (offload.hpp); offloaded_ is read without
  // the mutex by replay's check (require_resident), written with it held.
  std::unique_ptr<OffloadState> offload_;
  std::atomic<bool> offloaded_{false};
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL StreamEndMarker::~StreamEndMarker() {
  if (event != nullptr) (void)cudaEventDestroy(event);
}

TENSORPLAY_DECL cudaStream_t pool_stream_key(cudaStream_t stream) noexcept { return stream == nullptr ? cudaStreamLegacy : stream; }

TENSORPLAY_DECL CaptureSeq cuda_capture_seq(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CaptureSeq seq = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &seq) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return status == cudaStreamCaptureStatusActive ? seq : 0;
}

TENSORPLAY_DECL PoolImpl::PoolImpl(int device, std::uint64_t serial, Kind kind, const AllocatorBackend& backend) noexcept : device_(device), serial_(serial), kind_(kind), backend_(&backend) {}

TENSORPLAY_DECL PoolImpl::~PoolImpl() {
  // Events first: pending blocks hold some, and the blocks are deleted below.
  for (Block* b : pending_)
    for (PendingUse& use : b->pending)
      if (use.event != nullptr) (void)cudaEventDestroy(use.event);
  for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
  std::vector<void*> segments;
  for (Block* head : segments_) {
    segments.push_back(head->ptr);
    for (Block* b = head; b != nullptr;) delete std::exchange(b, b->next);
  }
  if (offload_) offload_->segments().release(segments);  // an offloadable pool's own backend
  else backend_->release(device_, segments);
}

TENSORPLAY_DECL std::size_t PoolImpl::reserved_bytes() const {
  std::lock_guard lock(mutex_);
  return offload_ ? offload_->segments().backed_bytes() : reserved_;  // offloaded: what it still holds
}

TENSORPLAY_DECL std::size_t PoolImpl::allocated_bytes() const {
  std::lock_guard lock(mutex_);
  return allocated_;
}

TENSORPLAY_DECL PoolCounters PoolImpl::counters() const {
  std::lock_guard lock(mutex_);
  return {offload_ ? offload_->segments().backed_bytes() : reserved_, allocated_, peak_allocated_, segments_.size()};
}

TENSORPLAY_DECL void PoolImpl::reset_peak() noexcept {
  std::lock_guard lock(mutex_);
  peak_allocated_ = allocated_;
}

TENSORPLAY_DECL Block* PoolImpl::allocate(std::size_t bytes, cudaStream_t stream, CaptureSeq seq, const tensorplay::source_location& where) {
  stream = pool_stream_key(stream);
  const std::size_t size = round_up(bytes > 1 ? bytes : std::size_t{1}, round_bytes);
  std::lock_guard lock(mutex_);
  if (offloaded_.load(std::memory_order_relaxed)) [[unlikely]]
    throw_offloaded("an allocation");
  if (!pending_.empty()) poll_pending();
  Block* block = take_free(stream, seq, size);
  if (block == nullptr) block = new_segment(size, where);
  // Allocated before the split, so the tail cannot merge back into it.
  block->state = Block::State::Allocated;
  split(block, size);
  block->settled = false;
  block->stream = stream;
  block->seq = seq;
  block->uses.clear();
  allocated_ += block->size;
  if (allocated_ > peak_allocated_) peak_allocated_ = allocated_;
  return block;
}

TENSORPLAY_DECL void PoolImpl::free(Block* block) noexcept {
  std::lock_guard lock(mutex_);
  allocated_ -= block->size;
  if (!capture_seqs_.empty() && block->stream != nullptr) {
    const CaptureSeq seq = backend_->capture_seq(block->stream);
    if (seq != 0 && contains(capture_seqs_, seq)) {
      if (block->uses.empty()) {
        block->seq = seq;
        insert_free(block);
      } else {
        block->state = Block::State::Deferred;  // used on another stream: wait for the capture's end
        deferred_.push_back(block);
      }
      return;
    }
  }
  if (kind_ == Kind::Default && block->uses.empty() && block->ended.empty() && block->stream != nullptr) {
    block->seq = 0;
    insert_free(block);
    return;
  }
  // Eager uses may still run on several streams (or, for a graph pool, the block will next
  // go to whatever stream a later capture uses): wait until every use has completed.
  block->state = Block::State::Pending;
  block->pending.clear();
  if (block->stream != nullptr) block->pending.push_back({block->stream, nullptr, nullptr});
  for (cudaStream_t s : block->uses) block->pending.push_back({s, nullptr, nullptr});
  for (auto& marker : block->ended) block->pending.push_back({nullptr, nullptr, std::move(marker)});
  block->ended.clear();
  {
    RelaxedCaptureMode relaxed;  // as in poll_pending
    for (PendingUse& use : block->pending) (void)try_record(use);  // now, while the streams surely exist
  }
  pending_.push_back(block);
}

TENSORPLAY_DECL void PoolImpl::record_use(Block* block, cudaStream_t stream) {
  stream = pool_stream_key(stream);
  std::lock_guard lock(mutex_);
  if (stream == block->stream) return;
  if (!contains(block->uses, stream)) block->uses.push_back(stream);
}

TENSORPLAY_DECL std::size_t PoolImpl::release_unused_segments() noexcept {
  std::vector<void*> released;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    // Blocks waiting for events (their streams were destroyed, or used them last) are free once
    // the events completed; without this poll they would keep their segments at exit.
    if (!pending_.empty()) poll_pending();
    // A segment is unused when all its blocks are free, whatever their stream keys:
    // cudaFree waits for all work on the device, so no stream order is left to respect.
    std::erase_if(segments_, [&](Block* head) {
      for (const Block* b = head; b != nullptr; b = b->next)
        if (b->state != Block::State::Free) return false;
      released.push_back(head->ptr);
      for (Block* b = head; b != nullptr;) {
        free_.erase(b);
        reserved_ -= b->size;
        bytes += b->size;
        delete std::exchange(b, b->next);
      }
      return true;
    });
  }
  if (!released.empty()) {
    if (offload_) offload_->segments().release(released);
    else backend_->release(device_, released);
  }
  return bytes;
}

TENSORPLAY_DECL std::size_t PoolImpl::free_block_count() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

TENSORPLAY_DECL void PoolImpl::make_offloadable(std::unique_ptr<OffloadState> state) noexcept { offload_ = std::move(state); }

TENSORPLAY_DECL bool PoolImpl::offloaded() const noexcept { return offloaded_.load(std::memory_order_relaxed); }

TENSORPLAY_DECL void PoolImpl::require_resident(const char* what) const {
  if (offloaded()) [[unlikely]]
    throw_offloaded(what);
}

TENSORPLAY_DECL void PoolImpl::offload(cudaStream_t stream, const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  check_can_change_residence("Pool::offload", stream);
  if (offloaded()) throw_usage("Pool::offload: " + name() + " is offloaded already; Pool::restore it first");
  if (!pending_.empty()) poll_pending();
  std::vector<HostRun> runs;
  PendingWork work;
  collect_live(runs, work);
  DeviceGuard on_device(device_, where);
  FollowResidence follow{*this};
  offload_->offload(std::move(runs), work, stream, name(), where);
}

TENSORPLAY_DECL void PoolImpl::restore(cudaStream_t stream, const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  check_can_change_residence("Pool::restore", stream);
  if (!offloaded()) throw_usage("Pool::restore: " + name() + " is not offloaded (restore follows Pool::offload)");
  DeviceGuard on_device(device_, where);
  FollowResidence follow{*this};
  offload_->restore(stream, name(), where);
}

TENSORPLAY_DECL bool PoolImpl::try_begin_capture(CaptureSeq seq) {
  std::lock_guard lock(mutex_);
  if (!capture_seqs_.empty()) return false;
  if (offloaded_.load(std::memory_order_relaxed)) return false;  // callers check require_resident first, for the message
  capture_seqs_.push_back(seq);
  return true;
}

TENSORPLAY_DECL void PoolImpl::add_body_sequence(CaptureSeq seq) {
  std::lock_guard lock(mutex_);
  capture_seqs_.push_back(seq);
}

TENSORPLAY_DECL void PoolImpl::end_body_sequence(CaptureSeq body_seq, cudaStream_t body_stream, CaptureSeq parent_seq,
    cudaStream_t parent_stream) noexcept {
  std::lock_guard lock(mutex_);
  for_each_block([&](Block* b) {
    if (b->seq == body_seq && b->stream == body_stream) rekey(b, false, parent_stream, parent_seq);
  });
  coalesce();
  std::erase(capture_seqs_, body_seq);
}

TENSORPLAY_DECL void PoolImpl::end_capture() noexcept {
  std::lock_guard lock(mutex_);
  for_each_block([&](Block* b) {
    if (b->state == Block::State::Free && b->seq != 0) rekey(b, true, nullptr, 0);
  });
  for (Block* b : deferred_) settle_and_insert(b);
  coalesce();
  deferred_.clear();
  capture_seqs_.clear();
}

TENSORPLAY_DECL std::uintptr_t PoolImpl::bits(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

TENSORPLAY_DECL std::string PoolImpl::name() const { return "pool #" + std::to_string(serial_) + " (device " + std::to_string(device_) + ")"; }

TENSORPLAY_DECL void PoolImpl::throw_offloaded(const char* what) const {
  throw_usage(std::string(what) + " refused: " + name() +
              " is offloaded (Pool::offload released its device memory); call Pool::restore first");
}

TENSORPLAY_DECL void PoolImpl::check_can_change_residence(const char* what, cudaStream_t stream) const {
  if (!offload_)
    throw_usage(std::string(what) + ": " + name() +
                " is not offloadable; make it with graph_pool_handle({.offloadable = true})");
  if (!capture_seqs_.empty())
    throw_usage(std::string(what) + ": a capture into " + name() + " is open; end it first");
  if (CaptureRegistry::instance().any_open() || is_capturing_or_false(stream))
    throw_usage(std::string(what) + ": a capture is open; mapping and releasing device memory synchronises the "
                "device like cudaFree, which would break it: call this between captures");
  if (const int on = stream_device_or_none(stream); on >= 0 && on != device_)
    throw_usage(std::string(what) + ": the stream belongs to device " + std::to_string(on) + ", " + name() +
                " to device " + std::to_string(device_));
}

TENSORPLAY_DECL PoolImpl::FollowResidence::~FollowResidence() { pool.offloaded_.store(pool.offload_->on_host(), std::memory_order_relaxed); }

TENSORPLAY_DECL void PoolImpl::collect_live(std::vector<HostRun>& runs, PendingWork& work) const {
  auto add_stream = [&](cudaStream_t s) {
    if (s != nullptr && !contains(work.streams, s)) work.streams.push_back(s);
  };
  for (const Block* head : segments_) {
    const std::size_t first = runs.size();  // runs never span two segments (two allocations)
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (b->state != Block::State::Allocated) continue;
      if (runs.size() > first && runs.back().device + runs.back().bytes == b->ptr) runs.back().bytes += b->size;
      else runs.push_back({b->ptr, b->size, 0});
      add_stream(b->stream);
      for (cudaStream_t s : b->uses) add_stream(s);
      for (const auto& marker : b->ended) work.events.push_back(marker->event);
    }
  }
  for (const Block* b : pending_) {
    for (const PendingUse& use : b->pending) {
      if (use.ended) work.events.push_back(use.ended->event);
      else if (use.event != nullptr) work.events.push_back(use.event);
      else add_stream(use.stream);
    }
  }
}

TENSORPLAY_DECL void PoolImpl::allocate_offloadable(void** ptr, std::size_t bytes, const tensorplay::source_location& where) {
  VmmStatus status = offload_->segments().allocate(ptr, bytes);
  if (status.status == cudaErrorMemoryAllocation) {
    CaptureRegistry::instance().drain();  // memory waiting for a capture to end may be free now
    status = offload_->segments().allocate(ptr, bytes);
  }
  check(status.status, status.call, where);
}

TENSORPLAY_DECL bool PoolImpl::FreeOrder::operator()(const Block* a, const Block* b) const noexcept { return key(a) < key(b); }

TENSORPLAY_DECL Block* PoolImpl::find(bool settled, cudaStream_t stream, CaptureSeq seq, std::size_t size) {
  Block probe;
  probe.settled = settled;
  probe.stream = stream;
  probe.seq = seq;
  probe.size = size;
  probe.ptr = nullptr;
  auto it = free_.lower_bound(&probe);
  if (it == free_.end()) return nullptr;
  Block* b = *it;
  if (b->settled != settled || b->stream != stream || b->seq != seq) return nullptr;
  free_.erase(it);
  return b;
}

TENSORPLAY_DECL Block* PoolImpl::take_free(cudaStream_t stream, CaptureSeq seq, std::size_t size) {
  if (Block* b = find(false, stream, seq, size)) return b;
  return find(true, nullptr, 0, size);
}

TENSORPLAY_DECL Block* PoolImpl::new_segment(std::size_t size, const tensorplay::source_location& where) {
  const std::size_t bytes = segment_size_for(size);
  void* ptr = nullptr;
  {
    std::optional<DeviceGuard> guard;
    if (backend_ == &cuda_backend || offload_) guard.emplace(device_, where);
    if (offload_) {
      allocate_offloadable(&ptr, bytes, where);
    } else {
      cudaError_t status = backend_->allocate(&ptr, bytes);
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        CaptureRegistry::instance().drain();  // memory waiting for a capture to end may be free now
        status = backend_->allocate(&ptr, bytes);
      }
      check(status, "cudaMalloc (tensorplay pool segment)", where);
    }
  }
  auto* head = new Block;
  head->ptr = static_cast<char*>(ptr);
  head->size = bytes;
  head->settled = true;  // fresh memory: no work uses it yet
  segments_.push_back(head);
  reserved_ += bytes;
  return head;
}

TENSORPLAY_DECL void PoolImpl::split(Block* block, std::size_t size) {
  const std::size_t rest = block->size - size;
  const bool worth = block->size <= small_segment ? rest >= round_bytes : rest > small_request;
  if (!worth) return;
  auto* tail = new Block;
  tail->ptr = block->ptr + size;
  tail->size = rest;
  tail->prev = block;
  tail->next = block->next;
  if (block->next != nullptr) block->next->prev = tail;
  block->next = tail;
  block->size = size;
  // The tail keeps the key the block was found under.
  tail->settled = block->settled;
  tail->stream = block->stream;
  tail->seq = block->seq;
  insert_free(tail);
}

TENSORPLAY_DECL bool PoolImpl::same_key(const Block* a, const Block* b) noexcept {
  return a->settled == b->settled && a->stream == b->stream && a->seq == b->seq;
}

TENSORPLAY_DECL void PoolImpl::rekey(Block* b, bool settled, cudaStream_t stream, CaptureSeq seq) {
  const bool is_free = b->state == Block::State::Free;
  if (is_free) free_.erase(b);
  b->settled = settled;
  b->stream = stream;
  b->seq = seq;
  if (is_free) free_.insert(b);
}

TENSORPLAY_DECL void PoolImpl::coalesce() {
  for (Block* head : segments_) {
    for (Block* b = head; b != nullptr && b->next != nullptr;) {
      Block* n = b->next;
      if (b->state == Block::State::Free && n->state == Block::State::Free && same_key(b, n)) {
        free_.erase(b);  // its size, part of the set's order, is about to change
        absorb_next(b);
        free_.insert(b);
      } else {
        b = n;
      }
    }
  }
}

TENSORPLAY_DECL void PoolImpl::absorb_next(Block* b) {
  Block* n = b->next;
  free_.erase(n);
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  delete n;
}

TENSORPLAY_DECL void PoolImpl::insert_free(Block* b) {
  b->state = Block::State::Free;
  b->uses.clear();
  if (Block* p = b->prev; p != nullptr && p->state == Block::State::Free && same_key(p, b)) {
    free_.erase(p);
    absorb_next(p);  // p takes b
    b = p;
  }
  if (Block* n = b->next; n != nullptr && n->state == Block::State::Free && same_key(n, b)) absorb_next(b);
  free_.insert(b);
}

TENSORPLAY_DECL void PoolImpl::settle_and_insert(Block* b) {
  b->settled = true;
  b->stream = nullptr;
  b->seq = 0;
  insert_free(b);
}

TENSORPLAY_DECL cudaEvent_t PoolImpl::spare_event() {
  if (!spare_events_.empty()) {
    cudaEvent_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  RelaxedCaptureMode relaxed;
  // On the pool's device: an event records only on streams of its own device, and a pool of
  // another device than the current one would otherwise keep its blocks pending for good.
  DeviceGuard on_pool_device(device_, DeviceGuard::quiet);
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

TENSORPLAY_DECL bool PoolImpl::try_record(PendingUse& use) noexcept {
  if (use.event != nullptr || use.ended) return true;
  if (use.stream == nullptr) return false;  // retired without a marker: never completes
  // The legacy and per-thread default streams are the current device's: the pool's, here.
  const bool default_stream = use.stream == cudaStreamLegacy || use.stream == cudaStreamPerThread;
  // A record on the legacy stream while a blocking stream captures (the side and body streams
  // captures use are blocking) would break that capture: recorded at a later poll instead.
  if (use.stream == cudaStreamLegacy && CaptureRegistry::instance().any_open()) return false;
  DeviceGuard on_pool_device(default_stream ? device_ : -1, DeviceGuard::quiet);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(use.stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return false;
  }
  use.event = spare_event();
  if (use.event == nullptr) return false;
  if (event_record(use.event, use.stream) != cudaSuccess) {
    (void)cudaGetLastError();
    spare_events_.push_back(std::exchange(use.event, nullptr));
    return false;
  }
  // Another thread may have begun a capture on the stream between the check and the record:
  // the event then belongs to that capture, and querying it (poll_pending) would invalidate the
  // capture (CUDA_ERROR_CAPTURED_EVENT). Capturing now: the event is recorded again at a later
  // poll, once the stream no longer captures (a record outside a capture makes it eager again).
  if (cudaStreamIsCapturing(use.stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    spare_events_.push_back(std::exchange(use.event, nullptr));
    return false;
  }
  return true;
}

TENSORPLAY_DECL void PoolImpl::poll_pending() noexcept {
  RelaxedCaptureMode relaxed;
  std::erase_if(pending_, [&](Block* b) {
    if (b->seq == never_reused) return false;
    bool done = true;
    for (PendingUse& use : b->pending) {
      if (!try_record(use)) {
        done = false;
        continue;
      }
      const cudaEvent_t event = use.ended ? use.ended->event : use.event;
      if (const cudaError_t status = cudaEventQuery(event); status != cudaSuccess) {
        (void)cudaGetLastError();
        done = false;
        // Not merely pending (a record that joined a capture which has ended since, say):
        // recorded again at the next poll.
        if (status != cudaErrorNotReady && !use.ended) spare_events_.push_back(std::exchange(use.event, nullptr));
      }
    }
    if (!done) return false;
    for (PendingUse& use : b->pending)
      if (use.event != nullptr) spare_events_.push_back(use.event);
    b->pending.clear();
    settle_and_insert(b);
    return true;
  });
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
