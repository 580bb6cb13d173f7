// Real CUDA code as it is written: kernels that set their own conditional handles
// (ConditionalHandle), graphs built node by node (Graph::adopt), kernels launched on the legacy
// default stream during a capture, temporaries given to stage_and_launch, DeviceTensor::reset,
// CaptureOptions::upload, and capture_error's culprit inside nested bodies.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace tp = tensorplay;

namespace {

// ---- kernels written the way NVIDIA's samples write them ---------------------------------------
__global__ void decide(const int* x, tp::ConditionalHandle h) { h.set(*x > 0 ? 1u : 0u); }
__global__ void decide_raw(const int* x, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *x > 0 ? 1u : 0u); }
__global__ void pick(const int* index, tp::ConditionalHandle h) { h.set(static_cast<unsigned>(*index)); }
__global__ void bump(int* counter, int by) { atomicAdd(counter, by); }
__global__ void set_value(int* out, int value) { *out = value; }
// One loop iteration: counts down `k`, counts the iteration, stops the loop at 0.
__global__ void count_down(int* k, int* iterations, tp::ConditionalHandle loop) {
  *k -= 1;
  *iterations += 1;
  if (*k <= 0) loop.set(0);
}
__global__ void count_down_raw(int* k, int* iterations, cudaGraphConditionalHandle loop) {
  *k -= 1;
  *iterations += 1;
  cudaGraphSetConditional(loop, *k > 0 ? 1u : 0u);
}
__global__ void twice(const int* in, int* out, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += static_cast<int>(gridDim.x * blockDim.x))
    out[i] = 2 * in[i];
}

int read(const int* p, cudaStream_t s) {
  int v = 0;
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(&v, p, sizeof v, cudaMemcpyDeviceToHost, s), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  return v;
}
void write(int* p, int v, cudaStream_t s) {
  set_value<<<1, 1, 0, s>>>(p, v);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

using tp_test::expect_capture_error;
using tp_test::expect_usage_error;

// The kernels a hand-built graph runs: a kernel node of `kernel` with `args`.
template <class... A>
cudaGraphNode_t add_kernel_node(cudaGraph_t graph, void (*kernel)(A...), std::vector<cudaGraphNode_t> after, void** args,
                                unsigned blocks = 1, unsigned threads = 1) {
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(kernel);
  params.gridDim = dim3(blocks);
  params.blockDim = dim3(threads);
  params.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddKernelNode(&node, graph, after.data(), after.size(), &params), cudaSuccess);
  return node;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(porting)

// ---- no GPU needed ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_conditional_handle_is_trivially_copyable_and_names_no_node_by_default) {
  static_assert(std::is_trivially_copyable_v<tp::ConditionalHandle>);
  const tp::ConditionalHandle h;
  BOOST_TEST(!static_cast<bool>(h));
  BOOST_TEST(h.native() == cudaGraphConditionalHandle{0});
}

BOOST_AUTO_TEST_CASE(conditional_handle_outside_a_capture_throws_usage_error) {
  tp::Graph graph;
  const std::string what = expect_usage_error([&] { (void)graph.conditional_handle(); });
  BOOST_TEST(what.find("conditional_handle") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(adopt_of_a_null_graph_throws_usage_error) {
  tp::Graph graph;
  expect_usage_error([&] { graph.adopt(nullptr); });
}

// ---- handles the user's kernels set ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(if_with_a_handle_runs_the_body_when_the_users_kernel_sets_it, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), count(1, s);
  write(count.data(), 0, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto h = graph.conditional_handle();
    decide<<<1, 1, 0, c>>>(x.data(), h);
    graph.if_(h, [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(count.data(), 1); });
  }, {.stream = s});
  BOOST_TEST(graph.node_count() == 2u);  // the user's kernel and the node: no kernel of the library's
  write(x.data(), 1, s);
  graph.replay(s);
  write(x.data(), 0, s);
  graph.replay(s);
  write(x.data(), 5, s);
  graph.replay(s);
  BOOST_TEST(read(count.data(), s) == 2);
}

