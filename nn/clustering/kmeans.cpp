#include "nn/clustering/kmeans.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/ops/clustering.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "core/cuda.h"
#include "core/rng.h"
#include "dist/dist.h"

namespace cf::nn {

namespace {

// Rank, dtype, device and emptiness of a data matrix; `what` names it in messages. rows_may_be_zero: one
// rank's shard of a distributed K-Means (the total is checked against k).
void check_matrix(const Tensor& t, const char* op, const char* what, bool rows_may_be_zero = false) {
  CF_CHECK(t.defined(), ValueError, "[", op, "] ", what, " is an undefined tensor");
  CF_CHECK(t.dim() == 2, ShapeError, "[", op, "] ", what, " must be a matrix (N, d), got ",
           t.describe());
  // (the K-Means kernels are float32/float64 only; cast bfloat16/float16 inputs with cf::to)
  CF_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64, DTypeError, "[", op, "] ", what,
           " must be float32 or float64, got ", t.describe());
  CF_CHECK((t.size(0) > 0 || rows_may_be_zero) && t.size(1) > 0, ValueError, "[", op, "] empty input: ", what,
           " is ", t.describe());
}

// The first NaN/Inf of a contiguous host float matrix is an error naming its
// position; `desc` describes the caller's tensor (its device, not the host copy's).
// The error for a non-finite entry i of a (., d) matrix, on either device.
[[noreturn]] void throw_non_finite(const char* op, const char* what, const std::string& desc, double v, int64_t i,
                                   int64_t d) {
  const char* name = std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  throw ValueError(str("[", op, "] ", what, " ", desc, " has a non-finite value (", name, ") at row ", i / d,
                       ", column ", i % d));
}
[[noreturn]] void throw_zero_norm(const char* op, const char* what, const std::string& desc, int64_t row) {
  throw ValueError(str("[", op, "] cosine metric: row ", row, " of ", what, " ", desc, " has zero norm (no direction)"));
}

template <typename T>
void check_finite_typed(const Tensor& t, const char* op, const char* what, const std::string& desc) {
  const T* p = t.data<T>();
  const int64_t n = t.numel(), d = t.size(1);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) throw_non_finite(op, what, desc, double(p[i]), i, d);
}
void check_finite(const Tensor& t, const char* op, const char* what, const std::string& desc) {
  CF_DISPATCH_FLOAT(t.dtype(), op, check_finite_typed<scalar_t>(t, op, what, desc));
}

template <typename T>
void normalize_rows_typed(const Tensor& src, const Tensor& dst, const char* op, const char* what,
                          const std::string& desc) {
  const int64_t n = src.size(0), d = src.size(1);
  const T* s = src.data<T>();
  T* o = dst.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    // Divide by the row's largest magnitude before squaring: float64 values near
    // 1e160 would square to inf (and the row to zeros) otherwise.
    double mx = 0;
    for (int64_t t = 0; t < d; ++t) mx = std::max(mx, std::fabs(double(s[i * d + t])));
    if (!(mx > 0)) throw_zero_norm(op, what, desc, i);
    double nn = 0;
    for (int64_t t = 0; t < d; ++t) nn += (double(s[i * d + t]) / mx) * (double(s[i * d + t]) / mx);
    const double inv = 1.0 / (mx * std::sqrt(nn));
    for (int64_t t = 0; t < d; ++t) o[i * d + t] = T(double(s[i * d + t]) * inv);
  }
}

// The data as the loop reads it, on its own device: contiguous (no copy when it
// already is), checked finite; for cosine a copy with unit rows.
Tensor prepare(const Tensor& t, KMeansMetric metric, const char* op, const char* what) {
  Tensor c = contiguous(t.detach());
  if (!c.device().is_cpu()) {
    // Device data: checked by deferred data checks (core/cuda.h), so that a forward
    // assigning clusters does not wait for the device; the errors are the CPU's, at
    // the next host read. Each entry's class: 0 finite, 1 nan, 2 inf, 3 -inf.
    const std::string desc = c.describe(), op_name = op, what_name = what;
    const int64_t d = c.size(1);
    const Tensor c64 = to(c, kFloat64);
    const Tensor kind = to(ne(c64, c64), kInt64) + to(eq(c64, INFINITY), kInt64) * 2.0 +
                        to(eq(c64, -INFINITY), kInt64) * 3.0;
    check_indices(op, kind, 1, [=](int64_t i, int64_t k) {
      throw_non_finite(op_name.c_str(), what_name.c_str(), desc, k == 1 ? NAN : k == 2 ? INFINITY : -INFINITY, i, d);
    });
    if (metric == KMeansMetric::l2) return c;
    // Unit rows as normalize_rows_typed makes them: divided by the largest magnitude
    // first (float64 values near 1e160 would square to inf).
    const Tensor mx = amax(abs(c64), {1}, true);
    check_indices(op, to(eq(mx, 0.0), kInt64), 1, [=](int64_t row, int64_t) {
      throw_zero_norm(op_name.c_str(), what_name.c_str(), desc, row);
    });
    const Tensor scaled = c64 / mx;
    return contiguous(to(scaled / sqrt(sum(square(scaled), {1}, true)), c.dtype()));
  }
  check_finite(c, op, what, c.describe());
  if (metric == KMeansMetric::l2) return c;
  Tensor out = Tensor::empty(c.shape(), c.dtype());
  CF_DISPATCH_FLOAT(c.dtype(), op, normalize_rows_typed<scalar_t>(c, out, op, what, c.describe()));
  return out;
}

