// tools/probes/exec_memory_probe.cu: raw CUDA, no tensorplay. How much device memory the driver
// takes for graph executables, by node type, node count, kernel-parameter size, topology,
// conditional and child-graph bodies, upload and launch; and what a destroyed executable gives
// back. Each configuration runs in a fresh child process (a fresh context: the driver keeps
// what earlier executables freed), which builds N graphs explicitly, then instantiates them all
// at once so that cudaMemGetInfo's 2 MiB step divides by N. Used by issue 22
// (tensorplay/detail/exec_memory.hpp is calibrated from its output).
//   nvcc -std=c++20 -arch=sm_90 -O2 -o exec_memory_probe exec_memory_probe.cu
//   ./exec_memory_probe            # every configuration, one line each, then the step traces
//   ./exec_memory_probe extra      # the second round: parameter sizes, forks joined again
//   ./exec_memory_probe one KIND K B P N    # one configuration (what the parent runs)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::printf("FAIL %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

template <int P>
struct Blob {
  char b[P];
};

template <int P>
__global__ void param_kernel(Blob<P> blob, int* out) {
  if (threadIdx.x == 0 && blob.b[0] == 123) *out = 1;
}

static int* g_scratch = nullptr;

static std::size_t used() {
  std::size_t free = 0, total = 0;
  CK(cudaMemGetInfo(&free, &total));
  return total - free;
}

template <int P>
static void* kernel_of() {
  return reinterpret_cast<void*>(&param_kernel<P>);
}

static void* kernel_for(int p) {
  switch (p) {
    case 8: return kernel_of<8>();
    case 64: return kernel_of<64>();
    case 256: return kernel_of<256>();
    case 1024: return kernel_of<1024>();
    case 4096: return kernel_of<4096>();
    case 1536: return kernel_of<1536>();
    case 2048: return kernel_of<2048>();
    case 3072: return kernel_of<3072>();
    case 8192: return kernel_of<8192>();
    case 16384: return kernel_of<16384>();
    case 32000: return kernel_of<32000>();
    default: std::printf("FAIL param size %d\n", p); std::exit(1);
  }
}

static std::vector<char> g_blob(32768, 0);

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t* dep, int ndep, int p, unsigned grid = 1) {
  void* args[] = {g_blob.data(), &g_scratch};
  cudaKernelNodeParams kp{};
  kp.func = kernel_for(p);
  kp.gridDim = dim3(grid);
  kp.blockDim = dim3(32);
  kp.sharedMemBytes = 0;
  kp.kernelParams = args;
  cudaGraphNode_t n = nullptr;
  CK(cudaGraphAddKernelNode(&n, g, dep, ndep, &kp));
  return n;
}

static void add_kernel_chain(cudaGraph_t g, cudaGraphNode_t& last, int k, int p, unsigned grid = 1) {
  for (int i = 0; i < k; ++i) last = add_kernel(g, last ? &last : nullptr, last ? 1 : 0, p, grid);
}

static void* g_copy_src = nullptr;
static void* g_copy_dst = nullptr;

static cudaGraphNode_t add_conditional(cudaGraph_t g, cudaGraphNode_t last, cudaGraphConditionalNodeType type, int body, int p) {
  cudaGraphConditionalHandle h{};
  CK(cudaGraphConditionalHandleCreate(&h, g, 0, cudaGraphCondAssignDefault));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = h;
  np.conditional.type = type;
  np.conditional.size = 1;
  cudaGraphNode_t n = nullptr;
  CK(cudaGraphAddNode(&n, g, last ? &last : nullptr, nullptr, last ? 1 : 0, &np));
  cudaGraph_t b = np.conditional.phGraph_out[0];
  cudaGraphNode_t bl = nullptr;
  add_kernel_chain(b, bl, body, p);
  return n;
}

