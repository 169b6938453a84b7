#include "autograd/ops/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "core/cuda.h"
#include "core/cuda_graph.h"
#include "kernels/elementwise/elementwise.h"

namespace cf::ops {

void check_defined(const Tensor& t, const char* op, const char* arg) {
  CF_CHECK(t.defined(), ValueError, "[", op, "] argument '", arg, "' is an undefined tensor");
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    if (t->device() != first->device()) {
      std::string all;
      for (const Tensor* u : ts)
        if (u->defined()) all += (all.empty() ? "" : ", ") + u->describe();
      throw DeviceError(str("[", op, "] tensors are on different devices: ", all));
    }
  }
}

void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    if (t->dtype() != first->dtype()) {
      std::string all;
      for (const Tensor* u : ts)
        if (u->defined()) all += (all.empty() ? "" : ", ") + u->describe();
      throw DTypeError(str("[", op, "] dtype mismatch: ", all, " (cast with cf::to)"));
    }
  }
}

void check_float(const Tensor& t, const char* op, const char* arg) {
  CF_CHECK(is_floating(t.dtype()), DTypeError, "[", op, "] argument '", arg,
           "' must be a floating dtype (float32, float64, bfloat16, float16), got ", t.describe());
}

void check_dtype(const Tensor& t, DType want, const char* op, const char* arg) {
  CF_CHECK(t.dtype() == want, DTypeError, "[", op, "] argument '", arg, "' must be ", want,
           ", got ", t.describe());
}

std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  if (ndim == 0) {  // a 0-d tensor takes axis 0 or -1 once, reducing nothing (PyTorch's rule)
    for (int64_t a : axes)
      CF_CHECK(a == 0 || a == -1, IndexError, "[", op, "] axis ", a,
               " is out of range for a tensor of 0 dimensions (0 or -1 only)");
    CF_CHECK(axes.size() == 1, IndexError, "[", op, "] repeated axis in the axis list");
    return out;
  }
  for (int64_t a : axes) {
    CF_CHECK(a >= -ndim && a < ndim, IndexError, "[", op, "] axis ", a,
             " is out of range for a tensor of ", ndim, " dimensions");
    out.push_back(a < 0 ? a + ndim : a);
  }
  std::sort(out.begin(), out.end());
  CF_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), IndexError, "[", op,
           "] repeated axis in the axis list");
  return out;
}

void check_inplace(const Tensor& t, const char* op) {
  CF_CHECK(t.defined(), ValueError, "[", op, "] called on an undefined tensor");
  CF_CHECK(!(grad_enabled() && t.requires_grad()), AutogradError, "[", op,
           "] in-place change of a tensor that requires grad (", t.describe(),
           "); run it with grad recording off (cf::NoGradGuard, in Python cf.no_grad()) or on a detach()ed tensor");
}

void check_inplace_source(const Tensor& src, const char* op) {
  CF_CHECK(!(grad_enabled() && src.defined() && src.requires_grad()), AutogradError, "[", op,
           "] the value written requires grad (", src.describe(),
           ") but in-place writes are not recorded, so its gradient would be lost; build the result out of "
           "place (cat, stack, where, index_add) or write src.detach() when only its value is meant");
}

void check_no_internal_overlap(const Tensor& t, const char* op) {
  for (int64_t d = 0; d < t.dim(); ++d)
    CF_CHECK(!(t.strides()[size_t(d)] == 0 && t.shape()[size_t(d)] > 1), ValueError, "[", op, "] the tensor ",
             t.describe(), " has elements that share memory (stride 0 along axis ", d,
             ", an expand() view): an in-place write would write them several times; write into a copy "
             "(contiguous()) instead");
}

namespace {
// The bytes [first, last) that t's elements occupy.
std::pair<const char*, const char*> byte_span(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.shape()[size_t(d)] - 1) * t.strides()[size_t(d)];
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t es = int64_t(dtype_size(t.dtype()));
  const char* base = static_cast<const char*>(t.raw_data());
  return {base + lo * es, base + (hi + 1) * es};
}
}  // namespace

