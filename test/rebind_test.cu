// Tests for Graph::rebind, GraphBuckets::rebind and PiecewiseGraph::rebind (graph/graph.hpp,
// graph/detail/rebind.hpp, graph/detail/rebind_graphs.hpp): which nodes follow the new buffer
// (kernel arguments direct, in the middle of a buffer and inside structs; 1-D copies; memsets;
// conditional bodies; child graphs), what does not (end pointers, pointers in device memory), and
// every sequence with replay, update, stage_and_launch, nested replay, buckets and threads. Every
// GPU case reads the buffers back. The cases named guide_* hold the code of docs/guide.md,
// "Pointing a graph at other memory", as written there.
#include "support.hpp"

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 1024;

struct InOut {
  const float* in;
  float* out;
  std::size_t n;
};

//! out = a * in, with both pointers inside a struct argument.
__global__ void struct_affine(InOut io, float a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < io.n; i += std::size_t{gridDim.x} * blockDim.x)
    io.out[i] = a * io.in[i];
}

//! Writes the pointers it was given: what the executable's parameters are now.
__global__ void record_pointers(const float* a, const float* b, const float* c, std::uintptr_t* out) {
  out[0] = reinterpret_cast<std::uintptr_t>(a);
  out[1] = reinterpret_cast<std::uintptr_t>(b);
  out[2] = reinterpret_cast<std::uintptr_t>(c);
}

//! acc += in
__global__ void accumulate(const float* in, float* acc, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    acc[i] += in[i];
}

//! out = in + 1: one step of a (very simple) iterative solver.
__global__ void jacobi_step(const float* in, float* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = in[i] + 1.0f;
}

//! out[k] = sum of tables[k][0..n): reads its inputs through a pointer table in device memory,
//! as a batched GEMM does.
__global__ void sum_through_table(const float* const* tables, int count, float* out, std::size_t n) {
  const int k = static_cast<int>(blockIdx.x);
  if (k >= count || threadIdx.x != 0) return;
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += tables[k][i];
  out[k] = sum;
}

__global__ void set_flag(bool* flag, bool value) { *flag = value; }

__global__ void count_down(int* counter, bool* more) {
  *counter -= 1;
  *more = *counter > 0;
}

std::vector<float> host(const tp::DeviceTensor<float>& t, tp::StreamRef s) { return tp_test::host_copy(t.data(), t.size(), s); }

bool all(const std::vector<float>& v, float value, std::size_t count = static_cast<std::size_t>(-1)) {
  for (std::size_t i = 0; i < v.size() && i < count; ++i)
    if (v[i] != value) return false;
  return true;
}

bool all_of(const tp::DeviceTensor<float>& t, float value, tp::StreamRef s) { return all(host(t, s), value); }

