#include "models/cluster_former.h"

#include <algorithm>
#include <cmath>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "models/transformer.h"
#include "nn/config.h"

namespace cf {
namespace models {

namespace {

std::string desc(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_ids(const char* who, const char* name, const Tensor& ids, const Tensor& mask) {
  CF_CHECK(ids.defined() && ids.dtype() == kInt64 && ids.dim() == 2 && ids.shape()[1] > 0, ValueError, "[", who,
           "] ", name, " ids must be int64 (B, N) with N > 0, got ", desc(ids));
  if (mask.defined())
    CF_CHECK(mask.dtype() == kBool && mask.shape() == ids.shape(), ShapeError, "[", who, "] ", name,
             " mask must be bool ", shape_str(ids.shape()), " like the ids, got ", mask.describe());
}

// The cluster layers' attention spec; chunk_size defaults to the stride m (eq. 8).
// The cluster layers' attention: "cluster-former" unless cluster_attention names
// another "type" (the paper's Table 5 baselines put LSH or sparse attention in
// those layers instead).
nn::AttentionSpec cluster_spec(const ClusterFormerConfig& c) {
  nlohmann::json j = c.cluster_attention;
  nn::Config options(j, "cluster_attention");
  const std::string type = options.get<std::string>("type", "cluster-former");  // read: not an option of the variant
  // (a null chunk_size is absent, as every null in a config: nn/config.h)
  if (type == "cluster-former" && (!j.contains("chunk_size") || j["chunk_size"].is_null())) {
    j["chunk_size"] = c.stride;
    options = nn::Config(j, "cluster_attention");
    options.get<std::string>("type", "cluster-former");
  }
  return nn::AttentionSpec{type, c.layer.d_model, c.layer.n_heads, options};
}

}  // namespace

ClusterFormerConfig ClusterFormerConfig::from_json(const nlohmann::json& j) {
  nn::Config c(j, "model");
  ClusterFormerConfig t;
  t.vocab_size = c.get<int64_t>("vocab_size", t.vocab_size);
  t.max_len = c.get<int64_t>("max_len", t.max_len);
  t.pad_id = c.get<int64_t>("pad_id", t.pad_id);
  t.positional = c.get<std::string>("positional", t.positional);
  t.n_layers = c.get<int64_t>("n_layers", t.n_layers);
  t.window = c.get<int64_t>("window", t.window);
  t.stride = c.get<int64_t>("stride", t.stride);
  t.cluster_layers = c.get<std::vector<int64_t>>("cluster_layers", t.cluster_layers);
  t.cluster_every = c.get<int64_t>("cluster_every", t.cluster_every);
  t.cluster_from = c.get<int64_t>("cluster_from", t.cluster_from);
  nn::TransformerLayerOptions& l = t.layer;
  l.d_model = c.get<int64_t>("d_model", l.d_model);
  l.n_heads = c.get<int64_t>("n_heads", l.n_heads);
  l.d_ff = c.get<int64_t>("d_ff", l.d_ff);
  l.dropout = c.get<double>("dropout", l.dropout);
  l.activation = c.get<std::string>("activation", l.activation);
  l.norm_first = c.get<bool>("norm_first", l.norm_first);
  nn::Config a = c.optional_child("attention");
  l.attention.type = a.get<std::string>("type", "full");
  l.attention.options = a;
  nn::Config ca = c.optional_child("cluster_attention");
  t.cluster_attention = ca.raw();
  const std::string cluster_type = ca.get<std::string>("type", "cluster-former");
  t.validate("ClusterFormerConfig");
  // Build each attention once so its options are read (and checked) now.
  l.attention.d_model = l.d_model;
  l.attention.n_heads = l.n_heads;
  Generator scratch(0);  // checking a config draws nothing from the global generator (as TransformerConfig)
  l.attention.gen = &scratch;
  nn::make_attention(l.attention);
  l.attention.gen = nullptr;
  if (cluster_type == "cluster-former") {
    nn::ClusterFormerAttention::read_options(ca);  // checks the keys without building a bank
  } else {
    nn::AttentionSpec cs{cluster_type, l.d_model, l.n_heads, ca};
    cs.gen = &scratch;
    nn::make_attention(cs);
  }
  c.finish();
  return t;
}

void ClusterFormerConfig::validate(const char* who) const {
  CF_CHECK(vocab_size > 0, ValueError, "[", who, "] vocab_size must be positive, got ", vocab_size);
  CF_CHECK(max_len > 0 && n_layers > 0, ValueError, "[", who, "] max_len and n_layers must be positive, got max_len=",
           max_len, " n_layers=", n_layers);
  CF_CHECK(pad_id >= -1 && pad_id < vocab_size, ValueError, "[", who, "] pad_id ", pad_id,
           " out of range for vocab_size ", vocab_size, " (-1: no padding token)");
  CF_CHECK(positional == "sinusoidal" || positional == "learned" || positional == "none", ValueError, "[", who,
           "] positional must be \"sinusoidal\", \"learned\" or \"none\", got \"", positional, "\"");
  CF_CHECK(stride > 0 && window > stride, ValueError, "[", who, "] needs window l > stride m > 0, got window=",
           window, " stride=", stride);
  CF_CHECK(cluster_every >= 0 && cluster_from >= 0, ValueError, "[", who,
           "] cluster_every and cluster_from must be >= 0, got ", cluster_every, " and ", cluster_from);
  CF_CHECK(cluster_layers.empty() || cluster_every == 0, ValueError, "[", who,
           "] give either cluster_layers or cluster_every/cluster_from, not both");
  // A rule that picks no layer built a model without a memory bank, silently.
  CF_CHECK(cluster_from == 0 || cluster_every > 0, ValueError, "[", who, "] cluster_from ", cluster_from,
           " takes effect with cluster_every (the rule \"layer % cluster_every == 0 and layer >= cluster_from\"), "
           "which is 0");
  if (cluster_every > 0) {
    bool any = false;
    for (int64_t i = 0; i < n_layers && !any; ++i) any = is_cluster_layer(i);
    CF_CHECK(any, ValueError, "[", who, "] cluster_every ", cluster_every, " and cluster_from ", cluster_from,
             " select no layer of n_layers ", n_layers, " (0-based layers l with l % ", cluster_every,
             " == 0 and l >= ", cluster_from, ")");
  }
  for (size_t a = 0; a < cluster_layers.size(); ++a) {
    const int64_t i = cluster_layers[a];
    CF_CHECK(i >= 0 && i < n_layers, ValueError, "[", who, "] cluster layer ", i, " out of range [0, ", n_layers,
             ")");
    for (size_t b = 0; b < a; ++b)  // a repeat made the same layer twice a cluster layer in the list, once in the model
      CF_CHECK(cluster_layers[b] != i, ValueError, "[", who, "] cluster layer ", i, " is listed twice in cluster_layers");
  }
  CF_CHECK(layer.dropout >= 0 && layer.dropout < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ",
           layer.dropout);
  CF_CHECK(layer.d_model > 0 && layer.n_heads > 0 && layer.d_model % layer.n_heads == 0 && layer.d_ff > 0,
           ValueError, "[", who, "] needs d_model a positive multiple of n_heads and d_ff > 0; got d_model=",
           layer.d_model, " n_heads=", layer.n_heads, " d_ff=", layer.d_ff);
  CF_CHECK(layer.attention.type != "cluster-former", ValueError, "[", who,
           "] attention is the sliding-window layers' attention; cluster layers are chosen by cluster_layers or "
           "cluster_every/cluster_from");
  nn::make_activation(layer.activation);
}

bool ClusterFormerConfig::is_cluster_layer(int64_t i) const {
  if (!cluster_layers.empty()) return std::find(cluster_layers.begin(), cluster_layers.end(), i) != cluster_layers.end();
  return cluster_every > 0 && i % cluster_every == 0 && i >= cluster_from;  // Table 4's rule
}

// ---------------- encoder ----------------

ClusterFormerEncoder::ClusterFormerEncoder(const ClusterFormerConfig& c, Generator& gen) : config_(c) {
  c.validate("ClusterFormerEncoder");
  const int64_t d = c.layer.d_model;
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab_size, d, c.pad_id, gen));
  if (c.positional == "learned")
    positions_ = register_module("positions", std::make_shared<nn::LearnedPositionalEncoding>(c.max_len, d, gen));
  else if (c.positional == "sinusoidal")
    positions_ = register_module("positions", std::make_shared<nn::SinusoidalPositionalEncoding>(c.max_len, d));
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(c.layer.dropout));
  auto list = register_module("layers", std::make_shared<nn::ModuleList>());
  nn::TransformerLayerOptions cl = c.layer;
  cl.attention = cluster_spec(c);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    if (c.is_cluster_layer(i)) {
      sliding.push_back(nullptr);
      clusters.push_back(list->push_back(std::make_shared<nn::ClusterFormerLayer>(cl, c.stride, gen)));
    } else {
      sliding.push_back(list->push_back(std::make_shared<nn::SlidingWindowLayer>(c.layer, c.window, c.stride, gen)));
      clusters.push_back(nullptr);
    }
  }
  if (c.layer.norm_first) final_norm = register_module("final_norm", std::make_shared<nn::LayerNorm>(d));
}