BOOST_AUTO_TEST_CASE(a_raw_cuda_kernel_sets_the_native_handle, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), count(1, s);
  write(count.data(), 0, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto h = graph.conditional_handle();
    decide_raw<<<1, 1, 0, c>>>(x.data(), h.native());
    graph.if_(h, [&] { bump<<<1, 1, 0, tp::current_stream()>>>(count.data(), 1); });
  }, {.stream = s});
  for (int v : {3, -1, 1, 0}) {
    write(x.data(), v, s);
    graph.replay(s);
  }
  BOOST_TEST(read(count.data(), s) == 2);
}

BOOST_AUTO_TEST_CASE(while_with_a_default_of_one_is_a_do_while, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> k(1, s), iterations(1, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) {
    auto loop = graph.conditional_handle(1);  // 1 at every launch: the body runs at least once
    graph.while_(loop, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop); });
  }, {.stream = s});
  for (int start : {5, 1, 0, -3, 7}) {
    write(k.data(), start, s);
    write(iterations.data(), 0, s);
    graph.replay(s);
    BOOST_TEST(read(iterations.data(), s) == (start > 1 ? start : 1), "start " << start);
  }
}

BOOST_AUTO_TEST_CASE(while_with_a_default_of_zero_tests_first, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), k(1, s), iterations(1, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto loop = graph.conditional_handle();  // 0 unless the kernel before the loop sets it
    decide<<<1, 1, 0, c>>>(k.data(), loop);
    graph.while_(loop, [&](tp::StreamRef b) { count_down_raw<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop.native()); });
  }, {.stream = s});
  for (int start : {4, 0, -2, 1}) {
    write(k.data(), start, s);
    write(iterations.data(), 0, s);
    graph.replay(s);
    BOOST_TEST(read(iterations.data(), s) == (start > 0 ? start : 0), "start " << start);
  }
}

BOOST_AUTO_TEST_CASE(the_default_value_is_assigned_again_at_every_launch, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  // The handle is set to 0 by the body in one launch; the next launch starts from 1 again.
  tp::Stream s;
  tp::DeviceTensor<int> k(1, s), iterations(1, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) {
    auto loop = graph.conditional_handle(1);
    graph.while_(loop, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop); });
  }, {.stream = s});
  write(iterations.data(), 0, s);
  for (int i = 0; i < 4; ++i) {
    write(k.data(), 2, s);
    graph.replay(s);
  }
  BOOST_TEST(read(iterations.data(), s) == 8);
}

BOOST_AUTO_TEST_CASE(if_else_and_switch_with_handles, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), index(1, s), ran(4, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto h = graph.conditional_handle();
    decide<<<1, 1, 0, c>>>(x.data(), h);
    graph.if_else_(h, [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(ran.data() + 0, 1); },
                   [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(ran.data() + 1, 1); });
    auto which = graph.conditional_handle();
    pick<<<1, 1, 0, c>>>(index.data(), which);
    graph.switch_(which, [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(ran.data() + 2, 1); },
                  [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(ran.data() + 3, 10); },
                  [&](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(ran.data() + 3, 100); });
  }, {.stream = s});
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(ran.data(), 0, ran.bytes(), s), cudaSuccess);
  const std::array<std::pair<int, int>, 5> runs{{{1, 0}, {0, 1}, {1, 2}, {-1, 7}, {1, 1}}};
  for (auto [cond, idx] : runs) {
    write(x.data(), cond, s);
    write(index.data(), idx, s);
    graph.replay(s);
  }
  const std::vector<int> host = ran.to_host(s);
  BOOST_TEST(host[0] == 3);  // then: cond > 0 three times
  BOOST_TEST(host[1] == 2);
  BOOST_TEST(host[2] == 1);  // index 0 once
  BOOST_TEST(host[3] == 10 * 2 + 100 * 1);  // index 1 twice, 2 once, 7 runs nothing
}

