// tensorplay/detail/device_guard.hpp: the one guard of this thread's current device.
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

namespace tensorplay::detail {

//! The one current-device guard: remembers the current device and makes it current again on
//! destruction if another device is current then (whoever switched). Never throws on the way out.
//!   DeviceGuard guard(device, where);       switches now (throws cuda_error when CUDA refuses)
//!   DeviceGuard guard(device, quiet);       switches now if it can (destructors, exit paths)
//!   DeviceGuard guard;  guard.set(d, where);  keeps the caller's device around a loop over devices
class DeviceGuard {
 public:
  struct Quiet {};
  static constexpr Quiet quiet{};

  //! Keeps the current device (none when CUDA cannot say).
  DeviceGuard() noexcept;
  DeviceGuard(int device, const tensorplay::source_location& where);
  //! A negative `device`, or a failed switch, leaves the current one.
  DeviceGuard(int device, Quiet) noexcept;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();

  //! Makes `device` current (a no-op when it is the one this guard made current last).
  void set(int device, const tensorplay::source_location& where);

 private:
  int home_ = -1;  // the device to restore
  int now_ = -1;   // the device this guard made current last
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL DeviceGuard::DeviceGuard() noexcept {
  if (cudaGetDevice(&home_) != cudaSuccess) {
    (void)cudaGetLastError();
    home_ = -1;
  }
  now_ = home_;
}

TENSORPLAY_DECL DeviceGuard::DeviceGuard(int device, const tensorplay::source_location& where) {
  TENSORPLAY_CHECK(cudaGetDevice(&home_), where);
  now_ = home_;
  set(device, where);
}

TENSORPLAY_DECL DeviceGuard::DeviceGuard(int device, Quiet) noexcept : DeviceGuard() {
  if (device < 0 || home_ < 0 || device == now_) return;
  if (cudaSetDevice(device) == cudaSuccess) now_ = device;
  else (void)cudaGetLastError();
}

TENSORPLAY_DECL DeviceGuard::~DeviceGuard() {
  if (home_ < 0) return;
  int current = home_;
  if (cudaGetDevice(&current) != cudaSuccess) (void)cudaGetLastError();
  if (current != home_) (void)cudaSetDevice(home_);
}

TENSORPLAY_DECL void DeviceGuard::set(int device, const tensorplay::source_location& where) {
  if (device == now_) return;
  TENSORPLAY_CHECK(cudaSetDevice(device), where);
  now_ = device;
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
