// tensorplay/error.hpp: the two exception types and the one helper every CUDA call goes through.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#if __has_include(<source_location>)
#include <source_location>
#endif

namespace tensorplay {

#if defined(__cpp_lib_source_location)
//! Where a caller asked for work (std::source_location where the standard library has it).
using source_location = std::source_location;
#else
//! Where a caller asked for work: std::source_location's interface, for standard libraries that
//! lack it with this compiler (clang 14 with libstdc++ 12 has the compiler builtins only).
class source_location {
 public:
  static constexpr source_location current(const char* file = __builtin_FILE(), const char* function = __builtin_FUNCTION(),
                                           unsigned line = __builtin_LINE()) noexcept {
    source_location where;
    where.file_ = file;
    where.function_ = function;
    where.line_ = line;
    return where;
  }
  constexpr source_location() noexcept = default;
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  [[nodiscard]] constexpr const char* function_name() const noexcept { return function_; }
  [[nodiscard]] constexpr unsigned line() const noexcept { return line_; }
  [[nodiscard]] constexpr unsigned column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
};
#endif

namespace detail {

//! "<call> failed: <name> (<description>)<more> at <file>:<line>": the message of every
//! tensorplay error that reports a failed call (cuda_error, and cublas_error and nccl_error in
//! their own headers). `more` is extra text, empty or starting with "; ".
TENSORPLAY_DECL std::string failed_call_text(std::string_view call, std::string_view name, std::string_view description,
                                    std::string_view more, const tensorplay::source_location& where);

}  // namespace detail

//! A CUDA runtime call failed.
//!
//! `what()` names the call, the CUDA error (name and description) and the file:line of the
//! code that asked tensorplay to do the work: the caller, never a line inside tensorplay.
//! Example: `cudaGraphLaunch failed: cudaErrorInvalidValue (invalid argument) at main.cu:42`.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t status, std::string_view call, tensorplay::source_location where);

  //! The status the failing call returned.
  [[nodiscard]] cudaError_t status() const noexcept { return status_; }
  //! Where the caller asked for the failing work.
  [[nodiscard]] const tensorplay::source_location& where() const noexcept { return where_; }
  //! The failing call, as named in what() ("cudaGraphLaunch", say).
  [[nodiscard]] const std::string& call() const noexcept { return *call_; }

 protected:
  //! For errors that say more: `more` (empty or starting with "; ") goes before " at <file>:<line>".
  cuda_error(cudaError_t status, std::string_view call, std::string_view more, tensorplay::source_location where);

 private:
  static std::string describe(cudaError_t status, std::string_view call, std::string_view more,
                              tensorplay::source_location where);

  // Statuses with which the runtime says, in its own words, that there is no GPU to run on.
  static constexpr bool means_no_device(cudaError_t status) noexcept {
    return status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver ||
           status == cudaErrorDevicesUnavailable || status == cudaErrorInvalidDevice ||
           status == cudaErrorSystemDriverMismatch || status == cudaErrorCompatNotSupportedOnDevice;
  }

  cudaError_t status_;
  tensorplay::source_location where_;
  std::shared_ptr<const std::string> call_;  // shared: copying an exception must not throw
};

//! A stream capture was invalidated (or ended behind tensorplay's back), by a call of the
//! library's, the user's or another library's: thrown instead of a bare cuda_error, at the
//! latest by capture_end. Nothing is left capturing, as after every error.
//!
//! `what()` keeps cuda_error's form (the call that noticed, CUDA's status, the caller's
//! file:line, last) and adds, in the same line, the call that broke the capture, the thread it
//! came from, what the driver said, where the capture began and the innermost open conditional
//! body, and any other capture that took part. How the culprit is found: docs/guide.md
//! (Pitfalls: "When a capture breaks").
//! Example: `cudaStreamEndCapture failed: cudaErrorStreamCaptureInvalidated (operation failed due
//! to a previous error during capture); broken by cudaMalloc on another thread; driver: "API call
//! conflicts with a stream capture sequence initiated from another thread; Returning 900
//! (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) from cuMemAlloc_v2"; capture begun at train.cu:40 at train.cu:52`
class capture_error : public cuda_error {
 public:
  //! What is known about the failure besides CUDA's status.
  struct Facts {
    std::string culprit;             // the API call that broke the capture; empty when unknown
    bool from_other_thread = false;  // it came from a thread other than the capturing one
    std::string driver_message;      // what the driver logged about it; empty when nothing
    std::string context;             // where the capture and its innermost body began, other captures
  };

  capture_error(cudaError_t status, std::string_view call, tensorplay::source_location where, Facts facts);

