// bench/memory: how much device memory a ladder of graphs takes, said before capture and checked
// after, on a decoder-like step (hidden 4096, 8 layers of 25 kernels and cuBLAS gemms, TF32;
// temporaries of hundreds of MiB at the largest bucket) over a ladder of 32 batch sizes (1 ... 512).
//   - GraphBuckets::estimate against what capture_all then took (cudaMemGetInfo before and after,
//     same process): within 2% or 4 MiB; a per-graph linear estimate (each bucket alone, summed)
//     beside it;
//   - the executables' modelled bytes summed over the ladder against the device memory they took
//     (8 more executables of every graph, measured together, so that the 2 MiB step divides by 8);
//   - one pool for the ladder against the largest bucket alone;
//   - share_executables against separate executables: bytes saved, and the cost of a switch;
//   - capture time of the whole ladder, eager (capture_all) and lazy (first runs), against raw
//     CUDA doing the same work (cudaStreamBeginCapture, the same kernels and gemms into buffers
//     carved from one cudaMalloc, cudaGraphInstantiate), and the time of estimate itself.
// The driver keeps a destroyed executable's memory for later executables, so each memory
// measurement runs in a fresh child process (this binary with --part=...) that destroys nothing
// before it measures. The parent runs the timings and prints one table.
//
// Until GraphBuckets::estimate / memory and Graph::executable_bytes exist, the same computations
// are reached through graph/detail/bucket_memory.hpp and detail/exec_memory.hpp directly (the table says
// which).
#include "bench_util.hpp"
#include "decoder_kernels.cuh"

#include <tensorplay/cublas.hpp>
#include <tensorplay/graph.hpp>
#include <tensorplay/graph/detail/bucket_memory.hpp>

#include <benchmark/benchmark.h>

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

using Ladder = std::vector<std::size_t>;
const Ladder ladder(std::begin(decoder::ladder), std::end(decoder::ladder));
using decoder::add_into;
using decoder::affine;
using decoder::blocks;
using decoder::ffn;
using decoder::gated;
using decoder::hidden;
using decoder::layers;
constexpr double mib = 1 << 20;

void check_cublas(cublasStatus_t status, const char* what) {
  bench::check_status(status, CUBLAS_STATUS_SUCCESS, what, cublasGetStatusName);
}

//! Weights (one set shared by the layers), the user's input and output, cuBLAS and its workspace:
//! all outside the graphs' pools.
struct Decoder {
  tp::Stream stream;
  cublasHandle_t handle = nullptr;
  tp::DeviceTensor<std::byte> workspace{std::size_t{32} << 20, stream};
  tp::DeviceTensor<float> wqkv{std::size_t{hidden} * 3 * hidden, stream};
  tp::DeviceTensor<float> wo{std::size_t{hidden} * hidden, stream};
  tp::DeviceTensor<float> wup{std::size_t{hidden} * ffn, stream};
  tp::DeviceTensor<float> wgate{std::size_t{hidden} * ffn, stream};
  tp::DeviceTensor<float> wdown{std::size_t{ffn} * hidden, stream};
  tp::DeviceTensor<float> x{ladder.back() * hidden, stream};
  tp::DeviceTensor<float> y{ladder.back() * hidden, stream};

  Decoder() {
    check_cublas(cublasCreate(&handle), "cublasCreate");
    check_cublas(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH), "cublasSetMathMode");
    tp::cublas_set_stream(handle, stream, workspace.span());
    for (auto* t : {&wqkv, &wo, &wup, &wgate, &wdown, &x, &y}) BENCH_CUDA(cudaMemsetAsync(t->data(), 0, t->bytes(), stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }
  ~Decoder() { cublasDestroy(handle); }

  // out (rows x n) = in (rows x k) * w (k x n), row-major: cuBLAS's column-major out^T = w^T in^T.
  void gemm(cudaStream_t s, const float* in, const float* w, float* out, std::size_t rows, int k, int n) {
    const float one = 1.0f, zero = 0.0f;
    (void)s;
    check_cublas(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, static_cast<int>(rows), k, &one, w, n, in, k, &zero, out, n),
                 "cublasSgemm");
  }
  void ew(cudaStream_t s, const float* in, float* out, std::size_t n, float a, float b) {
    affine<<<blocks(n), 256, 0, s>>>(in, out, n, a, b);
  }