std::uintptr_t address(const float* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::vector<std::uintptr_t> seen_pointers(const tp::DeviceTensor<std::uintptr_t>& seen, tp::StreamRef s) {
  return tp_test::host_copy(seen.data(), 3, s);
}

void write_flag(tp::DeviceTensor<bool>& t, bool v, tp::StreamRef s) {
  set_flag<<<1, 1, 0, s>>>(t.data(), v);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

//! Three buffers of n floats filled with 1, 2 and 3, and a graph that adds 10 to `x` (a kernel
//! node) and copies `x` into `out` (a memcpy node): what most misuse cases start from.
struct Adder {
  tp::Stream stream;
  tp::DeviceTensor<float> x{n, stream};
  tp::DeviceTensor<float> y{n, stream};
  tp::DeviceTensor<float> out{n, stream};
  tp::Graph graph;

  Adder() {
    tp_test::fill(x.data(), n, 1.0f, stream);
    tp_test::fill(y.data(), n, 2.0f, stream);
    tp_test::fill(out.data(), n, 3.0f, stream);
    graph.capture([&](tp::StreamRef s) {
      tp_test::add(x.data(), n, 10.0f, s);
      BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(out.data(), x.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
    }, {.stream = stream});
  }

  //! After one replay: did it use x (and leave y alone)?
  bool replay_used_x() {
    tp_test::fill(x.data(), n, 1.0f, stream);
    tp_test::fill(y.data(), n, 2.0f, stream);
    graph.replay(stream);
    return all_of(x, 11.0f, stream) && all_of(out, 11.0f, stream) && all_of(y, 2.0f, stream);
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(rebind)

// ---- host-only: arguments, and where static buffers are after rebinds ---------------------------

BOOST_AUTO_TEST_CASE(rebind_before_any_capture_throws_usage_error) {
  std::vector<float> a(8), b(8);
  tp::Graph graph;
  BOOST_CHECK_THROW((void)graph.rebind(std::span<float>(a), std::span<float>(b)), tp::usage_error);
}

BOOST_AUTO_TEST_CASE(arguments_are_checked_before_anything) {
  std::vector<float> a(8), b(8), small(4);
  std::vector<int> ints(8);
  const char* what = "rebind";
  const auto here = tensorplay::source_location::current();
  using tp::detail::rebind_request;
  BOOST_CHECK_THROW((void)rebind_request(std::span<float>(a), std::span<float>(small), -1, what, here), tp::usage_error);
  BOOST_CHECK_THROW((void)rebind_request(std::span<float>(a), std::span<float>(a.data() + 2, 6), -1, what, here), tp::usage_error);
  BOOST_CHECK_THROW((void)rebind_request(std::span<float>(a), std::span<float>(a), -1, what, here), tp::usage_error);
  // Typed at run time: the element types are compared then (typed ones do not compile).
  BOOST_CHECK_THROW((void)rebind_request(tp::TensorView::of(a.data(), 8), tp::TensorView::of(ints.data(), 8), -1, what, here),
                    tp::usage_error);
  BOOST_CHECK_THROW((void)rebind_request(tp::TensorView::of(a.data(), 8), std::span<int>(ints), -1, what, here), tp::usage_error);
  const tp::detail::RebindRequest r = rebind_request(std::span<float>(a), tp::TensorView::of(b.data(), 8), -1, what, here);
  BOOST_TEST(r.bytes == 8 * sizeof(float));
  BOOST_TEST(r.to_bytes == 8 * sizeof(float));
  BOOST_TEST(r.from == reinterpret_cast<std::uintptr_t>(a.data()));
  // A larger `to` is fine; an empty `from` changes nothing (and is no error).
  std::vector<float> large(16);
  BOOST_TEST(rebind_request(std::span<float>(a), std::span<float>(large), -1, what, here).bytes == 8 * sizeof(float));
  BOOST_TEST(rebind_request(std::span<float>(), std::span<float>(), -1, what, here).bytes == 0u);
}

BOOST_AUTO_TEST_CASE(the_map_follows_moves_back_and_forth_and_through_a_spare) {
  using tp::detail::RebindMap;
  using tp::detail::RebindRequest;
  const std::uintptr_t a = 0x10000, b = 0x20000, spare = 0x30000;
  const std::size_t bytes = 0x1000;
  RebindMap map;
  BOOST_TEST(map.empty());
  map.moved(RebindRequest{a, bytes, b, bytes});
  BOOST_TEST(map.where_now(a, a + bytes, 0) == b);
  BOOST_TEST(map.where_now(a + 16, a + 32, 0) == b + 16);  // a part of a moved buffer moves with it
  BOOST_TEST(map.where_now(b, b + bytes, 0) == b);         // b itself was not moved
  // Back: whatever used a or b before now uses a, so both names stage into a.
  map.moved(RebindRequest{b, bytes, a, bytes});
  BOOST_TEST(map.where_now(a, a + bytes, 0) == a);
  BOOST_TEST(map.where_now(b, b + bytes, 0) == a);
  // A swap through a spare: a and b trade places.
  RebindMap swap;
  swap.moved(RebindRequest{a, bytes, spare, bytes});
  swap.moved(RebindRequest{b, bytes, a, bytes});
  swap.moved(RebindRequest{spare, bytes, b, bytes});
  BOOST_TEST(swap.where_now(a, a + bytes, 0) == b);
  BOOST_TEST(swap.where_now(b, b + bytes, 1) == a);
  swap.moved(RebindRequest{a, bytes, spare, bytes});  // and back again
  swap.moved(RebindRequest{b, bytes, a, bytes});
  swap.moved(RebindRequest{spare, bytes, b, bytes});
  BOOST_TEST(swap.where_now(a, a + bytes, 0) == a);
  BOOST_TEST(swap.where_now(b, b + bytes, 1) == b);
  // Half of a buffer moved: the whole buffer has no one place.
  RebindMap half;
  half.moved(RebindRequest{a, bytes / 2, spare, bytes / 2});
  BOOST_CHECK_THROW((void)half.where_now(a, a + bytes, 0), tp::usage_error);
  BOOST_TEST(half.where_now(a, a + bytes / 2, 0) == spare);
  BOOST_TEST(half.where_now(a + bytes / 2, a + bytes, 0) == a + bytes / 2);
}

BOOST_AUTO_TEST_CASE(buckets_and_pieces_with_nothing_captured_check_the_arguments_and_change_nothing) {
  std::vector<float> a(8), b(8), small(4);
  tp::PiecewiseGraph pieces;
  BOOST_TEST(pieces.rebind(std::span<float>(a), std::span<float>(b)).nodes == 0u);
  BOOST_CHECK_THROW((void)pieces.rebind(std::span<float>(a), std::span<float>(small)), tp::usage_error);
  tp::GraphBuckets ladder({1, 2, 4}, [](tp::StreamRef, std::size_t) { BOOST_FAIL("the body must not run"); });
  BOOST_TEST(ladder.rebind(std::span<float>(a), std::span<float>(b)).nodes == 0u);
  BOOST_CHECK_THROW((void)ladder.rebind(std::span<float>(a), std::span<float>(a.data() + 1, 7)), tp::usage_error);
  tp::GraphBuckets shared({1, 2}, [](tp::StreamRef, std::size_t) { BOOST_FAIL("the body must not run"); },
                          tp::BucketOptions{.share_executables = true});
  BOOST_CHECK_THROW((void)shared.rebind(std::span<float>(a), std::span<float>(b)), tp::usage_error);
}

// ---- what follows the new buffer -------------------------------------------------------------

TP_GPU_TEST(kernel_pointer_arguments_direct_middle_and_in_a_struct_follow_the_new_buffer) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), out(n, stream), half(n / 2, stream);
  tp::DeviceTensor<std::uintptr_t> seen(3, stream);
  tp_test::fill(x.data(), n, 2.0f, stream);
  tp_test::fill(y.data(), n, 5.0f, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    record_pointers<<<1, 1, 0, s>>>(x.data(), x.data() + 10, x.data() + n, seen.data());  // start, middle, end
    struct_affine<<<4, 256, 0, s>>>(InOut{x.data(), out.data(), n}, 3.0f);               // inside a struct
    tp_test::affine(x.data() + n / 2, half.data(), n / 2, 1.0f, 0.0f, s);                // the second half
  }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST((seen_pointers(seen, stream) == std::vector<std::uintptr_t>{address(x.data()), address(x.data() + 10), address(x.data() + n)}));
  BOOST_TEST(all_of(out, 6.0f, stream));
  BOOST_TEST(all_of(half, 2.0f, stream));

  const tp::RebindResult r = graph.rebind(x, y);
  BOOST_TEST(r.nodes == 3u);
  graph.replay(stream);
  // The end pointer x + n is not x's memory: it stays (it may be the next buffer's start).
  BOOST_TEST((seen_pointers(seen, stream) == std::vector<std::uintptr_t>{address(y.data()), address(y.data() + 10), address(x.data() + n)}));
  BOOST_TEST(all_of(out, 15.0f, stream));
  BOOST_TEST(all_of(half, 5.0f, stream));
}

TP_GPU_TEST(an_end_pointer_belongs_to_the_next_buffer) {
  tp::Stream stream;
  tp::DeviceTensor<float> block(2 * n, stream), other(n, stream);
  const std::span<float> first(block.data(), n);
  const std::span<float> second(block.data() + n, n);
  tp::DeviceTensor<std::uintptr_t> seen(3, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { record_pointers<<<1, 1, 0, s>>>(first.data(), first.data() + n, second.data(), seen.data()); },
                {.stream = stream});
  BOOST_TEST(graph.rebind(first, other).nodes == 1u);
  graph.replay(stream);
  BOOST_TEST((seen_pointers(seen, stream) ==
              std::vector<std::uintptr_t>{address(other.data()), address(second.data()), address(second.data())}));
  // first's end is second's start: rebinding `second` moves both of those words.
  tp::DeviceTensor<float> elsewhere(n, stream);
  BOOST_TEST(graph.rebind(second, elsewhere).nodes == 1u);
  graph.replay(stream);
  BOOST_TEST((seen_pointers(seen, stream) ==
              std::vector<std::uintptr_t>{address(other.data()), address(elsewhere.data()), address(elsewhere.data())}));
}

TP_GPU_TEST(one_d_copies_and_memsets_follow_the_new_buffer) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), out(n, stream), out2(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    BOOST_REQUIRE_EQUAL(cudaMemsetAsync(x.data(), 0, n * sizeof(float), s), cudaSuccess);  // x = 0
    tp_test::add(x.data(), n, 4.0f, s);                                                    // x = 4
    BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(out.data(), x.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
  }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all_of(out, 4.0f, stream));
  tp_test::fill(x.data(), n, 7.0f, stream);
  tp_test::fill(y.data(), n, 7.0f, stream);
  BOOST_TEST(graph.rebind(x, y).nodes == 3u);  // the memset, the kernel, the copy's source
  tp_test::fill(out.data(), n, 0.0f, stream);
  graph.replay(stream);
  BOOST_TEST(all_of(y, 4.0f, stream));
  BOOST_TEST(all_of(out, 4.0f, stream));
  BOOST_TEST(all_of(x, 7.0f, stream));  // untouched
  BOOST_TEST(graph.rebind(out, out2).nodes == 1u);  // the copy's destination
  tp_test::fill(out.data(), n, 0.0f, stream);
  graph.replay(stream);
  BOOST_TEST(all_of(out2, 4.0f, stream));
  BOOST_TEST(all_of(out, 0.0f, stream));
}

TP_GPU_TEST(a_buffer_the_graph_does_not_use_changes_nothing) {
  Adder a;
  tp::DeviceTensor<float> unused(n, a.stream), other(n, a.stream);
  BOOST_TEST(a.graph.rebind(unused, other).nodes == 0u);
  BOOST_TEST(a.replay_used_x());
  // After a rebind away from x, x itself is no longer used: nothing changes.
  BOOST_TEST(a.graph.rebind(a.x, a.y).nodes == 2u);
  BOOST_TEST(a.graph.rebind(a.x, other).nodes == 0u);
  tp_test::fill(a.y.data(), n, 1.0f, a.stream);
  a.graph.replay(a.stream);
  BOOST_TEST(all_of(a.y, 11.0f, a.stream));
}

TP_GPU_TEST(rebind_back_and_forth_moves_the_same_nodes_each_time) {
  Adder a;
  tp::DeviceTensor<float> z(n, a.stream);
  for (int round = 0; round < 5; ++round) {
    BOOST_TEST(a.graph.rebind(a.x, z).nodes == 2u);
    tp_test::fill(z.data(), n, 1.0f, a.stream);
    tp_test::fill(a.x.data(), n, 1.0f, a.stream);
    a.graph.replay(a.stream);
    BOOST_TEST(all_of(z, 11.0f, a.stream));
    BOOST_TEST(all_of(a.x, 1.0f, a.stream));
    BOOST_TEST(a.graph.rebind(z, a.x).nodes == 2u);
    BOOST_TEST(a.replay_used_x());
  }
}

// ---- launches, lifetimes -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_replay_queued_before_the_rebind_keeps_the_old_buffer,
                     *boost::unit_test::precondition(tp_test::AsyncLaunches{})) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream);
  tp_test::fill(x.data(), n, 0.0f, stream);
  tp_test::fill(y.data(), n, 0.0f, stream);
  stream.synchronize();
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp_test::spin_kernel<<<1, 1, 0, s>>>(200'000'000);  // 200 ms: the first replay is still queued below
    tp_test::add(x.data(), n, 1.0f, s);
  }, {.stream = stream});
  graph.replay(stream);
  const bool queued = cudaStreamQuery(stream) == cudaErrorNotReady;
  BOOST_TEST(graph.rebind(x, y).nodes == 1u);
  graph.replay(stream);
  stream.synchronize();
  BOOST_TEST(queued);
  BOOST_TEST(all_of(x, 1.0f, stream));  // the queued replay
  BOOST_TEST(all_of(y, 1.0f, stream));  // the one after the rebind
}

