// The pairs of {update, stage_and_launch, retain, nested replay, conditionals, shared pools,
// buckets, threads} that test/sequence_test.cu leaves out, one case (or more) per pair. Every
// output is copied back and compared exactly with what the same work run eagerly gives; where a
// pool is shared, its identity and allocated_bytes are checked too. Threads never use Boost.Test
// macros: they return what went wrong as strings, checked after they are joined, and every case
// with threads runs under a time budget (a hang aborts the binary instead of blocking forever).
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 4096;
using Ladder = std::vector<std::size_t>;
using Clock = std::chrono::steady_clock;

__global__ void add_into(const int* in, int* out, std::size_t count, int value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = in[i] + value;
}
__global__ void sum_into(const int* a, const int* b, int* out, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}
__global__ void iota_kernel(int* out, std::size_t count, int base) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = base + static_cast<int>(i % 997);
}
__global__ void count_down(int* counter, bool* more) {
  *counter -= 1;
  *more = *counter > 0;
}
__global__ void set_flag(bool* flag, bool value) { *flag = value; }
__global__ void set_int(int* x, int value) { *x = value; }

// What iota_kernel writes at element i (the eager reference of every input).
int iota_at(int base, std::size_t i) { return base + static_cast<int>(i % 997); }

// Launches that report through the return value (usable on any thread).
void iota(tp::DeviceTensor<int>& t, int base, tp::StreamRef s, std::size_t count = 0) {
  iota_kernel<<<8, 256, 0, s>>>(t.data(), count == 0 ? t.size() : count, base);
}
void fill_all(tp::DeviceTensor<int>& t, int value, tp::StreamRef s) {
  tp_test::fill_kernel<<<tp_test::blocks_for(t.size()), 256, 0, s>>>(t.data(), t.size(), value);
}
// The conditional state of a while_ loop whose body ends with step(): arm(k) before a replay
// (counter = k, more = k > 0) makes the body run k times.
struct Countdown {
  explicit Countdown(tp::StreamRef s) : counter(1, s), more(1, s) {}
  void arm(int k, tp::StreamRef s) {
    set_int<<<1, 1, 0, s>>>(counter.data(), k);
    set_flag<<<1, 1, 0, s>>>(more.data(), k > 0);
  }
  void step(tp::StreamRef s) { count_down<<<1, 1, 0, s>>>(counter.data(), more.data()); }
  tp::DeviceTensor<int> counter;
  tp::DeviceTensor<bool> more;
};

// A host copy for any thread (throws instead of using Boost.Test's assertions).
std::vector<int> host_in_thread(const tp::DeviceTensor<int>& t, tp::StreamRef s) {
  std::vector<int> out(t.size());
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) throw std::runtime_error("a launch failed: " + std::string(cudaGetErrorString(launched)));
  if (cudaMemcpyAsync(out.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    throw std::runtime_error("host copy failed: " + std::string(cudaGetErrorString(cudaGetLastError())));
  return out;
}
std::vector<int> host(const tp::DeviceTensor<int>& t, tp::StreamRef s) { return host_in_thread(t, s); }

// "" when got[i] == want(i) for every i, else the first element that differs.
std::string mismatch(const std::vector<int>& got, const std::function<int(std::size_t)>& want) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want(i))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want(i));
  return "";
}

// y = x + value (the first `count` elements) through a temporary of the capture's pool.
auto through_temporary(tp::DeviceTensor<int>& x, tp::DeviceTensor<int>& y, int value, std::size_t count = n) {
  return [&x, &y, value, count](tp::StreamRef s) {
    tp::DeviceTensor<int> t(count, s);
    add_into<<<8, 256, 0, s>>>(x.data(), t.data(), count, value);
    add_into<<<8, 256, 0, s>>>(t.data(), y.data(), count, 0);
  };
}

// ---- retained objects whose destructor sets a flag --------------------------------------

struct Sentinel {
  explicit Sentinel(std::shared_ptr<std::atomic<bool>> flag) : gone(std::move(flag)) {}
  Sentinel(const Sentinel&) = delete;
  Sentinel& operator=(const Sentinel&) = delete;
  ~Sentinel() { gone->store(true); }
  std::shared_ptr<std::atomic<bool>> gone;  // shared: the destructor runs on a library thread
};
struct Watched {
  std::shared_ptr<std::atomic<bool>> gone;
  std::shared_ptr<Sentinel> token;  // moved into retain()
};
Watched watched() {
  auto gone = std::make_shared<std::atomic<bool>>(false);
  return {gone, std::make_shared<Sentinel>(gone)};
}
// Retained objects die on a thread of tensorplay's once nothing can launch them: poll for ~1 s.
bool becomes_true(const std::atomic<bool>& flag, std::chrono::milliseconds limit = std::chrono::milliseconds(1000)) {
  const auto deadline = Clock::now() + limit;
  while (!flag.load()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}
// Still alive a little later (a destructor run too early would have had time to run).
bool stays_false(const std::atomic<bool>& flag) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return !flag.load();
}

// ---- threads ------------------------------------------------------------------------------

// Runs body(t, deadline) -> "" or what went wrong, on `count` threads at once, and returns one
// string per thread. Bodies must give up (return an error) once `deadline` has passed; a thread
// still running 30 s after it (stuck in a CUDA call, say) aborts the binary rather than hang it.
template <class F>
std::vector<std::string> on_threads(int count, F body, std::chrono::seconds budget = std::chrono::seconds(120)) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    int done = 0;
    std::vector<std::string> errors;
  };
  auto shared = std::make_shared<Shared>();
  shared->errors.resize(static_cast<std::size_t>(count));
  const Clock::time_point deadline = Clock::now() + budget;
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t)
    threads.emplace_back([shared, &body, t, deadline] {
      std::string error;
      try {
        error = body(t, deadline);
      } catch (const std::exception& e) {
        error = std::string("exception: ") + e.what();
      } catch (...) {
        error = "unknown exception";
      }
      std::lock_guard lock(shared->mutex);
      shared->errors[static_cast<std::size_t>(t)] = std::move(error);
      ++shared->done;
      shared->done_cv.notify_all();
    });
  {
    std::unique_lock lock(shared->mutex);
    if (!shared->done_cv.wait_until(lock, deadline + std::chrono::seconds(30), [&] { return shared->done == count; })) {
      std::fprintf(stderr, "pairs_test: %d of %d threads still running past the time budget: aborting instead of hanging\n",
                   count - shared->done, count);
      std::fflush(stderr);
      std::abort();
    }
  }
  for (auto& th : threads) th.join();
  return shared->errors;
}

