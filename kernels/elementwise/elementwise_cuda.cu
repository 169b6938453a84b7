// CUDA elementwise kernels. Every formula, NaN rule, dtype rule and error is the
// one of elementwise_cpu.cpp (the reference; elementwise.h states the contract):
// the per-element functors below are written with the same expressions, so e.g.
// relu(NaN) = NaN, sign(NaN) = 0, abs(-0.0) = -0.0, clamp(NaN) = NaN, maximum and
// minimum give NaN when either operand is NaN (PyTorch's rules), int64 division
// truncates and refuses a zero divisor.
//
// Three launch shapes, chosen on the host per call:
// - packed: every operand contiguous with the output's shape (or a single element
//   broadcast to it) and 16-byte aligned, input and output of one float dtype:
//   one 16-byte load/store per operand per step (float4 / double2), a scalar tail;
// - flat: the same operand shapes with any dtypes or alignment: one element per
//   step, coalesced;
// - strided: anything else (broadcasting, permuted or sliced views, output views)
//   through cu::strided_loop, the CPU's LoopPlan on the device.
// Outputs may alias an input (in-place ops pass the same buffer): every thread
// reads an element (or a pack) before it writes the same position, and no kernel
// reads a position another thread writes.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/elementwise/int_math.h"
#include "kernels/elementwise/elementwise.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

// ---------------------------------------------------------------- device math

// Float overloads call the float functions, as std::exp(float) does on the CPU.
#define CF_EW_MATH1(name, fname)                                              \
  __device__ __forceinline__ float m_##name(float v) { return fname(v); }     \
  __device__ __forceinline__ double m_##name(double v) { return name(v); }
CF_EW_MATH1(exp, expf)
CF_EW_MATH1(log, logf)
CF_EW_MATH1(sqrt, sqrtf)
CF_EW_MATH1(sin, sinf)
CF_EW_MATH1(cos, cosf)
CF_EW_MATH1(tanh, tanhf)
CF_EW_MATH1(log1p, log1pf)
CF_EW_MATH1(expm1, expm1f)
CF_EW_MATH1(erf, erff)
CF_EW_MATH1(floor, floorf)
CF_EW_MATH1(ceil, ceilf)
CF_EW_MATH1(nearbyint, nearbyintf)
CF_EW_MATH1(trunc, truncf)
#undef CF_EW_MATH1
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

constexpr double kSqrt1_2 = 0.70710678118654752440;  // M_SQRT1_2, as in the CPU gelu

// ---------------------------------------------------------------- functors

// True for a floating-point NaN; integer and bool values never are.
template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return isnan(v);
  else return false;
}

