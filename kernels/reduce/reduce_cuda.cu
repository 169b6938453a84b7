// CUDA reductions. Semantics are those of reduce_cpu.cpp (reduce.h states the
// contract): float inputs accumulate in double, int64 in int64; Max/Min keep the
// first extremum and let the first NaN win; LogSumExp is NaN when a NaN is reduced,
// else the maximum when it is infinite; Var divides by
// n - correction. Nothing here synchronises with the host.
//
// Shape of the work: x is seen as (outputs, reduced) with the kept axes and the
// reduced axes each merged where memory allows. Every op is a small "state" with
// push (one element, positions ascending within a thread), merge (two states;
// commutative where order could show, e.g. Max/Min break ties by position) and
// store. Three launch shapes share those states:
//   - row kernel: the reduced elements are contiguous (stride 1); a warp (rows up
//     to 1024) or a block (longer rows) per output, reads coalesced along the row;
//   - column kernel: otherwise (reduced axis strided, e.g. summing the leading axes
//     of a (rows, features) gradient); threads run over consecutive outputs, so
//     reads coalesce across the kept axis, and blockDim.y splits the reduced range;
//   - either is split further over gridDim.y chunks of the reduced range when there
//     are too few outputs to fill the GPU (a whole-tensor sum); the chunk states go
//     to a temporary buffer and a finish kernel merges them in chunk order.
// Every merge order is fixed by the launch shape, so results are deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/reduce/reduce.h"

namespace cf::kernels {

namespace {

using cu::kThreads;
constexpr unsigned kFull = 0xffffffffu;

// x split into kept and reduced axes (element strides), adjacent axes of each
// group merged when contiguous across (row-major position order is unchanged by
// that, so Max/Min indices are still positions over the reduced axes).
struct Geom {
  int nk = 0, nr = 0;
  int64_t ksz[kMaxDims] = {}, kst[kMaxDims] = {};
  int64_t rsz[kMaxDims] = {}, rst[kMaxDims] = {};
};

void push_axis(int& nd, int64_t* sz, int64_t* st, int64_t s, int64_t stride) {
  if (s == 1) return;  // no effect on offsets or positions
  if (nd > 0 && st[nd - 1] == stride * s) {
    sz[nd - 1] *= s;
    st[nd - 1] = stride;
    return;
  }
  sz[nd] = s;
  st[nd] = stride;
  ++nd;
}

Geom make_geom(const Tensor& x, const std::vector<int64_t>& axes) {
  Geom g;
  size_t j = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = j < axes.size() && axes[j] == d;
    if (reduced) ++j;
    const int64_t s = x.shape()[size_t(d)], st = x.strides()[size_t(d)];
    if (reduced)
      push_axis(g.nr, g.rsz, g.rst, s, st);
    else
      push_axis(g.nk, g.ksz, g.kst, s, st);
  }
  return g;
}

__device__ __forceinline__ int64_t offset_of(const int64_t* sz, const int64_t* st, int nd, int64_t i) {
  if (nd == 1) return i * st[0];
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    off += (i % sz[d]) * st[d];
    i /= sz[d];
  }
  return off;
}

struct Params {
  int64_t n_red = 0, correction = 0;
};

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  return v != v;  // false for int64
}

// ---------------------------------------------------------------- states

template <typename T>
using racc_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

template <typename T, bool kMean>
struct SumR {
  struct S {
    racc_t<T> a;
  };
  __device__ static S init() { return {racc_t<T>(0)}; }
  __device__ static void push(S& s, T v, int64_t) { s.a += racc_t<T>(v); }
  __device__ static S merge(S x, S y) { return {x.a + y.a}; }
  __device__ static S shfl(S s, int o) { return {__shfl_down_sync(kFull, s.a, o)}; }
  __device__ static void store(S s, T* o, int64_t*, int64_t oi, const Params& p) {
    o[oi] = kMean ? T(double(s.a) / double(p.n_red)) : T(s.a);
  }
};

