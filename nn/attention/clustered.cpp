#include "nn/attention/clustered.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "core/error.h"
#include "nn/attention/hamming_kmeans.h"
#include "nn/attention/sparse_products.h"

namespace cf {
namespace nn {

namespace {

void check_inputs(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& assignment,
                  int64_t n_clusters, const Tensor& kpm, double scale, int64_t topk) {
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.key_padding_mask = kpm;
  check_attention_args(a, who);
  CF_CHECK(q.device().is_cpu(), NotImplementedError, "[", who,
           "] runs on the CPU only (hashing, Hamming K-Means and the sparse products have no CUDA kernels yet); "
           "got q on ", q.device());
  CF_CHECK(n_clusters >= 1, ValueError, "[", who, "] n_clusters must be >= 1, got ", n_clusters);
  CF_CHECK(topk >= 0, ValueError, "[", who, "] topk must be >= 0 (0: clustered), got ", topk);
  CF_CHECK(scale > 0 && std::isfinite(scale), ValueError, "[", who, "] scale must be finite and > 0, got ", scale);
  CF_CHECK(assignment.defined() && assignment.dtype() == kInt64, DTypeError, "[", who,
           "] assignment must be an int64 tensor (B, H, Nq)",
           assignment.defined() ? ", got " + assignment.describe() : std::string(""));
  const Shape& s = q.shape();
  CF_CHECK(assignment.dim() == 3 && assignment.shape()[0] == s[0] && assignment.shape()[1] == s[1] &&
               assignment.shape()[2] == s[2],
           ShapeError, "[", who, "] assignment must be (B, H, Nq) = (", s[0], ", ", s[1], ", ", s[2], "), got ",
           shape_str(assignment.shape()));
  std::vector<int64_t> ids = assignment.to_vector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i)
    CF_CHECK(ids[i] >= -1 && ids[i] < n_clusters, IndexError, "[", who, "] cluster id ", ids[i],
             " at flat position ", i, " is out of range [-1, ", n_clusters, ")");
}

// The membership matrix S of eq. 3 as (G, Nq, C) 0/1 in q's dtype (a query with
// id -1 has a zero row), and 1 / |cluster| as (G, C, 1) (0 for an empty cluster).
// Eqs. 3 and 6 are then batched GEMMs with S (N x C, never N x N), whose backward
// is again a GEMM with S.
void membership(const Tensor& assignment, int64_t c, DType dt, Tensor& member, Tensor& inv_count) {
  Tensor a = contiguous(assignment);
  const int64_t g = a.shape()[0] * a.shape()[1], n = a.shape()[2];
  Tensor m = Tensor::zeros({g, n, c}, kFloat64);
  std::vector<double> inv(size_t(g * c), 0.0);
  const int64_t* ap = a.data<int64_t>();
  double* mp = m.data<double>();
  for (int64_t i = 0; i < g * n; ++i)
    if (ap[i] >= 0) {
      mp[i * c + ap[i]] = 1.0;
      inv[size_t((i / n) * c + ap[i])] += 1.0;
    }
  for (double& x : inv) x = x > 0 ? 1.0 / x : 0.0;
  member = dt == kFloat64 ? m : to(m, dt);
  inv_count = to(Tensor::from_vector(inv, {g, c, 1}), dt);
}

}  // namespace

Tensor clustered_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& assignment,
                           int64_t n_clusters, const Tensor& kpm, double scale, int64_t topk, double dropout_p,
                           bool training, Generator& gen) {
  const char* who = "clustered_attention";
  check_inputs(who, q, k, v, assignment, n_clusters, kpm, scale, topk);
  CF_CHECK(dropout_p >= 0 && dropout_p < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ", dropout_p);
  auto drop = [&](const Tensor& w) { return training && dropout_p > 0 ? dropout(w, dropout_p, true, gen) : w; };
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], D = q.shape()[3];
  const int64_t Nk = k.shape()[2], Dv = v.shape()[3], G = B * H, C = n_clusters;
  const DType dt = q.dtype();
  Tensor member, inv_count;
  membership(assignment, C, dt, member, inv_count);
  // Eq. 3: centroid = sum of member queries / member count. The queries are scaled
  // first: the centroids of scaled queries are the scaled centroids.
  Tensor qs = reshape(q * scale, {G, Nq, D});
  Tensor qc = matmul(transpose(member, 1, 2), qs) * inv_count;  // (G, C, D)

  // Eq. 4: centroid attention over every key, padding masked.
  Tensor kf = reshape(k, {G, Nk, D}), vf = reshape(v, {G, Nk, Dv});
  Tensor scores = matmul(qc, transpose(kf, 1, 2));  // (G, C, Nk)
  if (kpm.defined())
    scores = reshape(masked_fill(reshape(scores, {B, H, C, Nk}), reshape(kpm, {B, 1, 1, Nk}), -INFINITY),
                     {G, C, Nk});
  Tensor ac = softmax(scores, -1);

  if (topk == 0) {
    Tensor vc = matmul(drop(ac), vf);  // eq. 5
    // Eq. 6: each query takes its centroid's value.
    return reshape(matmul(member, vc), {B, H, Nq, Dv});
  }

  // Eqs. 9-11. Top-k keys of each cluster (ties: lower key index), clamped to Nk.
  const int64_t kk = std::min(topk, Nk);
  Tensor idx = contiguous(cf::topk(scores.detach(), kk, -1).indices);  // (G, C, kk)
  Tensor tmask = Tensor::zeros({G, C, Nk}, kBool);
  {
    const int64_t* ip = idx.data<int64_t>();
    bool* tp = tmask.data<bool>();
    for (int64_t r = 0; r < G * C; ++r)
      for (int64_t t = 0; t < kk; ++t) tp[r * Nk + ip[r * kk + t]] = true;
  }
  Tensor mass = sum(gather(ac, 2, idx), {-1});  // eq. 9: m_j, (G, C)
  // The keys outside the top-k keep the centroid weights A^c_jl (eq. 10, second case).
  Tensor v_rest = matmul(drop(masked_fill(ac, tmask, 0.0)), vf);
  Tensor out = matmul(member, v_rest);  // (G, Nq, Dv)

  // Per query: its cluster's top-k keys; blocked where the key is padding or the
  // query has no cluster, so those weights are exactly 0.
  Tensor per_q = Tensor::zeros({G, Nq, kk}, kInt64);
  Tensor blocked = Tensor::zeros({G, Nq, kk}, kBool);
  {
    Tensor a = contiguous(assignment);
    Tensor m = kpm.defined() ? contiguous(kpm) : Tensor();
    const int64_t* ap = a.data<int64_t>();
    const int64_t* ip = idx.data<int64_t>();
    const bool* mp = m.defined() ? m.data<bool>() : nullptr;
    int64_t* pp = per_q.data<int64_t>();
    bool* bp = blocked.data<bool>();
    for (int64_t r = 0; r < G * Nq; ++r) {
      const int64_t g = r / Nq, j = ap[r], b = g / H;
      for (int64_t t = 0; t < kk; ++t) {
        if (j < 0) {
          bp[r * kk + t] = true;
          continue;
        }
        const int64_t key = ip[(g * C + j) * kk + t];
        pp[r * kk + t] = key;
        bp[r * kk + t] = mp && mp[b * Nk + key];
      }
    }
  }
  // Eq. 10, first case: m_j * softmax of the exact scores over the cluster's top-k.
  Tensor exact = masked_fill(sparse_dot(qs, kf, per_q), blocked, -INFINITY);
  Tensor mq = matmul(member, reshape(mass, {G, C, 1}));  // m_{j(i)}, (G, Nq, 1)
  Tensor top = sparse_weighted_sum(drop(softmax(exact, -1)) * mq, vf, per_q);  // eq. 11, sparse part
  return reshape(out + top, {B, H, Nq, Dv});
}

