// tools/probes/exec_memory_probe.cu: raw CUDA (+ cuBLAS), no tensorplay at run time (the model's
// figure comes from tensorplay/detail/exec_memory.hpp, header-only). How much device memory the
// driver takes for graph executables, by node type, node count, kernel-parameter size, topology,
// conditional and child-graph bodies, launch attributes, cuBLAS gemms, upload and launch; and what
// a destroyed executable gives back. Each configuration runs in a fresh child process (a fresh
// context: the driver keeps what earlier executables freed), which builds N graphs, then
// instantiates them all at once so that cudaMemGetInfo's 2 MiB step divides by N. Used by issue 22
// (tensorplay/detail/exec_memory.hpp is calibrated from its output).
//   nvcc -std=c++20 -arch=sm_90 -O2 -I. -o exec_memory_probe tools/probes/exec_memory_probe.cu -lcublas -lcuda
//   ./exec_memory_probe            # every round: base, extra, decoder; the decoder table last
//   ./exec_memory_probe base       # the first round: node types, counts, parameters, topology, bodies
//   ./exec_memory_probe extra      # the second round: parameter sizes, forks joined again
//   ./exec_memory_probe decoder    # the third round: bench/memory's decoder graph (census of its
//                                  # nodes, then its executables) against launch attributes and gemms
//   ./exec_memory_probe one KIND K B P N    # one configuration (what the parent runs)
//   ./exec_memory_probe census KIND K B P   # the nodes, attributes and edges of one graph
#include <tensorplay/detail/exec_memory.hpp>

#include "../../bench/decoder_kernels.cuh"
#include "../../bench/raw_nodes.cuh"

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

[[noreturn]] static void fail(const char* call, const char* why, int line) {
  std::printf("FAIL %s: %s (line %d)\n", call, why, line);
  std::exit(1);
}
static const char* cu_error_name(CUresult e) {
  const char* s = nullptr;
  return cuGetErrorName(e, &s) == CUDA_SUCCESS && s ? s : "?";
}
// CUDA runtime, cuBLAS and driver calls: a failure ends the process, naming the call.
#define CK(x) do { if (const cudaError_t e_ = (x); e_ != cudaSuccess) fail(#x, cudaGetErrorString(e_), __LINE__); } while (0)
#define CB(x) do { if (const cublasStatus_t e_ = (x); e_ != CUBLAS_STATUS_SUCCESS) fail(#x, cublasGetStatusName(e_), __LINE__); } while (0)
#define CU(x) do { if (const CUresult e_ = (x); e_ != CUDA_SUCCESS) fail(#x, cu_error_name(e_), __LINE__); } while (0)

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

// Every parameter size a configuration may ask for (P bytes of blob, then an 8-byte pointer:
// P + 8 bytes of parameters): the kernels setup() loads.
template <int... P>
struct ParamKernels {
  static constexpr int sizes[sizeof...(P)] = {P...};
  static void* of(int p) {
    void* f = nullptr;
    ((p == P ? (f = kernel_of<P>(), 0) : 0), ...);
    return f;
  }
};
using Kernels = ParamKernels<8, 64, 256, 1024, 1088, 1152, 1216, 1232, 1256, 1280, 1536, 1712, 2048, 2112, 2176, 2240, 2264, 2296,
                             2320, 2344, 3072, 4096, 4160, 4352, 5120, 6144, 6656, 7168, 7680, 8064, 8184, 8192, 10240, 12288,
                             16368, 16384, 32000>;

static void* kernel_for(int p) {
  if (void* f = Kernels::of(p)) return f;
  std::printf("FAIL param size %d\n", p);
  std::exit(1);
}

static std::vector<char> g_blob(32768, 0);

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t* dep, int ndep, int p, unsigned grid = 1) {
  void* args[] = {g_blob.data(), &g_scratch};
  cudaKernelNodeParams kp = raw_nodes::kernel_params(kernel_for(p), args, grid, 32);
  cudaGraphNode_t n = nullptr;
  CK(cudaGraphAddKernelNode(&n, g, dep, ndep, &kp));
  return n;
}

static void add_kernel_chain(cudaGraph_t g, cudaGraphNode_t& last, int k, int p, unsigned grid = 1) {
  for (int i = 0; i < k; ++i) last = add_kernel(g, last ? &last : nullptr, last ? 1 : 0, p, grid);
}

static void* g_copy_src = nullptr;
static void* g_copy_dst = nullptr;

static tensorplay::detail::ConditionalBodies g_bodies;

static cudaGraphNode_t add_conditional(cudaGraph_t g, cudaGraphNode_t last, cudaGraphConditionalNodeType type, int body, int p) {
  cudaGraphConditionalHandle h{};
  CK(cudaGraphConditionalHandleCreate(&h, g, 0, cudaGraphCondAssignDefault));
  cudaGraphNode_t n = nullptr;
  cudaGraph_t b = nullptr;
  CK(raw_nodes::add_conditional(&n, &b, g, h, type, last ? &last : nullptr, last ? 1 : 0));
  g_bodies.add(n, &b, 1);  // for the model
  cudaGraphNode_t bl = nullptr;
  add_kernel_chain(b, bl, body, p);
  return n;
}

// ---- the decoder round: bench/memory's decoder step, cuBLAS gemms, launch attributes ----------

