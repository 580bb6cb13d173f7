// tensorplay/detail/copy_kernels.hpp: the batched copy kernel behind stage_and_launch, and the
// gather / convert kernels of its fallback paths.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tensorplay::detail {

//! One device-to-device copy of a batch.
struct CopyEntry {
  const void* src;
  void* dst;
  std::size_t bytes;
};

inline constexpr int copy_block_threads = 256;
inline constexpr int copy_unroll = 4;
//! Bytes one block moves per tile: 256 threads x 4 x 16-byte words.
inline constexpr std::size_t copy_tile_bytes = std::size_t{copy_block_threads} * copy_unroll * 16;
//! Entries one kernel launch carries in its parameters (about 2 KiB of the 4 KiB limit).
inline constexpr int copy_table_capacity = 64;

//! The whole batch, passed by value as the kernel's parameter: no staging buffer to guard,
//! and every launch keeps the table it was given.
struct CopyTable {
  int count = 0;
  std::size_t first_tile[copy_table_capacity + 1] = {};  // prefix sum of tiles per entry
  CopyEntry entries[copy_table_capacity] = {};
};

template <class Word>
__device__ __forceinline__ void copy_words(const char* src, char* dst, std::size_t begin, std::size_t end) {
  // Each thread moves `copy_unroll` words per pass, all loads before the stores.
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  const std::size_t first = begin / sizeof(Word);
  const std::size_t last = end / sizeof(Word);
  for (std::size_t base = first + threadIdx.x; base < last; base += std::size_t{copy_block_threads} * copy_unroll) {
    Word words[copy_unroll];
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const std::size_t i = base + static_cast<std::size_t>(u) * copy_block_threads;
      if (i < last) words[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const std::size_t i = base + static_cast<std::size_t>(u) * copy_block_threads;
      if (i < last) d[i] = words[u];
    }
  }
}

//! Copies every entry of `table`. Blocks walk tiles in grid-stride order; a tile never spans
//! two entries. Entries aligned to 16 (or 4) bytes move in 16-byte (4-byte) words.
template <int Capacity = copy_table_capacity>
__global__ void __launch_bounds__(copy_block_threads) batched_copy_kernel(const CopyTable table) {
  const std::size_t total = table.first_tile[table.count];
  int e = 0;
  for (std::size_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    while (tile >= table.first_tile[e + 1]) ++e;
    const CopyEntry entry = table.entries[e];
    const std::size_t begin = (tile - table.first_tile[e]) * copy_tile_bytes;
    const std::size_t end = begin + copy_tile_bytes < entry.bytes ? begin + copy_tile_bytes : entry.bytes;
    const char* src = static_cast<const char*>(entry.src);
    char* dst = static_cast<char*>(entry.dst);
    const auto alignment = reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst);
    std::size_t done = begin;
    if (alignment % 16 == 0) {
      const std::size_t words_end = begin + (end - begin) / 16 * 16;
      copy_words<uint4>(src, dst, begin, words_end);
      done = words_end;
    } else if (alignment % 4 == 0) {
      const std::size_t words_end = begin + (end - begin) / 4 * 4;
      copy_words<unsigned int>(src, dst, begin, words_end);
      done = words_end;
    }
    for (std::size_t i = done + threadIdx.x; i < end; i += copy_block_threads) dst[i] = src[i];
  }
}

//! Up to this many dimensions for strided sources.
inline constexpr int max_gather_rank = 8;

struct StridedLayout {
  int rank = 0;
  std::size_t extents[max_gather_rank] = {};
  std::ptrdiff_t strides[max_gather_rank] = {};  // in elements
};

//! dst[i] = To(src at the i-th index of `layout` in row-major order).
template <class From, class To>
__global__ void gather_convert_kernel(const From* src, To* dst, std::size_t n, const StridedLayout layout) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    std::size_t rest = i;
    std::ptrdiff_t offset = 0;
    for (int r = layout.rank - 1; r >= 0; --r) {
      const std::size_t extent = layout.extents[r];
      offset += static_cast<std::ptrdiff_t>(rest % extent) * layout.strides[r];
      rest /= extent;
    }
    dst[i] = static_cast<To>(src[offset]);
  }
}

}  // namespace tensorplay::detail
