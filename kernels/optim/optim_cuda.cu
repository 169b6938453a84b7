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

// The 16-bit type of a master's gradient and parameter (kNone: g has the master's type T).
enum class Widen : uint8_t { kNone, kBFloat16, kHalf };

inline Widen widen_of(const Tensor& low) {
  if (!low.defined()) return Widen::kNone;
  return low.dtype() == kBFloat16 ? Widen::kBFloat16 : Widen::kHalf;
}

// kStepBatch parameters' steps as one launch: their element ranges laid end to end (start), each
// element updated with its own tensor's pointers and constants. K: the state tensors per parameter
// (Adam's m and v, SGD's momentum buffer or null). Passed by value (kernel parameter space: about
// 2 KB for Adam in double, below the 4 KB every architecture takes).
template <typename T, typename Consts, int K>
struct StepBatch {
  int count = 0;
  int64_t start[kStepBatch + 1];
  T* p[kStepBatch];
  const void* g[kStepBatch];
  T* state[K][kStepBatch];
  void* low[kStepBatch];
  Widen widen[kStepBatch];
  Consts c[kStepBatch];
};

// The optimizers' element functions over a batch entry's state pointers.
struct AdamUpdate {
  static constexpr int kStates = 2;
  template <typename T, typename G>
  __device__ static void run(const AdamConsts<T>& c, T* p, const G* g, T* const* st, int64_t i) {
    adam_element(c, p, g, st[0], st[1], i);
  }
};
struct SgdUpdate {
  static constexpr int kStates = 1;
  template <typename T, typename G>
  __device__ static void run(const SgdConsts<T>& c, T* p, const G* g, T* const* st, int64_t i) {
    sgd_element(c, p, g, st[0], i);
  }
};

template <typename Update, typename T, typename Consts, int K>
__global__ void step_batch_kernel(StepBatch<T, Consts, K> b) {
  const int64_t total = b.start[b.count], step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    int t = 0;
    while (i >= b.start[t + 1]) ++t;  // (count <= kStepBatch; empty tensors have equal starts)
    const int64_t j = i - b.start[t];
    T* st[K];
    for (int k = 0; k < K; ++k) st[k] = b.state[k][t];
    switch (b.widen[t]) {  // the same for every element of a tensor
      case Widen::kBFloat16:
        Update::run(b.c[t], b.p[t], static_cast<const BFloat16*>(b.g[t]), st, j);
        round_into(static_cast<BFloat16*>(b.low[t]), b.p[t], j);
        break;
      case Widen::kHalf:
        Update::run(b.c[t], b.p[t], static_cast<const Half*>(b.g[t]), st, j);
        round_into(static_cast<Half*>(b.low[t]), b.p[t], j);
        break;
      default:
        Update::run(b.c[t], b.p[t], static_cast<const T*>(b.g[t]), st, j);
    }
  }
}

// Launches `steps` kStepBatch at a time; states(entry) gives an entry's K state tensors (an undefined
// one is passed as null).
template <typename Update, typename T, typename Consts, typename Steps, typename States>
void launch_step_batches(const std::vector<Steps>& steps, States states, const char* op) {
  constexpr int K = Update::kStates;
  for (size_t first = 0; first < steps.size(); first += kStepBatch) {
    StepBatch<T, Consts, K> b;
    b.start[0] = 0;
    for (size_t i = first; i < steps.size() && b.count < kStepBatch; ++i) {
      const Steps& t = steps[i];
      const int k = b.count++;
      b.p[k] = cu::ptr<T>(t.p);
      b.g[k] = t.g.raw_data();
      const std::array<const Tensor*, K> st = states(t);
      for (int s = 0; s < K; ++s) b.state[s][k] = st[size_t(s)]->defined() ? cu::ptr<T>(*st[size_t(s)]) : nullptr;
      b.low[k] = t.low.defined() ? t.low.raw_data() : nullptr;
      b.widen[k] = widen_of(t.low);
      b.c[k] = Consts(t.s);
      b.start[k + 1] = b.start[k] + t.p.numel();
    }
    const int64_t total = b.start[b.count];
    if (total == 0) continue;
    step_batch_kernel<Update><<<cu::grid_for(total), cu::kThreads, 0, ::cf::cuda::stream()>>>(b);
    ::cf::cuda::check_launch(op);
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
  CF_DISPATCH_FLOAT_STD(steps.front().p.dtype(), "adam_step",
                        (launch_step_batches<AdamUpdate, scalar_t, AdamConsts<scalar_t>>(
                            steps,
                            [](const AdamTensors& t) {
                              return std::array<const Tensor*, 2>{&t.m, &t.v};
                            },
                            "adam_step")));
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

void sgd_steps_cuda(const std::vector<SgdTensors>& steps) {
  cu::use_device_of(steps.front().p, "sgd_step");
  CF_DISPATCH_FLOAT_STD(
      steps.front().p.dtype(), "sgd_step",
      (launch_step_batches<SgdUpdate, scalar_t, SgdConsts<scalar_t>>(
          steps, [](const SgdTensors& t) { return std::array<const Tensor*, 1>{&t.buf}; }, "sgd_step")));
}

}  // namespace cf::kernels
