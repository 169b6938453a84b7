#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/elementwise") {

TEST_CASE("binary ops broadcast and match naive loops") {
  Tensor a = t32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = t32({10, 20, 30}, {3});
  check_close(add(a, b), {11, 22, 33, 14, 25, 36});
  check_close(sub(a, b), {-9, -18, -27, -6, -15, -24});
  check_close(mul(a, b), {10, 40, 90, 40, 100, 180});
  check_close(div(b, a), {10, 10, 10, 2.5, 4, 5}, 1e-6);
  Tensor col = t32({1, 2}, {2, 1});
  check_close(add(col, b), {11, 21, 31, 12, 22, 32});
  check_close(maximum(a, t32({3}, {1})), {3, 3, 3, 4, 5, 6});
  check_close(pow(a, 2.0), {1, 4, 9, 16, 25, 36}, 1e-5);
  check_close(a * 2.0 + 1.0, {3, 5, 7, 9, 11, 13});
  check_close(1.0 - a, {0, -1, -2, -3, -4, -5});
}

TEST_CASE("binary ops on non-contiguous views") {
  Tensor a = t64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor at = transpose(a, 0, 1);  // (3,2)
  check_close(add(at, at), {2, 8, 4, 10, 6, 12});
  Tensor big = rand({300, 200}, kFloat32);
  Tensor s = add(transpose(big, 0, 1), 1.0);
  auto bv = big.to_vector<float>();
  auto sv = s.to_vector<float>();
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t j = 0; j < 300; ++j) REQUIRE(sv[size_t(i * 300 + j)] == bv[size_t(j * 200 + i)] + 1.0f);
}

TEST_CASE("comparisons give bool and are not differentiable") {
  Tensor a = leaf64({2, 3});
  Tensor m = gt(a, 0.0);
  CHECK(m.dtype() == kBool);
  CHECK_FALSE(m.requires_grad());
  CHECK_THROWS_MSG(m.backward(), AutogradError, "[backward]", "not differentiable");
}

