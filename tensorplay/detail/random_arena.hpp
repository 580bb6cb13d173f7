// tensorplay/detail/random_arena.hpp: the device memory of RandomState (random.hpp), per device.
//
// A RandomState's counter ({seed, next offset}) is read and advanced by every graph that drew
// from it, and such a graph may be replayed long after the RandomState is gone. Its counter is
// therefore never freed while the process runs: 16 bytes per RandomState, carved from small
// chunks that go back to CUDA at exit. A CUDA user object retained by each graph would free it
// with the last graph instead, but an executable that holds one costs every launch about 2 us
// more of host time (docs/design.md, staging ring): replays would pay for what only their
// destruction needs.
//
// The slot a segment of a capture reads (random_segment.hpp) is graph memory: a block of the
// capture's pool, held until the capture has ended, then given back to the pool like a temporary
// of the capture. The pool keeps it for its graphs, which never run at once, and each run of a
// graph writes its slots before it reads them. Captures that tensorplay did not begin have no
// pool: their slots come from the chunks, for good.
//
// Eager draws use a ring of slots per RandomState (EagerRing), which goes back to a list of
// spares here when its RandomState dies and is taken, as it is, by the next one.
#pragma once

#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/detail/stream_lifetime.hpp>
#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Slots of a RandomState's eager ring. An eager draw writes the next slot; a slot is written
//! again only after this many more draws, once the work issued before the draws of its half of
//! the ring has completed (EagerRing). 256 slots (4 KiB) let the host run 128 eager draws ahead
//! of the GPU before it waits.
inline constexpr std::size_t random_eager_slots = 256;

//! The slots of one RandomState's eager draws, used in turn. Each draw's advance kernel writes
//! its slot on the draw's stream and the user's kernel reads it there next. Before the first
//! draw of each half of the ring, the host waits for an event recorded at the first draw of the
//! other half, after every launch that read this half's slots in the lap before (when those
//! launches ran on the stream of that draw; a launch on another stream must not lag 128 draws
//! behind). Nothing here is thread-safe: the RandomState's mutex guards it.
class EagerRing {
 public:
  explicit EagerRing(kernels::RandomSlot* slots, const tensorplay::source_location& where);

  //! The slot of the next draw. Waits while the GPU is half a ring behind.
  kernels::RandomSlot* next(const tensorplay::source_location& where);

  //! The draw's advance kernel was launched on `stream` (not capturing): the slot is taken.
  void launched(cudaStream_t stream, const tensorplay::source_location& where);

  //! Other work on the counter (a reseed) was launched on `stream`: wait() waits for it too.
  void issued(cudaStream_t stream, const tensorplay::source_location& where);

  //! Blocks until every advance (and reseed) launched so far has run.
  void wait(const tensorplay::source_location& where) const;

 private:
  static constexpr std::size_t half = random_eager_slots / 2;
  kernels::RandomSlot* slots_;
  std::size_t position_ = 0;  // draws so far
  std::array<EventHandle, 2> guard_;  // per half: recorded at the first draw of the other half
  std::array<bool, 2> guarded_{};
  EventHandle last_;  // after the last advance
  bool last_recorded_ = false;
};

//! The device memory of RandomStates on one device. One per device and process; leaked on
//! purpose (graphs may be replayed until exit), its memory given back by an exit handler.
class RandomArena {
 public:
  static RandomArena& on(int device);

  RandomArena(const RandomArena&) = delete;
  RandomArena& operator=(const RandomArena&) = delete;

  [[nodiscard]] int device() const noexcept { return device_; }

  //! A counter for a new RandomState, set to {seed, 0} before this returns. Never freed.
  kernels::RandomCounter* take_counter(unsigned long long seed, const tensorplay::source_location& where);

  //! A slot for a capture that has no pool (not begun by tensorplay). Never freed.
  kernels::RandomSlot* take_slot(const tensorplay::source_location& where);

  //! An eager ring: a spare one (as its last RandomState left it) or a new one.
  std::unique_ptr<EagerRing> take_ring(const tensorplay::source_location& where);

  //! Takes back the ring of a RandomState that dies.
  void give_back(std::unique_ptr<EagerRing> ring) noexcept;

  //! Keeps `block` (a segment's slot, graph memory of the capture whose origin has capture
  //! sequence `root`) allocated until that capture has ended.
  void hold(PoolBlock block, CaptureSeq root);

  //! Gives back the held slots whose captures have ended (their pools keep them for the graphs).
  void sweep() noexcept;

  //! The offset `counter` holds now, read on the arena's own stream.
  unsigned long long read_offset(const kernels::RandomCounter* counter, const tensorplay::source_location& where);

