// cf-textcls: topic classification on the fortunes corpus with encoder
// classifiers that are identical except for their attention: the ClusterFormer
// paper's text classification experiment (Wang et al., ACL 2022, section 4.2,
// Table 2) rerun with full attention, neural clustering attention (ClusterFormer),
// LSH (Reformer), routing (Routing Transformer), clustered and improved clustered
// attention (Fast Transformers). Optional parts: the L1/L2 loss-weight ablation
// (section 4.5, Table 5) and the sweep over the number of clusters k with
// accuracy, training time and peak memory (section 4.4, Table 4).
//
// One JSON line per event on stdout, a final JSON summary; the tables in Markdown
// on stderr.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/distributed.h"
#include "common/options.h"
#include "common/report.h"
#include "common/topic_classification.h"
#include "models/neural_clustering.h"
#include "nn/attention/neural_clustering.h"

using json = nlohmann::ordered_json;
using cf::apps::emit;
using cf::apps::fmt;
using cf::apps::fmt_pct;
using cf::apps::seconds_since;
using cf::apps::Stats;
using cf::apps::stats_of;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-textcls [options]

Topic classification on the fortunes corpus (Debian package 'fortunes', one
topic per file) with Transformer encoder classifiers that differ only in their
attention: the ClusterFormer paper's text classification experiment (Table 2).
By default it trains the full-attention Transformer and ClusterFormer (neural
clustering attention) and prints their test accuracy, training time and peak
memory side by side. --attentions all adds LSH (Reformer), routing (Routing
Transformer), clustered and improved clustered attention; --ablation adds the
L1/L2 loss-weight ablation (Table 5); --k-sweep the number of clusters of
neural clustering attention (Table 4: accuracy, peak memory, time).

Output: one JSON line per event on stdout (start, data, train, val, result), a
final {"event": "summary", ...} line with mean and spread over the seeds; the
tables in Markdown on stderr. Texts are characters (one token per code point).
)";
const char* kExitStatus = R"(Exit status: 0 done, 1 failure (no fortunes, bad checkpoint, ...), 2 bad command line,
3 stopped by --stop-after.
)";

const std::vector<std::string> kAttentions = {"full",    "neural-clustering", "lsh",
                                              "routing", "clustered",         "improved-clustered"};