template <UnaryOp OP, typename T>
struct UnaryFn {
  T a, b;  // UnaryParams cast to T on the host, as unary_float does
  __device__ __forceinline__ T operator()(T v) const {
    if constexpr (OP == UnaryOp::Neg) {
      if constexpr (std::is_integral_v<T>) return int_neg(v);
      else return T(-v);
    }
    if constexpr (OP == UnaryOp::Abs) {  // as the CPU: fabs keeps abs(-0.0) = +0.0
      if constexpr (std::is_integral_v<T>) return int_abs(v);
      else return T(fabs(v));
    }
    if constexpr (OP == UnaryOp::Sign) return T((v > T(0)) - (v < T(0)));
    // (as the CPU: an integer as it is; nearbyint rounds half to even)
    if constexpr (OP == UnaryOp::Floor || OP == UnaryOp::Ceil || OP == UnaryOp::Round || OP == UnaryOp::Trunc) {
      if constexpr (std::is_floating_point_v<T>) {
        if constexpr (OP == UnaryOp::Floor) return m_floor(v);
        if constexpr (OP == UnaryOp::Ceil) return m_ceil(v);
        if constexpr (OP == UnaryOp::Round) return m_nearbyint(v);
        if constexpr (OP == UnaryOp::Trunc) return m_trunc(v);
      } else {
        return v;
      }
    }
    if constexpr (OP == UnaryOp::Square) {
      if constexpr (std::is_same_v<T, int64_t>) return int_mul(v, v);
      else return T(v * v);
    }
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (OP == UnaryOp::Exp) return m_exp(v);
      if constexpr (OP == UnaryOp::Log) return m_log(v);
      if constexpr (OP == UnaryOp::Sqrt) return m_sqrt(v);
      if constexpr (OP == UnaryOp::Rsqrt) return T(1) / m_sqrt(v);  // not rsqrt(): CPU rounding
      if constexpr (OP == UnaryOp::Sin) return m_sin(v);
      if constexpr (OP == UnaryOp::Cos) return m_cos(v);
      if constexpr (OP == UnaryOp::Tanh) return m_tanh(v);
      if constexpr (OP == UnaryOp::Sigmoid) {
        if (v >= T(0)) return T(1) / (T(1) + m_exp(-v));  // split by sign: exp never overflows
        const T e = m_exp(v);
        return e / (T(1) + e);
      }
      if constexpr (OP == UnaryOp::Relu) return v <= T(0) ? T(0) : v;
      if constexpr (OP == UnaryOp::Gelu) return T(0.5) * v * (T(1) + m_erf(v * T(kSqrt1_2)));
      if constexpr (OP == UnaryOp::GeluGrad) {
        const T cdf = T(0.5) * (T(1) + m_erf(v * T(kSqrt1_2)));
        const T pdf = m_exp(T(-0.5) * v * v) * T(0.3989422804014327);
        return cdf + v * pdf;
      }
      if constexpr (OP == UnaryOp::Reciprocal) return T(1) / v;
      if constexpr (OP == UnaryOp::Log1p) return m_log1p(v);
      if constexpr (OP == UnaryOp::Expm1) return m_expm1(v);
      if constexpr (OP == UnaryOp::Erf) return m_erf(v);
      if constexpr (OP == UnaryOp::LeakyRelu) return v > T(0) ? v : a * v;
      if constexpr (OP == UnaryOp::PowScalar) return m_pow(v, a);
      if constexpr (OP == UnaryOp::Clamp) return v < a ? a : (v > b ? b : v);
    }
    return v;  // unreachable: the host dispatch instantiates valid pairs only
  }
};

struct NotFn {
  __device__ __forceinline__ bool operator()(bool v) const { return !v; }
};

constexpr bool is_cmp(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd ||
         op == BinaryOp::LogicalOr;
}

template <BinaryOp OP, typename T>
struct BinaryFn {
  using R = std::conditional_t<is_cmp(OP), bool, T>;
  __device__ __forceinline__ R operator()(T x, T y) const {
    constexpr bool kInt = std::is_same_v<T, int64_t>;  // int64 wraps, as on the CPU (int_math.h)
    if constexpr (OP == BinaryOp::Add) {
      if constexpr (kInt) return int_add(x, y);
      else return T(x + y);
    }
    if constexpr (OP == BinaryOp::Sub) {
      if constexpr (kInt) return int_sub(x, y);
      else return T(x - y);
    }
    if constexpr (OP == BinaryOp::Mul) {
      if constexpr (kInt) return int_mul(x, y);
      else return T(x * y);
    }
    if constexpr (OP == BinaryOp::Div) {
      if constexpr (std::is_integral_v<T>) {
        return y == T(0) ? T(0) : T(int_div(x, y));  // a zero divisor fails the deferred check
      } else {
        return T(x / y);
      }
    }
    if constexpr (OP == BinaryOp::FloorDivide) {  // (int_math.h: the CPU's functions)
      if constexpr (std::is_integral_v<T>) return y == T(0) ? T(0) : T(int_floor_div(x, y));
      else return float_floor_div(x, y);
    }
    if constexpr (OP == BinaryOp::Remainder) {
      if constexpr (std::is_integral_v<T>) return y == T(0) ? T(0) : T(int_remainder(x, y));
      else return float_remainder(x, y);
    }
    if constexpr (OP == BinaryOp::Pow) {
      if constexpr (std::is_same_v<T, int64_t>) {
        return int_pow(x, y);  // exact, as on the CPU
      } else {
        return m_pow(x, y);
      }
    }
    if constexpr (OP == BinaryOp::Maximum) return x >= y || is_nan(x) ? x : y;
    if constexpr (OP == BinaryOp::Minimum) return x <= y || is_nan(x) ? x : y;
    if constexpr (OP == BinaryOp::Eq) return x == y;
    if constexpr (OP == BinaryOp::Ne) return x != y;
    if constexpr (OP == BinaryOp::Lt) return x < y;
    if constexpr (OP == BinaryOp::Le) return x <= y;
    if constexpr (OP == BinaryOp::Gt) return x > y;
    if constexpr (OP == BinaryOp::Ge) return x >= y;
    if constexpr (OP == BinaryOp::LogicalAnd) return bool(x) && bool(y);
    if constexpr (OP == BinaryOp::LogicalOr) return bool(x) || bool(y);
    return R();
  }
};

