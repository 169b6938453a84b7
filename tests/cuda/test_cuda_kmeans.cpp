// K-Means on CUDA (kernels/kmeans/kmeans_cuda.cu through nn/clustering/kmeans.h)
// against the CPU: the same clustering from the same initial centroids, planted
// clusters recovered from k-means++, empty clusters re-seeded, the blocked
// assignment with ties, and the device errors.
#include <cmath>
#include <limits>

#include "cuda/cuda_test_util.h"
#include "kernels/kmeans/kmeans.h"
#include "nn/clustering/kmeans.h"
#include "nn/clustering/memory_bank.h"
#include "nn/kmeans_test_util.h"

using namespace cf;
using namespace cf::nn;
using namespace cf::test;

namespace {

const Device kGpu = Device::cuda(0);

}  // namespace

TEST_SUITE("cuda/kmeans") {

CUDA_TEST_CASE("K-Means on CUDA from the CPU's initial centroids gives the CPU's clustering") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (KMeansMetric metric : {KMeansMetric::l2, KMeansMetric::cosine}) {
      INFO(dt, metric == KMeansMetric::l2 ? " l2" : " cosine");
      // Overlapping clusters: Lloyd needs several iterations, and empty clusters
      // are possible; block_rows 300 makes the assignment run 7 GEMM blocks.
      Planted p = planted(2000, 16, 10, 2.0, 1.0, 7, dt);
      KMeansOptions o;
      o.k = 12;
      o.metric = metric;
      o.seed = 3;
      o.max_iter = 40;
      o.tol = 0;
      o.block_rows = 300;
      const Tensor init = kmeans_init(p.x, o);
      const KMeansResult c = kmeans(p.x, init, o);
      const KMeansResult g = kmeans(p.x.to(kGpu), init.to(kGpu), o);
      CHECK(g.centroids.device() == kGpu);
      CHECK(g.assignments.device() == kGpu);
      CHECK(g.centroids.dtype() == dt);
      CHECK(c.iterations >= 3);
      const double rel = std::fabs(g.inertia - c.inertia) / c.inertia;
      if (dt == kFloat64) {
        // Sums in the same order in double: only the GEMM's rounding differs,
        // far below any gap between two centroids' distances here.
        CHECK(values(g.assignments.cpu()) == values(c.assignments));
        CHECK(g.iterations == c.iterations);
        CHECK(max_abs_diff(g.centroids.cpu(), c.centroids) < 1e-10);
        CHECK(rel < 1e-10);
      } else {
        // float32 scores: a near-tie may go the other way and the runs drift
        // apart by a point or two; the partition and the objective stay the same.
        CHECK(adjusted_rand_index(g.assignments.cpu(), c.assignments) > 0.99);
        CHECK(rel < 1e-3);
      }
      // The history never rises on CUDA either.
      for (size_t t = 1; t < g.inertia_history.size(); ++t)
        CHECK(g.inertia_history[t] <= g.inertia_history[t - 1] * (1 + 1e-6));
    }
  }
}

CUDA_TEST_CASE("K-Means on CUDA: k-means++ recovers well-separated planted clusters exactly") {
  for (KMeansMetric metric : {KMeansMetric::l2, KMeansMetric::cosine}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      INFO("seed ", seed, metric == KMeansMetric::l2 ? " l2" : " cosine");
      Planted p = planted(1200, 8, 6, 10.0, 0.2, 100 + seed, kFloat32);
      KMeansOptions o;
      o.k = 6;
      o.metric = metric;
      o.seed = seed;
      const KMeansResult g = kmeans(p.x.to(kGpu), o);
      CHECK(adjusted_rand_index(g.assignments.cpu(), p.labels) == doctest::Approx(1.0));
      CHECK(g.converged);
      // The same seed on CUDA gives the same run again.
      const KMeansResult again = kmeans(p.x.to(kGpu), o);
      CHECK(values(again.assignments.cpu()) == values(g.assignments.cpu()));
      CHECK(values(again.centroids.cpu()) == values(g.centroids.cpu()));
    }
  }
}

