// Tests for tensorplay/tensor.hpp: the concepts in both directions, the adapters, TensorView.
#include "support.hpp"

#include <tensorplay/device_tensor.hpp>
#include <tensorplay/tensor.hpp>
#include <tensorplay/thrust.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda/std/mdspan>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <array>
#include <span>
#include <vector>

namespace tp = tensorplay;

namespace {
using Right = cuda::std::mdspan<float, cuda::std::dextents<int, 2>, cuda::std::layout_right>;
using Left = cuda::std::mdspan<float, cuda::std::dextents<int, 2>, cuda::std::layout_left>;
using Strided = cuda::std::mdspan<float, cuda::std::dextents<int, 2>, cuda::std::layout_stride>;

// A user type made a tensor through the customisation point.
struct UserBuffer {
  double* ptr;
  std::size_t count;
};
}  // namespace

template <>
struct tensorplay::tensor_traits<UserBuffer> {
  using element_type = double;
  static constexpr MemorySpace space = MemorySpace::Device;
  static constexpr bool contiguous = true;
  static double* data(const UserBuffer& b) { return b.ptr; }
  static std::size_t size(const UserBuffer& b) { return b.count; }
};

// ---- Tensor: types that must satisfy it, and types that must not --------------------------
static_assert(tp::Tensor<tp::DeviceTensor<float>>);
static_assert(tp::Tensor<const tp::DeviceTensor<int>&>);
static_assert(tp::Tensor<thrust::device_vector<float>>);
static_assert(tp::Tensor<thrust::device_vector<float, tp::PoolAllocator<float>>>);
static_assert(tp::Tensor<std::span<float>>);
static_assert(tp::Tensor<std::span<const float, 4>>);
static_assert(tp::Tensor<Right> && tp::Tensor<Left> && tp::Tensor<Strided>);
static_assert(tp::Tensor<UserBuffer>);
static_assert(tp::Tensor<tp::TensorView>);
static_assert(!tp::Tensor<std::vector<float>>);
static_assert(!tp::Tensor<thrust::host_vector<float>>);
static_assert(!tp::Tensor<int>);
static_assert(!tp::Tensor<float*>);
static_assert(!tp::Tensor<std::array<float, 4>>);

// ---- ContiguousTensor ------------------------------------------------------------------------
static_assert(tp::ContiguousTensor<tp::DeviceTensor<float>>);
static_assert(tp::ContiguousTensor<thrust::device_vector<int>>);
static_assert(tp::ContiguousTensor<std::span<float>>);
static_assert(tp::ContiguousTensor<Right> && tp::ContiguousTensor<Left>);
static_assert(!tp::ContiguousTensor<Strided>, "layout_stride is not contiguous in general");
static_assert(!tp::ContiguousTensor<std::vector<float>>);

// ---- ScalarPredicate -------------------------------------------------------------------------
static_assert(tp::ScalarPredicate<tp::DeviceTensor<bool>>);
static_assert(tp::ScalarPredicate<thrust::device_vector<bool>>);
static_assert(tp::ScalarPredicate<std::span<bool, 1>>);
static_assert(tp::ScalarPredicate<std::span<const bool>>);
static_assert(tp::ScalarPredicate<tp::TensorView>, "run-time typed: its element type is checked at run time");
static_assert(!tp::ScalarPredicate<tp::DeviceTensor<int>>);
static_assert(!tp::ScalarPredicate<tp::DeviceTensor<float>>);
static_assert(!tp::ScalarPredicate<bool>);
static_assert(!tp::ScalarPredicate<std::vector<bool>>);

static_assert(std::is_same_v<tp::element_t<const tp::DeviceTensor<float>&>, float>);
static_assert(std::is_same_v<tp::element_t<std::span<const int>>, int>);

BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(adapters_report_data_and_size) {
  std::array<float, 6> storage{};
  std::span<float> span(storage);
  BOOST_TEST(tp::tensor_data(span) == storage.data());
  BOOST_TEST(tp::tensor_size(span) == 6u);
  Right right(storage.data(), 2, 3);
  BOOST_TEST(tp::tensor_size(right) == 6u);
  BOOST_TEST(tp::tensor_data(right) == storage.data());
  UserBuffer user{nullptr, 42};
  BOOST_TEST(tp::tensor_size(user) == 42u);
}

BOOST_AUTO_TEST_CASE(strided_mdspan_exposes_extents_and_strides) {
  std::array<float, 12> storage{};
  // A 2 x 3 view that takes every second column of a 2 x 6 array.
  const cuda::std::array<int, 2> strides{6, 2};
  Strided view(storage.data(), Strided::mapping_type(cuda::std::dextents<int, 2>(2, 3), strides));
  using traits = tp::tensor_traits<Strided>;
  BOOST_TEST(traits::rank == 2u);
  BOOST_TEST(traits::extent(view, 1) == 3u);
  BOOST_TEST(traits::stride(view, 0) == 6);
  BOOST_TEST(traits::stride(view, 1) == 2);
}

BOOST_AUTO_TEST_CASE(tensor_view_carries_its_element_type) {
  bool flag = false;
  const auto view = tp::TensorView::of(&flag, 1);
  BOOST_TEST(tp::detail::has_element_type(view, tp::DType::Bool));
  BOOST_TEST(!tp::detail::has_element_type(view, tp::DType::Int32));
  int value = 0;
  BOOST_TEST(tp::detail::element_name(tp::TensorView::of(&value, 1)) == "int32");
  BOOST_TEST(tp::detail::has_element_type(std::span<const float>(), tp::DType::Float32));
}

TP_GPU_TEST(pointer_info_tells_device_from_host_memory) {
  tp::DeviceTensor<float> device(16);
  std::vector<float> pageable(16);
  float* pinned = nullptr;
  BOOST_REQUIRE_EQUAL(cudaMallocHost(&pinned, 64), cudaSuccess);
  const auto here = std::source_location::current();
  BOOST_TEST(tp::detail::pointer_info(device.data(), here).type == cudaMemoryTypeDevice);
  BOOST_TEST(tp::detail::pointer_info(device.data(), here).device_accessible());
  BOOST_TEST(!tp::detail::pointer_info(pageable.data(), here).device_accessible());
  BOOST_TEST(tp::detail::pointer_info(pinned, here).type == cudaMemoryTypeHost);
  BOOST_REQUIRE_EQUAL(cudaFreeHost(pinned), cudaSuccess);
}

BOOST_AUTO_TEST_SUITE_END()
