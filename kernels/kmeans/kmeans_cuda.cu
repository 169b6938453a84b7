// CUDA arms of the K-Means kernels (kernels/kmeans/kmeans.h): the same contracts
// as kmeans_cpu.cpp, on device tensors.
//  - assign: one cuBLAS GEMM per block of rows (through matmul_cuda) into the
//    workspace, then a warp per row takes the argmin of alpha * x.c + |c|^2 (ties
//    to the lower index) and the exact distance to the winner, summed in double.
//  - update: the points grouped by label (kernels/common/segments.h: integer
//    counts, a stable radix sort, an exclusive scan), then one thread per
//    (cluster, column) adds the member rows in increasing point index in double:
//    the same additions in the same order as the CPU, so the same bits for the
//    same labels.
//  - k-means++: a warp per row for the distance update and the row norms; the
//    candidates' potentials from direct distances (the CPU ranks them through a
//    GEMM expansion; either only ranks candidates), summed per warp, then over the
//    warps in a fixed order, so the result does not depend on scheduling.
#include <algorithm>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/segments.h"
#include "kernels/kmeans/kmeans.h"
#include "kernels/matmul/matmul.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
using cu::kWarp;
constexpr int kWarpsPerBlock = kThreads / kWarp;

// Blocks of kWarpsPerBlock warps for a warp-per-row loop over n rows.
unsigned warp_row_blocks(int64_t n) { return cu::blocks_for((n + kWarpsPerBlock - 1) / kWarpsPerBlock); }

__device__ __forceinline__ int lane_id() { return int(threadIdx.x) % kWarp; }
__device__ __forceinline__ int64_t first_warp_row() {
  return int64_t(blockIdx.x) * kWarpsPerBlock + int64_t(threadIdx.x) / kWarp;
}
__device__ __forceinline__ int64_t warp_row_step() { return int64_t(gridDim.x) * kWarpsPerBlock; }

// Sums over the warp; every lane gets the total.
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ double warp_sqdist(const T* a, const T* b, int64_t d) {
  double acc = 0;
  for (int64_t t = lane_id(); t < d; t += kWarp) {
    const double e = double(a[t]) - double(b[t]);
    acc += e * e;
  }
  return warp_sum(acc);
}
template <typename T>
__device__ __forceinline__ double warp_dot(const T* a, const T* b, int64_t d) {
  double acc = 0;
  for (int64_t t = lane_id(); t < d; t += kWarp) acc += double(a[t]) * double(b[t]);
  return warp_sum(acc);
}

// bias[j] = |c_j|^2 (cosine: 0), the centroid term of the expansion.
template <typename T>
__global__ void centroid_bias_kernel(const T* C, int64_t k, int64_t d, bool cosine, T* bias) {
  for (int64_t j = first_warp_row(); j < k; j += warp_row_step()) {
    const double s = cosine ? 0.0 : warp_dot(C + j * d, C + j * d, d);
    if (lane_id() == 0) bias[j] = T(s);
  }
}

// Rows [b0, b0 + rows) of the data: argmin over j of alpha * scores[r][j] + bias[j]
// (each lane its own first minimum over j = lane, lane + 32, ...; then a merge by
// (value, index)), then the distance to that centroid computed directly.
template <typename T>
__global__ void assign_argmin_kernel(const T* scores, const T* bias, T alpha, const T* X, const T* C,
                                     int64_t b0, int64_t rows, int64_t k, int64_t d, bool cosine,
                                     int64_t* L, double* D) {
  for (int64_t r = first_warp_row(); r < rows; r += warp_row_step()) {
    const T* s = scores + r * k;
    T best = T(0);
    int64_t idx = -1;
    for (int64_t j = lane_id(); j < k; j += kWarp) {
      const T v = alpha * s[j] + bias[j];
      if (idx < 0 || v < best) {
        best = v;
        idx = j;
      }
    }
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const T ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (oi >= 0 && (idx < 0 || ov < best || (ov == best && oi < idx))) {
        best = ov;
        idx = oi;
      }
    }
    const int64_t i = b0 + r;
    const double dist = cosine ? 1.0 - warp_dot(X + i * d, C + idx * d, d) : warp_sqdist(X + i * d, C + idx * d, d);
    if (lane_id() == 0) {
      L[i] = idx;
      D[i] = cosine ? (dist > 0 ? dist : 0.0) : dist;
    }
  }
}

