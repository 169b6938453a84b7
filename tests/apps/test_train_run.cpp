// The apps' training loop (apps/common/train_run.h): its checkpoints hold CPU tensors on every device
// (save_checkpoint refuses others), and a run stopped by --stop-after resumes, on its device and in a fresh
// process's model, to the weights of a run that never stopped.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/train_run.h"
#include "cuda/cuda_test_util.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using cf::test::TempDir;

namespace {

std::vector<double> weights(const nn::Module& model) {
  std::vector<double> w;
  for (const auto& e : model.state_dict()) {
    const std::vector<double> v = test::values(e.second.cpu());
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

// 6 AdamW steps of a linear least-squares fit on `dev`, checkpointed every 2 steps to `ckpt`, in a model
// built (with its data) from seed 5 as a new process would; returns the final weights. stop_after > 0
// stops a first model there (TrainingStopped) and a second, new model continues from the checkpoint, so
// a resume that skipped the model's or the optimizer's state would end elsewhere.
std::vector<double> fit(Device dev, const std::string& ckpt, int64_t stop_after) {
  Generator data_gen(7);
  const Tensor x = randn({8, 3}, kFloat32, data_gen, 0.0, 1.0, dev),
               y = randn({8, 2}, kFloat32, data_gen, 0.0, 1.0, dev);
  apps::TrainSettings cfg;
  cfg.steps = 6;
  cfg.warmup = 1;
  cfg.eval_every = 0;
  cfg.log_every = 0;
  cfg.checkpoint_every = 2;
  apps::TrainRun run;
  run.app = "test";
  run.tags = {{"seed", 0}};
  run.signature = {{"fit", 1}};
  run.checkpoint = ckpt;
  run.device = dev;
  auto train = [&](int64_t stop) {
    Generator gen(5);
    auto model = std::make_unique<nn::Linear>(3, 2, true, gen);
    model->to(dev);
    apps::TrainHooks hooks;
    hooks.loss = [&](int64_t, Tensor* task) {
      const Tensor d = (*model)(x) - y;
      Tensor loss = mean(d * d);
      *task = loss;
      return loss;
    };
    apps::TrainSettings c = cfg;
    c.stop_after = stop;
    apps::train_model(*model, c, run, hooks);
    return weights(*model);
  };
  if (stop_after > 0) {
    CHECK_THROWS_AS(train(stop_after), apps::TrainingStopped);
    // What was written is a CPU checkpoint of the step the run stopped at.
    const nn::TrainingCheckpoint ck = nn::load_checkpoint(ckpt);
    CHECK(ck.step == stop_after);
    for (const auto& e : ck.model) CHECK(e.second.device().is_cpu());
    for (const auto& e : ck.optimizer) CHECK(e.second.device().is_cpu());
  }
  return train(0);
}

void check_resume(Device dev) {
  TempDir tmp;
  const std::vector<double> straight = fit(dev, tmp.file("straight.safetensors"), 0);
  const std::vector<double> resumed = fit(dev, tmp.file("resumed.safetensors"), 4);
  CHECK(resumed == straight);
  // Not the untrained weights: the fit moved them.
  Generator gen(5);
  const std::vector<double> start = weights(nn::Linear(3, 2, true, gen));
  CHECK(resumed != start);
}

}  // namespace

TEST_CASE("apps' train_model: a run stopped and resumed from its checkpoint ends on the same weights") {
  check_resume(Device::cpu());
}

// Before 2026-11-28 every app with --device cuda and --checkpoint-dir failed at its first checkpoint: the
// state dicts went to save_checkpoint on the GPU ("[save_safetensors] ...: tensor ... on cuda:0; move it to
// the CPU first"), and Module::load_state_dict / Optimizer::load_state_dict refused CPU tensors for CUDA
// parameters.
CUDA_TEST_CASE("apps' train_model checkpoints and resumes a model on CUDA") { check_resume(Device::cuda(0)); }

namespace {

// 40 AdamW steps of a linear fit on `dev` with a new batch each step written by the load hook into the
// tensors the loss reads (a CPU generator draws it), the task losses logged every 10 steps; returns the
// final weights and the train lines' losses.
std::pair<std::vector<double>, std::vector<double>> fit_loaded(Device dev, bool cuda_graph) {
  apps::TrainSettings cfg;
  cfg.steps = 40;
  cfg.warmup = 1;
  cfg.lr = 0.1;
  cfg.eval_every = 0;
  cfg.log_every = 10;
  cfg.cuda_graph = cuda_graph;
  apps::TrainRun run;
  run.app = "test";
  run.tags = {{"seed", 0}};
  run.signature = {{"fit", 1}};
  run.device = dev;
  Generator gen(5), data_gen(9);
  auto model = std::make_unique<nn::Linear>(3, 2, true, gen);
  model->to(dev);
  Tensor x = Tensor::zeros({8, 3}, kFloat32, dev), y = Tensor::zeros({8, 2}, kFloat32, dev);
  apps::TrainHooks hooks;
  const Tensor truth = Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 0.5f, 1.0f, -1.0f, 2.5f}, {3, 2}).to(dev);
  hooks.load = [&](int64_t) {  // y = x truth on new points
    NoGradGuard ng;
    copy_(x, randn({8, 3}, kFloat32, data_gen).to(dev));
    copy_(y, matmul(x, truth));
  };
  hooks.loss = [&](int64_t, Tensor* task) {
    const Tensor d = (*model)(x)-y;
    Tensor loss = mean(d * d);
    *task = loss;
    return loss;
  };
  std::ostringstream events;  // the event lines train_model prints on stdout
  std::streambuf* out = std::cout.rdbuf(events.rdbuf());
  try {
    apps::train_model(*model, cfg, run, hooks);
  } catch (...) {
    std::cout.rdbuf(out);
    throw;
  }
  std::cout.rdbuf(out);
  std::vector<double> task_losses;
  std::istringstream in(events.str());
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == "train") task_losses.push_back(j["task_loss"].get<double>());
  }
  return {weights(*model), task_losses};
}

}  // namespace

TEST_CASE("apps' train_model: a load hook feeds the loss each step, and --cuda-graph needs CUDA and the hook") {
  const auto [w, losses] = fit_loaded(Device::cpu(), false);
  CHECK(losses.size() == 4);
  CHECK(losses.back() < 0.1 * losses.front());
  // --cuda-graph without a CUDA device, or without a load hook: refused by name
  apps::TrainSettings c;
  c.cuda_graph = true;
  CHECK_THROWS_WITH_AS(apps::check_cuda_graph_settings(c, "cpu", false),
                       "--cuda-graph needs --device cuda, got --device cpu", apps::UsageError);
  c.precision = "fp16";
  CHECK_THROWS_WITH_AS(apps::check_cuda_graph_settings(c, "cuda", false),
                       doctest::Contains("--cuda-graph does not take --precision fp16"), apps::UsageError);
  c.precision = "fp32";
  CHECK_THROWS_WITH_AS(apps::check_cuda_graph_settings(c, "cuda:0", true),
                       doctest::Contains("--cuda-graph does not take --distributed"), apps::UsageError);
  CHECK_NOTHROW(apps::check_cuda_graph_settings(c, "cuda:1", false));
}

CUDA_TEST_CASE("apps' train_model with --cuda-graph trains to the eager run's weights and logs its losses") {
  const auto eager = fit_loaded(Device::cuda(0), false), graphed = fit_loaded(Device::cuda(0), true);
  CHECK(graphed.first == eager.first);
  CHECK(graphed.second == eager.second);
  CHECK(eager.second.front() > eager.second.back());
}
