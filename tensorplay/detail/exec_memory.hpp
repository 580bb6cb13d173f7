// tensorplay/detail/exec_memory.hpp: the device memory the driver takes for a graph's executable,
// modelled from the graph.
//
// CUDA reports no per-executable memory, and cudaMemGetInfo cannot stand in for it: it moves in
// 2 MiB steps, and the driver keeps what a destroyed executable held for later executables (seen
// on the H200: cudaGraphExecDestroy gives nothing back, and the next executables take nothing
// until that is used up), so a difference around instantiate says how much the driver had to
// add, not what the executable occupies. The model is what the executable occupies, calibrated on
// an H200 (driver 580, CUDA 13.0) with tools/probes/exec_memory_probe.cu, which instantiates
// 40-200 executables per configuration in a fresh process so that the 2 MiB step divides away:
//   - a lane (a chain of work nodes the driver can run in order) costs 112 KiB: a one-kernel
//     executable 113 KiB, 256 independent kernels 28.6 MiB, 4 chains 3 x 112 KiB more than 1;
//   - a kernel node 2.5 KiB, whatever its grid, cluster shape, shared memory, priority or
//     programmatic edges, while its parameters take up to 1264 bytes; more parameters cost more,
//     in steps (measured from 8 B to 32 000 B): 4.4 KiB up to 2272 B (cuBLAS's fp16 gemmEx
//     kernels), 8.4 KiB up to 7176 B (its sm_90 TF32 gemms pass 2352 B), 48.4 KiB up to 8200 B,
//     64 KiB above. A parameter size in a gap between two measured points (1264-1288 B, say)
//     counts as the larger step;
//   - a memcpy node 2.5 KiB; a memset node nothing beyond its lane; an empty node nothing
//     (a graph of empty nodes takes no memory at all);
//   - a child-graph node is inlined: its nodes cost what they cost in the parent;
//   - a conditional node 2.5 KiB plus, per body, what that body would cost as an executable of
//     its own (its lanes and nodes);
//   - uploading and launching add nothing; a captured graph that is never instantiated takes none.
// Against those measurements the model is within 2% for chains of 256 to 2048 kernels, within
// 33 KiB (8%) below, and up to 4% high for graphs of conditional nodes (docs/design.md, "Memory").
// Not measured, so counted as the model's rules say: lanes of branches that join again (a branch
// keeps its lane: an upper bound), host, event and memory nodes (as kernel nodes).
//
// CUDA 13.0 cannot list a conditional node's bodies from the node, so whoever creates one records
// them (ConditionalBodies); a conditional node whose bodies are not recorded is counted as an
// empty body (one lane).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! The model's constants, from the H200 (tools/probes/exec_memory_probe.cu; the header says what).
namespace exec_model {
inline constexpr std::size_t lane_bytes = 112 << 10;  // per chain of work nodes
inline constexpr std::size_t node_bytes = 2560;       // a kernel node (parameters up to 1264 B), a memcpy node
//! Bytes of a kernel node by the bytes of its parameters: a staircase. Each step is the largest
//! parameter size measured at that cost, and the cost (lane taken off, 128 or 256 nodes per
//! executable); sizes up to a step's bound cost the step's bytes.
struct ParamStep {
  std::size_t up_to_param_bytes;
  std::size_t node_bytes;
};
inline constexpr ParamStep kernel_steps[] = {
    {1264, 2560}, {2272, 4549}, {7176, 8645}, {8200, 49567}, {SIZE_MAX, 65710}};
}  // namespace exec_model

[[nodiscard]] constexpr std::size_t kernel_node_bytes(std::size_t param_bytes) noexcept {
  for (const exec_model::ParamStep& step : exec_model::kernel_steps)
    if (param_bytes <= step.up_to_param_bytes) return step.node_bytes;
  return exec_model::kernel_steps[std::size(exec_model::kernel_steps) - 1].node_bytes;
}

//! The end of a kernel's last parameter, and how many it has, from `query(i, &offset, &size)`
//! (true when parameter i exists: cuFuncGetParamInfo / cuKernelGetParamInfo). Those calls give
//! no count (CUDA 12.4 has no call for it): a doubling, then a bisection, finds the last index
//! they accept.
struct ParamExtent {
  std::size_t bytes = 0;
  std::size_t count = 0;
};
template <class Query>
[[nodiscard]] ParamExtent param_extent(Query&& query) {
  auto end_of = [&](std::size_t i, std::size_t& end) {
    std::size_t offset = 0, size = 0;
    if (!query(i, &offset, &size)) return false;
    end = offset + size;
    return true;
  };
  ParamExtent extent;
  if (!end_of(0, extent.bytes)) return extent;
  std::size_t good = 0, bad = 1, end = 0;
  while (bad < (std::size_t{1} << 16) && end_of(bad, end)) {
    good = bad;
    bad *= 2;
  }
  while (bad - good > 1) {
    const std::size_t mid = good + (bad - good) / 2;
    (end_of(mid, end) ? good : bad) = mid;
  }
  (void)end_of(good, extent.bytes);
  extent.count = good + 1;
  return extent;
}