// out = a + s * b with the product and the sum rounded separately (no FMA
// contraction), like the CPU loop: optimizer updates are bit-identical across devices.
template <typename T>
struct AddScaledFn {
  T s;
  __device__ __forceinline__ T operator()(T x, T y) const {
    if constexpr (std::is_same_v<T, float>) return __fadd_rn(x, __fmul_rn(s, y));
    if constexpr (std::is_same_v<T, double>) return __dadd_rn(x, __dmul_rn(s, y));
    if constexpr (std::is_same_v<T, int64_t>) return int_add(x, int_mul(s, y));  // wraps, as the CPU
    return T();
  }
};

template <typename S, typename D>
struct CastFn {
  __device__ __forceinline__ D operator()(S v) const {
    if constexpr (std::is_same_v<D, int64_t> && !std::is_same_v<S, int64_t> && !std::is_same_v<S, bool>) {
      if constexpr (std::is_same_v<S, double>) return float_to_int64(v);  // as the CPU (int_math.h)
      else return float_to_int64(double(float(v)));
    } else {
      return static_cast<D>(v);
    }
  }
};

// bfloat16 / float16: the float32 functor on widened values; the caller's store rounds the
// float32 result to the storage type once (RNE, core/half.h), exactly as the CPU map does.
template <typename T, typename F>
struct Widen1 {
  F f;
  __device__ __forceinline__ auto operator()(T v) const { return f(float(v)); }
};
template <typename T, typename F>
struct Widen2 {
  F f;
  __device__ __forceinline__ auto operator()(T x, T y) const { return f(float(x), float(y)); }
};
template <typename T, typename F>
auto widen1(F f) {
  if constexpr (is_low_precision_v<T>) return Widen1<T, F>{f};
  else return f;
}
template <typename T, typename F>
auto widen2(F f) {
  if constexpr (is_low_precision_v<T>) return Widen2<T, F>{f};
  else return f;
}

// ---------------------------------------------------------------- kernels

// 16 bytes of T: one vector load/store (ld.global.v4.f32 / v2.f64).
template <typename T>
struct alignas(16) Pack {
  static constexpr int W = int(16 / sizeof(T));
  T v[W];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ int64_t thread_id() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

template <typename T, typename R, typename F>
__global__ void flat1_kernel(const T* x, R* out, int64_t n, F f) {
  for (int64_t i = thread_id(); i < n; i += grid_step()) out[i] = f(x[i]);
}

template <typename T, typename F>
__global__ void packed1_kernel(const T* x, T* out, int64_t n, F f) {
  constexpr int W = Pack<T>::W;
  const int64_t nv = n / W;
  for (int64_t j = thread_id(); j < nv; j += grid_step()) {
    const Pack<T> a = reinterpret_cast<const Pack<T>*>(x)[j];
    Pack<T> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = f(a.v[k]);
    reinterpret_cast<Pack<T>*>(out)[j] = r;
  }
  for (int64_t i = nv * W + thread_id(); i < n; i += grid_step()) out[i] = f(x[i]);
}

// sa / sb: 1 for a dense operand, 0 for a single element broadcast to the output.
template <typename T, typename R, typename F>
__global__ void flat2_kernel(const T* a, const T* b, R* out, int64_t n, int64_t sa, int64_t sb, F f) {
  for (int64_t i = thread_id(); i < n; i += grid_step()) out[i] = f(a[i * sa], b[i * sb]);
}

template <typename T, bool AS, bool BS, typename F>
__global__ void packed2_kernel(const T* a, const T* b, T* out, int64_t n, F f) {
  constexpr int W = Pack<T>::W;
  const int64_t nv = n / W;
  const T a0 = AS ? a[0] : T(), b0 = BS ? b[0] : T();
  for (int64_t j = thread_id(); j < nv; j += grid_step()) {
    Pack<T> x, y, r;
    if constexpr (!AS) x = reinterpret_cast<const Pack<T>*>(a)[j];
    if constexpr (!BS) y = reinterpret_cast<const Pack<T>*>(b)[j];
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = f(AS ? a0 : x.v[k], BS ? b0 : y.v[k]);
    reinterpret_cast<Pack<T>*>(out)[j] = r;
  }
  for (int64_t i = nv * W + thread_id(); i < n; i += grid_step())
    out[i] = f(AS ? a0 : a[i], BS ? b0 : b[i]);
}

template <typename T>
__global__ void where_flat_kernel(const bool* c, const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = thread_id(); i < n; i += grid_step()) out[i] = c[i] ? a[i] : b[i];
}

