// Tests for graphs that change: Graph::update, Graph::retain, replay inside another capture,
// instantiation errors, upload and debug_dump flags (tensorplay/graph/graph.hpp, executable.hpp,
// retained.hpp).
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void write_value(int* out, std::size_t n, int value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = value;
}
__global__ void add_into(const int* in, int* out, std::size_t n, int value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = in[i] + value;
}
__global__ void count_down(int* counter, bool* more, int* sum, int step) {
  *sum += step;
  *counter -= 1;
  *more = *counter > 0;
}

constexpr std::size_t n = 4096;

std::vector<int> host(const tp::DeviceTensor<int>& t, tp::StreamRef s) { return tp_test::host_copy(t.data(), t.size(), s); }

bool all(const std::vector<int>& v, int value) {
  for (int x : v)
    if (x != value) return false;
  return true;
}

// A body of two kernels where the graph before had one: x = value, then x += more (a topology
// change).
auto write_then_add(tp::DeviceTensor<int>& x, int value, int more) {
  return [&x, value, more](tp::StreamRef s) {
    write_value<<<8, 256, 0, s>>>(x.data(), n, value);
    tp_test::add(x.data(), n, more, s);
  };
}

// Sets a flag in its destructor (run by tensorplay's reaper thread).
struct Sentinel {
  std::shared_ptr<std::atomic<bool>> destroyed;
  explicit Sentinel(std::shared_ptr<std::atomic<bool>> flag) : destroyed(std::move(flag)) {}
  Sentinel(Sentinel&& other) noexcept = default;
  Sentinel(const Sentinel&) = delete;
  ~Sentinel() {
    if (destroyed) destroyed->store(true);
  }
};

// Waits (bounded) until `flag` is set.
bool eventually(const std::atomic<bool>& flag, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(update)

// ---- update(): parameters only ----------------------------------------------------------------

TP_GPU_TEST(new_pointer_scalar_and_grid_update_in_place) {
  tp::Stream stream;
  tp::DeviceTensor<int> a(n, stream);
  tp::DeviceTensor<int> b(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { write_value<<<1, 32, 0, s>>>(a.data(), n, 1); }, {.stream = stream});
  tp_test::fill(b.data(), n, -1, stream);
  const tp::UpdateResult r =
      graph.update([&](tp::StreamRef s) { write_value<<<64, 256, 0, s>>>(b.data(), n, 2); }, {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated));
  BOOST_TEST((r.reason == cudaGraphExecUpdateSuccess));
  BOOST_TEST(!r.error_node.has_value());
  tp_test::fill(a.data(), n, 0, stream);
  graph.replay(stream);
  BOOST_TEST(all(host(b, stream), 2));
  BOOST_TEST(all(host(a, stream), 0));  // the old pointer is no longer written
}

TP_GPU_TEST(a_topology_change_reinstantiates_and_says_why) {
  tp::Stream stream;
  tp::DeviceTensor<int> a(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(a.data(), n, 1); }, {.stream = stream});
  const tp::UpdateResult r = graph.update(write_then_add(a, 3, 4), {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Reinstantiated));
  BOOST_TEST((r.reason == cudaGraphExecUpdateErrorTopologyChanged));
  graph.replay(stream);
  BOOST_TEST(all(host(a, stream), 7));
}

TP_GPU_TEST(a_node_type_change_names_the_refused_node) {
  tp::Stream stream;
  tp::DeviceTensor<int> a(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(a.data(), n, 1); }, {.stream = stream});
  const tp::UpdateResult r = graph.update(
      [&](tp::StreamRef s) { BOOST_REQUIRE_EQUAL(cudaMemsetAsync(a.data(), 0, a.bytes(), s), cudaSuccess); },
      {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Reinstantiated));
  BOOST_TEST((r.reason != cudaGraphExecUpdateSuccess));
  BOOST_REQUIRE(r.error_node.has_value());
  BOOST_TEST((*r.error_node == cudaGraphNodeTypeMemset || *r.error_node == cudaGraphNodeTypeKernel));
  tp_test::fill(a.data(), n, 9, stream);
  graph.replay(stream);
  BOOST_TEST(all(host(a, stream), 0));
}

