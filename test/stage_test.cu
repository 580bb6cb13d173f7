// Tests for stage_and_launch (graph/graph.hpp, detail/staging.hpp) and graph/make_graphed.hpp.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda/std/mdspan>
#include <cuda_fp16.h>
#include <thrust/device_vector.h>

#include <array>
#include <numeric>
#include <span>
#include <tuple>
#include <vector>

namespace tp = tensorplay;

namespace {
template <class T>
__global__ void accumulate(const T* in, float* acc, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    acc[i] += static_cast<float>(in[i]);
}

template <class T>
std::vector<T> iota_vector(std::size_t n, T start) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i % 1000));
  return v;
}

template <class T>
tp::DeviceTensor<T> device_copy(const std::vector<T>& host, tp::StreamRef s) {
  tp::DeviceTensor<T> t(host.size(), s);
  t.copy_from_host(host, s);
  return t;
}

// A graph that computes out_k = 2 * static_k + k for every static buffer.
template <std::size_t N>
struct AffineGraph {
  std::size_t n;
  std::array<tp::DeviceTensor<float>, N> statics;
  std::array<tp::DeviceTensor<float>, N> outs;
  tp::Graph graph;

  AffineGraph(std::size_t size, tp::StreamRef s) : n(size) {
    for (auto& t : statics) {
      t = tp::DeviceTensor<float>(n, s);
      tp_test::fill(t.data(), n, -1.0f, s);
    }
    graph.capture([&](tp::StreamRef cs) {
      for (std::size_t k = 0; k < N; ++k) {
        outs[k] = tp::DeviceTensor<float>(n, cs);
        tp_test::affine(statics[k].data(), outs[k].data(), n, 2.0f, static_cast<float>(k), cs);
      }
    }, {.stream = s});
  }

  auto static_tuple() {
    return [&]<std::size_t... k>(std::index_sequence<k...>) { return std::tie(statics[k]...); }(std::make_index_sequence<N>{});
  }
};

template <std::size_t N>
void check_matches_eager(std::size_t n) {
  tp::Stream stream;
  AffineGraph<N> g(n, stream);
  std::array<tp::DeviceTensor<float>, N> inputs;
  std::array<std::vector<float>, N> host;
  for (std::size_t k = 0; k < N; ++k) {
    host[k] = iota_vector<float>(n, static_cast<float>(10 * k));
    inputs[k] = device_copy(host[k], stream);
  }
  auto input_tuple = [&]<std::size_t... k>(std::index_sequence<k...>) { return std::tie(inputs[k]...); }(std::make_index_sequence<N>{});
  g.graph.stage_and_launch(g.static_tuple(), input_tuple, stream);
  for (std::size_t k = 0; k < N; ++k) {
    const auto out = g.outs[k].to_host(stream);
    for (std::size_t i = 0; i < n; i += n / 7 + 1) BOOST_TEST(out[i] == 2 * host[k][i] + static_cast<float>(k), "k " << k << " i " << i);
    BOOST_TEST(out[n - 1] == 2 * host[k][n - 1] + static_cast<float>(k));
  }
}
}  // namespace

BOOST_AUTO_TEST_SUITE(stage)

TP_GPU_TEST(one_input_matches_eager_execution) { check_matches_eager<1>(100003); }
TP_GPU_TEST(four_inputs_match_eager_execution) { check_matches_eager<4>(65536); }
TP_GPU_TEST(thirty_two_inputs_match_eager_execution) { check_matches_eager<32>(4099); }
TP_GPU_TEST(seventy_inputs_beyond_one_copy_table_match_eager_execution) { check_matches_eager<70>(513); }

