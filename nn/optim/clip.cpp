#include "nn/optim/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/optim.h"
#include "autograd/ops/reduce.h"

namespace cf {
namespace nn {

namespace {

std::vector<Tensor> tensors_of(const StateDict& params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const auto& kv : params) out.push_back(kv.second);
  return out;
}

void rescale(const std::vector<Tensor>& params, double factor) {
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    CF_CHECK(p.defined(), ValueError, "[scale_grads] a parameter is an undefined tensor");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // A 16-bit gradient is scaled in float32 and rounded once: the factor taken in its dtype overflows
    // (1e5 is inf in float16, so 1e-4 * 1e5 gave inf, not 10) or loses its digits.
    p.set_grad(is_low_precision(g.dtype()) ? to(mul(to(g, kFloat32), factor), g.dtype()) : mul(g, factor));
  }
}

void check_norm_type(double p, const char* op) {
  CF_CHECK(p > 0, ValueError, "[", op, "] norm_type must be > 0 (inf: the largest magnitude), got ", p);
}

// max |g| over every defined gradient (0 when none has one), one read per gradient; NaN when one holds a NaN.
double largest_magnitude(const std::vector<Tensor>& params) {
  double largest = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const double m = to(amax(abs(g)), kFloat64).item<double>();
    if (std::isnan(m)) return m;
    largest = std::max(largest, m);
  }
  return largest;
}

// sum |g / scale|^p over every defined gradient, accumulated in double (squares through ops::sum_squares,
// which takes the gradient in its own dtype when no scale applies)
double power_sum(const std::vector<Tensor>& params, double p, double scale) {
  double total = 0;
  for (const Tensor& q : params) {
    Tensor g = q.grad();
    if (!g.defined() || g.numel() == 0) continue;
    if (p == 2.0 && scale == 1.0) {
      total += ops::sum_squares(g);
      continue;
    }
    const Tensor s = div(to(g, kFloat64), scale);
    total += p == 2.0 ? ops::sum_squares(s) : to(sum(pow(abs(s), p)), kFloat64).item<double>();
  }
  return total;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type, "grad_norm");
  NoGradGuard no_grad;
  for (const Tensor& p : params) CF_CHECK(p.defined(), ValueError, "[grad_norm] a parameter is an undefined tensor");
  if (std::isinf(norm_type)) return largest_magnitude(params);
  // |g|^p overflows or underflows double (squares of float64 gradients beyond ~1e154 or below ~1e-154; 1e-4 to
  // the 100th is 0, to the 81st a subnormal with few digits): taken again over the gradients divided by their
  // largest magnitude when the plain sum is not finite or below the normal range, so a finite norm comes out
  // finite (an inf one left the gradients unclipped as if one were non-finite) and a nonzero one nonzero
  auto root = [norm_type](double sum) { return norm_type == 2.0 ? std::sqrt(sum) : std::pow(sum, 1.0 / norm_type); };
  const double plain = power_sum(params, norm_type, 1.0);
  if (std::isfinite(plain) && plain >= std::numeric_limits<double>::min()) return root(plain);
  const double largest = largest_magnitude(params);
  if (!std::isfinite(largest) || largest == 0) return largest;  // inf or NaN, or every gradient zero
  return largest * root(power_sum(params, norm_type, largest));
}
double grad_norm(const StateDict& params, double norm_type) { return grad_norm(tensors_of(params), norm_type); }

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite, double norm_type) {
  CF_CHECK(max_norm > 0, ValueError, "[clip_grad_norm] max_norm must be > 0, got ", max_norm);
  check_norm_type(norm_type, "clip_grad_norm");
  double norm = grad_norm(params, norm_type);
  if (!std::isfinite(norm)) {
    CF_CHECK(!error_if_nonfinite, ValueError, "[clip_grad_norm] the total gradient norm is ", norm,
             "; the gradients were left unchanged");
    return norm;
  }
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) rescale(params, coef);
  return norm;
}
double clip_grad_norm(const StateDict& params, double max_norm, bool error_if_nonfinite, double norm_type) {
  return clip_grad_norm(tensors_of(params), max_norm, error_if_nonfinite, norm_type);
}

Tensor grad_norm_tensor(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type, "grad_norm_tensor");
  NoGradGuard no_grad;
  Device dev = Device::cpu();
  for (size_t i = 0; i < params.size(); ++i) {
    CF_CHECK(params[i].defined(), ValueError, "[grad_norm_tensor] a parameter is an undefined tensor");
    if (i == 0) dev = params[i].device();
  }
  const bool largest = std::isinf(norm_type);
  Tensor total;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    if (!total.defined()) dev = g.device();
    CF_CHECK(g.device() == dev, ValueError, "[grad_norm_tensor] the gradients are on ", dev.str(), " and ",
             g.device().str(), ": one device at a time");
    // the reductions ops::sum_squares and grad_norm's other forms run on a CUDA gradient
    const Tensor g64 = to(g, kFloat64);
    const Tensor part = largest            ? amax(abs(g64))
                        : norm_type == 2.0 ? sum(mul(g64, g64))
                                           : sum(pow(abs(g64), norm_type));
    if (!total.defined())
      total = part;
    else if (largest)  // (maximum propagates a NaN, as largest_magnitude returns it)
      total = maximum(total, part);
    else
      total = add(total, part);
  }
  if (!total.defined()) return Tensor::zeros({}, kFloat64, dev);
  if (largest) return total;
  return norm_type == 2.0 ? sqrt(total) : pow(total, 1.0 / norm_type);
}

Tensor clip_grad_norm_tensor(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  CF_CHECK(max_norm > 0, ValueError, "[clip_grad_norm_tensor] max_norm must be > 0, got ", max_norm);
  check_norm_type(norm_type, "clip_grad_norm_tensor");
  const Tensor norm = grad_norm_tensor(params, norm_type);
  NoGradGuard no_grad;
  // max_norm / (norm + 1e-6) in double as clip_grad_norm's; a norm is finite when norm - norm is 0
  // (inf - inf and NaN are NaN)
  const Tensor coef = div(full_like(norm, max_norm), add(norm, 1e-6));
  const Tensor clip = logical_and(eq(sub(norm, norm), 0.0), lt(coef, 1.0));
  const Tensor factor = where(clip, coef, 1.0);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // (rescale's arithmetic: the factor rounded to the gradient's dtype, 16-bit gradients scaled in float32)
    p.set_grad(is_low_precision(g.dtype()) ? to(mul(to(g, kFloat32), to(factor, kFloat32)), g.dtype())
                                           : mul(g, to(factor, g.dtype())));
  }
  return norm;
}

void scale_grads(const std::vector<Tensor>& params, double factor) {
  CF_CHECK(std::isfinite(factor), ValueError, "[scale_grads] factor must be finite, got ", factor);
  rescale(params, factor);
}
void scale_grads(const StateDict& params, double factor) { scale_grads(tensors_of(params), factor); }

}  // namespace nn
}  // namespace cf
