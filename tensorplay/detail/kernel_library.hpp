// tensorplay/detail/kernel_library.hpp: the library's own kernels, loaded from the embedded fatbin.
//
// The set-handle kernels of conditional nodes and the copy kernels of stage_and_launch are
// compiled once, by tools/kernels/regenerate, into the fatbin of kernels/fatbin.hpp, and loaded
// with cudaLibraryLoadData on first use. Translation units compiled by g++ or clang++ therefore
// capture conditional nodes and stage inputs exactly as nvcc-compiled ones do: one code path.
// RandomState's advance and reset kernels (random.hpp) live there too, for the same reason.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/error.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>

namespace tensorplay::detail {

//! Decodes standard base64 (the fatbin's encoding in kernels/fatbin.hpp) into `out`.
TENSORPLAY_DECL void decode_base64(const char* text, std::size_t length, unsigned char* out) noexcept;

//! The loaded library and its kernels. One per process; never unloaded (graphs may run kernels of
//! it until the process exits, and the driver frees it then).
class KernelLibrary {
 public:
  //! The library, loaded (on first call) and ready on `device` (its module is loaded there
  //! eagerly, so that the first capture that uses a kernel does not pay for loading it).
  TENSORPLAY_PROCESS_WIDE static const KernelLibrary& on(int device, const tensorplay::source_location& where);

  //! Whether the library is loaded and ready on `device` (on() has succeeded for it).
  TENSORPLAY_PROCESS_WIDE static bool ready_on(int device) noexcept;

  //! The set-handle kernel for a value of type V (bool, or an integral switch index).
  template <class V>
  [[nodiscard]] cudaKernel_t set_handle() const noexcept {
    return set_handle_[set_handle_index<V>()];
  }
  //! The copy kernel whose table holds `1 << log2_capacity` entries.
  [[nodiscard]] cudaKernel_t copy(int log2_capacity) const noexcept;
  //! The copy node's kernel, whose plan holds `1 << log2_capacity` entries (sources from the ring).
  [[nodiscard]] cudaKernel_t ring_copy(int log2_capacity) const noexcept;
  //! The fetch node's kernel (takes a call's sources from the staging ring).
  [[nodiscard]] cudaKernel_t ring_fetch() const noexcept { return ring_fetch_; }
  [[nodiscard]] cudaKernel_t gather() const noexcept { return gather_; }
  //! RandomState's kernels: take offsets for the launches that follow, and reseed.
  [[nodiscard]] cudaKernel_t random_advance() const noexcept { return random_advance_; }
  [[nodiscard]] cudaKernel_t random_reset() const noexcept { return random_reset_; }

  template <class V>
  static constexpr int set_handle_index() noexcept {
    static_assert(std::integral<V>, "tensorplay: a predicate is bool, a switch index an integer");
    if constexpr (std::same_as<V, bool>) {
      return 0;
    } else {
      constexpr int by_size = sizeof(V) == 1 ? 0 : sizeof(V) == 2 ? 1 : sizeof(V) == 4 ? 2 : 3;
      return 1 + 2 * by_size + (std::is_signed_v<V> ? 0 : 1);
    }
  }

 private:
  explicit KernelLibrary(const tensorplay::source_location& where);

  void load(cudaKernel_t& kernel, const char* name, const tensorplay::source_location& where) const;

  // Loads the module on `device` once: asking a kernel's attributes there makes the driver load it.
  void prepare(int device, const tensorplay::source_location& where) const;

