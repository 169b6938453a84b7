// CUDA arm of query hashing and Hamming K-Means (kernels/kmeans/hamming.h), the
// same contracts and tie rules as hamming_cpu.cpp:
//  - hashing: a thread per row packs the signs of its projections;
//  - Hamming K-Means: a block per row (one (batch, head) problem), its codes,
//    assignments and distances in global scratch, block reductions for the
//    farthest-point picks (lowest index among equal distances, as the CPU's
//    first-maximum scan), integer atomics for the counts and the majority votes
//    (exact, so the result is the CPU's bit for bit).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/kmeans/hamming.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
using cu::kWarp;

// ---------------------------------------------------------------- hashing
template <typename T>
__global__ void pack_signs_kernel(const T* proj, int64_t rows, int64_t bits, int64_t* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += step) {
    const T* p = proj + r * bits;
    uint64_t c = 0;
    for (int64_t j = 0; j < bits; ++j) c |= uint64_t(p[j] > T(0)) << j;
    out[r] = int64_t(c);
  }
}

// ---------------------------------------------------------------- Hamming K-Means
constexpr int kHamThreads = 256;
constexpr int kBig = 1 << 30;

struct ArgMax {
  int value;      // -1: no candidate
  int64_t index;  // the lowest index holding `value`
};

// Larger value wins; equal values: the lower index (an empty candidate never wins).
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.value >= 0 && b.index < a.index)) return b;
  return a;
}

// The block's best (value, index); every thread gets it. `sv`/`si` hold 32 entries.
__device__ ArgMax block_argmax(ArgMax v, int* sv, int64_t* si) {
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    ArgMax w{__shfl_down_sync(0xffffffffu, v.value, o), __shfl_down_sync(0xffffffffu, v.index, o)};
    v = better(v, w);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // the shared slots may still be read by the previous call
  if (lane == 0) {
    sv[warp] = v.value;
    si[warp] = v.index;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = int(blockDim.x) / kWarp;
    ArgMax w = lane < warps ? ArgMax{sv[lane], si[lane]} : ArgMax{-1, 0};
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      ArgMax u{__shfl_down_sync(0xffffffffu, w.value, o), __shfl_down_sync(0xffffffffu, w.index, o)};
      w = better(w, u);
    }
    if (lane == 0) {
      sv[0] = w.value;
      si[0] = w.index;
    }
  }
  __syncthreads();
  return ArgMax{sv[0], si[0]};
}

