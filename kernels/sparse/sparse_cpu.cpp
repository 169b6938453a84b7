// CPU arm of the sparse products (kernels/sparse/sparse.h): OpenMP over rows,
// and over groups for the scatter (rows of one group may hit the same key, so
// a group is summed serially in a fixed order).
#include <algorithm>

#include "kernels/common/parallel.h"
#include "kernels/sparse/sparse.h"

namespace cf::kernels {

namespace {

// Rows per parallel chunk: a row costs K * D multiply-adds.
int64_t grain_rows(int64_t work_per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_row, 1)); }

template <typename T>
void dot_rows(const T* q, const T* k, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
              int64_t d) {
  parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* qr = q + r * d;
      const T* kg = k + (r / n) * m * d;
      for (int64_t t = 0; t < kk; ++t) {
        const T* kr = kg + idx[r * kk + t] * d;
        T s = 0;
        // omp simd: the reduction may be reordered into vector lanes (a fixed
        // order for a given build, so results stay reproducible).
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < d; ++j) s += qr[j] * kr[j];
        out[r * kk + t] = s;
      }
    }
  });
}

template <typename T>
void wsum_rows(const T* w, const T* v, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
               int64_t d) {
  parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      T* o = out + r * d;
      for (int64_t j = 0; j < d; ++j) o[j] = 0;
      const T* vg = v + (r / n) * m * d;
      for (int64_t t = 0; t < kk; ++t) {
        const T c = w[r * kk + t];
        if (c == T(0)) continue;
        const T* vr = vg + idx[r * kk + t] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += c * vr[j];
      }
    }
  });
}

template <typename T>
void scatter_groups(const T* c, const T* x, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m,
                    int64_t kk, int64_t d) {
  parallel_for(g, 0, [&](int64_t b, int64_t e) {
    for (int64_t gg = b; gg < e; ++gg) {
      T* og = out + gg * m * d;
      for (int64_t r = gg * n; r < (gg + 1) * n; ++r) {
        const T* xr = x + r * d;
        for (int64_t t = 0; t < kk; ++t) {
          const T cv = c[r * kk + t];
          if (cv == T(0)) continue;
          T* o = og + idx[r * kk + t] * d;
          for (int64_t j = 0; j < d; ++j) o[j] += cv * xr[j];
        }
      }
    }
  });
}

}  // namespace

void sparse_dot_cpu(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  const int64_t g = q.size(0), n = q.size(1), d = q.size(2), m = k.size(1), kk = idx.size(2);
  CF_DISPATCH_FLOAT_STD(q.dtype(), "sparse_dot",
                    dot_rows(q.data<scalar_t>(), k.data<scalar_t>(), idx.data<int64_t>(), out.data<scalar_t>(), g,
                             n, m, kk, d));
}

void sparse_weighted_sum_cpu(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  const int64_t g = w.size(0), n = w.size(1), kk = w.size(2), m = v.size(1), d = v.size(2);
  CF_DISPATCH_FLOAT_STD(w.dtype(), "sparse_weighted_sum",
                    wsum_rows(w.data<scalar_t>(), v.data<scalar_t>(), idx.data<int64_t>(), out.data<scalar_t>(), g,
                              n, m, kk, d));
}

void sparse_scatter_rows_cpu(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  const int64_t g = c.size(0), n = c.size(1), kk = c.size(2), d = x.size(2), m = out.size(1);
  CF_DISPATCH_FLOAT_STD(x.dtype(), "sparse_scatter_rows",
                    scatter_groups(c.data<scalar_t>(), x.data<scalar_t>(), idx.data<int64_t>(),
                                   out.data<scalar_t>(), g, n, m, kk, d));
}

}  // namespace cf::kernels
