// Attention on tensor cores: the FlashAttention-2 forward and backward of attention_cuda.cu
// (online softmax over key tiles, Alg. 1; recomputed probabilities, Alg. 2) with every
// product an mma.sync instruction with float32 accumulation (sm_80 and newer). One set of
// kernels serves flash_attention (FullMap) and block_attention (BlockMap: rows gathered
// through the member table, attention_maps.cuh), as the scalar kernels do, for two kinds of
// operands (the Ops policies below):
//   16-bit q, k, v under autocast (issue 26): mma.m16n8k16 in bfloat16 or float16;
//   float32 q, k, v (issue 24): mma.m16n8k8 in TF32, each operand split in two TF32 parts
//     and three products summed ("3xTF32"), which keeps about float32's accuracy; one
//     product only (plain TF32) when the user opted in with cf::cuda::set_allow_tf32.
//
// Block: 4 warps, 64 query rows (16 per warp, one m16 tile); key tiles of 64 rows.
// Each warp keeps its Q fragments, its S tile (16 x 64) and its O rows (16 x D) in
// registers: S's accumulators become P's A fragments after the softmax (16-bit: the
// accumulator and A layouts agree, rounded once to the 16-bit type, as FlashAttention
// does; TF32: through a permutation of each 8 keys, below). K and V tiles go through
// shared memory (rows padded by 16 bytes against bank conflicts), gathered by position:
// the positions of a tile's rows sit in shared memory (-1: no row, loaded as zeros and
// blocked). The row statistics (m, l) and the output are float32; out and lse are written
// as float32 (strided rows: block_attention packs them side by side), and the gradients too.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" and "for mma.m16n8k8",
// g = lane / 4, t = lane % 4); C (16 x 8) holds (g, 2t..2t+1) and (g + 8, 2t..2t+1) for both.
//   m16n8k16: A (16 x 16, row-major) registers hold (g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..),
//     (g + 8, 2t + 8..); B (16 x 8, column-major) holds rows 2t..2t+1 and 2t + 8.. of column g.
//   m16n8k8 (tf32): A (16 x 8) holds (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); B (8 x 8)
//     holds rows t and t + 4 of column g.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_maps.cuh"
#include "kernels/attention/softmax_grad.h"
#include "kernels/common/cuda_utils.cuh"
#include "kernels/elementwise/elementwise.h"

namespace cf::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile (== kRows: Q goes through the K buffer)

using namespace attention_maps;

// Operand policies: how q, k, v, dO, P and dS reach the tensor cores.
//   Half<bf16>: 16-bit storage, mma.m16n8k16 (k-steps of 16); P, dS and dO rounded to the 16-bit type.
//   Tf32<3>: float32 storage, mma.m16n8k8.tf32 (k-steps of 8). Each operand x is split into
//     hi = tf32(x) and lo = tf32(x - hi) and a product is lo*hi + hi*lo + hi*hi (lo*lo dropped):
//     about 22 of float32's 24 mantissa bits per operand, the float32 accuracy PyTorch's
//     memory-efficient attention gets the same way. Tf32<1>: hi*hi only (plain TF32, 10 bits),
//     taken only when the user allowed TF32.
// kPad: elements of padding per shared row (16 bytes: rows stay 16-byte aligned, banks shift).
template <bool kIsBF16>
struct Half {
  using Elem = uint16_t;
  using Frag = uint32_t;  // two 16-bit values
  static constexpr bool kTf32 = false, kBF16 = kIsBF16;
  static constexpr int kK = 16, kPad = 8;
};
template <int kP>
struct Tf32 {
  static_assert(kP == 1 || kP == 3, "one or three TF32 products");
  using Elem = float;
  using Frag = float;  // split into TF32 parts at each product
  static constexpr bool kTf32 = true;
  static constexpr int kK = 8, kPad = 4, kPasses = kP;
};

