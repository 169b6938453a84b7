#pragma once
// Clustered and improved clustered attention (Vyas, Katharopoulos, Fleuret 2020,
// "Fast Transformers with Clustered Attention", sections 3.2-3.3).
//
// Clustered (eqs. 3-6): queries are grouped into C clusters (hashing + Hamming
// K-Means, autograd/ops/clustering.h); each centroid Q^c_j is the mean of its
// member queries (eq. 3), attends to every key (eq. 4, key padding applied), and its
// value V^c_j = A^c_j V (eq. 5) is broadcast to the members (eq. 6). Cost O(N C D).
// Improved (eqs. 9-11): for each cluster the top-k keys of A^c_j; each member query
// i computes exact scores with those keys, softmax over them, rescaled by the
// cluster's mass m_j on them (eq. 9); every other key keeps A^c_jl (eq. 10). The
// output (eq. 11) is A^c with the top-k columns zeroed times V, plus the sparse
// product of the rescaled exact weights with the top-k values. Cost O(N C D + N k D).
// The centroid sums of eq. 3 and the broadcasts of eqs. 6 and 11 (values and the
// mass m_j) are a scatter_add and gathers over per-query cluster slots, O(N D):
// no (N, C) membership matrix is formed (the dense reference below forms one).
//
// The rules the paper leaves open (padding, clamped cluster counts and top-k,
// the causal variant, what is differentiable): docs/design-notes.md, "Attention
// variants and clustering".
#include <memory>
#include <mutex>

#include "core/rng.h"
#include "nn/attention/attention.h"

