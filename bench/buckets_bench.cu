// bench/buckets: GraphBuckets and PiecewiseGraph on a ~200-kernel step over a ladder of 32
// batch sizes (1 ... 512): the memory the ladder reserves against its largest bucket alone and
// against a private pool per bucket; run(n) host cost against a bare replay; 10,000 steps of
// random batch sizes against eager execution; the capture time of the whole ladder (eager,
// lazy, with shared executables) and the device memory of the executables; the cost of one
// switch of a shared executable; a piecewise replay against its parts replayed by hand.
// Every ratio comes from variants measured alternately in the same iterations.
//
//     TENSORPLAY_BUCKETS_STEPS=N   steps of the end-to-end comparison (default 10000)
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

using Ladder = std::vector<std::size_t>;
const Ladder ladder{1,   2,   4,   8,   12,  16,  24,  32,  40,  48,  56,  64,  80,  96,  112, 128,
                    144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512};
constexpr std::size_t width = 64;  // elements per sample: small kernels, so that launches dominate
constexpr int layers = 50;         // 4 kernels each: 201 kernels per step
constexpr int batch = 64;          // calls per timed batch of host submit costs

__global__ void axpb(const float* in, float* out, std::size_t n, float a, float b) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}
__global__ void relu(float* x, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) x[i] = fmaxf(x[i], 0.0f);
}
__global__ void accumulate(float* h, const float* t, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) h[i] += 0.1f * t[i];
}

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

//! The user's buffers (sized for the largest bucket, outside any graph pool) and the step.
struct Model {
  tp::Stream stream;
  tp::DeviceTensor<float> x{ladder.back() * width, stream};
  tp::DeviceTensor<float> y{ladder.back() * width, stream};

