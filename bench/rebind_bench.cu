// bench/rebind: Graph::rebind on a 1000-kernel graph where 100 kernels read the buffer, against
// its floor (raw cudaGraphExecKernelNodeSetParams on exactly those 100 nodes, parameters computed
// beforehand) and against update() with the same change; replay after a rebind against before;
// and 4 x 64 MiB of fresh inputs per step, rebind + replay against stage_and_launch (device time
// per step and host submit). PyTorch's static.copy_(x) + replay() at 4 x 64 MiB:
// bench/peers/torch_stage.py, in the same run. One binary, one run, variants measured alternately.
#include "bench_util.hpp"
#include "raw_nodes.cuh"

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

constexpr int kernels = 1000;
constexpr int readers = 100;  // every tenth kernel reads the buffer
constexpr std::size_t floats = 1024;

__global__ void read_buffer(const float* in, float* out, int k) { out[k] = in[k % floats]; }
__global__ void other_work(float* out, int k) { out[k] += 1.0f; }

//! The 1000 kernels; `in` is the buffer the 100 readers read.
void issue(const float* in, float* out, cudaStream_t s) {
  for (int k = 0; k < kernels; ++k) {
    if (k % (kernels / readers) == 0) read_buffer<<<1, 1, 0, s>>>(in, out, k);
    else other_work<<<1, 1, 0, s>>>(out, k);
  }
}

//! The raw floor: the same graph captured by hand, its 100 reader nodes, and their parameters for
//! either buffer, computed once.
struct RawFloor {
  struct Args {
    const float* in;
    float* out;
    int k;
    void* pointers[3];
  };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> nodes;
  std::array<std::vector<Args>, 2> args;  // for buffer 0 and buffer 1 (stable addresses: reserved)
  std::array<std::vector<cudaKernelNodeParams>, 2> params;

