// test/host_only/host_support.hpp: what the translation units compiled by a host compiler
// (host_only_test.cpp, random_host_test.cpp) share: the GPU precondition (test/support.hpp has
// kernels, which these files cannot compile).
#pragma once

#include <tensorplay/graph.hpp>

#include <boost/test/unit_test.hpp>

#ifdef __CUDACC__
#error "this file must be compiled by a host compiler, not nvcc"
#endif

namespace host_test {

inline int gpu_count() {
  static const int count = tensorplay::detail::device_count();
  return count;
}

//! Precondition for cases that need a GPU: without one Boost.Test reports them as skipped.
struct NeedsGpu {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result result(gpu_count() >= 1);
    if (!result) result.message() << "needs a GPU";
    return result;
  }
};

}  // namespace host_test

#define HOST_GPU_TEST(name) BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(host_test::NeedsGpu{}))
