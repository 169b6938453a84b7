#pragma once
// K-Means (Lloyd's algorithm) with k-means++ or random initialisation, L2 or cosine
// (spherical) metric. Used by the Cluster-Former memory bank (Cluster-Former paper,
// Algorithm 1: centroids recomputed from the bank every F steps) and by users who
// cluster their own vectors (the cf-kmeans app).
//
// One Lloyd iteration = an assignment step and an update step, each a kernel of
// the kmeans family (kernels/kmeans/kmeans.h) that a CUDA arm can replace:
//  - assignment: scores = |c|^2 - 2 x.c (cosine: -x.c) through one GEMM per block of
//    block_rows rows into a (block_rows, k) buffer reused across blocks and
//    iterations, then a row argmin; the distance to the chosen centroid is then
//    recomputed directly, so the inertia carries no GEMM cancellation error;
//  - update: per-cluster sums of the member rows in point order (deterministic, the
//    same bits for any thread count), divided by the counts.
// A cluster left empty by an assignment is re-seeded with the point farthest from
// its centroid (the next farthest for the next empty one), so a result never holds
// an empty cluster; data with fewer distinct points than k is an error.
//
// Not differentiable: runs under no-grad; inputs that require grad are read as constants.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace cf::nn {

// Thrown by kmeans when the data has fewer distinct points than k, or fewer groups of
// points than k that its distances tell apart (points closer than the dtype resolves
// at their magnitude: clusters stayed empty after re-seeding) (a ValueError, so callers
// that only report errors need not know it): at_most() is an upper bound on the number
// of distinct points (exact when raised by the k-means++ start), or the number of
// groups told apart, so a caller can retry with fewer clusters, as the Cluster-Former
// memory bank does.
class KMeansTooFewPointsError : public ValueError {
 public:
  KMeansTooFewPointsError(const std::string& message, int64_t at_most) : ValueError(message), at_most_(at_most) {}
  int64_t at_most() const { return at_most_; }

 private:
  int64_t at_most_;
};

enum class KMeansInit { kmeans_plus_plus, random };
enum class KMeansMetric { l2, cosine };  // cosine: points and centroids L2-normalised (spherical k-means)
// How the assignment step finds the nearest centroids; both give the same clustering.
//  lloyd: every distance, through the blocked GEMM (memory: block_rows x k).
//  elkan: Elkan (2003) triangle-inequality bounds skip most distances once the
//         centroids settle; direct distances, no GEMM. Memory: N x k float64 lower
//         bounds, so it suits moderate k; faster when d is large and k moderate.
enum class KMeansAlgorithm { lloyd, elkan };

struct KMeansOptions {
  int64_t k = 8;
  int64_t max_iter = 100;
  double tol = 1e-4;  // stop when the relative inertia decrease < tol (or assignments unchanged)
  KMeansInit init = KMeansInit::kmeans_plus_plus;
  KMeansMetric metric = KMeansMetric::l2;
  uint64_t seed = 0;          // deterministic for a seed
  int64_t block_rows = 8192;  // rows per assignment block: bounds the (rows x k) distance buffer
  KMeansAlgorithm algorithm = KMeansAlgorithm::lloyd;
  // Optional: called after each Lloyd iteration (1, 2, ...) with the inertia of its
  // assignment, e.g. for a progress bar or metrics lines.
  std::function<void(int64_t iteration, double inertia)> on_iteration;
};

struct KMeansResult {
  Tensor centroids;    // (k, d), dtype of x
  Tensor assignments;  // (N,) int64
  double inertia = 0;  // sum of squared L2 distances (cosine: sum of 1 - cos) to the assigned centroid
  int64_t iterations = 0;
  bool converged = false;
  // Inertia after each assignment: [0] for the initial centroids, [t] after update t
  // (then one entry per re-seeding round when max_iter ended with a cluster empty).
  // Never increases (Lloyd's steps each lower the objective); back() == inertia.
  std::vector<double> inertia_history;
  // Empty clusters re-seeded with far points over the whole run (0 in a benign run).
  int64_t reseeded_clusters = 0;
};

// x (N, d) float32/64 on the CPU or a CUDA device; the kernels run there and the
// result (centroids, assignments) is on that device. Initial centroids chosen by
// options.init from options.seed. On CUDA the sums are the CPU's bit for bit for the
// same labels; the GEMM's rounding may differ, so a near-tie can go to another
// centroid than on the CPU, and k-means++ ranks its candidates by direct distances
// on CUDA (by the GEMM expansion on the CPU), so one seed may start from other
// centroids on the two devices: pass initial_centroids to compare them. KMeansAlgorithm::elkan is a CPU speed-up: on CUDA the
// GEMM assignment runs instead (the same clustering).
KMeansResult kmeans(const Tensor& x, const KMeansOptions& options);
// Starts from initial_centroids (k, d), same dtype and device as x; options.init and seed are unused.
KMeansResult kmeans(const Tensor& x, const Tensor& initial_centroids, const KMeansOptions& options);

// Nearest centroid of each row, (N,) int64; blocked GEMM |x|^2 - 2 x.c + |c|^2 (or max cosine).
// Ties go to the lower centroid index.
Tensor kmeans_assign(const Tensor& x, const Tensor& centroids, KMeansMetric metric = KMeansMetric::l2);

// The initial centroids kmeans() starts from: (k, d), dtype of x (cosine: unit rows).
// k-means++ (Arthur & Vassilvitskii 2007), greedy as in scikit-learn: first centre
// uniform; for each next one 2 + floor(ln k) candidates are drawn with probability
// proportional to the squared distance to the nearest chosen centre, and the one
// that lowers the sum of those squared distances most is kept.
// random: k distinct rows drawn uniformly.
Tensor kmeans_init(const Tensor& x, const KMeansOptions& options);

// Distributed K-Means over the process group (dist/dist.h): every rank passes its
// shard x_local (n_r, d) of the data X = the ranks' shards stacked in rank order
// (n_r may differ, even be 0 on some ranks, but not on all); every rank must call
// it with the same options. Lloyd's iteration with local assignment and one
// all-reduce of the cluster sums, counts and inertia per iteration; the seeding
// (k-means++ or random, the same draws from options.seed as kmeans()) is done
// across ranks: the D^2 totals and the candidates' potentials are all-reduced and
// a chosen row is sent by the rank holding it; empty clusters are re-seeded
// farthest-first over all ranks. So on the same X and seed it makes the same
// choices as kmeans(X, options) up to the rounding of sums taken in another order
// (centroids agree to ~1e-15 relative). Returns the centroids (same on every rank),
// this rank's assignments (n_r,) and the global inertia. Runs on the CPU (a CUDA
// x_local is copied there; results come back on its device); algorithm elkan runs
// as lloyd (the same clustering). A world of one is kmeans(x_local, options).
KMeansResult kmeans_distributed(const Tensor& x_local, const KMeansOptions& options);

// Adjusted Rand index (Hubert & Arabie 1985) of two labelings of the same N points,
// each (N,) int64 with non-negative labels: 1 for identical partitions (up to label
// names), about 0 for independent ones. Defined as 1 when both are a single cluster
// or all singletons (the index is 0/0 there).
double adjusted_rand_index(const Tensor& labels_a, const Tensor& labels_b);

}  // namespace cf::nn
