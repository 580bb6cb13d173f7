// test/nccl_test.cu: tensorplay/nccl.hpp. On the host: errors, the unique id and its file,
// NCCL's graph mixing setting, argument checks. On two GPUs (one process, one thread): captured
// all-reduce, a data-parallel SGD step against its eager run, reduce-scatter + all-gather, and
// the lifetimes of graphs and communicators, every wait bounded.
// Collectives inside conditional bodies: nccl_conditional_test; one rank per process:
// nccl_multiprocess_test.
#include <tensorplay/nccl.hpp>

#include "nccl_support.hpp"
#include "support.hpp"

#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace tp = tensorplay;
namespace nccl = tensorplay::nccl;
using namespace std::chrono_literals;
using Comms = std::vector<std::shared_ptr<nccl::Communicator>>;

namespace {

constexpr std::size_t n = 4096;

std::vector<std::weak_ptr<nccl::Communicator>> watch(const Comms& comms) {
  return {comms.begin(), comms.end()};
}

bool all_expired(const std::vector<std::weak_ptr<nccl::Communicator>>& watched) {
  for (const auto& w : watched)
    if (!w.expired()) return false;
  return true;
}

bool none_expired(const std::vector<std::weak_ptr<nccl::Communicator>>& watched) {
  for (const auto& w : watched)
    if (w.expired()) return false;
  return true;
}

//! Host copy of `t`, on its device.
template <class T>
std::vector<T> to_host(const tp::DeviceTensor<T>& t, tp::StreamRef stream) {
  tp::StreamGuard guard(stream);
  return t.to_host(stream);
}

template <class T>
void from_host(tp::DeviceTensor<T>& t, const std::vector<T>& values, tp::StreamRef stream) {
  tp::StreamGuard guard(stream);
  t.copy_from_host(values, stream);
  stream.synchronize();
}

//! Two GPUs, one communicator and one stream each, and per-device x and y of n floats, with
//! x[i] = d + 1 + i % 5 on device d. Its all-reduce step adds 1 to x, then y = sum over devices
//! of x, so that after r replays y[i] = 3 + 2 (i % 5) + 2 r.
struct TwoGpus {
  std::vector<int> devices{0, 1};
  std::vector<tp::Stream> streams;
  std::vector<tp::StreamRef> refs;
  std::vector<tp::DeviceTensor<float>> x;
  std::vector<tp::DeviceTensor<float>> y;
  Comms comms;

  TwoGpus() {
    tp_test::nccl_defaults();
    comms = nccl::init_clique(devices);
    for (int d : devices) {
      streams.emplace_back(d);
      refs.push_back(streams.back());
      x.emplace_back(n, streams.back());
      y.emplace_back(n, streams.back());
      std::vector<float> values(n);
      for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(d + 1) + static_cast<float>(i % 5);
      from_host(x.back(), values, refs.back());
    }
    // NCCL connects its peers at the first collective: once eagerly, before any capture.
    all_reduce(refs);
    synchronize();
  }
  TwoGpus(const TwoGpus&) = delete;
  TwoGpus& operator=(const TwoGpus&) = delete;
  // The cases' graphs are gone by now: once CUDA has released what they held, the communicators
  // are destroyed here, on the test's thread, rather than by the reaper during the next case.
  ~TwoGpus() { BOOST_TEST(nccl::wait_until_released(comms, 60s)); }

  void all_reduce(std::span<const tp::StreamRef> s) {
    nccl::group([&] {
      for (std::size_t i = 0; i < devices.size(); ++i)
        TP_NCCL_REQUIRE(ncclAllReduce(x[i].data(), y[i].data(), n, ncclFloat, ncclSum, comms[i]->get(), s[i]));
    });
  }

  //! The per-device body: the collective last, grouped across the bodies.
  auto per_device_body(tp::DeviceGroupGraph& group) {
    return [this, &group](int device, tp::StreamRef s) {
      const std::size_t i = group.index_of(device);
      tp_test::add(x[i].data(), n, 1.0f, s);
      if (i == 0) TP_NCCL_REQUIRE(ncclGroupStart());
      TP_NCCL_REQUIRE(ncclAllReduce(x[i].data(), y[i].data(), n, ncclFloat, ncclSum, comms[i]->get(), s));
      if (i + 1 == group.size()) TP_NCCL_REQUIRE(ncclGroupEnd());
    };
  }

