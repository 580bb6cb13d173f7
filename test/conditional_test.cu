// Tests for conditional nodes: Graph's imperative and lambda forms, and graph/conditional_scope.hpp.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {
__global__ void increment(int* counter) { atomicAdd(counter, 1); }
__global__ void set_flag(bool* flag, bool value) { *flag = value; }
__global__ void set_int(int* out, int value) { *out = value; }
__global__ void copy_flag(const bool* from, bool* to) { *to = *from; }
__global__ void count_down(int* k, bool* more, int* iterations) {
  *k -= 1;
  *iterations += 1;
  *more = *k > 0;
}
__global__ void compute_more(const int* k, bool* more) { *more = *k > 0; }
__global__ void count_down_only(int* k, int* iterations) {
  *k -= 1;
  *iterations += 1;
}
__global__ void mark_step(const int* step, int* ran) { ran[*step] = 1; }
__global__ void next_step(int* step) { *step += 1; }
__global__ void only_in_the_body_marker(int* counter) { atomicAdd(counter, 1); }

int read_int(const tp::DeviceTensor<int>& t, tp::StreamRef s) { return t.to_host(s)[0]; }
void write_int(tp::DeviceTensor<int>& t, int v, tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(t.data(), v); }
void write_flag(tp::DeviceTensor<bool>& t, bool v, tp::StreamRef s) { set_flag<<<1, 1, 0, s>>>(t.data(), v); }

// The countdown of the while tests: `iterations` counts body runs; the body re-arms `more`.
struct Countdown {
  tp::DeviceTensor<int> k;
  tp::DeviceTensor<bool> more;
  tp::DeviceTensor<int> iterations;
  explicit Countdown(tp::StreamRef s) : k(1, s), more(1, s), iterations(1, s) {}
  void arm(int start, tp::StreamRef s) {
    write_int(k, start, s);
    write_int(iterations, 0, s);
  }
};
}  // namespace

BOOST_AUTO_TEST_SUITE(conditional)

// ---- no GPU needed ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(multi_body_conditionals_refuse_cuda_older_than_12_8_with_a_message) {
  try {
    tp::detail::require_multi_body_conditionals(12060, 13000, "if_else_");
    BOOST_FAIL("accepted runtime 12.6");
  } catch (const tp::usage_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("if_else_") != std::string::npos);
    BOOST_TEST(what.find("12.8") != std::string::npos, what);
  }
  BOOST_CHECK_THROW(tp::detail::require_multi_body_conditionals(13000, 12040, "switch_"), tp::usage_error);
  BOOST_CHECK_NO_THROW(tp::detail::require_multi_body_conditionals(12080, 12080, "switch_"));
}

