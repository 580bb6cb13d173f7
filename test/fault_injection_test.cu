// Failure injection: the library's Nth CUDA call of one kind fails (detail/fault_injection.hpp,
// compiled in for this binary only), for every N a representative workload reaches. After each
// failure: the exception is a cuda_error naming that call (or the library absorbed the failure and
// the results are right), no stream is capturing, device memory is back where it was, and the
// same objects work again.
#define TENSORPLAY_FAULT_INJECTION 1
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace fault = tp::detail::fault;

namespace {

constexpr std::size_t n = 1 << 16;

__global__ void scale_into(const int* in, int* out, std::size_t count, int a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i];
}
__global__ void count_down(int* counter, bool* more, int* out) {
  *out += 1;
  *counter -= 1;
  *more = *counter > 0;
}

struct Outcome {
  int staged = 0;  // y[0] after stage_and_launch
  int updated = 0; // y[0] after update + replay
  int loops = 0;   // while_ iterations of the last replay
};

// Captures (allocations, if_, while_), replays, stages, updates, replays: every kind of call.
Outcome workload(tp::Stream& stream) {
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> fresh(n, stream);
  tp::DeviceTensor<int> y;
  tp::DeviceTensor<bool> yes(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<int> loops(1, stream);
  tp_test::fill(x.data(), n, 1, stream);
  tp_test::fill(fresh.data(), n, 3, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(yes.data(), 1, 1, stream), cudaSuccess);
  tp::Graph graph;
  auto body = [&](int a) {
    return [&, a](tp::StreamRef s) {
      tp::DeviceTensor<int> temp(n, s);
      scale_into<<<64, 256, 0, s>>>(x.data(), temp.data(), n, a);
      if (y.size() == 0) y = tp::DeviceTensor<int>(n, s);
      graph.if_(yes, [&](tp::StreamRef b) { scale_into<<<64, 256, 0, b>>>(temp.data(), y.data(), n, 1); });
      tp_test::fill(counter.data(), 1, 3, s);
      tp_test::fill(loops.data(), 1, 0, s);
      BOOST_REQUIRE_EQUAL(cudaMemsetAsync(more.data(), 1, 1, s), cudaSuccess);
      graph.while_(more, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(counter.data(), more.data(), loops.data()); });
    };
  };
  graph.capture(body(2), {.stream = stream});
  graph.replay(stream);
  graph.stage_and_launch(std::tie(x), std::tie(fresh), stream);
  Outcome out;
  out.staged = tp_test::host_copy(y.data(), 1, stream)[0];
  (void)graph.update(body(5), {.stream = stream});
  graph.replay(stream);
  out.updated = tp_test::host_copy(y.data(), 1, stream)[0];
  out.loops = tp_test::host_copy(loops.data(), 1, stream)[0];
  return out;
}

const char* call_of(fault::Site site) {
  switch (site) {
    case fault::Site::Allocate: return "cudaMalloc";
    case fault::Site::BeginCapture: return "cudaStreamBeginCapture";
    case fault::Site::EndCapture: return "cudaStreamEndCapture";
    case fault::Site::Instantiate: return "cudaGraphInstantiateWithParams";
    case fault::Site::Launch: return "Launch";  // cudaGraphLaunch or cudaLaunchKernelEx
    case fault::Site::SetParams: return "stage_and_launch";  // its fetch and copy nodes
    case fault::Site::EventRecord: return "cudaEventRecord";
    case fault::Site::Update: return "cudaGraphExecUpdate";
    case fault::Site::Count: break;
  }
  return "?";
}

const char* name_of(fault::Site site) {
  constexpr const char* names[] = {"allocate", "begin capture", "end capture", "instantiate",
                                   "launch", "set params", "event record", "update"};
  return names[static_cast<int>(site)];
}

std::size_t used_device_bytes() {
  tp::Pool::release_unused_default_memory();
  return tp_test::device_bytes_in_use();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fault_injection)

BOOST_AUTO_TEST_CASE(injection_is_off_unless_armed_and_counts_nothing_it_skips) {
  fault::disarm();
  fault::reset_counts();
  BOOST_TEST(!fault::take(fault::Site::Launch));
  BOOST_TEST(fault::calls(fault::Site::Launch) == 1);
  fault::arm(fault::Site::Launch, 2);
  BOOST_TEST(!fault::take(fault::Site::Launch));
  BOOST_TEST(fault::take(fault::Site::Launch));
  BOOST_TEST(fault::fired());
  BOOST_TEST(!fault::take(fault::Site::Launch));  // once only
  fault::disarm();
}

TP_GPU_TEST(every_failing_call_of_the_workload_leaves_the_library_usable) {
  tp::Stream stream;
  const Outcome want = workload(stream);  // also loads the kernel library, warms the pools
  BOOST_REQUIRE(want.staged == 6 && want.updated == 15 && want.loops == 3);
  const std::size_t baseline = used_device_bytes();
  int walked = 0;
  int thrown = 0;
  int absorbed = 0;
  for (int s = 0; s < static_cast<int>(fault::Site::Count); ++s) {
    const auto site = static_cast<fault::Site>(s);
    fault::disarm();
    fault::reset_counts();
    (void)workload(stream);
    const long reached = fault::calls(site);
    std::printf("site %-14s %3ld call(s) in the workload\n", name_of(site), reached);
    for (long nth = 1; nth <= reached; ++nth) {
      ++walked;
      fault::arm(site, nth);
      std::optional<Outcome> got;
      try {
        got = workload(stream);
      } catch (const tp::cuda_error& e) {
        ++thrown;
        BOOST_TEST(fault::fired(), name_of(site) << " #" << nth << ": " << e.what());
        BOOST_TEST(e.status() == fault::injected_status(site), name_of(site) << " #" << nth << ": " << e.what());
        BOOST_TEST(std::string(e.what()).find(call_of(site)) != std::string::npos,
                   name_of(site) << " #" << nth << " names another call: " << e.what());
      } catch (const std::exception& e) {
        BOOST_ERROR(name_of(site) << " #" << nth << ": not a cuda_error: " << e.what());
      }
      fault::disarm();
      if (got) {
        ++absorbed;  // the library absorbed the failure: the results must be right anyway
        BOOST_TEST((got->staged == want.staged && got->updated == want.updated && got->loops == want.loops),
                   name_of(site) << " #" << nth << " absorbed, but the results differ");
      }
      BOOST_TEST(tp_test::not_capturing(stream), name_of(site) << " #" << nth << ": the stream is left capturing");
      BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(stream), cudaSuccess);
      // Device-wide figures: under compute-sanitizer the tool's own device memory moves them too.
      if (std::getenv("TENSORPLAY_UNDER_SANITIZER") == nullptr)
        BOOST_TEST(used_device_bytes() <= baseline + (std::size_t{4} << 20), name_of(site) << " #" << nth << ": device memory grew");
      // The same stream, a new graph: everything works again.
      const Outcome again = workload(stream);
      BOOST_TEST((again.staged == want.staged && again.updated == want.updated && again.loops == want.loops),
                 name_of(site) << " #" << nth << ": the next workload is wrong");
    }
  }
  std::printf("walked %d failure points: %d threw a cuda_error naming the call, %d were absorbed\n", walked, thrown, absorbed);
  BOOST_TEST(walked > 20);
  BOOST_TEST(thrown > 0);
}

BOOST_AUTO_TEST_SUITE_END()