TP_GPU_TEST(rebind_then_destroy_from) {
  tp::Stream stream;
  auto x = std::make_unique<tp::DeviceTensor<float>>(n, stream);
  tp::DeviceTensor<float> y(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::fill(x->data(), n, 9.0f, s); }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(graph.rebind(*x, y).nodes == 1u);
  x.reset();  // from is gone; the pool may hand its block to the next tensor
  tp::DeviceTensor<float> reuse(n, stream);
  tp_test::fill(reuse.data(), n, -1.0f, stream);
  graph.replay(stream);
  BOOST_TEST(all_of(y, 9.0f, stream));
  BOOST_TEST(all_of(reuse, -1.0f, stream));
}

// ---- with update, retain, stage_and_launch, make_graphed, nested replay ------------------------

TP_GPU_TEST(update_starts_from_the_pointers_of_its_body_and_rebind_works_after_it) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), z(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::fill(x.data(), n, 1.0f, s); }, {.stream = stream});
  BOOST_TEST(graph.rebind(x, y).nodes == 1u);
  graph.replay(stream);
  BOOST_TEST(all_of(y, 1.0f, stream));
  // In place: the body's pointer (x) again, and the index of the updated executable.
  const tp::UpdateResult r = graph.update([&](tp::StreamRef s) { tp_test::fill(x.data(), n, 2.0f, s); }, {.stream = stream});
  BOOST_TEST((r.outcome == tp::UpdateOutcome::Updated));
  graph.replay(stream);
  BOOST_TEST(all_of(x, 2.0f, stream));
  BOOST_TEST(all_of(y, 1.0f, stream));
  BOOST_TEST(graph.rebind(x, z).nodes == 1u);
  graph.replay(stream);
  BOOST_TEST(all_of(z, 2.0f, stream));
  // Compiled anew (another topology): the same.
  const tp::UpdateResult again = graph.update([&](tp::StreamRef s) {
    tp_test::fill(x.data(), n, 3.0f, s);
    tp_test::add(x.data(), n, 1.0f, s);
  }, {.stream = stream});
  BOOST_TEST((again.outcome == tp::UpdateOutcome::Reinstantiated));
  graph.replay(stream);
  BOOST_TEST(all_of(x, 4.0f, stream));
  BOOST_TEST(all_of(z, 2.0f, stream));
  BOOST_TEST(graph.rebind(x, y).nodes == 2u);
  graph.replay(stream);
  BOOST_TEST(all_of(y, 4.0f, stream));
}