BOOST_AUTO_TEST_CASE(conditional_outside_a_capture_throws_usage_error) {
  tp::Graph graph;
  bool host_flag = true;
  std::span<bool, 1> pred(&host_flag, 1);
  BOOST_CHECK_THROW(graph.begin_capture_to_if_node(pred), tp::usage_error);
  BOOST_CHECK_THROW(graph.begin_capture_to_while_node(pred), tp::usage_error);
  BOOST_CHECK_THROW(graph.if_(pred, [] {}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(end_conditional_with_no_open_node_throws_usage_error) {
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.end_capture_to_conditional_node(), tp::usage_error);
  bool host_flag = true;
  BOOST_CHECK_THROW(graph.set_conditional_handle_for_current_node(std::span<bool, 1>(&host_flag, 1)), tp::usage_error);
}

// ---- misuse inside a capture: usage_error before anything is captured ----------------------------

TP_GPU_TEST(bad_predicates_throw_usage_error_and_capture_nothing) {
  tp::Stream stream;
  tp::DeviceTensor<bool> two(2, stream);
  tp::DeviceTensor<int> counter(1, stream);
  write_int(counter, 0, stream);
  bool host_flag = true;
  std::span<bool, 1> host_pred(&host_flag, 1);
  tp::DeviceTensor<int> int_tensor(1, stream);
  const tp::TensorView int_view = tp::TensorView::of(int_tensor.data(), 1);

  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  increment<<<1, 1, 0, stream>>>(counter.data());
  BOOST_CHECK_THROW(graph.begin_capture_to_if_node(two), tp::usage_error);         // two elements
  BOOST_CHECK_THROW(graph.begin_capture_to_while_node(host_pred), tp::usage_error);  // host memory
  BOOST_CHECK_THROW(graph.if_(int_view, [] {}), tp::usage_error);                    // element type int
  BOOST_TEST(graph.conditional_depth() == 0u);
  BOOST_TEST(graph.is_capturing());
  graph.capture_end();
  BOOST_TEST(graph.node_count() == 1u);  // only the increment: nothing else was captured
  graph.replay(stream);
  BOOST_TEST(read_int(counter, stream) == 1);
}

TP_GPU_TEST(capture_end_with_a_body_open_throws_usage_error_and_the_capture_can_be_finished) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  write_flag(pred, true, stream);
  write_int(counter, 0, stream);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  graph.begin_capture_to_if_node(pred);
  increment<<<1, 1, 0, graph.capture_stream()>>>(counter.data());
  BOOST_CHECK_THROW(graph.capture_end(), tp::usage_error);
  BOOST_TEST(graph.is_capturing());
  graph.end_capture_to_conditional_node();
  graph.capture_end();
  graph.replay(stream);
  BOOST_TEST(read_int(counter, stream) == 1);
}

TP_GPU_TEST(body_that_throws_ends_every_body_and_the_capture) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  write_flag(pred, true, stream);
  tp::Graph graph;
  std::vector<cudaStream_t> body_streams;
  BOOST_CHECK_THROW(graph.capture([&] {
    graph.while_(pred, [&](tp::StreamRef outer) {
      body_streams.push_back(outer);
      graph.if_(pred, [&](tp::StreamRef inner) {
        body_streams.push_back(inner);
        throw std::runtime_error("inside two bodies");
      });
    });
  }, {.stream = stream}),
                    std::runtime_error);
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(graph.conditional_depth() == 0u);
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_REQUIRE(body_streams.size() == 2u);
  for (cudaStream_t s : body_streams) BOOST_TEST(tp_test::not_capturing(s));
  BOOST_TEST(tp::current_stream().is_legacy_default());
  // The graph captures again.
  tp::DeviceTensor<int> counter(1, stream);
  write_int(counter, 0, stream);
  graph.capture([&] { graph.if_(pred, [&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(counter.data()); }); },
                {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(read_int(counter, stream) == 1);
}

// ---- if ------------------------------------------------------------------------------------------

TP_GPU_TEST(if_body_ran_exactly_when_the_predicate_was_true) {
  tp::Stream stream;
  constexpr int steps = 100;
  std::mt19937 rng(20261129);
  std::vector<char> values(steps);
  for (char& v : values) v = static_cast<char>(rng() % 2);
  tp::DeviceTensor<bool> all_values(steps, stream);
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(all_values.data(), values.data(), steps, cudaMemcpyHostToDevice, stream), cudaSuccess);
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> step(1, stream);
  tp::DeviceTensor<int> ran(steps, stream);
  write_int(step, 0, stream);
  tp_test::fill(ran.data(), steps, 0, stream);

  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    graph.if_(pred, [&](tp::StreamRef body) { mark_step<<<1, 1, 0, body>>>(step.data(), ran.data()); });
    next_step<<<1, 1, 0, s>>>(step.data());
  }, {.stream = stream});
  for (int i = 0; i < steps; ++i) {
    copy_flag<<<1, 1, 0, stream>>>(all_values.data() + i, pred.data());
    graph.replay(stream);
  }
  const std::vector<int> result = ran.to_host(stream);
  int trues = 0;
  for (int i = 0; i < steps; ++i) {
    BOOST_TEST(result[i] == values[i], "step " << i);
    trues += values[i];
  }
  BOOST_TEST(trues > 20);  // the random sequence really mixes both values
  BOOST_TEST(trues < 80);
}