struct MmaArgs {
  const void* q;  // (B*H, Nq, D) contiguous, of the policy's Elem
  const void* k;  // (B*H, Nk, D) contiguous
  const void* v;  // (B*H, Nk, D) contiguous
  float* out;     // (B, H, Nq, D), rows of strides so (unit-stride columns)
  float* lse;     // (B, H, Nq), strides sl
  Rows3 so, sl;
  // Backward only: dO (rows of strides sgo, unit-stride columns), D_i = dO_i . O_i - dlse_i
  // (B*H, Nq), and the float32 gradients (contiguous like q, k, v).
  const float* dout;
  Rows3 sgo;
  float* dvec;
  float *dq, *dk, *dv;
  int64_t H, Nq, Nk;
  // Rows per head of out, lse, dout, D and dq (Mq) and of dk, dv (Mk): Nq and Nk, or the slots of routed
  // attention, whose outputs stay in slot order (the map's orow, krow).
  int64_t Mq, Mk;
  int64_t bh0;  // batch*head of blockIdx.z == 0 (launches in slices of 65535, grid.z's limit)
  float scale, self_score;
  // Rounds (block attention, LSH's hashing rounds): H counts the output heads, H_qkv * R; output (and table)
  // head bh reads q, k, v head bh / R. The forward's grid runs over the output heads; the backward's over the
  // q, k, v heads, one round per launch (this_round), each round's dq, dk, dv added to the rounds before it
  // (within a round a position sits in one slot, so each row still has one writer: no atomics,
  // deterministic), as the scalar kernels (attention_cuda.cu) do. R = 1 for everything else.
  int64_t R, this_round;
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

// A float32 value as its TF32 parts: hi = x rounded to TF32 (nearest, ties away: cvt.rna), lo = the rest
// rounded again (0 with one product).
struct Tf32Parts {
  uint32_t hi, lo;
};
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // volatile: kept where it is written. Otherwise the compiler hoists the splits of the loop-invariant
  // Q (K, V) fragments out of the key loop, doubling their registers, and the backward spills.
  asm volatile("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  __trap();
#endif
  return r;
}
template <int kPasses>
__device__ __forceinline__ Tf32Parts tf32_parts(float x) {
  const uint32_t hi = to_tf32(x);
  // An infinite hi (x = +-inf, or rounded up to it) has no low part: inf - inf would make lo NaN and every
  // product with it NaN, where plain float32 gives +-inf (a -inf score is a weight of 0).
  return {hi, kPasses == 3 && isfinite(__uint_as_float(hi)) ? to_tf32(x - __uint_as_float(hi)) : 0u};
}

// c += a b for one m16n8k8 tile of TF32 values.
__device__ __forceinline__ void mma1688(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// c += a b in float32 from TF32 parts: the small products first, then hi*hi (CUTLASS's order for 3xTF32).
template <int kPasses>
__device__ __forceinline__ void mma_tf32(float (&c)[4], const Tf32Parts (&a)[4], Tf32Parts b0, Tf32Parts b1) {
  const uint32_t hi[4] = {a[0].hi, a[1].hi, a[2].hi, a[3].hi};
  if constexpr (kPasses == 3) {
    const uint32_t lo[4] = {a[0].lo, a[1].lo, a[2].lo, a[3].lo};
    mma1688(c, lo, b0.hi, b1.hi);
    mma1688(c, hi, b0.lo, b1.lo);
  }
  mma1688(c, hi, b0.hi, b1.hi);
}

// Rows pos[0..63] of X (rows of D values) into S in 16-byte vectors; pos -1 gives zeros.
template <typename Ops, int D>
__device__ __forceinline__ void load_rows(typename Ops::Elem (*S)[D + Ops::kPad], const typename Ops::Elem* X,
                                          const int64_t* pos) {
  constexpr int kVec = 16 / int(sizeof(typename Ops::Elem)), kPerRow = D / kVec;
  for (int e = threadIdx.x; e < kKeys * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    const int64_t p = pos[r];
    uint4 val = make_uint4(0, 0, 0, 0);
    if (p >= 0) val = *reinterpret_cast<const uint4*>(X + p * D + c);
    *reinterpret_cast<uint4*>(&S[r][c]) = val;
  }
}

__device__ __forceinline__ uint32_t load2(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows pos[0..63] of X (float32 rows `stride` apart, D unit-stride values) into S (rounded to a 16-bit
// type), zeros for pos -1 (dO for the backward's products).
template <typename Ops, int D>
__device__ __forceinline__ void load_rows_f32(typename Ops::Elem (*S)[D + Ops::kPad], const float* X,
                                              int64_t stride, const int64_t* pos) {
  constexpr int kPerRow = D / 2;
  for (int e = threadIdx.x; e < kKeys * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * 2;
    const int64_t p = pos[r];
    float x0 = 0.f, x1 = 0.f;
    if (p >= 0) {
      x0 = X[p * stride + c];
      x1 = X[p * stride + c + 1];
    }
    if constexpr (Ops::kTf32) {
      *reinterpret_cast<float2*>(&S[r][c]) = make_float2(x0, x1);  // c even, rows of 272 bytes: aligned
    } else {
      *reinterpret_cast<uint32_t*>(&S[r][c]) = pack2<Ops::kBF16>(x0, x1);
    }
  }
}

// The A fragments of rows [r, r + 16) of a shared tile (16 x D, one m16 tile per kK columns).
template <typename Ops, int D>
__device__ __forceinline__ void a_fragments(typename Ops::Frag (&f)[D / Ops::kK][4],
                                            typename Ops::Elem (*S)[D + Ops::kPad], int r, int g, int t) {
#pragma unroll
  for (int s = 0; s < D / Ops::kK; ++s) {
    if constexpr (Ops::kTf32) {
      f[s][0] = S[r + g][s * 8 + t];
      f[s][1] = S[r + g + 8][s * 8 + t];
      f[s][2] = S[r + g][s * 8 + t + 4];
      f[s][3] = S[r + g + 8][s * 8 + t + 4];
    } else {
      f[s][0] = load2(&S[r + g][s * 16 + 2 * t]);
      f[s][1] = load2(&S[r + g + 8][s * 16 + 2 * t]);
      f[s][2] = load2(&S[r + g][s * 16 + 8 + 2 * t]);
      f[s][3] = load2(&S[r + g + 8][s * 16 + 8 + 2 * t]);
    }
  }
}

// c (16 x 64, 8 tiles of 8 columns) += A (16 x D, fragments) Y^T for the 64 rows of Y (64 x D) in shared
// memory: S = Q K^T and its kin. B (k = column of Y, n = row of Y): two adjacent values of a row (16-bit),
// columns t and t + 4 of a row (TF32; row stride D + 4 words puts the 32 lanes on 32 banks).
template <typename Ops, int D>
__device__ __forceinline__ void mma_a_yt(float (&c)[kKeys / 8][4], const typename Ops::Frag (&a)[D / Ops::kK][4],
                                         typename Ops::Elem (*Y)[D + Ops::kPad], int g, int t) {
  if constexpr (Ops::kTf32) {
    constexpr int P = Ops::kPasses;
#pragma unroll
    for (int ks = 0; ks < D / 8; ++ks) {
      const Tf32Parts ap[4] = {tf32_parts<P>(a[ks][0]), tf32_parts<P>(a[ks][1]), tf32_parts<P>(a[ks][2]),
                               tf32_parts<P>(a[ks][3])};
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
        mma_tf32<P>(c[n], ap, tf32_parts<P>(Y[n * 8 + g][ks * 8 + t]), tf32_parts<P>(Y[n * 8 + g][ks * 8 + t + 4]));
    }
  } else {
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        mma16816<Ops::kBF16>(c[n], a[ks], load2(&Y[n * 8 + g][ks * 16 + 2 * t]),
                             load2(&Y[n * 8 + g][ks * 16 + 8 + 2 * t]));
  }
}

// o (16 x D, D / 8 tiles) += P Y for P (16 x 64) held as the accumulators of mma_a_yt and Y (64 x D) in
// shared memory.
//   16-bit: the accumulators are P's A fragments once rounded (tiles 2ks and 2ks + 1 give k-step ks); B
//     (k = row of Y, n = column) pairs the values of two adjacent rows.
//   TF32: one k-step per key tile of 8, its keys permuted: k-index t stands for key 2t and t + 4 for 2t + 1,
//     so the lane's accumulators (g | g + 8, 2t | 2t + 1) are exactly its A fragment (g, t), (g + 8, t),
//     (g, t + 4), (g + 8, t + 4); B takes rows 2t and 2t + 1 of Y to match (the sum over keys is the same).
template <typename Ops, int D>
__device__ __forceinline__ void mma_p_y(float (&o)[D / 8][4], const float (&p)[kKeys / 8][4],
                                        typename Ops::Elem (*Y)[D + Ops::kPad], int g, int t) {
  if constexpr (Ops::kTf32) {
    constexpr int P = Ops::kPasses;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      const Tf32Parts pa[4] = {tf32_parts<P>(p[n][0]), tf32_parts<P>(p[n][2]), tf32_parts<P>(p[n][1]),
                               tf32_parts<P>(p[n][3])};
      const int k0 = n * 8 + 2 * t;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        const int c = d * 8 + g;
        mma_tf32<P>(o[d], pa, tf32_parts<P>(Y[k0][c]), tf32_parts<P>(Y[k0 + 1][c]));
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      constexpr bool kB = Ops::kBF16;
      const uint32_t pa[4] = {pack2<kB>(p[2 * ks][0], p[2 * ks][1]), pack2<kB>(p[2 * ks][2], p[2 * ks][3]),
                              pack2<kB>(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                              pack2<kB>(p[2 * ks + 1][2], p[2 * ks + 1][3])};
      const int k0 = ks * 16 + 2 * t;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        const int c = d * 8 + g;
        const uint32_t b0 = uint32_t(Y[k0][c]) | (uint32_t(Y[k0 + 1][c]) << 16);
        const uint32_t b1 = uint32_t(Y[k0 + 8][c]) | (uint32_t(Y[k0 + 9][c]) << 16);
        mma16816<kB>(o[d], pa, b0, b1);
      }
    }
  }
}

static_assert(kRows == kKeys, "query tiles are staged through the key buffers");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whether a map's output rows are its slots (routed lists) rather than the positions (map.orow).
template <typename Map>
constexpr bool kSlotRows = std::is_same_v<Map, RoutedMap>;

// pos[r] = the position of query row r0 + r of group grp, -1 past the group's rows; with orows (slot-row maps),
// orows[r] = its output row (out, lse, dout, D, dq: map.orow), -1 where pos is. The forward passes no orows
// (it computes map.orow where it writes), so the store is guarded: without the guard the routed forward wrote
// through a null pointer (found in review before it ever ran).
template <typename Map>
__device__ __forceinline__ void query_positions(int64_t* pos, const Map& map, int64_t bh, int64_t grp, int64_t r0,
                                                int64_t* orows = nullptr) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t p = r0 + r < map.rows() ? map.qpos(bh, grp, r0 + r) : -1;
    pos[r] = p;
    if constexpr (kSlotRows<Map>)
      if (orows) orows[r] = p >= 0 ? map.orow(grp, r0 + r, p) : -1;
  }
}

// pos[j] = the position of key j0 + j of group grp's window, -1 from kend on.
template <typename Map>
__device__ __forceinline__ void key_positions(int64_t* pos, const Map& map, int64_t bh, int64_t grp, int64_t j0,
                                              int64_t kend) {
  for (int j = threadIdx.x; j < kKeys; j += kThreads) pos[j] = j0 + j < kend ? map.kpos(bh, grp, j0 + j) : -1;
}

// The score of query i and key j from s = q_i . k_j: -inf when blocked, the constant self score on a
// self-masked pair (Reformer), else scale s (the float32 kernels' rules).
template <typename Map>
__device__ __forceinline__ float score(const MmaArgs& a, const Map& map, int64_t b, int64_t i, int64_t j, float s) {
  return map.blocked(b, i, j) ? kNegInf : map.self(i, j) ? a.self_score : s * a.scale;
}

// The backward's P = exp(score - lse) (0 where blocked, or for a row that saw no key) and
// dS = P (dP - D) (0 on a self-masked pair: a constant score has no gradient).
template <typename Map>
__device__ __forceinline__ float2 prob_and_ds(const MmaArgs& a, const Map& map, int64_t b, int64_t i, int64_t j,
                                              float s, float dp, float L, float Dr) {
  if (map.blocked(b, i, j) || L == kNegInf) return make_float2(0.f, 0.f);
  const bool own = map.self(i, j);
  const float p = __expf((own ? a.self_score : s * a.scale) - L);
  return make_float2(p, own ? 0.f : softmax_grad(p, dp, Dr));
}

// grid (query tile, group, batch*head).
template <typename Ops, int D, typename Map>
__global__ void __launch_bounds__(kThreads) mma_forward_kernel(MmaArgs a, Map map) {
  using Elem = typename Ops::Elem;
  __shared__ __align__(16) Elem Ks[kKeys][D + Ops::kPad];
  __shared__ __align__(16) Elem Vs[kKeys][D + Ops::kPad];
  __shared__ int64_t qp[kRows], kp[kKeys];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // bh: the output (and table) head; dbh: the q, k, v head it reads (rounds share one).
  const int64_t r0 = int64_t(blockIdx.x) * kRows, grp = blockIdx.y, bh = a.bh0 + blockIdx.z, dbh = bh / a.R;
  const int64_t b = bh / a.H, hd = bh % a.H;
  if (r0 >= map.rows()) return;
  const Elem* K = static_cast<const Elem*>(a.k) + dbh * a.Nk * D;
  const Elem* V = static_cast<const Elem*>(a.v) + dbh * a.Nk * D;

  // This warp's Q fragments (rows 16 warp + g and + 8 of the tile), staged through the K buffer.
  query_positions(qp, map, bh, grp, r0);
  __syncthreads();
  load_rows<Ops, D>(Ks, static_cast<const Elem*>(a.q) + dbh * a.Nq * D, qp);
  __syncthreads();
  typename Ops::Frag qa[D / Ops::kK][4];
  a_fragments<Ops, D>(qa, Ks, warp * 16, g, t);

  const int64_t row[2] = {qp[warp * 16 + g], qp[warp * 16 + g + 8]};  // positions, -1: none
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // l: this thread's part of the row sums
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  const int64_t kend = map.key_end(r0, kRows);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile (or Q) and its positions are no longer read
    key_positions(kp, map, bh, grp, j0, kend);
    __syncthreads();
    load_rows<Ops, D>(Ks, K, kp);
    load_rows<Ops, D>(Vs, V, kp);
    __syncthreads();
    // S = Q K^T: 8 tiles of 8 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    mma_a_yt<Ops, D>(s, qa, Ks, g, t);
    // Scores with their masks, then the rows' maxima over the four lanes that share a row.
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const float x = score(a, map, b, row[h], kp[n * 8 + 2 * t + (e & 1)], s[n][e]);
        s[n][e] = x;
        mx[h] = nan_max(mx[h], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = nan_max(m[h], mx[h]);
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
    // O += P V: P's A fragments are S's accumulators (mma_p_y).
    mma_p_y<Ops, D>(o, s, Vs, g, t);
  }
  // The row sums over the four lanes, then out = O / l and lse = m + log l (0 and -inf
  // for a row with every key blocked, as the float32 kernels), written at the row's output row.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] < 0) continue;
    const int64_t i = map.orow(grp, r0 + warp * 16 + g + 8 * h, row[h]);
    const float inv = l[h] != 0.f ? 1.f / l[h] : 0.f;  // NaN (a NaN score): out NaN
    float* out = a.out + a.so.at(b, hd, i);
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      const int c = d * 8 + 2 * t;
      out[c] = o[d][2 * h] * inv;
      out[c + 1] = o[d][2 * h + 1] * inv;
    }
    if (t == 0) a.lse[a.sl.at(b, hd, i)] = l[h] != 0.f ? m[h] + logf(l[h]) : kNegInf;
  }
}

