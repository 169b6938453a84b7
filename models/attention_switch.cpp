#include "models/attention_switch.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/attention/multi_head.h"
#include "nn/attention/neural_clustering.h"

namespace cf {
namespace models {

int64_t set_attention(nn::Module& model, const nn::AttentionSpec& spec, bool include_cross) {
  // Collect first, switch after: switching frees the old attention modules, which
  // named_modules() lists too (after their layer), so they must not be visited.
  std::vector<nn::MultiHeadAttention*> layers;
  // The self-attention layers of each stack ("encoder.layers.3.self_attn" is layer 3 of the stack
  // "encoder.layers"), in layer order: neural clustering attention hands its centroids down a stack
  // (link_centroid_chain), as the models' constructors link theirs.
  std::map<std::string, std::map<int64_t, nn::MultiHeadAttention*>> stacks;
  for (auto& [name, m] : model.named_modules()) {
    auto* mha = dynamic_cast<nn::MultiHeadAttention*>(m);
    if (!mha) continue;
    const std::string suffix = ".self_attn";
    const bool self = name == "self_attn" || (name.size() > suffix.size() &&
                                              name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
    if (self || include_cross) layers.push_back(mha);
    if (!self || name == "self_attn") continue;
    const std::string layer = name.substr(0, name.size() - suffix.size());
    const size_t dot = layer.rfind('.');
    const std::string index = dot == std::string::npos ? layer : layer.substr(dot + 1);
    if (index.empty() || index.size() > 18 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    stacks[dot == std::string::npos ? std::string() : layer.substr(0, dot)][std::stoll(index)] = mha;
  }
  // Build every new variant before switching any, so that bad options leave the model unchanged.
  std::vector<std::shared_ptr<nn::Attention>> fresh;
  for (nn::MultiHeadAttention* mha : layers) {
    nn::AttentionSpec s = spec;
    s.d_model = mha->d_model();
    s.n_heads = mha->n_heads();
    fresh.push_back(nn::make_attention(s));
  }
  // Every layer's check before any switch (set_attention would throw half way, after switching the layers before).
  for (size_t i = 0; i < layers.size(); ++i) {
    CF_CHECK(!layers[i]->requires_causal() || fresh[i]->supports_causal(), NotImplementedError, "[set_attention] '",
             fresh[i]->type(), "' cannot mask causally, and the model's decoder layers run causally; use "
             "improved-clustered or another variant (nothing was switched)");
    layers[i]->check_attention(fresh[i].get());
  }
  const int64_t switched = int64_t(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->set_attention(fresh[i]);
  for (auto& [stack_name, by_index] : stacks) {
    // A stack of one width, as the models link theirs (the point-cloud classifier's blocks widen from
    // layer to layer: built with neural clustering, each clusters on its own, and so after a switch).
    std::vector<nn::Attention*> stack;
    bool one_width = true;
    for (auto& [index, mha] : by_index) {
      one_width = one_width && mha->d_model() == by_index.begin()->second->d_model();
      stack.push_back(&mha->attention());
    }
    if (one_width) nn::link_centroid_chain(stack);
  }
  CF_CHECK(switched > 0, ValueError, "[set_attention] the model has no ", include_cross ? "" : "self-",
           "attention layer (MultiHeadAttention", include_cross ? "" : " named self_attn", ") to switch");
  return switched;
}

int64_t set_attention(nn::Module& model, const nlohmann::json& attention, bool include_cross) {
  CF_CHECK(attention.is_object(), ValueError, "[set_attention] expected an object {\"type\": ..., options...}, got ",
           attention.dump());
  nn::AttentionSpec spec;
  nlohmann::json opts = attention;
  if (opts.contains("type")) {
    CF_CHECK(opts["type"].is_string(), ValueError, "[set_attention] \"type\" must be a string, got ",
             opts["type"].dump());
    spec.type = opts["type"].get<std::string>();
    opts.erase("type");
  }
  spec.options = nn::Config(opts, "attention");
  return set_attention(model, spec, include_cross);
}

}  // namespace models
}  // namespace cf
