// tensorplay/graph/detail/staging_nodes.hpp: the staging nodes of stage_and_launch (the fetch node,
// then the copy node: two kernel nodes in front of every root of a graph), and the batch of copies
// each call gathers. Words used throughout: "the staging nodes" are both; "the copy node" is the
// one that copies; "the fetch node" takes the call's sources from the ring.
//
// The nodes live in the graph itself, and the graph has one executable: CUDA refuses a second
// executable of a graph that holds conditional nodes (seen on the H200, driver 580), and
// cudaGraphClone refuses to copy such a graph at all. A plain replay of a staged graph disables
// the node (cudaGraphNodeSetEnabled) once, and the next stage_and_launch enables it again, so
// that a graph replayed and staged alternately pays one extra call per switch, and a graph only
// replayed pays nothing.
//
// The node's parameters hold the plan: where each copy goes and how many bytes, which stay the
// same while the static buffers do. Each call's sources go into the staging ring
// (detail/staging_ring.hpp), so that a call that stages onto the same static buffers as the last
// one costs no cudaGraphExecKernelNodeSetParams: host writes to pinned memory, then the launch.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/staging_ring.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Calls f.template operator()<Capacity>() for the table capacity 1 << log2_capacity.
template <class F>
decltype(auto) with_capacity(int log2_capacity, F&& f) {
  switch (log2_capacity) {
    case 0: return f.template operator()<1>();
    case 1: return f.template operator()<2>();
    case 2: return f.template operator()<4>();
    case 3: return f.template operator()<8>();
    case 4: return f.template operator()<16>();
    case 5: return f.template operator()<32>();
    default: return f.template operator()<64>();
  }
}

//! The copies of one stage_and_launch call, in the layout of the copy kernel of `log2_capacity`.
class CopyBatch {
 public:
  //! Starts a batch of up to `count` entries (at most config::copy_table_max).
  void start(std::size_t count) noexcept;
  [[nodiscard]] bool full() const noexcept;
  [[nodiscard]] int count() const noexcept { return count_; }
  [[nodiscard]] int log2_capacity() const noexcept { return log2_capacity_; }

  void add(const void* src, void* dst, std::size_t bytes) noexcept;

  //! Blocks for this batch: one per tile, at most `max_blocks`.
  [[nodiscard]] unsigned blocks(unsigned max_blocks) const noexcept;

  //! The kernel's parameter block (the table by value; CUDA only reads it).
  [[nodiscard]] void* parameters() const noexcept;

  [[nodiscard]] const kernels::CopyEntry& entry(int i) const noexcept;
  //! The first tile of entry `i` (i == count(): the tiles of the whole batch).
  [[nodiscard]] std::uint32_t first_tile(int i) const noexcept;

 private:
  [[nodiscard]] int capacity() const noexcept;
  // Offsets of CopyTable<capacity>'s members, computed from the struct itself.
  template <int Capacity>
  static constexpr std::size_t tiles_offset() {
    return offsetof(kernels::CopyTable<Capacity>, first_tile);
  }
  template <int Capacity>
  static constexpr std::size_t entries_offset_of() {
    return offsetof(kernels::CopyTable<Capacity>, entries);
  }
  // A table indexed by log2_capacity_, not with_capacity: nvcc warns (#445-D) about a lambda
  // whose template parameter appears in no parameter type.
  [[nodiscard]] std::size_t entries_offset() const noexcept;
  int& header() noexcept;
  std::uint32_t& first_tile(int i) noexcept;
  kernels::CopyEntry& entry(int i) noexcept;

  static_assert(offsetof(kernels::CopyTable<1>, first_tile) == offsetof(kernels::CopyTable<64>, first_tile));
  alignas(kernels::CopyTable<config::copy_table_max>) unsigned char storage_[sizeof(kernels::CopyTable<config::copy_table_max>)] = {};
  int log2_capacity_ = 0;
  int count_ = 0;
  std::uint32_t tiles_ = 0;  // of the entries so far
  std::size_t entries_offset_ = offsetof(kernels::CopyTable<1>, entries);
};

