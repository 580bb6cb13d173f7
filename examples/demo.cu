// examples/demo.cu: the library's main job in one screen.
//
// A step made of many small kernels pays CPU launch cost per kernel. Captured once into a
// tensorplay::Graph, the whole step is one launch. The demo runs the same step eagerly and
// as a graph, checks that both compute the same, prints their times side by side, and writes
// a DOT rendering of the graph.
//
//     bazel run //examples:demo -- [--kernels=N] [--steps=N] [--dot=PATH]
#include <tensorplay/graph.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

// One small kernel of the step: x = a * x + b over a short vector.
__global__ void axpb(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

struct Options {
  int kernels = 200;
  int steps = 500;
  std::string dot = "tensorplay-demo.dot";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--kernels=", 0) == 0) o.kernels = std::atoi(arg.c_str() + 10);
    else if (arg.rfind("--steps=", 0) == 0) o.steps = std::atoi(arg.c_str() + 8);
    else if (arg.rfind("--dot=", 0) == 0) o.dot = arg.substr(6);
    else {
      std::fprintf(stderr, "usage: demo [--kernels=N] [--steps=N] [--dot=PATH]\n");
      std::exit(2);
    }
  }
  return o;
}

// The step: many dependent small kernels on the current stream.
void step(tp::DeviceTensor<float>& x, int kernels) {
  const int n = static_cast<int>(x.size());
  for (int k = 0; k < kernels; ++k) {
    const float a = (k % 2 == 0) ? 1.0001f : 0.9999f;
    axpb<<<(n + 255) / 256, 256, 0, tp::current_stream()>>>(x.data(), n, a, 0.001f);
  }
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("tensorplay demo: no usable CUDA device here, so there is nothing to run.\n"
                "Build check passed; run the demo on a machine with an NVIDIA GPU.\n");
    return 0;
  }
  tp::Stream stream;
  tp::StreamGuard guard(stream);  // everything below follows the current-stream convention
  const int n = 4096;

  tp::DeviceTensor<float> eager_x(n);
  tp::DeviceTensor<float> graph_x(n);
  const std::vector<float> start(n, 1.0f);
  eager_x.copy_from_host(start);
  graph_x.copy_from_host(start);

  // Eager: every kernel launched from the host, every step.
  step(eager_x, options.kernels);  // warm-up
  eager_x.copy_from_host(start);
  stream.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < options.steps; ++s) step(eager_x, options.kernels);
  stream.synchronize();
  const double eager_ms = milliseconds_since(t0);

  // Graph: captured once, replayed every step.
  t0 = std::chrono::steady_clock::now();
  tp::Graph graph;
  graph.capture([&] { step(graph_x, options.kernels); });
  const double capture_ms = milliseconds_since(t0);
  graph.replay();  // warm-up (uploads the graph)
  graph_x.copy_from_host(start);
  stream.synchronize();
  t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < options.steps; ++s) graph.replay();
  stream.synchronize();
  const double graph_ms = milliseconds_since(t0);

  // Same work, same result.
  const std::vector<float> a = eager_x.to_host();
  const std::vector<float> b = graph_x.to_host();
  const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  graph.debug_dump(options.dot);

  const double launches = double(options.kernels) * options.steps;
  std::printf("tensorplay demo: %d steps of %d small kernels (%.0f launches)\n", options.steps, options.kernels, launches);
  std::printf("  %-28s %12s %16s\n", "", "total ms", "us per kernel");
  std::printf("  %-28s %12.2f %16.3f\n", "eager (kernel by kernel)", eager_ms, eager_ms * 1e3 / launches);
  std::printf("  %-28s %12.2f %16.3f\n", "tensorplay::Graph replay", graph_ms, graph_ms * 1e3 / launches);
  std::printf("  speed-up %.2fx; capture + instantiate took %.2f ms once\n", eager_ms / graph_ms, capture_ms);
  std::printf("  results %s; graph of %zu nodes written to %s\n", same ? "identical" : "DIFFER", graph.node_count(),
              options.dot.c_str());
  return same ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tensorplay demo failed: %s\n", e.what());
  return 1;
}
