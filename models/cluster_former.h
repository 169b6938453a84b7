#pragma once
// Cluster-Former (Wang et al. 2021): a stack of Sliding-Window layers (section
// 3.1) and Cluster-Former layers (section 3.2) over a long context, optionally
// with a question prepended to every window (eq. 1), with heads for extractive
// question answering and for language modelling.
//
// Which layers cluster: an explicit 0-based list ("cluster_layers"), or the
// paper's rule (Table 4) "layer % a == 0 and layer >= b" ("cluster_every" = a,
// "cluster_from" = b). Every other layer is a Sliding-Window layer.
//
// Positions: token ids [question; context] get positions 0 .. q + x - 1 of one
// table (max_len). The paper instead gives each window positions 0 .. q + l - 1
// because its RoBERTa start has only 512 position embeddings; trained from
// scratch, whole-sequence positions are the simpler choice.
//
// Training: each cluster layer owns a MemoryBank (Algorithm 1) that its forward
// fills in training mode; call on_train_step() once per optimizer step (e.g.
// from TrainLoopHooks::on_step_end) so the centroids are recomputed every
// update_every steps. Centroids, FIFO and counters are state_dict buffers.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "nn/blocks/cluster_former_layers.h"
#include "nn/layers/sequence.h"

namespace cf {
namespace models {

struct ClusterFormerConfig {
  int64_t vocab_size = 0;
  int64_t max_len = 4096;  // question + context tokens
  int64_t pad_id = 0;
  std::string positional = "sinusoidal";  // "sinusoidal", "learned" or "none"
  int64_t n_layers = 4;
  int64_t window = 256;  // l
  int64_t stride = 224;  // m < l
  std::vector<int64_t> cluster_layers;  // 0-based; when empty, the rule below
  int64_t cluster_every = 0;            // a (0: no rule)
  int64_t cluster_from = 0;             // b
  nn::TransformerLayerOptions layer;    // layer.attention: the sliding-window layers' attention (default full)
  // Options of the cluster layers' "cluster-former" attention (see
  // nn/attention/cluster_former.h); chunk_size defaults to the stride m (eq. 8).
  // With a "type" other than "cluster-former" (e.g. {"type": "lsh", "n_buckets":
  // 64}) those layers run that attention over the whole sequence instead: the
  // paper's Table 5 baselines (LSH or sparse attention in the layers Cluster-Former
  // would take, sliding windows elsewhere); they have no memory bank.
  nlohmann::json cluster_attention = nlohmann::json::object();

  // Reads {"vocab_size", "max_len", "pad_id", "positional", "n_layers", "window",
  // "stride", "cluster_layers", "cluster_every", "cluster_from", "d_model",
  // "n_heads", "d_ff", "dropout", "activation", "norm_first", "attention":
  // {"type", ...}, "cluster_attention": {...}}; unknown keys and wrong types are errors.
  static ClusterFormerConfig from_json(const nlohmann::json& j);
  void validate(const char* who) const;
  bool is_cluster_layer(int64_t layer) const;
};

class ClusterFormerEncoder : public nn::Module {
 public:
  explicit ClusterFormerEncoder(const ClusterFormerConfig& c, Generator& gen = default_generator());
  // context ids int64 (B, x), question ids int64 (B, q) or undefined; masks bool,
  // true = padding, default ids == pad_id. -> context (B, x, D) and, with a
  // question, its per-window states (B, K, q, D).
  nn::WindowedStates forward(const Tensor& context, const Tensor& context_mask = {}, const Tensor& question = {},
                             const Tensor& question_mask = {}, bool causal = false, nn::AuxLosses* aux = nullptr);
  // The memory banks of the cluster layers, bottom to top.
  std::vector<std::shared_ptr<nn::MemoryBank>> memory_banks() const;
  // One optimizer step is done: bank->step() on every bank (Algorithm 1, "if i %
  // ClusterUpdateFrequency == 0"). Returns how many banks recomputed centroids.
  int64_t on_train_step();
  const ClusterFormerConfig& config() const { return config_; }

  std::shared_ptr<nn::Embedding> embedding;
  // Layer i is sliding[i] or clusters[i] (the other is null).
  std::vector<std::shared_ptr<nn::SlidingWindowLayer>> sliding;
  std::vector<std::shared_ptr<nn::ClusterFormerLayer>> clusters;
  std::shared_ptr<nn::LayerNorm> final_norm;  // pre-LN only

 private:
  ClusterFormerConfig config_;
  std::shared_ptr<nn::PositionalEncoding> positions_;
  std::shared_ptr<nn::Dropout> drop_;
};

struct QAOutput {
  Tensor start_logits, end_logits;  // (B, x); padding positions -1e9
  Tensor answerable_logits;         // (B,): > 0 means answerable
};

// Extractive QA (section 4.2): start/end logits over the context tokens, and an
// answerable flag from the mean over windows of each window's first hidden state,
// (1/K) sum_k H_k^N[0] (windows whose slice X[m k : m k + m] is all padding left out).
// Question padding (question_mask / pad_id) shifts no position: question tokens are numbered
// among its real ones, and the context follows them. The context is numbered from its first
// slot and the flag reads the question's first slot: pad both at their end.
class ClusterFormerQA : public nn::Module {
 public:
  explicit ClusterFormerQA(const ClusterFormerConfig& c, Generator& gen = default_generator());
  QAOutput forward(const Tensor& question, const Tensor& question_mask, const Tensor& context,
                   const Tensor& context_mask = {}, nn::AuxLosses* aux = nullptr);
  int64_t on_train_step() { return encoder->on_train_step(); }
  std::shared_ptr<ClusterFormerEncoder> encoder;
  std::shared_ptr<nn::Linear> span_head, answerable_head;
};

// Causal language model (section 4.4): logits (B, x, vocab) for the next token.
class ClusterFormerLM : public nn::Module {
 public:
  explicit ClusterFormerLM(const ClusterFormerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids, const Tensor& mask = {}, nn::AuxLosses* aux = nullptr);
  int64_t on_train_step() { return encoder->on_train_step(); }
  std::shared_ptr<ClusterFormerEncoder> encoder;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace models
}  // namespace cf