template <typename T>
__global__ void fill_flat_kernel(T* out, int64_t n, T v) {
  for (int64_t i = thread_id(); i < n; i += grid_step()) out[i] = v;
}

template <typename T>
__global__ void fill_packed_kernel(T* out, int64_t n, T v) {
  constexpr int W = Pack<T>::W;
  const int64_t nv = n / W;
  Pack<T> p;
#pragma unroll
  for (int k = 0; k < W; ++k) p.v[k] = v;
  for (int64_t j = thread_id(); j < nv; j += grid_step()) reinterpret_cast<Pack<T>*>(out)[j] = p;
  for (int64_t i = nv * W + thread_id(); i < n; i += grid_step()) out[i] = v;
}

// Per-element bodies of the strided path (ops[0] is the output).
template <typename T, typename R, typename F>
struct Strided1 {
  F f;
  __device__ __forceinline__ void operator()(char* const* p) const {
    *reinterpret_cast<R*>(p[0]) = f(*reinterpret_cast<const T*>(p[1]));
  }
};
template <typename T, typename R, typename F>
struct Strided2 {
  F f;
  __device__ __forceinline__ void operator()(char* const* p) const {
    *reinterpret_cast<R*>(p[0]) = f(*reinterpret_cast<const T*>(p[1]), *reinterpret_cast<const T*>(p[2]));
  }
};
template <typename T>
struct StridedWhere {
  __device__ __forceinline__ void operator()(char* const* p) const {
    *reinterpret_cast<T*>(p[0]) = *reinterpret_cast<const bool*>(p[1]) ? *reinterpret_cast<const T*>(p[2])
                                                                        : *reinterpret_cast<const T*>(p[3]);
  }
};
template <typename T>
struct StridedFill {
  T v;
  __device__ __forceinline__ void operator()(char* const* p) const { *reinterpret_cast<T*>(p[0]) = v; }
};
template <typename T>
struct FlagZero {  // marks the check slot failed when the element is zero (integer division check)
  ::cf::cuda::CheckSlot* slot;
  __device__ __forceinline__ void operator()(char* const* p) const {
    if (*reinterpret_cast<const T*>(p[0]) == T(0)) slot->position = 0;  // every writer stores the same 0
  }
};

// ---------------------------------------------------------------- host launchers

template <typename T>
constexpr bool packable() {
  return std::is_same_v<T, float> || std::is_same_v<T, double>;
}

// An operand the flat kernels can index as t[i]: contiguous with the output's shape.
bool dense_as(const Tensor& t, const Tensor& out) { return t.is_contiguous() && t.shape() == out.shape(); }

