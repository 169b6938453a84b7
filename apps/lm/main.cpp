// cf-lm: character-level language modelling on the fortunes corpus, the
// Cluster-Former paper's language-modelling experiment (Wang et al. 2021,
// section 4.4, Table 5) at this machine's scale: a stack of sliding-window
// layers alone, with LSH attention in the middle layers (the paper's LSH row),
// with Cluster-Former layers (#C clusters from a memory bank, Algorithm 1), and
// ClusterFormer's masked neural clustering attention (ACL 2022, appendix B) over
// the whole sequence; bits per character on held-out fortunes. Then the
// generated long-range retrieval task: a key stated early must be copied at
// the end, beyond the reach of the sliding windows.
//
// One JSON line per event on stdout, a final JSON summary, the tables in
// Markdown on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/data_digest.h"
#include "common/distributed.h"
#include "common/options.h"
#include "common/report.h"
#include "common/topic_classification.h"
#include "common/train_run.h"
#include "models/cluster_former.h"
#include "models/transformer.h"
#include "nn/attention/neural_clustering.h"
#include "nn/data/fortunes.h"
#include "nn/data/tokenizer.h"

using json = nlohmann::ordered_json;
using cf::apps::emit;
using cf::apps::fmt;
using cf::apps::seconds_since;
using cf::apps::Stats;
using cf::apps::stats_of;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-lm [options]

