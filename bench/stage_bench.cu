// bench/stage: host submit cost of stage_and_launch against a bare replay and against the
// staging designs it was chosen from; launch to completion; copy bandwidth at 4 x 64 MiB.
// Every ratio comes from variants measured alternately in the same iterations.
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

// The captured work: one small kernel that reads every static buffer, so that the graph's
// device time does not grow with the number of inputs.
__global__ void read_all(const float* const* statics, int count, float* out) {
  float sum = 0;
  for (int k = 0; k < count; ++k) sum += statics[k][0];
  *out = sum;
}

constexpr int batch = 64;

//! N static buffers, N fresh inputs of `floats` elements each, and the graph.
template <std::size_t N>
struct Staged {
  tp::Stream stream;
  std::size_t floats;
  std::array<tp::DeviceTensor<float>, N> statics;
  std::array<tp::DeviceTensor<float>, N> inputs;
  tp::DeviceTensor<const float*> pointers{N, stream};
  tp::DeviceTensor<float> out{1, stream};
  tp::Graph graph;
  unsigned max_blocks = 1;  // what the library's copy node uses
  tp::detail::CopyBatch batch;

  explicit Staged(std::size_t n) : floats(n) {
    int sms = 1;
    BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, stream.device()));
    max_blocks = static_cast<unsigned>(sms) * tp::config::copy_blocks_per_sm;
    std::vector<const float*> host(N);
    for (std::size_t k = 0; k < N; ++k) {
      statics[k] = tp::DeviceTensor<float>(n, stream);
      inputs[k] = tp::DeviceTensor<float>(n, stream);
      BENCH_CUDA(cudaMemsetAsync(statics[k].data(), 0, n * sizeof(float), stream));
      BENCH_CUDA(cudaMemsetAsync(inputs[k].data(), 0, n * sizeof(float), stream));
      host[k] = statics[k].data();
    }
    pointers.copy_from_host(host, stream);
    graph.capture([&](tp::StreamRef s) { read_all<<<1, 1, 0, s>>>(pointers.data(), static_cast<int>(N), out.data()); },
                  {.stream = stream});
    stage();  // compiles the staged executable once, outside any timing
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  void stage() {
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      graph.stage_and_launch(std::tie(statics[k]...), std::tie(inputs[k]...), stream);
    }(std::make_index_sequence<N>{});
  }

  // Inputs that change at every call: four sets in turn (the first is `inputs`), so that no call
  // stages the same inputs as the call before it.
  std::vector<std::array<tp::DeviceTensor<float>, N>> rotation;
  std::size_t turn = 0;

  void prepare_rotation() {
    rotation.resize(3);
    for (auto& set : rotation)
      for (auto& t : set) {
        t = tp::DeviceTensor<float>(floats, stream);
        BENCH_CUDA(cudaMemsetAsync(t.data(), 0, floats * sizeof(float), stream));
      }
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  void stage_rotating() {
    const std::size_t r = turn++ % 4;
    auto& set = r == 0 ? inputs : rotation[r - 1];
    [&]<std::size_t... k>(std::index_sequence<k...>) {
      graph.stage_and_launch(std::tie(statics[k]...), std::tie(set[k]...), stream);
    }(std::make_index_sequence<N>{});
  }

  void bare() { graph.replay(stream); }

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

  // The candidate that launches the batched copy kernel on its own (table by value), then the graph.
  void separate_kernel() {
    const auto here = std::source_location::current();
    batch.start(N);
    for (std::size_t k = 0; k < N; ++k) batch.add(inputs[k].data(), statics[k].data(), inputs[k].bytes());
    void* args[] = {batch.parameters()};
    const auto& library = tp::detail::KernelLibrary::on(0, here);
    tp::detail::launch(reinterpret_cast<const void*>(library.copy(batch.log2_capacity())), dim3(batch.blocks(max_blocks)),
                       dim3(tp::config::copy_block_threads), stream, false, args, "copy kernel", here);
    graph.replay(stream);
  }

  std::vector<bench::Variant> designs() {
    return {{"bare_replay", [this] { bare(); }},
            {"stage_and_launch", [this] { stage(); }},
            {"memcpy_loop", [this] { memcpy_loop(); }},
            {"memcpy_batch", [this] { memcpy_batch(); }},
            {"separate_kernel", [this] { separate_kernel(); }}};
  }
};

template <std::size_t N>
Staged<N>& small() {  // 256 KiB inputs
  static Staged<N> s(64 * 1024);
  if (s.rotation.empty()) s.prepare_rotation();
  return s;
}

Staged<4>& large() {  // 64 MiB inputs
  static Staged<4> s(16 * 1024 * 1024);
  return s;
}

void submit4(benchmark::State& state) { bench::compare_submit(state, batch, small<4>().designs()); }
void submit32(benchmark::State& state) { bench::compare_submit(state, batch, small<32>().designs()); }

