#pragma once
// CPU parallel loop: OpenMP when the work is large enough, serial for tiny tensors.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>

#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace cf::kernels {

// Elements below which a loop stays serial: thread start-up costs more than it saves.
constexpr int64_t kParallelGrain = 32768;

// Threads a parallel region started here may use: cf::get_num_threads() (core/threads.h), 1 inside a region
// already running (no nested teams). Every CPU kernel's region takes its team size from here, as
// `num_threads(max_threads())`, so set_num_threads reaches all of them.
inline int max_threads() {
#ifdef _OPENMP
  return omp_in_parallel() ? 1 : get_num_threads();
#else
  return 1;
#endif
}

// An exception cannot leave an OpenMP region: the process terminates ("terminate called without an active
// exception": a bad_alloc of a kernel's scratch ended the program instead of raising). Work inside a region
// runs through run(), which keeps the first exception; rethrow() after the region raises it.
class ParallelErrors {
 public:
  template <typename F>
  void run(F&& f) noexcept {
    if (failed()) return;  // (the region's result is thrown away: skip the rest of the work)
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mu_;
  std::exception_ptr first_;
  std::atomic<bool> failed_{false};
};

// Calls f(begin, end) over disjoint chunks covering [0, n); chunks are contiguous
// and fixed by (n, thread count), so results never depend on scheduling.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
#ifdef _OPENMP
  const int threads = n > grain ? max_threads() : 1;
  if (threads > 1) {
    int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
    int nt = int(std::min<int64_t>(threads, max_chunks));
    ParallelErrors errors;
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      int64_t chunk = (n + T - 1) / T;
      int64_t b = std::min<int64_t>(n, int64_t(t) * chunk), e = std::min<int64_t>(n, b + chunk);
      if (b < e) errors.run([&] { f(b, e); });
    }
    errors.rethrow();
    return;
  }
#endif
  f(int64_t(0), n);
}

}  // namespace cf::kernels
