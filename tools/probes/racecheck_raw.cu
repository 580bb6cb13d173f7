// tools/probes/racecheck_raw.cu: thread_test's eight-thread case in raw CUDA, without tensorplay,
// to tell whether compute-sanitizer racecheck's "failure to track a kernel launch" comes from the
// library or from the tool (docs/reliability.md, section 13).
//
// The same workload as thread_test's eight_threads_capture_in_thread_local_mode_while_others_
// replay_and_allocate: 8 threads capture in thread-local mode (graph allocations freed inside
// the capture and kept past it, a while node whose body is captured with
// cudaStreamBeginCaptureToGraph), instantiate, launch, check and destroy, in a loop; 2 threads
// replay graphs of their own; 2 threads allocate from the default pool and launch kernels.
// Every result is checked on the host. Prints "ok" and exits 0, or names the failed call.
//
//   nvcc -std=c++20 -arch=sm_90 -I. -o racecheck_raw tools/probes/racecheck_raw.cu   (from the repository root)
//   compute-sanitizer --tool racecheck ./racecheck_raw [CAPTURES_PER_THREAD [EXIT_AFTER_S [FEATURES]]]
//
// EXIT_AFTER_S > 0 ends the process with std::_Exit(3) after that many seconds, while the threads
// still capture and launch: what thread_test's wait_all does when a case passes its deadline.
// FEATURES, comma-separated, bring the twin closer to what tensorplay does in that case:
//   pdl  each set-condition kernel is captured as tensorplay captures its set-handle kernels after
//        a single kernel: with cudaLaunchAttributeProgrammaticStreamSerialization (a programmatic
//        edge), the kernel waiting with cudaGridDependencySynchronize. Without it, a plain launch
//        (the kernel's wait is then a no-op).
//   if   a third of the captures add an if node on a per-thread bool flag (as thread_test's
//        if_(flag, ...)), its handle set by tensorplay's own kernel tensorplay_set_handle_b8, taken
//        from the library's generated fatbin (tensorplay/detail/kernels/fatbin.hpp, decoded by
//        the library's decode_base64; no other tensorplay code runs), loaded with
//        cudaLibraryLoadData and launched by its cudaKernel_t; another third add the while node (without "if": half of them).
//   copy each body is captured as tensorplay captures it (conditional_builder.hpp): a capture of its
//        own on the body stream (cudaStreamBeginCapture, not ...ToGraph), whose nodes are then
//        copied into the node's body graph, kernels through the driver (cuGraphKernelNodeGetParams
//        and cuGraphAddKernelNode, then cudaGraphKernelNodeCopyAttributes), edges with their data.
#include "raw_graph.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

__global__ void affine(const unsigned* x, unsigned* y, int n, unsigned a, unsigned b) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = a * x[i] + b;
}
__global__ void add(unsigned* x, int n, unsigned v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] += v;
}
__global__ void store(int* counter, int v) { *counter = v; }
__global__ void decrement(int* counter) { --*counter; }
__global__ void set_while(cudaGraphConditionalHandle handle, const int* counter) {
  cudaGridDependencySynchronize();
  cudaGraphSetConditional(handle, *counter > 0 ? 1u : 0u);
}

namespace {

bool programmatic = false;  // "pdl": set kernels follow their kernel through a programmatic edge
bool with_if_nodes = false;  // "if"
bool copied_bodies = false;  // "copy"
cudaKernel_t library_set_bool = nullptr;  // tensorplay_set_handle_b8, loaded by load_library_kernel

//! A one-thread launch of `kernel` on `s`, with a programmatic edge in "pdl" mode.
void launch_set_kernel(cudaStream_t s, const void* kernel, void** args) { raw::launch_one_thread(s, kernel, args, programmatic); }

void launch_set_while(cudaStream_t s, cudaGraphConditionalHandle handle, const int* counter) {
  void* args[] = {&handle, &counter};
  launch_set_kernel(s, reinterpret_cast<const void*>(set_while), args);
}

//! Takes tensorplay's bool set-handle kernel from its kernel image.
void load_library_kernel() { library_set_bool = raw::library_kernel("tensorplay_set_handle_b8"); }

//! A conditional node being captured: its handle, the node, the stream capturing its body, and
//! the node's body graph.
struct Conditional {
  cudaGraphConditionalHandle handle{};
  cudaGraphNode_t node = nullptr;
  cudaStream_t body_stream = nullptr;
  cudaGraph_t body = nullptr;
};

//! At the current point of the capture on `s`: creates a handle, captures `launch_set(handle)`
//! (the kernel that sets it), adds a conditional node of `type` after it, and begins capturing
//! the node's body on `body_stream`. end_conditional ends the body.
template <class LaunchSet>
Conditional begin_conditional(cudaStream_t s, cudaStream_t body_stream, cudaGraphConditionalNodeType type, LaunchSet launch_set) {
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t count = 0;
  Conditional c;
  c.body_stream = body_stream;
  CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &count));
  CHECK(cudaGraphConditionalHandleCreate(&c.handle, graph, 0, 0));
  launch_set(c.handle);
  CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &count));
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = c.handle;
  params.conditional.type = type;
  params.conditional.size = 1;
  CHECK(cudaGraphAddNode(&c.node, graph, deps, nullptr, count, &params));
  c.body = params.conditional.phGraph_out[0];
  if (copied_bodies)
    CHECK(cudaStreamBeginCapture(body_stream, cudaStreamCaptureModeThreadLocal));
  else
    CHECK(cudaStreamBeginCaptureToGraph(body_stream, c.body, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal));
  return c;
}

