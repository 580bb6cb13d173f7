// Tests for RandomState (tensorplay/random.hpp, random.cuh, detail/random_*.hpp): numbers that
// change at every replay and every loop iteration, equal bit for bit to an eager run of the same
// launches in the same order, with every feature that captures (conditional bodies, update,
// GraphBuckets, PiecewiseGraph, stage_and_launch, raw captures), reseeding, lifetimes and threads.
#include "support.hpp"

#include <tensorplay/graph.hpp>
#include <tensorplay/random.cuh>

#include <boost/test/unit_test.hpp>

#include <curand_kernel.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace tp = tensorplay;

namespace {

// The guide's example (docs/guide.md, "Random numbers"), verbatim: its kernel here, the rest in
// guide_example_draws_fresh_numbers_at_every_replay_and_iteration.
__global__ void dropout(float* x, std::size_t n, float p, tp::PhiloxArgs philox) {  // nvcc: <tensorplay/random.cuh>
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const tp::PhiloxSeedOffset so = tp::unpack(philox);  // read on the GPU when the kernel runs
  curandStatePhilox4_32_10_t state;
  curand_init(so.seed, i, so.offset, &state);          // subsequence i, past what earlier launches took
  if (i < n && curand_uniform(&state) < p) x[i] = 0.0f;
}

__global__ void count_down(int* left, bool* more) {
  *left -= 1;
  *more = *left > 0;
}

// Thread i writes numbers 0..k-1 of subsequence i past the launch's offset: out[i * k + j]. A
// launch takes k offsets. `row` (when given) picks the row of out, n * k numbers each.
__global__ void draw_kernel(float* out, const int* row, std::size_t n, unsigned k, tp::PhiloxArgs args) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  if (row != nullptr) out += static_cast<std::size_t>(*row) * n * k;
  const tp::PhiloxSeedOffset so = tp::unpack(args);
  curandStatePhilox4_32_10_t state;
  curand_init(so.seed, i, so.offset, &state);
  for (unsigned j = 0; j < k; ++j) out[i * k + j] = curand_uniform(&state);
}

__global__ void start_loop(int* row, bool* more) {
  *row = 0;
  *more = true;
}
__global__ void next_row(int* row, bool* more, int rows) {
  *row += 1;
  *more = *row < rows;
}
__global__ void add_uniform(const float* in, float* out, std::size_t n, tp::PhiloxArgs args) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const tp::PhiloxSeedOffset so = tp::unpack(args);
  curandStatePhilox4_32_10_t state;
  curand_init(so.seed, i, so.offset, &state);
  out[i] = in[i] + curand_uniform(&state);
}

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