BOOST_AUTO_TEST_CASE(handles_nest_two_levels_deep_in_every_kind, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  // while (outer: do-while over k) { if (x) { switch (index) {+1, +10} } ; if_else (x) {...} }
  tp::Stream s;
  tp::DeviceTensor<int> k(1, s), iterations(1, s), x(1, s), index(1, s), out(3, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) {
    auto loop = graph.conditional_handle(1);
    graph.while_(loop, [&](tp::StreamRef body) {
      auto inner = graph.conditional_handle();  // made inside the while body, where its node goes
      decide<<<1, 1, 0, body>>>(x.data(), inner);
      graph.if_(inner, [&](tp::StreamRef b2) {
        auto which = graph.conditional_handle();
        pick<<<1, 1, 0, b2>>>(index.data(), which);
        graph.switch_(which, [&](tp::StreamRef b3) { bump<<<1, 1, 0, b3>>>(out.data(), 1); },
                      [&](tp::StreamRef b3) { bump<<<1, 1, 0, b3>>>(out.data(), 10); });
      });
      auto other = graph.conditional_handle();
      decide<<<1, 1, 0, body>>>(x.data(), other);
      {
        tp::WhileScope never(graph, graph.conditional_handle());  // default 0: tested first, never runs
        bump<<<1, 1, 0, never.stream()>>>(out.data() + 2, 1000);
      }
      graph.if_else_(other, [&](tp::StreamRef b2) { bump<<<1, 1, 0, b2>>>(out.data() + 1, 1); },
                     [&](tp::StreamRef b2) { bump<<<1, 1, 0, b2>>>(out.data() + 1, 100); });
      count_down<<<1, 1, 0, body>>>(k.data(), iterations.data(), loop);
    });
  }, {.stream = s});
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(out.data(), 0, out.bytes(), s), cudaSuccess);
  write(k.data(), 3, s);
  write(iterations.data(), 0, s);
  write(x.data(), 1, s);
  write(index.data(), 1, s);
  graph.replay(s);  // 3 iterations: switch body 1 (+10) and then-branch (+1) each time
  write(k.data(), 2, s);
  write(x.data(), 0, s);
  graph.replay(s);  // 2 iterations: no switch, else-branch (+100) each time
  const std::vector<int> host = out.to_host(s);
  BOOST_TEST(read(iterations.data(), s) == 5);
  BOOST_TEST(host[0] == 30);
  BOOST_TEST(host[1] == 3 + 200);
  BOOST_TEST(host[2] == 0);
}

BOOST_AUTO_TEST_CASE(scopes_and_the_imperative_form_take_handles, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), k(1, s), iterations(1, s), count(1, s);
  tp::Graph graph;
  graph.capture_begin({.stream = s});
  auto h = graph.conditional_handle();
  decide<<<1, 1, 0, s>>>(x.data(), h);
  graph.begin_capture_to_if_node(h);
  bump<<<1, 1, 0, graph.capture_stream()>>>(count.data(), 1);
  graph.end_capture_to_conditional_node();
  {
    auto loop = graph.conditional_handle(1);
    tp::WhileScope scope(graph, loop);
    count_down<<<1, 1, 0, scope.stream()>>>(k.data(), iterations.data(), loop);
  }
  {
    auto again = graph.conditional_handle();
    decide<<<1, 1, 0, graph.capture_stream()>>>(x.data(), again);
    tp::IfScope scope(graph, again);
    bump<<<1, 1, 0, scope.stream()>>>(count.data(), 10);
  }
  graph.capture_end();
  write(count.data(), 0, s);
  write(x.data(), 1, s);
  write(k.data(), 4, s);
  write(iterations.data(), 0, s);
  graph.replay(s);
  BOOST_TEST(read(count.data(), s) == 11);
  BOOST_TEST(read(iterations.data(), s) == 4);
}

BOOST_AUTO_TEST_CASE(update_captures_new_handles, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), count(1, s);
  tp::Graph graph;
  auto body = [&](int by) {
    return [&, by](tp::StreamRef c) {
      auto h = graph.conditional_handle();
      decide<<<1, 1, 0, c>>>(x.data(), h);
      graph.if_(h, [&, by](tp::StreamRef b) { bump<<<1, 1, 0, b>>>(count.data(), by); });
    };
  };
  graph.capture(body(1), {.stream = s});
  write(count.data(), 0, s);
  write(x.data(), 1, s);
  graph.replay(s);
  const tp::UpdateResult r = graph.update(body(100), {.stream = s});
  BOOST_TEST_MESSAGE("update outcome " << static_cast<int>(r.outcome));
  graph.replay(s);
  write(x.data(), 0, s);
  graph.replay(s);
  BOOST_TEST(read(count.data(), s) == 101);
}

