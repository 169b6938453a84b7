// CPU arm of the fused optimizer steps (kernels/optim/optim.h): OpenMP over
// elements for large parameters.
#include "kernels/common/parallel.h"
#include "kernels/optim/optim_common.h"

namespace cf::kernels {

namespace {

// G: the gradient's type; L: the 16-bit parameter a master's step rounds into (L = T: none).
template <typename T, typename G = T, typename L = T>
void adam_typed(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s,
                const Tensor& low = Tensor()) {
  const AdamConsts<T> c(s);
  T *P = p.data<T>(), *M = m.data<T>(), *V = v.data<T>();
  const G* Gr = static_cast<const G*>(g.raw_data());
  L* Lo = low.defined() ? static_cast<L*>(low.raw_data()) : nullptr;
  const int64_t n = p.numel();
#pragma omp parallel for schedule(static) num_threads(max_threads()) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    adam_element(c, P, Gr, M, V, i);
    round_into(Lo, P, i);
  }
}

template <typename T, typename G = T, typename L = T>
void sgd_typed(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s, const Tensor& low = Tensor()) {
  const SgdConsts<T> c(s);
  T* P = p.data<T>();
  T* B = buf.defined() ? buf.data<T>() : nullptr;
  const G* Gr = static_cast<const G*>(g.raw_data());
  L* Lo = low.defined() ? static_cast<L*>(low.raw_data()) : nullptr;
  const int64_t n = p.numel();
#pragma omp parallel for schedule(static) num_threads(max_threads()) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    sgd_element(c, P, Gr, B, i);
    round_into(Lo, P, i);
  }
}

template <typename T>
double sum_squares_typed(const T* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

}  // namespace

double sum_squares_cpu(const Tensor& g) {
  double s = 0;
  CF_DISPATCH_FLOAT_STD(g.dtype(), "sum_squares", s = sum_squares_typed(g.data<scalar_t>(), g.numel()));
  return s;
}

void adam_step_cpu(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s) {
  CF_DISPATCH_FLOAT_STD(p.dtype(), "adam_step", adam_typed<scalar_t>(p, g, m, v, s));
}

void adam_steps_cpu(const std::vector<AdamTensors>& steps) {
  for (const AdamTensors& t : steps) {
    if (!t.low.defined())
      adam_step_cpu(t.p, t.g, t.m, t.v, t.s);
    else if (t.low.dtype() == kBFloat16)
      adam_typed<float, BFloat16, BFloat16>(t.p, t.g, t.m, t.v, t.s, t.low);
    else
      adam_typed<float, Half, Half>(t.p, t.g, t.m, t.v, t.s, t.low);
  }
}

void sgd_step_cpu(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  CF_DISPATCH_FLOAT_STD(p.dtype(), "sgd_step", sgd_typed<scalar_t>(p, g, buf, s));
}

void sgd_steps_cpu(const std::vector<SgdTensors>& steps) {
  for (const SgdTensors& t : steps) {
    if (!t.low.defined())
      sgd_step_cpu(t.p, t.g, t.buf, t.s);
    else if (t.low.dtype() == kBFloat16)
      sgd_typed<float, BFloat16, BFloat16>(t.p, t.g, t.buf, t.s, t.low);
    else
      sgd_typed<float, Half, Half>(t.p, t.g, t.buf, t.s, t.low);
  }
}

}  // namespace cf::kernels
