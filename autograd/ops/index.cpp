// Indexing ops: validation, output allocation, kernel call and backward.
// index_select / index_add / take_along_dim run the gather and scatter_add kernels
// on stride-0 (broadcast) views of their index, so there are only two data paths.
// Index values are range-checked before any kernel runs (no negative indices).
#include "autograd/ops/index.h"

#include <cmath>

#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/index/index.h"

namespace cf {

using autograd::SavedTensor;

namespace {

// Indexing needs an axis to index along, so 0-d inputs are refused.
int64_t index_axis(const Tensor& x, int64_t axis, const char* op) {
  CF_CHECK(x.dim() >= 1, ShapeError, "[", op, "] needs x with at least one dimension, got ",
           x.describe());
  return normalize_axis(axis, x.dim(), op);
}

// "(1,2)": the coordinates of a row-major position in `shape`.
std::string coords(const Shape& shape, int64_t pos) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = pos % shape[d];
    pos /= shape[d];
  }
  return shape_str(c);
}

// On CUDA a deferred check: the error is thrown at the next host read (core/cuda.h).
void check_index_values(const char* op, const Tensor& index, int64_t axis, int64_t len) {
  if (ops::indices_known_good()) return;
  kernels::check_index_range(op, index, len, [op, axis, len, shape = index.shape()](int64_t at, int64_t value) {
    throw IndexError(str("[", op, "] index ", value, " is out of range for axis ", axis, " of length ", len, " (at ",
                         coords(shape, at), " of index ", shape_str(shape), "; valid indices are 0..", len - 1,
                         ")"));
  });
}

void check_index_tensor(const char* op, const Tensor& index) {
  ops::check_dtype(index, kInt64, op, "index");
}

void check_numeric(const Tensor& x, const char* op) {
  CF_CHECK(x.dtype() != kBool, DTypeError, "[", op, "] is not defined for bool tensors: ",
           x.describe());
}

Tensor zeros_as(const Shape& shape, const Tensor& like) {
  return ops::filled(shape, 0.0, like.dtype(), like.device());
}

// A fresh contiguous copy of x: the output of the accumulating ops.
Tensor copy_of(const Tensor& x) {
  Tensor t = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::copy(x, t);
  return t;
}

// The 1-d `index` seen at `shape`: stride 0 everywhere but `axis`.
Tensor spread_index(const Tensor& index, const Shape& shape, int64_t axis) {
  Shape st(shape.size(), 0);
  st[size_t(axis)] = index.strides()[0];
  return make_view(index, shape, st, index.offset());
}

// t seen at `shape` (same rank, t's size 1 broadcast where shape is larger).
Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  Shape st = t.strides();
  for (size_t d = 0; d < shape.size(); ++d)
    if (t.shape()[d] != shape[d]) st[d] = 0;
  return make_view(t, shape, st, t.offset());
}

// g (a leading block's worth) placed at the start of a zero tensor of `shape`: the
// gradient of a src that is larger than its index on some axes.
Tensor pad_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor z = zeros_as(shape, g);
  kernels::copy(g, make_view(z, g.shape(), z.strides(), z.offset()));
  return z;
}

}  // namespace