// A buffer that the loop's host code reads or writes and the kernels use on the
// data's device: one tensor on the CPU; on CUDA a device tensor and a host copy,
// synchronised where the loop needs it (pull: device to host, push: back).
struct Mirrored {
  Tensor dev, host;
  Mirrored() = default;
  Mirrored(const Shape& shape, DType dtype, Device device)
      : dev(Tensor::empty(shape, dtype, device)),
        host(device.is_cpu() ? dev : Tensor::empty(shape, dtype)) {}
  // Wraps an existing tensor (centroids passed in) the same way.
  static Mirrored of(const Tensor& t) {
    Mirrored m;
    m.dev = t;
    m.host = t.device().is_cpu() ? t : t.cpu();
    return m;
  }
  void pull() {
    if (!host.is_same(dev))
      copy_bytes(host.raw_data(), host.device(), dev.raw_data(), dev.device(), dev.nbytes(), "kmeans");
  }
  void push() {
    if (!host.is_same(dev))
      copy_bytes(dev.raw_data(), dev.device(), host.raw_data(), host.device(), dev.nbytes(), "kmeans");
  }
};

// Range scaling for the L2 metric (issue 27, defect 10). Squared distances of
// float32 values near 3e38 (or of float64 near 1e160) overflow to inf, and of
// values near 1e-30 underflow to 0: every distance ties, clusters stay empty and
// Lloyd never moves. Scaling the data by a power of two 2^-e that brings its
// largest magnitude into [0.5, 1) is exact (only the exponent changes, barring
// subnormals), so assignments and centroid bits are those of an exact-range run;
// centroids are scaled back by 2^e and inertias by 4^e (which may then exceed the
// double range for float64 data beyond ~1e154: reported as inf, honestly).
// Data whose largest magnitude is in [2^-50, 2^50] is left alone (no copy):
// its squares cannot overflow or underflow either float type.
int range_exponent(const Tensor& x, KMeansMetric metric) {
  if (metric != KMeansMetric::l2) return 0;  // cosine rows are unit vectors
  const double m = amax(abs(x.detach())).item();
  if (!(m > 0) || !std::isfinite(m)) return 0;  // zeros; non-finite is rejected by prepare
  if (m >= std::ldexp(1.0, -50) && m <= std::ldexp(1.0, 50)) return 0;
  int e = 0;
  (void)std::frexp(m, &e);  // m = f * 2^e, f in [0.5, 1)
  return e;
}
// Translation for the L2 metric. Distances are |x|^2 - 2 x.c + |c|^2 (one GEMM per block),
// which cancels when the points sit far from the origin next to their spread: three blobs
// around 1e4 in float32, or around 1.7e9 (timestamps) in float64, were clustered at random,
// with a rising inertia reported as converged. Subtracting a central point of `ref` first
// leaves every distance unchanged and the cancellation small (scikit-learn centres its data
// too). Only when the offset exceeds the spread (the root mean square of x - mean, which one
// far point does not dominate as a maximum would): other data are not touched (no copy, the
// same bits as before). The point is the mean rounded to a multiple of a power of two g just
// below the spread (what is left of the offset is at most g / 2): a coordinate near the mean
// then loses no bits in x - point (the point is a multiple of its ulp, Sterbenz), so distances
// that tie in the data still tie (the exact mean broke ties of grid data, and so the rule that
// ties go to the lower index). Returns the (1, d) point, or an undefined tensor.
Tensor translation(const Tensor& ref, KMeansMetric metric) {
  if (metric != KMeansMetric::l2 || ref.size(0) == 0) return Tensor();
  Tensor m = mean(ref, {0}, /*keepdim=*/true);
  const double offset = amax(abs(m)).item();
  const double spread = std::sqrt(mean(square(cf::to(ref - m, kFloat64))).item());
  if (!(offset > spread)) return Tensor();
  if (!(spread > 0)) return m;  // one point repeated
  const double g = std::ldexp(1.0, std::ilogb(spread));
  std::vector<double> point = cf::to(m, kFloat64).cpu().to_vector<double>();
  for (double& v : point) v = std::nearbyint(v / g) * g;
  return cf::to(Tensor::from_vector(point, m.shape()), m.dtype()).to(m.device());
}
Tensor translated(const Tensor& t, const Tensor& by) { return by.defined() ? contiguous(t - by) : t; }

Tensor scale_by_pow2(const Tensor& t, int e) {
  if (e == 0) return t;
  // Two exact steps: 2^128 (float32 data near 3e38 scaled back) is not a float32.
  const int half = e / 2;
  return contiguous(mul(mul(t, std::ldexp(1.0, half)), std::ldexp(1.0, e - half)));
}

void check_options(const KMeansOptions& o, int64_t n, const Tensor& x, const char* op) {
  CF_CHECK(o.k >= 1, ValueError, "[", op, "] k must be at least 1, got ", o.k);
  CF_CHECK(o.k <= n, ValueError, "[", op, "] k = ", o.k, " exceeds the number of points N = ", n,
           " (x is ", x.describe(), ")");
  CF_CHECK(o.max_iter >= 1, ValueError, "[", op, "] max_iter must be at least 1, got ", o.max_iter);
  CF_CHECK(o.tol >= 0 && std::isfinite(o.tol), ValueError, "[", op,
           "] tol must be finite and non-negative, got ", o.tol);
  CF_CHECK(o.block_rows >= 1, ValueError, "[", op, "] block_rows must be at least 1, got ",
           o.block_rows);
}

// Uniform double in [0, 1) from (seed, counter): a fixed stream per seed.
double uniform(uint64_t seed, uint64_t counter) {
  return philox_uniform_d(philox4x32_10(seed, counter));
}