// ---- misuse of handles ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_handle_of_another_graph_is_refused_and_nothing_is_left_capturing, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s, t;
  tp::Graph a, b;
  a.capture_begin({.stream = s});
  const tp::ConditionalHandle foreign = a.conditional_handle();
  const std::string what = expect_usage_error([&] {
    b.capture([&](tp::StreamRef) { b.if_(foreign, [] {}); }, {.stream = t});
  });
  BOOST_TEST(what.find("another graph") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(t));
  BOOST_TEST(!b.is_capturing());
  a.if_(foreign, [] {});
  a.capture_end();
  // Both graphs are usable afterwards.
  b.capture([](tp::StreamRef) {}, {.stream = t});
  a.replay(s);
  b.replay(t);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(a_handle_of_a_capture_that_ended_is_refused, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::Graph graph;
  tp::ConditionalHandle old;
  graph.capture([&](tp::StreamRef) {
    old = graph.conditional_handle();
    graph.if_(old, [] {});
  }, {.stream = s});
  expect_usage_error([&] { (void)graph.update([&](tp::StreamRef) { graph.if_(old, [] {}); }, {.stream = s}); });
  BOOST_TEST(tp_test::not_capturing(s));
  graph.replay(s);  // still replays its old work
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(a_handle_given_to_two_nodes_is_refused, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::Graph graph;
  const std::string what = expect_usage_error([&] {
    graph.capture([&](tp::StreamRef) {
      auto h = graph.conditional_handle();
      graph.if_(h, [] {});
      graph.while_(h, [] {});
    }, {.stream = s});
  });
  BOOST_TEST(what.find("another conditional node") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(s));
  BOOST_TEST(!graph.is_capturing());
}

BOOST_AUTO_TEST_CASE(a_default_handle_and_a_handle_of_another_level_are_refused, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::Graph graph;
  expect_usage_error([&] { graph.capture([&] { graph.if_(tp::ConditionalHandle{}, [] {}); }, {.stream = s}); });
  BOOST_TEST(tp_test::not_capturing(s));
  const std::string what = expect_usage_error([&] {
    graph.capture([&] {
      auto top = graph.conditional_handle();
      graph.if_(graph.conditional_handle(), [&] { graph.if_(top, [] {}); });  // top belongs to the top level
    }, {.stream = s});
  });
  BOOST_TEST(what.find("another level") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(s));
  graph.capture([&] {}, {.stream = s});  // usable afterwards
}

BOOST_AUTO_TEST_CASE(a_handle_given_to_no_node_fails_capture_end, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::Graph graph;
  const std::string what = expect_usage_error([&] { graph.capture([&] { (void)graph.conditional_handle(); }, {.stream = s}); });
  BOOST_TEST(what.find("no conditional node") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(s));
  BOOST_TEST(!graph.is_capturing());
}

BOOST_AUTO_TEST_CASE(a_graph_with_handles_destroyed_while_replays_run, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> k(1, s), iterations(1, s);
  write(iterations.data(), 0, s);
  write(k.data(), 1000, s);  // one replay counts down past 0 (do-while: at least once each)
  {
    tp::Graph graph;
    graph.capture([&](tp::StreamRef c) {
      tp_test::spin_kernel<<<1, 1, 0, c>>>(20'000'000);
      auto loop = graph.conditional_handle(1);
      graph.while_(loop, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop); });
    }, {.stream = s});
    for (int i = 0; i < 3; ++i) graph.replay(s);
  }  // destroyed with three replays queued
  BOOST_TEST(read(iterations.data(), s) == 1000 + 1 + 1);
}

BOOST_AUTO_TEST_CASE(handles_on_several_threads_each_with_its_graph, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        tp::Stream s;
        tp::DeviceTensor<int> k(1, s), iterations(1, s);
        for (int round = 0; round < 10; ++round) {
          tp::Graph graph;
          graph.capture([&](tp::StreamRef) {
            auto loop = graph.conditional_handle(1);
            graph.while_(loop, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop); });
          }, {.capture_error_mode = tp::CaptureErrorMode::ThreadLocal, .stream = s});
          write(k.data(), t + round + 1, s);
          write(iterations.data(), 0, s);
          graph.replay(s);
          if (read(iterations.data(), s) != t + round + 1) failures.fetch_add(1);
        }
      } catch (const std::exception& e) {
        BOOST_TEST_MESSAGE("thread: " << e.what());
        failures.fetch_add(100);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  BOOST_TEST(failures.load() == 0);
}