void check_threads(const std::vector<std::string>& errors) {
  for (std::size_t t = 0; t < errors.size(); ++t) BOOST_TEST(errors[t] == "", "thread " << t << ": " << errors[t]);
}

std::string at(const char* what, int round, const std::string& detail) {
  return std::string(what) + " wrong in round " + std::to_string(round) + ": " + detail;
}

constexpr tp::CaptureErrorMode thread_local_mode = tp::CaptureErrorMode::ThreadLocal;

}  // namespace

BOOST_AUTO_TEST_SUITE(pairs_left_out_by_sequence_test)

// ============================================================================================
// retain x conditionals
// ============================================================================================

// Objects retained inside a while_ body during capture, after a capture holding conditional
// nodes (which compiles it again), and by an inner graph replayed inside an IfScope body: all
// live while the outer graph does (the inner one destroyed meanwhile), and die after it.
TP_GPU_TEST(retain_and_conditionals) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  Countdown countdown(stream);
  tp::DeviceTensor<bool> yes(1, stream);
  Watched in_body = watched();
  Watched after = watched();
  Watched by_inner = watched();
  std::optional<tp::Graph> inner(std::in_place);
  inner->capture(through_temporary(y, y, 1), {.stream = stream});  // y += 1
  inner->retain(std::move(by_inner.token));
  std::optional<tp::Graph> outer(std::in_place);
  outer->capture(
      [&](tp::StreamRef) {
        outer->while_(countdown.more, [&](tp::StreamRef b) {
          outer->retain(std::move(in_body.token));
          add_into<<<8, 256, 0, b>>>(x.data(), x.data(), n, 2);  // x += 2 per iteration
          countdown.step(b);
        });
        tp::IfScope when(*outer, yes);
        add_into<<<8, 256, 0, when.stream()>>>(x.data(), y.data(), n, 0);  // y = x
        inner->replay(when.stream());                                      // y += 1
      },
      {.stream = stream});
  outer->retain(std::move(after.token));
  auto round = [&](int k, bool take) {
    iota(x, 10 * k, stream);
    fill_all(y, -1, stream);
    countdown.arm(k, stream);
    set_flag<<<1, 1, 0, stream>>>(yes.data(), take);
    outer->replay(stream);
    BOOST_TEST(mismatch(host(x, stream), [&](std::size_t i) { return iota_at(10 * k, i) + 2 * k; }) == "", "k " << k);
    BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return take ? iota_at(10 * k, i) + 2 * k + 1 : -1; }) == "",
               "k " << k << " take " << take);
  };
  for (auto [k, take] : std::initializer_list<std::pair<int, bool>>{{3, true}, {0, true}, {2, false}, {5, true}}) round(k, take);
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(stays_false(*in_body.gone));
  BOOST_TEST(stays_false(*after.gone));
  BOOST_TEST(stays_false(*by_inner.gone));
  inner.reset();  // the outer graph still holds what the inner one retained
  for (auto [k, take] : std::initializer_list<std::pair<int, bool>>{{1, true}, {4, false}, {2, true}}) round(k, take);
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(stays_false(*by_inner.gone));
  BOOST_TEST(stays_false(*in_body.gone));
  BOOST_TEST(stays_false(*after.gone));
  outer->replay(stream);
  outer.reset();  // never waits for the replay
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(becomes_true(*in_body.gone));
  BOOST_TEST(becomes_true(*after.gone));
  BOOST_TEST(becomes_true(*by_inner.gone));
}

// ============================================================================================
// retain x shared pools
// ============================================================================================

// Two graphs of one pool, each retaining an object: one graph's objects die with it (and its
// last replay), not with the pool, which the other graph and a handle keep alive.
TP_GPU_TEST(retain_and_shared_pools) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> z(n, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  Watched of_a = watched();
  Watched of_b = watched();
  std::optional<tp::Graph> a(std::in_place, tp::GraphOptions{.pool = pool});
  std::optional<tp::Graph> b(std::in_place, tp::GraphOptions{.pool = pool});
  a->retain(std::move(of_a.token));  // before the capture
  a->capture(through_temporary(x, y, 1), {.stream = stream});
  b->capture(through_temporary(y, z, 2), {.stream = stream});
  b->retain(std::move(of_b.token));  // after it
  BOOST_TEST((a->pool() == pool));
  BOOST_TEST((b->pool() == pool));
  BOOST_TEST((b->pool_id() == pool.id()));
  BOOST_TEST(pool.allocated_bytes() == 0u);  // only temporaries, freed inside the bodies
  BOOST_TEST(pool.reserved_bytes() >= n * sizeof(int));
  for (int base : {0, 7, -30}) {
    iota(x, base, stream);
    a->replay(stream);  // in capture order
    b->replay(stream);
    BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return iota_at(base, i) + 1; }) == "");
    BOOST_TEST(mismatch(host(z, stream), [&](std::size_t i) { return iota_at(base, i) + 3; }) == "");
  }
  BOOST_TEST(stays_false(*of_a.gone));
  BOOST_TEST(stays_false(*of_b.gone));
  a->replay(stream);
  a.reset();
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(becomes_true(*of_a.gone));  // the pool lives on, a's objects do not
  BOOST_TEST(stays_false(*of_b.gone));
  BOOST_TEST(pool.reserved_bytes() >= n * sizeof(int));
  iota(y, 40, stream);
  b->replay(stream);
  BOOST_TEST(mismatch(host(z, stream), [&](std::size_t i) { return iota_at(40, i) + 2; }) == "");
  b.reset();
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(becomes_true(*of_b.gone));
  BOOST_TEST(pool.allocated_bytes() == 0u);
  BOOST_TEST((tp::Pool(pool.id()) == pool));  // the handle keeps the pool alive
}

// ============================================================================================
// retain x buckets
// ============================================================================================