Character-level language modelling on the fortunes corpus (Debian package
'fortunes'): the Cluster-Former paper's Table 5 at this machine's scale. Every
model has the same layers, width and training; they differ in how tokens see
far-away tokens:
  sliding-window       every layer attends within windows of --window tokens,
                       stride --stride, overlapping outputs averaged (section 3.1)
  sliding-window+lsh   the layers in --cluster-layers run LSH attention
                       (Reformer) over the whole sequence instead, with
                       --lsh-buckets hash buckets (the paper's LSH row)
  sliding-window+sparse
                       those layers run fixed sparse attention (Child et al.
                       2019) over the whole sequence: blocks of
                       --sparse-block tokens, each token seeing its block and
                       the last --sparse-summary tokens of every block (the
                       paper's Sparse Attention row)
  cluster-former-C     those layers are Cluster-Former layers with C clusters
                       (one model per C in --clusters; section 3.2, Algorithm 1:
                       centroids from a memory bank, recomputed every
                       --update-every steps)
  neural-clustering    ClusterFormer (ACL 2022): masked neural clustering
                       attention (appendix B) in every layer, whole sequence
                       (named neural-clustering-cosine or -sphere under
                       --loss-form cosine or sphere)
Reported: bits per character (cross-entropy / ln 2) on held-out fortunes,
training time and peak memory. The test windows are scored twice: in one pass
over each window (test_bpc, the papers' way) and character by character from
each prefix alone (test_bpc_prefix, --prefix-eval): the LSH, Cluster-Former
and neural clustering layers sort or cluster the whole window, so in one pass
a later character can change which earlier keys a position reads. Then the long-range retrieval task (generated):
a sequence [v, #, fillers..., #] whose last '#' must predict the key v stated
--retrieval-len - 7 positions before (the key is at position 6), beyond the 21
positions the sliding layers' windows reach;
accuracy on 512 fresh sequences (chance 25%).

Output: one JSON line per event on stdout (start, data, train, val, result,
retrieval), a final {"event": "summary", ...} line; the tables in Markdown on
stderr.
)";
const char* kExitStatus = R"(--checkpoint-dir saves each trained LM; the retrieval models are not saved.

Exit status: 0 done, 1 failure (no fortunes, bad checkpoint, ...), 2 bad command line,
3 stopped by --stop-after.
)";

struct Config {
  std::string data_dir = cf::data::kFortunesDir;
  double val_fraction = 0.05, test_fraction = 0.05;
  int64_t split_seed = 0, seq_len = 256, eval_windows = 64, batch_size = 16;
  std::vector<std::string> models = {"all"};
  int64_t n_layers = 4, d_model = 64, n_heads = 4, d_ff = 128;
  double dropout = 0.1;
  int64_t window = 32, stride = 16;
  std::vector<int64_t> cluster_layers = {2}, clusters = {64, 256};
  int64_t memory_size = 20000, update_every = 50, kmeans_iters = 10, lsh_buckets = 16, lsh_hashes = 2, k = 0;
  int64_t sparse_block = 0, sparse_summary = 0;
  double mu = 1e-3, nu = 1e-3;
  std::string loss_form = "inner";
  cf::apps::TrainSettings train;
  bool lm = true, retrieval = true, prefix_eval = true, keep_duplicates = false;
  int64_t retrieval_len = 64, retrieval_steps = 400;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
  bool distributed = false;
};

constexpr int64_t kRetrievalMemory = 4096;  // the retrieval models' memory bank (retrieval_config)

bool parse(int argc, char** argv, Config& c) {
  c.train.lr = 2e-3;
  cf::apps::Options o(kUsage, kExitStatus);
  o.section("Data");
  o.add_string("data_dir", &c.data_dir, "fortune files");
  o.add_number("val_fraction", &c.val_fraction, "fortunes held out for validation");
  o.add_number("test_fraction", &c.test_fraction, "fortunes held out for the test");
  o.add_int("split_seed", &c.split_seed, 0, "the fixed split");
  o.add_bool("keep_duplicates", &c.keep_duplicates,
             "keep every copy of a fortune filed more than once (86 copies in the Debian files): by default one "
             "copy is kept, so no held-out fortune is also training text (runs before this option kept them)");
  o.add_int("seq_len", &c.seq_len, 2, "characters per training window");
  o.add_int("eval_windows", &c.eval_windows, 1,
            "validation/test windows of --seq-len, spread over the held-out text");
  o.add_int("batch_size", &c.batch_size, 1, "training windows per step");
  o.add_bool("prefix_eval", &c.prefix_eval,
             "also score the test windows strictly left to right, each character from a pass over its prefix "
             "alone (test_bpc_prefix; seq-len passes per batch of windows): the LSH, Cluster-Former and neural "
             "clustering models sort or cluster the whole window, so a later character can change which earlier "
             "keys a position reads, and their test_bpc is the papers' one-pass score, not a strict likelihood");
  o.section("Models");
  o.add_string_list("models", &c.models,
                    "from sliding-window, sliding-window+lsh, sliding-window+sparse, cluster-former, neural-clustering, or "
                    "all", /*distinct=*/true);
  o.add_int("n_layers", &c.n_layers, 1, "layers");
  o.add_int("d_model", &c.d_model, 1, "model width");
  o.add_int("n_heads", &c.n_heads, 1, "attention heads");
  o.add_int("d_ff", &c.d_ff, 1, "feed-forward width");
  o.add_number("dropout", &c.dropout, "dropout rate");
  o.add_int("window", &c.window, 2, "sliding window l");
  o.add_int("stride", &c.stride, 1, "stride m < l, also the Cluster-Former chunk size");
  o.add_int_list("cluster_layers", &c.cluster_layers, 0, "0-based layers that cluster (or run LSH)",
                 /*distinct=*/true);
  o.add_int_list("clusters", &c.clusters, 1, "Cluster-Former cluster counts, one model each", /*distinct=*/true);
  o.add_int("memory_size", &c.memory_size, 1, "memory bank capacity in vectors");
  o.add_int("update_every", &c.update_every, 1, "recompute the centroids every N steps");
  o.add_int("kmeans_iters", &c.kmeans_iters, 1, "K-Means iterations per recomputation");
  o.add_int("lsh_buckets", &c.lsh_buckets, 1, "LSH hash buckets");
  o.add_int("lsh_hashes", &c.lsh_hashes, 1, "LSH hashing rounds");
  o.add_int("sparse_block", &c.sparse_block, 0, "sparse attention block l (0: --stride)");
  o.add_int("sparse_summary", &c.sparse_summary, 0,
            "sparse attention summary positions c per block, 1 <= c <= l (0: max(1, l / 4))");
  o.add_int("k", &c.k, 0, "neural clustering clusters (0: round(sqrt(seq-len)))");
  o.add_number("mu", &c.mu, "weight of the neural clustering loss L1");
  o.add_number("nu", &c.nu, "weight of the neural clustering loss L2");
  o.add_string("loss_form", &c.loss_form,
               "neural clustering: phi of L1 and L2, inner (the paper's inner product, unbounded below), cosine "
               "(normalised phi) or sphere (centroids on the unit sphere); a form other than inner is part of the "
               "model's name (neural-clustering-cosine); see nn/attention/neural_clustering.h");
  o.section("Training (AdamW, warmup + cosine, gradient clipping 1)");
  cf::apps::add_train_options(o, c.train);
  o.section("Parts");
  o.add_bool("lm", &c.lm, "the language models");
  o.add_bool("retrieval", &c.retrieval, "the long-range retrieval task");
  // At least 29: the key, 7 positions from the start, is then 22 positions before the query,
  // beyond the windows' 21 (from 16, a sliding-window model alone reached it: 100% at length 16).
  o.add_int("retrieval_len", &c.retrieval_len, 29,
            "retrieval task: sequence length, at least 29 (the key is len - 7 positions before the query); the "
            "models there have 3 layers (d_model 32, 2 heads), windows l = "
            "8, stride m = 4 (21 positions of reach), layer 1 clustering, a memory bank of 4096 vectors updated "
            "every 5 steps, sparse blocks of 4 with 1 summary position");
  o.add_int("retrieval_steps", &c.retrieval_steps, 1, "retrieval task: training steps per model");
  o.section("Runs");
  o.add_seeds(&c.seeds);
  o.add_string("device", &c.device,
               "cpu | cuda[:N]: where the models train and run (the Cluster-Former memory bank and its K-Means "
               "included)");
  cf::apps::add_distributed_option(o, &c.distributed);
  if (!o.parse(argc, argv)) return false;

  const std::vector<std::string> known = {"sliding-window", "sliding-window+lsh", "sliding-window+sparse",
                                          "cluster-former", "neural-clustering"};
  if (c.models.size() == 1 && c.models[0] == "all") c.models = known;
  for (const std::string& m : c.models)
    if (std::find(known.begin(), known.end(), m) == known.end())
      throw UsageError("--models: unknown model '" + m +
                       "' (expected all, or from sliding-window, sliding-window+lsh, sliding-window+sparse, "
                       "cluster-former, neural-clustering)");
  const int64_t block = c.sparse_block > 0 ? c.sparse_block : c.stride;
  if (c.sparse_summary > block)
    throw UsageError("--sparse-summary (" + std::to_string(c.sparse_summary) + ") must be at most the block of " +
                     std::to_string(block) + " tokens (--sparse-block, or --stride when 0)");
  if (c.val_fraction <= 0 || c.test_fraction <= 0 || c.val_fraction + c.test_fraction >= 0.5)
    throw UsageError("--val-fraction and --test-fraction must be positive and sum to less than 0.5");
  if (c.stride >= c.window)
    throw UsageError("--stride (" + std::to_string(c.stride) + ") must be less than --window (" +
                     std::to_string(c.window) + ")");
  if (c.lm && c.window > c.seq_len)  // (a window longer than the sequence made every model full attention)
    throw UsageError("--window (" + std::to_string(c.window) + ") must be at most --seq-len (" +
                     std::to_string(c.seq_len) + ")");
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + std::to_string(c.d_model) + ") must be divisible by --n-heads (" +
                     std::to_string(c.n_heads) + ")");
  for (int64_t l : c.cluster_layers)
    if (l >= c.n_layers)
      throw UsageError("--cluster-layers: layer " + std::to_string(l) + " out of range [0, " +
                       std::to_string(c.n_layers) + ")");
  if (c.cluster_layers.empty()) throw UsageError("--cluster-layers must name at least one layer");
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (!c.lm && !c.retrieval) throw UsageError("--lm false and --retrieval false leave nothing to run");
  if (c.mu < 0 || c.nu < 0) throw UsageError("--mu and --nu must be non-negative");
  if (c.loss_form != "inner" && c.loss_form != "cosine" && c.loss_form != "sphere")
    throw UsageError("--loss-form must be inner, cosine or sphere, got '" + c.loss_form + "'");
  // Settings the models would refuse only when built, after the models before them had trained
  // (minutes on the default run): checked here, naming the flag.
  auto runs = [&](const char* m) { return std::find(c.models.begin(), c.models.end(), m) != c.models.end(); };
  if (runs("sliding-window+lsh") && c.lsh_buckets > 1 && c.lsh_buckets % 2 != 0)
    throw UsageError("--lsh-buckets must be 1 (no hashing) or even (argmax over [xR; -xR]), got " +
                     std::to_string(c.lsh_buckets));
  if (runs("cluster-former") && c.clusters.empty())  // (it ran nothing and reported success)
    throw UsageError("--clusters must list at least one cluster count when --models has cluster-former");
  if (runs("cluster-former"))
    for (int64_t k : c.clusters) {
      if (c.lm && k > c.memory_size)
        throw UsageError("--clusters: " + std::to_string(k) + " clusters exceed the memory bank of --memory-size " +
                         std::to_string(c.memory_size) + " vectors");
      if (c.retrieval && k > kRetrievalMemory)
        throw UsageError("--clusters: " + std::to_string(k) + " clusters exceed the retrieval models' memory bank of " +
                         std::to_string(kRetrievalMemory) + " vectors");
    }
  if (runs("neural-clustering") && c.k > 0) {
    // Eqs. 8-10 split the N sorted tokens into k blocks: with k > N all but N blocks are empty, yet
    // each costs memory and time (as cf-textcls refuses, issue 27).
    const int64_t n = c.lm && c.retrieval ? std::min(c.seq_len, c.retrieval_len) : c.lm ? c.seq_len : c.retrieval_len;
    if (c.k > n)
      throw UsageError("--k (" + std::to_string(c.k) + " clusters) exceeds the sequence length N = " +
                       std::to_string(n) + " (--seq-len, or --retrieval-len for the retrieval task)");
  }
  cf::apps::check_train_settings(c.train);
  return true;
}

// ---------------------------------------------------------------- data

struct Corpus {
  std::vector<int64_t> train, val, test;  // token streams
  int64_t vocab = 0;
  size_t fortunes = 0;
  size_t duplicates_dropped = 0;
};

// The fortunes (each text once, unless --keep-duplicates), shuffled with the split
// seed, held out by fortune (not by position, so no text is split between train and
// test, and no held-out text is also training text), each split one stream with the
// fortunes separated by a newline.
Corpus load_corpus(const Config& c) {
  std::vector<cf::data::Fortune> all = cf::data::read_fortunes(c.data_dir);
  if (all.size() < 20)
    throw cf::ValueError("[cf-lm] '" + c.data_dir + "' holds " + std::to_string(all.size()) +
                         " fortunes; at least 20 are needed");
  std::vector<std::string> texts;
  std::set<std::string> seen;
  size_t dropped = 0;
  for (auto& f : all) {
    if (!c.keep_duplicates && !seen.insert(f.text).second) {
      ++dropped;
      continue;
    }
    texts.push_back(f.text);
  }
  cf::apps::seeded_shuffle(texts, uint64_t(c.split_seed) * 1000003u + 17);
  const size_t n_test = std::max<size_t>(1, size_t(std::llround(double(texts.size()) * c.test_fraction)));
  const size_t n_val = std::max<size_t>(1, size_t(std::llround(double(texts.size()) * c.val_fraction)));
  std::vector<std::string> train(texts.begin() + long(n_test + n_val), texts.end());
  // The streams put "\n" between fortunes: it is a character of the training stream too (a corpus of
  // one-line fortunes had none, and every separator read as <unk>, the id of unseen test characters).
  train.push_back("\n");
  cf::data::Tokenizer tok = cf::data::Tokenizer::build_char(train);
  Corpus out;
  out.vocab = tok.vocab_size();
  out.fortunes = texts.size();
  out.duplicates_dropped = dropped;
  auto stream = [&](size_t from, size_t to, std::vector<int64_t>& s) {
    const std::vector<int64_t> nl = tok.encode("\n");
    for (size_t i = from; i < to; ++i) {
      std::vector<int64_t> ids = tok.encode(texts[i]);
      s.insert(s.end(), ids.begin(), ids.end());
      s.insert(s.end(), nl.begin(), nl.end());
    }
  };
  stream(0, n_test, out.test);
  stream(n_test, n_test + n_val, out.val);
  stream(n_test + n_val, texts.size(), out.train);
  if (int64_t(out.val.size()) <= c.seq_len || int64_t(out.test.size()) <= c.seq_len)
    throw cf::ValueError("[cf-lm] the held-out text (" + std::to_string(std::min(out.val.size(), out.test.size())) +
                         " characters) is shorter than one window of --seq-len " + std::to_string(c.seq_len));
  // bits_per_char spreads --eval-windows starts over the held-out text; asking for more windows than it
  // has starts would score fewer than asked (it clamped them silently).
  const int64_t starts = int64_t(std::min(out.val.size(), out.test.size())) - c.seq_len;
  if (c.lm && c.eval_windows > starts)
    throw cf::ValueError("[cf-lm] --eval-windows " + std::to_string(c.eval_windows) + " exceeds the " +
                         std::to_string(starts) + " windows of --seq-len " + std::to_string(c.seq_len) +
                         " the held-out text (" + std::to_string(std::min(out.val.size(), out.test.size())) +
                         " characters) has");
  return out;
}

// ---------------------------------------------------------------- models

// A language model of either family behind one interface.
struct LM {
  std::shared_ptr<cf::nn::Module> module;
  std::function<cf::Tensor(const cf::Tensor&, cf::nn::AuxLosses*)> forward;  // ids (B, N) -> logits (B, N, V)
  std::function<void()> after_step = [] {};
  std::map<std::string, double> aux_weights;
  json spec;  // what defines it (for checkpoint signatures)
};

// kind: sliding-window, sliding-window+lsh, sliding-window+sparse, cluster-former (with `clusters`),
// neural-clustering.
LM make_lm(const Config& c, const std::string& kind, int64_t clusters, int64_t vocab, int64_t max_len,
           const std::string& positional, cf::Generator& gen) {
  LM lm;
  if (kind == "neural-clustering") {
    // The Transformer models have no position-free form: sinusoidal positions
    // stand in for "none" (they do not extend any window's reach).
    const std::string pos = positional == "none" ? "sinusoidal" : positional;
    const int64_t k = c.k > 0 ? c.k : std::max<int64_t>(1, std::llround(std::sqrt(double(max_len))));
    json mj = {{"vocab_size", vocab}, {"max_len", max_len}, {"n_layers", c.n_layers}, {"d_model", c.d_model},
               {"n_heads", c.n_heads}, {"d_ff", c.d_ff},     {"dropout", c.dropout},   {"positional", pos},
               {"attention", {{"type", "neural-clustering"}, {"clusters", k}}}};
    // Only a bounded form is written, so the paper's (inner) models keep their checkpoint signatures.
    if (c.loss_form != "inner") mj["attention"]["loss_form"] = c.loss_form;
    auto m = std::make_shared<cf::models::CausalLM>(
        cf::models::TransformerConfig::from_json(nlohmann::json::parse(mj.dump())), gen);
    lm.module = m;
    lm.forward = [m](const cf::Tensor& ids, cf::nn::AuxLosses* aux) { return m->forward(ids, {}, aux); };
    lm.aux_weights = {{cf::nn::kClusteringLossName, c.mu}, {cf::nn::kCentroidSortingLossName, c.nu}};
    lm.spec = mj;
    lm.spec["mu"] = c.mu;
    lm.spec["nu"] = c.nu;
    return lm;
  }
  json mj = {{"vocab_size", vocab}, {"max_len", max_len}, {"n_layers", c.n_layers}, {"d_model", c.d_model},
             {"n_heads", c.n_heads}, {"d_ff", c.d_ff},     {"dropout", c.dropout},   {"positional", positional},
             {"window", c.window},   {"stride", c.stride}};
  if (kind == "cluster-former") {
    mj["cluster_layers"] = c.cluster_layers;
    mj["cluster_attention"] = {{"num_clusters", clusters}, {"memory_size", c.memory_size},
                               {"update_every", c.update_every}, {"kmeans_iters", c.kmeans_iters}};
  } else if (kind == "sliding-window+lsh") {
    mj["cluster_layers"] = c.cluster_layers;
    mj["cluster_attention"] = {{"type", "lsh"}, {"n_buckets", c.lsh_buckets}, {"n_hashes", c.lsh_hashes},
                               {"bucket_size", c.stride}};
  } else if (kind == "sliding-window+sparse") {
    // Blocks of the chunk size m by default: the summary cells carry each chunk's information to the others,
    // as the paper's Sparse Attention layer runs across the sliding-window chunks.
    const int64_t block = c.sparse_block > 0 ? c.sparse_block : c.stride;
    mj["cluster_layers"] = c.cluster_layers;
    mj["cluster_attention"] = {{"type", "sparse"}, {"block_size", block},
                               {"summary", c.sparse_summary > 0 ? c.sparse_summary : std::max<int64_t>(1, block / 4)}};
  }
  auto m = std::make_shared<cf::models::ClusterFormerLM>(
      cf::models::ClusterFormerConfig::from_json(nlohmann::json::parse(mj.dump())), gen);
  lm.module = m;
  lm.forward = [m](const cf::Tensor& ids, cf::nn::AuxLosses* aux) { return m->forward(ids, {}, aux); };
  lm.after_step = [m] { m->on_train_step(); };
  lm.spec = mj;
  return lm;
}

std::string model_name(const Config& c, const std::string& kind, int64_t clusters) {
  if (kind == "cluster-former") return "cluster-former-" + std::to_string(clusters);
  if (kind == "neural-clustering" && c.loss_form != "inner") return kind + "-" + c.loss_form;
  return kind;
}

// Next-token cross-entropy of logits (B, N, V) against targets (B, N).
cf::Tensor lm_loss(const cf::Tensor& logits, const cf::Tensor& targets) {
  const int64_t b = logits.size(0), n = logits.size(1), v = logits.size(2);
  return cf::cross_entropy(cf::reshape(logits, {b * n, v}), cf::reshape(targets, {b * n}));
}

// Windows of n + 1 tokens starting at `starts`: inputs the first n, targets the last n.
void windows(const std::vector<int64_t>& stream, const std::vector<int64_t>& starts, int64_t n, cf::Device dev,
             cf::Tensor& ids, cf::Tensor& targets) {
  const int64_t b = int64_t(starts.size());
  std::vector<int64_t> x(size_t(b * n)), y(size_t(b * n));
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < n; ++j) {
      x[size_t(i * n + j)] = stream[size_t(starts[size_t(i)] + j)];
      y[size_t(i * n + j)] = stream[size_t(starts[size_t(i)] + j + 1)];
    }
  ids = cf::Tensor::from_vector(x, {b, n}).to(dev);
  targets = cf::Tensor::from_vector(y, {b, n}).to(dev);
}

