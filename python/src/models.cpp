// cf.models: the Transformer baselines (any attention variant by config) and the
// models of the four papers: ClusterFormer (neural clustering attention),
// Cluster-Former (sliding windows + cluster layers with a memory bank), Centroid
// Transformers (summariser, point-cloud classifier, ViT) and the attention switch
// of Fast Transformers with Clustered Attention. Configs are dicts (or keyword
// arguments) read by the library's checked readers: unknown keys and wrong types
// are cf.ValueError naming the key.
#include <nanobind/stl/tuple.h>

#include "common.h"

namespace cfpy {

using cf::Tensor;
namespace cnn = cf::nn;
namespace cm = cf::models;

namespace {

// A config given as a dict, as keyword arguments, or both (keywords win).
nlohmann::json config_json(nb::handle config, const nb::kwargs& kw, const char* who) {
  nlohmann::json j = config.is_none() ? nlohmann::json::object() : to_json(config, who);
  CF_CHECK(j.is_object(), ValueError, "[", who, "] config must be a dict");
  nlohmann::json extra = to_json(kw, who);
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

}  // namespace

void bind_models(nb::module_& m, nb::module_& models) {
  (void)m;
  nb::class_<cm::TransformerConfig>(models, "TransformerConfig",
                                    "Sizes, attention and heads of the Transformer models (from_json reads a dict).")
      .def_static("from_json", [](nb::handle j) { return cm::TransformerConfig::from_json(to_json(j, "model")); },
                  nb::arg("config"),
                  "Reads {vocab_size, tgt_vocab_size, max_len, n_layers, n_decoder_layers, pad_id, positional, "
                  "num_classes, pooling, d_model, n_heads, d_ff, dropout, activation, norm_first, attention: {type, "
                  "...}, cross_attention: {...}}; unknown keys and wrong types are errors.")
      .def("to_json", [](const cm::TransformerConfig& c) { return from_json(c.to_json()); },
           "Every key from_json reads, as a dict: TransformerConfig.from_json(c.to_json()) is c again.")
      // pickle and copy through the dict (from_json checks it again)
      .def("__getstate__", [](const cm::TransformerConfig& c) { return from_json(c.to_json()); })
      .def("__setstate__",
           [](cm::TransformerConfig* c, nb::handle state) {
             new (c) cm::TransformerConfig(cm::TransformerConfig::from_json(to_json(state, "model")));
           },
           nb::arg("state"))
      .def("__eq__",
           [](const cm::TransformerConfig& a, nb::handle b) {
             return nb::isinstance<cm::TransformerConfig>(b) &&
                    a.to_json() == nb::cast<const cm::TransformerConfig&>(b).to_json();
           },
           nb::arg("other"), nb::sig("def __eq__(self, other: object) -> bool"))
      .def("__repr__",
           [](const cm::TransformerConfig& c) { return "TransformerConfig(" + c.to_json().dump() + ")"; })
      .def("__hash__", [](const cm::TransformerConfig& c) { return nb::hash(nb::str(c.to_json().dump().c_str())); },
           "Of its to_json(), as == compares (it has no setter: a config does not change).")
      .def_ro("vocab_size", &cm::TransformerConfig::vocab_size)
      .def_ro("max_len", &cm::TransformerConfig::max_len)
      .def_ro("n_layers", &cm::TransformerConfig::n_layers)
      .def_ro("num_classes", &cm::TransformerConfig::num_classes)
      .def_ro("pooling", &cm::TransformerConfig::pooling)
      .def_prop_ro("d_model", [](const cm::TransformerConfig& c) { return c.layer.d_model; })
      .def_prop_ro("n_heads", [](const cm::TransformerConfig& c) { return c.layer.n_heads; })
      .def_prop_ro("attention", [](const cm::TransformerConfig& c) {
        nb::dict d = nb::cast<nb::dict>(from_json(c.layer.attention.options.raw()));
        d["type"] = c.layer.attention.type;
        return d;
      });
  auto tcfg = [](nb::handle config, const nb::kwargs& kw, const char* who) {
    return cm::TransformerConfig::from_json(config_json(config, kw, who));
  };
  const char* tdoc = "Built from a config dict and/or keyword arguments (see TransformerConfig.from_json).";

  nb::class_<cm::TransformerEncoder, cnn::Module> encoder(models, "TransformerEncoder",
                                                          "Embedding + positions + encoder layers (+ final LayerNorm).");
  encoder.def_ro("embedding", &cm::TransformerEncoder::embedding).def_ro("layers", &cm::TransformerEncoder::layers);
  def_forward(encoder,
              [](cm::TransformerEncoder& e, const Tensor& ids, std::optional<Tensor> mask, bool causal,
                 cnn::AuxLosses* aux) { return e.forward(ids, opt(mask), causal, aux); },
              "ids int64 (B, N) -> (B, N, D); mask bool (B, N), True = padding (default: ids == pad_id).",
              nb::arg("ids"), nb::arg("key_padding_mask") = nb::none(), nb::arg("causal") = false,
              nb::arg("aux").none() = nb::none());

  nb::class_<cm::EncoderClassifier, cnn::Module> cls(models, "EncoderClassifier",
                                                     "Sequence classifier: encoder, pooling, linear head.");
  cls.def("__init__",
          [tcfg](cm::EncoderClassifier* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
            new (self) cm::EncoderClassifier(tcfg(config, kw, "EncoderClassifier"), gen_or_default(gen));
          },
          nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), tdoc)
      .def_ro("encoder", &cm::EncoderClassifier::encoder)
      .def_ro("head", &cm::EncoderClassifier::head);
  def_forward(cls,
              [](cm::EncoderClassifier& c, const Tensor& ids, std::optional<Tensor> mask, cnn::AuxLosses* aux) {
                return c.forward(ids, opt(mask), aux);
              },
              "ids int64 (B, N) -> logits (B, num_classes).", nb::arg("ids"), nb::arg("key_padding_mask") = nb::none(),
              nb::arg("aux").none() = nb::none());

