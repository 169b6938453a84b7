#pragma once
// Multi-head attention around any Attention variant (Vaswani et al. 2017, section 3.2.2):
// project queries, keys and values (w_q, w_k, w_v), split into heads, run the
// variant, merge the heads and project back (w_o).
#include <memory>

#include "core/rng.h"
#include "nn/attention/attention.h"
#include "nn/layers/basic.h"

namespace cf {
namespace nn {

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t d_model, int64_t n_heads, std::shared_ptr<Attention> attention,
                     Generator& gen = default_generator(), bool bias = true);
  // query (B, Nq, D), key/value (B, Nk, D) -> (B, Nq, D). key_padding_mask bool
  // (B, Nk), true = padding. query_padding_mask defaults to the key mask when the
  // query is the key (self-attention).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = {},
                 bool causal = false, AuxLosses* aux = nullptr, const Tensor& query_padding_mask = {});
  // Self-attention: forward(x, x, x, mask, causal).
  Tensor operator()(const Tensor& x, const Tensor& key_padding_mask = {}, bool causal = false,
                    AuxLosses* aux = nullptr) {
    return forward(x, x, x, key_padding_mask, causal, aux);
  }
  int64_t d_model() const { return d_model_; }
  int64_t n_heads() const { return n_heads_; }
  Attention& attention() const { return *attention_; }
  // Shared ownership: stays valid after set_attention replaces it.
  std::shared_ptr<Attention> attention_ptr() const { return attention_; }
  // Switch the attention variant, keeping the projections (variants without
  // parameters of their own then share every weight: a model trained with one
  // variant is evaluated with another). The new variant takes this layer's
  // training mode; it must agree on sharing Q and K, which decides w_k.
  void set_attention(std::shared_ptr<Attention> attention);
  // What set_attention checks before switching (a null variant, sharing Q and K, causal masking):
  // models::set_attention runs it on every layer before switching any.
  void check_attention(const Attention* attention) const;
  // Marks this layer as one that always runs causally (a decoder's self-attention: CausalLM and
  // EncoderDecoder mark theirs). Its variant must support causal masking, now (else an error naming
  // `who`, the model) and after every set_attention.
  void require_causal(const char* who);
  bool requires_causal() const { return causal_only_; }

  std::shared_ptr<Linear> w_q, w_k, w_v, w_o;  // w_k is null when the variant shares Q and K

 private:
  Tensor split_heads(const Tensor& x) const;  // (B, N, D) -> (B, H, N, D/H)
  int64_t d_model_, n_heads_;
  std::shared_ptr<Attention> attention_;
  bool causal_only_ = false;
};

}  // namespace nn
}  // namespace cf
