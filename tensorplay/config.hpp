// tensorplay/config.hpp: every tunable number of the library, each with the reason for its value.
#pragma once

#include <tensorplay/version.hpp>

#include <cstddef>

//! Marks the functions that own process-wide state (the capture registry, the pools, this
//! thread's streams, the kernel library): one copy per process, also when tensorplay is compiled
//! into several shared libraries built with -fvisibility=hidden (docs/shared_libraries.md).
#if defined(__GNUC__) || defined(__clang__)
#define TENSORPLAY_PROCESS_WIDE __attribute__((visibility("default")))
#else
#define TENSORPLAY_PROCESS_WIDE
#endif

//! How the library's non-template functions are compiled. Included with `nvcc -I` alone (or
//! through Bazel's //:tensorplay_header_only, CMake's tensorplay::header_only), tensorplay is
//! header-only: every translation unit that includes it compiles them, as inline functions. With
//! TENSORPLAY_SEPARATE_COMPILATION defined (for every translation unit of the program: the default
//! targets, Bazel's //:tensorplay and CMake's tensorplay::tensorplay, define it), the headers declare them
//! and tensorplay/src/library.cpp, which defines TENSORPLAY_DEFINE_LIBRARY, compiles them once:
//! a translation unit then costs little more than the standard headers it needs
//! (docs/performance.md, "Compile time"). Each header ends with its definitions, under
//! TENSORPLAY_DEFINE_BODIES, each marked TENSORPLAY_DECL. A header includes at its top what its
//! declarations and templates need, and at the top of that section what only its definitions
//! need: a separate-compilation translation unit never sees the allocator, the pool directory
//! or the offload machinery, only the declarations that reach them.
#if defined(TENSORPLAY_SEPARATE_COMPILATION)
#define TENSORPLAY_DECL
#if defined(TENSORPLAY_DEFINE_LIBRARY)
#define TENSORPLAY_DEFINE_BODIES 1
#else
#define TENSORPLAY_DEFINE_BODIES 0
#endif
#else
#define TENSORPLAY_DECL inline
#define TENSORPLAY_DEFINE_BODIES 1
#endif

namespace tensorplay::config {

// ---- devices -------------------------------------------------------------------------------

//! Devices beyond this index are refused: per-thread tables (current stream, side stream) are
//! fixed arrays of this size, so that looking up the current stream costs one load.
inline constexpr int max_devices = 64;

// ---- pools ---------------------------------------------------------------------------------

//! Every allocation is rounded up to this many bytes. 512 keeps the 256-byte alignment CUDA's own
//! allocations give (vectorised kernels rely on it) and bounds the bookkeeping per block.
inline constexpr std::size_t pool_round_bytes = 512;
//! Requests up to this size share small segments, so that many tiny tensors cost one cudaMalloc.
inline constexpr std::size_t pool_small_request = std::size_t{1} << 20;
//! Size of a small segment: 2 MiB is the GPU's large-page size, the smallest cudaMalloc that
//! does not waste a page.
inline constexpr std::size_t pool_small_segment = std::size_t{2} << 20;
//! Requests below this size share mid-size segments.
inline constexpr std::size_t pool_mid_request = std::size_t{10} << 20;
//! Size of a mid-size segment: room for at least two mid-size requests.
inline constexpr std::size_t pool_mid_segment = std::size_t{20} << 20;

// ---- staging copies ------------------------------------------------------------------------

//! Threads per block of the copy kernels.
inline constexpr int copy_block_threads = 256;
//! Words (16 bytes each) one thread moves per pass, all loads before the stores, so that each
//! thread has sixteen independent loads in flight. Measured on the H200 (4 x 64 MiB, against
//! cudaMemcpyAsync device to device): 4 words per pass with 16 KiB tiles and 8 blocks per SM
//! reached 0.80-0.81x; 8 words with 64 KiB tiles 0.90x; 16 words with 64 KiB tiles 0.92x.
inline constexpr int copy_unroll = 16;
//! Bytes one block moves per tile (256 threads x 16 x 16 bytes = 64 KiB): one pass. A tile never
//! spans two entries, so smaller tiles balance better and larger ones cost fewer index computations.
inline constexpr std::size_t copy_tile_bytes = std::size_t{copy_block_threads} * copy_unroll * 16;
//! Blocks per SM for the copy grid: with sixteen loads in flight per thread, 4 blocks of 256
//! threads keep the memory system as busy as 8 did (and the registers for them fit).
inline constexpr int copy_blocks_per_sm = 4;
//! The largest copy table one kernel launch carries. The table travels in the kernel's
//! parameters (no device buffer to guard); 64 entries take about 2 KiB of the 4 KiB limit.
//! Tables are sized to the next power of two of the pairs batched (1, 2, 4, ... 64), so that
//! stage_and_launch writes only as many bytes as it uses.
inline constexpr int copy_table_max = 64;
//! Calls of stage_and_launch that may wait in a graph's staging ring (staging_ring.hpp) for the GPU
//! to copy them. Each slot is 520 bytes of pinned memory. When the GPU is this many calls behind,
//! a call copies with a launch of its own (about 3 us more of host time) instead of waiting: by
//! then the GPU, not the host, sets the pace.
inline constexpr int staging_ring_slots = 64;
//! Strided sources up to this rank are gathered by the copy kernels.
inline constexpr int max_gather_rank = 8;

}  // namespace tensorplay::config
