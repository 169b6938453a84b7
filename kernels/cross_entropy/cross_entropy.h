#pragma once
// Fused cross entropy over a class axis: log-softmax, NLL and label smoothing in
// one pass per sample. logits are contiguous (N, C, inner) in memory (inner = the
// product of the trailing axes, 1 for (N, C)); a sample s = n * inner + i reads
// classes at logits[n * C * inner + c * inner + i]. targets: contiguous int64 (N * inner).
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct CrossEntropyParams {
  int64_t classes = 0;
  int64_t inner = 1;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

// losses[s] = (1 - ls) * (lse_s - x_t) + ls * (lse_s - mean_c x_c), 0 for ignored
// samples, computed as (m - x_t) + log(acc) with m the row's maximum and acc = sum exp(x - m):
// m + log(acc) rounded first lost log(acc) beside large logits (uniform logits of -1e30 gave a
// loss of 0, not log C). `lse` (stats) is (S, 2): [m, log(acc)] per sample, float32 for 16-bit
// logits, else their dtype; the backward takes exp((x - m) - log(acc)), exact where
// exp(x - lse) with lse rounded to the dtype was 3% off at logits near 1e6 in float32.
// Returns the number of samples not ignored. Throws IndexError (before any parallel work) for
// a target outside [0, C) that is not ignore_index.
int64_t cross_entropy_forward_cpu(const Tensor& logits, const Tensor& targets,
                                  const CrossEntropyParams& p, const Tensor& losses,
                                  const Tensor& lse);
// dlogits = grad_s * scale * (softmax - (1 - ls) * onehot(t) - ls / C), zero rows for
// ignored samples. grad holds one value per sample, or a single value for all.
void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& grad, double scale, const CrossEntropyParams& p,
                                const Tensor& dlogits);
#ifdef CF_WITH_CUDA
// The CUDA forward leaves the count on the device: when mean_scale (shape {}; float32
// for 16-bit logits, else the logits' dtype) is defined it receives 1 / count (0 when
// every sample is ignored). A bad target is a deferred check (core/cuda.h):
// IndexError at the next host read.
void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& targets,
                                const CrossEntropyParams& p, const Tensor& losses,
                                const Tensor& lse, const Tensor& mean_scale);
void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& grad, double scale, const CrossEntropyParams& p,
                                 const Tensor& dlogits);
#endif

// Reduction::Mean's scale, 1 / (samples not ignored), 0 when all are ignored: a host
// number on the CPU; on CUDA a device scalar (so the op never waits for the count;
// float32 for 16-bit logits, so the gradient is scaled in float32 as on the CPU),
// with host = 1.
struct MeanScale {
  double host = 1.0;
  Tensor device;
};
inline MeanScale cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       const CrossEntropyParams& p, const Tensor& losses,
                                       const Tensor& lse, bool want_mean_scale) {
  MeanScale m;
  auto on_cpu = [&] {
    const int64_t count = cross_entropy_forward_cpu(logits, targets, p, losses, lse);
    if (want_mean_scale) m.host = count > 0 ? 1.0 / double(count) : 0.0;
  };
#ifdef CF_WITH_CUDA
  auto on_cuda = [&] {
    if (want_mean_scale) {
      const DType dt = is_low_precision(logits.dtype()) ? kFloat32 : logits.dtype();
      m.device = Tensor::empty({}, dt, logits.device());
    }
    cross_entropy_forward_cuda(logits, targets, p, losses, lse, m.device);
  };
#endif
  CF_DEVICE_DISPATCH("cross_entropy", logits.device(), on_cpu(), on_cuda());
  return m;
}
inline void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                   const Tensor& grad, double scale, const CrossEntropyParams& p,
                                   const Tensor& dlogits) {
  CF_DEVICE_DISPATCH("cross_entropy", logits.device(),
                     cross_entropy_backward_cpu(logits, targets, lse, grad, scale, p, dlogits),
                     cross_entropy_backward_cuda(logits, targets, lse, grad, scale, p, dlogits));
}

}  // namespace cf::kernels
