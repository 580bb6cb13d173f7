// bench/bench_util.hpp: what the benchmarks share: timing helpers, a reporter that keeps the
// median of every benchmark, and the ratio table each binary prints last.
#pragma once

#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace bench {

//! Ends the benchmark (exit status 2) unless `status` is `ok`, naming the call and
//! `name_of(status)`: for CUDA (check below), cuBLAS and NCCL statuses alike.
template <class Status, class NameOf>
void check_status(Status status, Status ok, const char* what, NameOf&& name_of) {
  if (status != ok) {
    std::fprintf(stderr, "%s failed: %s\n", what, name_of(status));
    std::exit(2);
  }
}
inline void check(cudaError_t status, const char* what) { check_status(status, cudaSuccess, what, cudaGetErrorString); }
#define BENCH_CUDA(call) ::bench::check((call), #call)

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

//! Device time between two events around `work`, in seconds.
template <class F>
double device_seconds(cudaStream_t stream, F&& work) {
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  BENCH_CUDA(cudaEventCreate(&begin));
  BENCH_CUDA(cudaEventCreate(&end));
  BENCH_CUDA(cudaEventRecord(begin, stream));
  work();
  BENCH_CUDA(cudaEventRecord(end, stream));
  BENCH_CUDA(cudaEventSynchronize(end));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, begin, end));
  BENCH_CUDA(cudaEventDestroy(begin));
  BENCH_CUDA(cudaEventDestroy(end));
  return ms * 1e-3;
}