TP_GPU_TEST(every_fallback_kind_and_fast_pairs_mixed_in_one_call_match_eager_execution) {
  tp::Stream stream;
  const std::size_t n = 6 * 5;
  // Static buffers: all float except one half.
  tp::DeviceTensor<float> s_fast(n, stream), s_convert(n, stream), s_strided(n, stream), s_pinned(n, stream),
      s_pageable(n, stream), s_host_convert(n, stream), s_vector(n, stream);
  tp::DeviceTensor<__half> s_half(n, stream);
  tp::DeviceTensor<float> acc(8 * n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp_test::fill(acc.data(), acc.size(), 0.0f, s);
    const float* all[] = {s_fast.data(), s_convert.data(), s_strided.data(), s_pinned.data(),
                          s_pageable.data(), s_host_convert.data(), s_vector.data()};
    for (int k = 0; k < 7; ++k) accumulate<<<1, 256, 0, s>>>(all[k], acc.data() + k * n, n);
    accumulate<<<1, 256, 0, s>>>(s_half.data(), acc.data() + 7 * n, n);
  }, {.stream = stream});

  const std::vector<float> expected = iota_vector<float>(n, 3.0f);
  // fast: same type, contiguous, same device
  tp::DeviceTensor<float> fast = device_copy(expected, stream);
  // convert: int32 -> float on the device
  std::vector<int> ints(n);
  for (std::size_t i = 0; i < n; ++i) ints[i] = static_cast<int>(expected[i]);
  tp::DeviceTensor<int> as_int = device_copy(ints, stream);
  // strided: a 6 x 5 layout_stride view taking every second column of a 6 x 10 array
  std::vector<float> wide(2 * n, -100.0f);
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t c = 0; c < 5; ++c) wide[r * 10 + 2 * c] = expected[r * 5 + c];
  tp::DeviceTensor<float> wide_device = device_copy(wide, stream);
  using Strided = cuda::std::mdspan<float, cuda::std::dextents<int, 2>, cuda::std::layout_stride>;
  const cuda::std::array<int, 2> strides{10, 2};
  Strided strided(wide_device.data(), Strided::mapping_type(cuda::std::dextents<int, 2>(6, 5), strides));
  // pinned host, pageable host, host with conversion (double -> float)
  float* pinned = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMallocHost(&pinned, n * sizeof(float)), cudaSuccess);
  std::copy(expected.begin(), expected.end(), pinned);
  std::span<float> pinned_span(pinned, n);
  std::vector<float> pageable = expected;
  std::span<float> pageable_span(pageable);
  std::vector<double> doubles(expected.begin(), expected.end());
  std::span<double> double_span(doubles);
  // a thrust::device_vector input (fast path through a pointer query) and a float -> half conversion
  thrust::device_vector<float> vector_input(expected.begin(), expected.end());
  tp::DeviceTensor<float> to_half = device_copy(expected, stream);

  graph.stage_and_launch(std::tie(s_fast, s_convert, s_strided, s_pinned, s_pageable, s_host_convert, s_vector, s_half),
                         std::tie(fast, as_int, strided, pinned_span, pageable_span, double_span, vector_input, to_half),
                         stream);
  const auto result = acc.to_host(stream);
  for (int k = 0; k < 8; ++k)
    for (std::size_t i = 0; i < n; ++i) BOOST_TEST(result[k * n + i] == expected[i], "pair " << k << " element " << i);
  BOOST_REQUIRE_EQUAL(cudaFreeHost(pinned), cudaSuccess);
}

TP_GPUS_TEST(input_on_another_gpu_is_copied_peer_to_peer, 2) {
  tp::Stream stream;
  const std::size_t n = 1 << 16;
  tp::DeviceTensor<float> s_same(n, stream);
  tp::DeviceTensor<float> s_convert(n, stream);
  tp::DeviceTensor<float> sum(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp_test::fill(sum.data(), n, 0.0f, s);
    accumulate<<<64, 256, 0, s>>>(s_same.data(), sum.data(), n);
    accumulate<<<64, 256, 0, s>>>(s_convert.data(), sum.data(), n);
  }, {.stream = stream});
  const std::vector<float> values = iota_vector<float>(n, 1.0f);
  std::vector<int> ints(values.begin(), values.end());
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  tp::Stream other(1);
  tp::DeviceTensor<float> remote = device_copy(values, other);
  tp::DeviceTensor<int> remote_int = device_copy(ints, other);
  other.synchronize();
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  graph.stage_and_launch(std::tie(s_same, s_convert), std::tie(remote, remote_int), stream);
  const auto out = sum.to_host(stream);
  for (std::size_t i = 0; i < n; i += 997) BOOST_TEST(out[i] == 2 * values[i]);
}

