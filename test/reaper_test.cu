// The reaper thread (tensorplay/detail/reaper.hpp): it destroys what graphs retained, once CUDA
// has released it. The first cases hand it objects that hold no CUDA resources, so no GPU is
// needed and they run everywhere, CI included; the last retains device memory through graphs.
//
// The exit cases start this binary again as a worker (child_process.hpp) that exits: a fresh
// process, whose reaper nothing has started.
#include <tensorplay/detail/reaper.hpp>
#include <tensorplay/graph.hpp>

#include "child_process.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
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

//! Retained by a graph: device memory, given back in its destructor (a CUDA call), after `takes`.
//! Writes its letter to `fd` when its destructor begins, and in upper case once the memory is back.
struct HoldsMemory {
  int fd;
  char letter;
  std::chrono::milliseconds takes;
  std::atomic<bool>* begun;
  tensorplay::DeviceTensor<int> memory;
  HoldsMemory(int f, char l, std::chrono::milliseconds t, std::atomic<bool>* b, std::size_t n, tensorplay::StreamRef s)
      : fd(f), letter(l), takes(t), begun(b), memory(n, s) {}
  HoldsMemory(const HoldsMemory&) = delete;
  HoldsMemory& operator=(const HoldsMemory&) = delete;
  ~HoldsMemory() {
    (void)!::write(fd, &letter, 1);
    begun->store(true);
    std::this_thread::sleep_for(takes);
    memory = tensorplay::DeviceTensor<int>();
    const char done = static_cast<char>(letter - 'a' + 'A');
    (void)!::write(fd, &done, 1);
  }
};

//! Opens the file named by `variable` for the worker's events.
inline int open_events(const char* variable) {
  const char* path = std::getenv(variable);
  tp_test::worker_require(path != nullptr, std::string(variable) + " is not set");
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  tp_test::worker_require(fd >= 0, std::string("cannot open ") + path);
  return fd;
}

//! Waits (in a worker) until `flag` is set, at most 10 s.
inline void await(const std::atomic<bool>& flag, const char* what) {
  const auto until = Clock::now() + 10s;
  while (!flag.load()) {
    tp_test::worker_require(Clock::now() < until, what);
    std::this_thread::sleep_for(1ms);
  }
}

constexpr const char* events_variable = "TENSORPLAY_REAPER_EVENTS";  // the file the worker writes to

}  // namespace

// The exit case's child: hands the reaper an object slow to destroy, then, while the reaper
// destroys it, another, and exits (exit(), not the worker's usual _Exit: its handlers are the
// point). Each object writes its letter to the events file when its destructor begins, and the
// letter in upper case when it ends.
TP_WORKER(exit_while_the_reaper_destroys) {
  const int fd = open_events(events_variable);
  static std::atomic<bool> a_begun{false}, b_begun{false};
  // Registered before the reaper starts, so it runs after the reaper's exit handler: it stands for
  // the teardown that comes later (static destructors, the CUDA runtime's handlers), and gives a
  // reaper that still destroys during exit the time to show it.
  std::atexit([] { std::this_thread::sleep_for(200ms); });
  td::Reaper::enqueue(new Reporting(fd, 'a', 300ms, &a_begun));  // starts the reaper
  await(a_begun, "the reaper never began destroying the first object");
  td::Reaper::enqueue(new Reporting(fd, 'b', 0ms, &b_begun));  // queued while 'a' is destroyed
  std::exit(0);
}

// The same with device memory that graphs retained, on a GPU: graph A's object is being destroyed
// (its memory not yet given back), graph B's was released after it, and graph C's is held by a
// replay of C still running (it spins 2 s, then writes that memory) when the process exits.
TP_WORKER(exit_while_retained_memory_waits) {
  namespace tp = tensorplay;
  const int fd = open_events(events_variable);
  static std::atomic<bool> a_begun{false}, b_begun{false}, c_begun{false};
  std::atexit([] { std::this_thread::sleep_for(200ms); });  // after the reaper's handler, as above
  constexpr std::size_t n = 1 << 20;
  tp::Stream stream;
  auto held = [&](char letter, std::chrono::milliseconds takes, std::atomic<bool>* begun) {
    return std::make_shared<HoldsMemory>(fd, letter, takes, begun, n, stream);
  };
  auto a = std::make_unique<tp::Graph>(), b = std::make_unique<tp::Graph>(), c = std::make_unique<tp::Graph>();
  for (tp::Graph* g : {a.get(), b.get()})
    g->capture([&](tp::StreamRef s) { tp_test::spin_kernel<<<1, 1, 0, s>>>(1000); }, {.stream = stream});
  std::shared_ptr<HoldsMemory> c_object = held('c', 0ms, &c_begun);
  int* c_memory = c_object->memory.data();
  c->capture(
      [&](tp::StreamRef s) {
        tp_test::spin_kernel<<<1, 1, 0, s>>>(2'000'000'000);
        tp_test::fill_kernel<<<tp_test::blocks_for(n), 256, 0, s>>>(c_memory, n, 7);
      },
      {.stream = stream});
  a->retain(held('a', 300ms, &a_begun));
  b->retain(held('b', 0ms, &b_begun));
  c->retain(std::move(c_object));
  TP_WORKER_CHECK(cudaStreamSynchronize(stream));
  c->replay(stream);
  c.reset();  // its object goes once the replay completes: after the exit below
  a.reset();  // released at once: the reaper starts and destroys it
  await(a_begun, "the reaper never began destroying graph A's object");
  b.reset();  // released while A's object is destroyed
  TP_WORKER_CHECK(cudaGetLastError());
  std::exit(0);
}

namespace {

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
  // temp_path names the folder after the process id, which is the same in every Bazel sandbox
  // (a pid namespace each): the clock keeps runs of this binary side by side apart.
  const auto dir = tp_test::temp_path("reaper_exit_" + std::to_string(Clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{tp_test::spawn_worker(
      "exit_while_the_reaper_destroys", {{events_variable, (dir / "events").string()}}, dir / "child.log")};
  tp_test::require_children_succeed(children, 20s);  // above 128: a signal; timed out: it hung
  // 'a' began and finished before the process ended; 'b' never began.
  BOOST_TEST(tp_test::read_file(dir / "events") == "aA");
  std::filesystem::remove_all(dir);
}

// A GPU process that exits while objects that hold device memory wait at the reaper, or in a
// replay still running: it exits with status 0 (no destructor calls CUDA during the runtime's
// teardown, so none fails and terminates), the object the reaper was destroying gives its memory
// back before the process ends, and neither the queued object nor the one the replay held is
// destroyed.
TP_GPU_TEST(exit_with_retained_device_memory_queued_and_in_a_running_replay) {
  const auto dir = tp_test::temp_path("reaper_gpu_exit_" + std::to_string(Clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  std::vector<tp_test::Child> children{tp_test::spawn_worker(
      "exit_while_retained_memory_waits", {{events_variable, (dir / "events").string()}}, dir / "child.log")};
  tp_test::require_children_succeed(children, 60s);
  BOOST_TEST(tp_test::read_file(dir / "events") == "aA");
  std::filesystem::remove_all(dir);
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
