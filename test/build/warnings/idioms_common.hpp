// test/build/warnings/idioms_common.hpp: every public idiom of the README and docs/guide.md that a
// host-only translation unit can use (no kernels of its own, no __device__ callables), written as
// the documentation writes it. Included once by idioms.cpp (g++, clang++) and once by idioms.cu
// (nvcc); tools/check_warnings compiles both with -Wall -Wextra -Werror at -O0 and -O2.
//
// Nothing here is ever run. The functions have external linkage and are not inline, so that
// every compiler emits them and runs its optimiser over them: g++'s -Wmaybe-uninitialized, say,
// needs code generation and comes at -O2 only (a -fsyntax-only check never sees it). Kernels
// are stood in for by cudaMemsetAsync / cudaMemcpyAsync (see "Host-only translation units").
#pragma once

#include <tensorplay/graph.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

namespace tp = tensorplay;

// A user type made a Tensor through tensor_traits (guide, "Tensors").
struct UserBuffer {
  double* ptr = nullptr;
  std::size_t count = 0;
};
template <>
struct tensorplay::tensor_traits<UserBuffer> {
  using element_type = double;
  static constexpr MemorySpace space = MemorySpace::Device;
  static constexpr bool contiguous = true;
  static double* data(const UserBuffer& b) { return b.ptr; }
  static std::size_t size(const UserBuffer& b) { return b.count; }
};
static_assert(tp::Tensor<UserBuffer>);
static_assert(tp::Tensor<std::span<float>> && tp::ContiguousTensor<tp::DeviceTensor<float>>);
static_assert(!tp::Tensor<std::vector<float>>);
static_assert(tp::ScalarPredicate<tp::DeviceTensor<bool>> && !tp::ScalarPredicate<tp::DeviceTensor<int>>);

namespace idioms {

// A stand-in for a kernel launch: host-only units launch none of their own.
void work(void* p, std::size_t bytes, tp::StreamRef s) { (void)cudaMemsetAsync(p, 0, bytes, s); }

// ---- Capture (README's first example, guide "Capture") ----------------------------------------

void capture_and_replay() {
  tp::Stream stream;
  tp::DeviceTensor<float> x(1000, stream);
  tp::DeviceTensor<float> y;
  tp::DeviceTensor<float> r(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    y = tp::DeviceTensor<float>(x.size(), s);
    work(y.data(), y.bytes(), s);
    work(r.data(), r.bytes(), s);
  }, {.stream = stream});
  graph.replay(stream);
  tp::DeviceTensor<float> fresh_x(1000, stream);
  graph.stage_and_launch(std::tie(x), std::tie(fresh_x), stream);
  std::printf("%zu nodes\n", graph.node_count());
}

void the_current_stream_convention() {
  tp::Stream stream;
  tp::StreamGuard guard(stream);
  tp::Graph graph;
  graph.capture_begin();
  const bool same = graph.capture_stream() == stream && tp::current_stream() == stream && stream.is_capturing();
  work(nullptr, 0, tp::current_stream());
  graph.capture_end();
  if (same) graph.replay();
}

void capture_without_a_stream_and_replay_on_the_current_one() {
  tp::DeviceTensor<int> counter(1);
  tp::Graph graph;
  graph.capture([&] { work(counter.data(), counter.bytes(), tp::current_stream()); });
  graph.replay();
}

void instantiate_later() {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  work(nullptr, 0, stream);
  graph.capture_end(tp::Instantiate::Later);
  graph.instantiate();
  graph.replay(stream);
}