 private:
  explicit RandomArena(int device) noexcept : device_(device) {}

  struct Table {
    std::array<std::atomic<RandomArena*>, config::max_devices> arenas{};
    std::mutex mutex;
  };
  TENSORPLAY_PROCESS_WIDE static Table& table() noexcept;

  struct Held {
    PoolBlock block;
    CaptureSeq root;
  };

  // `count` slots of 16 bytes from the current chunk, or a new one. Mutex held.
  kernels::RandomSlot* carve(std::size_t count, const tensorplay::source_location& where);

  // A synchronous copy on the arena's stream, which no capture uses and no other work shares.
  void copy_now(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, const tensorplay::source_location& where);

  // Once per process, after CUDA made its own (so that this one runs first at exit).
  static void register_exit_handler() noexcept;

  // At exit: gives the chunks, the rings' events and the held blocks back (the process may run
  // static destructors afterwards: the arena stays usable, empty).
  void release_at_exit() noexcept;

  static constexpr std::size_t chunk_slots = 4096;  // 64 KiB: a ring and many counters

  int device_;
  std::mutex mutex_;
  std::vector<void*> chunks_;
  kernels::RandomSlot* next_ = nullptr;
  std::size_t left_ = 0;
  std::vector<std::unique_ptr<EagerRing>> spares_;
  std::vector<Held> held_;
  std::atomic<bool> holding_{false};
  std::mutex copy_mutex_;
  OwnedStream stream_;  // copy_now's; made on first use
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/handles.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL EagerRing::EagerRing(kernels::RandomSlot* slots, const tensorplay::source_location& where) : slots_(slots) {
  for (EventHandle* e : {&guard_[0], &guard_[1], &last_})
    TENSORPLAY_CHECK(cudaEventCreateWithFlags(e->out(), cudaEventDisableTiming), where);
}

TENSORPLAY_DECL kernels::RandomSlot* EagerRing::next(const tensorplay::source_location& where) {
  const std::size_t at = position_ % random_eager_slots;
  if (at % half == 0 && guarded_[at / half]) {
    RelaxedCaptureMode relaxed;  // a wait must not disturb a capture on another thread
    TENSORPLAY_CHECK(cudaEventSynchronize(guard_[at / half].get()), where);
  }
  return &slots_[at];
}

TENSORPLAY_DECL void EagerRing::launched(cudaStream_t stream, const tensorplay::source_location& where) {
  const std::size_t at = position_ % random_eager_slots;
  if (at % half == 0) {
    const std::size_t other = 1 - at / half;  // its slots were read by the launches before this one
    TENSORPLAY_CHECK(event_record(guard_[other].get(), stream), where);
    guarded_[other] = true;
  }
  issued(stream, where);
  ++position_;
}

TENSORPLAY_DECL void EagerRing::issued(cudaStream_t stream, const tensorplay::source_location& where) {
  TENSORPLAY_CHECK(event_record(last_.get(), stream), where);
  last_recorded_ = true;
}

TENSORPLAY_DECL void EagerRing::wait(const tensorplay::source_location& where) const {
  if (!last_recorded_) return;
  RelaxedCaptureMode relaxed;
  TENSORPLAY_CHECK(cudaEventSynchronize(last_.get()), where);
}

TENSORPLAY_DECL RandomArena& RandomArena::on(int device) {
  std::atomic<RandomArena*>& slot = table().arenas[static_cast<std::size_t>(device)];
  RandomArena* arena = slot.load(std::memory_order_acquire);
  if (arena != nullptr) [[likely]]
    return *arena;
  std::lock_guard lock(table().mutex);
  arena = slot.load(std::memory_order_relaxed);
  if (arena == nullptr) {
    arena = new RandomArena(device);
    slot.store(arena, std::memory_order_release);
  }
  return *arena;
}

TENSORPLAY_DECL kernels::RandomCounter* RandomArena::take_counter(unsigned long long seed, const tensorplay::source_location& where) {
  kernels::RandomCounter* counter = nullptr;
  {
    std::lock_guard lock(mutex_);
    counter = reinterpret_cast<kernels::RandomCounter*>(carve(1, where));
  }
  const kernels::RandomCounter value{seed, 0};
  copy_now(counter, &value, sizeof value, cudaMemcpyHostToDevice, where);
  return counter;
}

TENSORPLAY_DECL kernels::RandomSlot* RandomArena::take_slot(const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  return carve(1, where);
}

TENSORPLAY_DECL std::unique_ptr<EagerRing> RandomArena::take_ring(const tensorplay::source_location& where) {
  std::lock_guard lock(mutex_);
  if (!spares_.empty()) {
    std::unique_ptr<EagerRing> ring = std::move(spares_.back());
    spares_.pop_back();
    return ring;
  }
  kernels::RandomSlot* slots = carve(random_eager_slots, where);
  DeviceGuard guard(device_, where);  // the ring's events belong to this device
  return std::make_unique<EagerRing>(slots, where);
}

TENSORPLAY_DECL void RandomArena::give_back(std::unique_ptr<EagerRing> ring) noexcept {
  std::lock_guard lock(mutex_);
  try {
    spares_.push_back(std::move(ring));
  } catch (...) {
    (void)ring.release();  // its slots may still be read: leaked rather than freed under a launch
  }
}

TENSORPLAY_DECL void RandomArena::hold(PoolBlock block, CaptureSeq root) {
  std::lock_guard lock(mutex_);
  held_.push_back({std::move(block), root});
  holding_.store(true, std::memory_order_relaxed);
}

TENSORPLAY_DECL void RandomArena::sweep() noexcept {
  if (!holding_.load(std::memory_order_relaxed)) return;
  std::vector<Held> ended;
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < held_.size();) {
      if (CaptureRegistry::instance().find(held_[i].root) != nullptr) {
        ++i;
        continue;
      }
      try {
        ended.push_back(std::move(held_[i]));
      } catch (...) {
        ++i;  // kept for the next sweep
        continue;
      }
      held_[i] = std::move(held_.back());
      held_.pop_back();
    }
    holding_.store(!held_.empty(), std::memory_order_relaxed);
  }
  // `ended` frees its blocks here, outside the lock: a pool may die with its last block.
}

