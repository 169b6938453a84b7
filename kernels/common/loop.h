#pragma once
// N-operand strided loop for CPU kernels (elementwise, where, comparisons, copy).
// Operand strides are broadcast to the loop shape (stride 0 on broadcast axes),
// contiguous axes are merged, and the work is split over threads by element
// ranges; the callback sees 1-d runs: inner(ptrs, byte_strides, n).
#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/loop_plan.h"
#include "kernels/common/parallel.h"

namespace cf::kernels {

// Runs inner over the element range [begin, end) of the plan.
template <int N, typename F>
void run_loop_range(const LoopPlan<N>& p, const std::array<char*, N>& base, int64_t begin,
                    int64_t end, F& inner) {
  int nd = p.ndim;
  int64_t idx[kMaxDims];
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % p.sizes[d];
    rem /= p.sizes[d];
  }
  std::array<int64_t, N> inner_st;
  for (int k = 0; k < N; ++k) inner_st[size_t(k)] = p.strides[k][nd - 1];
  while (begin < end) {
    std::array<char*, N> ptr;
    for (int k = 0; k < N; ++k) {
      char* q = base[size_t(k)];
      for (int d = 0; d < nd; ++d) q += idx[d] * p.strides[k][d];
      ptr[size_t(k)] = q;
    }
    int64_t n = std::min(p.sizes[nd - 1] - idx[nd - 1], end - begin);
    inner(ptr, inner_st, n);
    begin += n;
    idx[nd - 1] += n;
    for (int d = nd - 1; d > 0 && idx[d] == p.sizes[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// Loop over `shape` with operands ops (ops[0] is usually the output).
template <int N, typename F>
void strided_loop(const Shape& shape, const std::array<const Tensor*, N>& ops, F&& inner) {
  LoopPlan<N> p = make_loop_plan<N>(shape, ops);
  if (p.numel == 0) return;
  std::array<char*, N> base;
  for (int k = 0; k < N; ++k) base[size_t(k)] = static_cast<char*>(ops[size_t(k)]->raw_data());
  parallel_for(p.numel, kParallelGrain,
               [&](int64_t b, int64_t e) { run_loop_range<N>(p, base, b, e, inner); });
}

}  // namespace cf::kernels
