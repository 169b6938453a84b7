// CUDA indexing kernels. Semantics, preconditions and operand views are those of
// index_cpu.cpp (index.h states the contract): strided operands through the
// shared LoopPlan, the indexed axis handled by hand inside the kernel.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <climits>
#include <cstdint>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/upcast.h"
#include "kernels/index/index.h"

namespace cf::kernels {

namespace {

using cu::kThreads;

// t's strides with the entry of `axis` replaced by `stride` (as in index_cpu.cpp).
Shape strides_with(const Tensor& t, int64_t axis, int64_t stride) {
  Shape st = t.strides();
  st[size_t(axis)] = stride;
  return st;
}

template <typename T>
__device__ __forceinline__ T& at(char* base, int64_t byte_off) {
  return *reinterpret_cast<T*>(base + byte_off);
}

// ---------------------------------------------------------------- check_index_range

// Smallest row-major position whose value is outside [0, limit) (and is not
// `allowed`, when has_allowed), folded into slot->position with atomicMin
// (positions are >= 0, so unsigned order is int64 order). A thread's grid-stride
// positions ascend, so its first hit is its minimum. The last block to finish
// (counted in slot->blocks_done, after a fence that publishes every block's
// atomicMin) reads the final minimum and stores the value found there, so the slot
// holds a consistent (position, value) pair without a second launch; it then
// resets blocks_done for the slot's next use.
__global__ void bad_index_kernel(LoopPlan<1> p, const char* base, int64_t limit, bool has_allowed,
                                 int64_t allowed, ::cf::cuda::CheckSlot* slot) {
  __shared__ unsigned long long shared[32];
  unsigned long long mine = ULLONG_MAX;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += step) {
    int64_t off[1];
    cu::plan_offsets<1>(p, i, off);
    const int64_t v = *reinterpret_cast<const int64_t*>(base + off[0]);
    if ((v < 0 || v >= limit) && !(has_allowed && v == allowed)) {
      mine = (unsigned long long)i;
      break;
    }
  }
  mine = cu::block_reduce(mine, cu::MinOp{}, ULLONG_MAX, shared);
  if (threadIdx.x != 0) return;
  if (mine != ULLONG_MAX) atomicMin(&slot->position, mine);
  __threadfence();
  if (atomicAdd(&slot->blocks_done, 1u) != gridDim.x - 1) return;
  const unsigned long long at = atomicMin(&slot->position, ULLONG_MAX);  // an atomic read of the minimum
  if (at != ULLONG_MAX) {
    int64_t off[1];
    cu::plan_offsets<1>(p, int64_t(at), off);
    slot->value = *reinterpret_cast<const int64_t*>(base + off[0]);
  }
  slot->blocks_done = 0;
}

// ---------------------------------------------------------------- scatter (Add / Assign)

// Index lines with at most this many entries are summed by one thread per line
// (the CPU's loop); longer ones go through a sort so that parallelism does not
// depend on the number of lines.
constexpr int64_t kShortLine = 32;

// Path A: one thread per line of index (a line = the run along `axis` at fixed
// other coordinates; distinct lines write distinct output elements), adding (or
// assigning) its terms in ascending position, exactly like scatter_cpu: bit-identical
// to it. Assign moves T's bits (T an unsigned integer of the element's size).
template <typename T, bool kAssign>
__global__ void scatter_lines_kernel(LoopPlan<3> p, char* out, const char* idx, const char* src, int64_t len,
                                     int64_t out_len, int64_t out_as, int64_t idx_as, int64_t src_as) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t line = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; line < p.numel; line += step) {
    int64_t off[3];
    cu::plan_offsets<3>(p, line, off);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t id = cu::clamp_index(*reinterpret_cast<const int64_t*>(idx + off[1] + j * idx_as), out_len);
      const T v = *reinterpret_cast<const T*>(src + off[2] + j * src_as);
      if constexpr (kAssign)
        at<T>(out, off[0] + id * out_as) = v;
      else
        at<T>(out, off[0] + id * out_as) += v;
    }
  }
}

