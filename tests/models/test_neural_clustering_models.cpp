// ClusterFormer models: the Transformer baselines with neural clustering attention,
// trained with eq. 17's L_total = mu L1 + nu L2 + lambda L_task.
#include <algorithm>
#include <cmath>

#include "models/neural_clustering.h"
#include "nn/attention/neural_clustering.h"
#include "nn/bigram_task.h"
#include "nn/nn_test_util.h"
#include "nn/pattern_lm.h"
#include "nn/optim/adam.h"
#include "nn/optim/schedule.h"

using namespace cf;
using namespace cf::test;

namespace {

models::TransformerConfig tiny_config(int64_t vocab, const std::string& attention, int64_t clusters) {
  // tests/nn/test_transformer.cpp's tiny model (the pattern LM's), with this vocabulary.
  models::TransformerConfig c = pattern_lm_config(
      attention, attention == "neural-clustering" ? nlohmann::json{{"clusters", clusters}} : nlohmann::json::object());
  c.vocab_size = vocab;
  return c;
}

// Trains a classifier on the task with the test_transformer.cpp recipe (AdamW,
// lr 3e-3 decayed to 0 on a cosine, batches of 32 fresh examples) for `steps` updates from model seed
// `seed`; returns held-out accuracy.
double train_pattern_task(const models::TransformerConfig& c, int64_t steps, uint64_t seed, double* first_loss,
                          double* last_loss, const models::ClusterFormerLossWeights& w = {}) {
  const int64_t V = 8, N = 10, B = 32;
  Generator data(42), held_out(4242);
  std::vector<int64_t> te_ids, te_y, skip_ids, skip_y;
  make_bigram_set(data, V, N, 256, skip_ids, skip_y);  // the draws test_transformer.cpp spends on its test set
  const int64_t TE = 2048;  // a separate, larger held-out set: one example is 0.05 points
  make_bigram_set(held_out, V, N, TE, te_ids, te_y);
  Generator g(seed);
  models::EncoderClassifier model(c, g);
  nn::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  nn::AdamW opt(model.named_parameters(), o);
  const nn::WarmupCosineLR schedule(o.lr, 0, std::max<int64_t>(steps, 1));
  for (int64_t step = 0; step < steps; ++step) {
    schedule.apply(opt);
    std::vector<int64_t> ids, y;
    make_bigram_set(data, V, N, B, ids, y);
    nn::AuxLosses aux;
    Tensor task = cross_entropy(model.forward(ti64(ids, {B, N}), {}, &aux), ti64(y, {B}));
    Tensor loss = models::clusterformer_loss(task, aux, w);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) *first_loss = task.item<float>();
    *last_loss = task.item<float>();
  }
  model.eval();
  NoGradGuard ng;
  auto pred = argmax(model.forward(ti64(te_ids, {TE, N})), 1).to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == te_y[size_t(i)];
  return double(correct) / double(pred.size());
}

}  // namespace

// Issue 5: "learns the task as well as the full-attention baseline (within 2
// points of accuracy)". ClusterFormer learns this task more slowly: N = 10 and
// k = 3 (k near sqrt(N), section 4.2), so each query sees 6 to 8 of the 10 tokens,
// chosen by content clusters that the task loss cannot move (eq. 4's argmax),
// while the task is positional ("bigram (3, 5)"). So both models train to
// convergence with the same recipe and budget. Held-out accuracy (2048 examples)
// for model seeds 7..14 (CF_TEST_SEED), mu = nu = 1e-3:
//   600 steps:  full      0.986 0.971 0.999 0.995 0.952 0.980 0.994 0.997
//               ClusterF. 0.968 0.913 0.923 0.830 0.940 0.847 0.869 0.936
//   3000 steps, constant rate, on another machine, and then on an AMD EPYC:
//               full      1.000 on all eight seeds, both machines
//               ClusterF. 1.000 1.000 0.999 0.995 0.999 0.987 1.000 1.000
//                         1.000 0.987 0.993 0.999 1.000 0.973 1.000 1.000
//   4000 steps, rate decayed to 0 (the budget here), AMD EPYC:
//               full      1.000 on all eight seeds
//               ClusterF. 1.000 1.000 1.000 1.000 0.999 0.994 1.000 1.000
// Seed 12 is the slow one (0.973 at 3000 constant, 0.981 at 3000 decayed). The
// case runs seed 7; the table is the evidence that the 2-point margin is not one
// seed's luck. The last training loss is one batch of 32: one mistake costs ~0.12.
TEST_CASE("a ClusterFormer classifier learns the pattern task as well as full attention (within 2 points)" * CF_SLOW) {
  const int64_t steps = 4000;
  const uint64_t seed = test_seed(7);
  double f0 = 0, f1 = 0, c0 = 0, c1 = 0;
  const double full = train_pattern_task(tiny_config(8, "full", 0), steps, seed, &f0, &f1);
  // k near sqrt(max length) (section 4.2): N = 10 -> k = 3, blocks of 4 tokens.
  const double nc = train_pattern_task(tiny_config(8, "neural-clustering", 3), steps, seed, &c0, &c1);
  MESSAGE("pattern task held-out accuracy after ", steps, " steps: full ", full, " (loss ", f0, " -> ", f1,
          "), ClusterFormer ", nc, " (loss ", c0, " -> ", c1, ")");
  CHECK(c1 < 0.25 * c0);
  CHECK(full >= 0.98);
  CHECK(nc >= full - 0.02);
}