TP_GPU_TEST(new_contents_of_an_if_body_are_updated) {
  tp::Stream stream;
  tp::DeviceTensor<bool> yes(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(yes.data(), 1, 1, stream), cudaSuccess);
  tp::DeviceTensor<int> a(n, stream);
  tp::DeviceTensor<int> b(n, stream);
  tp_test::fill(a.data(), n, 0, stream);
  tp_test::fill(b.data(), n, 0, stream);
  tp::Graph graph;
  auto body = [&](int* out, int value) {
    return [&, out, value](tp::StreamRef s) {
      graph.if_(yes, [&](tp::StreamRef in) { write_value<<<8, 256, 0, in>>>(out, n, value); });
      (void)s;
    };
  };
  graph.capture(body(a.data(), 1), {.stream = stream});
  const tp::UpdateResult r = graph.update(body(b.data(), 5), {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated), "reason " << tp::to_string(r.reason));
  graph.replay(stream);
  BOOST_TEST(all(host(b, stream), 5));
  BOOST_TEST(all(host(a, stream), 0));
}

TP_GPU_TEST(new_contents_of_a_while_body_are_updated) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<int> sum(1, stream);
  tp::Graph graph;
  auto loop = [&](int step) {
    return [&, step](tp::StreamRef s) {
      tp_test::fill(counter.data(), 1, 4, s);
      tp_test::fill(sum.data(), 1, 0, s);
      BOOST_REQUIRE_EQUAL(cudaMemsetAsync(more.data(), 1, 1, s), cudaSuccess);
      graph.while_(more, [&](tp::StreamRef in) { count_down<<<1, 1, 0, in>>>(counter.data(), more.data(), sum.data(), step); });
    };
  };
  graph.capture(loop(1), {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(host(sum, stream)[0] == 4);
  const tp::UpdateResult r = graph.update(loop(10), {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated), "reason " << tp::to_string(r.reason));
  graph.replay(stream);
  BOOST_TEST(host(sum, stream)[0] == 40);
}

TP_GPU_TEST(stage_and_launch_after_update_stages_the_new_static_buffers) {
  tp::Stream stream;
  tp::DeviceTensor<int> x1(n, stream);
  tp::DeviceTensor<int> x2(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> fresh(n, stream);
  tp::Graph graph;
  auto reads = [&](tp::DeviceTensor<int>& x) {
    return [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, 100); };
  };
  graph.capture(reads(x1), {.stream = stream});
  tp_test::fill(fresh.data(), n, 1, stream);
  graph.stage_and_launch(std::tie(x1), std::tie(fresh), stream);  // staged before the update
  BOOST_TEST(all(host(y, stream), 101));
  const tp::UpdateResult r = graph.update(reads(x2), {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated), "reason " << tp::to_string(r.reason));
  for (int round = 2; round < 5; ++round) {
    tp_test::fill(fresh.data(), n, round, stream);
    graph.stage_and_launch(std::tie(x2), std::tie(fresh), stream);
    BOOST_TEST(all(host(y, stream), 100 + round));
  }
  graph.replay(stream);  // a plain replay does not copy again
  tp_test::fill(x2.data(), n, 50, stream);
  graph.replay(stream);
  BOOST_TEST(all(host(y, stream), 150));
}

TP_GPU_TEST(a_tensor_from_the_old_capture_stays_valid_and_unaliased) {
  tp::Stream stream;
  tp::DeviceTensor<int> kept;
  tp::DeviceTensor<int> kept_new;
  tp::Graph graph;
  graph.capture(
      [&](tp::StreamRef s) {
        kept = tp::DeviceTensor<int>(n, s);
        write_value<<<8, 256, 0, s>>>(kept.data(), n, 7);
      },
      {.stream = stream});
  graph.replay(stream);
  graph.update(
      [&](tp::StreamRef s) {
        kept_new = tp::DeviceTensor<int>(n, s);
        write_value<<<8, 256, 0, s>>>(kept_new.data(), n, 8);
      },
      {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all(host(kept, stream), 7));
  BOOST_TEST(all(host(kept_new, stream), 8));
  BOOST_TEST(kept.data() != kept_new.data());
  BOOST_TEST(kept.pool() == kept_new.pool());
}

TP_GPU_TEST(update_before_any_capture_and_during_a_capture_throws_usage_error) {
  tp::Stream stream;
  tp::DeviceTensor<int> a(n, stream);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.update([] {}), tp::usage_error);
  graph.capture_begin({.stream = stream});
  write_value<<<1, 32, 0, stream>>>(a.data(), n, 3);
  BOOST_CHECK_THROW(graph.update([] {}), tp::usage_error);
  BOOST_TEST(graph.is_capturing());
  graph.capture_end();
  graph.replay(stream);
  BOOST_TEST(all(host(a, stream), 3));
}

TP_GPU_TEST(a_throwing_update_keeps_the_old_work) {
  tp::Stream stream;
  tp::DeviceTensor<int> a(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(a.data(), n, 11); }, {.stream = stream});
  BOOST_CHECK_THROW(graph.update(
                        [&](tp::StreamRef s) {
                          write_value<<<8, 256, 0, s>>>(a.data(), n, 12);
                          throw std::runtime_error("body failed");
                        },
                        {.stream = stream}),
                    std::runtime_error);
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(tp_test::not_capturing(stream));
  tp_test::fill(a.data(), n, 0, stream);
  graph.replay(stream);
  BOOST_TEST(all(host(a, stream), 11));
  // An update CUDA invalidates keeps the old work too.
  BOOST_CHECK_THROW(graph.update([&](tp::StreamRef s) { (void)cudaStreamSynchronize(s); }, {.stream = stream}),
                    tp::cuda_error);
  BOOST_TEST(tp_test::not_capturing(stream));
  tp_test::fill(a.data(), n, 0, stream);
  graph.replay(stream);
  BOOST_TEST(all(host(a, stream), 11));
}

