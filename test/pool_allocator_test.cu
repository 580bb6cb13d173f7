// Tests of the caching allocator behind Pool (tensorplay/detail/caching_allocator.hpp), on host
// memory: the block bookkeeping (best fit, split, coalesce, reuse keys) needs no GPU, so these
// cases run everywhere, CI included.
#include "support.hpp"

#include <tensorplay/detail/caching_allocator.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace td = tensorplay::detail;

namespace {

// Host memory in place of cudaMalloc, and a table in place of "which capture is this stream in".
struct Fake : tp_test::HostSegments<Fake> {
  static inline std::map<cudaStream_t, td::CaptureSeq> capturing;

  static td::CaptureSeq capture_seq(cudaStream_t stream) {
    auto it = capturing.find(stream);
    return it == capturing.end() ? 0 : it->second;
  }
};

const td::AllocatorBackend fake_backend{&Fake::allocate, &Fake::release, &Fake::capture_seq};

cudaStream_t stream(int i) { return reinterpret_cast<cudaStream_t>(std::uintptr_t(0x1000 + 0x10 * i)); }

const std::source_location here = std::source_location::current();
constexpr std::size_t kib = 1024;
constexpr std::size_t mib = 1024 * kib;

// Checks that no two allocated blocks overlap, that the blocks tile every segment, and that
// the pool's counters agree with its blocks.
void check_invariants(const td::PoolImpl& pool) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> allocated;
  std::size_t allocated_bytes = 0;
  std::size_t all_bytes = 0;
  std::size_t free_blocks = 0;
  pool.visit_blocks([&](const void* ptr, std::size_t size, bool is_allocated) {
    all_bytes += size;
    if (is_allocated) {
      allocated.emplace_back(reinterpret_cast<std::uintptr_t>(ptr), size);
      allocated_bytes += size;
    } else {
      ++free_blocks;
    }
  });
  std::sort(allocated.begin(), allocated.end());
  for (std::size_t i = 1; i < allocated.size(); ++i)
    BOOST_REQUIRE_MESSAGE(allocated[i - 1].first + allocated[i - 1].second <= allocated[i].first, "allocated blocks overlap");
  BOOST_REQUIRE_EQUAL(allocated_bytes, pool.allocated_bytes());
  BOOST_REQUIRE_EQUAL(all_bytes, pool.reserved_bytes());
  BOOST_REQUIRE_EQUAL(free_blocks, pool.free_block_count());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pool_allocator)

BOOST_AUTO_TEST_CASE(random_allocations_never_overlap_and_counters_agree) {
  {
    td::PoolImpl pool(0, 1, td::PoolImpl::Kind::Default, fake_backend);
    std::mt19937 rng(7);
    std::vector<std::pair<td::Block*, std::size_t>> live;  // block, bytes asked
    for (int step = 0; step < 20000; ++step) {
      const bool allocate = live.empty() || (rng() % 100) < 55;
      if (allocate) {
        const std::size_t bytes = (rng() % 10 == 0) ? 1 + rng() % (24 * mib) : 1 + rng() % (64 * kib);
        td::Block* b = pool.allocate(bytes, stream(rng() % 4), 0, here);
        BOOST_REQUIRE(b->size >= bytes);
        BOOST_REQUIRE(reinterpret_cast<std::uintptr_t>(b->ptr) % 256 == 0);
        live.emplace_back(b, bytes);
      } else {
        const std::size_t i = rng() % live.size();
        pool.free(live[i].first);
        live[i] = live.back();
        live.pop_back();
      }
      if (step % 97 == 0) check_invariants(pool);
    }
    check_invariants(pool);
    for (auto& [b, bytes] : live) pool.free(b);
    BOOST_TEST(pool.allocated_bytes() == 0u);
    check_invariants(pool);
  }
  BOOST_TEST(Fake::live.empty());  // every segment went back when the pool died
}

BOOST_AUTO_TEST_CASE(freed_block_is_reused_on_its_stream_but_not_on_another) {
  td::PoolImpl pool(0, 2, td::PoolImpl::Kind::Default, fake_backend);
  td::Block* a = pool.allocate(100 * kib, stream(1), 0, here);
  char* where = a->ptr;
  pool.free(a);
  td::Block* other = pool.allocate(100 * kib, stream(2), 0, here);
  BOOST_TEST(static_cast<void*>(other->ptr) != static_cast<void*>(where));
  td::Block* same = pool.allocate(100 * kib, stream(1), 0, here);
  BOOST_TEST(static_cast<void*>(same->ptr) == static_cast<void*>(where));
  pool.free(other);
  pool.free(same);
  check_invariants(pool);
}

BOOST_AUTO_TEST_CASE(free_neighbours_coalesce_into_one_block) {
  td::PoolImpl pool(0, 3, td::PoolImpl::Kind::Default, fake_backend);
  td::Block* a = pool.allocate(256 * kib, stream(1), 0, here);
  td::Block* b = pool.allocate(256 * kib, stream(1), 0, here);
  char* first = a->ptr;
  pool.free(a);
  pool.free(b);
  td::Block* both = pool.allocate(512 * kib, stream(1), 0, here);  // fits only if a and b merged
  BOOST_TEST(static_cast<void*>(both->ptr) == static_cast<void*>(first));
  BOOST_TEST(pool.reserved_bytes() == td::small_segment);
  pool.free(both);
}