void draw(float* out, std::size_t n, unsigned k, tp::PhiloxArgs args, cudaStream_t s, const int* row = nullptr) {
  draw_kernel<<<blocks(n), 256, 0, s>>>(out, row, n, k, args);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

void copy(float* dst, const float* src, std::size_t count, cudaStream_t s) {
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
}

std::vector<float> host(const tp::DeviceTensor<float>& t, cudaStream_t s) { return tp_test::host_copy(t.data(), t.size(), s); }

//! Appends `count` numbers at `device` to `to`, copied once `s` reached them.
void append_host(std::vector<float>& to, const float* device, std::size_t count, cudaStream_t s) {
  const std::vector<float> v = tp_test::host_copy(device, count, s);
  to.insert(to.end(), v.begin(), v.end());
}

//! Appends all of `t` to `to`.
void append_host(std::vector<float>& to, const tp::DeviceTensor<float>& t, cudaStream_t s) { append_host(to, t.data(), t.size(), s); }

//! The numbers draw(out, n, k, ...) gives for each k of `ks` in turn, drawn eagerly from a fresh
//! RandomState(seed) (next() on the current stream, which must be `s`): n * k a launch, end to end.
std::vector<float> eager_draws(std::uint64_t seed, const std::vector<std::size_t>& ks, float* out, std::size_t n, cudaStream_t s) {
  tp::RandomState eager_rng(seed);
  std::vector<float> eager;
  for (const std::size_t k : ks) {
    draw(out, n, static_cast<unsigned>(k), eager_rng.next(k), s);
    append_host(eager, out, n * k, s);
  }
  return eager;
}

//! `out` on the host after each of `times` calls of `step(i)`, end to end.
template <class Step>
std::vector<float> after_each(int times, const tp::DeviceTensor<float>& out, cudaStream_t s, Step&& step) {
  std::vector<float> all;
  for (int i = 0; i < times; ++i) {
    step(i);
    append_host(all, out, s);
  }
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rows of `width` numbers of `v`, as a set: its size is the number of distinct rows.
std::set<std::vector<float>> rows_of(const std::vector<float>& v, std::size_t width) {
  std::set<std::vector<float>> rows;
  for (std::size_t at = 0; at + width <= v.size(); at += width) rows.emplace(v.begin() + at, v.begin() + at + width);
  return rows;
}

// A stream made current for the test, so that next() and the launches use it.
struct Current {
  tp::Stream stream;
  tp::StreamGuard guard{stream};
};

}  // namespace

BOOST_AUTO_TEST_SUITE(random_state)

BOOST_AUTO_TEST_CASE(a_state_without_a_gpu_throws_cuda_error, *boost::unit_test::precondition(tp_test::NeedsNoGpu{})) {
  BOOST_CHECK_THROW(tp::RandomState(1), tp::cuda_error);
}

TP_GPU_TEST(a_thousand_replays_all_differ_and_equal_the_eager_run_bit_for_bit) {
  Current c;
  constexpr std::size_t n = 256;
  constexpr int replays = 1000;
  tp::DeviceTensor<float> out(n, c.stream);
  tp::DeviceTensor<float> replayed(n * replays, c.stream);
  tp::DeviceTensor<float> eager(n * replays, c.stream);
  tp::RandomState graph_rng(42);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { draw(out.data(), n, 1, graph_rng.next(1), s); }, {.stream = c.stream});
  for (int r = 0; r < replays; ++r) {
    graph.replay(c.stream);
    copy(replayed.data() + r * n, out.data(), n, c.stream);
  }
  tp::RandomState eager_rng(42);
  for (int r = 0; r < replays; ++r) draw(eager.data() + r * n, n, 1, eager_rng.next(1), c.stream);
  const std::vector<float> a = host(replayed, c.stream);
  BOOST_TEST(same_bits(a, host(eager, c.stream)));
  BOOST_TEST(rows_of(a, n).size() == static_cast<std::size_t>(replays));
  BOOST_TEST(graph_rng.offset() == static_cast<std::uint64_t>(replays));
  BOOST_TEST(eager_rng.offset() == static_cast<std::uint64_t>(replays));
  BOOST_TEST(graph_rng.seed() == 42u);
}

TP_GPU_TEST(a_while_body_draws_fresh_numbers_at_every_iteration_in_eager_order) {
  Current c;
  constexpr std::size_t n = 128;
  constexpr int iterations = 5;
  constexpr int replays = 3;
  constexpr std::size_t per_replay = n * (iterations + 2);  // one row before the loop, one after
  tp::DeviceTensor<float> before(n, c.stream);
  tp::DeviceTensor<float> loop(n * iterations, c.stream);
  tp::DeviceTensor<float> after(n, c.stream);
  tp::DeviceTensor<int> row(1, c.stream);
  tp::DeviceTensor<bool> more(1, c.stream);
  tp::DeviceTensor<float> replayed(per_replay * replays, c.stream);
  tp::RandomState rng(7);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    draw(before.data(), n, 1, rng.next(1), s);
    start_loop<<<1, 1, 0, s>>>(row.data(), more.data());
    graph.while_(more, [&](tp::StreamRef body) {
      draw(loop.data(), n, 1, rng.next(1), body, row.data());
      next_row<<<1, 1, 0, body>>>(row.data(), more.data(), iterations);
    });
    draw(after.data(), n, 1, rng.next(1), s);
  }, {.stream = c.stream});
  for (int r = 0; r < replays; ++r) {
    graph.replay(c.stream);
    float* at = replayed.data() + r * per_replay;
    copy(at, before.data(), n, c.stream);
    copy(at + n, loop.data(), n * iterations, c.stream);
    copy(at + n * (iterations + 1), after.data(), n, c.stream);
  }
  tp::DeviceTensor<float> eager(per_replay * replays, c.stream);
  tp::RandomState eager_rng(7);
  for (std::size_t r = 0; r < per_replay * replays / n; ++r) draw(eager.data() + r * n, n, 1, eager_rng.next(1), c.stream);
  const std::vector<float> a = host(replayed, c.stream);
  BOOST_TEST(same_bits(a, host(eager, c.stream)));
  BOOST_TEST(rows_of(a, n).size() == static_cast<std::size_t>(replays * (iterations + 2)));
  BOOST_TEST(rng.offset() == static_cast<std::uint64_t>(replays * (iterations + 2)));
}

