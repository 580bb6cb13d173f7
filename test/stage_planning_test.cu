// Tests of stage_and_launch's planning on the host (tensorplay/graph/detail/staging.hpp): the full
// planning (plan_pairs), the overlap search (overlapped_static) and the fast path of calls onto
// the static buffers of the last call (same_batched_plan). Tensors of a test type that knows its
// device stand in for device memory: planning them makes no CUDA call, so these cases need no
// GPU and run everywhere, CI included.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

namespace tp = tensorplay;
namespace td = tensorplay::detail;

namespace {

//! Floats "on" device `device`: host memory here, never dereferenced by planning.
struct Span {
  float* data;
  std::size_t size;
  int device = 0;
};

}  // namespace

template <>
struct tensorplay::tensor_traits<Span> {
  using element_type = float;
  static constexpr MemorySpace space = MemorySpace::Device;
  static constexpr bool contiguous = true;
  static float* data(const Span& t) noexcept { return t.data; }
  static std::size_t size(const Span& t) noexcept { return t.size; }
  static int device(const Span& t) noexcept { return t.device; }
};

namespace {

static_assert(td::DevicePair<Span, Span>);

//! One arena: three static buffers of 64 floats with gaps of 64 floats between them, then inputs.
struct Buffers {
  std::vector<float> arena = std::vector<float>(4096);
  Span s0{arena.data(), 64}, s1{arena.data() + 128, 64}, s2{arena.data() + 256, 64};
  Span gap{arena.data() + 64, 64};  // between s0 and s1: within the statics' span, overlapping none
  Span a{arena.data() + 1024, 64}, b{arena.data() + 1152, 64}, c{arena.data() + 1280, 64};
  td::StaticOrder cache;

  auto statics() { return std::tie(s0, s1, s2); }

  //! The full planning of (a, b, c), then what the caller does after a call that batched every pair.
  void plan_and_remember() {
    const auto plans = td::plan_pairs(statics(), std::tie(a, b, c), 0, cache, tp::source_location::current());
    for (const td::StagePlan& p : plans) BOOST_REQUIRE(p.kind == td::StageKind::Batched);
    cache.batched_plan = true;
  }

