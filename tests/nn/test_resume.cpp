// Checkpoints of whole training runs: a model's state dict survives safetensors
// exactly, and resuming mid-epoch reproduces the uninterrupted run bit for bit.
#include "nn/nn_test_util.h"
#include "test_files.h"

using namespace cf;
using namespace cf::test;

namespace {

models::TransformerConfig config() {
  models::TransformerConfig c;
  c.vocab_size = 9;
  c.max_len = 16;
  c.n_layers = 1;
  c.layer.d_model = 8;
  c.layer.n_heads = 2;
  c.layer.d_ff = 16;
  c.layer.dropout = 0.1;  // draws from the global generator: its state must be restored too
  return c;
}

// Everything a training run holds; built fresh, from different init seeds, on resume.
struct Run {
  explicit Run(uint64_t init_seed) {
    Generator gen(init_seed);
    model = std::make_shared<models::EncoderClassifier>(config(), gen);
    nn::AdamWOptions o;
    o.lr = 1e-2;
    opt = std::make_unique<nn::AdamW>(model->named_parameters(), o);
    Generator data(77);
    auto ds = std::make_shared<data::TensorDataset>(randint(1, 9, {20, 6}, data), randint(0, 2, {20}, data));
    data::DataLoaderOptions lo;
    lo.batch_size = 6;  // 4 batches per epoch, the last one short
    lo.shuffle = true;
    lo.seed = 5;
    loader = std::make_unique<data::DataLoader>(ds, lo);
  }
  void steps(int n) {
    for (int i = 0; i < n; ++i) {
      data::Batch b;
      if (!loader->next(b)) {
        loader->set_epoch(loader->state().epoch + 1);
        REQUIRE(loader->next(b));
      }
      schedule.apply(*opt);
      Tensor loss = cross_entropy(model->forward(b.input), b.target);
      opt->zero_grad();
      loss.backward();
      nn::clip_grad_norm(model->named_parameters(), 1.0);
      opt->step();
    }
  }
  nn::TrainingCheckpoint checkpoint() const {
    nn::TrainingCheckpoint c;
    c.model = model->state_dict();
    c.optimizer = opt->state_dict();
    c.step = opt->step_count();
    c.generators = {{"default", nn::GeneratorState::of(default_generator())}};
    c.extra = {{"loader.epoch", std::to_string(loader->state().epoch)},
               {"loader.batch", std::to_string(loader->state().batch)}};
    return c;
  }
  void restore(const nn::TrainingCheckpoint& c) {
    model->load_state_dict(c.model);
    opt->load_state_dict(c.optimizer);
    REQUIRE(c.generators.size() == 1);
    c.generators[0].second.restore(default_generator());
    loader->set_state({std::stoll(c.extra.at("loader.epoch")), std::stoll(c.extra.at("loader.batch"))});
  }
  std::shared_ptr<models::EncoderClassifier> model;
  std::unique_ptr<nn::AdamW> opt;
  std::unique_ptr<data::DataLoader> loader;
  nn::InverseSqrtLR schedule{1e-2, 3};
};

std::vector<std::vector<double>> all_values(const nn::StateDict& d) {
  std::vector<std::vector<double>> out;
  for (auto& e : d) out.push_back(values(e.second));
  return out;
}

}  // namespace

TEST_CASE("a model's state dict round-trips exactly through a safetensors file") {
  Generator g1(1), g2(2);
  models::CausalLM a(config(), g1), b(config(), g2);
  cf::test::TempDir tmp;
  const std::string path = tmp.file("model.safetensors");
  save_safetensors(path, a.state_dict());
  b.load_state_dict(load_safetensors(path).tensors);
  CHECK(all_values(a.state_dict()) == all_values(b.state_dict()));
  a.eval();
  b.eval();
  Tensor ids = ti64({1, 2, 3, 4}, {1, 4});
  CHECK(values(a.forward(ids)) == values(b.forward(ids)));
}

TEST_CASE("resuming from a checkpoint mid-epoch reproduces the uninterrupted run bit for bit") {
  manual_seed(123);
  Run straight(1);
  straight.steps(11);
  const auto expected = all_values(straight.model->state_dict());
  const auto expected_opt = all_values(straight.opt->state_dict());

  manual_seed(123);
  cf::test::TempDir tmp;
  const std::string path = tmp.file("run.safetensors");
  {
    Run first(1);
    first.steps(6);  // stops in the middle of the second epoch
    nn::save_checkpoint(path, first.checkpoint());
  }
  manual_seed(999);  // whatever the process did in between
  Run resumed(2);    // other initial weights: everything must come from the file
  resumed.restore(nn::load_checkpoint(path));
  CHECK(resumed.opt->step_count() == 6);
  resumed.steps(5);
  CHECK(all_values(resumed.model->state_dict()) == expected);
  CHECK(all_values(resumed.opt->state_dict()) == expected_opt);
}
