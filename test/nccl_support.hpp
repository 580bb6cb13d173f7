// test/nccl_support.hpp: what the NCCL test files share: NCCL's settings for the GPU machine,
// bounded waits (no NCCL test may hang the suite), and child processes of the test binary itself
// (child_process.hpp; NCCL reads some settings once per process, and one rank per process needs
// processes).
#pragma once

#include <tensorplay/nccl.hpp>

#include "child_process.hpp"
#include "support.hpp"

#include <boost/test/unit_test.hpp>

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tp_test {

using namespace std::chrono_literals;

//! NCCL settings for the GPU machine, unless the environment already has them: no NVLink
//! multicast there (gpu.md). Call before the first communicator is made.
inline void nccl_defaults() { ::setenv("NCCL_NVLS_ENABLE", "0", 0); }

#define TP_NCCL_REQUIRE(call) BOOST_REQUIRE_EQUAL(static_cast<int>(call), static_cast<int>(ncclSuccess))

//! Runs `f` on a thread of its own and waits at most `limit`: true when it returned (its
//! exception, if any, is rethrown here). On a timeout the thread is left running, detached, so
//! that the case can fail instead of hanging; `f` must own what it uses (capture by move).
template <class F>
bool finishes_within(std::chrono::milliseconds limit, F f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([done, f = std::move(f)]() mutable {
    try {
      f();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (finished.wait_for(limit) != std::future_status::ready) return false;
  finished.get();
  return true;
}

//! Polls `pred` until it holds or `limit` passes; returns its last value.
template <class P>
bool eventually(std::chrono::milliseconds limit, P pred) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

//! Makes `device` current for its lifetime (and nothing else: unlike tensorplay::StreamGuard it
//! leaves the current stream alone, so conditional bodies may open and close inside it). Throws
//! std::runtime_error on failure, so that workers may use it too.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess || cudaSetDevice(device) != cudaSuccess)
      throw std::runtime_error("cannot make device " + std::to_string(device) + " current");
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

//! Sets an environment variable for its lifetime; restores the previous value (or its absence).
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  ~EnvGuard() {
    if (previous_) {
      ::setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

// ---- children of NCCL tests (the machinery: child_process.hpp) ------------------------------

//! A worker's NCCL assertion, for TP_WORKER_CHECK.
inline void worker_require(ncclResult_t status, const char* call) {
  worker_require(status == ncclSuccess, std::string(call) + ": " + ncclGetErrorString(status));
}

//! How long a GPU child may run: TENSORPLAY_NCCL_CHILD_TIMEOUT_S seconds (120 by default; more
//! under compute-sanitizer, through TENSORPLAY_SANITIZE_ENV).
inline std::chrono::milliseconds child_limit() {
  return std::chrono::seconds(env_or("TENSORPLAY_NCCL_CHILD_TIMEOUT_S", 120));
}

//! Checks that every child exited with status 0 within child_limit().
inline void require_children_succeed(std::vector<Child>& children) { require_children_succeed(children, child_limit()); }

}  // namespace tp_test
