#pragma once
#include "core/tensor.h"

namespace cf {

// NumPy matmul: 1-d operands are promoted (and the added axis removed after),
// leading batch axes broadcast. float32/float64; BLAS gemm underneath.
Tensor matmul(const Tensor& a, const Tensor& b);

// A linear layer's product: x W^T + b (torch.nn.functional.linear). x (..., in), weight (out, in), bias
// (out) or undefined, one float dtype and device. The weight's gradient is computed in its own layout
// (g^T x, contiguous): as matmul(x, transpose(W)) its gradient was a transposed view that every backward
// copied into .grad, one kernel call per layer and step. Under autocast the operands are cast to the low
// dtype, as matmul's are.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace cf