int64_t uniform_index(uint64_t seed, uint64_t counter, int64_t n) {
  return std::min<int64_t>(n - 1, int64_t(uniform(seed, counter) * double(n)));
}

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& idx) {
  if (!x.device().is_cpu())
    return index_select(x, 0, Tensor::from_vector<int64_t>(idx, {int64_t(idx.size())}, x.device()));
  const int64_t d = x.size(1);
  Tensor out = Tensor::empty({int64_t(idx.size()), d}, x.dtype());
  const size_t row_bytes = size_t(d) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (size_t r = 0; r < idx.size(); ++r)
    std::memcpy(dst + r * row_bytes, src + size_t(idx[r]) * row_bytes, row_bytes);
  return out;
}

// Initial centroids from prepared (contiguous, finite, cosine: unit-row) data.
// The rows of x that seed the centroids (random, or greedy k-means++).
std::vector<int64_t> init_rows(const Tensor& x, const KMeansOptions& o, const char* op) {
  const int64_t n = x.size(0), k = o.k;
  std::vector<int64_t> chosen;
  chosen.reserve(size_t(k));
  if (o.init == KMeansInit::random) {
    // Partial Fisher-Yates: k distinct rows, uniformly.
    std::vector<int64_t> perm(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), int64_t(0));
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = i + uniform_index(o.seed, uint64_t(i), n - i);
      std::swap(perm[size_t(i)], perm[size_t(j)]);
      chosen.push_back(perm[size_t(i)]);
    }
    return chosen;
  }
  // Greedy k-means++ (Arthur & Vassilvitskii 2007, section 6; scikit-learn's
  // default): each step draws L = 2 + floor(ln k) candidates by D^2 sampling and
  // keeps the one that lowers the potential sum_i D_i^2 most. Plain D^2 sampling
  // puts two of the first centres in one well-separated cluster now and then
  // (about 1 seed in 20 on three planted blobs), a local minimum Lloyd cannot leave.
  const int64_t trials = 2 + int64_t(std::log(double(k)));
  const Device dev = x.device();
  Mirrored dist({n}, kFloat64, dev), cand({trials}, kInt64, dev), pot({trials}, kFloat64, dev);
  std::fill_n(dist.host.data<double>(), n, HUGE_VAL);
  dist.push();
  Tensor xnorm = Tensor::empty({n}, kFloat64, dev);
  Tensor workspace = Tensor::empty({trials * x.size(1) + ops::kmeans_potential_chunk() * trials}, x.dtype(), dev);
  ops::kmeans_row_sqnorms_into(x, xnorm);
  const double* D = dist.host.data<double>();
  int64_t* cd = cand.host.data<int64_t>();
  const double* P = pot.host.data<double>();
  std::vector<double> targets(static_cast<size_t>(trials));
  chosen.push_back(uniform_index(o.seed, 0, n));
  for (int64_t s = 1; s < k; ++s) {
    ops::kmeans_pp_update_into(x, chosen.back(), dist.dev);
    dist.pull();
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += D[i];
    // Every point sits on a chosen centre: the data has exactly s distinct rows.
    if (!(total > 0))
      throw KMeansTooFewPointsError(str("[", op, "] x ", x.describe(), " has only ", s,
                                        " distinct points, fewer than k = ", k),
                                    s);
    for (int64_t l = 0; l < trials; ++l)
      targets[size_t(l)] = uniform(o.seed, uint64_t(s) * 64 + uint64_t(l)) * total;
    std::sort(targets.begin(), targets.end());
    // One scan of the cumulative sum serves all the sorted targets.
    double cum = 0;
    int64_t l = 0, last_positive = -1;
    for (int64_t i = 0; i < n && l < trials; ++i) {
      if (D[i] <= 0) continue;
      last_positive = i;
      cum += D[i];
      while (l < trials && cum > targets[size_t(l)]) cd[l++] = i;
    }
    for (; l < trials; ++l) cd[l] = last_positive;  // rounding at the very end of the scan
    cand.push();
    ops::kmeans_pp_potentials_into(x, xnorm, dist.dev, cand.dev, workspace, pot.dev);
    pot.pull();
    int64_t best = 0;
    for (int64_t t = 1; t < trials; ++t)
      if (P[t] < P[best]) best = t;
    chosen.push_back(cd[best]);
  }
  return chosen;
}
Tensor init_prepared(const Tensor& x, const KMeansOptions& o, const char* op) {
  return gather_rows(x, init_rows(x, o, op));
}

// Lloyd's loop on prepared data x and centroids c (both contiguous, dtype T, cosine:
// unit rows, on one device). The kernels run on that device; the host code between
// them (inertia, empty clusters, the mean division, re-seeding) reads host copies
// of the labels, distances and sums, and writes the centroids back (Mirrored).
// The update step (cosine: re-normalised, Dhillon & Modha 2001): centroid j becomes
// the mean of its cnt[j] members from their coordinate sums S (k, d). An empty
// cluster, and a cosine mean of zero norm (every unit vector is then equally
// good), keep their centroid.
template <typename Count, typename Out>
void mean_update(const Count* cnt, const double* S, int64_t k, int64_t d, bool cosine, Out* C) {
  for (int64_t j = 0; j < k; ++j) {
    if (cnt[j] == 0) continue;
    const double inv = 1.0 / double(cnt[j]);
    double nn = 0;
    for (int64_t t = 0; t < d; ++t) nn += S[j * d + t] * S[j * d + t];
    if (cosine && !(nn > 0)) continue;
    const double scale = cosine ? 1.0 / std::sqrt(nn) : inv;
    for (int64_t t = 0; t < d; ++t) C[j * d + t] = Out(S[j * d + t] * scale);
  }
}