// ---------------------------------------------------------------- backward (D = 64)
// FlashAttention-2's backward (Alg. 2) on tensor cores, in two kernels after D_i = dO_i . O_i - dlse_i:
//   dq  : grid (query tile, group, batch*head); per key tile P = exp(S' - lse) (S' the score as the
//         forward made it), dP = dO V^T, dS = P (dP - D), dQ += scale dS K.
//   dkdv: grid (key tile, key group, batch*head); for every query group whose window holds the key
//         group, per query tile the transposed products on the warp's 16 keys: P^T, dV += P^T dO,
//         dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += scale dS^T Q. Each key row is owned by one warp:
//         no atomics, deterministic.
// With 16-bit operands P, dS and dO are rounded to the 16-bit type (FlashAttention does the
// same); with TF32 they are split into parts as every operand. Accumulation, lse and D are
// float32, and so are the gradients written.

// D_i = dO_i . O_i - dlse_i (Alg. 2 line 4, plus lse's own gradient: d lse_i / d S_ij = P_ij), one warp
// per (b*h, query row).
__global__ void row_dot_kernel(MmaArgs a, const float* dlse, Rows3 sgl, int64_t rows, int d) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t bh = r / a.Mq, i = r % a.Mq, b = bh / a.H, hd = bh % a.H;
  const float* x = a.dout + a.sgo.at(b, hd, i);
  const float* y = a.out + a.so.at(b, hd, i);
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc += x[c] * y[c];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) a.dvec[r] = acc - (dlse ? dlse[sgl.at(b, hd, i)] : 0.f);
}

