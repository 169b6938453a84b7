// cf-approx: the Fast Transformers with Clustered Attention Table 1 analogue
// (Vyas, Katharopoulos, Fleuret 2020, section 4.1 "Approximation Quality") on
// fortunes topic classification. An encoder classifier is trained with full,
// clustered-C and improved-clustered-C attention; each trained model is then
// evaluated with every other attention (models::set_attention keeps the trained
// projections and swaps only the attention), plus the oracle-top baseline of the
// paper (each query keeps its top-k keys of the exact attention). A sweep over the
// number of clusters gives the speed/accuracy trade-off (the paper's Figure 1
// analogue, at inference). One JSON line per event on stdout, a final JSON summary,
// and the table in Markdown on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/options.h"
#include "common/report.h"
#include "common/topic_classification.h"
#include "masked_task.h"
#include "reformer_rule.h"
#include "models/attention_switch.h"
#include "nn/attention/multi_head.h"

using json = nlohmann::ordered_json;
using cf::apps::emit;
using cf::apps::Stats;
using cf::apps::UsageError;
using cf::apps::agreement;
using cf::apps::fmt_pct;
using cf::apps::seconds_since;
using cf::apps::stats_of;

namespace {

const char* kUsage = R"(usage: cf-approx [options]

Fast Transformers with Clustered Attention, Table 1 analogue: trains a
Transformer encoder classifier on fortunes topic classification (Debian package
'fortunes', one topic per file) with full, clustered-C and improved-clustered-C
attention, then evaluates every trained model with every attention: full,
clustered and improved clustered with C and 2C clusters (the paper's -100/-200
rows) and oracle-top (each query keeps only its top-k exact attention weights).
Each evaluation reports test accuracy and agreement: the fraction of test
texts given the same topic as the model with the attention it was trained
with. The paper's Reformer columns: --train shared-full (full attention whose
keys are the queries' projection, no key projection, in the Reformer's form:
keys normalised, a token attends to itself only when nothing else is allowed;
LSH attention with one bucket and one chunk of the whole sequence) and lsh-R
(LSH attention with R hashing rounds), evaluated with shared-full and lsh-R for
each R of --lsh-rounds and of --train; shared-full-plain is the other reading
of the paper's shared-full: full attention with k = q as they are. A model
with a key projection cannot run a sharing attention and the reverse (the
paper's "-" cells); clustered, improved clustered and oracle-top run on
sharing models with the keys taken from the queries, under the key rule the
model was trained with: the Reformer's for shared-full and lsh-R (normalised
keys; a query's own key gets no weight while another is allowed; dense
weights, an analysis tool for short sequences), as they are for
shared-full-plain. Then the speed/accuracy trade-off: accuracy, agreement and inference time
of each trained model with clustered and improved-clustered attention for each
number of clusters in --sweep-clusters. Texts are characters (one token per code
point), so sequences are long enough for clustering to approximate.

--task masked runs the same protocol per token (the paper scores every frame):
the texts of each split (the first --max-len characters of each) are joined into
one character stream with a <sep> token between texts, cut into windows
of --seq-len, and a bidirectional encoder predicts the characters hidden behind
a <mask> token (--mask-rate of the positions); accuracy and agreement are then
over the hidden characters of --eval-windows test windows (one fixed draw of
hidden positions, the same for every evaluation).

Output: one JSON line per event on stdout (start, data, train, val, eval,
sweep), a final {"event": "summary", ...} line with mean and spread over the
seeds; the same tables in Markdown on stderr.
)";
const char* kExitStatus = R"(Exit status: 0 done, 1 failure (no fortunes, bad checkpoint, ...), 2 bad command line,
3 stopped by --stop-after.
)";

struct Config {
  std::string task = "topic";  // topic | masked
  cf::apps::MaskedTaskConfig masked;
  cf::apps::TopicDataConfig data;
  int64_t d_model = 64, n_heads = 4, n_layers = 2, d_ff = 128;
  double dropout = 0.1;
  std::string pooling = "first";
  cf::apps::ClassifierTrainConfig train_opts;
  std::vector<std::string> train = {"full", "clustered", "improved-clustered"};
  int64_t clusters = 16, topk = 8, bits = 63, iterations = 10;
  std::vector<int64_t> lsh_rounds = {1, 4};  // the paper's lsh-1 and lsh-4
  int64_t lsh_bucket_size = 16;
  int64_t seq_len = 0;  // the model's longest sequence (set once the data is read): shared-full's one chunk
  std::vector<int64_t> eval_clusters;  // empty: {C, 2C}
  bool oracle_top = true;
  std::vector<int64_t> sweep_clusters = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
};