// Lloyd's iterations, shared by the local and the distributed loop, from the
// inertia of the first assignment: step() moves the centroids (mean update, then
// re-seeding of empty clusters), assign() reassigns every point and returns the
// inertia, unchanged() says whether that moved no point, has_empty() how many
// clusters are empty, reseed() re-seeds without a mean update. Stops after max_iter
// or once no cluster is empty and the points stood still or the inertia fell by
// less than tol. Returns the final inertia.
template <class Step, class Assign, class Unchanged, class HasEmpty, class Reseed>
double lloyd_iterations(const KMeansOptions& o, const char* op, double inertia, KMeansResult& res, Step step,
                        Assign assign, Unchanged unchanged, HasEmpty has_empty, Reseed reseed) {
  for (int64_t it = 1; it <= o.max_iter; ++it) {
    step();
    const double prev = inertia;
    inertia = assign();
    res.iterations = it;
    if (o.on_iteration) o.on_iteration(it, inertia);
    if (has_empty() == 0 && (unchanged() || prev - inertia < o.tol * prev)) {
      res.converged = true;
      break;
    }
  }
  // Out of iterations with a cluster still empty: re-seed and re-assign (no mean
  // update) until every cluster has a point; each round moves a far point onto its
  // own centroid, so inertia falls and the rounds end.
  // Rounds that leave clusters empty mean the assignment cannot tell some distinct points apart (rows
  // that differ in the last bits, such as the unit vectors of scaled copies of one direction): as many
  // clusters as it does resolve is the most this data gives, a KMeansTooFewPointsError (so the memory
  // bank falls back to fewer clusters, as for duplicates).
  for (int64_t round = 0; has_empty() > 0; ++round) {
    if (round == o.k + 1) {
      const int64_t resolved = o.k - int64_t(has_empty());
      throw KMeansTooFewPointsError(
          str("[", op, "] clusters still empty after ", round, " re-seeding rounds: only ", resolved,
              " groups of points are told apart at this dtype's resolution (|x|^2 - 2 x.c + |c|^2 cancels for "
              "points this close); cluster float64 data, or at most ", resolved, " clusters"),
          resolved);
    }
    reseed();
    inertia = assign();
  }
  return inertia;
}

template <typename T>
KMeansResult lloyd(const Tensor& x, Tensor c_init, const KMeansOptions& o, const char* op) {
  const int64_t n = x.size(0), d = x.size(1), k = o.k;
  const bool cosine = o.metric == KMeansMetric::cosine;
  const int64_t rows = std::min(o.block_rows, n);
  const Device dev = x.device();
  // Elkan's bounds are CPU code; on CUDA the GEMM assignment gives the same clustering.
  const bool elkan = o.algorithm == KMeansAlgorithm::elkan && dev.is_cpu();
  // Every buffer of the loop, allocated once.
  Tensor workspace = elkan ? Tensor() : Tensor::empty({(rows + 1) * k}, x.dtype(), dev);
  Mirrored labels({n}, kInt64, dev), dist({n}, kFloat64, dev);
  Mirrored counts({k}, kInt64, dev), sums({k, d}, kFloat64, dev);
  Mirrored c = Mirrored::of(c_init);
  Tensor prev_labels = Tensor::empty({n}, kInt64);
  Tensor order = Tensor::empty({n}, kInt64, dev);
  std::vector<int64_t> members(static_cast<size_t>(k));
  T* C = c.host.data<T>();
  const double* D = dist.host.data<double>();
  // The data on the host, for re-seeding only (a copy on CUDA, made when first needed).
  Tensor x_host;
  // Elkan's state: bounds, the centroids of the previous assignment, scratch.
  Tensor lower, upper, scratch, c_prev;
  if (elkan) {
    lower = Tensor::empty({n, k}, kFloat64);
    upper = Tensor::empty({n}, kFloat64);
    scratch = Tensor::empty({k * k + 2 * k}, kFloat64);
    c_prev = Tensor::empty({k, d}, x.dtype());
  }
  bool first = true;

  KMeansResult res;
  auto assign = [&]() {
    if (elkan) {
      ops::kmeans_elkan_assign_into(x, c.dev, c_prev, first, cosine, lower, upper, scratch, labels.dev,
                                   dist.dev);
      std::memcpy(c_prev.raw_data(), C, size_t(k * d) * sizeof(T));
    } else {
      ops::kmeans_assign_into(x, c.dev, cosine, rows, workspace, labels.dev, dist.dev);
    }
    first = false;
    labels.pull();
    dist.pull();
    double inertia = 0;
    for (int64_t i = 0; i < n; ++i) inertia += D[i];  // fixed order: reproducible
    res.inertia_history.push_back(inertia);
    const int64_t* L = labels.host.data<int64_t>();
    std::fill(members.begin(), members.end(), int64_t(0));
    for (int64_t i = 0; i < n; ++i) ++members[size_t(L[i])];
    return inertia;
  };
  auto has_empty = [&]() {
    return std::count(members.begin(), members.end(), int64_t(0));
  };
  // Moves each empty cluster's centroid onto a far point, farthest-first: the point
  // farthest from its centroid, then the point farthest from its centroid and the
  // seeds placed so far, and so on (ties to the lower index). So several empty
  // clusters spread over the data instead of piling into one far group, and the
  // next assignment gives each seed at least its own point. Inertia cannot rise: an
  // empty centroid serves no point before it moves.
  Tensor far;
  auto reseed = [&]() {
    std::vector<int64_t> empty;
    for (int64_t j = 0; j < k; ++j)
      if (members[size_t(j)] == 0) empty.push_back(j);
    if (empty.empty()) return;
    if (!far.defined()) far = Tensor::empty({n}, kFloat64);
    if (!x_host.defined()) x_host = x.cpu();
    const T* X = x_host.data<T>();
    double* F = far.data<double>();
    // Squared L2 distances throughout (for unit rows |x - c|^2 = 2 (1 - cos)).
    for (int64_t i = 0; i < n; ++i) F[i] = cosine ? 2 * D[i] : D[i];
    for (size_t e = 0; e < empty.size(); ++e) {
      const int64_t pick = std::max_element(F, F + n) - F;
      // Every point sits on a centroid or a seed: too few distinct rows to go round.
      if (!(F[pick] > 0))
        throw KMeansTooFewPointsError(str("[", op, "] x ", x.describe(), " has fewer distinct points (at most ",
                                          k - int64_t(empty.size() - e), ") than k = ", k, "; cannot fill ",
                                          empty.size() - e, " empty cluster(s)"),
                                      k - int64_t(empty.size() - e));
      std::memcpy(C + empty[e] * d, X + pick * d, size_t(d) * sizeof(T));
      ops::kmeans_pp_update_into(x_host, pick, far);
      ++res.reseeded_clusters;
    }
  };

  const double first_inertia = assign();
  auto step = [&]() {
    ops::kmeans_update_into(x, labels.dev, order, counts.dev, sums.dev);
    counts.pull();
    sums.pull();
    mean_update(counts.host.data<int64_t>(), sums.host.data<double>(), k, d, cosine, C);
    reseed();
    c.push();
    // A copy, not a swap: Elkan's step reads the current labels as its state.
    std::memcpy(prev_labels.raw_data(), labels.host.raw_data(), size_t(n) * sizeof(int64_t));
  };
  auto unchanged = [&]() {
    return std::memcmp(labels.host.raw_data(), prev_labels.raw_data(), size_t(n) * sizeof(int64_t)) == 0;
  };
  const double inertia = lloyd_iterations(o, op, first_inertia, res, step, assign, unchanged, has_empty, [&]() {
    reseed();
    c.push();
  });
  res.centroids = c.dev;
  res.assignments = labels.dev;
  res.inertia = inertia;
  return res;
}

