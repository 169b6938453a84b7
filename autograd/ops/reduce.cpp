#include "autograd/autocast.h"
#include "autograd/op_names.h"
#include "autograd/ops/reduce.h"

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape.h"
#include "kernels/reduce/reduce.h"

namespace cf {

using autograd::SavedTensor;
using kernels::ReduceOp;

namespace {

struct Plan {
  std::vector<int64_t> axes;
  Shape keep_shape;  // reduced axes set to 1
  Shape out_shape;   // what the user gets
  int64_t count = 1;  // elements per output
};

Plan plan_reduce(const Tensor& x, const Axes& axes, bool keepdim, const char* op) {
  Plan p;
  p.axes = ops::normalize_axes(axes, x.dim(), op);
  p.keep_shape = x.shape();
  for (int64_t a : p.axes) {
    p.count *= x.shape()[size_t(a)];
    p.keep_shape[size_t(a)] = 1;
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool reduced = std::find(p.axes.begin(), p.axes.end(), d) != p.axes.end();
    if (!reduced || keepdim) p.out_shape.push_back(p.keep_shape[size_t(d)]);
  }
  return p;
}

// Run a reduction kernel; returns the output with the user's shape.
Tensor run_reduce(ReduceOp kop, const Tensor& x, const Plan& p, int64_t correction = 0,
                  Tensor* indices = nullptr) {
  Tensor out = Tensor::empty(p.keep_shape, x.dtype(), x.device());
  Tensor idx;
  if (indices) idx = Tensor::empty(p.keep_shape, kInt64, x.device());
  kernels::reduce(kop, x, p.axes, out, idx, correction);
  if (indices) *indices = idx.detach();
  return out;  // keep_shape; callers reshape
}

// Broadcast a reduced gradient back over x's shape.
Tensor expand_back(const Tensor& g, const Shape& keep_shape, const Shape& x_shape) {
  return expand(reshape(g, keep_shape), x_shape);
}

void check_nonempty(const Tensor& x, const Plan& p, const char* op) {
  CF_CHECK(p.count > 0, ShapeError, "[", op, "] cannot reduce an empty axis of ", x.describe());
}

}  // namespace

Tensor sum(const Tensor& x0, const Axes& axes, bool keepdim) {
  ops::check_defined(x0, opname::sum, "x");
  if (autocast_dtype() && is_low_precision(x0.dtype())) return sum(autocast::to_float32(x0), axes, keepdim);
  Tensor x = x0.dtype() == kBool ? to(x0, kInt64) : x0;  // sum of a mask counts it
  Plan p = plan_reduce(x, axes, keepdim, opname::sum);
  Tensor out = reshape(run_reduce(ReduceOp::Sum, x, p).detach(), p.out_shape).detach();
  if (autograd::any_requires_grad({&x})) {
    Shape ks = p.keep_shape, xs = x.shape();
    autograd::record(opname::sum, {x}, out, [ks, xs](const Tensor& g) -> std::vector<Tensor> {
      return {expand_back(g, ks, xs)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdim) {
  ops::check_defined(x, opname::mean, "x");
  if (autocast_dtype() && is_low_precision(x.dtype())) return mean(autocast::to_float32(x), axes, keepdim);
  ops::check_float(x, opname::mean, "x");
  Plan p = plan_reduce(x, axes, keepdim, opname::mean);
  check_nonempty(x, p, opname::mean);
  Tensor out = reshape(run_reduce(ReduceOp::Mean, x, p), p.out_shape).detach();
  if (autograd::any_requires_grad({&x})) {
    Shape ks = p.keep_shape, xs = x.shape();
    double inv = 1.0 / double(p.count);
    autograd::record(opname::mean, {x}, out, [ks, xs, inv](const Tensor& g) -> std::vector<Tensor> {
      return {expand_back(mul(g, inv), ks, xs)};
    });
  }
  return out;
}

Tensor var(const Tensor& x, const Axes& axes, int64_t correction, bool keepdim) {
  ops::check_defined(x, opname::var, "x");
  if (autocast_dtype() && is_low_precision(x.dtype()))
    return var(autocast::to_float32(x), axes, correction, keepdim);
  ops::check_float(x, opname::var, "x");
  Plan p = plan_reduce(x, axes, keepdim, opname::var);
  CF_CHECK(correction >= 0, ValueError, "[var] correction must be >= 0, got ", correction);
  CF_CHECK(p.count > correction, ShapeError, "[var] needs more than ", correction,
           " elements per output, got ", p.count, " from ", x.describe());
  Tensor out = reshape(run_reduce(ReduceOp::Var, x, p, correction), p.out_shape).detach();
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x);
    Plan pc = p;
    double scale = 2.0 / double(p.count - correction);
    autograd::record(opname::var, {x}, out, [sx, pc, scale](const Tensor& g) -> std::vector<Tensor> {
      Tensor xv = sx.unpack(opname::var);
      Tensor centered = sub(xv, mean(xv, pc.axes, true));
      return {mul(expand_back(mul(g, scale), pc.keep_shape, xv.shape()), centered)};
    });
  }
  return out;
}

Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdim) {
  ops::check_defined(x, opname::logsumexp, "x");
  if (autocast_dtype() && is_low_precision(x.dtype())) return logsumexp(autocast::to_float32(x), axes, keepdim);
  ops::check_float(x, opname::logsumexp, "x");
  Plan p = plan_reduce(x, axes, keepdim, opname::logsumexp);
  check_nonempty(x, p, opname::logsumexp);
  Tensor keep = run_reduce(ReduceOp::LogSumExp, x, p);
  Tensor out = reshape(keep, p.out_shape).detach();
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x);
    Shape ks = p.keep_shape;
    std::vector<int64_t> axes_n = p.axes;
    autograd::record(opname::logsumexp, {x}, out, [sx, ks, axes_n](const Tensor& g) -> std::vector<Tensor> {
      Tensor xv = sx.unpack(opname::logsumexp);
      // softmax weights exp(x - m) / sum exp(x - m) with m the (exact) maximum: exp(x - lse) with the
      // lse rounded to x's dtype was 2.6% off for float32 logits near 1e6 (cross_entropy's rule too)
      // m is the largest finite element (0 when there is none): a row holding +inf then gives NaN at
      // the +inf and 0 elsewhere, as PyTorch, not NaN everywhere through inf - inf, nor exp overflowing
      // at large finite entries
      const Axes ax(axes_n.begin(), axes_n.end());
      Tensor m = amax(where(lt(abs(xv), INFINITY), xv, -INFINITY), ax, true);
      Tensor e = exp(sub(xv, where(lt(abs(m), INFINITY), m, 0.0)));
      return {mul(expand_back(g, ks, xv.shape()), div(e, sum(e, ax, true)))};
    });
  }
  return out;
}