// R of "lsh-R" (R >= 1, digits without a leading zero), or 0 for any other name.
int64_t lsh_rounds_of(const std::string& name) {
  if (name.rfind("lsh-", 0) != 0 || name.size() == 4 || name.size() > 12 || name[4] == '0') return 0;
  for (size_t i = 4; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return 0;
  return std::stoll(name.substr(4));
}

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  cf::apps::Options o(kUsage, kExitStatus);
  o.section("Task");
  o.add_string("task", &c.task,
               "topic: one topic per text (the default); masked: the hidden characters of a masked-character "
               "model, one prediction per token");
  o.add_int("seq_len", &c.masked.seq_len, 2, "masked task: characters per window");
  o.add_number("mask_rate", &c.masked.mask_rate, "masked task: fraction of the positions hidden, in (0, 1)");
  o.add_int("eval_windows", &c.masked.eval_windows, 1,
            "masked task: test (and validation) windows, spread evenly over the held-out stream");
  o.section("Data");
  cf::apps::add_topic_data_options(o, c.data);
  o.section("Model (pre-LN encoder, sinusoidal positions)");
  o.add_int("d_model", &c.d_model, 1, "model width");
  o.add_int("n_heads", &c.n_heads, 1, "attention heads");
  o.add_int("n_layers", &c.n_layers, 1, "encoder layers");
  o.add_int("d_ff", &c.d_ff, 1, "feed-forward width");
  o.add_number("dropout", &c.dropout, "dropout rate");
  o.add_string("pooling", &c.pooling,
               "first: a <cls> token put before each text, whose last hidden state is classified, so the "
               "prediction rests on one query's attention (as the paper's per-frame outputs do); mean: the mean "
               "over the text, which averages attention errors away");
  o.section("Training (AdamW, warmup + cosine, gradient clipping 1)");
  cf::apps::add_classifier_train_options(o, c.train_opts);
  o.section("Attention");
  o.add_string_list("train", &c.train,
                    "attentions to train with, comma-separated, from full, clustered, improved-clustered, "
                    "shared-full (keys from the queries' projection, the Reformer's rule), shared-full-plain (keys "
                    "are the queries as they are) and lsh-R (LSH attention, R hashing rounds)", /*distinct=*/true);
  o.add_int("clusters", &c.clusters, 1,
            "clusters of the trained clustered models (16: the paper's 100 clusters for ~780 frames, scaled to "
            "128 characters)");
  o.add_int("topk", &c.topk, 1,
            "improved clustered and oracle-top keys (8: the paper's 32 of ~780, scaled likewise)");
  o.add_int("bits", &c.bits, 1, "hash bits");
  o.add_int("iterations", &c.iterations, 1, "Hamming K-Means iterations");
  o.add_int_list("eval_clusters", &c.eval_clusters, 1,
                 "cluster counts evaluated in the table (empty: C,2C, C = --clusters, those up to the positions a "
                 "model reads)", /*distinct=*/true);
  o.add_int_list("sweep_clusters", &c.sweep_clusters, 1,
                 "cluster counts of the trade-off sweep; empty: no sweep (C=1 gives every query of a text the "
                 "same attention weights)", /*distinct=*/true);
  o.add_bool("oracle_top", &c.oracle_top, "evaluate oracle-top too");
  o.add_int_list("lsh_rounds", &c.lsh_rounds, 1,
                 "hashing rounds of the lsh-R rows (evaluated on models that share queries and keys); empty: none",
                 /*distinct=*/true);
  o.add_int("lsh_bucket_size", &c.lsh_bucket_size, 1,
            "LSH chunk length (16: a bucket per 8 characters of 128, as the clusters above; the Reformer's 64 "
            "is for sequences of thousands)");
  o.section("Runs");
  o.add_seeds(&c.seeds, "model initialisation, dropout, batch order, hashing");
  o.add_string("device", &c.device, "cpu | cuda[:N]: where the models train and run");
  if (!o.parse(argc, argv)) return false;

  if (c.task != "topic" && c.task != "masked")
    throw UsageError("--task must be topic or masked, got '" + c.task + "'");
  if (!(c.masked.mask_rate > 0 && c.masked.mask_rate < 1))
    throw UsageError("--mask-rate must be in (0, 1), got " + cf::str(c.masked.mask_rate));
  for (const std::string& t : c.train)
    if (t != "full" && t != "shared-full" && t != "shared-full-plain" && t != "clustered" &&
        t != "improved-clustered" && lsh_rounds_of(t) < 1)
      throw UsageError("--train: unknown attention '" + t +
                       "' (expected full, shared-full, shared-full-plain, clustered, improved-clustered or lsh-R "
                       "with R >= 1 rounds)");
  cf::apps::check_topic_data_config(c.data);
  cf::apps::check_train_settings(c.train_opts);
  cf::apps::check_cuda_graph_settings(c.train_opts, c.device, false);
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (c.pooling != "mean" && c.pooling != "first")
    throw UsageError("--pooling must be mean or first, got '" + c.pooling + "'");
  c.data.cls_token = c.task == "topic" && c.pooling == "first";
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + std::to_string(c.d_model) + ") must be divisible by --n-heads (" +
                     std::to_string(c.n_heads) + ")");
  if (c.bits > 63) throw UsageError("--bits must be in [1, 63]");
  // Clustered attention takes at most one cluster per position: a count beyond the positions a model reads
  // ran as that many and was reported under the larger count.
  // The trained models' C and the lists the user gave are checked; the default lists keep the counts that fit.
  const int64_t positions = c.task == "masked" ? c.masked.seq_len : c.data.max_len + (c.data.cls_token ? 1 : 0);
  const std::string limit = c.task == "masked" ? "--seq-len " + std::to_string(c.masked.seq_len)
                            : c.data.cls_token ? "--max-len " + std::to_string(c.data.max_len) + " and <cls>"
                                               : "--max-len " + std::to_string(c.data.max_len);
  auto dashed = [](std::string key) {
    std::replace(key.begin(), key.end(), '_', '-');
    return key;
  };
  auto check_clusters = [&](const std::string& key, const std::vector<int64_t>& counts) {
    if (key != "clusters" && !o.given(key)) return;  // lists given as defaults are trimmed below; C is one value
    for (int64_t k : counts)
      if (k > positions)
        throw UsageError("--" + dashed(key) + " " + std::to_string(k) + " is more than the " +
                         std::to_string(positions) + " positions a model reads (" + limit +
                         "); clustered attention would run with " + std::to_string(positions));
  };
  auto fitting = [&](const std::vector<int64_t>& counts) {
    std::vector<int64_t> out;
    for (int64_t k : counts)
      if (k <= positions) out.push_back(k);
    return out;
  };
  const bool trains_clustered = std::count(c.train.begin(), c.train.end(), "clustered") +
                                    std::count(c.train.begin(), c.train.end(), "improved-clustered") > 0;
  if (trains_clustered) check_clusters("clusters", {c.clusters});
  check_clusters("eval_clusters", c.eval_clusters);
  check_clusters("sweep_clusters", c.sweep_clusters);
  if (!o.given("sweep_clusters")) c.sweep_clusters = fitting(c.sweep_clusters);
  if (c.eval_clusters.empty()) {  // the default C, 2C: the counts a model can take
    c.eval_clusters = fitting({c.clusters, 2 * c.clusters});
    if (c.eval_clusters.empty()) c.eval_clusters = {positions};
  }
  return true;
}

