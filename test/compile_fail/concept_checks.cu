// Compile-fail cases of the Tensor concepts and of what the conditional-node and staging entry
// points accept. Built once per case by cuda_compile_outcomes (test/BUILD.bazel) with
// -DTENSORPLAY_COMPILE_CASE_<case>=1; the case "none" must compile: it makes the correct call
// next to each misuse, so that each misuse fails for its one difference. concept_checks_test.cu
// checks the outcomes.
#include <tensorplay/graph.hpp>

#include <span>
#include <tuple>
#include <vector>

namespace tp = tensorplay;

#if defined(TENSORPLAY_COMPILE_CASE_none)
// What the concepts must say of the common types, both ways.
static_assert(tp::Tensor<tp::DeviceTensor<float>>);
static_assert(tp::ContiguousTensor<std::span<float>>);
static_assert(tp::ScalarPredicate<tp::DeviceTensor<bool>>);
static_assert(!tp::Tensor<std::vector<float>>);
static_assert(!tp::Tensor<int*>);
// The conditional-node calls are constrained, so generic code can ask whether a call is valid.
struct NoArgBody {
  void operator()() const {}
};
template <class P>
concept IfAccepts = requires(tp::Graph& g, const P& p, NoArgBody body) { g.if_(p, body); };
template <class I>
concept SwitchAccepts = requires(tp::Graph& g, const I& i, NoArgBody body) { g.switch_(i, body); };
static_assert(IfAccepts<tp::DeviceTensor<bool>>);
static_assert(!IfAccepts<tp::DeviceTensor<int>>);
static_assert(!IfAccepts<std::vector<bool>>);
static_assert(SwitchAccepts<tp::DeviceTensor<int>>);
static_assert(!SwitchAccepts<tp::DeviceTensor<bool>>);
#endif

void concept_cases(tp::Graph& graph, tp::DeviceTensor<bool>& flag, tp::DeviceTensor<int>& index, tp::DeviceTensor<float>& a,
                   tp::DeviceTensor<float>& b, std::vector<float>& host) {
  const auto body = [](tp::StreamRef) {};
  (void)flag;
  (void)index;
  (void)a;
  (void)b;
  (void)host;
  (void)body;
#if defined(TENSORPLAY_COMPILE_CASE_host_vector_as_predicate)
  graph.if_(std::vector<bool>{true}, body);
#elif defined(TENSORPLAY_COMPILE_CASE_int_tensor_as_predicate)
  graph.while_(index, body);
#elif defined(TENSORPLAY_COMPILE_CASE_bool_switch_index)
  graph.switch_(flag, body, body);
#elif defined(TENSORPLAY_COMPILE_CASE_host_vector_staged)
  graph.stage_and_launch(std::tie(a), std::tie(host));
#elif defined(TENSORPLAY_COMPILE_CASE_mismatched_arity)
  graph.stage_and_launch(std::tie(a, b), std::tie(a));
#elif defined(TENSORPLAY_COMPILE_CASE_host_vector_as_tensor_concept)
  static_assert(tensorplay::Tensor<std::vector<float>>);
#elif defined(TENSORPLAY_COMPILE_CASE_rebind_other_element_type)
  (void)graph.rebind(a, index);
#else
  graph.if_(flag, body);
  graph.while_(flag, body);
  graph.switch_(index, body, body);
  graph.stage_and_launch(std::tie(a), std::tie(b));
  graph.stage_and_launch(std::tie(a, b), std::tie(b, a));
  (void)graph.rebind(a, b);
#endif
}
