// CPU reference of the fused neural clustering losses (cluster_loss.h states the contract).
// One sequence of the batch per task: every sum of a sequence runs in a fixed order, and the
// batch's sum adds the sequences' terms in order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cluster_loss/cluster_loss.h"
#include "kernels/common/parallel.h"

namespace cf::kernels {

// (a named namespace around the helpers: the unity build joins this file with others that have a dot())
namespace cluster_loss_cpu {
namespace {

template <typename A, typename B>
double dot(const A* a, const B* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}
template <typename T>
double length(const T* a, int64_t n) {
  return std::sqrt(dot(a, a, n));
}
// 1 / max(|t|, floor): unit(t) = t * scale.
double unit_scale(double len) { return 1.0 / std::max(len, kUnitFloor); }

// out = J^T w, J the Jacobian of unit() at t (of length len): (w - u (u . w)) / |t| with
// u = t / |t| from the floor up, w / floor below it.
template <typename T, typename W, typename O>
void unit_backward(const T* t, double len, const W* w, int64_t n, O* out) {
  if (len < kUnitFloor) {
    for (int64_t i = 0; i < n; ++i) out[i] = O(double(w[i]) / kUnitFloor);
    return;
  }
  const double uw = dot(t, w, n) / len;
  for (int64_t i = 0; i < n; ++i) out[i] = O((double(w[i]) - double(t[i]) / len * uw) / len);
}

// Sequences per task: about kParallelGrain elements of work each.
int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(work, 1)); }

template <typename T>
void l1_forward_typed(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask, ClusterLossParams p,
                      const Tensor& out, const Tensor& counts) {
  const int64_t B = x.shape()[0], N = x.shape()[1], D = x.shape()[2], k = c.shape()[1];
  const T* xp = x.data<T>();
  const T* cp = c.data<T>();
  const int64_t* ip = idx.data<int64_t>();
  const bool* mp = mask.defined() ? mask.data<bool>() : nullptr;
  double* np = counts.data<double>();
  std::vector<double> rows(size_t(B), 0.0);
  parallel_for(B, grain_for(N * D), [&](int64_t b0, int64_t b1) {
    std::vector<double> cs(size_t(k), 1.0);
    for (int64_t b = b0; b < b1; ++b) {
      const T* cb = cp + b * k * D;
      if (p.unit_c)
        for (int64_t i = 0; i < k; ++i) cs[size_t(i)] = unit_scale(length(cb + i * D, D));
      double s = 0;
      int64_t n = 0;
      for (int64_t j = 0; j < N; ++j) {
        if (mp && mp[b * N + j]) continue;
        ++n;
        const int64_t i = ip[b * N + j];
        const T* xr = xp + (b * N + j) * D;
        double phi = dot(xr, cb + i * D, D) * cs[size_t(i)];
        if (p.unit_x) phi *= unit_scale(length(xr, D));
        s += phi;
      }
      np[b] = double(std::max<int64_t>(n, 1));
      rows[size_t(b)] = s / np[b];
    }
  });
  double total = 0;
  for (double r : rows) total += r;
  out.data<T>()[0] = T(B > 0 ? -total / double(B) : 0.0);
}

template <typename T>
void l1_backward_typed(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask, const Tensor& counts,
                       ClusterLossParams p, const Tensor& grad, const Tensor& dx, const Tensor& dc) {
  const int64_t B = x.shape()[0], N = x.shape()[1], D = x.shape()[2], k = c.shape()[1];
  const T* xp = x.data<T>();
  const T* cp = c.data<T>();
  const int64_t* ip = idx.data<int64_t>();
  const bool* mp = mask.defined() ? mask.data<bool>() : nullptr;
  const double* np = counts.data<double>();
  T* dxp = dx.defined() ? dx.data<T>() : nullptr;
  T* dcp = dc.data<T>();
  const double g = double(grad.data<T>()[0]);
  parallel_for(B, grain_for(N * D), [&](int64_t b0, int64_t b1) {
    std::vector<double> acc(static_cast<size_t>(k * D)), w(static_cast<size_t>(D));
    std::vector<double> cs(size_t(k), 1.0), clen(size_t(k), 0.0);
    for (int64_t b = b0; b < b1; ++b) {
      const double sb = -g / (double(B) * np[b]);  // d out / d phi_bj
      const T* cb = cp + b * k * D;
      if (p.unit_c)
        for (int64_t i = 0; i < k; ++i) {
          clen[size_t(i)] = length(cb + i * D, D);
          cs[size_t(i)] = unit_scale(clen[size_t(i)]);
        }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < N; ++j) {
        T* dr = dxp ? dxp + (b * N + j) * D : nullptr;
        if (mp && mp[b * N + j]) {
          if (dr) std::fill(dr, dr + D, T(0));
          continue;
        }
        const int64_t i = ip[b * N + j];
        const T* xr = xp + (b * N + j) * D;
        const T* cr = cb + i * D;
        const double xlen = p.unit_x ? length(xr, D) : 0.0, xs = p.unit_x ? unit_scale(xlen) : 1.0;
        double* a = acc.data() + i * D;  // sum of the cluster's unit?(x_j)
        for (int64_t d = 0; d < D; ++d) a[d] += double(xr[d]) * xs;
        if (!dr) continue;
        const double f = sb * cs[size_t(i)];  // d out / d unit?(x_j) = sb unit?(c_i)
        if (!p.unit_x) {
          for (int64_t d = 0; d < D; ++d) dr[d] = T(f * double(cr[d]));
          continue;
        }
        for (int64_t d = 0; d < D; ++d) w[size_t(d)] = f * double(cr[d]);
        unit_backward(xr, xlen, w.data(), D, dr);
      }
      T* dcb = dcp + b * k * D;
      for (int64_t i = 0; i < k; ++i) {
        double* a = acc.data() + i * D;
        for (int64_t d = 0; d < D; ++d) a[d] *= sb;
        if (p.unit_c)
          unit_backward(cb + i * D, clen[size_t(i)], a, D, dcb + i * D);
        else
          for (int64_t d = 0; d < D; ++d) dcb[i * D + d] = T(a[d]);
      }
    }
  });
}

