// Tests for tensorplay/graph/graph.hpp and graph/options.hpp: capture, replay, misuse.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace tp = tensorplay;

static_assert(!std::is_copy_constructible_v<tp::Graph> && std::is_nothrow_move_constructible_v<tp::Graph>);
static_assert(std::is_nothrow_move_assignable_v<tp::Graph>);

namespace {
__global__ void increment(int* counter) { atomicAdd(counter, 1); }
__global__ void empty_kernel() {}

using tp_test::read_file;
using tp_test::temp_path;
}  // namespace

BOOST_AUTO_TEST_SUITE(graph)

// ---- options (no GPU needed) ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(capture_error_mode_parses_the_three_names) {
  BOOST_TEST((tp::capture_error_mode_from_string("global") == tp::CaptureErrorMode::Global));
  BOOST_TEST((tp::capture_error_mode_from_string("thread_local") == tp::CaptureErrorMode::ThreadLocal));
  BOOST_TEST((tp::capture_error_mode_from_string("relaxed") == tp::CaptureErrorMode::Relaxed));
  BOOST_TEST(tp::to_string(tp::CaptureErrorMode::ThreadLocal) == "thread_local");
}

BOOST_AUTO_TEST_CASE(capture_error_mode_rejects_unknown_names) {
  BOOST_CHECK_THROW((void)tp::capture_error_mode_from_string("Global"), tp::usage_error);
  BOOST_CHECK_THROW((void)tp::capture_error_mode_from_string(""), tp::usage_error);
  BOOST_CHECK_THROW((void)tp::capture_error_mode_from_string("threadlocal"), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(capture_error_modes_map_to_cuda_modes) {
  static_assert(tp::detail::to_cuda(tp::CaptureErrorMode::Global) == cudaStreamCaptureModeGlobal);
  static_assert(tp::detail::to_cuda(tp::CaptureErrorMode::ThreadLocal) == cudaStreamCaptureModeThreadLocal);
  static_assert(tp::detail::to_cuda(tp::CaptureErrorMode::Relaxed) == cudaStreamCaptureModeRelaxed);
  BOOST_TEST(true);
}

BOOST_AUTO_TEST_CASE(fresh_graph_is_neither_capturing_nor_instantiated) {
  tp::Graph graph({.keep_graph = true});
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(!graph.is_instantiated());
  BOOST_TEST(graph.device() == -1);
  BOOST_TEST(graph.capture_stream().is_legacy_default());
}

// ---- misuse: usage_error, and the graph stays usable -------------------------------------------

BOOST_AUTO_TEST_CASE(replay_before_capture_throws_usage_error) {
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.replay(), tp::usage_error);
  BOOST_CHECK_THROW(graph.replay(tp::StreamRef{}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(capture_end_without_capture_begin_throws_usage_error) {
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.capture_end(), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(debug_dump_before_any_capture_throws_usage_error) {
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.debug_dump(temp_path("never.dot")), tp::usage_error);
  BOOST_CHECK_THROW(graph.instantiate(), tp::usage_error);
  BOOST_CHECK_THROW((void)graph.node_count(), tp::usage_error);
}

TP_GPU_TEST(misuse_leaves_the_graph_usable) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.replay(stream), tp::usage_error);
  BOOST_CHECK_THROW(graph.capture_end(), tp::usage_error);
  BOOST_CHECK_THROW(graph.debug_dump(temp_path("early.dot")), tp::usage_error);
  graph.capture_begin({.stream = stream});
  BOOST_CHECK_THROW(graph.capture_begin({.stream = stream}), tp::usage_error);  // the open capture goes on
  BOOST_CHECK_THROW(graph.replay(stream), tp::usage_error);
  increment<<<1, 1, 0, stream>>>(counter.data());
  graph.capture_end();
  BOOST_CHECK_THROW(graph.capture_begin({.stream = stream}), tp::usage_error);  // holds a graph: reset first
  graph.replay(stream);
  graph.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 2);
  BOOST_TEST(tp_test::not_capturing(stream));
}

// ---- capture and replay --------------------------------------------------------------------

TP_GPU_TEST(replay_runs_every_captured_kernel_each_time) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    for (int i = 0; i < 100; ++i) increment<<<1, 1, 0, s>>>(counter.data());
  }, {.stream = stream});
  stream.synchronize();
  BOOST_TEST(counter.to_host(stream)[0] == 0);  // capturing runs nothing
  BOOST_TEST(graph.node_count() == 100u);
  for (int i = 0; i < 3; ++i) graph.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 300);
}