  nb::class_<cm::TokenClassifier, cnn::Module> tok(models, "TokenClassifier",
                                                   "Per-token classifier: bidirectional encoder, linear head.");
  tok.def("__init__",
          [tcfg](cm::TokenClassifier* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
            new (self) cm::TokenClassifier(tcfg(config, kw, "TokenClassifier"), gen_or_default(gen));
          },
          nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), tdoc)
      .def_ro("encoder", &cm::TokenClassifier::encoder)
      .def_ro("head", &cm::TokenClassifier::head);
  def_forward(tok,
              [](cm::TokenClassifier& c, const Tensor& ids, std::optional<Tensor> mask, cnn::AuxLosses* aux) {
                return c.forward(ids, opt(mask), aux);
              },
              "ids int64 (B, N) -> logits (B, N, num_classes).", nb::arg("ids"),
              nb::arg("key_padding_mask") = nb::none(), nb::arg("aux").none() = nb::none());

  nb::class_<cm::PairClassifier, cnn::Module> pair(models, "PairClassifier",
                                                   "Two-tower pair classifier over [u, v, u*v, u-v].");
  pair.def("__init__",
           [tcfg](cm::PairClassifier* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
             new (self) cm::PairClassifier(tcfg(config, kw, "PairClassifier"), gen_or_default(gen));
           },
           nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), tdoc);
  def_forward(pair,
              [](cm::PairClassifier& c, const Tensor& a, std::optional<Tensor> ma, const Tensor& b,
                 std::optional<Tensor> mb, cnn::AuxLosses* aux) { return c.forward(a, opt(ma), b, opt(mb), aux); },
              "(ids_a, mask_a, ids_b, mask_b) -> logits (B, num_classes).", nb::arg("ids_a"), nb::arg("mask_a").none(),
              nb::arg("ids_b"), nb::arg("mask_b").none(), nb::arg("aux").none() = nb::none());

  nb::class_<cm::CausalLM, cnn::Module> lm(models, "CausalLM", "Decoder-only language model -> logits (B, N, V).");
  lm.def("__init__",
         [tcfg](cm::CausalLM* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
           new (self) cm::CausalLM(tcfg(config, kw, "CausalLM"), gen_or_default(gen));
         },
         nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), tdoc);
  def_forward(lm,
              [](cm::CausalLM& c, const Tensor& ids, std::optional<Tensor> mask, cnn::AuxLosses* aux) {
                return c.forward(ids, opt(mask), aux);
              },
              "ids (B, N) -> next-token logits (B, N, V).", nb::arg("ids"), nb::arg("key_padding_mask") = nb::none(),
              nb::arg("aux").none() = nb::none());

  nb::class_<cm::EncoderDecoder, cnn::Module> ed(models, "EncoderDecoder", "Encoder-decoder -> logits (B, Nt, V_tgt).");
  ed.def("__init__",
         [tcfg](cm::EncoderDecoder* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
           new (self) cm::EncoderDecoder(tcfg(config, kw, "EncoderDecoder"), gen_or_default(gen));
         },
         nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), tdoc);
  def_forward(ed,
              [](cm::EncoderDecoder& c, const Tensor& src, std::optional<Tensor> src_mask, const Tensor& tgt,
                 std::optional<Tensor> tgt_mask, cnn::AuxLosses* aux) {
                return c.forward(src, opt(src_mask), tgt, opt(tgt_mask), aux);
              },
              "(src, src_mask, tgt, tgt_mask) -> logits.", nb::arg("src"), nb::arg("src_mask").none(), nb::arg("tgt"),
              nb::arg("tgt_mask") = nb::none(), nb::arg("aux").none() = nb::none());

  // ---- ClusterFormer (neural clustering attention) ----
  nb::class_<cm::ClusterFormerLossWeights>(models, "ClusterFormerLossWeights",
                                           "Appendix C, eq. 17: L = mu L1 + nu L2 + lambda L_task.")
      .def("__init__", [](cm::ClusterFormerLossWeights* w, double mu, double nu, double lambda) {
        new (w) cm::ClusterFormerLossWeights{mu, nu, lambda};
      }, nb::arg("mu") = 1e-3, nb::arg("nu") = 1e-3, nb::arg("lambda_") = 1.0)
      .def_rw("mu", &cm::ClusterFormerLossWeights::mu)
      .def_rw("nu", &cm::ClusterFormerLossWeights::nu)
      .def_rw("lambda_", &cm::ClusterFormerLossWeights::lambda);
  models.def("clusterformer_loss", &cm::clusterformer_loss, nb::arg("task_loss"), nb::arg("aux"), nb::arg("weights"),
             release_gil(), "lambda * task_loss + mu * sum(L1) + nu * sum(L2) over what the layers added to aux.");
  auto cfg_dict = [](const cm::TransformerConfig& c) {
    // The paper's settings as a dict, ready for EncoderClassifier(config) (and editable).
    nb::dict d;
    d["vocab_size"] = c.vocab_size;
    d["max_len"] = c.max_len;
    d["n_layers"] = c.n_layers;
    d["pad_id"] = c.pad_id;
    d["positional"] = c.positional;
    d["num_classes"] = c.num_classes;
    d["pooling"] = c.pooling;
    d["d_model"] = c.layer.d_model;
    d["n_heads"] = c.layer.n_heads;
    d["d_ff"] = c.layer.d_ff;
    d["dropout"] = c.layer.dropout;
    d["activation"] = c.layer.activation;
    d["norm_first"] = c.layer.norm_first;
    nb::dict a = nb::cast<nb::dict>(from_json(c.layer.attention.options.raw()));
    a["type"] = c.layer.attention.type;
    d["attention"] = a;
    return d;
  };
  models.def("clusterformer_classifier_config",
             [cfg_dict](int64_t v, int64_t n, int64_t k) { return cfg_dict(cm::clusterformer_classifier_config(v, n, k)); },
             nb::arg("vocab_size"), nb::arg("max_len"), nb::arg("num_classes"),
             "ClusterFormer section 4.2 text classification: L = 2, d = 300, 4 heads, k = round(sqrt(max_len)).");
  models.def("clusterformer_pair_config",
             [cfg_dict](int64_t v, int64_t n, int64_t k) { return cfg_dict(cm::clusterformer_pair_config(v, n, k)); },
             nb::arg("vocab_size"), nb::arg("max_len"), nb::arg("num_classes"),
             "Section 4.3 NLI / text matching: L = 1, d = 300, 6 heads, k = 3.");
  models.def("clusterformer_lm_config",
             [cfg_dict](int64_t v, int64_t n) { return cfg_dict(cm::clusterformer_lm_config(v, n)); },
             nb::arg("vocab_size"), nb::arg("max_len"), "Section 4.1 decoder settings: L = 6, d = 512, 4 heads, k = 3.");

  // ---- Cluster-Former ----
  auto ccfg = [](nb::handle config, const nb::kwargs& kw, const char* who) {
    return cm::ClusterFormerConfig::from_json(config_json(config, kw, who));
  };
  const char* cdoc = "Built from a config dict and/or keyword arguments: vocab_size, max_len, window, stride, "
                     "cluster_layers or cluster_every/cluster_from, d_model, n_heads, ..., cluster_attention {...}.";
  nb::class_<cnn::WindowedStates>(models, "WindowedStates")
      .def_ro("context", &cnn::WindowedStates::context)
      // None without a question (an undefined tensor, on which even repr() raised)
      .def_prop_ro("question", [](const cnn::WindowedStates& s) {
        return s.question.defined() ? std::optional<Tensor>(s.question) : std::nullopt;
      });
  nb::class_<cm::ClusterFormerEncoder, cnn::Module> cfe(models, "ClusterFormerEncoder",
                                                        "Sliding-window and Cluster-Former layers over a long context.");
  cfe.def("__init__",
          [ccfg](cm::ClusterFormerEncoder* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
            new (self) cm::ClusterFormerEncoder(ccfg(config, kw, "ClusterFormerEncoder"), gen_or_default(gen));
          },
          nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), cdoc)
      .def("memory_banks", &cm::ClusterFormerEncoder::memory_banks)
      .def("on_train_step", &cm::ClusterFormerEncoder::on_train_step, release_gil(),
           "One optimizer step is done: advance every memory bank (recluster when due).");
  def_forward(cfe,
              [](cm::ClusterFormerEncoder& e, const Tensor& context, std::optional<Tensor> cmask,
                 std::optional<Tensor> q, std::optional<Tensor> qmask, bool causal, cnn::AuxLosses* aux) {
                return e.forward(context, opt(cmask), opt(q), opt(qmask), causal, aux);
              },
              "context ids (B, x) [, question ids (B, q)] -> WindowedStates.", nb::arg("context"),
              nb::arg("context_mask") = nb::none(), nb::arg("question") = nb::none(),
              nb::arg("question_mask") = nb::none(), nb::arg("causal") = false, nb::arg("aux").none() = nb::none());
  nb::class_<cm::ClusterFormerLM, cnn::Module> cflm(models, "ClusterFormerLM",
                                                    "Cluster-Former causal LM: logits (B, x, vocab).");
  cflm.def("__init__",
           [ccfg](cm::ClusterFormerLM* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
             new (self) cm::ClusterFormerLM(ccfg(config, kw, "ClusterFormerLM"), gen_or_default(gen));
           },
           nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), cdoc)
      .def_ro("encoder", &cm::ClusterFormerLM::encoder)
      .def("on_train_step", &cm::ClusterFormerLM::on_train_step, release_gil());
  def_forward(cflm,
              [](cm::ClusterFormerLM& l, const Tensor& ids, std::optional<Tensor> mask, cnn::AuxLosses* aux) {
                return l.forward(ids, opt(mask), aux);
              },
              "ids (B, x) -> logits (B, x, vocab).", nb::arg("ids"), nb::arg("mask") = nb::none(),
              nb::arg("aux").none() = nb::none());
  nb::class_<cm::ClusterFormerQA, cnn::Module> cfqa(models, "ClusterFormerQA",
                                                    "Cluster-Former extractive QA: start/end and answerable logits.");
  cfqa.def("__init__",
           [ccfg](cm::ClusterFormerQA* self, nb::handle config, cf::Generator* gen, nb::kwargs kw) {
             new (self) cm::ClusterFormerQA(ccfg(config, kw, "ClusterFormerQA"), gen_or_default(gen));
           },
           nb::arg("config") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 3>(), cdoc)
      .def_ro("encoder", &cm::ClusterFormerQA::encoder)  // (its memory banks: encoder.memory_banks())
      .def("on_train_step", &cm::ClusterFormerQA::on_train_step, release_gil());
  def_forward(cfqa,
              [](cm::ClusterFormerQA& q, const Tensor& question, std::optional<Tensor> qmask, const Tensor& context,
                 std::optional<Tensor> cmask, cnn::AuxLosses* aux) {
                cm::QAOutput o = q.forward(question, opt(qmask), context, opt(cmask), aux);
                return std::make_tuple(o.start_logits, o.end_logits, o.answerable_logits);
              },
              "-> (start_logits (B, x), end_logits (B, x), answerable_logits (B,)).", nb::arg("question"),
              nb::arg("question_mask").none(), nb::arg("context"), nb::arg("context_mask") = nb::none(),
              nb::arg("aux").none() = nb::none());

  // ---- Centroid Transformers ----
  nb::class_<cm::PointCloudOptions> pco(models, "PointCloudOptions", "Options of the point-cloud network (Figure 5).");
  def_kwargs_init(pco, "PointCloudOptions");
  pco.def_rw("num_classes", &cm::PointCloudOptions::num_classes)
      .def_rw("widths", &cm::PointCloudOptions::widths)
      .def_rw("blocks", &cm::PointCloudOptions::blocks)
      .def_rw("downsample", &cm::PointCloudOptions::downsample)
      .def_rw("n_heads", &cm::PointCloudOptions::n_heads)
      .def_rw("ff_mult", &cm::PointCloudOptions::ff_mult)
      .def_rw("knn", &cm::PointCloudOptions::knn)
      .def_rw("iterations", &cm::PointCloudOptions::iterations)
      .def_rw("init", &cm::PointCloudOptions::init)
      .def_rw("kmeans_iters", &cm::PointCloudOptions::kmeans_iters)
      .def_rw("fuse_dim", &cm::PointCloudOptions::fuse_dim)
      .def_rw("head", &cm::PointCloudOptions::head)
      .def_rw("dropout", &cm::PointCloudOptions::dropout)
      .def_rw("negative_slope", &cm::PointCloudOptions::negative_slope);
  nb::class_<cm::PointCloudClassifier, cnn::Module> pc(models, "PointCloudClassifier",
                                                       "Centroid Transformers' point-cloud classifier (section 3.2).");
  pc.def("__init__",
         [](cm::PointCloudClassifier* self, const cm::PointCloudOptions& o, cf::Generator* gen) {
           new (self) cm::PointCloudClassifier(o, gen_or_default(gen));
         },
         nb::arg("options"), nb::arg("generator").none() = nb::none(), nb::keep_alive<1, 3>());
  def_forward(pc,
              [](cm::PointCloudClassifier& p, const Tensor& points, cf::Generator* sampler) {
                return p.forward(points, sampler);
              },
              "points (B, N, 3) -> logits (B, num_classes).", nb::arg("points"), nb::arg("sampler").none() = nb::none());
  nb::class_<cm::CentroidViTOptions> vo(models, "CentroidViTOptions", "Options of the ViT with a centroid block (section 3.4).");
  def_kwargs_init(vo, "CentroidViTOptions");
  vo.def_rw("image_size", &cm::CentroidViTOptions::image_size)
      .def_rw("in_channels", &cm::CentroidViTOptions::in_channels)
      .def_rw("patch_kernel", &cm::CentroidViTOptions::patch_kernel)
      .def_rw("patch_stride", &cm::CentroidViTOptions::patch_stride)
      .def_rw("patch_padding", &cm::CentroidViTOptions::patch_padding)
      .def_rw("d_model", &cm::CentroidViTOptions::d_model)
      .def_rw("n_heads", &cm::CentroidViTOptions::n_heads)
      .def_rw("d_ff", &cm::CentroidViTOptions::d_ff)
      .def_rw("n_layers", &cm::CentroidViTOptions::n_layers)
      .def_rw("centroid_at", &cm::CentroidViTOptions::centroid_at)
      .def_rw("num_classes", &cm::CentroidViTOptions::num_classes)
      .def_rw("dropout", &cm::CentroidViTOptions::dropout);
  nb::class_<cm::CentroidViT, cnn::Module> vit(models, "CentroidViT", "Vision transformer with one centroid block.");
  vit.def("__init__",
          [](cm::CentroidViT* self, const cm::CentroidViTOptions& o, cf::Generator* gen) {
            new (self) cm::CentroidViT(o, gen_or_default(gen));
          },
          nb::arg("options"), nb::arg("generator").none() = nb::none(), nb::keep_alive<1, 3>())
      .def("num_tokens", &cm::CentroidViT::num_tokens);
  def_forward(vit, [](cm::CentroidViT& v, const Tensor& images) { return v.forward(images); },
              "images (B, C, H, W) -> logits (B, num_classes).", nb::arg("images"));
  nb::class_<cm::CentroidSummarizer, cnn::Module> summ(
      models, "CentroidSummarizer",
      "Encoder-decoder whose encoder has centroid blocks (section 3.1); the decoder cross-attends to the centroids.");
  summ.def("__init__",
           [tcfg](cm::CentroidSummarizer* self, nb::handle config, std::vector<int64_t> centroid_layers,
                  std::optional<cnn::CentroidAttentionOptions> centroid, cf::Generator* gen, nb::kwargs kw) {
             cm::CentroidSummarizerConfig c;
             c.base = tcfg(config, kw, "CentroidSummarizer");
             c.centroid_layers = std::move(centroid_layers);
             if (centroid) c.centroid = *centroid;
             new (self) cm::CentroidSummarizer(c, gen_or_default(gen));
           },
           nb::arg("config") = nb::none(), nb::arg("centroid_layers") = std::vector<int64_t>{2},
           nb::arg("centroid") = nb::none(), nb::arg("generator").none() = nb::none(), nb::arg("kwargs"), nb::keep_alive<1, 5>(),
           "config: a TransformerConfig dict (attention must be full); centroid_layers 1-based; centroid: "
           "CentroidAttentionOptions (default: M = N/3, mean-pooling init).");
  def_forward(summ,
              [](cm::CentroidSummarizer& s, const Tensor& src, std::optional<Tensor> src_mask, const Tensor& tgt,
                 std::optional<Tensor> tgt_mask, cf::Generator* sampler) {
                return s.forward(src, opt(src_mask), tgt, opt(tgt_mask), sampler);
              },
              "(src, src_mask, tgt, tgt_mask, sampler) -> logits (B, Nt, tgt_vocab). sampler: the generator of "
              "random-sampling inits (None: the global one).",
              nb::arg("src"), nb::arg("src_mask").none(), nb::arg("tgt"), nb::arg("tgt_mask") = nb::none(),
              nb::arg("sampler").none() = nb::none());

  // ---- attention switch (Vyas et al. 2020, Table 1) ----
  models.def("set_attention",
             [](cnn::Module& model, nb::handle attention, bool include_cross) {
               return cm::set_attention(model, to_json(attention, "attention"), include_cross);
             },
             nb::arg("model"), nb::arg("attention"), nb::arg("include_cross") = false,
             "Replace the attention of every self-attention layer with {\"type\": ..., options}; the projections stay. "
             "Returns the number of layers switched.");
}

}  // namespace cfpy
