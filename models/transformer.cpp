#include "models/transformer.h"

#include <cmath>

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "nn/attention/neural_clustering.h"
#include "nn/config.h"

namespace cf {
namespace models {

namespace {

nn::AttentionSpec read_attention(const nn::Config& c, const std::string& key) {
  nn::AttentionSpec spec;
  nn::Config a = c.optional_child(key);
  spec.type = a.get<std::string>("type", "full");
  spec.options = a;
  return spec;
}

std::shared_ptr<nn::UnaryModule> make_positions(const TransformerConfig& c, Generator& gen) {
  if (c.positional == "learned")
    return std::make_shared<nn::LearnedPositionalEncoding>(c.max_len, c.layer.d_model, gen);
  return std::make_shared<nn::SinusoidalPositionalEncoding>(c.max_len, c.layer.d_model);
}

// Neural clustering attention hands each layer's updated centroids to the next
// layer of its stack (ClusterFormer section 3.1); other variants ignore this.
template <class Layer>
void link_stack(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<nn::Attention*> stack;
  for (auto& l : layers) stack.push_back(&l->self_attn->attention());
  nn::link_centroid_chain(stack);
}

void check_ids(const char* who, const Tensor& ids, const Tensor& mask) {
  CF_CHECK(ids.defined() && ids.dtype() == kInt64 && ids.dim() == 2, ValueError, "[", who,
           "] ids must be int64 (B, N), got ", ids.defined() ? ids.describe() : std::string("undefined"));
  if (mask.defined())
    CF_CHECK(mask.dtype() == kBool && mask.shape() == ids.shape(), ShapeError, "[", who,
             "] key_padding_mask must be bool ", shape_str(ids.shape()), " like the ids, got ", mask.describe());
}

}  // namespace

TransformerConfig TransformerConfig::from_json(const nlohmann::json& j) {
  nn::Config c(j, "model");
  TransformerConfig t;
  t.vocab_size = c.get<int64_t>("vocab_size", t.vocab_size);
  t.tgt_vocab_size = c.get<int64_t>("tgt_vocab_size", t.tgt_vocab_size);
  t.max_len = c.get<int64_t>("max_len", t.max_len);
  t.n_layers = c.get<int64_t>("n_layers", t.n_layers);
  t.n_decoder_layers = c.get<int64_t>("n_decoder_layers", t.n_decoder_layers);
  t.pad_id = c.get<int64_t>("pad_id", t.pad_id);
  t.positional = c.get<std::string>("positional", t.positional);
  t.num_classes = c.get<int64_t>("num_classes", t.num_classes);
  t.pooling = c.get<std::string>("pooling", t.pooling);
  nn::TransformerLayerOptions& l = t.layer;
  l.d_model = c.get<int64_t>("d_model", l.d_model);
  l.n_heads = c.get<int64_t>("n_heads", l.n_heads);
  l.d_ff = c.get<int64_t>("d_ff", l.d_ff);
  l.dropout = c.get<double>("dropout", l.dropout);
  l.activation = c.get<std::string>("activation", l.activation);
  l.norm_first = c.get<bool>("norm_first", l.norm_first);
  l.attention = read_attention(c, "attention");
  l.cross_attention = read_attention(c, "cross_attention");
  t.validate("TransformerConfig");
  // Build each attention once, so its options are read (and checked) now; then
  // every key of the config has been read or is unknown.
  for (nn::AttentionSpec* spec : {&l.attention, &l.cross_attention}) {
    spec->d_model = l.d_model;
    spec->n_heads = l.n_heads;
    Generator scratch(0);  // checking a config draws nothing from the global generator
    spec->gen = &scratch;
    const bool shares = nn::make_attention(*spec)->shares_qk();
    spec->gen = nullptr;
    // Cross-attention reads its keys from the memory, never from the target's queries.
    CF_CHECK(!(shares && spec == &l.cross_attention), ValueError, "[TransformerConfig] cross_attention '",
             spec->type, "' would take its keys from the queries (shared_qk, or LSH), but cross-attention's keys "
             "come from the memory");
  }
  c.finish();
  return t;
}

nlohmann::json TransformerConfig::to_json() const {
  auto attention = [](const nn::AttentionSpec& spec) {
    nlohmann::json a = spec.options.raw();  // the variant's options as they were read
    a["type"] = spec.type;
    return a;
  };
  return {{"vocab_size", vocab_size},
          {"tgt_vocab_size", tgt_vocab_size},
          {"max_len", max_len},
          {"n_layers", n_layers},
          {"n_decoder_layers", n_decoder_layers},
          {"pad_id", pad_id},
          {"positional", positional},
          {"num_classes", num_classes},
          {"pooling", pooling},
          {"d_model", layer.d_model},
          {"n_heads", layer.n_heads},
          {"d_ff", layer.d_ff},
          {"dropout", layer.dropout},
          {"activation", layer.activation},
          {"norm_first", layer.norm_first},
          {"attention", attention(layer.attention)},
          {"cross_attention", attention(layer.cross_attention)}};
}

void TransformerConfig::validate(const char* who) const {
  CF_CHECK(vocab_size > 0, ValueError, "[", who, "] vocab_size must be positive, got ", vocab_size);
  CF_CHECK(tgt_vocab_size >= 0, ValueError, "[", who, "] tgt_vocab_size must be >= 0, got ", tgt_vocab_size);
  CF_CHECK(max_len > 0 && n_layers > 0, ValueError, "[", who,
           "] max_len and n_layers must be positive, got max_len=", max_len, " n_layers=", n_layers);
  CF_CHECK(n_decoder_layers >= 0, ValueError, "[", who, "] n_decoder_layers must be >= 0 (0: n_layers), got ",
           n_decoder_layers);
  CF_CHECK(pad_id >= -1 && pad_id < vocab_size, ValueError, "[", who, "] pad_id ", pad_id,
           " out of range for vocab_size ", vocab_size, " (-1: no padding token)");
  CF_CHECK(positional == "sinusoidal" || positional == "learned", ValueError, "[", who,
           "] positional must be \"sinusoidal\" or \"learned\", got \"", positional, "\"");
  CF_CHECK(pooling == "mean" || pooling == "first", ValueError, "[", who,
           "] pooling must be \"mean\" or \"first\", got \"", pooling, "\"");
  CF_CHECK(num_classes > 0, ValueError, "[", who, "] num_classes must be positive, got ", num_classes);
  CF_CHECK(layer.dropout >= 0 && layer.dropout < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ",
           layer.dropout);
  CF_CHECK(layer.d_model > 0 && layer.n_heads > 0 && layer.d_model % layer.n_heads == 0 && layer.d_ff > 0,
           ValueError, "[", who, "] needs d_model a positive multiple of n_heads and d_ff > 0; got d_model=",
           layer.d_model, " n_heads=", layer.n_heads, " d_ff=", layer.d_ff);
  nn::make_activation(layer.activation);  // throws naming the unknown activation
}

// ---- encoder trunk ----

TransformerEncoder::TransformerEncoder(const TransformerConfig& c, int64_t vocab_size, int64_t n_layers,
                                       Generator& gen)
    : vocab_(vocab_size), pad_id_(c.pad_id) {
  c.validate("TransformerEncoder");
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(vocab_size, c.layer.d_model, c.pad_id, gen));
  positions_ = register_module("positions", make_positions(c, gen));
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(c.layer.dropout));
  auto list = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < n_layers; ++i)
    layers.push_back(list->push_back(std::make_shared<nn::TransformerEncoderLayer>(c.layer, gen)));
  link_stack(layers);
  if (c.layer.norm_first) final_norm = register_module("final_norm", std::make_shared<nn::LayerNorm>(c.layer.d_model));
}

