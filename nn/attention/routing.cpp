#include "nn/attention/routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/random.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "dist/dist.h"
#include "autograd/ops/sort.h"
#include "autograd/autocast.h"
#include "autograd/op_names.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/clustering.h"
#include "autograd/ops/common.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "nn/attention/full.h"
#include "nn/losses.h"

namespace cf {
namespace nn {

Tensor routed_lists_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                              const Tensor& key_members, const Tensor& key_padding_mask, double scale, bool causal,
                              double dropout) {
  ops::check_routed_attention_args(q, k, v, query_members, key_members, key_padding_mask, scale,
                                   opname::routed_attention, /*check_range=*/false);
  return ops::routed_attention_unchecked(q, k, v, query_members, key_members, key_padding_mask, scale, causal,
                                         dropout);
}

Tensor routed_attention_dense_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& query_members, const Tensor& key_members,
                                        const Tensor& key_padding_mask, double scale, bool causal,
                                        double dropout, Generator& gen) {
  const char* who = "routed_attention_dense_reference";
  ops::check_routed_attention_args(q, k, v, query_members, key_members, key_padding_mask, scale, who);
  const int64_t B = q.shape()[0], H = q.shape()[1], N = q.shape()[2];
  const int64_t C = query_members.shape()[2], wq = query_members.shape()[3], wk = key_members.shape()[3];
  if (scale <= 0) scale = 1.0 / std::sqrt(double(q.shape()[3]));
  // On the members' device: per list c, which positions its query and key slots
  // hold (a scatter of ones; empty slots go to a spare column N), and every query
  // of the list may attend to every allowed key of it.
  const Device dev = v.device();
  auto holds = [&](const Tensor& members, int64_t c, int64_t w) {  // (B, H, N) bool
    Tensor m = reshape(contiguous(narrow(expand(members, {B, H, C, w}), 2, c, 1)), {B, H, w});
    Tensor pos = to(m.to(dev), kFloat64);
    Tensor col = to(where(ge(pos, 0.0), pos, Tensor::full({1}, double(N), kFloat64, dev)), kInt64);
    Tensor hits = scatter_add(Tensor::zeros({B, H, N + 1}, kFloat64, dev), 2, col, Tensor::ones({B, H, w}, kFloat64, dev));
    return gt(narrow(hits, 2, 0, N), 0.0);
  };
  Tensor key_ok;  // (B, 1 or H, N, N): padding and causality, the same for every list
  if (key_padding_mask.defined()) key_ok = logical_not(reshape(key_padding_mask.to(dev), {B, 1, 1, N}));
  if (causal) {
    Tensor at = to(Tensor::arange(N, kInt64, dev), kFloat64);
    Tensor past = ge(reshape(at, {N, 1}), reshape(at, {1, N}));  // key j <= query i
    key_ok = key_ok.defined() ? logical_and(key_ok, past) : past;
  }
  Tensor total, count;
  for (int64_t c = 0; c < C; ++c) {
    Tensor in_q = holds(query_members, c, wq), in_k = holds(key_members, c, wk);
    Tensor allowed = logical_and(reshape(in_q, {B, H, N, 1}), reshape(in_k, {B, H, 1, N}));
    if (key_ok.defined()) allowed = logical_and(allowed, key_ok);
    // A query counts list c when it sees a key there (routed_attention's mean over the lists that
    // give the query an output).
    Tensor sees = gt(sum(to(allowed, kFloat64), {-1}, true), 0.0);
    Tensor member = to(logical_and(reshape(in_q, {B, H, N, 1}), sees), v.dtype());
    Tensor out_c = dense_attention(q, k, v, logical_not(allowed), scale, dropout, dropout > 0, gen) * member;
    total = total.defined() ? total + out_c : out_c;
    count = count.defined() ? count + member : member;
  }
  return total / clamp(count, 1.0, INFINITY);
}

