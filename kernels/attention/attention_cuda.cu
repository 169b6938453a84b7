// CUDA fused attention (FlashAttention-2 scheme), written against the CPU
// reference in attention_cpu.cpp: the same tiles, masks and formulas.
//
// One set of kernels serves the three ops through a "map" that says which rows a
// tile reads and which rows of the outputs it writes (FullMap, BlockMap,
// RoutedMap: attention_maps.cuh).
// Kernels (blocks of 128 threads, tiles of 32 query rows x 32 keys in shared memory):
//   forward : grid (query tile, group, batch*head): online softmax over the
//             group's key tiles (Alg. 1); writes out and lse.
//   dq      : same grid: P = exp(S - lse), dS = P (dO.V - D), dQ = scale dS K.
//   dkdv    : grid (key tile, key group, batch*head): loops over the query tiles
//             of every group whose window holds the key group (for blocks, the
//             chunks c = cc - offsets[t], distinct by construction): dV = P^T dO,
//             dK = scale dS^T Q. Each key row is owned by one block: no atomics,
//             deterministic.
// Rounds (BlockAttentionParams::rounds, LSH): output head h * R + r reads q, k, v
// head h. The forward's grid runs over output heads; the backward runs one round
// per launch over the q, k, v heads and adds each round's dq, dk, dv to the last
// (within a round a position sits in one slot, so each row still has one writer).
// Accumulation is in T (float32 like the CPU's sgemm tiles).
#include <cuda_runtime.h>

#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_maps.cuh"
#include "kernels/attention/softmax_grad.h"
#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/segments.h"
#include "kernels/elementwise/elementwise.h"

namespace cf::kernels {

namespace {

constexpr int BR = 32;  // query rows per tile
constexpr int BC = 32;  // keys per tile (one per lane in the row statistics)
constexpr int NT = 128;
constexpr int NW = NT / 32;

using namespace attention_maps;

struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  void* lse;
  const void* dout;
  const void* dlse;  // may be null
  void* dq;
  void* dk;
  void* dv;
  Rows3 so, sl, sgo, sgl;
  int64_t H, Nq, Nk, Dk, Dv;  // H: output heads (q's heads times R); Nq == Nk == N for blocks
  int64_t Mq, Mk;  // rows per head of dq and of dk, dv: Nq and Nk, or the slots for routed attention
  int R, this_round;  // rounds over q, k, v; the round a backward launch computes (grid.z < 2^16: 32-bit math)
  double scale, self_score;
  // Attention-weight dropout (routed attention only: the flash and block callers send a rate to their GEMM
  // paths): the weight of query position i on key position j in group g of output head bh has the counter
  // drop.counter0 + (((drop_group0 + g) drop_heads + bh) Nq + i) Nk + j (RoutedAttentionParams' map).
  RowDropout drop;
  int64_t drop_group0, drop_heads;
};

__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }

template <typename T>
__device__ __forceinline__ T ninf() {
  return -std::numeric_limits<T>::infinity();
}

// Whether attention dropout (rate > 0) keeps the weight of this counter: dropout_cuda.cu's draw (the
// Philox uniform against the rate), the CPU's dropout_row in integers, so the same weights drop.
__device__ __forceinline__ bool dropout_keeps(const RowDropout& d, uint64_t counter) {
  return !(philox_uniform_d(philox4x32_10(philox_seed_at(d.seed, d.rebase), counter)) < d.rate);
}
// The counter of a weight's draw: counter0, moved by a replayed CUDA graph's rebase (core/rng.h), plus offset.
__device__ __forceinline__ uint64_t dropout_counter(const RowDropout& d, uint64_t offset) {
  return philox_counter0_at(d.counter0, d.rebase) + offset;
}

// A fused kernel's weight p of query position i on key position j in group g of output head bh, dropped or
// scaled by 1 / (1 - rate) (Args::drop); p itself without a rate. p = 0 (a blocked entry, whose i or j may
// be -1) draws nothing: it stays 0 either way.
template <typename T>
__device__ __forceinline__ T dropped_weight(const Args& a, T p, int64_t g, int64_t bh, int64_t i, int64_t j) {
  if (!(a.drop.rate > 0) || p == T(0)) return p;
  const uint64_t counter = dropout_counter(
      a.drop, ((uint64_t(a.drop_group0 + g) * uint64_t(a.drop_heads) + uint64_t(bh)) * uint64_t(a.Nq) + uint64_t(i)) *
                      uint64_t(a.Nk) +
                  uint64_t(j));
  return dropout_keeps(a.drop, counter) ? p * T(1.0 / (1.0 - a.drop.rate)) : T(0);
}

// Loads rows pos(r) of X (B*H*n rows of D, contiguous) for r in [0, R) into a
// shared tile with row stride ld; missing rows (pos -1) are zeros.
template <typename T, typename Pos>
__device__ void load_rows(T* tile, int ld, const T* X, int64_t bh, int64_t n, int64_t D, int R, Pos pos) {
  for (int64_t e = threadIdx.x; e < int64_t(R) * D; e += NT) {
    const int r = int(e / D);
    const int64_t c = e % D, p = pos(r);
    tile[r * ld + c] = p < 0 ? T(0) : X[(bh * n + p) * D + c];
  }
}

// Shared layout helper: carve consecutive arrays out of the dynamic buffer.
template <typename T>
struct Carver {
  T* p;
  __device__ T* take(int64_t n) {
    T* r = p;
    p += n;
    return r;
  }
};

// ---------------------------------------------------------------- forward

