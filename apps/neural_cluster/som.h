#pragma once
// A plain Kohonen self-organising map (Kohonen 1982) on a 2-D grid, written with
// cf tensor ops so it runs on the device of its data. The baseline "SOM" of the
// ClusterFormer paper's appendix A (Table 6), which gives no details of its SOM.
//
// Grid: k units on the most square rows x cols = k grid (rows the largest divisor
// of k not above sqrt(k); a prime k gives a 1 x k line). Units start as k
// distinct random training points. Each step takes a minibatch of B points:
//   bmu_j   = argmin_u |x_j - w_u|^2          (|w_u|^2 - 2 x_j.w_u: one matmul)
//   h_ju    = exp(-|g_u - g_{bmu_j}|^2 / (2 sigma_t^2))   (g: grid coordinates)
//   w_u    += lr_t * sum_j h_ju (x_j - w_u) / max(sum_j h_ju, 1)
// i.e. the online Kohonen rule for a unit that the batch touches lightly (sum
// h <= 1), and a step of lr_t toward the neighbourhood-weighted batch mean for
// one it touches heavily (so the step never overshoots). lr_t and sigma_t decay
// exponentially from (lr, sigma) to (lr_end, sigma_end) over all steps. A point's
// cluster is its best-matching unit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cf.h"

namespace cf::apps {

struct SomOptions {
  int64_t k = 10;
  int64_t epochs = 10;
  int64_t batch = 128;
  double lr = 0.5, lr_end = 0.05;
  double sigma = 0.0;  // 0: half the longer side of the grid (at least 1)
  double sigma_end = 0.2;
  uint64_t seed = 0;
  std::string desc = "som";  // progress bar prefix
};

struct Som {
  Tensor weights;  // (k, d) on the data's device
  int64_t rows = 0, cols = 0;
  double sigma = 0;  // the initial radius used
  int64_t steps = 0;
};

// The cluster (best-matching unit) of each row of x (N, d): (N,) int64, in blocks
// of 4096 rows to bound the (rows, k) distance buffer.
inline Tensor som_assign(const Tensor& x, const Tensor& weights) {
  NoGradGuard ng;
  const int64_t n = x.shape()[0], k = weights.shape()[0];
  Tensor wn = reshape(sum(weights * weights, {1}), {1, k});
  Tensor wt = transpose(weights, 0, 1);
  std::vector<Tensor> parts;
  for (int64_t s = 0; s < n; s += 4096) {
    Tensor xb = narrow(x, 0, s, std::min<int64_t>(4096, n - s));
    parts.push_back(argmin(wn - 2.0 * matmul(xb, wt), 1));
  }
  return parts.size() == 1 ? parts[0] : cat(parts, 0);
}

inline Som train_som(const Tensor& x, const SomOptions& o) {
  NoGradGuard ng;
  const int64_t n = x.shape()[0], k = o.k;
  const Device dev = x.device();
  Som som;
  som.rows = 1;
  for (int64_t r = 1; r * r <= k; ++r)
    if (k % r == 0) som.rows = r;
  som.cols = k / som.rows;
  som.sigma = o.sigma > 0 ? o.sigma : std::max(1.0, double(std::max(som.rows, som.cols)) / 2.0);
  const double sigma_end = std::min(o.sigma_end, som.sigma);

  // Squared grid distances between units (k, k).
  std::vector<float> g2(size_t(k * k));
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const double dr = double(a / som.cols - b / som.cols), dc = double(a % som.cols - b % som.cols);
      g2[size_t(a * k + b)] = float(dr * dr + dc * dc);
    }
  Tensor grid2 = Tensor::from_vector(g2, {k, k}, dev);

  // Initial units: k distinct random points (partial Fisher-Yates).
  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = i;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + int64_t(rng() % uint64_t(n - i));
    std::swap(perm[size_t(i)], perm[size_t(j)]);
  }
  Tensor w = contiguous(index_select(x, 0, Tensor::from_vector(std::vector<int64_t>(perm.begin(), perm.begin() + k),
                                                               {k}, dev)));

  const int64_t per_epoch = (n + o.batch - 1) / o.batch;
  som.steps = o.epochs * per_epoch;
  nn::ProgressBarOptions po;
  po.total = som.steps;
  po.desc = o.desc;
  po.unit = "batch";
  nn::ProgressBar bar(po);
  int64_t t = 0;
  for (int64_t e = 0; e < o.epochs; ++e) {
    for (int64_t i = n - 1; i > 0; --i) {  // a fresh order each epoch
      const int64_t j = int64_t(rng() % uint64_t(i + 1));
      std::swap(perm[size_t(i)], perm[size_t(j)]);
    }
    for (int64_t s = 0; s < n; s += o.batch, ++t) {
      const double frac = som.steps > 1 ? double(t) / double(som.steps - 1) : 1.0;
      const double lr = o.lr * std::pow(o.lr_end / o.lr, frac);
      const double sigma = som.sigma * std::pow(sigma_end / som.sigma, frac);
      const int64_t b = std::min(o.batch, n - s);
      Tensor idx = Tensor::from_vector(std::vector<int64_t>(perm.begin() + s, perm.begin() + s + b), {b}, dev);
      Tensor xb = index_select(x, 0, idx);                                        // (b, d)
      Tensor wn = reshape(sum(w * w, {1}), {1, k});
      Tensor bmu = argmin(wn - 2.0 * matmul(xb, transpose(w, 0, 1)), 1);         // (b,)
      Tensor h = exp(index_select(grid2, 0, bmu) * (-1.0 / (2.0 * sigma * sigma)));  // (b, k)
      Tensor hs = reshape(sum(h, {0}), {k, 1});                                   // (k, 1)
      Tensor num = matmul(transpose(h, 0, 1), xb);                                // (k, d)
      w = contiguous(w + (num - hs * w) * lr / clamp(hs, 1.0, INFINITY));
      bar.update();
    }
  }
  bar.finish();
  som.weights = w;
  return som;
}

}  // namespace cf::apps
