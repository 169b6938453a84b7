#pragma once
// The per-element update of each fused step, shared by the CPU loop and the CUDA
// kernel so both evaluate the same expression in T (the constants come from the
// host in double, cast once, as before the kernels existed). The gradient's type G
// is T, or the 16-bit type of a master's parameter (widened exactly to T = float).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "kernels/optim/optim.h"

#ifdef __CUDACC__
#define CF_OPTIM_HD __host__ __device__ __forceinline__
#else
#define CF_OPTIM_HD inline
#endif

namespace cf::kernels {

// std::sqrt on the host (the float overload for float), CUDA's sqrt on the device
// (correctly rounded unless fast math is on, which cf's build does not use).
template <typename T>
CF_OPTIM_HD T optim_sqrt(T x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

template <typename T>
struct AdamConsts {
  T step_size, bc2_sqrt, eps, b1, b2, a1, a2, l2, shrink;
  bool do_shrink;
  AdamConsts() = default;  // (an array of them travels as a kernel argument: adam_steps_cuda)
  explicit AdamConsts(const AdamStep& s) {
    step_size = T(s.lr / (1.0 - std::pow(s.beta1, double(s.step))));
    bc2_sqrt = T(std::sqrt(1.0 - std::pow(s.beta2, double(s.step))));
    eps = T(s.eps);
    b1 = T(s.beta1);
    b2 = T(s.beta2);
    a1 = T(1.0 - s.beta1);
    a2 = T(1.0 - s.beta2);
    l2 = s.decoupled ? T(0) : T(s.weight_decay);
    shrink = T(1.0 - s.lr * s.weight_decay);
    do_shrink = s.decoupled && s.weight_decay != 0;
  }
};

template <typename T, typename G>
CF_OPTIM_HD void adam_element(const AdamConsts<T>& c, T* p, const G* g, T* m, T* v, int64_t i) {
  T pi = p[i];
  T gi = T(g[i]);
  if (c.l2 != T(0)) gi = gi + c.l2 * pi;
  if (c.do_shrink) pi = pi * c.shrink;
  const T mi = m[i] * c.b1 + c.a1 * gi;
  const T vi = v[i] * c.b2 + c.a2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  const T denom = optim_sqrt(vi) / c.bc2_sqrt + c.eps;
  p[i] = pi + (-c.step_size) * (mi / denom);
}

template <typename T>
struct SgdConsts {
  T lr, wd, mom, keep;
  bool nesterov, first;
  SgdConsts() = default;  // (an array of them travels as a kernel argument: sgd_steps_cuda)
  explicit SgdConsts(const SgdStep& s)
      : lr(T(s.lr)), wd(T(s.weight_decay)), mom(T(s.momentum)), keep(T(1.0 - s.dampening)),
        nesterov(s.nesterov), first(s.first) {}
};

template <typename T, typename G>
CF_OPTIM_HD void sgd_element(const SgdConsts<T>& c, T* p, const G* g, T* buf, int64_t i) {
  T d = T(g[i]);
  if (c.wd != T(0)) d = d + c.wd * p[i];
  if (buf) {
    const T b = c.first ? d : buf[i] * c.mom + c.keep * d;
    buf[i] = b;
    d = c.nesterov ? d + c.mom * b : b;
  }
  p[i] = p[i] + (-c.lr) * d;
}

// A master's step ends by rounding the master into its 16-bit parameter (nearest even, as copy_).
template <typename L, typename T>
CF_OPTIM_HD void round_into(L* low, const T* p, int64_t i) {
  if constexpr (!std::is_same_v<L, T>) low[i] = L(p[i]);
}

}  // namespace cf::kernels
