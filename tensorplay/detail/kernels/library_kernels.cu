// tensorplay/detail/kernels/library_kernels.cu: the library's own kernels. Not compiled into user
// code: tools/kernels/regenerate compiles this file into a fatbin embedded in fatbin.hpp, which
// the library loads with cudaLibraryLoadData, so that host-only (g++/clang++) translation units
// can capture conditional nodes, stage inputs and draw random numbers too.
#include <tensorplay/detail/kernels/handle_value.cuh>
#include <tensorplay/detail/kernels/kernel_abi.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tensorplay::detail::kernels {

// ---- set a conditional handle ------------------------------------------------------------

template <class V>
__device__ __forceinline__ void set_handle(cudaGraphConditionalHandle handle, const V* value) {
  wait_for_upstream_kernel();
  cudaGraphSetConditional(handle, handle_value(*value));
}

// ---- batched copy --------------------------------------------------------------------------

template <class Word>
__device__ __forceinline__ void copy_words(const char* src, char* dst, std::size_t begin, std::size_t end) {
  constexpr int threads = config::copy_block_threads;
  constexpr int unroll = config::copy_unroll;
  const Word* s = reinterpret_cast<const Word*>(src);
  Word* d = reinterpret_cast<Word*>(dst);
  const std::size_t first = begin / sizeof(Word);
  const std::size_t last = end / sizeof(Word);
  for (std::size_t base = first + threadIdx.x; base < last; base += std::size_t{threads} * unroll) {
    Word words[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t i = base + static_cast<std::size_t>(u) * threads;
      if (i < last) words[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t i = base + static_cast<std::size_t>(u) * threads;
      if (i < last) d[i] = words[u];
    }
  }
}

//! Copies every entry: entry_at(e) gives entry e. Blocks walk tiles in grid-stride order; a tile
//! never spans two entries. Entries aligned to 16 (or 4) bytes move in 16-byte (4-byte) words.
template <class EntryAt>
__device__ __forceinline__ void copy_tiles(const std::uint32_t* first_tile, int count, EntryAt entry_at) {
  const std::size_t total = first_tile[count];
  int e = 0;
  for (std::size_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    while (tile >= first_tile[e + 1]) ++e;
    const CopyEntry entry = entry_at(e);
    const std::size_t begin = (tile - first_tile[e]) * config::copy_tile_bytes;
    const std::size_t end = begin + config::copy_tile_bytes < entry.bytes ? begin + config::copy_tile_bytes : entry.bytes;
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
    for (std::size_t i = done + threadIdx.x; i < end; i += config::copy_block_threads) dst[i] = src[i];
  }
}

//! A copy table in shared memory. Kernels copy their table there from their parameters before
//! copying: code that indexes a kernel parameter through a pointer makes the compiler copy the
//! whole parameter block into every thread's local memory (a 7x slower copy, seen on the H200).
template <int Capacity>
struct SharedTable {
  std::uint32_t first_tile[Capacity + 1];
  CopyEntry entries[Capacity];
};

//! Copies every entry of `table` (a table passed by value: a launch outside the graph).
template <int Capacity>
__device__ __forceinline__ void batched_copy(const CopyTable<Capacity>& table) {
  __shared__ SharedTable<Capacity> shared;
  const int count = table.count;
  for (int i = threadIdx.x; i <= count; i += blockDim.x) shared.first_tile[i] = table.first_tile[i];
  for (int i = threadIdx.x; i < count; i += blockDim.x) shared.entries[i] = table.entries[i];
  __syncthreads();
  copy_tiles(shared.first_tile, count, [&](int e) { return shared.entries[e]; });
}

//! The fetch node of a staged graph: takes the sources of the call whose slot is next
//! (state.taken % slots) into device memory for the copy node, advances state.taken and publishes
//! it for the host. Launches of one executable run one after another, so the slot read is the
//! one the host wrote for this launch, unless the host staged nothing for it (a plain replay that
//! found the node enabled): the slot's sequence then differs, and nothing is taken.
__device__ __forceinline__ void ring_fetch(const RingFetch& p) {
  if (p.count == 0) return;  // no plan: touches nothing (the Graph that owned the ring may be gone)
  __shared__ bool staged;
  RingDeviceState& state = *p.state;
  const unsigned long long call = *static_cast<volatile unsigned long long*>(&state.taken);
  const RingSlot& slot = p.ring[call % static_cast<unsigned>(p.slots)];
  // One read of host memory per thread, all at once; fetched again, never from a cache line of
  // an earlier launch.
  const int i = static_cast<int>(threadIdx.x);
  const void* source = i < p.count ? reinterpret_cast<const void*>(__ldcv(reinterpret_cast<const unsigned long long*>(&slot.sources[i])))
                                   : nullptr;
  if (i == 0) staged = __ldcv(&slot.sequence) == call;
  __syncthreads();
  if (i == 0) state.staged = staged ? 1 : 0;
  if (!staged) return;
  if (i < p.count) state.sources[i] = source;
  if (i == 0) {
    state.taken = call + 1;
    __threadfence_system();
    *static_cast<volatile unsigned long long*>(&p.status->consumed) = call + 1;
  }
}

//! The copy node of a staged graph: copies what the fetch node took for this launch. The last
//! block to finish publishes the call as done for the host.
template <int Capacity>
__device__ __forceinline__ void ring_copy(const RingCopyPlan<Capacity>& plan) {
  const int count = plan.count;
  if (count == 0 || plan.state->staged == 0) return;  // uniform across the grid
  __shared__ SharedTable<Capacity> shared;
  for (int i = threadIdx.x; i <= count; i += blockDim.x) shared.first_tile[i] = plan.first_tile[i];
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    shared.entries[i].src = plan.state->sources[i];
    shared.entries[i].dst = plan.targets[i].dst;
    shared.entries[i].bytes = plan.targets[i].bytes;
  }
  __syncthreads();
  copy_tiles(shared.first_tile, count, [&](int e) { return shared.entries[e]; });
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&plan.state->blocks_done, 1u) + 1 == gridDim.x) {
      plan.state->blocks_done = 0;
      __threadfence_system();
      *static_cast<volatile unsigned long long*>(&plan.status->done) = plan.state->taken;
    }
  }
}

