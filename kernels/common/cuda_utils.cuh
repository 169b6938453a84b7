#pragma once
// Shared machinery of the CUDA kernels (.cu files only): launch sizes, checked
// launches, strided N-operand loops built from the CPU's LoopPlan, and
// warp/block reductions. One mechanism for every family, like loop.h on the CPU.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
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
  strided_kernel<N><<<grid_for(p.numel), kThreads, 0, ::cf::cuda::stream()>>>(p, base, f);
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
  index_kernel<<<grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(n, f);
  ::cf::cuda::check_launch(op);
}

// v clamped into [0, n), n >= 1. Kernels that index with data checked by a deferred
// check (core/cuda.h: the op does not wait for the answer) clamp every index, so a
// bad one gives a meaningless result, reported at the next host read, and never an
// out-of-bounds access.
__device__ __forceinline__ int64_t clamp_index(int64_t v, int64_t n) { return v < 0 ? 0 : (v >= n ? n - 1 : v); }

// ---- reductions ----
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
// The larger of a and b, NaN when either is NaN (NaN absorbs: NaN > x never holds, and fmaxf
// would drop it). A row holding a NaN reduces to NaN on every thread, whichever order a tree or
// a warp's shuffles pair the values in, so a softmax or attention row with a NaN comes out NaN,
// not finite or masked, and every lane takes the same branch after the reduction.
template <typename T>
__device__ __forceinline__ T nan_max(T a, T b) {
  return (b > a || b != b) ? b : a;
}
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return nan_max(a, b); }
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
  // Only warp 0 reads the partials: a read of shared[0] by another warp could
  // race with thread 0's write of the total below (harmless, but racecheck's).
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

// ---------------- row kernels (softmax, layer_norm, cross_entropy) ----------------
// A row is reduced by one warp (rows up to 1024 elements) or one block; these
// give both the same interface so a row routine is written once.

// Grid size for a kernel with b independent units (rows), at most 65535 blocks;
// the kernels loop over the rest.
inline unsigned blocks_for(int64_t b) { return unsigned(b < 1 ? 1 : (b > 65535 ? 65535 : b)); }

// Streaming multiprocessors of t's device (cached per device).
inline int sm_count(const Tensor& t, const char* op) {
  static int cached[64] = {};
  const int d = t.device().index;
  if (d >= 0 && d < 64 && cached[d] > 0) return cached[d];
  int v = 0;
  CF_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d), op);
  v = v < 1 ? 1 : v;
  if (d >= 0 && d < 64) cached[d] = v;
  return v;
}

struct WarpRow {
  __device__ int lane() const { return int(threadIdx.x) % kWarp; }
  __device__ int size() const { return kWarp; }
  template <typename T>
  __device__ T max(T v) const {
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const T w = __shfl_xor_sync(0xffffffffu, v, o);
      v = MaxOp{}(v, w);  // NaN absorbs, as in BlockRow::max: every lane ends with the same value
    }
    return v;
  }
  __device__ double sum(double v) const {
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
  __device__ bool any(bool b) const { return __any_sync(0xffffffffu, b) != 0; }
};

struct BlockRow {
  double* shared;  // 32 doubles of __shared__ memory
  __device__ int lane() const { return int(threadIdx.x); }
  __device__ int size() const { return int(blockDim.x); }
  template <typename T>
  __device__ T max(T v) const {
    return block_reduce(v, MaxOp{}, T(-INFINITY), reinterpret_cast<T*>(shared));
  }
  __device__ double sum(double v) const { return block_reduce(v, SumOp{}, 0.0, shared); }
  __device__ bool any(bool b) const {
    return block_reduce(int(b), MaxOp{}, 0, reinterpret_cast<int*>(shared)) != 0;
  }
};

// Register-cached rows: each thread of a group of W holds VPT elements of a row.
// Scalar layout: slot i is element lane + i * W (every load instruction of a warp
// is coalesced, any stride). VEC layout (float rows that are contiguous, n % 4 == 0
// and 16-byte aligned): slots 4j..4j+3 are the 4 consecutive elements starting at
// 4 * (lane + j * W), read and written as one float4, which is what lets a warp
// per row reach memcpy bandwidth (scalar loads reached about 50-75% on an H100).
// The VEC the slot helpers get: float4 slots exist for float only (VPT >= 4).
template <typename T, bool VEC>
constexpr bool use_vec = VEC && std::is_same<T, float>::value;

template <bool VEC>
__device__ __forceinline__ int64_t slot_index(int lane, int i, int W) {
  return VEC ? 4 * (lane + int64_t(i / 4) * W) + i % 4 : lane + int64_t(i) * W;
}

