// tools/probes/nccl_leak.cu: raw NCCL, no tensorplay. ncclCommInitAll on every GPU, one
// all-reduce, ncclCommDestroy (after ncclCommFinalize with any argument), exit. Under
// compute-sanitizer memcheck --leak-check full: NCCL gives back all it allocated (run 24).
//   nvcc -std=c++20 -arch=sm_90 -o nccl_leak nccl_leak.cu -lnccl
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { std::printf("%s: %s\n", #x, ncclGetErrorString(r_)); std::exit(1); } } while (0)
int main(int argc, char** argv) {
  const bool finalize = argc > 1;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  std::vector<ncclComm_t> comms(n);
  NK(ncclCommInitAll(comms.data(), n, nullptr));
  std::vector<float*> bufs(n);
  std::vector<cudaStream_t> streams(n);
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&bufs[d], 1024 * sizeof(float)));
    CK(cudaMemset(bufs[d], 0, 1024 * sizeof(float)));
    CK(cudaStreamCreate(&streams[d]));
  }
  NK(ncclGroupStart());
  for (int d = 0; d < n; ++d) NK(ncclAllReduce(bufs[d], bufs[d], 1024, ncclFloat, ncclSum, comms[d], streams[d]));
  NK(ncclGroupEnd());
  for (int d = 0; d < n; ++d) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(streams[d])); }
  if (finalize) for (int d = 0; d < n; ++d) NK(ncclCommFinalize(comms[d]));
  for (int d = 0; d < n; ++d) NK(ncclCommDestroy(comms[d]));
  for (int d = 0; d < n; ++d) { CK(cudaSetDevice(d)); CK(cudaFree(bufs[d])); CK(cudaStreamDestroy(streams[d])); }
  std::printf("ok: %d GPUs, finalize=%d\n", n, int(finalize));
  return 0;
}
