// tools/probes/doctor_probe.cu: what the driver's error log (CUDA 12.9+) and a CUPTI callback
// subscription report when a stream capture is broken, case by case, and what each costs on
// capture + instantiate. Decides the design of tensorplay/detail/capture_doctor*.hpp (issue 25).
//
//   nvcc -std=c++20 -arch=sm_90 tools/probes/doctor_probe.cu -lcublas -ldl -lpthread -o doctor_probe
//   ./doctor_probe [libcupti.so path]     (without a path: the driver log only)
//
// Each case prints what the calls returned, each driver log message (with the thread it came on),
// each CUPTI API exit whose status is a capture error (and every cudaStreamEndCapture), and what
// cudaLogsDumpToMemory holds after the case.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

long tid() { return static_cast<long>(::syscall(SYS_gettid)); }
long main_tid = 0;

__global__ void tick(int* p) {
  if (p != nullptr) atomicAdd(p, 1);
}

const char* name(cudaError_t e) { return cudaGetErrorName(e); }
const char* cap(cudaStreamCaptureStatus s) {
  return s == cudaStreamCaptureStatusNone ? "none" : s == cudaStreamCaptureStatusActive ? "active" : "invalidated";
}
const char* status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(s, &st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaGetErrorName(e);
  }
  return cap(st);
}

// ---- the driver log ---------------------------------------------------------------------
std::atomic<int> log_messages{0};
void CUDART_CB on_log(void*, cudaLogLevel level, char* message, size_t length) {
  ++log_messages;
  std::printf("    [log tid=%s lvl=%d] %.*s\n", tid() == main_tid ? "main" : "other", static_cast<int>(level),
              static_cast<int>(length), message);
}

void dump_log(cudaLogIterator& it) {
  char buffer[25600];
  size_t size = sizeof buffer;
  const cudaError_t e = cudaLogsDumpToMemory(&it, buffer, &size, 0);
  if (e != cudaSuccess || size == 0) {
    std::printf("    [dump] %s, %zu bytes\n", name(e), size);
    return;
  }
  std::printf("    [dump %zu bytes] %.*s\n", size, static_cast<int>(size), buffer);
}

// ---- CUPTI, loaded at run time ------------------------------------------------------------
struct CallbackData {  // CUpti_CallbackData
  int site;            // 0 enter, 1 exit
  const char* function_name;
  const void* params;
  void* return_value;
  const char* symbol_name;
  void* context;
  uint32_t context_uid;
  uint64_t* correlation_data;
  uint32_t correlation_id;
};
using Callback = void (*)(void*, int, uint32_t, const void*);
using Subscribe = int (*)(void**, Callback, void*);
using EnableDomain = int (*)(uint32_t, void*, int);
using Unsubscribe = int (*)(void*);
Subscribe cupti_subscribe = nullptr;
EnableDomain cupti_enable_domain = nullptr;
Unsubscribe cupti_unsubscribe = nullptr;
void* subscriber = nullptr;
std::atomic<bool> cupti_print{true};
std::atomic<long> cupti_calls{0};

bool is_capture_error(int e) {
  return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
         e == cudaErrorStreamCaptureMerge || e == cudaErrorStreamCaptureUnmatched ||
         e == cudaErrorStreamCaptureUnjoined || e == cudaErrorStreamCaptureIsolation ||
         e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread || e == cudaErrorCapturedEvent ||
         e == cudaErrorIllegalState;
}

std::atomic<bool> first_callback{true};
void on_api(void*, int domain, uint32_t cbid, const void* data) {
  ++cupti_calls;
  const auto* d = static_cast<const CallbackData*>(data);
  if (first_callback.exchange(false))
    std::printf("cupti: first callback: domain %d cbid %u data %p name %p ret %p\n", domain, cbid, data,
                d ? static_cast<const void*>(d->function_name) : nullptr, d ? d->return_value : nullptr);
  if (d == nullptr || d->site != 1 || d->return_value == nullptr || d->function_name == nullptr) return;
  if (!cupti_print.load(std::memory_order_relaxed)) return;
  const int status = *static_cast<int*>(d->return_value);  // cudaError_t and CUresult share these values
  const bool end = std::strstr(d->function_name, "EndCapture") != nullptr;
  if (!is_capture_error(status) && !end) return;
  std::printf("    [cupti tid=%s %s cbid=%u] %s -> %d\n", tid() == main_tid ? "main" : "other",
              domain == 2 ? "runtime" : "driver", cbid, d->function_name, status);
}