//! The staging nodes of a graph: the fetch node, then the copy node, in front of every root.
struct StagingNodeHandles {
  cudaGraphNode_t fetch = nullptr;
  cudaGraphNode_t copy = nullptr;
};

//! The staging nodes of a graph's executable: the fetch node takes the call's sources from the
//! ring, the copy node copies them; they are enabled, disabled and planned together.
class StagingNodes {
 public:
  //! Nodes that read their sources from `ring`.
  explicit StagingNodes(std::unique_ptr<StagingRing> ring) noexcept : ring_(std::move(ring)) {}
  StagingNodes(StagingNodes&&) noexcept = default;
  StagingNodes& operator=(StagingNodes&&) = delete;
  //! The ring waits in the graveyard until the calls launched with it are done.
  ~StagingNodes();

  [[nodiscard]] bool exists() const noexcept { return nodes_.copy != nullptr; }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  //! The nodes in the graph the executable was compiled from (Graph::rebind leaves them out).
  [[nodiscard]] StagingNodeHandles handles() const noexcept { return nodes_; }

  //! Adds the staging nodes to `graph`, in front of every root, and returns them. Call before
  //! compiling `graph`; then adopt() the nodes that the executable will use. The nodes have no
  //! plan yet: they copy nothing until set_plan.
  [[nodiscard]] StagingNodeHandles add_to(cudaGraph_t graph, int device, const tensorplay::source_location& where);

  //! The executable will be compiled from the graph that holds `nodes`.
  void adopt(StagingNodeHandles nodes) noexcept;

  //! The executable was compiled from the graph of the adopted nodes: they are enabled, as a
  //! fresh compile leaves them, and have no plan (the next call sets it).
  void compiled() noexcept;

  //! The executable was updated in place (cudaGraphExecUpdate): its nodes took the new graph's
  //! parameters (no plan) and kept their enabled state. They are enabled here, so that the
  //! state this object believes in is the executable's whatever the update did.
  void updated_in_place(cudaGraphExec_t exec, const tensorplay::source_location& where);

  //! Readies the nodes of `exec` to copy `batch` at the next launch; returns false when the ring
  //! is full (the GPU is config::staging_ring_slots calls behind): the batch is then copied now,
  //! by a launch of its own on `stream`, and the nodes are disabled. After a successful launch of
  //! a call that returned true, call launched().
  bool stage(cudaGraphExec_t exec, const CopyBatch& batch, cudaStream_t stream, const tensorplay::source_location& where);

  //! stage() for a call whose pairs are those of the nodes' plan, in its order, with new sources
  //! (same_batched_plan said so): writes the sources to the ring and enables the nodes. False,
  //! doing nothing, when the ring is full or the nodes have no plan of `count` pairs (compiled
  //! again since): the caller then takes the general path.
  bool restage(cudaGraphExec_t exec, const void* const* sources, int count, const tensorplay::source_location& where);

  //! The call readied by stage() was launched: the next call uses the next slot.
  void launched() noexcept;

  //! Before a plain replay: the nodes must not copy again what the last call staged.
  void disable(cudaGraphExec_t exec, const tensorplay::source_location& where);

  //! Copies `batch` with a plain launch of a copy kernel that takes the table by value (a batch
  //! larger than one table, or a full ring).
  void launch_now(const CopyBatch& batch, cudaStream_t stream, const tensorplay::source_location& where) const;

 private:
  [[nodiscard]] kernels::RingFetch fetch_params(int count) const noexcept;

  // The fetch node's parameters, pointing at `fetch` (which must outlive their use).
  cudaKernelNodeParams fetch_node_params(const KernelLibrary& library, kernels::RingFetch& fetch) noexcept;