  //! The step over `rows` samples: 1 + 8 x 25 + 1 launches (5 of them gemms). `make(n)` gives a
  //! buffer of n floats (a DeviceTensor from the current pool, or a slice of a raw arena). Each
  //! layer keeps its qkv and activation until the step ends (as a prefill keeps its KV), the rest
  //! is freed within the layer.
  template <class Make>
  void step(cudaStream_t s, std::size_t rows, Make&& make) {
    const std::size_t nh = rows * hidden, nf = rows * ffn;
    std::vector<decltype(make(std::size_t{1}))> kept;
    auto h = make(nh);
    ew(s, x.data(), h.data(), nh, 1.0f, 0.0f);
    for (int l = 0; l < layers; ++l) {
      auto xn = make(nh);
      ew(s, h.data(), xn.data(), nh, 0.5f, 0.0f);                       // norm
      auto qkv = make(3 * nh);
      gemm(s, xn.data(), wqkv.data(), qkv.data(), rows, hidden, 3 * hidden);
      ew(s, qkv.data(), qkv.data(), 3 * nh, 1.0f, 0.1f);               // bias
      ew(s, qkv.data(), qkv.data(), 3 * nh, 0.99f, 0.0f);              // rotary
      auto att = make(nh);
      ew(s, qkv.data(), att.data(), nh, 1.0f, 0.0f);                    // attention (elementwise stand-in)
      ew(s, att.data(), att.data(), nh, 0.125f, 0.0f);                  // scale
      ew(s, att.data(), att.data(), nh, 1.0f, -0.5f);                   // softmax stand-in
      auto o = make(nh);
      gemm(s, att.data(), wo.data(), o.data(), rows, hidden, hidden);
      ew(s, o.data(), o.data(), nh, 1.0f, 0.1f);                        // bias
      add_into<<<blocks(nh), 256, 0, s>>>(h.data(), o.data(), nh);      // residual
      auto hn = make(nh);
      ew(s, h.data(), hn.data(), nh, 0.5f, 0.0f);                       // norm
      auto up = make(nf);
      gemm(s, hn.data(), wup.data(), up.data(), rows, hidden, ffn);
      ew(s, up.data(), up.data(), nf, 1.0f, 0.1f);                      // bias
      auto gate = make(nf);
      gemm(s, hn.data(), wgate.data(), gate.data(), rows, hidden, ffn);
      ew(s, gate.data(), gate.data(), nf, 1.0f, 0.1f);                  // bias
      auto act = make(nf);
      gated<<<blocks(nf), 256, 0, s>>>(up.data(), gate.data(), act.data(), nf);
      ew(s, act.data(), act.data(), nf, 0.9f, 0.0f);                    // scale
      auto d = make(nh);
      gemm(s, act.data(), wdown.data(), d.data(), rows, ffn, hidden);
      ew(s, d.data(), d.data(), nh, 1.0f, 0.1f);                        // bias
      add_into<<<blocks(nh), 256, 0, s>>>(h.data(), d.data(), nh);      // residual
      ew(s, h.data(), h.data(), nh, 0.99f, 0.0f);                       // layer scale
      ew(s, h.data(), h.data(), nh, 1.0f, 0.0f);                        // clamp stand-in
      ew(s, xn.data(), hn.data(), nh, 1.0f, 0.0f);                      // statistics stand-ins
      ew(s, hn.data(), o.data(), nh, 1.0f, 0.0f);
      ew(s, o.data(), d.data(), nh, 1.0f, 0.0f);
      kept.push_back(std::move(qkv));
      kept.push_back(std::move(act));
    }
    ew(s, h.data(), y.data(), nh, 1.0f, 0.0f);
    BENCH_CUDA(cudaGetLastError());
  }

  //! The step with temporaries from the current pool (the bucket's while captured).
  void pooled_step(tp::StreamRef s, std::size_t rows) {
    step(s.get(), rows, [&](std::size_t n) { return tp::DeviceTensor<float>(n, s); });
  }
};

//! The body of every GraphBuckets here.
struct Body {
  Decoder* decoder;
  void operator()(tp::StreamRef s, std::size_t rows) const { decoder->pooled_step(s, rows); }
};
using Buckets = tp::GraphBuckets<Body>;