// ---- retain() ---------------------------------------------------------------------------------


namespace {

// `prepare(graph, destroyed)` captures a 300 ms spin into `graph` and retains a Sentinel at some
// point; then the graph is replayed and destroyed with the replay in flight. The Sentinel must not
// be destroyed before the replay completes.
template <class Prepare>
void retained_object_outlives_the_replay(Prepare&& prepare) {
  tp::Stream stream;
  auto destroyed = std::make_shared<std::atomic<bool>>(false);
  {
    tp::Graph graph;
    prepare(graph, stream, destroyed);
    graph.replay(stream);
    // Under compute-sanitizer a launch may complete before the host goes on: the case then checks
    // only that the object is not destroyed before its launch completed.
    const bool in_flight = cudaStreamQuery(stream) == cudaErrorNotReady;
    (void)cudaGetLastError();
    const auto before = std::chrono::steady_clock::now();
    {
      tp::Graph moved = std::move(graph);
    }  // ~Graph with the 300 ms replay in flight
    const auto took = std::chrono::steady_clock::now() - before;
    if (in_flight)
      BOOST_TEST(std::chrono::duration_cast<std::chrono::milliseconds>(took).count() < 150, "~Graph must not wait for replays");
    // Time for a release that came too early to reach the destructor (it runs on tensorplay's
    // reaper thread), while the 300 ms launch still runs.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const bool gone = destroyed->load();
    const bool done = cudaStreamQuery(stream) == cudaSuccess;  // read after `gone`
    (void)cudaGetLastError();
    BOOST_TEST((!gone || done), "destroyed while its launch still ran");
    if (in_flight && !done) BOOST_TEST(!gone);
  }
  stream.synchronize();
  BOOST_TEST(eventually(*destroyed));
}

void spin(tp::StreamRef s) { tp_test::spin_kernel<<<1, 1, 0, s>>>(300'000'000); }

}  // namespace

