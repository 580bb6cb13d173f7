// tensorplay/cublas.hpp: cuBLAS calls that can be captured: a handle bound to a stream and to a
// workspace of your own, and the error type of a failed cuBLAS call.
//
// Not included by <tensorplay/graph.hpp>: it needs <cublas_v2.h> and the cuBLAS library
// (Bazel: deps = ["@cuda//:cublas"]; CMake: CUDA::cublas).
#pragma once

#include <tensorplay/detail/failed_call_error.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/stream.hpp>

#include <cublas_v2.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace tensorplay {

//! A cuBLAS call failed.
//!
//! `what()` names the call, the cuBLAS status (name and description) and the file:line of the
//! code that asked tensorplay to make it. cuBLAS reports `cublasStatus_t`, not `cudaError_t`,
//! so this is not a `cuda_error`.
//! Example: `cublasSetStream failed: CUBLAS_STATUS_NOT_INITIALIZED (the library was not
//! initialized) at main.cu:42`.
//! status() and where() come from detail::failed_call_error.
class cublas_error : public detail::failed_call_error<cublasStatus_t> {
 public:
  cublas_error(cublasStatus_t status, std::string_view call, tensorplay::source_location where)
      : failed_call_error(detail::failed_call_text(call, cublasGetStatusName(status), cublasGetStatusString(status), "", where),
                          status, where) {}
};

namespace detail {

//! Throws `cublas_error` when `status` is not CUBLAS_STATUS_SUCCESS.
inline void check_cublas(cublasStatus_t status, const char* call, const tensorplay::source_location& where) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    throw cublas_error(status, call, where);
}

}  // namespace detail

//! Makes `handle` issue its work to `stream`, using `workspace` as its workspace: what a cuBLAS
//! call needs before it is captured into a graph.
//!
//! `cublasSetStream` puts the handle back on cuBLAS's own default workspace, so the workspace
//! is set after it, every time the stream changes. With a workspace of your own, the memory
//! a captured cuBLAS call uses is yours to keep: it must stay allocated for as long as a graph
//! that holds such calls can replay, and no work that runs at the same time may use it.
//! cuBLAS recommends 32 MiB on Hopper GPUs and 4 MiB on older ones; an empty workspace is
//! allowed (cuBLAS then picks algorithms that need none). Warm up once before capturing:
//! cuBLAS initialises itself lazily, and that initialisation cannot be captured.
//!
//!     tensorplay::DeviceTensor<std::byte> workspace(32 << 20, stream);  // allocated before the capture
//!     tensorplay::cublas_set_stream(handle, stream, workspace.span());
//!     gemm(handle);                                                       // warm-up, not captured
//!     graph.capture([&] { gemm(handle); }, {.stream = stream});
//!
//! \throws cublas_error when cuBLAS refuses the handle, the stream or the workspace (e.g. a
//! handle that was never created), naming the caller's file:line.
inline void cublas_set_stream(cublasHandle_t handle, StreamRef stream, std::span<std::byte> workspace,
                              tensorplay::source_location where = tensorplay::source_location::current()) {
  detail::check_cublas(cublasSetStream(handle, stream.get()), "cublasSetStream", where);
  detail::check_cublas(cublasSetWorkspace(handle, workspace.data(), workspace.size()), "cublasSetWorkspace", where);
}

}  // namespace tensorplay
