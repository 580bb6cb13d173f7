// tensorplay/tensor.hpp: tensor_traits, the Tensor concepts, and adapters for standard types.
//
// A type is a tensor when tensor_traits<T> describes it:
//
//     template <> struct tensorplay::tensor_traits<MyTensor> {
//       using element_type = float;                                   // void: typed at run time
//       static constexpr tensorplay::MemorySpace space = tensorplay::MemorySpace::Device;
//       static constexpr bool contiguous = true;
//       static float* data(const MyTensor& t) { return t.ptr; }
//       static std::size_t size(const MyTensor& t) { return t.count; }  // elements
//       // optional: static int device(const MyTensor&)   (else asked from CUDA when needed)
//       // non-contiguous types: static constexpr std::size_t rank; extent(t, r), stride(t, r)
//       // run-time typed ones (element_type = void): static DType dtype(const MyTensor&)
//     };
#pragma once

#include <tensorplay/config.hpp>
#include <tensorplay/error.hpp>
#include <tensorplay/version.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

// The half-precision types are named, not defined, here: <cuda_fp16.h> and <cuda_bf16.h> are
// expensive to parse, and a tensor of them needs the type complete only where it is used.
struct __half;
struct __nv_bfloat16;

namespace tensorplay {

//! Where a tensor type's memory lives, as far as the type says.
enum class MemorySpace {
  Device,   //!< device memory of one GPU (DeviceTensor, thrust::device_vector)
  Unknown,  //!< any memory; where it is gets asked from CUDA when it matters (spans, mdspans)
};

//! Customisation point: specialise it to make a type a Tensor (see the header comment).
template <class T>
struct tensor_traits;

//! Element types of run-time typed tensors (TensorView).
enum class DType : std::uint8_t { Bool, Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float16, BFloat16, Float32, Float64 };

template <class T>
inline constexpr bool has_dtype_v = false;
template <class T>
inline constexpr DType dtype_v = DType::Bool;
#define TENSORPLAY_DTYPE(type, code)          \
  template <>                                 \
  inline constexpr bool has_dtype_v<type> = true; \
  template <>                                 \
  inline constexpr DType dtype_v<type> = DType::code;
TENSORPLAY_DTYPE(bool, Bool)
TENSORPLAY_DTYPE(std::int8_t, Int8)
TENSORPLAY_DTYPE(std::uint8_t, UInt8)
TENSORPLAY_DTYPE(std::int16_t, Int16)
TENSORPLAY_DTYPE(std::uint16_t, UInt16)
TENSORPLAY_DTYPE(std::int32_t, Int32)
TENSORPLAY_DTYPE(std::uint32_t, UInt32)
TENSORPLAY_DTYPE(std::int64_t, Int64)
TENSORPLAY_DTYPE(std::uint64_t, UInt64)
TENSORPLAY_DTYPE(__half, Float16)
TENSORPLAY_DTYPE(__nv_bfloat16, BFloat16)
TENSORPLAY_DTYPE(float, Float32)
TENSORPLAY_DTYPE(double, Float64)
#undef TENSORPLAY_DTYPE

[[nodiscard]] constexpr const char* to_string(DType t) noexcept {
  constexpr const char* names[] = {"bool",  "int8",   "uint8",   "int16",    "uint16",  "int32",  "uint32",
                                   "int64", "uint64", "float16", "bfloat16", "float32", "float64"};
  return names[static_cast<int>(t)];
}

//! A non-owning view whose element type is known only at run time (for interop, e.g. with a
//! framework's tensors). Functions that need a particular element type check it and throw
//! usage_error when it differs.
struct TensorView {
  void* data = nullptr;
  std::size_t size = 0;  // elements
  DType dtype = DType::Float32;

