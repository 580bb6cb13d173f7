// tensorplay/graph/detail/rebind.hpp: the machinery of Graph::rebind: the checks of its arguments,
// the index of an executable's pointer-sized parameter words, and where stage_and_launch's static
// buffers are after rebinds.
//
// The index (RebindIndex) is built once per executable, at its first rebind: one walk of the graph
// the executable runs, child graphs and conditional bodies included, that records for every
// kernel, memset and memcpy node its parameters as the executable has them, and every
// pointer-sized, pointer-aligned word of them: a kernel's parameter words (each parameter's
// offset and size from cuFuncGetParamInfo / cuKernelGetParamInfo, so that a pointer inside a
// struct argument counts), a memset's destination, a memcpy's source and destination. Their
// values sit in one flat array: a rebind is one pass of comparisons over it (value - from < bytes,
// so an end pointer, from + bytes, is not taken), then one set-params call per node that holds
// such a word. Set-params calls on an executable do not change its graph, so the index keeps each
// node's parameters as the executable has them: a second rebind finds the new buffer, and a
// rebind back restores the first.
//
// How each node changes:
//   - a node of the graph the executable was compiled from: cuGraphExecKernelNodeSetParams (the
//     driver's, which takes the library's own kernels, loaded from a cudaLibrary, as well as the
//     user's), cudaGraphExecMemsetNodeSetParams, cudaGraphExecMemcpyNodeSetParams1D;
//   - a node of a conditional body or of a child graph: the same call is tried first. CUDA 13.0
//     documents per-node calls for nodes "from the graph from which graphExec was instantiated",
//     and documents body and child nodes as updatable by cudaGraphExecUpdate ("Changing parameters
//     of nodes within the conditional body graph is subject to the rules above"; for child graphs
//     "restrictions apply recursively"). A node whose per-node call CUDA refuses is changed from
//     then on in the graph, and the executable updated from the graph (cudaGraphExecUpdate).
// Only 1-D copies can change in an executable (cudaGraphExecMemcpyNodeSetParams: "Both the
// instantiation-time memory operands and the memory operands in pNodeParams must be
// 1-dimensional"); 2-D memsets can (their address and value).
//
// All or nothing: what can be judged before any call (a multidimensional copy that uses the
// buffer, a graph whose conditional bodies were not recorded, a kernel whose parameters cannot be
// read) throws usage_error before anything changes; a call CUDA refuses midway is undone (every
// node changed so far gets its parameters back) before the exception leaves.
//
// The graph (cudaGraph_t) keeps the parameters it was captured with until the library needs it to
// match the executable: before compiling it again (a retain, the staging nodes) and before a copy
// of it goes into another capture (replay inside a capture). sync_graph does that.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/exec_memory.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/staging_nodes.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace tensorplay::detail {

//! One rebind: the bytes [from, from + bytes) move to [to, to + bytes) (`to_bytes` >= `bytes`).
struct RebindRequest {
  std::uintptr_t from = 0;
  std::size_t bytes = 0;
  std::uintptr_t to = 0;
  std::size_t to_bytes = 0;
};

//! Bytes of one element of a run-time typed tensor.
[[nodiscard]] constexpr std::size_t dtype_bytes(DType t) noexcept {
  switch (t) {
    case DType::Bool:
    case DType::Int8:
    case DType::UInt8: return 1;
    case DType::Int16:
    case DType::UInt16:
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::UInt32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::UInt64:
    case DType::Float64: return 8;
  }
  return 0;
}

//! Compile-time checks of rebind's arguments, with the messages users see.
template <class From, class To>
consteval bool check_rebind_types() {
  static_assert(ContiguousTensor<From> && ContiguousTensor<To>,
                "rebind: both buffers (from, to) must be ContiguousTensors (DeviceTensor, thrust::device_vector, "
                "std::span, TensorView, or an mdspan with layout_right or layout_left)");
  if constexpr (ContiguousTensor<From> && ContiguousTensor<To>) {
    if constexpr (!RuntimeTyped<From> && !RuntimeTyped<To>)
      static_assert(std::same_as<element_t<From>, element_t<To>>,
                    "rebind: the new buffer (to) must have the element type of the old one (from): the graph's kernels "
                    "read and write it as that type; convert into a buffer of that type first");
  }
  return true;
}

template <ContiguousTensor T>
std::size_t element_bytes_of(const T& t) noexcept {
  if constexpr (RuntimeTyped<T>) return dtype_bytes(traits_of<T>::dtype(t));
  else return sizeof(element_t<T>);
}

//! Throws usage_error unless `t` (named `role`) is device memory of `device` or managed memory.
template <ContiguousTensor T>
void check_rebind_memory(const T& t, const char* role, int device, const char* what, const tensorplay::source_location& where) {
  if constexpr (KnowsDevice<T>) {
    if (traits_of<T>::device(t) != device)
      throw_usage(std::string(what) + ": `" + role + "` lives on device " + std::to_string(traits_of<T>::device(t)) +
                  ", the graph on device " + std::to_string(device));
  } else {
    const PointerInfo info = pointer_info(static_cast<const void*>(tensor_data(t)), where);
    if (!info.device_accessible())
      throw_usage(std::string(what) + ": `" + role + "` is not device memory (host memory?); a graph's nodes can be pointed "
                  "only at device or managed memory of the graph's device");
    if (info.type == cudaMemoryTypeDevice && info.device != device)
      throw_usage(std::string(what) + ": `" + role + "` lives on device " + std::to_string(info.device) +
                  ", the graph on device " + std::to_string(device));
  }
}