// Bits per character over `count` windows spread evenly over the stream (every
// target of every window counted; the first characters of a window have less
// context, the same for every model).
//
// by_prefix: the same windows scored strictly left to right, the character at position t of a window
// predicted by a forward pass over the window's first t + 1 characters alone (n passes per batch of
// windows). Without it every prediction is read off one pass over the whole window, as the papers do; in
// the models whose layers sort or cluster the whole sequence (LSH, Cluster-Former, neural clustering:
// docs/design-notes.md, "causal masking") a later character can change which earlier keys a position
// reads, so that number is not a strict next-character likelihood and the prefix one is. The
// sliding-window and sparse models are strictly causal: the two agree to rounding (the app's smoke test
// checks).
double bits_per_char(LM& lm, const std::vector<int64_t>& stream, int64_t n, int64_t count, int64_t batch,
                     cf::Device dev, uint64_t draw_seed, bool by_prefix = false) {
  lm.module->eval();
  cf::NoGradGuard ng;
  const cf::nn::GeneratorState saved = cf::nn::GeneratorState::of(cf::default_generator());
  cf::manual_seed(draw_seed);  // LSH hyperplanes: the same draws in every evaluation
  const int64_t last = int64_t(stream.size()) - n - 1;
  count = std::min<int64_t>(count, last + 1);
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(count == 1 ? 0 : i * last / (count - 1));
  double nats = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < starts.size(); i += size_t(batch)) {
    std::vector<int64_t> part(starts.begin() + long(i), starts.begin() + long(std::min(starts.size(), i + size_t(batch))));
    cf::Tensor ids, targets;
    windows(stream, part, n, dev, ids, targets);
    const int64_t b = int64_t(part.size());
    if (!by_prefix) {
      nats += lm_loss(lm.forward(ids, nullptr), targets).item() * double(b * n);
    } else {
      for (int64_t t = 1; t <= n; ++t) {
        cf::manual_seed(draw_seed);  // LSH hyperplanes: the same draws for every prefix
        cf::Tensor logits = cf::narrow(lm.forward(cf::narrow(ids, 1, 0, t), nullptr), 1, t - 1, 1);
        nats += lm_loss(logits, cf::narrow(targets, 1, t - 1, 1)).item() * double(b);
      }
    }
    tokens += b * n;
  }
  saved.restore(cf::default_generator());
  lm.module->train();
  return nats / double(tokens) / std::log(2.0);
}

