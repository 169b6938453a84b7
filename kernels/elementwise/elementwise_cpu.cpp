#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/loop.h"
#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/int_math.h"

namespace cf::kernels {

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Sign: return "sign";
    case UnaryOp::Square: return "square";
    case UnaryOp::Floor: return "floor";
    case UnaryOp::Ceil: return "ceil";
    case UnaryOp::Round: return "round";
    case UnaryOp::Trunc: return "trunc";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Sin: return "sin";
    case UnaryOp::Cos: return "cos";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Log1p: return "log1p";
    case UnaryOp::Expm1: return "expm1";
    case UnaryOp::Erf: return "erf";
    case UnaryOp::LeakyRelu: return "leaky_relu";
    case UnaryOp::PowScalar: return "pow";
    case UnaryOp::Clamp: return "clamp";
    case UnaryOp::GeluGrad: return "gelu_grad";
    case UnaryOp::LogicalNot: return "logical_not";
  }
  return "?";
}

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::FloorDivide: return "floor_divide";
    case BinaryOp::Remainder: return "remainder";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
    case BinaryOp::LogicalAnd: return "logical_and";
    case BinaryOp::LogicalOr: return "logical_or";
  }
  return "?";
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd ||
         op == BinaryOp::LogicalOr;
}

namespace {

// bfloat16 / float16 runs of map1 and map2 whose f maps float32 to float32 (the ops computed in float32
// registers): contiguous runs go through float32 chunks, widened and rounded by the row tiers (row_math.h's
// widen_row / round_row: vector code, where the element loop converted one value at a time); f sees the
// same float32 values and its result is rounded once as in the element loop, so the bits are the same.
template <typename T>
struct is_low_float : std::bool_constant<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>> {};
template <typename F, typename... Args>
struct returns_float : std::is_same<std::invoke_result_t<F, Args...>, float> {};
constexpr int64_t kLowChunk = 256;

// out = f(x); contiguous runs get a plain loop the compiler can vectorise. No
// __restrict: in-place ops pass the same buffer as input and output.
template <typename T, typename R, typename F>
void map1(const Tensor& x, const Tensor& out, F f) {
  constexpr bool low = std::conjunction_v<is_low_float<T>, std::is_same<T, R>, returns_float<F, float>>;
  const RowMath* rm = nullptr;
  if constexpr (low) rm = &row_math();  // (outside the parallel loop: it may throw on a bad CF_CPU_ISA)
  strided_loop<2>(out.shape(), {&out, &x}, [&](auto& p, auto& s, int64_t n) {
    R* o = reinterpret_cast<R*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    if (s[0] == sizeof(R) && s[1] == sizeof(T)) {
      if constexpr (low) {
        float v[kLowChunk];
        for (int64_t i0 = 0; i0 < n; i0 += kLowChunk) {
          const int64_t m = std::min(kLowChunk, n - i0);
          widen_row(*rm, a + i0, v, m);
          for (int64_t j = 0; j < m; ++j) v[j] = f(v[j]);
          round_row(*rm, v, o + i0, m);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<R*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]));
    }
  });
}

template <typename T, typename R, typename F>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  constexpr bool low = std::conjunction_v<is_low_float<T>, std::is_same<T, R>, returns_float<F, float, float>>;
  const RowMath* rm = nullptr;
  if constexpr (low) rm = &row_math();
  strided_loop<3>(out.shape(), {&out, &a, &b}, [&](auto& p, auto& s, int64_t n) {
    R* o = reinterpret_cast<R*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    if constexpr (low) {
      // contiguous operands, or one of them a broadcast scalar (stride 0)
      if (s[0] == sizeof(R) && (s[1] == sizeof(T) || s[1] == 0) && (s[2] == sizeof(T) || s[2] == 0)) {
        float u[kLowChunk], v[kLowChunk];
        for (int64_t i0 = 0; i0 < n; i0 += kLowChunk) {
          const int64_t m = std::min(kLowChunk, n - i0);
          if (s[1] != 0) widen_row(*rm, x + i0, u, m);
          else std::fill(u, u + m, float(*x));
          if (s[2] != 0) widen_row(*rm, y + i0, v, m);
          else std::fill(v, v + m, float(*y));
          for (int64_t j = 0; j < m; ++j) u[j] = f(u[j], v[j]);
          round_row(*rm, u, o + i0, m);
        }
        return;
      }
    }
    if (s[0] == sizeof(R) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == sizeof(R) && s[1] == sizeof(T) && s[2] == 0) {
      const T yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (s[0] == sizeof(R) && s[1] == 0 && s[2] == sizeof(T)) {
      const T xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<R*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]),
                                                   *reinterpret_cast<const T*>(p[2] + i * s[2]));
    }
  });
}