namespace {
Tensor amax_amin(const Tensor& x, const Axes& axes, bool keepdim, bool is_max) {
  const char* name = is_max ? opname::amax : opname::amin;
  ops::check_defined(x, name, "x");
  CF_CHECK(x.dtype() != kBool, DTypeError, "[", name, "] is not defined for ", x.describe());
  Plan p = plan_reduce(x, axes, keepdim, name);
  check_nonempty(x, p, name);
  Tensor keep = run_reduce(is_max ? ReduceOp::Max : ReduceOp::Min, x, p);
  Tensor out = reshape(keep, p.out_shape).detach();
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x), sk(keep);
    Plan pc = p;
    autograd::record(name, {x}, out, [sx, sk, pc, name](const Tensor& g) -> std::vector<Tensor> {
      Tensor xv = sx.unpack(name);
      // Share the gradient equally among the tied extrema.
      Tensor hit = to(eq(xv, sk.unpack(name)), xv.dtype());
      Tensor count = sum(hit, pc.axes, true);
      return {mul(div(hit, count), expand_back(g, pc.keep_shape, xv.shape()))};
    });
  }
  return out;
}

// op_name: the op the user called, for errors (argmax reported them as [max]).
ValuesIndices max_min(const Tensor& x, int64_t axis, bool keepdim, bool is_max, const char* op_name = nullptr) {
  const char* name = op_name ? op_name : is_max ? opname::max : opname::min;
  ops::check_defined(x, name, "x");
  CF_CHECK(x.dtype() != kBool, DTypeError, "[", name, "] is not defined for ", x.describe());
  int64_t a = normalize_axis(axis, x.dim(), name);
  Plan p = plan_reduce(x, {a}, keepdim, name);
  check_nonempty(x, p, name);
  Tensor idx;
  Tensor keep = run_reduce(is_max ? ReduceOp::Max : ReduceOp::Min, x, p, 0, &idx);
  ValuesIndices r{reshape(keep, p.out_shape).detach(), reshape(idx, p.out_shape).detach()};
  if (x.dim() == 0) a = 0;
  if (autograd::any_requires_grad({&x})) {
    SavedTensor si(idx);
    Shape ks = p.keep_shape, xs = x.shape();
    autograd::record(name, {x}, r.values, [si, ks, xs, a, name](const Tensor& g) -> std::vector<Tensor> {
      if (xs.empty()) return {g};
      Tensor zeros = ops::filled(xs, 0.0, g.dtype(), g.device());
      return {scatter_add(zeros, a, si.unpack(name), reshape(g, ks))};
    });
  }
  return r;
}
}  // namespace

