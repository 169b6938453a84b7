#pragma once
// Scans along one axis.
#include <cstdint>

#include "core/tensor.h"

namespace cf {

// Running sums along axis (negative counts from the end), as torch.cumsum: out has x's shape,
// out[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...]. int64 and bool inputs give int64
// (a running count), float inputs keep their dtype; float sums accumulate in double. A 0-d x
// is its own cumsum (axis 0 or -1). Differentiable in float x: the gradient is the reverse
// running sum of the output's gradient.
Tensor cumsum(const Tensor& x, int64_t axis);

}  // namespace cf
