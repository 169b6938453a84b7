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
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "cf.h"
#include "common/cli.h"
#include "models/attention_switch.h"
#include "nn/attention/multi_head.h"
#include "nn/checkpoint.h"
#include "nn/data/fortunes.h"
#include "nn/data/loader.h"
#include "nn/data/tokenizer.h"

using json = nlohmann::ordered_json;
using cf::apps::UsageError;

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
with. Then the speed/accuracy trade-off: accuracy, agreement and inference time
of each trained model with clustered and improved-clustered attention for each
number of clusters in --sweep-clusters. Texts are characters (one token per code
point), so sequences are long enough for clustering to approximate.

Output: one JSON line per event on stdout (start, data, train, val, eval,
sweep), a final {"event": "summary", ...} line with mean and spread over the
seeds; the same tables in Markdown on stderr.

Data:
  --data-dir DIR        fortune files (default /usr/share/games/fortunes)
  --min-texts N         topics with at least N texts (after --min-chars) (default 500)
  --max-per-class N     at most N texts per topic, drawn with --split-seed (default 500)
  --min-chars N         drop texts shorter than N characters (default 64)
  --max-len N           truncate texts to N characters (default 128)
  --val-fraction X      per topic (default 0.1)
  --test-fraction X     per topic (default 0.2)
  --split-seed N        the fixed split (default 0)
Model (pre-LN encoder, sinusoidal positions):
  --d-model N (64) --n-heads N (4) --n-layers N (2) --d-ff N (128) --dropout X (0.1)
  --pooling P           first: a <cls> token put before each text, whose last
                        hidden state is classified, so the prediction rests on
                        one query's attention (as the paper's per-frame
                        outputs do); mean: the mean over the text, which
                        averages attention errors away (default first)
Training (AdamW, warmup + cosine, gradient clipping 1):
  --steps N             optimizer steps per model (default 300)
  --batch-size N        (default 32)
  --lr X                peak learning rate (default 3e-3)
  --weight-decay X      (default 0.01)
  --warmup N            (default 30)
  --eval-every N        validation accuracy every N steps, 0 = only at the end (default 100)
  --log-every N         a train line every N steps (default 25)
  --eval-batch-size N   (default 64)
