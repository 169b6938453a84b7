// K-Means engine (nn/clustering/kmeans.h): planted-cluster recovery, monotone
// inertia, determinism across runs, thread counts and block sizes, the cosine
// metric, empty-cluster re-seeding, the adjusted Rand index and every bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "nn/clustering/kmeans.h"
#include "nn/kmeans_test_util.h"
#include "test_util.h"

using namespace cf;
using namespace cf::nn;
using cf::test::Planted;
using cf::test::planted;

namespace {

// Objective recomputed from scratch in double: L2 squared distance or 1 - cosine.
double direct_inertia(const Tensor& x, const Tensor& c, const Tensor& a, KMeansMetric m) {
  std::vector<double> X = cf::test::values(x), C = cf::test::values(c);
  std::vector<int64_t> A = a.to_vector<int64_t>();
  const int64_t n = x.size(0), d = x.size(1);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* xi = &X[size_t(i * d)];
    const double* cj = &C[size_t(A[size_t(i)] * d)];
    if (m == KMeansMetric::l2) {
      for (int64_t t = 0; t < d; ++t) total += (xi[t] - cj[t]) * (xi[t] - cj[t]);
    } else {
      double xn = 0, cn = 0, dot = 0;
      for (int64_t t = 0; t < d; ++t) {
        xn += xi[t] * xi[t];
        cn += cj[t] * cj[t];
        dot += xi[t] * cj[t];
      }
      total += 1 - dot / std::sqrt(xn * cn);
    }
  }
  return total;
}

// Brute-force nearest centroid (lowest index on ties), in double.
std::vector<int64_t> brute_assign(const Tensor& x, const Tensor& c) {
  std::vector<double> X = cf::test::values(x), C = cf::test::values(c);
  const int64_t n = x.size(0), d = x.size(1), k = c.size(0);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t t = 0; t < d; ++t) s += (X[size_t(i * d + t)] - C[size_t(j * d + t)]) * (X[size_t(i * d + t)] - C[size_t(j * d + t)]);
      if (s < best) {
        best = s;
        out[size_t(i)] = j;
      }
    }
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::set<int64_t> distinct(const Tensor& labels) {
  std::vector<int64_t> v = labels.to_vector<int64_t>();
  return std::set<int64_t>(v.begin(), v.end());
}

}  // namespace

