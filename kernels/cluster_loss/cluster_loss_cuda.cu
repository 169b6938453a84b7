// CUDA arm of the fused neural clustering losses: the contract and the CPU reference are
// cluster_loss.h and cluster_loss_cpu.cpp. Every sum runs in double in a fixed order
// (warp and block trees of fixed shape, then the partials in order): results do not depend
// on scheduling, and no value comes back to the host (the gradient's scale is read on the
// device). Launches: eq. 6 forward 2, backward 2; eq. 11 forward 2, backward 1.
//
// Eq. 6 forward: blocks over (sequence, run of kTokens tokens), a warp per token (lanes
// along D), a partial sum and count per block; a one-block kernel adds each sequence's
// partials in order and the sequences' means. Backward: a warp per token writes dx (and
// the token's unit() scale); a block per (sequence, cluster) scans the sequence's cluster
// ids through shared memory and sums its members' rows in token order (no atomics), then
// projects through unit()'s Jacobian.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cluster_loss/cluster_loss.h"
#include "kernels/common/cuda_utils.cuh"

namespace cf::kernels {

namespace cluster_loss_cuda {
namespace {

using cu::kThreads;
using cu::kWarp;
constexpr int64_t kTokens = 64;  // tokens per block of eq. 6's forward

// (not fmax, which drops a NaN: a NaN length gives a NaN scale, as std::max does on the CPU)
__device__ __forceinline__ double unit_scale(double len) { return 1.0 / (len < kUnitFloor ? kUnitFloor : len); }

// All lanes of the warp get the sum (a fixed xor tree).
__device__ __forceinline__ double warp_sum(double v) { return cu::WarpRow{}.sum(v); }

template <typename T>
__global__ void l1_forward_kernel(const T* x, const T* c, const int64_t* idx, const bool* mask, int64_t B, int64_t N,
                                  int64_t D, int64_t k, int64_t chunks, ClusterLossParams p, double* part) {
  __shared__ double sh[kWarp];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp, warps = int(blockDim.x) / kWarp;
  for (int64_t u = blockIdx.x; u < B * chunks; u += gridDim.x) {  // block-uniform
    const int64_t b = u / chunks, j0 = (u % chunks) * kTokens;
    double s = 0, n = 0;  // this warp's tokens (every lane holds them)
    for (int64_t t = warp; t < kTokens && j0 + t < N; t += warps) {
      const int64_t tok = b * N + j0 + t;
      if (mask && mask[tok]) continue;  // warp-uniform
      const T* xr = x + tok * D;
      // (the ids' range check is deferred: a bad id is clamped, never read past c)
      const T* cr = c + (b * k + cu::clamp_index(idx[tok], k)) * D;
      double xc = 0, xx = 0, cc = 0;
      for (int64_t d = lane; d < D; d += kWarp) {
        const double xv = double(xr[d]), cv = double(cr[d]);
        xc += xv * cv;
        xx += xv * xv;
        cc += cv * cv;
      }
      double phi = warp_sum(xc);
      if (p.unit_x) phi *= unit_scale(sqrt(warp_sum(xx)));
      if (p.unit_c) phi *= unit_scale(sqrt(warp_sum(cc)));
      s += phi;
      n += 1;
    }
    const double bs = cu::block_reduce(lane == 0 ? s : 0.0, cu::SumOp{}, 0.0, sh);
    const double bn = cu::block_reduce(lane == 0 ? n : 0.0, cu::SumOp{}, 0.0, sh);
    if (threadIdx.x == 0) {
      part[2 * u] = bs;
      part[2 * u + 1] = bn;
    }
  }
}

// One block: each sequence's partials in order, then the mean over the batch.
template <typename T>
__global__ void l1_finish_kernel(const double* part, int64_t B, int64_t chunks, T* out, double* counts) {
  __shared__ double sh[kWarp];
  double rows = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
    double s = 0, n = 0;
    for (int64_t q = 0; q < chunks; ++q) {
      s += part[2 * (b * chunks + q)];
      n += part[2 * (b * chunks + q) + 1];
    }
    n = fmax(n, 1.0);
    counts[b] = n;
    rows += s / n;
  }
  const double total = cu::block_reduce(rows, cu::SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *out = T(B > 0 ? -total / double(B) : 0.0);
}

// A warp per token: xscale[tok] = unit()'s scale of x_tok (0 at padding), and dx when wanted.
template <typename T>
__global__ void l1_tokens_kernel(const T* x, const T* c, const int64_t* idx, const bool* mask, const double* counts,
                                 int64_t B, int64_t N, int64_t D, int64_t k, ClusterLossParams p, const T* grad,
                                 T* dx, double* xscale) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t per = int64_t(blockDim.x) / kWarp, step = int64_t(gridDim.x) * per;
  const double g = double(*grad);
  for (int64_t tok = int64_t(blockIdx.x) * per + int64_t(threadIdx.x) / kWarp; tok < B * N; tok += step) {
    T* dr = dx ? dx + tok * D : nullptr;
    if (mask && mask[tok]) {  // warp-uniform
      if (dr)
        for (int64_t d = lane; d < D; d += kWarp) dr[d] = T(0);
      if (xscale && lane == 0) xscale[tok] = 0;
      continue;
    }
    const int64_t b = tok / N;
    const T* xr = x + tok * D;
    const T* cr = c + (b * k + cu::clamp_index(idx[tok], k)) * D;  // (clamped: the range check is deferred)
    double xlen = 0;
    if (p.unit_x) {
      double xx = 0;
      for (int64_t d = lane; d < D; d += kWarp) xx += double(xr[d]) * double(xr[d]);
      xlen = sqrt(warp_sum(xx));
    }
    if (xscale && lane == 0) xscale[tok] = unit_scale(xlen);
    if (!dr) continue;
    double f = -g / (double(B) * counts[b]);  // d out / d phi, times unit()'s scale of c
    if (p.unit_c) {
      double cc = 0;
      for (int64_t d = lane; d < D; d += kWarp) cc += double(cr[d]) * double(cr[d]);
      f *= unit_scale(sqrt(warp_sum(cc)));
    }
    if (!p.unit_x) {
      for (int64_t d = lane; d < D; d += kWarp) dr[d] = T(f * double(cr[d]));
      continue;
    }
    if (xlen < kUnitFloor) {
      for (int64_t d = lane; d < D; d += kWarp) dr[d] = T(f * double(cr[d]) / kUnitFloor);
      continue;
    }
    double xw = 0;
    for (int64_t d = lane; d < D; d += kWarp) xw += double(xr[d]) * f * double(cr[d]);
    const double uw = warp_sum(xw) / xlen;
    for (int64_t d = lane; d < D; d += kWarp) dr[d] = T((f * double(cr[d]) - double(xr[d]) / xlen * uw) / xlen);
  }
}

// A block per (sequence b, cluster i): acc = sum of unit?(x_j) over the members j in token order,
// then dc = s_b J^T acc. acc (B k D) is scratch; xscale is null for the inner and sphere forms.
template <typename T>
__global__ void l1_clusters_kernel(const T* x, const T* c, const int64_t* idx, const bool* mask, const double* counts,
                                   int64_t B, int64_t N, int64_t D, int64_t k, ClusterLossParams p, const T* grad,
                                   const double* xscale, double* acc, T* dc) {
  __shared__ int64_t tile[kThreads];  // (launched with kThreads threads)
  __shared__ double sh[kWarp];
  const double g = double(*grad);
  const int64_t W = blockDim.x;
  for (int64_t u = blockIdx.x; u < B * k; u += gridDim.x) {  // block-uniform
    const int64_t b = u / k, i = u % k;
    const T* cr = c + u * D;
    double* ar = acc + u * D;
    double cd = 0, cc = 0;  // this thread's share of c_i . acc and |c_i|^2
    for (int64_t d0 = 0; d0 < D; d0 += W) {
      const int64_t d = d0 + threadIdx.x;
      double a = 0;
      for (int64_t j0 = 0; j0 < N; j0 += W) {
        __syncthreads();  // the previous tile is read
        const int64_t j = j0 + threadIdx.x;
        tile[threadIdx.x] = j < N && !(mask && mask[b * N + j]) ? idx[b * N + j] : -1;
        __syncthreads();
        const int64_t m = N - j0 < W ? N - j0 : W;
        if (d < D)
          for (int64_t t = 0; t < m; ++t)
            if (tile[t] == i) {
              const int64_t tok = b * N + j0 + t;
              a += double(x[tok * D + d]) * (xscale ? xscale[tok] : 1.0);
            }
      }
      if (d < D) {
        ar[d] = a;
        const double cv = double(cr[d]);
        cd += cv * a;
        cc += cv * cv;
      }
    }
    const double sb = -g / (double(B) * counts[b]);
    T* o = dc + u * D;
    if (!p.unit_c) {
      for (int64_t d = threadIdx.x; d < D; d += W) o[d] = T(sb * ar[d]);  // (each thread reads its own acc)
      continue;
    }
    cd = cu::block_reduce(cd, cu::SumOp{}, 0.0, sh);
    cc = cu::block_reduce(cc, cu::SumOp{}, 0.0, sh);
    const double len = sqrt(cc);
    for (int64_t d = threadIdx.x; d < D; d += W)
      o[d] = T(len < kUnitFloor ? sb * ar[d] / kUnitFloor : sb * (ar[d] - double(cr[d]) / len * (cd / len)) / len);
  }
}

// Eq. 11: a block per (b, i) writes term[u] = unit?(c_i) . unit?(c_i-1).
template <typename T>
__global__ void l2_terms_kernel(const T* c, int64_t B, int64_t k, int64_t D, bool unit, double* term) {
  __shared__ double sh[kWarp];
  for (int64_t u = blockIdx.x; u < B * k; u += gridDim.x) {
    const int64_t b = u / k, i = u % k, prev = (i + k - 1) % k;
    const T* ci = c + u * D;
    const T* cp = c + (b * k + prev) * D;
    double dp = 0, ii = 0, pp = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double a = double(ci[d]), v = double(cp[d]);
      dp += a * v;
      ii += a * a;
      pp += v * v;
    }
    double t = cu::block_reduce(dp, cu::SumOp{}, 0.0, sh);
    if (unit) {
      t *= unit_scale(sqrt(cu::block_reduce(ii, cu::SumOp{}, 0.0, sh)));
      t *= unit_scale(sqrt(cu::block_reduce(pp, cu::SumOp{}, 0.0, sh)));
    }
    if (threadIdx.x == 0) term[u] = t;
  }
}

template <typename T>
__global__ void l2_finish_kernel(const double* term, int64_t B, int64_t k, T* out) {
  __shared__ double sh[kWarp];
  double s = 0;
  for (int64_t u = threadIdx.x; u < B * k; u += blockDim.x) s += term[u];
  s = cu::block_reduce(s, cu::SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *out = T(B > 0 ? -s / (double(B) * double(k)) : 0.0);
}

// A block per (b, i): dc_i = J^T (s (unit?(c_i-1) + unit?(c_i+1))), s = -grad / (B k).
template <typename T>
__global__ void l2_backward_kernel(const T* c, int64_t B, int64_t k, int64_t D, bool unit, const T* grad, T* dc) {
  __shared__ double sh[kWarp];
  const double s = -double(*grad) / (double(B) * double(k));
  for (int64_t u = blockIdx.x; u < B * k; u += gridDim.x) {
    const int64_t b = u / k, i = u % k;
    const T* ci = c + u * D;
    const T* cp = c + (b * k + (i + k - 1) % k) * D;
    const T* cn = c + (b * k + (i + 1) % k) * D;
    double sp = 1, sn = 1, len = 0;
    if (unit) {
      double ii = 0, pp = 0, nn = 0;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        ii += double(ci[d]) * double(ci[d]);
        pp += double(cp[d]) * double(cp[d]);
        nn += double(cn[d]) * double(cn[d]);
      }
      len = sqrt(cu::block_reduce(ii, cu::SumOp{}, 0.0, sh));
      sp = unit_scale(sqrt(cu::block_reduce(pp, cu::SumOp{}, 0.0, sh)));
      sn = unit_scale(sqrt(cu::block_reduce(nn, cu::SumOp{}, 0.0, sh)));
    }
    T* o = dc + u * D;
    if (!unit || len < kUnitFloor) {
      const double f = unit ? 1.0 / kUnitFloor : 1.0;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        o[d] = T(f * s * (double(cp[d]) * sp + double(cn[d]) * sn));
      continue;
    }
    double iw = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      iw += double(ci[d]) * s * (double(cp[d]) * sp + double(cn[d]) * sn);
    const double uw = cu::block_reduce(iw, cu::SumOp{}, 0.0, sh) / len;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double w = s * (double(cp[d]) * sp + double(cn[d]) * sn);
      o[d] = T((w - double(ci[d]) / len * uw) / len);
    }
  }
}

