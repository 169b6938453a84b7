// CUDA arm of the sparse products (kernels/sparse/sparse.h), the same
// contracts as sparse_cpu.cpp:
//  - sparse products: a thread per output element, summing in the CPU's order;
//  - scatter: the terms grouped by destination row (kernels/common/segments.h,
//    stable: increasing (n, t), the CPU's order), then a thread per (row,
//    column) adds its terms; no floating-point atomics, the same bits every run.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/rng.h"
#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/segments.h"
#include "kernels/sparse/sparse.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
using cu::kWarp;

template <typename T>
__global__ void sparse_dot_kernel(const T* q, const T* k, const int64_t* idx, T* out, int64_t total, int64_t n,
                                  int64_t m, int64_t kk, int64_t d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / kk;  // row g * n + i
    const T* qr = q + r * d;
    const T* kr = k + ((r / n) * m + cu::clamp_index(idx[e], m)) * d;
    T s = 0;
    for (int64_t j = 0; j < d; ++j) s += qr[j] * kr[j];
    out[e] = s;
  }
}

template <typename T>
__global__ void sparse_wsum_kernel(const T* w, const T* v, const int64_t* idx, T* out, int64_t total, int64_t n,
                                   int64_t m, int64_t kk, int64_t d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / d, j = e % d;
    const T* vg = v + (r / n) * m * d;
    T s = 0;
    for (int64_t t = 0; t < kk; ++t) {
      const T c = w[r * kk + t];
      if (c == T(0)) continue;
      s += c * vg[cu::clamp_index(idx[r * kk + t], m) * d + j];
    }
    out[e] = s;
  }
}

// key of term (r, t) = g * m + idx[r, t]: its destination row in the (G * M, D) output.
__global__ void scatter_keys_kernel(const int64_t* idx, int64_t total, int64_t n, int64_t m, int64_t kk,
                                    uint64_t* keys) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step)
    keys[e] = uint64_t((e / kk / n) * m + cu::clamp_index(idx[e], m));
}

// out row `row`, column j: the sum over its terms (in `order`, increasing (n, t))
// of c[term] * x[term's query row][j]; terms with c == 0 skipped, as on the CPU. Added to out's
// value, or (from_zero) to 0: every row is written, so out needs no fill first.
template <typename T>
__global__ void scatter_sum_kernel(const T* c, const T* x, const int64_t* order, const int64_t* start,
                                   const int64_t* count, int64_t rows, int64_t kk, int64_t d, T* out,
                                   bool from_zero = false) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t p0 = start[row], p1 = p0 + count[row];
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      T s = from_zero ? T(0) : out[row * d + j];
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t term = order[p];
        const T cv = c[term];
        if (cv == T(0)) continue;
        s += cv * x[(term / kk) * d + j];
      }
      out[row * d + j] = s;
    }
  }
}

}  // namespace

void sparse_dot_cuda(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  const int64_t n = q.size(1), d = q.size(2), m = k.size(1), kk = idx.size(2), total = out.numel();
  if (total == 0) return;
  cu::use_device_of(q, "sparse_dot");
  CF_DISPATCH_FLOAT_STD(q.dtype(), "sparse_dot",
                        (sparse_dot_kernel<scalar_t><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(q), cu::ptr<scalar_t>(k), cu::ptr<int64_t>(idx), cu::ptr<scalar_t>(out),
                            total, n, m, kk, d)));
  ::cf::cuda::check_launch("sparse_dot");
}

void sparse_weighted_sum_cuda(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  const int64_t n = w.size(1), kk = w.size(2), m = v.size(1), d = v.size(2), total = out.numel();
  if (total == 0) return;
  cu::use_device_of(w, "sparse_weighted_sum");
  CF_DISPATCH_FLOAT_STD(w.dtype(), "sparse_weighted_sum",
                        (sparse_wsum_kernel<scalar_t><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(w), cu::ptr<scalar_t>(v), cu::ptr<int64_t>(idx), cu::ptr<scalar_t>(out),
                            total, n, m, kk, d)));
  ::cf::cuda::check_launch("sparse_weighted_sum");
}

