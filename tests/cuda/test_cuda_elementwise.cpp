// CUDA parity of the elementwise family (kernels/elementwise/elementwise_cuda.cu),
// the Philox fills (kernels/random/random_cuda.cu), dropout
// (kernels/dropout/dropout_cuda.cu) and the shape/join ops that run on copy_cuda.
// Each kernel path is reached: packed (contiguous, aligned, float4/double2), flat
// (unaligned slices, dtype-changing copies, bool outputs), a single element
// broadcast (scalar operands), strided (broadcasting such as (4,1,3) with (5,1),
// transposed and step-2 views made inside f, so both devices see the strides),
// empty tensors and 1<<20 elements (many blocks, grid-stride). NaN, -0.0 and tie
// inputs check the CPU's NaN and tie rules; int64 and bool where the CPU accepts
// them. Random ops: the CUDA tensor equals the CPU tensor for the same seed
// (bit-exact except randn, which goes through the device libm).
//
// Tolerances: the defaults of DESIGN.md section 4 everywhere (the device float
// functions are within a few ulp of glibc's); none is loosened.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

using Inputs = std::vector<Tensor>;
using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

// f on x in four layouts: contiguous (packed path), transposed view, step-2 slice
// and a 1-element offset (unaligned: flat path). Views are made inside f.
void unary_layouts(const char* op, const Fn1& f, double lo, double hi, uint64_t seed,
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
void unary_sizes(const char* op, const Fn1& f, double lo, double hi, const ParityOptions& opt = {}) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32({0, 3}, 7, lo, hi)}, opt);
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32({1 << 20}, 8, lo, hi)}, opt);
}

void unary_case(const char* op, const Fn1& f, double lo = -2.0, double hi = 2.0, const ParityOptions& opt = {}) {
  unary_layouts(op, f, lo, hi, 11, opt);
  unary_sizes(op, f, lo, hi, opt);
}

// Binary op over every path: same-shape contiguous (packed), scalar operand on
// either side, broadcasting (4,1,3) with (5,1), transposed and unaligned operands,
// empty and 1<<20 elements.
void binary_case(const char* op, const Fn2& f, double lo = -2.0, double hi = 2.0, double blo = -2.0,
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
Tensor specials32() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return t32({nan, -0.0f, 0.0f, 1.0f, -1.0f, inf, -inf, 2.5f, -2.5f, 1.0f, nan, 0.5f}, {12});
}
Tensor specials32_b() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return t32({1.0f, 0.0f, -0.0f, nan, -1.0f, 2.0f, -inf, 2.5f, 3.0f, 1.0f, nan, inf}, {12});
}
void specials_unary(const char* op, const Fn1& f) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {specials32()}, {});
}
void specials_binary(const char* op, const Fn2& f) {
  check_parity(op, [f](const Inputs& x) { return f(x[0], x[1]); }, {specials32(), specials32_b()}, {});
}

// float32 with values from a few levels (many exact ties), no grad.
Tensor ties32(const Shape& s, uint32_t seed, int levels = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> v(size_t(numel_of(s)));
  for (float& e : v) e = float(d(rng)) - 1.0f;
  return t32(v, s);
}
Tensor bools(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<bool> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (rng() & 1u) != 0;
  return Tensor::from_vector(v, s);
}

// f64 gradcheck of a unary op on CUDA (inputs in [lo, hi], away from kinks).
void grad_unary(const char* op, const Fn1& f, double lo = -1.0, double hi = 1.0) {
  check_grad_cuda(op, [f](const Inputs& x) { return f(x[0]); }, {leaf64({2, 3}, 3, lo, hi)});
  check_grad_cuda(op, [f](const Inputs& x) { return f(transpose(x[0], 0, 1)); }, {leaf64({3, 2}, 4, lo, hi)});
}

// Exact equality of two tensors on different devices.
void check_equal(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.device().is_cuda());
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  std::vector<double> g = values(gpu), c = values(cpu);
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == c[i]) && bad++ < 5) FAIL_CHECK("element ", i, ": cuda ", g[i], ", cpu ", c[i]);
}

}  // namespace

