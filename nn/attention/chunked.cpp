#include "nn/attention/chunked.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

namespace {

double score_scale(const ChunkedAttentionOptions& o, int64_t dk) {
  return o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(dk));
}

BlockAttentionOptions block_options(const ChunkedAttentionOptions& o) {
  BlockAttentionOptions b;
  b.look_back = o.look_back;
  b.look_ahead = o.look_ahead;
  b.causal = o.causal;
  b.self_mask = o.self_mask;
  b.self_score = kSelfMaskedScore;
  b.scale = o.scale;
  b.rounds = o.rounds;
  b.combine_rounds = o.combine_rounds;
  b.dropout = o.dropout;
  b.generator = o.generator;
  return b;
}

// t (B, H, N, D) with head h repeated R times in a row (head h * R + r): the rounds
// written out, for the dense reference.
Tensor repeat_heads(const Tensor& t, int64_t R) {
  if (R == 1) return t;
  const Shape& s = t.shape();
  return reshape(expand(unsqueeze(t, 2), {s[0], s[1], R, s[2], s[3]}), {s[0], s[1] * R, s[2], s[3]});
}

}  // namespace

Tensor chunk_order(const Tensor& order, int64_t w) {
  ops::check_defined(order, "chunk_order", "order");
  CF_CHECK(order.dtype() == kInt64 && order.dim() == 3, ShapeError,
           "[chunk_order] order must be int64 (B, H, N), got ", order.describe());
  CF_CHECK(w >= 1, ValueError, "[chunk_order] chunk size w must be >= 1, got ", w);
  const Shape& s = order.shape();
  const int64_t n = s[2], chunks = std::max<int64_t>(1, (n + w - 1) / w);
  Tensor padded = n == chunks * w ? order : pad(order, {0, chunks * w - n}, -1.0);
  return reshape(contiguous(padded), {s[0], s[1], chunks, w});
}

ChunkedAttentionResult chunked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                         const Tensor& key_padding_mask, const ChunkedAttentionOptions& o) {
  // One fused kernel (kernels/attention, block_attention): rows read through the
  // member table, scores per (chunk, window) tile, outputs written in token order.
  // Autocast: 16-bit q, k, v the tensor-core arm does not take run on float32 copies, as
  // block_attention's own entry does (the unchecked call below bypasses it).
  if (ops::block_attention_on_float32_copies(q, k, v, members, o.rounds, o.dropout))
    return chunked_attention(autocast::to_float32(q), autocast::to_float32(k), autocast::to_float32(v), members,
                             key_padding_mask, o);
  const BlockAttentionOptions bo = block_options(o);
  ops::check_block_attention_args(q, k, v, members, key_padding_mask, bo, "chunked_attention");
  BlockAttentionResult r = ops::block_attention_unchecked(q, k, v, members, key_padding_mask, bo);
  return {r.out, r.lse};
}

Tensor chunked_dense_mask(const Tensor& members, int64_t n, const Tensor& key_padding_mask,
                          const ChunkedAttentionOptions& o) {
  ops::check_defined(members, "chunked_dense_mask", "members");
  CF_CHECK(members.dtype() == kInt64 && members.dim() == 4, ShapeError,
           "[chunked_dense_mask] members must be int64 (B, H or 1, C, w), got ", members.describe());
  const Shape& sm = members.shape();
  const int64_t B = sm[0], Hm = sm[1], C = sm[2], w = sm[3];
  CF_CHECK(C >= 1 && w >= 1 && n >= 0, ShapeError, "[chunked_dense_mask] bad sizes: members ", shape_str(sm),
           ", n=", n);
  const Device dev = members.device();
  // Positions beyond n: one reduction on members' device (a host copy only to name one).
  if (sum(to(ge(members, double(n)), kInt64)).item<int64_t>() > 0)
    for (int64_t p : members.to_vector<int64_t>())
      CF_CHECK(p < n, IndexError, "[chunked_dense_mask] position ", p, " >= n=", n);
  // chunk[bh, p]: the chunk whose slot holds position p, -1 for none (each position
  // is in at most one slot per (b, h); empty slots scatter into a spare column n).
  Tensor pos = reshape(to(members, kFloat64), {B * Hm, C * w});
  Tensor col = to(where(ge(pos, 0.0), pos, Tensor::full({1}, double(n), kFloat64, dev)), kInt64);
  Tensor chunk_of_slot = expand(reshape(to(Tensor::arange(C, kInt64, dev), kFloat64), {1, C, 1}), {B * Hm, C, w});
  Tensor ids = add(reshape(contiguous(chunk_of_slot), {B * Hm, C * w}), 1.0);  // chunk + 1
  Tensor chunk = sub(narrow(scatter_add(Tensor::zeros({B * Hm, n + 1}, kFloat64, dev), 1, col, ids), 1, 0, n), 1.0);
  Tensor cp = reshape(chunk, {B, Hm, n, 1}), cj = reshape(chunk, {B, Hm, 1, n});
  Tensor allowed = logical_and(ge(cp, 0.0), ge(cj, 0.0));
  // Key chunk cj is in query chunk cp's window when (cj - cp) mod C is one of the
  // offsets; |cj - cp| < C, so the residue t is reached as t or t - C.
  Tensor diff = sub(cj, cp), in_window;
  for (int64_t off : ops::block_window_offsets(C, o.look_back, o.look_ahead)) {
    const int64_t t = ((off % C) + C) % C;
    Tensor hit = logical_or(eq(diff, double(t)), eq(diff, double(t - C)));
    in_window = in_window.defined() ? logical_or(in_window, hit) : hit;
  }
  allowed = logical_and(allowed, in_window);
  if (key_padding_mask.defined())
    allowed = logical_and(allowed, logical_not(reshape(key_padding_mask.to(dev), {B, 1, 1, n})));
  if (o.causal) {
    Tensor at = to(Tensor::arange(n, kInt64, dev), kFloat64);
    allowed = logical_and(allowed, ge(reshape(at, {n, 1}), reshape(at, {1, n})));  // key j <= query p
  }
  return logical_not(allowed);
}

