#pragma once
// Point-set kernels of centroid attention (Wu et al. 2021): farthest point
// sampling and the per-group maxima that shift eq. 4's softmax over the
// centroids under a KNN mask. autograd/ops/point.h owns validation. CPU arm
// point_cpu.cpp, CUDA arm point_cuda.cu. Every tensor contiguous and on one
// device; outputs preallocated.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// points (B, N, C) float64, pad (B, N) bool or undefined (true = padding) ->
// out (B, M) int64: start at the first real point, then repeatedly the point
// farthest (squared L2, summed over C in order) from those taken; ties go to the
// lowest index; padding only once every real point is taken (then the first one).
void farthest_point_sampling_cpu(const Tensor& points, const Tensor& pad, const Tensor& out);

// src (R, E) float, group (R, E) int64 in [0, G): out[r, e] = the max of src[r, e']
// over the e' of row r with group[r, e'] == group[r, e]; 0 where that max is not
// finite (a group of masked entries). Exact on both devices (max does not round).
// Keeps a (R, G) table of maxima: the op calls it for G <= 4 E (or no rows) only.
void group_max_cpu(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out);

// The same result from each row's group ids sorted (G > 4 E: ids may be sparse up to 2^62, and a
// table of every group would take memory and time in G, not in E): keys (R, E) int64, each row's
// ids ascending; perm (R, E) int64, the entry of src each key came from (a stable argsort: on the
// CPU the maxima are then taken in the table path's order, to the sign of zero).
void group_max_sorted_cpu(const Tensor& src, const Tensor& keys, const Tensor& perm, const Tensor& out);

#ifdef CF_WITH_CUDA
void farthest_point_sampling_cuda(const Tensor& points, const Tensor& pad, const Tensor& out);
void group_max_cuda(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out);
void group_max_sorted_cuda(const Tensor& src, const Tensor& keys, const Tensor& perm, const Tensor& out);
#endif

inline void farthest_point_sampling(const Tensor& points, const Tensor& pad, const Tensor& out) {
  CF_DEVICE_DISPATCH("farthest_point_sampling", points.device(), farthest_point_sampling_cpu(points, pad, out),
                     farthest_point_sampling_cuda(points, pad, out));
}
inline void group_max(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out) {
  CF_DEVICE_DISPATCH("group_max", src.device(), group_max_cpu(src, group, groups, out),
                     group_max_cuda(src, group, groups, out));
}
inline void group_max_sorted(const Tensor& src, const Tensor& keys, const Tensor& perm, const Tensor& out) {
  CF_DEVICE_DISPATCH("group_max", src.device(), group_max_sorted_cpu(src, keys, perm, out),
                     group_max_sorted_cuda(src, keys, perm, out));
}

}  // namespace cf::kernels
