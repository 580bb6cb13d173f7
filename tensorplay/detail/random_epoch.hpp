// tensorplay/detail/random_epoch.hpp: a count, per thread, of the conditional nodes captured so far.
//
// Inside a capture, RandomState serves the launches of one stretch of a stream (a segment) from
// one advance node at its start (random_segment.hpp). A conditional node ends the stretch: its
// body draws at every iteration, in between, so launches after the node must take their offsets
// after the body's, as they would eagerly. conditional_builder.hpp bumps this count for every
// node it creates; a segment that sees the count change starts a new one.
#pragma once

#include <tensorplay/config.hpp>

#include <cstdint>

namespace tensorplay::detail {

//! This thread's count of conditional nodes created by tensorplay captures.
TENSORPLAY_PROCESS_WIDE TENSORPLAY_DECL std::uint64_t& conditional_epoch() noexcept;

//! A conditional node was added to a capture of this thread.
TENSORPLAY_DECL void note_conditional_node() noexcept;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL std::uint64_t& conditional_epoch() noexcept {
  thread_local std::uint64_t epoch = 0;
  return epoch;
}

TENSORPLAY_DECL void note_conditional_node() noexcept { ++conditional_epoch(); }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
