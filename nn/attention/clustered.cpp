#include "nn/attention/clustered.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/ops/attention.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/clustering.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "autograd/ops/sparse.h"
#include "core/cuda_graph.h"
#include "core/error.h"

namespace cf {
namespace nn {

namespace {

void check_inputs(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& assignment,
                  int64_t n_clusters, const Tensor& kpm, double scale, int64_t topk, bool causal) {
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.key_padding_mask = kpm;
  check_attention_args(a, who);
  CF_CHECK(n_clusters >= 1, ValueError, "[", who, "] n_clusters must be >= 1, got ", n_clusters);
  CF_CHECK(topk >= 0, ValueError, "[", who, "] topk must be >= 0 (0: clustered), got ", topk);
  CF_CHECK(!causal || topk > 0, NotImplementedError, "[", who,
           "] causal masking needs topk > 0 (improved clustered): clustered attention gives every member its "
           "centroid's weights over all keys, later ones included");
  CF_CHECK(scale > 0 && std::isfinite(scale), ValueError, "[", who, "] scale must be finite and > 0, got ", scale);
  CF_CHECK(assignment.defined() && assignment.dtype() == kInt64, DTypeError, "[", who,
           "] assignment must be an int64 tensor (B, H, Nq)",
           assignment.defined() ? ", got " + assignment.describe() : std::string(""));
  CF_CHECK(assignment.device() == q.device(), DeviceError, "[", who, "] assignment is on ", assignment.device(),
           " but q is on ", q.device());
  const Shape& s = q.shape();
  CF_CHECK(assignment.dim() == 3 && assignment.shape()[0] == s[0] && assignment.shape()[1] == s[1] &&
               assignment.shape()[2] == s[2],
           ShapeError, "[", who, "] assignment must be (B, H, Nq) = (", s[0], ", ", s[1], ", ", s[2], "), got ",
           shape_str(assignment.shape()));
  // A data check: on CUDA deferred to the next host read (no wait here).
  check_indices(
      who, assignment, n_clusters,
      [who = std::string(who), n_clusters](int64_t at, int64_t id) {
        throw IndexError(str("[", who, "] cluster id ", id, " at flat position ", at, " is out of range [-1, ",
                             n_clusters, ")"));
      },
      -1);
}

// Eq. 6's broadcast of a per-cluster row y (G, C, D) to the cluster's members -> (G, Nq, D), zeros for a
// query with no cluster (id -1): a gather from C + 1 rows whose extra one is zeros, the slot of id -1
// being C (Python's -1 % (C + 1)). O(Nq D), no (Nq, C) membership matrix S; gather and its backward's
// scatter sum in a fixed order on CPU and CUDA.
Tensor to_members(const Tensor& y, const Tensor& assignment) {
  const int64_t G = y.shape()[0], C = y.shape()[1], Nq = assignment.numel() / std::max<int64_t>(G, 1);
  Tensor a = reshape(assignment, {G, Nq, 1});
  Tensor slot = remainder(a, ops::scalar_like(a, double(C + 1)));
  Tensor rows = cat({y, Tensor::zeros({G, 1, y.shape()[2]}, y.dtype(), y.device())}, 1);
  return take_along_dim(rows, slot, 1);
}

// (G, X, kk) bool: whether the key at each index of idx (G, X, kk) is padding
// (kpm (B, Nk), G = B * H).
Tensor padded_at(const Tensor& kpm, int64_t B, int64_t H, const Tensor& idx) {
  const int64_t G = B * H, Nk = kpm.shape()[1], X = idx.shape()[1], kk = idx.shape()[2];
  Tensor pad = reshape(expand(reshape(to(kpm, kInt64), {B, 1, Nk}), {B, H, Nk}), {G, Nk});
  return gt(reshape(gather(pad, 1, reshape(idx, {G, X * kk})), {G, X, kk}), 0.5);
}

// Eq. 9's T: each cluster's kk keys of highest centroid score Q^c_j . K_l (G, C, kk),
// padded keys last, ties to the lower key index (cf::topk's rule), not
// differentiable. The (C, Nk) scores are formed in key chunks whose scores take at
// most chunk_bytes (the merge's candidates, the running top-k beside the chunk, take
// about as much again, plus what cf::topk allocates: on CUDA a radix sort's keys and
// positions per candidate), each chunk's top-k merged with the running one (candidates in
// key order, so the tie rule and the result are those of one top-k over all keys):
// at N = 65536 and C = 100 the whole matrix per batch*head would be 26 MB, for
// a selection that keeps kk columns of it.
Tensor centroid_topk(const Tensor& qc, const Tensor& kf, const Tensor& kpm, int64_t B, int64_t H, int64_t kk,
                     int64_t chunk_bytes = int64_t(64) << 20) {
  NoGradGuard ng;
  const int64_t G = qc.shape()[0], C = qc.shape()[1], Nk = kf.shape()[1];
  const int64_t row_bytes = G * C * int64_t(dtype_size(qc.dtype()));
  const int64_t width = std::max(kk, chunk_bytes / std::max<int64_t>(row_bytes, 1));
  auto scores = [&](int64_t j0, int64_t n) {  // (G, C, n): keys j0 .. j0 + n - 1, padding -inf
    Tensor s = matmul(qc, transpose(slice(kf, 1, j0, j0 + n), 1, 2));
    if (!kpm.defined()) return s;
    return reshape(
        masked_fill(reshape(s, {B, H, C, n}), reshape(slice(kpm, 1, j0, j0 + n), {B, 1, 1, n}), -INFINITY),
        {G, C, n});
  };
  if (Nk <= width) return cf::topk(scores(0, Nk), kk, -1).indices;  // one chunk: no merging
  Tensor best_v, best_i;
  for (int64_t j0 = 0; j0 < Nk; j0 += width) {
    const int64_t n = std::min(width, Nk - j0);
    const int64_t kept = best_v.defined() ? best_v.shape()[2] : 0;  // candidates before the chunk's keys
    Tensor s = scores(j0, n);
    Tensor cand_v = kept ? cat({best_v, s}, 2) : s;
    ValuesIndices top = cf::topk(cand_v, std::min<int64_t>(kk, cand_v.shape()[2]), -1);
    // A candidate position p < kept is a key kept from earlier chunks (its index in
    // best_i); p >= kept is the chunk's key j0 + p - kept. No index per candidate is formed.
    const Tensor& p = top.indices;
    Tensor from_chunk = p + double(j0 - kept);
    if (kept) {
      Tensor earlier = lt(p, double(kept));
      from_chunk = where(earlier, gather(best_i, 2, where(earlier, p, 0.0)), from_chunk);
    }
    best_v = top.values;
    best_i = from_chunk;
  }
  return best_i;
}

}  // namespace

Tensor clustered_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& assignment,
                           int64_t n_clusters, const Tensor& kpm, double scale, int64_t topk, double dropout_p,
                           bool training, Generator& gen, bool causal, CentroidPath path) {
  // Autocast: the sparse top-k products have no 16-bit kernels yet (issue 26), so the whole
  // computation runs in float32 on float32 copies of 16-bit q, k, v (its matmuls too: no
  // 16-bit weights meet the float32 kernels) and returns float32, as flash_attention does.
  if (autocast_dtype()) {
    const Tensor q32 = autocast::to_float32(q), k32 = autocast::to_float32(k), v32 = autocast::to_float32(v);
    AutocastGuard off(std::nullopt);  // after the casts: to_float32 reads the policy
    return clustered_attention(q32, k32, v32, assignment, n_clusters, kpm, scale, topk, dropout_p, training, gen,
                               causal, path);
  }
  const char* who = "clustered_attention";
  check_inputs(who, q, k, v, assignment, n_clusters, kpm, scale, topk, causal);
  CF_CHECK(dropout_p >= 0 && dropout_p < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ", dropout_p);
  const bool dropping = training && dropout_p > 0;
  auto drop = [&](const Tensor& w) { return dropping ? dropout(w, dropout_p, true, gen) : w; };
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], D = q.shape()[3];
  const int64_t Nk = k.shape()[2], Dv = v.shape()[3], G = B * H, C = n_clusters;
  const DType dt = q.dtype();
  // Every index below is the checked assignment's, a top-k of the centroid scores or made of them:
  // no data scans past check_inputs (ops::KnownGoodIndices).
  ops::KnownGoodIndices built_here;
  // q, k and v contiguous once with top-k: the ops below each made their own copy of the heads' layout.
  const Tensor qd = topk > 0 ? contiguous(q) : q;
  Tensor kf = reshape(k, {G, Nk, D}), vf = reshape(v, {G, Nk, Dv});
  if (topk > 0) {
    kf = contiguous(kf);
    vf = contiguous(vf);
  }
  // Eq. 3: centroid = sum of member queries / member count (cluster_means, one call), of the scaled
  // queries (the scaled centroids).
  Tensor qc = reshape(cluster_means(qd, assignment, C, scale), {G, C, D});
  const int64_t kk = std::min(topk, Nk);

  // Eqs. 10-11's exact part for every query (cluster_topk_attention, one node): softmax of the exact
  // scores scale Q_i K_l over its cluster's top-k keys idx (G, C, kk), dropped as dropout() on those
  // (G, Nq, kk) weights, times mass (eq. 9's m_j) plus rest (the other keys' centroid weights);
  // weights exactly 0 at padded keys, and out 0 for a query without a cluster.
  auto exact_part = [&](const Tensor& idx, const Tensor& mass, const Tensor& rest, bool causal_keys) {
    return cluster_topk_attention(qd, reshape(kf, {B, H, Nk, D}), reshape(vf, {B, H, Nk, Dv}),
                                  reshape(idx, {B, H, C, kk}), assignment,
                                  mass.defined() ? reshape(mass, {B, H, C}) : mass,
                                  rest.defined() ? reshape(rest, {B, H, C, Dv}) : rest, kpm, scale, causal_keys,
                                  dropping ? dropout_p : 0.0, gen);
  };

  if (causal) {
    // The causal variant (see clustered.h): softmax of the exact scores over the
    // cluster's top-k keys that are not in the query's future; no other key. The
    // centroid scores only pick the keys.
    return exact_part(centroid_topk(qc, kf, kpm, B, H, kk), Tensor(), Tensor(), true);
  }

  // kAuto: improved clustered attention forms the (C, Nk) matrices while they are small,
  // where one shared GEMM beats computing the scores twice (clustered.h).
  const bool small = G * C * Nk * int64_t(dtype_size(dt)) <= kClusteredDenseMaxBytes;
  const bool fused = path == CentroidPath::kFused || (path == CentroidPath::kAuto && (topk == 0 || !small));
  if (fused) {
    // The fused path (issue 24): eq. 4's centroid attention over every key is one
    // flash_attention with the C centroids as queries (scale 1: they are scaled), so no
    // (C, Nk) score or weight matrix is kept for the backward. Dropout of the centroid
    // weights A^c happens inside it, with the counters of the dense path's dropout(A^c).
    const Tensor qc4 = reshape(qc, {B, H, C, D});
    const double rate = dropping ? dropout_p : 0.0;
    if (topk == 0) {
      Tensor vc = reshape(flash_attention(qc4, k, v, kpm, 1.0, false, rate, gen), {G, C, Dv});  // eqs. 4-5
      return reshape(to_members(vc, assignment), {B, H, Nq, Dv});                                  // eq. 6
    }
    Tensor idx = centroid_topk(qc, kf, kpm, B, H, kk);  // (G, C, kk)
    FlashAttentionResult cen = flash_attention_with_lse(qc4, k, v, kpm, 1.0, false, rate, gen);
    // A^c_jl at the top-k keys: exp(Q^c_j K_l - lse_j); 0 at padded keys and in a
    // cluster that sees no key (lse = -inf; its members are blocked below as well).
    Tensor lse = reshape(cen.lse, {G, C, 1});
    lse = where(eq(lse, -INFINITY), Tensor::zeros({1}, dt, q.device()), lse);
    Tensor s_top = sparse_dot(qc, kf, idx);
    if (kpm.defined()) s_top = masked_fill(s_top, padded_at(kpm, B, H, idx), -INFINITY);
    Tensor a_top = exp(s_top - lse);  // (G, C, kk)
    Tensor mass = sum(a_top, {-1});  // eq. 9: m_j, (G, C), of the weights before dropout
    // The keys outside the top-k keep the centroid weights (eq. 10, second case):
    // A^c V less its top-k terms. With dropout, cen.out is dropout(A^c) V, so the top-k
    // terms leave with the drops the flash kernel gave those weights (their counters).
    if (dropping)
      a_top = a_top * ops::dropout_scale_at(idx, Nk, rate, cen.dropout_seed, cen.dropout_counter0, dt, cen.dropout_rebase);
    Tensor v_rest = reshape(cen.out, {G, C, Dv}) - sparse_weighted_sum(a_top, vf, idx);
    return exact_part(idx, mass, v_rest, false);
  }

  // The dense path: the centroid weights A^c themselves (G, C, Nk); the reference of the
  // fused path, dropout included.
  Tensor scores = matmul(qc, transpose(kf, 1, 2));  // eq. 4, (G, C, Nk)
  if (kpm.defined())
    scores = reshape(masked_fill(reshape(scores, {B, H, C, Nk}), reshape(kpm, {B, 1, 1, Nk}), -INFINITY),
                     {G, C, Nk});
  Tensor ac = softmax(scores, -1);
  if (topk == 0) return reshape(to_members(matmul(drop(ac), vf), assignment), {B, H, Nq, Dv});  // eqs. 5-6
  Tensor idx = contiguous(cf::topk(scores.detach(), kk, -1).indices);  // (G, C, kk)
  // T of eq. 9 as a mask (G, C, Nk): true at each cluster's top-k keys.
  Tensor tmask = gt(ops::scatter_add_to_zeros({G, C, Nk}, 2, idx, Tensor::ones({G, C, kk}, dt, q.device())), 0.5);
  Tensor mass = sum(gather(ac, 2, idx), {-1});  // eq. 9: m_j, (G, C)
  // The keys outside the top-k keep the centroid weights A^c_jl (eq. 10, second case).
  Tensor v_rest = matmul(drop(masked_fill(ac, tmask, 0.0)), vf);
  return exact_part(idx, mass, v_rest, false);
}

Tensor clustered_top_keys(const Tensor& centroids, const Tensor& k, const Tensor& kpm, int64_t topk,
                          int64_t chunk_bytes) {
  const char* who = "clustered_top_keys";
  CF_CHECK(centroids.defined() && k.defined() && centroids.dim() == 4 && k.dim() == 4 &&
               centroids.shape()[0] == k.shape()[0] && centroids.shape()[1] == k.shape()[1] &&
               centroids.shape()[3] == k.shape()[3],
           ShapeError, "[", who, "] expected centroids (B, H, C, D) and k (B, H, Nk, D), got centroids ",
           centroids.defined() ? centroids.describe() : std::string("undefined"), ", k ",
           k.defined() ? k.describe() : std::string("undefined"));
  CF_CHECK(centroids.dtype() == k.dtype() && is_floating(k.dtype()), DTypeError, "[", who,
           "] centroids and k must share one float dtype, got ", centroids.dtype(), " and ", k.dtype());
  CF_CHECK(centroids.device() == k.device() && (!kpm.defined() || kpm.device() == k.device()), DeviceError, "[",
           who, "] centroids, k and key_padding_mask must be on one device");
  const int64_t B = k.shape()[0], H = k.shape()[1], Nk = k.shape()[2], C = centroids.shape()[2];
  CF_CHECK(!kpm.defined() || (kpm.dtype() == kBool && kpm.dim() == 2 && kpm.shape()[0] == B && kpm.shape()[1] == Nk),
           ShapeError, "[", who, "] key_padding_mask must be bool (B, Nk) = (", B, ", ", Nk, "), got ",
           kpm.defined() ? kpm.describe() : std::string(""));
  CF_CHECK(topk >= 1 && chunk_bytes >= 1, ValueError, "[", who, "] topk and chunk_bytes must be >= 1, got topk=",
           topk, " chunk_bytes=", chunk_bytes);
  const int64_t kk = std::min(topk, Nk);
  Tensor idx = centroid_topk(reshape(centroids.detach(), {B * H, C, k.shape()[3]}),
                             reshape(k.detach(), {B * H, Nk, k.shape()[3]}), kpm, B, H, kk, chunk_bytes);
  return reshape(idx, {B, H, C, kk});
}

Tensor clustered_attention_weights(const Tensor& q, const Tensor& k, const Tensor& assignment, int64_t n_clusters,
                                   const Tensor& kpm, double scale, int64_t topk, bool causal) {
  const char* who = "clustered_attention_weights";
  check_inputs(who, q, k, k, assignment, n_clusters, kpm, scale, topk, causal);
  const int64_t B = q.shape()[0], H = q.shape()[1], Nk = k.shape()[2], C = n_clusters;
  const DType dt = q.dtype();
  // S (B, H, Nq, C): the membership matrix of eq. 3, dense.
  Tensor member = one_hot(where(ge(assignment, 0.0), assignment, double(C)), C + 1, dt);
  member = slice(member, -1, 0, C);
  Tensor count = sum(member, {2}, true);  // (B, H, 1, C)
  Tensor qc = matmul(transpose(member, 2, 3), q * scale) / transpose(clamp(count, 1.0, INFINITY), 2, 3);
  Tensor sc = matmul(qc, transpose(k, 2, 3));  // (B, H, C, Nk)
  Tensor kblock = kpm.defined() ? reshape(kpm, {B, 1, 1, Nk}) : Tensor();
  if (kblock.defined()) sc = masked_fill(sc, kblock, -INFINITY);
  Tensor ac = softmax(sc, -1);
  Tensor aq = matmul(member, ac);  // eq. 6 as weights: A^c_j for every member i
  if (topk == 0) return aq;
  const int64_t kk = std::min(topk, Nk);
  Tensor idx = cf::topk(sc.detach(), kk, -1).indices;                      // (B, H, C, kk)
  Tensor tc = sum(one_hot(idx, Nk, dt), {3});                              // T of eq. 9, (B, H, C, Nk)
  Tensor tq = gt(matmul(member, tc), 0.5);                                 // T_{j(i), l}
  Tensor mq = matmul(member, sum(ac * tc, {-1}, true));                    // m_{j(i)}, eq. 9
  Tensor exact = matmul(q * scale, transpose(k, 2, 3));                    // Q_i K_l
  Tensor blocked = logical_not(tq);
  if (kblock.defined()) blocked = logical_or(blocked, kblock);
  if (causal) {  // the cluster's top-k keys up to the query's position, nothing else
    const int64_t Nq = q.shape()[2];
    blocked = logical_or(blocked, reshape(causal_mask(Nq, Nk, q.device()), {1, 1, Nq, Nk}));
    return softmax(masked_fill(exact, blocked, -INFINITY), -1);
  }
  Tensor wt = softmax(masked_fill(exact, blocked, -INFINITY), -1) * mq;    // eq. 10, first case
  (void)H;
  return where(tq, wt, aq);
}

// ---------------------------------------------------------------- the layer

ClusteredAttention::ClusteredAttention(const ClusteredOptions& o, double scale, double dropout)
    : opt_(o), scale_(scale), dropout_(dropout) {
  const char* who = o.improved ? "ImprovedClusteredAttention" : "ClusteredAttention";
  CF_CHECK(o.clusters >= 1, ValueError, "[", who, "] clusters must be >= 1, got ", o.clusters);
  CF_CHECK(o.bits >= 1 && o.bits <= 63, ValueError, "[", who, "] bits must be in [1, 63] (codes are int64), got ",
           o.bits);
  CF_CHECK(o.iterations >= 0, ValueError, "[", who, "] iterations must be >= 0, got ", o.iterations);
  CF_CHECK(!o.improved || o.topk >= 1, ValueError, "[", who, "] topk must be >= 1, got ", o.topk);
  CF_CHECK(scale >= 0 && std::isfinite(scale), ValueError, "[", who, "] scale must be >= 0 (0: 1/sqrt(d_k)), got ",
           scale);
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ", dropout);
}

namespace {
std::shared_ptr<Attention> create(const AttentionSpec& spec, bool improved) {
  const Config& o = spec.options;
  ClusteredOptions c;
  c.improved = improved;
  c.clusters = o.get<int64_t>("clusters", 100);
  c.bits = o.get<int64_t>("bits", 63);
  c.iterations = o.get<int64_t>("iterations", 10);
  if (improved) c.topk = o.get<int64_t>("topk", 32);
  if (o.has("hash_seed")) {
    int64_t s = o.get<int64_t>("hash_seed", 0);
    CF_CHECK(s >= 0, ValueError, "[", improved ? "ImprovedClusteredAttention" : "ClusteredAttention",
             "] hash_seed must be >= 0, got ", s);
    c.fixed_planes = true;
    c.hash_seed = uint64_t(s);
  }
  const std::string path = o.get<std::string>("centroid_path", "auto");
  CF_CHECK(path == "auto" || path == "fused" || path == "dense", ValueError, "[",
           improved ? "ImprovedClusteredAttention" : "ClusteredAttention",
           "] centroid_path must be \"auto\", \"fused\" or \"dense\", got \"", path, "\"");
  c.centroid_path = path == "fused" ? CentroidPath::kFused : path == "dense" ? CentroidPath::kDense : CentroidPath::kAuto;
  double scale = o.get<double>("scale", 0.0);
  double dropout = o.get<double>("dropout", 0.0);
  o.finish();
  return std::make_shared<ClusteredAttention>(c, scale, dropout);
}
}  // namespace

std::shared_ptr<Attention> ClusteredAttention::create_clustered(const AttentionSpec& spec) { return create(spec, false); }
std::shared_ptr<Attention> ClusteredAttention::create_improved(const AttentionSpec& spec) { return create(spec, true); }

Tensor ClusteredAttention::cluster(const Tensor& q, const Tensor& qpm) {
  const char* who = opt_.improved ? "ImprovedClusteredAttention" : "ClusteredAttention";
  CF_CHECK(q.defined() && q.dim() == 4 && is_floating(q.dtype()), ShapeError, "[", who,
           "] cluster: expected float q (B, H, Nq, D), got ", q.defined() ? q.describe() : std::string("undefined"));
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], D = q.shape()[3];
  if (qpm.defined())
    CF_CHECK(qpm.dtype() == kBool && qpm.dim() == 2 && qpm.shape()[0] == B && qpm.shape()[1] == Nq, ShapeError,
             "[", who, "] cluster: query_padding_mask must be bool (B, Nq) = (", B, ", ", Nq, "), got ",
             qpm.describe());
  NoGradGuard ng;
  Tensor planes;
  if (opt_.fixed_planes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!planes_.defined() || planes_.dtype() != q.dtype() || planes_.shape()[1] != D) {
      Generator gen(opt_.hash_seed);
      planes_ = random_hyperplanes(opt_.bits, D, q.dtype(), gen);  // on the CPU: the same planes on every device
    }
    if (planes_.device() != q.device()) planes_ = planes_.to(q.device());  // once per device, not per forward
    planes = planes_;
  } else {
    planes = random_hyperplanes(opt_.bits, D, q.dtype(), default_generator(), q.device());
  }
  Tensor codes = reshape(hash_codes(q, planes), {B * H, Nq});
  Tensor excl = qpm.defined() ? reshape(contiguous(expand(reshape(qpm, {B, 1, Nq}), {B, H, Nq})), {B * H, Nq})
                              : Tensor();
  ops::KnownGoodIndices hashed;  // codes of `bits` bits by construction: no scan of them
  return reshape(hamming_kmeans(codes, std::max<int64_t>(1, std::min(opt_.clusters, Nq)), opt_.iterations,
                                opt_.bits, excl),
                 {B, H, Nq});
}