template <typename Ops, typename Map>
__global__ void __launch_bounds__(kThreads) mma_dq_kernel(MmaArgs a, Map map) {
  constexpr int D = 64;
  using Elem = typename Ops::Elem;
  __shared__ __align__(16) Elem Ks[kKeys][D + Ops::kPad];
  __shared__ __align__(16) Elem Vs[kKeys][D + Ops::kPad];
  __shared__ int64_t qp[kRows], kp[kKeys], orw[kSlotRows<Map> ? kRows : 1];
  const int64_t* ow = kSlotRows<Map> ? orw : qp;  // output rows: the positions, or the slots
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // dbh: the q, k, v head of this launch's grid; bh: its output (and table) head in round this_round.
  const int64_t r0 = int64_t(blockIdx.x) * kRows, grp = blockIdx.y, dbh = a.bh0 + blockIdx.z,
                bh = dbh * a.R + a.this_round;
  const int64_t b = bh / a.H, hd = bh % a.H;
  if (r0 >= map.rows()) return;
  const Elem* K = static_cast<const Elem*>(a.k) + dbh * a.Nk * D;
  const Elem* V = static_cast<const Elem*>(a.v) + dbh * a.Nk * D;
  // This warp's Q and dO fragments (staged through the K and V buffers), lse and D of its rows.
  query_positions(qp, map, bh, grp, r0, orw);
  __syncthreads();
  load_rows<Ops, D>(Ks, static_cast<const Elem*>(a.q) + dbh * a.Nq * D, qp);
  load_rows_f32<Ops, D>(Vs, a.dout + a.sgo.at(b, hd, 0), a.sgo.s2, ow);
  __syncthreads();
  typename Ops::Frag qa[D / Ops::kK][4], da[D / Ops::kK][4];
  a_fragments<Ops, D>(qa, Ks, warp * 16, g, t);
  a_fragments<Ops, D>(da, Vs, warp * 16, g, t);
  const int64_t row[2] = {qp[warp * 16 + g], qp[warp * 16 + g + 8]};
  const int64_t orow[2] = {ow[warp * 16 + g], ow[warp * 16 + g + 8]};
  float L[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    L[h] = row[h] >= 0 ? a.lse[a.sl.at(b, hd, orow[h])] : kNegInf;
    Dr[h] = row[h] >= 0 ? a.dvec[bh * a.Mq + orow[h]] : 0.f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;
  const int64_t kend = map.key_end(r0, kRows);
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();
    key_positions(kp, map, bh, grp, j0, kend);
    __syncthreads();
    load_rows<Ops, D>(Ks, K, kp);
    load_rows<Ops, D>(Vs, V, kp);
    __syncthreads();
    float s[kKeys / 8][4], dp[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    mma_a_yt<Ops, D>(s, qa, Ks, g, t);   // S = Q K^T
    mma_a_yt<Ops, D>(dp, da, Vs, g, t);  // dP = dO V^T
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        s[n][e] = prob_and_ds(a, map, b, row[h], kp[n * 8 + 2 * t + (e & 1)], s[n][e], dp[n][e], L[h], Dr[h]).y;
      }
    mma_p_y<Ops, D>(dq, s, Ks, g, t);  // dQ += dS K
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row[h] < 0) continue;
    float* out = a.dq + (dbh * a.Mq + orow[h]) * D;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      float2* o = reinterpret_cast<float2*>(out + d * 8 + 2 * t);
      float2 x = make_float2(dq[d][2 * h] * a.scale, dq[d][2 * h + 1] * a.scale);
      if (a.this_round > 0) x = make_float2(o->x + x.x, o->y + x.y);  // the rounds before this one
      *o = x;
    }
  }
}