template <typename T, typename Map>
__global__ void __launch_bounds__(NT) fwd_kernel(Args a, Map map) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t Dk = a.Dk, Dv = a.Dv;
  const int ldk = int(Dk) + 1, ldv = int(Dv);
  Carver<T> cv{reinterpret_cast<T*>(smem_raw)};
  T* Qs = cv.take(BR * ldk);
  T* Ks = cv.take(BC * ldk);
  T* Vs = cv.take(BC * ldv);
  T* S = cv.take(BR * BC);
  T* Os = cv.take(BR * ldv);
  T* m = cv.take(BR);
  T* l = cv.take(BR);
  T* alpha = cv.take(BR);
  __shared__ int64_t qp[BR], kp[BC], orw[BR];

  // bh: output head (b, h); dbh: the q, k, v head it reads.
  const int64_t r0 = int64_t(blockIdx.x) * BR, g = blockIdx.y, bh = blockIdx.z, b = bh / a.H,
                dbh = blockIdx.z / unsigned(a.R);
  if (r0 >= map.rows()) return;
  const T* Q = static_cast<const T*>(a.q);
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  const T scale = T(a.scale);
  for (int r = threadIdx.x; r < BR; r += NT) {
    qp[r] = r0 + r < map.rows() ? map.qpos(bh, g, r0 + r) : -1;
    orw[r] = qp[r] < 0 ? -1 : map.orow(g, r0 + r, qp[r]);
    m[r] = ninf<T>();
    l[r] = T(0);
  }
  for (int64_t e = threadIdx.x; e < BR * Dv; e += NT) Os[(e / Dv) * ldv + e % Dv] = T(0);
  __syncthreads();
  load_rows(Qs, ldk, Q, dbh, a.Nq, Dk, BR, [&](int r) { return qp[r]; });
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t kend = map.key_end(r0, BR);
  for (int64_t j0 = 0; j0 < kend; j0 += BC) {
    __syncthreads();
    for (int j = threadIdx.x; j < BC; j += NT) kp[j] = j0 + j < kend ? map.kpos(bh, g, j0 + j) : -1;
    __syncthreads();
    load_rows(Ks, ldk, K, dbh, a.Nk, Dk, BC, [&](int j) { return kp[j]; });
    load_rows(Vs, ldv, V, dbh, a.Nk, Dv, BC, [&](int j) { return kp[j]; });
    __syncthreads();
    // Scores: warp `warp` takes rows warp, warp + NW, ...; lane = key.
    for (int r = warp; r < BR; r += NW) {
      const int64_t i = qp[r], j = kp[lane];
      T s;
      if (map.blocked(b, i, j)) {
        s = ninf<T>();
      } else if (map.self(i, j)) {
        s = T(a.self_score);
      } else {
        T acc = T(0);
        for (int64_t c = 0; c < Dk; ++c) acc += Qs[r * ldk + c] * Ks[lane * ldk + c];
        s = acc * scale;
      }
      T mx = s;
      for (int o = 16; o > 0; o >>= 1) {
        const T y = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = nan_max(mx, y);
      }
      const T m_old = m[r];
      const T m_new = nan_max(m_old, mx);
      const T p = (m_new == ninf<T>() || s == ninf<T>()) ? T(0) : dexp(s - m_new);
      T sum = p;  // the normaliser l sums the weights before dropout, as the dense softmax does
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      S[r * BC + lane] = dropped_weight(a, p, g, bh, i, j);
      __syncwarp();
      if (lane == 0) {
        const T al = m_new == ninf<T>() ? T(1) : (m_old == ninf<T>() ? T(0) : dexp(m_old - m_new));
        alpha[r] = al;
        l[r] = l[r] * al + sum;
        m[r] = m_new;
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < BR * Dv; e += NT) {
      const int r = int(e / Dv);
      const int64_t c = e % Dv;
      T acc = Os[r * ldv + c] * alpha[r];
      for (int j = 0; j < BC; ++j) acc += S[r * BC + j] * Vs[j * ldv + c];
      Os[r * ldv + c] = acc;
    }
  }
  __syncthreads();
  T* O = static_cast<T*>(a.out);
  T* L = static_cast<T*>(a.lse);
  const int64_t h = bh % a.H;
  for (int64_t e = threadIdx.x; e < BR * Dv; e += NT) {
    const int r = int(e / Dv);
    const int64_t c = e % Dv, i = orw[r];
    if (i < 0) continue;
    O[b * a.so.s0 + h * a.so.s1 + i * a.so.s2 + c] = l[r] != T(0) ? Os[r * ldv + c] / l[r] : T(0);  // NaN: NaN
  }
  for (int r = threadIdx.x; r < BR; r += NT) {
    const int64_t i = orw[r];
    if (i < 0) continue;
    L[b * a.sl.s0 + h * a.sl.s1 + i * a.sl.s2] = l[r] != T(0) ? m[r] + dlog(l[r]) : ninf<T>();
  }
}

// ---------------------------------------------------------------- backward

// D_r = dO_r . O_r - dlse_r for the rows of a tile (FlashAttention-2 Alg. 2 line 4,
// plus the lse gradient: d lse_i / d S_ij = P_ij). orw: each tile row's row of out,
// lse, dout and dlse (-1: no query).
template <typename T>
__device__ void row_terms(const Args& a, int64_t b, int64_t h, const int64_t* orw, T* dOs, int ldv, T* Ls, T* Ds) {
  const T* O = static_cast<const T*>(a.out);
  const T* L = static_cast<const T*>(a.lse);
  const T* G = static_cast<const T*>(a.dout);
  const T* GL = static_cast<const T*>(a.dlse);
  for (int64_t e = threadIdx.x; e < BR * a.Dv; e += NT) {
    const int r = int(e / a.Dv);
    const int64_t c = e % a.Dv, i = orw[r];
    dOs[r * ldv + c] = i < 0 ? T(0) : G[b * a.sgo.s0 + h * a.sgo.s1 + i * a.sgo.s2 + c];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = warp; r < BR; r += NW) {
    const int64_t i = orw[r];
    T acc = T(0);
    if (i >= 0)
      for (int64_t c = lane; c < a.Dv; c += 32) acc += dOs[r * ldv + c] * O[b * a.so.s0 + h * a.so.s1 + i * a.so.s2 + c];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      if (i >= 0 && GL) acc -= GL[b * a.sgl.s0 + h * a.sgl.s1 + i * a.sgl.s2];
      Ds[r] = acc;
      Ls[r] = i < 0 ? ninf<T>() : L[b * a.sl.s0 + h * a.sl.s1 + i * a.sl.s2];
    }
  }
  __syncthreads();
}

// P and dS of one (query tile, key tile) of group g, output head bh: P = exp(S - lse) (0 where blocked),
// dS = P (dO.V - D), 0 on self-masked entries (a constant score). With a dropout rate (Args::drop) P
// becomes the dropped, scaled weights Z (they met V: dV = Z^T dO) and dS = P (dP' - D), dP' = dO.V / (1 - rate)
// at the kept weights, 0 at the dropped ones (D = dO . O is still rowsum(P dP')).
template <typename T, typename Map>
__device__ void probs_and_dS(const Args& a, const Map& map, int64_t b, int64_t g, int64_t bh, const int64_t* qp,
                             const int64_t* kp, const T* Qs, const T* Ks, const T* Vs, const T* dOs, const T* Ls,
                             const T* Ds, int ldk, int ldv, T* P, T* dS) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool dropping = a.drop.rate > 0;
  const T keep = T(1.0 / (1.0 - a.drop.rate));
  for (int r = warp; r < BR; r += NW) {
    const int64_t i = qp[r], j = kp[lane];
    T p = T(0), z = T(0), ds = T(0);
    if (!map.blocked(b, i, j) && Ls[r] != ninf<T>()) {
      const bool own = map.self(i, j);
      T s;
      if (own) {
        s = T(a.self_score);
      } else {
        T acc = T(0);
        for (int64_t c = 0; c < a.Dk; ++c) acc += Qs[r * ldk + c] * Ks[lane * ldk + c];
        s = acc * T(a.scale);
      }
      p = dexp(s - Ls[r]);
      z = dropped_weight(a, p, g, bh, i, j);
      if (!own) {
        T dp = T(0);
        for (int64_t c = 0; c < a.Dv; ++c) dp += dOs[r * ldv + c] * Vs[lane * ldv + c];
        if (dropping) dp = z != T(0) ? dp * keep : T(0);
        ds = softmax_grad(p, dp, Ds[r]);
      }
    }
    P[r * BC + lane] = z;
    dS[r * BC + lane] = ds;
  }
}

