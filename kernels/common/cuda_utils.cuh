#pragma once
// Shared machinery of the CUDA kernels (.cu files only): launch sizes, checked
// launches, strided N-operand loops built from the CPU's LoopPlan, and
// warp/block reductions. One mechanism for every family, like loop.h on the CPU.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/tensor.h"
#include "kernels/common/loop_plan.h"

namespace cf::kernels::cu {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, capped so
// huge tensors loop instead of launching millions of blocks.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65536) b = 65536;
  return unsigned(b);
}

// Makes the tensor's device current; call before a launch.
inline void use_device_of(const Tensor& t, const char* op) { ::cf::cuda::set_device(t.device(), op); }

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Accumulation type: float32 sums in double like the CPU kernels (DESIGN.md
// section 4 tolerances are then met with room), int64 in int64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, float>, double, T>;

// Byte offsets of N operands for element i (row-major over the plan's shape).
template <int N>
__device__ __forceinline__ void plan_offsets(const LoopPlan<N>& p, int64_t i, int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const int64_t s = p.sizes[d];
    const int64_t c = i % s;
    i /= s;
    for (int k = 0; k < N; ++k) off[k] += c * p.strides[k][d];
  }
}

template <int N, typename F>
__global__ void strided_kernel(LoopPlan<N> p, std::array<char*, N> base, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += step) {
    int64_t off[N];
    plan_offsets<N>(p, i, off);
    char* q[N];
    for (int k = 0; k < N; ++k) q[k] = base[size_t(k)] + off[k];
    f(q);
  }
}

// Calls f(char* const ptrs[N]) on the device for every element of `shape`, with
// operands ops (broadcast to shape; ops[0] usually the output). f is a
// __device__ lambda (nvcc --extended-lambda).
template <int N, typename F>
void strided_loop(const char* op, const Shape& shape, const std::array<const Tensor*, N>& ops, F f) {
  LoopPlan<N> p = make_loop_plan<N>(shape, ops);
  if (p.numel == 0) return;
  use_device_of(*ops[0], op);
  std::array<char*, N> base;
  for (int k = 0; k < N; ++k) base[size_t(k)] = static_cast<char*>(ops[size_t(k)]->raw_data());
  strided_kernel<N><<<grid_for(p.numel), kThreads>>>(p, base, f);
  ::cf::cuda::check_launch(op);
}

// Grid-stride loop over [0, n): f(i) on the device.
template <typename F>
__global__ void index_kernel(int64_t n, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}
template <typename F>
void for_each_index(const char* op, const Tensor& on, int64_t n, F f) {
  if (n <= 0) return;
  use_device_of(on, op);
  index_kernel<<<grid_for(n), kThreads>>>(n, f);
  ::cf::cuda::check_launch(op);
}

// ---- reductions ----
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b > a ? b : a; }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Reduces v over the block; every thread gets the result. blockDim.x must be a
// multiple of 32 (at most 1024). `shared` holds 32 T; it is reused, so callers
// reducing twice in a row get a __syncthreads between the uses from here.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = int(blockDim.x) / kWarp;
  T w = lane < warps ? shared[lane] : identity;
  if (warp == 0) w = warp_reduce(w, op);
  if (threadIdx.x == 0) shared[0] = w;
  __syncthreads();
  return shared[0];
}

}  // namespace cf::kernels::cu