// One graph of configuration `kind`: k nodes (bodies of b kernels where the kind has bodies),
// kernel parameters of p bytes.
static cudaGraph_t build(const std::string& kind, int k, int b, int p, cudaStream_t s) {
  cudaGraph_t g = nullptr;
  if (kind == "captured") {  // k kernels launched on a capturing stream
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < k; ++i) param_kernel<8><<<1, 32, 0, s>>>(Blob<8>{}, g_scratch);
    CK(cudaStreamEndCapture(s, &g));
    return g;
  }
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t last = nullptr;
  if (kind == "kernel") {
    add_kernel_chain(g, last, k, p);
  } else if (kind == "kernel_grid1024") {
    add_kernel_chain(g, last, k, p, 1024);
  } else if (kind == "kernel_wide") {  // k kernels, no edges
    for (int i = 0; i < k; ++i) add_kernel(g, nullptr, 0, p);
  } else if (kind == "kernel_4chains") {
    for (int c = 0; c < 4; ++c) {
      cudaGraphNode_t l = nullptr;
      add_kernel_chain(g, l, k / 4, p);
    }
  } else if (kind == "forkjoin" || kind == "forkjoin_empty") {
    // k times: a kernel, b branches of one kernel after it, joined by a kernel (or an empty node).
    for (int i = 0; i < k; ++i) {
      const cudaGraphNode_t top = add_kernel(g, last ? &last : nullptr, last ? 1 : 0, p);
      std::vector<cudaGraphNode_t> branches;
      for (int j = 0; j < b; ++j) branches.push_back(add_kernel(g, &top, 1, p));
      cudaGraphNode_t join = nullptr;
      if (kind == "forkjoin") {
        cudaKernelNodeParams kp{};
        void* args[] = {g_blob.data(), &g_scratch};
        kp.func = kernel_for(p);
        kp.gridDim = dim3(1);
        kp.blockDim = dim3(32);
        kp.kernelParams = args;
        CK(cudaGraphAddKernelNode(&join, g, branches.data(), branches.size(), &kp));
      } else {
        CK(cudaGraphAddEmptyNode(&join, g, branches.data(), branches.size()));
      }
      last = join;
    }
  } else if (kind == "memcpy") {
    for (int i = 0; i < k; ++i) {
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddMemcpyNode1D(&n, g, last ? &last : nullptr, last ? 1 : 0, g_copy_dst, g_copy_src, 4096,
                                  cudaMemcpyDeviceToDevice));
      last = n;
    }
  } else if (kind == "memset") {
    for (int i = 0; i < k; ++i) {
      cudaMemsetParams mp{};
      mp.dst = g_copy_dst;
      mp.value = 0;
      mp.elementSize = 4;
      mp.width = 1024;
      mp.height = 1;
      mp.pitch = 0;
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddMemsetNode(&n, g, last ? &last : nullptr, last ? 1 : 0, &mp));
      last = n;
    }
  } else if (kind == "empty") {
    for (int i = 0; i < k; ++i) {
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddEmptyNode(&n, g, last ? &last : nullptr, last ? 1 : 0));
      last = n;
    }
  } else if (kind == "if" || kind == "while") {
    for (int i = 0; i < k; ++i)
      last = add_conditional(g, last, kind == "if" ? cudaGraphCondTypeIf : cudaGraphCondTypeWhile, b, p);
  } else if (kind == "child") {
    for (int i = 0; i < k; ++i) {
      cudaGraph_t c = nullptr;
      CK(cudaGraphCreate(&c, 0));
      cudaGraphNode_t cl = nullptr;
      add_kernel_chain(c, cl, b, p);
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddChildGraphNode(&n, g, last ? &last : nullptr, last ? 1 : 0, c));
      CK(cudaGraphDestroy(c));  // the node holds a clone
      last = n;
    }
  } else if (kind == "mixed") {  // k groups of: b kernels then one memset (a gemm-like pattern)
    for (int i = 0; i < k; ++i) {
      add_kernel_chain(g, last, b, p);
      cudaMemsetParams mp{};
      mp.dst = g_copy_dst;
      mp.elementSize = 4;
      mp.width = 1024;
      mp.height = 1;
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddMemsetNode(&n, g, &last, 1, &mp));
      last = n;
    }
  } else {
    std::printf("FAIL unknown kind %s\n", kind.c_str());
    std::exit(1);
  }
  return g;
}

static cudaGraphExec_t instantiate(cudaGraph_t g) {
  cudaGraphExec_t e = nullptr;
  CK(cudaGraphInstantiateWithFlags(&e, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  return e;
}

static void setup(cudaStream_t& s) {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&g_scratch, 4096));
  CK(cudaMalloc(&g_copy_src, 1 << 20));
  CK(cudaMalloc(&g_copy_dst, 1 << 20));
  // Load every kernel, and make one small executable of each kind, kept alive: what is measured
  // afterwards is the cost of one more executable, not the first one's set-up.
  for (int p : {8, 64, 256, 1024, 1536, 2048, 3072, 4096, 8192, 16384, 32000}) {
    cudaGraph_t g = build("kernel", 1, 0, p, s);
    cudaGraphExec_t e = instantiate(g);
    CK(cudaGraphLaunch(e, s));
  }
  for (const char* kind : {"memcpy", "memset", "empty", "if", "while", "child", "captured"}) {
    cudaGraph_t g = build(kind, 1, 1, 8, s);
    cudaGraphExec_t e = instantiate(g);
    CK(cudaGraphLaunch(e, s));
  }
  CK(cudaStreamSynchronize(s));
}