CUDA_TEST_CASE("K-Means on CUDA re-seeds an empty cluster like the CPU") {
  // Two tight groups and three centroids, one far from everything: it is empty
  // after the first assignment and must be re-seeded from the farthest point.
  std::vector<double> x;
  for (int i = 0; i < 40; ++i) {
    const double e = 0.01 * (i % 7);
    x.push_back(i < 20 ? e : 5.0 + e);
    x.push_back(i < 20 ? 0.0 : 1.0 + 0.1 * (i % 3));
  }
  const Tensor xs = Tensor::from_vector(x, {40, 2});
  const Tensor init = Tensor::from_vector(std::vector<double>{0.0, 0.0, 5.0, 1.0, 100.0, 100.0}, {3, 2});
  KMeansOptions o;
  o.k = 3;
  const KMeansResult c = kmeans(xs, init, o);
  const KMeansResult g = kmeans(xs.to(kGpu), init.to(kGpu), o);
  CHECK(c.reseeded_clusters >= 1);
  CHECK(g.reseeded_clusters == c.reseeded_clusters);
  CHECK(values(g.assignments.cpu()) == values(c.assignments));
  CHECK(max_abs_diff(g.centroids.cpu(), c.centroids) < 1e-12);
  for (double v : values(g.centroids.cpu())) CHECK(std::isfinite(v));
}

CUDA_TEST_CASE("kmeans_assign on CUDA: the nearest centroid, lowest index on ties, any block size") {
  Planted p = planted(3000, 24, 40, 1.0, 0.5, 11, kFloat64);
  KMeansOptions o;
  o.k = 40;
  const Tensor c = kmeans_init(p.x, o);
  CHECK(values(kmeans_assign(p.x.to(kGpu), c.to(kGpu)).cpu()) == values(kmeans_assign(p.x, c)));
  // The kernel itself with blocks of 7 rows (the public call takes 8192 at a time).
  const Tensor xg = p.x.to(kGpu), cg = c.to(kGpu);
  Tensor ws = Tensor::empty({8 * 40}, kFloat64, kGpu), labels = Tensor::empty({3000}, kInt64, kGpu),
         dist = Tensor::empty({3000}, kFloat64, kGpu);
  kernels::kmeans_assign(xg, cg, false, 7, ws, labels, dist);
  CHECK(values(labels.cpu()) == values(kmeans_assign(p.x, c)));
  CHECK(values(kmeans_assign(p.x.to(kGpu), c.to(kGpu), KMeansMetric::cosine).cpu()) ==
        values(kmeans_assign(p.x, c, KMeansMetric::cosine)));
  // Duplicate centroids: every point goes to the first copy.
  const Tensor dup = Tensor::from_vector(std::vector<double>{1, 1, 1, 1, -1, -1}, {3, 2});
  const Tensor pts = Tensor::from_vector(std::vector<double>{2, 2, 0.9, 1.1, -3, -2}, {3, 2});
  CHECK(values(kmeans_assign(pts.to(kGpu), dup.to(kGpu)).cpu()) == std::vector<double>{0, 0, 2});
}

