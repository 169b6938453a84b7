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
// Its state ("scale" float64, "growth_tracker" int64) goes into TrainingCheckpoint::scaler and
// restores bit-exactly (the scale is a power of two times init_scale; float64 holds it exactly).
#include <cstdint>

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

  // loss * scale (differentiable; in the loss's dtype).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of opt's parameters by the scale, in place, and records whether any
  // is inf/NaN. At most once per step (a second call before update() is a ValueError): call it
  // before clipping gradients; step() calls it when you did not.
  void unscale_(Optimizer& opt);
  // opt.step() unless the unscaled gradients hold an inf/NaN; true when it stepped.
  bool step(Optimizer& opt);
  // After step(): back off on overflow (and restart the clean-step count), or grow after
  // growth_interval clean steps. Resets the per-step unscale record.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // Whether the last unscale_ found an inf/NaN gradient.
  bool found_inf() const { return found_inf_; }
  bool enabled() const { return opt_.enabled; }

  StateDict state_dict() const;
  // Strict: exactly "scale" (finite, > 0) and "growth_tracker" (integer >= 0), else ValueError
  // naming every problem; nothing changes unless everything fits.
  void load_state_dict(const StateDict& dict);

 private:
  GradScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace nn
}  // namespace cf
