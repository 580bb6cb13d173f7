// tools/probes/cond_threads.cu: pairs_test's conditionals_on_six_threads as a program of its own,
// through tensorplay (header-only), with switches that take one ingredient out at a time, to narrow
// down its cudaErrorIllegalAddress under compute-sanitizer (docs/reliability.md, sections 14 and 20)
// beside its raw CUDA twin, tools/probes/cond_threads_raw.cu, which does the same work.
//
//   nvcc -std=c++20 -O2 -arch=sm_90 -I. -o cond_threads tools/probes/cond_threads.cu
//   compute-sanitizer --tool memcheck ./cond_threads [ROUNDS [FEATURES]]
//
// FEATURES, comma-separated:
//   kept   each thread's captures go into one pool of its own, kept across the re-captures (no
//          segment given back to CUDA while the other threads replay)
//   nopdl  a memset after the count-down in the while body, so that the body's set-handle kernel
//          follows a memset, not one kernel, and is captured without a programmatic edge
// Prints "ok" and exits 0, or names what failed and exits 1.
#include <tensorplay/graph.hpp>

#include <atomic>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;

constexpr std::size_t n = 4096;

__global__ void add_into(const int* x, int* y, std::size_t count, int value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) y[i] = x[i] + value;
}
__global__ void iota(int* x, std::size_t count, int base) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) x[i] = base + static_cast<int>(i);
}
__global__ void fill(int* x, std::size_t count, int value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) x[i] = value;
}
__global__ void set_int(int* p, int v) { *p = v; }
__global__ void set_flag(bool* p, bool v) { *p = v; }
__global__ void count_down(int* counter, bool* more) { *more = --*counter > 0; }

namespace {

bool keep_pool = false;
bool programmatic = true;
std::atomic<int> failures{0};

void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  failures.fetch_add(1);
}

std::vector<int> host(const tp::DeviceTensor<int>& t, tp::StreamRef s) {
  std::vector<int> out(t.size());
  if (cudaGetLastError() != cudaSuccess || cudaMemcpyAsync(out.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    throw std::runtime_error(std::string("host copy: ") + cudaGetErrorString(cudaGetLastError()));
  return out;
}

auto through_temporary(const tp::DeviceTensor<int>& from, tp::DeviceTensor<int>& to, int value) {
  return [&from, &to, value](tp::StreamRef s) {
    tp::DeviceTensor<int> t(n, s);
    add_into<<<8, 256, 0, s>>>(from.data(), t.data(), n, value);
    add_into<<<8, 256, 0, s>>>(t.data(), to.data(), n, 0);
  };
}

void worker(int t, int rounds) try {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream), y(n, stream), z(n, stream), counter(1, stream), index(1, stream), dummy(1, stream);
  tp::DeviceTensor<bool> more(1, stream), flag(1, stream);
  const tp::Pool pool = keep_pool ? tp::graph_pool_handle() : tp::Pool();
  tp::Graph graph(tp::GraphOptions{.pool = pool, .capture_error_mode = tp::CaptureErrorMode::ThreadLocal});
  auto capture = [&] {
    graph.reset();
    graph.capture(
        [&](tp::StreamRef) {
          graph.while_(more, [&](tp::StreamRef s) {
            add_into<<<8, 256, 0, s>>>(x.data(), x.data(), n, 1);
            count_down<<<1, 1, 0, s>>>(counter.data(), more.data());
            if (!programmatic && cudaMemsetAsync(dummy.data(), 0, sizeof(int), s) != cudaSuccess)
              throw std::runtime_error("cudaMemsetAsync in the while body");
          });
          graph.switch_(
              index, [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, 0); },
              [&](tp::StreamRef s) { through_temporary(x, y, 10)(s); },
              [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, 20); });
          graph.if_else_(
              flag, [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(y.data(), z.data(), n, 1); },
              [&](tp::StreamRef s) { through_temporary(y, z, -1)(s); });
        },
        {.stream = stream});
  };
  for (int round = 0; round < rounds && failures.load() == 0; ++round) {
    if (round % 5 == 0) capture();
    const int k = (t + round) % 5;
    const int which = round % 4;  // 3: no body runs, y keeps -5
    const bool then_branch = round % 2 == 0;
    const int base = 1000 * t + round;
    iota<<<8, 256, 0, stream>>>(x.data(), n, base);
    fill<<<8, 256, 0, stream>>>(y.data(), n, -5);
    set_int<<<1, 1, 0, stream>>>(counter.data(), k);
    set_flag<<<1, 1, 0, stream>>>(more.data(), k > 0);
    set_int<<<1, 1, 0, stream>>>(index.data(), which);
    set_flag<<<1, 1, 0, stream>>>(flag.data(), then_branch);
    graph.replay(stream);
    const std::vector<int> hx = host(x, stream), hy = host(y, stream), hz = host(z, stream);
    for (std::size_t i = 0; i < n; ++i) {
      const int xw = base + static_cast<int>(i) + k;
      const int yw = which == 3 ? -5 : xw + 10 * which;
      const int zw = yw + (then_branch ? 1 : -1);
      if (hx[i] != xw || hy[i] != yw || hz[i] != zw) {
        fail("thread " + std::to_string(t) + ", round " + std::to_string(round) + ", element " + std::to_string(i));
        break;
      }
    }
  }
} catch (const std::exception& e) {
  fail("thread " + std::to_string(t) + ": " + e.what());
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string features = argc > 2 ? argv[2] : "";
  keep_pool = features.find("kept") != std::string::npos;
  programmatic = features.find("nopdl") == std::string::npos;
  std::vector<std::thread> running;
  for (int t = 0; t < 6; ++t) running.emplace_back(worker, t, rounds);
  for (std::thread& t : running) t.join();
  std::printf("6 threads x %d rounds (%s%s), %d failures\n", rounds, programmatic ? "pdl" : "nopdl", keep_pool ? ", kept" : "",
              failures.load());
  if (failures.load() != 0) return 1;
  std::printf("ok\n");
  return 0;
}
