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

// Improved clustered attention's exact part for every query at once (autograd/ops/sparse.h,
// cluster_topk_attention). q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv), top (B, H, C, kk), assign
// (B, H, Nq), mass (B, H, C), rest (B, H, C, Dv); below, group g = b H + h (H = heads) and (G, ...) their views.
// query i of group g is in cluster a = assign[g, i] (-1: none) and attends to the keys
// top[g, a, 0 .. kk-1] with the scores scale q_i . k_l; key l is blocked where key_padding_mask[b, l]
// ((B, Nk), or undefined) or, causal, l > i + Nk - Nq. Softmax over the allowed keys (P), then dropout
// (the weight (g, i, t) dropped when the Philox draw of counter dropout_counter0 + (g Nq + i) kk + t
// under dropout_seed falls below the rate, the rest scaled by 1 / (1 - rate): the counters dropout()
// gives entry (g, i, t) of the (G, Nq, kk) weights); Z the weights after it.
//   o_i = sum_t Z_it v_top[a, t];  out_i = mass[g, a] o_i + rest[g, a]  (mass undefined: 1, rest: 0);
//   P (G, Nq, kk) written too, for the backward: 0 at blocked keys (a row with a NaN score: NaN throughout);
//   nothing allowed: o = 0 and P = 0;
//   a = -1: out = o = 0, P = 0.
// Every tensor contiguous, on one device, indices in range (the op checks them); outputs preallocated.
struct ClusterTopkParams {
  int64_t heads = 1;
  double scale = 1.0;
  bool causal = false;
  double dropout = 0.0;
  uint64_t dropout_seed = 0, dropout_counter0 = 0;
  const uint64_t* dropout_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
};
// One call's operands as raw pointers and sizes, shared by both arms (built on the host, passed by value to
// the CUDA kernels). mass, rest and kpm null when undefined; threshold (the CPU arm's integer form of the rate,
// kernels/common/row_math.h's dropout_threshold) left 0 here.
template <typename T>
struct ClusterTopkArgs {
  const T *q, *k, *v, *mass, *rest;
  const int64_t *top, *assign;
  const bool* kpm;
  int64_t Nq, Nk, D, Dv, C, kk, heads;
  T scale;
  bool causal;
  double rate;
  uint64_t seed, counter0, threshold;
  T keep_scale;
  const uint64_t* rebase;  // (ClusterTopkParams::dropout_rebase)
};
template <typename T>
ClusterTopkArgs<T> cluster_topk_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                                     const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                                     const ClusterTopkParams& p) {
  auto raw = [](const Tensor& t) { return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr; };
  return {raw(q), raw(k), raw(v), raw(mass), raw(rest), static_cast<const int64_t*>(top.raw_data()),
          static_cast<const int64_t*>(assign.raw_data()),
          kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr, q.size(2), k.size(2), q.size(3),
          v.size(3), top.size(2), top.size(3), p.heads, T(p.scale), p.causal, p.dropout, p.dropout_seed,
          p.dropout_counter0, 0, T(p.dropout > 0 ? 1.0 / (1.0 - p.dropout) : 1.0), p.dropout_rebase};
}
void cluster_topk_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                              const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                              const ClusterTopkParams& p, const Tensor& out, const Tensor& o, const Tensor& P);
// The backward from dout (G, Nq, Dv) contiguous, o and P as the forward wrote them (the weights are read, not
// recomputed from the scores): writes (overwrites) dq,
// dk, dv (q, k, v's shapes) and, where defined, dmass (G, C) and drest (G, C, Dv). With do_i = mass_a dout_i:
//   dS_it = scale P_it (dZ'_it - do_i . o_i), dZ'_it = do_i . v_t / (1 - rate) where kept, else 0;
//   dq_i = sum_t dS_it k_t;  dk_l += dS_it q_i and dv_l += Z_it do_i over the (i, t) with top[a, t] = l;
//   dmass_a = sum_{i in a} dout_i . o_i;  drest_a = sum_{i in a} dout_i.
// Every sum over queries runs in increasing (i, t) on both devices (no floating-point atomics).
void cluster_topk_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                               const Tensor& assign, const Tensor& mass, const Tensor& kpm,
                               const ClusterTopkParams& p, const Tensor& o, const Tensor& P, const Tensor& dout,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmass,
                               const Tensor& drest);

#ifdef CF_WITH_CUDA
void cluster_topk_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                               const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                               const ClusterTopkParams& p, const Tensor& out, const Tensor& o, const Tensor& P);
void cluster_topk_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                                const Tensor& assign, const Tensor& mass, const Tensor& kpm,
                                const ClusterTopkParams& p, const Tensor& o, const Tensor& P, const Tensor& dout,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmass,
                                const Tensor& drest);
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

inline void cluster_topk_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                                 const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                                 const ClusterTopkParams& p, const Tensor& out, const Tensor& o, const Tensor& P) {
  CF_DEVICE_DISPATCH("cluster_topk_attention", q.device(),
                     cluster_topk_forward_cpu(q, k, v, top, assign, mass, rest, kpm, p, out, o, P),
                     cluster_topk_forward_cuda(q, k, v, top, assign, mass, rest, kpm, p, out, o, P));
}
inline void cluster_topk_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                                  const Tensor& assign, const Tensor& mass, const Tensor& kpm,
                                  const ClusterTopkParams& p, const Tensor& o, const Tensor& P, const Tensor& dout,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmass,
                                  const Tensor& drest) {
  CF_DEVICE_DISPATCH(
      "cluster_topk_attention", q.device(),
      cluster_topk_backward_cpu(q, k, v, top, assign, mass, kpm, p, o, P, dout, dq, dk, dv, dmass, drest),
      cluster_topk_backward_cuda(q, k, v, top, assign, mass, kpm, p, o, P, dout, dq, dk, dv, dmass, drest));
}

}  // namespace cf::kernels