template <typename T>
void l2_forward_typed(const Tensor& c, bool unit, const Tensor& out) {
  const int64_t B = c.shape()[0], k = c.shape()[1], D = c.shape()[2];
  const T* cp = c.data<T>();
  std::vector<double> rows(size_t(B), 0.0);
  parallel_for(B, grain_for(k * D), [&](int64_t b0, int64_t b1) {
    std::vector<double> cs(size_t(k), 1.0);
    for (int64_t b = b0; b < b1; ++b) {
      const T* cb = cp + b * k * D;
      if (unit)
        for (int64_t i = 0; i < k; ++i) cs[size_t(i)] = unit_scale(length(cb + i * D, D));
      double s = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t prev = (i + k - 1) % k;
        s += dot(cb + i * D, cb + prev * D, D) * cs[size_t(i)] * cs[size_t(prev)];
      }
      rows[size_t(b)] = s;
    }
  });
  double total = 0;
  for (double r : rows) total += r;
  out.data<T>()[0] = T(B > 0 ? -total / (double(B) * double(k)) : 0.0);
}

template <typename T>
void l2_backward_typed(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc) {
  const int64_t B = c.shape()[0], k = c.shape()[1], D = c.shape()[2];
  const T* cp = c.data<T>();
  T* dcp = dc.data<T>();
  const double s = B > 0 ? -double(grad.data<T>()[0]) / (double(B) * double(k)) : 0.0;
  parallel_for(B, grain_for(k * D), [&](int64_t b0, int64_t b1) {
    std::vector<double> cs(size_t(k), 1.0), clen(size_t(k), 0.0), w(static_cast<size_t>(D));
    for (int64_t b = b0; b < b1; ++b) {
      const T* cb = cp + b * k * D;
      if (unit)
        for (int64_t i = 0; i < k; ++i) {
          clen[size_t(i)] = length(cb + i * D, D);
          cs[size_t(i)] = unit_scale(clen[size_t(i)]);
        }
      // d / d unit?(c_i) of sum_i unit?(c_i) . unit?(c_i-1) = unit?(c_i-1) + unit?(c_i+1) (cyclic;
      // both are c_0 when k = 1, both the other centroid when k = 2).
      for (int64_t i = 0; i < k; ++i) {
        const int64_t prev = (i + k - 1) % k, next = (i + 1) % k;
        const T* cpv = cb + prev * D;
        const T* cnx = cb + next * D;
        T* o = dcp + (b * k + i) * D;
        for (int64_t d = 0; d < D; ++d)
          w[size_t(d)] = s * (double(cpv[d]) * cs[size_t(prev)] + double(cnx[d]) * cs[size_t(next)]);
        if (unit)
          unit_backward(cb + i * D, clen[size_t(i)], w.data(), D, o);
        else
          for (int64_t d = 0; d < D; ++d) o[d] = T(w[size_t(d)]);
      }
    }
  });
}