void errors_and_capture_error_modes() {
  tp::Stream stream;
  tp::DeviceTensor<int> counter(1, stream);
  tp::Graph graph({.capture_error_mode = tp::CaptureErrorMode::Global});
  try {
    graph.replay(stream);
  } catch (const tp::usage_error& e) {
    std::puts(e.what());
  }
  graph.capture_begin({.capture_error_mode = tp::CaptureErrorMode::Relaxed, .stream = stream});
  void* ptr = nullptr;
  (void)cudaMalloc(&ptr, 256);
  work(counter.data(), counter.bytes(), stream);
  try {
    graph.capture_end();
  } catch (const tp::capture_error& e) {
    std::printf("%s %s %d %s\n", e.what(), e.culprit().c_str(), e.from_other_thread() ? 1 : 0, e.driver_message().c_str());
  } catch (const tp::instantiate_error& e) {
    std::printf("%s\n", e.what());
  } catch (const tp::cuda_error& e) {
    std::printf("%d %s %s:%u\n", static_cast<int>(e.status()), e.call().c_str(), e.where().file_name(), e.where().line());
  }
  const tp::CaptureErrorMode mode = tp::capture_error_mode_from_string("thread_local");
  std::printf("%s\n", std::string(tp::to_string(mode)).c_str());
  tp::Graph relaxed({.capture_error_mode = tp::capture_error_mode_from_string("relaxed")});
  relaxed.capture([] {}, {.capture_error_mode = tp::CaptureErrorMode::ThreadLocal, .stream = stream});
}

void a_body_that_throws() {
  tp::Stream stream;
  tp::Graph graph;
  try {
    graph.capture([](tp::StreamRef) { throw std::runtime_error("body"); }, {.stream = stream});
  } catch (const std::exception& e) {
    std::puts(e.what());
  }
  graph.capture([](tp::StreamRef) {}, {.stream = stream});
}

void graph_state_and_debug_dump() {
  tp::Stream stream;
  tp::Graph graph;
  graph.enable_debug_mode();
  graph.capture([&](tp::StreamRef s) { work(nullptr, 0, s); }, {.stream = stream});
  graph.debug_dump("graph.dot");
  graph.debug_dump(std::string("plain.dot"), tp::DotFlags::Default);
  graph.debug_dump("verbose.dot", tp::DotFlags::Verbose);
  graph.debug_dump("handles.dot", tp::DotFlags::Handles | tp::DotFlags::ConditionalParams);
  std::printf("%d %d %d %zu %zu %p %p %zu\n", graph.is_capturing() ? 1 : 0, graph.is_instantiated() ? 1 : 0, graph.device(),
              graph.conditional_depth(), graph.node_count(), static_cast<void*>(graph.native_graph()),
              static_cast<void*>(graph.native_exec()), graph.executable_bytes());
  graph.reset();
}

// ---- Pools ------------------------------------------------------------------------------------

void pools() {
  tp::Stream stream;
  tp::Graph graph;
  tp::DeviceTensor<float> kept;
  graph.capture([&](tp::StreamRef s) {
    kept = tp::DeviceTensor<float>(1000, s);
    tp::DeviceTensor<float> temporary(3000, s);
    work(temporary.data(), temporary.bytes(), s);
    work(kept.data(), kept.bytes(), s);
  }, {.stream = stream});
  const tp::Pool pool = graph.pool();
  std::printf("%d %zu %zu %ld %d\n", kept.pool() == pool ? 1 : 0, pool.allocated_bytes(), pool.reserved_bytes(),
              pool.use_count(), pool.device());

  tp::Graph g2({.pool = graph.pool()});
  g2.capture([&](tp::StreamRef s) { work(kept.data(), kept.bytes(), s); }, {.stream = stream});
  tp::Graph g3;
  g3.capture([&](tp::StreamRef s) { tp::DeviceTensor<float> t(10, s); work(t.data(), t.bytes(), s); },
             {.pool = tp::Pool(g2.pool_id()), .stream = stream});
  for (int i = 0; i < 3; ++i) {
    graph.replay(stream);
    g2.replay(stream);
    g3.replay(stream);
  }

  tp::Pool shared = tp::graph_pool_handle();
  tp::Graph first({.pool = shared}), second({.pool = shared});
  first.capture([] {}, {.pool = shared, .stream = stream});
  second.capture([] {}, {.pool = shared, .stream = stream});

  const tp::PoolId id = shared.id();
  std::unordered_set<tp::PoolId> ids{id, g2.pool_id()};
  std::ostringstream out;
  out << id << ' ' << shared << ' ' << tp::PoolId{};
  std::printf("%s %zu %d %llu %d\n", out.str().c_str(), ids.size(), id == g3.pool_id() ? 1 : 0,
              static_cast<unsigned long long>(id.serial()), id ? id.device() : -1);
  std::printf("%zu\n", tp::Pool::release_unused_default_memory());
  const tp::Pool default_pool = tp::Pool::default_for(0);
  std::printf("%d\n", default_pool.empty() ? 1 : 0);
}

