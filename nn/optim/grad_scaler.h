#pragma once
// Dynamic loss scaling for float16 training (PyTorch's torch.amp.GradScaler): float16 gradients
// underflow below 2^-24, so the loss is multiplied by a large scale before backward and the
// gradients are divided by it before the optimizer step. A step whose gradients hold an inf or
// NaN (the scale was too large) is skipped and the scale shrinks by backoff_factor; after
// growth_interval clean steps in a row it grows by growth_factor.
//
//   nn::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(opt);     // unscale, check, step unless inf/NaN
//   scaler.update();      // grow or back off
//
// Its state ("scale" float64, "growth_tracker" int64, and the schedule: "growth_factor" and
// "backoff_factor" float64, "growth_interval" int64) goes into TrainingCheckpoint::scaler and restores
// bit-exactly (the scale is a power of two times init_scale; float64 holds it exactly).
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/optim/optimizer.h"
#include "nn/state_dict.h"

namespace cf {
namespace nn {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() and unscale are identities, step() always steps
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale (differentiable; in the loss's dtype, float32 for a bfloat16 or float16 loss as in PyTorch).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of opt's parameters by the scale, in place, and records whether any
  // is inf/NaN (one host read for all of them). At most once per optimizer per step (a second
  // call before update(), or one after step(opt), is a ValueError): call it before clipping
  // gradients; step() calls it when you did not.
  void unscale_(Optimizer& opt);
  // opt.step() unless opt's unscaled gradients hold an inf/NaN; true when it stepped. Once per
  // optimizer per step: with several optimizers, each is unscaled and checked on its own (as
  // PyTorch's), and update() backs off when any of them overflowed.
  bool step(Optimizer& opt);
  // After step(): back off on overflow (and restart the clean-step count), or grow after
  // growth_interval clean steps. Resets the per-step records of every optimizer.
  void update();

  // The loss scale; 1 when disabled (scale() then multiplies by nothing), as PyTorch's.
  double get_scale() const { return opt_.enabled ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // Whether an optimizer unscaled since the last update() had an inf/NaN gradient.
  bool found_inf() const;
  // Whether a step is under way: an optimizer was unscaled (or stepped) since the last update(). Its
  // per-step records are not state (state_dict() leaves them out), so a copy made then would unscale
  // again; Python's pickling refuses it, as PyTorch's.
  bool step_in_progress() const { return !unscaled_.empty(); }
  bool enabled() const { return opt_.enabled; }

  // "scale", "growth_tracker" and the schedule ("growth_factor", "backoff_factor", "growth_interval"):
  // PyTorch's entries, its "_growth_tracker" named "growth_tracker", as 0-d CPU tensors. A cf before
  // stop 60 refuses the schedule's entries (its load was strict on two).
  StateDict state_dict() const;
  // Strict: "scale" (finite, > 0) and "growth_tracker" (integer >= 0), and the schedule's entries
  // where present (each checked as the constructor checks it; checkpoints before stop 60 lack them and
  // keep this scaler's), nothing else; else ValueError naming every problem; nothing changes unless
  // everything fits.
  void load_state_dict(const StateDict& dict);

 private:
  // What one optimizer did since the last update().
  struct PerOptimizer {
    const Optimizer* optimizer;
    bool stepped;
    bool found_inf;
  };
  PerOptimizer* record_of(const Optimizer& opt);

  GradScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::vector<PerOptimizer> unscaled_;  // the optimizers unscaled since the last update(), in order
};

}  // namespace nn
}  // namespace cf
