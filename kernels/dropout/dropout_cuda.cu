// CUDA inverted dropout: element i is dropped when the Philox uniform (double,
// 53 bits) of counter counter0 + i under key seed is below p, else multiplied by
// 1/(1-p) (computed on the host in double and cast to T, as dropout_cpu.cpp does).
// The draw is bit-identical to the CPU's, so the mask is the same on every device
// and backward (this kernel rerun on the gradient) drops the same elements.
#include <cstdint>

#include "core/rng.h"
#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/dropout/dropout.h"

namespace cf::kernels {

namespace {

// One thread per element (grid-stride): Philox dominates the cost, the loads and
// stores are coalesced. out may alias x. With cols (dropout.h), element i = r T + t
// draws counter counter0 + r row_len + cols[i].
template <typename T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, double p, T scale, uint64_t seed, uint64_t counter0,
                               const uint64_t* rebase, const int64_t* cols, int64_t T_, int64_t row_len) {
  philox_rebase(seed, counter0, rebase);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t c = cols ? counter0 + uint64_t((i / T_) * row_len + cols[i]) : counter0 + uint64_t(i);
    const PhiloxOut r = philox4x32_10(seed, c);
    out[i] = philox_uniform_d(r) < p ? T(0) : x[i] * scale;
  }
}

template <typename T>
void dropout_typed(const Tensor& x, const Tensor& out, const DropoutParams& p) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const T scale = T(1.0 / (1.0 - p.p));
  cu::use_device_of(out, "dropout");
  const int64_t* cols = p.cols.defined() ? cu::ptr<const int64_t>(p.cols) : nullptr;
  const int64_t T_ = p.cols.defined() && p.cols.dim() ? p.cols.shape().back() : 1;
  dropout_kernel<T><<<cu::grid_for(n), cu::kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<T>(x), cu::ptr<T>(out), n, p.p, scale, p.seed, p.counter0, p.philox_rebase, cols, T_, p.row_len);
  ::cf::cuda::check_launch("dropout");
}

}  // namespace

void dropout_cuda(const Tensor& x, const Tensor& out, const DropoutParams& p) {
  // Contract of dropout.h: x and out contiguous (cf::dropout passes dense copies).
  CF_CHECK(x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape(), Error,
           "[dropout] internal error: x and out must be contiguous and of one shape, got ", x.describe(), ", ",
           out.describe());
  CF_CHECK(x.device() == out.device(), DeviceError, "[dropout] tensors are on different devices: ", x.describe(),
           ", ", out.describe());
  if (is_low_precision(x.dtype())) {  // as dropout_cpu: the same mask, scale in float32, one rounding
    Tensor of = float32_buffer_for(out);
    dropout_typed<float>(upcast_float32(x), of, p);
    downcast_into(of, out);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "dropout", dropout_typed<scalar_t>(x, out, p));
}

}  // namespace cf::kernels