// ---------------------------------------------------------------- attention

json clustered_spec(const Config& c, bool improved, int64_t clusters) {
  json a = {{"type", improved ? "improved-clustered" : "clustered"},
            {"clusters", clusters},
            {"bits", c.bits},
            {"iterations", c.iterations}};
  if (improved) a["topk"] = c.topk;
  return a;
}

json lsh_spec(const Config& c, int64_t rounds) {
  return json{{"type", "lsh"}, {"n_hashes", rounds}, {"bucket_size", c.lsh_bucket_size}};
}

// The paper's shared-full: full attention of a shared-QK model as the Reformer defines it (normalised keys,
// no attention to oneself beside another key), i.e. LSH attention with a single bucket and a single chunk.
json shared_full_spec(const Config& c) {
  return json{{"type", "lsh"}, {"n_hashes", 1}, {"n_buckets", 1}, {"bucket_size", c.seq_len}};
}

// The other reading of the paper's shared-full: full attention with k = q as they are (no normalisation,
// a token's own key like any other).
json shared_full_plain_spec() { return json{{"type", "full"}, {"shared_qk", true}}; }

json train_spec(const Config& c, const std::string& type) {
  if (type == "full") return json{{"type", "full"}};
  if (type == "shared-full") return shared_full_spec(c);
  if (type == "shared-full-plain") return shared_full_plain_spec();
  if (const int64_t r = lsh_rounds_of(type)) return lsh_spec(c, r);
  return clustered_spec(c, type == "improved-clustered", c.clusters);
}

// Whether an attention takes its keys from the queries' projection (a model trained with one has no key
// projection): LSH always, the others when told so.
bool shares_qk(const json& spec) { return spec["type"] == "lsh" || spec.value("shared_qk", false); }

// Whether a model trained with this attention learned the Reformer's key rule (normalised keys, no attention
// to oneself beside another key): shared-full and lsh-R, which are LSH attention.
bool reformer_rule(const json& spec) { return spec["type"] == "lsh"; }

