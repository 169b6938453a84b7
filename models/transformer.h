#pragma once
// The full-attention Transformer baselines every efficient variant is compared
// with. The attention type comes from the config, so the same model runs with
// any variant in nn/attention/.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "nn/layers/sequence.h"
#include "nn/blocks/transformer.h"

namespace cf {
namespace models {

struct TransformerConfig {
  int64_t vocab_size = 0;      // source vocabulary (and target, unless tgt_vocab_size is set)
  int64_t tgt_vocab_size = 0;  // encoder-decoder target vocabulary; 0: vocab_size
  int64_t max_len = 512;
  int64_t n_layers = 2;
  int64_t n_decoder_layers = 0;  // encoder-decoder; 0: n_layers
  int64_t pad_id = 0;
  std::string positional = "sinusoidal";  // or "learned"
  int64_t num_classes = 2;                // classifiers
  std::string pooling = "mean";           // classifiers: "mean" over non-padding tokens, or "first"
  nn::TransformerLayerOptions layer;

  // Reads {"vocab_size", "tgt_vocab_size", "max_len", "n_layers", "n_decoder_layers",
  // "pad_id", "positional", "num_classes", "pooling", "d_model", "n_heads", "d_ff",
  // "dropout", "activation", "norm_first", "attention": {"type": ..., options...},
  // "cross_attention": {...}}; every key optional, unknown keys and wrong types are errors.
  static TransformerConfig from_json(const nlohmann::json& j);
  // Every key from_json reads, so from_json(to_json()) gives this config back (a run's config written beside
  // its checkpoint; the Python package pickles configs with it).
  nlohmann::json to_json() const;
  void validate(const char* who) const;
};

// Token embedding + positional encoding + a stack of encoder layers (+ a final
// LayerNorm in the pre-LN form, whose residual stream is otherwise unnormalised).
class TransformerEncoder : public nn::Module {
 public:
  TransformerEncoder(const TransformerConfig& c, int64_t vocab_size, int64_t n_layers,
                     Generator& gen = default_generator());
  // ids int64 (B, N), key_padding_mask bool (B, N) true = padding -> (B, N, D).
  // Without a mask, tokens equal to pad_id (when pad_id >= 0) are masked: padding
  // never leaks into attention or pooling because a caller forgot the mask.
  Tensor forward(const Tensor& ids, const Tensor& key_padding_mask = {}, bool causal = false,
                 nn::AuxLosses* aux = nullptr);
  Tensor embed(const Tensor& ids);  // embedding + positions + dropout
  // `mask` when given, else padding_mask(ids, pad_id).
  Tensor effective_mask(const Tensor& ids, const Tensor& mask) const;
  std::shared_ptr<nn::Embedding> embedding;
  std::vector<std::shared_ptr<nn::TransformerEncoderLayer>> layers;
  std::shared_ptr<nn::LayerNorm> final_norm;  // null in the post-LN form

 private:
  std::shared_ptr<nn::UnaryModule> positions_;
  std::shared_ptr<nn::Dropout> drop_;
  int64_t vocab_, pad_id_;
};

// The padding mask of ids (ids == pad_id), undefined when pad_id < 0. Defined (all false) when no id is
// padding: deciding otherwise would read the ids back from the device on every forward.
Tensor padding_mask(const Tensor& ids, int64_t pad_id);

// Mean over the non-padding tokens, or the first token: (B, N, D) -> (B, D).
Tensor pool_sequence(const Tensor& h, const Tensor& key_padding_mask, const std::string& pooling);

// Sequence classifier: encoder, pooling, linear head -> logits (B, num_classes).
class EncoderClassifier : public nn::Module {
 public:
  explicit EncoderClassifier(const TransformerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids, const Tensor& key_padding_mask = {}, nn::AuxLosses* aux = nullptr);
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Linear> head;

 private:
  std::string pooling_;
};

// Per-token classifier (tagging, masked-token prediction): the bidirectional
// encoder and a linear head on every position -> logits (B, N, num_classes).
// Padded positions get logits too (the caller's loss ignores them); no position
// sees a padded one.
class TokenClassifier : public nn::Module {
 public:
  explicit TokenClassifier(const TransformerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids, const Tensor& key_padding_mask = {}, nn::AuxLosses* aux = nullptr);
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Linear> head;
};

// Sentence-pair classifier in the two-tower form of the Long Range Arena
// retrieval task: one shared encoder pools each text to u and v, and an MLP
// classifies [u, v, u * v, u - v] -> logits (B, num_classes).
class PairClassifier : public nn::Module {
 public:
  explicit PairClassifier(const TransformerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids_a, const Tensor& mask_a, const Tensor& ids_b, const Tensor& mask_b,
                 nn::AuxLosses* aux = nullptr);
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Linear> fc1, fc2;

 private:
  std::string pooling_;
};

// Decoder-only language model: causal encoder stack and a vocabulary head -> (B, N, V).
class CausalLM : public nn::Module {
 public:
  explicit CausalLM(const TransformerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids, const Tensor& key_padding_mask = {}, nn::AuxLosses* aux = nullptr);
  std::shared_ptr<TransformerEncoder> decoder;
  std::shared_ptr<nn::Linear> head;
};

// Encoder-decoder: the decoder attends causally to the target prefix and fully to
// the encoded source -> logits (B, Nt, tgt_vocab).
class EncoderDecoder : public nn::Module {
 public:
  explicit EncoderDecoder(const TransformerConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& tgt, const Tensor& tgt_mask = {},
                 nn::AuxLosses* aux = nullptr);
  Tensor encode(const Tensor& src, const Tensor& src_mask, nn::AuxLosses* aux = nullptr);
  Tensor decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt, const Tensor& tgt_mask = {},
                nn::AuxLosses* aux = nullptr);
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Embedding> tgt_embedding;
  std::vector<std::shared_ptr<nn::TransformerDecoderLayer>> decoder_layers;
  std::shared_ptr<nn::LayerNorm> final_norm;
  std::shared_ptr<nn::Linear> head;

 private:
  std::shared_ptr<nn::UnaryModule> positions_;
  std::shared_ptr<nn::Dropout> drop_;
  int64_t tgt_vocab_, pad_id_;
};

}  // namespace models
}  // namespace cf
