// bench/nccl: one training-like step, 16 all-reduces interleaved with 16 tiny kernels, on N GPUs
// (2 by default) from one thread: eager NCCL against the step captured into a DeviceGroupGraph,
// and against raw CUDA graphs of the same capture. Host submit time and launch to completion, at
// 4 KiB, 64 KiB and 4 MiB per all-reduce.
//
// NCCL's graph mixing support costs host time at every launch of a graph holding NCCL work
// (gpu.md: ~17 us per device, ~3 us with NCCL_GRAPH_MIXING_SUPPORT=0). NCCL reads the setting
// once per process, so this binary measures the setting it was started with, then runs itself
// again with the other one and prints both in its last table.
//
//   nccl_bench [--gpus=N|all] [--graph-mixing=0|1] [Google Benchmark flags]
//     --gpus=N        the first N GPUs (default 2); --gpus=all: every visible GPU
//     --graph-mixing  set NCCL_GRAPH_MIXING_SUPPORT before NCCL starts; measure only that setting
//     --results=PATH  (used for the second run) write the medians to PATH
#include "bench_util.hpp"

#include <tensorplay/graph.hpp>
#include <tensorplay/nccl.hpp>

#include <benchmark/benchmark.h>
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace nccl = tensorplay::nccl;

namespace {

constexpr int collectives = 16;                                   // all-reduces (and tiny kernels) per step
constexpr std::size_t message_bytes[] = {4 << 10, 64 << 10, 4 << 20};
constexpr int tiny_threads = 32;

// Reads the previous all-reduce's output, writes the next one's input: the kernels and the
// collectives form one chain, as in a model whose layers depend on each other.
__global__ void tiny(const float* previous, float* next) { next[threadIdx.x] = previous[threadIdx.x] * 0.5f; }

void nccl_check(ncclResult_t status, const char* what) { bench::check_status(status, ncclSuccess, what, ncclGetErrorString); }

struct Options {
  int gpus = 2;                 // 0: every visible GPU
  std::optional<int> mixing;    // --graph-mixing
  std::string results;          // --results
  std::vector<std::string> rest;  // Google Benchmark's flags, passed on to the second run
};

Options& options() {
  static Options o;
  return o;
}

std::string size_name(std::size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

struct Fixture {
  std::vector<int> devices;
  std::vector<tp::Stream> streams;
  std::vector<tp::StreamRef> refs;
  std::vector<std::shared_ptr<nccl::Communicator>> comms;
  // By message size, then by device: the step's 2 x collectives buffers (input k, output k).
  std::vector<std::vector<tp::DeviceTensor<float>>> buffers;
  std::vector<tp::DeviceGroupGraph> groups;                // by message size
  std::vector<std::vector<cudaGraphExec_t>> raw;           // by message size, then by device

  explicit Fixture(int count) {
    for (int d = 0; d < count; ++d) {
      devices.push_back(d);
      streams.emplace_back(d);
      refs.push_back(streams.back());
    }
    comms = nccl::init_clique(devices);
    for (std::size_t bytes : message_bytes) {
      auto& per_device = buffers.emplace_back();
      for (std::size_t d = 0; d < devices.size(); ++d) {
        per_device.emplace_back(2 * collectives * bytes / sizeof(float), refs[d]);
        tp::StreamGuard guard(refs[d]);
        BENCH_CUDA(cudaMemsetAsync(per_device.back().data(), 0, per_device.back().bytes(), refs[d]));
      }
    }
    groups.reserve(buffers.size());
    for (std::size_t size = 0; size < buffers.size(); ++size) {
      for (int warm = 0; warm < 3; ++warm) step(size, refs);  // NCCL connects at first use
      synchronize();
      tp::DeviceGroupGraph& group = groups.emplace_back(devices);
      nccl::capture(group, comms, [&](std::span<const tp::StreamRef> s) { step(size, s); });
      raw.push_back(raw_capture(size));
    }
  }

  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  //! Graphs first, then the communicators (tensorplay::nccl's rule).
  ~Fixture() {
    synchronize();
    for (auto& per_device : raw)
      for (cudaGraphExec_t exec : per_device) (void)cudaGraphExecDestroy(exec);
    groups.clear();
    if (!nccl::wait_until_released(comms, std::chrono::seconds(30))) std::fprintf(stderr, "a graph still holds a communicator\n");
  }

  //! The step on `s` (s[d] on devices[d]): tiny kernel on every GPU, then one grouped all-reduce,
  //! 16 times.
  void step(std::size_t size, std::span<const tp::StreamRef> s) {
    const std::size_t count = message_bytes[size] / sizeof(float);
    for (int k = 0; k < collectives; ++k) {
      const int previous = (k + collectives - 1) % collectives;
      for (std::size_t d = 0; d < devices.size(); ++d) {
        float* base = buffers[size][d].data();
        BENCH_CUDA(cudaSetDevice(devices[d]));
        tiny<<<1, tiny_threads, 0, s[d]>>>(base + (2 * previous + 1) * count, base + 2 * k * count);
      }
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (std::size_t d = 0; d < devices.size(); ++d) {
        float* base = buffers[size][d].data();
        nccl_check(ncclAllReduce(base + 2 * k * count, base + (2 * k + 1) * count, count, ncclFloat, ncclSum,
                                 comms[d]->get(), s[d]),
                   "ncclAllReduce");
      }
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    }
    BENCH_CUDA(cudaSetDevice(devices[0]));
  }

  //! The same step captured with raw CUDA: every capture begins, then the step, then every
  //! capture ends, then each graph is instantiated.
  std::vector<cudaGraphExec_t> raw_capture(std::size_t size) {
    std::vector<cudaGraph_t> graphs(devices.size());
    std::vector<cudaGraphExec_t> execs(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d)
      BENCH_CUDA(cudaStreamBeginCapture(refs[d], cudaStreamCaptureModeThreadLocal));
    step(size, refs);
    for (std::size_t d = 0; d < devices.size(); ++d) BENCH_CUDA(cudaStreamEndCapture(refs[d], &graphs[d]));
    for (std::size_t d = 0; d < devices.size(); ++d) {
      BENCH_CUDA(cudaSetDevice(devices[d]));
      BENCH_CUDA(cudaGraphInstantiate(&execs[d], graphs[d], 0));
      BENCH_CUDA(cudaGraphDestroy(graphs[d]));
    }
    BENCH_CUDA(cudaSetDevice(devices[0]));
    return execs;
  }

  void synchronize() {
    for (tp::StreamRef s : refs) BENCH_CUDA(cudaStreamSynchronize(s));
  }

  std::vector<bench::Variant> variants(std::size_t size) {
    return {{"eager", [this, size] { step(size, refs); }},
            {"graph", [this, size] { groups[size].replay(refs); }},
            {"raw", [this, size] {  // each launch with its device current, as DeviceGroupGraph does
               for (std::size_t d = 0; d < devices.size(); ++d) {
                 BENCH_CUDA(cudaSetDevice(devices[d]));
                 BENCH_CUDA(cudaGraphLaunch(raw[size][d], refs[d]));
               }
               BENCH_CUDA(cudaSetDevice(devices[0]));
             }}};
  }
};

std::unique_ptr<Fixture>& fixture_slot() {
  static std::unique_ptr<Fixture> slot;
  return slot;
}

Fixture& fixture() {
  if (!fixture_slot()) {
    int visible = 0;
    BENCH_CUDA(cudaGetDeviceCount(&visible));
    fixture_slot() = std::make_unique<Fixture>(options().gpus == 0 ? visible : options().gpus);
  }
  return *fixture_slot();
}

// Host time to issue one step; the devices finish (untimed) before the next measurement.
void submit(benchmark::State& state) {
  auto& f = fixture();
  bench::compare(state, f.variants(static_cast<std::size_t>(state.range(0))), [&](const bench::Variant& v) {
    const auto start = bench::Clock::now();
    v.run();
    const double seconds = bench::seconds_since(start);
    f.synchronize();
    return seconds;
  });
}

// Issue one step and wait for every GPU to finish it.
void complete(benchmark::State& state) {
  auto& f = fixture();
  bench::compare(state, f.variants(static_cast<std::size_t>(state.range(0))), [&](const bench::Variant& v) {
    const auto start = bench::Clock::now();
    v.run();
    f.synchronize();
    return bench::seconds_since(start);
  });
}

// ---- the second run (the other NCCL_GRAPH_MIXING_SUPPORT) and the table ---------------------

std::string quoted(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

//! Runs this binary with --graph-mixing=`mixing`; returns its medians (empty if it failed).
std::map<std::string, double> run_other_setting(int mixing) {
  const auto results = std::filesystem::temp_directory_path() / ("tensorplay_nccl_bench_" + std::to_string(::getpid()));
  std::string command = quoted(std::filesystem::read_symlink("/proc/self/exe").string());
  command += " --graph-mixing=" + std::to_string(mixing) + " --results=" + quoted(results.string());
  command += " --gpus=" + (options().gpus == 0 ? std::string("all") : std::to_string(options().gpus));
  for (const std::string& arg : options().rest) command += " " + quoted(arg);
  std::printf("\n== second run, NCCL_GRAPH_MIXING_SUPPORT=%d: %s\n", mixing, command.c_str());
  std::fflush(stdout);
  const int status = std::system(command.c_str());
  std::map<std::string, double> medians;
  std::ifstream in(results);
  std::string key;
  double value = 0;
  while (in >> key >> value) medians[key] = value;
  std::filesystem::remove(results);
  if (status != 0) std::printf("second run failed (status %d)\n", status);
  return medians;
}

void add_rows(std::vector<bench::Row>& rows, const std::string& setting, std::map<std::string, double>& m, int gpus) {
  for (std::size_t i = 0; i < std::size(message_bytes); ++i) {
    const std::string arg = "/" + std::to_string(i);
    const std::string what = setting + ", " + size_name(message_bytes[i]) + ": ";
    const double eager = m["complete" + arg + ":eager_us"];
    const double graph = m["complete" + arg + ":graph_us"];
    const double raw = m["complete" + arg + ":raw_us"];
    if (eager == 0 || graph == 0 || raw == 0) {
      rows.push_back({what + "no measurement", 0, "", ""});
      continue;
    }
    const bool small = message_bytes[i] <= (64 << 10);
    rows.push_back({what + "eager, launch to completion", eager, "us", ""});
    rows.push_back({what + "DeviceGroupGraph, launch to completion", graph, "us", ""});
    rows.push_back({what + "eager / DeviceGroupGraph", eager / graph, "x", small ? bench::verdict(eager / graph, 3.0, false) : ""});
    rows.push_back(bench::ratio_row(what + "DeviceGroupGraph / raw cudaGraphLaunch", graph, raw, 1.05));
    rows.push_back({what + "eager, host submit", m["submit" + arg + ":eager_us"], "us", ""});
    rows.push_back({what + "DeviceGroupGraph, host submit per GPU", m["submit" + arg + ":graph_us"] / gpus, "us", ""});
  }
}

void register_all() {
  for (std::size_t i = 0; i < std::size(message_bytes); ++i) {
    const auto arg = static_cast<std::int64_t>(i);
    benchmark::RegisterBenchmark("submit", submit)->Arg(arg)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
    benchmark::RegisterBenchmark("complete", complete)->Arg(arg)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(50);
  }
}

//! Takes this binary's own flags out of argv; the rest go to Google Benchmark.
std::vector<char*> parse(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--gpus=")) {
      options().gpus = arg == "--gpus=all" ? 0 : std::atoi(arg.c_str() + 7);
    } else if (arg.starts_with("--graph-mixing=")) {
      options().mixing = std::atoi(arg.c_str() + 15);
    } else if (arg.starts_with("--results=")) {
      options().results = arg.substr(10);
    } else {
      rest.push_back(argv[i]);
      // The second run must not overwrite this run's JSON output.
      if (!arg.starts_with("--benchmark_out")) options().rest.push_back(arg);
    }
  }
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = parse(argc, argv);
  // Both before NCCL starts (the first communicator): NCCL reads them once per process.
  if (options().mixing) ::setenv("NCCL_GRAPH_MIXING_SUPPORT", std::to_string(*options().mixing).c_str(), 1);
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast on the GPU machine (gpu.md)

  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  const int needed = options().gpus == 0 ? 2 : options().gpus;
  if (visible > 0 && (visible < needed || needed < 2)) {
    std::printf("needs %d GPUs (at least 2), found %d: skipped\n", needed < 2 ? 2 : needed, visible);
    return 0;
  }
  const int gpus = options().gpus == 0 ? visible : options().gpus;

  register_all();
  return bench::run_main(static_cast<int>(args.size()), args.data(), [&](bench::MedianReporter& r) {
    fixture_slot().reset();  // graphs, then communicators, before the process ends
    const bool mixing = nccl::graph_mixing_support();
    if (!options().results.empty()) {  // the second run: hand the medians to the first
      std::ofstream out(options().results);
      for (const auto& [key, value] : r.counters) out << key << ' ' << value << '\n';
    }
    std::vector<bench::Row> rows;
    add_rows(rows, mixing ? "mixing on" : "mixing off", r.counters, gpus);
    if (!options().mixing) {
      std::map<std::string, double> other = run_other_setting(mixing ? 0 : 1);
      add_rows(rows, mixing ? "mixing off" : "mixing on", other, gpus);
    }
    const std::string title = "bench/nccl: 16 all-reduces + 16 tiny kernels per step, " + std::to_string(gpus) +
                              " GPUs, one thread (medians; ratios within one run; mixing = NCCL_GRAPH_MIXING_SUPPORT)";
    bench::print_table(title.c_str(), rows);
  });
}