// Max (kMax) or Min with the position of the winner. The sequential rule of the
// CPU (first element, then strict improvement, a NaN wins and sticks) gives: the
// first NaN if there is one, else the extremum with the smallest position. merge
// computes exactly that from any two disjoint parts, in any order.
template <typename T, bool kMax>
struct ExtR {
  struct S {
    T v;
    int64_t i;  // -1: empty
  };
  __device__ static bool better(T a, T b) { return kMax ? a > b : a < b; }
  __device__ static S init() { return {T(0), -1}; }
  __device__ static void push(S& s, T v, int64_t pos) {
    if (s.i < 0) {
      s = {v, pos};
      return;
    }
    if (is_nan(s.v)) return;
    if (is_nan(v) || better(v, s.v)) s = {v, pos};
  }
  __device__ static S merge(S a, S b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an != bn) return an ? a : b;
    if (!an) {
      if (better(b.v, a.v)) return b;
      if (better(a.v, b.v)) return a;
    }
    return a.i <= b.i ? a : b;  // equal (or both NaN): the first position
  }
  __device__ static S shfl(S s, int o) {
    return {__shfl_down_sync(kFull, s.v, o), __shfl_down_sync(kFull, s.i, o)};
  }
  __device__ static void store(S s, T* o, int64_t* ix, int64_t oi, const Params&) {
    o[oi] = s.v;
    if (ix) ix[oi] = s.i;
  }
};

// Online logsumexp in double: m = running maximum of the non-NaN values, a = sum of exp(v - m)
// rescaled when m grows. A NaN makes `a` NaN for good (NaN * 0 is NaN), and nothing else does:
// -inf entries add nothing (skipping them avoids exp(-inf - -inf)), nor do entries once m is
// +inf (exp(inf - inf) would be NaN). Stored like the CPU: NaN when a NaN was reduced, m when
// m is infinite, else m + log(a).
template <typename T>
struct LseR {
  struct S {
    double m, a;
  };
  __device__ static S init() { return {-INFINITY, 0.0}; }
  __device__ static void push(S& s, T v0, int64_t) {
    const double v = double(v0);
    if (v != v) {
      s.a = NAN;
    } else if (v > s.m) {
      s.a = s.a * exp(s.m - v) + 1.0;
      s.m = v;
    } else if (v != -INFINITY && s.m != INFINITY) {
      s.a += exp(v - s.m);
    }
  }
  __device__ static S merge(S x, S y) {
    const double m = x.m > y.m ? x.m : y.m;
    if (m == -INFINITY) return {m, x.a + y.a};  // both empty of finite values (a is 0 or NaN)
    if (m == INFINITY) return {m, x.a + y.a != x.a + y.a ? NAN : 1.0};  // only a NaN matters now
    return {m, x.a * exp(x.m - m) + y.a * exp(y.m - m)};
  }
  __device__ static S shfl(S s, int o) {
    return {__shfl_down_sync(kFull, s.m, o), __shfl_down_sync(kFull, s.a, o)};
  }
  __device__ static void store(S s, T* o, int64_t*, int64_t oi, const Params&) {
    o[oi] = s.a != s.a ? T(NAN) : isinf(s.m) ? T(s.m) : T(s.m + log(s.a));
  }
};

