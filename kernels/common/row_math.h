#pragma once
// Row helpers of the row-wise kernels (softmax, layer_norm, the fused attention kernels, dropout).
//
// The float rows the kernels call through a RowMath table (bottom) are compiled once per CPU
// instruction tier in row_math.cpp (cpu_isa.h): the bodies below are always inlined, so each tier's
// copy is these loops vectorised for its registers, with the same operations in the same order
// (same bits). A kernel takes the table once, outside its parallel loops (row_math() may throw on a
// bad CF_CPU_ISA), and passes it down.
//
// exp_shifted: exp(x[k] - shift) over a contiguous row, for rows whose shift is their maximum
// (softmax, logsumexp): every argument is <= 0, so the result is in [0, 1].
//
// std::exp is a scalar libm call the compiler cannot vectorise; it took most of
// a softmax row's time (cf-bench elementwise: softmax at about a third of
// PyTorch's speed). The float version below is the Cephes expf scheme written
// as straight-line float arithmetic that auto-vectorises: n = round(x log2 e),
// r = x - n ln 2 (ln 2 split in two for exactness), a degree-6 polynomial for
// e^r on [-ln2/2, ln2/2], and 2^n built in the exponent bits. Relative error is
// about 1e-7 (float32 rounding). Arguments below -87.3 (where 2^n would need a
// subnormal) give 0: next to the row's maximum, whose term is 1, they are far
// below float32 resolution. -inf gives 0, NaN gives NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "kernels/attention/softmax_grad.h"
#include "kernels/common/cpu_isa.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// Inlined into every caller, including the tiers' target-attributed copies in row_math.cpp.
#if defined(__GNUC__)
#define CF_ROW_INLINE inline __attribute__((always_inline))
#else
#define CF_ROW_INLINE inline
#endif

namespace cf::kernels {

CF_ROW_INLINE void exp_shifted(const float* x, float* y, int64_t n, float shift) {
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k] - shift;
    // Clamp for the arithmetic only (a NaN fails the comparison and is clamped
    // too, so no NaN reaches the float-to-int conversion); the select at the
    // end restores 0 below the range and NaN for NaN.
    const float c = v >= -87.0f ? v : -87.0f;
    const float t = c * 1.44269504088896341f;
    const float nf = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
    const float r = (c - nf * 0.693359375f) + nf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t(nf) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    y[k] = v >= -87.0f ? er * scale : (v < -87.0f ? 0.0f : v);
  }
}

// Maximum of a row, ignoring NaN (a NaN entry later makes the row's exp sum NaN).
// Eight partial maxima in the form a vector max instruction computes.
template <typename T>
CF_ROW_INLINE T max_row(const T* x, int64_t n, T init) {
  T m[8] = {init, init, init, init, init, init, init, init};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) m[j] = x[k + j] > m[j] ? x[k + j] : m[j];
  for (; k < n; ++k) m[0] = x[k] > m[0] ? x[k] : m[0];
  T r = m[0];
  for (int j = 1; j < 8; ++j) r = m[j] > r ? m[j] : r;
  return r;
}

#if defined(__SSE2__)
// GCC keeps `a > b ? a : b` scalar under IEEE rules (it may not assume away NaN
// and signed zeros), although maxps computes exactly that: say it directly.
// _mm_max_ps(x, m) is x > m ? x : m lane-wise, so a NaN entry is skipped as above.
template <>
CF_ROW_INLINE float max_row<float>(const float* x, int64_t n, float init) {
  __m128 m0 = _mm_set1_ps(init), m1 = m0;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    m0 = _mm_max_ps(_mm_loadu_ps(x + k), m0);
    m1 = _mm_max_ps(_mm_loadu_ps(x + k + 4), m1);
  }
  alignas(16) float lanes[8];
  _mm_store_ps(lanes, m0);
  _mm_store_ps(lanes + 4, m1);
  float r = init;
  for (float v : lanes) r = v > r ? v : r;
  for (; k < n; ++k) r = x[k] > r ? x[k] : r;
  return r;
}
#endif

// Sum of a row in double with independent partial sums (a single accumulator
// is a chain of dependent adds, one per add latency).
template <typename T>
CF_ROW_INLINE double sum_row(const T* y, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) s[j] += double(y[k + j]);
  for (; k < n; ++k) s[0] += double(y[k]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

inline void exp_shifted(const double* x, double* y, int64_t n, double shift) {
  for (int64_t k = 0; k < n; ++k) y[k] = std::exp(x[k] - shift);
}

// dp[k] = softmax_grad(p[k], dp[k], D) over a row: the softmax backward's dS = P (dP - D), 0 where P is 0.
template <typename T>
CF_ROW_INLINE void softmax_grad_row(const T* p, T* dp, int64_t n, T D) {
  for (int64_t k = 0; k < n; ++k) dp[k] = softmax_grad(p[k], dp[k], D);
}

// One row of a masked attention score tile (mask_scores in kernels/attention/attention_cpu.cpp),
// for the query at position i >= 0: s[c] = -inf where lim[c] > i (a key it may not see: an empty
// slot, padding, or a later position under causal masking), self_score where own[c] == i (its own
// key under the Reformer rule; own[c] < 0 when that rule is off), s[c] otherwise; self[c] =
// (own[c] == i) when self is given. Selects and 64-bit compares only: the same bits in every tier.
template <typename T>
CF_ROW_INLINE void mask_row(T* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i, T self_score,
                            char* self) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < n; ++c) {
    const T v = own[c] == i ? self_score : s[c];
    s[c] = lim[c] > i ? ninf : v;
  }
  if (self)
    for (int64_t c = 0; c < n; ++c) self[c] = char(own[c] == i);
}

