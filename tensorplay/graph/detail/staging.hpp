// tensorplay/graph/detail/staging.hpp: how stage_and_launch moves each input onto its static buffer.
//
// Every pair is checked and classified first (plan_pair, check_overlaps), so that a bad pair
// throws before anything is issued. Pairs that are contiguous, of one element type and on the
// graph's device are batched into the copy node in front of the graph (staging_nodes.hpp); the others
// are issued here, on the same stream, before the launch (issue_unbatched).
//
// Copy semantics are exact or refused: a copy whose input overlaps a static buffer would read
// what it writes, so it is refused with usage_error (an input identical to its own static buffer
// is no copy at all and is skipped).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_context.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! Where a tensor's memory is, as CUDA sees it.
struct Placement {
  enum Kind : std::uint8_t { Device, Managed, PinnedHost, PageableHost } kind = Device;
  int device = -1;
};

template <Tensor T>
Placement placement_of(const T& t, const tensorplay::source_location& where) {
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
  Convert,      // same device, other element type, or a strided source: gather/convert kernel
  Host,         // host source (pinned or pageable), same element type: cudaMemcpyAsync
  HostConvert,  // host source, other element type: to a device temporary, then convert
  Peer,         // another GPU, same element type: cudaMemcpyPeerAsync
  PeerConvert,  // another GPU, other element type: peer copy to a temporary, then convert
};

struct StagePlan {
  StageKind kind = StageKind::Skip;
  int source_device = -1;
};

//! The gather/convert kernel's code for element type T.
template <class T>
constexpr kernels::ElementCode element_code() noexcept {
  if constexpr (has_dtype_v<T>) return static_cast<kernels::ElementCode>(static_cast<int>(dtype_v<T>));
  else return kernels::ElementCode::Bytes;
}

//! Compile-time checks of one (static buffer, input) pair, with messages users can read.
template <class S, class I>
consteval bool check_stage_pair() {
  static_assert(ContiguousTensor<S>,
                "stage_and_launch: every static buffer must be a ContiguousTensor (DeviceTensor, "
                "thrust::device_vector, std::span, or an mdspan with layout_right or layout_left)");
  static_assert(Tensor<I>, "stage_and_launch: every input must be a Tensor (see tensorplay/tensor.hpp)");
  if constexpr (ContiguousTensor<S> && Tensor<I>) {
    static_assert(!RuntimeTyped<S> && !RuntimeTyped<I>,
                  "stage_and_launch: tensors typed at run time (TensorView) cannot be staged");
    if constexpr (!RuntimeTyped<S> && !RuntimeTyped<I>) {
      static_assert(!std::is_const_v<typename traits_of<S>::element_type>,
                    "stage_and_launch: a static buffer must be writable (its element type is const)");
      static_assert(std::is_convertible_v<element_t<I>, element_t<S>>,
                    "stage_and_launch: an input's element type does not convert to its static buffer's element type");
      static_assert(std::same_as<element_t<I>, element_t<S>> || (has_dtype_v<element_t<I>> && has_dtype_v<element_t<S>>),
                    "stage_and_launch: converting between element types needs both among tensorplay's DType list "
                    "(bool, the integers, __half, __nv_bfloat16, float, double)");
    }
  }
  return true;
}

TENSORPLAY_DECL std::string pair_name(std::size_t index);

//! What planning needs to know of one pair. Gathered per pair type (facts_of), then judged by
//! one loop (classify): the per-pair code that every call runs stays small, whatever the arity.
struct PairFacts {
  std::size_t n = 0;      // elements of the static buffer
  std::size_t src_n = 0;  // elements of the input
  Placement target;
  Placement source;
  bool identical = false;  // the input is the static buffer itself (same type, same address)
  bool same_type = false;
  bool dense = false;      // the input is contiguous
};