TP_GPU_TEST(inside_a_body_current_stream_is_the_body_stream_and_memory_comes_from_the_graphs_pool) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  write_flag(pred, true, stream);
  tp::DeviceTensor<int> out(1, stream);
  write_int(out, 0, stream);
  tp::Graph graph;
  tp::StreamRef body_stream{};
  tp::StreamRef current_in_body{};
  tp::Pool body_pool;
  graph.capture([&] {
    graph.if_(pred, [&](tp::StreamRef s) {
      body_stream = s;
      current_in_body = tp::current_stream();
      BOOST_TEST(graph.capture_stream() == s);
      tp::DeviceTensor<int> temp(1);  // current stream: the body's
      body_pool = temp.pool();
      set_int<<<1, 1, 0, s>>>(temp.data(), 9);
      tp_test::affine(temp.data(), out.data(), 1, 2, 1, s);
    });
    BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));  // back on the parent
  }, {.stream = stream});
  BOOST_TEST(body_stream != tp::StreamRef(stream));
  BOOST_TEST(current_in_body == body_stream);
  BOOST_TEST((body_pool == graph.pool()));
  graph.replay(stream);
  BOOST_TEST(read_int(out, stream) == 19);
}

// ---- while ---------------------------------------------------------------------------------------

TP_GPU_TEST(while_countdowns_run_exactly_k_iterations) {
  tp::Stream stream;
  Countdown c(stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    compute_more<<<1, 1, 0, s>>>(c.k.data(), c.more.data());
    graph.while_(c.more, [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(c.k.data(), c.more.data(), c.iterations.data()); });
  }, {.stream = stream});
  for (int k : {0, 1, 7, 1000}) {
    c.arm(k, stream);
    graph.replay(stream);
    BOOST_TEST(read_int(c.iterations, stream) == k, "K = " << k);
  }
}

TP_GPU_TEST(while_imperative_form_with_explicit_handle_refresh) {
  tp::Stream stream;
  Countdown c(stream);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  compute_more<<<1, 1, 0, stream>>>(c.k.data(), c.more.data());
  graph.begin_capture_to_while_node(c.more);
  count_down<<<1, 1, 0, graph.capture_stream()>>>(c.k.data(), c.more.data(), c.iterations.data());
  graph.set_conditional_handle_for_current_node(c.more);
  graph.end_capture_to_conditional_node();
  graph.capture_end();
  c.arm(5, stream);
  graph.replay(stream);
  BOOST_TEST(read_int(c.iterations, stream) == 5);
}

TP_GPU_TEST(while_scope_rereads_its_predicate_and_closes_on_scope_exit) {
  tp::Stream stream;
  Countdown c(stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    compute_more<<<1, 1, 0, s>>>(c.k.data(), c.more.data());
    {
      tp::WhileScope loop(graph, c.more);
      BOOST_TEST(graph.conditional_depth() == 1u);
      BOOST_TEST(loop.stream() == graph.capture_stream());
      count_down<<<1, 1, 0, loop.stream()>>>(c.k.data(), c.more.data(), c.iterations.data());
    }
    BOOST_TEST(graph.conditional_depth() == 0u);
  }, {.stream = stream});
  c.arm(12, stream);
  graph.replay(stream);
  BOOST_TEST(read_int(c.iterations, stream) == 12);
}

TP_GPU_TEST(if_scope_closes_during_stack_unwinding) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  try {
    tp::IfScope scope(graph, pred);
    BOOST_TEST(graph.conditional_depth() == 1u);
    throw std::runtime_error("leaving the scope by exception");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(graph.conditional_depth() == 0u);
  BOOST_TEST(graph.is_capturing());
  graph.capture_end();
  BOOST_TEST(tp_test::not_capturing(stream));
}

// ---- nesting --------------------------------------------------------------------------------------

