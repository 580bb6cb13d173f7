// bench/random: what drawing from a RandomState costs a replay. Graphs of 1 and 100 kernels that
// draw numbers (curand Philox): with the offset frozen in by value ("plain"), against the same
// kernels taking PhiloxArgs from a RandomState ("random": one advance node in front of them).
// Host submit per replay (target <= 1.02x) and device time per replay (target <= 1.05x); and, for
// the record, the same random graph whose executable holds a CUDA user object (the lifetime
// mechanism random_arena.hpp explains it does not use), and the host cost of an eager draw.
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>
#include <tensorplay/random.cuh>

#include <benchmark/benchmark.h>

#include <curand_kernel.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr int threads = 256;  // one block per kernel: launch and dependency costs dominate
constexpr int batch = 64;     // replays per timed batch

__device__ __forceinline__ void write_uniform(float* out, std::uint64_t seed, std::uint64_t offset) {
  curandStatePhilox4_32_10_t state;
  curand_init(seed, threadIdx.x, offset, &state);
  out[threadIdx.x] = curand_uniform(&state);
}
__global__ void draw_fixed(float* out, std::uint64_t seed, std::uint64_t offset) { write_uniform(out, seed, offset); }
__global__ void draw_random(float* out, tp::PhiloxArgs args) {
  const tp::PhiloxSeedOffset so = tp::unpack(args);
  write_uniform(out, so.seed, so.offset);
}

struct Pair {
  tp::Graph plain;
  tp::Graph random;
  tp::Graph retained;  // random, and its executable holds a user object
};

struct Fixture {
  tp::Stream stream;
  tp::DeviceTensor<float> out{threads, stream};
  tp::RandomState rng{2026};
  std::vector<int> sizes{1, 100};
  std::vector<Pair> graphs;

  Fixture() {
    tp::StreamGuard guard(stream);
    for (int kernels : sizes) {
      Pair p;
      p.plain.capture([&](tp::StreamRef s) {
        for (int k = 0; k < kernels; ++k) draw_fixed<<<1, threads, 0, s>>>(out.data(), 2026, static_cast<std::uint64_t>(k));
      }, {.stream = stream});
      for (tp::Graph* g : {&p.random, &p.retained}) {
        g->capture([&](tp::StreamRef s) {
          for (int k = 0; k < kernels; ++k) draw_random<<<1, threads, 0, s>>>(out.data(), rng.next(1));
        }, {.stream = stream});
      }
      p.retained.retain(std::make_shared<int>(0));
      graphs.push_back(std::move(p));
    }
    for (Pair& p : graphs)
      for (tp::Graph* g : {&p.plain, &p.random, &p.retained}) g->replay(stream);  // uploaded, warm
    stream.synchronize();
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<bench::Variant> variants(Pair& p, tp::StreamRef s) {
  return {{"plain", [&p, s] { p.plain.replay(s); }},
          {"random", [&p, s] { p.random.replay(s); }},
          {"retained", [&p, s] { p.retained.replay(s); }}};
}

// Host submit of one replay.
void submit(benchmark::State& state) {
  auto& f = fixture();
  bench::compare_submit(state, batch, variants(f.graphs[state.range(0)], f.stream));
}

// Device time of one replay: events around a batch of back-to-back replays.
void device(benchmark::State& state) {
  auto& f = fixture();
  const cudaStream_t s = f.stream;
  bench::compare(state, variants(f.graphs[state.range(0)], f.stream), [s](const bench::Variant& v) {
    return bench::device_seconds(s, [&] {
             for (int i = 0; i < batch; ++i) v.run();
           }) /
           batch;
  });
}

// Host cost of an eager draw and its launch, against the launch with a frozen offset.
void eager(benchmark::State& state) {
  auto& f = fixture();
  tp::StreamGuard guard(f.stream);
  float* out = f.out.data();
  const cudaStream_t s = f.stream;
  bench::compare_submit(state, batch,
                        {{"plain", [=] { draw_fixed<<<1, threads, 0, s>>>(out, 2026, 0); }},
                         {"random", [&f, out, s] { draw_random<<<1, threads, 0, s>>>(out, f.rng.next(1)); }}});
}

void register_all() {
  for (int i = 0; i < 2; ++i) {
    const int batches = i == 0 ? 200 : 40;
    benchmark::RegisterBenchmark("submit", submit)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
    benchmark::RegisterBenchmark("device", device)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(batches);
  }
  benchmark::RegisterBenchmark("eager", eager)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(200);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  const char* title = "bench/random (medians of paired measurements; ratios within this run)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    bench::for_each_size(r, fixture().sizes, [&](const std::string& kernels, const auto& us, int) {
      const double plain = us("submit", "plain");
      const double random = us("submit", "random");
      const double retained = us("submit", "retained");
      const double dplain = us("device", "plain");
      const double drandom = us("device", "random");
      rows.push_back({kernels + ": replay host submit, offsets frozen", plain, "us", ""});
      rows.push_back({kernels + ": replay host submit, RandomState", random, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": host submit, RandomState / frozen", random, plain, 1.02));
      rows.push_back({kernels + ": host submit, + user object / frozen", retained / plain, "x", "(the lifetime design not taken)"});
      rows.push_back({kernels + ": replay device time, offsets frozen", dplain, "us", ""});
      rows.push_back({kernels + ": replay device time, RandomState", drandom, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": device time, RandomState / frozen", drandom, dplain, 1.05));
    });
    rows.push_back({"eager launch, offset by value: host", r.us("eager:plain"), "us", ""});
    rows.push_back({"eager next() + launch: host", r.us("eager:random"), "us", ""});
  });
}
