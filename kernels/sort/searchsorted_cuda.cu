// CUDA searchsorted (searchsorted.h states the contract; the search itself is search_row, shared
// with searchsorted_cpu.cpp): a thread per value. Nothing here waits for the host.
#include "kernels/common/cuda_utils.cuh"
#include "kernels/sort/searchsorted.h"

namespace cf::kernels {

namespace {

template <typename T>
__global__ void searchsorted_kernel(const T* sorted, const T* values, int64_t* out, SearchGeom g, bool right) {
  const int64_t n = g.rows * g.k, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = search_row(sorted + (i / g.k) * g.m, g.m, values[i], right);
}

}  // namespace

void searchsorted_cuda(const Tensor& sorted, const Tensor& values, const Tensor& out, const SearchGeom& g,
                       bool right) {
  if (out.numel() == 0) return;
  cu::use_device_of(values, "searchsorted");
  CF_DISPATCH_NUMERIC(values.dtype(), "searchsorted", {
    searchsorted_kernel<scalar_t><<<cu::grid_for(g.rows * g.k), cu::kThreads, 0, ::cf::cuda::stream()>>>(
        cu::ptr<scalar_t>(sorted), cu::ptr<scalar_t>(values), cu::ptr<int64_t>(out), g, right);
  });
  ::cf::cuda::check_launch("searchsorted");
}

}  // namespace cf::kernels