TP_GPU_TEST(a_compile_after_the_rebind_keeps_it) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), z(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::add(x.data(), n, 1.0f, s); }, {.stream = stream});
  tp_test::fill(x.data(), n, 0.0f, stream);
  tp_test::fill(y.data(), n, 0.0f, stream);
  tp_test::fill(z.data(), n, 0.0f, stream);
  BOOST_TEST(graph.rebind(x, y).nodes == 1u);
  graph.retain(std::make_shared<int>(1));  // the first retain compiles the executable again
  graph.replay(stream);
  BOOST_TEST(all_of(y, 1.0f, stream));
  BOOST_TEST(all_of(x, 0.0f, stream));
  BOOST_TEST(graph.rebind(y, z).nodes == 1u);  // the index of the new executable
  graph.replay(stream);
  BOOST_TEST(all_of(z, 1.0f, stream));
  BOOST_TEST(all_of(y, 1.0f, stream));
}

TP_GPU_TEST(stage_and_launch_stages_into_the_buffers_the_graph_uses_now) {
  tp::Stream stream;
  tp::DeviceTensor<float> in(n, stream), in2(n, stream), out(n, stream);
  std::array<tp::DeviceTensor<float>, 4> fresh;
  for (std::size_t k = 0; k < fresh.size(); ++k) {
    fresh[k] = tp::DeviceTensor<float>(n, stream);
    tp_test::fill(fresh[k].data(), n, static_cast<float>(k + 1), stream);
  }
  tp_test::fill(in.data(), n, 0.0f, stream);
  tp_test::fill(in2.data(), n, 0.0f, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::affine(in.data(), out.data(), n, 10.0f, 0.0f, s); }, {.stream = stream});
  // Rebound before the first staging (which compiles the staged executable): kept.
  BOOST_TEST(graph.rebind(in, in2).nodes == 1u);
  graph.stage_and_launch(std::tie(in), std::tie(fresh[0]), stream);  // named as captured: copied into in2
  BOOST_TEST(all_of(out, 10.0f, stream));
  BOOST_TEST(all_of(in2, 1.0f, stream));
  BOOST_TEST(all_of(in, 0.0f, stream));
  graph.stage_and_launch(std::tie(in), std::tie(fresh[1]), stream);  // the same plan, again
  BOOST_TEST(all_of(out, 20.0f, stream));
  graph.stage_and_launch(std::tie(in2), std::tie(fresh[2]), stream);  // named where it is now
  BOOST_TEST(all_of(out, 30.0f, stream));
  BOOST_TEST(all_of(in, 0.0f, stream));
  graph.stage_and_launch(std::tie(in), std::tie(in2), stream);  // the buffer the graph reads: nothing to copy
  BOOST_TEST(all_of(out, 30.0f, stream));
  // Back: staging goes to `in` again.
  BOOST_TEST(graph.rebind(in2, in).nodes == 1u);
  graph.stage_and_launch(std::tie(in), std::tie(fresh[3]), stream);
  BOOST_TEST(all_of(out, 40.0f, stream));
  BOOST_TEST(all_of(in, 4.0f, stream));
  // A plain replay after staging does not copy again.
  tp_test::fill(in.data(), n, 5.0f, stream);
  graph.replay(stream);
  BOOST_TEST(all_of(out, 50.0f, stream));
}

