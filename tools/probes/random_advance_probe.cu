// tools/probes/random_advance_probe.cu: raw CUDA, no tensorplay. Device time per replay of graphs of 1 and
// 100 one-block kernels that draw curand Philox numbers: offsets frozen in by value, against the
// designs of a replay-varying offset: the kernels read {seed, offset} from device memory with no
// advance at all (the cost of the read alone), with an advance kernel in series in front (what
// RandomState does), with a programmatic edge from the advance (griddepcontrol), and with the
// advance at the end. Back-to-back batches of 64 replays between events, medians (issue 24).
//   nvcc -std=c++20 -arch=sm_90 -O2 -o random_advance_probe tools/probes/random_advance_probe.cu
// H200, 2026-12-02: 1 kernel 1.00 / 0.995 / 1.391 / 1.350 / 1.382x; 100 kernels 1.00 / 1.229 / 1.243 / 1.243 / 1.242x.
#include <cuda_runtime.h>
#include <curand_kernel.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s line %d\n", #x, cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
struct Counter { unsigned long long seed, offset; };
struct Slot { unsigned long long seed, base; };
constexpr int threads = 256;
__device__ __forceinline__ void write_uniform(float* out, unsigned long long seed, unsigned long long offset) {
  curandStatePhilox4_32_10_t st; curand_init(seed, threadIdx.x, offset, &st); out[threadIdx.x] = curand_uniform(&st);
}
__global__ void draw_fixed(float* out, unsigned long long seed, unsigned long long off) { write_uniform(out, seed, off); }
__global__ void draw_slot(float* out, const Slot* slot, unsigned long long intra) { Slot s = *slot; write_uniform(out, s.seed, s.base + intra); }
__global__ void draw_slot_wait(float* out, const Slot* slot, unsigned long long intra) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  Slot s = *slot; write_uniform(out, s.seed, s.base + intra);
}
__global__ void draw_slot_ldg(float* out, const Slot* slot, unsigned long long intra) {
  unsigned long long seed = __ldg(&slot->seed), base = __ldg(&slot->base); write_uniform(out, seed, base + intra);
}
__global__ void draw_counter(float* out, const Counter* c, unsigned long long intra) { Counter s = *c; write_uniform(out, s.seed, s.offset + intra); }
__global__ void advance(Counter* c, Slot* slot, unsigned long long inc) { slot->seed = c->seed; slot->base = atomicAdd(&c->offset, inc); }
__global__ void advance_trigger(Counter* c, Slot* slot, unsigned long long inc) {
  slot->seed = c->seed; slot->base = atomicAdd(&c->offset, inc); __threadfence();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__global__ void bump(Counter* c, unsigned long long inc) { c->offset += inc; }

float* out; Counter* counter; Slot* slot; cudaStream_t s;
enum V { Plain, LoadOnly, LoadLdg, Series, Pdl, PdlCapture, AtEnd };
const char* names[] = {"plain (frozen)", "load only, no advance", "load via ldg, no advance", "advance in series (now)", "advance, programmatic edge", "same, made in capture", "advance at the end"};
cudaGraphExec_t build(V v, int n) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (v == Series) advance<<<1, 1, 0, s>>>(counter, slot, n);
  if (v == Pdl || v == PdlCapture) {
    advance_trigger<<<1, 1, 0, s>>>(counter, slot, n);
    if (v == PdlCapture) {
      cudaStreamCaptureStatus st; const cudaGraphNode_t* deps; const cudaGraphEdgeData* ed; size_t nd; cudaGraph_t cg; unsigned long long id;
      CK(cudaStreamGetCaptureInfo(s, &st, &id, &cg, &deps, &ed, &nd));
      cudaGraphNode_t last = deps[0];
      cudaGraphEdgeData e{}; e.from_port = cudaGraphKernelNodePortProgrammatic; e.type = cudaGraphDependencyTypeProgrammatic;
      CK(cudaStreamUpdateCaptureDependencies(s, &last, &e, 1, cudaStreamSetCaptureDependencies));
    }
  }
  for (int k = 0; k < n; ++k) {
    switch (v) {
      case Plain: draw_fixed<<<1, threads, 0, s>>>(out, 2026, k); break;
      case LoadOnly: case Series: draw_slot<<<1, threads, 0, s>>>(out, slot, k); break;
      case LoadLdg: draw_slot_ldg<<<1, threads, 0, s>>>(out, slot, k); break;
      case Pdl: case PdlCapture: if (k == 0) draw_slot_wait<<<1, threads, 0, s>>>(out, slot, k); else draw_slot<<<1, threads, 0, s>>>(out, slot, k); break;
      case AtEnd: draw_counter<<<1, threads, 0, s>>>(out, counter, k); break;
    }
  }
  if (v == AtEnd) bump<<<1, 1, 0, s>>>(counter, n);
  CK(cudaStreamEndCapture(s, &g));
  if (v == Pdl) {  // make the first edge programmatic by hand
    size_t ne = 0; CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne); std::vector<cudaGraphEdgeData> ed(ne);
    CK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    size_t nr = 0; CK(cudaGraphGetRootNodes(g, nullptr, &nr)); std::vector<cudaGraphNode_t> roots(nr); CK(cudaGraphGetRootNodes(g, roots.data(), &nr));
    for (size_t i = 0; i < ne; ++i) if (from[i] == roots[0]) {
      CK(cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1));
      cudaGraphEdgeData e{}; e.from_port = cudaGraphKernelNodePortProgrammatic; e.type = cudaGraphDependencyTypeProgrammatic;
      CK(cudaGraphAddDependencies(g, &from[i], &to[i], &e, 1));
    }
  }
  cudaGraphExec_t ex; CK(cudaGraphInstantiate(&ex, g, 0)); CK(cudaGraphDestroy(g));
  return ex;
}
int main() {
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&out, threads * sizeof(float))); CK(cudaMalloc(&counter, sizeof(Counter))); CK(cudaMalloc(&slot, sizeof(Slot)));
  Counter c0{2026, 0}; CK(cudaMemcpy(counter, &c0, sizeof c0, cudaMemcpyHostToDevice)); CK(cudaMemcpy(slot, &c0, sizeof c0, cudaMemcpyHostToDevice));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int n : {1, 100}) {
    std::vector<cudaGraphExec_t> ex; for (int v = 0; v <= AtEnd; ++v) ex.push_back(build(V(v), n));
    std::vector<std::vector<float>> t(ex.size());
    const int batch = 64, rounds = n == 1 ? 200 : 40;
    for (int r = 0; r < rounds + 5; ++r) for (size_t v = 0; v < ex.size(); ++v) {
      CK(cudaEventRecord(a, s)); for (int i = 0; i < batch; ++i) CK(cudaGraphLaunch(ex[v], s)); CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (r >= 5) t[v].push_back(ms * 1000 / batch);
    }
    for (size_t v = 0; v < ex.size(); ++v) { std::sort(t[v].begin(), t[v].end()); }
    float base = t[0][t[0].size() / 2];
    for (size_t v = 0; v < ex.size(); ++v) { float m = t[v][t[v].size() / 2]; printf("rng n=%3d %-28s %8.3f us  %.3fx\n", n, names[v], m, m / base); }
  }
  // correctness of the PDL variant: 1000 replays of 1 kernel, offsets consecutive
  return 0;
}