// Lloyd on data scaled by 2^-e and moved by -shift (undefined: not moved); the result in the
// caller's units.
KMeansResult run_scaled(const Tensor& xp, const Tensor& c, const KMeansOptions& options, int e,
                        const Tensor& shift) {
  const double inertia_scale = std::ldexp(1.0, 2 * e);
  // An exact 0 stays 0 when the scale overflows to inf (0 * inf would be NaN).
  auto scaled = [inertia_scale](double v) { return v == 0 ? 0.0 : v * inertia_scale; };
  KMeansOptions o = options;
  if (e != 0 && options.on_iteration)
    o.on_iteration = [&options, inertia_scale](int64_t it, double inertia) {
      options.on_iteration(it, inertia == 0 ? 0.0 : inertia * inertia_scale);
    };
  KMeansResult r;
  CF_DISPATCH_FLOAT(xp.dtype(), "kmeans", r = lloyd<scalar_t>(xp, c, o, "kmeans"));
  if (shift.defined()) r.centroids = contiguous(r.centroids + shift);
  if (e != 0) {
    r.centroids = scale_by_pow2(r.centroids, e);
    r.inertia = scaled(r.inertia);
    for (double& v : r.inertia_history) v = scaled(v);
  }
  return r;
}

}  // namespace

Tensor kmeans_init(const Tensor& x, const KMeansOptions& options) {
  NoGradGuard ng;
  check_matrix(x, "kmeans_init", "x");
  check_options(options, x.size(0), x, "kmeans_init");
  Tensor xp = prepare(x, options.metric, "kmeans_init", "x");
  const int e = range_exponent(xp, options.metric);
  xp = scale_by_pow2(xp, -e);
  // The seeding's potentials are distances too: rows chosen on the translated data, returned
  // from x itself (exact rows: (x - m) + m is not always x).
  const std::vector<int64_t> rows = init_rows(translated(xp, translation(xp, options.metric)), options, "kmeans_init");
  return scale_by_pow2(gather_rows(xp, rows), e);
}

KMeansResult kmeans(const Tensor& x, const KMeansOptions& options) {
  NoGradGuard ng;
  check_matrix(x, "kmeans", "x");
  check_options(options, x.size(0), x, "kmeans");
  Tensor xp = prepare(x, options.metric, "kmeans", "x");
  const int e = range_exponent(xp, options.metric);
  xp = scale_by_pow2(xp, -e);
  const Tensor shift = translation(xp, options.metric);
  xp = translated(xp, shift);
  Tensor c = init_prepared(xp, options, "kmeans");
  return run_scaled(xp, c, options, e, shift);
}

KMeansResult kmeans(const Tensor& x, const Tensor& initial_centroids, const KMeansOptions& options) {
  NoGradGuard ng;
  check_matrix(x, "kmeans", "x");
  check_options(options, x.size(0), x, "kmeans");
  check_matrix(initial_centroids, "kmeans", "initial_centroids");
  CF_CHECK(initial_centroids.size(0) == options.k && initial_centroids.size(1) == x.size(1),
           ShapeError, "[kmeans] initial_centroids must be (k, d) = (", options.k, ", ", x.size(1),
           "), got ", initial_centroids.describe(), " for x ", x.describe());
  CF_CHECK(initial_centroids.dtype() == x.dtype(), DTypeError,
           "[kmeans] initial_centroids must have the dtype of x: ", initial_centroids.describe(),
           " vs x ", x.describe());
  CF_CHECK(initial_centroids.device() == x.device(), DeviceError,
           "[kmeans] initial_centroids must be on the device of x: ", initial_centroids.describe(),
           " vs x ", x.describe());
  Tensor xp = prepare(x, options.metric, "kmeans", "x");
  // A copy: the loop updates the centroids in place.
  Tensor c = prepare(initial_centroids, options.metric, "kmeans", "initial_centroids");
  // One factor for both, from the larger range of the two.
  const int e = std::max(range_exponent(xp, options.metric), range_exponent(c, options.metric));
  xp = scale_by_pow2(xp, -e);
  c = scale_by_pow2(c, -e);
  const Tensor shift = translation(xp, options.metric);
  xp = translated(xp, shift);
  c = translated(c, shift);
  if (c.is_same(initial_centroids) || c.shares_storage(initial_centroids)) c = clone(c);
  return run_scaled(xp, c, options, e, shift);
}

