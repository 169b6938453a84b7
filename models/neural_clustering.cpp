#include "models/neural_clustering.h"

#include <algorithm>
#include <cmath>

#include "autograd/ops/elementwise.h"
#include "core/error.h"
#include "nn/attention/neural_clustering.h"

namespace cf {
namespace models {

ClusterFormerLossWeights ClusterFormerLossWeights::from_config(const nn::Config& c) {
  ClusterFormerLossWeights w;
  w.mu = c.get<double>("mu", w.mu);
  w.nu = c.get<double>("nu", w.nu);
  w.lambda = c.get<double>("lambda", w.lambda);
  for (const char* key : {"mu", "nu", "lambda"}) {
    const double v = std::string(key) == "mu" ? w.mu : std::string(key) == "nu" ? w.nu : w.lambda;
    CF_CHECK(v >= 0 && std::isfinite(v), ValueError, "[ClusterFormerLossWeights] ", c.path_of(key),
             " must be a finite number >= 0 (eq. 17), got ", v);
  }
  c.finish();
  return w;
}

Tensor clusterformer_loss(const Tensor& task_loss, const nn::AuxLosses& aux, const ClusterFormerLossWeights& w) {
  CF_CHECK(task_loss.defined() && task_loss.numel() == 1, ValueError,
           "[clusterformer_loss] task_loss must be a one-element tensor, got ",
           task_loss.defined() ? task_loss.describe() : std::string("undefined"));
  Tensor total = task_loss * w.lambda;
  if (aux.empty()) return total;
  return total + aux.total({{nn::kClusteringLossName, w.mu}, {nn::kCentroidSortingLossName, w.nu}});
}

namespace {
TransformerConfig clusterformer_config(int64_t vocab, int64_t max_len, int64_t layers, int64_t d, int64_t heads,
                                       int64_t d_ff, int64_t k) {
  TransformerConfig c;
  c.vocab_size = vocab;
  c.max_len = max_len;
  c.n_layers = layers;
  c.layer.d_model = d;
  c.layer.n_heads = heads;
  c.layer.d_ff = d_ff;
  c.layer.attention.type = "neural-clustering";
  c.layer.attention.options = nn::Config(nlohmann::json{{"clusters", k}}, "attention");
  c.validate("clusterformer_config");
  return c;
}
}  // namespace

TransformerConfig clusterformer_classifier_config(int64_t vocab_size, int64_t max_len, int64_t num_classes) {
  CF_CHECK(max_len >= 1, ValueError, "[clusterformer_classifier_config] max_len must be >= 1, got ", max_len);
  TransformerConfig c = clusterformer_config(vocab_size, max_len, 2, 300, 4, 1200,
                                             std::max<int64_t>(1, std::llround(std::sqrt(double(max_len)))));
  c.num_classes = num_classes;
  c.validate("clusterformer_classifier_config");
  return c;
}

TransformerConfig clusterformer_pair_config(int64_t vocab_size, int64_t max_len, int64_t num_classes) {
  TransformerConfig c = clusterformer_config(vocab_size, max_len, 1, 300, 6, 1200, 3);
  c.num_classes = num_classes;
  c.validate("clusterformer_pair_config");
  return c;
}

TransformerConfig clusterformer_lm_config(int64_t vocab_size, int64_t max_len) {
  return clusterformer_config(vocab_size, max_len, 6, 512, 4, 1024, 3);
}

}  // namespace models
}  // namespace cf