namespace cf {
namespace nn {

// How clustered_attention forms the centroids' attention over every key (eqs. 4-5):
//   kFused: one flash_attention (improved: flash_attention_with_lse, and eq. 9's top-k
//     keys by clustered_top_keys) with the C centroids as queries: no (C, Nk) matrix is
//     kept for the backward, but improved clustered attention computes the centroid
//     scores twice (for the top-k and inside the kernel);
//   kDense: the (B H, C, Nk) scores and weights A^c as tensors, one GEMM shared by the
//     top-k and the weights (kept for the backward: a few such matrices);
//   kAuto: kDense while one (B H, C, Nk) matrix takes at most kClusteredDenseMaxBytes,
//     kFused above.
// Plain clustered attention (topk = 0) computes its scores once either way and takes
// kFused under kAuto. Attention-weight dropout in training acts on A^c's entries, and both
// paths drop the same ones: kFused inside the flash kernel on either device, improved
// clustered attention's top-k terms leaving A^c V with the drops that kernel gave them
// (ops::dropout_scale_at at the kernel's counters).
enum class CentroidPath { kAuto, kFused, kDense };
// kAuto's bound: below it the dense matrices are a few MB (measured:
// docs/benchmarks.md, "Clustered attention through the fused kernel").
constexpr int64_t kClusteredDenseMaxBytes = int64_t(8) << 20;

struct ClusteredOptions {
  int64_t clusters = 100;   // C
  int64_t bits = 63;        // B, hash bits, in [1, 63]
  int64_t iterations = 10;  // L, Lloyd iterations
  int64_t topk = 32;        // k (improved only)
  bool improved = false;
  bool fixed_planes = false;  // true: hyperplanes drawn once from hash_seed; false: fresh each forward
  uint64_t hash_seed = 0;
  CentroidPath centroid_path = CentroidPath::kAuto;
};

// The clustered output for a given assignment int64 (B, H, Nq) with ids in
// [0, n_clusters) or -1 (no cluster: output 0). topk = 0: clustered (eqs. 3-6);
// topk > 0: improved (eqs. 9-11). key_padding_mask bool (B, Nk), true = padding.
// q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv) -> (B, H, Nq, Dv).
// Never forms an Nq x Nk matrix.
// Attention-weight dropout (training only) drops entries of A^c per cluster (so the
// members of a cluster share the mask) and the exact top-k weights per query; the
// mass m_j is computed before dropout, so the expected weights are A^t.
// causal (topk > 0 only): the causal improved variant described above (it forms no
// centroid weights: path plays no part).
Tensor clustered_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& assignment,
                           int64_t n_clusters, const Tensor& key_padding_mask, double scale, int64_t topk = 0,
                           double dropout_p = 0.0, bool training = false, Generator& gen = default_generator(),
                           bool causal = false, CentroidPath path = CentroidPath::kAuto);

// Eq. 9's top-k set as indices: for each cluster, the topk keys of highest centroid
// score centroids . k (scale them first; clustered_attention passes the mean of the
// scaled member queries), int64 (B, H, C, min(topk, Nk)) in descending score order,
// ties to the lower key index, padded keys (key_padding_mask bool (B, Nk)) last; not
// differentiable. centroids (B, H, C, D), k (B, H, Nk, D). The (C, Nk) scores are
// formed in key chunks whose scores take at most chunk_bytes (the merge holds about
// as much again: the running top-k's candidates beside the chunk's; on CUDA the top-k's
// radix sort adds its own per-candidate buffers), each merged into a
// running top-k: the result is one top-k's over all keys, and no (C, Nk) matrix is held.
Tensor clustered_top_keys(const Tensor& centroids, const Tensor& k, const Tensor& key_padding_mask, int64_t topk,
                          int64_t chunk_bytes = int64_t(64) << 20);

// Dense reference of the same computation: the (B, H, Nq, Nk) matrix A^c broadcast
// to the members (eq. 6) when topk = 0, or A^t of eq. 10 when topk > 0, built with
// dense ops and an explicit top-k mask; causal: the causal improved weights.
// For tests and analysis (Proposition 2). Rows of queries without a cluster are zero.
Tensor clustered_attention_weights(const Tensor& q, const Tensor& k, const Tensor& assignment, int64_t n_clusters,
                                   const Tensor& key_padding_mask, double scale, int64_t topk = 0,
                                   bool causal = false);

// Options (JSON), "clustered" and "improved-clustered":
//   {"clusters": C (100), "bits": B (63), "iterations": L (10),
//    "topk": k (32, improved-clustered only), "hash_seed": fixed hyperplanes (absent:
//    drawn from the global generator at each forward), "scale": 0 = 1/sqrt(D),
//    "dropout": attention-weight dropout in [0, 1), default 0,
//    "centroid_path": "auto" (default), "fused" or "dense" (CentroidPath above; both
//    take a dropout and drop the same weights)}.
class ClusteredAttention : public Attention {
 public:
  explicit ClusteredAttention(const ClusteredOptions& o, double scale = 0.0, double dropout = 0.0);
  static std::shared_ptr<Attention> create_clustered(const AttentionSpec& spec);
  static std::shared_ptr<Attention> create_improved(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return opt_.improved ? "improved-clustered" : "clustered"; }
  bool supports_causal() const override { return opt_.improved; }  // (improved: causal over its top-k keys)

  // Cluster ids int64 (B, H, Nq) of q (B, H, Nq, D): hashing then Hamming K-Means
  // over the valid queries (-1 for padded ones).
  Tensor cluster(const Tensor& q, const Tensor& query_padding_mask = Tensor());
  // Use this assignment (int64 (B, H, Nq), ids in [0, C) or -1) in every following
  // forward instead of clustering, until clear_assignment(). Padded queries are
  // still excluded. The number of clusters is the largest id + 1 (read from the device here,
  // once: the forward itself does not wait).
  void set_assignment(const Tensor& assignment);
  void clear_assignment();
  // The assignment the last forward used (of whichever thread finished its clustering last).
  Tensor last_assignment() const;
  const ClusteredOptions& options() const { return opt_; }

 private:
  ClusteredOptions opt_;
  double scale_, dropout_;
  // Forwards in several threads share one module (inference on a shared model): mu_ guards the
  // members a forward writes or a caller sets between forwards.
  mutable std::mutex mu_;
  Tensor planes_;  // fixed hyperplanes (fixed_planes), created at the first forward
  Tensor given_, last_;
  int64_t given_clusters_ = 1;  // set_assignment's largest id + 1
};

}  // namespace nn
}  // namespace cf