// ---- graphs built node by node: adopt ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(an_adopted_graph_replays_stages_dumps_and_updates, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  constexpr int n = 1000;
  tp::Stream s;
  tp::DeviceTensor<int> in(n, s), out(n, s), count(1, s);
  write(count.data(), 0, s);
  int* in_ptr = in.data();
  int* out_ptr = out.data();
  int* count_ptr = count.data();
  int size = n;
  int one = 1;
  cudaGraph_t built = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphCreate(&built, 0), cudaSuccess);
  void* twice_args[] = {&in_ptr, &out_ptr, &size};
  cudaGraphNode_t first = add_kernel_node(built, twice, {}, twice_args, 4, 256);
  void* bump_args[] = {&count_ptr, &one};
  add_kernel_node(built, bump, {first}, bump_args);

  tp::Graph graph;
  graph.adopt(built);
  BOOST_TEST(graph.native_graph() == built);
  BOOST_TEST(graph.native_exec() != nullptr);
  BOOST_TEST(graph.node_count() == 2u);
  BOOST_TEST(graph.executable_bytes() > 0u);
  expect_usage_error([&] { graph.adopt(built); });  // already holds one

  // stage_and_launch onto the adopted graph's input buffer, the input a temporary span.
  std::vector<int> fresh(n);
  for (int i = 0; i < n; ++i) fresh[i] = i;
  tp::DeviceTensor<int> source(n, s);
  source.copy_from_host(fresh, s);
  graph.stage_and_launch(std::tie(in), std::forward_as_tuple(std::span<const int>(source.data(), n)), s);
  const std::vector<int> doubled = out.to_host(s);
  BOOST_TEST(doubled[0] == 0);
  BOOST_TEST(doubled[n - 1] == 2 * (n - 1));
  BOOST_TEST(read(count_ptr, s) == 1);

  // retain, debug_dump, replay.
  auto alive = std::make_shared<int>(7);
  std::weak_ptr<int> watch = alive;
  graph.retain(std::move(alive));
  const auto dot = tp_test::temp_path("adopted.dot");
  graph.debug_dump(dot);
  BOOST_TEST(tp_test::read_file(dot).find("digraph") != std::string::npos);
  std::filesystem::remove(dot);
  graph.replay(s);
  BOOST_TEST(read(count_ptr, s) == 2);

  // update(body) with the same topology: patched in place.
  const tp::UpdateResult r = graph.update([&](tp::StreamRef c) {
    twice<<<4, 256, 0, c>>>(in_ptr, out_ptr, n);
    bump<<<1, 1, 0, c>>>(count_ptr, 100);
  }, {.stream = s});
  BOOST_TEST_MESSAGE("update of an adopted graph: outcome " << static_cast<int>(r.outcome));
  graph.replay(s);
  BOOST_TEST(read(count_ptr, s) == 102);
  BOOST_TEST(!watch.expired());
  graph.reset();
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  BOOST_TEST(!graph.is_instantiated());
}

BOOST_AUTO_TEST_CASE(an_adopted_graph_replays_as_a_child_and_dies_in_every_order, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> count(1, s);
  int* count_ptr = count.data();
  int by = 1;
  for (int order = 0; order < 4; ++order) {
    write(count_ptr, 0, s);
    auto inner = std::make_unique<tp::Graph>();
    cudaGraph_t built = nullptr;
    BOOST_REQUIRE_EQUAL(cudaGraphCreate(&built, 0), cudaSuccess);
    void* args[] = {&count_ptr, &by};
    add_kernel_node(built, bump, {}, args);
    inner->adopt(built);
    auto outer = std::make_unique<tp::Graph>();
    outer->capture([&](tp::StreamRef c) {
      tp_test::spin_kernel<<<1, 1, 0, c>>>(5'000'000);
      inner->replay(c);  // a child-graph node
      inner->replay(c);
    }, {.stream = s});
    outer->replay(s);  // still running while objects die below
    switch (order) {
      case 0: inner.reset(); outer->replay(s); outer.reset(); break;
      case 1: outer.reset(); inner->replay(s); inner.reset(); break;
      case 2: inner->reset(); outer->replay(s); inner.reset(); outer.reset(); break;
      default: outer->reset(); inner->replay(s); outer.reset(); inner.reset(); break;
    }
    BOOST_TEST(read(count_ptr, s) == 3 + (order == 0 || order == 2 ? 1 : 0), "order " << order);
  }
}