// True for a floating-point NaN; integer and bool values never are.
template <typename C>
inline bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return std::isnan(v);
  else return false;
}

// f(v) for a floating v, v itself for an integer.
template <typename C, typename F>
inline C rounded(C v, F f) {
  if constexpr (std::is_floating_point_v<C>) return C(f(v));
  else return v;
}

template <typename T>
void unary_numeric(UnaryOp op, const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;  // float32 registers for bfloat16/float16
  switch (op) {
    case UnaryOp::Neg:
      map1<T, T>(x, out, [](C v) {
        if constexpr (std::is_integral_v<C>) return int_neg(v);
        else return C(-v);
      });
      break;
    case UnaryOp::Abs:  // fabs: abs(-0.0) is +0.0 (v < 0 ? -v : v kept the sign of -0.0)
      map1<T, T>(x, out, [](C v) {
        if constexpr (std::is_integral_v<C>) return int_abs(v);
        else return C(std::fabs(v));
      });
      break;
    case UnaryOp::Sign: map1<T, T>(x, out, [](C v) { return C((v > C(0)) - (v < C(0))); }); break;
    case UnaryOp::Square:
      map1<T, T>(x, out, [](C v) {
        if constexpr (std::is_same_v<C, int64_t>) return int_mul(v, v);
        else return C(v * v);
      });
      break;
    // Rounding to an integer value: an integer is one already. nearbyint rounds half to even in the default
    // rounding mode, which cf never changes (PyTorch's round, NumPy's rint). -0.0 and NaN stay.
    case UnaryOp::Floor: map1<T, T>(x, out, [](C v) { return rounded<C>(v, [](C u) { return std::floor(u); }); }); break;
    case UnaryOp::Ceil: map1<T, T>(x, out, [](C v) { return rounded<C>(v, [](C u) { return std::ceil(u); }); }); break;
    case UnaryOp::Round: map1<T, T>(x, out, [](C v) { return rounded<C>(v, [](C u) { return std::nearbyint(u); }); }); break;
    case UnaryOp::Trunc: map1<T, T>(x, out, [](C v) { return rounded<C>(v, [](C u) { return std::trunc(u); }); }); break;
    default: throw DTypeError(str("[", op_name(op), "] expects float32 or float64, got ", x.dtype()));
  }
}

template <typename T>
void unary_float(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams prm) {
  using C = compute_t<T>;  // float32 registers for bfloat16/float16
  const C a = C(prm.a), b = C(prm.b);
  switch (op) {
    case UnaryOp::Exp: map1<T, T>(x, out, [](C v) { return std::exp(v); }); break;
    case UnaryOp::Log: map1<T, T>(x, out, [](C v) { return std::log(v); }); break;
    case UnaryOp::Sqrt: map1<T, T>(x, out, [](C v) { return std::sqrt(v); }); break;
    case UnaryOp::Rsqrt: map1<T, T>(x, out, [](C v) { return C(1) / std::sqrt(v); }); break;
    case UnaryOp::Sin: map1<T, T>(x, out, [](C v) { return std::sin(v); }); break;
    case UnaryOp::Cos: map1<T, T>(x, out, [](C v) { return std::cos(v); }); break;
    case UnaryOp::Tanh: map1<T, T>(x, out, [](C v) { return std::tanh(v); }); break;
    case UnaryOp::Sigmoid:
      // Split by sign so exp never overflows.
      map1<T, T>(x, out, [](C v) {
        if (v >= C(0)) return C(1) / (C(1) + std::exp(-v));
        C e = std::exp(v);
        return e / (C(1) + e);
      });
      break;
    case UnaryOp::Relu: map1<T, T>(x, out, [](C v) { return v <= C(0) ? C(0) : v; }); break;  // NaN stays NaN
    case UnaryOp::Gelu:  // exact GELU: x * Phi(x)
      map1<T, T>(x, out, [](C v) { return C(0.5) * v * (C(1) + std::erf(v * C(M_SQRT1_2))); });
      break;
    case UnaryOp::GeluGrad:
      map1<T, T>(x, out, [](C v) {
        C cdf = C(0.5) * (C(1) + std::erf(v * C(M_SQRT1_2)));
        C pdf = std::exp(C(-0.5) * v * v) * C(0.3989422804014327);
        return cdf + v * pdf;
      });
      break;
    case UnaryOp::Reciprocal: map1<T, T>(x, out, [](C v) { return C(1) / v; }); break;
    case UnaryOp::Log1p: map1<T, T>(x, out, [](C v) { return std::log1p(v); }); break;
    case UnaryOp::Expm1: map1<T, T>(x, out, [](C v) { return std::expm1(v); }); break;
    case UnaryOp::Erf: map1<T, T>(x, out, [](C v) { return std::erf(v); }); break;
    case UnaryOp::LeakyRelu: map1<T, T>(x, out, [a](C v) { return v > C(0) ? v : a * v; }); break;
    case UnaryOp::PowScalar: map1<T, T>(x, out, [a](C v) { return std::pow(v, a); }); break;
    case UnaryOp::Clamp:
      map1<T, T>(x, out, [a, b](C v) { return v < a ? a : (v > b ? b : v); });
      break;
    default: unary_numeric<T>(op, x, out);
  }
}