TP_GPU_TEST(two_graphs_sharing_a_state_replayed_interleaved_equal_the_eager_interleaving) {
  Current c;
  constexpr std::size_t n1 = 300;
  constexpr std::size_t n2 = 64;
  tp::DeviceTensor<float> a(n1 * 2, c.stream);
  tp::DeviceTensor<float> b(n2 * 3 + n2 * 5, c.stream);
  tp::RandomState rng(99);
  tp::Graph g1;
  tp::Graph g2;
  g1.capture([&](tp::StreamRef s) { draw(a.data(), n1, 2, rng.next(2), s); }, {.stream = c.stream});
  // Two draws in one segment: the second takes its offsets past the first's.
  g2.capture([&](tp::StreamRef s) {
    draw(b.data(), n2, 3, rng.next(3), s);
    draw(b.data() + n2 * 3, n2, 5, rng.next(5), s);
  }, {.stream = c.stream});
  const std::vector<int> order = {1, 2, 2, 1, 1, 2, 1, 2, 2, 2, 1};
  std::vector<float> replayed;
  std::vector<float> eager;
  for (int which : order) {
    (which == 1 ? g1 : g2).replay(c.stream);
    append_host(replayed, which == 1 ? a : b, c.stream);
  }
  tp::RandomState eager_rng(99);
  for (int which : order) {
    if (which == 1) {
      draw(a.data(), n1, 2, eager_rng.next(2), c.stream);
    } else {
      draw(b.data(), n2, 3, eager_rng.next(3), c.stream);
      draw(b.data() + n2 * 3, n2, 5, eager_rng.next(5), c.stream);
    }
    append_host(eager, which == 1 ? a : b, c.stream);
  }
  BOOST_TEST(same_bits(replayed, eager));
  BOOST_TEST(rng.offset() == eager_rng.offset());
}

TP_GPU_TEST(update_keeps_drawing_from_the_state_in_place_and_recompiled) {
  Current c;
  constexpr std::size_t n = 200;
  tp::DeviceTensor<float> x(n * 3, c.stream);
  tp::DeviceTensor<float> y(n * 3, c.stream);
  tp::RandomState rng(5);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { draw(x.data(), n, 1, rng.next(1), s); }, {.stream = c.stream});
  std::vector<float> replayed;
  auto run = [&](const tp::DeviceTensor<float>& out, std::size_t count) {
    graph.replay(c.stream);
    append_host(replayed, out.data(), count, c.stream);
  };
  run(x, n);
  run(x, n);
  // A new pointer and a new increment: patched in place.
  const tp::UpdateResult in_place = graph.update([&](tp::StreamRef s) { draw(y.data(), n, 2, rng.next(2), s); });
  BOOST_TEST((in_place.outcome == tp::UpdateOutcome::Updated));
  run(y, n * 2);
  run(y, n * 2);
  // Two kernels in place of one: compiled again.
  const tp::UpdateResult again = graph.update([&](tp::StreamRef s) {
    draw(x.data(), n, 1, rng.next(1), s);
    draw(y.data(), n, 3, rng.next(3), s);
  });
  BOOST_TEST((again.outcome == tp::UpdateOutcome::Reinstantiated));
  for (int r = 0; r < 2; ++r) {
    graph.replay(c.stream);
    append_host(replayed, x.data(), n, c.stream);
    append_host(replayed, y.data(), n * 3, c.stream);
  }
  BOOST_TEST(same_bits(replayed, eager_draws(5, {1, 1, 2, 2, 1, 3, 1, 3}, x.data(), n, c.stream)));
}