// One configuration: prints the per-executable bytes at each step.
static int one(const std::string& kind, int k, int b, int p, int n) {
  cudaStream_t s = nullptr;
  setup(s);
  const std::size_t m0 = used();
  std::vector<cudaGraph_t> graphs(n);
  for (auto& g : graphs) g = build(kind, k, b, p, s);
  const std::size_t m1 = used();
  std::vector<cudaGraphExec_t> execs(n);
  for (int i = 0; i < n; ++i) execs[i] = instantiate(graphs[i]);
  CK(cudaDeviceSynchronize());
  const std::size_t m2 = used();
  for (auto e : execs) CK(cudaGraphUpload(e, s));
  CK(cudaStreamSynchronize(s));
  const std::size_t m3 = used();
  for (auto e : execs) CK(cudaGraphLaunch(e, s));
  CK(cudaStreamSynchronize(s));
  const std::size_t m4 = used();
  for (auto e : execs) CK(cudaGraphExecDestroy(e));
  CK(cudaDeviceSynchronize());
  const std::size_t m5 = used();
  for (int i = 0; i < n; ++i) execs[i] = instantiate(graphs[i]);
  CK(cudaDeviceSynchronize());
  const std::size_t m6 = used();
  std::size_t nodes = 0;
  CK(cudaGraphGetNodes(graphs[0], nullptr, &nodes));
  std::printf("ROW %-15s k=%5d b=%3d p=%5d n=%4d top_nodes=%5zu graph_B/exec=%9.0f inst_B/exec=%9.0f upload=%7.0f launch=%7.0f "
              "destroy_back_MiB=%6.1f reinst_B/exec=%8.0f\n",
              kind.c_str(), k, b, p, n, nodes, double(m1 - m0) / n, double(m2 - m1) / n, (double(m3) - double(m2)) / n,
              (double(m4) - double(m3)) / n, (double(m4) - double(m5)) / 1048576.0, (double(m6) - double(m5)) / n);
  // After a destroy, can smaller executables of another shape use what the big ones left?
  if (kind == "kernel" && k >= 1024) {
    for (auto e : execs) CK(cudaGraphExecDestroy(e));
    CK(cudaDeviceSynchronize());
    const std::size_t a = used();
    std::vector<cudaGraph_t> small(4 * n);
    std::vector<cudaGraphExec_t> se(4 * n);
    for (auto& g : small) g = build("kernel", k / 4, 0, 8, s);
    for (int i = 0; i < 4 * n; ++i) se[i] = instantiate(small[i]);
    CK(cudaDeviceSynchronize());
    std::printf("ROW reuse: after destroying %d execs of %d kernels, %d execs of %d kernels took %.1f MiB more\n", n, k, 4 * n,
                k / 4, (double(used()) - double(a)) / 1048576.0);
  }
  std::fflush(stdout);
  return 0;
}

// The steps of cudaMemGetInfo while executables of k kernels are made one at a time.
static int steps(int k, int n) {
  cudaStream_t s = nullptr;
  setup(s);
  std::vector<cudaGraph_t> graphs(n);
  for (auto& g : graphs) g = build("kernel", k, 0, 8, s);
  std::size_t before = used();
  const std::size_t start = before;
  std::string trace;
  for (int i = 0; i < n; ++i) {
    (void)instantiate(graphs[i]);
    const std::size_t now = used();
    if (now != before) {
      trace += " " + std::to_string(i + 1) + ":+" + std::to_string((now - before) >> 10) + "K";
      before = now;
    }
  }
  std::printf("STEPS k=%d n=%d total=%.2f MiB (%.0f B/exec):%s\n", k, n, double(before - start) / 1048576.0,
              double(before - start) / n, trace.c_str());
  std::fflush(stdout);
  return 0;
}

