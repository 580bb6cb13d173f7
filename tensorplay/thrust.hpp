// tensorplay/thrust.hpp: PoolAllocator, a Thrust allocator drawing from tensorplay's pools, and
// record_stream for the memory it hands out. Not included by <tensorplay/graph.hpp>, so that
// translation units without Thrust do not pay for it (thrust::device_vector is a Tensor with
// graph.hpp alone).
#pragma once

#include <tensorplay/detail/allocator_table.hpp>
#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <thrust/device_ptr.h>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace tensorplay {

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
    const auto where = tensorplay::source_location::current();
    const StreamRef stream = stream_;
    detail::PoolBlock block =
        has_stream_ ? detail::PoolBlock(n * sizeof(T), stream.get(), [&] { return stream.device(where); }, where)
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
                          tensorplay::source_location where = tensorplay::source_location::current()) {
  (void)where;
  if (!detail::AllocatorTable::instance().record_use(pool_allocated, stream))
    detail::throw_usage("record_stream: the pointer was not allocated by a tensorplay::PoolAllocator");
}

}  // namespace tensorplay
