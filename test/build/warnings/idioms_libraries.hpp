// test/build/warnings/idioms_libraries.hpp: the idioms of <tensorplay/cublas.hpp> and
// <tensorplay/nccl.hpp> (README, guide "Several GPUs", docs/multi_gpu.md), for idioms.cpp and
// idioms.cu. Kernels are stood in for as in idioms_common.hpp; nothing here is run. Each part is
// compiled where its library's header is found (the CUDA 13 toolkit here has both; a toolkit
// without NCCL has no <nccl.h>): tools/check_warnings says when one is not.
#pragma once

#include "idioms_common.hpp"

#include <chrono>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#if __has_include(<cublas_v2.h>)
#include <tensorplay/cublas.hpp>

#include <cublas_v2.h>

namespace idioms {

void cublas_inside_a_capture(cublasHandle_t handle) {
  tp::Stream stream;
  tp::DeviceTensor<std::byte> workspace(32 << 20, stream);
  try {
    tp::cublas_set_stream(handle, stream, workspace.span());
  } catch (const tp::cublas_error& e) {
    std::puts(e.what());
  }
  tp::Graph graph;
  graph.capture([&] { (void)cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE); }, {.stream = stream});
}

}  // namespace idioms
#endif  // <cublas_v2.h>

#if __has_include(<nccl.h>)
#include <tensorplay/nccl.hpp>

#include <nccl.h>

namespace idioms {

namespace nccl = tp::nccl;

void nccl_one_process_several_gpus() {
  constexpr std::size_t n = 1024;
  const std::vector<int> devices{0, 1};
  std::vector<std::shared_ptr<nccl::Communicator>> comms = nccl::init_clique(devices);
  std::vector<tp::DeviceTensor<float>> x, y;
  tp::DeviceGroupGraph group(devices);
  nccl::capture(group, comms, [&](int device, tp::StreamRef s) {
    const std::size_t i = group.index_of(device);
    work(x[i].data(), n * sizeof(float), s);
    if (i == 0) (void)ncclGroupStart();
    (void)ncclAllReduce(x[i].data(), y[i].data(), n, ncclFloat, ncclSum, comms[i]->get(), s);
    if (i + 1 == group.size()) (void)ncclGroupEnd();
  });
  for (int r = 1; r <= 10; ++r) group.replay();
  nccl::group([&] {
    for (std::size_t i = 0; i < comms.size(); ++i)
      (void)ncclAllReduce(x[i].data(), y[i].data(), n, ncclFloat, ncclSum, *comms[i], group.stream(devices[i]));
  });
  nccl::retain(group, comms);
  group.reset();
  std::printf("%d %d %d\n", nccl::wait_until_released(comms, std::chrono::milliseconds(100)) ? 1 : 0, comms[0]->rank(),
              comms[0]->size());
}

void nccl_one_rank_per_process(int rank, int nranks) {
  try {
    nccl::require_graph_mixing_off();
  } catch (const tp::usage_error& e) {
    std::puts(e.what());
  }
  const nccl::UniqueId id = nccl::exchange_unique_id(std::filesystem::path("/tmp/tensorplay.id"), rank, std::chrono::seconds(30));
  std::shared_ptr<nccl::Communicator> comm = nccl::init_rank(id, nranks, rank, rank);
  tp::Stream stream;
  tp::DeviceTensor<float> x(16, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::Graph graph;
  try {
    nccl::capture(graph, comm, [&](tp::StreamRef) {
      graph.while_(more, [&](tp::StreamRef body) {
        (void)ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm->get(), body);
      });
    }, {.stream = stream});
  } catch (const tp::nccl_error& e) {
    std::puts(e.what());
  }
  graph.replay(stream);
  std::printf("%zu %d\n", id.bytes().size(), comm->device());
}

}  // namespace idioms
#endif  // <nccl.h>
