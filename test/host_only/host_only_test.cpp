// test/host_only/host_only_test.cpp: tensorplay from a translation unit compiled by g++ (and, in
// CI, checked with clang++), with only the CUDA include folders: capture, replay, update,
// stage_and_launch, pools, DeviceTensor, and conditional nodes with tensor predicates. The
// library's own kernels come from its embedded fatbin; the user's kernels from kernels.cu.
#include "host_support.hpp"
#include "kernels.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 1000;

std::vector<int> host(const tp::DeviceTensor<int>& t, tp::StreamRef s) { return t.to_host(s); }

}  // namespace

BOOST_AUTO_TEST_SUITE(host_only)

BOOST_AUTO_TEST_CASE(the_library_compiles_without_nvcc_and_checks_misuse) {
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.replay(tp::StreamRef{}), tp::usage_error);
  BOOST_CHECK_THROW(graph.capture_end(), tp::usage_error);
  static_assert(tp::Tensor<tp::DeviceTensor<float>> && tp::ScalarPredicate<tp::DeviceTensor<bool>>);
  static_assert(!tp::Tensor<std::vector<float>>);
}

HOST_GPU_TEST(capture_replay_update_and_pools_from_a_cpp_file) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y;
  std::vector<int> ones(n, 1);
  x.copy_from_host(ones, stream);
  tp::Graph graph;
  graph.capture(
      [&](tp::StreamRef s) {
        tp::DeviceTensor<int> temp(n, s);  // from the graph's pool
        host_only::affine(x.data(), temp.data(), n, 3, 0, s);
        y = tp::DeviceTensor<int>(n, s);
        host_only::affine(temp.data(), y.data(), n, 1, 4, s);
      },
      {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(host(y, stream)[n - 1] == 7);
  BOOST_TEST(y.pool() == graph.pool());
  const tp::UpdateResult r = graph.update([&](tp::StreamRef s) {
    tp::DeviceTensor<int> temp(n, s);
    host_only::affine(x.data(), temp.data(), n, 5, 0, s);
    host_only::affine(temp.data(), y.data(), n, 1, 4, s);
  }, {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated));
  graph.replay(stream);
  BOOST_TEST(host(y, stream)[0] == 9);
}

HOST_GPU_TEST(conditional_nodes_with_tensor_predicates_from_a_cpp_file) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<int> start(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  tp::DeviceTensor<int> sum(1, stream);
  tp::DeviceTensor<int> index(1, stream);
  tp::DeviceTensor<int> chosen(1, stream);
  const int five = 5;
  const bool t = true;
  const int two = 2;
  start.copy_from_host(std::span<const int>(&five, 1), stream);
  yes.copy_from_host(std::span<const bool>(&t, 1), stream);
  index.copy_from_host(std::span<const int>(&two, 1), stream);
  tp::Graph graph;
  graph.capture(
      [&](tp::StreamRef s) {
        BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(counter.data(), start.data(), sizeof(int), cudaMemcpyDeviceToDevice, s), cudaSuccess);
        BOOST_REQUIRE_EQUAL(cudaMemsetAsync(sum.data(), 0, sizeof(int), s), cudaSuccess);
        BOOST_REQUIRE_EQUAL(cudaMemsetAsync(more.data(), 1, 1, s), cudaSuccess);
        graph.while_(more, [&](tp::StreamRef body) { host_only::count_down(counter.data(), more.data(), sum.data(), 2, body); });
        graph.if_(yes, [&](tp::StreamRef body) { host_only::count_down(counter.data(), more.data(), sum.data(), 100, body); });
        graph.switch_(index,
                      [&](tp::StreamRef b) { BOOST_REQUIRE_EQUAL(cudaMemsetAsync(chosen.data(), 0, sizeof(int), b), cudaSuccess); },
                      [&](tp::StreamRef b) { BOOST_REQUIRE_EQUAL(cudaMemsetAsync(chosen.data(), 1, sizeof(int), b), cudaSuccess); },
                      [&](tp::StreamRef b) { BOOST_REQUIRE_EQUAL(cudaMemsetAsync(chosen.data(), 2, sizeof(int), b), cudaSuccess); });
      },
      {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(host(sum, stream)[0] == 5 * 2 + 100);
  BOOST_TEST(host(chosen, stream)[0] == 0x02020202);
}

HOST_GPU_TEST(a_handle_made_in_a_cpp_file_is_set_by_a_kernel_compiled_elsewhere) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<int> sum(1, stream);
  const int four = 4;
  const int zero = 0;
  tp::Graph graph;
  graph.capture(
      [&](tp::StreamRef) {
        const tp::ConditionalHandle loop = graph.conditional_handle(1);  // a do-while
        graph.while_(loop, [&](tp::StreamRef body) { host_only::count_down_setting(counter.data(), sum.data(), 3, loop.native(), body); });
      },
      {.stream = stream});
  BOOST_TEST(graph.node_count() == 1u);  // the while node alone: no kernel of the library's
  counter.copy_from_host(std::span<const int>(&four, 1), stream);
  sum.copy_from_host(std::span<const int>(&zero, 1), stream);
  graph.replay(stream);
  BOOST_TEST(host(sum, stream)[0] == 4 * 3);
}

HOST_GPU_TEST(stage_and_launch_from_a_cpp_file) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  const bool t = true;
  yes.copy_from_host(std::span<const bool>(&t, 1), stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) { graph.if_(yes, [&](tp::StreamRef b) { host_only::affine(x.data(), y.data(), n, 2, 1, b); }); },
                {.stream = stream});
  for (int round = 1; round <= 3; ++round) {
    std::vector<int> fresh_host(n, round);
    tp::DeviceTensor<int> fresh(n, stream);
    fresh.copy_from_host(fresh_host, stream);
    graph.stage_and_launch(std::tie(x), std::tie(fresh), stream);
    BOOST_TEST(host(y, stream)[n / 2] == 2 * round + 1);
  }
  // A host source and a converting source: the library's gather kernel, no nvcc needed.
  std::vector<short> shorts(n, 7);
  tp::DeviceTensor<short> dev_shorts(n, stream);
  dev_shorts.copy_from_host(shorts, stream);
  graph.stage_and_launch(std::tie(x), std::tie(dev_shorts), stream);
  BOOST_TEST(host(y, stream)[0] == 15);
  std::vector<int> host_values(n, 9);
  std::span<int> host_input(host_values);
  graph.stage_and_launch(std::tie(x), std::tie(host_input), stream);
  BOOST_TEST(host(y, stream)[n - 1] == 19);
}

BOOST_AUTO_TEST_SUITE_END()
