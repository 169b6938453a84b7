#pragma once
// Reductions over a set of axes. `out` (and `indices`, when given) are contiguous
// with x's shape except size 1 on every reduced axis. Float inputs accumulate in
// double; indices count positions in row-major order over the reduced axes.
#include <vector>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

enum class ReduceOp { Sum, Mean, Max, Min, LogSumExp, Var };

void reduce_cpu(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                const Tensor& indices, int64_t correction);
#ifdef CF_WITH_CUDA
void reduce_cuda(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                 const Tensor& indices, int64_t correction);
#endif

inline void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                   const Tensor& indices = Tensor(), int64_t correction = 0) {
  CF_DEVICE_DISPATCH("reduce", x.device(), reduce_cpu(op, x, axes, out, indices, correction),
                     reduce_cuda(op, x, axes, out, indices, correction));
}

}  // namespace cf::kernels