  template <class T>
    requires has_dtype_v<std::remove_cv_t<T>>
  static TensorView of(T* data, std::size_t size) noexcept {
    return {const_cast<std::remove_cv_t<T>*>(data), size, dtype_v<std::remove_cv_t<T>>};
  }
};

namespace detail {

template <class T>
using traits_of = tensor_traits<std::remove_cvref_t<T>>;

template <class T>
concept HasTensorTraits = requires { typename traits_of<T>::element_type; };

template <class T>
concept ExposesData = requires(const T& t) {
  { traits_of<T>::data(t) } -> std::same_as<typename traits_of<T>::element_type*>;
};

template <class T>
concept ExposesSize = requires(const T& t) {
  { traits_of<T>::size(t) } -> std::convertible_to<std::size_t>;
};

template <class T>
concept DeclaresMemorySpace = requires {
  { traits_of<T>::space } -> std::convertible_to<MemorySpace>;
};

template <class T>
concept DeclaresLayout = requires {
  { traits_of<T>::contiguous } -> std::convertible_to<bool>;
};

template <class T>
concept DenseLayout = DeclaresLayout<T> && traits_of<T>::contiguous;

template <class T>
concept RuntimeTyped = std::is_void_v<typename traits_of<T>::element_type>;

template <class T>
concept ExposesStrides = requires(const T& t, std::size_t r) {
  { traits_of<T>::rank } -> std::convertible_to<std::size_t>;
  { traits_of<T>::extent(t, r) } -> std::convertible_to<std::size_t>;
  { traits_of<T>::stride(t, r) } -> std::convertible_to<std::ptrdiff_t>;
};

template <class T>
concept KnowsDevice = requires(const T& t) {
  { traits_of<T>::device(t) } -> std::convertible_to<int>;
};

}  // namespace detail

//! Device-accessible memory with an element type and a size: DeviceTensor, thrust::device_vector,
//! std::span and cuda::std::mdspan (over device memory: checked at run time where it matters).
template <class T>
concept Tensor = detail::HasTensorTraits<T> && detail::ExposesData<T> && detail::ExposesSize<T> &&
                 detail::DeclaresMemorySpace<T> && detail::DeclaresLayout<T> &&
                 (detail::DenseLayout<T> || detail::ExposesStrides<T>);

//! A Tensor whose elements are dense: element i is at data() + i.
template <class T>
concept ContiguousTensor = Tensor<T> && detail::DenseLayout<T>;

//! A Tensor of bool (or typed at run time). Its size must be 1: checked at run time.
template <class T>
concept ScalarPredicate =
    ContiguousTensor<T> && (std::same_as<std::remove_cv_t<typename detail::traits_of<T>::element_type>, bool> ||
                            detail::RuntimeTyped<T>);

//! The element type of a tensor type, without cv-qualifiers.
template <Tensor T>
using element_t = std::remove_cv_t<typename detail::traits_of<T>::element_type>;

// ---- adapters -------------------------------------------------------------------------
// Thrust's vectors and mdspans are recognised by their shape, so that this header needs neither
// Thrust nor <cuda/std/mdspan> (each costs seconds of compile time in every translation unit).
// Where their memory is gets asked from CUDA when it matters, as for spans.

namespace detail {

//! thrust::device_vector and its kin: data() returns a fancy pointer whose get() is the raw
//! pointer (a host vector's data() is a raw pointer, so std::vector and thrust::host_vector fail).
template <class V>
concept ThrustVectorShape = requires(const V& v) {
  typename V::value_type;
  typename V::allocator_type;
  requires std::is_class_v<std::remove_cvref_t<decltype(v.data())>>;
  { v.data().get() } -> std::convertible_to<const typename V::value_type*>;
  { v.size() } -> std::convertible_to<std::size_t>;
};

//! std::mdspan / cuda::std::mdspan with an accessor whose data handle is a raw pointer
//! (default_accessor). Dense (contiguous) when its layout is always exhaustive (layout_right,
//! layout_left); otherwise (layout_stride) element positions come from extents and strides.
template <class M>
concept MdspanShape = requires(const M& m, std::size_t r) {
  typename M::element_type;
  typename M::extents_type;
  typename M::layout_type;
  typename M::accessor_type;
  typename M::mapping_type;
  requires std::same_as<typename M::data_handle_type, typename M::element_type*>;
  { m.data_handle() } -> std::convertible_to<typename M::element_type*>;
  { M::rank() } -> std::convertible_to<std::size_t>;
  { M::is_always_exhaustive() } -> std::convertible_to<bool>;
  { m.extent(r) } -> std::convertible_to<std::size_t>;
  { m.stride(r) } -> std::convertible_to<std::ptrdiff_t>;
  { m.size() } -> std::convertible_to<std::size_t>;
};

}  // namespace detail

template <class V>
  requires detail::ThrustVectorShape<V> && (!detail::MdspanShape<V>)
struct tensor_traits<V> {
  using element_type = typename V::value_type;
  static constexpr MemorySpace space = MemorySpace::Unknown;
  static constexpr bool contiguous = true;
  static element_type* data(const V& v) noexcept { return const_cast<element_type*>(v.data().get()); }
  static std::size_t size(const V& v) noexcept { return static_cast<std::size_t>(v.size()); }
};

template <class T, std::size_t Extent>
struct tensor_traits<std::span<T, Extent>> {
  using element_type = T;
  static constexpr MemorySpace space = MemorySpace::Unknown;
  static constexpr bool contiguous = true;
  static T* data(const std::span<T, Extent>& s) noexcept { return s.data(); }
  static std::size_t size(const std::span<T, Extent>& s) noexcept { return s.size(); }
};

template <class M>
  requires detail::MdspanShape<M>
struct tensor_traits<M> {
  using element_type = typename M::element_type;
  static constexpr MemorySpace space = MemorySpace::Unknown;
  static constexpr bool contiguous = M::is_always_exhaustive();
  static constexpr std::size_t rank = M::rank();
  static element_type* data(const M& s) noexcept { return s.data_handle(); }
  static std::size_t size(const M& s) noexcept { return static_cast<std::size_t>(s.size()); }
  static std::size_t extent(const M& s, std::size_t r) noexcept { return static_cast<std::size_t>(s.extent(r)); }
  static std::ptrdiff_t stride(const M& s, std::size_t r) noexcept { return static_cast<std::ptrdiff_t>(s.stride(r)); }
};

template <>
struct tensor_traits<TensorView> {
  using element_type = void;
  static constexpr MemorySpace space = MemorySpace::Unknown;
  static constexpr bool contiguous = true;
  static void* data(const TensorView& v) noexcept { return v.data; }
  static std::size_t size(const TensorView& v) noexcept { return v.size; }
  static DType dtype(const TensorView& v) noexcept { return v.dtype; }
};

// ---- access helpers -------------------------------------------------------------------

//! Pointer to the first element.
template <Tensor T>
[[nodiscard]] auto tensor_data(const T& t) noexcept {
  return detail::traits_of<T>::data(t);
}

//! Number of elements.
template <Tensor T>
[[nodiscard]] std::size_t tensor_size(const T& t) noexcept {
  return static_cast<std::size_t>(detail::traits_of<T>::size(t));
}

namespace detail {

//! What CUDA says about an address.
struct PointerInfo {
  cudaMemoryType type = cudaMemoryTypeUnregistered;  // Unregistered: pageable host memory (or not CUDA's)
  int device = -1;