void local_members(int64_t n, int64_t window, bool causal, Tensor& query_members, Tensor& key_members) {
  CF_CHECK(n > 0 && window > 0, ValueError, "[local_members] need n > 0 and window > 0, got n=", n,
           " window=", window);
  const int64_t C = (n + window - 1) / window, span = causal ? 2 : 3;
  std::vector<int64_t> qm(size_t(C * window)), km(size_t(C * span * window));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t s = 0; s < window; ++s) {
      int64_t p = c * window + s;
      qm[size_t(c * window + s)] = p < n ? p : -1;
    }
    for (int64_t o = 0; o < span; ++o)
      for (int64_t s = 0; s < window; ++s) {
        int64_t p = (c - 1 + o) * window + s;  // blocks c-1, c (, c+1); no wrap-around
        km[size_t((c * span + o) * window + s)] = p >= 0 && p < n ? p : -1;
      }
  }
  query_members = Tensor::from_vector(qm, {1, 1, C, window});
  key_members = Tensor::from_vector(km, {1, 1, C, span * window});
}

namespace {

// xn . mu_c for every vector and centroid: (B, H, N, C), one GEMM shared by the balanced routing (the
// attention's clusters) and the nearest centroid (the EMA and the commitment loss) of one forward.
Tensor centroid_dots(const Tensor& xn, const Tensor& centroids) {
  const int64_t H = centroids.shape()[0], C = centroids.shape()[1], D = centroids.shape()[2];
  return matmul(xn, transpose(reshape(centroids, {1, H, C, D}), -2, -1));
}

// no_inf_scores: the caller knows no score is -inf (the layer's: unit rows against its centroids, NaN at worst),
// so without padding every top-k slot holds a token and topk's indices are the lists as they are.
Tensor balanced_routing_of(const Tensor& dots, const Tensor& key_padding_mask, int64_t w, bool no_inf_scores) {
  const Shape& s = dots.shape();
  // Per cluster, tokens ranked by xn . mu_c: for unit xn the same order as -|xn - mu_c|^2.
  Tensor scores = transpose(dots, -2, -1);  // (B, H, C, N)
  if (key_padding_mask.defined())
    scores = masked_fill(scores, reshape(key_padding_mask, {s[0], 1, 1, s[2]}), -INFINITY);
  ValuesIndices top = topk(scores, w, -1);  // (B, H, C, w); ties keep position order
  if (!key_padding_mask.defined() && no_inf_scores) return top.indices;
  return where(ne(top.values, -INFINITY), top.indices, -1.0);
}

// |mu_c|^2 / 2 per head and centroid, (1, H, 1, C): taken once per forward for the queries' and keys' assignments.
Tensor centroid_half_norms(const Tensor& centroids) {
  const int64_t H = centroids.shape()[0], C = centroids.shape()[1], D = centroids.shape()[2];
  return transpose(sum(square(reshape(centroids, {1, H, C, D})), {-1}, true), -2, -1) * 0.5;
}

Tensor nearest_centroid_of(const Tensor& dots, const Tensor& half_norms) {
  // argmin_c |x - mu_c|^2 = argmax_c (x . mu_c - |mu_c|^2 / 2)
  return argmax(dots - half_norms, -1);
}

}  // namespace

namespace {
// The public entries' checks (a misfit w or centroid table failed inside [topk] or [matmul]).
void check_routing_inputs(const char* who, const Tensor& xn, const Tensor& centroids) {
  ops::check_defined(xn, who, "xn");
  ops::check_defined(centroids, who, "centroids");
  CF_CHECK(xn.dim() == 4 && centroids.dim() == 3 && xn.shape()[1] == centroids.shape()[0] &&
               xn.shape()[3] == centroids.shape()[2] && centroids.shape()[1] >= 1,
           ShapeError, "[", who, "] expected xn (B, H, N, D) and centroids (H, C, D) with C >= 1, got xn ",
           xn.describe(), ", centroids ", centroids.describe());
  CF_CHECK(is_floating(xn.dtype()) && xn.dtype() == centroids.dtype(), DTypeError, "[", who,
           "] xn and centroids must share one float dtype, got ", xn.dtype(), " and ", centroids.dtype());
}
}  // namespace

