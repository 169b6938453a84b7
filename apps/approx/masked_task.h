#pragma once
// cf-approx --task masked: the per-token form of the Table 1 protocol. The paper
// scores every frame of a speech recognizer (phone error rate); one label per
// text, as in the topic task, averages a query's attention error over the text.
// Here each masked character is a prediction of its own: the fortunes texts of
// a split (their first --max-len characters each) are joined into one character
// stream with a <sep> between texts, cut into windows of --seq-len,
// and a bidirectional encoder (models::TokenClassifier) predicts the characters
// hidden behind a <mask> token (--mask-rate of the positions, drawn afresh for
// every training window; a fixed draw for the test windows, so that every
// evaluation scores the same positions and agreement compares like with like).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cf.h"
#include "common/report.h"
#include "common/topic_classification.h"
#include "common/train_run.h"

namespace cf::apps {

struct MaskedTaskConfig {
  int64_t seq_len = 512;      // characters per window
  double mask_rate = 0.15;    // fraction of the positions hidden
  int64_t eval_windows = 64;  // test windows, spread evenly over the test stream
};

// A split's texts (what the model reads of each: its first --max-len characters) joined into one stream
// of character ids (no <cls>), a <sep> between two texts: without it a window glued one text's head to the
// next one's mid-word, and the model learned to predict across joins no text has.
inline std::vector<int64_t> join_texts(const TopicSplit& split) {
  std::vector<int64_t> stream;
  for (const std::vector<int64_t>& t : split.ids) {
    if (!stream.empty()) stream.push_back(cf::data::Tokenizer::kSep);
    stream.insert(stream.end(), t.begin(), t.end());
  }
  return stream;
}

// Windows of `n` ids starting at `starts`, with the positions where `hide` is
// true replaced by `mask_id`; targets: the hidden ids, -100 (ignored) elsewhere.
struct MaskedBatch {
  cf::Tensor ids, targets;
  int64_t hidden = 0;  // positions scored (a <sep> drawn is not hidden: it is no character)
};
inline MaskedBatch masked_windows(const std::vector<int64_t>& stream, const std::vector<int64_t>& starts, int64_t n,
                                  const std::vector<bool>& hide, int64_t mask_id, cf::Device dev) {
  const int64_t b = int64_t(starts.size());
  std::vector<int64_t> x(size_t(b * n)), y(size_t(b * n), -100);
  int64_t hidden = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = size_t(i * n + j);
      const int64_t id = stream[size_t(starts[size_t(i)] + j)];
      const bool h = hide[at] && id != cf::data::Tokenizer::kSep;
      x[at] = h ? mask_id : id;
      if (h) y[at] = id, ++hidden;
    }
  return {cf::Tensor::from_vector(x, {b, n}).to(dev), cf::Tensor::from_vector(y, {b, n}).to(dev), hidden};
}

// Draws which of b * n positions to hide (each with probability `rate`).
inline std::vector<bool> draw_hidden(int64_t b, int64_t n, double rate, cf::Generator& g) {
  std::vector<double> u = cf::rand({b, n}, cf::kFloat64, g).to_vector<double>();
  std::vector<bool> hide(u.size());
  for (size_t i = 0; i < u.size(); ++i) hide[i] = u[i] < rate;
  return hide;
}

