// tensorplay/graph/detail/rebind_graphs.hpp: rebind across several Graphs at once, all or nothing
// (GraphBuckets::rebind, PiecewiseGraph::rebind).
//
// Every graph is prepared first (its index built, its nodes found and checked: a refusal throws
// before anything changes), then each is committed; when a commit throws, the graphs committed
// before it are undone, in reverse order, so that no graph keeps the change.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/rebind.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/version.hpp>

#include <cstddef>
#include <span>

namespace tensorplay::detail {

//! What rebinds across graphs need of a Graph beyond its public API.
struct RebindAccess {
  static Executable& executable(Graph& graph) noexcept { return graph.exec_; }
};

//! Graph::rebind of `request` on every graph of `graphs` (each compiled, none capturing), all or
//! nothing. `per_graph` (empty, or one element per graph) receives each graph's count. `what`
//! names the caller in messages.
//! \throws usage_error as Graph::rebind does; no graph has changed then.
TENSORPLAY_DECL RebindResult rebind_all(std::span<Graph* const> graphs, const RebindRequest& request, std::span<std::size_t> per_graph,
                                        const char* what, const tensorplay::source_location& where);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <string>
#include <vector>

namespace tensorplay::detail {

TENSORPLAY_DECL RebindResult rebind_all(std::span<Graph* const> graphs, const RebindRequest& request, std::span<std::size_t> per_graph,
    const char* what, const tensorplay::source_location& where) {
  for (Graph* g : graphs) {
    if (g->is_capturing()) throw_usage(std::string(what) + ": a capture is open on one of the graphs; rebind after it ends");
    if (!g->is_instantiated()) throw_usage(std::string(what) + ": one of the graphs has no executable (its instantiation failed)");
  }
  std::vector<std::size_t> counts(graphs.size(), 0);
  for (std::size_t i = 0; i < graphs.size(); ++i) counts[i] = RebindAccess::executable(*graphs[i]).prepare_rebind(request, where);
  std::size_t committed = 0;
  std::size_t nodes = 0;
  try {
    for (; committed < graphs.size(); ++committed)
      if (counts[committed] != 0) nodes += RebindAccess::executable(*graphs[committed]).commit_rebind(where).nodes;
  } catch (...) {
    for (std::size_t j = committed; j-- > 0;) {
      if (counts[j] == 0) continue;
      try {
        RebindAccess::executable(*graphs[j]).undo_rebind(where);
      } catch (...) {  // the first failure is the one to report
      }
    }
    throw;
  }
  for (std::size_t i = 0; i < per_graph.size() && i < counts.size(); ++i) per_graph[i] = counts[i];
  return {nodes};
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
