#pragma once
// Planted clusters for the K-Means tests (tests/nn/test_kmeans.cpp on the CPU,
// tests/cuda/test_cuda_kmeans.cpp against CUDA).
#include <vector>

#include "cf.h"

namespace cf::test {

struct Planted {
  Tensor x;       // (n, d)
  Tensor labels;  // (n,) int64, the true cluster of each row
};

// n points around k centres drawn in [-scale, scale]^d with Gaussian noise `noise`;
// points are interleaved (row i belongs to cluster i % k) so no order gives a hint.
inline Planted planted(int64_t n, int64_t d, int64_t k, double scale, double noise, uint64_t seed,
                       DType dtype = kFloat64) {
  Generator g(seed);
  std::vector<double> centres = rand({k, d}, kFloat64, g, -scale, scale).to_vector<double>();
  std::vector<double> eps = randn({n, d}, kFloat64, g, 0.0, noise).to_vector<double>();
  std::vector<double> x(static_cast<size_t>(n * d));
  std::vector<int64_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    lab[size_t(i)] = i % k;
    for (int64_t t = 0; t < d; ++t)
      x[size_t(i * d + t)] = centres[size_t((i % k) * d + t)] + eps[size_t(i * d + t)];
  }
  Tensor xt = Tensor::from_vector(x, {n, d});
  return {dtype == kFloat64 ? xt : to(xt, dtype), Tensor::from_vector(lab, {n})};
}

}  // namespace cf::test
