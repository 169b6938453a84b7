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
// Where values would be inserted into sorted rows to keep them sorted (torch.searchsorted): int64
// of values' shape, the count of a row's elements that sort before each value (right: before or
// equal to it). sorted is 1-d (one row for every value) or (..., m) with values (..., k) sharing its
// leading dims; numeric dtypes on one device. Two dtypes are compared in a common one, as NumPy
// compares: two floats in the wider, an integer and a float in float64 (exact for both up to 2^53;
// int64 would truncate 2.5 to 2). NaN sorts as the largest value (sort's order). Never
// differentiable. Rows that are not sorted give some position in [0, m].
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right = false);

}  // namespace cf