template <typename T>
void assign_typed(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows, const Tensor& workspace,
                  const Tensor& labels, const Tensor& dist) {
  const int64_t N = x.size(0), d = x.size(1), k = c.size(0);
  const int64_t rows_max = std::max<int64_t>(1, std::min(block_rows, N));
  CF_CHECK(workspace.numel() >= (rows_max + 1) * k, ValueError, "[kmeans_assign] workspace of ",
           workspace.numel(), " elements, needs (", rows_max, " + 1) * ", k);
  cu::use_device_of(x, "kmeans_assign");
  T* scores = cu::ptr<T>(workspace);
  T* bias = scores + rows_max * k;
  centroid_bias_kernel<T><<<warp_row_blocks(k), kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<T>(c), k, d, cosine, bias);
  ::cf::cuda::check_launch("kmeans_assign");
  // c^T as a (d, k) view: cuBLAS reads it transposed, no copy.
  const Tensor ct = make_view(c, {d, k}, {1, d}, c.offset());
  const T alpha = cosine ? T(-1) : T(-2);  // exact scalings: the CPU folds them into its GEMM
  for (int64_t b0 = 0; b0 < N; b0 += rows_max) {
    const int64_t rows = std::min(rows_max, N - b0);
    const Tensor xb = make_view(x, {rows, d}, {d, 1}, x.offset() + b0 * d);
    const Tensor sb = make_view(workspace, {rows, k}, {k, 1}, workspace.offset());
    matmul_cuda(xb, ct, sb);
    assign_argmin_kernel<T><<<warp_row_blocks(rows), kThreads, 0, ::cf::cuda::stream()>>>(
        scores, bias, alpha, cu::ptr<T>(x), cu::ptr<T>(c), b0, rows, k, d, cosine, cu::ptr<int64_t>(labels),
        cu::ptr<double>(dist));
    ::cf::cuda::check_launch("kmeans_assign");
  }
}

// The lowest point index with a label outside [0, k) goes to *bad.
__global__ void check_labels_kernel(const int64_t* L, int64_t n, int64_t k, unsigned long long* bad) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    if (L[i] < 0 || L[i] >= k) atomicMin(bad, (unsigned long long)i);
}

// S[j][t] = sum of X[order[p]][t] over p in [start[j], start[j] + counts[j]), in
// increasing p; blockDim.x threads over the columns, a block per cluster.
template <typename T>
__global__ void segment_sums_kernel(const T* X, const int64_t* order, const int64_t* start, const int64_t* counts,
                                    int64_t k, int64_t d, double* S) {
  for (int64_t j = blockIdx.x; j < k; j += gridDim.x) {
    const int64_t p0 = start[j], p1 = p0 + counts[j];
    for (int64_t t = threadIdx.x; t < d; t += blockDim.x) {
      double acc = 0;
      for (int64_t p = p0; p < p1; ++p) acc += double(X[order[p] * d + t]);
      S[j * d + t] = acc;
    }
  }
}