template <typename T>
void l1_forward_typed(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask, ClusterLossParams p,
                      const Tensor& out, const Tensor& counts) {
  const int64_t B = x.shape()[0], N = x.shape()[1], D = x.shape()[2], k = c.shape()[1];
  cu::use_device_of(out, "clustering_loss");
  const int64_t chunks = (N + kTokens - 1) / kTokens;
  if (B * chunks > 0) {
    Tensor part = Tensor::empty({B * chunks * 2}, kFloat64, out.device());
    l1_forward_kernel<T><<<cu::blocks_for(B * chunks), kThreads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<const T>(x), cu::ptr<const T>(c), cu::ptr<const int64_t>(idx),
        mask.defined() ? cu::ptr<const bool>(mask) : nullptr, B, N, D, k, chunks, p, cu::ptr<double>(part));
    ::cf::cuda::check_launch("clustering_loss");
    l1_finish_kernel<T><<<1, kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<const double>(part), B, chunks,
                                                                  cu::ptr<T>(out), cu::ptr<double>(counts));
  } else {  // no token (B or N is 0): out = 0, every count 1
    l1_finish_kernel<T>
        <<<1, kThreads, 0, ::cf::cuda::stream()>>>(nullptr, B, 0, cu::ptr<T>(out), cu::ptr<double>(counts));
  }
  ::cf::cuda::check_launch("clustering_loss");
}

