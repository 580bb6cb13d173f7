// Compile-fail cases of stage_and_launch's compile-time checks. Built once per case by
// cuda_compile_outcomes (test/BUILD.bazel) with -DTENSORPLAY_COMPILE_CASE_<case>=1; the case
// "none" must compile. stage_static_checks_test.cu checks the outcomes.
#include <tensorplay/graph.hpp>

#include <cuda/std/mdspan>

#include <tuple>
#include <vector>

namespace tp = tensorplay;

namespace {
struct Opaque {
  int value;
};
using Strided = cuda::std::mdspan<float, cuda::std::dextents<int, 1>, cuda::std::layout_stride>;
}  // namespace

void stage_cases(tp::Graph& graph, tp::DeviceTensor<float>& a, tp::DeviceTensor<float>& b, tp::DeviceTensor<Opaque>& opaque,
                 Strided& strided, std::vector<float>& host_vector, std::span<const float>& read_only) {
  (void)opaque;
  (void)strided;
  (void)host_vector;
  (void)read_only;
#if defined(TENSORPLAY_COMPILE_CASE_arity)
  graph.stage_and_launch(std::tie(a, b), std::tie(a), tp::StreamRef{});
#elif defined(TENSORPLAY_COMPILE_CASE_not_convertible)
  graph.stage_and_launch(std::tie(a), std::tie(opaque), tp::StreamRef{});
#elif defined(TENSORPLAY_COMPILE_CASE_static_not_contiguous)
  graph.stage_and_launch(std::tie(strided), std::tie(a), tp::StreamRef{});
#elif defined(TENSORPLAY_COMPILE_CASE_input_not_a_tensor)
  graph.stage_and_launch(std::tie(a), std::tie(host_vector), tp::StreamRef{});
#elif defined(TENSORPLAY_COMPILE_CASE_const_static)
  graph.stage_and_launch(std::tie(read_only), std::tie(a), tp::StreamRef{});
#else
  graph.stage_and_launch(std::tie(a, b), std::tie(b, a), tp::StreamRef{});
#endif
}
