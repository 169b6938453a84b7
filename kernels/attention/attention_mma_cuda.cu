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
  __trap();  // the host launches this kernel on sm_80+ only (flash_attention_16bit_supported)
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
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    qa[s][0] = load2(&Ks[qr][s * 16 + 2 * t]);
    qa[s][1] = load2(&Ks[qr + 8][s * 16 + 2 * t]);
    qa[s][2] = load2(&Ks[qr][s * 16 + 8 + 2 * t]);
    qa[s][3] = load2(&Ks[qr + 8][s * 16 + 8 + 2 * t]);
  }

  const int64_t row[2] = {r0 + qr, r0 + qr + 8};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // l: this thread's part of the row sums
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  int64_t kend = a.Nk;
  if (a.causal) {  // keys past r0 + 63 + shift are blocked for every row of the block
    const int64_t e = r0 + kRows + a.shift;
    kend = e < 0 ? 0 : (e < a.Nk ? e : a.Nk);
  }
  for (int64_t j0 = 0; j0 < kend; j0 += kKeys) {
    __syncthreads();  // the previous tile (or Q) is no longer read
    load_tile<D>(Ks, K, j0, a.Nk);
    load_tile<D>(Vs, V, j0, a.Nk);
    __syncthreads();
    // S = Q K^T: 8 tiles of 8 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        mma16816<kBF16>(s[n], qa[ks], load2(&Ks[n * 8 + g][ks * 16 + 2 * t]),
                        load2(&Ks[n * 8 + g][ks * 16 + 8 + 2 * t]));
    }
    // Scale and mask (the FullMap rules of attention_cuda.cu), then the rows' maxima over
    // the four lanes that share a row.
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int64_t i = row[h], j = j0 + n * 8 + 2 * t + (e & 1);
        const bool blocked = j >= a.Nk || (a.pad && a.pad[b * a.Nk + j]) || (a.causal && j > i + a.shift);
        const float x = blocked ? kNegInf : s[n][e] * a.scale;
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
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const uint32_t pa[4] = {pack2<kBF16>(s[2 * ks][0], s[2 * ks][1]), pack2<kBF16>(s[2 * ks][2], s[2 * ks][3]),
                              pack2<kBF16>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              pack2<kBF16>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
      const int k0 = ks * 16 + 2 * t;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        const int c = d * 8 + g;
        const uint32_t b0 = uint32_t(Vs[k0][c]) | (uint32_t(Vs[k0 + 1][c]) << 16);
        const uint32_t b1 = uint32_t(Vs[k0 + 8][c]) | (uint32_t(Vs[k0 + 9][c]) << 16);
        mma16816<kBF16>(o[d], pa, b0, b1);
      }
    }
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

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// Compute capability >= 8.0 of the device (cached per device: the answer never changes).
bool has_bf16_mma(int dev) {
  static int major[64] = {0};
  if (dev < 0 || dev >= 64) return false;
  if (major[dev] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    major[dev] = v;
  }
  return major[dev] >= 8;
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
  return has_bf16_mma(int(q.device().index));
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

}  // namespace cf::kernels