template <typename T>
void update_typed(const Tensor& x, const Tensor& labels, const Tensor& order, const Tensor& counts,
                  const Tensor& sums) {
  const int64_t N = x.size(0), d = x.size(1), k = counts.numel();
  const Device dev = x.device();
  cu::use_device_of(x, "kmeans_update");
  // -1 has all bits set: UINT64_MAX for the unsigned atomicMin (no bad label).
  Tensor bad = Tensor::from_vector<int64_t>({-1}, {1}, dev);
  check_labels_kernel<<<cu::grid_for(N), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<int64_t>(labels), N, k, reinterpret_cast<unsigned long long*>(cu::ptr<int64_t>(bad)));
  ::cf::cuda::check_launch("kmeans_update");
  const int64_t first_bad = bad.to_vector<int64_t>()[0];
  if (first_bad >= 0) {
    const int64_t l = labels.to_vector<int64_t>()[size_t(first_bad)];
    throw IndexError(str("[kmeans_update] label ", l, " of point ", first_bad, " is outside [0, ", k, ")"));
  }
  // Labels in [0, k) read as unsigned keys: the stable sort keeps each cluster's
  // points in increasing index, the CPU's counting-sort order.
  Tensor start = Tensor::empty({k}, kInt64, dev);
  segments_by_key_cuda(reinterpret_cast<const uint64_t*>(cu::ptr<int64_t>(labels)), N, k, order, start, counts,
                       "kmeans_update");
  int64_t* cnt = cu::ptr<int64_t>(counts);
  const int threads = int(std::min<int64_t>(kThreads, (d + kWarp - 1) / kWarp * kWarp));
  segment_sums_kernel<T><<<cu::blocks_for(k), threads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<T>(x), cu::ptr<int64_t>(order), cu::ptr<int64_t>(start), cnt, k, d, cu::ptr<double>(sums));
  ::cf::cuda::check_launch("kmeans_update");
}

template <typename T>
__global__ void pp_update_kernel(const T* X, int64_t center, int64_t n, int64_t d, double* D) {
  for (int64_t i = first_warp_row(); i < n; i += warp_row_step()) {
    const double s = warp_sqdist(X + i * d, X + center * d, d);
    if (lane_id() == 0) D[i] = s < D[i] ? s : D[i];
  }
}

template <typename T>
__global__ void sqnorms_kernel(const T* X, int64_t n, int64_t d, double* out) {
  for (int64_t i = first_warp_row(); i < n; i += warp_row_step()) {
    const double s = warp_dot(X + i * d, X + i * d, d);
    if (lane_id() == 0) out[i] = s;
  }
}

constexpr int kMaxCandidates = 64;
constexpr unsigned kPotentialBlocks = 512;  // fixed: the partial sums' order never changes

// partial[w][l] = sum over the rows of global warp w of min(D[i], |x_i - x_cand[l]|^2);
// lane l % 32 keeps candidate l in slot l / 32.
template <typename T>
__global__ void pp_potentials_kernel(const T* X, const double* D, const int64_t* cand, int64_t L, int64_t n,
                                     int64_t d, double* partial) {
  double acc[2] = {0, 0};
  for (int64_t i = first_warp_row(); i < n; i += warp_row_step()) {
    for (int64_t l = 0; l < L; ++l) {
      const double s = warp_sqdist(X + i * d, X + cand[l] * d, d);
      if (lane_id() == int(l % kWarp)) acc[l / kWarp] += s < D[i] ? s : D[i];
    }
  }
  const int64_t w = first_warp_row();
  for (int64_t l = lane_id(); l < L; l += kWarp) partial[w * L + l] = acc[l / kWarp];
}

__global__ void sum_partials_kernel(const double* partial, int64_t warps, int64_t L, double* P) {
  for (int64_t l = threadIdx.x; l < L; l += blockDim.x) {
    double s = 0;
    for (int64_t w = 0; w < warps; ++w) s += partial[w * L + l];
    P[l] = s;
  }
}

template <typename T>
void pp_potentials_typed(const Tensor& x, const Tensor& dist, const Tensor& cand, const Tensor& potential) {
  const int64_t N = x.size(0), d = x.size(1), L = cand.numel();
  CF_CHECK(L <= kMaxCandidates, ValueError, "[kmeans_pp_potentials] at most ", kMaxCandidates,
           " candidates, got ", L);
  cu::use_device_of(x, "kmeans_pp_potentials");
  const unsigned blocks = std::min(kPotentialBlocks, warp_row_blocks(N));
  const int64_t warps = int64_t(blocks) * kWarpsPerBlock;
  Tensor partial = Tensor::empty({warps * L}, kFloat64, x.device());
  pp_potentials_kernel<T><<<blocks, kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<T>(x), cu::ptr<double>(dist), cu::ptr<int64_t>(cand), L, N, d, cu::ptr<double>(partial));
  ::cf::cuda::check_launch("kmeans_pp_potentials");
  sum_partials_kernel<<<1, kWarp * 2, 0, ::cf::cuda::stream()>>>(cu::ptr<double>(partial), warps, L,
                                                                 cu::ptr<double>(potential));
  ::cf::cuda::check_launch("kmeans_pp_potentials");
}

}  // namespace

