// Threads that capture, replay and allocate at the same time (Graph, Pool, DeviceTensor).
//
// Every result is exact and checked, and every wait is bounded: a thread that does not finish
// before the deadline fails the test (and ends the process, since a deadlocked thread cannot be
// joined) instead of hanging it. Worker threads use no Boost.Test macro (not thread-safe): they
// return what went wrong, and the main thread reports it.
// TENSORPLAY_THREAD_CAPTURES (default 200; 30 under compute-sanitizer) sets the captures per
// capturing thread, TENSORPLAY_THREAD_BUDGET_S (120; 400) the deadline of each case.
// To take features out of the eight-thread case (racecheck's internal error, docs/reliability.md
// section 13): TENSORPLAY_THREAD_NO_IF=1 captures a plain graph where it would add an if_,
// TENSORPLAY_THREAD_NO_WHILE=1 where it would add a while_, TENSORPLAY_THREAD_PRIVATE_POOLS=1
// uses a private pool where it would use a shared one. The random draws stay the same.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;
using Clock = std::chrono::steady_clock;

namespace {

// One block, no shared memory (clean under racecheck); arithmetic in unsigned, as on the host.
__global__ void affine_words(const int* in, int* out, std::size_t n, unsigned a, unsigned b) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = static_cast<int>(a * static_cast<unsigned>(in[i]) + b);
}
__global__ void add_words(int* out, std::size_t n, unsigned value) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = static_cast<int>(static_cast<unsigned>(out[i]) + value);
}
__global__ void fill_words(int* out, std::size_t n, int value) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}
__global__ void store(int* counter, int value) { *counter = value; }
__global__ void decrement(int* counter) { *counter -= 1; }

struct CounterPositive {
  const int* counter;
  __host__ __device__ bool operator()() const { return *counter > 0; }
};

//! Loads every kernel the workers use before the threads start, the library's conditional
//! kernels and the while_ predicate's included (one capture uses them). Under CUDA's lazy loading
//! (the default) a kernel's first use loads it, and loading invalidates captures open on other
//! threads, thread-local ones too: under racecheck, a capture of this test was invalidated
//! before its first allocation while the other threads were launching their first kernels.
void load_kernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel : {reinterpret_cast<const void*>(affine_words), reinterpret_cast<const void*>(add_words),
                             reinterpret_cast<const void*>(fill_words), reinterpret_cast<const void*>(store),
                             reinterpret_cast<const void*>(decrement)})
    BOOST_REQUIRE_EQUAL(cudaFuncGetAttributes(&attributes, kernel), cudaSuccess);
  tp::Stream stream;
  tp::DeviceTensor<bool> flag(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef) {
    graph.if_(flag, [&](tp::StreamRef body) { decrement<<<1, 1, 0, body>>>(counter.data()); });
    graph.while_(CounterPositive{counter.data()}, [&](tp::StreamRef body) { decrement<<<1, 1, 0, body>>>(counter.data()); });
  }, {.stream = stream});
  stream.synchronize();
}

//! Under compute-sanitizer (TENSORPLAY_UNDER_SANITIZER, set by tools/gpu/run) kernels run far
//! slower: fewer captures by default, and more time before a thread counts as stuck.
bool under_sanitizer() { return std::getenv("TENSORPLAY_UNDER_SANITIZER") != nullptr; }
int captures_per_thread() {
  return static_cast<int>(tp_test::env_or("TENSORPLAY_THREAD_CAPTURES", under_sanitizer() ? 30 : 200));
}
std::chrono::seconds time_budget() {
  return std::chrono::seconds(tp_test::env_or("TENSORPLAY_THREAD_BUDGET_S", under_sanitizer() ? 400 : 120));
}
constexpr tp::CaptureErrorMode thread_local_mode = tp::CaptureErrorMode::ThreadLocal;

//! Why a launch failed ("" when it did not): a worker's error text.
std::string launch_error(const char* what) {
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? std::string() : std::string(what) + " launch failed: " + cudaGetErrorName(status);
}

//! What a worker thread reports.
struct Result {
  std::string error;
  long count = 0;  // captures, replays or allocations it completed
};