  Model() {
    BENCH_CUDA(cudaMemsetAsync(x.data(), 0, x.bytes(), stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  //! The step: 50 layers of 4 small kernels over rows * width elements, temporaries from the
  //! current pool (the bucket's while captured, the default pool when eager).
  void step(tp::StreamRef s, std::size_t rows) {
    const std::size_t n = rows * width;
    tp::DeviceTensor<float> h(n, s);
    axpb<<<blocks(n), 256, 0, s>>>(x.data(), h.data(), n, 1.0f, 0.0f);
    for (int l = 0; l < layers; ++l) {
      tp::DeviceTensor<float> t(n, s);
      axpb<<<blocks(n), 256, 0, s>>>(h.data(), t.data(), n, 0.5f, static_cast<float>(l));
      relu<<<blocks(n), 256, 0, s>>>(t.data(), n);
      accumulate<<<blocks(n), 256, 0, s>>>(h.data(), t.data(), n);
      axpb<<<blocks(n), 256, 0, s>>>(h.data(), h.data(), n, 0.9f, 0.0f);
    }
    axpb<<<blocks(n), 256, 0, s>>>(h.data(), y.data(), n, 1.0f, 0.0f);
  }
};

//! The body of every GraphBuckets here (a named type, so that fixtures can hold them).
struct Body {
  Model* model;
  void operator()(tp::StreamRef s, std::size_t rows) const { model->step(s, rows); }
};
using Buckets = tp::GraphBuckets<Body>;

struct Fixture {
  Model model;
  Buckets separate{ladder, Body{&model}};
  Buckets shared{ladder, Body{&model}, {.share_executables = true}};
  tp::Graph bare;  // bucket 128 alone, for the bare replay
  std::vector<std::size_t> batches;  // the end-to-end sequence
  double last = 0;                   // seconds of the last timed capture

  Fixture() {
    separate.capture_all(model.stream);
    shared.capture_all(model.stream);
    bare.capture([&](tp::StreamRef s) { model.step(s, 128); }, {.stream = model.stream});
    std::mt19937 random(11);
    std::uniform_int_distribution<std::size_t> size(1, ladder.back());
    batches.resize(static_cast<std::size_t>(bench_steps()));
    for (std::size_t& n : batches) n = size(random);
    BENCH_CUDA(cudaStreamSynchronize(model.stream));
  }

  static long bench_steps() {
    const char* text = std::getenv("TENSORPLAY_BUCKETS_STEPS");
    return text == nullptr ? 10000 : std::max(1L, std::strtol(text, nullptr, 10));
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// run(n) against a bare replay of the same bucket (128), host submit cost; a shared executable
// run on the bucket it holds; and alternating buckets (128, 256), separate against shared: the
// difference is the cost of one cudaGraphExecUpdate per switch.
void run_cost(benchmark::State& state) {
  auto& f = fixture();
  const tp::StreamRef stream = f.model.stream;
  int turn = 0;
  bench::compare_submit(state, batch,
                        {{"replay", [&] { f.bare.replay(stream); }},
                         {"run", [&] { f.separate.run(120, stream); }},
                         {"run_shared_same_bucket", [&] { f.shared.run(120, stream); }},
                         {"alternate_separate", [&] { f.separate.run(++turn % 2 ? 120 : 250, stream); }},
                         {"alternate_shared", [&] { f.shared.run(++turn % 2 ? 120 : 250, stream); }}});
}

// 10,000 steps of random batch sizes, launch to completion: eager against the buckets.
void end_to_end(benchmark::State& state) {
  auto& f = fixture();
  const tp::StreamRef stream = f.model.stream;
  bench::compare(state,
                 {{"eager",
                   [&] {
                     tp::StreamGuard guard(stream);
                     for (std::size_t n : f.batches) f.model.step(stream, n);
                   }},
                  {"buckets", [&] {
                     for (std::size_t n : f.batches) f.separate.run(n, stream);
                   }}},
                 [&](const bench::Variant& v) {
                   const auto start = bench::Clock::now();
                   v.run();
                   BENCH_CUDA(cudaStreamSynchronize(stream));
                   return bench::seconds_since(start);
                 });
}

// Capturing the whole ladder: largest first (lazy = false), lazily by first runs in a random
// order (host time: the launches are asynchronous), and largest first with shared executables.
// Destruction is not timed.
void capture_ladder(benchmark::State& state) {
  auto& f = fixture();
  const tp::StreamRef stream = f.model.stream;
  std::mt19937 random(5);
  auto timed = [&](auto&& make) {
    std::optional<Buckets> buckets;
    const auto start = bench::Clock::now();
    make(buckets);
    f.last = bench::seconds_since(start);
    BENCH_CUDA(cudaStreamSynchronize(stream));
  };
  tp::StreamGuard guard(stream);  // lazy = false captures on the current stream
  bench::compare(state,
                 {{"eager", [&] { timed([&](auto& b) { b.emplace(ladder, Body{&f.model}, tp::BucketOptions{.lazy = false}); }); }},
                  {"lazy",
                   [&] {
                     Ladder order = ladder;
                     std::shuffle(order.begin(), order.end(), random);
                     timed([&](auto& b) {
                       b.emplace(ladder, Body{&f.model});
                       for (std::size_t n : order) b->run(n, stream);
                     });
                   }},
                  {"eager_shared", [&] {
                     timed([&](auto& b) {
                       b.emplace(ladder, Body{&f.model}, tp::BucketOptions{.lazy = false, .share_executables = true});
                     });
                   }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 });
}

// ---- piecewise: 3 segments, 2 eager steps -----------------------------------------------------

__global__ void add_one(float* x) { *x += 1.0f; }

struct Pieces {
  tp::Stream stream;
  tp::DeviceTensor<float> scalar{1, stream};
  tp::PiecewiseGraph piecewise;
  std::vector<tp::Graph> parts;  // the same segments captured as separate graphs

  void segment(tp::StreamRef s) {
    for (int k = 0; k < 20; ++k) add_one<<<1, 1, 0, s>>>(scalar.data());
  }
  void eager_step(tp::StreamRef s) { add_one<<<1, 1, 0, s>>>(scalar.data()); }

  Pieces() {
    BENCH_CUDA(cudaMemsetAsync(scalar.data(), 0, sizeof(float), stream));
    for (int k = 0; k < 3; ++k) {
      piecewise.capture([&](tp::StreamRef s) { segment(s); }, {.stream = stream});
      if (k < 2) piecewise.eager([this](tp::StreamRef s) { eager_step(s); });
      tp::Graph part;
      part.capture([&](tp::StreamRef s) { segment(s); }, {.stream = stream});
      parts.push_back(std::move(part));
    }
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }
};

Pieces& pieces() {
  static Pieces p;
  return p;
}

void piecewise_replay(benchmark::State& state) {
  auto& p = pieces();
  const tp::StreamRef stream = p.stream;
  bench::compare_submit(state, batch,
                        {{"piecewise", [&] { p.piecewise.replay(stream); }},
                         {"parts", [&] {
                            p.parts[0].replay(stream);
                            p.eager_step(stream);
                            p.parts[1].replay(stream);
                            p.eager_step(stream);
                            p.parts[2].replay(stream);
                          }}});
}

// ---- memory (measured once, printed with the ratios) -------------------------------------------

struct Memory {
  double shared = 0;             // the 32-bucket ladder in one pool, captured largest first
  double alone = 0;              // the largest bucket alone
  double private_pools = 0;      // one private pool per bucket
  double exec_separate = 0;      // device memory of the executables, one per bucket (cudaMemGetInfo)
  double exec_shared = 0;        // the same with share_executables
  std::size_t shared_count = 0;  // executables kept with share_executables
};

std::size_t device_used() {
  std::size_t free = 0;
  std::size_t total = 0;
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaMemGetInfo(&free, &total));
  return total - free;
}

// Device memory a whole ladder's executables use: what the device lost while the ladder was
// captured and every bucket ran once, less what its pool reserved.
double executables_bytes(Model& model, bool share, std::size_t& count) {
  const std::size_t before = device_used();
  Buckets buckets(ladder, Body{&model}, {.share_executables = share});
  buckets.capture_all(model.stream);
  for (std::size_t n : ladder) buckets.run(n, model.stream);
  const std::size_t after = device_used();
  count = buckets.executables();
  return static_cast<double>(after - before) - static_cast<double>(buckets.pool().reserved_bytes());
}

Memory measure_memory() {
  Model model;
  tp::StreamGuard guard(model.stream);
  Memory m;
  {
    Buckets all(ladder, Body{&model}, {.lazy = false});
    Buckets largest(Ladder{ladder.back()}, Body{&model}, {.lazy = false});
    m.shared = static_cast<double>(all.pool().reserved_bytes());
    m.alone = static_cast<double>(largest.pool().reserved_bytes());
  }
  {
    std::vector<tp::Graph> graphs(ladder.size());
    for (std::size_t k = 0; k < ladder.size(); ++k) {
      graphs[k].capture([&](tp::StreamRef s) { model.step(s, ladder[k]); }, {.stream = model.stream});
      m.private_pools += static_cast<double>(graphs[k].pool().reserved_bytes());
    }
  }
  std::size_t count = 0;
  m.exec_separate = executables_bytes(model, false, count);
  m.exec_shared = executables_bytes(model, true, m.shared_count);
  return m;
}

void register_all() {
  benchmark::RegisterBenchmark("run_cost", run_cost)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(30);
  // ~10 s per repetition (eager: 2 million launches): two repetitions give a median.
  benchmark::RegisterBenchmark("end_to_end", end_to_end)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(2);
  benchmark::RegisterBenchmark("capture_ladder", capture_ladder)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
  benchmark::RegisterBenchmark("piecewise_replay", piecewise_replay)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return bench::run_main(argc, argv, [](bench::MedianReporter& r) {
    const Memory m = measure_memory();
    constexpr double mib = 1 << 20;
    const double replay = r.us("run_cost:replay"), run = r.us("run_cost:run"), run_shared = r.us("run_cost:run_shared_same_bucket");
    const double alternate_separate = r.us("run_cost:alternate_separate"), alternate_shared = r.us("run_cost:alternate_shared");
    const double eager = r.us("end_to_end:eager"), buckets = r.us("end_to_end:buckets");
    const double capture_eager = r.us("capture_ladder:eager"), capture_lazy = r.us("capture_ladder:lazy"),
                 capture_shared = r.us("capture_ladder:eager_shared");
    const double piecewise = r.us("piecewise_replay:piecewise"), parts = r.us("piecewise_replay:parts");
    const std::string steps = std::to_string(fixture().batches.size());
    std::vector<bench::Row> rows{
        {"memory: 32 buckets, one pool", m.shared / mib, "MiB", ""},
        {"memory: largest bucket alone", m.alone / mib, "MiB", ""},
        {"memory: 32 buckets, a private pool each", m.private_pools / mib, "MiB", ""},
        bench::ratio_row("memory: one pool / largest alone", m.shared, m.alone, 1.10),
        {"memory: private pools / largest alone", m.private_pools / m.alone, "x", "(report)"},
        {"run(n) host submit, bucket 128", run, "us", ""},
        {"bare replay(stream) of the same step, host submit", replay, "us", ""},
        bench::ratio_row("run(n) / bare replay", run, replay, 1.10),
        {"run(n), shared executable, same bucket / bare replay", run_shared / replay, "x", "(report)"},
        {"alternating buckets 128/256: separate executables", alternate_separate, "us", ""},
        {"alternating buckets 128/256: one shared executable", alternate_shared, "us", ""},
        {"cost of one switch of a shared executable", alternate_shared - alternate_separate, "us", "(report)"},
        {steps + " random steps: eager, launch to completion", eager / 1e3, "ms", ""},
        {steps + " random steps: buckets, launch to completion", buckets / 1e3, "ms", ""},
        bench::ratio_row("eager / buckets", eager, buckets, 3.0, false),
        {"capture 32 buckets, largest first (lazy = false)", capture_eager / 1e3, "ms", ""},
        {"capture 32 buckets lazily, random order (host)", capture_lazy / 1e3, "ms", ""},
        {"capture 32 buckets, largest first, shared executables", capture_shared / 1e3, "ms", ""},
        {"capture: lazy / largest first", capture_lazy / capture_eager, "x", "(report)"},
        {"capture: shared executables / separate", capture_shared / capture_eager, "x", "(report)"},
        {"executables' device memory, separate (cudaMemGetInfo)", m.exec_separate / mib, "MiB", ""},
        {"executables' device memory, shared (" + std::to_string(m.shared_count) + " kept)", m.exec_shared / mib, "MiB", ""},
        {"piecewise replay, 3 segments + 2 eager steps, host", piecewise, "us", ""},
        {"the segments' replays + the steps by hand, host", parts, "us", ""},
        bench::ratio_row("piecewise / by hand", piecewise, parts, 1.05),
    };
    bench::print_table("bench/buckets (medians of paired measurements; ratios within this run)", rows);
  });
}
