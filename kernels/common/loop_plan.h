#pragma once
// The loop plan shared by the CPU and CUDA strided kernels: operand strides are
// broadcast to the loop shape (stride 0 on broadcast axes), size-1 axes dropped
// and axes merged where every operand is contiguous across them. Host code only;
// the plan is a plain struct, copied by value into CUDA kernels.
#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace cf::kernels {

template <int N>
struct LoopPlan {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // bytes
  int64_t numel = 0;
};

// Byte strides of t viewed at `shape` under NumPy broadcasting (t.dim() <= shape.size()).
inline void broadcast_byte_strides(const Tensor& t, const Shape& shape, int64_t* out) {
  size_t nd = shape.size(), td = size_t(t.dim());
  int64_t es = int64_t(dtype_size(t.dtype()));
  for (size_t i = 0; i < nd; ++i) {
    if (i < nd - td) { out[i] = 0; continue; }
    size_t j = i - (nd - td);
    out[i] = t.shape()[j] == 1 ? 0 : t.strides()[j] * es;
  }
}

template <int N>
LoopPlan<N> make_loop_plan(const Shape& shape, const std::array<const Tensor*, N>& ops) {
  LoopPlan<N> p;
  p.numel = numel_of(shape);
  int64_t st[N][kMaxDims];
  for (int k = 0; k < N; ++k) broadcast_byte_strides(*ops[size_t(k)], shape, st[k]);
  // Drop size-1 axes, then merge axis i into the following one when every
  // operand is contiguous across the pair.
  int nd = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (p.strides[k][nd - 1] != st[k][i] * shape[i]) merge = false;
      if (merge) {
        p.sizes[nd - 1] *= shape[i];
        for (int k = 0; k < N; ++k) p.strides[k][nd - 1] = st[k][i];
        continue;
      }
    }
    p.sizes[nd] = shape[i];
    for (int k = 0; k < N; ++k) p.strides[k][nd] = st[k][i];
    ++nd;
  }
  if (nd == 0) {  // a single element
    p.sizes[0] = 1;
    for (int k = 0; k < N; ++k) p.strides[k][0] = 0;
    nd = 1;
  }
  p.ndim = nd;
  return p;
}

}  // namespace cf::kernels
