// bench/replay: host submit cost of Graph::replay against raw cudaGraphLaunch, and the cost of
// capture + instantiate, for graphs of 1, 10, 100 and 1000 kernels. One binary, one run.
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void add_one(float* x) { *x += 1.0f; }

constexpr int batch = 64;  // launches per timed batch

struct Fixture {
  tp::Stream stream;
  tp::DeviceTensor<float> scalar{1, stream};
  std::vector<int> sizes{1, 10, 100, 1000};
  std::vector<cudaGraphExec_t> raw;  // by size index
  std::vector<tp::Graph> ours;

  Fixture() {
    BENCH_CUDA(cudaMemsetAsync(scalar.data(), 0, sizeof(float), stream));
    for (int kernels : sizes) {
      raw.push_back(raw_capture(kernels));
      tp::Graph graph;
      graph.capture([&](tp::StreamRef s) { issue(kernels, s); }, {.stream = stream});
      ours.push_back(std::move(graph));
    }
  }
  ~Fixture() {
    for (cudaGraphExec_t e : raw) (void)cudaGraphExecDestroy(e);
  }

  void issue(int kernels, cudaStream_t s) {
    for (int k = 0; k < kernels; ++k) add_one<<<1, 1, 0, s>>>(scalar.data());
  }

  cudaGraphExec_t raw_capture(int kernels) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    issue(kernels, stream);
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    BENCH_CUDA(cudaGraphDestroy(graph));
    return exec;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Host submit cost of one launch: raw cudaGraphLaunch, Graph::replay(stream), Graph::replay().
void launch(benchmark::State& state) {
  auto& f = fixture();
  const auto i = static_cast<std::size_t>(state.range(0));
  cudaGraphExec_t exec = f.raw[i];
  tp::Graph& graph = f.ours[i];
  const tp::StreamRef stream = f.stream;
  tp::StreamGuard guard(f.stream);  // replay() finds this stream current
  bench::compare_submit(state, batch,
                        {{"raw", [&] { BENCH_CUDA(cudaGraphLaunch(exec, f.stream)); }},
                         {"replay_stream", [&] { graph.replay(stream); }},
                         {"replay_current", [&] { graph.replay(); }}});
}

// Capture + instantiate, raw stream capture against Graph::capture. Destruction is not timed.
void capture(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = f.sizes[state.range(0)];
  bench::compare_capture<tp::Graph>(state, f.stream, [&](cudaStream_t s) { f.issue(kernels, s); });
}

void register_all() {
  for (int i = 0; i < 4; ++i) {
    // Batches of the 1000-kernel graph take ~80 ms of device time to drain: fewer of them.
    const int batches = i < 2 ? 100 : i == 2 ? 30 : 8;
    benchmark::RegisterBenchmark("launch", launch)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    benchmark::RegisterBenchmark("capture", capture)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(i == 3 ? 10 : 100);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  const char* title = "bench/replay (medians of paired measurements; ratios against raw CUDA in this run)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    bench::for_each_size(r, fixture().sizes, [&](const std::string& kernels, const auto& us, int) {
      const double raw = us("launch", "raw");
      const double stream = us("launch", "replay_stream");
      const double current = us("launch", "replay_current");
      const double raw_ci = us("capture", "raw");
      const double ours_ci = us("capture", "ours");
      rows.push_back({kernels + ": raw cudaGraphLaunch, host submit", raw, "us", ""});
      rows.push_back({kernels + ": Graph::replay(stream), host submit", stream, "us", ""});
      rows.push_back({kernels + ": Graph::replay(), host submit", current, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": replay(stream) / raw", stream, raw, 1.05));
      rows.push_back(bench::ratio_row(kernels + ": replay() / raw", current, raw, 1.10));
      rows.push_back({kernels + ": raw capture + instantiate", raw_ci, "us", ""});
      rows.push_back({kernels + ": Graph::capture (+ instantiate)", ours_ci, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": capture+instantiate, ours / raw", ours_ci, raw_ci, 1.05));
    });
  });
}
