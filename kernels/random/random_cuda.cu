// CUDA Philox fills: element i draws philox4x32_10(seed, counter0 + i) and maps it
// with the same functions and expressions as random_cpu.cpp (core/rng.h is
// __host__ __device__), so uniform, integer and bernoulli tensors are bit-identical
// to the CPU's and normal ones equal up to the device libm's log/cos/sqrt rounding.
// One thread per element (grid-stride); Philox's 10 rounds make this compute-bound,
// so there is nothing to gain from vector stores.
#include <cstdint>
#include <type_traits>

#include "core/rng.h"
#include "kernels/common/cuda_utils.cuh"
#include "kernels/random/random.h"

namespace cf::kernels {

namespace {

// The products and sums below are rounded separately (__dmul_rn / __dadd_rn):
// nvcc would otherwise contract a + s * u into one FMA, which the CPU (x86-64
// baseline, no FMA) does not do, and the uniform values would differ in the last bit.
template <typename T, RandomKind K>
__global__ void random_kernel(T* out, int64_t n, double a, double b, int64_t ia, uint64_t span, uint64_t seed,
                              uint64_t counter0, const uint64_t* rebase) {
  philox_rebase(seed, counter0, rebase);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const PhiloxOut r = philox4x32_10(seed, counter0 + uint64_t(i));
    if constexpr (K == RandomKind::Uniform) {
      const double u = std::is_same_v<T, float> ? double(philox_uniform_f(r)) : philox_uniform_d(r);
      T t = T(__dadd_rn(a, __dmul_rn(__dsub_rn(b, a), u)));
      // u < 1, but rounding to T may reach high, or fall below a low T does not hold: one step
      // into [low, high), as on the CPU
      if constexpr (!std::is_same_v<T, int64_t> && !std::is_same_v<T, bool>) {
        if (double(t) < a) t = next_above(t);
        if (double(t) >= b) t = next_below(t);
      }
      out[i] = t;
    } else if constexpr (K == RandomKind::Normal) {
      out[i] = T(__dadd_rn(a, __dmul_rn(b, philox_normal(r))));
    } else if constexpr (K == RandomKind::Integer) {
      out[i] = T(int64_t(uint64_t(ia) + philox_below(r, span)));
    } else {
      out[i] = T(philox_uniform_d(r) < a);
    }
  }
}

template <typename T>
void fill_typed(const Tensor& out, const RandomParams& p) {
  const int64_t n = out.numel();
  if (n == 0) return;
  T* o = cu::ptr<T>(out);
  const int64_t ia = p.low;
  const uint64_t span = p.span;  // as random_cpu.cpp
  cu::use_device_of(out, "random");
  const unsigned g = cu::grid_for(n);
  switch (p.kind) {
    case RandomKind::Uniform:
      random_kernel<T, RandomKind::Uniform>
          <<<g, cu::kThreads, 0, ::cf::cuda::stream()>>>(o, n, p.a, p.b, ia, span, p.seed, p.counter0, p.philox_rebase);
      break;
    case RandomKind::Normal:
      random_kernel<T, RandomKind::Normal>
          <<<g, cu::kThreads, 0, ::cf::cuda::stream()>>>(o, n, p.a, p.b, ia, span, p.seed, p.counter0, p.philox_rebase);
      break;
    case RandomKind::Integer:
      // span == 0 (low == high) is refused by cf::randint before any kernel runs.
      random_kernel<T, RandomKind::Integer>
          <<<g, cu::kThreads, 0, ::cf::cuda::stream()>>>(o, n, p.a, p.b, ia, span, p.seed, p.counter0, p.philox_rebase);
      break;
    case RandomKind::Bernoulli:
      random_kernel<T, RandomKind::Bernoulli>
          <<<g, cu::kThreads, 0, ::cf::cuda::stream()>>>(o, n, p.a, p.b, ia, span, p.seed, p.counter0, p.philox_rebase);
      break;
  }
  ::cf::cuda::check_launch("random");
}

}  // namespace

void random_fill_cuda(const Tensor& out, const RandomParams& p) {
  // Element i is the i-th element in memory, as on the CPU (out.data<T>()[i]).
  CF_CHECK(out.is_contiguous(), Error, "[random] internal error: output must be contiguous, got ", out.describe());
  // 16-bit dtypes draw as the CPU's fill does: a 53-bit uniform (a double) scaled and rounded once to the
  // dtype, one step down when that reaches high. (A float32 fill rounded afterwards drew other values and
  // returned exactly high 0.2% of the time in bfloat16.)
  if (out.dtype() == kBFloat16) return fill_typed<BFloat16>(out, p);
  if (out.dtype() == kFloat16) return fill_typed<Half>(out, p);
  CF_DISPATCH_ALL_STD(out.dtype(), "random", fill_typed<scalar_t>(out, p));
}

}  // namespace cf::kernels