  std::unique_ptr<std::uint64_t[]> image_;
  cudaLibrary_t library_ = nullptr;
  std::array<cudaKernel_t, std::size(kernels::set_handle_kernel_names)> set_handle_{};
  std::array<cudaKernel_t, kernels::copy_capacity_count> copy_{};
  std::array<cudaKernel_t, kernels::copy_capacity_count> ring_copy_{};
  cudaKernel_t ring_fetch_ = nullptr;
  cudaKernel_t gather_ = nullptr;
  cudaKernel_t random_advance_ = nullptr;
  cudaKernel_t random_reset_ = nullptr;
  mutable std::mutex mutex_;
  // Per device: loaded there. Apart from the library itself, so that ready_on() never loads it.
  TENSORPLAY_PROCESS_WIDE static std::array<std::atomic<bool>, config::max_devices>& ready_flags() noexcept;
};

//! Launches `kernel(args...)` (a kernel of the library, or a kernel function of an nvcc TU) on
//! `stream` and throws cuda_error if the launch is refused. `programmatic`: the kernel may start
//! before the previous kernel on the stream ends (it waits with cudaGridDependencySynchronize).
TENSORPLAY_DECL void launch(const void* kernel, dim3 grid, dim3 block, cudaStream_t stream, bool programmatic, void** args,
                   const char* what, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/kernels/fatbin.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void decode_base64(const char* text, std::size_t length, unsigned char* out) noexcept {
  auto value = [](char c) -> unsigned {
    if (c >= 'A' && c <= 'Z') return static_cast<unsigned>(c - 'A');
    if (c >= 'a' && c <= 'z') return static_cast<unsigned>(c - 'a' + 26);
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0' + 52);
    return c == '+' ? 62u : 63u;
  };
  std::size_t o = 0;
  for (std::size_t i = 0; i + 3 < length; i += 4) {
    const unsigned quad = value(text[i]) << 18 | value(text[i + 1]) << 12 |
                          (text[i + 2] == '=' ? 0u : value(text[i + 2]) << 6) | (text[i + 3] == '=' ? 0u : value(text[i + 3]));
    out[o++] = static_cast<unsigned char>(quad >> 16);
    if (text[i + 2] != '=') out[o++] = static_cast<unsigned char>(quad >> 8);
    if (text[i + 3] != '=') out[o++] = static_cast<unsigned char>(quad);
  }
}

TENSORPLAY_DECL const KernelLibrary& KernelLibrary::on(int device, const tensorplay::source_location& where) {
  static const KernelLibrary library(where);  // a throw leaves it unloaded: the next call retries
  library.prepare(device, where);
  return library;
}

TENSORPLAY_DECL bool KernelLibrary::ready_on(int device) noexcept { return ready_flags()[static_cast<std::size_t>(device)].load(std::memory_order_acquire); }

TENSORPLAY_DECL cudaKernel_t KernelLibrary::copy(int log2_capacity) const noexcept { return copy_[static_cast<std::size_t>(log2_capacity)]; }

TENSORPLAY_DECL cudaKernel_t KernelLibrary::ring_copy(int log2_capacity) const noexcept { return ring_copy_[static_cast<std::size_t>(log2_capacity)]; }

TENSORPLAY_DECL KernelLibrary::KernelLibrary(const tensorplay::source_location& where) {
#if !defined(__CUDA_ARCH__)  // nvcc's device pass never runs host code, and skips the fatbin
  const std::size_t chars = sizeof(kernels::fatbin_base64) - 1;
  // 8-byte words: the image must be aligned like the ELF data it holds.
  image_ = std::make_unique<std::uint64_t[]>(kernels::fatbin_bytes / 8 + 1);
  decode_base64(kernels::fatbin_base64, chars, reinterpret_cast<unsigned char*>(image_.get()));
#endif
  RelaxedCaptureMode relaxed;  // loading must not disturb a capture on another stream
  TENSORPLAY_CHECK(cudaLibraryLoadData(&library_, image_.get(), nullptr, nullptr, 0, nullptr, nullptr, 0), where);
  for (std::size_t i = 0; i < set_handle_.size(); ++i)
    load(set_handle_[i], kernels::set_handle_kernel_names[i], where);
  for (std::size_t i = 0; i < copy_.size(); ++i) {
    load(copy_[i], kernels::copy_kernel_names[i], where);
    load(ring_copy_[i], kernels::ring_copy_kernel_names[i], where);
  }
  load(ring_fetch_, kernels::ring_fetch_kernel_name, where);
  load(gather_, kernels::gather_kernel_name, where);
  load(random_advance_, kernels::random_advance_kernel_name, where);
  load(random_reset_, kernels::random_reset_kernel_name, where);
}

TENSORPLAY_DECL void KernelLibrary::load(cudaKernel_t& kernel, const char* name, const tensorplay::source_location& where) const {
  check(cudaLibraryGetKernel(&kernel, library_, name), "cudaLibraryGetKernel (tensorplay's own kernels)", where);
}

TENSORPLAY_DECL void KernelLibrary::prepare(int device, const tensorplay::source_location& where) const {
  if (ready_flags()[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) [[likely]]
    return;
  std::lock_guard lock(mutex_);
  if (ready_flags()[static_cast<std::size_t>(device)].load(std::memory_order_relaxed)) return;
  DeviceGuard guard(device, where);
  RelaxedCaptureMode relaxed;
  cudaFuncAttributes attributes{};
  for (cudaKernel_t k : set_handle_) TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(k)), where);
  for (cudaKernel_t k : copy_) TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(k)), where);
  for (cudaKernel_t k : ring_copy_) TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(k)), where);
  TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(ring_fetch_)), where);
  TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(gather_)), where);
  TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(random_advance_)), where);
  TENSORPLAY_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(random_reset_)), where);
  ready_flags()[static_cast<std::size_t>(device)].store(true, std::memory_order_release);
}

TENSORPLAY_DECL std::array<std::atomic<bool>, config::max_devices>& KernelLibrary::ready_flags() noexcept {
  static std::array<std::atomic<bool>, config::max_devices> flags{};
  return flags;
}

TENSORPLAY_DECL void launch(const void* kernel, dim3 grid, dim3 block, cudaStream_t stream, bool programmatic, void** args,
    const char* what, const tensorplay::source_location& where) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = programmatic ? &attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  check(launch_kernel(config, kernel, args), what, where);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
