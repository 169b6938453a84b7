// Sparse products (autograd/ops/sparse.h): each backward is the other product
// plus a scatter of rows (kernels/sparse).
#include "autograd/ops/sparse.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/dropout_share.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/op_names.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/common.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape.h"
#include "core/cuda_graph.h"
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

namespace cluster_topk_detail {

std::string describe(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

}  // namespace cluster_topk_detail

Tensor cluster_topk_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& top_in,
                              const Tensor& assignment, const Tensor& mass_in, const Tensor& rest_in,
                              const Tensor& key_padding_mask, double scale, bool causal, double dropout,
                              Generator& gen) {
  using cluster_topk_detail::describe;
  using ops::dense_data;
  const char* op = opname::cluster_topk_attention;
  CF_CHECK(q_in.defined() && k_in.defined() && v_in.defined() && top_in.defined() && assignment.defined(),
           ValueError, "[", op, "] q, k, v, top and assignment must be defined");
  if (autocast_dtype() && (is_low_precision(q_in.dtype()) || is_low_precision(k_in.dtype()) ||
                           is_low_precision(v_in.dtype()))) {  // no 16-bit kernels: float32 under autocast
    auto f32 = [](const Tensor& t) { return t.defined() ? autocast::to_float32(t) : t; };
    const Tensor q32 = f32(q_in), k32 = f32(k_in), v32 = f32(v_in), m32 = f32(mass_in), r32 = f32(rest_in);
    AutocastGuard off(std::nullopt);
    return cluster_topk_attention(q32, k32, v32, top_in, assignment, m32, r32, key_padding_mask, scale, causal,
                                  dropout, gen);
  }
  const bool shapes_ok =
      q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4 && top_in.dim() == 4 && assignment.dim() == 3 &&
      k_in.shape()[0] == q_in.shape()[0] && k_in.shape()[1] == q_in.shape()[1] &&
      k_in.shape()[3] == q_in.shape()[3] && v_in.shape()[0] == q_in.shape()[0] &&
      v_in.shape()[1] == q_in.shape()[1] && v_in.shape()[2] == k_in.shape()[2] &&
      top_in.shape()[0] == q_in.shape()[0] && top_in.shape()[1] == q_in.shape()[1] && top_in.shape()[2] >= 1 &&
      assignment.shape() == Shape({q_in.shape()[0], q_in.shape()[1], q_in.shape()[2]});
  CF_CHECK(shapes_ok, ShapeError, "[", op, "] expected q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv), top "
           "(B, H, C, kk) with C >= 1 and assignment (B, H, Nq); got q ", describe(q_in), ", k ", describe(k_in),
           ", v ", describe(v_in), ", top ", describe(top_in), ", assignment ", describe(assignment));
  const int64_t B = q_in.shape()[0], H = q_in.shape()[1], Nq = q_in.shape()[2];
  const int64_t Nk = k_in.shape()[2], Dv = v_in.shape()[3], C = top_in.shape()[2], kk = top_in.shape()[3];
  CF_CHECK((q_in.dtype() == kFloat32 || q_in.dtype() == kFloat64) && k_in.dtype() == q_in.dtype() &&
               v_in.dtype() == q_in.dtype() && (!mass_in.defined() || mass_in.dtype() == q_in.dtype()) &&
               (!rest_in.defined() || rest_in.dtype() == q_in.dtype()),
           DTypeError, "[", op, "] q, k, v, mass and rest must share one dtype, float32 or float64; got q ",
           q_in.dtype(), ", k ", k_in.dtype(), ", v ", v_in.dtype(), ", mass ", describe(mass_in), ", rest ",
           describe(rest_in));
  CF_CHECK(top_in.dtype() == kInt64 && assignment.dtype() == kInt64, DTypeError, "[", op,
           "] top and assignment must be int64, got ", top_in.dtype(), " and ", assignment.dtype());
  CF_CHECK(!mass_in.defined() || mass_in.shape() == Shape({B, H, C}), ShapeError, "[", op, "] mass must be (B, H, C) = (",
           B, ", ", H, ", ", C, "), got ", describe(mass_in));
  CF_CHECK(!rest_in.defined() || rest_in.shape() == Shape({B, H, C, Dv}), ShapeError, "[", op,
           "] rest must be (B, H, C, Dv) = (", B, ", ", H, ", ", C, ", ", Dv, "), got ", describe(rest_in));
  CF_CHECK(!key_padding_mask.defined() || (key_padding_mask.dtype() == kBool && key_padding_mask.dim() == 2 &&
                                           key_padding_mask.shape()[0] == B && key_padding_mask.shape()[1] == Nk),
           ShapeError, "[", op, "] key_padding_mask must be bool (B, Nk) = (", B, ", ", Nk, "), got ",
           describe(key_padding_mask));
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[", op, "] dropout must be in [0, 1), got ", dropout);
  CF_CHECK(scale > 0 && std::isfinite(scale), ValueError, "[", op, "] scale must be finite and > 0, got ", scale);
  ops::check_same_device(op, {&q_in, &k_in, &v_in, &top_in, &assignment, &mass_in, &rest_in, &key_padding_mask});
  const Tensor top = dense_data(top_in), assign = dense_data(assignment);
  if (!ops::indices_known_good()) {
    kernels::check_index_range(op, top, Nk, [op, Nk](int64_t at, int64_t value) {
      throw IndexError(str("[", op, "] top key ", value, " at flat position ", at, " is out of range for ", Nk,
                           " keys"));
    });
    check_indices(
        op, assign, C,
        [op, C](int64_t at, int64_t id) {
          throw IndexError(str("[", op, "] cluster id ", id, " at flat position ", at, " is out of range [-1, ", C,
                               ")"));
        },
        -1);
  }
  const Tensor q = dense_data(q_in), k = dense_data(k_in), v = dense_data(v_in), mass = dense_data(mass_in),
               rest = dense_data(rest_in), kpm = dense_data(key_padding_mask);
  kernels::ClusterTopkParams p;
  p.heads = H;
  p.scale = scale;
  p.causal = causal;
  if (dropout > 0 && Nq * kk > 0) {
    p.dropout = dropout;
    p.dropout_rebase = cuda::philox_rebase_for(gen, q.device(), "cluster_topk_attention");
    p.dropout_seed = gen.seed();
    p.dropout_counter0 = reserve_dropout_counters(gen, uint64_t(B * H * Nq * kk));
  }
  Tensor out = Tensor::empty({B, H, Nq, Dv}, q.dtype(), q.device());
  Tensor o = Tensor::empty({B, H, Nq, Dv}, q.dtype(), q.device());
  Tensor P = Tensor::empty({B, H, Nq, kk}, q.dtype(), q.device());  // the weights, kept for the backward
  kernels::cluster_topk_forward(q, k, v, top, assign, mass, rest, kpm, p, out, o, P);
  if (autograd::any_requires_grad({&q_in, &k_in, &v_in, &mass_in, &rest_in})) {
    autograd::SavedTensor sq(q), sk(k), sv(v), st(top), sa(assign), sm(mass), sp(kpm), so(o), sw(P);
    const bool need_mass = mass_in.defined() && mass_in.requires_grad();
    const bool need_rest = rest_in.defined() && rest_in.requires_grad();
    const bool has_mass = mass_in.defined(), has_rest = rest_in.defined();
    autograd::record(op, {q_in, k_in, v_in, mass_in, rest_in}, out,
                     [sq, sk, sv, st, sa, sm, sp, so, sw, p, need_mass, need_rest, has_mass,
                      has_rest](const Tensor& gout) -> std::vector<Tensor> {
                       const char* name = opname::cluster_topk_attention;
                       const Tensor qv = sq.unpack(name), kv = sk.unpack(name), vv = sv.unpack(name);
                       const Tensor mv = has_mass ? sm.unpack(name) : Tensor();
                       const Tensor pv = sp.defined() ? sp.unpack(name) : Tensor();
                       const Tensor tv = st.unpack(name);
                       Tensor dq = Tensor::empty(qv.shape(), qv.dtype(), qv.device());
                       Tensor dk = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
                       Tensor dv = Tensor::empty(vv.shape(), vv.dtype(), vv.device());
                       const Shape& ts = tv.shape();
                       Tensor dmass = need_mass ? Tensor::empty({ts[0], ts[1], ts[2]}, qv.dtype(), qv.device())
                                                : Tensor();
                       Tensor drest = need_rest ? Tensor::empty({ts[0], ts[1], ts[2], vv.shape()[3]}, qv.dtype(),
                                                                qv.device())
                                                : Tensor();
                       kernels::cluster_topk_backward(qv, kv, vv, tv, sa.unpack(name), mv, pv, p, so.unpack(name),
                                                      sw.unpack(name), contiguous(gout), dq, dk, dv, dmass, drest);
                       return {dq, dk, dv, has_mass ? dmass : Tensor(), has_rest ? drest : Tensor()};
                     });
  }
  return out;
}

}  // namespace cf