Attention:
  --train LIST          attentions to train with, comma-separated, from full,
                        clustered, improved-clustered (default all three)
  --clusters C          clusters of the trained clustered models (default 16: the
                        paper's 100 clusters for ~780 frames, scaled to 128 characters)
  --eval-clusters LIST  cluster counts evaluated in the table (default C,2C)
  --topk K              improved clustered and oracle-top keys (default 8: the
                        paper's 32 of ~780, scaled likewise)
  --bits B              hash bits (default 63)
  --iterations L        Hamming K-Means iterations (default 10)
  --oracle-top B        true | false: evaluate oracle-top too (default true)
  --sweep-clusters LIST cluster counts of the trade-off sweep; empty: no sweep
                        (default 1,2,4,8,16,32,64; C=1 gives every query of a
                        text the same attention weights)
Runs:
  --seed N              one seed (model initialisation, dropout, batch order,
                        hashing); shorthand for --seeds N
  --seeds LIST          several seeds: the summary gives mean and spread (default 0)
  --checkpoint-dir DIR  save each trained model there
                        (<train>-C<C>-seed<S>.safetensors) and reuse it on the
                        next run with the same settings: a finished model is
                        not retrained, an unfinished one resumes
  --checkpoint-every N  also checkpoint every N steps (default 0: at the end only)
  --device D            cpu (cuda once the CUDA backend exists)
  --config FILE         JSON object with any of the options above, '-' as '_'
                        (lists as arrays: {"seeds": [0, 1, 2], "train": ["full"]});
                        the command line wins; unknown keys are errors
  -h, --help            this text

Exit status: 0 done, 1 failure (no fortunes, bad checkpoint, ...), 2 bad command line.
)";

struct Config {
  std::string data_dir = cf::data::kFortunesDir;
  int64_t min_texts = 500, max_per_class = 500, min_chars = 64, max_len = 128;
  double val_fraction = 0.1, test_fraction = 0.2;
  int64_t split_seed = 0;
  int64_t d_model = 64, n_heads = 4, n_layers = 2, d_ff = 128;
  double dropout = 0.1;
  std::string pooling = "first";
  int64_t steps = 300, batch_size = 32, warmup = 30, eval_every = 100, log_every = 25, eval_batch_size = 64;
  double lr = 3e-3, weight_decay = 0.01;
  std::vector<std::string> train = {"full", "clustered", "improved-clustered"};
  int64_t clusters = 16, topk = 8, bits = 63, iterations = 10;
  std::vector<int64_t> eval_clusters;  // empty: {C, 2C}
  bool oracle_top = true;
  std::vector<int64_t> sweep_clusters = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> seeds = {0};
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  std::string device = "cpu";
};

void set_key(Config& c, const std::string& key, const json& v) {
  auto need_str = [&] {
    if (!v.is_string()) throw UsageError("config key '" + key + "' must be a string");
    return v.get<std::string>();
  };
  auto need_int = [&](int64_t min_value) {
    if (!v.is_number_integer()) throw UsageError("config key '" + key + "' must be an integer");
    int64_t x = v.get<int64_t>();
    if (x < min_value)
      throw UsageError("config key '" + key + "' must be at least " + std::to_string(min_value) + ", got " +
                       std::to_string(x));
    return x;
  };
  auto need_num = [&] {
    if (!v.is_number()) throw UsageError("config key '" + key + "' must be a number");
    double x = v.get<double>();
    if (!std::isfinite(x)) throw UsageError("config key '" + key + "' must be finite");
    return x;
  };
  auto need_int_list = [&](int64_t min_value) {
    if (!v.is_array()) throw UsageError("config key '" + key + "' must be an array of integers");
    std::vector<int64_t> out;
    for (const json& x : v) {
      if (!x.is_number_integer()) throw UsageError("config key '" + key + "' must be an array of integers");
      int64_t i = x.get<int64_t>();
      if (i < min_value)
        throw UsageError("config key '" + key + "': every entry must be at least " + std::to_string(min_value) +
                         ", got " + std::to_string(i));
      out.push_back(i);
    }
    return out;
  };
  if (key == "data_dir") c.data_dir = need_str();
  else if (key == "min_texts") c.min_texts = need_int(2);
  else if (key == "max_per_class") c.max_per_class = need_int(2);
  else if (key == "min_chars") c.min_chars = need_int(1);
  else if (key == "max_len") c.max_len = need_int(1);
  else if (key == "val_fraction") c.val_fraction = need_num();
  else if (key == "test_fraction") c.test_fraction = need_num();
  else if (key == "split_seed") c.split_seed = need_int(0);
  else if (key == "d_model") c.d_model = need_int(1);
  else if (key == "n_heads") c.n_heads = need_int(1);
  else if (key == "n_layers") c.n_layers = need_int(1);
  else if (key == "d_ff") c.d_ff = need_int(1);
  else if (key == "dropout") c.dropout = need_num();
  else if (key == "pooling") c.pooling = need_str();
  else if (key == "steps") c.steps = need_int(1);
  else if (key == "batch_size") c.batch_size = need_int(1);
  else if (key == "warmup") c.warmup = need_int(0);
  else if (key == "eval_every") c.eval_every = need_int(0);
  else if (key == "log_every") c.log_every = need_int(0);
  else if (key == "eval_batch_size") c.eval_batch_size = need_int(1);
  else if (key == "lr") c.lr = need_num();
  else if (key == "weight_decay") c.weight_decay = need_num();
  else if (key == "clusters") c.clusters = need_int(1);
  else if (key == "topk") c.topk = need_int(1);
  else if (key == "bits") c.bits = need_int(1);
  else if (key == "iterations") c.iterations = need_int(1);
  else if (key == "eval_clusters") c.eval_clusters = need_int_list(1);
  else if (key == "sweep_clusters") c.sweep_clusters = need_int_list(1);
  else if (key == "seeds") {
    c.seeds = need_int_list(0);
    if (c.seeds.empty()) throw UsageError("config key 'seeds' must list at least one seed");
  } else if (key == "seed") c.seeds = {need_int(0)};
  else if (key == "oracle_top") {
    if (!v.is_boolean()) throw UsageError("config key 'oracle_top' must be true or false");
    c.oracle_top = v.get<bool>();
  } else if (key == "train") {
    if (!v.is_array() || v.empty()) throw UsageError("config key 'train' must be a non-empty array of attention names");
    c.train.clear();
    for (const json& x : v) {
      if (!x.is_string()) throw UsageError("config key 'train' must be an array of attention names");
      c.train.push_back(x.get<std::string>());
    }
  } else if (key == "checkpoint_dir") c.checkpoint_dir = need_str();
  else if (key == "checkpoint_every") c.checkpoint_every = need_int(0);
  else if (key == "device") c.device = need_str();
  else throw UsageError("unknown config key '" + key + "'");
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

Config parse(int argc, char** argv, bool& help) {
  Config c;
  cf::apps::ArgReader args(argc, argv, 1);
  json cli = json::object();
  std::string config_file;
  const std::vector<std::string> strings = {"--data-dir", "--checkpoint-dir", "--device", "--pooling"};
  const std::vector<std::string> ints = {"--min-texts", "--max-per-class", "--min-chars", "--max-len",
                                         "--split-seed", "--d-model", "--n-heads", "--n-layers", "--d-ff",
                                         "--steps", "--batch-size", "--warmup", "--eval-every", "--log-every",
                                         "--eval-batch-size", "--clusters", "--topk", "--bits", "--iterations",
                                         "--seed", "--checkpoint-every"};
  const std::vector<std::string> numbers = {"--val-fraction", "--test-fraction", "--dropout", "--lr",
                                            "--weight-decay"};
  const std::vector<std::string> int_lists = {"--eval-clusters", "--sweep-clusters", "--seeds"};
  auto key_of = [](std::string opt) {
    opt = opt.substr(2);
    for (char& ch : opt)
      if (ch == '-') ch = '_';
    return opt;
  };
  auto in = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  while (!args.done()) {
    std::string opt = args.next();
    if (opt == "-h" || opt == "--help") {
      args.no_value(opt);
      help = true;
      return c;
    }
    if (opt == "--config") config_file = args.value(opt);
    else if (in(strings, opt)) cli[key_of(opt)] = args.value(opt);
    else if (in(ints, opt)) cli[key_of(opt)] = cf::apps::parse_int(opt, args.value(opt), 0);
    else if (in(numbers, opt)) cli[key_of(opt)] = cf::apps::parse_double(opt, args.value(opt));
    else if (in(int_lists, opt)) {
      std::string s = args.value(opt);
      cli[key_of(opt)] = s.empty() ? std::vector<int64_t>{} : cf::apps::parse_int_list(opt, s, 0);
    } else if (opt == "--train") {
      cli["train"] = split_commas(args.value(opt));
    } else if (opt == "--oracle-top") {
      std::string s = args.value(opt);
      if (s != "true" && s != "false") throw UsageError("--oracle-top must be true or false, got '" + s + "'");
      cli["oracle_top"] = s == "true";
    } else {
      throw UsageError("unknown option '" + opt + "'");
    }
  }
  if (!config_file.empty()) {
    std::ifstream f(config_file);
    if (!f) throw UsageError("cannot read config file '" + config_file + "'");
    json file;
    try {
      file = json::parse(f);
    } catch (const json::parse_error& e) {
      throw UsageError("config file '" + config_file + "' is not valid JSON: " + e.what());
    }
    if (!file.is_object()) throw UsageError("config file '" + config_file + "' must hold a JSON object");
    if (file.contains("seed") && file.contains("seeds"))
      throw UsageError("config file '" + config_file + "' sets both 'seed' and 'seeds'");
    for (auto& [k, v] : file.items()) set_key(c, k, v);
  }
  if (cli.contains("seed") && cli.contains("seeds")) throw UsageError("give --seed or --seeds, not both");
  for (auto& [k, v] : cli.items()) set_key(c, k, v);

  for (const std::string& t : c.train)
    if (t != "full" && t != "clustered" && t != "improved-clustered")
      throw UsageError("--train: unknown attention '" + t + "' (expected full, clustered or improved-clustered)");
  if (c.val_fraction <= 0 || c.test_fraction <= 0 || c.val_fraction + c.test_fraction >= 0.9)
    throw UsageError("--val-fraction and --test-fraction must be positive and sum to less than 0.9");
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (c.pooling != "mean" && c.pooling != "first")
    throw UsageError("--pooling must be mean or first, got '" + c.pooling + "'");
  if (!(c.lr > 0)) throw UsageError("--lr must be positive");
  if (c.weight_decay < 0) throw UsageError("--weight-decay must be non-negative");
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + std::to_string(c.d_model) + ") must be divisible by --n-heads (" +
                     std::to_string(c.n_heads) + ")");
  if (c.bits > 63) throw UsageError("--bits must be in [1, 63]");
  for (int64_t x : c.sweep_clusters)
    if (x < 1) throw UsageError("--sweep-clusters: every entry must be at least 1");
  for (int64_t x : c.eval_clusters)
    if (x < 1) throw UsageError("--eval-clusters: every entry must be at least 1");
  if (c.warmup >= c.steps)
    throw UsageError("--warmup (" + std::to_string(c.warmup) + ") must be less than --steps (" +
                     std::to_string(c.steps) + ")");
  if (c.eval_clusters.empty()) c.eval_clusters = {c.clusters, 2 * c.clusters};
  return c;
}

// ---------------------------------------------------------------- data

struct Split {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> labels;
};

struct Data {
  std::vector<std::string> topics;
  Split train, val, test;
  int64_t vocab = 0;
  double mean_len = 0;
  int64_t max_len_seen = 0;
};

// Fisher-Yates with a 64-bit Mersenne twister (its output is fixed by the standard;
// std::uniform_int_distribution is not, so the draw is done by hand).
template <class T>
void shuffle(std::vector<T>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(rng() % i)]);
}