// Welford in double, merged with Chan's formula (numerically equivalent to the
// CPU's two passes in double; float32 outputs agree to rounding).
template <typename T>
struct VarR {
  struct S {
    int64_t n;
    double mean, m2;
  };
  __device__ static S init() { return {0, 0.0, 0.0}; }
  __device__ static void push(S& s, T v0, int64_t) {
    const double v = double(v0);
    ++s.n;
    const double d = v - s.mean;
    s.mean += d / double(s.n);
    s.m2 += d * (v - s.mean);
  }
  __device__ static S merge(S x, S y) {
    if (x.n == 0) return y;
    if (y.n == 0) return x;
    const int64_t n = x.n + y.n;
    const double d = y.mean - x.mean, fx = double(x.n), fy = double(y.n);
    return {n, x.mean + d * (fy / double(n)), x.m2 + y.m2 + d * d * (fx * fy / double(n))};
  }
  __device__ static S shfl(S s, int o) {
    return {__shfl_down_sync(kFull, s.n, o), __shfl_down_sync(kFull, s.mean, o),
            __shfl_down_sync(kFull, s.m2, o)};
  }
  __device__ static void store(S s, T* o, int64_t*, int64_t oi, const Params& p) {
    o[oi] = T(s.m2 / double(p.n_red - p.correction));
  }
};

// ---------------------------------------------------------------- kernels

// Pushes positions begin, begin + step, ... < end of the reduced region at base.
template <class R, typename T>
__device__ __forceinline__ void accumulate(typename R::S& s, const T* x, const Geom& g, int64_t base,
                                           int64_t begin, int64_t end, int64_t step) {
  if (g.nr == 1) {
    const int64_t st = g.rst[0];
    for (int64_t j = begin; j < end; j += step) R::push(s, x[base + j * st], j);
  } else {
    for (int64_t j = begin; j < end; j += step) R::push(s, x[base + offset_of(g.rsz, g.rst, g.nr, j)], j);
  }
}

template <class R>
__device__ __forceinline__ typename R::S warp_merge(typename R::S s) {
  for (int o = cu::kWarp / 2; o > 0; o >>= 1) s = R::merge(s, R::shfl(s, o));
  return s;  // lane 0 holds the warp's state
}

// Chunk c of gridDim.y: its range of reduced positions.
__device__ __forceinline__ void chunk_range(int64_t n_red, int64_t& begin, int64_t& end) {
  const int64_t c = blockIdx.y, chunks = gridDim.y;
  begin = n_red * c / chunks;
  end = n_red * (c + 1) / chunks;
}

// G threads (32: a warp, kThreads: the block) per output; blockDim.x == kThreads.
template <class R, typename T, int G>
__global__ void row_kernel(const T* x, Geom g, int64_t n_out, T* o, int64_t* ix, Params p,
                           typename R::S* partial) {
  using S = typename R::S;
  constexpr int kPer = kThreads / G;
  __shared__ S sh[kThreads / cu::kWarp];
  int64_t begin, end;
  chunk_range(p.n_red, begin, end);
  const int lane = int(threadIdx.x) % G, grp = int(threadIdx.x) / G;
  // Block-uniform loop (the block reduction below synchronises).
  for (int64_t ob = int64_t(blockIdx.x) * kPer; ob < n_out; ob += int64_t(gridDim.x) * kPer) {
    const int64_t oi = ob + grp;
    S s = R::init();
    if (oi < n_out) accumulate<R>(s, x, g, offset_of(g.ksz, g.kst, g.nk, oi), begin + lane, end, G);
    s = warp_merge<R>(s);
    if constexpr (G > cu::kWarp) {
      const int w = int(threadIdx.x) / cu::kWarp;
      if (threadIdx.x % cu::kWarp == 0) sh[w] = s;
      __syncthreads();
      if (w == 0) {
        s = threadIdx.x < kThreads / cu::kWarp ? sh[threadIdx.x] : R::init();
        s = warp_merge<R>(s);
      }
      __syncthreads();
    }
    if (lane == 0 && oi < n_out) {
      if (gridDim.y == 1)
        R::store(s, o, ix, oi, p);
      else
        partial[oi * gridDim.y + blockIdx.y] = s;
    }
  }
}