// bench/memory_bench.cu's ladder and decoder (hidden 4096, ffn 4 x hidden, 8 layers).
static const auto& k_ladder = decoder::ladder;
constexpr int k_buckets = int(std::size(decoder::ladder));
constexpr int k_hidden = decoder::hidden;
constexpr int k_ffn = decoder::ffn;
constexpr int k_layers = decoder::layers;
constexpr std::size_t k_max_rows = 512;
using decoder::add_into;
using decoder::affine;
using decoder::gated;
static unsigned blocks_for(std::size_t n) { return decoder::blocks(n); }

// What the bench's Decoder holds outside the graphs: weights (one set for all layers), input,
// output, a cuBLAS handle with a 32 MiB workspace; and one arena for every temporary of the
// largest bucket (the bench's raw-CUDA baseline: slices, no reuse).
struct Blas {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  float *wqkv = nullptr, *wo = nullptr, *wup = nullptr, *wgate = nullptr, *wdown = nullptr;
  float *x = nullptr, *y = nullptr, *arena = nullptr;
};
static Blas g_blas;

static float* zeroed(std::size_t floats) {
  float* p = nullptr;
  CK(cudaMalloc(&p, floats * sizeof(float)));
  CK(cudaMemset(p, 0, floats * sizeof(float)));
  return p;
}

static void setup_blas(cudaStream_t s) {
  if (g_blas.handle) return;
  Blas& b = g_blas;
  CB(cublasCreate(&b.handle));
  CK(cudaMalloc(&b.workspace, std::size_t{32} << 20));
  CB(cublasSetStream(b.handle, s));
  CB(cublasSetWorkspace(b.handle, b.workspace, std::size_t{32} << 20));
  const std::size_t h = k_hidden, f = k_ffn;
  b.wqkv = zeroed(h * 3 * h);
  b.wo = zeroed(h * h);
  b.wup = zeroed(h * f);
  b.wgate = zeroed(h * f);
  b.wdown = zeroed(f * h);
  b.x = zeroed(k_max_rows * h);
  b.y = zeroed(k_max_rows * h);
  b.arena = zeroed(k_max_rows * h + k_layers * (8 * k_max_rows * h + 3 * k_max_rows * f));
  CK(cudaDeviceSynchronize());
}

// out (rows x n) = in (rows x k) * w (k x n), row-major, as the bench calls it.
static void sgemm(const float* in, const float* w, float* out, int rows, int k, int n) {
  const float one = 1.0f, zero = 0.0f;
  CB(cublasSgemm(g_blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k, &one, w, n, in, k, &zero, out, n));
}

// The bench's Decoder::step over `rows` samples, temporaries carved from the arena:
// 1 + 8 x 25 + 1 launches, 5 of them gemms per layer.
static void decoder_step(cudaStream_t s, int rows) {
  std::size_t used = 0;
  auto make = [&](std::size_t n) {
    float* p = g_blas.arena + used;
    used += n;
    return p;
  };
  auto ew = [&](const float* in, float* out, std::size_t n, float a, float b) { affine<<<blocks_for(n), 256, 0, s>>>(in, out, n, a, b); };
  const Blas& w = g_blas;
  const std::size_t nh = std::size_t(rows) * k_hidden, nf = std::size_t(rows) * k_ffn;
  float* h = make(nh);
  ew(w.x, h, nh, 1.0f, 0.0f);
  for (int l = 0; l < k_layers; ++l) {
    float* xn = make(nh);
    ew(h, xn, nh, 0.5f, 0.0f);
    float* qkv = make(3 * nh);
    sgemm(xn, w.wqkv, qkv, rows, k_hidden, 3 * k_hidden);
    ew(qkv, qkv, 3 * nh, 1.0f, 0.1f);
    ew(qkv, qkv, 3 * nh, 0.99f, 0.0f);
    float* att = make(nh);
    ew(qkv, att, nh, 1.0f, 0.0f);
    ew(att, att, nh, 0.125f, 0.0f);
    ew(att, att, nh, 1.0f, -0.5f);
    float* o = make(nh);
    sgemm(att, w.wo, o, rows, k_hidden, k_hidden);
    ew(o, o, nh, 1.0f, 0.1f);
    add_into<<<blocks_for(nh), 256, 0, s>>>(h, o, nh);
    float* hn = make(nh);
    ew(h, hn, nh, 0.5f, 0.0f);
    float* up = make(nf);
    sgemm(hn, w.wup, up, rows, k_hidden, k_ffn);
    ew(up, up, nf, 1.0f, 0.1f);
    float* gate = make(nf);
    sgemm(hn, w.wgate, gate, rows, k_hidden, k_ffn);
    ew(gate, gate, nf, 1.0f, 0.1f);
    float* act = make(nf);
    gated<<<blocks_for(nf), 256, 0, s>>>(up, gate, act, nf);
    ew(act, act, nf, 0.9f, 0.0f);
    float* d = make(nh);
    sgemm(act, w.wdown, d, rows, k_ffn, k_hidden);
    ew(d, d, nh, 1.0f, 0.1f);
    add_into<<<blocks_for(nh), 256, 0, s>>>(h, d, nh);
    ew(h, h, nh, 0.99f, 0.0f);
    ew(h, h, nh, 1.0f, 0.0f);
    ew(xn, hn, nh, 1.0f, 0.0f);
    ew(hn, o, nh, 1.0f, 0.0f);
    ew(o, d, nh, 1.0f, 0.0f);
  }
  ew(h, w.y, nh, 1.0f, 0.0f);
  CK(cudaGetLastError());
}

