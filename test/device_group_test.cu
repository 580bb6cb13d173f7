// test/device_group_test.cu: tensorplay/graph/device_group.hpp (DeviceGroupGraph), without NCCL:
// argument checks on the host; on two GPUs, per-device kernels, the order and the state in which
// bodies run, a throwing body, replay spans, and a group of one device.
#include "support.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 1000;

bool any_capturing(const tp::DeviceGroupGraph& group) {
  for (int device : group.devices())
    if (group.graph(device).is_capturing()) return true;
  return false;
}

// One tensor per device of `group`, filled with `value(device)`; the fills have completed on
// return (so that replays on any stream, the legacy default one included, see them).
template <class Value>
std::vector<tp::DeviceTensor<float>> per_device(tp::DeviceGroupGraph& group, Value value) {
  std::vector<tp::DeviceTensor<float>> out;
  for (int device : group.devices()) {
    tp::StreamGuard guard(group.stream(device));
    out.emplace_back(n, group.stream(device));
    tp_test::fill(out.back().data(), n, value(device), group.stream(device));
    group.stream(device).synchronize();
  }
  return out;
}

// Waits for all work on every device of the group (replay() uses the legacy default streams).
void synchronize_devices(const tp::DeviceGroupGraph& group) {
  for (int device : group.devices()) {
    BOOST_REQUIRE_EQUAL(cudaSetDevice(device), cudaSuccess);
    BOOST_REQUIRE_EQUAL(cudaDeviceSynchronize(), cudaSuccess);
  }
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
}

std::vector<float> to_host(const tp::DeviceTensor<float>& t, tp::StreamRef stream) {
  tp::StreamGuard guard(stream);  // the copy runs on the stream's device
  return t.to_host(stream);
}

}  // namespace

