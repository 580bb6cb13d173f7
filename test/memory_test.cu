// Tests for memory you can see and plan: Pool::stats (pool.hpp, detail/caching_allocator.hpp),
// the executable-memory model (detail/exec_memory.hpp), Graph::executable_bytes, and
// GraphBuckets::estimate / memory (graph/detail/bucket_memory.hpp).
//
// The cases that measure the driver with cudaMemGetInfo come first: the driver keeps what a
// destroyed executable held for later ones, so cases that destroy executables must run after.
#include "support.hpp"

#include "bench/raw_nodes.cuh"

#include <tensorplay/graph.hpp>
#include <tensorplay/graph/detail/bucket_memory.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <vector>

namespace tp = tensorplay;
namespace td = tensorplay::detail;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t lane = td::exec_model::lane_bytes;
constexpr std::size_t node = td::exec_model::node_bytes;

using PlainBody = void (*)(tp::StreamRef, std::size_t);

// ---- host memory in place of cudaMalloc (the counters need no GPU) --------------------------

struct HostBackend : tp_test::HostSegments<HostBackend> {
  static td::CaptureSeq capture_seq(cudaStream_t) { return 0; }
};
const td::AllocatorBackend host_backend{&HostBackend::allocate, &HostBackend::release, &HostBackend::capture_seq};
cudaStream_t fake_stream() { return reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1000}); }

// ---- raw graphs for the model (nodes by bench/raw_nodes.cuh) --------------------------------

// Device scratch the probe kernels write, freed at exit (memcheck's leak check).
int* scratch_int() {
  struct Scratch {
    int* p = nullptr;
    Scratch() { BOOST_REQUIRE_EQUAL(cudaMalloc(&p, 4096), cudaSuccess); }
    ~Scratch() { (void)cudaFree(p); }
  };
  static Scratch scratch;
  return scratch.p;
}

template <int P = 8>
cudaGraphNode_t add_kernel(cudaGraph_t g, std::vector<cudaGraphNode_t> after = {}) {
  static Blob<P> blob{};
  int* out = scratch_int();
  void* args[] = {&blob, &out};
  cudaKernelNodeParams params = raw_nodes::kernel_params(reinterpret_cast<void*>(&param_kernel<P>), args, 1, 32);
  cudaGraphNode_t n = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddKernelNode(&n, g, after.data(), after.size(), &params), cudaSuccess);
  return n;
}

cudaGraphNode_t add_chain(cudaGraph_t g, std::size_t count, cudaGraphNode_t after = nullptr) {
  for (std::size_t i = 0; i < count; ++i)
    after = after ? add_kernel(g, {after}) : add_kernel(g);
  return after;
}

//! A raw graph owned for the length of a case.
struct RawGraph {
  td::GraphHandle handle;
  RawGraph() { BOOST_REQUIRE_EQUAL(cudaGraphCreate(handle.out(), 0), cudaSuccess); }
  cudaGraph_t get() const { return handle.get(); }
};

td::ExecShape shape_of(cudaGraph_t g, const td::ConditionalBodies* bodies = nullptr) {
  return td::modelled_exec_shape(g, bodies, tp::source_location::current());
}

// ---- a ladder step for the estimate --------------------------------------------------------

//! Temporaries of 256 KiB and 128 KiB per sample, freed in the body, and eight kernels: what
//! capture_all keeps is the largest bucket's temporaries, once.
void ladder_step(tp::StreamRef s, std::size_t size) {
  tp::DeviceTensor<float> a(size * 64 * kib, s);
  tp_test::fill(a.data(), a.size(), 1.0f, s);
  tp::DeviceTensor<float> b(size * 32 * kib, s);
  for (int i = 0; i < 6; ++i) tp_test::add(b.data(), b.size(), 1.0f, s);
  tp_test::fill(a.data(), b.size(), 2.0f, s);
}
const std::vector<std::size_t> ladder_sizes{1, 2, 4, 8, 16};