TP_GPU_TEST(make_graphed_stages_into_the_rebound_static_input) {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  tp::DeviceTensor<float> x(n, stream), elsewhere(n, stream), fresh(n, stream), out(n, stream);
  tp_test::fill(x.data(), n, 0.0f, stream);
  tp_test::fill(fresh.data(), n, 3.0f, stream);
  stream.synchronize();
  auto step = tp::make_graphed([&](tp::DeviceTensor<float>& in) { tp_test::affine(in.data(), out.data(), n, 2.0f, 0.0f, tp::current_stream()); },
                               x);
  BOOST_TEST(step.graph().rebind(x, elsewhere).nodes == 1u);
  step(fresh);
  BOOST_TEST(all_of(out, 6.0f, stream));
  BOOST_TEST(all_of(elsewhere, 3.0f, stream));
}

TP_GPU_TEST(a_graph_replayed_inside_a_capture_is_copied_as_it_runs_then) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), z(n, stream), w(n, stream);
  for (auto* t : {&x, &y, &z, &w}) tp_test::fill(t->data(), n, 0.0f, stream);
  tp::Graph inner;
  inner.capture([&](tp::StreamRef s) { tp_test::add(x.data(), n, 1.0f, s); }, {.stream = stream});
  BOOST_TEST(inner.rebind(x, y).nodes == 1u);
  tp::Graph outer;
  outer.capture([&](tp::StreamRef s) { inner.replay(s); }, {.stream = stream});  // a child-graph node: a copy
  outer.replay(stream);
  BOOST_TEST(all_of(y, 1.0f, stream));
  BOOST_TEST(all_of(x, 0.0f, stream));
  // Later rebinds of the inner graph leave the outer graph's copy alone.
  BOOST_TEST(inner.rebind(y, z).nodes == 1u);
  inner.replay(stream);
  outer.replay(stream);
  BOOST_TEST(all_of(z, 1.0f, stream));
  BOOST_TEST(all_of(y, 2.0f, stream));
  // The outer graph rebinds the nodes of its child graph itself.
  BOOST_TEST(outer.rebind(y, w).nodes == 1u);
  outer.replay(stream);
  BOOST_TEST(all_of(w, 1.0f, stream));
  BOOST_TEST(all_of(y, 2.0f, stream));
}

// ---- conditional bodies --------------------------------------------------------------------------

TP_GPU_TEST(nodes_of_conditional_bodies_follow_the_rebind_or_nothing_changes) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  write_flag(yes, true, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp_test::fill(x.data(), n, 1.0f, s);                                                  // top level
    graph.if_(yes, [&](tp::StreamRef body) { tp_test::add(x.data(), n, 2.0f, body); });  // an if body
  }, {.stream = stream});
  tp_test::fill(y.data(), n, -1.0f, stream);
  graph.replay(stream);
  BOOST_TEST(all_of(x, 3.0f, stream));
  tp_test::fill(x.data(), n, -1.0f, stream);
  bool rebound = false;
  try {
    BOOST_TEST(graph.rebind(x, y).nodes == 2u);
    rebound = true;
  } catch (const tp::usage_error& e) {
    BOOST_TEST_MESSAGE("CUDA refused to change the body's node: " << e.what());
  }
  graph.replay(stream);
  // All or nothing: both nodes moved, or neither did.
  if (rebound) {
    BOOST_TEST(all_of(y, 3.0f, stream));
    BOOST_TEST(all_of(x, -1.0f, stream));
  } else {
    BOOST_TEST(all_of(x, 3.0f, stream));
    BOOST_TEST(all_of(y, -1.0f, stream));
  }
}

TP_GPU_TEST(a_predicate_rebinds_in_the_library_kernels_that_read_it) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<bool> no(1, stream), yes(1, stream);
  write_flag(no, false, stream);
  write_flag(yes, true, stream);
  tp_test::fill(x.data(), n, 0.0f, stream);
  tp::Graph graph;
  graph.capture([&] { graph.if_(no, [&](tp::StreamRef body) { tp_test::add(x.data(), n, 1.0f, body); }); }, {.stream = stream});
  graph.replay(stream);
  BOOST_TEST(all_of(x, 0.0f, stream));
  BOOST_TEST(graph.rebind(no, yes).nodes == 1u);  // the set-handle kernel (loaded from the library's fatbin)
  graph.replay(stream);
  BOOST_TEST(all_of(x, 1.0f, stream));
  BOOST_TEST(graph.rebind(yes, no).nodes == 1u);
  graph.replay(stream);
  BOOST_TEST(all_of(x, 1.0f, stream));
}