// threadIdx.x over consecutive outputs, threadIdx.y over the reduced range;
// blockDim.x * blockDim.y == kThreads.
template <class R, typename T>
__global__ void col_kernel(const T* x, Geom g, int64_t n_out, T* o, int64_t* ix, Params p,
                           typename R::S* partial) {
  using S = typename R::S;
  __shared__ S sh[kThreads];
  int64_t begin, end;
  chunk_range(p.n_red, begin, end);
  const int bx = int(blockDim.x), by = int(blockDim.y), tx = int(threadIdx.x), ty = int(threadIdx.y);
  for (int64_t ob = int64_t(blockIdx.x) * bx; ob < n_out; ob += int64_t(gridDim.x) * bx) {
    const int64_t oi = ob + tx;
    S s = R::init();
    if (oi < n_out) accumulate<R>(s, x, g, offset_of(g.ksz, g.kst, g.nk, oi), begin + ty, end, by);
    if (by > 1) {
      sh[ty * bx + tx] = s;
      __syncthreads();
      if (ty == 0)
        for (int k = 1; k < by; ++k) s = R::merge(s, sh[k * bx + tx]);
      __syncthreads();
    }
    if (ty == 0 && oi < n_out) {
      if (gridDim.y == 1)
        R::store(s, o, ix, oi, p);
      else
        partial[oi * gridDim.y + blockIdx.y] = s;
    }
  }
}

// Merges each output's chunk states in chunk order.
template <class R, typename T>
__global__ void finish_kernel(const typename R::S* partial, int64_t chunks, int64_t n_out, T* o,
                              int64_t* ix, Params p) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t oi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; oi < n_out; oi += step) {
    typename R::S s = partial[oi * chunks];
    for (int64_t c = 1; c < chunks; ++c) s = R::merge(s, partial[oi * chunks + c]);
    R::store(s, o, ix, oi, p);
  }
}

// Chunks of the reduced range so that about 4 blocks per SM run when `blocks`
// (the launch without chunking) is too small; each chunk keeps >= `min_len` elements.
int64_t chunks_for(int64_t blocks, int64_t n_red, int64_t min_len, int sms) {
  if (blocks >= 2 * int64_t(sms) || n_red < 2 * min_len) return 1;
  int64_t c = (4 * int64_t(sms) + blocks - 1) / blocks;
  c = std::min(c, n_red / min_len);
  return std::max<int64_t>(1, std::min<int64_t>(c, 1024));
}

template <class R, typename T>
void launch(const Tensor& x, const Geom& g, int64_t n_out, const Tensor& out, const Tensor& indices,
            const Params& p) {
  using S = typename R::S;
  const T* xp = cu::ptr<const T>(x);
  T* op = cu::ptr<T>(out);
  int64_t* ip = indices.defined() ? cu::ptr<int64_t>(indices) : nullptr;
  const int sms = cu::sm_count(x, "reduce");
  const bool row = g.nr >= 1 && g.rst[g.nr - 1] == 1 && p.n_red >= cu::kWarp;
  int64_t chunks = 1, blocks = 0;
  dim3 block;
  if (row) {
    const bool whole_block = p.n_red >= 1024;
    const int per = whole_block ? 1 : kThreads / cu::kWarp;
    blocks = (n_out + per - 1) / per;
    chunks = chunks_for(blocks, p.n_red, whole_block ? 8 * kThreads : 8 * cu::kWarp, sms);
    block = dim3(kThreads);
  } else {
    const int by = p.n_red >= 64 ? 8 : 1, bx = kThreads / by;
    blocks = (n_out + bx - 1) / bx;
    chunks = chunks_for(blocks, p.n_red, 64 * by, sms);
    block = dim3(unsigned(bx), unsigned(by));
  }
  Tensor temp;
  S* partial = nullptr;
  if (chunks > 1) {
    const int64_t bytes = n_out * chunks * int64_t(sizeof(S));
    temp = Tensor::empty({(bytes + 7) / 8}, kInt64, x.device());  // through cf's caching allocator
    partial = static_cast<S*>(temp.raw_data());
  }
  const dim3 grid(cu::blocks_for(blocks), unsigned(chunks));
  if (row) {
    if (p.n_red >= 1024)
      row_kernel<R, T, kThreads><<<grid, block, 0, ::cf::cuda::stream()>>>(xp, g, n_out, op, ip, p, partial);
    else
      row_kernel<R, T, cu::kWarp><<<grid, block, 0, ::cf::cuda::stream()>>>(xp, g, n_out, op, ip, p, partial);
  } else {
    col_kernel<R, T><<<grid, block, 0, ::cf::cuda::stream()>>>(xp, g, n_out, op, ip, p, partial);
  }
  ::cf::cuda::check_launch("reduce");
  if (chunks > 1) {
    finish_kernel<R, T><<<cu::grid_for(n_out), kThreads, 0, ::cf::cuda::stream()>>>(partial, chunks, n_out, op, ip, p);
    ::cf::cuda::check_launch("reduce");
  }
}

