// tensorplay/detail/failed_call_error.hpp: the shape that the errors of a failed library call
// share when the library reports its own status type (cublas_error, nccl_error): the message
// (detail::failed_call_text), the status and where the caller asked for the call.
#pragma once

#include <tensorplay/error.hpp>

#include <stdexcept>
#include <string>

namespace tensorplay::detail {

template <class Status>
class failed_call_error : public std::runtime_error {
 public:
  //! The status the failing call returned.
  [[nodiscard]] Status status() const noexcept { return status_; }
  //! Where the caller asked for the failing call.
  [[nodiscard]] const tensorplay::source_location& where() const noexcept { return where_; }

 protected:
  failed_call_error(const std::string& what, Status status, tensorplay::source_location where)
      : std::runtime_error(what), status_(status), where_(where) {}

 private:
  Status status_;
  tensorplay::source_location where_;
};

}  // namespace tensorplay::detail