struct Config {
  cf::apps::TopicDataConfig data;
  int64_t d_model = 64, n_heads = 4, n_layers = 2, d_ff = 128;
  double dropout = 0.1;
  std::string pooling = "mean";
  cf::apps::ClassifierTrainConfig train;
  std::vector<std::string> attentions = {"full", "neural-clustering"};
  int64_t k = 0, look_back = 1;
  double mu = 1e-3, nu = 1e-3;
  std::string loss_form = "inner";
  int64_t lsh_bucket_size = 32, lsh_hashes = 2, routing_clusters = 0;
  double routing_weight = 1e-4;
  int64_t clusters = 16, topk = 32;
  bool ablation = false;
  std::vector<int64_t> k_sweep;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
  bool distributed = false;
};

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  c.data.max_len = 256;
  c.train.steps = 300;
  c.train.warmup = 30;
  cf::apps::Options o(kUsage, kExitStatus);
  o.section("Data");
  cf::apps::add_topic_data_options(o, c.data);
  o.section("Model (pre-LN encoder, sinusoidal positions, the same for every attention)");
  o.add_int("d_model", &c.d_model, 1, "model width");
  o.add_int("n_heads", &c.n_heads, 1, "attention heads");
  o.add_int("n_layers", &c.n_layers, 1, "encoder layers");
  o.add_int("d_ff", &c.d_ff, 1, "feed-forward width");
  o.add_number("dropout", &c.dropout, "dropout rate");
  o.add_string("pooling", &c.pooling,
               "mean: mean of the last hidden states over the text; first: a <cls> token in front, classified");
  o.section("Training (AdamW, warmup + cosine, gradient clipping 1)");
  cf::apps::add_classifier_train_options(o, c.train);
  o.section("Attention");
  o.add_string_list("attentions", &c.attentions,
                    "comma-separated, from full, neural-clustering, lsh, routing, clustered, improved-clustered; "
                    "'all' for all six", /*distinct=*/true);
  o.add_int("k", &c.k, 0,
            "neural clustering: clusters k (0: the paper's rule, the square root of the longest sequence, "
            "rounded)");
  o.add_int("look_back", &c.look_back, 0,
            "neural clustering: blocks before its own each query block attends to (the paper's eq. 8)");
  o.add_number("mu", &c.mu, "weight of the clustering loss L1 (eq. 6)");
  o.add_number("nu", &c.nu, "weight of the centroid sorting loss L2 (eq. 11)");
  o.add_string("loss_form", &c.loss_form,
               "phi of L1 and L2: inner (the paper's inner product, unbounded below), cosine (normalised phi) or "
               "sphere (centroids on the unit sphere); see nn/attention/neural_clustering.h");
  o.add_int("lsh_bucket_size", &c.lsh_bucket_size, 1, "LSH: tokens per bucket");
  o.add_int("lsh_hashes", &c.lsh_hashes, 1, "LSH: hashing rounds");
  o.add_int("routing_clusters", &c.routing_clusters, 0,
            "routing: clusters (0: the square root of the longest sequence, as the Routing Transformer)");
  o.add_number("routing_weight", &c.routing_weight,
               "routing: weight of its commitment loss (the reference implementation's)");
  o.add_int("clusters", &c.clusters, 1, "clustered and improved clustered: clusters");
  o.add_int("topk", &c.topk, 1, "improved clustered: keys per cluster");
  o.section("Experiments");
  o.add_bool("ablation", &c.ablation,
             "true: also train neural clustering with (mu, nu) set to (0, 0), (0, nu) and (mu, 0) (Table 5)");
  o.add_int_list("k_sweep", &c.k_sweep, 1,
                 "also train neural clustering with each k in LIST (Table 4), e.g. 2,4,8,16,32", /*distinct=*/true);
  o.section("Runs");
  o.add_seeds(&c.seeds, "model initialisation, dropout, batch order, hashing");
  o.add_string("device", &c.device, "cpu | cuda[:N]: where the models train and run");
  cf::apps::add_distributed_option(o, &c.distributed);
  if (!o.parse(argc, argv)) return false;

  if (c.attentions.size() == 1 && c.attentions[0] == "all") c.attentions = kAttentions;
  for (const std::string& a : c.attentions) {
    bool known = false;
    for (const std::string& k : kAttentions) known = known || a == k;
    if (!known)
      throw UsageError("--attentions: unknown attention '" + a +
                       "' (expected all, or from full, neural-clustering, lsh, routing, clustered, "
                       "improved-clustered)");
  }
  cf::apps::check_topic_data_config(c.data);
  cf::apps::check_train_settings(c.train);
  cf::apps::check_cuda_graph_settings(c.train, c.device, c.distributed);
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (c.pooling != "mean" && c.pooling != "first")
    throw UsageError("--pooling must be mean or first, got '" + c.pooling + "'");
  c.data.cls_token = c.pooling == "first";
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + std::to_string(c.d_model) + ") must be divisible by --n-heads (" +
                     std::to_string(c.n_heads) + ")");
  if (c.mu < 0 || c.nu < 0) throw UsageError("--mu and --nu must be non-negative");
  if (c.loss_form != "inner" && c.loss_form != "cosine" && c.loss_form != "sphere")
    throw UsageError("--loss-form must be inner, cosine or sphere, got '" + c.loss_form + "'");
  if (c.routing_weight < 0) throw UsageError("--routing-weight must be non-negative");
  if ((c.ablation || !c.k_sweep.empty()) &&
      std::find(c.attentions.begin(), c.attentions.end(), "neural-clustering") == c.attentions.end())
    throw UsageError("--ablation and --k-sweep vary neural clustering attention: add it to --attentions");
  if (c.ablation && (c.mu == 0 || c.nu == 0))
    throw UsageError("--ablation switches L1 and L2 off in turn: --mu and --nu must be positive");
  return true;
}