void kmeans_assign_cuda(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows, const Tensor& workspace,
                        const Tensor& labels, const Tensor& dist) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_assign",
                    assign_typed<scalar_t>(x, c, cosine, block_rows, workspace, labels, dist));
}

void kmeans_update_cuda(const Tensor& x, const Tensor& labels, const Tensor& order, const Tensor& counts,
                        const Tensor& sums) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_update", update_typed<scalar_t>(x, labels, order, counts, sums));
}

void kmeans_pp_update_cuda(const Tensor& x, int64_t center, const Tensor& dist) {
  const int64_t N = x.size(0), d = x.size(1);
  cu::use_device_of(x, "kmeans_pp_update");
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_pp_update",
                        (pp_update_kernel<scalar_t><<<warp_row_blocks(N), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(x), center, N, d, cu::ptr<double>(dist))));
  ::cf::cuda::check_launch("kmeans_pp_update");
}

void kmeans_pp_potentials_cuda(const Tensor& x, const Tensor& xnorm, const Tensor& dist, const Tensor& cand,
                               const Tensor& workspace, const Tensor& potential) {
  (void)xnorm;  // the CUDA arm computes the distances directly
  (void)workspace;
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_pp_potentials", pp_potentials_typed<scalar_t>(x, dist, cand, potential));
}

void kmeans_row_sqnorms_cuda(const Tensor& x, const Tensor& out) {
  const int64_t N = x.size(0), d = x.size(1);
  cu::use_device_of(x, "kmeans_row_sqnorms");
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_row_sqnorms",
                        (sqnorms_kernel<scalar_t><<<warp_row_blocks(N), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(x), N, d, cu::ptr<double>(out))));
  ::cf::cuda::check_launch("kmeans_row_sqnorms");
}

// ---------------------------------------------------------------- routing's centroid EMA
// Slot j of a (side, head) is centroid j / (D + 1), feature j % (D + 1) (D: the count). Kernel 1: a
// thread per (side, head, chunk of tokens, slot) sums its slot over the chunk's tokens in order (the ids
// are read by every thread of the block: one broadcast load a warp); kernel 2: a thread per (side, head,
// slot) adds the chunks' sums in order. The CPU sums in the same order: the same bits, no atomics.

