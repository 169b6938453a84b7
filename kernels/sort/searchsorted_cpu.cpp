#include <algorithm>

#include "kernels/common/parallel.h"
#include "kernels/sort/searchsorted.h"

namespace cf::kernels {

void searchsorted_cpu(const Tensor& sorted, const Tensor& values, const Tensor& out, const SearchGeom& g,
                      bool right) {
  CF_DISPATCH_NUMERIC(values.dtype(), "searchsorted", {
    const scalar_t* s = sorted.data<scalar_t>();
    const scalar_t* v = values.data<scalar_t>();
    int64_t* o = out.data<int64_t>();
    // about log2(m) + 1 steps per value
    int64_t steps = 1;
    for (int64_t m = g.m; m > 1; m /= 2) ++steps;
    parallel_for(g.rows * g.k, std::max<int64_t>(1, kParallelGrain / steps), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = search_row(s + (i / g.k) * g.m, g.m, v[i], right);
    });
  });
}

}  // namespace cf::kernels
