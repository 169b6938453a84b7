#pragma once
// CUDA test helpers. Every CUDA test case is named "cuda: ..." and is skipped,
// by name, when no GPU is visible (doctest lists it as skipped; under CTest,
// tests/main.cpp exits 77, which CTest reports as "Skipped", never "Passed").
//
// PARITY_CASE(op) registers a CUDA-vs-CPU parity case for an op of the
// registry; tests/cuda/test_cuda_registry.cpp fails when an op has none.
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace cf::test {

inline bool cuda_visible() {
  static const bool v = cf::cuda::is_available();
  return v;
}

inline std::set<std::string>& parity_cases() {
  static std::set<std::string> s;
  return s;
}
struct ParityCaseRegistrar {
  explicit ParityCaseRegistrar(const char* op) { parity_cases().insert(op); }
};

using ParityFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct ParityOptions {
  double atol = 1e-5, rtol = 1e-4;  // DESIGN.md section 4
  bool backward = true;             // compare input gradients too
  uint64_t seed = 5;
};

// A copy of t on `device` in t's own layout: a fresh leaf (requiring grad when
// t does) so both runs build their own graphs. A non-contiguous t (a transposed
// or sliced view) comes back as the same view of a copy of the storage span it
// covers, so the kernels under test see the same strides on both devices.
inline Tensor leaf_on(const Tensor& t, Device device) {
  if (!t.defined()) return t;
  Tensor src = t.detach(), c;
  if (src.is_contiguous() || src.numel() == 0) {
    c = clone(src).to(device);
  } else {
    int64_t span = 1;
    for (size_t d = 0; d < src.shape().size(); ++d) {
      REQUIRE_MESSAGE(src.strides()[d] >= 0, "leaf_on: negative strides are not supported");
      span += (src.shape()[d] - 1) * src.strides()[d];
    }
    Tensor storage = clone(make_view(src, {span}, {1}, src.offset())).to(device);
    c = make_view(storage, src.shape(), src.strides(), 0);
  }
  c = c.detach();
  if (t.requires_grad()) c.set_requires_grad(true);
  return c;
}

inline void check_close_rel(const Tensor& gpu, const Tensor& cpu, double atol, double rtol,
                            const std::string& what) {
  REQUIRE_MESSAGE(gpu.shape() == cpu.shape(), what, ": shape ", shape_str(gpu.shape()), " vs ",
                  shape_str(cpu.shape()));
  CHECK_MESSAGE(gpu.dtype() == cpu.dtype(), what, ": dtype ", gpu.dtype(), " vs ", cpu.dtype());
  std::vector<double> g = values(gpu), c = values(cpu);
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    bool both_nan = std::isnan(g[i]) && std::isnan(c[i]);
    bool same_inf = std::isinf(g[i]) && g[i] == c[i];
    if (!both_nan && !same_inf && !(std::fabs(g[i] - c[i]) <= atol + rtol * std::fabs(c[i]))) {
      if (reported++ < 5) FAIL_CHECK(what, " element ", i, ": cuda ", g[i], ", cpu ", c[i]);
    }
  }
  if (reported > 5) FAIL_CHECK(what, ": ", reported, " elements differ in all");
}

// Runs f on the CPU inputs and on CUDA copies; compares the outputs and, when
// opt.backward and some input requires grad, the gradients of sum(w * f(x))
// for a random w. Also proves the CUDA result really lives on the GPU.
inline void check_parity(const char* op, const ParityFn& f, const std::vector<Tensor>& inputs,
                         const ParityOptions& opt = {}) {
  INFO("op: ", std::string(op));
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    cpu_in.push_back(leaf_on(t, Device::cpu()));
    gpu_in.push_back(leaf_on(t, Device::cuda(0)));
  }
  Tensor yc = f(cpu_in), yg = f(gpu_in);
  REQUIRE(yg.device().is_cuda());
  check_close_rel(yg, yc, opt.atol, opt.rtol, str(op, " forward"));
  bool any_grad = false;
  for (const Tensor& t : inputs) any_grad = any_grad || (t.defined() && t.requires_grad());
  if (!opt.backward || !any_grad || !is_floating(yc.dtype())) return;
  Generator g(opt.seed);
  Tensor w = randn(yc.shape(), yc.dtype(), g);
  sum(mul(yc, w)).backward();
  sum(mul(yg, w.to(Device::cuda(0)))).backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined() || !inputs[k].requires_grad()) continue;
    Tensor gc = cpu_in[k].grad(), gg = gpu_in[k].grad();
    REQUIRE_MESSAGE(gc.defined() == gg.defined(), op, " grad of input ", k, " defined on one device only");
    if (!gc.defined()) continue;
    CHECK(gg.device().is_cuda());
    check_close_rel(gg, gc, opt.atol, opt.rtol, str(op, " grad of input ", k));
  }
}

// float64 gradcheck of f with the inputs moved to CUDA (as leaves).
inline void check_grad_cuda(const char* op, const GradcheckFn& f, const std::vector<Tensor>& inputs,
                            const GradcheckOptions& opt = {}) {
  std::vector<Tensor> gpu_in;
  for (const Tensor& t : inputs) gpu_in.push_back(leaf_on(t, Device::cuda(0)));
  check_grad(op, f, gpu_in, opt);
}

// int64 tensor of shape s with values in [lo, hi] (many duplicates when the range is small).
inline Tensor random_ints(const Shape& s, int64_t lo, int64_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> v(size_t(numel_of(s)));
  for (int64_t& e : v) e = d(rng);
  return Tensor::from_vector(v, s);
}

inline Tensor cuda0(const Tensor& t) { return t.to(Device::cuda(0)); }

// The message of the cf::Error f throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// float32 leaf on the CPU with distinct seeded values (parity inputs).
inline Tensor leaf32(const Shape& shape, uint64_t seed = 1, double low = -1.0, double high = 1.0) {
  Generator g(seed);
  Tensor t = rand(shape, kFloat32, g, low, high);
  t.set_requires_grad(true);
  return t;
}

}  // namespace cf::test

#define CUDA_TEST_CASE(name) TEST_CASE("cuda: " name * doctest::skip(!::cf::test::cuda_visible()))

// A parity case for `op` (the name in cf::op_registry()).
#define PARITY_CASE(op)                                                                          \
  static ::cf::test::ParityCaseRegistrar CF_GRADCHECK_CONCAT(cf_pc_reg_, __LINE__)(op);         \
  CUDA_TEST_CASE("parity " op)
