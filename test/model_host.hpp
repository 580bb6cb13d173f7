// test/model_host.hpp: the host side of test/model_test.cu: a random generator of operations on
// the public API and a host model that predicts, for each of them, every buffer's value, every
// pool's allocated bytes, which retained objects are alive, and whether (and with which type) the
// call throws. No CUDA and no tensorplay here, so the model runs, and is checked, on a machine
// without a GPU.
//
// The world: 16 buffer slots (DeviceTensor<int>, sizes 64 or 700), 8 graph slots, 4 stream slots
// (plus the legacy default stream), 3 shared pools, 3 bool flags and 3 int counters (one-element
// device tensors that conditional nodes read), 2 GraphBuckets slots (each with its own static
// input and output buffer) and 2 PiecewiseGraph slots. A buffer's value is an affine sequence
// v[i] = base + i * stride (mod 2^32), closed under the kernels used (v = a * w + b), so the model
// is exact. A value can also be unknown: memory a capture allocated is never initialised, and
// pool memory may be overwritten by graphs captured earlier into the same pool (see clobber()).
// The buckets' buffers are written in prefixes (a run writes the rows of its bucket), so the
// model keeps their elements one by one.
//
// Graphs change (update), replay into other captures (a Nested statement: the outer graph gets
// a copy of the inner graph's program, its pool and its retained objects), and retain objects
// whose lifetime the model follows through bundles: each Graph has one bundle (until reset), the
// graph keeps it, and so does every outer graph it was replayed into.
//
// Rebinds (Graph::rebind, PiecewiseGraph::rebind, GraphBuckets::rebind) rewrite the program a
// graph runs: its statements name buffers by uid (the slots only say where they were at capture),
// and a rebind replaces uid `from` by uid `to` in every kernel statement, nested copies included,
// until an update, a reset or a new capture starts from the body's buffers again. A nested copy
// taken afterwards copies the rewritten program; later rebinds of the inner graph leave it alone.
// stage_and_launch copies onto a static buffer where the graph's rebinds moved it (GraphM::moved).
// A buffer dies whatever graph was rebound to it: the graph then uses a dead buffer and, like any
// other such graph, is not replayed (see the section "rebind" of the Model for the other rules).
//
// The ordering rule (what keeps the model exact): work on different streams is unordered, so
// before an operation issues work on stream S that touches a resource (a buffer, a flag, a
// counter, a graph's pool), every *other* stream with unfinished work touching that resource is
// synchronised first (the device, when that stream has been destroyed). Destroying a buffer
// synchronises the streams other than its allocation stream that still use it (its own stream
// orders the free, as with any stream-ordered allocator). Check synchronises the device.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tp_model {

using u32 = std::uint32_t;
using u64 = std::uint64_t;

inline constexpr int buffer_slots = 16;
inline constexpr int graph_slots = 8;
inline constexpr int stream_slots = 4;
inline constexpr int legacy_stream = stream_slots;  // the stream index that names the legacy default stream
inline constexpr int shared_pools = 3;
inline constexpr int flag_count = 3;
inline constexpr int counter_count = 3;
inline constexpr std::array<std::size_t, 2> buffer_sizes = {64, 700};
inline constexpr int max_depth = 3;      // conditional nesting
inline constexpr int max_count = 3;      // counters stay in [-1, max_count]: while loops run at most 3 times
inline constexpr int max_statements = 12;
inline constexpr int bucket_slots = 2;
inline constexpr int piece_slots = 2;
inline constexpr int default_pool = -1;  // the model pool id of the device's default pool

//! Bytes a pool counts for a live tensor of n ints (Pool::allocated_bytes rounds to 512).
inline std::size_t pool_bytes(std::size_t n) { return (n * 4 + 511) / 512 * 512; }

// Stream uids that no slot holds.
inline constexpr int legacy_uid = 1;
inline constexpr int side_uid = 2;  // the library's own streams (side stream, body streams): never given eager work

//! Deterministic everywhere: mt19937_64 is fully specified, and no std distribution is used.
class Rng {
 public:
  explicit Rng(u64 seed) : engine_(seed) {}
  int below(int n) { return static_cast<int>(engine_() % static_cast<u64>(n)); }
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }
  bool percent(int p) { return below(100) < p; }
  u32 word() { return static_cast<u32>(engine_()); }
  template <class T>
  T pick(const std::vector<T>& from) { return from[static_cast<std::size_t>(below(static_cast<int>(from.size())))]; }
  //! An index drawn with the given weights (0: never); -1 when all are 0.
  int weighted(const std::vector<int>& weights) {
    int total = 0;
    for (int w : weights) total += w;
    if (total == 0) return -1;
    int r = below(total);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (r < weights[i]) return static_cast<int>(i);
      r -= weights[i];
    }
    return -1;
  }

 private:
  std::mt19937_64 engine_;
};

// ---- values --------------------------------------------------------------------------------

struct Value {
  bool known = false;
  u32 base = 0;
  u32 stride = 0;
  [[nodiscard]] u32 at(std::size_t i) const { return base + static_cast<u32>(i) * stride; }
};
inline Value affine(Value v, u32 a, u32 b) { return v.known ? Value{true, a * v.base + b, a * v.stride} : v; }
inline Value sequence(u32 base, u32 stride) { return {true, base, stride}; }

// ---- captured programs -----------------------------------------------------------------------

enum class StmtKind : std::uint8_t {
  Fill,            // dst = {a, b}
  Affine,          // dst = a * src + b
  Temp,            // t = a * src + b in a tensor allocated and freed inside the capture; dst = c * t + d
  Alloc,           // a new tensor allocated inside the capture, kept in slot dst_slot; = a * src + b, or {c, d} without src
  SideAlloc,       // inside the body, eagerly, on stream slot `index` (not captured): a new tensor = {a, b}
  SetFlag,         // flag[index] = a != 0
  SetCounter,      // counter[index] = a
  If,              // flag[index] ? bodies[0]
  IfElse,          // flag[index] ? bodies[0] : bodies[1]
  While,           // while counter[index] > 0 { bodies[0]; --counter[index] }; `flag` (if >= 0) mirrors counter > 0
  Switch,          // bodies[counter[index]] when in range, else nothing
  BadPredicate,    // if_ with a two-element predicate: usage_error, the capture goes on
  EndWithoutBody,  // end_capture_to_conditional_node at the top level: usage_error, the capture goes on
  Nested,          // graph slot `index` replayed into this capture (a child graph: bodies[0] is its program
                   // then, `inner_pool`/`inner_seq` its pool and capture); flag 1: refused with usage_error
                   // (it holds conditional nodes, or nothing); form 0: replay(stream), 1: replay()
  Throw,           // the body throws a user exception (always the last statement)
  Forbidden,       // index 0: cudaStreamSynchronize(capture stream); 1: cudaDeviceSynchronize (always the last)
};
inline constexpr int stmt_kind_count = 16;

//! How a conditional body is written: if_(p, [](StreamRef){}), if_(p, []{}), begin_capture_to_if_node
//! ... end_capture_to_conditional_node, or an IfScope / WhileScope.
enum class BodyForm : std::uint8_t { LambdaWithStream, LambdaNoArg, Imperative, Scope };
//! The predicate (or switch index): the device tensor itself, or a functor reading it on the device.
enum class PredForm : std::uint8_t { Tensor, Functor, CounterFunctor };

struct Stmt {
  StmtKind kind{};
  int dst_slot = -1;
  int dst = 0;  // buffer uid
  int src_slot = -1;
  int src = 0;  // buffer uid, 0: none
  std::size_t n = 0;
  u32 a = 0, b = 0, c = 0, d = 0;
  int index = 0;
  int flag = -1;
  BodyForm form{};
  PredForm pred{};
  bool on_current_stream = false;  // Alloc / Temp: DeviceTensor(n) instead of DeviceTensor(n, stream)
  int inner_pool = -1;             // Nested: the inner graph's pool and capture sequence (its temporaries)
  long inner_seq = 0;
  int bundle = 0;                  // Nested: the inner graph's bundle (what the outer graph keeps alive)
  bool rebound = false;            // Nested: the inner graph had been rebound (its copy runs as rebound)
  std::vector<std::vector<Stmt>> bodies;
};
using Block = std::vector<Stmt>;

// ---- operations ------------------------------------------------------------------------------

enum class OpKind : std::uint8_t {
  NewStream, DestroyStream, MoveStream, SyncStream,
  NewBuffer, DestroyBuffer, MoveBuffer, EagerFill, EagerAffine, HostWrite, SetFlag, SetCounter,
  NewGraph, DestroyGraph, MoveGraph, ResetGraph,
  Capture, Round, ReplayEmpty, StageMisuse, SimpleMisuse, DebugDump, PoolChecks, DropPool, Check,
  Update,         // graph.update(body, options) of slot cap.slot; update_outcome: what UpdateResult must say
  Retain,         // graph a retains object x: sub 0 a shared_ptr, 1 a move-only object
  BucketNew,      // GraphBuckets slot a made anew (its buffers too) with `bucket`; constructed on `stream`
  BucketRun,      // slot a: sub 0 run(n, stream), 1 staged run (input b: 0 device, 1 host, values {x, y}),
                  // 2 capture_all(stream), 3 staged run with an input of a wrong size; z 1: the body throws
  BucketDestroy,  // slot a: sub 0 the GraphBuckets only (its runs may still run), 1 its buffers too
  PieceNew,       // PiecewiseGraph slot a made anew; x: GraphOptions::pool (shared index, -1 none)
  PieceAppend,    // slot a: sub 0 capture(cap) (a segment), 1 eager(step cap.program) (b 1: step())
  PieceReplay,    // slot a: replay(stream)
  PieceDestroy,   // slot a
  Rebind,         // graph a: rebind(buffer b, buffer x); sub 0 as drawn, 1 a `to` smaller than `from`, 2 overlapping
                  // spans of b; n: the nodes RebindResult must count, when y is 1
  PieceRebind,    // PiecewiseGraph a: rebind(buffer b, buffer x), as Rebind
  BucketRebind,   // GraphBuckets a: rebind(b, x), as Rebind; b and x name a buffer slot, or the
                  // buckets' own x (bucket_x) or y (bucket_y)
  Quiesce,
};
inline constexpr int op_kind_count = 38;
//! BucketRebind's names of a GraphBuckets slot's own buffers (buffer slots are 0 .. buffer_slots - 1).
inline constexpr int bucket_x = buffer_slots;
inline constexpr int bucket_y = buffer_slots + 1;

enum class Outcome : std::uint8_t { Ok, Usage, Cuda, User };

enum class Variant : std::uint8_t {
  Lambda,           // graph.capture(body, options)
  Manual,           // capture_begin, statements, capture_end
  BeginTwice,       // Manual, with a second capture_begin (usage_error) right after the first
  Interleaved,      // two graphs capture at once on two streams, statements interleaved
  PoolBusy,         // a second graph tries to capture into the same shared pool meanwhile: usage_error
  StreamBusy,       // a second graph tries to capture on the same stream meanwhile: usage_error
  StreamDestroyed,  // the capture stream is destroyed before capture_end: usage_error, nothing capturing
  GraphDestroyed,   // the graph is destroyed while capturing
  GraphReset,       // reset() while capturing
  MovedMidCapture,  // the capturing graph is moved to another slot halfway; the capture ends there
};
inline constexpr int variant_count = 10;

//! Where a capture runs: CaptureOptions::stream = slot; StreamGuard(slot) and no option;
//! no option with the legacy stream current (the library's side stream); StreamRef{} given.
enum class StreamMode : std::uint8_t { Explicit, Guard, Current, ExplicitLegacy };

struct CaptureSide {
  int slot = -1;
  int pool = -1;  // CaptureOptions::pool: shared pool index, -1: not set
  int mode = -1;  // CaptureOptions::capture_error_mode (0 global, 1 thread_local, 2 relaxed), -1: not set
  StreamMode stream_mode = StreamMode::Explicit;
  int stream = -1;  // stream slot (Explicit, Guard)
  bool body_takes_stream = true;
  Block program;
  Outcome expect = Outcome::Ok;
};

struct StagePair {
  int static_slot = -1;
  int static_uid = 0;
  int input = 0;  // 0: another live buffer, 1: a fresh DeviceTensor filled from the host, 2: host memory
  int input_slot = -1;
  int input_uid = 0;
  u32 base = 0, stride = 0;  // fresh or host input
};

struct ReplayItem {
  int slot = -1;
  int how = 0;  // 0: replay(stream), 1: replay() under a StreamGuard, 2: stage_and_launch(.., stream), 3: stage_and_launch(..)
  std::vector<StagePair> pairs;
};

//! How a GraphBuckets slot is made: the ladder, BucketOptions, and its body, which for a bucket of
//! `size` rows of k elements writes t = a1 * x + b1 into a temporary, then y = a2 * t + b2, over
//! the first k * size elements of its buffers x and y (each of k * (largest + 2) elements).
struct BucketSpec {
  std::vector<std::size_t> ladder;
  std::size_t k = 1;
  bool lazy = true, share = false, zero_fill = false, overflow_throw = false;
  std::size_t max_exec = 0;
  int pool = -1;  // BucketOptions::pool: shared index, -1 none
  u32 a1 = 0, b1 = 0, a2 = 0, b2 = 0;
  u32 x0 = 0, xs = 0, y0 = 0, ys = 0;  // the buffers' first contents
  [[nodiscard]] std::size_t capacity() const { return k * (ladder.back() + 2); }
};

struct Op {
  OpKind kind{};
  int sub = 0;
  int a = -1, b = -1;  // slots (meaning depends on the kind)
  int stream = -1;     // stream slot, legacy_stream for the legacy default stream
  std::size_t n = 0;
  u32 x = 0, y = 0, z = 0;
  Variant variant = Variant::Lambda;
  CaptureSide cap, cap2;  // cap2: Interleaved, PoolBusy, StreamBusy (only slot/pool/stream), MovedMidCapture (slot)
  int split = 0;          // MovedMidCapture: top-level statements issued before the move
  bool second_ends_first = false;
  std::vector<ReplayItem> items;
  std::vector<std::pair<int, int>> pool_expectations;  // PoolChecks: (graph slot, shared index)
  std::vector<int> syncs;  // stream slots to synchronise first; -1: the device
  Outcome expect = Outcome::Ok;
  int update_outcome = 0;  // Update: 0 either, 1 Updated, 2 Reinstantiated (when the model knows)
  BucketSpec bucket;       // BucketNew
};

// ---- the model's state -------------------------------------------------------------------------

struct BufferM {
  std::size_t n = 0;
  Value value{};
  int pool = -1;         // model pool id; -1: the default pool
  long seq = 0;          // the capture that allocated it (graph pools)
  int alloc_stream = 0;  // stream uid it was allocated for
  bool in_body = false;  // allocated inside a conditional body (written only when that body runs)
};

struct GraphM {
  bool exists = false;
  int opt_pool = -1;    // GraphOptions::pool (model pool id), -1: none
  int opt_shared = -1;  // its shared index
  int opt_mode = 0;
  bool captured = false;
  long seq = 0;   // capture sequence number
  int pool = -1;  // model pool id of the capture (its temporaries live there)
  int gpool = -1; // the pool Graph::pool() returns without making one: GraphOptions::pool, or the pool
                  // of the last capture that had or made one; -1: none yet (pool() would make one)
  int bundle = 0;    // its keep-alive bundle (retained objects), new at construction and reset()
  int instance = 0;  // its captured graphs and executables (they keep bundles of nested graphs)
  int stage_state = 0;  // 1 staged, 2 then replayed, 3 then updated in place: the next staged call must copy
  bool conditional = false;
  Block program;             // as it runs now: rebinds rewrite its buffers (Fill, Affine, Temp, Alloc, nested copies)
  std::vector<int> buffers;  // uids of the buffers the program uses (all must be alive to replay)
  std::set<u64> touches;     // resources the program reads or writes
  // Rebinds since the program was captured (a capture, an update and reset() drop them):
  int rebinds = 0;            // rebinds that moved nodes
  std::map<int, int> moved;   // stage_and_launch's map: a buffer named as captured (or as a rebind named
                              // it) -> the buffer its bytes are in now (RebindMap, by whole buffers)
  bool map_unknown = false;   // a rebind whose nodes the model could not count (a buffer of the program
                              // had died): the real map may differ; no stage_and_launch overlap checks
};

//! A GraphBuckets slot: its buffers (alive from BucketNew to BucketDestroy sub 1) and the object.
struct BucketM {
  bool exists = false;   // the GraphBuckets
  bool buffers = false;  // x and y
  int id = 0;            // resource id of x and y
  BucketSpec spec;
  int pool = -1;
  std::vector<u32> x, y;
  std::vector<bool> x_known, y_known;  // elements the model knows (a run that read a rebound buffer it did not know)
  std::vector<bool> captured;
  // Where each captured bucket's graph reads x and writes y now (GraphBuckets::rebind): loc_x (1),
  // loc_y (2), or the uid of a buffer of a slot. A capture starts from x and y.
  std::vector<int> x_at, y_at;
  std::vector<u64> last_use;
  std::vector<long> seq;
  u64 clock = 0;
};

//! A piece of a PiecewiseGraph: a captured segment, or an eager step (Fill and Affine only).
struct PieceM {
  bool step = false;
  Block program;
  long seq = 0;
};

struct PiecewiseM {
  bool exists = false;
  int pool = -1;
  int opt_shared = -1;
  int instance = 0;
  std::size_t count = 0;  // segments(): segments and steps appended
  std::vector<PieceM> pieces;  // segments as they run now (PiecewiseGraph::rebind rewrites them)
  int rebinds = 0;             // rebinds that moved nodes
};

//! Who keeps a bundle: its graph while that graph lives and has not been reset, and (maybe)
//! every outer graph instance that a capture of it was replayed into.
struct BundleM {
  bool owner = true;
  std::set<int> holders;  // instances of outer graphs (graph or piecewise) that nested it
};

