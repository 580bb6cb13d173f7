// bench/conditionals: per-iteration cost of Graph::while_ against a raw while node built by
// hand in this binary and against a host-driven loop; the cost of an if node not taken; and the
// shapes of NVIDIA's conditional-node samples (if, if/else, switch, do-while, a solver loop) whose
// own kernels set the handle, in tensorplay against the same kernels in raw graphs built by hand
// (device throughput and host submit), beside the library's tensor-predicate form.
#include "bench_util.hpp"
#include "raw_nodes.cuh"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace tp = tensorplay;

namespace {

__global__ void arm(int* k, bool* more, int start) {
  *k = start;
  *more = start > 0;
}
// The one-kernel loop body: count down and say whether to go on.
__global__ void count_down(int* k, bool* more) {
  *k -= 1;
  *more = *k > 0;
}
__global__ void raw_set_handle(cudaGraphConditionalHandle handle, const bool* more) {
  cudaGraphSetConditional(handle, *more ? 1u : 0u);
}
// The body kernel of a hand-fused loop: counts down and sets the handle itself.
__global__ void count_down_fused(cudaGraphConditionalHandle handle, int* k) {
  *k -= 1;
  cudaGraphSetConditional(handle, *k > 0 ? 1u : 0u);
}
__global__ void touch(int* x) { *x += 1; }

struct Loops {
  tp::Stream stream;
  tp::DeviceTensor<int> k{1, stream};
  tp::DeviceTensor<bool> more{1, stream};
  tp::DeviceTensor<int> counter{1, stream};
  tp::DeviceTensor<bool> never{1, stream};
  bool* host_more = nullptr;
  tp::Graph ours;
  cudaGraph_t raw_graph = nullptr;
  cudaGraphExec_t raw = nullptr;
  cudaGraph_t fused_graph = nullptr;
  cudaGraphExec_t fused = nullptr;
  tp::Graph with_untaken_if;
  tp::Graph without_if;

  Loops() {
    BENCH_CUDA(cudaMallocHost(&host_more, sizeof(bool)));
    BENCH_CUDA(cudaMemsetAsync(never.data(), 0, 1, stream));
    ours.capture([&](tp::StreamRef s) {
      ours.while_(more, [&](tp::StreamRef body) { count_down<<<1, 1, 0, body>>>(k.data(), more.data()); });
    }, {.stream = stream});
    build_raw();
    build_fused();
    with_untaken_if.capture([&](tp::StreamRef s) {
      touch<<<1, 1, 0, s>>>(counter.data());
      with_untaken_if.if_(never, [&](tp::StreamRef body) { touch<<<1, 1, 0, body>>>(counter.data()); });
    }, {.stream = stream});
    without_if.capture([&](tp::StreamRef s) { touch<<<1, 1, 0, s>>>(counter.data()); }, {.stream = stream});
  }

  // Adds a while node after `dependencies`; returns its body graph.
  static cudaGraph_t add_while_node(cudaGraph_t graph, cudaGraphConditionalHandle handle, const cudaGraphNode_t* dependencies,
                                    std::size_t count) {
    cudaGraphNode_t node = nullptr;
    cudaGraph_t body = nullptr;
    BENCH_CUDA(raw_nodes::add_conditional(&node, &body, graph, handle, cudaGraphCondTypeWhile, dependencies, count));
    return body;
  }

  // The same loop as while_ builds, node by node with the graph API: a set-handle kernel,
  // then the while node whose body is the loop kernel followed by a set-handle kernel.
  void build_raw() {
    BENCH_CUDA(cudaGraphCreate(&raw_graph, 0));
    cudaGraphConditionalHandle handle = 0;
    BENCH_CUDA(cudaGraphConditionalHandleCreate(&handle, raw_graph, 0, 0));
    const bool* more_ptr = more.data();
    int* k_ptr = k.data();
    bool* more_out = more.data();
    void* set_args[] = {&handle, &more_ptr};
    cudaKernelNodeParams set = raw_nodes::kernel_params(reinterpret_cast<void*>(&raw_set_handle), set_args);
    cudaGraphNode_t first = nullptr;
    BENCH_CUDA(cudaGraphAddKernelNode(&first, raw_graph, nullptr, 0, &set));
    cudaGraph_t body = add_while_node(raw_graph, handle, &first, 1);
    void* body_args[] = {&k_ptr, &more_out};
    cudaKernelNodeParams step = raw_nodes::kernel_params(reinterpret_cast<void*>(&count_down), body_args);
    cudaGraphNode_t step_node = nullptr;
    BENCH_CUDA(cudaGraphAddKernelNode(&step_node, body, nullptr, 0, &step));
    cudaGraphNode_t refresh = nullptr;
    BENCH_CUDA(cudaGraphAddKernelNode(&refresh, body, &step_node, 1, &set));
    BENCH_CUDA(cudaGraphInstantiate(&raw, raw_graph, 0));
  }

