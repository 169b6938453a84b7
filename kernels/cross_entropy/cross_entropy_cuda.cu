// CUDA cross entropy. Semantics and formulas are those of cross_entropy_cpu.cpp
// (cross_entropy.h states the contract and the (N, C, inner) layout): per sample,
// the NaN-ignoring maximum m, then sum(exp(x - m)) and sum(m - x) in double, the loss
// (1 - ls) * ((m - x_t) + log acc) + ls * (mean_c (m - x_c) + log acc), and the stats [m, log acc]
// per sample for the backward; ignored samples give zeros.
//
// Forward: with inner == 1 a sample's classes are contiguous: one warp per sample
// (a block when C is large), reads coalesced along the classes. With inner > 1
// consecutive samples are adjacent in memory for each class: one thread per
// sample, reads coalesced across samples.
// Every launch also counts the non-ignored samples (integer atomics: exact); the
// count never leaves the device: a one-thread kernel turns it into the mean's scale
// (1 / count, 0 when every sample is ignored), a device scalar the op multiplies by.
// Out-of-range targets are a deferred check (core/cuda.h: the CPU's IndexError,
// thrown at the next host read); the kernel never reads logits at a bad target.
// Backward: one thread per logit element.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/index/index.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
constexpr int64_t kBlockClasses = 4096;  // above this many classes, a block per sample

struct Flags {
  unsigned long long count;  // samples not ignored (and in range)
};

struct ThreadGroup {  // one thread per sample
  __device__ int lane() const { return 0; }
  __device__ int size() const { return 1; }
  __device__ double max(double v) const { return v; }
  __device__ double sum(double v) const { return v; }
};

// Loss and lse of sample s (target t in range) whose class c is at xi[c * inner].
template <typename T, class G>
__device__ void sample_loss(const G& grp, const T* xi, int64_t inner, int64_t C, int64_t t, double ls, T* loss,
                            T* lse) {
  const int lane = grp.lane(), W = grp.size();
  double m = -INFINITY;
  for (int64_t c = lane; c < C; c += W) {
    const double v = double(xi[c * inner]);
    m = v > m ? v : m;
  }
  m = grp.max(m);
  double acc = 0, gap = 0;  // as the CPU: (max, log sum) kept apart, gap = sum_c (m - x_c) >= 0
  for (int64_t c = lane; c < C; c += W) {
    const double v = double(xi[c * inner]);
    acc += exp(v - m);
    gap += m - v;
  }
  acc = grp.sum(acc);
  gap = grp.sum(gap);
  if (lane == 0) {
    const double la = ::log(acc);
    double r = (1.0 - ls) * ((m - double(xi[t * inner])) + la);
    if (ls > 0) r += ls * (gap / double(C) + la);  // mean_c of -log p_c
    *loss = T(r);
    lse[0] = T(m);
    lse[1] = T(la);
  }
}

// Samples [g0, ...) by groups: `per` groups per block, grid-stride.
template <typename T, class G>
__device__ void forward_samples(const G& grp, int64_t group, int64_t groups, const T* x, const int64_t* tp,
                                int64_t S, CrossEntropyParams p, T* lp, T* sp, unsigned long long& count,
                                Flags* flags) {
  for (int64_t s = group; s < S; s += groups) {
    const int64_t t = tp[s];
    if (t == p.ignore_index || t < 0 || t >= p.classes) {
      if (grp.lane() == 0) {
        lp[s] = T(0);
        sp[2 * s] = sp[2 * s + 1] = T(0);
      }
      continue;
    }
    if (grp.lane() == 0) ++count;
    const T* xi = x + (s / p.inner) * p.classes * p.inner + (s % p.inner);
    sample_loss<T>(grp, xi, p.inner, p.classes, t, p.label_smoothing, lp + s, sp + 2 * s);
  }
}

// Adds the block's count to flags->count (all threads of the block must call it).
__device__ void add_count(unsigned long long count, Flags* flags) {
  __shared__ unsigned long long sh[cu::kWarp];
  count = cu::block_reduce(count, cu::SumOp{}, 0ull, sh);
  if (threadIdx.x == 0 && count > 0) atomicAdd(&flags->count, count);
}

template <typename T>
__global__ void forward_thread_kernel(const T* x, const int64_t* tp, int64_t S, CrossEntropyParams p, T* lp,
                                      T* sp, Flags* flags) {
  unsigned long long count = 0;
  forward_samples<T>(ThreadGroup{}, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                     int64_t(gridDim.x) * blockDim.x, x, tp, S, p, lp, sp, count, flags);
  add_count(count, flags);
}

template <typename T>
__global__ void forward_warp_kernel(const T* x, const int64_t* tp, int64_t S, CrossEntropyParams p, T* lp,
                                    T* sp, Flags* flags) {
  const int64_t per = kThreads / cu::kWarp;
  unsigned long long count = 0;
  forward_samples<T>(cu::WarpRow{}, int64_t(blockIdx.x) * per + threadIdx.x / cu::kWarp,
                     int64_t(gridDim.x) * per, x, tp, S, p, lp, sp, count, flags);
  add_count(count, flags);
}

template <typename T>
__global__ void forward_block_kernel(const T* x, const int64_t* tp, int64_t S, CrossEntropyParams p, T* lp,
                                     T* sp, Flags* flags) {
  __shared__ double shared[cu::kWarp];
  unsigned long long count = 0;
  // Block-uniform loop: every thread of the block sees the same sample and target.
  forward_samples<T>(cu::BlockRow{shared}, blockIdx.x, gridDim.x, x, tp, S, p, lp, sp, count, flags);
  add_count(count, flags);
}