ChunkedAttentionResult chunked_dense_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& members, const Tensor& key_padding_mask,
                                               const ChunkedAttentionOptions& o) {
  ops::check_block_attention_args(q, k, v, members, key_padding_mask, block_options(o), "chunked_dense_attention");
  if (o.rounds > 1) {
    ChunkedAttentionOptions one = o;
    one.rounds = 1;
    one.combine_rounds = false;
    const int64_t R = o.rounds;
    ChunkedAttentionResult r = chunked_dense_attention(repeat_heads(q, R), repeat_heads(k, R),
                                                       repeat_heads(v, R), members, key_padding_mask, one);
    if (!o.combine_rounds) return r;
    // Combined through the rounds' log-sum-exp; a row whose every round is -inf gets out 0, lse -inf
    // (softmax gives zero weights there; the masked logsumexp keeps its gradient finite).
    const int64_t B = q.shape()[0], H = q.shape()[1], N = q.shape()[2], Dv = v.shape()[3];
    Tensor lr = reshape(r.lse, {B, H, R, N});
    Tensor out = sum(reshape(r.out, {B, H, R, N, Dv}) * reshape(softmax(lr, 2), {B, H, R, N, 1}), {2});
    Tensor dead = eq(amax(lr, {2}), -INFINITY);  // (B, H, N)
    Tensor lse = logsumexp(masked_fill(lr, reshape(dead, {B, H, 1, N}), 0.0), {2});
    return {out, masked_fill(lse, dead, -INFINITY)};
  }
  struct {
    int64_t B, N, Dk, Hm;
  } d{q.shape()[0], q.shape()[2], q.shape()[3], members.shape()[1]};
  Tensor blocked = chunked_dense_mask(members, d.N, key_padding_mask, o);  // (B, Hm, N, N)
  Tensor scores = matmul(q * score_scale(o, d.Dk), transpose(k, -2, -1));
  if (o.self_mask) {
    Tensor pos = Tensor::arange(d.N, kInt64, q.device());
    Tensor eye = eq(reshape(pos, {d.N, 1}), reshape(pos, {1, d.N}));
    scores = masked_fill(scores, logical_and(eye, logical_not(blocked)), kSelfMaskedScore);
  }
  scores = masked_fill(scores, blocked, -INFINITY);
  Tensor row_dead = eq(sum(to(logical_not(blocked), kFloat32), {-1}, true), 0.0);  // (B, Hm, N, 1)
  Tensor weights = softmax(scores, -1);
  if (o.dropout > 0) weights = dropout(weights, o.dropout, true, o.generator ? *o.generator : default_generator());
  Tensor out = matmul(weights, v);
  Tensor lse = logsumexp(masked_fill(scores, row_dead, 0.0), {-1});
  lse = masked_fill(lse, reshape(row_dead, {d.B, d.Hm, d.N}), -INFINITY);
  return {out, lse};
}

}  // namespace nn
}  // namespace cf