void sparse_scatter_rows_cuda(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  const int64_t g = c.size(0), n = c.size(1), kk = c.size(2), d = x.size(2), m = out.size(1);
  const int64_t terms = g * n * kk, rows = g * m;
  if (terms == 0 || rows == 0 || d == 0) return;
  const Device dev = x.device();
  cu::use_device_of(x, "sparse_scatter_rows");
  Tensor keys = Tensor::empty({terms}, kInt64, dev);
  uint64_t* kp = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(keys));
  scatter_keys_kernel<<<cu::grid_for(terms), kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<int64_t>(idx), terms, n, m,
                                                                                  kk, kp);
  ::cf::cuda::check_launch("sparse_scatter_rows");
  Tensor order = Tensor::empty({terms}, kInt64, dev), start = Tensor::empty({rows}, kInt64, dev),
         count = Tensor::empty({rows}, kInt64, dev);
  segments_by_key_cuda(kp, terms, rows, order, start, count, "sparse_scatter_rows");
  const int threads = int(std::min<int64_t>(kThreads, (d + kWarp - 1) / kWarp * kWarp));
  CF_DISPATCH_FLOAT_STD(x.dtype(), "sparse_scatter_rows",
                        (scatter_sum_kernel<scalar_t><<<cu::blocks_for(rows), threads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(c), cu::ptr<scalar_t>(x), cu::ptr<int64_t>(order),
                            cu::ptr<int64_t>(start), cu::ptr<int64_t>(count), rows, kk, d, cu::ptr<scalar_t>(out))));
  ::cf::cuda::check_launch("sparse_scatter_rows");
}

// ---------------------------------------------------------------- cluster_topk_attention
// A warp per query row (lanes over the head's columns, a shuffle sum per score): the forward with an
// online softmax, the backward's row step (dq, and per (row, t) dS and Z for the scatters); then the sums
// over queries grouped by destination (segments_by_key_cuda, stable: increasing (i, t), the CPU's
// order) and added by scatter_sum_kernel, as sparse_scatter_rows does: no floating-point atomics.

namespace cluster_topk_cuda {

constexpr int kRowWarps = 4;  // warps (query rows) per block

template <typename T>
using Rows = ClusterTopkArgs<T>;

// sum_j a[j] b[j], every lane of the warp gets it.
template <typename T>
__device__ __forceinline__ T warp_dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t j = threadIdx.x % cu::kWarp; j < n; j += cu::kWarp) s += a[j] * b[j];
  for (int o = cu::kWarp / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Key t of a row's list: its position (clamped: the indices' check is deferred) and whether it is blocked.
template <typename T>
__device__ __forceinline__ int64_t key_at(const Rows<T>& a, const int64_t* keys, int64_t t, int64_t g, int64_t i,
                                          bool& blocked) {
  const int64_t l = cu::clamp_index(keys[t], a.Nk);
  blocked = (a.kpm && a.kpm[(g / a.heads) * a.Nk + l]) || (a.causal && l > i + a.Nk - a.Nq);
  return l;
}

// The dropout factor of weight (row, t): 0 (dropped) or 1 / (1 - rate); 1 without dropout.
template <typename T>
__device__ __forceinline__ T keep_factor(const Rows<T>& a, int64_t row, int64_t t) {
  if (a.rate <= 0) return T(1);
  const PhiloxOut r = philox4x32_10(philox_seed_at(a.seed, a.rebase),
                                    philox_counter0_at(a.counter0, a.rebase) + uint64_t(row * a.kk + t));
  return philox_uniform_d(r) < a.rate ? T(0) : a.keep_scale;
}

