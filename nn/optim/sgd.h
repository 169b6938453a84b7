#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum and
// L2 weight decay: PyTorch's torch.optim.SGD update, per parameter p with
// gradient g (t = this parameter's update count, 1 on its first update):
//
//   d = g + weight_decay * p                  (when weight_decay != 0)
//   if momentum != 0:
//     buf = d                                 (t == 1)
//     buf = momentum * buf + (1 - dampening) * d   (t > 1)
//     d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
//
// State dict slots: "momentum.<name>" and "step.<name>" when momentum != 0
// (none otherwise), plus "step" and "lr" (see optimizer.h).
#include "nn/optim/optimizer.h"

namespace cf {
namespace nn {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  double weight_decay = 0.0;
};

class SGD : public Optimizer {
 public:
  SGD(const StateDict& params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});
  const SGDOptions& options() const { return opt_; }

 protected:
  void update(Entry& e, const Tensor& grad, double lr, double weight_decay) override;
  // The batchable parameters' steps (masters included) in one call (ops::sgd_steps_).
  void update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads, const std::vector<double>& lrs,
                  const std::vector<double>& weight_decays) override;

 private:
  SGDOptions opt_;
};

}  // namespace nn
}  // namespace cf