Tensor kmeans_assign(const Tensor& x, const Tensor& centroids, KMeansMetric metric) {
  NoGradGuard ng;
  check_matrix(x, "kmeans_assign", "x");
  check_matrix(centroids, "kmeans_assign", "centroids");
  CF_CHECK(centroids.size(1) == x.size(1), ShapeError, "[kmeans_assign] centroids ",
           centroids.describe(), " and x ", x.describe(), " differ in the feature size d");
  CF_CHECK(centroids.dtype() == x.dtype(), DTypeError, "[kmeans_assign] centroids ",
           centroids.describe(), " must have the dtype of x ", x.describe());
  CF_CHECK(centroids.device() == x.device(), DeviceError, "[kmeans_assign] centroids ",
           centroids.describe(), " must be on the device of x ", x.describe());
  Tensor xp = prepare(x, metric, "kmeans_assign", "x");
  Tensor cp = prepare(centroids, metric, "kmeans_assign", "centroids");
  const int e = std::max(range_exponent(xp, metric), range_exponent(cp, metric));
  xp = scale_by_pow2(xp, -e);
  cp = scale_by_pow2(cp, -e);
  const Tensor shift = translation(cp, metric);  // from the centroids: k rows, not n
  xp = translated(xp, shift);
  cp = translated(cp, shift);
  const int64_t n = xp.size(0), k = cp.size(0);
  const int64_t rows = std::min<int64_t>(KMeansOptions{}.block_rows, n);
  Tensor workspace = Tensor::empty({(rows + 1) * k}, xp.dtype(), xp.device());
  Tensor labels = Tensor::empty({n}, kInt64, xp.device());
  Tensor dist = Tensor::empty({n}, kFloat64, xp.device());
  ops::kmeans_assign_into(xp, cp, metric == KMeansMetric::cosine, rows, workspace, labels, dist);
  return labels;
}

double adjusted_rand_index(const Tensor& a, const Tensor& b) {
  const char* op = "adjusted_rand_index";
  for (const Tensor* t : {&a, &b}) {
    CF_CHECK(t->defined(), ValueError, "[", op, "] undefined labels tensor");
    CF_CHECK(t->dim() == 1 && t->dtype() == kInt64, DTypeError, "[", op,
             "] labels must be 1-d int64, got ", t->describe());
  }
  CF_CHECK(a.numel() == b.numel(), ShapeError, "[", op, "] labelings of different lengths: ",
           a.describe(), " vs ", b.describe());
  std::vector<int64_t> la = a.to_vector<int64_t>(), lb = b.to_vector<int64_t>();
  const int64_t n = int64_t(la.size());
  for (int64_t i = 0; i < n; ++i)
    CF_CHECK(la[size_t(i)] >= 0 && lb[size_t(i)] >= 0, ValueError, "[", op,
             "] labels must be non-negative, got (", la[size_t(i)], ", ", lb[size_t(i)],
             ") at position ", i);
  auto comb2 = [](double m) { return m * (m - 1) / 2; };
  std::unordered_map<int64_t, int64_t> ca, cb;
  std::unordered_map<int64_t, std::unordered_map<int64_t, int64_t>> cab;  // contingency table
  for (int64_t i = 0; i < n; ++i) {
    ++ca[la[size_t(i)]];
    ++cb[lb[size_t(i)]];
    ++cab[la[size_t(i)]][lb[size_t(i)]];
  }
  double sum_ab = 0, sum_a = 0, sum_b = 0;
  for (auto& [ka, row] : cab)
    for (auto& [kb, m] : row) sum_ab += comb2(double(m));
  for (auto& [ka, m] : ca) sum_a += comb2(double(m));
  for (auto& [kb, m] : cb) sum_b += comb2(double(m));
  const double total = comb2(double(n));
  if (total == 0) return 1.0;
  const double expected = sum_a * sum_b / total;
  const double max_index = 0.5 * (sum_a + sum_b);
  if (max_index == expected) return 1.0;  // both trivial (one cluster or all singletons)
  return (sum_ab - expected) / (max_index - expected);
}

}  // namespace cf::nn

