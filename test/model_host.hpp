// test/model_host.hpp: the host side of test/model_test.cu: a random generator of operations on
// the public API and a host model that predicts, for each of them, every buffer's value and
// whether (and with which type) the call throws. No CUDA and no tensorplay here, so the model
// runs, and is checked, on a machine without a GPU.
//
// The world: 16 buffer slots (DeviceTensor<int>, sizes 64 or 700), 8 graph slots, 4 stream slots
// (plus the legacy default stream), 3 shared pools, 3 bool flags and 3 int counters (one-element
// device tensors that conditional nodes read). A buffer's value is an affine sequence
// v[i] = base + i * stride (mod 2^32), closed under the kernels used (v = a * w + b), so the model
// is exact. A value can also be unknown: memory a capture allocated is never initialised, and
// pool memory may be overwritten by graphs captured earlier into the same pool (see Round).
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
  Throw,           // the body throws a user exception (always the last statement)
  Forbidden,       // index 0: cudaStreamSynchronize(capture stream); 1: cudaDeviceSynchronize (always the last)
};
inline constexpr int stmt_kind_count = 15;

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
  std::vector<std::vector<Stmt>> bodies;
};
using Block = std::vector<Stmt>;

// ---- operations ------------------------------------------------------------------------------

enum class OpKind : std::uint8_t {
  NewStream, DestroyStream, MoveStream, SyncStream,
  NewBuffer, DestroyBuffer, MoveBuffer, EagerFill, EagerAffine, HostWrite, SetFlag, SetCounter,
  NewGraph, DestroyGraph, MoveGraph, ResetGraph,
  Capture, Round, ReplayEmpty, StageMisuse, SimpleMisuse, DebugDump, PoolChecks, DropPool, Check, Quiesce,
};
inline constexpr int op_kind_count = 26;

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
  int pool = -1;  // model pool id of the capture
  bool conditional = false;
  Block program;
  std::vector<int> buffers;  // uids of the buffers the program uses (all must be alive to replay)
  std::set<u64> touches;     // resources the program reads or writes
};

inline u64 res_buffer(int uid) { return (u64{1} << 40) | static_cast<u64>(uid); }
inline u64 res_flag(int f) { return (u64{2} << 40) | static_cast<u64>(f); }
inline u64 res_counter(int c) { return (u64{3} << 40) | static_cast<u64>(c); }
inline u64 res_pool(int id) { return (u64{4} << 40) | static_cast<u64>(id); }

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
  int next_uid = 100;
  int next_pool = 10;
  long next_seq = 1;
};

// ---- descriptions (the failure trace) ---------------------------------------------------------

