#include "nn/blocks/transformer.h"

#include "autograd/ops/elementwise.h"
#include "core/error.h"

namespace cf {
namespace nn {

namespace {
std::shared_ptr<MultiHeadAttention> make_mha(const TransformerLayerOptions& o, AttentionSpec spec, Generator& gen) {
  spec.d_model = o.d_model;
  spec.n_heads = o.n_heads;
  spec.gen = &gen;
  return std::make_shared<MultiHeadAttention>(o.d_model, o.n_heads, make_attention(spec), gen);
}
void check_options(const TransformerLayerOptions& o, const char* who) {
  CF_CHECK(o.d_model > 0 && o.n_heads > 0 && o.d_model % o.n_heads == 0 && o.d_ff > 0, ValueError, "[", who,
           "] needs d_model a positive multiple of n_heads and d_ff > 0; got d_model=", o.d_model,
           " n_heads=", o.n_heads, " d_ff=", o.d_ff);
}
}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerLayerOptions& o, Generator& gen)
    : norm_first_(o.norm_first) {
  check_options(o, "TransformerEncoderLayer");
  self_attn = register_module("self_attn", make_mha(o, o.attention, gen));
  ff = register_module("ff", std::make_shared<FeedForward>(o.d_model, o.d_ff, o.activation, o.dropout, gen));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(o.d_model));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(o.d_model));
  drop_ = register_module("dropout", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const Tensor& mask, bool causal, AuxLosses* aux) {
  if (norm_first_) {
    Tensor h = norm1->forward(x);
    Tensor y = x + drop_->forward(self_attn->forward(h, h, h, mask, causal, aux));
    return y + drop_->forward(ff->forward(norm2->forward(y)));
  }
  Tensor y = norm1->forward(x + drop_->forward(self_attn->forward(x, x, x, mask, causal, aux)));
  return norm2->forward(y + drop_->forward(ff->forward(y)));
}

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerOptions& o, Generator& gen)
    : norm_first_(o.norm_first) {
  check_options(o, "TransformerDecoderLayer");
  self_attn = register_module("self_attn", make_mha(o, o.attention, gen));
  self_attn->require_causal("TransformerDecoderLayer");  // its forward masks causally, always
  cross_attn = register_module("cross_attn", make_mha(o, o.cross_attention, gen));
  CF_CHECK(!cross_attn->attention().shares_qk(), ValueError, "[TransformerDecoderLayer] cross_attention '",
           o.cross_attention.type, "' would take its keys from the queries (shared_qk, or LSH), but "
           "cross-attention's keys come from the memory");
  ff = register_module("ff", std::make_shared<FeedForward>(o.d_model, o.d_ff, o.activation, o.dropout, gen));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(o.d_model));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(o.d_model));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(o.d_model));
  drop_ = register_module("dropout", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerDecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& tgt_mask,
                                        const Tensor& mem_mask, AuxLosses* aux) {
  CF_CHECK(memory.defined(), ValueError, "[TransformerDecoderLayer] memory is undefined");
  if (norm_first_) {
    Tensor h = norm1->forward(x);
    Tensor y = x + drop_->forward(self_attn->forward(h, h, h, tgt_mask, true, aux));
    Tensor h2 = norm2->forward(y);
    y = y + drop_->forward(cross_attn->forward(h2, memory, memory, mem_mask, false, aux, tgt_mask));
    return y + drop_->forward(ff->forward(norm3->forward(y)));
  }
  Tensor y = norm1->forward(x + drop_->forward(self_attn->forward(x, x, x, tgt_mask, true, aux)));
  y = norm2->forward(y + drop_->forward(cross_attn->forward(y, memory, memory, mem_mask, false, aux, tgt_mask)));
  return norm3->forward(y + drop_->forward(ff->forward(y)));
}

}  // namespace nn
}  // namespace cf