TEST_SUITE("kmeans") {

TEST_CASE("KMeans: k-means++ recovers well-separated planted clusters exactly (ARI 1)") {
  for (DType dt : {kFloat32, kFloat64}) {
    for (uint64_t seed : {0u, 1u, 2u, 3u, 4u}) {
      Planted p = planted(600, 8, 6, 10.0, 0.2, 100 + seed, dt);
      KMeansOptions o;
      o.k = 6;
      o.seed = seed;
      KMeansResult r = kmeans(p.x, o);
      INFO("dtype ", dt, " seed ", seed);
      CHECK(adjusted_rand_index(r.assignments, p.labels) == doctest::Approx(1.0).epsilon(1e-12));
      CHECK(r.converged);
      CHECK(r.centroids.dtype() == dt);
      CHECK(r.centroids.shape() == Shape{6, 8});
      CHECK(r.assignments.shape() == Shape{600});
      CHECK(r.assignments.dtype() == kInt64);
      CHECK(r.reseeded_clusters == 0);
      // Inertia is the objective of the returned centroids and assignments, and the
      // assignments are each point's nearest centroid.
      CHECK(r.inertia == doctest::Approx(direct_inertia(p.x, r.centroids, r.assignments, o.metric)).epsilon(1e-6));
      CHECK(r.inertia == r.inertia_history.back());
      CHECK(r.assignments.to_vector<int64_t>() == brute_assign(p.x, r.centroids));
      // Noise 0.2 in 8 dimensions: about 0.04 * 8 per point.
      CHECK(r.inertia / 600 < 0.5);
    }
  }
}

TEST_CASE("KMeans: data far from the origin cluster as well as centred data (Lloyd and kmeans_assign)") {
  // |x|^2 - 2 x.c + |c|^2 cancelled: blobs around 1e4 (float32) or 1.7e9 (float64, timestamps)
  // were clustered at random (ARI 0.24 / 0), with a rising inertia reported as converged, and
  // k = n points near 1e4 failed with "[kmeans] internal error".
  for (auto [dt, offset] : {std::pair<DType, double>{kFloat32, 1e5}, {kFloat64, 1.7e9}}) {
    INFO("dtype ", dt, " offset ", offset);
    Planted p = planted(600, 3, 3, 10.0, 0.5, 7, dt);
    Tensor far = contiguous(p.x + offset);
    for (KMeansAlgorithm alg : {KMeansAlgorithm::lloyd, KMeansAlgorithm::elkan}) {
      KMeansOptions o;
      o.k = 3;
      o.seed = 0;
      o.algorithm = alg;
      KMeansResult r = kmeans(far, o);
      CHECK(adjusted_rand_index(r.assignments, p.labels) == doctest::Approx(1.0).epsilon(1e-12));
      for (size_t i = 1; i < r.inertia_history.size(); ++i)
        CHECK(r.inertia_history[i] <= r.inertia_history[i - 1] * (1 + 1e-6));
      CHECK(r.assignments.to_vector<int64_t>() == brute_assign(far, r.centroids));
      CHECK(kmeans_assign(far, r.centroids).to_vector<int64_t>() == brute_assign(far, r.centroids));
      // Centroids in the caller's units: the blob means.
      std::vector<double> c = cf::test::values(r.centroids);
      CHECK(std::fabs(c[0] - offset) < 20);
    }
  }
  // One far point does not switch the translation off (the spread is an RMS, not a maximum).
  {
    Planted p = planted(300, 2, 3, 10.0, 0.5, 9, kFloat32);
    Tensor far = cat({contiguous(p.x + 1e5), Tensor::full({1, 2}, 3e5, kFloat32)}, 0);
    KMeansOptions o;
    o.k = 4;
    o.seed = 0;
    KMeansResult r = kmeans(far, o);
    CHECK(adjusted_rand_index(narrow(r.assignments, 0, 0, 300), p.labels) == doctest::Approx(1.0).epsilon(1e-12));
    for (size_t i = 1; i < r.inertia_history.size(); ++i)
      CHECK(r.inertia_history[i] <= r.inertia_history[i - 1] * (1 + 1e-6));
    // kmeans_init returns rows of x exactly, translation or not.
    for (KMeansInit init : {KMeansInit::random, KMeansInit::kmeans_plus_plus}) {
      o.init = init;
      std::vector<double> c = cf::test::values(kmeans_init(far, o)), xv = cf::test::values(far);
      for (size_t j = 0; j < 4; ++j) {
        bool is_row = false;
        for (size_t i = 0; i < 301 && !is_row; ++i) is_row = c[2 * j] == xv[2 * i] && c[2 * j + 1] == xv[2 * i + 1];
        CHECK(is_row);
      }
    }
  }
  // float64 beyond 1e154: an exact 0 inertia stays 0 when scaled back (0 * inf was NaN).
  {
    KMeansOptions o;
    o.k = 2;
    KMeansResult r = kmeans(Tensor::from_vector(std::vector<double>{1e300, 1e300, -1e300}, {3, 1}), o);
    CHECK(r.inertia == 0.0);
    for (double v : r.inertia_history) CHECK(v == 0.0);
  }
  Tensor near = Tensor::from_vector(std::vector<float>{1e4f, 1e4f + 0.01f, 1e4f + 0.02f, 1e4f + 0.03f}, {4, 1});
  CHECK(kmeans_assign(near, near).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  KMeansOptions o;
  o.k = 4;
  KMeansResult r = kmeans(near, o);
  CHECK(r.inertia == 0.0);
  CHECK(distinct(r.assignments).size() == 4);
}

TEST_CASE("KMeans: inertia never increases between iterations (random init, overlapping clusters)") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (uint64_t seed : {7u, 8u, 9u}) {
      // Overlapping blobs: many Lloyd iterations before the assignments settle.
      Planted p = planted(1500, 5, 12, 2.0, 1.0, seed, dt);
      KMeansOptions o;
      o.k = 12;
      o.seed = seed;
      o.init = KMeansInit::random;
      o.tol = 0;
      o.max_iter = 300;
      std::vector<double> seen;
      o.on_iteration = [&](int64_t it, double inertia) {
        CHECK(it == int64_t(seen.size()) + 1);
        seen.push_back(inertia);
      };
      KMeansResult r = kmeans(p.x, o);
      INFO("dtype ", dt, " seed ", seed);
      // The callback saw every iteration's inertia, in order.
      CHECK(seen == std::vector<double>(r.inertia_history.begin() + 1, r.inertia_history.end()));
      REQUIRE(r.inertia_history.size() >= 4);  // the test needs a real descent
      CHECK(r.iterations + 1 == int64_t(r.inertia_history.size()));
      const double rel = dt == kFloat64 ? 1e-12 : 1e-6;
      for (size_t t = 1; t < r.inertia_history.size(); ++t)
        CHECK_MESSAGE(r.inertia_history[t] <= r.inertia_history[t - 1] * (1 + rel), "step ", t,
                      ": ", r.inertia_history[t - 1], " -> ", r.inertia_history[t]);
      CHECK(r.inertia_history.back() < r.inertia_history.front());
      CHECK(r.converged);  // tol 0: stopped because the assignments no longer changed
      CHECK(r.inertia == doctest::Approx(direct_inertia(p.x, r.centroids, r.assignments, o.metric)).epsilon(1e-5));
    }
  }
}