// k gemms of one shape, each writing the same output (a chain): out (rows x n) = in (rows x 4096)
// * w (4096 x n), n <= 16384. `how`: TF32 sgemm (the decoder's), FP32 sgemm, or FP16 gemmEx.
enum class GemmKind { tf32, fp32, f16 };
static void gemm_chain(int k, int rows, int n, GemmKind how) {
  const Blas& w = g_blas;
  const float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < k; ++i) {
    if (how == GemmKind::f16)
      CB(cublasGemmEx(w.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k_hidden, &one, w.wup, CUDA_R_16F, n, w.x, CUDA_R_16F, k_hidden,
                      &zero, w.arena, CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
      sgemm(w.x, w.wup, w.arena, rows, k_hidden, n);
  }
}

static bool is_blas_kind(const std::string& kind) {
  return kind == "decoder" || kind == "ladder" || kind == "sgemm_tf32" || kind == "sgemm_fp32" || kind == "gemmex_f16";
}

static void set_math(const std::string& kind) {
  CB(cublasSetMathMode(g_blas.handle, kind == "sgemm_fp32" ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH));
}

// The work of a cuBLAS kind, on `s` (captured or not).
static void blas_work(const std::string& kind, int k, int b, int p, cudaStream_t s, int i) {
  set_math(kind);
  if (kind == "decoder") decoder_step(s, k);
  else if (kind == "ladder") decoder_step(s, k_ladder[i % k_buckets]);
  else gemm_chain(k, b, p, kind == "gemmex_f16" ? GemmKind::f16 : kind == "sgemm_fp32" ? GemmKind::fp32 : GemmKind::tf32);
}

// Loads what a cuBLAS kind runs (eagerly: loading cannot be captured, and no executable should be
// charged for it), then keeps one executable of it (of each bucket, for the ladder) alive, as
// setup() does for the other kinds.
static cudaGraph_t build_more(const std::string& kind, int k, int b, int p, cudaStream_t s, int i);
static void warm_blas(const std::string& kind, int k, int b, int p, cudaStream_t s) {
  setup_blas(s);
  const int graphs = kind == "ladder" ? k_buckets : 1;
  for (int i = 0; i < graphs; ++i) blas_work(kind, kind == "decoder" ? k : std::min(k, 2), b, p, s, i);
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < graphs; ++i) {
    cudaGraphExec_t e = nullptr;
    CK(cudaGraphInstantiateWithFlags(&e, build_more(kind, kind == "decoder" ? k : std::min(k, 2), b, p, s, i), 0));
    CK(cudaGraphLaunch(e, s));
  }
  CK(cudaStreamSynchronize(s));
}

// A kernel node of p-byte parameters, grid 4, in a chain, with one launch attribute set.
static cudaGraphNode_t add_attr_kernel(cudaGraph_t g, cudaGraphNode_t last, int p, cudaLaunchAttributeID id,
                                       const cudaLaunchAttributeValue* v) {
  const cudaGraphNode_t n = add_kernel(g, last ? &last : nullptr, last ? 1 : 0, p, 4);
  if (v) CK(cudaGraphKernelNodeSetAttribute(n, id, v));
  return n;
}

// The kinds of this round; null for the others.
//   decoder K:        the decoder step at K rows, captured (cuBLAS on the capturing stream)
//   ladder:           graph i is the decoder at bucket i % 32 (N a multiple of 32: N/32 ladders)
//   sgemm_tf32 K B P, sgemm_fp32, gemmex_f16: K gemms of rows B, 4096 deep, P wide, captured
//   cluster K B P:    K kernels (grid 4) with cluster dimension B (0: no attribute)
//   pss K B P:        K kernels captured with cudaLaunchKernelEx, programmatic stream
//                     serialization on each when B = 1 (B = 0: the same launches without it)
//   priority K B P:   K kernels (grid 4) with launch priority B;  memsync K B P: memsync domain B
//   coop K B P:       K kernels (grid 4), cooperative when B = 1
//   smem K B P:       K kernels (grid 4) launched with B bytes of dynamic shared memory
static cudaGraph_t build_more(const std::string& kind, int k, int b, int p, cudaStream_t s, int i) {
  cudaGraph_t g = nullptr;
  if (is_blas_kind(kind)) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));  // tensorplay's mode
    blas_work(kind, k, b, p, s, i);
    CK(cudaStreamEndCapture(s, &g));
    return g;
  }
  if (kind == "pss") {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(4);
    cfg.blockDim = dim3(32);
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = b ? 1 : 0;
    for (int j = 0; j < k; ++j) CK(cudaLaunchKernelEx(&cfg, param_kernel<8>, Blob<8>{}, g_scratch));
    CK(cudaStreamEndCapture(s, &g));
    return g;
  }
  cudaLaunchAttributeID id{};
  cudaLaunchAttributeValue v{};
  if (kind == "cluster") {
    id = cudaLaunchAttributeClusterDimension;
    v.clusterDim.x = unsigned(b);
    v.clusterDim.y = v.clusterDim.z = 1;
  } else if (kind == "priority") {
    id = cudaLaunchAttributePriority;
    v.priority = b;
  } else if (kind == "memsync") {
    id = cudaLaunchAttributeMemSyncDomain;
    v.memSyncDomain = b ? cudaLaunchMemSyncDomainRemote : cudaLaunchMemSyncDomainDefault;
  } else if (kind == "coop") {
    id = cudaLaunchAttributeCooperative;
    v.cooperative = b;
  } else if (kind == "smem") {  // K kernels (grid 4) of B bytes of dynamic shared memory
    CK(cudaFuncSetAttribute(kernel_for(p), cudaFuncAttributeMaxDynamicSharedMemorySize, b));
    CK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t last = nullptr;
    for (int j = 0; j < k; ++j) {
      void* args[] = {g_blob.data(), &g_scratch};
      cudaKernelNodeParams kp = raw_nodes::kernel_params(kernel_for(p), args, 4, 32, unsigned(b));
      cudaGraphNode_t n = nullptr;
      CK(cudaGraphAddKernelNode(&n, g, last ? &last : nullptr, last ? 1 : 0, &kp));
      last = n;
    }
    return g;
  } else {
    return nullptr;
  }
  CK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t last = nullptr;
  const bool set = !(kind == "cluster" && b == 0);
  for (int j = 0; j < k; ++j) last = add_attr_kernel(g, last, p, id, set ? &v : nullptr);
  return g;
}

