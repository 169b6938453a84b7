// CUDA prefix sums (scan.h states the contract; scan_cpu.cpp is the reference).
// Two launch shapes, both with coalesced loads:
//   - inner == 1 (the scanned axis is the last one): a warp per line walks it in
//     chunks of 32 contiguous elements, an inclusive warp scan (shuffles) inside the
//     chunk plus the carry of the chunks before;
//   - inner > 1: a thread per (outer, inner) column runs down the axis; neighbouring
//     threads read neighbouring elements.
// Sums are in scan_acc_t (double for floats, int64 for int64). Nothing here waits
// for the host.
#include "kernels/common/cuda_utils.cuh"
#include "kernels/scan/scan.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
using cu::kWarp;
constexpr unsigned kFull = 0xffffffffu;

template <typename T>
__global__ void scan_lines_kernel(const T* x, T* out, int64_t lines, int64_t n, bool reverse) {
  using A = scan_acc_t<T>;
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t line = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; line < lines; line += warps) {
    const T* xl = x + line * n;
    T* ol = out + line * n;
    A carry = A(0);
    for (int64_t base = 0; base < n; base += kWarp) {
      const int64_t s = base + lane;  // step along the scan direction
      const int64_t i = reverse ? n - 1 - s : s;
      A v = s < n ? A(xl[i]) : A(0);
      for (int d = 1; d < kWarp; d *= 2) {
        const A up = __shfl_up_sync(kFull, v, d);
        if (lane >= d) v += up;
      }
      v += carry;
      if (s < n) ol[i] = T(v);
      carry = __shfl_sync(kFull, v, kWarp - 1);
    }
  }
}

template <typename T>
__global__ void scan_columns_kernel(const T* x, T* out, ScanGeom g, bool reverse) {
  using A = scan_acc_t<T>;
  const int64_t columns = g.outer * g.inner, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += step) {
    const int64_t o = c / g.inner, j = c % g.inner;
    const T* xc = x + o * g.n * g.inner + j;
    T* oc = out + o * g.n * g.inner + j;
    A acc = A(0);
    for (int64_t s = 0; s < g.n; ++s) {
      const int64_t i = reverse ? g.n - 1 - s : s;
      acc += A(xc[i * g.inner]);
      oc[i * g.inner] = T(acc);
    }
  }
}

template <typename T>
void cumsum_typed(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse) {
  const T* xp = cu::ptr<T>(x);
  T* op = cu::ptr<T>(out);
  if (g.inner == 1) {
    scan_lines_kernel<T>
        <<<cu::grid_for(g.outer * kWarp), kThreads, 0, ::cf::cuda::stream()>>>(xp, op, g.outer, g.n, reverse);
  } else {
    scan_columns_kernel<T><<<cu::grid_for(g.outer * g.inner), kThreads, 0, ::cf::cuda::stream()>>>(xp, op, g, reverse);
  }
  ::cf::cuda::check_launch("cumsum");
}

}  // namespace

void cumsum_cuda(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse) {
  if (x.numel() == 0) return;
  cu::use_device_of(x, "cumsum");
  CF_DISPATCH_NUMERIC(x.dtype(), "cumsum", cumsum_typed<scalar_t>(x, out, g, reverse));
}

}  // namespace cf::kernels
