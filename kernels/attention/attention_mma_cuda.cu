// Flash attention's forward on tensor cores for 16-bit q, k, v (bfloat16 or float16;
// issue 26): the FlashAttention-2 forward of attention_cuda.cu (online softmax over
// key tiles, Alg. 1) with both products, S = Q K^T and O += P V, as
// mma.sync.m16n8k16 instructions with float32 accumulation (sm_80 and newer).
//
// Block: 4 warps, 64 query rows (16 per warp, one m16 tile); key tiles of 64 rows.
// Each warp keeps its Q fragments, its S tile (16 x 64) and its O rows (16 x D) in
// registers: S's accumulators are P's A fragments after the softmax (the
// accumulator and A layouts agree), rounded once to the 16-bit type, as
// FlashAttention does. K and V tiles go through shared memory (rows padded by 16
// bytes against bank conflicts). The row statistics (m, l) and the output are
// float32; out and lse are written as float32, so the backward (the float32 kernel
// on float32 copies, autograd/ops/attention.cpp) reads them as it reads its own.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", g = lane / 4,
// t = lane % 4): A (16 x 16, row-major) registers hold (g, 2t..2t+1), (g + 8, 2t..),
// (g, 2t + 8..), (g + 8, 2t + 8..); B (16 x 8, column-major) holds rows 2t..2t+1
// and 2t + 8.. of column g; C (16 x 8) holds (g, 2t..2t+1) and (g + 8, 2t..2t+1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <limits>

#include "kernels/attention/attention.h"
#include "kernels/common/cuda_utils.cuh"

namespace cf::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile (== kRows: Q goes through the K buffer)
constexpr int kPad = 8;             // 16-bit elements of padding per shared row

struct MmaArgs {
  const uint16_t* q;  // (B*H, Nq, D)
  const uint16_t* k;  // (B*H, Nk, D)
  const uint16_t* v;  // (B*H, Nk, D)
  float* out;         // (B*H, Nq, D)
  float* lse;         // (B*H, Nq)
  const bool* pad;    // (B, Nk) or null
  // Backward only: dO (B*H, Nq, D), D_i = dO_i . O_i (B*H, Nq), and the float32 gradients.
  const float* dout;
  float* dvec;
  float *dq, *dk, *dv;
  int64_t H, Nq, Nk, shift;
  float scale;
  bool causal;
};

template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kBF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&h);
  }
  return r;
}

// c += a b for one m16n8k16 tile.
template <bool kBF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: tensor_cores_usable() refuses kernels compiled for < sm_80
#endif
}

// Rows [row0, row0 + 64) of X (n rows of D 16-bit values) into S, zeros past n, in 16-byte vectors.
template <int D>
__device__ __forceinline__ void load_tile(uint16_t (*S)[D + kPad], const uint16_t* X, int64_t row0, int64_t n) {
  constexpr int kVec = 8, kPerRow = D / kVec;
  for (int e = threadIdx.x; e < kKeys * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < n) val = *reinterpret_cast<const uint4*>(X + (row0 + r) * D + c);
    *reinterpret_cast<uint4*>(&S[r][c]) = val;
  }
}

__device__ __forceinline__ uint32_t load2(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows [row0, row0 + 64) of X (n rows of D float32 values) into S rounded to the 16-bit type, zeros past n
// (dO for the backward's products).
template <bool kBF16, int D>
__device__ __forceinline__ void load_tile_f32(uint16_t (*S)[D + kPad], const float* X, int64_t row0, int64_t n) {
  constexpr int kPerRow = D / 2;
  for (int e = threadIdx.x; e < kKeys * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * 2;
    const float2 val = row0 + r < n ? *reinterpret_cast<const float2*>(X + (row0 + r) * D + c) : make_float2(0.f, 0.f);
    *reinterpret_cast<uint32_t*>(&S[r][c]) = pack2<kBF16>(val.x, val.y);
  }
}

// The A fragments of rows [r, r + 16) of a shared tile (16 x D, one m16 tile per 16 columns).
template <int D>
__device__ __forceinline__ void a_fragments(uint32_t (&f)[D / 16][4], uint16_t (*S)[D + kPad], int r, int g, int t) {
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    f[s][0] = load2(&S[r + g][s * 16 + 2 * t]);
    f[s][1] = load2(&S[r + g + 8][s * 16 + 2 * t]);
    f[s][2] = load2(&S[r + g][s * 16 + 8 + 2 * t]);
    f[s][3] = load2(&S[r + g + 8][s * 16 + 8 + 2 * t]);
  }
}

