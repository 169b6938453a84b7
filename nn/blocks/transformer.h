#pragma once
// Transformer encoder and decoder layers (Vaswani et al. 2017, section 3.1), with
// the attention variant taken from the options, in post-LN (the original) or
// pre-LN form (Xiong et al. 2020: LayerNorm inside the residual branch, stabler
// without warmup).
#include <memory>
#include <string>

#include "core/rng.h"
#include "nn/attention/multi_head.h"
#include "nn/layers/basic.h"

namespace cf {
namespace nn {

struct TransformerLayerOptions {
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t d_ff = 512;
  double dropout = 0.1;  // on each residual branch and inside the feed-forward block
  std::string activation = "relu";
  bool norm_first = true;  // pre-LN; false: post-LN
  AttentionSpec attention;        // self-attention variant (d_model/n_heads are filled in)
  // Decoder cross-attention variant (default full); errors name its options "cross_attention.*".
  AttentionSpec cross_attention{"full", 0, 0, Config(nlohmann::json::object(), "cross_attention"), nullptr};
};

class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerLayerOptions& o, Generator& gen = default_generator());
  // x (B, N, D), key_padding_mask bool (B, N) true = padding.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask = {}, bool causal = false,
                 AuxLosses* aux = nullptr);
  std::shared_ptr<MultiHeadAttention> self_attn;
  std::shared_ptr<FeedForward> ff;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  bool norm_first_;
  std::shared_ptr<Dropout> drop_;
};

class TransformerDecoderLayer : public Module {
 public:
  explicit TransformerDecoderLayer(const TransformerLayerOptions& o, Generator& gen = default_generator());
  // x (B, Nt, D) attends causally to itself and fully to memory (B, Ns, D).
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& tgt_padding_mask = {},
                 const Tensor& memory_padding_mask = {}, AuxLosses* aux = nullptr);
  std::shared_ptr<MultiHeadAttention> self_attn, cross_attn;
  std::shared_ptr<FeedForward> ff;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;

 private:
  bool norm_first_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace nn
}  // namespace cf
