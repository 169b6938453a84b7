#include "autograd/autocast.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"

namespace cf {

namespace {
thread_local std::optional<DType> g_autocast;
}  // namespace

std::optional<DType> autocast_dtype() { return g_autocast; }
void set_autocast_dtype(std::optional<DType> dtype) { g_autocast = dtype; }

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : prev_(g_autocast) {
  CF_CHECK(!dtype || is_low_precision(*dtype), DTypeError,
           "[AutocastGuard] autocast runs in bfloat16 or float16, got ", *dtype);
  g_autocast = dtype;
}

namespace {
// x in dtype with x's layout when x is a dense tensor's axes in another order (nn::Linear's transposed weight):
// cast through the permutation that makes it contiguous, so the copy is the row tiers' contiguous
// conversion (a strided element loop was 5% of a float16 training step) and matmul reads the result
// transposed, as it read x. Other layouts take to()'s contiguous result.
Tensor cast_keeping_layout(const Tensor& x, DType dtype) {
  if (x.is_contiguous() || x.dim() < 2) return to(x, dtype);
  std::vector<int64_t> order(size_t(x.dim()));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return x.strides()[size_t(a)] > x.strides()[size_t(b)]; });
  Tensor dense = permute(x, order);
  if (!dense.is_contiguous()) return to(x, dtype);
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) back[size_t(order[i])] = int64_t(i);
  return permute(to(dense, dtype), back);
}
}  // namespace

namespace autocast {
Tensor to_low(const Tensor& x) {
  // float64 is not eligible (as in PyTorch): float64 work such as gradchecks keeps its precision
  if (!g_autocast || !x.defined() || !is_floating(x.dtype()) || x.dtype() == kFloat64 ||
      x.dtype() == *g_autocast)
    return x;
  return cast_keeping_layout(x, *g_autocast);
}
Tensor to_float32(const Tensor& x) {
  if (!g_autocast || !x.defined() || !is_low_precision(x.dtype())) return x;
  return cast_keeping_layout(x, kFloat32);
}
}  // namespace autocast

}  // namespace cf
