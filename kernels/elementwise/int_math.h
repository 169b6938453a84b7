#pragma once
// int64 arithmetic shared by the CPU and CUDA elementwise kernels, where C++'s own operators are
// undefined or inexact: both devices give the same bits.
#include <cmath>
#include <cstdint>

#include "core/half.h"  // CF_HD: inline on the host, __host__ __device__ under nvcc

namespace cf::kernels {

// x / y truncating, with INT64_MIN / -1 wrapping to INT64_MIN (NumPy's result; the hardware
// division traps with SIGFPE there). y == 0 is refused before any kernel runs.
CF_HD int64_t int_div(int64_t x, int64_t y) {
  return y == -1 ? int64_t(uint64_t(0) - uint64_t(x)) : x / y;
}

// x^y exactly, by squaring in unsigned arithmetic (wrapping on overflow, as int64 multiplication
// does in PyTorch and NumPy); through double, 3^39 lost its last digits beyond 2^53. A negative
// exponent follows PyTorch's integer pow: 1 for x = 1, +-1 for x = -1, else 0.
CF_HD int64_t int_pow(int64_t x, int64_t y) {
  if (y < 0) return x == 1 ? 1 : (x == -1 ? ((y & 1) ? -1 : 1) : 0);
  uint64_t base = uint64_t(x), result = 1;
  for (uint64_t e = uint64_t(y); e != 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return int64_t(result);
}

// x + y, x - y, x * y wrapping modulo 2^64 (two's complement), as PyTorch and NumPy do; signed
// overflow is undefined in C++, so they run in unsigned arithmetic.
CF_HD int64_t int_add(int64_t x, int64_t y) { return int64_t(uint64_t(x) + uint64_t(y)); }
CF_HD int64_t int_sub(int64_t x, int64_t y) { return int64_t(uint64_t(x) - uint64_t(y)); }
CF_HD int64_t int_mul(int64_t x, int64_t y) { return int64_t(uint64_t(x) * uint64_t(y)); }

// A float value to int64 as both devices give it: truncation toward zero, and NaN or a value
// outside [-2^63, 2^63) gives INT64_MIN (the x86 conversion's answer, PyTorch's on the CPU). C++
// leaves that case undefined and CUDA's conversion saturates instead.
CF_HD int64_t float_to_int64(double v) {
  return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? int64_t(v) : int64_t(uint64_t(1) << 63);
}

// |x| and -x with INT64_MIN mapping to itself (two's complement wrap, as PyTorch and NumPy).
CF_HD int64_t int_neg(int64_t x) { return int64_t(uint64_t(0) - uint64_t(x)); }
CF_HD int64_t int_abs(int64_t x) { return x < 0 ? int_neg(x) : x; }

// Python's floor division and remainder (torch.floor_divide, torch.remainder): the quotient rounded down
// and the remainder with the divisor's sign. Integers: the truncated quotient one less where the remainder's
// sign differs from the divisor's (y == 0 is refused before any kernel runs; INT64_MIN // -1 wraps).
CF_HD int64_t int_remainder(int64_t x, int64_t y) {
  const int64_t r = y == -1 ? 0 : x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
CF_HD int64_t int_floor_div(int64_t x, int64_t y) {
  const int64_t r = y == -1 ? 0 : x % y;
  return int_div(x, y) - (r != 0 && ((r < 0) != (y < 0)) ? 1 : 0);
}
// Floats as PyTorch's div_floor_floating and Python's float //: the quotient from fmod (exact), so a large
// quotient or a divisor such as 0.1 does not round onto the wrong integer as floor(a / b) can; a zero divisor
// gives a / b (inf or NaN). The remainder is fmod's moved to the divisor's sign. The C functions are host and
// device functions under nvcc: both devices give the same bits.
CF_HD float c_fmod(float a, float b) { return fmodf(a, b); }
CF_HD double c_fmod(double a, double b) { return fmod(a, b); }
CF_HD float c_floor(float a) { return floorf(a); }
CF_HD double c_floor(double a) { return floor(a); }
CF_HD float c_copysign(float a, float b) { return copysignf(a, b); }
CF_HD double c_copysign(double a, double b) { return copysign(a, b); }
template <typename F>
CF_HD F float_floor_div(F a, F b) {
  if (b == F(0)) return a / b;
  const F mod = c_fmod(a, b);
  F div = (a - mod) / b;
  if (mod != F(0) && ((b < F(0)) != (mod < F(0)))) div -= F(1);
  if (div == F(0)) return c_copysign(F(0), a / b);
  F q = c_floor(div);
  if (div - q > F(0.5)) q += F(1);
  return q;
}
template <typename F>
CF_HD F float_remainder(F a, F b) {
  F mod = c_fmod(a, b);
  if (mod != F(0) && ((b < F(0)) != (mod < F(0)))) mod += b;
  return mod;
}

}  // namespace cf::kernels