TEST_CASE("KMeans: the same seed or the same init gives the same bits, for any thread count and block size") {
  Planted p = planted(4000, 16, 16, 2.0, 1.0, 21, kFloat32);
  KMeansOptions o;
  o.k = 16;
  o.seed = 5;
  o.max_iter = 20;
  KMeansResult a = kmeans(p.x, o);
  KMeansResult b = kmeans(p.x, o);
  CHECK(same_bits(a.centroids, b.centroids));
  CHECK(same_bits(a.assignments, b.assignments));
  CHECK(a.inertia_history == b.inertia_history);

  // A different seed starts elsewhere.
  KMeansOptions o2 = o;
  o2.seed = 6;
  CHECK_FALSE(same_bits(kmeans_init(p.x, o), kmeans_init(p.x, o2)));

  Tensor init = kmeans_init(p.x, o);
  KMeansResult from_init = kmeans(p.x, init, o);
  CHECK(same_bits(from_init.centroids, a.centroids));
  CHECK(same_bits(from_init.assignments, a.assignments));

  for (int t : {1, 2, 3}) {
    test::NumThreadsGuard count(t);
    KMeansResult r = kmeans(p.x, init, o);
    INFO("threads ", t);
    CHECK(same_bits(r.centroids, a.centroids));
    CHECK(same_bits(r.assignments, a.assignments));
    CHECK(r.inertia_history == a.inertia_history);
  }
  // The block size bounds memory only; the result is the same.
  for (int64_t rows : {1, 333, 4000}) {
    KMeansOptions ob = o;
    ob.block_rows = rows;
    KMeansResult r = kmeans(p.x, init, ob);
    INFO("block_rows ", rows);
    CHECK(same_bits(r.assignments, a.assignments));
    CHECK(r.inertia == doctest::Approx(a.inertia).epsilon(1e-6));
  }
}

TEST_CASE("KMeans: kmeans_init picks distinct data rows, k-means++ spread over the clusters") {
  Planted p = planted(500, 3, 5, 10.0, 0.1, 12);
  std::vector<double> X = cf::test::values(p.x);
  for (KMeansInit init : {KMeansInit::random, KMeansInit::kmeans_plus_plus}) {
    for (uint64_t seed : {0u, 1u, 2u, 3u}) {
      KMeansOptions o;
      o.k = 5;
      o.init = init;
      o.seed = seed;
      Tensor c = kmeans_init(p.x, o);
      REQUIRE(c.shape() == Shape{5, 3});
      std::vector<double> C = cf::test::values(c);
      // Each centre is one of the rows.
      std::set<int64_t> rows;
      for (int64_t j = 0; j < 5; ++j)
        for (int64_t i = 0; i < 500; ++i)
          if (std::equal(C.begin() + j * 3, C.begin() + j * 3 + 3, X.begin() + i * 3)) rows.insert(i);
      CHECK(rows.size() == 5);
      // k-means++ on well-separated blobs: one centre per blob.
      if (init == KMeansInit::kmeans_plus_plus) {
        std::set<int64_t> blobs;
        std::vector<int64_t> lab = p.labels.to_vector<int64_t>();
        for (int64_t i : rows) blobs.insert(lab[size_t(i)]);
        CHECK(blobs.size() == 5);
      }
    }
  }
}

