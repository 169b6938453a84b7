#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/common/upcast.h"
#include "kernels/dropout/dropout.h"

namespace cf::kernels {

namespace {
template <typename T>
void dropout_typed(const T* x, T* out, int64_t n, const DropoutParams& p) {
  const RowMath& rm = row_math();
  const T scale = T(1.0 / (1.0 - p.p));
  const uint64_t threshold = dropout_threshold(p.p);
  if (p.cols.defined()) {  // row r's counters start at counter0 + r * row_len; its columns pick them
    const int64_t T_ = p.cols.dim() ? p.cols.shape().back() : 1;
    const int64_t* cols = p.cols.data<int64_t>();
    if (T_ == 0) return;
    parallel_for(n / T_, std::max<int64_t>(1, kParallelGrain / 8 / T_), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        dropout_row(rm, x + r * T_, out + r * T_, T_, p.seed, p.counter0 + uint64_t(r * p.row_len), threshold,
                    scale, cols + r * T_);
    });
    return;
  }
  // Philox costs ~10 multiply rounds per element: parallelise earlier than plain maps.
  parallel_for(n, kParallelGrain / 8, [&](int64_t b, int64_t e) {
    dropout_row(rm, x + b, out + b, e - b, p.seed, p.counter0 + uint64_t(b), threshold, scale);
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
