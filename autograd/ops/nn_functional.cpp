// Fused layer ops: softmax, log_softmax, layer_norm, cross_entropy, dropout.
// Each validates its inputs, runs one fused forward kernel and records a node
// whose backward is one fused kernel too (kernels/softmax, layer_norm,
// cross_entropy, dropout). Backward runs under no-grad, so these gradients are
// not themselves differentiable (no double backward through the fused kernels).
#include "autograd/dropout_share.h"
#include "autograd/autocast.h"
#include "autograd/op_names.h"
#include "autograd/ops/nn_functional.h"

#include <cmath>

#include "autograd/ops/common.h"
#include "core/cuda_graph.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/dropout/dropout.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/layer_norm/layer_norm.h"
#include "kernels/softmax/softmax.h"

namespace cf {

using autograd::SavedTensor;

namespace {

using ops::dense_data;

// A 0-d tensor seen as shape (1): softmax of a scalar is a one-element row.
Tensor as_row(const Tensor& t) { return t.dim() == 0 ? make_view(t, {1}, {1}, t.offset()) : t; }

Tensor softmax_impl(const Tensor& x, int64_t axis, bool log) {
  const char* name = log ? opname::log_softmax : opname::softmax;
  ops::check_defined(x, name, "x");
  if (autocast_dtype() && is_low_precision(x.dtype())) return softmax_impl(autocast::to_float32(x), axis, log);
  ops::check_float(x, name, "x");
  const int64_t a = normalize_axis(axis, x.dim(), name);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::softmax_forward(as_row(x), a, log, as_row(y));
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sy(y);
    autograd::record(name, {x}, y, [sy, a, log, name](const Tensor& g) -> std::vector<Tensor> {
      Tensor yv = sy.unpack(name);
      Tensor gx = Tensor::empty(yv.shape(), yv.dtype(), yv.device());
      kernels::softmax_backward(as_row(yv), as_row(g), a, log, as_row(gx));
      return {gx};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_impl(x, axis, false); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return softmax_impl(x, axis, true); }

// ---------------- layer_norm ----------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  ops::check_defined(x, opname::layer_norm, "x");
  if (autocast_dtype()) {  // autocast: normalisation statistics in float32
    Tensor xf = autocast::to_float32(x), wf = autocast::to_float32(weight), bf = autocast::to_float32(bias);
    if (!xf.is_same(x) || (weight.defined() && !wf.is_same(weight)) || (bias.defined() && !bf.is_same(bias)))
      return layer_norm(xf, normalized_shape, wf, bf, eps);
  }
  ops::check_float(x, opname::layer_norm, "x");
  ops::check_same_device(opname::layer_norm, {&x, &weight, &bias});
  ops::check_same_dtype(opname::layer_norm, {&x, &weight, &bias});
  const size_t k = normalized_shape.size();
  CF_CHECK(k >= 1 && k <= size_t(x.dim()) &&
               Shape(x.shape().end() - int64_t(k), x.shape().end()) == normalized_shape,
           ShapeError, "[layer_norm] normalized_shape ", shape_str(normalized_shape),
           " does not match the trailing axes of x ", x.describe());
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    CF_CHECK(p->shape() == normalized_shape, ShapeError, "[layer_norm] ",
             p == &weight ? "weight" : "bias", " ", p->describe(), " must have normalized_shape ",
             shape_str(normalized_shape));
  }
  const int64_t n = numel_of(normalized_shape);
  CF_CHECK(n > 0, ShapeError, "[layer_norm] normalized_shape ", shape_str(normalized_shape),
           " has no elements");
  CF_CHECK(std::isfinite(eps) && eps >= 0, ValueError, "[layer_norm] eps must be finite and >= 0, got ",
           eps);

  Tensor xc = dense_data(x);
  Tensor wc = weight.defined() ? dense_data(weight) : Tensor();
  Tensor bc = bias.defined() ? dense_data(bias) : Tensor();
  Shape stat_shape(x.shape().begin(), x.shape().end() - int64_t(k));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty(stat_shape, x.dtype(), x.device());
  Tensor rstd = Tensor::empty(stat_shape, x.dtype(), x.device());
  kernels::layer_norm_forward(xc, wc, bc, n, eps, y, mean, rstd);

  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    SavedTensor sx(xc), sw(wc), sm(mean), sr(rstd);
    Shape ns = normalized_shape;
    autograd::record(opname::layer_norm, {x, weight, bias}, y,
                     [sx, sw, sm, sr, ns, n, need_x, need_w, need_b](const Tensor& g)
                         -> std::vector<Tensor> {
      const char* op = opname::layer_norm;
      Tensor xv = sx.unpack(op), wv = sw.unpack(op), mv = sm.unpack(op), rv = sr.unpack(op);
      Tensor gx = need_x ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
      Tensor gw = need_w ? Tensor::empty(ns, xv.dtype(), xv.device()) : Tensor();
      Tensor gb = need_b ? Tensor::empty(ns, xv.dtype(), xv.device()) : Tensor();
      kernels::layer_norm_backward(dense_data(g), xv, mv, rv, wv, n, gx, gw, gb);
      return {gx, gw, gb};
    });
  }
  return y;
}

// ---------------- cross_entropy ----------------

// Reduction::Mean when every target is ignore_index: cf returns 0 (and a zero
// gradient) where PyTorch returns NaN (0/0). A fully padded batch then leaves
// the weights alone instead of poisoning them with NaN.
void check_cross_entropy_args(const Tensor& logits, const Tensor& targets, double label_smoothing) {
  ops::check_defined(logits, opname::cross_entropy, "logits");
  ops::check_defined(targets, opname::cross_entropy, "targets");
  ops::check_same_device(opname::cross_entropy, {&logits, &targets});
  ops::check_float(logits, opname::cross_entropy, "logits");
  ops::check_dtype(targets, kInt64, opname::cross_entropy, "targets");
  CF_CHECK(logits.dim() >= 2, ShapeError,
           "[cross_entropy] logits must be (N, C) or (N, C, d1, ...), got ", logits.describe());
  Shape want = logits.shape();
  want.erase(want.begin() + 1);
  CF_CHECK(targets.shape() == want, ShapeError, "[cross_entropy] targets ", targets.describe(),
           " do not match logits ", logits.describe(), ": expected targets of shape ",
           shape_str(want));
  CF_CHECK(label_smoothing >= 0 && label_smoothing < 1, ValueError,
           "[cross_entropy] label_smoothing must be in [0, 1), got ", label_smoothing);
}

namespace {
Tensor as_dtype(const Tensor& t, DType d) { return t.dtype() == d ? t : to(t, d); }  // no copy when it is d
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  if (autocast_dtype() && logits.defined() && is_low_precision(logits.dtype()))
    return cross_entropy(autocast::to_float32(logits), targets, o);  // autocast: losses in float32
  check_cross_entropy_args(logits, targets, o.label_smoothing);
  Shape want = logits.shape();  // the targets' shape: logits without the class axis
  want.erase(want.begin() + 1);

