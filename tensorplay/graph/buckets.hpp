// tensorplay/graph/buckets.hpp: GraphBuckets: one step captured per batch size of a ladder,
// every capture in one pool; BucketOptions; Overflow.
//
// LLM servers capture their decode step once per batch size (1, 2, 4, 8, 16, 24, 32, ...), pad a
// batch up to the nearest captured size, and run eagerly above the largest. GraphBuckets does
// that bookkeeping, and keeps the memory of the whole ladder close to that of its largest bucket:
//
// Memory. Every bucket captures into one pool. What a body frees during its capture (its
// temporaries) becomes reusable by the captures after it, so when the largest bucket is
// captured first (capture_all, lazy = false), every smaller bucket fits its temporaries into
// blocks the largest one already reserved. Only memory a body keeps (a tensor assigned outside
// the body) adds up per bucket: keep static inputs and outputs in your own buffers, sized for
// the largest bucket, outside the pool.
//
// Safety. Graphs that share a pool must replay in the order they were captured and never
// concurrently, because a later capture may have been handed blocks an earlier graph also
// writes. Buckets are captured in any order (lazily, on first use) and replayed in any order,
// which is safe under three rules that this class keeps or documents:
//   1. Every run is issued to the caller's stream, in call order, and a lazy capture is made on
//      that same stream, so no two buckets' work ever overlaps on the GPU (runs on different
//      streams must be ordered by the caller: one GraphBuckets is one sequence of steps).
//   2. A body's temporaries carry nothing from one run to the next: a run of bucket A may
//      overwrite blocks that bucket B uses as temporaries, but B rewrites them before it reads
//      them at its next run.
//   3. Memory a run leaves behind in the pool (a tensor a body allocated and kept) is valid only
//      until the next run of any bucket: a later capture may have been handed its blocks after
//      the tensor was replaced. Outputs in your own buffers live as long as you say.
//
// Sharing executables (BucketOptions::share_executables). Every bucket keeps its captured graph;
// buckets whose graphs CUDA accepts as updates of one another share one executable, switched
// with cudaGraphExecUpdate when the bucket run changes. That trades executable memory (device
// and host) for one update per change of bucket: see docs/buckets.md for when it pays off.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/small_algorithm.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/bucket_memory.hpp>
#include <tensorplay/graph/detail/executable.hpp>
#include <tensorplay/graph/detail/rebind.hpp>
#include <tensorplay/graph/detail/rebind_graphs.hpp>
#include <tensorplay/graph/graph.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/piecewise.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/graph/detail/staging.hpp>
#include <tensorplay/pool.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

//! What GraphBuckets::run(n) does when n is above the largest bucket.
enum class Overflow {
  Eager,  //!< run the body eagerly with size n (nothing is captured)
  Throw,  //!< throw usage_error
};

//! How a GraphBuckets captures and keeps its buckets.
struct BucketOptions {
  //! Empty: one new pool, shared by every bucket. A pool given here may be shared with other
  //! graphs (another ladder, say): their runs and these must then be ordered too.
  Pool pool = {};
  //! Capture a bucket on its first run; false: capture every bucket, largest first, when the
  //! GraphBuckets is constructed (on the current stream).
  bool lazy = true;
  //! 0: no limit. Otherwise at most this many executables are kept; the least recently run are
  //! dropped (their buckets captured again on their next run).
  std::size_t max_executables = 0;
  Overflow overflow = Overflow::Eager;
  //! Buckets whose graphs have one topology share one executable, switched between them with
  //! cudaGraphExecUpdate (CUDA decides which graphs can share; the others get their own).
  bool share_executables = false;
  //! Staged run: zero each static buffer from the end of its input up to the bucket's size, so
  //! that the padding rows hold zeros rather than an earlier step's data.
  bool zero_fill_tail = false;
};