TP_GPU_TEST(capture_on_the_legacy_default_stream_uses_a_side_stream_that_is_current_meanwhile) {
  BOOST_REQUIRE(tp::current_stream().is_legacy_default());
  tp::DeviceTensor<int> counter(1, cudaStreamLegacy);
  tp_test::fill(counter.data(), 1, 0, cudaStreamLegacy);
  tp::Graph graph;
  tp::StreamRef seen{};
  graph.capture([&] {
    seen = tp::current_stream();
    increment<<<1, 1, 0, tp::current_stream()>>>(counter.data());
  });
  BOOST_TEST(!seen.is_legacy_default());
  BOOST_TEST(tp::current_stream().is_legacy_default());  // restored
  graph.replay();  // on the current (legacy default) stream
  BOOST_TEST(counter.to_host(cudaStreamLegacy)[0] == 1);
}

TP_GPU_TEST(capture_stream_and_current_stream_agree_inside_a_capture) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  tp::Graph graph;
  graph.capture_begin();
  BOOST_TEST(graph.is_capturing());
  BOOST_TEST(graph.capture_stream() == tp::StreamRef(stream));
  BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));
  BOOST_TEST(stream.is_capturing());
  graph.capture_end();
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(graph.is_instantiated());
  BOOST_TEST(tp::current_stream() == tp::StreamRef(stream));
}

TP_GPU_TEST(replay_without_stream_uses_the_current_stream) {
  tp::Stream capture_stream;
  tp::Stream replay_stream;
  tp::DeviceTensor<int> counter(1, capture_stream);
  tp_test::fill(counter.data(), 1, 0, capture_stream);
  capture_stream.synchronize();
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(counter.data()); }, {.stream = capture_stream});
  {
    tp::StreamGuard guard(replay_stream);
    graph.replay();
  }
  replay_stream.synchronize();
  BOOST_TEST(tp_test::host_copy(counter.data(), 1, capture_stream)[0] == 1);
}

TP_GPU_TEST(capture_body_taking_no_stream_is_accepted) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  tp::DeviceTensor<int> counter(1);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph graph;
  graph.capture([&] { increment<<<1, 1, 0, tp::current_stream()>>>(counter.data()); });
  graph.replay();
  BOOST_TEST(counter.to_host()[0] == 1);
}

TP_GPU_TEST(instantiate_is_a_no_op_once_instantiated) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { empty_kernel<<<1, 1, 0, s>>>(); }, {.stream = stream});
  const cudaGraphExec_t exec = graph.native_exec();
  BOOST_TEST(exec != cudaGraphExec_t{});
  graph.instantiate();
  BOOST_TEST(graph.native_exec() == exec);
}

TP_GPU_TEST(reset_allows_a_new_capture) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(counter.data()); }, {.stream = stream});
  graph.reset();
  BOOST_TEST(!graph.is_instantiated());
  BOOST_CHECK_THROW(graph.replay(stream), tp::usage_error);
  graph.capture([&](tp::StreamRef s) {
    increment<<<1, 1, 0, s>>>(counter.data());
    increment<<<1, 1, 0, s>>>(counter.data());
  }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 2);
}

TP_GPU_TEST(moved_graph_replays_and_the_source_is_empty) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph a;
  a.capture([&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(counter.data()); }, {.stream = stream});
  tp::Graph b(std::move(a));
  BOOST_CHECK_THROW(a.replay(stream), tp::usage_error);
  b.replay(stream);
  tp::Graph c;
  c = std::move(b);
  c.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 2);
}

TP_GPU_TEST(capture_of_zero_nodes_gives_an_empty_graph_that_replays_as_a_no_op) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  graph.capture_end();
  BOOST_TEST(graph.is_instantiated());
  BOOST_TEST(graph.node_count() == 0u);
  BOOST_CHECK_NO_THROW(graph.replay(stream));
  BOOST_CHECK_NO_THROW(stream.synchronize());
  const auto path = temp_path("empty.dot");
  graph.debug_dump(path);
  BOOST_TEST(read_file(path).find("digraph") != std::string::npos);
  std::filesystem::remove(path);
}