//! The bodies of the conditional nodes of a graph and of its bodies, recorded when each node was
//! made (the bodies are owned by their nodes, and live as long as the graph).
class ConditionalBodies {
 public:
  void add(cudaGraphNode_t node, const cudaGraph_t* bodies, unsigned count);
  //! The bodies of `node`; empty when it was not recorded.
  [[nodiscard]] std::span<const cudaGraph_t> of(cudaGraphNode_t node) const noexcept;
  [[nodiscard]] bool empty() const noexcept;
  void clear() noexcept;

 private:
  struct Entry {
    cudaGraphNode_t node;
    std::vector<cudaGraph_t> bodies;
  };
  std::vector<Entry> entries_;
};

//! What the model saw in a graph (bodies and child graphs included) and the bytes it gives.
struct ExecShape {
  std::size_t lanes = 0;  // of the graph itself and of every conditional body
  std::size_t kernel_nodes = 0;
  std::size_t memcpy_nodes = 0;
  std::size_t memset_nodes = 0;
  std::size_t conditional_nodes = 0;
  std::size_t other_nodes = 0;  // host, event, memory nodes...: not measured, counted as a kernel node
  std::size_t kernel_param_bytes = 0;
  std::size_t bytes = 0;
};

//! cuFuncGetParamInfo and cuKernelGetParamInfo (CUDA 12.4): null when the driver lacks them, and
//! the model then takes every kernel's parameters as small.
struct ParamInfoApi {
  using GetParamInfo = int (*)(void* function, std::size_t index, std::size_t* offset, std::size_t* size);
  GetParamInfo function = nullptr;
  GetParamInfo kernel = nullptr;

  TENSORPLAY_PROCESS_WIDE static const ParamInfoApi& get() noexcept;

 private:
  ParamInfoApi() noexcept;
  static GetParamInfo resolve(const char* symbol) noexcept;
};

//! Walks one graph for the model. One per call: it caches the parameter size of each function.
class ExecModelWalk {
 public:
  ExecModelWalk(const ConditionalBodies* bodies, const tensorplay::source_location& where) noexcept
      : bodies_(bodies), where_(where) {}

  //! The shape and bytes of the executable that `graph` compiles to.
  ExecShape executable(cudaGraph_t graph);

 private:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  // A node of the graph with its child graphs inlined. Empty nodes, and the entry and exit of a
  // child graph, run nothing: the lanes pass through them.
  struct Flat {
    bool work = false;
    std::vector<std::uint32_t> next;
  };

  static std::uint32_t add(std::vector<Flat>& flat, bool work);

  // Appends `graph`'s nodes to `flat`; `roots` and `leaves` receive where edges into and out of
  // the graph as a whole attach. Node bytes (not lanes) go into `shape`.
  void flatten(cudaGraph_t graph, std::vector<Flat>& flat, std::vector<std::uint32_t>& roots, std::vector<std::uint32_t>& leaves,
               ExecShape& shape);

  // One node into `flat`: returns where its incoming and outgoing edges attach.
  std::pair<std::uint32_t, std::uint32_t> add_node(cudaGraphNode_t node, std::vector<Flat>& flat, ExecShape& shape);

  static void add_shape(ExecShape& to, const ExecShape& from) noexcept;

  // Lanes, as the probe saw the driver use them: in dependency order, a work node continues the
  // lane of a predecessor it is the first to follow, and starts a new lane otherwise (a root, or
  // the second branch of a fork). Empty nodes pass their predecessors' lanes on.
  static std::size_t count_lanes(const std::vector<Flat>& flat);

  // The bytes of a kernel node's parameters: the end of its last parameter.
  std::size_t kernel_param_bytes(cudaGraphNode_t node);

  const ConditionalBodies* bodies_;
  tensorplay::source_location where_;
  std::unordered_map<void*, std::size_t> sizes_;
};

//! The shape the model sees in `graph` and the bytes its executable takes (see the header).
//! `bodies`: the bodies of its conditional nodes (null: none recorded). Walks the whole graph:
//! microseconds per node, not for a replay loop.
//! \throws cuda_error when CUDA cannot describe the graph.
TENSORPLAY_DECL ExecShape modelled_exec_shape(cudaGraph_t graph, const ConditionalBodies* bodies, const tensorplay::source_location& where);

