#pragma once
// Indexing kernels: gather, scatter_add (index_select/index_add/take_along_dim are
// gather/scatter_add on broadcast views of the index, see autograd/ops/index.cpp),
// masked_fill, one_hot, and the index range check.
//
// Preconditions (the autograd layer checks them with clear errors first):
//  * index tensors are int64, any strides (stride 0 broadcast views included);
//  * every index value is in [0, length of the indexed axis): run find_bad_index
//    first, the gather/scatter kernels do not check (so no thread ever has to throw);
//  * outputs are preallocated by the caller.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// Result of a range scan over an index tensor.
struct BadIndex {
  bool found = false;
  int64_t value = 0;     // the first offending value in row-major order
  int64_t position = 0;  // its row-major position in the index tensor
};

// First value of `index` (int64) outside [0, limit), in row-major order.
BadIndex find_bad_index_cpu(const Tensor& index, int64_t limit);

// out[p] = x[p with coordinate `axis` replaced by index[p]] for p over index.shape()
// (= out.shape()); x.shape()[d] >= index.shape()[d] for d != axis; any dtype.
void gather_cpu(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out);

// out[p with coordinate `axis` replaced by index[p]] += src[p] for p over index.shape();
// src.shape() >= index.shape() on every axis, out.shape() >= index.shape() off `axis`.
// Numeric dtypes. Work is split by the non-axis coordinates of index, and each output
// element receives its contributions in ascending order along `axis`, so duplicate
// indices give bit-identical results whatever the thread count.
void scatter_add_cpu(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src);

// out = mask ? value : x, with mask (bool) broadcast to x's shape (= out's shape).
void masked_fill_cpu(const Tensor& x, const Tensor& mask, double value, const Tensor& out);

// out (labels.shape() + (num_classes,), contiguous, any dtype) = one-hot of labels.
void one_hot_cpu(const Tensor& labels, const Tensor& out);

#ifdef CF_WITH_CUDA
BadIndex find_bad_index_cuda(const Tensor& index, int64_t limit);
void gather_cuda(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out);
void scatter_add_cuda(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src);
void masked_fill_cuda(const Tensor& x, const Tensor& mask, double value, const Tensor& out);
void one_hot_cuda(const Tensor& labels, const Tensor& out);
#endif

// `op` only names the caller in the no-CUDA error.
inline BadIndex find_bad_index(const char* op, const Tensor& index, int64_t limit) {
  BadIndex r;
  CF_DEVICE_DISPATCH(op, index.device(), r = find_bad_index_cpu(index, limit),
                     r = find_bad_index_cuda(index, limit));
  return r;
}
inline void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  CF_DEVICE_DISPATCH("gather", out.device(), gather_cpu(x, axis, index, out),
                     gather_cuda(x, axis, index, out));
}
inline void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) {
  CF_DEVICE_DISPATCH("scatter_add", out.device(), scatter_add_cpu(out, axis, index, src),
                     scatter_add_cuda(out, axis, index, src));
}
inline void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  CF_DEVICE_DISPATCH("masked_fill", out.device(), masked_fill_cpu(x, mask, value, out),
                     masked_fill_cuda(x, mask, value, out));
}
inline void one_hot(const Tensor& labels, const Tensor& out) {
  CF_DEVICE_DISPATCH("one_hot", out.device(), one_hot_cpu(labels, out), one_hot_cuda(labels, out));
}

}  // namespace cf::kernels
