// test/child_process.hpp: the test binary as a child process of itself. A case starts it again
// with TENSORPLAY_TEST_WORKER=<name>; a global fixture runs the worker registered under that
// name (TP_WORKER) before any test case, and the process ends with the worker's status (or
// however the worker ends it). The parent's case checks that status and shows the child's output
// when it is not 0. Used where a case needs a process of its own: one NCCL rank per process,
// NCCL's once-per-process settings, or a process that exits (reaper_test).
#pragma once

#include "support.hpp"

#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tp_test {

using namespace std::chrono_literals;

using Worker = void (*)();

inline std::map<std::string, Worker>& workers() {
  static std::map<std::string, Worker> table;
  return table;
}

struct RegisterWorker {
  RegisterWorker(const char* name, Worker worker) { workers()[name] = worker; }
};

//! Defines a worker: a function run in a child process. It fails by throwing (worker_require).
#define TP_WORKER(name)                                                     \
  static void name##_worker();                                              \
  static const ::tp_test::RegisterWorker name##_registration(#name, &name##_worker); \
  static void name##_worker()

//! A worker's assertion: throws (the child then prints the message and exits with status 1).
inline void worker_require(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error(message);
}
inline void worker_require(cudaError_t status, const char* call) {
  worker_require(status == cudaSuccess, std::string(call) + ": " + cudaGetErrorString(status));
}
#define TP_WORKER_CHECK(call) ::tp_test::worker_require((call), #call)

//! In a child (TENSORPLAY_TEST_WORKER set): runs the worker and ends the process with its status,
//! before any test case runs. In the parent: does nothing.
struct WorkerDispatch {
  WorkerDispatch() {
    const char* name = std::getenv("TENSORPLAY_TEST_WORKER");
    if (name == nullptr) return;
    int status = 0;
    try {
      const auto found = workers().find(name);
      if (found == workers().end()) throw std::runtime_error(std::string("no worker named ") + name);
      found->second();
      std::printf("worker %s: ok\n", name);
    } catch (const std::exception& e) {
      std::printf("worker %s FAILED: %s\n", name, e.what());
      status = 1;
    } catch (...) {
      std::printf("worker %s FAILED: an exception of unknown type\n", name);
      status = 1;
    }
    std::fflush(nullptr);
    // Not exit(): Boost.Test's own shutdown would report a run with no test case.
    std::_Exit(status);
  }
};

//! A child process of this test binary, its output going to a file.
struct Child {
  pid_t pid = -1;
  std::filesystem::path log;
  int status = -1;        //!< the exit status once it exited; -1 while running or when killed
  bool timed_out = false; //!< killed because it ran past its deadline

  [[nodiscard]] std::string output() const { return read_file(log); }
};

//! Starts this executable again with `env` added to (and overriding) the current environment,
//! minus the variables that would make the child write the parent's test reports.
inline Child spawn_worker(const std::string& worker, const std::map<std::string, std::string>& env,
                          const std::filesystem::path& log) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const auto eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const char* report : {"XML_OUTPUT_FILE", "TENSORPLAY_JUNIT_DIR", "TESTBRIDGE_TEST_ONLY"}) vars.erase(report);
  vars["TENSORPLAY_TEST_WORKER"] = worker;
  for (const auto& [name, value] : env) vars[name] = value;
  std::vector<std::string> entries;
  for (const auto& [name, value] : vars) entries.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);

  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  char* argv[] = {self.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Child child;
  child.log = log;
  const int error = ::posix_spawn(&child.pid, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  BOOST_REQUIRE_MESSAGE(error == 0, "posix_spawn failed: " << error);
  return child;
}

//! Waits for every child, at most until `limit` has passed; once one has failed, the others get
//! `grace` more (a rank whose peer died waits for it forever). Children still running then are
//! killed. Returns true when all exited with status 0.
inline bool wait_all(std::vector<Child>& children, std::chrono::milliseconds limit, std::chrono::milliseconds grace = 15s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::size_t running = children.size();
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (Child& child : children) {
      if (child.pid < 0) continue;
      int raw = 0;
      if (::waitpid(child.pid, &raw, WNOHANG) != child.pid) continue;
      child.pid = -1;
      --running;
      child.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      if (child.status != 0) deadline = std::min(deadline, std::chrono::steady_clock::now() + grace);
    }
    std::this_thread::sleep_for(5ms);
  }
  for (Child& child : children) {
    if (child.pid < 0) continue;
    ::kill(child.pid, SIGKILL);
    (void)::waitpid(child.pid, nullptr, 0);
    child.pid = -1;
    child.timed_out = true;
  }
  bool ok = true;
  for (const Child& child : children) ok = ok && child.status == 0;
  return ok;
}

//! Checks that every child exited with status 0 within the limit, showing the output of those
//! that did not.
inline void require_children_succeed(std::vector<Child>& children, std::chrono::milliseconds limit) {
  const bool ok = wait_all(children, limit);
  for (const Child& child : children) {
    BOOST_TEST_MESSAGE("---- child output (" << child.log.filename().string() << "):\n" << child.output());
    BOOST_TEST(child.status == 0, "child " << child.log.filename().string() << (child.timed_out ? " timed out" : "")
                                           << ", status " << child.status << ":\n"
                                           << child.output());
  }
  BOOST_TEST(ok);
}

// Every test binary that includes this header can run workers.
BOOST_TEST_GLOBAL_FIXTURE(WorkerDispatch);

}  // namespace tp_test