// One graph of configuration `kind`: k nodes (bodies of b kernels where the kind has bodies),
// kernel parameters of p bytes; `i`: which of the N graphs (the ladder's bucket).
static cudaGraph_t build(const std::string& kind, int k, int b, int p, cudaStream_t s, int i = 0) {
  if (cudaGraph_t more = build_more(kind, k, b, p, s, i)) return more;
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
        join = add_kernel(g, branches.data(), int(branches.size()), p);
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
      const cudaMemsetParams mp = raw_nodes::memset_params(g_copy_dst, 1024);
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
      const cudaMemsetParams mp = raw_nodes::memset_params(g_copy_dst, 1024);
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
  for (int p : Kernels::sizes) {
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
  if (is_blas_kind(kind)) warm_blas(kind, k, b, p, s);
  const std::size_t m0 = used();
  std::vector<cudaGraph_t> graphs(n);
  for (int i = 0; i < n; ++i) graphs[i] = build(kind, k, b, p, s, i);
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
  // The model's figure, averaged over the distinct graphs (the ladder's 32 buckets; one otherwise),
  // for the parent's table.
  tensorplay::detail::ExecShape sum;
  const int distinct = std::min(n, kind == "ladder" ? k_buckets : 1);
  for (int i = 0; i < distinct; ++i) {
    const auto sh = tensorplay::detail::modelled_exec_shape(graphs[i], &g_bodies, tensorplay::source_location::current());
    sum.bytes += sh.bytes, sum.lanes += sh.lanes, sum.kernel_nodes += sh.kernel_nodes, sum.memset_nodes += sh.memset_nodes;
    sum.memcpy_nodes += sh.memcpy_nodes, sum.other_nodes += sh.other_nodes + sh.conditional_nodes;
    sum.kernel_param_bytes += sh.kernel_param_bytes;
  }
  const double dn = distinct;
  std::printf("RES %s %d %d %d %d %.1f %.1f %.1f %.1f %.2f %.0f %.0f %.0f\n", kind.c_str(), k, b, p, n, sum.kernel_nodes / dn,
              sum.memset_nodes / dn, sum.memcpy_nodes / dn, sum.other_nodes / dn, sum.lanes / dn,
              sum.kernel_nodes ? double(sum.kernel_param_bytes) / double(sum.kernel_nodes) : 0.0, double(m2 - m1) / n, sum.bytes / dn);
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

// ---- census: what a graph's nodes are --------------------------------------------------------

static const char* type_name(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event_wait";
    case cudaGraphNodeTypeEventRecord: return "event_record";
    case cudaGraphNodeTypeExtSemaphoreSignal: return "sem_signal";
    case cudaGraphNodeTypeExtSemaphoreWait: return "sem_wait";
    case cudaGraphNodeTypeMemAlloc: return "mem_alloc";
    case cudaGraphNodeTypeMemFree: return "mem_free";
    case cudaGraphNodeTypeConditional: return "conditional";
    default: return "other";
  }
}

// A kernel node as the driver and the runtime describe it.
struct KernelInfo {
  void* fn = nullptr;      // the CUkernel, else the CUfunction: the key of a distinct kernel
  bool is_kernel = false;  // launched as a CUkernel (library kernel), not a CUfunction
  bool runtime_ok = false; // cudaGraphKernelNodeGetParams describes it too
  bool has_extra = false;  // parameters passed through `extra`
  std::string name;
  std::size_t params = 0, param_count = 0;
  unsigned grid[3]{}, block[3]{}, smem = 0;
  int regs = 0, static_smem = 0, const_bytes = 0, local_bytes = 0, req_cluster[3]{}, cluster_must = 0, nonportable = 0;
  std::string attrs;  // the launch attributes that differ from their defaults
};

// The end of a function's last parameter and the parameter count (tensorplay's param_extent).
template <class F>
static void param_layout(F query, std::size_t& bytes, std::size_t& count) {
  const tensorplay::detail::ParamExtent e = tensorplay::detail::param_extent(
      [&](std::size_t i, std::size_t* offset, std::size_t* size) { return query(i, offset, size) == CUDA_SUCCESS; });
  bytes = e.bytes;
  count = e.count;
}

static KernelInfo kernel_info(cudaGraphNode_t node) {
  KernelInfo k;
  CUDA_KERNEL_NODE_PARAMS d{};
  CU(cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(node), &d));
  k.is_kernel = d.func == nullptr && d.kern != nullptr;
  k.fn = k.is_kernel ? static_cast<void*>(d.kern) : static_cast<void*>(d.func);
  k.has_extra = d.extra != nullptr;
  k.grid[0] = d.gridDimX, k.grid[1] = d.gridDimY, k.grid[2] = d.gridDimZ;
  k.block[0] = d.blockDimX, k.block[1] = d.blockDimY, k.block[2] = d.blockDimZ;
  k.smem = d.sharedMemBytes;
  cudaKernelNodeParams rt{};
  k.runtime_ok = cudaGraphKernelNodeGetParams(node, &rt) == cudaSuccess;
  (void)cudaGetLastError();
  const char* name = nullptr;
  CUdevice dev = 0;
  CU(cuCtxGetDevice(&dev));
  auto attr = [&](CUfunction_attribute a) {
    int v = 0;
    const CUresult r = k.is_kernel ? cuKernelGetAttribute(&v, a, d.kern, dev) : cuFuncGetAttribute(&v, a, d.func);
    return r == CUDA_SUCCESS ? v : -1;
  };
  if (k.is_kernel) {
    if (cuKernelGetName(&name, d.kern) != CUDA_SUCCESS) name = nullptr;
    param_layout([&](std::size_t i, std::size_t* o, std::size_t* z) { return cuKernelGetParamInfo(d.kern, i, o, z); }, k.params,
                 k.param_count);
  } else {
    if (cuFuncGetName(&name, d.func) != CUDA_SUCCESS) name = nullptr;
    param_layout([&](std::size_t i, std::size_t* o, std::size_t* z) { return cuFuncGetParamInfo(d.func, i, o, z); }, k.params,
                 k.param_count);
  }
  k.name = name ? name : "?";
  k.regs = attr(CU_FUNC_ATTRIBUTE_NUM_REGS);
  k.static_smem = attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  k.const_bytes = attr(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES);
  k.local_bytes = attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  k.req_cluster[0] = attr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH);
  k.req_cluster[1] = attr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT);
  k.req_cluster[2] = attr(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH);
  k.cluster_must = attr(CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET);
  k.nonportable = attr(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
  // The launch attributes a graph kernel node keeps; each one that is not at its default.
  auto get = [&](cudaLaunchAttributeID id, cudaLaunchAttributeValue& v) {
    v = cudaLaunchAttributeValue{};
    const bool ok = cudaGraphKernelNodeGetAttribute(node, id, &v) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    return ok;
  };
  auto add = [&](const std::string& s) { k.attrs += (k.attrs.empty() ? "" : " ") + s; };
  cudaLaunchAttributeValue v{};
  if (!get(cudaLaunchAttributeAccessPolicyWindow, v)) add("apw=?");
  else if (v.accessPolicyWindow.num_bytes != 0) add("apw=" + std::to_string(v.accessPolicyWindow.num_bytes));
  if (!get(cudaLaunchAttributeCooperative, v)) add("coop=?");
  else if (v.cooperative) add("coop=1");
  if (!get(cudaLaunchAttributeClusterDimension, v)) add("cluster=?");
  else if (v.clusterDim.x * v.clusterDim.y * v.clusterDim.z > 1)
    add("cluster=" + std::to_string(v.clusterDim.x) + "x" + std::to_string(v.clusterDim.y) + "x" + std::to_string(v.clusterDim.z));
  if (!get(cudaLaunchAttributeClusterSchedulingPolicyPreference, v)) add("csched=?");
  else if (v.clusterSchedulingPolicyPreference != cudaClusterSchedulingPolicyDefault)
    add("csched=" + std::to_string(int(v.clusterSchedulingPolicyPreference)));
  if (!get(cudaLaunchAttributePriority, v)) add("prio=?");
  else if (v.priority != 0) add("prio=" + std::to_string(v.priority));
  if (!get(cudaLaunchAttributeMemSyncDomainMap, v)) add("dmap=?");
  else if (v.memSyncDomainMap.default_ != 0 || v.memSyncDomainMap.remote != 1)
    add("dmap=" + std::to_string(int(v.memSyncDomainMap.default_)) + "/" + std::to_string(int(v.memSyncDomainMap.remote)));
  if (!get(cudaLaunchAttributeMemSyncDomain, v)) add("domain=?");
  else if (v.memSyncDomain != cudaLaunchMemSyncDomainDefault) add("domain=" + std::to_string(int(v.memSyncDomain)));
  if (!get(cudaLaunchAttributePreferredClusterDimension, v)) add("pcluster=?");
  else if (v.preferredClusterDim.x * v.preferredClusterDim.y * v.preferredClusterDim.z > 1)
    add("pcluster=" + std::to_string(v.preferredClusterDim.x) + "x" + std::to_string(v.preferredClusterDim.y));
  if (get(cudaLaunchAttributeDeviceUpdatableKernelNode, v) && v.deviceUpdatableKernelNode.deviceUpdatable) add("devupd=1");
  if (get(cudaLaunchAttributePreferredSharedMemoryCarveout, v) && v.sharedMemCarveout != 0)
    add("carveout=" + std::to_string(v.sharedMemCarveout));
  return k;
}

