#include "nn/optim/adam.h"

#include <cmath>
#include <vector>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/optim.h"

namespace cf {
namespace nn {

namespace {

void check_adam(const char* name, const AdamOptions& o) {
  const std::string w = str("[", name, "]");
  CF_CHECK(std::isfinite(o.beta1) && o.beta1 >= 0 && o.beta1 < 1, ValueError, w,
           " beta1 must be in [0, 1), got ", o.beta1);
  CF_CHECK(std::isfinite(o.beta2) && o.beta2 >= 0 && o.beta2 < 1, ValueError, w,
           " beta2 must be in [0, 1), got ", o.beta2);
  CF_CHECK(std::isfinite(o.eps) && o.eps >= 0, ValueError, w, " eps must be finite and >= 0, got ",
           o.eps);
}

}  // namespace

Adam::Adam(const StateDict& params, const AdamOptions& options)
    : Adam("Adam", single_group(params), options, false) {}
Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options)
    : Adam("Adam", std::move(groups), options, false) {}
Adam::Adam(const char* name, std::vector<ParamGroup> groups, const AdamOptions& o, bool decoupled)
    : Optimizer(name, std::move(groups), o.lr, o.weight_decay, {"exp_avg", "exp_avg_sq"}),
      opt_(o),
      decoupled_(decoupled) {
  check_adam(name, o);
}

AdamW::AdamW(const StateDict& params, const AdamWOptions& options)
    : Adam("AdamW", single_group(params), options, true) {}
AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Adam("AdamW", std::move(groups), options, true) {}

namespace {
// Whether e's update is one fused pass on its device (kernels/optim).
bool fused_adam(const Tensor& p, const Tensor& m, const Tensor& v) {
  return ops::fused_step_supported(p) && m.is_contiguous() && v.is_contiguous();
}

ops::AdamStep adam_step_of(const AdamOptions& o, bool decoupled, int64_t step, double lr, double wd) {
  ops::AdamStep s;
  s.lr = lr;
  s.weight_decay = wd;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.eps = o.eps;
  s.step = step;
  s.decoupled = decoupled;
  return s;
}

}  // namespace

void Adam::update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads,
                      const std::vector<double>& lrs, const std::vector<double>& wds) {
  update_batched<kernels::AdamTensors>(
      entries, grads, lrs, wds,
      [this](const Entry& e, const Tensor& g, double lr, double wd) {
        return kernels::AdamTensors{
            step_target(e), g, e.slots[0], e.slots[1], adam_step_of(opt_, decoupled_, e.step, lr, wd), low_param(e)};
      },
      ops::adam_steps_);
}

void Adam::update(Entry& e, const Tensor& grad, double lr, double wd) {
  Tensor& p = e.param;
  Tensor& m = e.slots[0];
  Tensor& v = e.slots[1];
  if (fused_adam(p, m, v)) {
    ops::adam_step_(p, grad, m, v, adam_step_of(opt_, decoupled_, e.step, lr, wd));
    return;
  }
  // A strided parameter or state (16-bit parameters arrive as float32 masters):
  // the same formulas from elementwise ops.
  const double bc1 = 1.0 - std::pow(opt_.beta1, double(e.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, double(e.step)));
  Tensor g = grad;
  if (!decoupled_ && wd != 0) g = add(g, mul(p, wd));
  if (decoupled_ && wd != 0) mul_(p, 1.0 - lr * wd);
  mul_(m, opt_.beta1);
  add_(m, g, 1.0 - opt_.beta1);
  mul_(v, opt_.beta2);
  add_(v, mul(g, g), 1.0 - opt_.beta2);
  Tensor denom = add(div(sqrt(v), bc2_sqrt), opt_.eps);
  add_(p, div(m, denom), -(lr / bc1));
}

}  // namespace nn
}  // namespace cf