// Retained after capture_end: the executable exists already (CUDA gives it no reference later).
BOOST_AUTO_TEST_CASE(a_retained_object_outlives_replays_still_running_after_the_graph_dies,
                     *boost::unit_test::precondition(tp_test::AsyncLaunches{})) {
  retained_object_outlives_the_replay([](tp::Graph& graph, tp::Stream& stream, auto destroyed) {
    graph.capture([&](tp::StreamRef s) { spin(s); }, {.stream = stream});
    graph.retain(Sentinel(destroyed));
  });
}

// Retained inside the capture body, after an in-place update, inside an update's body, and after
// stage_and_launch made the staged executable.
BOOST_AUTO_TEST_CASE(objects_retained_at_every_point_outlive_replays_still_running,
                     *boost::unit_test::precondition(tp_test::AsyncLaunches{})) {
  retained_object_outlives_the_replay([](tp::Graph& graph, tp::Stream& stream, auto destroyed) {
    graph.capture([&](tp::StreamRef s) { spin(s); graph.retain(Sentinel(destroyed)); }, {.stream = stream});
  });
  retained_object_outlives_the_replay([](tp::Graph& graph, tp::Stream& stream, auto destroyed) {
    graph.capture([&](tp::StreamRef s) { spin(s); }, {.stream = stream});
    BOOST_TEST((graph.update([&](tp::StreamRef s) { spin(s); }, {.stream = stream}).outcome == tp::UpdateOutcome::Updated));
    graph.retain(Sentinel(destroyed));
  });
  retained_object_outlives_the_replay([](tp::Graph& graph, tp::Stream& stream, auto destroyed) {
    graph.capture([&](tp::StreamRef s) { spin(s); }, {.stream = stream});
    (void)graph.update([&](tp::StreamRef s) { spin(s); graph.retain(Sentinel(destroyed)); }, {.stream = stream});
  });
  tp::Stream owner;
  tp::DeviceTensor<int> in(4, owner);  // outlive the graph of the next case
  tp::DeviceTensor<int> fresh(4, owner);
  owner.synchronize();
  retained_object_outlives_the_replay([&](tp::Graph& graph, tp::Stream& stream, auto destroyed) {
    graph.capture([&](tp::StreamRef s) { tp_test::add(in.data(), 4, 1, s); spin(s); }, {.stream = stream});
    graph.stage_and_launch(std::tie(in), std::tie(fresh), stream);
    stream.synchronize();
    graph.retain(Sentinel(destroyed));
  });
}

TP_GPU_TEST(retain_takes_shared_pointers_and_move_only_objects_and_reset_releases_them) {
  tp::Stream stream;
  auto shared_gone = std::make_shared<std::atomic<bool>>(false);
  auto unique_gone = std::make_shared<std::atomic<bool>>(false);
  tp::Graph graph;
  auto shared = std::make_shared<Sentinel>(shared_gone);
  graph.retain(shared);  // before any capture
  graph.capture([&](tp::StreamRef s) { tp_test::spin_kernel<<<1, 1, 0, s>>>(1000); }, {.stream = stream});
  graph.retain(std::make_unique<Sentinel>(unique_gone));
  shared.reset();
  graph.replay(stream);
  stream.synchronize();
  BOOST_TEST(!shared_gone->load());
  BOOST_TEST(!unique_gone->load());
  graph.reset();
  BOOST_TEST(eventually(*shared_gone));
  BOOST_TEST(eventually(*unique_gone));
}

TP_GPU_TEST(update_keeps_retained_objects) {
  tp::Stream stream;
  auto gone = std::make_shared<std::atomic<bool>>(false);
  tp::DeviceTensor<int> a(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(a.data(), n, 1); }, {.stream = stream});
  graph.retain(Sentinel(gone));
  graph.update([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(a.data(), n, 2); }, {.stream = stream});
  graph.update([&](tp::StreamRef s) {  // a new topology: a new executable
    write_value<<<8, 256, 0, s>>>(a.data(), n, 3);
    tp_test::add(a.data(), n, 1, s);
  }, {.stream = stream});
  graph.replay(stream);
  stream.synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_TEST(!gone->load());
  BOOST_TEST(all(host(a, stream), 4));
  graph.reset();
  BOOST_TEST(eventually(*gone));
}

