// bfloat16 GEMM on AVX-512 BF16 (vdpbf16ps): each instruction multiplies 16 pairs of bfloat16
// products and adds both into 16 float32 accumulators, twice the work of a float32 FMA per
// instruction, with no conversion of the operands to float32. Used by matmul_cpu for bfloat16
// where it is switched on (by default on AMD CPUs, off on Intel's: bf16_dot.h says why)
// and the CPU reports avx512bf16 (checked at run time; the code is compiled for it with a
// function target attribute, so the library still runs on any x86-64). The converting path
// (float32 blocks + sgemm) is the reference it is tested against (tests/ops/test_matmul_bf16_dot.cpp).
//
// Layout: A is packed row-major (M x Kp, Kp = K rounded up to even, zero padded); B is packed
// in panels of 64 columns, each panel's (k, k+1) pairs contiguous:
// Bp[((p * Kp/2 + kk) * 64 + n) * 2 + j] = B[2 kk + j][64 p + n] (N rounded up to 64), so one
// 512-bit load holds the pairs of 16 columns, consecutive kk are consecutive 256 bytes, and a
// 32-bit broadcast holds A's pair. A 4 x 64 block of C lives in 16 registers. The loops block K
// (kKcPairs pairs) and M (kDotMc rows) so that a 64-column B panel block (64 KB) and the A block
// (64 KB) stay in L2 while the 4-row groups run over them; partial sums of C wait in a float32
// buffer between K blocks. (The first version walked B with a stride of N pairs and streamed all
// of A once per panel: 0.22 of sgemm at 2048 on a Sapphire Rapids Xeon.)
#include "kernels/matmul/bf16_dot.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/row_math.h"
#include "kernels/common/scratch.h"
#include "kernels/matmul/bf16_pack.h"

#ifdef CF_HAVE_BF16_PACK
// (as in bf16_amx_cpu.cpp: GCC 12's AVX-512 intrinsics fill their unused source operand with
// _mm512_undefined_epi32(), which -Wmaybe-uninitialized reports wherever the packing helpers are inlined)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define CF_HAVE_BF16_DOT 1
#endif

namespace cf::kernels {

#ifdef CF_HAVE_BF16_DOT
namespace {
// set_bf16_dot_enabled's choice: -1 none (bf16_dot_default_on() rules), 0 off, 1 on.
std::atomic<int> g_dot_choice{-1};

// One R x (16 V) block of C over the whole K (R <= 4 rows, V <= 4 vectors of 16 columns), unrolled
// at compile time so the accumulators stay in registers.
// ap: the group's first row at the block's first pair (rows Kp apart); bp: the panel at the
// block's first pair (pairs 64 columns apart); c: float32 C (rows ldc apart), added to unless
// `first` (the first K block).
template <int R, int V>
__attribute__((target("avx512f,avx512bf16"))) void block(const uint16_t* ap, const uint16_t* bp, float* c,
                                                         int64_t Kp, int64_t ldc, int64_t pairs, bool first) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16 * v);
  for (int64_t kk = 0; kk < pairs; ++kk) {
    __m512i bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_si512(bp + (kk * 64 + 16 * v) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, ap + r * Kp + 2 * kk, 4);
      const __m512i av = _mm512_set1_epi32(int(pair));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

using BlockFn = void (*)(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, bool);
BlockFn block_for(int64_t r) { return r == 1 ? block<1, 4> : r == 2 ? block<2, 4> : r == 3 ? block<3, 4> : block<4, 4>; }

constexpr int64_t kKcPairs = 256;  // K block: 512 values of k
constexpr int64_t kDotMc = 64;        // M block: rows

// A (M x K, strides rs, cs) row-major into ap (M x Kp), the pad column (K odd) zero. Row-major A: a copy per
// row; a transposed A (columns contiguous): pairs of its columns for 16 rows, transposed in registers
// (bf16_pack.h); any other layout element by element. (Element by element for every layout, this and
// pack_dot_b took 45% of the kernel's time in a small model's step.)
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_dot_a(const BFloat16* a, int64_t rs, int64_t cs,
                                                                  int64_t M, int64_t K, int64_t Kp, uint16_t* ap) {
  if (cs == 1) {
    for (int64_t i = 0; i < M; ++i) {
      std::memcpy(ap + i * Kp, a + i * rs, size_t(K) * sizeof(uint16_t));
      if (Kp > K) ap[i * Kp + K] = 0;
    }
  } else if (rs == 1) {
    for (int64_t i0 = 0; i0 < M; i0 += 16) {
      const int64_t rn = std::min<int64_t>(16, M - i0);
      for (int64_t k0 = 0; k0 < Kp; k0 += 32) {  // 16 pairs of 16 rows
        __m512i rows[16];
        for (int64_t kk = 0; kk < 16; ++kk) {
          const int64_t k = k0 + 2 * kk;
          rows[kk] = interleave_pairs(a + k * cs + i0, k < K, a + (k + 1) * cs + i0, k + 1 < K, rn);
        }
        transpose_16x16_dwords(rows);  // rows[r]: row i0 + r's pairs k0 / 2 ... k0 / 2 + 15
        const int64_t kn = std::min<int64_t>(32, Kp - k0);
        const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1u);
        for (int64_t r = 0; r < rn; ++r) _mm512_mask_storeu_epi16(ap + (i0 + r) * Kp + k0, m, rows[r]);
      }
    }
  } else {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t k = 0; k < K; ++k) ap[i * Kp + k] = a[i * rs + k * cs].bits;
      if (Kp > K) ap[i * Kp + K] = 0;
    }
  }
}