// GraphBuckets has no retain of its own: an object reaches a bucket through a graph that
// retained it and is replayed inside the bucket bodies. The buckets then hold it, also after
// that graph is destroyed; it dies once the GraphBuckets and its last run are gone.
TP_GPU_TEST(retain_and_buckets) {
  constexpr std::size_t top = 512;
  tp::Stream stream;
  tp::DeviceTensor<int> x(top, stream);
  tp::DeviceTensor<int> y(top, stream);
  tp::DeviceTensor<int> out(top, stream);
  Watched held = watched();
  std::optional<tp::Graph> inner(std::in_place);
  inner->capture(through_temporary(x, y, 1, top), {.stream = stream});  // y = x + 1
  inner->retain(std::move(held.token));
  auto body = [&](tp::StreamRef s, std::size_t size) {
    inner->replay(s);  // a child graph of the bucket's graph
    through_temporary(y, out, static_cast<int>(size), size)(s);
  };
  std::optional<tp::GraphBuckets<decltype(body)>> buckets(std::in_place, Ladder{64, 128, 256, 512}, body);
  auto rounds = [&](const char* when) {
    for (std::size_t batch : {100, 30, 512, 200, 64, 1}) {
      const int base = static_cast<int>(batch);
      iota(x, base, stream);
      fill_all(out, -1, stream);
      const std::size_t ran = buckets->run(batch, stream);
      BOOST_TEST(ran == buckets->bucket_for(batch));
      BOOST_TEST(mismatch(host(out, stream),
                          [&](std::size_t i) { return i < ran ? iota_at(base, i) + 1 + static_cast<int>(ran) : -1; }) == "",
                 when << ", batch " << batch);
    }
  };
  rounds("lazily captured");
  BOOST_TEST(buckets->executables() == 4u);
  inner.reset();  // every bucket is captured: the body is never called again
  rounds("after the inner graph died");
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(stays_false(*held.gone));
  BOOST_TEST(buckets->run(3, stream) == 64u);
  buckets.reset();
  BOOST_TEST(cudaStreamSynchronize(stream) == cudaSuccess);
  BOOST_TEST(becomes_true(*held.gone));
}

// ============================================================================================
// retain x threads
// ============================================================================================

// Six threads, 20 rounds each: a new graph retains an object (before, inside or after its
// capture), replays, dies; the object lives until then and dies within a second after.
TP_GPU_TEST(retain_on_six_threads) {
  const auto errors = on_threads(6, [](int t, Clock::time_point deadline) -> std::string {
    tp::Stream stream;
    tp::DeviceTensor<int> x(n, stream);
    tp::DeviceTensor<int> y(n, stream);
    for (int round = 0; round < 20; ++round) {
      if (Clock::now() > deadline) return "time budget spent at round " + std::to_string(round);
      Watched w = watched();
      {
        tp::Graph graph(tp::GraphOptions{.capture_error_mode = thread_local_mode});
        if (round % 3 == 0) graph.retain(std::move(w.token));
        graph.capture(
            [&](tp::StreamRef s) {
              if (round % 3 == 1) graph.retain(std::move(w.token));
              through_temporary(x, y, round)(s);
            },
            {.stream = stream});
        if (round % 3 == 2) graph.retain(std::move(w.token));
        if (w.token) return "round " + std::to_string(round) + ": the token was not retained";
        iota(x, 100 * t, stream);
        graph.replay(stream);
        graph.replay(stream);
        const std::string bad = mismatch(host_in_thread(y, stream), [&](std::size_t i) { return iota_at(100 * t, i) + round; });
        if (!bad.empty()) return at("y", round, bad);
        if (w.gone->load()) return "round " + std::to_string(round) + ": the retained object died while its graph lived";
        graph.replay(stream);
      }
      if (cudaStreamSynchronize(stream) != cudaSuccess) return "round " + std::to_string(round) + ": synchronize failed";
      if (!becomes_true(*w.gone)) return "round " + std::to_string(round) + ": the retained object outlived its graph by 1 s";
    }
    return "";
  });
  check_threads(errors);
}

// ============================================================================================
// nested replay x shared pools
// ============================================================================================

// Inner and outer graph in one pool, the outer replaying the inner and keeping a tensor from
// its body: the kept tensor is the pool's only allocation, and the outer keeps working after
// the inner graph dies.
TP_GPU_TEST(nested_replay_and_shared_pools) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> z(n, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  std::optional<tp::Graph> inner(std::in_place, tp::GraphOptions{.pool = pool});
  inner->capture(through_temporary(x, y, 1), {.stream = stream});  // y = x + 1
  tp::Graph outer(tp::GraphOptions{.pool = pool});
  std::optional<tp::DeviceTensor<int>> kept;
  outer.capture(
      [&](tp::StreamRef s) {
        inner->replay(s);
        through_temporary(y, z, 2)(s);  // z = x + 3
        kept.emplace(n, s);
        add_into<<<8, 256, 0, s>>>(z.data(), kept->data(), n, 10);  // kept = x + 13
      },
      {.stream = stream});
  BOOST_TEST((inner->pool() == pool));
  BOOST_TEST((outer.pool() == pool));
  BOOST_TEST((outer.pool_id() == inner->pool_id()));
  BOOST_TEST(pool.allocated_bytes() == n * sizeof(int));  // the kept tensor (16 KiB, a multiple of 512)
  auto check = [&](int base, const char* when) {
    BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return iota_at(base, i) + 1; }) == "", when);
    BOOST_TEST(mismatch(host(z, stream), [&](std::size_t i) { return iota_at(base, i) + 3; }) == "", when);
  };
  for (int base : {5, -9, 300}) {
    iota(x, base, stream);
    inner->replay(stream);  // capture order: inner, then outer
    outer.replay(stream);
    check(base, "both alive");
    BOOST_TEST(mismatch(host(*kept, stream), [&](std::size_t i) { return iota_at(base, i) + 13; }) == "");
  }
  inner.reset();
  BOOST_TEST(pool.allocated_bytes() == n * sizeof(int));
  iota(x, 77, stream);
  outer.replay(stream);
  check(77, "after the inner graph died");
  BOOST_TEST(mismatch(host(*kept, stream), [&](std::size_t i) { return iota_at(77, i) + 13; }) == "");
  kept.reset();  // its block goes back to the pool the outer graph keeps
  BOOST_TEST(pool.allocated_bytes() == 0u);
  iota(x, 1, stream);
  outer.replay(stream);
  check(1, "after the kept tensor died");
  BOOST_TEST((outer.pool() == pool));
}

