// tensorplay/graph/conditional_handle.hpp: ConditionalHandle, the handle of a conditional node that
// the user's own kernels set (cudaGraphSetConditional).
#pragma once

#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_device_runtime_api.h>
#endif

namespace tensorplay {

class Graph;

//! The handle of a conditional node, made by Graph::conditional_handle inside an open capture and
//! given to exactly one conditional node (if_, while_, if_else_, switch_, IfScope, WhileScope,
//! begin_capture_to_if_node, begin_capture_to_while_node) of the same graph, at the same depth.
//! Trivially copyable: pass it to kernels by value, and call set() there. A kernel written for raw
//! CUDA graphs takes `native()`.
//!
//!     auto h = graph.conditional_handle(1);                 // 1 at every launch: a do-while
//!     graph.while_(h, [&](tensorplay::StreamRef s) {
//!       step<<<blocks, threads, 0, s>>>(x.data(), h);       // step calls h.set(0) to stop
//!     });
class ConditionalHandle {
 public:
  //! Names no node until assigned from Graph::conditional_handle().
  ConditionalHandle() = default;

#if defined(__CUDACC__)
  //! Sets the value the node reads when it is next evaluated: for if and while nodes non-zero
  //! means true, for a switch node it is the index of the body to run (cudaGraphSetConditional).
  __device__ void set(unsigned value) const { cudaGraphSetConditional(handle_, value); }
#endif

  //! The CUDA handle, for kernels written against cudaGraphConditionalHandle.
  [[nodiscard]] cudaGraphConditionalHandle native() const noexcept { return handle_; }

  //! Whether this handle was made by Graph::conditional_handle (a default one names no node).
  [[nodiscard]] explicit operator bool() const noexcept { return capture_ != 0; }

 private:
  friend class Graph;
  ConditionalHandle(cudaGraphConditionalHandle handle, std::uint64_t capture) noexcept
      : handle_(handle), capture_(capture) {}

  cudaGraphConditionalHandle handle_ = 0;
  std::uint64_t capture_ = 0;  // the capture that made it (CaptureSession::serial); 0: none
};

static_assert(std::is_trivially_copyable_v<ConditionalHandle>, "a ConditionalHandle is passed to kernels by value");

}  // namespace tensorplay
