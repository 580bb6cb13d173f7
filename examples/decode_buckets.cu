// examples/decode_buckets.cu: a toy LLM decode step served with GraphBuckets.
//
// Each step takes a batch of n rows (one per sequence being decoded) of a hidden state of
// width 256 through 50 pre-norm layers: RMS norm, a cuBLAS SGEMM, SiLU, residual add (about 200
// kernels), with an "attention" between layers 24 and 25 that reads a context length the host
// changes at every step, so it cannot be captured. Each bucket of the ladder is therefore a
// PiecewiseGraph: layers 0-24 captured, the attention run eagerly, layers 25-49 captured.
// Batches are padded up to the nearest bucket (staged runs zero the padding rows); batches
// above 256 run eagerly.
//
// 10,000 steps of random batch sizes run twice each, eagerly and through the buckets, on the
// same inputs; every step's output is compared (a relative tolerance, since cuBLAS may sum in
// another order for another number of rows). Prints both times and the speedup; exits 1 on a
// mismatch. Without a GPU it prints "no GPU: skipped" and exits 0.
//
//     bazel run //examples:decode_buckets -- [--steps=N] [--seed=N]
#include <tensorplay/cublas.hpp>
#include <tensorplay/graph.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr int hidden = 256;          // one block of `hidden` threads per row
constexpr int layers = 50;
constexpr int attention_after = 25;  // the eager step runs between layers 24 and 25
constexpr int context = 16;          // key/value entries per row
constexpr std::size_t max_batch = 272;  // batches drawn from 1..272: above 256 they run eagerly
const std::vector<std::size_t> ladder{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};

__global__ void rms_norm(const float* in, float* out) {
  __shared__ float partial[hidden];
  const float v = in[blockIdx.x * hidden + threadIdx.x];
  partial[threadIdx.x] = v * v;
  __syncthreads();
  for (int stride = hidden / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  out[blockIdx.x * hidden + threadIdx.x] = v * rsqrtf(partial[0] / hidden + 1e-5f);
}

__global__ void silu(float* x, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) x[i] = x[i] / (1.0f + expf(-x[i]));
}

__global__ void residual_add(float* h, const float* delta, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i < n) h[i] += delta[i];
}

// h[row] += softmax(h[row] . keys[row, t] / sqrt(hidden)) over t < length, applied to values[row].
__global__ void attention(float* h, const float* keys, const float* values, int length) {
  __shared__ float partial[hidden];
  __shared__ float scores[context];
  const std::size_t row = blockIdx.x;
  const float q = h[row * hidden + threadIdx.x];
  for (int t = 0; t < length; ++t) {
    partial[threadIdx.x] = q * keys[(row * context + t) * hidden + threadIdx.x];
    __syncthreads();
    for (int stride = hidden / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) scores[t] = partial[0] * rsqrtf(static_cast<float>(hidden));
    __syncthreads();
  }
  float top = scores[0];
  for (int t = 1; t < length; ++t) top = fmaxf(top, scores[t]);
  float sum = 0;
  float mixed = 0;
  for (int t = 0; t < length; ++t) {
    const float w = expf(scores[t] - top);
    sum += w;
    mixed += w * values[(row * context + t) * hidden + threadIdx.x];
  }
  h[row * hidden + threadIdx.x] = q + mixed / sum;
}

// Counts elements of `got` farther than the tolerance from `want`, and keeps the largest error.
__global__ void compare(const float* got, const float* want, std::size_t n, unsigned* mismatches, float* worst) {
  const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float error = fabsf(got[i] - want[i]) / (1.0f + fabsf(want[i]));
  if (!(error <= 1e-3f)) atomicAdd(mismatches, 1u);
  // Non-negative floats order like their bit patterns (a NaN error lands above every number).
  atomicMax(reinterpret_cast<unsigned*>(worst), __float_as_uint(error == error ? error : INFINITY));
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s\n", what, cublasGetStatusString(status));
    std::exit(2);
  }
}

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

std::vector<float> random_values(std::size_t n, float scale, std::mt19937& random) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(random);
  return v;
}

