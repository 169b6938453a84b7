#include "models/attention_switch.h"

#include <memory>
#include <vector>

#include "core/error.h"
#include "nn/attention/multi_head.h"

namespace cf {
namespace models {

int64_t set_attention(nn::Module& model, const nn::AttentionSpec& spec, bool include_cross) {
  // Collect first, switch after: switching frees the old attention modules, which
  // named_modules() lists too (after their layer), so they must not be visited.
  std::vector<nn::MultiHeadAttention*> layers;
  for (auto& [name, m] : model.named_modules()) {
    auto* mha = dynamic_cast<nn::MultiHeadAttention*>(m);
    if (!mha) continue;
    const std::string suffix = ".self_attn";
    const bool self = name == "self_attn" || (name.size() > suffix.size() &&
                                              name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
    if (self || include_cross) layers.push_back(mha);
  }
  // Build every new variant before switching any, so that bad options leave the model unchanged.
  std::vector<std::shared_ptr<nn::Attention>> fresh;
  for (nn::MultiHeadAttention* mha : layers) {
    nn::AttentionSpec s = spec;
    s.d_model = mha->d_model();
    s.n_heads = mha->n_heads();
    fresh.push_back(nn::make_attention(s));
  }
  const int64_t switched = int64_t(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->set_attention(fresh[i]);
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
