#pragma once
// Reductions along axes. `axes` empty means all axes. keepdim keeps reduced axes
// with size 1. Results of float inputs accumulate in double.
#include <vector>

#include "core/tensor.h"

namespace cf {

using Axes = std::vector<int64_t>;

Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdim = false);
// Variance with `correction` subtracted from the count (1: unbiased).
Tensor var(const Tensor& x, const Axes& axes = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Axes& axes = {}, bool keepdim = false);
// Max/min over several axes; the gradient is shared equally between tied maxima.
Tensor amax(const Tensor& x, const Axes& axes = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

struct ValuesIndices {
  Tensor values;   // differentiable
  Tensor indices;  // int64, not differentiable
};
// Max/min along one axis with the (first) index; gradient flows to that index.
ValuesIndices max(const Tensor& x, int64_t axis, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t axis, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim = false);

// Sum g down to `shape` (the inverse of broadcasting g from shape).
Tensor sum_to(const Tensor& g, const Shape& shape);

namespace ops {
// argmax over the last axis of [x, -x] (2n entries for a last axis of n), the first on a tie, int64
// of x's shape less its last axis: LSH's hash h(x) = argmax([xR; -xR]) (Reformer, Figure 1) in one
// pass and one kernel. A row holding a NaN gives n + the position of its first NaN. Any float dtype
// (16-bit compared in float32), n >= 1; not differentiable (positions).
Tensor signed_argmax(const Tensor& x);
}  // namespace ops

}  // namespace cf