TENSORPLAY_DECL unsigned long long RandomArena::read_offset(const kernels::RandomCounter* counter, const tensorplay::source_location& where) {
  unsigned long long offset = 0;
  copy_now(&offset, &counter->offset, sizeof offset, cudaMemcpyDeviceToHost, where);
  return offset;
}

TENSORPLAY_DECL auto RandomArena::table() noexcept -> Table& {
  static auto* t = new Table;  // leaked on purpose, like the arenas
  return *t;
}

TENSORPLAY_DECL kernels::RandomSlot* RandomArena::carve(std::size_t count, const tensorplay::source_location& where) {
  static_assert(sizeof(kernels::RandomSlot) == 16 && sizeof(kernels::RandomCounter) == 16);
  if (left_ < count) {
    DeviceGuard guard(device_, where);
    RelaxedCaptureMode relaxed;  // a capture (this thread's or another's) must not be disturbed
    void* chunk = nullptr;
    TENSORPLAY_CHECK(malloc_device(&chunk, chunk_slots * sizeof(kernels::RandomSlot)), where);
    try {
      chunks_.push_back(chunk);
    } catch (...) {
      (void)cudaFree(chunk);
      throw;
    }
    register_exit_handler();
    next_ = static_cast<kernels::RandomSlot*>(chunk);
    left_ = chunk_slots;
  }
  kernels::RandomSlot* slots = next_;
  next_ += count;
  left_ -= count;
  return slots;
}

TENSORPLAY_DECL void RandomArena::copy_now(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, const tensorplay::source_location& where) {
  std::lock_guard lock(copy_mutex_);
  DeviceGuard guard(device_, where);
  RelaxedCaptureMode relaxed;
  if (!stream_) TENSORPLAY_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking), where);
  TENSORPLAY_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_.get()), where);
  TENSORPLAY_CHECK(cudaStreamSynchronize(stream_.get()), where);
}

TENSORPLAY_DECL void RandomArena::register_exit_handler() noexcept {
  static const bool registered = std::atexit([] {
    for (std::atomic<RandomArena*>& arena : table().arenas)
      if (RandomArena* a = arena.load(std::memory_order_acquire)) a->release_at_exit();
  }) == 0;
  (void)registered;
}

TENSORPLAY_DECL void RandomArena::release_at_exit() noexcept {
  std::vector<Held> held;
  std::vector<std::unique_ptr<EagerRing>> spares;
  std::vector<void*> chunks;
  {
    std::lock_guard lock(mutex_);
    held.swap(held_);
    spares.swap(spares_);
    chunks.swap(chunks_);
    left_ = 0;
    holding_.store(false, std::memory_order_relaxed);
  }
  held.clear();
  spares.clear();
  stream_.reset();
  DeviceGuard guard(device_, DeviceGuard::quiet);
  for (void* chunk : chunks) (void)cudaFree(chunk);
  (void)cudaGetLastError();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