// One trained model: an attention, and for neural clustering its k and loss weights.
struct Arm {
  std::string name;  // "full", "neural-clustering", "neural-clustering k=8", "neural-clustering L1=N L2=Y", ...
  std::string attention;
  json spec;  // the model config's "attention" object
  std::map<std::string, double> aux_weights;
  std::string file;  // checkpoint file stem
  int64_t k = 0;
  double mu = 0, nu = 0;
};

int64_t rounded_sqrt(int64_t n) { return std::max<int64_t>(1, std::llround(std::sqrt(double(n)))); }

Arm make_arm(const Config& c, const std::string& attention, int64_t max_tokens, int64_t k, double mu, double nu) {
  // A count of clusters or a bucket size past the N tokens of a text leaves the rest empty (or every token in
  // one) yet costs time and memory (routing with 1000 clusters or LSH buckets of 1000 slots on 32 tokens: 50-100x
  // slower steps, silently); refused as neural clustering's k is. The defaults stay valid on short texts (16
  // clusters, buckets of 32: small either way).
  const Config defaults;
  auto at_most_n = [&](const std::string& what, const char* flag, int64_t v, int64_t default_v) {
    if (v > max_tokens && v != default_v)
      throw cf::ValueError("[cf-textcls] " + attention + " with " + what + " = " + std::to_string(v) +
                           " exceeds the sequence length N = " + std::to_string(max_tokens) + " tokens; use " +
                           flag + " <= " + std::to_string(max_tokens));
  };
  Arm a;
  a.attention = attention;
  a.name = attention;
  a.file = attention;
  if (attention == "full") {
    a.spec = {{"type", "full"}};
  } else if (attention == "neural-clustering") {
    // Eqs. 8-10 split the N sorted tokens into k blocks of ceil(N / k): with k > N
    // all but N blocks are empty, yet each costs memory and time (issue 27: k =
    // 100000 on 32-token texts ran at 4 s/step in 3.5 GB).
    if (k > max_tokens)
      throw cf::ValueError("[cf-textcls] neural clustering with k = " + std::to_string(k) +
                           " clusters exceeds the sequence length N = " + std::to_string(max_tokens) +
                           " tokens: at most N blocks can hold a token; use --k (or --k-sweep) <= " +
                           std::to_string(max_tokens));
    a.k = k;
    a.mu = mu;
    a.nu = nu;
    a.spec = {{"type", "neural-clustering"}, {"clusters", k}, {"look_back", c.look_back}};
    a.aux_weights = {{cf::nn::kClusteringLossName, mu}, {cf::nn::kCentroidSortingLossName, nu}};
    a.file += "-k" + std::to_string(k) + "-mu" + (mu > 0 ? "Y" : "N") + "-nu" + (nu > 0 ? "Y" : "N");
    // The form matters only where a loss is weighted: the N/N model is the same
    // model (and checkpoint) whatever the form.
    if (c.loss_form != "inner" && (mu > 0 || nu > 0)) {
      a.spec["loss_form"] = c.loss_form;
      a.file += "-" + c.loss_form;
    }
  } else if (attention == "lsh") {
    at_most_n("a bucket size", "--lsh-bucket-size", c.lsh_bucket_size, defaults.lsh_bucket_size);
    a.spec = {{"type", "lsh"}, {"bucket_size", c.lsh_bucket_size}, {"n_hashes", c.lsh_hashes}};
  } else if (attention == "routing") {
    const int64_t clusters = c.routing_clusters > 0 ? c.routing_clusters : rounded_sqrt(max_tokens);
    at_most_n("clusters", "--routing-clusters", clusters, rounded_sqrt(max_tokens));
    a.spec = {{"type", "routing"}, {"n_clusters", clusters}};
    a.aux_weights = {{"routing_commitment", c.routing_weight}};
  } else {
    at_most_n("clusters", "--clusters", c.clusters, defaults.clusters);
    a.spec = {{"type", attention}, {"clusters", c.clusters}};
    if (attention == "improved-clustered") a.spec["topk"] = c.topk;  // (past N: every key, at no extra cost)
  }
  return a;
}

struct ArmResult {
  std::vector<double> accuracy, train_s, infer_s, peak_mib;
};

