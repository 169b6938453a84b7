// CPU arm of the point-set kernels (kernels/point/point.h): OpenMP over batch
// rows (sampling) and over rows (group maxima).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
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
  if (groups > e) {
    // More groups than entries (ids may be sparse up to 2^62): a row's entries sorted by group instead of a
    // table of every group's maximum, which would take memory and time in `groups`, not in the row.
    parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(e, 1)), [&](int64_t b, int64_t end) {
      std::vector<int64_t> by_group(static_cast<size_t>(e));
      for (int64_t r = b; r < end; ++r) {
        const T* sr = s + r * e;
        const int64_t* gr = grp + r * e;
        std::iota(by_group.begin(), by_group.end(), int64_t(0));
        // (stable: within a group the entries keep their order, so maxima match the table path to the sign of zero)
        std::stable_sort(by_group.begin(), by_group.end(), [gr](int64_t x, int64_t y) { return gr[x] < gr[y]; });
        for (int64_t lo = 0; lo < e;) {
          int64_t hi = lo;
          double v = -std::numeric_limits<double>::infinity();
          for (; hi < e && gr[by_group[size_t(hi)]] == gr[by_group[size_t(lo)]]; ++hi)
            v = std::max(v, double(sr[by_group[size_t(hi)]]));
          for (int64_t i = lo; i < hi; ++i) out[r * e + by_group[size_t(i)]] = std::isfinite(v) ? T(v) : T(0);
          lo = hi;
        }
      }
    });
    return;
  }
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

}  // namespace

void farthest_point_sampling_cpu(const Tensor& points, const Tensor& pad, const Tensor& out) {
  const int64_t b = points.size(0), n = points.size(1), c = points.size(2), m = out.size(1);
  const double* P = points.data<double>();
  const bool* M = pad.defined() ? pad.data<bool>() : nullptr;
  int64_t* O = out.data<int64_t>();
#pragma omp parallel for if (b > 1 && n * m * c > 32768)
  for (int64_t r = 0; r < b; ++r) sample_row(P + r * n * c, M ? M + r * n : nullptr, n, c, m, O + r * m);
}

void group_max_cpu(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out) {
  const int64_t rows = src.size(0), e = src.size(1);
  CF_DISPATCH_FLOAT_STD(src.dtype(), "group_max",
                        group_max_rows(src.data<scalar_t>(), group.data<int64_t>(), rows, e, groups,
                                       out.data<scalar_t>()));
}

}  // namespace cf::kernels
