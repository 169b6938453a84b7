// Centroid attention (Centroid Transformers, eq. 4): the selection helpers, the
// dense and KNN update directions, the layer and its block. The initialisations:
// centroid_init.cpp.
#include "nn/attention/centroid.h"
#include "nn/attention/centroid_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/point.h"
#include "autograd/ops/random.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "core/error.h"
#include "nn/cost.h"
#include "nn/init.h"

namespace cf {
namespace nn {

namespace centroid_detail {

std::string describe(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_points(const char* who, const char* name, const Tensor& t) {
  CF_CHECK(t.defined() && t.dim() == 3 && is_floating(t.dtype()), ShapeError, "[", who, "] ", name,
           " must be a float (B, N, C) tensor, got ", describe(t));
}

void check_mask(const char* who, const char* name, const Tensor& mask, int64_t b, int64_t n, const char* axis) {
  if (!mask.defined()) return;
  CF_CHECK(mask.dtype() == kBool, DTypeError, "[", who, "] ", name, " must be bool (true = padding), got ",
           mask.dtype());
  CF_CHECK(mask.dim() == 2 && mask.shape()[0] == b && mask.shape()[1] == n, ShapeError, "[", who, "] ", name,
           " must be (B, ", axis, ") = (", b, ", ", n, "), got ", shape_str(mask.shape()));
}

// Per-batch-row indices (B, M...) -> flat row indices into (B*N, ...) (B*M...), on
// idx's device: a range check (on CUDA deferred to the next host read), then each
// row's offset r * N added.
Tensor flat_rows(const Tensor& idx, int64_t n, const char* who) {
  const int64_t b = idx.shape()[0], m = idx.numel() / std::max<int64_t>(b, 1);
  Tensor i = reshape(contiguous(idx), {b, m});
  check_indices(who, i, n, [who = std::string(who), n](int64_t, int64_t x) {
    throw IndexError(str("[", who, "] index ", x, " out of range for ", n, " rows"));
  });
  return reshape(i + reshape(Tensor::arange(b, kInt64, idx.device()) * double(n), {b, 1}), {b * m});
}

}  // namespace centroid_detail

using namespace centroid_detail;

// ---------------------------------------------------------------- selection

Tensor knn_indices(const Tensor& queries, const Tensor& inputs, int64_t k, const Tensor& mask) {
  check_points("knn_indices", "queries", queries);
  check_points("knn_indices", "inputs", inputs);
  const Shape &qs = queries.shape(), &xs = inputs.shape();
  CF_CHECK(qs[0] == xs[0] && qs[2] == xs[2] && queries.dtype() == inputs.dtype(), ShapeError,
           "[knn_indices] queries ", queries.describe(), " and inputs ", inputs.describe(),
           " need one batch size, width and dtype");
  CF_CHECK(k >= 1 && k <= xs[1], ValueError, "[knn_indices] k must be in [1, N] = [1, ", xs[1], "], got ", k);
  check_mask("knn_indices", "mask", mask, xs[0], xs[1]);
  NoGradGuard ng;
  // A selection, not a product of the model: in float32 at least (as the other attentions' selections and
  // PyTorch's cdist under autocast). Under bf16 autocast the GEMM rounded the distances to 8 bits: 107 of
  // 1024 nearest neighbours of an up-sampling changed, and training selected other neighbours than
  // evaluation does.
  AutocastGuard off(std::nullopt);
  report_macs(qs[0] * qs[1] * xs[1] * qs[2]);  // the distance GEMM, outside the graph (nn/cost.h)
  Tensor u = queries.detach(), x = inputs.detach();
  if (is_low_precision(u.dtype())) {
    u = to(u, kFloat32);
    x = to(x, kFloat32);
  }
  if (qs[1] == 0) return Tensor::empty({qs[0], 0, k}, kInt64, queries.device());
  // ||u - x||^2 = |u|^2 - 2 u.x + |x|^2: a GEMM, no (B, M, N, C) difference tensor. Over chunks of the
  // queries, each (B, rows, N) block at most 64 MiB (or one query row, when B N alone is more), added to
  // in place: with M = N / 4 (the point-cloud blocks) one (B, M, N) matrix and its temporaries took
  // 1.1 GB at N = 16384, for M k indices.
  const Tensor uu = unsqueeze(sum(u * u, {2}), 2), xx = unsqueeze(sum(x * x, {2}), 1), xt = transpose(x, 1, 2);
  const int64_t row_bytes = std::max<int64_t>(1, qs[0] * xs[1] * int64_t(dtype_size(u.dtype())));
  const int64_t rows = std::max<int64_t>(1, (int64_t(64) << 20) / row_bytes);
  std::vector<Tensor> parts;
  for (int64_t r0 = 0; r0 < qs[1]; r0 += rows) {
    const int64_t r = std::min(rows, qs[1] - r0);
    Tensor d = matmul(narrow(u, 1, r0, r), xt);
    mul_(d, -2.0);                   // the same sums, in the same order, as |u|^2 - 2 u.x + |x|^2
    add_(d, narrow(uu, 1, r0, r));
    add_(d, xx);
    if (mask.defined()) d = masked_fill(d, unsqueeze(mask, 1), INFINITY);
    parts.push_back(topk(d, k, -1, false).indices);
  }
  return parts.size() == 1 ? parts[0] : cat(parts, 1);
}

Tensor gather_rows(const Tensor& x, const Tensor& idx) {
  check_points("gather_rows", "x", x);
  CF_CHECK(idx.defined() && idx.dtype() == kInt64 && idx.dim() == 2 && idx.shape()[0] == x.shape()[0], ShapeError,
           "[gather_rows] idx must be int64 (B, M) with B = ", x.shape()[0], ", got ", describe(idx));
  const int64_t b = x.shape()[0], n = x.shape()[1], d = x.shape()[2], m = idx.shape()[1];
  return reshape(index_select(reshape(x, {b * n, d}), 0, flat_rows(idx, n, "gather_rows")), {b, m, d});
}

// ---------------------------------------------------------------- eq. 4 kernels

namespace {
void check_normalize(const char* who, const std::string& normalize) {
  CF_CHECK(normalize == "centroids" || normalize == "inputs", ValueError, "[", who,
           "] normalize must be \"centroids\" (eq. 4) or \"inputs\", got \"", normalize, "\"");
}
}  // namespace

Tensor centroid_attention_dense(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                const std::string& normalize, const Tensor& key_mask, const Tensor& centroid_mask) {
  check_normalize("centroid_attention_dense", normalize);
  CF_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
               q.shape()[0] == k.shape()[0] && q.shape()[1] == k.shape()[1] && q.shape()[3] == k.shape()[3] &&
               k.shape() == v.shape(),
           ShapeError, "[centroid_attention_dense] expected q (B, H, M, dh), k and v (B, H, N, dh); got q ",
           describe(q), ", k ", describe(k), ", v ", describe(v));
  const int64_t b = q.shape()[0], m = q.shape()[2], n = k.shape()[2];
  check_mask("centroid_attention_dense", "key_mask", key_mask, b, n);
  check_mask("centroid_attention_dense", "centroid_mask", centroid_mask, b, m, "M");
  if (normalize == "centroids") {
    // eq. 4: sim_l(x_i, u_j) is a softmax over the centroids j for each input i, the
    // transpose of self-attention's softmax over the inputs. The scores are built
    // input-major, (B, H, N, M), so that softmax runs over contiguous rows, and the
    // weighted sum is formed as (V^T W)^T, so that W's gradient (V G^T) is contiguous too.
    Tensor st = matmul(k, transpose(q * scale, -2, -1));  // phi_l(x_i, u_j) = Q(u_j)^T K(x_i)
    Tensor blocked;
    if (key_mask.defined()) blocked = reshape(key_mask, {b, 1, n, 1});
    if (centroid_mask.defined()) {
      Tensor c = reshape(centroid_mask, {b, 1, 1, m});
      blocked = blocked.defined() ? logical_or(blocked, c) : c;
    }
    if (blocked.defined()) st = masked_fill(st, blocked, -INFINITY);
    return transpose(matmul(transpose(v, -2, -1), softmax(st, -1)), -2, -1);
  }
  Tensor scores = matmul(q * scale, transpose(k, -2, -1));  // (B, H, M, N)
  Tensor blocked;
  if (key_mask.defined()) blocked = reshape(key_mask, {b, 1, 1, n});
  if (centroid_mask.defined()) {
    Tensor c = reshape(centroid_mask, {b, 1, m, 1});
    blocked = blocked.defined() ? logical_or(blocked, c) : c;
  }
  if (blocked.defined()) scores = masked_fill(scores, blocked, -INFINITY);
  return matmul(softmax(scores, -1), v);
}

Tensor centroid_attention_knn(const Tensor& q, const Tensor& kx, const Tensor& vx, const Tensor& nbr, double scale,
                              const std::string& normalize, const Tensor& key_mask, const Tensor& centroid_mask) {
  check_normalize("centroid_attention_knn", normalize);
  CF_CHECK(q.defined() && q.dim() == 4 && kx.defined() && vx.defined() && kx.dim() == 3 && kx.shape() == vx.shape() &&
               kx.shape()[0] == q.shape()[0] && kx.shape()[2] == q.shape()[1] * q.shape()[3],
           ShapeError, "[centroid_attention_knn] expected q (B, H, M, dh) and kx, vx (B, N, H*dh); got q ",
           describe(q), ", kx ", describe(kx), ", vx ", describe(vx));
  const int64_t b = q.shape()[0], h = q.shape()[1], m = q.shape()[2], dh = q.shape()[3], n = kx.shape()[1];
  CF_CHECK(nbr.defined() && nbr.dtype() == kInt64 && nbr.dim() == 3 && nbr.shape()[0] == b && nbr.shape()[1] == m,
           ShapeError, "[centroid_attention_knn] nbr must be int64 (B, M, K) = (", b, ", ", m, ", K), got ",
           describe(nbr));
  const int64_t k = nbr.shape()[2];
  check_mask("centroid_attention_knn", "key_mask", key_mask, b, n);
  check_mask("centroid_attention_knn", "centroid_mask", centroid_mask, b, m, "M");
  // Gather the K neighbours' projected rows once (B*M*K rows), then split heads:
  // (B, M, K, H, dh) -> (B, H, M, K, dh). Gradients flow back through index_select.
  Tensor flat = flat_rows(reshape(nbr, {b, m * k}), n, "centroid_attention_knn");
  auto gathered = [&](const Tensor& t) {
    Tensor g = reshape(index_select(reshape(t, {b * n, h * dh}), 0, flat), {b, m, k, h, dh});
    return permute(g, {0, 3, 1, 2, 4});
  };
  Tensor kg = gathered(kx), vg = gathered(vx);
  Tensor scores = reshape(matmul(unsqueeze(q * scale, 3), transpose(kg, -2, -1)), {b, h, m, k});
  Tensor blocked;
  if (key_mask.defined()) blocked = reshape(gather(cf::to(key_mask, kFloat32), 1, reshape(nbr, {b, m * k})), {b, 1, m, k});
  if (blocked.defined()) blocked = gt(blocked, 0.5);
  if (centroid_mask.defined()) {
    Tensor c = reshape(centroid_mask, {b, 1, m, 1});
    blocked = blocked.defined() ? logical_or(blocked, c) : c;
  }
  if (blocked.defined()) scores = masked_fill(scores, blocked, -INFINITY);
  Tensor w;
  if (normalize == "inputs") {
    w = softmax(scores, -1);
  } else {
    // eq. 4 under the KNN mask: for input i, normalise over the centroids whose K
    // neighbours include i. exp(s - shift_i) / sum over those pairs, with shift_i
    // the group's max (detached: the softmax does not depend on it).
    Tensor idx = contiguous(expand(reshape(nbr, {b, 1, m * k}), {b, h, m * k}));
    Tensor shift = reshape(group_max(reshape(scores.detach(), {b, h, m * k}), idx, n), {b, h, m, k});
    Tensor e = exp(scores - shift);                                      // masked pairs: 0
    Tensor den = scatter_add(Tensor::zeros({b, h, n}, q.dtype(), q.device()), 2, idx, reshape(e, {b, h, m * k}));
    Tensor den_g = reshape(gather(den, 2, idx), {b, h, m, k});
    // A pair whose whole group is masked has e = 0 and den = 0: divide by 1 instead.
    w = e / (den_g + cf::to(eq(den_g.detach(), 0.0), q.dtype()));
  }
  return reshape(matmul(unsqueeze(w, 3), vg), {b, h, m, dh});
}

// ---------------------------------------------------------------- options

void CentroidAttentionOptions::validate(const char* who) const {
  CF_CHECK(d_model > 0 && n_heads > 0 && d_model % n_heads == 0, ValueError, "[", who, "] d_model (", d_model,
           ") must be a positive multiple of n_heads (", n_heads, ")");
  CF_CHECK(iterations >= 0, ValueError, "[", who,
           "] iterations (T) must be >= 0 (0: the initial centroids pass through unchanged), got ", iterations);
  CF_CHECK(eps >= 0 && std::isfinite(eps), ValueError, "[", who, "] eps must be >= 0 (0: 1/T), got ", eps);
  check_normalize(who, normalize);
  CF_CHECK(knn >= 0, ValueError, "[", who, "] knn must be >= 0 (0: dense), got ", knn);
  CF_CHECK(scale >= 0, ValueError, "[", who, "] scale must be >= 0 (0: 1/sqrt(d_head)), got ", scale);
  static const char* kInits[] = {"random", "mean", "fps", "kmeans", "linear", "conv", "conv2d"};
  CF_CHECK(std::find(std::begin(kInits), std::end(kInits), init) != std::end(kInits), ValueError, "[", who,
           "] unknown init \"", init, "\" (known: random, mean, fps, kmeans, linear, conv, conv2d)");
  CF_CHECK(num_centroids >= 0 && downsample >= 1, ValueError, "[", who,
           "] needs num_centroids >= 0 and downsample >= 1, got num_centroids=", num_centroids,
           " downsample=", downsample);
  CF_CHECK(kmeans_iters >= 1, ValueError, "[", who, "] kmeans_iters must be >= 1, got ", kmeans_iters);
  if (init == "linear")
    CF_CHECK(seq_len > 0 && num_centroids > 0 && num_centroids <= seq_len, ValueError, "[", who,
             "] init \"linear\" needs seq_len > 0 and 0 < num_centroids <= seq_len, got seq_len=", seq_len,
             " num_centroids=", num_centroids);
  // The convolutions set M themselves (N_out = floor((N + 2p - k) / s) + 1): a num_centroids or downsample
  // beside them was ignored without a word.
  if (init == "conv" || init == "conv2d")
    CF_CHECK(num_centroids == 0 && downsample == CentroidAttentionOptions().downsample, ValueError, "[", who,
             "] init \"", init, "\" takes M from conv_kernel, conv_stride and conv_padding: num_centroids (",
             num_centroids, ") and downsample (", downsample, ") must stay at their defaults");
  if (init == "conv" || init == "conv2d")
    CF_CHECK(conv_kernel > 0 && conv_stride > 0 && conv_padding >= 0, ValueError, "[", who,
             "] conv init needs conv_kernel, conv_stride > 0 and conv_padding >= 0, got ", conv_kernel, ", ",
             conv_stride, ", ", conv_padding);
}

// ---------------------------------------------------------------- CentroidAttention

CentroidAttention::CentroidAttention(const CentroidAttentionOptions& o, Generator& gen) : o_(o) {
  o.validate("CentroidAttention");
  const int64_t d = o.d_model;
  // Section 2.2: "we may define sim_l by setting phi(x_i, u_j) = Q_l(u_j)^T K(x_i) as
  // typical self-attention, while setting V_l(x_i, u_j) with a separate trainable
  // value function": Q reads the centroids, K and V the inputs.
  w_q = register_module("w_q", std::make_shared<Linear>(d, d, o.bias, gen));
  w_k = register_module("w_k", std::make_shared<Linear>(d, d, o.bias, gen));
  w_v = register_module("w_v", std::make_shared<Linear>(d, d, o.bias, gen));
  // The sum over heads l of V_l in R^d is W_o applied to the concatenated heads.
  w_o = register_module("w_o", std::make_shared<Linear>(d, d, o.bias, gen));
  if (o.norm) {
    norm_q = register_module("norm_q", std::make_shared<LayerNorm>(d));
    norm_kv = register_module("norm_kv", std::make_shared<LayerNorm>(d));
  }
}

Tensor CentroidAttention::heads(const Tensor& x) const {
  const Shape& s = x.shape();
  return transpose(reshape(x, {s[0], s[1], o_.n_heads, o_.d_model / o_.n_heads}), 1, 2);
}

Tensor CentroidAttention::forward(const Tensor& x, const Tensor& u0, const Tensor& key_mask,
                                  const Tensor& centroid_mask) {
  const int64_t d = o_.d_model;
  CF_CHECK(x.defined() && u0.defined() && x.dim() == 3 && u0.dim() == 3 && x.shape()[2] == d && u0.shape()[2] == d &&
               x.shape()[0] == u0.shape()[0],
           ShapeError, "[CentroidAttention] expected x (B, N, ", d, ") and u0 (B, M, ", d, "), got x ", describe(x),
           ", u0 ", describe(u0));
  CF_CHECK(x.dtype() == u0.dtype() && is_floating(x.dtype()), DTypeError,
           "[CentroidAttention] x and u0 must share one float dtype, got ", x.dtype(), " and ", u0.dtype());
  const int64_t b = x.shape()[0], n = x.shape()[1], m = u0.shape()[1];
  check_mask("CentroidAttention", "key_padding_mask", key_mask, b, n);
  check_mask("CentroidAttention", "centroid_mask", centroid_mask, b, m, "M");
  // (N = 0: the dense steps added the output bias alone and KNN failed inside knn_indices)
  CF_CHECK(n >= 1, ShapeError, "[CentroidAttention] needs at least one input (N >= 1), got x ", describe(x));
  // T = 0: no step of eq. 4, the block is down-sampling alone (the sampling and
  // K-Means rows of the paper's Table 3); nothing is projected or selected.
  if (o_.iterations == 0) return u0;
  const double scale = o_.scale > 0 ? o_.scale : 1.0 / std::sqrt(double(d / o_.n_heads));
  // "We set eps = 1/T in practice."
  const double eps = o_.eps > 0 ? o_.eps : 1.0 / double(o_.iterations);
  // K and V depend on the inputs only: projected once for all T steps.
  Tensor xn = norm_kv ? norm_kv->forward(x) : x;
  Tensor kx = w_k->forward(xn), vx = w_v->forward(xn);
  Tensor kh, vh;
  const bool knn = o_.knn > 0;
  if (!knn) {
    kh = heads(kx);
    vh = heads(vx);
  }
  // K larger than N keeps every input (the dense layer, which KNN then equals).
  const int64_t k = std::min(o_.knn, n);
  Tensor u = u0;
  for (int64_t t = 0; t < o_.iterations; ++t) {
    Tensor q = heads(w_q->forward(norm_q ? norm_q->forward(u) : u));
    Tensor upd;
    if (knn) {
      // KNN approximation: N_{j,K} by d(x_i, u_j) = ||x_i - u_j||_2 on the features the
      // block receives ("the KNN is calculated in feature space"), refreshed every step.
      Tensor nbr = knn_indices(u, x, k, key_mask);
      upd = centroid_attention_knn(q, kx, vx, nbr, scale, o_.normalize, key_mask, centroid_mask);
    } else {
      upd = centroid_attention_dense(q, kh, vh, scale, o_.normalize, key_mask, centroid_mask);
    }
    Tensor merged = reshape(transpose(upd, 1, 2), {b, m, d});
    u = u + w_o->forward(merged) * eps;  // eq. 4: u^{t+1} = u^t + eps * sum_l sum_i sim V
  }
  return u;
}

// ---------------------------------------------------------------- block

CentroidAttentionBlock::CentroidAttentionBlock(const CentroidAttentionOptions& o, int64_t d_ff,
                                               const std::string& activation, double dropout, Generator& gen) {
  o.validate("CentroidAttentionBlock");
  CF_CHECK(d_ff > 0 && dropout >= 0 && dropout < 1, ValueError,
           "[CentroidAttentionBlock] needs d_ff > 0 and dropout in [0, 1), got d_ff=", d_ff, " dropout=", dropout);
  init = register_module("init", std::make_shared<CentroidInit>(o, gen));
  attn = register_module("attn", std::make_shared<CentroidAttention>(o, gen));
  // Figure 1: "Every self-attention / centroid attention module is also associated
  // with a multi-layer perceptron module" with a residual link (section 2.2).
  if (o.norm) norm_ff = register_module("norm_ff", std::make_shared<LayerNorm>(o.d_model));
  ff = register_module("ff", std::make_shared<FeedForward>(o.d_model, d_ff, activation, dropout, gen));
  drop_ = register_module("dropout", std::make_shared<Dropout>(dropout));
}

CentroidBlockOutput CentroidAttentionBlock::forward(const Tensor& x, const Tensor& mask, const Tensor& space,
                                                    Generator* sampler) {
  CentroidInitResult r = init->forward(x, mask, space, sampler);
  Tensor u = attn->forward(x, r.u, mask, r.mask);
  u = u + drop_->forward(ff->forward(norm_ff ? norm_ff->forward(u) : u));
  return {u, r.mask, r.indices, r.positions};
}

}  // namespace nn
}  // namespace cf