// Path B keys. Per-line index: key = line * out_len + index value, value = position
// j along the axis; one stable radix sort over all lines then groups every output
// element's contributions together, in ascending j (stability), whatever the line
// lengths. Shared index (stride 0 off the axis, e.g. index_add): the key is the
// index value of one line only.
__global__ void scatter_keys_kernel(LoopPlan<1> lp, bool per_line, const char* idx, int64_t len,
                                    int64_t idx_as, int64_t out_len, int64_t n, uint64_t* keys, int32_t* pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t line = i / len, j = i % len;
    int64_t off[1] = {0};
    if (per_line) cu::plan_offsets<1>(lp, line, off);  // shared: every line starts at offset 0
    const int64_t id = cu::clamp_index(*reinterpret_cast<const int64_t*>(idx + off[0] + j * idx_as), out_len);
    keys[i] = uint64_t(line) * uint64_t(out_len) + uint64_t(id);
    pos[i] = int32_t(j);
  }
}

// Path B sums, per-line index: the thread at the head of each run of equal keys
// adds the run (ascending j) into its output element, starting from the value
// already there, in the CPU's order: bit-identical to scatter_cpu. Assign writes
// the run's last term (the largest j), as the CPU's loop leaves it.
template <typename T, bool kAssign>
__global__ void scatter_runs_kernel(LoopPlan<3> p, char* out, const char* src, int64_t n, int64_t out_len,
                                    int64_t out_as, int64_t src_as, const uint64_t* keys,
                                    const int32_t* pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < n; s += step) {
    const uint64_t key = keys[s];
    if (s > 0 && keys[s - 1] == key) continue;
    const int64_t line = int64_t(key / uint64_t(out_len)), id = int64_t(key % uint64_t(out_len));
    int64_t off[3];
    cu::plan_offsets<3>(p, line, off);
    T& o = at<T>(out, off[0] + id * out_as);
    T acc = o;
    for (int64_t t = s; t < n && keys[t] == key; ++t) {
      const T v = *reinterpret_cast<const T*>(src + off[2] + int64_t(pos[t]) * src_as);
      if constexpr (kAssign)
        acc = v;
      else
        acc += v;
    }
    o = acc;
  }
}

// Path B sums, shared index: thread (s, line) with consecutive threads on
// consecutive lines (the contiguous axis of src/out in index_add), so reads and
// writes coalesce. Same order and bits as the CPU.
template <typename T, bool kAssign>
__global__ void scatter_shared_runs_kernel(LoopPlan<3> p, char* out, const char* src, int64_t len,
                                           int64_t out_as, int64_t src_as, const uint64_t* keys,
                                           const int32_t* pos) {
  const int64_t lines = p.numel, n = len * lines;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t s = i / lines, line = i % lines;
    const uint64_t key = keys[s];
    if (s > 0 && keys[s - 1] == key) continue;
    int64_t off[3];
    cu::plan_offsets<3>(p, line, off);
    T& o = at<T>(out, off[0] + int64_t(key) * out_as);
    T acc = o;
    for (int64_t t = s; t < len && keys[t] == key; ++t) {
      const T v = *reinterpret_cast<const T*>(src + off[2] + int64_t(pos[t]) * src_as);
      if constexpr (kAssign)
        acc = v;
      else
        acc += v;
    }
    o = acc;
  }
}

int bits_for(uint64_t max_value) {
  int b = 0;
  while (b < 64 && (max_value >> b) != 0) ++b;
  return b == 0 ? 1 : b;
}

// A device tensor of at least `bytes` bytes from cf's caching allocator.
Tensor device_bytes(size_t bytes, Device d) {
  return Tensor::empty({int64_t((bytes + 7) / 8) + 1}, kInt64, d);
}