void scaling(benchmark::State& state) {
  bench::compare_submit(state, batch,
                        {{"stage4", [] { small<4>().stage(); }},
                         {"stage32", [] { small<32>().stage(); }},
                         {"stage4_rotating", [] { small<4>().stage_rotating(); }},
                         {"stage32_rotating", [] { small<32>().stage_rotating(); }}});
}

void completion(benchmark::State& state) {
  auto& s = small<4>();
  bench::compare(state, {{"stage_and_launch", [&] { s.stage(); }}, {"memcpy_loop", [&] { s.memcpy_loop(); }}},
                 [&](const bench::Variant& v) {
                   const auto start = bench::Clock::now();
                   v.run();
                   BENCH_CUDA(cudaStreamSynchronize(s.stream));
                   return bench::seconds_since(start);
                 });
}

void bandwidth(benchmark::State& state) {
  auto& s = large();
  bench::compare(state, {{"stage_and_launch", [&] { s.stage(); }}, {"memcpy_loop", [&] { s.memcpy_loop(); }}},
                 [&](const bench::Variant& v) { return bench::device_seconds(s.stream, v.run); });
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("submit4", submit4)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(60);
  benchmark::RegisterBenchmark("submit32", submit32)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(30);
  benchmark::RegisterBenchmark("scaling", scaling)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
  benchmark::RegisterBenchmark("completion", completion)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(200);
  benchmark::RegisterBenchmark("bandwidth", bandwidth)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  const char* title = "bench/stage (medians of paired measurements; PyTorch: bench/peers/torch_stage.py)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    auto c = [&](const std::string& key) { return r.counters[key]; };
    for (const char* n : {"4", "32"}) {
      const std::string g = std::string("submit") + n + ":";
      const std::string label = std::string(n) + " x 256 KiB: ";
      rows.push_back({label + "bare replay(stream), no staging", c(g + "bare_replay_us"), "us", ""});
      rows.push_back({label + "cudaMemcpyAsync per input + replay", c(g + "memcpy_loop_us"), "us", ""});
      rows.push_back({label + "cudaMemcpyBatchAsync + replay", c(g + "memcpy_batch_us"), "us", ""});
      rows.push_back({label + "batched copy kernel launched alone + replay", c(g + "separate_kernel_us"), "us", ""});
      rows.push_back({label + "stage_and_launch (copy node in the graph)", c(g + "stage_and_launch_us"), "us", ""});
    }
    const double bare4 = c("submit4:bare_replay_us");
    const double stage4 = c("submit4:stage_and_launch_us");
    rows.push_back(bench::ratio_row("4 inputs: stage_and_launch / bare replay", stage4, bare4, 1.5));
    rows.push_back(bench::ratio_row("4 inputs: cudaMemcpyAsync loop / stage_and_launch", c("submit4:memcpy_loop_us"), stage4, 5.0, false));
    const double scale = c("scaling:stage32_us") / c("scaling:stage4_us");
    rows.push_back({"stage_and_launch, 32 inputs / 4 inputs (paired)", scale, "x", bench::verdict(scale, 1.15)});
    const double rotating = c("scaling:stage32_rotating_us") / c("scaling:stage4_rotating_us");
    rows.push_back({"  the same, inputs that change at every call: 32 / 4", rotating, "x", ""});
    rows.push_back({"  inputs that change at every call / the same inputs, 4 inputs",
                    c("scaling:stage4_rotating_us") / c("scaling:stage4_us"), "x", ""});
    rows.push_back({"  inputs that change at every call / the same inputs, 32 inputs",
                    c("scaling:stage32_rotating_us") / c("scaling:stage32_us"), "x", ""});
    const double done_stage = c("completion:stage_and_launch_us");
    const double done_loop = c("completion:memcpy_loop_us");
    rows.push_back({"4 inputs, launch to completion: stage_and_launch", done_stage, "us", ""});
    rows.push_back({"4 inputs, launch to completion: cudaMemcpyAsync loop", done_loop, "us", ""});
    rows.push_back(bench::ratio_row("launch to completion, stage / loop", done_stage, done_loop, 1.0));
    const double bytes = 2.0 * 4 * 64 * 1024 * 1024;  // read + written
    const double bw_stage = bytes / (c("bandwidth:stage_and_launch_us") * 1e-6) / 1e9;
    const double bw_memcpy = bytes / (c("bandwidth:memcpy_loop_us") * 1e-6) / 1e9;
    rows.push_back({"4 x 64 MiB: cudaMemcpyAsync D2D + replay, GB/s (read + written)", bw_memcpy, "GB/s", ""});
    rows.push_back({"4 x 64 MiB: stage_and_launch, GB/s (read + written)", bw_stage, "GB/s", ""});
    rows.push_back(bench::ratio_row("4 x 64 MiB: stage_and_launch / cudaMemcpyAsync bandwidth", bw_stage, bw_memcpy, 0.90, false));
  });
}