// ---------------------------------------------------------------- distributed
// (kmeans.h: kmeans_distributed). Host code in double on this rank's rows; every
// decision (chosen rows, convergence, empty clusters, errors) is taken from
// all-reduced quantities, so all ranks take it together.
namespace cf::nn {

namespace {
double sqdist(const double* a, const double* b, int64_t d) {
  double s = 0;
  for (int64_t t = 0; t < d; ++t) {
    const double e = a[t] - b[t];
    s += e * e;
  }
  return s;
}

// The row with global index g (rows of rank r start at offsets[r]), on every rank:
// its owner writes it, the others add zeros (an exact sum).
std::vector<double> fetch_row(const std::vector<double>& X, const std::vector<int64_t>& offsets, int64_t g,
                              int64_t d) {
  Tensor row = Tensor::zeros({d}, kFloat64);
  const int r = dist::rank();
  if (g >= offsets[size_t(r)] && g < offsets[size_t(r) + 1])
    std::memcpy(row.data<double>(), X.data() + size_t(g - offsets[size_t(r)]) * size_t(d), size_t(d) * sizeof(double));
  dist::all_reduce(row, dist::ReduceOp::sum);
  return row.to_vector<double>();
}
}  // namespace

KMeansResult kmeans_distributed(const Tensor& x_local, const KMeansOptions& o) {
  const char* op = "kmeans_distributed";
  CF_CHECK(dist::is_initialized(), dist::DistError, "[", op,
           "] the process group is not initialised: call cf::dist::init() first");
  if (dist::world_size() == 1) return kmeans(x_local, o);
  // This rank's checks (a shard may have no rows; a NaN, a wrong rank or dtype are errors) run before the
  // ranks meet, and whether they passed travels with the shapes: a rank that threw alone left the others
  // waiting in the exchange until the timeout.
  Tensor xp;
  std::exception_ptr own_error;
  try {
    check_matrix(x_local, op, "x", /*rows_may_be_zero=*/true);
    xp = prepare(x_local, o.metric, op, "x").cpu();
  } catch (const Error&) {
    own_error = std::current_exception();
  }
  const int64_t n = own_error ? 0 : xp.size(0), d = own_error ? 0 : xp.size(1), k = o.k;
  const bool cosine = o.metric == KMeansMetric::cosine;
  // Shapes across ranks: the row counts (offsets), one width, and whether each rank's input passed.
  Tensor nd = Tensor::from_vector(std::vector<int64_t>{n, d, own_error ? 1 : 0}, {1, 3});
  std::vector<int64_t> all = dist::all_gather(nd).to_vector<int64_t>();
  const int W = dist::world_size(), R = dist::rank();
  if (own_error) std::rethrow_exception(own_error);
  const Device dev = x_local.device();  // (read once the input passed: an undefined one threw alone)
  const DType dt = x_local.dtype();
  for (int r = 0; r < W; ++r)
    CF_CHECK(all[size_t(r) * 3 + 2] == 0, dist::DistError, "[", op, "] rank ", r,
             "'s input failed its checks (rank ", r, " reports why); rank ", R, " stops too");
  std::vector<int64_t> offsets(static_cast<size_t>(W) + 1, 0);
  for (int r = 0; r < W; ++r) {
    CF_CHECK(all[size_t(r) * 3 + 1] == d, dist::DistError, "[", op, "] rank ", r, " has rows of width ",
             all[size_t(r) * 3 + 1], ", rank ", R, " of width ", d);
    offsets[size_t(r) + 1] = offsets[size_t(r)] + all[size_t(r) * 3];
  }
  const int64_t N = offsets[size_t(W)];
  check_options(o, N, x_local, op);
  std::vector<double> X = (dt == kFloat64 ? xp : to(xp, kFloat64)).to_vector<double>();
  auto row = [&](int64_t i) { return X.data() + size_t(i) * size_t(d); };
  const int64_t my0 = offsets[size_t(R)];

  // ---- seeding: the draws of init_prepared over the global row indices ----
  std::vector<double> C;  // (k, d) row-major
  C.reserve(size_t(k * d));
  auto add_centre = [&](const std::vector<double>& c) { C.insert(C.end(), c.begin(), c.end()); };
  if (o.init == KMeansInit::random) {
    std::vector<int64_t> perm(static_cast<size_t>(N));
    std::iota(perm.begin(), perm.end(), int64_t(0));
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = i + uniform_index(o.seed, uint64_t(i), N - i);
      std::swap(perm[size_t(i)], perm[size_t(j)]);
      add_centre(fetch_row(X, offsets, perm[size_t(i)], d));
    }
  } else {
    const int64_t trials = 2 + int64_t(std::log(double(k)));
    std::vector<double> D(static_cast<size_t>(n), HUGE_VAL), targets(static_cast<size_t>(trials));
    add_centre(fetch_row(X, offsets, uniform_index(o.seed, 0, N), d));
    for (int64_t s = 1; s < k; ++s) {
      const double* c = C.data() + size_t(s - 1) * size_t(d);
      double local = 0;
      for (int64_t i = 0; i < n; ++i) {
        D[size_t(i)] = std::min(D[size_t(i)], sqdist(row(i), c, d));
        local += D[size_t(i)];
      }
      // Each rank's total, in rank order: the global cumulative sum is theirs in turn.
      std::vector<double> totals = dist::all_gather(Tensor::from_vector(std::vector<double>{local}, {1}))
                                       .to_vector<double>();
      double total = 0;
      std::vector<double> before(static_cast<size_t>(W));
      for (int r = 0; r < W; ++r) {
        before[size_t(r)] = total;
        total += totals[size_t(r)];
      }
      if (!(total > 0))
        throw KMeansTooFewPointsError(str("[", op, "] x (", N, " rows over ", W, " ranks) has only ", s,
                                          " distinct points, fewer than k = ", k),
                                      s);
      for (int64_t l = 0; l < trials; ++l) targets[size_t(l)] = uniform(o.seed, uint64_t(s) * 64 + uint64_t(l)) * total;
      std::sort(targets.begin(), targets.end());
      // Candidates: the global index where the cumulative sum first exceeds each target.
      Tensor cand = Tensor::full({trials + 1}, -1.0, kInt64);
      int64_t* cd = cand.data<int64_t>();
      {
        double cum = before[size_t(R)];
        int64_t l = 0;
        while (l < trials && !(targets[size_t(l)] >= cum)) ++l;  // belongs to an earlier rank
        for (int64_t i = 0; i < n && l < trials; ++i) {
          if (D[size_t(i)] <= 0) continue;
          cd[trials] = my0 + i;  // last positive so far
          cum += D[size_t(i)];
          while (l < trials && cum > targets[size_t(l)]) cd[l++] = my0 + i;
        }
        for (int64_t i = n - 1; i >= 0 && cd[trials] < my0; --i)
          if (D[size_t(i)] > 0) cd[trials] = my0 + i;
      }
      dist::all_reduce(cand, dist::ReduceOp::max);
      for (int64_t l = 0; l < trials; ++l)
        if (cd[l] < 0) cd[l] = cd[trials];  // rounding at the very end of the scan
      // The candidates' rows and their potentials sum_i min(D_i, |x_i - c|^2).
      std::vector<std::vector<double>> rows(static_cast<size_t>(trials));
      Tensor pot = Tensor::zeros({trials}, kFloat64);
      for (int64_t l = 0; l < trials; ++l) {
        rows[size_t(l)] = fetch_row(X, offsets, cd[l], d);
        double p = 0;
        for (int64_t i = 0; i < n; ++i) p += std::min(D[size_t(i)], sqdist(row(i), rows[size_t(l)].data(), d));
        pot.data<double>()[l] = p;
      }
      dist::all_reduce(pot, dist::ReduceOp::sum);
      const double* P = pot.data<double>();
      int64_t best = 0;
      for (int64_t t = 1; t < trials; ++t)
        if (P[t] < P[best]) best = t;
      add_centre(rows[size_t(best)]);
    }
  }
  // Centroids are kept in x's dtype (as kmeans() keeps them), computed in double.
  auto round_to_dtype = [&](std::vector<double>& c) {
    if (dt == kFloat32)
      for (double& v : c) v = double(float(v));
  };
  round_to_dtype(C);

