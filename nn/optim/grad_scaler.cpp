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
  // A 16-bit loss is scaled in float32, as PyTorch's float32 scale tensor promotes it: in its own dtype the
  // default scale 65536 is inf in float16 (above its 65504), and so was every scaled loss. (The backward
  // then hands the float16 graph 65536 * dloss, inf in float16 too at that scale: the first step of a
  // pure float16 model is skipped and the scale backs off, in PyTorch as here.)
  if (is_low_precision(loss.dtype())) return mul(to(loss, kFloat32), scale_);
  return mul(loss, scale_);
}

GradScaler::PerOptimizer* GradScaler::record_of(const Optimizer& opt) {
  for (PerOptimizer& r : unscaled_)
    if (r.optimizer == &opt) return &r;
  return nullptr;
}

bool GradScaler::found_inf() const {
  for (const PerOptimizer& r : unscaled_)
    if (r.found_inf) return true;
  return false;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!opt_.enabled) return;
  if (const PerOptimizer* r = record_of(opt))
    throw ValueError(r->stepped ? "[GradScaler.unscale_] called after step() for this optimizer; unscale_ comes "
                                  "before step(), once per update()"
                                : "[GradScaler.unscale_] already called for this optimizer since the last update(); "
                                  "call update() after each step");
  NoGradGuard ng;
  const double inv = 1.0 / scale_;
  // 0 * x is NaN exactly when x is inf or NaN: the sum over every gradient (float64) is finite
  // unless one holds an inf/NaN, and it is read once, not once per parameter.
  Tensor check;
  for (const ParamGroup& g : opt.param_groups())
    for (const auto& [name, p] : g.params) {
      Tensor gr = p.grad();
      if (!gr.defined()) continue;
      // A 16-bit gradient is unscaled in float32 and rounded once: inv taken in its dtype is 0 for
      // scales above 2^24 in float16 (every gradient zeroed, no inf found) and 19% off at 1e7.
      if (is_low_precision(gr.dtype())) copy_(gr, mul(to(gr, kFloat32), inv));
      else mul_(gr, inv);
      Tensor s = to(sum(mul(gr, 0.0)), kFloat64);
      check = check.defined() ? add(check, s.to(check.device())) : s;
    }
  // Recorded before the read: should it throw (a deferred CUDA error), a retry is refused rather than
  // dividing the gradients a second time.
  unscaled_.push_back({&opt, false, false});
  unscaled_.back().found_inf = check.defined() && !std::isfinite(check.item());
}

bool GradScaler::step(Optimizer& opt) {
  if (!opt_.enabled) {
    opt.step();
    return true;
  }
  if (!record_of(opt)) unscale_(opt);
  PerOptimizer* r = record_of(opt);
  CF_CHECK(!r->stepped, ValueError,
           "[GradScaler.step] already called for this optimizer since the last update(); call update() after "
           "each step");
  if (r->found_inf) {
    r->stepped = true;
    return false;
  }
  opt.step();
  // after it: a step that failed may be tried again. (The optimizers check every parameter before they
  // write any, so a refused step changed nothing; one failing inside an update, out of memory, may have
  // moved the parameters before it, and a retry moves those again.)
  r->stepped = true;
  return true;
}

void GradScaler::update() {
  if (!opt_.enabled) return;
  CF_CHECK(!unscaled_.empty(), ValueError,
           "[GradScaler.update] called without a step() (or unscale_) since the last update");
  if (found_inf()) {
    scale_ *= opt_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= opt_.growth_interval) {
    // Growing past float32's range would make every later loss overflow; PyTorch stops there too.
    if (std::isfinite(float(scale_ * opt_.growth_factor))) scale_ *= opt_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_.clear();
}

StateDict GradScaler::state_dict() const {
  // PyTorch's GradScaler.state_dict holds the same five: a resume keeps a tuned growth schedule. The int64
  // entries are made from int64 (through a double, an interval near 2^63 was refused or rounded).
  auto int64_scalar = [](int64_t v) { return Tensor::from_vector(std::vector<int64_t>{v}, Shape{}); };
  return {{"scale", Tensor::scalar(scale_, kFloat64)},
          {"growth_tracker", int64_scalar(growth_tracker_)},
          {"growth_factor", Tensor::scalar(opt_.growth_factor, kFloat64)},
          {"backoff_factor", Tensor::scalar(opt_.backoff_factor, kFloat64)},
          {"growth_interval", int64_scalar(opt_.growth_interval)}};
}

void GradScaler::load_state_dict(const StateDict& dict) {
  std::string problems;
  // The entry when it is a CPU scalar of the dtype, else null with the problem named.
  auto scalar_of = [&](const char* key, DType dtype, bool required) -> const Tensor* {
    const Tensor* t = find_entry(dict, key);
    if (!t) {
      if (required) problems += str(" missing entry '", key, "';");
      return nullptr;
    }
    if (!t->defined() || t->numel() != 1 || t->dtype() != dtype || !t->device().is_cpu()) {
      problems += str(" '", key, "' must be a CPU scalar of dtype ", dtype_name(dtype), ";");
      return nullptr;
    }
    return t;
  };
  double sv = 0, growth = opt_.growth_factor, backoff = opt_.backoff_factor;
  int64_t tv = 0, interval = opt_.growth_interval;
  if (const Tensor* t = scalar_of("scale", kFloat64, true))
    if (!(std::isfinite(sv = t->item()) && sv > 0)) problems += str(" 'scale' must be finite and > 0, got ", sv, ";");
  if (const Tensor* t = scalar_of("growth_tracker", kInt64, true))
    if ((tv = t->item<int64_t>()) < 0) problems += str(" 'growth_tracker' must be >= 0, got ", tv, ";");
  // The schedule: optional (states saved before stop 60 lack it), checked as the constructor checks it.
  if (const Tensor* t = scalar_of("growth_factor", kFloat64, false))
    if (!(std::isfinite(growth = t->item()) && growth > 1))
      problems += str(" 'growth_factor' must be > 1, got ", growth, ";");
  if (const Tensor* t = scalar_of("backoff_factor", kFloat64, false))
    if (!(std::isfinite(backoff = t->item()) && backoff > 0 && backoff < 1))
      problems += str(" 'backoff_factor' must be in (0, 1), got ", backoff, ";");
  if (const Tensor* t = scalar_of("growth_interval", kInt64, false))
    if ((interval = t->item<int64_t>()) <= 0) problems += str(" 'growth_interval' must be > 0, got ", interval, ";");
  for (const auto& kv : dict)
    if (kv.first != "scale" && kv.first != "growth_tracker" && kv.first != "growth_factor" &&
        kv.first != "backoff_factor" && kv.first != "growth_interval")
      problems += " unexpected entry '" + kv.first + "';";
  if (!problems.empty()) {
    problems.pop_back();
    throw ValueError("[GradScaler.load_state_dict] state dict does not fit:" + problems);
  }
  scale_ = sv;
  growth_tracker_ = tv;
  opt_.growth_factor = growth;
  opt_.backoff_factor = backoff;
  opt_.growth_interval = interval;
  unscaled_.clear();
}

}  // namespace nn
}  // namespace cf