void memory_stats() {
  tp::Stream stream;
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { tp::DeviceTensor<char> t(1 << 20, s); work(t.data(), t.bytes(), s); }, {.stream = stream});
  tp::Pool pool = graph.pool();
  const tp::PoolStats s = pool.stats();
  std::printf("%zu MiB reserved, peak %zu MiB used, %zu allocated, %zu segments\n", s.reserved_bytes >> 20,
              s.peak_allocated_bytes >> 20, s.allocated_bytes, s.segments);
  pool.reset_peak();
  std::printf("%zu\n", graph.executable_bytes());
}

void sleep_and_wake() {
  tp::Stream stream;
  tp::Pool pool = tp::graph_pool_handle({.offloadable = true});
  tp::Pool plain = tp::graph_pool_handle(tp::PoolOptions{});
  tp::Graph graph({.pool = pool});
  tp::DeviceTensor<int> kept;
  graph.capture([&](tp::StreamRef s) { kept = tp::DeviceTensor<int>(100, s); work(kept.data(), kept.bytes(), s); },
                {.stream = stream});
  graph.replay(stream);
  pool.offload(stream);
  std::printf("%d %d\n", pool.offloaded() ? 1 : 0, plain.offloaded() ? 1 : 0);
  pool.restore(stream);
  graph.replay(stream);
}

// ---- Tensors ----------------------------------------------------------------------------------

void device_tensors() {
  tp::Stream stream;
  std::vector<int> values(1000);
  std::iota(values.begin(), values.end(), -7);
  tp::DeviceTensor<int> t(values.size(), stream);
  t.copy_from_host(values, stream);
  std::vector<int> back = t.to_host(stream);
  tp::DeviceTensor<float> x(100);
  x.copy_from_host(std::vector<float>(100, 1.0f));
  std::vector<float> xs = x.to_host();
  tp::Stream other;
  t.record_stream(other);
  std::span<int> view = t.span();
  const tp::DeviceTensor<int>& ct = t;
  std::span<const int> cview = ct.span();
  tp::DeviceTensor<int> moved = std::move(t);
  moved.swap(t);
  t.reset();
  std::printf("%zu %zu %zu %d %d %zu %zu %zu %d\n", back.size(), xs.size(), moved.size(), moved.device(), t.empty() ? 1 : 0,
              view.size(), cview.size(), moved.bytes(), moved.pool().empty() ? 1 : 0);
  const bool yes = true;
  tp::DeviceTensor<bool> flag(1, stream);
  flag.copy_from_host(std::span<const bool>(&yes, 1), stream);
  const tp::TensorView v = tp::TensorView::of(x.data(), x.size());
  std::printf("%zu\n", v.size);
}

// ---- Conditional nodes, tensor predicates --------------------------------------------------------

