// tensorplay/graph/copy_node.hpp: the copy node of stage_and_launch, a kernel node in front of
// every root of a graph, and the table of copies it is given at each call.
//
// The node lives in the graph itself, and the graph has one executable: CUDA refuses a second
// executable of a graph that holds conditional nodes (seen on the H200, driver 580), and
// cudaGraphClone refuses to copy such a graph at all. A plain replay of a staged graph disables
// the node (cudaGraphNodeSetEnabled) once, and the next stage_and_launch enables it again, so
// that a graph replayed and staged alternately pays one extra call per switch, and a graph only
// replayed pays nothing.
//
// The table travels in the kernel's parameters, sized to the next power of two of the pairs
// batched: cudaGraphExecKernelNodeSetParams copies only that many bytes.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace tensorplay::detail {

//! The copies of one stage_and_launch call, in the layout of the copy kernel of `log2_capacity`.
class CopyBatch {
 public:
  //! Starts a batch of up to `count` entries (at most config::copy_table_max).
  void start(std::size_t count) noexcept {
    log2_capacity_ = count <= 1 ? 0 : static_cast<int>(std::bit_width(count - 1));
    count_ = 0;
    first_tile(0) = 0;
  }
  [[nodiscard]] bool full() const noexcept { return count_ == capacity(); }
  [[nodiscard]] int count() const noexcept { return count_; }
  [[nodiscard]] int log2_capacity() const noexcept { return log2_capacity_; }

  void add(const void* src, void* dst, std::size_t bytes) noexcept {
    kernels::CopyEntry& e = entry(count_);
    e.src = src;
    e.dst = dst;
    e.bytes = bytes;
    first_tile(count_ + 1) =
        first_tile(count_) + static_cast<std::uint32_t>((bytes + config::copy_tile_bytes - 1) / config::copy_tile_bytes);
    ++count_;
    header() = count_;
  }

  //! Blocks for this batch: one per tile, at most `max_blocks`.
  [[nodiscard]] unsigned blocks(unsigned max_blocks) const noexcept {
    const std::uint32_t tiles = first_tile(count_);
    return tiles == 0 ? 1u : (tiles < max_blocks ? tiles : max_blocks);
  }

  //! The kernel's parameter block (the table by value).
  [[nodiscard]] void* parameters() noexcept { return storage_; }

 private:
  [[nodiscard]] int capacity() const noexcept { return 1 << log2_capacity_; }
  // Offsets of CopyTable<capacity>'s members, computed from the struct itself.
  template <int Capacity>
  static constexpr std::size_t tiles_offset() {
    return offsetof(kernels::CopyTable<Capacity>, first_tile);
  }
  [[nodiscard]] std::size_t entries_offset() const noexcept {
    switch (log2_capacity_) {
      case 0: return offsetof(kernels::CopyTable<1>, entries);
      case 1: return offsetof(kernels::CopyTable<2>, entries);
      case 2: return offsetof(kernels::CopyTable<4>, entries);
      case 3: return offsetof(kernels::CopyTable<8>, entries);
      case 4: return offsetof(kernels::CopyTable<16>, entries);
      case 5: return offsetof(kernels::CopyTable<32>, entries);
      default: return offsetof(kernels::CopyTable<64>, entries);
    }
  }
  int& header() noexcept { return *std::launder(reinterpret_cast<int*>(storage_)); }
  std::uint32_t& first_tile(int i) noexcept {
    return std::launder(reinterpret_cast<std::uint32_t*>(storage_ + tiles_offset<1>()))[i];
  }
  [[nodiscard]] std::uint32_t first_tile(int i) const noexcept {
    return std::launder(reinterpret_cast<const std::uint32_t*>(storage_ + tiles_offset<1>()))[i];
  }
  kernels::CopyEntry& entry(int i) noexcept {
    return std::launder(reinterpret_cast<kernels::CopyEntry*>(storage_ + entries_offset()))[i];
  }

  static_assert(offsetof(kernels::CopyTable<1>, first_tile) == offsetof(kernels::CopyTable<64>, first_tile));
  alignas(kernels::CopyTable<config::copy_table_max>) unsigned char storage_[sizeof(kernels::CopyTable<config::copy_table_max>)] = {};
  int log2_capacity_ = 0;
  int count_ = 0;
};

