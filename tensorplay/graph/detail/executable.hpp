// tensorplay/graph/detail/executable.hpp: a graph's executable and everything that must agree with it:
// the graph it runs, the graph it was compiled from (which names its nodes), the staging nodes
// and their ring, and stage_and_launch's plan cache.
//
// Every way the executable changes goes through one of its operations, each of which leaves
// those parts consistent on success and on failure: hold (a captured graph, not compiled yet),
// compile, update (in place when CUDA accepts the new graph, else compiled anew, the staging
// nodes carried over either way), staging (the staging nodes added on first use), launch and
// stage_and_launch. No caller patches its bookkeeping afterwards.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/exec_memory.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/detail/staging_nodes.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/graph/detail/rebind.hpp>
#include <tensorplay/graph/detail/staging.hpp>
#include <tensorplay/graph/rebind.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <string>
#include <string_view>

namespace tensorplay::detail {

[[nodiscard]] constexpr std::string_view instantiate_result_name(cudaGraphInstantiateResult result) noexcept {
  switch (result) {
    case cudaGraphInstantiateSuccess: return "success";
    case cudaGraphInstantiateError: return "error";
    case cudaGraphInstantiateInvalidStructure: return "invalid structure";
    case cudaGraphInstantiateNodeOperationNotSupported: return "node operation not supported";
    case cudaGraphInstantiateMultipleDevicesNotSupported: return "multiple devices not supported";
    case cudaGraphInstantiateConditionalHandleUnused: return "conditional handle unused";
    default: return "unknown";
  }
}

TENSORPLAY_DECL std::optional<cudaGraphNodeType> node_type_of(cudaGraphNode_t node) noexcept;

//! A compiled graph: cudaGraphInstantiateWithParams with CUDA's reasons on failure, upload, and
//! cudaGraphExecUpdate. Owns only the cudaGraphExec_t (GraphBuckets' shared executables use it
//! on graphs that their buckets own).
class ExecCore {
 public:
  [[nodiscard]] cudaGraphExec_t get() const noexcept;
  explicit operator bool() const noexcept { return static_cast<bool>(exec_); }

  //! Compiles `graph`; with `upload_stream`, also uploads it there. Replaces any executable
  //! held (destroyed first: CUDA allows a graph with conditional nodes one executable at a time).
  //! \throws cuda_error naming CUDA's instantiation result and the failing node's type.
  void instantiate(cudaGraph_t graph, std::optional<cudaStream_t> upload_stream, const tensorplay::source_location& where);

  //! Patches the executable to run `graph`, which must have the same topology. Returns false,
  //! with CUDA's reason in `result`, when CUDA refuses: the executable may then be partly
  //! patched, and must be loaded again (or compiled anew) before its next launch.
  //! \throws cuda_error for failures other than a refusal.
  bool try_update(cudaGraph_t graph, UpdateResult& result, const tensorplay::source_location& where);

  void reset() noexcept;

 private:
  ExecHandle exec_;
};

//! The executable of one Graph. States: empty; holding a captured graph (not compiled: its
//! compile failed, or it waits for Graph::instantiate); compiled.
class Executable {
 public:
  Executable() = default;
  Executable(Executable&&) noexcept = default;
  Executable& operator=(Executable&&) noexcept = default;

  [[nodiscard]] bool compiled() const noexcept;
  [[nodiscard]] bool holds_graph() const noexcept;
  [[nodiscard]] cudaGraphExec_t get() const noexcept;
  //! The graph the executable runs: the latest captured (an in-place update's, say).
  [[nodiscard]] cudaGraph_t graph() const noexcept;
  [[nodiscard]] int device() const noexcept { return device_; }
  //! The device memory the driver took for the executable, modelled from the graph it was
  //! compiled from (detail/exec_memory.hpp); 0 when nothing is compiled. Walks the graph.
  [[nodiscard]] std::size_t bytes(const tensorplay::source_location& where) const;
  //! The bodies of the conditional nodes of graph().
  [[nodiscard]] const ConditionalBodies& bodies() const noexcept;