Tensor TransformerEncoder::embed(const Tensor& ids) { return drop_->forward(positions_->forward(embedding->forward(ids))); }

Tensor padding_mask(const Tensor& ids, int64_t pad_id) {
  if (pad_id < 0) return Tensor();
  // Defined even when no id is padding: dropping an all-false mask would need its sum on the host, a read
  // on every forward of a CUDA model (issue 25); every attention treats an all-false mask as no mask.
  return eq(ids, double(pad_id));
}

Tensor TransformerEncoder::effective_mask(const Tensor& ids, const Tensor& mask) const {
  return mask.defined() ? mask : padding_mask(ids, pad_id_);
}

Tensor TransformerEncoder::forward(const Tensor& ids, const Tensor& given_mask, bool causal, nn::AuxLosses* aux) {
  check_ids("TransformerEncoder", ids, given_mask);
  const Tensor mask = effective_mask(ids, given_mask);
  Tensor h = embed(ids);
  for (auto& l : layers) h = l->forward(h, mask, causal, aux);
  return final_norm ? final_norm->forward(h) : h;
}

Tensor pool_sequence(const Tensor& h, const Tensor& mask, const std::string& pooling) {
  // (a 2-d h was averaged over its features, and a misfit mask failed inside [mul] or [logical_not])
  ops::check_defined(h, "pool_sequence", "h");
  CF_CHECK(h.dim() == 3 && is_floating(h.dtype()), ShapeError, "[pool_sequence] h must be float (B, N, D), got ",
           h.describe());
  CF_CHECK(!mask.defined() || (mask.dtype() == kBool && mask.dim() == 2 && mask.shape()[0] == h.shape()[0] &&
                               mask.shape()[1] == h.shape()[1]),
           ShapeError, "[pool_sequence] mask must be bool (B, N) = (", h.shape()[0], ", ", h.shape()[1], "), got ",
           mask.describe());
  CF_CHECK(pooling == "first" || pooling == "mean", ValueError, "[pool_sequence] unknown pooling \"", pooling, "\"");
  if (pooling == "first") {
    CF_CHECK(h.shape()[1] >= 1, ShapeError, "[pool_sequence] \"first\" pooling needs a token, got ", h.describe());
    return squeeze(narrow(h, 1, 0, 1), 1);
  }
  // An empty sequence pools to zero, as a fully padded row does.
  if (h.shape()[1] == 0) return Tensor::zeros({h.shape()[0], h.shape()[2]}, h.dtype(), h.device());
  if (!mask.defined()) return mean(h, {1});
  // Mean over the tokens that are not padding (a fully padded row pools to zero).
  Tensor keep = unsqueeze(cf::to(logical_not(mask), h.dtype()), 2);  // (B, N, 1)
  Tensor count = clamp(sum(keep, {1}), 1.0, INFINITY);               // (B, 1)
  return sum(h * keep, {1}) / count;
}