// ============================================================================================
// nested replay x buckets, both ways
// ============================================================================================

// A graph replayed inside every bucket body, its pool shared with the ladder; with and without
// shared executables. After capture_all the inner graph dies and the buckets still run right.
TP_GPU_TEST(nested_replay_inside_bucket_bodies) {
  constexpr std::size_t top = 256;
  for (bool shared : {false, true}) {
    tp::Stream stream;
    tp::DeviceTensor<int> x(top, stream);
    tp::DeviceTensor<int> y(top, stream);
    tp::DeviceTensor<int> out(top, stream);
    std::optional<tp::Graph> inner(std::in_place);
    inner->capture(through_temporary(x, y, 5, top), {.stream = stream});  // y = x + 5
    const tp::Pool pool = inner->pool();
    auto body = [&](tp::StreamRef s, std::size_t size) {
      inner->replay(s);
      through_temporary(y, out, 1000, size)(s);  // out = x + 1005, the first `size` elements
    };
    tp::GraphBuckets buckets(Ladder{16, 64, 256}, body, tp::BucketOptions{.pool = pool, .share_executables = shared});
    BOOST_TEST((buckets.pool() == pool));
    buckets.capture_all(stream);
    BOOST_TEST(pool.allocated_bytes() == 0u);
    inner.reset();
    BOOST_TEST((buckets.pool() == pool));
    for (std::size_t batch : {16, 17, 3, 256, 64, 200, 1}) {
      const int base = 3 * static_cast<int>(batch);
      iota(x, base, stream);
      fill_all(out, -1, stream);
      const std::size_t ran = buckets.run(batch, stream);
      BOOST_TEST(ran == buckets.bucket_for(batch));
      BOOST_TEST(mismatch(host(out, stream), [&](std::size_t i) { return i < ran ? iota_at(base, i) + 1005 : -1; }) == "",
                 "shared " << shared << ", batch " << batch);
      BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return iota_at(base, i) + 5; }) == "");
    }
    BOOST_TEST(pool.allocated_bytes() == 0u);
  }
}

// Bucket runs issued to a stream that another graph captures become child graphs of that
// capture (an eager overflow run is captured into it directly); the outer graph keeps working
// after the GraphBuckets dies. With shared executables the run throws usage_error
// (documented), and nothing is left capturing.
TP_GPU_TEST(bucket_runs_replayed_into_an_outer_capture) {
  constexpr std::size_t top = 1024;
  tp::Stream stream;
  tp::DeviceTensor<int> acc(top, stream);
  // acc[i] += size for i < size, through a temporary.
  auto body = [&](tp::StreamRef s, std::size_t size) { through_temporary(acc, acc, static_cast<int>(size), size)(s); };
  std::optional<tp::GraphBuckets<decltype(body)>> buckets(std::in_place, Ladder{4, 16, 64, 256}, body);
  buckets->capture_all(stream);
  tp::Graph outer;
  outer.capture(
      [&](tp::StreamRef s) {
        BOOST_TEST(buckets->run(3, s) == 4u);
        BOOST_TEST(buckets->run(100, s) == 256u);
        BOOST_TEST(buckets->run(1000, s) == 1000u);  // above the ladder: eager, i.e. captured here
        BOOST_TEST(buckets->run(16, s) == 16u);
      },
      {.stream = stream});
  auto want = [](int base) {
    return [base](std::size_t i) {
      return iota_at(base, i) + (i < 4 ? 4 : 0) + (i < 256 ? 256 : 0) + (i < 1000 ? 1000 : 0) + (i < 16 ? 16 : 0);
    };
  };
  // The same work eagerly: the reference the outer graph's result must equal.
  iota(acc, 2, stream);
  for (std::size_t size : {4, 256, 1000, 16}) through_temporary(acc, acc, static_cast<int>(size), size)(stream);
  const std::vector<int> eager = host(acc, stream);
  BOOST_TEST(mismatch(eager, want(2)) == "");
  iota(acc, 2, stream);
  outer.replay(stream);
  BOOST_TEST(host(acc, stream) == eager);
  buckets.reset();
  for (int base : {-50, 9}) {
    iota(acc, base, stream);
    outer.replay(stream);
    BOOST_TEST(mismatch(host(acc, stream), want(base)) == "", "after the buckets died, base " << base);
  }
  auto other_body = [&](tp::StreamRef s, std::size_t size) { through_temporary(acc, acc, 1, size)(s); };
  tp::GraphBuckets shared(Ladder{4, 16}, other_body, tp::BucketOptions{.share_executables = true});
  shared.capture_all(stream);
  tp::Graph refused;
  BOOST_CHECK_THROW(refused.capture([&](tp::StreamRef s) { shared.run(4, s); }, {.stream = stream}), tp::usage_error);
  BOOST_TEST(tp_test::not_capturing(stream));
  iota(acc, 0, stream);
  BOOST_TEST(shared.run(5, stream) == 16u);
  BOOST_TEST(mismatch(host(acc, stream), [](std::size_t i) { return iota_at(0, i) + (i < 16 ? 1 : 0); }) == "");
}

// ============================================================================================
// conditionals x shared pools
// ============================================================================================