// ---- replay inside another capture -------------------------------------------------------------

TP_GPU_TEST(an_outer_capture_replaying_two_inner_graphs_matches_direct_replays_and_survives_them) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  auto inner_a = std::make_unique<tp::Graph>();
  auto inner_b = std::make_unique<tp::Graph>();
  tp::DeviceTensor<int> scratch;  // memory of inner_a's pool, used by inner_a
  inner_a->capture(
      [&](tp::StreamRef s) {
        tp::DeviceTensor<int> tmp(n, s);
        add_into<<<8, 256, 0, s>>>(x.data(), tmp.data(), n, 1);
        add_into<<<8, 256, 0, s>>>(tmp.data(), x.data(), n, 0);
      },
      {.stream = stream});
  inner_b->capture([&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), x.data(), n, 10); }, {.stream = stream});
  // Directly: x = 0 -> a -> b -> a = 12
  tp_test::fill(x.data(), n, 0, stream);
  inner_a->replay(stream);
  inner_b->replay(stream);
  inner_a->replay(stream);
  const std::vector<int> direct = host(x, stream);
  tp::Graph outer;
  outer.capture(
      [&](tp::StreamRef s) {
        inner_a->replay(s);
        inner_b->replay(s);
        inner_a->replay(s);
      },
      {.stream = stream});
  BOOST_TEST(outer.node_count() == 3u);
  tp_test::fill(x.data(), n, 0, stream);
  outer.replay(stream);
  BOOST_TEST(host(x, stream) == direct);
  const long pool_users = inner_a->pool().use_count();
  inner_a.reset();
  inner_b.reset();
  // The outer graph kept inner_a's pool: its temporary memory is not handed out again.
  tp_test::fill(x.data(), n, 0, stream);
  outer.replay(stream);
  BOOST_TEST(all(host(x, stream), 12));
  BOOST_TEST(pool_users >= 2);
}

TP_GPU_TEST(a_raw_cuda_capture_can_replay_a_graph) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::Graph inner;
  inner.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 21); }, {.stream = stream});
  tp_test::fill(x.data(), n, 0, stream);
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  inner.replay(stream);
  cudaGraph_t raw = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamEndCapture(stream, &raw), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphInstantiate(&exec, raw, 0), cudaSuccess);
  BOOST_TEST(all(host(x, stream), 0));  // nothing ran during the capture
  BOOST_REQUIRE_EQUAL(cudaGraphLaunch(exec, stream), cudaSuccess);
  BOOST_TEST(all(host(x, stream), 21));
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(raw);
}

TP_GPU_TEST(a_graph_with_conditional_nodes_refuses_to_be_replayed_inside_a_capture) {
  tp::Stream stream;
  tp::DeviceTensor<bool> yes(1, stream);
  tp::DeviceTensor<int> x(n, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(yes.data(), 1, 1, stream), cudaSuccess);
  tp::Graph inner;
  inner.capture([&] { inner.if_(yes, [&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 1); }); },
                {.stream = stream});
  tp::Graph outer;
  outer.capture_begin({.stream = stream});
  write_value<<<8, 256, 0, stream>>>(x.data(), n, 2);
  try {
    inner.replay(stream);
    BOOST_ERROR("expected usage_error");
  } catch (const tp::usage_error& e) {
    BOOST_TEST(std::string(e.what()).find("conditional") != std::string::npos);
  }
  BOOST_REQUIRE_NO_THROW(outer.capture_end());  // the outer capture is intact
  outer.replay(stream);
  BOOST_TEST(all(host(x, stream), 2));
}

// ---- instantiation, upload, dumps ---------------------------------------------------------------

