// tensorplay/detail/kernels/kernel_abi.hpp: the parameter types of the library's own kernels,
// shared by the host code that fills them and the device code (library_kernels.cu) that reads
// them. Plain structs only: this header compiles with any C++20 compiler, no CUDA extensions.
#pragma once

#include <tensorplay/config.hpp>

#include <cstddef>
#include <cstdint>

namespace tensorplay::detail::kernels {

//! One device-to-device copy of a staged batch.
struct CopyEntry {
  const void* src;
  void* dst;
  std::size_t bytes;
};

//! A batch of copies, passed by value as the copy kernel's only parameter (no buffer to guard:
//! every launch keeps the table it was given). `Capacity` is a power of two up to
//! config::copy_table_max; the kernel of that capacity reads exactly this layout.
template <int Capacity>
struct CopyTable {
  int count = 0;
  std::uint32_t first_tile[Capacity + 1] = {};  // prefix sum of tiles per entry
  CopyEntry entries[Capacity] = {};
};

//! The capacities a copy kernel exists for: 1, 2, 4, ... config::copy_table_max.
inline constexpr int copy_capacity_count = 7;
static_assert((1 << (copy_capacity_count - 1)) == config::copy_table_max);

//! Where one staged copy goes. It stays the same from call to call while the static buffers do.
struct CopyTarget {
  void* dst;
  std::size_t bytes;
};

//! One call's sources, written by the host into mapped host memory before the launch.
//! `sequence` names the call: the fetch kernel takes it only when it is the launch it expects.
struct RingSlot {
  unsigned long long sequence;
  const void* sources[config::copy_table_max];
};

//! What the staging kernels publish for the host, in mapped host memory: how many calls the
//! fetch kernel has taken (the host may write their slots again), and how many the copy kernel
//! has finished (once all have, nothing reads the ring any more, and it may be freed).
struct RingStatus {
  unsigned long long consumed;
  unsigned long long done;
};

//! Device memory of a staging ring: the calls taken so far (the next slot to read), and the
//! sources the fetch kernel took for the current launch, for the copy kernel.
struct RingDeviceState {
  unsigned long long taken;
  unsigned blocks_done;  // blocks of the current copy that have finished
  int staged;            // 1: `sources` are this launch's; 0: nothing was staged for it
  const void* sources[config::copy_table_max];
};

//! The fetch kernel's parameters (one block of copy_table_max threads, the first node of a
//! staged graph). It reads the launch's slot from host memory once, so that the copy kernel's
//! blocks read device memory only: reads of host memory by every block of a copy serialise
//! (a 4-input call took 40 us of device time that way on the H200).
struct RingFetch {
  const RingSlot* ring = nullptr;   // `slots` slots, mapped host memory
  RingDeviceState* state = nullptr;  // device memory
  RingStatus* status = nullptr;      // mapped host memory
  int slots = 0;
  int count = 0;  // 0: no plan yet (a node compiled from the graph): touches nothing
};

//! The copy kernel's parameters in a staged graph: where each copy goes, which stays the same
//! while the static buffers do (the sources come from `state`, filled by the fetch kernel).
template <int Capacity>
struct RingCopyPlan {
  RingDeviceState* state = nullptr;
  RingStatus* status = nullptr;  // mapped host memory
  int count = 0;  // 0: no plan yet: the kernel does nothing
  std::uint32_t first_tile[Capacity + 1] = {};  // prefix sum of tiles per entry
  CopyTarget targets[Capacity] = {};
};

//! A strided source for the gather kernel.
struct StridedLayout {
  int rank = 0;
  std::size_t extents[config::max_gather_rank] = {};
  std::ptrdiff_t strides[config::max_gather_rank] = {};  // in elements
};

//! Element types the gather/convert kernel knows (tensor.hpp's DType, same order), and Bytes for
//! a same-type copy of elements of `element_bytes` bytes that need no conversion.
enum class ElementCode : int {
  Bool, Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float16, BFloat16, Float32, Float64, Bytes
};

//! A RandomState's sequence in device memory (random.hpp): its seed, and the first offset no
//! launch has taken yet. Only the advance and reset kernels write it.
struct RandomCounter {
  unsigned long long seed;
  unsigned long long offset;
};

//! What one advance took for the launches it serves (a segment of a capture, or one eager
//! launch): the seed and the first of their offsets, written before those launches read it.
struct RandomSlot {
  unsigned long long seed;
  unsigned long long base;
};

//! The names of the kernels in the embedded fatbin (extern "C", so that no mangling is involved).
inline constexpr const char* set_handle_kernel_names[] = {
    "tensorplay_set_handle_b8",  "tensorplay_set_handle_i8",  "tensorplay_set_handle_u8",
    "tensorplay_set_handle_i16", "tensorplay_set_handle_u16", "tensorplay_set_handle_i32",
    "tensorplay_set_handle_u32", "tensorplay_set_handle_i64", "tensorplay_set_handle_u64"};
inline constexpr const char* copy_kernel_names[copy_capacity_count] = {
    "tensorplay_copy_1", "tensorplay_copy_2", "tensorplay_copy_4", "tensorplay_copy_8",
    "tensorplay_copy_16", "tensorplay_copy_32", "tensorplay_copy_64"};
inline constexpr const char* ring_copy_kernel_names[copy_capacity_count] = {
    "tensorplay_ring_copy_1", "tensorplay_ring_copy_2", "tensorplay_ring_copy_4", "tensorplay_ring_copy_8",
    "tensorplay_ring_copy_16", "tensorplay_ring_copy_32", "tensorplay_ring_copy_64"};
inline constexpr const char* ring_fetch_kernel_name = "tensorplay_ring_fetch";
inline constexpr const char* gather_kernel_name = "tensorplay_gather_convert";
inline constexpr const char* random_advance_kernel_name = "tensorplay_random_advance";
inline constexpr const char* random_reset_kernel_name = "tensorplay_random_reset";

}  // namespace tensorplay::detail::kernels
