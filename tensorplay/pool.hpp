// tensorplay/pool.hpp: PoolId, Pool, graph_pool_handle.
// (PoolAllocator, which needs Thrust, is in <tensorplay/thrust.hpp>.)
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>  // also declares std::hash, specialised below
#include <string>
#include <utility>

namespace tensorplay {

namespace detail {
class PoolImpl;  // detail/caching_allocator.hpp
}  // namespace detail

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
  //! Prints "PoolId(device D, #N)" on any output stream (a template: this header needs no ostream header).
  template <class OStream>
  friend OStream& operator<<(OStream& os, PoolId id) {
    if (!id) {
      os << "PoolId(none)";
    } else {
      os << "PoolId(device " << id.device_ << ", #" << id.serial_ << ')';
    }
    return os;
  }

 private:
  int device_ = -1;
  std::uint64_t serial_ = 0;
};

//! What Pool::stats reports: the pool's own ledger (the executables' memory is the driver's:
//! Graph::executable_bytes).
struct PoolStats {
  std::size_t reserved_bytes = 0;        //!< device memory the pool holds now (what reserved_bytes() says)
  std::size_t allocated_bytes = 0;       //!< bytes of live allocations now (in 512-byte units)
  std::size_t peak_allocated_bytes = 0;  //!< the most allocated_bytes has been since the pool was made (or reset_peak)
  std::size_t segments = 0;              //!< separate device allocations behind reserved_bytes
};

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
  explicit Pool(PoolId id, tensorplay::source_location where = tensorplay::source_location::current());

  [[nodiscard]] bool empty() const noexcept { return impl_ == nullptr; }
  explicit operator bool() const noexcept { return impl_ != nullptr; }

  [[nodiscard]] PoolId id() const noexcept;
  //! The device of the pool's memory; -1 for an empty handle.
  [[nodiscard]] int device() const noexcept;
  //! Bytes obtained from cudaMalloc and not yet given back.
  [[nodiscard]] std::size_t reserved_bytes() const;
  //! Bytes handed to live allocations (rounded to the pool's 512-byte granularity).
  [[nodiscard]] std::size_t allocated_bytes() const;
  //! The pool's ledger, exact and read at once: what it reserved from CUDA, what live
  //! allocations hold, the most they held, and in how many device allocations. All zero for an
  //! empty handle. Takes the pool's lock: for planning and diagnostics, not for a replay loop.
  //!
  //!     tensorplay::PoolStats s = graph.pool().stats();
  //!     std::printf("%zu MiB reserved, peak %zu MiB used\n", s.reserved_bytes >> 20, s.peak_allocated_bytes >> 20);
  [[nodiscard]] PoolStats stats() const;
  //! Starts peak_allocated_bytes again from the bytes allocated now (to find one step's peak).
  void reset_peak() noexcept;
  //! Number of handles, graphs and tensors that keep this pool alive (diagnostics).
  [[nodiscard]] long use_count() const noexcept;

  // ---- sleep and wake (pools made with PoolOptions{.offloadable = true}) -------------------

  //! After the work already queued on `stream` and the other pending uses the pool knows of
  //! (record_use, tensors freed while eager work used them), copies every live block to pinned
  //! host memory, then releases the pool's device memory. Every address stays reserved: tensors
  //! keep their pointers, graphs their baked-in addresses. Returns once the memory is released.
  //! Replays of the pool's graphs on other streams must be ordered before `stream` by the caller.
  //!
  //!     pool.offload(stream);    // sleep: the device memory goes back to CUDA
  //!     pool.restore(stream);    // wake: same addresses, same bytes; graphs replay as before
  //!
  //! \throws usage_error for an empty handle, a pool that is not offloadable or is offloaded
  //!         already, and while any capture is open. cuda_error when CUDA fails: its text says
  //!         whether the pool stayed on the device or is offloaded, every byte intact either way.
  void offload(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current());

  //! Backs the pool's reserved addresses with device memory again and copies every block back,
  //! in order on `stream`; returns once the copies are complete. Graphs of the pool replay
  //! without capturing again.
  //! \throws usage_error for an empty handle, a pool that is not offloaded, and while any capture
  //!         is open. cuda_error when CUDA fails: the pool stays offloaded, and restore may be
  //!         called again.
  void restore(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current());

  //! Whether the pool's blocks live in host memory now (offload succeeded, restore not yet).
  //! While it is, replaying, staging into or capturing into a graph of the pool, and allocating
  //! from it, throw usage_error.
  [[nodiscard]] bool offloaded() const noexcept;

  friend bool operator==(const Pool& a, const Pool& b) noexcept { return a.impl_ == b.impl_; }
  template <class OStream>
  friend OStream& operator<<(OStream& os, const Pool& pool) {
    os << "Pool(" << pool.id() << ')';
    return os;
  }

  //! Gives CUDA back the memory of the default pools that no tensor uses (like PyTorch's
  //! empty_cache). Graph pools keep theirs: graphs may still use it. Returns the bytes released.
  static std::size_t release_unused_default_memory() noexcept;

  //! The default pool of `device`, which serves allocations made outside any capture.
  static Pool default_for(int device);

  // Internal: tensorplay's own types reach the implementation through this.
  [[nodiscard]] const std::shared_ptr<detail::PoolImpl>& impl() const noexcept { return impl_; }
  explicit Pool(std::shared_ptr<detail::PoolImpl> impl) noexcept : impl_(std::move(impl)) {}

 private:
  detail::PoolImpl& require_impl(const char* what) const;

  std::shared_ptr<detail::PoolImpl> impl_;
};