TEST_CASE("KMeans: Elkan's accelerated variant gives Lloyd's result") {
  auto compare = [](const Tensor& x, const Tensor& init, KMeansOptions o, double tol) {
    o.algorithm = KMeansAlgorithm::lloyd;
    KMeansResult a = kmeans(x, init, o);
    o.algorithm = KMeansAlgorithm::elkan;
    KMeansResult b = kmeans(x, init, o);
    CHECK(b.assignments.to_vector<int64_t>() == a.assignments.to_vector<int64_t>());
    cf::test::check_close(b.centroids, cf::test::values(a.centroids), tol);
    CHECK(b.iterations == a.iterations);
    CHECK(b.converged == a.converged);
    CHECK(b.reseeded_clusters == a.reseeded_clusters);
    REQUIRE(b.inertia_history.size() == a.inertia_history.size());
    for (size_t t = 0; t < a.inertia_history.size(); ++t)
      CHECK(b.inertia_history[t] == doctest::Approx(a.inertia_history[t]).epsilon(tol));
    return a.iterations;
  };
  {
    // Overlapping blobs: many iterations in which the bounds must stay valid.
    Planted p = planted(1200, 6, 15, 2.0, 1.0, 61);
    KMeansOptions o;
    o.k = 15;
    o.tol = 0;
    o.init = KMeansInit::random;
    o.seed = 4;
    CHECK(compare(p.x, kmeans_init(p.x, o), o, 1e-9) >= 5);
    o.metric = KMeansMetric::cosine;
    CHECK(compare(p.x, kmeans_init(p.x, o), o, 1e-9) >= 3);
    o.metric = KMeansMetric::l2;
    o.max_iter = 3;  // stopped early, not converged
    compare(p.x, kmeans_init(p.x, o), o, 1e-9);
  }
  {
    // Re-seeding moves a centroid far: the bounds follow the move.
    std::vector<double> x = {0, 0, 0.1, 0, 0, 0.1, 5, 5, 5.1, 5, 5, 5.1, 0, 3};
    KMeansOptions o;
    o.k = 3;
    compare(Tensor::from_vector(x, {7, 2}),
            Tensor::from_vector(std::vector<double>{0, 0, 5, 5, 1000, -1000}, {3, 2}), o, 1e-12);
  }
  {
    Planted p = planted(1000, 8, 6, 10.0, 0.5, 62, kFloat32);
    KMeansOptions o;
    o.k = 6;
    compare(p.x, kmeans_init(p.x, o), o, 1e-5);
  }
  {
    // An exact tie after the first update (centroids 0, -1, -3, -2, 2: x = 1 is 1 from centroids 0 and 4)
    // goes to the lower index in both: Elkan's bounds skipped a centroid exactly as near and kept label 4
    // (Lloyd: inertia 0.8 in 2 iterations; Elkan stopped at 2.0).
    KMeansOptions o;
    o.k = 5;
    o.tol = 0;
    CHECK(compare(Tensor::from_vector(std::vector<double>{3, 1, -1, 0, 0, -3, -3, 0, 0, -2}, {10, 1}),
                  Tensor::from_vector(std::vector<double>{0, -1, -3, -2, 1}, {5, 1}), o, 1e-12) == 2);
  }
}

TEST_CASE("KMeans: float32 and float64 agree from the same init") {
  Planted p = planted(800, 6, 5, 3.0, 0.6, 33, kFloat64);
  KMeansOptions o;
  o.k = 5;
  o.seed = 2;
  Tensor init = kmeans_init(p.x, o);
  KMeansResult r64 = kmeans(p.x, init, o);
  KMeansResult r32 = kmeans(to(p.x, kFloat32), to(init, kFloat32), o);
  CHECK(r32.assignments.to_vector<int64_t>() == r64.assignments.to_vector<int64_t>());
  cf::test::check_close(r32.centroids, cf::test::values(r64.centroids), 1e-4);
  CHECK(r32.inertia == doctest::Approx(r64.inertia).epsilon(1e-5));
}

