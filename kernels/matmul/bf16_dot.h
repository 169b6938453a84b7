#pragma once
// bfloat16 GEMM with AVX-512 BF16 dot products (bf16_dot_cpu.cpp says how).
#include <cstdint>

#include "core/half.h"
#include "core/error.h"

namespace cf::kernels {

// True when this CPU has avx512bf16 (the kernel can run).
bool bf16_dot_supported();
// True when it is supported and switched on: matmul then uses it for bfloat16 (after AMX, below).
bool bf16_dot_available();
// Whether it is on without set_bf16_dot_enabled: where it is supported on an AMD CPU (the environment
// variable CF_BF16_DOT, read once, overrides the vendor rule: 0 or 1; another value is a ValueError from here). On Zen 5
// (an EPYC of CPU family 26, one thread) it ran at 1.73x OpenBLAS's SkylakeX sgemm and 1.77x the
// converting path (float32 blocks + sgemm) at 2048, since there vdpbf16ps issues at the rate of a
// float32 FMA and does twice its multiply-adds (Zen 4's 512-bit units split both in two halves alike;
// not measured). Off on Intel CPUs: on Sapphire and Emerald Rapids vdpbf16ps issues at half the FMA
// rate, and the converting path was 1.6-1.9x faster (docs/benchmarks.md, "Mixed precision on the CPU").
bool bf16_dot_default_on();
// Switches the kernel on or off for the process (tests compare the paths, cf-bench times them);
// reset_bf16_dot_enabled() returns to bf16_dot_default_on(). Where the CPU has AMX, the AMX kernel
// (bf16_amx.h) comes before this one and both other paths.
void set_bf16_dot_enabled(bool on);
void reset_bf16_dot_enabled();
// c (M x N, row stride ldc) = a (M x K, element strides a_rs, a_cs) @ b (K x N, strides b_rs,
// b_cs): products and sums in float32 (vdpbf16ps), one rounding to bfloat16 per output.
// vdpbf16ps treats subnormal inputs (|x| < 2^-126) as zero and flushes subnormal results, so
// products of such values are 0 here where the converting path keeps them (1e-39 * 1: 0 against
// 1e-39): the one known difference between the two paths (AMX flushes alike).
void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K);
// The same product kept in float32: c = alpha (a @ b) (+ c when accumulate), as bf16_amx_gemm_f32 (the
// bfloat16 arm of the CPU attention kernels uses either).
void bf16_dot_gemm_f32(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs,
                       int64_t b_cs, float* c, int64_t ldc, int64_t M, int64_t N, int64_t K, float alpha,
                       bool accumulate);

}  // namespace cf::kernels
