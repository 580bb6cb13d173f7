// Tests for tensorplay/error.hpp.
#include "support.hpp"

#include <tensorplay/error.hpp>

#include <boost/test/unit_test.hpp>

#include <string>
#include <type_traits>

namespace tp = tensorplay;

BOOST_AUTO_TEST_SUITE(error)

static_assert(std::is_base_of_v<std::runtime_error, tp::cuda_error>);
static_assert(std::is_base_of_v<std::logic_error, tp::usage_error>);

namespace {
// Reports the line of its caller, as every tensorplay entry point does.
void fail_with(cudaError_t status, std::source_location where = std::source_location::current()) {
  TENSORPLAY_CHECK(status, where);
}
}  // namespace

BOOST_AUTO_TEST_CASE(cuda_error_names_call_status_and_callers_line) {
  const int line = __LINE__ + 2;
  try {
    fail_with(cudaErrorInvalidValue);
    BOOST_FAIL("no exception");
  } catch (const tp::cuda_error& e) {
    const std::string what = e.what();
    BOOST_TEST(e.status() == cudaErrorInvalidValue);
    BOOST_TEST(what.find("status") != std::string::npos);  // the stringified call
    BOOST_TEST(what.find("cudaErrorInvalidValue") != std::string::npos);
    BOOST_TEST(what.find("error_test.cu:" + std::to_string(line)) != std::string::npos, what);
    BOOST_TEST(e.where().line() == static_cast<unsigned>(line));
  }
}

BOOST_AUTO_TEST_CASE(check_passes_success_through) { BOOST_CHECK_NO_THROW(fail_with(cudaSuccess)); }

BOOST_AUTO_TEST_CASE(no_device_statuses_say_so) {
  try {
    fail_with(cudaErrorNoDevice);
    BOOST_FAIL("no exception");
  } catch (const tp::cuda_error& e) {
    BOOST_TEST(std::string(e.what()).find("no usable CUDA device") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(usage_error_message_names_tensorplay) {
  try {
    tp::detail::throw_usage("replay before capture");
    BOOST_FAIL("no exception");
  } catch (const tp::usage_error& e) {
    BOOST_TEST(std::string(e.what()) == "tensorplay: replay before capture");
  }
}

TP_GPU_TEST(check_clears_the_last_error_before_throwing) {
  // An invalid launch configuration leaves a (non-sticky) last error behind.
  tp::Stream stream;
  tp_test::fill_kernel<<<1, 4096, 0, stream>>>(static_cast<int*>(nullptr), 0, 0);
  const cudaError_t launch = cudaPeekAtLastError();
  BOOST_REQUIRE_NE(launch, cudaSuccess);
  BOOST_CHECK_THROW(fail_with(launch), tp::cuda_error);
  BOOST_TEST(cudaPeekAtLastError() == cudaSuccess);
}

BOOST_AUTO_TEST_SUITE_END()