// Two graphs of one pool with conditional bodies that allocate temporaries (a while_ loop and
// an if_else_, and a WhileScope), and a tensor kept from inside a conditional body: it lives in
// the shared pool and is its only allocation.
TP_GPU_TEST(conditionals_and_shared_pools) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> w(n, stream);
  Countdown countdown(stream);
  Countdown countdown2(stream);
  tp::DeviceTensor<bool> flag(1, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  tp::Graph a(tp::GraphOptions{.pool = pool});
  tp::Graph b(tp::GraphOptions{.pool = pool});
  std::optional<tp::DeviceTensor<int>> kept;
  a.capture(
      [&](tp::StreamRef) {
        a.while_(countdown.more, [&](tp::StreamRef s) {
          through_temporary(x, x, 1)(s);  // x += 1 per iteration
          countdown.step(s);
        });
      },
      {.stream = stream});
  b.capture(
      [&](tp::StreamRef) {
        b.if_else_(
            flag,
            [&](tp::StreamRef s) {
              through_temporary(x, y, 100)(s);
              kept.emplace(n, s);
              add_into<<<8, 256, 0, s>>>(y.data(), kept->data(), n, 0);  // kept = y, only on this branch
            },
            [&](tp::StreamRef s) { through_temporary(x, y, -100)(s); });
        tp::WhileScope loop(b, countdown2.more);  // w = y + 3 * iterations
        add_into<<<8, 256, 0, loop.stream()>>>(y.data(), w.data(), n, 0);
        through_temporary(w, w, 3)(loop.stream());
        countdown2.step(loop.stream());
      },
      {.stream = stream});
  BOOST_TEST((a.pool() == pool));
  BOOST_TEST((b.pool() == pool));
  BOOST_TEST(pool.allocated_bytes() == n * sizeof(int));  // kept, allocated inside a conditional body
  for (int k : {3, 0, 2, 5, 1}) {
    const bool then_branch = k % 2 == 1;
    iota(x, k, stream);
    fill_all(w, -7, stream);
    countdown.arm(k, stream);
    countdown2.arm(1, stream);
    set_flag<<<1, 1, 0, stream>>>(flag.data(), then_branch);
    a.replay(stream);  // capture order
    b.replay(stream);
    auto x_want = [&](std::size_t i) { return iota_at(k, i) + k; };
    auto y_want = [&](std::size_t i) { return x_want(i) + (then_branch ? 100 : -100); };
    BOOST_TEST(mismatch(host(x, stream), x_want) == "", "k " << k);
    BOOST_TEST(mismatch(host(y, stream), y_want) == "", "k " << k);
    BOOST_TEST(mismatch(host(w, stream), [&](std::size_t i) { return y_want(i) + 3; }) == "", "k " << k);
    // kept is checked only after a round that wrote it: it was allocated after a's temporary was
    // freed, so it may share a's block (documented: a later graph may reuse memory an earlier one
    // freed), and a's next replay may overwrite it.
    if (then_branch) BOOST_TEST(mismatch(host(*kept, stream), y_want) == "", "k " << k);
  }
  kept.reset();
  BOOST_TEST(pool.allocated_bytes() == 0u);
  BOOST_TEST((a.pool_id() == b.pool_id()));
}

// ============================================================================================
// conditionals x buckets
// ============================================================================================

// A Graph's body cannot reach a bucket's graph, so conditional nodes reach a GraphBuckets through
// a piecewise body: an eager step replays a graph with while_ and if_ nodes (which CUDA refuses as
// a child graph) between two captured pieces, at every run. The conditional graph's pool is the
// ladder's. The overflow (eager) path runs the same steps.
TP_GPU_TEST(conditionals_and_buckets) {
  constexpr std::size_t top = 1024;
  tp::Stream stream;
  tp::DeviceTensor<int> in(top, stream);
  tp::DeviceTensor<int> mid(top, stream);
  tp::DeviceTensor<int> out(top, stream);
  Countdown countdown(stream);
  tp::DeviceTensor<bool> yes(1, stream);
  tp::Graph loop;  // mid += 1 per iteration; then mid += 100 when yes
  loop.capture(
      [&](tp::StreamRef) {
        loop.while_(countdown.more, [&](tp::StreamRef b) {
          tp_test::add_kernel<<<8, 256, 0, b>>>(mid.data(), top, 1);
          countdown.step(b);
        });
        loop.if_(yes, [&](tp::StreamRef b) { tp_test::add_kernel<<<8, 256, 0, b>>>(mid.data(), top, 100); });
      },
      {.stream = stream});
  const tp::Pool pool = loop.pool();
  auto body = [&](tp::PiecewiseGraph& pieces, std::size_t size) {
    pieces.capture([&, size](tp::StreamRef s) { through_temporary(in, mid, 0, size)(s); });  // mid = in
    pieces.eager([&](tp::StreamRef s) { loop.replay(s); });
    pieces.capture([&, size](tp::StreamRef s) { through_temporary(mid, out, static_cast<int>(size), size)(s); });
  };
  tp::GraphBuckets buckets(Ladder{64, 128, 256, 512}, body, tp::BucketOptions{.pool = pool});
  BOOST_TEST((buckets.pool() == pool));
  int round = 0;
  for (std::size_t batch : {100, 512, 30, 700, 128, 100, 1000}) {
    const int k = round % 4;
    const bool take = round % 3 != 1;
    const int base = 10 * round++;
    iota(in, base, stream);
    fill_all(out, -1, stream);
    countdown.arm(k, stream);
    set_flag<<<1, 1, 0, stream>>>(yes.data(), take);
    const std::size_t ran = buckets.run(batch, stream);
    BOOST_TEST(ran == (batch > 512 ? batch : buckets.bucket_for(batch)));
    const int added = k + (take ? 100 : 0);
    BOOST_TEST(mismatch(host(out, stream),
                        [&](std::size_t i) { return i < ran ? iota_at(base, i) + added + static_cast<int>(ran) : -1; }) == "",
               "batch " << batch);
    const std::vector<int> m = host(mid, stream);
    BOOST_TEST(mismatch(std::vector<int>(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(ran)),
                        [&](std::size_t i) { return iota_at(base, i) + added; }) == "",
               "batch " << batch);
  }
  BOOST_TEST(pool.allocated_bytes() == 0u);
  BOOST_TEST((buckets.pool() == loop.pool()));
}

// ============================================================================================
// conditionals x threads
// ============================================================================================

