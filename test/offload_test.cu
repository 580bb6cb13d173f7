// Tests for sleep and wake (Pool::offload, Pool::restore, PoolOptions{offloadable}): the pool's
// device memory goes and comes back at the same addresses, with the same bytes, and its graphs
// replay without capturing again.
//
// Most cases share one model: a graph that reads x (a user buffer in the default pool) through
// temporaries (freed inside the capture: not copied, but baked into the graph) into kept outputs
// of three segment sizes, a memcpy node and a memset node, and an accumulator that every replay
// bumps, so that its value proves the bytes came back rather than being computed again.
//
// Failure injection (offload_fault.hpp) is compiled into this binary.
#define TENSORPLAY_FAULT_INJECTION 1
#include "support.hpp"

#include <tensorplay/detail/offload_fault.hpp>
#include <tensorplay/detail/vmm_api.hpp>
#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tp = tensorplay;
namespace td = tensorplay::detail;
namespace ofault = tensorplay::detail::offload_fault;

// vmm_api.hpp mirrors <cuda.h> without including it: the layouts must be the driver's.
static_assert(sizeof(td::VmmHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(sizeof(td::VmmAddress) == sizeof(CUdeviceptr));
static_assert(sizeof(td::VmmLocation) == sizeof(CUmemLocation));
static_assert(sizeof(td::VmmAllocationProp) == sizeof(CUmemAllocationProp));
static_assert(offsetof(td::VmmAllocationProp, requested_handle_types) == offsetof(CUmemAllocationProp, requestedHandleTypes));
static_assert(offsetof(td::VmmAllocationProp, location) == offsetof(CUmemAllocationProp, location));
static_assert(offsetof(td::VmmAllocationProp, win32_handle_meta_data) == offsetof(CUmemAllocationProp, win32HandleMetaData));
static_assert(offsetof(td::VmmAllocationProp, alloc_flags) == offsetof(CUmemAllocationProp, allocFlags));
static_assert(sizeof(td::VmmAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(offsetof(td::VmmAccessDesc, flags) == offsetof(CUmemAccessDesc, flags));
static_assert(td::vmm_allocation_pinned == CU_MEM_ALLOCATION_TYPE_PINNED);
static_assert(td::vmm_location_device == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(td::vmm_access_read_write == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(td::vmm_granularity_minimum == CU_MEM_ALLOC_GRANULARITY_MINIMUM);
static_assert(static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY) == static_cast<int>(cudaErrorMemoryAllocation));
static_assert(static_cast<int>(CUDA_ERROR_INVALID_VALUE) == static_cast<int>(cudaErrorInvalidValue));

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t n = mib;             // ints of a mid-size tensor (4 MiB: a 20 MiB segment)
constexpr std::size_t big = 6 * mib;       // ints of a large tensor (24 MiB: a segment of its own)
constexpr std::size_t few = 1000;          // ints of a small tensor (a 2 MiB segment)
constexpr std::size_t slack = 2 * mib;     // what cudaMemGetInfo may differ by

__global__ void iota_kernel(int* out, std::size_t count, int base) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = base + static_cast<int>(i % 100003);
}
//! out[i] = in[i % period] + b
__global__ void spread_kernel(const int* in, int* out, std::size_t count, std::size_t period, int b) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = in[i % period] + b;
}
//! out[i] = a * in[i] + *offset
__global__ void affine_plus_kernel(const int* in, int* out, std::size_t count, int a, const int* offset) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i] + *offset;
}
//! Waits `nanoseconds`, then writes `value` at *out: a late use of pool memory on another stream.
__global__ void late_write_kernel(int* out, long long nanoseconds, int value) {
  tp_test::spin_for(nanoseconds);
  *out = value;
}

void iota(int* out, std::size_t count, int base, cudaStream_t s) {
  iota_kernel<<<tp_test::blocks_for(count), 256, 0, s>>>(out, count, base);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}
void spread(const int* in, int* out, std::size_t count, std::size_t period, int b, cudaStream_t s) {
  spread_kernel<<<tp_test::blocks_for(count), 256, 0, s>>>(in, out, count, period, b);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

int x_at(std::size_t i) { return 7 + static_cast<int>(i % 100003); }

std::size_t used_device_bytes() {
  tp::Pool::release_unused_default_memory();
  return tp_test::device_bytes_in_use();
}

bool under_sanitizer() { return std::getenv("TENSORPLAY_UNDER_SANITIZER") != nullptr; }

//! Whether the pool is destroyed within 10 s. Executables keep their pool through CUDA user
//! objects, which CUDA releases on a thread of its own once nothing can launch them, and the
//! library's reaper thread then destroys it: not necessarily before the last handle's scope ends.
bool gone(const std::weak_ptr<td::PoolImpl>& pool) {
  for (int i = 0; i < 10000 && !pool.expired(); ++i) {
    (void)cudaDeviceSynchronize();
    td::Reaper::instance().drain();
    if (!pool.expired()) usleep(1000);
  }
  return pool.expired();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

//! Runs `f`; returns the usage_error's text, or "(no usage_error)".
template <class F>
std::string usage_text(F&& f) {
  try {
    f();
  } catch (const tp::usage_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(another exception: ") + e.what() + ")";
  }
  return "(no usage_error)";
}

//! The shared model (see the header comment).
struct Model {
  tp::Stream stream;
  tp::Pool pool;
  tp::DeviceTensor<int> x;
  tp::DeviceTensor<int> mid, large, small, copied, memset_out, acc;
  std::array<const void*, 6> addresses{};
  tp::Graph graph;
  int captures = 0;
  int replays = 0;

  explicit Model(tp::Pool p) : pool(std::move(p)), x(n, stream), graph({.pool = pool}) {
    iota(x.data(), n, 7, stream);
    graph.capture([&](tp::StreamRef s) {
      ++captures;
      // First: a block carved later from a temporary freed earlier in the capture would be
      // rewritten by every replay (the pool reuses it in stream order), and hold no state.
      acc = tp::DeviceTensor<int>(few, s);
      tp::DeviceTensor<int> temp(n, s);  // a temporary: freed inside the capture
      tp_test::affine(x.data(), temp.data(), n, 2, 1, s);
      mid = tp::DeviceTensor<int>(n, s);
      tp_test::affine(temp.data(), mid.data(), n, 3, 0, s);  // 6x + 3
      {
        tp::DeviceTensor<int> temp_big(big, s);
        spread(mid.data(), temp_big.data(), big, n, 5, s);  // mid[i % n] + 5
        large = tp::DeviceTensor<int>(big, s);
        tp_test::affine(temp_big.data(), large.data(), big, 1, 0, s);
      }
      small = tp::DeviceTensor<int>(few, s);
      tp_test::affine(x.data(), small.data(), few, -1, 0, s);
      copied = tp::DeviceTensor<int>(few, s);  // a memcpy node into the pool
      BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(copied.data(), small.data(), few * sizeof(int), cudaMemcpyDeviceToDevice, s), cudaSuccess);
      memset_out = tp::DeviceTensor<int>(few, s);  // a memset node into the pool
      BOOST_REQUIRE_EQUAL(cudaMemsetAsync(memset_out.data(), 1, few * sizeof(int), s), cudaSuccess);
      tp_test::add(acc.data(), few, 1, s);  // +1 per replay: its value is state, not output
    }, {.stream = stream});
    BOOST_REQUIRE_EQUAL(cudaMemsetAsync(acc.data(), 0, few * sizeof(int), stream), cudaSuccess);
    addresses = {mid.data(), large.data(), small.data(), copied.data(), memset_out.data(), acc.data()};
  }

  void replay() {
    graph.replay(stream);
    ++replays;
  }

  //! Every output exact, at the addresses the capture gave it, the graph captured once.
  void check(const std::string& when) {
    BOOST_TEST_CONTEXT(when) {
      BOOST_TEST(captures == 1);
      const std::array<const void*, 6> now{mid.data(), large.data(), small.data(), copied.data(), memset_out.data(), acc.data()};
      BOOST_TEST((now == addresses), "a tensor moved");
      const auto m = tp_test::host_copy(mid.data(), n, stream);
      const auto l = tp_test::host_copy(large.data(), big, stream);
      const auto s = tp_test::host_copy(small.data(), few, stream);
      const auto c = tp_test::host_copy(copied.data(), few, stream);
      const auto z = tp_test::host_copy(memset_out.data(), few, stream);
      const auto a = tp_test::host_copy(acc.data(), few, stream);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += m[i] != 6 * x_at(i) + 3;
      for (std::size_t i = 0; i < big; ++i) wrong += l[i] != 6 * x_at(i % n) + 8;
      for (std::size_t i = 0; i < few; ++i) {
        wrong += s[i] != -x_at(i);
        wrong += c[i] != -x_at(i);
        wrong += z[i] != 0x01010101;
        wrong += a[i] != replays;
      }
      BOOST_TEST(wrong == 0u, wrong << " wrong values after " << replays << " replays");
    }
  }

  [[nodiscard]] int acc0() { return tp_test::host_copy(acc.data(), 1, stream)[0]; }
};

tp::Pool offloadable() { return tp::graph_pool_handle({.offloadable = true}); }

//! What `call` did with its k-th CUDA call failing: the cuda_error it threw (empty when none)
//! and whether the armed failure fired at all (it does not once k is past the last call).
struct Injected {
  std::string what;
  bool fired = false;
};

template <class F>
Injected fail_call(long k, F&& call) {
  ofault::reset_counts();
  ofault::arm(k);
  std::string what;
  try {
    call();
  } catch (const tp::cuda_error& e) {
    what = e.what();
  } catch (const std::exception& e) {
    BOOST_ERROR("call " << k << ": not a cuda_error: " << e.what());
  }
  const bool fired = ofault::fired();
  ofault::disarm();
  return {what, fired};
}

//! Runs `call` with its k-th CUDA call failing, for k = 1, 2, ... (`prepare()` before each run,
//! with nothing armed), and `failed(what)` after each run the failure fired in, in a context that
//! names `label`, k and the error. It stops at the first run where the failure fired nowhere,
//! which must throw nothing, and returns that run's k - 1: the number of calls `call` makes.
template <class Prepare, class Call, class Failed>
long sweep_failing_calls(const char* label, Prepare&& prepare, Call&& call, Failed&& failed) {
  for (long k = 1;; ++k) {
    prepare();
    const Injected run = fail_call(k, call);
    if (!run.fired) {
      BOOST_TEST(run.what.empty());
      return k - 1;
    }
    BOOST_TEST_CONTEXT(label << ", failing call " << k << ": " << run.what) { failed(run.what); }
    BOOST_REQUIRE(k < 1000);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(offload)

BOOST_AUTO_TEST_CASE(injection_seam_is_off_unless_armed) {
  ofault::disarm();
  ofault::reset_counts();
  BOOST_TEST(!ofault::take());
  ofault::arm(2);
  BOOST_TEST(!ofault::take());
  BOOST_TEST(ofault::take());
  BOOST_TEST(ofault::fired());
  BOOST_TEST(!ofault::take());  // once only
  BOOST_TEST(ofault::calls() == 4);
  ofault::disarm();
}

TP_GPU_TEST(offload_releases_the_live_bytes_and_restore_brings_them_back_at_the_same_addresses) {
  Model m(offloadable());
  m.replay();
  m.check("before offload");
  const std::size_t live = m.pool.allocated_bytes();
  const std::size_t reserved = m.pool.reserved_bytes();
  BOOST_TEST(live >= (big + n) * sizeof(int));
  const std::size_t before = used_device_bytes();
  m.pool.offload(m.stream);
  BOOST_TEST(m.pool.offloaded());
  BOOST_TEST(m.pool.reserved_bytes() == 0u);
  BOOST_TEST(m.pool.allocated_bytes() == live);  // the blocks are still allocated: on the host
  const std::size_t asleep = used_device_bytes();
  std::printf("offload: live %zu MiB, reserved %zu MiB, device in use %zu -> %zu MiB\n", live / mib, reserved / mib,
              before / mib, asleep / mib);
  if (!under_sanitizer()) BOOST_TEST(before >= asleep + live - slack, "cudaMemGetInfo rose by less than the live bytes");
  m.pool.restore(m.stream);
  BOOST_TEST(!m.pool.offloaded());
  BOOST_TEST(m.pool.reserved_bytes() == reserved);
  if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= before + slack);
  m.check("after restore, before replay");  // the bytes themselves came back
  m.replay();
  m.check("after restore and replay");
}

TP_GPU_TEST(a_hundred_cycles_with_replays_between_stay_exact_and_flat) {
  Model m(offloadable());
  m.replay();
  const long cycles = tp_test::env_or("TENSORPLAY_OFFLOAD_CYCLES", 100);
  std::size_t device_first = 0;
  std::size_t host_first = 0;
  for (long c = 0; c < cycles; ++c) {
    m.pool.offload(m.stream);
    m.pool.restore(m.stream);
    m.replay();
    if (c == 0) {
      device_first = used_device_bytes();
      host_first = tp_test::resident_bytes();
    }
    BOOST_TEST_REQUIRE(m.acc0() == m.replays, "cycle " << c);
  }
  m.check("after the cycles");
  if (!under_sanitizer()) {
    BOOST_TEST(used_device_bytes() <= device_first + slack, "device memory grew over the cycles");
    BOOST_TEST(tp_test::resident_bytes() <= host_first + 16 * mib, "host memory grew over the cycles");
  }
}

TP_GPU_TEST(a_32_bucket_ladder_offloaded_and_restored_runs_every_bucket_exactly) {
  tp::Stream stream;
  tp::Pool pool = offloadable();
  constexpr std::size_t width = 64;
  std::vector<std::size_t> ladder;
  for (std::size_t k = 1; k <= 32; ++k) ladder.push_back(k * 8);
  const std::size_t rows = ladder.back() * width;
  tp::DeviceTensor<int> x(rows, stream);
  tp::DeviceTensor<int> y(rows, stream);
  iota(x.data(), rows, 7, stream);
  // One run counter per bucket, kept in the pool: allocated by a graph of the pool before the
  // ladder, so that no bucket's temporaries share its memory (a block a bucket keeps would be
  // valid only until the next run: see buckets.hpp).
  tp::DeviceTensor<int> runs;
  tp::Graph setup({.pool = pool});
  setup.capture([&](tp::StreamRef s) {
    runs = tp::DeviceTensor<int>(ladder.size(), s);
    BOOST_REQUIRE_EQUAL(cudaMemsetAsync(runs.data(), 0, runs.bytes(), s), cudaSuccess);  // never replayed
  }, {.stream = stream});
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(runs.data(), 0, runs.bytes(), stream), cudaSuccess);
  int captures = 0;
  tp::GraphBuckets buckets(ladder, [&](tp::StreamRef s, std::size_t size) {
    ++captures;
    int* acc = runs.data() + (size / 8 - 1);
    tp_test::add(acc, 1, 1, s);
    tp::DeviceTensor<int> temp(size * width, s);
    affine_plus_kernel<<<tp_test::blocks_for(size * width), 256, 0, s>>>(x.data(), temp.data(), size * width, 2, acc);
    tp_test::affine(temp.data(), y.data(), size * width, 1, static_cast<int>(size), s);  // 2x + runs + size
  }, {.pool = pool});
  buckets.capture_all(stream);
  BOOST_REQUIRE(captures == 32);
  auto run_all = [&](int expected_runs, const char* when) {
    std::size_t wrong = 0;
    for (std::size_t size : ladder) {
      BOOST_TEST(buckets.run(size, stream) == size);
      const auto got = tp_test::host_copy(y.data(), size * width, stream);
      for (std::size_t i = 0; i < size * width; ++i) wrong += got[i] != 2 * x_at(i) + expected_runs + static_cast<int>(size);
    }
    BOOST_TEST(wrong == 0u, wrong << " wrong values " << when);
  };
  run_all(1, "before offload");
  const std::size_t before = used_device_bytes();
  const std::size_t reserved = pool.reserved_bytes();
  pool.offload(stream);
  if (!under_sanitizer()) BOOST_TEST(before >= used_device_bytes() + pool.allocated_bytes() - slack);
  BOOST_TEST(pool.reserved_bytes() == 0u);
  pool.restore(stream);
  BOOST_TEST(pool.reserved_bytes() == reserved);
  run_all(2, "after restore");
  BOOST_TEST(captures == 32, "a bucket was captured again");
  BOOST_TEST(buckets.executables() == 32u);
}

TP_GPU_TEST(a_piecewise_graph_in_an_offloadable_pool_replays_exactly_after_restore) {
  tp::Stream stream;
  tp::Pool pool = offloadable();
  tp::DeviceTensor<int> x(n, stream);
  iota(x.data(), n, 7, stream);
  tp::DeviceTensor<int> a, b;
  tp::PiecewiseGraph pieces({.pool = pool});
  pieces.capture([&](tp::StreamRef s) {
    a = tp::DeviceTensor<int>(n, s);
    tp_test::affine(x.data(), a.data(), n, 2, 1, s);
  });
  pieces.eager([&](tp::StreamRef s) { tp_test::add(a.data(), n, 10, s); });
  pieces.capture([&](tp::StreamRef s) {
    b = tp::DeviceTensor<int>(n, s);
    tp_test::affine(a.data(), b.data(), n, 3, 0, s);
  });
  pieces.replay(stream);
  pool.offload(stream);
  pool.restore(stream);
  pieces.replay(stream);
  const auto got = tp_test::host_copy(b.data(), n, stream);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += got[i] != 3 * (2 * x_at(i) + 11);
  BOOST_TEST(wrong == 0u);
}

BOOST_AUTO_TEST_CASE(offload_waits_for_a_late_use_declared_on_another_stream,
                     *boost::unit_test::precondition(tp_test::AsyncLaunches{})) {
  Model m(offloadable());
  m.replay();
  tp::Stream other;
  late_write_kernel<<<1, 1, 0, other>>>(m.mid.data(), 50'000'000, 12345);  // 50 ms, then a write
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
  m.mid.record_stream(other);
  m.pool.offload(m.stream);  // must copy after the write, and release only after it
  m.pool.restore(m.stream);
  BOOST_TEST(tp_test::host_copy(m.mid.data(), 1, m.stream)[0] == 12345);
  m.replay();
  m.check("after the late use, restore and replay");
}

TP_GPU_TEST(misuse_while_offloaded_is_a_usage_error_and_the_pool_restores_fine_afterwards) {
  Model m(offloadable());
  m.replay();
  // A graph of the same pool whose kernels touch memory outside it: replaying it while the pool
  // sleeps is safe for the GPU, so a check that is missing fails this case, not the process.
  tp::DeviceTensor<int> outside(few, m.stream);
  tp::DeviceTensor<int> fresh(few, m.stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(fresh.data(), 0, few * sizeof(int), m.stream), cudaSuccess);
  tp::Graph safe({.pool = m.pool});
  safe.capture([&](tp::StreamRef s) { tp_test::add(outside.data(), few, 1, s); }, {.stream = m.stream});
  m.pool.offload(m.stream);

  const std::string named = "pool #" + std::to_string(m.pool.id().serial());
  std::string text = usage_text([&] { safe.replay(m.stream); });
  BOOST_TEST((contains(text, named) && contains(text, "offloaded")), "replay: " << text);
  text = usage_text([&] { safe.stage_and_launch(std::tie(outside), std::tie(fresh), m.stream); });
  BOOST_TEST((contains(text, named) && contains(text, "offloaded")), "stage_and_launch: " << text);
  tp::Graph another({.pool = m.pool});
  text = usage_text([&] { another.capture([&](tp::StreamRef s) { tp_test::add(outside.data(), few, 1, s); }, {.stream = m.stream}); });
  BOOST_TEST(!contains(text, "(no usage_error)"), "capture: " << text);
  BOOST_TEST((contains(text, named) && contains(text, "offloaded")), "capture names the pool: " << text);
  BOOST_TEST(tp_test::not_capturing(m.stream));
  text = usage_text([&] { (void)m.pool.impl()->allocate(256, m.stream, 0, tp::source_location::current()); });
  BOOST_TEST((contains(text, named) && contains(text, "offloaded")), "allocation: " << text);
  text = usage_text([&] { m.pool.offload(m.stream); });
  BOOST_TEST(contains(text, "offloaded already"), "second offload: " << text);
  BOOST_TEST(m.pool.offloaded());

  m.pool.restore(m.stream);
  text = usage_text([&] { m.pool.restore(m.stream); });
  BOOST_TEST(contains(text, "not offloaded"), "second restore: " << text);
  m.check("after the refused calls and restore");
  m.replay();
  m.check("after the refused calls, restore and replay");
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(outside.data(), 0, few * sizeof(int), m.stream), cudaSuccess);
  safe.replay(m.stream);
  BOOST_TEST(tp_test::host_copy(outside.data(), 1, m.stream)[0] == 1);
  // The refused capture left the pool usable for captures.
  another.capture([&](tp::StreamRef s) { tp_test::add(outside.data(), few, 1, s); }, {.stream = m.stream});
}

TP_GPU_TEST(offload_and_restore_refuse_what_they_cannot_do) {
  tp::Stream stream;
  BOOST_TEST(contains(usage_text([&] { tp::Pool().offload(stream); }), "empty"));
  BOOST_TEST(!tp::Pool().offloaded());
  tp::Pool plain = tp::graph_pool_handle();
  BOOST_TEST(contains(usage_text([&] { plain.offload(stream); }), "not offloadable"));
  BOOST_TEST(contains(usage_text([&] { plain.restore(stream); }), "not offloadable"));
  tp::Pool pool = offloadable();
  BOOST_TEST(contains(usage_text([&] { pool.restore(stream); }), "not offloaded"));
  // While a capture is open (any pool), the memory cannot change residence.
  tp::Stream capturing;
  tp::DeviceTensor<int> outside(few, stream);
  stream.synchronize();
  tp::Graph open;
  open.capture_begin({.stream = capturing});
  tp_test::add(outside.data(), few, 1, capturing);
  BOOST_TEST(contains(usage_text([&] { pool.offload(stream); }), "capture is open"));
  open.capture_end();
  pool.offload(stream);  // an empty pool sleeps and wakes too
  BOOST_TEST(pool.offloaded());
  pool.restore(stream);
  BOOST_TEST(!pool.offloaded());
}

TP_GPU_TEST(destroying_pool_graph_and_tensors_in_every_order_while_offloaded_is_fine) {
  {
    Model warm(offloadable());  // loads the kernels, warms the default pool and the driver
    warm.replay();
    warm.pool.offload(warm.stream);
  }
  const std::size_t before = used_device_bytes();
  const std::size_t host_before = tp_test::resident_bytes();
  std::array<int, 3> order{0, 1, 2};  // 0: the Pool handle, 1: the graph, 2: the tensors
  int orders = 0;
  do {
    auto m = std::make_unique<Model>(offloadable());
    std::weak_ptr<td::PoolImpl> weak = m->pool.impl();
    m->replay();
    m->pool.offload(m->stream);
    for (int what : order) {
      switch (what) {
        case 0: m->pool = tp::Pool(); break;
        case 1: m->graph = tp::Graph(); break;
        case 2:
          for (tp::DeviceTensor<int>* t : {&m->mid, &m->large, &m->small, &m->copied, &m->memset_out, &m->acc})
            *t = tp::DeviceTensor<int>();
          break;
      }
    }
    m.reset();
    BOOST_TEST(gone(weak), "order " << order[0] << order[1] << order[2] << ": the pool lives on");
    ++orders;
    if (!under_sanitizer())
      BOOST_TEST(used_device_bytes() <= before + slack, "order " << order[0] << order[1] << order[2] << ": device memory kept");
  } while (std::next_permutation(order.begin(), order.end()));
  BOOST_TEST(orders == 6);
  if (!under_sanitizer()) BOOST_TEST(tp_test::resident_bytes() <= host_before + 64 * mib, "host copies kept");
  // And one destroyed while restored, for contrast.
  std::weak_ptr<td::PoolImpl> weak;
  {
    Model m(offloadable());
    weak = m.pool.impl();
    m.replay();
    m.pool.offload(m.stream);
    m.pool.restore(m.stream);
  }
  BOOST_TEST(gone(weak));
  if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= before + slack);
}

