// Point-set ops (autograd/ops/point.h): farthest point sampling against a naive
// O(N^2 M) reference, group maxima against a direct scan, their errors, and CUDA
// parity (both exact: the same integers and values on both devices).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "autograd/ops/point.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

std::vector<double> vals(const Tensor& t) { return contiguous(t).to_vector<double>(); }

std::vector<std::vector<int64_t>> naive_fps(const Tensor& pts, int64_t m) {
  const int64_t b = pts.shape()[0], n = pts.shape()[1], c = pts.shape()[2];
  std::vector<double> p = vals(pts);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(b));
  for (int64_t bb = 0; bb < b; ++bb) {
    std::vector<int64_t>& sel = out[size_t(bb)];
    sel.push_back(0);
    while (int64_t(sel.size()) < m) {
      // For every candidate, its distance to the nearest selected point, from scratch.
      int64_t best = -1;
      double best_d = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (std::find(sel.begin(), sel.end(), i) != sel.end()) continue;
        double dmin = std::numeric_limits<double>::infinity();
        for (int64_t s : sel) {
          double d = 0;
          for (int64_t a = 0; a < c; ++a) {
            double t = p[size_t((bb * n + i) * c + a)] - p[size_t((bb * n + s) * c + a)];
            d += t * t;
          }
          dmin = std::min(dmin, d);
        }
        if (dmin > best_d) {
          best_d = dmin;
          best = i;
        }
      }
      sel.push_back(best);
    }
  }
  return out;
}

// out[r, e] = max over the e' of row r in e's group, 0 when that is not finite.
std::vector<double> naive_group_max(const std::vector<double>& s, const std::vector<int64_t>& g, int64_t rows,
                                    int64_t e) {
  std::vector<double> out(s.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < e; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < e; ++j)
        if (g[size_t(r * e + j)] == g[size_t(r * e + i)]) mx = std::max(mx, s[size_t(r * e + j)]);
      out[size_t(r * e + i)] = std::isfinite(mx) ? mx : 0.0;
    }
  return out;
}

// (2, 3, 12) scores with a masked (-inf) group in row 0 and repeated groups.
Tensor group_scores(DType dt) {
  std::vector<double> v;
  for (int64_t i = 0; i < 72; ++i) v.push_back(std::sin(double(i) * 1.7) * 3.0);
  for (int64_t i : {0, 5, 9}) v[size_t(i)] = -INFINITY;  // group 0 of row 0: all masked
  return to(Tensor::from_vector(v, {2, 3, 12}), dt);
}
Tensor group_ids() {
  std::vector<int64_t> g;
  for (int64_t i = 0; i < 72; ++i) g.push_back((i * 5 + i / 7) % 6);
  for (int64_t i : {0, 5, 9}) g[size_t(i)] = 6;  // only these three in group 6 of row 0
  for (int64_t r = 1; r < 6; ++r) std::replace(g.begin() + r * 12, g.begin() + (r + 1) * 12, int64_t(6), int64_t(0));
  return Tensor::from_vector(g, {2, 3, 12});
}

}  // namespace