  // A loop fused by hand: one kernel per iteration that also sets the handle (a lower bound).
  void build_fused() {
    BENCH_CUDA(cudaGraphCreate(&fused_graph, 0));
    cudaGraphConditionalHandle handle = 0;
    BENCH_CUDA(cudaGraphConditionalHandleCreate(&handle, fused_graph, 1, cudaGraphCondAssignDefault));
    cudaGraph_t body = add_while_node(fused_graph, handle, nullptr, 0);
    int* k_ptr = k.data();
    void* args[] = {&handle, &k_ptr};
    cudaKernelNodeParams step = raw_nodes::kernel_params(reinterpret_cast<void*>(&count_down_fused), args);
    cudaGraphNode_t step_node = nullptr;
    BENCH_CUDA(cudaGraphAddKernelNode(&step_node, body, nullptr, 0, &step));
    BENCH_CUDA(cudaGraphInstantiate(&fused, fused_graph, 0));
  }

  void arm_loop(int iterations) { arm<<<1, 1, 0, stream>>>(k.data(), more.data(), iterations); }
};

Loops& loops() {
  static Loops l;
  return l;
}

void check_done(Loops& l) {
  int left = -1;
  BENCH_CUDA(cudaMemcpy(&left, l.k.data(), sizeof(int), cudaMemcpyDeviceToHost));
  if (left != 0) {
    std::fprintf(stderr, "loop ended with k = %d\n", left);
    std::exit(3);
  }
}

template <class Launch>
void device_loop(benchmark::State& state, Launch&& launch) {
  auto& l = loops();
  const int iterations = static_cast<int>(state.range(0));
  for (auto _ : state) {
    l.arm_loop(iterations);
    state.SetIterationTime(bench::device_seconds(l.stream, launch) / iterations);
  }
  check_done(l);
}

void while_ours(benchmark::State& state) {
  device_loop(state, [] { loops().ours.replay(loops().stream); });
}
void while_raw(benchmark::State& state) {
  device_loop(state, [] { BENCH_CUDA(cudaGraphLaunch(loops().raw, loops().stream)); });
}
void while_raw_fused(benchmark::State& state) {
  device_loop(state, [] { BENCH_CUDA(cudaGraphLaunch(loops().fused, loops().stream)); });
}

// The loop without conditional nodes: launch, read the flag back, decide on the host.
void host_loop(benchmark::State& state) {
  auto& l = loops();
  const int iterations = static_cast<int>(state.range(0));
  for (auto _ : state) {
    l.arm_loop(iterations);
    BENCH_CUDA(cudaStreamSynchronize(l.stream));
    const auto start = bench::Clock::now();
    do {
      count_down<<<1, 1, 0, l.stream>>>(l.k.data(), l.more.data());
      BENCH_CUDA(cudaMemcpyAsync(l.host_more, l.more.data(), sizeof(bool), cudaMemcpyDeviceToHost, l.stream));
      BENCH_CUDA(cudaStreamSynchronize(l.stream));
    } while (*l.host_more);
    state.SetIterationTime(bench::seconds_since(start) / iterations);
  }
  check_done(l);
}

constexpr int replays = 200;

// Device time of one replay of `graph`.
void replay_device_time(benchmark::State& state, tp::Graph& graph) {
  const cudaStream_t stream = loops().stream;
  for (auto _ : state)
    state.SetIterationTime(bench::device_seconds(stream, [&] {
                             for (int i = 0; i < replays; ++i) graph.replay(stream);
                           }) / replays);
}
void graph_with_untaken_if(benchmark::State& state) { replay_device_time(state, loops().with_untaken_if); }
void graph_without_if(benchmark::State& state) { replay_device_time(state, loops().without_if); }

// ---- the shapes of NVIDIA's conditional-node samples -------------------------------------------
// Each shape is built three ways from the same kernels:
//   raw             a graph built node by node (cudaGraphConditionalHandleCreate with
//                   cudaGraphCondAssignDefault, as Graph::conditional_handle makes them;
//                   cudaGraphAddNode of a conditional node; cudaGraphAddKernelNode into its
//                   bodies), compiled with the flags Graph uses; the sample's kernel sets the
//                   handle with cudaGraphSetConditional;
//   ours            Graph::capture, Graph::conditional_handle and if_ / if_else_ / switch_ /
//                   while_ on that handle: the sample's kernel sets it (ConditionalHandle::set),
//                   the library adds no kernel, so the graph has raw's nodes;
//   ours_predicate  the same kernel writes its decision to a one-element device tensor, and the
//                   library's tensor-predicate form copies it into the handle with a kernel of its
//                   own: one kernel node more per decision (per iteration for while_).
// Each shape has two benchmarks of paired, rotated measurements (bench::compare), whose counters
// raw_us, ours_us and ours_predicate_us give the ratios "tensorplay / raw":
//   sample_<shape>_device  device time per replay (per loop iteration for the loops): replays
//                          queued behind a spin kernel, so that the device runs them back to back
//                          without waiting for the host, timed with events around them;
//   sample_<shape>_submit  host time per cudaGraphLaunch / Graph::replay(stream), no sync, in
//                          batches of submit_batch (the device catches up between batches); also
//                          ours_native_us: ours's executable through cudaGraphLaunch, which tells
//                          replay()'s own host cost from the graph's.

constexpr int vector_size = 1024;  // the bodies' and the solver's vector
constexpr int block_threads = 256;
constexpr int vector_blocks = vector_size / block_threads;
constexpr int sample_replays = 200;       // replays per device measurement of if, if/else, switch
constexpr int do_while_iterations = 1000;  // the do-while's count, armed before each measurement
constexpr int solver_iterations = 100;     // the solver's iterations, read by its kernel on the device
constexpr int solver_replays = 4;          // replays per device measurement of the solver
constexpr int submit_batch = 64;           // replays per host submit measurement
constexpr long long spin_cycles = 3'000'000;  // ~1.5 ms at ~2 GHz: longer than queuing the replays

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Where a sample's kernel puts its decision: a conditional handle (CUDA's or tensorplay's), or the
// one-element tensor that the predicate form reads.
struct FlagOut {
  bool* flag;
};
struct IndexOut {
  int* index;
};
__device__ void decide_to(cudaGraphConditionalHandle handle, unsigned value) { cudaGraphSetConditional(handle, value); }
__device__ void decide_to(tp::ConditionalHandle handle, unsigned value) { handle.set(value); }
__device__ void decide_to(FlagOut out, unsigned value) { *out.flag = value != 0; }
__device__ void decide_to(IndexOut out, unsigned value) { *out.index = static_cast<int>(value); }

// if (simpleIfGraph): the body runs when x[0] > 0.
template <class Out>
__global__ void decide_positive(const int* x, Out out) {
  decide_to(out, *x > 0 ? 1u : 0u);
}
// if/else: else, then, else, then... (*tick counts the calls), so that both bodies run.
template <class Out>
__global__ void decide_alternate(int* tick, Out out) {
  decide_to(out, static_cast<unsigned>((*tick)++ & 1));
}
// switch: bodies 0, 1, 2, 0, 1, 2...
template <class Out>
__global__ void decide_cycle(int* tick, Out out) {
  decide_to(out, static_cast<unsigned>((*tick)++ % 3));
}
// A small body: y += by over the vector; counts its runs in *runs.
__global__ void shift(float* y, float by, int n, int* runs) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] += by;
  if (i == 0) *runs += 1;
}
__global__ void fill(float* x, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = value;
}