template <typename T>
void l1_backward_typed(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask, const Tensor& counts,
                       ClusterLossParams p, const Tensor& grad, const Tensor& dx, const Tensor& dc) {
  const int64_t B = x.shape()[0], N = x.shape()[1], D = x.shape()[2], k = c.shape()[1];
  cu::use_device_of(dc, "clustering_loss");
  if (dc.numel() == 0 && (!dx.defined() || dx.numel() == 0)) return;
  const T* xp = cu::ptr<const T>(x);
  const T* cp = cu::ptr<const T>(c);
  const int64_t* ip = cu::ptr<const int64_t>(idx);
  const bool* mp = mask.defined() ? cu::ptr<const bool>(mask) : nullptr;
  const double* np = cu::ptr<const double>(counts);
  const T* gp = cu::ptr<const T>(grad);
  Tensor xscale;
  if (p.unit_x && B * N > 0) xscale = Tensor::empty({B * N}, kFloat64, dc.device());
  if ((dx.defined() || xscale.defined()) && B * N * D > 0) {
    const int64_t per = kThreads / kWarp;
    l1_tokens_kernel<T><<<cu::blocks_for((B * N + per - 1) / per), kThreads, 0, ::cf::cuda::stream()>>>(
        xp, cp, ip, mp, np, B, N, D, k, p, gp, dx.defined() ? cu::ptr<T>(dx) : nullptr,
        xscale.defined() ? cu::ptr<double>(xscale) : nullptr);
    ::cf::cuda::check_launch("clustering_loss");
  }
  if (dc.numel() == 0) return;
  Tensor acc = Tensor::empty({B * k * D}, kFloat64, dc.device());
  l1_clusters_kernel<T><<<cu::blocks_for(B * k), kThreads, 0, ::cf::cuda::stream()>>>(
      xp, cp, ip, mp, np, B, N, D, k, p, gp, xscale.defined() ? cu::ptr<const double>(xscale) : nullptr,
      cu::ptr<double>(acc), cu::ptr<T>(dc));
  ::cf::cuda::check_launch("clustering_loss");
}