// Inverted dropout of a run (kernels/dropout/dropout.h): out[k] = 0 when the Philox4x32-10 draw
// of counter counter0 + k (or, given cols, counter0 + cols[k]: a run whose entries are scattered
// over the counters, as block attention's gathered keys are) under key seed (core/rng.h) is below
// the drop rate, x[k] * scale otherwise. The test is philox_uniform_d(r) < p done in integers: its
// 53 random bits below threshold = ceil(p 2^53) (dropout_threshold), the same answer for every
// draw. The ten rounds are unrolled, so the loop over elements is the one the compiler vectorises
// (32 x 32 -> 64-bit products); one Philox call per element was a third of a cf-lm training step.
template <typename T, typename Counter>
CF_ROW_INLINE void dropout_run(const T* x, T* out, int64_t n, uint64_t seed, Counter counter_of, uint64_t threshold,
                               T scale) {
  const uint32_t key0 = uint32_t(seed), key1 = uint32_t(seed >> 32);
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t counter = counter_of(k);
    uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = key0, k1 = key1;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {  // philox4x32_10's round
      const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
      c1 = uint32_t(p1);
      c3 = uint32_t(p0);
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t bits = ((uint64_t(c0) << 21) ^ uint64_t(c1 >> 11)) & ((uint64_t(1) << 53) - 1);
    out[k] = bits < threshold ? T(0) : T(x[k] * scale);
  }
}
template <typename T>
CF_ROW_INLINE void dropout_row(const T* x, T* out, int64_t n, uint64_t seed, uint64_t counter0, uint64_t threshold,
                               T scale, const int64_t* cols = nullptr) {
  if (cols)
    dropout_run(x, out, n, seed, [=](int64_t k) { return counter0 + uint64_t(cols[k]); }, threshold, scale);
  else
    dropout_run(x, out, n, seed, [=](int64_t k) { return counter0 + uint64_t(k); }, threshold, scale);
}

// dropout_row's threshold for drop rate p: u = bits / 2^53 < p exactly when bits < ceil(p 2^53) (bits is
// an integer, and p 2^53 is exact in double). Outside [0, 1] (and NaN) the answer u < p gives: never
// below 0 or for NaN, always from 1 on.
inline uint64_t dropout_threshold(double p) {
  if (!(p > 0)) return 0;
  if (p >= 1) return uint64_t(1) << 53;
  return uint64_t(std::ceil(std::ldexp(p, 53)));
}

// The float rows of one instruction tier (row_math.cpp). Each entry computes exactly what the
// function of the same name above computes (up to which NaN a NaN is and the sign of a zero
// maximum: cpu_isa.h).
// float32 <-> bfloat16 (the bits, uint16) over a row: round to nearest even with NaN kept a quiet NaN, bit for
// bit core/half.h's float_to_bf16_bits; and the exact widening. Integer operations only, so every tier
// vectorises them (autocast's conversions ran element by element through BFloat16's conversions).
CF_ROW_INLINE void bf16_from_float_row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, 4);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    y[k] = uint16_t((u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 0x0040u) : rounded);
  }
}
CF_ROW_INLINE void float_from_bf16_row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t u = uint32_t(x[k]) << 16;
    std::memcpy(y + k, &u, 4);
  }
}

// float32 <-> IEEE float16 (the bits) over a row, bit for bit core/half.h's float_to_half_bits /
// half_bits_to_float, written without branches so the tiers vectorise them (as the bfloat16 rows).
// Narrowing in integers only, so neither the rounding mode nor FP exception flags enter: a NaN keeps its
// sign and top payload bits and is made quiet; from 65520 up (after rounding) infinity; otherwise the
// significand is shifted right by 13 (normal results; a carry moves into the exponent) or by 14-24 (below
// 2^-14: subnormal results, 0x400 when one rounds up to the smallest normal, 0 from 2^-25 down), rounding
// the dropped bits to nearest even: q = (m + half - 1 + lsb(m >> shift)) >> shift. (The variable shift is
// one instruction from AVX2 on; the SSE2 tier leaves this loop scalar.) Widening: subnormals are
// m * 2^-24, an exact product in float32 in every rounding mode.
CF_ROW_INLINE void f16_from_float_row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, 4);
    const uint32_t a = u & 0x7FFFFFFFu, e = a >> 23;
    const uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;  // 2^-14 up to 65520
    const uint32_t drop = e < 113u ? 126u - e : 14u;  // below 2^-14: 14 and up (normal results: unused)
    const uint32_t shift = drop < 31u ? drop : 31u;   // (from 2^-25 down every bit goes: 0 either way)
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t sub = (m + ((1u << (shift - 1)) - 1u) + ((m >> shift) & 1u)) >> shift;
    const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
    const uint32_t h = a > 0x7F800000u ? nan : (a >= 0x477FF000u ? 0x7C00u : (a < 0x38800000u ? sub : normal));
    y[k] = uint16_t(((u >> 16) & 0x8000u) | h);
  }
}
CF_ROW_INLINE void float_from_f16_row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t o = uint32_t(x[k] & 0x7FFFu) << 13, e = o & 0x0F800000u;
    const float subf = float(int32_t(x[k] & 0x3FFu)) * 5.9604644775390625e-08f;  // m 2^-24
    uint32_t sub;
    std::memcpy(&sub, &subf, 4);
    const uint32_t mag = e == 0x0F800000u ? o + 0x70000000u : (e == 0 ? sub : o + 0x38000000u);
    const uint32_t u = (uint32_t(x[k] & 0x8000u) << 16) | mag;
    std::memcpy(y + k, &u, 4);
  }
}