//! The device memory the driver takes to instantiate `graph`, modelled (see the header).
TENSORPLAY_DECL std::size_t modelled_exec_bytes(cudaGraph_t graph, const ConditionalBodies* bodies, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/driver_api.hpp>
#include <tensorplay/detail/graph_topology.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL void ConditionalBodies::add(cudaGraphNode_t node, const cudaGraph_t* bodies, unsigned count) {
  entries_.push_back(Entry{node, std::vector<cudaGraph_t>(bodies, bodies + count)});
}

TENSORPLAY_DECL std::span<const cudaGraph_t> ConditionalBodies::of(cudaGraphNode_t node) const noexcept {
  for (const Entry& e : entries_)
    if (e.node == node) return e.bodies;
  return {};
}

TENSORPLAY_DECL bool ConditionalBodies::empty() const noexcept { return entries_.empty(); }

TENSORPLAY_DECL void ConditionalBodies::clear() noexcept { entries_.clear(); }

TENSORPLAY_DECL const ParamInfoApi& ParamInfoApi::get() noexcept {
  static const ParamInfoApi api;
  return api;
}

TENSORPLAY_DECL ParamInfoApi::ParamInfoApi() noexcept {
  function = resolve("cuFuncGetParamInfo");
  kernel = resolve("cuKernelGetParamInfo");
}

TENSORPLAY_DECL auto ParamInfoApi::resolve(const char* symbol) noexcept -> GetParamInfo {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12040, cudaEnableDefault, &found) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetParamInfo>(fn) : nullptr;
}

TENSORPLAY_DECL ExecShape ExecModelWalk::executable(cudaGraph_t graph) {
  ExecShape shape;
  std::vector<Flat> flat;
  std::vector<std::uint32_t> roots, leaves;
  flatten(graph, flat, roots, leaves, shape);
  const std::size_t lanes = count_lanes(flat);
  shape.lanes += lanes;
  shape.bytes += lanes * exec_model::lane_bytes;
  return shape;
}

TENSORPLAY_DECL std::uint32_t ExecModelWalk::add(std::vector<Flat>& flat, bool work) {
  flat.push_back(Flat{work, {}});
  return static_cast<std::uint32_t>(flat.size() - 1);
}

TENSORPLAY_DECL void ExecModelWalk::flatten(cudaGraph_t graph, std::vector<Flat>& flat, std::vector<std::uint32_t>& roots, std::vector<std::uint32_t>& leaves,
    ExecShape& shape) {
  const GraphTopology topology(graph, where_);
  const std::size_t count = topology.nodes.size();
  // Where each node's incoming and outgoing edges attach in `flat`.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ends(count);
  for (std::size_t i = 0; i < count; ++i) ends[i] = add_node(topology.nodes[i], flat, shape);
  std::vector<bool> has_in(count, false), has_out(count, false);
  for (std::size_t e = 0; e < topology.edge_count(); ++e) {
    const std::size_t a = topology.index_of(topology.from[e]);
    const std::size_t b = topology.index_of(topology.to[e]);
    flat[ends[a].second].next.push_back(ends[b].first);
    has_out[a] = true;
    has_in[b] = true;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!has_in[i]) roots.push_back(ends[i].first);
    if (!has_out[i]) leaves.push_back(ends[i].second);
  }
}

TENSORPLAY_DECL std::pair<std::uint32_t, std::uint32_t> ExecModelWalk::add_node(cudaGraphNode_t node, std::vector<Flat>& flat, ExecShape& shape) {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  TENSORPLAY_CHECK(cudaGraphNodeGetType(node, &type), where_);
  switch (type) {
    case cudaGraphNodeTypeEmpty: {
      const std::uint32_t i = add(flat, false);
      return {i, i};
    }
    case cudaGraphNodeTypeGraph: {  // inlined by the driver
      cudaGraph_t child = nullptr;
      TENSORPLAY_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child), where_);
      const std::uint32_t enter = add(flat, false);
      std::vector<std::uint32_t> roots, leaves;
      flatten(child, flat, roots, leaves, shape);
      const std::uint32_t exit = add(flat, false);
      flat[enter].next = roots;
      for (std::uint32_t l : leaves) flat[l].next.push_back(exit);
      if (roots.empty()) flat[enter].next.push_back(exit);
      return {enter, exit};
    }
    case cudaGraphNodeTypeKernel: {
      const std::size_t params = kernel_param_bytes(node);
      ++shape.kernel_nodes;
      shape.kernel_param_bytes += params;
      shape.bytes += kernel_node_bytes(params);
      break;
    }
    case cudaGraphNodeTypeMemcpy:
      ++shape.memcpy_nodes;
      shape.bytes += exec_model::node_bytes;
      break;
    case cudaGraphNodeTypeMemset:
      ++shape.memset_nodes;  // runs on its lane, adds nothing measurable
      break;
    case cudaGraphNodeTypeConditional: {
      ++shape.conditional_nodes;
      shape.bytes += exec_model::node_bytes;
      const std::span<const cudaGraph_t> bodies = bodies_ ? bodies_->of(node) : std::span<const cudaGraph_t>{};
      if (bodies.empty()) {  // not recorded: an empty body
        ++shape.lanes;
        shape.bytes += exec_model::lane_bytes;
      }
      for (cudaGraph_t body : bodies) add_shape(shape, executable(body));
      break;
    }
    default:
      ++shape.other_nodes;
      shape.bytes += exec_model::node_bytes;
      break;
  }
  const std::uint32_t i = add(flat, true);
  return {i, i};
}

