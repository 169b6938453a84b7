// Elementwise ops: validation, output allocation, kernel call and backward.
#include "core/cuda.h"
#include "autograd/op_names.h"
#include "autograd/ops/elementwise.h"

#include "autograd/ops/common.h"
#include "autograd/ops/reduce.h"
#include "kernels/elementwise/elementwise.h"

#include <cmath>

namespace cf {

using autograd::SavedTensor;
using kernels::BinaryOp;
using kernels::UnaryOp;

namespace {

Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = kernels::op_name(op);
  ops::check_defined(a, name, "a");
  ops::check_defined(b, name, "b");
  ops::check_same_device(name, {&a, &b});
  ops::check_same_dtype(name, {&a, &b});
  bool logical = op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr;
  if (logical) {
    ops::check_dtype(a, kBool, name, "a");
  } else if (a.dtype() == kBool) {  // comparisons order false before true, as PyTorch's (b < True); no arithmetic
    CF_CHECK(kernels::is_comparison(op), DTypeError, "[", name, "] is not defined for bool tensors: ",
             a.describe(), ", ", b.describe());
  }
  Tensor out = Tensor::empty(a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), name),
                             kernels::is_comparison(op) ? kBool : a.dtype(), a.device());
  kernels::binary(op, a, b, out);
  return out;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, kernels::UnaryParams p = {}) {
  const char* name = kernels::op_name(op);
  ops::check_defined(x, name, "x");
  bool numeric = op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Sign || op == UnaryOp::Square ||
                 op == UnaryOp::Floor || op == UnaryOp::Ceil || op == UnaryOp::Round || op == UnaryOp::Trunc;
  if (op == UnaryOp::LogicalNot)
    ops::check_dtype(x, kBool, name, "x");
  else if (numeric)
    CF_CHECK(x.dtype() != kBool, DTypeError, "[", name, "] is not defined for bool tensors: ",
             x.describe());
  else
    ops::check_float(x, name, "x");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::unary(op, x, out, p);
  return out;
}

// Dtype promotion (docs/design-notes.md, "Dtypes and promotion"): floating operands of different
// dtypes meet at promote_types (PyTorch's rule) through differentiable casts, so each input's
// gradient comes back in its own dtype; as in PyTorch, a 0-d operand beside one with dims takes the
// other's dtype (a float64 scalar tensor does not widen float32 activations, nor a float32 one
// bfloat16 activations). int64/bool never mix with floats implicitly.
bool promote_pair(const Tensor& a, const Tensor& b, Tensor& pa, Tensor& pb) {
  if (!a.defined() || !b.defined() || a.dtype() == b.dtype() || !is_floating(a.dtype()) ||
      !is_floating(b.dtype()))
    return false;
  const DType t = (a.dim() == 0) == (b.dim() == 0) ? promote_types(a.dtype(), b.dtype())
                  : a.dim() == 0                   ? b.dtype()
                                                   : a.dtype();
  pa = a.dtype() == t ? a : to(a, t);
  pb = b.dtype() == t ? b : to(b, t);
  return true;
}
#define CF_PROMOTED(CALL)                        \
  do {                                           \
    Tensor pa_, pb_;                             \
    if (promote_pair(a, b, pa_, pb_)) {          \
      const Tensor &a = pa_, &b = pb_;           \
      return CALL;                               \
    }                                            \
  } while (0)

// Record y = f(x) with dy/dx computed by `local(x, y, g)`.
template <typename F>
Tensor unary_op(UnaryOp op, const Tensor& x, F local, kernels::UnaryParams p = {}) {
  Tensor y = unary_forward(op, x, p);
  if (autograd::any_requires_grad({&x})) {
    SavedTensor sx(x), sy(y);
    const char* name = kernels::op_name(op);
    autograd::record(name, {x}, y, [sx, sy, name, local](const Tensor& g) -> std::vector<Tensor> {
      return {local(sx.unpack(name), sy.unpack(name), g)};
    });
  }
  return y;
}

}  // namespace

// ---------------- binary ----------------

