// The float rows of row_math.h once per CPU instruction tier (cpu_isa.h). Each tier's functions
// call the always-inlined bodies of row_math.h, so the compiler vectorises the same loops for
// the tier's registers; only the maximum, which GCC leaves scalar under IEEE rules, is written
// with each tier's max instruction (x > m ? x : m lane-wise, the SSE2 form's rule).
//
// Same bits in every tier: the bodies are elementwise or keep fixed partial sums, and this file is
// compiled with -ffp-contract=off (CMakeLists.txt), so a tier with FMA units does not fuse the exp
// polynomial's multiply-adds. tests/ops/test_row_math.cpp compares the tiers bit for bit.
#include "kernels/common/row_math.h"

#include "core/error.h"

#ifdef CF_CPU_TIERS
#include <immintrin.h>
#endif

namespace cf::kernels {

namespace {

void exp_baseline(const float* x, float* y, int64_t n, float shift) { exp_shifted(x, y, n, shift); }
float max_baseline(const float* x, int64_t n, float init) { return max_row<float>(x, n, init); }
double sum_baseline(const float* x, int64_t n) { return sum_row(x, n); }
void grad_baseline(const float* p, float* dp, int64_t n, float D) { softmax_grad_row<float>(p, dp, n, D); }
void mask_baseline(float* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i, float ss, char* self) {
  mask_row<float>(s, lim, own, n, i, ss, self);
}
void dropout_baseline(const float* x, float* out, int64_t n, uint64_t seed, uint64_t c0, uint64_t t, float scale,
                      const int64_t* cols) {
  dropout_row<float>(x, out, n, seed, c0, t, scale, cols);
}

void to_bf16_baseline(const float* x, uint16_t* y, int64_t n) { bf16_from_float_row(x, y, n); }
void from_bf16_baseline(const uint16_t* x, float* y, int64_t n) { float_from_bf16_row(x, y, n); }
void to_f16_baseline(const float* x, uint16_t* y, int64_t n) { f16_from_float_row(x, y, n); }
void from_f16_baseline(const uint16_t* x, float* y, int64_t n) { float_from_f16_row(x, y, n); }

#ifdef CF_CPU_TIERS
CF_TARGET_AVX2 void to_bf16_avx2(const float* x, uint16_t* y, int64_t n) { bf16_from_float_row(x, y, n); }
CF_TARGET_AVX2 void from_bf16_avx2(const uint16_t* x, float* y, int64_t n) { float_from_bf16_row(x, y, n); }
CF_TARGET_AVX512 void to_bf16_avx512(const float* x, uint16_t* y, int64_t n) { bf16_from_float_row(x, y, n); }
CF_TARGET_AVX512 void from_bf16_avx512(const uint16_t* x, float* y, int64_t n) { float_from_bf16_row(x, y, n); }
CF_TARGET_AVX2 void to_f16_avx2(const float* x, uint16_t* y, int64_t n) { f16_from_float_row(x, y, n); }
CF_TARGET_AVX2 void from_f16_avx2(const uint16_t* x, float* y, int64_t n) { float_from_f16_row(x, y, n); }
CF_TARGET_AVX512 void to_f16_avx512(const float* x, uint16_t* y, int64_t n) { f16_from_float_row(x, y, n); }
CF_TARGET_AVX512 void from_f16_avx512(const uint16_t* x, float* y, int64_t n) { float_from_f16_row(x, y, n); }
CF_TARGET_AVX2 void exp_avx2(const float* x, float* y, int64_t n, float shift) { exp_shifted(x, y, n, shift); }
CF_TARGET_AVX2 double sum_avx2(const float* x, int64_t n) { return sum_row(x, n); }
CF_TARGET_AVX2 void grad_avx2(const float* p, float* dp, int64_t n, float D) {
  softmax_grad_row<float>(p, dp, n, D);
}
CF_TARGET_AVX2 void mask_avx2(float* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i, float ss,
                           char* self) {
  mask_row<float>(s, lim, own, n, i, ss, self);
}
CF_TARGET_AVX2 void dropout_avx2(const float* x, float* out, int64_t n, uint64_t seed, uint64_t c0, uint64_t t,
                              float scale, const int64_t* cols) {
  dropout_row<float>(x, out, n, seed, c0, t, scale, cols);
}
CF_TARGET_AVX2 float max_avx2(const float* x, int64_t n, float init) {
  __m256 m0 = _mm256_set1_ps(init), m1 = m0;
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + k), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + k + 8), m1);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, m0);
  _mm256_store_ps(lanes + 8, m1);
  float r = init;
  for (float v : lanes) r = v > r ? v : r;
  for (; k < n; ++k) r = x[k] > r ? x[k] : r;
  return r;
}

