#pragma once
// Elementwise ops with NumPy broadcasting. Binary ops need both operands of one
// dtype and device (cast with cf::to); a double operand takes the tensor's dtype.
#include "core/tensor.h"

namespace cf {

// ---- binary arithmetic (differentiable for float dtypes) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
// Python's // and % (torch.floor_divide, torch.remainder): the quotient rounded down and the remainder
// with the divisor's sign; int64 exactly, floats from fmod as PyTorch and Python compute them (exact, where
// floor(a / b) can round onto the next integer), a zero float divisor gives inf or NaN (an int64 one is a
// ValueError). floor_divide records no graph (a step function); remainder is differentiable (d/da 1,
// d/db -floor_divide(a, b)).
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // ties: gradient goes to a
Tensor minimum(const Tensor& a, const Tensor& b);  // ties: gradient goes to a
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- comparisons and logic (bool results, never differentiable) ----
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);

// cond ? a : b, broadcasting all three; differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);

// ---- unary ----
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);  // not differentiable (zero almost everywhere): no graph
// The integer values next to x (not differentiable either: a zero gradient almost everywhere, as sign):
// floor rounds down, ceil up, round to the nearest with halves to even (torch.round, numpy.rint), trunc
// toward zero. Float dtypes keep their dtype (-0.0, inf and NaN stay); int64 comes back as it is.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);
Tensor trunc(const Tensor& x);
Tensor square(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor reciprocal(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor clamp(const Tensor& x, double low, double high);

// ---- copies and casts ----
// A new tensor with x's dtype converted; differentiable between float dtypes.
Tensor to(const Tensor& x, DType dtype);
// A copy on `device` (x itself when it is there already); differentiable: the
// gradient moves back to x's device.
Tensor to(const Tensor& x, Device device);
// x itself when already contiguous, else a contiguous copy (differentiable).
Tensor contiguous(const Tensor& x);
// Always a new contiguous copy (differentiable).
Tensor clone(const Tensor& x);
Tensor zeros_like(const Tensor& x);
Tensor ones_like(const Tensor& x);
Tensor full_like(const Tensor& x, double value);

// ---- in-place (bump the version counter; refused on tensors that require grad
// while grad mode is on: use NoGradGuard, as optimizers do) ----
Tensor& add_(Tensor& t, const Tensor& other, double alpha = 1.0);  // t += alpha * other
Tensor& mul_(Tensor& t, double s);
Tensor& fill_(Tensor& t, double value);
Tensor& zero_(Tensor& t);
Tensor& copy_(Tensor& dst, const Tensor& src);  // src broadcast to dst's shape, dtype converted

}  // namespace cf