// out = f(x); x has out's shape or broadcasts to it.
template <typename T, typename R, typename F>
void map1(const char* op, const Tensor& x, const Tensor& out, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.is_contiguous() && dense_as(x, out)) {
    const T* xp = cu::ptr<T>(x);
    R* op_ = cu::ptr<R>(out);
    cu::use_device_of(out, op);
    if constexpr (std::is_same_v<T, R> && packable<T>()) {
      if (aligned16(xp) && aligned16(op_)) {
        packed1_kernel<T><<<cu::grid_for(n / Pack<T>::W + 1), kThreads, 0, ::cf::cuda::stream()>>>(xp, op_, n, f);
        ::cf::cuda::check_launch(op);
        return;
      }
    }
    flat1_kernel<T, R><<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(xp, op_, n, f);
    ::cf::cuda::check_launch(op);
    return;
  }
  cu::strided_loop<2>(op, out.shape(), {&out, &x}, Strided1<T, R, F>{f});
}

// out = f(a, b) under broadcasting.
template <typename T, typename R, typename F>
void map2(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool ad = dense_as(a, out), bd = dense_as(b, out);
  const bool as = !ad && a.numel() == 1, bs = !bd && b.numel() == 1;
  if (out.is_contiguous() && (ad || as) && (bd || bs)) {
    const T* ap = cu::ptr<T>(a);
    const T* bp = cu::ptr<T>(b);
    R* op_ = cu::ptr<R>(out);
    cu::use_device_of(out, op);
    if constexpr (std::is_same_v<T, R> && packable<T>()) {
      if (aligned16(op_) && (as || aligned16(ap)) && (bs || aligned16(bp))) {
        const unsigned g = cu::grid_for(n / Pack<T>::W + 1);
        if (as && bs)
          packed2_kernel<T, true, true><<<g, kThreads, 0, ::cf::cuda::stream()>>>(ap, bp, op_, n, f);
        else if (as)
          packed2_kernel<T, true, false><<<g, kThreads, 0, ::cf::cuda::stream()>>>(ap, bp, op_, n, f);
        else if (bs)
          packed2_kernel<T, false, true><<<g, kThreads, 0, ::cf::cuda::stream()>>>(ap, bp, op_, n, f);
        else
          packed2_kernel<T, false, false><<<g, kThreads, 0, ::cf::cuda::stream()>>>(ap, bp, op_, n, f);
        ::cf::cuda::check_launch(op);
        return;
      }
    }
    flat2_kernel<T, R>
        <<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(ap, bp, op_, n, as ? 0 : 1, bs ? 0 : 1, f);
    ::cf::cuda::check_launch(op);
    return;
  }
  cu::strided_loop<3>(op, out.shape(), {&out, &a, &b}, Strided2<T, R, F>{f});
}

template <typename T>
void unary_numeric(UnaryOp op, const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  const char* name = op_name(op);
  switch (op) {
    case UnaryOp::Neg: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Neg, C>{})); break;
    case UnaryOp::Abs: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Abs, C>{})); break;
    case UnaryOp::Sign: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Sign, C>{})); break;
    case UnaryOp::Square: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Square, C>{})); break;
    case UnaryOp::Floor: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Floor, C>{})); break;
    case UnaryOp::Ceil: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Ceil, C>{})); break;
    case UnaryOp::Round: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Round, C>{})); break;
    case UnaryOp::Trunc: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::Trunc, C>{})); break;
    default: throw DTypeError(str("[", name, "] expects float32 or float64, got ", x.dtype()));
  }
}

template <typename T>
void unary_float(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams prm) {
  using C = compute_t<T>;  // float32 registers for bfloat16/float16
  const C a = C(prm.a), b = C(prm.b);
  const char* name = op_name(op);
#define CF_EW_UNARY(OPV) \
  case UnaryOp::OPV: map1<T, T>(name, x, out, widen1<T>(UnaryFn<UnaryOp::OPV, C>{a, b})); break;
  switch (op) {
    CF_EW_UNARY(Exp)
    CF_EW_UNARY(Log)
    CF_EW_UNARY(Sqrt)
    CF_EW_UNARY(Rsqrt)
    CF_EW_UNARY(Sin)
    CF_EW_UNARY(Cos)
    CF_EW_UNARY(Tanh)
    CF_EW_UNARY(Sigmoid)
    CF_EW_UNARY(Relu)
    CF_EW_UNARY(Gelu)
    CF_EW_UNARY(GeluGrad)
    CF_EW_UNARY(Reciprocal)
    CF_EW_UNARY(Log1p)
    CF_EW_UNARY(Expm1)
    CF_EW_UNARY(Erf)
    CF_EW_UNARY(LeakyRelu)
    CF_EW_UNARY(PowScalar)
    CF_EW_UNARY(Clamp)
    default: unary_numeric<T>(op, x, out);
  }
#undef CF_EW_UNARY
}