  //! Whether the graph it runs holds the Graph's keep-alive bundle (retained.hpp), and whether
  //! the compiled executable does (CUDA gives it references to what its graph held then).
  [[nodiscard]] bool graph_keeps() const noexcept { return graph_keeps_; }
  [[nodiscard]] bool exec_keeps() const noexcept { return exec_keeps_; }
  //! The graph it runs was given the bundle (the executable gets it at its next compile).
  void graph_now_keeps() noexcept;

  //! Holds `graph` (captured on `device`) without compiling it: what there was is dropped.
  void hold(GraphHandle graph, int device, bool keeps, ConditionalBodies bodies = {}) noexcept;

  //! Compiles the held graph (uploading it to `upload` when given). On failure nothing is
  //! compiled and the graph is still held.
  void compile(std::optional<cudaStream_t> upload, const tensorplay::source_location& where);

  //! Makes the executable run `graph` (a new capture of the same work, on the same device):
  //! patched in place when CUDA accepts it, compiled anew when it refuses. The staging nodes are
  //! added to the new graph first, so that its topology matches; either way they come out
  //! enabled, without a plan. If compiling anew fails, the new graph is held, not compiled.
  UpdateResult update(GraphHandle graph, bool keeps, std::optional<cudaStream_t> upload, const tensorplay::source_location& where,
                      ConditionalBodies bodies = {});

  //! Launches on `stream` (not capturing) with the staging nodes off: they must not copy again
  //! what the last stage_and_launch staged.
  void launch(cudaStream_t stream, const tensorplay::source_location& where);

  //! Drops the executable, the graphs and the staging nodes (their ring waits for its launches).
  void reset() noexcept;

  // ---- rebind (graph/detail/rebind.hpp) -------------------------------------------------------

  //! Graph::rebind: every node of the executable that uses [from, from + bytes) uses the same
  //! offset of `to` from the next launch on; stage_and_launch stages into `to` for `from` after it.
  //! The executable is compiled (checked by the caller).
  //! \throws usage_error, changing nothing, when a node cannot change (graph/detail/rebind.hpp).
  RebindResult rebind(const RebindRequest& request, const tensorplay::source_location& where);
  //! rebind in two steps, for several executables all or nothing (rebind_graphs.hpp): prepare
  //! builds the index if needed, finds the nodes and checks them, changing nothing (it may compile
  //! the executable again, with the same parameters); commit applies what prepare found (undone
  //! itself when it throws); undo_rebind reverts the last commit.
  std::size_t prepare_rebind(const RebindRequest& request, const tensorplay::source_location& where);
  RebindResult commit_rebind(const tensorplay::source_location& where);
  void undo_rebind(const tensorplay::source_location& where);
  //! Where rebinds moved stage_and_launch's static buffers; null when nowhere.
  [[nodiscard]] const RebindMap* rebind_map() const noexcept { return remapped_ ? &rebind_->map : nullptr; }
  //! graph(), its nodes given the parameters rebinds gave the executable (for a copy of it).
  [[nodiscard]] cudaGraph_t current_graph(const tensorplay::source_location& where);

