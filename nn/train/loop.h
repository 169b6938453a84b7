#pragma once
// A small, general train/eval loop. Each optimizer step s (1-based, from
// options.start_step + 1 to options.max_steps) does:
//
//   model->train()                                   (when a model is given)
//   for micro in 0 .. grad_accum-1:
//     loss = train_step_loss(s, micro)               one micro-batch, a scalar
//     (loss / grad_accum).backward()                 (no division when grad_accum == 1)
//   clip_grad_norm(params, clip_norm)                (when clip_norm > 0)
//   schedule->apply(optimizer)                       (when a schedule is given)
//   optimizer.step(); optimizer.zero_grad()
//   after_update(step)                               (when given)
//   every log_every steps: metrics {"step","split":"train","loss","loss_steps","lr"[,"grad_norm"]}
//     where "loss" is the mean training loss over the steps since the last log, loss_steps of
//     them: fewer on the first line after a resume (its window starts at start_step; the
//     steps before were run and logged by the run that saved the checkpoint)
//   every eval_every steps, and after step max_steps when eval_at_end:
//     model->eval(); metric = evaluate() under NoGradGuard; model mode restored
//     metrics {"step","split":"val",<metric_name>}; early_stopping->update(metric, s);
//     stop when early_stopping->should_stop()
//   on_step_end(info)
// The model is left in train mode. The progress bar (options.progress) counts
// steps from start_step to max_steps and shows "loss" and "val_<metric_name>".
//
// The reported loss of a step is the mean of its micro-batch losses, read (with the gradient norm
// when clipping on a CUDA device) once per step, after the backward passes and before the update. With
// grad_accum micro-batches of equal size and a mean-reduced loss, the gradient
// is that of the whole batch. Gradients left on the parameters before the first
// step are dropped (optimizer.zero_grad()) so the first step starts clean.
//
// Resuming: restore the model, optimizer (and early stopping state, or else the
// best_metric/best_step options) from a
// checkpoint and set start_step to the checkpoint's step; max_steps is the
// absolute last step, so the step numbers continue. The schedule follows
// optimizer.step_count(), which a restored optimizer carries.
//
// Errors name the step: a loss that is not a one-element floating tensor
// requiring grad, or that is not finite, is a ValueError
// "[train_loop] step 7, micro-batch 0: non-finite loss nan"; so is a non-finite
// gradient norm when clipping. Nothing is caught: an exception from a callback
// leaves the loop (the model's train/eval mode is restored first).
//
// Data: hooks.load_batch(s, micro), when given, runs before train_step_loss(s, micro): it writes
// the micro-batch into the tensors train_step_loss reads (copy_ into inputs kept across steps).
// Split that way the step can run as a CUDA graph.
//
// CUDA graphs (options.cuda_graph, parameters on a CUDA device; core/cuda_graph.h): the first step
// of the call runs eagerly, the second is captured (its micro-batches' forward and backward, the
// clipping, the optimizer's step and zero_grad) and every later step replays it: load_batch for
// each micro-batch, the schedule's learning rate, one replay, one read of the losses and the norm.
// So train_step_loss runs at the eager step and at the capture only: it must read its data from
// the tensors load_batch writes, the same ones each step, and do nothing on the host that must
// happen every step (a host read inside it is refused by the capture). The loss and the gradient
// norm are checked after the replay, so a non-finite one stops the loop after that step's update
// (eagerly, before it). No GradScaler (its skip is a host decision). Evaluation, after_update
// and on_step_end run eagerly between replays; state the captured step reads must be changed in
// place there (copy_), not replaced.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "core/tensor.h"