// Six threads, 20 rounds each, each with its own graph of while_, switch_ and if_else_ nodes
// (captured again every fifth round, concurrently with the others' replays), in thread-local
// capture mode.
TP_GPU_TEST(conditionals_on_six_threads) {
  const auto errors = on_threads(6, [](int t, Clock::time_point deadline) -> std::string {
    tp::Stream stream;
    tp::DeviceTensor<int> x(n, stream);
    tp::DeviceTensor<int> y(n, stream);
    tp::DeviceTensor<int> z(n, stream);
    Countdown countdown(stream);
    tp::DeviceTensor<int> index(1, stream);
    tp::DeviceTensor<bool> flag(1, stream);
    tp::Graph graph(tp::GraphOptions{.capture_error_mode = thread_local_mode});
    auto capture = [&] {
      graph.reset();
      graph.capture(
          [&](tp::StreamRef) {
            graph.while_(countdown.more, [&](tp::StreamRef s) {
              add_into<<<8, 256, 0, s>>>(x.data(), x.data(), n, 1);
              countdown.step(s);
            });
            graph.switch_(
                index, [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, 0); },
                [&](tp::StreamRef s) { through_temporary(x, y, 10)(s); },
                [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(x.data(), y.data(), n, 20); });
            graph.if_else_(
                flag, [&](tp::StreamRef s) { add_into<<<8, 256, 0, s>>>(y.data(), z.data(), n, 1); },
                [&](tp::StreamRef s) { through_temporary(y, z, -1)(s); });
          },
          {.stream = stream});
    };
    for (int round = 0; round < 20; ++round) {
      if (Clock::now() > deadline) return "time budget spent at round " + std::to_string(round);
      if (round % 5 == 0) capture();
      const int k = (t + round) % 5;
      const int which = round % 4;  // 3: no body runs, y keeps -5
      const bool then_branch = round % 2 == 0;
      iota(x, 1000 * t + round, stream);
      fill_all(y, -5, stream);
      countdown.arm(k, stream);
      set_int<<<1, 1, 0, stream>>>(index.data(), which);
      set_flag<<<1, 1, 0, stream>>>(flag.data(), then_branch);
      graph.replay(stream);
      auto x_want = [&](std::size_t i) { return iota_at(1000 * t + round, i) + k; };
      auto y_want = [&](std::size_t i) { return which == 3 ? -5 : x_want(i) + 10 * which; };
      std::string bad = mismatch(host_in_thread(x, stream), x_want);
      if (!bad.empty()) return at("x", round, bad);
      bad = mismatch(host_in_thread(y, stream), y_want);
      if (!bad.empty()) return at("y", round, bad);
      bad = mismatch(host_in_thread(z, stream), [&](std::size_t i) { return y_want(i) + (then_branch ? 1 : -1); });
      if (!bad.empty()) return at("z", round, bad);
    }
    return "";
  });
  check_threads(errors);
}

// ============================================================================================
// shared pools x stage_and_launch
// ============================================================================================

