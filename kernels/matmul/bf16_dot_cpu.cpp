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
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
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
}  // namespace

bool bf16_dot_supported() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return have;
}
bool bf16_dot_default_on() {
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
  }();
  return bf16_dot_supported() && amd;
}
bool bf16_dot_available() {
  const int choice = g_dot_choice.load(std::memory_order_relaxed);
  return bf16_dot_supported() && (choice < 0 ? bf16_dot_default_on() : choice == 1);
}
void set_bf16_dot_enabled(bool on) { g_dot_choice.store(on ? 1 : 0, std::memory_order_relaxed); }
void reset_bf16_dot_enabled() { g_dot_choice.store(-1, std::memory_order_relaxed); }

void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  const int64_t Kp = (K + 1) / 2 * 2, pairs = Kp / 2, Np = (N + 63) / 64 * 64, panels = Np / 64;
  thread_local std::vector<uint16_t> ap, bp;
  thread_local std::vector<float> cf32;
  ap.assign(size_t(M * Kp), 0);
  bp.assign(size_t(panels * pairs * 128), 0);
  cf32.resize(size_t(M * Np));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) ap[size_t(i * Kp + k)] = a[i * a_rs + k * a_cs].bits;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      bp[size_t((((n / 64) * pairs + k / 2) * 64 + n % 64) * 2 + (k & 1))] = b[k * b_rs + n * b_cs].bits;
  if (pairs == 0) std::fill(cf32.begin(), cf32.end(), 0.0f);  // K = 0: C = 0
  for (int64_t k0 = 0; k0 < pairs; k0 += kKcPairs) {
    const int64_t kc = std::min(kKcPairs, pairs - k0);
    for (int64_t m0 = 0; m0 < M; m0 += kDotMc)
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t i0 = m0; i0 < std::min(M, m0 + kDotMc); i0 += 4)
          block_for(std::min<int64_t>(4, M - i0))(ap.data() + i0 * Kp + 2 * k0, bp.data() + (p * pairs + k0) * 128,
                                                  cf32.data() + i0 * Np + 64 * p, Kp, Np, kc, k0 == 0);
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) c[i * ldc + n] = BFloat16(cf32[size_t(i * Np + n)]);
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
#endif

}  // namespace cf::kernels
