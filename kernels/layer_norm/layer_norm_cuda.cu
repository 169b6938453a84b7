// CUDA layer normalisation. Semantics and formulas are those of layer_norm_cpu.cpp
// (layer_norm.h states the contract): per row, the mean and the centred sum of
// squares in double (two passes over the row, biased variance), rstd =
// 1/sqrt(var + eps), outputs computed in double and rounded once.
//
// Rows (contiguous, n elements): one warp per row up to 1024 elements, one block
// per row beyond (CF_ROW_LAUNCH in cuda_utils.cuh); rows up to 32 * VPT /
// kRowBlock * VPT elements are held in registers between the passes (float4 slots
// for aligned float rows of n % 4 == 0), longer ones re-read (from L2).
// gweight/gbias are column sums over the rows. No float atomics: a first kernel
// sums fixed chunks of rows per column tile (threads over consecutive columns, so
// reads coalesce) into double partials, a second adds the partials of each column
// in chunk order. The result depends on the shape only, never on timing.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/layer_norm/layer_norm.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

// One row forward; w and b may be null. VPT > 0: the row lives in registers in
// cu::load_slots' layout (float4 slots when VEC).
template <typename T, int VPT, bool VEC, class G>
__device__ void forward_row(const G& grp, const T* xi, const T* w, const T* b, T* yi, T* mean, T* rstd,
                            int64_t n, double eps) {
  const int lane = grp.lane(), W = grp.size();
  T v[VPT > 0 ? VPT : 1];
  double s = 0;
  if constexpr (VPT > 0) {
    cu::load_slots<VEC>(v, xi, 1, n, lane, W, T(0));
#pragma unroll
    for (int i = 0; i < VPT; ++i) s += double(v[i]);
  } else {
    for (int64_t k = lane; k < n; k += W) s += double(xi[k]);
  }
  const double mu = grp.sum(s) / double(n);
  double ss = 0;
  if constexpr (VPT > 0) {
#pragma unroll
    for (int i = 0; i < VPT; ++i)
      if (cu::slot_index<VEC>(lane, i, W) < n) ss += (double(v[i]) - mu) * (double(v[i]) - mu);
  } else {
    for (int64_t k = lane; k < n; k += W) ss += (double(xi[k]) - mu) * (double(xi[k]) - mu);
  }
  const double rs = 1.0 / sqrt(grp.sum(ss) / double(n) + eps);
  if (lane == 0) {
    *mean = T(mu);
    *rstd = T(rs);
  }
  auto out = [&](int64_t k, T xv) {
    double r = (double(xv) - mu) * rs;
    if (w) r *= double(w[k]);
    if (b) r += double(b[k]);
    return T(r);
  };
  if constexpr (VPT > 0) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t k = cu::slot_index<VEC>(lane, i, W);
      if (k < n) v[i] = out(k, v[i]);
    }
    cu::store_slots<VEC>(v, yi, 1, n, lane, W);
  } else {
    for (int64_t k = lane; k < n; k += W) yi[k] = out(k, xi[k]);
  }
}

// One row of gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * weight.
template <typename T, int VPT, bool VEC, class G>
__device__ void backward_row(const G& grp, const T* gi, const T* xi, const T* w, T* oi, double mu, double rs,
                             int64_t n) {
  const int lane = grp.lane(), W = grp.size();
  T gv[VPT > 0 ? VPT : 1], xv[VPT > 0 ? VPT : 1];
  double a = 0, c = 0;
  auto add = [&](int64_t k, T g, T x) {
    const double gh = double(g) * (w ? double(w[k]) : 1.0);
    a += gh;
    c += gh * (double(x) - mu) * rs;
  };
  if constexpr (VPT > 0) {
    cu::load_slots<VEC>(gv, gi, 1, n, lane, W, T(0));
    cu::load_slots<VEC>(xv, xi, 1, n, lane, W, T(0));
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t k = cu::slot_index<VEC>(lane, i, W);
      if (k < n) add(k, gv[i], xv[i]);
    }
  } else {
    for (int64_t k = lane; k < n; k += W) add(k, gi[k], xi[k]);
  }
  a = grp.sum(a) / double(n);
  c = grp.sum(c) / double(n);
  auto out = [&](int64_t k, T g, T x) {
    const double gh = double(g) * (w ? double(w[k]) : 1.0);
    const double xh = (double(x) - mu) * rs;
    return T(rs * (gh - a - xh * c));
  };
  if constexpr (VPT > 0) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t k = cu::slot_index<VEC>(lane, i, W);
      if (k < n) gv[i] = out(k, gv[i], xv[i]);
    }
    cu::store_slots<VEC>(gv, oi, 1, n, lane, W);
  } else {
    for (int64_t k = lane; k < n; k += W) oi[k] = out(k, gi[k], xi[k]);
  }
}