Data load_data(const Config& c) {
  std::vector<cf::data::Fortune> all = cf::data::read_fortunes(c.data_dir);
  std::map<std::string, std::vector<std::string>> by_topic;
  for (auto& f : all) {
    if (int64_t(cf::data::utf8_code_points(f.text).size()) < c.min_chars) continue;
    by_topic[f.category].push_back(f.text);
  }
  Data d;
  std::vector<std::pair<std::string, std::vector<std::string>>> kept;
  for (auto& [topic, texts] : by_topic)
    if (int64_t(texts.size()) >= c.min_texts) kept.emplace_back(topic, texts);
  if (kept.size() < 2) {
    std::ostringstream m;
    m << "[cf-approx] only " << kept.size() << " topic(s) in '" << c.data_dir << "' have at least " << c.min_texts
      << " texts of at least " << c.min_chars << " characters; lower --min-texts or --min-chars";
    throw cf::ValueError(m.str());
  }
  std::vector<std::string> train_texts, val_texts, test_texts;
  std::vector<int64_t> train_y, val_y, test_y;
  for (size_t t = 0; t < kept.size(); ++t) {
    auto& texts = kept[t].second;
    d.topics.push_back(kept[t].first);
    shuffle(texts, uint64_t(c.split_seed) * 1000003u + t);
    if (int64_t(texts.size()) > c.max_per_class) texts.resize(size_t(c.max_per_class));
    const size_t n = texts.size();
    const size_t n_test = std::max<size_t>(1, size_t(std::llround(double(n) * c.test_fraction)));
    const size_t n_val = std::max<size_t>(1, size_t(std::llround(double(n) * c.val_fraction)));
    for (size_t i = 0; i < n; ++i) {
      if (i < n_test) test_texts.push_back(texts[i]), test_y.push_back(int64_t(t));
      else if (i < n_test + n_val) val_texts.push_back(texts[i]), val_y.push_back(int64_t(t));
      else train_texts.push_back(texts[i]), train_y.push_back(int64_t(t));
    }
  }
  cf::data::Tokenizer tok = cf::data::Tokenizer::build_char(train_texts);
  d.vocab = tok.vocab_size();
  int64_t total = 0, count = 0;
  auto encode = [&](const std::vector<std::string>& texts, const std::vector<int64_t>& y, Split& s) {
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int64_t> ids = tok.encode(texts[i]);
      if (int64_t(ids.size()) > c.max_len) ids.resize(size_t(c.max_len));
      if (c.pooling == "first") ids.insert(ids.begin(), cf::data::Tokenizer::kCls);
      total += int64_t(ids.size());
      ++count;
      d.max_len_seen = std::max<int64_t>(d.max_len_seen, int64_t(ids.size()));
      s.ids.push_back(std::move(ids));
      s.labels.push_back(y[i]);
    }
  };
  encode(train_texts, train_y, d.train);
  encode(val_texts, val_y, d.val);
  encode(test_texts, test_y, d.test);
  d.mean_len = count ? double(total) / double(count) : 0.0;
  return d;
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

