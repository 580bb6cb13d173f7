// bench/stage: host submit cost of stage_and_launch against a bare replay and the staging
// designs it was chosen from; launch-to-completion; copy bandwidth at 4 x 64 MiB.
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void read_first(const float* in, float* out) { *out += *in; }

constexpr int batch = 64;

//! N static buffers, N fresh inputs of `floats` elements each, and a graph that reads every
//! static buffer (one small kernel each).
template <std::size_t N>
struct Staged {
  tp::Stream stream;
  std::size_t floats;
  std::array<tp::DeviceTensor<float>, N> statics;
  std::array<tp::DeviceTensor<float>, N> inputs;
  tp::DeviceTensor<float> out{N, stream};
  tp::Graph graph;

  explicit Staged(std::size_t n) : floats(n) {
    for (std::size_t k = 0; k < N; ++k) {
      statics[k] = tp::DeviceTensor<float>(n, stream);
      inputs[k] = tp::DeviceTensor<float>(n, stream);
      BENCH_CUDA(cudaMemsetAsync(statics[k].data(), 0, n * sizeof(float), stream));
      BENCH_CUDA(cudaMemsetAsync(inputs[k].data(), 0, n * sizeof(float), stream));
    }
    BENCH_CUDA(cudaMemsetAsync(out.data(), 0, N * sizeof(float), stream));
    graph.capture([&](tp::StreamRef s) {
      for (std::size_t k = 0; k < N; ++k) read_first<<<1, 1, 0, s>>>(statics[k].data(), out.data() + k);
    }, {.stream = stream});
    stage();  // compiles the staged executable once, outside any timing
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  void stage() {
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      graph.stage_and_launch(std::tie(statics[k]...), std::tie(inputs[k]...), stream);
    }(std::make_index_sequence<N>{});
  }

  void memcpy_loop() {
    for (std::size_t k = 0; k < N; ++k)
      BENCH_CUDA(cudaMemcpyAsync(statics[k].data(), inputs[k].data(), floats * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    graph.replay(stream);
  }

  void memcpy_batch() {
    std::array<void*, N> dsts;
    std::array<const void*, N> srcs;
    std::array<std::size_t, N> sizes;
    for (std::size_t k = 0; k < N; ++k) {
      dsts[k] = statics[k].data();
      srcs[k] = inputs[k].data();
      sizes[k] = floats * sizeof(float);
    }
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t first = 0;
    BENCH_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), N, &attributes, &first, 1, stream));
    graph.replay(stream);
  }

  // The candidate that launches the batched copy kernel on its own, then the graph.
  void separate_kernel() {
    tp::detail::CopyTable table;
    table.count = 0;
    table.first_tile[0] = 0;
    for (std::size_t k = 0; k < N; ++k) tp::detail::add_entry(table, statics[k], inputs[k]);
    const std::size_t tiles = table.first_tile[table.count];
    const unsigned blocks = static_cast<unsigned>(tiles < 1056 ? tiles : 1056);
    tp::detail::batched_copy_kernel<><<<blocks, tp::detail::copy_block_threads, 0, stream>>>(table);
    graph.replay(stream);
  }
};

template <std::size_t N>
Staged<N>& small() {  // 256 KiB inputs
  static Staged<N> s(64 * 1024);
  return s;
}

template <std::size_t N, class F>
void submit(benchmark::State& state, F&& f) {
  auto& s = small<N>();
  for (auto _ : state) state.SetIterationTime(bench::host_submit_seconds(batch, s.stream, [&] { f(s); }));
}

template <std::size_t N>
void bare_replay(benchmark::State& state) {
  submit<N>(state, [](auto& s) { s.graph.replay(s.stream); });
}
template <std::size_t N>
void stage_and_launch(benchmark::State& state) {
  submit<N>(state, [](auto& s) { s.stage(); });
}
template <std::size_t N>
void memcpy_loop(benchmark::State& state) {
  submit<N>(state, [](auto& s) { s.memcpy_loop(); });
}
template <std::size_t N>
void memcpy_batch(benchmark::State& state) {
  submit<N>(state, [](auto& s) { s.memcpy_batch(); });
}
template <std::size_t N>
void separate_kernel(benchmark::State& state) {
  submit<N>(state, [](auto& s) { s.separate_kernel(); });
}

// Host time from submit to completion, one call at a time.
template <class F>
void to_completion(benchmark::State& state, F&& f) {
  auto& s = small<4>();
  for (auto _ : state) {
    const auto start = bench::Clock::now();
    f(s);
    BENCH_CUDA(cudaStreamSynchronize(s.stream));
    state.SetIterationTime(bench::seconds_since(start));
  }
}
void completion_stage(benchmark::State& state) {
  to_completion(state, [](auto& s) { s.stage(); });
}
void completion_memcpy_loop(benchmark::State& state) {
  to_completion(state, [](auto& s) { s.memcpy_loop(); });
}

