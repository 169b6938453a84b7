#pragma once
// The two sparse products of improved clustered attention (Vyas et al. 2020, eq. 11:
// "two sparse dot products, one for every query with the top-k keys and one for the
// top-k attention weights with the corresponding values"). Row n of group g names K
// key rows idx[g, n, :] (repeats allowed); nothing of size N x M is formed.
// Differentiable in their float inputs, never in idx. Kernels: kernels/sparse.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

// out[g, n, t] = sum_d q[g, n, d] * k[g, idx[g, n, t], d]
// q (G, N, D), k (G, M, D), idx int64 (G, N, K) with values in [0, M) -> (G, N, K).
Tensor sparse_dot(const Tensor& q, const Tensor& k, const Tensor& idx);

// out[g, n, :] = sum_t w[g, n, t] * v[g, idx[g, n, t], :]
// w (G, N, K), v (G, M, Dv), idx int64 (G, N, K) -> (G, N, Dv).
Tensor sparse_weighted_sum(const Tensor& w, const Tensor& v, const Tensor& idx);

// Improved clustered attention's exact part (Vyas et al. 2020, eqs. 10-11) for every query at once, one node:
// query i of head (b, h) in cluster a = assignment[b, h, i] attends to its cluster's top keys
// top[b, h, a, :] with the exact scores scale q_i . k_l, softmax over those keys, then
//   out_i = mass[b, h, a] * sum_t P_it v_top[a, t] + rest[b, h, a]
// (mass undefined: 1, rest undefined: 0); a query with a = -1 gets 0. Key l is blocked (weight 0) where
// key_padding_mask[b, l] (bool (B, Nk), true = padding) or, causal, l > i + Nk - Nq; a query whose every
// top key is blocked gets rest[a]. Improved clustered attention passes eq. 9's m_j as mass and the
// centroid attention of the other keys as rest; its causal variant neither.
// q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv) of one float dtype (float32, float64; 16-bit ones are
// cast to float32 under autocast), top int64 (B, H, C, kk) in [0, Nk), assignment int64 (B, H, Nq) in
// [-1, C) (data checks, deferred on CUDA; skipped inside ops::KnownGoodIndices), mass (B, H, C),
// rest (B, H, C, Dv), scale finite and > 0. Differentiable in q, k, v, mass and rest. dropout > 0: inverted dropout of the
// weights P at that rate, drawn from gen as dropout(P, dropout, true, gen) on the (B, H, Nq, kk) weights
// (the same counters; the caller passes 0 outside training). Memory O(N kk), no (Nq, kk) index formed.
// CPU and CUDA (kernels/sparse), sums over queries in a fixed order (the same bits every run).
Tensor cluster_topk_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                              const Tensor& assignment, const Tensor& mass = Tensor(), const Tensor& rest = Tensor(),
                              const Tensor& key_padding_mask = Tensor(), double scale = 1.0, bool causal = false,
                              double dropout = 0.0, Generator& gen = default_generator());

}  // namespace cf
