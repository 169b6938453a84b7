#pragma once
// Grouping items by an integer key on the GPU, deterministically: the shared
// first half of every "sum the items of each key" kernel (K-Means' segment sums,
// the scatter of the sparse products), which then add each key's items in the
// order given here, so no floating-point atomics and the same bits every run.
#include <cstdint>

#include "core/tensor.h"

namespace cf::kernels {

#ifdef CF_WITH_CUDA
// keys: n uint64 values in [0, num_keys) in device memory (callers check the
// range first). Writes, all int64 device tensors: order (n,) the item indices
// sorted stably by key (equal keys keep increasing index: one stable CUB radix sort
// over the low bits a key can use), count (num_keys,) the items of each key
// (integer atomics: exact) and start (num_keys,) the offset of each key's run in
// order (an exclusive scan of count). n must be at most INT_MAX.
void segments_by_key_cuda(const uint64_t* keys, int64_t n, int64_t num_keys, const Tensor& order,
                          const Tensor& start, const Tensor& count, const char* op);
#endif

}  // namespace cf::kernels
