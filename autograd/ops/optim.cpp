#include "autograd/ops/optim.h"

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "core/error.h"

namespace cf::ops {

namespace {

// The state tensors the kernels write through raw pointers: p's shape, dtype
// and device, contiguous.
void check_state(const char* op, const Tensor& p, const Tensor& t, const char* name) {
  CF_CHECK(t.defined() && t.is_contiguous() && t.shape() == p.shape() && t.dtype() == p.dtype() &&
               t.device() == p.device(),
           ValueError, "[", op, "] ", name, " must be a contiguous tensor of the parameter's shape, dtype and "
           "device ", p.describe(), ", got ", t.defined() ? t.describe() : std::string("undefined"));
}

Tensor checked_grad(const char* op, const Tensor& p, const Tensor& g) {
  CF_CHECK(fused_step_supported(p), ValueError, "[", op, "] the parameter must be a contiguous float32 or float64 "
           "tensor, got ", p.defined() ? p.describe() : std::string("undefined"));
  CF_CHECK(g.defined() && g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), ValueError,
           "[", op, "] the gradient must have the parameter's shape, dtype and device ", p.describe(), ", got ",
           g.defined() ? g.describe() : std::string("undefined"));
  return contiguous(g);
}

}  // namespace

bool fused_step_supported(const Tensor& p) {
  return p.defined() && p.is_contiguous() && (p.dtype() == kFloat32 || p.dtype() == kFloat64);
}

double sum_squares(const Tensor& g) {
  ops::check_defined(g, "sum_squares", "g");
  if (g.device().is_cpu() && g.is_contiguous() && (g.dtype() == kFloat32 || g.dtype() == kFloat64))
    return kernels::sum_squares_cpu(g);
  Tensor g64 = to(g, kFloat64);
  return sum(mul(g64, g64)).item();
}

void adam_step_(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s) {
  const Tensor gc = checked_grad("adam_step", p, g);
  check_state("adam_step", p, m, "exp_avg");
  check_state("adam_step", p, v, "exp_avg_sq");
  CF_CHECK(s.step >= 1, ValueError, "[adam_step] step must be >= 1, got ", s.step);
  kernels::adam_step(p, gc, m, v, s);
  for (const Tensor* t : {&p, &m, &v}) t->bump_version();
}

void adam_steps_(std::vector<kernels::AdamTensors> steps) {
  for (kernels::AdamTensors& t : steps) {
    t.g = checked_grad("adam_step", t.p, t.g);
    check_state("adam_step", t.p, t.m, "exp_avg");
    check_state("adam_step", t.p, t.v, "exp_avg_sq");
    CF_CHECK(t.s.step >= 1, ValueError, "[adam_step] step must be >= 1, got ", t.s.step);
  }
  // Runs of one device and dtype, in order (a model's parameters are one run).
  for (size_t first = 0; first < steps.size();) {
    size_t end = first + 1;
    while (end < steps.size() && steps[end].p.device() == steps[first].p.device() &&
           steps[end].p.dtype() == steps[first].p.dtype())
      ++end;
    kernels::adam_steps(std::vector<kernels::AdamTensors>(steps.begin() + long(first), steps.begin() + long(end)));
    for (size_t i = first; i < end; ++i)
      for (const Tensor* x : {&steps[i].p, &steps[i].m, &steps[i].v}) x->bump_version();
    first = end;
  }
}

void sgd_step_(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  const Tensor gc = checked_grad("sgd_step", p, g);
  if (buf.defined()) check_state("sgd_step", p, buf, "momentum");
  kernels::sgd_step(p, gc, buf, s);
  p.bump_version();
  if (buf.defined()) buf.bump_version();
}

}  // namespace cf::ops
