// tensorplay/detail/capture_doctor_names.hpp: the runtime call a program made, from the driver
// function the driver's log names.
//
// The log names driver entry points with their ABI suffix (cuMemAlloc_v2, cuCtxSynchronize_v2);
// capture_error::culprit() names what the program called, as the runtime API spells it. Driver
// functions not listed keep their own name (a library that calls the driver directly).
#pragma once

#include <tensorplay/config.hpp>

#include <array>
#include <string>
#include <string_view>
#include <utility>

namespace tensorplay::detail {

//! `name` without its ABI suffixes: _v2, _v3020, _ptsz, _ptds (any of them, in any order).
constexpr std::string_view without_abi_suffix(std::string_view name) noexcept {
  for (bool again = true; again;) {
    again = false;
    for (std::string_view suffix : {std::string_view("_ptsz"), std::string_view("_ptds")}) {
      if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
        name.remove_suffix(suffix.size());
        again = true;
      }
    }
    const std::size_t v = name.rfind("_v");
    if (v != std::string_view::npos && v + 2 < name.size() && v > 0) {
      bool digits = true;
      for (std::size_t i = v + 2; i < name.size(); ++i) digits = digits && name[i] >= '0' && name[i] <= '9';
      if (digits) {
        name = name.substr(0, v);
        again = true;
      }
    }
  }
  return name;
}

//! The runtime API call behind a driver function of the log ("cuMemAlloc_v2" -> "cudaMalloc").
TENSORPLAY_DECL std::string runtime_name_of(std::string_view driver_function);

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES

namespace tensorplay::detail {

TENSORPLAY_DECL std::string runtime_name_of(std::string_view driver_function) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 34> table{{
      {"cuStreamSynchronize", "cudaStreamSynchronize"},
      {"cuCtxSynchronize", "cudaDeviceSynchronize"},
      {"cuStreamQuery", "cudaStreamQuery"},
      {"cuStreamWaitEvent", "cudaStreamWaitEvent"},
      {"cuStreamBeginCapture", "cudaStreamBeginCapture"},
      {"cuStreamEndCapture", "cudaStreamEndCapture"},
      {"cuEventQuery", "cudaEventQuery"},
      {"cuEventSynchronize", "cudaEventSynchronize"},
      {"cuEventRecord", "cudaEventRecord"},
      {"cuEventRecordWithFlags", "cudaEventRecordWithFlags"},
      {"cuMemAlloc", "cudaMalloc"},
      {"cuMemAllocPitch", "cudaMallocPitch"},
      {"cuMemAllocManaged", "cudaMallocManaged"},
      {"cuMemAllocHost", "cudaMallocHost"},
      {"cuMemHostAlloc", "cudaHostAlloc"},
      {"cuMemFree", "cudaFree"},
      {"cuMemFreeHost", "cudaFreeHost"},
      {"cuMemHostRegister", "cudaHostRegister"},
      {"cuMemHostUnregister", "cudaHostUnregister"},
      {"cuLaunchKernel", "cudaLaunchKernel"},
      {"cuLaunchKernelEx", "cudaLaunchKernelExC"},
      {"cuMemcpy", "cudaMemcpy"},
      {"cuMemcpyHtoD", "cudaMemcpy"},
      {"cuMemcpyDtoH", "cudaMemcpy"},
      {"cuMemcpyDtoD", "cudaMemcpy"},
      {"cuMemcpyPeer", "cudaMemcpyPeer"},
      {"cuMemcpy2D", "cudaMemcpy2D"},
      {"cuMemcpy3D", "cudaMemcpy3D"},
      {"cuMemcpyAsync", "cudaMemcpyAsync"},
      {"cuMemcpyHtoDAsync", "cudaMemcpyAsync"},
      {"cuMemcpyDtoHAsync", "cudaMemcpyAsync"},
      {"cuMemcpyDtoDAsync", "cudaMemcpyAsync"},
      {"cuMemsetD8", "cudaMemset"},
      {"cuMemsetD32", "cudaMemset"},
  }};
  const std::string_view plain = without_abi_suffix(driver_function);
  for (const auto& [driver, runtime] : table)
    if (plain == driver) return std::string(runtime);
  if (plain.starts_with("cuMemsetD") && plain.ends_with("Async")) return "cudaMemsetAsync";
  return std::string(driver_function);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
