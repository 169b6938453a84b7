#pragma once
// CUDA test helpers. Every CUDA test case is named "cuda: ..." and is skipped,
// by name, when no GPU is visible (doctest lists it as skipped; under CTest,
// tests/main.cpp exits 77, which CTest reports as "Skipped", never "Passed").
//
// PARITY_CASE(op) registers a CUDA-vs-CPU parity case for an op of the
// registry; tests/cuda/test_cuda_registry.cpp fails when an op has none.
#include <cmath>
#include <functional>
#include <limits>
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

// ---- shared parity fixtures of the op-family tests (tests/ops/test_*.cpp) ----

using Inputs = std::vector<Tensor>;
using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;


using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

// f on x in four layouts: contiguous (packed path), transposed view, step-2 slice
// and a 1-element offset (unaligned: flat path). Views are made inside f.
inline void unary_layouts(const char* op, const Fn1& f, double lo, double hi, uint64_t seed,
                   const ParityOptions& opt = {}) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32({4, 5}, seed, lo, hi)}, opt);
  check_parity(op, [f](const Inputs& x) { return f(transpose(x[0], 0, 1)); }, {leaf32({5, 4}, seed + 1, lo, hi)},
               opt);
  check_parity(op, [f](const Inputs& x) { return f(slice(x[0], 1, 0, 10, 2)); }, {leaf32({4, 10}, seed + 2, lo, hi)},
               opt);
  check_parity(op, [f](const Inputs& x) { return f(slice(x[0], 0, 1, 1001)); }, {leaf32({1001}, seed + 3, lo, hi)},
               opt);
}

// Empty and 1<<20-element inputs (the multi-block grid-stride loops).
inline void unary_sizes(const char* op, const Fn1& f, double lo, double hi, const ParityOptions& opt = {}) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32({0, 3}, 7, lo, hi)}, opt);
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32({1 << 20}, 8, lo, hi)}, opt);
}

inline void unary_case(const char* op, const Fn1& f, double lo = -2.0, double hi = 2.0, const ParityOptions& opt = {}) {
  unary_layouts(op, f, lo, hi, 11, opt);
  unary_sizes(op, f, lo, hi, opt);
}

// Binary op over every path: same-shape contiguous (packed), scalar operand on
// either side, broadcasting (4,1,3) with (5,1), transposed and unaligned operands,
// empty and 1<<20 elements.
inline void binary_case(const char* op, const Fn2& f, double lo = -2.0, double hi = 2.0, double blo = -2.0,
                 double bhi = 2.0, const ParityOptions& opt = {}) {
  auto g = [f](const Inputs& x) { return f(x[0], x[1]); };
  check_parity(op, g, {leaf32({6, 7}, 1, lo, hi), leaf32({6, 7}, 2, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({4, 1, 3}, 3, lo, hi), leaf32({5, 1}, 4, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({37}, 5, lo, hi), leaf32({}, 6, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({}, 7, lo, hi), leaf32({37}, 8, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({3, 1}, 9, lo, hi), leaf32({1, 3}, 10, blo, bhi)}, opt);
  check_parity(op, [f](const Inputs& x) { return f(transpose(x[0], 0, 1), x[1]); },
               {leaf32({5, 4}, 11, lo, hi), leaf32({4, 5}, 12, blo, bhi)}, opt);
  check_parity(op, [f](const Inputs& x) { return f(slice(x[0], 0, 1, 1001), slice(x[1], 1, 0, 2000, 2)); },
               {leaf32({1001}, 13, lo, hi), leaf32({1, 2000}, 14, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({0, 3}, 15, lo, hi), leaf32({3}, 16, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({1 << 20}, 17, lo, hi), leaf32({1 << 20}, 18, blo, bhi)}, opt);
  check_parity(op, g, {leaf32({1 << 20}, 19, lo, hi), leaf32({1}, 20, blo, bhi)}, opt);
}

// Forward-only parity on inputs that hold NaN, +-inf, -0.0 and ties.
inline Tensor specials32() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return t32({nan, -0.0f, 0.0f, 1.0f, -1.0f, inf, -inf, 2.5f, -2.5f, 1.0f, nan, 0.5f}, {12});
}
inline Tensor specials32_b() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return t32({1.0f, 0.0f, -0.0f, nan, -1.0f, 2.0f, -inf, 2.5f, 3.0f, 1.0f, nan, inf}, {12});
}
inline void specials_unary(const char* op, const Fn1& f) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {specials32()}, {});
}
inline void specials_binary(const char* op, const Fn2& f) {
  check_parity(op, [f](const Inputs& x) { return f(x[0], x[1]); }, {specials32(), specials32_b()}, {});
}

// float32 with values from a few levels (many exact ties), no grad.
inline Tensor ties32(const Shape& s, uint32_t seed, int levels = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> v(size_t(numel_of(s)));
  for (float& e : v) e = float(d(rng)) - 1.0f;
  return t32(v, s);
}
inline Tensor bools(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<bool> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (rng() & 1u) != 0;
  return Tensor::from_vector(v, s);
}

// f64 gradcheck of a unary op on CUDA (inputs in [lo, hi], away from kinks).
inline void grad_unary(const char* op, const Fn1& f, double lo = -1.0, double hi = 1.0) {
  check_grad_cuda(op, [f](const Inputs& x) { return f(x[0]); }, {leaf64({2, 3}, 3, lo, hi)});
  check_grad_cuda(op, [f](const Inputs& x) { return f(transpose(x[0], 0, 1)); }, {leaf64({3, 2}, 4, lo, hi)});
}

// Exact equality of two tensors on different devices.
inline void check_equal(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.device().is_cuda());
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  std::vector<double> g = values(gpu), c = values(cpu);
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == c[i]) && bad++ < 5) FAIL_CHECK("element ", i, ": cuda ", g[i], ", cpu ", c[i]);
}


