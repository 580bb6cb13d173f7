// tensorplay/graph/executable.hpp: a graph's executable: instantiation (with the reason CUDA
// gives when it refuses), upload, and in-place update.
#pragma once

#include <tensorplay/detail/capture_registry.hpp>
#include <tensorplay/detail/cuda_api.hpp>
#include <tensorplay/detail/device.hpp>
#include <tensorplay/detail/handles.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/graph/options.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <string_view>

namespace tensorplay::detail {

[[nodiscard]] constexpr std::string_view instantiate_result_name(cudaGraphInstantiateResult result) noexcept {
  switch (result) {
    case cudaGraphInstantiateSuccess: return "success";
    case cudaGraphInstantiateError: return "error";
    case cudaGraphInstantiateInvalidStructure: return "invalid structure";
    case cudaGraphInstantiateNodeOperationNotSupported: return "node operation not supported";
    case cudaGraphInstantiateMultipleDevicesNotSupported: return "multiple devices not supported";
    case cudaGraphInstantiateConditionalHandleUnused: return "conditional handle unused";
    default: return "unknown";
  }
}

inline std::optional<cudaGraphNodeType> node_type_of(cudaGraphNode_t node) noexcept {
  if (node == nullptr) return std::nullopt;
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return type;
}

class Executable {
 public:
  [[nodiscard]] cudaGraphExec_t get() const noexcept { return exec_.get(); }
  explicit operator bool() const noexcept { return static_cast<bool>(exec_); }

  //! Compiles `graph`; with `upload_stream`, also uploads it there. Replaces any executable
  //! held (destroyed first: CUDA allows a graph with conditional nodes one executable at a time).
  //! \throws cuda_error naming CUDA's instantiation result and the failing node's type.
  void instantiate(cudaGraph_t graph, std::optional<cudaStream_t> upload_stream, const tensorplay::source_location& where) {
    exec_.reset();
    cudaGraphInstantiateParams params{};
    params.flags = cudaGraphInstantiateFlagAutoFreeOnLaunch;
    if (upload_stream) {
      params.flags |= cudaGraphInstantiateFlagUpload;
      params.uploadStream = *upload_stream;
    }
    cudaGraphExec_t exec = nullptr;
    // Relaxed while tensorplay captures are open: CUDA refuses instantiation on a thread with
    // another capture open (thread_local mode), or while any capture runs (global mode), though
    // it does not disturb the capture. (Two mode switches cost a tenth of a microsecond.)
    std::optional<RelaxedCaptureMode> relaxed;
    if (CaptureRegistry::instance().any_open()) relaxed.emplace();
    const cudaError_t status = detail::instantiate(&exec, graph, &params);
    if (status != cudaSuccess) {
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      std::string call = "cudaGraphInstantiateWithParams (result: ";
      call += instantiate_result_name(params.result_out);
      if (auto type = node_type_of(params.errNode_out)) {
        call += ", at a ";
        call += tensorplay::to_string(*type);
        call += " node";
      }
      call += ")";
      check(status, call.c_str(), where);
    }
    exec_ = ExecHandle(exec);
  }

  //! Patches the executable to run `graph`, which must have the same topology. Returns false,
  //! with CUDA's reason in `result`, when CUDA refuses; the executable is then unchanged.
  //! \throws cuda_error for failures other than a refusal.
  bool try_update(cudaGraph_t graph, UpdateResult& result, const tensorplay::source_location& where) {
    cudaGraphExecUpdateResultInfo info{};
    std::optional<RelaxedCaptureMode> relaxed;  // as for instantiate
    if (CaptureRegistry::instance().any_open()) relaxed.emplace();
    const cudaError_t status = exec_update(exec_.get(), graph, &info);
    result.reason = info.result;
    result.error_node = node_type_of(info.errorNode);
    if (status == cudaSuccess) return true;
    (void)cudaGetLastError();
    if (status == cudaErrorGraphExecUpdateFailure) return false;
    check(status, "cudaGraphExecUpdate", where);
    return false;
  }

  void reset() noexcept { exec_.reset(); }

 private:
  ExecHandle exec_;
};

}  // namespace tensorplay::detail
