// tools/probes/cond_threads_raw.cu: pairs_test's conditionals_on_six_threads in raw CUDA, without
// tensorplay's host code, to tell whether its cudaErrorIllegalAddress under compute-sanitizer
// (racecheck alone now and then; memcheck or racecheck side by side most of the time:
// docs/reliability.md, sections 14 and 20) comes from the library or from the tool.
//
// The same work, made with the calls tensorplay makes for it:
//   - six threads, each with its own stream and body stream, 20 rounds, in thread-local capture mode;
//   - each thread's graph: a while node (add 1 to x, count down), a switch node of three bodies
//     (y = x, y = x + 10 through a temporary, y = x + 20) and an if/else node (z = y + 1, z = y - 1
//     through a temporary); the handles set by tensorplay's own set-handle kernels (b8, i32) taken
//     from its kernel image; the while body's own set-handle kernel follows the count-down kernel
//     through a programmatic edge (as tensorplay captures it on compute capability 9.0);
//   - each body captured in a capture of its own on the body stream, then copied node by node
//     into the node's body graph (raw_graph.hpp);
//   - the temporaries come from a 2 MiB segment cudaMalloc'd, in relaxed capture mode, by the
//     first body that needs one (the graph's private pool), and that segment is cudaFree'd when
//     the graph is captured again (every fifth round), or, while any thread has a capture open,
//     once none has (tensorplay's CaptureRegistry::release_segments);
//   - instantiated with auto-free-on-launch and uploaded on the capture's stream;
//   - every thread's x, y, z, counter, flags and index carved from one shared cudaMalloc'd
//     segment (tensorplay's default pool); every result checked on the host each round.
//
//   nvcc -std=c++20 -O2 -arch=sm_90 -I. -o cond_threads_raw tools/probes/cond_threads_raw.cu
//   compute-sanitizer --tool memcheck ./cond_threads_raw [ROUNDS [FEATURES]]
//
// FEATURES, comma-separated, each taking one ingredient out:
//   nopdl     the while body's set-handle kernel without the programmatic edge
//   kept      each thread's segment kept across its re-captures (no cudaFree while others replay)
//   nowhile, noswitch, noif   that node left out (its outputs keep their fill)
//   notemp    the temporaries' bodies write straight to their output (no segment at all)
//   tograph   bodies captured straight into the node's body graph (cudaStreamBeginCaptureToGraph)
//   threadsN  N threads (1 to 9) instead of 6
//   ownset    the probe's own set-handle kernels instead of tensorplay's (no cudaLibraryLoadData)
//   nocond    the control: no conditional node at all; the graph computes y = x, z = x + 1
// Prints "ok" and exits 0, or names the failed call or value and exits 1.
#include "raw_graph.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

constexpr int n = 4096;
constexpr std::size_t segment_bytes = 2u << 20;

__global__ void add_into(const int* x, int* y, int count, int value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) y[i] = x[i] + value;
}
__global__ void iota(int* x, int count, int base) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) x[i] = base + i;
}
__global__ void fill(int* x, int count, int value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) x[i] = value;
}
__global__ void set_int(int* p, int v) { *p = v; }
__global__ void set_flag(bool* p, bool v) { *p = v; }
__global__ void count_down(int* counter, bool* more) { *more = --*counter > 0; }
// The probe's own set-handle kernels ("ownset"), in its own module, for tensorplay's.
__global__ void own_set_b8(cudaGraphConditionalHandle handle, const bool* value) {
  cudaGridDependencySynchronize();
  cudaGraphSetConditional(handle, *value ? 1u : 0u);
}
__global__ void own_set_i32(cudaGraphConditionalHandle handle, const int* value) {
  cudaGridDependencySynchronize();
  cudaGraphSetConditional(handle, static_cast<unsigned>(*value));
}

namespace {

bool programmatic = true;   // without "nopdl"
bool keep_segment = false;  // "kept"
bool with_while = true, with_switch = true, with_if = true;  // without "nowhile", "noswitch", "noif"
bool temporaries = true;    // without "notemp"
bool copied_bodies = true;  // without "tograph"
bool conditionals = true;   // without "nocond"
int threads = 6;            // "threads1" .. "threads9"
cudaKernel_t set_b8 = nullptr, set_i32 = nullptr;
std::atomic<int> failures{0};

void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  failures.fetch_add(1);
}

//! The captures open in the process, and the segments whose cudaFree waits for none to be.
struct Registry {
  std::mutex mutex;
  int open = 0;
  std::vector<void*> waiting;

  void opened() {
    std::lock_guard lock(mutex);
    ++open;
  }
  void closed() {
    {
      std::lock_guard lock(mutex);
      --open;
    }
    release();
  }
  void retire(void* segment) {
    {
      std::lock_guard lock(mutex);
      waiting.push_back(segment);
    }
    release();
  }
  //! As CaptureRegistry::release_segments: checks under the lock, frees outside it.
  void release() {
    std::vector<void*> now;
    {
      std::lock_guard lock(mutex);
      if (open != 0) return;
      now.swap(waiting);
    }
    for (void* p : now) CHECK(cudaFree(p));
  }
};
Registry registry;

