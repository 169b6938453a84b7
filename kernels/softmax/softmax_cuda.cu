// CUDA softmax / log_softmax. Semantics and formulas are those of softmax_cpu.cpp
// (softmax.h states the contract): the NaN-ignoring row maximum is subtracted
// before exp, sums are taken in double, a softmax row whose entries are all -inf
// (and no NaN) is all zeros, log_softmax writes (x - max) - log(sum).
//
// One warp per row for rows up to 1024 elements (the attention range), one block
// per row beyond (CF_ROW_LAUNCH in cuda_utils.cuh). Rows up to 32 * VPT (warp) or
// kRowBlock * VPT (block) elements are read once into registers (cu::load_slots:
// float4 loads on contiguous float rows, else element k at lane + i * width, so
// each load instruction of a warp is coalesced); longer rows are re-read from
// global memory (L2) on each pass. Row starts come from the kept
// axes of each operand, so any strided view works.
#include <cmath>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/softmax/softmax.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

// Row r of operand k starts at element offset base(k, r); its elements are step[k] apart.
struct RowGeom {
  int nk = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};
  int64_t step[3] = {1, 1, 1};
  __device__ int64_t base(int k, int64_t r) const {
    int64_t off = 0;
    for (int d = nk - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[k][d];
      r /= sizes[d];
    }
    return off;
  }
};

RowGeom rows_of(const std::initializer_list<const Tensor*>& ts, int64_t axis) {
  RowGeom g;
  const Tensor& t0 = **ts.begin();
  for (int64_t d = 0; d < t0.dim(); ++d) {
    if (d == axis) continue;
    g.sizes[g.nk++] = t0.shape()[size_t(d)];
  }
  int k = 0;
  for (const Tensor* t : ts) {
    int j = 0;
    for (int64_t d = 0; d < t->dim(); ++d) {
      if (d == axis) continue;
      g.strides[k][j++] = t->strides()[size_t(d)];
    }
    g.step[k] = t->strides()[size_t(axis)];
    ++k;
  }
  return g;
}

__device__ __forceinline__ float exp_t(float v) { return expf(v); }
__device__ __forceinline__ double exp_t(double v) { return exp(v); }

// One row forward. VPT > 0: the row (<= VPT * group size elements) lives in
// registers, in cu::load_slots' layout (float4 slots when VEC).
template <typename T, int VPT, bool VEC, class G>
__device__ void forward_row(const G& grp, const T* xr, int64_t sx, T* yr, int64_t sy, int64_t n, bool log) {
  const int lane = grp.lane(), W = grp.size();
  const T ninf = T(-INFINITY);
  T v[VPT > 0 ? VPT : 1];
  T m = ninf;
  bool nan = false;
  if constexpr (VPT > 0) {
    cu::load_slots<VEC>(v, xr, sx, n, lane, W, ninf);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      m = v[i] > m ? v[i] : m;
      nan = nan || v[i] != v[i];
    }
  } else {
    for (int64_t k = lane; k < n; k += W) {
      const T a = xr[k * sx];
      m = a > m ? a : m;
      nan = nan || a != a;
    }
  }
  m = grp.max(m);
  nan = grp.any(nan);
  if (!log && m == ninf && !nan) {  // every entry masked: zeros, as on the CPU
    for (int64_t k = lane; k < n; k += W) yr[k * sy] = T(0);
    return;
  }
  double acc = 0;
  if constexpr (VPT > 0) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (cu::slot_index<VEC>(lane, i, W) < n) {
        const T e = exp_t(v[i] - m);
        acc += double(e);
        if (!log) v[i] = e;
      }
    }
  } else {
    for (int64_t k = lane; k < n; k += W) {
      const T e = exp_t(xr[k * sx] - m);
      acc += double(e);
      if (!log) yr[k * sy] = e;  // scaled below by this same thread
    }
  }
  acc = grp.sum(acc);
  if (log) {
    // (x - max) - log(sum), as on the CPU (keeps float32's low digits for |x| >> 1).
    const T lz = T(::log(acc));
    if constexpr (VPT > 0) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) v[i] = (v[i] - m) - lz;
      cu::store_slots<VEC>(v, yr, sy, n, lane, W);
    } else {
      for (int64_t k = lane; k < n; k += W) yr[k * sy] = (xr[k * sx] - m) - lz;
    }
  } else {
    const T inv = T(1.0 / acc);
    if constexpr (VPT > 0) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) v[i] *= inv;
      cu::store_slots<VEC>(v, yr, sy, n, lane, W);
    } else {
      for (int64_t k = lane; k < n; k += W) yr[k * sy] *= inv;
    }
  }
}

// One row backward: softmax gx = y * (g - sum(g * y)); log_softmax gx = g - exp(y) * sum(g).
template <typename T, int VPT, bool VEC, class G>
__device__ void backward_row(const G& grp, const T* yr, int64_t sy, const T* gr, int64_t sg, T* orow,
                             int64_t so, int64_t n, bool log) {
  const int lane = grp.lane(), W = grp.size();
  T yv[VPT > 0 ? VPT : 1], gv[VPT > 0 ? VPT : 1];
  double acc = 0;
  if constexpr (VPT > 0) {
    cu::load_slots<VEC>(yv, yr, sy, n, lane, W, T(0));  // zeros beyond n add nothing below
    cu::load_slots<VEC>(gv, gr, sg, n, lane, W, T(0));
#pragma unroll
    for (int i = 0; i < VPT; ++i) acc += log ? double(gv[i]) : double(gv[i]) * double(yv[i]);
  } else {
    for (int64_t k = lane; k < n; k += W)
      acc += log ? double(gr[k * sg]) : double(gr[k * sg]) * double(yr[k * sy]);
  }
  const T s = T(grp.sum(acc));
  if constexpr (VPT > 0) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) gv[i] = log ? gv[i] - exp_t(yv[i]) * s : yv[i] * (gv[i] - s);
    cu::store_slots<VEC>(gv, orow, so, n, lane, W);
  } else {
    for (int64_t k = lane; k < n; k += W) {
      const T y = yr[k * sy], g = gr[k * sg];
      orow[k * so] = log ? g - exp_t(y) * s : y * (g - s);
    }
  }
}

