#pragma once
// Elementwise kernels: unary maps, broadcasting binary ops and comparisons,
// where, dtype-converting strided copy and fill. Outputs are preallocated by the
// caller with the broadcast shape; inputs may be any strided view.
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

enum class UnaryOp {
  Neg, Abs, Sign, Square,                       // numeric (float and int64)
  Floor, Ceil, Round, Trunc,                    // numeric: integers as they are; Round: half to even
  Exp, Log, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, Reciprocal, Log1p, Expm1, Erf,
  LeakyRelu,  // param a = negative slope
  PowScalar,  // param a = exponent
  Clamp,      // params a = low, b = high
  GeluGrad,   // d gelu(x) / dx
  LogicalNot  // bool -> bool
};
enum class BinaryOp {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum,  // result has the inputs' dtype
  FloorDivide, Remainder,                     // Python's // and % (int_math.h)
  Eq, Ne, Lt, Le, Gt, Ge,                     // result is bool
  LogicalAnd, LogicalOr                       // bool x bool -> bool
};
struct UnaryParams {
  double a = 0, b = 0;
};

const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);
bool is_comparison(BinaryOp op);

void unary_cpu(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p);
void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void copy_cpu(const Tensor& src, const Tensor& dst);
void fill_cpu(const Tensor& t, double value);
void add_scaled_cpu(const Tensor& a, const Tensor& b, double alpha, const Tensor& out);
#ifdef CF_WITH_CUDA
void unary_cuda(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p);
void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void copy_cuda(const Tensor& src, const Tensor& dst);
void fill_cuda(const Tensor& t, double value);
void add_scaled_cuda(const Tensor& a, const Tensor& b, double alpha, const Tensor& out);
#endif

inline void unary(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p = {}) {
  CF_DEVICE_DISPATCH(op_name(op), out.device(), unary_cpu(op, x, out, p), unary_cuda(op, x, out, p));
}
inline void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DEVICE_DISPATCH(op_name(op), out.device(), binary_cpu(op, a, b, out), binary_cuda(op, a, b, out));
}
inline void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DEVICE_DISPATCH("where", out.device(), where_cpu(cond, a, b, out), where_cuda(cond, a, b, out));
}
// dst[...] = src broadcast to dst's shape, converting dtype.
inline void copy(const Tensor& src, const Tensor& dst) {
  CF_DEVICE_DISPATCH("copy", dst.device(), copy_cpu(src, dst), copy_cuda(src, dst));
}
// out = a + alpha * b in one pass (optimizer updates; out may be a itself).
inline void add_scaled(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  CF_DEVICE_DISPATCH("add_", out.device(), add_scaled_cpu(a, b, alpha, out),
                     add_scaled_cuda(a, b, alpha, out));
}
inline void fill(const Tensor& t, double value) {
  CF_DEVICE_DISPATCH("fill", t.device(), fill_cpu(t, value), fill_cuda(t, value));
}

}  // namespace cf::kernels
