// tensorplay/detail/graph_topology.hpp: a CUDA graph's nodes and edges, read once, and where each
// node stands among them.
//
// The executable-memory model (exec_memory.hpp), the buckets' topology keys (bucket_memory.hpp)
// and the copy of a conditional body into its node (conditional_builder.hpp) all walk a graph's
// edges by node position.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace tensorplay::detail {

//! One level of a graph (child graphs and conditional bodies are nodes here, not walked into).
struct GraphTopology {
  std::vector<cudaGraphNode_t> nodes;  // in CUDA's order
  std::vector<cudaGraphNode_t> from;   // edge e runs from from[e] to to[e]
  std::vector<cudaGraphNode_t> to;
  std::vector<cudaGraphEdgeData> data;  // read with the edges: programmatic edges make a query without it lossy

  //! Reads `graph`'s nodes and edges. \throws cuda_error naming the call that failed.
  GraphTopology(cudaGraph_t graph, const tensorplay::source_location& where);

  [[nodiscard]] std::size_t edge_count() const noexcept;

  //! The position in `nodes` of `node`, which must be one of them (O(log n)).
  [[nodiscard]] std::size_t index_of(cudaGraphNode_t node) const noexcept;

 private:
  std::vector<std::pair<cudaGraphNode_t, std::size_t>> sorted_;  // (node, position), by node
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/small_algorithm.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL GraphTopology::GraphTopology(cudaGraph_t graph, const tensorplay::source_location& where) {
  std::size_t count = 0;
  TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nullptr, &count), where);
  nodes.resize(count);
  if (count != 0) TENSORPLAY_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count), where);
  nodes.resize(count);
  std::size_t edges = 0;
  TENSORPLAY_CHECK(get_edges(graph, nullptr, nullptr, nullptr, &edges), where);
  from.resize(edges);
  to.resize(edges);
  data.resize(edges);
  if (edges != 0) TENSORPLAY_CHECK(get_edges(graph, from.data(), to.data(), data.data(), &edges), where);
  from.resize(edges);
  to.resize(edges);
  data.resize(edges);
  sorted_.resize(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) sorted_[i] = {nodes[i], i};
  sort_range(sorted_.data(), sorted_.size());
}

TENSORPLAY_DECL std::size_t GraphTopology::edge_count() const noexcept { return from.size(); }

TENSORPLAY_DECL std::size_t GraphTopology::index_of(cudaGraphNode_t node) const noexcept {
  return sorted_[lower_bound_index(sorted_.data(), sorted_.size(), std::pair{node, std::size_t{0}})].second;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
