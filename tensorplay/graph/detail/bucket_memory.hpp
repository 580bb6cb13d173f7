// tensorplay/graph/detail/bucket_memory.hpp: MemoryEstimate, and what GraphBuckets::estimate and
// GraphBuckets::memory compute.
//
// estimate: every bucket's body is captured, largest first as capture_all does, into throwaway
// Graphs that share one throwaway pool, and none is instantiated: capturing takes no device
// memory beyond the pool (seen on the H200), and instantiating would, for good (the driver keeps
// a destroyed executable's memory for later ones). The pool's reservation is then exactly what
// capture_all's captures would reserve in a fresh pool, counted once since every bucket shares
// it; the executables' bytes come from the model of detail/exec_memory.hpp, one per bucket, or
// with share_executables one per topology, and at most max_executables of them, the ones
// capture_all would keep. Then everything is destroyed, and the throwaway pool's memory goes back
// to CUDA before estimate returns.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/piecewise.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <time.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

//! Device memory a ladder of graphs will hold (GraphBuckets::estimate) or holds
//! (GraphBuckets::memory): its pool, and the driver's memory for its executables.
//!
//!     tensorplay::MemoryEstimate e = decode.estimate(stream);
//!     std::size_t free = 0, total = 0;
//!     cudaMemGetInfo(&free, &total);
//!     std::size_t kv_cache_bytes = free - e.total_bytes() - headroom;
struct MemoryEstimate {
  std::size_t pool_bytes = 0;        //!< device memory the pool will hold (sharing counted once)
  std::size_t executable_bytes = 0;  //!< device memory the driver takes for the executables (modelled)
  [[nodiscard]] std::size_t total_bytes() const noexcept;
};

namespace detail {

//! A body of GraphBuckets captured as one graph that is given that Graph, for conditional nodes:
//! body(graph, stream, size). GraphBuckets and estimate_ladder look for it before the other
//! forms (defined here, where estimate_ladder needs it; GraphBuckets' other forms are in buckets.hpp).
template <class Body>
concept GraphTakingBucketBody = std::is_invocable_v<Body&, Graph&, StreamRef, std::size_t>;

//! The modelled bytes of the executable of the graph `graph` holds, compiled or not.
TENSORPLAY_DECL std::size_t held_graph_bytes(const Graph& graph, const tensorplay::source_location& where);

//! The executable bytes one captured bucket holds now: a Graph's executable, or a PiecewiseGraph's
//! segments once it reports them.
template <class Unit>
std::size_t unit_executable_bytes(const Unit& unit, const tensorplay::source_location& where) {
  if constexpr (requires { unit.executable_bytes(where); }) return unit.executable_bytes(where);
  else if constexpr (requires { unit.executable_bytes(); }) return unit.executable_bytes();
  else if constexpr (std::is_same_v<Unit, Graph>) return unit.is_instantiated() ? held_graph_bytes(unit, where) : 0;
  else return 0;
}

//! What cudaGraphExecUpdate needs to be equal between two graphs, as a sequence of numbers:
//! node types in creation order, edges between creation indices, child graphs and conditional
//! bodies likewise. Graphs with equal topologies share one executable (share_executables).
TENSORPLAY_DECL void append_topology(cudaGraph_t graph, const ConditionalBodies* bodies, std::vector<std::uint64_t>& out,
                            const tensorplay::source_location& where);

//! A graph pool made for one estimate. Its memory goes back to CUDA when it is released, on this
//! thread: the throwaway graphs' keep-alive bundles (graph/detail/retained.hpp) hold the pool until CUDA
//! has released their user objects and the reaper has destroyed them, which is waited for, up to
//! a quarter of a second (a body that keeps a tensor it allocated keeps the pool longer).
class ScratchPool {
 public:
  ScratchPool(int device, const tensorplay::source_location& where);
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  ~ScratchPool();

  [[nodiscard]] const Pool& pool() const noexcept { return pool_; }

  void release() noexcept;