BOOST_AUTO_TEST_CASE(an_adopted_graph_with_a_conditional_node_and_memory_nodes, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> k(1, s), iterations(1, s), out(1, s);
  int* k_ptr = k.data();
  int* iterations_ptr = iterations.data();
  cudaGraph_t built = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphCreate(&built, 0), cudaSuccess);
  // A while loop built the way the programming guide builds it.
  cudaGraphConditionalHandle loop = 0;
  BOOST_REQUIRE_EQUAL(cudaGraphConditionalHandleCreate(&loop, built, 1, cudaGraphCondAssignDefault), cudaSuccess);
  cudaGraphNodeParams cond{};
  cond.type = cudaGraphNodeTypeConditional;
  cond.conditional.handle = loop;
  cond.conditional.type = cudaGraphCondTypeWhile;
  cond.conditional.size = 1;
  cudaGraphNode_t while_node = nullptr;
  BOOST_REQUIRE_EQUAL(tp::detail::add_node(&while_node, built, nullptr, 0, &cond), cudaSuccess);  // cudaGraphAddNode (its signature differs between CUDA 12 and 13)
  void* body_args[] = {&k_ptr, &iterations_ptr, &loop};
  add_kernel_node(cond.conditional.phGraph_out[0], count_down_raw, {}, body_args);
  // A memory node: scratch allocated by the graph, written, copied out, freed.
  cudaMemAllocNodeParams alloc{};
  alloc.poolProps.allocType = cudaMemAllocationTypePinned;
  alloc.poolProps.location.type = cudaMemLocationTypeDevice;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&alloc.poolProps.location.id), cudaSuccess);
  alloc.bytesize = 256;
  cudaGraphNode_t alloc_node = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddMemAllocNode(&alloc_node, built, &while_node, 1, &alloc), cudaSuccess);
  int* scratch = static_cast<int*>(alloc.dptr);
  int value = 42;
  void* set_args[] = {&scratch, &value};
  cudaGraphNode_t set_node = add_kernel_node(built, set_value, {alloc_node}, set_args);
  cudaGraphNode_t copy_node = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddMemcpyNode1D(&copy_node, built, &set_node, 1, out.data(), scratch, sizeof(int), cudaMemcpyDeviceToDevice),
                      cudaSuccess);
  cudaGraphNode_t free_node = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddMemFreeNode(&free_node, built, &copy_node, 1, scratch), cudaSuccess);

  tp::Graph graph;
  graph.adopt(built);
  for (int start : {3, 1, 6}) {
    write(k_ptr, start, s);
    write(iterations_ptr, 0, s);
    write(out.data(), 0, s);
    graph.replay(s);
    BOOST_TEST(read(iterations_ptr, s) == start);
    BOOST_TEST(read(out.data(), s) == 42);
  }
  // CUDA allows no conditional node in a child graph: replaying it into a capture is refused.
  tp::Graph outer;
  expect_usage_error([&] { outer.capture([&](tp::StreamRef c) { graph.replay(c); }, {.stream = s}); });
  BOOST_TEST(tp_test::not_capturing(s));
}