// ---------------------------------------------------------------- retrieval task

// The retrieval models: the same kinds, small, with windows too short to reach
// the key: 3 layers of windows l = 8, stride m = 4 see at most 3 * 7 = 21
// positions back; the key is --retrieval-len - 7 positions before the query (>= 22).
Config retrieval_config(const Config& c) {
  Config r = c;
  r.n_layers = 3;
  r.d_model = 32;
  r.n_heads = 2;
  r.d_ff = 64;
  r.dropout = 0.0;
  r.window = 8;
  r.stride = 4;
  r.cluster_layers = {1};
  r.sparse_block = 0;  // blocks of the stride, 4, with one summary position
  r.sparse_summary = 0;
  r.memory_size = kRetrievalMemory;
  r.update_every = 5;
  r.train.lr = 3e-3;
  r.train.weight_decay = 0.0;
  r.train.steps = c.retrieval_steps;
  r.train.warmup = std::min<int64_t>(c.train.warmup, c.retrieval_steps - 1);
  r.train.checkpoint_dir.clear();  // not saved, so --stop-after does not apply to them
  r.train.stop_after = 0;
  r.train.eval_every = 0;
  return r;
}

// Tokens: 0 pad, 1 '#', 2..5 the key values, 6..13 fillers. A sequence is
// [f, .., v, #, f, ..., f, #]: v at position kKeyAt - 1, '#' after it and at the
// end, where the model must predict v (chance 1/4).
constexpr int64_t kKeyAt = 7, kHash = 1, kValues = 4, kFirstFiller = 6, kFillers = 8, kRetrievalVocab = 14;