// Prints one graph's nodes (NODE lines), then its summary and distinct kernels (SUM lines: the
// parent prints them again before its table).
static int census(const std::string& kind, int k, int b, int p) {
  cudaStream_t s = nullptr;
  setup(s);
  if (is_blas_kind(kind)) warm_blas(kind, k, b, p, s);
  const cudaGraph_t g = build(kind, k, b, p, s, k_buckets - 1);
  const std::string tag = kind + " " + std::to_string(k) + " " + std::to_string(b) + " " + std::to_string(p);
  std::size_t count = 0;
  CK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CK(cudaGraphGetNodes(g, nodes.data(), &count));
  std::size_t edges = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  if (edges) CK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &edges));
  std::map<cudaGraphNode_t, std::size_t> index;
  for (std::size_t i = 0; i < count; ++i) index[nodes[i]] = i;
  std::vector<int> in(count, 0), out(count, 0);
  std::map<std::string, int> edge_kinds;
  for (std::size_t e = 0; e < edges; ++e) {
    ++out[index[from[e]]];
    ++in[index[to[e]]];
    const cudaGraphEdgeData& d = data[e];
    ++edge_kinds["type=" + std::to_string(int(d.type)) + (d.type == cudaGraphDependencyTypeProgrammatic ? "(programmatic)" : "(default)") +
                 " from_port=" + std::to_string(int(d.from_port)) + " to_port=" + std::to_string(int(d.to_port))];
  }
  std::map<std::string, int> by_type, by_attrs;
  struct Distinct {
    KernelInfo info;
    int count = 0;
    std::string grids;
  };
  std::map<void*, Distinct> distinct;
  std::vector<void*> order;
  int forks = 0, joins = 0, memset_bytes_max = 0;
  for (std::size_t i = 0; i < count; ++i) {
    cudaGraphNodeType t{};
    CK(cudaGraphNodeGetType(nodes[i], &t));
    ++by_type[type_name(t)];
    forks += out[i] > 1;
    joins += in[i] > 1;
    std::printf("NODE %s #%zu %s in=%d out=%d", tag.c_str(), i, type_name(t), in[i], out[i]);
    if (t == cudaGraphNodeTypeKernel) {
      const KernelInfo ki = kernel_info(nodes[i]);
      ++by_attrs[(ki.is_kernel ? std::string("CUkernel") : std::string("CUfunction")) + (ki.runtime_ok ? "" : " runtime-refuses") +
                 (ki.has_extra ? " extra" : "") + " [" + (ki.attrs.empty() ? "no attributes" : ki.attrs) + "]"];
      auto [it, fresh] = distinct.try_emplace(ki.fn);
      if (fresh) order.push_back(ki.fn), it->second.info = ki;
      ++it->second.count;
      const std::string grid = std::to_string(ki.grid[0]) + "x" + std::to_string(ki.grid[1]) + "x" + std::to_string(ki.grid[2]);
      if (it->second.grids.find(grid) == std::string::npos && it->second.grids.size() < 60) it->second.grids += (it->second.grids.empty() ? "" : ",") + grid;
      std::printf(" %s params=%zuB/%zu grid=%s block=%ux%ux%u smem=%u attrs=[%s] %s%s %.90s\n", ki.is_kernel ? "CUkernel" : "CUfunction",
                  ki.params, ki.param_count, grid.c_str(), ki.block[0], ki.block[1], ki.block[2], ki.smem, ki.attrs.c_str(),
                  ki.runtime_ok ? "" : "runtime-refuses ", ki.has_extra ? "extra " : "", ki.name.c_str());
    } else if (t == cudaGraphNodeTypeMemset) {
      cudaMemsetParams mp{};
      CK(cudaGraphMemsetNodeGetParams(nodes[i], &mp));
      const std::size_t bytes = mp.width * mp.height * mp.elementSize;
      memset_bytes_max = std::max(memset_bytes_max, int(bytes));
      std::printf(" bytes=%zu elem=%u\n", bytes, mp.elementSize);
    } else if (t == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms mp{};
      CK(cudaGraphMemcpyNodeGetParams(nodes[i], &mp));
      std::printf(" extent=%zux%zux%zu kind=%d\n", mp.extent.width, mp.extent.height, mp.extent.depth, int(mp.kind));
    } else {
      std::printf("\n");
    }
  }
  const tensorplay::detail::ExecShape shape = tensorplay::detail::modelled_exec_shape(g, nullptr, tensorplay::source_location::current());
  std::string types;
  for (auto& [n, c] : by_type) types += " " + n + "=" + std::to_string(c);
  std::printf("SUM census %s: %zu nodes:%s; %zu edges, %d forks, %d joins; model: %zu lanes, %zu B (%zu B/kernel node params avg)\n",
              tag.c_str(), count, types.c_str(), edges, forks, joins, shape.lanes, shape.bytes,
              shape.kernel_nodes ? shape.kernel_param_bytes / shape.kernel_nodes : 0);
  if (memset_bytes_max) std::printf("SUM   memset nodes: largest %d B\n", memset_bytes_max);
  for (auto& [e, c] : edge_kinds) std::printf("SUM   edges %4d x %s\n", c, e.c_str());
  for (auto& [a, c] : by_attrs) std::printf("SUM   kernel nodes %4d x %s\n", c, a.c_str());
  for (void* fn : order) {
    const Distinct& d = distinct[fn];
    const KernelInfo& ki = d.info;
    std::printf("SUM   kernel x%-3d %s params=%zuB/%zu block=%ux%ux%u smem=%u+%d const=%d regs=%d req_cluster=%dx%dx%d must=%d "
                "grids=%s %.64s\n",
                d.count, ki.is_kernel ? "CUkernel" : "CUfunc", ki.params, ki.param_count, ki.block[0], ki.block[1], ki.block[2], ki.smem,
                ki.static_smem, ki.const_bytes, ki.regs, ki.req_cluster[0], ki.req_cluster[1], ki.req_cluster[2], ki.cluster_must,
                d.grids.c_str(), ki.name.c_str());
  }
  std::fflush(stdout);
  return 0;
}

