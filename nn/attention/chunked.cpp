#include "nn/attention/chunked.h"

#include <cmath>
#include <vector>

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

struct Dims {
  int64_t B, H, N, Dk, Dv, Hm, C, w;
};

// Validates the arguments of chunked_attention / chunked_dense_attention and the
// members table (positions in [-1, N), each at most once per (batch, head)).
Dims check_chunked_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                        const Tensor& kpm, const ChunkedAttentionOptions& o, const char* who) {
  for (auto* t : {&q, &k, &v}) ops::check_defined(*t, who, t == &q ? "q" : t == &k ? "k" : "v");
  ops::check_defined(members, who, "members");
  CF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, "[", who,
           "] expected q, k (B, H, N, Dk) and v (B, H, N, Dv); got q ", shape_str(q.shape()), ", k ",
           shape_str(k.shape()), ", v ", shape_str(v.shape()));
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  CF_CHECK(sq == sk && sv[0] == sq[0] && sv[1] == sq[1] && sv[2] == sq[2], ShapeError, "[", who,
           "] q and k must have one shape and v the same (B, H, N): q ", shape_str(sq), ", k ", shape_str(sk),
           ", v ", shape_str(sv));
  CF_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), DTypeError, "[", who,
           "] q, k, v must share one float dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  ops::check_same_device(who, {&q, &k, &v, &members});
  CF_CHECK(members.dtype() == kInt64 && members.dim() == 4, ShapeError, "[", who,
           "] members must be int64 (B, H or 1, C, w), got ", members.describe());
  const Shape& sm = members.shape();
  Dims d{sq[0], sq[1], sq[2], sq[3], sv[3], sm[1], sm[2], sm[3]};
  CF_CHECK(sm[0] == d.B && (d.Hm == d.H || d.Hm == 1) && d.C >= 1 && d.w >= 1, ShapeError, "[", who,
           "] members ", shape_str(sm), " does not fit q ", shape_str(sq), " (want (", d.B, ", ", d.H,
           " or 1, C >= 1, w >= 1))");
  if (kpm.defined()) {
    CF_CHECK(kpm.dtype() == kBool && kpm.dim() == 2 && kpm.shape()[0] == d.B && kpm.shape()[1] == d.N,
             ShapeError, "[", who, "] key_padding_mask must be bool (B, N) = (", d.B, ", ", d.N, "), got ",
             kpm.describe());
  }
  CF_CHECK(o.look_back >= 0 && o.look_ahead >= 0 && o.scale >= 0 && std::isfinite(o.scale), ValueError, "[",
           who, "] look_back and look_ahead must be >= 0 and scale >= 0 (0: 1/sqrt(d_k)), got look_back=",
           o.look_back, " look_ahead=", o.look_ahead, " scale=", o.scale);
  std::vector<int64_t> m = members.to_vector<int64_t>();
  std::vector<char> seen(size_t(d.N));
  const int64_t per_head = d.C * d.w;
  for (int64_t bh = 0; bh < d.B * d.Hm; ++bh) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t s = 0; s < per_head; ++s) {
      int64_t p = m[size_t(bh * per_head + s)];
      CF_CHECK(p >= -1 && p < d.N, IndexError, "[", who, "] members[", bh / d.Hm, ", ", bh % d.Hm,
               "] holds position ", p, ", outside [-1, ", d.N, ")");
      if (p < 0) continue;
      CF_CHECK(!seen[size_t(p)], ValueError, "[", who, "] position ", p, " appears twice in members[", bh / d.Hm,
               ", ", bh % d.Hm, "]");
      seen[size_t(p)] = 1;
    }
  }
  return d;
}

// The chunk offsets a chunk sees, deduplicated modulo C: 0, -1, ..., -look_back,
// 1, ..., look_ahead. With few chunks the window wraps onto itself; each chunk is
// then counted once (ClusterFormer: "each key counts once").
std::vector<int64_t> window_offsets(int64_t C, const ChunkedAttentionOptions& o) {
  std::vector<int64_t> offs;
  std::vector<char> used(size_t(C), 0);
  auto add = [&](int64_t off) {
    int64_t r = ((off % C) + C) % C;
    if (!used[size_t(r)]) {
      used[size_t(r)] = 1;
      offs.push_back(off);
    }
  };
  add(0);
  for (int64_t i = 1; i <= o.look_back; ++i) add(-i);
  for (int64_t i = 1; i <= o.look_ahead; ++i) add(i);
  return offs;
}

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
  const char* who = "chunked_attention";
  const Dims d = check_chunked_args(q, k, v, members, key_padding_mask, o, who);
  const std::vector<int64_t> offs = window_offsets(d.C, o);
  const int64_t nb = int64_t(offs.size()), W = nb * d.w, S = d.C * d.w;

  // ---- masks over the (chunk, query slot, window key slot) score blocks ----
  // Built by a host loop (on CUDA from a copy of the slot table), then moved to
  // q's device with the gather index.
  Tensor mem = contiguous(members).cpu();
  const int64_t* m = mem.data<int64_t>();
  const std::vector<bool> pad = padding_of(key_padding_mask, d.B, d.N);
  Tensor blocked = Tensor::empty({d.B, d.Hm, d.C, d.w, W}, kBool);
  Tensor self = Tensor::zeros({d.B, d.Hm, d.C, d.w, W}, kBool);
  Tensor row_dead = Tensor::empty({d.B, d.Hm, d.C, d.w, 1}, kBool);
  Tensor token_dead = Tensor::ones({d.B, d.Hm, d.N}, kBool);
  Tensor gather_index = Tensor::empty({d.B, d.Hm, S, 1}, kInt64);
  bool* bl = blocked.data<bool>();
  bool* sf = self.data<bool>();
  bool* rd = row_dead.data<bool>();
  bool* td = token_dead.data<bool>();
  int64_t* gi = gather_index.data<int64_t>();
  bool any_self = false;
