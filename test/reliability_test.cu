// Regression tests for the six defects an independent acceptance run found off the happy path
// (issue "Reliability first"). Each case reproduces the reported scenario through the public API.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;

namespace {

// Waits `nanoseconds` on the GPU's clock, then fills `out` with `value`: a write that lands
// long after the host has moved on.
__global__ void late_fill(int* out, std::size_t n, int value, long long nanoseconds) {
  if (threadIdx.x == 0) tp_test::spin_for(nanoseconds);  // every block waits, then writes
  __syncthreads();
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

bool all_equal(const std::vector<int>& v, int value) {
  for (int x : v)
    if (x != value) return false;
  return true;
}

template <class T>
std::vector<T> to_host(const tp::DeviceTensor<T>& t) {
  std::vector<T> out(t.size());
  BOOST_REQUIRE_EQUAL(cudaMemcpy(out.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reliability)

// ---- (1) a DeviceTensor outlives the Stream it was allocated on ------------------------------

TP_GPU_TEST(eager_tensor_outlives_its_stream_without_crash_or_aliasing) {
  constexpr std::size_t n = 1 << 16;
  tp::DeviceTensor<int> survivor;
  {
    tp::Stream inner;
    survivor = tp::DeviceTensor<int>(n, inner);
    // The inner stream's last write lands 50 ms after the stream object is gone.
    late_fill<<<64, 256, 0, inner>>>(survivor.data(), n, 7, 50'000'000);
    BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
  }  // ~Stream while its work still runs
  survivor = tp::DeviceTensor<int>();  // frees memory whose last use is on a destroyed stream
  // A new allocation of the same size on another stream must not receive that memory while
  // the late write can still land in it.
  tp::Stream other;
  tp::DeviceTensor<int> fresh(n, other);
  tp_test::fill(fresh.data(), n, 3, other);
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  BOOST_TEST(all_equal(to_host(fresh), 3));
}

TP_GPU_TEST(tensor_allocated_in_a_capture_outlives_stream_and_graph) {
  constexpr std::size_t n = 4096;
  tp::DeviceTensor<int> y;
  {
    tp::Stream inner;
    tp::Graph graph;
    graph.capture(
        [&](tp::StreamRef s) {
          y = tp::DeviceTensor<int>(n, s);
          tp_test::fill(y.data(), n, 11, s);
        },
        {.stream = inner});
    graph.replay(inner);
    inner.synchronize();
  }  // the stream dies before the graph; the tensor survives both
  BOOST_TEST(all_equal(to_host(y), 11));
  y = tp::DeviceTensor<int>();  // must not touch the destroyed stream
  tp::Stream s;
  tp::DeviceTensor<int> z(n, s);
  tp_test::fill(z.data(), n, 5, s);
  s.synchronize();
  BOOST_TEST(all_equal(to_host(z), 5));
}

TP_GPU_TEST(tensor_used_on_a_second_stream_outlives_both_streams) {
  constexpr std::size_t n = 1 << 12;
  tp::DeviceTensor<int> t;
  {
    tp::Stream a;
    tp::Stream b;
    t = tp::DeviceTensor<int>(n, a);
    t.record_stream(b);
    late_fill<<<8, 256, 0, b>>>(t.data(), n, 1, 20'000'000);
  }
  t = tp::DeviceTensor<int>();
  tp::Stream c;
  tp::DeviceTensor<int> u(n, c);
  tp_test::fill(u.data(), n, 9, c);
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  BOOST_TEST(all_equal(to_host(u), 9));
}

// ---- (2) a Graph whose capture is open when its Stream is destroyed ----------------------------

TP_GPU_TEST(graph_outlives_the_stream_of_its_open_capture) {
  tp::Graph graph;
  {
    tp::Stream s;
    graph.capture_begin({.stream = s});
    tp::DeviceTensor<int> scratch(16);  // the capture's pool is in use too
  }  // ~Stream with the capture still open
  BOOST_TEST(!graph.is_capturing());
  BOOST_CHECK_THROW(graph.capture_end(), tp::usage_error);
  // Still usable: capture again on a live stream.
  tp::Stream s2;
  tp::DeviceTensor<int> out(8, s2);
  graph.reset();
  graph.capture([&](tp::StreamRef s) { tp_test::fill(out.data(), 8, 4, s); }, {.stream = s2});
  graph.replay(s2);
  s2.synchronize();
  BOOST_TEST(all_equal(to_host(out), 4));
}

TP_GPU_TEST(exception_unwinding_destroys_stream_before_graph_with_capture_open) {
  bool caught = false;
  try {
    tp::Graph graph;
    tp::Stream s;
    graph.capture_begin({.stream = s});
    throw std::runtime_error("user error mid-capture");
  } catch (const std::runtime_error&) {
    caught = true;
  }
  BOOST_TEST(caught);
  // Nothing is left capturing on this thread's streams, and new captures work.
  tp::Stream s;
  tp::Graph graph;
  tp::DeviceTensor<int> out(4, s);
  graph.capture([&](tp::StreamRef st) { tp_test::fill(out.data(), 4, 2, st); }, {.stream = s});
  graph.replay(s);
  s.synchronize();
  BOOST_TEST(all_equal(to_host(out), 2));
}

TP_GPU_TEST(graph_inside_conditional_body_outlives_its_stream) {
  tp::Graph graph;
  tp::DeviceTensor<bool> pred(1);
  {
    tp::Stream s;
    graph.capture_begin({.stream = s});
    graph.begin_capture_to_while_node(pred);
    graph.begin_capture_to_if_node(pred);
  }  // two bodies open
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(graph.conditional_depth() == 0u);
  BOOST_CHECK_THROW(graph.end_capture_to_conditional_node(), tp::usage_error);
}

// ---- (3) a capture invalidated inside conditional bodies ---------------------------------------

namespace {

// Runs `capture` and checks the promise: a cuda_error, nothing capturing, the graph usable.
template <class F>
void expect_clean_cuda_error(tp::Graph& graph, tp::Stream& stream, F&& capture) {
  BOOST_CHECK_THROW(capture(), tp::cuda_error);
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(tp_test::not_capturing(stream));
  graph.reset();
  tp::DeviceTensor<int> out(4, stream);
  graph.capture([&](tp::StreamRef s) { tp_test::fill(out.data(), 4, 6, s); }, {.stream = stream});
  graph.replay(stream);
  stream.synchronize();
  BOOST_TEST(all_equal(to_host(out), 6));
}

}  // namespace

TP_GPU_TEST(device_synchronize_three_deep_inside_while_gives_cuda_error) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(pred.data(), 0, 1, stream), cudaSuccess);
  tp::Graph graph;
  expect_clean_cuda_error(graph, stream, [&] {
    graph.capture(
        [&] {
          graph.while_(pred, [&] {
            graph.if_(pred, [&] {
              graph.if_(pred, [&] {
                graph.if_(pred, [&] { (void)cudaDeviceSynchronize(); });
              });
            });
          });
        },
        {.stream = stream});
  });
}

TP_GPU_TEST(stream_synchronize_inside_while_body_gives_cuda_error) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(pred.data(), 0, 1, stream), cudaSuccess);
  tp::Graph graph;
  expect_clean_cuda_error(graph, stream, [&] {
    graph.capture([&] { graph.while_(pred, [&](tp::StreamRef body) { (void)cudaStreamSynchronize(body); }); },
                  {.stream = stream});
  });
}

