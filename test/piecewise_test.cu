// Tests for tensorplay/graph/piecewise.hpp: PiecewiseGraph, and GraphBuckets whose buckets are
// piecewise (body(PiecewiseGraph&, size)); segments that take their Graph (conditional nodes).
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tp = tensorplay;

namespace {

// Appends `id` to a device log: log[0] counts the entries, which follow it.
__global__ void append(int* log, int id) { log[1 + atomicAdd(log, 1)] = id; }

//! A device log that pieces append their ids to, in the order they run.
struct Log {
  tp::Stream stream;
  tp::DeviceTensor<int> entries{64, stream};
  Log() { tp_test::fill(entries.data(), entries.size(), 0, stream); }
  void add(tp::StreamRef s, int id) {
    append<<<1, 1, 0, s>>>(entries.data(), id);
    BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
  }
  std::vector<int> read() const {
    const std::vector<int> all = entries.to_host(stream);
    return std::vector<int>(all.begin() + 1, all.begin() + 1 + all[0]);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(piecewise)

// ---- no GPU needed ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(eager_steps_count_as_segments_and_do_not_run_when_appended) {
  tp::PiecewiseGraph pieces;
  int runs = 0;
  pieces.eager([&](tp::StreamRef) { ++runs; });
  pieces.eager([&] { ++runs; });
  BOOST_TEST(pieces.segments() == 2u);
  BOOST_TEST(runs == 0);
}

BOOST_AUTO_TEST_CASE(replay_of_an_empty_piecewise_graph_throws_usage_error) {
  tp::PiecewiseGraph pieces;
  BOOST_CHECK_THROW(pieces.replay(tp::StreamRef{}), tp::usage_error);
}

// ---- segments and steps -----------------------------------------------------------------

TP_GPU_TEST(segments_and_steps_replay_in_the_order_appended_on_the_replays_stream) {
  Log log;
  tp::Stream other;
  std::vector<cudaStream_t> seen;  // the stream each step ran on
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { log.add(s, 1); }, {.stream = log.stream});
  pieces.eager([&](tp::StreamRef s) {
    seen.push_back(s.get());
    log.add(s, 2);
  });
  pieces.capture([&] { log.add(tp::current_stream(), 3); }, {.stream = log.stream});
  pieces.eager([&] {  // step(): the replay's stream is current
    seen.push_back(tp::current_stream().get());
    log.add(tp::current_stream(), 4);
  });
  BOOST_TEST(pieces.segments() == 4u);
  BOOST_TEST(log.read().empty());  // appending ran nothing
  BOOST_TEST(seen.empty());

  pieces.replay(log.stream);
  BOOST_TEST(log.read() == (std::vector<int>{1, 2, 3, 4}));
  pieces.replay(other);
  other.synchronize();
  BOOST_TEST(log.read() == (std::vector<int>{1, 2, 3, 4, 1, 2, 3, 4}));
  BOOST_TEST(seen == (std::vector<cudaStream_t>{log.stream.get(), log.stream.get(), other.get(), other.get()}));
}

// A step between segments that allocates: its memory comes from the default pool, fresh at
// every replay, and what it writes reaches the next segment through a tensor the first
// segment kept in the PiecewiseGraph's pool.
TP_GPU_TEST(step_that_allocates_runs_between_segments_at_every_replay) {
  tp::Stream stream;
  const std::size_t n = 4096;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<float> y(n, stream);
  tp::DeviceTensor<float> h;  // kept from segment 1: the step reads and writes it
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) {
    h = tp::DeviceTensor<float>(n, s);
    tp_test::affine(x.data(), h.data(), n, 2.0f, 0.0f, s);  // h = 2x
  }, {.stream = stream});
  std::vector<tp::Pool> step_pools;
  pieces.eager([&](tp::StreamRef s) {
    tp::DeviceTensor<float> scratch(n, s);  // eager: the default pool
    step_pools.push_back(scratch.pool());
    tp_test::affine(h.data(), scratch.data(), n, 1.0f, 3.0f, s);
    tp_test::affine(scratch.data(), h.data(), n, 1.0f, 0.0f, s);  // h = 2x + 3
  });
  pieces.capture([&](tp::StreamRef s) { tp_test::affine(h.data(), y.data(), n, 10.0f, 0.0f, s); }, {.stream = stream});
  BOOST_TEST((h.pool() == pieces.pool()));
  for (float value : {1.0f, 5.0f, -2.0f}) {
    tp_test::fill(x.data(), n, value, stream);
    pieces.replay(stream);
    const std::vector<float> out = y.to_host(stream);
    BOOST_TEST(out.front() == 10 * (2 * value + 3));
    BOOST_TEST(out.back() == 10 * (2 * value + 3));
  }
  BOOST_REQUIRE(step_pools.size() == 3u);
  for (const tp::Pool& p : step_pools) BOOST_TEST(!(p == pieces.pool()));
}