inline u64 res_buffer(int uid) { return (u64{1} << 40) | static_cast<u64>(uid); }
inline u64 res_flag(int f) { return (u64{2} << 40) | static_cast<u64>(f); }
inline u64 res_counter(int c) { return (u64{3} << 40) | static_cast<u64>(c); }
inline u64 res_pool(int id) { return (u64{4} << 40) | static_cast<u64>(id); }
inline constexpr int loc_x = 1;  // BucketM::x_at / y_at: the buckets' own x and y (buffer uids start at 100)
inline constexpr int loc_y = 2;

struct State {
  std::array<int, buffer_slots> buf{};  // buffer uid per slot, 0: empty
  std::map<int, BufferM> buffers;       // live buffers
  std::array<GraphM, graph_slots> graphs{};
  std::array<int, stream_slots> stream{};  // stream uid per slot, 0: none
  std::map<int, std::set<u64>> pending;    // stream uid -> resources its unfinished work touches
  std::set<int> dead;                      // destroyed streams that may still have work
  std::array<bool, flag_count> flag{};
  std::array<int, counter_count> counter{};
  std::array<int, shared_pools> shared{1, 2, 3};  // model pool ids of the shared pools (the test's handles)
  std::set<int> ever_shared{1, 2, 3};             // every pool that was shared (graphs may still use it)
  std::array<BucketM, bucket_slots> buckets{};
  std::array<PiecewiseM, piece_slots> pieces{};
  std::map<int, int> retained;  // object id -> bundle
  std::map<int, BundleM> bundles;
  std::set<int> checked_released;  // objects a Check found released: forgotten at the next operation
  int next_uid = 100;
  int next_pool = 10;
  long next_seq = 1;
};

inline u64 res_bucket(int id) { return (u64{5} << 40) | static_cast<u64>(id); }

//! Bytes the model says pool `pool` has allocated (default_pool: the model's part of it).
inline std::size_t allocated_in(const State& s, int pool) {
  std::size_t bytes = 0;
  for (const auto& [uid, b] : s.buffers)
    if (b.pool == pool) bytes += pool_bytes(b.n);
  if (pool == default_pool)
    for (const BucketM& b : s.buckets)
      if (b.buffers) bytes += 2 * pool_bytes(b.spec.capacity());
  return bytes;
}

//! Bundles that the Nested statements of `block` (not those inside them) name.
inline void nested_bundles(const Block& block, std::set<int>& out) {
  for (const Stmt& st : block) {
    if (st.kind == StmtKind::Nested) {
      if (st.flag == 0) out.insert(st.bundle);
      continue;
    }
    for (const Block& body : st.bodies) nested_bundles(body, out);
  }
}

//! What the model knows of a retained object now: 1 alive, -1 released (once the device is
//! idle and the reaper ran), 0 either (an outer graph that may still hold it).
inline int retained_expectation(const State& s, int object) {
  const int bundle = s.retained.at(object);
  const BundleM& b = s.bundles.at(bundle);
  if (b.owner) return 1;
  std::set<int> direct;  // bundles the current programs hold for sure
  std::set<int> live;    // live instances
  for (const GraphM& g : s.graphs) {
    if (!g.exists) continue;
    live.insert(g.instance);
    if (g.captured) nested_bundles(g.program, direct);
  }
  for (const PiecewiseM& p : s.pieces) {
    if (!p.exists) continue;
    live.insert(p.instance);
    for (const PieceM& piece : p.pieces) nested_bundles(piece.program, direct);
  }
  if (direct.count(bundle)) return 1;
  for (int h : b.holders)
    if (live.count(h)) return 0;
  return -1;
}

// ---- descriptions (the failure trace) ---------------------------------------------------------

inline const char* name(OpKind k) {
  static const char* const names[] = {"NewStream", "DestroyStream", "MoveStream", "SyncStream", "NewBuffer",
                                      "DestroyBuffer", "MoveBuffer", "EagerFill", "EagerAffine", "HostWrite",
                                      "SetFlag", "SetCounter", "NewGraph", "DestroyGraph", "MoveGraph",
                                      "ResetGraph", "Capture", "Round", "ReplayEmpty", "StageMisuse",
                                      "SimpleMisuse", "DebugDump", "PoolChecks", "DropPool", "Check", "Update",
                                      "Retain", "BucketNew", "BucketRun", "BucketDestroy", "PieceNew", "PieceAppend",
                                      "PieceReplay", "PieceDestroy", "Rebind", "PieceRebind", "BucketRebind",
                                      "Quiesce"};
  return names[static_cast<int>(k)];
}
inline const char* name(StmtKind k) {
  static const char* const names[] = {"fill", "affine", "temp", "alloc", "side_alloc", "set_flag", "set_counter", "if",
                                      "if_else", "while", "switch", "bad_predicate", "end_without_body", "nested",
                                      "throw", "forbidden"};
  return names[static_cast<int>(k)];
}
inline const char* name(Variant v) {
  static const char* const names[] = {"lambda", "manual", "begin_twice", "interleaved", "pool_busy", "stream_busy",
                                      "stream_destroyed", "graph_destroyed", "graph_reset", "moved_mid_capture"};
  return names[static_cast<int>(v)];
}
inline const char* name(Outcome o) {
  static const char* const names[] = {"ok", "usage_error", "cuda_error", "user exception"};
  return names[static_cast<int>(o)];
}

inline std::string stream_name(int slot) { return slot == legacy_stream ? "legacy" : "s" + std::to_string(slot); }

inline void describe(const Block& block, std::string& out, std::size_t limit) {
  out += '{';
  for (const Stmt& s : block) {
    if (out.size() > limit) {
      out += "...";
      break;
    }
    out += ' ';
    out += name(s.kind);
    switch (s.kind) {
      case StmtKind::Fill: out += " b" + std::to_string(s.dst_slot) + "={" + std::to_string(s.a) + "," + std::to_string(s.b) + "}"; break;
      case StmtKind::Affine:
        out += " b" + std::to_string(s.dst_slot) + "=" + std::to_string(s.a) + "*b" + std::to_string(s.src_slot) + "+" + std::to_string(s.b);
        break;
      case StmtKind::Temp: out += " b" + std::to_string(s.dst_slot) + "<-b" + std::to_string(s.src_slot); break;
      case StmtKind::Alloc:
      case StmtKind::SideAlloc:
        out += " b" + std::to_string(s.dst_slot) + "#" + std::to_string(s.dst) + "[" + std::to_string(s.n) + "]";
        if (s.kind == StmtKind::SideAlloc) out += "@s" + std::to_string(s.index);
        if (s.src != 0) out += "<-b" + std::to_string(s.src_slot);
        break;
      case StmtKind::SetFlag: out += " f" + std::to_string(s.index) + "=" + std::to_string(s.a); break;
      case StmtKind::SetCounter: out += " c" + std::to_string(s.index) + "=" + std::to_string(static_cast<int>(s.a)); break;
      case StmtKind::If:
      case StmtKind::IfElse:
      case StmtKind::While:
      case StmtKind::Switch:
        out += (s.kind == StmtKind::If || s.kind == StmtKind::IfElse) ? " f" : " c";
        out += std::to_string(s.index) + " form" + std::to_string(static_cast<int>(s.form)) + " pred" +
               std::to_string(static_cast<int>(s.pred));
        if (s.flag >= 0) out += " mirror f" + std::to_string(s.flag);
        for (const Block& body : s.bodies) describe(body, out, limit);
        break;
      case StmtKind::Nested:
        out += " g" + std::to_string(s.index) + (s.form == BodyForm::LambdaWithStream ? " replay(s)" : " replay()");
        if (s.flag != 0) {
          out += " refused";
        } else {
          out += " pool" + std::to_string(s.inner_pool) + "@" + std::to_string(s.inner_seq) + " ";
          describe(s.bodies[0], out, limit);
        }
        break;
      case StmtKind::Forbidden: out += s.index == 0 ? " stream_sync" : " device_sync"; break;
      default: break;
    }
    out += ';';
  }
  out += " }";
}

inline std::string describe(const CaptureSide& c) {
  std::string out = "g" + std::to_string(c.slot);
  out += c.pool >= 0 ? " pool=shared" + std::to_string(c.pool) : std::string();
  out += c.mode >= 0 ? " mode=" + std::to_string(c.mode) : std::string();
  static const char* const modes[] = {"explicit", "guard", "current", "explicit_legacy"};
  out += std::string(" stream=") + modes[static_cast<int>(c.stream_mode)];
  if (c.stream >= 0) out += ":" + stream_name(c.stream);
  out += c.body_takes_stream ? " body(s) " : " body() ";
  describe(c.program, out, 600);
  out += std::string(" expect ") + name(c.expect);
  return out;
}

inline std::string describe(const BucketSpec& b) {
  std::string out = "ladder{";
  for (std::size_t size : b.ladder) out += " " + std::to_string(size);
  out += " } k" + std::to_string(b.k) + (b.lazy ? " lazy" : " eager_capture") + (b.share ? " share" : "") +
         (b.zero_fill ? " zero_fill" : "") + (b.overflow_throw ? " overflow_throw" : "") + " max" + std::to_string(b.max_exec) +
         (b.pool >= 0 ? " pool=shared" + std::to_string(b.pool) : "") + " y=" + std::to_string(b.a2) + "*(" + std::to_string(b.a1) +
         "*x+" + std::to_string(b.b1) + ")+" + std::to_string(b.b2);
  return out;
}

inline std::string describe(const Op& op) {
  std::string out = name(op.kind);
  auto field = [&](const char* label, long v) {
    if (v >= 0) out += std::string(" ") + label + std::to_string(v);
  };
  switch (op.kind) {
    case OpKind::Update:
      out += " [" + describe(op.cap) + "]";
      out += op.update_outcome == 0 ? " outcome either" : (op.update_outcome == 1 ? " outcome updated" : " outcome reinstantiated");
      break;
    case OpKind::PieceAppend:
      out += " p" + std::to_string(op.a) + (op.sub == 0 ? " segment [" + describe(op.cap) + "]" : " step");
      if (op.sub == 1) {
        out += op.b == 1 ? "() " : "(s) ";
        describe(op.cap.program, out, 600);
      }
      break;
    case OpKind::BucketNew:
      out += " k" + std::to_string(op.a) + " " + describe(op.bucket) + " on " + stream_name(op.stream);
      break;
    case OpKind::Rebind:
    case OpKind::PieceRebind:
    case OpKind::BucketRebind: {
      auto buffer = [](int slot) {
        return slot == bucket_x ? std::string("x") : (slot == bucket_y ? std::string("y") : "b" + std::to_string(slot));
      };
      out += std::string(" ") + (op.kind == OpKind::Rebind ? "g" : (op.kind == OpKind::PieceRebind ? "p" : "k")) + std::to_string(op.a);
      static const char* const forms[] = {"", " (to smaller)", " (overlapping)"};
      out += " " + buffer(op.b) + "->" + (op.sub == 2 ? buffer(op.b) + "+1" : buffer(static_cast<int>(op.x))) + forms[op.sub];
      out += op.y != 0 ? " nodes " + std::to_string(op.n) : std::string(" nodes ?");
      break;
    }
    case OpKind::Capture:
      out += std::string(" ") + name(op.variant) + " [" + describe(op.cap) + "]";
      if (op.variant == Variant::Interleaved || op.variant == Variant::PoolBusy || op.variant == Variant::StreamBusy ||
          op.variant == Variant::MovedMidCapture)
        out += " second [" + describe(op.cap2) + "] split=" + std::to_string(op.split) +
               (op.second_ends_first ? " second ends first" : "");
      break;
    case OpKind::Round:
      for (const ReplayItem& item : op.items) {
        out += " g" + std::to_string(item.slot) + "/how" + std::to_string(item.how);
        for (const StagePair& p : item.pairs)
          out += " b" + std::to_string(p.static_slot) + "<-" +
                 (p.input == 0 ? "b" + std::to_string(p.input_slot) : (p.input == 1 ? "fresh" : "host")) + "{" +
                 std::to_string(p.base) + "," + std::to_string(p.stride) + "}";
      }
      out += " on " + stream_name(op.stream);
      break;
    default:
      field("sub", op.sub);
      field("a", op.a);
      field("b", op.b);
      if (op.stream >= 0) out += " on " + stream_name(op.stream);
      if (op.n != 0) out += " n" + std::to_string(op.n);
      out += " x" + std::to_string(op.x) + " y" + std::to_string(op.y) + " z" + std::to_string(op.z);
      break;
  }
  if (!op.syncs.empty()) {
    out += " syncs:";
    for (int s : op.syncs) out += " " + (s < 0 ? std::string("device") : stream_name(s));
  }
  out += std::string(" expect ") + name(op.expect);
  return out;
}

// ---- the model ---------------------------------------------------------------------------------

//! How often the model met each interesting situation (the host test checks that all happen).
struct Stats {
  std::array<long, op_kind_count> ops{};
  std::array<long, 4> outcomes{};
  std::array<long, stmt_kind_count> statements{};  // in captures whose body ran
  std::array<long, variant_count> variants{};
  std::array<long, 3> stage_inputs{};
  std::array<long, 3> update_predictions{};  // either, updated, reinstantiated
  long if_taken = 0, if_skipped = 0, while_iterations = 0, switch_taken = 0, switch_none = 0;
  long multi_graph_rounds = 0, clobbered = 0, stream_syncs = 0, device_syncs = 0, dead_stream_syncs = 0;
  long conditional_replays = 0, staged_conditional_replays = 0;
  long nested_runs = 0, nested_refused = 0, nested_in_bodies = 0, nested_after_inner_died = 0;
  long update_adopted_pool = 0;           // an update that allocated, of a graph without a pool (defects 1, 2)
  long staged_after_in_place_update = 0;  // stage, replay, update in place, stage (defect 3)
  long updates_of_staged = 0, updates_with_conditionals = 0;
  long retained_alive = 0, retained_released = 0, retained_unknown = 0;
  long bucket_captures = 0, bucket_evictions = 0, bucket_eager_runs = 0, bucket_zero_fills = 0, bucket_staged_runs = 0;
  long bucket_shared_runs = 0, bucket_throws = 0;
  long piece_replays = 0, piece_steps = 0;
  // Rebinds: that moved nodes, that moved none, to a larger buffer, that moved nodes of a nested copy,
  // whose nodes the model could not count; then replays, staged replays into a moved buffer, nested
  // copies, updates and buffer deaths of rebound graphs; kernels that wrote part of a larger buffer.
  long rebinds_moved = 0, rebinds_unused = 0, rebinds_to_larger = 0, rebinds_of_nested_nodes = 0, rebinds_uncounted = 0;
  long replays_after_rebind = 0, staged_into_rebound = 0, nested_copies_of_rebound = 0, updates_after_rebind = 0;
  long rebound_buffers_destroyed = 0, partial_writes = 0;
  long piece_rebinds_moved = 0, piece_replays_after_rebind = 0, bucket_rebinds_moved = 0, bucket_runs_rebound = 0;
};

inline Op simple_op(OpKind kind, int a = -1) {
  Op op;
  op.kind = kind;
  op.a = a;
  return op;
}

//! Whether a program allocates from its capture's pool (Alloc, Temp; not inside Nested).
inline bool allocates(const Block& block) {
  for (const Stmt& st : block) {
    if (st.kind == StmtKind::Alloc || st.kind == StmtKind::Temp) return true;
    if (st.kind == StmtKind::Nested) continue;
    for (const Block& body : st.bodies)
      if (allocates(body)) return true;
  }
  return false;
}

//! How deep Nested statements nest in a program (0: none).
inline int nest_depth(const Block& block) {
  int depth = 0;
  for (const Stmt& st : block) {
    if (st.kind == StmtKind::Nested && st.flag == 0) depth = std::max(depth, 1 + nest_depth(st.bodies[0]));
    else
      for (const Block& body : st.bodies) depth = std::max(depth, nest_depth(body));
  }
  return depth;
}

//! The nodes a program captures, as text: two programs with the same shape give graphs that
//! cudaGraphExecUpdate accepts (the same kernels in the same order, the same conditional nodes
//! with bodies of the same shape; only parameters differ). Empty when the model cannot say
//! (a nested child graph).
inline bool shape(const Block& block, std::string& out) {
  for (const Stmt& st : block) {
    switch (st.kind) {
      case StmtKind::Fill: out += 'F'; break;
      case StmtKind::Affine: out += 'A'; break;
      case StmtKind::Temp: out += "AA"; break;
      case StmtKind::Alloc: out += st.src != 0 ? 'A' : 'F'; break;
      case StmtKind::SetFlag: out += 'b'; break;
      case StmtKind::SetCounter: out += 'i'; break;
      case StmtKind::If:
      case StmtKind::IfElse:
      case StmtKind::While:
      case StmtKind::Switch:
        out += "(" + std::to_string(static_cast<int>(st.kind)) + "." + std::to_string(static_cast<int>(st.form)) + "." +
               std::to_string(static_cast<int>(st.pred)) + "." + std::to_string(st.flag >= 0) + "." + std::to_string(st.bodies.size());
        for (const Block& body : st.bodies) {
          out += '{';
          if (!shape(body, out)) return false;
          out += '}';
        }
        out += ')';
        break;
      case StmtKind::Nested:
        if (st.flag == 0) return false;
        break;
      default: break;  // SideAlloc, BadPredicate, EndWithoutBody: no node
    }
  }
  return true;
}