  void set_enabled(cudaGraphExec_t exec, bool enabled, const tensorplay::source_location& where);

  [[nodiscard]] bool plan_differs(const CopyBatch& batch) const noexcept;

  // Points the nodes of `exec` at `batch`'s destinations (cudaGraphExecKernelNodeSetParams).
  void set_plan(cudaGraphExec_t exec, const CopyBatch& batch, const tensorplay::source_location& where);

  std::unique_ptr<StagingRing> ring_;
  StagingNodeHandles nodes_;  // in the graph the executable was instantiated from
  int device_ = -1;
  unsigned max_blocks_ = 1;
  bool enabled_ = false;
  unsigned long long sequence_ = 0;  // the next call's slot sequence
  int plan_count_ = 0;               // the nodes' plan: its entries' destinations and sizes
  kernels::CopyTarget targets_[config::copy_table_max] = {};
  void* fetch_args_[1] = {};
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void CopyBatch::start(std::size_t count) noexcept {
  log2_capacity_ = count <= 1 ? 0 : static_cast<int>(std::bit_width(count - 1));
  entries_offset_ = entries_offset();
  count_ = 0;
  tiles_ = 0;
  first_tile(0) = 0;
}

TENSORPLAY_DECL bool CopyBatch::full() const noexcept { return count_ == capacity(); }

TENSORPLAY_DECL void CopyBatch::add(const void* src, void* dst, std::size_t bytes) noexcept {
  kernels::CopyEntry& e = entry(count_);
  e.src = src;
  e.dst = dst;
  e.bytes = bytes;
  tiles_ += static_cast<std::uint32_t>((bytes + config::copy_tile_bytes - 1) / config::copy_tile_bytes);
  ++count_;
  first_tile(count_) = tiles_;
  header() = count_;
}

TENSORPLAY_DECL unsigned CopyBatch::blocks(unsigned max_blocks) const noexcept {
  const std::uint32_t tiles = first_tile(count_);
  return tiles == 0 ? 1u : (tiles < max_blocks ? tiles : max_blocks);
}

TENSORPLAY_DECL void* CopyBatch::parameters() const noexcept { return const_cast<unsigned char*>(storage_); }

TENSORPLAY_DECL const kernels::CopyEntry& CopyBatch::entry(int i) const noexcept {
  return std::launder(reinterpret_cast<const kernels::CopyEntry*>(storage_ + entries_offset_))[i];
}

TENSORPLAY_DECL std::uint32_t CopyBatch::first_tile(int i) const noexcept {
  return std::launder(reinterpret_cast<const std::uint32_t*>(storage_ + tiles_offset<1>()))[i];
}

TENSORPLAY_DECL int CopyBatch::capacity() const noexcept { return 1 << log2_capacity_; }

TENSORPLAY_DECL std::size_t CopyBatch::entries_offset() const noexcept {
  static constexpr std::size_t offsets[kernels::copy_capacity_count] = {
      entries_offset_of<1>(),  entries_offset_of<2>(),  entries_offset_of<4>(), entries_offset_of<8>(),
      entries_offset_of<16>(), entries_offset_of<32>(), entries_offset_of<64>()};
  return offsets[static_cast<std::size_t>(log2_capacity_)];
}

TENSORPLAY_DECL int& CopyBatch::header() noexcept { return *std::launder(reinterpret_cast<int*>(storage_)); }

TENSORPLAY_DECL std::uint32_t& CopyBatch::first_tile(int i) noexcept {
  return std::launder(reinterpret_cast<std::uint32_t*>(storage_ + tiles_offset<1>()))[i];
}

TENSORPLAY_DECL kernels::CopyEntry& CopyBatch::entry(int i) noexcept {
  return std::launder(reinterpret_cast<kernels::CopyEntry*>(storage_ + entries_offset_))[i];
}

TENSORPLAY_DECL StagingNodes::~StagingNodes() {
  if (ring_) RingGraveyard::instance().retire(std::move(ring_), sequence_);
}

TENSORPLAY_DECL StagingNodeHandles StagingNodes::add_to(cudaGraph_t graph, int device, const tensorplay::source_location& where) {
  const KernelLibrary& library = KernelLibrary::on(device, where);
  DeviceGuard guard(device, where);  // cudaGraphAddKernelNode uses the current device
  int sms = 1;
  TENSORPLAY_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
  max_blocks_ = static_cast<unsigned>(sms) * config::copy_blocks_per_sm;
  std::size_t root_count = 0;
  TENSORPLAY_CHECK(cudaGraphGetRootNodes(graph, nullptr, &root_count), where);
  std::vector<cudaGraphNode_t> roots(root_count);
  if (root_count != 0) TENSORPLAY_CHECK(cudaGraphGetRootNodes(graph, roots.data(), &root_count), where);
  kernels::RingFetch no_fetch = fetch_params(0);
  kernels::RingCopyPlan<1> no_plan;  // count 0: touches nothing
  StagingNodeHandles nodes;
  const cudaKernelNodeParams fetch = fetch_node_params(library, no_fetch);
  TENSORPLAY_CHECK(cudaGraphAddKernelNode(&nodes.fetch, graph, nullptr, 0, &fetch), where);
  void* copy_args[] = {&no_plan};
  cudaKernelNodeParams copy{};
  copy.func = reinterpret_cast<void*>(library.ring_copy(0));
  copy.gridDim = dim3(1);
  copy.blockDim = dim3(config::copy_block_threads);
  copy.kernelParams = copy_args;
  TENSORPLAY_CHECK(cudaGraphAddKernelNode(&nodes.copy, graph, &nodes.fetch, 1, &copy), where);
  if (root_count != 0) {
    const std::vector<cudaGraphNode_t> from(root_count, nodes.copy);
    TENSORPLAY_CHECK(add_dependencies(graph, from.data(), roots.data(), nullptr, root_count), where);
  }
  device_ = device;
  return nodes;
}

TENSORPLAY_DECL void StagingNodes::adopt(StagingNodeHandles nodes) noexcept { nodes_ = nodes; }

TENSORPLAY_DECL void StagingNodes::compiled() noexcept {
  enabled_ = true;
  plan_count_ = 0;
}

TENSORPLAY_DECL void StagingNodes::updated_in_place(cudaGraphExec_t exec, const tensorplay::source_location& where) {
  plan_count_ = 0;
  set_enabled(exec, true, where);
}

TENSORPLAY_DECL bool StagingNodes::stage(cudaGraphExec_t exec, const CopyBatch& batch, cudaStream_t stream, const tensorplay::source_location& where) {
  if (!ring_->has_room(sequence_)) [[unlikely]] {
    launch_now(batch, stream, where);
    if (enabled_) disable(exec, where);
    return false;
  }
  if (plan_differs(batch)) [[unlikely]]
    set_plan(exec, batch, where);
  if (!enabled_) set_enabled(exec, true, where);
  ring_->write(sequence_, batch.count(), [&](int i) { return batch.entry(i).src; });
  return true;
}

TENSORPLAY_DECL bool StagingNodes::restage(cudaGraphExec_t exec, const void* const* sources, int count, const tensorplay::source_location& where) {
  if (count != plan_count_ || !ring_->has_room(sequence_)) [[unlikely]]
    return false;
  if (!enabled_) set_enabled(exec, true, where);
  ring_->write(sequence_, count, [&](int i) { return sources[i]; });
  return true;
}

TENSORPLAY_DECL void StagingNodes::launched() noexcept { ++sequence_; }

TENSORPLAY_DECL void StagingNodes::disable(cudaGraphExec_t exec, const tensorplay::source_location& where) { set_enabled(exec, false, where); }

TENSORPLAY_DECL void StagingNodes::launch_now(const CopyBatch& batch, cudaStream_t stream, const tensorplay::source_location& where) const {
  const KernelLibrary& library = KernelLibrary::on(device_, where);
  void* args[] = {batch.parameters()};
  launch(reinterpret_cast<const void*>(library.copy(batch.log2_capacity())), dim3(batch.blocks(max_blocks_)),
         dim3(config::copy_block_threads), stream, false, args, "cudaLaunchKernelEx (tensorplay copy kernel)", where);
}

TENSORPLAY_DECL kernels::RingFetch StagingNodes::fetch_params(int count) const noexcept {
  kernels::RingFetch p;
  p.ring = ring_->device_ring();
  p.state = ring_->device_state();
  p.status = ring_->device_status();
  p.slots = StagingRing::slots;
  p.count = count;
  return p;
}

TENSORPLAY_DECL cudaKernelNodeParams StagingNodes::fetch_node_params(const KernelLibrary& library, kernels::RingFetch& fetch) noexcept {
  fetch_args_[0] = &fetch;
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(library.ring_fetch());
  params.gridDim = dim3(1);
  params.blockDim = dim3(config::copy_table_max);
  params.kernelParams = fetch_args_;
  return params;
}

TENSORPLAY_DECL void StagingNodes::set_enabled(cudaGraphExec_t exec, bool enabled, const tensorplay::source_location& where) {
  check(exec_set_node_enabled(exec, nodes_.fetch, enabled), "cudaGraphNodeSetEnabled (stage_and_launch fetch node)", where);
  check(exec_set_node_enabled(exec, nodes_.copy, enabled), "cudaGraphNodeSetEnabled (stage_and_launch copy node)", where);
  enabled_ = enabled;
}

TENSORPLAY_DECL bool StagingNodes::plan_differs(const CopyBatch& batch) const noexcept {
  const int count = batch.count();
  bool differs = count != plan_count_;
  for (int i = 0; i < count; ++i) {
    const kernels::CopyEntry& e = batch.entry(i);
    differs |= (e.dst != targets_[i].dst) | (e.bytes != targets_[i].bytes);
  }
  return differs;
}

TENSORPLAY_DECL void StagingNodes::set_plan(cudaGraphExec_t exec, const CopyBatch& batch, const tensorplay::source_location& where) {
  const KernelLibrary& library = KernelLibrary::on(device_, where);
  const int count = batch.count();
  plan_count_ = 0;  // no plan while the two nodes may disagree
  with_capacity(batch.log2_capacity(), [&]<int Capacity>() {
    kernels::RingCopyPlan<Capacity> plan;  // at most 1.3 KB; CUDA copies it before returning
    plan.state = ring_->device_state();
    plan.status = ring_->device_status();
    plan.count = count;
    for (int i = 0; i <= count; ++i) plan.first_tile[i] = batch.first_tile(i);
    for (int i = 0; i < count; ++i) plan.targets[i] = {batch.entry(i).dst, batch.entry(i).bytes};
    void* args[] = {&plan};
    cudaKernelNodeParams params{};
    params.func = reinterpret_cast<void*>(library.ring_copy(batch.log2_capacity()));
    params.gridDim = dim3(batch.blocks(max_blocks_));
    params.blockDim = dim3(config::copy_block_threads);
    params.kernelParams = args;
    check(exec_set_kernel_params(exec, nodes_.copy, params), "cudaGraphExecKernelNodeSetParams (stage_and_launch copy node)",
          where);
  });
  kernels::RingFetch fetch = fetch_params(count);
  check(exec_set_kernel_params(exec, nodes_.fetch, fetch_node_params(library, fetch)),
        "cudaGraphExecKernelNodeSetParams (stage_and_launch fetch node)", where);
  for (int i = 0; i < count; ++i) targets_[i] = {batch.entry(i).dst, batch.entry(i).bytes};
  plan_count_ = count;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