Tensor gather(const Tensor& x, int64_t axis, const Tensor& index) {
  const char* op = opname::gather;
  ops::check_defined(x, op, "x");
  ops::check_defined(index, op, "index");
  ops::check_same_device(op, {&x, &index});
  check_index_tensor(op, index);
  int64_t a = index_axis(x, axis, op);
  CF_CHECK(index.dim() == x.dim(), ShapeError, "[gather] index ", shape_str(index.shape()),
           " must have as many dimensions as x ", shape_str(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    CF_CHECK(d == a || index.size(d) <= x.size(d), ShapeError, "[gather] index ",
             shape_str(index.shape()), " is larger than x ", shape_str(x.shape()), " on axis ", d,
             " (only the gathered axis ", a, " may be larger)");
  check_index_values(op, index, a, x.size(a));
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  kernels::gather(x, a, index, out);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor si(index);
    Shape xs = x.shape();
    autograd::record(op, {x}, out, [si, xs, a](const Tensor& g) -> std::vector<Tensor> {
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      return {ops::scatter_add_to_zeros(xs, a, si.unpack(opname::gather), g)};
    });
  }
  return out;
}

namespace {

// scatter and scatter_add's arguments: x, index and src of one rank, index no larger than src on any
// axis nor than x off the scattered axis, index values in range. Returns the scattered axis.
int64_t check_scatter(const char* op, const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src,
                      bool numeric) {
  ops::check_defined(x, op, "x");
  ops::check_defined(index, op, "index");
  ops::check_defined(src, op, "src");
  ops::check_same_device(op, {&x, &index, &src});
  check_index_tensor(op, index);
  ops::check_same_dtype(op, {&x, &src});
  if (numeric) check_numeric(x, op);
  int64_t a = index_axis(x, axis, op);
  CF_CHECK(index.dim() == x.dim() && src.dim() == x.dim(), ShapeError, "[", op, "] x ", shape_str(x.shape()),
           ", index ", shape_str(index.shape()), " and src ", shape_str(src.shape()),
           " must have the same number of dimensions");
  for (int64_t d = 0; d < x.dim(); ++d) {
    CF_CHECK(index.size(d) <= src.size(d), ShapeError, "[", op, "] index ", shape_str(index.shape()),
             " is larger than src ", shape_str(src.shape()), " on axis ", d);
    CF_CHECK(d == a || index.size(d) <= x.size(d), ShapeError, "[", op, "] index ", shape_str(index.shape()),
             " is larger than x ", shape_str(x.shape()), " on axis ", d, " (only the scattered axis ", a,
             " may be larger)");
  }
  check_index_values(op, index, a, x.size(a));
  return a;
}

// For scatter's backward: true where src's element (at index's shape) is the one its output position keeps,
// the last of the elements sent there in ascending position along the axis. The positions j along the axis
// are scattered the same way; an element won where its own j came back.
Tensor scatter_winners(const Shape& out_shape, int64_t a, const Tensor& index) {
  const Device dev = index.device();
  Tensor last = ops::filled(out_shape, -1.0, kInt64, dev);
  const Tensor j = spread_index(Tensor::arange(index.size(a), kInt64, dev), index.shape(), a);
  kernels::scatter(last, a, index, j, kernels::ScatterMode::Assign);
  Tensor kept = Tensor::empty(index.shape(), kInt64, dev);
  kernels::gather(last, a, index, kept);
  return eq(kept, j);
}

}  // namespace

Tensor scatter(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  const char* op = opname::scatter;
  const int64_t a = check_scatter(op, x, axis, index, src, /*numeric=*/false);
  Tensor out = copy_of(x);
  kernels::scatter(out, a, index, src, kernels::ScatterMode::Assign);
  if (autograd::any_requires_grad({&x, &src})) {
    bool need_x = x.requires_grad(), need_src = src.requires_grad();
    SavedTensor si(index);
    Shape xs = x.shape(), ss = src.shape();
    autograd::record(op, {x, src}, out, [si, xs, ss, a, need_x, need_src](const Tensor& g) -> std::vector<Tensor> {
      const Tensor index = si.unpack(opname::scatter);
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      Tensor gx, gs;
      // x's elements that were overwritten get no gradient; of several src elements sent to one position,
      // only the one kept (the last) gets it
      if (need_x) gx = scatter(g, a, index, ops::filled(index.shape(), 0.0, g.dtype(), g.device()));
      if (need_src) {
        const Tensor picked = gather(g, a, index);
        gs = pad_to(where(scatter_winners(xs, a, index), picked, 0.0), ss);
      }
      return {gx, gs};
    });
  }
  return out;
}

namespace {
// scatter_add, into a copy of x, or into x itself when the caller made it (fresh zeros: no copy).
Tensor scatter_add_impl(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src, bool x_is_fresh) {
  const char* op = opname::scatter_add;
  const int64_t a = check_scatter(op, x, axis, index, src, /*numeric=*/true);
  Tensor out = x_is_fresh ? x : copy_of(x);
  kernels::scatter_add(out, a, index, src);
  if (autograd::any_requires_grad({&x, &src})) {
    bool need_x = x.requires_grad(), need_src = src.requires_grad();
    SavedTensor si(index);
    Shape ss = src.shape();
    autograd::record(op, {x, src}, out,
                     [si, ss, a, need_x, need_src](const Tensor& g) -> std::vector<Tensor> {
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      Tensor gs;
      if (need_src) gs = pad_to(gather(g, a, si.unpack(opname::scatter_add)), ss);
      return {need_x ? g : Tensor(), gs};
    });
  }
  return out;
}
}  // namespace

Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  return scatter_add_impl(x, axis, index, src, /*x_is_fresh=*/false);
}

