// Tests tensorplay across a shared-library boundary (docs/shared_libraries.md): a library that
// allocates a DeviceTensor while a Graph of this executable captures.
//  - libodr_so_default.so, linked at link time, default visibility: its copies of the library's
//    function-local statics are this executable's (one capture registry), so the allocation
//    comes from the graph's pool.
//  - libodr_so_hidden.so, loaded with dlopen, -fvisibility=hidden: it has registries of its
//    own. The allocation must then either still come from the graph's pool or throw
//    usage_error; never silently come from somewhere else.
#include "odr_so.hpp"
#include "support.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>

namespace tp = tensorplay;

namespace {

constexpr std::size_t n = 1000;

struct Library {
  OdrSoAllocate allocate = nullptr;
  OdrSoRelease release = nullptr;
};

Library linked_library() { return {&odr_so_allocate_in_capture, &odr_so_release}; }

// Next to this executable (Bazel builds it there), else found through LD_LIBRARY_PATH (.gpu/lib
// on the GPU machine). Not through an $ORIGIN rpath: under AddressSanitizer, dlopen is called
// from the sanitizer's runtime, and the loader then ignores the executable's RUNPATH.
std::string hidden_library_path() {
  const char* name = "libodr_so_hidden.so";
  std::error_code error;
  const std::filesystem::path beside = std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / name;
  return !error && std::filesystem::exists(beside) ? beside.string() : name;
}

// Never closed: its statics may outlive any test.
Library hidden_library() {
  static const std::string path = hidden_library_path();
  static void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  BOOST_REQUIRE_MESSAGE(handle != nullptr, "dlopen(" << path << "): " << dlerror());
  Library library;
  library.allocate = reinterpret_cast<OdrSoAllocate>(dlsym(handle, "odr_so_allocate_in_capture"));
  library.release = reinterpret_cast<OdrSoRelease>(dlsym(handle, "odr_so_release"));
  return library;
}

//! What happened when a library allocated inside a capture of this executable's Graph.
struct Outcome {
  OdrSoAllocation seen;
  std::size_t graph_pool_growth = 0;  // bytes the graph's pool handed out during the call
  tp::PoolId graph_pool;
  cudaStream_t capture_stream = nullptr;

  [[nodiscard]] tp::PoolId library_pool() const { return {seen.pool_device, seen.pool_serial}; }
  [[nodiscard]] bool from_graph_pool() const {
    return seen.error == 0 && library_pool() == graph_pool && graph_pool_growth >= n * sizeof(float);
  }
  [[nodiscard]] std::string describe() const {
    std::ostringstream text;
    text << "library: error " << seen.error << " \"" << seen.message << "\", pool " << library_pool() << ", current stream "
         << seen.current_stream << "; graph: pool " << graph_pool << " (grew by " << graph_pool_growth
         << " bytes), capture stream " << capture_stream;
    return text.str();
  }
};

Outcome allocate_inside_capture(const Library& library) {
  tp::Stream stream;
  // This executable's default pool is made first, so that the graph's pool id is not the first
  // one of this module: a library with a pool directory of its own numbers its pools from the
  // start too, and an id it reports could otherwise equal the graph's by coincidence.
  tp::DeviceTensor<float> made_default_pool(1, stream);
  tp::Graph graph({.pool = tp::graph_pool_handle()});
  Outcome outcome;
  void* tensor = nullptr;
  graph.capture(
      [&](tp::StreamRef s) {
        const std::size_t before = graph.pool().allocated_bytes();
        tensor = library.allocate(n, &outcome.seen);
        outcome.graph_pool_growth = graph.pool().allocated_bytes() - before;
        outcome.capture_stream = s;
      },
      {.stream = stream});
  outcome.graph_pool = graph.pool_id();
  if (tensor != nullptr) library.release(tensor);
  return outcome;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(odr_so)

// Host only: both libraries are found, where the tests run (Bazel) and on the GPU machine.
BOOST_AUTO_TEST_CASE(both_libraries_load_and_export_their_two_functions) {
  const Library linked = linked_library();
  const Library hidden = hidden_library();
  BOOST_TEST(hidden.allocate != nullptr);
  BOOST_TEST(hidden.release != nullptr);
  // dlsym on the hidden library's handle finds its own functions, not the linked library's.
  BOOST_TEST(reinterpret_cast<void*>(hidden.allocate) != reinterpret_cast<void*>(linked.allocate));
}

TP_GPU_TEST(library_with_default_visibility_allocates_from_the_capturing_graphs_pool) {
  const Outcome outcome = allocate_inside_capture(linked_library());
  BOOST_TEST_REQUIRE(outcome.seen.error == 0, outcome.describe());
  BOOST_TEST(outcome.from_graph_pool(), outcome.describe());
  BOOST_TEST(outcome.seen.current_stream == static_cast<void*>(outcome.capture_stream), outcome.describe());
}

TP_GPU_TEST(library_with_hidden_visibility_never_allocates_outside_the_graphs_pool_silently) {
  const Outcome outcome = allocate_inside_capture(hidden_library());
  const bool refused = outcome.seen.error == 1 && std::string(outcome.seen.message).find("not by a tensorplay::Graph") != std::string::npos;
  BOOST_TEST((outcome.from_graph_pool() || refused), outcome.describe());
}

BOOST_AUTO_TEST_SUITE_END()
