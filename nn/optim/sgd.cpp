#include "nn/optim/sgd.h"

#include <cmath>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/optim.h"

namespace cf {
namespace nn {

SGD::SGD(const StateDict& params, const SGDOptions& options) : SGD(single_group(params), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& o)
    : Optimizer("SGD", std::move(groups), o.lr, o.weight_decay,
                o.momentum != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{}),
      opt_(o) {
  check_hyper(std::isfinite(o.momentum) && o.momentum >= 0, "[SGD]",
              str("momentum must be finite and >= 0, got ", o.momentum));
  check_hyper(std::isfinite(o.dampening), "[SGD]", str("dampening must be finite, got ", o.dampening));
  check_hyper(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "[SGD]",
              str("Nesterov momentum needs momentum > 0 and dampening == 0, got momentum ",
                  o.momentum, " and dampening ", o.dampening));
}

namespace {
ops::SgdStep sgd_step_of(const SGDOptions& o, bool first, double lr, double wd) {
  ops::SgdStep s;
  s.lr = lr;
  s.weight_decay = wd;
  s.momentum = o.momentum;
  s.dampening = o.dampening;
  s.nesterov = o.nesterov;
  s.first = first;
  return s;
}
}  // namespace

void SGD::update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads,
                     const std::vector<double>& lrs, const std::vector<double>& wds) {
  update_batched<kernels::SgdTensors>(
      entries, grads, lrs, wds,
      [this](const Entry& e, const Tensor& g, double lr, double wd) {
        return kernels::SgdTensors{step_target(e), g, e.slots.empty() ? Tensor() : e.slots[0],
                                   sgd_step_of(opt_, e.step == 1, lr, wd), low_param(e)};
      },
      ops::sgd_steps_);
}

void SGD::update(Entry& e, const Tensor& grad, double lr, double wd) {
  const bool has_buf = !e.slots.empty();
  const bool first = e.step == 1;
  Tensor& p = e.param;
  if (ops::fused_step_supported(p) && (!has_buf || e.slots[0].is_contiguous())) {  // one fused pass on p's device (kernels/optim)
    ops::sgd_step_(p, grad, has_buf ? e.slots[0] : Tensor(), sgd_step_of(opt_, first, lr, wd));
    return;
  }
  // A strided parameter or buffer (16-bit parameters arrive as float32 masters):
  // the same update from in-place elementwise ops.
  Tensor d = grad;
  if (wd != 0) d = add(d, mul(p, wd));
  if (has_buf) {
    Tensor& buf = e.slots[0];
    if (first) {
      copy_(buf, d);
    } else {
      mul_(buf, opt_.momentum);
      add_(buf, d, 1.0 - opt_.dampening);
    }
    d = opt_.nesterov ? add(d, mul(buf, opt_.momentum)) : buf;
  }
  add_(p, d, -lr);
}

}  // namespace nn
}  // namespace cf