namespace centroid_ema_cuda {
namespace {

template <typename T>
__global__ void chunk_sums_kernel(const T* xq, const int64_t* aq, const bool* mq, const T* xk, const int64_t* ak,
                                  const bool* mk, int64_t R, int64_t N, int64_t D, int64_t C, int64_t M, int64_t L,
                                  int64_t chunks, int64_t slot_blocks, double* part) {
  const int64_t S = C * (D + 1);
  for (int64_t u = blockIdx.x; u < 2 * R * chunks * slot_blocks; u += gridDim.x) {  // block-uniform
    const int64_t sb = u % slot_blocks, chunk = (u / slot_blocks) % chunks, sr = u / (slot_blocks * chunks);
    const int64_t s = sr / R, r = sr % R, j = sb * blockDim.x + threadIdx.x;
    const T* x = s == 0 ? xq : xk;
    const int64_t* a = s == 0 ? aq : ak;
    const bool* pad = s == 0 ? mq : mk;
    const int64_t c = j / (D + 1), d = j % (D + 1);
    double acc = 0;
    const int64_t t0 = chunk * L, t1 = min(M, t0 + L);
    for (int64_t tk = t0; tk < t1; ++tk) {
      if (pad && pad[tk]) continue;
      const int64_t t = ((tk / N) * R + r) * N + tk % N;
      if (j >= S || cu::clamp_index(a[t], C) != c) continue;
      acc += d < D ? double(x[t * D + d]) : 1.0;
    }
    if (j < S) part[(sr * chunks + chunk) * S + j] = acc;
  }
}

// The same sums when a (side, head)'s C (D + 1) slots fit in shared memory: a block per (side, head,
// chunk), thread d owning feature d of every centroid, each token's row added to its centroid's slots:
// every slot still gets its chunk's tokens in order (the same bits), with D + 1 lanes of work per token
// where the kernel above has C (D + 1) threads scan every token.
template <typename T>
__global__ void chunk_sums_shared_kernel(const T* xq, const int64_t* aq, const bool* mq, const T* xk,
                                         const int64_t* ak, const bool* mk, int64_t R, int64_t N, int64_t D,
                                         int64_t C, int64_t M, int64_t L, int64_t chunks, double* part) {
  extern __shared__ double acc[];  // C (D + 1)
  const int64_t S = C * (D + 1);
  for (int64_t u = blockIdx.x; u < 2 * R * chunks; u += gridDim.x) {  // block-uniform
    const int64_t chunk = u % chunks, sr = u / chunks, s = sr / R, r = sr % R;
    const T* x = s == 0 ? xq : xk;
    const int64_t* a = s == 0 ? aq : ak;
    const bool* pad = s == 0 ? mq : mk;
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) acc[j] = 0;
    __syncthreads();
    const int64_t t0 = chunk * L, t1 = min(M, t0 + L);
    for (int64_t tk = t0; tk < t1; ++tk) {
      if (pad && pad[tk]) continue;  // block-uniform
      const int64_t t = ((tk / N) * R + r) * N + tk % N;
      double* o = acc + cu::clamp_index(a[t], C) * (D + 1);
      for (int64_t d = threadIdx.x; d <= D; d += blockDim.x) o[d] += d < D ? double(x[t * D + d]) : 1.0;
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) part[(sr * chunks + chunk) * S + j] = acc[j];
    __syncthreads();  // (acc is cleared for the block's next chunk)
  }
}

template <typename T>
__global__ void chunks_total_kernel(const double* part, int64_t R, int64_t S, int64_t chunks, T* out) {
  const int64_t total = 2 * R * S, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t sr = i / S, j = i % S;
    double s = 0;
    for (int64_t q = 0; q < chunks; ++q) s += part[(sr * chunks + q) * S + j];
    out[i] = T(s);
  }
}

template <typename T>
__global__ void update_kernel(T* mu, const T* st, int64_t R, int64_t C, int64_t D, double decay) {
  const int64_t total = R * C * D, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t rc = i / D, d = i % D;
    const T* q = st + rc * (D + 1);
    const T* k = st + (R * C + rc) * (D + 1);
    const double m = double(mu[i]);
    const double mean_q = double(q[D]) > 0 ? double(q[d]) / double(q[D]) : m;
    const double mean_k = double(k[D]) > 0 ? double(k[d]) / double(k[D]) : m;
    // Rounded as the CPU rounds (no fused multiply-add): the same bits on both devices.
    mu[i] = T(__dadd_rn(__dmul_rn(decay, m), __dmul_rn((1.0 - decay) / 2.0, __dadd_rn(mean_q, mean_k))));
  }
}