template <typename T, typename Map>
__global__ void __launch_bounds__(NT) dq_kernel(Args a, Map map) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t Dk = a.Dk, Dv = a.Dv;
  const int ldk = int(Dk) + 1, ldv = int(Dv) + 1;
  Carver<T> cv{reinterpret_cast<T*>(smem_raw)};
  T* Qs = cv.take(BR * ldk);
  T* dOs = cv.take(BR * ldv);
  T* Ks = cv.take(BC * ldk);
  T* Vs = cv.take(BC * ldv);
  T* P = cv.take(BR * BC);
  T* dS = cv.take(BR * BC);
  T* dQs = cv.take(BR * ldk);
  T* Ls = cv.take(BR);
  T* Ds = cv.take(BR);
  __shared__ int64_t qp[BR], kp[BC], orw[BR];
  // dbh: the q, k, v head (grid.z); bh: its output head (b, h) in this launch's round.
  const int64_t dbh = blockIdx.z, bh = blockIdx.z * unsigned(a.R) + unsigned(a.this_round), b = bh / a.H,
                h = bh % a.H;
  const int64_t r0 = int64_t(blockIdx.x) * BR, g = blockIdx.y;
  if (r0 >= map.rows()) return;
  for (int r = threadIdx.x; r < BR; r += NT) {
    qp[r] = r0 + r < map.rows() ? map.qpos(bh, g, r0 + r) : -1;
    orw[r] = qp[r] < 0 ? -1 : map.orow(g, r0 + r, qp[r]);
  }
  for (int64_t e = threadIdx.x; e < BR * Dk; e += NT) dQs[(e / Dk) * ldk + e % Dk] = T(0);
  __syncthreads();
  load_rows(Qs, ldk, static_cast<const T*>(a.q), dbh, a.Nq, Dk, BR, [&](int r) { return qp[r]; });
  row_terms<T>(a, b, h, orw, dOs, ldv, Ls, Ds);
  const int64_t kend = map.key_end(r0, BR);
  for (int64_t j0 = 0; j0 < kend; j0 += BC) {
    __syncthreads();
    for (int j = threadIdx.x; j < BC; j += NT) kp[j] = j0 + j < kend ? map.kpos(bh, g, j0 + j) : -1;
    __syncthreads();
    load_rows(Ks, ldk, static_cast<const T*>(a.k), dbh, a.Nk, Dk, BC, [&](int j) { return kp[j]; });
    load_rows(Vs, ldv, static_cast<const T*>(a.v), dbh, a.Nk, Dv, BC, [&](int j) { return kp[j]; });
    __syncthreads();
    probs_and_dS<T>(a, map, b, g, bh, qp, kp, Qs, Ks, Vs, dOs, Ls, Ds, ldk, ldv, P, dS);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < BR * Dk; e += NT) {
      const int r = int(e / Dk);
      const int64_t c = e % Dk;
      T acc = T(0);
      for (int j = 0; j < BC; ++j) acc += dS[r * BC + j] * Ks[j * ldk + c];
      dQs[r * ldk + c] += acc * T(a.scale);
    }
  }
  __syncthreads();
  T* dQ = static_cast<T*>(a.dq);
  for (int64_t e = threadIdx.x; e < BR * Dk; e += NT) {
    const int r = int(e / Dk);
    const int64_t c = e % Dk, i = orw[r];
    if (i < 0) continue;
    T& dst = dQ[(dbh * a.Mq + i) * Dk + c];
    dst = a.this_round == 0 ? dQs[r * ldk + c] : dst + dQs[r * ldk + c];
  }
}

template <typename T, typename Map>
__global__ void __launch_bounds__(NT) dkdv_kernel(Args a, Map map) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t Dk = a.Dk, Dv = a.Dv;
  const int ldk = int(Dk) + 1, ldv = int(Dv) + 1;
  Carver<T> cv{reinterpret_cast<T*>(smem_raw)};
  T* Qs = cv.take(BR * ldk);
  T* dOs = cv.take(BR * ldv);
  T* Ks = cv.take(BC * ldk);
  T* Vs = cv.take(BC * ldv);
  T* P = cv.take(BR * BC);
  T* dS = cv.take(BR * BC);
  T* dKs = cv.take(BC * ldk);
  T* dVs = cv.take(BC * ldv);
  T* Ls = cv.take(BR);
  T* Ds = cv.take(BR);
  __shared__ int64_t qp[BR], kp[BC], orw[BR], krw[BC];
  const int64_t dbh = blockIdx.z, bh = blockIdx.z * unsigned(a.R) + unsigned(a.this_round), b = bh / a.H,
                h = bh % a.H;  // as in dq_kernel
  const int64_t u0 = int64_t(blockIdx.x) * BC, kg = blockIdx.y;
  if (u0 >= map.group_keys()) return;
  for (int j = threadIdx.x; j < BC; j += NT) {
    kp[j] = u0 + j < map.group_keys() ? map.group_kpos(bh, kg, u0 + j) : -1;
    krw[j] = kp[j] < 0 ? -1 : map.krow(kg, u0 + j, kp[j]);
  }
  for (int64_t e = threadIdx.x; e < BC * Dk; e += NT) dKs[(e / Dk) * ldk + e % Dk] = T(0);
  for (int64_t e = threadIdx.x; e < BC * Dv; e += NT) dVs[(e / Dv) * ldv + e % Dv] = T(0);
  __syncthreads();
  load_rows(Ks, ldk, static_cast<const T*>(a.k), dbh, a.Nk, Dk, BC, [&](int j) { return kp[j]; });
  load_rows(Vs, ldv, static_cast<const T*>(a.v), dbh, a.Nk, Dv, BC, [&](int j) { return kp[j]; });
  for (int64_t t = 0; t < map.visits(); ++t) {
    const int64_t g = map.visit_group(kg, t);
    for (int64_t r0 = map.row_begin(u0, BR); r0 < map.rows(); r0 += BR) {
      __syncthreads();
      for (int r = threadIdx.x; r < BR; r += NT) {
        qp[r] = r0 + r < map.rows() ? map.qpos(bh, g, r0 + r) : -1;
        orw[r] = qp[r] < 0 ? -1 : map.orow(g, r0 + r, qp[r]);
      }
      __syncthreads();
      load_rows(Qs, ldk, static_cast<const T*>(a.q), dbh, a.Nq, Dk, BR, [&](int r) { return qp[r]; });
      row_terms<T>(a, b, h, orw, dOs, ldv, Ls, Ds);  // ends with a barrier
      probs_and_dS<T>(a, map, b, g, bh, qp, kp, Qs, Ks, Vs, dOs, Ls, Ds, ldk, ldv, P, dS);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < BC * Dv; e += NT) {
        const int j = int(e / Dv);
        const int64_t c = e % Dv;
        T acc = T(0);
        for (int r = 0; r < BR; ++r) acc += P[r * BC + j] * dOs[r * ldv + c];
        dVs[j * ldv + c] += acc;
      }
      for (int64_t e = threadIdx.x; e < BC * Dk; e += NT) {
        const int j = int(e / Dk);
        const int64_t c = e % Dk;
        T acc = T(0);
        for (int r = 0; r < BR; ++r) acc += dS[r * BC + j] * Qs[r * ldk + c];
        dKs[j * ldk + c] += acc * T(a.scale);
      }
    }
  }
  __syncthreads();
  T* dK = static_cast<T*>(a.dk);
  T* dV = static_cast<T*>(a.dv);
  for (int64_t e = threadIdx.x; e < BC * Dk; e += NT) {
    const int j = int(e / Dk);
    const int64_t c = e % Dk, p = krw[j];
    if (p < 0) continue;
    T& dst = dK[(dbh * a.Mk + p) * Dk + c];
    dst = a.this_round == 0 ? dKs[j * ldk + c] : dst + dKs[j * ldk + c];
  }
  for (int64_t e = threadIdx.x; e < BC * Dv; e += NT) {
    const int j = int(e / Dv);
    const int64_t c = e % Dv, p = krw[j];
    if (p < 0) continue;
    T& dst = dV[(dbh * a.Mk + p) * Dv + c];
    dst = a.this_round == 0 ? dVs[j * ldv + c] : dst + dVs[j * ldv + c];
  }
}

// ---------------------------------------------------------------- launchers

template <typename T>
size_t fwd_smem(int64_t Dk, int64_t Dv) {
  return sizeof(T) * size_t(BR * (Dk + 1) + BC * (Dk + 1) + BC * Dv + BR * BC + BR * Dv + 3 * BR);
}
template <typename T>
size_t dq_smem(int64_t Dk, int64_t Dv) {
  return sizeof(T) * size_t(2 * BR * (Dk + 1) + BR * (Dv + 1) + BC * (Dk + 1) + BC * (Dv + 1) + 2 * BR * BC + 2 * BR);
}
template <typename T>
size_t dkdv_smem(int64_t Dk, int64_t Dv) {
  return sizeof(T) * size_t(BR * (Dk + 1) + BR * (Dv + 1) + 2 * BC * (Dk + 1) + 2 * BC * (Dv + 1) + 2 * BR * BC +
                            2 * BR);
}

