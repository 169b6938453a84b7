#include "nn/attention/sparse_products.h"

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops/elementwise.h"
#include "core/error.h"
#include "kernels/common/parallel.h"

namespace cf {
namespace nn {

namespace {

void check_args(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn,
                const Tensor& idx, int64_t a_last) {
  CF_CHECK(a.defined() && b.defined() && idx.defined(), ValueError, "[", op, "] ", an, ", ", bn,
           " and idx must be defined");
  CF_CHECK(a.device().is_cpu() && b.device().is_cpu() && idx.device().is_cpu(), NotImplementedError, "[", op,
           "] runs on the CPU only (no CUDA kernel yet); got ", an, " on ", a.device(), ", ", bn, " on ", b.device(),
           ", idx on ", idx.device());
  CF_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), DTypeError, "[", op, "] ", an, " and ", bn,
           " must share one float dtype, got ", a.dtype(), " and ", b.dtype());
  CF_CHECK(idx.dtype() == kInt64, DTypeError, "[", op, "] idx must be int64, got ", idx.dtype());
  CF_CHECK(a.dim() == 3 && b.dim() == 3 && idx.dim() == 3 && a.shape()[0] == b.shape()[0] &&
               idx.shape()[0] == a.shape()[0] && idx.shape()[1] == a.shape()[1] &&
               (a_last < 0 || a.shape()[2] == a_last),
           ShapeError, "[", op, "] expected ", an, " (G, N, ", (a_last < 0 ? std::string("D") : std::to_string(a_last)),
           "), ", bn, " (G, M, D), idx (G, N, K); got ", an, " ", shape_str(a.shape()), ", ", bn, " ",
           shape_str(b.shape()), ", idx ", shape_str(idx.shape()));
  const int64_t m = b.shape()[1];
  const int64_t* ip = idx.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    CF_CHECK(ip[i] >= 0 && ip[i] < m, IndexError, "[", op, "] idx value ", ip[i], " at flat position ", i,
             " is out of range for ", bn, " with ", m, " rows");
}

// Rows per parallel chunk: a row costs K * D multiply-adds.
int64_t grain_rows(int64_t work_per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_row, 1)); }

template <typename T>
void dot_kernel(const T* q, const T* k, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
                int64_t d) {
  kernels::parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
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
void wsum_kernel(const T* w, const T* v, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
                 int64_t d) {
  kernels::parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
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

// out[g, idx[g, n, t], :] += c[g, n, t] * x[g, n, :]; parallel over groups (rows
// of one group may hit the same key), serial inside a group so the sum order is fixed.
template <typename T>
void scatter_kernel(const T* c, const T* x, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m,
                    int64_t kk, int64_t d) {
  (void)m;
  kernels::parallel_for(g, 0, [&](int64_t b, int64_t e) {
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

// (G, M, D): the transpose of both products with respect to their gathered operand.
Tensor scatter_rows(const Tensor& c, const Tensor& x, const Tensor& idx, int64_t m) {
  const int64_t g = c.shape()[0], n = c.shape()[1], kk = c.shape()[2], d = x.shape()[2];
  Tensor out = Tensor::zeros({g, m, d}, x.dtype());
  Tensor cc = contiguous(c), xc = contiguous(x);
  if (x.dtype() == kFloat32)
    scatter_kernel(cc.data<float>(), xc.data<float>(), idx.data<int64_t>(), out.data<float>(), g, n, m, kk, d);
  else
    scatter_kernel(cc.data<double>(), xc.data<double>(), idx.data<int64_t>(), out.data<double>(), g, n, m, kk, d);
  return out;
}

}  // namespace

Tensor sparse_dot(const Tensor& q_in, const Tensor& k_in, const Tensor& idx_in) {
  const char* op = "sparse_dot";
  Tensor idx = idx_in.defined() ? contiguous(idx_in) : idx_in;
  check_args(op, q_in, "q", k_in, "k", idx, -1);
  CF_CHECK(q_in.shape()[2] == k_in.shape()[2], ShapeError, "[sparse_dot] q ", shape_str(q_in.shape()), " and k ",
           shape_str(k_in.shape()), " must share the last dimension");
  Tensor q = contiguous(q_in.detach()), k = contiguous(k_in.detach());
  const int64_t g = q.shape()[0], n = q.shape()[1], d = q.shape()[2], m = k.shape()[1], kk = idx.shape()[2];
  Tensor out = Tensor::empty({g, n, kk}, q.dtype());
  if (q.dtype() == kFloat32)
    dot_kernel(q.data<float>(), k.data<float>(), idx.data<int64_t>(), out.data<float>(), g, n, m, kk, d);
  else
    dot_kernel(q.data<double>(), k.data<double>(), idx.data<int64_t>(), out.data<double>(), g, n, m, kk, d);
  if (autograd::any_requires_grad({&q_in, &k_in})) {
    autograd::SavedTensor sq(q), sk(k), si(idx);
    const bool need_q = q_in.requires_grad(), need_k = k_in.requires_grad();
    autograd::record(op, {q_in, k_in}, out, [sq, sk, si, need_q, need_k, m](const Tensor& gout) {
      Tensor i = si.unpack("sparse_dot"), dq, dk;
      // dq[n] = sum_t g[n, t] k[idx[n, t]]; dk[idx[n, t]] += g[n, t] q[n].
      if (need_q) dq = sparse_weighted_sum(gout, sk.unpack("sparse_dot"), i);
      if (need_k) dk = scatter_rows(gout, sq.unpack("sparse_dot"), i, m);
      return std::vector<Tensor>{dq, dk};
    });
  }
  return out;
}

Tensor sparse_weighted_sum(const Tensor& w_in, const Tensor& v_in, const Tensor& idx_in) {
  const char* op = "sparse_weighted_sum";
  Tensor idx = idx_in.defined() ? contiguous(idx_in) : idx_in;
  check_args(op, w_in, "w", v_in, "v", idx, idx_in.defined() && idx_in.dim() == 3 ? idx_in.shape()[2] : -1);
  Tensor w = contiguous(w_in.detach()), v = contiguous(v_in.detach());
  const int64_t g = w.shape()[0], n = w.shape()[1], kk = w.shape()[2], m = v.shape()[1], d = v.shape()[2];
  Tensor out = Tensor::empty({g, n, d}, w.dtype());
  if (w.dtype() == kFloat32)
    wsum_kernel(w.data<float>(), v.data<float>(), idx.data<int64_t>(), out.data<float>(), g, n, m, kk, d);
  else
    wsum_kernel(w.data<double>(), v.data<double>(), idx.data<int64_t>(), out.data<double>(), g, n, m, kk, d);
  if (autograd::any_requires_grad({&w_in, &v_in})) {
    autograd::SavedTensor sw(w), sv(v), si(idx);
    const bool need_w = w_in.requires_grad(), need_v = v_in.requires_grad();
    autograd::record(op, {w_in, v_in}, out, [sw, sv, si, need_w, need_v, m](const Tensor& gout) {
      Tensor i = si.unpack("sparse_weighted_sum"), dw, dv;
      // dw[n, t] = g[n] . v[idx[n, t]]; dv[idx[n, t]] += w[n, t] g[n].
      if (need_w) dw = sparse_dot(gout, sv.unpack("sparse_weighted_sum"), i);
      if (need_v) dv = scatter_rows(sw.unpack("sparse_weighted_sum"), gout, i, m);
      return std::vector<Tensor>{dw, dv};
    });
  }
  return out;
}

}  // namespace nn
}  // namespace cf
