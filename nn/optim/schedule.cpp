#include "nn/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/optim/optimizer.h"

namespace cf {
namespace nn {

LRSchedule::LRSchedule(const char* name, double lr) : name_(name), lr_(lr) {
  CF_CHECK(std::isfinite(lr) && lr >= 0, ValueError, "[", name_,
           "] learning rate must be finite and >= 0, got ", lr);
}

void LRSchedule::check_step(int64_t step) const {
  CF_CHECK(step >= 0, ValueError, "[", name_, "] step must be >= 0, got ", step);
}

double LRSchedule::multiplier(int64_t step) const {
  double v = lr_at(step);
  return lr_ == 0 ? 0.0 : v / lr_;
}

double LRSchedule::apply(Optimizer& opt) const {
  double v = lr_at(opt.step_count() + 1);
  opt.set_lr(v);
  return v;
}

ConstantLR::ConstantLR(double lr) : LRSchedule("ConstantLR", lr) {}
double ConstantLR::lr_at(int64_t step) const {
  check_step(step);
  return lr_;
}

InverseSqrtLR::InverseSqrtLR(double lr, int64_t warmup) : LRSchedule("InverseSqrtLR", lr), warmup_(warmup) {
  CF_CHECK(warmup >= 1, ValueError, "[InverseSqrtLR] warmup must be >= 1, got ", warmup);
}
double InverseSqrtLR::lr_at(int64_t step) const {
  check_step(step);
  if (step == 0) return 0.0;
  double s = double(step), w = double(warmup_);
  return lr_ * std::min(s / w, std::sqrt(w / s));
}

WarmupCosineLR::WarmupCosineLR(double lr, int64_t warmup, int64_t total, double min_lr)
    : LRSchedule("WarmupCosineLR", lr), warmup_(warmup), total_(total), min_lr_(min_lr) {
  CF_CHECK(warmup >= 0, ValueError, "[WarmupCosineLR] warmup must be >= 0, got ", warmup);
  CF_CHECK(total > warmup, ValueError, "[WarmupCosineLR] total steps (", total,
           ") must be greater than warmup (", warmup, ")");
  CF_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, ValueError,
           "[WarmupCosineLR] min_lr must be in [0, lr] = [0, ", lr, "], got ", min_lr);
}
double WarmupCosineLR::lr_at(int64_t step) const {
  check_step(step);
  if (warmup_ > 0 && step <= warmup_) return lr_ * double(step) / double(warmup_);
  if (step <= warmup_) return lr_;  // no warmup: lr_at(0), before any update (header: update 1 is below it)
  if (step >= total_) return min_lr_;
  const double pi = 3.14159265358979323846;
  double progress = double(step - warmup_) / double(total_ - warmup_);
  return min_lr_ + (lr_ - min_lr_) * 0.5 * (1.0 + std::cos(pi * progress));
}

StepLR::StepLR(double lr, int64_t step_size, double gamma)
    : LRSchedule("StepLR", lr), step_size_(step_size), gamma_(gamma) {
  CF_CHECK(step_size >= 1, ValueError, "[StepLR] step_size must be >= 1, got ", step_size);
  CF_CHECK(std::isfinite(gamma) && gamma > 0, ValueError, "[StepLR] gamma must be finite and > 0, got ",
           gamma);
}
double StepLR::lr_at(int64_t step) const {
  check_step(step);
  if (step == 0) return lr_;
  return lr_ * std::pow(gamma_, double((step - 1) / step_size_));
}

}  // namespace nn
}  // namespace cf