TP_GPU_TEST(a_failure_at_any_call_of_offload_leaves_the_pool_whole_in_one_of_its_states) {
  Model m(offloadable());
  m.replay();
  const std::size_t before = used_device_bytes();
  int resident = 0;
  int offloaded = 0;
  const long calls = sweep_failing_calls("offload", [] {}, [&] { m.pool.offload(m.stream); }, [&](const std::string& what) {
    BOOST_TEST(!what.empty());
    if (m.pool.offloaded()) {
      ++offloaded;
      BOOST_TEST(contains(what, "is offloaded"));
      m.pool.restore(m.stream);
    } else {
      ++resident;
      BOOST_TEST(contains(what, "stays on the device"));
    }
    m.check("after the failure (and restore)");
    m.replay();
    m.check("and a replay");
    BOOST_TEST(tp_test::not_capturing(m.stream));
  });
  BOOST_TEST(m.pool.offloaded());
  m.pool.restore(m.stream);
  std::printf("offload: %ld calls, %d failures left it on the device, %d offloaded\n", calls, resident, offloaded);
  BOOST_TEST(calls >= 8);  // syncs, host allocation, copies, unmaps and releases of 4 segments
  BOOST_TEST(resident > 0);
  BOOST_TEST(offloaded > 0);
  if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= before + slack);
}

