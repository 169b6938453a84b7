#pragma once
// Learning-rate schedules: step -> learning rate.
//
// Convention: `step` is the 1-based number of the update about to be applied,
// i.e. optimizer.step_count() + 1; apply(opt) sets opt's lr for its next step().
// lr_at(0) is defined (it is the value "before training"), negative steps are an
// error. Every schedule is a pure function of the step, so resuming from a
// checkpoint only needs the optimizer's step count.
//
//   ConstantLR:     lr
//   InverseSqrtLR:  lr * min(step / warmup, sqrt(warmup / step))
//                   (linear warmup to lr at step == warmup, then lr*sqrt(warmup/step);
//                   "Attention is all you need", eq. 3, with its d_model^-0.5 factor
//                   folded into lr: lr = d_model^-0.5 * warmup^-0.5 reproduces it.)
//   WarmupCosineLR: step <= warmup:  lr * step / warmup
//                   warmup < step < total:
//                     min_lr + (lr - min_lr) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
//                   step >= total:   min_lr
//                   (the peak lr is update `warmup`'s, and the last update, number total, gets
//                   min_lr; with warmup 0 no update gets the peak: update 1 has the cosine's first
//                   step, one step ahead of PyTorch's CosineAnnealingLR(T_max = total), whose
//                   epoch 0 is the peak)
//   StepLR:         lr * gamma^floor((step - 1) / step_size)   (steps 1..step_size get lr;
//                   PyTorch's StepLR with its 0-based count = step - 1); lr_at(0) = lr.
#include <cstdint>
#include <memory>
#include <string>

namespace cf {
namespace nn {

class Optimizer;

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  // The learning rate for the update numbered `step` (1-based).
  virtual double lr_at(int64_t step) const = 0;
  // lr_at(step) / the peak (base) learning rate.
  double multiplier(int64_t step) const;
  double base_lr() const { return lr_; }
  // Sets opt's lr to lr_at(opt.step_count() + 1) and returns it. Call before step().
  double apply(Optimizer& opt) const;

 protected:
  LRSchedule(const char* name, double lr);
  void check_step(int64_t step) const;
  std::string name_;
  double lr_;
};

class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr);
  double lr_at(int64_t step) const override;
};

class InverseSqrtLR : public LRSchedule {
 public:
  InverseSqrtLR(double lr, int64_t warmup);
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_;
};

class WarmupCosineLR : public LRSchedule {
 public:
  // warmup may be 0 (no warmup); total > warmup; 0 <= min_lr <= lr.
  WarmupCosineLR(double lr, int64_t warmup, int64_t total, double min_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

class StepLR : public LRSchedule {
 public:
  StepLR(double lr, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

}  // namespace nn
}  // namespace cf
