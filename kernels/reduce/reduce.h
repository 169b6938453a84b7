#pragma once
// Reductions over a set of axes. `out` (and `indices`, when given) are contiguous
// with x's shape except size 1 on every reduced axis. Float inputs accumulate in
// double; indices count positions in row-major order over the reduced axes.
#include <vector>

#include "core/half.h"  // CF_HD: inline on the host, __host__ __device__ under nvcc
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

// LSH's hash (Reformer, Figure 1: h(x) = argmax([xR; -xR])) in one pass: for each row of n
// entries (x contiguous, float32 or float64, rows along the last axis), the position of the
// largest entry of the row followed by its negation, [x, -x] (2n entries), the first on a tie;
// a row holding a NaN gives n + the position of its first NaN (what max and min's NaN
// propagation gave the two-reduction form). out: contiguous int64, one entry per row.
void signed_argmax_cpu(const Tensor& x, const Tensor& out);
// One row of it, the CPU's and the CUDA kernel's. (Measured on LSH-8's rows of 32 at N = 4096, one
// thread: this plain loop beat a branch-free single chain and four interleaved chains; the rows
// are too short for the latter's combine step to pay.)
template <typename T>
CF_HD int64_t signed_argmax_row(const T* p, int64_t n) {
  int64_t hi = 0, lo = 0;
  T vh = p[0], vl = p[0];
  for (int64_t i = 0; i < n; ++i) {
    const T v = p[i];
    if (v != v) return n + i;
    if (v > vh) vh = v, hi = i;  // strict: the first maximum (of x) and minimum (the maximum of -x) win
    if (v < vl) vl = v, lo = i;
  }
  return vh >= -vl ? hi : n + lo;  // a tie goes to x's half, the earlier one
}
#ifdef CF_WITH_CUDA
void signed_argmax_cuda(const Tensor& x, const Tensor& out);
#endif
inline void signed_argmax(const Tensor& x, const Tensor& out) {
  CF_DEVICE_DISPATCH("signed_argmax", x.device(), signed_argmax_cpu(x, out), signed_argmax_cuda(x, out));
}

}  // namespace cf::kernels