//! Loads the step's kernels and gives the default pool's memory back, so that what a case
//! measures afterwards is captures and executables only.
void warm_up(tp::StreamRef s) {
  ladder_step(s, 1);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(s.get()), cudaSuccess);
  (void)tp::Pool::release_unused_default_memory();
}

std::size_t distance(std::size_t a, std::size_t b) { return a > b ? a - b : b - a; }

}  // namespace

// =============================================================================================
BOOST_AUTO_TEST_SUITE(executable_memory_measured)

// The model against the driver: 40 executables of 512 kernels, instantiated at once so that
// cudaMemGetInfo's 2 MiB step divides by 40 (first in the file: nothing destroyed before).
// Device-wide: skipped where other processes share the GPU (tp_test::gpu_to_itself).
BOOST_AUTO_TEST_CASE(model_is_within_a_tenth_of_what_the_driver_takes_for_many_executables,
                     *boost::unit_test::precondition(tp_test::GpuToItself{})) {
  RawGraph g;
  add_chain(g.get(), 512);
  const std::size_t modelled = shape_of(g.get()).bytes;
  BOOST_TEST(modelled == lane + 512 * node);
  std::vector<td::ExecHandle> execs(40);
  cudaGraphExec_t warm = nullptr;  // the driver's first executable sets things up
  BOOST_REQUIRE_EQUAL(cudaGraphInstantiate(&warm, g.get(), 0), cudaSuccess);
  const td::ExecHandle warm_owner(warm);
  const std::size_t before = tp_test::device_bytes_in_use();
  for (auto& e : execs) {
    cudaGraphExec_t exec = nullptr;
    BOOST_REQUIRE_EQUAL(cudaGraphInstantiate(&exec, g.get(), 0), cudaSuccess);
    e = td::ExecHandle(exec);
  }
  const std::size_t measured = tp_test::device_bytes_in_use() - before;
  BOOST_TEST_MESSAGE("40 x 512 kernels: measured " << measured << " B, modelled " << 40 * modelled << " B");
  BOOST_TEST(distance(measured, 40 * modelled) <= 40 * modelled / 10 + 2 * mib);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
BOOST_AUTO_TEST_SUITE(pool_stats)

BOOST_AUTO_TEST_CASE(empty_pool_handle_has_zero_stats) {
  const tp::PoolStats s = tp::Pool().stats();
  BOOST_TEST(s.reserved_bytes == 0u);
  BOOST_TEST(s.allocated_bytes == 0u);
  BOOST_TEST(s.peak_allocated_bytes == 0u);
  BOOST_TEST(s.segments == 0u);
}

// On host memory: the counters follow every allocation, free and segment exactly.
BOOST_AUTO_TEST_CASE(counters_follow_allocations_frees_and_segments_exactly) {
  {
    td::PoolImpl pool(0, 1, td::PoolImpl::Kind::Default, host_backend);
    const auto here = tp::source_location::current();
    td::Block* small = pool.allocate(100 * kib, fake_stream(), 0, here);  // a 2 MiB segment
    td::Block* mid = pool.allocate(5 * mib, fake_stream(), 0, here);      // a 20 MiB segment
    td::Block* large = pool.allocate(30 * mib + 1, fake_stream(), 0, here);  // its own, to 2 MiB
    td::PoolCounters c = pool.counters();
    BOOST_TEST(c.segments == 3u);
    BOOST_TEST(c.reserved_bytes == 2 * mib + 20 * mib + 32 * mib);
    BOOST_TEST(c.allocated_bytes == 100 * kib + 5 * mib + 30 * mib + 512);
    BOOST_TEST(c.peak_allocated_bytes == c.allocated_bytes);
    const std::size_t peak = c.peak_allocated_bytes;
    pool.free(large);
    c = pool.counters();
    BOOST_TEST(c.allocated_bytes == 100 * kib + 5 * mib);
    BOOST_TEST(c.peak_allocated_bytes == peak);  // kept
    BOOST_TEST(c.reserved_bytes == 54 * mib);    // cached, not given back
    BOOST_TEST(pool.release_unused_segments() == 32 * mib);
    c = pool.counters();
    BOOST_TEST(c.segments == 2u);
    BOOST_TEST(c.reserved_bytes == 22 * mib);
    BOOST_TEST(c.reserved_bytes == pool.reserved_bytes());
    BOOST_TEST(c.allocated_bytes == pool.allocated_bytes());
    pool.reset_peak();
    BOOST_TEST(pool.counters().peak_allocated_bytes == 100 * kib + 5 * mib);
    td::Block* again = pool.allocate(1 * mib, fake_stream(), 0, here);  // fits in a free part of a segment
    BOOST_TEST(pool.counters().segments == 2u);
    BOOST_TEST(pool.counters().peak_allocated_bytes == 100 * kib + 6 * mib);
    pool.free(again);
    pool.free(mid);
    pool.free(small);
    BOOST_TEST(pool.counters().allocated_bytes == 0u);
  }
  BOOST_TEST(HostBackend::live.empty());
}

TP_GPU_TEST(stats_after_a_capture_count_what_the_body_kept_and_its_peak) {
  tp::Stream stream;
  tp::Graph graph;
  tp::DeviceTensor<float> kept;
  graph.capture([&](tp::StreamRef s) {
    kept = tp::DeviceTensor<float>(1000, s);
    tp::DeviceTensor<float> temporary(3 * mib / 16, s);  // 768 KiB
    tp_test::fill(temporary.data(), temporary.size(), 1.0f, s);
    tp_test::fill(kept.data(), kept.size(), 2.0f, s);
  }, {.stream = stream});
  const tp::PoolStats s = graph.pool().stats();
  BOOST_TEST(s.allocated_bytes == 4096u);  // 1000 floats, to 512 bytes
  BOOST_TEST(s.peak_allocated_bytes == 4096u + 768 * kib);
  BOOST_TEST(s.segments == 1u);  // both small: one 2 MiB segment
  BOOST_TEST(s.reserved_bytes == 2 * mib);
  BOOST_TEST(s.reserved_bytes == graph.pool().reserved_bytes());
  kept = tp::DeviceTensor<float>();
  BOOST_TEST(graph.pool().stats().allocated_bytes == 0u);
  BOOST_TEST(graph.pool().stats().peak_allocated_bytes == 4096u + 768 * kib);
}

TP_GPU_TEST(stats_of_a_shared_pool_are_one_ledger_and_keep_the_larger_peak) {
  tp::Stream stream;
  const tp::Pool shared = tp::graph_pool_handle();
  tp::Graph first({.pool = shared});
  tp::Graph second({.pool = shared});
  first.capture([&](tp::StreamRef s) {
    tp::DeviceTensor<float> t(4 * mib / 4, s);  // 4 MiB, freed at the end of the body
    tp_test::fill(t.data(), t.size(), 1.0f, s);
  }, {.stream = stream});
  const tp::PoolStats after_first = shared.stats();
  BOOST_TEST(after_first.reserved_bytes == 20 * mib);  // a mid-size segment
  BOOST_TEST(after_first.allocated_bytes == 0u);
  second.capture([&](tp::StreamRef s) {
    tp::DeviceTensor<float> t(2 * mib / 4, s);  // reuses the first graph's freed block
    tp_test::fill(t.data(), t.size(), 1.0f, s);
  }, {.stream = stream});
  const tp::PoolStats after_second = second.pool().stats();
  BOOST_TEST(after_second.reserved_bytes == after_first.reserved_bytes);
  BOOST_TEST(after_second.segments == 1u);
  BOOST_TEST(after_second.peak_allocated_bytes == 4 * mib);
  BOOST_TEST(first.pool().stats().peak_allocated_bytes == second.pool().stats().peak_allocated_bytes);
}

TP_GPU_TEST(stats_follow_updates_resets_and_reset_peak) {
  tp::Stream stream;
  tp::Graph graph;
  std::size_t n = 1000;
  auto body = [&](tp::StreamRef s) {
    tp::DeviceTensor<float> t(n, s);
    tp_test::fill(t.data(), t.size(), 1.0f, s);
  };
  graph.capture(body, {.stream = stream});
  tp::Pool pool = graph.pool();
  BOOST_TEST(pool.stats().peak_allocated_bytes == 4096u);
  n = 3 * mib / 4;  // 3 MiB: a new 20 MiB segment
  (void)graph.update(body, {.stream = stream});
  BOOST_TEST(pool.stats().peak_allocated_bytes == 3 * mib);
  BOOST_TEST(pool.stats().segments == 2u);
  BOOST_TEST(pool.stats().reserved_bytes == 22 * mib);
  pool.reset_peak();
  BOOST_TEST(pool.stats().peak_allocated_bytes == 0u);
  graph.reset();  // the pool lives on in `pool`: its memory stays reserved
  BOOST_TEST(pool.stats().reserved_bytes == 22 * mib);
  BOOST_TEST(pool.stats().allocated_bytes == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
BOOST_AUTO_TEST_SUITE(executable_model)

// The staircase measured on the H200 (tools/probes/exec_memory_probe.cu, issue 22): each step's
// last measured size costs that step, the next measured size the next one.
BOOST_AUTO_TEST_CASE(kernel_nodes_cost_more_in_steps_of_parameter_bytes) {
  static_assert(td::kernel_node_bytes(8) == node);
  static_assert(td::kernel_node_bytes(1264) == node);
  static_assert(td::kernel_node_bytes(1288) == 4549);  // cuBLAS fp16 gemmEx: 1720 B
  static_assert(td::kernel_node_bytes(2272) == 4549);
  static_assert(td::kernel_node_bytes(2304) == 8645);  // cuBLAS sm_90 TF32 gemm: 2352 B
  static_assert(td::kernel_node_bytes(7176) == 8645);
  static_assert(td::kernel_node_bytes(7688) == 49567);
  static_assert(td::kernel_node_bytes(8200) == 49567);
  static_assert(td::kernel_node_bytes(10248) == 65710);
  static_assert(td::kernel_node_bytes(32008) == 65710);
  BOOST_TEST(td::kernel_node_bytes(2048) > node);
  BOOST_TEST(td::kernel_node_bytes(8192) > td::kernel_node_bytes(4096));
  BOOST_TEST(td::kernel_node_bytes(32000) >= td::kernel_node_bytes(16384));
  const tp::MemoryEstimate e{.pool_bytes = 3, .executable_bytes = 4};
  BOOST_TEST(e.total_bytes() == 7u);
}

TP_GPU_TEST(model_grows_with_node_count_one_lane_per_chain) {
  std::size_t last = 0;
  for (std::size_t count : {1u, 10u, 100u, 400u}) {
    RawGraph g;
    add_chain(g.get(), count);
    const td::ExecShape s = shape_of(g.get());
    BOOST_TEST(s.kernel_nodes == count);
    BOOST_TEST(s.lanes == 1u);
    BOOST_TEST(s.bytes == lane + count * node);
    BOOST_TEST(s.bytes > last);
    last = s.bytes;
  }
}

TP_GPU_TEST(model_counts_a_lane_per_independent_branch_and_none_for_empty_nodes) {
  RawGraph wide;  // 4 roots
  for (int i = 0; i < 4; ++i) add_kernel(wide.get());
  BOOST_TEST(shape_of(wide.get()).lanes == 4u);
  BOOST_TEST(shape_of(wide.get()).bytes == 4 * lane + 4 * node);

  RawGraph fork;  // a -> (b, c) -> empty -> d: the fork opens a second lane
  const cudaGraphNode_t a = add_kernel(fork.get());
  const cudaGraphNode_t b = add_kernel(fork.get(), {a});
  const cudaGraphNode_t c = add_kernel(fork.get(), {a});
  cudaGraphNode_t join = nullptr;
  std::vector<cudaGraphNode_t> both{b, c};
  BOOST_REQUIRE_EQUAL(cudaGraphAddEmptyNode(&join, fork.get(), both.data(), both.size()), cudaSuccess);
  add_kernel(fork.get(), {join});
  BOOST_TEST(shape_of(fork.get()).lanes == 2u);

  RawGraph empties;  // no work: the driver takes nothing
  cudaGraphNode_t e = nullptr;
  for (int i = 0; i < 8; ++i) BOOST_REQUIRE_EQUAL(cudaGraphAddEmptyNode(&e, empties.get(), nullptr, 0), cudaSuccess);
  BOOST_TEST(shape_of(empties.get()).bytes == 0u);

  RawGraph memsets;  // a lane, nothing per node
  const cudaMemsetParams params = raw_nodes::memset_params(scratch_int(), 16);
  cudaGraphNode_t last = nullptr;
  for (int i = 0; i < 8; ++i) {
    cudaGraphNode_t m = nullptr;
    BOOST_REQUIRE_EQUAL(cudaGraphAddMemsetNode(&m, memsets.get(), last ? &last : nullptr, last ? 1 : 0, &params), cudaSuccess);
    last = m;
  }
  BOOST_TEST(shape_of(memsets.get()).memset_nodes == 8u);
  BOOST_TEST(shape_of(memsets.get()).bytes == lane);
}

TP_GPU_TEST(model_inlines_child_graphs) {
  RawGraph child;
  add_chain(child.get(), 3);
  RawGraph parent;
  const cudaGraphNode_t first = add_kernel(parent.get());
  cudaGraphNode_t child_node = nullptr;
  BOOST_REQUIRE_EQUAL(cudaGraphAddChildGraphNode(&child_node, parent.get(), &first, 1, child.get()), cudaSuccess);
  add_kernel(parent.get(), {child_node});
  const td::ExecShape s = shape_of(parent.get());
  BOOST_TEST(s.kernel_nodes == 5u);
  BOOST_TEST(s.lanes == 1u);
  BOOST_TEST(s.bytes == lane + 5 * node);
}

TP_GPU_TEST(model_counts_recorded_conditional_bodies_as_executables_of_their_own) {
  RawGraph g;
  const cudaGraphNode_t before = add_kernel(g.get());
  cudaGraphConditionalHandle handle{};
  BOOST_REQUIRE_EQUAL(cudaGraphConditionalHandleCreate(&handle, g.get(), 0, cudaGraphCondAssignDefault), cudaSuccess);
  cudaGraphNode_t cond = nullptr;
  cudaGraph_t body = nullptr;
  BOOST_REQUIRE_EQUAL(raw_nodes::add_conditional(&cond, &body, g.get(), handle, cudaGraphCondTypeWhile, &before, 1), cudaSuccess);
  add_chain(body, 5);
  td::ConditionalBodies bodies;
  bodies.add(cond, &body, 1);
  const td::ExecShape recorded = shape_of(g.get(), &bodies);
  BOOST_TEST(recorded.conditional_nodes == 1u);
  BOOST_TEST(recorded.kernel_nodes == 6u);
  BOOST_TEST(recorded.lanes == 2u);
  BOOST_TEST(recorded.bytes == lane + node + node + (lane + 5 * node));
  const td::ExecShape unrecorded = shape_of(g.get());  // an empty body: one lane
  BOOST_TEST(unrecorded.bytes == lane + node + node + lane);
}

TP_GPU_TEST(model_reads_kernel_parameter_sizes_from_the_driver) {
  RawGraph g;
  add_kernel<4096>(g.get());
  const td::ExecShape s = shape_of(g.get());
  BOOST_TEST(s.kernel_param_bytes == 4096u + sizeof(int*));
  BOOST_TEST(s.bytes == lane + td::kernel_node_bytes(4096 + sizeof(int*)));
}

TP_GPU_TEST(model_sees_a_captured_graph_and_the_staging_nodes) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(1024, stream);
  tp::DeviceTensor<float> y(1024, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    for (int i = 0; i < 20; ++i) tp_test::affine(x.data(), y.data(), x.size(), 2.0f, 1.0f, s);
  }, {.stream = stream});
  const td::ExecShape captured = shape_of(graph.native_graph());
  BOOST_TEST(captured.kernel_nodes == 20u);
  BOOST_TEST(captured.lanes == 1u);
  tp::DeviceTensor<float> fresh(1024, stream);
  graph.stage_and_launch(std::tie(x), std::tie(fresh), stream);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(stream.get()), cudaSuccess);
  const td::ExecShape staged = shape_of(graph.native_graph());
  // The staging nodes (library kernels, cudaKernel_t) in front of the graph, on its lane.
  BOOST_TEST(staged.kernel_nodes > captured.kernel_nodes);
  BOOST_TEST(staged.kernel_param_bytes > captured.kernel_param_bytes);
  BOOST_TEST(staged.lanes == 1u);
  BOOST_TEST(staged.bytes > captured.bytes);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
// Graph::executable_bytes.
BOOST_AUTO_TEST_SUITE(graph_executable_bytes)

namespace {
void check_executable_bytes_grow_and_fall() {
  tp::Stream stream;
  tp::DeviceTensor<float> x(1024, stream);
  std::size_t last = 0;
  for (int count : {1, 50, 200}) {
    tp::Graph graph;
    BOOST_TEST(graph.executable_bytes() == 0u);
    graph.capture([&](tp::StreamRef s) {
      for (int i = 0; i < count; ++i) tp_test::add(x.data(), x.size(), 1.0f, s);
    }, {.stream = stream});
    const std::size_t bytes = graph.executable_bytes();
    BOOST_TEST(bytes == lane + count * node);
    BOOST_TEST(bytes > last);
    last = bytes;
    tp::DeviceTensor<float> fresh(1024, stream);
    graph.stage_and_launch(std::tie(x), std::tie(fresh), stream);  // the staged executable
    BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(stream.get()), cudaSuccess);
    BOOST_TEST(graph.executable_bytes() > bytes);
    BOOST_TEST(graph.executable_bytes() == shape_of(graph.native_graph()).bytes);
    graph.reset();
    BOOST_TEST(graph.executable_bytes() == 0u);
  }
}

void check_conditional_bodies_are_counted() {
  tp::Stream stream;
  tp::DeviceTensor<float> x(1024, stream);
  tp::DeviceTensor<bool> flag(1, stream);
  BOOST_REQUIRE_EQUAL(cudaMemsetAsync(flag.data(), 0, 1, stream.get()), cudaSuccess);
  std::size_t bytes[2] = {};
  for (int k = 0; k < 2; ++k) {
    tp::Graph graph;
    const int body_kernels = k == 0 ? 1 : 20;
    graph.capture([&](tp::StreamRef s) {
      tp_test::add(x.data(), x.size(), 1.0f, s);
      graph.while_(flag, [&](tp::StreamRef b) {
        for (int i = 0; i < body_kernels; ++i) tp_test::add(x.data(), x.size(), 1.0f, b);
      });
    }, {.stream = stream});
    bytes[k] = graph.executable_bytes();
  }
  BOOST_TEST(bytes[1] == bytes[0] + 19 * node);  // the body's nodes are counted
}
}  // namespace

