#pragma once
// Routing attention (Roy, Saffar, Vaswani, Grangier 2021, "Efficient Content-Based Sparse Attention with
// Routing Transformers", TACL 9; section 4 "Routing Attention").
//
// Per routing head, C centroids mu_1..mu_C (a buffer, not a parameter) cluster the L2-normalised queries and
// keys (section 4.1: queries and keys are normalised before routing, so that nearest-centroid assignment is a
// cosine-similarity ranking). Balanced routing (section 4.1, equal-sized clusters): every cluster c takes the
// w = ceil(N / C) queries and, separately, the w keys closest to mu_c, so a token may sit in several clusters or
// in none. Attention then runs within each cluster (section 4.1): X'_i = sum_{j in K_c, j <= i (causal)} A_ij V_j for
// i in Q_c. A query routed to several clusters gets the AVERAGE of its per-cluster outputs (the rule of the
// reference port github.com/lucidrains/routing-transformer, scatter_mean, which the ClusterFormer paper used for
// its comparison: section 4, footnotes 1-2), over the clusters where it sees a key: under the causal mask a
// cluster whose keys all come after the query gives it no output and does not count (counted, its zero halved
// the query's output in a causal run); a query routed to no cluster, or seeing no key in any, outputs zeros.
//
// Centroids are learnt by online k-means, not by gradient (section 4.1, the EMA update):
//   mu_c <- lambda mu_c + (1 - lambda)/2 * mean_{i: nearest(Q_i) = c} Q_i + (1 - lambda)/2 * mean_{j: nearest(K_j) = c} K_j
// (Q, K normalised, padding excluded, the means pooled over the batch). The paper writes the assigned vectors'
// sums; cf uses the means, which keep the centroids on the scale of the unit-norm inputs. The port above differs:
// it pools queries and keys into one set, L2-normalises each cluster's sum and applies a plain EMA
// lambda mu + (1 - lambda) new. cf does not renormalise: a centroid is a mean of unit vectors and shrinks below
// norm 1 (about 0.44 after 60 steps of a small run). Routing does not see the scale (cluster c ranks the
// vectors by x . mu_c, an order |mu_c| does not change); the EMA's nearest centroid compares inner products
// across centroids of somewhat different norms, and the commitment loss pulls toward the shrunken centroids.
// A cluster with no assigned query (key) keeps mu_c in that half. The update happens in training mode only, after routing (the forward routes with the old centroids).
//
// Commitment loss (the VQ-VAE commitment term of the reference code, pulling queries/keys toward their centroid):
//   routing_commitment = 1/2 * ( mean_{valid i, d} (Qhat_id - sg(mu_{nearest(Q_i), d}))^2
//                               + mean_{valid j, d} (Khat_jd - sg(mu_{nearest(K_j), d}))^2 )
// averaged over the routing heads, added to args.aux under the name "routing_commitment" (unweighted: the model
// chooses the weight, the reference code uses 1e-4). Distributed (set_distributed), each rank divides by the
// ranks' mean count of valid tokens (an all-reduce), so that DDP's mean over ranks is the whole batch's mean:
// a forward that asks for aux losses is then a collective, in eval mode too (every rank makes it, or none).
//
// Causality: no query attends to a later position; what the routing itself sees:
// docs/design-notes.md, "Attention variants and clustering".
//
// Local heads (the experiments, section 5, mix local and routing attention heads): the first local_heads heads use local
// attention instead: the sequence is cut into blocks of local_window tokens and block b's queries attend to
// blocks b-1 and b (and b+1 unless causal), never wrapping around the sequence ends.
//
// Nothing here builds an N x N matrix, and nothing (C, w, w)-sized is kept: attention within the clusters is the
// fused routed_attention op (autograd/ops/attention.h), whose kernels read q, k, v through the lists and keep
// only each slot's output and log-sum-exp; memory O(B * H * N * d).
#include <cstdint>
#include <vector>

#include "autograd/ops/nn_functional.h"
#include "core/rng.h"
#include "nn/attention/attention.h"
#include "nn/table_cache.h"