void conditional_nodes() {
  tp::Stream stream;
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<bool> pred(1, stream);
  tp::DeviceTensor<int> index(1, stream);
  tp::DeviceTensor<int> out(1, stream);
  bool* raw_pred = pred.data();
  std::span<bool> span_pred(raw_pred, 1);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    work(more.data(), 1, s);
    graph.while_(more, [&](tp::StreamRef body) { work(more.data(), 1, body); });
    graph.if_(pred, [&](tp::StreamRef body) { work(out.data(), out.bytes(), body); });
    graph.if_(span_pred, [&] { work(out.data(), out.bytes(), tp::current_stream()); });
    graph.if_else_(pred, [&](tp::StreamRef b) { work(out.data(), out.bytes(), b); },
                   [&](tp::StreamRef b) { work(out.data(), out.bytes(), b); });
    graph.switch_(index, [&](tp::StreamRef b) { work(out.data(), out.bytes(), b); },
                  [&](tp::StreamRef b) { work(out.data(), out.bytes(), b); },
                  [&] { work(out.data(), out.bytes(), tp::current_stream()); });
    {
      tp::WhileScope loop(graph, more);
      work(more.data(), 1, loop.stream());
      {
        tp::IfScope inner(graph, pred);
        work(out.data(), out.bytes(), inner.stream());
      }
    }
    tp::DeviceTensor<int> inside;
    graph.if_(pred, [&](tp::StreamRef body) {
      inside = tp::DeviceTensor<int>(4, body);  // from the graph's pool
      work(inside.data(), inside.bytes(), graph.capture_stream());
    });
  }, {.stream = stream});
  graph.replay(stream);
}

void conditional_nodes_imperative_form() {
  tp::Stream stream;
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<bool> pred(1, stream);
  tp::Graph graph;
  graph.capture_begin({.stream = stream});
  work(more.data(), 1, stream);
  graph.begin_capture_to_while_node(more);
  work(more.data(), 1, graph.capture_stream());
  graph.set_conditional_handle_for_current_node(more);
  graph.end_capture_to_conditional_node();
  graph.begin_capture_to_if_node(pred);
  work(pred.data(), 1, graph.capture_stream());
  graph.end_capture_to_conditional_node();
  try {
    graph.capture_end();
  } catch (const tp::usage_error& e) {
    std::puts(e.what());
  }
  graph.replay(stream);
}

// ---- Staging inputs ---------------------------------------------------------------------------------

void staging_inputs() {
  tp::Stream stream;
  constexpr std::size_t n = 1000;
  tp::DeviceTensor<float> x(n, stream);
  tp::DeviceTensor<int> start(1, stream);
  tp::DeviceTensor<int> counter(1, stream);
  tp::DeviceTensor<bool> more(1, stream);
  tp::DeviceTensor<bool> yes(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    (void)cudaMemcpyAsync(counter.data(), start.data(), sizeof(int), cudaMemcpyDeviceToDevice, s);
    (void)cudaMemsetAsync(more.data(), 1, 1, s);
    graph.while_(more, [&](tp::StreamRef body) { work(more.data(), 1, body); });
    graph.if_(yes, [&](tp::StreamRef body) { work(x.data(), x.bytes(), body); });
  }, {.stream = stream});
  tp::DeviceTensor<float> fresh_x(n, stream);
  tp::DeviceTensor<int> fresh_start(1, stream);
  graph.stage_and_launch(std::tie(x, start), std::tie(fresh_x, fresh_start), stream);
  // Conversions, host sources (pageable and pinned), temporaries and the current stream.
  tp::DeviceTensor<double> as_double(n, stream);
  std::vector<float> host(n, 1.0f);
  std::span<float> host_span(host);
  graph.stage_and_launch(std::tie(x), std::tie(as_double), stream);
  graph.stage_and_launch(std::tie(x), std::tie(host_span), stream);
  graph.stage_and_launch(std::forward_as_tuple(x.span()), std::forward_as_tuple(std::span<const float>(host.data(), n)), stream);
  tp::StreamGuard guard(stream);
  graph.stage_and_launch(std::tie(x), std::tie(fresh_x));
  try {
    graph.stage_and_launch(std::tie(x, x), std::tie(fresh_x, fresh_x), stream);
  } catch (const tp::usage_error& e) {
    std::puts(e.what());
  }
}