  void synchronize() {
    for (tp::StreamRef s : refs) BOOST_REQUIRE(tp_test::finishes_within(60s, [s] { s.synchronize(); }));
  }

  //! y after `replays` replays of the all-reduce step, on every device.
  void check_sums(int replays) {
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const std::vector<float> host = to_host(y[d], refs[d]);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i)
        wrong += host[i] != 3.0f + 2.0f * static_cast<float>(i % 5) + 2.0f * static_cast<float>(replays);
      BOOST_TEST(wrong == 0u, "device " << d << ": " << wrong << " wrong sums after " << replays << " replays; y[0] = "
                                        << host[0]);
    }
  }
};

}  // namespace

// ---- host ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(nccl_error_names_the_call_the_result_and_the_callers_line) {
  const std::source_location where = std::source_location::current();
  const tp::nccl_error error(ncclInvalidUsage, "ncclAllReduce", where);
  const std::string text = error.what();
  BOOST_TEST(error.status() == ncclInvalidUsage);
  BOOST_TEST(error.where().line() == where.line());
  BOOST_TEST(text.starts_with("ncclAllReduce failed: ncclInvalidUsage ("), text);
  BOOST_TEST(text.find(ncclGetErrorString(ncclInvalidUsage)) != std::string::npos, text);
  BOOST_TEST(text.ends_with("nccl_test.cu:" + std::to_string(where.line())), text);
}