tp::DeviceTensor<float> device_copy(const std::vector<float>& host, tp::StreamRef stream) {
  tp::DeviceTensor<float> t(host.size(), stream);
  t.copy_from_host(host, stream);
  return t;
}

//! The model: weights, the key/value cache, and the static buffers every bucket reads and writes
//! (sized for the largest batch, outside the buckets' pool).
struct Decoder {
  tp::Stream& stream;
  cublasHandle_t blas = nullptr;
  tp::DeviceTensor<std::byte> workspace{std::size_t{32} << 20, stream};  // cuBLAS's, outside any graph
  tp::DeviceTensor<float> weights, keys, values;
  tp::DeviceTensor<float> x{max_batch * hidden, stream};    // static input
  tp::DeviceTensor<float> h{max_batch * hidden, stream};    // the residual stream
  tp::DeviceTensor<float> out{max_batch * hidden, stream};  // static output
  int length = 1;  // context length of this step: read by the eager attention when it runs

  Decoder(tp::Stream& s, std::mt19937& random) : stream(s) {
    weights = device_copy(random_values(std::size_t{layers} * hidden * hidden, 1.0f / std::sqrt(float(hidden)), random), stream);
    keys = device_copy(random_values(max_batch * context * hidden, 1.0f, random), stream);
    values = device_copy(random_values(max_batch * context * hidden, 1.0f, random), stream);
    check(cublasCreate(&blas), "cublasCreate");
    tp::cublas_set_stream(blas, stream, workspace.span());  // every capture and eager run is on this stream
  }
  ~Decoder() { cublasDestroy(blas); }

