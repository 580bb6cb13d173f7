// Tests stage_and_launch's compile-time checks: each misuse in compile_fail/stage_static_checks.cu
// must fail to compile with a message that says what is wrong.
#include "compile_outcomes.hpp"

using tp_test::expect_failure_saying;

BOOST_AUTO_TEST_SUITE(stage_static_checks)

BOOST_AUTO_TEST_CASE(correct_stage_and_launch_compiles) { tp_test::expect_compiles("none"); }

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