Tensor ops::scatter_add_to_zeros(const Shape& shape, int64_t axis, const Tensor& index, const Tensor& src) {
  ops::check_defined(src, opname::scatter_add, "src");
  return scatter_add_impl(zeros_as(shape, src), axis, index, src, /*x_is_fresh=*/true);
}

namespace {
// index or src of an in-place scatter, read from a copy when it shares any of x's memory, the very same view
// too (ops::inplace_source keeps that one for elementwise writes, where each element is read before it is
// written; a scatter writes positions that later steps read).
Tensor scatter_operand(const Tensor& x, const Tensor& t) {
  if (t.numel() > 0 && t.device() == x.device() && t.raw_data() == x.raw_data()) {
    NoGradGuard ng;
    return clone(t);
  }
  return ops::inplace_source(x, t);
}

Tensor& scatter_in_place(Tensor& x, int64_t axis, const Tensor& index, const Tensor& src, kernels::ScatterMode mode,
                         const char* op) {
  ops::check_inplace(x, op);
  const int64_t a = check_scatter(op, x, axis, index, src, /*numeric=*/mode == kernels::ScatterMode::Add);
  ops::check_inplace_source(src, op);
  ops::check_no_internal_overlap(x, op);  // (an expand() view: one element, several positions)
  if (mode == kernels::ScatterMode::Add && is_low_precision(x.dtype())) {
    // float32 sums rounded once per element, as scatter_add (whose kernel converts its whole output): the sums
    // in a float32 scratch of x's shape (O(x)), then each target written once with round(x + its sum), so x's
    // other elements are not rewritten (a signalling NaN there stays one)
    NoGradGuard g;
    const Tensor ix = scatter_operand(x, index);
    const Tensor sums = scatter_add(ops::filled(x.shape(), 0.0, kFloat32, x.device()), a, ix,
                                    to(scatter_operand(x, src), kFloat32));
    const Tensor updated = to(to(gather(x.detach(), a, ix), kFloat32) + gather(sums, a, ix), x.dtype());
    kernels::scatter(x, a, ix, updated, kernels::ScatterMode::Assign);
  } else {
    kernels::scatter(x, a, scatter_operand(x, index), scatter_operand(x, src), mode);
  }
  x.bump_version();
  return x;
}
}  // namespace

Tensor& scatter_(Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  return scatter_in_place(x, axis, index, src, kernels::ScatterMode::Assign, "scatter_");
}

Tensor& scatter_add_(Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  return scatter_in_place(x, axis, index, src, kernels::ScatterMode::Add, "scatter_add_");
}

Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index) {
  const char* op = opname::index_select;
  ops::check_defined(x, op, "x");
  ops::check_defined(index, op, "index");
  ops::check_same_device(op, {&x, &index});
  check_index_tensor(op, index);
  int64_t a = index_axis(x, axis, op);
  CF_CHECK(index.dim() == 1, ShapeError, "[index_select] index must be 1-d, got shape ",
           shape_str(index.shape()));
  check_index_values(op, index, a, x.size(a));
  Shape os = x.shape();
  os[size_t(a)] = index.size(0);
  Tensor out = Tensor::empty(os, x.dtype(), x.device());
  kernels::gather(x, a, spread_index(index, os, a), out);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor si(index);
    Shape xs = x.shape();
    autograd::record(op, {x}, out, [si, xs, a](const Tensor& g) -> std::vector<Tensor> {
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      return {ops::scatter_add_to_zeros(xs, a, spread_index(si.unpack(opname::index_select), g.shape(), a), g)};
    });
  }
  return out;
}

