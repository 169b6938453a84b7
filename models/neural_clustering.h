#pragma once
// ClusterFormer (Wang et al., ACL 2022; not Cluster-Former, models/cluster_former.h): the Transformer models of
// models/transformer.h with neural clustering attention in every self-attention
// layer (nn/attention/neural_clustering.h). Only the attention differs from the
// baseline; the encoder and decoder stacks link their layers' centroid chains
// themselves. This file holds the paper's settings and its training objective.
#include <map>
#include <string>

#include "models/transformer.h"
#include "nn/config.h"
#include "nn/losses.h"

namespace cf {
namespace models {

// Appendix C, eq. 17: L_total = mu L1 + nu L2 + lambda L_task. The paper gives
// no values for mu and nu; the defaults are ours (small: L1 and L2 are negative
// inner products, unbounded below).
struct ClusterFormerLossWeights {
  double mu = 1e-3;      // clustering loss L1 (eq. 6), summed over the layers
  double nu = 1e-3;      // centroid sorting loss L2 (eq. 11), summed over the layers
  double lambda = 1.0;   // task loss L3 (eq. 16)
  // Reads {"mu", "nu", "lambda"} (each optional, >= 0) and calls finish().
  static ClusterFormerLossWeights from_config(const nn::Config& c);
};

// lambda * task_loss + mu * sum(L1) + nu * sum(L2) over what the layers added to
// aux. With no neural clustering layer (aux empty) this is lambda * task_loss;
// losses of other names in aux are an error (AuxLosses::total).
Tensor clusterformer_loss(const Tensor& task_loss, const nn::AuxLosses& aux, const ClusterFormerLossWeights& w);

// The paper's settings (section 4), ready for the models of models/transformer.h:
// text classification (4.2): L = 2, d = 300, 4 heads, k = round(sqrt(max_len)).
TransformerConfig clusterformer_classifier_config(int64_t vocab_size, int64_t max_len, int64_t num_classes);
// NLI and text matching (4.3, PairClassifier): L = 1, d = 300, 6 heads, k = 3.
TransformerConfig clusterformer_pair_config(int64_t vocab_size, int64_t max_len, int64_t num_classes);
// Causal LM (CausalLM, masked variant of appendix B) with the IWSLT14 decoder
// settings of section 4.1: L = 6, d = 512, 4 heads, d_ff = 1024, k = 3.
TransformerConfig clusterformer_lm_config(int64_t vocab_size, int64_t max_len);

}  // namespace models
}  // namespace cf
