// test/host_only/random_host_test.cpp: RandomState from a translation unit compiled by g++, with
// only the CUDA include folders: next() eagerly and inside a Graph's capture. The advance kernels
// come from the library's embedded fatbin, the drawing kernel from random_kernels.cu.
#include "host_support.hpp"
#include "random_kernels.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 1000;

std::vector<float> host(const float* device, std::size_t count, cudaStream_t s) {
  std::vector<float> out(count);
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(out.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s), cudaSuccess);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_only_random)

BOOST_AUTO_TEST_CASE(random_state_compiles_without_nvcc) {
  static_assert(std::is_trivially_copyable_v<tp::PhiloxArgs>);
  static_assert(!std::is_copy_constructible_v<tp::RandomState> && std::is_move_constructible_v<tp::RandomState>);
}

HOST_GPU_TEST(next_from_a_cpp_file_draws_fresh_numbers_at_every_replay) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  tp::DeviceTensor<float> out(n, stream);
  tp::DeviceTensor<float> replayed(n * 3, stream);
  tp::RandomState rng(11);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { host_only_random::draw(out.data(), n, rng.next(1), s); }, {.stream = stream});
  for (std::size_t r = 0; r < 3; ++r) {
    graph.replay(stream);
    BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(replayed.data() + r * n, out.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                        cudaSuccess);
  }
  tp::DeviceTensor<float> eager(n * 3, stream);
  tp::RandomState eager_rng(11);
  for (std::size_t r = 0; r < 3; ++r) host_only_random::draw(eager.data() + r * n, n, eager_rng.next(1), stream);
  const std::vector<float> a = host(replayed.data(), n * 3, stream);
  const std::vector<float> b = host(eager.data(), n * 3, stream);
  BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(a.data(), a.data() + n, n * sizeof(float)) != 0);
  BOOST_TEST(rng.offset() == 3u);
}

BOOST_AUTO_TEST_SUITE_END()
