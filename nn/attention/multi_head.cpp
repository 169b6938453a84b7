#include "nn/attention/multi_head.h"

#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

MultiHeadAttention::MultiHeadAttention(int64_t d_model, int64_t n_heads, std::shared_ptr<Attention> attention,
                                       Generator& gen, bool bias)
    : d_model_(d_model), n_heads_(n_heads), attention_(std::move(attention)) {
  CF_CHECK(d_model > 0 && n_heads > 0 && d_model % n_heads == 0, ValueError, "[MultiHeadAttention] d_model (",
           d_model, ") must be a positive multiple of n_heads (", n_heads, ")");
  CF_CHECK(attention_ != nullptr, ValueError, "[MultiHeadAttention] attention is null");
  w_q = register_module("w_q", std::make_shared<Linear>(d_model, d_model, bias, gen));
  if (!attention_->shares_qk()) w_k = register_module("w_k", std::make_shared<Linear>(d_model, d_model, bias, gen));
  w_v = register_module("w_v", std::make_shared<Linear>(d_model, d_model, bias, gen));
  w_o = register_module("w_o", std::make_shared<Linear>(d_model, d_model, bias, gen));
  register_module("attention", attention_);
}

void MultiHeadAttention::check_attention(const Attention* attention) const {
  CF_CHECK(attention != nullptr, ValueError, "[MultiHeadAttention] set_attention: attention is null");
  CF_CHECK(attention->shares_qk() == (w_k == nullptr), ValueError, "[MultiHeadAttention] set_attention: '",
           attention->type(), "' and '", attention_->type(),
           "' disagree on sharing queries and keys, so they need different projections");
  CF_CHECK(!causal_only_ || attention->supports_causal(), NotImplementedError,
           "[MultiHeadAttention] set_attention: '", attention->type(),
           "' cannot mask causally, and this layer always runs causally (a decoder's self-attention); use "
           "improved-clustered or another variant");
}

void MultiHeadAttention::set_attention(std::shared_ptr<Attention> attention) {
  check_attention(attention.get());
  attention->train(is_training());
  replace_module("attention", attention);
  attention_ = std::move(attention);
}

void MultiHeadAttention::require_causal(const char* who) {
  CF_CHECK(attention_->supports_causal(), NotImplementedError, "[", who, "] attention '", attention_->type(),
           "' cannot mask causally, which this model's decoder layers need; use improved-clustered (causal over "
           "its top-k keys) or another variant");
  causal_only_ = true;
}

Tensor MultiHeadAttention::split_heads(const Tensor& x) const {
  const Shape& s = x.shape();
  return transpose(reshape(x, {s[0], s[1], n_heads_, d_model_ / n_heads_}), 1, 2);
}

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, bool causal, AuxLosses* aux,
                                   const Tensor& query_padding_mask) {
  CF_CHECK(query.defined() && key.defined() && value.defined(), ValueError,
           "[MultiHeadAttention] query, key and value must be defined");
  auto is_seq = [&](const Tensor& t) { return t.dim() == 3 && t.shape()[2] == d_model_; };
  CF_CHECK(is_seq(query) && is_seq(key) && is_seq(value) && key.shape()[0] == query.shape()[0] &&
               value.shape()[0] == query.shape()[0] && key.shape()[1] == value.shape()[1],
           ShapeError, "[MultiHeadAttention] expected query (B, Nq, ", d_model_, ") and key/value (B, Nk, ", d_model_,
           "); got query ", shape_str(query.shape()), ", key ", shape_str(key.shape()), ", value ",
           shape_str(value.shape()));
  const bool self = query.is_same(key);
  // The layout decides (w_k was built or not), whatever the attention says now.
  CF_CHECK(w_k || self, ValueError, "[MultiHeadAttention] attention '", attention_->type(),
           "' shares queries and keys, so it only supports self-attention");
  AttentionArgs a;
  a.q = split_heads(w_q->forward(query));
  a.k = w_k ? split_heads(w_k->forward(key)) : a.q;
  a.v = split_heads(w_v->forward(value));
  a.key_padding_mask = key_padding_mask;
  a.query_padding_mask = query_padding_mask.defined() ? query_padding_mask : (self ? key_padding_mask : Tensor());
  a.causal = causal;
  a.query_input = query;
  a.aux = aux;
  Tensor out = attention_->forward(a);  // (B, H, Nq, Dh)
  CF_CHECK(out.dim() == 4 && out.shape()[0] == query.shape()[0] && out.shape()[1] == n_heads_ &&
               out.shape()[2] == query.shape()[1],
           ShapeError, "[MultiHeadAttention] attention '", attention_->type(), "' returned ", shape_str(out.shape()),
           ", expected (B, H, Nq, Dv) = (", query.shape()[0], ", ", n_heads_, ", ", query.shape()[1], ", Dv)");
  Tensor merged = reshape(transpose(out, 1, 2), {query.shape()[0], query.shape()[1], d_model_});
  return w_o->forward(merged);
}

}  // namespace nn
}  // namespace cf