TP_GPU_TEST(a_failure_at_any_call_of_restore_leaves_the_pool_offloaded_and_whole) {
  Model m(offloadable());
  m.replay();
  const std::size_t before = used_device_bytes();
  std::size_t asleep = 0;
  auto offload = [&] {
    m.pool.offload(m.stream);
    asleep = used_device_bytes();
  };
  const long calls = sweep_failing_calls("restore", offload, [&] { m.pool.restore(m.stream); }, [&](const std::string& what) {
    BOOST_TEST(contains(what, "stays offloaded"));
    BOOST_TEST(m.pool.offloaded());
    BOOST_TEST(m.pool.reserved_bytes() == 0u);  // what the failed call backed went again
    if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= asleep + slack);
    m.pool.restore(m.stream);
    m.check("after the failure and another restore");
    m.replay();
    m.check("and a replay");
  });
  BOOST_TEST(!m.pool.offloaded());
  m.check("after a restore with no failure");
  std::printf("restore: %ld calls\n", calls);
  BOOST_TEST(calls >= 12);  // create, map and access for 4 segments, copies, a sync
  if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= before + slack);
}

TP_GPU_TEST(a_failure_while_a_capture_maps_a_segment_leaves_nothing_behind) {
  tp::Stream stream;
  tp::DeviceTensor<int> x(n, stream);
  iota(x.data(), n, 7, stream);
  const std::size_t before = used_device_bytes();
  int absorbed = 0;
  for (long k = 1;; ++k) {
    std::optional<tp::Pool> pool(offloadable());
    std::weak_ptr<td::PoolImpl> weak = pool->impl();
    std::optional<tp::Graph> graph(tp::GraphOptions{.pool = *pool});
    tp::DeviceTensor<int> kept;
    ofault::reset_counts();
    ofault::arm(k);
    bool threw = false;
    try {
      graph->capture([&](tp::StreamRef s) {
        tp::DeviceTensor<int> temp(big, s);
        spread(x.data(), temp.data(), big, n, 1, s);
        kept = tp::DeviceTensor<int>(few, s);
        tp_test::affine(temp.data(), kept.data(), few, 1, 0, s);
      }, {.stream = stream});
    } catch (const tp::cuda_error& e) {
      threw = true;
      BOOST_TEST(contains(e.what(), "offloadable pool segment"), e.what());
    }
    const bool fired = ofault::fired();
    ofault::disarm();
    BOOST_TEST((fired || !threw));
    BOOST_TEST(tp_test::not_capturing(stream));
    if (!threw) {
      // No failure, or one absorbed: an out-of-memory status is retried once, after the
      // memory waiting for the end of captures is freed (as for cudaMalloc).
      absorbed += fired;
      graph->replay(stream);
      BOOST_TEST(tp_test::host_copy(kept.data(), 1, stream)[0] == x_at(0) + 1, "call " << k);
    }
    kept = tp::DeviceTensor<int>();
    graph.reset();
    pool.reset();
    BOOST_TEST(gone(weak), "call " << k << ": the pool lives on");
    if (!fired) {
      BOOST_TEST(k > 8);  // reserve, create, map, access: two segments
      break;
    }
    BOOST_REQUIRE(k < 100);
  }
  BOOST_TEST(absorbed > 0);
  if (!under_sanitizer()) BOOST_TEST(used_device_bytes() <= before + slack);
}