bool load_cupti(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("cupti: dlopen(%s) failed: %s\n", path, dlerror());
    return false;
  }
  cupti_subscribe = reinterpret_cast<Subscribe>(dlsym(lib, "cuptiSubscribe"));
  cupti_enable_domain = reinterpret_cast<EnableDomain>(dlsym(lib, "cuptiEnableDomain"));
  cupti_unsubscribe = reinterpret_cast<Unsubscribe>(dlsym(lib, "cuptiUnsubscribe"));
  if (!cupti_subscribe || !cupti_enable_domain || !cupti_unsubscribe) return false;
  auto t0 = std::chrono::steady_clock::now();
  std::printf("cupti: subscribing\n");
  int r = cupti_subscribe(&subscriber, on_api, nullptr);
  std::printf("cupti: subscribe -> %d; enabling the driver domain\n", r);
  int r1 = cupti_enable_domain(1, subscriber, 1);
  std::printf("cupti: driver domain -> %d; enabling the runtime domain\n", r1);
  int r2 = cupti_enable_domain(1, subscriber, 2);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("cupti: subscribe %d, enable driver %d, runtime %d, %.3f ms\n", r, r1, r2,
              std::chrono::duration<double, std::milli>(t1 - t0).count());
  return r == 0 && r1 == 0 && r2 == 0;
}

// Re-enabling/disabling the domains per capture: what it costs.
void time_enable_toggle() {
  if (subscriber == nullptr) return;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) {
    cupti_enable_domain(0, subscriber, 1);
    cupti_enable_domain(0, subscriber, 2);
    cupti_enable_domain(1, subscriber, 1);
    cupti_enable_domain(1, subscriber, 2);
  }
  auto t1 = std::chrono::steady_clock::now();
  std::printf("cupti: disable+enable both domains: %.2f us per toggle pair\n",
              std::chrono::duration<double, std::micro>(t1 - t0).count() / 100);
}

// ---- cases ------------------------------------------------------------------------------
cudaStream_t make_stream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, flags);
  return s;
}

void end_and_report(cudaStream_t s, const char* label = "cudaStreamEndCapture") {
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &g);
  std::printf("  %s -> %s (graph %s), after: %s\n", label, name(e), g ? "yes" : "null", status_of(s));
  if (g) cudaGraphDestroy(g);
  (void)cudaGetLastError();
}

struct Case {
  const char* title;
  cudaLogIterator it = 0;
  explicit Case(const char* t) : title(t) {
    cudaDeviceSynchronize();
    (void)cudaGetLastError();
    cudaLogsCurrent(&it, 0);
    std::printf("\n== %s\n", title);
  }
  ~Case() {
    dump_log(it);
    const cudaError_t e = cudaDeviceSynchronize();
    (void)cudaGetLastError();
    std::printf("  (device sync after: %s)\n", name(e));
  }
};

