#include "core/kernel_calls.h"

namespace cf {

namespace detail {
std::atomic<int64_t> g_kernel_calls[2] = {{0}, {0}};
}  // namespace detail

KernelCalls kernel_calls() {
  KernelCalls c;
  c.cpu = detail::g_kernel_calls[0].load(std::memory_order_relaxed);
  c.cuda = detail::g_kernel_calls[1].load(std::memory_order_relaxed);
  return c;
}

void reset_kernel_calls() {
  detail::g_kernel_calls[0].store(0, std::memory_order_relaxed);
  detail::g_kernel_calls[1].store(0, std::memory_order_relaxed);
}

KernelCalls operator-(const KernelCalls& b, const KernelCalls& a) {
  KernelCalls d;
  d.cpu = b.cpu - a.cpu;
  d.cuda = b.cuda - a.cuda;
  return d;
}

}  // namespace cf
