#pragma once
// Fortunes topic classification, shared by the apps that train encoder
// classifiers on it (cf-textcls, cf-approx): the data options and the fixed
// per-topic split, the training options, one classifier trained with
// checkpoints and resume (common/train_run.h), and its evaluation.
//
// Data: the Debian package 'fortunes', one topic per file; topics with at least
// --min-texts texts (of at least --min-chars characters), at most
// --max-per-class texts each, split per topic into train/val/test with
// --split-seed. Texts are characters (one token per code point, vocabulary from
// the training texts), cut at --max-len, with a <cls> token in front when the
// classifier reads the first token.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/data_digest.h"
#include "common/distributed.h"
#include "common/options.h"
#include "common/report.h"
#include "common/train_run.h"
#include "models/transformer.h"
#include "nn/checkpoint.h"
#include "nn/data/fortunes.h"
#include "nn/data/labelled_text.h"
#include "nn/data/loader.h"
#include "nn/data/tokenizer.h"

namespace cf::apps {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------- data

struct TopicDataConfig {
  std::string data_dir = cf::data::kFortunesDir;
  std::string data_file;  // labelled texts (nn/data/labelled_text.h) instead of the fortune files
  int64_t min_texts = 500, max_per_class = 500, min_chars = 64, max_len = 128;
  double val_fraction = 0.1, test_fraction = 0.2;
  int64_t split_seed = 0;
  bool keep_duplicates = false;
  bool cls_token = true;  // set by the app from its pooling, not an option
};

inline void add_topic_data_options(Options& o, TopicDataConfig& c) {
  o.add_string("data_dir", &c.data_dir, "fortune files, one topic per file");
  o.add_string("data_file", &c.data_file,
               "a corpus of labelled texts (label TAB text per line, see nn/data/labelled_text.h; e.g. the Bible "
               "chapters of scripts/bible_corpus.sh) instead of --data-dir");
  o.add_int("min_texts", &c.min_texts, 3, "topics with at least N texts (after --min-chars)");
  o.add_int("max_per_class", &c.max_per_class, 3, "at most N texts per topic, drawn with --split-seed");
  o.add_int("min_chars", &c.min_chars, 1, "drop texts shorter than N characters");
  o.add_int("max_len", &c.max_len, 1, "truncate texts to N characters");
  o.add_number("val_fraction", &c.val_fraction, "validation share, per topic");
  o.add_number("test_fraction", &c.test_fraction, "test share, per topic");
  o.add_int("split_seed", &c.split_seed, 0, "the fixed split");
  o.add_bool("keep_duplicates", &c.keep_duplicates,
             "keep texts the model would see twice (the same first --max-len characters): by default a repeat "
             "within a topic is dropped, and a text under two topics is dropped from both, so no test text is a "
             "training text, under another label or not (at the defaults 86 texts of cf-textcls's six fortune topics, "
             "113 of cf-approx's at 128 characters; runs before this option kept them)");
}

inline void check_topic_data_config(const TopicDataConfig& c) {
  // --data-file replaces the fortunes: a --data-dir beside it was dropped without a word.
  if (!c.data_file.empty() && c.data_dir != TopicDataConfig().data_dir)
    throw UsageError("--data-file and --data-dir name two corpora ('" + c.data_file + "' and '" + c.data_dir +
                     "'); give one");
  if (c.val_fraction <= 0 || c.test_fraction <= 0 || c.val_fraction + c.test_fraction >= 0.9)
    throw UsageError("--val-fraction and --test-fraction must be positive and sum to less than 0.9");
}

struct TopicSplit {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> labels;
};

struct TopicData {
  std::vector<std::string> topics;
  TopicSplit train, val, test;
  int64_t vocab = 0;
  int64_t max_tokens = 0;  // the longest sequence the model can see (max_len, +1 with <cls>)
  double mean_len = 0;     // tokens per text, <cls> included
  int64_t max_len_seen = 0;
  int64_t duplicates_dropped = 0;  // texts of the kept topics dropped as repeats or as ambiguous (under two topics)
};

// What a model reads of a text: its first max_len characters (code points).
inline std::string text_prefix(const std::string& text, int64_t max_len) {
  std::vector<std::string> cps = cf::data::utf8_code_points(text);
  if (int64_t(cps.size()) > max_len) cps.resize(size_t(max_len));
  std::string k;
  for (const std::string& cp : cps) k += cp;
  return k;
}

// Drops the texts a model would see twice: what it reads of a text is its first max_len characters (code
// points), so texts equal there are one text. A repeat within a topic is kept once; a text under several
// topics has no one label and is dropped from every one (a test copy of a training text with another label
// could never be scored right). Returns how many texts each topic lost.
inline std::map<std::string, int64_t> drop_duplicate_texts(std::map<std::string, std::vector<std::string>>& by_topic,
                                                           int64_t max_len) {
  auto key = [max_len](const std::string& text) { return text_prefix(text, max_len); };
  std::map<std::string, std::set<std::string>> topics_of;
  for (const auto& [topic, texts] : by_topic)
    for (const std::string& t : texts) topics_of[key(t)].insert(topic);
  std::map<std::string, int64_t> dropped;
  for (auto& [topic, texts] : by_topic) {
    std::set<std::string> seen;
    std::vector<std::string> kept;
    for (std::string& t : texts) {
      std::string k = key(t);
      if (topics_of[k].size() == 1 && seen.insert(std::move(k)).second) kept.push_back(std::move(t));
      else ++dropped[topic];
    }
    texts = std::move(kept);
  }
  return dropped;
}

// What a checkpoint must agree on about the data: the options, and a digest of what they loaded (the
// topics, the vocabulary size and every split's token ids and labels), so a file edited in place is not
// scored or resumed with a model trained on its old contents.
inline ojson topic_data_signature(const TopicDataConfig& c, const TopicData& data) {
  ojson out;
  if (!c.data_file.empty())
    out = {{"file", c.data_file},        {"min_texts", c.min_texts},         {"max_per_class", c.max_per_class},
            {"min_chars", c.min_chars},   {"max_len", c.max_len + (c.cls_token ? 1 : 0)},
            {"pooling", c.cls_token ? "first" : "mean"}, {"val_fraction", c.val_fraction},
            {"test_fraction", c.test_fraction}, {"split_seed", c.split_seed}};
  else
    out = {{"dir", c.data_dir},         {"min_texts", c.min_texts},         {"max_per_class", c.max_per_class},
           {"min_chars", c.min_chars},   {"max_len", c.max_len + (c.cls_token ? 1 : 0)},
           {"pooling", c.cls_token ? "first" : "mean"}, {"val_fraction", c.val_fraction},
           {"test_fraction", c.test_fraction}, {"split_seed", c.split_seed}};
  DataDigest d;
  for (const std::string& t : data.topics) d.text(t);
  d.values(std::vector<int64_t>{data.vocab, data.max_tokens});
  for (const TopicSplit* split : {&data.train, &data.val, &data.test}) {
    d.values(split->labels);
    for (const auto& ids : split->ids) d.values(ids);
  }
  out["contents"] = d.hex();
  return out;
}

// The splits as the apps use them: the training set (the training loop batches and shuffles it) and in-order
// loaders of eval_batch_size over the validation and test sets. Every evaluation batch is padded to the longest
// text of the data (max_len_seen), not to the longest of its batch: LSH and routing size their buckets and
// clusters from the padded length (neural clustering did too), so a text's prediction (and the reported
// accuracy) would change with --eval-batch-size and with which texts share its batch.
struct TopicLoaders {
  TopicLoaders(const TopicData& d, int64_t eval_batch_size)
      : train(std::make_shared<cf::data::SequenceDataset>(d.train.ids, d.train.labels)),
        val(std::make_shared<cf::data::SequenceDataset>(d.val.ids, d.val.labels),
            eval_options(eval_batch_size, d.max_len_seen)),
        test(std::make_shared<cf::data::SequenceDataset>(d.test.ids, d.test.labels),
             eval_options(eval_batch_size, d.max_len_seen)) {}
  std::shared_ptr<cf::data::SequenceDataset> train;
  cf::data::DataLoader val, test;

