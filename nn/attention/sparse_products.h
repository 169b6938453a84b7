#pragma once
// The two sparse products of improved clustered attention (Vyas et al. 2020, eq. 11:
// "two sparse dot products, one for every query with the top-k keys and one for the
// top-k attention weights with the corresponding values"). Each row n of a group g
// names K key positions idx[g, n, :]; nothing of size N x N is formed.
// Kernels on the CPU and CUDA: kernels/clustered/clustered.h.
// Both are differentiable in their float inputs, never in idx; they record nodes
// named "sparse_dot" and "sparse_weighted_sum" (local to clustered attention, so not
// in the op registry; tests/nn/test_clustered_attention.cpp gradchecks both).
#include "core/tensor.h"

namespace cf {
namespace nn {

// out[g, n, t] = sum_d q[g, n, d] * k[g, idx[g, n, t], d]
// q (G, N, D), k (G, M, D), idx int64 (G, N, K) with values in [0, M) -> (G, N, K).
Tensor sparse_dot(const Tensor& q, const Tensor& k, const Tensor& idx);

// out[g, n, :] = sum_t w[g, n, t] * v[g, idx[g, n, t], :]
// w (G, N, K), v (G, M, Dv), idx int64 (G, N, K) -> (G, N, Dv).
Tensor sparse_weighted_sum(const Tensor& w, const Tensor& v, const Tensor& idx);

}  // namespace nn
}  // namespace cf