// Groups (chunks) ride on grid.y and batch*heads on grid.z: 65535 at most each.
void check_grid(const char* op, int64_t groups, int64_t BH) {
  CF_CHECK(groups <= 65535 && BH <= 65535, NotImplementedError, "[", op, "] the CUDA kernel takes at most 65535 ",
           "chunks and 65535 batch*heads, got ", groups, " and ", BH);
}

// Lets `kernel` take `bytes` of dynamic shared memory: past what the device allows beside the kernel's static
// shared arrays a NotImplementedError naming the op (cudaFuncSetAttribute would fail with a DeviceError);
// past the default (48 KiB less the static arrays) the opt-in attribute is set.
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op) {
  int dev = 0, limit = 0;
  CF_CUDA_CHECK(cudaGetDevice(&dev), op);
  CF_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), op);
  cudaFuncAttributes attr{};
  CF_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel), op);
  const size_t room = attr.sharedSizeBytes >= size_t(limit) ? 0 : size_t(limit) - attr.sharedSizeBytes;
  CF_CHECK(bytes <= room, NotImplementedError, "[", op, "] head size too large for the CUDA kernel: ", bytes,
           " bytes of shared memory needed, the device allows ", room);
  if (bytes > size_t(attr.maxDynamicSharedSizeBytes))
    CF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), op);
}

template <typename T, typename Map>
void run_forward(const char* op, const Args& a, const Map& map, int64_t rows, int64_t groups, int64_t BH) {
  check_grid(op, groups, BH);
  const dim3 grid(unsigned((rows + BR - 1) / BR), unsigned(groups), unsigned(BH));
  const size_t smem = fwd_smem<T>(a.Dk, a.Dv);
  auto k = fwd_kernel<T, Map>;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  allow_dynamic_smem(reinterpret_cast<const void*>(k), smem, op);
  k<<<grid, NT, smem, ::cf::cuda::stream()>>>(a, map);
  ::cf::cuda::check_launch(op);
}

template <typename T, typename Map>
void run_backward(const char* op, const Args& a, const Map& map, int64_t rows, int64_t groups, int64_t gkeys,
                  int64_t kgroups, int64_t BH) {
  check_grid(op, std::max(groups, kgroups), BH);
  const size_t s1 = dq_smem<T>(a.Dk, a.Dv), s2 = dkdv_smem<T>(a.Dk, a.Dv);
  const dim3 g1(unsigned((rows + BR - 1) / BR), unsigned(groups), unsigned(BH));
  const dim3 g2(unsigned((gkeys + BC - 1) / BC), unsigned(kgroups), unsigned(BH));
  auto k1 = dq_kernel<T, Map>;
  auto k2 = dkdv_kernel<T, Map>;
  allow_dynamic_smem(reinterpret_cast<const void*>(k1), s1, op);
  allow_dynamic_smem(reinterpret_cast<const void*>(k2), s2, op);
  if (g1.x > 0 && g1.y > 0 && g1.z > 0) {
    k1<<<g1, NT, s1, ::cf::cuda::stream()>>>(a, map);
    ::cf::cuda::check_launch(op);
  }
  if (g2.x > 0 && g2.y > 0 && g2.z > 0) {
    k2<<<g2, NT, s2, ::cf::cuda::stream()>>>(a, map);
    ::cf::cuda::check_launch(op);
  }
}

void zero(const Tensor& t, const char* op) {
  if (t.numel() == 0) return;
  CF_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, size_t(t.numel()) * dtype_size(t.dtype()), ::cf::cuda::stream()), op);
}

Args make_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
               double self_score) {
  Args a{};
  a.q = q.raw_data();
  a.k = k.raw_data();
  a.v = v.raw_data();
  a.out = out.raw_data();
  a.lse = lse.raw_data();
  a.so = rows3(out);
  a.sl = rows3(lse);
  a.H = q.shape()[1];
  a.R = 1;
  a.this_round = 0;
  a.Nq = q.shape()[2];
  a.Nk = k.shape()[2];
  a.Dk = q.shape()[3];
  a.Dv = v.shape()[3];
  a.Mq = a.Nq;
  a.Mk = a.Nk;
  a.scale = scale;
  a.self_score = self_score;
  return a;
}

// Routed attention's dropout map into a's (RoutedAttentionParams: list list0 + g of the B H output heads).
void routed_dropout(Args& a, const Tensor& q, const RoutedAttentionParams& p) {
  a.drop = {p.dropout, p.dropout_seed, p.dropout_counter0, p.dropout_rebase};
  a.drop_group0 = p.list0;
  a.drop_heads = q.shape()[0] * q.shape()[1];
}

// ---------------------------------------------------------------- rounds

// One warp per combined row (b, h, n): the R rounds' lse read by every lane (R is
// small), the Dv columns split over the lanes. Layout as rounds_combine_cpu.
template <typename T>
__global__ void __launch_bounds__(NT) rounds_combine_kernel(const T* X, T* Y, int64_t rows, int64_t N, int64_t E,
                                                            int64_t R) {
  const int64_t x = int64_t(blockIdx.x) * NW + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (x >= rows) return;
  const int64_t bh = x / N, n = x % N, Dv = E - 1;
  const T* base = X + (bh * R * N + n) * E;  // round r at base + r * N * E
  T* y = Y + x * E;
  T m = ninf<T>();
  for (int64_t r = 0; r < R; ++r) m = nan_max(m, base[r * N * E + Dv]);
  if (m == ninf<T>()) {
    for (int64_t c = lane; c < Dv; c += 32) y[c] = T(0);
    if (lane == 0) y[Dv] = ninf<T>();
    return;
  }
  T z = T(0);
  for (int64_t r = 0; r < R; ++r) z += dexp(base[r * N * E + Dv] - m);
  for (int64_t c = lane; c < Dv; c += 32) {
    T acc = T(0);
    for (int64_t r = 0; r < R; ++r) acc += dexp(base[r * N * E + Dv] - m) / z * base[r * N * E + c];
    y[c] = acc;
  }
  if (lane == 0) y[Dv] = m + dlog(z);
}

template <typename T>
__global__ void __launch_bounds__(NT) rounds_split_kernel(const T* X, const T* Y, const T* G, T* GX, int64_t rows,
                                                          int64_t N, int64_t E, int64_t R) {
  const int64_t x = int64_t(blockIdx.x) * NW + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (x >= rows) return;
  const int64_t bh = x / N, n = x % N, Dv = E - 1;
  const T* y = Y + x * E;
  const T* g = G + x * E;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t at = ((bh * R + r) * N + n) * E;
    const T* o = X + at;
    T* d = GX + at;
    const T w = (y[Dv] == ninf<T>() || o[Dv] == ninf<T>()) ? T(0) : dexp(o[Dv] - y[Dv]);
    T dot = T(0);
    for (int64_t c = lane; c < Dv; c += 32) {
      dot += g[c] * (o[c] - y[c]);
      d[c] = w * g[c];
    }
    for (int s = 16; s > 0; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    if (lane == 0) d[Dv] = w * (dot + g[Dv]);
  }
}

// ---------------------------------------------------------------- the GEMM path's row step

// One block per row (grid-stride over rows). Forward (dP null): the row's maximum and sum of exponentials
// by block reductions (the sum in double, as the CPU's), lse written, then exp(s - max) / sum in place.
// Backward: lse read, P = exp(s - lse) in place and dS = P (dP - D) over dP, in one pass.
// With a dropout rate (attention.h, AttentionRows): the forward writes the dropped, scaled weights; the
// backward leaves those (Z) in s and takes dP' = dP / (1 - rate) at the kept weights, 0 at the dropped ones.
// The draw is dropout_cuda.cu's (Philox of the weight's counter, its 53-bit uniform against the rate), so
// the same weights drop as on the CPU.
// Layout and rule as rows_softmax_typed in attention_cpu.cpp.
constexpr int kRowThreads = 256;


