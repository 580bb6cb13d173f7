// bench/raw_nodes.cuh: nodes of raw CUDA graphs built by hand, with the graph API only (no
// tensorplay): a kernel node's and a memset node's parameters, a conditional node of one body or
// of several, and a kernel whose parameters are as large as a case asks. Shared by bench/conditionals_bench.cu,
// test/memory_test.cu and tools/probes/exec_memory_probe.cu and cond_memcheck.cu. The calls
// return the CUDA status: each caller checks it its own way.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

//! P bytes of kernel parameters (then an int*: P + 8 bytes in all); writes only if the first
//! byte is 123, which no case passes. At global scope: exec_memory_probe's census prints its
//! name.
template <int P>
struct Blob {
  char b[P];
};
template <int P>
__global__ void param_kernel(Blob<P> blob, int* out) {
  if (threadIdx.x == 0 && blob.b[0] == 123) *out = 1;
}

namespace raw_nodes {

//! A kernel node's parameters: `func` on `args`, `grid` blocks of `block` threads.
inline cudaKernelNodeParams kernel_params(void* func, void** args, dim3 grid = dim3(1), dim3 block = dim3(1),
                                          unsigned shared_bytes = 0) {
  cudaKernelNodeParams p{};
  p.func = func;
  p.gridDim = grid;
  p.blockDim = block;
  p.sharedMemBytes = shared_bytes;
  p.kernelParams = args;
  return p;
}

//! A memset node's parameters: `words` 4-byte zeros from `dst`, one row.
inline cudaMemsetParams memset_params(void* dst, std::size_t words) {
  cudaMemsetParams p{};
  p.dst = dst;
  p.value = 0;
  p.elementSize = 4;
  p.width = words;
  p.height = 1;
  return p;
}

//! Adds a conditional node of `type` (if, while...) with one body on `handle`, after `count`
//! `dependencies`: `*node`, and `*body`, the body graph the driver made (empty) for the caller
//! to fill. `*body` is set only on success.
inline cudaError_t add_conditional(cudaGraphNode_t* node, cudaGraph_t* body, cudaGraph_t graph, cudaGraphConditionalHandle handle,
                                   cudaGraphConditionalNodeType type, const cudaGraphNode_t* dependencies, std::size_t count) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = 1;
#if CUDART_VERSION >= 13000
  const cudaError_t status = cudaGraphAddNode(node, graph, dependencies, nullptr, count, &params);
#else
  const cudaError_t status = cudaGraphAddNode_v2(node, graph, dependencies, nullptr, count, &params);
#endif
  if (status == cudaSuccess) *body = params.conditional.phGraph_out[0];
  return status;
}

//! add_conditional with `size` bodies: an if node with a then and an else body (2), a switch
//! node with one body per case (more than one body needs CUDA 12.8). `bodies[0..size)` get the
//! body graphs, only on success.
inline cudaError_t add_conditional_bodies(cudaGraphNode_t* node, cudaGraph_t* bodies, unsigned size, cudaGraph_t graph,
                                          cudaGraphConditionalHandle handle, cudaGraphConditionalNodeType type,
                                          const cudaGraphNode_t* dependencies, std::size_t count) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = size;
#if CUDART_VERSION >= 13000
  const cudaError_t status = cudaGraphAddNode(node, graph, dependencies, nullptr, count, &params);
#else
  const cudaError_t status = cudaGraphAddNode_v2(node, graph, dependencies, nullptr, count, &params);
#endif
  if (status == cudaSuccess)
    for (unsigned i = 0; i < size; ++i) bodies[i] = params.conditional.phGraph_out[i];
  return status;
}

}  // namespace raw_nodes
