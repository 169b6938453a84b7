#include "core/shape.h"

#include <algorithm>

#include "core/error.h"

namespace cf {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  CF_CHECK(!__builtin_mul_overflow(a, b, &r), ShapeError, "[", op, "] ", what, " overflows int64: ", a,
           " * ", b);
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  CF_CHECK(!__builtin_add_overflow(a, b, &r), ShapeError, "[", op, "] ", what, " overflows int64: ", a,
           " + ", b);
  return r;
}

int64_t checked_numel(const Shape& s, const char* op) {
  // The product of max(size, 1) must fit too, not only the element count: it is
  // the outermost contiguous stride, so an empty shape like (2^40, 0, 2^40) would
  // overflow contiguous_strides and every index * stride computed on it (found by
  // fuzz_idx). For a shape without zeros the two products are the same.
  bool has_zero = false;
  int64_t extent = 1;
  for (int64_t d : s) {
    has_zero = has_zero || d == 0;
    if (__builtin_mul_overflow(extent, std::max<int64_t>(d, 1), &extent))
      throw ShapeError(has_zero || std::find(s.begin(), s.end(), int64_t(0)) != s.end()
                           ? str("[", op, "] shape ", shape_str(s),
                                 " has sizes whose product exceeds int64: its strides cannot be represented")
                           : str("[", op, "] shape ", shape_str(s), " has more elements than int64 can count"));
  }
  return has_zero ? 0 : extent;
}

int64_t checked_nbytes(const Shape& s, size_t elem_size, const char* op) {
  int64_t n = checked_numel(s, op), bytes = 0;
  CF_CHECK(!__builtin_mul_overflow(n, int64_t(elem_size), &bytes), ShapeError, "[", op, "] shape ",
           shape_str(s), " of ", elem_size, "-byte elements needs more than 2^63 bytes");
  return bytes;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ",";
    r += std::to_string(s[i]);
  }
  return r + ")";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    CF_CHECK(da == db || da == 1 || db == 1, ShapeError, "[", op, "] shapes ", shape_str(a), " and ",
             shape_str(b), " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const int64_t f = from[from.size() - i];
    if (f != 1 && f != to[to.size() - i]) return false;
  }
  return true;
}

int64_t normalize_axis(int64_t axis, int64_t ndim, const char* op) {
  int64_t lim = std::max<int64_t>(ndim, 1);
  CF_CHECK(axis >= -lim && axis < lim, IndexError, "[", op, "] axis ", axis,
           " is out of range for a tensor of ", ndim, " dimensions");
  return axis < 0 ? axis + lim : axis;
}

}  // namespace cf
