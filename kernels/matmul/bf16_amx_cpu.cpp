// bfloat16 GEMM on Intel AMX (Sapphire Rapids and later). A tile register holds up to 16 rows of
// 64 bytes; TDPBF16PS multiplies a 16 x 32 bfloat16 tile of A by a 32 x 16 tile of B (stored as
// 16 rows of 16 (k, k+1) pairs) into a 16 x 16 float32 tile of C: 8192 multiply-adds per
// instruction, where a float32 FMA does 16. The products and sums are float32; C is rounded to
// bfloat16 once, at the end, like the converting path (float32 copies + sgemm) it is tested
// against (tests/ops/test_matmul_bf16_dot.cpp).
//
// Registers: C is a 32 x 32 block in tiles 0-3, A's two 16-row tiles are 4-5, B's two 16-column
// tiles 6-7; each loaded tile feeds two TDPBF16PS. Both operands are packed into 1 KB tiles, M, N
// and K rounded up to 32 with zeros: A's 16 rows x 32 consecutive k (pack_a), B's 16 rows of the
// (k, k+1) pairs of 16 columns (pack_b), so every tile load reads 1 KB of consecutive bytes.
// Blocking: see kMc. The packing uses AVX-512 (every AMX CPU has it); the final rounding is the row
// tier's float32 -> bfloat16 (kernels/common/row_math.h).
//
// Linux hands the tile state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM, kernel
// 5.16+); without it the first tile instruction is a SIGILL. bf16_amx_supported() asks once and
// says no when the CPU, the OS (XCR0) or the request says no, so the library runs anywhere.
#include "kernels/matmul/bf16_amx.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
// GCC 12's AVX-512 intrinsics fill their unused source operand with _mm512_undefined_epi32()
// (`__m512i __Y = __Y;`), which -Wmaybe-uninitialized and -Wuninitialized report wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CF_HAVE_BF16_AMX 1
#endif

#include "core/error.h"
#include "kernels/common/cpu_isa.h"
#include "kernels/common/row_math.h"
#include "kernels/common/scratch.h"
#include "kernels/matmul/bf16_pack.h"