template <typename T, int VPT, bool VEC>
__global__ void forward_warp_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                                    int64_t n, double eps) {
  const int64_t per = kThreads / cu::kWarp;
  const cu::WarpRow grp;
  for (int64_t r = int64_t(blockIdx.x) * per + threadIdx.x / cu::kWarp; r < rows; r += int64_t(gridDim.x) * per)
    forward_row<T, VPT, cu::use_vec<T, VEC>>(grp, x + r * n, w, b, y + r * n, mean + r, rstd + r, n, eps);
}
template <typename T, int VPT, bool VEC>
__global__ void forward_block_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                                     int64_t n, double eps) {
  __shared__ double shared[cu::kWarp];
  const cu::BlockRow grp{shared};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)  // block-uniform
    forward_row<T, VPT, cu::use_vec<T, VEC>>(grp, x + r * n, w, b, y + r * n, mean + r, rstd + r, n, eps);
}
template <typename T, int VPT, bool VEC>
__global__ void backward_warp_kernel(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* gx,
                                     int64_t rows, int64_t n) {
  const int64_t per = kThreads / cu::kWarp;
  const cu::WarpRow grp;
  for (int64_t r = int64_t(blockIdx.x) * per + threadIdx.x / cu::kWarp; r < rows; r += int64_t(gridDim.x) * per)
    backward_row<T, VPT, cu::use_vec<T, VEC>>(grp, g + r * n, x + r * n, w, gx + r * n, double(mean[r]), double(rstd[r]), n);
}
template <typename T, int VPT, bool VEC>
__global__ void backward_block_kernel(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* gx,
                                      int64_t rows, int64_t n) {
  __shared__ double shared[cu::kWarp];
  const cu::BlockRow grp{shared};
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    backward_row<T, VPT, cu::use_vec<T, VEC>>(grp, g + r * n, x + r * n, w, gx + r * n, double(mean[r]), double(rstd[r]), n);
}

// Column sums, stage 1: block (32 columns, 8 row lanes), grid (column tiles, row
// chunks). Each thread walks its chunk's rows ty, ty + 8, ...; the 8 lanes are
// added in order through shared memory. With one chunk the result is stored,
// else the chunk's double partials go to pw/pb[chunk * n + col].
template <typename T>
__global__ void colsum_kernel(const T* g, const T* x, const T* mean, const T* rstd, int64_t rows, int64_t n,
                              T* gw, T* gb, double* pw, double* pb) {
  __shared__ double sw[kThreads], sb[kThreads];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y), bx = int(blockDim.x), by = int(blockDim.y);
  const int64_t c = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
  for (int64_t tile = blockIdx.x; tile * bx < n; tile += gridDim.x) {  // block-uniform
    const int64_t col = tile * bx + tx;
    double aw = 0, ab = 0;
    if (col < n) {
      for (int64_t r = r0 + ty; r < r1; r += by) {
        const double gv = double(g[r * n + col]);
        if (gw) aw += gv * (double(x[r * n + col]) - double(mean[r])) * double(rstd[r]);
        ab += gv;
      }
    }
    sw[ty * bx + tx] = aw;
    sb[ty * bx + tx] = ab;
    __syncthreads();
    if (ty == 0 && col < n) {
      for (int k = 1; k < by; ++k) {
        aw += sw[k * bx + tx];
        ab += sb[k * bx + tx];
      }
      if (chunks == 1) {
        if (gw) gw[col] = T(aw);
        if (gb) gb[col] = T(ab);
      } else {
        pw[c * n + col] = aw;
        pb[c * n + col] = ab;
      }
    }
    __syncthreads();  // sw/sb are reused by the next tile
  }
}

// Stage 2: each column adds its chunk partials in chunk order.
template <typename T>
__global__ void colsum_finish_kernel(const double* pw, const double* pb, int64_t chunks, int64_t n, T* gw,
                                     T* gb) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < n; col += step) {
    double aw = 0, ab = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      aw += pw[c * n + col];
      ab += pb[c * n + col];
    }
    if (gw) gw[col] = T(aw);
    if (gb) gb[col] = T(ab);
  }
}