// Refuses a zero integer divisor, like binary_cpu, as a deferred check (core/cuda.h):
// the division runs at once (a zero divisor gives 0 there) and the ValueError is
// thrown at the next host read.
template <typename T>
void check_no_zero_divisor(const char* op, const Tensor& b) {
  if (b.numel() == 0) return;
  cu::use_device_of(b, op);
  ::cf::cuda::defer_check(
      b.device(), [op](int64_t, int64_t) { throw ValueError(str("[", op, "] integer division by zero")); }, op,
      [&](::cf::cuda::CheckSlot* slot) { cu::strided_loop<1>(op, b.shape(), {&b}, FlagZero<T>{slot}); });
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  const char* name = op_name(op);
#define CF_EW_BINARY(OPV)                                                                        \
  case BinaryOp::OPV:                                                                            \
    map2<T, std::conditional_t<is_cmp(BinaryOp::OPV), bool, T>>(name, a, b, out,                 \
                                                                widen2<T>(BinaryFn<BinaryOp::OPV, C>{})); \
    break;
  switch (op) {
    case BinaryOp::Div:
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) check_no_zero_divisor<T>(name, b);
      map2<T, T>(name, a, b, out, widen2<T>(BinaryFn<BinaryOp::Div, C>{}));
      break;
    case BinaryOp::FloorDivide:
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) check_no_zero_divisor<T>(name, b);
      map2<T, T>(name, a, b, out, widen2<T>(BinaryFn<BinaryOp::FloorDivide, C>{}));
      break;
    case BinaryOp::Remainder:
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) check_no_zero_divisor<T>(name, b);
      map2<T, T>(name, a, b, out, widen2<T>(BinaryFn<BinaryOp::Remainder, C>{}));
      break;
    CF_EW_BINARY(Add)
    CF_EW_BINARY(Sub)
    CF_EW_BINARY(Mul)
    CF_EW_BINARY(Pow)
    CF_EW_BINARY(Maximum)
    CF_EW_BINARY(Minimum)
    CF_EW_BINARY(Eq)
    CF_EW_BINARY(Ne)
    CF_EW_BINARY(Lt)
    CF_EW_BINARY(Le)
    CF_EW_BINARY(Gt)
    CF_EW_BINARY(Ge)
    CF_EW_BINARY(LogicalAnd)
    CF_EW_BINARY(LogicalOr)
  }
#undef CF_EW_BINARY
}

// Only the comparisons and LogicalAnd/LogicalOr reach the bool instantiation (binary_cuda
// routes them; false < true); arithmetic on bool is never instantiated.
void binary_bool(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = op_name(op);
  switch (op) {
    case BinaryOp::Eq: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Eq, bool>{}); break;
    case BinaryOp::Ne: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Ne, bool>{}); break;
    case BinaryOp::Lt: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Lt, bool>{}); break;
    case BinaryOp::Le: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Le, bool>{}); break;
    case BinaryOp::Gt: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Gt, bool>{}); break;
    case BinaryOp::Ge: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::Ge, bool>{}); break;
    case BinaryOp::LogicalAnd: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::LogicalAnd, bool>{}); break;
    case BinaryOp::LogicalOr: map2<bool, bool>(name, a, b, out, BinaryFn<BinaryOp::LogicalOr, bool>{}); break;
    default: throw DTypeError(str("[", name, "] expects a numeric dtype, got ", a.dtype()));
  }
}

// A kernel reading host memory would fault; say so instead (the autograd layer
// checks devices before it gets here, kernels called directly may not).
void check_operand_device(const char* op, const Tensor& t, const Tensor& out) {
  CF_CHECK(t.device() == out.device(), DeviceError, "[", op, "] tensors are on different devices: ",
           t.describe(), ", ", out.describe());
}

}  // namespace