void retrieval_batch(cf::Generator& g, int64_t b, int64_t n, cf::Tensor& ids, cf::Tensor& targets,
                     std::vector<int64_t>& answers) {
  std::vector<int64_t> v = cf::randint(0, kValues, {b}, g).to_vector<int64_t>();
  std::vector<int64_t> f = cf::randint(0, kFillers, {b, n}, g).to_vector<int64_t>();
  std::vector<int64_t> x(size_t(b * n)), t(size_t(b * n), -100);
  answers.clear();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < n; ++j) x[size_t(i * n + j)] = kFirstFiller + f[size_t(i * n + j)];
    x[size_t(i * n + kKeyAt - 1)] = 2 + v[size_t(i)];
    x[size_t(i * n + kKeyAt)] = kHash;
    x[size_t(i * n + n - 1)] = kHash;
    t[size_t(i * n + n - 1)] = 2 + v[size_t(i)];
    answers.push_back(2 + v[size_t(i)]);
  }
  ids = cf::Tensor::from_vector(x, {b, n});
  targets = cf::Tensor::from_vector(t, {b, n});
}

// Per model name, one entry per seed.
struct Results {
  std::map<std::string, std::vector<double>> val_bpc, test_bpc, test_bpc_prefix, train_s, peak_mib, retrieval_acc;
};