void graphed_callables() {
  constexpr std::size_t n = 1000;
  tp::DeviceTensor<float> static_x(n), static_y(n), x(n), y(n);
  auto step = tp::make_graphed(
      [&](tp::DeviceTensor<float>& a, tp::DeviceTensor<float>& b) {
        tp::DeviceTensor<float> out(n);
        work(a.data(), a.bytes(), tp::current_stream());
        work(b.data(), b.bytes(), tp::current_stream());
        work(out.data(), out.bytes(), tp::current_stream());
        return out;
      },
      static_x, static_y);
  tp::DeviceTensor<float>& out = step(x, y);
  tp::Stream stream;
  tp::DeviceTensor<float>& again = step.launch(stream, x, y);
  std::printf("%p %p %zu\n", static_cast<void*>(out.data()), static_cast<void*>(again.data()), step.graph().node_count());

  auto void_step = tp::make_graphed(tp::MakeGraphedOptions{.warmup_runs = 2, .graph = {.upload = true}},
                                    [&](tp::DeviceTensor<float>& a) { work(a.data(), a.bytes(), tp::current_stream()); }, static_x);
  void_step(x);
}

// ---- Graphs that change ----------------------------------------------------------------------------

struct Sentinel {
  int* gone = nullptr;
  Sentinel() = default;
  explicit Sentinel(int* g) : gone(g) {}
  Sentinel(Sentinel&& o) noexcept : gone(std::exchange(o.gone, nullptr)) {}
  Sentinel& operator=(Sentinel&&) = delete;
  ~Sentinel() {
    if (gone != nullptr) *gone = 1;
  }
};

void graphs_that_change() {
  tp::Stream stream;
  tp::DeviceTensor<int> a(100, stream), b(100, stream);
  tp::Graph graph({.upload = true});
  graph.capture([&](tp::StreamRef s) { work(a.data(), a.bytes(), s); }, {.stream = stream});
  const tp::UpdateResult r = graph.update([&](tp::StreamRef s) { work(b.data(), b.bytes(), s); }, {.stream = stream});
  if (r.outcome == tp::UpdateOutcome::Reinstantiated) {
    std::printf("%s", std::string(tp::to_string(r.reason)).c_str());
    if (r.error_node) std::printf(" %s", std::string(tp::to_string(*r.error_node)).c_str());
  }
  const tp::UpdateResult r2 = graph.update([&] { work(a.data(), a.bytes(), tp::current_stream()); });
  std::printf("%d\n", r2.outcome == tp::UpdateOutcome::Updated ? 1 : 0);

  auto shared = std::make_shared<int>(7);
  int unique_gone = 0;
  tp::Graph kept;
  kept.retain(shared);
  kept.capture([&](tp::StreamRef s) { work(a.data(), a.bytes(), s); }, {.stream = stream});
  kept.retain(std::make_unique<Sentinel>(&unique_gone));
  kept.retain(Sentinel(&unique_gone));
  kept.reset();

  auto inner_a = std::make_unique<tp::Graph>();
  auto inner_b = std::make_unique<tp::Graph>();
  inner_a->capture([&](tp::StreamRef s) { work(a.data(), a.bytes(), s); }, {.stream = stream});
  inner_b->capture([&](tp::StreamRef s) { work(b.data(), b.bytes(), s); }, {.stream = stream});
  tp::Graph outer;
  outer.capture([&](tp::StreamRef s) {
    inner_a->replay(s);
    inner_b->replay(s);
    inner_a->replay(s);
  }, {.stream = stream});
  inner_a.reset();
  inner_b.reset();
  outer.replay(stream);
}

// ---- Buckets and piecewise graphs --------------------------------------------------------------------

