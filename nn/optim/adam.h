#pragma once
// Adam and AdamW: PyTorch's torch.optim.Adam / AdamW updates (amsgrad off),
// per parameter p with gradient g (t = this parameter's update count, from 1):
//
//   Adam:  g = g + weight_decay * p           (L2, into the gradient)
//   AdamW: p = p * (1 - lr * weight_decay)    (decoupled, before the update)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   step_size = lr / (1 - beta1^t)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p = p - step_size * m / denom
//
// (PyTorch writes the first moment as m.lerp_(g, 1 - beta1), which is the same
// formula up to rounding.) State dict slots: "exp_avg.<name>",
// "exp_avg_sq.<name>" and "step.<name>", plus "step" and "lr" (optimizer.h).
#include "nn/optim/optimizer.h"

namespace cf {
namespace nn {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Adam: L2 penalty added to the gradient (default 0). AdamW: decoupled decay.
  double weight_decay = 0.0;
};

class Adam : public Optimizer {
 public:
  Adam(const StateDict& params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options = {});
  const AdamOptions& options() const { return opt_; }

 protected:
  Adam(const char* name, std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled);
  void update(Entry& e, const Tensor& grad, double lr, double weight_decay) override;
  // The batchable parameters' steps (masters included) in one call (ops::adam_steps_).
  void update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads, const std::vector<double>& lrs,
                  const std::vector<double>& weight_decays) override;

 private:
  AdamOptions opt_;
  bool decoupled_ = false;
};

// AdamW's options: PyTorch's defaults, weight_decay 1e-2.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

// AdamW: decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization").
class AdamW : public Adam {
 public:
  AdamW(const StateDict& params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
};

}  // namespace nn
}  // namespace cf
