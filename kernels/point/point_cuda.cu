// CUDA arm of the point-set kernels (kernels/point/point.h), the same results
// as point_cpu.cpp bit for bit:
//  - sampling: a block per batch row, the running distances in global scratch;
//    each step is two block reductions, the largest distance and then the lowest
//    index holding it (the CPU's first-maximum scan). Distances sum over C in
//    the CPU's order, in double.
//  - group maxima: an atomic max per entry into a (rows, groups) double table
//    (max is exact, so the order of the atomics does not matter), then a gather;
//    from sorted ids (groups > 4 entries): a thread per run of equal ids.
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/point/point.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

__global__ void fps_kernel(const double* P, const bool* pad, int64_t b, int64_t n, int64_t c, int64_t m,
                           double* dist, int64_t* out) {
  __shared__ double sv[32];
  __shared__ long long si[32];
  const double kInf = INFINITY;
  for (int64_t r = blockIdx.x; r < b; r += gridDim.x) {
    const double* base = P + r * n * c;
    const bool* pr = pad ? pad + r * n : nullptr;
    double* d = dist + r * n;
    // The first real point (0 when every point is padding).
    long long first = LLONG_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const bool padded = pr && pr[i];
      d[i] = padded ? -1.0 : kInf;
      if (!padded && i < first) first = i;
    }
    first = cu::block_reduce(first, cu::MinOp(), LLONG_MAX, si);
    int64_t cur = first == LLONG_MAX ? 0 : first;
    for (int64_t j = 0; j < m; ++j) {
      if (threadIdx.x == 0) {
        out[r * m + j] = cur;
        d[cur] = -kInf;
      }
      __syncthreads();
      const double* pc = base + cur * c;
      double best = -kInf;
      long long best_i = LLONG_MAX;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double di = d[i];
        if (di >= 0) {  // real and not taken
          const double* pi = base + i * c;
          double s = 0;
          for (int64_t a = 0; a < c; ++a) {
            const double t = pi[a] - pc[a];
            s += t * t;
          }
          di = fmin(di, s);
          d[i] = di;
        }
        if (di > best) {  // increasing i: the thread keeps its first maximum
          best = di;
          best_i = i;
        }
      }
      const double top = cu::block_reduce(best, cu::MaxOp(), -kInf, sv);
      const long long at = cu::block_reduce(best == top && top > -kInf ? best_i : LLONG_MAX, cu::MinOp(),
                                            LLONG_MAX, si);
      cur = at == LLONG_MAX ? 0 : at;
    }
    __syncthreads();  // the next row reuses the shared slots
  }
}

__device__ __forceinline__ void atomic_max_double(double* addr, double v) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(addr);
  unsigned long long old = *p;
  while (__longlong_as_double(static_cast<long long>(old)) < v) {
    const unsigned long long prev = atomicCAS(p, old, static_cast<unsigned long long>(__double_as_longlong(v)));
    if (prev == old) break;
    old = prev;
  }
}

template <typename T>
__global__ void group_max_scatter_kernel(const T* s, const int64_t* grp, int64_t total, int64_t e, int64_t groups,
                                         double* mx) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
    atomic_max_double(mx + (i / e) * groups + cu::clamp_index(grp[i], groups), double(s[i]));
}

template <typename T>
__global__ void group_max_gather_kernel(const int64_t* grp, int64_t total, int64_t e, int64_t groups,
                                        const double* mx, T* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const double v = mx[(i / e) * groups + cu::clamp_index(grp[i], groups)];
    out[i] = isfinite(v) ? T(v) : T(0);
  }
}

// Entry i of the sorted keys starts a run when it is its row's first or its key differs from the one
// before; that thread takes the run's maximum and writes it to the run's entries. (A run is walked by
// one thread: this path serves sparse ids, where runs are short.)
template <typename T>
__global__ void group_max_runs_kernel(const T* s, const int64_t* keys, const int64_t* perm, int64_t total, int64_t e,
                                      T* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t c = i % e, row = i - c;
    if (c > 0 && keys[i] == keys[i - 1]) continue;
    const int64_t end = row + e;
    double v = -INFINITY;
    int64_t j = i;
    for (; j < end && keys[j] == keys[i]; ++j) v = fmax(v, double(s[row + perm[j]]));
    const T w = isfinite(v) ? T(v) : T(0);
    for (int64_t t = i; t < j; ++t) out[row + perm[t]] = w;
  }
}

}  // namespace

void farthest_point_sampling_cuda(const Tensor& points, const Tensor& pad, const Tensor& out) {
  const int64_t b = points.size(0), n = points.size(1), c = points.size(2), m = out.size(1);
  if (b == 0 || m == 0) return;
  cu::use_device_of(points, "farthest_point_sampling");
  Tensor dist = Tensor::empty({b * n}, kFloat64, points.device());
  fps_kernel<<<cu::blocks_for(b), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<double>(points), pad.defined() ? cu::ptr<bool>(pad) : nullptr, b, n, c, m, cu::ptr<double>(dist),
      cu::ptr<int64_t>(out));
  ::cf::cuda::check_launch("farthest_point_sampling");
}

void group_max_cuda(const Tensor& src, const Tensor& group, int64_t groups, const Tensor& out) {
  const int64_t rows = src.size(0), e = src.size(1), total = rows * e;
  if (total == 0) return;
  cu::use_device_of(src, "group_max");
  // One running maximum per (row, group): the table is rows x groups doubles (groups <= 4 e: the op takes
  // group_max_sorted beyond).
  Tensor mx = Tensor::full({rows * groups}, -std::numeric_limits<double>::infinity(), kFloat64, src.device());
  CF_DISPATCH_FLOAT_STD(src.dtype(), "group_max",
                        (group_max_scatter_kernel<scalar_t><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(src), cu::ptr<int64_t>(group), total, e, groups, cu::ptr<double>(mx)));
                        ::cf::cuda::check_launch("group_max");
                        (group_max_gather_kernel<scalar_t><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<int64_t>(group), total, e, groups, cu::ptr<double>(mx), cu::ptr<scalar_t>(out))));
  ::cf::cuda::check_launch("group_max");
}

void group_max_sorted_cuda(const Tensor& src, const Tensor& keys, const Tensor& perm, const Tensor& out) {
  const int64_t e = src.size(1), total = src.size(0) * e;
  if (total == 0) return;
  cu::use_device_of(src, "group_max");
  CF_DISPATCH_FLOAT_STD(
      src.dtype(), "group_max",
      (group_max_runs_kernel<scalar_t><<<cu::grid_for(total), kThreads, 0, ::cf::cuda::stream()>>>(
          cu::ptr<scalar_t>(src), cu::ptr<int64_t>(keys), cu::ptr<int64_t>(perm), total, e, cu::ptr<scalar_t>(out))));
  ::cf::cuda::check_launch("group_max");
}

}  // namespace cf::kernels