TP_GPU_TEST(every_segment_captures_into_the_one_pool_and_reuses_what_earlier_ones_freed) {
  tp::Stream stream;
  const std::size_t n = 1 << 18;
  tp::DeviceTensor<float> out(n, stream);
  std::vector<tp::Pool> pools;
  auto segment = [&](tp::StreamRef s) {
    tp::DeviceTensor<float> scratch(n, s);  // freed inside the body
    pools.push_back(scratch.pool());
    tp_test::fill(scratch.data(), n, 1.0f, s);
    tp_test::affine(scratch.data(), out.data(), n, 1.0f, 1.0f, s);
  };
  const tp::Pool given = tp::graph_pool_handle();
  tp::PiecewiseGraph pieces({.pool = given});
  pieces.capture(segment, {.stream = stream});
  const std::size_t after_one = pieces.pool().reserved_bytes();
  pieces.capture(segment, {.stream = stream});
  pieces.capture(segment, {.stream = stream});
  BOOST_TEST((pieces.pool() == given));
  for (const tp::Pool& p : pools) BOOST_TEST((p == given));
  BOOST_TEST(after_one > 0u);
  BOOST_TEST(pieces.pool().reserved_bytes() == after_one);  // the later segments reused the blocks
  pieces.replay(stream);
  BOOST_TEST(out.to_host(stream).back() == 2.0f);
}

TP_GPU_TEST(capture_into_another_pool_throws_usage_error) {
  tp::Stream stream;
  tp::PiecewiseGraph pieces;
  BOOST_CHECK_THROW(pieces.capture([] {}, {.pool = tp::graph_pool_handle(), .stream = stream}), tp::usage_error);
  BOOST_TEST(pieces.segments() == 0u);
}

TP_GPU_TEST(segment_whose_body_throws_is_not_appended) {
  Log log;
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { log.add(s, 1); }, {.stream = log.stream});
  BOOST_CHECK_THROW(pieces.capture([&](tp::StreamRef s) {
    log.add(s, 2);
    throw std::runtime_error("segment failed");
  }, {.stream = log.stream}),
                    std::runtime_error);
  BOOST_TEST(tp_test::not_capturing(log.stream));
  BOOST_TEST(pieces.segments() == 1u);
  pieces.replay(log.stream);
  BOOST_TEST(log.read() == (std::vector<int>{1}));
}

// ---- piecewise buckets --------------------------------------------------------------------

// Each bucket of a GraphBuckets is a PiecewiseGraph: segment, eager step, segment. Above the
// ladder the same body runs eagerly, pieces and steps in the same order.
TP_GPU_TEST(piecewise_buckets_run_segments_and_steps_of_their_size) {
  const std::vector<std::size_t> ladder{1, 2, 4, 8};
  constexpr std::size_t width = 5;
  tp::Stream stream;
  tp::DeviceTensor<float> x(16 * width, stream);
  tp::DeviceTensor<float> h(16 * width, stream);
  tp::DeviceTensor<float> y(16 * width, stream);
  std::vector<std::size_t> step_runs;  // the size of every step run
  std::vector<tp::Pool> pools;
  auto body = [&](tp::PiecewiseGraph& pieces, std::size_t size) {
    const std::size_t n = size * width;
    pools.push_back(pieces.pool());
    pieces.capture([&, n](tp::StreamRef s) { tp_test::affine(x.data(), h.data(), n, 2.0f, 0.0f, s); });
    pieces.eager([&, size, n](tp::StreamRef s) {  // the "attention": runs at every run
      step_runs.push_back(size);
      tp_test::add(h.data(), n, static_cast<float>(size), s);
    });
    pieces.capture([&, n](tp::StreamRef s) { tp_test::affine(h.data(), y.data(), n, 1.0f, 1.0f, s); });
  };
  tp::GraphBuckets buckets(ladder, body);
  for (std::size_t n : {3u, 3u, 8u, 1u, 11u, 4u}) {
    const float value = static_cast<float>(n);
    tp_test::fill(x.data(), x.size(), value, stream);
    const std::size_t ran = buckets.run(n, stream);
    BOOST_TEST(ran == (n > 8 ? n : buckets.bucket_for(n)));
    BOOST_TEST(step_runs.back() == ran);
    const std::vector<float> out = y.to_host(stream);
    BOOST_TEST(out[ran * width - 1] == 2 * value + static_cast<float>(ran) + 1);
  }
  BOOST_TEST(step_runs.size() == 6u);  // one step per run, replays included
  BOOST_TEST(buckets.executables() == 3u);
  BOOST_TEST(pools.size() == 4u);      // buckets 4, 8, 1, and the eager run of 11
  for (std::size_t k = 0; k < 3; ++k) BOOST_TEST((pools[k] == buckets.pool()));
}

// ---- segments that take their Graph (conditional nodes) -------------------------------------