struct Config {
  const char* kind;
  int k, b, p, n;
};

// The parent: runs each configuration as a child (this binary again), echoes what it prints but
// its RES lines, and keeps the RES and SUM lines for the table at the end.
struct Parent {
  std::string self;
  std::vector<std::string> results, sums;

  void child(const std::string& args) {
    const std::string cmd = self + " " + args + " 2>&1";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    if (pipe == nullptr) {
      std::printf("FAIL child: %s\n", cmd.c_str());
      return;
    }
    char line[8192];
    while (std::fgets(line, sizeof line, pipe) != nullptr) {
      if (std::strncmp(line, "RES ", 4) == 0) {
        results.emplace_back(line + 4);
        continue;
      }
      std::fputs(line, stdout);
      if (std::strncmp(line, "SUM ", 4) == 0) sums.emplace_back(line);
    }
    if (::pclose(pipe) != 0) std::printf("FAIL child: %s\n", cmd.c_str());
    std::fflush(stdout);
  }
  void one(const Config& c) {
    child(std::string("one ") + c.kind + " " + std::to_string(c.k) + " " + std::to_string(c.b) + " " + std::to_string(c.p) + " " +
          std::to_string(c.n));
  }
  void census(const Config& c) {
    child(std::string("census ") + c.kind + " " + std::to_string(c.k) + " " + std::to_string(c.b) + " " + std::to_string(c.p));
  }