namespace cf::kernels {

#ifdef CF_HAVE_BF16_AMX
namespace {
std::atomic<bool> g_enabled{true};  // see set_bf16_amx_enabled

// Blocking, measured at 2048^3 on one core (tile loads from L1 and L2 run at 100-130 GB/s here,
// from L3 at 25): a row block of A (kMc rows x kKcBlocks * 32 values of k, 256 KB) stays in L2
// while every 32-column micro-panel of B (128 KB) passes over it; K up to 2048 is one block, so C
// goes through memory once. Blocks of 8 or 16 k blocks measured 10-20% slower.
constexpr int64_t kMc = 64;
constexpr int64_t kKcBlocks = 64;

// The tile instructions as inline assembly that tells the compiler what memory they touch. GCC 12's
// <immintrin.h> versions do not: its _tile_loadconfig names an 8-byte operand (the zeroing of the
// rest of a 64-byte config on the stack was removed as dead, and ldtilecfg faulted on the garbage)
// and its _tile_loadd declares no memory read (stores that fill the packed buffers could be moved
// past it). AT&T operand order: tdpbf16ps B, A, C computes C += A B.
#define CF_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(int64_t(stride)) : "memory")
#define CF_TILE_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(int64_t(stride)) : "memory")
#define CF_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::: "memory")
#define CF_TILE_DPBF16PS(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

bool cpu_and_os_grant_amx() {
  // CF_BF16_AMX=0: never ask (the grant raises the minimum signal stack, see bf16_amx.h)
  if (env_switch("CF_BF16_AMX", "matmul") == false) return false;  // (1: ask, as unset)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE: xgetbv works
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;  // AMX-BF16, AMX-TILE
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return false;  // the packing and rounding
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// A (M x K, strides rs, cs) into tiles: row group g (16 rows) and k block kb (32 values) are the
// 1 KB at ap + (g * Kp/32 + kb) * 512, 32 values per row. (Row-major A with its K-long rows put the
// 16 rows of a tile 2 K bytes apart, 4 KB at K = 2048: one L1 set for all of them.)
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a(const BFloat16* a, int64_t rs, int64_t cs,
                                                                  int64_t M, int64_t K, int64_t Mp, int64_t Kp,
                                                                  uint16_t* ap) {
  const int64_t kblocks = Kp / 32;
  for (int64_t g = 0; g < Mp / 16; ++g)
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      uint16_t* tile = ap + (g * kblocks + kb) * 512;
      const int64_t k0 = 32 * kb, kn = std::max<int64_t>(0, std::min<int64_t>(32, K - k0)),
                    rn = std::clamp<int64_t>(M - 16 * g, 0, 16);
      if (cs == 1) {
        for (int64_t r = 0; r < 16; ++r) {  // one masked 64-byte load per row
          const int64_t n = r < rn ? kn : 0;
          const __mmask32 m = n >= 32 ? ~__mmask32(0) : __mmask32((1u << n) - 1u);
          _mm512_storeu_si512(tile + r * 32,
                              n > 0 ? _mm512_maskz_loadu_epi16(m, a + (16 * g + r) * rs + k0) : _mm512_setzero_si512());
        }
      } else if (rs == 1) {  // a transposed A (its columns contiguous): pairs of its columns, then transposed
        __m512i rows[16];
        for (int64_t kk = 0; kk < 16; ++kk) {
          const int64_t k = k0 + 2 * kk;
          rows[kk] = interleave_pairs(a + k * cs + 16 * g, k < K, a + (k + 1) * cs + 16 * g, k + 1 < K, rn);
        }
        transpose_16x16_dwords(rows);
        for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(tile + r * 32, rows[r]);
      } else {
        for (int64_t r = 0; r < 16; ++r)
          for (int64_t k = 0; k < 32; ++k)
            tile[r * 32 + k] = k < kn && r < rn ? a[(16 * g + r) * rs + (k0 + k) * cs].bits : uint16_t(0);
      }
    }
}

// B (K x N, strides rs, cs) into subpanels of 16 columns of (k, k+1) pairs (see the top): tile
// (q, kb) is the 1 KB at bp + (q * Kp/32 + kb) * 512.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b(const BFloat16* b, int64_t rs, int64_t cs,
                                                                  int64_t K, int64_t N, int64_t Kp, int64_t Np,
                                                                  uint16_t* bp) {
  const int64_t kblocks = Kp / 32, subpanels = Np / 16;
  for (int64_t kb = 0; kb < kblocks; ++kb)  // 32 rows of B at a time, written one 1 KB tile after another
    for (int64_t q = 0; q < subpanels; ++q) {
      uint16_t* tile = bp + (q * kblocks + kb) * 512;
      const int64_t n0 = 16 * q, w = std::clamp<int64_t>(N - n0, 0, 16), k0 = 32 * kb,
                    kn = std::max<int64_t>(0, std::min<int64_t>(32, K - k0));
      if (cs == 1) {  // rows of B are contiguous: interleave rows k and k + 1, 16 columns at a time
        for (int64_t kk = 0; kk < 16; ++kk) {
          const int64_t k = k0 + 2 * kk;
          _mm512_storeu_si512(tile + kk * 32,
                              interleave_pairs(b + k * rs + n0, k < K, b + (k + 1) * rs + n0, k + 1 < K, w));
        }
      } else if (rs == 1) {  // a transposed B (its columns contiguous): each column's pairs, then transposed
        const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1u);
        __m512i cols[16];
        for (int64_t n = 0; n < 16; ++n)
          cols[n] = n < w && kn > 0 ? _mm512_maskz_loadu_epi16(m, b + (n0 + n) * cs + k0) : _mm512_setzero_si512();
        transpose_16x16_dwords(cols);
        for (int64_t kk = 0; kk < 16; ++kk) _mm512_storeu_si512(tile + kk * 32, cols[kk]);
      } else {
        for (int64_t kk = 0; kk < 16; ++kk)
          for (int64_t n = 0; n < 16; ++n)
            for (int64_t j = 0; j < 2; ++j) {
              const int64_t k = k0 + 2 * kk + j;
              tile[kk * 32 + 2 * n + j] = k < K && n < w ? b[k * rs + (n0 + n) * cs].bits : uint16_t(0);
            }
      }
    }
}

