// test/build/warnings/idioms.cu: the README's and the guide's idioms in a CUDA translation unit
// (nvcc --extended-lambda): everything idioms.cpp has (idioms_common.hpp, idioms_libraries.hpp),
// plus what needs nvcc: kernels of the user's launched with <<<...>>> into captures and
// conditional bodies, __device__ callable predicates, <tensorplay/random.cuh> and
// <tensorplay/thrust.hpp>. tools/check_warnings compiles it with nvcc's -Werror all-warnings and
// -Xcompiler=-Wall,-Wextra,-Werror at -O0 and -O2; it is never linked or run.
#include "idioms_common.hpp"
#include "idioms_libraries.hpp"

#include <tensorplay/random.cuh>
#include <tensorplay/thrust.hpp>

#include <cuda/std/mdspan>
#include <cuda_fp16.h>
#include <curand_kernel.h>
#include <thrust/device_vector.h>

namespace cu {

__global__ void increment(int* counter) { ++*counter; }
__global__ void scale(const float* x, float* y, float* residual, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
  if (i == 0) *residual = 1.0f;
}
__global__ void iterate(float* y, float* residual, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) y[i] *= 0.5f;
  if (i == 0) *residual *= 0.5f;
}
__global__ void count_down(int* k, bool* more, int* iterations) {
  --*k;
  ++*iterations;
  *more = *k > 0;
}
__global__ void set_int(int* out, int value) { *out = value; }
__global__ void dropout(float* x, std::size_t n, float p, tp::PhiloxArgs philox) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const tp::PhiloxSeedOffset so = tp::unpack(philox);
  curandStatePhilox4_32_10_t state;
  curand_init(so.seed, i, so.offset, &state);
  if (i < n && curand_uniform(&state) < p) x[i] = 0.0f;
}

__global__ void decide(const int* x, tp::ConditionalHandle h) { h.set(*x > 0 ? 1u : 0u); }
__global__ void count_down_handle(int* k, int* iterations, tp::ConditionalHandle loop) {
  *k -= 1;
  *iterations += 1;
  if (*k <= 0) loop.set(0);
}
__global__ void set_native(cudaGraphConditionalHandle h, unsigned value) { cudaGraphSetConditional(h, value); }

// A named functor with a __device__ call operator: a predicate where nvcc refuses a lambda.
struct Positive {
  const int* k;
  __device__ bool operator()() const { return *k > 0; }
};

// The README's first example, as written.
void readme_example() {
  constexpr std::size_t n = 1 << 20;
  constexpr unsigned blocks = (n + 255) / 256;
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<float> y;
  tp::DeviceTensor<float> r(1, stream);
  float* residual = r.data();
  const float tol = 1e-6f;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    y = tp::DeviceTensor<float>(n, s);
    scale<<<blocks, 256, 0, s>>>(x.data(), y.data(), residual, n);
    graph.while_([=] __device__ { return *residual > tol; },
                 [&](tp::StreamRef body) { iterate<<<blocks, 256, 0, body>>>(y.data(), residual, n); });
  }, {.stream = stream});
  graph.replay(stream);
  tp::DeviceTensor<float> fresh_x(n, stream);
  graph.stage_and_launch(std::tie(x), std::tie(fresh_x), stream);
}

void kernels_and_device_predicates() {
  tp::Stream stream;
  tp::DeviceTensor<int> k(1, stream), gate(1, stream), gated(1, stream), iterations(1, stream), out(1, stream);
  tp::DeviceTensor<bool> more(1, stream), pred(1, stream);
  thrust::device_vector<bool> thrust_pred(1);
  int* k_ptr = k.data();
  int* iter_ptr = iterations.data();
  const int* gate_ptr = gate.data();
  auto body_10 = [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 10); };
  auto body_11 = [&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(out.data(), 11); };
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    for (int i = 0; i < 10; ++i) increment<<<1, 1, 0, s>>>(k.data());
    graph.while_(more, [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(k.data(), more.data(), iter_ptr); });
    graph.while_([=] __device__ { return *k_ptr > 0; },
                 [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(k_ptr, more.data(), iter_ptr); });
    graph.if_([=] __device__ { return *gate_ptr != 0; }, [&](tp::StreamRef body) { increment<<<1, 1, 0, body>>>(gated.data()); });
    graph.if_(thrust_pred, [&] { increment<<<1, 1, 0, tp::current_stream()>>>(gated.data()); });
    graph.if_else_([=] __device__ { return *gate_ptr > 1; }, body_10, body_11);
    graph.if_else_(pred, [&](tp::StreamRef b) { set_int<<<1, 1, 0, b>>>(out.data(), 1); },
                   [&](tp::StreamRef b) { set_int<<<1, 1, 0, b>>>(out.data(), 2); });
    graph.switch_([=] __device__ { return *gate_ptr; }, body_10, body_11);
    graph.switch_(gate, body_10, body_11, [&] { set_int<<<1, 1, 0, tp::current_stream()>>>(out.data(), 102); });
    {
      tp::WhileScope loop(graph, more);
      count_down<<<1, 1, 0, loop.stream()>>>(k.data(), more.data(), iter_ptr);
    }
    {
      tp::IfScope gate_scope(graph, [=] __device__ { return *gate_ptr != 0; });
      increment<<<1, 1, 0, gate_scope.stream()>>>(gated.data());
    }
    {
      tp::WhileScope loop(graph, [=] __device__ { return *k_ptr > 0; });
      count_down<<<1, 1, 0, loop.stream()>>>(k_ptr, more.data(), iter_ptr);
    }
  }, {.stream = stream});
  graph.replay(stream);

  tp::Graph imperative;
  imperative.capture_begin({.stream = stream});
  imperative.begin_capture_to_while_node(more);
  count_down<<<1, 1, 0, imperative.capture_stream()>>>(k.data(), more.data(), iter_ptr);
  imperative.set_conditional_handle_for_current_node(more);
  imperative.end_capture_to_conditional_node();
  imperative.begin_capture_to_while_node([=] __device__ { return *k_ptr > 0; });
  count_down<<<1, 1, 0, imperative.capture_stream()>>>(k_ptr, more.data(), iter_ptr);
  imperative.set_conditional_handle_for_current_node([=] __device__ { return *k_ptr > 0; });
  imperative.end_capture_to_conditional_node();
  imperative.begin_capture_to_if_node([=] __device__ { return *gate_ptr != 0; });
  increment<<<1, 1, 0, imperative.capture_stream()>>>(gated.data());
  imperative.end_capture_to_conditional_node();
  imperative.capture_end();
}

