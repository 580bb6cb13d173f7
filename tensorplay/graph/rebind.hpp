// tensorplay/graph/rebind.hpp: RebindResult, what Graph::rebind (and GraphBuckets::rebind,
// PiecewiseGraph::rebind) changed. The mechanism is in graph/detail/rebind.hpp.
#pragma once

#include <tensorplay/version.hpp>

#include <cstddef>

namespace tensorplay {

//! What a rebind changed.
struct RebindResult {
  //! Nodes of the executable (or executables) that use the new buffer from the next launch on:
  //! kernel, memset and memcpy nodes, those of conditional bodies and child graphs included.
  //! 0 when no node used the old buffer (nothing changed then).
  std::size_t nodes = 0;
};

}  // namespace tensorplay
