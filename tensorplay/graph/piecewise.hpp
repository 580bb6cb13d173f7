// tensorplay/graph/piecewise.hpp: PiecewiseGraph: captured segments with eager steps between
// them, all segments in one pool.
//
// Some work cannot be captured (a kernel that picks its launch shape from data on the host, a
// library call that synchronises, an attention kernel with its own scheduling), but the work
// around it can. A PiecewiseGraph keeps the captured parts as Graphs sharing one pool and the
// uncapturable parts as steps it calls at every replay, in the order they were appended.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/conditional_builder.hpp>
#include <tensorplay/graph/detail/rebind.hpp>
#include <tensorplay/graph/detail/rebind_graphs.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

class PiecewiseGraph;

namespace detail {

//! An eager step of a PiecewiseGraph: called with the replay's stream.
class EagerStep {
 public:
  virtual ~EagerStep() = default;
  virtual void run(StreamRef stream) = 0;
};

template <class F>
class EagerStepOf final : public EagerStep {
 public:
  explicit EagerStepOf(F step) : step_(std::move(step)) {}
  void run(StreamRef stream) override {
    if constexpr (std::is_invocable_v<F&, StreamRef>) {
      step_(stream);
    } else {
      static_assert(std::is_invocable_v<F&>, "PiecewiseGraph::eager: a step must be callable as step(StreamRef) or step()");
      StreamGuard guard(stream);  // a step() follows the current-stream convention
      step_();
    }
  }

 private:
  F step_;
};

struct PiecewiseAccess;

}  // namespace detail

//! Captured segments with eager steps between them, replayed in order on one stream.
//!
//!     tensorplay::PiecewiseGraph step;
//!     step.capture([&](tensorplay::StreamRef s) { embed_and_project(s); });   // a segment
//!     step.eager([&](tensorplay::StreamRef s) { attention(s); });              // runs at every replay
//!     step.capture([&](tensorplay::StreamRef s) { mlp_and_sample(s); });       // another segment
//!     for (...) step.replay(stream);       // segment, step, segment: in that order on `stream`
//!
//! Every segment captures into the PiecewiseGraph's one pool (GraphOptions::pool, or one new
//! pool), in the order they are appended, and replay() replays them in that order: the order
//! that graphs sharing a pool must keep. Memory a segment allocates and keeps (a tensor assigned
//! outside its body) stays valid for the steps and the later segments; memory a segment frees is
//! reused by later segments. An eager step runs on the replay's stream, outside any capture: what
//! it allocates comes from the default pool, and what it writes for a later segment must be
//! memory whose address that segment captured (a user buffer, or a tensor kept from an earlier
//! segment).
//!
//! Not thread-safe: one thread at a time per PiecewiseGraph, like Graph. Replays of one
//! PiecewiseGraph, like those of graphs sharing a pool, must not run concurrently.
class PiecewiseGraph {
 public:
  explicit PiecewiseGraph(GraphOptions options = {}) noexcept : options_(std::move(options)) {}

  //! Appends a segment: captures body(stream) or body() into a Graph of this pool now; or
  //! body(graph, stream), given the segment's Graph, for conditional nodes in the segment
  //! (graph.conditional_handle, graph.if_, graph.while_, ...). A body callable as
  //! body(Graph&, StreamRef) is taken as that form (a generic lambda (auto& g, StreamRef s) is).
  //!
  //!     step.capture([&](tensorplay::Graph& g, tensorplay::StreamRef s) {
  //!       auto h = g.conditional_handle();
  //!       decide<<<1, 1, 0, s>>>(x.data(), h);                  // decide calls h.set(...)
  //!       g.if_(h, [&](tensorplay::StreamRef b) { act<<<1, 1, 0, b>>>(y.data()); });
  //!     });
  //!
  //! \throws usage_error when CaptureOptions::pool names another pool, and for a body that takes
  //!         the Graph in a PiecewiseGraph that runs eagerly (a piecewise bucket of GraphBuckets
  //!         run above its ladder: the pieces before it have run); whatever Graph::capture
  //!         throws (a body that throws: the segment is not appended, nothing is left capturing).
  template <class F>
  void capture(F&& body, CaptureOptions options = {}, tensorplay::source_location where = tensorplay::source_location::current()) {
    constexpr bool takes_graph = std::is_invocable_v<F&, Graph&, StreamRef>;
    if (options.pool && !(*options.pool == pool()))
      detail::throw_usage("PiecewiseGraph::capture: every segment captures into the PiecewiseGraph's one pool; "
                          "leave CaptureOptions::pool empty or pass pool()");
    if (immediate_) {
      // Eager run of a piecewise bucket above its ladder (GraphBuckets): no capture at all, so
      // no Graph to give a body that takes one.
      if constexpr (takes_graph) {
        detail::throw_usage("PiecewiseGraph::capture: a segment that takes the Graph (body(Graph&, StreamRef), for "
                            "conditional nodes) cannot run eagerly, and this piecewise bucket runs eagerly above the "
                            "ladder of its GraphBuckets; use Overflow::Throw, or a ladder whose largest bucket covers "
                            "the batch");
      } else {
        StreamGuard guard(*immediate_, where);
        detail::call_body(body, *immediate_);
        ++count_;
        return;
      }
    }
    GraphOptions graph_options = options_;
    graph_options.pool = pool();
    Graph graph(std::move(graph_options));
    options.pool.reset();
    if constexpr (takes_graph) graph.capture([&](StreamRef stream) { body(graph, stream); }, options, where);
    else graph.capture(std::forward<F>(body), options, where);
    pieces_.push_back(Piece{std::move(graph), nullptr});
    ++count_;
  }