  template <class... I>
  bool fast(I&... inputs) {
    std::array<const void*, 3> sources{};
    return td::same_batched_plan(statics(), std::tie(inputs...), 0, cache, sources);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(stage_planning)

BOOST_AUTO_TEST_CASE(the_fast_path_needs_a_call_that_batched_every_pair_first) {
  Buffers buf;
  BOOST_TEST(!buf.fast(buf.a, buf.b, buf.c));  // nothing planned yet
  (void)td::plan_pairs(buf.statics(), std::tie(buf.a, buf.b, buf.c), 0, buf.cache, tp::source_location::current());
  BOOST_TEST(!buf.fast(buf.a, buf.b, buf.c));  // planned, but the caller has not said it batched
  buf.cache.batched_plan = true;
  BOOST_TEST(buf.fast(buf.a, buf.b, buf.c));
  // Planning again clears it, until the caller has staged that call through the copy node.
  (void)td::plan_pairs(buf.statics(), std::tie(buf.a, buf.b, buf.c), 0, buf.cache, tp::source_location::current());
  BOOST_TEST(!buf.cache.batched_plan);
}

BOOST_AUTO_TEST_CASE(the_fast_path_gives_the_sources_in_pair_order) {
  Buffers buf;
  buf.plan_and_remember();
  std::array<const void*, 3> sources{};
  BOOST_REQUIRE(td::same_batched_plan(buf.statics(), std::tie(buf.c, buf.a, buf.b), 0, buf.cache, sources));
  BOOST_TEST(sources[0] == static_cast<const void*>(buf.c.data));
  BOOST_TEST(sources[1] == static_cast<const void*>(buf.a.data));
  BOOST_TEST(sources[2] == static_cast<const void*>(buf.b.data));
  BOOST_TEST(buf.fast(buf.gap, buf.gap, buf.gap));  // within the span of the statics, overlapping none
}

BOOST_AUTO_TEST_CASE(anything_the_plan_does_not_cover_leaves_the_fast_path) {
  Buffers buf;
  buf.plan_and_remember();
  Span shorter{buf.a.data, 63};
  Span elsewhere{buf.a.data, 64, 1};  // another device
  Span half_on_s1{buf.arena.data() + 96, 64};  // overlaps s1's first 32 floats
  Span last_of_s2{buf.arena.data() + 319, 1};
  Span after_s2{buf.arena.data() + 320, 64};  // begins where s2 ends: overlaps nothing
  BOOST_TEST(!buf.fast(shorter, buf.b, buf.c));
  BOOST_TEST(!buf.fast(buf.a, elsewhere, buf.c));
  BOOST_TEST(!buf.fast(buf.a, buf.b, half_on_s1));
  BOOST_TEST(!buf.fast(buf.s0, buf.b, buf.c));  // an input that is its own static buffer: a Skip
  BOOST_TEST(!buf.fast(buf.s1, buf.b, buf.c));  // another pair's static buffer
  BOOST_TEST(buf.fast(after_s2, buf.b, buf.c));
  BOOST_TEST(td::overlapped_static(buf.cache, td::byte_range(last_of_s2)) == 2);
  BOOST_TEST(td::overlapped_static(buf.cache, td::byte_range(after_s2)) == -1);
  BOOST_TEST(td::overlapped_static(buf.cache, td::byte_range(buf.gap)) == -1);
  BOOST_TEST(td::overlapped_static(buf.cache, td::byte_range(half_on_s1)) == 1);
  // Other static buffers, or the same ones of another size or device: planned anew.
  std::array<const void*, 3> unused{};
  Span s1_moved{buf.arena.data() + 512, 64};
  BOOST_TEST(!td::same_batched_plan(std::tie(buf.s0, s1_moved, buf.s2), std::tie(buf.a, buf.b, buf.c), 0, buf.cache,
                                    unused));
  Span s2_longer{buf.s2.data, 65};
  Span c_longer{buf.c.data, 65};
  BOOST_TEST(!td::same_batched_plan(std::tie(buf.s0, buf.s1, s2_longer), std::tie(buf.a, buf.b, c_longer), 0, buf.cache,
                                    unused));
  Span s0_elsewhere{buf.s0.data, 64, 1};
  BOOST_TEST(!td::same_batched_plan(std::tie(s0_elsewhere, buf.s1, buf.s2), std::tie(buf.a, buf.b, buf.c), 0, buf.cache,
                                    unused));
}

BOOST_AUTO_TEST_CASE(the_full_planning_refuses_what_the_fast_path_left_to_it) {
  Buffers buf;
  buf.plan_and_remember();
  Span half_on_s1{buf.arena.data() + 96, 64};
  Span shorter{buf.a.data, 63};
  const auto here = tp::source_location::current();
  BOOST_CHECK_THROW(td::plan_pairs(buf.statics(), std::tie(buf.a, buf.b, half_on_s1), 0, buf.cache, here), tp::usage_error);
  BOOST_CHECK_THROW(td::plan_pairs(buf.statics(), std::tie(shorter, buf.b, buf.c), 0, buf.cache, here), tp::usage_error);
  BOOST_CHECK_THROW(td::plan_pairs(std::tie(buf.s0, buf.s0, buf.s2), std::tie(buf.a, buf.b, buf.c), 0, buf.cache, here),
                    tp::usage_error);  // one static buffer named twice
  const auto skip = td::plan_pairs(buf.statics(), std::tie(buf.s0, buf.b, buf.c), 0, buf.cache, here);
  BOOST_TEST((skip[0].kind == td::StageKind::Skip));
  BOOST_TEST((skip[1].kind == td::StageKind::Batched));
  BOOST_TEST(!buf.cache.batched_plan);
}

BOOST_AUTO_TEST_SUITE_END()
