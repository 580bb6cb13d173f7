// examples/data_parallel.cu: data-parallel SGD on every visible GPU, one thread, eager against a
// captured DeviceGroupGraph.
//
// Each GPU holds a shard of a linear-regression data set and a replica of the weights. One step:
// every GPU computes the gradient of its shard, an NCCL all-reduce sums the gradients, and every
// GPU applies the same update. The eager run issues each step as kernels and grouped NCCL calls
// from one thread; the graph run captures one step once and replays it. Both run the same
// arithmetic (the gradient's reduction has a fixed order, and NCCL reduces alike in both runs),
// so the weights must match bit for bit; the program says so and prints the times per step.
//
//     bazel run //examples:data_parallel [-- --steps=200]
//
// Needs at least 2 GPUs (otherwise it prints "needs 2 GPUs: skipped" and exits 0), and NCCL
// (libnccl.so.2 on the library path).
#include <tensorplay/graph.hpp>
#include <tensorplay/nccl.hpp>

#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace nccl = tensorplay::nccl;

namespace {

constexpr int features = 128;
constexpr int samples_per_gpu = 4096;
constexpr int threads = 256;
constexpr float learning_rate = 0.1f;

// Gradient of one shard: block j sums (x . w - label) x[j] over the shard's samples, threads
// striding over samples, then a tree reduction in a fixed order: the same bits at every run.
__global__ void shard_gradient(const float* x, const float* labels, const float* w, float* g, float scale) {
  __shared__ float partial[threads];
  const int j = blockIdx.x;
  float sum = 0.0f;
  for (int s = threadIdx.x; s < samples_per_gpu; s += threads) {
    const float* row = x + static_cast<std::size_t>(s) * features;
    float prediction = 0.0f;
    for (int k = 0; k < features; ++k) prediction += row[k] * w[k];
    sum += (prediction - labels[s]) * row[j];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) g[j] = partial[0] * scale;
}

__global__ void apply_update(float* w, const float* g) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < features) w[j] -= learning_rate * g[j];
}

float uniform(std::uint64_t i) {  // deterministic, in [-1, 1)
  i = (i ^ (i >> 30)) * 0xbf58476d1ce4e5b9ULL;
  i = (i ^ (i >> 27)) * 0x94d049bb133111ebULL;
  i ^= i >> 31;
  return static_cast<float>(i % 65536) / 32768.0f - 1.0f;
}

void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, ncclGetErrorString(status));
    std::exit(1);
  }
}

// One GPU's shard and its two replicas of the weights (eager run, graph run).
struct Shard {
  tp::Stream stream;
  tp::DeviceTensor<float> x, labels, w_eager, g_eager, w_graph, g_graph;

