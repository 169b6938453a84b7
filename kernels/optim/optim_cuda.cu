// CUDA arm of the fused optimizer steps (kernels/optim/optim.h): a grid-stride
// loop, one thread per element, the CPU's per-element expression
// (optim_common.h). nvcc may contract a multiply-add into an FMA, so results can
// differ from the CPU's in the last bit (tests/ops/test_optim_steps.cpp allows it).
#include "kernels/common/cuda_utils.cuh"
#include "kernels/optim/optim_common.h"

namespace cf::kernels {

namespace {

template <typename T>
__global__ void adam_kernel(AdamConsts<T> c, T* p, const T* g, T* m, T* v, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) adam_element(c, p, g, m, v, i);
}

template <typename T>
__global__ void sgd_kernel(SgdConsts<T> c, T* p, const T* g, T* buf, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) sgd_element(c, p, g, buf, i);
}

}  // namespace

void adam_step_cuda(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s) {
  const int64_t n = p.numel();
  if (n == 0) return;
  cu::use_device_of(p, "adam_step");
  CF_DISPATCH_FLOAT_STD(p.dtype(), "adam_step",
                        (adam_kernel<scalar_t><<<cu::grid_for(n), cu::kThreads>>>(
                            AdamConsts<scalar_t>(s), cu::ptr<scalar_t>(p), cu::ptr<scalar_t>(g),
                            cu::ptr<scalar_t>(m), cu::ptr<scalar_t>(v), n)));
  ::cf::cuda::check_launch("adam_step");
}

void sgd_step_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  const int64_t n = p.numel();
  if (n == 0) return;
  cu::use_device_of(p, "sgd_step");
  CF_DISPATCH_FLOAT_STD(p.dtype(), "sgd_step",
                        (sgd_kernel<scalar_t><<<cu::grid_for(n), cu::kThreads>>>(
                            SgdConsts<scalar_t>(s), cu::ptr<scalar_t>(p), cu::ptr<scalar_t>(g),
                            buf.defined() ? cu::ptr<scalar_t>(buf) : nullptr, n)));
  ::cf::cuda::check_launch("sgd_step");
}

}  // namespace cf::kernels
