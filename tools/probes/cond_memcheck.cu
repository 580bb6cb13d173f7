// tools/probes/cond_memcheck.cu: raw CUDA, no tensorplay. Graphs with a conditional WHILE node
// (added with cudaGraphAddNode, its body captured with cudaStreamBeginCaptureToGraph), device
// memory freed and allocated again between iterations. Asks whether compute-sanitizer memcheck
// misreports such graphs when several instrumented processes share a GPU (docs/reliability.md,
// section 6: it did not, 6 copies at once, run 24).
//   nvcc -std=c++20 -arch=sm_90 -o cond_memcheck cond_memcheck.cu
//   for i in 1 2 3 4 5 6; do compute-sanitizer --tool memcheck --leak-check full ./cond_memcheck 300 & done; wait
#include "../../bench/raw_nodes.cuh"

#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

__global__ void set_handle(cudaGraphConditionalHandle h, int* counter) { cudaGraphSetConditional(h, *counter > 0); }
__global__ void body_kernel(cudaGraphConditionalHandle h, int* counter, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += 1;
  __syncthreads();
  if (i == 0) {
    int c = --*counter;
    cudaGraphSetConditional(h, c > 0);
  }
}

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  cudaStream_t s, cap;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  const int n = 256;
  std::vector<void*> junk;
  for (int it = 0; it < iterations; ++it) {
    int* counter = nullptr;
    int* out = nullptr;
    CK(cudaMalloc(&counter, sizeof(int)));
    CK(cudaMalloc(&out, 2 << 20));
    CK(cudaMemsetAsync(out, 0, n * sizeof(int), s));
    const int loops = 1 + it % 5;
    CK(cudaMemcpyAsync(counter, &loops, sizeof(int), cudaMemcpyHostToDevice, s));
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    // set_handle node
    void* args1[] = {&h, &counter};
    cudaKernelNodeParams kp = raw_nodes::kernel_params((void*)set_handle, args1);
    cudaGraphNode_t setter;
    CK(cudaGraphAddKernelNode(&setter, g, nullptr, 0, &kp));
    cudaGraphNode_t cond;
    cudaGraph_t body;
    CK(raw_nodes::add_conditional(&cond, &body, g, h, cudaGraphCondTypeWhile, &setter, 1));
    CK(cudaStreamBeginCaptureToGraph(cap, body, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
    body_kernel<<<1, n, 0, cap>>>(h, counter, out, n);
    cudaGraph_t captured;
    CK(cudaStreamEndCapture(cap, &captured));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphLaunch(e, s));
    std::vector<int> host(n);
    CK(cudaMemcpyAsync(host.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
      if (host[i] != loops) { std::printf("iteration %d: out[%d] = %d, expected %d\n", it, i, host[i], loops); return 2; }
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
    CK(cudaFree(counter));
    CK(cudaFree(out));
    if (it % 7 == 0) { void* p; CK(cudaMalloc(&p, 2 << 20)); junk.push_back(p); }
    if (junk.size() > 5) { CK(cudaFree(junk.front())); junk.erase(junk.begin()); }
  }
  for (void* p : junk) CK(cudaFree(p));
  std::printf("ok %d iterations\n", iterations);
  return 0;
}