void ClusteredAttention::set_assignment(const Tensor& a) {
  CF_CHECK(a.defined() && a.dtype() == kInt64 && a.dim() == 3, DTypeError, "[", type(),
           "] set_assignment: expected int64 (B, H, Nq), got ", a.defined() ? a.describe() : std::string("undefined"));
  Tensor given = contiguous(a.detach());
  // The cluster count the forward uses: read here, once, so the forward does not wait for the
  // device (ids on padded queries count too; a cluster no real query holds stays empty).
  const int64_t clusters = a.numel() > 0 ? std::max<int64_t>(1, amax(given).item<int64_t>() + 1) : 1;
  std::lock_guard<std::mutex> lock(mu_);
  given_ = given;
  given_clusters_ = clusters;
}

void ClusteredAttention::clear_assignment() {
  std::lock_guard<std::mutex> lock(mu_);
  given_ = Tensor();
}

Tensor ClusteredAttention::last_assignment() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

Tensor ClusteredAttention::forward(const AttentionArgs& args) {
  // Autocast: the clustering (hashing, Hamming K-Means) and the sparse products have no 16-bit
  // kernels yet (issue 26): the layer runs in float32 on float32 copies of 16-bit q, k, v and
  // returns float32 (clustered_attention above); the projections around it stay 16-bit.
  if (autocast_dtype()) {
    const AttentionArgs a = autocast_float32_args(args);  // cast before turning the policy off
    AutocastGuard off(std::nullopt);
    return forward(a);
  }
  const char* who = opt_.improved ? "ImprovedClusteredAttention" : "ClusteredAttention";
  check_attention_args(args, who);
  CF_CHECK(!args.causal || opt_.improved, NotImplementedError, "[", who,
           "] causal masking is not supported: every member takes its centroid's weights over all keys, later ones "
           "included; use improved-clustered (causal over its top-k keys) or full attention for causal layers");
  const Shape& s = args.q.shape();
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(s[3]));
  Tensor a, given;
  int64_t c = 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    given = given_;
    cuda::keep_for_graph(given);  // (a CUDA graph reads it past a later set_assignment)
    c = given_clusters_;
  }
  if (given.defined()) {
    CF_CHECK(given.shape()[0] == s[0] && given.shape()[1] == s[1] && given.shape()[2] == s[2], ShapeError, "[",
             who, "] the assignment given by set_assignment is ", shape_str(given.shape()),
             " but q needs (B, H, Nq) = (", s[0], ", ", s[1], ", ", s[2], ")");
    a = given.to(args.q.device());
    if (args.query_padding_mask.defined())
      a = where(expand(reshape(args.query_padding_mask, {s[0], 1, s[2]}), {s[0], s[1], s[2]}),
                Tensor::full({1}, -1.0, kInt64, a.device()), a);
  } else {
    a = cluster(args.q, args.query_padding_mask);
    c = std::max<int64_t>(1, std::min(opt_.clusters, s[2]));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = a;
  }
  // Ids of the layer's own clustering are in [-1, c) by construction: their scan (a launch on CUDA)
  // only for an assignment a user gave.
  std::optional<ops::KnownGoodIndices> own_ids;
  if (!given.defined()) own_ids.emplace();
  return clustered_attention(args.q, args.k, args.v, a, c, args.key_padding_mask, scale,
                             opt_.improved ? opt_.topk : 0, dropout_, is_training(), default_generator(), args.causal,
                             opt_.centroid_path);
}

}  // namespace nn
}  // namespace cf
