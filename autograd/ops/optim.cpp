#include "autograd/ops/optim.h"

#include <array>

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

// A batch entry's gradient, and its 16-bit parameter when p is that parameter's float32 master.
Tensor checked_entry_grad(const char* op, const Tensor& p, const Tensor& g, const Tensor& low) {
  if (!low.defined()) return checked_grad(op, p, g);
  CF_CHECK(fused_step_supported(p) && p.dtype() == kFloat32, ValueError, "[", op,
           "] a master (an entry with a "
           "16-bit parameter) must be a contiguous float32 tensor, got ",
           p.defined() ? p.describe() : std::string("undefined"));
  CF_CHECK(
      low.is_contiguous() && is_low_precision(low.dtype()) && low.shape() == p.shape() && low.device() == p.device(),
      ValueError, "[", op, "] the 16-bit parameter of master ", p.describe(),
      " must be a contiguous bfloat16 or "
      "float16 tensor of its shape and device, got ",
      low.describe());
  CF_CHECK(g.defined() && g.shape() == p.shape() && g.dtype() == low.dtype() && g.device() == p.device(), ValueError,
           "[", op, "] the gradient must have the 16-bit parameter's shape, dtype and device ", low.describe(),
           ", got ", g.defined() ? g.describe() : std::string("undefined"));
  return contiguous(g);
}

// Runs of entries of one device and dtype, in order (a model's parameters are one run), each
// handed to launch(first, end); then the versions of what each entry wrote are bumped.
template <typename Entry, typename Launch, typename Written>
void by_runs(std::vector<Entry>& steps, Launch launch, Written written) {
  for (size_t first = 0; first < steps.size();) {
    size_t end = first + 1;
    while (end < steps.size() && steps[end].p.device() == steps[first].p.device() &&
           steps[end].p.dtype() == steps[first].p.dtype())
      ++end;
    launch(std::vector<Entry>(steps.begin() + long(first), steps.begin() + long(end)));
    for (size_t i = first; i < end; ++i) {
      for (const Tensor* x : written(steps[i]))
        if (x->defined()) x->bump_version();
    }
    first = end;
  }
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
    t.g = checked_entry_grad("adam_step", t.p, t.g, t.low);
    check_state("adam_step", t.p, t.m, "exp_avg");
    check_state("adam_step", t.p, t.v, "exp_avg_sq");
    CF_CHECK(t.s.step >= 1, ValueError, "[adam_step] step must be >= 1, got ", t.s.step);
  }
  by_runs(
      steps, [](const std::vector<kernels::AdamTensors>& run) { kernels::adam_steps(run); },
      [](const kernels::AdamTensors& t) {
        return std::array<const Tensor*, 4>{&t.p, &t.m, &t.v, &t.low};
      });
}

void sgd_step_(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  const Tensor gc = checked_grad("sgd_step", p, g);
  if (buf.defined()) check_state("sgd_step", p, buf, "momentum");
  kernels::sgd_step(p, gc, buf, s);
  p.bump_version();
  if (buf.defined()) buf.bump_version();
}

void sgd_steps_(std::vector<kernels::SgdTensors> steps) {
  for (kernels::SgdTensors& t : steps) {
    t.g = checked_entry_grad("sgd_step", t.p, t.g, t.low);
    if (t.buf.defined()) check_state("sgd_step", t.p, t.buf, "momentum");
  }
  by_runs(
      steps, [](const std::vector<kernels::SgdTensors>& run) { kernels::sgd_steps(run); },
      [](const kernels::SgdTensors& t) {
        return std::array<const Tensor*, 3>{&t.p, &t.buf, &t.low};
      });
}

}  // namespace cf::ops