void buckets() {
  tp::Stream stream;
  constexpr std::size_t width = 64;
  tp::DeviceTensor<float> x(8 * width, stream), y(8 * width, stream);
  tp::GraphBuckets buckets(std::vector<std::size_t>{1, 2, 4, 8}, [&](tp::StreamRef s, std::size_t size) {
    work(x.data(), size * width * sizeof(float), s);
    work(y.data(), size * width * sizeof(float), s);
  });
  std::size_t ran = buckets.run(3, stream);
  ran += buckets.run(4, stream);
  ran += buckets.run(100, stream);  // above the ladder: eager
  std::printf("%zu %zu %d %zu %zu\n", ran, buckets.bucket_for(5), buckets.is_captured(4) ? 1 : 0, buckets.sizes().size(),
              buckets.executables());

  // Staged runs: the inputs go into the front of the static buffers, the tail is zeroed.
  tp::DeviceTensor<float> tokens(3 * width, stream);
  tp::GraphBuckets padded(std::vector<std::size_t>{1, 2, 4, 8},
                          [&](tp::StreamRef s, std::size_t size) { work(x.data(), size * width * sizeof(float), s); },
                          tp::BucketOptions{.zero_fill_tail = true});
  padded.run(3, std::tie(x), std::tie(tokens), stream);

  tp::GraphBuckets decode(std::vector<std::size_t>{1, 2, 4, 8, 16}, [&](tp::StreamRef s, std::size_t size) {
    tp::DeviceTensor<float> temp(size * width, s);
    work(temp.data(), temp.bytes(), s);
  }, {.pool = tp::graph_pool_handle(), .lazy = true, .max_executables = 4, .overflow = tp::Overflow::Throw, .share_executables = true});
  const tp::MemoryEstimate need = decode.estimate(stream);
  std::size_t free = 0, total = 0;
  (void)cudaMemGetInfo(&free, &total);
  const std::size_t ours = std::min<std::size_t>(free, std::size_t{4} << 30);
  const std::size_t headroom = std::size_t{64} << 20;
  const std::size_t cache_bytes = ours - need.total_bytes() - headroom;
  tp::DeviceTensor<std::byte> kv_cache(cache_bytes, stream);
  decode.capture_all(stream);
  const tp::MemoryEstimate held = decode.memory();
  std::printf("%zu %zu %zu %d\n", held.pool_bytes, held.executable_bytes, need.pool_bytes, decode.pool().empty() ? 1 : 0);
}

void piecewise_graphs() {
  tp::Stream stream, other;
  tp::DeviceTensor<int> log(3, stream);
  tp::PiecewiseGraph pieces;
  pieces.capture([&](tp::StreamRef s) { work(log.data(), sizeof(int), s); }, {.stream = stream});
  pieces.eager([&](tp::StreamRef s) { work(log.data() + 1, sizeof(int), s); });
  pieces.capture([&] { work(log.data() + 2, sizeof(int), tp::current_stream()); }, {.stream = stream});
  pieces.replay(other);
  std::printf("%zu %zu %d\n", pieces.segments(), pieces.executable_bytes(), pieces.pool().empty() ? 1 : 0);

  tp::PiecewiseGraph offloadable({.pool = tp::graph_pool_handle({.offloadable = true})});
  offloadable.capture([&](tp::StreamRef s) { work(log.data(), sizeof(int), s); }, {.stream = stream});

  // A ladder of piecewise buckets.
  tp::GraphBuckets ladder(std::vector<std::size_t>{1, 2}, [&](tp::PiecewiseGraph& p, std::size_t size) {
    p.capture([&](tp::StreamRef s) { work(log.data(), size * sizeof(int), s); });
    p.eager([&](tp::StreamRef s) { work(log.data(), sizeof(int), s); });
  });
  ladder.run(2, stream);
}

// ---- Random numbers, several GPUs ------------------------------------------------------------------

void random_numbers() {
  tp::Stream stream;
  tp::RandomState rng(2026);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) {
    const tp::PhiloxArgs args = rng.next(1);
    work(nullptr, 0, s);
    (void)args;
  }, {.stream = stream});
  graph.replay(stream);
  const tp::PhiloxArgs eager = rng.next(4, stream);
  rng.set_seed(7);
  std::printf("%llu %llu %d %zu\n", static_cast<unsigned long long>(rng.offset()), static_cast<unsigned long long>(rng.seed()),
              rng.device(), sizeof(eager));
}

