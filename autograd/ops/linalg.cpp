#include "autograd/autocast.h"
#include "autograd/op_names.h"
#include "autograd/ops/linalg.h"

#include <algorithm>

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/matmul.h"

namespace cf {

namespace {

// A view BLAS can read: the last two axes must have a unit stride somewhere.
Tensor blas_ready(const Tensor& t) {
  int64_t nd = t.dim();
  if (kernels::blas_compatible(t.shape()[size_t(nd - 2)], t.shape()[size_t(nd - 1)],
                               t.strides()[size_t(nd - 2)], t.strides()[size_t(nd - 1)]))
    return t;
  return contiguous(t);
}

// The forward on >= 2-d operands, no autograd.
Tensor matmul_raw(const Tensor& a, const Tensor& b) {
  int64_t M = a.shape()[size_t(a.dim() - 2)], K = a.shape()[size_t(a.dim() - 1)];
  int64_t N = b.shape()[size_t(b.dim() - 1)];
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(ba, bb, opname::matmul);
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  NoGradGuard ng;
  // A batch of left operands times one shared right operand (a Linear layer on
  // (B, N, D) input, a window batch): one (batch * M, K) @ (K, N) GEMM instead of
  // a GEMM per batch entry. Tiny per-entry GEMMs spent their time in BLAS call
  // overhead (millions of 8 x 32 x 32 products in a Cluster-Former test).
  if (numel_of(bb) == 1 && numel_of(ba) > 1 && a.is_contiguous()) {
    Tensor rows = reshape(a, {numel_of(ba) * M, K});
    return reshape(matmul_raw(rows, reshape(b, {K, N})), so);
  }
  Tensor ae = expand(blas_ready(a), sa), be = expand(blas_ready(b), sb);
  Tensor out = Tensor::empty(so, a.dtype(), a.device());
  kernels::matmul(ae, be, out);
  return out;
}

// dL/dB = A^T G summed over the batch axes B was broadcast along. When one B
// served the whole batch (see matmul_raw) and A and G fold into rows, that sum is
// one (K, batch * M) @ (batch * M, N) GEMM.
Tensor weight_grad(const Tensor& av, const Shape& b_shape, const Tensor& g2) {
  const int64_t nd = g2.dim(), K = av.shape()[size_t(av.dim() - 1)], N = g2.shape()[size_t(nd - 1)];
  const int64_t rows = numel_of(g2.shape()) / std::max<int64_t>(N, 1);
  const bool shared_b = numel_of(Shape(b_shape.begin(), b_shape.end() - 2)) == 1;
  const bool a_full = numel_of(av.shape()) == rows * K;  // A not broadcast along the batch
  if (shared_b && nd > 2 && a_full && rows > g2.shape()[size_t(nd - 2)]) {
    NoGradGuard ng;
    Tensor at = transpose(reshape(contiguous(av), {rows, K}), 0, 1);
    return reshape(matmul_raw(at, reshape(contiguous(g2), {rows, N})), b_shape);
  }
  return sum_to(matmul_raw(transpose(av, -1, -2), g2), b_shape);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  ops::check_defined(a, opname::matmul, "a");
  ops::check_defined(b, opname::matmul, "b");
  ops::check_same_device(opname::matmul, {&a, &b});
  if (autocast_dtype()) {  // autocast: the product runs in the low dtype (tensor cores on CUDA)
    Tensor la = autocast::to_low(a), lb = autocast::to_low(b);
    if (!la.is_same(a) || !lb.is_same(b)) return matmul(la, lb);
  }
  ops::check_float(a, opname::matmul, "a");
  ops::check_same_dtype(opname::matmul, {&a, &b});
  CF_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError, "[matmul] needs operands of at least 1 dimension: ",
           shape_str(a.shape()), " @ ", shape_str(b.shape()));
  Tensor a2 = a.dim() == 1 ? reshape(a.detach(), {1, a.shape()[0]}) : a.detach();
  Tensor b2 = b.dim() == 1 ? reshape(b.detach(), {b.shape()[0], 1}) : b.detach();
  CF_CHECK(a2.shape().back() == b2.shape()[size_t(b2.dim() - 2)], ShapeError,
           "[matmul] shape mismatch: ", shape_str(a.shape()), " @ ", shape_str(b.shape()));
  Tensor full = matmul_raw(a2, b2);
  // Drop the axes added for 1-d operands.
  Shape out_shape(full.shape().begin(), full.shape().end() - 2);
  if (a.dim() > 1) out_shape.push_back(full.shape()[size_t(full.dim() - 2)]);
  if (b.dim() > 1) out_shape.push_back(full.shape().back());
  Tensor out = reshape(full, out_shape);
  if (autograd::any_requires_grad({&a, &b})) {
    // dL/dA = G B^T, dL/dB = A^T G, summed over broadcast batch axes: A is saved only for B's gradient and
    // B only for A's (PyTorch's rule: x @ W with W written in place before a backward that wants W's
    // gradient alone, x^T G, was refused)
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::SavedTensor s_a(need_b ? a2 : Tensor()), s_b(need_a ? b2 : Tensor());
    Shape full_shape = full.shape(), as = a.shape(), bs = b.shape(), a2s = a2.shape(), b2s = b2.shape();
    autograd::record(opname::matmul, {a, b}, out,
                     [s_a, s_b, full_shape, as, bs, a2s, b2s, need_a, need_b](const Tensor& g) -> std::vector<Tensor> {
      Tensor g2 = reshape(g, full_shape);
      Tensor ga, gb;
      if (need_a) ga = reshape(sum_to(matmul_raw(g2, transpose(s_b.unpack(opname::matmul), -1, -2)), a2s), as);
      if (need_b) gb = reshape(weight_grad(s_a.unpack(opname::matmul), b2s, g2), bs);
      return {ga, gb};
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const char* op = opname::linear;
  ops::check_defined(x, op, "x");
  ops::check_defined(weight, op, "weight");
  ops::check_same_device(op, {&x, &weight, &bias});
  if (autocast_dtype()) {  // as matmul: the product (and the bias with it) in the low dtype
    Tensor lx = autocast::to_low(x), lw = autocast::to_low(weight), lb = bias.defined() ? autocast::to_low(bias) : bias;
    if (!lx.is_same(x) || !lw.is_same(weight) || !lb.is_same(bias)) return linear(lx, lw, lb);
  }
  ops::check_float(x, op, "x");
  ops::check_same_dtype(op, {&x, &weight, &bias});
  CF_CHECK(weight.dim() == 2, ShapeError, "[linear] weight must be 2-d (out_features, in_features), got ",
           shape_str(weight.shape()));
  const int64_t out_f = weight.shape()[0], in_f = weight.shape()[1];
  CF_CHECK(x.dim() >= 1 && x.shape().back() == in_f, ShapeError, "[linear] x ", shape_str(x.shape()),
           " does not end in weight ", shape_str(weight.shape()), "'s in_features ", in_f);
  if (bias.defined())
    CF_CHECK(bias.dim() == 1 && bias.shape()[0] == out_f, ShapeError, "[linear] bias must be (", out_f,
             ") for weight ", shape_str(weight.shape()), ", got ", shape_str(bias.shape()));
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  const int64_t rows = numel_of(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor x2, y;
  {
    NoGradGuard ng;
    x2 = reshape(x.detach(), {rows, in_f});
    y = matmul_raw(x2, transpose(weight.detach(), 0, 1));  // (rows, out), fresh
    if (bias.defined()) kernels::binary(kernels::BinaryOp::Add, y, reshape(bias.detach(), {1, out_f}), y);
  }
  Tensor out = reshape(y, out_shape);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    // Each input saved only for the others' gradients (matmul's rule): x for W's, W for x's.
    const bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
    autograd::SavedTensor s_x(need_w ? x2 : Tensor()), s_w(need_x ? weight.detach() : Tensor());
    std::vector<Tensor> inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    autograd::record(op, inputs, out,
                     [s_x, s_w, xs = x.shape(), rows, out_f, need_x, need_w, need_b, has_b = bias.defined()](
                         const Tensor& g) -> std::vector<Tensor> {
                       const Tensor g2 = reshape(g, {rows, out_f});
                       std::vector<Tensor> grads(has_b ? 3 : 2);
                       if (need_x) grads[0] = reshape(matmul_raw(g2, s_w.unpack(opname::linear)), xs);  // g W
                       if (need_w) grads[1] = matmul_raw(transpose(g2, 0, 1), s_x.unpack(opname::linear));  // g^T x
                       if (need_b) grads[2] = sum(g2, {0});
                       return grads;
                     });
    out.grad_fn()->forward_macs = rows * out_f * in_f;  // the product's, as a matmul node counts (nn/cost.h)
  }
  return out;
}

}  // namespace cf