Tensor inplace_source(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0 || src.numel() == 0 || dst.device() != src.device()) return src;
  const auto a = byte_span(dst), b = byte_span(src);
  if (a.second <= b.first || b.second <= a.first) return src;  // apart
  const bool same_view = dst.raw_data() == src.raw_data() && dst.shape() == src.shape() &&
                         dst.strides() == src.strides() && dst.dtype() == src.dtype();
  if (same_view) return src;  // each element read and then written by the same step
  NoGradGuard ng;
  return clone(src);
}

namespace {
// The 0-d constants scalar_like handed out on this thread, by (device, dtype, the number's
// bits). A number operand was a fresh tensor and a fill kernel each time: on the GPU a launch
// per `x * 0.5`, per where(c, g, 0) in a backward, about one in twenty of a training step's
// (issue 25). The constants are never written (scalar_like's callers take them as operands
// only); one that was anyway (its version moved, or it was made to require grad) is replaced,
// not handed out. At most kScalarConstants, searched in order; a new number beyond them takes
// the oldest one's place, so the set held stays the same from one training step to the next.
struct ScalarConstant {
  Device device;
  DType dtype;
  uint64_t bits;
  Tensor value;
};
constexpr size_t kScalarConstants = 32;
thread_local std::vector<ScalarConstant> t_scalar_constants;
thread_local size_t t_scalar_oldest = 0;
}  // namespace

Tensor scalar_like(const Tensor& t, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  std::vector<ScalarConstant>& held = t_scalar_constants;
  // Inside a CUDA graph capture a fill is recorded, not run: a constant made there is the graph's
  // alone (its fill replays before each use), never one the cache hands to eager ops.
  const bool capturing = t.device().is_cuda() && cuda::capturing();
  for (ScalarConstant& c : held)
    if (c.bits == bits && c.dtype == t.dtype() && c.device == t.device()) {
      if (c.value.version() != 0 || c.value.requires_grad()) {
        if (capturing) return filled({}, v, t.dtype(), t.device());
        c.value = filled({}, v, t.dtype(), t.device());
      }
      cuda::keep_for_graph(c.value);  // (a CUDA graph reading it outlives its place here)
      return c.value;
    }
  Tensor value = filled({}, v, t.dtype(), t.device());
  if (capturing) return value;
  if (held.size() < kScalarConstants) {
    held.push_back({t.device(), t.dtype(), bits, value});
  } else {
    held[t_scalar_oldest] = {t.device(), t.dtype(), bits, value};
    t_scalar_oldest = (t_scalar_oldest + 1) % kScalarConstants;
  }
  return value;
}

namespace {
// Whether v is exactly one of the values of dtype (every number is, for a float dtype).
bool representable(DType dtype, double v) {
  if (is_floating(dtype)) return true;
  if (dtype == kBool) return v == 0.0 || v == 1.0;
  return v == std::trunc(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0;
}
}  // namespace

void check_number(const Tensor& t, double v, const char* op) {
  CF_CHECK(representable(t.dtype(), v), DTypeError, "[", op, "] ", t.describe(), " with the number ", v,
           ": the number takes the tensor's dtype (cf's rule), which cannot hold it; convert the tensor to a "
           "float dtype first");
}

Tensor number_like(const Tensor& t, double v, const char* op) {
  check_number(t, v, op);
  return scalar_like(t, v);
}

Tensor compare_operand(const Tensor& t, double v) { return representable(t.dtype(), v) ? t : to(t, kFloat64); }

Tensor filled(const Shape& shape, double v, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  kernels::fill(t, v);
  return t;
}

Tensor dense_data(const Tensor& t) {
  if (!t.defined()) return t;
  return t.is_contiguous() ? t.detach() : contiguous(t.detach());
}

}  // namespace cf::ops
