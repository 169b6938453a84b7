// CUDA arm of the sparse products (kernels/sparse/sparse.h), the same
// contracts as sparse_cpu.cpp:
//  - sparse products: a thread per output element, summing in the CPU's order;
//  - scatter: the terms grouped by destination row (kernels/common/segments.h,
//    stable: increasing (n, t), the CPU's order), then a thread per (row,
//    column) adds its terms; no floating-point atomics, the same bits every run.
#include <algorithm>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/segments.h"
#include "kernels/sparse/sparse.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
using cu::kWarp;

template <typename T>
__global__ void sparse_dot_kernel(const T* q, const T* k, const int64_t* idx, T* out, int64_t total, int64_t n,
                                  int64_t m, int64_t kk, int64_t d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / kk;  // row g * n + i
    const T* qr = q + r * d;
    const T* kr = k + ((r / n) * m + cu::clamp_index(idx[e], m)) * d;
    T s = 0;
    for (int64_t j = 0; j < d; ++j) s += qr[j] * kr[j];
    out[e] = s;
  }
}

template <typename T>
__global__ void sparse_wsum_kernel(const T* w, const T* v, const int64_t* idx, T* out, int64_t total, int64_t n,
                                   int64_t m, int64_t kk, int64_t d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / d, j = e % d;
    const T* vg = v + (r / n) * m * d;
    T s = 0;
    for (int64_t t = 0; t < kk; ++t) {
      const T c = w[r * kk + t];
      if (c == T(0)) continue;
      s += c * vg[cu::clamp_index(idx[r * kk + t], m) * d + j];
    }
    out[e] = s;
  }
}

// key of term (r, t) = g * m + idx[r, t]: its destination row in the (G * M, D) output.
__global__ void scatter_keys_kernel(const int64_t* idx, int64_t total, int64_t n, int64_t m, int64_t kk,
                                    uint64_t* keys) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step)
    keys[e] = uint64_t((e / kk / n) * m + cu::clamp_index(idx[e], m));
}

// out row `row`, column j: the sum over its terms (in `order`, increasing (n, t))
// of c[term] * x[term's query row][j]; terms with c == 0 skipped, as on the CPU.
template <typename T>
__global__ void scatter_sum_kernel(const T* c, const T* x, const int64_t* order, const int64_t* start,
                                   const int64_t* count, int64_t rows, int64_t kk, int64_t d, T* out) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t p0 = start[row], p1 = p0 + count[row];
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      T s = out[row * d + j];
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t term = order[p];
        const T cv = c[term];
        if (cv == T(0)) continue;
        s += cv * x[(term / kk) * d + j];
      }
      out[row * d + j] = s;
    }
  }
}

}  // namespace

void sparse_dot_cuda(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  const int64_t n = q.size(1), d = q.size(2), m = k.size(1), kk = idx.size(2), total = out.numel();
  if (total == 0) return;
  cu::use_device_of(q, "sparse_dot");
  CF_DISPATCH_FLOAT_STD(q.dtype(), "sparse_dot",
                    (sparse_dot_kernel<scalar_t><<<cu::grid_for(total), kThreads>>>(
                        cu::ptr<scalar_t>(q), cu::ptr<scalar_t>(k), cu::ptr<int64_t>(idx), cu::ptr<scalar_t>(out),
                        total, n, m, kk, d)));
  ::cf::cuda::check_launch("sparse_dot");
}

void sparse_weighted_sum_cuda(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  const int64_t n = w.size(1), kk = w.size(2), m = v.size(1), d = v.size(2), total = out.numel();
  if (total == 0) return;
  cu::use_device_of(w, "sparse_weighted_sum");
  CF_DISPATCH_FLOAT_STD(w.dtype(), "sparse_weighted_sum",
                    (sparse_wsum_kernel<scalar_t><<<cu::grid_for(total), kThreads>>>(
                        cu::ptr<scalar_t>(w), cu::ptr<scalar_t>(v), cu::ptr<int64_t>(idx), cu::ptr<scalar_t>(out),
                        total, n, m, kk, d)));
  ::cf::cuda::check_launch("sparse_weighted_sum");
}

void sparse_scatter_rows_cuda(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  const int64_t g = c.size(0), n = c.size(1), kk = c.size(2), d = x.size(2), m = out.size(1);
  const int64_t terms = g * n * kk, rows = g * m;
  if (terms == 0 || rows == 0 || d == 0) return;
  const Device dev = x.device();
  cu::use_device_of(x, "sparse_scatter_rows");
  Tensor keys = Tensor::empty({terms}, kInt64, dev);
  uint64_t* kp = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(keys));
  scatter_keys_kernel<<<cu::grid_for(terms), kThreads>>>(cu::ptr<int64_t>(idx), terms, n, m, kk, kp);
  ::cf::cuda::check_launch("sparse_scatter_rows");
  Tensor order = Tensor::empty({terms}, kInt64, dev), start = Tensor::empty({rows}, kInt64, dev),
         count = Tensor::empty({rows}, kInt64, dev);
  segments_by_key_cuda(kp, terms, rows, order, start, count, "sparse_scatter_rows");
  const int threads = int(std::min<int64_t>(kThreads, (d + kWarp - 1) / kWarp * kWarp));
  CF_DISPATCH_FLOAT_STD(x.dtype(), "sparse_scatter_rows",
                    (scatter_sum_kernel<scalar_t><<<cu::blocks_for(rows), threads>>>(
                        cu::ptr<scalar_t>(c), cu::ptr<scalar_t>(x), cu::ptr<int64_t>(order), cu::ptr<int64_t>(start),
                        cu::ptr<int64_t>(count), rows, kk, d, cu::ptr<scalar_t>(out))));
  ::cf::cuda::check_launch("sparse_scatter_rows");
}

}  // namespace cf::kernels
