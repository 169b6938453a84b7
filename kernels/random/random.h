#pragma once
// Philox-driven fills. Element i (row-major over a contiguous out) uses counter
// `counter0 + i` under key `seed` (core/rng.h), on every device.
#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

enum class RandomKind { Uniform, Normal, Integer, Bernoulli };
struct RandomParams {
  RandomKind kind = RandomKind::Uniform;
  double a = 0, b = 1;  // uniform [a, b); normal mean a, std b; bernoulli p = a
  // integer: [low, low + span), exact over all of int64 (doubles hold 53 bits: 2^60 and 2^60 + 3
  // were one double, a zero span, and % by it raised SIGFPE); span = high - low as unsigned, > 0
  int64_t low = 0;
  uint64_t span = 1;
  uint64_t seed = 0, counter0 = 0;
  const uint64_t* philox_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
};

// An integer uniform on [0, span) from one Philox draw, the same on every device. Spans up to 2^32 take
// 64 bits modulo the span (bias below 2^-32; the streams of earlier versions). Larger spans take all 128
// bits, floor(x * span / 2^128): 64 bits modulo a span of 3 * 2^62 gave its first third half the draws.
CF_HOST_DEVICE inline uint64_t philox_below(const PhiloxOut& r, uint64_t span) {
  const uint64_t hi = (uint64_t(r.v[0]) << 32) | r.v[1];
  if (span <= (uint64_t(1) << 32)) return hi % span;
  const uint64_t lo = (uint64_t(r.v[2]) << 32) | r.v[3];
#if defined(__CUDA_ARCH__)
  const uint64_t hi_hi = __umul64hi(hi, span), lo_hi = __umul64hi(lo, span);
#else
  auto mulhi = [](uint64_t a, uint64_t b) {  // the high 64 bits of a b, from 32-bit halves
    const uint64_t al = uint32_t(a), ah = a >> 32, bl = uint32_t(b), bh = b >> 32;
    const uint64_t p0 = al * bl, p1 = al * bh, p2 = ah * bl, p3 = ah * bh;
    const uint64_t mid = (p0 >> 32) + uint32_t(p1) + uint32_t(p2);
    return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
  };
  const uint64_t hi_hi = mulhi(hi, span), lo_hi = mulhi(lo, span);
#endif
  // (hi 2^64 + lo) span / 2^128 = hi_hi + carry of (hi span mod 2^64 + lo_hi) past 2^64
  const uint64_t mid = hi * span, sum = mid + lo_hi;
  return hi_hi + (sum < mid ? 1 : 0);
}

void random_fill_cpu(const Tensor& out, const RandomParams& p);
#ifdef CF_WITH_CUDA
void random_fill_cuda(const Tensor& out, const RandomParams& p);
#endif
inline void random_fill(const Tensor& out, const RandomParams& p) {
  CF_DEVICE_DISPATCH("random", out.device(), random_fill_cpu(out, p), random_fill_cuda(out, p));
}

}  // namespace cf::kernels