// do-while (simpleDoWhileGraph): the handle is 1 at every launch; the body counts down and sets it
// to 0 at the end. `more` is the predicate form's flag (its while_ tests it before the first
// iteration).
__global__ void arm_count(int* k, bool* more, int start) {
  *k = start;
  *more = true;
}
template <class Out>
__global__ void count_down_to_zero(int* k, Out out) {
  if (--*k <= 0) decide_to(out, 0u);
}

// The solver: Jacobi sweeps for -x[i-1] + 2 x[i] - x[i+1] = b[i] (x = 0 outside), two per
// iteration (x -> y -> x), then one block computes the residual's norm and decides, on the device,
// whether to go on: until *max_iterations iterations or a norm below `tolerance` (0 here: the
// count decides, so that every replay does the same work).
__global__ void solver_reset(float* x, float* y, int* iterations, bool* more, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    x[i] = 0;
    y[i] = 0;
  }
  if (i == 0) {
    *iterations = 0;
    *more = true;
  }
}
__global__ void jacobi_sweep(const float* in, float* out, const float* b, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float left = i > 0 ? in[i - 1] : 0.0f;
  const float right = i + 1 < n ? in[i + 1] : 0.0f;
  out[i] = 0.5f * (b[i] + left + right);
}
template <class Out>
__global__ void residual_and_decide(const float* x, const float* b, float* residual, int* iterations, const int* max_iterations,
                                    float tolerance, int n, Out out) {
  __shared__ float partial[block_threads];
  float sum = 0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
    const float left = i > 0 ? x[i - 1] : 0.0f;
    const float right = i + 1 < n ? x[i + 1] : 0.0f;
    const float r = b[i] - (2.0f * x[i] - left - right);
    sum += r * r;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float norm = sqrtf(partial[0]);
    *residual = norm;
    if (++*iterations >= *max_iterations || norm < tolerance) decide_to(out, 0u);
  }
}

// Adds a kernel node of `kernel` on `args` to `graph`, after `after`.
template <class... A>
cudaGraphNode_t add_kernel(cudaGraph_t graph, std::initializer_list<cudaGraphNode_t> after, dim3 grid, dim3 block, void (*kernel)(A...),
                           std::type_identity_t<A>... args) {
  void* params[] = {static_cast<void*>(&args)...};
  const cudaKernelNodeParams p = raw_nodes::kernel_params(reinterpret_cast<void*>(kernel), params, grid, block);
  cudaGraphNode_t node = nullptr;
  BENCH_CUDA(cudaGraphAddKernelNode(&node, graph, after.begin(), after.size(), &p));
  return node;
}