std::string label_of(const json& spec) {
  const std::string t = spec["type"].get<std::string>();
  if (t == "full") return spec.value("shared_qk", false) ? "shared-full-plain" : "full";
  if (t == "lsh")
    return spec.value("n_buckets", 0) == 1 ? "shared-full" : "lsh-" + std::to_string(spec["n_hashes"].get<int64_t>());
  return (t == "clustered" ? "clustered-" : "i-clustered-") + std::to_string(spec["clusters"].get<int64_t>());
}

// The paper's oracle-top (section 4.1): the exact attention of each query restricted
// to its top-k keys (softmax over those k scores only). Dense: an analysis
// baseline, never an efficient method; the app installs it directly in each
// MultiHeadAttention since it is not a registered variant.
class OracleTopAttention : public cf::nn::Attention {
 public:
  explicit OracleTopAttention(int64_t k) : k_(k) {}
  std::string type() const override { return "oracle-top"; }
  cf::Tensor forward(const cf::nn::AttentionArgs& a) override {
    cf::nn::check_attention_args(a, "oracle-top");
    const int64_t d = a.q.size(-1), nk = a.k.size(-2);
    cf::Tensor s = cf::matmul(a.q, cf::transpose(a.k, -2, -1)) * (1.0 / std::sqrt(double(d)));
    cf::Tensor block = cf::nn::dense_block_mask(a);
    const double ninf = -std::numeric_limits<double>::infinity();
    if (block.defined()) s = cf::masked_fill(s, block, ninf);
    const int64_t kk = std::min(k_, nk);
    cf::Tensor kth = cf::slice(cf::topk(s, kk, -1).values, -1, kk - 1, kk);  // k-th largest score per query
    s = cf::masked_fill(s, cf::lt(s, kth), ninf);
    return cf::matmul(cf::softmax(s, -1), a.v);
  }

 private:
  int64_t k_;
};

// The clustered or improved clustered attention of a spec (clustered_spec's keys) under the Reformer's key rule.
std::shared_ptr<cf::apps::ReformerRuleAttention> reformer_rule_clustered(const json& spec) {
  cf::nn::ClusteredOptions o;
  o.improved = spec["type"] == "improved-clustered";
  o.clusters = spec["clusters"].get<int64_t>();
  o.bits = spec["bits"].get<int64_t>();
  o.iterations = spec["iterations"].get<int64_t>();
  if (o.improved) o.topk = spec["topk"].get<int64_t>();
  return cf::apps::ReformerRuleAttention::clustered(o);
}

// Install an attention (a JSON spec, or oracle-top; with "key_rule": "reformer", the analysis attentions of
// reformer_rule.h) in every MultiHeadAttention of the model (cf-approx's encoders have self-attention only).
void install(cf::nn::Module& model, const json& spec, int64_t topk) {
  const bool reformer = spec.value("key_rule", "") == "reformer";
  if (spec["type"] == "oracle-top" || reformer) {
    // The layers first: replacing an attention frees the old one, which named_modules also lists.
    std::vector<cf::nn::MultiHeadAttention*> layers;
    for (auto& [name, m] : model.named_modules())
      if (auto* mha = dynamic_cast<cf::nn::MultiHeadAttention*>(m)) layers.push_back(mha);
    for (cf::nn::MultiHeadAttention* mha : layers) {
      std::shared_ptr<cf::nn::Attention> a;
      if (!reformer) {
        a = std::make_shared<OracleTopAttention>(topk);
        a->set_shared_qk(shares_qk(spec));
      } else if (spec["type"] == "oracle-top") {
        a = cf::apps::ReformerRuleAttention::oracle_top(topk);
      } else {
        a = reformer_rule_clustered(spec);
      }
      mha->set_attention(a);
    }
    if (layers.empty()) throw cf::ValueError("[cf-approx] the model has no attention layer");
    return;
  }
  cf::models::set_attention(model, nlohmann::json::parse(spec.dump()));
}

// ---------------------------------------------------------------- training and evaluation

// results[train][eval] -> one entry per seed; the sweep's [train][variant][C].
struct Results {
  std::map<std::string, std::map<std::string, std::vector<double>>> acc, secs, agree;
  std::map<std::string, std::vector<double>> train_secs, train_peak_bytes;
  std::map<std::string, std::map<std::string, std::map<int64_t, std::vector<double>>>> sweep_acc, sweep_secs,
      sweep_agree;
};

