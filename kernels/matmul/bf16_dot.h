#pragma once
// bfloat16 GEMM with AVX-512 BF16 dot products (bf16_dot_cpu.cpp says how).
#include <cstdint>

#include "core/half.h"
#include "core/error.h"

namespace cf::kernels {

// True when this CPU has avx512bf16 (the kernel can run).
bool bf16_dot_supported();
// True when it is supported and switched on: matmul then uses it for bfloat16.
bool bf16_dot_available();
// Switches the kernel on or off. Off by default: on the CPUs measured (a Sapphire Rapids
// Xeon with OpenBLAS's SkylakeX sgemm; docs/benchmarks.md) the converting path (float32
// blocks + sgemm) was faster at every size, 1.6-1.9x at 1024-2048, since vdpbf16ps issues
// once per cycle there where float32 FMAs issue twice. Tests compare the two, cf-bench times both.
// Where the CPU has AMX, the AMX kernel (bf16_amx.h) comes before this one and both other paths.
void set_bf16_dot_enabled(bool on);
// c (M x N, row stride ldc) = a (M x K, element strides a_rs, a_cs) @ b (K x N, strides b_rs,
// b_cs): products and sums in float32 (vdpbf16ps), one rounding to bfloat16 per output.
// vdpbf16ps treats subnormal inputs (|x| < 2^-126) as zero and flushes subnormal results, so
// products of such values are 0 here where the converting path keeps them (1e-39 * 1: 0 against
// 1e-39): the one known difference between the two paths, and a reason it stays opt-in.
void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K);

}  // namespace cf::kernels