// One language model trained (or reused from its checkpoint) and evaluated:
// its "result" line.
// What the signature knows of the corpus beyond its folder: a digest of the token streams and the vocabulary
// size (an edited fortune file must not resume a run trained on the old text).
std::string corpus_digest(const Corpus& c) {
  cf::apps::DataDigest d;
  d.values(std::vector<int64_t>{c.vocab});
  return d.values(c.train).values(c.val).values(c.test).hex();
}

void train_lm(const Config& cfg, cf::Device dev, const Corpus& corpus, int64_t seed, const std::string& kind,
              int64_t clusters, Results& res) {
  const std::string name = model_name(cfg, kind, clusters);
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)}, data_gen{uint64_t(seed) * 7919u + 1};
  LM lm = make_lm(cfg, kind, clusters, corpus.vocab, cfg.seq_len, "sinusoidal", gen);
  lm.module->to(dev);

  cf::apps::TrainRun run;
  run.app = "cf-lm";
  run.tags = {{"seed", seed}, {"model", name}};
  run.signature = {{"model", lm.spec}, {"seed", seed}, {"train", cf::apps::train_signature(cfg.train)},
                   {"batch_size", cfg.batch_size}, {"seq_len", cfg.seq_len},
                   {"data", {{"dir", cfg.data_dir}, {"val_fraction", cfg.val_fraction},
                             {"test_fraction", cfg.test_fraction}, {"split_seed", cfg.split_seed},
                             {"contents", corpus_digest(corpus)}}}};
  if (!cfg.train.checkpoint_dir.empty())
    run.checkpoint = cfg.train.checkpoint_dir + "/" + name + "-seed" + std::to_string(seed) + ".safetensors";
  run.device = dev;
  run.metric_name = "val_bpc";
  run.metric_mode = "min";
  run.generators = {{"data", &data_gen}};
  cf::apps::TrainHooks hooks;
  const int64_t max_start = int64_t(corpus.train.size()) - cfg.seq_len - 1;
  hooks.loss = [&](int64_t, cf::Tensor* task_loss) {
    std::vector<int64_t> starts = cf::randint(0, max_start + 1, {cfg.batch_size}, data_gen).to_vector<int64_t>();
    if (cf::apps::distributed()) {  // this rank's share of the global batch (every rank draws it all)
      auto [lo, hi] = cf::apps::rank_share(cfg.batch_size, "--batch-size");
      starts = std::vector<int64_t>(starts.begin() + lo, starts.begin() + hi);
    }
    cf::Tensor ids, targets;
    windows(corpus.train, starts, cfg.seq_len, dev, ids, targets);
    cf::nn::AuxLosses aux;
    cf::Tensor task = lm_loss(lm.forward(ids, &aux), targets);
    *task_loss = task;
    return cf::apps::total_loss(task, aux, lm.aux_weights);
  };
  hooks.evaluate = [&] {
    return bits_per_char(lm, corpus.val, cfg.seq_len, cfg.eval_windows, cfg.batch_size, dev, uint64_t(seed) + 777);
  };
  hooks.after_step = [&](int64_t) { lm.after_step(); };
  const cf::apps::TrainResult tr = cf::apps::train_model(*lm.module, cfg.train, run, hooks);
  const uint64_t draw = uint64_t(seed) + 999;
  const double vb = bits_per_char(lm, corpus.val, cfg.seq_len, cfg.eval_windows, cfg.batch_size, dev, draw);
  const double tb = bits_per_char(lm, corpus.test, cfg.seq_len, cfg.eval_windows, cfg.batch_size, dev, draw);
  res.val_bpc[name].push_back(vb);
  res.test_bpc[name].push_back(tb);
  json line = {{"event", "result"}, {"seed", seed}, {"model", name}, {"val_bpc", vb}, {"test_bpc", tb}};
  if (cfg.prefix_eval) {
    const double pb =
        bits_per_char(lm, corpus.test, cfg.seq_len, cfg.eval_windows, cfg.batch_size, dev, draw, /*by_prefix=*/true);
    res.test_bpc_prefix[name].push_back(pb);
    line["test_bpc_prefix"] = pb;
  }
  line["trained"] = tr.trained;
  if (tr.trained) {
    res.train_s[name].push_back(tr.time_s);
    res.peak_mib[name].push_back(double(tr.peak_bytes) / (1024.0 * 1024.0));
    line["train_s"] = tr.time_s;
    line["train_peak_bytes"] = tr.peak_bytes;
  }
  emit(line);
}

