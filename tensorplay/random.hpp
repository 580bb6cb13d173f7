// tensorplay/random.hpp: RandomState, random numbers that change at every replay and every loop
// iteration, reproducible from a seed; PhiloxArgs, what a kernel takes to draw them.
//
// A kernel frozen into a graph with a seed and an offset by value draws the same numbers at every
// replay. A kernel that takes PhiloxArgs instead reads its offset from device memory, where a
// tiny advance kernel (or, in a graph, an advance node) put it just before: every eager launch,
// every replay and every iteration of a while_ body gets offsets no launch had before, in the
// order they run, and a replay stays one cudaGraphLaunch (docs/guide.md, "Random numbers").
// Compiles with any C++20 compiler: only the kernel that calls unpack (random.cuh) needs nvcc.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/kernels/kernel_abi.hpp>
#include <tensorplay/detail/random_state.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/stream.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

namespace tensorplay {

//! What one launch draws with: pass it to the kernel by value, and call unpack(args) there
//! (<tensorplay/random.cuh>). Opaque: its slot is device memory that the advance before the
//! launch fills.
struct PhiloxArgs {
  const detail::kernels::RandomSlot* slot = nullptr;  //!< {seed, first offset} of the draws it belongs to
  std::uint64_t intra = 0;                            //!< this launch's offset past that first offset
};
static_assert(std::is_trivially_copyable_v<PhiloxArgs> && sizeof(PhiloxArgs) == 16);

//! The arguments of curand_init(seed, subsequence, offset, &state) (or of any Philox code) for
//! one launch: the launch may use offsets [offset, offset + increment) of every subsequence.
struct PhiloxSeedOffset {
  std::uint64_t seed;
  std::uint64_t offset;
};

//! One Philox4x32-10 stream of random numbers (the generator curand_init and
//! curandStatePhilox4_32_10_t use) on the device current at construction.
//!
//!     tp::RandomState rng(1234);
//!     dropout<<<blocks, 256, 0, s>>>(x, n, rng.next(4));   // each thread draws 4 numbers
//!
//! next(increment) reserves `increment` offsets for the next launch on this thread's current
//! stream of the state's device, which must be the stream the launch goes to:
//!   - eagerly, it launches a one-thread kernel there that takes the offsets from the counter;
//!   - inside a capture (a Graph, a conditional body, or a raw cudaStreamBeginCapture with the
//!     stream given), it adds, once per stretch of the stream between conditional nodes, one
//!     advance node that does the same at every replay (or iteration), and no work per replay.
//! Offsets are taken in the order the work runs on the GPU, so the same seed and the same
//! sequence of eager launches and replays give the same numbers, whichever ran as a graph.
//! A graph keeps drawing from the state after the RandomState is destroyed (its counter lives as
//! long as the process: 16 bytes). Work on several streams at once draws in no defined order,
//! but never takes an offset twice.
//!
//! Thread-safe: every member may be called from any thread (a mutex orders the calls). Move-only;
//! a moved-from RandomState throws usage_error.
class RandomState {
 public:
  //! A sequence at offset 0 of `seed`, on the current device.
  //! \throws cuda_error without a usable GPU.
  explicit RandomState(std::uint64_t seed, tensorplay::source_location where = tensorplay::source_location::current());

  RandomState(RandomState&&) noexcept = default;
  RandomState& operator=(RandomState&&) noexcept = default;
  RandomState(const RandomState&) = delete;
  RandomState& operator=(const RandomState&) = delete;
  //! Graphs that drew from it keep working; the numbers they draw continue its sequence.
  ~RandomState() = default;

  //! Reserves `increment` offsets for the next launch on this thread's current stream of the
  //! state's device (in a capture: the capture stream, or the open conditional body's).
  //! \throws usage_error on a moved-from state; cuda_error when CUDA refuses, or when the
  //!         stream's capture was invalidated.
  PhiloxArgs next(std::uint64_t increment, tensorplay::source_location where = tensorplay::source_location::current());

  //! next(increment) for a launch on `stream` (which must belong to the state's device): for a
  //! stream that is not current, or a capture tensorplay did not begin.
  PhiloxArgs next(std::uint64_t increment, StreamRef stream,
                  tensorplay::source_location where = tensorplay::source_location::current());

  //! The seed of the sequence (the last one given).
  [[nodiscard]] std::uint64_t seed() const;

  //! Starts the sequence of `seed` at offset 0, in order on this thread's current stream of the
  //! state's device: eager work and replays issued after it there draw from the new sequence,
  //! graphs captured before included (they read the seed and the offset when they run).
  //! \throws usage_error while that stream is being captured.
  void set_seed(std::uint64_t seed, tensorplay::source_location where = tensorplay::source_location::current());

  //! The offsets used so far: by eager launches and by replays (each run of a captured draw,
  //! each iteration of a body, counts). It waits for the eager draws and reseeds issued so far,
  //! not for replays: it is exact once the replays that draw from this state have completed
  //! (synchronise their streams first); a replay still running may or may not be counted.
  [[nodiscard]] std::uint64_t offset(tensorplay::source_location where = tensorplay::source_location::current()) const;

  //! The device the sequence lives on.
  [[nodiscard]] int device() const;

 private:
  static PhiloxArgs next_on(detail::RandomStateImpl& impl, std::uint64_t increment, cudaStream_t stream,
                            const tensorplay::source_location& where);

  [[nodiscard]] detail::RandomStateImpl& get(const char* what) const;

  std::unique_ptr<detail::RandomStateImpl> impl_;
};

}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay {

TENSORPLAY_DECL RandomState::RandomState(std::uint64_t seed, tensorplay::source_location where) : impl_(std::make_unique<detail::RandomStateImpl>(seed, where)) {}

TENSORPLAY_DECL PhiloxArgs RandomState::next(std::uint64_t increment, tensorplay::source_location where) {
  detail::RandomStateImpl& impl = get("next");
  return next_on(impl, increment, current_stream(impl.device()), where);
}

TENSORPLAY_DECL PhiloxArgs RandomState::next(std::uint64_t increment, StreamRef stream,
    tensorplay::source_location where) {
  detail::RandomStateImpl& impl = get("next");
  if (const int device = stream.device(where); device != impl.device())
    detail::throw_usage("RandomState::next: the stream belongs to device " + std::to_string(device) +
                        ", the state to device " + std::to_string(impl.device()));
  return next_on(impl, increment, stream, where);
}

TENSORPLAY_DECL std::uint64_t RandomState::seed() const { return get("seed").seed(); }

TENSORPLAY_DECL void RandomState::set_seed(std::uint64_t seed, tensorplay::source_location where) {
  detail::RandomStateImpl& impl = get("set_seed");
  impl.set_seed(seed, current_stream(impl.device()), where);
}

TENSORPLAY_DECL std::uint64_t RandomState::offset(tensorplay::source_location where) const {
  return get("offset").offset(where);
}

TENSORPLAY_DECL int RandomState::device() const { return get("device").device(); }

TENSORPLAY_DECL PhiloxArgs RandomState::next_on(detail::RandomStateImpl& impl, std::uint64_t increment, cudaStream_t stream,
    const tensorplay::source_location& where) {
  const detail::Draw d = impl.next(increment, stream, where);
  return PhiloxArgs{d.slot, d.intra};
}

TENSORPLAY_DECL detail::RandomStateImpl& RandomState::get(const char* what) const {
  if (!impl_) [[unlikely]]
    detail::throw_usage(std::string("RandomState::") + what + ": this RandomState was moved from");
  return *impl_;
}

}  // namespace tensorplay
#endif  // TENSORPLAY_DEFINE_BODIES
