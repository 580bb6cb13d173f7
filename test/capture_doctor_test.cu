// test/capture_doctor_test.cu: tensorplay/detail/capture_doctor.hpp: when a capture breaks,
// capture_error names the call that broke it, the thread it came from, what the driver said,
// where the capture and its innermost body began, and the other capture that took part. Each
// case also checks the promise of every error: nothing left capturing, the library usable,
// nothing leaked (each case runs a few times: memory must not grow).
//
// The cases named full_* need TENSORPLAY_CAPTURE_DOCTOR=full (CUPTI watching: a separate run of
// this binary, since CUPTI stays subscribed for the life of the process).
#include "support.hpp"

#include <tensorplay/detail/capture_doctor.hpp>
#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cublas_v2.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void touch(int* p) {
  if (p != nullptr) *p += 1;
}

bool doctor_is_full() {
  const char* mode = std::getenv("TENSORPLAY_CAPTURE_DOCTOR");
  return mode != nullptr && (std::string(mode) == "full" || std::string(mode) == "cupti");
}

//! A GPU whose driver reports its errors through the log (CUDA 12.9+), the doctor in its default mode.
struct DriverLogs {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(false);
    if (tp_test::gpu_count() == 0) {
      result.message() << "needs a GPU";
      return result;
    }
    if (doctor_is_full()) {
      result.message() << "the default mode's cases; this run watches with CUPTI";
      return result;
    }
    tp::detail::DriverLogListener::instance().start();
    result = boost::test_tools::assertion_result(tp::detail::DriverLogListener::instance().listening());
    if (!result) result.message() << "the driver does not report errors through its log (CUDA 12.9+ driver needed)";
    return result;
  }
};

struct CuptiWatching {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(tp_test::gpu_count() > 0 && doctor_is_full());
    if (!result) result.message() << "needs a GPU and TENSORPLAY_CAPTURE_DOCTOR=full";
    return result;
  }
};

#define DOCTOR_TEST(name) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(DriverLogs{}))
#define FULL_DOCTOR_TEST(name) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(CuptiWatching{}))

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

//! "<this file>:<line>", as a message names a line of this file.
std::string here(int line) { return std::string(__FILE__) + ":" + std::to_string(line); }

using tp_test::expect_capture_error;

//! Captures on `stream` a body that calls cudaMalloc on another thread, which must break the
//! capture; frees what that cudaMalloc got and returns the capture_error.
tp::capture_error expect_malloc_on_another_thread_to_break(tp::Graph& graph, tp::Stream& stream) {
  void* leaked = nullptr;
  const tp::capture_error e = expect_capture_error([&] {
    graph.capture(
        [&] {
          std::thread other([&] { (void)cudaMalloc(&leaked, 1 << 20); });
          other.join();
        },
        {.stream = stream});
  });
  if (leaked != nullptr) (void)cudaFree(leaked);
  return e;
}

//! Nothing captures, and a new capture on `stream` works.
void expect_usable(cudaStream_t stream) {
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(!tp::detail::CaptureRegistry::instance().any_open());
  tp::DeviceTensor<int> out(4, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::fill(out.data(), 4, 7, s); }, {.stream = stream});
  graph.replay(stream);
  const std::vector<int> host = tp_test::host_copy(out.data(), 4, stream);
  for (int v : host) BOOST_TEST(v == 7);
}

//! Runs `one_case` (which checks one broken capture) `runs` times; device memory and the resident
//! set must not grow after the first run by more than a few pages.
template <class F>
void without_leaks(F&& one_case, int runs = 6) {
  one_case();
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  const std::size_t device = tp_test::device_bytes_in_use();
  const std::size_t resident = tp_test::resident_bytes();
  for (int i = 1; i < runs; ++i) one_case();
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  if (tp_test::gpu_to_itself()) BOOST_TEST(tp_test::device_bytes_in_use() <= device + (std::size_t{4} << 20));
  BOOST_TEST(tp_test::resident_bytes() <= resident + (std::size_t{16} << 20));
}

tp::DeviceTensor<bool> true_predicate(cudaStream_t stream) {
  tp::DeviceTensor<bool> pred(1, stream);
  const bool yes = true;
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(pred.data(), &yes, 1, cudaMemcpyHostToDevice, stream), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(stream), cudaSuccess);
  return pred;
}

//! A blocking stream (cudaStreamCreate): one the legacy default stream synchronises with.
struct BlockingStream {
  cudaStream_t get = nullptr;
  BlockingStream() { BOOST_REQUIRE_EQUAL(cudaStreamCreate(&get), cudaSuccess); }
  ~BlockingStream() { (void)cudaStreamDestroy(get); }
  BlockingStream(const BlockingStream&) = delete;
  BlockingStream& operator=(const BlockingStream&) = delete;
};