//! The copy node of a graph's executable.
class CopyNode {
 public:
  [[nodiscard]] bool exists() const noexcept { return node_ != nullptr; }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  //! Adds a copy node to `graph`, in front of every root, and returns it. Call before compiling
  //! `graph`; then adopt() the node that the executable will use.
  [[nodiscard]] cudaGraphNode_t add_to(cudaGraph_t graph, int device, const tensorplay::source_location& where) {
    const KernelLibrary& library = KernelLibrary::on(device, where);
    DeviceGuard guard(device, where);  // cudaGraphAddKernelNode uses the current device
    int sms = 1;
    TENSORPLAY_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
    max_blocks_ = static_cast<unsigned>(sms) * config::copy_blocks_per_sm;
    std::size_t root_count = 0;
    TENSORPLAY_CHECK(cudaGraphGetRootNodes(graph, nullptr, &root_count), where);
    std::vector<cudaGraphNode_t> roots(root_count);
    if (root_count != 0) TENSORPLAY_CHECK(cudaGraphGetRootNodes(graph, roots.data(), &root_count), where);
    CopyBatch empty;
    empty.start(1);
    cudaGraphNode_t node = nullptr;
    const cudaKernelNodeParams params = params_for(library, empty);
    TENSORPLAY_CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &params), where);
    if (root_count != 0) {
      const std::vector<cudaGraphNode_t> from(root_count, node);
      TENSORPLAY_CHECK(add_dependencies(graph, from.data(), roots.data(), nullptr, root_count), where);
    }
    device_ = device;
    return node;
  }

  //! The executable now holds `node` (enabled, as a fresh compile leaves it).
  void adopt(cudaGraphNode_t node) noexcept {
    node_ = node;
    enabled_ = true;
  }

  //! The executable was compiled again from the graph that holds the node: the node is enabled,
  //! as a fresh compile leaves it.
  void recompiled() noexcept { enabled_ = true; }

  //! Points the node of `exec` at `batch` (and enables it).
  void set(cudaGraphExec_t exec, CopyBatch& batch, const tensorplay::source_location& where) {
    const KernelLibrary& library = KernelLibrary::on(device_, where);
    const cudaKernelNodeParams params = params_for(library, batch);
    if (!enabled_) {
      check(exec_set_node_enabled(exec, node_, true), "cudaGraphNodeSetEnabled (stage_and_launch copy node)", where);
      enabled_ = true;
    }
    check(exec_set_kernel_params(exec, node_, params), "cudaGraphExecKernelNodeSetParams (stage_and_launch copy node)",
          where);
  }

  //! Before a plain replay: the node must not copy again what the last call staged.
  void disable(cudaGraphExec_t exec, const tensorplay::source_location& where) {
    check(exec_set_node_enabled(exec, node_, false), "cudaGraphNodeSetEnabled (stage_and_launch copy node)", where);
    enabled_ = false;
  }

  //! A batch larger than one table: copies it with a plain launch (the node takes the rest).
  void launch_now(CopyBatch& batch, cudaStream_t stream, const tensorplay::source_location& where) const {
    const KernelLibrary& library = KernelLibrary::on(device_, where);
    void* args[] = {batch.parameters()};
    launch(reinterpret_cast<const void*>(library.copy(batch.log2_capacity())), dim3(batch.blocks(max_blocks_)),
           dim3(config::copy_block_threads), stream, false, args, "cudaLaunchKernelEx (tensorplay copy kernel)", where);
  }

 private:
  cudaKernelNodeParams params_for(const KernelLibrary& library, CopyBatch& batch) noexcept {
    args_[0] = batch.parameters();  // the table is copied out of here when the params are set
    cudaKernelNodeParams params{};
    params.func = reinterpret_cast<void*>(library.copy(batch.log2_capacity()));
    params.gridDim = dim3(batch.blocks(max_blocks_));
    params.blockDim = dim3(config::copy_block_threads);
    params.sharedMemBytes = 0;
    params.kernelParams = args_;
    params.extra = nullptr;
    return params;
  }

  cudaGraphNode_t node_ = nullptr;  // in the graph the executable was instantiated from
  int device_ = -1;
  unsigned max_blocks_ = 1;
  bool enabled_ = false;
  void* args_[1] = {};
};

}  // namespace tensorplay::detail