BOOST_AUTO_TEST_CASE(block_freed_in_capture_is_reused_only_on_its_stream_until_the_capture_ends) {
  td::PoolImpl pool(0, 4, td::PoolImpl::Kind::Graph, fake_backend);
  const td::CaptureSeq seq = 70;
  BOOST_REQUIRE(pool.try_begin_capture(seq));
  BOOST_TEST(!pool.try_begin_capture(71));  // one capture at a time
  Fake::capturing = {{stream(1), seq}, {stream(2), seq}};  // stream 2 joined the capture (a fork)
  td::Block* a = pool.allocate(64 * kib, stream(1), seq, here);
  char* where = a->ptr;
  pool.free(a);
  td::Block* on_fork = pool.allocate(64 * kib, stream(2), seq, here);
  BOOST_TEST(static_cast<void*>(on_fork->ptr) != static_cast<void*>(where));
  td::Block* same = pool.allocate(64 * kib, stream(1), seq, here);
  BOOST_TEST(static_cast<void*>(same->ptr) == static_cast<void*>(where));
  pool.free(same);
  pool.free(on_fork);
  pool.end_capture();
  Fake::capturing = {{stream(3), 80}};
  BOOST_REQUIRE(pool.try_begin_capture(80));
  td::Block* later = pool.allocate(64 * kib, stream(3), 80, here);  // any stream of a later capture
  BOOST_TEST(static_cast<void*>(later->ptr) == static_cast<void*>(where));
  pool.free(later);
  pool.end_capture();
  Fake::capturing.clear();
  check_invariants(pool);
}

BOOST_AUTO_TEST_CASE(block_used_on_another_stream_waits_for_the_end_of_the_capture) {
  td::PoolImpl pool(0, 5, td::PoolImpl::Kind::Graph, fake_backend);
  BOOST_REQUIRE(pool.try_begin_capture(90));
  Fake::capturing = {{stream(1), 90}};
  td::Block* a = pool.allocate(64 * kib, stream(1), 90, here);
  char* where = a->ptr;
  pool.record_use(a, stream(5));
  pool.free(a);
  td::Block* b = pool.allocate(64 * kib, stream(1), 90, here);
  BOOST_TEST(static_cast<void*>(b->ptr) != static_cast<void*>(where));
  pool.free(b);
  pool.end_capture();
  BOOST_REQUIRE(pool.try_begin_capture(91));
  Fake::capturing = {{stream(1), 91}};
  td::Block* c = pool.allocate(64 * kib, stream(1), 91, here);
  BOOST_TEST(static_cast<void*>(c->ptr) == static_cast<void*>(where));
  pool.free(c);
  pool.end_capture();
  Fake::capturing.clear();
  check_invariants(pool);
}

BOOST_AUTO_TEST_CASE(what_a_closed_body_allocated_belongs_to_the_parent_stream) {
  td::PoolImpl pool(0, 6, td::PoolImpl::Kind::Graph, fake_backend);
  BOOST_REQUIRE(pool.try_begin_capture(100));
  pool.add_body_sequence(101);
  Fake::capturing = {{stream(1), 100}, {stream(9), 101}};  // 9: the body's stream
  td::Block* in_body = pool.allocate(64 * kib, stream(9), 101, here);
  char* where = in_body->ptr;
  pool.free(in_body);
  pool.end_body_sequence(101, stream(9), 100, stream(1));
  Fake::capturing = {{stream(1), 100}};
  td::Block* after = pool.allocate(64 * kib, stream(1), 100, here);
  BOOST_TEST(static_cast<void*>(after->ptr) == static_cast<void*>(where));
  pool.free(after);
  pool.end_capture();
  Fake::capturing.clear();
  check_invariants(pool);
}

BOOST_AUTO_TEST_CASE(only_segments_with_no_block_in_use_are_released) {
  td::PoolImpl pool(0, 7, td::PoolImpl::Kind::Default, fake_backend);
  td::Block* a = pool.allocate(64 * kib, stream(1), 0, here);    // small segment, kept in use
  td::Block* b = pool.allocate(12 * mib, stream(1), 0, here);    // its own segment
  td::Block* c = pool.allocate(64 * kib, stream(2), 0, here);    // shares a's segment
  pool.free(b);
  pool.free(c);  // a's segment now has free blocks under two keys, and a in use
  const std::size_t before = pool.reserved_bytes();
  const std::size_t released = pool.release_unused_segments();
  BOOST_TEST(released == td::round_up(12 * mib, td::small_segment));
  BOOST_TEST(pool.reserved_bytes() == before - released);
  check_invariants(pool);
  pool.free(a);
  BOOST_TEST(pool.release_unused_segments() == td::small_segment);
  BOOST_TEST(pool.reserved_bytes() == 0u);
  check_invariants(pool);
}

BOOST_AUTO_TEST_SUITE_END()