template <typename T, bool kAssign>
void scatter_typed(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  const int64_t len = index.shape()[size_t(axis)];
  const int64_t out_len = out.shape()[size_t(axis)];
  const int64_t es = int64_t(sizeof(T));
  const int64_t out_as = out.strides()[size_t(axis)] * es;
  const int64_t idx_as = index.strides()[size_t(axis)] * int64_t(sizeof(int64_t));
  const int64_t src_as = src.strides()[size_t(axis)] * es;
  // Views at index's shape without the axis, as in scatter_cpu.
  Shape lines_shape = index.shape();
  lines_shape[size_t(axis)] = 1;
  Tensor ov = make_view(out, lines_shape, out.strides(), out.offset());
  Tensor iv = make_view(index, lines_shape, index.strides(), index.offset());
  Tensor sv = make_view(src, lines_shape, src.strides(), src.offset());
  LoopPlan<3> p = make_loop_plan<3>(lines_shape, {&ov, &iv, &sv});
  const int64_t lines = p.numel;
  char* po = static_cast<char*>(out.raw_data());
  const char* pi = static_cast<const char*>(index.raw_data());
  const char* ps = static_cast<const char*>(src.raw_data());
  const char* op = kAssign ? "scatter" : "scatter_add";
  cu::use_device_of(out, op);

  bool shared = true;  // the same index line for every line: stride 0 (or size 1) off the axis
  for (int64_t d = 0; d < index.dim(); ++d)
    if (d != axis && index.shape()[size_t(d)] > 1 && index.strides()[size_t(d)] != 0) shared = false;
  const int64_t n = shared ? len : lines * len;  // items to sort
  const bool sortable = len <= INT32_MAX && out_len > 0 && lines <= INT64_MAX / out_len;
  if (len <= kShortLine || !sortable) {
    scatter_lines_kernel<T, kAssign><<<cu::grid_for(lines), kThreads, 0, ::cf::cuda::stream()>>>(
        p, po, pi, ps, len, out_len, out_as, idx_as, src_as);
    ::cf::cuda::check_launch(op);
    return;
  }

  // Path B: sort (key, j) pairs with CUB (stable), then sum each run of equal keys.
  const Device dev = out.device();
  Tensor keys_in = Tensor::empty({n}, kInt64, dev), keys_out = Tensor::empty({n}, kInt64, dev);
  Tensor pos_in = device_bytes(size_t(n) * 4, dev), pos_out = device_bytes(size_t(n) * 4, dev);
  uint64_t* ki = static_cast<uint64_t*>(keys_in.raw_data());
  uint64_t* ko = static_cast<uint64_t*>(keys_out.raw_data());
  int32_t* vi = static_cast<int32_t*>(pos_in.raw_data());
  int32_t* vo = static_cast<int32_t*>(pos_out.raw_data());
  // Offsets of index lines only (a plan over the line shape for the index alone).
  LoopPlan<1> lp = make_loop_plan<1>(lines_shape, {&iv});
  scatter_keys_kernel<<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(lp, !shared, pi, len, idx_as, out_len, n,
                                                                              ki, vi);
  ::cf::cuda::check_launch(op);
  const int end_bit = bits_for(uint64_t(shared ? 1 : lines) * uint64_t(out_len) - 1);
  size_t temp_bytes = 0;
  CF_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ki, ko, vi, vo, n, 0, end_bit, ::cf::cuda::stream()), op);
  Tensor temp = device_bytes(temp_bytes, dev);
  CF_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ki, ko, vi, vo, n, 0, end_bit, ::cf::cuda::stream()),
      op);
  ::cf::cuda::count_launch();
  if (shared) {
    scatter_shared_runs_kernel<T, kAssign>
        <<<cu::grid_for(len * lines), kThreads, 0, ::cf::cuda::stream()>>>(p, po, ps, len, out_as, src_as, ko, vo);
  } else {
    scatter_runs_kernel<T, kAssign>
        <<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(p, po, ps, n, out_len, out_as, src_as, ko, vo);
  }
  ::cf::cuda::check_launch(op);
}

// ---------------------------------------------------------------- gather, masked_fill, one_hot

template <typename T>
void gather_typed(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  const int64_t ax_st = x.strides()[size_t(axis)], ax_len = x.shape()[size_t(axis)];
  // x seen at index's shape with the axis pinned to its first element (as on the CPU).
  Tensor xv = make_view(x, index.shape(), strides_with(x, axis, 0), x.offset());
  cu::strided_loop<3>("gather", index.shape(), {&out, &index, &xv}, [ax_st, ax_len] __device__(char* const* p) {
    const int64_t id = cu::clamp_index(*reinterpret_cast<const int64_t*>(p[1]), ax_len);
    *reinterpret_cast<T*>(p[0]) = reinterpret_cast<const T*>(p[2])[id * ax_st];
  });
}

template <typename T>
void masked_fill_typed(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  const T v = static_cast<T>(value);
  cu::strided_loop<3>("masked_fill", out.shape(), {&out, &x, &mask}, [v] __device__(char* const* p) {
    const bool m = *reinterpret_cast<const bool*>(p[2]);
    *reinterpret_cast<T*>(p[0]) = m ? v : *reinterpret_cast<const T*>(p[1]);
  });
}

