#pragma once
// bfloat16 GEMM on Intel AMX tiles (TDPBF16PS); bf16_amx_cpu.cpp says how.
#include <cstdint>

#include "core/half.h"

namespace cf::kernels {

// True when this CPU has AMX-TILE and AMX-BF16 and Linux granted this process the tile data
// state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once on the first call, i.e. at the first
// bfloat16 matmul). The grant is process-wide and raises the smallest signal stack Linux
// accepts (AT_MINSIGSTKSZ, about 12 KB with the 8 KB of tile data): after it, sigaltstack with
// a smaller stack (the old 8 KB SIGSTKSZ some crash handlers use) fails with ENOMEM; a smaller
// alternate stack installed before makes the request fail, and AMX stays off. The environment
// variable CF_BF16_AMX=0, set before the first bfloat16 matmul, keeps cf from asking at all (1 or
// unset: ask; another value is a ValueError from this function, so from the bfloat16 products that ask it).
bool bf16_amx_supported();
// True when it is supported and switched on: matmul then uses it for bfloat16 (before the
// AVX-512 BF16 kernel and the converting path).
bool bf16_amx_available();
// On by default where supported: at 2048^3 it measured several times float32 sgemm's speed on
// a Sapphire Rapids Xeon (docs/benchmarks.md). Off gives the converting path back (tests compare
// the two; cf-bench times both).
void set_bf16_amx_enabled(bool on);
// c (M x N, row stride ldc) = a (M x K, element strides a_rs, a_cs) @ b (K x N, strides b_rs,
// b_cs): products and sums in float32 (TDPBF16PS), one rounding to bfloat16 per output.
// As vdpbf16ps (bf16_dot.h), TDPBF16PS treats subnormal inputs as zero and flushes subnormal
// products and sums to zero: 2^-130 * 2^10 and 2^-63 * 2^-64 are 0 here where the converting path
// gives 2^-120 and 2^-127 (the exception to rule R2 in docs/design-notes.md; PyTorch's oneDNN AMX
// kernels flush alike).
void bf16_amx_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K);
// The same product kept in float32 (the bfloat16 arm of the CPU flash attention): c = alpha a @ b, or
// c += alpha a @ b when accumulate.
void bf16_amx_gemm_f32(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs,
                       int64_t b_cs, float* c, int64_t ldc, int64_t M, int64_t N, int64_t K, float alpha,
                       bool accumulate);

}  // namespace cf::kernels