TP_GPU_TEST(buckets_of_different_sizes_draw_from_one_state_in_run_order) {
  Current c;
  constexpr std::size_t n = 64;
  tp::DeviceTensor<float> out(n * 8, c.stream);
  tp::RandomState rng(123);
  // Each bucket draws `size` numbers per thread: buckets take different increments.
  tp::GraphBuckets buckets(std::vector<std::size_t>{1, 2, 4, 8}, [&](tp::StreamRef s, std::size_t size) {
    draw(out.data(), n, static_cast<unsigned>(size), rng.next(size), s);
  });
  std::vector<float> replayed;
  std::vector<std::size_t> ran;
  for (std::size_t batch : {3, 1, 8, 4, 2, 3, 1, 7}) {
    const std::size_t size = buckets.run(batch, c.stream);
    ran.push_back(size);
    append_host(replayed, out.data(), n * size, c.stream);
  }
  BOOST_TEST(same_bits(replayed, eager_draws(123, ran, out.data(), n, c.stream)));
}

TP_GPU_TEST(piecewise_segments_and_eager_steps_draw_in_replay_order) {
  Current c;
  constexpr std::size_t n = 96;
  tp::DeviceTensor<float> out(n * 3, c.stream);
  tp::RandomState rng(31);
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { draw(out.data(), n, 1, rng.next(1), s); }, {.stream = c.stream});
  pieces.eager([&](tp::StreamRef s) { draw(out.data() + n, n, 1, rng.next(1), s); });  // drawn at every replay
  pieces.capture([&](tp::StreamRef s) { draw(out.data() + 2 * n, n, 1, rng.next(1), s); }, {.stream = c.stream});
  const std::vector<float> replayed = after_each(3, out, c.stream, [&](int) { pieces.replay(c.stream); });
  tp::RandomState eager_rng(31);
  tp::DeviceTensor<float> eager(n * 9, c.stream);
  for (std::size_t r = 0; r < 9; ++r) draw(eager.data() + r * n, n, 1, eager_rng.next(1), c.stream);
  BOOST_TEST(same_bits(replayed, host(eager, c.stream)));
}

TP_GPU_TEST(stage_and_launch_draws_fresh_numbers_at_every_call) {
  Current c;
  constexpr std::size_t n = 512;
  tp::DeviceTensor<float> static_in(n, c.stream);
  tp::DeviceTensor<float> out(n, c.stream);
  tp::RandomState rng(8);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    add_uniform<<<blocks(n), 256, 0, s>>>(static_in.data(), out.data(), n, rng.next(1));
  }, {.stream = c.stream});
  std::vector<tp::DeviceTensor<float>> inputs;
  inputs.reserve(4);
  const std::vector<float> staged = after_each(4, out, c.stream, [&](int call) {
    inputs.emplace_back(n, c.stream);
    tp_test::fill(inputs.back().data(), n, static_cast<float>(call), c.stream.get());
    graph.stage_and_launch(std::tie(static_in), std::tie(inputs.back()), c.stream);
  });
  tp::RandomState eager_rng(8);
  const std::vector<float> eager = after_each(4, out, c.stream, [&](int call) {
    add_uniform<<<blocks(n), 256, 0, c.stream>>>(inputs[call].data(), out.data(), n, eager_rng.next(1));
  });
  BOOST_TEST(same_bits(staged, eager));
}

TP_GPU_TEST(set_seed_restarts_eager_draws_and_graphs_captured_before) {
  Current c;
  constexpr std::size_t n = 128;
  tp::DeviceTensor<float> out(n, c.stream);
  tp::DeviceTensor<float> scratch(n, c.stream);
  tp::RandomState rng(1);
  draw(scratch.data(), n, 1, rng.next(1), c.stream);
  draw(scratch.data(), n, 1, rng.next(1), c.stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { draw(out.data(), n, 1, rng.next(1), s); }, {.stream = c.stream});
  graph.replay(c.stream);
  c.stream.synchronize();  // offset() waits for eager draws, not for replays
  BOOST_TEST(rng.offset() == 3u);
  rng.set_seed(9);
  BOOST_TEST(rng.seed() == 9u);
  BOOST_TEST(rng.offset() == 0u);
  graph.replay(c.stream);
  const std::vector<float> replayed = host(out, c.stream);
  draw(out.data(), n, 1, rng.next(1), c.stream);
  const std::vector<float> eager_after = host(out, c.stream);
  tp::RandomState fresh(9);
  draw(out.data(), n, 1, fresh.next(1), c.stream);
  BOOST_TEST(same_bits(replayed, host(out, c.stream)));
  draw(out.data(), n, 1, fresh.next(1), c.stream);
  BOOST_TEST(same_bits(eager_after, host(out, c.stream)));
  BOOST_TEST(rng.offset() == 2u);
}