BOOST_AUTO_TEST_CASE(unique_id_bytes_round_trip_and_a_wrong_size_throws_usage_error) {
  std::array<std::byte, nccl::UniqueId::byte_count> bytes{};
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
  const nccl::UniqueId id = nccl::UniqueId::from_bytes(bytes);
  BOOST_TEST(std::memcmp(id.bytes().data(), bytes.data(), bytes.size()) == 0);
  BOOST_TEST(std::memcmp(id.get().internal, bytes.data(), bytes.size()) == 0);
  BOOST_TEST(!(id == nccl::UniqueId{}));
  BOOST_CHECK_THROW((void)nccl::UniqueId::from_bytes(std::span(bytes).first(100)), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(a_unique_id_written_to_a_file_is_read_back_whole_and_leaves_no_temporary) {
  const auto dir = tp_test::temp_path("unique_id_roundtrip");
  std::filesystem::create_directories(dir);
  std::array<std::byte, nccl::UniqueId::byte_count> bytes{};
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(255 - i);
  const nccl::UniqueId id = nccl::UniqueId::from_bytes(bytes);
  nccl::write_unique_id(id, dir / "id");
  BOOST_TEST((nccl::read_unique_id(dir / "id", 1s) == id));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  BOOST_TEST(files == 1u);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_unique_id_written_later_by_another_thread_is_waited_for) {
  const auto path = tp_test::temp_path("unique_id_later");
  std::filesystem::remove(path);
  std::array<std::byte, nccl::UniqueId::byte_count> bytes{};
  bytes[5] = std::byte{42};
  const nccl::UniqueId id = nccl::UniqueId::from_bytes(bytes);
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    nccl::write_unique_id(id, path);
  });
  const nccl::UniqueId read = nccl::read_unique_id(path, 20s);
  writer.join();
  BOOST_TEST((read == id));
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(reading_a_unique_id_that_never_appears_times_out) {
  const auto path = tp_test::temp_path("unique_id_never");
  std::filesystem::remove(path);
  const auto start = std::chrono::steady_clock::now();
  BOOST_CHECK_EXCEPTION((void)nccl::read_unique_id(path, 50ms), std::system_error, [](const std::system_error& e) {
    return e.code() == std::errc::timed_out;
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < 5s));
}

// A file of the wrong length (a writer that did not use write_unique_id, cut short) is never
// taken for an id.
BOOST_AUTO_TEST_CASE(a_file_of_the_wrong_length_is_not_read_as_a_unique_id) {
  const auto path = tp_test::temp_path("unique_id_short");
  std::ofstream(path, std::ios::binary) << "only a few bytes";
  BOOST_CHECK_THROW((void)nccl::read_unique_id(path, 50ms), std::system_error);
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(graph_mixing_support_reads_the_variable_as_nccl_does) {
  {
    tp_test::EnvGuard unset("NCCL_GRAPH_MIXING_SUPPORT", nullptr);
    BOOST_TEST(nccl::graph_mixing_support());  // NCCL's default
  }
  for (const char* off : {"0", "0x0", "00"}) {
    tp_test::EnvGuard set("NCCL_GRAPH_MIXING_SUPPORT", off);
    BOOST_TEST(!nccl::graph_mixing_support(), off);
    BOOST_CHECK_NO_THROW(nccl::require_graph_mixing_off());
  }
  for (const char* on : {"1", "2"}) {
    tp_test::EnvGuard set("NCCL_GRAPH_MIXING_SUPPORT", on);
    BOOST_TEST(nccl::graph_mixing_support(), on);
  }
}

BOOST_AUTO_TEST_CASE(require_graph_mixing_off_says_what_to_set_when_support_is_on) {
  tp_test::EnvGuard set("NCCL_GRAPH_MIXING_SUPPORT", "1");
  BOOST_CHECK_EXCEPTION(nccl::require_graph_mixing_off(), tp::usage_error, [](const tp::usage_error& e) {
    return std::string(e.what()).find("NCCL_GRAPH_MIXING_SUPPORT=0") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(retain_refuses_a_communicator_list_of_the_wrong_size_or_a_null_one) {
  tp::DeviceGroupGraph group({0, 1});
  const Comms one(1);
  BOOST_CHECK_THROW(nccl::retain(group, one), tp::usage_error);
  const Comms nulls(2);
  BOOST_CHECK_EXCEPTION(nccl::retain(group, nulls), tp::usage_error, [](const tp::usage_error& e) {
    return std::string(e.what()).find("communicator 0 is null") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(misuse_of_the_init_and_capture_helpers_throws_usage_error_before_nccl_is_called) {
  BOOST_CHECK_THROW((void)nccl::init_clique(std::vector<int>{}), tp::usage_error);
  BOOST_CHECK_THROW((void)nccl::init_rank(nccl::UniqueId{}, 2, 2, 0), tp::usage_error);
  BOOST_CHECK_THROW((void)nccl::init_rank(nccl::UniqueId{}, 2, -1, 0), tp::usage_error);
  tp::Graph graph;
  bool ran = false;
  BOOST_CHECK_THROW(nccl::capture(graph, nullptr, [&] { ran = true; }), tp::usage_error);
  BOOST_TEST(!ran);
}

// ---- GPU ------------------------------------------------------------------------------------------

TP_GPUS_TEST(all_reduce_captured_per_device_replays_1000_times_with_exact_sums, 2) {
  TwoGpus gpus;
  tp::DeviceGroupGraph group(gpus.devices);
  nccl::capture(group, gpus.comms, gpus.per_device_body(group));
  gpus.check_sums(0);  // capturing ran nothing
  for (int r = 1; r <= 1000; ++r) {
    group.replay(gpus.refs);
    if (r == 1) {
      gpus.synchronize();
      gpus.check_sums(1);
    }
  }
  gpus.synchronize();
  gpus.check_sums(1000);
}

namespace {

// Data-parallel least squares: device d holds `rows` samples (x, label) of the data set; every
// device keeps a replica of the weights w. One step: each device's gradient of its shard, the
// all-reduce of the gradients, the same update on every replica.
constexpr int features = 64;
constexpr int rows = 256;

// g[j] = sum over the shard of (x . w - label) x[j], scaled by 1 / (all samples). One thread per
// feature, samples in order: the same arithmetic at every run.
__global__ void shard_gradient(const float* x, const float* labels, const float* w, float* g, float scale) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= features) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) {
    float prediction = 0.0f;
    for (int k = 0; k < features; ++k) prediction += x[r * features + k] * w[k];
    sum += (prediction - labels[r]) * x[r * features + j];
  }
  g[j] = sum * scale;
}

__global__ void sgd_update(float* w, const float* g, float rate) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < features) w[j] -= rate * g[j];
}

// Deterministic values in [-1, 1).
float hashed(std::uint32_t i) {
  i ^= i >> 16;
  i *= 0x7feb352dU;
  i ^= i >> 15;
  i *= 0x846ca68bU;
  i ^= i >> 16;
  return static_cast<float>(i % 2048) / 1024.0f - 1.0f;
}

struct Replica {
  tp::DeviceTensor<float> w;
  tp::DeviceTensor<float> g;
};

}  // namespace

TP_GPUS_TEST(data_parallel_sgd_step_graph_matches_eager_bit_for_bit_after_100_steps, 2) {
  TwoGpus gpus;
  const std::size_t count = gpus.devices.size();
  std::vector<tp::DeviceTensor<float>> x;
  std::vector<tp::DeviceTensor<float>> labels;
  std::vector<Replica> eager;
  std::vector<Replica> graphed;
  for (std::size_t d = 0; d < count; ++d) {
    const tp::StreamRef s = gpus.refs[d];
    std::vector<float> xs(rows * features);
    std::vector<float> ls(rows);
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = hashed(static_cast<std::uint32_t>(d * xs.size() + i));
    for (std::size_t r = 0; r < ls.size(); ++r) ls[r] = hashed(static_cast<std::uint32_t>(1'000'000 + d * rows + r));
    x.emplace_back(xs.size(), s);
    labels.emplace_back(ls.size(), s);
    from_host(x.back(), xs, s);
    from_host(labels.back(), ls, s);
    for (auto* replicas : {&eager, &graphed}) {
      replicas->push_back({tp::DeviceTensor<float>(features, s), tp::DeviceTensor<float>(features, s)});
      from_host(replicas->back().w, std::vector<float>(features, 0.0f), s);
    }
  }
  const float scale = 1.0f / static_cast<float>(rows * count);
  auto step = [&](std::span<const tp::StreamRef> s, std::vector<Replica>& replicas) {
    for (std::size_t d = 0; d < count; ++d) {
      tp::StreamGuard guard(s[d]);
      shard_gradient<<<1, features, 0, s[d]>>>(x[d].data(), labels[d].data(), replicas[d].w.data(), replicas[d].g.data(), scale);
    }
    nccl::group([&] {
      for (std::size_t d = 0; d < count; ++d)
        TP_NCCL_REQUIRE(ncclAllReduce(replicas[d].g.data(), replicas[d].g.data(), features, ncclFloat, ncclSum,
                                      gpus.comms[d]->get(), s[d]));
    });
    for (std::size_t d = 0; d < count; ++d) {
      tp::StreamGuard guard(s[d]);
      sgd_update<<<1, features, 0, s[d]>>>(replicas[d].w.data(), replicas[d].g.data(), 0.05f);
    }
  };

  for (int k = 0; k < 100; ++k) step(gpus.refs, eager);
  gpus.synchronize();  // eager and graph work on one communicator never overlap

  tp::DeviceGroupGraph group(gpus.devices);
  nccl::capture(group, gpus.comms, [&](std::span<const tp::StreamRef> s) { step(s, graphed); });
  for (int k = 0; k < 100; ++k) group.replay(gpus.refs);
  gpus.synchronize();

  const std::vector<float> reference = to_host(eager[0].w, gpus.refs[0]);
  const std::vector<float> start(features, 0.0f);
  BOOST_TEST(reference != start);  // the weights moved
  for (std::size_t d = 0; d < count; ++d) {
    const std::vector<float> e = to_host(eager[d].w, gpus.refs[d]);
    const std::vector<float> g = to_host(graphed[d].w, gpus.refs[d]);
    BOOST_TEST(std::memcmp(e.data(), reference.data(), features * sizeof(float)) == 0, "replica " << d << " (eager) drifted");
    BOOST_TEST(std::memcmp(g.data(), e.data(), features * sizeof(float)) == 0, "device " << d << ": graph differs from eager");
  }
}

// Each device reduces one chunk, then every device gathers all chunks: the full sum everywhere.
TP_GPUS_TEST(reduce_scatter_then_all_gather_replays_to_the_full_sum, 2) {
  TwoGpus gpus;
  const std::size_t count = gpus.devices.size();
  const std::size_t chunk = n / count;
  std::vector<tp::DeviceTensor<float>> part;
  std::vector<tp::DeviceTensor<float>> full;
  for (std::size_t d = 0; d < count; ++d) {
    part.emplace_back(chunk, gpus.refs[d]);
    full.emplace_back(n, gpus.refs[d]);
  }
  auto step = [&](std::span<const tp::StreamRef> s) {
    for (std::size_t d = 0; d < count; ++d) {
      tp::StreamGuard guard(s[d]);
      tp_test::add(gpus.x[d].data(), n, 1.0f, s[d]);
    }
    nccl::group([&] {
      for (std::size_t d = 0; d < count; ++d)
        TP_NCCL_REQUIRE(ncclReduceScatter(gpus.x[d].data(), part[d].data(), chunk, ncclFloat, ncclSum, gpus.comms[d]->get(), s[d]));
    });
    nccl::group([&] {
      for (std::size_t d = 0; d < count; ++d)
        TP_NCCL_REQUIRE(ncclAllGather(part[d].data(), full[d].data(), chunk, ncclFloat, gpus.comms[d]->get(), s[d]));
    });
  };
  step(gpus.refs);  // eager warm-up of both collectives (x gets + 1)
  gpus.synchronize();
  tp::DeviceGroupGraph group(gpus.devices);
  nccl::capture(group, gpus.comms, step);
  constexpr int replays = 10;
  for (int r = 0; r < replays; ++r) group.replay(gpus.refs);
  gpus.synchronize();
  for (std::size_t d = 0; d < count; ++d) {
    const std::vector<float> host = to_host(full[d], gpus.refs[d]);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += host[i] != 3.0f + 2.0f * static_cast<float>(i % 5) + 2.0f * (replays + 1);
    BOOST_TEST(wrong == 0u, "device " << d << ": " << wrong << " wrong; full[0] = " << host[0]);
  }
}

// ---- lifetimes: graphs first, then communicators, whatever order the user drops them in --------

TP_GPUS_TEST(destroying_the_group_then_the_communicators_does_not_hang, 2) {
  TwoGpus gpus;
  auto group = std::make_unique<tp::DeviceGroupGraph>(gpus.devices);
  nccl::capture(*group, gpus.comms, gpus.per_device_body(*group));
  group->replay(gpus.refs);
  gpus.synchronize();
  gpus.check_sums(1);
  const auto watched = watch(gpus.comms);
  BOOST_REQUIRE(tp_test::finishes_within(30s, [g = std::move(group)]() mutable { g.reset(); }));
  // The last handle may be the test's own (ncclCommDestroy on this thread) or the graphs'.
  BOOST_REQUIRE(tp_test::finishes_within(60s, [c = std::move(gpus.comms)]() mutable { c.clear(); }));
  BOOST_TEST(tp_test::eventually(60s, [&] { return all_expired(watched); }));
}

TP_GPUS_TEST(communicators_dropped_first_live_on_in_the_graphs_until_the_group_dies, 2) {
  TwoGpus gpus;
  tp::DeviceGroupGraph group(gpus.devices);
  nccl::capture(group, gpus.comms, gpus.per_device_body(group));
  const auto watched = watch(gpus.comms);
  gpus.comms.clear();  // only the graphs hold the communicators now
  BOOST_TEST(none_expired(watched));
  for (int r = 0; r < 10; ++r) group.replay(gpus.refs);
  gpus.synchronize();
  gpus.check_sums(10);
  BOOST_TEST(none_expired(watched));
  BOOST_REQUIRE(tp_test::finishes_within(30s, [g = std::move(group)]() mutable { g.reset(); }));
  BOOST_TEST(tp_test::eventually(60s, [&] { return all_expired(watched); }));  // destroyed on the reaper thread
}

TP_GPUS_TEST(destroying_everything_while_replays_are_in_flight_does_not_hang, 2) {
  TwoGpus gpus;
  auto group = std::make_unique<tp::DeviceGroupGraph>(gpus.devices);
  nccl::capture(*group, gpus.comms, gpus.per_device_body(*group));
  constexpr long long spin_ns = 500'000'000;  // keeps the replays queued while everything is dropped
  for (std::size_t d = 0; d < gpus.devices.size(); ++d) {
    tp::StreamGuard guard(gpus.refs[d]);
    tp_test::spin_kernel<<<1, 1, 0, gpus.refs[d]>>>(spin_ns);
  }
  for (int r = 0; r < 20; ++r) group->replay(gpus.refs);
  const auto watched = watch(gpus.comms);
  const auto start = std::chrono::steady_clock::now();
  BOOST_REQUIRE(tp_test::finishes_within(30s, [g = std::move(group), c = std::move(gpus.comms)]() mutable {
    g.reset();
    c.clear();
  }));
  if (std::chrono::steady_clock::now() - start < 300ms) {
    BOOST_TEST(none_expired(watched), "a communicator died while launches that use it were still queued");
  } else {
    BOOST_TEST_MESSAGE("dropping took too long to check that the communicators outlived the queued launches");
  }
  gpus.synchronize();
  gpus.check_sums(20);  // every queued replay ran
  BOOST_TEST(tp_test::eventually(60s, [&] { return all_expired(watched); }));
}

TP_GPUS_TEST(retain_refuses_a_communicator_of_another_device, 2) {
  TwoGpus gpus;
  tp::DeviceGroupGraph group(gpus.devices);
  const Comms swapped{gpus.comms[1], gpus.comms[0]};
  BOOST_CHECK_EXCEPTION(nccl::retain(group, swapped), tp::usage_error, [](const tp::usage_error& e) {
    return std::string(e.what()).find("runs on device 1") != std::string::npos;
  });
  BOOST_TEST(gpus.comms[0]->device() == 0);
  BOOST_TEST(gpus.comms[1]->rank() == 1);
  BOOST_TEST(gpus.comms[1]->size() == 2);
}

// If the group's body throws, nccl::group still ends NCCL's group: the next grouped call is
// issued at its own ncclGroupEnd (if the group were left open, nothing would run).
TP_GPUS_TEST(a_group_body_that_throws_leaves_no_nccl_group_open, 2) {
  TwoGpus gpus;
  BOOST_CHECK_THROW(nccl::group([] { throw std::runtime_error("body failed"); }), std::runtime_error);
  for (std::size_t d = 0; d < gpus.devices.size(); ++d) {
    tp::StreamGuard guard(gpus.refs[d]);
    tp_test::add(gpus.x[d].data(), n, 1.0f, gpus.refs[d]);
  }
  gpus.all_reduce(gpus.refs);
  gpus.synchronize();
  gpus.check_sums(1);
}

// One graph holds its communicator (the form a process with one rank uses), here a clique of one.
TP_GPU_TEST(a_single_graph_holds_its_communicator_until_it_dies) {
  tp_test::nccl_defaults();
  tp_test::OnDevice on(0);
  Comms comms = nccl::init_clique(std::vector<int>{0});
  tp::Stream stream(0);
  tp::DeviceTensor<float> a(n, stream);
  tp::DeviceTensor<float> b(n, stream);
  tp_test::fill(a.data(), n, 2.0f, stream);
  tp_test::fill(b.data(), n, 0.0f, stream);
  TP_NCCL_REQUIRE(ncclAllReduce(a.data(), b.data(), n, ncclFloat, ncclSum, comms[0]->get(), stream));  // warm-up
  stream.synchronize();
  auto graph = std::make_unique<tp::Graph>();
  nccl::capture(*graph, comms[0], [&](tp::StreamRef s) {
    tp_test::add(a.data(), n, 1.0f, s);
    TP_NCCL_REQUIRE(ncclAllReduce(a.data(), b.data(), n, ncclFloat, ncclSum, comms[0]->get(), s));
  }, {.stream = stream});
  std::weak_ptr<nccl::Communicator> watched = comms[0];
  comms.clear();
  for (int r = 0; r < 3; ++r) graph->replay(stream);
  BOOST_TEST(b.to_host(stream)[n / 2] == 5.0f);
  BOOST_TEST(!watched.expired());
  BOOST_REQUIRE(tp_test::finishes_within(30s, [g = std::move(graph)]() mutable { g.reset(); }));
  BOOST_TEST(tp_test::eventually(60s, [&] { return watched.expired(); }));
  // Expired means ~Communicator has begun on tensorplay's reaper thread; ncclCommDestroy must
  // also return (before exit: memcheck saw NCCL's memory still held when this case came last).
  BOOST_TEST(tp_test::finishes_within(30s, [] { tp::detail::Reaper::instance().drain(); }));
}
