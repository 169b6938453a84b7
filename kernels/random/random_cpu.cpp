#include <cmath>

#include "core/rng.h"
#include "kernels/common/parallel.h"
#include "kernels/random/random.h"

namespace cf::kernels {

namespace {
template <typename T>
void fill_typed(T* out, int64_t n, const RandomParams& p) {
  parallel_for(n, kParallelGrain / 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      PhiloxOut r = philox4x32_10(p.seed, p.counter0 + uint64_t(i));
      switch (p.kind) {
        case RandomKind::Uniform: {
          double u = std::is_same_v<T, float> ? double(philox_uniform_f(r)) : philox_uniform_d(r);
          out[i] = T(p.a + (p.b - p.a) * u);
          // u < 1, but rounding to T may reach high (bfloat16: 0.2% of rand's draws were 1.0), or
          // fall below a low T does not hold (bfloat16 rand(low=0.7) gave 0.69921875): one step
          // into [low, high)
          if constexpr (!std::is_same_v<T, int64_t> && !std::is_same_v<T, bool>) {
            if (double(out[i]) < p.a) out[i] = next_above(out[i]);
            if (double(out[i]) >= p.b) out[i] = next_below(out[i]);
          }
          break;
        }
        case RandomKind::Normal: out[i] = T(p.a + p.b * philox_normal(r)); break;
        case RandomKind::Integer: {
          out[i] = T(int64_t(uint64_t(p.low) + philox_below(r, p.span)));  // unsigned: no overflow near INT64_MAX
          break;
        }
        case RandomKind::Bernoulli: out[i] = T(philox_uniform_d(r) < p.a); break;
      }
    }
  });
}
}  // namespace

void random_fill_cpu(const Tensor& out, const RandomParams& p) {
  CF_DISPATCH_ALL(out.dtype(), "random", fill_typed<scalar_t>(out.data<scalar_t>(), out.numel(), p));
}

}  // namespace cf::kernels
