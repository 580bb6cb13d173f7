// Tests for tensorplay/stream.hpp.
#include "support.hpp"

#include <tensorplay/stream.hpp>

#include <boost/test/unit_test.hpp>

#include <string>
#include <thread>
#include <type_traits>

namespace tp = tensorplay;

BOOST_AUTO_TEST_SUITE(stream)

static_assert(std::is_convertible_v<cudaStream_t, tp::StreamRef>);
static_assert(std::is_convertible_v<tp::StreamRef, cudaStream_t>);
static_assert(!std::is_constructible_v<tp::StreamRef, int>, "StreamRef(0) must not compile");
static_assert(!std::is_constructible_v<tp::StreamRef, std::nullptr_t>);
static_assert(std::is_convertible_v<tp::Stream&, tp::StreamRef>);
static_assert(std::is_convertible_v<tp::Stream&, cudaStream_t>);
static_assert(!std::is_copy_constructible_v<tp::Stream> && std::is_nothrow_move_constructible_v<tp::Stream>);
static_assert(std::is_nothrow_move_assignable_v<tp::Stream>);

BOOST_AUTO_TEST_CASE(default_stream_ref_is_the_legacy_default_stream) {
  constexpr tp::StreamRef ref;
  static_assert(ref.is_legacy_default());
  BOOST_TEST(ref.get() == cudaStream_t{});
  BOOST_TEST(tp::StreamRef(cudaStreamLegacy).is_legacy_default());
}

TP_NO_GPU_TEST(creating_a_stream_without_a_gpu_says_there_is_no_usable_device) {
  try {
    tp::Stream stream;
    BOOST_FAIL("a Stream was created without a GPU");
  } catch (const tp::cuda_error& e) {
    BOOST_TEST(std::string(e.what()).find("no usable CUDA device") != std::string::npos, e.what());
  }
}

TP_GPU_TEST(stream_is_non_blocking_and_owned) {
  tp::Stream stream;
  unsigned flags = 0;
  BOOST_REQUIRE_EQUAL(cudaStreamGetFlags(stream, &flags), cudaSuccess);
  BOOST_TEST(flags == static_cast<unsigned>(cudaStreamNonBlocking));
  BOOST_TEST(stream.device() == 0);
  BOOST_TEST(!stream.is_capturing());
  stream.synchronize();
}

TP_GPU_TEST(moving_a_stream_transfers_ownership_and_empties_the_source) {
  tp::Stream a;
  const cudaStream_t handle = a.get();
  tp::Stream b(std::move(a));
  BOOST_TEST(b.get() == handle);
  BOOST_TEST(a.get() == cudaStream_t{});
  tp::Stream c;
  c = std::move(b);  // c's own stream is destroyed, not leaked
  BOOST_TEST(c.get() == handle);
  BOOST_TEST(b.get() == cudaStream_t{});
  c.synchronize();
}

TP_GPU_TEST(current_stream_is_legacy_default_until_a_guard_changes_it) {
  BOOST_TEST(tp::current_stream().is_legacy_default());
  tp::Stream stream;
  {
    tp::StreamGuard guard(stream);
    BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));
    tp::Stream inner;
    {
      tp::StreamGuard nested(inner);
      BOOST_TEST(tp::current_stream() == tp::StreamRef(inner));
    }
    BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));
  }
  BOOST_TEST(tp::current_stream().is_legacy_default());
}

TP_GPU_TEST(current_stream_is_per_thread) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  bool other_thread_sees_default = false;
  std::thread([&] {
    BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
    other_thread_sees_default = tp::current_stream().is_legacy_default();
  }).join();
  BOOST_TEST(other_thread_sees_default);
  BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));
}

TP_GPUS_TEST(stream_guard_switches_to_the_streams_device_and_back, 2) {
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  tp::Stream on_one(1);
  BOOST_TEST(on_one.device() == 1);
  {
    tp::StreamGuard guard(on_one);
    int device = -1;
    BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
    BOOST_TEST(device == 1);
    BOOST_TEST(tp::current_stream() == tp::StreamRef(on_one));
  }
  int device = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
  BOOST_TEST(device == 0);
  BOOST_TEST(tp::current_stream().is_legacy_default());
}

BOOST_AUTO_TEST_SUITE_END()