  // One line per configuration measured: nodes as the model sees them, measured and modelled
  // bytes per executable, and per work node (kernel, memcpy, other) what is left after the lanes.
  void table(const char* title) const {
    if (!sums.empty()) {
      std::printf("\n==== census (again) ====\n");
      for (const std::string& l : sums) std::fputs(l.c_str(), stdout);
    }
    std::printf("\n==== %s: bytes per executable (instantiate; cudaMemGetInfo over N together) ====\n", title);
    std::printf("%-10s %4s %6s %5s %3s|%5s %4s %4s %5s %5s|%8s %8s %5s|%6s %6s %6s\n", "kind", "K", "B", "P", "N", "kern", "mset",
                "oth", "lanes", "par/k", "meas_B", "model_B", "mo/me", "B/node", "net/nd", "xs/nd");
    for (const std::string& r : results) {
      char kind[64];
      int k = 0, b = 0, p = 0, n = 0;
      double kn = 0, ms = 0, mc = 0, ot = 0, lanes = 0, par = 0, meas = 0, model = 0;
      if (std::sscanf(r.c_str(), "%63s %d %d %d %d %lf %lf %lf %lf %lf %lf %lf %lf", kind, &k, &b, &p, &n, &kn, &ms, &mc, &ot, &lanes,
                      &par, &meas, &model) != 13)
        continue;
      const double work = std::max(kn + mc + ot, 1.0);
      const double lane = double(tensorplay::detail::exec_model::lane_bytes);
      std::printf("%-10s %4d %6d %5d %3d|%5.0f %4.0f %4.0f %5.2f %5.0f|%8.0f %8.0f %5.3f|%6.0f %6.0f %6.0f\n", kind, k, b, p, n, kn, ms,
                  mc + ot, lanes, par, meas, model, meas > 0 ? model / meas : 0.0, meas / work, (meas - lanes * lane) / work,
                  (meas - model) / work);
    }
    std::printf("(P: blob bytes, kernel parameters P + 8 (kernel) / gemm width; par/k: parameter bytes per kernel node; oth: memcpy and\n"
                " other nodes; meas_B: measured per executable, instantiate only; model_B: modelled_exec_bytes (exec_memory.hpp);\n"
                " B/node: meas / work nodes (kern+oth); net/nd: (meas - lanes x %zu) / work nodes; xs/nd: (meas - model) / work nodes)\n",
                std::size_t(tensorplay::detail::exec_model::lane_bytes));
    std::fflush(stdout);
  }
};

