#pragma once
// Switch the attention variant of a trained model (Vyas et al. 2020, Table 1: train
// with one attention, evaluate with another). Works on any module tree built from
// nn::MultiHeadAttention: the projections stay, only the variant changes.
#include <string>

#include "nn/attention/attention.h"
#include "nn/module.h"

namespace cf {
namespace models {

// Replaces the attention of every self-attention layer of `model` (modules named
// "self_attn", or every MultiHeadAttention when include_cross is true) with a new
// instance of spec.type built with spec.options (d_model and n_heads are each
// layer's own). Returns the number of layers switched; an error names the problem
// when there is none, or when the options are invalid. The self-attention layers of
// one stack (modules "<stack>.<i>.self_attn") of one width are linked as the models'
// constructors link them: neural clustering attention then hands its centroids from
// layer to layer (link_centroid_chain), and the switched model has the state-dict keys
// of one built with that variant (a stack whose width changes, the point-cloud
// classifier's, is not linked: each layer clusters on its own). Switch before building
// an optimizer: parameters are replaced.
int64_t set_attention(nn::Module& model, const nn::AttentionSpec& spec, bool include_cross = false);

// The same from a JSON object {"type": ..., options...}, as in a model config.
int64_t set_attention(nn::Module& model, const nlohmann::json& attention, bool include_cross = false);

}  // namespace models
}  // namespace cf