TP_GPU_TEST(if_inside_while_runs_on_every_iteration_its_predicate_holds) {
  tp::Stream stream;
  Countdown c(stream);
  tp::DeviceTensor<bool> yes(1, stream);
  tp::DeviceTensor<int> inner(1, stream);
  write_flag(yes, true, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    compute_more<<<1, 1, 0, s>>>(c.k.data(), c.more.data());
    graph.while_(c.more, [&](tp::StreamRef body) {
      graph.if_(yes, [&](tp::StreamRef b) { increment<<<1, 1, 0, b>>>(inner.data()); });
      count_down<<<1, 1, 0, body>>>(c.k.data(), c.more.data(), c.iterations.data());
    });
  }, {.stream = stream});
  for (bool flag : {true, false}) {
    write_flag(yes, flag, stream);
    write_int(inner, 0, stream);
    c.arm(6, stream);
    graph.replay(stream);
    BOOST_TEST(read_int(c.iterations, stream) == 6);
    BOOST_TEST(read_int(inner, stream) == (flag ? 6 : 0));
  }
}

TP_GPU_TEST(while_inside_if_runs_only_when_the_if_holds) {
  tp::Stream stream;
  Countdown c(stream);
  tp::DeviceTensor<bool> gate(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    compute_more<<<1, 1, 0, s>>>(c.k.data(), c.more.data());
    graph.if_(gate, [&] {
      graph.while_(c.more, [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(c.k.data(), c.more.data(), c.iterations.data()); });
    });
  }, {.stream = stream});
  for (bool open : {false, true}) {
    write_flag(gate, open, stream);
    c.arm(9, stream);
    graph.replay(stream);
    BOOST_TEST(read_int(c.iterations, stream) == (open ? 9 : 0));
  }
}

namespace {
__global__ void arm_level(int* k, bool* more, int start) {
  *k = start;
  *more = start > 0;
}
__global__ void step_level(int* k, bool* more) {
  *k -= 1;
  *more = *k > 0;
}

// Levels alternate while (even depth, two iterations) and if (odd depth); the innermost body
// counts its runs: 2^(number of while levels) when every if holds.
void nest(tp::Graph& graph, int depth, int levels, std::vector<tp::DeviceTensor<int>>& ks,
          std::vector<tp::DeviceTensor<bool>>& flags, tp::DeviceTensor<int>& innermost) {
  const tp::StreamRef s = graph.capture_stream();
  if (depth == levels) {
    increment<<<1, 1, 0, s>>>(innermost.data());
    return;
  }
  if (depth % 2 == 0) {
    arm_level<<<1, 1, 0, s>>>(ks[depth].data(), flags[depth].data(), 2);
    graph.while_(flags[depth], [&](tp::StreamRef body) {
      nest(graph, depth + 1, levels, ks, flags, innermost);
      step_level<<<1, 1, 0, body>>>(ks[depth].data(), flags[depth].data());
    });
  } else {
    tp::IfScope scope(graph, flags[depth]);  // the RAII form, mixed in
    nest(graph, depth + 1, levels, ks, flags, innermost);
  }
}
}  // namespace

TP_GPU_TEST(eight_levels_of_nested_if_and_while) {
  tp::Stream stream;
  constexpr int levels = 8;
  std::vector<tp::DeviceTensor<int>> ks;
  std::vector<tp::DeviceTensor<bool>> flags;
  for (int i = 0; i < levels; ++i) {
    ks.emplace_back(1, stream);
    flags.emplace_back(1, stream);
    write_flag(flags.back(), true, stream);
  }
  tp::DeviceTensor<int> innermost(1, stream);
  tp::Graph graph;
  std::size_t deepest = 0;
  graph.capture([&] {
    nest(graph, 0, levels, ks, flags, innermost);
    deepest = graph.conditional_depth();
  }, {.stream = stream});
  BOOST_TEST(deepest == 0u);
  write_int(innermost, 0, stream);
  graph.replay(stream);
  BOOST_TEST(read_int(innermost, stream) == 16);  // four while levels of two iterations
  write_flag(flags[5], false, stream);             // one if deep inside fails
  write_int(innermost, 0, stream);
  graph.replay(stream);
  BOOST_TEST(read_int(innermost, stream) == 0);
}

