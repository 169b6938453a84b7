#pragma once
// Centroid attention (Wu et al., "Centroid Transformers: Learning to Abstract
// with Attention", section 2.2): N inputs x (B, N, D) are summarised into M <= N
// centroids u (B, M, D) by amortising gradient ascent on the soft K-Means
// objective of eq. 3:
//   u^0 = I(x);   u^{t+1}_j = u^t_j + eps * sum_l sum_i sim_l(x_i, u_j) V_l(x_i, u_j)   (eq. 4)
//   sim_l(x_i, u_j) = exp(a phi_l(x_i, u_j)) / sum_k exp(a phi_l(x_i, u_k))   (normalised over CENTROIDS)
// with, as the paper does in practice, phi_l(x_i, u_j) = Q_l(u_j)^T K_l(x_i) (a = 1/sqrt(d_head)) and a
// separate learned value function V_l(x_i, u_j) = W_o^l W_v^l x_i.
// KNN approximation (section 2.2, "KNN Approximation"): centroid j sums only over
// its K nearest inputs under d(x_i, u_j) = ||x_i - u_j||_2; the normalisation then
// runs over the pairs the KNN graph keeps (the paper's "KNN masks"). This is our reading:
// eq. 4 as written normalises over all M centroids, and a mask applied after that
// normalisation gives other weights (O(1) apart on random inputs). Masking before the
// softmax is what "KNN masks" means for attention elsewhere, and it keeps each input's
// weights a distribution over the centroids it is kept for.
//
// Not in the (q, k, v) -> same-length Attention interface (nn/attention/attention.h):
// its output has M rows, and its queries are centroids it builds itself. It is
// therefore not in the attention registry; cf-bench attention runs it as the
// separate variants "centroid" and "centroid-knn".
//
// Composed from autograd ops; farthest point sampling and the per-input score
// maxima are ops of their own (autograd/ops/point.h), with CPU and CUDA kernels.
#include <memory>
#include <string>

#include "core/rng.h"
#include "nn/layers/basic.h"
#include "nn/layers/sequence.h"
#include "nn/module.h"
#include "nn/table_cache.h"

namespace cf {
namespace nn {

// ---- selection helpers (not differentiable: they return int64 indices) ----

// Indices of the k inputs nearest (L2) to each query: queries (B, M, C), inputs
// (B, N, C) -> int64 (B, M, k), nearest first. Distances come from the GEMM form
// |u|^2 - 2 u.x + |x|^2 (never an (B, M, N, C) tensor), over chunks of the queries of at most
// 64 MiB each (one query row when B N is more). Padded inputs (mask true) come last.
Tensor knn_indices(const Tensor& queries, const Tensor& inputs, int64_t k, const Tensor& mask = Tensor());

// Rows of x (B, N, D) picked per batch row by idx int64 (B, M) -> (B, M, D), differentiable in x.
Tensor gather_rows(const Tensor& x, const Tensor& idx);

// ---- the pieces of eq. 4 on per-head tensors (also the dense reference of tests) ----

// Dense eq. 4 update direction: q (B, H, M, dh) from the centroids, k, v (B, H, N, dh)
// from the inputs -> sum_i sim(x_i, u_j) v_i, (B, H, M, dh). `normalize`: "centroids"
// (eq. 4: softmax over j for each input i) or "inputs" (usual softmax over i).
// key_mask bool (B, N) and centroid_mask bool (B, M), true = padding, may be undefined.
Tensor centroid_attention_dense(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                const std::string& normalize, const Tensor& key_mask = Tensor(),
                                const Tensor& centroid_mask = Tensor());

// KNN eq. 4: centroid j sums only over the inputs nbr[b, j, :] (int64 (B, M, K)).
// kx, vx are the projected inputs (B, N, H*dh) before the head split (so the gather
// moves B*M*K rows); gradients flow through the gathered rows.
Tensor centroid_attention_knn(const Tensor& q, const Tensor& kx, const Tensor& vx, const Tensor& nbr, double scale,
                              const std::string& normalize, const Tensor& key_mask = Tensor(),
                              const Tensor& centroid_mask = Tensor());

// ---- options ----

struct CentroidAttentionOptions {
  int64_t d_model = 0, n_heads = 1;
  int64_t iterations = 1;               // T of eq. 4 (the paper uses T = 1 in the efficient setting;
                                        // 0: no attention step, the initial centroids pass through)
  double eps = 0;                       // step size; 0: 1/T, as the paper sets it
  std::string normalize = "centroids";  // eq. 4; "inputs": softmax over the inputs instead
  int64_t knn = 0;                      // K of the KNN approximation; 0: every input
  double scale = 0;                     // 0: 1/sqrt(d_model / n_heads)
  bool norm = true;                     // pre-LN on the queries' and inputs' features
  bool bias = true;                     // projections' biases
  // Initialisation I(x): "random" (sampling without replacement, kept in sequence
  // order), "mean" (mean of consecutive windows of ~N/M inputs), "fps" (farthest
  // point sampling), "kmeans" (FPS seeds + Lloyd steps), "linear" (learned
  // projection over the sequence, N fixed), "conv" (depthwise 1-d conv over the
  // sequence) or "conv2d" (depthwise 2-d conv on the sqrt(N) x sqrt(N) token grid).
  std::string init = "mean";
  int64_t num_centroids = 0;  // M; 0: ceil(N / downsample) (sampling, mean, kmeans; the conv inits set M
                              // themselves and refuse both)
  double downsample = 2;      // N / M when num_centroids is 0
  int64_t kmeans_iters = 3;   // the paper's K-Means baseline runs 3 iterations (Table 3)
  int64_t seq_len = 0;        // N, required by "linear"
  int64_t conv_kernel = 3, conv_stride = 2, conv_padding = 1;  // "conv", "conv2d" (section 3.4)
  void validate(const char* who) const;
};

// What an initialisation produced: the centroids, their padding mask (undefined
// when none is padding), for sampling inits the index of the input each centroid
// started from, and where each centroid sits in the sample space (models use it
// to carry point coordinates along to the next block and to up-sample).
struct CentroidInitResult {
  Tensor u;          // (B, M, D)
  Tensor mask;       // bool (B, M) or undefined
  Tensor indices;    // int64 (B, M) for "random"/"fps"; undefined otherwise
  Tensor positions;  // (B, M, C), no gradient, when a sample_space was given: the seed
                     // rows for "random"/"fps", each cluster's mean for "kmeans"
                     // (the centroid its last Lloyd step moved to); else undefined
};

// The initialisation I(x) of eq. 4. `sample_space` (B, N, C), when given, is where
// "fps" and "kmeans" measure distances (e.g. xyz coordinates of a point cloud);
// default: the features x.
class CentroidInit : public Module {
 public:
  explicit CentroidInit(const CentroidAttentionOptions& o, Generator& gen = default_generator());
  CentroidInitResult forward(const Tensor& x, const Tensor& key_padding_mask = Tensor(),
                             const Tensor& sample_space = Tensor(), Generator* sampler = nullptr);
  // M for an input of length n.
  int64_t num_centroids(int64_t n) const;
  const std::string& mode() const { return o_.init; }
  std::shared_ptr<Linear> seq_proj;           // "linear"
  std::shared_ptr<DepthwiseConv1d> conv1d;    // "conv"
  std::shared_ptr<DepthwiseConv2d> conv2d;    // "conv2d"

