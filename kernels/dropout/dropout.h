#pragma once
// Fused inverted dropout. Element i (row-major over contiguous x and out) is
// dropped when the Philox uniform of counter `counter0 + i` under key `seed` is
// below p (the same draw as bernoulli(p) in kernels/random), otherwise scaled by
// 1/(1-p). The mask is never stored: backward reruns this kernel on the gradient
// with the same (seed, counter0), which gives the same mask on every device.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct DropoutParams {
  double p = 0.5;
  uint64_t seed = 0, counter0 = 0;
};

void dropout_cpu(const Tensor& x, const Tensor& out, const DropoutParams& p);
#ifdef CF_WITH_CUDA
void dropout_cuda(const Tensor& x, const Tensor& out, const DropoutParams& p);
#endif
inline void dropout(const Tensor& x, const Tensor& out, const DropoutParams& p) {
  CF_DEVICE_DISPATCH("dropout", out.device(), dropout_cpu(x, out, p), dropout_cuda(x, out, p));
}

}  // namespace cf::kernels