namespace cf {
namespace nn {

class Module;
class Optimizer;
class LRSchedule;
class EarlyStopping;
class MetricsWriter;
class ProgressBar;
class GradScaler;

struct TrainLoopOptions {
  int64_t max_steps = 0;   // the last step number (absolute), >= start_step
  int64_t start_step = 0;  // steps already done (a resumed run), >= 0
  int64_t eval_every = 0;  // 0: no periodic evaluation
  bool eval_at_end = true; // also evaluate after step max_steps
  int64_t log_every = 0;   // 0: no train metrics lines
  double clip_norm = 0.0;  // > 0: clip the global gradient norm; 0: off
  int64_t grad_accum = 1;  // micro-batches per optimizer step, >= 1
  bool progress = true;    // a progress bar (default: on stderr, quiet when not a terminal); false: none
  bool cuda_graph = false;           // steps replayed as a CUDA graph (above); the parameters on a CUDA device
  std::string metric_name = "loss";  // the key of evaluate()'s value in "val" lines
  std::string metric_mode = "min";   // best metric without EarlyStopping: "min"/"max"
  // A resumed run without an EarlyStopping: the best metric and its step so far (the saving run's
  // TrainLoopResult), so that is_best and the result match an uninterrupted run (a resumed run took
  // its first evaluation as the best, however bad). An EarlyStopping's own state takes precedence.
  double best_metric = std::numeric_limits<double>::quiet_NaN();  // NaN: none yet
  int64_t best_step = -1;
};

// What on_step_end sees after each step.
struct TrainStepInfo {
  int64_t step = 0;
  double loss = 0;         // mean micro-batch loss of this step
  double lr = 0;           // the learning rate this step used
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // when clipping
  bool evaluated = false;  // evaluate() ran after this step
  double metric = std::numeric_limits<double>::quiet_NaN();
  bool is_best = false;    // the metric is the best so far
};

// Everything optional. Pointers are borrowed (they must outlive the call).
struct TrainLoopHooks {
  std::function<double()> evaluate;   // the validation metric
  Module* model = nullptr;            // train()/eval() switched around evaluate
  const LRSchedule* schedule = nullptr;
  EarlyStopping* early_stopping = nullptr;
  MetricsWriter* metrics = nullptr;
  ProgressBar* progress = nullptr;    // used instead of the default bar (finished at the end)
  // Dynamic loss scaling (float16 training): the loss is scaled before backward,
  // the gradients unscaled before clipping, and a step whose gradients overflow
  // is skipped (no clipping error) while the scale backs off.
  GradScaler* scaler = nullptr;
  // Model state that belongs to the step, updated after the optimizer's (a memory bank's re-clustering):
  // before the step's evaluation, so that a validation score is the score of the model the step leaves.
  std::function<void(int64_t step)> after_update;
  // Writes step's micro-batch into the tensors train_step_loss reads, before it (needed with cuda_graph).
  std::function<void(int64_t step, int64_t micro)> load_batch;
  std::function<void(const TrainStepInfo&)> on_step_end;  // e.g. checkpointing
};

struct TrainLoopResult {
  int64_t steps_run = 0;   // optimizer steps taken by this call
  int64_t last_step = 0;   // start_step + steps_run
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t evaluations = 0;
  double last_metric = std::numeric_limits<double>::quiet_NaN();
  double best_metric = std::numeric_limits<double>::quiet_NaN();  // NaN when none
  int64_t best_step = -1;
  bool stopped_early = false;
};

using TrainStepFn = std::function<Tensor(int64_t step, int64_t micro)>;

// ValueError (naming the option) for max_steps < 0, start_step < 0 or
// > max_steps, a best_step outside [0, start_step] with a best_metric (or one without), eval_every/log_every < 0,
// grad_accum < 1, a negative or non-finite clip_norm, an unknown metric_mode, or an empty train_step_loss; with
// cuda_graph, for a GradScaler, a missing load_batch, or parameters not on a CUDA device.
TrainLoopResult train_loop(Optimizer& optimizer, const TrainStepFn& train_step_loss,
                           const TrainLoopOptions& options, const TrainLoopHooks& hooks = {});

}  // namespace nn
}  // namespace cf