//! Ends the body's capture; the node becomes the point where the capture on `s` goes on.
void end_conditional(cudaStream_t s, Conditional c) {
  cudaGraph_t body = nullptr;
  CHECK(cudaStreamEndCapture(c.body_stream, &body));
  if (copied_bodies) {
    raw::copy_body(body, c.body);
    CHECK(cudaGraphDestroy(body));
  }
  CHECK(cudaStreamUpdateCaptureDependencies(s, &c.node, nullptr, 1, cudaStreamSetCaptureDependencies));
}

//! Adds an if node whose handle the library's kernel sets from *flag (after the kernel just
//! captured); its body adds 1 to out.
void capture_if(cudaStream_t s, cudaStream_t body_stream, const bool* flag, unsigned* out, int n) {
  const Conditional c = begin_conditional(s, body_stream, cudaGraphCondTypeIf, [&](cudaGraphConditionalHandle handle) {
    void* args[] = {&handle, &flag};
    launch_set_kernel(s, reinterpret_cast<const void*>(library_set_bool), args);
  });
  add<<<1, 256, 0, body_stream>>>(out, n, 1u);
  end_conditional(s, c);
}

std::vector<unsigned> download(const unsigned* device, int n, cudaStream_t s) {
  std::vector<unsigned> host(static_cast<std::size_t>(n));
  CHECK(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  return host;
}

//! One capture of thread_test's body: temp = a*x+b; out = c*temp+d (kept); with `flag`, an if node
//! adding 1 to out when *flag; with `with_while`, a while node adding 1 to out `loops` times. Returns the instantiated graph; *out_ptr is the graph's allocation.
cudaGraphExec_t capture_one(cudaStream_t s, cudaStream_t body_stream, const unsigned* x, int n, int* counter, unsigned a,
                            unsigned b, unsigned c, unsigned d, int loops, bool with_while, const bool* flag,
                            unsigned** out_ptr) {
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  unsigned* temp = nullptr;
  unsigned* out = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&temp), n * sizeof(unsigned), s));
  affine<<<1, 256, 0, s>>>(x, temp, n, a, b);
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&out), n * sizeof(unsigned), s));
  affine<<<1, 256, 0, s>>>(temp, out, n, c, d);
  if (flag != nullptr) capture_if(s, body_stream, flag, out, n);
  CHECK(cudaFreeAsync(temp, s));
  if (with_while) {
    store<<<1, 1, 0, s>>>(counter, loops);
    const Conditional loop = begin_conditional(s, body_stream, cudaGraphCondTypeWhile, [&](cudaGraphConditionalHandle handle) {
      launch_set_while(s, handle, counter);  // follows the store kernel
    });
    add<<<1, 256, 0, body_stream>>>(out, n, 1u);
    decrement<<<1, 1, 0, body_stream>>>(counter);
    launch_set_while(body_stream, loop.handle, counter);  // follows the decrement kernel
    end_conditional(s, loop);
  }
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  *out_ptr = out;
  return exec;
}

std::atomic<int> failures{0};
std::atomic<int> captured{0};  // captures finished, all threads: the watchdog's progress line

void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  failures.fetch_add(1);
}

void capture_worker(int id, int captures) {
  cudaStream_t s = nullptr, body = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&body, cudaStreamNonBlocking));
  const int n = 200 + 37 * id;
  unsigned* x = nullptr;
  int* counter = nullptr;
  bool* flag = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(unsigned)));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(int)));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&flag), sizeof(bool)));
  std::vector<unsigned> host_x(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) host_x[static_cast<std::size_t>(i)] = static_cast<unsigned>(i * 7 + id);
  CHECK(cudaMemcpy(x, host_x.data(), host_x.size() * sizeof(unsigned), cudaMemcpyHostToDevice));
  std::mt19937 rng(static_cast<unsigned>(1000 + id));
  for (int k = 0; k < captures; ++k) {
    const unsigned a = rng() % 7 + 1, b = rng(), c = rng() % 5 + 1, d = rng();
    const int loops = static_cast<int>(rng() % 4);
    // Without "if": half the captures have a while node. With it, as thread_test: plain, if, while.
    const unsigned shape = with_if_nodes ? rng() % 3 : (rng() % 2 == 1 ? 2u : 0u);
    const bool with_while = shape == 2;
    const bool taken = with_if_nodes && rng() % 2 == 1;
    unsigned* out = nullptr;
    cudaGraphExec_t exec = capture_one(s, body, x, n, counter, a, b, c, d, loops, with_while, shape == 1 ? flag : nullptr, &out);
    CHECK(cudaMemcpyAsync(flag, &taken, sizeof(bool), cudaMemcpyHostToDevice, s));
    CHECK(cudaGraphLaunch(exec, s));
    const std::vector<unsigned> got = download(out, n, s);
    for (int i = 0; i < n; ++i) {
      const unsigned want = c * (a * host_x[static_cast<std::size_t>(i)] + b) + d + (with_while ? static_cast<unsigned>(loops) : 0u) +
                           (shape == 1 && taken ? 1u : 0u);
      if (got[static_cast<std::size_t>(i)] != want) {
        fail("capture thread " + std::to_string(id) + ", capture " + std::to_string(k) + ", element " + std::to_string(i));
        break;
      }
    }
    CHECK(cudaFreeAsync(out, s));  // the graph's allocation, kept past the launch, freed here
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(exec));
    captured.fetch_add(1);
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(counter));
  CHECK(cudaFree(flag));
  CHECK(cudaStreamDestroy(body));
  CHECK(cudaStreamDestroy(s));
}