TEST_CASE("ClusterFormer causal LM (masked variant) learns the repeating-pattern corpus" * CF_SLOW) {
  Generator g(test_seed(9));
  models::CausalLM lm(tiny_config(5, "neural-clustering", 5), g);
  const PatternLMRun r = train_pattern_lm(lm, 150, [](const Tensor& task, nn::AuxLosses& aux) {
    REQUIRE(aux.get(nn::kClusteringLossName).size() == 2);
    return models::clusterformer_loss(task, aux, {});
  });
  const double first = r.first, held_out = r.held_out;
  const double unigram = pattern_unigram_nats();
  MESSAGE("ClusterFormer causal LM: loss ", first, " -> held-out ", held_out, " nats/token (unigram ", unigram, ")");
  // Below what the current token alone allows (0.46 nats, pattern_lm.h).
  CHECK(held_out < 0.3);
}

// One training step of a model at the paper's sizes on a tiny batch: the output
// has the expected shape, every layer adds L1 and L2, and every parameter that
// should learn gets a finite gradient.
template <class M, class F>
void one_step(M& model, F forward, int64_t layers_seen) {
  nn::AuxLosses aux;
  Tensor task = forward(&aux);
  REQUIRE(aux.get(nn::kClusteringLossName).size() == size_t(layers_seen));
  REQUIRE(aux.get(nn::kCentroidSortingLossName).size() == size_t(layers_seen));
  Tensor loss = models::clusterformer_loss(task, aux, {});
  CHECK(std::isfinite(loss.item<float>()));
  model.zero_grad();
  loss.backward();
  int64_t with_grad = 0, total = 0;
  for (auto& e : model.named_parameters()) {
    ++total;
    if (!e.second.grad().defined()) continue;
    ++with_grad;
    CHECK(std::isfinite(values(sum(abs(e.second.grad()))).front()));
  }
  CHECK(with_grad == total);
  // ... and that gradient points downhill: in eval mode (no dropout draws, so both losses see the
  // same function), a step of length 1e-3 against the gradient lowers the loss.
  model.eval();
  auto eval_loss = [&] {
    nn::AuxLosses a;
    Tensor t = forward(&a);
    return models::clusterformer_loss(t, a, {});
  };
  model.zero_grad();
  Tensor before = eval_loss();
  before.backward();
  std::vector<Tensor> params;
  double norm2 = 0;
  for (auto& e : model.named_parameters()) {
    params.push_back(e.second);
    norm2 += values(sum(square(to(e.second.grad(), kFloat64)))).front();
  }
  REQUIRE(norm2 > 0);
  {
    NoGradGuard ng;
    for (Tensor& p : params) add_(p, p.grad(), -1e-3 / std::sqrt(norm2));
  }
  const double loss_before = values(to(before, kFloat64)).front();
  const double after = [&] {
    NoGradGuard ng;
    return values(to(eval_loss(), kFloat64)).front();
  }();
  CHECK_MESSAGE(after < loss_before, "loss ", loss_before, " -> ", after);
  model.train();
}