Tensor amax(const Tensor& x, const Axes& axes, bool keepdim) { return amax_amin(x, axes, keepdim, true); }
Tensor amin(const Tensor& x, const Axes& axes, bool keepdim) { return amax_amin(x, axes, keepdim, false); }
ValuesIndices max(const Tensor& x, int64_t axis, bool keepdim) { return max_min(x, axis, keepdim, true); }
ValuesIndices min(const Tensor& x, int64_t axis, bool keepdim) { return max_min(x, axis, keepdim, false); }
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  NoGradGuard ng;
  return max_min(x, axis, keepdim, true, "argmax").indices;
}
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim) {
  NoGradGuard ng;
  return max_min(x, axis, keepdim, false, "argmin").indices;
}

namespace ops {

Tensor signed_argmax(const Tensor& x_in) {
  const char* op = "signed_argmax";
  ops::check_defined(x_in, op, "x");
  // 16-bit values compare exactly in float32 (lsh_buckets under autocast hands bfloat16 projections here)
  const Tensor x = is_low_precision(x_in.dtype()) ? to(x_in, kFloat32) : x_in;
  CF_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, DTypeError, "[", op,
           "] expects a floating dtype, got ", x.dtype());
  CF_CHECK(x.dim() >= 1 && x.shape().back() >= 1, ShapeError, "[", op,
           "] needs a last axis of at least one entry, got ", x.describe());
  Shape s = x.shape();
  s.pop_back();
  Tensor out = Tensor::empty(s, kInt64, x.device());
  kernels::signed_argmax(contiguous(x.detach()), out);
  return out;
}

}  // namespace ops

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  int64_t lead = g.dim() - int64_t(shape.size());
  CF_CHECK(lead >= 0, ShapeError, "[sum_to] cannot reduce ", shape_str(g.shape()), " to ",
           shape_str(shape));
  Axes axes;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead) {
      axes.push_back(d);
      continue;
    }
    int64_t want = shape[size_t(d - lead)];
    if (want == 1 && g.shape()[size_t(d)] != 1) axes.push_back(d);
    else
      CF_CHECK(want == g.shape()[size_t(d)], ShapeError, "[sum_to] cannot reduce ",
               shape_str(g.shape()), " to ", shape_str(shape));
  }
  return reshape(sum(g, axes, true), shape);
}

}  // namespace cf