template <typename T>
const T* opt_ptr(const Tensor& t) {
  return t.defined() ? cu::ptr<const T>(t) : nullptr;
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n, double eps,
                   const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  cu::use_device_of(y, "layer_norm");
#define ARGS cu::ptr<const T>(x), opt_ptr<T>(weight), opt_ptr<T>(bias), cu::ptr<T>(y), cu::ptr<T>(mean), \
             cu::ptr<T>(rstd), rows, n, eps
  CF_ROW_LAUNCH(forward_warp_kernel, forward_block_kernel, rows, n,
                cu::vec4_rows<T>(n, {x.raw_data(), y.raw_data()}));
#undef ARGS
  ::cf::cuda::check_launch("layer_norm");
}

template <typename T>
void backward_typed(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight, int64_t n, const Tensor& gx, const Tensor& gweight,
                    const Tensor& gbias) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  cu::use_device_of(x, "layer_norm");
  if (gx.defined() && rows > 0) {
#define ARGS cu::ptr<const T>(g), cu::ptr<const T>(x), cu::ptr<const T>(mean), cu::ptr<const T>(rstd), \
             opt_ptr<T>(weight), cu::ptr<T>(gx), rows, n
    CF_ROW_LAUNCH(backward_warp_kernel, backward_block_kernel, rows, n,
                  cu::vec4_rows<T>(n, {g.raw_data(), x.raw_data(), gx.raw_data()}));
#undef ARGS
    ::cf::cuda::check_launch("layer_norm");
  }
  if ((!gweight.defined() && !gbias.defined()) || n == 0) return;
  T* gw = gweight.defined() ? cu::ptr<T>(gweight) : nullptr;
  T* gb = gbias.defined() ? cu::ptr<T>(gbias) : nullptr;
  // Tiles of 32 columns x 8 row lanes; row chunks added until about 4 blocks per SM
  // run, each chunk keeping at least 64 rows.
  const dim3 block(32, kThreads / 32);
  const int64_t tiles = (n + 31) / 32;
  int64_t chunks = 1;
  if (tiles < 2 * int64_t(cu::sm_count(x, "layer_norm")) && rows >= 128)
    chunks = std::clamp<int64_t>((4 * int64_t(cu::sm_count(x, "layer_norm")) + tiles - 1) / tiles, 1,
                                 std::min<int64_t>(rows / 64, 1024));
  Tensor temp;
  double *pw = nullptr, *pb = nullptr;
  if (chunks > 1) {
    temp = Tensor::empty({2 * chunks * n}, kFloat64, x.device());  // cf's caching allocator
    pw = static_cast<double*>(temp.raw_data());
    pb = pw + chunks * n;
  }
  colsum_kernel<T><<<dim3(cu::blocks_for(tiles), unsigned(chunks)), block, 0, ::cf::cuda::stream()>>>(
      cu::ptr<const T>(g), cu::ptr<const T>(x), cu::ptr<const T>(mean), cu::ptr<const T>(rstd), rows, n, gw, gb, pw,
      pb);
  ::cf::cuda::check_launch("layer_norm");
  if (chunks > 1) {
    colsum_finish_kernel<T><<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(pw, pb, chunks, n, gw, gb);
    ::cf::cuda::check_launch("layer_norm");
  }
}

}  // namespace

void layer_norm_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                             double eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  if (is_low_precision(x.dtype())) {  // float32 copies of every operand, one rounding per output
    Tensor yf = float32_buffer_for(y), mf = float32_buffer_for(mean), rf = float32_buffer_for(rstd);
    forward_typed<float>(upcast_float32(x), upcast_float32(weight), upcast_float32(bias), n, eps, yf, mf, rf);
    downcast_into(yf, y);
    downcast_into(mf, mean);
    downcast_into(rf, rstd);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "layer_norm", forward_typed<scalar_t>(x, weight, bias, n, eps, y, mean, rstd));
}

