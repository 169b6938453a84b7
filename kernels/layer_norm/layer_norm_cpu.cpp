#include <cmath>
#include <vector>

#include "kernels/common/upcast.h"
#include "kernels/common/row_math.h"
#include "kernels/common/parallel.h"
#include "kernels/layer_norm/layer_norm.h"

namespace cf::kernels {

namespace {

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)); }

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n, double eps,
                   const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  const T* xp = x.data<T>();
  const T* w = weight.defined() ? weight.data<T>() : nullptr;
  const T* bb = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  T* mp = mean.data<T>();
  T* rp = rstd.data<T>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xi = xp + r * n;
      T* yi = yp + r * n;
      // Two passes in double: the centred sum of squares does not cancel the way
      // E[x^2] - E[x]^2 does when |mean| >> std.
      // (Eight partial sums each: one accumulator is a chain of dependent adds.)
      const double mu = sum_row(xi, n) / double(n);
      double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; ++j) {
          const double d = double(xi[k + j]) - mu;
          part[j] += d * d;
        }
      for (; k < n; ++k) part[0] += (double(xi[k]) - mu) * (double(xi[k]) - mu);
      const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      const double rs = 1.0 / std::sqrt(ss / double(n) + eps);
      mp[r] = T(mu);
      rp[r] = T(rs);
      // One branch-free loop per case, so each vectorises.
      if (w && bb) {
        for (int64_t i = 0; i < n; ++i) yi[i] = T((double(xi[i]) - mu) * rs * double(w[i]) + double(bb[i]));
      } else if (w) {
        for (int64_t i = 0; i < n; ++i) yi[i] = T((double(xi[i]) - mu) * rs * double(w[i]));
      } else if (bb) {
        for (int64_t i = 0; i < n; ++i) yi[i] = T((double(xi[i]) - mu) * rs + double(bb[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) yi[i] = T((double(xi[i]) - mu) * rs);
      }
    }
  });
}

template <typename T>
void backward_typed(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight, int64_t n, const Tensor& gx, const Tensor& gweight,
                    const Tensor& gbias) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  const T* gp = g.data<T>();
  const T* xp = x.data<T>();
  const T* mp = mean.data<T>();
  const T* rp = rstd.data<T>();
  const T* w = weight.defined() ? weight.data<T>() : nullptr;
  if (gx.defined() && rows > 0) {
    T* op = gx.data<T>();
    parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* gi = gp + r * n;
        const T* xi = xp + r * n;
        T* oi = op + r * n;
        const double mu = double(mp[r]), rs = double(rp[r]);
        double a = 0, c = 0;  // sum(gh), sum(gh * xhat)
        for (int64_t k = 0; k < n; ++k) {
          double gh = double(gi[k]) * (w ? double(w[k]) : 1.0);
          a += gh;
          c += gh * (double(xi[k]) - mu) * rs;
        }
        a /= double(n);
        c /= double(n);
        for (int64_t k = 0; k < n; ++k) {
          double gh = double(gi[k]) * (w ? double(w[k]) : 1.0);
          double xh = (double(xi[k]) - mu) * rs;
          oi[k] = T(rs * (gh - a - xh * c));
        }
      }
    });
  }
  if (!gweight.defined() && !gbias.defined()) return;
  T* gw = gweight.defined() ? gweight.data<T>() : nullptr;
  T* gb = gbias.defined() ? gbias.data<T>() : nullptr;
  // Column sums: each thread owns a range of columns and walks the rows in order,
  // so every sum is taken in the same order whatever the thread count.
  parallel_for(n, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(rows, 1)),
               [&](int64_t b, int64_t e) {
    std::vector<double> aw(size_t(e - b), 0.0), ab(size_t(e - b), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* gi = gp + r * n;
      const T* xi = xp + r * n;
      const double mu = double(mp[r]), rs = double(rp[r]);
      for (int64_t k = b; k < e; ++k) {
        aw[size_t(k - b)] += double(gi[k]) * (double(xi[k]) - mu) * rs;
        ab[size_t(k - b)] += double(gi[k]);
      }
    }
    for (int64_t k = b; k < e; ++k) {
      if (gw) gw[k] = T(aw[size_t(k - b)]);
      if (gb) gb[k] = T(ab[size_t(k - b)]);
    }
  });
}

}  // namespace

void layer_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                            double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (is_low_precision(x.dtype())) {  // float32 copies of every operand, one rounding per output
    Tensor yf = float32_buffer_for(y), mf = float32_buffer_for(mean), rf = float32_buffer_for(rstd);
    forward_typed<float>(upcast_float32(x), upcast_float32(weight), upcast_float32(bias), n, eps, yf, mf, rf);
    downcast_into(yf, y);
    downcast_into(mf, mean);
    downcast_into(rf, rstd);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "layer_norm",
                    forward_typed<scalar_t>(x, weight, bias, n, eps, y, mean, rstd));
}

void layer_norm_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& mean,
                             const Tensor& rstd, const Tensor& weight, int64_t n, const Tensor& gx,
                             const Tensor& gweight, const Tensor& gbias) {
  if (is_low_precision(x.dtype())) {
    auto buf = [](const Tensor& t) { return t.defined() ? float32_buffer_for(t) : t; };
    Tensor gxf = buf(gx), gwf = buf(gweight), gbf = buf(gbias);
    backward_typed<float>(upcast_float32(g), upcast_float32(x), upcast_float32(mean), upcast_float32(rstd),
                          upcast_float32(weight), n, gxf, gwf, gbf);
    if (gx.defined()) downcast_into(gxf, gx);
    if (gweight.defined()) downcast_into(gwf, gweight);
    if (gbias.defined()) downcast_into(gbf, gbias);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "layer_norm",
                    backward_typed<scalar_t>(g, x, mean, rstd, weight, n, gx, gweight, gbias));
}

// ---------------- l2_normalize ----------------

namespace l2_normalize_cpu {
namespace {

// 1 / sqrt(sum x^2 + eps) of a row, the sum in double.
template <typename T>
double row_scale(const T* x, int64_t n, double eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return 1.0 / std::sqrt(s + eps);
}

template <typename T>
void forward_typed(const Tensor& x, int64_t n, double eps, const Tensor& y) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const double s = row_scale(xp + r * n, n, eps);
      for (int64_t i = 0; i < n; ++i) yp[r * n + i] = T(double(xp[r * n + i]) * s);
    }
  });
}

template <typename T>
void backward_typed(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  const T* gp = g.data<T>();
  const T* xp = x.data<T>();
  T* gxp = gx.data<T>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = xp + r * n;
      const T* gr = gp + r * n;
      const double s = row_scale(xr, n, eps);
      double gy = 0;  // g . y
      for (int64_t i = 0; i < n; ++i) gy += double(gr[i]) * double(xr[i]) * s;
      for (int64_t i = 0; i < n; ++i) gxp[r * n + i] = T(s * (double(gr[i]) - double(xr[i]) * s * gy));
    }
  });
}

}  // namespace
}  // namespace l2_normalize_cpu

void l2_normalize_forward_cpu(const Tensor& x, int64_t n, double eps, const Tensor& y) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "l2_normalize", l2_normalize_cpu::forward_typed<scalar_t>(x, n, eps, y));
}

void l2_normalize_backward_cpu(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "l2_normalize", l2_normalize_cpu::backward_typed<scalar_t>(g, x, n, eps, gx));
}

}  // namespace cf::kernels