// The evaluated attentions (rows of the table), in the paper's order.
std::vector<json> eval_specs_of(const Config& cfg) {
  std::vector<json> eval_specs = {json{{"type", "full"}}};
  if (std::any_of(cfg.train.begin(), cfg.train.end(), [&](const std::string& t) { return shares_qk(train_spec(cfg, t)); })) {
    eval_specs.push_back(shared_full_spec(cfg));
    std::vector<int64_t> rounds = cfg.lsh_rounds;  // and every trained lsh-R, so each model has its own row
    for (const std::string& t : cfg.train)
      if (const int64_t r = lsh_rounds_of(t); r > 0 && std::find(rounds.begin(), rounds.end(), r) == rounds.end())
        rounds.push_back(r);
    for (int64_t r : rounds) eval_specs.push_back(lsh_spec(cfg, r));
  }
  if (std::find(cfg.train.begin(), cfg.train.end(), "shared-full-plain") != cfg.train.end())
    eval_specs.push_back(shared_full_plain_spec());
  for (int64_t cl : cfg.eval_clusters) eval_specs.push_back(clustered_spec(cfg, false, cl));
  for (int64_t cl : cfg.eval_clusters) eval_specs.push_back(clustered_spec(cfg, true, cl));
  if (cfg.oracle_top) eval_specs.push_back(json{{"type", "oracle-top"}});
  return eval_specs;
}

std::string row_label(const json& s) { return s["type"] == "oracle-top" ? std::string("oracle-top") : label_of(s); }

// An evaluated attention as a model trained with `native` runs it: on a sharing model clustered, improved
// clustered and oracle-top take their keys from the queries, under the key rule the model learned (the
// Reformer's for shared-full and lsh-R, k = q as they are for shared-full-plain); null for full attention
// and LSH when they disagree with the model on sharing (no such cell: the model lacks, or has, the key
// projection).
json as_run_by(const json& spec, const json& native) {
  const std::string t = spec["type"].get<std::string>();
  const bool model_shares = shares_qk(native);
  if (t == "full" || t == "lsh") return shares_qk(spec) == model_shares ? spec : json(nullptr);
  json s = spec;
  if (reformer_rule(native))
    s["key_rule"] = "reformer";
  else if (model_shares)
    s["shared_qk"] = true;
  return s;
}

// The keys an evaluation uses (the "key_rule" of the eval and sweep events): the model's key projection
// ("projection"), the queries under the Reformer's rule ("reformer"), or the queries as they are ("plain").
std::string key_rule_of(const json& run_spec) {
  if (run_spec["type"] == "lsh" || run_spec.value("key_rule", "") == "reformer") return "reformer";
  return run_spec.value("shared_qk", false) ? "plain" : "projection";
}

// The evaluations of one trained model: with the attention it was trained with
// (`native`), with every attention of the table and in the trade-off sweep (the
// trained projections stay). Agreement: the fraction of test items (texts, or
// hidden characters) given the same prediction as the native model, a direct
// measure of the approximation, which task accuracy blurs.
void evaluate_everywhere(const Config& cfg, cf::nn::Module& model, const json& native, int64_t seed,
                         const std::string& tlabel, const std::function<cf::apps::EvalResult()>& evaluate,
                         Results& res) {
  install(model, native, cfg.topk);
  const std::vector<int64_t> native_pred = evaluate().predictions;
  for (const json& row : eval_specs_of(cfg)) {
    const json spec = as_run_by(row, native);
    if (spec.is_null()) continue;
    install(model, spec, cfg.topk);
    cf::apps::EvalResult r = evaluate();
    const std::string el = row_label(row);
    const double ag = agreement(r.predictions, native_pred);
    res.acc[tlabel][el].push_back(r.accuracy);
    res.secs[tlabel][el].push_back(r.time_s);
    res.agree[tlabel][el].push_back(ag);
    emit({{"event", "eval"}, {"seed", seed}, {"train_attention", tlabel}, {"eval_attention", el},
          {"test_accuracy", r.accuracy}, {"agreement", ag}, {"time_s", r.time_s}, {"same", el == tlabel},
          {"key_rule", key_rule_of(spec)}});
  }
  // Speed/accuracy trade-off: each number of clusters, both variants.
  for (int64_t cl : cfg.sweep_clusters) {
    for (bool improved : {false, true}) {
      const json spec = as_run_by(clustered_spec(cfg, improved, cl), native);
      install(model, spec, cfg.topk);
      cf::apps::EvalResult r = evaluate();
      const std::string variant = improved ? "i-clustered" : "clustered";
      const double ag = agreement(r.predictions, native_pred);
      res.sweep_acc[tlabel][variant][cl].push_back(r.accuracy);
      res.sweep_secs[tlabel][variant][cl].push_back(r.time_s);
      res.sweep_agree[tlabel][variant][cl].push_back(ag);
      emit({{"event", "sweep"}, {"seed", seed}, {"train_attention", tlabel}, {"eval_attention", variant},
            {"clusters", cl}, {"test_accuracy", r.accuracy}, {"agreement", ag}, {"time_s", r.time_s},
            {"key_rule", key_rule_of(spec)}});
    }
  }
}

