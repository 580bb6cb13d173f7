// The reaper thread (tensorplay/detail/reaper.hpp): it destroys what graphs retained, once CUDA
// has released it. The objects here hold no CUDA resources, so no GPU is needed and these cases
// run everywhere, CI included.
//
// The exit case starts this binary again, as a child that runs a short program before main
// (TENSORPLAY_REAPER_EXIT_FD set) and exits: a fresh process, whose reaper nothing has started,
// and whose exit runs no Boost.Test code.
#include <tensorplay/detail/reaper.hpp>

#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace td = tensorplay::detail;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

//! Counts its own destruction, after `takes` (a user's destructor may call CUDA, and take long).
struct Counted final : td::RetainedBox {
  std::atomic<int>* count;
  std::chrono::milliseconds takes;
  Counted(std::atomic<int>* c, std::chrono::milliseconds t) : count(c), takes(t) {}
  ~Counted() override {
    std::this_thread::sleep_for(takes);
    count->fetch_add(1, std::memory_order_relaxed);
  }
};

//! Writes its letter to `fd` when its destructor begins, and the letter in upper case when it ends.
struct Reporting final : td::RetainedBox {
  int fd;
  char letter;
  std::chrono::milliseconds takes;
  std::atomic<bool>* begun;
  Reporting(int f, char l, std::chrono::milliseconds t, std::atomic<bool>* b) : fd(f), letter(l), takes(t), begun(b) {}
  ~Reporting() override {
    (void)!::write(fd, &letter, 1);
    begun->store(true);
    std::this_thread::sleep_for(takes);
    const char done = static_cast<char>(letter - 'a' + 'A');
    (void)!::write(fd, &done, 1);
  }
};

//! The exit case's child: hands the reaper an object slow to destroy, then, while the reaper
//! destroys it, another, and exits. Ends with 4 when the reaper never began the first.
[[noreturn]] void exit_while_the_reaper_destroys(int fd) {
  static std::atomic<bool> a_begun{false}, b_begun{false};
  td::Reaper::enqueue(new Reporting(fd, 'a', 300ms, &a_begun));  // starts the reaper
  for (const auto until = Clock::now() + 10s; !a_begun.load();) {
    if (Clock::now() > until) std::_Exit(4);
    std::this_thread::sleep_for(1ms);
  }
  td::Reaper::enqueue(new Reporting(fd, 'b', 0ms, &b_begun));  // queued while 'a' is destroyed
  std::exit(0);
}

constexpr std::string_view exit_fd_variable = "TENSORPLAY_REAPER_EXIT_FD";

[[maybe_unused]] const bool exit_child = [] {
  if (const char* fd = std::getenv(exit_fd_variable.data())) exit_while_the_reaper_destroys(std::atoi(fd));
  return false;
}();

//! Starts this binary again as the exit case's child, writing to `fd`; its pid, or -1.
pid_t start_exit_child(int fd) {
  std::vector<std::string> variables{std::string(exit_fd_variable) + "=" + std::to_string(fd)};
  for (char** e = environ; *e; ++e) variables.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& v : variables) envp.push_back(v.data());
  envp.push_back(nullptr);
  char name[] = "reaper_test";
  char* argv[] = {name, nullptr};
  pid_t child = -1;
  return ::posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0 ? child : -1;
}

//! Everything written to `fd` until it closes, or until `deadline`.
std::string read_until_closed(int fd, Clock::time_point deadline) {
  std::string got;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return got + "<timeout>";
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[64];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) return got;
    got.append(buffer, static_cast<std::size_t>(n));
  }
}

//! The child's exit status, 128 + the signal that ended it, or -1 when it did not end before
//! `deadline` (it is killed then).
int wait_for_exit(pid_t child, Clock::time_point deadline) {
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

//! Waits for `f` until `deadline`. A thread still running then is taken for a deadlock: the case
//! fails and the process ends, since its future's destructor would wait for it forever.
template <class T>
void finished_by(std::future<T>& f, Clock::time_point deadline, const char* what) {
  if (f.wait_until(deadline) == std::future_status::ready) return;
  std::cerr << "reaper_test: " << what << " did not finish before the deadline (deadlock?)" << std::endl;
  BOOST_ERROR(what << " did not finish before the deadline (deadlock?)");
  std::_Exit(3);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reaper)

// A program that exits while the reaper destroys an object: exit() waits for that destructor to
// finish, and the reaper destroys nothing more (what is queued goes with the process), rather
// than running user destructors while the exit handlers and the CUDA runtime's teardown run.
BOOST_AUTO_TEST_CASE(exit_lets_the_running_destructor_finish_and_the_reaper_destroys_nothing_more) {
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);  // not close-on-exec: the child writes to fds[1]
  const pid_t child = start_exit_child(fds[1]);
  ::close(fds[1]);
  BOOST_REQUIRE(child > 0);
  const std::string events = read_until_closed(fds[0], Clock::now() + 20s);
  ::close(fds[0]);
  const int code = wait_for_exit(child, Clock::now() + 20s);
  BOOST_TEST(code == 0, "the child ended with " << code << " (4: no reaper thread in it; above 128: a signal; -1: it hung and was killed)");
  BOOST_TEST(events == "aA");  // 'a' began and finished before the process ended; 'b' never began
}

// Many threads hand objects over at once (as CUDA's callback thread does) while another drains:
// every object is destroyed exactly once, and drain() returns only when every object handed over
// before it is gone, a slow one handed over last included.
BOOST_AUTO_TEST_CASE(objects_from_many_threads_are_destroyed_once_and_drain_waits_for_all) {
  constexpr int producers = 8;
  constexpr int per_producer = 20000;
  std::vector<std::atomic<int>> destroyed(static_cast<std::size_t>(producers * per_producer));
  const Clock::time_point deadline = Clock::now() + 60s;
  std::atomic<bool> producing{true};
  std::future<long> drainer = std::async(std::launch::async, [&] {  // must neither hang nor return early
    long drains = 0;
    for (; producing.load(); ++drains) td::Reaper::instance().drain();
    return drains;
  });
  std::vector<std::future<void>> threads;
  for (int p = 0; p < producers; ++p)
    threads.push_back(std::async(std::launch::async, [&, p] {
      for (int i = 0; i < per_producer; ++i)  // every 2000th object is slow to destroy
        td::Reaper::enqueue(new Counted(&destroyed[static_cast<std::size_t>(p * per_producer + i)], i % 2000 == 0 ? 1ms : 0ms));
    }));
  for (std::future<void>& t : threads) finished_by(t, deadline, "a handing-over thread");
  producing.store(false);
  finished_by(drainer, deadline, "the draining thread");
  BOOST_TEST_MESSAGE("drains while objects arrived: " << drainer.get());

  std::atomic<int> slow_destroyed{0};
  std::future<void> last = std::async(std::launch::async, [&] {
    td::Reaper::enqueue(new Counted(&slow_destroyed, 200ms));
    td::Reaper::instance().drain();
  });
  finished_by(last, deadline, "the last drain");
  long once = 0, other = 0;  // read right after drain(): every object must be gone already
  for (const std::atomic<int>& d : destroyed) (d.load() == 1 ? once : other) += 1;
  BOOST_TEST(once == static_cast<long>(destroyed.size()));
  BOOST_TEST(other == 0);
  BOOST_TEST(slow_destroyed.load() == 1);
}

BOOST_AUTO_TEST_SUITE_END()