template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    rows_softmax_kernel(T* S, const bool* pad, T* L, int64_t rows, int64_t H, int64_t R, int64_t W, int64_t Nk,
                        AttentionRows rw, T* dP, const T* D) {
  __shared__ double red[32];
  const cu::BlockRow row{red};
  const T neg_inf = ninf<T>();
  const double rate = rw.dropout.rate;
  const T keep = T(1.0 / (1.0 - rate));
  for (int64_t g = blockIdx.x; g < rows; g += gridDim.x) {
    const int64_t bh = g / R, i = rw.row0 + g % R, b = bh / H;
    // The counter of this row's key 0 (weight (bh, i, 0) of the dense (B, H, Nq, Nk) weights).
    const uint64_t c0 = dropout_counter(rw.dropout, (uint64_t(bh) * uint64_t(rw.Nq) + uint64_t(i)) * uint64_t(Nk));
    int64_t jend = W;  // keys >= jend are blocked (causal)
    if (rw.causal) jend = i + Nk - rw.Nq + 1 < 0 ? 0 : (i + Nk - rw.Nq + 1 > W ? W : i + Nk - rw.Nq + 1);
    const bool* pb = pad ? pad + b * Nk : nullptr;
    T* s = S + g * W;
    T* l = L + bh * rw.Nq + i;
    T li, m = neg_inf, inv = T(0);
    if (dP) {
      li = *l;
    } else {
      for (int64_t j = threadIdx.x; j < jend; j += kRowThreads)
        if (!(pb && pb[j])) m = nan_max(m, s[j]);  // a NaN score: m NaN, the row NaN (not a masked row)
      m = row.max(m);
      if (m == neg_inf) {
        li = neg_inf;
      } else {
        double sum = 0;
        for (int64_t j = threadIdx.x; j < jend; j += kRowThreads)
          if (!(pb && pb[j])) sum += double(dexp(s[j] - m));
        sum = row.sum(sum);
        li = T(double(m) + log(sum));
        inv = T(1.0 / sum);
      }
      if (threadIdx.x == 0) *l = li;
    }
    if (dP) {
      T* d = dP + g * W;
      const T Di = D[bh * rw.Nq + i];
      for (int64_t j = threadIdx.x; j < W; j += kRowThreads) {
        const T p = (li == neg_inf || j >= jend || (pb && pb[j])) ? T(0) : dexp(s[j] - li);
        if (rate > 0) {
          const T z = dropout_keeps(rw.dropout, c0 + uint64_t(j)) ? p * keep : T(0);
          s[j] = z;
          d[j] = softmax_grad(p, z != T(0) ? d[j] * keep : T(0), Di);
        } else {
          s[j] = p;
          d[j] = softmax_grad(p, d[j], Di);
        }
      }
    } else {
      // exp(s - m) / sum as the CPU's softmax_rows: exp(s - lse) would round lse = m + log(sum) in T first,
      // an error of ulp(m) in every weight of the row (5e-4 relative for float32 scores near 1e4).
      for (int64_t j = threadIdx.x; j < W; j += kRowThreads) {
        T p = (li == neg_inf || j >= jend || (pb && pb[j])) ? T(0) : dexp(s[j] - m) * inv;
        if (rate > 0) p = dropout_keeps(rw.dropout, c0 + uint64_t(j)) ? p * keep : T(0);
        s[j] = p;
      }
    }
    __syncthreads();  // red is reused by the next row's reductions
  }
}

// ---------------------------------------------------------------- block attention's GEMM path steps
// Layouts and rules as the *_typed functions of the same names in attention_cpu.cpp.

// A slot table view (B, Ho, n, s): the position of slot u of block row g, or -1 when empty.
struct SlotTab {
  const int64_t* t;
  int64_t Ho, n, s, s0, s1, s2, s3, N;
  __device__ const int64_t* at(int64_t g) const {
    const int64_t c = g % n, bh = g / n;
    return t + (bh / Ho) * s0 + (bh % Ho) * s1 + c * s2;
  }
  __device__ int64_t pos(const int64_t* row, int64_t u) const {
    const int64_t j = row[u * s3];
    return j >= 0 && j < N ? j : -1;
  }
};

SlotTab slot_tab(const Tensor& table, int64_t N) {
  const Shape &sh = table.shape(), &st = table.strides();
  return {table.data<int64_t>(), sh[1], sh[2], sh[3], st[0], st[1], st[2], st[3], N};
}

// One thread per element of out (B, Ho, n, s, D).
template <typename T>
__global__ void gather_slots_kernel(const T* X, int64_t xs0, int64_t xs1, int64_t xs2, SlotTab tab, int64_t R,
                                    int64_t D, int64_t total, T* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t d = e % D, slot = e / D, u = slot % tab.s, g = slot / tab.s;
    const int64_t b = g / (tab.Ho * tab.n), h = (g / tab.n) % tab.Ho / R;
    const int64_t j = tab.pos(tab.at(g), u);
    out[e] = j < 0 ? T(0) : X[b * xs0 + h * xs1 + j * xs2 + d];
  }
}

// One thread per element of (B, Hout, n, s, D); each writes (or adds to) one element of out, and one call
// writes each element at most once (a position sits once in a table head).
template <typename T>
__global__ void scatter_slots_kernel(const T* src, int64_t ss0, int64_t ss1, int64_t ss2, int64_t ss3, SlotTab tab,
                                     int64_t R, int64_t round, bool accumulate, int64_t Hout, int64_t D,
                                     int64_t total, T* out, int64_t os0, int64_t os1, int64_t os2) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t d = e % D, u = (e / D) % tab.s, c = (e / (D * tab.s)) % tab.n, bh = e / (D * tab.s * tab.n);
    const int64_t b = bh / Hout, h = bh % Hout, ho = h * R + round;
    const int64_t j = tab.pos(tab.at((b * tab.Ho + ho) * tab.n + c), u);
    if (j < 0) continue;
    const T x = src[b * ss0 + ho * ss1 + c * ss2 + u * ss3 + d];
    T& o = out[b * os0 + h * os1 + j * os2 + d];
    o = accumulate ? o + x : x;
  }
}

struct LseAt {
  int64_t s0, s1, s2;
};

