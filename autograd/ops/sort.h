#pragma once
#include "autograd/ops/reduce.h"
#include "core/tensor.h"

namespace cf {

// Stable sort along axis (equal keys keep their order). values differentiable,
// indices int64.
ValuesIndices sort(const Tensor& x, int64_t axis = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false);
// The k largest (or smallest) along axis, in sorted order; ties keep index order.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t axis = -1, bool largest = true);

}  // namespace cf
