#include <cmath>
#include <limits>

#include "kernels/common/upcast.h"
#include "kernels/common/parallel.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace cf::kernels {

namespace {

int64_t sample_grain(int64_t c) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(c, 1)); }

template <typename T>
int64_t forward_typed(const Tensor& logits, const Tensor& targets, const CrossEntropyParams& p,
                      const Tensor& losses, const Tensor& stats) {
  const int64_t C = p.classes, inner = p.inner, S = targets.numel();
  const int64_t* tp = targets.data<int64_t>();
  // Validate every target serially first: nothing may throw inside the parallel region.
  int64_t count = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = tp[s];
    if (t == p.ignore_index) continue;
    CF_CHECK(t >= 0 && t < C, IndexError, "[cross_entropy] target ", t, " at position ", s,
             " is out of range for ", C, " classes (ignore_index is ", p.ignore_index, ")");
    ++count;
  }
  const T* xp = logits.data<T>();
  T* lp = losses.data<T>();
  T* sp = stats.data<T>();
  const double ls = p.label_smoothing;
  parallel_for(S, sample_grain(C), [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      const int64_t t = tp[s];
      if (t == p.ignore_index) {
        lp[s] = T(0);
        sp[2 * s] = sp[2 * s + 1] = T(0);
        continue;
      }
      const T* xi = xp + (s / inner) * C * inner + (s % inner);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < C; ++c) m = double(xi[c * inner]) > m ? double(xi[c * inner]) : m;
      double acc = 0, gap = 0;  // gap: sum_c (m - x_c), each term >= 0, for label smoothing
      for (int64_t c = 0; c < C; ++c) {
        acc += std::exp(double(xi[c * inner]) - m);
        gap += m - double(xi[c * inner]);
      }
      const double la = std::log(acc);
      double loss = (1.0 - ls) * ((m - double(xi[t * inner])) + la);
      if (ls > 0) loss += ls * (gap / double(C) + la);  // mean_c of -log p_c
      lp[s] = T(loss);
      sp[2 * s] = T(m);  // one of the logits (or -inf): exact in T
      sp[2 * s + 1] = T(la);
    }
  });
  return count;
}

template <typename T>
void backward_typed(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                    const Tensor& grad, double scale, const CrossEntropyParams& p,
                    const Tensor& dlogits) {
  const int64_t C = p.classes, inner = p.inner, S = targets.numel();
  const int64_t* tp = targets.data<int64_t>();
  const T* xp = logits.data<T>();
  const T* sp = lse.data<T>();
  const T* gp = grad.data<T>();
  const bool per_sample = grad.numel() != 1 || S == 1;
  T* op = dlogits.data<T>();
  const double ls = p.label_smoothing, off = ls / double(C);
  parallel_for(S, sample_grain(C), [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      const int64_t base = (s / inner) * C * inner + (s % inner);
      const T* xi = xp + base;
      T* oi = op + base;
      const int64_t t = tp[s];
      if (t == p.ignore_index) {
        for (int64_t c = 0; c < C; ++c) oi[c * inner] = T(0);
        continue;
      }
      const double gs = double(gp[per_sample ? s : 0]) * scale, m = double(sp[2 * s]), la = double(sp[2 * s + 1]);
      for (int64_t c = 0; c < C; ++c) {
        double d = std::exp((double(xi[c * inner]) - m) - la) - off;
        if (c == t) d -= 1.0 - ls;
        oi[c * inner] = T(gs * d);
      }
    }
  });
}

}  // namespace

int64_t cross_entropy_forward_cpu(const Tensor& logits, const Tensor& targets,
                                  const CrossEntropyParams& p, const Tensor& losses,
                                  const Tensor& lse) {
  int64_t count = 0;
  if (is_low_precision(logits.dtype())) {  // float32 logits and stats, one rounding per loss
    Tensor lf = float32_buffer_for(losses);
    count = forward_typed<float>(upcast_float32(logits), targets, p, lf, lse);
    downcast_into(lf, losses);
    return count;
  }
  CF_DISPATCH_FLOAT(logits.dtype(), "cross_entropy",
                    count = forward_typed<scalar_t>(logits, targets, p, losses, lse));
  return count;
}

void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                const Tensor& grad, double scale, const CrossEntropyParams& p,
                                const Tensor& dlogits) {
  if (is_low_precision(logits.dtype())) {
    Tensor df = float32_buffer_for(dlogits);
    backward_typed<float>(upcast_float32(logits), targets, lse, upcast_float32(grad), scale, p, df);
    downcast_into(df, dlogits);
    return;
  }
  CF_DISPATCH_FLOAT_STD(logits.dtype(), "cross_entropy",
                    backward_typed<scalar_t>(logits, targets, lse, grad, scale, p, dlogits));
}

}  // namespace cf::kernels
