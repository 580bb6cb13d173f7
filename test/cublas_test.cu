// test/cublas_test.cu: tensorplay/cublas.hpp: what cublas_error says, and cuBLAS work captured
// into a Graph after cublas_set_stream.
#include <tensorplay/cublas.hpp>

#include "support.hpp"

#include <cublas_v2.h>

#include <cstddef>
#include <limits>
#include <random>
#include <source_location>
#include <string>
#include <vector>

namespace tp = tensorplay;

namespace {

constexpr int n = 48;  // n x n matrices, column-major as cuBLAS stores them
constexpr std::size_t count = std::size_t{n} * n;

// Small integers: every product and sum is exact in float (and in TF32), so the device result
// must equal the host's exactly.
std::vector<float> small_integers(unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> value(-3, 3);
  std::vector<float> m(count);
  for (float& x : m) x = static_cast<float>(value(random));
  return m;
}

//! A * B + 1, what the captured step computes.
std::vector<float> gemm_plus_one(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> c(count, 1.0f);
  for (int col = 0; col < n; ++col)
    for (int k = 0; k < n; ++k)
      for (int row = 0; row < n; ++row) c[row + col * n] += a[row + k * n] * b[k + col * n];
  return c;
}

struct Handle {
  cublasHandle_t get = nullptr;
  Handle() { BOOST_REQUIRE_EQUAL(cublasCreate(&get), CUBLAS_STATUS_SUCCESS); }
  ~Handle() { cublasDestroy(get); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

// Captures C = A * B + 1 (a cuBLAS SGEMM, then a kernel) with a workspace of `workspace_bytes`,
// gives A new values, replays, and compares C with the host.
void check_captured_gemm(std::size_t workspace_bytes) {
  tp::Stream stream;
  std::vector<float> a = small_integers(1);
  const std::vector<float> b = small_integers(2);
  tp::DeviceTensor<float> da(count, stream);
  tp::DeviceTensor<float> db(count, stream);
  tp::DeviceTensor<float> dc(count, stream);
  da.copy_from_host(a, stream);
  db.copy_from_host(b, stream);

  tp::DeviceTensor<std::byte> workspace(workspace_bytes, stream);
  Handle handle;
  tp::cublas_set_stream(handle.get, stream, workspace.span());
  const float one = 1.0f;
  const float zero = 0.0f;
  auto step = [&](tp::StreamRef s) {
    BOOST_REQUIRE_EQUAL(cublasSgemm(handle.get, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da.data(), n, db.data(), n,
                                    &zero, dc.data(), n),
                        CUBLAS_STATUS_SUCCESS);
    tp_test::add(dc.data(), count, 1.0f, s);
  };
  step(stream);  // cuBLAS initialises itself lazily: not inside the capture

  tp::Graph graph;
  graph.capture(step, {.stream = stream});
  BOOST_TEST(tp_test::not_capturing(stream));

  // New inputs after the capture and a poisoned output: only a replay that reads A now and
  // writes all of C passes.
  a = small_integers(3);
  da.copy_from_host(a, stream);
  dc.copy_from_host(std::vector<float>(count, std::numeric_limits<float>::quiet_NaN()), stream);
  graph.replay(stream);
  const std::vector<float> c = dc.to_host(stream);
  const std::vector<float> expected = gemm_plus_one(a, b);
  BOOST_TEST(c == expected, boost::test_tools::per_element());
}

}  // namespace

BOOST_AUTO_TEST_CASE(cublas_error_names_the_call_the_status_and_the_callers_line) {
  const std::source_location where = std::source_location::current();
  const tp::cublas_error error(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", where);
  const std::string text = error.what();
  BOOST_TEST(error.status() == CUBLAS_STATUS_INVALID_VALUE);
  BOOST_TEST(error.where().line() == where.line());
  BOOST_TEST(text.starts_with("cublasSetWorkspace failed: CUBLAS_STATUS_INVALID_VALUE ("), text);
  BOOST_TEST(text.find(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) != std::string::npos, text);
  BOOST_TEST(text.ends_with("cublas_test.cu:" + std::to_string(where.line())), text);
}

// cuBLAS refuses a handle that was never created before it looks for a GPU: runs everywhere.
BOOST_AUTO_TEST_CASE(set_stream_with_an_uncreated_handle_throws_cublas_error_at_the_callers_line) {
  const unsigned line = std::source_location::current().line() + 1;
  auto call = [] { tp::cublas_set_stream(nullptr, cudaStream_t{}, {}); };
  BOOST_CHECK_EXCEPTION(call(), tp::cublas_error, [&](const tp::cublas_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.status() == CUBLAS_STATUS_NOT_INITIALIZED && e.where().line() == line &&
           std::string(e.what()).starts_with("cublasSetStream failed: CUBLAS_STATUS_NOT_INITIALIZED");
  });
}

TP_GPU_TEST(set_stream_binds_the_handle_to_the_stream) {
  tp::Stream stream;
  tp::DeviceTensor<std::byte> workspace(std::size_t{1} << 20, stream);
  Handle handle;
  tp::cublas_set_stream(handle.get, stream, workspace.span());
  cudaStream_t bound = nullptr;
  BOOST_REQUIRE_EQUAL(cublasGetStream(handle.get, &bound), CUBLAS_STATUS_SUCCESS);
  BOOST_TEST(bound == stream.get());
}

TP_GPU_TEST(gemm_captured_with_a_workspace_replays_to_the_host_result_for_new_inputs) {
  check_captured_gemm(std::size_t{4} << 20);
}

// The documented alternative: no workspace at all, cuBLAS then uses algorithms that need none.
TP_GPU_TEST(gemm_captured_with_an_empty_workspace_replays_to_the_host_result_for_new_inputs) {
  check_captured_gemm(0);
}
