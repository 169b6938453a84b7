// CPU arm of the point-set kernels (kernels/point/point.h): OpenMP over batch
// rows (sampling) and over rows (group maxima).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/dispatch.h"
#include "kernels/common/parallel.h"
#include "kernels/point/point.h"

namespace cf::kernels {

namespace {

// One batch row: P (N, C), pad (N) or null, out (M).
void sample_row(const double* P, const bool* pad, int64_t n, int64_t c, int64_t m, int64_t* out) {
  const double kInf = std::numeric_limits<double>::infinity();
  // dist[i]: squared distance to the nearest point taken; padding ranks below any
  // real point (-1), and a taken point never again (-inf).
  std::vector<double> dist(static_cast<size_t>(n));
  int64_t cur = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    const bool padded = pad && pad[i];
    dist[size_t(i)] = padded ? -1.0 : kInf;
    if (!padded) cur = i;
  }
  for (int64_t j = 0; j < m; ++j) {
    out[j] = cur;
    dist[size_t(cur)] = -kInf;
    const double* pc = P + cur * c;
    int64_t best = -1;
    double best_d = -kInf;
    for (int64_t i = 0; i < n; ++i) {
      double& di = dist[size_t(i)];
      if (di >= 0) {  // real and not taken
        const double* pi = P + i * c;
        double s = 0;
        for (int64_t a = 0; a < c; ++a) {
          const double t = pi[a] - pc[a];
          s += t * t;
        }
        di = std::min(di, s);
      }
      if (di > best_d) {
        best_d = di;
        best = i;
      }
    }
    cur = best < 0 ? 0 : best;
  }
}

template <typename T>
void group_max_rows(const T* s, const int64_t* grp, int64_t rows, int64_t e, int64_t groups, T* out) {
  parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(e, 1)), [&](int64_t b, int64_t end) {
    std::vector<double> mx(static_cast<size_t>(groups));
    for (int64_t r = b; r < end; ++r) {
      std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
      const T* sr = s + r * e;
      const int64_t* gr = grp + r * e;
      for (int64_t i = 0; i < e; ++i) mx[size_t(gr[i])] = std::max(mx[size_t(gr[i])], double(sr[i]));
      for (int64_t i = 0; i < e; ++i) {
        const double v = mx[size_t(gr[i])];
        out[r * e + i] = std::isfinite(v) ? T(v) : T(0);
      }
    }
  });
}

// One row's runs of equal keys: each run's maximum to every entry of the run.
template <typename T>
void group_max_sorted_rows(const T* s, const int64_t* keys, const int64_t* perm, int64_t rows, int64_t e, T* out) {
  parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(e, 1)), [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r) {
      const int64_t* kr = keys + r * e;
      const int64_t* pr = perm + r * e;
      for (int64_t lo = 0; lo < e;) {
        int64_t hi = lo;
        double v = -std::numeric_limits<double>::infinity();
        for (; hi < e && kr[hi] == kr[lo]; ++hi) v = std::max(v, double(s[r * e + pr[hi]]));
        for (int64_t i = lo; i < hi; ++i) out[r * e + pr[i]] = std::isfinite(v) ? T(v) : T(0);
        lo = hi;
      }
    }
  });
}

}  // namespace

void farthest_point_sampling_cpu(const Tensor& points, const Tensor& pad, const Tensor& out) {
  const int64_t b = points.size(0), n = points.size(1), c = points.size(2), m = out.size(1);
  const double* P = points.data<double>();
  const bool* M = pad.defined() ? pad.data<bool>() : nullptr;
  int64_t* O = out.data<int64_t>();
#pragma omp parallel for num_threads(max_threads()) if (b > 1 && n * m * c > kParallelGrain)
  for (int64_t r = 0; r < b; ++r) sample_row(P + r * n * c, M ? M + r * n : nullptr, n, c, m, O + r * m);
}

void group_max_cpu(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out) {
  const int64_t rows = src.size(0), e = src.size(1);
  CF_DISPATCH_FLOAT_STD(src.dtype(), "group_max",
                        group_max_rows(src.data<scalar_t>(), group.data<int64_t>(), rows, e, groups,
                                       out.data<scalar_t>()));
}

void group_max_sorted_cpu(const Tensor& src, const Tensor& keys, const Tensor& perm, const Tensor& out) {
  const int64_t rows = src.size(0), e = src.size(1);
  CF_DISPATCH_FLOAT_STD(src.dtype(), "group_max",
                        group_max_sorted_rows(src.data<scalar_t>(), keys.data<int64_t>(), perm.data<int64_t>(), rows,
                                              e, out.data<scalar_t>()));
}

}  // namespace cf::kernels
