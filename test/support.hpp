// test/support.hpp: what the test files share: the GPU precondition and a few tiny kernels.
#pragma once

#include <tensorplay/graph.hpp>
#include <tensorplay/detail/caching_allocator.hpp>  // detail::round_up

#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace tp_test {

inline int gpu_count() {
  static const int count = tensorplay::detail::device_count();
  return count;
}

//! Precondition for cases that need a GPU: without one Boost.Test reports them as skipped.
struct NeedsGpus {
  int count = 1;
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(gpu_count() >= count);
    if (!result) result.message() << "needs " << count << " GPU(s), found " << gpu_count();
    return result;
  }
};

//! Precondition for cases that check behaviour without a GPU.
struct NeedsNoGpu {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(gpu_count() == 0);
    if (!result) result.message() << "checks the no-GPU behaviour; a GPU is present";
    return result;
  }
};

//! Host memory in place of cudaMalloc, for an AllocatorBackend of the pool allocator (cases that
//! need no GPU): `live` holds the segments allocated and not yet released, one set per Owner.
template <class Owner>
struct HostSegments {
  static inline std::set<void*> live;
  static cudaError_t allocate(void** ptr, std::size_t bytes) {
    *ptr = std::aligned_alloc(256, tensorplay::detail::round_up(bytes, 256));
    if (*ptr == nullptr) return cudaErrorMemoryAllocation;
    live.insert(*ptr);
    return cudaSuccess;
  }
  static void release(int, const std::vector<void*>& segments) {
    for (void* s : segments) {
      live.erase(s);
      std::free(s);
    }
  }
};

//! A number from the environment (e.g. shorter soak runs under compute-sanitizer).
inline long env_or(const char* name, long fallback) {
  const char* text = std::getenv(name);
  return text == nullptr ? fallback : std::strtol(text, nullptr, 10);
}

template <class T>
__global__ void fill_kernel(T* out, std::size_t n, T value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

template <class T>
__global__ void add_kernel(T* out, std::size_t n, T value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] += value;
}

//! out[i] = a * in[i] + b
template <class T>
__global__ void affine_kernel(const T* in, T* out, std::size_t n, T a, T b) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a * in[i] + b;
}

//! Keeps a stream busy for `nanoseconds` of wall-clock time (the GPU's global timer, so that
//! sanitizers that stretch or skip sleeps do not shorten it).
__device__ inline void spin_for(long long nanoseconds) {
  unsigned long long start = 0;
  unsigned long long now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<unsigned long long>(nanoseconds));
}

template <int = 0>  // a template, so that every test file may define it
__global__ void spin_kernel(long long nanoseconds) {
  spin_for(nanoseconds);
}

inline unsigned blocks_for(std::size_t n) { return static_cast<unsigned>(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024); }

template <class T>
void fill(T* out, std::size_t n, T value, cudaStream_t stream) {
  fill_kernel<<<blocks_for(n), 256, 0, stream>>>(out, n, value);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

template <class T>
void add(T* out, std::size_t n, T value, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), 256, 0, stream>>>(out, n, value);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

template <class T>
void affine(const T* in, T* out, std::size_t n, T a, T b, cudaStream_t stream) {
  affine_kernel<<<blocks_for(n), 256, 0, stream>>>(in, out, n, a, b);
  BOOST_REQUIRE_EQUAL(cudaGetLastError(), cudaSuccess);
}

//! True when `stream` is not being captured (what every misuse test checks afterwards).
inline bool not_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusNone;
}

//! Runs `work`, which must throw capture_error; returns it.
template <class F>
tensorplay::capture_error expect_capture_error(F&& work) {
  try {
    work();
  } catch (const tensorplay::capture_error& e) {
    BOOST_TEST_MESSAGE("capture_error: " << e.what());
    return e;
  } catch (const std::exception& e) {
    BOOST_FAIL("expected capture_error, got: " << e.what());
  }
  BOOST_FAIL("expected capture_error, nothing was thrown");
  throw 0;  // not reached
}

//! Runs `work`, which must throw usage_error; returns its message.
template <class F>
std::string expect_usage_error(F&& work) {
  try {
    work();
  } catch (const tensorplay::usage_error& e) {
    BOOST_TEST_MESSAGE("usage_error: " << e.what());
    return e.what();
  } catch (const std::exception& e) {
    BOOST_FAIL("expected usage_error, got: " << e.what());
  }
  BOOST_FAIL("expected usage_error, nothing was thrown");
  throw 0;  // not reached
}

//! A path in the temporary directory, unique to this process.
inline std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("tensorplay_" + std::to_string(::getpid()) + "_" + name);
}

//! The whole text of a file.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

//! Whether this process has the GPU to itself, so that device-wide figures (cudaMemGetInfo)
//! measure its own use: tools/gpu/run sets TENSORPLAY_GPU_SHARED=1 for sanitizer runs that share
//! the GPU with other processes (TENSORPLAY_SANITIZE_JOBS > 1), whose memory moves those figures.
inline bool gpu_to_itself() { return std::getenv("TENSORPLAY_GPU_SHARED") == nullptr; }

//! Precondition for cases whose point is a device-wide memory figure (see gpu_to_itself).
struct GpuToItself {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(gpu_count() > 0 && gpu_to_itself());
    if (!result) result.message() << "needs a GPU to itself (TENSORPLAY_GPU_SHARED: other processes use it)";
    return result;
  }
};

//! Bytes of device memory in use on the current device. Meaningful only when gpu_to_itself().
inline std::size_t device_bytes_in_use() {
  std::size_t free = 0;
  std::size_t total = 0;
  BOOST_REQUIRE_EQUAL(cudaMemGetInfo(&free, &total), cudaSuccess);
  return total - free;
}

//! The process's resident set size in bytes (leak checks).
inline std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

template <class T>
std::vector<T> host_copy(const T* device, std::size_t n, cudaStream_t stream) {
  std::vector<T> out(n);
  BOOST_REQUIRE_EQUAL(cudaMemcpyAsync(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  BOOST_REQUIRE_EQUAL(cudaStreamSynchronize(stream), cudaSuccess);
  return out;
}

//! A GPU, and launches that stay asynchronous: under compute-sanitizer's synccheck a busy stream
//! was seen finished before the host could look (tools/gpu/run names the tool in
//! TENSORPLAY_UNDER_SANITIZER), which cases about work still in flight cannot use.
struct AsyncLaunches {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    const char* tool = std::getenv("TENSORPLAY_UNDER_SANITIZER");
    boost::test_tools::assertion_result result(gpu_count() > 0 && (tool == nullptr || std::string(tool) != "synccheck"));
    if (!result) result.message() << "needs a GPU and launches that stay asynchronous (not under synccheck)";
    return result;
  }
};

}  // namespace tp_test

#define TP_GPU_TEST(name) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(tp_test::NeedsGpus{1}))
#define TP_GPUS_TEST(name, n) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(tp_test::NeedsGpus{n}))
#define TP_NO_GPU_TEST(name) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(tp_test::NeedsNoGpu{}))
