#include "autograd/ops/random.h"

#include <cmath>
#include <limits>

#include "core/cuda_graph.h"
#include "core/half.h"
#include "kernels/random/random.h"

namespace cf {

namespace {
Tensor draw(const Shape& shape, DType dtype, Generator& gen, Device device, kernels::RandomParams p) {
  Tensor out = Tensor::empty(shape, dtype, device);
  p.philox_rebase = cuda::philox_rebase_for(gen, device, "random");  // (before the reservation)
  p.seed = gen.seed();
  p.counter0 = gen.reserve(uint64_t(out.numel()));
  kernels::random_fill(out, p);
  return out;
}
// The largest finite value of a float dtype.
double largest_finite(DType dtype) {
  return dtype == kFloat16    ? double(float(std::numeric_limits<Half>::max()))
         : dtype == kBFloat16 ? double(float(std::numeric_limits<BFloat16>::max()))
         : dtype == kFloat32  ? double(std::numeric_limits<float>::max())
                              : std::numeric_limits<double>::max();
}
// The smallest value of T at or above low (rand's draws land in [it, high) after their one-step fix-ups).
template <typename T>
double first_at_or_above(double low) {
  T v = T(low);
  if (double(v) < low) v = next_above(v);
  return double(v);
}
double first_at_or_above(DType dtype, double low) {
  return dtype == kFloat16    ? first_at_or_above<Half>(low)
         : dtype == kBFloat16 ? first_at_or_above<BFloat16>(low)
         : dtype == kFloat32  ? first_at_or_above<float>(low)
                              : low;
}
}  // namespace

Tensor rand(const Shape& shape, DType dtype, Generator& gen, double low, double high, Device device) {
  CF_CHECK(is_floating(dtype), DTypeError, "[rand] dtype must be a float dtype, got ", dtype);
  CF_CHECK(std::isfinite(low) && std::isfinite(high) && low < high, ValueError,
           "[rand] needs finite low < high, got [", low, ", ", high, ")");
  // The width must be finite (rand(-1e308, 1e308) gave 1.8e308 everywhere) and both bounds within the
  // dtype's range (float16 rand(7e4, 8e4) gave 65504, below low, and rand(-1e5, 1e5) gave -inf).
  const double top = largest_finite(dtype);
  CF_CHECK(std::isfinite(high - low) && std::fabs(low) <= top && std::fabs(high) <= top, ValueError,
           "[rand] the bounds [", low, ", ", high, ") and their width must lie within ", dtype, "'s range (|x| <= ",
           top, ")");
  // (bfloat16 [0.7, 0.701): a draw stepped up past high, then back below low)
  CF_CHECK(first_at_or_above(dtype, low) < high, ValueError, "[rand] [", low, ", ", high, ") holds no ", dtype,
           " value (the first at or above low is ", first_at_or_above(dtype, low), ")");
  return draw(shape, dtype, gen, device, {kernels::RandomKind::Uniform, low, high});
}

Tensor randn(const Shape& shape, DType dtype, Generator& gen, double mean, double std, Device device) {
  CF_CHECK(is_floating(dtype), DTypeError, "[randn] dtype must be a float dtype, got ", dtype);
  CF_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, ValueError,
           "[randn] needs finite mean and std >= 0, got mean ", mean, ", std ", std);
  // within the dtype's range, as rand's bounds (float32 randn(0, 1e39) filled infinities)
  const double top = largest_finite(dtype);
  CF_CHECK(std::fabs(mean) <= top && std <= top, ValueError, "[randn] mean ", mean, " and std ", std,
           " must lie within ", dtype, "'s range (|x| <= ", top, ")");
  return draw(shape, dtype, gen, device, {kernels::RandomKind::Normal, mean, std});
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, Device device) {
  CF_CHECK(low < high, ValueError, "[randint] needs low < high, got [", low, ", ", high, ")");
  kernels::RandomParams p;
  p.kind = kernels::RandomKind::Integer;
  p.low = low;
  p.span = uint64_t(high) - uint64_t(low);  // modulo 2^64: exact for every low < high
  return draw(shape, kInt64, gen, device, p);
}

Tensor bernoulli(const Shape& shape, double p, Generator& gen, Device device) {
  CF_CHECK(p >= 0 && p <= 1, ValueError, "[bernoulli] probability must be in [0, 1], got ", p);
  return draw(shape, kBool, gen, device, {kernels::RandomKind::Bernoulli, p, 0});
}

}  // namespace cf
