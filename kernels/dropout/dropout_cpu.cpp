#include "core/rng.h"
#include "kernels/common/parallel.h"
#include "kernels/common/upcast.h"
#include "kernels/dropout/dropout.h"

namespace cf::kernels {

namespace {
template <typename T>
void dropout_typed(const T* x, T* out, int64_t n, const DropoutParams& p) {
  const T scale = T(1.0 / (1.0 - p.p));
  // Philox costs ~10 multiply rounds per element: parallelise earlier than plain maps.
  parallel_for(n, kParallelGrain / 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      PhiloxOut r = philox4x32_10(p.seed, p.counter0 + uint64_t(i));
      out[i] = philox_uniform_d(r) < p.p ? T(0) : T(x[i] * scale);
    }
  });
}
}  // namespace

void dropout_cpu(const Tensor& x, const Tensor& out, const DropoutParams& p) {
  if (is_low_precision(x.dtype())) {  // keep-scale 1/(1-p) in float32, one rounding per element
    Tensor of = float32_buffer_for(out);
    dropout_typed<float>(upcast_float32(x).data<float>(), of.data<float>(), out.numel(), p);
    downcast_into(of, out);
    return;
  }
  CF_DISPATCH_FLOAT_STD(x.dtype(), "dropout",
                    dropout_typed<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), out.numel(), p));
}

}  // namespace cf::kernels