//! One way of doing the thing a benchmark compares (a launch, a capture, a copy...).
struct Variant {
  std::string name;
  std::function<void()> run;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

//! The order of the variants within each iteration of compare().
enum class Order {
  Rotate,   // shifted by one at every iteration: each variant always follows the same one
  Shuffle,  // a fresh random order at every iteration (fixed seed): each variant follows every
            // other one alike; for variants that leave the driver work that slows the next one
};

//! Measures every variant in every iteration, in an order that changes from one iteration to
//! the next (Order), so that drift (clocks, caches, the machine's other load) hits all of them
//! alike. `measure(variant)` returns seconds. Each variant's median goes into the counter
//! "<name>_us"; the benchmark's own (manual) time is that of the first variant.
template <class Measure>
void compare(benchmark::State& state, const std::vector<Variant>& variants, Measure&& measure, Order order = Order::Rotate) {
  std::vector<std::vector<double>> seconds(variants.size());
  std::size_t rotation = 0;
  std::vector<std::size_t> sequence(variants.size());
  std::mt19937 rng(20261130);
  for (auto _ : state) {
    double first = 0;
    for (std::size_t k = 0; k < variants.size(); ++k) sequence[k] = (k + rotation) % variants.size();
    if (order == Order::Shuffle) std::shuffle(sequence.begin(), sequence.end(), rng);
    for (std::size_t k = 0; k < variants.size(); ++k) {
      const std::size_t v = sequence[k];
      const double s = measure(variants[v]);
      seconds[v].push_back(s);
      if (v == 0) first = s;
    }
    ++rotation;
    state.SetIterationTime(first);
  }
  for (std::size_t v = 0; v < variants.size(); ++v) state.counters[variants[v].name + "_us"] = median(seconds[v]) * 1e6;
}

//! compare() over host submit cost: each variant issues `batch` calls, timed on the host;
//! the device catches up (untimed) before the next variant.
inline void compare_submit(benchmark::State& state, int batch, const std::vector<Variant>& variants) {
  compare(state, variants, [batch](const Variant& v) {
    const auto start = Clock::now();
    for (int i = 0; i < batch; ++i) v.run();
    const double elapsed = seconds_since(start);
    BENCH_CUDA(cudaDeviceSynchronize());
    return elapsed / batch;
  });
}

//! compare() of capture + instantiate: raw stream capture of `issue(stream)` ("raw") against
//! Graph::capture of the same work on the same stream ("ours"). Destruction is not timed.
template <class Graph, class Stream, class Issue>
void compare_capture(benchmark::State& state, Stream& stream, Issue&& issue) {
  double last = 0;  // seconds of the last timed capture
  compare(state,
          {{"raw",
            [&] {
              cudaGraph_t graph = nullptr;
              cudaGraphExec_t exec = nullptr;
              const auto start = Clock::now();
              BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
              issue(stream);
              BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
              BENCH_CUDA(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
              last = seconds_since(start);
              BENCH_CUDA(cudaGraphExecDestroy(exec));
              BENCH_CUDA(cudaGraphDestroy(graph));
            }},
           {"ours",
            [&] {
              Graph graph;
              const auto start = Clock::now();
              graph.capture([&](auto s) { issue(s); }, {.stream = stream});
              last = seconds_since(start);
            }}},
          [&](const Variant& v) {
            v.run();
            return last;
          });
}

//! Keeps the median (microseconds) of every benchmark and of its counters, by name without
//! Google Benchmark's "/iterations:N", "/repeats:N" and "/manual_time" parts.
class MedianReporter : public benchmark::ConsoleReporter {
 public:
  static std::string plain_name(std::string name) {
    for (const char* part : {"/iterations:", "/repeats:", "/manual_time", "/real_time"}) {
      for (auto at = name.find(part); at != std::string::npos; at = name.find(part)) {
        const auto end = name.find('/', at + 1);
        name.erase(at, end == std::string::npos ? std::string::npos : end - at);
      }
    }
    return name;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Aggregate || run.aggregate_name != "median") continue;
      const std::string name = plain_name(run.run_name.str());
      const double to_us = 1e6 / benchmark::GetTimeUnitMultiplier(run.time_unit);
      medians[name] = run.GetAdjustedRealTime() * to_us;
      for (const auto& [counter, value] : run.counters) counters[name + ":" + counter] = value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  //! The median of counter "<name>_us", `name` = "<benchmark>:<variant>" (0 if not measured).
  double us(const std::string& name) { return counters[name + "_us"]; }

  std::map<std::string, double> medians;
  std::map<std::string, double> counters;
};

struct Row {
  std::string what;
  double value;
  std::string unit;
  std::string note;
};

inline void print_table(const char* title, const std::vector<Row>& rows) {
  std::printf("\n== %s ==\n", title);
  for (const Row& r : rows) std::printf("  %-58s %12.3f %-6s %s\n", r.what.c_str(), r.value, r.unit.c_str(), r.note.c_str());
  std::fflush(stdout);
}

//! "1 kernel", "1000 kernels": how the tables name a graph of `kernels` kernels.
inline std::string kernels_label(int kernels) { return std::to_string(kernels) + " kernel" + (kernels == 1 ? "" : "s"); }

//! For every size of a benchmark registered once per index i of `sizes` (Arg(i)):
//! `rows_of(label, us, sizes[i])`, with label = kernels_label(sizes[i]) and us(benchmark, variant)
//! = the median of counter "<variant>_us" of "<benchmark>/<i>".
template <class RowsOf>
void for_each_size(MedianReporter& r, std::span<const int> sizes, RowsOf&& rows_of) {
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string arg = "/" + std::to_string(i);
    rows_of(
        kernels_label(sizes[i]),
        [&](const std::string& benchmark, const std::string& variant) { return r.us(benchmark + arg + ":" + variant); },
        sizes[i]);
  }
}

inline std::string verdict(double ratio, double limit, bool at_most = true) {
  const bool ok = at_most ? ratio <= limit : ratio >= limit;
  char text[64];
  std::snprintf(text, sizeof text, "(target %s %.2fx: %s)", at_most ? "<=" : ">=", limit, ok ? "met" : "MISSED");
  return text;
}

//! The row of the ratio `numerator / denominator` ("x") with its target (verdict).
inline Row ratio_row(std::string what, double numerator, double denominator, double limit, bool at_most = true) {
  const double ratio = numerator / denominator;
  return {std::move(what), ratio, "x", verdict(ratio, limit, at_most)};
}

//! Runs every registered benchmark (median of repetitions, interleaved at random to spread
//! drift evenly), then `summary` with the medians.
inline int run_main(int argc, char** argv, const std::function<void(MedianReporter&)>& summary) {
  std::vector<char*> args(argv, argv + argc);
  std::string repetitions = "--benchmark_repetitions=12";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  bool user_repetitions = false;
  for (int i = 1; i < argc; ++i) user_repetitions |= std::string(argv[i]).starts_with("--benchmark_repetitions");
  if (!user_repetitions) args.push_back(repetitions.data());
  args.push_back(interleave.data());
  args.push_back(aggregates.data());
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: nothing to measure\n");
    return 0;
  }
  MedianReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  summary(reporter);
  benchmark::Shutdown();
  return 0;
}

//! run_main whose summary is one table: `fill(reporter, rows)`, then the rows under `title`.
inline int run_table(int argc, char** argv, const std::string& title,
                     const std::function<void(MedianReporter&, std::vector<Row>&)>& fill) {
  return run_main(argc, argv, [&](MedianReporter& r) {
    std::vector<Row> rows;
    fill(r, rows);
    print_table(title.c_str(), rows);
  });
}

}  // namespace bench