template <typename T>
__global__ void forward_kernel(Rows<T> a, int64_t rows, T* out, T* o, T* P) {
  const int lane = threadIdx.x % cu::kWarp;
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / cu::kWarp; row < rows; row += step) {
    T* orow = o + row * a.Dv;
    T* out_r = out + row * a.Dv;
    T* pr = P + row * a.kk;  // the scores first (lane 0), then the weights (below)
    for (int64_t j = lane; j < a.Dv; j += cu::kWarp) orow[j] = 0;
    const int64_t c = a.assign[row];
    if (c < 0) {
      for (int64_t j = lane; j < a.Dv; j += cu::kWarp) out_r[j] = 0;
      for (int64_t t = lane; t < a.kk; t += cu::kWarp) pr[t] = 0;
      continue;
    }
    const int64_t g = row / a.Nq, i = row % a.Nq, cc = cu::clamp_index(c, a.C);
    const int64_t* keys = a.top + (g * a.C + cc) * a.kk;
    const T* qr = a.q + row * a.D;
    const T* kg = a.k + g * a.Nk * a.D;
    const T* vg = a.v + g * a.Nk * a.Dv;
    T m = -INFINITY, l = 0;
    for (int64_t t = 0; t < a.kk; ++t) {
      bool blocked;
      const int64_t key = key_at(a, keys, t, g, i, blocked);
      if (blocked) {  // the same answer on every lane
        if (lane == 0) pr[t] = T(-INFINITY);
        continue;
      }
      T s = a.scale * warp_dot(qr, kg + key * a.D, a.D);
      if (s == T(INFINITY)) s = T(NAN);  // exp(inf - inf): the CPU's (and a dense softmax's) NaN row
      if (lane == 0) pr[t] = s;
      if (s == T(-INFINITY)) continue;  // weight 0, as on the CPU (exp(-inf - -inf) would be NaN while m is -inf)
      T p;
      if (s > m || s != s) {  // a new maximum (or NaN, which absorbs: the row becomes NaN, as on the CPU):
                              // rescale what was summed (exp(-inf) = 0 the first time)
        const T alpha = exp(m - s);
        m = s;
        l = l * alpha + T(1);
        p = T(1);
        for (int64_t j = lane; j < a.Dv; j += cu::kWarp) orow[j] *= alpha;
      } else {
        p = exp(s - m);  // NaN scores make the row NaN
        l += p;
      }
      const T kf = keep_factor(a, row, t);
      const T z = kf == T(0) ? T(0) : p * kf;  // dropped: exactly 0, a NaN weight too (as the CPU's dropout)
      if (z != T(0)) {
        const T* vr = vg + key * a.Dv;
        for (int64_t j = lane; j < a.Dv; j += cu::kWarp) orow[j] += z * vr[j];
      }
    }
    const bool none = m == -INFINITY;
    const T lse = m + log(l);
    __syncwarp();  // lane 0's scores before every lane turns its share into weights
    for (int64_t t = lane; t < a.kk; t += cu::kWarp) pr[t] = none ? T(0) : exp(pr[t] - lse);  // blocked: 0
    const T mass = a.mass ? a.mass[g * a.C + cc] : T(1);
    const T* rr = a.rest ? a.rest + (g * a.C + cc) * a.Dv : nullptr;
    for (int64_t j = lane; j < a.Dv; j += cu::kWarp) {
      const T ov = none ? T(0) : orow[j] / l;
      orow[j] = ov;
      out_r[j] = mass * ov + (rr ? rr[j] : T(0));
    }
  }
}

// The backward's row step: dq (written), and per (row, t): dS, Z and the term's destination key
// g Nk + l; per row: do = mass dout, dout . o and the row's cluster key g (C + 1) + (a, or C for none).
template <typename T>
__global__ void rows_grad_kernel(Rows<T> a, int64_t rows, const T* o, const T* P, const T* gout, T* dq, T* ds,
                                 T* zs, T* dos, T* go, uint64_t* term_keys, uint64_t* row_keys) {
  const int lane = threadIdx.x % cu::kWarp;
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / cu::kWarp; row < rows; row += step) {
    const int64_t g = row / a.Nq, c = a.assign[row], cc = cu::clamp_index(c, a.C);
    const int64_t* keys = a.top + (g * a.C + cc) * a.kk;
    const T* gr = gout + row * a.Dv;
    const T* orow = o + row * a.Dv;
    T* dqr = dq + row * a.D;
    T* dor = dos + row * a.Dv;
    const T mass = c >= 0 && a.mass ? a.mass[g * a.C + cc] : T(1);
    for (int64_t j = lane; j < a.D; j += cu::kWarp) dqr[j] = 0;
    for (int64_t j = lane; j < a.Dv; j += cu::kWarp) dor[j] = mass * gr[j];
    for (int64_t t = lane; t < a.kk; t += cu::kWarp) {
      ds[row * a.kk + t] = 0;
      zs[row * a.kk + t] = 0;
      term_keys[row * a.kk + t] = uint64_t(g * a.Nk + (c >= 0 ? cu::clamp_index(keys[t], a.Nk) : 0));
    }
    const T gdo = warp_dot(gr, orow, a.Dv);
    if (lane == 0) {
      go[row] = gdo;
      row_keys[row] = uint64_t(g * (a.C + 1) + (c >= 0 ? cc : a.C));
    }
    __syncwarp();  // the zeros of ds and zs above before lane 0 writes its entries below
    if (c < 0) continue;
    const T Drow = warp_dot(dor, orow, a.Dv);  // rowsum(Z dZ) = do . o
    const T* kg = a.k + g * a.Nk * a.D;
    const T* vg = a.v + g * a.Nk * a.Dv;
    const T* pr = P + row * a.kk;  // the forward's weights: no score recomputed
    for (int64_t t = 0; t < a.kk; ++t) {
      const T w = pr[t];
      if (w == T(0)) continue;  // blocked, nothing allowed or underflowed: dS = 0 (the same on every lane)
      const int64_t key = cu::clamp_index(keys[t], a.Nk);
      const T keep = keep_factor(a, row, t);
      const T dZ = warp_dot(dor, vg + key * a.Dv, a.Dv);
      const T d = keep == T(0) ? T(0) : dZ * keep;  // dropped: no gradient through it, as on the CPU
      const T dS = a.scale * (w * (d - Drow));
      const T* kr = kg + key * a.D;
      for (int64_t j = lane; j < a.D; j += cu::kWarp) dqr[j] += dS * kr[j];
      if (lane == 0) {
        ds[row * a.kk + t] = dS;
        zs[row * a.kk + t] = keep == T(0) ? T(0) : w * keep;  // (a dropped NaN weight adds nothing to dv)
      }
    }
  }
}