 private:
  static cf::data::DataLoaderOptions eval_options(int64_t batch_size, int64_t padded_len) {
    cf::data::DataLoaderOptions o;
    o.batch_size = batch_size;
    o.pad_to_multiple = std::max<int64_t>(1, padded_len);  // every text is at most this long
    return o;
  }
};

// Fisher-Yates with a 64-bit Mersenne twister (its output is fixed by the standard;
// std::uniform_int_distribution is not, so the draw is done by hand).
template <class T>
void seeded_shuffle(std::vector<T>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(rng() % i)]);
}

// The texts of the corpus by topic: the labelled-text file when given, else the
// fortune files (one topic per file).
inline std::map<std::string, std::vector<std::string>> read_topic_texts(const TopicDataConfig& c) {
  std::map<std::string, std::vector<std::string>> by_topic;
  auto keep = [&](const std::string& topic, std::string& text) {
    if (int64_t(cf::data::utf8_code_points(text).size()) >= c.min_chars) by_topic[topic].push_back(std::move(text));
  };
  if (!c.data_file.empty())
    for (cf::data::LabelledText& t : cf::data::read_labelled_texts(c.data_file)) keep(t.label, t.text);
  else
    for (cf::data::Fortune& f : cf::data::read_fortunes(c.data_dir)) keep(f.category, f.text);
  return by_topic;
}