#define SAY(call)                                                     \
  do {                                                                \
    const cudaError_t e_ = (call);                                    \
    std::printf("  %s -> %s\n", #call, name(e_));                     \
    (void)cudaGetLastError();                                         \
  } while (0)

// The shape of most cases: a fresh stream (of `flags`) begins a global capture (and takes one
// kernel unless `tick_first` is false), `during(s)` makes the case's calls, then the capture's
// status and its end are printed and the stream destroyed.
template <class During>
void in_capture(During&& during, unsigned flags = cudaStreamNonBlocking, bool tick_first = true) {
  cudaStream_t s = make_stream(flags);
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (tick_first) tick<<<1, 1, 0, s>>>(nullptr);
  during(s);
  std::printf("  status after: %s\n", status_of(s));
  end_and_report(s);
  cudaStreamDestroy(s);
}

void case_stream_sync() {
  Case c("cudaStreamSynchronize on the capturing stream");
  cudaStream_t s = make_stream();
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, s>>>(nullptr);
  SAY(cudaStreamSynchronize(s));
  std::printf("  status after: %s\n", status_of(s));
  tick<<<1, 1, 0, s>>>(nullptr);
  SAY(cudaGetLastError());
  end_and_report(s);
  cudaStreamDestroy(s);
}

void case_nested_sync(bool device) {
  Case c(device ? "cudaDeviceSynchronize inside a body capture (two captures open, same thread)"
                : "cudaStreamSynchronize(body stream) inside a body capture (three captures open)");
  cudaStream_t s = make_stream(), b1 = make_stream(), b2 = make_stream();
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, s>>>(nullptr);
  SAY(cudaStreamBeginCapture(b1, cudaStreamCaptureModeGlobal));
  SAY(cudaStreamBeginCapture(b2, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, b2>>>(nullptr);
  if (device)
    SAY(cudaDeviceSynchronize());
  else
    SAY(cudaStreamSynchronize(b2));
  std::printf("  status after: origin %s, body1 %s, body2 %s\n", status_of(s), status_of(b1), status_of(b2));
  end_and_report(b2, "end body2");
  end_and_report(b1, "end body1");
  end_and_report(s, "end origin");
  cudaStreamDestroy(b2);
  cudaStreamDestroy(b1);
  cudaStreamDestroy(s);
}

void case_malloc_other_thread() {
  Case c("cudaMalloc on another thread during a global capture");
  in_capture([](cudaStream_t) {
    std::thread([] {
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, 1 << 20);
      std::printf("  [other thread] cudaMalloc -> %s\n", name(e));
      (void)cudaGetLastError();
      if (p) cudaFree(p);
    }).join();
  });
}

void case_malloc_same_thread() {
  Case c("cudaMalloc on the capturing thread during a global capture");
  void* p = nullptr;
  in_capture([&](cudaStream_t) { SAY(cudaMalloc(&p, 1 << 20)); }, cudaStreamNonBlocking, false);
  if (p) cudaFree(p);
}

void case_legacy() {
  Case c("a kernel on the legacy default stream while a blocking stream captures");
  in_capture(
      [](cudaStream_t) {
        tick<<<1, 1, 0, 0>>>(nullptr);
        SAY(cudaGetLastError());
      },
      cudaStreamDefault);
}

void case_legacy_from_other_thread() {
  Case c("a kernel on the legacy default stream from another thread while a blocking stream captures");
  in_capture(
      [](cudaStream_t) {
        std::thread([] {
          tick<<<1, 1, 0, 0>>>(nullptr);
          std::printf("  [other thread] launch on legacy -> %s\n", name(cudaGetLastError()));
        }).join();
      },
      cudaStreamDefault);
}

void case_pageable(bool async) {
  Case c(async ? "cudaMemcpyAsync from pageable memory into the capture" : "cudaMemcpy (pageable) during the capture");
  void* d = nullptr;
  cudaMalloc(&d, 4096);
  std::vector<char> host(4096);
  in_capture([&](cudaStream_t s) {
    if (async)
      SAY(cudaMemcpyAsync(d, host.data(), 4096, cudaMemcpyHostToDevice, s));
    else
      SAY(cudaMemcpy(d, host.data(), 4096, cudaMemcpyHostToDevice));
  });
  cudaFree(d);
}

void case_event(bool sync) {
  Case c(sync ? "cudaEventSynchronize of a captured event" : "cudaEventQuery of a captured event");
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  in_capture([&](cudaStream_t s) {
    SAY(cudaEventRecord(e, s));
    if (sync)
      SAY(cudaEventSynchronize(e));
    else
      SAY(cudaEventQuery(e));
  });
  cudaEventDestroy(e);
}

void case_wait_outside_event() {
  Case c("cudaStreamWaitEvent on an event recorded outside the capture");
  cudaStream_t s = make_stream(), other = make_stream();
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  tick<<<1, 1, 0, other>>>(nullptr);
  cudaEventRecord(e, other);
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, s>>>(nullptr);
  SAY(cudaStreamWaitEvent(s, e, 0));
  std::printf("  status after: %s\n", status_of(s));
  tick<<<1, 1, 0, s>>>(nullptr);
  end_and_report(s);
  cudaEventDestroy(e);
  cudaStreamDestroy(other);
  cudaStreamDestroy(s);
}

void case_raw_end() {
  Case c("user code ends the capture with a raw cudaStreamEndCapture");
  cudaStream_t s = make_stream();
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, s>>>(nullptr);
  end_and_report(s, "user's cudaStreamEndCapture");
  tick<<<1, 1, 0, s>>>(nullptr);
  end_and_report(s, "library's cudaStreamEndCapture");
  cudaStreamDestroy(s);
}

void case_unjoined() {
  Case c("a forked stream not joined back");
  cudaStream_t s = make_stream(), side = make_stream();
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaEventRecord(e, s);
  cudaStreamWaitEvent(side, e, 0);
  tick<<<1, 1, 0, side>>>(nullptr);
  end_and_report(s);
  std::printf("  side after: %s\n", status_of(side));
  cudaEventDestroy(e);
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

// Thread B (main) holds a global capture on b; thread A begins a capture of `mode` on a, then
// calls cudaMalloc. `ticks`: a kernel goes into each capture before.
void other_thread_malloc(const char* title, cudaStreamCaptureMode mode, const char* mode_name, bool ticks) {
  Case c(title);
  cudaStream_t a = make_stream(), b = make_stream();
  SAY(cudaStreamBeginCapture(b, cudaStreamCaptureModeGlobal));
  if (ticks) tick<<<1, 1, 0, b>>>(nullptr);
  std::thread([a, mode, mode_name, ticks] {
    const cudaError_t e = cudaStreamBeginCapture(a, mode);
    std::printf("  [other thread] cudaStreamBeginCapture(%s) -> %s\n", mode_name, name(e));
    if (ticks) tick<<<1, 1, 0, a>>>(nullptr);
    void* p = nullptr;
    const cudaError_t m = cudaMalloc(&p, 1 << 20);
    std::printf("  [other thread] cudaMalloc -> %s; its capture %s\n", name(m), status_of(a));
    if (p) cudaFree(p);
    end_and_report(a, "[other thread] end");
  }).join();
  std::printf("  main's capture after: %s\n", status_of(b));
  end_and_report(b, "main end");
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

void case_other_global_capture() {
  other_thread_malloc("thread B holds a global capture; thread A begins one, then calls cudaMalloc", cudaStreamCaptureModeGlobal,
                      "global", true);
}

void case_other_global_threadlocal() {
  other_thread_malloc("thread B (main) holds a global capture; thread A with a thread-local capture calls cudaMalloc",
                      cudaStreamCaptureModeThreadLocal, "thread-local", false);
}

void case_cublas(bool create_inside) {
  Case c(create_inside ? "cublasCreate inside the capture"
                       : "a fresh cuBLAS handle (no warm-up, no workspace) used inside the capture");
  const int n = 64;
  float *a = nullptr, *b = nullptr, *cc = nullptr;
  cudaMalloc(&a, n * n * 4);
  cudaMalloc(&b, n * n * 4);
  cudaMalloc(&cc, n * n * 4);
  cudaStream_t s = make_stream();
  cublasHandle_t h = nullptr;
  if (!create_inside) {
    std::printf("  cublasCreate -> %d\n", cublasCreate(&h));
    std::printf("  cublasSetStream -> %d\n", cublasSetStream(h, s));
  }
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (create_inside) {
    std::printf("  cublasCreate -> %d\n", cublasCreate(&h));
    (void)cudaGetLastError();
    std::printf("  status after create: %s\n", status_of(s));
    if (h) std::printf("  cublasSetStream -> %d\n", cublasSetStream(h, s));
  }
  const float one = 1, zero = 0;
  if (h) {
    const cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, cc, n);
    std::printf("  cublasSgemm -> %d (%s)\n", st, cublasGetStatusName(st));
  }
  (void)cudaGetLastError();
  std::printf("  status after: %s\n", status_of(s));
  end_and_report(s);
  if (h) cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(cc);
  cudaStreamDestroy(s);
}

void case_register_during_capture() {
  Case c("cudaLogsRegisterCallback and cudaLogsCurrent while a capture is open");
  in_capture(
      [](cudaStream_t) {
        cudaLogsCallbackHandle h = nullptr;
        SAY(cudaLogsRegisterCallback(on_log, nullptr, &h));
        cudaLogIterator it = 0;
        SAY(cudaLogsCurrent(&it, 0));
      },
      cudaStreamNonBlocking, false);
}

// ---- costs ----------------------------------------------------------------------------------
double capture_instantiate_us(int kernels, int reps) {
  cudaStream_t s = make_stream();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int k = 0; k < kernels; ++k) tick<<<1, 1, 0, s>>>(nullptr);
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);
    cudaGraphExec_t x = nullptr;
    cudaGraphInstantiate(&x, g, 0);
    auto t1 = std::chrono::steady_clock::now();
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  cudaStreamDestroy(s);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void costs(const char* label) {
  capture_instantiate_us(1, 50);  // warm
  std::printf("cost [%s]: capture+instantiate 1 kernel %.2f us, 1000 kernels %.1f us (medians)\n", label,
              capture_instantiate_us(1, 400), capture_instantiate_us(1000, 40));
}

void cost_of_log_current() {
  cudaLogIterator it = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100000; ++i) cudaLogsCurrent(&it, 0);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("cost: cudaLogsCurrent %.1f ns per call\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / 1e5);
}

}  // namespace


// CUPTI subscribed while a capture is open: is the capture still intact?
void cupti_during_capture(const char* path) {
  cudaStream_t s = make_stream();
  SAY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tick<<<1, 1, 0, s>>>(nullptr);
  const bool ok = load_cupti(path);
  std::printf("  cupti loaded inside the capture: %d; status after: %s\n", ok, status_of(s));
  tick<<<1, 1, 0, s>>>(nullptr);
  end_and_report(s);
  cudaStreamDestroy(s);
}

int main(int argc, char** argv) {
  main_tid = tid();
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc > 2 && std::string(argv[1]) == "--cupti-only") {  // CUPTI alone, step by step
    cudaFree(nullptr);
    costs("nothing registered");
    cupti_during_capture(argv[2]);
    case_stream_sync();
    case_malloc_other_thread();
    case_raw_end();
    case_cublas(true);
    cupti_print = false;
    costs("CUPTI runtime+driver domains on");
    std::printf("cupti callbacks so far: %ld\n", cupti_calls.load());
    time_enable_toggle();
    std::printf("PROBE DONE\n");
    return 0;
  }
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("runtime %d driver %d\n", runtime, driver);
  cudaFree(nullptr);
  costs("nothing registered");
  cost_of_log_current();
  case_register_during_capture();  // registers the log callback
  costs("log callback registered");
  const bool cupti = argc > 1 && load_cupti(argv[1]);
  case_stream_sync();
  case_nested_sync(false);
  case_nested_sync(true);
  case_malloc_same_thread();
  case_malloc_other_thread();
  case_legacy();
  case_legacy_from_other_thread();
  case_pageable(true);
  case_pageable(false);
  case_event(false);
  case_event(true);
  case_wait_outside_event();
  case_raw_end();
  case_unjoined();
  case_other_global_capture();
  case_other_global_threadlocal();
  case_cublas(false);
  case_cublas(true);
  std::printf("\nlog messages in all: %d\n", log_messages.load());
  if (cupti) {
    cupti_print = false;
    costs("log + CUPTI runtime+driver domains on");
    time_enable_toggle();
    cupti_enable_domain(0, subscriber, 1);
    cupti_enable_domain(0, subscriber, 2);
    costs("log + CUPTI subscribed, domains off");
    cupti_unsubscribe(subscriber);
    costs("log + CUPTI unsubscribed");
  }
  std::printf("PROBE DONE\n");
  return 0;
}