  // ---- Lloyd ----
  KMeansResult res;
  std::vector<int64_t> labels(static_cast<size_t>(n), 0);
  std::vector<double> D(static_cast<size_t>(n), 0);
  // One buffer all-reduced per assignment: sums (k*d), counts (k), inertia, changed.
  Tensor red = Tensor::zeros({k * d + k + 2}, kFloat64);
  double* S = red.data<double>();
  double* cnt = S + k * d;
  auto assign = [&]() {
    // The assignment kernel of kmeans() on the data and centroids in x's dtype.
    Tensor ct = to(Tensor::from_vector(C, {k, d}), dt);
    Tensor lab = n > 0 ? kmeans_assign(xp, ct, o.metric) : Tensor::zeros({0}, kInt64);
    std::vector<int64_t> L = lab.to_vector<int64_t>();
    std::fill(S, S + k * d + k + 2, 0.0);
    double inertia = 0, changed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = L[size_t(i)];
      const double* c = C.data() + size_t(j) * size_t(d);
      D[size_t(i)] = cosine ? 1.0 - std::inner_product(row(i), row(i) + d, c, 0.0) : sqdist(row(i), c, d);
      inertia += D[size_t(i)];
      for (int64_t t = 0; t < d; ++t) S[j * d + t] += row(i)[t];
      cnt[j] += 1;
      if (L[size_t(i)] != labels[size_t(i)]) changed = 1;
    }
    labels = L;
    S[k * d + k] = inertia;
    S[k * d + k + 1] = changed;
    dist::all_reduce(red, dist::ReduceOp::sum);
    res.inertia_history.push_back(S[k * d + k]);
    return S[k * d + k];
  };
  auto has_empty = [&]() {
    int64_t empty = 0;
    for (int64_t j = 0; j < k; ++j) empty += cnt[j] == 0;
    return empty;
  };
  // Farthest-first over all ranks (ties to the lower global index), as kmeans().
  auto reseed = [&]() {
    std::vector<int64_t> empty;
    for (int64_t j = 0; j < k; ++j)
      if (cnt[j] == 0) empty.push_back(j);
    if (empty.empty()) return;
    std::vector<double> F(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) F[size_t(i)] = cosine ? 2 * D[size_t(i)] : D[size_t(i)];
    for (size_t e = 0; e < empty.size(); ++e) {
      int64_t pick = n > 0 ? int64_t(std::max_element(F.begin(), F.end()) - F.begin()) : -1;
      Tensor mine = Tensor::from_vector(std::vector<double>{pick >= 0 ? F[size_t(pick)] : -1.0,
                                                            double(my0 + pick)}, {1, 2});
      std::vector<double> cands = dist::all_gather(mine).to_vector<double>();
      int64_t best = -1;
      for (int r = 0; r < W; ++r)
        if (cands[size_t(r) * 2 + 1] >= double(offsets[size_t(r)]) &&
            (best < 0 || cands[size_t(r) * 2] > cands[size_t(best) * 2]))
          best = r;
      if (best < 0 || !(cands[size_t(best) * 2] > 0))
        throw KMeansTooFewPointsError(str("[", op, "] x (", N, " rows over ", W, " ranks) has fewer distinct points (at most ",
                                          k - int64_t(empty.size() - e), ") than k = ", k, "; cannot fill ",
                                          empty.size() - e, " empty cluster(s)"),
                                      k - int64_t(empty.size() - e));
      std::vector<double> c = fetch_row(X, offsets, int64_t(cands[size_t(best) * 2 + 1]), d);
      round_to_dtype(c);
      std::copy(c.begin(), c.end(), C.begin() + empty[e] * d);
      for (int64_t i = 0; i < n; ++i) F[size_t(i)] = std::min(F[size_t(i)], sqdist(row(i), c.data(), d));
      ++res.reseeded_clusters;
    }
  };

  std::fill(labels.begin(), labels.end(), int64_t(-1));
  const double first_inertia = assign();
  auto step = [&]() {
    mean_update(cnt, S, k, d, cosine, C.data());
    round_to_dtype(C);
    reseed();
  };
  auto unchanged = [&]() { return S[k * d + k + 1] == 0; };
  const double inertia = lloyd_iterations(o, op, first_inertia, res, step, assign, unchanged, has_empty, reseed);
  res.centroids = to(Tensor::from_vector(C, {k, d}), dt).to(dev);
  res.assignments = Tensor::from_vector(labels, {n}).to(dev);
  res.inertia = inertia;
  return res;
}

}  // namespace cf::nn
