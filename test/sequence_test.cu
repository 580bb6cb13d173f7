// Graphs that change, in the sequences an independent run found broken (issue 27), and every
// pair of {update, stage_and_launch, retain, nested replay, conditionals, shared pools, buckets,
// threads}. Each case checks every output against what eager work would give.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 4096;

__global__ void add_into(const int* in, int* out, std::size_t count, int value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = in[i] + value;
}
__global__ void add_one(int* x) { *x += 1; }
__global__ void count_down(int* counter, bool* more) {
  *counter -= 1;
  *more = *counter > 0;
}
__global__ void set_flag(bool* flag, bool value) { *flag = value; }

std::vector<int> host(const tp::DeviceTensor<int>& t, tp::StreamRef s) { return tp_test::host_copy(t.data(), t.size(), s); }

// A host copy for threads other than Boost.Test's (whose assertions are not thread-safe).
std::vector<int> host_in_thread(const tp::DeviceTensor<int>& t, tp::StreamRef s) {
  std::vector<int> out(t.size());
  if (cudaMemcpyAsync(out.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    throw std::runtime_error("host copy failed: " + std::string(cudaGetErrorString(cudaGetLastError())));
  return out;
}
bool all(const std::vector<int>& v, int value) {
  for (int x : v)
    if (x != value) return false;
  return true;
}

// Runs body(t, error) on `count` threads at once, each writing what went wrong into its own
// `error` (an exception's message is appended to it), and checks, once all are joined, that
// every error is empty. Boost.Test's assertions are used on this thread only.
template <class F>
void check_on_threads(int count, F body) {
  std::vector<std::string> errors(static_cast<std::size_t>(count));
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t)
    threads.emplace_back([&, t] {
      std::string& error = errors[static_cast<std::size_t>(t)];
      try {
        body(t, error);
      } catch (const std::exception& e) {
        error += e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < count; ++t) BOOST_TEST(errors[static_cast<std::size_t>(t)] == "", "thread " << t << ": " << errors[static_cast<std::size_t>(t)]);
}

// y = x + value through a temporary of the graph's pool (a body that allocates).
auto through_temporary(tp::DeviceTensor<int>& x, tp::DeviceTensor<int>& y, int value) {
  return [&x, &y, value](tp::StreamRef s) {
    tp::DeviceTensor<int> t(n, s);
    add_into<<<8, 256, 0, s>>>(x.data(), t.data(), n, value);
    add_into<<<8, 256, 0, s>>>(t.data(), y.data(), n, 0);
  };
}
auto plain(tp::DeviceTensor<int>& x, tp::DeviceTensor<int>& y, int value) {
  return [&x, &y, value](tp::StreamRef s) {
    add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, value);
    add_into<<<8, 256, 0, s>>>(y.data(), y.data(), n, 0);
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(defects_of_issue_27)

// 1. A capture that allocated nothing, then an update whose body allocates a temporary: the
// temporary's pool must become the graph's, or its memory is freed under the executable.
TP_GPU_TEST(an_update_that_allocates_after_a_capture_that_did_not_keeps_its_pool) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp_test::fill(x.data(), n, 5, stream);
  tp::Graph graph;
  graph.capture(plain(x, y, 1), {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all(host(y, stream), 6));
  for (int value = 2; value < 5; ++value) {
    graph.update(through_temporary(x, y, value), {.stream = stream});
    BOOST_TEST(graph.pool().reserved_bytes() >= n * sizeof(int));
    // Churn the default pool and CUDA's allocator: freed graph memory would be handed out here.
    std::vector<tp::DeviceTensor<int>> others;
    for (int i = 0; i < 4; ++i) others.emplace_back(n, stream);
    for (auto& o : others) tp_test::fill(o.data(), n, -7, stream);
    graph.replay(stream);
    BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
    BOOST_TEST(all(host(y, stream), 5 + value));
    for (auto& o : others) BOOST_TEST(all(host(o, stream), -7));
  }
}

// 2. The same seen from outside: a tensor made inside such an update lives in the graph's pool.
TP_GPU_TEST(a_tensor_kept_from_an_update_body_lives_in_the_graphs_pool) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp_test::fill(x.data(), n, 1, stream);
  tp::Graph graph;
  graph.capture(plain(x, y, 1), {.stream = stream});
  std::optional<tp::DeviceTensor<int>> kept;
  graph.update(
      [&](tp::StreamRef s) {
        kept.emplace(n, s);
        add_into<<<8, 256, 0, s>>>(x.data(), kept->data(), n, 10);
        add_into<<<8, 256, 0, s>>>(kept->data(), y.data(), n, 0);
      },
      {.stream = stream});
  const tp::Pool pool = graph.pool();
  BOOST_TEST(pool.allocated_bytes() >= n * sizeof(int));
  BOOST_TEST((graph.pool().id() == pool.id()));
  graph.replay(stream);
  BOOST_TEST(all(host(*kept, stream), 11));
  BOOST_TEST(all(host(y, stream), 11));
  kept.reset();  // its block goes back to the graph's pool, which the graph keeps
  BOOST_TEST(pool.allocated_bytes() == 0u);
  tp_test::fill(x.data(), n, 3, stream);
  graph.replay(stream);
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(all(host(y, stream), 13));
}

// 3. stage_and_launch, a plain replay, an update applied in place, stage_and_launch again: the
// new input must reach the static buffer every time. Returns what went wrong ("" when nothing),
// so that threads other than Boost.Test's can run it.
std::string stage_replay_update_stage(bool with_conditional, tp::StreamRef stream, tp::CaptureErrorMode mode) {
  tp::DeviceTensor<int> in(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> fresh(n, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  set_flag<<<1, 1, 0, stream>>>(yes.data(), true);
  auto body = [&](int value) {
    return [&, value](tp::Graph& g, tp::StreamRef s) {
      if (with_conditional)
        g.if_(yes, [&](tp::StreamRef b) { add_into<<<8, 256, 0, b>>>(in.data(), y.data(), n, value); });
      else
        add_into<<<8, 256, 0, s>>>(in.data(), y.data(), n, value);
    };
  };
  tp::Graph graph(tp::GraphOptions{.capture_error_mode = mode});
  graph.capture([&](tp::StreamRef s) { body(100)(graph, s); }, {.stream = stream});
  int offset = 100;
  for (int round = 1; round <= 6; ++round) {
    tp_test::fill(fresh.data(), n, round, stream);
    graph.stage_and_launch(std::tie(in), std::tie(fresh), stream);
    const std::string at = " after round " + std::to_string(round);
    if (!all(host_in_thread(in, stream), round)) return "the static buffer missed the input" + at;
    if (!all(host_in_thread(y, stream), round + offset)) return "the output is not the staged input's" + at;
    if (round % 2 == 0) {
      graph.replay(stream);  // a plain replay between: the nodes are disabled
      if (!all(host_in_thread(y, stream), round + offset)) return "a plain replay changed the output" + at;
    }
    offset = 100 * (round + 1);
    const tp::UpdateResult r = graph.update([&](tp::StreamRef s) { body(offset)(graph, s); }, {.stream = stream});
    if (r.outcome != tp::UpdateOutcome::Updated) return "the update was not applied in place" + at;
  }
  return "";
}

TP_GPU_TEST(staging_after_an_in_place_update_copies_the_new_input) {
  tp::Stream stream;
  BOOST_TEST(stage_replay_update_stage(false, stream, tp::CaptureErrorMode::Global) == "");
}
TP_GPU_TEST(staging_after_an_in_place_update_copies_the_new_input_with_conditionals) {
  tp::Stream stream;
  BOOST_TEST(stage_replay_update_stage(true, stream, tp::CaptureErrorMode::Global) == "");
}

// Eight threads at once, each with its own graph (thread-local captures: a global one would be
// invalidated by the other threads' allocations and copies, as CUDA means it to).
TP_GPU_TEST(staging_after_in_place_updates_on_eight_threads) {
  check_on_threads(8, [](int t, std::string& error) {
    tp::Stream stream;
    error = stage_replay_update_stage(t % 2 == 1, stream, tp::CaptureErrorMode::ThreadLocal);
  });
}

// 4. A Graph without conditional nodes replayed inside a while_ body, then destroyed: the outer
// graph keeps the inner's pool (and its temporary).
TP_GPU_TEST(a_graph_replayed_inside_a_body_works_and_outlives_the_inner_graph) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<int> ones(1, stream);
  tp::Graph outer;
  tp::Pool inner_pool;
  {
    tp::Graph inner;
    inner.capture(through_temporary(x, y, 1), {.stream = stream});  // y = x + 1, through a temporary
    inner_pool = inner.pool();
    outer.capture(
        [&](tp::StreamRef s) {
          outer.while_(more, [&](tp::StreamRef b) {
            inner.replay(b);
            add_into<<<8, 256, 0, b>>>(y.data(), x.data(), n, 0);  // x = y
            count_down<<<1, 1, 0, b>>>(counter.data(), more.data());
          });
        },
        {.stream = stream});
  }
  BOOST_TEST(inner_pool.reserved_bytes() >= n * sizeof(int));
  inner_pool = tp::Pool();  // only the outer graph holds it now
  for (int round = 0; round < 3; ++round) {
    std::vector<tp::DeviceTensor<int>> others;  // memory that a dead pool's segments could become
    for (int i = 0; i < 4; ++i) others.emplace_back(n, stream);
    for (auto& o : others) tp_test::fill(o.data(), n, -3, stream);
    tp_test::fill(x.data(), n, 0, stream);
    tp_test::fill(counter.data(), 1, 5, stream);
    set_flag<<<1, 1, 0, stream>>>(more.data(), true);
    outer.replay(stream);
    BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
    BOOST_TEST(all(host(x, stream), 5));
    for (auto& o : others) BOOST_TEST(all(host(o, stream), -3));
  }
}

TP_GPU_TEST(a_graph_replayed_inside_an_if_body_runs_when_the_predicate_holds) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(1, stream);
  tp::DeviceTensor<bool> flag(1, stream);
  tp::Graph inner;
  inner.capture([&](tp::StreamRef s) { add_one<<<1, 1, 0, s>>>(x.data()); }, {.stream = stream});
  tp::Graph outer;
  outer.capture([&](tp::StreamRef) { outer.if_(flag, [&](tp::StreamRef b) { inner.replay(b); }); }, {.stream = stream});
  tp_test::fill(x.data(), 1, 0, stream);
  set_flag<<<1, 1, 0, stream>>>(flag.data(), true);
  outer.replay(stream);
  set_flag<<<1, 1, 0, stream>>>(flag.data(), false);
  outer.replay(stream);
  BOOST_TEST(host(x, stream)[0] == 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pairs)

TP_GPU_TEST(capture_end_later_compiles_at_instantiate) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(1, stream);
  tp_test::fill(x.data(), 1, 0, stream);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  add_one<<<1, 1, 0, stream>>>(x.data());
  graph.capture_end(tp::Instantiate::Later);
  BOOST_TEST(!graph.is_instantiated());
  BOOST_CHECK_THROW(graph.replay(stream), tp::usage_error);
  graph.instantiate();
  BOOST_TEST(graph.is_instantiated());
  graph.replay(stream);
  graph.replay(stream);
  BOOST_TEST(host(x, stream)[0] == 2);
}

// update x retain: an object retained by an update's body, and after the update, lives until the
// graph dies and its last replay completed; no recompile is needed for either.
TP_GPU_TEST(update_and_retain) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(2);
  std::weak_ptr<int> w1 = first, w2 = second;
  {
    tp::Graph graph;
    graph.capture(plain(x, y, 1), {.stream = stream});
    graph.update(
        [&](tp::StreamRef s) {
          graph.retain(std::move(first));
          plain(x, y, 2)(s);
        },
        {.stream = stream});
    graph.retain(std::move(second));
    tp_test::fill(x.data(), n, 1, stream);
    graph.replay(stream);
    BOOST_TEST(all(host(y, stream), 3));
    BOOST_TEST(!w1.expired());
    BOOST_TEST(!w2.expired());
  }
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  for (int i = 0; i < 200 && (!w1.expired() || !w2.expired()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  BOOST_TEST(w1.expired());
  BOOST_TEST(w2.expired());
}

// update x nested replay: the inner graph updated after the outer captured it: the outer keeps
// the version it captured.
TP_GPU_TEST(update_and_nested_replay) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::Graph inner;
  inner.capture(through_temporary(x, y, 1), {.stream = stream});
  tp::Graph outer;
  outer.capture([&](tp::StreamRef s) { inner.replay(s); }, {.stream = stream});
  inner.update(through_temporary(x, y, 2), {.stream = stream});
  tp_test::fill(x.data(), n, 10, stream);
  outer.replay(stream);
  BOOST_TEST(all(host(y, stream), 11));
  inner.replay(stream);
  BOOST_TEST(all(host(y, stream), 12));
  inner.reset();
  outer.replay(stream);
  BOOST_TEST(all(host(y, stream), 11));
}

// update x shared pool: two graphs of one pool, one updated with a body that allocates.
TP_GPU_TEST(update_and_shared_pools) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> z(n, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  tp::Graph a(tp::GraphOptions{.pool = pool});
  tp::Graph b(tp::GraphOptions{.pool = pool});
  a.capture(plain(x, y, 1), {.stream = stream});
  b.capture(through_temporary(x, z, 2), {.stream = stream});
  a.update(through_temporary(x, y, 3), {.stream = stream});
  BOOST_TEST((a.pool().id() == pool.id()));
  tp_test::fill(x.data(), n, 0, stream);
  a.replay(stream);
  b.replay(stream);
  BOOST_TEST(all(host(y, stream), 3));
  BOOST_TEST(all(host(z, stream), 2));
}

// update x conditionals x staging, with a topology change (compiled anew) then in place.
TP_GPU_TEST(update_conditionals_and_staging_with_a_topology_change) {
  tp::Stream stream;
  tp::DeviceTensor<int> in(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> fresh(n, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  set_flag<<<1, 1, 0, stream>>>(yes.data(), true);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) { graph.if_(yes, [&](tp::StreamRef b) { add_into<<<8, 256, 0, b>>>(in.data(), y.data(), n, 1); }); },
                {.stream = stream});
  tp_test::fill(fresh.data(), n, 7, stream);
  graph.stage_and_launch(std::tie(in), std::tie(fresh), stream);
  BOOST_TEST(all(host(y, stream), 8));
  auto two_kernels = [&](tp::StreamRef s) {
    graph.if_(yes, [&](tp::StreamRef b) { add_into<<<8, 256, 0, b>>>(in.data(), y.data(), n, 2); });
    add_into<<<8, 256, 0, s>>>(y.data(), y.data(), n, 1);
  };
  tp::UpdateResult r = graph.update(two_kernels, {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Reinstantiated));
  tp_test::fill(fresh.data(), n, 20, stream);
  graph.stage_and_launch(std::tie(in), std::tie(fresh), stream);
  BOOST_TEST(all(host(y, stream), 23));
  r = graph.update(two_kernels, {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated));
  tp_test::fill(fresh.data(), n, 30, stream);
  graph.stage_and_launch(std::tie(in), std::tie(fresh), stream);
  BOOST_TEST(all(host(y, stream), 33));
}

// stage_and_launch x retain x nested replay: a staged graph replayed into another capture runs
// its work without copying; the outer keeps what it retained.
TP_GPU_TEST(staging_retain_and_nested_replay) {
  tp::Stream stream;
  tp::DeviceTensor<int> in(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> fresh(n, stream);
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> weak = token;
  tp::Graph outer;
  {
    tp::Graph inner;
    inner.capture([&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(in.data(), y.data(), n, 1); }, {.stream = stream});
    tp_test::fill(fresh.data(), n, 4, stream);
    inner.stage_and_launch(std::tie(in), std::tie(fresh), stream);
    BOOST_TEST(all(host(y, stream), 5));
    inner.retain(std::move(token));
    outer.capture([&](tp::StreamRef s) { inner.replay(s); }, {.stream = stream});
  }
  BOOST_TEST(!weak.expired());
  tp_test::fill(in.data(), n, 9, stream);
  outer.replay(stream);
  BOOST_TEST(all(host(y, stream), 10));
}

// buckets x staging x update-like sharing: shared executables with staged runs and zero fill.
TP_GPU_TEST(shared_bucket_executables_and_staging) {
  tp::Stream stream;
  tp::DeviceTensor<int> in(512, stream);
  tp::DeviceTensor<int> out(512, stream);
  tp::GraphBuckets buckets(
      {64, 128, 256, 512},
      [&](tp::StreamRef s, std::size_t size) {
        tp::DeviceTensor<int> t(size, s);
        add_into<<<4, 128, 0, s>>>(in.data(), t.data(), size, 1);
        add_into<<<4, 128, 0, s>>>(t.data(), out.data(), size, 0);
      },
      tp::BucketOptions{.share_executables = true, .zero_fill_tail = true});
  for (std::size_t batch : {100, 30, 512, 200, 64}) {
    tp::DeviceTensor<int> fresh(batch, stream);  // one element per sample
    tp_test::fill(fresh.data(), batch, static_cast<int>(batch), stream);
    const std::size_t ran = buckets.run(batch, std::tie(in), std::tie(fresh), stream);
    const std::vector<int> h = host(out, stream);
    for (std::size_t i = 0; i < ran; ++i) {
      const int want = i < batch ? static_cast<int>(batch) + 1 : 1;
      if (h[i] != want) {
        BOOST_TEST(h[i] == want, "batch " << batch << " element " << i);
        break;
      }
    }
  }
}

// threads x update x nested replay: each thread its own graphs, all at once.
TP_GPU_TEST(threads_update_and_nested_replay) {
  check_on_threads(6, [](int t, std::string& error) {
    tp::Stream stream;
    tp::DeviceTensor<int> x(n, stream);
    tp::DeviceTensor<int> y(n, stream);
    tp::Graph inner(tp::GraphOptions{.capture_error_mode = tp::CaptureErrorMode::ThreadLocal});
    inner.capture(plain(x, y, 1), {.stream = stream});
    for (int round = 0; round < 10; ++round) {
      inner.update(through_temporary(x, y, round), {.stream = stream});
      tp::Graph outer(tp::GraphOptions{.capture_error_mode = tp::CaptureErrorMode::ThreadLocal});
      outer.capture([&](tp::StreamRef s) { inner.replay(s); }, {.stream = stream});
      tp_test::fill(x.data(), n, t, stream);
      outer.replay(stream);
      if (!all(host_in_thread(y, stream), t + round)) error += "round " + std::to_string(round) + " wrong; ";
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