Tensor balanced_routing(const Tensor& xn, const Tensor& centroids, const Tensor& key_padding_mask, int64_t w) {
  const char* who = "balanced_routing";
  check_routing_inputs(who, xn, centroids);
  CF_CHECK(w >= 1 && w <= xn.shape()[2], ValueError, "[", who, "] w (", w, ") must be in [1, N = ", xn.shape()[2],
           "]");
  if (key_padding_mask.defined())
    CF_CHECK(key_padding_mask.dtype() == kBool && key_padding_mask.dim() == 2 &&
                 key_padding_mask.shape()[0] == xn.shape()[0] && key_padding_mask.shape()[1] == xn.shape()[2],
             ShapeError, "[", who, "] key_padding_mask must be bool (B, N) = (", xn.shape()[0], ", ",
             xn.shape()[2], "), got ", key_padding_mask.describe());
  NoGradGuard ng;
  return balanced_routing_of(centroid_dots(xn, centroids), key_padding_mask, w, /*no_inf_scores=*/false);
}

Tensor nearest_centroid(const Tensor& xn, const Tensor& centroids) {
  check_routing_inputs("nearest_centroid", xn, centroids);
  NoGradGuard ng;
  return nearest_centroid_of(centroid_dots(xn, centroids), centroid_half_norms(centroids));
}

RoutingAttention::RoutingAttention(int64_t n_heads, int64_t head_dim, int64_t n_clusters, int64_t local_heads,
                                   int64_t local_window, double decay, double scale, int64_t seed, Generator* gen,
                                   double dropout)
    : n_heads_(n_heads),
      head_dim_(head_dim),
      n_clusters_(n_clusters),
      local_heads_(local_heads),
      local_window_(local_window),
      decay_(decay),
      scale_(scale),
      dropout_(dropout) {
  CF_CHECK(n_heads > 0 && head_dim > 0, ValueError, "[RoutingAttention] n_heads and head_dim must be positive, got ",
           n_heads, " and ", head_dim);
  CF_CHECK(n_clusters > 0, ValueError, "[RoutingAttention] n_clusters must be positive, got ", n_clusters);
  CF_CHECK(local_heads >= 0 && local_heads <= n_heads, ValueError, "[RoutingAttention] local_heads must be in [0, ",
           n_heads, "] (n_heads), got ", local_heads);
  CF_CHECK(local_window >= 0, ValueError, "[RoutingAttention] local_window must be >= 0 (0: the cluster size), got ",
           local_window);
  CF_CHECK(decay >= 0 && decay < 1, ValueError, "[RoutingAttention] decay must be in [0, 1), got ", decay);
  CF_CHECK(scale >= 0, ValueError, "[RoutingAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", scale);
  CF_CHECK(seed >= -1, ValueError, "[RoutingAttention] seed must be -1 (default generator) or >= 0, got ", seed);
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[RoutingAttention] dropout must be in [0, 1), got ", dropout);
  Generator seeded(uint64_t(seed < 0 ? 0 : seed));
  centroids_ = l2_normalize(randn({n_heads - local_heads, n_clusters, head_dim}, kFloat32,
                                  seed >= 0 ? seeded : (gen ? *gen : default_generator())));
  register_buffer("centroids", &centroids_);
  keep_float32_under_16bit(&centroids_);  // the EMA of section 4.1 moves them by (1 - decay) / 2 per step
}

std::shared_ptr<Attention> RoutingAttention::create(const AttentionSpec& spec) {
  const Config& o = spec.options;
  int64_t n_clusters = o.get<int64_t>("n_clusters", 8);
  int64_t local_heads = o.get<int64_t>("local_heads", 0);
  int64_t local_window = o.get<int64_t>("local_window", 0);
  double decay = o.get<double>("decay", 0.999);
  double scale = o.get<double>("scale", 0.0);
  int64_t seed = o.get<int64_t>("seed", -1);
  double dropout = o.get<double>("dropout", 0.0);
  o.finish();
  return std::make_shared<RoutingAttention>(spec.n_heads, spec.d_model / spec.n_heads, n_clusters, local_heads,
                                            local_window, decay, scale, seed, spec.gen, dropout);
}