// ---- errors inside a capture ---------------------------------------------------------------

TP_GPU_TEST(body_that_throws_abandons_the_capture_and_the_graph_can_capture_again) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp_test::fill(counter.data(), 1, 0, stream);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.capture([&](tp::StreamRef s) {
    increment<<<1, 1, 0, s>>>(counter.data());
    throw std::runtime_error("user error inside the capture");
  }, {.stream = stream}),
                    std::runtime_error);
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(tp::current_stream().is_legacy_default());
  graph.capture([&](tp::StreamRef s) { increment<<<1, 1, 0, s>>>(counter.data()); }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 1);
}

TP_GPU_TEST(invalidated_capture_makes_capture_end_throw_cuda_error_with_the_status) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  empty_kernel<<<1, 1, 0, stream>>>();
  BOOST_TEST(cudaStreamSynchronize(stream) != cudaSuccess);  // refused: invalidates the capture
  (void)cudaGetLastError();
  try {
    graph.capture_end();
    BOOST_FAIL("capture_end succeeded");
  } catch (const tp::cuda_error& e) {
    BOOST_TEST(e.status() == cudaErrorStreamCaptureInvalidated, cudaGetErrorName(e.status()));
    BOOST_TEST(std::string(e.what()).find("cudaStreamEndCapture") != std::string::npos);
  }
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_TEST(!graph.is_capturing());
  graph.capture([&](tp::StreamRef s) { empty_kernel<<<1, 1, 0, s>>>(); }, {.stream = stream});
  graph.replay(stream);
  BOOST_CHECK_NO_THROW(stream.synchronize());
}

TP_GPU_TEST(destroying_a_capturing_graph_leaves_no_stream_capturing) {
  tp::Stream stream;
  {
    tp::Graph graph;
    graph.capture_begin({.stream = stream});
    empty_kernel<<<1, 1, 0, stream>>>();
  }
  BOOST_TEST(tp_test::not_capturing(stream));
  tp::Graph again;
  BOOST_CHECK_NO_THROW(again.capture([](tp::StreamRef s) { empty_kernel<<<1, 1, 0, s>>>(); }, {.stream = stream}));
}

// ---- capture error modes, shown with a second thread ---------------------------------------

namespace {
// Captures one kernel while another thread calls cudaMalloc; returns that thread's status and
// whether capture_end succeeded.
std::pair<cudaError_t, bool> capture_while_another_thread_mallocs(tp::CaptureErrorMode mode) {
  tp::Stream stream;
  tp::Graph graph({.capture_error_mode = mode});
  graph.capture_begin({.stream = stream});
  empty_kernel<<<1, 1, 0, stream>>>();
  cudaError_t other = cudaSuccess;
  void* ptr = nullptr;
  std::thread([&] {
    other = cudaMalloc(&ptr, 1 << 20);
    (void)cudaGetLastError();
  }).join();
  bool ended = true;
  try {
    graph.capture_end();
  } catch (const tp::cuda_error&) {
    ended = false;
  }
  if (ptr != nullptr) (void)cudaFree(ptr);
  BOOST_TEST(tp_test::not_capturing(stream));
  if (ended) {
    graph.replay(stream);
    stream.synchronize();
  }
  return {other, ended};
}
}  // namespace

TP_GPU_TEST(global_mode_capture_fails_when_another_thread_mallocs) {
  const auto [other, ended] = capture_while_another_thread_mallocs(tp::CaptureErrorMode::Global);
  BOOST_TEST(other != cudaSuccess, cudaGetErrorName(other));
  BOOST_TEST(!ended);
}

TP_GPU_TEST(thread_local_mode_capture_survives_another_thread_mallocing) {
  const auto [other, ended] = capture_while_another_thread_mallocs(tp::CaptureErrorMode::ThreadLocal);
  BOOST_TEST(other == cudaSuccess, cudaGetErrorName(other));
  BOOST_TEST(ended);
}

TP_GPU_TEST(relaxed_mode_capture_survives_another_thread_mallocing) {
  const auto [other, ended] = capture_while_another_thread_mallocs(tp::CaptureErrorMode::Relaxed);
  BOOST_TEST(other == cudaSuccess, cudaGetErrorName(other));
  BOOST_TEST(ended);
}