Staged<4>& large() {  // 64 MiB inputs
  static Staged<4> s(16 * 1024 * 1024);
  return s;
}
void bandwidth_stage(benchmark::State& state) {
  auto& s = large();
  for (auto _ : state) state.SetIterationTime(bench::device_seconds(s.stream, [&] { s.stage(); }));
}
void bandwidth_memcpy(benchmark::State& state) {
  auto& s = large();
  for (auto _ : state) state.SetIterationTime(bench::device_seconds(s.stream, [&] { s.memcpy_loop(); }));
}

#define TP_SUBMIT(name) ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100)

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("bare_replay/4", bare_replay<4>) TP_SUBMIT();
  benchmark::RegisterBenchmark("stage_and_launch/4", stage_and_launch<4>) TP_SUBMIT();
  benchmark::RegisterBenchmark("memcpy_loop/4", memcpy_loop<4>) TP_SUBMIT();
  benchmark::RegisterBenchmark("memcpy_batch/4", memcpy_batch<4>) TP_SUBMIT();
  benchmark::RegisterBenchmark("separate_kernel/4", separate_kernel<4>) TP_SUBMIT();
  benchmark::RegisterBenchmark("bare_replay/32", bare_replay<32>) TP_SUBMIT();
  benchmark::RegisterBenchmark("stage_and_launch/32", stage_and_launch<32>) TP_SUBMIT();
  benchmark::RegisterBenchmark("memcpy_loop/32", memcpy_loop<32>) TP_SUBMIT();
  benchmark::RegisterBenchmark("memcpy_batch/32", memcpy_batch<32>) TP_SUBMIT();
  benchmark::RegisterBenchmark("separate_kernel/32", separate_kernel<32>) TP_SUBMIT();
  benchmark::RegisterBenchmark("completion_stage/4", completion_stage) TP_SUBMIT();
  benchmark::RegisterBenchmark("completion_memcpy_loop/4", completion_memcpy_loop) TP_SUBMIT();
  benchmark::RegisterBenchmark("bandwidth_stage/4x64MiB", bandwidth_stage)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  benchmark::RegisterBenchmark("bandwidth_memcpy/4x64MiB", bandwidth_memcpy)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  return bench::run_main(argc, argv, [](bench::MedianReporter& r) {
    auto m = [&](const char* name) { return r.medians[name]; };
    std::vector<bench::Row> rows;
    const double bare4 = m("bare_replay/4");
    const double stage4 = m("stage_and_launch/4");
    const double stage32 = m("stage_and_launch/32");
    rows.push_back({"bare replay(stream), host submit", bare4, "us", ""});
    for (const char* n : {"4", "32"}) {
      const std::string suffix = std::string("/") + n;
      rows.push_back({std::string(n) + " x 256 KiB: cudaMemcpyAsync loop + replay", m(("memcpy_loop" + suffix).c_str()), "us", ""});
      rows.push_back({std::string(n) + " x 256 KiB: cudaMemcpyBatchAsync + replay", m(("memcpy_batch" + suffix).c_str()), "us", ""});
      rows.push_back({std::string(n) + " x 256 KiB: separate batched copy kernel + replay", m(("separate_kernel" + suffix).c_str()), "us", ""});
      rows.push_back({std::string(n) + " x 256 KiB: stage_and_launch (copy node in the graph)", m(("stage_and_launch" + suffix).c_str()), "us", ""});
    }
    rows.push_back({"4 inputs: stage_and_launch / bare replay", stage4 / bare4, "x", bench::verdict(stage4 / bare4, 2.5)});
    rows.push_back({"4 inputs: cudaMemcpyAsync loop / stage_and_launch", m("memcpy_loop/4") / stage4, "x",
                    bench::verdict(m("memcpy_loop/4") / stage4, 5.0, false)});
    rows.push_back({"32 inputs / 4 inputs, stage_and_launch", stage32 / stage4, "x", bench::verdict(stage32 / stage4, 1.5)});
    const double done_stage = m("completion_stage/4");
    const double done_loop = m("completion_memcpy_loop/4");
    rows.push_back({"4 inputs, launch to completion: stage_and_launch", done_stage, "us", ""});
    rows.push_back({"4 inputs, launch to completion: cudaMemcpyAsync loop", done_loop, "us", ""});
    rows.push_back({"launch to completion, stage / loop", done_stage / done_loop, "x", bench::verdict(done_stage / done_loop, 1.0)});
    const double bytes = 2.0 * 4 * 64 * 1024 * 1024;  // read + written
    const double bw_stage = bytes / (m("bandwidth_stage/4x64MiB") * 1e-6) / 1e9;
    const double bw_memcpy = bytes / (m("bandwidth_memcpy/4x64MiB") * 1e-6) / 1e9;
    rows.push_back({"4 x 64 MiB: cudaMemcpyAsync D2D, GB/s (read + written)", bw_memcpy, "GB/s", ""});
    rows.push_back({"4 x 64 MiB: stage_and_launch, GB/s (read + written)", bw_stage, "GB/s", ""});
    rows.push_back({"4 x 64 MiB: stage_and_launch / cudaMemcpyAsync bandwidth", bw_stage / bw_memcpy, "x",
                    bench::verdict(bw_stage / bw_memcpy, 0.90, false)});
    bench::print_table("bench/stage (medians; ratios in this run; PyTorch in bench/peers/torch_stage.py)", rows);
  });
}
