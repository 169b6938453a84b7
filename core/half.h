#pragma once
// Low-precision storage types: bfloat16 (1 sign, 8 exponent, 7 mantissa bits: float32's range,
// 3 significant decimal digits) and IEEE float16 (1/5/10: range +-65504, subnormals down to 2^-24).
// They are storage types only (DESIGN.md section 2): a value converts to float32 for every
// arithmetic operation (implicit `operator float`), and a float32 result is rounded back on store
// with round-to-nearest-even, NaN kept a NaN (quiet, sign kept), overflow to +-inf as IEEE rounding
// gives it. The same 2-byte layout as CUDA's __nv_bfloat16 / __half, so device kernels and
// cuBLAS read the buffers directly. Conversions are written out in integer arithmetic so they are
// bit-identical on host and device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define CF_HD __host__ __device__ __forceinline__
#else
#define CF_HD inline
#endif

namespace cf {

namespace half_detail {
CF_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
CF_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// float32 -> bfloat16 bits, round to nearest, ties to even: add 0x7FFF plus the lowest kept bit,
// then truncate. A NaN is made quiet (its payload could otherwise round to the inf pattern).
CF_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
CF_HD float bf16_bits_to_float(uint16_t b) { return u2f(uint32_t(b) << 16); }

// float32 -> IEEE binary16 bits, round to nearest even, including the subnormal range
// (|x| < 2^-14) and overflow to inf (|x| >= 65520 after rounding).
CF_HD uint16_t float_to_half_bits(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf (also inf)
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;                      // below 2^-25: rounds to 0 (2^-25 ties to even 0)
    int e = int(a >> 23);                                  // 102..112
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;              // 24-bit significand
    int shift = 126 - e;                                   // value = m * 2^(e-150); unit 2^-24
    uint32_t q = m >> shift, r = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (r > half || (r == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  // normal: rebias exponent (127 -> 15), round the 13 dropped bits to nearest even;
  // a carry out of the mantissa correctly bumps the exponent.
  uint32_t h = ((a - 0x38000000u) >> 13);
  uint32_t r = a & 0x1FFFu;
  if (r > 0x1000u || (r == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}
CF_HD float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return u2f(sign | 0x7F800000u | (m << 13));  // inf / NaN (payload kept)
  if (e == 0) {
    if (m == 0) return u2f(sign);
    // subnormal: m * 2^-24, exact in float32
    float v = float(m) * 5.9604644775390625e-08f;
    return (sign ? -v : v);
  }
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

// double -> float rounded to odd: truncated toward zero, with the lowest bit set when bits were
// dropped. Rounding that float to bfloat16 or binary16 (at most 11 of float's 24 significant
// bits) then gives the nearest-even rounding of d itself, where float(d) rounds twice
// (1 + 2^-8 + 2^-30 became 1 in bfloat16, 65519.999 became inf in float16). A NaN stays a NaN;
// a d beyond float's range gives FLT_MAX with its sign, which both types round to inf, as d.
CF_HD float double_to_float_odd(double d) {
  const float f = float(d);
  if (f != f || double(f) == d) return f;
  uint32_t u = f2u(f);
  if ((f < 0 ? -double(f) : double(f)) > (d < 0 ? -d : d)) --u;  // rounded away from zero: one step back
  return u2f(u | 1u);
}
}  // namespace half_detail

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  CF_HD BFloat16(float f) : bits(half_detail::float_to_bf16_bits(f)) {}  // NOLINT: implicit, RNE
  CF_HD BFloat16(double d) : BFloat16(half_detail::double_to_float_odd(d)) {}  // NOLINT: rounded once
  CF_HD BFloat16(int v) : BFloat16(double(v)) {}     // NOLINT
  CF_HD BFloat16(int64_t v) : BFloat16(double(v)) {}  // NOLINT (rounded once up to 2^53, as float64)
  CF_HD BFloat16(bool v) : BFloat16(v ? 1.f : 0.f) {}  // NOLINT
  CF_HD operator float() const { return half_detail::bf16_bits_to_float(bits); }  // NOLINT
  CF_HD BFloat16& operator+=(float v) { return *this = BFloat16(float(*this) + v); }
  CF_HD BFloat16& operator-=(float v) { return *this = BFloat16(float(*this) - v); }
  CF_HD BFloat16& operator*=(float v) { return *this = BFloat16(float(*this) * v); }
  CF_HD BFloat16& operator/=(float v) { return *this = BFloat16(float(*this) / v); }
  CF_HD static BFloat16 from_bits(uint16_t b) {
    BFloat16 x;
    x.bits = b;
    return x;
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  CF_HD Half(float f) : bits(half_detail::float_to_half_bits(f)) {}  // NOLINT: implicit, RNE
  CF_HD Half(double d) : Half(half_detail::double_to_float_odd(d)) {}  // NOLINT: rounded once
  CF_HD Half(int v) : Half(double(v)) {}     // NOLINT
  CF_HD Half(int64_t v) : Half(double(v)) {}  // NOLINT
  CF_HD Half(bool v) : Half(v ? 1.f : 0.f) {}  // NOLINT
  CF_HD operator float() const { return half_detail::half_bits_to_float(bits); }  // NOLINT
  CF_HD Half& operator+=(float v) { return *this = Half(float(*this) + v); }
  CF_HD Half& operator-=(float v) { return *this = Half(float(*this) - v); }
  CF_HD Half& operator*=(float v) { return *this = Half(float(*this) * v); }
  CF_HD Half& operator/=(float v) { return *this = Half(float(*this) / v); }
  CF_HD static Half from_bits(uint16_t b) {
    Half x;
    x.bits = b;
    return x;
  }
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Half) == 2, "2-byte storage types");

// The largest value of x's type below x, and the smallest above it, for a finite x (used by cf::rand:
// a draw in [low, high) that rounding to the output type carried up to high moves one step down, one
// carried below a low the type does not hold moves one step up).
namespace half_detail {
// Sign-magnitude steps, for both 2-byte layouts.
CF_HD uint16_t bits_below(uint16_t b) {
  if ((b & 0x7FFFu) == 0) return 0x8001u;  // +-0: the negative value of least magnitude
  return uint16_t(b & 0x8000u ? b + 1u : b - 1u);
}
CF_HD uint16_t bits_above(uint16_t b) {
  if ((b & 0x7FFFu) == 0) return 0x0001u;  // +-0: the positive value of least magnitude
  return uint16_t(b & 0x8000u ? b - 1u : b + 1u);
}
}  // namespace half_detail
CF_HD BFloat16 next_below(BFloat16 x) { return BFloat16::from_bits(half_detail::bits_below(x.bits)); }
CF_HD Half next_below(Half x) { return Half::from_bits(half_detail::bits_below(x.bits)); }
CF_HD float next_below(float x) { return nextafterf(x, -std::numeric_limits<float>::infinity()); }
CF_HD double next_below(double x) { return nextafter(x, -std::numeric_limits<double>::infinity()); }
CF_HD BFloat16 next_above(BFloat16 x) { return BFloat16::from_bits(half_detail::bits_above(x.bits)); }
CF_HD Half next_above(Half x) { return Half::from_bits(half_detail::bits_above(x.bits)); }
CF_HD float next_above(float x) { return nextafterf(x, std::numeric_limits<float>::infinity()); }
CF_HD double next_above(double x) { return nextafter(x, std::numeric_limits<double>::infinity()); }

// The type a kernel computes in: float32 registers for the storage types, the type itself otherwise.
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<BFloat16> { using type = float; };
template <> struct compute_type<Half> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

template <typename T> struct is_low_precision_type { static constexpr bool value = false; };
template <> struct is_low_precision_type<BFloat16> { static constexpr bool value = true; };
template <> struct is_low_precision_type<Half> { static constexpr bool value = true; };
template <typename T> constexpr bool is_low_precision_v = is_low_precision_type<T>::value;

}  // namespace cf

namespace std {
// numeric_limits for the storage types (kernels ask for lowest()/max()/infinity()).
template <> class numeric_limits<cf::BFloat16> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 8;
  static CF_HD cf::BFloat16 lowest() { return cf::BFloat16::from_bits(0xFF7F); }
  static CF_HD cf::BFloat16 max() { return cf::BFloat16::from_bits(0x7F7F); }
  static CF_HD cf::BFloat16 min() { return cf::BFloat16::from_bits(0x0080); }
  static CF_HD cf::BFloat16 epsilon() { return cf::BFloat16::from_bits(0x3C00); }  // 2^-7
  static CF_HD cf::BFloat16 infinity() { return cf::BFloat16::from_bits(0x7F80); }
  static CF_HD cf::BFloat16 quiet_NaN() { return cf::BFloat16::from_bits(0x7FC0); }
};
template <> class numeric_limits<cf::Half> {
 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 11;
  static CF_HD cf::Half lowest() { return cf::Half::from_bits(0xFBFF); }
  static CF_HD cf::Half max() { return cf::Half::from_bits(0x7BFF); }  // 65504
  static CF_HD cf::Half min() { return cf::Half::from_bits(0x0400); }  // 2^-14
  static CF_HD cf::Half epsilon() { return cf::Half::from_bits(0x1400); }  // 2^-10
  static CF_HD cf::Half infinity() { return cf::Half::from_bits(0x7C00); }
  static CF_HD cf::Half quiet_NaN() { return cf::Half::from_bits(0x7E00); }
};
}  // namespace std
