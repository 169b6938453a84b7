// Joining and splitting: cat, stack, pad copy their inputs into views of one new
// output (kernels::copy does the strided work); their backward hands each input
// the matching view of the gradient. split returns narrow() views (node "slice").
#include <algorithm>
#include <limits>
#include <string>

#include "autograd/op_names.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "kernels/elementwise/elementwise.h"

namespace cf {

namespace {

// View of t with `len` elements from `start` along axis a (no autograd).
Tensor band(const Tensor& t, int64_t a, int64_t start, int64_t len) {
  Shape shape = t.shape();
  shape[size_t(a)] = len;
  return make_view(t, shape, t.strides(), t.offset() + start * t.strides()[size_t(a)]);
}

// View of t at index i along axis a, that axis removed (no autograd).
Tensor select_view(const Tensor& t, int64_t a, int64_t i) {
  Shape shape = t.shape(), strides = t.strides();
  int64_t offset = t.offset() + i * strides[size_t(a)];
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  return make_view(t, shape, strides, offset);
}

// "float32 (2,3) on cpu, float32 (2,4) on cpu" for messages about a whole list.
std::string describe_all(const std::vector<Tensor>& xs) {
  std::string s;
  for (const Tensor& t : xs) s += (s.empty() ? "" : ", ") + t.describe();
  return s;
}

// Shared checks of cat and stack: a non-empty list of defined tensors of one
// dtype, device and rank.
void check_list(const std::vector<Tensor>& xs, const char* op) {
  CF_CHECK(!xs.empty(), ValueError, "[", op, "] needs at least one tensor, got an empty list");
  for (size_t i = 0; i < xs.size(); ++i)
    CF_CHECK(xs[i].defined(), ValueError, "[", op, "] tensor ", i, " of the list is undefined");
  const Tensor& f = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    CF_CHECK(xs[i].device() == f.device(), DeviceError, "[", op,
             "] tensors are on different devices: ", describe_all(xs));
    CF_CHECK(xs[i].dtype() == f.dtype(), DTypeError, "[", op, "] dtype mismatch: ",
             describe_all(xs), " (cast with cf::to)");
    CF_CHECK(xs[i].dim() == f.dim(), ShapeError, "[", op, "] tensors must have the same rank: ",
             describe_all(xs));
  }
}

// Floating tensors of different dtypes meet at their promoted dtype (differentiable casts), as in
// PyTorch's cat and stack: under autocast amax keeps bfloat16 while mean gives float32, and the
// point-cloud model's pooling concatenated the two. int64 and bool must still match exactly.
std::vector<Tensor> promote_floating(const std::vector<Tensor>& xs) {
  bool mixed = false;
  for (const Tensor& t : xs) {
    if (!t.defined() || !is_floating(t.dtype())) return xs;
    mixed = mixed || t.dtype() != xs[0].dtype();
  }
  if (!mixed) return xs;
  DType d = xs[0].dtype();
  for (const Tensor& t : xs) d = promote_types(d, t.dtype());
  std::vector<Tensor> out;
  for (const Tensor& t : xs) out.push_back(t.dtype() == d ? t : to(t, d));
  return out;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs_in, int64_t axis) {
  const std::vector<Tensor> xs = promote_floating(xs_in);
  check_list(xs, opname::cat);
  const Tensor& f = xs[0];
  CF_CHECK(f.dim() > 0, ShapeError, "[cat] cannot concatenate 0-d tensors: ", describe_all(xs),
           " (use stack)");
  const int64_t a = normalize_axis(axis, f.dim(), opname::cat);
  Shape shape = f.shape();
  shape[size_t(a)] = 0;
  for (const Tensor& t : xs) {
    for (int64_t d = 0; d < f.dim(); ++d)
      CF_CHECK(d == a || t.shape()[size_t(d)] == f.shape()[size_t(d)], ShapeError,
               "[cat] shapes differ outside axis ", a, ": ", describe_all(xs));
    // (four (2^62, 0) tensors wrapped to a (0, 0) result)
    shape[size_t(a)] = checked_add(shape[size_t(a)], t.shape()[size_t(a)], opname::cat, "the joined axis");
  }
  Tensor out = Tensor::empty(shape, f.dtype(), f.device());
  std::vector<int64_t> starts;
  int64_t pos = 0;
  for (const Tensor& t : xs) {
    starts.push_back(pos);
    kernels::copy(t, band(out, a, pos, t.shape()[size_t(a)]));
    pos += t.shape()[size_t(a)];
  }
  if (is_floating(f.dtype()) && autograd::any_requires_grad(xs)) {
    std::vector<int64_t> lens;
    for (const Tensor& t : xs) lens.push_back(t.shape()[size_t(a)]);
    autograd::record(opname::cat, xs, out, [a, starts, lens](const Tensor& g) -> std::vector<Tensor> {
      std::vector<Tensor> gs;
      for (size_t i = 0; i < starts.size(); ++i) gs.push_back(band(g, a, starts[i], lens[i]));
      return gs;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs_in, int64_t axis) {
  const std::vector<Tensor> xs = promote_floating(xs_in);
  check_list(xs, opname::stack);
  const Tensor& f = xs[0];
  const int64_t a = normalize_axis(axis, f.dim() + 1, opname::stack);
  for (const Tensor& t : xs)
    CF_CHECK(t.shape() == f.shape(), ShapeError, "[stack] all tensors must have the same shape: ",
             describe_all(xs));
  Shape shape = f.shape();
  shape.insert(shape.begin() + a, int64_t(xs.size()));
  Tensor out = Tensor::empty(shape, f.dtype(), f.device());
  for (size_t i = 0; i < xs.size(); ++i) kernels::copy(xs[i], select_view(out, a, int64_t(i)));
  if (is_floating(f.dtype()) && autograd::any_requires_grad(xs)) {
    const size_t n = xs.size();
    autograd::record(opname::stack, xs, out, [a, n](const Tensor& g) -> std::vector<Tensor> {
      std::vector<Tensor> gs;
      for (size_t i = 0; i < n; ++i) gs.push_back(select_view(g, a, int64_t(i)));
      return gs;
    });
  }
  return out;
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  ops::check_defined(x, opname::pad, "x");
  CF_CHECK(pads.size() % 2 == 0 && pads.size() / 2 <= size_t(x.dim()), ValueError,
           "[pad] pads must hold an even number of values, at most 2 per axis; got ", pads.size(),
           " for ", x.describe());
  // Per axis: the part of x that survives (negative pads crop) and where it lands.
  const size_t nd = size_t(x.dim());
  Shape out_shape = x.shape(), src_start(nd, 0), dst_start(nd, 0), len = x.shape();
  bool crops = false;
  for (size_t j = 0; j < pads.size() / 2; ++j) {
    const size_t d = nd - 1 - j;
    const int64_t before = pads[2 * j], after = pads[2 * j + 1], n = x.shape()[d];
    // n + before + after in checked arithmetic: pads near 2^63 wrapped to a small size, and the copy
    // then wrote before and past the output
    int64_t size = 0;
    CF_CHECK(!__builtin_add_overflow(n, before, &size) && !__builtin_add_overflow(size, after, &size) &&
                 before > std::numeric_limits<int64_t>::min() && after > std::numeric_limits<int64_t>::min(),
             ShapeError, "[pad] pads (", before, ", ", after, ") on axis ", d, " of size ", n,
             " overflow int64 for ", x.describe());
    out_shape[d] = size;
    CF_CHECK(out_shape[d] >= 0, ShapeError, "[pad] pads (", before, ", ", after, ") on axis ", d,
             " of size ", n, " would give a negative size ", out_shape[d], " for ", x.describe());
    src_start[d] = std::max<int64_t>(0, -before);
    dst_start[d] = std::max<int64_t>(0, before);
    len[d] = std::max<int64_t>(0, n - src_start[d] - std::max<int64_t>(0, -after));
    crops = crops || before < 0 || after < 0;
  }
  // The region of x that is kept, and where it sits in the output (both views).
  auto region = [](const Tensor& t, const Shape& start, const Shape& sizes) {
    int64_t off = t.offset();
    for (size_t d = 0; d < sizes.size(); ++d) off += start[d] * t.strides()[d];
    return make_view(t, sizes, t.strides(), off);
  };
  check_fill_value(x.dtype(), value, "pad");
  Tensor out = ops::filled(out_shape, value, x.dtype(), x.device());
  if (numel_of(len) > 0) kernels::copy(region(x, src_start, len), region(out, dst_start, len));
  if (autograd::any_requires_grad({&x})) {
    Shape xs = x.shape();
    autograd::record(opname::pad, {x}, out,
                     [xs, src_start, dst_start, len, crops, region](const Tensor& g)
                         -> std::vector<Tensor> {
      Tensor kept = region(g, dst_start, len);
      if (!crops) return {kept};  // every element of x is in the output: a view will do
      Tensor gx = ops::filled(xs, 0.0, g.dtype(), g.device());
      if (numel_of(len) > 0) kernels::copy(kept, region(gx, src_start, len));
      return {gx};
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t axis) {
  ops::check_defined(x, "split", "x");
  CF_CHECK(x.dim() > 0, ShapeError, "[split] cannot split a 0-d tensor");
  const int64_t a = normalize_axis(axis, x.dim(), "split");
  const int64_t n = x.shape()[size_t(a)];
  CF_CHECK(size > 0, ValueError, "[split] piece size must be positive, got ", size, " for ",
           x.describe());
  std::vector<Tensor> out;
  if (n == 0) out.push_back(narrow(x, a, 0, 0));  // one empty piece, as PyTorch
  for (int64_t s = 0; s < n; s += size) out.push_back(narrow(x, a, s, std::min(size, n - s)));
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  ops::check_defined(x, "split", "x");
  CF_CHECK(x.dim() > 0, ShapeError, "[split] cannot split a 0-d tensor");
  const int64_t a = normalize_axis(axis, x.dim(), "split");
  const int64_t n = x.shape()[size_t(a)];
  int64_t total = 0;
  for (int64_t s : sizes) {
    CF_CHECK(s >= 0, ValueError, "[split] sizes ", shape_str(sizes), " contain a negative size");
    total += s;
  }
  CF_CHECK(total == n, ShapeError, "[split] sizes ", shape_str(sizes), " add up to ", total,
           ", not to the size ", n, " of axis ", a, " of ", x.describe());
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, a, start, s));
    start += s;
  }
  return out;
}

}  // namespace cf
