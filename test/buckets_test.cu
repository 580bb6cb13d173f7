// Tests for tensorplay/graph/buckets.hpp: GraphBuckets, BucketOptions, Overflow.
//
// Most cases share one step: y = 2 * x + size over the first size * width elements of user
// buffers sized for the largest bucket, through temporaries from the buckets' pool. The "+ size"
// says which bucket ran, and small integer inputs keep every float exact.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tp = tensorplay;

namespace {

using Ladder = std::vector<std::size_t>;
const Ladder small_ladder{1, 2, 4, 8};

// A body that must never run (the host-only cases throw before any capture).
auto never_called = [](tp::StreamRef, std::size_t) { BOOST_FAIL("the body must not run"); };

std::vector<float> pattern(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed * 3) % 13);
  return v;
}

//! What y must hold after a run of `rows` samples over input `x`: 2 * x + rows.
std::vector<float> step_of(const std::vector<float>& x, std::size_t count, std::size_t rows) {
  std::vector<float> y(count);
  for (std::size_t i = 0; i < count; ++i) y[i] = 2 * x[i] + static_cast<float>(rows);
  return y;
}

//! y = 2 * x + size over size * width elements, through two temporaries of the capture's pool
//! (freed inside the body, so that later captures reuse their blocks).
void affine_step(tp::StreamRef s, std::size_t size, std::size_t width, const float* x, float* y) {
  const std::size_t n = size * width;
  tp::DeviceTensor<float> doubled(n, s);
  tp_test::affine(x, doubled.data(), n, 2.0f, 0.0f, s);
  tp::DeviceTensor<float> shifted(n, s);
  tp_test::affine(doubled.data(), shifted.data(), n, 1.0f, static_cast<float>(size), s);
  tp_test::affine(shifted.data(), y, n, 1.0f, 0.0f, s);
}

//! User buffers sized for `rows` samples (outside the pool), and the sizes the body ran with.
struct Step {
  static constexpr std::size_t width = 3;  // elements per sample
  tp::Stream stream;
  tp::DeviceTensor<float> x;
  tp::DeviceTensor<float> y;
  std::vector<std::size_t> calls;  // body(stream, size) calls, in order (captures and eager runs)
  bool throw_next = false;         // the next body call throws after issuing work

  explicit Step(std::size_t rows) : x(rows * width, stream), y(rows * width, stream) {}

  auto body() {
    return [this](tp::StreamRef s, std::size_t size) {
      calls.push_back(size);
      BOOST_TEST((s == stream));  // captured (and run eagerly) on the run's stream
      affine_step(s, size, width, x.data(), y.data());
      if (std::exchange(throw_next, false)) throw std::runtime_error("body failed");
    };
  }

  //! Fills x with a fresh pattern; returns it.
  std::vector<float> new_input(unsigned seed) {
    std::vector<float> v = pattern(x.size(), seed);
    x.copy_from_host(v, stream);
    return v;
  }

  //! Checks that y holds the step of `input` for `rows` samples.
  void expect_ran(const std::vector<float>& input, std::size_t rows) {
    const std::size_t n = rows * width;
    const std::vector<float> got = y.to_host(stream);
    const std::vector<float> want = step_of(input, n, rows);
    BOOST_TEST(std::vector<float>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(n)) == want,
               boost::test_tools::per_element());
  }

  std::size_t calls_with(std::size_t size) const { return static_cast<std::size_t>(std::ranges::count(calls, size)); }
};