// c (16 x 64, 8 tiles of 8 columns) += A (16 x D, fragments) Y^T for the 64 rows of Y (64 x D) in shared
// memory: S = Q K^T and its kin. B (k = column of Y, n = row of Y) reads two adjacent values of a row.
template <bool kBF16, int D>
__device__ __forceinline__ void mma_a_yt(float (&c)[kKeys / 8][4], const uint32_t (&a)[D / 16][4],
                                         uint16_t (*Y)[D + kPad], int g, int t) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      mma16816<kBF16>(c[n], a[ks], load2(&Y[n * 8 + g][ks * 16 + 2 * t]), load2(&Y[n * 8 + g][ks * 16 + 8 + 2 * t]));
}

// o (16 x D, D / 8 tiles) += P Y for P (16 x 64) held as the accumulators of mma_a_yt (they are P's A
// fragments once rounded: tiles 2ks and 2ks + 1 give k-step ks) and Y (64 x D) in shared memory. B (k = row
// of Y, n = column) pairs the values of two adjacent rows.
template <bool kBF16, int D>
__device__ __forceinline__ void mma_p_y(float (&o)[D / 8][4], const float (&p)[kKeys / 8][4],
                                        uint16_t (*Y)[D + kPad], int g, int t) {
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) {
    const uint32_t pa[4] = {pack2<kBF16>(p[2 * ks][0], p[2 * ks][1]), pack2<kBF16>(p[2 * ks][2], p[2 * ks][3]),
                            pack2<kBF16>(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                            pack2<kBF16>(p[2 * ks + 1][2], p[2 * ks + 1][3])};
    const int k0 = ks * 16 + 2 * t;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int c = d * 8 + g;
      const uint32_t b0 = uint32_t(Y[k0][c]) | (uint32_t(Y[k0 + 1][c]) << 16);
      const uint32_t b1 = uint32_t(Y[k0 + 8][c]) | (uint32_t(Y[k0 + 9][c]) << 16);
      mma16816<kBF16>(o[d], pa, b0, b1);
    }
  }
}

// Whether query i may not see key j (FullMap's rule in attention_cuda.cu, plus rows past Nq).
__device__ __forceinline__ bool blocked(const MmaArgs& a, int64_t b, int64_t i, int64_t j) {
  return i >= a.Nq || j >= a.Nk || (a.pad && a.pad[b * a.Nk + j]) || (a.causal && j > i + a.shift);
}

// Keys [0, key_end) can be seen by the query rows [r0, r0 + 64).
__device__ __forceinline__ int64_t key_end(const MmaArgs& a, int64_t r0) {
  if (!a.causal) return a.Nk;
  const int64_t e = r0 + kRows + a.shift;
  return e < 0 ? 0 : (e < a.Nk ? e : a.Nk);
}

