#pragma once
// Fused layer normalisation over the trailing `n` elements of each row.
// x and g are contiguous (rows, n) in memory; weight and bias are contiguous
// with n elements or undefined; every output is preallocated and contiguous.
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// y = (x - mean) * rstd * weight + bias with mean and rstd = 1/sqrt(var + eps)
// per row (biased variance, two-pass in double). mean and rstd hold one value per row.
void layer_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                            double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd);
// gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)) with gh = g * weight;
// gweight = sum over rows of g * xhat; gbias = sum over rows of g. Any output may be
// undefined (not needed). The column sums run in a fixed order: the result does not
// depend on the thread count.
void layer_norm_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& mean,
                             const Tensor& rstd, const Tensor& weight, int64_t n, const Tensor& gx,
                             const Tensor& gweight, const Tensor& gbias);
#ifdef CF_WITH_CUDA
void layer_norm_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                             double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layer_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight, int64_t n, const Tensor& gx,
                              const Tensor& gweight, const Tensor& gbias);
#endif

inline void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                               double eps, const Tensor& y, const Tensor& mean,
                               const Tensor& rstd) {
  CF_DEVICE_DISPATCH("layer_norm", y.device(),
                     layer_norm_forward_cpu(x, weight, bias, n, eps, y, mean, rstd),
                     layer_norm_forward_cuda(x, weight, bias, n, eps, y, mean, rstd));
}
inline void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& weight, int64_t n,
                                const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  CF_DEVICE_DISPATCH("layer_norm", x.device(),
                     layer_norm_backward_cpu(g, x, mean, rstd, weight, n, gx, gweight, gbias),
                     layer_norm_backward_cuda(g, x, mean, rstd, weight, n, gx, gweight, gbias));
}

}  // namespace cf::kernels