// B (K x N, strides rs, cs) into panels of 64 columns of (k, k+1) pairs (the layout at the top), the pads
// (k = K when K is odd, columns from N to Np) zero. Row-major B: rows k and k + 1 interleaved, 16 columns at
// a time; a transposed B (columns contiguous): 16 pairs of 16 columns, transposed in registers.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_dot_b(const BFloat16* b, int64_t rs, int64_t cs,
                                                                  int64_t K, int64_t N, int64_t pairs,
                                                                  int64_t panels, uint16_t* bp) {
  auto at = [&](int64_t p, int64_t kk, int64_t group) { return bp + ((p * pairs + kk) * 64 + 16 * group) * 2; };
  if (rs != 1 || cs == 1) {  // row-major B, or any layout but a transposed one
    for (int64_t p = 0; p < panels; ++p)
      for (int64_t group = 0; group < 4; ++group) {
        const int64_t n0 = 64 * p + 16 * group, w = std::clamp<int64_t>(N - n0, 0, 16);
        for (int64_t kk = 0; kk < pairs; ++kk) {
          const int64_t k = 2 * kk;
          if (cs == 1) {
            _mm512_storeu_si512(at(p, kk, group),
                                interleave_pairs(b + k * rs + n0, k < K, b + (k + 1) * rs + n0, k + 1 < K, w));
          } else {
            uint16_t* d = at(p, kk, group);
            for (int64_t n = 0; n < 16; ++n)
              for (int64_t j = 0; j < 2; ++j)
                d[2 * n + j] = n < w && k + j < K ? b[(k + j) * rs + (n0 + n) * cs].bits : uint16_t(0);
          }
        }
      }
    return;
  }
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t group = 0; group < 4; ++group) {
      const int64_t n0 = 64 * p + 16 * group, w = std::clamp<int64_t>(N - n0, 0, 16);
      for (int64_t kk0 = 0; kk0 < pairs; kk0 += 16) {
        const int64_t k0 = 2 * kk0, kn = std::clamp<int64_t>(K - k0, 0, 32);
        const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1u);
        __m512i cols[16];
        for (int64_t n = 0; n < 16; ++n)
          cols[n] = n < w && kn > 0 ? _mm512_maskz_loadu_epi16(m, b + (n0 + n) * cs + k0) : _mm512_setzero_si512();
        transpose_16x16_dwords(cols);  // cols[kk]: pair kk0 + kk of the 16 columns
        for (int64_t kk = 0; kk < std::min<int64_t>(16, pairs - kk0); ++kk)
          _mm512_storeu_si512(at(p, kk0 + kk, group), cols[kk]);
      }
    }
}
}  // namespace

