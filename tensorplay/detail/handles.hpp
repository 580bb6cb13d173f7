// tensorplay/detail/handles.hpp: one move-only owner per kind of CUDA handle the library owns.
//
// Each owner destroys its handle exactly once, in a noexcept destructor that ignores the status
// (a destructor cannot report it, and the handle is gone either way). Moving leaves the source
// empty; move-assignment destroys what the target held. Types that hold only these owners follow
// the rule of zero.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <utility>

namespace tensorplay::detail {

//! Owns one handle of type `Handle`; `Destroy` is a function returning cudaError_t.
template <class Handle, auto Destroy>
class UniqueHandle {
 public:
  constexpr UniqueHandle() noexcept = default;
  //! Takes ownership of `handle` (which may be null).
  constexpr explicit UniqueHandle(Handle handle) noexcept : handle_(handle) {}
  UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, Handle{})) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    UniqueHandle moved(std::move(other));
    std::swap(handle_, moved.handle_);
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  [[nodiscard]] constexpr Handle get() const noexcept { return handle_; }
  constexpr explicit operator bool() const noexcept { return handle_ != Handle{}; }

  //! Destroys the handle now (if any).
  void reset() noexcept {
    if (handle_ != Handle{}) (void)Destroy(std::exchange(handle_, Handle{}));
  }
  //! Gives up ownership: the caller destroys the returned handle.
  [[nodiscard]] Handle release() noexcept { return std::exchange(handle_, Handle{}); }
  //! Where a CUDA create call writes a new handle: destroys the current one first.
  [[nodiscard]] Handle* out() noexcept {
    reset();
    return &handle_;
  }

 private:
  Handle handle_{};
};

TENSORPLAY_DECL cudaError_t release_user_object(cudaUserObject_t object) noexcept;

// Graphs and executables may die while a capture is open (a Graph overwritten by another one
// inside a capture body): CUDA counts their destruction as a call a global-mode capture refuses,
// which would invalidate that capture. Destroyed in relaxed capture mode then.
TENSORPLAY_DECL cudaError_t destroy_graph(cudaGraph_t graph) noexcept;
TENSORPLAY_DECL cudaError_t destroy_exec(cudaGraphExec_t exec) noexcept;

using GraphHandle = UniqueHandle<cudaGraph_t, &destroy_graph>;
using ExecHandle = UniqueHandle<cudaGraphExec_t, &destroy_exec>;
using EventHandle = UniqueHandle<cudaEvent_t, &cudaEventDestroy>;
//! One reference to a user object (cudaUserObjectRelease of one reference on destruction).
using UserObjectRef = UniqueHandle<cudaUserObject_t, &release_user_object>;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/device.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL cudaError_t release_user_object(cudaUserObject_t object) noexcept { return cudaUserObjectRelease(object, 1); }

TENSORPLAY_DECL cudaError_t destroy_graph(cudaGraph_t graph) noexcept {
  if (!CaptureRegistry::instance().any_open()) return cudaGraphDestroy(graph);
  RelaxedCaptureMode relaxed;
  return cudaGraphDestroy(graph);
}

TENSORPLAY_DECL cudaError_t destroy_exec(cudaGraphExec_t exec) noexcept {
  if (!CaptureRegistry::instance().any_open()) return cudaGraphExecDestroy(exec);
  RelaxedCaptureMode relaxed;
  return cudaGraphExecDestroy(exec);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