// Cluster row r = g (C + 1) + a (a < C; a = C collects the queries without a cluster, dropped): drest[g, a, j]
// = the sum of its members' dout rows, dmass[g, a] = the sum of their dout . o, members in increasing i.
template <typename T>
__global__ void cluster_sums_kernel(const T* gout, const T* go, const int64_t* order, const int64_t* start,
                                    const int64_t* count, int64_t rows, int64_t C, int64_t Dv, T* dmass,
                                    T* drest) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t g = r / (C + 1), cl = r % (C + 1);
    if (cl == C) continue;
    const int64_t p0 = start[r], p1 = p0 + count[r];
    for (int64_t j = threadIdx.x; j <= Dv; j += blockDim.x) {
      if (j == Dv && !dmass) continue;
      if (j < Dv && !drest) continue;
      T s = 0;
      for (int64_t p = p0; p < p1; ++p) s += j < Dv ? gout[order[p] * Dv + j] : go[order[p]];
      if (j < Dv) drest[(g * C + cl) * Dv + j] = s;
      else dmass[g * C + cl] = s;
    }
  }
}

}  // namespace cluster_topk_cuda

void cluster_topk_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                               const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                               const ClusterTopkParams& p, const Tensor& out, const Tensor& o, const Tensor& P) {
  using namespace cluster_topk_cuda;
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  if (rows == 0) return;
  cu::use_device_of(q, "cluster_topk_attention");
  CF_DISPATCH_FLOAT_STD(q.dtype(), "cluster_topk_attention", {
    const auto a = cluster_topk_args<scalar_t>(q, k, v, top, assign, mass, rest, kpm, p);
    forward_kernel<scalar_t><<<cu::grid_for(rows, kRowWarps), kRowWarps * cu::kWarp, 0, ::cf::cuda::stream()>>>(
        a, rows, cu::ptr<scalar_t>(out), cu::ptr<scalar_t>(o), cu::ptr<scalar_t>(P));
  });
  ::cf::cuda::check_launch("cluster_topk_attention");
}