  //! Copies every input onto its static buffer, then launches (Graph::stage_and_launch).
  //! The executable is compiled and `stream` is not capturing (checked by the caller).
  template <class... S, class... I>
  void stage_and_launch(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs, cudaStream_t stream,
                        const tensorplay::source_location& where) {
    if constexpr (!(is_rebind_view_v<std::remove_cvref_t<S>> && ...)) {
      if (remapped_) [[unlikely]]  // rebind moved some memory: stage where the graph reads now
        return stage_rebound(static_inputs, inputs, stream, where);
    }
    constexpr std::size_t N = sizeof...(S);
    if constexpr ((DevicePair<std::remove_cvref_t<S>, std::remove_cvref_t<I>> && ...) &&
                  N <= static_cast<std::size_t>(config::copy_table_max)) {
      // The common case: the static buffers of the last call, every pair copied by the copy
      // node, whose plan stands. Only the sources change (same_batched_plan, restage).
      std::array<const void*, N> sources;
      if (staging_ && same_batched_plan(static_inputs, inputs, device_, order_, sources) &&
          staging_->node.restage(exec_.get(), sources.data(), static_cast<int>(N), where)) {
        check(graph_launch(exec_.get(), stream), "cudaGraphLaunch", where);
        staging_->node.launched();
        return;
      }
    }
    const auto plans = plan_pairs(static_inputs, inputs, device_, order_, where);

    std::size_t batched = 0;
    std::size_t skipped = 0;
    for (const StagePlan& plan : plans) {
      batched += plan.kind == StageKind::Batched;
      skipped += plan.kind == StageKind::Skip;
    }
    const bool all_batched = batched + skipped == N;  // the common case: no pass over the others
    if (batched == 0) {
      issue_unbatched(plans, static_inputs, inputs, stream, where);
      launch(stream, where);
      return;
    }
    Staging& staging = prepare_staging(stream, where);
    CopyBatch& batch = staging.batch;
    batch.start(batched < static_cast<std::size_t>(config::copy_table_max) ? batched : config::copy_table_max);
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      (
          [&] {
            if (plans[k].kind != StageKind::Batched) return;
            if (batch.full()) {  // more pairs than one table holds: copy a full table first
              staging.node.launch_now(batch, stream, where);
              batch.start(static_cast<std::size_t>(batch.count()));
            }
            const auto& dst = std::get<k>(static_inputs);
            batch.add(tensor_data(std::get<k>(inputs)), tensor_data(dst),
                      tensor_size(dst) * sizeof(element_t<std::remove_cvref_t<decltype(dst)>>));
          }(),
          ...);
    }(std::index_sequence_for<S...>{});
    if (!all_batched) issue_unbatched(plans, static_inputs, inputs, stream, where);
    const bool by_node = staging.node.stage(exec_.get(), batch, stream, where);
    check(graph_launch(exec_.get(), stream), "cudaGraphLaunch", where);
    if (by_node) staging.node.launched();
    // Every pair went through the copy node, whose plan is now this call's static buffers.
    order_.batched_plan = by_node && batched == N;
  }

 private:
  struct Staging {
    StagingNodes node;
    CopyBatch batch;
    StagingNodeHandles latest_nodes;  // the nodes in latest_, while an in-place update's graph is kept
  };

  // The staging nodes, made on the first stage_and_launch that batches: added to the graph the
  // executable runs, which is compiled again with them (CUDA allows a graph with conditional
  // nodes one executable, so the nodes live in the graph itself).
  Staging& prepare_staging(cudaStream_t stream, const tensorplay::source_location& where);

  // stage_and_launch onto the static buffers where rebind moved them (RebindView).
  template <class... S, class... I>
  void stage_rebound(std::tuple<S&...> static_inputs, std::tuple<I&...> inputs, cudaStream_t stream,
                     const tensorplay::source_location& where) {
    const RebindMap& map = rebind_->map;
    auto views = [&]<std::size_t... k>(std::index_sequence<k...>) {
      return std::make_tuple(rebound_view(std::get<k>(static_inputs), map, k)...);
    }(std::index_sequence_for<S...>{});
    std::apply([&](auto&... view) { stage_and_launch(std::tie(view...), inputs, stream, where); }, views);
  }

  // Builds the rebind index (compiling graph() first when it does not pair with source_).
  void build_rebind_index(const tensorplay::source_location& where);
  // After a commit whose nodes change only through the graph: updates exec_ from the synced
  // graph; when CUDA refuses, reverts the commit and throws usage_error.
  void update_from_graph(const tensorplay::source_location& where);
  // Before exec_ is compiled anew from graph(): the graph gets the rebound parameters, the index
  // (whose nodes are about to change) is dropped; the map stays right.
  void rebind_before_compile(const tensorplay::source_location& where);