// A scope's destructor cannot throw: when the body it closes was invalidated, the capture must
// stay open until capture_end, so that work issued after the scope (in the enclosing body or at
// top level) is captured and thrown away, never run eagerly. Found by the model test (seed
// 20261130, operation #1691: a counter decremented by a kernel launched after an inner scope).
namespace {
__global__ void add_one(int* counter) { *counter += 1; }
}  // namespace

TP_GPU_TEST(work_after_a_scope_whose_body_was_invalidated_never_runs) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(pred.data(), 0, 1, stream), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(counter.data(), 0, sizeof(int), stream), cudaSuccess);
  stream.synchronize();
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  {
    tp::WhileScope outer(graph, pred);
    {
      tp::WhileScope inner(graph, pred);
      (void)cudaDeviceSynchronize();
      (void)cudaGetLastError();
    }
    BOOST_TEST(graph.is_capturing());  // the error waits for capture_end
    add_one<<<1, 1, 0, outer.stream()>>>(counter.data());
    (void)cudaGetLastError();
  }
  add_one<<<1, 1, 0, stream>>>(counter.data());
  (void)cudaGetLastError();
  BOOST_CHECK_THROW(graph.capture_end(), tp::cuda_error);
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(tp_test::not_capturing(stream));
  BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  BOOST_TEST(to_host(counter)[0] == 0);  // neither kernel ran
  // The graph captures again.
  graph.capture([&](tp::StreamRef s) { add_one<<<1, 1, 0, s>>>(counter.data()); }, {.stream = stream});
  graph.replay(stream);
  stream.synchronize();
  BOOST_TEST(to_host(counter)[0] == 1);
}