json train_spec(const Config& c, const std::string& type) {
  if (type == "full") return json{{"type", "full"}};
  return clustered_spec(c, type == "improved-clustered", c.clusters);
}

std::string label_of(const json& spec) {
  const std::string t = spec["type"].get<std::string>();
  if (t == "full") return "full";
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

// Install an attention (a JSON spec, or oracle-top) in every self-attention layer.
void install(cf::nn::Module& model, const json& spec, int64_t topk) {
  if (spec["type"] == "oracle-top") {
    int64_t n = 0;
    for (auto& [name, m] : model.named_modules())
      if (auto* mha = dynamic_cast<cf::nn::MultiHeadAttention*>(m)) {
        mha->set_attention(std::make_shared<OracleTopAttention>(topk));
        ++n;
      }
    if (n == 0) throw cf::ValueError("[cf-approx] the model has no attention layer");
    return;
  }
  cf::models::set_attention(model, nlohmann::json::parse(spec.dump()));
}

// ---------------------------------------------------------------- training and evaluation

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct EvalResult {
  double accuracy = 0, time_s = 0;
  std::vector<int64_t> predictions;  // test-set order
};

// The fraction of texts on which two evaluations predict the same topic.
double agreement(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0;
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return double(same) / double(a.size());
}

EvalResult evaluate(cf::models::EncoderClassifier& model, cf::data::DataLoader& loader, uint64_t hash_seed) {
  model.eval();
  cf::NoGradGuard ng;
  // The hyperplanes of the clustered variants come from the global generator: the
  // same draws for every model, and the training stream is left as it was.
  const cf::nn::GeneratorState saved = cf::nn::GeneratorState::of(cf::default_generator());
  cf::manual_seed(hash_seed);
  loader.set_epoch(0);
  int64_t correct = 0, total = 0;
  EvalResult r;
  auto t0 = std::chrono::steady_clock::now();
  cf::data::Batch b;
  while (loader.next(b)) {
    cf::Tensor pred = cf::argmax(model.forward(b.input, b.key_padding_mask), -1);
    std::vector<int64_t> p = pred.to_vector<int64_t>(), y = b.target.to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
    total += int64_t(p.size());
    r.predictions.insert(r.predictions.end(), p.begin(), p.end());
  }
  r.time_s = seconds_since(t0);
  saved.restore(cf::default_generator());
  r.accuracy = total ? double(correct) / double(total) : 0.0;
  return r;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

void emit(const json& j) { std::cout << j.dump() << std::endl; }

struct Stats {
  double mean = 0, std = 0;
  int64_t n = 0;
};
Stats stats_of(const std::vector<double>& v) {
  Stats s;
  s.n = int64_t(v.size());
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

std::string fmt_pct(const Stats& s) {
  char buf[64];
  if (s.n > 1) std::snprintf(buf, sizeof buf, "%.1f ± %.1f", 100 * s.mean, 100 * s.std);
  else std::snprintf(buf, sizeof buf, "%.1f", 100 * s.mean);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool help = false;
  try {
    cfg = parse(argc, argv, help);
    if (!help) {
      cf::Device dev = cf::Device::parse(cfg.device);
      if (!dev.is_cpu() && !cf::cuda_built())
        throw UsageError("device '" + cfg.device + "' is not available: this cf was built without CUDA");
      if (!dev.is_cpu()) throw UsageError("cf-approx runs on the CPU only until the CUDA backend lands");
    }
  } catch (const UsageError& e) {
    std::cerr << "cf-approx: " << e.what() << "\n(run 'cf-approx --help' for usage)\n";
    return 2;
  } catch (const cf::Error& e) {
    std::cerr << "cf-approx: " << e.what() << "\n(run 'cf-approx --help' for usage)\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }

  try {
    const auto t_start = std::chrono::steady_clock::now();
    Data data = load_data(cfg);
    emit({{"event", "start"}, {"app", "cf-approx"}, {"device", cfg.device}, {"seeds", cfg.seeds},
          {"train", cfg.train}, {"clusters", cfg.clusters}, {"eval_clusters", cfg.eval_clusters},
          {"topk", cfg.topk}, {"sweep_clusters", cfg.sweep_clusters}, {"steps", cfg.steps}});
    emit({{"event", "data"}, {"dir", cfg.data_dir}, {"topics", data.topics}, {"classes", data.topics.size()},
          {"train", data.train.ids.size()}, {"val", data.val.ids.size()}, {"test", data.test.ids.size()},
          {"vocab", data.vocab}, {"mean_len", data.mean_len}, {"max_len", data.max_len_seen},
          {"split_seed", cfg.split_seed}});

    auto train_ds = std::make_shared<cf::data::SequenceDataset>(data.train.ids, data.train.labels);
    auto val_ds = std::make_shared<cf::data::SequenceDataset>(data.val.ids, data.val.labels);
    auto test_ds = std::make_shared<cf::data::SequenceDataset>(data.test.ids, data.test.labels);
    cf::data::DataLoaderOptions eo;
    eo.batch_size = cfg.eval_batch_size;
    cf::data::DataLoader val_loader(val_ds, eo), test_loader(test_ds, eo);

    // The evaluated attentions (rows of the table), in the paper's order.
    std::vector<json> eval_specs = {json{{"type", "full"}}};
    for (int64_t cl : cfg.eval_clusters) eval_specs.push_back(clustered_spec(cfg, false, cl));
    for (int64_t cl : cfg.eval_clusters) eval_specs.push_back(clustered_spec(cfg, true, cl));
    if (cfg.oracle_top) eval_specs.push_back(json{{"type", "oracle-top"}});
    auto row_label = [&](const json& s) {
      return s["type"] == "oracle-top" ? std::string("oracle-top") : label_of(s);
    };

    // results[train][eval] -> accuracies over seeds; times likewise.
    std::map<std::string, std::map<std::string, std::vector<double>>> acc, secs, agree;
    std::map<std::string, std::vector<double>> train_secs;
    // sweep[train][variant][C]
    std::map<std::string, std::map<std::string, std::map<int64_t, std::vector<double>>>> sweep_acc, sweep_secs,
        sweep_agree;
    std::vector<std::string> train_labels;
    for (const std::string& t : cfg.train) train_labels.push_back(label_of(train_spec(cfg, t)));

    if (!cfg.checkpoint_dir.empty()) {
      ::mkdir(cfg.checkpoint_dir.c_str(), 0777);
      if (!file_exists(cfg.checkpoint_dir))
        throw cf::IOError("[cf-approx] cannot create --checkpoint-dir '" + cfg.checkpoint_dir + "'");
    }

    for (int64_t seed : cfg.seeds) {
      for (size_t ti = 0; ti < cfg.train.size(); ++ti) {
        const std::string& tname = cfg.train[ti];
        const std::string tlabel = train_labels[ti];
        json model_json = {{"vocab_size", data.vocab},
                           {"max_len", cfg.max_len + 1},
                           {"pooling", cfg.pooling},
                           {"n_layers", cfg.n_layers},
                           {"num_classes", int64_t(data.topics.size())},
                           {"d_model", cfg.d_model},
                           {"n_heads", cfg.n_heads},
                           {"d_ff", cfg.d_ff},
                           {"dropout", cfg.dropout},
                           {"attention", train_spec(cfg, tname)}};
        cf::manual_seed(uint64_t(seed));
        cf::Generator gen{uint64_t(seed)};
        auto mcfg = cf::models::TransformerConfig::from_json(nlohmann::json::parse(model_json.dump()));
        auto model = std::make_shared<cf::models::EncoderClassifier>(mcfg, gen);
        cf::nn::AdamWOptions ao;
        ao.lr = cfg.lr;
        ao.weight_decay = cfg.weight_decay;
        cf::nn::AdamW opt(model->named_parameters(), ao);
        cf::nn::WarmupCosineLR schedule(cfg.lr, cfg.warmup, cfg.steps, cfg.lr * 0.05);
        cf::data::DataLoaderOptions to;
        to.batch_size = cfg.batch_size;
        to.shuffle = true;
        to.seed = uint64_t(seed);
        to.drop_last = true;
        to.prefetch = 2;
        cf::data::DataLoader train_loader(train_ds, to);

        // What a checkpoint must agree on to be reused: everything that shapes training.
        json signature = {{"model", model_json},
                          {"seed", seed},
                          {"steps", cfg.steps},
                          {"batch_size", cfg.batch_size},
                          {"lr", cfg.lr},
                          {"weight_decay", cfg.weight_decay},
                          {"warmup", cfg.warmup},
                          {"data", {{"dir", cfg.data_dir}, {"min_texts", cfg.min_texts},
                                    {"max_per_class", cfg.max_per_class}, {"min_chars", cfg.min_chars},
                                    {"max_len", cfg.max_len + 1},
                           {"pooling", cfg.pooling}, {"val_fraction", cfg.val_fraction},
                                    {"test_fraction", cfg.test_fraction}, {"split_seed", cfg.split_seed}}}};
        const std::string ckpt_path =
            cfg.checkpoint_dir.empty()
                ? std::string()
                : cfg.checkpoint_dir + "/" + tname + "-C" + std::to_string(cfg.clusters) + "-seed" +
                      std::to_string(seed) + ".safetensors";
        int64_t start_step = 0;
        if (!ckpt_path.empty() && file_exists(ckpt_path)) {
          cf::nn::TrainingCheckpoint ck = cf::nn::load_checkpoint(ckpt_path);
          auto it = ck.extra.find("signature");
          if (it == ck.extra.end() || it->second != signature.dump())
            throw cf::ValueError("[cf-approx] checkpoint '" + ckpt_path +
                                 "' was written with other settings (model, data or training options); "
                                 "delete it or use another --checkpoint-dir");
          model->load_state_dict(ck.model);
          opt.load_state_dict(ck.optimizer);
          for (auto& [name, g] : ck.generators)
            if (name == "default") g.restore(cf::default_generator());
          start_step = ck.step;
          const int64_t nb = train_loader.size();
          train_loader.set_state({start_step / nb, start_step % nb});
          emit({{"event", "resume"}, {"seed", seed}, {"train_attention", tlabel}, {"checkpoint", ckpt_path},
                {"step", start_step}});
        }
        auto save = [&](int64_t step) {
          cf::nn::TrainingCheckpoint ck;
          ck.model = model->state_dict();
          ck.optimizer = opt.state_dict();
          ck.step = step;
          ck.generators = {{"default", cf::nn::GeneratorState::of(cf::default_generator())}};
          ck.extra["signature"] = signature.dump();
          cf::nn::save_checkpoint(ckpt_path, ck);
        };

        double train_time = 0;
        if (start_step < cfg.steps) {
          cf::nn::TrainLoopOptions lo;
          lo.max_steps = cfg.steps;
          lo.start_step = start_step;
          lo.eval_every = cfg.eval_every;
          lo.clip_norm = 1.0;
          lo.metric_name = "accuracy";
          lo.metric_mode = "max";
          cf::nn::ProgressBarOptions po;
          po.total = cfg.steps;
          po.initial = start_step;
          po.desc = "train " + tlabel + " seed " + std::to_string(seed);
          po.unit = "step";
          cf::nn::ProgressBar bar(po);
          cf::nn::TrainLoopHooks hooks;
          hooks.model = model.get();
          hooks.schedule = &schedule;
          hooks.progress = &bar;
          hooks.evaluate = [&] {
            EvalResult r = evaluate(*model, val_loader, uint64_t(seed) + 777);
            return r.accuracy;
          };
          double loss_sum = 0;
          int64_t loss_n = 0;
          auto t_train = std::chrono::steady_clock::now();
          hooks.on_step_end = [&](const cf::nn::TrainStepInfo& info) {
            loss_sum += info.loss;
            ++loss_n;
            if (cfg.log_every > 0 && info.step % cfg.log_every == 0) {
              emit({{"event", "train"}, {"seed", seed}, {"train_attention", tlabel}, {"step", info.step},
                    {"loss", loss_sum / double(loss_n)}, {"lr", info.lr}, {"elapsed_s", seconds_since(t_train)}});
              loss_sum = 0;
              loss_n = 0;
            }
            if (info.evaluated)
              emit({{"event", "val"}, {"seed", seed}, {"train_attention", tlabel}, {"step", info.step},
                    {"accuracy", info.metric}});
            if (!ckpt_path.empty() &&
                ((cfg.checkpoint_every > 0 && info.step % cfg.checkpoint_every == 0) || info.step == cfg.steps))
              save(info.step);
          };
          cf::data::Batch b;
          auto step_loss = [&](int64_t, int64_t) {
            if (!train_loader.next(b) && !train_loader.next(b))
              throw cf::ValueError("[cf-approx] the training set is smaller than one batch");
            return cf::cross_entropy(model->forward(b.input, b.key_padding_mask), b.target);
          };
          cf::nn::train_loop(opt, step_loss, lo, hooks);
          train_time = seconds_since(t_train);
          train_loader.stop();
        }
        if (start_step < cfg.steps) train_secs[tlabel].push_back(train_time);  // not for a reused model

        // Evaluate with every attention (the trained projections stay). Agreement:
        // the fraction of test texts given the same topic as the model with the
        // attention it was trained with (a direct measure of the approximation,
        // which task accuracy blurs: pooling over a text averages attention errors).
        install(*model, train_spec(cfg, tname), cfg.topk);
        const std::vector<int64_t> native = evaluate(*model, test_loader, uint64_t(seed) + 999).predictions;
        for (const json& spec : eval_specs) {
          install(*model, spec, cfg.topk);
          EvalResult r = evaluate(*model, test_loader, uint64_t(seed) + 999);
          const std::string el = row_label(spec);
          const double ag = agreement(r.predictions, native);
          acc[tlabel][el].push_back(r.accuracy);
          secs[tlabel][el].push_back(r.time_s);
          agree[tlabel][el].push_back(ag);
          emit({{"event", "eval"}, {"seed", seed}, {"train_attention", tlabel}, {"eval_attention", el},
                {"test_accuracy", r.accuracy}, {"agreement", ag}, {"time_s", r.time_s}, {"same", el == tlabel}});
        }
        // Speed/accuracy trade-off: each number of clusters, both variants.
        for (int64_t cl : cfg.sweep_clusters) {
          for (bool improved : {false, true}) {
            json spec = clustered_spec(cfg, improved, cl);
            install(*model, spec, cfg.topk);
            EvalResult r = evaluate(*model, test_loader, uint64_t(seed) + 999);
            const std::string variant = improved ? "i-clustered" : "clustered";
            const double ag = agreement(r.predictions, native);
            sweep_acc[tlabel][variant][cl].push_back(r.accuracy);
            sweep_secs[tlabel][variant][cl].push_back(r.time_s);
            sweep_agree[tlabel][variant][cl].push_back(ag);
            emit({{"event", "sweep"}, {"seed", seed}, {"train_attention", tlabel}, {"eval_attention", variant},
                  {"clusters", cl}, {"test_accuracy", r.accuracy}, {"agreement", ag}, {"time_s", r.time_s}});
          }
        }
      }
    }

    // ---- summary: JSON and Markdown
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
          Stats s = stats_of(part == 0 ? acc[t][el] : agree[t][el]);
          if (part == 0) {
            Stats g = stats_of(agree[t][el]), ts = stats_of(secs[t][el]);
            table[t][el] = {{"accuracy_mean", s.mean}, {"accuracy_std", s.std}, {"accuracy", acc[t][el]},
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
         << cfg.seeds.size() << " seed(s)\n\n| trained with | evaluated with | full |";
      for (int64_t cl : cfg.sweep_clusters) md << " C=" << cl << " |";
      md << "\n|---|---|---|";
      for (size_t i = 0; i < cfg.sweep_clusters.size(); ++i) md << "---|";
      md << "\n";
      for (const std::string& t : train_labels) {
        for (const std::string variant : {"clustered", "i-clustered"}) {
          char buf[96];
          Stats fa = stats_of(acc[t]["full"]), fg = stats_of(agree[t]["full"]), ft = stats_of(secs[t]["full"]);
          std::snprintf(buf, sizeof buf, "%.1f / %.1f / %.2f", 100 * fa.mean, 100 * fg.mean, ft.mean);
          md << "| " << t << " | " << variant << " | " << buf << " |";
          for (int64_t cl : cfg.sweep_clusters) {
            Stats a = stats_of(sweep_acc[t][variant][cl]), g = stats_of(sweep_agree[t][variant][cl]),
                  s = stats_of(sweep_secs[t][variant][cl]);
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
    for (auto& [t, v] : train_secs) train_time[t] = stats_of(v).mean;  // models trained by this run only
    emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"classes", data.topics.size()},
          {"test_size", data.test.ids.size()}, {"mean_len", data.mean_len}, {"table", table}, {"sweep", sweep},
          {"train_time_s_mean", train_time}, {"total_time_s", seconds_since(t_start)},
          {"peak_bytes", cf::memory_stats().peak_bytes}});
    std::cerr << md.str() << std::flush;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "cf-approx: " << e.what() << "\n";
    return 1;
  }
}
