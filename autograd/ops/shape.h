#pragma once
// Shape ops. Views share storage with their input (reshape only when the
// strides allow it, otherwise it copies); all are differentiable.
#include <vector>

#include "core/tensor.h"

namespace cf {

// One entry may be -1 (inferred).
Tensor reshape(const Tensor& x, const Shape& shape);
// Like reshape but never copies: throws ShapeError when the strides forbid a view.
Tensor view(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_axis = 0, int64_t end_axis = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& axes);
Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1);
// Elements start, start+step, ... < end along axis (negative start/end count from the end;
// both are clamped to the axis length).
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
// length elements from start along axis (no clamping: out of range is an error).
Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length);
// Broadcast view to shape (-1 keeps a dimension).
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x);              // all size-1 axes
Tensor squeeze(const Tensor& x, int64_t axis);  // that axis, which must have size 1
Tensor unsqueeze(const Tensor& x, int64_t axis);

// ---- joining and splitting (copies) ----
Tensor cat(const std::vector<Tensor>& xs, int64_t axis);
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);
// Constant padding: pads = {before_last, after_last, before_second_last, ...} as in PyTorch F.pad.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
// Pieces of `size` along axis (the last may be shorter).
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t axis);
// Pieces with the given sizes (must add up to the axis length).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);

// ---- reordering and tiling (copies, as PyTorch's; composed of index_select, cat and expand) ----
// The elements in reverse order along each of axes (torch.flip); no axes: a copy of x.
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);
// The elements shifted by shifts[i] positions along axes[i], those pushed past the end coming
// back at the start (torch.roll; a negative shift moves toward the start). No axes: x is rolled
// as if flattened (one shift), keeping its shape.
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& axes = {});
// x tiled repeats[i] times along axis i (torch's Tensor.repeat, numpy.tile): repeats may have
// more entries than x has axes, x then gaining leading axes of size 1 first.
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);

}  // namespace cf