template <typename Ops, typename Map>
__global__ void __launch_bounds__(kThreads) mma_dkdv_kernel(MmaArgs a, Map map) {
  constexpr int D = 64;
  using Elem = typename Ops::Elem;
  __shared__ __align__(16) Elem Qs[kRows][D + Ops::kPad];
  __shared__ __align__(16) Elem dOs[kRows][D + Ops::kPad];
  __shared__ float Ls[kRows], Ds[kRows];
  __shared__ int64_t qp[kRows], kp[kKeys], orw[kSlotRows<Map> ? kRows : 1];
  const int64_t* ow = kSlotRows<Map> ? orw : qp;  // output rows: the positions, or the slots
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // dbh: the q, k, v head of this launch's grid; bh: its output (and table) head in round this_round.
  const int64_t u0 = int64_t(blockIdx.x) * kKeys, kg = blockIdx.y, dbh = a.bh0 + blockIdx.z,
                bh = dbh * a.R + a.this_round;
  const int64_t b = bh / a.H, hd = bh % a.H;
  if (u0 >= map.group_keys()) return;
  const Elem* Q = static_cast<const Elem*>(a.q) + dbh * a.Nq * D;
  const float* dO = a.dout + a.sgo.at(b, hd, 0);
  // This warp's K and V fragments (16 keys), staged through the Q and dO buffers.
  for (int j = threadIdx.x; j < kKeys; j += kThreads)
    kp[j] = u0 + j < map.group_keys() ? map.group_kpos(bh, kg, u0 + j) : -1;
  __syncthreads();
  load_rows<Ops, D>(Qs, static_cast<const Elem*>(a.k) + dbh * a.Nk * D, kp);
  load_rows<Ops, D>(dOs, static_cast<const Elem*>(a.v) + dbh * a.Nk * D, kp);
  __syncthreads();
  typename Ops::Frag ka[D / Ops::kK][4], va[D / Ops::kK][4];
  a_fragments<Ops, D>(ka, Qs, warp * 16, g, t);
  a_fragments<Ops, D>(va, dOs, warp * 16, g, t);
  const int64_t key[2] = {kp[warp * 16 + g], kp[warp * 16 + g + 8]};
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;
  for (int64_t visit = 0; visit < map.visits(); ++visit) {
    const int64_t grp = map.visit_group(kg, visit);
    for (int64_t q0 = map.row_begin(u0, kRows); q0 < map.rows(); q0 += kRows) {
      __syncthreads();
      query_positions(qp, map, bh, grp, q0, orw);
      __syncthreads();
      load_rows<Ops, D>(Qs, Q, qp);
      load_rows_f32<Ops, D>(dOs, dO, a.sgo.s2, ow);
      for (int r = threadIdx.x; r < kRows; r += kThreads) {
        const int64_t i = ow[r];
        Ls[r] = i >= 0 ? a.lse[a.sl.at(b, hd, i)] : kNegInf;
        Ds[r] = i >= 0 ? a.dvec[bh * a.Mq + i] : 0.f;
      }
      __syncthreads();
      float pt[kRows / 8][4], dpt[kRows / 8][4];
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) pt[n][e] = dpt[n][e] = 0.f;
      mma_a_yt<Ops, D>(pt, ka, Qs, g, t);    // S^T = K Q^T (rows: this warp's keys; columns: queries)
      mma_a_yt<Ops, D>(dpt, va, dOs, g, t);  // dP^T = V dO^T
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, c = n * 8 + 2 * t + (e & 1);
          const float2 pd = prob_and_ds(a, map, b, qp[c], key[h], pt[n][e], dpt[n][e], Ls[c], Ds[c]);
          pt[n][e] = pd.x;   // P^T
          dpt[n][e] = pd.y;  // dS^T
        }
      mma_p_y<Ops, D>(dv, pt, dOs, g, t);  // dV += P^T dO
      mma_p_y<Ops, D>(dk, dpt, Qs, g, t);  // dK += dS^T Q
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] < 0) continue;
    const int64_t j = map.krow(kg, u0 + warp * 16 + g + 8 * h, key[h]);
    float2* ok = reinterpret_cast<float2*>(a.dk + (dbh * a.Mk + j) * D + 2 * t);
    float2* ov = reinterpret_cast<float2*>(a.dv + (dbh * a.Mk + j) * D + 2 * t);
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      float2 xk = make_float2(dk[d][2 * h] * a.scale, dk[d][2 * h + 1] * a.scale);
      float2 xv = make_float2(dv[d][2 * h], dv[d][2 * h + 1]);
      if (a.this_round > 0) {  // the rounds before this one
        xk = make_float2(ok[d * 4].x + xk.x, ok[d * 4].y + xk.y);
        xv = make_float2(ov[d * 4].x + xv.x, ov[d * 4].y + xv.y);
      }
      ok[d * 4] = xk;  // float2 index d * 4: column d * 8 + 2 t
      ov[d * 4] = xv;
    }
  }
}