  // One layer: h += silu(rms_norm(h) W), over `rows` rows, temporaries from the current pool.
  void layer(tp::StreamRef s, int l, std::size_t rows) {
    const std::size_t n = rows * hidden;
    tp::DeviceTensor<float> normed(n, s);
    rms_norm<<<static_cast<unsigned>(rows), hidden, 0, s>>>(h.data(), normed.data());
    tp::DeviceTensor<float> projected(n, s);
    const float one = 1.0f;
    const float zero = 0.0f;
    const float* w = weights.data() + std::size_t(l) * hidden * hidden;
    check(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hidden, static_cast<int>(rows), hidden, &one, w, hidden,
                      normed.data(), hidden, &zero, projected.data(), hidden),
          "cublasSgemm");
    silu<<<blocks(n), 256, 0, s>>>(projected.data(), n);
    residual_add<<<blocks(n), 256, 0, s>>>(h.data(), projected.data(), n);
  }

  void first_half(tp::StreamRef s, std::size_t rows) {
    check(cudaMemcpyAsync(h.data(), x.data(), rows * hidden * sizeof(float), cudaMemcpyDeviceToDevice, s), "copy x");
    for (int l = 0; l < attention_after; ++l) layer(s, l, rows);
  }
  void attend(tp::StreamRef s, std::size_t rows) {
    attention<<<static_cast<unsigned>(rows), hidden, 0, s>>>(h.data(), keys.data(), values.data(), length);
  }
  void second_half(tp::StreamRef s, std::size_t rows) {
    for (int l = attention_after; l < layers; ++l) layer(s, l, rows);
    rms_norm<<<static_cast<unsigned>(rows), hidden, 0, s>>>(h.data(), out.data());
  }

  //! The whole step, eagerly (the reference).
  void step(tp::StreamRef s, std::size_t rows) {
    first_half(s, rows);
    attend(s, rows);
    second_half(s, rows);
  }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 10000;
  unsigned seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--steps=", 0) == 0) steps = std::atoi(arg.c_str() + 8);
    else if (arg.rfind("--seed=", 0) == 0) seed = static_cast<unsigned>(std::atoi(arg.c_str() + 7));
    else {
      std::fprintf(stderr, "usage: decode_buckets [--steps=N] [--seed=N]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no GPU: skipped");
    return 0;
  }

  std::mt19937 random(seed);
  tp::Stream stream;
  Decoder model(stream, random);
  // Inputs of the steps: a few random batches of the largest size, used in turn.
  std::vector<tp::DeviceTensor<float>> inputs;
  for (int k = 0; k < 8; ++k) inputs.push_back(device_copy(random_values(max_batch * hidden, 1.0f, random), stream));
  tp::DeviceTensor<float> reference(max_batch * hidden, stream);
  tp::DeviceTensor<unsigned> mismatches(1, stream);
  tp::DeviceTensor<float> worst(1, stream);
  check(cudaMemsetAsync(mismatches.data(), 0, sizeof(unsigned), stream), "memset");
  check(cudaMemsetAsync(worst.data(), 0, sizeof(float), stream), "memset");

  // Each bucket: layers 0-24 captured, the attention eager, layers 25-49 captured.
  tp::GraphBuckets decode(ladder, [&](tp::PiecewiseGraph& pieces, std::size_t rows) {
    pieces.capture([&, rows](tp::StreamRef s) { model.first_half(s, rows); });
    pieces.eager([&, rows](tp::StreamRef s) { model.attend(s, rows); });
    pieces.capture([&, rows](tp::StreamRef s) { model.second_half(s, rows); });
  }, {.zero_fill_tail = true});

  model.step(stream, ladder.back());  // warm-up: cuBLAS initialises itself outside any capture
  stream.synchronize();

  std::uniform_int_distribution<std::size_t> batch(1, max_batch);
  double eager_seconds = 0;
  double graph_seconds = 0;
  std::size_t padded_rows = 0;
  std::size_t rows = 0;
  for (int t = 0; t < steps; ++t) {
    const std::size_t n = batch(random);
    model.length = 1 + t % context;
    std::span<float> input(inputs[t % inputs.size()].data(), n * hidden);

    auto start = std::chrono::steady_clock::now();  // eager: copy the batch in, run, wait
    check(cudaMemcpyAsync(model.x.data(), input.data(), input.size_bytes(), cudaMemcpyDeviceToDevice, stream), "stage");
    model.step(stream, n);
    stream.synchronize();
    eager_seconds += seconds_since(start);
    check(cudaMemcpyAsync(reference.data(), model.out.data(), n * hidden * sizeof(float), cudaMemcpyDeviceToDevice, stream),
          "keep reference");

    start = std::chrono::steady_clock::now();  // buckets: stage, replay (or run eagerly above 256), wait
    const std::size_t ran = decode.run(n, std::tie(model.x), std::tie(input), stream);
    stream.synchronize();
    graph_seconds += seconds_since(start);
    rows += n;
    padded_rows += ran;

    compare<<<blocks(n * hidden), 256, 0, stream>>>(model.out.data(), reference.data(), n * hidden, mismatches.data(),
                                                    worst.data());
  }
  const unsigned bad = mismatches.to_host(stream)[0];
  const float largest_error = worst.to_host(stream)[0];

  std::printf("decode_buckets: %d steps of 1..%zu rows, %d layers (~%d kernels per step), ladder of %zu buckets\n", steps,
              max_batch, layers, 4 * layers + 2, ladder.size());
  std::printf("  eager:   %8.1f ms  (%.1f us per step)\n", eager_seconds * 1e3, eager_seconds * 1e6 / steps);
  std::printf("  buckets: %8.1f ms  (%.1f us per step)\n", graph_seconds * 1e3, graph_seconds * 1e6 / steps);
  std::printf("  speedup: %.2fx; padding: %.1f%% extra rows; buckets captured: %zu; pool: %.1f MiB\n",
              eager_seconds / graph_seconds, 100.0 * static_cast<double>(padded_rows - rows) / static_cast<double>(rows),
              decode.executables(), static_cast<double>(decode.pool().reserved_bytes()) / (1 << 20));
  std::printf("  largest relative error: %.3g; elements beyond 1e-3: %u\n", largest_error, bad);
  if (bad != 0) {
    std::puts("MISMATCH: the buckets' outputs differ from the eager run");
    return 1;
  }
  std::puts("every step matches the eager run");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decode_buckets: %s\n", e.what());
  return 2;
}