namespace {

__global__ void decide(const int* x, tp::ConditionalHandle h) { h.set(*x > 0 ? 1u : 0u); }
__global__ void set_value(int* out, int value) { *out = value; }

}  // namespace

// segment, eager step, segment with an if_ on a handle, segment: the eager step writes the
// value the segment's kernel decides from, so the decision changes from one replay to the next.
TP_GPU_TEST(segment_that_takes_the_graph_runs_an_if_on_a_handle_decided_by_data) {
  Log log;
  tp::DeviceTensor<int> x(1, log.stream);
  int decision = 0;  // what the eager step writes into x at each replay
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { log.add(s, 1); }, {.stream = log.stream});
  pieces.eager([&](tp::StreamRef s) {
    set_value<<<1, 1, 0, s>>>(x.data(), decision);
    BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
    log.add(s, 2);
  });
  pieces.capture([&](tp::Graph& graph, tp::StreamRef s) {
    auto h = graph.conditional_handle();
    decide<<<1, 1, 0, s>>>(x.data(), h);  // sets h from x
    BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
    graph.if_(h, [&](tp::StreamRef b) { log.add(b, 3); });
  }, {.stream = log.stream});
  pieces.capture([&](tp::StreamRef s) { log.add(s, 4); }, {.stream = log.stream});
  BOOST_TEST(pieces.segments() == 4u);
  BOOST_TEST(log.read().empty());  // appending ran nothing
  std::vector<int> want;
  for (int d : {1, 0, 5, -2, 1}) {
    decision = d;
    pieces.replay(log.stream);
    want.insert(want.end(), {1, 2});
    if (d > 0) want.push_back(3);
    want.push_back(4);
  }
  BOOST_TEST(log.read() == want, boost::test_tools::per_element());
}

// A piecewise bucket whose last segment takes its Graph and uses the predicate form,
// graph.if_(bool tensor, ...). Above the ladder the bucket runs eagerly until that segment,
// which throws usage_error; the buckets work afterwards.
TP_GPU_TEST(piecewise_bucket_segment_that_takes_the_graph_uses_a_predicate_and_cannot_run_eagerly) {
  const std::vector<std::size_t> ladder{1, 2, 4, 8};
  tp::Stream stream;
  tp::DeviceTensor<bool> flag(1, stream);
  tp::DeviceTensor<float> y(16, stream);
  std::vector<std::size_t> step_runs;  // the size of every eager step run
  auto body = [&](tp::PiecewiseGraph& pieces, std::size_t size) {
    pieces.capture([&, size](tp::StreamRef s) { tp_test::fill(y.data(), size, static_cast<float>(size), s); });
    pieces.eager([&, size](tp::StreamRef s) {
      step_runs.push_back(size);
      tp_test::add(y.data(), size, 10.0f, s);
    });
    pieces.capture([&, size](tp::Graph& graph, tp::StreamRef) {
      graph.if_(flag, [&, size](tp::StreamRef b) { tp_test::add(y.data(), size, 100.0f, b); });
    });
  };
  tp::GraphBuckets buckets(ladder, body);
  // y after a run of `ran`: ran + 10 (+ 100 with the flag) in front, -1 behind.
  auto expect_y = [&](std::size_t ran, float front) {
    std::vector<float> want(y.size(), -1.0f);
    std::fill(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(ran), front);
    BOOST_TEST(y.to_host(stream) == want, boost::test_tools::per_element());
  };
  const std::vector<std::pair<std::size_t, bool>> runs{{3, true}, {3, false}, {8, true}, {1, false}, {4, true}};
  for (const auto& [n, on] : runs) {
    BOOST_TEST_CONTEXT("batch " << n << ", flag " << on) {
      tp_test::fill(y.data(), y.size(), -1.0f, stream);
      tp_test::fill(flag.data(), 1, on, stream);
      const std::size_t ran = buckets.run(n, stream);
      BOOST_TEST(ran == buckets.bucket_for(n));
      BOOST_TEST(step_runs.back() == ran);
      expect_y(ran, static_cast<float>(ran) + 10.0f + (on ? 100.0f : 0.0f));
    }
  }
  BOOST_TEST(buckets.executables() == 3u);

  tp_test::fill(y.data(), y.size(), -1.0f, stream);
  tp_test::fill(flag.data(), 1, true, stream);
  step_runs.clear();
  const std::string what = tp_test::expect_usage_error([&] { (void)buckets.run(11, stream); });
  BOOST_TEST(what.find("cannot run eagerly") != std::string::npos);
  BOOST_TEST(what.find("Overflow::Throw") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(step_runs == (std::vector<std::size_t>{11}));  // the pieces before that segment ran
  expect_y(11, 21.0f);
  BOOST_TEST(buckets.executables() == 3u);

  tp_test::fill(y.data(), y.size(), -1.0f, stream);
  BOOST_TEST(buckets.run(2, stream) == 2u);  // captures bucket 2
  expect_y(2, 112.0f);
}

BOOST_AUTO_TEST_SUITE_END()