void handles_set_by_kernels() {
  tp::Stream s;
  tp::DeviceTensor<int> x(1, s), count(1, s), k(1, s), iterations(1, s);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto h = graph.conditional_handle();
    decide<<<1, 1, 0, c>>>(x.data(), h);
    graph.if_(h, [&](tp::StreamRef b) { increment<<<1, 1, 0, b>>>(count.data()); });
    auto loop = graph.conditional_handle(1);
    graph.while_(loop, [&](tp::StreamRef b) { count_down_handle<<<1, 1, 0, b>>>(k.data(), iterations.data(), loop); });
    auto raw = graph.conditional_handle();
    set_native<<<1, 1, 0, c>>>(raw.native(), 1);
    graph.switch_(raw, [&](tp::StreamRef b) { set_int<<<1, 1, 0, b>>>(x.data(), 0); },
                  [&](tp::StreamRef b) { set_int<<<1, 1, 0, b>>>(x.data(), 1); });
    graph.while_(Positive{k.data()}, [&](tp::StreamRef b) { count_down<<<1, 1, 0, b>>>(k.data(), nullptr, iterations.data()); });
  }, {.stream = s, .upload = true});
  graph.replay(s);
  const tp::RebindResult r = graph.rebind(x, count);
  std::printf("%zu\n", r.nodes);
}

void update_with_kernels() {
  tp::Stream stream;
  tp::DeviceTensor<int> a(1, stream), b(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { set_int<<<1, 32, 0, s>>>(a.data(), 1); }, {.stream = stream});
  const tp::UpdateResult r = graph.update([&](tp::StreamRef s) { set_int<<<64, 256, 0, s>>>(b.data(), 2); }, {.stream = stream});
  std::printf("%d\n", r.outcome == tp::UpdateOutcome::Updated ? 1 : 0);
}

void random_dropout() {
  constexpr std::size_t n = 4096;
  constexpr unsigned blocks = n / 256;
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<int> left(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<int> iterations(1, stream);
  tp::RandomState rng(2026);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    dropout<<<blocks, 256, 0, s>>>(x.data(), n, 0.1f, rng.next(1));
    graph.while_(more, [&](tp::StreamRef body) {
      dropout<<<blocks, 256, 0, body>>>(x.data(), n, 0.1f, rng.next(1));
      count_down<<<1, 1, 0, body>>>(left.data(), more.data(), iterations.data());
    });
  }, {.stream = stream});
  graph.replay(stream);
}

void thrust_allocations_and_tensor_types() {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  tp::PoolAllocator<int> alloc(stream);
  auto p = alloc.allocate(1000);
  alloc.deallocate(p, 1000);
  thrust::device_vector<float, tp::PoolAllocator<float>> v(100, 1.0f, tp::PoolAllocator<float>(stream));
  tp::record_stream(thrust::raw_pointer_cast(v.data()), stream);
  graph.capture_end();
  static_assert(tp::Tensor<thrust::device_vector<float>> && tp::Tensor<thrust::device_vector<float, tp::PoolAllocator<float>>>);
  static_assert(tp::Tensor<cuda::std::mdspan<float, cuda::std::dextents<std::size_t, 2>>>);
  using Strided = cuda::std::mdspan<float, cuda::std::dextents<std::size_t, 2>, cuda::std::layout_stride>;
  static_assert(tp::Tensor<Strided> && !tp::ContiguousTensor<Strided>, "layout_stride is not contiguous in general");

  // stage_and_launch onto and from Thrust vectors, mdspans and half precision.
  constexpr std::size_t n = 64;
  tp::DeviceTensor<float> s_fast(n, stream), s_strided(n, stream), fast(n, stream), wide(2 * n, stream);
  tp::DeviceTensor<__half> s_half(n, stream);
  thrust::device_vector<float> s_vector(n), vector_input(n);
  Strided strided(wide.data(), cuda::std::layout_stride::mapping(cuda::std::dextents<std::size_t, 2>(n, 1),
                                                                 cuda::std::array<std::size_t, 2>{2, 1}));
  tp::Graph staged;
  staged.capture([&](tp::StreamRef s) { set_int<<<1, 1, 0, s>>>(nullptr, 0); }, {.stream = stream});
  staged.stage_and_launch(std::tie(s_fast, s_strided, s_vector, s_half), std::tie(fast, strided, vector_input, fast), stream);
}

}  // namespace cu
