// CUDA sort / top-k along one axis. Order rules: sort.h (value, then original
// position; NaN largest and tied; -0.0 == 0.0), as implemented by sort_cpu.cpp.
//
// Plan: each chunk of lines is copied into a contiguous (lines, len) buffer of
// unsigned radix keys whose plain ascending order is the wanted order, with the
// position j along the axis as the value; CUB's radix sort (stable: equal keys
// keep their input order, i.e. ascending j) sorts every line; the first k
// (value, index) pairs of each line are then written to the strided outputs.
// Descending order complements the keys and still sorts ascending, so ties keep
// ascending positions in both directions without relying on how CUB's
// SortPairsDescending treats equal keys.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/sort/sort.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

template <typename T>
using key_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

// Order-preserving map to unsigned keys. Floats: NaN canonicalised to one
// positive quiet NaN (above +inf after the map, all NaNs equal), -0.0 to +0.0
// (equal to it, as value_less in sort_cpu.cpp says), then the usual sign flip:
// negative -> all bits inverted, positive -> sign bit set.
__device__ __forceinline__ uint32_t radix_key(float v) {
  uint32_t u = isnan(v) ? 0x7fc00000u : (v == 0.0f ? 0u : __float_as_uint(v));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t radix_key(double v) {
  uint64_t u = isnan(v) ? 0x7ff8000000000000ull : (v == 0.0 ? 0ull : uint64_t(__double_as_longlong(v)));
  return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ uint64_t radix_key(int64_t v) { return uint64_t(v) ^ 0x8000000000000000ull; }

// keys/pos of lines [line0, line0 + n / len) of x, contiguous with the axis last.
template <typename T>
__global__ void sort_keys_kernel(LoopPlan<3> p, const char* x, int64_t x_as, int64_t len, int64_t line0,
                                 int64_t n, bool descending, key_t<T>* keys, int32_t* pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t line = line0 + i / len, j = i % len;
    int64_t off[3];
    cu::plan_offsets<3>(p, line, off);
    const key_t<T> key = radix_key(*reinterpret_cast<const T*>(x + off[0] + j * x_as));
    keys[i] = descending ? key_t<T>(~key) : key;
    pos[i] = int32_t(j);
  }
}

// The first k sorted entries of each line: the original value (NaN payloads and
// -0.0 kept, as on the CPU) and its position.
template <typename T>
__global__ void sort_write_kernel(LoopPlan<3> p, const char* x, char* vals, char* idx, int64_t x_as,
                                  int64_t v_as, int64_t i_as, int64_t len, int64_t k, int64_t line0,
                                  int64_t n, const int32_t* pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t l = i / k, j = i % k;
    int64_t off[3];
    cu::plan_offsets<3>(p, line0 + l, off);
    const int64_t src = pos[l * len + j];
    if (vals)
      *reinterpret_cast<T*>(vals + off[1] + j * v_as) = *reinterpret_cast<const T*>(x + off[0] + src * x_as);
    *reinterpret_cast<int64_t*>(idx + off[2] + j * i_as) = src;
  }
}

__global__ void segment_offsets_kernel(int* offsets, int lines, int len) {
  const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i <= lines) offsets[i] = i * len;
}

// A device tensor of at least `bytes` bytes from cf's caching allocator (never
// cudaMalloc: CUB's temporary storage included).
Tensor device_bytes(size_t bytes, Device d) { return Tensor::empty({int64_t((bytes + 7) / 8) + 1}, kInt64, d); }

// Items sorted per chunk: bounds the temporary buffers (~24 bytes an item) and
// keeps counts within CUB's int segment offsets.
constexpr int64_t kChunkItems = int64_t(1) << 27;