#pragma omp parallel for collapse(2) reduction(|| : any_self) if (d.B * d.Hm * S * W > 65536)
  for (int64_t bh = 0; bh < d.B * d.Hm; ++bh)
    for (int64_t c = 0; c < d.C; ++c) {
      const int64_t* mh = m + bh * S;
      const int64_t b = bh / d.Hm;
      for (int64_t s = 0; s < d.w; ++s) {
        const int64_t p = mh[c * d.w + s];
        gi[bh * S + c * d.w + s] = p < 0 ? 0 : p;  // empty slots read token 0; their rows are fully blocked
        const int64_t row = ((bh * d.C + c) * d.w + s);
        bool alive = false;
        for (int64_t t = 0; t < nb; ++t) {
          const int64_t cc = (((c + offs[size_t(t)]) % d.C) + d.C) % d.C;
          for (int64_t u = 0; u < d.w; ++u) {
            const int64_t j = mh[cc * d.w + u];
            const bool no = p < 0 || j < 0 || pad[size_t(b * d.N + j)] || (o.causal && j > p);
            bl[row * W + t * d.w + u] = no;
            if (!no && o.self_mask && j == p) {
              sf[row * W + t * d.w + u] = true;
              any_self = true;
            }
            alive = alive || !no;
          }
        }
        rd[row] = !alive;
        if (p >= 0) td[bh * d.N + p] = !alive;  // each position sits in one slot: no race
      }
    }

  const Device dev = q.device();
  if (!dev.is_cpu()) {
    blocked = blocked.to(dev);
    self = self.to(dev);
    row_dead = row_dead.to(dev);
    token_dead = token_dead.to(dev);
    gather_index = gather_index.to(dev);
  }

  // ---- gather q, k, v into chunks: (B, H, C, w, D) ----
  auto chunks_of = [&](const Tensor& x) {
    return reshape(take_along_dim(x, gather_index, 2), {d.B, d.H, d.C, d.w, x.shape()[3]});
  };
  Tensor qs = chunks_of(q), ks = chunks_of(k), vs = chunks_of(v);
  // The key/value window of chunk c: chunks c + offs[t], concatenated on the slot axis.
  Tensor kw = ks, vw = vs;
  if (nb > 1) {
    std::vector<Tensor> kp, vp;
    for (int64_t off : offs) {
      std::vector<int64_t> map(size_t(d.C));
      for (int64_t c = 0; c < d.C; ++c) map[size_t(c)] = (((c + off) % d.C) + d.C) % d.C;
      Tensor idx = Tensor::from_vector(map, {d.C}).to(dev);
      kp.push_back(off == 0 ? ks : index_select(ks, 2, idx));
      vp.push_back(off == 0 ? vs : index_select(vs, 2, idx));
    }
    kw = cat(kp, 3);
    vw = cat(vp, 3);
  }

  // ---- attention within each window: batched (w x Dk) @ (Dk x W) blocks ----
  Tensor scores = matmul(qs * score_scale(o, d.Dk), transpose(kw, -2, -1));  // (B, H, C, w, W)
  if (any_self) scores = masked_fill(scores, self, kSelfMaskedScore);
  scores = masked_fill(scores, blocked, -INFINITY);
  Tensor out_slots = matmul(softmax(scores, -1), vw);  // (B, H, C, w, Dv); dead rows are zeros
  // Dead rows would give logsumexp(-inf...) = -inf and a NaN gradient: give them
  // finite scores, then zero their lse before it is scattered.
  Tensor lse_slots = logsumexp(masked_fill(scores, row_dead, 0.0), {-1});  // (B, H, C, w)
  lse_slots = masked_fill(lse_slots, reshape(row_dead, {d.B, d.Hm, d.C, d.w}), 0.0);

  // ---- back to token order ----
  Tensor idx_v = contiguous(expand(gather_index, {d.B, d.H, S, d.Dv}));
  Tensor out = scatter_add(ops::filled({d.B, d.H, d.N, d.Dv}, 0.0, q.dtype(), q.device()), 2, idx_v,
                           reshape(out_slots, {d.B, d.H, S, d.Dv}));
  Tensor idx_l = contiguous(expand(reshape(gather_index, {d.B, d.Hm, S}), {d.B, d.H, S}));
  Tensor lse = scatter_add(ops::filled({d.B, d.H, d.N}, 0.0, q.dtype(), q.device()), 2, idx_l,
                           reshape(lse_slots, {d.B, d.H, S}));
  lse = masked_fill(lse, token_dead, -INFINITY);
  return {out, lse};
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
  const std::vector<int64_t> offs = window_offsets(C, o);
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
  const Dims d = check_chunked_args(q, k, v, members, key_padding_mask, o, "chunked_dense_attention");
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