// ---- the legacy default stream ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_legacy_stream_launch_in_a_capture_on_the_librarys_stream_is_a_capture_error,
                     *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::DeviceTensor<int> count(1);
  for (tp::CaptureErrorMode mode : {tp::CaptureErrorMode::Global, tp::CaptureErrorMode::ThreadLocal, tp::CaptureErrorMode::Relaxed}) {
    tp::Graph graph;
    const tp::capture_error e = expect_capture_error([&] {
      graph.capture([&] {
        bump<<<1, 1>>>(count.data(), 1);  // the legacy default stream, as most CUDA code is written
      }, {.capture_error_mode = mode});
    });
    BOOST_TEST(std::string(e.what()).find("legacy default stream") != std::string::npos, "mode " << tp::to_string(mode));
    BOOST_TEST(!graph.is_capturing());
    (void)cudaGetLastError();
    // The same body on the current stream is captured, and the graph replays it.
    graph.capture([&] { bump<<<1, 1, 0, tp::current_stream()>>>(count.data(), 1); }, {.capture_error_mode = mode});
    BOOST_TEST(graph.node_count() == 1u);
  }
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(a_legacy_stream_launch_inside_a_body_is_a_capture_error, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;  // a stream of the user's (non-blocking): the bodies are the library's streams
  tp::DeviceTensor<int> count(1, s), x(1, s);
  for (int depth = 1; depth <= 2; ++depth) {
    tp::Graph graph;
    const tp::capture_error e = expect_capture_error([&] {
      graph.capture([&](tp::StreamRef c) {
        auto h = graph.conditional_handle();
        decide<<<1, 1, 0, c>>>(x.data(), h);
        graph.if_(h, [&] {
          if (depth == 1) {
            bump<<<1, 1>>>(count.data(), 1);
            return;
          }
          auto inner = graph.conditional_handle(1);
          graph.while_(inner, [&] { bump<<<1, 1>>>(count.data(), 1); });
        });
      }, {.stream = s});
    });
    BOOST_TEST(std::string(e.what()).find("legacy default stream") != std::string::npos, "depth " << depth);
    BOOST_TEST(tp_test::not_capturing(s));
    (void)cudaGetLastError();
  }
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(launches_on_the_per_thread_default_stream_are_captured_on_it, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  // What code compiled with --default-stream per-thread does with <<<grid, block>>>.
  tp::DeviceTensor<int> count(1, cudaStreamPerThread);
  write(count.data(), 0, cudaStreamPerThread);
  tp::Graph graph;
  graph.capture([&] { bump<<<1, 1, 0, cudaStreamPerThread>>>(count.data(), 1); }, {.stream = tp::StreamRef(cudaStreamPerThread)});
  BOOST_TEST(graph.node_count() == 1u);
  graph.replay(cudaStreamPerThread);
  graph.replay(cudaStreamPerThread);
  BOOST_TEST(read(count.data(), cudaStreamPerThread) == 2);
}

// ---- capture_error names the culprit at every depth --------------------------------------------------

BOOST_AUTO_TEST_CASE(a_synchronize_at_every_depth_is_named_by_capture_error, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<bool> yes(1, s);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(yes.data(), 1, 1, s), cudaSuccess);
  tp::DeviceTensor<int> count(1, s);
  for (int depth = 0; depth <= 3; ++depth) {
    tp::Graph graph;
    const tp::capture_error e = expect_capture_error([&] {
      graph.capture([&](tp::StreamRef c) {
        auto sync_here = [&] {
          bump<<<1, 1, 0, tp::current_stream()>>>(count.data(), 1);
          (void)cudaStreamSynchronize(tp::current_stream());
        };
        if (depth == 0) return sync_here();
        graph.if_(yes, [&] {
          if (depth == 1) return sync_here();
          graph.while_(yes, [&] {
            if (depth == 2) return sync_here();
            graph.if_else_(yes, sync_here, [] {});
          });
        });
        (void)c;
      }, {.stream = s});
    });
    BOOST_TEST(e.culprit() == "cudaStreamSynchronize", "depth " << depth << ": " << e.what());
    BOOST_TEST(tp_test::not_capturing(s));
    (void)cudaGetLastError();
  }
}