//! Top-level kernel nodes of a program, and the kinds of its top-level conditional nodes: two
//! programs with the same conditionals but different kernel counts have different topologies.
inline std::pair<int, std::string> top_nodes(const Block& block) {
  int kernels = 0;
  std::string conditionals;
  for (const Stmt& st : block) {
    switch (st.kind) {
      case StmtKind::Temp: kernels += 2; break;
      case StmtKind::Fill:
      case StmtKind::Affine:
      case StmtKind::Alloc:
      case StmtKind::SetFlag:
      case StmtKind::SetCounter: kernels += 1; break;
      case StmtKind::While:
        kernels += st.flag >= 0 ? 1 : 0;  // arm_flag
        [[fallthrough]];
      case StmtKind::If:
      case StmtKind::IfElse:
      case StmtKind::Switch:
        conditionals += std::to_string(static_cast<int>(st.kind)) + "." + std::to_string(static_cast<int>(st.form)) + "." +
                        std::to_string(static_cast<int>(st.pred)) + ";";
        break;
      case StmtKind::Nested:
        if (st.flag == 0) conditionals += "child;";
        break;
      default: break;
    }
  }
  return {kernels, conditionals};
}

//! What UpdateResult::outcome must be when `after` replaces `before`: 1 Updated, 2
//! Reinstantiated, 0 either.
inline int predict_update(const Block& before, const Block& after) {
  std::string a, b;
  if (shape(before, a) && shape(after, b) && a == b) return 1;
  const auto [ka, ca] = top_nodes(before);
  const auto [kb, cb] = top_nodes(after);
  if (ca == cb && ka != kb) return 2;
  return 0;
}

//! Generates operations and applies them to the host state. next() returns an operation with
//! its expected outcome and the synchronisations to do first; state() is then what the GPU must
//! hold once that operation's work has completed.
class Model {
 public:
  //! `quiesce_every`: every that many operations, destroy everything (random order) and measure.
  //! `without`: names of operations, statements or capture variants never to generate (as
  //! name() spells them), plus "stage" (no stage_and_launch in rounds), "stage_conditional"
  //! (none on graphs with conditional nodes) and "capture_pool_override" (no CaptureOptions::pool
  //! other than the graph's own pool once it has one): to run the rest while a known defect is fixed.
  Model(u64 seed, long quiesce_every, std::set<std::string> without = {})
      : rng_(seed), quiesce_every_(quiesce_every), without_(std::move(without)) {}

  [[nodiscard]] const State& state() const { return s_; }
  //! Why the last applied operation left an impossible state ("" when none).
  [[nodiscard]] const std::string& error() const { return error_; }
  [[nodiscard]] const Stats& stats() const { return stats_; }

  //! A Check now (the end of a run).
  Op check_now() {
    Op op = simple_op(OpKind::Check);
    apply(op);
    return op;
  }

  Op next(long index) {
    if (quiesce_every_ > 0 && index > 0 && index % quiesce_every_ == 0) plan_quiesce();
    Op op;
    if (!forced_.empty()) {
      op = forced_.front();
      forced_.pop_front();
    } else {
      op = generate();
    }
    apply(op);
    check_invariants();
    count(op);
    return op;
  }

 private:
  // ---- small helpers ----

  bool allowed(const char* what) const { return !without_.count(what); }
  //! `weights` with those of excluded names (names[i]) set to 0.
  template <class Kind>
  std::vector<int> allowed_weights(std::vector<int> weights) const {
    for (std::size_t i = 0; i < weights.size(); ++i)
      if (!allowed(name(static_cast<Kind>(i)))) weights[i] = 0;
    return weights;
  }

  //! A default-constructed Graph (also what a moved-from Graph is): a new bundle and instance.
  GraphM fresh_graph() {
    GraphM g;
    g.exists = true;
    g.bundle = new_bundle();
    g.instance = s_.next_uid++;
    return g;
  }
  int new_bundle() {
    const int id = s_.next_uid++;
    s_.bundles[id] = BundleM{};
    return id;
  }
  //! The Graph's own reference to its bundle goes (destroyed, reset, overwritten).
  void drop_bundle(const GraphM& g) {
    if (!g.exists) return;
    auto it = s_.bundles.find(g.bundle);
    if (it != s_.bundles.end()) it->second.owner = false;
  }

  void count(const Op& op) {
    stats_.ops[static_cast<int>(op.kind)] += 1;
    stats_.outcomes[static_cast<int>(op.expect)] += 1;
    if (op.kind == OpKind::Capture) {
      stats_.variants[static_cast<int>(op.variant)] += 1;
      if (op.cap.expect != Outcome::Usage) count(op.cap.program, 0);
      if (op.variant == Variant::Interleaved) count(op.cap2.program, 0);
    }
    if ((op.kind == OpKind::Update || op.kind == OpKind::PieceAppend) && op.expect != Outcome::Usage) count(op.cap.program, 0);
    if (op.kind == OpKind::Update && op.expect == Outcome::Ok) stats_.update_predictions[static_cast<std::size_t>(op.update_outcome)] += 1;
    if (op.kind == OpKind::Round) {
      if (op.items.size() > 1) stats_.multi_graph_rounds += 1;
      for (const ReplayItem& item : op.items)
        for (const StagePair& p : item.pairs) stats_.stage_inputs[static_cast<std::size_t>(p.input)] += 1;
    }
    for (int sync : op.syncs) (sync < 0 ? stats_.device_syncs : stats_.stream_syncs) += 1;
  }
  void count(const Block& block, int depth) {
    for (const Stmt& st : block) {
      stats_.statements[static_cast<int>(st.kind)] += 1;
      if (st.kind == StmtKind::Nested) {
        if (st.flag != 0) stats_.nested_refused += 1;
        else if (depth > 0) stats_.nested_in_bodies += 1;
        if (st.flag == 0 && st.rebound) stats_.nested_copies_of_rebound += 1;
        continue;
      }
      for (const Block& body : st.bodies) count(body, depth + 1);
    }
  }

  int stream_uid(int slot) const { return slot == legacy_stream ? legacy_uid : s_.stream[slot]; }
  int stream_slot_of(int uid) const {
    if (uid == legacy_uid) return legacy_stream;
    for (int i = 0; i < stream_slots; ++i)
      if (s_.stream[i] == uid) return i;
    return -1;
  }
  //! The slots i < count for which holds(i).
  template <class Holds>
  static std::vector<int> slots_where(int count, Holds holds) {
    std::vector<int> out;
    for (int i = 0; i < count; ++i)
      if (holds(i)) out.push_back(i);
    return out;
  }
  std::vector<int> live_streams() const {
    return slots_where(stream_slots, [&](int i) { return s_.stream[i] != 0; });
  }
  //! A stream for eager work or replays: a live slot, or (1 in 8, or when none) the legacy stream.
  int any_stream() {
    std::vector<int> live = live_streams();
    if (live.empty() || rng_.below(8) == 0) return legacy_stream;
    return rng_.pick(live);
  }
  std::vector<int> buffer_slots_where(std::size_t n = 0) const {
    return slots_where(buffer_slots, [&](int i) { return s_.buf[i] != 0 && (n == 0 || s_.buffers.at(s_.buf[i]).n == n); });
  }
  std::vector<int> graph_slots_where(int captured /* -1 any, 0 not captured, 1 captured */) const {
    return slots_where(graph_slots, [&](int i) {
      const GraphM& g = s_.graphs[i];
      return g.exists && (captured < 0 || g.captured == (captured == 1));
    });
  }
  bool alive(const std::vector<int>& uids) const {
    for (int uid : uids)
      if (!s_.buffers.count(uid)) return false;
    return true;
  }
  bool replayable(const GraphM& g) const { return g.exists && g.captured && alive(g.buffers); }
  int shared_index(int pool) const {
    for (int k = 0; k < shared_pools; ++k)
      if (s_.shared[k] == pool) return k;
    return -1;
  }
  std::size_t any_size() { return buffer_sizes[static_cast<std::size_t>(rng_.below(2))]; }
  u32 small() { return static_cast<u32>(rng_.between(0, 9)); }
  void fail(const std::string& why) {
    if (error_.empty()) error_ = why;
  }