//! One slice of a raw arena (the raw CUDA baseline: no allocator).
struct Slice {
  float* p;
  float* data() const { return p; }
};

//! Loads every kernel cuBLAS picks for the ladder's shapes (eagerly: loading cannot be captured,
//! and it costs device memory that no graph should be charged), then gives the default pool's
//! memory back.
void warm_up(Decoder& d) {
  tp::StreamGuard guard(d.stream);
  for (std::size_t rows : ladder) d.pooled_step(d.stream, rows);
  BENCH_CUDA(cudaStreamSynchronize(d.stream));
  (void)tp::Pool::release_unused_default_memory();
}

std::size_t device_used() {
  std::size_t free = 0, total = 0;
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaMemGetInfo(&free, &total));
  return total - free;
}

// ---- the members, or the same computation reached directly until they exist ------------------

template <class B>
constexpr bool wired = requires(B& b, const B& c, tp::StreamRef s) {
  b.estimate(s);
  c.memory();
};

template <class B = Buckets>
tp::MemoryEstimate estimate_of(B& buckets, Body body, bool share, tp::StreamRef stream) {
  if constexpr (wired<B>) {
    (void)body, (void)share;
    return buckets.estimate(stream);
  } else {
    struct Uncaptured {
      bool captured = false;
    };
    const std::vector<Uncaptured> none(ladder.size());
    return tp::detail::estimate_ladder(ladder, body, none, share, 0, stream, tp::source_location::current());
  }
}

//! The executables' bytes the ladder holds: memory() once it exists, else the estimate's figure
//! (the same model over the same topologies).
template <class B = Buckets>
std::size_t held_executable_bytes(const B& buckets, const tp::MemoryEstimate& estimate) {
  if constexpr (wired<B>) {
    (void)estimate;
    return buckets.memory().executable_bytes;
  } else {
    (void)buckets;
    return estimate.executable_bytes;
  }
}

template <class G = tp::Graph>
std::size_t executable_bytes_of(const G& graph) {
  if constexpr (requires { graph.executable_bytes(); }) return graph.executable_bytes();
  else return tp::detail::modelled_exec_bytes(graph.native_graph(), nullptr, tp::source_location::current());
}

// ---- the child processes: one memory measurement each -----------------------------------------

void result(const char* key, double value) { std::printf("RESULT %s %.6f\n", key, value); }