//! Checks rebind's arguments and returns the request. `device`: the graph's (negative: no device
//! check, for a set of graphs that holds none yet).
//! \throws usage_error for another element type (run-time typed tensors), a `to` smaller than
//!         `from`, overlapping buffers, a buffer without memory, or memory of another device.
template <ContiguousTensor From, ContiguousTensor To>
RebindRequest rebind_request(const From& from, const To& to, int device, const char* what, const tensorplay::source_location& where) {
  if constexpr (RuntimeTyped<From> || RuntimeTyped<To>) {
    const bool same = [&] {
      if constexpr (RuntimeTyped<From> && RuntimeTyped<To>) return traits_of<From>::dtype(from) == traits_of<To>::dtype(to);
      else if constexpr (RuntimeTyped<From>) return has_element_type(from, dtype_v<element_t<To>>) && has_dtype_v<element_t<To>>;
      else return has_element_type(to, dtype_v<element_t<From>>) && has_dtype_v<element_t<From>>;
    }();
    if (!same)
      throw_usage(std::string(what) + ": `to` holds " + element_name(to) + ", `from` " + element_name(from) +
                  "; the element types must be the same");
  }
  RebindRequest r;
  r.from = reinterpret_cast<std::uintptr_t>(static_cast<const void*>(tensor_data(from)));
  r.to = reinterpret_cast<std::uintptr_t>(static_cast<const void*>(tensor_data(to)));
  r.bytes = tensor_size(from) * element_bytes_of(from);
  r.to_bytes = tensor_size(to) * element_bytes_of(to);
  if (tensor_size(to) < tensor_size(from))
    throw_usage(std::string(what) + ": `to` has " + std::to_string(tensor_size(to)) + " elements, `from` " +
                std::to_string(tensor_size(from)) + "; `to` must be at least as large as `from`");
  if (r.bytes == 0) return r;  // no address lies in an empty buffer: nothing can change
  if (r.from == 0 || r.to == 0) throw_usage(std::string(what) + ": `" + (r.from == 0 ? "from" : "to") + "` has no memory");
  if (r.from < r.to + r.to_bytes && r.to < r.from + r.bytes)
    throw_usage(std::string(what) + ": `from` and `to` overlap; point the graph at a separate buffer");
  if (device >= 0) {
    check_rebind_memory(from, "from", device, what, where);
    check_rebind_memory(to, "to", device, what, where);
  }
  return r;
}

//! Where the bytes that stage_and_launch's static buffers name are after rebinds: ranges of
//! addresses as captured (or as named since) with the offset rebind moved them by. Empty (the
//! identity) until a rebind changes a node; a rebind back to where a buffer was removes its range.
class RebindMap {
 public:
  [[nodiscard]] bool empty() const noexcept { return ranges_.empty(); }

  //! A rebind moved the bytes [request.from, request.from + request.bytes) to request.to.
  void moved(const RebindRequest& request);

  //! Where the bytes [begin, end) (pair `pair` of a stage_and_launch) are now: begin, or begin
  //! plus the offset rebind moved them by.
  //! \throws usage_error when rebind moved part of [begin, end) only, or parts of it apart.
  [[nodiscard]] std::uintptr_t where_now(std::uintptr_t begin, std::uintptr_t end, std::size_t pair) const;

 private:
  struct Range {
    std::uintptr_t begin;  // as named
    std::uintptr_t end;
    std::uintptr_t delta;  // now at begin + delta (modulo 2^64)
  };
  std::vector<Range> ranges_;  // disjoint, by begin
};

//! A static buffer of stage_and_launch as rebind moved it (a view of `to`'s memory).
template <class T, bool KnowsItsDevice>
struct RebindView {
  T* data = nullptr;
  std::size_t size = 0;
  int device = -1;
};

template <class T>
inline constexpr bool is_rebind_view_v = false;
template <class T, bool D>
inline constexpr bool is_rebind_view_v<RebindView<T, D>> = true;

}  // namespace tensorplay::detail

namespace tensorplay {

template <class T, bool D>
struct tensor_traits<detail::RebindView<T, D>> {
  using element_type = T;
  static constexpr MemorySpace space = D ? MemorySpace::Device : MemorySpace::Unknown;
  static constexpr bool contiguous = true;
  static T* data(const detail::RebindView<T, D>& v) noexcept { return v.data; }
  static std::size_t size(const detail::RebindView<T, D>& v) noexcept { return v.size; }
  static int device(const detail::RebindView<T, D>& v) noexcept
    requires D
  {
    return v.device;
  }
};

}  // namespace tensorplay

