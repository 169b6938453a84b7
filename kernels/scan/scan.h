#pragma once
// Prefix sums along one axis. x and out are contiguous with the same shape, seen
// as (outer, n, inner) around the scanned axis of length n. out[o, i, j] is the sum
// of x[o, 0..i, j] (reverse: of x[o, i..n-1, j], the gradient of the forward scan).
// Float inputs accumulate in double (bfloat16 and float16 too), int64 in int64; each
// output is rounded to out's dtype once, from the running sum.
#include <cstdint>
#include <type_traits>

#include "core/half.h"  // CF_HD
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct ScanGeom {
  int64_t outer = 1, n = 1, inner = 1;
};

template <typename T>
using scan_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

void cumsum_cpu(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse);
#ifdef CF_WITH_CUDA
void cumsum_cuda(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse);
#endif

inline void cumsum(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse) {
  CF_DEVICE_DISPATCH("cumsum", x.device(), cumsum_cpu(x, out, g, reverse), cumsum_cuda(x, out, g, reverse));
}

}  // namespace cf::kernels
