// test/nccl_conditional_test.cu: NCCL collectives inside a conditional body (a while_ loop that
// all-reduces a residual until it is small), on two GPUs from one thread.
//
// NCCL reads NCCL_GRAPH_MIXING_SUPPORT once per process, at its first collective: each GPU case
// runs its work in a child process of this binary started with the setting it needs (0: the loop
// works; 1, NCCL's default: tensorplay::nccl::capture refuses with a usage_error that says what to
// set). A host case checks the child-process machinery itself.
#include <tensorplay/nccl.hpp>

#include "nccl_support.hpp"
#include "support.hpp"

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace nccl = tensorplay::nccl;
using namespace std::chrono_literals;
using tp_test::worker_require;

namespace {

// Device d starts with the residual 2d + 1; every iteration halves it on every device, and the
// loop runs while the all-reduced residual is above `tolerance`. Powers of two: exact.
constexpr float tolerance = 1.0f / 64.0f;

__global__ void start_loop(float* residual, float initial, int* iterations, bool* again) {
  *residual = initial;
  *iterations = 0;
  *again = true;
}

__global__ void halve(float* residual, int* iterations) {
  *residual *= 0.5f;
  *iterations += 1;
}

__global__ void decide(const float* total, bool* again, float limit) { *again = *total > limit; }

struct Loop {
  std::vector<int> devices{0, 1};
  std::vector<tp::Stream> streams;
  std::vector<tp::StreamRef> refs;
  std::vector<tp::DeviceTensor<float>> residual;
  std::vector<tp::DeviceTensor<float>> total;
  std::vector<tp::DeviceTensor<int>> iterations;
  std::vector<tp::DeviceTensor<bool>> again;
  std::vector<std::shared_ptr<nccl::Communicator>> comms;

  Loop() {
    tp_test::nccl_defaults();
    comms = nccl::init_clique(devices);
    for (int d : devices) {
      streams.emplace_back(d);
      refs.push_back(streams.back());
      residual.emplace_back(1, streams.back());
      total.emplace_back(1, streams.back());
      iterations.emplace_back(1, streams.back());
      again.emplace_back(1, streams.back());
    }
    start(refs);
    all_reduce(refs);  // NCCL connects at its first collective: eagerly, before any capture
    synchronize();
  }

  static float initial(std::size_t d) { return 2.0f * static_cast<float>(d) + 1.0f; }

  void start(std::span<const tp::StreamRef> s) {
    for (std::size_t d = 0; d < devices.size(); ++d) {
      tp_test::OnDevice on(devices[d]);
      start_loop<<<1, 1, 0, s[d]>>>(residual[d].data(), initial(d), iterations[d].data(), again[d].data());
    }
  }

  void all_reduce(std::span<const tp::StreamRef> s) {
    nccl::group([&] {
      for (std::size_t d = 0; d < devices.size(); ++d)
        TP_WORKER_CHECK(ncclAllReduce(residual[d].data(), total[d].data(), 1, ncclFloat, ncclSum, comms[d]->get(), s[d]));
    });
  }

  void synchronize() {
    for (tp::StreamRef s : refs) TP_WORKER_CHECK(cudaStreamSynchronize(s));
  }

  //! The collectives of the loop's body, as the step issues them: `body` are the bodies' streams.
  using Collectives = std::function<void(std::span<const tp::StreamRef> body)>;

  //! The grouped NCCL calls themselves, issued into the bodies (what users write).
  Collectives direct() {
    return [this](std::span<const tp::StreamRef> body) { all_reduce(body); };
  }

  //! The same calls captured once into `inner`, whose graphs are then replayed into the bodies:
  //! each body gets a child-graph node holding NCCL's work.
  Collectives through(tp::DeviceGroupGraph& inner) {
    nccl::capture(inner, comms, [this](std::span<const tp::StreamRef> s) { all_reduce(s); });
    return [&inner](std::span<const tp::StreamRef> body) { inner.replay(body); };
  }