TEST_CASE("ClusterFormer models at the paper's sizes build and train one step on a tiny batch") {
  Generator g(13);
  const int64_t V = 30;
  Tensor ids = ti64({5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0}, {2, 8});
  Tensor ids_b = ti64({20, 21, 22, 23, 24, 25, 26, 0, 0, 0}, {2, 5});
  Tensor y = ti64({1, 0}, {2});
  {
    INFO("classifier: L = 2, d = 300, 4 heads, k = round(sqrt(max_len))");
    models::EncoderClassifier m(models::clusterformer_classifier_config(V, 64, 2), g);  // k = 8
    one_step(m, [&](nn::AuxLosses* aux) { return cross_entropy(m.forward(ids, {}, aux), y); }, 2);
  }
  {
    INFO("pair model: L = 1, d = 300, 6 heads, k = 3");
    models::PairClassifier m(models::clusterformer_pair_config(V, 64, 3), g);
    one_step(m, [&](nn::AuxLosses* aux) { return cross_entropy(m.forward(ids, {}, ids_b, {}, aux), y); }, 2);
  }
  {
    // The paper's decoder sizes with 2 of its 6 layers, for time (the config's
    // L = 6 is checked in the settings case; longer chains in test_neural_clustering.cpp).
    INFO("causal LM with the masked variant: d = 512, 4 heads, d_ff = 1024, k = 3, L = 2");
    models::TransformerConfig c = models::clusterformer_lm_config(V, 64);
    c.n_layers = 2;
    models::CausalLM m(c, g);
    one_step(m,
             [&](nn::AuxLosses* aux) {
               Tensor logits = m.forward(ids, {}, aux);
               return cross_entropy(reshape(logits, {16, V}),
                                    ti64({6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0, 0}, {16}));
             },
             2);
  }
}

TEST_CASE("ClusterFormer settings, the pair model, and the eq. 17 objective") {
  models::TransformerConfig c = models::clusterformer_classifier_config(100, 400, 5);
  CHECK(c.n_layers == 2);
  CHECK(c.layer.d_model == 300);
  CHECK(c.layer.n_heads == 4);
  CHECK(c.layer.attention.type == "neural-clustering");
  CHECK(c.layer.attention.options.get<int64_t>("clusters", 0) == 20);  // round(sqrt(400))
  models::TransformerConfig p = models::clusterformer_pair_config(100, 64, 3);
  CHECK(p.n_layers == 1);
  CHECK(p.layer.n_heads == 6);
  CHECK(p.layer.attention.options.get<int64_t>("clusters", 0) == 3);
  models::TransformerConfig lm = models::clusterformer_lm_config(100, 64);
  CHECK(lm.n_layers == 6);
  CHECK(lm.layer.d_model == 512);

  // The pair model with the paper's L = 1, 6 heads, k = 3 (narrower d for speed): both
  // texts go through the shared encoder, each adding L1 and L2.
  p.layer.d_model = 12;
  p.layer.d_ff = 16;
  Generator g(3);
  models::PairClassifier pair(p, g);
  Tensor a = ti64({5, 6, 7, 8, 9, 0, 11, 12, 13, 14, 15, 16}, {2, 6}), b = ti64({20, 21, 22, 23, 24, 25, 26, 0}, {2, 4});
  nn::AuxLosses aux;
  Tensor logits = pair.forward(a, {}, b, {}, &aux);
  CHECK(logits.shape() == Shape{2, 3});
  CHECK(aux.get(nn::kClusteringLossName).size() == 2);
  CHECK(aux.get(nn::kCentroidSortingLossName).size() == 2);

  // eq. 17: lambda L_task + mu sum L1 + nu sum L2
  Tensor task = Tensor::scalar(2.0);
  models::ClusterFormerLossWeights w = models::ClusterFormerLossWeights::from_config(
      nn::Config(nlohmann::json{{"mu", 0.5}, {"nu", 0.25}, {"lambda", 2.0}}, "loss"));
  double l1 = 0, l2 = 0;
  for (auto& t : aux.get(nn::kClusteringLossName)) l1 += values(t).front();
  for (auto& t : aux.get(nn::kCentroidSortingLossName)) l2 += values(t).front();
  check_close(models::clusterformer_loss(task, aux, w), {4.0 + 0.5 * l1 + 0.25 * l2}, 1e-5);
  check_close(models::clusterformer_loss(task, nn::AuxLosses(), w), {4.0}, 1e-12);
  CHECK_THROWS_MSG(models::ClusterFormerLossWeights::from_config(nn::Config(nlohmann::json{{"mu", -1}}, "loss")),
                   ValueError, "[ClusterFormerLossWeights] loss.mu must be a finite number >= 0", "-1");
  CHECK_THROWS_MSG(models::ClusterFormerLossWeights::from_config(nn::Config(nlohmann::json{{"nu2", 1}}, "loss")),
                   ValueError, "loss.nu2");
  CHECK_THROWS_MSG(models::clusterformer_loss(Tensor(), aux, w), ValueError,
                   "[clusterformer_loss] task_loss must be a one-element tensor", "undefined");
  CHECK_THROWS_MSG(models::clusterformer_classifier_config(100, 0, 2), ValueError, "max_len must be >= 1");
}
