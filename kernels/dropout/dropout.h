#pragma once
// Fused inverted dropout. Element i (row-major over contiguous x and out) is
// dropped when the Philox uniform of counter `counter0 + i` under key `seed` is
// below p (the same draw as bernoulli(p) in kernels/random), otherwise scaled by
// 1/(1-p). The mask is never stored: backward reruns this kernel on the gradient
// with the same (seed, counter0), which gives the same mask on every device.
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct DropoutParams {
  double p = 0.5;
  uint64_t seed = 0, counter0 = 0;
  const uint64_t* philox_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
  // Gathered entries (improved clustered attention's top-k centroid weights): with cols defined
  // (contiguous int64 of x's shape, rows of its last size T), element (r, t) of x stands for
  // column cols[r, t] of row r of a tensor with rows of row_len entries, and draws that entry's
  // counter, counter0 + r * row_len + cols[r, t]: it drops as dropout() over the whole tensor
  // dropped that entry. The columns are counters only, never addresses.
  Tensor cols;
  int64_t row_len = 0;
};

void dropout_cpu(const Tensor& x, const Tensor& out, const DropoutParams& p);
#ifdef CF_WITH_CUDA
void dropout_cuda(const Tensor& x, const Tensor& out, const DropoutParams& p);
#endif
inline void dropout(const Tensor& x, const Tensor& out, const DropoutParams& p) {
  // The column map's contract, checked once for both devices.
  CF_CHECK(!p.cols.defined() || (p.cols.dtype() == kInt64 && p.cols.is_contiguous() && p.cols.shape() == out.shape() &&
                                  p.cols.device() == out.device()),
           Error, "[dropout] internal error: cols must be contiguous int64 of out's shape and device, got ",
           p.cols.describe(), " for ", out.describe());
  CF_DEVICE_DISPATCH("dropout", out.device(), dropout_cpu(x, out, p), dropout_cuda(x, out, p));
}

}  // namespace cf::kernels