// Table 5's (mu, nu) pairs: N/N, N/Y, Y/N, Y/Y (Y/Y is the main table's model).
std::vector<std::pair<double, double>> ablation_pairs(const Config& cfg) {
  return {{0, 0}, {0, cfg.nu}, {cfg.mu, 0}, {cfg.mu, cfg.nu}};
}

// The models to train: the main table first, then the ablation and the k
// sweep; an arm equal to one already listed is trained once.
std::vector<Arm> plan_arms(const Config& cfg, int64_t max_tokens, int64_t k_default) {
  std::vector<Arm> arms;
  auto add_arm = [&](Arm a) {
    for (const Arm& b : arms)
      if (b.spec == a.spec && b.aux_weights == a.aux_weights) return;
    arms.push_back(std::move(a));
  };
  for (const std::string& a : cfg.attentions) add_arm(make_arm(cfg, a, max_tokens, k_default, cfg.mu, cfg.nu));
  if (cfg.ablation)
    for (auto [mu, nu] : ablation_pairs(cfg))
      add_arm(make_arm(cfg, "neural-clustering", max_tokens, k_default, mu, nu));
  for (int64_t k : cfg.k_sweep) add_arm(make_arm(cfg, "neural-clustering", max_tokens, k, cfg.mu, cfg.nu));
  return arms;
}

const Arm& find_arm(const std::vector<Arm>& arms, int64_t k, double mu, double nu) {
  for (const Arm& a : arms)
    if (a.attention == "neural-clustering" && a.k == k && a.mu == mu && a.nu == nu) return a;
  throw cf::ValueError("[cf-textcls] internal: no neural clustering run with k=" + std::to_string(k));
}

// One arm at one seed trained (or reused from its checkpoint) and tested: its
// "result" line, its numbers added to `results`.
void train_arm(const Config& cfg, cf::Device dev, const cf::apps::TopicData& data,
               const std::shared_ptr<cf::data::SequenceDataset>& train_ds, cf::data::DataLoader& val_loader,
               cf::data::DataLoader& test_loader, int64_t seed, const Arm& arm,
               std::map<std::string, ArmResult>& results) {
  const cf::apps::ClassifierTrainConfig& tc = cfg.train;
  json model_json = {{"vocab_size", data.vocab},
                     {"max_len", data.max_tokens},
                     {"pooling", cfg.pooling},
                     {"n_layers", cfg.n_layers},
                     {"num_classes", int64_t(data.topics.size())},
                     {"d_model", cfg.d_model},
                     {"n_heads", cfg.n_heads},
                     {"d_ff", cfg.d_ff},
                     {"dropout", cfg.dropout},
                     {"attention", arm.spec}};
  // The same seed gives every arm the same initial embeddings, feed-forward
  // layers and batch order: only the attention differs.
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)};
  auto mcfg = cf::models::TransformerConfig::from_json(nlohmann::json::parse(model_json.dump()));
  auto model = std::make_shared<cf::models::EncoderClassifier>(mcfg, gen);
  model->to(dev);

  cf::apps::TrainRun run;
  run.app = "cf-textcls";
  run.tags = {{"seed", seed}, {"run", arm.file}};
  json weights = json::object();
  for (auto& [k, w] : arm.aux_weights) weights[k] = w;
  run.signature = {{"model", model_json},         {"aux_weights", weights}, {"seed", seed},
                   {"steps", tc.steps},           {"batch_size", tc.batch_size}, {"lr", tc.lr},
                   {"weight_decay", tc.weight_decay}, {"warmup", tc.warmup},
                   {"data", cf::apps::topic_data_signature(cfg.data, data)}};
  if (tc.precision != "fp32") run.signature["precision"] = tc.precision;
  if (!tc.checkpoint_dir.empty())
    run.checkpoint = tc.checkpoint_dir + "/" + arm.file + "-seed" + std::to_string(seed) + ".safetensors";
  run.device = dev;
  const cf::apps::TrainResult tr =
      cf::apps::train_classifier(*model, tc, run, seed, arm.aux_weights, train_ds, val_loader);
  const cf::apps::EvalResult r = cf::apps::evaluate_classifier(*model, test_loader, uint64_t(seed) + 999, dev);

  ArmResult& res = results[arm.file];
  res.accuracy.push_back(r.accuracy);
  res.infer_s.push_back(r.time_s);
  json line = {{"event", "result"}, {"seed", seed}, {"run", arm.file}, {"attention", arm.attention},
               {"test_accuracy", r.accuracy}, {"inference_s", r.time_s}, {"trained", tr.trained}};
  if (tr.trained) {  // a reused checkpoint has no training time or memory
    res.train_s.push_back(tr.time_s);
    res.peak_mib.push_back(double(tr.peak_bytes) / (1024.0 * 1024.0));
    line["train_s"] = tr.time_s;
    line["train_peak_bytes"] = tr.peak_bytes;
  }
  if (arm.attention == "neural-clustering") {
    line["k"] = arm.k;
    line["mu"] = arm.mu;
    line["nu"] = arm.nu;
  }
  emit(line);
}

