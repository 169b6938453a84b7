// Sorting ops: sort, argsort, topk, and searchsorted (kernels/sort/searchsorted.h). Values are differentiable (the gradient goes back
// to the positions the values came from); indices never are. Order and NaN rules are
// in kernels/sort/sort.h: stable, NaN is the largest value (as NumPy).
#include "autograd/ops/sort.h"

#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/sort/searchsorted.h"
#include "kernels/sort/sort.h"

namespace cf {

using autograd::SavedTensor;

namespace {

struct SortPlan {
  Tensor x1;       // x, or a (1) view of a 0-d x, so the kernel always has an axis
  int64_t axis = 0;
  int64_t len = 0;  // length of the sorted axis
};

SortPlan plan_sort(const Tensor& x, int64_t axis, const char* op) {
  ops::check_defined(x, op, "x");
  CF_CHECK(x.dtype() != kBool, DTypeError, "[", op, "] is not defined for bool tensors: ",
           x.describe());
  // Fail with this op's name before allocating outputs on a device the build lacks.
  CF_DEVICE_CHECK(op, x.device());
  SortPlan p;
  p.axis = normalize_axis(axis, x.dim(), op);
  p.x1 = x.dim() == 0 ? make_view(x, {1}, {1}, x.offset()) : x;
  p.len = p.x1.size(p.axis);
  return p;
}

// Runs the kernel for the first k of each line; outputs have x's rank (0-d stays 0-d).
ValuesIndices run_sort(const char* op, const Tensor& x, const SortPlan& p, int64_t k,
                       bool descending, bool want_values) {
  Shape os = p.x1.shape();
  os[size_t(p.axis)] = k;
  ValuesIndices r;
  if (want_values) r.values = Tensor::empty(os, x.dtype(), x.device());
  r.indices = Tensor::empty(os, kInt64, x.device());
  kernels::sort(op, p.x1, p.axis, k, descending, r.values, r.indices);
  if (x.dim() == 0) {
    if (want_values) r.values = make_view(r.values, {}, {}, r.values.offset());
    r.indices = make_view(r.indices, {}, {}, r.indices.offset());
  }
  return r;
}

// Record `name` on r.values: the gradient scatters back to where each value came from.
void record_values(const char* name, const Tensor& x, int64_t axis, ValuesIndices& r) {
  if (!autograd::any_requires_grad({&x})) return;
  SavedTensor si(r.indices);
  Shape xs = x.shape();
  autograd::record(name, {x}, r.values, [si, xs, axis, name](const Tensor& g) -> std::vector<Tensor> {
    if (xs.empty()) return {g};  // a 0-d input is its own sort
    Tensor z = Tensor::empty(xs, g.dtype(), g.device());
    kernels::fill(z, 0.0);
    return {scatter_add(z, axis, si.unpack(name), g)};
  });
}

}  // namespace

ValuesIndices sort(const Tensor& x, int64_t axis, bool descending) {
  SortPlan p = plan_sort(x, axis, opname::sort);
  ValuesIndices r = run_sort(opname::sort, x, p, p.len, descending, true);
  record_values(opname::sort, x, p.axis, r);
  return r;
}

Tensor argsort(const Tensor& x, int64_t axis, bool descending) {
  SortPlan p = plan_sort(x, axis, opname::argsort);
  return run_sort(opname::argsort, x, p, p.len, descending, false).indices;  // never differentiable
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t axis, bool largest) {
  SortPlan p = plan_sort(x, axis, opname::topk);
  CF_CHECK(k >= 0 && k <= p.len, ValueError, "[topk] k = ", k, " is out of range for axis ", p.axis,
           " of length ", p.len, " in ", x.describe());
  // The k largest in descending order are the head of a descending sort (ties: lower
  // index first); the k smallest, of an ascending one.
  ValuesIndices r = run_sort(opname::topk, x, p, k, largest, true);
  record_values(opname::topk, x, p.axis, r);
  return r;
}

Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right) {
  const char* op = opname::searchsorted;
  ops::check_defined(sorted, op, "sorted");
  ops::check_defined(values, op, "values");
  ops::check_same_device(op, {&sorted, &values});
  for (const Tensor* t : {&sorted, &values})
    CF_CHECK(t->dtype() != kBool, DTypeError, "[searchsorted] is not defined for bool tensors: ", t->describe());
  CF_CHECK(sorted.dim() >= 1, ShapeError, "[searchsorted] sorted must have at least one dimension, got ",
           sorted.describe());
  CF_DEVICE_CHECK(op, values.device());
  kernels::SearchGeom g;
  g.m = sorted.shape().back();
  if (sorted.dim() == 1) {
    g.k = values.numel();
  } else {
    bool same = values.dim() == sorted.dim();
    for (int64_t d = 0; same && d + 1 < sorted.dim(); ++d) same = values.shape()[size_t(d)] == sorted.shape()[size_t(d)];
    CF_CHECK(same, ShapeError, "[searchsorted] values ", values.describe(), " must have the leading dimensions of sorted ",
             sorted.describe(), " (or sorted must be 1-d)");
    g.rows = 1;
    for (int64_t d = 0; d + 1 < sorted.dim(); ++d) g.rows *= sorted.shape()[size_t(d)];
    g.k = values.shape().back();
  }
  Tensor s = sorted.detach(), v = values.detach();
  if (s.dtype() != v.dtype()) {  // one dtype for the search (see sort.h)
    const bool fs = is_floating(s.dtype()), fv = is_floating(v.dtype());
    const DType common = fs == fv ? promote_types(s.dtype(), v.dtype()) : kFloat64;
    s = to(s, common);
    v = to(v, common);
  }
  Tensor out = Tensor::empty(values.shape(), kInt64, values.device());
  if (out.numel() > 0) kernels::searchsorted(contiguous(s), contiguous(v), out, g, right);
  return out;
}

}  // namespace cf
