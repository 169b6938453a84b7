#pragma once
// Helpers of the bfloat16 GEMM kernels (bf16_amx_cpu.cpp, bf16_dot_cpu.cpp): both multiply
// (k, k+1) pairs of bfloat16 values held in one 32-bit word (TDPBF16PS and VDPBF16PS alike), so both
// pack B as rows of such pairs, 16 columns to a 512-bit register, and read a transposed operand
// through a 16 x 16 transpose of those words. AVX-512 (F, BW, VL): callers check the CPU first.
#include <algorithm>
#include <cstdint>

#include "core/half.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define CF_HAVE_BF16_PACK 1

namespace cf::kernels {

// 16 dwords of (k, k+1) pairs: element j of row0 in the low half of dword j, of row1 in the high
// half; the first `w` columns of each row are read (rows that do not exist are zeros).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i interleave_pairs(const BFloat16* row0,
                                                                                      bool has0,
                                                                                      const BFloat16* row1,
                                                                                      bool has1, int64_t w) {
  const __mmask16 m = __mmask16((1u << w) - 1u);
  const __m256i r0 = has0 && w > 0 ? _mm256_maskz_loadu_epi16(m, row0) : _mm256_setzero_si256();
  const __m256i r1 = has1 && w > 0 ? _mm256_maskz_loadu_epi16(m, row1) : _mm256_setzero_si256();
  return _mm512_or_si512(_mm512_cvtepu16_epi32(r0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(r1), 16));
}

// r[i] dword j -> r[j] dword i: a 16 x 16 transpose of 32-bit elements in registers (unpack within
// 128-bit lanes, then two rounds of lane shuffles), how the transposed operands reach tile layout.
__attribute__((target("avx512f"))) inline void transpose_16x16_dwords(__m512i r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(_mm512_castsi512_ps(r[i]), _mm512_castsi512_ps(r[i + 1]));
    t[i + 1] = _mm512_unpackhi_ps(_mm512_castsi512_ps(r[i]), _mm512_castsi512_ps(r[i + 1]));
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: rows i and 4 + i, then 8 + i and 12 + i
    t[i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[i], t[8 + i], 0x88));
    r[8 + i] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd));
  }
}

// c[0 .. n) = alpha src (+ c when accumulate), 16 at a time: how both kernels hand a float32 product row to
// a float32 C (bf16_amx_gemm_f32, bf16_dot_gemm_f32).
__attribute__((target("avx512f"))) inline void scale_row(const float* src, float* c, int64_t n, float alpha,
                                                         bool accumulate) {
  const __m512 va = _mm512_set1_ps(alpha);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
    __m512 r = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, src + j));
    if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, c + j));
    _mm512_mask_storeu_ps(c + j, m, r);
  }
}

// K = 0 for a float32 C (bf16_*_gemm_f32): an empty sum, as BLAS, so C = 0 (left as it is when accumulating)
// and alpha is not applied (an infinite alpha would make 0 * inf = NaN). True when K was 0 and C is done.
inline bool empty_sum_f32(float* c, int64_t ldc, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (K != 0) return false;
  if (!accumulate)
    for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
  return true;
}

}  // namespace cf::kernels

#endif