inline const char* name(OpKind k) {
  static const char* const names[] = {"NewStream", "DestroyStream", "MoveStream", "SyncStream", "NewBuffer",
                                      "DestroyBuffer", "MoveBuffer", "EagerFill", "EagerAffine", "HostWrite",
                                      "SetFlag", "SetCounter", "NewGraph", "DestroyGraph", "MoveGraph",
                                      "ResetGraph", "Capture", "Round", "ReplayEmpty", "StageMisuse",
                                      "SimpleMisuse", "DebugDump", "PoolChecks", "DropPool", "Check", "Quiesce"};
  return names[static_cast<int>(k)];
}
inline const char* name(StmtKind k) {
  static const char* const names[] = {"fill", "affine", "temp", "alloc", "side_alloc", "set_flag", "set_counter", "if",
                                      "if_else", "while", "switch", "bad_predicate", "end_without_body", "throw",
                                      "forbidden"};
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

inline std::string describe(const Op& op) {
  std::string out = name(op.kind);
  auto field = [&](const char* label, long v) {
    if (v >= 0) out += std::string(" ") + label + std::to_string(v);
  };
  switch (op.kind) {
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
  long if_taken = 0, if_skipped = 0, while_iterations = 0, switch_taken = 0, switch_none = 0;
  long multi_graph_rounds = 0, clobbered = 0, stream_syncs = 0, device_syncs = 0, dead_stream_syncs = 0;
  long conditional_replays = 0, staged_conditional_replays = 0;
};

inline Op simple_op(OpKind kind, int a = -1) {
  Op op;
  op.kind = kind;
  op.a = a;
  return op;
}

//! Generates operations and applies them to the host state. next() returns an operation with
//! its expected outcome and the synchronisations to do first; state() is then what the GPU must
//! hold once that operation's work has completed.
class Model {
 public:
  //! `quiesce_every`: every that many operations, destroy everything (random order) and measure.
  //! `without`: names of operations, statements or capture variants never to generate (as
  //! name() spells them), plus "stage" (no stage_and_launch in rounds) and "stage_conditional"
  //! (none on graphs with conditional nodes): to run the rest while a known defect is fixed.
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
    if (quiesce_every_ > 0 && index > 0 && index % quiesce_every_ == 0 && forced_.empty()) plan_quiesce();
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

  //! What a moved-from Graph is: a default-constructed one.
  static GraphM moved_from() {
    GraphM g;
    g.exists = true;
    return g;
  }

  void count(const Op& op) {
    stats_.ops[static_cast<int>(op.kind)] += 1;
    stats_.outcomes[static_cast<int>(op.expect)] += 1;
    if (op.kind == OpKind::Capture) {
      stats_.variants[static_cast<int>(op.variant)] += 1;
      if (op.cap.expect != Outcome::Usage) count(op.cap.program);
      if (op.variant == Variant::Interleaved) count(op.cap2.program);
    }
    if (op.kind == OpKind::Round) {
      if (op.items.size() > 1) stats_.multi_graph_rounds += 1;
      for (const ReplayItem& item : op.items)
        for (const StagePair& p : item.pairs) stats_.stage_inputs[static_cast<std::size_t>(p.input)] += 1;
    }
    for (int sync : op.syncs) (sync < 0 ? stats_.device_syncs : stats_.stream_syncs) += 1;
  }
  void count(const Block& block) {
    for (const Stmt& st : block) {
      stats_.statements[static_cast<int>(st.kind)] += 1;
      for (const Block& body : st.bodies) count(body);
    }
  }

  int stream_uid(int slot) const { return slot == legacy_stream ? legacy_uid : s_.stream[slot]; }
  int stream_slot_of(int uid) const {
    if (uid == legacy_uid) return legacy_stream;
    for (int i = 0; i < stream_slots; ++i)
      if (s_.stream[i] == uid) return i;
    return -1;
  }
  std::vector<int> live_streams() const {
    std::vector<int> out;
    for (int i = 0; i < stream_slots; ++i)
      if (s_.stream[i] != 0) out.push_back(i);
    return out;
  }
  //! A stream for eager work or replays: a live slot, or (1 in 8, or when none) the legacy stream.
  int any_stream() {
    std::vector<int> live = live_streams();
    if (live.empty() || rng_.below(8) == 0) return legacy_stream;
    return rng_.pick(live);
  }
  std::vector<int> buffer_slots_where(std::size_t n = 0) const {
    std::vector<int> out;
    for (int i = 0; i < buffer_slots; ++i)
      if (s_.buf[i] != 0 && (n == 0 || s_.buffers.at(s_.buf[i]).n == n)) out.push_back(i);
    return out;
  }
  std::vector<int> graph_slots_where(int captured /* -1 any, 0 not captured, 1 captured */) const {
    std::vector<int> out;
    for (int i = 0; i < graph_slots; ++i) {
      const GraphM& g = s_.graphs[i];
      if (g.exists && (captured < 0 || g.captured == (captured == 1))) out.push_back(i);
    }
    return out;
  }
  bool replayable(const GraphM& g) const {
    if (!g.exists || !g.captured) return false;
    for (int uid : g.buffers)
      if (!s_.buffers.count(uid)) return false;
    return true;
  }
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

  void destroy_buffer(Op& op, int slot) {
    const int uid = s_.buf[slot];
    if (uid == 0) return;
    const BufferM& b = s_.buffers.at(uid);
    for (bool again = true; again;) {
      again = false;
      for (const auto& [other, resources] : s_.pending) {
        if (other != b.alloc_stream && resources.count(res_buffer(uid))) {
          sync_stream_uid(op, other);
          again = true;
          break;
        }
      }
    }
    s_.buffers.erase(uid);
    s_.buf[slot] = 0;
  }
  void destroy_stream(int slot) {
    const int uid = s_.stream[slot];
    if (uid == 0) return;
    if (auto it = s_.pending.find(uid); it != s_.pending.end() && !it->second.empty()) s_.dead.insert(uid);
    s_.stream[slot] = 0;
  }
  void destroy_graph(int slot) { s_.graphs[slot] = GraphM{}; }
  int new_buffer(int slot, std::size_t n, Value v, int pool, long seq, int alloc_stream) {
    const int uid = s_.next_uid++;
    s_.buffers[uid] = BufferM{n, v, pool, seq, alloc_stream};
    s_.buf[slot] = uid;
    return uid;
  }

  // ---- the program interpreter (a replay) ----

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
  void run(const Stmt& st) {
    switch (st.kind) {
      case StmtKind::Fill: value(st.dst) = sequence(st.a, st.b); break;
      case StmtKind::Affine: value(st.dst) = affine(value(st.src), st.a, st.b); break;
      case StmtKind::Temp: value(st.dst) = affine(affine(value(st.src), st.a, st.b), st.c, st.d); break;
      case StmtKind::Alloc: value(st.dst) = st.src != 0 ? affine(value(st.src), st.a, st.b) : sequence(st.c, st.d); break;
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

  //! Every live graph, buffer and stream destroyed in a random order, then Quiesce.
  void plan_quiesce() {
    std::vector<Op> ops;
    for (int i = 0; i < graph_slots; ++i)
      if (s_.graphs[i].exists) ops.push_back(simple_op(OpKind::DestroyGraph, i));
    for (int i = 0; i < buffer_slots; ++i)
      if (s_.buf[i] != 0) ops.push_back(simple_op(OpKind::DestroyBuffer, i));
    for (int i = 0; i < stream_slots; ++i)
      if (s_.stream[i] != 0) ops.push_back(simple_op(OpKind::DestroyStream, i));
    for (std::size_t i = ops.size(); i > 1; --i) std::swap(ops[i - 1], ops[static_cast<std::size_t>(rng_.below(static_cast<int>(i)))]);
    forced_.assign(ops.begin(), ops.end());
    forced_.push_back(simple_op(OpKind::Quiesce));
  }

  // ---- captures ----

  //! What a program may use while it is generated.
  struct GenCtx {
    std::array<int, buffer_slots> uid{};              // buffer uid per slot at this point of the program
    std::array<std::size_t, buffer_slots> n{};
    std::set<int> used;                               // uids referenced (not to be replaced later)
    std::set<int> fresh;                              // slots filled by this program (not replaced again)
    std::set<int> no_target;                          // slots that must not be replaced
    std::set<int> side_streams_excluded;              // stream slots SideAlloc must not use
    std::array<bool, flag_count> flag_locked{};
    std::array<bool, counter_count> counter_locked{};
    int budget = max_statements;
    bool top_explicit = false;  // no current-stream allocations at the top level (interleaved captures)
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
    const bool targets = !ctx_targets(ctx).empty();
    const bool nest = depth < max_depth && ctx.budget >= 2;
    std::vector<int> free_counters, free_flags;
    for (int c = 0; c < counter_count; ++c)
      if (!ctx.counter_locked[c]) free_counters.push_back(c);
    for (int f = 0; f < flag_count; ++f)
      if (!ctx.flag_locked[f]) free_flags.push_back(f);
    std::vector<int> side;
    for (int sl : live_streams())
      if (!ctx.side_streams_excluded.count(sl)) side.push_back(sl);
    const int k = rng_.weighted(allowed_weights<StmtKind>({
        have ? 14 : 0,                          // Fill
        have ? 22 : 0,                          // Affine
        have ? 7 : 0,                           // Temp
        targets ? 8 : 0,                        // Alloc
        targets && !side.empty() ? 2 : 0,       // SideAlloc
        free_flags.empty() ? 0 : 5,             // SetFlag
        free_counters.empty() ? 0 : 5,          // SetCounter
        nest ? 8 : 0,                           // If
        nest ? 4 : 0,                           // IfElse
        nest && !free_counters.empty() ? 6 : 0,  // While
        nest ? 4 : 0,                           // Switch
        2,                                      // BadPredicate
        depth == 0 ? 2 : 0,                     // EndWithoutBody
    }));
    if (k < 0) return false;
    st.kind = static_cast<StmtKind>(k);
    --ctx.budget;
    switch (st.kind) {
      case StmtKind::Fill:
        st.dst_slot = rng_.pick(ctx_buffers(ctx));
        st.dst = use(ctx, st.dst_slot);
        st.n = ctx.n[st.dst_slot];
        st.a = rng_.word();
        st.b = small();
        break;
      case StmtKind::Affine:
      case StmtKind::Temp:
        st.dst_slot = rng_.pick(ctx_buffers(ctx));
        st.n = ctx.n[st.dst_slot];
        st.src_slot = rng_.pick(ctx_buffers(ctx, st.n));
        st.dst = use(ctx, st.dst_slot);
        st.src = use(ctx, st.src_slot);
        st.a = small();
        st.b = rng_.word();
        st.c = small();
        st.d = rng_.word();
        st.on_current_stream = rng_.percent(50) && !(depth == 0 && ctx.top_explicit);
        break;
      case StmtKind::Alloc:
      case StmtKind::SideAlloc: {
        st.dst_slot = rng_.pick(ctx_targets(ctx));
        st.n = any_size();
        std::vector<int> sources = ctx_buffers(ctx, st.n);
        std::erase(sources, st.dst_slot);  // the old occupant dies when the new tensor takes its slot
        if (st.kind == StmtKind::Alloc && !sources.empty() && rng_.percent(50)) {
          st.src_slot = rng_.pick(sources);
          st.src = use(ctx, st.src_slot);
        }
        st.a = st.kind == StmtKind::Alloc && st.src != 0 ? small() : rng_.word();
        st.b = st.kind == StmtKind::Alloc && st.src != 0 ? rng_.word() : small();
        st.c = rng_.word();
        st.d = small();
        if (st.kind == StmtKind::SideAlloc) st.index = rng_.pick(side);
        st.on_current_stream = st.kind == StmtKind::Alloc && rng_.percent(50) && !(depth == 0 && ctx.top_explicit);
        st.dst = s_.next_uid++;  // reserved now; the buffer exists once the capture has run
        ctx.uid[st.dst_slot] = st.dst;
        ctx.n[st.dst_slot] = st.n;
        ctx.fresh.insert(st.dst_slot);
        ctx.used.insert(st.dst);
        break;
      }
      case StmtKind::SetFlag:
        st.index = rng_.pick(free_flags);
        st.a = static_cast<u32>(rng_.below(2));
        break;
      case StmtKind::SetCounter:
        st.index = rng_.pick(free_counters);
        st.a = static_cast<u32>(rng_.between(0, max_count));
        break;
      case StmtKind::If:
      case StmtKind::IfElse:
      case StmtKind::Switch: {
        const bool is_if = st.kind != StmtKind::Switch;
        st.index = rng_.below(is_if ? flag_count : counter_count);
        st.pred = rng_.percent(30) ? PredForm::Functor : PredForm::Tensor;
        st.form = static_cast<BodyForm>(rng_.below(st.kind == StmtKind::If ? 4 : 2));
        const int bodies = st.kind == StmtKind::If ? 1 : (st.kind == StmtKind::IfElse ? 2 : rng_.between(1, 3));
        for (int i = 0; i < bodies; ++i) st.bodies.push_back(gen_block(ctx, depth + 1, 3));
        break;
      }
      case StmtKind::While: {
        st.index = rng_.pick(free_counters);
        const int p = rng_.below(free_flags.empty() ? 1 : 3);
        st.pred = p == 0 ? PredForm::CounterFunctor : (p == 1 ? PredForm::Tensor : PredForm::Functor);
        if (p != 0) st.flag = rng_.pick(free_flags);
        st.form = static_cast<BodyForm>(rng_.below(4));
        // The body must not write what decides the loop, or it might never end.
        ctx.counter_locked[st.index] = true;
        if (st.flag >= 0) ctx.flag_locked[st.flag] = true;
        st.bodies.push_back(gen_block(ctx, depth + 1, 3));
        ctx.counter_locked[st.index] = false;
        if (st.flag >= 0) ctx.flag_locked[st.flag] = false;
        break;
      }
      default: break;  // BadPredicate, EndWithoutBody
    }
    return true;
  }

  //! Appends a chain of `depth` conditionals ending in `terminal` (the last statement captured).
  void add_terminal(GenCtx& ctx, Block& top, StmtKind terminal) {
    Block* at = &top;
    const int depth = rng_.below(max_depth + 1);
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

  int effective_pool_index(const CaptureSide& c) const {  // shared index, -1: private
    if (c.pool >= 0) return c.pool;
    return s_.graphs[c.slot].opt_shared;
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
    const int cap_stream = op.cap.stream_mode == StreamMode::Explicit || op.cap.stream_mode == StreamMode::Guard ? op.cap.stream : -1;
    if (cap_stream >= 0) ctx.side_streams_excluded.insert(cap_stream);

    switch (op.variant) {
      case Variant::Lambda:
      case Variant::Manual: {
        op.cap.program = gen_block(ctx, 0, 5);
        const bool may_throw = op.variant == Variant::Lambda && allowed("throw");  // a manual capture has no body to abandon
        const bool may_break = allowed("forbidden");
        if (rng_.percent(14) && (may_throw || may_break))
          add_terminal(ctx, op.cap.program, may_throw && (!may_break || rng_.percent(50)) ? StmtKind::Throw : StmtKind::Forbidden);
        return true;
      }
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
        op.cap.program = gen_block(ctx, 0, 5);
        op.split = rng_.between(0, static_cast<int>(op.cap.program.size()));
        op.cap2.slot = rng_.below(graph_slots);
        return op.cap2.slot != slot;
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
        const int p1 = effective_pool_index(op.cap);
        if (p1 >= 0 && effective_pool_index(op.cap2) == p1) op.cap2.pool = (p1 + 1) % shared_pools;
        ctx.top_explicit = true;
        ctx.side_streams_excluded.insert(op.cap2.stream);
        op.cap.program = gen_block(ctx, 0, 4);
        // The second program runs interleaved with the first: it must neither use nor replace the
        // slots the first one fills, nor replace buffers the first one uses (the first program
        // was generated without knowing the second, which therefore replaces nothing it uses).
        GenCtx second = context();
        second.top_explicit = true;
        second.side_streams_excluded = ctx.side_streams_excluded;
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
          const int p1 = effective_pool_index(op.cap);
          op.cap2.pool = p1 >= 0 ? (p1 + 1) % shared_pools : rng_.below(shared_pools);
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
      for (const Block& body : st.bodies) create_allocations(body, pool, seq, cap_stream_uid, depth + 1);
    }
  }

  //! A capture whose body runs: its allocations happen; returns {pool, sequence number}.
  std::pair<int, long> run_capture(Op& op, const CaptureSide& c) {
    destroy_targets(op, c.program);
    const int pool = capture_pool(c);
    const long seq = s_.next_seq++;
    create_allocations(c.program, pool, seq, cap_stream_uid(c), 0);
    return {pool, seq};
  }

  static StmtKind terminal_of(const Block& block) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::Throw || st.kind == StmtKind::Forbidden) return st.kind;
      for (const Block& body : st.bodies)
        if (StmtKind k = terminal_of(body); k == StmtKind::Throw || k == StmtKind::Forbidden) return k;
    }
    return StmtKind::Fill;
  }

  void collect(const Block& block, GraphM& g) {
    for (const Stmt& st : block) {
      if (st.kind == StmtKind::SideAlloc) continue;
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

  int cap_stream_uid(const CaptureSide& c) const {
    return c.stream_mode == StreamMode::Explicit || c.stream_mode == StreamMode::Guard ? stream_uid(c.stream) : side_uid;
  }

  //! The pool a capture goes into: CaptureOptions, else GraphOptions, else a new private pool.
  int capture_pool(const CaptureSide& c) {
    if (c.pool >= 0) return s_.shared[c.pool];
    if (s_.graphs[c.slot].opt_pool >= 0) return s_.graphs[c.slot].opt_pool;
    return s_.next_pool++;
  }

  //! The graph after a successful capture of `c` into (pool, seq).
  GraphM captured(const CaptureSide& c, const GraphM& options, std::pair<int, long> at) {
    GraphM g = options;
    g.captured = true;
    g.pool = at.first;
    g.seq = at.second;
    g.program = c.program;
    collect(g.program, g);
    std::sort(g.buffers.begin(), g.buffers.end());
    g.buffers.erase(std::unique(g.buffers.begin(), g.buffers.end()), g.buffers.end());
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
        if (terminal == StmtKind::Throw || terminal == StmtKind::Forbidden) {
          op.cap.expect = terminal == StmtKind::Throw ? Outcome::User : Outcome::Cuda;
          break;  // abandoned: the graph holds nothing
        }
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
      case Variant::GraphReset: (void)run_capture(op, op.cap); break;  // still the same, empty, graph
      case Variant::MovedMidCapture: {
        const GraphM done = captured(op.cap, g, run_capture(op, op.cap));
        s_.graphs[op.cap2.slot] = done;
        s_.graphs[op.cap.slot] = moved_from();  // moved-from: a default-constructed graph
        break;
      }
    }
    op.expect = op.cap.expect;
  }

  // ---- replays ----

  bool fill_round(Op& op) {
    std::map<int, std::vector<int>> by_pool;  // pool -> replayable graph slots
    for (int i = 0; i < graph_slots; ++i)
      if (replayable(s_.graphs[i])) by_pool[s_.graphs[i].pool].push_back(i);
    if (by_pool.empty()) return false;
    std::vector<int> pools;
    for (const auto& [pool, slots] : by_pool) pools.push_back(pool);
    std::vector<int> slots = by_pool[rng_.pick(pools)];
    // Capture order; a subsequence of it keeps that order (the pool contract).
    std::sort(slots.begin(), slots.end(), [&](int x, int y) { return s_.graphs[x].seq < s_.graphs[y].seq; });
    std::vector<int> chosen;
    for (int sl : slots)
      if (slots.size() == 1 || rng_.percent(80)) chosen.push_back(sl);
    if (chosen.empty()) chosen.push_back(slots.front());
    op.stream = any_stream();
    for (int sl : chosen) {
      ReplayItem item;
      item.slot = sl;
      const GraphM& g = s_.graphs[sl];
      const bool stage = allowed("stage") && (!g.conditional || allowed("stage_conditional"));
      item.how = rng_.weighted({45, 15, stage ? 25 : 0, stage ? 15 : 0});
      if (item.how >= 2) {
        const int pairs = rng_.between(1, 2);
        std::vector<int> statics;
        for (int p = 0; p < pairs; ++p) {
          std::vector<int> candidates;
          for (int b = 0; b < buffer_slots; ++b) {
            if (s_.buf[b] == 0 || std::find(statics.begin(), statics.end(), b) != statics.end()) continue;
            const bool read_by_graph = std::binary_search(g.buffers.begin(), g.buffers.end(), s_.buf[b]);
            if (read_by_graph || rng_.percent(30)) candidates.push_back(b);
          }
          if (candidates.empty()) break;
          StagePair pair;
          pair.static_slot = rng_.pick(candidates);
          pair.static_uid = s_.buf[pair.static_slot];
          statics.push_back(pair.static_slot);
          pair.input = rng_.weighted({40, 35, 25});
          pair.base = rng_.word();
          pair.stride = small();
          item.pairs.push_back(pair);
        }
        for (StagePair& pair : item.pairs) {
          if (pair.input != 0) continue;
          std::vector<int> inputs;
          for (int b : buffer_slots_where(s_.buffers.at(pair.static_uid).n))
            if (std::find(statics.begin(), statics.end(), b) == statics.end()) inputs.push_back(b);
          if (inputs.empty()) {
            pair.input = 1;
            continue;
          }
          pair.input_slot = rng_.pick(inputs);
          pair.input_uid = s_.buf[pair.input_slot];
        }
        if (item.pairs.empty()) item.how -= 2;
      }
      op.items.push_back(std::move(item));
    }
    return true;
  }

  void apply_round(Op& op) {
    const int su = stream_uid(op.stream);
    const int pool = s_.graphs[op.items.front().slot].pool;
    std::set<u64> touched{res_pool(pool)};
    for (const ReplayItem& item : op.items) {
      const GraphM& g = s_.graphs[item.slot];
      touched.insert(g.touches.begin(), g.touches.end());
      for (const StagePair& p : item.pairs) {
        buffer_resources(p.static_uid, touched);
        if (p.input == 0) buffer_resources(p.input_uid, touched);
      }
    }
    // Memory of pool `pool` allocated by later captures may lie where this pool's earlier graphs
    // keep their temporaries: every buffer of the pool counts as touched.
    for (const auto& [uid, b] : s_.buffers)
      if (b.pool == pool) touched.insert(res_buffer(uid));
    issue(op, su, touched);
    for (const ReplayItem& item : op.items) {
      const GraphM g = s_.graphs[item.slot];
      if (g.pool != pool || !replayable(g)) fail("round over graphs that cannot replay together");
      // The copies come first (a node in front of the graph), all reading before any writes.
      std::vector<std::pair<int, Value>> staged;
      for (const StagePair& p : item.pairs) staged.emplace_back(p.static_uid, p.input == 0 ? value(p.input_uid) : sequence(p.base, p.stride));
      for (const auto& [uid, v] : staged) value(uid) = v;
      // Then the graph, which may overwrite, with its temporaries, pool memory that captures
      // after it allocated (that is why graphs sharing a pool replay in capture order). Its
      // program cannot name such buffers: they did not exist when it was captured. Nor can its
      // statements before an allocation name what that allocation returns, but they may have
      // used the memory as a temporary: a tensor allocated inside a conditional body holds
      // garbage after a replay that skips the body.
      for (auto& [uid, b] : s_.buffers)
        if (b.pool == pool && (b.seq > g.seq || (b.seq == g.seq && b.in_body))) {
          stats_.clobbered += b.value.known;
          b.value = Value{};
        }
      if (g.conditional) (item.pairs.empty() ? stats_.conditional_replays : stats_.staged_conditional_replays) += 1;
      run(g.program);
    }
  }

  // ---- apply ----

  void apply(Op& op) {
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
        s_.graphs[op.a] = GraphM{};
        s_.graphs[op.a].exists = true;
        s_.graphs[op.a].opt_pool = shared >= 0 ? s_.shared[shared] : -1;
        s_.graphs[op.a].opt_shared = shared;
        s_.graphs[op.a].opt_mode = static_cast<int>(op.y);
        break;
      }
      case OpKind::DestroyGraph: destroy_graph(op.a); break;
      case OpKind::MoveGraph:
        s_.graphs[op.b] = s_.graphs[op.a];
        s_.graphs[op.a] = moved_from();  // moved-from: a default-constructed graph
        break;
      case OpKind::ResetGraph: {
        GraphM& g = s_.graphs[op.a];
        g.captured = false;
        g.seq = 0;
        g.pool = -1;
        g.conditional = false;
        g.program.clear();
        g.buffers.clear();
        g.touches.clear();
        break;
      }
      case OpKind::Capture: apply_capture(op); break;
      case OpKind::Round: apply_round(op); break;
      case OpKind::ReplayEmpty:
      case OpKind::SimpleMisuse: op.expect = Outcome::Usage; break;
      case OpKind::StageMisuse: op.expect = Outcome::Usage; break;
      case OpKind::DebugDump: op.expect = s_.graphs[op.a].captured ? Outcome::Ok : Outcome::Usage; break;
      case OpKind::PoolChecks:
        for (int i = 0; i < graph_slots; ++i) {
          const GraphM& g = s_.graphs[i];
          const int k = shared_index(g.captured ? g.pool : g.opt_pool);
          if (g.exists && k >= 0) op.pool_expectations.emplace_back(i, k);
        }
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
        break;
      case OpKind::Quiesce:
        op.syncs.push_back(-1);
        device_sync();
        for (int k = 0; k < shared_pools; ++k) {  // the test makes new shared pools
          s_.shared[k] = s_.next_pool++;
          s_.ever_shared.insert(s_.shared[k]);
        }
        break;
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
    for (const GraphM& g : s_.graphs) {
      if (!g.exists && g.captured) fail("a destroyed graph is captured");
      if (g.captured && (g.pool < 0 || g.seq <= 0)) fail("a captured graph without pool or sequence");
      if (g.captured && !s_.ever_shared.count(g.pool) && ++private_users[g.pool] > 1) fail("two graphs in one private pool");
    }
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