namespace detail {

//! Throws usage_error unless `sizes` is a non-empty, strictly increasing ladder without 0.
TENSORPLAY_DECL void check_ladder(const std::vector<std::size_t>& sizes);

//! A body of GraphBuckets that builds each bucket as a PiecewiseGraph: body(pieces, size).
template <class Body>
concept PiecewiseBucketBody = std::is_invocable_v<Body&, PiecewiseGraph&, std::size_t>;

//! A body of GraphBuckets captured as one graph: body(stream, size).
template <class Body>
concept GraphBucketBody = std::is_invocable_v<Body&, StreamRef, std::size_t>;

// The third form, body(graph, stream, size), is GraphTakingBucketBody (graph/detail/bucket_memory.hpp).

//! The first `count` elements of a contiguous tensor, as a span.
template <class T>
std::span<element_t<T>> front_of(const T& t, std::size_t count) noexcept {
  return std::span<element_t<T>>(tensor_data(t), count);
}

//! `s` where rebinds (`map`; null: none) moved it; pair `pair` of a staged run.
template <class T>
std::span<T> rebound_span(std::span<T> s, const RebindMap* map, std::size_t pair) {
  if (map == nullptr) return s;
  const auto begin = reinterpret_cast<std::uintptr_t>(s.data());
  return std::span<T>(reinterpret_cast<T*>(map->where_now(begin, begin + s.size_bytes(), pair)), s.size());
}

//! Copies every input onto its static buffer with one copy per pair, in stream order, with
//! stage_and_launch's checks and copy semantics (for runs without staging nodes of their own).
template <class... S, class... I>
void stage_by_copies(const std::tuple<S...>& statics, const std::tuple<I&...>& inputs, int device, cudaStream_t stream,
                     const tensorplay::source_location& where) {
  StaticOrder order;  // these statics are views made for this call: nothing to keep
  const auto plans = plan_pairs(statics, inputs, device, order, where);
  [&]<std::size_t... k>(std::index_sequence<k...>) {
    (
        [&] {
          const auto& dst = std::get<k>(statics);
          if (plans[k].kind != StageKind::Batched)
            return issue_unbatched(plans[k], dst, std::get<k>(inputs), device, stream, where);
          TENSORPLAY_CHECK(cudaMemcpyAsync(tensor_data(dst), tensor_data(std::get<k>(inputs)), dst.size_bytes(), cudaMemcpyDefault, stream),
                           where);
        }(),
        ...);
  }(std::index_sequence_for<S...>{});
}

}  // namespace detail

//! One step captured per batch size of a ladder, all in one pool; a run pads its batch up to
//! the smallest bucket that holds it.
//!
//!     tensorplay::GraphBuckets decode({1, 2, 4, 8, 16, 24, 32, 48, 64},
//!                                     [&](tensorplay::StreamRef s, std::size_t batch) {
//!                                       decode_step(s, batch);   // reads and writes user buffers
//!                                     });
//!     std::size_t ran = decode.run(batch, stream);   // 5 -> captures bucket 8 once, replays it
//!
//! The body is called as body(StreamRef stream, std::size_t size), or, to make each bucket a
//! PiecewiseGraph (captured segments with eager steps between them), as
//! body(PiecewiseGraph& pieces, std::size_t size), calling pieces.capture and pieces.eager; the
//! current stream is then the run's stream. (A body callable both ways is taken as piecewise.)
//!
//! For conditional nodes in a bucket (Graph::conditional_handle, if_, while_, if_else_, switch_,
//! with handles or predicates), the body takes the bucket's Graph too:
//! body(Graph& graph, StreamRef stream, std::size_t size), captured as one graph like
//! body(stream, size) (lazily, by capture_all, with share_executables, and into estimate()'s
//! throwaway graphs, whichever graph is capturing). Such a body cannot run eagerly: a run above
//! the ladder throws usage_error, whatever the overflow policy, before anything is issued.
//! Detection: a body callable as body(Graph&, StreamRef, std::size_t) is taken as this form,
//! before the other two are looked at. The forms differ in their number of arguments, so a
//! generic lambda [&](auto& g, StreamRef s, std::size_t n) is this form (g is the Graph), and no
//! body of two arguments is; only a body callable with both two and three arguments (an
//! overload set, a variadic lambda) could be either, and it is given the Graph. A piecewise
//! body's segments take their Graph with PiecewiseGraph::capture(body(Graph&, StreamRef)).
//!
//!     tensorplay::GraphBuckets loops({1, 2, 4, 8}, [&](tensorplay::Graph& g, tensorplay::StreamRef, std::size_t size) {
//!       auto h = g.conditional_handle(1);                                // a do-while
//!       g.while_(h, [&, size, h](tensorplay::StreamRef b) { step<<<1, 1, 0, b>>>(size, h); });  // step: h.set(0u)
//!     });
//!
//! Outputs of a run are valid until the next run of any bucket: see the header comment for
//! why, and keep inputs and outputs that must outlive a run in buffers of your own, sized for
//! the largest bucket, outside the pool. Runs, captures included, are issued to the stream
//! passed to run(), in call order; runs on different streams must be ordered by the caller.
//!
//! Not thread-safe: one thread at a time per GraphBuckets, like Graph.
template <class Body>
class GraphBuckets {
  static constexpr bool takes_graph = detail::GraphTakingBucketBody<Body>;  // looked for first
  static constexpr bool piecewise = !takes_graph && detail::PiecewiseBucketBody<Body>;
  static_assert(takes_graph || piecewise || detail::GraphBucketBody<Body>,
                "GraphBuckets: the body must be callable as body(StreamRef stream, std::size_t size), "
                "body(Graph& graph, StreamRef stream, std::size_t size) (for conditional nodes), or "
                "body(PiecewiseGraph& pieces, std::size_t size)");
  using Unit = std::conditional_t<piecewise, PiecewiseGraph, Graph>;
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

