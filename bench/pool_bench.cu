// bench/pool: DeviceTensor allocation + free against cudaMalloc and cudaMallocAsync, and the
// memory reserved by graphs that share a pool against graphs with private pools.
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr int batch = 256;  // allocate + free pairs per timed batch

tp::Stream& stream() {
  static tp::Stream s;
  return s;
}

void cuda_malloc(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < batch; ++i) {
      void* p = nullptr;
      BENCH_CUDA(cudaMalloc(&p, bytes));
      BENCH_CUDA(cudaFree(p));
    }
    state.SetIterationTime(bench::seconds_since(start) / batch);
  }
}

void cuda_malloc_async(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  cudaStream_t s = stream();
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < batch; ++i) {
      void* p = nullptr;
      BENCH_CUDA(cudaMallocAsync(&p, bytes, s));
      BENCH_CUDA(cudaFreeAsync(p, s));
    }
    state.SetIterationTime(bench::seconds_since(start) / batch);
    BENCH_CUDA(cudaStreamSynchronize(s));
  }
}

void device_tensor(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  const tp::StreamRef s = stream();
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < batch; ++i) {
      tp::DeviceTensor<char> t(count, s);
      benchmark::DoNotOptimize(t.data());
    }
    state.SetIterationTime(bench::seconds_since(start) / batch);
  }
}

void device_tensor_current_stream(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  tp::StreamGuard guard(stream());
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < batch; ++i) {
      tp::DeviceTensor<char> t(count);
      benchmark::DoNotOptimize(t.data());
    }
    state.SetIterationTime(bench::seconds_since(start) / batch);
  }
}

// Reserved bytes of four graphs, each with `temp` bytes of temporaries freed inside its
// capture, in one shared pool and in four private pools.
std::pair<std::size_t, std::size_t> four_graph_memory(std::size_t temp) {
  tp::Stream s;
  tp::DeviceTensor<float> x(1024, s);
  auto capture_into = [&](tp::Graph& g, tp::DeviceTensor<float>& out) {
    g.capture([&](tp::StreamRef cs) {
      tp::DeviceTensor<char> scratch(temp, cs);
      BENCH_CUDA(cudaMemsetAsync(scratch.data(), 1, temp, cs));
      out = tp::DeviceTensor<float>(1024, cs);
      BENCH_CUDA(cudaMemcpyAsync(out.data(), x.data(), 4096, cudaMemcpyDeviceToDevice, cs));
    }, {.stream = s});
  };
  std::size_t shared_bytes = 0;
  {
    const tp::Pool shared = tp::graph_pool_handle();
    std::vector<tp::Graph> graphs(4);
    std::vector<tp::DeviceTensor<float>> outs(4);
    for (int i = 0; i < 4; ++i) {
      graphs[i] = tp::Graph({.pool = shared});
      capture_into(graphs[i], outs[i]);
    }
    shared_bytes = shared.reserved_bytes();
  }
  std::size_t private_bytes = 0;
  {
    std::vector<tp::Graph> graphs(4);
    std::vector<tp::DeviceTensor<float>> outs(4);
    for (int i = 0; i < 4; ++i) capture_into(graphs[i], outs[i]);
    for (const tp::Graph& g : graphs) private_bytes += g.pool().reserved_bytes();
  }
  return {shared_bytes, private_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  for (long bytes : {256L, 1L << 20, 64L << 20}) {
    benchmark::RegisterBenchmark("cudaMalloc_free", cuda_malloc)->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
    benchmark::RegisterBenchmark("cudaMallocAsync_free", cuda_malloc_async)->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
    benchmark::RegisterBenchmark("DeviceTensor", device_tensor)->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
    benchmark::RegisterBenchmark("DeviceTensor_current_stream", device_tensor_current_stream)->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
  }
  const char* title = "bench/pool (medians; ratios against raw CUDA in this run)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    for (long bytes : {256L, 1L << 20, 64L << 20}) {
      const std::string arg = "/" + std::to_string(bytes);
      const std::string size = bytes < (1 << 20) ? std::to_string(bytes) + " B" : std::to_string(bytes >> 20) + " MiB";
      const double malloc_us = r.medians["cudaMalloc_free" + arg];
      const double async_us = r.medians["cudaMallocAsync_free" + arg];
      const double ours = r.medians["DeviceTensor" + arg];
      const double ours_current = r.medians["DeviceTensor_current_stream" + arg];
      rows.push_back({size + ": cudaMalloc+cudaFree", malloc_us, "us", ""});
      rows.push_back({size + ": cudaMallocAsync+cudaFreeAsync", async_us, "us", ""});
      rows.push_back({size + ": DeviceTensor(n, stream) alloc+free", ours, "us", ""});
      rows.push_back(bench::ratio_row(size + ": DeviceTensor / cudaMallocAsync", ours, async_us, 0.5));
      rows.push_back(bench::ratio_row(size + ": DeviceTensor(n) (current stream) / cudaMallocAsync", ours_current, async_us, 0.5));
    }
    const auto [shared, separate] = four_graph_memory(std::size_t{1} << 30);
    rows.push_back({"4 graphs x 1 GiB temporaries: one shared pool reserves", shared / double(1 << 20), "MiB", ""});
    rows.push_back({"4 graphs x 1 GiB temporaries: four private pools reserve", separate / double(1 << 20), "MiB", ""});
    rows.push_back({"shared / private", shared / double(separate), "x", ""});
  });
}
