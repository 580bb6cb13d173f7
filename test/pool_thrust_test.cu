// Tests for PoolAllocator (tensorplay/pool.hpp) with Thrust and CUB inside captured graphs.
#include "support.hpp"

#include <tensorplay/graph.hpp>
#include <tensorplay/thrust.hpp>

#include <boost/test/unit_test.hpp>

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace tp = tensorplay;

namespace {
struct Square {
  __host__ __device__ long long operator()(int x) const { return static_cast<long long>(x) * x; }
};

std::vector<int> random_ints(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  std::vector<int> v(n);
  for (int& x : v) x = dist(rng);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(pool_thrust)

TP_GPU_TEST(device_vector_with_pool_allocator_uses_the_default_pool_outside_capture) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  const tp::Pool pool = tp::Pool::default_for(0);
  const std::size_t before = pool.allocated_bytes();
  {
    thrust::device_vector<float, tp::PoolAllocator<float>> v(1 << 20, 2.0f);
    BOOST_TEST(pool.allocated_bytes() >= before + (4u << 20));
    BOOST_TEST(v[12345] == 2.0f);
  }
  BOOST_TEST(pool.allocated_bytes() == before);
}

TP_GPU_TEST(pool_allocator_inside_capture_allocates_from_the_graphs_pool) {
  tp::Stream stream;
  tp::Graph graph;
  void* ptr = nullptr;
  graph.capture_begin({.stream = stream});
  {
    tp::PoolAllocator<int> alloc(stream);
    auto p = alloc.allocate(1000);
    ptr = p.get();
    BOOST_TEST(graph.pool().allocated_bytes() >= 4000u);
    alloc.deallocate(p, 1000);
  }
  graph.capture_end();
  BOOST_TEST(ptr != nullptr);
  BOOST_TEST(graph.pool().allocated_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(record_stream_on_memory_not_from_a_pool_allocator_throws_usage_error) {
  int local = 0;
  BOOST_CHECK_THROW(tp::record_stream(&local, tp::StreamRef{}), tp::usage_error);
}

TP_GPU_TEST(thrust_sort_and_transform_with_cub_reduce_and_scan_replay_on_fresh_data) {
  tp::Stream stream;
  const std::size_t n = 1 << 18;
  tp::DeviceTensor<int> input(n, stream);       // the static input
  tp::DeviceTensor<int> sorted;                 // outputs, allocated during the capture
  tp::DeviceTensor<long long> sum_of_squares;
  tp::DeviceTensor<int> scan;
  tp::DeviceTensor<int> total;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp::PoolAllocator<char> temp(s);
    const auto policy = thrust::cuda::par_nosync(temp).on(s);
    sorted = tp::DeviceTensor<int>(n, s);
    BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(sorted.data(), input.data(), n * sizeof(int), cudaMemcpyDeviceToDevice, s), cudaSuccess);
    thrust::sort(policy, sorted.data(), sorted.data() + n);
    tp::DeviceTensor<long long> squares(n, s);
    thrust::transform(policy, input.data(), input.data() + n, squares.data(), Square{});
    // Reductions and scans with device outputs, temporary storage from the pool.
    sum_of_squares = tp::DeviceTensor<long long>(1, s);
    std::size_t bytes = 0;
    BOOST_REQUIRE_EQUAL(cub::DeviceReduce::Sum(nullptr, bytes, squares.data(), sum_of_squares.data(), n, s), cudaSuccess);
    tp::DeviceTensor<char> reduce_temp(bytes, s);
    BOOST_REQUIRE_EQUAL(cub::DeviceReduce::Sum(reduce_temp.data(), bytes, squares.data(), sum_of_squares.data(), n, s), cudaSuccess);
    scan = tp::DeviceTensor<int>(n, s);
    bytes = 0;
    BOOST_REQUIRE_EQUAL(cub::DeviceScan::InclusiveSum(nullptr, bytes, input.data(), scan.data(), n, s), cudaSuccess);
    tp::DeviceTensor<char> scan_temp(bytes, s);
    BOOST_REQUIRE_EQUAL(cub::DeviceScan::InclusiveSum(scan_temp.data(), bytes, input.data(), scan.data(), n, s), cudaSuccess);
    total = tp::DeviceTensor<int>(1, s);
    BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(total.data(), scan.data() + n - 1, sizeof(int), cudaMemcpyDeviceToDevice, s), cudaSuccess);
  }, {.stream = stream});

  for (unsigned seed : {1u, 2u, 3u}) {
    const std::vector<int> values = random_ints(n, seed);
    input.copy_from_host(values, stream);
    graph.replay(stream);
    std::vector<int> expected_sorted = values;
    std::sort(expected_sorted.begin(), expected_sorted.end());
    long long squares = 0;
    for (int v : values) squares += static_cast<long long>(v) * v;
    const long long sum = std::accumulate(values.begin(), values.end(), 0LL);
    BOOST_TEST(sorted.to_host(stream) == expected_sorted, boost::test_tools::per_element());
    BOOST_TEST(sum_of_squares.to_host(stream)[0] == squares);
    BOOST_TEST(total.to_host(stream)[0] == sum);
    BOOST_TEST(scan.to_host(stream)[n / 2] == std::accumulate(values.begin(), values.begin() + n / 2 + 1, 0));
  }
}

TP_GPU_TEST(thrust_reduce_inside_a_capture_fails_cleanly_because_it_synchronises) {
  // thrust::reduce returns its result to the host, so it synchronises the stream: that cannot
  // be captured. The capture fails, nothing is left capturing, and the graph captures again.
  tp::Stream stream;
  tp::DeviceTensor<int> input(1024, stream);
  tp::Graph graph;
  bool threw = false;
  try {
    graph.capture([&](tp::StreamRef s) {
      tp::PoolAllocator<char> temp(s);
      (void)thrust::reduce(thrust::cuda::par_nosync(temp).on(s), input.data(), input.data() + 1024);
    }, {.stream = stream});
  } catch (const std::exception&) {
    threw = true;
  }
  BOOST_TEST(threw);
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(!graph.is_capturing());
  BOOST_CHECK_NO_THROW(graph.capture([&](tp::StreamRef s) { tp_test::fill(input.data(), 1024, 1, s); }, {.stream = stream}));
}

BOOST_AUTO_TEST_SUITE_END()