TEST_CASE("KMeans: cosine metric clusters directions whatever the norms") {
  // Points along 4 directions with norms spread over 0.2 .. 20: L2 mixes them by
  // length, cosine must recover the directions exactly.
  const int64_t n = 400, d = 6, k = 4;
  Generator g(77);
  std::vector<double> dirs = randn({k, d}, kFloat64, g).to_vector<double>();
  std::vector<double> eps = randn({n, d}, kFloat64, g, 0.0, 0.02).to_vector<double>();
  std::vector<double> len = rand({n}, kFloat64, g, std::log(0.2), std::log(20.0)).to_vector<double>();
  std::vector<double> x(static_cast<size_t>(n * d));
  std::vector<int64_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    lab[size_t(i)] = i % k;
    double nn = 0;
    for (int64_t t = 0; t < d; ++t) nn += dirs[size_t((i % k) * d + t)] * dirs[size_t((i % k) * d + t)];
    for (int64_t t = 0; t < d; ++t)
      x[size_t(i * d + t)] = std::exp(len[size_t(i)]) * (dirs[size_t((i % k) * d + t)] / std::sqrt(nn) + eps[size_t(i * d + t)]);
  }
  Tensor xt = Tensor::from_vector(x, {n, d}), truth = Tensor::from_vector(lab, {n});
  KMeansOptions o;
  o.k = k;
  o.metric = KMeansMetric::cosine;
  o.seed = 3;
  KMeansResult r = kmeans(xt, o);
  CHECK(adjusted_rand_index(r.assignments, truth) == doctest::Approx(1.0));
  // Unit-norm centroids and inertia = sum of 1 - cos.
  std::vector<double> c = r.centroids.to_vector<double>();
  for (int64_t j = 0; j < k; ++j) {
    double nn = 0;
    for (int64_t t = 0; t < d; ++t) nn += c[size_t(j * d + t)] * c[size_t(j * d + t)];
    CHECK(nn == doctest::Approx(1.0).epsilon(1e-12));
  }
  CHECK(r.inertia == doctest::Approx(direct_inertia(xt, r.centroids, r.assignments, o.metric)).epsilon(1e-9));
  CHECK(kmeans_assign(xt, r.centroids, KMeansMetric::cosine).to_vector<int64_t>() ==
        r.assignments.to_vector<int64_t>());
  // The same data under L2 does not separate the directions (the norms dominate).
  o.metric = KMeansMetric::l2;
  CHECK(adjusted_rand_index(kmeans(xt, o).assignments, truth) < 0.9);
}

TEST_CASE("KMeans: an empty cluster is re-seeded with the farthest point, never NaN") {
  // Two tight groups and one outlier; the third initial centroid is far from all of
  // them, so the first assignment leaves it empty. The re-seed must take the point
  // farthest from its centroid: the outlier.
  std::vector<double> x = {0, 0, 0.1, 0, 0, 0.1,     // group A
                           5, 5, 5.1, 5, 5, 5.1,     // group B
                           0, 3};                    // outlier, nearer A's centre than B's
  Tensor xt = Tensor::from_vector(x, {7, 2});
  Tensor init = Tensor::from_vector(std::vector<double>{0, 0, 5, 5, 1000, -1000}, {3, 2});
  KMeansOptions o;
  o.k = 3;
  KMeansResult r = kmeans(xt, init, o);
  CHECK(r.reseeded_clusters == 1);
  CHECK(r.assignments.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2});
  cf::test::check_close(r.centroids, {0.1 / 3, 0.1 / 3, 5 + 0.1 / 3, 5 + 0.1 / 3, 0, 3}, 1e-12);
  CHECK(r.converged);
  for (size_t t = 1; t < r.inertia_history.size(); ++t)
    CHECK(r.inertia_history[t] <= r.inertia_history[t - 1]);

  // Two identical initial centroids: the second loses every tie, is empty, and is
  // re-seeded; with several empty clusters at once each gets a different point.
  Planted p = planted(300, 4, 5, 10.0, 0.1, 5);
  std::vector<double> first = cf::test::values(p.x);
  std::vector<double> dup;
  for (int j = 0; j < 5; ++j) dup.insert(dup.end(), first.begin(), first.begin() + 4);  // row 0, 5 times
  KMeansResult q = kmeans(p.x, Tensor::from_vector(dup, {5, 4}), [] {
    KMeansOptions oo;
    oo.k = 5;
    return oo;
  }());
  CHECK(q.reseeded_clusters >= 4);
  CHECK(distinct(q.assignments).size() == 5);
  for (double v : cf::test::values(q.centroids)) CHECK(std::isfinite(v));
  CHECK(adjusted_rand_index(q.assignments, p.labels) == doctest::Approx(1.0));
}