CF_TARGET_AVX512 void exp_avx512(const float* x, float* y, int64_t n, float shift) { exp_shifted(x, y, n, shift); }
CF_TARGET_AVX512 double sum_avx512(const float* x, int64_t n) { return sum_row(x, n); }
CF_TARGET_AVX512 void grad_avx512(const float* p, float* dp, int64_t n, float D) {
  softmax_grad_row<float>(p, dp, n, D);
}
CF_TARGET_AVX512 void mask_avx512(float* s, const int64_t* lim, const int64_t* own, int64_t n, int64_t i, float ss,
                           char* self) {
  mask_row<float>(s, lim, own, n, i, ss, self);
}
CF_TARGET_AVX512 void dropout_avx512(const float* x, float* out, int64_t n, uint64_t seed, uint64_t c0, uint64_t t,
                              float scale, const int64_t* cols) {
  dropout_row<float>(x, out, n, seed, c0, t, scale, cols);
}
CF_TARGET_AVX512 float max_avx512(const float* x, int64_t n, float init) {
  __m512 m0 = _mm512_set1_ps(init), m1 = m0;
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    // (the maskz form: GCC 12 warns that _mm512_max_ps's undefined pass-through may be uninitialised)
    m0 = _mm512_maskz_max_ps(0xFFFF, _mm512_loadu_ps(x + k), m0);
    m1 = _mm512_maskz_max_ps(0xFFFF, _mm512_loadu_ps(x + k + 16), m1);
  }
  alignas(64) float lanes[32];
  _mm512_store_ps(lanes, m0);
  _mm512_store_ps(lanes + 16, m1);
  float r = init;
  for (float v : lanes) r = v > r ? v : r;
  for (; k < n; ++k) r = x[k] > r ? x[k] : r;
  return r;
}
#endif

const RowMath kBaselineRows{CpuIsa::kBaseline, exp_baseline, max_baseline, sum_baseline, grad_baseline,
                               mask_baseline, dropout_baseline, to_bf16_baseline, from_bf16_baseline,
                               to_f16_baseline, from_f16_baseline};
#ifdef CF_CPU_TIERS
const RowMath kAvx2Rows{CpuIsa::kAvx2, exp_avx2, max_avx2, sum_avx2, grad_avx2, mask_avx2,
                        dropout_avx2, to_bf16_avx2, from_bf16_avx2, to_f16_avx2, from_f16_avx2};
const RowMath kAvx512Rows{CpuIsa::kAvx512, exp_avx512, max_avx512, sum_avx512, grad_avx512,
                            mask_avx512, dropout_avx512, to_bf16_avx512, from_bf16_avx512, to_f16_avx512,
                            from_f16_avx512};
#endif

}  // namespace

const RowMath& row_math(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = cpu_isa_supported();
  CF_CHECK(cpu_isa_runs(isa), ValueError, "[row_math] this CPU lacks the ", cpu_isa_name(isa),
           " tier; it runs at most ", cpu_isa_name(cpu_isa_supported()));
#ifdef CF_CPU_TIERS
  if (isa == CpuIsa::kAvx512) return kAvx512Rows;
  if (isa == CpuIsa::kAvx2) return kAvx2Rows;
#endif
  return kBaselineRows;
}

const RowMath& row_math() { return row_math(cpu_isa()); }

}  // namespace cf::kernels
