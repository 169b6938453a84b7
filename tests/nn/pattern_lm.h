#pragma once
// The repeating-pattern corpus shared by the causal-LM tests of every attention
// variant: sequences of the period-6 pattern 1 2 1 3 2 4 from random offsets.
// The next token follows from the last two, so a model has to use its context:
// one that reads only the current token cannot beat (4/6) ln 2 = 0.46 nats/token
// (after 1 and after 2 two continuations are equally likely), one that ignores
// the context entirely not the unigram entropy, 1.33 nats/token.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "models/transformer.h"
#include "nn/nn_test_util.h"
#include "nn/optim/adam.h"
#include "nn/optim/schedule.h"

namespace cf::test {

// The tiny LM of these tests: vocabulary 5, 2 layers of width 32, 2 heads, FFN 64,
// no dropout; `attention` with `options` in every layer.
inline models::TransformerConfig pattern_lm_config(const std::string& attention = "full",
                                                   const nlohmann::json& options = nlohmann::json::object()) {
  models::TransformerConfig c;
  c.vocab_size = 5;
  c.max_len = 64;
  c.n_layers = 2;
  c.layer.d_model = 32;
  c.layer.n_heads = 2;
  c.layer.d_ff = 64;
  c.layer.dropout = 0.0;
  c.layer.attention.type = attention;
  c.layer.attention.options = nn::Config(options, "attention");
  return c;
}

// -(2 (2/6) ln(2/6) + 2 (1/6) ln(1/6)): tokens 1 and 2 twice, 3 and 4 once in 6.
inline double pattern_unigram_nats() {
  return -(2 * (2.0 / 6) * std::log(2.0 / 6) + 2 * (1.0 / 6) * std::log(1.0 / 6));
}

struct PatternLMRun {
  double first = 0, last = 0;  // task loss of the first and last training batch
  double held_out = 0;         // task loss of one more batch, in eval mode
};

// Trains `lm` for `steps` AdamW steps (lr 3e-3, no weight decay) on batches of 16
// sequences of 24 tokens drawn from Generator(5). The loss minimised is
// total(task_loss, aux) when given (e.g. adding a variant's auxiliary losses),
// else the task loss (next-token cross-entropy). cosine_decay: the rate decays to
// 0 over the run (a steadier end point where the last steps are noisy).
inline PatternLMRun train_pattern_lm(models::CausalLM& lm, int64_t steps,
                                     const std::function<Tensor(const Tensor&, nn::AuxLosses&)>& total = nullptr,
                                     bool cosine_decay = false) {
  const std::vector<int64_t> pattern = {1, 2, 1, 3, 2, 4};
  const int64_t N = 24, B = 16;
  Generator data(5);
  std::vector<int64_t> in, target;
  auto batch = [&] {
    in.clear();
    target.clear();
    auto offsets = randint(0, 6, {B}, data).to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < N; ++t) {
        in.push_back(pattern[size_t((offsets[size_t(b)] + t) % 6)]);
        target.push_back(pattern[size_t((offsets[size_t(b)] + t + 1) % 6)]);
      }
  };
  auto task_loss = [&](const Tensor& logits) {
    return cross_entropy(reshape(logits, {B * N, 5}), Tensor::from_vector(target, {B * N}));
  };
  nn::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  nn::AdamW opt(lm.named_parameters(), o);
  const nn::WarmupCosineLR schedule(o.lr, 0, std::max<int64_t>(steps, 1));
  PatternLMRun r;
  for (int64_t step = 0; step < steps; ++step) {
    if (cosine_decay) schedule.apply(opt);
    batch();
    nn::AuxLosses aux;
    Tensor task = task_loss(lm.forward(Tensor::from_vector(in, {B, N}), Tensor(), &aux));
    Tensor loss = total ? total(task, aux) : task;
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) r.first = task.item<float>();
    r.last = task.item<float>();
  }
  lm.eval();
  NoGradGuard ng;
  batch();
  r.held_out = task_loss(lm.forward(Tensor::from_vector(in, {B, N}))).item<float>();
  return r;
}

}  // namespace cf::test
