#pragma once
// bfloat16 GEMM with AVX-512 BF16 dot products (bf16_dot_cpu.cpp says how).
#include <cstdint>

#include "core/half.h"
#include "core/error.h"

namespace cf::kernels {

// True when this CPU has avx512bf16 and the kernel is not switched off.
bool bf16_dot_available();
// Switches the kernel off (matmul then takes the converting float32 + sgemm path): tests
// compare the two, benchmarks time both.
void set_bf16_dot_enabled(bool on);
// c (M x N, row stride ldc) = a (M x K, element strides a_rs, a_cs) @ b (K x N, strides b_rs,
// b_cs): products and sums in float32 (vdpbf16ps), one rounding to bfloat16 per output.
void bf16_dot_gemm(const BFloat16* a, int64_t a_rs, int64_t a_cs, const BFloat16* b, int64_t b_rs, int64_t b_cs,
                   BFloat16* c, int64_t ldc, int64_t M, int64_t N, int64_t K);

}  // namespace cf::kernels
