#include "nn/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/random.h"
#include "core/error.h"

namespace cf {
namespace nn {
namespace init {

namespace {
void check(const Tensor& t, const char* fn) {
  CF_CHECK(t.defined(), ValueError, "[init::", fn, "] tensor is undefined");
  CF_CHECK(is_floating(t.dtype()), DTypeError, "[init::", fn, "] needs a float tensor, got ", t.dtype());
}
// The initializers that draw: the target is checked before the generator moves (copy_ refused an expand()
// view only after the draw had advanced it).
void check_drawn(const Tensor& t, const char* fn) {
  check(t, fn);
  CF_CHECK(!t.has_internal_overlap(), ValueError, "[init::", fn, "] the tensor ", t.describe(),
           " has elements that share memory (an expand() view): it cannot take one drawn value per element; "
           "initialize a copy (contiguous())");
}
void assign(Tensor& t, const Tensor& values) {
  NoGradGuard ng;
  copy_(t, values);
}
}  // namespace

Fans fans(const Tensor& t) {
  CF_CHECK(t.dim() >= 1, ShapeError, "[init] fan in/out needs at least 1 dimension, got shape ",
           shape_str(t.shape()));
  if (t.dim() == 1) return {t.shape()[0], t.shape()[0]};
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.shape()[size_t(d)];
  return {t.shape()[1] * receptive, t.shape()[0] * receptive};
}

void zeros_(Tensor& t) { constant_(t, 0.0); }
void ones_(Tensor& t) { constant_(t, 1.0); }
void constant_(Tensor& t, double value) {
  check(t, "constant_");
  NoGradGuard ng;
  fill_(t, value);
}
void uniform_(Tensor& t, double low, double high, Generator& gen) {
  check_drawn(t, "uniform_");
  CF_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, ValueError,
           "[init::uniform_] needs finite low <= high, got low ", low, " high ", high);
  if (t.numel() == 0) return;  // nothing to draw (no random numbers taken, as PyTorch)
  if (low == high) return constant_(t, low);  // U(a, a) is a (rand takes low < high only)
  assign(t, rand(t.shape(), t.dtype(), gen, low, high, t.device()));
}
void normal_(Tensor& t, double mean, double std, Generator& gen) {
  check_drawn(t, "normal_");
  CF_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, ValueError,
           "[init::normal_] needs a finite mean and a finite std >= 0, got mean ", mean, " std ", std);
  if (t.numel() == 0) return;
  assign(t, randn(t.shape(), t.dtype(), gen, mean, std, t.device()));
}
// The fan-based initializers of a tensor with no element do nothing (a zero fan gave an infinite bound,
// refused by rand/randn under their own names).
void xavier_uniform_(Tensor& t, double gain, Generator& gen) {
  check_drawn(t, "xavier_uniform_");
  if (t.numel() == 0) return;
  Fans f = fans(t);
  double a = gain * std::sqrt(6.0 / double(f.in + f.out));
  uniform_(t, -a, a, gen);
}
void xavier_normal_(Tensor& t, double gain, Generator& gen) {
  check_drawn(t, "xavier_normal_");
  if (t.numel() == 0) return;
  Fans f = fans(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / double(f.in + f.out)), gen);
}
void kaiming_uniform_(Tensor& t, double a, Generator& gen) {
  check_drawn(t, "kaiming_uniform_");
  if (t.numel() == 0) return;
  Fans f = fans(t);
  double bound = std::sqrt(3.0) * std::sqrt(2.0 / (1.0 + a * a)) / std::sqrt(double(f.in));
  uniform_(t, -bound, bound, gen);
}
void kaiming_normal_(Tensor& t, double a, Generator& gen) {
  check_drawn(t, "kaiming_normal_");
  if (t.numel() == 0) return;
  Fans f = fans(t);
  normal_(t, 0.0, std::sqrt(2.0 / (1.0 + a * a)) / std::sqrt(double(f.in)), gen);
}

}  // namespace init
}  // namespace nn
}  // namespace cf