// C[i0 .. i0+32, 16 q .. 16 q + 32] (float32, row stride ldc) += the product over k blocks
// [kb0, kb0 + kbn); C starts at zero instead when `first`.
void block_32x32(const uint16_t* ap, const uint16_t* bp, int64_t Kp, int64_t i0, int64_t q, int64_t kb0,
                 int64_t kbn, float* c, int64_t ldc, bool first) {
  const uint16_t* a0 = ap + i0 * Kp + kb0 * 512;  // row group i0 / 16: its k blocks are consecutive tiles
  const uint16_t* a1 = a0 + 16 * Kp;
  const uint16_t* b0 = bp + q * Kp * 16 + kb0 * 512;
  const uint16_t* b1 = b0 + Kp * 16;
  const int64_t stride = ldc * 4;
  if (first) {
    CF_TILE_ZERO(0);
    CF_TILE_ZERO(1);
    CF_TILE_ZERO(2);
    CF_TILE_ZERO(3);
  } else {
    CF_TILE_LOAD(0, c, stride);
    CF_TILE_LOAD(1, c + 16, stride);
    CF_TILE_LOAD(2, c + 16 * ldc, stride);
    CF_TILE_LOAD(3, c + 16 * ldc + 16, stride);
  }
  for (int64_t kb = 0; kb < kbn; ++kb) {
    CF_TILE_LOAD(4, a0 + kb * 512, 64);
    CF_TILE_LOAD(6, b0 + kb * 512, 64);
    CF_TILE_DPBF16PS(0, 4, 6);
    CF_TILE_LOAD(7, b1 + kb * 512, 64);
    CF_TILE_DPBF16PS(1, 4, 7);
    CF_TILE_LOAD(5, a1 + kb * 512, 64);
    CF_TILE_DPBF16PS(2, 5, 6);
    CF_TILE_DPBF16PS(3, 5, 7);
  }
  CF_TILE_STORE(0, c, stride);
  CF_TILE_STORE(1, c + 16, stride);
  CF_TILE_STORE(2, c + 16 * ldc, stride);
  CF_TILE_STORE(3, c + 16 * ldc + 16, stride);
}

// A per-thread buffer of n elements at a 64-byte boundary, reused across calls: tile rows that
// straddle two cache lines made the loads 4-5x slower (measured: 26 against 126 GB/s from L1).
template <typename T>
T* aligned_buffer(std::vector<T>& storage, int64_t n) {
  const size_t pad = 64 / sizeof(T);
  scratch_resize(storage, size_t(n) + pad);
  const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
  return storage.data() + ((64 - p % 64) % 64) / sizeof(T);
}

void load_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}
void release_tiles() { __asm__ volatile("tilerelease" ::: "memory"); }
}  // namespace

bool bf16_amx_supported() {
  static const bool have = cpu_and_os_grant_amx();
  return have;
}
bool bf16_amx_available() { return g_enabled.load(std::memory_order_relaxed) && bf16_amx_supported(); }
void set_bf16_amx_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