//! Runs `work` on its own thread; exceptions become the result's error.
template <class F>
std::future<Result> start(F work) {
  return std::async(std::launch::async, [work]() mutable {
    try {
      return work();
    } catch (const std::exception& e) {
      return Result{std::string("exception: ") + e.what(), 0};
    }
  });
}

//! Waits for every future until `deadline`. A thread still running then is taken for a deadlock:
//! the test fails and the process ends (its threads cannot be joined).
std::vector<Result> wait_all(std::vector<std::future<Result>>& futures, Clock::time_point deadline, const char* who) {
  std::vector<Result> results;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (futures[i].wait_until(deadline) != std::future_status::ready) {
      std::cerr << "thread_test: " << who << " thread " << i << " did not finish before the deadline (deadlock?)" << std::endl;
      BOOST_ERROR(who << " thread " << i << " did not finish before the deadline (deadlock?)");
      std::_Exit(3);
    }
    results.push_back(futures[i].get());
  }
  return results;
}

std::vector<int> host_words(std::size_t n, unsigned base) {
  std::vector<int> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<int>(base + static_cast<unsigned>(i));
  return out;
}

//! Compares `got` with f(i) for every i; "" or the first difference.
template <class F>
std::string compare(const std::vector<int>& got, F&& expected, const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (static_cast<unsigned>(got[i]) != expected(i))
      return what + ": element " + std::to_string(i) + " is " + std::to_string(static_cast<unsigned>(got[i])) + ", expected " +
             std::to_string(expected(i));
  return {};
}

// ---- capturing threads ------------------------------------------------------------------------

struct SharedPools {
  // Made in the constructor: nvcc 13.0 aborts ("Compilation aborted.", no message) on a default
  // member initializer that calls graph_pool_handle() (its std::source_location default argument).
  SharedPools() {
    for (tp::Pool& pool : pools) pool = tp::graph_pool_handle();
  }
  std::array<tp::Pool, 3> pools;
  // Held across capture, replay and synchronisation of a graph of that pool: graphs that share a
  // pool must neither capture at once (refused) nor replay concurrently (the contract).
  std::array<std::timed_mutex, 3> locks;
  Clock::time_point deadline;
  // Features taken out (TENSORPLAY_THREAD_NO_IF, _NO_WHILE, _PRIVATE_POOLS; the file's header).
  bool no_if = tp_test::env_or("TENSORPLAY_THREAD_NO_IF", 0) != 0;
  bool no_while = tp_test::env_or("TENSORPLAY_THREAD_NO_WHILE", 0) != 0;
  bool private_pools = tp_test::env_or("TENSORPLAY_THREAD_PRIVATE_POOLS", 0) != 0;
};

