#pragma once
// int64 arithmetic shared by the CPU and CUDA elementwise kernels, where C++'s own operators are
// undefined or inexact: both devices give the same bits.
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

}  // namespace cf::kernels