struct Event {
  cudaEvent_t get = nullptr;
  Event() { BOOST_REQUIRE_EQUAL(cudaEventCreateWithFlags(&get, cudaEventDisableTiming), cudaSuccess); }
  ~Event() { (void)cudaEventDestroy(get); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// A synchronisation two conditional bodies deep: the inner body's end notices. (Calls whose line
// a message must name are written on one line: a default source_location argument of a call
// that spans lines may name any of them.)
void check_sync_two_bodies_deep(bool device_wide) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred = true_predicate(stream);
  tp::Graph graph;
  auto innermost = [&](tp::StreamRef body) {
    if (device_wide)
      (void)cudaDeviceSynchronize();
    else
      (void)cudaStreamSynchronize(body);
    (void)cudaGetLastError();
  };
  const int begin_line = __LINE__ + 1;
  graph.capture_begin({.stream = stream});
  int inner_line = 0;
  const tp::capture_error e = expect_capture_error([&] {
    graph.if_(pred, [&] {
      inner_line = __LINE__ + 1;
      graph.if_(pred, innermost);
    });
  });
  const std::string what = e.what();
  BOOST_TEST(e.culprit() == (device_wide ? "cudaDeviceSynchronize" : "cudaStreamSynchronize"));
  BOOST_TEST(!e.from_other_thread());
  BOOST_TEST(e.status() == cudaErrorStreamCaptureInvalidated);
  BOOST_TEST(contains(e.driver_message(), device_wide ? "cuCtxSynchronize" : "cuStreamSynchronize"), e.driver_message());
  BOOST_TEST(contains(what, "cudaStreamEndCapture (conditional body) failed"), what);
  BOOST_TEST(contains(what, std::string("broken by ") + e.culprit() + " on the capturing thread"), what);
  BOOST_TEST(contains(what, "capture begun at " + here(begin_line)), what);
  // The body began on the line whose call noticed: the message ends with it, and says it once.
  BOOST_TEST(contains(what, "innermost open body (depth 2) at " + here(inner_line)), what);
  BOOST_TEST(what.ends_with(" at " + here(inner_line)), what);
  BOOST_TEST(!graph.is_capturing());
  expect_usable(stream);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(capture_doctor)

DOCTOR_TEST(stream_synchronize_two_bodies_deep_is_named_with_the_inner_body) {
  without_leaks([] { check_sync_two_bodies_deep(false); });
}

DOCTOR_TEST(device_synchronize_two_bodies_deep_is_named_with_the_inner_body) {
  without_leaks([] { check_sync_two_bodies_deep(true); });
}

DOCTOR_TEST(cuda_malloc_on_another_thread_during_a_global_capture_is_named_as_from_another_thread) {
  without_leaks([] {
    tp::Stream stream;
    tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::Global});
    const tp::capture_error e = expect_malloc_on_another_thread_to_break(graph, stream);
    BOOST_TEST(e.culprit() == "cudaMalloc");
    BOOST_TEST(e.from_other_thread());
    BOOST_TEST(contains(e.driver_message(), "initiated from another thread"), e.driver_message());
    BOOST_TEST(contains(e.driver_message(), "cuMemAlloc"), e.driver_message());
    BOOST_TEST(contains(e.what(), "broken by cudaMalloc on another thread"), e.what());
    BOOST_TEST(!contains(e.what(), "capture begun at"), e.what());  // begun on the line that ends the message
    expect_usable(stream);
  });
}

DOCTOR_TEST(legacy_stream_work_while_a_blocking_stream_captures_is_named) {
  without_leaks([] {
    BlockingStream stream;
    const tp::capture_error e = expect_capture_error([&] {
      tp::Graph graph;
      graph.capture(
          [&] {
            touch<<<1, 1, 0, cudaStreamLegacy>>>(nullptr);  // the legacy default stream
            (void)cudaGetLastError();
          },
          {.stream = stream.get});
    });
    BOOST_TEST(e.culprit() == "cudaLaunchKernel");
    BOOST_TEST(!e.from_other_thread());
    BOOST_TEST(contains(e.driver_message(), "CU_STREAM_LEGACY"), e.driver_message());
    BOOST_TEST(contains(e.what(), "broken by cudaLaunchKernel on the capturing thread"), e.what());
    expect_usable(stream.get);
  });
}

