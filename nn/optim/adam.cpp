#include "nn/optim/adam.h"

#include <cmath>

#include "autograd/ops/elementwise.h"

namespace cf {
namespace nn {

namespace {

template <typename T>
void adam_loop(T* p, const T* g, T* m, T* v, int64_t n, double lr, double wd, bool decoupled,
               double b1_d, double b2_d, double eps_d, int64_t t) {
  const double bc1 = 1.0 - std::pow(b1_d, double(t));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2_d, double(t)));
  const T step_size = T(lr / bc1), bc2s = T(bc2_sqrt), eps = T(eps_d);
  const T b1 = T(b1_d), b2 = T(b2_d), a1 = T(1.0 - b1_d), a2 = T(1.0 - b2_d);
  const T l2 = decoupled ? T(0) : T(wd);
  const T shrink = T(1.0 - lr * wd);
  const bool do_shrink = decoupled && wd != 0;
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    T gi = g[i];
    if (l2 != T(0)) gi = gi + l2 * pi;
    if (do_shrink) pi = pi * shrink;
    T mi = m[i] * b1 + a1 * gi;
    T vi = v[i] * b2 + a2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    T denom = std::sqrt(vi) / bc2s + eps;
    p[i] = pi + (-step_size) * (mi / denom);
  }
}

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

void Adam::update(Entry& e, const Tensor& grad, double lr, double wd) {
  Tensor& p = e.param;
  Tensor& m = e.slots[0];
  Tensor& v = e.slots[1];
  if (detail::fast_path(p)) {
    Tensor g = contiguous(grad);
    int64_t n = p.numel();
    if (p.dtype() == kFloat32)
      adam_loop<float>(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), n, lr,
                       wd, decoupled_, opt_.beta1, opt_.beta2, opt_.eps, e.step);
    else
      adam_loop<double>(p.data<double>(), g.data<double>(), m.data<double>(), v.data<double>(), n,
                        lr, wd, decoupled_, opt_.beta1, opt_.beta2, opt_.eps, e.step);
    p.bump_version();
    m.bump_version();
    v.bump_version();
    return;
  }
  // Device-neutral path through the public ops (same formulas).
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