  RawFloor(cudaStream_t stream, const float* a, const float* b, float* out) {
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    issue(a, out, stream);
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    BENCH_CUDA(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    std::size_t count = 0;
    BENCH_CUDA(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> all(count);
    BENCH_CUDA(cudaGraphGetNodes(graph, all.data(), &count));
    for (auto& v : args) v.reserve(readers);
    for (cudaGraphNode_t node : all) {
      cudaKernelNodeParams p{};
      BENCH_CUDA(cudaGraphKernelNodeGetParams(node, &p));
      if (p.func != reinterpret_cast<void*>(&read_buffer)) continue;
      nodes.push_back(node);
      const int k = *static_cast<int*>(p.kernelParams[2]);
      const float* buffers[2] = {a, b};
      for (int which = 0; which < 2; ++which) {
        args[which].push_back(Args{buffers[which], out, k, {}});
        Args& stored = args[which].back();
        stored.pointers[0] = &stored.in;
        stored.pointers[1] = &stored.out;
        stored.pointers[2] = &stored.k;
        params[which].push_back(raw_nodes::kernel_params(p.func, stored.pointers, p.gridDim, p.blockDim, p.sharedMemBytes));
      }
    }
    if (nodes.size() != readers) {
      std::fprintf(stderr, "raw floor: found %zu reader nodes, expected %d\n", nodes.size(), readers);
      std::exit(2);
    }
  }
  ~RawFloor() {
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
  }

  //! Points the 100 readers at buffer `which`: the floor of any rebind.
  void set(int which) {
    for (std::size_t i = 0; i < nodes.size(); ++i) BENCH_CUDA(cudaGraphExecKernelNodeSetParams(exec, nodes[i], &params[which][i]));
  }
};

struct Fixture {
  tp::Stream stream;
  tp::DeviceTensor<float> a{floats, stream};
  tp::DeviceTensor<float> b{floats, stream};
  tp::DeviceTensor<float> out{kernels, stream};
  tp::Graph ours;        // rebound back and forth
  tp::Graph updated;     // update()d back and forth
  tp::Graph before;      // never rebound (replay cost)
  tp::Graph after;       // rebound once (replay cost)
  RawFloor raw{stream, a.data(), b.data(), out.data()};
  int which = 0;         // the buffer `ours` and `raw` read now
  int updated_which = 0;
  double last = 0;

  Fixture() {
    BENCH_CUDA(cudaMemsetAsync(a.data(), 0, a.bytes(), stream));
    BENCH_CUDA(cudaMemsetAsync(b.data(), 0, b.bytes(), stream));
    BENCH_CUDA(cudaMemsetAsync(out.data(), 0, out.bytes(), stream));
    for (tp::Graph* g : {&ours, &updated, &before, &after})
      g->capture([&](tp::StreamRef s) { issue(a.data(), out.data(), s); }, {.stream = stream});
    // Launched once each, as in a loop that replays between changes; the index is built outside
    // any timing (the first rebind's cost is measured apart).
    for (tp::Graph* g : {&ours, &updated, &before, &after}) g->replay(stream);
    BENCH_CUDA(cudaGraphLaunch(raw.exec, stream));
    if (after.rebind(a, b).nodes != readers) std::abort();
    if (ours.rebind(a, b).nodes != readers || ours.rebind(b, a).nodes != readers) std::abort();
    stream.synchronize();
  }

  const tp::DeviceTensor<float>& buffer(int k) const { return k == 0 ? a : b; }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Each sample times `calls` consecutive changes of one variant, alternating the buffer.
constexpr int calls = 4;

void change(benchmark::State& state) {
  auto& f = fixture();
  bench::compare(state,
                 {{"rebind",
                   [&] {
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c) {
                       if (f.ours.rebind(f.buffer(f.which), f.buffer(1 - f.which)).nodes != readers) std::abort();
                       f.which = 1 - f.which;
                     }
                     f.last = bench::seconds_since(start) / calls;
                   }},
                  {"raw_set_params",
                   [&] {
                     static int raw_which = 0;
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c) {
                       raw_which = 1 - raw_which;
                       f.raw.set(raw_which);
                     }
                     f.last = bench::seconds_since(start) / calls;
                   }},
                  {"update",
                   [&] {
                     const auto start = bench::Clock::now();
                     f.updated_which = 1 - f.updated_which;
                     const float* in = f.buffer(f.updated_which).data();
                     const tp::UpdateResult r = f.updated.update([&](tp::StreamRef s) { issue(in, f.out.data(), s); }, {.stream = f.stream});
                     if (r.outcome != tp::UpdateOutcome::Updated) std::abort();
                     f.last = bench::seconds_since(start);
                   }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 },
                 bench::Order::Shuffle);
}

// The first rebind of a freshly compiled executable: it builds the index (one walk of the graph).
void first_rebind(benchmark::State& state) {
  auto& f = fixture();
  bench::compare(state, {{"first_rebind", [&] {
                            tp::Graph g;
                            g.capture([&](tp::StreamRef s) { issue(f.a.data(), f.out.data(), s); }, {.stream = f.stream});
                            const auto start = bench::Clock::now();
                            if (g.rebind(f.a, f.b).nodes != readers) std::abort();
                            f.last = bench::seconds_since(start);
                          }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 });
}

// Host submit of a replay of a graph never rebound and of one rebound (same work); raw CUDA's
// own cost of a launch after cudaGraphExecKernelNodeSetParams beside them.
void replay_after_rebind(benchmark::State& state) {
  auto& f = fixture();
  const tp::StreamRef stream = f.stream;
  f.raw.set(1);
  bench::compare_submit(state, 64,
                        {{"before", [&] { f.before.replay(stream); }},
                         {"after", [&] { f.after.replay(stream); }},
                         {"raw_after_set_params", [&] { BENCH_CUDA(cudaGraphLaunch(f.raw.exec, stream)); }}});
}

// ---- 4 x 64 MiB of fresh inputs per step -------------------------------------------------------

__global__ void read_four(const float* a, const float* b, const float* c, const float* d, float* out) {
  *out = a[0] + b[0] + c[0] + d[0];
}

struct Large {
  static constexpr std::size_t elements = 16 * 1024 * 1024;  // 64 MiB of floats
  tp::Stream stream;
  std::array<tp::DeviceTensor<float>, 4> statics;
  std::array<std::array<tp::DeviceTensor<float>, 4>, 2> sets;  // fresh inputs, two sets in turn
  tp::DeviceTensor<float> out{1, stream};
  tp::Graph staged;    // stage_and_launch onto `statics`
  tp::Graph rebound;   // rebind to the fresh inputs, then replay
  std::array<const tp::DeviceTensor<float>*, 4> reading{};  // what `rebound` reads now
  int turn = 0;
  int rebind_turn = 0;

  Large() {
    for (auto& t : statics) t = tp::DeviceTensor<float>(elements, stream);
    for (auto& set : sets)
      for (auto& t : set) t = tp::DeviceTensor<float>(elements, stream);
    for (auto& t : statics) BENCH_CUDA(cudaMemsetAsync(t.data(), 0, t.bytes(), stream));
    for (auto& set : sets)
      for (auto& t : set) BENCH_CUDA(cudaMemsetAsync(t.data(), 0, t.bytes(), stream));
    auto body = [&](tp::StreamRef s) {
      read_four<<<1, 1, 0, s>>>(statics[0].data(), statics[1].data(), statics[2].data(), statics[3].data(), out.data());
    };
    staged.capture(body, {.stream = stream});
    rebound.capture(body, {.stream = stream});
    for (std::size_t k = 0; k < 4; ++k) reading[k] = &statics[k];
    stage();   // the staged executable, compiled outside any timing
    rebind_and_replay();  // the index, built outside any timing
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  void stage() {
    auto& set = sets[turn++ % 2];
    staged.stage_and_launch(std::tie(statics[0], statics[1], statics[2], statics[3]), std::tie(set[0], set[1], set[2], set[3]),
                            stream);
  }

  void rebind_and_replay() {
    auto& set = sets[rebind_turn++ % 2];
    for (std::size_t k = 0; k < 4; ++k) {
      (void)rebound.rebind(*reading[k], set[k]);
      reading[k] = &set[k];
    }
    rebound.replay(stream);
  }
};

Large& large() {
  static Large l;
  return l;
}

void fresh_inputs_device(benchmark::State& state) {
  auto& l = large();
  bench::compare(state, {{"rebind_replay", [&] { l.rebind_and_replay(); }}, {"stage_and_launch", [&] { l.stage(); }}},
                 [&](const bench::Variant& v) { return bench::device_seconds(l.stream, v.run); });
}

void fresh_inputs_submit(benchmark::State& state) {
  auto& l = large();
  bench::compare_submit(state, 8, {{"rebind_replay", [&] { l.rebind_and_replay(); }}, {"stage_and_launch", [&] { l.stage(); }}});
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("change", change)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
  benchmark::RegisterBenchmark("first_rebind", first_rebind)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
  // 64 replays of 1000 kernels per variant and sample: a few milliseconds of device time each.
  benchmark::RegisterBenchmark("replay_after_rebind", replay_after_rebind)
      ->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
  benchmark::RegisterBenchmark("fresh_inputs_device", fresh_inputs_device)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  benchmark::RegisterBenchmark("fresh_inputs_submit", fresh_inputs_submit)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  const char* title = "bench/rebind (medians of paired measurements; PyTorch: bench/peers/torch_stage.py)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    auto c = [&](const std::string& key) { return r.counters[key]; };
    const double ours = c("change:rebind_us");
    const double floor = c("change:raw_set_params_us");
    const double update = c("change:update_us");
    rows.push_back({"1000 kernels, 100 read the buffer: rebind host time", ours, "us", ""});
    rows.push_back({"  floor: cudaGraphExecKernelNodeSetParams on those 100 nodes", floor, "us", ""});
    rows.push_back({"  update() with the same change (in place)", update, "us", ""});
    rows.push_back(bench::ratio_row("rebind / raw set-params floor", ours, floor, 1.2));
    rows.push_back(bench::ratio_row("rebind / update()", ours, update, 0.05));
    rows.push_back({"first rebind of an executable (builds the index)", c("first_rebind:first_rebind_us"), "us", ""});
    const double before = c("replay_after_rebind:before_us");
    const double after = c("replay_after_rebind:after_us");
    rows.push_back({"replay host submit, never rebound", before, "us", ""});
    rows.push_back({"replay host submit, rebound", after, "us", ""});
    rows.push_back({"  raw: cudaGraphLaunch after cudaGraphExecKernelNodeSetParams", c("replay_after_rebind:raw_after_set_params_us"),
                    "us", ""});
    rows.push_back(bench::ratio_row("replay after rebind / before", after, before, 1.02));
    const double dev_rebind = c("fresh_inputs_device:rebind_replay_us");
    const double dev_stage = c("fresh_inputs_device:stage_and_launch_us");
    const double sub_rebind = c("fresh_inputs_submit:rebind_replay_us");
    const double sub_stage = c("fresh_inputs_submit:stage_and_launch_us");
    rows.push_back({"4 x 64 MiB fresh inputs, device time per step: rebind x4 + replay", dev_rebind, "us", ""});
    rows.push_back({"4 x 64 MiB fresh inputs, device time per step: stage_and_launch", dev_stage, "us", ""});
    rows.push_back({"4 x 64 MiB fresh inputs, host submit per step: rebind x4 + replay", sub_rebind, "us", ""});
    rows.push_back({"4 x 64 MiB fresh inputs, host submit per step: stage_and_launch", sub_stage, "us", ""});
    rows.push_back({"  device time: stage_and_launch / (rebind + replay)", dev_stage / dev_rebind, "x", ""});
    rows.push_back({"  host submit: (rebind + replay) / stage_and_launch", sub_rebind / sub_stage, "x", ""});
  });
}
