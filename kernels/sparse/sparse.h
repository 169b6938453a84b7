#pragma once
// Sparse products over gathered rows (improved clustered attention's top-k
// products, Vyas et al. 2020, eq. 11) and their transpose, the scatter of their
// backward. autograd/ops/sparse.h owns validation and autograd; CPU arm
// sparse_cpu.cpp, CUDA arm sparse_cuda.cu. Every tensor contiguous and on one
// device; outputs preallocated.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// out[g, n, t] = sum_d q[g, n, d] * k[g, idx[g, n, t], d]; out (G, N, K).
void sparse_dot_cpu(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out);
// out[g, n, :] = sum_t w[g, n, t] * v[g, idx[g, n, t], :] (terms with w == 0 skipped); out (G, N, Dv).
void sparse_weighted_sum_cpu(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out);
// out[g, idx[g, n, t], :] += c[g, n, t] * x[g, n, :] (c == 0 skipped) into out (G, M, D),
// which the caller zeroes. Each output row receives its terms in increasing (n, t)
// on both devices, so the result does not depend on the thread count.
void sparse_scatter_rows_cpu(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out);

#ifdef CF_WITH_CUDA
void sparse_dot_cuda(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out);
void sparse_weighted_sum_cuda(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out);
void sparse_scatter_rows_cuda(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out);
#endif

inline void sparse_dot(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  CF_DEVICE_DISPATCH("sparse_dot", q.device(), sparse_dot_cpu(q, k, idx, out), sparse_dot_cuda(q, k, idx, out));
}
inline void sparse_weighted_sum(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  CF_DEVICE_DISPATCH("sparse_weighted_sum", w.device(), sparse_weighted_sum_cpu(w, v, idx, out),
                     sparse_weighted_sum_cuda(w, v, idx, out));
}
inline void sparse_scatter_rows(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  CF_DEVICE_DISPATCH("sparse_scatter_rows", x.device(), sparse_scatter_rows_cpu(c, x, idx, out),
                     sparse_scatter_rows_cuda(c, x, idx, out));
}

}  // namespace cf::kernels