//! Runs batch n and checks the bucket it ran and the output.
template <class Buckets>
void run_and_expect(Buckets& buckets, Step& step, std::size_t n, std::size_t bucket, unsigned seed) {
  const std::vector<float> input = step.new_input(seed);
  BOOST_TEST(buckets.run(n, step.stream) == bucket);
  step.expect_ran(input, bucket);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(buckets)

// ---- the ladder (no GPU needed: checked before anything touches CUDA) -----------------------

BOOST_AUTO_TEST_CASE(unsorted_ladder_throws_usage_error) {
  BOOST_CHECK_THROW(tp::GraphBuckets(Ladder{1, 4, 2}, never_called), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(ladder_with_repeats_throws_usage_error) {
  BOOST_CHECK_THROW(tp::GraphBuckets(Ladder{1, 2, 2, 4}, never_called), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(ladder_with_zero_or_no_sizes_throws_usage_error) {
  BOOST_CHECK_THROW(tp::GraphBuckets(Ladder{0, 1, 2}, never_called), tp::usage_error);
  BOOST_CHECK_THROW(tp::GraphBuckets(Ladder{}, never_called), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(bucket_for_is_the_smallest_bucket_that_holds_the_batch) {
  tp::GraphBuckets buckets(Ladder{1, 2, 4, 8, 16, 24, 32}, never_called);
  BOOST_TEST(buckets.bucket_for(1) == 1u);
  BOOST_TEST(buckets.bucket_for(3) == 4u);
  BOOST_TEST(buckets.bucket_for(8) == 8u);
  BOOST_TEST(buckets.bucket_for(17) == 24u);
  BOOST_TEST(buckets.bucket_for(32) == 32u);
  BOOST_TEST(buckets.bucket_for(33) == 0u);  // above the ladder
}

BOOST_AUTO_TEST_CASE(run_and_bucket_for_of_zero_throw_usage_error) {
  tp::GraphBuckets buckets(small_ladder, never_called);
  BOOST_CHECK_THROW(buckets.run(0, tp::StreamRef{}), tp::usage_error);
  BOOST_CHECK_THROW((void)buckets.bucket_for(0), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(is_captured_speaks_in_ladder_sizes) {
  tp::GraphBuckets buckets(small_ladder, never_called);
  BOOST_TEST(!buckets.is_captured(8));
  BOOST_CHECK_THROW((void)buckets.is_captured(3), tp::usage_error);  // an index, not a size
  BOOST_CHECK_THROW((void)buckets.is_captured(16), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(overflow_throw_refuses_a_batch_above_the_ladder) {
  tp::GraphBuckets buckets(small_ladder, never_called, {.overflow = tp::Overflow::Throw});
  BOOST_CHECK_THROW(buckets.run(9, tp::StreamRef{}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(share_executables_with_a_piecewise_body_throws_usage_error) {
  auto piecewise = [](tp::PiecewiseGraph&, std::size_t) { BOOST_FAIL("the body must not run"); };
  BOOST_CHECK_THROW(tp::GraphBuckets(small_ladder, piecewise, {.share_executables = true}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(staged_input_that_is_not_whole_samples_throws_usage_error) {
  // Host arrays typed as spans: the sizes are checked before CUDA is asked anything.
  std::vector<float> statics(8 * 2);
  std::vector<float> input(5);  // 5 elements are not whole samples of a batch of 3
  std::span<float> s(statics);
  std::span<float> in(input);
  tp::GraphBuckets buckets(small_ladder, never_called);
  BOOST_CHECK_THROW(buckets.run(3, std::tie(s), std::tie(in), tp::StreamRef{}), tp::usage_error);
  std::vector<float> too_big(3 * 6);  // 6 per sample: a bucket of 4 needs 24 static elements
  std::span<float> big(too_big);
  BOOST_CHECK_THROW(buckets.run(3, std::tie(s), std::tie(big), tp::StreamRef{}), tp::usage_error);
}

// ---- runs -------------------------------------------------------------------------------

TP_GPU_TEST(run_captures_a_bucket_on_first_use_and_replays_it_after) {
  Step step(8);
  tp::GraphBuckets buckets(small_ladder, step.body());
  BOOST_TEST(!buckets.is_captured(4));
  run_and_expect(buckets, step, 3, 4, 1);
  BOOST_TEST(buckets.is_captured(4));
  BOOST_TEST(!buckets.is_captured(2));
  run_and_expect(buckets, step, 4, 4, 2);  // a new input: the replay computes it
  run_and_expect(buckets, step, 3, 4, 3);
  BOOST_TEST(step.calls_with(4) == 1u);    // captured once
  run_and_expect(buckets, step, 1, 1, 4);
  BOOST_TEST(step.calls == (Ladder{4, 1}));
  BOOST_TEST(buckets.executables() == 2u);
}

TP_GPU_TEST(overflow_eager_runs_the_body_with_the_batch_size_every_time) {
  Step step(12);
  tp::GraphBuckets buckets(small_ladder, step.body());
  run_and_expect(buckets, step, 11, 11, 1);
  run_and_expect(buckets, step, 11, 11, 2);
  BOOST_TEST(step.calls == (Ladder{11, 11}));  // eager: the body runs at every call
  BOOST_TEST(buckets.executables() == 0u);
  BOOST_TEST(buckets.pool().reserved_bytes() == 0u);  // nothing went into the buckets' pool
}

TP_GPU_TEST(body_that_throws_during_lazy_capture_leaves_the_bucket_uncaptured_and_the_next_run_retries) {
  for (bool shared : {false, true}) {
    Step step(8);
    tp::GraphBuckets buckets(small_ladder, step.body(), {.share_executables = shared});
    run_and_expect(buckets, step, 8, 8, 1);
    step.throw_next = true;
    BOOST_CHECK_THROW(buckets.run(2, step.stream), std::runtime_error);
    BOOST_TEST(tp_test::not_capturing(step.stream));
    BOOST_TEST(!buckets.is_captured(2));
    BOOST_TEST(buckets.is_captured(8));
    run_and_expect(buckets, step, 2, 2, 2);  // tries again, and succeeds
    BOOST_TEST(buckets.is_captured(2));
    BOOST_TEST(step.calls_with(2) == 2u);
    run_and_expect(buckets, step, 5, 8, 3);  // the bucket captured before is untouched
  }
}

TP_GPU_TEST(max_executables_drops_the_least_recently_run_bucket_and_captures_it_again) {
  Step step(8);
  tp::GraphBuckets buckets(small_ladder, step.body(), {.max_executables = 2});
  run_and_expect(buckets, step, 1, 1, 1);
  run_and_expect(buckets, step, 2, 2, 2);
  run_and_expect(buckets, step, 1, 1, 3);  // 2 is now the least recently run
  run_and_expect(buckets, step, 4, 4, 4);
  BOOST_TEST(buckets.executables() == 2u);
  BOOST_TEST(!buckets.is_captured(2));
  BOOST_TEST(buckets.is_captured(1));
  BOOST_TEST(buckets.is_captured(4));
  run_and_expect(buckets, step, 2, 2, 5);  // captured again; 1 is dropped now
  BOOST_TEST(step.calls_with(2) == 2u);
  BOOST_TEST(!buckets.is_captured(1));
  BOOST_TEST(buckets.is_captured(4));
  run_and_expect(buckets, step, 3, 4, 6);
  BOOST_TEST(step.calls_with(4) == 1u);
}

TP_GPU_TEST(capture_all_and_lazy_false_capture_every_bucket_largest_first) {
  Step step(8);
  tp::GraphBuckets lazy(small_ladder, step.body());
  lazy.capture_all(step.stream);
  BOOST_TEST(step.calls == (Ladder{8, 4, 2, 1}));
  for (std::size_t size : small_ladder) BOOST_TEST(lazy.is_captured(size));
  step.calls.clear();
  {
    tp::StreamGuard guard(step.stream);  // lazy = false captures on the current stream
    tp::GraphBuckets eager(small_ladder, step.body(), {.lazy = false});
    BOOST_TEST(step.calls == (Ladder{8, 4, 2, 1}));
    run_and_expect(eager, step, 3, 4, 1);
  }
  BOOST_TEST(step.calls.size() == 4u);  // the run replayed, it did not capture
}

TP_GPU_TEST(every_bucket_captures_into_the_one_pool) {
  tp::Stream stream;
  std::vector<tp::Pool> pools;
  auto body = [&](tp::StreamRef s, std::size_t size) {
    tp::DeviceTensor<float> scratch(size * 1000, s);
    pools.push_back(scratch.pool());
    tp_test::fill(scratch.data(), scratch.size(), 1.0f, s);
  };
  tp::GraphBuckets own(small_ladder, body);
  own.capture_all(stream);
  BOOST_REQUIRE(pools.size() == 4u);
  BOOST_TEST(!own.pool().empty());
  for (const tp::Pool& p : pools) BOOST_TEST((p == own.pool()));
  BOOST_TEST(own.pool().reserved_bytes() > 0u);

  pools.clear();
  const tp::Pool given = tp::graph_pool_handle();
  tp::GraphBuckets configured(small_ladder, body, {.pool = given});
  configured.run(3, stream);
  configured.run(8, stream);
  BOOST_TEST((configured.pool() == given));
  BOOST_REQUIRE(pools.size() == 2u);
  for (const tp::Pool& p : pools) BOOST_TEST((p == given));
  stream.synchronize();
}

// ---- staged runs ------------------------------------------------------------------------

TP_GPU_TEST(staged_run_copies_each_input_into_the_front_of_its_static_buffer) {
  for (bool shared : {false, true}) {
    for (bool zero_fill : {false, true}) {
      BOOST_TEST_CONTEXT("shared " << shared << ", zero fill " << zero_fill) {
        Step step(8);
        tp::GraphBuckets buckets(small_ladder, step.body(), {.share_executables = shared, .zero_fill_tail = zero_fill});
        const float sentinel = 100.0f;
        for (std::size_t n : {3u, 4u, 3u, 5u}) {  // the same bucket twice in a row, then another
          std::vector<float> statics(step.x.size(), sentinel);
          step.x.copy_from_host(statics, step.stream);
          const std::vector<float> fresh = pattern(n * Step::width, static_cast<unsigned>(n));
          tp::DeviceTensor<float> input(fresh.size(), step.stream);
          input.copy_from_host(fresh, step.stream);
          const std::size_t bucket = buckets.run(n, std::tie(step.x), std::tie(input), step.stream);
          BOOST_TEST(bucket == buckets.bucket_for(n));
          // What x must hold: the input in front, then zeros or the sentinel up to the bucket,
          // then the sentinel (never touched).
          std::vector<float> want(step.x.size(), sentinel);
          std::copy(fresh.begin(), fresh.end(), want.begin());
          if (zero_fill) std::fill(want.begin() + fresh.size(), want.begin() + bucket * Step::width, 0.0f);
          BOOST_TEST(step.x.to_host(step.stream) == want, boost::test_tools::per_element());
          step.expect_ran(want, bucket);
        }
      }
    }
  }
}

TP_GPU_TEST(staged_run_above_the_ladder_copies_the_input_and_runs_eagerly) {
  Step step(12);
  tp::GraphBuckets buckets(small_ladder, step.body());
  const std::vector<float> fresh = pattern(11 * Step::width, 5);
  tp::DeviceTensor<float> input(fresh.size(), step.stream);
  input.copy_from_host(fresh, step.stream);
  BOOST_TEST(buckets.run(11, std::tie(step.x), std::tie(input), step.stream) == 11u);
  step.expect_ran(fresh, 11);
  // A static buffer too small for the batch is refused before anything runs.
  Step small(8);
  tp::GraphBuckets refused(small_ladder, small.body());
  BOOST_CHECK_THROW(refused.run(11, std::tie(small.x), std::tie(input), small.stream), tp::usage_error);
  BOOST_TEST(small.calls.empty());
}

// ---- shared executables -----------------------------------------------------------------

TP_GPU_TEST(shared_executables_give_the_same_results_as_separate_ones) {
  const Ladder ladder{1, 2, 4, 8, 16, 24, 32};
  Step separate_step(32);
  Step shared_step(32);
  tp::GraphBuckets separate(ladder, separate_step.body());
  tp::GraphBuckets shared(ladder, shared_step.body(), {.share_executables = true});
  std::mt19937 random(7);
  std::uniform_int_distribution<std::size_t> batch(1, 32);
  for (unsigned t = 0; t < 300; ++t) {
    const std::size_t n = batch(random);
    const std::vector<float> input = separate_step.new_input(t);
    shared_step.x.copy_from_host(input, shared_step.stream);
    const std::size_t ran = separate.run(n, separate_step.stream);
    BOOST_REQUIRE(shared.run(n, shared_step.stream) == ran);
    // The rows the run wrote (y past them holds what earlier runs, or nothing, left there).
    const std::size_t written = ran * Step::width;
    std::vector<float> want = separate_step.y.to_host(separate_step.stream);
    std::vector<float> got = shared_step.y.to_host(shared_step.stream);
    want.resize(written);
    got.resize(written);
    if (got != want) {
      std::size_t at = 0;
      while (got[at] == want[at]) ++at;
      BOOST_FAIL("step " << t << ", batch " << n << " (bucket " << ran << ", " << shared.executables()
                         << " shared executables): element " << at << " is " << got[at] << ", separate gives " << want[at]);
    }
    if (t % 50 == 0) shared_step.expect_ran(input, ran);
  }
  separate.capture_all(separate_step.stream);
  shared.capture_all(shared_step.stream);
  BOOST_TEST(separate.executables() == ladder.size());
  // Every bucket has one topology (three kernels; grids and pointers differ): CUDA updates one
  // executable between them.
  BOOST_TEST(shared.executables() == 1u);
}

TP_GPU_TEST(shared_executables_keep_one_per_topology_and_drop_the_least_recent_at_the_limit) {
  Step step(8);
  // Buckets from 4 up add a kernel: two topologies.
  auto body = [&](tp::StreamRef s, std::size_t size) {
    step.calls.push_back(size);
    affine_step(s, size, Step::width, step.x.data(), step.y.data());
    if (size >= 4) tp_test::add(step.y.data(), size * Step::width, 0.0f, s);
  };
  tp::GraphBuckets unlimited(small_ladder, body, {.share_executables = true});
  unlimited.capture_all(step.stream);
  BOOST_TEST(unlimited.executables() == 2u);
  for (std::size_t n : {1u, 8u, 2u, 4u, 3u, 1u}) run_and_expect(unlimited, step, n, unlimited.bucket_for(n), n);

  step.calls.clear();
  tp::GraphBuckets limited(small_ladder, body, {.max_executables = 1, .share_executables = true});
  run_and_expect(limited, step, 2, 2, 1);
  run_and_expect(limited, step, 1, 1, 2);  // shares the executable of 2
  BOOST_TEST(limited.executables() == 1u);
  run_and_expect(limited, step, 8, 8, 3);  // another topology: the executable of 1 and 2 goes
  BOOST_TEST(limited.executables() == 1u);
  BOOST_TEST(!limited.is_captured(1));
  BOOST_TEST(!limited.is_captured(2));
  run_and_expect(limited, step, 2, 2, 4);  // captured again
  BOOST_TEST(!limited.is_captured(8));
  BOOST_TEST(step.calls == (Ladder{2, 1, 8, 2}));
}

// ---- memory and the output-validity rule --------------------------------------------------

// Lazy captures in a random order, so that capture order differs from size order, mixed with
// replays of the buckets already captured. Each bucket writes a tensor it keeps in the pool and
// a buffer of the user's. After every run: its kept tensor and its user buffer hold the right
// values (a run's outputs are valid until the next run), and every other bucket's user buffer
// still holds what that bucket last wrote (no graph writes outside its own memory, whatever
// blocks the pool handed out in whatever order).
TP_GPU_TEST(lazy_capture_in_a_random_order_keeps_outputs_valid_until_the_next_run) {
  const Ladder ladder{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
  constexpr std::size_t width = 4;
  tp::Stream stream;
  tp::DeviceTensor<float> x(ladder.back() * width, stream);
  std::map<std::size_t, tp::DeviceTensor<float>> user;  // per bucket, outside the pool
  std::map<std::size_t, tp::DeviceTensor<float>> kept;  // per bucket, kept in the pool
  for (std::size_t size : ladder) user.emplace(size, tp::DeviceTensor<float>(size * width, stream));
  auto body = [&](tp::StreamRef s, std::size_t size) {
    const std::size_t n = size * width;
    tp::DeviceTensor<float> doubled(n, s);
    tp_test::affine(x.data(), doubled.data(), n, 2.0f, 0.0f, s);
    tp::DeviceTensor<float> shifted(n, s);
    tp_test::affine(doubled.data(), shifted.data(), n, 1.0f, static_cast<float>(size), s);
    kept[size] = tp::DeviceTensor<float>(n, s);
    tp_test::affine(shifted.data(), kept[size].data(), n, 1.0f, 0.0f, s);
    tp_test::affine(kept[size].data(), user.at(size).data(), n, 1.0f, 0.0f, s);
  };
  tp::GraphBuckets buckets(ladder, body);

  std::mt19937 random(2026);
  Ladder order = ladder;
  std::shuffle(order.begin(), order.end(), random);
  std::map<std::size_t, std::vector<float>> last;  // what each bucket's user buffer must hold
  std::uniform_int_distribution<std::size_t> any_batch(1, ladder.back());
  for (unsigned t = 0; t < 300; ++t) {
    // First every bucket once, in the shuffled order, each followed by a random batch (a
    // replay of a bucket captured before, or another capture); then random batches.
    const std::size_t n = t < 2 * order.size() && t % 2 == 0 ? order[t / 2] : any_batch(random);
    const std::vector<float> input = pattern(x.size(), t);
    x.copy_from_host(input, stream);
    const std::size_t bucket = buckets.run(n, stream);
    BOOST_REQUIRE(bucket == buckets.bucket_for(n));
    last[bucket] = step_of(input, bucket * width, bucket);
    BOOST_REQUIRE_MESSAGE(kept.at(bucket).to_host(stream) == last[bucket], "kept output of bucket " << bucket << " at run " << t);
    for (const auto& [size, want] : last)
      BOOST_REQUIRE_MESSAGE(user.at(size).to_host(stream) == want, "user buffer of bucket " << size << " after run " << t);
  }
  for (std::size_t size : ladder) BOOST_TEST(buckets.is_captured(size));
}

// The step of a ~decoder layer: eight temporaries in a row, each freed when the next exists.
void layered_step(tp::StreamRef s, std::size_t size, std::size_t width, const float* x, float* y) {
  const std::size_t n = size * width;
  tp::DeviceTensor<float> h(n, s);
  tp_test::affine(x, h.data(), n, 1.0f, 0.0f, s);
  for (int layer = 0; layer < 8; ++layer) {
    tp::DeviceTensor<float> next(n, s);
    tp_test::affine(h.data(), next.data(), n, 1.0f, 1.0f, s);
    h = std::move(next);
  }
  tp_test::affine(h.data(), y, n, 1.0f, 0.0f, s);
}

TP_GPU_TEST(ladder_of_32_buckets_reserves_at_most_a_tenth_more_than_its_largest_bucket_alone) {
  Ladder ladder(32);
  for (std::size_t k = 0; k < ladder.size(); ++k) ladder[k] = 16 * (k + 1);  // 16 ... 512
  constexpr std::size_t width = 1024;
  tp::Stream stream;
  tp::DeviceTensor<float> x(ladder.back() * width, stream);
  tp::DeviceTensor<float> y(ladder.back() * width, stream);
  auto body = [&](tp::StreamRef s, std::size_t size) { layered_step(s, size, width, x.data(), y.data()); };
  tp::StreamGuard guard(stream);
  tp::GraphBuckets largest(Ladder{ladder.back()}, body, {.lazy = false});
  tp::GraphBuckets all(ladder, body, {.lazy = false});
  const std::size_t alone = largest.pool().reserved_bytes();
  const std::size_t whole = all.pool().reserved_bytes();
  BOOST_TEST_MESSAGE("largest bucket alone: " << alone << " bytes; 32 buckets: " << whole << " bytes");
  BOOST_TEST(alone > 0u);
  BOOST_TEST(static_cast<double>(whole) <= 1.1 * static_cast<double>(alone));
  // Every bucket still computes its step after all of them were captured.
  const std::vector<float> input = pattern(x.size(), 9);
  x.copy_from_host(input, stream);
  for (std::size_t n : {512u, 1u, 200u, 17u, 512u}) {
    const std::size_t bucket = all.run(n, stream);
    const std::vector<float> got = y.to_host(stream);
    for (std::size_t i = 0; i < bucket * width; i += 97) BOOST_REQUIRE(got[i] == input[i] + 8.0f);
  }
  BOOST_TEST(all.pool().reserved_bytes() == whole);  // replays allocate nothing
}

// ---- conditional nodes: bodies that take the bucket's Graph ---------------------------------

namespace {

// One iteration of a bucket's do-while: counts its counter down, counts itself, and stops the
// loop (sets the handle to 0) once the counter reaches 0.
__global__ void count_down(int* counter, int* iterations, tp::ConditionalHandle loop) {
  *counter -= 1;
  *iterations += 1;
  if (*counter <= 0) loop.set(0u);
}

//! Sets every counter to `start` (at least 1) and every iteration count to 0, runs batch n, and
//! checks that the loop of `bucket` alone ran, `start` times, down to 0 (a cell per size).
template <class Buckets>
void run_countdown(Buckets& loops, tp::StreamRef stream, tp::DeviceTensor<int>& counter, tp::DeviceTensor<int>& iterations,
                   std::size_t n, std::size_t bucket, int start) {
  const std::vector<int> starts(counter.size(), start);
  const std::vector<int> zeros(iterations.size(), 0);
  counter.copy_from_host(starts, stream);
  iterations.copy_from_host(zeros, stream);
  BOOST_TEST(loops.run(n, stream) == bucket);
  std::vector<int> want_counter = starts;
  std::vector<int> want_iterations = zeros;
  want_counter[bucket] = 0;
  want_iterations[bucket] = start;
  BOOST_TEST(counter.to_host(stream) == want_counter, boost::test_tools::per_element());
  BOOST_TEST(iterations.to_host(stream) == want_iterations, boost::test_tools::per_element());
}

//! A do-while on a handle per bucket (the example of docs/buckets.md), run lazily for two
//! bucket sizes and a replay with other data, then on a second ladder after capture_all.
void check_countdown_ladder(bool shared) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(9, stream), iterations(9, stream);  // a cell per size, up to 8
  std::vector<std::size_t> captured;                                // the sizes the body captured
  auto body = [&](tp::Graph& graph, tp::StreamRef, std::size_t size) {
    captured.push_back(size);
    auto h = graph.conditional_handle(1);  // 1 at every launch: a do-while
    graph.while_(h, [&, size, h](tp::StreamRef b) {
      count_down<<<1, 1, 0, b>>>(counter.data() + size, iterations.data() + size, h);  // h.set(0u) at 0
      BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
    });
  };
  tp::GraphBuckets loops(small_ladder, body, {.share_executables = shared});
  run_countdown(loops, stream, counter, iterations, 3, 4, 3);  // captures bucket 4
  run_countdown(loops, stream, counter, iterations, 2, 2, 5);  // captures bucket 2
  run_countdown(loops, stream, counter, iterations, 4, 4, 2);  // replays bucket 4: the loop reads new data
  run_countdown(loops, stream, counter, iterations, 2, 2, 1);
  BOOST_TEST(captured == (Ladder{4, 2}));
  BOOST_TEST(tp_test::not_capturing(stream));

  captured.clear();
  tp::GraphBuckets all(small_ladder, body, {.share_executables = shared});
  all.capture_all(stream);
  BOOST_TEST(captured == (Ladder{8, 4, 2, 1}));
  for (std::size_t n : {8u, 1u, 3u, 5u, 2u, 8u}) run_countdown(all, stream, counter, iterations, n, all.bucket_for(n), static_cast<int>(n) + 1);
  BOOST_TEST(captured.size() == 4u);  // the runs replayed
  if (shared) {
    BOOST_TEST(all.executables() >= 1u);  // CUDA decides which of the loops share one
    BOOST_TEST(all.executables() <= small_ladder.size());
  } else {
    BOOST_TEST(all.executables() == small_ladder.size());
  }
}

}  // namespace

TP_GPU_TEST(bucket_body_that_takes_the_graph_runs_a_do_while_on_a_handle_per_bucket) { check_countdown_ladder(false); }

TP_GPU_TEST(bucket_body_that_takes_the_graph_runs_a_do_while_on_a_handle_with_shared_executables) {
  check_countdown_ladder(true);
}

TP_GPU_TEST(estimate_gives_a_body_that_takes_the_graph_each_throwaway_graph) {
  for (bool shared : {false, true}) {
    BOOST_TEST_CONTEXT("shared " << shared) {
      tp::Stream stream;
      tp::DeviceTensor<int> counter(9, stream), iterations(9, stream);
      std::vector<std::size_t> captured;
      auto body = [&](tp::Graph& graph, tp::StreamRef s, std::size_t size) {
        captured.push_back(size);
        BOOST_TEST(graph.is_capturing());
        BOOST_TEST((s == graph.capture_stream()));
        auto h = graph.conditional_handle(1);
        graph.while_(h, [&, size, h](tp::StreamRef b) {
          count_down<<<1, 1, 0, b>>>(counter.data() + size, iterations.data() + size, h);
          BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
        });
      };
      tp::GraphBuckets loops(small_ladder, body, {.share_executables = shared});
      const std::vector<int> zeros(iterations.size(), 0);
      iterations.copy_from_host(zeros, stream);
      const tp::MemoryEstimate estimate = loops.estimate(stream);
      BOOST_TEST_MESSAGE("estimate: pool " << estimate.pool_bytes << " bytes, executables " << estimate.executable_bytes << " bytes");
      BOOST_TEST(estimate.total_bytes() > 0u);
      BOOST_TEST(captured == (Ladder{8, 4, 2, 1}));  // every bucket, largest first
      BOOST_TEST(tp_test::not_capturing(stream));
      for (std::size_t size : small_ladder) BOOST_TEST(!loops.is_captured(size));
      BOOST_TEST(loops.executables() == 0u);
      // Nothing ran during the estimate, and the buckets capture and run as usual afterwards.
      BOOST_TEST(iterations.to_host(stream) == zeros, boost::test_tools::per_element());
      run_countdown(loops, stream, counter, iterations, 3, 4, 4);
      run_countdown(loops, stream, counter, iterations, 8, 8, 2);
      BOOST_TEST(captured.size() == 6u);
    }
  }
}

TP_GPU_TEST(run_above_the_ladder_with_a_body_that_takes_the_graph_throws_usage_error) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(9, stream), iterations(9, stream);
  std::vector<std::size_t> captured;
  auto body = [&](tp::Graph& graph, tp::StreamRef, std::size_t size) {
    captured.push_back(size);
    auto h = graph.conditional_handle(1);
    graph.while_(h, [&, size, h](tp::StreamRef b) {
      count_down<<<1, 1, 0, b>>>(counter.data() + size, iterations.data() + size, h);
      BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
    });
  };
  tp::GraphBuckets loops(small_ladder, body);  // Overflow::Eager, the default
  const std::string what = tp_test::expect_usage_error([&] { (void)loops.run(9, stream); });
  BOOST_TEST(what.find("cannot run eagerly") != std::string::npos);
  BOOST_TEST(what.find("Overflow::Throw") != std::string::npos);
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(captured.empty());
  BOOST_TEST(loops.executables() == 0u);

  // A staged run above the ladder is refused before it copies anything.
  tp::DeviceTensor<int> statics(16, stream), input(9, stream);
  tp_test::fill(statics.data(), statics.size(), 7, stream);
  tp_test::fill(input.data(), input.size(), 1, stream);
  BOOST_CHECK_THROW(loops.run(9, std::tie(statics), std::tie(input), stream), tp::usage_error);
  BOOST_TEST(statics.to_host(stream) == std::vector<int>(16, 7), boost::test_tools::per_element());
  BOOST_TEST(tp_test::not_capturing(stream));

  // The buckets still work.
  run_countdown(loops, stream, counter, iterations, 3, 4, 2);
  run_countdown(loops, stream, counter, iterations, 8, 8, 3);
  BOOST_TEST(captured == (Ladder{4, 8}));

  // Overflow::Throw refuses the batch with its own message, and the buckets work as well.
  tp::GraphBuckets strict(small_ladder, body, {.overflow = tp::Overflow::Throw});
  BOOST_CHECK_THROW(strict.run(9, stream), tp::usage_error);
  BOOST_TEST(tp_test::not_capturing(stream));
  run_countdown(strict, stream, counter, iterations, 1, 1, 4);
}

TP_GPU_TEST(bucket_body_that_takes_the_graph_takes_predicates_too) {
  tp::Stream stream;
  tp::DeviceTensor<bool> flag(1, stream);
  tp::DeviceTensor<float> y(8, stream);
  auto body = [&](tp::Graph& graph, tp::StreamRef s, std::size_t size) {
    tp_test::fill(y.data(), size, static_cast<float>(size), s);
    graph.if_(flag, [&, size](tp::StreamRef b) { tp_test::add(y.data(), size, 100.0f, b); });  // the predicate form
  };
  tp::GraphBuckets buckets(small_ladder, body);
  const std::vector<std::pair<std::size_t, bool>> runs{{3, true}, {3, false}, {1, true}, {8, false}, {4, true}, {1, false}};
  for (const auto& [n, on] : runs) {
    BOOST_TEST_CONTEXT("batch " << n << ", flag " << on) {
      tp_test::fill(y.data(), y.size(), -1.0f, stream);
      tp_test::fill(flag.data(), 1, on, stream);
      const std::size_t bucket = buckets.run(n, stream);
      BOOST_TEST(bucket == buckets.bucket_for(n));
      std::vector<float> want(y.size(), -1.0f);
      std::fill(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(bucket), static_cast<float>(bucket) + (on ? 100.0f : 0.0f));
      BOOST_TEST(y.to_host(stream) == want, boost::test_tools::per_element());
    }
  }
  BOOST_TEST(buckets.executables() == 3u);  // 4, 1 and 8
}

BOOST_AUTO_TEST_SUITE_END()