TP_GPU_TEST(capture_options_override_the_graphs_error_mode) {
  tp::Stream stream;
  tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::Global});
  graph.capture_begin({.capture_error_mode = tp::CaptureErrorMode::Relaxed, .stream = stream});
  empty_kernel<<<1, 1, 0, stream>>>();
  // In relaxed mode even the capturing thread may cudaMalloc during the capture.
  void* ptr = nullptr;
  BOOST_TEST(cudaMalloc(&ptr, 256) == cudaSuccess);
  BOOST_CHECK_NO_THROW(graph.capture_end());
  graph.replay(stream);
  stream.synchronize();
  (void)cudaFree(ptr);
}

// ---- devices ------------------------------------------------------------------------------------

TP_GPU_TEST(graph_remembers_its_device) {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture([](tp::StreamRef s) { empty_kernel<<<1, 1, 0, s>>>(); }, {.stream = stream});
  BOOST_TEST(graph.device() == 0);
}

TP_GPUS_TEST(replay_launches_on_the_graphs_device_whatever_device_is_current, 2) {
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  tp::DeviceTensor<int> counter(1, cudaStreamLegacy);
  BOOST_TEST(counter.device() == 1);
  tp_test::fill(counter.data(), 1, 0, cudaStreamLegacy);
  tp::Graph graph;
  graph.capture([&] { increment<<<1, 1, 0, tp::current_stream()>>>(counter.data()); });
  BOOST_TEST(graph.device() == 1);
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  graph.replay();  // legacy default stream: must launch on device 1 although device 0 is current
  graph.replay();
  int device = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
  BOOST_TEST(device == 0);
  BOOST_REQUIRE_EQUAL(cudaSetDevice(1), cudaSuccess);
  BOOST_TEST(counter.to_host(cudaStreamLegacy)[0] == 2);
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
}

TP_GPUS_TEST(capture_ended_while_another_device_is_current_compiles_for_the_captured_device, 2) {
  tp::Stream stream(1);  // device 0 stays current outside the guards below
  tp::DeviceTensor<int> counter(1, stream);
  BOOST_TEST(counter.device() == 1);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  {
    tp::StreamGuard on_device_1(stream);  // kernels launch only on the current device's streams
    tp_test::fill(counter.data(), 1, 0, stream);
    tp::DeviceTensor<int> scratch(1, stream);  // from the graph's pool, made for device 1
    BOOST_TEST(scratch.device() == 1);
    increment<<<1, 1, 0, stream>>>(scratch.data());
    increment<<<1, 1, 0, stream>>>(counter.data());
  }
  int device = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
  BOOST_REQUIRE_EQUAL(device, 0);
  graph.capture_end();  // instantiates while device 0 is current
  BOOST_TEST(graph.device() == 1);
  BOOST_TEST(graph.pool().device() == 1);
  graph.replay(stream);
  graph.replay(stream);
  BOOST_TEST(counter.to_host(stream)[0] == 1);  // the fill is captured too: each replay gives 1
  tp::Graph empty;
  empty.capture_begin({.stream = stream});
  empty.capture_end();
  BOOST_CHECK_NO_THROW(empty.replay(stream));
  BOOST_CHECK_NO_THROW(stream.synchronize());
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&device), cudaSuccess);
  BOOST_TEST(device == 0);
}

// ---- debug dump ----------------------------------------------------------------------------------

TP_GPU_TEST(debug_dump_writes_dot_and_debug_mode_adds_node_attributes) {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    increment<<<1, 1, 0, s>>>(counter.data());
    increment<<<1, 1, 0, s>>>(counter.data());
  }, {.stream = stream});
  const auto plain = temp_path("plain.dot");
  const auto verbose = temp_path("verbose.dot");
  graph.debug_dump(plain);
  graph.enable_debug_mode();
  graph.debug_dump(verbose);
  const std::string plain_text = read_file(plain);
  const std::string verbose_text = read_file(verbose);
  BOOST_TEST(plain_text.find("digraph") != std::string::npos);
  BOOST_TEST(plain_text.find("increment") != std::string::npos, plain_text);
  BOOST_TEST(verbose_text.size() > plain_text.size());
  std::filesystem::remove(plain);
  std::filesystem::remove(verbose);
}

BOOST_AUTO_TEST_SUITE_END()