namespace tensorplay::detail {

//! Static buffer `pair` of a stage_and_launch, where `map` says it is now.
template <class S>
auto rebound_view(const S& s, const RebindMap& map, std::size_t pair) {
  using T = typename traits_of<S>::element_type;
  const std::size_t n = tensor_size(s);
  const auto begin = reinterpret_cast<std::uintptr_t>(tensor_data(s));
  T* now = reinterpret_cast<T*>(map.where_now(begin, begin + n * sizeof(T), pair));
  if constexpr (KnowsDevice<S>) return RebindView<T, true>{now, n, traits_of<S>::device(s)};
  else return RebindView<T, false>{now, n, -1};
}

//! The index of one executable's pointer-sized parameter words (see the header), with the rebind
//! being prepared or last committed.
class RebindIndex {
 public:
  //! Builds the index of the executable compiled from `compiled` (whose nodes name the
  //! executable's), whose parameters are those of `runs` now: `compiled` itself, or the graph an
  //! in-place update made the executable run, paired with it node by node in CUDA's order.
  //! `skip`: the staging nodes (their parameters belong to stage_and_launch). False, leaving the
  //! index empty and unbuilt, when the two graphs do not pair node by node (the caller compiles
  //! `runs` and builds again).
  //! \throws cuda_error when CUDA cannot list the graph.
  bool build(cudaGraph_t compiled, const ConditionalBodies& compiled_bodies, cudaGraph_t runs, const ConditionalBodies& runs_bodies,
             StagingNodeHandles skip, const tensorplay::source_location& where);
  [[nodiscard]] bool built() const noexcept { return built_; }
  //! Forgets the index (the executable changed); the graph must have been synced first.
  void clear() noexcept;

  //! Finds the nodes that hold a word in [request.from, request.from + request.bytes) and checks
  //! that each can change. Changes nothing. Returns how many.
  //! \throws usage_error for a node that cannot change, or an index that cannot judge (unrecorded
  //!         conditional bodies, a kernel whose parameters cannot be read).
  std::size_t prepare(const RebindRequest& request);
  [[nodiscard]] std::size_t prepared_nodes() const noexcept { return touched_.size(); }
  //! The request prepare was given last.
  [[nodiscard]] const RebindRequest& pending() const noexcept { return pending_; }

  //! Applies what prepare found to `exec`, node by node. Returns true when some node changes only
  //! through the graph: the caller then updates `exec` from the graph (after sync_graph), or calls
  //! revert. On a refusal of a top-level node, reverts and throws (usage_error; cuda_error for a
  //! failure that is no refusal).
  bool commit(cudaGraphExec_t exec, const tensorplay::source_location& where);

  //! Gives every node changed by the last commit its parameters from before it, on `exec` (the
  //! nodes changed through the graph are marked for sync_graph: the caller updates `exec` from
  //! the graph again).
  //! \throws cuda_error when CUDA refuses to take back what it took (nothing is left to try).
  void revert(cudaGraphExec_t exec, const tensorplay::source_location& where);

  //! Gives the graph's nodes the parameters the executable has.
  //! \throws cuda_error when CUDA refuses one.
  void sync_graph(const tensorplay::source_location& where);

 private:
  static constexpr std::size_t rebind_word = sizeof(void*);
  // CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER and CU_LAUNCH_PARAM_BUFFER_SIZE of <cuda.h>.
  static constexpr std::uintptr_t param_end = 0;
  static constexpr std::uintptr_t param_buffer_pointer = 1;
  static constexpr std::uintptr_t param_buffer_size = 2;
  static_assert(sizeof(std::uintptr_t) == sizeof(void*));

  enum class Kind : std::uint8_t { Kernel, Memset, Memcpy };
  enum class Place : std::uint8_t { Top, Body, Child };

  struct Entry {
    cudaGraphNode_t exec_node;   // names the node in the executable (the graph it was compiled from)
    cudaGraphNode_t graph_node;  // the same node in the graph the executable runs (its parameters)
    std::uint32_t aux;           // index into kernels_, memsets_ or memcpys_
    Kind kind;
    Place place;
    bool via_graph;  // CUDA refused the per-node call: changes through cudaGraphExecUpdate
    bool stale;      // graph_node's parameters are older than the executable's
    bool one_d;      // a memcpy CUDA can change in an executable
  };
  struct Kernel {
    DriverKernelNodeParams params;  // kernel_params and extra are set at each call
    std::size_t bytes_begin;        // its parameter bytes in bytes_, each at its offset
    std::size_t bytes_size;
    std::uint32_t args_begin;  // its parameter pointers in args_
    std::uint32_t arg_count;
    bool packed;  // passed as one buffer (CU_LAUNCH_PARAM_BUFFER_POINTER): layout unknown
  };
  struct Word {
    std::uint32_t entry;
    std::uint32_t offset;  // kernel: byte offset in its parameters; memcpy: 0 source, 1 destination
  };
  struct Layout {
    std::vector<std::size_t> offsets;
    std::vector<std::size_t> sizes;
    bool known = false;
  };