TP_GPU_TEST(input_that_is_the_static_buffer_itself_is_skipped) {
  tp::Stream stream;
  AffineGraph<2> g(1000, stream);
  tp_test::fill(g.statics[0].data(), 1000, 4.0f, stream);
  tp::DeviceTensor<float> other = device_copy(std::vector<float>(1000, 6.0f), stream);
  g.graph.stage_and_launch(std::tie(g.statics[0], g.statics[1]), std::tie(g.statics[0], other), stream);
  BOOST_TEST(g.outs[0].to_host(stream)[999] == 8.0f);   // 2 * 4 + 0: the static buffer kept its data
  BOOST_TEST(g.outs[1].to_host(stream)[999] == 13.0f);  // 2 * 6 + 1
}

TP_GPU_TEST(thousand_back_to_back_calls_each_see_their_own_inputs) {
  tp::Stream stream;
  const std::size_t n = 4096;
  constexpr int calls = 1000;
  tp::DeviceTensor<float> s_x(n, stream);
  tp::DeviceTensor<float> s_y(n, stream);
  tp::DeviceTensor<float> acc;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    acc = tp::DeviceTensor<float>(2 * n, s);  // the graph's own buffer
    accumulate<<<16, 256, 0, s>>>(s_x.data(), acc.data(), n);
    accumulate<<<16, 256, 0, s>>>(s_y.data(), acc.data() + n, n);
  }, {.stream = stream});
  tp_test::fill(acc.data(), 2 * n, 0.0f, stream);
  std::vector<tp::DeviceTensor<float>> xs;
  std::vector<tp::DeviceTensor<float>> ys;
  for (int i = 0; i < calls; ++i) {
    xs.emplace_back(n, stream);
    ys.emplace_back(n, stream);
    tp_test::fill(xs.back().data(), n, static_cast<float>(i), stream);
    tp_test::fill(ys.back().data(), n, static_cast<float>(2 * i + 1), stream);
  }
  stream.synchronize();
  for (int i = 0; i < calls; ++i) graph.stage_and_launch(std::tie(s_x, s_y), std::tie(xs[i], ys[i]), stream);
  const auto out = acc.to_host(stream);
  const float sum_x = calls * (calls - 1) / 2.0f;  // 0 + 1 + ... + 999
  const float sum_y = calls * static_cast<float>(calls);  // 1 + 3 + ... + 1999
  BOOST_TEST(out[0] == sum_x);
  BOOST_TEST(out[n - 1] == sum_x);
  BOOST_TEST(out[n] == sum_y);
  BOOST_TEST(out[2 * n - 1] == sum_y);
}

// ---- the staging ring: calls queued behind a busy GPU --------------------------------------------

namespace {
// A graph that adds its static buffer into an accumulator: out[i] += static[i].
struct AccumulatingGraph {
  std::size_t n;
  tp::DeviceTensor<float> input;
  tp::DeviceTensor<float> acc;
  tp::Graph graph;
  AccumulatingGraph(std::size_t size, tp::StreamRef s) : n(size), input(size, s), acc(size, s) {
    tp_test::fill(input.data(), n, 0.0f, s);
    tp_test::fill(acc.data(), n, 0.0f, s);
    graph.capture([&](tp::StreamRef cs) { accumulate<<<8, 256, 0, cs>>>(input.data(), acc.data(), n); }, {.stream = s});
  }
};

// Fresh inputs 1, 2, ..., calls.
std::vector<tp::DeviceTensor<float>> numbered_inputs(int calls, std::size_t n, tp::StreamRef s) {
  std::vector<tp::DeviceTensor<float>> xs;
  for (int i = 0; i < calls; ++i) {
    xs.emplace_back(n, s);
    tp_test::fill(xs.back().data(), n, static_cast<float>(i + 1), s);
  }
  return xs;
}
}  // namespace

