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

// kAdamBatch parameters' steps as one launch: their element ranges laid end to end (start),
// each element updated with its own tensor's pointers and constants. Passed by value (kernel
// parameter space: about 2 KB for double, below the 4 KB every architecture takes).
template <typename T>
struct AdamBatch {
  int count = 0;
  int64_t start[kAdamBatch + 1];
  T* p[kAdamBatch];
  const T* g[kAdamBatch];
  T* m[kAdamBatch];
  T* v[kAdamBatch];
  AdamConsts<T> c[kAdamBatch];
};

template <typename T>
__global__ void adam_batch_kernel(AdamBatch<T> b) {
  const int64_t total = b.start[b.count], step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    int t = 0;
    while (i >= b.start[t + 1]) ++t;  // (count <= kAdamBatch; empty tensors have equal starts)
    adam_element(b.c[t], b.p[t], b.g[t], b.m[t], b.v[t], i - b.start[t]);
  }
}

template <typename T>
void adam_steps_typed(const std::vector<AdamTensors>& steps) {
  for (size_t first = 0; first < steps.size(); first += kAdamBatch) {
    AdamBatch<T> b;
    b.start[0] = 0;
    for (size_t i = first; i < steps.size() && b.count < kAdamBatch; ++i) {
      const AdamTensors& t = steps[i];
      const int k = b.count++;
      b.p[k] = cu::ptr<T>(t.p);
      b.g[k] = cu::ptr<const T>(t.g);
      b.m[k] = cu::ptr<T>(t.m);
      b.v[k] = cu::ptr<T>(t.v);
      b.c[k] = AdamConsts<T>(t.s);
      b.start[k + 1] = b.start[k] + t.p.numel();
    }
    const int64_t total = b.start[b.count];
    if (total == 0) continue;
    adam_batch_kernel<T><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(b);
    ::cf::cuda::check_launch("adam_step");
  }
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
                        (adam_kernel<scalar_t><<<cu::grid_for(n), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                            AdamConsts<scalar_t>(s), cu::ptr<scalar_t>(p), cu::ptr<scalar_t>(g), cu::ptr<scalar_t>(m),
                            cu::ptr<scalar_t>(v), n)));
  ::cf::cuda::check_launch("adam_step");
}

void adam_steps_cuda(const std::vector<AdamTensors>& steps) {
  cu::use_device_of(steps.front().p, "adam_step");
  CF_DISPATCH_FLOAT_STD(steps.front().p.dtype(), "adam_step", adam_steps_typed<scalar_t>(steps));
}

void sgd_step_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  const int64_t n = p.numel();
  if (n == 0) return;
  cu::use_device_of(p, "sgd_step");
  CF_DISPATCH_FLOAT_STD(p.dtype(), "sgd_step",
                        (sgd_kernel<scalar_t><<<cu::grid_for(n), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                            SgdConsts<scalar_t>(s), cu::ptr<scalar_t>(p), cu::ptr<scalar_t>(g),
                            buf.defined() ? cu::ptr<scalar_t>(buf) : nullptr, n)));
  ::cf::cuda::check_launch("sgd_step");
}

}  // namespace cf::kernels