//! `captures` times: capture (into a private pool, or a shared one under its lock) a graph that
//! allocates a temporary and an output, maybe with an if_ or a while_; replay; check; then reset
//! or destroy the graph, with its output dying before or after it.
Result capture_worker(int id, SharedPools& shared, int captures) {
  tp::Stream stream;
  const std::size_t n = 200 + 37 * static_cast<std::size_t>(id);
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<bool> flag(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  std::mt19937 rng(static_cast<unsigned>(1000 + id));
  std::optional<tp::Graph> graph;
  std::optional<tp::DeviceTensor<int>> out;
  std::string error;
  for (int i = 0; i < captures; ++i) {
    if (Clock::now() > shared.deadline) return {"capturing thread " + std::to_string(id) + " ran out of time", i};
    int pool = static_cast<int>(rng() % 4) - 1;  // -1: a private pool
    const unsigned a = rng() % 7 + 1, b = rng(), c = rng() % 5 + 1, d = rng(), base = rng();
    int shape = static_cast<int>(rng() % 3);  // plain, if_, while_
    if ((shape == 1 && shared.no_if) || (shape == 2 && shared.no_while)) shape = 0;
    if (shared.private_pools) pool = -1;
    const bool taken = rng() % 2 == 1;
    const int loops = static_cast<int>(rng() % 4);
    std::unique_lock<std::timed_mutex> lock;
    if (pool >= 0) {
      lock = std::unique_lock<std::timed_mutex>(shared.locks[static_cast<std::size_t>(pool)], std::defer_lock);
      if (!lock.try_lock_until(shared.deadline)) return {"capturing thread " + std::to_string(id) + ": pool lock timed out", i};
    }
    if (!graph) graph.emplace(tp::GraphOptions{.capture_error_mode = thread_local_mode});
    tp::CaptureOptions options{.capture_error_mode = thread_local_mode, .stream = stream};
    if (pool >= 0) options.pool = shared.pools[static_cast<std::size_t>(pool)];
    graph->capture([&](tp::StreamRef s) {
      tp::DeviceTensor<int> temp(n, s);  // freed inside the capture
      affine_words<<<1, 256, 0, s>>>(x.data(), temp.data(), n, a, b);
      out = tp::DeviceTensor<int>(n, s);  // kept: from the graph's pool
      affine_words<<<1, 256, 0, s>>>(temp.data(), out->data(), n, c, d);
      if (shape == 1)
        graph->if_(flag, [&](tp::StreamRef body) { add_words<<<1, 256, 0, body>>>(out->data(), n, 1u); });
      if (shape == 2) {
        store<<<1, 1, 0, s>>>(counter.data(), loops);
        graph->while_(CounterPositive{counter.data()}, [&](tp::StreamRef body) {
          add_words<<<1, 256, 0, body>>>(out->data(), n, 1u);
          decrement<<<1, 1, 0, body>>>(counter.data());
        });
      }
      error += launch_error("capture body");
    }, options);
    const std::vector<int> input = host_words(n, base);
    x.copy_from_host(input, stream);
    flag.copy_from_host(std::span<const bool>(&taken, 1), stream);
    graph->replay(stream);
    const std::vector<int> got = out->to_host(stream);  // waits for the replay
    if (lock.owns_lock()) lock.unlock();
    const unsigned extra = (shape == 1 && taken ? 1u : 0u) + (shape == 2 ? static_cast<unsigned>(loops) : 0u);
    error += compare(got, [&](std::size_t k) { return c * (a * (base + static_cast<unsigned>(k)) + b) + d + extra; },
                     "capturing thread " + std::to_string(id) + ", capture " + std::to_string(i));
    if (!error.empty()) return {error, i};
    switch (rng() % 4) {  // the graph and its output die in either order (outside the pool's lock)
      case 0: graph->reset(); break;
      case 1: graph.reset(); break;
      case 2:
        out.reset();
        graph->reset();
        break;
      default:
        out.reset();
        graph.reset();
        break;
    }
  }
  return {"", captures};
}

// ---- replaying and allocating threads -----------------------------------------------------------

//! Graphs captured on the main thread, replayed by another: each adds j + 1 to `sum`.
struct ReplaySet {
  tp::Stream stream;
  static constexpr std::size_t n = 512;
  tp::DeviceTensor<int> sum{n, stream};
  std::array<tp::Graph, 3> graphs;

  ReplaySet() {
    const std::vector<int> zeros(n, 0);
    sum.copy_from_host(zeros, stream);
    for (std::size_t j = 0; j < graphs.size(); ++j)
      graphs[j].capture([&](tp::StreamRef s) { add_words<<<1, 256, 0, s>>>(sum.data(), n, static_cast<unsigned>(j + 1)); },
                        {.capture_error_mode = thread_local_mode, .stream = stream});
    stream.synchronize();
  }
};

Result replay_worker(ReplaySet& set, const std::atomic<bool>& stop, Clock::time_point deadline) {
  unsigned total = 0;
  long replays = 0;
  while (!stop.load() && Clock::now() < deadline) {
    for (std::size_t j = 0; j < set.graphs.size(); ++j) {
      set.graphs[j].replay(set.stream);
      total += static_cast<unsigned>(j + 1);
      ++replays;
    }
    if (replays % 48 == 0) {
      const std::string error = compare(set.sum.to_host(set.stream), [&](std::size_t) { return total; },
                                        "replaying thread after " + std::to_string(replays) + " replays");
      if (!error.empty()) return {error, replays};
    }
  }
  const std::string error = compare(set.sum.to_host(set.stream), [&](std::size_t) { return total; }, "replaying thread at the end");
  return {error, replays};
}

//! Allocates and frees DeviceTensors (default pool, outside any capture) while others capture.
Result allocate_worker(int id, const std::atomic<bool>& stop, Clock::time_point deadline) {
  tp::Stream stream;
  std::mt19937 rng(static_cast<unsigned>(77 + id));
  struct Live {
    tp::DeviceTensor<int> tensor;
    int value;
  };
  std::vector<Live> live;
  long allocations = 0;
  while (!stop.load() && Clock::now() < deadline) {
    if (live.size() < 16 && rng() % 3 != 0) {
      const std::size_t size = 1 + rng() % 8192;
      const int value = static_cast<int>(rng());
      tp::DeviceTensor<int> t(size, stream);
      fill_words<<<1, 256, 0, stream>>>(t.data(), size, value);
      if (std::string error = launch_error("fill_words"); !error.empty()) return {error, allocations};
      live.push_back({std::move(t), value});
      ++allocations;
    } else if (!live.empty()) {
      const std::size_t victim = rng() % live.size();
      if (rng() % 4 == 0) {  // check before freeing (the free is ordered after the fill on the stream)
        const Live& l = live[victim];
        const std::string error = compare(l.tensor.to_host(stream), [&](std::size_t) { return static_cast<unsigned>(l.value); },
                                          "allocating thread " + std::to_string(id));
        if (!error.empty()) return {error, allocations};
      }
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
  }
  return {"", allocations};
}

//! The body of the racing captures: y = 3 * x + 1 through a temporary of the graph's pool.
void racing_body(tp::StreamRef s, const tp::DeviceTensor<int>& x, std::optional<tp::DeviceTensor<int>>& y) {
  tp::DeviceTensor<int> temp(x.size(), s);
  affine_words<<<1, 256, 0, s>>>(x.data(), temp.data(), x.size(), 3u, 0u);
  y = tp::DeviceTensor<int>(x.size(), s);
  affine_words<<<1, 256, 0, s>>>(temp.data(), y->data(), x.size(), 1u, 1u);
}

//! Replays `graph`, waits, checks y = 3 * x + 1 for x = base + i.
std::string replay_and_check(tp::Graph& graph, const tp::DeviceTensor<int>& y, unsigned base, tp::StreamRef stream,
                             const std::string& what) {
  graph.replay(stream);
  return compare(y.to_host(stream), [&](std::size_t i) { return 3u * (base + static_cast<unsigned>(i)) + 1u; }, what);
}

void report(const std::vector<Result>& results, const char* who) {
  for (std::size_t i = 0; i < results.size(); ++i) BOOST_TEST(results[i].error.empty(), who << " thread " << i << ": " << results[i].error);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(threads)

TP_GPU_TEST(eight_threads_capture_in_thread_local_mode_while_others_replay_and_allocate) {
  load_kernels();
  const int captures = captures_per_thread();
  SharedPools shared;
  shared.deadline = Clock::now() + time_budget();
  std::array<ReplaySet, 2> replay_sets;
  std::atomic<bool> stop{false};

  std::vector<std::future<Result>> background;
  for (ReplaySet& set : replay_sets) background.push_back(start([&set, &stop, &shared] { return replay_worker(set, stop, shared.deadline); }));
  for (int id = 0; id < 2; ++id) background.push_back(start([id, &stop, &shared] { return allocate_worker(id, stop, shared.deadline); }));
  std::vector<std::future<Result>> capturing;
  for (int id = 0; id < 8; ++id) capturing.push_back(start([id, &shared, captures] { return capture_worker(id, shared, captures); }));

  const std::vector<Result> captured = wait_all(capturing, shared.deadline + std::chrono::seconds(10), "capturing");
  stop.store(true);
  const std::vector<Result> others = wait_all(background, shared.deadline + std::chrono::seconds(20), "replaying or allocating");
  report(captured, "capturing");
  report(others, "replaying or allocating");
  for (const Result& r : captured) BOOST_TEST(r.count == captures);
  for (const Result& r : others) BOOST_TEST(r.count > 0);  // they really ran alongside
  BOOST_TEST_MESSAGE("replays " << others[0].count << " + " << others[1].count << ", allocations " << others[2].count << " + "
                                << others[3].count);
}

TP_GPU_TEST(a_second_capture_into_a_busy_pool_throws_usage_error_and_succeeds_once_the_pool_is_free) {
  const Clock::time_point deadline = Clock::now() + time_budget();
  tp::Pool pool = tp::graph_pool_handle();
  tp::Stream mine;
  tp::DeviceTensor<int> x(300, mine);
  x.copy_from_host(host_words(300, 5), mine);
  mine.synchronize();
  std::promise<void> begun;
  std::promise<void> tried;
  std::shared_future<void> tried_done = tried.get_future().share();
  auto other = start([&, tried_done] {
    tp::Stream stream;
    tp::Graph graph;
    std::optional<tp::DeviceTensor<int>> y;
    graph.capture_begin({.pool = pool, .capture_error_mode = thread_local_mode, .stream = stream});
    racing_body(stream, x, y);
    begun.set_value();  // the pool is busy until capture_end
    if (tried_done.wait_until(deadline) != std::future_status::ready) return Result{"the main thread never tried", 0};
    graph.capture_end();
    return Result{replay_and_check(graph, *y, 5, stream, "the first capture"), 1};
  });
  std::future<void> begun_done = begun.get_future();
  BOOST_REQUIRE(begun_done.wait_until(deadline) == std::future_status::ready);
  tp::Graph graph;
  std::optional<tp::DeviceTensor<int>> y;
  BOOST_CHECK_THROW(graph.capture_begin({.pool = pool, .capture_error_mode = thread_local_mode, .stream = mine}), tp::usage_error);
  BOOST_TEST(!graph.is_capturing());
  BOOST_TEST(tp_test::not_capturing(mine));
  tried.set_value();
  std::vector<std::future<Result>> futures;
  futures.push_back(std::move(other));
  report(wait_all(futures, deadline, "first capturing"), "first capturing");
  // The loser retries now that the pool is free.
  graph.capture([&](tp::StreamRef s) { racing_body(s, x, y); }, {.pool = pool, .capture_error_mode = thread_local_mode, .stream = mine});
  const std::string error = replay_and_check(graph, *y, 5, mine, "the retried capture");
  BOOST_TEST(error.empty(), error);
}

TP_GPU_TEST(threads_racing_to_capture_into_one_pool_get_success_or_usage_error_and_retry) {
  const Clock::time_point deadline = Clock::now() + time_budget();
  const int captures = captures_per_thread() / 2;
  tp::Pool pool = tp::graph_pool_handle();
  std::timed_mutex replaying;  // replays of this pool's graphs never run concurrently (the contract)
  std::atomic<long> refusals{0};
  std::vector<std::future<Result>> racers;
  for (int id = 0; id < 4; ++id) {
    racers.push_back(start([&, id] {
      tp::Stream stream;
      const std::size_t n = 128 + 64 * static_cast<std::size_t>(id);
      tp::DeviceTensor<int> x(n, stream);
      std::optional<tp::DeviceTensor<int>> y;
      for (int i = 0; i < captures; ++i) {
        const unsigned base = static_cast<unsigned>(id * 100000 + i);
        x.copy_from_host(host_words(n, base), stream);
        tp::Graph graph;
        for (;;) {  // no lock around the capture: a busy pool refuses, and this thread retries
          if (Clock::now() > deadline) return Result{"racing thread " + std::to_string(id) + " ran out of time", i};
          try {
            graph.capture([&](tp::StreamRef s) { racing_body(s, x, y); },
                          {.pool = pool, .capture_error_mode = thread_local_mode, .stream = stream});
            break;
          } catch (const tp::usage_error&) {
            refusals.fetch_add(1);
            if (graph.is_capturing() || !tp_test::not_capturing(stream))
              return Result{"a refused capture left something capturing", i};
            std::this_thread::yield();
          }
        }
        std::unique_lock<std::timed_mutex> lock(replaying, std::defer_lock);
        if (!lock.try_lock_until(deadline)) return Result{"the replay lock timed out", i};
        const std::string error = replay_and_check(graph, *y, base, stream, "racing thread " + std::to_string(id) + ", capture " + std::to_string(i));
        if (!error.empty()) return Result{error, i};
      }
      return Result{"", captures};
    }));
  }
  const std::vector<Result> results = wait_all(racers, deadline + std::chrono::seconds(10), "racing");
  report(results, "racing");
  for (const Result& r : results) BOOST_TEST(r.count == captures);
  BOOST_TEST_MESSAGE("captures refused because the pool was busy: " << refusals.load());
}

BOOST_AUTO_TEST_SUITE_END()