namespace cf {
namespace nn {

// Attention within index lists: the fused op routed_attention (autograd/ops/attention.h), for
// lists in range by construction (balanced routing's top-w indices, the local and fixed sparse
// patterns): the shapes are checked, the lists' values are not (no pass over them; the kernels
// read a position outside [0, N) as an empty slot). Query slot s of list c attends to the key
// slots of list c; a query in several lists gets the average of its outputs over the lists where it sees
// a key, zeros if none.
// dropout: attention-weight dropout at that rate (0: none), from the default generator.
Tensor routed_lists_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                              const Tensor& key_members, const Tensor& key_padding_mask, double scale, bool causal,
                              double dropout = 0.0);

// The dense reference of routed_attention (autograd/ops/attention.h) for tests: for every list c an
// explicit (B, H, N, N) blocked mask, dense_attention over it (with dropout, list after list from gen: the
// weights routed_attention drops), rows of queries in c averaged over the lists where they see a key.
// O(C N^2) memory. (Its dropout masks are routed_attention's under a dropout share of 1 only:
// autograd/dropout_share.h.)
Tensor routed_attention_dense_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& query_members, const Tensor& key_members,
                                        const Tensor& key_padding_mask, double scale, bool causal,
                                        double dropout = 0.0, Generator& gen = default_generator());

// The local-attention lists of the local heads: (1, 1, C, window) query blocks and (1, 1, C, 2 or 3 windows) key
// blocks (previous, own, and next unless causal), -1 outside the sequence.
void local_members(int64_t n, int64_t window, bool causal, Tensor& query_members, Tensor& key_members);

// L2 normalisation over the last axis: x / sqrt(sum x^2 + 1e-12), the fused op of
// autograd/ops/nn_functional.h (one kernel each way). Differentiable.
using ::cf::l2_normalize;

// Balanced routing of normalised vectors xn (B, H, N, D) to centroids (H, C, D): each cluster takes the w vectors
// with the largest xn . mu_c (ties by position), padding (bool (B, N) true) last and marked -1. Returns
// (B, H, C, w) int64 positions. Not differentiable (indices).
Tensor balanced_routing(const Tensor& xn, const Tensor& centroids, const Tensor& key_padding_mask, int64_t w);

// Nearest centroid of each vector, argmin_c |xn - mu_c|^2: (B, H, N) int64.
Tensor nearest_centroid(const Tensor& xn, const Tensor& centroids);

// Options (JSON), all optional:
//   "n_clusters": C, default 8;  "local_heads": heads with local attention, default 0 (0 <= local_heads <= n_heads);
//   "local_window": block size of the local heads, default 0 = ceil(N / n_clusters), the routing cluster size;
//   "decay": EMA lambda in [0, 1), default 0.999 (section 4.1, and the reference code);  "scale": score scale, default 1/sqrt(d_k);
//   "dropout": attention-weight dropout in training, in [0, 1), default 0 (inside the routed kernel);
//   "seed": seed of the centroid initialisation (unit-norm Gaussian directions); default -1 draws them from
//           `gen`: the generator the layer is built with (AttentionSpec::gen), else the default generator
//           (either way the layers of a model start from different centroids).
class RoutingAttention : public Attention {
 public:
  RoutingAttention(int64_t n_heads, int64_t head_dim, int64_t n_clusters, int64_t local_heads = 0,
                   int64_t local_window = 0, double decay = 0.999, double scale = 0.0, int64_t seed = -1,
                   Generator* gen = nullptr, double dropout = 0.0);
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "routing"; }

  int64_t n_clusters() const { return n_clusters_; }
  int64_t local_heads() const { return local_heads_; }
  // (n_heads - local_heads, C, head_dim); the buffer "centroids" of the state dict.
  const Tensor& centroids() const { return centroids_; }
  // Under DistributedDataParallel the centroid update (section 4.1) averages the assigned
  // queries and keys of every rank's shard (two all-reduces of the per-cluster sums and counts,
  // on the device), so every rank keeps the centroids one process would.
  void set_distributed(bool on) override { distributed_ = on; }

 private:
  int64_t n_heads_, head_dim_, n_clusters_, local_heads_, local_window_;
  double decay_, scale_, dropout_;
  bool distributed_ = false;
  Tensor centroids_;
  DeviceTableCache local_tables_;  // (query_members, key_members) of the local heads
};

}  // namespace nn
}  // namespace cf
