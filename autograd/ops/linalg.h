#pragma once
#include "core/tensor.h"

namespace cf {

// NumPy matmul: 1-d operands are promoted (and the added axis removed after),
// leading batch axes broadcast. float32/float64; BLAS gemm underneath.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace cf
