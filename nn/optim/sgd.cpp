#include "nn/optim/sgd.h"

#include <cmath>

#include "autograd/ops/elementwise.h"

namespace cf {
namespace nn {

namespace {

template <typename T>
void sgd_loop(T* p, const T* g, T* buf, int64_t n, double lr_d, double wd_d, double mom_d,
              double damp_d, bool nesterov, bool first) {
  const T lr = T(lr_d), wd = T(wd_d), mom = T(mom_d), keep = T(1.0 - damp_d);
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if (wd != T(0)) d = d + wd * p[i];
    if (buf) {
      T b = first ? d : buf[i] * mom + keep * d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] = p[i] + (-lr) * d;
  }
}

}  // namespace

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

void SGD::update(Entry& e, const Tensor& grad, double lr, double wd) {
  const bool has_buf = !e.slots.empty();
  const bool first = e.step == 1;
  Tensor& p = e.param;
  if (detail::fast_path(p)) {
    Tensor g = contiguous(grad);
    int64_t n = p.numel();
    if (p.dtype() == kFloat32)
      sgd_loop<float>(p.data<float>(), g.data<float>(), has_buf ? e.slots[0].data<float>() : nullptr,
                      n, lr, wd, opt_.momentum, opt_.dampening, opt_.nesterov, first);
    else
      sgd_loop<double>(p.data<double>(), g.data<double>(),
                       has_buf ? e.slots[0].data<double>() : nullptr, n, lr, wd, opt_.momentum,
                       opt_.dampening, opt_.nesterov, first);
    p.bump_version();
    if (has_buf) e.slots[0].bump_version();
    return;
  }
  // Device-neutral path through the public in-place ops.
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