TEST_CASE("elementwise bad input") {
  CHECK_THROWS_MSG(add(t32({1, 2, 3}, {3}), t32({1, 2}, {2})), ShapeError, "[add]", "(3)", "(2)");
  // floats of different widths promote (core/dtype.h promote_types); int64 never mixes with floats
  CHECK(mul(t32({1}, {1}), t64({1}, {1})).dtype() == kFloat64);
  CHECK_THROWS_MSG(mul(t32({1}, {1}), ti64({1}, {1})), DTypeError, "[mul]", "float32", "int64");
  CHECK_THROWS_MSG(add(t32({1}, {1}), fake_cuda({1})), DeviceError, "[add]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(exp(ti64({1}, {1})), DTypeError, "[exp]", "int64");
  CHECK_THROWS_MSG(div(ti64({1}, {1}), ti64({0}, {1})), ValueError, "[div]", "division by zero");
}

GRADCHECK_CASE("add") {
  check_grad("add", [](const std::vector<Tensor>& x) { return add(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({3}, 2)});
}
GRADCHECK_CASE("mul") {
  check_grad("mul", [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
}
GRADCHECK_CASE("div") {
  check_grad("div", [](const std::vector<Tensor>& x) { return div(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({3}, 2, 0.5, 2.0)});
}

}

TEST_SUITE("ops/elementwise") {

TEST_CASE("unary ops match std:: math") {
  std::vector<double> xs = {-2.0, -0.5, 0.25, 1.5};
  Tensor x = t64(xs, {4});
  Tensor xp = t64({0.1, 0.5, 2.0, 3.0}, {4});
  auto expect = [](const std::vector<double>& v, double (*f)(double)) {
    std::vector<double> r;
    for (double a : v) r.push_back(f(a));
    return r;
  };
  std::vector<double> pos = {0.1, 0.5, 2.0, 3.0};
  check_close(exp(x), expect(xs, [](double v) { return std::exp(v); }), 1e-12);
  check_close(log(xp), expect(pos, [](double v) { return std::log(v); }), 1e-12);
  check_close(sqrt(xp), expect(pos, [](double v) { return std::sqrt(v); }), 1e-12);
  check_close(rsqrt(xp), expect(pos, [](double v) { return 1 / std::sqrt(v); }), 1e-12);
  check_close(sin(x), expect(xs, [](double v) { return std::sin(v); }), 1e-12);
  check_close(cos(x), expect(xs, [](double v) { return std::cos(v); }), 1e-12);
  check_close(tanh(x), expect(xs, [](double v) { return std::tanh(v); }), 1e-12);
  check_close(sigmoid(x), expect(xs, [](double v) { return 1 / (1 + std::exp(-v)); }), 1e-12);
  check_close(relu(x), {0, 0, 0.25, 1.5});
  check_close(leaky_relu(x, 0.1), {-0.2, -0.05, 0.25, 1.5}, 1e-12);
  check_close(gelu(x), expect(xs, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }), 1e-12);
  check_close(abs(x), {2, 0.5, 0.25, 1.5});
  check_close(sign(x), {-1, -1, 1, 1});
  check_close(square(x), {4, 0.25, 0.0625, 2.25});
  check_close(neg(x), {2, 0.5, -0.25, -1.5});
  check_close(reciprocal(x), {-0.5, -2, 4, 1 / 1.5}, 1e-12);
  check_close(log1p(xp), expect(pos, [](double v) { return std::log1p(v); }), 1e-12);
  check_close(expm1(x), expect(xs, [](double v) { return std::expm1(v); }), 1e-12);
  check_close(erf(x), expect(xs, [](double v) { return std::erf(v); }), 1e-12);
  check_close(clamp(x, -1.0, 1.0), {-1, -0.5, 0.25, 1});
  check_close(sigmoid(t32({-200.0f, 200.0f}, {2})), {0, 1});
  check_close(abs(ti64({-3, 4}, {2})), {3, 4});
  check_close(neg(ti64({-3, 4}, {2})), {3, -4});
}

TEST_CASE("where, logic and comparisons") {
  Tensor c = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  check_close(where(c, t32({1, 2, 3}, {3}), t32({9}, {1})), {1, 9, 3});
  check_close(where(c, t32({1, 2, 3}, {3}), -1.0), {1, -1, 3});
  Tensor a = ti64({1, 2, 3}, {3}), b = ti64({3, 2, 1}, {3});
  check_close(eq(a, b), {0, 1, 0});
  check_close(ne(a, b), {1, 0, 1});
  check_close(lt(a, b), {1, 0, 0});
  check_close(le(a, b), {1, 1, 0});
  check_close(gt(a, b), {0, 0, 1});
  check_close(ge(a, 2.0), {0, 1, 1});
  check_close(logical_and(c, logical_not(c)), {0, 0, 0});
  check_close(logical_or(c, logical_not(c)), {1, 1, 1});
  check_close(eq(c, c), {1, 1, 1});
  CHECK_THROWS_MSG(where(t32({1}, {1}), t32({1}, {1}), t32({1}, {1})), DTypeError, "[where]", "cond", "bool");
  CHECK_THROWS_MSG(where(c, t32({1, 2}, {2}), t32({1}, {1})), ShapeError, "[where]", "(3)", "(2)");
  CHECK_THROWS_MSG(logical_and(t32({1}, {1}), t32({1}, {1})), DTypeError, "[logical_and]", "bool");
  CHECK_THROWS_MSG(add(c, c), DTypeError, "[add]", "bool");
  CHECK_THROWS_MSG(where(c, fake_cuda({3}), t32({1}, {1})), DeviceError, "[where]", "cuda:0");
  CHECK_THROWS_MSG(clamp(t32({1}, {1}), 2.0, 1.0), ValueError, "[clamp]", "low 2");
}

TEST_CASE("in-place ops and their bad input") {
  Tensor t = t32({1, 2, 3}, {3});
  mul_(t, 2.0);
  check_close(t, {2, 4, 6});
  add_(t, t32({1}, {1}));
  check_close(t, {3, 5, 7});
  copy_(t, ti64({1, 2, 3}, {3}));
  check_close(t, {1, 2, 3});
  zero_(t);
  check_close(t, {0, 0, 0});
  CHECK(t.version() == 4);
  Tensor u = t32({1, 2, 3}, {3});
  add_(u, t32({10, 20, 30}, {3}), -0.5);
  check_close(u, {-4, -8, -12});
  Tensor w = t64({1, 1, 1, 1}, {2, 2});
  add_(w, t64({1, 2}, {2}), 2.0);  // broadcast over rows
  check_close(w, {3, 5, 3, 5});
  Tensor big = Tensor::ones({100000});
  add_(big, Tensor::full({100000}, 2.0), 0.25);  // parallel path
  for (float v : big.to_vector<float>()) REQUIRE(v == 1.5f);
  Tensor flags = Tensor::from_vector(std::vector<bool>{true}, {1});
  CHECK_THROWS_MSG(add_(flags, flags), DTypeError, "[add_]", "bool");
  CHECK_THROWS_MSG(add_(t, t32({1, 2, 3, 4}, {4})), ShapeError, "[add_]", "(4)", "(3)");
  CHECK_THROWS_MSG(add_(t, t64({1}, {1})), DTypeError, "[add_]", "float64");
  CHECK_THROWS_MSG(copy_(t, t32({1, 2}, {2})), ShapeError, "[copy_]", "(2)", "(3)");
  CHECK_THROWS_MSG(exp(Tensor()), ValueError, "[exp]", "undefined");
}

GRADCHECK_CASE("exp") { check_grad("exp", [](auto& x) { return exp(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE("log") { check_grad("log", [](auto& x) { return log(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE("sqrt") { check_grad("sqrt", [](auto& x) { return sqrt(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE("rsqrt") { check_grad("rsqrt", [](auto& x) { return rsqrt(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE("sin") { check_grad("sin", [](auto& x) { return sin(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE("cos") { check_grad("cos", [](auto& x) { return cos(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE("tanh") { check_grad("tanh", [](auto& x) { return tanh(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE("sigmoid") { check_grad("sigmoid", [](auto& x) { return sigmoid(x[0]); }, {leaf64({2, 3}, 1, -4, 4)}); }
GRADCHECK_CASE("relu") {
  // Values kept away from the kink at 0.
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad("relu", [](auto& v) { return relu(v[0]); }, {x});
}
GRADCHECK_CASE("leaky_relu") {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad("leaky_relu", [](auto& v) { return leaky_relu(v[0], 0.2); }, {x});
}
GRADCHECK_CASE("gelu") { check_grad("gelu", [](auto& x) { return gelu(x[0]); }, {leaf64({2, 3}, 1, -3, 3)}); }
GRADCHECK_CASE("abs") {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9}, {4}).set_requires_grad(true);
  check_grad("abs", [](auto& v) { return abs(v[0]); }, {x});
}
GRADCHECK_CASE("neg") { check_grad("neg", [](auto& x) { return neg(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE("square") { check_grad("square", [](auto& x) { return square(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE("reciprocal") {
  check_grad("reciprocal", [](auto& x) { return reciprocal(x[0]); }, {leaf64({3}, 1, 0.5, 2)});
}
GRADCHECK_CASE("log1p") { check_grad("log1p", [](auto& x) { return log1p(x[0]); }, {leaf64({3}, 1, 0, 2)}); }
GRADCHECK_CASE("expm1") { check_grad("expm1", [](auto& x) { return expm1(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE("erf") { check_grad("erf", [](auto& x) { return erf(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE("clamp") {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7}, {5}).set_requires_grad(true);
  check_grad("clamp", [](auto& v) { return clamp(v[0], -1.0, 1.0); }, {x});
}
GRADCHECK_CASE("sub") {
  check_grad("sub", [](auto& x) { return sub(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
}
GRADCHECK_CASE("pow") {
  check_grad("pow", [](auto& x) { return pow(x[0], x[1]); }, {leaf64({2, 3}, 1, 0.5, 2), leaf64({3}, 2)});
  check_grad("pow", [](auto& x) { return pow(x[0], 2.5); }, {leaf64({2, 3}, 1, 0.5, 2)});
}
GRADCHECK_CASE("maximum") {
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {a, b});
}
GRADCHECK_CASE("minimum") {
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad("minimum", [](auto& x) { return minimum(x[0], x[1]); }, {a, b});
}
GRADCHECK_CASE("where") {
  Tensor c = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  check_grad("where", [c](auto& x) { return where(c, x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
}
GRADCHECK_CASE("to") {
  check_grad("to", [](auto& x) { return to(to(x[0], kFloat32), kFloat64); }, {leaf64({3})},
             GradcheckOptions{1e-3, 1e-4, 1e-2});  // the float32 round trip limits precision
}
GRADCHECK_CASE("clone") {
  check_grad("clone", [](auto& x) { return clone(transpose(x[0], 0, 1)); }, {leaf64({2, 3})});
}

}
