#include "nn/train/loop.h"

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/cuda_graph.h"
#include "core/error.h"
#include "nn/module.h"
#include "nn/optim/clip.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/optimizer.h"
#include "nn/optim/schedule.h"
#include "nn/train/early_stopping.h"
#include "nn/train/metrics.h"
#include "nn/train/progress.h"

namespace cf {
namespace nn {

namespace {

// Puts the model in eval mode for its lifetime, then back to the mode it had.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(Module* m) : m_(m), was_training_(m && m->is_training()) {
    if (m_) m_->eval();
  }
  ~EvalModeGuard() {
    if (m_) m_->train(was_training_);
  }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  Module* m_;
  bool was_training_;
};

void check_options(const TrainLoopOptions& o) {
  const char* w = "[train_loop] ";
  CF_CHECK(o.max_steps >= 0, ValueError, w, "max_steps must be >= 0, got ", o.max_steps);
  CF_CHECK(o.start_step >= 0, ValueError, w, "start_step must be >= 0, got ", o.start_step);
  CF_CHECK(o.start_step <= o.max_steps, ValueError, w, "start_step ", o.start_step,
           " is beyond max_steps ", o.max_steps);
  CF_CHECK(o.eval_every >= 0, ValueError, w, "eval_every must be >= 0 (0: off), got ", o.eval_every);
  CF_CHECK(o.log_every >= 0, ValueError, w, "log_every must be >= 0 (0: off), got ", o.log_every);
  CF_CHECK(o.grad_accum >= 1, ValueError, w, "grad_accum must be >= 1, got ", o.grad_accum);
  CF_CHECK(std::isfinite(o.clip_norm) && o.clip_norm >= 0, ValueError, w,
           "clip_norm must be finite and >= 0 (0: off), got ", o.clip_norm);
  CF_CHECK(o.metric_mode == "min" || o.metric_mode == "max", ValueError, w,
           "metric_mode must be \"min\" or \"max\", got \"", o.metric_mode, "\"");
  CF_CHECK(!o.metric_name.empty() && o.metric_name != "step" && o.metric_name != "split", ValueError, w,
           "metric_name must be non-empty and not \"step\" or \"split\", got \"", o.metric_name, "\"");
  CF_CHECK(std::isnan(o.best_metric) ? o.best_step == -1 : o.best_step >= 0 && o.best_step <= o.start_step,
           ValueError, w, "best_step ", o.best_step, " does not fit best_metric ", o.best_metric,
           " (a best needs a step in [0, start_step ", o.start_step, "]; none is NaN with step -1)");
}

std::string where_micro(int64_t step, int64_t micro) {
  return str("[train_loop] step ", step, ", micro-batch ", micro, ": ");
}

// A micro-batch's loss tensor, checked (no read of its value).
void check_loss_tensor(const Tensor& loss, int64_t step, int64_t micro) {
  CF_CHECK(loss.defined(), ValueError, where_micro(step, micro), "train_step_loss returned an undefined tensor");
  CF_CHECK(loss.numel() == 1 && is_floating(loss.dtype()), ValueError, where_micro(step, micro),
           "the loss must be a one-element floating tensor, got ", loss.describe());
  CF_CHECK(loss.requires_grad(), ValueError, where_micro(step, micro),
           "the loss does not require grad (computed under NoGradGuard, or from no parameter?)");
}

void check_loss_value(double v, int64_t step, int64_t micro, const char* after = "") {
  CF_CHECK(std::isfinite(v), ValueError, where_micro(step, micro), "non-finite loss ", v, after);
}

void check_grad_norm(double norm, int64_t step, const char* after = "") {
  CF_CHECK(std::isfinite(norm), ValueError, "[train_loop] step ", step, ": non-finite gradient norm ", norm, after);
}

}  // namespace

