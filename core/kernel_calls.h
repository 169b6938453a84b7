#pragma once
// Kernel calls, counted per device kind: every call of a kernel family through
// CF_DEVICE_DISPATCH (kernels/common/dispatch.h), i.e. every unary or binary map,
// copy, fill, reduction, product, softmax, index or attention kernel an op runs, and
// the factories' fills (Tensor::full / zeros / ones / scalar, arange: a loop on the CPU,
// a launch on CUDA; not counted before stop 81, when the count missed about 12 of full
// attention's 227 launches a step).
// On CUDA one call queues one kernel or a few (cuda::transfer_stats().kernel_launches
// counts those); on the CPU it is one loop nest. The count is what fusion cuts: a
// training step's calls on the CPU are the launches its CUDA twin makes, to within
// the few calls whose CUDA arm launches more than one kernel (issue 25: launches, not
// arithmetic, set a small step's time on the GPU), so it can be measured and guarded
// without a GPU. Counted on the calling thread with a relaxed atomic add (a few
// nanoseconds against a call's microsecond); all threads together.
#include <atomic>
#include <cstdint>

namespace cf {

struct KernelCalls {
  int64_t cpu = 0, cuda = 0;
};
KernelCalls kernel_calls();
void reset_kernel_calls();
// b - a, field by field (the calls made between two reads).
KernelCalls operator-(const KernelCalls& b, const KernelCalls& a);

namespace detail {
extern std::atomic<int64_t> g_kernel_calls[2];  // [0] CPU, [1] CUDA
inline void count_kernel_call(bool cuda) { g_kernel_calls[cuda ? 1 : 0].fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

}  // namespace cf