// Two graphs of one pool, each staged (with plain replays between), their bodies allocating
// temporaries and one keeping a tensor: inputs reach the static buffers and every output is
// right; the kept tensor is the pool's only allocation.
TP_GPU_TEST(shared_pools_and_staging) {
  tp::Stream stream;
  tp::DeviceTensor<int> in_a(n, stream);
  tp::DeviceTensor<int> in_b(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> z(n, stream);
  tp::DeviceTensor<int> fresh_a(n, stream);
  tp::DeviceTensor<int> fresh_b(n, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  tp::Graph a(tp::GraphOptions{.pool = pool});
  tp::Graph b(tp::GraphOptions{.pool = pool});
  std::optional<tp::DeviceTensor<int>> kept;
  a.capture(through_temporary(in_a, y, 1), {.stream = stream});  // y = in_a + 1
  b.capture(
      [&](tp::StreamRef s) {
        tp::DeviceTensor<int> t(n, s);
        sum_into<<<8, 256, 0, s>>>(in_b.data(), y.data(), t.data(), n);
        add_into<<<8, 256, 0, s>>>(t.data(), z.data(), n, 0);  // z = in_b + y
        kept.emplace(n, s);
        add_into<<<8, 256, 0, s>>>(z.data(), kept->data(), n, 0);
      },
      {.stream = stream});
  BOOST_TEST((a.pool() == pool));
  BOOST_TEST((b.pool() == pool));
  BOOST_TEST(pool.allocated_bytes() == n * sizeof(int));
  for (int round = 1; round <= 5; ++round) {
    iota(fresh_a, round, stream);
    iota(fresh_b, 100 * round, stream);
    a.stage_and_launch(std::tie(in_a), std::tie(fresh_a), stream);  // capture order
    b.stage_and_launch(std::tie(in_b), std::tie(fresh_b), stream);
    auto y_want = [&](std::size_t i) { return iota_at(round, i) + 1; };
    auto z_want = [&](std::size_t i) { return iota_at(100 * round, i) + y_want(i); };
    BOOST_TEST(mismatch(host(in_a, stream), [&](std::size_t i) { return iota_at(round, i); }) == "", "round " << round);
    BOOST_TEST(mismatch(host(in_b, stream), [&](std::size_t i) { return iota_at(100 * round, i); }) == "", "round " << round);
    BOOST_TEST(mismatch(host(y, stream), y_want) == "", "round " << round);
    BOOST_TEST(mismatch(host(z, stream), z_want) == "", "round " << round);
    BOOST_TEST(mismatch(host(*kept, stream), z_want) == "", "round " << round);
    if (round % 2 == 0) {  // plain replays: the staged inputs stay
      fill_all(fresh_a, -1, stream);
      a.replay(stream);
      b.replay(stream);
      BOOST_TEST(mismatch(host(z, stream), z_want) == "", "plain replay, round " << round);
    }
  }
  BOOST_TEST(pool.allocated_bytes() == n * sizeof(int));
  kept.reset();
  BOOST_TEST(pool.allocated_bytes() == 0u);
  iota(fresh_a, -3, stream);
  a.stage_and_launch(std::tie(in_a), std::tie(fresh_a), stream);
  b.replay(stream);
  BOOST_TEST(mismatch(host(z, stream), [&](std::size_t i) { return iota_at(500, i) + iota_at(-3, i) + 1; }) == "");
}

// ============================================================================================
// shared pools x threads
// ============================================================================================

// Six threads, each with a pool of its own shared by two graphs captured anew every round (in
// thread-local mode, while the other threads replay and copy), one keeping a tensor; 20 rounds.
TP_GPU_TEST(shared_pools_on_six_threads) {
  const auto errors = on_threads(6, [](int t, Clock::time_point deadline) -> std::string {
    tp::Stream stream;
    tp::DeviceTensor<int> x(n, stream);
    tp::DeviceTensor<int> y(n, stream);
    tp::DeviceTensor<int> z(n, stream);
    const tp::Pool pool = tp::graph_pool_handle();
    for (int round = 0; round < 20; ++round) {
      if (Clock::now() > deadline) return "time budget spent at round " + std::to_string(round);
      std::optional<tp::DeviceTensor<int>> kept;
      tp::Graph a(tp::GraphOptions{.pool = pool, .capture_error_mode = thread_local_mode});
      tp::Graph b(tp::GraphOptions{.capture_error_mode = thread_local_mode});
      a.capture(through_temporary(x, y, round), {.stream = stream});
      b.capture(  // the pool through CaptureOptions this time
          [&](tp::StreamRef s) {
            through_temporary(y, z, t)(s);
            kept.emplace(n, s);
            add_into<<<8, 256, 0, s>>>(z.data(), kept->data(), n, 1);
          },
          {.pool = pool, .stream = stream});
      if (!(a.pool() == pool) || !(b.pool() == pool)) return "round " + std::to_string(round) + ": a graph left the shared pool";
      if (pool.allocated_bytes() != n * sizeof(int))
        return "round " + std::to_string(round) + ": allocated_bytes " + std::to_string(pool.allocated_bytes());
      for (int repeat = 0; repeat < 2; ++repeat) {
        const int base = 10 * t + round + repeat;
        iota(x, base, stream);
        a.replay(stream);
        b.replay(stream);
        auto z_want = [&](std::size_t i) { return iota_at(base, i) + round + t; };
        std::string bad = mismatch(host_in_thread(y, stream), [&](std::size_t i) { return iota_at(base, i) + round; });
        if (!bad.empty()) return at("y", round, bad);
        bad = mismatch(host_in_thread(z, stream), z_want);
        if (!bad.empty()) return at("z", round, bad);
        bad = mismatch(host_in_thread(*kept, stream), [&](std::size_t i) { return z_want(i) + 1; });
        if (!bad.empty()) return at("kept", round, bad);
      }
      kept.reset();
      if (pool.allocated_bytes() != 0) return "round " + std::to_string(round) + ": the kept tensor's block was not given back";
    }
    return "";
  });
  check_threads(errors);
}

// ============================================================================================
// shared pools x buckets
// ============================================================================================

// One pool for a Graph and two ladders (one staged, one sharing executables), all runs ordered
// on one stream. Everything reports the one pool; temporaries leave nothing allocated; and
// since the graph captured first holds the largest temporary, the ladders' captures reserve
// nothing more (the reuse buckets.hpp describes for one ladder, across users of a pool).
TP_GPU_TEST(shared_pools_and_buckets) {
  constexpr std::size_t top = 512;
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> in(top, stream);
  tp::DeviceTensor<int> out_a(top, stream);
  tp::DeviceTensor<int> static_b(2 * top, stream);  // two elements per sample
  tp::DeviceTensor<int> out_b(2 * top, stream);
  const tp::Pool pool = tp::graph_pool_handle();
  tp::Graph graph(tp::GraphOptions{.pool = pool});
  graph.capture(through_temporary(x, y, 7), {.stream = stream});  // 16 KiB temporary
  const std::size_t reserved = pool.reserved_bytes();
  BOOST_TEST(reserved >= n * sizeof(int));
  auto body_a = [&](tp::StreamRef s, std::size_t size) { through_temporary(in, out_a, static_cast<int>(size), size)(s); };
  auto body_b = [&](tp::StreamRef s, std::size_t size) { through_temporary(static_b, out_b, 1, 2 * size)(s); };
  tp::GraphBuckets ladder_a(Ladder{64, 128, 512}, body_a, tp::BucketOptions{.pool = pool, .share_executables = true});
  tp::GraphBuckets ladder_b(Ladder{32, 256, 512}, body_b, tp::BucketOptions{.pool = pool, .zero_fill_tail = true});
  ladder_a.capture_all(stream);
  ladder_b.capture_all(stream);
  BOOST_TEST((ladder_a.pool() == pool));
  BOOST_TEST((ladder_b.pool() == pool));
  BOOST_TEST((graph.pool() == pool));
  BOOST_TEST(pool.allocated_bytes() == 0u);
  BOOST_TEST(pool.reserved_bytes() == reserved);
  int round = 0;
  for (std::size_t batch : {100, 30, 512, 200, 64, 1, 300}) {
    const int base = 11 * round++;
    iota(x, base, stream);
    iota(in, base + 1, stream);
    fill_all(out_a, -1, stream);
    fill_all(out_b, -1, stream);
    tp::DeviceTensor<int> tokens(2 * batch, stream);
    iota(tokens, base + 2, stream);
    graph.replay(stream);
    const std::size_t ran_a = ladder_a.run(batch, stream);
    const std::size_t ran_b = ladder_b.run(batch, std::tie(static_b), std::tie(tokens), stream);
    BOOST_TEST(ran_a == ladder_a.bucket_for(batch));
    BOOST_TEST(ran_b == ladder_b.bucket_for(batch));
    BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return iota_at(base, i) + 7; }) == "", "batch " << batch);
    BOOST_TEST(mismatch(host(out_a, stream),
                        [&](std::size_t i) { return i < ran_a ? iota_at(base + 1, i) + static_cast<int>(ran_a) : -1; }) == "",
               "batch " << batch);
    // out_b: the staged tokens, then zeros up to the bucket (zero_fill_tail), then untouched.
    BOOST_TEST(mismatch(host(out_b, stream),
                        [&](std::size_t i) {
                          if (i < 2 * batch) return iota_at(base + 2, i) + 1;
                          return i < 2 * ran_b ? 1 : -1;
                        }) == "",
               "batch " << batch);
  }
  BOOST_TEST(pool.allocated_bytes() == 0u);
  BOOST_TEST((tp::Pool(graph.pool_id()) == pool));
}

// ============================================================================================
// buckets x update
// ============================================================================================