namespace {

// The product of a (M x K) and b (K x N) in float32; emit(block, ldb, i, j, rows, cols) takes each finished
// block of C (rows x cols at row i, column j; row stride ldb), once, after its last k block.
template <typename Emit>
void amx_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
              int64_t M, int64_t N, int64_t K, Emit&& emit) {
  CF_CHECK(bf16_amx_supported(), Error, "[matmul] internal error: the AMX kernel called without AMX");
  if (M == 0 || N == 0) return;
  const int64_t Mp = (M + 31) / 32 * 32, Kp = std::max<int64_t>((K + 31) / 32 * 32, 32),
                Np = (N + 31) / 32 * 32;
  thread_local std::vector<uint16_t> a_storage, b_storage;
  thread_local std::vector<float> c_storage;
  const ScratchTrim trim(a_storage, b_storage, c_storage);
  uint16_t* ap = aligned_buffer(a_storage, Mp * Kp);
  uint16_t* bp = aligned_buffer(b_storage, Np * Kp);
  float* cbuf = aligned_buffer(c_storage, std::min(Mp, kMc) * Np);  // C of one row block
  pack_a(a, a_rs, a_cs, M, K, Mp, Kp, ap);
  pack_b(b, b_rs, b_cs, K, N, Kp, Np, bp);
  const int64_t kblocks = Kp / 32;
  load_config();
  for (int64_t m0 = 0; m0 < Mp; m0 += kMc)
    for (int64_t kb0 = 0; kb0 < kblocks; kb0 += kKcBlocks) {
      const int64_t kbn = std::min(kKcBlocks, kblocks - kb0);
      const bool last = kb0 + kbn == kblocks;
      for (int64_t j0 = 0; j0 < Np; j0 += 32)
        for (int64_t i0 = m0; i0 < std::min(Mp, m0 + kMc); i0 += 32) {
          float* cb = cbuf + (i0 - m0) * Np + j0;
          block_32x32(ap, bp, Kp, i0, j0 / 16, kb0, kbn, cb, Np, kb0 == 0);
          // finished after the last k block, while the block is in L1
          if (last) emit(cb, Np, i0, j0, std::min<int64_t>(32, M - i0), std::min<int64_t>(32, N - j0));
        }
    }
  release_tiles();
}

}  // namespace

void bf16_amx_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  // One rounding per output, the row tier's (bit for bit core/half.h's float_to_bf16_bits)
  const RowMath& rm = row_math();
  amx_gemm(a, a_rs, a_cs, b, b_rs, b_cs, M, N, K,
           [&](const float* cb, int64_t ldb, int64_t i, int64_t j, int64_t rows, int64_t cols) {
             for (int64_t r = 0; r < rows; ++r)
               round_row(rm, cb + r * ldb, c + (i + r) * ldc + j, cols);
           });
}

void bf16_amx_gemm_f32(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs,
                       int64_t b_cs, float* c, int64_t ldc, int64_t M, int64_t N, int64_t K, float alpha,
                       bool accumulate) {
  if (empty_sum_f32(c, ldc, M, N, K, accumulate)) return;
  amx_gemm(a, a_rs, a_cs, b, b_rs, b_cs, M, N, K,
           [&](const float* cb, int64_t ldb, int64_t i, int64_t j, int64_t rows, int64_t cols) {
             for (int64_t r = 0; r < rows; ++r) scale_row(cb + r * ldb, c + (i + r) * ldc + j, cols, alpha, accumulate);
           });
}
#else
bool bf16_amx_supported() { return false; }
bool bf16_amx_available() { return false; }
void set_bf16_amx_enabled(bool) {}
void bf16_amx_gemm(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, BFloat16*, int64_t, int64_t,
                   int64_t, int64_t) {
  throw NotImplementedError("[matmul] bf16_amx_gemm needs an x86-64 Linux GCC build");
}
void bf16_amx_gemm_f32(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, float*, int64_t, int64_t,
                       int64_t, int64_t, float, bool) {
  throw NotImplementedError("[matmul] bf16_amx_gemm_f32 needs an x86-64 Linux GCC build");
}
#endif

}  // namespace cf::kernels