Tensor clustered_attention_weights(const Tensor& q, const Tensor& k, const Tensor& assignment, int64_t n_clusters,
                                   const Tensor& kpm, double scale, int64_t topk) {
  const char* who = "clustered_attention_weights";
  check_inputs(who, q, k, k, assignment, n_clusters, kpm, scale, topk);
  const int64_t B = q.shape()[0], H = q.shape()[1], Nk = k.shape()[2], C = n_clusters;
  const DType dt = q.dtype();
  // S (B, H, Nq, C): the membership matrix of eq. 3, dense.
  Tensor member = to(one_hot(where(lt(assignment, 0.0), Tensor::full({1}, double(C), kInt64),
                                   assignment),
                             C + 1, dt),
                     dt);
  member = slice(member, -1, 0, C);
  Tensor count = sum(member, {2}, true);  // (B, H, 1, C)
  Tensor qc = matmul(transpose(member, 2, 3), q * scale) / transpose(maximum(count, Tensor::ones({1}, dt)), 2, 3);
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
    if (!planes_.defined() || planes_.dtype() != q.dtype() || planes_.shape()[1] != D) {
      Generator gen(opt_.hash_seed);
      planes_ = random_hyperplanes(opt_.bits, D, q.dtype(), gen);
    }
    planes = planes_;
  } else {
    planes = random_hyperplanes(opt_.bits, D, q.dtype(), default_generator());
  }
  Tensor codes = reshape(hash_codes(q, planes), {B * H, Nq});
  Tensor excl = qpm.defined() ? reshape(contiguous(expand(reshape(qpm, {B, 1, Nq}), {B, H, Nq})), {B * H, Nq})
                              : Tensor();
  return reshape(hamming_kmeans(codes, std::max<int64_t>(1, std::min(opt_.clusters, Nq)), opt_.iterations,
                                opt_.bits, excl),
                 {B, H, Nq});
}

