#pragma once
// Row helpers of the row-wise kernels (softmax, layer_norm).
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

namespace cf::kernels {

inline void exp_shifted(const float* x, float* y, int64_t n, float shift) {
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

// Sum of a row in double with independent partial sums (a single accumulator
// is a chain of dependent adds, one per add latency).
template <typename T>
inline double sum_row(const T* y, int64_t n) {
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

}  // namespace cf::kernels