  template <std::size_t N, class StaticTuple, class InputTuple>
  void issue_unbatched(const std::array<StagePlan, N>& plans, const StaticTuple& statics, const InputTuple& inputs,
                       cudaStream_t stream, const tensorplay::source_location& where) {
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      (detail::issue_unbatched(plans[k], std::get<k>(statics), std::get<k>(inputs), device_, stream, where), ...);
    }(std::make_index_sequence<N>{});
  }

  // Hot members first: a launch reads exec_ and staging_ only, stage_and_launch remapped_ too.
  ExecCore exec_;
  std::unique_ptr<Staging> staging_;
  bool remapped_ = false;  // rebind_->map is not empty: static buffers are staged where they are now
  std::unique_ptr<RebindState> rebind_;  // Graph::rebind's index and map (null until the first rebind)
  GraphHandle source_;  // the graph exec_ was compiled from: it names exec_'s nodes
  GraphHandle latest_;  // the graph an in-place update made exec_ run (null: source_'s)
  ConditionalBodies source_bodies_;  // the bodies of source_'s conditional nodes (exec_memory.hpp)
  ConditionalBodies latest_bodies_;  // and of latest_'s
  StaticOrder order_;   // stage_and_launch's static buffers, sorted (staging.hpp)
  int device_ = -1;
  bool graph_keeps_ = false;  // graph() holds the keep-alive bundle
  bool exec_keeps_ = false;   // exec_ was compiled from a graph that held it
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/staging_ring.hpp>
#include <tensorplay/tensor.hpp>

#include <exception>