  Shard(int device, std::size_t index, const std::vector<float>& truth)
      : stream(device),
        x(static_cast<std::size_t>(samples_per_gpu) * features, stream),
        labels(samples_per_gpu, stream),
        w_eager(features, stream),
        g_eager(features, stream),
        w_graph(features, stream),
        g_graph(features, stream) {
    std::vector<float> xs(x.size());
    std::vector<float> ys(labels.size());
    for (std::size_t s = 0; s < ys.size(); ++s) {
      float label = 0.1f * uniform(index * 1'000'003 + s);  // noise
      for (int k = 0; k < features; ++k) {
        const float value = uniform(((index * samples_per_gpu + s) << 8) + static_cast<std::uint64_t>(k));
        xs[s * features + k] = value;
        label += value * truth[k];
      }
      ys[s] = label;
    }
    tp::StreamGuard guard(stream);
    x.copy_from_host(xs, stream);
    labels.copy_from_host(ys, stream);
    const std::vector<float> zero(features, 0.0f);
    w_eager.copy_from_host(zero, stream);
    w_graph.copy_from_host(zero, stream);
    stream.synchronize();
  }
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 100;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--steps=", 8) == 0) steps = std::atoi(argv[i] + 8);

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (count < 2) {
    std::printf("needs 2 GPUs: skipped (found %d)\n", count);
    return 0;
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast is not available everywhere; yours to override

  std::vector<int> devices(static_cast<std::size_t>(count));
  for (int d = 0; d < count; ++d) devices[static_cast<std::size_t>(d)] = d;
  std::vector<float> truth(features);
  for (int k = 0; k < features; ++k) truth[static_cast<std::size_t>(k)] = uniform(7'000'000 + static_cast<std::uint64_t>(k));
  std::vector<std::unique_ptr<Shard>> shards;
  for (std::size_t i = 0; i < devices.size(); ++i) shards.push_back(std::make_unique<Shard>(devices[i], i, truth));
  std::vector<tp::StreamRef> streams;
  for (const auto& shard : shards) streams.push_back(shard->stream);

  const auto comms = nccl::init_clique(devices);
  const float scale = 1.0f / static_cast<float>(samples_per_gpu * count);

  // One SGD step on `s` (streams[i] on devices[i]): the code is the same for the eager run and
  // for the capture. Kernels need their device current: StreamGuard makes it so.
  auto step = [&](std::span<const tp::StreamRef> s, bool graph_replicas) {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      Shard& shard = *shards[i];
      tp::StreamGuard guard(s[i]);
      shard_gradient<<<features, threads, 0, s[i]>>>(shard.x.data(), shard.labels.data(),
                                                     (graph_replicas ? shard.w_graph : shard.w_eager).data(),
                                                     (graph_replicas ? shard.g_graph : shard.g_eager).data(), scale);
    }
    nccl::group([&] {
      for (std::size_t i = 0; i < shards.size(); ++i) {
        float* g = (graph_replicas ? shards[i]->g_graph : shards[i]->g_eager).data();
        check(ncclAllReduce(g, g, features, ncclFloat, ncclSum, comms[i]->get(), s[i]), "ncclAllReduce");
      }
    });
    for (std::size_t i = 0; i < shards.size(); ++i) {
      Shard& shard = *shards[i];
      tp::StreamGuard guard(s[i]);
      apply_update<<<1, features, 0, s[i]>>>((graph_replicas ? shard.w_graph : shard.w_eager).data(),
                                             (graph_replicas ? shard.g_graph : shard.g_eager).data());
    }
  };
  auto synchronize = [&] {
    for (tp::StreamRef s : streams) s.synchronize();
  };
  using Clock = std::chrono::steady_clock;
  auto per_step_us = [&](Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / steps;
  };

  // Eager: every step issues 2 kernels per GPU and one grouped all-reduce.
  const auto eager_start = Clock::now();
  for (int k = 0; k < steps; ++k) step(streams, false);
  synchronize();
  const double eager_us = per_step_us(eager_start);

  // Graph: the same step captured once (one graph per GPU, each holding its communicator), then
  // replayed. Eager NCCL work has completed first: it must not overlap graph launches on the
  // same communicators when NCCL_GRAPH_MIXING_SUPPORT=0.
  double graph_us = 0;
  {
    tp::DeviceGroupGraph group(devices);
    nccl::capture(group, comms, [&](std::span<const tp::StreamRef> s) { step(s, true); });
    const auto graph_start = Clock::now();
    for (int k = 0; k < steps; ++k) group.replay(streams);
    synchronize();
    graph_us = per_step_us(graph_start);
  }
  // The graphs are gone; once CUDA has released what they held, `comms` are the last handles and
  // the communicators are destroyed here, at the end of main, not while the process exits.
  if (!nccl::wait_until_released(comms, std::chrono::seconds(30))) std::printf("warning: a graph still holds a communicator\n");

  bool match = true;
  double error = 0.0;
  std::vector<float> reference;
  for (const auto& shard : shards) {
    tp::StreamGuard guard(shard->stream);
    const std::vector<float> eager = shard->w_eager.to_host(shard->stream);
    const std::vector<float> graph = shard->w_graph.to_host(shard->stream);
    if (reference.empty()) reference = eager;
    match = match && std::memcmp(eager.data(), graph.data(), sizeof(float) * features) == 0 &&
            std::memcmp(eager.data(), reference.data(), sizeof(float) * features) == 0;
  }
  for (int k = 0; k < features; ++k) error = std::fmax(error, std::fabs(reference[k] - truth[k]));

  std::printf("data-parallel SGD, %d GPUs, %d steps, %d samples per GPU, %d features\n", count, steps, samples_per_gpu, features);
  std::printf("  eager: %9.1f us per step\n", eager_us);
  std::printf("  graph: %9.1f us per step (%.2fx)\n", graph_us, eager_us / graph_us);
  std::printf("  largest weight error against the true weights: %.4f\n", error);
  std::printf("  graph weights %s the eager weights bit for bit on every GPU\n", match ? "match" : "DO NOT match");
  return match ? 0 : 1;
}