TP_GPU_TEST(other_thread_malloc_in_global_mode_during_while_body_gives_cuda_error) {
  tp::Stream stream;
  tp::DeviceTensor<bool> pred(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(pred.data(), 0, 1, stream), cudaSuccess);
  stream.synchronize();
  tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::Global});
  void* leaked = nullptr;
  expect_clean_cuda_error(graph, stream, [&] {
    graph.capture(
        [&] {
          graph.while_(pred, [&] {
            std::thread other([&] { (void)cudaMalloc(&leaked, 1 << 20); });
            other.join();
          });
        },
        {.stream = stream});
  });
  if (leaked != nullptr) (void)cudaFree(leaked);
  (void)cudaGetLastError();
}

// ---- (4) a refused capture_begin leaves the other capture alone --------------------------------

TP_GPU_TEST(refused_capture_begin_keeps_the_first_capture_intact) {
  tp::Stream stream;
  tp::DeviceTensor<int> out(32, stream);
  tp::Graph first;
  tp::Graph second;
  first.capture_begin({.stream = stream});
  tp_test::fill(out.data(), 32, 8, stream);
  BOOST_CHECK_THROW(second.capture_begin({.stream = stream}), tp::usage_error);
  BOOST_TEST(!second.is_capturing());
  BOOST_REQUIRE_NO_THROW(first.capture_end());
  first.replay(stream);
  stream.synchronize();
  BOOST_TEST(all_equal(to_host(out), 8));
  // The refused graph is usable.
  second.capture([&](tp::StreamRef s) { tp_test::fill(out.data(), 32, 9, s); }, {.stream = stream});
  second.replay(stream);
  stream.synchronize();
  BOOST_TEST(all_equal(to_host(out), 9));
}

TP_GPU_TEST(refused_capture_begin_keeps_a_raw_capture_intact) {
  tp::Stream stream;
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  tp::Graph graph;
  BOOST_CHECK_THROW(graph.capture_begin({.stream = stream}), tp::usage_error);
  cudaGraph_t raw = nullptr;
  BOOST_TEST(cudaStreamEndCapture(stream, &raw) == cudaSuccess);
  if (raw != nullptr) (void)cudaGraphDestroy(raw);
}

// ---- (5) stage_and_launch and make_graphed on graphs with conditional nodes ---------------------

namespace {
__global__ void count_down(int* counter, bool* more, float* x) {
  *x += 1.0f;
  *counter -= 1;
  *more = *counter > 0;
}
__global__ void scale_kernel(const float* in, float* out, std::size_t n, float a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i];
}
}  // namespace