TP_GPU_TEST(nodes_of_a_while_body_follow_the_rebind_or_nothing_changes) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::Graph graph;
  graph.capture([&] {
    graph.while_(more, [&](tp::StreamRef body) {
      tp_test::add(x.data(), n, 1.0f, body);
      count_down<<<1, 1, 0, body>>>(counter.data(), more.data());
    });
  }, {.stream = stream});
  auto run = [&] {
    tp_test::fill(counter.data(), 1, 3, stream);
    write_flag(more, true, stream);
    tp_test::fill(x.data(), n, 0.0f, stream);
    tp_test::fill(y.data(), n, 0.0f, stream);
    graph.replay(stream);
  };
  run();
  BOOST_TEST(all_of(x, 3.0f, stream));
  bool rebound = false;
  try {
    BOOST_TEST(graph.rebind(x, y).nodes == 1u);
    rebound = true;
  } catch (const tp::usage_error& e) {
    BOOST_TEST_MESSAGE("CUDA refused to change the body's node: " << e.what());
  }
  run();
  BOOST_TEST(all_of(rebound ? y : x, 3.0f, stream));
  BOOST_TEST(all_of(rebound ? x : y, 0.0f, stream));
  if (rebound) {  // and back
    BOOST_TEST(graph.rebind(y, x).nodes == 1u);
    run();
    BOOST_TEST(all_of(x, 3.0f, stream));
    BOOST_TEST(all_of(y, 0.0f, stream));
  }
}

// ---- several graphs -----------------------------------------------------------------------------

TP_GPU_TEST(graph_buckets_rebind_every_captured_bucket_and_not_later_ones) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(8, stream), y(8, stream), in(8, stream), in2(8, stream), fresh(8, stream);
  tp_test::fill(fresh.data(), 8, 5.0f, stream);
  tp::GraphBuckets ladder({1, 2, 4, 8}, [&](tp::StreamRef s, std::size_t size) {
    tp_test::affine(in.data(), x.data(), size, 1.0f, static_cast<float>(size), s);  // x = in + size
  });
  for (std::size_t size : {1, 2, 4}) (void)ladder.run(size, stream);  // 8 stays uncaptured
  auto reset = [&] {
    for (auto* t : {&x, &y, &in, &in2}) tp_test::fill(t->data(), 8, 0.0f, stream);
  };
  reset();
  BOOST_TEST(ladder.rebind(x, y).nodes == 3u);
  BOOST_TEST(ladder.run(2, stream) == 2u);
  BOOST_TEST(all(host(y, stream), 2.0f, 2));
  BOOST_TEST(all_of(x, 0.0f, stream));
  BOOST_TEST(ladder.run(8, stream) == 8u);  // captured now: writes x, as its body says
  BOOST_TEST(all_of(x, 8.0f, stream));
  // Staged runs of a rebound bucket stage where it reads now.
  reset();
  BOOST_TEST(ladder.rebind(in, in2).nodes == 4u);
  BOOST_TEST(ladder.run(4, std::tie(in), std::tie(fresh), stream) == 4u);
  BOOST_TEST(all(host(in2, stream), 5.0f, 4));
  BOOST_TEST(all_of(in, 0.0f, stream));
  BOOST_TEST(all(host(y, stream), 9.0f, 4));
}

TP_GPU_TEST(piecewise_graphs_and_piecewise_buckets_rebind_every_segment) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), in(n, stream), in2(n, stream), fresh(n, stream);
  for (auto* t : {&x, &y, &in, &in2}) tp_test::fill(t->data(), n, 0.0f, stream);
  tp_test::fill(fresh.data(), n, 7.0f, stream);
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { tp_test::add(x.data(), n, 1.0f, s); }, {.stream = stream});
  pieces.eager([&](tp::StreamRef s) { tp_test::add(x.data(), n, 100.0f, s); });  // the caller's code: not rebound
  pieces.capture([&](tp::StreamRef s) { tp_test::add(x.data(), n, 2.0f, s); }, {.stream = stream});
  BOOST_TEST(pieces.rebind(x, y).nodes == 2u);
  pieces.replay(stream);
  BOOST_TEST(all_of(y, 3.0f, stream));
  BOOST_TEST(all_of(x, 100.0f, stream));

  tp::GraphBuckets ladder({2, 4}, [&](tp::PiecewiseGraph& p, std::size_t size) {
    p.capture([&, size](tp::StreamRef s) { tp_test::affine(in.data(), x.data(), size, 1.0f, 1.0f, s); });
  });
  (void)ladder.run(4, stream);
  for (auto* t : {&x, &in, &in2}) tp_test::fill(t->data(), n, 0.0f, stream);
  BOOST_TEST(ladder.rebind(in, in2).nodes == 1u);
  std::span<float> three(fresh.data(), 3);
  (void)ladder.run(3, std::tie(in), std::tie(three), stream);  // 3 rows staged into in2, bucket 4 runs
  BOOST_TEST(all(host(in2, stream), 7.0f, 3));
  BOOST_TEST(all(host(in, stream), 0.0f, 3));
  BOOST_TEST(all(host(x, stream), 8.0f, 3));
}