// ---------------------------------------------------------------- host side

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
                    cudaFuncGetAttributes(&attr, mma_forward_kernel<Half<true>, 64, FullMap>) == cudaSuccess;
    cudaSetDevice(current);
    s = ok && major >= 8 && attr.ptxVersion >= 80 ? 1 : 2;
    if (!ok) cudaGetLastError();  // a failed query is "not usable", not a sticky error for the next op
    state[dev].store(s);
  }
  return s == 1;
}

// The operand policy for q's dtype; float32 takes three TF32 products unless the user allowed TF32.
enum class Operands { kBf16, kF16, kTf32x3, kTf32 };
Operands operands_of(const Tensor& q) {
  if (q.dtype() == kBFloat16) return Operands::kBf16;
  if (q.dtype() == kFloat16) return Operands::kF16;
  return ::cf::cuda::allow_tf32() ? Operands::kTf32 : Operands::kTf32x3;
}

// f(Ops{}) with the policy's type. kTf32Only: the 16-bit policies are not instantiated (routed lists, whose
// 16-bit inputs run on float32 copies: routed_attention_mma_supported).
template <bool kTf32Only, typename F>
void with_operands(Operands o, F&& f, const char* op) {
  if constexpr (!kTf32Only) {
    if (o == Operands::kBf16) return f(Half<true>{});
    if (o == Operands::kF16) return f(Half<false>{});
  }
  if (o == Operands::kTf32) return f(Tf32<1>{});
  CF_CHECK(o == Operands::kTf32x3, Error, "[", op, "] internal: no 16-bit tensor-core kernel for routed lists");
  f(Tf32<3>{});
}

// q, k, v of one dtype the kernels take (bfloat16, float16, float32), 4-d, on a CUDA device the kernels can use.
bool takes_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.device().is_cuda() || q.dtype() != k.dtype() || k.dtype() != v.dtype()) return false;
  if (q.dtype() != kBFloat16 && q.dtype() != kFloat16 && q.dtype() != kFloat32) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  return tensor_cores_usable(int(q.device().index));
}

// Launches kernel(a) over grid (x, y, batch*heads), batch*heads in slices of grid.z's 65535.
template <typename Launch>
void for_head_slices(MmaArgs a, int64_t BH, Launch launch) {
  constexpr int64_t kMaxZ = 65535;
  for (a.bh0 = 0; a.bh0 < BH; a.bh0 += kMaxZ) launch(a, unsigned(std::min(kMaxZ, BH - a.bh0)));
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                  const char* op) {
  CF_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && aligned16(q) && aligned16(k) &&
               aligned16(v) && out.dtype() == kFloat32 && lse.dtype() == kFloat32 && out.dim() == 4 &&
               out.strides()[3] == 1 && lse.dim() == 3,
           Error, "[", op, "] internal: the tensor-core kernel got inputs it does not take: q ", q.describe(), ", k ",
           k.describe(), ", v ", v.describe(), ", out ", out.describe());
}

MmaArgs make_mma_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                      double scale, double self_score) {
  MmaArgs a{};
  a.q = q.raw_data();
  a.k = k.raw_data();
  a.v = v.raw_data();
  a.out = static_cast<float*>(out.raw_data());
  a.lse = static_cast<float*>(lse.raw_data());
  a.so = rows3(out);
  a.sl = rows3(lse);
  a.H = q.shape()[1];
  a.Nq = q.shape()[2];
  a.Nk = k.shape()[2];
  a.Mq = a.Nq;
  a.Mk = a.Nk;
  a.R = 1;
  a.this_round = 0;
  a.scale = float(scale);
  a.self_score = float(self_score);
  return a;
}