TP_GPU_TEST(calls_queued_beyond_the_ring_behind_a_busy_gpu_each_copy_their_own_inputs) {
  // 200 calls while the stream spins: the ring (config::staging_ring_slots) fills, and later
  // calls copy with a launch of their own. Every call must add exactly its own input.
  tp::Stream stream;
  AccumulatingGraph g(1000, stream);
  constexpr int calls = 200;
  static_assert(calls > tp::config::staging_ring_slots);
  auto xs = numbered_inputs(calls, g.n, stream);
  stream.synchronize();
  tp_test::spin_kernel<<<1, 1, 0, stream>>>(200'000'000);  // 200 ms
  for (int i = 0; i < calls; ++i) g.graph.stage_and_launch(std::tie(g.input), std::tie(xs[i]), stream);
  const auto out = g.acc.to_host(stream);
  const float expected = calls * (calls + 1) / 2.0f;
  BOOST_TEST(out[0] == expected);
  BOOST_TEST(out[g.n - 1] == expected);
}

TP_GPU_TEST(staged_calls_and_plain_replays_interleaved_behind_a_busy_gpu_copy_only_when_staged) {
  // Staged calls copy their input; plain replays between them must not copy again (the static
  // buffer keeps what the last staged call put there), whatever the ring holds.
  tp::Stream stream;
  AccumulatingGraph g(512, stream);
  constexpr int calls = 150;
  auto xs = numbered_inputs(calls, g.n, stream);
  stream.synchronize();
  tp_test::spin_kernel<<<1, 1, 0, stream>>>(100'000'000);
  float expected = 0;
  for (int i = 0; i < calls; ++i) {
    g.graph.stage_and_launch(std::tie(g.input), std::tie(xs[i]), stream);
    expected += static_cast<float>(i + 1);
    if (i % 3 == 0) {
      g.graph.replay(stream);  // adds input i + 1 once more
      expected += static_cast<float>(i + 1);
    }
  }
  const auto out = g.acc.to_host(stream);
  BOOST_TEST(out[0] == expected);
  BOOST_TEST(out[g.n - 1] == expected);
}

TP_GPU_TEST(static_buffers_that_change_between_queued_calls_each_get_their_calls_inputs) {
  // The node's plan (where each copy goes) changes while calls that used the old one wait.
  tp::Stream stream;
  const std::size_t n = 256;
  tp::DeviceTensor<float> a(n, stream);
  tp::DeviceTensor<float> b(n, stream);
  tp::DeviceTensor<float> acc(2 * n, stream);
  tp_test::fill(a.data(), n, 0.0f, stream);
  tp_test::fill(b.data(), n, 0.0f, stream);
  tp_test::fill(acc.data(), 2 * n, 0.0f, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    accumulate<<<4, 256, 0, s>>>(a.data(), acc.data(), n);
    accumulate<<<4, 256, 0, s>>>(b.data(), acc.data() + n, n);
  }, {.stream = stream});
  auto xs = numbered_inputs(40, n, stream);
  stream.synchronize();
  tp_test::spin_kernel<<<1, 1, 0, stream>>>(100'000'000);
  float sum_a = 0;  // what acc[0] must hold: a's value at every launch
  float sum_b = 0;
  float value_a = 0;
  float value_b = 0;
  for (int i = 0; i < 40; ++i) {
    const float x = static_cast<float>(i + 1);
    switch (i % 3) {
      case 0: graph.stage_and_launch(std::tie(a), std::tie(xs[i]), stream); value_a = x; break;
      case 1: graph.stage_and_launch(std::tie(b), std::tie(xs[i]), stream); value_b = x; break;
      default: graph.stage_and_launch(std::tie(b, a), std::tie(xs[i], xs[i - 1]), stream); value_b = x; value_a = x - 1;
    }
    sum_a += value_a;
    sum_b += value_b;
  }
  const auto out = acc.to_host(stream);
  BOOST_TEST(out[0] == sum_a);
  BOOST_TEST(out[n - 1] == sum_a);
  BOOST_TEST(out[n] == sum_b);
  BOOST_TEST(out[2 * n - 1] == sum_b);
}