Tensor add(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(add(a, b));
  Tensor out = binary_forward(BinaryOp::Add, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    autograd::record(opname::add, {a, b}, out, [sa, sb](const Tensor& g) -> std::vector<Tensor> {
      return {sum_to(g, sa), sum_to(g, sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(sub(a, b));
  Tensor out = binary_forward(BinaryOp::Sub, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    autograd::record(opname::sub, {a, b}, out, [sa, sb](const Tensor& g) -> std::vector<Tensor> {
      return {sum_to(g, sa), sum_to(neg(g), sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(mul(a, b));
  Tensor out = binary_forward(BinaryOp::Mul, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    // Each operand is saved only for the other's gradient (PyTorch's rule: w * x with w written in place
    // before a backward that wants w's gradient alone, g x, was refused)
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    SavedTensor sa(need_b ? a : Tensor()), sb(need_a ? b : Tensor());
    const Shape as = a.shape(), bs = b.shape();
    autograd::record(opname::mul, {a, b}, out, [sa, sb, as, bs, need_a, need_b](const Tensor& g) -> std::vector<Tensor> {
      return {need_a ? sum_to(mul(g, sb.unpack(opname::mul)), as) : Tensor(),
              need_b ? sum_to(mul(g, sa.unpack(opname::mul)), bs) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(div(a, b));
  Tensor out = binary_forward(BinaryOp::Div, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    // a is never needed, the output only for b's gradient (the output written in place before a backward
    // that wants only a's gradient was refused)
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    SavedTensor sb(b), so(need_b ? out : Tensor());
    const Shape as = a.shape(), bs = b.shape();
    autograd::record(opname::div, {a, b}, out, [sb, so, as, bs, need_a, need_b](const Tensor& g) -> std::vector<Tensor> {
      Tensor bv = sb.unpack(opname::div);
      // d(a/b)/db = -(a/b)/b, as g * (o / b): (g / b) * o was inf * 0 = NaN for a = 0 over a b so small
      // that g / b overflows (float16 at b = 1e-5), where the gradient is -0 (PyTorch's order)
      return {need_a ? sum_to(div(g, bv), as) : Tensor(),
              need_b ? sum_to(neg(mul(g, div(so.unpack(opname::div), bv))), bs) : Tensor()};
    });
  }
  return out;
}

Tensor floor_divide(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(floor_divide(a, b));
  return binary_forward(BinaryOp::FloorDivide, a, b);  // no graph: zero gradient almost everywhere
}

Tensor remainder(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(remainder(a, b));
  Tensor out = binary_forward(BinaryOp::Remainder, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    // a - floor_divide(a, b) * b: d/da 1, d/db -floor_divide(a, b) (PyTorch's), the quotient a step function
    const bool need_b = b.requires_grad();
    SavedTensor sa(need_b ? a : Tensor()), sb(need_b ? b : Tensor());
    const Shape as = a.shape(), bs = b.shape();
    autograd::record(opname::remainder, {a, b}, out, [sa, sb, as, bs, need_b](const Tensor& g) -> std::vector<Tensor> {
      Tensor gb;
      if (need_b) {
        const Tensor q = floor_divide(sa.unpack(opname::remainder), sb.unpack(opname::remainder));
        gb = sum_to(neg(mul(g, q)), bs);
      }
      return {sum_to(g, as), gb};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(pow(a, b));
  Tensor out = binary_forward(BinaryOp::Pow, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    // Both gradients read a and b; the output only b's (saved only then, as mul and div do)
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    SavedTensor sa(a), sb(b), so(need_b ? out : Tensor());
    autograd::record(opname::pow, {a, b}, out, [sa, sb, so, need_a, need_b](const Tensor& g) -> std::vector<Tensor> {
      Tensor av = sa.unpack(opname::pow), bv = sb.unpack(opname::pow);
      // PyTorch's masks: b a^(b-1) is 0 where b = 0 (not 0 * inf at a = 0), and a^b log a is 0
      // where a = 0 and b >= 0 (the limit, not 0 * -inf); without them one zero base gives NaN.
      Tensor zero = ops::scalar_like(g, 0.0);
      Tensor ga = need_a ? sum_to(where(eq(bv, 0.0), zero, mul(g, mul(bv, pow(av, sub(bv, 1.0))))), av.shape())
                         : Tensor();
      Tensor gb = need_b ? sum_to(mul(g, where(logical_and(eq(av, 0.0), ge(bv, 0.0)), zero,
                                               mul(so.unpack(opname::pow), log(av)))),
                                  bv.shape())
                         : Tensor();  // (the factor masked, so a NaN in g stays NaN, as in PyTorch)
      return {ga, gb};
    });
  }
  return out;
}

namespace {
// Gradient of maximum/minimum: `pick_a` marks where a was chosen (ties, and a NaN
// in a, which the forward returns; a NaN in b only sends the gradient to b).
Tensor minmax_op(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  CF_PROMOTED(minmax_op(op, name, a, b));
  Tensor out = binary_forward(op, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sa(a), sb(b);
    autograd::record(name, {a, b}, out, [sa, sb, op, name](const Tensor& g) -> std::vector<Tensor> {
      Tensor av = sa.unpack(name), bv = sb.unpack(name);
      Tensor pick_a = logical_or(op == BinaryOp::Maximum ? ge(av, bv) : le(av, bv), ne(av, av));
      Tensor zero = ops::scalar_like(g, 0.0);
      return {sum_to(where(pick_a, g, zero), av.shape()), sum_to(where(pick_a, zero, g), bv.shape())};
    });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return minmax_op(BinaryOp::Maximum, opname::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return minmax_op(BinaryOp::Minimum, opname::minimum, a, b); }

Tensor add(const Tensor& a, double b) { return add(a, ops::number_like(a, b, opname::add)); }
Tensor sub(const Tensor& a, double b) { return sub(a, ops::number_like(a, b, opname::sub)); }
Tensor mul(const Tensor& a, double b) { return mul(a, ops::number_like(a, b, opname::mul)); }
Tensor div(const Tensor& a, double b) { return div(a, ops::number_like(a, b, opname::div)); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(ops::number_like(b, a, opname::add), b); }
Tensor operator-(double a, const Tensor& b) { return sub(ops::number_like(b, a, opname::sub), b); }
Tensor operator*(double a, const Tensor& b) { return mul(ops::number_like(b, a, opname::mul), b); }
Tensor operator/(double a, const Tensor& b) { return div(ops::number_like(b, a, opname::div), b); }
Tensor operator-(const Tensor& a) { return neg(a); }

// ---------------- comparisons ----------------

Tensor eq(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(eq(a, b));
  return binary_forward(BinaryOp::Eq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(ne(a, b));
  return binary_forward(BinaryOp::Ne, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(lt(a, b));
  return binary_forward(BinaryOp::Lt, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(le(a, b));
  return binary_forward(BinaryOp::Le, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(gt(a, b));
  return binary_forward(BinaryOp::Gt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  CF_PROMOTED(ge(a, b));
  return binary_forward(BinaryOp::Ge, a, b);
}
// A number compared with a tensor: exactly (ops::compare_operand).
Tensor eq(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return eq(x, ops::scalar_like(x, b)); }
Tensor ne(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return ne(x, ops::scalar_like(x, b)); }
Tensor lt(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return lt(x, ops::scalar_like(x, b)); }
Tensor le(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return le(x, ops::scalar_like(x, b)); }
Tensor gt(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return gt(x, ops::scalar_like(x, b)); }
Tensor ge(const Tensor& a, double b) { const Tensor x = ops::compare_operand(a, b); return ge(x, ops::scalar_like(x, b)); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::LogicalAnd, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::LogicalOr, a, b); }
Tensor logical_not(const Tensor& a) { return unary_forward(UnaryOp::LogicalNot, a); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  ops::check_defined(cond, opname::where, "cond");
  ops::check_defined(a, opname::where, "a");
  ops::check_defined(b, opname::where, "b");
  ops::check_same_device(opname::where, {&cond, &a, &b});
  ops::check_dtype(cond, kBool, opname::where, "cond");
  CF_PROMOTED(where(cond, a, b));
  ops::check_same_dtype(opname::where, {&a, &b});
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), opname::where), b.shape(), opname::where);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  kernels::where(cond, a, b, out);
  if (autograd::any_requires_grad({&a, &b})) {
    SavedTensor sc(cond);
    Shape sa = a.shape(), sb = b.shape();
    autograd::record(opname::where, {a, b}, out, [sc, sa, sb](const Tensor& g) -> std::vector<Tensor> {
      Tensor c = sc.unpack(opname::where);
      Tensor zero = ops::scalar_like(g, 0.0);
      return {sum_to(where(c, g, zero), sa), sum_to(where(c, zero, g), sb)};
    });
  }
  return out;
}
Tensor where(const Tensor& cond, const Tensor& a, double b) {
  ops::check_defined(a, opname::where, "a");
  return where(cond, a, ops::number_like(a, b, opname::where));
}

// ---------------- unary ----------------

Tensor neg(const Tensor& x) {
  return unary_op(UnaryOp::Neg, x, [](const Tensor&, const Tensor&, const Tensor& g) { return neg(g); });
}
Tensor abs(const Tensor& x) {
  return unary_op(UnaryOp::Abs, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, sign(x));
  });
}
Tensor sign(const Tensor& x) { return unary_forward(UnaryOp::Sign, x); }
Tensor floor(const Tensor& x) { return unary_forward(UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return unary_forward(UnaryOp::Ceil, x); }
Tensor round(const Tensor& x) { return unary_forward(UnaryOp::Round, x); }
Tensor trunc(const Tensor& x) { return unary_forward(UnaryOp::Trunc, x); }
Tensor square(const Tensor& x) {
  return unary_op(UnaryOp::Square, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, mul(x, 2.0));
  });
}
Tensor exp(const Tensor& x) {
  return unary_op(UnaryOp::Exp, x, [](const Tensor&, const Tensor& y, const Tensor& g) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return unary_op(UnaryOp::Log, x, [](const Tensor& x, const Tensor&, const Tensor& g) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return unary_op(UnaryOp::Sqrt, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return div(g, mul(y, 2.0));
  });
}
Tensor rsqrt(const Tensor& x) {
  // d x^{-1/2} = -1/2 x^{-3/2} = -1/2 y^3
  return unary_op(UnaryOp::Rsqrt, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, mul(pow(y, 3.0), -0.5));
  });
}
Tensor sin(const Tensor& x) {
  return unary_op(UnaryOp::Sin, x, [](const Tensor& x, const Tensor&, const Tensor& g) { return mul(g, cos(x)); });
}
Tensor cos(const Tensor& x) {
  return unary_op(UnaryOp::Cos, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return neg(mul(g, sin(x)));
  });
}
Tensor tanh(const Tensor& x) {
  return unary_op(UnaryOp::Tanh, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, sub(ops::scalar_like(y, 1.0), square(y)));
  });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op(UnaryOp::Sigmoid, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, mul(y, sub(ops::scalar_like(y, 1.0), y)));
  });
}
Tensor relu(const Tensor& x) {
  // The gradient passes where x is not <= 0, so a NaN input gets it (PyTorch's rule).
  return unary_op(UnaryOp::Relu, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return where(le(x, 0.0), ops::scalar_like(g, 0.0), g);
  });
}
Tensor gelu(const Tensor& x) {
  return unary_op(UnaryOp::Gelu, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, unary_forward(UnaryOp::GeluGrad, x));
  });
}
Tensor leaky_relu(const Tensor& x, double slope) {
  // (a NaN slope made every negative input NaN, and the model's output with it)
  CF_CHECK(std::isfinite(slope), ValueError, "[leaky_relu] the negative slope must be finite, got ", slope);
  return unary_op(
      UnaryOp::LeakyRelu, x,
      [slope](const Tensor& x, const Tensor&, const Tensor& g) { return where(gt(x, 0.0), g, mul(g, slope)); },
      {slope, 0});
}
Tensor reciprocal(const Tensor& x) {
  return unary_op(UnaryOp::Reciprocal, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return neg(mul(g, square(y)));
  });
}
Tensor log1p(const Tensor& x) {
  return unary_op(UnaryOp::Log1p, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return div(g, add(x, 1.0));
  });
}
Tensor expm1(const Tensor& x) {
  return unary_op(UnaryOp::Expm1, x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, add(y, 1.0));
  });
}
Tensor erf(const Tensor& x) {
  // d erf(x) = 2/sqrt(pi) exp(-x^2)
  return unary_op(UnaryOp::Erf, x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, mul(exp(neg(square(x))), 1.1283791670955126));
  });
}
Tensor clamp(const Tensor& x, double low, double high) {
  CF_CHECK(!std::isnan(low) && !std::isnan(high), ValueError, "[clamp] the bounds must not be NaN, got low ", low,
           ", high ", high);
  CF_CHECK(low <= high, ValueError, "[clamp] low ", low, " is greater than high ", high);
  return unary_op(
      UnaryOp::Clamp, x,
      [low, high](const Tensor& x, const Tensor&, const Tensor& g) {
        return where(logical_and(ge(x, low), le(x, high)), g, 0.0);
      },
      {low, high});
}
Tensor pow(const Tensor& a, double e) {
  return unary_op(
      UnaryOp::PowScalar, a,
      [e](const Tensor& x, const Tensor&, const Tensor& g) {
        // x^0 is constant: its gradient is 0 everywhere, also at x = 0 (where 0 * x^-1 would be NaN)
        if (e == 0.0) return Tensor::zeros(g.shape(), g.dtype(), g.device());
        return mul(g, mul(pow(x, e - 1.0), e));
      },
      {e, 0});
}

// ---------------- copies and casts ----------------

Tensor to(const Tensor& x, DType dtype) {
  ops::check_defined(x, opname::to, "x");
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  kernels::copy(x, out);
  if (is_floating(dtype) && autograd::any_requires_grad({&x})) {
    DType from = x.dtype();
    autograd::record(opname::to, {x}, out, [from](const Tensor& g) -> std::vector<Tensor> {
      return {to(g, from)};
    });
  }
  return out;
}

Tensor to(const Tensor& x, Device device) {
  ops::check_defined(x, opname::to, "x");
  if (x.device() == device) return x;
  cuda::check_device(device, opname::to);
  Tensor src = x;
  {
    NoGradGuard ng;  // the move below records the one node, "to"
    if (!src.is_contiguous()) src = contiguous(src);
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  copy_bytes(out.raw_data(), device, src.raw_data(), src.device(), out.nbytes(), opname::to);
  if (autograd::any_requires_grad({&x})) {
    Device from = x.device();
    autograd::record(opname::to, {x}, out, [from](const Tensor& g) -> std::vector<Tensor> {
      return {to(g, from)};
    });
  }
  return out;
}

Tensor Tensor::to(Device device) const { return cf::to(*this, device); }
Tensor Tensor::cpu() const { return cf::to(*this, Device::cpu()); }
Tensor Tensor::cuda(int index) const { return cf::to(*this, Device::cuda(index)); }

Tensor clone(const Tensor& x) {
  ops::check_defined(x, opname::clone, "x");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::copy(x, out);
  if (autograd::any_requires_grad({&x}))
    autograd::record(opname::clone, {x}, out, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  return out;
}

Tensor contiguous(const Tensor& x) {
  ops::check_defined(x, "contiguous", "x");
  return x.is_contiguous() ? x : clone(x);
}

Tensor zeros_like(const Tensor& x) { return full_like(x, 0.0); }
Tensor ones_like(const Tensor& x) { return full_like(x, 1.0); }
Tensor full_like(const Tensor& x, double value) {
  ops::check_defined(x, "full_like", "x");
  check_fill_value(x.dtype(), value, "full_like");
  Tensor t = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::fill(t, value);
  return t;
}

// ---------------- in-place ----------------

Tensor& add_(Tensor& t, const Tensor& other, double alpha) {
  ops::check_inplace(t, "add_");
  ops::check_defined(other, "add_", "other");
  ops::check_inplace_source(other, "add_");
  ops::check_same_device("add_", {&t, &other});
  ops::check_same_dtype("add_", {&t, &other});
  CF_CHECK(broadcast_shapes(t.shape(), other.shape(), "add_") == t.shape(), ShapeError,
           "[add_] cannot broadcast ", shape_str(other.shape()), " into ", shape_str(t.shape()));
  CF_CHECK(t.dtype() != kBool, DTypeError, "[add_] is not defined for ", t.describe());
  ops::check_number(t, alpha, "add_");  // an int64 tensor's alpha = 0.5 would be 0
  ops::check_no_internal_overlap(t, "add_");
  kernels::add_scaled(t, ops::inplace_source(t, other), alpha, t);
  t.bump_version();
  return t;
}

Tensor& mul_(Tensor& t, double s) {
  ops::check_inplace(t, "mul_");
  ops::check_no_internal_overlap(t, "mul_");
  kernels::binary(BinaryOp::Mul, t, ops::number_like(t, s, "mul_"), t);
  t.bump_version();
  return t;
}

Tensor& fill_(Tensor& t, double value) {
  ops::check_inplace(t, "fill_");
  check_fill_value(t.dtype(), value, "fill_");
  kernels::fill(t, value);
  t.bump_version();
  return t;
}

Tensor& zero_(Tensor& t) { return fill_(t, 0.0); }

Tensor& copy_(Tensor& dst, const Tensor& src) {
  ops::check_inplace(dst, "copy_");
  ops::check_defined(src, "copy_", "src");
  ops::check_inplace_source(src, "copy_");
  ops::check_same_device("copy_", {&dst, &src});
  CF_CHECK(broadcast_shapes(dst.shape(), src.shape(), "copy_") == dst.shape(), ShapeError,
           "[copy_] cannot broadcast ", shape_str(src.shape()), " into ", shape_str(dst.shape()));
  ops::check_no_internal_overlap(dst, "copy_");
  kernels::copy(ops::inplace_source(dst, src), dst);
  dst.bump_version();
  return dst;
}

}  // namespace cf
