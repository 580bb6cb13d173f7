// tensorplay/detail/random_segment.hpp: RandomState inside a capture: one advance node per segment.
//
// A segment is a stretch of one stream of one capture graph (a conditional body is a capture of
// its own) with no conditional node in it. Its first draw captures a one-thread kernel node
// (tensorplay_random_advance) that, at every run of the graph, copies the seed and takes the
// segment's offsets from the RandomState's counter into the segment's slot; the draw's launch
// follows it on the stream. Every further draw in the segment takes the next offsets past the
// first (`intra`), and raises the node's increment by its own (cudaGraphKernelNodeSetParams on
// the graph being captured, which CUDA allows). So a replay costs no host work at all, each run
// of a while body takes fresh offsets, and the offsets are those an eager run in the same order
// would take: launches before a conditional node, then the node's bodies, then what follows.
//
// The segment's launches must be issued to the stream the draws were made on (the advance node
// is their ancestor there). A Graph replayed into the capture (a child graph) ends the segment,
// as a conditional node does (Graph::add_to_capture): draws after it take their offsets after
// the child's, in the order of an eager run.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/random_arena.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tensorplay::detail {

//! What a draw hands to its launch: the slot its advance writes, and its offset past the slot's base.
struct Draw {
  const kernels::RandomSlot* slot;
  std::uint64_t intra;
};

//! The capture state of `stream`, asked with the edge data of its dependencies: without it CUDA
//! refuses the query (cudaErrorLossyQuery) after a launch with a programmatic edge.
TENSORPLAY_DECL cudaError_t capture_info_with_edges(cudaStream_t stream, CaptureInfo& info) noexcept;

//! The open segments of one RandomState. Not thread-safe: the RandomState's mutex guards it.
class RandomSegments {
 public:
  //! A draw of `increment` offsets of `counter` for the next launch on `stream`, whose capture
  //! is `info` (active).
  Draw draw(kernels::RandomCounter* counter, const KernelLibrary& library, RandomArena& arena, int device,
            cudaStream_t stream, const CaptureInfo& info, std::uint64_t increment, const tensorplay::source_location& where);

 private:
  struct Segment {
    CaptureSeq seq;
    cudaStream_t stream;
    std::uint64_t epoch;        // conditional_epoch() when the segment began
    cudaGraphNode_t node;       // its advance node, in the graph being captured
    kernels::RandomCounter* counter;
    kernels::RandomSlot* slot;  // what the node writes
    std::uint64_t total;        // the node's increment: the offsets of every draw so far
  };

  // Segments of captures that are still open, most recent last. Older ones are forgotten (a
  // draw there then starts a new segment, which is correct, merely one node more).
  static constexpr std::size_t max_open = 8;

  // The segment's slot: graph memory of the capture's pool (held until the capture ends; see
  // random_arena.hpp), or, for a capture tensorplay did not begin, a slot of the arena.
  static kernels::RandomSlot* slot_for(RandomArena& arena, int device, cudaStream_t stream, const CaptureInfo& info,
                                       const tensorplay::source_location& where);

  static cudaKernelNodeParams advance_params(const KernelLibrary& library, void** args) noexcept;

  // Captures the segment's advance node after the stream's dependencies, and makes it the
  // stream's only dependency. Its edges are full ones, whatever the stream's were.
  static void add_advance_node(Segment& s, const KernelLibrary& library, int device,
                               cudaStream_t stream, const CaptureInfo& info, std::uint64_t increment,
                               const tensorplay::source_location& where);

  static void set_increment(Segment& s, const KernelLibrary& library, std::uint64_t total, const tensorplay::source_location& where);

  std::vector<Segment> open_;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/detail/random_epoch.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL cudaError_t capture_info_with_edges(cudaStream_t stream, CaptureInfo& info) noexcept {
  const cudaGraphEdgeData* edges = nullptr;
#if CUDART_VERSION >= 13000
  return cudaStreamGetCaptureInfo(stream, &info.status, &info.seq, &info.graph, &info.dependencies, &edges,
                                  &info.dependency_count);
#else
  return cudaStreamGetCaptureInfo_v3(stream, &info.status, &info.seq, &info.graph, &info.dependencies, &edges,
                                     &info.dependency_count);
#endif
}

TENSORPLAY_DECL Draw RandomSegments::draw(kernels::RandomCounter* counter, const KernelLibrary& library, RandomArena& arena, int device,
    cudaStream_t stream, const CaptureInfo& info, std::uint64_t increment, const tensorplay::source_location& where) {
  const std::uint64_t epoch = conditional_epoch();
  for (Segment& s : open_) {
    if (s.seq != info.seq || s.stream != stream || s.epoch != epoch) continue;
    const Draw d{s.slot, s.total};
    set_increment(s, library, s.total + increment, where);
    return d;
  }
  arena.sweep();
  Segment s{info.seq, stream, epoch, nullptr, counter, slot_for(arena, device, stream, info, where), 0};
  add_advance_node(s, library, device, stream, info, increment, where);
  if (open_.size() == max_open) open_.erase(open_.begin());
  open_.push_back(s);
  return {s.slot, 0};
}

TENSORPLAY_DECL kernels::RandomSlot* RandomSegments::slot_for(RandomArena& arena, int device, cudaStream_t stream, const CaptureInfo& info,
    const tensorplay::source_location& where) {
  CaptureContext* context = CaptureRegistry::instance().find(info.seq);
  if (context == nullptr) return arena.take_slot(where);
  PoolBlock block(sizeof(kernels::RandomSlot), stream, [device] { return device; }, where);
  auto* slot = static_cast<kernels::RandomSlot*>(block.ptr());
  const CaptureSeq root = capture_seq_or_zero(context->origin());
  arena.hold(std::move(block), root != 0 ? root : info.seq);
  return slot;
}

TENSORPLAY_DECL cudaKernelNodeParams RandomSegments::advance_params(const KernelLibrary& library, void** args) noexcept {
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(library.random_advance());
  params.gridDim = dim3(1);
  params.blockDim = dim3(1);
  params.kernelParams = args;
  return params;
}

TENSORPLAY_DECL void RandomSegments::add_advance_node(Segment& s, const KernelLibrary& library, int device,
    cudaStream_t stream, const CaptureInfo& info, std::uint64_t increment,
    const tensorplay::source_location& where) {
  DeviceGuard guard(device, where);  // cudaGraphAddKernelNode uses the current device
  void* args[] = {&s.counter, &s.slot, &increment};
  const cudaKernelNodeParams params = advance_params(library, args);
  TENSORPLAY_CHECK(cudaGraphAddKernelNode(&s.node, info.graph, info.dependencies, info.dependency_count, &params), where);
  TENSORPLAY_CHECK(set_capture_dependencies(stream, &s.node, 1), where);
  s.total = increment;
}

TENSORPLAY_DECL void RandomSegments::set_increment(Segment& s, const KernelLibrary& library, std::uint64_t total, const tensorplay::source_location& where) {
  void* args[] = {&s.counter, &s.slot, &total};
  const cudaKernelNodeParams params = advance_params(library, args);
  TENSORPLAY_CHECK(cudaGraphKernelNodeSetParams(s.node, &params), where);
  s.total = total;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
