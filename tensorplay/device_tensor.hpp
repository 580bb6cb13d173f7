// tensorplay/device_tensor.hpp: DeviceTensor, an owning, contiguous device array from a Pool.
#pragma once

#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

//! An owning, contiguous, move-only array of `T` in device memory.
//!
//! Its memory comes from the pool of the capture running on the allocation stream, or, outside
//! a capture, from the default pool of the stream's device. The tensor keeps that pool alive,
//! so a tensor allocated during a capture stays valid after its graph is gone.
//!
//!     tensorplay::DeviceTensor<float> x(1 << 20);          // current stream
//!     tensorplay::DeviceTensor<float> y(1 << 20, stream);  // an explicit stream
template <class T>
class DeviceTensor {
  static_assert(std::is_trivially_copyable_v<T>, "DeviceTensor<T>: T must be trivially copyable");

 public:
  using element_type = T;
  using value_type = T;

  //! An empty tensor: no memory, size 0.
  DeviceTensor() noexcept = default;

  //! `n` uninitialised elements, allocated for use on the current stream.
  explicit DeviceTensor(std::size_t n, tensorplay::source_location where = tensorplay::source_location::current())
      : size_(n) {
    if (n == 0) return;
    block_ = detail::PoolBlock::on_current_stream(n * sizeof(T), where);
    remember_block();
  }

  //! `n` uninitialised elements, allocated for use on `stream`.
  DeviceTensor(std::size_t n, StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current())
      : size_(n) {
    if (n == 0) return;
    block_ = detail::PoolBlock(n * sizeof(T), stream.get(), [&] { return stream.device(where); }, where);
    remember_block();
  }

  DeviceTensor(DeviceTensor&& other) noexcept
      : block_(std::move(other.block_)),
        size_(std::exchange(other.size_, 0)),
        data_(std::exchange(other.data_, nullptr)),
        device_(std::exchange(other.device_, -1)) {}
  DeviceTensor& operator=(DeviceTensor&& other) noexcept {
    DeviceTensor moved(std::move(other));
    swap(moved);
    return *this;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() = default;

  void swap(DeviceTensor& other) noexcept {
    std::swap(block_, other.block_);
    std::swap(size_, other.size_);
    std::swap(data_, other.data_);
    std::swap(device_, other.device_);
  }

  //! Frees the memory now, into its pool (inside a capture too: the capture's later allocations
  //! may reuse it, as when the tensor is destroyed); the tensor is then empty.
  void reset() noexcept { DeviceTensor().swap(*this); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  //! Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! The device of the memory; -1 for an empty tensor.
  [[nodiscard]] int device() const noexcept { return device_; }
  //! The pool the memory came from (empty for an empty tensor).
  [[nodiscard]] Pool pool() const noexcept { return Pool(block_.pool()); }

  [[nodiscard]] std::span<T> span() noexcept { return {data(), size_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data(), size_}; }

  //! Declares a use on `stream` besides the allocation stream, so that the memory is not
  //! handed out again before that use completes (inside a capture: before the capture ends).
  void record_stream(StreamRef stream) const { block_.record_use(stream); }

  //! Copies `source` (host memory, `size()` elements) in, ordered on `stream`.
  void copy_from_host(std::span<const T> source, StreamRef stream,
                      tensorplay::source_location where = tensorplay::source_location::current()) {
    require_size(source.size(), "copy_from_host");
    TENSORPLAY_CHECK(cudaMemcpyAsync(data(), source.data(), bytes(), cudaMemcpyHostToDevice, stream), where);
  }
  void copy_from_host(std::span<const T> source, tensorplay::source_location where = tensorplay::source_location::current()) {
    copy_from_host(source, current_stream(where), where);
  }

  //! Copies the elements out after the work already issued to `stream`; waits for it.
  [[nodiscard]] std::vector<T> to_host(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current()) const {
    std::vector<T> out(size_);
    if (size_ == 0) return out;
    TENSORPLAY_CHECK(cudaMemcpyAsync(out.data(), data(), bytes(), cudaMemcpyDeviceToHost, stream), where);
    TENSORPLAY_CHECK(cudaStreamSynchronize(stream), where);
    return out;
  }
  [[nodiscard]] std::vector<T> to_host(tensorplay::source_location where = tensorplay::source_location::current()) const {
    return to_host(current_stream(where), where);
  }

 private:
  void require_size(std::size_t n, const char* what) const {
    if (n != size_)
      detail::throw_usage(std::string("DeviceTensor::") + what + ": " + std::to_string(n) + " elements given for a tensor of " +
                          std::to_string(size_));
  }

  // The block's address and device, kept beside it: stage_and_launch reads both of every tensor
  // at every call, and the block's own are each behind a pointer.
  void remember_block() noexcept {
    data_ = static_cast<T*>(block_.ptr());
    device_ = block_.device();
  }

  detail::PoolBlock block_;
  std::size_t size_ = 0;
  T* data_ = nullptr;
  int device_ = -1;
};

template <class T>
struct tensor_traits<DeviceTensor<T>> {
  using element_type = T;
  static constexpr MemorySpace space = MemorySpace::Device;
  static constexpr bool contiguous = true;
  static T* data(const DeviceTensor<T>& t) noexcept { return const_cast<T*>(t.data()); }
  static std::size_t size(const DeviceTensor<T>& t) noexcept { return t.size(); }
  static int device(const DeviceTensor<T>& t) noexcept { return t.device(); }
};

}  // namespace tensorplay
