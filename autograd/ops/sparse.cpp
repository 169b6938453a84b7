// Sparse products (autograd/ops/sparse.h): each backward is the other product
// plus a scatter of rows (kernels/sparse).
#include "autograd/ops/sparse.h"

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/op_names.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "core/error.h"
#include "kernels/sparse/sparse.h"
#include "kernels/index/index.h"

namespace cf {

namespace {

// The index scan (a pass over memory on the CPU, a kernel and a deferred flag on CUDA) is skipped for
// an index cf built or already checked (ops::KnownGoodIndices: clustered attention's top-k tables, a
// backward reusing its forward's index); the metadata checks stay.
void check_args(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn,
                const Tensor& idx, int64_t a_last) {
  CF_CHECK(a.defined() && b.defined() && idx.defined(), ValueError, "[", op, "] ", an, ", ", bn,
           " and idx must be defined");
  CF_CHECK(a.device() == b.device() && idx.device() == a.device(), DeviceError, "[", op, "] ", an, ", ", bn,
           " and idx must be on one device, got ", an, " on ", a.device(), ", ", bn, " on ", b.device(),
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
  if (ops::indices_known_good()) return;
  const int64_t m = b.shape()[1];
  kernels::check_index_range(op, idx, m, [op, bn, m](int64_t at, int64_t value) {
    throw IndexError(str("[", op, "] idx value ", value, " at flat position ", at, " is out of range for ", bn,
                         " with ", m, " rows"));
  });
}

// (G, M, D): the transpose of both products with respect to their gathered operand.
Tensor scatter_rows(const Tensor& c, const Tensor& x, const Tensor& idx, int64_t m) {
  Tensor out = Tensor::zeros({c.shape()[0], m, x.shape()[2]}, x.dtype(), x.device());
  kernels::sparse_scatter_rows(contiguous(c), contiguous(x), idx, out);
  return out;
}

}  // namespace

Tensor sparse_dot(const Tensor& q_in, const Tensor& k_in, const Tensor& idx_in) {
  const char* op = opname::sparse_dot;
  Tensor idx = idx_in.defined() ? contiguous(idx_in) : idx_in;
  check_args(op, q_in, "q", k_in, "k", idx, -1);
  CF_CHECK(q_in.shape()[2] == k_in.shape()[2], ShapeError, "[sparse_dot] q ", shape_str(q_in.shape()), " and k ",
           shape_str(k_in.shape()), " must share the last dimension");
  Tensor q = contiguous(q_in.detach()), k = contiguous(k_in.detach());
  const int64_t g = q.shape()[0], n = q.shape()[1], m = k.shape()[1], kk = idx.shape()[2];
  Tensor out = Tensor::empty({g, n, kk}, q.dtype(), q.device());
  kernels::sparse_dot(q, k, idx, out);
  if (autograd::any_requires_grad({&q_in, &k_in})) {
    autograd::SavedTensor sq(q), sk(k), si(idx);
    const bool need_q = q_in.requires_grad(), need_k = k_in.requires_grad();
    autograd::record(op, {q_in, k_in}, out, [sq, sk, si, need_q, need_k, m](const Tensor& gout) {
      Tensor i = si.unpack(opname::sparse_dot), dq, dk;
      // dq[n] = sum_t g[n, t] k[idx[n, t]]; dk[idx[n, t]] += g[n, t] q[n].
      ops::KnownGoodIndices checked;  // (i passed the forward's range check against k's rows)
      if (need_q) dq = sparse_weighted_sum(gout, sk.unpack(opname::sparse_dot), i);
      if (need_k) dk = scatter_rows(gout, sq.unpack(opname::sparse_dot), i, m);
      return std::vector<Tensor>{dq, dk};
    });
  }
  return out;
}

Tensor sparse_weighted_sum(const Tensor& w_in, const Tensor& v_in, const Tensor& idx_in) {
  const char* op = opname::sparse_weighted_sum;
  Tensor idx = idx_in.defined() ? contiguous(idx_in) : idx_in;
  check_args(op, w_in, "w", v_in, "v", idx, idx_in.defined() && idx_in.dim() == 3 ? idx_in.shape()[2] : -1);
  Tensor w = contiguous(w_in.detach()), v = contiguous(v_in.detach());
  const int64_t g = w.shape()[0], n = w.shape()[1], m = v.shape()[1], d = v.shape()[2];
  Tensor out = Tensor::empty({g, n, d}, w.dtype(), w.device());
  kernels::sparse_weighted_sum(w, v, idx, out);
  if (autograd::any_requires_grad({&w_in, &v_in})) {
    autograd::SavedTensor sw(w), sv(v), si(idx);
    const bool need_w = w_in.requires_grad(), need_v = v_in.requires_grad();
    autograd::record(op, {w_in, v_in}, out, [sw, sv, si, need_w, need_v, m](const Tensor& gout) {
      Tensor i = si.unpack(opname::sparse_weighted_sum), dw, dv;
      // dw[n, t] = g[n] . v[idx[n, t]]; dv[idx[n, t]] += w[n, t] g[n].
      ops::KnownGoodIndices checked;  // (i passed the forward's range check against v's rows)
      if (need_w) dw = sparse_dot(gout, sv.unpack(opname::sparse_weighted_sum), i);
      if (need_v) dv = scatter_rows(sw.unpack(opname::sparse_weighted_sum), gout, i, m);
      return std::vector<Tensor>{dw, dv};
    });
  }
  return out;
}

}  // namespace cf