void ClusteredAttention::set_assignment(const Tensor& a) {
  CF_CHECK(a.defined() && a.dtype() == kInt64 && a.dim() == 3, DTypeError, "[", type(),
           "] set_assignment: expected int64 (B, H, Nq), got ", a.defined() ? a.describe() : std::string("undefined"));
  given_ = contiguous(a.detach());
}

Tensor ClusteredAttention::forward(const AttentionArgs& args) {
  const char* who = opt_.improved ? "ImprovedClusteredAttention" : "ClusteredAttention";
  check_attention_args(args, who);
  CF_CHECK(!args.causal, NotImplementedError, "[", who,
           "] causal masking is not supported: a cluster mixes queries of all positions (its centroid averages "
           "later queries), so an earlier output would depend on later tokens; use full attention for causal layers");
  const Shape& s = args.q.shape();
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(s[3]));
  Tensor a;
  int64_t c = 1;
  if (given_.defined()) {
    CF_CHECK(given_.shape()[0] == s[0] && given_.shape()[1] == s[1] && given_.shape()[2] == s[2], ShapeError, "[",
             who, "] the assignment given by set_assignment is ", shape_str(given_.shape()),
             " but q needs (B, H, Nq) = (", s[0], ", ", s[1], ", ", s[2], ")");
    a = given_;
    if (args.query_padding_mask.defined())
      a = where(expand(reshape(args.query_padding_mask, {s[0], 1, s[2]}), {s[0], s[1], s[2]}),
                Tensor::full({1}, -1.0, kInt64, a.device()), a);
    for (int64_t id : a.to_vector<int64_t>()) c = std::max(c, id + 1);
  } else {
    a = cluster(args.q, args.query_padding_mask);
    c = std::max<int64_t>(1, std::min(opt_.clusters, s[2]));
  }
  last_ = a;
  return clustered_attention(args.q, args.k, args.v, a, c, args.key_padding_mask, scale,
                             opt_.improved ? opt_.topk : 0, dropout_, is_training());
}

}  // namespace nn
}  // namespace cf
