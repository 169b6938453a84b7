// View ops (reshape, permute, slice, expand and their sugar). Each returns a
// view of its input's storage when the strides allow it and records a node
// whose backward maps the gradient back to the input's shape.
#include "autograd/ops/shape.h"

#include <algorithm>
#include <optional>

#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "kernels/elementwise/elementwise.h"

namespace cf {

namespace {

Shape infer_shape(const Shape& want, int64_t numel, const Shape& from, const char* op) {
  Shape s = want, known_sizes = want;
  int64_t infer_at = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      CF_CHECK(infer_at < 0, ShapeError, "[", op, "] only one -1 allowed in ", shape_str(want));
      infer_at = int64_t(i);
      known_sizes[i] = 1;
    } else {
      CF_CHECK(s[i] >= 0, ShapeError, "[", op, "] invalid size in ", shape_str(want));
    }
  }
  const int64_t known = checked_numel(known_sizes, op);
  if (infer_at >= 0) {
    CF_CHECK(known != 0 && numel % known == 0, ShapeError, "[", op, "] cannot reshape ",
             shape_str(from), " into ", shape_str(want));
    s[size_t(infer_at)] = numel / known;
  }
  CF_CHECK(checked_numel(s, op) == numel, ShapeError, "[", op, "] cannot reshape ", shape_str(from), " (",
           numel, " elements) into ", shape_str(want));
  return s;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible:
// groups of old axes that are contiguous among themselves map onto groups of new axes.
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  Shape out(new_shape.size());
  if (numel_of(shape) == 0 || shape.empty()) {
    out = contiguous_strides(new_shape);
    return out;
  }
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[size_t(d)];
    if (d == 0 || (shape[size_t(d - 1)] != 1 &&
                   strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[size_t(view_d)] == 1)) {
        out[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Tensor reshape_impl(const Tensor& x, const Shape& want, bool allow_copy, const char* op) {
  ops::check_defined(x, op, "x");
  Shape s = infer_shape(want, x.numel(), x.shape(), op);
  std::optional<Shape> st = view_strides(x.shape(), x.strides(), s);
  Tensor out;
  if (st) {
    out = make_view(x, s, *st, x.offset(), op);
  } else {
    CF_CHECK(allow_copy, ShapeError, "[", op, "] cannot view ", x.describe(), " with strides ",
             shape_str(x.strides()), " as ", shape_str(s), "; use reshape (which copies)");
    Tensor c = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::copy(x, c);
    out = make_view(c, s, contiguous_strides(s), 0, op);
  }
  if (autograd::any_requires_grad({&x})) {
    Shape xs = x.shape();
    autograd::record(opname::reshape, {x}, out, [xs](const Tensor& g) -> std::vector<Tensor> {
      return {reshape(g, xs)};
    });
  }
  return out;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, true, opname::reshape); }
Tensor view(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, false, "view"); }

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  ops::check_defined(x, "flatten", "x");
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = normalize_axis(start, x.dim(), "flatten"), e = normalize_axis(end, x.dim(), "flatten");
  CF_CHECK(s <= e, IndexError, "[flatten] start axis ", start, " is after end axis ", end);
  Shape ns(x.shape().begin(), x.shape().begin() + s);
  int64_t m = 1;
  for (int64_t d = s; d <= e; ++d) m *= x.shape()[size_t(d)];
  ns.push_back(m);
  ns.insert(ns.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, ns);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& axes) {
  ops::check_defined(x, opname::permute, "x");
  CF_CHECK(int64_t(axes.size()) == x.dim(), IndexError, "[permute] got ", axes.size(),
           " axes for a tensor of ", x.dim(), " dimensions");
  std::vector<int64_t> perm(axes.size()), inv(axes.size());
  std::vector<bool> seen(axes.size(), false);
  Shape shape(axes.size()), strides(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = normalize_axis(axes[i], x.dim(), opname::permute);
    CF_CHECK(!seen[size_t(a)], IndexError, "[permute] axis ", a, " repeated in the permutation");
    seen[size_t(a)] = true;
    perm[i] = a;
    inv[size_t(a)] = int64_t(i);
    shape[i] = x.shape()[size_t(a)];
    strides[i] = x.strides()[size_t(a)];
  }
  Tensor out = make_view(x, shape, strides, x.offset(), opname::permute);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(opname::permute, {x}, out, [inv](const Tensor& g) -> std::vector<Tensor> {
      return {permute(g, inv)};
    });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t a0, int64_t a1) {
  ops::check_defined(x, "transpose", "x");
  std::vector<int64_t> perm(size_t(x.dim()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
  const int64_t b0 = normalize_axis(a0, x.dim(), "transpose"), b1 = normalize_axis(a1, x.dim(), "transpose");
  // A 0-d tensor takes axis 0 or -1, as in PyTorch, and is its own transpose (perm is empty).
  if (x.dim() > 0) std::swap(perm[size_t(b0)], perm[size_t(b1)]);
  return permute(x, perm);
}

namespace {
Tensor slice_view(const Tensor& x, int64_t a, int64_t start, int64_t len, int64_t step) {
  Shape shape = x.shape(), strides = x.strides();
  int64_t offset = x.offset() + start * strides[size_t(a)];
  shape[size_t(a)] = len;
  if (len > 1) strides[size_t(a)] *= step;  // one element needs no stride (stride * 2^62 overflowed)
  Tensor out = make_view(x, shape, strides, offset, opname::slice);
  if (autograd::any_requires_grad({&x})) {
    Shape xs = x.shape();
    autograd::record(opname::slice, {x}, out, [xs, a, start, len, step](const Tensor& g) -> std::vector<Tensor> {
      Tensor gx = ops::filled(xs, 0.0, g.dtype(), g.device());
      kernels::copy(g, slice_view(gx, a, start, len, step));
      return {gx};
    });
  }
  return out;
}
}  // namespace

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  ops::check_defined(x, opname::slice, "x");
  CF_CHECK(x.dim() > 0, ShapeError, "[slice] cannot slice a 0-d tensor");
  CF_CHECK(step > 0, ValueError, "[slice] step must be positive, got ", step);
  int64_t a = normalize_axis(axis, x.dim(), opname::slice);
  int64_t n = x.shape()[size_t(a)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  return slice_view(x, a, start, end > start ? (end - start - 1) / step + 1 : 0, step);  // no overflow for any step
}

Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length) {
  ops::check_defined(x, "narrow", "x");
  CF_CHECK(x.dim() > 0, ShapeError, "[narrow] cannot narrow a 0-d tensor");
  int64_t a = normalize_axis(axis, x.dim(), "narrow");
  int64_t n = x.shape()[size_t(a)];
  // length <= n - start, not start + length <= n: that sum overflows for a start near 2^63
  CF_CHECK(start >= 0 && length >= 0 && start <= n && length <= n - start, IndexError, "[narrow] start ", start,
           " with length ", length, " is out of bounds for axis ", a, " of size ", n, " in ", x.describe());
  return slice_view(x, a, start, length, 1);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  ops::check_defined(x, opname::expand, "x");
  CF_CHECK(shape.size() >= size_t(x.dim()), ShapeError, "[expand] cannot expand ",
           shape_str(x.shape()), " to fewer dimensions ", shape_str(shape));
  size_t lead = shape.size() - size_t(x.dim());
  Shape out_shape(shape.size()), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      CF_CHECK(shape[i] >= 0, ShapeError, "[expand] new leading axis cannot be -1 in ", shape_str(shape));
      out_shape[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    int64_t have = x.shape()[i - lead];
    int64_t want = shape[i] == -1 ? have : shape[i];
    CF_CHECK(want >= 0, ShapeError, "[expand] negative size in ", shape_str(shape));
    CF_CHECK(have == want || have == 1, ShapeError, "[expand] cannot expand ", shape_str(x.shape()),
             " to ", shape_str(shape));
    out_shape[i] = want;
    strides[i] = have == want ? x.strides()[i - lead] : 0;
  }
  Tensor out = make_view(x, out_shape, strides, x.offset(), opname::expand);
  if (autograd::any_requires_grad({&x})) {
    Shape xs = x.shape();
    autograd::record(opname::expand, {x}, out, [xs](const Tensor& g) -> std::vector<Tensor> {
      return {sum_to(g, xs)};
    });
  }
  return out;
}

Tensor squeeze(const Tensor& x) {
  ops::check_defined(x, "squeeze", "x");
  Shape s;
  for (int64_t d : x.shape())
    if (d != 1) s.push_back(d);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  ops::check_defined(x, "squeeze", "x");
  int64_t a = normalize_axis(axis, x.dim(), "squeeze");
  if (x.dim() == 0) return x;
  CF_CHECK(x.shape()[size_t(a)] == 1, ShapeError, "[squeeze] axis ", axis, " has size ",
           x.shape()[size_t(a)], ", not 1, in ", x.describe());
  Shape s = x.shape();
  s.erase(s.begin() + a);
  return reshape(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  ops::check_defined(x, "unsqueeze", "x");
  // The new axis is one of the result's x.dim() + 1 (the shared check would name that rank as x's).
  const int64_t lim = x.dim() + 1;
  CF_CHECK(axis >= -lim && axis < lim, IndexError, "[unsqueeze] axis ", axis, " is out of range for ",
           x.describe(), ": the new axis is in [", -lim, ", ", lim - 1, "]");
  int64_t a = normalize_axis(axis, lim, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return reshape(x, s);
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes) {
  ops::check_defined(x, "flip", "x");
  if (axes.empty()) return clone(x);
  Tensor out = x;
  bool copied = false;
  for (int64_t a : ops::normalize_axes(axes, x.dim(), "flip")) {
    const int64_t n = x.shape()[size_t(a)];
    if (n <= 1) continue;
    // positions n-1, ..., 0, made on x's device
    Tensor reversed = add(mul(Tensor::arange(n, kInt64, x.device()), -1.0), double(n - 1));
    out = index_select(out, a, reversed);
    copied = true;
  }
  return copied ? out : clone(x);  // always a new tensor, as torch.flip
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& axes) {
  ops::check_defined(x, "roll", "x");
  if (axes.empty()) {
    CF_CHECK(shifts.size() == 1, ValueError, "[roll] without axes takes one shift (x is rolled flattened), got ",
             shifts.size());
    return reshape(roll(reshape(x, {-1}), shifts, {0}), x.shape());
  }
  CF_CHECK(shifts.size() == axes.size(), ValueError, "[roll] needs one shift per axis, got ", shifts.size(),
           " shifts for ", axes.size(), " axes");
  CF_CHECK(x.dim() > 0, ShapeError, "[roll] cannot roll a 0-d tensor along an axis");
  Tensor out = x;
  bool copied = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = normalize_axis(axes[i], x.dim(), "roll");
    const int64_t n = x.shape()[size_t(a)];
    if (n == 0) continue;
    const int64_t s = ((shifts[i] % n) + n) % n;  // in [0, n)
    if (s == 0) continue;
    out = cat({narrow(out, a, n - s, s), narrow(out, a, 0, n - s)}, a);
    copied = true;
  }
  return copied ? out : clone(x);
}

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  ops::check_defined(x, "repeat", "x");
  const int64_t k = int64_t(repeats.size()), d = x.dim();
  CF_CHECK(k >= d, ShapeError, "[repeat] needs at least one count per axis of ", x.describe(), ", got ", k);
  for (int64_t r : repeats) CF_CHECK(r >= 0, ValueError, "[repeat] counts must be >= 0, got ", r);
  // (1, s0, 1, s1, ...) expanded to (r0, s0, r1, s1, ...), then merged pairwise: each copy of x
  // along axis i is contiguous in the result, as tiling puts them
  Shape inter, expanded, result;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t s = i < k - d ? 1 : x.shape()[size_t(i - (k - d))];
    inter.push_back(1);
    inter.push_back(s);
    expanded.push_back(repeats[size_t(i)]);
    expanded.push_back(s);
    result.push_back(repeats[size_t(i)] * s);
  }
  return reshape(clone(expand(reshape(x, inter), expanded)), result);  // (clone: never a view of x)
}

}  // namespace cf
