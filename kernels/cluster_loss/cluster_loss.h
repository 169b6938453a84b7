#pragma once
// Neural clustering's two auxiliary losses (ClusterFormer, Wang et al. 2022), each one
// fused pass forward and one backward. Composed of tensor ops they took about 20 kernel
// calls per layer and step, each a launch on the GPU, where a small training step's time
// is its launches (issue 25).
//
// unit(t) = t / max(|t|, 1e-12) along the last axis (a zero row counts as length 1e-12);
// ClusterLossParams says which side each loss puts through it (the cosine form: both;
// the sphere form: the centroids only; the inner form, the paper's phi: neither).
// Every sum is taken in double; tensors are contiguous, float32 or float64, one dtype
// (the op casts 16-bit inputs), on one device.
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// The length below which unit() divides by this floor instead (its gradient there is 1 / floor:
// the clamped length is constant; at the floor itself the length's gradient passes, as clamp's).
inline constexpr double kUnitFloor = 1e-12;

struct ClusterLossParams {
  bool unit_x = false;  // eq. 6's token side through unit()
  bool unit_c = false;  // the centroid side (both sides of eq. 11)
};

// Eq. 6, averaged over the batch: out (0-d) = -(1/B) sum_b (1/n_b) sum_{j valid}
// unit?(x_bj) . unit?(c[b, idx_bj]), 0 when B = 0. x (B, N, D), c (B, k, D), idx int64 (B, N)
// in [0, k) at every valid token (the caller checks), mask bool (B, N) (true = padding) or
// undefined (every token valid). counts (B,) float64 receives n_b = max(valid tokens of
// row b, 1), which the backward takes.
void clustering_loss_forward_cpu(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                 ClusterLossParams p, const Tensor& out, const Tensor& counts);
// The gradients of grad * out (grad 0-d, out's dtype, on the device): dx (B, N, D), or
// undefined when x needs none, and dc (B, k, D). Padding gets 0, a cluster without members 0.
void clustering_loss_backward_cpu(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                  const Tensor& counts, ClusterLossParams p, const Tensor& grad, const Tensor& dx,
                                  const Tensor& dc);
// Eq. 11 with its cyclic term, averaged over the batch: out (0-d) =
// -(1/(B k)) sum_b sum_i unit?(c_bi) . unit?(c_b,(i-1) mod k), 0 when B = 0; c (B, k, D).
void centroid_sorting_loss_forward_cpu(const Tensor& c, bool unit, const Tensor& out);
void centroid_sorting_loss_backward_cpu(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc);
// Routing attention's commitment term (Roy et al. 2021, section 4.1): out (0-d) = scale *
// sum_{b, h, n valid} |x_bhn - mu[h, a_bhn]|^2, x (B, H, N, D), mu (H, C, D), a int64 (B, H, N)
// in [0, C) (the caller's indices; clamped on CUDA), mask bool (B, N) (true = padding) or
// undefined. The sum over each (b, h) row in order, then the rows in order, in double.
void commitment_forward_cpu(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                            const Tensor& out);
// dx = 2 scale grad (x - mu[h, a]) (grad 0-d, x's dtype, on the device), 0 at padding.
void commitment_backward_cpu(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                             const Tensor& grad, const Tensor& dx);
#ifdef CF_WITH_CUDA
void commitment_forward_cuda(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                             const Tensor& out);
void commitment_backward_cuda(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                              const Tensor& grad, const Tensor& dx);
void clustering_loss_forward_cuda(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                  ClusterLossParams p, const Tensor& out, const Tensor& counts);
void clustering_loss_backward_cuda(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                   const Tensor& counts, ClusterLossParams p, const Tensor& grad, const Tensor& dx,
                                   const Tensor& dc);
void centroid_sorting_loss_forward_cuda(const Tensor& c, bool unit, const Tensor& out);
void centroid_sorting_loss_backward_cuda(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc);
#endif

inline void clustering_loss_forward(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                    ClusterLossParams p, const Tensor& out, const Tensor& counts) {
  CF_DEVICE_DISPATCH("clustering_loss", out.device(), clustering_loss_forward_cpu(x, c, idx, mask, p, out, counts),
                     clustering_loss_forward_cuda(x, c, idx, mask, p, out, counts));
}
inline void clustering_loss_backward(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                     const Tensor& counts, ClusterLossParams p, const Tensor& grad, const Tensor& dx,
                                     const Tensor& dc) {
  CF_DEVICE_DISPATCH("clustering_loss", dc.device(),
                     clustering_loss_backward_cpu(x, c, idx, mask, counts, p, grad, dx, dc),
                     clustering_loss_backward_cuda(x, c, idx, mask, counts, p, grad, dx, dc));
}
inline void centroid_sorting_loss_forward(const Tensor& c, bool unit, const Tensor& out) {
  CF_DEVICE_DISPATCH("centroid_sorting_loss", out.device(), centroid_sorting_loss_forward_cpu(c, unit, out),
                     centroid_sorting_loss_forward_cuda(c, unit, out));
}
inline void centroid_sorting_loss_backward(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc) {
  CF_DEVICE_DISPATCH("centroid_sorting_loss", dc.device(), centroid_sorting_loss_backward_cpu(c, unit, grad, dc),
                     centroid_sorting_loss_backward_cuda(c, unit, grad, dc));
}

inline void commitment_forward(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                               const Tensor& out) {
  CF_DEVICE_DISPATCH("commitment_loss", out.device(), commitment_forward_cpu(x, mu, a, mask, scale, out),
                     commitment_forward_cuda(x, mu, a, mask, scale, out));
}
inline void commitment_backward(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                                const Tensor& grad, const Tensor& dx) {
  CF_DEVICE_DISPATCH("commitment_loss", dx.device(), commitment_backward_cpu(x, mu, a, mask, scale, grad, dx),
                     commitment_backward_cuda(x, mu, a, mask, scale, grad, dx));
}

}  // namespace cf::kernels