  bool walk(cudaGraph_t compiled, const ConditionalBodies& compiled_bodies, cudaGraph_t runs, const ConditionalBodies& runs_bodies,
            Place place, StagingNodeHandles skip, const tensorplay::source_location& where);
  bool add_kernel(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place, const tensorplay::source_location& where);
  void add_memset(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place);
  void add_memcpy(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place);
  const Layout* layout_of(void* function, bool is_kernel);
  void add_word(std::uint32_t offset, std::uintptr_t value);
  Entry& new_entry(cudaGraphNode_t compiled, cudaGraphNode_t runs, Kind kind, Place place, std::size_t aux);
  void write_word(std::uint32_t word, std::uintptr_t value) noexcept;
  void mark_stale(Entry& e) noexcept;
  DriverKernelNodeParams kernel_call_params(const Kernel& k, void** extra) noexcept;
  cudaError_t set_on_exec(const Entry& e, cudaGraphExec_t exec) noexcept;
  cudaError_t set_in_graph(const Entry& e) noexcept;
  void undo_words() noexcept;
  void reset_on_exec(std::size_t count, cudaGraphExec_t exec) noexcept;

  std::vector<Entry> entries_;
  std::vector<Kernel> kernels_;
  std::vector<cudaMemsetParams> memsets_;
  std::vector<cudaMemcpy3DParms> memcpys_;
  std::vector<unsigned char> bytes_;          // the kernels' parameters
  std::vector<void*> args_;                   // each kernel's parameter pointers into bytes_
  std::vector<std::size_t> arg_offsets_;      // their offsets (args_ is filled when bytes_ is final)
  std::vector<std::uintptr_t> values_;        // every word's value now, in entry order
  std::vector<Word> words_;
  std::unordered_map<void*, Layout> layouts_;  // by function, while building
  std::string blind_;  // why no rebind can be judged (empty: every rebind can)
  DriverApi::ExecSetKernelParams exec_set_kernel_ = nullptr;  // from DriverApi, resolved at build
  DriverApi::SetKernelParams set_kernel_ = nullptr;
  bool built_ = false;
  std::size_t stale_ = 0;  // entries whose graph node is stale
  // The rebind prepared, then committed: the words it hits, their entries, their old values.
  RebindRequest pending_;
  std::vector<std::uint32_t> hits_;
  std::vector<std::uint32_t> touched_;
  std::vector<std::uintptr_t> old_;
  std::size_t applied_ = 0;  // touched_[0, applied_) were set on the executable by the last commit
};

//! What an Executable keeps for rebind: the index, the map of where static buffers are, and
//! the map before the last commit (for undo).
struct RebindState {
  RebindIndex index;
  RebindMap map;
  RebindMap map_before;
  bool last_through_graph = false;  // the last commit updated the whole executable from the graph
};

//! Graph's internals for rebinds across several graphs (rebind_graphs.hpp).
struct RebindAccess;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/fault_injection.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

#include <algorithm>
#include <cstring>

namespace tensorplay::detail {

// ---- RebindMap ------------------------------------------------------------------------------

TENSORPLAY_DECL void RebindMap::moved(const RebindRequest& request) {
  const std::uintptr_t f = request.from;
  const std::uintptr_t fe = request.from + request.bytes;
  const std::uintptr_t shift = request.to - request.from;
  std::vector<Range> next;
  next.reserve(ranges_.size() + 2);
  // Names already moved: the part of each whose bytes are in [f, fe) now moves on.
  for (const Range& r : ranges_) {
    const std::uintptr_t lo = r.begin + r.delta;  // where the range is now
    const std::uintptr_t hi = r.end + r.delta;
    const std::uintptr_t a = lo > f ? lo : f;
    const std::uintptr_t b = hi < fe ? hi : fe;
    if (a >= b) {
      next.push_back(r);
      continue;
    }
    if (lo < a) next.push_back({r.begin, a - r.delta, r.delta});
    next.push_back({a - r.delta, b - r.delta, r.delta + shift});
    if (b < hi) next.push_back({b - r.delta, r.end, r.delta});
  }
  // Names not moved yet, within [f, fe): they move now.
  std::uintptr_t cursor = f;
  for (const Range& r : ranges_) {  // by begin, disjoint
    if (r.end <= cursor || r.begin >= fe) continue;
    if (r.begin > cursor) next.push_back({cursor, r.begin, shift});
    cursor = r.end;
    if (cursor >= fe) break;
  }
  if (cursor < fe) next.push_back({cursor, fe, shift});
  sort_range(next.data(), next.size(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  ranges_.clear();
  for (const Range& r : next) {
    if (r.delta == 0 || r.begin == r.end) continue;  // back where it was named
    if (!ranges_.empty() && ranges_.back().end == r.begin && ranges_.back().delta == r.delta) ranges_.back().end = r.end;
    else ranges_.push_back(r);
  }
}

TENSORPLAY_DECL std::uintptr_t RebindMap::where_now(std::uintptr_t begin, std::uintptr_t end, std::size_t pair) const {
  if (begin == end) return begin;
  for (const Range& r : ranges_) {
    if (r.end <= begin || r.begin >= end) continue;
    if (r.begin <= begin && end <= r.end) return begin + r.delta;
    throw_usage("stage_and_launch: pair " + std::to_string(pair) +
                ": rebind moved part of this static buffer only (or parts of it to different places), so it has no one "
                "place to copy to; stage into the buffers the graph uses now, or rebind the whole buffer");
  }
  return begin;
}

// ---- RebindIndex: building ------------------------------------------------------------------

//! The nodes of one level of `graph`, in CUDA's order.
TENSORPLAY_DECL std::vector<cudaGraphNode_t> rebind_nodes_of(cudaGraph_t graph, const tensorplay::source_location& where) {
  std::size_t count = 0;
  TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nullptr, &count), where);
  std::vector<cudaGraphNode_t> nodes(count);
  if (count != 0) TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), where);
  nodes.resize(count);
  return nodes;
}