// f on x of shape s in three layouts: contiguous, every axis reversed (a permuted
// view of a reversed-shape leaf) and a step-2 slice of the last axis.
inline void parity_layouts(const char* op, const Fn1& f, const Shape& s, uint64_t seed, const ParityOptions& opt = {}) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32(s, seed)}, opt);
  if (s.size() >= 2) {
    Shape r;
    std::vector<int64_t> perm;
    for (size_t i = s.size(); i-- > 0;) {
      r.push_back(s[i]);
      perm.push_back(int64_t(i));
    }
    check_parity(op, [f, perm](const Inputs& x) { return f(permute(x[0], perm)); }, {leaf32(r, seed + 1)}, opt);
  }
  if (!s.empty()) {
    Shape b = s;
    const int64_t last = int64_t(s.size()) - 1;
    b.back() *= 2;
    const int64_t len = b.back();
    check_parity(op, [f, last, len](const Inputs& x) { return f(slice(x[0], last, 0, len, 2)); },
                 {leaf32(b, seed + 2)}, opt);
  }
}

// The axis choices of the reduction cases on a 3-d input.
inline const std::vector<Axes>& axis_sets() {
  static const std::vector<Axes> a = {{}, {2}, {0}, {1}, {0, 2}, {-1, 0, 1}};
  return a;
}

// ties32 requiring grad.
inline Tensor tied_leaf32(const Shape& s, uint32_t seed, int levels = 3) {
  Tensor t = ties32(s, seed, levels);
  t.set_requires_grad(true);
  return t;
}

// float32 with NaN at a few positions (two in the same row), no grad.
inline Tensor with_nan32(const Shape& s, uint64_t seed) {
  Tensor t = leaf32(s, seed).detach();
  std::vector<float> v = t.to_vector<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  v[1] = nan;
  v[3] = nan;
  if (v.size() > 10) v[v.size() - 2] = nan;
  return t32(v, s);
}

inline Tensor rand_targets(const Shape& s, int64_t classes, uint32_t seed, int64_t ignore = -100, double p_ignore = 0.2) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, classes - 1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> v(size_t(numel_of(s)));
  for (int64_t& e : v) e = u(rng) < p_ignore ? ignore : d(rng);
  return Tensor::from_vector(v, s);
}


}  // namespace cf::test

#define CUDA_TEST_CASE(name) TEST_CASE("cuda: " name * doctest::skip(!::cf::test::cuda_visible()))

// A parity case for the op `op` (an identifier of autograd/op_names.h).
#define PARITY_CASE(op)                                                                                 \
  static ::cf::test::ParityCaseRegistrar CF_GRADCHECK_CONCAT(cf_pc_reg_, __LINE__)(::cf::opname::op); \
  CUDA_TEST_CASE("parity " #op)
