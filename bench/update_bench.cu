// bench/update: the cost of Graph::update against raw capture + cudaGraphExecUpdate and against
// reset() + capture(); where it goes (capture, update, bookkeeping); replay after an update; and
// the first replay with and without GraphOptions::upload. One binary, one run, variants measured
// alternately.
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void add_value(float* x, float value) { *x += value; }

constexpr int sizes[] = {1, 100, 1000};

struct Fixture {
  tp::Stream stream;
  tp::DeviceTensor<float> scalar{1, stream};
  float value = 1.0f;  // changes at every capture: a new parameter to update
  double last = 0;     // seconds of the last timed operation
  double last_capture = 0;
  double last_update = 0;

  void issue(int kernels, cudaStream_t s) {
    value += 1.0f;
    for (int k = 0; k < kernels; ++k) add_value<<<1, 1, 0, s>>>(scalar.data(), value);
  }

  cudaGraph_t raw_capture(int kernels) {
    cudaGraph_t graph = nullptr;
    BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    issue(kernels, stream);
    BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
    return graph;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// update(): ours, raw capture + cudaGraphExecUpdate (+ destroying the graph it replaces, as
// update() does), and reset() + capture(); both executables updated were launched once, as in a
// loop that replays between updates (an executable never launched is measured apart). Each
// sample times `calls` consecutive calls of one variant (16 at 1 kernel, 4 at 100, 1 at 1000), as
// a loop that updates every step would make them: a lone 2 us call after another variant's
// instantiation measures mostly cold caches.
void update(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = sizes[state.range(0)];
  const int calls = kernels == 1 ? 16 : kernels == 100 ? 4 : 1;
  // Raw: a graph and its executable, updated from new captures.
  cudaGraph_t raw_graph = f.raw_capture(kernels);
  cudaGraphExec_t raw_exec = nullptr;
  BENCH_CUDA(cudaGraphInstantiate(&raw_exec, raw_graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  tp::Graph ours;
  ours.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  tp::Graph recaptured;
  recaptured.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  // A graph that is updated has been replayed: launch both executables once. (CUDA patches an
  // executable that was never launched nor uploaded about 3x slower; `cold` measures that.)
  ours.replay(f.stream);
  BENCH_CUDA(cudaGraphLaunch(raw_exec, f.stream));
  f.stream.synchronize();
  tp::Graph cold;
  cold.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  bench::compare(state,
                 {{"update",
                   [&] {
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c) {
                       const tp::UpdateResult r = ours.update([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
                       if (r.outcome != tp::UpdateOutcome::Updated) std::abort();
                     }
                     f.last = bench::seconds_since(start) / calls;
                   }},
                  {"update_never_launched",
                   [&] {
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c)
                       if (cold.update([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream}).outcome !=
                           tp::UpdateOutcome::Updated)
                         std::abort();
                     f.last = bench::seconds_since(start) / calls;
                   }},
                  {"raw",
                   [&] {
                     double capture = 0;
                     double patch = 0;
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c) {
                       const auto begin = bench::Clock::now();
                       cudaGraph_t graph = f.raw_capture(kernels);
                       const auto captured = bench::Clock::now();
                       cudaGraphExecUpdateResultInfo info{};
                       BENCH_CUDA(cudaGraphExecUpdate(raw_exec, graph, &info));
                       const auto updated = bench::Clock::now();
                       BENCH_CUDA(cudaGraphDestroy(raw_graph));
                       raw_graph = graph;
                       capture += std::chrono::duration<double>(captured - begin).count();
                       patch += std::chrono::duration<double>(updated - captured).count();
                     }
                     f.last = bench::seconds_since(start) / calls;
                     f.last_capture = capture / calls;
                     f.last_update = patch / calls;
                   }},
                  {"reset_capture",
                   [&] {
                     const auto start = bench::Clock::now();
                     for (int c = 0; c < calls; ++c) {
                       recaptured.reset();
                       recaptured.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
                     }
                     f.last = bench::seconds_since(start) / calls;
                   }},
                  {"raw_capture_only",
                   [&] {
                     f.last = f.last_capture;  // from the last raw run: its capture part
                   }},
                  {"raw_update_only", [&] { f.last = f.last_update; }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 },
                 // Shuffled: under rotation update() always came right after reset() + capture(),
                 // whose destruction of a 1000-node executable slows what follows it.
                 bench::Order::Shuffle);
  BENCH_CUDA(cudaGraphExecDestroy(raw_exec));
  BENCH_CUDA(cudaGraphDestroy(raw_graph));
}

// Host submit of a replay of a graph never updated and of one updated (same work), ours and raw
// CUDA's: an executable that cudaGraphExecUpdate patched may launch at another cost in CUDA
// itself, which raw_after / raw_before shows.
void replay_after_update(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = sizes[state.range(0)];
  tp::Graph before;
  before.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  tp::Graph after;
  after.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  (void)after.update([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
  cudaGraph_t raw_graph = f.raw_capture(kernels);
  cudaGraphExec_t raw_before = nullptr;
  cudaGraphExec_t raw_after = nullptr;
  BENCH_CUDA(cudaGraphInstantiate(&raw_before, raw_graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  BENCH_CUDA(cudaGraphInstantiate(&raw_after, raw_graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  cudaGraph_t next = f.raw_capture(kernels);
  cudaGraphExecUpdateResultInfo info{};
  BENCH_CUDA(cudaGraphExecUpdate(raw_after, next, &info));
  const tp::StreamRef stream = f.stream;
  bench::compare_submit(state, 64,
                        {{"before", [&] { before.replay(stream); }},
                         {"after", [&] { after.replay(stream); }},
                         {"raw_before", [&] { BENCH_CUDA(cudaGraphLaunch(raw_before, stream)); }},
                         {"raw_after", [&] { BENCH_CUDA(cudaGraphLaunch(raw_after, stream)); }}});
  BENCH_CUDA(cudaGraphExecDestroy(raw_after));
  BENCH_CUDA(cudaGraphExecDestroy(raw_before));
  BENCH_CUDA(cudaGraphDestroy(next));
  BENCH_CUDA(cudaGraphDestroy(raw_graph));
}

// The first replay (launch + completion) of a freshly captured graph, with and without upload.
void first_replay(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = sizes[state.range(0)];
  auto first_launch = [&](bool upload) {
    tp::Graph graph({.upload = upload});
    graph.capture([&](tp::StreamRef s) { f.issue(kernels, s); }, {.stream = f.stream});
    f.stream.synchronize();  // the upload (if any) is done before timing
    const auto start = bench::Clock::now();
    graph.replay(f.stream);
    f.stream.synchronize();
    f.last = bench::seconds_since(start);
  };
  bench::compare(state, {{"no_upload", [&] { first_launch(false); }}, {"upload", [&] { first_launch(true); }}},
                 [&](const bench::Variant& v) {
                   v.run();
                   return f.last;
                 });
}

void register_all() {
  for (int i = 0; i < 3; ++i) {
    const int iterations = i == 2 ? 20 : 100;
    benchmark::RegisterBenchmark("update", update)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(iterations);
    benchmark::RegisterBenchmark("replay_after_update", replay_after_update)
        ->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(i == 2 ? 10 : 50);
    benchmark::RegisterBenchmark("first_replay", first_replay)->Arg(i)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(iterations);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  const char* title = "bench/update (medians of paired measurements; ratios against raw CUDA in this run)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    bench::for_each_size(r, sizes, [&](const std::string& kernels, const auto& us, int size) {
      const double ours = us("update", "update");
      const double raw = us("update", "raw");
      const double again = us("update", "reset_capture");
      const double capture = us("update", "raw_capture_only");
      const double patch = us("update", "raw_update_only");
      rows.push_back({kernels + ": update()", ours, "us", ""});
      rows.push_back({kernels + ": raw capture + cudaGraphExecUpdate", raw, "us", ""});
      rows.push_back({kernels + ":   of which capture / update", capture, "us", "/ " + std::to_string(patch) + " us"});
      rows.push_back({kernels + ":   library bookkeeping (update() - raw)", ours - raw, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": update() / raw", ours, raw, 1.05));
      rows.push_back({kernels + ": update() of an executable never launched nor uploaded",
                      us("update", "update_never_launched"), "us", ""});
      rows.push_back({kernels + ": reset() + capture()", again, "us", ""});
      rows.push_back({kernels + ": update() / (reset() + capture())", ours / again, "x",
                      size == 1000 ? bench::verdict(ours / again, 0.45) : ""});
      // Raw CUDA's own figure for the same comparison: what no library on top of it can beat.
      rows.push_back({kernels + ":   raw floor: raw / (reset() + capture())", raw / again, "x", ""});
      rows.push_back(bench::ratio_row(kernels + ": replay after update / before", us("replay_after_update", "after"),
                                      us("replay_after_update", "before"), 1.02));
      rows.push_back({kernels + ":   raw CUDA's: replay after cudaGraphExecUpdate / before",
                      us("replay_after_update", "raw_after") / us("replay_after_update", "raw_before"), "x", ""});
      rows.push_back(bench::ratio_row(kernels + ": replay after update / raw after update", us("replay_after_update", "after"),
                                      us("replay_after_update", "raw_after"), 1.05));
      rows.push_back({kernels + ": first replay (launch + sync), no upload", us("first_replay", "no_upload"), "us", ""});
      rows.push_back({kernels + ": first replay (launch + sync), upload", us("first_replay", "upload"), "us", ""});
    });
  });
}
