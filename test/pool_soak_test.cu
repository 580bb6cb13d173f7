// Soak test for tensorplay/pool.hpp: capture, replay and reset, many times, without growth.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

namespace tp = tensorplay;

BOOST_AUTO_TEST_SUITE(pool_soak)

TP_GPU_TEST(ten_thousand_capture_replay_reset_cycles_keep_device_memory_and_rss_flat) {
  // TENSORPLAY_SOAK_CYCLES shortens the run under compute-sanitizer (its checks, not the count, matter there).
  const long cycles = tp_test::env_or("TENSORPLAY_SOAK_CYCLES", 10000);
  const long warmup = std::min<long>(100, cycles / 2);
  tp::Stream stream;
  const std::size_t n = 1 << 16;
  tp::DeviceTensor<float> x(n, stream);
  tp_test::fill(x.data(), n, 1.0f, stream);
  tp::DeviceTensor<float> sink(n, stream);
  tp::Graph graph;
  std::size_t device_after_warmup = 0;
  std::size_t rss_after_warmup = 0;
  // No Boost assertion inside the loop: the test log keeps every assertion, which would
  // grow the RSS this test watches.
  long failed_launches = 0;
  for (long cycle = 0; cycle < cycles; ++cycle) {
    graph.capture([&](tp::StreamRef s) {
      tp::DeviceTensor<float> temp(n, s);  // each capture needs its own pool memory
      tp_test::affine_kernel<<<64, 256, 0, s>>>(x.data(), temp.data(), n, 2.0f, 0.0f);
      tp_test::affine_kernel<<<64, 256, 0, s>>>(temp.data(), sink.data(), n, 1.0f, static_cast<float>(cycle % 7));
      failed_launches += cudaGetLastError() != cudaSuccess;
    }, {.stream = stream});
    graph.replay(stream);
    graph.reset();
    if (cycle % 1000 == 0) stream.synchronize();
    if (cycle + 1 == warmup) {
      stream.synchronize();
      device_after_warmup = tp_test::device_bytes_in_use();
      rss_after_warmup = tp_test::resident_bytes();
    }
  }
  stream.synchronize();
  BOOST_TEST(failed_launches == 0);
  BOOST_TEST(sink.to_host(stream)[n - 1] == 2.0f + static_cast<float>((cycles - 1) % 7));
  const std::size_t device_now = tp_test::device_bytes_in_use();
  const std::size_t rss_now = tp_test::resident_bytes();
  BOOST_TEST_MESSAGE("cycles " << cycles << ": device in use " << device_after_warmup << " -> " << device_now
                               << " bytes, RSS " << rss_after_warmup << " -> " << rss_now << " bytes");
  if (std::getenv("TENSORPLAY_UNDER_SANITIZER") != nullptr) {
    // The sanitizer's own book-keeping grows the process; flatness is checked in plain runs.
    BOOST_TEST_MESSAGE("device memory and RSS flatness not checked under compute-sanitizer");
    return;
  }
  BOOST_TEST(device_now <= device_after_warmup + device_after_warmup / 100);
  BOOST_TEST(rss_now <= rss_after_warmup + rss_after_warmup / 100);
}

BOOST_AUTO_TEST_SUITE_END()