// ---- classifiers ----

EncoderClassifier::EncoderClassifier(const TransformerConfig& c, Generator& gen) : pooling_(c.pooling) {
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(c, c.vocab_size, c.n_layers, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.layer.d_model, c.num_classes, true, gen));
}

Tensor EncoderClassifier::forward(const Tensor& ids, const Tensor& given_mask, nn::AuxLosses* aux) {
  const Tensor mask = ids.defined() ? encoder->effective_mask(ids, given_mask) : given_mask;
  return head->forward(pool_sequence(encoder->forward(ids, mask, false, aux), mask, pooling_));
}

TokenClassifier::TokenClassifier(const TransformerConfig& c, Generator& gen) {
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(c, c.vocab_size, c.n_layers, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.layer.d_model, c.num_classes, true, gen));
}

Tensor TokenClassifier::forward(const Tensor& ids, const Tensor& mask, nn::AuxLosses* aux) {
  return head->forward(encoder->forward(ids, mask, false, aux));
}

PairClassifier::PairClassifier(const TransformerConfig& c, Generator& gen) : pooling_(c.pooling) {
  const int64_t d = c.layer.d_model;
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(c, c.vocab_size, c.n_layers, gen));
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(4 * d, d, true, gen));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(d, c.num_classes, true, gen));
}