// What both tasks share when training one model: the run's tags, signature and checkpoint.
cf::apps::TrainRun train_run_of(const Config& cfg, const cf::apps::TopicData& data, cf::Device dev,
                                const json& model_json, int64_t seed,
                                const std::string& tname, const std::string& tlabel) {
  const cf::apps::ClassifierTrainConfig& tc = cfg.train_opts;
  cf::apps::TrainRun run;
  run.app = "cf-approx";
  run.tags = {{"seed", seed}, {"train_attention", tlabel}};
  // What a checkpoint must agree on to be reused: everything that shapes training.
  run.signature = {{"model", model_json}, {"seed", seed},           {"steps", tc.steps},
                   {"batch_size", tc.batch_size}, {"lr", tc.lr},     {"weight_decay", tc.weight_decay},
                   {"warmup", tc.warmup},         {"data", cf::apps::topic_data_signature(cfg.data, data)}};
  if (tc.precision != "fp32") run.signature["precision"] = tc.precision;
  if (cfg.task == "masked")
    // ("stream" names how the stream is built: a checkpoint trained on texts glued without <sep>, or with a
    // hidden and scored <sep>, is another model)
    run.signature["masked_task"] = {{"seq_len", cfg.masked.seq_len}, {"mask_rate", cfg.masked.mask_rate},
                                    {"eval_windows", cfg.masked.eval_windows},
                                    {"stream", "texts joined by <sep>, never hidden"}};
  // The file name carries what tells models of one attention apart: the cluster count, and an LSH model's
  // chunk length (another --lsh-bucket-size trains another model instead of refusing this one's file).
  if (!tc.checkpoint_dir.empty())
    run.checkpoint = tc.checkpoint_dir + "/" + (cfg.task == "masked" ? "masked-" : "") + tname + "-C" +
                     std::to_string(cfg.clusters) +
                     (lsh_rounds_of(tname) > 0 ? "-bucket" + std::to_string(cfg.lsh_bucket_size) : std::string()) +
                     "-seed" + std::to_string(seed) + ".safetensors";
  run.device = dev;
  return run;
}

json model_json_of(const Config& cfg, const std::string& tname, int64_t vocab, int64_t max_len, int64_t classes) {
  json j = {{"vocab_size", vocab}, {"max_len", max_len}, {"n_layers", cfg.n_layers}, {"num_classes", classes},
            {"d_model", cfg.d_model}, {"n_heads", cfg.n_heads}, {"d_ff", cfg.d_ff}, {"dropout", cfg.dropout},
            {"attention", train_spec(cfg, tname)}};
  if (cfg.task == "topic") j["pooling"] = cfg.pooling;
  return j;
}

// The topic classifier trained with attention cfg.train[ti] at one seed (or
// reused from its checkpoint), then evaluated with every attention.
void train_and_evaluate(const Config& cfg, cf::Device dev, const cf::apps::TopicData& data,
                        const std::shared_ptr<cf::data::SequenceDataset>& train_ds, cf::data::DataLoader& val_loader,
                        cf::data::DataLoader& test_loader, int64_t seed, size_t ti, const std::string& tlabel,
                        Results& res) {
  const std::string& tname = cfg.train[ti];
  const json model_json = model_json_of(cfg, tname, data.vocab, data.max_tokens, int64_t(data.topics.size()));
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)};
  auto mcfg = cf::models::TransformerConfig::from_json(nlohmann::json::parse(model_json.dump()));
  auto model = std::make_shared<cf::models::EncoderClassifier>(mcfg, gen);
  model->to(dev);
  const cf::apps::TrainResult tr = cf::apps::train_classifier(
      *model, cfg.train_opts, train_run_of(cfg, data, dev, model_json, seed, tname, tlabel), seed, {}, train_ds, val_loader);
  if (tr.trained) {  // not for a reused model
    res.train_secs[tlabel].push_back(tr.time_s);
    res.train_peak_bytes[tlabel].push_back(double(tr.peak_bytes));
  }
  evaluate_everywhere(cfg, *model, train_spec(cfg, tname), seed, tlabel, [&] {
    return cf::apps::evaluate_classifier(*model, test_loader, uint64_t(seed) + 999, dev);
  }, res);
}