TP_GPU_TEST(graphs_keep_drawing_after_their_state_is_destroyed) {
  Current c;
  constexpr std::size_t n = 128;
  tp::DeviceTensor<float> out(n, c.stream);
  tp::Graph graph;
  {
    tp::RandomState rng(77);
    graph.capture([&](tp::StreamRef s) { draw(out.data(), n, 2, rng.next(2), s); }, {.stream = c.stream});
  }
  const std::vector<float> replayed = after_each(3, out, c.stream, [&](int) { graph.replay(c.stream); });
  // A new state gets a new counter (the old one is still the graph's) and possibly the old ring.
  tp::RandomState eager_rng(77);
  const std::vector<float> eager = after_each(3, out, c.stream, [&](int) { draw(out.data(), n, 2, eager_rng.next(2), c.stream); });
  BOOST_TEST(same_bits(replayed, eager));
}

TP_GPU_TEST(a_graph_destroyed_while_its_replays_run_leaves_the_sequence_consistent) {
  Current c;
  constexpr std::size_t n = 128;
  tp::DeviceTensor<float> out(n, c.stream);
  tp::RandomState rng(3);
  {
    tp::Graph graph;
    graph.capture([&](tp::StreamRef s) {
      tp_test::spin_kernel<<<1, 1, 0, s>>>(5'000'000);  // 5 ms
      draw(out.data(), n, 1, rng.next(1), s);
    }, {.stream = c.stream});
    for (int r = 0; r < 6; ++r) graph.replay(c.stream);
  }  // destroyed with replays in flight
  draw(out.data(), n, 1, rng.next(1), c.stream);  // the 7th draw, after the replays on the stream
  const std::vector<float> seventh = host(out, c.stream);
  BOOST_TEST(rng.offset() == 7u);
  tp::RandomState reference(3);
  for (int r = 0; r < 7; ++r) draw(out.data(), n, 1, reference.next(1), c.stream);
  BOOST_TEST(same_bits(seventh, host(out, c.stream)));
}

TP_GPU_TEST(misuse_throws_usage_error_and_leaves_nothing_capturing) {
  Current c;
  tp::RandomState rng(1);
  tp::RandomState moved = std::move(rng);
  BOOST_CHECK_THROW((void)rng.next(1), tp::usage_error);  // NOLINT: testing use after move
  BOOST_CHECK_THROW((void)rng.offset(), tp::usage_error);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.capture([&] { moved.set_seed(2); }, {.stream = c.stream}), tp::usage_error);
  BOOST_TEST(tp_test::not_capturing(c.stream));
  BOOST_TEST(moved.seed() == 1u);
  tp::DeviceTensor<float> out(32, c.stream);
  graph.capture([&](tp::StreamRef s) { draw(out.data(), 32, 1, moved.next(1), s); }, {.stream = c.stream});
  graph.replay(c.stream);
  c.stream.synchronize();
  BOOST_TEST(moved.offset() == 1u);
}

