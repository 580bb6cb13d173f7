// tensorplay/detail/capture_doctor_cupti.hpp: the capture doctor's second witness, for debugging:
// a CUPTI callback subscription on the runtime and driver APIs, loaded at run time.
//
// The driver log names the driver function that failed (cuMemAlloc_v2); CUPTI names the runtime
// call the program made (cudaMalloc), and also sees a cudaStreamEndCapture that succeeds, which
// the log cannot: a raw end of a tensorplay capture by other code. But CUPTI calls back on every
// API call of the process, and a process has one CUPTI subscriber (a profiler takes it), so it is
// off unless asked for (TENSORPLAY_CAPTURE_DOCTOR=full; capture_doctor_watch.hpp).
//
// libcupti is opened with dlopen: no link dependency, and a program without CUPTI loses only
// these records. Its ABI is declared here (the few entry points used, member for member), so that
// CUPTI's headers, which live outside the toolkit's include folder, are not needed either.
#pragma once

#include <tensorplay/config.hpp>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace tensorplay::detail {

namespace cupti {

// cupti_callbacks.h, CUDA 13.0 (stable since CUDA 4).
enum Site : int { api_enter = 0, api_exit = 1 };
enum Domain : int { driver_api = 1, runtime_api = 2 };
struct CallbackData {  // CUpti_CallbackData
  int site;
  const char* function_name;
  const void* function_params;
  void* function_return_value;
  const char* symbol_name;
  void* context;
  std::uint32_t context_uid;
  std::uint64_t* correlation_data;
  std::uint32_t correlation_id;
};
using Callback = void (*)(void* user, int domain, std::uint32_t cbid, const void* data);
using Subscribe = int (*)(void** subscriber, Callback callback, void* user);
using EnableDomain = int (*)(std::uint32_t enable, void* subscriber, int domain);

// cupti_runtime_cbid.h / cupti_driver_cbid.h: cudaStreamEndCapture(_ptsz), cuStreamEndCapture(_ptsz).
inline constexpr std::uint32_t runtime_end_capture = 319;
inline constexpr std::uint32_t runtime_end_capture_ptsz = 320;
inline constexpr std::uint32_t driver_end_capture = 497;
inline constexpr std::uint32_t driver_end_capture_ptsz = 498;

}  // namespace cupti

class CuptiWatch {
 public:
  TENSORPLAY_PROCESS_WIDE static CuptiWatch& instance();

  //! Loads CUPTI and subscribes, once; true while subscribed. Never throws. Fails (for good)
  //! when no libcupti can be opened or another subscriber (a profiler) holds CUPTI.
  bool start() noexcept;

  [[nodiscard]] bool active() const noexcept;
  //! Why CUPTI is not active, when it was tried: for the docs and the tests.
  [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

 private:
  CuptiWatch() = default;

  bool subscribe() noexcept;

  // TENSORPLAY_CUPTI first, then the loader's search path, then where toolkits put it.
  static void* open_library() noexcept;

  // Runs on every API entry and exit of the process: returns at once unless a call failed with
  // a capture error, or a cudaStreamEndCapture succeeded (a capture ended: maybe not by its owner).
  static void on_api(void*, int domain, std::uint32_t cbid, const void* raw);

  std::mutex mutex_;
  std::atomic<bool> tried_{false};
  std::atomic<bool> active_{false};
  std::string failure_;
};

}  // namespace tensorplay::detail

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/capture_doctor_evidence.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL CuptiWatch& CuptiWatch::instance() {
  static auto* watch = new CuptiWatch;  // leaked on purpose: CUPTI keeps calling back until exit
  return *watch;
}

TENSORPLAY_DECL bool CuptiWatch::start() noexcept {
  if (tried_.load(std::memory_order_acquire)) return active_.load(std::memory_order_acquire);
  std::lock_guard lock(mutex_);
  if (tried_.load(std::memory_order_relaxed)) return active_.load(std::memory_order_relaxed);
  active_.store(subscribe(), std::memory_order_release);
  tried_.store(true, std::memory_order_release);
  return active_.load(std::memory_order_relaxed);
}

TENSORPLAY_DECL bool CuptiWatch::active() const noexcept { return active_.load(std::memory_order_acquire); }

TENSORPLAY_DECL bool CuptiWatch::subscribe() noexcept {
  void* library = open_library();
  if (library == nullptr) {
    failure_ = "no libcupti could be opened (set TENSORPLAY_CUPTI to its path)";
    return false;
  }
  auto subscribe_fn = reinterpret_cast<cupti::Subscribe>(dlsym(library, "cuptiSubscribe"));
  auto enable = reinterpret_cast<cupti::EnableDomain>(dlsym(library, "cuptiEnableDomain"));
  if (subscribe_fn == nullptr || enable == nullptr) {
    failure_ = "libcupti lacks cuptiSubscribe or cuptiEnableDomain";
    return false;
  }
  void* subscriber = nullptr;
  if (const int r = subscribe_fn(&subscriber, &CuptiWatch::on_api, nullptr); r != 0) {
    failure_ = "cuptiSubscribe failed with CUptiResult " + std::to_string(r) + " (a profiler holds CUPTI?)";
    return false;
  }
  if (enable(1, subscriber, cupti::runtime_api) != 0 || enable(1, subscriber, cupti::driver_api) != 0) {
    failure_ = "cuptiEnableDomain failed";
    return false;
  }
  return true;
}

TENSORPLAY_DECL void* CuptiWatch::open_library() noexcept {
  if (const char* path = std::getenv("TENSORPLAY_CUPTI"); path != nullptr && *path != '\0')
    if (void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) return lib;
  const std::string versioned = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
  for (const std::string& name :
       {versioned, std::string("libcupti.so"), "/usr/local/cuda/extras/CUPTI/lib64/" + versioned,
        "/usr/local/cuda/targets/x86_64-linux/lib/" + versioned, "/usr/local/cuda/targets/sbsa-linux/lib/" + versioned,
        "/usr/local/cuda/lib64/" + versioned})
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  return nullptr;
}

TENSORPLAY_DECL void CuptiWatch::on_api(void*, int domain, std::uint32_t cbid, const void* raw) {
  const auto* data = static_cast<const cupti::CallbackData*>(raw);
  if (data == nullptr || data->site != cupti::api_exit || data->function_return_value == nullptr) return;
  const int status = *static_cast<const int*>(data->function_return_value);
  const bool end = domain == cupti::runtime_api
                       ? cbid == cupti::runtime_end_capture || cbid == cupti::runtime_end_capture_ptsz
                       : cbid == cupti::driver_end_capture || cbid == cupti::driver_end_capture_ptsz;
  if (end ? status != 0 : !breaks_capture(status)) return;
  cudaStream_t stream = nullptr;
  if (end && data->function_params != nullptr) stream = *static_cast<const cudaStream_t*>(data->function_params);
  std::string_view name = data->function_name != nullptr ? data->function_name : "";
  CaptureEvidence::instance().add(domain == cupti::runtime_api ? EvidenceSource::RuntimeApi : EvidenceSource::DriverApi,
                                  status, stream, name);
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