TP_GPU_TEST(an_instantiation_failure_names_cudas_result) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  // A conditional handle no node uses: CUDA refuses to instantiate the graph.
  cudaStreamCaptureStatus status{};
  cudaGraph_t capturing = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamGetCaptureInfo(stream, &status, nullptr, &capturing, nullptr, nullptr, nullptr), cudaSuccess);
  cudaGraphConditionalHandle unused{};
  BOOST_REQUIRE_EQUAL(cudaGraphConditionalHandleCreate(&unused, capturing, 0, 0), cudaSuccess);
  tp_test::spin_kernel<<<1, 1, 0, stream>>>(10);
  try {
    graph.capture_end();
    BOOST_ERROR("expected cuda_error");
  } catch (const tp::cuda_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("cudaGraphInstantiateWithParams") != std::string::npos, what);
    BOOST_TEST(what.find("result:") != std::string::npos, what);
  }
  BOOST_TEST(!graph.is_instantiated());
  BOOST_CHECK_THROW(graph.replay(stream), tp::usage_error);
  graph.reset();
  tp::DeviceTensor<int> x(n, stream);
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 5); }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all(host(x, stream), 5));
}

TP_GPU_TEST(an_uploaded_graph_replays_correctly_from_the_first_launch) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::Graph graph({.upload = true});
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 6); }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all(host(x, stream), 6));
}

TP_GPU_TEST(an_uploaded_graph_updated_in_place_and_recompiled_replays_each_version) {
  // GraphOptions::upload also uploads what update() compiles anew; an in-place update of an
  // uploaded executable must still take effect at the next launch.
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::Graph graph({.upload = true});
  graph.capture([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 1); }, {.stream = stream});
  BOOST_TEST((graph.update([&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 2); }, {.stream = stream}).outcome ==
              tp::UpdateOutcome::Updated));
  graph.replay(stream);
  BOOST_TEST(all(host(x, stream), 2));
  const tp::UpdateResult r = graph.update(write_then_add(x, 3, 5), {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Reinstantiated));
  graph.replay(stream);
  BOOST_TEST(all(host(x, stream), 8));
}

TP_GPU_TEST(debug_dump_flags_choose_what_the_dot_file_holds) {
  tp::Stream stream;
  tp::DeviceTensor<bool> yes(1, stream);
  tp::DeviceTensor<int> x(n, stream);
  tp::Graph graph;
  graph.capture([&] { graph.if_(yes, [&](tp::StreamRef s) { write_value<<<8, 256, 0, s>>>(x.data(), n, 1); }); },
                {.stream = stream});
  const auto plain = tp_test::temp_path("plain.dot");
  const auto verbose = tp_test::temp_path("verbose.dot");
  const auto handles = tp_test::temp_path("handles.dot");
  graph.debug_dump(plain, tp::DotFlags::Default);
  graph.debug_dump(verbose, tp::DotFlags::Verbose);
  graph.debug_dump(handles, tp::DotFlags::Handles | tp::DotFlags::ConditionalParams);
  const std::string p = tp_test::read_file(plain);
  const std::string v = tp_test::read_file(verbose);
  const std::string h = tp_test::read_file(handles);
  BOOST_TEST(p.rfind("digraph", 0) == 0u);
  BOOST_TEST(v.size() > p.size());
  BOOST_TEST(h.size() > p.size());
  BOOST_TEST(h != p);
  std::filesystem::remove(plain);
  std::filesystem::remove(verbose);
  std::filesystem::remove(handles);
}

BOOST_AUTO_TEST_CASE(dot_flags_combine_and_map_to_cuda_flags) {
  constexpr tp::DotFlags both = tp::DotFlags::KernelParams | tp::DotFlags::ConditionalParams;
  static_assert(tp::detail::to_cuda(both) == (cudaGraphDebugDotFlagsKernelNodeParams | cudaGraphDebugDotFlagsConditionalNodeParams));
  static_assert(tp::detail::to_cuda(tp::DotFlags::Default) == 0u);
  BOOST_TEST(tp::has_flag(both, tp::DotFlags::KernelParams));
  BOOST_TEST(!tp::has_flag(both, tp::DotFlags::Verbose));
}

BOOST_AUTO_TEST_SUITE_END()