void set_kernel(cudaStream_t s, cudaKernel_t kernel, cudaGraphConditionalHandle handle, const void* value, bool pdl) {
  void* args[] = {&handle, &value};
  raw::launch_one_thread(s, reinterpret_cast<const void*>(kernel), args, pdl);
}

//! One thread's graph and the memory its bodies' temporaries come from.
struct ThreadGraph {
  cudaStream_t stream = nullptr;
  cudaStream_t body_stream = nullptr;
  int* x = nullptr;
  int* y = nullptr;
  int* z = nullptr;
  int* counter = nullptr;
  bool* more = nullptr;
  int* index = nullptr;
  bool* flag = nullptr;
  void* segment = nullptr;  // the private pool's one segment, made by the first temporary
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  //! A temporary of the capture's pool: the segment, made now if the pool has none (in relaxed
  //! mode, as tensorplay's cudaMalloc of a segment during a capture).
  int* temporary() {
    if (segment == nullptr) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      CHECK(cudaMalloc(&segment, segment_bytes));
      CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    }
    return static_cast<int*>(segment);
  }

  //! Adds a conditional node of `type` with `size` bodies after the set-handle kernel, at the
  //! current point of the capture; body(i) captures body i on the body stream.
  template <class Body>
  void conditional(cudaGraphConditionalNodeType type, unsigned size, cudaKernel_t kernel, const void* value, Body body) {
    cudaStreamCaptureStatus status{};
    cudaGraph_t g = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    std::size_t count = 0;
    CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, &g, &deps, nullptr, &count));
    cudaGraphConditionalHandle handle{};
    CHECK(cudaGraphConditionalHandleCreate(&handle, g, 0, 0));
    set_kernel(stream, kernel, handle, value, false);  // follows a conditional node or nothing
    CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, &g, &deps, nullptr, &count));
    cudaGraphNodeParams params{};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = type;
    params.conditional.size = size;
    cudaGraphNode_t node = nullptr;
    CHECK(cudaGraphAddNode(&node, g, deps, nullptr, count, &params));
    CHECK(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    for (unsigned i = 0; i < size; ++i) {
      if (copied_bodies)
        CHECK(cudaStreamBeginCapture(body_stream, cudaStreamCaptureModeThreadLocal));
      else
        CHECK(cudaStreamBeginCaptureToGraph(body_stream, params.conditional.phGraph_out[i], nullptr, nullptr, 0,
                                            cudaStreamCaptureModeThreadLocal));
      registry.opened();
      body(i, handle);
      cudaGraph_t captured = nullptr;
      CHECK(cudaStreamEndCapture(body_stream, &captured));
      registry.closed();
      if (copied_bodies) {
        raw::copy_body(captured, params.conditional.phGraph_out[i]);
        CHECK(cudaGraphDestroy(captured));
      }
    }
  }

  void through_temporary(const int* from, int* to, int value) {
    if (!temporaries) {
      add_into<<<8, 256, 0, body_stream>>>(from, to, n, value);
      return;
    }
    int* t = temporary();
    add_into<<<8, 256, 0, body_stream>>>(from, t, n, value);
    add_into<<<8, 256, 0, body_stream>>>(t, to, n, 0);
  }

  void capture() {
    if (exec != nullptr) {  // Graph::reset: the executable, its graph, then its pool's segment
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
      if (!keep_segment && segment != nullptr) {
        registry.retire(segment);
        segment = nullptr;
      }
    }
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    registry.opened();
    if (!conditionals) {  // the control: y = x, z = x + 1 by kernels of the graph itself
      add_into<<<8, 256, 0, stream>>>(x, y, n, 0);
      add_into<<<8, 256, 0, stream>>>(y, z, n, 1);
    }
    if (with_while && conditionals) {
      conditional(cudaGraphCondTypeWhile, 1, set_b8, more, [&](unsigned, cudaGraphConditionalHandle handle) {
        add_into<<<8, 256, 0, body_stream>>>(x, x, n, 1);
        count_down<<<1, 1, 0, body_stream>>>(counter, more);
        set_kernel(body_stream, set_b8, handle, more, programmatic);  // follows one kernel
      });
    }
    if (with_switch && conditionals) {
      conditional(cudaGraphCondTypeSwitch, 3, set_i32, index, [&](unsigned i, cudaGraphConditionalHandle) {
        if (i == 1)
          through_temporary(x, y, 10);
        else
          add_into<<<8, 256, 0, body_stream>>>(x, y, n, i == 0 ? 0 : 20);
      });
    }
    if (with_if && conditionals) {
      conditional(cudaGraphCondTypeIf, 2, set_b8, flag, [&](unsigned i, cudaGraphConditionalHandle) {
        if (i == 0)
          add_into<<<8, 256, 0, body_stream>>>(y, z, n, 1);
        else
          through_temporary(y, z, -1);
      });
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    registry.closed();
    cudaGraphInstantiateParams params{};
    params.flags = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload;
    params.uploadStream = stream;
    CHECK(cudaGraphInstantiateWithParams(&exec, graph, &params));
  }

  std::vector<int> host(const int* p) const {
    std::vector<int> out(n);
    CHECK(cudaMemcpyAsync(out.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    return out;
  }
};

void worker(int t, int rounds, char* memory) {
  ThreadGraph g;
  CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&g.body_stream, cudaStreamNonBlocking));
  char* mine = memory + static_cast<std::size_t>(t) * (4 * n * sizeof(int));
  g.x = reinterpret_cast<int*>(mine);
  g.y = g.x + n;
  g.z = g.y + n;
  g.counter = g.z + n;
  g.index = g.counter + 1;
  g.more = reinterpret_cast<bool*>(g.index + 1);
  g.flag = g.more + 4;
  for (int round = 0; round < rounds && failures.load() == 0; ++round) {
    if (round % 5 == 0) g.capture();
    const int k = (t + round) % 5;
    const int which = round % 4;  // 3: no body runs, y keeps -5
    const bool then_branch = round % 2 == 0;
    const int base = 1000 * t + round;
    iota<<<8, 256, 0, g.stream>>>(g.x, n, base);
    fill<<<8, 256, 0, g.stream>>>(g.y, n, -5);
    fill<<<8, 256, 0, g.stream>>>(g.z, n, -7);
    set_int<<<1, 1, 0, g.stream>>>(g.counter, k);
    set_flag<<<1, 1, 0, g.stream>>>(g.more, k > 0);
    set_int<<<1, 1, 0, g.stream>>>(g.index, which);
    set_flag<<<1, 1, 0, g.stream>>>(g.flag, then_branch);
    CHECK(cudaGetLastError());
    CHECK(cudaGraphLaunch(g.exec, g.stream));
    const std::vector<int> x = g.host(g.x), y = g.host(g.y), z = g.host(g.z);
    for (int i = 0; i < n; ++i) {
      const int xw = base + i + (with_while && conditionals ? k : 0);
      const int yw = !conditionals ? xw : which == 3 || !with_switch ? -5 : xw + 10 * which;
      const int zw = !conditionals ? xw + 1 : with_if ? yw + (then_branch ? 1 : -1) : -7;
      if (x[i] != xw || y[i] != yw || z[i] != zw) {
        fail("thread " + std::to_string(t) + ", round " + std::to_string(round) + ", element " + std::to_string(i) + ": x " +
             std::to_string(x[i]) + "/" + std::to_string(xw) + ", y " + std::to_string(y[i]) + "/" + std::to_string(yw) + ", z " +
             std::to_string(z[i]) + "/" + std::to_string(zw));
        break;
      }
    }
  }
  CHECK(cudaStreamSynchronize(g.stream));
  CHECK(cudaGraphExecDestroy(g.exec));
  CHECK(cudaGraphDestroy(g.graph));
  if (g.segment != nullptr) registry.retire(g.segment);
  CHECK(cudaStreamDestroy(g.body_stream));
  CHECK(cudaStreamDestroy(g.stream));
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string features = argc > 2 ? argv[2] : "";
  const auto has = [&](const char* f) { return features.find(f) != std::string::npos; };
  programmatic = !has("nopdl");
  keep_segment = has("kept");
  with_while = !has("nowhile");
  with_switch = !has("noswitch");
  with_if = !has("noif");
  temporaries = !has("notemp");
  copied_bodies = !has("tograph");
  conditionals = !has("nocond");
  if (const std::size_t at = features.find("threads"); at != std::string::npos) threads = features[at + 7] - '0';
  CHECK(cudaFree(nullptr));
  {  // load every kernel first: under lazy loading a first load invalidates open captures
    cudaFuncAttributes attributes{};
    for (const void* kernel : {reinterpret_cast<const void*>(add_into), reinterpret_cast<const void*>(iota),
                               reinterpret_cast<const void*>(fill), reinterpret_cast<const void*>(set_int),
                               reinterpret_cast<const void*>(set_flag), reinterpret_cast<const void*>(count_down)})
      CHECK(cudaFuncGetAttributes(&attributes, kernel));
  }
  if (has("ownset")) {
    CHECK(cudaGetKernel(&set_b8, own_set_b8));
    CHECK(cudaGetKernel(&set_i32, own_set_i32));
    cudaFuncAttributes attributes{};
    CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(set_b8)));
    CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(set_i32)));
  } else {
    set_b8 = raw::library_kernel("tensorplay_set_handle_b8");
    set_i32 = raw::library_kernel("tensorplay_set_handle_i32");
  }
  (void)raw::driver();
  char* memory = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&memory), segment_bytes));
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) running.emplace_back(worker, t, rounds, memory);
  for (std::thread& t : running) t.join();
  registry.release();
  CHECK(cudaFree(memory));
  std::printf("%d threads x %d rounds (%s), %d failures\n", threads, rounds, features.c_str(), failures.load());
  if (failures.load() != 0) return 1;
  std::printf("ok\n");
  return 0;
}
