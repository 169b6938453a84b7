#pragma once
// Indexing kernels: gather, scatter (adding or assigning; index_select/index_add/take_along_dim
// are gather/scatter on broadcast views of the index, see autograd/ops/index.cpp),
// masked_fill, one_hot, and the index range check.
//
// Preconditions (the autograd layer checks them with clear errors first):
//  * index tensors are int64, any strides (stride 0 broadcast views included);
//  * every index value is in [0, length of the indexed axis): run check_index_range
//    first. On the CPU it throws before the kernel runs; on CUDA it is a deferred
//    check (core/cuda.h) that the op does not wait for, so the CUDA kernels clamp
//    each index into the axis (a meaningless result, never an out-of-bounds access,
//    for the op whose error the next host read reports);
//  * outputs are preallocated by the caller.
#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// Result of a range scan over an index tensor.
struct BadIndex {
  bool found = false;
  int64_t value = 0;     // the first offending value in row-major order
  int64_t position = 0;  // its row-major position in the index tensor
};

// First value of `index` (int64) outside [0, limit) other than *allowed (when given),
// in row-major order.
BadIndex find_bad_index_cpu(const Tensor& index, int64_t limit, const int64_t* allowed = nullptr);

// Throws the caller's error, raise(position, value) (which must throw), for the first
// value of `index` (int64, any strides) outside [0, limit) in row-major order. CPU: at
// once. CUDA: a deferred check: raise runs at the next host read (core/cuda.h).
// `allowed`, when given, is one out-of-range value that is not an error (cross
// entropy's ignore_index, -1 for "no cluster").
using RaiseBadIndex = std::function<void(int64_t position, int64_t value)>;

// out[p] = x[p with coordinate `axis` replaced by index[p]] for p over index.shape()
// (= out.shape()); x.shape()[d] >= index.shape()[d] for d != axis; any dtype.
void gather_cpu(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out);

// out[p with coordinate `axis` replaced by index[p]] += src[p] (Add) or = src[p] (Assign)
// for p over index.shape(); src.shape() >= index.shape() on every axis, out.shape() >=
// index.shape() off `axis`; out and src of one dtype. Add: numeric dtypes, 16-bit ones
// summed in float32 and rounded once. Assign: every dtype, the bits moved as they are.
// Work is split by the non-axis coordinates of index, and each output element receives
// its contributions in ascending order along `axis`: duplicate indices sum in that
// order (Add) or leave the last one (Assign), bit-identical whatever the thread count
// and on both devices.
enum class ScatterMode { Add, Assign };
void scatter_cpu(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src, ScatterMode mode);

// out = mask ? value : x, with mask (bool) broadcast to x's shape (= out's shape).
void masked_fill_cpu(const Tensor& x, const Tensor& mask, double value, const Tensor& out);

// out (labels.shape() + (num_classes,), contiguous, any dtype) = one-hot of labels.
void one_hot_cpu(const Tensor& labels, const Tensor& out);

// Ring-buffer append (Cluster-Former's memory bank): the rows i of `rows` (n, d) with
// keep[i] true (int64 0/1, contiguous (n,)), in order and only the newest cap of them,
// are copied into `memory` (cap, d) from row counters[next_at] on, wrapping at cap;
// then counters[next_at] = (next + kept) % cap and counters[size_at] = min(cap, size +
// kept). memory and rows are contiguous and of one dtype; counters is contiguous int64
// on their device, so on CUDA nothing is read back to the host.
struct RingSlots {
  int64_t size_at = 0, next_at = 1;
};
void ring_append_cpu(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                     RingSlots slots);

// Per-row histogram: counts (rows, bins) int64, contiguous and zeroed by the caller,
// gets counts[r, v] += 1 for every value v in [0, bins) of row r of ids (rows, w)
// int64 contiguous; other values are skipped. Integer counts: the same on every
// device and in any order (atomic adds on CUDA).
void bincount_rows_cpu(const Tensor& ids, int64_t bins, const Tensor& counts);

#ifdef CF_WITH_CUDA
void bincount_rows_cuda(const Tensor& ids, int64_t bins, const Tensor& counts);
void check_index_range_cuda(const Tensor& index, int64_t limit, RaiseBadIndex raise,
                            const int64_t* allowed = nullptr);
void gather_cuda(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out);
void scatter_cuda(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src, ScatterMode mode);
void masked_fill_cuda(const Tensor& x, const Tensor& mask, double value, const Tensor& out);
void one_hot_cuda(const Tensor& labels, const Tensor& out);
void ring_append_cuda(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                      RingSlots slots);
#endif

// `op` only names the caller in the no-CUDA error.
inline void check_index_range(const char* op, const Tensor& index, int64_t limit, RaiseBadIndex raise,
                              const int64_t* allowed = nullptr) {
  (void)op;  // (unused in a CUDA build: public headers stay clean under -Wextra)
  auto on_cpu = [&] {
    const BadIndex b = find_bad_index_cpu(index, limit, allowed);
    if (b.found) raise(b.position, b.value);
  };
  CF_DEVICE_DISPATCH(op, index.device(), on_cpu(), check_index_range_cuda(index, limit, std::move(raise), allowed));
}
inline void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  CF_DEVICE_DISPATCH("gather", out.device(), gather_cpu(x, axis, index, out),
                     gather_cuda(x, axis, index, out));
}
inline void scatter(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src, ScatterMode mode) {
  CF_DEVICE_DISPATCH("scatter", out.device(), scatter_cpu(out, axis, index, src, mode),
                     scatter_cuda(out, axis, index, src, mode));
}
inline void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  scatter(out, axis, index, src, ScatterMode::Add);
}
inline void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  CF_DEVICE_DISPATCH("masked_fill", out.device(), masked_fill_cpu(x, mask, value, out),
                     masked_fill_cuda(x, mask, value, out));
}
inline void one_hot(const Tensor& labels, const Tensor& out) {
  CF_DEVICE_DISPATCH("one_hot", out.device(), one_hot_cpu(labels, out), one_hot_cuda(labels, out));
}
inline void bincount_rows(const Tensor& ids, int64_t bins, const Tensor& counts) {
  CF_DEVICE_DISPATCH("bincount_rows", ids.device(), bincount_rows_cpu(ids, bins, counts),
                     bincount_rows_cuda(ids, bins, counts));
}
inline void ring_append(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                        RingSlots slots) {
  CF_DEVICE_DISPATCH("ring_append", memory.device(), ring_append_cpu(memory, counters, rows, keep, slots),
                     ring_append_cuda(memory, counters, rows, keep, slots));
}

}  // namespace cf::kernels