template <bool kBF16, int D>
__global__ void __launch_bounds__(kThreads) mma_forward_kernel(MmaArgs a) {
  __shared__ __align__(16) uint16_t Ks[kKeys][D + kPad];
  __shared__ __align__(16) uint16_t Vs[kKeys][D + kPad];
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / a.H, r0 = int64_t(blockIdx.y) * kRows;
  const uint16_t* Q = a.q + bh * a.Nq * D;
  const uint16_t* K = a.k + bh * a.Nk * D;
  const uint16_t* V = a.v + bh * a.Nk * D;

  // This warp's Q fragments (rows r0 + 16 warp + g and + 8), staged through the K buffer.
  load_tile<D>(Ks, Q, r0, a.Nq);
  __syncthreads();
  uint32_t qa[D / 16][4];
  const int qr = warp * 16 + g;
  a_fragments<D>(qa, Ks, warp * 16, g, t);

  const int64_t row[2] = {r0 + qr, r0 + qr + 8};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // l: this thread's part of the row sums
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  const int64_t kend = key_end(a, r0);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile (or Q) is no longer read
    load_tile<D>(Ks, K, j0, a.Nk);
    load_tile<D>(Vs, V, j0, a.Nk);
    __syncthreads();
    // S = Q K^T: 8 tiles of 8 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    mma_a_yt<kBF16, D>(s, qa, Ks, g, t);
    // Scale and mask (the FullMap rules of attention_cuda.cu), then the rows' maxima over
    // the four lanes that share a row.
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int64_t i = row[h], j = j0 + n * 8 + 2 * t + (e & 1);
        const float x = blocked(a, b, i, j) ? kNegInf : s[n][e] * a.scale;
        s[n][e] = x;
        mx[h] = fmaxf(mx[h], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      alpha[h] = m_new == kNegInf ? 1.f : (m[h] == kNegInf ? 0.f : __expf(m[h] - m_new));
      m[h] = m_new;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float p = (s[n][e] == kNegInf || m[h] == kNegInf) ? 0.f : __expf(s[n][e] - m[h]);
        s[n][e] = p;
        rs[h] += p;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + rs[h];
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
    // O += P V: P's A fragments are S's accumulators of key tiles 2ks and 2ks + 1.
    mma_p_y<kBF16, D>(o, s, Vs, g, t);
  }
  // The row sums over the four lanes, then out = O / l and lse = m + log l (0 and -inf
  // for a row with every key blocked, as the float32 kernels).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = row[h];
    if (i >= a.Nq) continue;
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    float* out = a.out + (bh * a.Nq + i) * D;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int c = d * 8 + 2 * t;
      *reinterpret_cast<float2*>(out + c) = make_float2(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
    }
    if (t == 0) a.lse[bh * a.Nq + i] = l[h] > 0.f ? m[h] + logf(l[h]) : kNegInf;
  }
}

// ---------------------------------------------------------------- backward (D = 64)
// FlashAttention-2's backward (Alg. 2) on tensor cores, in two kernels after D_i = dO_i . O_i:
//   dq  : grid (B*H, query tiles); per key tile P = exp(scale S - lse), dP = dO V^T,
//         dS = P (dP - D), dQ += scale dS K.
//   dkdv: grid (B*H, key tiles); per query tile the transposed products on the warp's 16
//         keys: P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T = V dO^T,
//         dS^T = P^T (dP^T - D), dK += scale dS^T Q. Each key row is owned by one warp:
//         no atomics, deterministic.
// P, dS and dO are rounded to the 16-bit type as mma operands (FlashAttention does the
// same); accumulation, lse and D are float32, and so are the gradients written.

__global__ void row_dot_kernel(const float* x, const float* y, float* out, int64_t rows, int d) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc += x[r * d + c] * y[r * d + c];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[r] = acc;
}