TP_GPU_TEST(graphs_on_several_threads_rebind_and_replay_their_own_buffers) {
  constexpr int threads = 4;
  constexpr int rounds = 50;
  std::vector<std::thread> pool;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&failures] {
      try {
        tp::Stream stream;
        tp::DeviceTensor<float> a(n, stream), b(n, stream);
        tp_test::fill(a.data(), n, 0.0f, stream);
        tp_test::fill(b.data(), n, 0.0f, stream);
        tp::Graph graph;
        // Thread-local: the other threads' synchronisations must not break this capture.
        graph.capture([&](tp::StreamRef s) { tp_test::add(a.data(), n, 1.0f, s); },
                      {.capture_error_mode = tp::CaptureErrorMode::ThreadLocal, .stream = stream});
        for (int r = 0; r < rounds; ++r) {
          graph.replay(stream);                                    // a
          if (graph.rebind(a, b).nodes != 1) ++failures;
          graph.replay(stream);                                    // b
          if (graph.rebind(b, a).nodes != 1) ++failures;
        }
        const auto ha = tp_test::host_copy(a.data(), n, stream);
        const auto hb = tp_test::host_copy(b.data(), n, stream);
        if (!all(ha, static_cast<float>(rounds)) || !all(hb, static_cast<float>(rounds))) ++failures;
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& th : pool) th.join();
  BOOST_TEST(failures.load() == 0);
}

// ---- misuse: usage_error, and nothing changed -------------------------------------------------

TP_GPU_TEST(bad_arguments_throw_usage_error_and_change_nothing) {
  Adder a;
  tp::DeviceTensor<float> small(n / 2, a.stream);
  std::vector<float> host_memory(n);
  tp::DeviceTensor<int> ints(n, a.stream);
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, small), tp::usage_error);                                        // smaller
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, std::span<float>(a.x.data() + 1, n - 1)), tp::usage_error);     // overlapping
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, a.x), tp::usage_error);                                          // itself
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, std::span<float>(host_memory)), tp::usage_error);               // host memory
  BOOST_CHECK_THROW((void)a.graph.rebind(tp::TensorView::of(a.x.data(), n), ints), tp::usage_error);          // element type
  BOOST_TEST(a.replay_used_x());
  BOOST_TEST(a.graph.rebind(a.x, a.y).nodes == 2u);  // and a good one still works
}

TP_GPU_TEST(rebind_inside_a_capture_throws_usage_error_and_the_old_work_stays) {
  Adder a;
  BOOST_CHECK_THROW((void)a.graph.update([&](tp::StreamRef s) {
    tp_test::add(a.x.data(), n, 20.0f, s);
    (void)a.graph.rebind(a.x, a.y);
  }, {.stream = a.stream}),
                    tp::usage_error);
  BOOST_TEST(tp_test::not_capturing(a.stream));
  BOOST_TEST(a.replay_used_x());
}

TP_GPU_TEST(a_two_d_copy_that_uses_from_refuses_the_whole_rebind) {
  tp::Stream stream;
  constexpr std::size_t pitch = 64, width = 32, height = 4;  // bytes: pitch > width, no 1-D copy can stand for it
  tp::DeviceTensor<float> x(n, stream), y(n, stream), out(n, stream);
  tp_test::fill(x.data(), n, 1.0f, stream);
  tp_test::fill(y.data(), n, 2.0f, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    tp_test::add(x.data(), n, 10.0f, s);
    BOOST_REQUIRE_EQUAL(cudaMemcpy2DAsync(out.data(), pitch, x.data(), pitch, width, height, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  }, {.stream = stream});
  BOOST_CHECK_THROW((void)graph.rebind(x, y), tp::usage_error);
  graph.replay(stream);
  BOOST_TEST(all_of(x, 11.0f, stream));  // the kernel was not changed either
  BOOST_TEST(all_of(y, 2.0f, stream));
  // Buckets: one bucket whose body has the 2-D copy refuses the rebind of all of them.
  tp_test::fill(x.data(), n, 1.0f, stream);
  tp::GraphBuckets ladder({1, 2}, [&](tp::StreamRef s, std::size_t size) {
    tp_test::add(x.data(), n, 10.0f, s);
    if (size == 2)
      BOOST_REQUIRE_EQUAL(cudaMemcpy2DAsync(out.data(), pitch, x.data(), pitch, width, height, cudaMemcpyDeviceToDevice, s),
                          cudaSuccess);
  });
  ladder.capture_all(stream);
  BOOST_CHECK_THROW((void)ladder.rebind(x, y), tp::usage_error);
  (void)ladder.run(1, stream);
  BOOST_TEST(all_of(x, 11.0f, stream));
  BOOST_TEST(all_of(y, 2.0f, stream));
}

TP_GPUS_TEST(memory_of_another_device_throws_usage_error, 2) {
  Adder a;
  tp::Stream s1(1);
  tp::DeviceTensor<float> remote(n, s1);
  s1.synchronize();
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, remote), tp::usage_error);
  BOOST_CHECK_THROW((void)a.graph.rebind(a.x, std::span<float>(remote.data(), n)), tp::usage_error);
  BOOST_TEST(a.replay_used_x());
}

// ---- the guide's examples (docs/guide.md, "Pointing a graph at other memory"), as written there ----

