#pragma once
// One entry of the softmax backward shared by every attention kernel, CPU and CUDA, fused and GEMM paths:
// dS = P (dP - D), D = dO . O - dlse (FlashAttention-2's backward). It is 0 wherever P is 0, even when
// D is infinite: a row with nothing allowed has lse = -inf, and a loss that reads that lse (exp(-lse),
// say) gives dlse = -inf there, so D = +inf and P (dP - D) would be 0 * inf = NaN, which the key
// gradients then spread over the whole (batch, head). P = 0 is also the limit of P (dP - D) as P -> 0.
#include "core/half.h"  // CF_HD: inline on the host, __host__ __device__ under nvcc

namespace cf::kernels {

template <typename T>
CF_HD T softmax_grad(T p, T dp, T D) {
  return p == T(0) ? T(0) : p * (dp - D);
}

}  // namespace cf::kernels
