// test/consumer/main.cu: a program that uses tensorplay as a project of its own would, built
// by test/consumer/build_all twice: by CMake against an installed tensorplay (cmake/) and by a
// separate Bazel workspace (bazel/, where main.cu links here).
//
// It captures a cuBLAS SGEMM (C = A * B) and a kernel of its own (C += 1) into one graph,
// replays it, and checks C against the host. Exit status 1 on a mismatch or an error; without
// a GPU it prints "no GPU: skipped" and exits 0.
#include <tensorplay/cublas.hpp>
#include <tensorplay/graph.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <limits>
#include <source_location>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr int n = 64;  // n x n matrices, column-major as cuBLAS stores them
constexpr int count = n * n;

__global__ void add_one(float* c, int size) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < size) c[i] += 1.0f;
}

void check(cublasStatus_t status, const char* call, std::source_location where = std::source_location::current()) {
  if (status != CUBLAS_STATUS_SUCCESS) throw tp::cublas_error(status, call, where);
}

// Owns the handle; destroyed before the workspace it points to.
struct CublasHandle {
  cublasHandle_t get = nullptr;
  CublasHandle() { check(cublasCreate(&get), "cublasCreate"); }
  ~CublasHandle() { cublasDestroy(get); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

// Small integers: every product and sum is exact in float (and in TF32), so any difference
// from the host is a real error, not rounding.
std::vector<float> matrix(int seed) {
  std::vector<float> m(count);
  for (int i = 0; i < count; ++i) m[i] = static_cast<float>((i * 7 + seed * 13) % 5 - 2);
  return m;
}

int run() {
  const std::vector<float> a = matrix(1);
  const std::vector<float> b = matrix(2);
  std::vector<double> expected(count);
  for (int col = 0; col < n; ++col)
    for (int row = 0; row < n; ++row) {
      double sum = 0;
      for (int k = 0; k < n; ++k) sum += double{a[row + k * n]} * b[k + col * n];
      expected[row + col * n] = sum + 1.0;
    }

  tp::Stream stream;
  tp::DeviceTensor<float> da(count, stream);
  tp::DeviceTensor<float> db(count, stream);
  tp::DeviceTensor<float> dc(count, stream);
  da.copy_from_host(a, stream);
  db.copy_from_host(b, stream);

  // Allocated before the capture and kept until the graph is gone: the captured gemm uses it.
  tp::DeviceTensor<std::byte> workspace(std::size_t{4} << 20, stream);
  CublasHandle handle;
  tp::cublas_set_stream(handle.get, stream, workspace.span());

  const float one = 1.0f;
  const float zero = 0.0f;
  auto step = [&](tp::StreamRef s) {
    check(cublasSgemm(handle.get, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da.data(), n, db.data(), n, &zero,
                      dc.data(), n),
          "cublasSgemm");
    add_one<<<(count + 255) / 256, 256, 0, s>>>(dc.data(), count);
  };
  step(stream);  // warm-up: cuBLAS initialises itself lazily, which a capture cannot hold

  tp::Graph graph;
  graph.capture(step, {.stream = stream});
  // NaN everywhere: only the replay can make C right again.
  dc.copy_from_host(std::vector<float>(count, std::numeric_limits<float>::quiet_NaN()), stream);
  graph.replay(stream);
  const std::vector<float> c = dc.to_host(stream);

  double max_error = 0;
  for (int i = 0; i < count; ++i) {
    const double error = std::fabs(c[i] - expected[i]);
    if (!(error <= max_error)) max_error = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
  }
  const bool ok = max_error <= 1e-3;
  std::printf("cuBLAS SGEMM %dx%d + kernel, captured and replayed: max error %g: %s\n", n, n, max_error,
              ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no GPU: skipped");
    return 0;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
