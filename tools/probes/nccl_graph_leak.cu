// tools/probes/nccl_graph_leak.cu: raw NCCL, no tensorplay. A one-rank communicator whose
// all-reduce was captured into a graph; the graph and its executable are destroyed, then
// ncclCommDestroy runs on this thread ("main") or another ("thread"); "nograph" skips the graph.
// Under memcheck --leak-check full nothing leaks in any mode (run 25), which showed that the
// leaks nccl_test reported were its own: the process exited before tensorplay's reaper thread
// had finished ncclCommDestroy.
//   nvcc -std=c++20 -arch=sm_90 -o nccl_graph_leak nccl_graph_leak.cu -lnccl
//   compute-sanitizer --tool memcheck --leak-check full ./nccl_graph_leak thread graph
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { std::printf("%s: %s\n", #x, ncclGetErrorString(r_)); std::exit(1); } } while (0)
int main(int argc, char** argv) {
  const bool other_thread = argc > 1 && std::strcmp(argv[1], "thread") == 0;
  const bool with_graph = !(argc > 2 && std::strcmp(argv[2], "nograph") == 0);
  int dev = 0;
  ncclComm_t comm;
  NK(ncclCommInitAll(&comm, 1, &dev));
  CK(cudaSetDevice(0));
  float* buf;
  CK(cudaMalloc(&buf, 4096 * sizeof(float)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  NK(ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, s));
  CK(cudaStreamSynchronize(s));
  if (with_graph) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    NK(ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(e, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
  }
  ncclResult_t r = ncclSuccess;
  if (other_thread) std::thread([&] { CK(cudaSetDevice(0)); r = ncclCommDestroy(comm); }).join();
  else r = ncclCommDestroy(comm);
  std::printf("ncclCommDestroy (%s, graph=%d): %s\n", other_thread ? "thread" : "main", int(with_graph), ncclGetErrorString(r));
  CK(cudaFree(buf));
  CK(cudaStreamDestroy(s));
  return 0;
}