void layer_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight, int64_t n, const Tensor& gx,
                              const Tensor& gweight, const Tensor& gbias) {
  if (is_low_precision(x.dtype())) {
    auto buf = [](const Tensor& t) { return t.defined() ? float32_buffer_for(t) : t; };
    Tensor gxf = buf(gx), gwf = buf(gweight), gbf = buf(gbias);
    backward_typed<float>(upcast_float32(g), upcast_float32(x), upcast_float32(mean), upcast_float32(rstd),
                          upcast_float32(weight), n, gxf, gwf, gbf);
    if (gx.defined()) downcast_into(gxf, gx);
    if (gweight.defined()) downcast_into(gwf, gweight);
    if (gbias.defined()) downcast_into(gbf, gbias);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "layer_norm",
                    backward_typed<scalar_t>(g, x, mean, rstd, weight, n, gx, gweight, gbias));
}

// ---------------- l2_normalize: a warp per row (lanes along the row), the CPU's sums in double ----------------

namespace l2_normalize_cuda {
namespace {

template <typename T>
__device__ double row_scale(const T* x, int64_t n, double eps, int lane) {
  double s = 0;
  for (int64_t i = lane; i < n; i += cu::kWarp) s += double(x[i]) * double(x[i]);
  return 1.0 / sqrt(cu::WarpRow{}.sum(s) + eps);
}

template <typename T>
__global__ void forward_kernel(const T* x, int64_t rows, int64_t n, double eps, T* y) {
  const int lane = int(threadIdx.x) % cu::kWarp;
  const int64_t per = int64_t(blockDim.x) / cu::kWarp, step = int64_t(gridDim.x) * per;
  for (int64_t r = int64_t(blockIdx.x) * per + int64_t(threadIdx.x) / cu::kWarp; r < rows; r += step) {
    const double s = row_scale(x + r * n, n, eps, lane);
    for (int64_t i = lane; i < n; i += cu::kWarp) y[r * n + i] = T(double(x[r * n + i]) * s);
  }
}

template <typename T>
__global__ void backward_kernel(const T* g, const T* x, int64_t rows, int64_t n, double eps, T* gx) {
  const int lane = int(threadIdx.x) % cu::kWarp;
  const int64_t per = int64_t(blockDim.x) / cu::kWarp, step = int64_t(gridDim.x) * per;
  for (int64_t r = int64_t(blockIdx.x) * per + int64_t(threadIdx.x) / cu::kWarp; r < rows; r += step) {
    const T* xr = x + r * n;
    const T* gr = g + r * n;
    const double s = row_scale(xr, n, eps, lane);
    double gy = 0;
    for (int64_t i = lane; i < n; i += cu::kWarp) gy += double(gr[i]) * double(xr[i]) * s;
    gy = cu::WarpRow{}.sum(gy);
    for (int64_t i = lane; i < n; i += cu::kWarp) gx[r * n + i] = T(s * (double(gr[i]) - double(xr[i]) * s * gy));
  }
}

unsigned warp_blocks(int64_t rows) {
  const int64_t per = cu::kThreads / cu::kWarp;
  return cu::blocks_for((rows + per - 1) / per);
}

}  // namespace
}  // namespace l2_normalize_cuda

void l2_normalize_forward_cuda(const Tensor& x, int64_t n, double eps, const Tensor& y) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  if (rows == 0) return;
  cu::use_device_of(y, "l2_normalize");
  CF_DISPATCH_FLOAT_STD(x.dtype(), "l2_normalize",
                        (l2_normalize_cuda::forward_kernel<scalar_t>
                         <<<l2_normalize_cuda::warp_blocks(rows), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                             cu::ptr<const scalar_t>(x), rows, n, eps, cu::ptr<scalar_t>(y))));
  ::cf::cuda::check_launch("l2_normalize");
}

void l2_normalize_backward_cuda(const Tensor& g, const Tensor& x, int64_t n, double eps, const Tensor& gx) {
  const int64_t rows = n > 0 ? x.numel() / n : 0;
  if (rows == 0) return;
  cu::use_device_of(gx, "l2_normalize");
  CF_DISPATCH_FLOAT_STD(
      x.dtype(), "l2_normalize",
      (l2_normalize_cuda::backward_kernel<scalar_t>
       <<<l2_normalize_cuda::warp_blocks(rows), cu::kThreads, 0, ::cf::cuda::stream()>>>(
           cu::ptr<const scalar_t>(g), cu::ptr<const scalar_t>(x), rows, n, eps, cu::ptr<scalar_t>(gx))));
  ::cf::cuda::check_launch("l2_normalize");
}

}  // namespace cf::kernels