int main(int argc, char** argv) {
  if (argc >= 7 && std::strcmp(argv[1], "one") == 0)
    return one(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]));
  if (argc >= 6 && std::strcmp(argv[1], "census") == 0)
    return census(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (argc >= 4 && std::strcmp(argv[1], "steps") == 0) return steps(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc >= 4 && std::strcmp(argv[1], "graphs") == 0) return graphs_only(std::atoi(argv[2]), std::atoi(argv[3]));
  const std::string round = argc >= 2 ? argv[1] : "all";
  if (round != "all" && round != "base" && round != "extra" && round != "decoder") {
    std::printf("usage: %s [all|base|extra|decoder] | one KIND K B P N | census KIND K B P | steps K N | graphs K N\n", argv[0]);
    return 2;
  }
  Parent parent{argv[0], {}, {}};
  // The first round (issue 22).
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
  // The second round (issue 22, after the first): parameter sizes between the measured points,
  // and forks joined again (does a joined branch give its lane back?).
  const Config extras[] = {
      {"kernel", 256, 0, 1536, 60},    {"kernel", 256, 0, 2048, 60},   {"kernel", 256, 0, 3072, 60},
      {"kernel", 128, 0, 8192, 60},    {"kernel", 32, 0, 32000, 60},   {"kernel", 256, 0, 4096, 60},
      {"forkjoin", 32, 2, 8, 100},     {"forkjoin", 16, 4, 8, 100},    {"forkjoin_empty", 32, 2, 8, 100},
      {"kernel_wide", 16, 0, 8, 100},
  };
  // The third round (bench/memory's decoder at 0.893x of the model): what its nodes are, what its
  // executables take at three buckets and over the whole ladder (8 copies, as the bench), and the
  // suspects alone: chains of one gemm shape, launch attributes on plain kernels (grid 4; cluster
  // 0 is the same chain without the attribute), programmatic stream serialization (pss 0: the same
  // cudaLaunchKernelEx launches without it), dynamic shared memory as the sm90 gemm's, and
  // kernel parameters between 1 and 4 KiB (the sm90 TF32 gemm takes 2352 B, the FP16 one 1720 B);
  // the first rows are references from round one.
  const Config censuses[] = {
      {"decoder", 512, 0, 0, 1}, {"decoder", 8, 0, 0, 1},    {"sgemm_tf32", 2, 8, 4096, 1},
      {"kernel", 2, 0, 8, 1},    {"cluster", 2, 2, 8, 1},    {"pss", 3, 1, 8, 1},
  };
  const Config decoder_round[] = {
      {"kernel", 1, 0, 8, 200},          {"kernel", 256, 0, 8, 200},        {"kernel", 256, 0, 1024, 100},
      {"memset", 512, 0, 8, 100},        {"mixed", 64, 3, 8, 100},
      {"decoder", 8, 0, 0, 128},         {"decoder", 128, 0, 0, 128},       {"decoder", 512, 0, 0, 128},
      {"ladder", 0, 0, 0, 256},          {"sgemm_tf32", 256, 8, 4096, 100}, {"sgemm_tf32", 256, 512, 4096, 60},
      {"sgemm_fp32", 256, 8, 4096, 100}, {"gemmex_f16", 256, 128, 4096, 100},
      {"cluster", 256, 0, 8, 200},       {"cluster", 256, 2, 8, 200},       {"cluster", 256, 4, 8, 200},
      {"pss", 256, 0, 8, 200},           {"pss", 256, 1, 8, 200},           {"priority", 256, -5, 8, 200},
      {"memsync", 256, 1, 8, 200},       {"coop", 256, 1, 8, 200},          {"smem", 256, 231424, 8, 100},
      // kernel parameters (P + 8 bytes): the points between 1 and 4 KiB, then where the steps are
      {"kernel", 256, 0, 1088, 100},     {"kernel", 256, 0, 1152, 100},     {"kernel", 256, 0, 1216, 100},
      {"kernel", 256, 0, 1232, 100},     {"kernel", 256, 0, 1256, 100},     {"kernel", 256, 0, 1280, 100},
      {"kernel", 256, 0, 1536, 100},     {"kernel", 256, 0, 1712, 100},     {"kernel", 256, 0, 2048, 100},
      {"kernel", 256, 0, 2112, 100},     {"kernel", 256, 0, 2176, 100},     {"kernel", 256, 0, 2240, 100},
      {"kernel", 256, 0, 2264, 100},     {"kernel", 256, 0, 2296, 100},     {"kernel", 256, 0, 2320, 100},
      {"kernel", 256, 0, 2344, 100},     {"kernel", 256, 0, 3072, 100},      {"kernel", 256, 0, 4096, 100},
      {"kernel", 256, 0, 4160, 100},      {"kernel", 256, 0, 4352, 100},      {"kernel", 256, 0, 5120, 100},
      {"kernel", 128, 0, 6144, 100},      {"kernel", 128, 0, 6656, 100},      {"kernel", 128, 0, 7168, 100},
      {"kernel", 128, 0, 7680, 100},      {"kernel", 128, 0, 8064, 100},      {"kernel", 128, 0, 8184, 100},
      {"kernel", 128, 0, 8192, 100},      {"kernel", 64, 0, 10240, 100},      {"kernel", 64, 0, 12288, 100},
      {"kernel", 64, 0, 16368, 100},      {"kernel", 64, 0, 16384, 100},      {"kernel", 32, 0, 32000, 100},
  };
  if (round == "all" || round == "base") {
    for (const Config& c : configs) parent.one(c);
    for (auto [k, n] : {std::pair{1, 200}, std::pair{256, 100}, std::pair{2048, 40}})
      parent.child("steps " + std::to_string(k) + " " + std::to_string(n));
    parent.child("graphs 2048 40");
  }
  if (round == "all" || round == "extra")
    for (const Config& c : extras) parent.one(c);
  if (round == "all" || round == "decoder") {
    parent.results.clear();  // the table is this round's
    for (const Config& c : censuses) parent.census(c);
    for (const Config& c : decoder_round) parent.one(c);
  }
  parent.table(round == "all" || round == "decoder" ? "decoder round" : round.c_str());
  return 0;
}
