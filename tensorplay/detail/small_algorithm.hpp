// tensorplay/detail/small_algorithm.hpp: the few algorithms the library needs, without <algorithm>.
//
// C++20's <algorithm> brings the ranges algorithms into every translation unit that includes
// tensorplay (about a tenth of what the standard headers of the API cost g++ alone, and as much
// again in each of nvcc's front ends); the library sorts a few vectors and searches them.
#pragma once

#include <cstddef>
#include <utility>

namespace tensorplay::detail {

//! Sorts data[0, n) by `less` (heap sort: O(n log n), in place, not stable, like std::sort).
template <class T, class Less>
void sort_range(T* data, std::size_t n, Less less) {
  auto sift = [&](std::size_t root, std::size_t end) {
    for (;;) {
      std::size_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && less(data[child], data[child + 1])) ++child;
      if (!less(data[root], data[child])) return;
      std::swap(data[root], data[child]);
      root = child;
    }
  };
  for (std::size_t i = n / 2; i-- > 0;) sift(i, n);
  for (std::size_t end = n; end-- > 1;) {
    std::swap(data[0], data[end]);
    sift(0, end);
  }
}

//! Sorts data[0, n) ascending (operator<).
template <class T>
void sort_range(T* data, std::size_t n) {
  sort_range(data, n, [](const T& a, const T& b) { return a < b; });
}

//! The first position in sorted data[0, n) whose element is not before `key`
//! (before(element, key): the element sorts before the key), n if none (std::lower_bound).
template <class T, class K, class Before>
std::size_t lower_bound_index(const T* data, std::size_t n, const K& key, Before before) {
  std::size_t low = 0;
  while (n > 0) {
    const std::size_t half = n / 2;
    if (before(data[low + half], key)) {
      low += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  return low;
}

//! lower_bound_index with operator<.
template <class T>
std::size_t lower_bound_index(const T* data, std::size_t n, const T& key) {
  return lower_bound_index(data, n, key, [](const T& a, const T& b) { return a < b; });
}

//! Whether `range` (a vector, say) holds an element equal to `value` (std::find != end).
template <class Range, class T>
bool contains(const Range& range, const T& value) {
  for (const auto& element : range)
    if (element == value) return true;
  return false;
}

}  // namespace tensorplay::detail
