#include "nn/attention/attention.h"

#include "autograd/autocast.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

Tensor causal_mask(int64_t nq, int64_t nk, Device device) {
  CF_CHECK(nq >= 0 && nk >= 0, ShapeError, "[causal_mask] negative size: nq=", nq, " nk=", nk);
  // key index > query index + (nk - nq), as one broadcast comparison (parallel for large N).
  Tensor keys = reshape(Tensor::arange(nk, kInt64, device), {1, nk});
  Tensor queries = reshape(Tensor::arange(nq, kInt64, device), {nq, 1}) + double(nk - nq);
  return gt(keys, queries);
}

AttentionArgs autocast_float32_args(const AttentionArgs& args) {
  AttentionArgs a = args;
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.query_input})
    if (t->defined()) *t = autocast::to_float32(*t);
  if (args.k.is_same(args.q)) a.k = a.q;  // shared-QK variants (LSH) still get one tensor
  return a;
}

void check_attention_args(const AttentionArgs& a, const char* who) {
  CF_CHECK(a.q.defined() && a.k.defined() && a.v.defined(), ValueError, "[", who,
           "] q, k and v must all be defined");
  CF_CHECK(a.q.dim() == 4 && a.k.dim() == 4 && a.v.dim() == 4, ShapeError, "[", who,
           "] expected q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv); got q ", shape_str(a.q.shape()),
           ", k ", shape_str(a.k.shape()), ", v ", shape_str(a.v.shape()));
  const Shape &q = a.q.shape(), &k = a.k.shape(), &v = a.v.shape();
  CF_CHECK(q[0] == k[0] && k[0] == v[0] && q[1] == k[1] && k[1] == v[1] && q[3] == k[3] && k[2] == v[2],
           ShapeError, "[", who, "] inconsistent shapes: q ", shape_str(q), ", k ", shape_str(k), ", v ",
           shape_str(v));
  // (the layers' default scale 1/sqrt(Dk) was inf, refused by a kernel as a scale never given)
  CF_CHECK(q[3] >= 1, ShapeError, "[", who, "] q and k have no features (Dk = 0: q ", shape_str(q),
           "): attention scores need Dk >= 1");
  CF_CHECK(a.q.dtype() == a.k.dtype() && a.k.dtype() == a.v.dtype() && is_floating(a.q.dtype()), DTypeError,
           "[", who, "] q, k, v must share one float dtype, got ", a.q.dtype(), ", ", a.k.dtype(), ", ",
           a.v.dtype());
  // 16-bit q, k, v run only under autocast (on tensor cores where a kernel has a 16-bit path, in
  // float32 islands elsewhere; docs/design-notes.md, "Autocast"). Without it every variant failed
  // deep inside, naming a kernel ([hash_codes], [block_attention], [flash_attention], ...).
  CF_CHECK(!is_low_precision(a.q.dtype()) || autocast_dtype(), DTypeError, "[", who, "] q, k, v are ",
           a.q.dtype(), ": attention takes 16-bit inputs only under autocast (cf::AutocastGuard, cf.autocast), "
           "which keeps its softmax and clustering in float32; without autocast give it float32 or float64");
  auto check_mask = [&](const Tensor& m, int64_t n, const char* name) {
    if (!m.defined()) return;
    CF_CHECK(m.dtype() == kBool, DTypeError, "[", who, "] ", name, " must be bool (true = padding), got ",
             m.dtype());
    CF_CHECK(m.dim() == 2 && m.shape()[0] == q[0] && m.shape()[1] == n, ShapeError, "[", who, "] ", name,
             " must be (B, N) = (", q[0], ", ", n, "), got ", shape_str(m.shape()));
  };
  check_mask(a.key_padding_mask, k[2], "key_padding_mask");
  check_mask(a.query_padding_mask, q[2], "query_padding_mask");
}

Tensor dense_block_mask(const AttentionArgs& a) {
  Tensor blocked;
  if (a.key_padding_mask.defined()) {
    const Shape& m = a.key_padding_mask.shape();
    blocked = reshape(a.key_padding_mask, {m[0], 1, 1, m[1]});
  }
  if (a.causal) {
    Tensor c = reshape(causal_mask(a.q.shape()[2], a.k.shape()[2], a.q.device()),
                       {1, 1, a.q.shape()[2], a.k.shape()[2]});
    blocked = blocked.defined() ? logical_or(blocked, c) : c;
  }
  return blocked;
}

}  // namespace nn
}  // namespace cf
