#pragma once
// Philox-driven fills. Element i (row-major over a contiguous out) uses counter
// `counter0 + i` under key `seed` (core/rng.h), on every device.
#include <cstdint>

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
};

void random_fill_cpu(const Tensor& out, const RandomParams& p);
#ifdef CF_WITH_CUDA
void random_fill_cuda(const Tensor& out, const RandomParams& p);
#endif
inline void random_fill(const Tensor& out, const RandomParams& p) {
  CF_DEVICE_DISPATCH("random", out.device(), random_fill_cpu(out, p), random_fill_cuda(out, p));
}

}  // namespace cf::kernels