// A raw graph built node by node and its executable.
struct RawGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  RawGraph() { BENCH_CUDA(cudaGraphCreate(&graph, 0)); }
  RawGraph(const RawGraph&) = delete;
  RawGraph& operator=(const RawGraph&) = delete;
  ~RawGraph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }

  // A handle assigned `default_value` at every launch, as Graph::conditional_handle makes it.
  cudaGraphConditionalHandle handle(unsigned default_value) {
    cudaGraphConditionalHandle h = 0;
    BENCH_CUDA(cudaGraphConditionalHandleCreate(&h, graph, default_value, cudaGraphCondAssignDefault));
    return h;
  }
  // Compiled with the flags Graph uses (no memory nodes here: they change nothing).
  void compile() { BENCH_CUDA(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch)); }
};

// One sample, three ways.
struct Shape {
  const char* name;
  RawGraph raw;
  tp::Graph ours;
  tp::Graph ours_predicate;

  explicit Shape(const char* n) : name(n) {}

  // raw, ours, ours_predicate; with `native`, also ours_native: ours's executable launched with
  // cudaGraphLaunch (its graph without replay()'s own host work).
  std::vector<bench::Variant> variants(tp::StreamRef stream, bool native = false) {
    std::vector<bench::Variant> v{{"raw", [this, stream] { BENCH_CUDA(cudaGraphLaunch(raw.exec, stream)); }},
                                  {"ours", [this, stream] { ours.replay(stream); }},
                                  {"ours_predicate", [this, stream] { ours_predicate.replay(stream); }}};
    if (native) v.push_back({"ours_native", [this, stream] { BENCH_CUDA(cudaGraphLaunch(ours.native_exec(), stream)); }});
    return v;
  }
};

struct Samples {
  tp::Stream stream;
  tp::DeviceTensor<int> x{1, stream};     // if: the data its kernel decides on
  tp::DeviceTensor<int> tick{2, stream};  // if/else's and switch's call counts
  tp::DeviceTensor<int> runs{6, stream};  // runs of each body: if; then, else; case 0, 1, 2
  tp::DeviceTensor<float> y{vector_size, stream};
  tp::DeviceTensor<bool> flag{1, stream};  // the predicate forms' decision (if, if/else)
  tp::DeviceTensor<int> index{1, stream};  // the predicate form's switch index
  tp::DeviceTensor<int> k{1, stream};      // do-while
  tp::DeviceTensor<bool> more{1, stream};  // the predicate forms' loop flag
  tp::DeviceTensor<float> sx{vector_size, stream};
  tp::DeviceTensor<float> sy{vector_size, stream};
  tp::DeviceTensor<float> b{vector_size, stream};
  tp::DeviceTensor<float> residual{1, stream};
  tp::DeviceTensor<int> iterations{1, stream};
  tp::DeviceTensor<int> max_iterations{1, stream};
  Shape when{"if"};
  Shape either{"if/else"};
  Shape cases{"switch"};
  Shape do_while{"do-while"};
  Shape solver{"solver"};

  Samples() {
    BENCH_CUDA(cudaMemsetAsync(y.data(), 0, y.bytes(), stream));
    BENCH_CUDA(cudaMemsetAsync(runs.data(), 0, runs.bytes(), stream));
    BENCH_CUDA(cudaMemsetAsync(tick.data(), 0, tick.bytes(), stream));
    fill<<<vector_blocks, block_threads, 0, stream>>>(b.data(), 1.0f, vector_size);
    BENCH_CUDA(cudaGetLastError());
    put(x.data(), 1);
    put(max_iterations.data(), solver_iterations);
    build_if();
    build_if_else();
    build_switch();
    build_do_while();
    build_solver();
    for (Shape* s : {&when, &either, &cases, &do_while, &solver}) same_top_level(*s);
    check();
  }