// The fixed test set: `count` windows spread evenly over the stream and one draw
// of hidden positions (from `seed`).
struct MaskedEvalSet {
  std::vector<MaskedBatch> batches;
  int64_t hidden = 0;  // scored positions
};
inline MaskedEvalSet masked_eval_set(const std::vector<int64_t>& stream, const MaskedTaskConfig& c, int64_t batch,
                                     int64_t mask_id, uint64_t seed, cf::Device dev, const std::string& app,
                                     const std::string& split) {
  const int64_t last = int64_t(stream.size()) - c.seq_len;
  if (last < 0)
    throw cf::ValueError("[" + app + "] the " + split + " texts (" + std::to_string(stream.size()) +
                         " characters) are shorter than one window of --seq-len " + std::to_string(c.seq_len));
  const int64_t count = std::min<int64_t>(c.eval_windows, last + 1);
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(count == 1 ? 0 : i * last / (count - 1));
  cf::Generator g{seed};
  MaskedEvalSet s;
  for (size_t i = 0; i < starts.size(); i += size_t(batch)) {
    std::vector<int64_t> part(starts.begin() + long(i),
                              starts.begin() + long(std::min(starts.size(), i + size_t(batch))));
    const std::vector<bool> hide = draw_hidden(int64_t(part.size()), c.seq_len, c.mask_rate, g);
    s.batches.push_back(masked_windows(stream, part, c.seq_len, hide, mask_id, dev));
    s.hidden += s.batches.back().hidden;
  }
  return s;
}

// Token accuracy over the hidden positions of the set, and the prediction at each
// of them (in order), for agreement. Random draws of the attention (hashing) come
// from the global generator seeded with draw_seed before every batch, as in
// evaluate_classifier: a window's predictions do not depend on --eval-batch-size.
inline EvalResult evaluate_masked(cf::models::TokenClassifier& model, const MaskedEvalSet& set, uint64_t draw_seed,
                                  cf::Device dev) {
  model.eval();
  cf::NoGradGuard ng;
  const cf::nn::GeneratorState saved = cf::nn::GeneratorState::of(cf::default_generator());
  EvalResult r;
  int64_t correct = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (const MaskedBatch& b : set.batches) {
    cf::manual_seed(draw_seed);
    const std::vector<int64_t> p = cf::argmax(model.forward(b.ids), -1).to_vector<int64_t>();
    const std::vector<int64_t> y = b.targets.to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i)
      if (y[i] >= 0) {
        correct += p[i] == y[i];
        r.predictions.push_back(p[i]);
      }
  }
  if (dev.is_cuda()) cf::cuda::synchronize();
  r.time_s = seconds_since(t0);
  saved.restore(cf::default_generator());
  r.accuracy = set.hidden ? double(correct) / double(set.hidden) : 0.0;
  return r;
}

// Trains on random windows of the training stream with fresh masks each step
// (the windows' and masks' generator is checkpointed with the model).
inline TrainResult train_masked(cf::models::TokenClassifier& model, const ClassifierTrainConfig& cfg, TrainRun run,
                                const MaskedTaskConfig& task, const std::vector<int64_t>& stream,
                                const MaskedEvalSet& val, int64_t mask_id, int64_t classes, int64_t seed) {
  const int64_t max_start = int64_t(stream.size()) - task.seq_len;
  if (max_start < 0)
    throw cf::ValueError("[" + run.app + "] the training texts (" + std::to_string(stream.size()) +
                         " characters) are shorter than one window of --seq-len " + std::to_string(task.seq_len));
  cf::Generator data_gen{uint64_t(seed) * 7919u + 3};
  run.generators.push_back({"data", &data_gen});
  TrainHooks hooks;
  hooks.evaluate = [&] { return evaluate_masked(model, val, uint64_t(seed) + 777, run.device).accuracy; };
  hooks.loss = [&](int64_t, cf::Tensor* task_loss) {
    const std::vector<int64_t> starts =
        cf::randint(0, max_start + 1, {cfg.batch_size}, data_gen).to_vector<int64_t>();
    const MaskedBatch b = masked_windows(stream, starts, task.seq_len,
                                         draw_hidden(cfg.batch_size, task.seq_len, task.mask_rate, data_gen), mask_id,
                                         run.device);
    cf::Tensor logits = model.forward(b.ids);
    cf::Tensor loss = cf::cross_entropy(cf::reshape(logits, {cfg.batch_size * task.seq_len, classes}),
                                        cf::reshape(b.targets, {cfg.batch_size * task.seq_len}));
    *task_loss = loss;
    return loss;
  };
  return train_model(model, cfg, run, hooks);
}

}  // namespace cf::apps