// The masked-character model (--task masked) likewise. The vocabulary gains the
// <mask> id (data.vocab); the classes are the characters.
void train_and_evaluate_masked(const Config& cfg, cf::Device dev, const cf::apps::TopicData& data,
                               const std::vector<int64_t>& train_stream, const cf::apps::MaskedEvalSet& val_set,
                               const cf::apps::MaskedEvalSet& test_set, int64_t seed, size_t ti,
                               const std::string& tlabel, Results& res) {
  const std::string& tname = cfg.train[ti];
  const int64_t mask_id = data.vocab;
  const json model_json = model_json_of(cfg, tname, data.vocab + 1, cfg.masked.seq_len, data.vocab);
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)};
  auto mcfg = cf::models::TransformerConfig::from_json(nlohmann::json::parse(model_json.dump()));
  auto model = std::make_shared<cf::models::TokenClassifier>(mcfg, gen);
  model->to(dev);
  const cf::apps::TrainResult tr =
      cf::apps::train_masked(*model, cfg.train_opts, train_run_of(cfg, data, dev, model_json, seed, tname, tlabel),
                             cfg.masked, train_stream, val_set, mask_id, data.vocab, seed);
  if (tr.trained) {
    res.train_secs[tlabel].push_back(tr.time_s);
    res.train_peak_bytes[tlabel].push_back(double(tr.peak_bytes));
  }
  evaluate_everywhere(cfg, *model, train_spec(cfg, tname), seed, tlabel, [&] {
    return cf::apps::evaluate_masked(*model, test_set, uint64_t(seed) + 999, dev);
  }, res);
}

// The summary line (JSON) and the Markdown tables on stderr.
void summarise(const Config& cfg, cf::Device dev, const cf::apps::TopicData& data,
               const std::vector<std::string>& train_labels, Results& res,
               std::chrono::steady_clock::time_point t_start) {
  const std::vector<json> eval_specs = eval_specs_of(cfg);
  json table = json::object();
  std::ostringstream md;
  auto header = [&](const std::string& title) {
    md << "\n" << title << ", mean ± sample std over " << cfg.seeds.size()
       << " seed(s); columns: trained with, rows: evaluated with\n\n| evaluate with |";
    for (const std::string& t : train_labels) md << " " << t << " |";
    md << "\n|---|";
    for (size_t i = 0; i < train_labels.size(); ++i) md << "---|";
    md << "\n";
  };
  for (int part = 0; part < 2; ++part) {
    header(part == 0 ? "Test accuracy (%)" : "Agreement (%) with the predictions of the attention trained with");
    for (const json& spec : eval_specs) {
      const std::string el = row_label(spec);
      md << "| " << el << " |";
      for (const std::string& t : train_labels) {
        Stats s = stats_of(part == 0 ? res.acc[t][el] : res.agree[t][el]);
        if (s.n == 0) {  // the model and this attention disagree on sharing queries and keys
          md << " - |";
          continue;
        }
        if (part == 0) {
          Stats g = stats_of(res.agree[t][el]), ts = stats_of(res.secs[t][el]);
          table[t][el] = {{"accuracy_mean", s.mean}, {"accuracy_std", s.std}, {"accuracy", res.acc[t][el]},
                          {"agreement_mean", g.mean}, {"agreement_std", g.std}, {"time_s_mean", ts.mean}};
        }
        md << " " << (el == t ? "**" + fmt_pct(s) + "**" : fmt_pct(s)) << " |";
      }
      md << "\n";
    }
  }
  json sweep = json::object();
  if (!cfg.sweep_clusters.empty()) {
    md << "\nSpeed/accuracy trade-off: test accuracy % / agreement % / test-set inference time s, mean over "
       << cfg.seeds.size() << " seed(s) (full: shared-full or shared-full-plain for a model that shares queries and keys)\n\n"
       << "| trained with | evaluated with | full |";
    for (int64_t cl : cfg.sweep_clusters) md << " C=" << cl << " |";
    md << "\n|---|---|---|";
    for (size_t i = 0; i < cfg.sweep_clusters.size(); ++i) md << "---|";
    md << "\n";
    for (size_t ti = 0; ti < train_labels.size(); ++ti) {
      const std::string& t = train_labels[ti];
      // The exact attention this model can run: full, or its own for a sharing model.
      const json native = train_spec(cfg, cfg.train[ti]);
      const std::string exact = !shares_qk(native) ? "full" : reformer_rule(native) ? "shared-full" : label_of(native);
      for (const std::string variant : {"clustered", "i-clustered"}) {
        char buf[96];
        Stats fa = stats_of(res.acc[t][exact]), fg = stats_of(res.agree[t][exact]), ft = stats_of(res.secs[t][exact]);
        std::snprintf(buf, sizeof buf, "%.1f / %.1f / %.2f", 100 * fa.mean, 100 * fg.mean, ft.mean);
        md << "| " << t << " | " << variant << " | " << buf << " |";
        for (int64_t cl : cfg.sweep_clusters) {
          Stats a = stats_of(res.sweep_acc[t][variant][cl]), g = stats_of(res.sweep_agree[t][variant][cl]),
                s = stats_of(res.sweep_secs[t][variant][cl]);
          sweep[t][variant][std::to_string(cl)] = {{"accuracy_mean", a.mean}, {"accuracy_std", a.std},
                                                   {"agreement_mean", g.mean}, {"time_s_mean", s.mean},
                                                   {"time_s_std", s.std}};
          std::snprintf(buf, sizeof buf, "%.1f / %.1f / %.2f", 100 * a.mean, 100 * g.mean, s.mean);
          md << " " << buf << " |";
        }
        md << "\n";
      }
    }
  }
  json train_time = json::object();
  for (auto& [t, v] : res.train_secs) train_time[t] = stats_of(v).mean;  // models trained by this run only
  // Each trained model's own training peak (the allocator's peak at the end of the run was the
  // peak since the last model started training: it depended on the order of --train).
  json train_peak = json::object();
  for (auto& [t, v] : res.train_peak_bytes) train_peak[t] = stats_of(v).mean;
  emit({{"event", "summary"}, {"task", cfg.task}, {"seeds", cfg.seeds}, {"classes", data.topics.size()},
        {"test_size", data.test.ids.size()}, {"mean_len", data.mean_len}, {"table", table}, {"sweep", sweep},
        {"train_time_s_mean", train_time}, {"total_time_s", seconds_since(t_start)},
        {"train_peak_bytes_mean", train_peak}});
  std::cerr << md.str() << std::flush;
}