// ---- if_else and switch --------------------------------------------------------------------------

TP_GPU_TEST(if_else_runs_exactly_one_branch) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> out(1, stream);
  tp::Graph graph;
  graph.capture([&] {
    graph.if_else_(
        pred, [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 1); },
        [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 2); });
  }, {.stream = stream});
  for (bool value : {true, false, true}) {
    write_flag(pred, value, stream);
    write_int(out, 0, stream);
    graph.replay(stream);
    BOOST_TEST(read_int(out, stream) == (value ? 1 : 2));
  }
}

TP_GPU_TEST(switch_runs_the_indexed_body_and_nothing_out_of_range) {
  tp::Stream stream;
  tp::DeviceTensor<int> index(1, stream);
  tp::DeviceTensor<int> out(1, stream);
  tp::Graph graph;
  graph.capture([&] {
    graph.switch_(
        index, [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 100); },
        [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 101); },
        [&] { set_int<<<1, 1, 0, tp::current_stream()>>>(out.data(), 102); });
  }, {.stream = stream});
  for (int i : {0, 1, 2, 3, -1, 1000, 2}) {
    write_int(index, i, stream);
    write_int(out, -7, stream);
    graph.replay(stream);
    const int expected = (i >= 0 && i < 3) ? 100 + i : -7;
    BOOST_TEST(read_int(out, stream) == expected, "index " << i);
  }
}

// ---- device-callable predicates -------------------------------------------------------------------

TP_GPU_TEST(device_callable_predicates_match_tensor_predicates) {
  tp::Stream stream;
  tp::DeviceTensor<int> k(1, stream);
  tp::DeviceTensor<int> iterations(1, stream);
  tp::DeviceTensor<int> gate(1, stream);
  tp::DeviceTensor<int> gated(1, stream);
  tp::DeviceTensor<int> which(1, stream);
  int* k_ptr = k.data();
  int* iter_ptr = iterations.data();
  const int* gate_ptr = gate.data();
  tp::Graph graph;
  graph.capture([&] {
    graph.while_([=] __device__ { return *k_ptr > 0; },
                 [&](tp::StreamRef s) {
                   count_down_only<<<1, 1, 0, s>>>(k_ptr, iter_ptr);
                 });
    graph.if_([=] __device__ { return *gate_ptr != 0; }, [&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(gated.data()); });
    graph.switch_([=] __device__ { return *gate_ptr; }, [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(which.data(), 10); },
                  [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(which.data(), 11); });
  }, {.stream = stream});
  for (int start : {0, 1, 7, 1000}) {
    write_int(k, start, stream);
    write_int(iterations, 0, stream);
    write_int(gate, start % 2, stream);
    write_int(gated, 0, stream);
    write_int(which, -1, stream);
    graph.replay(stream);
    BOOST_TEST(read_int(iterations, stream) == start);
    BOOST_TEST(read_int(gated, stream) == start % 2);
    BOOST_TEST(read_int(which, stream) == 10 + start % 2);
  }
}

// ---- debug dump -----------------------------------------------------------------------------------

TP_GPU_TEST(debug_dump_shows_conditional_nodes_and_their_bodies) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::Graph graph;
  graph.capture([&] {
    graph.if_(pred, [&](tp::StreamRef s) { only_in_the_body_marker<<<1, 1, 0, s>>>(counter.data()); });
  }, {.stream = stream});
  const auto path = tp_test::temp_path("cond.dot");
  graph.debug_dump(path);
  const std::string dot = tp_test::read_file(path);
  std::string lower = dot;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  BOOST_TEST(lower.find("conditional") != std::string::npos, dot);
  BOOST_TEST(dot.find("only_in_the_body_marker") != std::string::npos, dot);
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_SUITE_END()