TENSORPLAY_DECL void ExecModelWalk::add_shape(ExecShape& to, const ExecShape& from) noexcept {
  to.lanes += from.lanes;
  to.kernel_nodes += from.kernel_nodes;
  to.memcpy_nodes += from.memcpy_nodes;
  to.memset_nodes += from.memset_nodes;
  to.conditional_nodes += from.conditional_nodes;
  to.other_nodes += from.other_nodes;
  to.kernel_param_bytes += from.kernel_param_bytes;
  to.bytes += from.bytes;
}

TENSORPLAY_DECL std::size_t ExecModelWalk::count_lanes(const std::vector<Flat>& flat) {
  const std::size_t n = flat.size();
  std::vector<std::uint32_t> pending(n, 0);
  for (const Flat& f : flat)
    for (std::uint32_t s : f.next) ++pending[s];
  std::vector<std::vector<std::uint32_t>> before(n);  // predecessors
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t s : flat[i].next) before[s].push_back(i);
  std::vector<std::uint32_t> ready;
  for (std::uint32_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push_back(i);
  std::vector<std::uint32_t> lane(n, none);
  std::vector<std::uint32_t> tail;                    // per lane: its last work node
  std::vector<std::vector<std::uint32_t>> offers(n);  // per empty node: work nodes whose lanes it passes on
  std::vector<std::uint32_t> candidates;
  for (std::size_t r = 0; r < ready.size(); ++r) {
    const std::uint32_t v = ready[r];
    candidates.clear();
    for (std::uint32_t p : before[v]) {
      if (flat[p].work) candidates.push_back(p);
      else candidates.insert(candidates.end(), offers[p].begin(), offers[p].end());
    }
    auto open = [&](std::uint32_t c) { return tail[lane[c]] == c; };
    if (flat[v].work) {
      auto it = candidates.begin();
      while (it != candidates.end() && !open(*it)) ++it;
      if (it != candidates.end()) {
        lane[v] = lane[*it];
        tail[lane[v]] = v;
      } else {
        lane[v] = static_cast<std::uint32_t>(tail.size());
        tail.push_back(v);
      }
    } else {
      for (std::uint32_t c : candidates)
        if (open(c) && !contains(offers[v], c)) offers[v].push_back(c);
    }
    for (std::uint32_t s : flat[v].next)
      if (--pending[s] == 0) ready.push_back(s);
  }
  return tail.size();
}

TENSORPLAY_DECL std::size_t ExecModelWalk::kernel_param_bytes(cudaGraphNode_t node) {
  const ParamInfoApi& info = ParamInfoApi::get();
  DriverKernelNodeParams params{};
  // Through the driver: the runtime cannot describe kernels loaded from libraries (driver_api.hpp).
  // A node the driver cannot describe is taken to have small parameters: a figure for planning
  // is not worth an exception.
  if (DriverApi::get(where_).kernel_node_get_params(node, &params) != 0) return 0;
  const bool is_kernel = params.kernel != nullptr;
  void* function = is_kernel ? params.kernel : params.func;
  const ParamInfoApi::GetParamInfo query = is_kernel ? info.kernel : info.function;
  if (function == nullptr || query == nullptr) return 0;
  if (const auto it = sizes_.find(function); it != sizes_.end()) return it->second;
  const std::size_t bytes = param_extent([&](std::size_t i, std::size_t* offset, std::size_t* size) {
                              return query(function, i, offset, size) == 0;
                            }).bytes;
  (void)cudaGetLastError();
  sizes_.emplace(function, bytes);
  return bytes;
}

TENSORPLAY_DECL ExecShape modelled_exec_shape(cudaGraph_t graph, const ConditionalBodies* bodies, const tensorplay::source_location& where) {
  if (graph == nullptr) return {};
  return ExecModelWalk(bodies, where).executable(graph);
}

TENSORPLAY_DECL std::size_t modelled_exec_bytes(cudaGraph_t graph, const ConditionalBodies* bodies, const tensorplay::source_location& where) {
  return modelled_exec_shape(graph, bodies, where).bytes;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