template <typename T>
void l2_forward_typed(const Tensor& c, bool unit, const Tensor& out) {
  const int64_t B = c.shape()[0], k = c.shape()[1], D = c.shape()[2];
  cu::use_device_of(out, "centroid_sorting_loss");
  Tensor term = Tensor::empty({std::max<int64_t>(B * k, 1)}, kFloat64, out.device());
  if (B * k > 0) {
    l2_terms_kernel<T><<<cu::blocks_for(B * k), kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<const T>(c), B, k, D, unit,
                                                                                     cu::ptr<double>(term));
    ::cf::cuda::check_launch("centroid_sorting_loss");
  }
  l2_finish_kernel<T><<<1, kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<const double>(term), B, k, cu::ptr<T>(out));
  ::cf::cuda::check_launch("centroid_sorting_loss");
}

template <typename T>
void l2_backward_typed(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc) {
  const int64_t B = c.shape()[0], k = c.shape()[1], D = c.shape()[2];
  if (dc.numel() == 0) return;
  cu::use_device_of(dc, "centroid_sorting_loss");
  l2_backward_kernel<T><<<cu::blocks_for(B * k), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<const T>(c), B, k, D, unit, cu::ptr<const T>(grad), cu::ptr<T>(dc));
  ::cf::cuda::check_launch("centroid_sorting_loss");
}