//! Whether a set-params call failed because CUDA does not allow the change (not a broken context).
TENSORPLAY_DECL bool rebind_refused(cudaError_t status) noexcept {
  return status == cudaErrorInvalidValue || status == cudaErrorNotSupported || status == cudaErrorInvalidDeviceFunction ||
         status == cudaErrorGraphExecUpdateFailure;
}

TENSORPLAY_DECL void RebindIndex::clear() noexcept {
  entries_.clear();
  kernels_.clear();
  memsets_.clear();
  memcpys_.clear();
  bytes_.clear();
  args_.clear();
  arg_offsets_.clear();
  values_.clear();
  words_.clear();
  layouts_.clear();
  blind_.clear();
  built_ = false;
  stale_ = 0;
  hits_.clear();
  touched_.clear();
  old_.clear();
  applied_ = 0;
}

TENSORPLAY_DECL bool RebindIndex::build(cudaGraph_t compiled, const ConditionalBodies& compiled_bodies, cudaGraph_t runs,
    const ConditionalBodies& runs_bodies, StagingNodeHandles skip, const tensorplay::source_location& where) {
  clear();
  const DriverApi& driver = DriverApi::get(where);
  exec_set_kernel_ = driver.exec_kernel_node_set_params;
  set_kernel_ = driver.kernel_node_set_params;
  if (!walk(compiled, compiled_bodies, runs, runs_bodies, Place::Top, skip, where)) {
    clear();
    return false;
  }
  layouts_ = {};
  args_.resize(arg_offsets_.size());
  for (const Kernel& k : kernels_)
    for (std::uint32_t i = 0; i < k.arg_count; ++i)
      args_[k.args_begin + i] = bytes_.data() + k.bytes_begin + arg_offsets_[k.args_begin + i];
  built_ = true;
  return true;
}

TENSORPLAY_DECL bool RebindIndex::walk(cudaGraph_t compiled, const ConditionalBodies& compiled_bodies, cudaGraph_t runs,
    const ConditionalBodies& runs_bodies, Place place, StagingNodeHandles skip, const tensorplay::source_location& where) {
  const std::vector<cudaGraphNode_t> a = rebind_nodes_of(compiled, where);
  const std::vector<cudaGraphNode_t> b = runs == compiled ? a : rebind_nodes_of(runs, where);
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    cudaGraphNodeType paired = cudaGraphNodeTypeEmpty;
    TENSORPLAY_CHECK(cudaGraphNodeGetType(a[i], &type), where);
    TENSORPLAY_CHECK(cudaGraphNodeGetType(b[i], &paired), where);
    if (type != paired) return false;
    switch (type) {
      case cudaGraphNodeTypeKernel:
        if (a[i] == skip.fetch || a[i] == skip.copy) break;  // stage_and_launch's own
        if (!add_kernel(a[i], b[i], place, where)) return false;
        break;
      case cudaGraphNodeTypeMemset: add_memset(a[i], b[i], place); break;
      case cudaGraphNodeTypeMemcpy: add_memcpy(a[i], b[i], place); break;
      case cudaGraphNodeTypeGraph: {
        cudaGraph_t child_a = nullptr;
        cudaGraph_t child_b = nullptr;
        TENSORPLAY_CHECK(cudaGraphChildGraphNodeGetGraph(a[i], &child_a), where);
        TENSORPLAY_CHECK(cudaGraphChildGraphNodeGetGraph(b[i], &child_b), where);
        if (!walk(child_a, compiled_bodies, child_b, runs_bodies, place == Place::Body ? Place::Body : Place::Child, {}, where))
          return false;
        break;
      }
      case cudaGraphNodeTypeConditional: {
        const std::span<const cudaGraph_t> bodies_a = compiled_bodies.of(a[i]);
        const std::span<const cudaGraph_t> bodies_b = runs_bodies.of(b[i]);
        if (bodies_a.empty() || bodies_b.empty()) {
          // CUDA 13.0 cannot list a conditional node's bodies: only the library's own are recorded.
          blind_ = "the graph holds a conditional node whose bodies tensorplay did not record (a graph built elsewhere "
                   "and adopted), so rebind cannot see which of their nodes use the buffer; nothing was changed. "
                   "Capture the graph with tensorplay, or update() it";
          break;
        }
        if (bodies_a.size() != bodies_b.size()) return false;
        for (std::size_t k = 0; k < bodies_a.size(); ++k)
          if (!walk(bodies_a[k], compiled_bodies, bodies_b[k], runs_bodies, Place::Body, {}, where)) return false;
        break;
      }
      default: break;  // empty, host, event, memory and semaphore nodes hold no device addresses rebind changes
    }
  }
  return true;
}