template <bool kBF16>
__global__ void __launch_bounds__(kThreads) mma_dq_kernel(MmaArgs a) {
  constexpr int D = 64;
  __shared__ __align__(16) uint16_t Ks[kKeys][D + kPad];
  __shared__ __align__(16) uint16_t Vs[kKeys][D + kPad];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / a.H, r0 = int64_t(blockIdx.y) * kRows;
  const uint16_t* K = a.k + bh * a.Nk * D;
  const uint16_t* V = a.v + bh * a.Nk * D;
  // This warp's Q and dO fragments (staged through the K and V buffers), lse and D of its rows.
  load_tile<D>(Ks, a.q + bh * a.Nq * D, r0, a.Nq);
  load_tile_f32<kBF16, D>(Vs, a.dout + bh * a.Nq * D, r0, a.Nq);
  __syncthreads();
  uint32_t qa[D / 16][4], da[D / 16][4];
  a_fragments<D>(qa, Ks, warp * 16, g, t);
  a_fragments<D>(da, Vs, warp * 16, g, t);
  const int64_t row[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};
  float L[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    L[h] = row[h] < a.Nq ? a.lse[bh * a.Nq + row[h]] : 0.f;
    Dr[h] = row[h] < a.Nq ? a.dvec[bh * a.Nq + row[h]] : 0.f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;
  const int64_t kend = key_end(a, r0);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();
    load_tile<D>(Ks, K, j0, a.Nk);
    load_tile<D>(Vs, V, j0, a.Nk);
    __syncthreads();
    float s[kKeys / 8][4], dp[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    mma_a_yt<kBF16, D>(s, qa, Ks, g, t);   // S = Q K^T
    mma_a_yt<kBF16, D>(dp, da, Vs, g, t);  // dP = dO V^T
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
        const float p = blocked(a, b, row[h], j) ? 0.f : __expf(s[n][e] * a.scale - L[h]);
        s[n][e] = p * (dp[n][e] - Dr[h]);  // dS
      }
    mma_p_y<kBF16, D>(dq, s, Ks, g, t);  // dQ += dS K
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] >= a.Nq) continue;
    float* out = a.dq + (bh * a.Nq + row[h]) * D;
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<float2*>(out + d * 8 + 2 * t) = make_float2(dq[d][2 * h] * a.scale, dq[d][2 * h + 1] * a.scale);
  }
}

template <bool kBF16>
__global__ void __launch_bounds__(kThreads) mma_dkdv_kernel(MmaArgs a) {
  constexpr int D = 64;
  __shared__ __align__(16) uint16_t Qs[kRows][D + kPad];
  __shared__ __align__(16) uint16_t dOs[kRows][D + kPad];
  __shared__ float Ls[kRows], Ds[kRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t bh = blockIdx.x, b = bh / a.H, k0 = int64_t(blockIdx.y) * kKeys;
  const uint16_t* Q = a.q + bh * a.Nq * D;
  const float* dO = a.dout + bh * a.Nq * D;
  // This warp's K and V fragments (16 keys), staged through the Q and dO buffers.
  load_tile<D>(Qs, a.k + bh * a.Nk * D, k0, a.Nk);
  load_tile<D>(dOs, a.v + bh * a.Nk * D, k0, a.Nk);
  __syncthreads();
  uint32_t ka[D / 16][4], va[D / 16][4];
  a_fragments<D>(ka, Qs, warp * 16, g, t);
  a_fragments<D>(va, dOs, warp * 16, g, t);
  const int64_t key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;
  // Causal: query i sees key j when i >= j - shift; the first query tile that can.
  int64_t q_begin = 0;
  if (a.causal) {
    const int64_t r = k0 - a.shift;
    q_begin = r <= 0 ? 0 : (r / kRows) * kRows;
  }
  for (int64_t q0 = q_begin; q0 < a.Nq; q0 += kRows) {
    __syncthreads();
    load_tile<D>(Qs, Q, q0, a.Nq);
    load_tile_f32<kBF16, D>(dOs, dO, q0, a.Nq);
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      Ls[r] = q0 + r < a.Nq ? a.lse[bh * a.Nq + q0 + r] : 0.f;
      Ds[r] = q0 + r < a.Nq ? a.dvec[bh * a.Nq + q0 + r] : 0.f;
    }
    __syncthreads();
    float pt[kRows / 8][4], dpt[kRows / 8][4];
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) pt[n][e] = dpt[n][e] = 0.f;
    mma_a_yt<kBF16, D>(pt, ka, Qs, g, t);    // S^T = K Q^T (rows: this warp's keys; columns: queries)
    mma_a_yt<kBF16, D>(dpt, va, dOs, g, t);  // dP^T = V dO^T
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, c = n * 8 + 2 * t + (e & 1);
        const float p = blocked(a, b, q0 + c, key[h]) ? 0.f : __expf(pt[n][e] * a.scale - Ls[c]);
        pt[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - Ds[c]);  // dS^T
      }
    mma_p_y<kBF16, D>(dv, pt, dOs, g, t);  // dV += P^T dO
    mma_p_y<kBF16, D>(dk, dpt, Qs, g, t);  // dK += dS^T Q
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= a.Nk) continue;
    float* ok = a.dk + (bh * a.Nk + key[h]) * D;
    float* ov = a.dv + (bh * a.Nk + key[h]) * D;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<float2*>(ok + d * 8 + 2 * t) = make_float2(dk[d][2 * h] * a.scale, dk[d][2 * h + 1] * a.scale);
      *reinterpret_cast<float2*>(ov + d * 8 + 2 * t) = make_float2(dv[d][2 * h], dv[d][2 * h + 1]);
    }
  }
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// Whether the tensor-core kernels can run on device `dev`: compute capability 8.0 or
// newer, and kernels compiled for it (a build for an older architecture list runs its
// PTX through the JIT on a newer device, where the mma branch was compiled out and
// would trap). Cached per device.
bool tensor_cores_usable(int dev) {
  static std::atomic<int> state[64];  // 0 unknown, 1 usable, 2 not
  if (dev < 0 || dev >= 64) return false;
  int s = state[dev].load();
  if (s == 0) {
    int major = 0, current = 0;
    cudaFuncAttributes attr{};
    const bool ok = cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaFuncGetAttributes(&attr, mma_forward_kernel<true, 64>) == cudaSuccess;
    cudaSetDevice(current);
    s = ok && major >= 8 && attr.ptxVersion >= 80 ? 1 : 2;
    if (!ok) cudaGetLastError();  // a failed query is "not usable", not a sticky error for the next op
    state[dev].store(s);
  }
  return s == 1;
}