bool bf16_dot_supported() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return have;
}
bool bf16_dot_default_on() {
  static const bool on = [] {
    // CF_BF16_DOT=0 / 1 overrides the vendor rule (as CF_BF16_AMX=0 does for AMX): for measurements
    if (const std::optional<bool> env = env_switch("CF_BF16_DOT", "matmul")) return *env;
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") > 0;
  }();
  return bf16_dot_supported() && on;
}
bool bf16_dot_available() {
  const int choice = g_dot_choice.load(std::memory_order_relaxed);
  return bf16_dot_supported() && (choice < 0 ? bf16_dot_default_on() : choice == 1);
}
void set_bf16_dot_enabled(bool on) { g_dot_choice.store(on ? 1 : 0, std::memory_order_relaxed); }
void reset_bf16_dot_enabled() { g_dot_choice.store(-1, std::memory_order_relaxed); }

namespace {
// The product of a (M x K) and b (K x N) in float32; emit(c32, ldc32, i) takes row i of it (N values).
template <typename Emit>
void dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
              int64_t M, int64_t N, int64_t K, Emit&& emit) {
  CF_CHECK(bf16_dot_supported(), Error, "[matmul] internal error: the vdpbf16ps kernel called without avx512bf16");
  const int64_t Kp = (K + 1) / 2 * 2, pairs = Kp / 2, Np = (N + 63) / 64 * 64, panels = Np / 64;
  thread_local std::vector<uint16_t> ap, bp;
  thread_local std::vector<float> cf32;
  const ScratchTrim trim(ap, bp, cf32);
  scratch_resize(ap, size_t(M * Kp));
  scratch_resize(bp, size_t(panels * pairs * 128));
  scratch_resize(cf32, size_t(M * Np));
  pack_dot_a(a, a_rs, a_cs, M, K, Kp, ap.data());
  pack_dot_b(b, b_rs, b_cs, K, N, pairs, panels, bp.data());
  if (pairs == 0) std::fill(cf32.begin(), cf32.end(), 0.0f);  // K = 0: C = 0
  for (int64_t k0 = 0; k0 < pairs; k0 += kKcPairs) {
    const int64_t kc = std::min(kKcPairs, pairs - k0);
    for (int64_t m0 = 0; m0 < M; m0 += kDotMc)
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t i0 = m0; i0 < std::min(M, m0 + kDotMc); i0 += 4)
          block_for(std::min<int64_t>(4, M - i0))(ap.data() + i0 * Kp + 2 * k0, bp.data() + (p * pairs + k0) * 128,
                                                  cf32.data() + i0 * Np + 64 * p, Kp, Np, kc, k0 == 0);
  }
  for (int64_t i = 0; i < M; ++i) emit(cf32.data() + i * Np, i);
}
}  // namespace

void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  // one rounding per output, the row tier's (bit for bit core/half.h's BFloat16(float))
  const RowMath& rm = row_math();
  dot_gemm(a, a_rs, a_cs, b, b_rs, b_cs, M, N, K, [&](const float* row, int64_t i) {
    round_row(rm, row, c + i * ldc, N);
  });
}

void bf16_dot_gemm_f32(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs,
                       int64_t b_cs, float* c, int64_t ldc, int64_t M, int64_t N, int64_t K, float alpha,
                       bool accumulate) {
  if (empty_sum_f32(c, ldc, M, N, K, accumulate)) return;
  dot_gemm(a, a_rs, a_cs, b, b_rs, b_cs, M, N, K,
           [&](const float* row, int64_t i) { scale_row(row, c + i * ldc, N, alpha, accumulate); });
}
#else
bool bf16_dot_supported() { return false; }
bool bf16_dot_default_on() { return false; }
bool bf16_dot_available() { return false; }
void set_bf16_dot_enabled(bool) {}
void reset_bf16_dot_enabled() {}
void bf16_dot_gemm(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, BFloat16*, int64_t, int64_t,
                   int64_t, int64_t) {
  throw NotImplementedError("[matmul] bf16_dot_gemm needs an x86-64 GCC build");
}
void bf16_dot_gemm_f32(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, float*, int64_t,
                       int64_t, int64_t, int64_t, float, bool) {
  throw NotImplementedError("[matmul] bf16_dot_gemm_f32 needs an x86-64 GCC build");
}
#endif

}  // namespace cf::kernels
