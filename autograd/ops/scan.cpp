#include "autograd/ops/scan.h"

#include "autograd/autocast.h"
#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/shape.h"
#include "kernels/scan/scan.h"

namespace cf {

namespace {

// The running sum of x along axis (already normalised), forward or reverse; the two are each
// other's gradient, so one node serves both directions (and their double backward).
Tensor scan_sum(const Tensor& x0, int64_t axis, bool reverse) {
  Tensor x = contiguous(x0).detach();
  kernels::ScanGeom g;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t s = x.shape()[size_t(d)];
    if (d < axis) g.outer *= s;
    else if (d == axis) g.n = s;
    else g.inner *= s;
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) kernels::cumsum(x, out, g, reverse);
  if (autograd::any_requires_grad({&x0})) {
    autograd::record(opname::cumsum, {x0}, out, [axis, reverse](const Tensor& grad) -> std::vector<Tensor> {
      return {scan_sum(grad, axis, !reverse)};
    });
  }
  return out;
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t axis) {
  ops::check_defined(x, opname::cumsum, "x");
  if (autocast_dtype() && is_low_precision(x.dtype())) return cumsum(autocast::to_float32(x), axis);
  if (x.dtype() == kBool) return cumsum(to(x, kInt64), axis);  // a running count, as torch
  if (x.dim() == 0) {
    CF_CHECK(axis == 0 || axis == -1, IndexError, "[cumsum] axis ", axis, " is out of range for ", x.describe());
    return reshape(cumsum(reshape(x, {1}), 0), {});
  }
  return scan_sum(x, normalize_axis(axis, x.dim(), opname::cumsum), false);
}

}  // namespace cf