template <typename Map>
void run_forward(const MmaArgs& a, const Map& map, int64_t rows, int64_t groups, int64_t BH, int64_t D,
                 Operands operands, const char* op) {
  const unsigned gx = unsigned((rows + kRows - 1) / kRows), gy = unsigned(groups);
  if (gx == 0 || gy == 0 || BH == 0) return;
  with_operands<kSlotRows<Map>>(operands, [&](auto ops) {
    using Ops = decltype(ops);
    for_head_slices(a, BH, [&](const MmaArgs& s, unsigned gz) {
      const dim3 grid(gx, gy, gz);
      // Head size 64 only for block and routed attention and for float32 (the supported() rules): 128 float32
      // values a row would need dynamic shared memory.
      if constexpr (Ops::kTf32 || !std::is_same_v<Map, FullMap>) {
        mma_forward_kernel<Ops, 64, Map><<<grid, kThreads, 0, ::cf::cuda::stream()>>>(s, map);
      } else {
        if (D == 64)
          mma_forward_kernel<Ops, 64, Map><<<grid, kThreads, 0, ::cf::cuda::stream()>>>(s, map);
        else
          mma_forward_kernel<Ops, 128, Map><<<grid, kThreads, 0, ::cf::cuda::stream()>>>(s, map);
      }
      ::cf::cuda::check_launch(op);
    });
  }, op);
}

// dq, dk, dv must be zero first where no kernel writes (tokens in no slot of a block table): zero_first.
template <typename Map>
void run_backward(MmaArgs a, const Map& map, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv, int64_t rows, int64_t groups, int64_t gkeys, int64_t kgroups,
                  int64_t B, Operands operands, bool zero_first, const char* op) {
  auto f32 = [](const Tensor& t) { return t.dtype() == kFloat32; };
  auto f32_dense = [](const Tensor& t) {
    return t.dtype() == kFloat32 && t.is_contiguous() && reinterpret_cast<uintptr_t>(t.raw_data()) % 8 == 0;
  };
  CF_CHECK(f32(dout) && dout.dim() == 4 && dout.strides()[3] == 1 && (!dlse.defined() || f32(dlse)) &&
               f32_dense(dq) && f32_dense(dk) && f32_dense(dv),
           Error, "[", op, "] internal: the tensor-core backward got gradients it does not take: dout ",
           dout.describe(), ", dq ", dq.describe());
  // Output heads (out, lse, dout, D: B * a.H) and the q, k, v heads the dq and dkdv grids run over (one round
  // per launch).
  const int64_t BH = B * a.H, BHd = BH / a.R;
  if (zero_first)
    for (const Tensor* t : {&dq, &dk, &dv})
      if (t->numel() > 0)
        CF_CUDA_CHECK(cudaMemsetAsync(t->raw_data(), 0, size_t(t->numel()) * sizeof(float), ::cf::cuda::stream()), op);
  a.dout = static_cast<const float*>(dout.raw_data());
  a.sgo = rows3(dout);
  a.dq = static_cast<float*>(dq.raw_data());
  a.dk = static_cast<float*>(dk.raw_data());
  a.dv = static_cast<float*>(dv.raw_data());
  Tensor dvec = Tensor::empty({std::max<int64_t>(BH * a.Mq, 1)}, kFloat32, dout.device());
  a.dvec = static_cast<float*>(dvec.raw_data());
  if (BH * a.Mq > 0) {
    const int64_t threads = BH * a.Mq * 32;  // one warp per output row
    row_dot_kernel<<<unsigned((threads + 255) / 256), 256, 0, ::cf::cuda::stream()>>>(
        a, dlse.defined() ? static_cast<const float*>(dlse.raw_data()) : nullptr, rows3(dlse), BH * a.Mq, 64);
    ::cf::cuda::check_launch(op);
  }
  with_operands<kSlotRows<Map>>(operands, [&](auto ops) {
    using Ops = decltype(ops);
    const unsigned g1x = unsigned((rows + kRows - 1) / kRows), g1y = unsigned(groups);
    const unsigned g2x = unsigned((gkeys + kKeys - 1) / kKeys), g2y = unsigned(kgroups);
    // No dq launch (no query rows): dq is zero, once, before the rounds (which would add to it).
    if (!(g1x > 0 && g1y > 0 && BHd > 0) && !zero_first && dq.numel() > 0)
      CF_CUDA_CHECK(cudaMemsetAsync(dq.raw_data(), 0, size_t(dq.numel()) * sizeof(float), ::cf::cuda::stream()), op);
    for (a.this_round = 0; a.this_round < a.R; ++a.this_round) {
      if (g1x > 0 && g1y > 0 && BHd > 0) {
        for_head_slices(a, BHd, [&](const MmaArgs& s, unsigned gz) {
          mma_dq_kernel<Ops, Map><<<dim3(g1x, g1y, gz), kThreads, 0, ::cf::cuda::stream()>>>(s, map);
          ::cf::cuda::check_launch(op);
        });
      }
      if (g2x > 0 && g2y > 0 && BHd > 0) {
        for_head_slices(a, BHd, [&](const MmaArgs& s, unsigned gz) {
          mma_dkdv_kernel<Ops, Map><<<dim3(g2x, g2y, gz), kThreads, 0, ::cf::cuda::stream()>>>(s, map);
          ::cf::cuda::check_launch(op);
        });
      }
    }
  }, op);
}

}  // namespace

// ---------------------------------------------------------------- flash_attention

bool flash_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!takes_inputs(q, k, v)) return false;
  const int64_t D = q.shape()[3];
  const bool sizes = D == 64 || (D == 128 && q.dtype() != kFloat32);
  return sizes && k.shape()[3] == D && v.shape()[3] == D;
}

void flash_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                      const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  check_flash_no_dropout(p, "tensor-core kernel");
  const char* op = "flash_attention";
  CF_CHECK(flash_attention_mma_supported(q, k, v), Error, "[", op,
           "] internal: the tensor-core kernel does not take q ", q.describe());
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  const MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, 0.0);
  run_forward(a, full_map(q, k, kpm, p), a.Nq, 1, q.shape()[0] * a.H, q.shape()[3], operands_of(q), op);
}