void cluster_topk_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                                const Tensor& assign, const Tensor& mass, const Tensor& kpm,
                                const ClusterTopkParams& p, const Tensor& o, const Tensor& P, const Tensor& dout,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmass,
                                const Tensor& drest) {
  using namespace cluster_topk_cuda;
  const char* op = "cluster_topk_attention";
  const int64_t G = q.size(0) * q.size(1), Nq = q.size(2), Nk = k.size(2), D = q.size(3), Dv = v.size(3);
  const int64_t C = top.size(2), kk = top.size(3), rows = G * Nq, terms = rows * kk;
  const Device dev = q.device();
  cu::use_device_of(q, op);
  CF_CHECK(terms <= INT32_MAX && rows <= INT32_MAX, ValueError, "[", op, "] at most 2^31 - 1 (query, key) terms on CUDA, got ",
           terms);
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, {
    using T = scalar_t;
    const auto a = cluster_topk_args<T>(q, k, v, top, assign, mass, Tensor(), kpm, p);
    Tensor ds = Tensor::empty({std::max<int64_t>(terms, 1)}, q.dtype(), dev), zs = Tensor::empty({std::max<int64_t>(terms, 1)}, q.dtype(), dev);
    Tensor dos = Tensor::empty({std::max<int64_t>(rows * Dv, 1)}, q.dtype(), dev), go = Tensor::empty({std::max<int64_t>(rows, 1)}, q.dtype(), dev);
    Tensor term_keys = Tensor::empty({std::max<int64_t>(terms, 1)}, kInt64, dev), row_keys = Tensor::empty({std::max<int64_t>(rows, 1)}, kInt64, dev);
    uint64_t* tk = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(term_keys));
    uint64_t* rk = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(row_keys));
    if (rows > 0) {
      rows_grad_kernel<T><<<cu::grid_for(rows, kRowWarps), kRowWarps * cu::kWarp, 0, ::cf::cuda::stream()>>>(
          a, rows, cu::ptr<T>(o), cu::ptr<T>(P), cu::ptr<T>(dout), cu::ptr<T>(dq), cu::ptr<T>(ds), cu::ptr<T>(zs),
          cu::ptr<T>(dos), cu::ptr<T>(go), tk, rk);
      ::cf::cuda::check_launch(op);
    }
    // dk and dv: each key row's terms in increasing (i, t); every row written (from zero).
    const int64_t key_rows = G * Nk;
    if (key_rows > 0) {
      Tensor order = Tensor::empty({std::max<int64_t>(terms, 1)}, kInt64, dev), start = Tensor::empty({key_rows}, kInt64, dev),
             count = Tensor::empty({key_rows}, kInt64, dev);
      segments_by_key_cuda(tk, terms, key_rows, order, start, count, op);
      const int64_t* po = cu::ptr<int64_t>(order);
      const int64_t* ps = cu::ptr<int64_t>(start);
      const int64_t* pc = cu::ptr<int64_t>(count);
      auto threads_for = [](int64_t d) { return int(std::max<int64_t>(cu::kWarp, std::min<int64_t>(kThreads, (d + kWarp - 1) / kWarp * kWarp))); };
      if (D > 0) {
        scatter_sum_kernel<T><<<cu::blocks_for(key_rows), threads_for(D), 0, ::cf::cuda::stream()>>>(
            cu::ptr<T>(ds), cu::ptr<T>(q), po, ps, pc, key_rows, kk, D, cu::ptr<T>(dk), true);
        ::cf::cuda::check_launch(op);
      }
      if (Dv > 0) {
        scatter_sum_kernel<T><<<cu::blocks_for(key_rows), threads_for(Dv), 0, ::cf::cuda::stream()>>>(
            cu::ptr<T>(zs), cu::ptr<T>(dos), po, ps, pc, key_rows, kk, Dv, cu::ptr<T>(dv), true);
        ::cf::cuda::check_launch(op);
      }
    }
    // dmass and drest: each cluster's members in increasing i.
    if ((dmass.defined() || drest.defined()) && G * C > 0) {
      const int64_t cluster_rows = G * (C + 1);
      Tensor order = Tensor::empty({std::max<int64_t>(rows, 1)}, kInt64, dev), start = Tensor::empty({cluster_rows}, kInt64, dev),
             count = Tensor::empty({cluster_rows}, kInt64, dev);
      segments_by_key_cuda(rk, rows, cluster_rows, order, start, count, op);
      const int threads = int(std::min<int64_t>(kThreads, (Dv + 1 + kWarp - 1) / kWarp * kWarp));
      cluster_sums_kernel<T><<<cu::blocks_for(cluster_rows), threads, 0, ::cf::cuda::stream()>>>(
          cu::ptr<T>(dout), cu::ptr<T>(go), cu::ptr<int64_t>(order), cu::ptr<int64_t>(start), cu::ptr<int64_t>(count),
          cluster_rows, C, Dv, dmass.defined() ? cu::ptr<T>(dmass) : nullptr,
          drest.defined() ? cu::ptr<T>(drest) : nullptr);
      ::cf::cuda::check_launch(op);
    }
  });
}

}  // namespace cf::kernels