  kernels::CrossEntropyParams p;
  p.classes = logits.shape()[1];
  p.inner = numel_of(Shape(logits.shape().begin() + 2, logits.shape().end()));
  p.ignore_index = o.ignore_index;
  p.label_smoothing = o.label_smoothing;
  Tensor lc = dense_data(logits), tc = dense_data(targets);
  Tensor losses = Tensor::empty(want, logits.dtype(), logits.device());
  // Per sample (max, log sum exp(x - max)) for the backward, kept apart (kernels/cross_entropy);
  // float32 for 16-bit logits, whose kernels compute in float32.
  Shape stats_shape = want;
  stats_shape.push_back(2);
  Tensor lse = Tensor::empty(stats_shape, is_low_precision(logits.dtype()) ? kFloat32 : logits.dtype(),
                             logits.device());
  const bool mean = o.reduction == Reduction::Mean;
  // d out / d losses[s] for every non-ignored s: 1, or the mean's scale (on CUDA a
  // device scalar, so that the op never waits for the count of non-ignored samples).
  const kernels::MeanScale scale = kernels::cross_entropy_forward(lc, tc, p, losses, lse, mean);

  Tensor out;
  switch (o.reduction) {
    case Reduction::None: out = losses; break;
    case Reduction::Sum: out = sum(losses); break;
    case Reduction::Mean:
      // A 16-bit loss is scaled by its dtype's rounding of the scale, as mul(t, double) does on the CPU.
      out = scale.device.defined() ? mul(sum(losses), as_dtype(scale.device, losses.dtype()))
                                   : mul(sum(losses), scale.host);
      break;
  }
  if (autograd::any_requires_grad({&logits})) {
    SavedTensor sl(lc), st(tc), ss(lse);
    autograd::record(opname::cross_entropy, {logits}, out,
                     [sl, st, ss, p, scale](const Tensor& g) -> std::vector<Tensor> {
      const char* op = opname::cross_entropy;
      Tensor lv = sl.unpack(op), tv = st.unpack(op), sv = ss.unpack(op);
      Tensor gl = Tensor::empty(lv.shape(), lv.dtype(), lv.device());
      // On CUDA the scale multiplies g in the scale's dtype (float32 for 16-bit logits).
      const Tensor gs = scale.device.defined() ? mul(as_dtype(g, scale.device.dtype()), scale.device) : g;
      kernels::cross_entropy_backward(lv, tv, sv, dense_data(gs), scale.host, p, gl);
      return {gl};
    });
  }
  return out;
}

// ---------------- l2_normalize ----------------

Tensor l2_normalize(const Tensor& x, double eps) {
  const char* op = opname::l2_normalize;
  ops::check_defined(x, op, "x");
  ops::check_float(x, op, "x");
  CF_CHECK(x.dim() >= 1, ShapeError, "[l2_normalize] x needs an axis to normalise along, got ", x.describe());
  // (eps > 0: with 0 a zero row would be 0 * inf)
  CF_CHECK(std::isfinite(eps) && eps > 0, ValueError, "[l2_normalize] eps must be finite and > 0, got ", eps);
  if (is_low_precision(x.dtype())) {  // the sums in float32; under autocast the result stays float32
    const Tensor y = l2_normalize(to(x, kFloat32), eps);
    return autocast_dtype() ? y : to(y, x.dtype());
  }
  const int64_t n = x.shape().back();
  const Tensor xc = dense_data(x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::l2_normalize_forward(xc, n, eps, y);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(xc);
    autograd::record(op, {x}, y, [sx, n, eps](const Tensor& g) -> std::vector<Tensor> {
      const Tensor xv = sx.unpack(opname::l2_normalize);
      Tensor gx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
      kernels::l2_normalize_backward(dense_data(g), xv, n, eps, gx);
      return {gx};
    });
  }
  return y;
}

// ---------------- dropout ----------------

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  ops::check_defined(x, opname::dropout, "x");
  ops::check_float(x, opname::dropout, "x");
  CF_CHECK(p >= 0 && p < 1, ValueError, "[dropout] probability p must be in [0, 1), got ", p);
  if (!training || p == 0) return x;
  kernels::DropoutParams dp;
  dp.p = p;
  dp.philox_rebase = cuda::philox_rebase_for(gen, x.device(), "dropout");  // (before the reservation)
  dp.seed = gen.seed();
  // One counter per element, reserved up front: the mask depends only on
  // (seed, offset, i), so the CPU and the CUDA kernel draw the same one; under
  // data parallelism this process's share of W blocks (autograd/dropout_share.h).
  dp.counter0 = reserve_dropout_counters(gen, uint64_t(x.numel()));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::dropout(dense_data(x), out, dp);
  if (autograd::any_requires_grad({&x})) {
    // No saved mask: backward regenerates it from the same counters.
    autograd::record(opname::dropout, {x}, out, [dp](const Tensor& g) -> std::vector<Tensor> {
      Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
      kernels::dropout(dense_data(g), gx, dp);
      return {gx};
    });
  }
  return out;
}