inline TopicData load_topic_data(const TopicDataConfig& c, const std::string& app) {
  std::map<std::string, std::vector<std::string>> by_topic = read_topic_texts(c);
  TopicData d;
  std::map<std::string, int64_t> dropped;
  if (!c.keep_duplicates) dropped = drop_duplicate_texts(by_topic, c.max_len);
  std::vector<std::pair<std::string, std::vector<std::string>>> kept;
  for (auto& [topic, texts] : by_topic)
    if (int64_t(texts.size()) >= c.min_texts) {
      kept.emplace_back(topic, texts);
      d.duplicates_dropped += dropped[topic];  // (only the topics used count)
    }
  if (kept.size() < 2) {
    std::ostringstream m;
    m << "[" << app << "] only " << kept.size() << " topic(s) in '" << (c.data_file.empty() ? c.data_dir : c.data_file)
      << "' have at least "
      << c.min_texts << " texts of at least " << c.min_chars << " characters; lower --min-texts or --min-chars";
    throw cf::ValueError(m.str());
  }
  std::vector<std::string> train_texts, val_texts, test_texts;
  std::vector<int64_t> train_y, val_y, test_y;
  for (size_t t = 0; t < kept.size(); ++t) {
    auto& texts = kept[t].second;
    d.topics.push_back(kept[t].first);
    seeded_shuffle(texts, uint64_t(c.split_seed) * 1000003u + t);
    if (int64_t(texts.size()) > c.max_per_class) texts.resize(size_t(c.max_per_class));
    const size_t n = texts.size();
    const size_t n_test = std::max<size_t>(1, size_t(std::llround(double(n) * c.test_fraction)));
    const size_t n_val = std::max<size_t>(1, size_t(std::llround(double(n) * c.val_fraction)));
    // (a topic of 2 texts had 1 test, 1 validation and no training text: scored on a class never trained on)
    if (n_test + n_val >= n)
      throw cf::ValueError("topic '" + kept[t].first + "' keeps " + std::to_string(n) + " texts: " +
                           std::to_string(n_test) + " for the test and " + std::to_string(n_val) +
                           " for validation leave none to train on; raise --min-texts and --max-per-class, or "
                           "lower --test-fraction and --val-fraction");
    for (size_t i = 0; i < n; ++i) {
      if (i < n_test) test_texts.push_back(texts[i]), test_y.push_back(int64_t(t));
      else if (i < n_test + n_val) val_texts.push_back(texts[i]), val_y.push_back(int64_t(t));
      else train_texts.push_back(texts[i]), train_y.push_back(int64_t(t));
    }
  }
  // The vocabulary of what the model reads of the training texts: a character found only past --max-len
  // got an id whose embedding never trained, where a test text should read <unk>.
  std::vector<std::string> read_of_train;
  read_of_train.reserve(train_texts.size());
  for (const std::string& t : train_texts) read_of_train.push_back(text_prefix(t, c.max_len));
  cf::data::Tokenizer tok = cf::data::Tokenizer::build_char(read_of_train);
  d.vocab = tok.vocab_size();
  d.max_tokens = c.max_len + (c.cls_token ? 1 : 0);
  int64_t total = 0, count = 0;
  auto encode = [&](const std::vector<std::string>& texts, const std::vector<int64_t>& y, TopicSplit& s) {
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int64_t> ids = tok.encode(texts[i]);
      if (int64_t(ids.size()) > c.max_len) ids.resize(size_t(c.max_len));
      if (c.cls_token) ids.insert(ids.begin(), cf::data::Tokenizer::kCls);
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

inline ojson topic_data_event(const TopicDataConfig& c, const TopicData& d) {
  const bool file = !c.data_file.empty();
  return {{"event", "data"},         {file ? "file" : "dir", file ? c.data_file : c.data_dir},
          {"topics", d.topics},      {"classes", d.topics.size()},  {"train", d.train.ids.size()},
          {"val", d.val.ids.size()}, {"test", d.test.ids.size()},   {"vocab", d.vocab},
          {"mean_len", d.mean_len},  {"max_len", d.max_len_seen},   {"split_seed", c.split_seed},
          {"duplicates_dropped", d.duplicates_dropped}};
}

// ---------------------------------------------------------------- training

struct ClassifierTrainConfig : TrainSettings {
  int64_t batch_size = 32, eval_batch_size = 64;
};

inline void add_classifier_train_options(Options& o, ClassifierTrainConfig& c) {
  add_train_options(o, c);
  add_cuda_graph_option(o, c);
  o.add_int("batch_size", &c.batch_size, 1, "training batch size");
  o.add_int("eval_batch_size", &c.eval_batch_size, 1, "evaluation batch size");
}

struct EvalResult {
  double accuracy = 0, time_s = 0;
  std::vector<int64_t> predictions;  // in the loader's order
};

// Accuracy of `model` over one pass of `loader` (in eval mode, without gradients).
// Attentions that draw random numbers (hash hyperplanes) draw them from the
// global generator seeded with `draw_seed` before every batch: every batch of every
// evaluation sees the same draws (with the fixed padding of TopicLoaders, a text's
// prediction does not depend on its batch), and the training stream is left as it was.
inline EvalResult evaluate_classifier(cf::models::EncoderClassifier& model, cf::data::DataLoader& loader,
                                      uint64_t draw_seed, cf::Device dev) {
  model.eval();
  cf::NoGradGuard ng;
  const cf::nn::GeneratorState saved = cf::nn::GeneratorState::of(cf::default_generator());
  loader.set_epoch(0);
  int64_t correct = 0, total = 0;
  EvalResult r;
  auto t0 = std::chrono::steady_clock::now();
  cf::data::Batch b;
  while (loader.next(b)) {
    cf::manual_seed(draw_seed);
    cf::Tensor mask = b.key_padding_mask.defined() ? b.key_padding_mask.to(dev) : cf::Tensor();
    cf::Tensor pred = cf::argmax(model.forward(b.input.to(dev), mask), -1);
    std::vector<int64_t> p = pred.to_vector<int64_t>(), y = b.target.to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
    total += int64_t(p.size());
    r.predictions.insert(r.predictions.end(), p.begin(), p.end());
  }
  if (dev.is_cuda()) cf::cuda::synchronize();
  r.time_s = seconds_since(t0);
  saved.restore(cf::default_generator());
  r.accuracy = total ? double(correct) / double(total) : 0.0;
  return r;
}

// The fraction of items on which two evaluations predict the same class.
inline double agreement(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0;
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return double(same) / double(a.size());
}

// Trains an encoder classifier on `train_ds` (shuffled batches in the order of
// `seed`, the last partial batch dropped) with train_model; the validation
// metric is accuracy on `val_loader`; aux_weights weigh the auxiliary losses.
inline TrainResult train_classifier(cf::models::EncoderClassifier& model, const ClassifierTrainConfig& cfg,
                                    const TrainRun& run, int64_t seed,
                                    const std::map<std::string, double>& aux_weights,
                                    std::shared_ptr<cf::data::SequenceDataset> train_ds,
                                    cf::data::DataLoader& val_loader) {
  cf::data::DataLoaderOptions to;
  to.batch_size = cfg.batch_size;
  if (distributed()) {  // each rank its share of every global batch of --batch-size
    rank_share(cfg.batch_size, "--batch-size");
    to.batch_size = cfg.batch_size / cf::dist::world_size();
    to.num_replicas = cf::dist::world_size();
    to.rank = cf::dist::rank();
  }
  to.shuffle = true;
  to.seed = uint64_t(seed);
  to.drop_last = true;
  to.prefetch = 2;
  // --cuda-graph: every batch padded to the evaluation length (the longest text), so each step has the
  // captured step's shapes
  if (cfg.cuda_graph) to.pad_to_multiple = std::max<int64_t>(1, val_loader.options().pad_to_multiple);
  cf::data::DataLoader train_loader(train_ds, to);
  if (train_loader.size() == 0)
    throw cf::ValueError("[" + run.app + "] the training set (" + std::to_string(train_ds->size()) +
                         " texts) is smaller than one batch of " + std::to_string(cfg.batch_size));
  TrainHooks hooks;
  hooks.resumed = [&](int64_t start_step) {
    const int64_t nb = train_loader.size();
    train_loader.set_state({start_step / nb, start_step % nb});
  };
  hooks.evaluate = [&] { return evaluate_classifier(model, val_loader, uint64_t(seed) + 777, run.device).accuracy; };
  // The step's batch on the device: load writes it, loss reads it (with --cuda-graph into the same tensors
  // every step, which the replayed step reads).
  cf::data::Batch b;
  cf::Tensor input, mask, target;
  auto put = [&](cf::Tensor& dst, const cf::Tensor& src, const char* what) {
    cf::Tensor moved = src.to(run.device);
    if (!cfg.cuda_graph || !dst.defined()) {
      dst = moved;
      return;
    }
    if (moved.shape() != dst.shape())
      throw cf::ValueError("[" + run.app + "] --cuda-graph: a training batch's " + what + " is " + moved.describe() +
                           ", the captured step's " + dst.describe());
    cf::NoGradGuard ng;
    cf::copy_(dst, moved);
  };
  hooks.load = [&](int64_t) {
    if (!train_loader.next(b) && !train_loader.next(b))
      throw cf::ValueError("[" + run.app + "] the training loader delivered no batch");
    put(input, b.input, "input");
    put(target, b.target, "target");
    if (b.key_padding_mask.defined())
      put(mask, b.key_padding_mask, "padding mask");
    else
      mask = cf::Tensor();
  };
  hooks.loss = [&](int64_t, cf::Tensor* task_loss) {
    cf::nn::AuxLosses aux;
    cf::Tensor logits = model.forward(input, mask, &aux);
    cf::Tensor task = cf::cross_entropy(logits, target);
    *task_loss = task;
    return total_loss(task, aux, aux_weights);
  };
  TrainResult r = train_model(model, cfg, run, hooks);
  train_loader.stop();
  return r;
}

}  // namespace cf::apps