TENSORPLAY_DECL auto RebindIndex::layout_of(void* function, bool is_kernel) -> const Layout* {
  if (const auto it = layouts_.find(function); it != layouts_.end()) return &it->second;
  Layout layout;
  const ParamInfoApi& info = ParamInfoApi::get();
  const ParamInfoApi::GetParamInfo query = is_kernel ? info.kernel : info.function;
  if (function != nullptr && query != nullptr) {
    auto ask = [&](std::size_t i, std::size_t* offset, std::size_t* size) { return query(function, i, offset, size) == 0; };
    const ParamExtent extent = param_extent(ask);
    for (std::size_t i = 0; i < extent.count; ++i) {
      std::size_t offset = 0;
      std::size_t size = 0;
      if (!ask(i, &offset, &size)) break;
      layout.offsets.push_back(offset);
      layout.sizes.push_back(size);
    }
    layout.known = layout.offsets.size() == extent.count;
    (void)cudaGetLastError();
  }
  return &layouts_.emplace(function, std::move(layout)).first->second;
}

TENSORPLAY_DECL auto RebindIndex::new_entry(cudaGraphNode_t compiled, cudaGraphNode_t runs, Kind kind, Place place, std::size_t aux) -> Entry& {
  entries_.push_back(Entry{compiled, runs, static_cast<std::uint32_t>(aux), kind, place, false, false, true});
  return entries_.back();
}

TENSORPLAY_DECL void RebindIndex::add_word(std::uint32_t offset, std::uintptr_t value) {
  words_.push_back(Word{static_cast<std::uint32_t>(entries_.size() - 1), offset});
  values_.push_back(value);
}

TENSORPLAY_DECL bool RebindIndex::add_kernel(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place, const tensorplay::source_location& where) {
  const DriverApi& driver = DriverApi::get(where);
  DriverKernelNodeParams p{};
  // Through the driver: the runtime cannot describe kernels loaded from libraries (driver_api.hpp).
  if (driver.kernel_node_get_params(runs, &p) != 0) {
    blind_ = "the driver cannot read the parameters of a kernel node of the graph, so rebind cannot tell whether it uses "
             "the buffer; nothing was changed";
    return true;
  }
  if (compiled != runs) {
    DriverKernelNodeParams q{};
    if (driver.kernel_node_get_params(compiled, &q) != 0 || q.func != p.func || q.kernel != p.kernel) return false;
  }
  const bool is_kernel = p.kernel != nullptr;
  const Layout* layout = layout_of(is_kernel ? p.kernel : p.func, is_kernel);
  // A buffer given through `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE).
  const void* packed = nullptr;
  std::size_t packed_size = 0;
  for (void** e = p.extra; e != nullptr && reinterpret_cast<std::uintptr_t>(e[0]) != param_end; e += 2) {
    if (reinterpret_cast<std::uintptr_t>(e[0]) == param_buffer_pointer) packed = e[1];
    else if (reinterpret_cast<std::uintptr_t>(e[0]) == param_buffer_size) packed_size = *static_cast<const std::size_t*>(e[1]);
  }
  const bool use_layout = layout->known && p.kernel_params != nullptr;
  if (!use_layout && packed == nullptr) {
    if (p.kernel_params == nullptr || (layout->known && layout->offsets.empty())) return true;  // no parameters
    blind_ = "the parameter layout of a kernel of the graph is unknown (cuFuncGetParamInfo needs a CUDA 12.4 driver), "
             "so rebind cannot find its pointers; nothing was changed";
    return true;
  }
  Kernel k{};
  k.params = p;
  k.params.kernel_params = nullptr;
  k.params.extra = nullptr;
  k.bytes_begin = (bytes_.size() + 15) / 16 * 16;
  k.args_begin = static_cast<std::uint32_t>(arg_offsets_.size());
  k.packed = !use_layout;
  const std::size_t words_before = words_.size();
  if (use_layout) {
    std::size_t end = 0;
    for (std::size_t i = 0; i < layout->offsets.size(); ++i) end = std::max(end, layout->offsets[i] + layout->sizes[i]);
    k.bytes_size = end;
    bytes_.resize(k.bytes_begin + end);
    for (std::size_t i = 0; i < layout->offsets.size(); ++i) {
      std::memcpy(bytes_.data() + k.bytes_begin + layout->offsets[i], p.kernel_params[i], layout->sizes[i]);
      arg_offsets_.push_back(layout->offsets[i]);
    }
    k.arg_count = static_cast<std::uint32_t>(layout->offsets.size());
  } else {
    k.bytes_size = packed_size;
    bytes_.resize(k.bytes_begin + packed_size);
    if (packed_size != 0) std::memcpy(bytes_.data() + k.bytes_begin, packed, packed_size);
    k.arg_count = 0;
  }
  entries_.push_back(Entry{compiled, runs, static_cast<std::uint32_t>(kernels_.size()), Kind::Kernel, place, false, false, true});
  auto add_words_of = [&](std::size_t offset, std::size_t size) {
    for (std::size_t w = (offset + rebind_word - 1) / rebind_word * rebind_word; w + rebind_word <= offset + size; w += rebind_word) {
      std::uintptr_t value = 0;
      std::memcpy(&value, bytes_.data() + k.bytes_begin + w, rebind_word);
      add_word(static_cast<std::uint32_t>(w), value);
    }
  };
  if (use_layout) {
    for (std::size_t i = 0; i < layout->offsets.size(); ++i) add_words_of(layout->offsets[i], layout->sizes[i]);
  } else {
    add_words_of(0, packed_size);
  }
  if (words_.size() == words_before) {  // nothing pointer-sized: no rebind can touch it
    entries_.pop_back();
    bytes_.resize(k.bytes_begin);
    arg_offsets_.resize(k.args_begin);
    return true;
  }
  kernels_.push_back(k);
  return true;
}