Tensor index_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  const char* op = opname::index_add;
  ops::check_defined(x, op, "x");
  ops::check_defined(index, op, "index");
  ops::check_defined(src, op, "src");
  ops::check_same_device(op, {&x, &index, &src});
  check_index_tensor(op, index);
  ops::check_same_dtype(op, {&x, &src});
  check_numeric(x, op);
  int64_t a = index_axis(x, axis, op);
  CF_CHECK(index.dim() == 1, ShapeError, "[index_add] index must be 1-d, got shape ",
           shape_str(index.shape()));
  Shape want = x.shape();
  want[size_t(a)] = index.size(0);
  CF_CHECK(src.shape() == want, ShapeError, "[index_add] src ", shape_str(src.shape()),
           " must have shape ", shape_str(want), " (x ", shape_str(x.shape()), " with axis ", a,
           " of length len(index) = ", index.size(0), ")");
  check_index_values(op, index, a, x.size(a));
  Tensor out = copy_of(x);
  kernels::scatter_add(out, a, spread_index(index, want, a), src);
  if (autograd::any_requires_grad({&x, &src})) {
    bool need_x = x.requires_grad(), need_src = src.requires_grad();
    SavedTensor si(index);
    autograd::record(op, {x, src}, out,
                     [si, a, need_x, need_src](const Tensor& g) -> std::vector<Tensor> {
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      Tensor gs;
      if (need_src) gs = index_select(g, a, si.unpack(opname::index_add));
      return {need_x ? g : Tensor(), gs};
    });
  }
  return out;
}

Tensor take_along_dim(const Tensor& x, const Tensor& index, int64_t axis) {
  const char* op = opname::take_along_dim;
  ops::check_defined(x, op, "x");
  ops::check_defined(index, op, "index");
  ops::check_same_device(op, {&x, &index});
  check_index_tensor(op, index);
  int64_t a = index_axis(x, axis, op);
  CF_CHECK(index.dim() == x.dim(), ShapeError, "[take_along_dim] index ", shape_str(index.shape()),
           " must have as many dimensions as x ", shape_str(x.shape()));
  // Broadcast the non-axis dimensions (NumPy rules, same rank): xb and ib differ only on `a`.
  Shape xb = x.shape(), ib = index.shape();
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == a) continue;
    int64_t xd = x.size(d), id = index.size(d);
    CF_CHECK(xd == id || xd == 1 || id == 1, ShapeError, "[take_along_dim] index ",
             shape_str(index.shape()), " and x ", shape_str(x.shape()),
             " cannot be broadcast on axis ", d);
    xb[size_t(d)] = ib[size_t(d)] = xd == 1 ? id : xd;
  }
  check_index_values(op, index, a, x.size(a));
  Tensor iv = broadcast_view(index, ib);
  Tensor out = Tensor::empty(ib, x.dtype(), x.device());
  kernels::gather(broadcast_view(x, xb), a, iv, out);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor si(iv);
    Shape xs = x.shape();
    autograd::record(op, {x}, out, [si, xs, xb, a](const Tensor& g) -> std::vector<Tensor> {
      ops::KnownGoodIndices checked;  // (the index its forward checked: saved, version-checked)
      Tensor gx = ops::scatter_add_to_zeros(xb, a, si.unpack(opname::take_along_dim), g);
      return {xb == xs ? gx : sum_to(gx, xs)};
    });
  }
  return out;
}

namespace {
// The arguments of masked_fill and masked_fill_ (op: which of them, for the messages).
void check_masked_fill(const Tensor& x, const Tensor& mask, double value, const char* op) {
  ops::check_defined(x, op, "x");
  ops::check_defined(mask, op, "mask");
  ops::check_same_device(op, {&x, &mask});
  ops::check_dtype(mask, kBool, op, "mask");
  CF_CHECK(broadcast_shapes(x.shape(), mask.shape(), op) == x.shape(), ShapeError,
           "[", op, "] mask ", shape_str(mask.shape()), " cannot be broadcast to x ",
           shape_str(x.shape()));
  CF_CHECK(is_floating(x.dtype()) || std::isfinite(value), ValueError, "[", op, "] value ",
           value, " cannot be stored in ", x.describe());
  check_fill_value(x.dtype(), value, op);
  // Fail with this op's name before allocating or writing on a device the build lacks.
  CF_DEVICE_CHECK(op, x.device());
}
}  // namespace