// The score of key slot j of a row whose query sits at position i (masked: -inf; own under self_mask:
// self_score), as mask_scores on the CPU.
template <typename T>
__device__ __forceinline__ T block_score(T s, int64_t i, int64_t kpos, const bool* pad_b, const BlockRows& br,
                                         bool* own) {
  *own = false;
  if (i < 0 || kpos < 0 || (pad_b && pad_b[kpos]) || (br.causal && kpos > i)) return ninf<T>();
  if (br.self_mask && kpos == i) {
    *own = true;
    return T(br.self_score);
  }
  return s;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A warp per score row (grid-stride): the masked row's maximum and sum of exponentials (the sum in double, as
// the CPU's), the log-sum-exp to lse at the query's position, then exp(s - lse) in place (with a dropout rate
// dropped or scaled, the counter that of (query position, key position): attention.h, BlockAttentionParams).
template <typename T>
__global__ void block_rows_softmax_kernel(T* S, SlotTab tab, const bool* pad, T* L, LseAt la, int64_t rows,
                                          int64_t w, int64_t W, BlockRows br) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t g = row / w, b = g / (tab.Ho * tab.n), ho = (g / tab.n) % tab.Ho;
    const int64_t* trow = tab.at(g);
    const int64_t i = tab.pos(trow, row % w);
    const bool* pb = pad ? pad + b * tab.N : nullptr;
    T* s = S + row * W;
    bool own;
    T m = ninf<T>();
    for (int64_t j = lane; j < W; j += 32) {
      const T x = block_score(s[j], i, tab.pos(trow, j), pb, br, &own);
      m = nan_max(m, x);
    }
    for (int o = 16; o > 0; o >>= 1) {
      const T y = __shfl_xor_sync(0xffffffffu, m, o);
      m = nan_max(m, y);  // every lane the same m, NaN included: the sum below runs on all or none
    }
    T li = ninf<T>(), inv = T(0);
    if (m != ninf<T>()) {
      double sum = 0;
      for (int64_t j = lane; j < W; j += 32) {
        const T x = block_score(s[j], i, tab.pos(trow, j), pb, br, &own);
        if (x != ninf<T>()) sum += double(dexp(x - m));
      }
      sum = warp_sum(sum);
      li = T(double(m) + log(sum));
      inv = T(1.0 / sum);
    }
    if (lane == 0 && i >= 0) L[b * la.s0 + ho * la.s1 + i * la.s2] = li;
    const uint64_t c0 =
        dropout_counter(br.dropout, (uint64_t(g / tab.n) * uint64_t(tab.N) + uint64_t(i)) * uint64_t(tab.N));
    const T keep = T(1.0 / (1.0 - br.dropout.rate));
    for (int64_t j = lane; j < W; j += 32) {  // exp(x - m) / sum: see rows_softmax_kernel
      const int64_t kpos = tab.pos(trow, j);
      const T x = block_score(s[j], i, kpos, pb, br, &own);
      T p = (li == ninf<T>() || x == ninf<T>()) ? T(0) : dexp(x - m) * inv;
      if (br.dropout.rate > 0 && i >= 0) p = dropout_keeps(br.dropout, c0 + uint64_t(kpos)) ? p * keep : T(0);
      s[j] = p;
    }
  }
}

// A warp per score row: P = exp(S - lse) into S and dS = P (dP - D) into dP (0 for a self_score entry). With a
// dropout rate: the dropped, scaled weights Z into S and dS = P (dP' - D), dP' = dP / (1 - rate) at the kept
// weights, 0 at the dropped ones (attention_rows_grad's rule).
template <typename T>
__global__ void block_rows_grad_kernel(T* S, T* dP, SlotTab tab, const bool* pad, const T* L, LseAt la,
                                       const T* D, int64_t rows, int64_t w, int64_t W, BlockRows br) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t g = row / w, bh = g / tab.n, b = bh / tab.Ho, ho = bh % tab.Ho;
    const int64_t* trow = tab.at(g);
    const int64_t i = tab.pos(trow, row % w);
    const bool* pb = pad ? pad + b * tab.N : nullptr;
    const T li = i < 0 ? ninf<T>() : L[b * la.s0 + ho * la.s1 + i * la.s2];
    const T Di = D[row];
    T* s = S + row * W;
    T* dp = dP + row * W;
    const bool dropping = br.dropout.rate > 0 && i >= 0;
    const uint64_t c0 = dropout_counter(br.dropout, (uint64_t(bh) * uint64_t(tab.N) + uint64_t(i)) * uint64_t(tab.N));
    const T keep = T(1.0 / (1.0 - br.dropout.rate));
    for (int64_t j = lane; j < W; j += 32) {
      bool own;
      const int64_t kpos = tab.pos(trow, j);
      const T x = block_score(s[j], i, kpos, pb, br, &own);
      const T p = (li == ninf<T>() || x == ninf<T>()) ? T(0) : dexp(x - li);
      T z = p, d = dp[j];
      if (dropping) {
        z = dropout_keeps(br.dropout, c0 + uint64_t(kpos)) ? p * keep : T(0);
        d = z != T(0) ? d * keep : T(0);
      }
      s[j] = z;
      dp[j] = own ? T(0) : softmax_grad(p, d, Di);
    }
  }
}

constexpr int kBlockRowThreads = 256;  // 8 warps, a row each
static_assert(kBlockRowThreads % 32 == 0, "the row kernels run whole warps");

}  // namespace

void rounds_combine_cuda(const Tensor& per_round, int64_t rounds, const Tensor& combined) {
  const char* op = "block_attention";
  cu::use_device_of(combined, op);
  const int64_t E = combined.shape()[3], rows = E > 0 ? combined.numel() / E : 0;
  if (rows == 0) return;
  const unsigned blocks = unsigned((rows + NW - 1) / NW);
  CF_DISPATCH_FLOAT_STD(combined.dtype(), op,
                        rounds_combine_kernel<scalar_t>
                        <<<blocks, NT, 0, ::cf::cuda::stream()>>>(per_round.data<scalar_t>(), combined.data<scalar_t>(),
                                                                  rows, combined.shape()[2], E, rounds));
  ::cf::cuda::check_launch(op);
}

void rounds_split_cuda(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t rounds,
                       const Tensor& per_round_grad) {
  const char* op = "block_attention";
  cu::use_device_of(combined, op);
  const int64_t E = combined.shape()[3], rows = E > 0 ? combined.numel() / E : 0;
  if (rows == 0) return;
  const unsigned blocks = unsigned((rows + NW - 1) / NW);
  CF_DISPATCH_FLOAT_STD(combined.dtype(), op,
                        rounds_split_kernel<scalar_t><<<blocks, NT, 0, ::cf::cuda::stream()>>>(
                            per_round.data<scalar_t>(), combined.data<scalar_t>(), grad.data<scalar_t>(),
                            per_round_grad.data<scalar_t>(), rows, combined.shape()[2], E, rounds));
  ::cf::cuda::check_launch(op);
}

void flash_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                  const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  check_flash_no_dropout(p, "CUDA kernel");
  const char* op = "flash_attention";
  cu::use_device_of(out, op);
  const Args a = make_args(q, k, v, out, lse, p.scale, 0.0);
  const FullMap map = full_map(q, k, kpm, p);
  const int64_t BH = q.shape()[0] * q.shape()[1];
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_forward<scalar_t>(op, a, map, a.Nq, 1, BH));
}

void flash_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                   const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                   const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv) {
  check_flash_no_dropout(p, "CUDA kernel");
  const char* op = "flash_attention";
  cu::use_device_of(out, op);
  Args a = make_args(q, k, v, out, lse, p.scale, 0.0);
  a.dout = dout.raw_data();
  a.sgo = rows3(dout);
  if (dlse.defined()) {
    a.dlse = dlse.raw_data();
    a.sgl = rows3(dlse);
  }
  a.dq = dq.raw_data();
  a.dk = dk.raw_data();
  a.dv = dv.raw_data();
  // Rows the kernels never write: none for full attention, but Nq or Nk may be 0.
  zero(dq, op);
  zero(dk, op);
  zero(dv, op);
  const FullMap map = full_map(q, k, kpm, p);
  const int64_t BH = q.shape()[0] * q.shape()[1];
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_backward<scalar_t>(op, a, map, a.Nq, 1, a.Nk, 1, BH));
}

void block_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                  const Tensor& lse) {
  const char* op = "block_attention";
  check_no_attention_dropout(p.dropout, op, "fused CUDA kernel");
  cu::use_device_of(out, op);
  // Tokens in no slot keep out = 0, lse = -inf.
  fill_cuda(out, 0.0);
  fill_cuda(lse, -std::numeric_limits<double>::infinity());
  Args a = make_args(q, k, v, out, lse, p.scale, p.self_score);
  a.R = int(p.rounds);
  a.H *= p.rounds;
  const BlockMap map = block_map(q, members, kpm, p);
  const int64_t BH = q.shape()[0] * a.H;  // output heads
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_forward<scalar_t>(op, a, map, map.w, map.C, BH));
}

