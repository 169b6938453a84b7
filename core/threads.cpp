#include "core/threads.h"

#include <atomic>

#include "core/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace cf {

namespace {
// (The cap keeps a typo from asking the OpenMP runtime for a million threads; cf-bench --threads has the same.)
constexpr int64_t kMaxThreads = 1024;
std::atomic<int> g_num_threads{0};  // 0: OpenMP's per-thread count
}  // namespace

void set_num_threads(int64_t n) {
  CF_CHECK(n >= 0 && n <= kMaxThreads, ValueError, "[set_num_threads] n must be in [1, ", kMaxThreads,
           "] (0: OpenMP's count of the calling thread), got ", n);
  g_num_threads.store(int(n), std::memory_order_relaxed);
}

int get_num_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

bool num_threads_is_set() { return g_num_threads.load(std::memory_order_relaxed) > 0; }

}  // namespace cf