Tensor& masked_fill_(Tensor& t, const Tensor& mask, double value) {
  ops::check_inplace(t, "masked_fill_");
  check_masked_fill(t, mask, value, "masked_fill_");
  ops::check_no_internal_overlap(t, "masked_fill_");  // (an expand() view: one element, several mask entries)
  // elementwise, each element read then written in place; a mask sharing t's memory is read from a copy
  kernels::masked_fill(t, ops::inplace_source(t, mask), value, t);
  t.bump_version();
  return t;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const char* op = opname::masked_fill;
  check_masked_fill(x, mask, value, op);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::masked_fill(x, mask, value, out);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sm(mask);
    autograd::record(op, {x}, out, [sm](const Tensor& g) -> std::vector<Tensor> {
      return {masked_fill(g, sm.unpack(opname::masked_fill), 0.0)};
    });
  }
  return out;
}

namespace {
thread_local bool t_known_good = false;
}  // namespace

ops::KnownGoodIndices::KnownGoodIndices() : saved_(t_known_good) { t_known_good = true; }
ops::KnownGoodIndices::~KnownGoodIndices() { t_known_good = saved_; }
bool ops::indices_known_good() { return t_known_good; }

void check_indices(const char* op, const Tensor& ids, int64_t limit, std::function<void(int64_t, int64_t)> raise,
                   std::optional<int64_t> allowed) {
  ops::check_defined(ids, op, "ids");
  ops::check_dtype(ids, kInt64, op, "ids");
  if (ops::indices_known_good()) return;
  const int64_t a = allowed.value_or(0);
  kernels::check_index_range(op, ids, limit, std::move(raise), allowed ? &a : nullptr);
}

void ring_append(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                 int64_t size_at, int64_t next_at) {
  const char* op = "ring_append";
  ops::check_defined(memory, op, "memory");
  ops::check_defined(counters, op, "counters");
  ops::check_defined(rows, op, "rows");
  ops::check_defined(keep, op, "keep");
  ops::check_same_device(op, {&memory, &counters, &rows, &keep});
  CF_CHECK(memory.dim() == 2 && memory.is_contiguous(), ShapeError, "[ring_append] memory must be contiguous (cap, d), got ",
           memory.describe());
  CF_CHECK(rows.dim() == 2 && rows.shape()[1] == memory.shape()[1] && rows.dtype() == memory.dtype(), ShapeError,
           "[ring_append] rows must be (n, ", memory.shape()[1], ") of memory's dtype ", memory.dtype(), ", got ",
           rows.describe());
  CF_CHECK(keep.dtype() == kBool && keep.dim() == 1 && keep.shape()[0] == rows.shape()[0], ShapeError,
           "[ring_append] keep must be bool (", rows.shape()[0], ",), got ", keep.describe());
  CF_CHECK(counters.dtype() == kInt64 && counters.dim() == 1 && counters.is_contiguous() && size_at >= 0 &&
               next_at >= 0 && size_at < counters.shape()[0] && next_at < counters.shape()[0] && size_at != next_at,
           ShapeError, "[ring_append] counters must be contiguous int64 (k,) holding the size at ", size_at,
           " and the next row at ", next_at, ", got ", counters.describe());
  CF_CHECK(rows.shape()[0] <= INT32_MAX, ValueError, "[ring_append] ", rows.shape()[0],
           " rows exceed the CUDA scan's limit (", INT32_MAX, ")");
  kernels::ring_append(memory, counters, contiguous(rows), contiguous(to(keep, kInt64)), kernels::RingSlots{size_at, next_at});
  memory.bump_version();
  counters.bump_version();
}

Tensor one_hot(const Tensor& labels, int64_t num_classes, DType dtype) {
  const char* op = opname::one_hot;
  ops::check_defined(labels, op, "labels");
  ops::check_dtype(labels, kInt64, op, "labels");
  CF_CHECK(num_classes >= 1, ValueError, "[one_hot] num_classes must be >= 1, got ", num_classes);
  kernels::check_index_range(op, labels, num_classes,
                             [num_classes, shape = labels.shape()](int64_t at, int64_t value) {
    throw IndexError(str("[one_hot] label ", value, " at ", coords(shape, at), " of labels ", shape_str(shape),
                         " is out of range for num_classes = ", num_classes, " (valid labels are 0..",
                         num_classes - 1, ")"));
  });
  Shape os = labels.shape();
  os.push_back(num_classes);
  Tensor out = Tensor::empty(os, dtype, labels.device());
  kernels::one_hot(labels, out);
  return out;  // never differentiable: no node
}

}  // namespace cf
