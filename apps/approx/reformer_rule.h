#pragma once
// Clustered, improved clustered and oracle-top attention under the Reformer's key rule, for
// cf-approx's evaluations of models trained with shared-QK attention in the Reformer's form
// (shared-full and lsh-R).
//
// The Reformer (Kitaev et al. 2020, section 2, "Shared-QK Transformer") takes each key to be
// its normalised query, k_j = q_j / |q_j|, and lets a token attend to itself only when no other
// key is allowed (its own score is replaced by -1e5). Read with k = q as it is, a query's score
// with itself, |q|^2, is larger than its score with any key of no greater norm (typically its
// largest), so a model trained under the rule would meet a different attention than the one it
// learned. Under the rule:
//   - clustered and improved clustered attention: the weights of clustered_attention_weights
//     (eqs. 6 and 10) with the normalised keys, each query's own weight removed and the whole row
//     rescaled to sum to 1; a row whose only weight is its own keeps it. For plain clustered
//     attention this is what the -1e5 score does to eq. 4's softmax (a softmax over every key but
//     the query's own). For improved clustered attention the rescaling also scales the centroid
//     weights of the keys outside the top-k, and the top-k keys stay shared by the cluster, so a
//     query that is among its cluster's top-k keys loses that slot.
//   - oracle-top: each query's top-k of the exact scores with its own score at -1e5, so the k best
//     other keys.
// Dense (B, H, N, N) weights: an analysis tool for cf-approx's short windows, never an efficient
// method. Self-attention only (Nq = Nk: the query's own key is the one at its position).
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "cf.h"
#include "nn/attention/attention.h"
#include "nn/attention/chunked.h"    // kSelfMaskedScore
#include "nn/attention/clustered.h"
#include "nn/attention/routing.h"    // l2_normalize

namespace cf {
namespace apps {

class ReformerRuleAttention : public nn::Attention {
 public:
  // Clustered attention (o.improved false) or improved clustered attention (o.topk keys); the
  // queries are clustered as ClusteredAttention clusters them.
  static std::shared_ptr<ReformerRuleAttention> clustered(const nn::ClusteredOptions& o) {
    auto a = std::shared_ptr<ReformerRuleAttention>(new ReformerRuleAttention());
    a->clusterer_ = std::make_shared<nn::ClusteredAttention>(o);
    a->topk_ = o.improved ? o.topk : 0;
    a->set_shared_qk(true);
    return a;
  }
  // Oracle-top with k keys per query.
  static std::shared_ptr<ReformerRuleAttention> oracle_top(int64_t k) {
    CF_CHECK(k >= 1, ValueError, "[ReformerRuleAttention] oracle-top needs k >= 1, got ", k);
    auto a = std::shared_ptr<ReformerRuleAttention>(new ReformerRuleAttention());
    a->topk_ = k;
    a->set_shared_qk(true);
    return a;
  }

  std::string type() const override {
    if (!clusterer_) return "oracle-top";
    return clusterer_->type();
  }

  // Use this assignment (int64 (B, H, N), ids in [0, clusters) or -1) instead of clustering
  // (tests); clusters: the number of clusters it uses.
  void set_assignment(const Tensor& assignment, int64_t clusters) {
    given_ = assignment;
    given_clusters_ = clusters;
  }

  Tensor forward(const nn::AttentionArgs& a) override {
    const char* who = "ReformerRuleAttention";
    nn::check_attention_args(a, who);
    const int64_t B = a.q.size(0), H = a.q.size(1), N = a.q.size(2), D = a.q.size(3);
    CF_CHECK(a.k.size(2) == N, ShapeError, "[", who, "] the Reformer's rule is for self-attention: q has ", N,
             " positions but k has ", a.k.size(2));
    CF_CHECK(!a.causal, NotImplementedError, "[", who, "] causal masking is not supported (cf-approx's encoders "
             "are bidirectional)");
    const double scale = 1.0 / std::sqrt(double(D));
    const Tensor k = nn::l2_normalize(a.k);
    Tensor self = eq(reshape(Tensor::arange(N, kInt64, a.q.device()), {N, 1}),
                     reshape(Tensor::arange(N, kInt64, a.q.device()), {1, N}));  // (N, N)
    if (!clusterer_) return oracle_top_forward(a, k, self, scale);
    Tensor assignment = given_;
    int64_t c = given_clusters_;
    if (!assignment.defined()) {
      assignment = clusterer_->cluster(a.q, a.query_padding_mask);
      c = std::max<int64_t>(1, std::min(clusterer_->options().clusters, N));
    }
    CF_CHECK(assignment.dim() == 3 && assignment.size(0) == B && assignment.size(1) == H && assignment.size(2) == N,
             ShapeError, "[", who, "] the assignment must be (B, H, N) = (", B, ", ", H, ", ", N, "), got ",
             assignment.describe());
    Tensor w = nn::clustered_attention_weights(a.q, k, assignment, c, a.key_padding_mask, scale, topk_);
    // The query's own weight removed, the rest rescaled to sum to 1; a row with no other weight keeps its own
    // (the divisor there is 1, so no 0 / 0 is formed even in the branch not taken).
    Tensor others = masked_fill(w, self, 0.0);
    Tensor rest = sum(others, {-1}, true);
    const Tensor kept = gt(rest, 0.0);
    w = where(kept, others / where(kept, rest, ones_like(rest)), w);
    return matmul(w, a.v);
  }

 private:
  ReformerRuleAttention() = default;

  Tensor oracle_top_forward(const nn::AttentionArgs& a, const Tensor& k, const Tensor& self, double scale) const {
    Tensor s = matmul(a.q, transpose(k, -2, -1)) * scale;
    s = masked_fill(s, self, nn::kSelfMaskedScore);
    const Tensor block = nn::dense_block_mask(a);
    const double ninf = -std::numeric_limits<double>::infinity();
    if (block.defined()) s = masked_fill(s, block, ninf);
    const int64_t kk = std::min(topk_, k.size(2));
    Tensor kth = slice(topk(s, kk, -1).values, -1, kk - 1, kk);  // each query's k-th largest score
    return matmul(softmax(masked_fill(s, lt(s, kth), ninf), -1), a.v);
  }

  std::shared_ptr<nn::ClusteredAttention> clusterer_;  // null: oracle-top
  int64_t topk_ = 0;
  Tensor given_;
  int64_t given_clusters_ = 1;
};

}  // namespace apps
}  // namespace cf