 private:
  Pool pool_;
};

//! GraphBuckets::estimate for a body captured as one graph: see the header. `buckets` are the
//! GraphBuckets' own (none may be captured yet).
//! \throws usage_error when a bucket is captured already, or for a piecewise body; whatever the
//!         body throws while captured (nothing is left capturing or held then).
template <class Body, class Buckets>
MemoryEstimate estimate_ladder(const std::vector<std::size_t>& sizes, Body& body, const Buckets& buckets, bool share_executables,
                               std::size_t max_executables, StreamRef stream, const tensorplay::source_location& where) {
  if constexpr (!GraphTakingBucketBody<Body> && std::is_invocable_v<Body&, PiecewiseGraph&, std::size_t>) {
    (void)sizes, (void)body, (void)buckets, (void)share_executables, (void)max_executables, (void)stream;
    throw_usage("GraphBuckets::estimate: a piecewise body runs eager steps between its segments, which a capture "
                "alone cannot estimate; estimate needs a body captured as one graph, body(StreamRef, size) or "
                "body(Graph&, StreamRef, size)");
  } else {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      if (buckets[i].captured)
        throw_usage("GraphBuckets::estimate: the bucket " + std::to_string(sizes[i]) +
                    " is captured already; estimate before the first run or capture_all (memory() says what is held)");
    struct Kept {
      std::vector<std::uint64_t> topology;  // share_executables only
      std::size_t bytes;
    };
    std::vector<Kept> kept;  // the executables capture_all would hold, oldest first
    MemoryEstimate estimate;
    ScratchPool scratch(stream.device(where), where);
    for (std::size_t i = sizes.size(); i-- > 0;) {
      Graph graph(GraphOptions{.pool = scratch.pool()});
      graph.capture_begin({.stream = stream}, where);
      try {
        if constexpr (GraphTakingBucketBody<Body>) body(graph, graph.capture_stream(), sizes[i]);  // the throwaway graph
        else body(graph.capture_stream(), sizes[i]);
      } catch (...) {
        graph.reset();  // abandons the capture: nothing is left capturing
        throw;
      }
      graph.capture_end(Instantiate::Later, where);
      Kept exec{{}, held_graph_bytes(graph, where)};
      if (share_executables) {
        append_topology(graph.native_graph(), recorded_bodies(graph), exec.topology, where);
        bool shared = false;
        for (const Kept& k : kept) shared = shared || k.topology == exec.topology;
        if (shared) continue;
      }
      // capture_all drops the least recently used executable at the limit: the oldest here.
      if (max_executables != 0 && kept.size() >= max_executables) kept.erase(kept.begin());
      kept.push_back(std::move(exec));
    }
    estimate.pool_bytes = scratch.pool().stats().reserved_bytes;
    for (const Kept& k : kept) estimate.executable_bytes += k.bytes;
    return estimate;
  }
}

//! GraphBuckets::memory: the pool's reservation now (with the memory of any other graph that
//! shares it) and the modelled bytes of the executables held now (shared ones once).
template <class Buckets, class Slots>
MemoryEstimate held_ladder_memory(const Pool& pool, const Buckets& buckets, const Slots& slots, bool share_executables,
                                  const tensorplay::source_location& where) {
  MemoryEstimate held;
  held.pool_bytes = pool.stats().reserved_bytes;
  using Unit = std::remove_cvref_t<decltype(buckets[0].unit)>;
  if constexpr (std::is_same_v<Unit, Graph>) {
    if (share_executables) {
      for (std::size_t s = 0; s < slots.size(); ++s) {
        if (!slots[s].exec) continue;
        for (const auto& b : buckets) {
          if (b.captured && b.slot == s) {
            held.executable_bytes += held_graph_bytes(b.unit, where);
            break;
          }
        }
      }
      return held;
    }
  }
  for (const auto& b : buckets)
    if (b.captured) held.executable_bytes += unit_executable_bytes(b.unit, where);
  return held;
}

}  // namespace detail
}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/exec_memory.hpp>
#include <tensorplay/detail/graph_topology.hpp>
#include <tensorplay/detail/reaper.hpp>
#include <tensorplay/detail/small_algorithm.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>

namespace tensorplay {

TENSORPLAY_DECL std::size_t MemoryEstimate::total_bytes() const noexcept { return pool_bytes + executable_bytes; }
}  // namespace tensorplay

namespace tensorplay::detail {

TENSORPLAY_DECL std::size_t held_graph_bytes(const Graph& graph, const tensorplay::source_location& where) {
  return modelled_exec_bytes(graph.native_graph(), recorded_bodies(graph), where);
}

TENSORPLAY_DECL void append_topology(cudaGraph_t graph, const ConditionalBodies* bodies, std::vector<std::uint64_t>& out,
    const tensorplay::source_location& where) {
  const GraphTopology topology(graph, where);
  out.push_back(topology.nodes.size());
  for (cudaGraphNode_t node : topology.nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    TENSORPLAY_CHECK(cudaGraphNodeGetType(node, &type), where);
    out.push_back(static_cast<std::uint64_t>(type));
    if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      TENSORPLAY_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child), where);
      append_topology(child, bodies, out, where);
    } else if (type == cudaGraphNodeTypeConditional && bodies != nullptr) {
      const auto of = bodies->of(node);
      out.push_back(of.size());
      for (cudaGraph_t body : of) append_topology(body, bodies, out, where);
    }
  }
  const std::size_t edges = topology.edge_count();
  std::vector<std::uint64_t> pairs(edges);
  for (std::size_t e = 0; e < edges; ++e)
    pairs[e] = (std::uint64_t{topology.index_of(topology.from[e])} << 32) | topology.index_of(topology.to[e]);
  sort_range(pairs.data(), pairs.size());
  out.push_back(edges);
  out.insert(out.end(), pairs.begin(), pairs.end());
}

TENSORPLAY_DECL ScratchPool::ScratchPool(int device, const tensorplay::source_location& where) {
  DeviceGuard on_device(device, where);
  pool_ = graph_pool_handle(where);
}

TENSORPLAY_DECL ScratchPool::~ScratchPool() { release(); }

TENSORPLAY_DECL void ScratchPool::release() noexcept {
  for (int i = 0; i < 500 && pool_.use_count() > 1; ++i) {
    Reaper::instance().drain();
    if (pool_.use_count() <= 1) break;
    const timespec half_ms{0, 500000};
    (void)::nanosleep(&half_ms, nullptr);
  }
  pool_ = Pool();
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