template <bool kBF16, int D>
void launch(const MmaArgs& a, int64_t BH, const char* op) {
  const dim3 grid(unsigned(BH), unsigned((a.Nq + kRows - 1) / kRows));
  if (grid.x == 0 || grid.y == 0) return;
  mma_forward_kernel<kBF16, D><<<grid, kThreads>>>(a);
  ::cf::cuda::check_launch(op);
}

}  // namespace

bool flash_attention_16bit_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.device().is_cuda() || q.dtype() != k.dtype() || k.dtype() != v.dtype()) return false;
  if (q.dtype() != kBFloat16 && q.dtype() != kFloat16) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  const int64_t D = q.shape()[3];
  if ((D != 64 && D != 128) || k.shape()[3] != D || v.shape()[3] != D) return false;
  if (q.shape()[0] * q.shape()[1] > int64_t(std::numeric_limits<int>::max())) return false;
  if ((q.shape()[2] + kRows - 1) / kRows > 65535) return false;
  return tensor_cores_usable(int(q.device().index));
}

void flash_attention_forward_16bit_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                        const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  const char* op = "flash_attention";
  CF_CHECK(flash_attention_16bit_supported(q, k, v) && q.is_contiguous() && k.is_contiguous() &&
               v.is_contiguous() && aligned16(q) && aligned16(k) && aligned16(v) && out.dtype() == kFloat32 &&
               lse.dtype() == kFloat32 && out.is_contiguous() && lse.is_contiguous(),
           Error, "[", op, "] internal: the tensor-core kernel got inputs it does not take: q ", q.describe(), ", k ",
           k.describe(), ", v ", v.describe());
  cu::use_device_of(out, op);
  MmaArgs a{};
  a.q = static_cast<const uint16_t*>(q.raw_data());
  a.k = static_cast<const uint16_t*>(k.raw_data());
  a.v = static_cast<const uint16_t*>(v.raw_data());
  a.out = static_cast<float*>(out.raw_data());
  a.lse = static_cast<float*>(lse.raw_data());
  a.pad = kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr;
  a.H = q.shape()[1];
  a.Nq = q.shape()[2];
  a.Nk = k.shape()[2];
  a.shift = a.Nk - a.Nq;
  a.scale = float(p.scale);
  a.causal = p.causal;
  const int64_t BH = q.shape()[0] * q.shape()[1], D = q.shape()[3];
  const bool bf16 = q.dtype() == kBFloat16;
  if (D == 64) bf16 ? launch<true, 64>(a, BH, op) : launch<false, 64>(a, BH, op);
  else bf16 ? launch<true, 128>(a, BH, op) : launch<false, 128>(a, BH, op);
}