// The app once its command line is read: its exit status.
int run(Config cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  const cf::apps::TopicData data = cf::apps::load_topic_data(cfg.data, "cf-approx");
  cfg.seq_len = cfg.task == "masked" ? cfg.masked.seq_len : data.max_tokens;
  const cf::apps::ClassifierTrainConfig& tc = cfg.train_opts;
  emit({{"event", "start"}, {"app", "cf-approx"}, {"device", cfg.device}, {"task", cfg.task}, {"seeds", cfg.seeds},
        {"train", cfg.train}, {"clusters", cfg.clusters}, {"eval_clusters", cfg.eval_clusters},
        {"topk", cfg.topk}, {"sweep_clusters", cfg.sweep_clusters}, {"lsh_rounds", cfg.lsh_rounds},
        {"lsh_bucket_size", cfg.lsh_bucket_size}, {"steps", tc.steps}, {"machine", cf::apps::machine_record()}});
  emit(cf::apps::topic_data_event(cfg.data, data));

  cf::apps::TopicLoaders loaders(data, tc.eval_batch_size);

  std::vector<std::string> train_labels;
  for (const std::string& t : cfg.train) train_labels.push_back(label_of(train_spec(cfg, t)));
  if (!tc.checkpoint_dir.empty()) cf::apps::make_dir(tc.checkpoint_dir, "cf-approx", "--checkpoint-dir");

  Results res;
  if (cfg.task == "masked") {
    const std::vector<int64_t> train_stream = cf::apps::join_texts(data.train);
    // Fixed draws of hidden positions (seeds 1 and 2), the same for every model and seed.
    const cf::apps::MaskedEvalSet val_set = cf::apps::masked_eval_set(
        cf::apps::join_texts(data.val), cfg.masked, tc.eval_batch_size, data.vocab, 1, dev, "cf-approx",
        "validation");
    const cf::apps::MaskedEvalSet test_set = cf::apps::masked_eval_set(
        cf::apps::join_texts(data.test), cfg.masked, tc.eval_batch_size, data.vocab, 2, dev, "cf-approx", "test");
    emit({{"event", "masked_task"}, {"train_characters", train_stream.size()}, {"seq_len", cfg.masked.seq_len},
          {"mask_rate", cfg.masked.mask_rate}, {"val_hidden", val_set.hidden}, {"test_hidden", test_set.hidden}});
    for (int64_t seed : cfg.seeds)
      for (size_t ti = 0; ti < cfg.train.size(); ++ti)
        train_and_evaluate_masked(cfg, dev, data, train_stream, val_set, test_set, seed, ti, train_labels[ti], res);
  } else {
    for (int64_t seed : cfg.seeds)
      for (size_t ti = 0; ti < cfg.train.size(); ++ti)
        train_and_evaluate(cfg, dev, data, loaders.train, loaders.val, loaders.test, seed, ti, train_labels[ti], res);
  }
  summarise(cfg, dev, data, train_labels, res, t_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-approx",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::parse_device(cfg.device);
        return true;
      },
      [&] { return run(cfg, dev); });
}
