#include <cmath>
#include <limits>

#include "kernels/common/row_math.h"
#include "kernels/common/parallel.h"
#include "kernels/common/upcast.h"
#include "kernels/softmax/softmax.h"

namespace cf::kernels {

namespace {

// Where the rows of a strided tensor start: row r walks every axis except `axis`
// in row-major order; its elements are `step` apart.
struct Rows {
  int nk = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t step = 1;
  int64_t base(int64_t r) const {
    int64_t off = 0;
    for (int d = nk - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[d];
      r /= sizes[d];
    }
    return off;
  }
};

Rows rows_of(const Tensor& t, int64_t axis) {
  Rows r;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d == axis) continue;
    r.sizes[r.nk] = t.shape()[size_t(d)];
    r.strides[r.nk] = t.strides()[size_t(d)];
    ++r.nk;
  }
  r.step = t.strides()[size_t(axis)];
  return r;
}

// Rows handled per thread chunk: enough elements to amortise the thread start.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)); }

template <typename T>
void forward_typed(const Tensor& x, int64_t axis, bool log, const Tensor& y) {
  const int64_t n = x.shape()[size_t(axis)];
  if (x.numel() == 0) return;
  const int64_t nrows = x.numel() / n;
  const Rows xr = rows_of(x, axis), yr = rows_of(y, axis);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const RowMath& rm = row_math();  // the CPU tier's float rows (before the parallel loop: it may throw)
  // One row: max, then sum of exp(x - max) in double, then the normalised write.
  // The strides are parameters so the contiguous call below gets its own unit-stride copy.
  auto row = [&](const T* xi, T* yi, int64_t sx, int64_t sy) {
    T m = -std::numeric_limits<T>::infinity();
    if (sx == 1)
      m = max_row(rm, xi, n, m);
    else
      for (int64_t k = 0; k < n; ++k) m = xi[k * sx] > m ? xi[k * sx] : m;
    bool all_masked = !log && m == -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; all_masked && k < n; ++k) all_masked = !std::isnan(xi[k * sx]);
    if (all_masked) {
      // Every entry masked: the row is all zeros (not NaN), so a query that may
      // attend to nothing outputs zero and passes a zero gradient.
      for (int64_t k = 0; k < n; ++k) yi[k * sy] = T(0);
      return;
    }
    if (sx == 1 && sy == 1) {
      // Contiguous rows: vectorised exp into the output, then normalise (or,
      // for log_softmax, overwrite with the shifted log-probabilities).
      exp_shifted(rm, xi, yi, n, m);
      const double z = sum_row(rm, yi, n);
      if (log) {
        const T lz = T(std::log(z));
        for (int64_t k = 0; k < n; ++k) yi[k] = (xi[k] - m) - lz;
      } else {
        const T inv = T(1.0 / z);
        for (int64_t k = 0; k < n; ++k) yi[k] *= inv;
      }
      return;
    }
    double acc = 0;
    if (log) {
      for (int64_t k = 0; k < n; ++k) acc += double(std::exp(xi[k * sx] - m));
      // (x - max) - log(sum), never x - (max + log(sum)): for |x| >> 1 the rounded
      // shift would cost float32 its low digits.
      const T lz = T(std::log(acc));
      for (int64_t k = 0; k < n; ++k) yi[k * sy] = (xi[k * sx] - m) - lz;
    } else {
      for (int64_t k = 0; k < n; ++k) {
        T e = std::exp(xi[k * sx] - m);
        yi[k * sy] = e;
        acc += double(e);
      }
      const T inv = T(1.0 / acc);
      for (int64_t k = 0; k < n; ++k) yi[k * sy] *= inv;
    }
  };
  parallel_for(nrows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xi = xp + xr.base(r);
      T* yi = yp + yr.base(r);
      if (xr.step == 1 && yr.step == 1)
        row(xi, yi, 1, 1);
      else
        row(xi, yi, xr.step, yr.step);
    }
  });
}

template <typename T>
void backward_typed(const Tensor& y, const Tensor& g, int64_t axis, bool log, const Tensor& gx) {
  const int64_t n = y.shape()[size_t(axis)];
  if (y.numel() == 0) return;
  const int64_t nrows = y.numel() / n;
  const Rows yr = rows_of(y, axis), gr = rows_of(g, axis), or_ = rows_of(gx, axis);
  const T* yp = y.data<T>();
  const T* gp = g.data<T>();
  T* op = gx.data<T>();
  auto row = [&](const T* yi, const T* gi, T* oi, int64_t sy, int64_t sg, int64_t so) {
    double acc = 0;
    if (log) {
      for (int64_t k = 0; k < n; ++k) acc += double(gi[k * sg]);
      const T s = T(acc);
      for (int64_t k = 0; k < n; ++k) oi[k * so] = gi[k * sg] - std::exp(yi[k * sy]) * s;
    } else {
      for (int64_t k = 0; k < n; ++k) acc += double(gi[k * sg]) * double(yi[k * sy]);
      const T dot = T(acc);
      for (int64_t k = 0; k < n; ++k) oi[k * so] = yi[k * sy] * (gi[k * sg] - dot);
    }
  };
  parallel_for(nrows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* yi = yp + yr.base(r);
      const T* gi = gp + gr.base(r);
      T* oi = op + or_.base(r);
      if (yr.step == 1 && gr.step == 1 && or_.step == 1)
        row(yi, gi, oi, 1, 1, 1);
      else
        row(yi, gi, oi, yr.step, gr.step, or_.step);
    }
  });
}

}  // namespace

void softmax_forward_cpu(const Tensor& x, int64_t axis, bool log, const Tensor& y) {
  if (is_low_precision(x.dtype())) {  // float32 statistics, one rounding at the end
    Tensor yf = float32_buffer_for(y);
    forward_typed<float>(upcast_float32(x), axis, log, yf);
    downcast_into(yf, y);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), log ? "log_softmax" : "softmax",
                    forward_typed<scalar_t>(x, axis, log, y));
}

void softmax_backward_cpu(const Tensor& y, const Tensor& g, int64_t axis, bool log,
                          const Tensor& gx) {
  if (is_low_precision(y.dtype())) {
    Tensor gf = float32_buffer_for(gx);
    backward_typed<float>(upcast_float32(y), upcast_float32(g), axis, log, gf);
    downcast_into(gf, gx);
    return;
  }
  CF_DISPATCH_FLOAT_STD(y.dtype(), log ? "log_softmax" : "softmax",
                    backward_typed<scalar_t>(y, g, axis, log, gx));
}

}  // namespace cf::kernels