std::vector<std::shared_ptr<nn::MemoryBank>> ClusterFormerEncoder::memory_banks() const {
  std::vector<std::shared_ptr<nn::MemoryBank>> out;
  for (auto& l : clusters)
    if (l && l->has_memory_bank()) out.push_back(l->attention().bank);
  return out;
}

int64_t ClusterFormerEncoder::on_train_step() { return nn::step_memory_banks(*this); }

nn::WindowedStates ClusterFormerEncoder::forward(const Tensor& context, const Tensor& given_cmask,
                                                 const Tensor& question, const Tensor& given_qmask, bool causal,
                                                 nn::AuxLosses* aux) {
  check_ids("ClusterFormerEncoder", "context", context, given_cmask);
  const int64_t x = context.shape()[1];
  int64_t q = 0;
  if (question.defined()) {
    check_ids("ClusterFormerEncoder", "question", question, given_qmask);
    CF_CHECK(question.shape()[0] == context.shape()[0], ShapeError,
             "[ClusterFormerEncoder] question ", shape_str(question.shape()), " and context ",
             shape_str(context.shape()), " need one batch size");
    q = question.shape()[1];
  } else {
    CF_CHECK(!given_qmask.defined(), ValueError, "[ClusterFormerEncoder] question mask given without a question");
  }
  CF_CHECK(q + x <= config_.max_len, ValueError, "[ClusterFormerEncoder] question (", q, ") + context (", x,
           ") tokens exceed max_len ", config_.max_len);
  Tensor cmask = given_cmask.defined() ? given_cmask : padding_mask(context, config_.pad_id);
  Tensor qmask = q > 0 ? (given_qmask.defined() ? given_qmask : padding_mask(question, config_.pad_id)) : Tensor();
  // One embedding pass over [question; context], so positions run over both.
  Tensor ids = q > 0 ? cat({question, context}, 1) : context;
  Tensor h = embedding->forward(ids);
  if (positions_ && q > 0 && qmask.defined()) {
    // Positions count real tokens only: a question padded to the batch's longest (at its end or
    // its start) must not shift its context. Row b: a real question token at its rank among the
    // question's real tokens, the context at n_b..n_b+x-1 (n_b = the real question tokens); a
    // padding token gets the rank of the next real one (it is masked). The ranks are a prefix
    // count, a product with an upper-triangular matrix of ones (exact in float64; autocast leaves
    // float64 alone). Tensor ops: no host read of the mask.
    const Device dev = context.device();
    Tensor real = cf::to(logical_not(qmask), kFloat64);                                    // (B, q)
    Tensor ar = Tensor::arange(q, kInt64, dev);
    Tensor upper = cf::to(le(reshape(ar, {q, 1}), reshape(ar, {1, q})), kFloat64);          // [i <= j]
    Tensor before = cf::to(matmul(real, upper) - real, kInt64);      // real tokens before each one
    Tensor n_real = sum(cf::to(real, kInt64), {1}, /*keepdim=*/true);                      // (B, 1)
    Tensor pos = cat({before, reshape(Tensor::arange(x, kInt64, dev), {1, x}) + n_real}, 1);
    h = positions_->forward_at(h, pos);
  } else if (positions_) {
    h = positions_->forward(h);
  }
  h = drop_->forward(h);
  nn::WindowedStates s;
  s.context = q > 0 ? narrow(h, 1, q, x) : h;
  if (q > 0) s.question = narrow(h, 1, 0, q);
  for (size_t i = 0; i < sliding.size(); ++i)
    s = sliding[i] ? sliding[i]->forward(s.context, cmask, s.question, qmask, causal, aux)
                   : clusters[i]->forward(s.context, cmask, s.question, qmask, causal, aux);
  if (final_norm) {
    s.context = final_norm->forward(s.context);
    if (s.question.defined()) s.question = final_norm->forward(s.question);
  }
  if (s.question.defined() && s.question.dim() == 3)  // no layer ran per window: give each window its copy
    s.question = expand(unsqueeze(s.question, 1), {context.shape()[0], nn::num_windows(x, config_.stride), q,
                                                   config_.layer.d_model});
  return s;
}