// Device memory of a context that only captures graphs: no executable is made.
static int graphs_only(int k, int n) {
  cudaStream_t s = nullptr;
  setup(s);
  const std::size_t a = used();
  std::vector<cudaGraph_t> graphs(n);
  for (auto& g : graphs) g = build("captured", k, 0, 8, s);
  CK(cudaDeviceSynchronize());
  const std::size_t b = used();
  for (auto g : graphs) CK(cudaGraphDestroy(g));
  const std::size_t c = used();
  std::printf("ROW graphs-only: %d captured graphs of %d kernels: +%.2f MiB, after destroy %+.2f MiB\n", n, k,
              (double(b) - double(a)) / 1048576.0, (double(c) - double(a)) / 1048576.0);
  std::fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 7 && std::strcmp(argv[1], "one") == 0)
    return one(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]));
  if (argc >= 4 && std::strcmp(argv[1], "steps") == 0) return steps(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc >= 4 && std::strcmp(argv[1], "graphs") == 0) return graphs_only(std::atoi(argv[2]), std::atoi(argv[3]));
  struct Config {
    const char* kind;
    int k, b, p, n;
  };
  // The second round (issue 22, after the first): parameter sizes between the measured points,
  // and forks joined again (does a joined branch give its lane back?).
  const Config extras[] = {
      {"kernel", 256, 0, 1536, 60},    {"kernel", 256, 0, 2048, 60},   {"kernel", 256, 0, 3072, 60},
      {"kernel", 128, 0, 8192, 60},    {"kernel", 32, 0, 32000, 60},   {"kernel", 256, 0, 4096, 60},
      {"forkjoin", 32, 2, 8, 100},     {"forkjoin", 16, 4, 8, 100},    {"forkjoin_empty", 32, 2, 8, 100},
      {"kernel_wide", 16, 0, 8, 100},
  };
  if (argc >= 2 && std::strcmp(argv[1], "extra") == 0) {
    for (const Config& c : extras) {
      const std::string cmd = std::string(argv[0]) + " one " + c.kind + " " + std::to_string(c.k) + " " + std::to_string(c.b) +
                              " " + std::to_string(c.p) + " " + std::to_string(c.n);
      if (std::system(cmd.c_str()) != 0) std::printf("FAIL child: %s\n", cmd.c_str());
    }
    return 0;
  }
  const Config configs[] = {
      {"kernel", 1, 0, 8, 200},       {"kernel", 2, 0, 8, 200},      {"kernel", 4, 0, 8, 200},
      {"kernel", 8, 0, 8, 200},       {"kernel", 16, 0, 8, 200},     {"kernel", 32, 0, 8, 200},
      {"kernel", 64, 0, 8, 200},      {"kernel", 128, 0, 8, 200},    {"kernel", 256, 0, 8, 200},
      {"kernel", 512, 0, 8, 100},     {"kernel", 1024, 0, 8, 100},   {"kernel", 2048, 0, 8, 60},
      {"kernel", 256, 0, 64, 200},    {"kernel", 256, 0, 256, 200},  {"kernel", 256, 0, 1024, 100},
      {"kernel", 256, 0, 4096, 60},   {"kernel", 64, 0, 16384, 60},  {"kernel_grid1024", 256, 0, 8, 200},
      {"kernel_wide", 256, 0, 8, 200}, {"kernel_4chains", 256, 0, 8, 200}, {"captured", 256, 0, 8, 200},
      {"memcpy", 64, 0, 8, 200},      {"memcpy", 512, 0, 8, 100},    {"memset", 64, 0, 8, 200},
      {"memset", 512, 0, 8, 100},     {"empty", 64, 0, 8, 200},      {"empty", 512, 0, 8, 100},
      {"if", 1, 1, 8, 200},           {"if", 16, 1, 8, 100},         {"if", 64, 1, 8, 60},
      {"if", 16, 16, 8, 100},         {"if", 1, 256, 8, 200},        {"while", 16, 1, 8, 100},
      {"while", 1, 256, 8, 200},      {"child", 16, 1, 8, 100},      {"child", 16, 16, 8, 100},
      {"child", 1, 256, 8, 200},      {"mixed", 64, 3, 8, 100},
  };
  for (const Config& c : configs) {
    const std::string cmd = std::string(argv[0]) + " one " + c.kind + " " + std::to_string(c.k) + " " + std::to_string(c.b) +
                            " " + std::to_string(c.p) + " " + std::to_string(c.n);
    if (std::system(cmd.c_str()) != 0) std::printf("FAIL child: %s\n", cmd.c_str());
  }
  for (auto [k, n] : {std::pair{1, 200}, std::pair{256, 100}, std::pair{2048, 40}}) {
    const std::string cmd = std::string(argv[0]) + " steps " + std::to_string(k) + " " + std::to_string(n);
    if (std::system(cmd.c_str()) != 0) std::printf("FAIL child: %s\n", cmd.c_str());
  }
  const std::string cmd = std::string(argv[0]) + " graphs 2048 40";
  if (std::system(cmd.c_str()) != 0) std::printf("FAIL child: %s\n", cmd.c_str());
  return 0;
}