  //! Appends an eager step: step(StreamRef) or step() (with the replay's stream made current)
  //! runs at every replay, after the pieces appended before it. Nothing runs now.
  template <class F>
  void eager(F&& step) {
    auto holder = std::make_unique<detail::EagerStepOf<std::decay_t<F>>>(std::forward<F>(step));
    ++count_;
    if (immediate_) {
      holder->run(*immediate_);
      return;
    }
    pieces_.push_back(Piece{Graph(), std::move(holder)});
  }

  //! Replays every segment and runs every step, in the order appended, on `stream`.
  //! \throws usage_error when nothing was appended; whatever a step throws (the pieces after
  //!         it do not run then).
  void replay(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current());

  //! The modelled device memory of every segment's executable (Graph::executable_bytes).
  [[nodiscard]] std::size_t executable_bytes(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! Captured segments plus eager steps.
  [[nodiscard]] std::size_t segments() const noexcept { return count_; }

  //! The pool every segment captures into: GraphOptions::pool, else one made on first need.
  [[nodiscard]] Pool pool() const;

  //! Graph::rebind across every segment captured so far, all or nothing: the sum of their nodes.
  //! Segments appended later capture what their bodies use and are not rebound; eager steps are
  //! your code, and use what they use.
  //! \throws usage_error as Graph::rebind does (no segment has changed then).
  template <ContiguousTensor From, ContiguousTensor To>
  RebindResult rebind(const From& from, const To& to, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_rebind_types<From, To>());
    std::vector<Graph*> graphs;
    for (Piece& piece : pieces_)
      if (!piece.step) graphs.push_back(&piece.graph);
    const int device = graphs.empty() ? -1 : graphs.front()->device();
    const detail::RebindRequest request = detail::rebind_request(from, to, device, "PiecewiseGraph::rebind", where);
    const RebindResult result = detail::rebind_all(graphs, request, {}, "PiecewiseGraph::rebind", where);
    if (result.nodes != 0) rebound_.moved(request);
    return result;
  }

 private:
  friend struct detail::PiecewiseAccess;

  struct Piece {
    Graph graph;                               // a segment (empty for a step)
    std::unique_ptr<detail::EagerStep> step;   // a step (null for a segment)
  };

  GraphOptions options_;
  mutable Pool pool_;
  std::vector<Piece> pieces_;
  std::size_t count_ = 0;
  std::optional<StreamRef> immediate_;  // set: run every piece at once on this stream, keep none
  detail::RebindMap rebound_;           // where rebinds moved memory (GraphBuckets' staged runs)
};

namespace detail {

//! What GraphBuckets needs of a PiecewiseGraph beyond its public API.
struct PiecewiseAccess {
  //! A PiecewiseGraph that runs each segment's body and each step at once, on `stream`, and
  //! keeps nothing: a piecewise body run eagerly (above the ladder) without capturing it.
  static PiecewiseGraph immediate(StreamRef stream);
  //! The segments' graphs, in order.
  static std::vector<Graph*> segments(PiecewiseGraph& pieces);
  //! Where rebinds moved memory (for staged runs, which copy before the first segment).
  static const RebindMap& rebound(const PiecewiseGraph& pieces) noexcept;
  //! A rebind across several PiecewiseGraphs (GraphBuckets::rebind) changed nodes of this one.
  static void moved(PiecewiseGraph& pieces, const RebindRequest& request);
};

}  // namespace detail
}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay {

TENSORPLAY_DECL void PiecewiseGraph::replay(StreamRef stream, tensorplay::source_location where) {
  if (pieces_.empty()) detail::throw_usage("PiecewiseGraph::replay: nothing was appended (call capture or eager first)");
  for (Piece& piece : pieces_) {
    if (piece.step) piece.step->run(stream);
    else piece.graph.replay(stream, where);
  }
}

TENSORPLAY_DECL std::size_t PiecewiseGraph::executable_bytes(tensorplay::source_location where) const {
  std::size_t bytes = 0;
  for (const Piece& piece : pieces_)
    if (!piece.step) bytes += piece.graph.executable_bytes(where);
  return bytes;
}

TENSORPLAY_DECL Pool PiecewiseGraph::pool() const {
  if (!pool_) pool_ = options_.pool ? options_.pool : graph_pool_handle();
  return pool_;
}
}  // namespace tensorplay

namespace tensorplay::detail {

TENSORPLAY_DECL PiecewiseGraph PiecewiseAccess::immediate(StreamRef stream) {
  PiecewiseGraph pieces;
  pieces.immediate_ = stream;
  return pieces;
}

TENSORPLAY_DECL std::vector<Graph*> PiecewiseAccess::segments(PiecewiseGraph& pieces) {
  std::vector<Graph*> graphs;
  for (PiecewiseGraph::Piece& piece : pieces.pieces_)
    if (!piece.step) graphs.push_back(&piece.graph);
  return graphs;
}

TENSORPLAY_DECL const RebindMap& PiecewiseAccess::rebound(const PiecewiseGraph& pieces) noexcept { return pieces.rebound_; }

TENSORPLAY_DECL void PiecewiseAccess::moved(PiecewiseGraph& pieces, const RebindRequest& request) { pieces.rebound_.moved(request); }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
