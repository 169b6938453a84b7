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
// Rows scaled to unit length: y = x * r, r = 1 / sqrt(sum x^2 + eps) per row of n (the sum in
// double). float32/float64, contiguous (rows, n).
void l2_normalize_forward_cpu(const Tensor& x, int64_t n, double eps, const Tensor& y);
// gx = r (g - y (g . y)) with y and r recomputed from x (d y / d x of the forward above).
void l2_normalize_backward_cpu(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx);
#ifdef CF_WITH_CUDA
void l2_normalize_forward_cuda(const Tensor& x, int64_t n, double eps, const Tensor& y);
void l2_normalize_backward_cuda(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx);
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

inline void l2_normalize_forward(const Tensor& x, int64_t n, double eps, const Tensor& y) {
  CF_DEVICE_DISPATCH("l2_normalize", y.device(), l2_normalize_forward_cpu(x, n, eps, y),
                     l2_normalize_forward_cuda(x, n, eps, y));
}
inline void l2_normalize_backward(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx) {
  CF_DEVICE_DISPATCH("l2_normalize", gx.device(), l2_normalize_backward_cpu(g, x, n, eps, gx),
                     l2_normalize_backward_cuda(g, x, n, eps, gx));
}

}  // namespace cf::kernels