void block_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv) {
  const char* op = "block_attention";
  check_no_attention_dropout(p.dropout, op, "fused CUDA kernel");
  cu::use_device_of(out, op);
  Args a = make_args(q, k, v, out, lse, p.scale, p.self_score);
  a.dout = dout.raw_data();
  a.sgo = rows3(dout);
  if (dlse.defined()) {
    a.dlse = dlse.raw_data();
    a.sgl = rows3(dlse);
  }
  a.dq = dq.raw_data();
  a.dk = dk.raw_data();
  a.dv = dv.raw_data();
  a.R = int(p.rounds);
  a.H *= p.rounds;
  zero(dq, op);  // tokens in no slot get no gradient
  zero(dk, op);
  zero(dv, op);
  const BlockMap map = block_map(q, members, kpm, p);
  const int64_t BH = q.shape()[0] * q.shape()[1];  // q, k, v heads: one launch pair per round
  for (a.this_round = 0; a.this_round < a.R; ++a.this_round)
    CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_backward<scalar_t>(op, a, map, map.w, map.C, map.w, map.C, BH));
}

void routed_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                   const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                   const Tensor& out, const Tensor& lse) {
  const char* op = "routed_attention";
  cu::use_device_of(out, op);
  // Empty query slots keep out = 0, lse = -inf.
  fill_cuda(out, 0.0);
  fill_cuda(lse, -std::numeric_limits<double>::infinity());
  Args a = make_args(q, k, v, out, lse, p.scale, 0.0);
  routed_dropout(a, q, p);
  const RoutedMap map = routed_map(q, qm, km, kpm, p);
  const int64_t BH = q.shape()[0] * q.shape()[1];
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_forward<scalar_t>(op, a, map, map.wq, map.C, BH));
}

void routed_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                    const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  const char* op = "routed_attention";
  cu::use_device_of(out, op);
  Args a = make_args(q, k, v, out, lse, p.scale, 0.0);
  routed_dropout(a, q, p);
  a.dout = dout.raw_data();
  a.sgo = rows3(dout);
  a.dq = dq.raw_data();
  a.dk = dk.raw_data();
  a.dv = dv.raw_data();
  const RoutedMap map = routed_map(q, qm, km, kpm, p);
  a.Mq = map.C * map.wq;  // slot-order gradients
  a.Mk = map.C * map.wk;
  zero(dq, op);  // empty slots get zero rows
  zero(dk, op);
  zero(dv, op);
  const int64_t BH = q.shape()[0] * q.shape()[1];
  CF_DISPATCH_FLOAT_STD(q.dtype(), op, run_backward<scalar_t>(op, a, map, map.wq, map.C, map.wk, map.C, BH));
}

void attention_rows_softmax_cuda(const Tensor& scores, const Tensor& kpm, const AttentionRows& rows,
                                 const Tensor& lse) {
  const char* op = "flash_attention";
  cu::use_device_of(scores, op);
  const int64_t H = scores.shape()[1], R = scores.shape()[2], W = scores.shape()[3];
  const int64_t n = scores.shape()[0] * H * R;
  if (n == 0) return;  // W == 0: every row blocked, lse -inf written
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  CF_DISPATCH_FLOAT_STD(scores.dtype(), op,
                        rows_softmax_kernel<scalar_t><<<cu::blocks_for(n), kRowThreads, 0, ::cf::cuda::stream()>>>(
                            scores.data<scalar_t>(), pad, lse.data<scalar_t>(), n, H, R, W, rows.Nk > 0 ? rows.Nk : W,
                            rows, nullptr, nullptr));
  ::cf::cuda::check_launch(op);
}

void attention_rows_grad_cuda(const Tensor& scores, const Tensor& dp, const Tensor& kpm, const AttentionRows& rows,
                              const Tensor& lse, const Tensor& D) {
  const char* op = "flash_attention";
  cu::use_device_of(scores, op);
  const int64_t H = scores.shape()[1], R = scores.shape()[2], W = scores.shape()[3];
  const int64_t n = scores.shape()[0] * H * R;
  if (n == 0 || W == 0) return;
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  CF_DISPATCH_FLOAT_STD(scores.dtype(), op,
                        rows_softmax_kernel<scalar_t><<<cu::blocks_for(n), kRowThreads, 0, ::cf::cuda::stream()>>>(
                            scores.data<scalar_t>(), pad, lse.data<scalar_t>(), n, H, R, W, rows.Nk > 0 ? rows.Nk : W,
                            rows, dp.data<scalar_t>(), D.data<scalar_t>()));
  ::cf::cuda::check_launch(op);
}

void gather_slot_rows_cuda(const Tensor& x, const Tensor& table, int64_t rounds, const Tensor& out) {
  const char* op = "block_attention";
  cu::use_device_of(out, op);
  const int64_t total = out.numel();
  if (total == 0) return;
  const SlotTab tab = slot_tab(table, x.shape()[2]);
  const Shape& xs = x.strides();
  CF_DISPATCH_FLOAT_STD(
      x.dtype(), op,
      gather_slots_kernel<scalar_t><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(
          x.data<scalar_t>(), xs[0], xs[1], xs[2], tab, rounds, x.shape()[3], total, out.data<scalar_t>()));
  ::cf::cuda::check_launch(op);
}

void scatter_slot_rows_cuda(const Tensor& src, const Tensor& table, int64_t rounds, int64_t round, bool accumulate,
                            const Tensor& out) {
  const char* op = "block_attention";
  cu::use_device_of(out, op);
  const int64_t Hout = out.shape()[1], D = out.shape()[3];
  const SlotTab tab = slot_tab(table, out.shape()[2]);
  const int64_t total = out.shape()[0] * Hout * tab.n * tab.s * D;
  if (total == 0) return;
  const Shape &ss = src.strides(), &os = out.strides();
  CF_DISPATCH_FLOAT_STD(out.dtype(), op,
                        scatter_slots_kernel<scalar_t><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                            src.data<scalar_t>(), ss[0], ss[1], ss[2], ss[3], tab, rounds, round, accumulate, Hout, D,
                            total, out.data<scalar_t>(), os[0], os[1], os[2]));
  ::cf::cuda::check_launch(op);
}

namespace {

// What both row kernels' launches share: the score rows, the table, the lse strides, the padding, the grid.
struct BlockRowLaunch {
  int64_t rows, w, W;
  SlotTab tab;
  LseAt la;
  const bool* pad;
  unsigned grid;
};
BlockRowLaunch block_row_launch(const Tensor& scores, const Tensor& table, const Tensor& kpm, const Tensor& lse) {
  cu::use_device_of(scores, "block_attention");
  const int64_t W = scores.shape()[4], rows = W > 0 ? scores.numel() / W : 0, warps = kBlockRowThreads / 32;
  return {rows,
          scores.shape()[3],
          W,
          slot_tab(table, lse.shape()[2]),
          {lse.strides()[0], lse.strides()[1], lse.strides()[2]},
          kpm.defined() ? kpm.data<bool>() : nullptr,
          cu::blocks_for((rows + warps - 1) / warps)};
}

}  // namespace

void block_rows_softmax_cuda(const Tensor& scores, const Tensor& table, const Tensor& kpm, const BlockRows& rows,
                             const Tensor& lse) {
  const BlockRowLaunch l = block_row_launch(scores, table, kpm, lse);
  if (l.rows == 0) return;
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "block_attention",
                        block_rows_softmax_kernel<scalar_t><<<l.grid, kBlockRowThreads, 0, ::cf::cuda::stream()>>>(
                            scores.data<scalar_t>(), l.tab, l.pad, lse.data<scalar_t>(), l.la, l.rows, l.w, l.W, rows));
  ::cf::cuda::check_launch("block_attention");
}

