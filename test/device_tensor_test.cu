// Tests for tensorplay/device_tensor.hpp.
#include "support.hpp"

#include <tensorplay/device_tensor.hpp>

#include <boost/test/unit_test.hpp>

#include <numeric>
#include <type_traits>
#include <vector>

namespace tp = tensorplay;

static_assert(!std::is_copy_constructible_v<tp::DeviceTensor<float>>);
static_assert(!std::is_copy_assignable_v<tp::DeviceTensor<float>>);
static_assert(std::is_nothrow_move_constructible_v<tp::DeviceTensor<float>>);
static_assert(std::is_nothrow_move_assignable_v<tp::DeviceTensor<float>>);

BOOST_AUTO_TEST_SUITE(device_tensor)

BOOST_AUTO_TEST_CASE(empty_tensor_has_no_memory_and_needs_no_gpu) {
  tp::DeviceTensor<float> empty;
  BOOST_TEST(empty.data() == nullptr);
  BOOST_TEST(empty.size() == 0u);
  BOOST_TEST(empty.bytes() == 0u);
  BOOST_TEST(empty.device() == -1);
  BOOST_TEST(empty.pool().empty());
}

TP_GPU_TEST(tensor_round_trips_host_data) {
  tp::Stream stream;
  std::vector<int> values(1000);
  std::iota(values.begin(), values.end(), -7);
  tp::DeviceTensor<int> t(values.size(), stream);
  BOOST_TEST(t.size() == 1000u);
  BOOST_TEST(t.bytes() == 4000u);
  BOOST_TEST(t.device() == 0);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(t.data()) % 256 == 0u);
  t.copy_from_host(values, stream);
  BOOST_TEST(t.to_host(stream) == values, boost::test_tools::per_element());
}

TP_GPU_TEST(copy_from_host_with_wrong_size_throws_usage_error) {
  tp::Stream stream;
  tp::DeviceTensor<int> t(4, stream);
  std::vector<int> three(3);
  BOOST_CHECK_THROW(t.copy_from_host(three, stream), tp::usage_error);
}

TP_GPU_TEST(moved_from_tensor_is_empty_and_target_keeps_the_memory) {
  tp::Stream stream;
  tp::DeviceTensor<float> a(64, stream);
  float* ptr = a.data();
  tp::DeviceTensor<float> b(std::move(a));
  BOOST_TEST(a.data() == nullptr);
  BOOST_TEST(a.size() == 0u);
  BOOST_TEST(b.data() == ptr);
  tp::DeviceTensor<float> c(8, stream);
  c = std::move(b);  // c's old block goes back to the pool
  BOOST_TEST(c.data() == ptr);
  BOOST_TEST(c.size() == 64u);
}

TP_GPU_TEST(tensors_outside_capture_come_from_the_default_pool_and_reuse_it) {
  tp::Stream stream;
  void* first = nullptr;
  {
    tp::DeviceTensor<float> t(1000, stream);
    first = t.data();
    BOOST_TEST(t.pool() == tp::Pool::default_for(0));
  }
  tp::DeviceTensor<float> again(1000, stream);  // same stream: the freed block is reused
  BOOST_TEST(again.data() == first);
}

TP_GPU_TEST(tensor_keeps_its_pool_alive) {
  tp::Stream stream;
  tp::PoolId id;
  tp::DeviceTensor<float> survivor;
  {
    tp::Graph graph;
    graph.capture([&](tp::StreamRef s) {
      survivor = tp::DeviceTensor<float>(256, s);
      tp_test::fill(survivor.data(), 256, 3.0f, s);
    }, {.stream = stream});
    id = graph.pool_id();
    graph.replay(stream);
    stream.synchronize();
  }
  // The graph is gone; its pool lives on through the tensor.
  BOOST_CHECK_NO_THROW(tp::Pool{id});
  BOOST_TEST(survivor.pool().id() == id);
  BOOST_TEST(survivor.to_host(stream) == std::vector<float>(256, 3.0f), boost::test_tools::per_element());
  survivor = {};
  BOOST_CHECK_THROW(tp::Pool{id}, tp::usage_error);
}

TP_GPU_TEST(unused_default_pool_memory_goes_back_to_cuda_on_request) {
  tp::Stream stream;
  const std::size_t n = std::size_t{64} << 20;  // 256 MiB of floats
  {
    tp::DeviceTensor<float> big(n, stream);
    tp_test::fill(big.data(), n, 1.0f, stream);
    stream.synchronize();
  }
  const std::size_t cached = tp::Pool::default_for(0).reserved_bytes();
  BOOST_TEST(cached >= n * sizeof(float));  // freed, but cached by the pool
  const std::size_t in_use = tp_test::device_bytes_in_use();
  const std::size_t released = tp::Pool::release_unused_default_memory();
  BOOST_TEST(released >= n * sizeof(float));
  BOOST_TEST(tp::Pool::default_for(0).reserved_bytes() == cached - released);
  if (tp_test::gpu_to_itself()) BOOST_TEST(tp_test::device_bytes_in_use() + n * sizeof(float) <= in_use);
}

BOOST_AUTO_TEST_SUITE_END()