 public:
  //! \throws usage_error for a ladder that is empty, unsorted, has repeats or contains 0, and
  //!         for share_executables with a piecewise body (each piece is a graph of its own).
  //!         With lazy = false, whatever capture_all throws.
  GraphBuckets(std::vector<std::size_t> sizes, Body body, BucketOptions options = {},
               tensorplay::source_location where = tensorplay::source_location::current())
      : sizes_(std::move(sizes)), body_(std::move(body)), options_(std::move(options)), pool_(options_.pool) {
    detail::check_ladder(sizes_);
    if (piecewise && options_.share_executables)
      detail::throw_usage("GraphBuckets: share_executables needs a body captured as one graph, body(StreamRef, size) "
                          "or body(Graph&, StreamRef, size)");
    buckets_.resize(sizes_.size());
    if (!options_.lazy) capture_all(current_stream(where), where);
  }

  //! Runs a batch of n on `stream`: replays bucket_for(n) (capturing it first if needed).
  //! Above the ladder, Overflow::Eager runs body(stream, n) eagerly. Returns the size run: the
  //! bucket, or n when eager.
  //! \throws usage_error for n = 0, and above the ladder with Overflow::Throw or with a body
  //!         that takes the Graph (nothing is issued then; a piecewise body's segment that
  //!         takes its Graph throws when reached, after the pieces before it ran). A body that
  //!         throws while its bucket is captured: the exception propagates, the bucket stays
  //!         uncaptured, nothing is left capturing, and the next run tries again.
  std::size_t run(std::size_t n, StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current()) {
    const std::size_t i = index_for(n, "run");
    if (i == none) {
      run_eagerly(n, stream, where);
      return n;
    }
    prepare(i, stream, where);
    launch(i, stream, where);
    return sizes_[i];
  }

  //! Copies each input (n samples) into the front of its static buffer, then runs as run(n, stream).
  //!
  //! An input of n samples holds k elements per sample: its size must be a multiple of n, and
  //! its static buffer must hold k elements per sample of the bucket run (sized for the largest
  //! bucket, it does; for eager runs above the ladder it must hold k * n). With zero_fill_tail,
  //! elements k*n up to k*bucket of each static buffer are set to zero first. Graph-owned buckets
  //! copy through their graph's staging nodes (Graph::stage_and_launch); shared executables, piecewise
  //! buckets and eager runs with one copy per input. The checks and copy semantics are those of
  //! stage_and_launch (conversions, host and peer inputs, overlaps refused).
  //!
  //!     decode.run(batch, std::tie(static_tokens), std::tie(tokens), stream);
  //!
  //! Both tuples may hold temporaries as well as references, as for Graph::stage_and_launch.
  template <class... S, class... I>
  std::size_t run(std::size_t n, std::tuple<S...> static_inputs, std::tuple<I...> inputs, StreamRef stream,
                  tensorplay::source_location where = tensorplay::source_location::current()) {
    return run_staged(n, detail::tie_all(static_inputs), detail::tie_all(inputs), stream, where);
  }