// Integer division by zero is undefined behaviour in C++; refused before the (possibly parallel) loop,
// where an exception could not propagate.
template <typename T>
void check_no_zero_divisor(BinaryOp op, const Tensor& b) {
  if constexpr (std::is_integral_v<T>)
    for (T v : b.to_vector<T>()) CF_CHECK(v != 0, ValueError, "[", op_name(op), "] integer division by zero");
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;  // float32 registers for bfloat16/float16
  switch (op) {
    case BinaryOp::Add:
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_same_v<C, int64_t>) return int_add(x, y);
        else return C(x + y);
      });
      break;
    case BinaryOp::Sub:
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_same_v<C, int64_t>) return int_sub(x, y);
        else return C(x - y);
      });
      break;
    case BinaryOp::Mul:
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_same_v<C, int64_t>) return int_mul(x, y);
        else return C(x * y);
      });
      break;
    case BinaryOp::Div:
      check_no_zero_divisor<T>(op, b);
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_integral_v<C>) return int_div(x, y);
        else return C(x / y);
      });
      break;
    case BinaryOp::FloorDivide:
      check_no_zero_divisor<T>(op, b);
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_integral_v<C>) return int_floor_div(x, y);
        else return float_floor_div(x, y);
      });
      break;
    case BinaryOp::Remainder:
      check_no_zero_divisor<T>(op, b);
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_integral_v<C>) return int_remainder(x, y);
        else return float_remainder(x, y);
      });
      break;
    case BinaryOp::Pow:
      map2<T, T>(a, b, out, [](C x, C y) {
        if constexpr (std::is_integral_v<C>) return int_pow(x, y);
        else return C(std::pow(x, y));
      });
      break;
    // A NaN on either side wins, as in PyTorch and NumPy.
    case BinaryOp::Maximum: map2<T, T>(a, b, out, [](C x, C y) { return x >= y || is_nan(x) ? x : y; }); break;
    case BinaryOp::Minimum: map2<T, T>(a, b, out, [](C x, C y) { return x <= y || is_nan(x) ? x : y; }); break;
    case BinaryOp::Eq: map2<T, bool>(a, b, out, [](C x, C y) { return x == y; }); break;
    case BinaryOp::Ne: map2<T, bool>(a, b, out, [](C x, C y) { return x != y; }); break;
    case BinaryOp::Lt: map2<T, bool>(a, b, out, [](C x, C y) { return x < y; }); break;
    case BinaryOp::Le: map2<T, bool>(a, b, out, [](C x, C y) { return x <= y; }); break;
    case BinaryOp::Gt: map2<T, bool>(a, b, out, [](C x, C y) { return x > y; }); break;
    case BinaryOp::Ge: map2<T, bool>(a, b, out, [](C x, C y) { return x >= y; }); break;
    case BinaryOp::LogicalAnd: map2<T, bool>(a, b, out, [](C x, C y) { return bool(x) && bool(y); }); break;
    case BinaryOp::LogicalOr: map2<T, bool>(a, b, out, [](C x, C y) { return bool(x) || bool(y); }); break;
  }
}

