// tensorplay/detail/capture_doctor_watch.hpp: how much the capture doctor watches, and starting it.
//
//   TENSORPLAY_CAPTURE_DOCTOR=log   (the default) the driver's error log: costs nothing measurable
//   TENSORPLAY_CAPTURE_DOCTOR=full  the log and CUPTI (capture_doctor_cupti.hpp): runtime names,
//                                   raw ends of a capture; every CUDA call of the process pays a
//                                   callback (bench/doctor_bench.cu measures it)
//   TENSORPLAY_CAPTURE_DOCTOR=off   neither: capture_error then names a culprit only where
//                                   tensorplay can tell by itself (a capture ended behind its back)
// want_full() asks for CUPTI from code (Graph::enable_debug_mode may call it): the next capture
// starts it. Read once per process.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/detail/capture_doctor_log.hpp>

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace tensorplay::detail {

enum class DoctorMode : unsigned char { Off, Log, Full };

class CaptureDoctorWatch {
 public:
  TENSORPLAY_PROCESS_WIDE static CaptureDoctorWatch& instance();

  //! Starts what the mode asks for, before or inside a capture. One atomic load once started.
  void start() noexcept;

  //! Turns CUPTI on from the next capture on, whatever the environment says (unless "off").
  void want_full() noexcept;

  [[nodiscard]] DoctorMode mode() const noexcept;

 private:
  CaptureDoctorWatch() = default;

  std::atomic<bool> started_{false};
  std::atomic<bool> full_asked_{false};
  std::atomic<bool> full_pending_{false};
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_doctor_cupti.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL CaptureDoctorWatch& CaptureDoctorWatch::instance() {
  static auto* watch = new CaptureDoctorWatch;
  return *watch;
}

TENSORPLAY_DECL void CaptureDoctorWatch::start() noexcept {
  if (started_.load(std::memory_order_acquire) && !full_pending_.load(std::memory_order_acquire)) return;
  const DoctorMode m = mode();
  if (m != DoctorMode::Off) DriverLogListener::instance().start();
  if (m == DoctorMode::Full) CuptiWatch::instance().start();
  full_pending_.store(false, std::memory_order_release);
  started_.store(true, std::memory_order_release);
}

TENSORPLAY_DECL void CaptureDoctorWatch::want_full() noexcept {
  full_asked_.store(true, std::memory_order_release);
  full_pending_.store(true, std::memory_order_release);
}

TENSORPLAY_DECL DoctorMode CaptureDoctorWatch::mode() const noexcept {
  static const DoctorMode from_environment = [] {
    const char* text = std::getenv("TENSORPLAY_CAPTURE_DOCTOR");
    const std::string_view v = text != nullptr ? text : "";
    if (v == "off" || v == "0") return DoctorMode::Off;
    if (v == "full" || v == "cupti") return DoctorMode::Full;
    return DoctorMode::Log;
  }();
  if (from_environment == DoctorMode::Off) return DoctorMode::Off;
  return full_asked_.load(std::memory_order_acquire) ? DoctorMode::Full : from_environment;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