Tensor RoutingAttention::forward(const AttentionArgs& a) {
  // Autocast: balanced routing and the routed block kernel have no 16-bit path yet (issue 26):
  // a float32 island on float32 copies of 16-bit q, k, v, against the float32 centroids,
  // output float32 (attention.h).
  if (autocast_dtype()) {
    const AttentionArgs a32 = autocast_float32_args(a);  // cast before turning the policy off
    AutocastGuard off(std::nullopt);
    return forward(a32);
  }
  const char* who = "RoutingAttention";
  check_attention_args(a, who);
  const Shape& s = a.q.shape();
  const int64_t B = s[0], H = s[1], N = s[2], D = s[3];
  CF_CHECK(a.k.shape()[2] == N, ShapeError, "[RoutingAttention] routing attention is self-attention: q has ", N,
           " positions, k ", a.k.shape()[2]);
  CF_CHECK(H == n_heads_ && D == head_dim_, ShapeError, "[RoutingAttention] built for ", n_heads_,
           " heads of size ", head_dim_, ", got q ", shape_str(s));
  CF_CHECK(a.q.dtype() == centroids_.dtype(), DTypeError, "[RoutingAttention] q is ", a.q.dtype(),
           " but the centroids are ", centroids_.dtype(), " (convert the module with to(dtype))");
  const int64_t L = local_heads_, R = H - L;
  const bool collective = distributed_ && dist::is_initialized() && dist::world_size() > 1;
  // Section 4.1: mu <- lambda mu + (1 - lambda)/2 mean(assigned Q) + (1 - lambda)/2 mean(assigned K), from
  // `stats` (2, R, C, D + 1): this shard's per-cluster sums | counts of the assigned queries, then keys;
  // distributed, the whole batch's means (one all-reduce, on the device). A side without members leaves the
  // centroid for its mean.
  auto update_centroids = [&](Tensor stats) {
    NoGradGuard ng;
    if (collective) dist::all_reduce(stats, dist::ReduceOp::sum);
    ops::centroid_ema_update_(centroids_, stats, decay_);
  };
  if (N == 0) {  // nothing to route
    // A rank whose shard has no token still joins the distributed update with zero sums: the other ranks'
    // all-reduces wait for it, and every rank must keep the centroids one process would.
    if (a.aux && R > 0 && collective) {  // the commitment loss's token counts, as the other ranks take them
      for (int pass = 0; pass < 2; ++pass) {
        Tensor none = Tensor::zeros({}, kFloat64, centroids_.device());
        dist::all_reduce(none, dist::ReduceOp::mean);
      }
    }
    if (is_training() && R > 0 && collective) {
      update_centroids(Tensor::zeros({2, R, n_clusters_, D + 1}, centroids_.dtype(), centroids_.device()));
    }
    return Tensor::zeros({B, H, 0, a.v.shape()[3]}, a.v.dtype(), a.v.device());
  }
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(D));
  const double drop = is_training() ? dropout_ : 0.0;
  const int64_t w = (N + n_clusters_ - 1) / n_clusters_;  // balanced clusters: w = N / C tokens each
  std::vector<Tensor> outs;
  if (L > 0) {
    // A window of N or more is one block of every token: the same lists as N's (a window of 2^40 allocated
    // that many slots; 16384 over 8 tokens scored 16384 x 49152 tiles)
    const int64_t window = local_window_ > 0 ? std::min(local_window_, N) : w;
    const std::vector<Tensor> tables = local_tables_.get({N, window, a.causal}, a.q.device(), [&] {
      Tensor q_table, k_table;
      local_members(N, window, a.causal, q_table, k_table);
      return std::vector<Tensor>{q_table, k_table};
    });
    const Tensor &qm = tables[0], &km = tables[1];
    auto local = [&](const Tensor& x) { return R ? narrow(x, 1, 0, L) : x; };  // (every head local: x itself)
    outs.push_back(routed_lists_attention(local(a.q), local(a.k), local(a.v), qm, km,
                                          a.key_padding_mask, scale, a.causal, drop));
  }
  if (R > 0) {
    // (Every head routed: q, k, v themselves; a narrow over the whole axis cost its backward a fill and a copy.)
    Tensor q = L ? narrow(a.q, 1, L, R) : a.q, k = L ? narrow(a.k, 1, L, R) : a.k, v = L ? narrow(a.v, 1, L, R) : a.v;
    // q and k contiguous once: l2_normalize and the routed attention each copied the heads' layout.
    q = contiguous(q);
    k = contiguous(k);
    Tensor qn = l2_normalize(q), kn = l2_normalize(k);
    Tensor qd = qn.detach(), kd = kn.detach();
    Tensor q_dots, k_dots;  // (B, R, N, C)
    {
      NoGradGuard ng;
      q_dots = centroid_dots(qd, centroids_);
      k_dots = centroid_dots(kd, centroids_);
    }
    Tensor qm = balanced_routing_of(q_dots, a.query_padding_mask, w, true);
    Tensor km = balanced_routing_of(k_dots, a.key_padding_mask, w, true);
    if (!a.aux && !is_training()) q_dots = k_dots = Tensor();  // not needed past the routing: free them
    outs.push_back(routed_lists_attention(q, k, v, qm, km, a.key_padding_mask, scale, a.causal, drop));
    if (a.aux || is_training()) {
      // The assignments are argmax outputs and the EMA's rows are made of them: no data scans.
      ops::KnownGoodIndices built_here;
      Tensor qa, ka;
      {
        NoGradGuard ng;
        const Tensor half_norms = centroid_half_norms(centroids_);
        qa = nearest_centroid_of(q_dots, half_norms);
        ka = nearest_centroid_of(k_dots, half_norms);
      }
      q_dots = k_dots = Tensor();  // (B, R, N, C) each: free before the commitment loss and the update
      if (a.aux) {
        // The centroids as this forward saw them, when the loss records a backward that reads them: the
        // EMA below (or a later training forward, a load_state_dict) writes the buffer in place before it.
        const Tensor mu = grad_enabled() && (qn.requires_grad() || kn.requires_grad()) ? clone(centroids_) : centroids_;
        // Section 4.1's commitment term, sum |xn - sg(mu_assigned)|^2 over the real tokens divided by their
        // number times R D (the mean of the two sides), each side one fused call (commitment_loss).
        if (!a.query_padding_mask.defined() && !a.key_padding_mask.defined() && !collective) {
          // One process, no padding: the divisor B N R D is known here.
          const double s = 0.5 / std::max(1.0, double(B * N) * double(R * D));
          a.aux->add("routing_commitment",
                     commitment_loss(qn, mu, qa, Tensor(), s) + commitment_loss(kn, mu, ka, Tensor(), s));
        } else {
          auto commit = [&](const Tensor& xn, const Tensor& assign, const Tensor& mask) {
            Tensor se = commitment_loss(xn, mu, assign, mask);
            // The divisor, max(1, real tokens * R * D), formed in float64 on the device: no host read per
            // forward. Distributed, the real tokens are the ranks' mean count, so that the mean over ranks DDP
            // takes is the whole batch's token mean, as one process computes it (each rank's own count gave
            // another model as soon as the ranks' shards held different padding).
            Tensor tokens = mask.defined() ? sum(cf::to(logical_not(mask), kFloat64))
                                           : Tensor::full({}, double(B * N), kFloat64, a.q.device());
            if (collective) dist::all_reduce(tokens, dist::ReduceOp::mean);
            return se / cf::to(clamp(tokens * double(R * D), 1.0, INFINITY), se.dtype());
          };
          a.aux->add("routing_commitment",
                     (commit(qn, qa, a.query_padding_mask) + commit(kn, ka, a.key_padding_mask)) * 0.5);
        }
      }
      if (is_training()) {
        NoGradGuard ng;
        // Per side, head and cluster, the sums and counts of the assigned queries and keys over the real
        // tokens (padding, NaN or inf there, reaches no centroid), one kernel call, deterministic and the
        // same bits on both devices (kernels/kmeans/kmeans.h); one all-reduce for all of it, distributed.
        // As tensor ops it took about 14 calls a layer on each device, by two mechanisms (an index_add on
        // the CPU, one-hot products on CUDA), and the update below 12 more.
        Tensor stats = Tensor::empty({2, R, n_clusters_, D + 1}, qd.dtype(), qd.device());
        ops::centroid_ema_stats_into(qd, qa, a.query_padding_mask, kd, ka, a.key_padding_mask, stats);
        update_centroids(stats);
      }
    }
  }
  return outs.size() == 1 ? outs[0] : cat(outs, 1);
}

}  // namespace nn
}  // namespace cf