// ---------------- QA ----------------

ClusterFormerQA::ClusterFormerQA(const ClusterFormerConfig& c, Generator& gen) {
  encoder = register_module("encoder", std::make_shared<ClusterFormerEncoder>(c, gen));
  span_head = register_module("span_head", std::make_shared<nn::Linear>(c.layer.d_model, 2, true, gen));
  answerable_head = register_module("answerable_head", std::make_shared<nn::Linear>(c.layer.d_model, 1, true, gen));
}

QAOutput ClusterFormerQA::forward(const Tensor& question, const Tensor& qmask, const Tensor& context,
                                  const Tensor& given_cmask, nn::AuxLosses* aux) {
  CF_CHECK(question.defined(), ValueError, "[ClusterFormerQA] a question is required");
  check_ids("ClusterFormerQA", "context", context, given_cmask);
  const ClusterFormerConfig& c = encoder->config();
  const Tensor cmask = given_cmask.defined() ? given_cmask : padding_mask(context, c.pad_id);
  nn::WindowedStates s = encoder->forward(context, cmask, question, qmask, false, aux);
  const int64_t b = context.shape()[0], k = s.question.shape()[1];
  QAOutput out;
  Tensor logits = span_head->forward(s.context);  // (B, x, 2)
  Tensor start = squeeze(narrow(logits, 2, 0, 1), 2), end = squeeze(narrow(logits, 2, 1, 1), 2);
  if (cmask.defined()) {
    start = masked_fill(start, cmask, -1e9);
    end = masked_fill(end, cmask, -1e9);
  }
  out.start_logits = start;
  out.end_logits = end;
  // (1/K) sum_k H_k[0] (section 4.2) over the windows whose eq. 4 slice holds some
  // context (the layers treat the others as padding).
  // On the device: no host read of the mask (issue 25).
  Tensor wt = cmask.defined() ? cf::to(logical_not(nn::empty_windows(cmask, c.stride)), s.context.dtype())
                              : Tensor::ones({b, k}, s.context.dtype(), s.context.device());
  wt = reshape(wt, {b, k, 1});
  Tensor first = squeeze(narrow(s.question, 2, 0, 1), 2);  // (B, K, D)
  Tensor pooled = sum(first * wt, {1}) / clamp(sum(wt, {1}), 1.0, INFINITY);
  out.answerable_logits = squeeze(answerable_head->forward(pooled), 1);
  return out;
}

// ---------------- LM ----------------

ClusterFormerLM::ClusterFormerLM(const ClusterFormerConfig& c, Generator& gen) {
  encoder = register_module("encoder", std::make_shared<ClusterFormerEncoder>(c, gen));
  head = register_module("head", std::make_shared<nn::Linear>(c.layer.d_model, c.vocab_size, true, gen));
}

Tensor ClusterFormerLM::forward(const Tensor& ids, const Tensor& mask, nn::AuxLosses* aux) {
  return head->forward(encoder->forward(ids, mask, {}, {}, true, aux).context);
}

}  // namespace models
}  // namespace cf