TP_GPU_TEST(guide_double_buffering) {
  tp::Stream stream, loader;
  const int batches = 6;
  tp::DeviceTensor<float> in_a(n, stream), in_b(n, stream), acc(n, stream);
  tp_test::fill(acc.data(), n, 0.0f, stream);
  std::array<cudaEvent_t, 2> read{};
  cudaEvent_t loaded = nullptr;
  for (auto& e : read) BOOST_REQUIRE_EQUAL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaEventCreateWithFlags(&loaded, cudaEventDisableTiming), cudaSuccess);
  stream.synchronize();
  auto load = [&](tp::DeviceTensor<float>& buffer, int batch, cudaStream_t s) { tp_test::fill(buffer.data(), n, float(batch + 1), s); };

  // guide: begin
  tp::Graph step;
  step.capture([&](tp::StreamRef s) { accumulate<<<4, 256, 0, s>>>(in_a.data(), acc.data(), n); }, {.stream = stream});
  tp::DeviceTensor<float>* buffers[2] = {&in_a, &in_b};
  load(in_a, 0, loader);                                   // batch 0
  for (int i = 0; i < batches; ++i) {
    const int now = i % 2, next = 1 - now;
    cudaEventRecord(loaded, loader);
    cudaStreamWaitEvent(stream, loaded);                   // batch i is in buffers[now]
    if (i > 0) step.rebind(*buffers[next], *buffers[now]);  // the last step read buffers[next]
    step.replay(stream);                                   // step i reads buffers[now]
    cudaEventRecord(read[now], stream);
    if (i + 1 < batches) {
      if (i > 0) cudaStreamWaitEvent(loader, read[next]);  // step i - 1 is done with buffers[next]
      load(*buffers[next], i + 1, loader);                 // batch i + 1, while step i runs
    }
  }
  // guide: end

  stream.synchronize();
  BOOST_TEST(all_of(acc, float(batches * (batches + 1) / 2), stream));  // 1 + 2 + ... + 6
  for (auto& e : read) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(loaded);
}

// guide: begin
// Swaps the buffers the graph reads and writes. `spare` only names the middle step: no launch
// runs between the three calls, so the GPU never touches it.
void swap_roles(tp::Graph& graph, tp::DeviceTensor<float>& a, tp::DeviceTensor<float>& b, tp::DeviceTensor<float>& spare) {
  graph.rebind(a, spare);
  graph.rebind(b, a);
  graph.rebind(spare, b);
}
// guide: end

TP_GPU_TEST(guide_ping_pong) {
  tp::Stream stream;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), spare(n, stream);
  tp_test::fill(x.data(), n, 0.0f, stream);
  const int iterations = 7;

  // guide: begin
  tp::Graph solver;  // one step: y = f(x)
  solver.capture([&](tp::StreamRef s) { jacobi_step<<<4, 256, 0, s>>>(x.data(), y.data(), n); }, {.stream = stream});
  for (int it = 0; it < iterations; ++it) {
    solver.replay(stream);             // reads the current iterate, writes the next one
    swap_roles(solver, x, y, spare);   // the next step reads what this one wrote
  }
  tp::DeviceTensor<float>& result = iterations % 2 ? y : x;
  // guide: end

  BOOST_TEST(all_of(result, float(iterations), stream));
  BOOST_TEST(all_of(iterations % 2 ? x : y, float(iterations - 1), stream));
}

TP_GPU_TEST(guide_zero_copy_inputs) {
  tp::Stream stream;
  tp::DeviceTensor<float> static_in(n, stream), out(n, stream);
  std::vector<tp::DeviceTensor<float>> inputs;
  for (int i = 0; i < 4; ++i) {
    inputs.emplace_back(n, stream);
    tp_test::fill(inputs.back().data(), n, float(i + 1), stream);
  }
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp_test::affine(static_in.data(), out.data(), n, 2.0f, 0.0f, s); }, {.stream = stream});
  std::vector<float> results;

  // guide: begin
  const tp::DeviceTensor<float>* reading = &static_in;  // the buffer the graph reads now
  for (const tp::DeviceTensor<float>& fresh : inputs) {  // each must live until its replay is done
    graph.rebind(*reading, fresh);                        // no copy: the graph reads `fresh` itself
    reading = &fresh;
    graph.replay(stream);
    // ... use out ...
    results.push_back(out.to_host(stream)[0]);
  }
  // guide: end

  BOOST_TEST((results == std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
}

TP_GPU_TEST(guide_pointers_in_device_memory) {
  tp::Stream stream;
  tp::DeviceTensor<float> a0(n, stream), a1(n, stream), b0(n, stream), b1(n, stream), sums(2, stream);
  tp_test::fill(a0.data(), n, 1.0f, stream);
  tp_test::fill(a1.data(), n, 2.0f, stream);
  tp_test::fill(b0.data(), n, 3.0f, stream);
  tp_test::fill(b1.data(), n, 4.0f, stream);

  // guide: begin
  // A kernel (a batched GEMM, say) that reads its inputs through a table of pointers in device memory:
  tp::DeviceTensor<const float*> table(2, stream);
  table.copy_from_host(std::vector<const float*>{a0.data(), a1.data()}, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { sum_through_table<<<2, 32, 0, s>>>(table.data(), 2, sums.data(), n); }, {.stream = stream});
  // graph.rebind(a0, b0) finds nothing: a0's address is in `table`, not in a kernel's parameters.
  // Rebind the table instead, to a second table that holds the new pointers:
  tp::DeviceTensor<const float*> other_table(2, stream);
  other_table.copy_from_host(std::vector<const float*>{b0.data(), b1.data()}, stream);
  graph.rebind(table, other_table);
  // guide: end

  graph.replay(stream);
  const auto got = tp_test::host_copy(sums.data(), 2, stream);
  BOOST_TEST(got[0] == 3.0f * n);
  BOOST_TEST(got[1] == 4.0f * n);
  BOOST_TEST(graph.rebind(a0, b0).nodes == 0u);  // as the guide says
}

BOOST_AUTO_TEST_SUITE_END()
