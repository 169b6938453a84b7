#pragma once
// One mechanism for kernels written for float32/float64 only (fused softmax, ...): run them on
// float32 copies of bfloat16/float16 operands and round the float32 result back once, so the
// low-precision result equals the float32 kernel's result rounded to nearest even.
#include "core/tensor.h"
#include "kernels/elementwise/elementwise.h"

namespace cf::kernels {

// A contiguous float32 copy of a low-precision tensor (same device); other dtypes pass through.
inline Tensor upcast_float32(const Tensor& t) {
  if (!t.defined() || !is_low_precision(t.dtype())) return t;
  Tensor f = Tensor::empty(t.shape(), kFloat32, t.device());
  copy(t, f);
  return f;
}
// A float32 buffer to compute dst's value in: dst itself unless dst is low precision.
inline Tensor float32_buffer_for(const Tensor& dst) {
  if (!is_low_precision(dst.dtype())) return dst;
  return Tensor::empty(dst.shape(), kFloat32, dst.device());
}
// Round the float32 buffer back into dst (no-op when buf is dst).
inline void downcast_into(const Tensor& buf, const Tensor& dst) {
  if (!buf.is_same(dst)) copy(buf, dst);
}

}  // namespace cf::kernels