TP_GPU_TEST(graph_destroyed_while_staged_calls_still_wait_keeps_their_ring_until_they_ran) {
  // The ring is host memory the queued launches read: it must outlive them, not the Graph. Once
  // they are done, the next Graph that stages reuses it.
  auto& graveyard = tp::detail::RingGraveyard::instance();
  tp::Stream stream;
  const std::size_t n = 1024;
  tp::DeviceTensor<float> acc(n, stream);
  auto xs = numbered_inputs(100, n, stream);
  {
    AccumulatingGraph g(n, stream);
    stream.synchronize();
    tp_test::spin_kernel<<<1, 1, 0, stream>>>(200'000'000);
    for (int i = 0; i < 100; ++i) g.graph.stage_and_launch(std::tie(g.input), std::tie(xs[i]), stream);
    // The accumulator is the graph's; copy it out in stream order, after every queued call.
    BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(acc.data(), g.acc.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    BOOST_TEST(graveyard.waiting() == 0u);
  }  // ~Graph while the GPU still spins: its ring waits in the graveyard
  BOOST_TEST(graveyard.waiting() == 1u);
  const auto out = acc.to_host(stream);
  BOOST_TEST(out[0] == 5050.0f);
  BOOST_TEST(out[n - 1] == 5050.0f);
  BOOST_TEST(cudaGetLastError() == cudaSuccess);
  graveyard.sweep();  // every call is done: a spare now
  BOOST_TEST(graveyard.waiting() == 0u);
  const std::size_t spares = graveyard.spares();
  BOOST_TEST(spares >= 1u);
  AccumulatingGraph next(n, stream);  // takes the spare, emptied
  next.graph.stage_and_launch(std::tie(next.input), std::tie(xs[41]), stream);
  BOOST_TEST(graveyard.spares() == spares - 1);
  BOOST_TEST(next.acc.to_host(stream)[n - 1] == 42.0f);
}

TP_GPU_TEST(stage_and_launch_on_a_capturing_stream_throws_usage_error_and_leaves_the_capture_intact) {
  tp::Stream stream;
  AccumulatingGraph g(64, stream);
  tp::DeviceTensor<float> x(64, stream);
  tp_test::fill(x.data(), 64, 3.0f, stream);
  stream.synchronize();
  tp::Graph outer;
  outer.capture_begin({.stream = stream});
  BOOST_CHECK_THROW(g.graph.stage_and_launch(std::tie(g.input), std::tie(x), stream), tp::usage_error);
  outer.capture_end();  // the capture was not invalidated
  g.graph.stage_and_launch(std::tie(g.input), std::tie(x), stream);
  BOOST_TEST(g.acc.to_host(stream)[63] == 3.0f);
  BOOST_TEST(tp_test::not_capturing(stream));
}

TP_GPU_TEST(stage_and_launch_without_stream_uses_the_current_stream) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  AffineGraph<1> g(256, stream);
  tp::DeviceTensor<float> x = device_copy(std::vector<float>(256, 1.5f), stream);
  g.graph.stage_and_launch(std::tie(g.statics[0]), std::tie(x));
  BOOST_TEST(g.outs[0].to_host()[0] == 3.0f);  // 2 * 1.5 + 0
}

TP_GPUS_TEST(stage_and_launch_without_stream_launches_on_the_graphs_device_whatever_device_is_current, 2) {
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  AffineGraph<1> g(256, cudaStreamLegacy);  // captured on device 1
  tp::DeviceTensor<float> x = device_copy(std::vector<float>(256, 2.5f), cudaStreamLegacy);
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  g.graph.stage_and_launch(std::tie(g.statics[0]), std::tie(x));  // legacy default stream, device 0 current
  int device = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
  BOOST_TEST(device == 0);
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  BOOST_TEST(g.outs[0].to_host(cudaStreamLegacy)[255] == 5.0f);  // 2 * 2.5 + 0
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
}

