// bench/doctor_bench: what the capture doctor costs on capture + instantiate (1 and 1000 kernels),
// Graph::capture against raw stream capture, in the mode TENSORPLAY_CAPTURE_DOCTOR sets for the
// process (log, the default; full: CUPTI too; off). CUPTI calls back on every API call of the
// process, raw ones included: its cost shows in the raw times of a "full" run against those of a
// default run, so run the binary once per mode and compare the absolute times as well.
#include "bench_util.hpp"

#include <tensorplay/detail/capture_doctor_cupti.hpp>
#include <tensorplay/detail/capture_doctor_log.hpp>
#include <tensorplay/detail/capture_doctor_watch.hpp>
#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void add_one(float* x) { *x += 1.0f; }

struct Fixture {
  tp::Stream stream;
  tp::DeviceTensor<float> scalar{1, stream};
  std::vector<int> sizes{1, 1000};

  Fixture() {
    BENCH_CUDA(cudaMemsetAsync(scalar.data(), 0, sizeof(float), stream));
    tp::Graph warm;  // the first capture starts the doctor (and CUPTI in "full"): not timed
    warm.capture([&](tp::StreamRef s) { issue(1, s); }, {.stream = stream});
  }

  void issue(int kernels, cudaStream_t s) {
    for (int k = 0; k < kernels; ++k) add_one<<<1, 1, 0, s>>>(scalar.data());
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Capture + instantiate, raw stream capture against Graph::capture. Destruction is not timed.
void capture(benchmark::State& state) {
  auto& f = fixture();
  const int kernels = f.sizes[state.range(0)];
  bench::compare_capture<tp::Graph>(state, f.stream, [&](cudaStream_t s) { f.issue(kernels, s); });
}

const char* mode_name() {
  switch (tp::detail::CaptureDoctorWatch::instance().mode()) {
    case tp::detail::DoctorMode::Off: return "off";
    case tp::detail::DoctorMode::Full: return "full";
    default: return "log";
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("capture", capture)->Arg(0)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(200);
  benchmark::RegisterBenchmark("capture", capture)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(12);
  return bench::run_main(argc, argv, [](bench::MedianReporter& r) {
    std::vector<bench::Row> rows;
    bench::for_each_size(r, fixture().sizes, [&](const std::string& kernels, const auto& us, int) {
      const double raw = us("capture", "raw");
      const double ours = us("capture", "ours");
      rows.push_back({kernels + ": raw capture + instantiate", raw, "us", ""});
      rows.push_back({kernels + ": Graph::capture (+ instantiate)", ours, "us", ""});
      rows.push_back(bench::ratio_row(kernels + ": ours / raw", ours, raw, 1.05));
    });
    const std::string title = std::string("bench/doctor, TENSORPLAY_CAPTURE_DOCTOR=") + mode_name() +
                              " (driver log " + (tp::detail::DriverLogListener::instance().listening() ? "on" : "off") +
                              ", CUPTI " + (tp::detail::CuptiWatch::instance().active() ? "on" : "off") +
                              "; medians of paired measurements)";
    bench::print_table(title.c_str(), rows);
  });
}