// Per-row global scratch: cen (C) uint64, count (C) int, ones (C * bits) int,
// dist (N) int, mind (N) int. Entry i of the row is valid when excl is null or
// !excl[i]; the CPU compacts the valid entries first, which keeps their order, so
// "the lowest valid index" is the same entry on both devices.
__global__ void hamming_kmeans_kernel(const int64_t* codes, const bool* excl, int64_t g_rows, int64_t n,
                                      int64_t clusters, int64_t iterations, int64_t bits, uint64_t* cen_all,
                                      int* count_all, int* ones_all, int* dist_all, int* mind_all, int64_t* out) {
  __shared__ int sv[kWarp];
  __shared__ int64_t si[kWarp];
  __shared__ int s_flag;
  for (int64_t row = blockIdx.x; row < g_rows; row += gridDim.x) {
    const uint64_t* x = reinterpret_cast<const uint64_t*>(codes + row * n);
    const bool* ex = excl ? excl + row * n : nullptr;
    int64_t* a = out + row * n;
    int* dist = dist_all + row * n;
    int* mind = mind_all + row * n;
    uint64_t* cen = cen_all + row * clusters;
    int* count = count_all + row * clusters;
    int* ones = ones_all + row * clusters * bits;
    auto valid = [&](int64_t i) { return ex == nullptr || !ex[i]; };

    // m = the valid entries; the first valid one is the first seed.
    int local = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (valid(i)) {
        ++local;
        mind[i] = kBig;
      } else {
        a[i] = -1;
      }
    }
    const int m = cu::block_reduce(local, cu::SumOp{}, 0, sv);
    if (m == 0) continue;  // uniform: every thread read the same m
    const int64_t c = clusters < m ? clusters : m;
    ArgMax first{-1, 0};
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      if (valid(i) && (first.value < 0 || i < first.index)) first = ArgMax{0, i};
    int64_t pick = block_argmax(first, sv, si).index;

    // Farthest-point initialisation: seed j is the entry farthest from seeds < j.
    for (int64_t j = 0; j < c; ++j) {
      const uint64_t cj = x[pick];
      if (threadIdx.x == 0) cen[j] = cj;
      ArgMax best{-1, 0};
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (!valid(i)) continue;
        const int h = __popcll(x[i] ^ cj);
        if (h < mind[i]) mind[i] = h;
        best = better(best, ArgMax{mind[i], i});
      }
      pick = block_argmax(best, sv, si).index;
    }
    __syncthreads();

    // Nearest seed of every entry (lowest id on ties), then the re-seeding of
    // empty clusters from the farthest member of a cluster of two or more.
    auto assign = [&]() {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) count[j] = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (!valid(i)) continue;
        int best = kBig;
        int64_t bj = 0;
        for (int64_t j = 0; j < c; ++j) {
          const int h = __popcll(x[i] ^ cen[j]);
          if (h < best) {
            best = h;
            bj = j;
          }
        }
        a[i] = bj;
        dist[i] = best;
        atomicAdd(count + bj, 1);
      }
      __syncthreads();
      for (int64_t j = 0; j < c; ++j) {
        if (count[j] > 0) continue;  // uniform: count is re-read after each barrier
        ArgMax far{-1, 0};
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
          if (valid(i) && count[a[i]] >= 2) far = better(far, ArgMax{dist[i], i});
        far = block_argmax(far, sv, si);
        if (far.value <= 0) break;  // no candidate, or only duplicates left
        if (threadIdx.x == 0) {
          --count[a[far.index]];
          a[far.index] = j;
          dist[far.index] = 0;
          cen[j] = x[far.index];
          count[j] = 1;
        }
        __syncthreads();
      }
      __syncthreads();
    };
    assign();

    for (int64_t it = 0; it < iterations; ++it) {
      for (int64_t e = threadIdx.x; e < c * bits; e += blockDim.x) ones[e] = 0;
      if (threadIdx.x == 0) s_flag = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (!valid(i)) continue;
        int* o = ones + a[i] * bits;
        // Only the low `bits` bits are counted: a code with higher bits set is a
        // deferred error (autograd/ops/clustering.cpp), and must not write past its row.
        for (uint64_t v = x[i] & ((uint64_t(1) << bits) - 1); v; v &= v - 1) atomicAdd(o + (__ffsll(int64_t(v)) - 1), 1);
      }
      __syncthreads();
      // Majority vote per bit; a tie keeps the old bit.
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        if (count[j] == 0) continue;
        uint64_t cj = cen[j];
        for (int64_t b = 0; b < bits; ++b) {
          const int twice = 2 * ones[j * bits + b];
          if (twice > count[j])
            cj |= uint64_t(1) << b;
          else if (twice < count[j])
            cj &= ~(uint64_t(1) << b);
        }
        if (cj != cen[j]) {
          cen[j] = cj;
          s_flag = 1;
        }
      }
      __syncthreads();
      const bool changed = s_flag != 0;
      __syncthreads();
      if (!changed) break;  // a fixed point, as on the CPU
      assign();
    }
    __syncthreads();  // the next row reuses the shared slots
  }
}

}  // namespace

void hash_pack_signs_cuda(const Tensor& proj, const Tensor& out) {
  const int64_t rows = proj.size(0), bits = proj.size(1);
  if (rows == 0) return;
  cu::use_device_of(proj, "hash_codes");
  CF_DISPATCH_FLOAT_STD(proj.dtype(), "hash_codes",
                        (pack_signs_kernel<scalar_t><<<cu::grid_for(rows), kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<scalar_t>(proj), rows, bits, cu::ptr<int64_t>(out))));
  ::cf::cuda::check_launch("hash_codes");
}

void hamming_kmeans_cuda(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                         int64_t bits, const Tensor& out) {
  const int64_t g = codes.size(0), n = codes.size(1);
  if (g == 0 || n == 0) return;
  CF_CHECK(n <= INT_MAX, ValueError, "[hamming_kmeans] rows of ", n, " codes exceed the CUDA kernel's limit (",
           INT_MAX, ")");
  const int64_t c = std::min(clusters, n);  // no row uses more
  const Device dev = codes.device();
  cu::use_device_of(codes, "hamming_kmeans");
  Tensor cen = Tensor::empty({g * c}, kInt64, dev);
  // int32 scratch in int64 tensors (cf has no int32 dtype): two per element.
  auto ints = [&](int64_t count) { return Tensor::empty({count / 2 + 1}, kInt64, dev); };
  Tensor counts = ints(g * c), ones = ints(g * c * bits), dist = ints(g * n), mind = ints(g * n);
  hamming_kmeans_kernel<<<cu::blocks_for(g), kHamThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<int64_t>(codes), exclude.defined() ? cu::ptr<bool>(exclude) : nullptr, g, n, c, iterations, bits,
      reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(cen)), cu::ptr<int>(counts), cu::ptr<int>(ones), cu::ptr<int>(dist),
      cu::ptr<int>(mind), cu::ptr<int64_t>(out));
  ::cf::cuda::check_launch("hamming_kmeans");
}

}  // namespace cf::kernels