BOOST_AUTO_TEST_CASE(node_handles_of_the_native_graph_update_the_executable_also_after_staging,
                     *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  constexpr int n = 256;
  tp::Stream s;
  tp::DeviceTensor<int> in(n, s), out(n, s), source(n, s), count(1, s);
  write(count.data(), 0, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    twice<<<1, 256, 0, c>>>(in.data(), out.data(), n);
    bump<<<1, 1, 0, c>>>(count.data(), 1);
  }, {.stream = s});
  // The bump node, found in the captured graph before the staging nodes exist.
  std::size_t nodes = 0;
  BOOST_REQUIRE_EQUAL(cudaGraphGetNodes(graph.native_graph(), nullptr, &nodes), cudaSuccess);
  std::vector<cudaGraphNode_t> all(nodes);
  BOOST_REQUIRE_EQUAL(cudaGraphGetNodes(graph.native_graph(), all.data(), &nodes), cudaSuccess);
  cudaGraphNode_t bump_node = nullptr;
  for (cudaGraphNode_t node : all) {
    cudaKernelNodeParams p{};
    if (cudaGraphKernelNodeGetParams(node, &p) == cudaSuccess && p.func == reinterpret_cast<void*>(bump)) bump_node = node;
  }
  BOOST_REQUIRE(bump_node != nullptr);
  tp_test::fill(source.data(), n, 3, s);
  graph.stage_and_launch(std::tie(in), std::tie(source), s);  // adds the staging nodes, compiles again
  BOOST_TEST(graph.node_count() == nodes + 2);
  int* count_ptr = count.data();
  int by = 10;
  void* args[] = {&count_ptr, &by};
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(bump);
  p.gridDim = dim3(1);
  p.blockDim = dim3(1);
  p.kernelParams = args;
  BOOST_REQUIRE_EQUAL(cudaGraphExecKernelNodeSetParams(graph.native_exec(), bump_node, &p), cudaSuccess);
  graph.replay(s);
  BOOST_TEST(read(count.data(), s) == 1 + 10);
  BOOST_TEST(out.to_host(s)[n - 1] == 6);
}

// ---- smaller frictions -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(device_tensor_reset_frees_into_its_pool_also_inside_a_capture, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<float> t(1024, s);
  t.reset();
  BOOST_TEST(t.empty());
  BOOST_TEST(t.data() == nullptr);
  t.reset();  // twice is fine
  tp::Graph graph;
  void* first = nullptr;
  void* second = nullptr;
  graph.capture([&](tp::StreamRef c) {
    tp::DeviceTensor<float> scratch(4096, c);
    first = scratch.data();
    tp_test::fill(scratch.data(), scratch.size(), 1.0f, c);
    scratch.reset();  // freed now: the next allocation of the capture may reuse it
    tp::DeviceTensor<float> next(4096, c);
    second = next.data();
    tp_test::fill(next.data(), next.size(), 2.0f, c);
  }, {.stream = s});
  BOOST_TEST(first == second);
  graph.replay(s);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
}

BOOST_AUTO_TEST_CASE(capture_options_upload_per_capture, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  tp::Stream s;
  tp::DeviceTensor<int> count(1, s);
  write(count.data(), 0, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) { bump<<<1, 1, 0, c>>>(count.data(), 1); }, {.stream = s, .upload = true});
  graph.replay(s);
  BOOST_TEST(read(count.data(), s) == 1);
}

BOOST_AUTO_TEST_CASE(stage_and_launch_takes_temporaries_and_vectors, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  constexpr int n = 256;
  tp::Stream s;
  tp::DeviceTensor<int> in(n, s), out(n, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) { twice<<<1, 256, 0, c>>>(in.data(), out.data(), n); }, {.stream = s});
  std::vector<int> host(n, 21);  // host memory: staged with a copy before the launch
  graph.stage_and_launch(std::forward_as_tuple(std::span<int>(in.data(), n)), std::forward_as_tuple(std::span<const int>(host)), s);
  BOOST_TEST(out.to_host(s)[n - 1] == 42);
  tp::DeviceTensor<int> dev(n, s);
  tp_test::fill(dev.data(), n, 5, s);
  graph.stage_and_launch(std::tie(in), std::make_tuple(std::span<const int>(dev.data(), n)), s);
  BOOST_TEST(out.to_host(s)[0] == 10);
}

BOOST_AUTO_TEST_CASE(graph_buckets_run_takes_temporaries, *boost::unit_test::precondition(tp_test::NeedsGpus{})) {
  constexpr int most = 64;
  tp::Stream s;
  tp::DeviceTensor<int> in(most, s), out(most, s);
  tp::GraphBuckets buckets({16, 64}, [&](tp::StreamRef c, std::size_t size) {
    twice<<<1, 256, 0, c>>>(in.data(), out.data(), static_cast<int>(size));
  });
  const std::vector<int> host(10, 4);
  const std::size_t ran = buckets.run(10, std::forward_as_tuple(std::span<int>(in.data(), most)),
                                      std::forward_as_tuple(std::span<const int>(host)), s);
  BOOST_TEST(ran == 16u);
  const std::vector<int> result = out.to_host(s);
  BOOST_TEST(result[0] == 8);
  BOOST_TEST(result[9] == 8);
}

BOOST_AUTO_TEST_SUITE_END()
