// tensorplay/detail/staging.hpp: how stage_and_launch moves one input onto its static buffer.
//
// Every pair is checked and classified first (plan_pair), so that a bad pair throws before
// anything is issued. Pairs that are contiguous, of one element type and on the graph's
// device go into one CopyTable, copied by a kernel node that sits in front of the graph;
// the others are issued here, on the same stream, before the launch (issue_fallback).
#pragma once

#include <tensorplay/detail/copy_kernels.hpp>
#include <tensorplay/detail/launch.hpp>
#include <tensorplay/device_tensor.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/tensor.hpp>

#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>

namespace tensorplay::detail {

//! Where a tensor's memory is, as CUDA sees it.
struct Placement {
  enum Kind : std::uint8_t { Device, Managed, PinnedHost, PageableHost } kind = Device;
  int device = -1;
};

template <Tensor T>
Placement placement_of(const T& t, const std::source_location& where) {
  if constexpr (KnowsDevice<T>) {
    return {Placement::Device, traits_of<T>::device(t)};
  } else {
    const PointerInfo info = pointer_info(tensor_data(t), where);
    switch (info.type) {
      case cudaMemoryTypeDevice: return {Placement::Device, info.device};
      case cudaMemoryTypeManaged: return {Placement::Managed, info.device};
      case cudaMemoryTypeHost: return {Placement::PinnedHost, -1};
      default: return {Placement::PageableHost, -1};
    }
  }
}

enum class StageKind : std::uint8_t {
  Skip,         // nothing to copy: empty, or the input is the static buffer itself
  Batched,      // raw device-to-device copy, batched into the copy node
  Convert,      // same device, other element type: thrust::transform
  Gather,       // same device, strided source: gather kernel (converting if needed)
  Host,         // host source (pinned or pageable), same element type: cudaMemcpyAsync
  HostConvert,  // host source, other element type: to a device temporary, then convert
  Peer,         // another GPU, same element type: cudaMemcpyPeerAsync
  PeerConvert,  // another GPU, other element type: peer copy to a temporary, then convert
};

struct StagePlan {
  StageKind kind = StageKind::Skip;
  int source_device = -1;
};

//! Compile-time checks of one (static buffer, input) pair, with messages users can read.
template <class S, class I>
consteval bool check_stage_pair() {
  static_assert(ContiguousTensor<S>,
                "stage_and_launch: every static buffer must be a ContiguousTensor (DeviceTensor, "
                "thrust::device_vector, std::span, or cuda::std::mdspan with layout_right or layout_left)");
  static_assert(Tensor<I>, "stage_and_launch: every input must be a Tensor (see tensorplay/tensor.hpp)");
  if constexpr (ContiguousTensor<S> && Tensor<I>) {
    static_assert(!RuntimeTyped<S> && !RuntimeTyped<I>,
                  "stage_and_launch: tensors typed at run time (TensorView) cannot be staged");
    if constexpr (!RuntimeTyped<S> && !RuntimeTyped<I>) {
      static_assert(!std::is_const_v<typename traits_of<S>::element_type>,
                    "stage_and_launch: a static buffer must be writable (its element type is const)");
      static_assert(std::is_convertible_v<element_t<I>, element_t<S>>,
                    "stage_and_launch: an input's element type does not convert to its static buffer's element type");
    }
  }
  return true;
}

template <class To>
struct ConvertTo {
  template <class From>
  __host__ __device__ To operator()(const From& x) const {
    return static_cast<To>(x);
  }
};

inline std::string pair_name(std::size_t index) { return "stage_and_launch: pair " + std::to_string(index); }

//! Checks one pair and decides how to move it. Throws usage_error; issues nothing.
template <class S, class I>
StagePlan plan_pair(std::size_t index, const S& dst, const I& src, int device, const std::source_location& where) {
  using To = element_t<S>;
  using From = element_t<I>;
  const std::size_t n = tensor_size(dst);
  if (tensor_size(src) != n)
    throw_usage(pair_name(index) + ": the input has " + std::to_string(tensor_size(src)) +
                " elements but its static buffer has " + std::to_string(n));
  if (n == 0) return {};
  const Placement target = placement_of(dst, where);
  const bool on_graph_device = (target.kind == Placement::Device && target.device == device) || target.kind == Placement::Managed;
  if (!on_graph_device)
    throw_usage(pair_name(index) + ": the static buffer is not device memory of the graph's device " + std::to_string(device));
  if constexpr (std::same_as<To, From> && ContiguousTensor<I>) {
    if (static_cast<const void*>(tensor_data(src)) == static_cast<const void*>(tensor_data(dst))) return {};
  }
  constexpr bool same = std::same_as<To, From>;
  constexpr bool dense = ContiguousTensor<I>;
  const Placement source = placement_of(src, where);
  switch (source.kind) {
    case Placement::Device:
      if (source.device != device) {
        if (!dense) throw_usage(pair_name(index) + ": a strided input on another GPU is not supported; make it contiguous");
        return {same ? StageKind::Peer : StageKind::PeerConvert, source.device};
      }
      [[fallthrough]];
    case Placement::Managed:
      if (!dense) return {StageKind::Gather, device};
      return {same ? StageKind::Batched : StageKind::Convert, device};
    case Placement::PinnedHost:
    case Placement::PageableHost:
      if (!dense) throw_usage(pair_name(index) + ": a strided input in host memory is not supported; make it contiguous");
      return {same ? StageKind::Host : StageKind::HostConvert, -1};
  }
  return {};
}

//! Adds a Batched pair to the table of the copy node.
template <class S, class I>
void add_entry(CopyTable& table, const S& dst, const I& src) {
  const std::size_t bytes = tensor_size(dst) * sizeof(element_t<S>);
  CopyEntry& entry = table.entries[table.count];
  entry.src = tensor_data(src);
  entry.dst = tensor_data(dst);
  entry.bytes = bytes;
  table.first_tile[table.count + 1] = table.first_tile[table.count] + (bytes + copy_tile_bytes - 1) / copy_tile_bytes;
  ++table.count;
}

template <class From, class To>
void convert_on_device(const From* src, To* dst, std::size_t n, cudaStream_t stream) {
  thrust::transform(thrust::cuda::par_nosync.on(stream), src, src + n, dst, ConvertTo<To>{});
}

//! Issues a non-batched pair on `stream` (asynchronously, in stream order).
template <class S, class I>
void issue_fallback(const StagePlan& plan, const S& dst, const I& src, int device, cudaStream_t stream,
                    const std::source_location& where) {
  using To = element_t<S>;
  using From = element_t<I>;
  const std::size_t n = tensor_size(dst);
  To* out = tensor_data(dst);
  const From* in = tensor_data(src);
  switch (plan.kind) {
    case StageKind::Skip:
    case StageKind::Batched: return;
    case StageKind::Convert: convert_on_device(in, out, n, stream); return;
    case StageKind::Gather:
      if constexpr (ExposesStrides<I>) {
        constexpr std::size_t rank = traits_of<I>::rank;
        static_assert(rank <= max_gather_rank, "stage_and_launch: strided inputs of rank above 8 are not supported");
        StridedLayout layout;
        layout.rank = static_cast<int>(rank);
        for (std::size_t r = 0; r < rank; ++r) {
          layout.extents[r] = traits_of<I>::extent(src, r);
          layout.strides[r] = traits_of<I>::stride(src, r);
        }
        const auto blocks = static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096);
        launch(&gather_convert_kernel<From, To>, dim3(blocks), dim3(256), stream, where, false, in, out, n, layout);
      }
      return;
    case StageKind::Host:
      TENSORPLAY_CHECK(cudaMemcpyAsync(out, in, n * sizeof(To), cudaMemcpyHostToDevice, stream), where);
      return;
    case StageKind::HostConvert: {
      DeviceTensor<From> temporary(n, stream, where);  // freed in stream order: reused only after the convert
      TENSORPLAY_CHECK(cudaMemcpyAsync(temporary.data(), in, n * sizeof(From), cudaMemcpyHostToDevice, stream), where);
      convert_on_device(temporary.data(), out, n, stream);
      return;
    }
    case StageKind::Peer:
      TENSORPLAY_CHECK(cudaMemcpyPeerAsync(out, device, in, plan.source_device, n * sizeof(To), stream), where);
      return;
    case StageKind::PeerConvert: {
      DeviceTensor<From> temporary(n, stream, where);
      TENSORPLAY_CHECK(
          cudaMemcpyPeerAsync(temporary.data(), device, in, plan.source_device, n * sizeof(From), stream), where);
      convert_on_device(temporary.data(), out, n, stream);
      return;
    }
  }
}

}  // namespace tensorplay::detail