void replay_worker(int id, const std::atomic<bool>& stop, std::atomic<long>& count) {
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 512;
  unsigned* x = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(unsigned)));
  CHECK(cudaMemsetAsync(x, 0, n * sizeof(unsigned), s));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  add<<<1, 256, 0, s>>>(x, n, 1u);
  add<<<1, 256, 0, s>>>(x, n, 2u);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  long replays = 0;
  while (!stop.load()) {
    CHECK(cudaGraphLaunch(exec, s));
    ++replays;
    if (replays % 16 == 0) {
      const std::vector<unsigned> got = download(x, n, s);
      if (got[0] != static_cast<unsigned>(3 * replays)) fail("replay thread " + std::to_string(id));
    }
  }
  CHECK(cudaStreamSynchronize(s));
  count += replays;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaFree(x));
  CHECK(cudaStreamDestroy(s));
}

void allocate_worker(int id, const std::atomic<bool>& stop, std::atomic<long>& count) {
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  long allocations = 0;
  while (!stop.load()) {
    const int n = 100 + static_cast<int>(allocations % 900);
    unsigned* p = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(unsigned), s));
    CHECK(cudaMemsetAsync(p, 0, n * sizeof(unsigned), s));
    add<<<1, 256, 0, s>>>(p, n, static_cast<unsigned>(id + 1));
    const std::vector<unsigned> got = download(p, n, s);
    if (got[static_cast<std::size_t>(n - 1)] != static_cast<unsigned>(id + 1)) fail("allocate thread " + std::to_string(id));
    CHECK(cudaFreeAsync(p, s));
    ++allocations;
  }
  CHECK(cudaStreamSynchronize(s));
  count += allocations;
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const int captures = argc > 1 ? std::atoi(argv[1]) : 24;
  const int exit_after_s = argc > 2 ? std::atoi(argv[2]) : 0;
  const std::string features = argc > 3 ? argv[3] : "";
  programmatic = features.find("pdl") != std::string::npos;
  with_if_nodes = features.find("if") != std::string::npos;
  copied_bodies = features.find("copy") != std::string::npos;
  CHECK(cudaFree(nullptr));
  {  // load every kernel first: under lazy loading a first load invalidates open captures
    cudaFuncAttributes attributes{};
    for (const void* kernel : {reinterpret_cast<const void*>(affine), reinterpret_cast<const void*>(add),
                               reinterpret_cast<const void*>(store), reinterpret_cast<const void*>(decrement),
                               reinterpret_cast<const void*>(set_while)})
      CHECK(cudaFuncGetAttributes(&attributes, kernel));
  }
  if (with_if_nodes) load_library_kernel();
  if (copied_bodies) (void)raw::driver();
  std::atomic<bool> stop{false};
  std::atomic<long> replays{0}, allocations{0};
  std::vector<std::thread> background;
  for (int id = 0; id < 2; ++id) background.emplace_back(replay_worker, id, std::cref(stop), std::ref(replays));
  for (int id = 0; id < 2; ++id) background.emplace_back(allocate_worker, id, std::cref(stop), std::ref(allocations));
  std::vector<std::thread> capturing;
  for (int id = 0; id < 8; ++id) capturing.emplace_back(capture_worker, id, captures);
  // Progress every 10 s on stderr, to tell a slow run from a stalled one.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int s = 0; !done.load(); ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (s % 100 == 99)
        std::fprintf(stderr, "%3d s: %d of %d captures\n", (s + 1) / 10, captured.load(), 8 * captures);
      if (exit_after_s > 0 && s + 1 == 10 * exit_after_s) {
        std::fprintf(stderr, "%d s: _Exit(3) with %d of %d captures done, threads still running\n", exit_after_s,
                     captured.load(), 8 * captures);
        std::_Exit(3);
      }
    }
  });
  for (std::thread& t : capturing) t.join();
  done.store(true);
  watchdog.join();
  stop.store(true);
  for (std::thread& t : background) t.join();
  std::printf("8 x %d captures, %ld replays, %ld allocations, %d failures\n", captures, replays.load(), allocations.load(),
              failures.load());
  if (failures.load() != 0 || replays.load() == 0 || allocations.load() == 0) return 1;
  std::printf("ok\n");
  return 0;
}
