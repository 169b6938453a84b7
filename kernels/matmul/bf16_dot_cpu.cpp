// bfloat16 GEMM on AVX-512 BF16 (vdpbf16ps): each instruction multiplies 16 pairs of bfloat16
// products and adds both into 16 float32 accumulators, twice the work of a float32 FMA per
// instruction, with no conversion of the operands to float32. Used by matmul_cpu for bfloat16
// when the CPU reports avx512bf16 (checked at run time; the code is compiled for it with a
// function target attribute, so the library still runs on any x86-64). The converting path
// (float32 blocks + sgemm) is the reference it is tested against (tests/ops/test_matmul_bf16_dot.cpp).
//
// Layout: A is packed row-major (M x Kp, Kp = K rounded up to even, zero padded); B is packed
// as pairs: Bp[(kk * Np + n) * 2 + j] = B[2 kk + j][n] (Np = N rounded up to 16), so one 512-bit
// load holds the (k, k+1) pairs of 16 columns and a 32-bit broadcast holds A's pair. A 4 x 64
// block of C lives in 16 registers; the B panel of 64 columns (Kp * 128 bytes) stays in L2
// while all rows stream past it.
#include "kernels/matmul/bf16_dot.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define CF_HAVE_BF16_DOT 1
#endif

namespace cf::kernels {

#ifdef CF_HAVE_BF16_DOT
namespace {
bool g_enabled = true;

// One R x (16 V) block of C over the whole K (R <= 4 rows, V <= 4 vectors of 16 columns), unrolled
// at compile time so the accumulators stay in registers.
template <int R, int V>
__attribute__((target("avx512f,avx512bf16"))) void block(const uint16_t* ap, const uint16_t* bp, float* c,
                                                         int64_t Kp, int64_t Np) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t pairs = Kp / 2;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    __m512i bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_si512(bp + (kk * Np + 16 * v) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, ap + r * Kp + 2 * kk, 4);
      const __m512i av = _mm512_set1_epi32(int(pair));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + r * Np + 16 * v, acc[r][v]);
}

using BlockFn = void (*)(const uint16_t*, const uint16_t*, float*, int64_t, int64_t);
template <int R>
BlockFn block_for(int64_t v) {
  return v == 1 ? block<R, 1> : v == 2 ? block<R, 2> : v == 3 ? block<R, 3> : block<R, 4>;
}
BlockFn block_for(int64_t r, int64_t v) {
  return r == 1 ? block_for<1>(v) : r == 2 ? block_for<2>(v) : r == 3 ? block_for<3>(v) : block_for<4>(v);
}
}  // namespace

bool bf16_dot_available() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return have && g_enabled;
}
void set_bf16_dot_enabled(bool on) { g_enabled = on; }

void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  const int64_t Kp = (K + 1) / 2 * 2, Np = (N + 15) / 16 * 16;
  thread_local std::vector<uint16_t> ap, bp;
  thread_local std::vector<float> cf32;
  ap.assign(size_t(M * Kp), 0);
  bp.assign(size_t(Kp / 2 * Np * 2), 0);
  cf32.resize(size_t(M * Np));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) ap[size_t(i * Kp + k)] = a[i * a_rs + k * a_cs].bits;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) bp[size_t(((k / 2) * Np + n) * 2 + (k & 1))] = b[k * b_rs + n * b_cs].bits;
  for (int64_t n0 = 0; n0 < Np; n0 += 64) {
    const int64_t cols16 = std::min<int64_t>(4, (Np - n0) / 16);
    for (int64_t i0 = 0; i0 < M; i0 += 4)
      block_for(std::min<int64_t>(4, M - i0), cols16)(ap.data() + i0 * Kp, bp.data() + n0 * 2,
                                                     cf32.data() + i0 * Np + n0, Kp, Np);
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) c[i * ldc + n] = BFloat16(cf32[size_t(i * Np + n)]);
}
#else
bool bf16_dot_available() { return false; }
void set_bf16_dot_enabled(bool) {}
void bf16_dot_gemm(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, BFloat16*, int64_t, int64_t,
                   int64_t, int64_t) {
  throw NotImplementedError("[matmul] bf16_dot_gemm needs an x86-64 GCC build");
}
#endif

}  // namespace cf::kernels