 private:
  template <class... S, class... I>
  std::size_t run_staged(std::size_t n, std::tuple<S&...> static_inputs, std::tuple<I&...> inputs, StreamRef stream,
                         const tensorplay::source_location& where) {
    static_assert(sizeof...(S) == sizeof...(I), "GraphBuckets::run: static_inputs and inputs must have the same number of elements");
    static_assert((detail::check_stage_pair<std::remove_cvref_t<S>, std::remove_cvref_t<I>>() && ...));
    const std::size_t i = index_for(n, "run");
    const std::size_t rows = i == none ? n : sizes_[i];
    // The front of each static buffer that receives the input (k*n elements), checked first.
    auto fronts = [&]<std::size_t... k>(std::index_sequence<k...>) {
      return std::make_tuple(staged_front(k, std::get<k>(static_inputs), tensor_size(std::get<k>(inputs)), n, rows)...);
    }(std::index_sequence_for<S...>{});
    if (i != none) prepare(i, stream, where);
    const detail::RebindMap* moved = rebound(i);  // where rebinds of this bucket moved the buffers (null: nowhere)
    if (options_.zero_fill_tail && rows > n) {
      [&]<std::size_t... k>(std::index_sequence<k...>) {
        (zero_tail(std::get<k>(static_inputs), std::get<k>(fronts).size(), tensor_size(std::get<k>(inputs)) / n * rows,
                   moved, k, stream, where),
         ...);
      }(std::index_sequence_for<S...>{});
    }
    if constexpr (!piecewise) {
      if (i != none && !options_.share_executables) {
        touch(i);
        std::apply([&](auto&... front) { buckets_[i].unit.stage_and_launch(std::tie(front...), inputs, stream, where); },
                   fronts);
        return rows;
      }
    }
    auto targets = [&]<std::size_t... k>(std::index_sequence<k...>) {  // graph-owned buckets map in Graph itself
      return std::make_tuple(detail::rebound_span(std::get<k>(fronts), moved, k)...);
    }(std::index_sequence_for<S...>{});
    detail::stage_by_copies(targets, inputs, stream.device(where), stream.get(), where);
    if (i == none) {
      run_eagerly(n, stream, where);
      return n;
    }
    launch(i, stream, where);
    return rows;
  }

