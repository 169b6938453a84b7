#include "nn/optim/grad_scaler.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"

namespace cf {
namespace nn {

GradScaler::GradScaler(const GradScalerOptions& o) : opt_(o), scale_(o.init_scale) {
  CF_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, ValueError,
           "[GradScaler] init_scale must be finite and > 0, got ", o.init_scale);
  CF_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, ValueError,
           "[GradScaler] growth_factor must be > 1, got ", o.growth_factor);
  CF_CHECK(std::isfinite(o.backoff_factor) && o.backoff_factor > 0 && o.backoff_factor < 1, ValueError,
           "[GradScaler] backoff_factor must be in (0, 1), got ", o.backoff_factor);
  CF_CHECK(o.growth_interval > 0, ValueError, "[GradScaler] growth_interval must be > 0, got ",
           o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  CF_CHECK(loss.defined(), ValueError, "[GradScaler.scale] loss is an undefined tensor");
  if (!opt_.enabled) return loss;
  return mul(loss, scale_);
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!opt_.enabled) return;
  CF_CHECK(!unscaled_, ValueError,
           "[GradScaler.unscale_] already called since the last update(); call update() after each step");
  NoGradGuard ng;
  const double inv = 1.0 / scale_;
  bool bad = false;
  for (const ParamGroup& g : opt.param_groups())
    for (const auto& [name, p] : g.params) {
      Tensor gr = p.grad();
      if (!gr.defined()) continue;
      mul_(gr, inv);
      // 0 * x is NaN exactly when x is inf or NaN: one pass, accumulated in float64.
      if (!std::isfinite(sum(mul(gr, 0.0)).item())) bad = true;
    }
  unscaled_ = true;
  found_inf_ = bad;
}

bool GradScaler::step(Optimizer& opt) {
  if (!opt_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale_(opt);
  if (found_inf_) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!opt_.enabled) return;
  CF_CHECK(unscaled_, ValueError, "[GradScaler.update] called without a step() (or unscale_) since the last update");
  if (found_inf_) {
    scale_ *= opt_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= opt_.growth_interval) {
    // Growing past float32's range would make every later loss overflow; PyTorch stops there too.
    if (std::isfinite(float(scale_ * opt_.growth_factor))) scale_ *= opt_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

StateDict GradScaler::state_dict() const {
  return {{"scale", Tensor::scalar(scale_, kFloat64)},
          {"growth_tracker", Tensor::scalar(double(growth_tracker_), kInt64)}};
}

void GradScaler::load_state_dict(const StateDict& dict) {
  std::string problems;
  const Tensor* s = find_entry(dict, "scale");
  const Tensor* t = find_entry(dict, "growth_tracker");
  double sv = 0;
  int64_t tv = 0;
  if (!s || !s->defined() || s->numel() != 1 || s->dtype() != kFloat64 || !s->device().is_cpu())
    problems += " 'scale' must be a float64 CPU scalar;";
  else if (!(std::isfinite(sv = s->item()) && sv > 0))
    problems += str(" 'scale' must be finite and > 0, got ", sv, ";");
  if (!t || !t->defined() || t->numel() != 1 || t->dtype() != kInt64 || !t->device().is_cpu())
    problems += " 'growth_tracker' must be an int64 CPU scalar;";
  else if ((tv = t->item<int64_t>()) < 0)
    problems += str(" 'growth_tracker' must be >= 0, got ", tv, ";");
  for (const auto& kv : dict)
    if (kv.first != "scale" && kv.first != "growth_tracker") problems += " unexpected entry '" + kv.first + "';";
  if (!problems.empty()) {
    problems.pop_back();
    throw ValueError("[GradScaler.load_state_dict] state dict does not fit:" + problems);
  }
  scale_ = sv;
  growth_tracker_ = tv;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace nn
}  // namespace cf