  void put(int* at, int value) {
    BENCH_CUDA(cudaMemcpyAsync(at, &value, sizeof value, cudaMemcpyHostToDevice, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
  }
  int get(const int* at) {
    int value = 0;
    BENCH_CUDA(cudaMemcpyAsync(&value, at, sizeof value, cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    return value;
  }

  void build_if() {
    const int* x_ptr = x.data();
    float* y_ptr = y.data();
    int* runs_ptr = runs.data();
    RawGraph& raw = when.raw;
    const cudaGraphConditionalHandle h = raw.handle(0);
    const cudaGraphNode_t decide = add_kernel(raw.graph, {}, 1, 1, decide_positive<cudaGraphConditionalHandle>, x_ptr, h);
    cudaGraphNode_t node = nullptr;
    cudaGraph_t body = nullptr;
    BENCH_CUDA(raw_nodes::add_conditional(&node, &body, raw.graph, h, cudaGraphCondTypeIf, &decide, 1));
    add_kernel(body, {}, vector_blocks, block_threads, shift, y_ptr, 1.0f, vector_size, runs_ptr);
    raw.compile();

    tp::Graph& ours = when.ours;
    ours.capture([&](tp::StreamRef s) {
      const tp::ConditionalHandle handle = ours.conditional_handle();
      decide_positive<<<1, 1, 0, s>>>(x_ptr, handle);
      ours.if_(handle, [&](tp::StreamRef in) { shift<<<vector_blocks, block_threads, 0, in>>>(y_ptr, 1.0f, vector_size, runs_ptr); });
    }, {.stream = stream});

    tp::Graph& pred = when.ours_predicate;
    pred.capture([&](tp::StreamRef s) {
      decide_positive<<<1, 1, 0, s>>>(x_ptr, FlagOut{flag.data()});
      pred.if_(flag, [&](tp::StreamRef in) { shift<<<vector_blocks, block_threads, 0, in>>>(y_ptr, 1.0f, vector_size, runs_ptr); });
    }, {.stream = stream});
  }

  void build_if_else() {
    int* tick_ptr = tick.data();
    float* y_ptr = y.data();
    int* then_runs = runs.data() + 1;
    int* else_runs = runs.data() + 2;
    RawGraph& raw = either.raw;
    const cudaGraphConditionalHandle h = raw.handle(0);
    const cudaGraphNode_t decide = add_kernel(raw.graph, {}, 1, 1, decide_alternate<cudaGraphConditionalHandle>, tick_ptr, h);
    cudaGraphNode_t node = nullptr;
    cudaGraph_t bodies[2] = {};
    BENCH_CUDA(raw_nodes::add_conditional_bodies(&node, bodies, 2, raw.graph, h, cudaGraphCondTypeIf, &decide, 1));
    add_kernel(bodies[0], {}, vector_blocks, block_threads, shift, y_ptr, 1.0f, vector_size, then_runs);
    add_kernel(bodies[1], {}, vector_blocks, block_threads, shift, y_ptr, -1.0f, vector_size, else_runs);
    raw.compile();

    auto then_body = [&](tp::StreamRef in) { shift<<<vector_blocks, block_threads, 0, in>>>(y_ptr, 1.0f, vector_size, then_runs); };
    auto else_body = [&](tp::StreamRef in) { shift<<<vector_blocks, block_threads, 0, in>>>(y_ptr, -1.0f, vector_size, else_runs); };
    tp::Graph& ours = either.ours;
    ours.capture([&](tp::StreamRef s) {
      const tp::ConditionalHandle handle = ours.conditional_handle();
      decide_alternate<<<1, 1, 0, s>>>(tick_ptr, handle);
      ours.if_else_(handle, then_body, else_body);
    }, {.stream = stream});

    tp::Graph& pred = either.ours_predicate;
    pred.capture([&](tp::StreamRef s) {
      decide_alternate<<<1, 1, 0, s>>>(tick_ptr, FlagOut{flag.data()});
      pred.if_else_(flag, then_body, else_body);
    }, {.stream = stream});
  }

  void build_switch() {
    int* tick_ptr = tick.data() + 1;
    float* y_ptr = y.data();
    int* case_runs = runs.data() + 3;
    RawGraph& raw = cases.raw;
    const cudaGraphConditionalHandle h = raw.handle(0);
    const cudaGraphNode_t decide = add_kernel(raw.graph, {}, 1, 1, decide_cycle<cudaGraphConditionalHandle>, tick_ptr, h);
    cudaGraphNode_t node = nullptr;
    cudaGraph_t bodies[3] = {};
    BENCH_CUDA(raw_nodes::add_conditional_bodies(&node, bodies, 3, raw.graph, h, cudaGraphCondTypeSwitch, &decide, 1));
    for (int c = 0; c < 3; ++c)
      add_kernel(bodies[c], {}, vector_blocks, block_threads, shift, y_ptr, static_cast<float>(c + 1), vector_size, case_runs + c);
    raw.compile();

    auto body = [&](int c) {
      return [=](tp::StreamRef in) {
        shift<<<vector_blocks, block_threads, 0, in>>>(y_ptr, static_cast<float>(c + 1), vector_size, case_runs + c);
      };
    };
    tp::Graph& ours = cases.ours;
    ours.capture([&](tp::StreamRef s) {
      const tp::ConditionalHandle handle = ours.conditional_handle();
      decide_cycle<<<1, 1, 0, s>>>(tick_ptr, handle);
      ours.switch_(handle, body(0), body(1), body(2));
    }, {.stream = stream});

    tp::Graph& pred = cases.ours_predicate;
    pred.capture([&](tp::StreamRef s) {
      decide_cycle<<<1, 1, 0, s>>>(tick_ptr, IndexOut{index.data()});
      pred.switch_(index, body(0), body(1), body(2));
    }, {.stream = stream});
  }

  void build_do_while() {
    int* k_ptr = k.data();
    RawGraph& raw = do_while.raw;
    const cudaGraphConditionalHandle h = raw.handle(1);
    cudaGraphNode_t node = nullptr;
    cudaGraph_t body = nullptr;
    BENCH_CUDA(raw_nodes::add_conditional(&node, &body, raw.graph, h, cudaGraphCondTypeWhile, nullptr, 0));
    add_kernel(body, {}, 1, 1, count_down_to_zero<cudaGraphConditionalHandle>, k_ptr, h);
    raw.compile();

    tp::Graph& ours = do_while.ours;
    ours.capture([&](tp::StreamRef) {
      const tp::ConditionalHandle loop = ours.conditional_handle(1);
      ours.while_(loop, [&](tp::StreamRef in) { count_down_to_zero<<<1, 1, 0, in>>>(k_ptr, loop); });
    }, {.stream = stream});

    tp::Graph& pred = do_while.ours_predicate;
    pred.capture([&](tp::StreamRef) {
      pred.while_(more, [&](tp::StreamRef in) { count_down_to_zero<<<1, 1, 0, in>>>(k_ptr, FlagOut{more.data()}); });
    }, {.stream = stream});
  }

  void build_solver() {
    float* x_ptr = sx.data();
    float* y_ptr = sy.data();
    const float* b_ptr = b.data();
    float* residual_ptr = residual.data();
    int* iterations_ptr = iterations.data();
    const int* max_ptr = max_iterations.data();
    bool* more_ptr = more.data();
    const float tolerance = 0.0f;
    RawGraph& raw = solver.raw;
    const cudaGraphConditionalHandle h = raw.handle(1);
    const cudaGraphNode_t reset =
        add_kernel(raw.graph, {}, vector_blocks, block_threads, solver_reset, x_ptr, y_ptr, iterations_ptr, more_ptr, vector_size);
    cudaGraphNode_t node = nullptr;
    cudaGraph_t body = nullptr;
    BENCH_CUDA(raw_nodes::add_conditional(&node, &body, raw.graph, h, cudaGraphCondTypeWhile, &reset, 1));
    const cudaGraphNode_t first = add_kernel(body, {}, vector_blocks, block_threads, jacobi_sweep, x_ptr, y_ptr, b_ptr, vector_size);
    const cudaGraphNode_t second = add_kernel(body, {first}, vector_blocks, block_threads, jacobi_sweep, y_ptr, x_ptr, b_ptr, vector_size);
    add_kernel(body, {second}, 1, block_threads, residual_and_decide<cudaGraphConditionalHandle>, x_ptr, b_ptr, residual_ptr, iterations_ptr,
               max_ptr, tolerance, vector_size, h);
    raw.compile();

    auto sweeps = [&](tp::StreamRef in) {
      jacobi_sweep<<<vector_blocks, block_threads, 0, in>>>(x_ptr, y_ptr, b_ptr, vector_size);
      jacobi_sweep<<<vector_blocks, block_threads, 0, in>>>(y_ptr, x_ptr, b_ptr, vector_size);
    };
    tp::Graph& ours = solver.ours;
    ours.capture([&](tp::StreamRef s) {
      solver_reset<<<vector_blocks, block_threads, 0, s>>>(x_ptr, y_ptr, iterations_ptr, more_ptr, vector_size);
      const tp::ConditionalHandle loop = ours.conditional_handle(1);
      ours.while_(loop, [&](tp::StreamRef in) {
        sweeps(in);
        residual_and_decide<<<1, block_threads, 0, in>>>(x_ptr, b_ptr, residual_ptr, iterations_ptr, max_ptr, tolerance, vector_size, loop);
      });
    }, {.stream = stream});

    tp::Graph& pred = solver.ours_predicate;
    pred.capture([&](tp::StreamRef s) {
      solver_reset<<<vector_blocks, block_threads, 0, s>>>(x_ptr, y_ptr, iterations_ptr, more_ptr, vector_size);
      pred.while_(more, [&](tp::StreamRef in) {
        sweeps(in);
        residual_and_decide<<<1, block_threads, 0, in>>>(x_ptr, b_ptr, residual_ptr, iterations_ptr, max_ptr, tolerance, vector_size,
                                                         FlagOut{more_ptr});
      });
    }, {.stream = stream});
  }

  // The handle forms have raw's nodes at the top level (the library added no kernel); the
  // predicate forms one set-handle kernel more per conditional node.
  static void same_top_level(Shape& s) {
    std::size_t raw = 0;
    BENCH_CUDA(cudaGraphGetNodes(s.raw.graph, nullptr, &raw));
    const std::size_t ours = s.ours.node_count();
    if (ours != raw)
      std::fprintf(stderr, "warning: sample %s: tensorplay's graph has %zu nodes at its top level, the raw graph %zu\n", s.name, ours,
                   raw);
  }

  static void expect(const char* what, int got, int wanted) {
    if (got != wanted) {
      std::fprintf(stderr, "sample check failed: %s: %d, expected %d\n", what, got, wanted);
      std::exit(3);
    }
  }

  // Every graph does what its sample does (raw, ours and ours_predicate in turn).
  void check() {
    const tp::StreamRef s = stream;
    BENCH_CUDA(cudaMemsetAsync(runs.data(), 0, runs.bytes(), stream));
    BENCH_CUDA(cudaMemsetAsync(tick.data(), 0, tick.bytes(), stream));
    for (int value : {1, 0, 5}) {
      put(x.data(), value);
      for (auto& v : when.variants(s)) v.run();
    }
    put(x.data(), 1);  // the if's body runs in the benchmarks
    for (int i = 0; i < 2; ++i)
      for (auto& v : either.variants(s)) v.run();
    for (int i = 0; i < 3; ++i)
      for (auto& v : cases.variants(s)) v.run();
    std::vector<int> host(6);
    BENCH_CUDA(cudaMemcpyAsync(host.data(), runs.data(), runs.bytes(), cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    expect("if: body runs (x = 1, 0, 5; three graphs)", host[0], 6);
    expect("if/else: then runs", host[1], 3);
    expect("if/else: else runs", host[2], 3);
    for (int c = 0; c < 3; ++c) expect("switch: runs of one case", host[3 + c], 3);
    for (int start : {5, 1, 0}) {
      for (auto& v : do_while.variants(s)) {
        arm_count<<<1, 1, 0, stream>>>(k.data(), more.data(), start);
        v.run();
        expect("do-while: k after the loop", get(k.data()), start > 0 ? 0 : -1);  // a do-while runs at least once
      }
    }
    for (auto& v : solver.variants(s)) {
      v.run();
      expect("solver: iterations", get(iterations.data()), solver_iterations);
    }
  }
};

Samples& samples() {
  static Samples s;
  return s;
}

// Device seconds of `work`, queued behind a spin kernel: the device runs it back to back without
// waiting for the host (throughput, not submit latency).
template <class Work>
double queued_device_seconds(cudaStream_t stream, Work&& work) {
  spin<<<1, 1, 0, stream>>>(spin_cycles);
  BENCH_CUDA(cudaGetLastError());
  return bench::device_seconds(stream, work);
}

// A few untimed replays of every variant (`before` each, if given), then the device catches up.
void warm_up(const std::vector<bench::Variant>& variants, cudaStream_t stream, const std::function<void()>& before = {}) {
  for (int i = 0; i < 3; ++i)
    for (const bench::Variant& v : variants) {
      if (before) before();
      v.run();
    }
  BENCH_CUDA(cudaStreamSynchronize(stream));
}

// Device time per replay of a one-shot sample: sample_replays replays back to back.
void sample_device(benchmark::State& state, Shape Samples::*shape) {
  Samples& f = samples();
  const auto variants = (f.*shape).variants(f.stream);
  warm_up(variants, f.stream);
  bench::compare(state, variants, [&](const bench::Variant& v) {
    return queued_device_seconds(f.stream, [&] {
             for (int i = 0; i < sample_replays; ++i) v.run();
           }) /
           sample_replays;
  });
}

// Host time per replay call, no sync. The device work of a replay does not enter it (the batch
// is far from filling the launch queue); the loops run a short count here (see below).
void sample_submit(benchmark::State& state, Shape Samples::*shape) {
  Samples& f = samples();
  const auto variants = (f.*shape).variants(f.stream, true);
  warm_up(variants, f.stream);
  bench::compare_submit(state, submit_batch, variants);
}

void sample_if_device(benchmark::State& state) { sample_device(state, &Samples::when); }
void sample_if_submit(benchmark::State& state) { sample_submit(state, &Samples::when); }
void sample_if_else_device(benchmark::State& state) { sample_device(state, &Samples::either); }
void sample_if_else_submit(benchmark::State& state) { sample_submit(state, &Samples::either); }
void sample_switch_device(benchmark::State& state) { sample_device(state, &Samples::cases); }
void sample_switch_submit(benchmark::State& state) { sample_submit(state, &Samples::cases); }

// Device time per do-while iteration: armed to do_while_iterations before each measurement.
void sample_do_while_device(benchmark::State& state) {
  Samples& f = samples();
  const auto variants = f.do_while.variants(f.stream);
  auto arm = [&](int start) { arm_count<<<1, 1, 0, f.stream>>>(f.k.data(), f.more.data(), start); };
  warm_up(variants, f.stream, [&] { arm(10); });
  bench::compare(state, variants, [&](const bench::Variant& v) {
    arm(do_while_iterations);
    return queued_device_seconds(f.stream, v.run) / do_while_iterations;
  });
  Samples::expect("do-while: k after the benchmark", f.get(f.k.data()), 0);
}
// Host submit of the do-while, not armed: each replay runs one iteration (k is already <= 0;
// the predicate form none once its flag is false).
void sample_do_while_submit(benchmark::State& state) {
  Samples& f = samples();
  arm_count<<<1, 1, 0, f.stream>>>(f.k.data(), f.more.data(), 0);
  sample_submit(state, &Samples::do_while);
}

// Device time per solver iteration (three kernels): solver_replays replays of solver_iterations.
void sample_solver_device(benchmark::State& state) {
  Samples& f = samples();
  f.put(f.max_iterations.data(), solver_iterations);
  const auto variants = f.solver.variants(f.stream);
  warm_up(variants, f.stream);
  bench::compare(state, variants, [&](const bench::Variant& v) {
    return queued_device_seconds(f.stream, [&] {
             for (int i = 0; i < solver_replays; ++i) v.run();
           }) /
           (solver_replays * solver_iterations);
  });
  Samples::expect("solver: iterations after the benchmark", f.get(f.iterations.data()), solver_iterations);
}
// Host submit of the solver's graph, its count set to 1 on the device (same graph, less work to
// drain between batches).
void sample_solver_submit(benchmark::State& state) {
  Samples& f = samples();
  f.put(f.max_iterations.data(), 1);
  sample_submit(state, &Samples::solver);
  f.put(f.max_iterations.data(), solver_iterations);
}

struct SampleBench {
  const char* shape;  // benchmark names: sample_<shape>_device, sample_<shape>_submit
  const char* label;  // in the table
  const char* per;    // what a device figure is per: "replay" or "iter" (loop iteration)
  void (*device)(benchmark::State&);
  void (*submit)(benchmark::State&);
  int device_iterations;
};
const SampleBench sample_benches[] = {
    {"if", "if", "replay", sample_if_device, sample_if_submit, 20},
    {"if_else", "if/else", "replay", sample_if_else_device, sample_if_else_submit, 20},
    {"switch", "switch (3 bodies)", "replay", sample_switch_device, sample_switch_submit, 20},
    {"do_while", "do-while (1000 it.)", "iter", sample_do_while_device, sample_do_while_submit, 10},
    {"solver", "solver (100 x 3 kernels)", "iter", sample_solver_device, sample_solver_submit, 10},
};

void register_samples() {
  for (const SampleBench& b : sample_benches) {
    const std::string name = std::string("sample_") + b.shape;
    benchmark::RegisterBenchmark((name + "_device").c_str(), b.device)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(b.device_iterations);
    benchmark::RegisterBenchmark((name + "_submit").c_str(), b.submit)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(100);
  }
}

// The rows of one sample: device and host submit, tensorplay (user-set handle) / raw with the
// target, and the tensor-predicate form beside them.
void sample_rows(bench::MedianReporter& r, std::vector<bench::Row>& rows, const SampleBench& b) {
  const std::string name = std::string("sample_") + b.shape;
  const std::string label = b.label;
  for (const char* what : {"device", "submit"}) {
    const std::string bench_name = name + "_" + what + ":";
    const double raw = r.us(bench_name + "raw");
    const double ours = r.us(bench_name + "ours");
    const double pred = r.us(bench_name + "ours_predicate");
    const bool device = std::string(what) == "device";
    const std::string kind = device ? std::string("device/") + b.per : std::string("submit");
    rows.push_back({label + ": raw graph, " + kind, raw, "us", ""});
    rows.push_back({label + ": tensorplay, handle, " + kind, ours, "us", "(the sample's kernel sets it)"});
    rows.push_back(bench::ratio_row(label + ": tensorplay / raw, " + what, ours, raw, 1.02));
    rows.push_back({label + ": tensor predicate, " + kind, pred, "us", ""});
    rows.push_back({label + ": tensor predicate / raw, " + what, pred / raw, "x", "(plus the library's set-handle kernel)"});
    if (!device)
      rows.push_back({label + ": native exec / raw, submit", r.us(bench_name + "ours_native") / raw, "x",
                      "(the graph alone, without replay())"});
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (long n : {10L, 1000L}) {
    benchmark::RegisterBenchmark("while_ours", while_ours)->Arg(n)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
    benchmark::RegisterBenchmark("while_raw", while_raw)->Arg(n)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
    benchmark::RegisterBenchmark("while_raw_fused", while_raw_fused)->Arg(n)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(10);
    benchmark::RegisterBenchmark("host_loop", host_loop)->Arg(n)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(5);
  }
  benchmark::RegisterBenchmark("graph_with_untaken_if", graph_with_untaken_if)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  benchmark::RegisterBenchmark("graph_without_if", graph_without_if)->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(20);
  register_samples();
  const char* title = "bench/conditionals (medians; device time per loop iteration or replay; host submit per replay)";
  return bench::run_table(argc, argv, title, [](bench::MedianReporter& r, std::vector<bench::Row>& rows) {
    for (long n : {10L, 1000L}) {
      const std::string arg = "/" + std::to_string(n);
      const std::string label = std::to_string(n) + " iterations";
      const double ours = r.medians["while_ours" + arg];
      const double raw = r.medians["while_raw" + arg];
      const double fused = r.medians["while_raw_fused" + arg];
      const double host = r.medians["host_loop" + arg];
      rows.push_back({label + ": while_ per iteration", ours, "us", ""});
      rows.push_back({label + ": raw while node (same nodes) per iteration", raw, "us", ""});
      rows.push_back(bench::ratio_row(label + ": while_ / raw while node", ours, raw, 1.05));
      rows.push_back({label + ": raw while node, body fused by hand", fused, "us", "(lower bound, one kernel per iteration)"});
      rows.push_back({label + ": host-driven loop per iteration", host, "us", ""});
      rows.push_back({label + ": host loop / while_ (speed-up)", host / ours, "x",
                      n == 1000 ? bench::verdict(host / ours, 2.4, false) : ""});
    }
    const double with_if = r.medians["graph_with_untaken_if"];
    const double without = r.medians["graph_without_if"];
    rows.push_back({"1-kernel graph replay, device time", without, "us", ""});
    rows.push_back({"same graph plus an if node not taken", with_if, "us", ""});
    rows.push_back({"cost of the untaken if node", with_if - without, "us", ""});
    for (const SampleBench& b : sample_benches) sample_rows(r, rows, b);
  });
}