TENSORPLAY_DECL void RebindIndex::add_memset(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place) {
  cudaMemsetParams p{};
  if (cudaGraphMemsetNodeGetParams(runs, &p) != cudaSuccess) {
    (void)cudaGetLastError();
    blind_ = "CUDA cannot read the parameters of a memset node of the graph; nothing was changed";
    return;
  }
  new_entry(compiled, runs, Kind::Memset, place, memsets_.size());
  memsets_.push_back(p);
  add_word(0, reinterpret_cast<std::uintptr_t>(p.dst));
}

TENSORPLAY_DECL void RebindIndex::add_memcpy(cudaGraphNode_t compiled, cudaGraphNode_t runs, Place place) {
  cudaMemcpy3DParms p{};
  if (cudaGraphMemcpyNodeGetParams(runs, &p) != cudaSuccess) {
    (void)cudaGetLastError();
    blind_ = "CUDA cannot read the parameters of a memcpy node of the graph; nothing was changed";
    return;
  }
  Entry& e = new_entry(compiled, runs, Kind::Memcpy, place, memcpys_.size());
  e.one_d = p.srcArray == nullptr && p.dstArray == nullptr && p.extent.height <= 1 && p.extent.depth <= 1 && p.srcPos.x == 0 &&
            p.srcPos.y == 0 && p.srcPos.z == 0 && p.dstPos.x == 0 && p.dstPos.y == 0 && p.dstPos.z == 0;
  memcpys_.push_back(p);
  if (p.srcArray == nullptr) add_word(0, reinterpret_cast<std::uintptr_t>(p.srcPtr.ptr));
  if (p.dstArray == nullptr) add_word(1, reinterpret_cast<std::uintptr_t>(p.dstPtr.ptr));
  if (words_.empty() || words_.back().entry != entries_.size() - 1) {  // array to array
    entries_.pop_back();
    memcpys_.pop_back();
  }
}

// ---- RebindIndex: changing ----------------------------------------------------------------

TENSORPLAY_DECL std::size_t RebindIndex::prepare(const RebindRequest& request) {
  pending_ = request;
  hits_.clear();
  touched_.clear();
  applied_ = 0;
  if (request.bytes == 0) return 0;  // no word lies in an empty range
  if (!blind_.empty()) throw_usage("rebind: " + blind_);
  const std::uintptr_t from = request.from;
  const std::size_t bytes = request.bytes;
  const std::uintptr_t* v = values_.data();
  const std::size_t n = values_.size();
  for (std::size_t i = 0; i < n; ++i)
    if (v[i] - from < bytes) [[unlikely]]
      hits_.push_back(static_cast<std::uint32_t>(i));
  for (std::uint32_t h : hits_) {  // words are in entry order: so are the hits
    const std::uint32_t e = words_[h].entry;
    if (touched_.empty() || touched_.back() != e) touched_.push_back(e);
  }
  for (std::uint32_t e : touched_) {
    if (entries_[e].kind == Kind::Memcpy && !entries_[e].one_d) {
      touched_.clear();
      hits_.clear();
      throw_usage("rebind: a 2-D or 3-D copy (cudaMemcpy2DAsync, cudaMemcpy3DAsync, or an array) uses `from`, and CUDA "
                  "changes the addresses of 1-D copies only in an executable; nothing was changed. Capture that copy "
                  "as 1-D copies, or update() the graph with the new buffer");
    }
  }
  return touched_.size();
}

TENSORPLAY_DECL void RebindIndex::write_word(std::uint32_t word, std::uintptr_t value) noexcept {
  const Word w = words_[word];
  const Entry& e = entries_[w.entry];
  switch (e.kind) {
    case Kind::Kernel: std::memcpy(bytes_.data() + kernels_[e.aux].bytes_begin + w.offset, &value, rebind_word); break;
    case Kind::Memset: memsets_[e.aux].dst = reinterpret_cast<void*>(value); break;
    case Kind::Memcpy:
      if (w.offset == 0) memcpys_[e.aux].srcPtr.ptr = reinterpret_cast<void*>(value);
      else memcpys_[e.aux].dstPtr.ptr = reinterpret_cast<void*>(value);
      break;
  }
  values_[word] = value;
}

TENSORPLAY_DECL void RebindIndex::mark_stale(Entry& e) noexcept {
  if (!e.stale) {
    e.stale = true;
    ++stale_;
  }
}

TENSORPLAY_DECL DriverKernelNodeParams RebindIndex::kernel_call_params(const Kernel& k, void** extra) noexcept {
  DriverKernelNodeParams p = k.params;
  if (k.packed) {
    extra[0] = reinterpret_cast<void*>(param_buffer_pointer);
    extra[1] = bytes_.data() + k.bytes_begin;
    extra[2] = reinterpret_cast<void*>(param_buffer_size);
    extra[3] = const_cast<std::size_t*>(&k.bytes_size);
    extra[4] = reinterpret_cast<void*>(param_end);
    p.extra = extra;
  } else {
    p.kernel_params = args_.data() + k.args_begin;
  }
  return p;
}

