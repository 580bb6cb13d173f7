// test/nccl_multiprocess_test.cu: one rank per process. The case starts two children of this
// binary, one per GPU. They share the NCCL unique id through a file in a temporary folder (rank 0
// writes it, rank 1 waits for it), make their communicators with ncclCommInitRank, each capture
// an all-reduce into a Graph that holds its communicator, replay it and check exact sums. The
// parent waits for both with a timeout and checks both exit statuses.
//
// The children are started with posix_spawn (fork + exec of this executable), never with a bare
// fork: CUDA cannot be used in a child forked from a process that initialised it, and the parent
// has (the GPU precondition asks CUDA for the device count). The parent creates no CUDA context.
#include <tensorplay/nccl.hpp>

#include "nccl_support.hpp"
#include "support.hpp"

#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace nccl = tensorplay::nccl;
using namespace std::chrono_literals;
using tp_test::worker_require;

namespace {

constexpr std::size_t n = 1 << 16;
constexpr int replays = 1000;

int env_int(const char* name) {
  const char* text = std::getenv(name);
  worker_require(text != nullptr, std::string(name) + " is not set");
  return std::atoi(text);
}

//! Rank r's x[i] = r + 1 + i % 5; every replay adds 1 to x, then y = sum over ranks of x.
float expected_sum(int ranks, std::size_t i, int replay) {
  return static_cast<float>(ranks * (ranks + 1) / 2) + static_cast<float>(ranks) * static_cast<float>(i % 5) +
         static_cast<float>(ranks) * static_cast<float>(replay);
}

void check_sums(const tp::DeviceTensor<float>& y, tp::StreamRef stream, int ranks, int replay, int rank) {
  const std::vector<float> host = y.to_host(stream);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < host.size(); ++i) wrong += host[i] != expected_sum(ranks, i, replay);
  worker_require(wrong == 0, "rank " + std::to_string(rank) + ": " + std::to_string(wrong) + " wrong sums after " +
                                 std::to_string(replay) + " replay(s); y[0] = " + std::to_string(host[0]));
}

//! Starts rank `rank` of `ranks` as a child; the id file lives in `dir`, and so does its log.
tp_test::Child spawn_rank(int rank, int ranks, const std::filesystem::path& dir, const char* id_timeout_ms) {
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  return tp_test::spawn_worker("rank",
                               {{"TENSORPLAY_NCCL_RANK", std::to_string(rank)},
                                {"TENSORPLAY_NCCL_RANKS", std::to_string(ranks)},
                                {"TENSORPLAY_NCCL_ID_FILE", (dir / "nccl_id").string()},
                                {"TENSORPLAY_NCCL_ID_TIMEOUT_MS", id_timeout_ms},
                                {"NCCL_NVLS_ENABLE", nvls != nullptr ? nvls : "0"}},  // no NVLink multicast (gpu.md)
                               dir / ("rank" + std::to_string(rank) + ".log"));
}

}  // namespace

// One rank: its own process, its own GPU (the rank's number).
TP_WORKER(rank) {
  const int rank = env_int("TENSORPLAY_NCCL_RANK");
  const int ranks = env_int("TENSORPLAY_NCCL_RANKS");
  const std::filesystem::path id_file = std::getenv("TENSORPLAY_NCCL_ID_FILE");
  const nccl::UniqueId id =
      nccl::exchange_unique_id(id_file, rank, std::chrono::milliseconds(env_int("TENSORPLAY_NCCL_ID_TIMEOUT_MS")));
  const int device = rank;
  std::shared_ptr<nccl::Communicator> comm = nccl::init_rank(id, ranks, rank, device);
  worker_require(comm->rank() == rank && comm->size() == ranks && comm->device() == device,
                 "the communicator's rank, size or device is not the one asked for");

  TP_WORKER_CHECK(cudaSetDevice(device));
  tp::Stream stream(device);
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<float> y(n, stream);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 5);
  x.copy_from_host(values, stream);
  // NCCL connects its peers at the first collective: once eagerly, before the capture.
  TP_WORKER_CHECK(ncclAllReduce(x.data(), y.data(), n, ncclFloat, ncclSum, comm->get(), stream));
  check_sums(y, stream, ranks, 0, rank);

  auto graph = std::make_unique<tp::Graph>();
  nccl::capture(*graph, comm, [&](tp::StreamRef s) {
    tp_test::add_kernel<<<tp_test::blocks_for(n), 256, 0, s>>>(x.data(), n, 1.0f);
    TP_WORKER_CHECK(ncclAllReduce(x.data(), y.data(), n, ncclFloat, ncclSum, comm->get(), s));
  }, {.stream = stream});
  const std::weak_ptr<nccl::Communicator> watched = comm;
  comm.reset();  // the graph holds the communicator from here on

  graph->replay(stream);
  check_sums(y, stream, ranks, 1, rank);
  for (int r = 2; r <= replays; ++r) graph->replay(stream);
  check_sums(y, stream, ranks, replays, rank);
  worker_require(!watched.expired(), "the communicator died while its graph was alive");

  graph.reset();  // the communicator goes once the graph has gone: bounded wait
  worker_require(tp_test::eventually(60s, [&] { return watched.expired(); }),
                 "the communicator was not destroyed within 60 s of its graph");
}

TP_GPUS_TEST(two_processes_one_rank_each_replay_a_captured_all_reduce_with_exact_sums, 2) {
  const auto dir = tp_test::temp_path("nccl_ranks");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{spawn_rank(0, 2, dir, "60000"), spawn_rank(1, 2, dir, "60000")};
  tp_test::require_children_succeed(children);
  std::filesystem::remove_all(dir);
}

// Without its peer, a rank gives up waiting for the unique id and says why (no GPU needed: the
// id is read before anything touches CUDA).
BOOST_AUTO_TEST_CASE(a_rank_whose_peer_never_writes_the_unique_id_gives_up_in_time) {
  const auto dir = tp_test::temp_path("nccl_lonely_rank");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{spawn_rank(1, 2, dir, "200")};
  BOOST_TEST(!tp_test::wait_all(children, 60s));
  BOOST_TEST(!children[0].timed_out);
  BOOST_TEST(children[0].status == 1, children[0].output());
  BOOST_TEST(children[0].output().find("no unique id appeared") != std::string::npos, children[0].output());
  std::filesystem::remove_all(dir);
}