TEST_SUITE("ops/point") {

TEST_CASE("farthest_point_sampling matches a naive O(N^2 M) reference, padding taken last") {
  Tensor pts = leaf64({3, 40, 3}, 21).detach();
  for (int64_t m : {1, 5, 17, 40}) {
    Tensor idx = farthest_point_sampling(pts, m);
    std::vector<std::vector<int64_t>> ref = naive_fps(pts, m);
    std::vector<int64_t> got = idx.to_vector<int64_t>();
    for (int64_t b = 0; b < 3; ++b)
      CHECK(std::vector<int64_t>(got.begin() + b * m, got.begin() + (b + 1) * m) == ref[size_t(b)]);
  }
  // With padding: padded points are taken only after every real point.
  Tensor mask = Tensor::from_vector(std::vector<bool>{true, false, false, true, false}, {1, 5});
  Tensor p5 = leaf64({1, 5, 2}, 3).detach();
  std::vector<int64_t> sel = farthest_point_sampling(p5, 5, mask).to_vector<int64_t>();
  CHECK(sel[0] == 1);
  CHECK(std::set<int64_t>(sel.begin(), sel.begin() + 3) == std::set<int64_t>{1, 2, 4});
  CHECK(std::set<int64_t>(sel.begin() + 3, sel.end()) == std::set<int64_t>{0, 3});
}

TEST_CASE("group_max: each entry gets its group's maximum in its row, 0 for an all-masked group") {
  for (DType dt : {kFloat64, kFloat32}) {
    const Tensor s = group_scores(dt), g = group_ids();
    const Tensor got = group_max(s, g, 7);
    CHECK(got.dtype() == dt);
    CHECK(got.shape() == s.shape());
    const std::vector<double> want = naive_group_max(vals(to(s, kFloat64)), g.to_vector<int64_t>(), 6, 12);
    CHECK(vals(to(got, kFloat64)) == want);
    CHECK(vals(to(got, kFloat64))[0] == 0.0);  // the masked group
    // more groups than entries (ids spread up to 2^62): the same maxima, without a table of every group
    std::vector<int64_t> ids = g.to_vector<int64_t>();
    for (int64_t& id : ids) id <<= 59;
    const Tensor spread = Tensor::from_vector(ids, g.shape());
    CHECK(vals(to(group_max(s, spread, int64_t(1) << 62), kFloat64)) == want);
    CHECK(vals(to(group_max(s, g, 13), kFloat64)) == want);  // the table (groups <= 4 entries)
    CHECK(vals(to(group_max(s, g, 49), kFloat64)) == want);  // sorted (groups > 4 entries)
  }
}

TEST_CASE("group_max on 16-bit scores gives the float32 result's values, exactly (cf-pointcloud --precision bf16)") {
  for (DType dt : {kBFloat16, kFloat16}) {
    const Tensor s = to(group_scores(kFloat32), dt), g = group_ids();
    const Tensor got = group_max(s, g, 7);
    CHECK(got.dtype() == dt);
    CHECK(vals(to(got, kFloat64)) == vals(to(group_max(to(s, kFloat32), g, 7), kFloat64)));
  }
}

TEST_CASE("farthest_point_sampling and group_max refuse bad input with messages naming the problem") {
  CHECK_THROWS_MSG(farthest_point_sampling(randn({1, 4, 3}), 5), ValueError,
                   "[farthest_point_sampling] m must be in [1, N] = [1, 4], got 5");
  CHECK_THROWS_MSG(farthest_point_sampling(randn({4, 3}), 2), ShapeError,
                   "[farthest_point_sampling] points must be a float (B, N, C) tensor, got float32 (4,3)");
  CHECK_THROWS_MSG(farthest_point_sampling(randn({1, 4, 3}), 2, Tensor::zeros({1, 4}, kInt64)), DTypeError,
                   "[farthest_point_sampling] mask must be bool");
  CHECK_THROWS_MSG(farthest_point_sampling(randn({1, 4, 3}), 2, Tensor::zeros({1, 3}, kBool)), ShapeError,
                   "[farthest_point_sampling] mask must be (B, N) = (1, 4)");
  CHECK_THROWS_MSG(group_max(randn({2, 3}), ti64({0, 1, 2, 0, 1, 3}, {2, 3}), 3), IndexError,
                   "[group_max] group value 3 at flat position 5", "out of range for 3 groups");
  CHECK_THROWS_MSG(group_max(randn({2, 3}), ti64({0, 1}, {2}), 3), ShapeError, "[group_max] group must be int64");
  CHECK_THROWS_MSG(group_max(Tensor::zeros({2}, kInt64), ti64({0, 1}, {2}), 3), DTypeError,
                   "[group_max] src must be a float tensor");
  CHECK_THROWS_MSG(group_max(randn({2}), fake_cuda({2}, kInt64), 3), DeviceError, "[group_max]", "cuda:0");
}

PARITY_CASE(farthest_point_sampling) {
  // Ties (a grid: many equal distances) and padding, float32 points read in float64.
  std::vector<float> grid;
  for (int64_t i = 0; i < 2 * 49; ++i) {
    grid.push_back(float((i % 49) % 7));
    grid.push_back(float((i % 49) / 7));
  }
  const Tensor pts = Tensor::from_vector(grid, {2, 49, 2});
  std::vector<bool> pad(size_t(2 * 49), false);
  for (int64_t i = 40; i < 49; ++i) pad[size_t(49 + i)] = true;
  const Tensor mask = Tensor::from_vector(pad, {2, 49});
  for (int64_t m : {1, 13, 49}) {
    INFO("m ", m);
    CHECK(farthest_point_sampling(cuda0(pts), m, cuda0(mask)).cpu().to_vector<int64_t>() ==
          farthest_point_sampling(pts, m, mask).to_vector<int64_t>());
  }
  const Tensor rnd = leaf64({3, 300, 3}, 7).detach();
  CHECK(farthest_point_sampling(cuda0(rnd), 64).cpu().to_vector<int64_t>() ==
        farthest_point_sampling(rnd, 64).to_vector<int64_t>());
}

PARITY_CASE(group_max) {
  for (DType dt : {kFloat64, kFloat32}) {
    const Tensor s = group_scores(dt), g = group_ids();
    CHECK(vals(to(group_max(cuda0(s), cuda0(g), 7).cpu(), kFloat64)) == vals(to(group_max(s, g, 7), kFloat64)));
    // more groups than entries: the sorted path (ids spread up to 2^62)
    std::vector<int64_t> ids = g.to_vector<int64_t>();
    for (int64_t& id : ids) id <<= 59;
    const Tensor spread = Tensor::from_vector(ids, g.shape());
    CHECK(vals(to(group_max(cuda0(s), cuda0(spread), int64_t(1) << 62).cpu(), kFloat64)) ==
          vals(to(group_max(s, g, 7), kFloat64)));
  }
}

}  // TEST_SUITE
