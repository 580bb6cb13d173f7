// bench/conditionals: per-iteration cost of Graph::while_ against a raw while node built by
// hand in this binary and against a host-driven loop; the cost of an if node not taken.
#include "bench_util.hpp"
#include "raw_nodes.cuh"

#include <tensorplay/graph.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
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
  const char* title = "bench/conditionals (medians; device time per loop iteration or replay)";
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
  });
}
