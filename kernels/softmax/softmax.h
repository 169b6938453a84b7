#pragma once
// Fused softmax / log_softmax along one axis: one kernel forward, one backward.
// Inputs may be any strided view; outputs are preallocated, contiguous, with
// the input's shape. Rows are the 1-d lines along `axis` (already normalised).
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// y = softmax(x) (log = false) or log_softmax(x) (log = true) along axis.
// Stable: the row maximum is subtracted before exp; float32 sums in double.
void softmax_forward_cpu(const Tensor& x, int64_t axis, bool log, const Tensor& y);
// gx from the saved output y and the incoming gradient g:
//   softmax:     gx = y * (g - sum(g * y))
//   log_softmax: gx = g - exp(y) * sum(g)
void softmax_backward_cpu(const Tensor& y, const Tensor& g, int64_t axis, bool log,
                          const Tensor& gx);
#ifdef CF_WITH_CUDA
void softmax_forward_cuda(const Tensor& x, int64_t axis, bool log, const Tensor& y);
void softmax_backward_cuda(const Tensor& y, const Tensor& g, int64_t axis, bool log,
                           const Tensor& gx);
#endif

inline void softmax_forward(const Tensor& x, int64_t axis, bool log, const Tensor& y) {
  CF_DEVICE_DISPATCH(log ? "log_softmax" : "softmax", y.device(),
                     softmax_forward_cpu(x, axis, log, y), softmax_forward_cuda(x, axis, log, y));
}
inline void softmax_backward(const Tensor& y, const Tensor& g, int64_t axis, bool log,
                             const Tensor& gx) {
  CF_DEVICE_DISPATCH(log ? "log_softmax" : "softmax", gx.device(),
                     softmax_backward_cpu(y, g, axis, log, gx),
                     softmax_backward_cuda(y, g, axis, log, gx));
}

}  // namespace cf::kernels
