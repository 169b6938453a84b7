#pragma once
// Neural clustering attention (ClusterFormer, Wang et al., ACL 2022).
//
// Section 3.1, the Neural Clustering Method, on the layer input X (B, N, d_model):
//   U_ij  = softmax_j(phi(C_i, X_j W^C)), phi = inner product          (eq. 2)
//   C^_i  = sum_j U_ij X_j W^C                                         (eq. 3)
//   I_j   = argmax_i U_ij                                              (eq. 4)
//   X^S, I' = Sort(X, I): tokens grouped by ascending cluster index    (eq. 5)
//   L1    = -(1/N) sum_j phi(X_j, C^_{I_j})                            (eq. 6)
// Section 3.2, the attention: Q^S, K^S, V^S of the sorted tokens (eq. 7; the
// projections are per token, so projecting then gathering by the sort order is
// the same), k equal blocks of w = ceil(N/k) (eq. 8; N the sequence's own length: under
// padding each row's valid tokens, padded queries in no block), block i attending to blocks
// i-1 and i, block 1 looking back cyclically to block k, attention within the
// blocks in parallel (eq. 9), outputs resorted to token order (eq. 10), and
//   L2    = -(1/k) (sum_{i=2..k} phi(C^_i, C^_{i-1}) + phi(C^_1, C^_k))  (eq. 11)
// Appendix B (eqs. 12-14): the masked variant blocks keys whose ORIGINAL position
// is after the query's (args.causal). The chunk/attend/resort part is the shared
// chunked_attention (nn/attention/chunked.h).
//
// Centroids across layers (section 3.1: "C is initialized randomly in the first
// layer"; each later layer clusters with the centroids the previous layer
// updated): a stack of layers shares one CentroidChain. The first layer owns the
// learned parameter C (k, d_model) (appendix C, eq. 18: updated by gradient
// descent on L_total); a later layer owns no C and reads the previous layer's
// C^ (B, k, d_model) from the chain, so gradients flow back through the chain
// into earlier layers. The model links its stack once, after building it
// (link_centroid_chain); an unlinked layer is a first layer.
//
// What is not differentiable: the cluster index I (argmax) and the sort. The
// gradient reaches C and W^C through U and C^ (losses L1, L2 and the next
// layer's clustering), X too when losses_reach_input is set, and q, k, v
// through the gathered blocks.
//
// Padding and the causal variant's reach: docs/design-notes.md, "Attention
// variants and clustering".
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops/clustering.h"
#include "core/rng.h"
#include "nn/attention/attention.h"