TP_GPU_TEST(executable_bytes_grow_with_node_count_count_the_staging_nodes_and_fall_to_zero_after_reset) {
  check_executable_bytes_grow_and_fall();
}

TP_GPU_TEST(executable_bytes_count_the_nodes_of_conditional_bodies) { check_conditional_bodies_are_counted(); }

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================================
// GraphBuckets::estimate and memory.
BOOST_AUTO_TEST_SUITE(bucket_estimate)

namespace {

struct Throws : std::runtime_error {
  Throws() : std::runtime_error("the body throws at size 8") {}
};

//! The estimate leaves nothing behind; capture_all then takes what it said.
void check_estimate_then_capture_all(bool lazy, bool share, bool shared_pool) {
  tp::Stream stream;
  warm_up(stream);
  // Another Graph that captured into the shared pool first: its free blocks may serve the ladder.
  const tp::Pool pool = shared_pool ? tp::graph_pool_handle() : tp::Pool();
  tp::Graph other({.pool = pool});
  if (shared_pool) other.capture([](tp::StreamRef s) { ladder_step(s, 4); }, {.stream = stream});
  const tp::PoolStats pool_before = pool.stats();

  // What one pool of the largest bucket alone reserves: the ladder's smaller buckets fit in it.
  std::size_t largest_alone = 0;
  {
    tp::Graph alone;
    alone.capture([](tp::StreamRef s) { ladder_step(s, ladder_sizes.back()); }, {.stream = stream});
    largest_alone = alone.pool().stats().reserved_bytes;
  }
  tp::GraphBuckets<PlainBody> probe(ladder_sizes, &ladder_step, {.pool = pool, .share_executables = share});
  const std::size_t before = tp_test::device_bytes_in_use();
  const tp::MemoryEstimate e = probe.estimate(stream);
  const std::size_t after = tp_test::device_bytes_in_use();
  BOOST_TEST_MESSAGE("estimate: pool " << e.pool_bytes << " B, executables " << e.executable_bytes << " B");
  if (tp_test::gpu_to_itself()) BOOST_TEST(distance(before, after) <= 2 * mib);  // nothing held
  for (std::size_t size : ladder_sizes) BOOST_TEST(!probe.is_captured(size));
  BOOST_TEST(tp_test::not_capturing(stream.get()));
  BOOST_TEST(e.pool_bytes == largest_alone);  // counted once, not per bucket
  const std::size_t one = lane + 8 * node;
  BOOST_TEST(e.executable_bytes == (share ? one : ladder_sizes.size() * one));
  BOOST_TEST(probe.memory().executable_bytes == 0u);

  // The ladder that is really captured: this one (capture_all), or a twin made with lazy = false.
  const std::size_t start = tp_test::device_bytes_in_use();
  std::optional<tp::GraphBuckets<PlainBody>> eager;
  tp::GraphBuckets<PlainBody>* ladder = &probe;
  if (lazy) {
    probe.capture_all(stream);
  } else {
    tp::StreamGuard current(stream);
    eager.emplace(ladder_sizes, &ladder_step, tp::BucketOptions{.pool = pool, .lazy = false, .share_executables = share});
    ladder = &*eager;
  }
  const std::size_t taken = tp_test::device_bytes_in_use() - start;
  const tp::MemoryEstimate held = ladder->memory();
  BOOST_TEST(held.executable_bytes == e.executable_bytes);
  const std::size_t reserved = ladder->pool().stats().reserved_bytes - pool_before.reserved_bytes;
  if (!shared_pool) {
    BOOST_TEST(reserved == e.pool_bytes);  // the same allocations into a fresh pool: exact
    BOOST_TEST(held.pool_bytes == e.pool_bytes);
  } else {
    // The other graph's free blocks may serve some: at most the estimate, at least the
    // estimate less what was free in the pool.
    BOOST_TEST(reserved <= e.pool_bytes);
    BOOST_TEST(reserved + (pool_before.reserved_bytes - pool_before.allocated_bytes) >= e.pool_bytes);
  }
  const std::size_t margin = std::max<std::size_t>(e.total_bytes() / 50, 4 * mib);
  BOOST_TEST_MESSAGE("capture_all took " << taken << " B of device memory, estimated " << e.total_bytes() << " B");
  if (tp_test::gpu_to_itself()) {  // device-wide: other processes' memory moves it
    BOOST_TEST(taken <= e.total_bytes() + margin);
    if (!shared_pool) BOOST_TEST(distance(taken, e.total_bytes()) <= margin);
  }
}

void check_throwing_body_leaves_nothing() {
  tp::Stream stream;
  warm_up(stream);
  static bool fail = true;
  auto body = +[](tp::StreamRef s, std::size_t size) {
    ladder_step(s, size);
    if (fail && size == 8) throw Throws();
  };
  tp::GraphBuckets<PlainBody> ladder(ladder_sizes, body, {});
  const std::size_t before = tp_test::device_bytes_in_use();
  BOOST_CHECK_THROW((void)ladder.estimate(stream), Throws);
  if (tp_test::gpu_to_itself()) BOOST_TEST(distance(before, tp_test::device_bytes_in_use()) <= 2 * mib);
  BOOST_TEST(tp_test::not_capturing(stream.get()));
  for (std::size_t size : ladder_sizes) BOOST_TEST(!ladder.is_captured(size));
  fail = false;
  const tp::MemoryEstimate e = ladder.estimate(stream);  // usable afterwards
  BOOST_TEST(e.pool_bytes > 0u);
  ladder.capture_all(stream);
  BOOST_CHECK_THROW((void)ladder.estimate(stream), tp::usage_error);  // captured already
}

void check_max_executables_counts_what_is_kept() {
  tp::Stream stream;
  tp::GraphBuckets<PlainBody> ladder(ladder_sizes, &ladder_step, {.max_executables = 2});
  const tp::MemoryEstimate e = ladder.estimate(stream);
  BOOST_TEST(e.executable_bytes == 2 * (lane + 8 * node));
  ladder.capture_all(stream);
  BOOST_TEST(ladder.memory().executable_bytes == e.executable_bytes);
}

// docs/guide.md, "Memory": the example, verbatim between the markers.
void check_guide_example() {
  tp::Stream stream;
  warm_up(stream);
  const std::size_t start = tp_test::device_bytes_in_use();
  // guide: begin
  tp::GraphBuckets decode(std::vector<std::size_t>{1, 2, 4, 8, 16}, [](tp::StreamRef s, std::size_t size) {
    ladder_step(s, size);                                       // temporaries from the ladder's pool
  });
  const tp::MemoryEstimate need = decode.estimate(stream);      // captures, compiles nothing, holds nothing
  std::size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  const std::size_t ours = std::min<std::size_t>(free, std::size_t{4} << 30);  // this process's share
  const std::size_t headroom = std::size_t{64} << 20;          // what no graph accounts for
  const std::size_t cache_bytes = ours - need.total_bytes() - headroom;
  tp::DeviceTensor<std::byte> kv_cache(cache_bytes, stream);    // the cache gets the rest
  decode.capture_all(stream);                                   // the ladder fits beside it
  // guide: end
  const std::size_t used = tp_test::device_bytes_in_use() - start;
  const std::size_t margin = std::max<std::size_t>(need.total_bytes() / 50, 4 * mib);
  BOOST_TEST_MESSAGE("guide example: used " << used << " B of " << ours << " B");
  if (tp_test::gpu_to_itself()) BOOST_TEST(used <= ours - headroom + margin);
  BOOST_TEST(decode.memory().total_bytes() <= need.total_bytes());
}

}  // namespace

TP_GPU_TEST(guide_example_sizes_a_cache_from_free_memory_minus_the_estimate) { check_guide_example(); }
TP_GPU_TEST(estimate_then_capture_all_agree_for_a_lazy_ladder) { check_estimate_then_capture_all(true, false, false); }
TP_GPU_TEST(estimate_then_capture_all_agree_for_an_eager_ladder) { check_estimate_then_capture_all(false, false, false); }
TP_GPU_TEST(estimate_counts_a_shared_executable_once) { check_estimate_then_capture_all(true, true, false); }
TP_GPU_TEST(estimate_of_an_eager_ladder_with_shared_executables) { check_estimate_then_capture_all(false, true, false); }
TP_GPU_TEST(estimate_bounds_a_ladder_in_a_pool_shared_with_another_graph) {
  check_estimate_then_capture_all(true, false, true);
}
TP_GPU_TEST(estimate_of_a_throwing_body_leaves_nothing_behind_and_propagates) { check_throwing_body_leaves_nothing(); }
TP_GPU_TEST(estimate_counts_only_the_executables_max_executables_keeps) { check_max_executables_counts_what_is_kept(); }

BOOST_AUTO_TEST_SUITE_END()