TENSORPLAY_DECL cudaError_t RebindIndex::set_on_exec(const Entry& e, cudaGraphExec_t exec) noexcept {
  if (fault::take(fault::Site::SetParams)) return fault::injected_status(fault::Site::SetParams);
  switch (e.kind) {
    case Kind::Kernel: {
      void* extra[5];
      const DriverKernelNodeParams p = kernel_call_params(kernels_[e.aux], extra);
      return static_cast<cudaError_t>(exec_set_kernel_(exec, e.exec_node, &p));
    }
    case Kind::Memset: return cudaGraphExecMemsetNodeSetParams(exec, e.exec_node, &memsets_[e.aux]);
    case Kind::Memcpy: {
      const cudaMemcpy3DParms& m = memcpys_[e.aux];
      return cudaGraphExecMemcpyNodeSetParams1D(exec, e.exec_node, m.dstPtr.ptr, m.srcPtr.ptr, m.extent.width, m.kind);
    }
  }
  return cudaErrorInvalidValue;
}

TENSORPLAY_DECL cudaError_t RebindIndex::set_in_graph(const Entry& e) noexcept {
  switch (e.kind) {
    case Kind::Kernel: {
      void* extra[5];
      const DriverKernelNodeParams p = kernel_call_params(kernels_[e.aux], extra);
      return static_cast<cudaError_t>(set_kernel_(e.graph_node, &p));
    }
    case Kind::Memset: return cudaGraphMemsetNodeSetParams(e.graph_node, &memsets_[e.aux]);
    case Kind::Memcpy: {
      const cudaMemcpy3DParms& m = memcpys_[e.aux];
      return cudaGraphMemcpyNodeSetParams1D(e.graph_node, m.dstPtr.ptr, m.srcPtr.ptr, m.extent.width, m.kind);
    }
  }
  return cudaErrorInvalidValue;
}

TENSORPLAY_DECL void RebindIndex::undo_words() noexcept {
  for (std::size_t k = 0; k < hits_.size(); ++k) write_word(hits_[k], old_[k]);
}

TENSORPLAY_DECL void RebindIndex::reset_on_exec(std::size_t count, cudaGraphExec_t exec) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    Entry& e = entries_[touched_[j]];
    mark_stale(e);
    if (e.via_graph) continue;
    if (set_on_exec(e, exec) != cudaSuccess) (void)cudaGetLastError();
  }
}

TENSORPLAY_DECL bool RebindIndex::commit(cudaGraphExec_t exec, const tensorplay::source_location& where) {
  const std::uintptr_t from = pending_.from;
  const std::uintptr_t to = pending_.to;
  old_.resize(hits_.size());
  for (std::size_t k = 0; k < hits_.size(); ++k) {
    old_[k] = values_[hits_[k]];
    write_word(hits_[k], old_[k] - from + to);
  }
  bool through_graph = false;
  for (applied_ = 0; applied_ < touched_.size(); ++applied_) {
    Entry& e = entries_[touched_[applied_]];
    mark_stale(e);
    if (e.via_graph) {
      through_graph = true;
      continue;
    }
    const cudaError_t status = set_on_exec(e, exec);
    if (status == cudaSuccess) [[likely]]
      continue;
    (void)cudaGetLastError();
    if (e.place != Place::Top && rebind_refused(status)) {
      // CUDA changes this node of a body or child graph only through cudaGraphExecUpdate.
      e.via_graph = true;
      through_graph = true;
      continue;
    }
    undo_words();
    reset_on_exec(applied_, exec);
    const char* kind = e.kind == Kind::Kernel ? "kernel" : e.kind == Kind::Memset ? "memset" : "memcpy";
    const char* call = e.kind == Kind::Kernel   ? "cuGraphExecKernelNodeSetParams"
                       : e.kind == Kind::Memset ? "cudaGraphExecMemsetNodeSetParams"
                                                : "cudaGraphExecMemcpyNodeSetParams1D";
    if (!rebind_refused(status)) check(status, call, where);
    throw_usage(std::string("rebind: CUDA refused to point a ") + kind + " node of the executable at `to` (" + call + ": " +
                cudaGetErrorString(status) + "); nothing was changed");
  }
  return through_graph;
}

TENSORPLAY_DECL void RebindIndex::revert(cudaGraphExec_t exec, const tensorplay::source_location&) {
  undo_words();
  reset_on_exec(applied_, exec);
}

TENSORPLAY_DECL void RebindIndex::sync_graph(const tensorplay::source_location& where) {
  if (stale_ == 0) return;
  for (Entry& e : entries_) {
    if (!e.stale) continue;
    const cudaError_t status = set_in_graph(e);
    if (status != cudaSuccess)
      check(status, e.kind == Kind::Kernel ? "cuGraphKernelNodeSetParams (rebind)" : "cudaGraphMem*NodeSetParams (rebind)", where);
    e.stale = false;
    --stale_;
  }
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