 public:
  //! Graph::rebind across every bucket captured now, all or nothing: the sum of their nodes.
  //! Buckets captured later (on their first run, or again after max_executables dropped them)
  //! capture what their body uses, and are not rebound; runs above the ladder run the body as
  //! it is. Staged runs of a rebound bucket copy into the buffers it uses now.
  //!
  //!     decode.rebind(kv_cache_a, kv_cache_b);   // every captured bucket reads kv_cache_b
  //!
  //! \throws usage_error as Graph::rebind does (no bucket has changed then), and with
  //!         share_executables (buckets switch one executable with cudaGraphExecUpdate from their
  //!         graphs, which a rebind does not change).
  template <ContiguousTensor From, ContiguousTensor To>
  RebindResult rebind(const From& from, const To& to, tensorplay::source_location where = tensorplay::source_location::current()) {
    static_assert(detail::check_rebind_types<From, To>());
    if (options_.share_executables)
      detail::throw_usage("GraphBuckets::rebind: not with share_executables (buckets switch a shared executable with "
                          "cudaGraphExecUpdate from their graphs); rebuild the ladder with the new buffer, or share none");
    std::vector<Graph*> graphs;
    std::vector<std::size_t> owner;  // the bucket of each graph
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      if (!buckets_[i].captured) continue;
      if constexpr (piecewise) {
        for (Graph* g : detail::PiecewiseAccess::segments(buckets_[i].unit)) {
          graphs.push_back(g);
          owner.push_back(i);
        }
      } else {
        graphs.push_back(&buckets_[i].unit);
        owner.push_back(i);
      }
    }
    const int device = graphs.empty() ? -1 : graphs.front()->device();
    const detail::RebindRequest request = detail::rebind_request(from, to, device, "GraphBuckets::rebind", where);
    std::vector<std::size_t> counts(graphs.size(), 0);
    const RebindResult result = detail::rebind_all(graphs, request, counts, "GraphBuckets::rebind", where);
    if constexpr (piecewise) {  // a bucket whose segments changed stages where they read now
      for (std::size_t g = 0; g < graphs.size();) {  // a bucket's segments are consecutive
        const std::size_t bucket = owner[g];
        bool changed = false;
        for (; g < graphs.size() && owner[g] == bucket; ++g) changed |= counts[g] != 0;
        if (changed) detail::PiecewiseAccess::moved(buckets_[bucket].unit, request);
      }
    }
    return result;
  }

  //! Captures every bucket not captured yet, largest first, on `stream` (nothing runs), so that
  //! the smaller buckets reuse the blocks the largest reserved. With max_executables, the
  //! smallest buckets are those left captured.
  void capture_all(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current()) {
    for (std::size_t i = sizes_.size(); i-- > 0;)
      if (!buckets_[i].captured) capture(i, stream, where);
  }

  //! The smallest bucket that holds n; 0 when n is above the ladder.
  //! \throws usage_error for n = 0.
  [[nodiscard]] std::size_t bucket_for(std::size_t n) const {
    const std::size_t i = find(n, "bucket_for");
    return i == none ? 0 : sizes_[i];
  }

  //! Whether the bucket of this size (a size of the ladder) holds a captured graph now.
  //! \throws usage_error when `bucket` is not a size of the ladder.
  [[nodiscard]] bool is_captured(std::size_t bucket) const {
    const std::size_t i = detail::lower_bound_index(sizes_.data(), sizes_.size(), bucket);
    if (i == sizes_.size() || sizes_[i] != bucket)
      detail::throw_usage("GraphBuckets::is_captured: " + std::to_string(bucket) +
                          " is not a batch size of the ladder (pass a size, not an index)");
    return buckets_[i].captured;
  }

  //! The pool every bucket captures into (made on first need when BucketOptions::pool is empty).
  [[nodiscard]] Pool pool() const {
    if (!pool_) pool_ = graph_pool_handle();
    return pool_;
  }

  //! What capture_all would take, before any bucket is captured: the pool (counted once) and the
  //! executables (modelled; shared ones once). Captures every bucket into throwaway graphs on
  //! `stream`, largest first, compiles none, and gives everything back before returning (a body
  //! that takes the Graph is given each throwaway Graph).
  //! \throws usage_error once a bucket is captured, or for a piecewise body; whatever the body
  //!         throws (nothing is left capturing or held then).
  [[nodiscard]] MemoryEstimate estimate(StreamRef stream, tensorplay::source_location where = tensorplay::source_location::current()) {
    return detail::estimate_ladder(sizes_, body_, buckets_, options_.share_executables, options_.max_executables, stream, where);
  }
  //! What the captured buckets hold now: the pool's reservation and the executables' bytes.
  [[nodiscard]] MemoryEstimate memory(tensorplay::source_location where = tensorplay::source_location::current()) const {
    return detail::held_ladder_memory(pool_, buckets_, slots_, options_.share_executables, where);
  }

  //! The ladder, as given.
  [[nodiscard]] const std::vector<std::size_t>& sizes() const noexcept { return sizes_; }
  //! Executables held now: captured buckets, or with share_executables the shared executables.
  [[nodiscard]] std::size_t executables() const noexcept {
    std::size_t held = 0;
    if (options_.share_executables) {
      for (const Slot& s : slots_) held += static_cast<bool>(s.exec) ? 1 : 0;
    } else {
      for (const Bucket& b : buckets_) held += b.captured ? 1 : 0;
    }
    return held;
  }

 private:
  struct Bucket {
    Unit unit;
    bool captured = false;
    std::uint64_t last_use = 0;  // clock_ at its last run or capture (least recently used goes first)
    std::size_t slot = none;     // share_executables: index into slots_
  };
  //! A shared executable and the bucket whose graph it runs now.
  struct Slot {
    detail::ExecCore exec;  // runs the graph of bucket `loaded` (the buckets own the graphs)
    std::size_t loaded = none;
    std::uint64_t last_use = 0;
  };

  // The bucket index for n: `none` above the ladder. \throws usage_error for n = 0.
  std::size_t find(std::size_t n, const char* what) const {
    if (n == 0) detail::throw_usage(std::string("GraphBuckets::") + what + ": a batch of 0 has no bucket");
    const std::size_t i = detail::lower_bound_index(sizes_.data(), sizes_.size(), n);
    return i == sizes_.size() ? none : i;
  }

  // find(), and the overflow policy above the ladder.
  std::size_t index_for(std::size_t n, const char* what) const {
    const std::size_t i = find(n, what);
    if (i == none && options_.overflow == Overflow::Throw)
      detail::throw_usage(std::string("GraphBuckets::") + what + ": a batch of " + std::to_string(n) +
                          " is above the largest bucket (" + std::to_string(sizes_.back()) + ") and overflow is Overflow::Throw");
    if constexpr (takes_graph) {
      if (i == none) refuse_eager(n, what);
    }
    return i;
  }

  // A body that takes the Graph runs only captured: above the ladder, usage_error.
  [[noreturn]] void refuse_eager(std::size_t n, const char* what) const {
    detail::throw_usage(std::string("GraphBuckets::") + what + ": a batch of " + std::to_string(n) +
                        " is above the largest bucket (" + std::to_string(sizes_.back()) +
                        "), and a body that takes the Graph (body(Graph&, StreamRef, size), for conditional nodes) "
                        "cannot run eagerly; use Overflow::Throw and keep batches within the ladder, or a ladder whose "
                        "largest bucket covers the batch");
  }

  void touch(std::size_t i) noexcept { buckets_[i].last_use = ++clock_; }

  void prepare(std::size_t i, StreamRef stream, const tensorplay::source_location& where) {
    if (!buckets_[i].captured) [[unlikely]]
      capture(i, stream, where);
  }

  void launch(std::size_t i, StreamRef stream, const tensorplay::source_location& where) {
    touch(i);
    if constexpr (!piecewise) {
      if (options_.share_executables) return launch_shared(i, stream, where);
    }
    buckets_[i].unit.replay(stream, where);
  }

  void run_eagerly(std::size_t n, StreamRef stream, const tensorplay::source_location& where) {
    if constexpr (takes_graph) {
      (void)stream, (void)where;
      refuse_eager(n, "run");  // index_for refused it before anything was issued
    } else if constexpr (piecewise) {
      PiecewiseGraph pieces = detail::PiecewiseAccess::immediate(stream);
      body_(pieces, n);
    } else {
      StreamGuard guard(stream, where);  // body code that follows the current-stream convention
      body_(stream, n);
    }
  }

  Pool& pool_on(StreamRef stream, const tensorplay::source_location& where) {
    if (!pool_) {
      detail::DeviceGuard guard(stream.device(where), where);
      pool_ = graph_pool_handle(where);
    }
    return pool_;
  }

  // Captures bucket i on `stream`. On a throw, the bucket is left uncaptured and empty.
  void capture(std::size_t i, StreamRef stream, const tensorplay::source_location& where) {
    Bucket& b = buckets_[i];
    b.unit = Unit(GraphOptions{.pool = pool_on(stream, where)});
    const std::size_t size = sizes_[i];
    try {
      if constexpr (piecewise) {
        StreamGuard guard(stream, where);  // pieces.capture(...) captures on the run's stream
        body_(b.unit, size);
      } else if (options_.share_executables) {
        b.unit.capture_begin({.stream = stream}, where);
        try {
          if constexpr (takes_graph) body_(b.unit, b.unit.capture_stream(), size);
          else body_(b.unit.capture_stream(), size);
        } catch (...) {
          b.unit.reset();  // abandons the capture: nothing is left capturing
          throw;
        }
        b.unit.capture_end(Instantiate::Later, where);
        assign_slot(i, where);
      } else if constexpr (takes_graph) {
        b.unit.capture([&](StreamRef s) { body_(b.unit, s, size); }, {.stream = stream}, where);
      } else {
        b.unit.capture([&](StreamRef s) { body_(s, size); }, {.stream = stream}, where);
      }
    } catch (...) {
      b.unit = Unit();
      b.slot = none;
      throw;
    }
    b.captured = true;
    touch(i);
    if (!options_.share_executables) make_room_for_one(i);  // after the capture: a failed one costs no bucket
  }

  // ---- max_executables ------------------------------------------------------------------

  // Drops the least recently used captured bucket other than `keep` while more than the limit are held.
  void make_room_for_one(std::size_t keep) {
    if (options_.max_executables == 0) return;
    std::size_t held = 0;
    std::size_t oldest = none;
    for (std::size_t j = 0; j < buckets_.size(); ++j) {
      if (!buckets_[j].captured || j == keep) continue;
      ++held;
      if (oldest == none || buckets_[j].last_use < buckets_[oldest].last_use) oldest = j;
    }
    if (held >= options_.max_executables) drop(oldest);  // `keep` makes held + 1
  }

  // Graph::reset: the executable goes, the pool (and every block the bucket keeps) stays.
  void drop(std::size_t j) noexcept {
    buckets_[j].unit = Unit();
    buckets_[j].captured = false;
    buckets_[j].slot = none;
  }

  // ---- share_executables ----------------------------------------------------------------

  // Lets bucket i share an executable whose topology CUDA accepts, else gives it a new one.
  void assign_slot(std::size_t i, const tensorplay::source_location& where) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].exec && load(s, i, where)) {
        buckets_[i].slot = s;
        return;
      }
    }
    own_slot(i, where);
  }

  // Makes slot s run bucket i's graph. False when CUDA refuses (slot s is unchanged then).
  bool load(std::size_t s, std::size_t i, const tensorplay::source_location& where) {
    UpdateResult result;
    if (!slots_[s].exec.try_update(buckets_[i].unit.native_graph(), result, where)) {
      // A refused update may have patched some nodes already: the slot holds no bucket's work
      // for sure now, and is loaded again before its next launch.
      slots_[s].loaded = none;
      return false;
    }
    slots_[s].loaded = i;
    return true;
  }

  // A new executable for bucket i alone: in a free slot, a new one, or, at max_executables, in
  // the least recently used slot, whose buckets are dropped.
  void own_slot(std::size_t i, const tensorplay::source_location& where) {
    std::size_t s = none;
    std::size_t held = 0;
    std::size_t oldest = none;
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      if (!slots_[k].exec) {
        if (s == none) s = k;
        continue;
      }
      ++held;
      if (oldest == none || slots_[k].last_use < slots_[oldest].last_use) oldest = k;
    }
    if (options_.max_executables != 0 && held >= options_.max_executables) {
      for (std::size_t j = 0; j < buckets_.size(); ++j)
        if (buckets_[j].slot == oldest && j != i) drop(j);
      slots_[oldest].exec.reset();
      s = oldest;
    }
    if (s == none) {
      s = slots_.size();
      slots_.emplace_back();
    }
    buckets_[i].slot = none;
    slots_[s].exec.instantiate(buckets_[i].unit.native_graph(), std::nullopt, where);
    slots_[s].loaded = i;
    slots_[s].last_use = clock_;
    buckets_[i].slot = s;
  }

  void launch_shared(std::size_t i, StreamRef stream, const tensorplay::source_location& where) {
    detail::require_resident(pool_, "GraphBuckets::run");
    if (detail::is_capturing_or_false(stream.get())) [[unlikely]]
      detail::throw_usage("GraphBuckets::run: the stream is being captured; with share_executables a bucket cannot be "
                          "added to another capture (run it outside the capture, or share no executables)");
    Slot* slot = &slots_[buckets_[i].slot];
    if (slot->loaded != i && !load(buckets_[i].slot, i, where)) [[unlikely]] {
      // CUDA accepted this graph into the slot once but refuses it now: give it its own.
      own_slot(i, where);
      slot = &slots_[buckets_[i].slot];
    }
    slot->last_use = clock_;
    detail::check(detail::graph_launch(slot->exec.get(), stream.get()), "cudaGraphLaunch", where);
  }

  // ---- staging --------------------------------------------------------------------------

  // The front of a static buffer that receives an input of `input_size` elements for n samples,
  // after checking that the buffer holds that many per sample of `rows` (the bucket run).
  template <class S>
  static auto staged_front(std::size_t index, const S& buffer, std::size_t input_size, std::size_t n, std::size_t rows) {
    const std::size_t per_sample = input_size / n;
    if (per_sample * n != input_size || tensor_size(buffer) < per_sample * rows) [[unlikely]] {
      std::string text = "GraphBuckets::run: pair " + std::to_string(index) + ": ";
      if (per_sample * n != input_size)
        text += "the input has " + std::to_string(input_size) + " elements, not a multiple of the batch of " + std::to_string(n);
      else
        text += "the static buffer has " + std::to_string(tensor_size(buffer)) + " elements; a bucket of " +
                std::to_string(rows) + " needs " + std::to_string(per_sample * rows) + " (" + std::to_string(per_sample) +
                " per sample)";
      detail::throw_usage(std::move(text));
    }
    return detail::front_of(buffer, input_size);
  }

  // Zeroes elements [from, to) of `buffer`, where rebinds (`moved`) put them.
  template <class S>
  static void zero_tail(const S& buffer, std::size_t from, std::size_t to, const detail::RebindMap* moved, std::size_t pair,
                        StreamRef stream, const tensorplay::source_location& where) {
    using T = element_t<S>;
    if (to <= from) return;
    const std::span<T> tail = detail::rebound_span(std::span<T>(tensor_data(buffer) + from, to - from), moved, pair);
    TENSORPLAY_CHECK(cudaMemsetAsync(tail.data(), 0, tail.size_bytes(), stream.get()), where);
  }

  // Where rebinds of bucket i moved memory that staged runs name; null when nowhere (or i is none).
  const detail::RebindMap* rebound(std::size_t i) {
    if (i == none || !buckets_[i].captured) return nullptr;
    if constexpr (piecewise) {
      const detail::RebindMap& map = detail::PiecewiseAccess::rebound(buckets_[i].unit);
      return map.empty() ? nullptr : &map;
    } else {
      if (options_.share_executables) return nullptr;
      return detail::RebindAccess::executable(buckets_[i].unit).rebind_map();
    }
  }

  std::vector<std::size_t> sizes_;
  Body body_;
  BucketOptions options_;
  mutable Pool pool_;
  std::vector<Bucket> buckets_;  // by ladder index
  std::vector<Slot> slots_;      // share_executables only
  std::uint64_t clock_ = 0;
};

}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL void check_ladder(const std::vector<std::size_t>& sizes) {
  if (sizes.empty()) throw_usage("GraphBuckets: the ladder of batch sizes is empty");
  if (sizes.front() == 0) throw_usage("GraphBuckets: the ladder contains the batch size 0");
  for (std::size_t i = 1; i < sizes.size(); ++i) {
    if (sizes[i] == sizes[i - 1])
      throw_usage("GraphBuckets: the ladder repeats the batch size " + std::to_string(sizes[i]));
    if (sizes[i] < sizes[i - 1])
      throw_usage("GraphBuckets: the ladder is not sorted (" + std::to_string(sizes[i - 1]) + " comes before " +
                  std::to_string(sizes[i]) + "); list the batch sizes in increasing order");
  }
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
