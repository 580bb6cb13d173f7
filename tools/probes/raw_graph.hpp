// tools/probes/raw_graph.hpp: what the raw CUDA twins of tensorplay's cases share (racecheck_raw.cu,
// cond_threads_raw.cu): a checked call, tensorplay's own kernels loaded without its host code, a
// one-thread launch with or without a programmatic edge, and a conditional body copied node by
// node through the driver, as tensorplay's ConditionalScope copies it (conditional_builder.hpp).
// Only documented runtime and driver calls; no tensorplay CUDA call.
#pragma once

#include <cuda.h>  // the driver's types only: its entry points come from cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>

#include <tensorplay/detail/kernel_library.hpp>  // decode_base64 only: no tensorplay CUDA call
#include <tensorplay/detail/kernels/fatbin.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

// A failed call ends the process with std::_Exit: several threads failing at once (a sticky error
// reaches them all) must not run the exit handlers together.
#define CHECK(call)                                                                                  \
  do {                                                                                               \
    const cudaError_t status_ = (call);                                                              \
    if (status_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status_)); \
      std::_Exit(1);                                                                                 \
    }                                                                                                \
  } while (0)

namespace raw {

//! One thread launching `kernel` on `s`; with `programmatic`, through a programmatic edge
//! (cudaLaunchAttributeProgrammaticStreamSerialization), as tensorplay launches a set-handle
//! kernel that follows exactly one kernel on a device of compute capability 9.0 or newer.
inline void launch_one_thread(cudaStream_t s, const void* kernel, void** args, bool programmatic) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = s;
  config.attrs = programmatic ? &attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  CHECK(cudaLaunchKernelExC(&config, kernel, args));
}

//! tensorplay's kernel `name` (e.g. "tensorplay_set_handle_b8"), from its kernel image (base64 in
//! fatbin.hpp, decoded by the library's decode_base64), loaded once with cudaLibraryLoadData.
inline cudaKernel_t library_kernel(const char* name) {
#if !defined(__CUDA_ARCH__)  // the fatbin is host data: nvcc's device pass does not see it
  static const cudaLibrary_t library = [] {
    namespace k = tensorplay::detail::kernels;
    static std::vector<unsigned long long> image(k::fatbin_bytes / 8 + 1);  // aligned as the ELF data
    tensorplay::detail::decode_base64(k::fatbin_base64, sizeof(k::fatbin_base64) - 1,
                                      reinterpret_cast<unsigned char*>(image.data()));
    cudaLibrary_t loaded = nullptr;
    CHECK(cudaLibraryLoadData(&loaded, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    return loaded;
  }();
  cudaKernel_t kernel = nullptr;
  CHECK(cudaLibraryGetKernel(&kernel, library, name));
  cudaFuncAttributes attributes{};  // loads it now: a first load would invalidate open captures
  CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
  return kernel;
#else
  (void)name;
  return nullptr;
#endif
}

//! The two driver calls tensorplay copies kernel nodes with, resolved once.
struct DriverCalls {
  CUresult (*get_params)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2*) = nullptr;
  CUresult (*add_node)(CUgraphNode*, CUgraph, const CUgraphNode*, std::size_t, const CUDA_KERNEL_NODE_PARAMS_v2*) = nullptr;
};

inline const DriverCalls& driver() {
  static const DriverCalls calls = [] {
    DriverCalls d;
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    CHECK(cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &fn, 12000, cudaEnableDefault, &found));
    d.get_params = reinterpret_cast<decltype(d.get_params)>(fn);
    CHECK(cudaGetDriverEntryPointByVersion("cuGraphAddKernelNode", &fn, 12000, cudaEnableDefault, &found));
    d.add_node = reinterpret_cast<decltype(d.add_node)>(fn);
    if (d.get_params == nullptr || d.add_node == nullptr) {
      std::fprintf(stderr, "driver entry points not found\n");
      std::exit(1);
    }
    return d;
  }();
  return calls;
}

//! Copies the nodes (kernels only) and edges, with their data, of a body's own capture `from`
//! into the body graph `to`.
inline void copy_body(cudaGraph_t from, cudaGraph_t to) {
  std::size_t count = 0;
  CHECK(cudaGraphGetNodes(from, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count), copies(count);
  CHECK(cudaGraphGetNodes(from, nodes.data(), &count));
  for (std::size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type{};
    CHECK(cudaGraphNodeGetType(nodes[i], &type));
    if (type != cudaGraphNodeTypeKernel) {
      std::fprintf(stderr, "copy_body: a node that is not a kernel\n");
      std::exit(1);
    }
    CUDA_KERNEL_NODE_PARAMS_v2 params{};
    CUgraphNode copy = nullptr;
    if (driver().get_params(reinterpret_cast<CUgraphNode>(nodes[i]), &params) != CUDA_SUCCESS ||
        driver().add_node(&copy, reinterpret_cast<CUgraph>(to), nullptr, 0, &params) != CUDA_SUCCESS) {
      std::fprintf(stderr, "copy_body: a driver call failed\n");
      std::exit(1);
    }
    copies[i] = reinterpret_cast<cudaGraphNode_t>(copy);
    CHECK(cudaGraphKernelNodeCopyAttributes(copies[i], nodes[i]));
  }
  std::size_t edges = 0;
  CHECK(cudaGraphGetEdges(from, nullptr, nullptr, nullptr, &edges));
  if (edges == 0) return;
  std::vector<cudaGraphNode_t> tails(edges), heads(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  CHECK(cudaGraphGetEdges(from, tails.data(), heads.data(), data.data(), &edges));
  const auto copy_of = [&](cudaGraphNode_t node) {
    for (std::size_t i = 0; i < count; ++i)
      if (nodes[i] == node) return copies[i];
    std::fprintf(stderr, "copy_body: an edge names a node the body does not hold\n");
    std::exit(1);
  };
  for (std::size_t e = 0; e < edges; ++e) {
    tails[e] = copy_of(tails[e]);
    heads[e] = copy_of(heads[e]);
  }
  CHECK(cudaGraphAddDependencies(to, tails.data(), heads.data(), data.data(), edges));
}

}  // namespace raw