void unary_cuda(UnaryOp op, const Tensor& x, const Tensor& out, UnaryParams p) {
  check_operand_device(op_name(op), x, out);
  if (op == UnaryOp::LogicalNot) {
    map1<bool, bool>(op_name(op), x, out, NotFn{});
    return;
  }
  if (x.dtype() == kInt64) {
    unary_numeric<int64_t>(op, x, out);
    return;
  }
  CF_DISPATCH_FLOAT(x.dtype(), op_name(op), unary_float<scalar_t>(op, x, out, p));
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_operand_device(op_name(op), a, out);
  check_operand_device(op_name(op), b, out);
  if (op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr) {
    binary_bool(op, a, b, out);
    return;
  }
  if (a.dtype() == kBool && is_comparison(op)) {  // (false < true)
    binary_bool(op, a, b, out);
    return;
  }
  CF_DISPATCH_NUMERIC(a.dtype(), op_name(op), binary_typed<scalar_t>(op, a, b, out));
}

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_operand_device("where", cond, out);
  check_operand_device("where", a, out);
  check_operand_device("where", b, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  CF_DISPATCH_ALL(out.dtype(), "where", {
    using T = scalar_t;
    if (out.is_contiguous() && dense_as(cond, out) && dense_as(a, out) && dense_as(b, out)) {
      cu::use_device_of(out, "where");
      where_flat_kernel<T><<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<bool>(cond), cu::ptr<T>(a),
                                                                                   cu::ptr<T>(b), cu::ptr<T>(out), n);
      ::cf::cuda::check_launch("where");
    } else {
      cu::strided_loop<4>("where", out.shape(), {&out, &cond, &a, &b}, StridedWhere<T>{});
    }
  });
}

void copy_cuda(const Tensor& src, const Tensor& dst) {
  check_operand_device("copy", src, dst);
  if (dst.numel() == 0) return;
  if (src.dtype() == dst.dtype() && dense_as(src, dst) && dst.is_contiguous()) {
    // Same bytes in the same order: the copy engine (stream 0, asynchronous).
    if (src.raw_data() == dst.raw_data()) return;
    cu::use_device_of(dst, "copy");
    CF_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, ::cf::cuda::stream()),
        "copy");
    return;
  }
  CF_DISPATCH_ALL(src.dtype(), "copy", {
    using S = scalar_t;
    CF_DISPATCH_ALL(dst.dtype(), "copy", (map1<S, scalar_t>("copy", src, dst, CastFn<S, scalar_t>{})));
  });
}

void fill_cuda(const Tensor& t, double value) {
  if (t.numel() == 0) return;
  CF_DISPATCH_ALL(t.dtype(), "fill", {
    const scalar_t v = static_cast<scalar_t>(value);
    const int64_t n = t.numel();
    if (t.is_contiguous()) {
      cu::use_device_of(t, "fill");
      scalar_t zero{};
      if (std::memcmp(&v, &zero, sizeof(v)) == 0) {  // all-zero bytes (not -0.0): memset
        CF_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), ::cf::cuda::stream()), "fill");
      } else if (aligned16(t.raw_data())) {
        fill_packed_kernel<scalar_t><<<cu::grid_for(n / Pack<scalar_t>::W + 1), kThreads, 0, ::cf::cuda::stream()>>>(
            cu::ptr<scalar_t>(t), n, v);
        ::cf::cuda::check_launch("fill");
      } else {
        fill_flat_kernel<scalar_t><<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<scalar_t>(t), n, v);
        ::cf::cuda::check_launch("fill");
      }
    } else {
      cu::strided_loop<1>("fill", t.shape(), {&t}, StridedFill<scalar_t>{v});
    }
  });
}

void add_scaled_cuda(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  check_operand_device("add_", a, out);
  check_operand_device("add_", b, out);
  CF_DISPATCH_NUMERIC(out.dtype(), "add_", {
    using C = compute_t<scalar_t>;
    const C s = static_cast<C>(alpha);
    map2<scalar_t, scalar_t>("add_", a, b, out, widen2<scalar_t>(AddScaledFn<C>{s}));
  });
}

}  // namespace cf::kernels
