// The README's first example, run verbatim: the block between the markers below is the code
// block of README.md (test/readme_sync.sh checks that they are the same text). Around it, this
// file defines what the README leaves to the reader: n, blocks, load_input, scale and iterate.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

namespace {

constexpr std::size_t n = 5000;
constexpr unsigned blocks = (n + 255) / 256;

// y = 2 x; the residual starts at 1.
__global__ void scale(const float* x, float* y, float* residual, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
  if (i == 0) *residual = 1.0f;
}

// Halves y and the residual: the loop runs 20 times (2^-20 is the first power below 1e-6).
__global__ void iterate(float* y, float* residual, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) y[i] *= 0.5f;
  if (i == 0) *residual *= 0.5f;
}

int inputs_loaded = 0;

// The first call returns ones, the second threes.
tensorplay::DeviceTensor<float> load_input(tensorplay::StreamRef stream) {
  ++inputs_loaded;
  tensorplay::DeviceTensor<float> t(n, stream);
  const std::vector<float> host(n, inputs_loaded == 1 ? 1.0f : 3.0f);
  t.copy_from_host(host, stream);
  return t;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(readme)

TP_GPU_TEST(the_first_example_runs_as_written) {
  // README begin
  namespace tp = tensorplay;

  tp::Stream stream;
  tp::DeviceTensor<float> x = load_input(stream);          // a static input
  tp::DeviceTensor<float> y;                               // allocated during capture
  tp::DeviceTensor<float> r(1, stream);                    // the residual: scale sets it, iterate lowers it
  float* residual = r.data();
  const float tol = 1e-6f;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    y = tp::DeviceTensor<float>(n, s);                     // from the graph's private pool
    scale<<<blocks, 256, 0, s>>>(x.data(), y.data(), residual, n);
    graph.while_([=] __device__ { return *residual > tol; },   // loops on the GPU
                 [&](tp::StreamRef body) { iterate<<<blocks, 256, 0, body>>>(y.data(), residual, n); });
  }, {.stream = stream});

  graph.replay(stream);                                    // costs what cudaGraphLaunch costs
  tp::DeviceTensor<float> fresh_x = load_input(stream);    // new data for x
  graph.stage_and_launch(std::tie(x), std::tie(fresh_x), stream);  // copy inputs + replay, one call
  // README end

  stream.synchronize();
  const float expected_residual = std::ldexp(1.0f, -20);
  BOOST_TEST(r.to_host(stream)[0] == expected_residual);
  const std::vector<float> staged = x.to_host(stream);
  const std::vector<float> out = y.to_host(stream);
  std::size_t wrong_x = 0;
  std::size_t wrong_y = 0;
  for (std::size_t i = 0; i < n; ++i) {
    wrong_x += staged[i] != 3.0f;
    wrong_y += out[i] != 6.0f * expected_residual;
  }
  BOOST_TEST(wrong_x == 0u);
  BOOST_TEST(wrong_y == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