Tensor PairClassifier::forward(const Tensor& ids_a, const Tensor& mask_a, const Tensor& ids_b, const Tensor& mask_b,
                               nn::AuxLosses* aux) {
  CF_CHECK(ids_a.defined() && ids_b.defined() && ids_a.dim() == 2 && ids_b.dim() == 2 &&
               ids_a.shape()[0] == ids_b.shape()[0],
           ShapeError, "[PairClassifier] the two texts need (B, N) ids with one batch size, got ",
           ids_a.defined() ? shape_str(ids_a.shape()) : "undefined", " and ",
           ids_b.defined() ? shape_str(ids_b.shape()) : "undefined");
  const Tensor ma = encoder->effective_mask(ids_a, mask_a), mb = encoder->effective_mask(ids_b, mask_b);
  Tensor u = pool_sequence(encoder->forward(ids_a, ma, false, aux), ma, pooling_);
  Tensor v = pool_sequence(encoder->forward(ids_b, mb, false, aux), mb, pooling_);
  Tensor f = cat({u, v, u * v, u - v}, 1);
  return fc2->forward(relu(fc1->forward(f)));
}

// ---- language model ----

CausalLM::CausalLM(const TransformerConfig& c, Generator& gen) {
  decoder = register_module("decoder", std::make_shared<TransformerEncoder>(c, c.vocab_size, c.n_layers, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.layer.d_model, c.vocab_size, true, gen));
  for (auto& layer : decoder->layers) layer->self_attn->require_causal("CausalLM");
}

Tensor CausalLM::forward(const Tensor& ids, const Tensor& mask, nn::AuxLosses* aux) {
  return head->forward(decoder->forward(ids, mask, true, aux));
}

// ---- encoder-decoder ----

EncoderDecoder::EncoderDecoder(const TransformerConfig& c, Generator& gen)
    : tgt_vocab_(c.tgt_vocab_size > 0 ? c.tgt_vocab_size : c.vocab_size), pad_id_(c.pad_id) {
  c.validate("EncoderDecoder");
  const int64_t d = c.layer.d_model;
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(c, c.vocab_size, c.n_layers, gen));
  CF_CHECK(c.pad_id < tgt_vocab_, ValueError, "[EncoderDecoder] pad_id ", c.pad_id, " out of range for tgt_vocab_size ",
           tgt_vocab_);
  tgt_embedding = register_module("tgt_embedding", std::make_shared<nn::Embedding>(tgt_vocab_, d, c.pad_id, gen));
  positions_ = register_module("tgt_positions", make_positions(c, gen));
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(c.layer.dropout));
  int64_t n_dec = c.n_decoder_layers > 0 ? c.n_decoder_layers : c.n_layers;
  auto list = register_module("decoder_layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < n_dec; ++i)
    decoder_layers.push_back(list->push_back(std::make_shared<nn::TransformerDecoderLayer>(c.layer, gen)));
  link_stack(decoder_layers);
  if (c.layer.norm_first) final_norm = register_module("final_norm", std::make_shared<nn::LayerNorm>(d));
  head = register_module("head", std::make_shared<nn::Linear>(d, tgt_vocab_, true, gen));
}

Tensor EncoderDecoder::encode(const Tensor& src, const Tensor& src_mask, nn::AuxLosses* aux) {
  return encoder->forward(src, src_mask, false, aux);
}

Tensor EncoderDecoder::decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt,
                              const Tensor& given_tgt_mask, nn::AuxLosses* aux) {
  check_ids("EncoderDecoder", tgt, given_tgt_mask);
  const Tensor tgt_mask = given_tgt_mask.defined() ? given_tgt_mask : padding_mask(tgt, pad_id_);
  Tensor h = drop_->forward(positions_->forward(tgt_embedding->forward(tgt)));
  for (auto& l : decoder_layers) h = l->forward(h, memory, tgt_mask, src_mask, aux);
  if (final_norm) h = final_norm->forward(h);
  return head->forward(h);
}

Tensor EncoderDecoder::forward(const Tensor& src, const Tensor& given_src_mask, const Tensor& tgt,
                               const Tensor& tgt_mask, nn::AuxLosses* aux) {
  CF_CHECK(src.defined(), ValueError, "[EncoderDecoder] src is undefined");
  const Tensor src_mask = encoder->effective_mask(src, given_src_mask);
  return decode(encode(src, src_mask, aux), src_mask, tgt, tgt_mask, aux);
}

}  // namespace models
}  // namespace cf