TP_GPU_TEST(stage_and_launch_on_a_graph_with_while_and_if) {
  constexpr std::size_t n = 1024;
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<float> y(n, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<int> start(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<float> acc(1, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  const bool t = true;
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(yes.data(), &t, 1, cudaMemcpyHostToDevice, stream), cudaSuccess);
  tp::Graph graph;
  graph.capture(
      [&](tp::StreamRef s) {
        BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(counter.data(), start.data(), sizeof(int), cudaMemcpyDeviceToDevice, s),
                            cudaSuccess);
        BOOST_REQUIRE_EQUAL(cudaMemsetAsync(acc.data(), 0, sizeof(float), s), cudaSuccess);
        BOOST_REQUIRE_EQUAL(cudaMemsetAsync(more.data(), 1, 1, s), cudaSuccess);
        graph.while_(more, [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(counter.data(), more.data(), acc.data()); });
        graph.if_(yes, [&](tp::StreamRef body) { scale_kernel<<<8, 128, 0, body>>>(x.data(), y.data(), n, 2.0f); });
      },
      {.stream = stream});
  for (int round = 1; round <= 3; ++round) {
    std::vector<float> host_x(n, static_cast<float>(round));
    tp::DeviceTensor<float> fresh_x(n, stream);
    fresh_x.copy_from_host(host_x, stream);
    tp::DeviceTensor<int> fresh_start(1, stream);
    const int iterations = round * 4;
    fresh_start.copy_from_host(std::span<const int>(&iterations, 1), stream);
    graph.stage_and_launch(std::tie(x, start), std::tie(fresh_x, fresh_start), stream);
    stream.synchronize();
    BOOST_TEST(to_host(acc)[0] == static_cast<float>(iterations));
    const std::vector<float> out = to_host(y);
    BOOST_TEST(out[0] == 2.0f * round);
    BOOST_TEST(out[n - 1] == 2.0f * round);
  }
}

namespace {
__global__ void set_if_handle(cudaGraphConditionalHandle handle, const bool* pred) { cudaGraphSetConditional(handle, *pred ? 1u : 0u); }

// Adds, with raw CUDA calls, an if node to the capture running on `s` and captures `body(body_stream)` into it.
template <class F>
void raw_if(cudaStream_t s, cudaStream_t body_stream, const bool* pred, F&& body) {
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t count = 0;
  BOOST_REQUIRE_EQUAL(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &count), cudaSuccess);
  cudaGraphConditionalHandle handle{};
  BOOST_REQUIRE_EQUAL(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0), cudaSuccess);
  set_if_handle<<<1, 1, 0, s>>>(handle, pred);
  BOOST_REQUIRE_EQUAL(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &count), cudaSuccess);
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node{};
  BOOST_REQUIRE_EQUAL(cudaGraphAddNode(&node, graph, deps, nullptr, count, &params), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1, cudaStreamSetCaptureDependencies), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamBeginCaptureToGraph(body_stream, params.conditional.phGraph_out[0], nullptr, nullptr, 0,
                                                    cudaStreamCaptureModeRelaxed),
                      cudaSuccess);
  body(body_stream);
  cudaGraph_t ignored = nullptr;
  BOOST_REQUIRE_EQUAL(cudaStreamEndCapture(body_stream, &ignored), cudaSuccess);
}
}  // namespace

TP_GPU_TEST(make_graphed_with_a_conditional_body) {
  constexpr std::size_t n = 256;
  tp::Stream stream;
  tp::Stream body_stream;
  tp::StreamGuard guard(stream);
  tp::DeviceTensor<float> x(n);
  tp::DeviceTensor<float> y(n);
  tp::DeviceTensor<bool> yes(1);
  const bool t = true;
  yes.copy_from_host(std::span<const bool>(&t, 1));
  stream.synchronize();
  // The body returns the outer y through a pointer: nvcc 13.0 takes `return y;` of a variable
  // captured by reference for a local's (warning #836-D).
  tp::DeviceTensor<float>* const out = &y;
  auto step = tp::make_graphed(
      [&](tp::DeviceTensor<float>& in) -> tp::DeviceTensor<float>& {
        const cudaStream_t s = tp::current_stream();
        if (tp::StreamRef(s).is_capturing()) {
          raw_if(s, body_stream, yes.data(), [&](cudaStream_t b) { scale_kernel<<<4, 64, 0, b>>>(in.data(), y.data(), n, 3.0f); });
        } else {
          scale_kernel<<<4, 64, 0, s>>>(in.data(), y.data(), n, 3.0f);  // warm-up run
        }
        return *out;
      },
      x);
  for (int round = 1; round <= 2; ++round) {
    std::vector<float> host(n, static_cast<float>(round));
    tp::DeviceTensor<float> fresh(n);
    fresh.copy_from_host(host);
    tp::DeviceTensor<float>& out = step(fresh);
    stream.synchronize();
    BOOST_TEST(to_host(out)[n / 2] == 3.0f * round);
  }
}