// v[i] = row[slot_index(i) * step], `fill` beyond n.
template <bool VEC, int VPT, typename T>
__device__ __forceinline__ void load_slots(T (&v)[VPT], const T* row, int64_t step, int64_t n, int lane, int W,
                                           T fill) {
  if constexpr (VEC) {
    static_assert(std::is_same<T, float>::value && VPT % 4 == 0, "float4 slots need float and VPT % 4 == 0");
#pragma unroll
    for (int j = 0; j < VPT / 4; ++j) {
      const int64_t k = 4 * (lane + int64_t(j) * W);
      const float4 q = k < n ? *reinterpret_cast<const float4*>(row + k) : make_float4(fill, fill, fill, fill);
      v[4 * j] = q.x;
      v[4 * j + 1] = q.y;
      v[4 * j + 2] = q.z;
      v[4 * j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t k = lane + int64_t(i) * W;
      v[i] = k < n ? row[k * step] : fill;
    }
  }
}

// row[slot_index(i) * step] = v[i] for the slots inside the row.
template <bool VEC, int VPT, typename T>
__device__ __forceinline__ void store_slots(const T (&v)[VPT], T* row, int64_t step, int64_t n, int lane, int W) {
  if constexpr (VEC) {
    static_assert(std::is_same<T, float>::value && VPT % 4 == 0, "float4 slots need float and VPT % 4 == 0");
#pragma unroll
    for (int j = 0; j < VPT / 4; ++j) {
      const int64_t k = 4 * (lane + int64_t(j) * W);
      if (k < n) *reinterpret_cast<float4*>(row + k) = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t k = lane + int64_t(i) * W;
      if (k < n) row[k * step] = v[i];
    }
  }
}

// Whether float4 slots apply: float rows of n % 4 == 0 elements at 16-byte aligned
// starts (each pointer is a row-0 start of a contiguous tensor whose rows are n apart).
template <typename T>
inline bool vec4_rows(int64_t n, std::initializer_list<const void*> row0) {
  bool ok = std::is_same<T, float>::value && n % 4 == 0;
  for (const void* p : row0) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

constexpr int kRowBlock = 512;  // threads per row in the block-per-row kernels

}  // namespace cf::kernels::cu

// Launches the row-kernel instance for rows of n elements: WARP<T, VPT, VEC> (a warp
// per row, kThreads / 32 rows per block) up to 1024 elements, BLOCK<T, VPT, VEC> (a
// block of kRowBlock threads per row) beyond; rows up to 8 * kRowBlock elements stay
// in registers (VPT slots per thread), longer ones are re-read (VPT = 0). VEC (float4
// slots) is taken where `vec` and VPT % 4 == 0. The kernel arguments are the macro
// ARGS, #defined by the caller around the use.
#define CF_ROW_LAUNCH(WARP, BLOCK, rows, n, vec)                                                                    \
  do {                                                                                                              \
    namespace cu_ = ::cf::kernels::cu;                                                                              \
    const unsigned wb_ = cu_::blocks_for(((rows) + cu_::kThreads / cu_::kWarp - 1) / (cu_::kThreads / cu_::kWarp)); \
    const unsigned bb_ = cu_::blocks_for(rows);                                                                     \
    const bool v_ = (vec);                                                                                          \
    if ((n) <= 32)                                                                                                  \
      WARP<T, 1, false><<<wb_, cu_::kThreads, 0, ::cf::cuda::stream()>>>(ARGS);                                     \
    else if ((n) <= 64)                                                                                             \
      WARP<T, 2, false><<<wb_, cu_::kThreads, 0, ::cf::cuda::stream()>>>(ARGS);                                     \
    else if ((n) <= 128)                                                                                            \
      CF_ROW_LAUNCH_VEC_(WARP, 4, wb_, cu_::kThreads, v_);                                                          \
    else if ((n) <= 256)                                                                                            \
      CF_ROW_LAUNCH_VEC_(WARP, 8, wb_, cu_::kThreads, v_);                                                          \
    else if ((n) <= 512)                                                                                            \
      CF_ROW_LAUNCH_VEC_(WARP, 16, wb_, cu_::kThreads, v_);                                                         \
    else if ((n) <= 1024)                                                                                           \
      CF_ROW_LAUNCH_VEC_(WARP, 32, wb_, cu_::kThreads, v_);                                                         \
    else if ((n) <= 4 * cu_::kRowBlock)                                                                             \
      CF_ROW_LAUNCH_VEC_(BLOCK, 4, bb_, cu_::kRowBlock, v_);                                                        \
    else if ((n) <= 8 * cu_::kRowBlock)                                                                             \
      CF_ROW_LAUNCH_VEC_(BLOCK, 8, bb_, cu_::kRowBlock, v_);                                                        \
    else                                                                                                            \
      BLOCK<T, 0, false><<<bb_, cu_::kRowBlock, 0, ::cf::cuda::stream()>>>(ARGS);                                   \
  } while (0)
#define CF_ROW_LAUNCH_VEC_(K, VPT, grid, threads, v)                      \
  do {                                                                    \
    if ((v) && std::is_same<T, float>::value)                             \
      K<T, VPT, true><<<grid, threads, 0, ::cf::cuda::stream()>>>(ARGS);  \
    else                                                                  \
      K<T, VPT, false><<<grid, threads, 0, ::cf::cuda::stream()>>>(ARGS); \
  } while (0)
