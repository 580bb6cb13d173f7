// tensorplay/detail/capture_doctor_log.hpp: the driver's error log (CUDA 12.9+, "error log
// management") as evidence for the capture doctor.
//
// Probed on the H200 (driver 580, CUDA 13.0; tools/probes/doctor_probe.cu): for every way a
// capture breaks, the driver logs the failing driver call and its status, often with a sentence
// before it, from inside the failing call, on the thread that made it:
//   API call conflicts with a stream capture sequence initiated from another thread
//   Returning 900 (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) from cuMemAlloc_v2
// The callback is registered once per process, at the first capture (registering while a capture
// is open leaves it intact, probed too). It runs only when the driver logs an error, so captures
// that succeed cost nothing (capture + instantiate measured the same with and without it).
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_doctor_evidence.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string_view>

namespace tensorplay::detail {

class DriverLogListener {
 public:
  TENSORPLAY_PROCESS_WIDE static DriverLogListener& instance();

  //! Registers the callback, once. Later calls cost one atomic load. Never throws; without a
  //! runtime or driver that has the log, nothing is registered and culprits come from CUPTI only.
  void start() noexcept;

  //! Whether the driver reports its errors to the doctor.
  [[nodiscard]] bool listening() const noexcept;

 private:
  DriverLogListener() = default;

#if CUDART_VERSION >= 12090
  static void CUDART_CB on_message(void*, cudaLogLevel, char* message, size_t length);
#endif

  std::mutex mutex_;
  std::atomic<bool> started_{false};
  bool listening_ = false;
};

//! A log message "Returning <code> (<NAME>) from <function>": the code and the function, or
//! code 0 for other messages.
struct DriverReturn {
  int code = 0;
  std::string_view function;
};

TENSORPLAY_DECL DriverReturn parse_driver_return(std::string_view text) noexcept;

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL DriverLogListener& DriverLogListener::instance() {
  static auto* listener = new DriverLogListener;  // leaked on purpose: the driver keeps the callback
  return *listener;
}

TENSORPLAY_DECL void DriverLogListener::start() noexcept {
  if (started_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex_);
  if (started_.load(std::memory_order_relaxed)) return;
#if CUDART_VERSION >= 12090
  cudaLogsCallbackHandle handle = nullptr;
  listening_ = cudaLogsRegisterCallback(&DriverLogListener::on_message, nullptr, &handle) == cudaSuccess;
  if (!listening_) (void)cudaGetLastError();
#endif
  started_.store(true, std::memory_order_release);
}

TENSORPLAY_DECL bool DriverLogListener::listening() const noexcept { return started_.load(std::memory_order_acquire) && listening_; }

TENSORPLAY_DECL void CUDART_CB DriverLogListener::on_message(void*, cudaLogLevel, char* message, size_t length) {
  std::string_view text(message, length);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0' || text.back() == ' ')) text.remove_suffix(1);
  CaptureEvidence::instance().add(EvidenceSource::DriverLog, 0, nullptr, text);
}

TENSORPLAY_DECL DriverReturn parse_driver_return(std::string_view text) noexcept {
  constexpr std::string_view returning = "Returning ";
  constexpr std::string_view from = " from ";
  const std::size_t at = text.find(returning);
  if (at == std::string_view::npos) return {};
  const std::size_t by = text.find(from, at);
  if (by == std::string_view::npos) return {};
  int code = 0;
  for (std::size_t i = at + returning.size(); i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i)
    code = code * 10 + (text[i] - '0');
  std::string_view function = text.substr(by + from.size());
  const std::size_t space = function.find_first_of(" \n");
  if (space != std::string_view::npos) function = function.substr(0, space);
  return {code, function};
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