CUDA_TEST_CASE("K-Means on CUDA: mixed devices and non-finite data are clear errors") {
  Planted p = planted(100, 4, 3, 5.0, 0.1, 1, kFloat32);
  KMeansOptions o;
  o.k = 3;
  const Tensor init = kmeans_init(p.x, o);
  CHECK_THROWS_MSG(kmeans(p.x.to(kGpu), init, o), DeviceError, "[kmeans] initial_centroids", "device of x",
                   "cuda:0");
  CHECK_THROWS_MSG(kmeans_assign(p.x.to(kGpu), init), DeviceError, "[kmeans_assign] centroids", "device of x");
  std::vector<float> bad = p.x.to_vector<float>();
  bad[4 * 17 + 2] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_MSG(kmeans(Tensor::from_vector(bad, {100, 4}).to(kGpu), o), ValueError, "[kmeans] x",
                   "non-finite", "row 17, column 2");
  // kmeans_assign (Cluster-Former's eq. 5 in every forward) reads nothing back: its
  // data checks are deferred, with the CPU's messages, to the next host read.
  const Tensor xg = p.x.to(kGpu), ig = init.to(kGpu);
  bad[4 * 17 + 2] = -std::numeric_limits<float>::infinity();
  const Tensor bad_g = Tensor::from_vector(bad, {100, 4}).to(kGpu);
  std::vector<float> zero_row = p.x.to_vector<float>();
  for (int i = 0; i < 4; ++i) zero_row[4 * 5 + size_t(i)] = 0;
  const Tensor zero_g = Tensor::from_vector(zero_row, {100, 4}).to(kGpu);
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  const Tensor ok = kmeans_assign(xg, ig, KMeansMetric::cosine);
  const Tensor after_bad = kmeans_assign(bad_g, ig, KMeansMetric::cosine);
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.host_to_device == 0);
  CHECK(d.synchronizations == 0);
  CHECK_THROWS_MSG(after_bad.cpu(), ValueError, "[kmeans_assign] x", "non-finite value (-inf) at row 17, column 2");
  CHECK(values(ok.cpu()) == values(kmeans_assign(p.x, init, KMeansMetric::cosine)));
  for (const std::string& tail : {std::string(""), std::string(" cosine")}) {
    INFO(tail);
    const KMeansMetric m = tail.empty() ? KMeansMetric::l2 : KMeansMetric::cosine;
    CHECK_THROWS_MSG(kmeans_assign(Tensor::from_vector(bad, {100, 4}), init, m), ValueError,
                     "[kmeans_assign] x", "non-finite value (-inf) at row 17, column 2");
    // l2 reads the data's range back (so throws itself); cosine reads nothing.
    CHECK_THROWS_MSG(((void)kmeans_assign(bad_g, ig, m), cuda::check_errors()), ValueError, "[kmeans_assign] x",
                     "non-finite value (-inf) at row 17, column 2");
  }
  CHECK_THROWS_MSG(kmeans_assign(Tensor::from_vector(zero_row, {100, 4}), init, KMeansMetric::cosine), ValueError,
                   "[kmeans_assign] cosine metric: row 5 of x", "zero norm");
  (void)kmeans_assign(zero_g, ig, KMeansMetric::cosine);
  CHECK_THROWS_MSG(cuda::check_errors(), ValueError, "[kmeans_assign] cosine metric: row 5 of x", "zero norm");
  (void)kmeans_assign(zero_g, ig);  // l2 takes a zero row
  cuda::check_errors();
}

CUDA_TEST_CASE("memory bank on CUDA: add makes no host round trip, and a call with a non-finite state stores nothing") {
  nn::MemoryBankOptions o;
  o.dim = 2;
  o.num_clusters = 2;
  o.capacity = 4;
  nn::MemoryBank cpu(o), gpu(o);
  gpu.to(Device::cuda(0));
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 0, 0, 3, 4, 5, 6, 7, 8}, {5, 2});
  cpu.add(a);
  const Tensor a_gpu = cuda0(a);
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  gpu.add(a_gpu);
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.host_to_device == 0);
  CHECK(d.synchronizations == 0);
  CHECK(values(gpu.contents()) == values(cpu.contents()));  // the zero row skipped, the oldest popped
  CHECK(gpu.size() == 4);
  const std::vector<double> held = values(gpu.contents());
  gpu.add(cuda0(Tensor::from_vector(std::vector<float>{9, 9, NAN, 1}, {2, 2})));
  CHECK_THROWS_MSG(cuda::check_errors(), ValueError, "[MemoryBank] add: state 1 of", "non-finite");
  CHECK(values(gpu.contents()) == held);
}

}  // TEST_SUITE