// ---- (6) overlapping staging ------------------------------------------------------------------

namespace {
struct StagedCopy {
  static constexpr std::size_t n = std::size_t{1} << 20;  // many tiles: a racing copy shows
  tp::Stream stream;
  tp::DeviceTensor<int> buffer{2 * n, stream};  // one allocation holding both sides
  tp::DeviceTensor<int> other{n, stream};
  tp::Graph graph;
  std::span<int> statics{buffer.data(), n};
  StagedCopy() {
    std::vector<int> ramp(2 * n);
    for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<int>(i);
    buffer.copy_from_host(ramp, stream);
    graph.capture([&](tp::StreamRef s) { tp_test::add(other.data(), n, 0, s); }, {.stream = stream});
  }
};
}  // namespace

TP_GPU_TEST(input_overlapping_its_static_buffer_is_refused_or_moved_exactly) {
  StagedCopy f;
  std::span<int> input(f.buffer.data() + 1, StagedCopy::n);  // one element ahead, same allocation
  bool refused = false;
  try {
    f.graph.stage_and_launch(std::tie(f.statics), std::tie(input), f.stream);
  } catch (const tp::usage_error&) {
    refused = true;
  }
  f.stream.synchronize();
  const std::vector<int> after = to_host(f.buffer);
  for (std::size_t i = 0; i < StagedCopy::n; ++i) {
    // Either nothing was issued (refused) or the copy had memmove semantics.
    const int expected = refused ? static_cast<int>(i) : static_cast<int>(i + 1);
    if (after[i] != expected) {
      BOOST_TEST(after[i] == expected, "element " << i);
      break;
    }
  }
  BOOST_TEST(after[StagedCopy::n] == static_cast<int>(StagedCopy::n));
}

TP_GPU_TEST(the_same_static_buffer_twice_is_refused_before_anything_is_issued) {
  StagedCopy f;
  tp::DeviceTensor<int> a(StagedCopy::n, f.stream);
  tp::DeviceTensor<int> b(StagedCopy::n, f.stream);
  tp_test::fill(a.data(), StagedCopy::n, -1, f.stream);
  tp_test::fill(b.data(), StagedCopy::n, -2, f.stream);
  BOOST_CHECK_THROW(f.graph.stage_and_launch(std::tie(f.statics, f.statics), std::tie(a, b), f.stream), tp::usage_error);
  f.stream.synchronize();
  BOOST_TEST(to_host(f.buffer)[0] == 0);  // untouched
}

TP_GPU_TEST(an_input_overlapping_another_pairs_static_buffer_is_refused) {
  StagedCopy f;
  std::span<int> second_static(f.buffer.data() + StagedCopy::n, StagedCopy::n);
  tp::DeviceTensor<int> a(StagedCopy::n, f.stream);
  tp_test::fill(a.data(), StagedCopy::n, -1, f.stream);
  // Pair 1 reads from pair 0's static buffer while pair 0 writes it.
  std::span<int> reads_first(f.buffer.data(), StagedCopy::n);
  BOOST_CHECK_THROW(f.graph.stage_and_launch(std::tie(f.statics, second_static), std::tie(a, reads_first), f.stream),
                    tp::usage_error);
  f.stream.synchronize();
  BOOST_TEST(to_host(f.buffer)[0] == 0);
}

BOOST_AUTO_TEST_SUITE_END()
