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

//! The names of the kernels in the embedded fatbin (extern "C", so that no mangling is involved).
inline constexpr const char* set_handle_kernel_names[] = {
    "tensorplay_set_handle_b8",  "tensorplay_set_handle_i8",  "tensorplay_set_handle_u8",
    "tensorplay_set_handle_i16", "tensorplay_set_handle_u16", "tensorplay_set_handle_i32",
    "tensorplay_set_handle_u32", "tensorplay_set_handle_i64", "tensorplay_set_handle_u64"};
inline constexpr const char* copy_kernel_names[copy_capacity_count] = {
    "tensorplay_copy_1", "tensorplay_copy_2", "tensorplay_copy_4", "tensorplay_copy_8",
    "tensorplay_copy_16", "tensorplay_copy_32", "tensorplay_copy_64"};
inline constexpr const char* gather_kernel_name = "tensorplay_gather_convert";

}  // namespace tensorplay::detail::kernels