// ---- calls onto the static buffers of the last call (same_batched_plan, StagingNodes::restage) ------------

namespace {
// out_k of an AffineGraph<N> after staging `values` (one value per input): 2 * value + k.
template <std::size_t N>
void expect_outputs(AffineGraph<N>& g, const std::array<float, N>& values, tp::StreamRef s, const char* step) {
  for (std::size_t k = 0; k < N; ++k) {
    const auto out = g.outs[k].to_host(s);
    BOOST_TEST(out.front() == 2 * values[k] + static_cast<float>(k), step << ": pair " << k);
    BOOST_TEST(out.back() == 2 * values[k] + static_cast<float>(k), step << ": pair " << k);
  }
}
}  // namespace

TP_GPU_TEST(repeated_calls_onto_the_same_static_buffers_stage_exactly_and_still_refuse_every_bad_pair) {
  // After one call, calls onto the same static buffers skip planning: each step below must still
  // copy exactly its own inputs, or throw before anything is issued.
  tp::Stream stream;
  const std::size_t n = 4096;
  AffineGraph<3> g(n, stream);
  auto filled = [&](float v, std::size_t size) {
    tp::DeviceTensor<float> t(size, stream);
    tp_test::fill(t.data(), size, v, stream);
    return t;
  };
  tp::DeviceTensor<float> a = filled(1, n), b = filled(2, n), c = filled(3, n), d = filled(4, n), shorter = filled(9, n - 1);
  g.graph.stage_and_launch(g.static_tuple(), std::tie(a, b, c), stream);  // plans, and remembers the plan
  expect_outputs<3>(g, {1, 2, 3}, stream, "first call");
  g.graph.stage_and_launch(g.static_tuple(), std::tie(c, a, b), stream);  // the same sources, other pairs
  expect_outputs<3>(g, {3, 1, 2}, stream, "sources permuted");
  g.graph.stage_and_launch(g.static_tuple(), std::tie(d, d, d), stream);  // one input for every pair
  expect_outputs<3>(g, {4, 4, 4}, stream, "one input thrice");
  // An input that is another pair's static buffer, and one shorter than its static buffer: refused,
  // nothing copied, nothing launched.
  BOOST_CHECK_THROW(g.graph.stage_and_launch(g.static_tuple(), std::tie(a, g.statics[0], c), stream), tp::usage_error);
  BOOST_CHECK_THROW(g.graph.stage_and_launch(g.static_tuple(), std::tie(a, b, shorter), stream), tp::usage_error);
  expect_outputs<3>(g, {4, 4, 4}, stream, "after the refused calls");
  BOOST_TEST(g.statics[1].to_host(stream)[0] == 4.0f);
  // An input that is its own static buffer: not copied (it holds 4 from the call before).
  g.graph.stage_and_launch(g.static_tuple(), std::tie(a, g.statics[1], c), stream);
  expect_outputs<3>(g, {1, 4, 3}, stream, "an input that is its own static buffer");
  g.graph.stage_and_launch(g.static_tuple(), std::tie(b, b, b), stream);
  expect_outputs<3>(g, {2, 2, 2}, stream, "after a skipped pair");
  // A plain replay between calls turns the copy node off; the next call turns it on again.
  tp_test::fill(g.statics[2].data(), n, 7.0f, stream);
  g.graph.replay(stream);
  expect_outputs<3>(g, {2, 2, 7}, stream, "plain replay");
  g.graph.stage_and_launch(g.static_tuple(), std::tie(c, b, a), stream);
  expect_outputs<3>(g, {3, 2, 1}, stream, "after a plain replay");
  // Static buffers replaced by others: planned again, and the old ones are not written.
  AffineGraph<3> h(n, stream);
  h.graph.stage_and_launch(h.static_tuple(), std::tie(a, b, c), stream);
  for (int k = 0; k < 3; ++k) std::swap(g.statics[k], h.statics[k]);  // g's graph reads its old buffers, now h's
  g.graph.stage_and_launch(g.static_tuple(), std::tie(d, d, d), stream);  // onto other buffers: g's graph reads none
  expect_outputs<3>(g, {3, 2, 1}, stream, "static buffers the graph does not read");
  BOOST_TEST(h.statics[0].to_host(stream)[0] == 3.0f);  // g's captured buffers kept the last call's inputs
  BOOST_TEST(g.statics[0].to_host(stream)[0] == 4.0f);
}