void block_rows_grad_cuda(const Tensor& scores, const Tensor& dp, const Tensor& table, const Tensor& kpm,
                          const BlockRows& rows, const Tensor& lse, const Tensor& D) {
  const BlockRowLaunch l = block_row_launch(scores, table, kpm, lse);
  if (l.rows == 0) return;
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "block_attention",
                        block_rows_grad_kernel<scalar_t><<<l.grid, kBlockRowThreads, 0, ::cf::cuda::stream()>>>(
                            scores.data<scalar_t>(), dp.data<scalar_t>(), l.tab, l.pad, lse.data<scalar_t>(), l.la,
                            D.data<scalar_t>(), l.rows, l.w, l.W, rows));
  ::cf::cuda::check_launch("block_attention");
}

// ---------------------------------------------------------------- routed attention: slots <-> tokens
// The slots grouped by the position they hold (segments_by_key_cuda, stable: increasing s), then a block per
// (head, position) whose threads each add one column over its slots in order, as the CPU does.

namespace routed_tokens_cuda {

// Item (bh, s)'s key bh (N + 1) + its position (N: an empty slot).
__global__ void keys_kernel(RoutedLists L, int64_t items, uint64_t* keys) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < items; e += step) {
    const int64_t bh = e / L.S, pos = L.pos(bh, e % L.S);
    keys[e] = uint64_t(bh * (L.N + 1) + (pos < 0 ? L.N : pos));
  }
}

// Row r = bh (N + 1) + pos of the segments: out[bh, pos] = (sum of its slots' rows) / max(count, 1), count the
// slots with lse > -inf (to_tokens); or out[bh, pos] += the sum (to_tokens false; from 0 with accumulate false).
template <typename T>
__global__ void rows_kernel(const T* src, const T* lse, const int64_t* order, const int64_t* start,
                            const int64_t* count, int64_t rows, int64_t N, int64_t D, bool to_tokens, bool accumulate,
                            T* out, T* counts) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t bh = r / (N + 1), pos = r % (N + 1);
    if (pos == N) continue;  // the empty slots
    const int64_t p0 = start[r], p1 = p0 + count[r];
    T held = 0;
    if (to_tokens) {
      for (int64_t p = p0; p < p1; ++p) held += lse[order[p]] > T(-INFINITY) ? T(1) : T(0);
      if (threadIdx.x == 0) counts[bh * N + pos] = held;
    }
    const T c = held > T(1) ? held : T(1);
    T* o = out + (bh * N + pos) * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      T s = to_tokens || !accumulate ? T(0) : o[j];
      for (int64_t p = p0; p < p1; ++p) s += src[order[p] * D + j];
      o[j] = to_tokens ? s / c : s;
    }
  }
}

template <typename T>
__global__ void to_slots_kernel(const T* g, const T* counts, RoutedLists L, int64_t total, int64_t D, T* gs) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / D, j = e % D, bh = r / L.S, pos = L.pos(bh, r % L.S);
    if (pos < 0) {
      gs[e] = T(0);
      continue;
    }
    const T c = counts[bh * L.N + pos];
    gs[e] = g[(bh * L.N + pos) * D + j] / (c > T(1) ? c : T(1));
  }
}

// Segments of the slots of `lists` by position; then `each(order, start, count, rows)`.
template <typename F>
void by_position(const Tensor& lists, int64_t B, int64_t H, int64_t N, Device dev, const char* op, F each) {
  const RoutedLists L = routed_lists_of(lists, B, H, N);
  const int64_t items = B * H * L.S, rows = B * H * (N + 1);
  if (rows == 0) return;
  Tensor keys = Tensor::empty({std::max<int64_t>(items, 1)}, kInt64, dev);
  uint64_t* kp = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(keys));
  if (items > 0) {
    keys_kernel<<<cu::grid_for(items), cu::kThreads, 0, ::cf::cuda::stream()>>>(L, items, kp);
    ::cf::cuda::check_launch(op);
  }
  Tensor order = Tensor::empty({std::max<int64_t>(items, 1)}, kInt64, dev), start = Tensor::empty({rows}, kInt64, dev),
         count = Tensor::empty({rows}, kInt64, dev);
  segments_by_key_cuda(kp, items, rows, order, start, count, op);
  each(cu::ptr<int64_t>(order), cu::ptr<int64_t>(start), cu::ptr<int64_t>(count), rows);
}

int row_threads(int64_t D) {
  return int(std::max<int64_t>(cu::kWarp, std::min<int64_t>(cu::kThreads, (D + cu::kWarp - 1) / cu::kWarp * cu::kWarp)));
}

}  // namespace routed_tokens_cuda

void routed_slots_to_tokens_cuda(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out,
                                 const Tensor& count) {
  using namespace routed_tokens_cuda;
  const char* op = "routed_attention";
  const int64_t B = out.shape()[0], H = out.shape()[1], N = out.shape()[2], D = out.shape()[3];
  cu::use_device_of(out, op);
  by_position(lists, B, H, N, out.device(), op,
              [&](const int64_t* order, const int64_t* start, const int64_t* cnt, int64_t rows) {
                CF_DISPATCH_FLOAT_STD(
                    out.dtype(), op,
                    (rows_kernel<scalar_t><<<cu::blocks_for(rows), row_threads(D), 0, ::cf::cuda::stream()>>>(
                        cu::ptr<scalar_t>(slots), cu::ptr<scalar_t>(lse), order, start, cnt, rows, N, D, true, false,
                        cu::ptr<scalar_t>(out), cu::ptr<scalar_t>(count))));
                ::cf::cuda::check_launch(op);
              });
}

void routed_tokens_to_slots_cuda(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs) {
  using namespace routed_tokens_cuda;
  const char* op = "routed_attention";
  const int64_t B = g.shape()[0], H = g.shape()[1], N = g.shape()[2], D = g.shape()[3], total = gs.numel();
  if (total == 0) return;
  cu::use_device_of(gs, op);
  const RoutedLists L = routed_lists_of(lists, B, H, N);
  CF_DISPATCH_FLOAT_STD(gs.dtype(), op,
                        (to_slots_kernel<scalar_t><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(g), cu::ptr<scalar_t>(count), L, total, D, cu::ptr<scalar_t>(gs))));
  ::cf::cuda::check_launch(op);
}

void routed_slots_add_cuda(const Tensor& src, const Tensor& lists, const Tensor& out, const Tensor& src2,
                           const Tensor& out2, bool accumulate) {
  using namespace routed_tokens_cuda;
  const char* op = "routed_attention";
  const int64_t B = out.shape()[0], H = out.shape()[1], N = out.shape()[2];
  cu::use_device_of(out, op);
  by_position(lists, B, H, N, out.device(), op, [&](const int64_t* order, const int64_t* start, const int64_t* cnt,
                                                    int64_t rows) {
    for (const auto& [s, o] : {std::pair<const Tensor*, const Tensor*>{&src, &out}, {&src2, &out2}}) {
      if (!o->defined()) continue;
      const int64_t D = o->shape()[3];
      CF_DISPATCH_FLOAT_STD(o->dtype(), op,
                            (rows_kernel<scalar_t><<<cu::blocks_for(rows), row_threads(D), 0, ::cf::cuda::stream()>>>(
                                cu::ptr<scalar_t>(*s), nullptr, order, start, cnt, rows, N, D, false, accumulate,
                                cu::ptr<scalar_t>(*o), nullptr)));
      ::cf::cuda::check_launch(op);
    }
  });
}

}  // namespace cf::kernels