// Routing's commitment term: blocks over (row (b, h), run of kTokens tokens), a warp per token
// (lanes along D), one partial per block; a one-block kernel adds the partials in order.
template <typename T>
__global__ void commitment_partials_kernel(const T* x, const T* mu, const int64_t* a, const bool* mask, int64_t H,
                                           int64_t N, int64_t D, int64_t C, int64_t rows, int64_t chunks,
                                           double* part) {
  __shared__ double sh[kWarp];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp, warps = int(blockDim.x) / kWarp;
  for (int64_t u = blockIdx.x; u < rows * chunks; u += gridDim.x) {  // block-uniform
    const int64_t r = u / chunks, n0 = (u % chunks) * kTokens, b = r / H, h = r % H;
    double s = 0;  // this warp's tokens (every lane holds them)
    for (int64_t t = warp; t < kTokens && n0 + t < N; t += warps) {
      const int64_t n = n0 + t;
      if (mask && mask[b * N + n]) continue;  // warp-uniform
      const T* xr = x + (r * N + n) * D;
      const T* cr = mu + (h * C + cu::clamp_index(a[r * N + n], C)) * D;  // (the caller's ids; clamped)
      double e2 = 0;
      for (int64_t d = lane; d < D; d += kWarp) {
        const double e = double(xr[d]) - double(cr[d]);
        e2 += e * e;
      }
      s += warp_sum(e2);
    }
    const double bs = cu::block_reduce(lane == 0 ? s : 0.0, cu::SumOp{}, 0.0, sh);
    if (threadIdx.x == 0) part[u] = bs;
  }
}

template <typename T>
__global__ void commitment_finish_kernel(const double* part, int64_t n, double scale, T* out) {
  __shared__ double sh[kWarp];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
  const double total = cu::block_reduce(s, cu::SumOp{}, 0.0, sh);
  if (threadIdx.x == 0) *out = T(scale * total);
}

template <typename T>
__global__ void commitment_backward_kernel(const T* x, const T* mu, const int64_t* a, const bool* mask, int64_t H,
                                           int64_t N, int64_t D, int64_t C, int64_t total, double scale,
                                           const T* grad, T* dx) {
  const double f = 2.0 * scale * double(*grad);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t t = i / D, d = i % D, n = t % N, h = (t / N) % H, b = t / (H * N);
    if (mask && mask[b * N + n]) {
      dx[i] = T(0);
      continue;
    }
    const T* cr = mu + (h * C + cu::clamp_index(a[t], C)) * D;
    dx[i] = T(f * (double(x[i]) - double(cr[d])));
  }
}