// ---- host: arguments -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_group_without_devices_throws_usage_error) {
  BOOST_CHECK_THROW(tp::DeviceGroupGraph(std::vector<int>{}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(a_device_listed_twice_throws_usage_error_naming_it) {
  BOOST_CHECK_EXCEPTION(tp::DeviceGroupGraph({0, 3, 3}), tp::usage_error, [](const tp::usage_error& e) {
    return std::string(e.what()).find("device 3 is listed twice") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(a_negative_device_throws_usage_error) {
  BOOST_CHECK_THROW(tp::DeviceGroupGraph({0, -1}), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(devices_keep_the_order_given) {
  const tp::DeviceGroupGraph group({2, 0, 1});
  BOOST_TEST(group.devices() == std::vector<int>({2, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(group.index_of(0) == 1u);
  BOOST_TEST(group.size() == 3u);
}

BOOST_AUTO_TEST_CASE(graph_of_a_device_outside_the_group_throws_usage_error) {
  tp::DeviceGroupGraph group({0, 1});
  BOOST_CHECK_THROW((void)group.graph(2), tp::usage_error);
  BOOST_CHECK_NO_THROW((void)group.graph(1));
}

BOOST_AUTO_TEST_CASE(replay_with_a_stream_count_other_than_the_device_count_throws_usage_error) {
  tp::DeviceGroupGraph group({0, 1});
  const std::vector<tp::StreamRef> one(1);
  BOOST_CHECK_EXCEPTION(group.replay(one), tp::usage_error, [](const tp::usage_error& e) {
    return std::string(e.what()).find("1 stream(s) for 2 device(s)") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(capture_with_a_stream_count_other_than_the_device_count_throws_usage_error) {
  tp::DeviceGroupGraph group({0, 1});
  const std::vector<tp::StreamRef> three(3);
  bool ran = false;
  BOOST_CHECK_THROW(group.capture([&](int, tp::StreamRef) { ran = true; }, three), tp::usage_error);
  BOOST_TEST(!ran);
}

BOOST_AUTO_TEST_CASE(replay_before_any_capture_throws_usage_error) {
  tp::DeviceGroupGraph group({0});
  const std::vector<tp::StreamRef> one(1);
  BOOST_CHECK_THROW(group.replay(one), tp::usage_error);
}

// ---- GPU --------------------------------------------------------------------------------------

TP_GPU_TEST(a_pool_in_the_options_throws_usage_error) {
  BOOST_CHECK_THROW(tp::DeviceGroupGraph({0}, {.pool = tp::graph_pool_handle()}), tp::usage_error);
}

TP_GPUS_TEST(each_device_replays_its_own_kernels, 2) {
  tp::DeviceGroupGraph group({0, 1});
  auto x = per_device(group, [](int) { return 0.0f; });
  group.capture([&](int device, tp::StreamRef s) {
    const std::size_t i = group.index_of(device);
    tp_test::add(x[i].data(), n, 1.0f + static_cast<float>(device), s);  // +1 on device 0, +2 on device 1
  });
  std::vector<tp::StreamRef> streams;
  for (int device : group.devices()) streams.push_back(group.stream(device));
  for (int k = 0; k < 3; ++k) group.replay(streams);
  for (int device : group.devices()) {
    const auto host = to_host(x[group.index_of(device)], group.stream(device));
    BOOST_TEST(std::all_of(host.begin(), host.end(), [&](float v) { return v == 3.0f * (1.0f + static_cast<float>(device)); }),
               "device " << device << ": " << host[0]);
  }
}

// Bodies run in the order given, each with its device and capture stream current, while every
// capture of the group is open and none is compiled yet.
TP_GPUS_TEST(bodies_run_in_device_order_with_every_capture_open_and_their_device_current, 2) {
  tp::DeviceGroupGraph group({1, 0});
  std::vector<int> order;
  std::vector<int> current;
  std::vector<bool> all_open;
  std::vector<bool> stream_is_current;
  std::vector<bool> compiled;
  int before = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&before), cudaSuccess);
  group.capture([&](int device, tp::StreamRef s) {
    order.push_back(device);
    int now = -1;
    BOOST_REQUIRE_EQUAL(cudaGetDevice(&now), cudaSuccess);
    current.push_back(now);
    all_open.push_back(group.graph(0).is_capturing() && group.graph(1).is_capturing());
    stream_is_current.push_back(tp::current_stream() == s && s.is_capturing());
    compiled.push_back(group.graph(0).is_instantiated() || group.graph(1).is_instantiated());
    tp_test::spin_kernel<<<1, 1, 0, s>>>(0);
  });
  BOOST_TEST(order == std::vector<int>({1, 0}), boost::test_tools::per_element());
  BOOST_TEST(current == order, boost::test_tools::per_element());
  BOOST_TEST(std::all_of(all_open.begin(), all_open.end(), [](bool b) { return b; }));
  BOOST_TEST(std::all_of(stream_is_current.begin(), stream_is_current.end(), [](bool b) { return b; }));
  BOOST_TEST(std::none_of(compiled.begin(), compiled.end(), [](bool b) { return b; }));
  BOOST_TEST(group.is_instantiated());
  BOOST_TEST(!group.is_capturing());
  int after = -1;
  BOOST_REQUIRE_EQUAL(cudaGetDevice(&after), cudaSuccess);
  BOOST_TEST(after == before);
}

// The step form: one call with every capture stream, for work that interleaves devices.
TP_GPUS_TEST(a_step_body_is_called_once_with_every_capture_stream, 2) {
  tp::DeviceGroupGraph group({0, 1});
  auto x = per_device(group, [](int) { return 1.0f; });
  int calls = 0;
  group.capture([&](std::span<const tp::StreamRef> s) {
    ++calls;
    BOOST_REQUIRE_EQUAL(s.size(), 2u);
    for (int round = 0; round < 2; ++round) {  // device 0, device 1, device 0, device 1
      for (std::size_t i = 0; i < s.size(); ++i) {
        tp::StreamGuard guard(s[i]);
        BOOST_TEST(s[i].is_capturing());
        tp_test::affine(x[i].data(), x[i].data(), n, 2.0f, static_cast<float>(i), s[i]);
      }
    }
  });
  BOOST_TEST(calls == 1);
  group.replay();  // on each device's current stream: the legacy default stream here
  synchronize_devices(group);
  for (std::size_t i = 0; i < 2; ++i) {
    const float b = static_cast<float>(i);
    BOOST_TEST(to_host(x[i], group.stream(static_cast<int>(i)))[7] == (1.0f * 2 + b) * 2 + b);
  }
}

TP_GPUS_TEST(a_throwing_body_abandons_every_capture_and_the_group_captures_again, 2) {
  tp::DeviceGroupGraph group({0, 1});
  auto x = per_device(group, [](int) { return 0.0f; });
  auto body = [&](bool fail) {
    return [&, fail](int device, tp::StreamRef s) {
      tp_test::add(x[group.index_of(device)].data(), n, 1.0f, s);
      if (fail && device == 1) throw std::runtime_error("body failed");
    };
  };
  BOOST_CHECK_THROW(group.capture(body(true)), std::runtime_error);
  BOOST_TEST(!any_capturing(group));
  for (int device : group.devices()) {
    BOOST_TEST(tp_test::not_capturing(group.stream(device)));
    BOOST_TEST(group.graph(device).native_graph() == nullptr);  // reset: holds nothing
  }
  BOOST_CHECK_THROW(group.replay(), tp::usage_error);

  group.capture(body(false));
  group.replay();
  synchronize_devices(group);
  for (int device : group.devices()) {
    BOOST_TEST(to_host(x[group.index_of(device)], group.stream(device))[0] == 1.0f);  // the failed capture ran nothing
  }
}

TP_GPUS_TEST(a_second_capture_needs_reset_first, 2) {
  tp::DeviceGroupGraph group({0, 1});
  auto x = per_device(group, [](int) { return 0.0f; });
  auto body = [&](float value) {
    return [&, value](int device, tp::StreamRef s) { tp_test::fill(x[group.index_of(device)].data(), n, value, s); };
  };
  group.capture(body(1.0f));
  BOOST_CHECK_THROW(group.capture(body(2.0f)), tp::usage_error);
  BOOST_TEST(group.is_instantiated());  // the refused capture left the graphs alone
  group.reset();
  group.capture(body(2.0f));
  group.replay();
  synchronize_devices(group);
  for (int device : group.devices()) {
    BOOST_TEST(to_host(x[group.index_of(device)], group.stream(device))[0] == 2.0f);
  }
}

TP_GPUS_TEST(capture_on_given_streams_captures_there_and_replays_on_others, 2) {
  tp::DeviceGroupGraph group({0, 1});
  auto x = per_device(group, [](int) { return 0.0f; });
  tp::Stream c0(0), c1(1), r0(0), r1(1);
  const std::vector<tp::StreamRef> capture_streams{c0, c1};
  const std::vector<tp::StreamRef> replay_streams{r0, r1};
  std::vector<bool> on_given;
  group.capture(
      [&](int device, tp::StreamRef s) {
        on_given.push_back(s == capture_streams[group.index_of(device)]);
        tp_test::add(x[group.index_of(device)].data(), n, 1.0f, s);
      },
      capture_streams);
  BOOST_TEST(on_given == std::vector<bool>({true, true}), boost::test_tools::per_element());
  for (int k = 0; k < 5; ++k) group.replay(replay_streams);
  for (std::size_t i = 0; i < 2; ++i) BOOST_TEST(to_host(x[i], replay_streams[i])[n - 1] == 5.0f);
}

TP_GPUS_TEST(a_capture_stream_of_another_device_throws_usage_error, 2) {
  tp::DeviceGroupGraph group({0, 1});
  tp::Stream s0(0), s1(1);
  const std::vector<tp::StreamRef> swapped{s1, s0};
  bool ran = false;
  BOOST_CHECK_THROW(group.capture([&](int, tp::StreamRef) { ran = true; }, swapped), tp::usage_error);
  BOOST_TEST(!ran);
  BOOST_TEST(!any_capturing(group));
  BOOST_TEST(tp_test::not_capturing(s0));
  BOOST_TEST(tp_test::not_capturing(s1));
}

// Memory a body allocates comes from its own device's graph pool.
TP_GPUS_TEST(tensors_allocated_in_a_body_come_from_that_devices_graph_pool, 2) {
  tp::DeviceGroupGraph group({0, 1});
  std::vector<tp::DeviceTensor<float>> made(2);
  group.capture([&](int device, tp::StreamRef s) {
    made[group.index_of(device)] = tp::DeviceTensor<float>(n);  // on the current stream: the capture's
    tp_test::fill(made[group.index_of(device)].data(), n, 4.0f, s);
  });
  for (int device : group.devices()) {
    const tp::DeviceTensor<float>& t = made[group.index_of(device)];
    BOOST_TEST(t.device() == device);
    BOOST_TEST(t.pool().id() == group.graph(device).pool_id());
  }
  BOOST_TEST(group.graph(0).pool_id() != group.graph(1).pool_id());
}

// CUDA refuses to compile a graph while the same thread has another capture open in
// thread_local mode (gpu.md): the group ends every capture first, so this works.
TP_GPUS_TEST(a_thread_local_group_capture_compiles_after_every_capture_ends, 2) {
  tp::DeviceGroupGraph group({0, 1}, {.capture_error_mode = tp::CaptureErrorMode::ThreadLocal});
  auto x = per_device(group, [](int) { return 0.0f; });
  group.capture([&](int device, tp::StreamRef s) { tp_test::add(x[group.index_of(device)].data(), n, 2.0f, s); });
  group.replay();
  synchronize_devices(group);
  for (int device : group.devices()) {
    BOOST_TEST(to_host(x[group.index_of(device)], group.stream(device))[3] == 2.0f);
  }
}

TP_GPU_TEST(a_group_of_one_device_captures_and_replays) {
  tp::DeviceGroupGraph group({0});
  auto x = per_device(group, [](int) { return 1.0f; });
  group.capture([&](int, tp::StreamRef s) { tp_test::add(x[0].data(), n, 1.0f, s); });
  const std::vector<tp::StreamRef> streams{group.stream(0)};
  for (int k = 0; k < 4; ++k) group.replay(streams);
  BOOST_TEST(to_host(x[0], streams[0])[0] == 5.0f);
}