template <typename T>
void sort_typed(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
                const Tensor& indices) {
  using K = key_t<T>;
  const int64_t len = x.shape()[size_t(axis)];
  if (k == 0 || x.numel() == 0) return;
  CF_CHECK(len <= INT_MAX, ValueError, "[sort] a line of ", len, " elements is too long for the CUDA sort (at most ",
           INT_MAX, ")");
  const int64_t lines = x.numel() / len;
  // Non-axis dimensions, shared by x and the outputs (length k on `axis`).
  Shape sizes, xst, vst, ist;
  const Tensor& vt = values.defined() ? values : indices;  // placeholder when values are skipped
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == axis) continue;
    sizes.push_back(x.shape()[size_t(d)]);
    xst.push_back(x.strides()[size_t(d)]);
    vst.push_back(vt.strides()[size_t(d)]);
    ist.push_back(indices.strides()[size_t(d)]);
  }
  Tensor xv = make_view(x, sizes, xst, x.offset());
  Tensor vv = make_view(vt, sizes, vst, vt.offset());
  Tensor iv = make_view(indices, sizes, ist, indices.offset());
  LoopPlan<3> p = make_loop_plan<3>(sizes, {&xv, &vv, &iv});
  const int64_t x_as = x.strides()[size_t(axis)] * int64_t(sizeof(T));
  const int64_t v_as = vt.strides()[size_t(axis)] * int64_t(dtype_size(vt.dtype()));
  const int64_t i_as = indices.strides()[size_t(axis)] * int64_t(sizeof(int64_t));
  const char* px = static_cast<const char*>(x.raw_data());
  char* pv = values.defined() ? static_cast<char*>(values.raw_data()) : nullptr;
  char* pi = static_cast<char*>(indices.raw_data());

  cu::use_device_of(x, "sort");
  const Device dev = x.device();
  const int64_t chunk_lines = std::max<int64_t>(1, std::min<int64_t>(lines, kChunkItems / len));
  const int64_t cap = chunk_lines * len;
  Tensor keys_in = device_bytes(size_t(cap) * sizeof(K), dev), keys_out = device_bytes(size_t(cap) * sizeof(K), dev);
  Tensor pos_in = device_bytes(size_t(cap) * 4, dev), pos_out = device_bytes(size_t(cap) * 4, dev);
  K* ki = static_cast<K*>(keys_in.raw_data());
  K* ko = static_cast<K*>(keys_out.raw_data());
  int32_t* vi = static_cast<int32_t*>(pos_in.raw_data());
  int32_t* vo = static_cast<int32_t*>(pos_out.raw_data());
  // Segment offsets 0, len, 2 len, ...: every chunk has the same line length, so
  // one array serves all of them (a chunk of c lines reads the first c + 1).
  Tensor offsets;
  if (chunk_lines > 1) {
    offsets = device_bytes(size_t(chunk_lines + 1) * sizeof(int), dev);
    segment_offsets_kernel<<<cu::grid_for(chunk_lines + 1), kThreads, 0, ::cf::cuda::stream()>>>(
        static_cast<int*>(offsets.raw_data()), int(chunk_lines), int(len));
    ::cf::cuda::check_launch("sort");
  }
  Tensor temp;
  size_t temp_cap = 0;
  for (int64_t line0 = 0; line0 < lines; line0 += chunk_lines) {
    const int64_t c = std::min(chunk_lines, lines - line0), n = c * len;
    sort_keys_kernel<T>
        <<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(p, px, x_as, len, line0, n, descending, ki, vi);
    ::cf::cuda::check_launch("sort");
    size_t temp_bytes = 0;
    const int* off = offsets.defined() ? static_cast<const int*>(offsets.raw_data()) : nullptr;
    // One line: a plain device-wide radix sort (the segmented sort gives each
    // segment a single block, slow on one long line). Several: segmented.
    auto run = [&](void* tmp) {
      if (c == 1)
        return cub::DeviceRadixSort::SortPairs(tmp, temp_bytes, ki, ko, vi, vo, n, 0, int(sizeof(K) * 8),
                                               ::cf::cuda::stream());
      return cub::DeviceSegmentedRadixSort::SortPairs(tmp, temp_bytes, ki, ko, vi, vo, int(n), int(c), off, off + 1, 0,
                                                      int(sizeof(K) * 8), ::cf::cuda::stream());
    };
    CF_CUDA_CHECK(run(nullptr), "sort");
    if (temp_bytes > temp_cap) {
      temp = device_bytes(temp_bytes, dev);
      temp_cap = temp_bytes;
    }
    CF_CUDA_CHECK(run(temp.raw_data()), "sort");
    ::cf::cuda::count_launch();
    sort_write_kernel<T><<<cu::grid_for(c * k), kThreads, 0, ::cf::cuda::stream()>>>(p, px, pv, pi, x_as, v_as, i_as,
                                                                                     len, k, line0, c * k, vo);
    ::cf::cuda::check_launch("sort");
  }
}

}  // namespace

void sort_cuda(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
               const Tensor& indices) {
  if (is_low_precision(x.dtype())) {  // every value is exact in float32: sort the widened copy
    Tensor vf = values.defined() ? float32_buffer_for(values) : values;
    sort_typed<float>(upcast_float32(x), axis, k, descending, vf, indices);
    if (values.defined()) downcast_into(vf, values);
    return;
  }
  CF_DISPATCH_NUMERIC_STD(x.dtype(), "sort", sort_typed<scalar_t>(x, axis, k, descending, values, indices));
}

}  // namespace cf::kernels