TEST_CASE("KMeans: fewer distinct points than k is an error, not an empty cluster") {
  // 3 distinct rows, each repeated: no partition into 4 non-empty clusters of
  // distinct centroids exists.
  std::vector<double> x;
  for (int rep = 0; rep < 4; ++rep) x.insert(x.end(), {0, 0, 1, 1, 2, 2});
  Tensor xt = Tensor::from_vector(x, {12, 2});
  KMeansOptions o;
  o.k = 4;
  CHECK_THROWS_MSG(kmeans(xt, o), ValueError, "[kmeans]", "only 3 distinct points", "k = 4");
  // The typed error carries the bound a caller can retry with (the memory bank does).
  auto bound = [&]() -> int64_t {
    try {
      kmeans(xt, o);
    } catch (const KMeansTooFewPointsError& e) {
      return e.at_most();
    }
    return -1;
  };
  CHECK(bound() == 3);  // k-means++ finds the exact count
  o.init = KMeansInit::random;
  for (uint64_t seed : {0u, 1u, 2u}) {
    o.seed = seed;
    CHECK_THROWS_MSG(kmeans(xt, o), ValueError, "[kmeans]", "fewer distinct points", "k = 4");
    const int64_t b = bound();
    CHECK(b >= 3);
    CHECK(b < 4);
  }
  o.k = 3;  // exactly enough
  KMeansResult r = kmeans(xt, o);
  CHECK(distinct(r.assignments).size() == 3);
  CHECK(r.inertia == 0);
}

TEST_CASE("KMeans: max_iter and tol stop the loop") {
  Planted p = planted(1000, 4, 10, 2.0, 1.0, 44);
  KMeansOptions o;
  o.k = 10;
  o.init = KMeansInit::random;
  o.tol = 0;
  o.max_iter = 2;
  KMeansResult r = kmeans(p.x, o);
  CHECK(r.iterations == 2);
  CHECK_FALSE(r.converged);
  CHECK(r.inertia_history.size() == 3);
  // A loose tolerance stops as soon as one update gains less than half the inertia.
  o.max_iter = 100;
  o.tol = 0.5;
  KMeansResult loose = kmeans(p.x, o);
  CHECK(loose.converged);
  o.tol = 0;
  KMeansResult tight = kmeans(p.x, o);
  CHECK(tight.converged);
  CHECK(loose.iterations < tight.iterations);
  const auto& h = loose.inertia_history;
  CHECK(h[h.size() - 2] - h.back() < 0.5 * h[h.size() - 2]);
}