// ---- gather and convert ------------------------------------------------------------------

//! Offset, in elements, of the i-th element (row-major order) of `layout`.
__device__ __forceinline__ std::ptrdiff_t strided_offset(std::size_t i, const StridedLayout& layout) {
  std::size_t rest = i;
  std::ptrdiff_t offset = 0;
  for (int r = layout.rank - 1; r >= 0; --r) {
    const std::size_t extent = layout.extents[r];
    offset += static_cast<std::ptrdiff_t>(rest % extent) * layout.strides[r];
    rest /= extent;
  }
  return offset;
}

// Reads element `at` of type `code` as double (or, for 64-bit integers, exactly as such).
template <class To>
__device__ __forceinline__ To load_as(const void* src, ElementCode code, std::ptrdiff_t at) {
  switch (code) {
    case ElementCode::Bool: return static_cast<To>(static_cast<const bool*>(src)[at]);
    case ElementCode::Int8: return static_cast<To>(static_cast<const std::int8_t*>(src)[at]);
    case ElementCode::UInt8: return static_cast<To>(static_cast<const std::uint8_t*>(src)[at]);
    case ElementCode::Int16: return static_cast<To>(static_cast<const std::int16_t*>(src)[at]);
    case ElementCode::UInt16: return static_cast<To>(static_cast<const std::uint16_t*>(src)[at]);
    case ElementCode::Int32: return static_cast<To>(static_cast<const std::int32_t*>(src)[at]);
    case ElementCode::UInt32: return static_cast<To>(static_cast<const std::uint32_t*>(src)[at]);
    case ElementCode::Int64: return static_cast<To>(static_cast<const std::int64_t*>(src)[at]);
    case ElementCode::UInt64: return static_cast<To>(static_cast<const std::uint64_t*>(src)[at]);
    case ElementCode::Float16: return static_cast<To>(__half2float(static_cast<const __half*>(src)[at]));
    case ElementCode::BFloat16: return static_cast<To>(__bfloat162float(static_cast<const __nv_bfloat16*>(src)[at]));
    case ElementCode::Float32: return static_cast<To>(static_cast<const float*>(src)[at]);
    case ElementCode::Float64: return static_cast<To>(static_cast<const double*>(src)[at]);
    case ElementCode::Bytes: break;
  }
  return To{};
}

template <class From>
__device__ __forceinline__ void store_from(void* dst, ElementCode code, std::size_t at, From v) {
  switch (code) {
    case ElementCode::Bool: static_cast<bool*>(dst)[at] = v != From{}; return;
    case ElementCode::Int8: static_cast<std::int8_t*>(dst)[at] = static_cast<std::int8_t>(v); return;
    case ElementCode::UInt8: static_cast<std::uint8_t*>(dst)[at] = static_cast<std::uint8_t>(v); return;
    case ElementCode::Int16: static_cast<std::int16_t*>(dst)[at] = static_cast<std::int16_t>(v); return;
    case ElementCode::UInt16: static_cast<std::uint16_t*>(dst)[at] = static_cast<std::uint16_t>(v); return;
    case ElementCode::Int32: static_cast<std::int32_t*>(dst)[at] = static_cast<std::int32_t>(v); return;
    case ElementCode::UInt32: static_cast<std::uint32_t*>(dst)[at] = static_cast<std::uint32_t>(v); return;
    case ElementCode::Int64: static_cast<std::int64_t*>(dst)[at] = static_cast<std::int64_t>(v); return;
    case ElementCode::UInt64: static_cast<std::uint64_t*>(dst)[at] = static_cast<std::uint64_t>(v); return;
    case ElementCode::Float16: static_cast<__half*>(dst)[at] = __float2half(static_cast<float>(v)); return;
    case ElementCode::BFloat16: static_cast<__nv_bfloat16*>(dst)[at] = __float2bfloat16(static_cast<float>(v)); return;
    case ElementCode::Float32: static_cast<float*>(dst)[at] = static_cast<float>(v); return;
    case ElementCode::Float64: static_cast<double*>(dst)[at] = static_cast<double>(v); return;
    case ElementCode::Bytes: return;
  }
}