  [[nodiscard]] bool device_accessible() const noexcept;
};

TENSORPLAY_DECL PointerInfo pointer_info(const void* ptr, const tensorplay::source_location& where);

//! The run-time element type of a tensor: its static one, or a TensorView's dtype.
template <Tensor T>
[[nodiscard]] constexpr bool has_element_type(const T& t, DType expected) noexcept {
  if constexpr (RuntimeTyped<T>) {
    return traits_of<T>::dtype(t) == expected;
  } else {
    return has_dtype_v<element_t<T>> && dtype_v<element_t<T>> == expected;
  }
}

template <Tensor T>
[[nodiscard]] std::string element_name(const T& t) {
  if constexpr (RuntimeTyped<T>) {
    return to_string(traits_of<T>::dtype(t));
  } else if constexpr (has_dtype_v<element_t<T>>) {
    return to_string(dtype_v<element_t<T>>);
  } else {
    return "a " + std::to_string(sizeof(element_t<T>)) + "-byte type";
  }
}

}  // namespace detail
}  // namespace tensorplay

// ---- definitions: inline, or compiled once in src/library.cpp (config.hpp) ------------------

#if TENSORPLAY_DEFINE_BODIES
#include <tensorplay/detail/device.hpp>

namespace tensorplay::detail {

TENSORPLAY_DECL bool PointerInfo::device_accessible() const noexcept {
  return type == cudaMemoryTypeDevice || type == cudaMemoryTypeManaged;
}

TENSORPLAY_DECL PointerInfo pointer_info(const void* ptr, const tensorplay::source_location& where) {
  cudaPointerAttributes attributes{};
  TENSORPLAY_CHECK(cudaPointerGetAttributes(&attributes, ptr), where);
  return {attributes.type, attributes.device};
}

}  // namespace tensorplay::detail
#endif  // TENSORPLAY_DEFINE_BODIES
