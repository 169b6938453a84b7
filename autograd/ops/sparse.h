#pragma once
// The two sparse products of improved clustered attention (Vyas et al. 2020, eq. 11:
// "two sparse dot products, one for every query with the top-k keys and one for the
// top-k attention weights with the corresponding values"). Row n of group g names K
// key rows idx[g, n, :] (repeats allowed); nothing of size N x M is formed.
// Differentiable in their float inputs, never in idx. Kernels: kernels/sparse.
#include "core/tensor.h"

namespace cf {

// out[g, n, t] = sum_d q[g, n, d] * k[g, idx[g, n, t], d]
// q (G, N, D), k (G, M, D), idx int64 (G, N, K) with values in [0, M) -> (G, N, K).
Tensor sparse_dot(const Tensor& q, const Tensor& k, const Tensor& idx);

// out[g, n, :] = sum_t w[g, n, t] * v[g, idx[g, n, t], :]
// w (G, N, K), v (G, M, Dv), idx int64 (G, N, K) -> (G, N, Dv).
Tensor sparse_weighted_sum(const Tensor& w, const Tensor& v, const Tensor& idx);

}  // namespace cf