// The mean's scale from the count: 1 / count, or 0 when every sample is ignored
// (cf's rule, see autograd/ops/nn_functional.cpp).
template <typename T>
__global__ void mean_scale_kernel(const Flags* flags, T* scale) {
  const unsigned long long c = flags->count;
  *scale = c > 0 ? T(1.0 / double(c)) : T(0);
}

template <typename T>
void forward_typed(const Tensor& logits, const Tensor& targets, const CrossEntropyParams& p, const Tensor& losses,
                   const Tensor& lse, const Tensor& mean_scale) {
  const int64_t S = targets.numel(), C = p.classes;
  const Device dev = logits.device();
  cu::use_device_of(losses, "cross_entropy");
  if (S == 0) {
    if (mean_scale.defined())
      CF_CUDA_CHECK(cudaMemsetAsync(mean_scale.raw_data(), 0, sizeof(T), ::cf::cuda::stream()), "cross_entropy");
    return;
  }
  check_index_range_cuda(
      targets, C,
      [C, ignore = p.ignore_index](int64_t s, int64_t t) {
        throw IndexError(str("[cross_entropy] target ", t, " at position ", s, " is out of range for ", C,
                             " classes (ignore_index is ", ignore, ")"));
      },
      &p.ignore_index);
  Tensor ft = Tensor::empty({1}, kInt64, dev);  // Flags, through cf's caching allocator
  Flags* flags = static_cast<Flags*>(ft.raw_data());
  CF_CUDA_CHECK(cudaMemsetAsync(&flags->count, 0, sizeof(unsigned long long), ::cf::cuda::stream()), "cross_entropy");
  const T* xp = cu::ptr<const T>(logits);
  const int64_t* tp = cu::ptr<const int64_t>(targets);
  T* lp = cu::ptr<T>(losses);
  T* sp = cu::ptr<T>(lse);
  if (p.inner > 1)
    forward_thread_kernel<T><<<cu::grid_for(S), kThreads, 0, ::cf::cuda::stream()>>>(xp, tp, S, p, lp, sp, flags);
  else if (C <= kBlockClasses)
    forward_warp_kernel<T><<<cu::blocks_for((S + kThreads / cu::kWarp - 1) / (kThreads / cu::kWarp)), kThreads, 0,
                             ::cf::cuda::stream()>>>(xp, tp, S, p, lp, sp, flags);
  else
    forward_block_kernel<T><<<cu::blocks_for(S), kThreads, 0, ::cf::cuda::stream()>>>(xp, tp, S, p, lp, sp, flags);
  ::cf::cuda::check_launch("cross_entropy");
  if (mean_scale.defined()) {
    mean_scale_kernel<T><<<1, 1, 0, ::cf::cuda::stream()>>>(flags, cu::ptr<T>(mean_scale));
    ::cf::cuda::check_launch("cross_entropy");
  }
}

// dlogits[e] for every logit element e = (n, c, i): sample s = n * inner + i.
template <typename T>
__global__ void backward_kernel(const T* x, const int64_t* tp, const T* sp, const T* gp, bool per_sample,
                                double scale, CrossEntropyParams p, T* op, int64_t total) {
  const int64_t C = p.classes, inner = p.inner, step = int64_t(gridDim.x) * blockDim.x;
  const double ls = p.label_smoothing, off = ls / double(C);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t i = e % inner, c = (e / inner) % C, n = e / (inner * C);
    const int64_t s = n * inner + i, t = tp[s];
    if (t == p.ignore_index) {
      op[e] = T(0);
      continue;
    }
    const double gs = double(gp[per_sample ? s : 0]) * scale, m = double(sp[2 * s]), la = double(sp[2 * s + 1]);
    double d = exp((double(x[e]) - m) - la) - off;
    if (c == t) d -= 1.0 - ls;
    op[e] = T(gs * d);
  }
}

template <typename T>
void backward_typed(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                    double scale, const CrossEntropyParams& p, const Tensor& dlogits) {
  const int64_t total = dlogits.numel(), S = targets.numel();
  if (total == 0) return;
  const bool per_sample = grad.numel() != 1 || S == 1;
  cu::use_device_of(dlogits, "cross_entropy");
  backward_kernel<T><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<const T>(logits), cu::ptr<const int64_t>(targets), cu::ptr<const T>(lse), cu::ptr<const T>(grad),
      per_sample, scale, p, cu::ptr<T>(dlogits), total);
  ::cf::cuda::check_launch("cross_entropy");
}

}  // namespace

void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& targets, const CrossEntropyParams& p,
                                const Tensor& losses, const Tensor& lse, const Tensor& mean_scale) {
  if (is_low_precision(logits.dtype())) {  // float32 logits, one rounding per loss
    Tensor lf = float32_buffer_for(losses);  // lse (the stats) is float32 already
    Tensor mf = mean_scale.defined() ? float32_buffer_for(mean_scale) : Tensor();
    forward_typed<float>(upcast_float32(logits), targets, p, lf, lse, mf);
    downcast_into(lf, losses);
    if (mean_scale.defined()) downcast_into(mf, mean_scale);
    return;
  }
  CF_DISPATCH_FLOAT_STD(logits.dtype(), "cross_entropy",
                        forward_typed<scalar_t>(logits, targets, p, losses, lse, mean_scale));
}

void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& grad, double scale, const CrossEntropyParams& p,
                                 const Tensor& dlogits) {
  if (is_low_precision(logits.dtype())) {
    Tensor df = float32_buffer_for(dlogits);
    backward_typed<float>(upcast_float32(logits), targets, lse, upcast_float32(grad), scale, p, df);
    downcast_into(df, dlogits);
    return;
  }
  CF_DISPATCH_FLOAT_STD(logits.dtype(), "cross_entropy",
                    backward_typed<scalar_t>(logits, targets, lse, grad, scale, p, dlogits));
}

}  // namespace cf::kernels