// Warp per row (kThreads / 32 rows per block), grid-stride over rows.
template <typename T, int VPT, bool VEC>
__global__ void forward_warp_kernel(const T* x, T* y, RowGeom g, int64_t rows, int64_t n, bool log) {
  const int64_t per = kThreads / cu::kWarp;
  const cu::WarpRow grp;
  for (int64_t r = int64_t(blockIdx.x) * per + threadIdx.x / cu::kWarp; r < rows; r += int64_t(gridDim.x) * per)
    forward_row<T, VPT, cu::use_vec<T, VEC>>(grp, x + g.base(0, r), g.step[0], y + g.base(1, r), g.step[1], n,
                                             log);
}

template <typename T, int VPT, bool VEC>
__global__ void forward_block_kernel(const T* x, T* y, RowGeom g, int64_t rows, int64_t n, bool log) {
  __shared__ double shared[cu::kWarp];
  const cu::BlockRow grp{shared};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)  // block-uniform
    forward_row<T, VPT, cu::use_vec<T, VEC>>(grp, x + g.base(0, r), g.step[0], y + g.base(1, r), g.step[1], n,
                                             log);
}

template <typename T, int VPT, bool VEC>
__global__ void backward_warp_kernel(const T* y, const T* gr, T* gx, RowGeom g, int64_t rows, int64_t n,
                                     bool log) {
  const int64_t per = kThreads / cu::kWarp;
  const cu::WarpRow grp;
  for (int64_t r = int64_t(blockIdx.x) * per + threadIdx.x / cu::kWarp; r < rows; r += int64_t(gridDim.x) * per)
    backward_row<T, VPT, cu::use_vec<T, VEC>>(grp, y + g.base(0, r), g.step[0], gr + g.base(1, r), g.step[1],
                                              gx + g.base(2, r), g.step[2], n, log);
}

template <typename T, int VPT, bool VEC>
__global__ void backward_block_kernel(const T* y, const T* gr, T* gx, RowGeom g, int64_t rows, int64_t n,
                                      bool log) {
  __shared__ double shared[cu::kWarp];
  const cu::BlockRow grp{shared};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    backward_row<T, VPT, cu::use_vec<T, VEC>>(grp, y + g.base(0, r), g.step[0], gr + g.base(1, r), g.step[1],
                                              gx + g.base(2, r), g.step[2], n, log);
}

// float4 slots apply to float rows that are contiguous along the last axis of
// every operand, n % 4 == 0, at 16-byte aligned starts.
template <typename T>
bool vec_rows(std::initializer_list<const Tensor*> ts, int64_t axis, int64_t n) {
  for (const Tensor* t : ts)
    if (!t->is_contiguous() || axis != t->dim() - 1 || !cu::vec4_rows<T>(n, {t->raw_data()})) return false;
  return true;
}

template <typename T>
void forward_typed(const Tensor& x, int64_t axis, bool log, const Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  if (x.numel() == 0) return;
  const int64_t n = x.shape()[size_t(axis)], rows = x.numel() / n;
  const RowGeom g = rows_of({&x, &y}, axis);
  cu::use_device_of(y, op);
#define ARGS cu::ptr<const T>(x), cu::ptr<T>(y), g, rows, n, log
  CF_ROW_LAUNCH(forward_warp_kernel, forward_block_kernel, rows, n, vec_rows<T>({&x, &y}, axis, n));
#undef ARGS
  ::cf::cuda::check_launch(op);
}

template <typename T>
void backward_typed(const Tensor& y, const Tensor& gr, int64_t axis, bool log, const Tensor& gx) {
  const char* op = log ? "log_softmax" : "softmax";
  if (y.numel() == 0) return;
  const int64_t n = y.shape()[size_t(axis)], rows = y.numel() / n;
  const RowGeom g = rows_of({&y, &gr, &gx}, axis);
  cu::use_device_of(gx, op);
#define ARGS cu::ptr<const T>(y), cu::ptr<const T>(gr), cu::ptr<T>(gx), g, rows, n, log
  CF_ROW_LAUNCH(backward_warp_kernel, backward_block_kernel, rows, n, vec_rows<T>({&y, &gr, &gx}, axis, n));
#undef ARGS
  ::cf::cuda::check_launch(op);
}

}  // namespace

void softmax_forward_cuda(const Tensor& x, int64_t axis, bool log, const Tensor& y) {
  if (is_low_precision(x.dtype())) {  // float32 statistics, one rounding (as softmax_cpu)
    Tensor yf = float32_buffer_for(y);
    forward_typed<float>(upcast_float32(x), axis, log, yf);
    downcast_into(yf, y);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), log ? "log_softmax" : "softmax", forward_typed<scalar_t>(x, axis, log, y));
}

void softmax_backward_cuda(const Tensor& y, const Tensor& g, int64_t axis, bool log, const Tensor& gx) {
  if (is_low_precision(y.dtype())) {
    Tensor gf = float32_buffer_for(gx);
    backward_typed<float>(upcast_float32(y), upcast_float32(g), axis, log, gf);
    downcast_into(gf, gx);
    return;
  }
  CF_DISPATCH_FLOAT_STD(y.dtype(), log ? "log_softmax" : "softmax",
                    backward_typed<scalar_t>(y, g, axis, log, gx));
}

}  // namespace cf::kernels