template <typename T>
void reduce_typed(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                  const Tensor& indices, int64_t correction) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  Geom g = make_geom(x, axes);
  Params p;
  p.n_red = 1;
  for (int d = 0; d < g.nr; ++d) p.n_red *= g.rsz[d];
  p.correction = correction;
  cu::use_device_of(out, "reduce");
  switch (op) {
    case ReduceOp::Sum: launch<SumR<T, false>, T>(x, g, n_out, out, indices, p); break;
    case ReduceOp::Mean: launch<SumR<T, true>, T>(x, g, n_out, out, indices, p); break;
    case ReduceOp::Max: launch<ExtR<T, true>, T>(x, g, n_out, out, indices, p); break;
    case ReduceOp::Min: launch<ExtR<T, false>, T>(x, g, n_out, out, indices, p); break;
    case ReduceOp::LogSumExp:
    case ReduceOp::Var:
      // Floating only (the ops refuse integer inputs first): not instantiated for int64, where LseR's NaN
      // would not fit the type (nvcc warned #173-D on the H200 build).
      if constexpr (std::is_floating_point_v<T>) {
        if (op == ReduceOp::LogSumExp) launch<LseR<T>, T>(x, g, n_out, out, indices, p);
        else launch<VarR<T>, T>(x, g, n_out, out, indices, p);
      } else {
        CF_CHECK(false, Error, "[reduce] internal: logsumexp / var of ", x.describe());
      }
      break;
  }
}

// signed_argmax (reduce.h): one thread per row (grid-stride over rows).
template <typename T>
__global__ void signed_argmax_kernel(const T* x, int64_t rows, int64_t n, int64_t* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += step)
    out[r] = signed_argmax_row(x + r * n, n);
}

}  // namespace

void signed_argmax_cuda(const Tensor& x, const Tensor& out) {
  const int64_t n = x.shape().back(), rows = n ? x.numel() / n : 0;
  if (rows == 0) return;
  cu::use_device_of(out, "signed_argmax");
  CF_DISPATCH_FLOAT_STD(x.dtype(), "signed_argmax",
                        (signed_argmax_kernel<scalar_t><<<cu::grid_for(rows), cu::kThreads, 0, ::cf::cuda::stream()>>>(
                            cu::ptr<const scalar_t>(x), rows, n, cu::ptr<int64_t>(out))));
  ::cf::cuda::check_launch("signed_argmax");
}

void reduce_cuda(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                 const Tensor& indices, int64_t correction) {
  if (is_low_precision(x.dtype())) {  // float32 copy, accumulation as for float32, one rounding
    Tensor of = float32_buffer_for(out);
    reduce_typed<float>(op, upcast_float32(x), axes, of, indices, correction);
    downcast_into(of, out);
    return;
  }
  CF_DISPATCH_NUMERIC_STD(x.dtype(), "reduce", reduce_typed<scalar_t>(op, x, axes, out, indices, correction));
}

}  // namespace cf::kernels