namespace tensorplay::detail {

TENSORPLAY_DECL std::optional<cudaGraphNodeType> node_type_of(cudaGraphNode_t node) noexcept {
  if (node == nullptr) return std::nullopt;
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return type;
}

TENSORPLAY_DECL cudaGraphExec_t ExecCore::get() const noexcept { return exec_.get(); }

TENSORPLAY_DECL void ExecCore::instantiate(cudaGraph_t graph, std::optional<cudaStream_t> upload_stream, const tensorplay::source_location& where) {
  exec_.reset();
  cudaGraphInstantiateParams params{};
  params.flags = cudaGraphInstantiateFlagAutoFreeOnLaunch;
  if (upload_stream) {
    params.flags |= cudaGraphInstantiateFlagUpload;
    params.uploadStream = *upload_stream;
  }
  cudaGraphExec_t exec = nullptr;
  // Relaxed while tensorplay captures are open: CUDA refuses instantiation on a thread with
  // another capture open (thread_local mode), or while any capture runs (global mode), though
  // it does not disturb the capture. (Two mode switches cost a tenth of a microsecond.)
  std::optional<RelaxedCaptureMode> relaxed;
  if (CaptureRegistry::instance().any_open()) relaxed.emplace();
  const cudaError_t status = detail::instantiate(&exec, graph, &params);
  if (status != cudaSuccess) {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    std::string call = "cudaGraphInstantiateWithParams (result: ";
    call += instantiate_result_name(params.result_out);
    if (auto type = node_type_of(params.errNode_out)) {
      call += ", at a ";
      call += tensorplay::to_string(*type);
      call += " node";
    }
    call += ")";
    (void)cudaGetLastError();
    throw instantiate_error(status, call, params.result_out, where);
  }
  exec_ = ExecHandle(exec);
}

TENSORPLAY_DECL bool ExecCore::try_update(cudaGraph_t graph, UpdateResult& result, const tensorplay::source_location& where) {
  cudaGraphExecUpdateResultInfo info{};
  std::optional<RelaxedCaptureMode> relaxed;  // as for instantiate
  if (CaptureRegistry::instance().any_open()) relaxed.emplace();
  const cudaError_t status = exec_update(exec_.get(), graph, &info);
  result.reason = info.result;
  result.error_node = node_type_of(info.errorNode);
  if (status == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (status == cudaErrorGraphExecUpdateFailure) return false;
  check(status, "cudaGraphExecUpdate", where);
  return false;
}

TENSORPLAY_DECL void ExecCore::reset() noexcept { exec_.reset(); }

TENSORPLAY_DECL bool Executable::compiled() const noexcept { return static_cast<bool>(exec_); }

TENSORPLAY_DECL bool Executable::holds_graph() const noexcept { return static_cast<bool>(source_); }

TENSORPLAY_DECL cudaGraphExec_t Executable::get() const noexcept { return exec_.get(); }

TENSORPLAY_DECL cudaGraph_t Executable::graph() const noexcept { return latest_ ? latest_.get() : source_.get(); }

TENSORPLAY_DECL std::size_t Executable::bytes(const tensorplay::source_location& where) const {
  return compiled() ? modelled_exec_bytes(source_.get(), &source_bodies_, where) : 0;
}

TENSORPLAY_DECL const ConditionalBodies& Executable::bodies() const noexcept { return latest_ ? latest_bodies_ : source_bodies_; }

TENSORPLAY_DECL void Executable::graph_now_keeps() noexcept { graph_keeps_ = true; }

TENSORPLAY_DECL void Executable::hold(GraphHandle graph, int device, bool keeps, ConditionalBodies bodies) noexcept {
  reset();
  source_ = std::move(graph);
  source_bodies_ = std::move(bodies);
  device_ = device;
  graph_keeps_ = keeps;
}

TENSORPLAY_DECL void Executable::compile(std::optional<cudaStream_t> upload, const tensorplay::source_location& where) {
  rebind_before_compile(where);
  if (latest_) {  // an in-place update's graph (with its staging nodes) becomes the one compiled from
    source_ = std::move(latest_);
    source_bodies_ = std::move(latest_bodies_);
    if (staging_) staging_->node.adopt(staging_->latest_nodes);
  }
  exec_keeps_ = false;
  exec_.instantiate(source_.get(), upload, where);
  exec_keeps_ = graph_keeps_;
  if (staging_) staging_->node.compiled();
}

TENSORPLAY_DECL UpdateResult Executable::update(GraphHandle graph, bool keeps, std::optional<cudaStream_t> upload, const tensorplay::source_location& where,
    ConditionalBodies bodies) {
  // The new capture starts from the pointers its body uses: rebinds of the old one are dropped.
  rebind_.reset();
  remapped_ = false;
  StagingNodeHandles nodes;
  if (staging_) nodes = staging_->node.add_to(graph.get(), device_, where);
  UpdateResult result;
  if (exec_ && exec_.try_update(graph.get(), result, where)) {
    result.outcome = UpdateOutcome::Updated;
    // The executable's nodes are still named by the graph it was compiled from (kept). CUDA
    // carried the nodes' enabled state over and gave them the new graph's parameters: no plan.
    latest_ = std::move(graph);
    latest_bodies_ = std::move(bodies);
    graph_keeps_ = keeps;
    if (staging_) {
      staging_->latest_nodes = nodes;
      staging_->node.updated_in_place(exec_.get(), where);
    }
    return result;
  }
  result.outcome = UpdateOutcome::Reinstantiated;
  exec_.reset();
  latest_.reset();
  latest_bodies_.clear();
  source_ = std::move(graph);
  source_bodies_ = std::move(bodies);
  graph_keeps_ = keeps;
  exec_keeps_ = false;
  if (staging_) staging_->node.adopt(nodes);
  exec_.instantiate(source_.get(), upload, where);
  exec_keeps_ = keeps;
  if (staging_) staging_->node.compiled();
  return result;
}

TENSORPLAY_DECL void Executable::launch(cudaStream_t stream, const tensorplay::source_location& where) {
  if (staging_ && staging_->node.enabled()) [[unlikely]]
    staging_->node.disable(exec_.get(), where);
  check(graph_launch(exec_.get(), stream), "cudaGraphLaunch", where);
}

TENSORPLAY_DECL void Executable::reset() noexcept {
  rebind_.reset();
  remapped_ = false;
  staging_.reset();
  exec_.reset();
  latest_.reset();
  source_.reset();
  source_bodies_.clear();
  latest_bodies_.clear();
  order_ = StaticOrder{};
  device_ = -1;
  graph_keeps_ = false;
  exec_keeps_ = false;
}

TENSORPLAY_DECL auto Executable::prepare_staging(cudaStream_t stream, const tensorplay::source_location& where) -> Staging& {
  if (staging_) return *staging_;
  rebind_before_compile(where);
  auto staging = std::make_unique<Staging>(Staging{StagingNodes(RingGraveyard::instance().take(device_, stream, where)), {}, {}});
  if (latest_) {
    source_ = std::move(latest_);
    source_bodies_ = std::move(latest_bodies_);
  }
  staging->node.adopt(staging->node.add_to(source_.get(), device_, where));
  exec_keeps_ = false;
  exec_.instantiate(source_.get(), std::nullopt, where);
  exec_keeps_ = graph_keeps_;
  staging->node.compiled();
  staging_ = std::move(staging);
  return *staging_;
}

TENSORPLAY_DECL void Executable::rebind_before_compile(const tensorplay::source_location& where) {
  if (!rebind_) return;
  rebind_->index.sync_graph(where);
  rebind_->index.clear();
}

TENSORPLAY_DECL cudaGraph_t Executable::current_graph(const tensorplay::source_location& where) {
  if (rebind_) rebind_->index.sync_graph(where);
  return graph();
}

TENSORPLAY_DECL void Executable::build_rebind_index(const tensorplay::source_location& where) {
  RebindIndex& index = rebind_->index;
  auto skip = [&] { return staging_ ? staging_->node.handles() : StagingNodeHandles{}; };
  if (index.build(source_.get(), source_bodies_, graph(), bodies(), skip(), where)) return;
  // An in-place update's graph that does not pair with the graph exec_ was compiled from, node
  // by node: compile it (what exec_ runs does not change), then it names exec_'s nodes itself.
  compile(std::nullopt, where);
  if (!index.build(source_.get(), source_bodies_, source_.get(), source_bodies_, skip(), where))
    check(cudaErrorInvalidValue, "rebind (a graph that does not pair with itself)", where);
}

TENSORPLAY_DECL std::size_t Executable::prepare_rebind(const RebindRequest& request, const tensorplay::source_location& where) {
  if (!rebind_) rebind_ = std::make_unique<RebindState>();
  if (request.bytes != 0 && !rebind_->index.built()) build_rebind_index(where);
  return rebind_->index.prepare(request);  // an empty range: 0 (no word lies in it)
}

TENSORPLAY_DECL RebindResult Executable::commit_rebind(const tensorplay::source_location& where) {
  RebindState& state = *rebind_;
  const std::size_t nodes = state.index.prepared_nodes();
  state.last_through_graph = false;
  if (nodes == 0) return {0};  // no node uses `from`: the map stays as it is
  state.map_before = state.map;
  if (state.index.commit(exec_.get(), where)) {
    update_from_graph(where);
    state.last_through_graph = true;
  }
  state.map.moved(state.index.pending());
  remapped_ = !state.map.empty();
  return {nodes};
}

TENSORPLAY_DECL void Executable::undo_rebind(const tensorplay::source_location& where) {
  RebindState& state = *rebind_;
  if (state.index.prepared_nodes() == 0) return;
  state.index.revert(exec_.get(), where);
  if (state.last_through_graph) {
    state.index.sync_graph(where);
    UpdateResult ignored;
    const bool updated = exec_.try_update(graph(), ignored, where);
    if (staging_) staging_->node.updated_in_place(exec_.get(), where);
    if (!updated) compile(std::nullopt, where);  // what it accepted before, it refuses now: compile the graph
  }
  state.map = state.map_before;
  remapped_ = !state.map.empty();
}

TENSORPLAY_DECL RebindResult Executable::rebind(const RebindRequest& request, const tensorplay::source_location& where) {
  if (prepare_rebind(request, where) == 0) return {0};
  return commit_rebind(where);
}

TENSORPLAY_DECL void Executable::update_from_graph(const tensorplay::source_location& where) {
  RebindIndex& index = rebind_->index;
  UpdateResult result;
  bool updated = false;
  std::exception_ptr failure;  // a failure that is no refusal: rethrown once the commit is undone
  try {
    index.sync_graph(where);
    updated = exec_.try_update(graph(), result, where);
  } catch (...) {
    failure = std::current_exception();
  }
  // cudaGraphExecUpdate gave the staging nodes the graph's parameters: no plan.
  if (staging_) staging_->node.updated_in_place(exec_.get(), where);
  if (updated) return;
  // Refused: the executable may be partly patched. Back to the old parameters everywhere, then
  // the executable from the graph again (compiled anew if CUDA refuses that too).
  index.revert(exec_.get(), where);
  index.sync_graph(where);
  UpdateResult again;
  const bool restored = exec_.try_update(graph(), again, where);
  if (staging_) staging_->node.updated_in_place(exec_.get(), where);
  if (!restored) compile(std::nullopt, where);
  if (failure) std::rethrow_exception(failure);
  throw_usage(std::string("rebind: CUDA refused to point a node of a conditional body or child graph at `to`, node by node and "
                          "by cudaGraphExecUpdate (") +
              std::string(tensorplay::to_string(result.reason)) + "); nothing was changed");
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