// One retrieval model trained from scratch on generated sequences: its
// accuracy on 512 fresh ones.
void train_retrieval(const Config& cfg, cf::Device dev, int64_t seed, const std::string& kind, int64_t clusters,
                     Results& res) {
  const std::string name = model_name(cfg, kind, clusters);
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)}, data_gen{uint64_t(seed) * 7919u + 2};
  const Config rc = retrieval_config(cfg);
  LM lm = make_lm(rc, kind, clusters, kRetrievalVocab, cfg.retrieval_len, "none", gen);
  lm.module->to(dev);
  cf::apps::TrainRun run;
  run.app = "cf-lm";
  run.tags = {{"seed", seed}, {"task", "retrieval"}, {"model", name}};
  run.device = dev;
  cf::apps::TrainHooks hooks;
  std::vector<int64_t> answers;
  hooks.loss = [&](int64_t, cf::Tensor* task_loss) {
    cf::Tensor ids, targets;
    retrieval_batch(data_gen, cfg.batch_size, cfg.retrieval_len, ids, targets, answers);
    if (cf::apps::distributed()) {
      auto [lo, hi] = cf::apps::rank_share(cfg.batch_size, "--batch-size");
      ids = cf::narrow(ids, 0, lo, hi - lo);
      targets = cf::narrow(targets, 0, lo, hi - lo);
    }
    cf::nn::AuxLosses aux;
    cf::Tensor task = lm_loss(lm.forward(ids.to(dev), &aux), targets.to(dev));
    *task_loss = task;
    return cf::apps::total_loss(task, aux, lm.aux_weights);
  };
  hooks.after_step = [&](int64_t) { lm.after_step(); };
  cf::apps::train_model(*lm.module, rc.train, run, hooks);
  lm.module->eval();
  cf::NoGradGuard ng;
  cf::Generator test_gen{uint64_t(seed) + 4242};
  int64_t correct = 0;
  const int64_t total = 512, b = 64;
  for (int64_t i = 0; i < total; i += b) {
    cf::Tensor ids, targets;
    retrieval_batch(test_gen, b, cfg.retrieval_len, ids, targets, answers);
    cf::Tensor last = cf::narrow(lm.forward(ids.to(dev), nullptr), 1, cfg.retrieval_len - 1, 1);
    std::vector<int64_t> pred = cf::argmax(cf::reshape(last, {b, kRetrievalVocab}), 1).to_vector<int64_t>();
    for (int64_t j = 0; j < b; ++j) correct += pred[size_t(j)] == answers[size_t(j)];
  }
  const double acc = double(correct) / double(total);
  res.retrieval_acc[name].push_back(acc);
  emit({{"event", "retrieval"}, {"seed", seed}, {"model", name}, {"accuracy", acc}});
}

