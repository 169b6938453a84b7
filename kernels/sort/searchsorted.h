#pragma once
// Binary search of values in sorted rows (torch.searchsorted, NumPy's searchsorted).
//
// sorted is (rows, m) and values (rows, k), both contiguous and of one dtype; out (rows, k)
// int64. out[r, j] is the number of elements of row r that sort before values[r, j] (left), or
// before or equal to it (right): the position where it would be inserted to keep the row sorted,
// the first such (left) or the last (right). The order is the sort kernels' (sort.h): NaN sorts
// as the largest value, NaNs tie with one another. Rows that are not sorted give some position
// in [0, m], as NumPy's and PyTorch's. One search per value, O(log m); CPU and CUDA share it.
#include <cstdint>
#include <type_traits>

#include "core/half.h"  // CF_HD, BFloat16, Half
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct SearchGeom {
  int64_t rows = 1, m = 0, k = 0;
};

// The value a search compares: 16-bit floats as float32 (exact), the others as they are.
template <typename T>
CF_HD auto search_key(T v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
    return float(v);
  } else {
    return v;
  }
}

// a sorts strictly before b: NaN is the largest value and equal to itself.
template <typename K>
CF_HD bool sorts_before(K a, K b) {
  if constexpr (std::is_floating_point_v<K>) {
    if (a != a) return false;
    if (b != b) return true;
  }
  return a < b;
}

template <typename T>
CF_HD int64_t search_row(const T* row, int64_t m, T value, bool right) {
  const auto v = search_key(value);
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const auto e = search_key(row[mid]);
    // left: go past every element that sorts before v; right: past those v does not sort before
    if (right ? !sorts_before(v, e) : sorts_before(e, v)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

void searchsorted_cpu(const Tensor& sorted, const Tensor& values, const Tensor& out, const SearchGeom& g,
                      bool right);
#ifdef CF_WITH_CUDA
void searchsorted_cuda(const Tensor& sorted, const Tensor& values, const Tensor& out, const SearchGeom& g,
                       bool right);
#endif

inline void searchsorted(const Tensor& sorted, const Tensor& values, const Tensor& out, const SearchGeom& g,
                         bool right) {
  CF_DEVICE_DISPATCH("searchsorted", values.device(), searchsorted_cpu(sorted, values, out, g, right),
                     searchsorted_cuda(sorted, values, out, g, right));
}

}  // namespace cf::kernels