  //! The captured step: start, then while (sum of residuals > tolerance) { halve; all-reduce }.
  //! Both devices' bodies are open at once, so that one grouped NCCL call feeds both.
  void step(tp::DeviceGroupGraph& group, std::span<const tp::StreamRef> s, const Collectives& collectives) {
    start(s);
    for (std::size_t d = 0; d < devices.size(); ++d) {
      tp_test::OnDevice on(devices[d]);
      group.graph(devices[d]).begin_capture_to_while_node(again[d]);
    }
    std::vector<tp::StreamRef> body;
    for (int device : devices) body.push_back(group.graph(device).capture_stream());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      tp_test::OnDevice on(devices[d]);
      halve<<<1, 1, 0, body[d]>>>(residual[d].data(), iterations[d].data());
    }
    collectives(body);
    for (std::size_t d = 0; d < devices.size(); ++d) {
      tp_test::OnDevice on(devices[d]);
      decide<<<1, 1, 0, body[d]>>>(total[d].data(), again[d].data(), tolerance);
      group.graph(devices[d]).set_conditional_handle_for_current_node(again[d]);
      group.graph(devices[d]).end_capture_to_conditional_node();
    }
  }

  //! Captures the loop with `collectives` into `group`. Returns what was thrown ("usage_error:
  //! ..." or "cuda_error: ..."), or "" when the capture succeeded. After a throw, checks that
  //! nothing is left capturing and the group holds nothing.
  std::string capture(tp::DeviceGroupGraph& group, const Collectives& collectives) {
    std::string what;
    try {
      nccl::capture(group, comms, [&](std::span<const tp::StreamRef> s) { step(group, s, collectives); });
      return what;
    } catch (const tp::usage_error& e) {
      what = std::string("usage_error: ") + e.what();
    } catch (const tp::cuda_error& e) {
      what = std::string("cuda_error: ") + e.what();
    }
    std::printf("capture refused: %s\n", what.c_str());
    worker_require(!group.is_capturing(), "a capture of the group is still open");
    for (int device : group.devices()) {
      worker_require(tp_test::not_capturing(group.stream(device)), "a group stream is still capturing");
      worker_require(group.graph(device).native_graph() == nullptr, "a graph of the group still holds a capture");
    }
    return what;
  }

  //! Replays the captured loop 3 times and checks every replay's result on every device.
  void check_replays(tp::DeviceGroupGraph& group) {
    float sum = 0.0f;
    for (std::size_t d = 0; d < devices.size(); ++d) sum += initial(d);
    int expected = 0;
    for (float left = sum; left > tolerance; left *= 0.5f) ++expected;
    for (int replay = 1; replay <= 3; ++replay) {
      group.replay(refs);
      synchronize();
      for (std::size_t d = 0; d < devices.size(); ++d) {
        const int count = read(iterations[d], d);
        const float left = read(total[d], d);
        worker_require(count == expected, "replay " + std::to_string(replay) + ", device " + std::to_string(d) + ": " +
                                              std::to_string(count) + " iterations, expected " + std::to_string(expected));
        worker_require(left == sum / static_cast<float>(1 << expected),
                       "device " + std::to_string(d) + ": final residual " + std::to_string(left));
      }
    }
  }

  //! Captures the loop with `collectives` (which must succeed) and checks its replays.
  void run(const Collectives& collectives) {
    tp::DeviceGroupGraph group(devices);
    const std::string what = capture(group, collectives);
    worker_require(what.empty(), "the capture failed: " + what);
    check_replays(group);
  }

  //! With graph mixing support on: the capture is refused with the usage_error that says what to
  //! set or, should CUDA accept it after all, the loop computes the right result. Never wrong.
  void refused_or_right(const Collectives& collectives) {
    tp::DeviceGroupGraph group(devices);
    const std::string what = capture(group, collectives);
    if (what.empty()) {
      std::printf("NOTE: accepted with graph mixing support on; checking the result\n");
      check_replays(group);
      return;
    }
    worker_require(what.starts_with("usage_error") && what.find("NCCL_GRAPH_MIXING_SUPPORT=0") != std::string::npos,
                   "the refusal does not say what to set: " + what);
  }

  template <class T>
  T read(const tp::DeviceTensor<T>& t, std::size_t d) {
    tp::StreamGuard guard(refs[d]);
    return t.to_host(refs[d])[0];
  }
};

}  // namespace

TP_WORKER(while_all_reduce) {
  worker_require(!nccl::graph_mixing_support(), "the child must run with NCCL_GRAPH_MIXING_SUPPORT=0");
  Loop loop;
  loop.run(loop.direct());
}

