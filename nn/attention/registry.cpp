// The one list of attention variants a model can be configured with. A new
// variant adds one line here (explicit, because a static library drops
// self-registering objects nobody references).
#include <map>

#include "core/error.h"
#include "nn/attention/attention.h"
#include "nn/attention/cluster_former.h"
#include "nn/attention/clustered.h"
#include "nn/attention/full.h"
#include "nn/attention/lsh.h"
#include "nn/attention/neural_clustering.h"
#include "nn/attention/routing.h"
#include "nn/attention/sparse.h"

namespace cf {
namespace nn {

namespace {
using Factory = std::shared_ptr<Attention> (*)(const AttentionSpec&);
const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> f = {
      {"full", &FullAttention::create},
      {"lsh", &LSHAttention::create},
      {"routing", &RoutingAttention::create},
      {"clustered", &ClusteredAttention::create_clustered},
      {"improved-clustered", &ClusteredAttention::create_improved},
      {"cluster-former", &ClusterFormerAttention::create},
      {"neural-clustering", &NeuralClusteringAttention::create},
      {"sparse", &SparseAttention::create},
  };
  return f;
}
}  // namespace

std::vector<std::string> attention_types() {
  std::vector<std::string> out;
  for (auto& e : factories()) out.push_back(e.first);
  return out;
}

std::shared_ptr<Attention> make_attention(const AttentionSpec& spec) {
  CF_CHECK(spec.d_model > 0 && spec.n_heads > 0 && spec.d_model % spec.n_heads == 0, ValueError,
           "[make_attention] d_model (", spec.d_model, ") must be a positive multiple of n_heads (", spec.n_heads,
           ")");
  auto it = factories().find(spec.type);
  if (it == factories().end()) {
    std::string known;
    for (auto& t : attention_types()) known += (known.empty() ? "" : ", ") + t;
    throw ValueError(str("[make_attention] unknown attention type '", spec.type, "' (known: ", known, ")"));
  }
  // Every variant's option: keys from the queries' projection (Attention::shares_qk).
  const bool shared_qk = spec.options.get<bool>("shared_qk", false);
  std::shared_ptr<Attention> attention = it->second(spec);
  if (shared_qk) attention->set_shared_qk(true);
  return attention;
}

}  // namespace nn
}  // namespace cf