TP_GPU_TEST(inputs_that_change_at_every_call_within_the_static_buffers_span_each_stage_their_own_values) {
  // Inputs allocated between the static buffers lie within their address span: the quick check
  // searches them, and one that overlaps a static buffer is still refused.
  tp::Stream stream;
  const std::size_t n = 1024;
  constexpr int sets = 4;
  std::array<tp::DeviceTensor<float>, 4> statics;
  std::array<std::array<tp::DeviceTensor<float>, 4>, sets> inputs;
  for (std::size_t k = 0; k < 4; ++k) {
    statics[k] = tp::DeviceTensor<float>(n, stream);
    for (int r = 0; r < sets; ++r) {
      inputs[r][k] = tp::DeviceTensor<float>(n, stream);
      tp_test::fill(inputs[r][k].data(), n, static_cast<float>(10 * r + k), stream);
    }
  }
  tp::DeviceTensor<float> acc(4 * n, stream);
  tp_test::fill(acc.data(), acc.size(), 0.0f, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    for (std::size_t k = 0; k < 4; ++k) accumulate<<<4, 256, 0, s>>>(statics[k].data(), acc.data() + k * n, n);
  }, {.stream = stream});
  auto st = std::tie(statics[0], statics[1], statics[2], statics[3]);
  const int calls = 40;
  for (int i = 0; i < calls; ++i) {
    auto& in = inputs[i % sets];
    graph.stage_and_launch(st, std::tie(in[0], in[1], in[2], in[3]), stream);
    if (i == 17)  // an overlap among changing inputs
      BOOST_CHECK_THROW(graph.stage_and_launch(st, std::tie(in[0], statics[3], in[2], in[3]), stream), tp::usage_error);
  }
  const auto out = acc.to_host(stream);
  for (std::size_t k = 0; k < 4; ++k) {
    float expected = 0;
    for (int i = 0; i < calls; ++i) expected += static_cast<float>(10 * (i % sets) + static_cast<int>(k));
    BOOST_TEST(out[k * n] == expected, "pair " << k);
    BOOST_TEST(out[k * n + n - 1] == expected, "pair " << k);
  }
}

TP_GPUS_TEST(an_input_moved_to_another_gpu_after_repeated_calls_is_copied_peer_to_peer, 2) {
  tp::Stream stream;
  const std::size_t n = 2048;
  AffineGraph<2> g(n, stream);
  tp::DeviceTensor<float> a(n, stream), b(n, stream);
  tp_test::fill(a.data(), n, 1.0f, stream);
  tp_test::fill(b.data(), n, 2.0f, stream);
  g.graph.stage_and_launch(g.static_tuple(), std::tie(a, b), stream);
  g.graph.stage_and_launch(g.static_tuple(), std::tie(b, a), stream);
  expect_outputs<2>(g, {2, 1}, stream, "on the graph's device");
  stream.synchronize();
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  tp::Stream other(1);
  tp::DeviceTensor<float> remote(n, other);
  tp_test::fill(remote.data(), n, 5.0f, other);
  other.synchronize();
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  g.graph.stage_and_launch(g.static_tuple(), std::tie(a, remote), stream);
  expect_outputs<2>(g, {1, 5}, stream, "an input on GPU 1");
  g.graph.stage_and_launch(g.static_tuple(), std::tie(b, a), stream);
  expect_outputs<2>(g, {2, 1}, stream, "back on the graph's device");
}

// ---- misuse: usage_error, and nothing is copied ----------------------------------------------------