template <typename T>
void commitment_forward_typed(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                              const Tensor& out) {
  const int64_t B = x.shape()[0], H = x.shape()[1], N = x.shape()[2], D = x.shape()[3], C = mu.shape()[1];
  cu::use_device_of(out, "commitment_loss");
  const int64_t rows = B * H, chunks = (N + kTokens - 1) / kTokens;
  if (rows * chunks > 0) {
    Tensor part = Tensor::empty({rows * chunks}, kFloat64, out.device());
    commitment_partials_kernel<T><<<cu::blocks_for(rows * chunks), kThreads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<const T>(x), cu::ptr<const T>(mu), cu::ptr<const int64_t>(a),
        mask.defined() ? cu::ptr<const bool>(mask) : nullptr, H, N, D, C, rows, chunks, cu::ptr<double>(part));
    ::cf::cuda::check_launch("commitment_loss");
    commitment_finish_kernel<T>
        <<<1, kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<const double>(part), rows * chunks, scale, cu::ptr<T>(out));
  } else {  // no token: 0
    commitment_finish_kernel<T><<<1, kThreads, 0, ::cf::cuda::stream()>>>(nullptr, 0, scale, cu::ptr<T>(out));
  }
  ::cf::cuda::check_launch("commitment_loss");
}

template <typename T>
void commitment_backward_typed(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                               const Tensor& grad, const Tensor& dx) {
  const int64_t H = x.shape()[1], N = x.shape()[2], D = x.shape()[3], C = mu.shape()[1], total = x.numel();
  if (total == 0) return;
  cu::use_device_of(dx, "commitment_loss");
  commitment_backward_kernel<T><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<const T>(x), cu::ptr<const T>(mu), cu::ptr<const int64_t>(a),
      mask.defined() ? cu::ptr<const bool>(mask) : nullptr, H, N, D, C, total, scale, cu::ptr<const T>(grad),
      cu::ptr<T>(dx));
  ::cf::cuda::check_launch("commitment_loss");
}

}  // namespace
}  // namespace cluster_loss_cuda

void commitment_forward_cuda(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                             const Tensor& out) {
  if (x.dtype() == kFloat64)
    cluster_loss_cuda::commitment_forward_typed<double>(x, mu, a, mask, scale, out);
  else
    cluster_loss_cuda::commitment_forward_typed<float>(x, mu, a, mask, scale, out);
}

void commitment_backward_cuda(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                              const Tensor& grad, const Tensor& dx) {
  if (x.dtype() == kFloat64)
    cluster_loss_cuda::commitment_backward_typed<double>(x, mu, a, mask, scale, grad, dx);
  else
    cluster_loss_cuda::commitment_backward_typed<float>(x, mu, a, mask, scale, grad, dx);
}

void clustering_loss_forward_cuda(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                  ClusterLossParams p, const Tensor& out, const Tensor& counts) {
  if (x.dtype() == kFloat64)
    cluster_loss_cuda::l1_forward_typed<double>(x, c, idx, mask, p, out, counts);
  else
    cluster_loss_cuda::l1_forward_typed<float>(x, c, idx, mask, p, out, counts);
}

void clustering_loss_backward_cuda(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                   const Tensor& counts, ClusterLossParams p, const Tensor& grad, const Tensor& dx,
                                   const Tensor& dc) {
  if (x.dtype() == kFloat64)
    cluster_loss_cuda::l1_backward_typed<double>(x, c, idx, mask, counts, p, grad, dx, dc);
  else
    cluster_loss_cuda::l1_backward_typed<float>(x, c, idx, mask, counts, p, grad, dx, dc);
}

void centroid_sorting_loss_forward_cuda(const Tensor& c, bool unit, const Tensor& out) {
  if (c.dtype() == kFloat64)
    cluster_loss_cuda::l2_forward_typed<double>(c, unit, out);
  else
    cluster_loss_cuda::l2_forward_typed<float>(c, unit, out);
}

void centroid_sorting_loss_backward_cuda(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc) {
  if (c.dtype() == kFloat64)
    cluster_loss_cuda::l2_backward_typed<double>(c, unit, grad, dc);
  else
    cluster_loss_cuda::l2_backward_typed<float>(c, unit, grad, dc);
}

}  // namespace cf::kernels
