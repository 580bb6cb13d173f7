// tools/probes/boost_thread_fault.cpp: what Boost.Test 1.74 (the version the test binaries link,
// test/main.cpp) reports when a thread other than the main one faults at a small address, as in
// run 52's racecheck fault (docs/reliability.md, sections 15 and 17). Host only, no CUDA.
//
//   g++ -std=c++20 -O1 -pthread -o /tmp/boost_thread_fault tools/probes/boost_thread_fault.cpp -lboost_unit_test_framework
//   /tmp/boost_thread_fault --log_level=unit_scope --report_level=short -- side    (or: -- main)
//
// "side": a second thread writes to address 0x30 while the case's thread waits for it, as a
// thread waits inside a CUDA call for a thread of the driver's or a tool's. "main": the case's own
// thread writes there. Both print the same report, "fatal error: in "<case>": memory access
// violation at address: 0x00000030: no mapping at fault address" with the case's last
// checkpoint, so that report does not tell which thread faulted. A fault is critical to Boost:
// "Test is aborted", and the later cases do not run. In "side", the faulting thread jumps into
// the main thread's saved context and runs the report on it, while the main thread stays blocked.
// Yet the short report (--report_level=short) counts the cases that never ran as passed ("2 test
// cases out of 3 passed"); the JUnit log marks them skipped, and tools/gpu/run counts from it.
#define BOOST_TEST_MODULE boost_thread_fault
#define BOOST_TEST_DYN_LINK
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

namespace {

long thread_id() { return ::syscall(SYS_gettid); }

bool on_side_thread() {
  const auto& args = boost::unit_test::framework::master_test_suite().argv;
  const int n = boost::unit_test::framework::master_test_suite().argc;
  return n < 2 || std::strcmp(args[n - 1], "main") != 0;
}

void write_small_address() {
  volatile int* p = reinterpret_cast<int*>(0x30);
  *p = 1;
}

std::atomic<int> woken{0};

}  // namespace

BOOST_AUTO_TEST_CASE(a_thread_faults) {
  std::printf("case on thread %ld (main %d); fault on the %s thread\n", thread_id(), ::getpid(), on_side_thread() ? "side" : "main");
  BOOST_TEST_CHECKPOINT("before the fault");
  if (!on_side_thread()) write_small_address();
  std::thread([] {
    ::usleep(100'000);
    write_small_address();
    woken = 1;
    woken.notify_all();
  }).detach();
  woken.wait(0);  // never returns: the side thread faults before it wakes us
}

BOOST_AUTO_TEST_CASE(a_later_case) {
  std::printf("later case ran on thread %ld\n", thread_id());
  BOOST_TEST(thread_id() == ::getpid());
}

BOOST_AUTO_TEST_CASE(another_later_case) { BOOST_TEST(true); }