TP_GPU_TEST(size_mismatch_throws_before_anything_is_copied) {
  tp::Stream stream;
  AffineGraph<2> g(1000, stream);  // statics hold -1
  tp::DeviceTensor<float> good = device_copy(std::vector<float>(1000, 5.0f), stream);
  tp::DeviceTensor<float> short_input = device_copy(std::vector<float>(999, 5.0f), stream);
  tp_test::fill(g.outs[0].data(), 1000, 77.0f, stream);
  BOOST_CHECK_THROW(g.graph.stage_and_launch(std::tie(g.statics[0], g.statics[1]), std::tie(good, short_input), stream),
                    tp::usage_error);
  stream.synchronize();
  BOOST_TEST(g.statics[0].to_host(stream)[0] == -1.0f);  // the good pair was not staged either
  BOOST_TEST(g.statics[1].to_host(stream)[0] == -1.0f);
  BOOST_TEST(g.outs[0].to_host(stream)[0] == 77.0f);  // and the graph did not run
}

TP_GPU_TEST(static_buffer_off_the_graphs_device_throws_before_anything_is_copied) {
  tp::Stream stream;
  AffineGraph<1> g(64, stream);
  float* pinned = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMallocHost(&pinned, 64 * sizeof(float)), cudaSuccess);
  std::span<float> host_static(pinned, 64);
  tp::DeviceTensor<float> a = device_copy(std::vector<float>(64, 3.0f), stream);
  tp::DeviceTensor<float> b = device_copy(std::vector<float>(64, 3.0f), stream);
  BOOST_CHECK_THROW(g.graph.stage_and_launch(std::tie(g.statics[0], host_static), std::tie(a, b), stream), tp::usage_error);
  BOOST_TEST(g.statics[0].to_host(stream)[0] == -1.0f);
  BOOST_REQUIRE_EQUAL(cudaFreeHost(pinned), cudaSuccess);
}

TP_GPU_TEST(stage_and_launch_before_instantiation_throws_usage_error) {
  tp::Stream stream;
  tp::DeviceTensor<float> s(8, stream);
  tp::DeviceTensor<float> x(8, stream);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.stage_and_launch(std::tie(s), std::tie(x), stream), tp::usage_error);
  graph.capture_begin({.stream = stream});
  BOOST_CHECK_THROW(graph.stage_and_launch(std::tie(s), std::tie(x), stream), tp::usage_error);
  graph.capture_end();
  BOOST_CHECK_NO_THROW(graph.stage_and_launch(std::tie(s), std::tie(x), stream));
}

// ---- make_graphed -----------------------------------------------------------------------------------

TP_GPU_TEST(make_graphed_returns_static_outputs_computed_from_fresh_inputs) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  const std::size_t n = 2048;
  tp::DeviceTensor<float> static_x(n);
  tp::DeviceTensor<float> static_y(n);
  tp_test::fill(static_x.data(), n, 0.0f, stream);
  tp_test::fill(static_y.data(), n, 0.0f, stream);
  int eager_runs = 0;
  auto step = tp::make_graphed(
      [&](tp::DeviceTensor<float>& x, tp::DeviceTensor<float>& y) {
        ++eager_runs;  // host code: runs at warm-up and capture only
        tp::DeviceTensor<float> out(n);
        tp_test::affine(x.data(), out.data(), n, 3.0f, 0.0f, tp::current_stream());
        tp_test::add(out.data(), n, 1.0f, tp::current_stream());
        accumulate<<<8, 256, 0, tp::current_stream()>>>(y.data(), out.data(), n);
        return out;  // allocated in the capture: the graphed callable keeps it
      },
      static_x, static_y);
  BOOST_TEST(eager_runs == 2);  // one warm-up, one capture
  for (float v : {1.0f, 2.0f, -4.0f}) {
    tp::DeviceTensor<float> x = device_copy(std::vector<float>(n, v), stream);
    tp::DeviceTensor<float> y = device_copy(std::vector<float>(n, 10 * v), stream);
    tp::DeviceTensor<float>& out = step(x, y);
    BOOST_TEST(out.to_host()[n - 1] == 3 * v + 1 + 10 * v);
  }
  BOOST_TEST(eager_runs == 2);  // replays run no host code
}

BOOST_AUTO_TEST_SUITE_END()