TrainLoopResult train_loop(Optimizer& optimizer, const TrainStepFn& train_step_loss,
                           const TrainLoopOptions& o, const TrainLoopHooks& hooks) {
  check_options(o);
  CF_CHECK(static_cast<bool>(train_step_loss), ValueError, "[train_loop] train_step_loss is empty");

  std::vector<Tensor> params;
  for (const auto& g : optimizer.param_groups())
    for (const auto& p : g.params) params.push_back(p.second);
  if (o.cuda_graph) {
    CF_CHECK(!hooks.scaler, ValueError,
             "[train_loop] cuda_graph takes no GradScaler (whether a step is skipped is "
             "decided on the host): train with bfloat16 autocast, or without cuda_graph");
    CF_CHECK(static_cast<bool>(hooks.load_batch), ValueError,
             "[train_loop] cuda_graph needs hooks.load_batch: the "
             "replayed step reads the tensors it read when captured, which load_batch must refill each step (one that "
             "does nothing trains on one fixed batch)");
    const Device dev = params.empty() ? Device::cpu() : params.front().device();
    CF_CHECK(dev.is_cuda(), ValueError, "[train_loop] cuda_graph needs the parameters on a CUDA device, got ",
             dev.str());
  }

  std::unique_ptr<ProgressBar> own_bar;
  ProgressBar* bar = nullptr;
  if (o.progress) {
    if (hooks.progress) {
      bar = hooks.progress;
    } else {
      ProgressBarOptions po;
      po.total = o.max_steps;
      po.initial = o.start_step;
      po.desc = "train";
      own_bar = std::make_unique<ProgressBar>(po);
      bar = own_bar.get();
    }
  }

  const bool maximize = hooks.early_stopping ? hooks.early_stopping->maximize() : o.metric_mode == "max";
  TrainLoopResult res;
  res.last_step = o.start_step;
  if (hooks.early_stopping && hooks.early_stopping->has_best()) {
    res.best_metric = hooks.early_stopping->best();
    res.best_step = hooks.early_stopping->best_step();
  } else if (!hooks.early_stopping && !std::isnan(o.best_metric)) {
    res.best_metric = o.best_metric;
    res.best_step = o.best_step;
  }
  auto evaluate = [&](int64_t step, TrainStepInfo& info) {
    double metric;
    {
      EvalModeGuard guard(hooks.model);
      NoGradGuard no_grad;
      metric = hooks.evaluate();
    }
    ++res.evaluations;
    res.last_metric = metric;
    info.evaluated = true;
    info.metric = metric;
    if (hooks.early_stopping) {
      info.is_best = hooks.early_stopping->update(metric, step);
    } else {
      info.is_best = !std::isnan(metric) &&
                     (std::isnan(res.best_metric) || (maximize ? metric > res.best_metric : metric < res.best_metric));
    }
    if (info.is_best) {
      res.best_metric = metric;
      res.best_step = step;
    }
    if (hooks.metrics) hooks.metrics->log(step, "val", {{o.metric_name, metric}});
    if (bar) bar->set_field("val_" + o.metric_name, metric);
    if (hooks.early_stopping && hooks.early_stopping->should_stop()) res.stopped_early = true;
  };

  // A resume from a checkpoint taken at the step that stopped the run (on_step_end runs before the loop
  // ends) holds a stopped EarlyStopping: the uninterrupted run took no further step, nor does this one.
  if (hooks.early_stopping && hooks.early_stopping->should_stop()) res.stopped_early = true;

  optimizer.zero_grad();
  double window_sum = 0;
  int64_t window_n = 0;
  // cuda_graph: the step after this call's first, captured; its losses (and norm) in `readout`
  cuda::Graph graph;
  Tensor readout;
  for (int64_t step = o.start_step + 1; step <= o.max_steps && !res.stopped_early; ++step) {
    if (hooks.model) hooks.model->train();
    TrainStepInfo info;
    info.step = step;
    double loss_sum = 0;
    if (o.cuda_graph && step > o.start_step + 1) {
      for (int64_t micro = 0; micro < o.grad_accum; ++micro) hooks.load_batch(step, micro);
      info.lr = hooks.schedule ? hooks.schedule->apply(optimizer) : optimizer.lr();
      if (!graph.captured()) {
        auto device_step = [&] {
          std::vector<Tensor> read;
          for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
            Tensor loss = train_step_loss(step, micro);
            check_loss_tensor(loss, step, micro);
            read.push_back(reshape(to(loss.detach(), kFloat64), {1}));
            if (o.grad_accum > 1) loss = loss * (1.0 / double(o.grad_accum));
            loss.backward();
          }
          if (o.clip_norm > 0) read.push_back(reshape(clip_grad_norm_tensor(params, o.clip_norm), {1}));
          optimizer.step();
          optimizer.zero_grad();
          readout = cat(read, 0);
        };
        try {
          graph.capture(device_step, params.front().device());
        } catch (const DeviceError& e) {
          throw DeviceError(str("[train_loop] step ", step, " captured as a CUDA graph (cuda_graph): ", e.what()));
        }
      }
      graph.replay();
      const std::vector<double> r = readout.to_vector<double>();  // the step's one wait
      const char* after = " (a replayed step: its update has run)";
      for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
        check_loss_value(r[size_t(micro)], step, micro, after);
        loss_sum += r[size_t(micro)];
      }
      if (o.clip_norm > 0) {
        info.grad_norm = r[size_t(o.grad_accum)];
        check_grad_norm(info.grad_norm, step, after);
      }
      info.loss = loss_sum / double(o.grad_accum);
    } else {
      // The micro-batches' losses (and the norm when clipped on a CUDA device) are read at once after
      // the backward passes, before the update: on a device one wait a step, which comes after the
      // step's kernels were queued (a read of each loss stopped the host before its backward).
      std::vector<Tensor> read;
      for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
        if (hooks.load_batch) hooks.load_batch(step, micro);
        Tensor loss = train_step_loss(step, micro);
        check_loss_tensor(loss, step, micro);
        read.push_back(reshape(to(loss.detach(), kFloat64), {1}));
        if (o.grad_accum > 1) loss = loss * (1.0 / double(o.grad_accum));
        (hooks.scaler ? hooks.scaler->scale(loss) : loss).backward();
      }
      if (hooks.scaler) hooks.scaler->unscale_(optimizer);  // before clipping (the scaler's rule)
      const bool overflow = hooks.scaler && hooks.scaler->found_inf();
      const bool clip = o.clip_norm > 0 && !overflow;
      // (on a CUDA device without a host read: clip_grad_norm reads a sum per gradient)
      const bool device_norm = clip && params.front().device().is_cuda();
      if (device_norm)
        read.push_back(reshape(clip_grad_norm_tensor(params, o.clip_norm), {1}));
      else if (clip)
        info.grad_norm = clip_grad_norm(params, o.clip_norm);
      const std::vector<double> r = cat(read, 0).to_vector<double>();
      for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
        check_loss_value(r[size_t(micro)], step, micro);
        loss_sum += r[size_t(micro)];
      }
      info.loss = loss_sum / double(o.grad_accum);
      if (device_norm) info.grad_norm = r.back();
      if (clip) check_grad_norm(info.grad_norm, step);
      info.lr = hooks.schedule ? hooks.schedule->apply(optimizer) : optimizer.lr();
      if (hooks.scaler) {
        hooks.scaler->step(optimizer);  // skipped on overflow
        hooks.scaler->update();
      } else {
        optimizer.step();
      }
      optimizer.zero_grad();
    }
    if (hooks.after_update) hooks.after_update(step);

    res.steps_run += 1;
    res.last_step = step;
    res.last_loss = info.loss;
    window_sum += info.loss;
    window_n += 1;
    if (bar) {
      bar->set_field("loss", info.loss);
      bar->update(1);
    }
    if (hooks.metrics && o.log_every > 0 && step % o.log_every == 0) {
      std::vector<std::pair<std::string, double>> vals{{"loss", window_sum / double(window_n)},
                                                       {"loss_steps", double(window_n)},
                                                       {"lr", info.lr}};
      if (o.clip_norm > 0) vals.emplace_back("grad_norm", info.grad_norm);
      hooks.metrics->log(step, "train", vals);
      window_sum = 0;
      window_n = 0;
    }
    const bool due = (o.eval_every > 0 && step % o.eval_every == 0) || (o.eval_at_end && step == o.max_steps);
    if (hooks.evaluate && due) evaluate(step, info);
    if (hooks.on_step_end) hooks.on_step_end(info);
    if (res.stopped_early) break;
  }
  if (bar) bar->finish();
  return res;
}

}  // namespace nn
}  // namespace cf