bool flash_attention_backward_16bit_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return flash_attention_16bit_supported(q, k, v) && q.shape()[3] == 64 &&
         (k.shape()[2] + kKeys - 1) / kKeys <= 65535;
}

void flash_attention_backward_16bit_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                         const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                         const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "flash_attention";
  auto f32_dense = [](const Tensor& t) {
    return t.dtype() == kFloat32 && t.is_contiguous() && reinterpret_cast<uintptr_t>(t.raw_data()) % 8 == 0;
  };
  CF_CHECK(flash_attention_backward_16bit_supported(q, k, v) && q.is_contiguous() && k.is_contiguous() &&
               v.is_contiguous() && aligned16(q) && aligned16(k) && aligned16(v) && f32_dense(out) &&
               f32_dense(lse) && f32_dense(dout) && f32_dense(dq) && f32_dense(dk) && f32_dense(dv),
           Error, "[", op, "] internal: the tensor-core backward got inputs it does not take: q ", q.describe(),
           ", dout ", dout.describe());
  cu::use_device_of(out, op);
  const int64_t BH = q.shape()[0] * q.shape()[1], Nq = q.shape()[2], Nk = k.shape()[2];
  // D_i = dO_i . O_i (FlashAttention-2 Alg. 2 line 4), one warp per row.
  Tensor dvec = Tensor::empty({BH * Nq}, kFloat32, out.device());
  MmaArgs a{};
  a.q = static_cast<const uint16_t*>(q.raw_data());
  a.k = static_cast<const uint16_t*>(k.raw_data());
  a.v = static_cast<const uint16_t*>(v.raw_data());
  a.out = static_cast<float*>(out.raw_data());
  a.lse = static_cast<float*>(lse.raw_data());
  a.pad = kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr;
  a.dout = static_cast<const float*>(dout.raw_data());
  a.dvec = static_cast<float*>(dvec.raw_data());
  a.dq = static_cast<float*>(dq.raw_data());
  a.dk = static_cast<float*>(dk.raw_data());
  a.dv = static_cast<float*>(dv.raw_data());
  a.H = q.shape()[1];
  a.Nq = Nq;
  a.Nk = Nk;
  a.shift = Nk - Nq;
  a.scale = float(p.scale);
  a.causal = p.causal;
  if (BH * Nq > 0) {
    const int64_t threads = BH * Nq * 32;
    row_dot_kernel<<<unsigned((threads + 255) / 256), 256>>>(a.dout, a.out, a.dvec, BH * Nq, 64);
    ::cf::cuda::check_launch(op);
    const dim3 grid(unsigned(BH), unsigned((Nq + kRows - 1) / kRows));
    if (q.dtype() == kBFloat16)
      mma_dq_kernel<true><<<grid, kThreads>>>(a);
    else
      mma_dq_kernel<false><<<grid, kThreads>>>(a);
    ::cf::cuda::check_launch(op);
  } else if (dq.numel() > 0) {
    CF_CUDA_CHECK(cudaMemsetAsync(dq.raw_data(), 0, size_t(dq.numel()) * sizeof(float), 0), op);
  }
  if (BH * Nk > 0) {
    const dim3 grid(unsigned(BH), unsigned((Nk + kKeys - 1) / kKeys));
    if (q.dtype() == kBFloat16)
      mma_dkdv_kernel<true><<<grid, kThreads>>>(a);
    else
      mma_dkdv_kernel<false><<<grid, kThreads>>>(a);
    ::cf::cuda::check_launch(op);
  }
}

}  // namespace cf::kernels