template <typename T>
void one_hot_typed(const Tensor& labels, const Tensor& out) {
  const int64_t classes = out.shape().back();
  CF_CHECK(out.is_contiguous(), Error, "[one_hot] internal error: output must be contiguous");
  // One thread per output element (coalesced writes of whole rows); the label of
  // row r is read through the labels' plan (any strides).
  LoopPlan<1> lp = make_loop_plan<1>(labels.shape(), {&labels});
  const char* pl = static_cast<const char*>(labels.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  cu::for_each_index("one_hot", out, out.numel(), [=] __device__(int64_t i) {
    const int64_t r = i / classes, c = i % classes;
    int64_t off[1];
    cu::plan_offsets<1>(lp, r, off);
    po[i] = *reinterpret_cast<const int64_t*>(pl + off[0]) == c ? T(1) : T(0);
  });
}

// ---------------------------------------------------------------- ring_append

// One thread per (row, word) of the rows: a kept row whose rank (exclusive scan of
// keep) survives the pops goes to ring row (next + rank - drop) % cap. W is an
// unsigned word of the element size, so the copy is dtype-agnostic.
template <typename W>
__global__ void ring_write_kernel(W* memory, const W* rows, const int64_t* keep, const int64_t* rank,
                                  const int64_t* counters, RingSlots slots, int64_t n, int64_t d, int64_t cap) {
  const int64_t total = n * d, step = int64_t(gridDim.x) * blockDim.x;
  const int64_t count = rank[n - 1] + keep[n - 1], drop = count > cap ? count - cap : 0;
  const int64_t next = ((counters[slots.next_at] % cap) + cap) % cap;  // (wraps a damaged row: index_cpu.cpp)
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t i = e / d, j = e % d;
    if (keep[i] == 0 || rank[i] < drop) continue;
    memory[((next + rank[i] - drop) % cap) * d + j] = rows[e];
  }
}

// Runs after the writes (same stream): the new write row and fill level.
__global__ void ring_counters_kernel(int64_t* counters, const int64_t* keep, const int64_t* rank, RingSlots slots,
                                     int64_t n, int64_t cap) {
  const int64_t count = rank[n - 1] + keep[n - 1], kept = count > cap ? cap : count;
  counters[slots.next_at] = (((counters[slots.next_at] % cap) + cap) % cap + kept) % cap;
  const int64_t size = counters[slots.size_at] + kept;
  counters[slots.size_at] = size > cap ? cap : size;
}

template <typename W>
void ring_write(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                const Tensor& rank, RingSlots slots, int64_t n, int64_t d, int64_t cap) {
  ring_write_kernel<W><<<cu::grid_for(n * d), kThreads, 0, ::cf::cuda::stream()>>>(
      cu::ptr<W>(memory), cu::ptr<const W>(rows), cu::ptr<const int64_t>(keep), cu::ptr<const int64_t>(rank),
      cu::ptr<const int64_t>(counters), slots, n, d, cap);
  ::cf::cuda::check_launch("ring_append");
}

}  // namespace

void ring_append_cuda(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                      RingSlots slots) {
  const int64_t n = rows.shape()[0], cap = memory.shape()[0];
  if (n == 0 || cap == 0) return;
  const int64_t d = memory.numel() / cap;
  const Device dev = memory.device();
  cu::use_device_of(memory, "ring_append");
  Tensor rank = Tensor::empty({n}, kInt64, dev);
  const int64_t* kp = cu::ptr<const int64_t>(keep);
  int64_t* rp = cu::ptr<int64_t>(rank);
  size_t temp_bytes = 0;
  CF_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, kp, rp, int(n), ::cf::cuda::stream()),
                "ring_append");
  Tensor temp = device_bytes(temp_bytes, dev);
  CF_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), temp_bytes, kp, rp, int(n), ::cf::cuda::stream()),
                "ring_append");
  ::cf::cuda::count_launch();
  switch (dtype_size(memory.dtype())) {
    case 1: ring_write<uint8_t>(memory, counters, rows, keep, rank, slots, n, d, cap); break;
    case 2: ring_write<uint16_t>(memory, counters, rows, keep, rank, slots, n, d, cap); break;
    case 4: ring_write<uint32_t>(memory, counters, rows, keep, rank, slots, n, d, cap); break;
    default: ring_write<uint64_t>(memory, counters, rows, keep, rank, slots, n, d, cap); break;
  }
  ring_counters_kernel<<<1, 1, 0, ::cf::cuda::stream()>>>(cu::ptr<int64_t>(counters), kp, rp, slots, n, cap);
  ::cf::cuda::check_launch("ring_append");
}

