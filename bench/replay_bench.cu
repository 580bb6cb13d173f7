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

void raw_launch(benchmark::State& state) {
  auto& f = fixture();
  cudaGraphExec_t exec = f.raw[state.range(0)];
  for (auto _ : state)
    state.SetIterationTime(bench::host_submit_seconds(batch, f.stream, [&] { BENCH_CUDA(cudaGraphLaunch(exec, f.stream)); }));
}

void replay_stream(benchmark::State& state) {
  auto& f = fixture();
  tp::Graph& graph = f.ours[state.range(0)];
  const tp::StreamRef stream = f.stream;
  for (auto _ : state) state.SetIterationTime(bench::host_submit_seconds(batch, f.stream, [&] { graph.replay(stream); }));
}

void replay_current(benchmark::State& state) {
  auto& f = fixture();
  tp::Graph& graph = f.ours[state.range(0)];
  tp::StreamGuard guard(f.stream);
  for (auto _ : state) state.SetIterationTime(bench::host_submit_seconds(batch, f.stream, [&] { graph.replay(); }));
}

void raw_capture_instantiate(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = f.sizes[state.range(0)];
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal));
    f.issue(kernels, f.stream);
    BENCH_CUDA(cudaStreamEndCapture(f.stream, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    state.SetIterationTime(bench::seconds_since(start));
    BENCH_CUDA(cudaGraphExecDestroy(exec));
    BENCH_CUDA(cudaGraphDestroy(graph));
  }
}

void ours_capture_instantiate(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = f.sizes[state.range(0)];
  for (auto _ : state) {
    tp::Graph graph;
    const auto start = bench::Clock::now();
    graph.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
    state.SetIterationTime(bench::seconds_since(start));
  }  // destruction (exec, graph, pool) outside the timed region, as for raw
}

void register_all() {
  for (int i = 0; i < 4; ++i) {
    // Batches of the 1000-kernel graph take ~80 ms of device time to drain: fewer of them.
    const int batches = i < 2 ? 200 : i == 2 ? 40 : 10;
    benchmark::RegisterBenchmark("raw_cudaGraphLaunch", raw_launch)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    benchmark::RegisterBenchmark("replay_stream", replay_stream)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    benchmark::RegisterBenchmark("replay_current", replay_current)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    const int iterations = i == 3 ? 20 : 200;
    benchmark::RegisterBenchmark("raw_capture_instantiate", raw_capture_instantiate)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(iterations);
    benchmark::RegisterBenchmark("ours_capture_instantiate", ours_capture_instantiate)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(iterations);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return bench::run_main(argc, argv, [](bench::MedianReporter& r) {
    const auto& f = fixture();
    std::vector<bench::Row> rows;
    for (std::size_t i = 0; i < f.sizes.size(); ++i) {
      const std::string arg = "/" + std::to_string(i);
      const std::string kernels = std::to_string(f.sizes[i]) + " kernel" + (f.sizes[i] == 1 ? "" : "s");
      const double raw = r.medians["raw_cudaGraphLaunch" + arg];
      const double stream = r.medians["replay_stream" + arg];
      const double current = r.medians["replay_current" + arg];
      const double raw_ci = r.medians["raw_capture_instantiate" + arg];
      const double ours_ci = r.medians["ours_capture_instantiate" + arg];
      rows.push_back({kernels + ": raw cudaGraphLaunch host submit", raw, "us", ""});
      rows.push_back({kernels + ": replay(stream) / raw", stream / raw, "x", bench::verdict(stream / raw, 1.05)});
      rows.push_back({kernels + ": replay() / raw", current / raw, "x", bench::verdict(current / raw, 1.10)});
      rows.push_back({kernels + ": raw capture+instantiate", raw_ci, "us", ""});
      rows.push_back({kernels + ": ours capture+instantiate / raw", ours_ci / raw_ci, "x", bench::verdict(ours_ci / raw_ci, 1.05)});
    }
    bench::print_table("bench/replay (medians; ratios against raw CUDA in this run)", rows);
  });
}