template <typename S, typename D>
void copy_typed(const Tensor& src, const Tensor& dst) {
  map1<S, D>(src, dst, [](S v) {
    if constexpr (std::is_same_v<D, int64_t> && !std::is_same_v<S, int64_t> && !std::is_same_v<S, bool>) {
      if constexpr (std::is_same_v<S, double>) return float_to_int64(v);
      else return float_to_int64(double(float(v)));  // float, bfloat16, float16: exact in double
    } else {
      return static_cast<D>(v);
    }
  });
}

}  // namespace

void unary_cpu(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) {
  if (op == UnaryOp::LogicalNot) {
    map1<bool, bool>(x, out, [](bool v) { return !v; });
    return;
  }
  if (x.dtype() == kInt64) {
    unary_numeric<int64_t>(op, x, out);
    return;
  }
  CF_DISPATCH_FLOAT(x.dtype(), op_name(op), unary_float<scalar_t>(op, x, out, p));
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr) {
    binary_typed<bool>(op, a, b, out);
    return;
  }
  if (a.dtype() == kBool && is_comparison(op)) {  // (false < true)
    binary_typed<bool>(op, a, b, out);
    return;
  }
  CF_DISPATCH_NUMERIC(a.dtype(), op_name(op), binary_typed<scalar_t>(op, a, b, out));
}

void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DISPATCH_ALL(out.dtype(), "where", {
    using T = scalar_t;
    strided_loop<4>(out.shape(), {&out, &cond, &a, &b}, [&](auto& p, auto& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            c ? *reinterpret_cast<const T*>(p[2] + i * s[2]) : *reinterpret_cast<const T*>(p[3] + i * s[3]);
      }
    });
  });
}

void copy_cpu(const Tensor& src, const Tensor& dst) {
  // float32 <-> bfloat16 / float16 between contiguous tensors (autocast's conversions): the row_math tier's loops
  const bool low_src = src.dtype() == kBFloat16 || src.dtype() == kFloat16,
             low_dst = dst.dtype() == kBFloat16 || dst.dtype() == kFloat16;
  const bool widen = low_src && dst.dtype() == kFloat32, narrow = src.dtype() == kFloat32 && low_dst;
  if ((widen || narrow) && src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel()) {
    const RowMath& rm = row_math();
    const bool bf16 = src.dtype() == kBFloat16 || dst.dtype() == kBFloat16;
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst.raw_data());
    parallel_for(src.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
      if (widen) {
        if (bf16) widen_row(rm, reinterpret_cast<const BFloat16*>(s) + b, reinterpret_cast<float*>(d) + b, e - b);
        else widen_row(rm, reinterpret_cast<const Half*>(s) + b, reinterpret_cast<float*>(d) + b, e - b);
      } else if (bf16) {
        round_row(rm, reinterpret_cast<const float*>(s) + b, reinterpret_cast<BFloat16*>(d) + b, e - b);
      } else {
        round_row(rm, reinterpret_cast<const float*>(s) + b, reinterpret_cast<Half*>(d) + b, e - b);
      }
    });
    return;
  }
  CF_DISPATCH_ALL(src.dtype(), "copy", {
    using S = scalar_t;
    CF_DISPATCH_ALL(dst.dtype(), "copy", (copy_typed<S, scalar_t>(src, dst)));
  });
}

void add_scaled_cpu(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  CF_DISPATCH_NUMERIC(out.dtype(), "add_", {
    using C = compute_t<scalar_t>;
    const C s = static_cast<C>(alpha);
    map2<scalar_t, scalar_t>(a, b, out, [s](C x, C y) {
      if constexpr (std::is_same_v<C, int64_t>) return int_add(x, int_mul(s, y));  // wraps (int_math.h)
      else return C(x + s * y);
    });
  });
}

void fill_cpu(const Tensor& t, double value) {
  CF_DISPATCH_ALL(t.dtype(), "fill", {
    const scalar_t v = static_cast<scalar_t>(value);
    strided_loop<1>(t.shape(), {&t}, [&](auto& p, auto& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<scalar_t*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace cf::kernels
