#pragma once
// CPU parallel loop: OpenMP when the work is large enough, serial for tiny tensors.
#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace cf::kernels {

// Elements below which a loop stays serial: thread start-up costs more than it saves.
constexpr int64_t kParallelGrain = 32768;

// Calls f(begin, end) over disjoint chunks covering [0, n); chunks are contiguous
// and fixed by (n, thread count), so results never depend on scheduling.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
#ifdef _OPENMP
  if (n > grain && !omp_in_parallel() && omp_get_max_threads() > 1) {
    int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
    int nt = int(std::min<int64_t>(omp_get_max_threads(), max_chunks));
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      int64_t chunk = (n + T - 1) / T;
      int64_t b = std::min<int64_t>(n, int64_t(t) * chunk), e = std::min<int64_t>(n, b + chunk);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  f(int64_t(0), n);
}

}  // namespace cf::kernels