  void buffer_resources(int uid, std::set<u64>& out) const {
    out.insert(res_buffer(uid));
    const BufferM& b = s_.buffers.at(uid);
    if (b.pool >= 0) out.insert(res_pool(b.pool));  // pool memory: replays of that pool may overwrite it
  }
  //! Every buffer of `pool` counts as touched by work that runs the pool's temporaries: memory
  //! that later captures allocated may lie where earlier graphs keep their temporaries.
  void pool_resources(int pool, std::set<u64>& out) const {
    out.insert(res_pool(pool));
    for (const auto& [uid, b] : s_.buffers)
      if (b.pool == pool) out.insert(res_buffer(uid));
  }
  //! The pools whose temporaries a program's replay runs: its nested graphs' (recursively).
  static void nested_pools(const Block& block, std::set<int>& out) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Nested) {
        if (st.flag == 0) {
          out.insert(st.inner_pool);
          nested_pools(st.bodies[0], out);
        }
        continue;
      }
      for (const Block& body : st.bodies) nested_pools(body, out);
    }
  }
  //! Buffers a program writes (statics that it does not write show what staging copied).
  static void written(const Block& block, std::set<int>& out) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Fill || st.kind == StmtKind::Affine || st.kind == StmtKind::Temp || st.kind == StmtKind::Alloc)
        out.insert(st.dst);
      for (const Block& body : st.bodies) written(body, out);
    }
  }

  // ---- the ordering rule ----

  void sync_stream_uid(Op& op, int uid) {
    if (s_.dead.count(uid) || stream_slot_of(uid) < 0) {
      stats_.dead_stream_syncs += 1;
      op.syncs.push_back(-1);
      s_.pending.clear();
      s_.dead.clear();
    } else {
      op.syncs.push_back(stream_slot_of(uid));
      s_.pending.erase(uid);
    }
  }
  //! Work on stream `uid` is about to touch `touched`: synchronise every other stream whose
  //! unfinished work touches any of it.
  void order_before(Op& op, int uid, const std::set<u64>& touched) {
    for (bool again = true; again;) {
      again = false;
      for (const auto& [other, resources] : s_.pending) {
        if (other == uid) continue;
        const bool overlaps = std::any_of(resources.begin(), resources.end(), [&](u64 r) { return touched.count(r) != 0; });
        if (overlaps) {
          sync_stream_uid(op, other);
          again = true;  // the map changed
          break;
        }
      }
    }
  }
  void issue(Op& op, int uid, const std::set<u64>& touched) {
    order_before(op, uid, touched);
    s_.pending[uid].insert(touched.begin(), touched.end());
  }
  void device_sync() {
    s_.pending.clear();
    s_.dead.clear();
  }
  //! Synchronises every stream whose unfinished work touches `resource`, except `except`.
  void sync_users(Op& op, u64 resource, int except) {
    for (bool again = true; again;) {
      again = false;
      for (const auto& [other, resources] : s_.pending) {
        if (other != except && resources.count(resource)) {
          sync_stream_uid(op, other);
          again = true;
          break;
        }
      }
    }
  }

  void destroy_buffer(Op& op, int slot) {
    const int uid = s_.buf[slot];
    if (uid == 0) return;
    for (const GraphM& g : s_.graphs)  // a graph rebound to it (or rebound, and still using it) stops replaying
      if (g.captured && g.rebinds > 0 && std::binary_search(g.buffers.begin(), g.buffers.end(), uid)) stats_.rebound_buffers_destroyed += 1;
    sync_users(op, res_buffer(uid), s_.buffers.at(uid).alloc_stream);
    s_.buffers.erase(uid);
    s_.buf[slot] = 0;
  }
  void destroy_stream(int slot) {
    const int uid = s_.stream[slot];
    if (uid == 0) return;
    if (auto it = s_.pending.find(uid); it != s_.pending.end() && !it->second.empty()) s_.dead.insert(uid);
    s_.stream[slot] = 0;
  }
  void destroy_graph(int slot) {
    drop_bundle(s_.graphs[slot]);
    s_.graphs[slot] = GraphM{};
  }
  //! reset(): the executable, the graphs and the bundle go; the options stay.
  void reset_graph(GraphM& g) {
    drop_bundle(g);
    GraphM fresh = fresh_graph();
    fresh.opt_pool = g.opt_pool;
    fresh.opt_shared = g.opt_shared;
    fresh.opt_mode = g.opt_mode;
    fresh.gpool = g.opt_pool;
    g = fresh;
  }
  int new_buffer(int slot, std::size_t n, Value v, int pool, long seq, int alloc_stream) {
    const int uid = s_.next_uid++;
    s_.buffers[uid] = BufferM{n, v, pool, seq, alloc_stream};
    s_.buf[slot] = uid;
    return uid;
  }

  // ---- the program interpreter (a replay) ----

  //! A replay of what capture `seq` captured into `pool` runs its temporaries: they may lie where
  //! captures after it allocated the tensors they keep, and a tensor allocated inside a
  //! conditional body of that capture holds garbage after a replay that skips the body. Such
  //! values become unknown. (Its program cannot name tensors allocated after it: they did not
  //! exist when it was captured. That is why graphs sharing a pool replay in capture order.)
  void clobber(int pool, long seq) {
    for (auto& [uid, b] : s_.buffers)
      if (b.pool == pool && (b.seq > seq || (b.seq == seq && b.in_body))) {
        stats_.clobbered += b.value.known;
        b.value = Value{};
      }
  }

  void run(const Block& block) {
    for (const Stmt& st : block) run(st);
  }
  Value& value(int uid) {
    auto it = s_.buffers.find(uid);
    if (it == s_.buffers.end()) {
      fail("replay of a graph whose buffer #" + std::to_string(uid) + " is gone");
      static Value scratch;
      return scratch;
    }
    return it->second.value;
  }
  //! A kernel over n elements writes buffer `uid`: all of it, or (rebound to a larger buffer) its
  //! front only, which leaves a value that is no affine sequence: unknown. (Reading the front of a
  //! larger buffer reads the same sequence.)
  void write(int uid, std::size_t n, Value v) {
    auto it = s_.buffers.find(uid);
    if (it != s_.buffers.end() && it->second.n != n) {
      stats_.partial_writes += 1;
      v = Value{};
    }
    value(uid) = v;
  }
  void run(const Stmt& st) {
    switch (st.kind) {
      case StmtKind::Fill: write(st.dst, st.n, sequence(st.a, st.b)); break;
      case StmtKind::Affine: write(st.dst, st.n, affine(value(st.src), st.a, st.b)); break;
      case StmtKind::Temp: write(st.dst, st.n, affine(affine(value(st.src), st.a, st.b), st.c, st.d)); break;
      case StmtKind::Alloc: write(st.dst, st.n, st.src != 0 ? affine(value(st.src), st.a, st.b) : sequence(st.c, st.d)); break;
      case StmtKind::SetFlag: s_.flag[st.index] = st.a != 0; break;
      case StmtKind::SetCounter: s_.counter[st.index] = static_cast<int>(st.a); break;
      case StmtKind::If:
        (s_.flag[st.index] ? stats_.if_taken : stats_.if_skipped) += 1;
        if (s_.flag[st.index]) run(st.bodies[0]);
        break;
      case StmtKind::IfElse:
        (s_.flag[st.index] ? stats_.if_taken : stats_.if_skipped) += 1;
        run(st.bodies[s_.flag[st.index] ? 0 : 1]);
        break;
      case StmtKind::While: {
        int& k = s_.counter[st.index];
        if (st.flag >= 0) s_.flag[st.flag] = k > 0;
        for (int iterations = 0; st.flag >= 0 ? s_.flag[st.flag] : k > 0; ++iterations) {
          if (iterations >= max_count) {
            fail("a while loop would run more than " + std::to_string(max_count) + " times");
            return;
          }
          run(st.bodies[0]);
          stats_.while_iterations += 1;
          k -= 1;
          if (st.flag >= 0) s_.flag[st.flag] = k > 0;
        }
        break;
      }
      case StmtKind::Switch: {
        const int k = s_.counter[st.index];
        const bool taken = k >= 0 && k < static_cast<int>(st.bodies.size());
        (taken ? stats_.switch_taken : stats_.switch_none) += 1;
        if (taken) run(st.bodies[static_cast<std::size_t>(k)]);
        break;
      }
      case StmtKind::Nested:
        if (st.flag != 0) break;  // refused at capture: no node
        stats_.nested_runs += 1;
        if (!s_.graphs[st.index].exists || s_.graphs[st.index].bundle != st.bundle) stats_.nested_after_inner_died += 1;
        clobber(st.inner_pool, st.inner_seq);
        run(st.bodies[0]);
        break;
      default: break;  // SideAlloc ran at capture time; misuse statements capture nothing
    }
  }

  // ---- operation generation ----

  Op generate() {
    for (;;) {
      const int k = rng_.weighted(allowed_weights<OpKind>({
          3,   // NewStream
          2,   // DestroyStream
          1,   // MoveStream
          2,   // SyncStream
          6,   // NewBuffer
          3,   // DestroyBuffer
          2,   // MoveBuffer
          5,   // EagerFill
          5,   // EagerAffine
          3,   // HostWrite
          4,   // SetFlag
          4,   // SetCounter
          4,   // NewGraph
          2,   // DestroyGraph
          2,   // MoveGraph
          3,   // ResetGraph
          16,  // Capture
          20,  // Round
          1,   // ReplayEmpty
          2,   // StageMisuse
          2,   // SimpleMisuse
          1,   // DebugDump
          1,   // PoolChecks
          1,   // DropPool
          3,   // Check
          9,   // Update
          2,   // Retain
          1,   // BucketNew
          6,   // BucketRun
          1,   // BucketDestroy
          1,   // PieceNew
          3,   // PieceAppend
          4,   // PieceReplay
          1,   // PieceDestroy
          6,   // Rebind
          2,   // PieceRebind
          2,   // BucketRebind
          0,   // Quiesce (scheduled)
      }));
      if (k < 0) return simple_op(OpKind::Check);
      Op op;
      op.kind = static_cast<OpKind>(k);
      if (fill(op)) return op;
    }
  }

  //! Completes a random operation of op.kind; false when the state does not allow one now.
  bool fill(Op& op) {
    switch (op.kind) {
      case OpKind::NewStream: op.a = rng_.below(stream_slots); return true;
      case OpKind::DestroyStream:
      case OpKind::SyncStream: {
        std::vector<int> live = live_streams();
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        return true;
      }
      case OpKind::MoveStream: return pick_move(op, live_streams(), stream_slots);
      case OpKind::NewBuffer:
        op.a = rng_.below(buffer_slots);
        op.n = any_size();
        op.stream = any_stream();
        op.sub = rng_.below(2);  // 1: DeviceTensor(n) under a StreamGuard
        op.x = rng_.word();
        op.y = small();
        return true;
      case OpKind::DestroyBuffer:
      case OpKind::EagerFill:
      case OpKind::HostWrite: {
        std::vector<int> live = buffer_slots_where();
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        op.stream = any_stream();
        op.sub = rng_.below(2);  // HostWrite: 1 = the current-stream overload under a StreamGuard
        op.x = rng_.word();
        op.y = small();
        return true;
      }
      case OpKind::MoveBuffer: return pick_move(op, buffer_slots_where(), buffer_slots);
      case OpKind::EagerAffine: {
        std::vector<int> live = buffer_slots_where();
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        op.b = rng_.pick(buffer_slots_where(s_.buffers.at(s_.buf[op.a]).n));
        op.stream = any_stream();
        op.x = small();
        op.y = rng_.word();
        return true;
      }
      case OpKind::SetFlag:
        op.a = rng_.below(flag_count);
        op.x = static_cast<u32>(rng_.below(2));
        op.stream = any_stream();
        return true;
      case OpKind::SetCounter:
        op.a = rng_.below(counter_count);
        op.x = static_cast<u32>(rng_.between(-1, max_count));
        op.stream = any_stream();
        return true;
      case OpKind::NewGraph:
        op.a = rng_.below(graph_slots);
        op.x = static_cast<u32>(rng_.percent(40) ? rng_.below(shared_pools) : -1);  // GraphOptions::pool
        op.y = static_cast<u32>(rng_.below(3));                                      // GraphOptions::capture_error_mode
        op.z = static_cast<u32>(rng_.percent(20));                                   // GraphOptions::upload
        return true;
      case OpKind::DestroyGraph:
      case OpKind::ResetGraph:
      case OpKind::DebugDump: {
        std::vector<int> live = graph_slots_where(-1);
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        op.sub = rng_.below(2);  // DebugDump: 1 = enable_debug_mode first
        return true;
      }
      case OpKind::MoveGraph: return pick_move(op, graph_slots_where(-1), graph_slots);
      case OpKind::Capture: return fill_capture(op);
      case OpKind::Round: return fill_round(op);
      case OpKind::ReplayEmpty: {
        std::vector<int> empty = graph_slots_where(0);
        std::vector<int> live = buffer_slots_where();
        if (empty.empty() || live.empty()) return false;
        op.a = rng_.pick(empty);
        op.b = rng_.pick(live);
        op.sub = rng_.below(4);  // like ReplayItem::how
        op.stream = any_stream();
        return true;
      }
      case OpKind::StageMisuse: {
        std::vector<int> graphs = graph_slots_where(-1);
        std::vector<int> live = buffer_slots_where();
        if (graphs.empty() || live.size() < 2) return false;
        op.a = rng_.pick(graphs);
        op.b = rng_.pick(live);
        op.sub = rng_.below(4);  // 0 size mismatch (device), 1 size mismatch (host), 2 overlap, 3 same static twice
        op.stream = any_stream();
        // The overlap is judged where rebinds moved the static buffer: it must still be there.
        if (op.sub == 2 && (!stage_map_known(s_.graphs[op.a]) || s_.graphs[op.a].moved.count(s_.buf[op.b]))) return false;
        return true;
      }
      case OpKind::SimpleMisuse: {
        std::vector<int> graphs = graph_slots_where(-1);
        if (graphs.empty()) return false;
        op.a = rng_.pick(graphs);
        op.sub = rng_.below(4);  // capture_end, end_capture_to_conditional_node, if_, set_conditional_handle_for_current_node
        return true;
      }
      case OpKind::DropPool: op.a = rng_.below(shared_pools); return true;
      case OpKind::PoolChecks:
      case OpKind::Check: return true;
      case OpKind::Update: return fill_update(op);
      case OpKind::Retain: {
        std::vector<int> graphs = graph_slots_where(-1);
        if (graphs.empty()) return false;
        op.a = rng_.pick(graphs);
        op.sub = rng_.below(2);
        op.x = static_cast<u32>(s_.next_uid++);
        return true;
      }
      case OpKind::BucketNew: return fill_bucket_new(op);
      case OpKind::BucketRun: return fill_bucket_run(op);
      case OpKind::BucketDestroy: {
        const std::vector<int> live = slots_where(bucket_slots, [&](int i) { return s_.buckets[i].buffers; });
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        op.sub = s_.buckets[op.a].exists ? rng_.below(2) : 1;
        return true;
      }
      case OpKind::PieceNew:
        op.a = rng_.below(piece_slots);
        op.x = static_cast<u32>(rng_.percent(40) ? rng_.below(shared_pools) : -1);
        return true;
      case OpKind::PieceAppend: return fill_piece_append(op);
      case OpKind::PieceReplay:
      case OpKind::PieceDestroy: {
        // A replay: every buffer its pieces use alive (none appended: usage_error).
        const std::vector<int> live = slots_where(piece_slots, [&](int i) {
          return s_.pieces[i].exists && (op.kind == OpKind::PieceDestroy || piece_replayable(s_.pieces[i]));
        });
        if (live.empty()) return false;
        op.a = rng_.pick(live);
        op.stream = any_stream();
        return true;
      }
      case OpKind::Rebind: return fill_rebind(op);
      case OpKind::PieceRebind: return fill_piece_rebind(op);
      case OpKind::BucketRebind: return fill_bucket_rebind(op);
      case OpKind::Quiesce: return false;
    }
    return false;
  }

  //! A move from a live slot (op.a) to another slot (op.b), which may hold an object that then dies.
  bool pick_move(Op& op, const std::vector<int>& live, int slots) {
    if (live.empty()) return false;
    op.a = rng_.pick(live);
    op.b = rng_.below(slots);
    return op.a != op.b;
  }

  //! Every live graph, buffer, stream, bucket slot and piecewise graph destroyed in a random
  //! order, then Quiesce.
  void plan_quiesce() {
    std::vector<Op> ops;
    for (int i = 0; i < graph_slots; ++i)
      if (s_.graphs[i].exists) ops.push_back(simple_op(OpKind::DestroyGraph, i));
    for (int i = 0; i < buffer_slots; ++i)
      if (s_.buf[i] != 0) ops.push_back(simple_op(OpKind::DestroyBuffer, i));
    for (int i = 0; i < stream_slots; ++i)
      if (s_.stream[i] != 0) ops.push_back(simple_op(OpKind::DestroyStream, i));
    for (int i = 0; i < bucket_slots; ++i)
      if (s_.buckets[i].buffers) {
        ops.push_back(simple_op(OpKind::BucketDestroy, i));
        ops.back().sub = 1;
      }
    for (int i = 0; i < piece_slots; ++i)
      if (s_.pieces[i].exists) ops.push_back(simple_op(OpKind::PieceDestroy, i));
    for (std::size_t i = ops.size(); i > 1; --i) std::swap(ops[i - 1], ops[static_cast<std::size_t>(rng_.below(static_cast<int>(i)))]);
    forced_.insert(forced_.end(), ops.begin(), ops.end());  // after the Checks forced before
    forced_.push_back(simple_op(OpKind::Quiesce));
  }

  // ---- programs ----

  //! What a program may use while it is generated.
  struct GenCtx {
    std::array<int, buffer_slots> uid{};              // buffer uid per slot at this point of the program
    std::array<std::size_t, buffer_slots> n{};
    std::set<int> used;                               // uids referenced (not to be replaced later)
    std::set<int> fresh;                              // slots filled by this program (not replaced again)
    std::set<int> no_target;                          // slots that must not be replaced
    std::set<int> side_streams_excluded;              // stream slots SideAlloc must not use
    std::set<int> nested_excluded;                    // graph slots Nested must not replay (the capturing ones)
    std::array<bool, flag_count> flag_locked{};
    std::array<bool, counter_count> counter_locked{};
    int budget = max_statements;
    bool top_explicit = false;  // no current-stream allocations at the top level (interleaved captures)
    bool flat = false;          // no conditional nodes (a PiecewiseGraph segment: no Graph to call if_ on)
    bool eager = false;         // Fill and Affine only (a PiecewiseGraph step)
  };

  GenCtx context() const {
    GenCtx ctx;
    for (int i = 0; i < buffer_slots; ++i) {
      ctx.uid[i] = s_.buf[i];
      ctx.n[i] = s_.buf[i] != 0 ? s_.buffers.at(s_.buf[i]).n : 0;
    }
    return ctx;
  }
  std::vector<int> ctx_buffers(const GenCtx& ctx, std::size_t n = 0) const {
    std::vector<int> out;
    for (int i = 0; i < buffer_slots; ++i)
      if (ctx.uid[i] != 0 && (n == 0 || ctx.n[i] == n)) out.push_back(i);
    return out;
  }
  std::vector<int> ctx_targets(const GenCtx& ctx) const {
    std::vector<int> out;
    for (int i = 0; i < buffer_slots; ++i)
      if (!ctx.fresh.count(i) && !ctx.no_target.count(i) && (ctx.uid[i] == 0 || !ctx.used.count(ctx.uid[i]))) out.push_back(i);
    return out;
  }
  int use(GenCtx& ctx, int slot) {
    ctx.used.insert(ctx.uid[slot]);
    return ctx.uid[slot];
  }
  //! Graphs a Nested statement may replay: not capturing now, not nesting too deep, and not
  //! touching what decides an enclosing while loop.
  std::vector<int> nested_candidates(const GenCtx& ctx) const {
    std::vector<int> out;
    for (int i = 0; i < graph_slots; ++i) {
      const GraphM& g = s_.graphs[i];
      if (!g.exists || ctx.nested_excluded.count(i) || (g.captured && nest_depth(g.program) >= 2)) continue;
      bool locked = false;
      for (int f = 0; f < flag_count; ++f) locked = locked || (ctx.flag_locked[f] && g.touches.count(res_flag(f)));
      for (int c = 0; c < counter_count; ++c) locked = locked || (ctx.counter_locked[c] && g.touches.count(res_counter(c)));
      if (!locked) out.push_back(i);
    }
    return out;
  }
  std::vector<int> free_flags(const GenCtx& ctx) const {
    std::vector<int> out;
    for (int f = 0; f < flag_count; ++f)
      if (!ctx.flag_locked[f]) out.push_back(f);
    return out;
  }
  std::vector<int> free_counters(const GenCtx& ctx) const {
    std::vector<int> out;
    for (int c = 0; c < counter_count; ++c)
      if (!ctx.counter_locked[c]) out.push_back(c);
    return out;
  }
  std::vector<int> side_streams(const GenCtx& ctx) const {
    std::vector<int> out;
    for (int sl : live_streams())
      if (!ctx.side_streams_excluded.count(sl)) out.push_back(sl);
    return out;
  }

  Block gen_block(GenCtx& ctx, int depth, int max_len) {
    Block block;
    const int len = rng_.between(depth == 0 ? 1 : 0, max_len);
    for (int i = 0; i < len && ctx.budget > 0; ++i) {
      Stmt st;
      if (gen_stmt(ctx, depth, st)) block.push_back(std::move(st));
    }
    return block;
  }

  bool gen_stmt(GenCtx& ctx, int depth, Stmt& st) {
    const bool have = !ctx_buffers(ctx).empty();
    const bool targets = !ctx_targets(ctx).empty() && !ctx.eager;
    const bool nest = depth < max_depth && ctx.budget >= 2 && !ctx.flat && !ctx.eager;
    const bool misuse = !ctx.flat && !ctx.eager;
    const bool kernels = !ctx.eager;
    const bool flags = !free_flags(ctx).empty() && kernels;
    const bool counters = !free_counters(ctx).empty() && kernels;
    const int k = rng_.weighted(allowed_weights<StmtKind>({
        have ? 14 : 0,                                               // Fill
        have ? 22 : 0,                                               // Affine
        have && kernels ? 7 : 0,                                     // Temp
        targets ? 8 : 0,                                             // Alloc
        targets && !side_streams(ctx).empty() ? 2 : 0,               // SideAlloc
        flags ? 5 : 0,                                               // SetFlag
        counters ? 5 : 0,                                            // SetCounter
        nest ? 8 : 0,                                                // If
        nest ? 4 : 0,                                                // IfElse
        nest && counters ? 6 : 0,                                    // While
        nest ? 4 : 0,                                                // Switch
        misuse ? 2 : 0,                                              // BadPredicate
        misuse && depth == 0 ? 2 : 0,                                // EndWithoutBody
        kernels && !nested_candidates(ctx).empty() ? 4 : 0,          // Nested
    }));
    if (k < 0) return false;
    st.kind = static_cast<StmtKind>(k);
    --ctx.budget;
    switch (st.kind) {
      case StmtKind::If:
      case StmtKind::IfElse:
      case StmtKind::Switch: {
        const bool is_if = st.kind != StmtKind::Switch;
        st.index = rng_.below(is_if ? flag_count : counter_count);
        st.pred = rng_.percent(30) ? PredForm::Functor : PredForm::Tensor;
        st.form = static_cast<BodyForm>(rng_.below(st.kind == StmtKind::If ? 4 : 2));
        const int bodies = st.kind == StmtKind::If ? 1 : (st.kind == StmtKind::IfElse ? 2 : rng_.between(1, 3));
        for (int i = 0; i < bodies; ++i) st.bodies.push_back(gen_block(ctx, depth + 1, 3));
        return true;
      }
      case StmtKind::While: {
        const std::vector<int> flags_free = free_flags(ctx);
        st.index = rng_.pick(free_counters(ctx));
        const int p = rng_.below(flags_free.empty() ? 1 : 3);
        st.pred = p == 0 ? PredForm::CounterFunctor : (p == 1 ? PredForm::Tensor : PredForm::Functor);
        if (p != 0) st.flag = rng_.pick(flags_free);
        st.form = static_cast<BodyForm>(rng_.below(4));
        while_body(ctx, st, [&] { return gen_block(ctx, depth + 1, 3); });
        return true;
      }
      case StmtKind::BadPredicate:
      case StmtKind::EndWithoutBody: return true;
      default: return fill_leaf(ctx, st, -1);
    }
  }

  //! The body of a while node: it must not write what decides the loop, or it might never end.
  template <class MakeBody>
  void while_body(GenCtx& ctx, Stmt& st, MakeBody make) {
    ctx.counter_locked[st.index] = true;
    if (st.flag >= 0) ctx.flag_locked[st.flag] = true;
    st.bodies.push_back(make());
    ctx.counter_locked[st.index] = false;
    if (st.flag >= 0) ctx.flag_locked[st.flag] = false;
  }

  //! Completes a statement of st.kind without bodies; false when the context allows none.
  //! `alloc_src` (Alloc): 1 from a source buffer, 0 a fill, -1 either.
  bool fill_leaf(GenCtx& ctx, Stmt& st, int alloc_src) {
    switch (st.kind) {
      case StmtKind::Fill: {
        const std::vector<int> live = ctx_buffers(ctx);
        if (live.empty()) return false;
        st.dst_slot = rng_.pick(live);
        st.dst = use(ctx, st.dst_slot);
        st.n = ctx.n[st.dst_slot];
        st.a = rng_.word();
        st.b = small();
        return true;
      }
      case StmtKind::Affine:
      case StmtKind::Temp: {
        const std::vector<int> live = ctx_buffers(ctx);
        if (live.empty()) return false;
        st.dst_slot = rng_.pick(live);
        st.n = ctx.n[st.dst_slot];
        st.src_slot = rng_.pick(ctx_buffers(ctx, st.n));
        st.dst = use(ctx, st.dst_slot);
        st.src = use(ctx, st.src_slot);
        st.a = small();
        st.b = rng_.word();
        st.c = small();
        st.d = rng_.word();
        st.on_current_stream = rng_.percent(50) && !ctx.top_explicit;
        return true;
      }
      case StmtKind::Alloc:
      case StmtKind::SideAlloc: {
        const std::vector<int> targets = ctx_targets(ctx);
        const std::vector<int> side = side_streams(ctx);
        if (targets.empty() || (st.kind == StmtKind::SideAlloc && side.empty())) return false;
        st.dst_slot = rng_.pick(targets);
        st.n = any_size();
        std::vector<int> sources = ctx_buffers(ctx, st.n);
        std::erase(sources, st.dst_slot);  // the old occupant dies when the new tensor takes its slot
        if (st.kind == StmtKind::Alloc && alloc_src == 1 && sources.empty()) {
          for (std::size_t n : buffer_sizes) {  // another size may have a source
            sources = ctx_buffers(ctx, n);
            std::erase(sources, st.dst_slot);
            if (!sources.empty()) {
              st.n = n;
              break;
            }
          }
          if (sources.empty()) return false;
        }
        if (st.kind == StmtKind::Alloc && !sources.empty() && (alloc_src == 1 || (alloc_src < 0 && rng_.percent(50)))) {
          st.src_slot = rng_.pick(sources);
          st.src = use(ctx, st.src_slot);
        }
        st.a = st.kind == StmtKind::Alloc && st.src != 0 ? small() : rng_.word();
        st.b = st.kind == StmtKind::Alloc && st.src != 0 ? rng_.word() : small();
        st.c = rng_.word();
        st.d = small();
        if (st.kind == StmtKind::SideAlloc) st.index = rng_.pick(side);
        st.on_current_stream = st.kind == StmtKind::Alloc && rng_.percent(50) && !ctx.top_explicit;
        st.dst = s_.next_uid++;  // reserved now; the buffer exists once the capture has run
        ctx.uid[st.dst_slot] = st.dst;
        ctx.n[st.dst_slot] = st.n;
        ctx.fresh.insert(st.dst_slot);
        ctx.used.insert(st.dst);
        return true;
      }
      case StmtKind::SetFlag: {
        const std::vector<int> flags = free_flags(ctx);
        if (flags.empty()) return false;
        st.index = rng_.pick(flags);
        st.a = static_cast<u32>(rng_.below(2));
        return true;
      }
      case StmtKind::SetCounter: {
        const std::vector<int> counters = free_counters(ctx);
        if (counters.empty()) return false;
        st.index = rng_.pick(counters);
        st.a = static_cast<u32>(rng_.between(0, max_count));
        return true;
      }
      case StmtKind::Nested: {
        const std::vector<int> candidates = nested_candidates(ctx);
        if (candidates.empty()) return false;
        // Mostly captured graphs without conditional nodes (the ones CUDA accepts as a child).
        std::vector<int> good;
        for (int i : candidates)
          if (s_.graphs[i].captured && !s_.graphs[i].conditional) good.push_back(i);
        st.index = !good.empty() && rng_.percent(85) ? rng_.pick(good) : rng_.pick(candidates);
        st.form = rng_.percent(70) || ctx.top_explicit ? BodyForm::LambdaWithStream : BodyForm::LambdaNoArg;
        const GraphM& inner = s_.graphs[st.index];
        st.flag = inner.captured && !inner.conditional ? 0 : 1;
        if (st.flag == 0) {
          st.bodies.push_back(inner.program);
          st.inner_pool = inner.pool;
          st.inner_seq = inner.seq;
          st.bundle = inner.bundle;
          st.rebound = inner.rebinds > 0;  // the copy runs as the inner graph runs now, rebinds included
          for (int uid : inner.buffers) ctx.used.insert(uid);  // the outer graph needs them alive
        }
        return true;
      }
      default: return false;
    }
  }

  //! A program with the shape of `old` (see shape()): the same kernels and conditional nodes in
  //! the same order, on other buffers, flags, counters and values; a fill or an affine may become
  //! an allocation that does the same. `exact` turns false where that cannot be done.
  Block gen_like(GenCtx& ctx, const Block& old, int depth, bool& exact) {
    Block block;
    for (const Stmt& before : old) {
      Stmt st;
      st.kind = before.kind;
      bool ok = true;
      switch (before.kind) {
        case StmtKind::Fill:
        case StmtKind::Affine:
        case StmtKind::Alloc: {
          const bool fill_kernel = before.kind == StmtKind::Fill || (before.kind == StmtKind::Alloc && before.src == 0);
          Stmt alloc = st;
          alloc.kind = StmtKind::Alloc;
          GenCtx saved = ctx;
          if (!ctx.eager && rng_.percent(35) && fill_leaf(ctx, alloc, fill_kernel ? 0 : 1) && (alloc.src == 0) == fill_kernel) {
            st = alloc;
          } else {
            ctx = saved;
            st = Stmt{};
            st.kind = fill_kernel ? StmtKind::Fill : StmtKind::Affine;
            ok = fill_leaf(ctx, st, -1);
          }
          break;
        }
        case StmtKind::Temp:
        case StmtKind::SideAlloc:
        case StmtKind::SetFlag:
        case StmtKind::SetCounter:
          ok = fill_leaf(ctx, st, -1);
          if (!ok && before.kind == StmtKind::SideAlloc) continue;  // no node: leave it out
          break;
        case StmtKind::If:
        case StmtKind::IfElse:
        case StmtKind::Switch:
          st.index = rng_.below(before.kind == StmtKind::Switch ? counter_count : flag_count);
          st.pred = before.pred;
          st.form = before.form;
          for (const Block& body : before.bodies) st.bodies.push_back(gen_like(ctx, body, depth + 1, exact));
          break;
        case StmtKind::While: {
          const std::vector<int> counters = free_counters(ctx);
          std::vector<int> flags = free_flags(ctx);
          if (counters.empty() || (before.flag >= 0 && flags.empty())) {
            ok = false;
            break;
          }
          st.index = rng_.pick(counters);
          st.pred = before.pred;
          st.form = before.form;
          if (before.flag >= 0) st.flag = rng_.pick(flags);
          while_body(ctx, st, [&] { return gen_like(ctx, before.bodies[0], depth + 1, exact); });
          break;
        }
        case StmtKind::BadPredicate:
        case StmtKind::EndWithoutBody: break;
        default:  // Nested: another child graph, whose shape the model does not follow
          exact = false;
          ok = fill_leaf(ctx, st, -1);
          break;
      }
      if (!ok) {
        exact = false;
        continue;
      }
      block.push_back(std::move(st));
    }
    return block;
  }

  //! Appends a chain of `depth` conditionals ending in `terminal` (the last statement captured).
  void add_terminal(GenCtx& ctx, Block& top, StmtKind terminal) {
    Block* at = &top;
    const int depth = ctx.flat ? 0 : rng_.below(max_depth + 1);
    for (int level = 0; level < depth; ++level) {
      Stmt st;
      const int k = rng_.below(4);
      st.kind = k == 0 ? StmtKind::If : (k == 1 ? StmtKind::IfElse : (k == 2 ? StmtKind::While : StmtKind::Switch));
      st.index = rng_.below(st.kind == StmtKind::If || st.kind == StmtKind::IfElse ? flag_count : counter_count);
      st.form = static_cast<BodyForm>(rng_.below(st.kind == StmtKind::If || st.kind == StmtKind::While ? 4 : 2));
      st.pred = rng_.percent(30) ? PredForm::Functor : PredForm::Tensor;
      if (st.kind == StmtKind::While) {
        st.pred = PredForm::CounterFunctor;
        st.flag = -1;
      }
      const int bodies = st.kind == StmtKind::IfElse ? 2 : (st.kind == StmtKind::Switch ? rng_.between(1, 3) : 1);
      for (int i = 0; i < bodies; ++i) st.bodies.push_back(gen_block(ctx, level + 1, 2));
      at->push_back(std::move(st));
      at = &at->back().bodies.back();
    }
    Stmt end;
    end.kind = terminal;
    end.index = terminal == StmtKind::Forbidden ? rng_.below(2) : 0;
    at->push_back(std::move(end));
  }
  //! add_terminal with a Throw or a Forbidden call, as allowed, `percent` of the time.
  void maybe_terminal(GenCtx& ctx, Block& program, int percent, bool may_throw) {
    may_throw = may_throw && allowed("throw");
    const bool may_break = allowed("forbidden");
    if (rng_.percent(percent) && (may_throw || may_break))
      add_terminal(ctx, program, may_throw && (!may_break || rng_.percent(50)) ? StmtKind::Throw : StmtKind::Forbidden);
  }

  // ---- captures ----

  CaptureSide gen_side(int slot, const std::vector<int>& avoid_streams) {
    CaptureSide c;
    c.slot = slot;
    c.pool = rng_.percent(35) ? rng_.below(shared_pools) : -1;
    c.mode = rng_.percent(50) ? rng_.below(3) : -1;
    std::vector<int> live;
    for (int sl : live_streams())
      if (std::find(avoid_streams.begin(), avoid_streams.end(), sl) == avoid_streams.end()) live.push_back(sl);
    const int m = rng_.weighted({live.empty() ? 0 : 45, live.empty() ? 0 : 25, 20, 10});
    c.stream_mode = static_cast<StreamMode>(m);
    if (c.stream_mode == StreamMode::Explicit || c.stream_mode == StreamMode::Guard) c.stream = rng_.pick(live);
    c.body_takes_stream = rng_.percent(60);
    return c;
  }

  //! The model pool a capture of `c` would go into now; -1: a fresh private one.
  int effective_pool(const CaptureSide& c) const {
    if (c.pool >= 0) return s_.shared[c.pool];
    return s_.graphs[c.slot].gpool;
  }
  //! A shared index whose pool is not `pool`.
  int other_shared(int pool) const {
    for (int k = 0; k < shared_pools; ++k)
      if (s_.shared[k] != pool) return k;
    return 0;
  }
  //! CaptureOptions::pool of `c` names another pool than the one its graph has (see the class comment).
  bool pool_override(const CaptureSide& c) const {
    const int own = s_.graphs[c.slot].gpool;
    return c.pool >= 0 && own >= 0 && s_.shared[c.pool] != own;
  }

  bool fill_capture(Op& op) {
    const int v = rng_.weighted(allowed_weights<Variant>({40, 12, 5, 8, 5, 4, 5, 5, 4, 6}));
    if (v < 0) return false;
    op.variant = static_cast<Variant>(v);
    std::vector<int> empty = graph_slots_where(0);
    std::vector<int> any = graph_slots_where(-1);
    if (any.empty()) return false;
    const bool lambda_or_manual = op.variant == Variant::Lambda || op.variant == Variant::Manual;
    int slot = -1;
    if (lambda_or_manual && (empty.empty() || rng_.percent(10))) {
      slot = rng_.pick(any);  // may already hold a graph: capture_begin throws usage_error
    } else {
      if (empty.empty()) return false;
      slot = rng_.pick(empty);
    }
    op.cap = gen_side(slot, {});
    GenCtx ctx = context();
    ctx.nested_excluded = {slot};
    const int cap_stream = op.cap.stream_mode == StreamMode::Explicit || op.cap.stream_mode == StreamMode::Guard ? op.cap.stream : -1;
    if (cap_stream >= 0) ctx.side_streams_excluded.insert(cap_stream);
    if (!fill_capture_variant(op, ctx, slot, cap_stream, empty, any)) return false;
    if (!allowed("capture_pool_override") && (pool_override(op.cap) || (op.cap2.slot >= 0 && op.cap2.pool >= 0 && pool_override(op.cap2))))
      return false;
    return true;
  }

  bool fill_capture_variant(Op& op, GenCtx& ctx, int slot, int cap_stream, const std::vector<int>& empty, const std::vector<int>& any) {
    switch (op.variant) {
      case Variant::Lambda:
      case Variant::Manual:
        op.cap.program = gen_block(ctx, 0, 5);
        maybe_terminal(ctx, op.cap.program, 14, op.variant == Variant::Lambda);  // a manual capture has no body to abandon
        return true;
      case Variant::BeginTwice:
      case Variant::GraphDestroyed:
      case Variant::GraphReset:
        op.cap.program = gen_block(ctx, 0, 4);
        return true;
      case Variant::StreamDestroyed:
        if (cap_stream < 0) return false;
        op.cap.program = gen_block(ctx, 0, 4);
        return true;
      case Variant::MovedMidCapture:
        op.cap2.slot = rng_.below(graph_slots);
        if (op.cap2.slot == slot) return false;
        ctx.nested_excluded.insert(op.cap2.slot);  // the move destroys the graph there
        op.cap.program = gen_block(ctx, 0, 5);
        op.split = rng_.between(0, static_cast<int>(op.cap.program.size()));
        return true;
      case Variant::Interleaved: {
        std::vector<int> others;
        for (int g : empty)
          if (g != slot) others.push_back(g);
        std::vector<int> live = live_streams();
        if (others.empty() || live.size() < 2) return false;
        // Two explicit streams: with two captures open, "the current stream" names only one.
        op.cap.stream_mode = StreamMode::Explicit;
        op.cap.stream = rng_.pick(live);
        ctx.side_streams_excluded = {op.cap.stream};
        op.cap2 = gen_side(rng_.pick(others), {op.cap.stream});
        std::erase(live, op.cap.stream);
        op.cap2.stream_mode = StreamMode::Explicit;
        op.cap2.stream = rng_.pick(live);
        // Two captures into one pool at once are refused (PoolBusy tests that): use two pools.
        const int p1 = effective_pool(op.cap);
        if (p1 >= 0 && effective_pool(op.cap2) == p1) op.cap2.pool = other_shared(p1);
        ctx.top_explicit = true;
        ctx.side_streams_excluded.insert(op.cap2.stream);
        ctx.nested_excluded.insert(op.cap2.slot);
        op.cap.program = gen_block(ctx, 0, 4);
        // The second program runs interleaved with the first: it must neither use nor replace the
        // slots the first one fills, nor replace buffers the first one uses (the first program
        // was generated without knowing the second, which therefore replaces nothing it uses).
        GenCtx second = context();
        second.top_explicit = true;
        second.side_streams_excluded = ctx.side_streams_excluded;
        second.nested_excluded = ctx.nested_excluded;
        for (int i = 0; i < buffer_slots; ++i) {
          if (ctx.fresh.count(i)) {
            second.uid[i] = 0;
            second.no_target.insert(i);
          }
          if (s_.buf[i] != 0 && ctx.used.count(s_.buf[i])) second.no_target.insert(i);
        }
        op.cap2.program = gen_block(second, 0, 4);
        op.second_ends_first = rng_.percent(50);
        return true;
      }
      case Variant::PoolBusy:
      case Variant::StreamBusy: {
        std::vector<int> others;
        for (int g : any)
          if (g != slot) others.push_back(g);
        if (others.empty()) return false;
        if (op.cap.stream_mode == StreamMode::Guard) op.cap.stream_mode = StreamMode::Explicit;
        op.cap2.slot = rng_.pick(others);
        ctx.nested_excluded.insert(op.cap2.slot);
        if (op.variant == Variant::PoolBusy) {
          op.cap.pool = rng_.below(shared_pools);
          op.cap2.pool = op.cap.pool;
          std::vector<int> live;
          for (int sl : live_streams())
            if (sl != cap_stream) live.push_back(sl);
          if (op.cap.stream_mode == StreamMode::Explicit && !live.empty()) {
            op.cap2.stream_mode = StreamMode::Explicit;
            op.cap2.stream = rng_.pick(live);
          } else if (op.cap.stream_mode == StreamMode::Explicit) {
            // StreamRef{}: the side stream. (Not "no option": the current stream is the first
            // capture's stream while it captures.)
            op.cap2.stream_mode = StreamMode::ExplicitLegacy;
          } else if (!live.empty()) {
            op.cap2.stream_mode = StreamMode::Explicit;
            op.cap2.stream = rng_.pick(live);
          } else {
            return false;
          }
        } else {
          op.cap2.stream_mode = op.cap.stream_mode == StreamMode::Explicit ? StreamMode::Explicit : StreamMode::Current;
          op.cap2.stream = op.cap.stream;
          // A distinct pool, so that only the busy stream can be the reason for the refusal.
          op.cap2.pool = other_shared(effective_pool(op.cap));
        }
        op.cap.program = gen_block(ctx, 0, 4);
        return true;
      }
    }
    return false;
  }

  //! Capture-time effects of a program, part 1: the buffers that its allocations replace die.
  //! (All of them first: the synchronisations this needs run before the operation starts.)
  void destroy_targets(Op& op, const Block& block) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Alloc || st.kind == StmtKind::SideAlloc) destroy_buffer(op, st.dst_slot);
      if (st.kind == StmtKind::Nested) continue;
      for (const Block& body : st.bodies) destroy_targets(op, body);
    }
  }

  //! Part 2: the tensors it allocates (they exist even when the capture fails afterwards).
  void create_allocations(const Block& block, int pool, long seq, int cap_stream_uid, int depth) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Alloc) {
        s_.buffers[st.dst] = BufferM{st.n, Value{}, pool, seq, depth == 0 ? cap_stream_uid : side_uid, depth > 0};
        s_.buf[st.dst_slot] = st.dst;
      } else if (st.kind == StmtKind::SideAlloc) {
        const int su = stream_uid(st.index);
        s_.buffers[st.dst] = BufferM{st.n, sequence(st.a, st.b), -1, 0, su};
        s_.buf[st.dst_slot] = st.dst;
        std::set<u64> touched;
        buffer_resources(st.dst, touched);
        s_.pending[su].insert(touched.begin(), touched.end());  // a fresh tensor: nothing to order against
      }
      if (st.kind == StmtKind::Nested) continue;
      for (const Block& body : st.bodies) create_allocations(body, pool, seq, cap_stream_uid, depth + 1);
    }
  }

  //! Part 3: every graph nested in it may now be kept by `instance` (an outer graph's captures
  //! and executables), and so may what those graphs nested.
  void hold_nested(const Block& block, int instance) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Nested) {
        if (st.flag != 0) continue;
        s_.bundles[st.bundle].holders.insert(instance);
        hold_nested(st.bodies[0], instance);
        continue;
      }
      for (const Block& body : st.bodies) hold_nested(body, instance);
    }
  }

  //! A capture whose body runs into `pool`: its allocations happen; returns its sequence number.
  long run_body(Op& op, const CaptureSide& c, int pool, int instance) {
    destroy_targets(op, c.program);
    const long seq = s_.next_seq++;
    create_allocations(c.program, pool, seq, cap_stream_uid(c), 0);
    hold_nested(c.program, instance);
    return seq;
  }
  //! run_body for a Graph's capture: returns {pool, sequence number}.
  std::pair<int, long> run_capture(Op& op, const CaptureSide& c) {
    const int pool = capture_pool(c);
    return {pool, run_body(op, c, pool, s_.graphs[c.slot].instance)};
  }

  static StmtKind terminal_of(const Block& block) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Throw || st.kind == StmtKind::Forbidden) return st.kind;
      if (st.kind == StmtKind::Nested) continue;
      for (const Block& body : st.bodies)
        if (StmtKind k = terminal_of(body); k == StmtKind::Throw || k == StmtKind::Forbidden) return k;
    }
    return StmtKind::Fill;
  }
  static Outcome outcome_of(StmtKind terminal) {
    if (terminal == StmtKind::Throw) return Outcome::User;
    if (terminal == StmtKind::Forbidden) return Outcome::Cuda;
    return Outcome::Ok;
  }

  void collect(const Block& block, GraphM& g) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::SideAlloc) continue;
      if (st.kind == StmtKind::Nested) {
        if (st.flag != 0) continue;
        g.touches.insert(res_pool(st.inner_pool));
        const bool conditional = g.conditional;
        collect(st.bodies[0], g);
        g.conditional = conditional;  // the child holds none (CUDA refuses that)
        continue;
      }
      for (int uid : {st.dst, st.src})
        if (uid != 0) {
          g.buffers.push_back(uid);
          g.touches.insert(res_buffer(uid));
        }
      switch (st.kind) {
        case StmtKind::SetFlag:
        case StmtKind::If:
        case StmtKind::IfElse: g.touches.insert(res_flag(st.index)); break;
        case StmtKind::SetCounter:
        case StmtKind::Switch: g.touches.insert(res_counter(st.index)); break;
        case StmtKind::While:
          g.touches.insert(res_counter(st.index));
          if (st.flag >= 0) g.touches.insert(res_flag(st.flag));
          break;
        default: break;
      }
      if (!st.bodies.empty()) g.conditional = true;
      for (const Block& body : st.bodies) collect(body, g);
    }
  }
  //! The buffers and resources a program uses, and whether it holds conditional nodes.
  GraphM usage(const Block& program) {
    GraphM u;
    collect(program, u);
    std::sort(u.buffers.begin(), u.buffers.end());
    u.buffers.erase(std::unique(u.buffers.begin(), u.buffers.end()), u.buffers.end());
    return u;
  }

  int cap_stream_uid(const CaptureSide& c) const {
    return c.stream_mode == StreamMode::Explicit || c.stream_mode == StreamMode::Guard ? stream_uid(c.stream) : side_uid;
  }

  //! The pool a capture goes into: CaptureOptions, else the graph's, else a new private pool.
  int capture_pool(const CaptureSide& c) {
    const int pool = effective_pool(c);
    return pool >= 0 ? pool : s_.next_pool++;
  }

  //! The graph after a successful capture of `c` into (pool, seq). It keeps the capture's pool
  //! when the capture had one or made one (it allocated).
  GraphM captured(const CaptureSide& c, const GraphM& before, std::pair<int, long> at) {
    GraphM g = before;
    const bool had_pool = c.pool >= 0 || before.gpool >= 0;
    g.captured = true;
    g.pool = at.first;
    g.seq = at.second;
    if (had_pool || allocates(c.program)) g.gpool = at.first;
    g.program = c.program;
    const GraphM u = usage(g.program);
    g.buffers = u.buffers;
    g.touches = u.touches;
    g.conditional = u.conditional;
    g.stage_state = 0;
    g.rebinds = 0;  // a new capture starts from the pointers its body uses
    g.moved.clear();
    g.map_unknown = false;
    return g;
  }

  void apply_capture(Op& op) {
    GraphM& g = s_.graphs[op.cap.slot];
    switch (op.variant) {
      case Variant::Lambda:
      case Variant::Manual: {
        if (g.captured) {
          op.cap.expect = Outcome::Usage;  // capture_begin: the graph already holds a captured graph
          break;
        }
        const StmtKind terminal = terminal_of(op.cap.program);
        const auto at = run_capture(op, op.cap);
        op.cap.expect = outcome_of(terminal);
        if (op.cap.expect != Outcome::Ok) break;  // abandoned: the graph holds nothing
        g = captured(op.cap, g, at);
        break;
      }
      case Variant::BeginTwice:
      case Variant::PoolBusy:
      case Variant::StreamBusy:
        op.cap2.expect = Outcome::Usage;
        g = captured(op.cap, g, run_capture(op, op.cap));
        break;
      case Variant::Interleaved: {
        destroy_targets(op, op.cap.program);
        destroy_targets(op, op.cap2.program);
        const auto first = run_capture(op, op.cap);
        const auto second = run_capture(op, op.cap2);
        s_.graphs[op.cap.slot] = captured(op.cap, s_.graphs[op.cap.slot], first);
        s_.graphs[op.cap2.slot] = captured(op.cap2, s_.graphs[op.cap2.slot], second);
        break;
      }
      case Variant::StreamDestroyed:
        (void)run_capture(op, op.cap);
        destroy_stream(op.cap.stream);
        op.cap.expect = Outcome::Usage;  // capture_end
        break;
      case Variant::GraphDestroyed:
        (void)run_capture(op, op.cap);
        destroy_graph(op.cap.slot);
        break;
      case Variant::GraphReset:
        (void)run_capture(op, op.cap);
        reset_graph(g);  // an empty graph again, with a new bundle
        break;
      case Variant::MovedMidCapture: {
        const GraphM done = captured(op.cap, g, run_capture(op, op.cap));
        destroy_graph(op.cap2.slot);
        s_.graphs[op.cap2.slot] = done;
        s_.graphs[op.cap.slot] = fresh_graph();  // moved-from: a default-constructed graph
        break;
      }
    }
    op.expect = op.cap.expect;
  }

  // ---- updates ----

  bool fill_update(Op& op) {
    const std::vector<int> any = graph_slots_where(-1);
    const std::vector<int> captured_slots = graph_slots_where(1);
    if (any.empty()) return false;
    int slot = -1;
    if (captured_slots.empty() || rng_.percent(6)) {
      slot = rng_.pick(any);  // nothing captured yet: usage_error
    } else {
      // Mostly the sequences that found defects: a graph staged and replayed (defect 3), a
      // graph whose captures allocated nothing yet (defects 1 and 2).
      std::vector<int> staged, poolless;
      for (int i : captured_slots) {
        if (s_.graphs[i].stage_state == 2) staged.push_back(i);
        if (s_.graphs[i].gpool < 0) poolless.push_back(i);
      }
      const int r = rng_.below(100);
      slot = r < 35 && !staged.empty() ? rng_.pick(staged) : (r < 65 && !poolless.empty() ? rng_.pick(poolless) : rng_.pick(captured_slots));
    }
    op.cap = gen_side(slot, {});
    op.cap.pool = rng_.percent(8) ? rng_.below(shared_pools) : -1;  // only the graph's own pool is accepted
    GenCtx ctx = context();
    ctx.nested_excluded = {slot};
    if (op.cap.stream_mode == StreamMode::Explicit || op.cap.stream_mode == StreamMode::Guard) ctx.side_streams_excluded.insert(op.cap.stream);
    const GraphM& g = s_.graphs[slot];
    if (g.captured && rng_.percent(65)) {
      bool exact = true;
      ctx.budget = 1000;
      op.cap.program = gen_like(ctx, g.program, 0, exact);
      std::string before, after;
      if (exact && (!shape(g.program, before) || !shape(op.cap.program, after) || before != after))
        fail("gen_like made another shape: " + before + " -> " + after);
    } else {
      op.cap.program = gen_block(ctx, 0, 5);
    }
    maybe_terminal(ctx, op.cap.program, 10, true);
    return true;
  }

  void apply_update(Op& op) {
    GraphM& g = s_.graphs[op.cap.slot];
    if (!g.captured || (op.cap.pool >= 0 && s_.shared[op.cap.pool] != g.gpool)) {
      op.expect = Outcome::Usage;  // nothing to update, or another pool: refused before the body runs
      op.cap.expect = op.expect;
      return;
    }
    const bool had_pool = g.gpool >= 0;
    const int pool = had_pool ? g.gpool : s_.next_pool++;
    const long seq = run_body(op, op.cap, pool, g.instance);
    op.expect = outcome_of(terminal_of(op.cap.program));
    op.cap.expect = op.expect;
    if (op.expect != Outcome::Ok) return;  // the graph still runs its old work
    op.update_outcome = allowed("update_outcome") ? predict_update(g.program, op.cap.program) : 0;
    if (g.stage_state > 0) stats_.updates_of_staged += 1;
    stats_.updates_after_rebind += g.rebinds > 0;
    g.rebinds = 0;  // the update starts from the pointers its body uses: earlier rebinds are dropped
    g.moved.clear();
    g.map_unknown = false;
    if (!had_pool && allocates(op.cap.program)) {
      stats_.update_adopted_pool += 1;
      forced_.push_front(simple_op(OpKind::Check));  // the pool checks see a pool that was not adopted at once
    }
    g.program = op.cap.program;
    g.seq = seq;
    g.pool = pool;
    if (had_pool || allocates(g.program)) g.gpool = pool;
    const GraphM u = usage(g.program);
    g.buffers = u.buffers;
    g.touches = u.touches;
    g.conditional = u.conditional;
    stats_.updates_with_conditionals += g.conditional;
    // In place, the copy node keeps the state a replay left it in: the next staged call must
    // turn it on again. Recompiled, it starts enabled.
    if (g.stage_state >= 2 && op.update_outcome != 2) g.stage_state = 3;
    else if (g.stage_state > 0) g.stage_state = 1;
  }

  // ---- replays ----

  bool fill_round(Op& op) {
    std::map<int, std::vector<int>> by_pool;  // pool -> replayable graph slots
    std::vector<int> armed;                   // staged, replayed, updated in place: stage them again
    for (int i = 0; i < graph_slots; ++i) {
      if (!replayable(s_.graphs[i])) continue;
      by_pool[s_.graphs[i].pool].push_back(i);
      if (s_.graphs[i].stage_state == 3 && stage_map_known(s_.graphs[i])) armed.push_back(i);
    }
    if (by_pool.empty()) return false;
    const bool stage_ok = allowed("stage");
    const int focus = !armed.empty() && stage_ok && rng_.percent(80) ? rng_.pick(armed) : -1;
    std::vector<int> pools;
    for (const auto& [pool, slots] : by_pool) pools.push_back(pool);
    std::vector<int> slots = by_pool[focus >= 0 ? s_.graphs[focus].pool : rng_.pick(pools)];
    // Capture order; a subsequence of it keeps that order (the pool contract).
    std::sort(slots.begin(), slots.end(), [&](int x, int y) { return s_.graphs[x].seq < s_.graphs[y].seq; });
    std::vector<int> chosen;
    for (int sl : slots)
      if (sl == focus || slots.size() == 1 || rng_.percent(80)) chosen.push_back(sl);
    if (chosen.empty()) chosen.push_back(slots.front());
    op.stream = any_stream();
    for (int sl : chosen) {
      ReplayItem item;
      item.slot = sl;
      const GraphM& g = s_.graphs[sl];
      const bool stage = stage_ok && (!g.conditional || allowed("stage_conditional")) && stage_map_known(g);
      item.how = sl == focus ? 2 + rng_.below(2) : rng_.weighted({45, 15, stage ? 25 : 0, stage ? 15 : 0});
      if (item.how >= 2) fill_pairs(item, g, sl == focus);
      op.items.push_back(std::move(item));
    }
    return true;
  }

  //! The static buffers and inputs of a staged replay of `g`. Mostly buffers the graph reads
  //! but does not write, so that a Check sees what the copy left there.
  void fill_pairs(ReplayItem& item, const GraphM& g, bool device_inputs) {
    std::set<int> writes;
    written(g.program, writes);
    const int pairs = rng_.between(1, 2);
    std::vector<int> statics;
    std::set<int> taken;  // the statics and where the graph's rebinds moved them (no input, no second static)
    for (int p = 0; p < pairs; ++p) {
      std::vector<int> candidates;
      for (int b = 0; b < buffer_slots; ++b) {
        if (s_.buf[b] == 0 || std::find(statics.begin(), statics.end(), b) != statics.end()) continue;
        const int now = where_now(g, s_.buf[b]);  // where a copy onto it goes (rebinds)
        if (taken.count(s_.buf[b]) || taken.count(now)) continue;
        const bool read_by_graph = std::binary_search(g.buffers.begin(), g.buffers.end(), now);
        const bool written_by_graph = writes.count(now) != 0;
        if ((read_by_graph && !written_by_graph) || rng_.percent(written_by_graph ? 15 : 30)) candidates.push_back(b);
      }
      if (candidates.empty()) break;
      StagePair pair;
      pair.static_slot = rng_.pick(candidates);
      pair.static_uid = s_.buf[pair.static_slot];
      statics.push_back(pair.static_slot);
      taken.insert(pair.static_uid);
      taken.insert(where_now(g, pair.static_uid));
      pair.input = device_inputs ? rng_.below(2) : rng_.weighted({40, 35, 25});
      pair.base = rng_.word();
      pair.stride = small();
      item.pairs.push_back(pair);
    }
    for (StagePair& pair : item.pairs) {
      if (pair.input != 0) continue;
      std::vector<int> inputs;
      for (int b : buffer_slots_where(s_.buffers.at(pair.static_uid).n))
        if (std::find(statics.begin(), statics.end(), b) == statics.end() && !taken.count(s_.buf[b])) inputs.push_back(b);
      if (inputs.empty()) {
        pair.input = 1;
        continue;
      }
      pair.input_slot = rng_.pick(inputs);
      pair.input_uid = s_.buf[pair.input_slot];
    }
    if (item.pairs.empty()) item.how -= 2;
  }

  //! Resources a replay of `program` (captured into `pool`) touches.
  void replay_resources(const Block& program, int pool, std::set<u64>& out) {
    const GraphM u = usage(program);
    out.insert(u.touches.begin(), u.touches.end());
    std::set<int> pools{pool};
    nested_pools(program, pools);
    for (int p : pools) pool_resources(p, out);
  }

  void apply_round(Op& op) {
    const int su = stream_uid(op.stream);
    const int pool = s_.graphs[op.items.front().slot].pool;
    std::set<u64> touched;
    for (const ReplayItem& item : op.items) {
      const GraphM& g = s_.graphs[item.slot];
      replay_resources(g.program, g.pool, touched);
      for (const StagePair& p : item.pairs) {
        buffer_resources(p.static_uid, touched);
        buffer_resources(where_now(g, p.static_uid), touched);
        if (p.input == 0) buffer_resources(p.input_uid, touched);
      }
    }
    issue(op, su, touched);
    for (const ReplayItem& item : op.items) {
      GraphM& g = s_.graphs[item.slot];
      if (g.pool != pool || !replayable(g)) fail("round over graphs that cannot replay together");
      // The copies come first (a node in front of the graph), all reading before any writes, each
      // onto its static buffer where the graph's rebinds moved it (all of it, or the front of a
      // larger buffer).
      std::vector<std::pair<int, Value>> staged;
      for (const StagePair& p : item.pairs) staged.emplace_back(p.static_uid, p.input == 0 ? value(p.input_uid) : sequence(p.base, p.stride));
      for (const auto& [uid, v] : staged) {
        const int now = where_now(g, uid);
        stats_.staged_into_rebound += now != uid;
        write(now, s_.buffers.count(uid) ? s_.buffers.at(uid).n : 0, v);
      }
      stats_.replays_after_rebind += g.rebinds > 0;
      const bool by_node = std::any_of(item.pairs.begin(), item.pairs.end(), [](const StagePair& p) { return p.input != 2; });
      if (by_node) {  // the copy node ran
        if (g.stage_state == 3) {
          stats_.staged_after_in_place_update += 1;
          forced_.push_front(simple_op(OpKind::Check));
        }
        g.stage_state = 1;
      } else if (g.stage_state == 1 || g.stage_state == 3) {
        g.stage_state = 2;  // a launch without the copy node: its nodes are off now
      }
      clobber(g.pool, g.seq);
      if (g.conditional) (item.pairs.empty() ? stats_.conditional_replays : stats_.staged_conditional_replays) += 1;
      run(g.program);
    }
  }

  // ---- rebind ----
  //
  // A rebind rewrites the program a graph runs: every Fill, Affine, Temp or Alloc kernel that uses
  // `from` uses `to` from then on (nested copies included; SideAlloc is eager work, no node). The
  // model names buffers by uid, the library finds nodes by address; the generator keeps the two
  // the same: `from` and `to` are live buffers that lie in no memory where the graph's temporaries
  // may be (clear_of), `from` is used by no node that CUDA may refuse to change (rebind_uncertain),
  // and the node count is checked only while every buffer of the program lives (a dead buffer's
  // memory may now be `from`'s). rebind does not keep `to` alive: a graph rebound to a buffer that
  // dies uses a dead buffer, so replayable() keeps it from replaying, as for any other.

  //! Whether statement `st` is a kernel (or, Temp, two) whose parameters point into buffer `uid`.
  static std::size_t own_nodes(const Stmt& st, int uid) {
    switch (st.kind) {
      case StmtKind::Fill: return st.dst == uid ? 1 : 0;
      case StmtKind::Affine:
      case StmtKind::Alloc: return st.dst == uid || (st.src != 0 && st.src == uid) ? 1 : 0;
      case StmtKind::Temp: return (st.src == uid ? 1 : 0) + (st.dst == uid ? 1 : 0);
      default: return 0;
    }
  }
  //! Nodes of `block` whose parameters point into buffer `uid` (what a rebind of it changes):
  //! conditional bodies and nested copies included; with `nested_only`, those of nested copies.
  static std::size_t kernel_nodes(const Block& block, int uid, bool nested_only = false, bool in_nested = false) {
    std::size_t nodes = 0;
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Nested) {
        if (st.flag == 0) nodes += kernel_nodes(st.bodies[0], uid, nested_only, true);
        continue;
      }
      if (!nested_only || in_nested) nodes += own_nodes(st, uid);
      for (const Block& body : st.bodies) nodes += kernel_nodes(body, uid, nested_only, in_nested);
    }
    return nodes;
  }
  //! The rebind itself: `from` becomes `to` (in slot `to_slot`, for the trace) wherever a node uses it.
  static void substitute(Block& block, int from, int to, int to_slot) {
    for (Stmt& st : block) {
      if (st.kind == StmtKind::Fill || st.kind == StmtKind::Affine || st.kind == StmtKind::Temp || st.kind == StmtKind::Alloc) {
        if (st.dst == from) {
          st.dst = to;
          st.dst_slot = to_slot;
        }
        if (st.src == from) {
          st.src = to;
          st.src_slot = to_slot;
        }
      }
      for (Block& body : st.bodies) substitute(body, from, to, to_slot);
    }
  }
  //! Whether a rebind of `uid` may go either way: a node that uses it in a conditional body, or in a
  //! nested copy inside a graph that holds conditional nodes, may change only through
  //! cudaGraphExecUpdate, which CUDA may refuse (rebind then throws usage_error and changes nothing).
  static bool rebind_uncertain(const Block& block, int uid, bool in_body, bool conditional_graph) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Nested) {
        if (st.flag == 0 && (in_body || conditional_graph) && kernel_nodes(st.bodies[0], uid) > 0) return true;
        continue;
      }
      if (in_body && own_nodes(st, uid) > 0) return true;
      for (const Block& body : st.bodies)
        if (rebind_uncertain(body, uid, true, conditional_graph)) return true;
    }
    return false;
  }
  //! The pools whose temporaries a replay of `block` runs through its nested copies, each with the
  //! earliest capture that put temporaries there.
  static void temp_pools(const Block& block, std::map<int, long>& out) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Nested) {
        if (st.flag == 0) {
          const auto [at, added] = out.emplace(st.inner_pool, st.inner_seq);
          if (!added) at->second = std::min(at->second, st.inner_seq);
          temp_pools(st.bodies[0], out);
        }
        continue;
      }
      for (const Block& body : st.bodies) temp_pools(body, out);
    }
  }
  static void add_pool(std::map<int, long>& pools, int pool, long seq) {
    const auto [at, added] = pools.emplace(pool, seq);
    if (!added) at->second = std::min(at->second, seq);
  }
  //! Whether buffer `uid` may be named in a rebind of programs whose temporaries lie in `pools`:
  //! memory of such a pool allocated by that capture or since may be where those temporaries are
  //! (a capture frees its temporaries before it ends), and a rebind would move their nodes too.
  //! Memory allocated before, and alive since, was alive throughout that capture.
  bool clear_of(int uid, const std::map<int, long>& pools) const {
    const BufferM& b = s_.buffers.at(uid);
    if (b.pool < 0) return true;  // the default pool: no capture's temporaries
    const auto it = pools.find(b.pool);
    return it == pools.end() || b.seq < it->second;
  }
  std::map<int, long> graph_temp_pools(const GraphM& g) const {
    std::map<int, long> pools{{g.pool, g.seq}};
    temp_pools(g.program, pools);
    return pools;
  }
  //! RebindMap::moved, by whole buffers (rebinds name whole live buffers, and `to` is never smaller):
  //! names whose bytes are in `from` now move on to `to`; `from` is named now unless it is a name
  //! already (its own bytes stay where an earlier rebind put them); names back home drop out.
  static void map_moved(std::map<int, int>& map, int from, int to) {
    for (auto& [name, now] : map)
      if (now == from) now = to;
    map.emplace(from, to);
    std::erase_if(map, [](const auto& entry) { return entry.first == entry.second; });
  }
  //! Where stage_and_launch copies a static buffer named `uid` now.
  static int where_now(const GraphM& g, int uid) {
    const auto it = g.moved.find(uid);
    return it == g.moved.end() ? uid : it->second;
  }
  //! Whether the model knows where g's stage_and_launch copies: every buffer its map names (and
  //! moves to) lives. A dead name's memory may hold a live buffer now, which the real map would
  //! then move too.
  bool stage_map_known(const GraphM& g) const {
    if (g.map_unknown) return false;
    for (const auto& [name, now] : g.moved)
      if (!s_.buffers.count(name) || !s_.buffers.count(now)) return false;
    return true;
  }
  void refresh_usage(GraphM& g) {
    const GraphM u = usage(g.program);
    g.buffers = u.buffers;
    g.touches = u.touches;
  }

  //! A rebind refused with usage_error (sub 1: `to` is cut shorter than `from`; 2: two overlapping
  //! spans of `from`; 0: a graph that has no executable yet): any two buffers.
  bool fill_rebind_refused(Op& op, const std::vector<int>& live) {
    if (live.size() < 2) return false;
    op.b = rng_.pick(live);
    std::vector<int> others = live;
    std::erase(others, op.b);
    op.x = static_cast<u32>(op.sub == 2 ? op.b : rng_.pick(others));
    return true;
  }
  //! `from` (op.b) and `to` (op.x) for a rebind that goes through: `from` mostly a buffer some node
  //! uses (`nodes`), `to` another live buffer, mostly of the same size, else a larger one.
  template <class Nodes, class FromOk>
  bool pick_rebind_buffers(Op& op, const std::map<int, long>& pools, Nodes nodes, FromOk from_ok) {
    std::vector<int> used, any;
    for (int b : buffer_slots_where()) {
      const int uid = s_.buf[b];
      if (!clear_of(uid, pools) || !from_ok(uid)) continue;
      any.push_back(b);
      if (nodes(uid) > 0) used.push_back(b);
    }
    if (any.empty()) return false;
    op.b = !used.empty() && rng_.percent(80) ? rng_.pick(used) : rng_.pick(any);
    const std::size_t n = s_.buffers.at(s_.buf[op.b]).n;
    std::vector<int> same, larger;
    for (int b : buffer_slots_where()) {
      if (b == op.b || !clear_of(s_.buf[b], pools)) continue;
      const std::size_t m = s_.buffers.at(s_.buf[b]).n;
      if (m == n) same.push_back(b);
      if (m > n) larger.push_back(b);
    }
    if (same.empty() && larger.empty()) return false;
    op.x = static_cast<u32>(!larger.empty() && (same.empty() || rng_.percent(15)) ? rng_.pick(larger) : rng_.pick(same));
    return true;
  }

  bool fill_rebind(Op& op) {
    const std::vector<int> graphs = graph_slots_where(-1);
    const std::vector<int> captured_slots = graph_slots_where(1);
    if (graphs.empty()) return false;
    const std::vector<int> replayable_slots = slots_where(graph_slots, [&](int i) { return replayable(s_.graphs[i]); });
    op.sub = rng_.weighted({86, 7, 7});
    if (captured_slots.empty() || rng_.percent(5)) op.a = rng_.pick(graphs);  // maybe none captured: usage_error
    else op.a = !replayable_slots.empty() && rng_.percent(80) ? rng_.pick(replayable_slots) : rng_.pick(captured_slots);
    const GraphM& g = s_.graphs[op.a];
    if (op.sub != 0 || !g.captured) return fill_rebind_refused(op, buffer_slots_where());
    // A graph that cannot replay (a buffer of it died) may be rebound too: its nodes are not counted
    // then, and it has no conditional nodes (whose bodies might use the dead buffer's memory).
    if (!replayable(g) && g.conditional) return false;
    return pick_rebind_buffers(op, graph_temp_pools(g), [&](int uid) { return kernel_nodes(g.program, uid); },
                               [&](int uid) { return !rebind_uncertain(g.program, uid, false, g.conditional); });
  }

  void apply_rebind(Op& op) {
    GraphM& g = s_.graphs[op.a];
    if (op.sub != 0 || !g.captured) {
      op.expect = Outcome::Usage;  // before any capture, or bad arguments: nothing changes
      return;
    }
    const int from = s_.buf[op.b];
    const int to = s_.buf[op.x];
    if (s_.buffers.at(to).n < s_.buffers.at(from).n) {
      op.expect = Outcome::Usage;
      return;
    }
    const bool counted = replayable(g);
    op.n = kernel_nodes(g.program, from);
    op.y = counted && allowed("rebind_nodes") ? 1 : 0;
    if (!counted) {
      stats_.rebinds_uncounted += 1;
      g.map_unknown = true;  // nodes the model does not see may have moved, and with them the map
    }
    if (op.n == 0) {
      stats_.rebinds_unused += counted;
      return;  // nothing changed: the map stays as it is
    }
    stats_.rebinds_moved += 1;
    stats_.rebinds_to_larger += s_.buffers.at(to).n > s_.buffers.at(from).n;
    const bool nested = kernel_nodes(g.program, from, true) > 0;
    stats_.rebinds_of_nested_nodes += nested;
    // Nodes of a nested copy change through cudaGraphExecUpdate (like an in-place update): the
    // next staged call must turn the staging nodes on again (see apply_update).
    if (nested && g.stage_state >= 2) g.stage_state = 3;
    substitute(g.program, from, to, static_cast<int>(op.x));
    refresh_usage(g);
    map_moved(g.moved, from, to);
    g.rebinds += 1;
  }

  // PiecewiseGraph::rebind: every segment captured so far (steps are the test's code: they keep
  // the pointers they took).
  bool segments_alive(const PiecewiseM& p) {
    for (const PieceM& piece : p.pieces)
      if (!piece.step && !alive(usage(piece.program).buffers)) return false;
    return true;
  }
  std::size_t segment_nodes(const PiecewiseM& p, int uid) const {
    std::size_t nodes = 0;
    for (const PieceM& piece : p.pieces)
      if (!piece.step) nodes += kernel_nodes(piece.program, uid);
    return nodes;
  }

  bool fill_piece_rebind(Op& op) {
    const std::vector<int> live = slots_where(piece_slots, [&](int i) { return s_.pieces[i].exists; });
    if (live.empty()) return false;
    op.a = rng_.pick(live);
    op.sub = rng_.weighted({86, 7, 7});
    if (op.sub != 0) return fill_rebind_refused(op, buffer_slots_where());
    const PiecewiseM& p = s_.pieces[op.a];
    std::map<int, long> pools;
    for (const PieceM& piece : p.pieces)
      if (!piece.step) {
        add_pool(pools, p.pool, piece.seq);
        temp_pools(piece.program, pools);
      }
    return pick_rebind_buffers(op, pools, [&](int uid) { return segment_nodes(p, uid); }, [&](int uid) {
      for (const PieceM& piece : p.pieces)
        if (!piece.step && rebind_uncertain(piece.program, uid, false, false)) return false;
      return true;
    });
  }

  void apply_piece_rebind(Op& op) {
    PiecewiseM& p = s_.pieces[op.a];
    const int from = s_.buf[op.b];
    const int to = s_.buf[op.x];
    if (op.sub != 0 || s_.buffers.at(to).n < s_.buffers.at(from).n) {
      op.expect = Outcome::Usage;  // checked before any segment changes (also with none captured)
      return;
    }
    op.n = segment_nodes(p, from);
    op.y = segments_alive(p) && allowed("rebind_nodes") ? 1 : 0;
    if (op.n == 0) return;
    stats_.piece_rebinds_moved += 1;
    for (PieceM& piece : p.pieces)
      if (!piece.step) substitute(piece.program, from, to, static_cast<int>(op.x));
    p.rebinds += 1;
  }

  // GraphBuckets::rebind: every bucket captured now. Its bodies use the buckets' own x and y (and
  // a temporary in the buckets' pool), so the buffers named are x, y and buffers of slots outside
  // that pool; x and y are smaller than any slot buffer, so a graph of it moves from x or y to a
  // slot buffer (or between x and y), never back.
  int bucket_loc(const BucketM& b, int name) const {
    (void)b;
    return name == bucket_x ? loc_x : (name == bucket_y ? loc_y : s_.buf[name]);
  }
  std::size_t loc_size(const BucketM& b, int loc) const {
    return loc == loc_x || loc == loc_y ? b.spec.capacity() : s_.buffers.at(loc).n;
  }
  bool loc_alive(int loc) const { return loc == loc_x || loc == loc_y || s_.buffers.count(loc) != 0; }
  bool bucket_locs_alive(const BucketM& b, int i) const {
    return loc_alive(b.x_at[static_cast<std::size_t>(i)]) && loc_alive(b.y_at[static_cast<std::size_t>(i)]);
  }
  static std::size_t bucket_nodes(const BucketM& b, int loc) {
    std::size_t nodes = 0;
    for (std::size_t i = 0; i < b.captured.size(); ++i)
      if (b.captured[i]) nodes += (b.x_at[i] == loc ? 1 : 0) + (b.y_at[i] == loc ? 1 : 0);
    return nodes;
  }

  bool fill_bucket_rebind(Op& op) {
    const std::vector<int> live = slots_where(bucket_slots, [&](int i) { return s_.buckets[i].exists; });
    if (live.empty()) return false;
    op.a = rng_.pick(live);
    const BucketM& b = s_.buckets[op.a];
    op.sub = rng_.weighted({86, 7, 7});
    if (op.sub != 0) return fill_rebind_refused(op, buffer_slots_where());
    std::vector<int> names{bucket_x, bucket_y};
    for (int slot : buffer_slots_where())
      if (s_.buffers.at(s_.buf[slot]).pool != b.pool) names.push_back(slot);
    std::vector<int> used;
    for (int name : names)
      if (bucket_nodes(b, bucket_loc(b, name)) > 0) used.push_back(name);
    op.b = !used.empty() && rng_.percent(80) ? rng_.pick(used) : rng_.pick(names);
    const std::size_t n = loc_size(b, bucket_loc(b, op.b));
    std::vector<int> to;
    for (int name : names)
      if (name != op.b && loc_size(b, bucket_loc(b, name)) >= n) to.push_back(name);
    if (to.empty()) return false;
    op.x = static_cast<u32>(rng_.pick(to));
    return true;
  }

  void apply_bucket_rebind(Op& op) {
    BucketM& b = s_.buckets[op.a];
    if (op.sub != 0 || b.spec.share) {
      op.expect = Outcome::Usage;  // bad arguments, or share_executables: no bucket changes
      return;
    }
    const int from = bucket_loc(b, op.b);
    const int to = bucket_loc(b, static_cast<int>(op.x));
    if (loc_size(b, to) < loc_size(b, from)) {
      op.expect = Outcome::Usage;
      return;
    }
    bool counted = allowed("rebind_nodes");
    for (std::size_t i = 0; i < b.captured.size(); ++i)
      if (b.captured[i] && !bucket_locs_alive(b, static_cast<int>(i))) counted = false;
    op.n = bucket_nodes(b, from);
    op.y = counted ? 1 : 0;
    if (op.n == 0) return;
    stats_.bucket_rebinds_moved += 1;
    for (std::size_t i = 0; i < b.captured.size(); ++i) {
      if (!b.captured[i]) continue;  // captured later, a bucket starts from x and y
      if (b.x_at[i] == from) b.x_at[i] = to;
      if (b.y_at[i] == from) b.y_at[i] = to;
    }
  }

  // ---- GraphBuckets ----

  bool fill_bucket_new(Op& op) {
    static const std::vector<std::vector<std::size_t>> ladders = {{1, 2, 4}, {2, 3}, {1, 4, 8}, {3}, {1, 2, 3, 5}};
    op.a = rng_.below(bucket_slots);
    op.stream = any_stream();
    BucketSpec& b = op.bucket;
    b.ladder = ladders[static_cast<std::size_t>(rng_.below(static_cast<int>(ladders.size())))];
    b.k = static_cast<std::size_t>(rng_.between(1, 4));
    b.lazy = rng_.percent(75);
    b.share = rng_.percent(30);
    b.zero_fill = rng_.percent(40);
    b.overflow_throw = rng_.percent(25);
    b.max_exec = static_cast<std::size_t>(rng_.weighted({50, 30, 20}));
    b.pool = rng_.percent(30) ? rng_.below(shared_pools) : -1;
    b.a1 = small();
    b.b1 = rng_.word();
    b.a2 = small();
    b.b2 = rng_.word();
    b.x0 = rng_.word();
    b.xs = small();
    b.y0 = rng_.word();
    b.ys = small();
    return true;
  }

  bool fill_bucket_run(Op& op) {
    const std::vector<int> live = slots_where(bucket_slots, [&](int i) { return s_.buckets[i].exists; });
    if (live.empty()) return false;
    op.a = rng_.pick(live);
    const BucketSpec& b = s_.buckets[op.a].spec;
    op.sub = rng_.weighted({45, 35, 8, 4});
    op.n = rng_.percent(4) ? 0 : static_cast<std::size_t>(rng_.between(1, static_cast<int>(b.ladder.back()) + 2));
    op.stream = any_stream();
    op.b = rng_.percent(65) ? 0 : 1;
    op.x = rng_.word();
    op.y = small();
    op.z = static_cast<u32>(rng_.percent(8) && allowed("throw"));
    // A bucket rebound to a buffer that died since must not run (rebind does not keep `to` alive).
    const int i = op.n == 0 ? -1 : bucket_index(b, op.n);
    const BucketM& m = s_.buckets[op.a];
    if ((op.sub == 0 || op.sub == 1) && i >= 0 && m.captured[static_cast<std::size_t>(i)] && !bucket_locs_alive(m, i)) return false;
    return true;
  }

  //! The ladder index for n: -1 above the ladder.
  static int bucket_index(const BucketSpec& b, std::size_t n) {
    for (std::size_t i = 0; i < b.ladder.size(); ++i)
      if (b.ladder[i] >= n) return static_cast<int>(i);
    return -1;
  }

  // GraphBuckets' least-recently-used bookkeeping, as its documentation states it.
  void bucket_touch(BucketM& b, int i) { b.last_use[static_cast<std::size_t>(i)] = ++b.clock; }
  void bucket_capture(BucketM& b, int i) {
    b.captured[static_cast<std::size_t>(i)] = true;
    b.x_at[static_cast<std::size_t>(i)] = loc_x;  // a capture uses what the body uses: x and y
    b.y_at[static_cast<std::size_t>(i)] = loc_y;
    b.seq[static_cast<std::size_t>(i)] = s_.next_seq++;
    stats_.bucket_captures += 1;
    bucket_touch(b, i);
    if (b.spec.share || b.spec.max_exec == 0) return;
    std::size_t held = 0;
    int oldest = -1;
    for (int j = 0; j < static_cast<int>(b.captured.size()); ++j) {
      if (!b.captured[static_cast<std::size_t>(j)] || j == i) continue;
      ++held;
      if (oldest < 0 || b.last_use[static_cast<std::size_t>(j)] < b.last_use[static_cast<std::size_t>(oldest)]) oldest = j;
    }
    if (held >= b.spec.max_exec) {
      b.captured[static_cast<std::size_t>(oldest)] = false;
      stats_.bucket_evictions += 1;
    }
  }
  //! Element e of what bucket location `loc` holds (x, y, or a slot buffer): {known, value}.
  std::pair<bool, u32> bucket_get(const BucketM& b, int loc, std::size_t e) {
    if (loc == loc_x) return {b.x_known[e], b.x[e]};
    if (loc == loc_y) return {b.y_known[e], b.y[e]};
    const Value v = value(loc);
    return {v.known, v.at(e)};
  }
  //! Element e of bucket location `loc` becomes v. A slot buffer (larger than x and y) is written
  //! in part: the model does not follow its value then.
  void bucket_set(BucketM& b, int loc, std::size_t e, bool known, u32 v) {
    if (loc == loc_x || loc == loc_y) {
      (loc == loc_x ? b.x : b.y)[e] = v;
      (loc == loc_x ? b.x_known : b.y_known)[e] = known;
    } else {
      value(loc) = Value{};
    }
  }
  //! The body over `rows` rows: y = a2 * (a1 * x + b1) + b2 on the first k * rows elements, where
  //! bucket i reads x and writes y now (i < 0: a run above the ladder, the body as it is).
  void bucket_body(BucketM& b, std::size_t rows, int i) {
    const int xl = i < 0 ? loc_x : b.x_at[static_cast<std::size_t>(i)];
    const int yl = i < 0 ? loc_y : b.y_at[static_cast<std::size_t>(i)];
    const std::size_t n = b.spec.k * rows;
    std::vector<std::pair<bool, u32>> t(n);  // the temporary: every element read before y is written
    for (std::size_t e = 0; e < n; ++e) {
      const auto [known, x] = bucket_get(b, xl, e);
      t[e] = {known, b.spec.a1 * x + b.spec.b1};
    }
    for (std::size_t e = 0; e < n; ++e) bucket_set(b, yl, e, t[e].first, b.spec.a2 * t[e].second + b.spec.b2);
  }

  void destroy_bucket_buffers(Op& op, int slot) {
    BucketM& b = s_.buckets[slot];
    if (!b.buffers) return;
    sync_users(op, res_bucket(b.id), 0);  // freed in order on the stream that made them, which no run uses
    b = BucketM{};
  }

  void apply_bucket_new(Op& op) {
    destroy_bucket_buffers(op, op.a);
    BucketM& b = s_.buckets[op.a];
    b.exists = b.buffers = true;
    b.id = s_.next_uid++;
    b.spec = op.bucket;
    b.pool = op.bucket.pool >= 0 ? s_.shared[op.bucket.pool] : s_.next_pool++;
    const std::size_t cap = b.spec.capacity();
    b.x.resize(cap);
    b.y.resize(cap);
    for (std::size_t e = 0; e < cap; ++e) {
      b.x[e] = sequence(b.spec.x0, b.spec.xs).at(e);
      b.y[e] = sequence(b.spec.y0, b.spec.ys).at(e);
    }
    const std::size_t buckets = b.spec.ladder.size();
    b.captured.assign(buckets, false);
    b.x_known.assign(cap, true);
    b.y_known.assign(cap, true);
    b.x_at.assign(buckets, loc_x);
    b.y_at.assign(buckets, loc_y);
    b.last_use.assign(buckets, 0);
    b.seq.assign(buckets, 0);
    if (!b.spec.lazy)
      for (int i = static_cast<int>(buckets) - 1; i >= 0; --i) bucket_capture(b, i);  // largest first
  }

  void apply_bucket_run(Op& op) {
    BucketM& b = s_.buckets[op.a];
    const int i = op.n == 0 ? -1 : bucket_index(b.spec, op.n);
    if (op.sub == 2) {  // capture_all: nothing runs
      for (int j = static_cast<int>(b.spec.ladder.size()) - 1; j >= 0; --j)
        if (!b.captured[static_cast<std::size_t>(j)]) {
          if (op.z != 0) {
            op.expect = Outcome::User;  // the first capture throws: the ones before it stay
            return;
          }
          bucket_capture(b, j);
        }
      return;
    }
    if (op.n == 0 || op.sub == 3 || (i < 0 && b.spec.overflow_throw)) {
      op.expect = Outcome::Usage;  // checked before anything is issued
      return;
    }
    const bool staged = op.sub == 1;
    const std::size_t rows = i < 0 ? op.n : b.spec.ladder[static_cast<std::size_t>(i)];
    std::set<u64> touched{res_bucket(b.id)};
    if (i >= 0) pool_resources(b.pool, touched);
    if (i >= 0 && b.captured[static_cast<std::size_t>(i)])  // slot buffers a rebind moved the bucket to
      for (int loc : {b.x_at[static_cast<std::size_t>(i)], b.y_at[static_cast<std::size_t>(i)]})
        if (loc != loc_x && loc != loc_y) buffer_resources(loc, touched);
    issue(op, stream_uid(op.stream), touched);
    if (i >= 0 && !b.captured[static_cast<std::size_t>(i)]) {
      if (op.z != 0) {
        op.expect = Outcome::User;  // the bucket stays uncaptured; nothing was issued
        stats_.bucket_throws += 1;
        return;
      }
      bucket_capture(b, i);
    }
    if (staged) {  // into x where the bucket's rebinds moved it (a run above the ladder: x itself)
      const int xl = i < 0 ? loc_x : b.x_at[static_cast<std::size_t>(i)];
      stats_.bucket_staged_runs += 1;
      if (b.spec.zero_fill && rows > op.n) {
        stats_.bucket_zero_fills += 1;
        for (std::size_t e = b.spec.k * op.n; e < b.spec.k * rows; ++e) bucket_set(b, xl, e, true, 0);
      }
      for (std::size_t e = 0; e < b.spec.k * op.n; ++e) bucket_set(b, xl, e, true, sequence(op.x, op.y).at(e));
    }
    if (i < 0) {
      stats_.bucket_eager_runs += 1;
      if (op.z != 0) {
        op.expect = Outcome::User;  // the body throws before it issues anything (the copies ran)
        return;
      }
      bucket_body(b, rows, -1);
      return;
    }
    bucket_touch(b, i);
    stats_.bucket_shared_runs += b.spec.share;
    stats_.bucket_runs_rebound += b.x_at[static_cast<std::size_t>(i)] != loc_x || b.y_at[static_cast<std::size_t>(i)] != loc_y;
    clobber(b.pool, b.seq[static_cast<std::size_t>(i)]);
    bucket_body(b, rows, i);
  }

  // ---- PiecewiseGraph ----

  bool fill_piece_append(Op& op) {
    const std::vector<int> live = slots_where(piece_slots, [&](int i) { return s_.pieces[i].exists; });
    if (live.empty()) return false;
    op.a = rng_.pick(live);
    op.sub = rng_.percent(65) ? 0 : 1;
    GenCtx ctx = context();
    if (op.sub == 1) {
      ctx.eager = true;
      op.b = rng_.below(2);
      op.cap.program = gen_block(ctx, 0, 3);
      return true;
    }
    op.cap = gen_side(0, {});
    op.cap.slot = -1;
    op.cap.pool = rng_.percent(10) ? rng_.below(shared_pools) : -1;
    ctx.flat = true;
    if (op.cap.stream >= 0) ctx.side_streams_excluded.insert(op.cap.stream);
    op.cap.program = gen_block(ctx, 0, 4);
    maybe_terminal(ctx, op.cap.program, 8, true);
    return true;
  }

  void apply_piece_append(Op& op) {
    PiecewiseM& p = s_.pieces[op.a];
    if (op.sub == 1) {
      p.pieces.push_back(PieceM{true, op.cap.program, 0});
      p.count += 1;
      return;
    }
    if (op.cap.pool >= 0 && s_.shared[op.cap.pool] != p.pool) {
      op.expect = op.cap.expect = Outcome::Usage;  // another pool: refused first
      return;
    }
    const long seq = run_body(op, op.cap, p.pool, p.instance);
    op.expect = op.cap.expect = outcome_of(terminal_of(op.cap.program));
    if (op.expect != Outcome::Ok) return;  // not appended
    p.pieces.push_back(PieceM{false, op.cap.program, seq});
    p.count += 1;
  }

  bool piece_replayable(const PiecewiseM& p) {
    for (const PieceM& piece : p.pieces)
      if (!alive(usage(piece.program).buffers)) return false;
    return true;
  }

  void apply_piece_replay(Op& op) {
    PiecewiseM& p = s_.pieces[op.a];
    if (p.pieces.empty()) {
      op.expect = Outcome::Usage;
      return;
    }
    if (!piece_replayable(p)) fail("replay of a PiecewiseGraph whose buffer is gone");
    stats_.piece_replays_after_rebind += p.rebinds > 0;
    std::set<u64> touched;
    for (const PieceM& piece : p.pieces) replay_resources(piece.program, p.pool, touched);
    issue(op, stream_uid(op.stream), touched);
    stats_.piece_replays += 1;
    for (const PieceM& piece : p.pieces) {
      if (piece.step) {
        stats_.piece_steps += 1;
      } else {
        clobber(p.pool, piece.seq);
      }
      run(piece.program);
    }
  }

  // ---- apply ----

  void apply(Op& op) {
    for (int object : s_.checked_released) s_.retained.erase(object);
    s_.checked_released.clear();
    switch (op.kind) {
      case OpKind::NewStream: {
        destroy_stream(op.a);
        s_.stream[op.a] = s_.next_uid++;
        break;
      }
      case OpKind::DestroyStream: destroy_stream(op.a); break;
      case OpKind::MoveStream: {
        destroy_stream(op.b);
        s_.stream[op.b] = s_.stream[op.a];
        s_.stream[op.a] = 0;
        break;
      }
      case OpKind::SyncStream: sync_stream_uid(op, stream_uid(op.a)); break;
      case OpKind::NewBuffer: {
        destroy_buffer(op, op.a);
        const int uid = new_buffer(op.a, op.n, sequence(op.x, op.y), -1, 0, stream_uid(op.stream));
        std::set<u64> touched;
        buffer_resources(uid, touched);
        issue(op, stream_uid(op.stream), touched);
        break;
      }
      case OpKind::DestroyBuffer: destroy_buffer(op, op.a); break;
      case OpKind::MoveBuffer: {
        destroy_buffer(op, op.b);
        s_.buf[op.b] = s_.buf[op.a];
        s_.buf[op.a] = 0;
        break;
      }
      case OpKind::EagerFill:
      case OpKind::HostWrite: {
        const int uid = s_.buf[op.a];
        std::set<u64> touched;
        buffer_resources(uid, touched);
        issue(op, stream_uid(op.stream), touched);
        value(uid) = sequence(op.x, op.y);
        break;
      }
      case OpKind::EagerAffine: {
        const int dst = s_.buf[op.a];
        const int src = s_.buf[op.b];
        std::set<u64> touched;
        buffer_resources(dst, touched);
        buffer_resources(src, touched);
        issue(op, stream_uid(op.stream), touched);
        value(dst) = affine(value(src), op.x, op.y);
        break;
      }
      case OpKind::SetFlag:
        issue(op, stream_uid(op.stream), {res_flag(op.a)});
        s_.flag[op.a] = op.x != 0;
        break;
      case OpKind::SetCounter:
        issue(op, stream_uid(op.stream), {res_counter(op.a)});
        s_.counter[op.a] = static_cast<int>(op.x);
        break;
      case OpKind::NewGraph: {
        const int shared = static_cast<int>(op.x);
        destroy_graph(op.a);
        GraphM& g = s_.graphs[op.a];
        g = fresh_graph();
        g.opt_pool = shared >= 0 ? s_.shared[shared] : -1;
        g.opt_shared = shared;
        g.opt_mode = static_cast<int>(op.y);
        g.gpool = g.opt_pool;
        break;
      }
      case OpKind::DestroyGraph: destroy_graph(op.a); break;
      case OpKind::MoveGraph:
        destroy_graph(op.b);
        s_.graphs[op.b] = s_.graphs[op.a];
        s_.graphs[op.a] = fresh_graph();  // moved-from: a default-constructed graph
        break;
      case OpKind::ResetGraph: reset_graph(s_.graphs[op.a]); break;
      case OpKind::Capture: apply_capture(op); break;
      case OpKind::Round: apply_round(op); break;
      case OpKind::ReplayEmpty:
      case OpKind::SimpleMisuse: op.expect = Outcome::Usage; break;
      case OpKind::StageMisuse: op.expect = Outcome::Usage; break;
      case OpKind::DebugDump: op.expect = s_.graphs[op.a].captured ? Outcome::Ok : Outcome::Usage; break;
      case OpKind::PoolChecks:
        // Graph::pool() of every graph: one without a pool makes one now (and captures into it).
        for (GraphM& g : s_.graphs)
          if (g.exists && g.gpool < 0) g.gpool = s_.next_pool++;
        break;
      case OpKind::DropPool:
        // The test's handle to shared pool a is replaced by a new pool: the old one lives on in
        // its graphs (GraphOptions::pool included) and tensors, which keep using it.
        s_.shared[op.a] = s_.next_pool++;
        s_.ever_shared.insert(s_.shared[op.a]);
        break;
      case OpKind::Check:
        op.syncs.push_back(-1);
        device_sync();
        note_retained();
        break;
      case OpKind::Update: apply_update(op); break;
      case OpKind::Retain: s_.retained[static_cast<int>(op.x)] = s_.graphs[op.a].bundle; break;
      case OpKind::BucketNew: apply_bucket_new(op); break;
      case OpKind::BucketRun: apply_bucket_run(op); break;
      case OpKind::BucketDestroy:
        if (op.sub == 1) destroy_bucket_buffers(op, op.a);
        else s_.buckets[op.a].exists = false;  // its buffers stay (its runs may still use them)
        break;
      case OpKind::PieceNew: {
        PiecewiseM& p = s_.pieces[op.a];
        p = PiecewiseM{};
        p.exists = true;
        p.opt_shared = static_cast<int>(op.x);
        p.pool = p.opt_shared >= 0 ? s_.shared[p.opt_shared] : s_.next_pool++;
        p.instance = s_.next_uid++;
        break;
      }
      case OpKind::PieceAppend: apply_piece_append(op); break;
      case OpKind::PieceReplay: apply_piece_replay(op); break;
      case OpKind::PieceDestroy: s_.pieces[op.a] = PiecewiseM{}; break;
      case OpKind::Rebind: apply_rebind(op); break;
      case OpKind::PieceRebind: apply_piece_rebind(op); break;
      case OpKind::BucketRebind: apply_bucket_rebind(op); break;
      case OpKind::Quiesce: {
        op.syncs.push_back(-1);
        device_sync();
        note_retained();
        // Nothing is alive now: only the bundles of objects still to be checked are needed.
        std::set<int> needed;
        for (const auto& [object, bundle] : s_.retained) needed.insert(bundle);
        std::erase_if(s_.bundles, [&](const auto& entry) { return !needed.count(entry.first); });
        for (int k = 0; k < shared_pools; ++k) {  // the test makes new shared pools
          s_.shared[k] = s_.next_pool++;
          s_.ever_shared.insert(s_.shared[k]);
        }
        break;
      }
    }
  }

  //! After a Check: retained objects that must be gone now are forgotten at the next operation.
  void note_retained() {
    for (const auto& [object, bundle] : s_.retained) {
      const int e = retained_expectation(s_, object);
      (e > 0 ? stats_.retained_alive : (e < 0 ? stats_.retained_released : stats_.retained_unknown)) += 1;
      if (e < 0) s_.checked_released.insert(object);
    }
  }

  void check_invariants() {
    std::set<int> seen;
    for (int i = 0; i < buffer_slots; ++i) {
      const int uid = s_.buf[i];
      if (uid == 0) continue;
      if (!s_.buffers.count(uid)) fail("slot b" + std::to_string(i) + " names a dead buffer");
      if (!seen.insert(uid).second) fail("buffer #" + std::to_string(uid) + " is in two slots");
    }
    if (seen.size() != s_.buffers.size()) fail("a live buffer is in no slot");
    for (int c : s_.counter)
      if (c < -1 || c > max_count) fail("counter out of [-1, " + std::to_string(max_count) + "]: " + std::to_string(c));
    std::map<int, int> private_users;
    std::set<int> instances;
    for (const GraphM& g : s_.graphs) {
      if (!g.exists && g.captured) fail("a destroyed graph is captured");
      if (g.captured && (g.pool < 0 || g.seq <= 0)) fail("a captured graph without pool or sequence");
      if (g.captured && !s_.ever_shared.count(g.pool) && ++private_users[g.pool] > 1) fail("two graphs in one private pool");
      if (g.exists && (!s_.bundles.count(g.bundle) || !s_.bundles.at(g.bundle).owner)) fail("a live graph without its bundle");
      if (g.exists && !instances.insert(g.instance).second) fail("two graphs of one instance");
    }
    for (const BucketM& b : s_.buckets)
      if (b.exists && !b.buffers) fail("a GraphBuckets without its buffers");
    for (const auto& [uid, resources] : s_.pending) {
      if (resources.empty()) continue;
      if (uid != legacy_uid && stream_slot_of(uid) < 0 && !s_.dead.count(uid))
        fail("unfinished work on a stream the model lost track of");
    }
  }

  Rng rng_;
  long quiesce_every_;
  State s_;
  std::deque<Op> forced_;
  std::string error_;
  Stats stats_;
  std::set<std::string> without_;
};

}  // namespace tp_model