namespace ops {

Tensor dropout_scale_at(const Tensor& cols, int64_t row_len, double p, uint64_t seed, uint64_t counter0,
                        DType dtype, const uint64_t* rebase) {
  const char* who = "dropout_scale_at";
  ops::check_defined(cols, who, "cols");
  CF_CHECK(cols.dtype() == kInt64, DTypeError, "[", who, "] cols must be int64, got ", cols.dtype());
  CF_CHECK(cols.dim() >= 1, ShapeError, "[", who, "] cols must have at least one axis (rows of columns), got ",
           cols.describe());
  CF_CHECK(is_floating(dtype), DTypeError, "[", who, "] dtype must be a float dtype, got ", dtype);
  CF_CHECK(p >= 0 && p < 1 && row_len >= 0, ValueError, "[", who, "] expected p in [0, 1) and row_len >= 0, got p ",
           p, ", row_len ", row_len);
  Tensor ones = Tensor::ones(cols.shape(), dtype, cols.device());
  if (p == 0) return ones;
  kernels::DropoutParams dp;
  dp.p = p;
  dp.seed = seed;
  dp.counter0 = counter0;
  dp.philox_rebase = cols.device().is_cuda() ? rebase : nullptr;
  dp.cols = dense_data(cols);
  dp.row_len = row_len;
  Tensor out = Tensor::empty(cols.shape(), dtype, cols.device());
  kernels::dropout(ones, out, dp);
  return out;
}

}  // namespace ops

}  // namespace cf