TEST_SUITE("cuda/elementwise") {

// ---------------------------------------------------------------- binary arithmetic

PARITY_CASE("add") {
  binary_case("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  check_parity("add", [](const Inputs& x) { return add(x[0], 1.5) + 2.0; }, {leaf32({1000}, 1)});
  check_parity("add", [](const Inputs& x) { return add(x[0], x[1]); }, {random_ints({4, 1, 3}, -9, 9, 1), random_ints({5, 1}, -9, 9, 2)});
  specials_binary("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  check_grad_cuda("add", [](const Inputs& x) { return add(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
}
PARITY_CASE("sub") {
  binary_case("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
  check_parity("sub", [](const Inputs& x) { return 1.0 - x[0]; }, {leaf32({1000}, 2)});
  check_parity("sub", [](const Inputs& x) { return sub(x[0], x[1]); }, {random_ints({7}, -9, 9, 3), random_ints({7}, -9, 9, 4)});
  check_grad_cuda("sub", [](const Inputs& x) { return sub(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
}
PARITY_CASE("mul") {
  binary_case("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
  check_parity("mul", [](const Inputs& x) { return mul(x[0], x[1]); }, {random_ints({7}, -9, 9, 5), random_ints({7}, -9, 9, 6)});
  // mul_ (in place, the output aliases the input) on a contiguous and a strided tensor.
  check_parity("mul", [](const Inputs& x) {
    Tensor t = clone(x[0].detach());
    mul_(t, 3.0);
    Tensor u = transpose(clone(x[0].detach()), 0, 1);
    mul_(u, -2.0);
    return cat({reshape(t, {-1}), reshape(u, {-1})}, 0);
  }, {leaf32({6, 5}, 7).detach()});
  check_grad_cuda("mul", [](const Inputs& x) { return mul(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
}
PARITY_CASE("div") {
  binary_case("div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, -2, 2, 0.5, 2);
  check_parity("div", [](const Inputs& x) { return div(x[0], 4.0); }, {leaf32({1000}, 3)});
  // int64: C++ truncation toward zero for every sign combination.
  check_parity("div", [](const Inputs& x) { return div(x[0], x[1]); },
               {ti64({7, -7, 7, -7, 0, 9, -1}, {7}), ti64({2, 2, -2, -2, 3, 10, 3}, {7})});
  specials_binary("div", [](const Tensor& a, const Tensor& b) { return div(a, b); });
  // A zero int64 divisor: the CPU's ValueError, same message, on CUDA.
  Tensor a = ti64({1, 2, 3}, {3}), z = ti64({1, 0, 2}, {3});
  const std::string cpu = error_of([&] { div(a, z); });
  const std::string gpu = error_of([&] { div(cuda0(a), cuda0(z)); });
  CHECK(!cpu.empty());
  CHECK(gpu == cpu);
  CHECK_THROWS_MSG(div(cuda0(a), cuda0(z)), ValueError, "[div]", "division by zero");
  check_grad_cuda("div", [](const Inputs& x) { return div(x[0], x[1]); },
                  {leaf64({2, 3}, 1), leaf64({3}, 2, 0.5, 2.0)});
}
PARITY_CASE("pow") {
  binary_case("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.5, 2, -2, 2);
  unary_case("pow", [](const Tensor& x) { return pow(x, 2.5); }, 0.5, 2);
  unary_case("pow", [](const Tensor& x) { return pow(x, 3.0); });
  specials_binary("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); });
  // int64 pow: exact integer powers, negative bases, negative exponents truncated.
  check_parity("pow", [](const Inputs& x) { return pow(x[0], x[1]); },
               {ti64({3, -3, 2, 7, 0, 1, -1, 2, 5, 10}, {10}), ti64({4, 3, 40, 12, 0, -3, -5, -1, 0, 15}, {10})});
  check_grad_cuda("pow", [](const Inputs& x) { return pow(x[0], x[1]); },
                  {leaf64({2, 3}, 1, 0.5, 2), leaf64({3}, 2)});
  check_grad_cuda("pow", [](const Inputs& x) { return pow(x[0], 2.5); }, {leaf64({2, 3}, 1, 0.5, 2)});
}
PARITY_CASE("maximum") {
  binary_case("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  // NaN only propagates from b, ties send the gradient to a: forward on specials,
  // forward and backward on exact ties.
  specials_binary("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  Tensor ta = ties32({50}, 1), tb = ties32({50}, 2);
  ta.set_requires_grad(true);
  tb.set_requires_grad(true);
  check_parity("maximum", [](const Inputs& x) { return maximum(x[0], x[1]); }, {ta, tb});
  check_parity("maximum", [](const Inputs& x) { return maximum(x[0], x[1]); }, {random_ints({9}, -5, 5, 3), random_ints({9}, -5, 5, 4)});
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad_cuda("maximum", [](const Inputs& x) { return maximum(x[0], x[1]); }, {a, b});
}
PARITY_CASE("minimum") {
  binary_case("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  specials_binary("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  Tensor ta = ties32({50}, 3), tb = ties32({50}, 4);
  ta.set_requires_grad(true);
  tb.set_requires_grad(true);
  check_parity("minimum", [](const Inputs& x) { return minimum(x[0], x[1]); }, {ta, tb});
  check_parity("minimum", [](const Inputs& x) { return minimum(x[0], x[1]); }, {random_ints({9}, -5, 5, 5), random_ints({9}, -5, 5, 6)});
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad_cuda("minimum", [](const Inputs& x) { return minimum(x[0], x[1]); }, {a, b});
}

PARITY_CASE("where") {
  auto w = [](const Inputs& x) { return where(x[0], x[1], x[2]); };
  check_parity("where", w, {bools({6, 7}, 1), leaf32({6, 7}, 1), leaf32({6, 7}, 2)});
  check_parity("where", w, {bools({4, 1, 3}, 2), leaf32({5, 1}, 3), leaf32({3}, 4)});
  check_parity("where", [](const Inputs& x) { return where(transpose(x[0], 0, 1), x[1], x[2]); },
               {bools({5, 4}, 3), leaf32({4, 5}, 5), leaf32({1}, 6)});
  check_parity("where", [](const Inputs& x) { return where(x[0], x[1], -1.0); }, {bools({300}, 4), leaf32({300}, 7)});
  check_parity("where", w, {bools({1 << 20}, 5), leaf32({1 << 20}, 8), leaf32({1 << 20}, 9)});
  check_parity("where", w, {bools({0, 3}, 6), leaf32({0, 3}, 10), leaf32({3}, 11)});
  check_parity("where", w, {bools({9}, 7), random_ints({9}, -5, 5, 1), random_ints({9}, -5, 5, 2)});
  check_parity("where", w, {bools({9}, 8), bools({9}, 9), bools({1}, 10)});
  Tensor c = cuda0(Tensor::from_vector(std::vector<bool>{true, false, true}, {3}));
  check_grad_cuda("where", [c](const Inputs& x) { return where(c, x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
}

// ---------------------------------------------------------------- unary

PARITY_CASE("neg") {
  unary_case("neg", [](const Tensor& x) { return neg(x); });
  check_parity("neg", [](const Inputs& x) { return -x[0]; }, {random_ints({4, 5}, -100, 100, 1)});
  specials_unary("neg", [](const Tensor& x) { return neg(x); });
  grad_unary("neg", [](const Tensor& x) { return neg(x); });
}
PARITY_CASE("abs") {
  unary_case("abs", [](const Tensor& x) { return abs(x); });
  check_parity("abs", [](const Inputs& x) { return abs(transpose(x[0], 0, 1)); }, {random_ints({4, 5}, -100, 100, 2)});
  specials_unary("abs", [](const Tensor& x) { return abs(x); });
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9}, {4}).set_requires_grad(true);
  check_grad_cuda("abs", [](const Inputs& v) { return abs(v[0]); }, {x});
}
PARITY_CASE("square") {
  unary_case("square", [](const Tensor& x) { return square(x); });
  check_parity("square", [](const Inputs& x) { return square(x[0]); }, {random_ints({4, 5}, -1000, 1000, 3)});
  grad_unary("square", [](const Tensor& x) { return square(x); });
}
PARITY_CASE("sign") {
  ParityOptions fwd;
  fwd.backward = false;  // sign records no graph (zero gradient almost everywhere)
  unary_case("sign", [](const Tensor& x) { return sign(x); }, -2, 2, fwd);
  check_parity("sign", [](const Inputs& x) { return sign(x[0]); }, {random_ints({4, 5}, -2, 2, 4)});
  specials_unary("sign", [](const Tensor& x) { return sign(x); });
}
PARITY_CASE("exp") {
  unary_case("exp", [](const Tensor& x) { return exp(x); });
  specials_unary("exp", [](const Tensor& x) { return exp(x); });
  grad_unary("exp", [](const Tensor& x) { return exp(x); });
}
PARITY_CASE("log") {
  unary_case("log", [](const Tensor& x) { return log(x); }, 0.1, 3);
  specials_unary("log", [](const Tensor& x) { return log(x); });
  grad_unary("log", [](const Tensor& x) { return log(x); }, 0.5, 2);
}
PARITY_CASE("sqrt") {
  unary_case("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 3);
  specials_unary("sqrt", [](const Tensor& x) { return sqrt(x); });
  grad_unary("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.5, 2);
}
PARITY_CASE("rsqrt") {
  unary_case("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 3);
  grad_unary("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.5, 2);
}
PARITY_CASE("sin") {
  unary_case("sin", [](const Tensor& x) { return sin(x); });
  grad_unary("sin", [](const Tensor& x) { return sin(x); });
}
PARITY_CASE("cos") {
  unary_case("cos", [](const Tensor& x) { return cos(x); });
  grad_unary("cos", [](const Tensor& x) { return cos(x); });
}
PARITY_CASE("tanh") {
  unary_case("tanh", [](const Tensor& x) { return tanh(x); });
  specials_unary("tanh", [](const Tensor& x) { return tanh(x); });
  grad_unary("tanh", [](const Tensor& x) { return tanh(x); });
}
PARITY_CASE("sigmoid") {
  unary_case("sigmoid", [](const Tensor& x) { return sigmoid(x); }, -8, 8);
  check_parity("sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, {t32({-200.0f, 200.0f, -90.0f}, {3})});
  specials_unary("sigmoid", [](const Tensor& x) { return sigmoid(x); });
  grad_unary("sigmoid", [](const Tensor& x) { return sigmoid(x); }, -4, 4);
}
PARITY_CASE("relu") {
  unary_case("relu", [](const Tensor& x) { return relu(x); });
  specials_unary("relu", [](const Tensor& x) { return relu(x); });  // relu(NaN) = 0 as on the CPU
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("relu", [](const Inputs& v) { return relu(v[0]); }, {x});
}
PARITY_CASE("gelu") {
  // Forward is UnaryOp::Gelu, backward UnaryOp::GeluGrad: both compared here.
  unary_case("gelu", [](const Tensor& x) { return gelu(x); }, -4, 4);
  specials_unary("gelu", [](const Tensor& x) { return gelu(x); });
  grad_unary("gelu", [](const Tensor& x) { return gelu(x); }, -3, 3);
}
PARITY_CASE("leaky_relu") {
  unary_case("leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); });
  specials_unary("leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); });
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("leaky_relu", [](const Inputs& v) { return leaky_relu(v[0], 0.2); }, {x});
}
PARITY_CASE("reciprocal") {
  unary_case("reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.2, 3);
  specials_unary("reciprocal", [](const Tensor& x) { return reciprocal(x); });
  grad_unary("reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.5, 2);
}
PARITY_CASE("log1p") {
  unary_case("log1p", [](const Tensor& x) { return log1p(x); }, -0.5, 3);
  grad_unary("log1p", [](const Tensor& x) { return log1p(x); }, 0, 2);
}
PARITY_CASE("expm1") {
  unary_case("expm1", [](const Tensor& x) { return expm1(x); });
  grad_unary("expm1", [](const Tensor& x) { return expm1(x); });
}
PARITY_CASE("erf") {
  unary_case("erf", [](const Tensor& x) { return erf(x); });
  grad_unary("erf", [](const Tensor& x) { return erf(x); });
}
PARITY_CASE("clamp") {
  unary_case("clamp", [](const Tensor& x) { return clamp(x, -1.0, 1.0); });
  specials_unary("clamp", [](const Tensor& x) { return clamp(x, -1.0, 2.0); });  // NaN stays NaN
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7}, {5}).set_requires_grad(true);
  check_grad_cuda("clamp", [](const Inputs& v) { return clamp(v[0], -1.0, 1.0); }, {x});
  check_grad_cuda("clamp", [](const Inputs& v) { return clamp(transpose(v[0], 0, 1), -0.5, 0.5); },
                  {leaf64({3, 2}, 5)});
}

// ---------------------------------------------------------------- comparisons and logic

void comparison_case(const char* op, const Fn2& f) {
  auto g = [f](const Inputs& x) { return f(x[0], x[1]); };
  check_parity(op, g, {ties32({6, 7}, 1), ties32({6, 7}, 2)});
  check_parity(op, g, {ties32({4, 1, 3}, 3), ties32({5, 1}, 4)});
  check_parity(op, [f](const Inputs& x) { return f(transpose(x[0], 0, 1), x[1]); }, {ties32({5, 4}, 5), ties32({1}, 6)});
  check_parity(op, g, {random_ints({4, 1, 3}, -2, 2, 7), random_ints({5, 1}, -2, 2, 8)});
  check_parity(op, g, {ties32({0, 3}, 9), ties32({3}, 10)});
  check_parity(op, g, {ties32({1 << 20}, 11), ties32({1 << 20}, 12)});
  check_parity(op, g, {specials32(), specials32_b()});
  check_parity(op, [f](const Inputs& x) { return f(to(x[0], kFloat64), to(x[1], kFloat64)); },
               {ties32({33}, 13), ties32({33}, 14)});
}

PARITY_CASE("eq") {
  comparison_case("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); });
  check_parity("eq", [](const Inputs& x) { return eq(x[0], x[1]); }, {bools({4, 1, 3}, 1), bools({5, 1}, 2)});
  check_parity("eq", [](const Inputs& x) { return eq(x[0], 0.0); }, {ties32({100}, 15)});
}
PARITY_CASE("ne") {
  comparison_case("ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); });
  check_parity("ne", [](const Inputs& x) { return ne(x[0], x[1]); }, {bools({40}, 3), bools({40}, 4)});
}
PARITY_CASE("lt") { comparison_case("lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }); }
PARITY_CASE("le") { comparison_case("le", [](const Tensor& a, const Tensor& b) { return le(a, b); }); }
PARITY_CASE("gt") { comparison_case("gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }); }
PARITY_CASE("ge") {
  comparison_case("ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); });
  check_parity("ge", [](const Inputs& x) { return ge(x[0], 0.0); }, {ties32({100}, 16)});
}
PARITY_CASE("logical_and") {
  auto g = [](const Inputs& x) { return logical_and(x[0], x[1]); };
  check_parity("logical_and", g, {bools({6, 7}, 1), bools({6, 7}, 2)});
  check_parity("logical_and", g, {bools({4, 1, 3}, 3), bools({5, 1}, 4)});
  check_parity("logical_and", [](const Inputs& x) { return logical_and(transpose(x[0], 0, 1), x[1]); },
               {bools({5, 4}, 5), bools({1}, 6)});
  check_parity("logical_and", g, {bools({1 << 20}, 7), bools({1 << 20}, 8)});
  check_parity("logical_and", g, {bools({0}, 9), bools({0}, 10)});
}
PARITY_CASE("logical_or") {
  auto g = [](const Inputs& x) { return logical_or(x[0], x[1]); };
  check_parity("logical_or", g, {bools({6, 7}, 1), bools({6, 7}, 2)});
  check_parity("logical_or", g, {bools({4, 1, 3}, 3), bools({5, 1}, 4)});
  check_parity("logical_or", [](const Inputs& x) { return logical_or(slice(x[0], 0, 1, 41, 2), x[1]); },
               {bools({41}, 5), bools({20}, 6)});
  check_parity("logical_or", g, {bools({1 << 20}, 7), bools({1}, 8)});
}
PARITY_CASE("logical_not") {
  auto g = [](const Inputs& x) { return logical_not(x[0]); };
  check_parity("logical_not", g, {bools({6, 7}, 1)});
  check_parity("logical_not", [](const Inputs& x) { return logical_not(transpose(x[0], 0, 1)); }, {bools({5, 4}, 2)});
  check_parity("logical_not", g, {bools({1 << 20}, 3)});
  check_parity("logical_not", g, {bools({0, 2}, 4)});
  check_parity("logical_not", [](const Inputs& x) { return logical_not(gt(x[0], 0.0)); }, {leaf32({100}, 5)});
}

// ---------------------------------------------------------------- copies, casts, moves

PARITY_CASE("to") {
  // dtype casts, differentiable between float dtypes, on contiguous and strided sources.
  check_parity("to", [](const Inputs& x) { return to(x[0], kFloat64); }, {leaf32({6, 7}, 1)});
  check_parity("to", [](const Inputs& x) { return to(to(transpose(x[0], 0, 1), kFloat64), kFloat32); },
               {leaf32({5, 4}, 2)});
  check_parity("to", [](const Inputs& x) { return to(x[0], kFloat64); }, {leaf32({1 << 20}, 3)});
  check_parity("to", [](const Inputs& x) { return to(x[0], kFloat32); }, {leaf32({0, 4}, 4)});
  // Non-float casts (forward only): float -> int64 truncates, -> bool is != 0 (NaN -> true).
  check_parity("to", [](const Inputs& x) { return to(mul(x[0], 50.0), kInt64); }, {leaf32({100}, 5)});
  check_parity("to", [](const Inputs& x) { return to(x[0], kBool); }, {specials32()});
  check_parity("to", [](const Inputs& x) { return to(x[0], kFloat32); }, {random_ints({4, 5}, -1000, 1000, 6)});
  check_parity("to", [](const Inputs& x) { return to(transpose(x[0], 0, 1), kInt64); }, {bools({5, 4}, 7)});
  check_parity("to", [](const Inputs& x) { return to(x[0], kFloat64); }, {bools({33}, 8)});
  check_parity("to", [](const Inputs& x) { return to(x[0], kBool); }, {random_ints({33}, -2, 2, 9)});
  check_grad_cuda("to", [](const Inputs& x) { return to(to(x[0], kFloat32), kFloat64); }, {leaf64({3})},
                  GradcheckOptions{1e-3, 1e-4, 1e-2});  // the float32 round trip limits precision
  // Device moves: cf::to(x, Device), x.cuda(), x.cpu(); the gradient moves back.
  check_grad_cuda("to", [](const Inputs& x) { return to(x[0], Device::cpu()); }, {leaf64({2, 3})});
  check_grad_cuda("to", [](const Inputs& x) { return to(transpose(x[0].cpu(), 0, 1), Device::cuda(0)); },
                  {leaf64({2, 3}, 2)});
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool}) {
    Tensor h = to(mul(leaf64({4, 5}, 9).detach(), 3.0), dt);
    Tensor d = h.cuda();
    CHECK(d.device() == Device::cuda(0));
    check_equal(d, h);
    Tensor back = d.cpu();
    CHECK(back.device() == Device::cpu());
    CHECK(values(back) == values(h));
    check_equal(cuda0(transpose(h, 0, 1)), contiguous(transpose(h, 0, 1)));  // strided source
  }
  {
    Tensor x = leaf32({4, 5}, 10), w = leaf32({4, 5}, 11).detach();
    sum(mul(to(x, Device::cuda(0)), w.cuda())).backward();  // CPU leaf, CUDA graph
    REQUIRE(x.grad().defined());
    CHECK(x.grad().device() == Device::cpu());
    CHECK(values(x.grad()) == values(w));
    Tensor xg = leaf_on(x, Device::cuda(0));
    sum(mul(xg.cpu(), w)).backward();  // CUDA leaf, CPU graph
    REQUIRE(xg.grad().defined());
    CHECK(xg.grad().device().is_cuda());
    CHECK(values(xg.grad()) == values(w));
  }
}
PARITY_CASE("clone") {
  check_parity("clone", [](const Inputs& x) { return clone(x[0]); }, {leaf32({6, 7}, 1)});
  check_parity("clone", [](const Inputs& x) { return clone(transpose(x[0], 0, 1)); }, {leaf32({5, 4}, 2)});
  check_parity("clone", [](const Inputs& x) { return clone(slice(x[0], 0, 1, 1001)); }, {leaf32({1001}, 3)});
  check_parity("clone", [](const Inputs& x) { return clone(transpose(x[0], 0, 1)); }, {leaf32({1024, 1024}, 4)});
  check_parity("clone", [](const Inputs& x) { return clone(x[0]); }, {leaf32({1 << 20}, 5)});
  check_parity("clone", [](const Inputs& x) { return clone(x[0]); }, {leaf32({0}, 6)});
  check_parity("clone", [](const Inputs& x) { return clone(permute(x[0], {2, 0, 1})); }, {random_ints({3, 4, 5}, -9, 9, 7)});
  check_parity("clone", [](const Inputs& x) { return clone(transpose(x[0], 0, 1)); }, {bools({7, 9}, 8)});
  check_grad_cuda("clone", [](const Inputs& x) { return clone(transpose(x[0], 0, 1)); }, {leaf64({2, 3})});
}

// ---------------------------------------------------------------- shape ops (copy_cuda)

PARITY_CASE("reshape") {
  check_parity("reshape", [](const Inputs& x) { return reshape(x[0], {5, 4}); }, {leaf32({4, 5}, 1)});
  check_parity("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {-1}); }, {leaf32({4, 5}, 2)});
  check_parity("reshape", [](const Inputs& x) { return reshape(slice(x[0], 1, 0, 8, 2), {3, 4}); }, {leaf32({3, 8}, 3)});
  check_parity("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {-1}); }, {leaf32({1024, 1024}, 4)});
  check_parity("reshape", [](const Inputs& x) { return reshape(x[0], {0, 6}); }, {leaf32({3, 0, 2}, 5)});
  check_grad_cuda("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {6}); }, {leaf64({2, 3})});
  check_grad_cuda("reshape", [](const Inputs& x) { return reshape(x[0], {3, 2}); }, {leaf64({2, 3}, 2)});
}
PARITY_CASE("permute") {
  check_parity("permute", [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }, {leaf32({3, 4, 5}, 1)});
  check_parity("permute", [](const Inputs& x) { return contiguous(permute(x[0], {1, 2, 0})); }, {leaf32({3, 4, 5}, 2)});
  check_parity("permute", [](const Inputs& x) { return contiguous(permute(x[0], {1, 0, 2})); }, {leaf32({64, 128, 128}, 3)});
  check_parity("permute", [](const Inputs& x) { return permute(x[0], {1, 0}); }, {leaf32({0, 3}, 4)});
  check_grad_cuda("permute", [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }, {leaf64({2, 3, 2})});
}
PARITY_CASE("slice") {
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf32({3, 6}, 1)});
  check_parity("slice", [](const Inputs& x) { return slice(transpose(x[0], 0, 1), 0, 1, 4); }, {leaf32({3, 6}, 2)});
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 0, 3, 1 << 20, 3); }, {leaf32({1 << 20}, 3)});
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 0, 2, 2); }, {leaf32({4}, 4)});
  check_grad_cuda("slice", [](const Inputs& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf64({2, 6})});
  check_grad_cuda("slice", [](const Inputs& x) { return narrow(x[0], 0, 1, 2); }, {leaf64({4, 2}, 2)});
}
PARITY_CASE("expand") {
  check_parity("expand", [](const Inputs& x) { return expand(x[0], {3, 2, 4}); }, {leaf32({2, 1}, 1)});
  check_parity("expand", [](const Inputs& x) { return contiguous(expand(x[0], {5, 4, 3})); }, {leaf32({4, 1}, 2)});
  check_parity("expand", [](const Inputs& x) { return contiguous(expand(x[0], {1024, 1024})); }, {leaf32({1, 1024}, 3)});
  check_parity("expand", [](const Inputs& x) { return expand(x[0], {0, 3}); }, {leaf32({1, 3}, 4)});
  check_grad_cuda("expand", [](const Inputs& x) { return expand(x[0], {3, 2, 4}); }, {leaf64({2, 1})});
}
PARITY_CASE("cat") {
  auto c1 = [](const Inputs& x) { return cat({x[0], x[1], x[2]}, 1); };
  check_parity("cat", c1, {leaf32({2, 3}, 1), leaf32({2, 1}, 2), leaf32({2, 2}, 3)});
  check_parity("cat", [](const Inputs& x) { return cat({transpose(x[0], 0, 1), x[1]}, 0); },
               {leaf32({3, 2}, 4), leaf32({1, 3}, 5)});
  check_parity("cat", c1, {leaf32({2, 0}, 6), leaf32({2, 1}, 7), leaf32({2, 2}, 8)});
  check_parity("cat", [](const Inputs& x) { return cat({x[0], x[1]}, 0); }, {leaf32({1 << 19}, 9), leaf32({1 << 19}, 10)});
  check_parity("cat", [](const Inputs& x) { return cat({x[0], x[1]}, 0); }, {random_ints({3, 2}, -9, 9, 11), random_ints({1, 2}, -9, 9, 12)});
  check_grad_cuda("cat", [](const Inputs& x) { return cat({x[0], x[1], x[2]}, 1); },
                  {leaf64({2, 3}, 1), leaf64({2, 1}, 2), leaf64({2, 2}, 3)});
  check_grad_cuda("cat", [](const Inputs& x) { return cat({transpose(x[0], 0, 1), x[1]}, 0); },
                  {leaf64({3, 2}, 4), leaf64({1, 3}, 5)});
}
PARITY_CASE("stack") {
  for (int64_t axis : {0, 1, 2}) {
    check_parity("stack", [axis](const Inputs& x) { return stack({x[0], transpose(x[1], 0, 1), x[2]}, axis); },
                 {leaf32({2, 3}, 1), leaf32({3, 2}, 2), leaf32({2, 3}, 3)});
    check_grad_cuda("stack", [axis](const Inputs& x) { return stack({x[0], x[1], x[2]}, axis); },
                    {leaf64({2, 3}, 1), leaf64({2, 3}, 2), leaf64({2, 3}, 3)});
  }
  check_parity("stack", [](const Inputs& x) { return stack({x[0], x[1]}, 1); }, {leaf32({1 << 19}, 4), leaf32({1 << 19}, 5)});
  check_parity("stack", [](const Inputs& x) { return stack({x[0], x[1]}, 0); }, {leaf32({0, 2}, 6), leaf32({0, 2}, 7)});
}
PARITY_CASE("pad") {
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }, {leaf32({2, 3}, 1)});
  check_parity("pad", [](const Inputs& x) { return pad(transpose(x[0], 0, 1), {-1, 1, 1, -1}); }, {leaf32({3, 4}, 2)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {3, 5}, -1.0); }, {leaf32({1024, 1024}, 3)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {1, 1}); }, {leaf32({0, 2}, 4)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {2, 0}, 7.0); }, {random_ints({3, 2}, -9, 9, 5)});
  check_grad_cuda("pad", [](const Inputs& x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }, {leaf64({2, 3}, 1)});
  check_grad_cuda("pad", [](const Inputs& x) { return pad(transpose(x[0], 0, 1), {-1, 1, 1, -1}); }, {leaf64({3, 4}, 2)});
}

// ---------------------------------------------------------------- random (same seed, same tensor)

PARITY_CASE("rand") {
  for (DType dt : {kFloat32, kFloat64})
    for (const Shape& s : {Shape{1 << 20}, Shape{3, 5}, Shape{0, 4}, Shape{}}) {
      Generator gc(42), gg(42);
      Tensor a = rand(s, dt, gc, -3.0, 5.0), b = rand(s, dt, gg, -3.0, 5.0, Device::cuda(0));
      check_equal(b, a);
      // A second draw continues the stream (counter offset > 0) identically.
      check_equal(rand(s, dt, gg, 0.0, 1.0, Device::cuda(0)), rand(s, dt, gc));
      CHECK(gg.offset() == gc.offset());
    }
}
PARITY_CASE("randn") {
  for (DType dt : {kFloat32, kFloat64}) {
    Generator gc(7), gg(7);
    Tensor a = randn({1 << 20}, dt, gc, 0.5, 2.0), b = randn({1 << 20}, dt, gg, 0.5, 2.0, Device::cuda(0));
    // Box-Muller through the device libm (log, cos, sqrt): equal to within its rounding.
    // float32 rounds the double result, so a 1-ulp double difference can flip one float ulp.
    ParityOptions o;
    o.atol = dt == kFloat64 ? 1e-12 : 1e-6;
    o.rtol = dt == kFloat64 ? 1e-12 : 1e-6;
    check_close_rel(b, a, o.atol, o.rtol, "randn");
    CHECK(b.device().is_cuda());
  }
  Generator gc(8), gg(8);
  check_close_rel(randn({0, 3}, kFloat64, gg, 0, 1, Device::cuda(0)), randn({0, 3}, kFloat64, gc), 0, 0, "randn empty");
}
PARITY_CASE("randint") {
  for (auto lh : {std::pair<int64_t, int64_t>{0, 10}, {-50, 3}, {-(int64_t(1) << 40), int64_t(1) << 41}, {5, 6}}) {
    Generator gc(3), gg(3);
    check_equal(randint(lh.first, lh.second, {1 << 20}, gg, Device::cuda(0)), randint(lh.first, lh.second, {1 << 20}, gc));
  }
  Generator gc(4), gg(4);
  check_equal(randint(0, 5, {0, 2}, gg, Device::cuda(0)), randint(0, 5, {0, 2}, gc));
}
PARITY_CASE("bernoulli") {
  for (double p : {0.0, 0.3, 0.5, 1.0}) {
    Generator gc(5), gg(5);
    check_equal(bernoulli({1 << 20}, p, gg, Device::cuda(0)), bernoulli({1 << 20}, p, gc));
    check_equal(bernoulli({3, 7}, p, gg, Device::cuda(0)), bernoulli({3, 7}, p, gc));
  }
  Generator gc(6), gg(6);
  check_equal(bernoulli({0}, 0.5, gg, Device::cuda(0)), bernoulli({0}, 0.5, gc));
}

// ---------------------------------------------------------------- dropout

PARITY_CASE("dropout") {
  // A fresh generator per call: both devices (and every gradcheck evaluation) draw the same mask.
  auto d = [](double p) {
    return [p](const Inputs& x) {
      Generator g(11);
      return dropout(x[0], p, true, g);
    };
  };
  check_parity("dropout", d(0.3), {leaf32({6, 7}, 1)});
  check_parity("dropout", d(0.5), {leaf32({1 << 20}, 2)});
  check_parity("dropout", [](const Inputs& x) {
    Generator g(12);
    return dropout(transpose(x[0], 0, 1), 0.25, true, g);
  }, {leaf32({5, 4}, 3)});
  check_parity("dropout", d(0.9), {leaf32({0, 5}, 4)});
  {
    // The same elements are zeroed on both devices, and the kept ones scale exactly.
    Generator gc(13), gg(13);
    Tensor x = leaf32({4096}, 5).detach();
    check_equal(dropout(cuda0(x), 0.4, true, gg), dropout(x, 0.4, true, gc));
    Tensor x64 = leaf64({4096}, 6).detach();
    check_equal(dropout(cuda0(x64), 0.4, true, gg), dropout(x64, 0.4, true, gc));
  }
  check_grad_cuda("dropout", d(0.3), {leaf64({3, 4}, 1)});
  check_grad_cuda("dropout", [](const Inputs& x) {
    Generator g(14);
    return dropout(transpose(x[0], 0, 1), 0.5, true, g);
  }, {leaf64({4, 3}, 2)});
}

// ---------------------------------------------------------------- fill, add_, errors

CUDA_TEST_CASE("fill and add_ match the CPU") {
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool}) {
    for (double v : {0.0, -0.0, 2.5, -3.0}) {
      Tensor h = Tensor::empty({1001}, dt), d = Tensor::empty({1001}, dt, Device::cuda(0));
      fill_(h, v);
      fill_(d, v);
      check_equal(d, h);
      // Strided and unaligned destinations.
      Tensor hs = Tensor::zeros({6, 8}, dt), ds = cuda0(hs);
      Tensor hv = slice(transpose(hs, 0, 1), 0, 1, 8, 2), dv = slice(transpose(ds, 0, 1), 0, 1, 8, 2);
      fill_(hv, v);
      fill_(dv, v);
      check_equal(ds, hs);
    }
  }
  for (DType dt : {kFloat32, kFloat64, kInt64}) {
    Tensor h = to(mul(leaf64({300, 7}, 1).detach(), 10.0), dt), o = to(mul(leaf64({7}, 2).detach(), 10.0), dt);
    Tensor d = cuda0(h);
    add_(h, o, -0.37);
    add_(d, cuda0(o), -0.37);
    check_equal(d, h);  // products and sums rounded separately on both devices: bit-identical
    Tensor big_h = to(leaf64({1 << 20}, 3).detach(), dt), big_o = to(leaf64({1 << 20}, 4).detach(), dt);
    Tensor big_d = cuda0(big_h);
    add_(big_h, big_o, 0.125);
    add_(big_d, cuda0(big_o), 0.125);
    check_equal(big_d, big_h);
    Tensor th = transpose(Tensor::zeros({7, 5}, dt), 0, 1), td = transpose(Tensor::zeros({7, 5}, dt, Device::cuda(0)), 0, 1);
    Tensor src = to(mul(leaf64({5, 7}, 5).detach(), 10.0), dt);
    add_(th, src, 2.0);
    add_(td, cuda0(src), 2.0);
    check_equal(td, th);
  }
  // copy_ between dtypes into a strided destination.
  Tensor hd = Tensor::zeros({4, 6}), dd = cuda0(hd);
  Tensor src = random_ints({6, 1}, -9, 9, 6);
  Tensor hv = transpose(hd, 0, 1), dv = transpose(dd, 0, 1);
  copy_(hv, src);
  copy_(dv, cuda0(src));
  check_equal(dd, hd);
}

CUDA_TEST_CASE("elementwise ops refuse mixed devices") {
  Tensor h = t32({1, 2, 3}, {3}), d = cuda0(h);
  CHECK_THROWS_MSG(add(h, d), DeviceError, "[add]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(mul(d, h), DeviceError, "[mul]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(maximum(d, h), DeviceError, "[maximum]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(eq(h, d), DeviceError, "[eq]", "cpu", "cuda:0");
  Tensor c = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK_THROWS_MSG(where(c, d, d), DeviceError, "[where]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(logical_and(c, cuda0(c)), DeviceError, "[logical_and]", "cpu", "cuda:0");
  Tensor dm = cuda0(h);
  {
    NoGradGuard ng;
    CHECK_THROWS_MSG(copy_(dm, h), DeviceError, "[copy_]", "cpu", "cuda:0");
    CHECK_THROWS_MSG(add_(dm, h), DeviceError, "[add_]", "cpu", "cuda:0");
  }
  // The same dtype errors as the CPU.
  CHECK_THROWS_MSG(exp(cuda0(ti64({1}, {1}))), DTypeError, "[exp]", "int64");
  CHECK_THROWS_MSG(add(cuda0(c), cuda0(c)), DTypeError, "[add]", "bool");
}

}
