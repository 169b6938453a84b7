#pragma once
// Sorting kernels along one axis: full sort and top-k share one entry point.
//
// Order: keys compare by value, then by original position (lower first), so equal
// keys keep their order (stable) in both directions. NaN sorts as the largest value,
// as in NumPy: last when ascending, first when descending (and thus first in topk
// largest); NaNs tie with one another.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// The first k elements (k <= x.shape()[axis]) of each line of x along `axis` in that
// order: values (optional: undefined skips them) and indices (int64) are preallocated
// with x's shape but length k on `axis`. Numeric dtypes; values has x's dtype.
void sort_cpu(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
              const Tensor& indices);
#ifdef CF_WITH_CUDA
void sort_cuda(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
               const Tensor& indices);
#endif

// `op` names the caller ("sort", "argsort", "topk") in the no-CUDA error.
inline void sort(const char* op, const Tensor& x, int64_t axis, int64_t k, bool descending,
                 const Tensor& values, const Tensor& indices) {
  (void)op;  // (unused in a CUDA build: public headers stay clean under -Wextra)
  CF_DEVICE_DISPATCH(op, x.device(), sort_cpu(x, axis, k, descending, values, indices),
                     sort_cuda(x, axis, k, descending, values, indices));
}

}  // namespace cf::kernels
