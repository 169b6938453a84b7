#include "nn/attention/chunked.h"

#include <cmath>
#include <vector>

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

std::vector<bool> padding_of(const Tensor& kpm, int64_t B, int64_t N) {
  std::vector<bool> pad(size_t(B * N), false);
  if (kpm.defined()) {
    std::vector<bool> m = kpm.to_vector<bool>();
    for (size_t i = 0; i < m.size(); ++i) pad[i] = m[i];
  }
  return pad;
}

BlockAttentionOptions block_options(const ChunkedAttentionOptions& o) {
  BlockAttentionOptions b;
  b.look_back = o.look_back;
  b.look_ahead = o.look_ahead;
  b.causal = o.causal;
  b.self_mask = o.self_mask;
  b.self_score = kSelfMaskedScore;
  b.scale = o.scale;
  return b;
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
  const std::vector<int64_t> offs = ops::block_window_offsets(C, o.look_back, o.look_ahead);
  const std::vector<int64_t> m = members.to_vector<int64_t>();
  const std::vector<bool> pad = padding_of(key_padding_mask, B, n);
  std::vector<bool> blocked(size_t(B * Hm * n * n), true);
  for (int64_t bh = 0; bh < B * Hm; ++bh)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < w; ++s) {
        const int64_t p = m[size_t(bh * C * w + c * w + s)];
        if (p < 0) continue;
        CF_CHECK(p < n, IndexError, "[chunked_dense_mask] position ", p, " >= n=", n);
        for (int64_t off : offs) {
          const int64_t cc = (((c + off) % C) + C) % C;
          for (int64_t u = 0; u < w; ++u) {
            const int64_t j = m[size_t(bh * C * w + cc * w + u)];
            if (j < 0 || pad[size_t((bh / Hm) * n + j)] || (o.causal && j > p)) continue;
            blocked[size_t((bh * n + p) * n + j)] = false;
          }
        }
      }
  return Tensor::from_vector(blocked, {B, Hm, n, n}).to(members.device());
}

ChunkedAttentionResult chunked_dense_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& members, const Tensor& key_padding_mask,
                                               const ChunkedAttentionOptions& o) {
  ops::check_block_attention_args(q, k, v, members, key_padding_mask, block_options(o), "chunked_dense_attention");
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
  Tensor out = matmul(softmax(scores, -1), v);
  Tensor lse = logsumexp(masked_fill(scores, row_dead, 0.0), {-1});
  lse = masked_fill(lse, reshape(row_dead, {d.B, d.Hm, d.N}), -INFINITY);
  return {out, lse};
}

}  // namespace nn
}  // namespace cf