namespace cf {
namespace nn {

// Names under which the layer adds its losses to args.aux (one entry per layer);
// a model weighs them with mu and nu (appendix C, eq. 17).
inline constexpr const char* kClusteringLossName = "neural_clustering.l1";       // eq. 6
inline constexpr const char* kCentroidSortingLossName = "neural_clustering.l2";  // eq. 11

// The outcome of eqs. 2-5 for one batch.
struct NeuralClusteringResult {
  Tensor u;       // (B, k, N) subordinate matrix, eq. 2 (zero columns at padding)
  Tensor c_hat;   // (B, k, d_model) updated centroids, eq. 3
  Tensor index;   // int64 (B, N) cluster index I, eq. 4; k at padded tokens
  Tensor order;   // int64 (B, N) I': original positions in sorted order, eq. 5
};

// How tokens of one cluster are ordered by the sort of eq. 5 (the paper leaves
// it open). kMembership: by descending subordinate value U_{I_j, j}, then by
// position; the layer is then equivariant to permutations of its tokens (which
// members of a cluster share a block does not depend on where they stand).
// kPosition: by position (a plain stable sort by cluster index).
enum class ClusterTieOrder { kMembership, kPosition };

// Eqs. 2-5. x (B, N, D); c (k, D) or (B, k, D); w_c (D, D) applied as X W^C;
// key_padding_mask bool (B, N) or undefined. Differentiable in x, c and w_c
// (u and c_hat); index and order carry no gradient.
NeuralClusteringResult neural_clustering(const Tensor& x, const Tensor& c, const Tensor& w_c,
                                         const Tensor& key_padding_mask,
                                         ClusterTieOrder tie_order = ClusterTieOrder::kMembership);

// The phi of the two losses. The paper's phi is the inner product (kInner, eqs. 6
// and 11 as written): both losses are then unbounded below, and descending them
// grows C^ and W^C without limit (RESULTS.md, the Table 5 ablation). The bounded
// forms the equations allow (the paper names none):
//   kCosine: phi(a, b) = a . b / (|a| |b|) in L1 and L2: every term in [-1, 1];
//   kSphere: C^ put on the unit sphere, phi(X_j, C^_i / |C^_i|) in L1 (bounded by
//            |X_j|, which the pre-LN layer input fixes) and the cosine in L2 (where
//            both arguments are centroids, projecting them is the cosine).
// A zero vector counts as length 1e-12 (its terms are 0, not NaN). The losses are fused ops of
// autograd (autograd/ops/clustering.h), named here too.
using ::cf::ClusterLossForm;
// "inner", "cosine", "sphere" <-> the form; a bad name is a ValueError naming `who`.
ClusterLossForm cluster_loss_form_from_string(const std::string& name, const std::string& who);
std::string to_string(ClusterLossForm form);

// L1 (eq. 6): mean over the batch of -(1/N_b) sum_j phi(x_j, c_hat[I_j]), N_b the
// number of non-padding tokens of sequence b (a fully padded sequence adds 0).
using ::cf::clustering_loss;
// L2 (eq. 11, with the cyclic term phi(C^_1, C^_k)): mean over the batch.
using ::cf::centroid_sorting_loss;

// The hand-over of centroids along one stack of layers (see the top comment).
// Layer 0 writes its C^; layer i > 0 reads C^ of layer i-1 and writes its own;
// the last layer clears it, so the chain never keeps a graph alive between
// forward passes. Running a later layer without the earlier ones in the same
// pass is an error. The hand-over lives in the thread that runs the pass (a
// thread-local table by chain, neural_clustering.cpp), so that threads may run one
// model at once (inference on a shared model), and a pass that failed midway holds
// its C^ only until that thread's next pass or its end.
struct CentroidChain {
  int64_t size = 0;  // number of layers linked
};

struct NeuralClusteringOptions {
  int64_t clusters = 0;   // k >= 1
  int64_t look_back = 1;  // blocks before each block that its queries also see (eq. 8: 1)
  double scale = 0.0;     // attention score scale; 0: 1/sqrt(d_k)
  double dropout = 0.0;   // attention-weight dropout in training, in [0, 1) (inside the block kernel)
  ClusterTieOrder tie_order = ClusterTieOrder::kMembership;
  // Whether the gradients of the clustering (U, C^) and of L1, L2 flow into the
  // layer input X, and from there into everything before the layer (embeddings,
  // LayerNorm gains, earlier layers). The paper's eq. 18 descends L_total on all
  // parameters, which is true here. The default is false: L1 and L2 are negative
  // inner products, unbounded below, and under Adam (which rescales even a tiny
  // mu, nu to full-size steps once the task loss is fitted) they inflate the
  // hidden states without limit. Measured on the pattern task of
  // tests/models/test_neural_clustering_models.cpp: with true, L2 reached -3.6e7 and accuracy
  // fell to chance (0.50) in 600 steps at mu = nu = 1e-3 (0.82 at 1e-5); with
  // false, accuracy 0.98. With false, C and W^C still learn from L1 and L2, and
  // a later layer's losses still reach earlier layers' C and W^C through the
  // centroid chain.
  bool losses_reach_input = false;
  ClusterLossForm loss_form = ClusterLossForm::kInner;  // phi of L1 and L2 (see ClusterLossForm)
};

// Options (JSON): {"clusters": k (required, >= 1), "look_back": >= 0 (default 1),
//   "scale": >= 0 (default 0: 1/sqrt(d_k)), "dropout": attention-weight dropout in [0, 1) (default 0),
//   "tie_order": "membership" (default) or "position",
//   "losses_reach_input": bool (default false, see NeuralClusteringOptions),
//   "loss_form": "inner" (default, the paper's), "cosine" or "sphere" (see ClusterLossForm)}.
// Self-attention only: q, k, v must be projections of args.query_input.
class NeuralClusteringAttention : public Attention {
 public:
  NeuralClusteringAttention(int64_t d_model, const NeuralClusteringOptions& options,
                            Generator& gen = default_generator());
  // The factory draws the initial C and W^C from spec.gen (the global generator
  // when null).
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "neural-clustering"; }

  const NeuralClusteringOptions& options() const { return options_; }
  int64_t d_model() const { return d_model_; }
  // Position in its chain (0: first layer, owns C).
  int64_t chain_index() const { return chain_index_; }
  // The C this layer clusters with in the next forward: the parameter for a
  // first layer, the chain's C^ (B, k, D) otherwise (undefined before layer i-1 ran).
  Tensor current_centroids() const;

  Tensor centroids;  // C (k, d_model), normal with std 1/sqrt(d_model); undefined in a later layer of a chain
  Tensor w_c;        // W^C (d_model, d_model), used as X W^C; U(-1/sqrt(d_model), 1/sqrt(d_model))

 private:
  // The member table of eqs. 8-10 for this input: (B, 1, k, w) sorted positions, -1 in empty
  // slots (undefined for N = 0). Checks the arguments, hands C^ down the chain and adds the
  // auxiliary losses to args.aux.
  Tensor cluster(const AttentionArgs& args);
  // Block attention over that table (eqs. 8-10).
  Tensor attend(const AttentionArgs& args, const Tensor& members) const;
  friend void link_centroid_chain(const std::vector<Attention*>& stack);
  int64_t d_model_;
  NeuralClusteringOptions options_;
  std::shared_ptr<CentroidChain> chain_;
  int64_t chain_index_ = 0;
};

// Links the neural clustering attentions of one stack of layers, in order: the
// first keeps its learned C, each later one drops its own C and takes the
// previous layer's C^. Entries of other variants (or null) are skipped, so a
// model calls this for every stack it builds. Call it before building an
// optimizer or loading a state dict: it removes parameters.
void link_centroid_chain(const std::vector<Attention*>& stack);

}  // namespace nn
}  // namespace cf