//! How graph_pool_handle(PoolOptions) makes a pool.
struct PoolOptions {
  //! Device memory that Pool::offload can release and Pool::restore give back at the same
  //! addresses (CUDA virtual memory management; see docs/guide.md, "Sleep and wake").
  bool offloadable = false;
};

//! A new private pool on the current device, not yet used by any graph. Pass it to several
//! graphs (GraphOptions::pool or CaptureOptions::pool) to let them share memory.
[[nodiscard]] TENSORPLAY_DECL Pool graph_pool_handle(tensorplay::source_location where = tensorplay::source_location::current());

//! graph_pool_handle() with options: `{.offloadable = true}` makes a pool whose device memory
//! can be released and restored at the same addresses (Pool::offload, Pool::restore).
//!
//!     tensorplay::Pool pool = tensorplay::graph_pool_handle({.offloadable = true});
//!     tensorplay::Graph graph({.pool = pool});
//! \throws cuda_error when the device offers no virtual memory management.
[[nodiscard]] TENSORPLAY_DECL Pool graph_pool_handle(PoolOptions options,
                                            tensorplay::source_location where = tensorplay::source_location::current());

namespace detail {
//! Throws usage_error when `pool` is offloaded (Pool::offload): its addresses have no device
//! memory behind them. One relaxed load when it is not; nothing for an empty handle.
TENSORPLAY_DECL void require_resident(const Pool& pool, const char* what);
}  // namespace detail

}  // namespace tensorplay

// Hidden from Doxygen, which cannot place a specialisation of std::hash.
//! \cond INTERNAL
template <>
struct std::hash<tensorplay::PoolId> {
  std::size_t operator()(tensorplay::PoolId id) const noexcept {
    return std::hash<std::uint64_t>{}(id.serial()) ^ (static_cast<std::size_t>(id.device()) << 56);
  }
};
//! \endcond

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/caching_allocator.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/pool_directory.hpp>

namespace tensorplay {

TENSORPLAY_DECL Pool::Pool(PoolId id, tensorplay::source_location where) {
  (void)where;
  if (id) impl_ = detail::PoolDirectory::instance().find(id.serial());
  if (!impl_) {
    std::string text = "Pool(PoolId): no live pool has the id ";
    text += id ? std::to_string(id.serial()) : std::string("none");
    text += " (ids come from Pool::id() or Graph::pool_id(), and a pool dies with its last user)";
    detail::throw_usage(std::move(text));
  }
}

TENSORPLAY_DECL PoolId Pool::id() const noexcept { return impl_ ? PoolId(impl_->device(), impl_->serial()) : PoolId(); }

TENSORPLAY_DECL int Pool::device() const noexcept { return impl_ ? impl_->device() : -1; }

TENSORPLAY_DECL std::size_t Pool::reserved_bytes() const { return impl_ ? impl_->reserved_bytes() : 0; }

TENSORPLAY_DECL std::size_t Pool::allocated_bytes() const { return impl_ ? impl_->allocated_bytes() : 0; }

TENSORPLAY_DECL PoolStats Pool::stats() const {
  if (!impl_) return {};
  const detail::PoolCounters c = impl_->counters();
  return {c.reserved_bytes, c.allocated_bytes, c.peak_allocated_bytes, c.segments};
}

TENSORPLAY_DECL void Pool::reset_peak() noexcept {
  if (impl_) impl_->reset_peak();
}

TENSORPLAY_DECL long Pool::use_count() const noexcept { return impl_.use_count(); }

TENSORPLAY_DECL void Pool::offload(StreamRef stream, tensorplay::source_location where) {
  require_impl("Pool::offload").offload(stream.get(), where);
}

TENSORPLAY_DECL void Pool::restore(StreamRef stream, tensorplay::source_location where) {
  require_impl("Pool::restore").restore(stream.get(), where);
}

TENSORPLAY_DECL bool Pool::offloaded() const noexcept { return impl_ && impl_->offloaded(); }

TENSORPLAY_DECL void detail::require_resident(const Pool& pool, const char* what) {
  if (const auto& impl = pool.impl()) impl->require_resident(what);
}

TENSORPLAY_DECL std::size_t Pool::release_unused_default_memory() noexcept {
  return detail::PoolDirectory::instance().release_unused_default_memory();
}

TENSORPLAY_DECL Pool Pool::default_for(int device) {
  Pool pool;
  pool.impl_ = detail::PoolDirectory::instance().default_pool(device);
  return pool;
}

TENSORPLAY_DECL detail::PoolImpl& Pool::require_impl(const char* what) const {
  if (!impl_) detail::throw_usage(std::string(what) + ": the Pool handle is empty");
  return *impl_;
}

TENSORPLAY_DECL Pool graph_pool_handle(tensorplay::source_location where) {
  return Pool(detail::PoolDirectory::instance().make_graph_pool(detail::current_device(where)));
}

TENSORPLAY_DECL Pool graph_pool_handle(PoolOptions options,
    tensorplay::source_location where) {
  return Pool(detail::PoolDirectory::instance().make_graph_pool(detail::current_device(where), options.offloadable, where));
}

}  // namespace tensorplay
#endif  // TENSORPLAY_DEFINE_BODIES