// The ladder's estimate, then capture_all, in a process that has destroyed no executable.
int measure_ladder(bool share) {
  Decoder d;
  warm_up(d);
  Buckets buckets(ladder, Body{&d}, {.share_executables = share});
  const std::size_t m0 = device_used();
  const auto start = bench::Clock::now();
  const tp::MemoryEstimate e = estimate_of(buckets, Body{&d}, share, d.stream);
  const double estimate_ms = bench::seconds_since(start) * 1e3;
  const std::size_t m1 = device_used();
  buckets.capture_all(d.stream);
  const std::size_t m2 = device_used();
  const tp::PoolStats pool = buckets.pool().stats();
  result("estimate_pool", e.pool_bytes);
  result("estimate_exec", e.executable_bytes);
  result("estimate_left", static_cast<double>(m1) - static_cast<double>(m0));
  result("estimate_ms", estimate_ms);
  result("taken", static_cast<double>(m2 - m1));
  result("reserved", pool.reserved_bytes);
  result("peak", pool.peak_allocated_bytes);
  result("segments", pool.segments);
  result("held_exec", held_executable_bytes(buckets, e));
  result("executables", buckets.executables());
  result("wired", wired<Buckets> ? 1 : 0);
  if (share) return 0;

  // The executables again, precisely: the same ladder as Graphs in one pool (one executable
  // each: with and without them differs by their memory), then 8 more executables of each graph.
  {
    const tp::Pool pool2 = tp::graph_pool_handle();
    std::vector<tp::Graph> graphs;
    graphs.reserve(ladder.size());
    for (std::size_t k = 0; k < ladder.size(); ++k) graphs.emplace_back(tp::GraphOptions{.pool = pool2});
    const std::size_t a0 = device_used();
    for (std::size_t k = ladder.size(); k-- > 0;)
      graphs[k].capture([&](tp::StreamRef s) { d.pooled_step(s, ladder[k]); }, {.stream = d.stream});
    const std::size_t a1 = device_used();
    double modelled = 0;
    std::size_t nodes = 0, memsets = 0, lanes = 0, params = 0;
    for (const tp::Graph& g : graphs) {
      modelled += static_cast<double>(executable_bytes_of(g));
      const auto shape = tp::detail::modelled_exec_shape(g.native_graph(), nullptr, tp::source_location::current());
      nodes += shape.kernel_nodes;
      memsets += shape.memset_nodes;
      lanes += shape.lanes;
      params += shape.kernel_param_bytes;
    }
    result("memset_nodes_per_graph", static_cast<double>(memsets) / static_cast<double>(ladder.size()));
    result("lanes_per_graph", static_cast<double>(lanes) / static_cast<double>(ladder.size()));
    result("param_bytes_per_kernel", static_cast<double>(params) / static_cast<double>(nodes));
    std::vector<tp::detail::ExecHandle> copies;
    const std::size_t b0 = device_used();
    for (int copy = 0; copy < 8; ++copy) {
      for (const tp::Graph& g : graphs) {
        cudaGraphExec_t exec = nullptr;
        BENCH_CUDA(cudaGraphInstantiate(&exec, g.native_graph(), 0));
        copies.emplace_back(exec);
      }
    }
    const std::size_t b1 = device_used();
    const auto walk_start = bench::Clock::now();
    const std::size_t walked = executable_bytes_of(graphs.back());
    result("model_walk_us", bench::seconds_since(walk_start) * 1e6);
    (void)walked;
    result("graphs_exec_direct", static_cast<double>(a1 - a0) - static_cast<double>(pool2.stats().reserved_bytes));
    result("graphs_exec_model", modelled);
    result("graphs_exec_copies", static_cast<double>(b1 - b0) / 8);
    result("kernel_nodes_per_graph", static_cast<double>(nodes) / static_cast<double>(ladder.size()));
  }
  // The way servers estimate: each bucket captured alone, summed (last: it destroys executables).
  double linear = 0;
  double largest_alone = 0;
  for (std::size_t rows : ladder) {
    tp::Graph g;
    g.capture([&](tp::StreamRef s) { d.pooled_step(s, rows); }, {.stream = d.stream});
    const double reserved = static_cast<double>(g.pool().stats().reserved_bytes);
    linear += reserved + static_cast<double>(executable_bytes_of(g));
    if (rows == ladder.back()) largest_alone = reserved;
  }
  result("linear", linear);
  result("largest_alone", largest_alone);
  return 0;
}

std::map<std::string, double> run_child(const char* self, const char* part) {
  std::map<std::string, double> out;
  const std::string command = std::string(self) + " --part=" + part;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    char key[128];
    double value = 0;
    if (std::sscanf(line, "RESULT %127s %lf", key, &value) == 2) out[key] = value;
    else std::fputs(line, stdout);
  }
  if (::pclose(pipe) != 0) std::printf("child %s failed\n", part);
  return out;
}

// ---- timings (this process) ----------------------------------------------------------------------

struct Fixture {
  Decoder decoder;
  Buckets separate{ladder, Body{&decoder}};
  Buckets shared{ladder, Body{&decoder}, {.share_executables = true}};
  float* arena = nullptr;  // the raw baseline's buffers
  std::size_t arena_floats = 0;
  double last = 0;

