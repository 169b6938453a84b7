#pragma once
// The small point-cloud classifier of the centroid-model tests (CPU and CUDA):
// 4 classes, widths 16-32-32-64, 2 heads, K = 8, fuse 32, head 32-16, no dropout.
#include "models/centroid_transformer.h"

namespace cf::test {

inline models::PointCloudOptions tiny_point_options() {
  models::PointCloudOptions o;
  o.num_classes = 4;
  o.widths = {16, 32, 32, 64};
  o.n_heads = 2;
  o.knn = 8;
  o.fuse_dim = 32;
  o.head = {32, 16};
  o.dropout = 0.0;
  return o;
}

}  // namespace cf::test
