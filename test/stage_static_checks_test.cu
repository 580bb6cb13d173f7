// Tests stage_and_launch's compile-time checks: each misuse in compile_fail/stage_static_checks.cu
// must fail to compile with a message that says what is wrong.
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
};

Outcome outcome(const std::string& name) {
  const char* dir = std::getenv("TENSORPLAY_COMPILE_OUTCOMES_DIR");
  BOOST_REQUIRE_MESSAGE(dir != nullptr, "TENSORPLAY_COMPILE_OUTCOMES_DIR is not set");
  std::ifstream in(std::string(dir) + "/" + name + ".log");
  BOOST_REQUIRE_MESSAGE(in.good(), "no outcome log for case " << name);
  std::string first;
  std::getline(in, first);
  BOOST_REQUIRE(first.rfind("exit=", 0) == 0);
  std::stringstream rest;
  rest << in.rdbuf();
  return {std::stoi(first.substr(5)), rest.str()};
}

void expect_failure_saying(const std::string& name, const std::string& message) {
  const Outcome o = outcome(name);
  BOOST_TEST(o.exit_code != 0, "case " << name << " compiled");
  BOOST_TEST(o.output.find(message) != std::string::npos, "case " << name << " output:\n" << o.output.substr(0, 2000));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stage_static_checks)

BOOST_AUTO_TEST_CASE(correct_stage_and_launch_compiles) {
  const Outcome o = outcome("none");
  BOOST_TEST(o.exit_code == 0, o.output.substr(0, 2000));
}

BOOST_AUTO_TEST_CASE(tuples_of_different_arity_do_not_compile) {
  expect_failure_saying("arity", "static_inputs and inputs must have the same number of elements");
}

BOOST_AUTO_TEST_CASE(element_types_that_do_not_convert_do_not_compile) {
  expect_failure_saying("not_convertible", "does not convert to its static buffer's element type");
}

BOOST_AUTO_TEST_CASE(static_buffer_that_is_not_contiguous_does_not_compile) {
  expect_failure_saying("static_not_contiguous", "every static buffer must be a ContiguousTensor");
}

BOOST_AUTO_TEST_CASE(input_that_is_not_a_tensor_does_not_compile) {
  expect_failure_saying("input_not_a_tensor", "every input must be a Tensor");
}

BOOST_AUTO_TEST_CASE(read_only_static_buffer_does_not_compile) {
  expect_failure_saying("const_static", "a static buffer must be writable");
}

BOOST_AUTO_TEST_SUITE_END()