DOCTOR_TEST(pageable_cuda_memcpy_while_a_blocking_stream_captures_is_named) {
  without_leaks([] {
    BlockingStream stream;
    tp::DeviceTensor<float> device(1024, stream.get);
    std::vector<float> pageable(1024, 1.0f);
    const tp::capture_error e = expect_capture_error([&] {
      tp::Graph graph;
      graph.capture(
          [&] {
            (void)cudaMemcpy(device.data(), pageable.data(), device.bytes(), cudaMemcpyHostToDevice);
            (void)cudaGetLastError();
          },
          {.stream = stream.get});
    });
    BOOST_TEST(e.culprit().starts_with("cudaMemcpy"), e.culprit());
    BOOST_TEST(!e.from_other_thread());
    BOOST_TEST(contains(e.driver_message(), "cuMemcpy"), e.driver_message());
    expect_usable(stream.get);
  });
}

DOCTOR_TEST(event_query_and_synchronize_of_a_captured_event_are_named) {
  for (const bool synchronize : {false, true}) {
    without_leaks([synchronize] {
      tp::Stream stream;
      Event event;
      const tp::capture_error e = expect_capture_error([&] {
        tp::Graph graph;
        graph.capture(
            [&](tp::StreamRef s) {
              BOOST_REQUIRE_EQUAL(cudaEventRecord(event.get, s), cudaSuccess);
              (void)(synchronize ? cudaEventSynchronize(event.get) : cudaEventQuery(event.get));
              (void)cudaGetLastError();
            },
            {.stream = stream});
      });
      BOOST_TEST(e.culprit() == (synchronize ? "cudaEventSynchronize" : "cudaEventQuery"));
      BOOST_TEST(!e.from_other_thread());
      BOOST_TEST(contains(e.driver_message(), "CUDA_ERROR_CAPTURED_EVENT"), e.driver_message());
      expect_usable(stream);
    });
  }
}

DOCTOR_TEST(cublas_create_inside_a_capture_is_named) {
  without_leaks(
      [] {
        tp::Stream stream;
        cublasHandle_t handle = nullptr;
        cublasStatus_t created = CUBLAS_STATUS_SUCCESS;
        cublasHandle_t warm = nullptr;  // cuBLAS initialises its library at the first handle: not here
        BOOST_REQUIRE_EQUAL(cublasCreate(&warm), CUBLAS_STATUS_SUCCESS);
        cublasDestroy(warm);
        const tp::capture_error e = expect_capture_error([&] {
          tp::Graph graph;
          graph.capture(
              [&] {
                created = cublasCreate(&handle);  // sets up the handle and its workspace: not capturable
                (void)cudaGetLastError();
              },
              {.stream = stream});
        });
        if (handle != nullptr) cublasDestroy(handle);
        BOOST_TEST_MESSAGE("cublasCreate inside the capture: " << cublasGetStatusName(created));
        BOOST_TEST(e.culprit() == "cudaFree");
        BOOST_TEST(!e.from_other_thread());
        BOOST_TEST(contains(e.driver_message(), "initiated from the calling thread"), e.driver_message());
        expect_usable(stream);
      },
      3);
}

DOCTOR_TEST(stream_wait_on_an_event_recorded_outside_the_capture_is_named) {
  without_leaks([] {
    tp::Stream stream;
    tp::Stream other;
    Event event;
    touch<<<1, 1, 0, other>>>(nullptr);
    BOOST_REQUIRE_EQUAL(cudaEventRecord(event.get, other), cudaSuccess);
    const tp::capture_error e = expect_capture_error([&] {
      tp::Graph graph;
      graph.capture(
          [&](tp::StreamRef s) {
            (void)cudaStreamWaitEvent(s, event.get, 0);
            (void)cudaGetLastError();
          },
          {.stream = stream});
    });
    BOOST_TEST(e.culprit() == "cudaStreamWaitEvent");
    BOOST_TEST(!e.from_other_thread());
    BOOST_TEST(contains(e.driver_message(), "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"), e.driver_message());
    expect_usable(stream);
  });
}

DOCTOR_TEST(raw_end_capture_by_user_code_is_named) {
  without_leaks([] {
    tp::Stream stream;
    tp::Graph graph;
    const int begin_line = __LINE__ + 1;
    graph.capture_begin({.stream = stream});
    cudaGraph_t stolen = nullptr;
    BOOST_REQUIRE_EQUAL(cudaStreamEndCapture(stream, &stolen), cudaSuccess);  // user code ends tensorplay's capture
    (void)cudaGraphDestroy(stolen);
    const tp::capture_error e = expect_capture_error([&] { graph.capture_end(); });
    BOOST_TEST(e.status() == cudaErrorIllegalState);
    BOOST_TEST(e.culprit() == "cudaStreamEndCapture");
    BOOST_TEST(!e.from_other_thread());
    BOOST_TEST(contains(e.driver_message(), "not actively capturing"), e.driver_message());
    BOOST_TEST(contains(e.what(), "capture begun at " + here(begin_line)), e.what());
    BOOST_TEST(!graph.is_capturing());
    expect_usable(stream);
  });
}