TP_GPU_TEST(the_same_graphs_in_a_plain_pool_are_unchanged) {
  Model plain(tp::graph_pool_handle());
  Model sleepy(offloadable());
  plain.replay();
  sleepy.replay();
  plain.check("plain pool");
  sleepy.check("offloadable pool");
  BOOST_TEST(plain.pool.reserved_bytes() == sleepy.pool.reserved_bytes());
  BOOST_TEST(plain.pool.allocated_bytes() == sleepy.pool.allocated_bytes());
  BOOST_TEST(!plain.pool.offloaded());
  BOOST_TEST(contains(usage_text([&] { plain.pool.offload(plain.stream); }), "not offloadable"));
  plain.replay();
  plain.check("plain pool, after the refused offload");
}

TP_GPUS_TEST(one_pool_per_device_each_sleeps_and_wakes_on_its_own, 2) {
  std::vector<std::unique_ptr<Model>> models;
  for (int d = 0; d < 2; ++d) {
    BOOST_REQUIRE_EQUAL(cudaSetDevice(d), cudaSuccess);
    models.push_back(std::make_unique<Model>(offloadable()));
    models.back()->replay();
  }
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
  models[0]->pool.offload(models[0]->stream);
  BOOST_TEST(models[0]->pool.offloaded());
  BOOST_TEST(!models[1]->pool.offloaded());
  models[1]->replay();  // the other device's pool works on
  models[1]->check("device 1 while device 0 sleeps");
  models[1]->pool.offload(models[1]->stream);
  models[0]->pool.restore(models[0]->stream);
  models[0]->replay();
  models[0]->check("device 0 after restore");
  models[1]->pool.restore(models[1]->stream);
  models[1]->check("device 1 after restore");
  for (auto& model : models) model.reset();
  BOOST_REQUIRE_EQUAL(cudaSetDevice(0), cudaSuccess);
}

BOOST_AUTO_TEST_SUITE_END()