template <class S, class I>
PairFacts facts_of(const S& dst, const I& src, const tensorplay::source_location& where) {
  PairFacts f;
  f.n = tensor_size(dst);
  f.src_n = tensor_size(src);
  if (f.n == 0 || f.n != f.src_n) return f;  // classify decides without placements
  f.same_type = std::same_as<element_t<S>, element_t<I>>;
  f.dense = ContiguousTensor<I>;
  f.target = placement_of(dst, where);
  if constexpr (std::same_as<element_t<S>, element_t<I>> && ContiguousTensor<I>)
    f.identical = static_cast<const void*>(tensor_data(src)) == static_cast<const void*>(tensor_data(dst));
  if (!f.identical) f.source = placement_of(src, where);
  return f;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_pair(std::size_t index, const std::string& what) {
  throw_usage(pair_name(index) + ": " + what);
}

//! Checks one pair and decides how to move it. Throws usage_error; issues nothing.
TENSORPLAY_DECL StagePlan classify(std::size_t index, const PairFacts& f, int device);

//! The bytes a tensor's elements span, [begin, end): for strided tensors, from the lowest to the
//! highest element address.
//! No default member initializers: planning fills arrays of them, and zeroing those first costs
//! as much as the rest of a 32-pair plan.
struct ByteRange {
  std::uintptr_t begin;
  std::uintptr_t end;
  [[nodiscard]] bool empty() const noexcept { return begin == end; }
  [[nodiscard]] bool overlaps(const ByteRange& other) const noexcept;
};

template <Tensor T>
ByteRange byte_range(const T& t) noexcept {
  const std::size_t n = tensor_size(t);
  const auto base = reinterpret_cast<std::uintptr_t>(tensor_data(t));
  constexpr std::size_t size = sizeof(element_t<T>);
  if (n == 0) return {base, base};
  if constexpr (ContiguousTensor<T>) {
    return {base, base + n * size};
  } else {
    std::ptrdiff_t low = 0;
    std::ptrdiff_t high = 0;
    for (std::size_t r = 0; r < traits_of<T>::rank; ++r) {
      const auto reach = static_cast<std::ptrdiff_t>(traits_of<T>::extent(t, r) - 1) * traits_of<T>::stride(t, r);
      (reach < 0 ? low : high) += reach;
    }
    return {base + static_cast<std::uintptr_t>(low * static_cast<std::ptrdiff_t>(size)),
            base + static_cast<std::uintptr_t>((high + 1) * static_cast<std::ptrdiff_t>(size))};
  }
}

//! The static buffers of the last stage_and_launch, sorted by address: most calls stage onto the
//! same buffers, so check_overlaps sorts them only when they change.
struct StaticOrder {
  std::vector<ByteRange> statics;      // in pair order, as last checked
  std::vector<ByteRange> inputs;       // the inputs of the last call that passed, in pair order
  std::vector<std::size_t> order;      // pair indices by address
  std::vector<std::uintptr_t> ends;    // statics[order[k]].end, ascending
  std::uintptr_t low = 0;              // the lowest begin and the highest end of all static buffers
  std::uintptr_t high = 0;
  // The last call that passed copied every pair through the copy node, whose plan (destinations
  // and sizes) is then `statics`: set by the caller after such a call, cleared by plan_pairs.
  bool batched_plan = false;
};

//! The pair whose static buffer overlaps `in` (cache.statics in pair order), or -1. Only the
//! first static buffer by address that ends after `in` begins can, since they do not overlap
//! each other.
TENSORPLAY_DECL std::ptrdiff_t overlapped_static(const StaticOrder& cache, const ByteRange& in) noexcept;

//! Sorts `statics` by address into `cache`, refusing static buffers that overlap each other.
template <std::size_t N>
void order_statics(const std::array<ByteRange, N>& statics, StaticOrder& cache) {
  std::vector<std::size_t> order;  // the static buffers that hold bytes (an empty one overlaps nothing)
  order.reserve(N);
  for (std::size_t i = 0; i < N; ++i)
    if (!statics[i].empty()) order.push_back(i);
  sort_range(order.data(), order.size(), [&](std::size_t a, std::size_t b) { return statics[a].begin < statics[b].begin; });
  for (std::size_t k = 1; k < order.size(); ++k)
    if (statics[order[k - 1]].overlaps(statics[order[k]]))
      throw_usage("stage_and_launch: pairs " + std::to_string(order[k - 1]) + " and " + std::to_string(order[k]) +
                  " name overlapping static buffers (the same buffer twice?)");
  cache.statics.assign(statics.begin(), statics.end());
  cache.ends.resize(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) cache.ends[k] = statics[order[k]].end;  // ascending: no overlaps
  cache.low = order.empty() ? 0 : statics[order.front()].begin;
  cache.high = order.empty() ? 0 : statics[order.back()].end;
  cache.order = std::move(order);
}

//! Refuses, before anything is issued, pairs whose copies would read what another copy writes:
//! static buffers that overlap each other, and inputs that overlap any static buffer (except an
//! input that is its own static buffer, planned as Skip). The static buffers are sorted by
//! address (once, while they stay the same). An input outside the span of all static buffers
//! costs two comparisons; one inside it a binary search.
template <std::size_t N>
void check_overlaps(const std::array<ByteRange, N>& statics, const std::array<ByteRange, N>& inputs,
                    const std::array<StagePlan, N>& plans, StaticOrder& cache) {
  static_assert(sizeof(ByteRange) == 2 * sizeof(std::uintptr_t));  // no padding: compared as bytes
  if (cache.statics.size() != N || std::memcmp(statics.data(), cache.statics.data(), sizeof(statics)) != 0) {
    order_statics(statics, cache);
    cache.inputs.assign(N, ByteRange{0, 0});
  } else if (std::memcmp(inputs.data(), cache.inputs.data(), sizeof(inputs)) == 0) {
    return;  // the last call's pairs exactly: they passed
  }
  for (std::size_t i = 0; i < N; ++i) {
    const ByteRange& in = inputs[i];
    if (plans[i].kind == StageKind::Skip) continue;
    // The same input as in the last call that passed, onto the same static buffers: checked then.
    if (in.begin == cache.inputs[i].begin && in.end == cache.inputs[i].end) continue;
    const std::ptrdiff_t j = overlapped_static(cache, in);
    if (j < 0) continue;
    if (static_cast<std::size_t>(j) == i)
      throw_usage(pair_name(i) + ": the input overlaps its own static buffer (the copy would read what it writes); "
                                 "stage from a separate buffer");
    throw_usage(pair_name(i) + ": the input overlaps the static buffer of pair " + std::to_string(j) +
                " (a copy would read what another writes)");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) cache.inputs[i] = inputs[i];  // every pair passed
}

//! A pair whose planning needs no pointer query: both sides contiguous, of one element type, and
//! of a type that knows its device (DeviceTensor, thrust::device_vector).
template <class S, class I>
concept DevicePair = ContiguousTensor<S> && ContiguousTensor<I> && KnowsDevice<S> && KnowsDevice<I> &&
                     std::same_as<std::remove_cv_t<element_t<S>>, std::remove_cv_t<element_t<I>>>;

//! Plans a DevicePair with a few comparisons; anything unusual goes to classify, which says why.
template <class S, class I>
[[gnu::always_inline]] inline StagePlan plan_device_pair(std::size_t index, const S& dst, const I& src, int device, const tensorplay::source_location& where) {
  const std::size_t n = tensor_size(dst);
  if (n != tensor_size(src) || traits_of<S>::device(dst) != device) [[unlikely]]
    return classify(index, facts_of(dst, src, where), device);  // throws, or plans an empty pair
  if (n == 0 || static_cast<const void*>(tensor_data(src)) == static_cast<const void*>(tensor_data(dst))) return {};
  const int source_device = traits_of<I>::device(src);
  if (source_device != device) return {StageKind::Peer, source_device};
  return {StageKind::Batched, device};
}

//! Calls f(k, static buffer k, input k) for every pair, k a std::integral_constant: one
//! instance of f's body per pair, unrolled.
template <class StaticTuple, class InputTuple, class F>
[[gnu::always_inline]] inline void for_each_pair(const StaticTuple& statics, const InputTuple& inputs, F&& f) {
  [&]<std::size_t... k>(std::index_sequence<k...>) {
    (f(std::integral_constant<std::size_t, k>{}, std::get<k>(statics), std::get<k>(inputs)), ...);
  }(std::make_index_sequence<std::tuple_size_v<StaticTuple>>{});
}

//! Checks and plans every (static buffer, input) pair of one call, before anything is issued.
template <class StaticTuple, class InputTuple>
auto plan_pairs(const StaticTuple& statics, const InputTuple& inputs, int device, StaticOrder& cache,
                const tensorplay::source_location& where) {
  constexpr std::size_t n = std::tuple_size_v<StaticTuple>;
  cache.batched_plan = false;  // until the caller has staged this call through the copy node
  std::array<StagePlan, n> plans;
  std::array<ByteRange, n> static_ranges;
  std::array<ByteRange, n> input_ranges;
  for_each_pair(statics, inputs, [&](auto k, const auto& dst, const auto& src) {
    using S = std::remove_cvref_t<decltype(dst)>;
    using I = std::remove_cvref_t<decltype(src)>;
    if constexpr (DevicePair<S, I>) plans[k] = plan_device_pair(k, dst, src, device, where);
    else plans[k] = classify(k, facts_of(dst, src, where), device);
    static_ranges[k] = byte_range(dst);
    input_ranges[k] = byte_range(src);
  });
  check_overlaps(static_ranges, input_ranges, plans, cache);
  return plans;
}

//! The fast path of stage_and_launch (a call whose pairs are all DevicePairs): true when the
//! last call that passed staged every pair through the copy node (cache.batched_plan) and this
//! call names the same static buffers, of the same sizes, on the graph's device, with inputs that
//! overlap none of them. The plan in the copy node then stands, and only the call's sources
//! (written to `sources` in pair order) go to the ring. One pass over the pairs; an input other
//! than the last one that passed, within the span of the static buffers, is searched for. False
//! leaves everything to plan_pairs, which says what is wrong, if anything.
template <class StaticTuple, class InputTuple, std::size_t N>
[[gnu::always_inline]] inline bool same_batched_plan(const StaticTuple& statics, const InputTuple& inputs, int device,
                                                     const StaticOrder& cache, std::array<const void*, N>& sources) noexcept {
  if (!cache.batched_plan || cache.statics.size() != N) return false;
  const ByteRange* known = cache.statics.data();
  const ByteRange* passed = cache.inputs.data();
  bool same = true;
  bool search = false;
  for_each_pair(statics, inputs, [&](auto k, const auto& dst, const auto& src) {
    using S = std::remove_cvref_t<decltype(dst)>;
    using I = std::remove_cvref_t<decltype(src)>;
    static_assert(DevicePair<S, I>);
    const std::size_t n = tensor_size(dst);
    const auto d = reinterpret_cast<std::uintptr_t>(tensor_data(dst));
    const void* from = tensor_data(src);
    const auto s = reinterpret_cast<std::uintptr_t>(from);
    const std::size_t bytes = n * sizeof(element_t<S>);
    const int dst_device = traits_of<S>::device(dst);
    const int src_device = traits_of<I>::device(src);
    const std::size_t src_n = tensor_size(src);
    constexpr std::size_t i = decltype(k)::value;
    // Bitwise on purpose: no branch per comparison.
    same &= (d == known[i].begin) & (d + bytes == known[i].end) & (src_n == n) & (dst_device == device) &
            (src_device == device);
    search |= (s != passed[i].begin) & (s + bytes > cache.low) & (s < cache.high);
    sources[i] = from;
  });
  if (!same) return false;
  if (search) [[unlikely]]
    for (std::size_t i = 0; i < N; ++i) {
      const auto s = reinterpret_cast<std::uintptr_t>(sources[i]);
      if (overlapped_static(cache, {s, s + (known[i].end - known[i].begin)}) >= 0) return false;
    }
  return true;
}

//! Launches the gather/convert kernel: dst[i] = To(src element i), src described by `layout`.
TENSORPLAY_DECL void launch_gather(const void* src, kernels::ElementCode from, void* dst, kernels::ElementCode to, std::size_t n,
                          std::size_t element_bytes, const kernels::StridedLayout& layout, int device, cudaStream_t stream,
                          const tensorplay::source_location& where);

//! The layout of a tensor's elements for the gather kernel (rank 1, stride 1 when contiguous).
template <Tensor T>
kernels::StridedLayout layout_of(const T& t) {
  kernels::StridedLayout layout;
  if constexpr (ContiguousTensor<T>) {
    layout.rank = 1;
    layout.extents[0] = tensor_size(t);
    layout.strides[0] = 1;
  } else {
    constexpr std::size_t rank = traits_of<T>::rank;
    static_assert(rank <= config::max_gather_rank, "stage_and_launch: strided inputs of rank above 8 are not supported");
    layout.rank = static_cast<int>(rank);
    for (std::size_t r = 0; r < rank; ++r) {
      layout.extents[r] = traits_of<T>::extent(t, r);
      layout.strides[r] = traits_of<T>::stride(t, r);
    }
  }
  return layout;
}

//! Issues a pair that is not batched on `stream` (asynchronously, in stream order).
template <class S, class I>
void issue_unbatched(const StagePlan& plan, const S& dst, const I& src, int device, cudaStream_t stream,
                     const tensorplay::source_location& where) {
  using To = element_t<S>;
  using From = element_t<I>;
  constexpr auto to_code = element_code<To>();
  constexpr auto from_code = std::same_as<To, From> ? kernels::ElementCode::Bytes : element_code<From>();
  const std::size_t n = tensor_size(dst);
  To* out = tensor_data(dst);
  const From* in = tensor_data(src);
  // A device temporary for host and peer sources that need converting: freed in stream order
  // (reused only by work issued after the conversion).
  auto converted_through_temporary = [&](auto&& fill_temporary) {
    PoolBlock temporary(n * sizeof(From), stream, [device] { return device; }, where);
    fill_temporary(temporary.ptr());
    launch_gather(temporary.ptr(), from_code, out, to_code, n, sizeof(From), layout_of(std::span<const From>(in, n)),
                  device, stream, where);
  };
  switch (plan.kind) {
    case StageKind::Skip:
    case StageKind::Batched: return;
    case StageKind::Convert:
      launch_gather(in, from_code, out, std::same_as<To, From> ? kernels::ElementCode::Bytes : to_code, n, sizeof(From),
                    layout_of(src), device, stream, where);
      return;
    case StageKind::Host:
      TENSORPLAY_CHECK(cudaMemcpyAsync(out, in, n * sizeof(To), cudaMemcpyHostToDevice, stream), where);
      return;
    case StageKind::HostConvert:
      converted_through_temporary([&](void* temporary) {
        TENSORPLAY_CHECK(cudaMemcpyAsync(temporary, in, n * sizeof(From), cudaMemcpyHostToDevice, stream), where);
      });
      return;
    case StageKind::Peer:
      TENSORPLAY_CHECK(cudaMemcpyPeerAsync(out, device, in, plan.source_device, n * sizeof(To), stream), where);
      return;
    case StageKind::PeerConvert:
      converted_through_temporary([&](void* temporary) {
        TENSORPLAY_CHECK(cudaMemcpyPeerAsync(temporary, device, in, plan.source_device, n * sizeof(From), stream), where);
      });
      return;
  }
}

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/kernel_library.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL std::string pair_name(std::size_t index) { return "stage_and_launch: pair " + std::to_string(index); }

TENSORPLAY_DECL StagePlan classify(std::size_t index, const PairFacts& f, int device) {
  if (f.src_n != f.n) [[unlikely]]
    throw_pair(index, "the input has " + std::to_string(f.src_n) + " elements but its static buffer has " + std::to_string(f.n));
  if (f.n == 0) return {};
  const bool on_graph_device =
      (f.target.kind == Placement::Device && f.target.device == device) || f.target.kind == Placement::Managed;
  if (!on_graph_device) [[unlikely]]
    throw_pair(index, "the static buffer is not device memory of the graph's device " + std::to_string(device));
  if (f.identical) return {};
  switch (f.source.kind) {
    case Placement::Device:
      if (f.source.device != device) {
        if (!f.dense) [[unlikely]]
          throw_pair(index, "a strided input on another GPU is not supported; make it contiguous");
        return {f.same_type ? StageKind::Peer : StageKind::PeerConvert, f.source.device};
      }
      [[fallthrough]];
    case Placement::Managed:
      return {f.same_type && f.dense ? StageKind::Batched : StageKind::Convert, device};
    case Placement::PinnedHost:
    case Placement::PageableHost:
      if (!f.dense) [[unlikely]]
        throw_pair(index, "a strided input in host memory is not supported; make it contiguous");
      return {f.same_type ? StageKind::Host : StageKind::HostConvert, -1};
  }
  return {};
}

TENSORPLAY_DECL bool ByteRange::overlaps(const ByteRange& other) const noexcept {
  return !empty() && !other.empty() && begin < other.end && other.begin < end;
}

TENSORPLAY_DECL std::ptrdiff_t overlapped_static(const StaticOrder& cache, const ByteRange& in) noexcept {
  if (in.empty() || in.end <= cache.low || in.begin >= cache.high) return -1;
  const std::uintptr_t* base = cache.ends.data();  // not empty: the input lies within [low, high)
  std::size_t n = cache.ends.size();
  while (n > 1) {
    const std::size_t half = n / 2;
    base = base[half - 1] <= in.begin ? base + half : base;
    n -= half;
  }
  const std::size_t k = static_cast<std::size_t>(base - cache.ends.data()) + (*base <= in.begin ? 1 : 0);
  if (k == cache.ends.size()) return -1;
  const std::size_t j = cache.order[k];
  return cache.statics[j].overlaps(in) ? static_cast<std::ptrdiff_t>(j) : -1;
}

TENSORPLAY_DECL void launch_gather(const void* src, kernels::ElementCode from, void* dst, kernels::ElementCode to, std::size_t n,
    std::size_t element_bytes, const kernels::StridedLayout& layout, int device, cudaStream_t stream,
    const tensorplay::source_location& where) {
  const KernelLibrary& library = KernelLibrary::on(device, where);
  const auto blocks = static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096);
  int from_code = static_cast<int>(from);
  int to_code = static_cast<int>(to);
  kernels::StridedLayout copy_of_layout = layout;
  void* args[] = {&src, &from_code, &dst, &to_code, &n, &element_bytes, &copy_of_layout};
  launch(reinterpret_cast<const void*>(library.gather()), dim3(blocks), dim3(256), stream, false, args,
         "cudaLaunchKernelEx (tensorplay gather/convert kernel)", where);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