TP_WORKER(while_all_reduce_through_an_inner_group) {
  worker_require(!nccl::graph_mixing_support(), "the child must run with NCCL_GRAPH_MIXING_SUPPORT=0");
  Loop loop;
  tp::DeviceGroupGraph inner(loop.devices);
  // CUDA 13.0 on the H200 refuses the replayed group as a child graph inside the body (seen):
  // that must be a usage_error that says so; if a later CUDA accepts it, the loop must be right.
  tp::DeviceGroupGraph group(loop.devices);
  const std::string what = loop.capture(group, loop.through(inner));
  if (what.empty()) {
    loop.check_replays(group);
    return;
  }
  worker_require(what.starts_with("usage_error") && what.find("child graph") != std::string::npos,
                 "expected a usage_error about the child graph, got: " + what);
}

TP_WORKER(refusal_with_graph_mixing_on) {
  worker_require(nccl::graph_mixing_support(), "the child must run with NCCL's graph mixing support on");
  Loop loop;
  // Issued directly into the bodies, NCCL's event nodes land in the bodies: tensorplay refuses
  // them when a body closes, and nccl::capture says what to set.
  {
    tp::DeviceGroupGraph group(loop.devices);
    const std::string what = loop.capture(group, loop.direct());
    worker_require(what.starts_with("usage_error") && what.find("NCCL_GRAPH_MIXING_SUPPORT=0") != std::string::npos,
                   "expected the usage_error that says what to set, got: " + (what.empty() ? "no error" : what));
  }
  // Through an inner group, the event nodes sit in a child graph of the body: CUDA should refuse
  // the executable (as it did in gpu.md's probe); if it does not, the loop must still be right.
  {
    tp::DeviceGroupGraph inner(loop.devices);
    loop.refused_or_right(loop.through(inner));
  }

  // NCCL and the group still work: collectives at the top level of a graph.
  tp::DeviceGroupGraph group(loop.devices);
  nccl::capture(group, loop.comms, [&](std::span<const tp::StreamRef> s) {
    loop.start(s);
    loop.all_reduce(s);
  });
  group.replay(loop.refs);
  loop.synchronize();
  for (std::size_t d = 0; d < loop.devices.size(); ++d)
    worker_require(loop.read(loop.total[d], d) == 4.0f, "top-level all-reduce after the refusal: wrong sum");
}

// The machinery: a child sees the environment it is given, not the parent's test reports, and its
// status comes back.
TP_WORKER(reads_its_environment) {
  const char* value = std::getenv("TENSORPLAY_TEST_VALUE");
  worker_require(value != nullptr && std::string(value) == "given", "TENSORPLAY_TEST_VALUE was not passed");
  worker_require(std::getenv("XML_OUTPUT_FILE") == nullptr, "the child would write the parent's test report");
}

TP_WORKER(fails_on_purpose) { worker_require(false, "failing as asked"); }

BOOST_AUTO_TEST_CASE(child_processes_get_their_environment_and_report_their_status) {
  const auto dir = tp_test::temp_path("workers");
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{
      tp_test::spawn_worker("reads_its_environment", {{"TENSORPLAY_TEST_VALUE", "given"}}, dir / "reads.log"),
      tp_test::spawn_worker("fails_on_purpose", {}, dir / "fails.log")};
  BOOST_TEST(!tp_test::wait_all(children, 60s));
  BOOST_TEST(children[0].status == 0, children[0].output());
  BOOST_TEST(children[1].status == 1, children[1].output());
  BOOST_TEST(children[1].output().find("failing as asked") != std::string::npos, children[1].output());
  BOOST_TEST(!children[0].timed_out);
  std::filesystem::remove_all(dir);
}

namespace {

// Runs `worker` in a child process whose NCCL sees NCCL_GRAPH_MIXING_SUPPORT=`mixing`.
void run_with_graph_mixing(const char* worker, const char* mixing) {
  const auto dir = tp_test::temp_path(worker);
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{
      tp_test::spawn_worker(worker, {{"NCCL_GRAPH_MIXING_SUPPORT", mixing}}, dir / "child.log")};
  tp_test::require_children_succeed(children);
  std::filesystem::remove_all(dir);
}

}  // namespace

TP_GPUS_TEST(collectives_in_a_while_body_loop_until_the_residual_is_small_with_graph_mixing_off, 2) {
  run_with_graph_mixing("while_all_reduce", "0");
}

TP_GPUS_TEST(collectives_replayed_from_an_inner_group_in_a_while_body_are_refused_clearly_or_loop_right, 2) {
  run_with_graph_mixing("while_all_reduce_through_an_inner_group", "0");
}

TP_GPUS_TEST(collectives_in_a_while_body_with_graph_mixing_on_throw_usage_error_saying_what_to_set, 2) {
  run_with_graph_mixing("refusal_with_graph_mixing_on", "1");
}
