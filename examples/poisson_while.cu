// examples/poisson_while.cu: an iterative solver that loops on the device.
//
// Solves -laplace(u) = f on the unit square (u = 0 on the boundary) with Jacobi sweeps. The
// loop "sweep until the relative residual is under a tolerance" is captured once with
// Graph::while_, whose predicate is a __device__ lambda reading the residual on the GPU: no
// round trip to the host per iteration. The same solver driven by a host loop, which reads
// the residual back after every iteration, runs for comparison. The answer is checked
// against the exact solution u = sin(pi x) sin(pi y).
//
//     bazel run //examples:poisson_while -- [--n=64] [--tolerance=1e-5]
#include <tensorplay/graph.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr double pi = 3.14159265358979323846;

struct Problem {
  int n;      // interior points per side
  double h2;  // grid spacing squared
  [[nodiscard]] __host__ __device__ int side() const { return n + 2; }
  [[nodiscard]] std::size_t points() const { return std::size_t(side()) * side(); }
};

__global__ void jacobi_sweep(const double* u, double* v, const double* f, Problem p) {
  const int i = blockIdx.y * blockDim.y + threadIdx.y + 1;
  const int j = blockIdx.x * blockDim.x + threadIdx.x + 1;
  if (i > p.n || j > p.n) return;
  const int s = p.side();
  const int k = i * s + j;
  v[k] = 0.25 * (u[k - s] + u[k + s] + u[k - 1] + u[k + 1] + p.h2 * f[k]);
}

// Adds the squared residual of every interior point into *sum.
__global__ void residual_squared(const double* u, const double* f, Problem p, double* sum) {
  const int i = blockIdx.y * blockDim.y + threadIdx.y + 1;
  const int j = blockIdx.x * blockDim.x + threadIdx.x + 1;
  double r2 = 0;
  if (i <= p.n && j <= p.n) {
    const int s = p.side();
    const int k = i * s + j;
    const double r = f[k] + (u[k - s] + u[k + s] + u[k - 1] + u[k + 1] - 4 * u[k]) / p.h2;
    r2 = r * r;
  }
  for (int offset = 16; offset > 0; offset /= 2) r2 += __shfl_down_sync(0xffffffffu, r2, offset);
  if ((threadIdx.x + threadIdx.y * blockDim.x) % 32 == 0) atomicAdd(sum, r2);
}

__global__ void start_iteration(double* sum, int* iterations) {
  *sum = 0;
  *iterations += 1;
}
__global__ void reset_loop(double* sum, int* iterations) {
  *sum = 1e300;  // "not converged" until the first residual is known
  *iterations = 0;
}

struct Solver {
  Problem p;
  double tolerance;
  int max_iterations;
  tp::DeviceTensor<double> u, v, f;
  tp::DeviceTensor<double> residual2;  // squared residual norm of the last iteration
  tp::DeviceTensor<int> iterations;
  double f_norm2 = 0;

  Solver(int n, double tol, int max_iter)
      : p{n, 1.0 / ((n + 1.0) * (n + 1.0))}, tolerance(tol), max_iterations(max_iter),
        u(p.points()), v(p.points()), f(p.points()), residual2(1), iterations(1) {
    std::vector<double> host_f(p.points(), 0.0);
    const double h = 1.0 / (n + 1);
    for (int i = 1; i <= n; ++i)
      for (int j = 1; j <= n; ++j) {
        const double value = 2 * pi * pi * std::sin(pi * i * h) * std::sin(pi * j * h);
        host_f[std::size_t(i) * p.side() + j] = value;
        f_norm2 += value * value;
      }
    f.copy_from_host(host_f);
  }

  void reset() {
    const std::vector<double> zeros(p.points(), 0.0);
    u.copy_from_host(zeros);
    v.copy_from_host(zeros);
    reset_loop<<<1, 1, 0, tp::current_stream()>>>(residual2.data(), iterations.data());
  }

  // One iteration: two sweeps (u -> v -> u), then the residual of u.
  void iterate(tp::StreamRef s) {
    const dim3 block(32, 8);
    const dim3 grid((p.n + 31) / 32, (p.n + 7) / 8);
    start_iteration<<<1, 1, 0, s>>>(residual2.data(), iterations.data());
    jacobi_sweep<<<grid, block, 0, s>>>(u.data(), v.data(), f.data(), p);
    jacobi_sweep<<<grid, block, 0, s>>>(v.data(), u.data(), f.data(), p);
    residual_squared<<<grid, block, 0, s>>>(u.data(), f.data(), p, residual2.data());
  }