template <typename T>
void stats_typed(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                 const Tensor& mk, const Tensor& stats) {
  const int64_t B = xq.shape()[0], R = xq.shape()[1], N = xq.shape()[2], D = xq.shape()[3];
  const int64_t C = stats.shape()[2], S = C * (D + 1), M = B * N;
  if (R * S == 0) return;
  cu::use_device_of(stats, "centroid_ema");
  const int64_t L = centroid_ema_chunk(M, R, S), chunks = std::max<int64_t>(1, (M + L - 1) / L);
  Tensor part = Tensor::empty({2 * R * chunks * S}, kFloat64, stats.device());
  const bool* pq = mq.defined() ? cu::ptr<const bool>(mq) : nullptr;
  const bool* pk = mk.defined() ? cu::ptr<const bool>(mk) : nullptr;
  constexpr int64_t kSharedSlots = 6144;  // 48 KB of doubles: the default shared memory of a block
  if (S <= kSharedSlots) {
    const int threads = int(std::min<int64_t>(cu::kThreads, (D + 1 + cu::kWarp - 1) / cu::kWarp * cu::kWarp));
    chunk_sums_shared_kernel<T>
        <<<cu::blocks_for(2 * R * chunks), threads, size_t(S) * sizeof(double), ::cf::cuda::stream()>>>(
            cu::ptr<const T>(xq), cu::ptr<const int64_t>(aq), pq, cu::ptr<const T>(xk), cu::ptr<const int64_t>(ak), pk,
            R, N, D, C, M, L, chunks, cu::ptr<double>(part));
  } else {
    const int64_t slot_blocks = (S + cu::kThreads - 1) / cu::kThreads;
    chunk_sums_kernel<T><<<cu::blocks_for(2 * R * chunks * slot_blocks), cu::kThreads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<const T>(xq), cu::ptr<const int64_t>(aq), pq, cu::ptr<const T>(xk), cu::ptr<const int64_t>(ak), pk, R,
        N, D, C, M, L, chunks, slot_blocks, cu::ptr<double>(part));
  }
  ::cf::cuda::check_launch("centroid_ema");
  chunks_total_kernel<T><<<cu::grid_for(2 * R * S), cu::kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<const double>(part), R, S, chunks, cu::ptr<T>(stats));
  ::cf::cuda::check_launch("centroid_ema");
}

template <typename T>
void update_typed(const Tensor& mu, const Tensor& stats, double decay) {
  const int64_t R = mu.shape()[0], C = mu.shape()[1], D = mu.shape()[2];
  if (R * C * D == 0) return;
  cu::use_device_of(mu, "centroid_ema");
  update_kernel<T><<<cu::grid_for(R * C * D), cu::kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<T>(mu), cu::ptr<const T>(stats), R, C, D, decay);
  ::cf::cuda::check_launch("centroid_ema");
}

}  // namespace
}  // namespace centroid_ema_cuda

void centroid_ema_stats_cuda(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk,
                             const Tensor& ak, const Tensor& mk, const Tensor& stats) {
  if (stats.dtype() == kFloat64)
    centroid_ema_cuda::stats_typed<double>(xq, aq, mq, xk, ak, mk, stats);
  else
    centroid_ema_cuda::stats_typed<float>(xq, aq, mq, xk, ak, mk, stats);
}

void centroid_ema_update_cuda(const Tensor& mu, const Tensor& stats, double decay) {
  if (mu.dtype() == kFloat64)
    centroid_ema_cuda::update_typed<double>(mu, stats, decay);
  else
    centroid_ema_cuda::update_typed<float>(mu, stats, decay);
}

// ---------------------------------------------------------------- cluster means (eq. 3)
// The rows grouped by cluster (segments_by_key_cuda, stable: increasing i), then a block per (group,
// cluster) whose threads each sum one column over the members in order, in double, as the CPU does.

namespace cluster_means_cuda {

__global__ void keys_kernel(const int64_t* assign, int64_t rows, int64_t N, int64_t C, uint64_t* keys) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += step) {
    const int64_t a = assign[r];
    keys[r] = uint64_t((r / N) * (C + 1) + (a < 0 ? C : (a >= C ? C - 1 : a)));
  }
}

