#pragma once
// Indexing ops. Index tensors are int64; out-of-range indices are an IndexError
// naming the op, the bad index and the axis length. Each op's backward is its
// partner: gather <-> scatter_add, index_select <-> index_add.
#include <cstdint>
#include <functional>
#include <optional>

#include "core/tensor.h"

namespace cf {

// A data check of an int64 tensor of ids (cluster ids, member positions, buckets):
// raise(position, value), which must throw the caller's error, runs for the first
// value outside [0, limit) in row-major order, other than `allowed` when given (-1
// for "no cluster"). On the CPU it runs at once; on CUDA it is a deferred check
// (core/cuda.h): the call returns without waiting for the device, and the error is
// thrown at the next host read. `op` names the caller in a device error. Skipped inside an
// ops::KnownGoodIndices scope (below), so keep such scopes to code whose every check is of indices it built.
void check_indices(const char* op, const Tensor& ids, int64_t limit, std::function<void(int64_t, int64_t)> raise,
                   std::optional<int64_t> allowed = std::nullopt);

namespace ops {
// A scope (this thread) in which every index tensor the ops read was built in range by cf's own code:
// argsort, topk and argmax outputs and tables made of them (neural clustering's member table and
// cluster ids), or the index an indexing op's forward checked, read again by its backward. The data
// checks (gather, scatter, scatter_add, index_select, index_add, take_along_dim, check_indices, the
// block-attention member tables) are skipped there: each is a pass over the index, a kernel launch on
// CUDA (issue 25). Shapes, dtypes and devices are still checked. Never around an index a user gave:
// the CPU kernels trust the values.
class KnownGoodIndices {
 public:
  KnownGoodIndices();
  ~KnownGoodIndices();
  KnownGoodIndices(const KnownGoodIndices&) = delete;
  KnownGoodIndices& operator=(const KnownGoodIndices&) = delete;

 private:
  bool saved_;
};
bool indices_known_good();

// scatter_add(zeros(shape, src's dtype and device), axis, index, src) without the copy of the zeros that
// scatter_add makes of its x (a fill and the kernel: two calls, not three); differentiable in src.
Tensor scatter_add_to_zeros(const Shape& shape, int64_t axis, const Tensor& index, const Tensor& src);
}  // namespace ops

// Ring-buffer append (a FIFO of the last cap rows, Cluster-Former's memory bank): the
// rows i of `rows` (n, d) with keep[i] true (bool (n,)), in order and only the newest
// cap of them, are written into `memory` (cap, d, contiguous) from row
// counters[next_at] on, wrapping at cap; then counters[next_at] advances past them
// and counters[size_at] = min(cap, size + kept) (counters: contiguous int64 (k,)).
// Everything stays on the tensors' device: on CUDA no value comes back to the host.
// In place on memory and counters (buffers: nothing is recorded for autograd).
void ring_append(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                 int64_t size_at, int64_t next_at);

// out[i][j][k] = x[i][index[i][j][k]][k] (axis = 1); index has x's rank and
// may be smaller than x on every axis except `axis`.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
// out = x; out[i][index[i][j][k]][k] = src[i][j][k] (axis = 1; torch.scatter). Of several elements sent to
// one position the last along the axis is kept, on every device (PyTorch leaves the choice open); it alone
// gets that position's gradient, and x's overwritten elements get none. Any dtype. Differentiable in x and src.
Tensor scatter(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
// out = x; out[i][index[i][j][k]][k] += src[i][j][k] (axis = 1). Differentiable in x and src.
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
// In place (torch's Tensor.scatter_ / scatter_add_): x[i][index[i][j][k]][k] = src[i][j][k] (axis = 1), or +=
// for scatter_add_, with x's other elements untouched: O(index) work where scatter + copy_ costs a copy of x
// (index setitem, index_copy_, put_ and the rest of Python's in-place scatter family run on these). The same
// arguments and rules as scatter / scatter_add (the last of several sent to one position kept), x may be any
// strided view; scatter_add_ into bfloat16 or float16 sums in float32 and rounds once per element, as scatter_add
// (a float32 scratch of x's shape). Not recorded: refused, as every in-place op, on an x that requires grad while recording, and for
// a src that does then (its gradient would be lost). On CUDA an out-of-range index is reported at the next host
// read (check_indices) and x's values are then unspecified (the kernel clamps the index). Returns x.
Tensor& scatter_(Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
Tensor& scatter_add_(Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
// Rows of x along axis picked by a 1-d index.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index);
// out = x; out.select(axis, index[i]) += src.select(axis, i). Differentiable in x and src.
Tensor index_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
// gather with NumPy broadcasting of index against x on the non-axis dimensions.
Tensor take_along_dim(const Tensor& x, const Tensor& index, int64_t axis);
// x with value where mask (bool, broadcast to x) is true. Differentiable in x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// The same in place (refused, as every in-place op, on a tensor that requires grad).
Tensor& masked_fill_(Tensor& t, const Tensor& mask, double value);
// int64 labels in [0, num_classes) -> float tensor (..., num_classes) of 0/1.
Tensor one_hot(const Tensor& labels, int64_t num_classes, DType dtype = kFloat32);

}  // namespace cf
