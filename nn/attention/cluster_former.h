#pragma once
// The attention of the Cluster-Former layer (Wang et al. 2021, section 3.2):
// each hidden state is assigned to the centroid of highest cosine similarity
// (eq. 5); tokens are stably sorted by (cluster id, position) (eq. 6), cut into
// uniform chunks of m tokens (eq. 8) and attend within their chunk (eq. 7); the
// outputs return to the original order (eq. 9). Because LayerNorm and the
// feed-forward block act per token, "a Transformer layer per chunk" (eq. 7) is
// exactly a TransformerEncoderLayer whose attention is this one.
//
// The centroids come from the layer's own MemoryBank (a child module, so they
// are in the state_dict as "....attention.bank.centroids"). In training mode with
// gradients enabled each forward adds its non-padding hidden states to the bank
// (Algorithm 1, Memory.add); bank->step() recomputes the centroids every update_every steps: call
// nn::step_memory_banks(model) once per optimizer step (a ClusterFormer model's on_train_step() does),
// or they stay the random initial ones. The hidden states clustered (and stored)
// are AttentionArgs::query_input: the layer input H^n of eq. 5 in the post-LN
// form; LayerNorm(H^n) in the pre-LN form, so bank and assignment always see the
// same vectors.
//
// In a causal model the keys after a query are masked, but which earlier keys
// share its chunk depends on the cluster ids of all tokens (eqs. 6 and 8), later
// ones included, as with Reformer's LSH chunks.
#include <memory>
#include <mutex>

#include "nn/attention/attention.h"
#include "nn/clustering/memory_bank.h"

namespace cf {
namespace nn {

struct ClusterFormerAttentionOptions {
  int64_t chunk_size = 64;  // m in eq. 8 (the paper uses the sliding-window stride)
  double scale = 0.0;       // score scale; 0: 1/sqrt(d_k)
  double dropout = 0.0;     // attention-weight dropout in training, in [0, 1) (inside the block kernel)
  MemoryBankOptions bank;   // bank.dim is set to d_model
};

// Options (JSON): {"num_clusters": p (64), "chunk_size": m (64), "memory_size": M
// (100000), "update_every": F steps (1000), "kmeans_iters" (50), "seed" (0),
// "save_memory" (true), "scale" (0: 1/sqrt(d_k)), "dropout" (attention-weight dropout in training,
// [0, 1), default 0)}.
class ClusterFormerAttention : public Attention {
 public:
  ClusterFormerAttention(int64_t d_model, const ClusterFormerAttentionOptions& options,
                         Generator& gen = default_generator());
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  // The options above read from a Config (finish() included: unknown keys are errors).
  static ClusterFormerAttentionOptions read_options(const Config& options);
  // Self-attention only; needs args.query_input (B, N, d_model). Supports key
  // padding (padding tokens get cluster id p, so they sort into the last chunks)
  // and causal masking on original positions.
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "cluster-former"; }

  // eq. 5: the cluster id of each row of x (B, N, d) by cosine similarity to the
  // bank's centroids, int64 (B, N); padding rows (mask true) get id p.
  Tensor assign(const Tensor& x, const Tensor& padding_mask = {}) const;
  // Use these cluster ids (int64 (B, N), values in [0, p]) instead of eq. 5 until
  // cleared with an undefined tensor: a caller's own clustering, or assignments
  // held fixed (gradient checks).
  void set_fixed_assignments(const Tensor& ids);
  // The cluster ids the last forward used, (B, N) (of whichever thread assigned last).
  Tensor last_assignments() const;
  int64_t chunk_size() const { return chunk_; }

  std::shared_ptr<MemoryBank> bank;

 private:
  int64_t chunk_;
  double scale_, dropout_;
  // Forwards in several threads share one module (inference on a shared model): mu_ guards the
  // ids a forward writes and a caller fixes.
  mutable std::mutex mu_;
  Tensor fixed_ids_, last_ids_;
};

}  // namespace nn
}  // namespace cf