void bincount_rows_cuda(const Tensor& ids, int64_t bins, const Tensor& counts) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  const int64_t w = n / ids.shape()[0];
  const int64_t* v = cu::ptr<const int64_t>(ids);
  auto* c = reinterpret_cast<unsigned long long*>(cu::ptr<int64_t>(counts));
  cu::for_each_index("bincount_rows", counts, n, [=] __device__(int64_t i) {
    const int64_t x = v[i];
    if (x >= 0 && x < bins) atomicAdd(c + (i / w) * bins + x, 1ull);
  });
}

void check_index_range_cuda(const Tensor& index, int64_t limit, RaiseBadIndex raise, const int64_t* allowed) {
  const int64_t n = index.numel();
  if (n == 0) return;
  if (limit <= 0 && !allowed) {
    // Every value is out of range, and no kernel could clamp into an empty axis:
    // report the first one now (an error path, so its read-back costs nothing).
    int64_t v = 0;
    copy_bytes(&v, Device::cpu(), static_cast<const int64_t*>(index.raw_data()), index.device(), sizeof(v),
               "check_index_range");
    raise(0, v);
  }
  cu::use_device_of(index, "check_index_range");
  LoopPlan<1> p = make_loop_plan<1>(index.shape(), {&index});
  const char* base = static_cast<const char*>(index.raw_data());
  const bool has_allowed = allowed != nullptr;
  const int64_t allowed_value = allowed ? *allowed : 0;
  ::cf::cuda::defer_check(index.device(), std::move(raise), "check_index_range", [&](::cf::cuda::CheckSlot* slot) {
    bad_index_kernel<<<cu::grid_for(n), kThreads, 0, ::cf::cuda::stream()>>>(p, base, limit, has_allowed, allowed_value,
                                                                             slot);
    ::cf::cuda::check_launch("check_index_range");
  });
}

void gather_cuda(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  CF_DISPATCH_ALL(x.dtype(), "gather", gather_typed<scalar_t>(x, axis, index, out));
}

// Always deterministic, for every dtype, and bit-identical to scatter_cpu (both
// paths apply each output element's terms in ascending position, in T, starting
// from the value already there). No atomicAdd path: float atomics would make
// training runs irreproducible, and the sort path keeps the common shapes
// (index_add / embedding backward: many rows into a table; gather backward)
// parallel over all n * row-length terms, so it is not needed for speed.
void scatter_cuda(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src, ScatterMode mode) {
  const int64_t len = index.shape()[size_t(axis)];
  if (len == 0 || index.numel() == 0) return;
  if (mode == ScatterMode::Assign) {  // bits moved: one kernel per element size
    switch (dtype_size(out.dtype())) {
      case 1: scatter_typed<uint8_t, true>(out, axis, index, src); break;
      case 2: scatter_typed<uint16_t, true>(out, axis, index, src); break;
      case 4: scatter_typed<uint32_t, true>(out, axis, index, src); break;
      case 8: scatter_typed<uint64_t, true>(out, axis, index, src); break;
      default: throw DTypeError(str("[scatter] has no kernel for ", out.dtype(), " on this device"));
    }
    return;
  }
  if (is_low_precision(out.dtype())) {  // float32 accumulation, one rounding (as scatter_cpu)
    Tensor of = upcast_float32(out);
    scatter_typed<float, false>(of, axis, index, upcast_float32(src));
    downcast_into(of, out);
    return;
  }
  CF_DISPATCH_NUMERIC_STD(out.dtype(), "scatter_add", (scatter_typed<scalar_t, false>(out, axis, index, src)));
}

void masked_fill_cuda(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  CF_DISPATCH_ALL(x.dtype(), "masked_fill", masked_fill_typed<scalar_t>(x, mask, value, out));
}

void one_hot_cuda(const Tensor& labels, const Tensor& out) {
  if (out.numel() == 0) return;
  CF_DISPATCH_ALL(out.dtype(), "one_hot", one_hot_typed<scalar_t>(labels, out));
}

}  // namespace cf::kernels