  Fixture() {
    warm_up(decoder);
    separate.capture_all(decoder.stream);
    shared.capture_all(decoder.stream);
    // Every buffer the step makes at the largest bucket, without reuse: h, then per layer
    // xn, qkv (3), att, o, hn, d (hidden each) and up, gate, act (ffn each).
    const std::size_t rows = ladder.back();
    arena_floats = rows * hidden + layers * (8 * rows * hidden + 3 * rows * ffn);
    BENCH_CUDA(cudaMalloc(&arena, arena_floats * sizeof(float)));
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Capturing the whole ladder: capture_all (lazy = false), first runs in a random order, raw CUDA,
// and estimate (captures without compiling). Host time; destruction not timed.
void capture_ladder(benchmark::State& state) {
  auto& f = fixture();
  Decoder& d = f.decoder;
  const tp::StreamRef stream = d.stream;
  std::mt19937 random(5);
  auto timed = [&](auto&& work) {
    const auto start = bench::Clock::now();
    work();
    f.last = bench::seconds_since(start);
    BENCH_CUDA(cudaStreamSynchronize(stream));
  };
  tp::StreamGuard guard(stream);
  bench::compare(state,
                 {{"eager",
                   [&] {
                     std::optional<Buckets> b;
                     timed([&] { b.emplace(ladder, Body{&d}, tp::BucketOptions{.lazy = false}); });
                   }},
                  {"lazy",
                   [&] {
                     Ladder order = ladder;
                     std::shuffle(order.begin(), order.end(), random);
                     std::optional<Buckets> b;
                     timed([&] {
                       b.emplace(ladder, Body{&d});
                       for (std::size_t n : order) b->run(n, stream);
                     });
                   }},
                  {"raw",
                   [&] {
                     std::vector<tp::detail::GraphHandle> graphs(ladder.size());
                     std::vector<tp::detail::ExecHandle> execs(ladder.size());
                     timed([&] {
                       for (std::size_t k = ladder.size(); k-- > 0;) {
                         BENCH_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
                         std::size_t used = 0;
                         d.step(stream.get(), ladder[k], [&](std::size_t n) {
                           Slice s{f.arena + used};
                           used += n;
                           return s;
                         });
                         BENCH_CUDA(cudaStreamEndCapture(stream.get(), graphs[k].out()));
                         cudaGraphExec_t exec = nullptr;
                         BENCH_CUDA(cudaGraphInstantiateWithFlags(&exec, graphs[k].get(), cudaGraphInstantiateFlagAutoFreeOnLaunch));
                         execs[k] = tp::detail::ExecHandle(exec);
                       }
                     });
                   }},
                  {"estimate", [&] {
                     Buckets b(ladder, Body{&d});
                     timed([&] { (void)estimate_of(b, Body{&d}, false, stream); });
                   }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 },
                 bench::Order::Shuffle);
}

// Alternating two buckets (8, 16) with separate executables and with one shared executable: the
// difference is one cudaGraphExecUpdate per switch. Host submit cost.
void switch_cost(benchmark::State& state) {
  auto& f = fixture();
  const tp::StreamRef stream = f.decoder.stream;
  int turn = 0;
  bench::compare_submit(state, 16,
                        {{"alternate_separate", [&] { f.separate.run(++turn % 2 ? 8 : 16, stream); }},
                         {"alternate_shared", [&] { f.shared.run(++turn % 2 ? 8 : 16, stream); }},
                         {"same_shared", [&] { f.shared.run(16, stream); }}});
}

void register_all() {
  benchmark::RegisterBenchmark("capture_ladder", capture_ladder)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
  benchmark::RegisterBenchmark("switch_cost", switch_cost)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--part=ladder") == 0) return measure_ladder(false);
    if (std::strcmp(argv[i], "--part=shared") == 0) return measure_ladder(true);
  }
  register_all();
  return bench::run_main(argc, argv, [&](bench::MedianReporter& r) {
    std::map<std::string, double> a = run_child(argv[0], "ladder");
    std::map<std::string, double> b = run_child(argv[0], "shared");
    const double n = static_cast<double>(ladder.size());
    const double estimate = a["estimate_pool"] + a["estimate_exec"];
    const double taken = a["taken"];
    const double margin = std::max(0.02 * estimate, 4 * mib);
    const double shared_estimate = b["estimate_pool"] + b["estimate_exec"];
    const double shared_margin = std::max(0.02 * shared_estimate, 4 * mib);
    auto within = [](double x, double ref, double tol) {
      return std::string(std::abs(x - ref) <= tol ? "(target: within the margin: met)" : "(target: within the margin: MISSED)");
    };
    const double exec_ratio = a["graphs_exec_model"] / a["graphs_exec_copies"];
    const double switch_us = r.us("switch_cost:alternate_shared") - r.us("switch_cost:alternate_separate");
    const double saved = a["held_exec"] - b["held_exec"];
    const std::string how = a["wired"] != 0 ? "" : " (members not wired: computed directly)";
    std::vector<bench::Row> rows{
        {"ladder: kernel nodes per graph", a["kernel_nodes_per_graph"], "", ""},
        {"ladder: memset nodes per graph", a["memset_nodes_per_graph"], "", ""},
        {"ladder: lanes per graph (model)", a["lanes_per_graph"], "", ""},
        {"ladder: kernel parameter bytes per kernel node", a["param_bytes_per_kernel"], "B", ""},
        {"estimate: pool" + how, a["estimate_pool"] / mib, "MiB", ""},
        {"estimate: executables (modelled)", a["estimate_exec"] / mib, "MiB", ""},
        {"estimate: device memory left held afterwards", a["estimate_left"] / mib, "MiB", "(target <= 2 MiB)"},
        {"estimate: time, whole ladder", a["estimate_ms"], "ms", ""},
        {"capture_all took (cudaMemGetInfo)", taken / mib, "MiB", ""},
        {"capture_all: pool reserved (stats)", a["reserved"] / mib, "MiB", ""},
        {"capture_all: pool peak allocated (stats)", a["peak"] / mib, "MiB", ""},
        {"capture_all - estimate", (taken - estimate) / mib, "MiB", within(taken, estimate, margin)},
        {"margin: 2% of the estimate or 4 MiB", margin / mib, "MiB", ""},
        {"per-graph linear estimate (each bucket alone, summed)", a["linear"] / mib, "MiB", ""},
        {"linear estimate / what capture_all took", a["linear"] / taken, "x", "(report)"},
        {"executables: modelled, summed over the ladder", a["graphs_exec_model"] / mib, "MiB", ""},
        {"executables: measured, 8 copies of each graph / 8", a["graphs_exec_copies"] / mib, "MiB", ""},
        {"executables: measured, with - without (2 MiB steps)", a["graphs_exec_direct"] / mib, "MiB", ""},
        {"executables: modelled / measured", exec_ratio, "x",
         std::abs(exec_ratio - 1) <= 0.10 ? "(target within 10%: met)" : "(target within 10%: MISSED)"},
        {"model walk of one graph (executable_bytes)", a["model_walk_us"], "us", "(report)"},
        {"memory: largest bucket alone (pool)", a["largest_alone"] / mib, "MiB", ""},
        bench::ratio_row("memory: one pool / largest alone", a["reserved"], a["largest_alone"], 1.10),
        {"shared: executables kept", b["executables"], "", ""},
        {"shared: capture_all took - estimate", (b["taken"] - shared_estimate) / mib, "MiB",
         within(b["taken"], shared_estimate, shared_margin)},
        {"shared: executables' bytes (modelled)", b["held_exec"] / mib, "MiB", ""},
        {"shared: executables' bytes saved (modelled)", saved / mib, "MiB", "(report)"},
        {"shared: executables' bytes saved (measured, taken - reserved)",
         ((a["taken"] - a["reserved"]) - (b["taken"] - b["reserved"])) / mib, "MiB", "(report)"},
        {"alternating buckets 8/16: separate executables", r.us("switch_cost:alternate_separate"), "us", ""},
        {"alternating buckets 8/16: one shared executable", r.us("switch_cost:alternate_shared"), "us", ""},
        {"cost of one switch of a shared executable", switch_us, "us", "(report)"},
        {"capture, whole ladder, capture_all: per graph", r.us("capture_ladder:eager") / 1e3 / n, "ms", ""},
        {"capture, whole ladder, lazy first runs: per graph", r.us("capture_ladder:lazy") / 1e3 / n, "ms", ""},
        {"capture, whole ladder, raw CUDA: per graph", r.us("capture_ladder:raw") / 1e3 / n, "ms", ""},
        {"estimate, whole ladder: per graph", r.us("capture_ladder:estimate") / 1e3 / n, "ms", ""},
        {"capture_all / raw CUDA", r.us("capture_ladder:eager") / r.us("capture_ladder:raw"), "x", "(report)"},
        {"lazy / raw CUDA", r.us("capture_ladder:lazy") / r.us("capture_ladder:raw"), "x", "(report: includes the replays)"},
    };
    bench::print_table("bench/memory (a fresh process per memory measurement; timings: medians in this run)", rows);
  });
}
