// bench/offload: sleep and wake of an offloadable pool (Pool::offload / Pool::restore).
//   - Offload and restore of 1 GiB and 16 GiB of live blocks, in GB/s, against plain pinned
//     cudaMemcpyAsync of the same bytes (the same tensors, the same chunks) in the same run. The
//     first offload pins its host copy (kept for later ones): reported on its own.
//   - Wake to the first correct replay of a 32-bucket ladder: restore + run against capturing
//     the ladder again (what users do today: destroy the graphs, capture again).
//   - Replay of a graph, and allocation inside a capture, in an offloadable pool against a plain
//     one (targets <= 1.02x and <= 1.10x), plus the first allocation of a segment (informative).
//
//     TENSORPLAY_OFFLOAD_GIB="1,16"   sizes of the bandwidth runs, in GiB
//     TENSORPLAY_OFFLOAD_REPS=3       offload/restore cycles timed per size
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t chunk = 256 * mib;  // bytes per live tensor of the bandwidth runs
constexpr int batch = 256;                // calls per timed batch of host costs

__global__ void stamp(unsigned* out, std::size_t n, unsigned seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = seed ^ static_cast<unsigned>(i * 2654435761u);
}
__global__ void axpb(const float* in, float* out, std::size_t n, float a, float b) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}
__global__ void one_thread(float* x) { *x += 1.0f; }

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

std::vector<long> env_list(const char* name, const char* fallback) {
  const char* text = std::getenv(name);
  std::stringstream in(text != nullptr ? text : fallback);
  std::vector<long> out;
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::strtol(item.c_str(), nullptr, 10));
  return out;
}

tp::Stream& stream() {
  static tp::Stream s;
  return s;
}

// ---- bandwidth: live blocks <-> host ---------------------------------------------------------

struct Bandwidth {
  double first_offload_gbs = 0, offload_gbs = 0, restore_gbs = 0, plain_d2h_gbs = 0, plain_h2d_gbs = 0;
  bool exact = false;
};