TEST_CASE("KMeans: kmeans_assign is the brute-force nearest centroid, lowest index on ties") {
  Generator g(9);
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor x = rand({500, 7}, dt, g, -1, 1), c = rand({37, 7}, dt, g, -1, 1);
    CHECK(kmeans_assign(x, c).to_vector<int64_t>() == brute_assign(x, c));
  }
  // Ties: centroids 1 and 2 equal, point equidistant from 0 and 3.
  Tensor c = Tensor::from_vector(std::vector<double>{-1, 0, 2, 0, 2, 0, 1, 0}, {4, 2});
  Tensor x = Tensor::from_vector(std::vector<double>{2, 0, 0, 0}, {2, 2});
  CHECK(kmeans_assign(x, c).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  // A non-contiguous x (a transposed view) reads the same values.
  Tensor xt = Tensor::from_vector(std::vector<double>{2, 0, 0, 0}, {2, 2});
  CHECK(kmeans_assign(transpose(xt, 0, 1), c).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  // Ties of grid data away from the origin (translated inside): x = 6.5 is 6.5 from 13 and 0. The exact mean
  // of the centroids as the translation rounded x - mean and broke such ties at random (643 in 80,000);
  // rounded to a power of two near the spread, the translation keeps them.
  CHECK(kmeans_assign(Tensor::from_vector(std::vector<double>{6.5}, {1, 1}),
                      Tensor::from_vector(std::vector<double>{16, 13, 0}, {3, 1}))
            .to_vector<int64_t>() == std::vector<int64_t>{1});
  Generator tg(5);
  for (int t = 0; t < 200; ++t) {
    const int64_t k = randint(2, 6, {1}, tg).item<int64_t>();
    Tensor ct = to(randint(0, 20, {k, 1}, tg), kFloat64);
    Tensor xg = reshape(Tensor::arange(40, kFloat64) * 0.5, {40, 1});
    CHECK(kmeans_assign(xg, ct).to_vector<int64_t>() == brute_assign(xg, ct));
  }
  // ... and kmeans's first assignment: x = 7 is 7 from both initial centroids 14 and 0
  KMeansOptions o;
  o.k = 2;
  o.max_iter = 1;
  KMeansResult r = kmeans(Tensor::from_vector(std::vector<double>{5, 7, 17, 14, 0, 6}, {6, 1}),
                          Tensor::from_vector(std::vector<double>{14, 0}, {2, 1}), o);
  cf::test::check_close(r.centroids, {38.0 / 3, 11.0 / 3}, 1e-12);
}

TEST_CASE("KMeans: inputs that require grad are read as constants") {
  Planted p = planted(60, 3, 3, 10.0, 0.1, 8);
  Tensor x = p.x.detach();
  x.set_requires_grad(true);
  KMeansOptions o;
  o.k = 3;
  KMeansResult r = kmeans(x, o);
  CHECK_FALSE(r.centroids.requires_grad());
  CHECK(adjusted_rand_index(r.assignments, p.labels) == doctest::Approx(1.0));
}

TEST_CASE("KMeans: bad inputs give clear errors") {
  Tensor x = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {3, 2});
  KMeansOptions o;
  o.k = 2;
  auto with_k = [](int64_t k) {
    KMeansOptions oo;
    oo.k = k;
    return oo;
  };
  CHECK_THROWS_MSG(kmeans(x, with_k(4)), ValueError, "[kmeans]", "k = 4", "N = 3", "(3,2)");
  CHECK_THROWS_MSG(kmeans(x, with_k(0)), ValueError, "[kmeans]", "k must be at least 1, got 0");
  CHECK_THROWS_MSG(kmeans(x, with_k(-2)), ValueError, "[kmeans]", "got -2");
  // Non-finite data names the value and its position.
  Tensor bad = Tensor::from_vector(std::vector<double>{0, 1, 2, std::nan(""), 4, 5}, {3, 2});
  CHECK_THROWS_MSG(kmeans(bad, o), ValueError, "[kmeans]", "non-finite", "nan", "row 1, column 1");
  Tensor inf = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, HUGE_VALF, 5}, {3, 2});
  CHECK_THROWS_MSG(kmeans(inf, o), ValueError, "[kmeans]", "non-finite", "inf", "row 2, column 0");
  // Empty input, wrong rank, wrong dtype, undefined.
  CHECK_THROWS_MSG(kmeans(Tensor::zeros({0, 4}, kFloat64), o), ValueError, "[kmeans]", "empty input", "(0,4)");
  CHECK_THROWS_MSG(kmeans(Tensor::zeros({5, 0}, kFloat64), o), ValueError, "[kmeans]", "empty input", "(5,0)");
  CHECK_THROWS_MSG(kmeans(Tensor::zeros({6}, kFloat64), o), ShapeError, "[kmeans]", "matrix (N, d)", "(6)");
  CHECK_THROWS_MSG(kmeans(Tensor::zeros({2, 3, 4}, kFloat64), o), ShapeError, "[kmeans]", "(2,3,4)");
  CHECK_THROWS_MSG(kmeans(Tensor::zeros({3, 2}, kInt64), o), DTypeError, "[kmeans]", "float32 or float64", "int64");
  CHECK_THROWS_MSG(kmeans(Tensor(), o), ValueError, "[kmeans]", "undefined");
  // Options.
  KMeansOptions bad_o = o;
  bad_o.max_iter = 0;
  CHECK_THROWS_MSG(kmeans(x, bad_o), ValueError, "[kmeans]", "max_iter must be at least 1, got 0");
  bad_o = o;
  bad_o.tol = -1;
  CHECK_THROWS_MSG(kmeans(x, bad_o), ValueError, "[kmeans]", "tol", "-1");
  bad_o = o;
  bad_o.block_rows = 0;
  CHECK_THROWS_MSG(kmeans(x, bad_o), ValueError, "[kmeans]", "block_rows must be at least 1, got 0");
  // Initial centroids: shape, dtype, finiteness.
  CHECK_THROWS_MSG(kmeans(x, Tensor::zeros({3, 2}, kFloat64), o), ShapeError, "[kmeans]",
                   "initial_centroids must be (k, d) = (2, 2)", "(3,2)");
  CHECK_THROWS_MSG(kmeans(x, Tensor::zeros({2, 3}, kFloat64), o), ShapeError, "[kmeans]", "(2,3)");
  CHECK_THROWS_MSG(kmeans(x, Tensor::zeros({2}, kFloat64), o), ShapeError, "[kmeans]", "initial_centroids", "(2)");
  CHECK_THROWS_MSG(kmeans(x, Tensor::zeros({2, 2}, kFloat32), o), DTypeError, "[kmeans]",
                   "dtype of x", "float32", "float64");
  CHECK_THROWS_MSG(kmeans(x, Tensor::full({2, 2}, std::nan(""), kFloat64), o), ValueError, "[kmeans]",
                   "initial_centroids", "non-finite");
  // Cosine: a zero row has no direction.
  KMeansOptions oc = o;
  oc.metric = KMeansMetric::cosine;
  Tensor zero_row = Tensor::from_vector(std::vector<double>{1, 0, 0, 0, 0, 1}, {3, 2});
  CHECK_THROWS_MSG(kmeans(zero_row, oc), ValueError, "[kmeans]", "cosine", "row 1", "zero norm");
  // kmeans_assign and kmeans_init check the same way.
  CHECK_THROWS_MSG(kmeans_assign(x, Tensor::zeros({2, 3}, kFloat64)), ShapeError, "[kmeans_assign]",
                   "(2,3)", "(3,2)");
  CHECK_THROWS_MSG(kmeans_assign(x, Tensor::zeros({2, 2}, kFloat32)), DTypeError, "[kmeans_assign]", "dtype");
  CHECK_THROWS_MSG(kmeans_assign(bad, x), ValueError, "[kmeans_assign]", "non-finite");
  CHECK_THROWS_MSG(kmeans_assign(Tensor::zeros({0, 2}, kFloat64), x), ValueError, "[kmeans_assign]", "empty");
  CHECK_THROWS_MSG(kmeans_init(x, with_k(5)), ValueError, "[kmeans_init]", "k = 5");
}

