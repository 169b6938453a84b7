#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/scan/scan.h"

namespace cf::kernels {

namespace {

// One (outer) slab: n rows of `inner` contiguous elements, the running sums of all
// inner columns kept side by side so the loads and stores run along memory.
template <typename T>
void scan_slab(const T* x, T* out, int64_t n, int64_t inner, bool reverse, std::vector<scan_acc_t<T>>& acc) {
  using A = scan_acc_t<T>;
  acc.assign(size_t(inner), A(0));
  for (int64_t s = 0; s < n; ++s) {
    const int64_t i = reverse ? n - 1 - s : s;
    const T* xr = x + i * inner;
    T* orow = out + i * inner;
    for (int64_t j = 0; j < inner; ++j) {
      acc[size_t(j)] += A(xr[j]);
      orow[j] = T(acc[size_t(j)]);
    }
  }
}

}  // namespace

void cumsum_cpu(const Tensor& x, const Tensor& out, const ScanGeom& g, bool reverse) {
  CF_DISPATCH_NUMERIC(x.dtype(), "cumsum", {
    const scalar_t* xp = x.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    const int64_t slab = g.n * g.inner;
    if (g.outer > 1 || g.inner == 1) {
      // independent slabs (lines when inner == 1) in parallel
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(slab, 1));
      parallel_for(g.outer, grain, [&](int64_t b, int64_t e) {
        std::vector<scan_acc_t<scalar_t>> acc;
        for (int64_t o = b; o < e; ++o) scan_slab(xp + o * slab, op + o * slab, g.n, g.inner, reverse, acc);
      });
    } else {
      // one slab: its inner columns split between threads
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(g.n, 1));
      parallel_for(g.inner, grain, [&](int64_t b, int64_t e) {
        using A = scan_acc_t<scalar_t>;
        std::vector<A> acc(size_t(e - b), A(0));
        for (int64_t s = 0; s < g.n; ++s) {
          const int64_t i = reverse ? g.n - 1 - s : s;
          for (int64_t j = b; j < e; ++j) {
            acc[size_t(j - b)] += A(xp[i * g.inner + j]);
            op[i * g.inner + j] = scalar_t(acc[size_t(j - b)]);
          }
        }
      });
    }
  });
}

}  // namespace cf::kernels