struct RowMath {
  CpuIsa isa;
  void (*exp_shifted)(const float* x, float* y, int64_t n, float shift);
  float (*max_row)(const float* x, int64_t n, float init);
  double (*sum_row)(const float* x, int64_t n);
  void (*softmax_grad_row)(const float* p, float* dp, int64_t n, float D);
  void (*mask_row)(float* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i, float self_score,
                   char* self);
  void (*dropout_row)(const float* x, float* out, int64_t n, uint64_t seed, uint64_t counter0, uint64_t threshold,
                      float scale, const int64_t* cols);
  void (*to_bf16)(const float* x, uint16_t* y, int64_t n);
  void (*from_bf16)(const uint16_t* x, float* y, int64_t n);
  void (*to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*from_f16)(const uint16_t* x, float* y, int64_t n);
};

// The 16-bit conversions of a table by storage type: widen_row(rm, bfloat16 or float16 row, float32 row)
// and round_row back (matmul's converting path, the elementwise kernels' float32 chunks, copies).
inline void widen_row(const RowMath& rm, const BFloat16* x, float* y, int64_t n) {
  rm.from_bf16(reinterpret_cast<const uint16_t*>(x), y, n);
}
inline void widen_row(const RowMath& rm, const Half* x, float* y, int64_t n) {
  rm.from_f16(reinterpret_cast<const uint16_t*>(x), y, n);
}
inline void round_row(const RowMath& rm, const float* x, BFloat16* y, int64_t n) {
  rm.to_bf16(x, reinterpret_cast<uint16_t*>(y), n);
}
inline void round_row(const RowMath& rm, const float* x, Half* y, int64_t n) {
  rm.to_f16(x, reinterpret_cast<uint16_t*>(y), n);
}

// The table of the tier in use (cpu_isa()); ValueError on a bad CF_CPU_ISA.
const RowMath& row_math();
// The table of a given tier (kAuto: the best this CPU runs); ValueError when this CPU lacks it.
const RowMath& row_math(CpuIsa isa);

// Through a table: float rows run the table's tier, double rows the functions above.
inline void exp_shifted(const RowMath& rm, const float* x, float* y, int64_t n, float shift) {
  rm.exp_shifted(x, y, n, shift);
}
inline void exp_shifted(const RowMath&, const double* x, double* y, int64_t n, double shift) {
  exp_shifted(x, y, n, shift);
}
inline float max_row(const RowMath& rm, const float* x, int64_t n, float init) { return rm.max_row(x, n, init); }
inline double max_row(const RowMath&, const double* x, int64_t n, double init) { return max_row(x, n, init); }
inline double sum_row(const RowMath& rm, const float* x, int64_t n) { return rm.sum_row(x, n); }
inline double sum_row(const RowMath&, const double* x, int64_t n) { return sum_row(x, n); }
inline void softmax_grad_row(const RowMath& rm, const float* p, float* dp, int64_t n, float D) {
  rm.softmax_grad_row(p, dp, n, D);
}
inline void softmax_grad_row(const RowMath&, const double* p, double* dp, int64_t n, double D) {
  softmax_grad_row<double>(p, dp, n, D);
}
inline void mask_row(const RowMath& rm, float* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i,
                     float self_score, char* self) {
  rm.mask_row(s, lim, own, n, i, self_score, self);
}
inline void dropout_row(const RowMath& rm, const float* x, float* out, int64_t n, uint64_t seed, uint64_t counter0,
                        uint64_t threshold, float scale, const int64_t* cols = nullptr) {
  rm.dropout_row(x, out, n, seed, counter0, threshold, scale, cols);
}
inline void dropout_row(const RowMath&, const double* x, double* out, int64_t n, uint64_t seed, uint64_t counter0,
                        uint64_t threshold, double scale, const int64_t* cols = nullptr) {
  dropout_row<double>(x, out, n, seed, counter0, threshold, scale, cols);
}
inline void mask_row(const RowMath&, double* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i,
                     double self_score, char* self) {
  mask_row<double>(s, lim, own, n, i, self_score, self);
}

}  // namespace cf::kernels