// The final summary line (JSON) and the Markdown tables on stderr.
void summarise(const Config& cfg, const std::vector<std::string>& names, Results& res,
               std::chrono::steady_clock::time_point t_start) {
  json table = json::object(), retrieval = json::object();
  std::ostringstream md;
  if (cfg.lm) md << "\nCharacter-level LM on fortunes: bits per character (mean ± sample std over " << cfg.seeds.size()
     << " seed(s)), training time (s) and peak training memory (MiB) of " << cfg.train.steps << " steps\n\n"
     << "| model | val bpc | test bpc |" << (cfg.prefix_eval ? " test bpc, by prefixes |" : "")
     << " train time | peak memory |\n|---|---|---|" << (cfg.prefix_eval ? "---|" : "") << "---|---|\n";
  for (const std::string& name : (cfg.lm ? names : std::vector<std::string>{})) {
    table[name] = {{"val_bpc_mean", stats_of(res.val_bpc[name]).mean}, {"test_bpc_mean", stats_of(res.test_bpc[name]).mean},
                   {"test_bpc_std", stats_of(res.test_bpc[name]).std}, {"test_bpc", res.test_bpc[name]},
                   {"test_bpc_prefix_mean", mean_or_null(stats_of(res.test_bpc_prefix[name]))},
                   {"test_bpc_prefix", res.test_bpc_prefix[name]},
                   // a model reused from its checkpoint measured no training: null and "–", not 0
                   {"train_s_mean", mean_or_null(stats_of(res.train_s[name]))},
                   {"train_peak_mib_mean", mean_or_null(stats_of(res.peak_mib[name]))}};
    md << "| " << name << " | " << fmt_stats(stats_of(res.val_bpc[name]), "%.3f") << " | "
       << fmt_stats(stats_of(res.test_bpc[name]), "%.3f")
       << (cfg.prefix_eval ? " | " + fmt_stats(stats_of(res.test_bpc_prefix[name]), "%.3f") : std::string())
       << " | " << fmt_mean_or_dash(stats_of(res.train_s[name]), "%.1f") << " | "
       << fmt_mean_or_dash(stats_of(res.peak_mib[name]), "%.1f")
       << " |\n";
  }
  if (cfg.retrieval) {
    md << "\nLong-range retrieval (generated; sequence length " << cfg.retrieval_len << ", key at position "
       << kKeyAt - 1 << "; chance 25%): accuracy % on 512 fresh sequences\n\n| model | accuracy |\n|---|---|\n";
    for (const std::string& name : names) {
      Stats s = stats_of(res.retrieval_acc[name]);
      retrieval[name] = {{"accuracy_mean", s.mean}, {"accuracy_std", s.std}, {"accuracy", res.retrieval_acc[name]}};
      md << "| " << name << " | " << cf::apps::fmt_pct(s) << " |\n";
    }
  }
  emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"table", table}, {"retrieval", retrieval},
        {"total_time_s", seconds_since(t_start)}});
  if (cf::dist::is_main()) std::cerr << md.str() << std::flush;  // (every rank printed it)
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  // The fortunes feed the language models only: --lm false (the retrieval task alone) reads none.
  const Corpus corpus = cfg.lm ? load_corpus(cfg) : Corpus{};
  // The models: one per kind, cluster-former once per cluster count.
  std::vector<std::pair<std::string, int64_t>> runs;
  for (const std::string& m : cfg.models) {
    if (m == "cluster-former")
      for (int64_t c : cfg.clusters) runs.emplace_back(m, c);
    else
      runs.emplace_back(m, 0);
  }
  std::vector<std::string> names;
  for (auto& [kind, c] : runs) names.push_back(model_name(cfg, kind, c));
  emit({{"event", "start"}, {"app", "cf-lm"}, {"device", dev.str()}, {"seeds", cfg.seeds}, {"models", names},
        {"steps", cfg.train.steps}, {"seq_len", cfg.seq_len}, {"machine", cf::apps::machine_record()}});
  if (cfg.lm)
    emit({{"event", "data"}, {"dir", cfg.data_dir}, {"fortunes", corpus.fortunes}, {"vocab", corpus.vocab},
          {"train_chars", corpus.train.size()}, {"val_chars", corpus.val.size()},
          {"test_chars", corpus.test.size()}, {"split_seed", cfg.split_seed},
          {"duplicates_dropped", corpus.duplicates_dropped}});
  if (!cfg.train.checkpoint_dir.empty()) cf::apps::make_dir(cfg.train.checkpoint_dir, "cf-lm", "--checkpoint-dir");

  Results res;
  for (int64_t seed : cfg.seeds) {
    if (cfg.lm)
      for (auto& [kind, clusters] : runs) train_lm(cfg, dev, corpus, seed, kind, clusters, res);
    // The retrieval task: the same kinds of model, small, no positions (the key
    // must be found by content), trained from scratch on generated sequences.
    if (cfg.retrieval)
      for (auto& [kind, clusters] : runs) train_retrieval(cfg, dev, seed, kind, clusters, res);
  }
  summarise(cfg, names, res, t_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-lm",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::start_device(cfg.device, cfg.distributed);
        // (checked here, a usage error, before the data and models: it surfaced in the first step)
        if (cfg.distributed) cf::apps::rank_share(cfg.batch_size, "--batch-size");
        return true;
      },
      [&] { return run(cfg, dev); });
}