  //! The API call that broke the capture, e.g. "cudaStreamSynchronize"; empty when unknown.
  [[nodiscard]] const std::string& culprit() const noexcept { return facts_.culprit; }
  //! The call came from a thread other than the one that began the capture.
  [[nodiscard]] bool from_other_thread() const noexcept { return facts_.from_other_thread; }
  //! The driver's own explanation (its error log, CUDA 12.9+), when it gave one.
  [[nodiscard]] const std::string& driver_message() const noexcept { return facts_.driver_message; }

 private:
  static std::string describe(const Facts& facts);

  Facts facts_;
};

//! The API was misused: wrong state (replay before capture, end without begin) or a bad
//! argument (a predicate with two elements). The object stays usable after it is thrown, and
//! nothing was left capturing.
class usage_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

//! CUDA refused to compile a graph (cudaGraphInstantiateWithParams): what() names CUDA's
//! instantiation result and the type of the node it refused; result() gives the result.
class instantiate_error : public cuda_error {
 public:
  instantiate_error(cudaError_t status, std::string_view call, cudaGraphInstantiateResult result, tensorplay::source_location where);
  [[nodiscard]] cudaGraphInstantiateResult result() const noexcept { return result_; }

 private:
  cudaGraphInstantiateResult result_;
};

//! A conditional body captured work that CUDA does not allow there (a node type outside
//! kernels, memsets, memcpys, empty nodes, child graphs and conditional nodes; a child graph
//! CUDA refuses), found when the body closed.
class conditional_body_error : public usage_error {
 public:
  using usage_error::usage_error;
};

namespace detail {

//! Throws `cuda_error` when `status` is not cudaSuccess. Clears the runtime's last-error
//! state first, so the failure does not resurface from an unrelated later call.
TENSORPLAY_DECL void check(cudaError_t status, const char* call, const tensorplay::source_location& where);

[[noreturn]] TENSORPLAY_DECL void throw_usage(std::string message);

}  // namespace detail
}  // namespace tensorplay

//! Runs a CUDA runtime call and throws `cuda_error` naming it and `where` when it fails.
//! `where` is the tensorplay::source_location of the user's call into tensorplay.
#define TENSORPLAY_CHECK(call, where) ::tensorplay::detail::check((call), #call, (where))

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL std::string failed_call_text(std::string_view call, std::string_view name, std::string_view description,
    std::string_view more, const tensorplay::source_location& where) {
  std::string text(call);
  text += " failed: ";
  text += name;
  text += " (";
  text += description;
  text += ")";
  text += more;
  text += " at ";
  text += where.file_name();
  text += ':';
  text += std::to_string(where.line());
  return text;
}
}  // namespace tensorplay::detail

namespace tensorplay {

TENSORPLAY_DECL cuda_error::cuda_error(cudaError_t status, std::string_view call, tensorplay::source_location where) : std::runtime_error(describe(status, call, "", where)), status_(status), where_(where), call_(std::make_shared<const std::string>(call)) {}

TENSORPLAY_DECL cuda_error::cuda_error(cudaError_t status, std::string_view call, std::string_view more, tensorplay::source_location where) : std::runtime_error(describe(status, call, more, where)), status_(status), where_(where), call_(std::make_shared<const std::string>(call)) {}

TENSORPLAY_DECL std::string cuda_error::describe(cudaError_t status, std::string_view call, std::string_view more,
    tensorplay::source_location where) {
  std::string all(means_no_device(status) ? "; no usable CUDA device (is a GPU present and its driver loaded?)" : "");
  all += more;
  return detail::failed_call_text(call, cudaGetErrorName(status), cudaGetErrorString(status), all, where);
}

TENSORPLAY_DECL capture_error::capture_error(cudaError_t status, std::string_view call, tensorplay::source_location where, Facts facts) : cuda_error(status, call, describe(facts), where), facts_(std::move(facts)) {}

TENSORPLAY_DECL std::string capture_error::describe(const Facts& facts) {
  std::string more;
  if (!facts.culprit.empty()) {
    more += "; broken by " + facts.culprit;
    more += facts.from_other_thread ? " on another thread" : " on the capturing thread";
  } else {
    more += "; the call that broke it is not known";
  }
  if (!facts.driver_message.empty()) more += "; driver: \"" + facts.driver_message + "\"";
  if (!facts.context.empty()) more += "; " + facts.context;
  return more;
}

TENSORPLAY_DECL instantiate_error::instantiate_error(cudaError_t status, std::string_view call, cudaGraphInstantiateResult result, tensorplay::source_location where) : cuda_error(status, call, where), result_(result) {}
}  // namespace tensorplay

namespace tensorplay::detail {

TENSORPLAY_DECL void check(cudaError_t status, const char* call, const tensorplay::source_location& where) {
  if (status != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();
    throw cuda_error(status, call, where);
  }
}

TENSORPLAY_DECL void throw_usage(std::string message) { throw usage_error("tensorplay: " + message); }

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
