// The apps' training loop (apps/common/train_run.h): its checkpoints hold CPU tensors on every device
// (save_checkpoint refuses others), and a run stopped by --stop-after resumes, on its device, to the weights
// of a run that never stopped.
#include <string>
#include <vector>

#include "common/train_run.h"
#include "cuda/cuda_test_util.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using cf::test::TempDir;

namespace {

// The weights after 6 AdamW steps of a linear least-squares fit on `dev`, checkpointed every 2 steps to
// `ckpt`; stop_after > 0 stops the run there first (TrainingStopped), then the same call continues.
std::vector<double> fit(Device dev, const std::string& ckpt, int64_t stop_after) {
  Generator gen(5);
  nn::Linear model(3, 2, true, gen);
  model.to(dev);
  const Tensor x = randn({8, 3}, kFloat32, gen, 0.0, 1.0, dev), y = randn({8, 2}, kFloat32, gen, 0.0, 1.0, dev);
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
  apps::TrainHooks hooks;
  hooks.loss = [&](int64_t, double* task) {
    const Tensor d = model(x) - y;
    Tensor loss = mean(d * d);
    *task = loss.item();
    return loss;
  };
  if (stop_after > 0) {
    cfg.stop_after = stop_after;
    CHECK_THROWS_AS(apps::train_model(model, cfg, run, hooks), apps::TrainingStopped);
    // What was written is a CPU checkpoint at the step the run stopped.
    const nn::TrainingCheckpoint ck = nn::load_checkpoint(ckpt);
    CHECK(ck.step == stop_after);
    for (const auto& e : ck.model) CHECK(e.second.device().is_cpu());
    cfg.stop_after = 0;
  }
  const apps::TrainResult r = apps::train_model(model, cfg, run, hooks);
  CHECK(r.trained);
  std::vector<double> w;
  for (const auto& e : model.state_dict()) {
    const std::vector<double> v = test::values(e.second.cpu());
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

void check_resume(Device dev) {
  TempDir tmp;
  const std::vector<double> straight = fit(dev, tmp.file("straight.safetensors"), 0);
  const std::vector<double> resumed = fit(dev, tmp.file("resumed.safetensors"), 4);
  CHECK(resumed == straight);
}

}  // namespace

TEST_CASE("apps' train_model: a run stopped and resumed from its checkpoint ends on the same weights") {
  check_resume(Device::cpu());
}

// Before 2026-11-28 every app with --device cuda and --checkpoint-dir failed at its first checkpoint: the
// state dicts went to save_checkpoint on the GPU ("[save_safetensors] ...: tensor ... on cuda:0; move it to
// the CPU first"), and a resume would have loaded CPU tensors into CUDA parameters.
CUDA_TEST_CASE("apps' train_model checkpoints and resumes a model on CUDA") { check_resume(Device::cuda(0)); }