bool flash_attention_backward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return flash_attention_mma_supported(q, k, v) && q.shape()[3] == 64;
}

void flash_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                       const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                       const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                       const Tensor& dv) {
  check_flash_no_dropout(p, "tensor-core kernel");
  const char* op = "flash_attention";
  CF_CHECK(flash_attention_backward_mma_supported(q, k, v), Error, "[", op,
           "] internal: the tensor-core backward does not take q ", q.describe());
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  const MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, 0.0);
  run_backward(a, full_map(q, k, kpm, p), dout, dlse, dq, dk, dv, a.Nq, 1, a.Nk, 1, q.shape()[0], operands_of(q),
               false, op);
}

// ---------------------------------------------------------------- block_attention

bool block_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   int64_t rounds) {
  if (rounds < 1 || !takes_inputs(q, k, v) || members.dim() != 4 || members.shape()[2] > 65535)
    return false;  // chunks: grid.y
  // One table per output head (q, k, v head and round) or one shared.
  if (members.shape()[1] != 1 && members.shape()[1] != q.shape()[1] * rounds) return false;
  return q.shape()[3] == 64 && k.shape()[3] == 64 && v.shape()[3] == 64;
}

// The wide-block rule was measured with one round; with rounds the blocks of a call count B H R C.
bool block_attention_mma_preferred(const Tensor& q, const Tensor& members, bool backward, int64_t rounds) {
  if (members.shape()[3] <= kBlockMmaMaxRows) return true;
  const int64_t blocks = q.shape()[0] * q.shape()[1] * rounds * members.shape()[2];
  return !backward && blocks >= cu::sm_count(q, "block_attention");
}

void block_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                      const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                      const Tensor& lse) {
  const char* op = "block_attention";
  CF_CHECK(block_attention_mma_supported(q, k, v, members, p.rounds), Error, "[", op,
           "] internal: the tensor-core kernel does not take q ", q.describe(), " with members ", members.describe(),
           " over ", p.rounds, " round(s)");
  check_no_attention_dropout(p.dropout, op, "tensor-core kernel");
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  // Tokens in no slot keep out = 0, lse = -inf.
  fill_cuda(out, 0.0);
  fill_cuda(lse, -std::numeric_limits<double>::infinity());
  MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, p.self_score);
  a.R = p.rounds;  // output heads h * R + r (out, lse and the table's heads)
  a.H *= p.rounds;
  const BlockMap map = block_map(q, members, kpm, p);
  run_forward(a, map, map.w, map.C, q.shape()[0] * a.H, 64, operands_of(q), op);
}

void block_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                       const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                       const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv) {
  const char* op = "block_attention";
  CF_CHECK(block_attention_mma_supported(q, k, v, members, p.rounds), Error, "[", op,
           "] internal: the tensor-core backward does not take q ", q.describe(), " with members ",
           members.describe(), " over ", p.rounds, " round(s)");
  check_no_attention_dropout(p.dropout, op, "tensor-core kernel");
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, p.self_score);
  a.R = p.rounds;  // run_backward: one launch pair per round over the q, k, v heads
  a.H *= p.rounds;
  const BlockMap map = block_map(q, members, kpm, p);
  run_backward(a, map, dout, dlse, dq, dk, dv, map.w, map.C, map.w, map.C, q.shape()[0], operands_of(q), true, op);
}

// ---------------------------------------------------------------- routed_attention

bool routed_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                    const Tensor& km) {
  // float32 only: routed_attention runs 16-bit inputs on float32 copies (no 16-bit kernels are built for it).
  if (q.dtype() != kFloat32 || !takes_inputs(q, k, v)) return false;
  if (qm.dim() != 4 || km.dim() != 4 || qm.shape()[2] > 65535) return false;  // lists: grid.y
  return q.shape()[3] == 64 && k.shape()[3] == 64 && v.shape()[3] == 64;
}

void routed_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                       const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                       const Tensor& out, const Tensor& lse) {
  const char* op = "routed_attention";
  check_no_attention_dropout(p.dropout, op, "tensor-core kernel");
  CF_CHECK(routed_attention_mma_supported(q, k, v, qm, km), Error, "[", op,
           "] internal: the tensor-core kernel does not take q ", q.describe());
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  // Empty query slots keep out = 0, lse = -inf.
  fill_cuda(out, 0.0);
  fill_cuda(lse, -std::numeric_limits<double>::infinity());
  const RoutedMap map = routed_map(q, qm, km, kpm, p);
  MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, 0.0);
  a.Mq = map.C * map.wq;  // slot order
  a.Mk = map.C * map.wk;
  run_forward(a, map, map.wq, map.C, q.shape()[0] * a.H, 64, operands_of(q), op);
}

void routed_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                        const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                        const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                        const Tensor& dk, const Tensor& dv) {
  const char* op = "routed_attention";
  check_no_attention_dropout(p.dropout, op, "tensor-core kernel");
  CF_CHECK(routed_attention_mma_supported(q, k, v, qm, km), Error, "[", op,
           "] internal: the tensor-core backward does not take q ", q.describe());
  check_inputs(q, k, v, out, lse, op);
  cu::use_device_of(out, op);
  const RoutedMap map = routed_map(q, qm, km, kpm, p);
  MmaArgs a = make_mma_args(q, k, v, out, lse, p.scale, 0.0);
  a.Mq = map.C * map.wq;  // slot-order gradients; empty slots get zero rows (zero_first)
  a.Mk = map.C * map.wk;
  run_backward(a, map, dout, Tensor(), dq, dk, dv, map.wq, map.C, map.wk, map.C, q.shape()[0], operands_of(q), true,
               op);
}

}  // namespace cf::kernels