 private:
  CentroidAttentionOptions o_;
  DeviceTableCache windows_;  // "mean": the window of each position (section 3.1), per N
};

// The T update steps of eq. 4 from given initial centroids (multi-head, learned
// Q/K/V/O projections). forward(x, u0) -> u^T. With norm, Q reads LN(u) and K, V read
// LN(x); the update is added to the unnormalised u (the residual of eq. 4).
class CentroidAttention : public Module {
 public:
  explicit CentroidAttention(const CentroidAttentionOptions& o, Generator& gen = default_generator());
  Tensor forward(const Tensor& x, const Tensor& u0, const Tensor& key_padding_mask = Tensor(),
                 const Tensor& centroid_mask = Tensor());
  const CentroidAttentionOptions& options() const { return o_; }
  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;
  std::shared_ptr<LayerNorm> norm_q, norm_kv;  // null without norm

 private:
  Tensor heads(const Tensor& x) const;  // (B, L, D) -> (B, H, L, dh)
  CentroidAttentionOptions o_;
};

// A centroid attention block (Figure 1b): initialisation, the T steps of eq. 4, and
// the MLP with its residual link that follows every attention module:
//   u = I(x);  u = u + eps * sum (eq. 4, T times);  u = u + FF(LN(u)).
struct CentroidBlockOutput {
  Tensor u, mask, indices, positions;  // as CentroidInitResult; u after the updates
};

class CentroidAttentionBlock : public Module {
 public:
  CentroidAttentionBlock(const CentroidAttentionOptions& o, int64_t d_ff, const std::string& activation = "relu",
                         double dropout = 0.0, Generator& gen = default_generator());
  CentroidBlockOutput forward(const Tensor& x, const Tensor& key_padding_mask = Tensor(),
                              const Tensor& sample_space = Tensor(), Generator* sampler = nullptr);
  std::shared_ptr<CentroidInit> init;
  std::shared_ptr<CentroidAttention> attn;
  std::shared_ptr<LayerNorm> norm_ff;
  std::shared_ptr<FeedForward> ff;

 private:
  std::shared_ptr<Dropout> drop_;
};

}  // namespace nn
}  // namespace cf