  [[nodiscard]] double max_error() const {
    const std::vector<double> host_u = u.to_host();
    const double h = 1.0 / (p.n + 1);
    double worst = 0;
    for (int i = 1; i <= p.n; ++i)
      for (int j = 1; j <= p.n; ++j)
        worst = std::fmax(worst, std::fabs(host_u[std::size_t(i) * p.side() + j] - std::sin(pi * i * h) * std::sin(pi * j * h)));
    return worst;
  }
};

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) try {
  int n = 64;
  double tolerance = 1e-5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--n=", 0) == 0) n = std::atoi(arg.c_str() + 4);
    else if (arg.rfind("--tolerance=", 0) == 0) tolerance = std::atof(arg.c_str() + 12);
    else {
      std::fprintf(stderr, "usage: poisson_while [--n=64] [--tolerance=1e-5]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("poisson_while: no usable CUDA device here, so there is nothing to run.\n");
    return 0;
  }
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  Solver solver(n, tolerance, 200000);
  const double threshold = tolerance * tolerance * solver.f_norm2;  // relative residual, squared
  const int max_iterations = solver.max_iterations;
  const double* r2 = solver.residual2.data();
  const int* iters = solver.iterations.data();

  // Device-driven: the whole solve is one graph launch.
  tp::Graph graph;
  graph.capture([&] {
    graph.while_([=] __device__ { return *r2 > threshold && *iters < max_iterations; },
                 [&](tp::StreamRef s) { solver.iterate(s); });
  });
  solver.reset();
  graph.replay();  // warm-up
  solver.reset();
  stream.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  graph.replay();
  stream.synchronize();
  const double graph_ms = ms_since(t0);
  const int graph_iterations = solver.iterations.to_host()[0];
  const double graph_residual = std::sqrt(solver.residual2.to_host()[0] / solver.f_norm2);
  const double graph_error = solver.max_error();

  // Host-driven: launch an iteration, read the residual back, decide on the host.
  double* host_r2 = nullptr;
  if (cudaMallocHost(&host_r2, sizeof(double)) != cudaSuccess) throw std::runtime_error("cudaMallocHost failed");
  solver.reset();
  stream.synchronize();
  t0 = std::chrono::steady_clock::now();
  int host_iterations = 0;
  do {
    solver.iterate(stream);
    TENSORPLAY_CHECK(cudaMemcpyAsync(host_r2, r2, sizeof(double), cudaMemcpyDeviceToHost, stream), std::source_location::current());
    stream.synchronize();
    ++host_iterations;
  } while (*host_r2 > threshold && host_iterations < max_iterations);
  const double host_ms = ms_since(t0);
  const double host_error = solver.max_error();
  cudaFreeHost(host_r2);

  const double h = 1.0 / (n + 1);
  const double allowed = 2 * h * h;  // second-order discretisation error (pi^2 h^2 / 12 ~ 0.8 h^2)
  const bool ok = graph_residual <= tolerance && graph_iterations == host_iterations && graph_error < allowed &&
                  host_error < allowed;
  std::printf("poisson_while: %d x %d interior grid, Jacobi, relative residual tolerance %.1e\n", n, n, tolerance);
  std::printf("  %-34s %10s %12s %14s %12s\n", "", "iterations", "total ms", "us/iteration", "max error");
  std::printf("  %-34s %10d %12.2f %14.3f %12.3e\n", "Graph::while_ (device-driven)", graph_iterations, graph_ms,
              graph_ms * 1e3 / graph_iterations, graph_error);
  std::printf("  %-34s %10d %12.2f %14.3f %12.3e\n", "host loop (reads residual back)", host_iterations, host_ms,
              host_ms * 1e3 / host_iterations, host_error);
  std::printf("  speed-up %.2fx; relative residual %.2e; error bound %.2e: %s\n", host_ms / graph_ms, graph_residual, allowed,
              ok ? "CORRECT" : "WRONG");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "poisson_while failed: %s\n", e.what());
  return 1;
}
