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

// sum |g / scale|^p over every defined gradient, in float64
double p_sum(const std::vector<Tensor>& params, double p, double scale) {
  double total = 0;
  for (const Tensor& q : params) {
    Tensor g = q.grad();
    if (g.defined() && g.numel() > 0) total += to(sum(pow(abs(div(to(g, kFloat64), scale)), p)), kFloat64).item<double>();
  }
  return total;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type, "grad_norm");
  NoGradGuard no_grad;
  for (const Tensor& p : params) CF_CHECK(p.defined(), ValueError, "[grad_norm] a parameter is an undefined tensor");
  if (std::isinf(norm_type)) return largest_magnitude(params);
  if (norm_type != 2.0) {
    // |g|^p overflows or underflows double sooner than the squares (1e-4 to the 100th is 0, to the 81st a
    // subnormal with few digits): taken over the gradients divided by their largest magnitude when the plain sum
    // is not finite or below the normal range (a finite norm then comes out finite, a nonzero one nonzero and
    // accurate)
    const double plain = p_sum(params, norm_type, 1.0);
    if (std::isfinite(plain) && plain >= std::numeric_limits<double>::min()) return std::pow(plain, 1.0 / norm_type);
    const double largest = largest_magnitude(params);
    if (!std::isfinite(largest) || largest == 0) return largest;  // inf or NaN, or every gradient zero
    return largest * std::pow(p_sum(params, norm_type, largest), 1.0 / norm_type);
  }
  double total = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) total += ops::sum_squares(g);
  }
  if (!std::isinf(total)) return std::sqrt(total);
  // The squares overflowed double: float64 gradients beyond ~1e154 (or a gradient of inf). Taken again
  // over the gradients divided by their largest magnitude, so a finite norm comes out finite (it was inf,
  // and clip_grad_norm then left the gradients unclipped as if one were non-finite).
  const double largest = largest_magnitude(params);
  if (!std::isfinite(largest)) return largest;  // an inf gradient
  double scaled = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) scaled += ops::sum_squares(div(to(g, kFloat64), largest));
  }
  return largest * std::sqrt(scaled);
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

void scale_grads(const std::vector<Tensor>& params, double factor) {
  CF_CHECK(std::isfinite(factor), ValueError, "[scale_grads] factor must be finite, got ", factor);
  rescale(params, factor);
}
void scale_grads(const StateDict& params, double factor) { scale_grads(tensors_of(params), factor); }

}  // namespace nn
}  // namespace cf