TP_GPU_TEST(a_raw_capture_draws_with_the_stream_given) {
  tp::Stream stream;  // not current: next(k, stream) names it
  constexpr std::size_t n = 64;
  tp::DeviceTensor<float> out(n, stream);
  tp::RandomState rng(55);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  draw(out.data(), n, 1, rng.next(1, stream), stream);
  draw(out.data(), n, 1, rng.next(1, stream), stream);  // same segment: overwrites with the next offset
  BOOST_REQUIRE_EQUAL(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const std::vector<float> replayed =
      after_each(3, out, stream, [&](int) { BOOST_REQUIRE_EQUAL(cudaGraphLaunch(exec, stream), cudaSuccess); });
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  tp::RandomState eager_rng(55);
  const std::vector<float> eager = after_each(3, out, stream, [&](int) {
    draw(out.data(), n, 1, eager_rng.next(1, stream), stream);
    draw(out.data(), n, 1, eager_rng.next(1, stream), stream);
  });
  BOOST_TEST(same_bits(replayed, eager));
}

TP_GPU_TEST(threads_drawing_from_one_state_never_share_an_offset) {
  constexpr std::size_t n = 64;
  constexpr int draws = 300;  // past a lap of the eager ring
  tp::RandomState rng(2024);
  std::vector<tp::DeviceTensor<float>> outs;
  std::vector<tp::Stream> streams(2);
  for (int t = 0; t < 2; ++t) outs.emplace_back(n * draws, streams[t]);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      tp::StreamGuard guard(streams[t]);
      for (int d = 0; d < draws; ++d) {
        draw_kernel<<<blocks(n), 256, 0, streams[t]>>>(outs[t].data() + d * n, nullptr, n, 1, rng.next(1));
        // Eager slots are reused 256 draws later: neither stream may lag that far behind the other.
        if (d % 50 == 49) streams[t].synchronize();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<float> all = host(outs[0], streams[0]);
  append_host(all, outs[1], streams[1]);
  BOOST_TEST(rows_of(all, n).size() == static_cast<std::size_t>(2 * draws));
  BOOST_TEST(rng.offset() == static_cast<std::uint64_t>(2 * draws));
}

TP_GPU_TEST(ten_million_uniforms_have_the_mean_and_variance_of_uniform_0_1) {
  Current c;
  constexpr std::size_t threads = 2'500'000;
  constexpr unsigned k = 4;
  constexpr double count = static_cast<double>(threads) * k;
  tp::DeviceTensor<float> out(threads * k, c.stream);
  tp::RandomState rng(31337);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { draw(out.data(), threads, k, rng.next(k), s); }, {.stream = c.stream});
  graph.replay(c.stream);
  graph.replay(c.stream);  // the second replay's numbers
  const std::vector<float> v = host(out, c.stream);
  double sum = 0;
  for (float x : v) sum += x;
  const double mean = sum / count;
  double squares = 0;
  for (float x : v) squares += (x - mean) * (x - mean);
  const double variance = squares / (count - 1);
  // Uniform(0, 1): mean 1/2, variance 1/12; the sample mean's sigma is sqrt(1/12 / N), the sample
  // variance's sqrt((1/80 - 1/144) / N) = sqrt(1/180 / N).
  BOOST_TEST(std::abs(mean - 0.5) < 4 * std::sqrt(1.0 / 12 / count));
  BOOST_TEST(std::abs(variance - 1.0 / 12) < 4 * std::sqrt(1.0 / 180 / count));
}

TP_GPU_TEST(guide_example_draws_fresh_numbers_at_every_replay_and_iteration) {
  tp::Stream stream;
  constexpr std::size_t n = 4096;
  const unsigned blocks = 16;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<int> left(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::StreamGuard guard(stream);
  auto restart = [&](cudaStream_t s) {  // x = 1, and 3 iterations of the loop
    tp_test::fill(x.data(), n, 1.0f, s);
    tp_test::fill(left.data(), 1, 3, s);
    tp_test::fill(more.data(), 1, true, s);
  };
  restart(stream);
  // docs/guide.md, "Random numbers", verbatim from here ...
  tp::RandomState rng(2026);                             // one Philox sequence on the current device
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    dropout<<<blocks, 256, 0, s>>>(x.data(), n, 0.1f, rng.next(1));          // one number per thread
    graph.while_(more, [&](tp::StreamRef body) {
      dropout<<<blocks, 256, 0, body>>>(x.data(), n, 0.1f, rng.next(1));     // fresh at every iteration
      count_down<<<1, 1, 0, body>>>(left.data(), more.data());
    });
  }, {.stream = stream});
  graph.replay(stream);                                  // new numbers at every replay, no host work
  // ... to here.
  // The test: two more replays of 1 + 3 dropouts each, against the same dropouts run eagerly.
  restart(stream);
  std::vector<float> replayed;
  for (int r = 0; r < 2; ++r) {
    graph.replay(stream);
    append_host(replayed, x, stream);
    restart(stream);
  }
  tp::RandomState eager_rng(2026);
  (void)eager_rng.next(4);  // the first replay: one draw and three iterations
  std::vector<float> eager;
  for (int r = 0; r < 2; ++r) {
    for (int d = 0; d < 4; ++d) dropout<<<blocks, 256, 0, stream>>>(x.data(), n, 0.1f, eager_rng.next(1));
    append_host(eager, x, stream);
    restart(stream);
  }
  BOOST_TEST(same_bits(replayed, eager));
  BOOST_TEST(!same_bits(std::vector<float>(replayed.begin(), replayed.begin() + n), std::vector<float>(replayed.begin() + n, replayed.end())));
}

BOOST_AUTO_TEST_SUITE_END()