void device_groups() {
  constexpr std::size_t n = 100;
  tp::DeviceGroupGraph group({0, 1});
  std::vector<tp::DeviceTensor<float>> x;
  group.capture([&](int device, tp::StreamRef s) {
    const std::size_t i = group.index_of(device);
    work(x[i].data(), n * sizeof(float), s);
  });
  std::vector<tp::StreamRef> streams;
  for (int device : group.devices()) streams.push_back(group.stream(device));
  group.replay(streams);
  group.replay();
  tp::DeviceGroupGraph together({0, 1}, {.upload = true});
  together.capture([&](std::span<const tp::StreamRef> s) {
    for (std::size_t i = 0; i < s.size(); ++i) work(x[i].data(), n * sizeof(float), s[i]);
  }, streams);
  std::printf("%zu %zu %d %d\n", together.size(), together.graph(0).node_count(), together.is_instantiated() ? 1 : 0,
              together.is_capturing() ? 1 : 0);
  together.reset();
}

// ---- Porting from raw CUDA graphs; pointing a graph at other memory -------------------------------

void conditional_handles() {
  tp::Stream stream;
  tp::DeviceTensor<int> x(1, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef c) {
    auto h = graph.conditional_handle();
    work(x.data(), x.bytes(), c);  // a kernel compiled by nvcc would call h.set(...), or take h.native()
    std::printf("%llu %d\n", static_cast<unsigned long long>(h.native()), h ? 1 : 0);
    graph.if_(h, [&](tp::StreamRef b) { work(x.data(), x.bytes(), b); });
    auto loop = graph.conditional_handle(1);  // a do-while
    graph.while_(loop, [&](tp::StreamRef b) { work(x.data(), x.bytes(), b); });
    auto two = graph.conditional_handle();
    graph.if_else_(two, [&](tp::StreamRef b) { work(x.data(), x.bytes(), b); }, [&] { work(x.data(), x.bytes(), tp::current_stream()); });
    auto index = graph.conditional_handle();
    graph.switch_(index, [&](tp::StreamRef b) { work(x.data(), x.bytes(), b); }, [&](tp::StreamRef b) { work(x.data(), x.bytes(), b); });
    {
      tp::IfScope scope(graph, graph.conditional_handle());
      work(x.data(), x.bytes(), scope.stream());
    }
    {
      tp::WhileScope scope(graph, graph.conditional_handle(1));
      work(x.data(), x.bytes(), scope.stream());
    }
    auto imperative = graph.conditional_handle();
    graph.begin_capture_to_while_node(imperative);
    work(x.data(), x.bytes(), graph.capture_stream());
    graph.end_capture_to_conditional_node();
  }, {.stream = stream, .upload = true});
  graph.replay(stream);
  const tp::ConditionalHandle none;
  std::printf("%d\n", none ? 1 : 0);
}

void adopted_graphs() {
  tp::Stream stream;
  tp::DeviceTensor<int> in(100, stream);
  std::vector<int> source(100, 1);
  cudaGraph_t built = nullptr;
  (void)cudaGraphCreate(&built, 0);
  tp::Graph graph;
  graph.adopt(built);
  graph.replay(stream);
  graph.stage_and_launch(std::tie(in), std::forward_as_tuple(std::span<const int>(source.data(), source.size())), stream);
  graph.stage_and_launch(std::make_tuple(in.span()), std::make_tuple(std::span<const int>(source)), stream);
  graph.capture_begin({.stream = tp::StreamRef(cudaStreamPerThread)});
  graph.reset();
  tp::DeviceTensor<int> freed(10, stream);
  freed.reset();
}

void rebinding(tp::GraphBuckets<std::function<void(tp::StreamRef, std::size_t)>>& buckets, tp::PiecewiseGraph& pieces) {
  tp::Stream stream;
  constexpr std::size_t n = 1000;
  tp::DeviceTensor<float> x(n, stream), y(n, stream), spare(n, stream);
  tp::Graph graph;
  graph.capture([&](tp::StreamRef s) { work(x.data(), x.bytes(), s); }, {.stream = stream});
  const tp::RebindResult r = graph.rebind(x, y);
  graph.rebind(y, spare.span());
  graph.rebind(spare.span(), tp::TensorView::of(x.data(), n));
  graph.replay(stream);
  std::printf("%zu %zu %zu\n", r.nodes, buckets.rebind(x, y).nodes, pieces.rebind(x, y).nodes);
}

}  // namespace idioms
