#include "autograd/ops/point.h"

#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "kernels/index/index.h"
#include "kernels/point/point.h"
#include "kernels/sort/sort.h"

namespace cf {

Tensor farthest_point_sampling(const Tensor& points, int64_t m, const Tensor& mask) {
  const char* op = opname::farthest_point_sampling;
  ops::check_defined(points, op, "points");
  CF_CHECK(points.dim() == 3 && is_floating(points.dtype()), ShapeError, "[", op,
           "] points must be a float (B, N, C) tensor, got ", points.describe());
  const int64_t b = points.shape()[0], n = points.shape()[1];
  CF_CHECK(m >= 1 && m <= n, ValueError, "[", op, "] m must be in [1, N] = [1, ", n, "], got ", m);
  if (mask.defined()) {
    CF_CHECK(mask.dtype() == kBool, DTypeError, "[", op, "] mask must be bool (true = padding), got ", mask.dtype());
    CF_CHECK(mask.dim() == 2 && mask.shape()[0] == b && mask.shape()[1] == n, ShapeError, "[", op,
             "] mask must be (B, N) = (", b, ", ", n, "), got ", shape_str(mask.shape()));
    ops::check_same_device(op, {&points, &mask});
  }
  Tensor p = contiguous(to(points.detach(), kFloat64));
  Tensor out = Tensor::empty({b, m}, kInt64, points.device());
  kernels::farthest_point_sampling(p, mask.defined() ? contiguous(mask) : Tensor(), out);
  return out;
}

Tensor group_max(const Tensor& src, const Tensor& group, int64_t groups) {
  const char* op = opname::group_max;
  ops::check_defined(src, op, "src");
  ops::check_defined(group, op, "group");
  ops::check_same_device(op, {&src, &group});
  CF_CHECK(is_floating(src.dtype()), DTypeError, "[", op, "] src must be a float tensor, got ", src.describe());
  // 16-bit src (cf-pointcloud --precision bf16): the maxima of a float32 copy are its own
  // elements, so rounding them back is exact.
  if (is_low_precision(src.dtype())) return to(group_max(to(src.detach(), kFloat32), group, groups), src.dtype());
  CF_CHECK(group.dtype() == kInt64 && group.shape() == src.shape() && src.dim() >= 1, ShapeError, "[", op,
           "] group must be int64 of src's shape (..., E), got src ", src.describe(), ", group ", group.describe());
  CF_CHECK(groups >= 1, ValueError, "[", op, "] groups must be >= 1, got ", groups);
  Tensor g = contiguous(group);
  kernels::check_index_range(op, g, groups, [op, groups](int64_t at, int64_t value) {
    throw IndexError(str("[", op, "] group value ", value, " at flat position ", at, " is out of range for ",
                         groups, " groups"));
  });
  const int64_t e = src.shape()[size_t(src.dim() - 1)], rows = e == 0 ? 0 : src.numel() / e;
  Tensor out = Tensor::empty(src.shape(), src.dtype(), src.device());
  // Row views of contiguous tensors: the kernel writes through them into out.
  const Tensor src_rows = reshape(contiguous(src.detach()), {rows, e}), g_rows = reshape(g, {rows, e}),
               out_rows = reshape(out, {rows, e});
  // The table of maxima while it is at most 4 entries per element (centroid attention: N groups over
  // M K entries); beyond, a sort costs less than filling and reading groups that hold nothing.
  if (groups <= 4 * e || rows == 0) {
    kernels::group_max(src_rows, g_rows, groups, out_rows);
    return out;
  }
  // Many more groups than entries (ids may be sparse up to 2^62): each row's ids sorted (stably, on the
  // tensors' device) instead of a table of every group's maximum.
  Tensor keys = Tensor::empty({rows, e}, kInt64, src.device()), perm = Tensor::empty({rows, e}, kInt64, src.device());
  kernels::sort(op, g_rows, 1, e, false, keys, perm);
  kernels::group_max_sorted(src_rows, keys, perm, out_rows);
  return out;
}

}  // namespace cf