// Thread B's cudaMalloc, inside B's own (thread-local) capture, breaks B's capture and the global
// capture of this thread: this thread's error names B's capture.
DOCTOR_TEST(a_call_from_a_thread_that_captures_names_that_capture) {
  without_leaks([] {
    tp::Stream stream;
    tp::Stream theirs;
    tp::Graph ours({.capture_error_mode = tp::CaptureErrorMode::Global});
    ours.capture_begin({.stream = stream});
    int their_line = 0;
    std::optional<tp::capture_error> their_error;
    std::thread other([&] {
      tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::ThreadLocal});
      try {
        their_line = __LINE__ + 1;
        graph.capture_begin({.stream = theirs});
        void* p = nullptr;
        (void)cudaMalloc(&p, 1 << 20);
        (void)cudaGetLastError();
        if (p != nullptr) (void)cudaFree(p);
        graph.capture_end();
      } catch (const tp::capture_error& e) {
        their_error = e;
      }
    });
    other.join();
    BOOST_REQUIRE(their_error.has_value());
    BOOST_TEST(their_error->culprit() == "cudaMalloc");
    BOOST_TEST(!their_error->from_other_thread());
    const tp::capture_error e = expect_capture_error([&] { ours.capture_end(); });
    BOOST_TEST(e.culprit() == "cudaMalloc");
    BOOST_TEST(e.from_other_thread());
    BOOST_TEST(contains(e.what(), "the calling thread was capturing: the thread-local capture begun at " + here(their_line)),
               e.what());
    expect_usable(stream);
    expect_usable(theirs);
  });
}

// What a replay into a broken capture says: the culprit, found before capture_end.
DOCTOR_TEST(replay_into_a_broken_capture_names_the_culprit) {
  tp::Stream stream;
  tp::Graph inner;
  inner.capture([](tp::StreamRef s) { touch<<<1, 1, 0, s>>>(nullptr); }, {.stream = stream});
  tp::Graph outer;
  outer.capture_begin({.stream = stream});
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  const tp::capture_error e = expect_capture_error([&] { inner.replay(stream); });
  BOOST_TEST(e.culprit() == "cudaStreamSynchronize");
  BOOST_TEST(contains(e.what(), "the capture was invalidated earlier"), e.what());
  BOOST_CHECK_THROW(outer.capture_end(), tp::capture_error);
  expect_usable(stream);
}

// A capture_error is a cuda_error: code that catches cuda_error keeps working.
DOCTOR_TEST(capture_error_is_a_cuda_error_with_the_status) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  try {
    graph.capture_end();
    BOOST_FAIL("capture_end succeeded");
  } catch (const tp::cuda_error& e) {
    BOOST_TEST(e.status() == cudaErrorStreamCaptureInvalidated);
    BOOST_TEST(dynamic_cast<const tp::capture_error*>(&e) != nullptr);
    BOOST_TEST(contains(e.what(), "cudaStreamEndCapture failed: cudaErrorStreamCaptureInvalidated"), e.what());
  }
  expect_usable(stream);
}

// ---- TENSORPLAY_CAPTURE_DOCTOR=full: CUPTI watches too -----------------------------------------

FULL_DOCTOR_TEST(full_cupti_is_watching) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture([](tp::StreamRef s) { touch<<<1, 1, 0, s>>>(nullptr); }, {.stream = stream});  // starts the doctor
  BOOST_TEST(tp::detail::CuptiWatch::instance().active(), tp::detail::CuptiWatch::instance().failure());
}

FULL_DOCTOR_TEST(full_names_the_runtime_call_two_bodies_deep) {
  without_leaks([] { check_sync_two_bodies_deep(false); });
}

FULL_DOCTOR_TEST(full_names_the_thread_of_a_raw_end_capture) {
  tp::Stream stream;
  tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::Relaxed});  // any thread may end a relaxed capture
  graph.capture_begin({.stream = stream});
  std::thread other([&] {
    cudaGraph_t stolen = nullptr;
    BOOST_CHECK_EQUAL(cudaStreamEndCapture(stream, &stolen), cudaSuccess);
    (void)cudaGraphDestroy(stolen);
  });
  other.join();
  const tp::capture_error e = expect_capture_error([&] { graph.capture_end(); });
  BOOST_TEST(e.culprit() == "cudaStreamEndCapture");
  BOOST_TEST(e.from_other_thread());
  expect_usable(stream);
}

FULL_DOCTOR_TEST(full_names_cuda_malloc_on_another_thread) {
  tp::Stream stream;
  tp::Graph graph;
  const tp::capture_error e = expect_malloc_on_another_thread_to_break(graph, stream);
  BOOST_TEST(e.culprit() == "cudaMalloc");
  BOOST_TEST(e.from_other_thread());
  expect_usable(stream);
}

BOOST_AUTO_TEST_SUITE_END()