// The summary line (JSON) and the Markdown tables on stderr.
void summarise(const Config& cfg, const cf::apps::TopicData& data, const std::vector<Arm>& arms, int64_t k_default,
               std::map<std::string, ArmResult>& results, std::chrono::steady_clock::time_point t_start) {
  const cf::apps::ClassifierTrainConfig& tc = cfg.train;
  auto cell = [&](const Arm& a) {
    const ArmResult& r = results[a.file];
    Stats acc = stats_of(r.accuracy), tr = stats_of(r.train_s), inf = stats_of(r.infer_s), mem = stats_of(r.peak_mib);
    // A model reused from its checkpoint for every seed was not trained by this
    // run: no training time or memory (null, "–" in the tables), never a 0.
    return json{{"accuracy_mean", acc.mean},         {"accuracy_std", acc.std},
                {"accuracy", r.accuracy},            {"train_s_mean", mean_or_null(tr)},
                {"train_peak_mib_mean", mean_or_null(mem)}, {"inference_s_mean", mean_or_null(inf)}};
  };
  auto num = [](const json& c, const char* key, const char* format) {
    return c[key].is_null() ? std::string("–") : fmt(c[key].get<double>(), format);
  };
  const Arm* full = nullptr;
  for (const Arm& a : arms)
    if (a.attention == "full") full = &a;
  auto ratio = [&](const Arm& a, const char* key) -> std::string {
    if (!full) return "";
    const json b = cell(*full)[key], c = cell(a)[key];
    if (b.is_null() || c.is_null()) return "";
    const double base = b.get<double>(), v = c.get<double>();
    return v > 0 && base > 0 ? " (" + fmt(base / v, "%.2f") + "x)" : "";
  };
  const std::string seeds_note = std::to_string(cfg.seeds.size()) + " seed(s)";
  std::ostringstream md;
  json table = json::object();
  md << "\nTest accuracy (%, mean ± sample std over " << seeds_note << "), training time (s) and peak training "
     << "memory (MiB) of " << tc.steps << " steps, test-set inference time (s); (x): full attention's value "
     << "divided by this one\n\n| attention | accuracy | train time | peak memory | inference |\n|---|---|---|---|---|\n";
  for (const std::string& name : cfg.attentions) {
    const Arm& a = name == "neural-clustering" ? find_arm(arms, k_default, cfg.mu, cfg.nu) : *std::find_if(
        arms.begin(), arms.end(), [&](const Arm& x) { return x.attention == name; });
    json c = cell(a);
    table[name] = c;
    md << "| " << (name == "neural-clustering" ? "neural-clustering (k=" + std::to_string(k_default) + ")" : name)
       << " | " << fmt_pct(stats_of(results[a.file].accuracy)) << " | "
       << num(c, "train_s_mean", "%.1f") << ratio(a, "train_s_mean") << " | "
       << num(c, "train_peak_mib_mean", "%.1f") << ratio(a, "train_peak_mib_mean") << " | "
       << num(c, "inference_s_mean", "%.2f") << ratio(a, "inference_s_mean") << " |\n";
  }
  json ablation_json = json::object();
  if (cfg.ablation) {
    md << "\nL1/L2 ablation of neural clustering attention (k=" << k_default << "), test accuracy %, " << seeds_note
       << " (N: weight 0, Y: mu=" << cfg.mu << " / nu=" << cfg.nu << "; phi: " << cfg.loss_form << ")\n\n| L1/L2 | N/N | N/Y | Y/N | Y/Y |\n"
       << "|---|---|---|---|---|\n| accuracy |";
    for (auto [mu, nu] : ablation_pairs(cfg)) {
      const Arm& a = find_arm(arms, k_default, mu, nu);
      const std::string key = std::string(mu > 0 ? "Y" : "N") + "/" + (nu > 0 ? "Y" : "N");
      ablation_json[key] = cell(a);
      md << " " << fmt_pct(stats_of(results[a.file].accuracy)) << " |";
    }
    md << "\n";
  }
  json sweep_json = json::object();
  if (!cfg.k_sweep.empty()) {
    md << "\nNumber of clusters k of neural clustering attention: test accuracy %, training time s and peak "
       << "training memory MiB, " << seeds_note << "; (x): full attention's value divided by this one\n\n"
       << "| model | accuracy | train time | peak memory |\n|---|---|---|---|\n";
    if (full) {
      json c = cell(*full);
      md << "| full | " << fmt_pct(stats_of(results[full->file].accuracy)) << " | "
         << num(c, "train_s_mean", "%.1f") << " | " << num(c, "train_peak_mib_mean", "%.1f") << " |\n";
    }
    for (int64_t k : cfg.k_sweep) {
      const Arm& a = find_arm(arms, k, cfg.mu, cfg.nu);
      json c = cell(a);
      sweep_json[std::to_string(k)] = c;
      md << "| k=" << k << " | " << fmt_pct(stats_of(results[a.file].accuracy)) << " | "
         << num(c, "train_s_mean", "%.1f") << ratio(a, "train_s_mean") << " | "
         << num(c, "train_peak_mib_mean", "%.1f") << ratio(a, "train_peak_mib_mean") << " |\n";
    }
  }
  emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"classes", data.topics.size()},
        {"test_size", data.test.ids.size()}, {"mean_len", data.mean_len}, {"k", k_default}, {"table", table},
        {"ablation", ablation_json}, {"k_sweep", sweep_json}, {"total_time_s", seconds_since(t_start)}});
  if (cf::dist::is_main()) std::cerr << md.str() << std::flush;  // (every rank printed it)
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  const cf::apps::TopicData data = cf::apps::load_topic_data(cfg.data, "cf-textcls");
  const cf::apps::ClassifierTrainConfig& tc = cfg.train;
  const int64_t k_default = cfg.k > 0 ? cfg.k : rounded_sqrt(data.max_tokens);
  const std::vector<Arm> arms = plan_arms(cfg, data.max_tokens, k_default);

  std::vector<std::string> names;
  for (const Arm& a : arms) names.push_back(a.file);
  emit({{"event", "start"}, {"app", "cf-textcls"}, {"device", dev.str()}, {"seeds", cfg.seeds},
        {"attentions", cfg.attentions}, {"k", k_default}, {"loss_form", cfg.loss_form}, {"runs", names},
        {"steps", tc.steps}, {"machine", cf::apps::machine_record()}});
  emit(cf::apps::topic_data_event(cfg.data, data));

  cf::apps::TopicLoaders loaders(data, tc.eval_batch_size);
  if (!tc.checkpoint_dir.empty()) cf::apps::make_dir(tc.checkpoint_dir, "cf-textcls", "--checkpoint-dir");

  std::map<std::string, ArmResult> results;  // by Arm::file
  for (int64_t seed : cfg.seeds)
    for (const Arm& arm : arms) train_arm(cfg, dev, data, loaders.train, loaders.val, loaders.test, seed, arm, results);
  summarise(cfg, data, arms, k_default, results, t_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-textcls",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::start_device(cfg.device, cfg.distributed);
        // (checked here, a usage error, before the data and models: it surfaced in the first step)
        if (cfg.distributed) cf::apps::rank_share(cfg.train.batch_size, "--batch-size");
        return true;
      },
      [&] { return run(cfg, dev); });
}