template <typename T>
void commitment_forward_typed(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                              const Tensor& out) {
  const int64_t B = x.shape()[0], H = x.shape()[1], N = x.shape()[2], D = x.shape()[3], C = mu.shape()[1];
  const T* xp = x.data<T>();
  const T* mp = mu.data<T>();
  const int64_t* ap = a.data<int64_t>();
  const bool* pad = mask.defined() ? mask.data<bool>() : nullptr;
  std::vector<double> rows(size_t(B * H), 0.0);
  parallel_for(B * H, grain_for(N * D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / H, h = r % H;
      double s = 0;
      for (int64_t n = 0; n < N; ++n) {
        if (pad && pad[b * N + n]) continue;
        const T* xr = xp + (r * N + n) * D;
        const T* cr = mp + (h * C + ap[r * N + n]) * D;
        for (int64_t d = 0; d < D; ++d) {
          const double e = double(xr[d]) - double(cr[d]);
          s += e * e;
        }
      }
      rows[size_t(r)] = s;
    }
  });
  double total = 0;
  for (double r : rows) total += r;
  out.data<T>()[0] = T(scale * total);
}

template <typename T>
void commitment_backward_typed(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                               const Tensor& grad, const Tensor& dx) {
  const int64_t B = x.shape()[0], H = x.shape()[1], N = x.shape()[2], D = x.shape()[3], C = mu.shape()[1];
  const T* xp = x.data<T>();
  const T* mp = mu.data<T>();
  const int64_t* ap = a.data<int64_t>();
  const bool* pad = mask.defined() ? mask.data<bool>() : nullptr;
  T* dp = dx.data<T>();
  const double f = 2.0 * scale * double(grad.data<T>()[0]);
  parallel_for(B * H * N, grain_for(D), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * N), h = (t / N) % H, n = t % N;
      T* o = dp + t * D;
      if (pad && pad[b * N + n]) {
        for (int64_t d = 0; d < D; ++d) o[d] = T(0);
        continue;
      }
      const T* xr = xp + t * D;
      const T* cr = mp + (h * C + ap[t]) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = T(f * (double(xr[d]) - double(cr[d])));
    }
  });
}

}  // namespace
}  // namespace cluster_loss_cpu

void commitment_forward_cpu(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                            const Tensor& out) {
  if (x.dtype() == kFloat64)
    cluster_loss_cpu::commitment_forward_typed<double>(x, mu, a, mask, scale, out);
  else
    cluster_loss_cpu::commitment_forward_typed<float>(x, mu, a, mask, scale, out);
}

void commitment_backward_cpu(const Tensor& x, const Tensor& mu, const Tensor& a, const Tensor& mask, double scale,
                             const Tensor& grad, const Tensor& dx) {
  if (x.dtype() == kFloat64)
    cluster_loss_cpu::commitment_backward_typed<double>(x, mu, a, mask, scale, grad, dx);
  else
    cluster_loss_cpu::commitment_backward_typed<float>(x, mu, a, mask, scale, grad, dx);
}

void clustering_loss_forward_cpu(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                 ClusterLossParams p, const Tensor& out, const Tensor& counts) {
  if (x.dtype() == kFloat64)
    cluster_loss_cpu::l1_forward_typed<double>(x, c, idx, mask, p, out, counts);
  else
    cluster_loss_cpu::l1_forward_typed<float>(x, c, idx, mask, p, out, counts);
}

void clustering_loss_backward_cpu(const Tensor& x, const Tensor& c, const Tensor& idx, const Tensor& mask,
                                  const Tensor& counts, ClusterLossParams p, const Tensor& grad, const Tensor& dx,
                                  const Tensor& dc) {
  if (x.dtype() == kFloat64)
    cluster_loss_cpu::l1_backward_typed<double>(x, c, idx, mask, counts, p, grad, dx, dc);
  else
    cluster_loss_cpu::l1_backward_typed<float>(x, c, idx, mask, counts, p, grad, dx, dc);
}

void centroid_sorting_loss_forward_cpu(const Tensor& c, bool unit, const Tensor& out) {
  if (c.dtype() == kFloat64)
    cluster_loss_cpu::l2_forward_typed<double>(c, unit, out);
  else
    cluster_loss_cpu::l2_forward_typed<float>(c, unit, out);
}

void centroid_sorting_loss_backward_cpu(const Tensor& c, bool unit, const Tensor& grad, const Tensor& dc) {
  if (c.dtype() == kFloat64)
    cluster_loss_cpu::l2_backward_typed<double>(c, unit, grad, dc);
  else
    cluster_loss_cpu::l2_backward_typed<float>(c, unit, grad, dc);
}

}  // namespace cf::kernels
