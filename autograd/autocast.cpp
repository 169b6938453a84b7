#include "autograd/autocast.h"

#include "autograd/ops/elementwise.h"

namespace cf {

namespace {
thread_local std::optional<DType> g_autocast;
}

std::optional<DType> autocast_dtype() { return g_autocast; }
void set_autocast_dtype(std::optional<DType> dtype) { g_autocast = dtype; }

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : prev_(g_autocast) {
  CF_CHECK(!dtype || is_low_precision(*dtype), DTypeError,
           "[AutocastGuard] autocast runs in bfloat16 or float16, got ", *dtype);
  g_autocast = dtype;
}

namespace autocast {
Tensor to_low(const Tensor& x) {
  // float64 is not eligible (as in PyTorch): float64 work such as gradchecks keeps its precision
  if (!g_autocast || !x.defined() || !is_floating(x.dtype()) || x.dtype() == kFloat64 ||
      x.dtype() == *g_autocast)
    return x;
  return to(x, *g_autocast);
}
Tensor to_float32(const Tensor& x) {
  if (!g_autocast || !x.defined() || !is_low_precision(x.dtype())) return x;
  return to(x, kFloat32);
}
}  // namespace autocast

}  // namespace cf