// GraphBuckets has no update(): a Graph of the ladder's pool is updated (in place, with a body
// that allocates) between bucket runs on the same stream; both keep giving the eager results.
TP_GPU_TEST(a_graph_of_the_buckets_pool_updated_between_runs) {
  constexpr std::size_t top = 256;
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  tp::DeviceTensor<int> y(n, stream);
  tp::DeviceTensor<int> in(top, stream);
  tp::DeviceTensor<int> out(top, stream);
  tp::Graph graph;
  graph.capture(through_temporary(x, y, 0), {.stream = stream});
  const tp::Pool pool = graph.pool();
  auto body = [&](tp::StreamRef s, std::size_t size) { through_temporary(in, out, 2 * static_cast<int>(size), size)(s); };
  tp::GraphBuckets buckets(Ladder{8, 64, 256}, body, tp::BucketOptions{.pool = pool});
  BOOST_TEST((buckets.pool() == pool));
  int round = 0;
  for (std::size_t batch : {8, 100, 3, 256, 64, 9}) {
    ++round;
    const tp::UpdateResult r = graph.update(through_temporary(x, y, round), {.stream = stream});
    BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated), "round " << round);
    BOOST_TEST((graph.pool() == pool));
    iota(x, round, stream);
    iota(in, -round, stream);
    fill_all(out, -1, stream);
    const std::size_t ran = buckets.run(batch, stream);  // may capture the bucket now, after the update
    graph.replay(stream);
    BOOST_TEST(mismatch(host(y, stream), [&](std::size_t i) { return iota_at(round, i) + round; }) == "", "round " << round);
    BOOST_TEST(mismatch(host(out, stream),
                        [&](std::size_t i) { return i < ran ? iota_at(-round, i) + 2 * static_cast<int>(ran) : -1; }) == "",
               "round " << round);
    BOOST_TEST(pool.allocated_bytes() == 0u);
  }
}

// A graph whose capture nests a bucket run, updated to nest another bucket each time: the
// executable runs the bucket of its latest version (CUDA decides in place or anew).
TP_GPU_TEST(an_update_that_switches_the_nested_bucket) {
  constexpr std::size_t top = 512;
  tp::Stream stream;
  tp::DeviceTensor<int> in(top, stream);
  tp::DeviceTensor<int> out(top, stream);
  auto body = [&](tp::StreamRef s, std::size_t size) { through_temporary(in, out, static_cast<int>(size), size)(s); };
  tp::GraphBuckets buckets(Ladder{64, 128, 256, 512}, body);
  buckets.capture_all(stream);  // a bucket cannot be captured while its run's stream captures
  tp::Graph outer;
  outer.capture([&](tp::StreamRef s) { buckets.run(64, s); }, {.stream = stream});
  int round = 0;
  for (std::size_t bucket : {64, 256, 128, 512, 512, 64}) {
    if (round > 0) outer.update([&, bucket](tp::StreamRef s) { buckets.run(bucket, s); }, {.stream = stream});
    const int base = 5 * ++round;
    iota(in, base, stream);
    fill_all(out, -1, stream);
    outer.replay(stream);
    BOOST_TEST(mismatch(host(out, stream),
                        [&](std::size_t i) { return i < bucket ? iota_at(base, i) + static_cast<int>(bucket) : -1; }) == "",
               "bucket " << bucket);
    fill_all(out, -1, stream);  // the buckets themselves still run
    BOOST_TEST(buckets.run(100, stream) == 128u);
    BOOST_TEST(mismatch(host(out, stream), [&](std::size_t i) { return i < 128 ? iota_at(base, i) + 128 : -1; }) == "");
  }
}

// ============================================================================================
// buckets x threads
// ============================================================================================

// Six threads, each with a GraphBuckets of its own (odd threads share executables), 20 runs of
// changing batch sizes each, all at once. The captures themselves are made one thread at a
// time while the other threads wait without calling CUDA: GraphBuckets captures in CUDA's
// global mode (BucketOptions has no capture_error_mode), which the other threads' copies and
// synchronisations would invalidate (see the report: a gap of the API, not a choice of the test).
TP_GPU_TEST(buckets_on_six_threads) {
  constexpr int threads = 6;
  constexpr std::size_t top = 512;
  std::barrier sync_point(threads);
  std::mutex mutex;
  std::condition_variable turn_cv;
  int turn = 0;
  const auto errors = on_threads(threads, [&](int t, Clock::time_point deadline) -> std::string {
    std::string error;
    std::optional<tp::Stream> stream;
    std::optional<tp::DeviceTensor<int>> in;
    std::optional<tp::DeviceTensor<int>> out;
    auto body = [&](tp::StreamRef s, std::size_t size) { through_temporary(*in, *out, t + static_cast<int>(size), size)(s); };
    std::optional<tp::GraphBuckets<decltype(body)>> buckets;
    try {
      stream.emplace();
      in.emplace(top, *stream);
      out.emplace(top, *stream);
      buckets.emplace(Ladder{16, 64, 128, 512}, body, tp::BucketOptions{.share_executables = t % 2 == 1});
      if (cudaStreamSynchronize(*stream) != cudaSuccess) error = "setup failed";
    } catch (const std::exception& e) {
      error = std::string("setup: ") + e.what();
    }
    sync_point.arrive_and_wait();  // nobody calls CUDA during the captures but the capturing thread
    {
      std::unique_lock lock(mutex);
      if (!turn_cv.wait_until(lock, deadline, [&] { return turn == t; })) error = "time budget spent waiting to capture";
      if (error.empty()) {
        try {
          buckets->capture_all(*stream);
          if (cudaStreamSynchronize(*stream) != cudaSuccess) error = "capture_all failed";
        } catch (const std::exception& e) {
          error = std::string("capture_all: ") + e.what();
        }
      }
      ++turn;
      turn_cv.notify_all();
    }
    sync_point.arrive_and_wait();
    if (!error.empty()) return error;
    const std::size_t batches[] = {100, 16, 512, 3, 128, 64, 65, 200, 1, 17};
    for (int round = 0; round < 20; ++round) {
      if (Clock::now() > deadline) return "time budget spent at round " + std::to_string(round);
      const std::size_t batch = batches[static_cast<std::size_t>(round + t) % 10];
      const int base = 1000 * t + round;
      iota(*in, base, *stream);
      fill_all(*out, -1, *stream);
      const std::size_t ran = buckets->run(batch, *stream);
      if (ran != buckets->bucket_for(batch)) return "round " + std::to_string(round) + ": ran bucket " + std::to_string(ran);
      const std::string bad = mismatch(host_in_thread(*out, *stream), [&](std::size_t i) {
        return i < ran ? iota_at(base, i) + t + static_cast<int>(ran) : -1;
      });
      if (!bad.empty()) return at("out", round, bad + " (batch " + std::to_string(batch) + ")");
    }
    if (!buckets->is_captured(16) || !buckets->is_captured(512)) return "a bucket was dropped";
    return "";
  });
  check_threads(errors);
}

BOOST_AUTO_TEST_SUITE_END()
