#pragma once
// Point-set ops of centroid attention (Wu et al. 2021): farthest point sampling
// (the centroid initialisation of section 3.4) and per-group maxima (the shift of
// eq. 4's softmax over centroids under a KNN mask). Neither is differentiable.
// Kernels: kernels/point.
#include "core/tensor.h"

namespace cf {

// Farthest point sampling (as in PointNet++): start at the first point that is
// not padding, then repeatedly take the point farthest (squared L2, in float64)
// from those taken; ties go to the lowest index. points (B, N, C) float; mask
// bool (B, N), true = padding, never taken while a real point is left.
// -> int64 (B, M). O(N M C) per batch row.
Tensor farthest_point_sampling(const Tensor& points, int64_t m, const Tensor& mask = Tensor());

// src (..., E) float, group int64 (..., E) with values in [0, groups): each entry
// gets the largest src among the entries of its row (all leading indices fixed)
// in the same group; 0 where that largest value is not finite (a group of masked
// entries: any finite shift will do). Same shape and dtype as src.
Tensor group_max(const Tensor& src, const Tensor& group, int64_t groups);

}  // namespace cf
