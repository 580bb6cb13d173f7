// Tests that two translation units including <tensorplay/graph.hpp> (odr_a.cu, odr_b.cu) link
// into one binary and share the library's process-wide state (see odr.hpp).
#include "odr.hpp"
#include "support.hpp"

#include <cstddef>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 3000;  // more than one block of 256 threads

//! Indices where `values` differs from `expected(i)`: empty when all match (one assertion
//! instead of thousands, and the first bad indices in the message).
template <class Expected>
std::vector<std::size_t> mismatches(const std::vector<float>& values, Expected expected) {
  std::vector<std::size_t> bad;
  for (std::size_t i = 0; i < values.size() && bad.size() < 8; ++i)
    if (values[i] != expected(i)) bad.push_back(i);
  return bad;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(odr)

// Host only: the exception type's identity (its typeinfo) is one across the translation units.
BOOST_AUTO_TEST_CASE(usage_error_thrown_by_either_translation_unit_is_caught_by_type_in_a_third) {
  BOOST_TEST((odr::parse_mode_a("relaxed") == tp::CaptureErrorMode::Relaxed));
  BOOST_TEST((odr::parse_mode_b("thread_local") == tp::CaptureErrorMode::ThreadLocal));
  BOOST_CHECK_THROW((void)odr::parse_mode_a("sometimes"), tp::usage_error);
  BOOST_CHECK_THROW((void)odr::parse_mode_b("sometimes"), tp::usage_error);
}

TP_GPU_TEST(graphs_captured_in_two_translation_units_replay_their_own_kernels) {
  const float value = 0.5f;
  const int replays = 3;
  const odr::Replayed a = odr::capture_and_replay_a(n, value, replays);
  const odr::Replayed b = odr::capture_and_replay_b(n, value, replays);
  BOOST_TEST_REQUIRE(a.sums.size() == n);
  BOOST_TEST_REQUIRE(b.sums.size() == n);
  // Both kernels are named write_kernel (internal linkage): each graph must run its own.
  BOOST_TEST(mismatches(a.sums, [&](std::size_t i) { return replays * odr::formula_a(i, value); }).empty());
  BOOST_TEST(mismatches(b.sums, [&](std::size_t i) { return replays * odr::formula_b(i, value); }).empty());
  // Each tensor allocated inside a capture came from that capture's graph pool.
  BOOST_TEST(a.scratch_pool == a.graph_pool);
  BOOST_TEST(b.scratch_pool == b.graph_pool);
  BOOST_TEST(a.graph_pool != b.graph_pool);
}

// The capture begins here; the allocations and kernels come from odr_a.cu and odr_b.cu, which
// find the capture through the registry and the current stream that all three share.
TP_GPU_TEST(one_capture_takes_allocations_and_kernels_from_both_translation_units) {
  const float value = 2.0f;
  tp::Stream stream;
  tp::Graph graph;
  tp::DeviceTensor<float> from_a;
  tp::DeviceTensor<float> from_b;
  graph.capture(
      [&] {
        from_a = odr::allocate_a(n);
        from_b = odr::allocate_b(n);
        odr::write_a(from_a, value);
        odr::write_b(from_b, value);
      },
      {.stream = stream});
  BOOST_TEST(from_a.pool().id() == graph.pool_id());
  BOOST_TEST(from_b.pool().id() == graph.pool_id());
  graph.replay(stream);
  BOOST_TEST(mismatches(from_a.to_host(stream), [&](std::size_t i) { return odr::formula_a(i, value); }).empty());
  BOOST_TEST(mismatches(from_b.to_host(stream), [&](std::size_t i) { return odr::formula_b(i, value); }).empty());
}

BOOST_AUTO_TEST_SUITE_END()
