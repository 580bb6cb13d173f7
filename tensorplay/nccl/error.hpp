// tensorplay/nccl/error.hpp: nccl_error, and the check of every NCCL call.
#pragma once

#include <tensorplay/detail/failed_call_error.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <string_view>

namespace tensorplay {
//! An NCCL call failed.
//!
//! `what()` names the call, the NCCL result (name and description), NCCL's own last error text
//! when it has one, and the file:line of the code that asked tensorplay to make the call.
//! NCCL reports `ncclResult_t`, not `cudaError_t`, so this is not a `cuda_error`.
//! Example: `ncclCommInitAll failed: ncclInvalidArgument (invalid argument (run with
//! NCCL_DEBUG=WARN for details)) at main.cu:42`.
//! status() (the result the failing call returned) and where() come from detail::failed_call_error.
class nccl_error : public detail::failed_call_error<ncclResult_t> {
 public:
  nccl_error(ncclResult_t status, std::string_view call, tensorplay::source_location where)
      : failed_call_error(describe(status, call, where), status, where) {}

  //! The enumerator's name: "ncclInvalidUsage".
  [[nodiscard]] static constexpr std::string_view name(ncclResult_t status) noexcept {
    switch (status) {
      case ncclSuccess: return "ncclSuccess";
      case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
      case ncclSystemError: return "ncclSystemError";
      case ncclInternalError: return "ncclInternalError";
      case ncclInvalidArgument: return "ncclInvalidArgument";
      case ncclInvalidUsage: return "ncclInvalidUsage";
      case ncclRemoteError: return "ncclRemoteError";
      case ncclInProgress: return "ncclInProgress";
      default: return "ncclResult_t(unknown)";
    }
  }

 private:
  static std::string describe(ncclResult_t status, std::string_view call, tensorplay::source_location where) {
    // NCCL's last error may come from another call (its documentation says so): labelled as such.
    std::string more;
    if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') {
      more = "; NCCL's last error: ";
      more += last;
    }
    return detail::failed_call_text(call, name(status), ncclGetErrorString(status), more, where);
  }
};

namespace detail {

//! Throws `nccl_error` when `status` is not ncclSuccess.
inline void check_nccl(ncclResult_t status, const char* call, const tensorplay::source_location& where) {
  if (status != ncclSuccess) [[unlikely]]
    throw nccl_error(status, call, where);
}

}  // namespace detail
}  // namespace tensorplay
