// Tests the compile-time checks of the Tensor concepts, the conditional nodes and
// stage_and_launch: each misuse in compile_fail/concept_checks.cu must fail to compile with a
// message that says what is wrong. The conditional-node calls are constrained (generic code sees
// it), so their message is the compiler's note on the refused constraint, which names it.
#include "compile_outcomes.hpp"

using tp_test::expect_failure_saying;

BOOST_AUTO_TEST_SUITE(concept_checks)

BOOST_AUTO_TEST_CASE(correct_calls_and_concept_checks_compile) { tp_test::expect_compiles("none"); }

BOOST_AUTO_TEST_CASE(host_vector_as_predicate_does_not_compile) {
  expect_failure_saying("host_vector_as_predicate", "requires detail::BoolTensorOrDevicePredicate<P>");
}

BOOST_AUTO_TEST_CASE(int_tensor_as_predicate_does_not_compile) {
  expect_failure_saying("int_tensor_as_predicate", "requires detail::BoolTensorOrDevicePredicate<P>");
}

BOOST_AUTO_TEST_CASE(bool_tensor_as_switch_index_does_not_compile) {
  expect_failure_saying("bool_switch_index", "requires detail::IntegralTensorOrDeviceIndex<Index>");
}

BOOST_AUTO_TEST_CASE(host_vector_staged_as_input_does_not_compile) {
  expect_failure_saying("host_vector_staged", "stage_and_launch: every input must be a Tensor");
}

BOOST_AUTO_TEST_CASE(two_static_buffers_for_one_input_do_not_compile) {
  expect_failure_saying("mismatched_arity", "stage_and_launch: static_inputs and inputs must have the same number of elements");
}

// nvcc says only "static assertion failed" and shows the line: the concept appears there.
BOOST_AUTO_TEST_CASE(host_vector_is_not_a_tensor) {
  expect_failure_saying("host_vector_as_tensor_concept", "static assertion failed");
  expect_failure_saying("host_vector_as_tensor_concept", "tensorplay::Tensor<std::vector<float>>");
}

BOOST_AUTO_TEST_CASE(rebind_to_another_element_type_does_not_compile) {
  expect_failure_saying("rebind_other_element_type", "rebind: the new buffer (to) must have the element type of the old one (from)");
}

BOOST_AUTO_TEST_SUITE_END()