__device__ __forceinline__ bool is_integer_code(ElementCode c) {
  return c != ElementCode::Float16 && c != ElementCode::BFloat16 && c != ElementCode::Float32 &&
         c != ElementCode::Float64 && c != ElementCode::Bytes;
}
__device__ __forceinline__ bool is_unsigned_code(ElementCode c) {
  return c == ElementCode::Bool || c == ElementCode::UInt8 || c == ElementCode::UInt16 || c == ElementCode::UInt32 ||
         c == ElementCode::UInt64;
}

}  // namespace tensorplay::detail::kernels

using namespace tensorplay::detail::kernels;

#define TENSORPLAY_SET_HANDLE(name, type)                                                            \
  extern "C" __global__ void name(cudaGraphConditionalHandle handle, const type* value) {           \
    set_handle(handle, value);                                                                       \
  }
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_b8, bool)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_i8, std::int8_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_u8, std::uint8_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_i16, std::int16_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_u16, std::uint16_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_i32, std::int32_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_u32, std::uint32_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_i64, std::int64_t)
TENSORPLAY_SET_HANDLE(tensorplay_set_handle_u64, std::uint64_t)
#undef TENSORPLAY_SET_HANDLE

#define TENSORPLAY_COPY(capacity)                                                                    \
  extern "C" __global__ void __launch_bounds__(tensorplay::config::copy_block_threads)                \
      tensorplay_copy_##capacity(const CopyTable<capacity> table) {                                  \
    batched_copy(table);                                                                             \
  }
TENSORPLAY_COPY(1)
TENSORPLAY_COPY(2)
TENSORPLAY_COPY(4)
TENSORPLAY_COPY(8)
TENSORPLAY_COPY(16)
TENSORPLAY_COPY(32)
TENSORPLAY_COPY(64)
#undef TENSORPLAY_COPY

#define TENSORPLAY_RING_COPY(capacity)                                                               \
  extern "C" __global__ void __launch_bounds__(tensorplay::config::copy_block_threads)                \
      tensorplay_ring_copy_##capacity(const RingCopyPlan<capacity> plan) {                           \
    ring_copy(plan);                                                                                 \
  }
TENSORPLAY_RING_COPY(1)
TENSORPLAY_RING_COPY(2)
TENSORPLAY_RING_COPY(4)
TENSORPLAY_RING_COPY(8)
TENSORPLAY_RING_COPY(16)
TENSORPLAY_RING_COPY(32)
TENSORPLAY_RING_COPY(64)
#undef TENSORPLAY_RING_COPY

extern "C" __global__ void __launch_bounds__(tensorplay::config::copy_table_max) tensorplay_ring_fetch(const RingFetch p) {
  ring_fetch(p);
}

//! dst[i] = convert(src at the i-th index of `layout`, row-major). With `from` == `to` ==
//! Bytes, elements of `element_bytes` bytes are moved unchanged. Integers convert to integers
//! exactly (64-bit included); anything involving a floating type goes through double.
extern "C" __global__ void tensorplay_gather_convert(const void* src, int from, void* dst, int to, std::size_t n,
                                                     std::size_t element_bytes, const StridedLayout layout) {
  const auto from_code = static_cast<ElementCode>(from);
  const auto to_code = static_cast<ElementCode>(to);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    const std::ptrdiff_t at = strided_offset(i, layout);
    if (from_code == ElementCode::Bytes) {
      const char* s = static_cast<const char*>(src) + at * static_cast<std::ptrdiff_t>(element_bytes);
      char* d = static_cast<char*>(dst) + i * element_bytes;
      for (std::size_t b = 0; b < element_bytes; ++b) d[b] = s[b];
    } else if (is_integer_code(from_code) && is_integer_code(to_code)) {
      if (is_unsigned_code(from_code)) store_from(dst, to_code, i, load_as<unsigned long long>(src, from_code, at));
      else store_from(dst, to_code, i, load_as<long long>(src, from_code, at));
    } else {
      store_from(dst, to_code, i, load_as<double>(src, from_code, at));
    }
  }
}

// ---- random numbers (random.hpp) -----------------------------------------------------------

//! Takes `increment` offsets of `counter`'s sequence for the launches `slot` serves. One thread.
//! Atomic, so that advances running at once (graphs replayed on two streams) take disjoint ranges.
extern "C" __global__ void tensorplay_random_advance(RandomCounter* counter, RandomSlot* slot, unsigned long long increment) {
  slot->seed = counter->seed;
  slot->base = atomicAdd(&counter->offset, increment);
}

//! set_seed: a new seed, and the sequence starts again at offset 0. One thread.
extern "C" __global__ void tensorplay_random_reset(RandomCounter* counter, unsigned long long seed) {
  counter->seed = seed;
  counter->offset = 0;
}