template <typename T>
__global__ void sums_kernel(const T* x, const int64_t* order, const int64_t* start, const int64_t* count,
                            int64_t slots, int64_t C, int64_t D, double scale, T* out, int64_t* counts) {
  for (int64_t r = blockIdx.x; r < slots; r += gridDim.x) {
    const int64_t g = r / (C + 1), c = r % (C + 1);
    if (c == C) continue;  // the queries without a cluster
    const int64_t p0 = start[r], n = count[r];
    if (threadIdx.x == 0) counts[g * C + c] = n;
    const double f = scale / double(n > 1 ? n : 1);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      double s = 0;
      for (int64_t p = p0; p < p0 + n; ++p) s += double(x[order[p] * D + j]);
      out[(g * C + c) * D + j] = T(s * f);
    }
  }
}

template <typename T>
__global__ void backward_kernel(const T* dout, const int64_t* assign, const int64_t* counts, int64_t total,
                                int64_t N, int64_t C, int64_t D, double scale, T* dx) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / D, j = e % D, a = assign[r];
    if (a < 0) {
      dx[e] = T(0);
      continue;
    }
    const int64_t g = r / N, c = a >= C ? C - 1 : a;
    const int64_t n = counts[g * C + c];
    dx[e] = dout[(g * C + c) * D + j] * T(scale / double(n > 1 ? n : 1));
  }
}

}  // namespace cluster_means_cuda

void cluster_means_forward_cuda(const Tensor& x, const Tensor& assign, double scale, const Tensor& out,
                                const Tensor& counts) {
  using namespace cluster_means_cuda;
  const char* op = "cluster_means";
  const int64_t C = out.shape()[size_t(out.dim() - 2)], D = x.shape().back(), N = x.shape()[size_t(x.dim() - 2)];
  // (rows from the groups, not x.numel() / D: with D == 0 the counts are still the members')
  const int64_t G = counts.numel() / std::max<int64_t>(C, 1), rows = G * N, slots = G * (C + 1);
  if (slots == 0) return;
  const Device dev = x.device();
  cu::use_device_of(x, op);
  Tensor keys = Tensor::empty({std::max<int64_t>(rows, 1)}, kInt64, dev);
  uint64_t* kp = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(keys));
  if (rows > 0) {
    keys_kernel<<<cu::grid_for(rows), cu::kThreads, 0, ::cf::cuda::stream()>>>(cu::ptr<int64_t>(assign), rows, N, C,
                                                                               kp);
    ::cf::cuda::check_launch(op);
  }
  Tensor order = Tensor::empty({std::max<int64_t>(rows, 1)}, kInt64, dev), start = Tensor::empty({slots}, kInt64, dev),
         count = Tensor::empty({slots}, kInt64, dev);
  segments_by_key_cuda(kp, rows, slots, order, start, count, op);
  const int threads = int(std::max<int64_t>(cu::kWarp, std::min<int64_t>(cu::kThreads, (D + cu::kWarp - 1) / cu::kWarp * cu::kWarp)));
  auto launch = [&](auto zero) {
    using T = decltype(zero);
    sums_kernel<T><<<cu::blocks_for(slots), threads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<T>(x), cu::ptr<int64_t>(order), cu::ptr<int64_t>(start), cu::ptr<int64_t>(count), slots, C, D, scale,
        cu::ptr<T>(out), cu::ptr<int64_t>(counts));
  };
  if (x.dtype() == kFloat64) launch(0.0);
  else launch(0.0f);
  ::cf::cuda::check_launch(op);
}

void cluster_means_backward_cuda(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale,
                                 const Tensor& dx) {
  using namespace cluster_means_cuda;
  const char* op = "cluster_means";
  const int64_t total = dx.numel(), D = dx.shape().back(), N = dx.shape()[size_t(dx.dim() - 2)];
  const int64_t C = dout.shape()[size_t(dout.dim() - 2)];
  if (total == 0) return;
  cu::use_device_of(dx, op);
  auto launch = [&](auto zero) {
    using T = decltype(zero);
    backward_kernel<T><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<T>(dout), cu::ptr<int64_t>(assign), cu::ptr<int64_t>(counts), total, N, C, D, scale, cu::ptr<T>(dx));
  };
  if (dx.dtype() == kFloat64) launch(0.0);
  else launch(0.0f);
  ::cf::cuda::check_launch(op);
}

}  // namespace cf::kernels