TEST_CASE("KMeans: adjusted Rand index") {
  auto ari = [](std::vector<int64_t> a, std::vector<int64_t> b) {
    int64_t n = int64_t(a.size());
    return adjusted_rand_index(Tensor::from_vector(a, {n}), Tensor::from_vector(b, {int64_t(b.size())}));
  };
  CHECK(ari({0, 0, 1, 1}, {0, 0, 1, 1}) == 1.0);
  CHECK(ari({0, 0, 1, 1}, {5, 5, 2, 2}) == 1.0);  // label names do not matter
  CHECK(ari({0, 0, 1, 2}, {0, 0, 1, 1}) == doctest::Approx(4.0 / 7.0));  // sklearn: 0.5714...
  CHECK(ari({0, 0, 1, 1}, {0, 1, 0, 1}) == doctest::Approx(-0.5));
  CHECK(ari({0, 0, 0, 0}, {0, 1, 2, 3}) == doctest::Approx(0.0));
  CHECK(ari({0, 0, 0}, {1, 1, 1}) == 1.0);  // both one cluster: 0/0, defined as 1
  CHECK(ari({7}, {3}) == 1.0);
  // Independent random labelings score near 0.
  Generator g(4);
  Tensor ra = to(mul(rand({5000}, kFloat64, g), 10.0), kInt64);
  Tensor rb = to(mul(rand({5000}, kFloat64, g), 10.0), kInt64);
  CHECK(std::fabs(adjusted_rand_index(ra, rb)) < 0.02);
  CHECK_THROWS_MSG(ari({0, 1}, {0, 1, 2}), ShapeError, "[adjusted_rand_index]", "(2)", "(3)");
  CHECK_THROWS_MSG(ari({0, -1}, {0, 1}), ValueError, "[adjusted_rand_index]", "non-negative", "position 1");
  CHECK_THROWS_MSG(adjusted_rand_index(Tensor::zeros({2}, kFloat64), Tensor::zeros({2}, kInt64)),
                   DTypeError, "[adjusted_rand_index]", "1-d int64", "float64");
}

}  // TEST_SUITE
