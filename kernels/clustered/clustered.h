#pragma once
// Kernels of clustered attention (Vyas et al. 2020; nn/attention/clustered.h,
// hamming_kmeans.h, sparse_products.h own validation and autograd): the sign
// hashing of the queries, K-Means in Hamming space on the codes, and the two
// sparse products of improved clustered attention with their transpose (the
// scatter of their backward). CPU arm clustered_cpu.cpp, CUDA arm clustered_cuda.cu.
// Every tensor contiguous and on one device; outputs preallocated.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// out[r] = sum over b < bits of (proj[r, b] > 0) << b; proj (rows, bits) float, out (rows,) int64.
void hash_pack_signs_cpu(const Tensor& proj, const Tensor& out);

// Hamming K-Means of each row of codes (G, N) int64 over its entries that
// exclude (G, N) bool (or undefined) does not mark; excluded entries get -1. The
// algorithm and its tie rules: nn/attention/hamming_kmeans.h. out (G, N) int64.
void hamming_kmeans_cpu(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                        int64_t bits, const Tensor& out);

// out[g, n, t] = sum_d q[g, n, d] * k[g, idx[g, n, t], d]; out (G, N, K).
void sparse_dot_cpu(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out);
// out[g, n, :] = sum_t w[g, n, t] * v[g, idx[g, n, t], :] (terms with w == 0 skipped); out (G, N, Dv).
void sparse_weighted_sum_cpu(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out);
// out[g, idx[g, n, t], :] += c[g, n, t] * x[g, n, :] (c == 0 skipped) into out (G, M, D),
// which the caller zeroes. Each output row receives its terms in increasing (n, t)
// on both devices, so the result does not depend on the thread count.
void sparse_scatter_rows_cpu(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out);

#ifdef CF_WITH_CUDA
void hash_pack_signs_cuda(const Tensor& proj, const Tensor& out);
void hamming_kmeans_cuda(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                         int64_t bits, const Tensor& out);
void sparse_dot_cuda(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out);
void sparse_weighted_sum_cuda(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out);
void sparse_scatter_rows_cuda(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out);
#endif

inline void hash_pack_signs(const Tensor& proj, const Tensor& out) {
  CF_DEVICE_DISPATCH("hash_codes", proj.device(), hash_pack_signs_cpu(proj, out), hash_pack_signs_cuda(proj, out));
}
inline void hamming_kmeans(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                           int64_t bits, const Tensor& out) {
  CF_DEVICE_DISPATCH("hamming_kmeans", codes.device(),
                     hamming_kmeans_cpu(codes, exclude, clusters, iterations, bits, out),
                     hamming_kmeans_cuda(codes, exclude, clusters, iterations, bits, out));
}
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
