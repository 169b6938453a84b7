// CPU sort/top-k: one line along the axis at a time, lines split over threads.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/sort/sort.h"

namespace cf::kernels {

namespace {

// a < b with NaN above everything (NaNs equal among themselves).
template <typename T>
inline bool value_less(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

template <typename T>
void sort_typed(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
                const Tensor& indices) {
  const int64_t len = x.shape()[size_t(axis)];
  if (k == 0 || x.numel() == 0) return;
  const int64_t lines = x.numel() / len;
  // Non-axis dimensions, shared by x and the outputs (which have length k on `axis`).
  Shape sizes, xst, vst, ist;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == axis) continue;
    sizes.push_back(x.shape()[size_t(d)]);
    xst.push_back(x.strides()[size_t(d)]);
    vst.push_back(values.defined() ? values.strides()[size_t(d)] : 0);
    ist.push_back(indices.strides()[size_t(d)]);
  }
  const int64_t x_as = x.strides()[size_t(axis)];
  const int64_t v_as = values.defined() ? values.strides()[size_t(axis)] : 0;
  const int64_t i_as = indices.strides()[size_t(axis)];
  const T* xd = static_cast<const T*>(x.impl_ptr()->storage->data) + x.offset();
  T* vd = values.defined() ? values.data<T>() : nullptr;
  int64_t* id = indices.data<int64_t>();

  using Key = std::pair<T, int64_t>;
  // Value first, then position: a strict total order, so the unstable std::sort and
  // std::partial_sort give the one stable answer.
  auto before = [descending](const Key& a, const Key& b) {
    if (descending ? value_less(b.first, a.first) : value_less(a.first, b.first)) return true;
    if (descending ? value_less(a.first, b.first) : value_less(b.first, a.first)) return false;
    return a.second < b.second;
  };

  parallel_for(lines, std::max<int64_t>(1, kParallelGrain / len), [&](int64_t b, int64_t e) {
    std::vector<Key> buf(static_cast<size_t>(len));  // once per chunk, not per line
    for (int64_t line = b; line < e; ++line) {
      int64_t xo = 0, vo = 0, io = 0, rem = line;
      for (size_t d = sizes.size(); d-- > 0;) {
        int64_t c = rem % sizes[d];
        rem /= sizes[d];
        xo += c * xst[d];
        vo += c * vst[d];
        io += c * ist[d];
      }
      for (int64_t j = 0; j < len; ++j) buf[size_t(j)] = {xd[xo + j * x_as], j};
      if (k == len)
        std::sort(buf.begin(), buf.end(), before);
      else
        std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        if (vd) vd[vo + j * v_as] = buf[size_t(j)].first;
        id[io + j * i_as] = buf[size_t(j)].second;
      }
    }
  });
}

}  // namespace

void sort_cpu(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
              const Tensor& indices) {
  CF_DISPATCH_NUMERIC(x.dtype(), "sort", sort_typed<scalar_t>(x, axis, k, descending, values, indices));
}

}  // namespace cf::kernels