Bandwidth measure_bandwidth(std::size_t gib, int reps) {
  const std::size_t bytes = gib << 30;
  const std::size_t count = bytes / chunk;
  tp::Stream& s = stream();
  tp::Pool pool = tp::graph_pool_handle({.offloadable = true});
  std::vector<tp::DeviceTensor<unsigned>> live(count);
  tp::Graph graph({.pool = pool});
  graph.capture([&](tp::StreamRef cs) {
    for (std::size_t k = 0; k < count; ++k) {
      live[k] = tp::DeviceTensor<unsigned>(chunk / sizeof(unsigned), cs);
      stamp<<<1024, 256, 0, cs>>>(live[k].data(), chunk / sizeof(unsigned), static_cast<unsigned>(k));
    }
  }, {.stream = s});
  graph.replay(s);
  s.synchronize();
  void* host = nullptr;
  BENCH_CUDA(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  auto* h = static_cast<char*>(host);
  auto plain = [&](bool to_host) {
    const auto start = bench::Clock::now();
    for (std::size_t k = 0; k < count; ++k) {
      if (to_host) BENCH_CUDA(cudaMemcpyAsync(h + k * chunk, live[k].data(), chunk, cudaMemcpyDeviceToHost, s));
      else BENCH_CUDA(cudaMemcpyAsync(live[k].data(), h + k * chunk, chunk, cudaMemcpyHostToDevice, s));
    }
    BENCH_CUDA(cudaStreamSynchronize(s));
    return bench::seconds_since(start);
  };
  auto timed = [&](auto&& f) {
    const auto start = bench::Clock::now();
    f();
    return bench::seconds_since(start);
  };
  const double gb = static_cast<double>(bytes) / 1e9;
  Bandwidth out;
  out.first_offload_gbs = gb / timed([&] { pool.offload(s); });
  pool.restore(s);
  std::vector<double> off, on, d2h, h2d;
  for (int r = 0; r < reps; ++r) {  // alternately, so that drift hits both alike
    d2h.push_back(plain(true));
    off.push_back(timed([&] { pool.offload(s); }));
    on.push_back(timed([&] { pool.restore(s); }));
    h2d.push_back(plain(false));
  }
  out.offload_gbs = gb / bench::median(off);
  out.restore_gbs = gb / bench::median(on);
  out.plain_d2h_gbs = gb / bench::median(d2h);
  out.plain_h2d_gbs = gb / bench::median(h2d);
  // The bytes came back: a few words of every tensor against what stamp wrote.
  out.exact = true;
  for (std::size_t k = 0; k < count; ++k) {
    unsigned word[4] = {};
    const std::size_t at = (k * 7919) % (chunk / sizeof(unsigned) - 4);
    BENCH_CUDA(cudaMemcpy(word, live[k].data() + at, sizeof word, cudaMemcpyDeviceToHost));
    for (std::size_t j = 0; j < 4; ++j) out.exact &= word[j] == (static_cast<unsigned>(k) ^ static_cast<unsigned>((at + j) * 2654435761u));
  }
  BENCH_CUDA(cudaFreeHost(host));
  return out;
}

// ---- wake to the first correct replay of a 32-bucket ladder ------------------------------------

constexpr std::size_t width = 256;
constexpr int layers = 25;  // kernels per bucket: 2 per layer + 1

struct Ladder {
  std::vector<std::size_t> sizes;
  tp::DeviceTensor<float> x, y;
  Ladder() {
    for (std::size_t k = 1; k <= 32; ++k) sizes.push_back(k * 16);
    x = tp::DeviceTensor<float>(sizes.back() * width, stream());
    y = tp::DeviceTensor<float>(sizes.back() * width, stream());
    BENCH_CUDA(cudaMemsetAsync(x.data(), 0, x.bytes(), stream()));
  }
  //! Builds the ladder's GraphBuckets in `pool` and captures every bucket.
  auto make(const tp::Pool& pool) {
    auto body = [this](tp::StreamRef s, std::size_t size) {
      const std::size_t n = size * width;
      tp::DeviceTensor<float> a(n, s), b(n, s);
      axpb<<<blocks(n), 256, 0, s>>>(x.data(), a.data(), n, 1.0f, 1.0f);
      for (int l = 0; l < layers; ++l) {
        axpb<<<blocks(n), 256, 0, s>>>(a.data(), b.data(), n, 1.0f, 1.0f);
        axpb<<<blocks(n), 256, 0, s>>>(b.data(), a.data(), n, 1.0f, 0.0f);
      }
      axpb<<<blocks(n), 256, 0, s>>>(a.data(), y.data(), n, 1.0f, 0.0f);
    };
    auto buckets = std::make_unique<tp::GraphBuckets<decltype(body)>>(sizes, body, tp::BucketOptions{.pool = pool});
    buckets->capture_all(stream());
    return buckets;
  }
  //! Runs the largest bucket and checks y = 1 + layers (x is 0).
  template <class B>
  bool run_and_check(B& buckets) {
    buckets.run(sizes.back(), stream());
    float got = 0;
    BENCH_CUDA(cudaMemcpyAsync(&got, y.data() + 17, sizeof got, cudaMemcpyDeviceToHost, stream()));
    BENCH_CUDA(cudaStreamSynchronize(stream()));
    return got == 1.0f + layers;
  }
};

struct Wake {
  double restore_ms = 0, recapture_ms = 0, reserved_mib = 0, live_mib = 0;
  bool exact = true;
};

Wake measure_wake(int reps) {
  Ladder ladder;
  tp::Pool pool = tp::graph_pool_handle({.offloadable = true});
  auto buckets = ladder.make(pool);
  std::vector<double> restore, recapture;
  Wake out;
  for (int r = 0; r < reps; ++r) {
    pool.offload(stream());
    auto start = bench::Clock::now();
    pool.restore(stream());
    out.exact &= ladder.run_and_check(*buckets);
    restore.push_back(bench::seconds_since(start));

    // Today's alternative: the graphs and their pool go before sleep; waking captures again.
    auto fresh_pool = tp::graph_pool_handle();
    start = bench::Clock::now();
    auto again = ladder.make(fresh_pool);
    out.exact &= ladder.run_and_check(*again);
    recapture.push_back(bench::seconds_since(start));
  }
  out.reserved_mib = static_cast<double>(pool.reserved_bytes()) / mib;
  out.live_mib = static_cast<double>(pool.allocated_bytes()) / mib;
  out.restore_ms = bench::median(restore) * 1e3;
  out.recapture_ms = bench::median(recapture) * 1e3;
  return out;
}

// ---- replay and allocation: offloadable pool against a plain one ------------------------------

struct ReplayFixture {
  tp::Pool plain = tp::graph_pool_handle();
  tp::Pool sleepy = tp::graph_pool_handle({.offloadable = true});
  tp::DeviceTensor<float> plain_out, sleepy_out;
  tp::Graph plain_graph{{.pool = plain}}, sleepy_graph{{.pool = sleepy}};
  float* raw_out = nullptr;
  cudaGraphExec_t raw = nullptr;  // the same kernel, captured and launched with raw CUDA
  ReplayFixture() {
    BENCH_CUDA(cudaMalloc(&raw_out, sizeof(float)));
    cudaGraph_t graph = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
    one_thread<<<1, 1, 0, stream()>>>(raw_out);
    BENCH_CUDA(cudaStreamEndCapture(stream(), &graph));
    BENCH_CUDA(cudaGraphInstantiate(&raw, graph, 0));
    BENCH_CUDA(cudaGraphDestroy(graph));
    plain_graph.capture([&](tp::StreamRef s) {
      plain_out = tp::DeviceTensor<float>(1, s);
      one_thread<<<1, 1, 0, s>>>(plain_out.data());
    }, {.stream = stream()});
    sleepy_graph.capture([&](tp::StreamRef s) {
      sleepy_out = tp::DeviceTensor<float>(1, s);
      one_thread<<<1, 1, 0, s>>>(sleepy_out.data());
    }, {.stream = stream()});
  }
};

ReplayFixture& replay_fixture() {
  static ReplayFixture f;
  return f;
}

void replay(benchmark::State& state) {
  auto& f = replay_fixture();
  const tp::StreamRef s = stream();
  bench::compare_submit(state, batch,
                        {{"plain", [&] { f.plain_graph.replay(s); }},
                         {"offloadable", [&] { f.sleepy_graph.replay(s); }},
                         {"raw", [&] { BENCH_CUDA(cudaGraphLaunch(f.raw, s)); }}});
}

// Allocation + free of `bytes` inside an open capture into each pool (the cached path: the
// first allocation made the segment before timing).
void allocate(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  tp::Stream s;
  tp::DeviceTensor<float> sink(1, s);
  tp::Pool plain = tp::graph_pool_handle();
  tp::Pool sleepy = tp::graph_pool_handle({.offloadable = true});
  auto in_capture = [&](const tp::Pool& pool) {
    tp::Graph graph({.pool = pool});
    graph.capture_begin({.stream = s});
    { tp::DeviceTensor<char> warm(bytes, s); }
    const auto start = bench::Clock::now();
    for (int i = 0; i < batch; ++i) {
      tp::DeviceTensor<char> t(bytes, s);
      benchmark::DoNotOptimize(t.data());
    }
    const double elapsed = bench::seconds_since(start) / batch;
    one_thread<<<1, 1, 0, s>>>(sink.data());
    graph.capture_end();
    return elapsed;
  };
  bench::compare(state, {{"plain", [] {}}, {"offloadable", [] {}}},
                 [&](const bench::Variant& v) { return in_capture(v.name == "plain" ? plain : sleepy); }, bench::Order::Shuffle);
}

// The first allocation of a fresh pool inside a capture: a cudaMalloc'd segment against a
// reserved, created, mapped and accessible one (20 MiB mid-size segment).
void first_segment(benchmark::State& state) {
  tp::Stream s;
  tp::DeviceTensor<float> sink(1, s);
  auto once = [&](bool offloadable) {
    tp::Pool pool = offloadable ? tp::graph_pool_handle({.offloadable = true}) : tp::graph_pool_handle();
    tp::Graph graph({.pool = pool});
    graph.capture_begin({.stream = s});
    const auto start = bench::Clock::now();
    { tp::DeviceTensor<char> t(4 * mib, s); }
    const double elapsed = bench::seconds_since(start);
    one_thread<<<1, 1, 0, s>>>(sink.data());
    graph.capture_end();
    return elapsed;
  };
  bench::compare(state, {{"plain", [] {}}, {"offloadable", [] {}}},
                 [&](const bench::Variant& v) { return once(v.name == "offloadable"); });
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("replay", replay)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
  for (long bytes : {1024L, 1L << 20})
    benchmark::RegisterBenchmark("allocate", allocate)->Arg(bytes)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
  benchmark::RegisterBenchmark("first_segment", first_segment)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  const char* title = "bench/offload (medians; ratios against the same bytes or a plain pool, this run)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    const int reps = static_cast<int>(env_list("TENSORPLAY_OFFLOAD_REPS", "3").front());
    for (long gib : env_list("TENSORPLAY_OFFLOAD_GIB", "1,16")) {
      const Bandwidth b = measure_bandwidth(static_cast<std::size_t>(gib), reps);
      const std::string size = std::to_string(gib) + " GiB";
      rows.push_back({size + ": plain pinned cudaMemcpyAsync D2H", b.plain_d2h_gbs, "GB/s", ""});
      rows.push_back({size + ": offload (steady, host copy reused)", b.offload_gbs, "GB/s", ""});
      rows.push_back(bench::ratio_row(size + ": offload / plain D2H", b.offload_gbs, b.plain_d2h_gbs, 0.8, false));
      rows.push_back({size + ": first offload (pins its host copy)", b.first_offload_gbs, "GB/s", ""});
      rows.push_back({size + ": plain pinned cudaMemcpyAsync H2D", b.plain_h2d_gbs, "GB/s", ""});
      rows.push_back({size + ": restore", b.restore_gbs, "GB/s", ""});
      rows.push_back(bench::ratio_row(size + ": restore / plain H2D", b.restore_gbs, b.plain_h2d_gbs, 0.8, false));
      rows.push_back({size + ": every tensor exact after the cycles", b.exact ? 1.0 : 0.0, "", b.exact ? "(yes)" : "(NO)"});
    }
    const Wake w = measure_wake(5);
    rows.push_back({"32-bucket ladder: pool reserved (live)", w.reserved_mib, "MiB", "(" + std::to_string(w.live_mib) + " MiB live)"});
    rows.push_back({"32-bucket ladder: wake by restore + first run", w.restore_ms, "ms", ""});
    rows.push_back({"32-bucket ladder: wake by capturing again + first run", w.recapture_ms, "ms", ""});
    rows.push_back({"capture again / restore", w.recapture_ms / w.restore_ms, "x", w.exact ? "(every run exact)" : "(a run was WRONG)"});
    const double replay_plain = r.us("replay:plain");
    rows.push_back({"replay, plain pool (host submit)", replay_plain, "us", ""});
    rows.push_back(bench::ratio_row("replay, offloadable / plain", r.us("replay:offloadable"), replay_plain, 1.02));
    rows.push_back({"replay, plain pool / raw cudaGraphLaunch", replay_plain / r.us("replay:raw"), "x", "(the check's context)"});
    for (long bytes : {1024L, 1L << 20}) {
      const std::string allocate = "allocate/" + std::to_string(bytes);
      const double plain = r.us(allocate + ":plain");
      const std::string size = bytes < (1 << 20) ? "1 KiB" : "1 MiB";
      rows.push_back({size + " alloc+free in a capture, plain pool", plain, "us", ""});
      rows.push_back(
          bench::ratio_row(size + " alloc+free in a capture, offloadable / plain", r.us(allocate + ":offloadable"), plain, 1.10));
    }
    rows.push_back({"first 20 MiB segment in a capture: cudaMalloc", r.us("first_segment:plain"), "us", ""});
    rows.push_back(
        {"first 20 MiB segment in a capture: reserve+create+map+access", r.us("first_segment:offloadable"), "us", "(informative)"});
  });
}
