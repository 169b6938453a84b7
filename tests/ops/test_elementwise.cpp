#include "test_util.h"
#include "cuda/cuda_test_util.h"
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

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
  // ... except that a 0-d operand beside one with dims takes its dtype (PyTorch's rule; it widened before)
  Tensor s64 = Tensor::from_vector(std::vector<double>{0.1}, Shape{}).set_requires_grad(true);
  Tensor x32 = t32({1, 2}, {2});
  Tensor y = mul(x32, s64);
  CHECK(y.dtype() == kFloat32);
  CHECK(values(y) == std::vector<double>{double(0.1f), double(2 * 0.1f)});
  CHECK(add(s64, x32).dtype() == kFloat32);
  CHECK(where(gt(x32, 1.0), x32, s64).dtype() == kFloat32);
  CHECK(add(to(x32, kBFloat16), to(s64, kFloat32)).dtype() == kBFloat16);
  CHECK(add(s64, to(s64, kFloat32)).dtype() == kFloat64);  // two 0-d: the usual rule
  CHECK(add(x32, t64({1}, {1})).dtype() == kFloat64);      // (1) has dims
  sum(y).backward();
  CHECK(s64.grad().dtype() == kFloat64);  // the gradient comes back in the scalar's own dtype
  CHECK(s64.grad().item<double>() == doctest::Approx(3.0));
  CHECK_THROWS_MSG(mul(t32({1}, {1}), ti64({1}, {1})), DTypeError, "[mul]", "float32", "int64");
  CHECK_THROWS_MSG(add(t32({1}, {1}), fake_cuda({1})), DeviceError, "[add]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(exp(ti64({1}, {1})), DTypeError, "[exp]", "int64");
  CHECK_THROWS_MSG(div(ti64({1}, {1}), ti64({0}, {1})), ValueError, "[div]", "division by zero");
  // A number takes the tensor's dtype: one an int64 or bool tensor cannot hold is refused, where a cast
  // truncated it (i * 2.5 was i * 2, i.mul_(2.5) doubled, add_ with alpha 0.5 added nothing).
  Tensor i = ti64({1, 2, 3}, {3});
  CHECK_THROWS_MSG(mul(i, 2.5), DTypeError, "[mul] int64 (3) on cpu with the number 2.5", "float dtype first");
  CHECK_THROWS_MSG(2.5 * i, DTypeError, "[mul]", "2.5");
  CHECK_THROWS_MSG(add(i, 1e30), DTypeError, "[add]", "1e+30");
  CHECK_THROWS_MSG(div(i, 0.5), DTypeError, "[div]", "0.5");
  CHECK_THROWS_MSG(sub(i, std::nan("")), DTypeError, "[sub]", "nan");
  CHECK_THROWS_MSG(mul_(i, 2.5), DTypeError, "[mul_]", "2.5");
  CHECK_THROWS_MSG(add_(i, i, 0.5), DTypeError, "[add_]", "0.5");
  CHECK_THROWS_MSG(where(gt(i, 1.0), i, 2.5), DTypeError, "[where]", "2.5");
  CHECK(values(mul(i, 2.0)) == std::vector<double>{2, 4, 6});
  CHECK(values(i) == std::vector<double>{1, 2, 3});  // nothing written by the refused ones
  // ... while a comparison with such a number is exact (in float64), not with the truncated number
  CHECK(values(eq(i, 1.5)) == std::vector<double>{0, 0, 0});
  CHECK(values(lt(i, 1.5)) == std::vector<double>{1, 0, 0});
  CHECK(values(ge(i, 2.5)) == std::vector<double>{0, 0, 1});
  CHECK(values(ne(i, 1e30)) == std::vector<double>{1, 1, 1});
  CHECK(values(gt(i, 2.0)) == std::vector<double>{0, 0, 1});
}

// Each binary op broadcasts the second operand, the first, and both at once ((2, 1) with (1, 3)):
// its backward must sum each gradient back to its operand's shape.
GRADCHECK_CASE(add) {
  check_grad("add", [](const std::vector<Tensor>& x) { return add(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({3}, 2)});
  check_grad("add", [](const std::vector<Tensor>& x) { return add(x[0], x[1]); },
             {leaf64({3}, 1), leaf64({2, 3}, 2)});
  check_grad("add", [](const std::vector<Tensor>& x) { return add(x[0], x[1]); },
             {leaf64({2, 1}, 1), leaf64({1, 3}, 2)});
}
GRADCHECK_CASE(mul) {
  check_grad("mul", [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
  check_grad("mul", [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); },
             {leaf64({3}, 1), leaf64({2, 3}, 2)});
  check_grad("mul", [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); },
             {leaf64({2, 1}, 1), leaf64({1, 3}, 2)});
}
GRADCHECK_CASE(remainder) {
  // away from the jumps of floor(a / b): d/da 1, d/db -floor(a / b), broadcast both ways
  const Tensor a = t64({0.3, 1.7, -2.2, 5.1, -4.4, 0.05}, {2, 3}).set_requires_grad(true);
  const Tensor b = t64({0.7, -0.9, 1.3}, {3}).set_requires_grad(true);
  check_grad("remainder", [](const std::vector<Tensor>& x) { return remainder(x[0], x[1]); }, {a, b});
  check_grad("remainder", [](const std::vector<Tensor>& x) { return remainder(x[1], x[0]); }, {b, a});
}

GRADCHECK_CASE(div) {
  check_grad("div", [](const std::vector<Tensor>& x) { return div(x[0], x[1]); },
             {leaf64({2, 3}, 1), leaf64({3}, 2, 0.5, 2.0)});
  check_grad("div", [](const std::vector<Tensor>& x) { return div(x[0], x[1]); },
             {leaf64({3}, 1), leaf64({2, 3}, 2, 0.5, 2.0)});
  check_grad("div", [](const std::vector<Tensor>& x) { return div(x[0], x[1]); },
             {leaf64({2, 1}, 1), leaf64({1, 3}, 2, 0.5, 2.0)});
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

TEST_CASE("floor, ceil, round (halves to even) and trunc against the C library, every dtype") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = {-2.5, -1.5, -0.5, -0.4, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 2.7, -2.7, 1e15 + 0.5,
                                 4503599627370497.0, inf, -inf, nan};
  struct Op {
    const char* name;
    Tensor (*fn)(const Tensor&);
    double (*ref)(double);
  };
  const Op ops[] = {{"floor", floor, [](double x) { return std::floor(x); }},
                    {"ceil", ceil, [](double x) { return std::ceil(x); }},
                    {"round", round, [](double x) { return std::nearbyint(x); }},
                    {"trunc", trunc, [](double x) { return std::trunc(x); }}};
  for (const Op& op : ops) {
    CAPTURE(op.name);
    for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
      CAPTURE(dt);
      const Tensor x = to(t64(v, {int64_t(v.size())}), dt);
      const std::vector<double> xs = values(x);  // v as dt holds it
      std::vector<double> want;
      for (double e : xs) want.push_back(op.ref(e));
      const Tensor out = op.fn(x);
      CHECK(out.dtype() == dt);
      check_close(out, want, 0.0);
      const std::vector<double> got = values(out);
      for (size_t i = 0; i < got.size(); ++i)  // the sign of zero too: round(-0.4) is -0.0
        if (want[i] == 0.0) CHECK(std::signbit(got[i]) == std::signbit(want[i]));
      check_close(op.fn(transpose(to(t64({0.5, 1.5, -0.5, -1.5, 2.2, -2.2}, {3, 2}), dt), 0, 1)),
                  values(op.fn(contiguous(transpose(to(t64({0.5, 1.5, -0.5, -1.5, 2.2, -2.2}, {3, 2}), dt), 0, 1)))),
                  0.0);
    }
    const Tensor big = ti64({-9007199254740993, 3, 0}, {3});  // int64 as it is
    CHECK(op.fn(big).to_vector<int64_t>() == big.to_vector<int64_t>());
    Tensor leaf = t64({1.5}, {1}).set_requires_grad(true);
    CHECK(!op.fn(leaf).requires_grad());  // no graph, as sign
    const std::string tag = std::string("[") + op.name + "]";
    CHECK_THROWS_MSG(op.fn(Tensor::from_vector(std::vector<bool>{true}, {1})), DTypeError, tag.c_str(), "bool");
    CHECK_THROWS_MSG(op.fn(Tensor()), Error, tag.c_str());
  }
  check_close(round(t32({0.5f, 1.5f, 2.5f, 3.5f, -2.5f}, {5})), {0, 2, 2, 4, -2}, 0.0);  // halves to even
}

TEST_CASE("floor_divide and remainder are Python's // and %: int64 exactly, floats from fmod") {
  // int64: rounded down, the remainder with the divisor's sign; INT64_MIN // -1 wraps (NumPy's answer)
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const Tensor a = ti64({7, -7, 7, -7, 0, 6, lo, lo, 5}, {9}), b = ti64({2, 2, -2, -2, 3, -4, -1, 3, 1}, {9});
  CHECK(floor_divide(a, b).to_vector<int64_t>() == std::vector<int64_t>{3, -4, -4, 3, 0, -2, lo, -3074457345618258603, 5});
  CHECK(remainder(a, b).to_vector<int64_t>() == std::vector<int64_t>{1, 1, -1, -1, 0, -2, 0, 1, 0});
  CHECK_THROWS_MSG(floor_divide(a, ti64({1, 0, 1, 1, 1, 1, 1, 1, 1}, {9})), ValueError, "[floor_divide]",
                   "integer division by zero");
  CHECK_THROWS_MSG(remainder(a, ti64({0}, {1})), ValueError, "[remainder]", "integer division by zero");
  // floats: where floor(a / b) rounds onto the wrong integer, the fmod form does not (Python's values)
  const double inf = std::numeric_limits<double>::infinity();
  check_close(floor_divide(t64({5.3, 1.0, -1.0, inf, 5.0, -5.0}, {6}), t64({0.1, 0.1, inf, 2.0, 0.0, 0.0}, {6})),
              {52.0, 9.0, -1.0, std::nan(""), inf, -inf}, 0.0);
  check_close(remainder(t64({5.3, 5.0, -1.0, 0.0, -7.5, 7.5}, {6}), t64({0.1, inf, inf, inf, 2.5, -2.0}, {6})),
              {0.09999999999999953, 5.0, inf, 0.0, 0.0, -0.5}, 0.0);
  CHECK(std::isnan(values(remainder(t64({5.0}, {1}), t64({0.0}, {1})))[0]));
  // a large quotient: floor(a / b) * b cancelled to 0 there
  check_close(remainder(t32({1e8f}, {1}), t32({7.0f}, {1})), {2.0}, 0.0);
  check_close(remainder(t64({1152921504606847232.0}, {1}), t64({10.0}, {1})), {2.0}, 0.0);
  check_close(remainder(to(t32({1000.0f}, {1}), kBFloat16), to(t32({7.0f}, {1}), kBFloat16)), {6.0}, 0.0);
  check_close(floor_divide(to(t32({1000.0f}, {1}), kBFloat16), to(t32({7.0f}, {1}), kBFloat16)), {142.0}, 0.0);
  // the sign of a zero quotient follows a / b, as Python's
  CHECK(std::signbit(values(floor_divide(t64({-0.5}, {1}), t64({3.0}, {1})))[0]) == true);
  // broadcasting, mixed float dtypes (promotion as the other binary ops), no graph for floor_divide
  Tensor leaf = t64({7.5, -7.5}, {2}).set_requires_grad(true);
  CHECK(!floor_divide(leaf, t64({2.0}, {1})).requires_grad());
  CHECK(remainder(leaf, t64({2.0}, {1})).requires_grad());
  CHECK(remainder(t32({7.5f, -7.5f}, {2}), t64({2.0}, {1})).dtype() == kFloat64);
  CHECK_THROWS_MSG(floor_divide(Tensor::from_vector(std::vector<bool>{true}, {1}),
                                Tensor::from_vector(std::vector<bool>{true}, {1})),
                   DTypeError, "[floor_divide]", "bool");
  CHECK_THROWS_MSG(remainder(t64({1.0}, {1}), ti64({1}, {1})), DTypeError, "[remainder]");
  CHECK_THROWS_MSG(remainder(t64({1.0, 2.0}, {2}), t64({1.0, 2.0, 3.0}, {3})), ShapeError, "[remainder]");
}

TEST_CASE("NaN propagates through relu, maximum and minimum from either operand - PyTorch's rules") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    CAPTURE(dt);
    Tensor x = to(t64({nan, -1.0, 2.0}, {3}), dt);
    std::vector<double> r = to(relu(x), kFloat64).to_vector<double>();
    CHECK(std::isnan(r[0]));
    CHECK(r[1] == 0.0);
    CHECK(r[2] == 2.0);
    Tensor y = to(t64({1.0, nan, nan}, {3}), dt);
    Tensor zero = Tensor::zeros({3}, dt);
    for (const Tensor& m : {maximum(x, zero), maximum(zero, x), minimum(x, zero), minimum(zero, x)}) {
      std::vector<double> v = to(m, kFloat64).to_vector<double>();
      CHECK(std::isnan(v[0]));
      CHECK(!std::isnan(v[1]));
    }
    for (const Tensor& m : {maximum(x, y), maximum(y, x), minimum(x, y), minimum(y, x)}) {
      std::vector<double> v = to(m, kFloat64).to_vector<double>();
      CHECK((std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[2])));
    }
  }
  // The gradient of a NaN element goes to the operand that gave it (a on a NaN in
  // both), and through relu as for a positive input.
  Tensor a = t64({nan, 1.0, 3.0}, {3}).set_requires_grad(true);
  Tensor b = t64({0.0, nan, 2.0}, {3}).set_requires_grad(true);
  sum(maximum(a, b)).backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{1, 0, 1});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{0, 1, 0});
  Tensor c = t64({nan, -1.0, 2.0}, {3}).set_requires_grad(true);
  sum(relu(c)).backward();
  CHECK(c.grad().to_vector<double>() == std::vector<double>{1, 0, 1});
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
  // bools order false before true, as PyTorch's (b < True ran only as b < 1.5 through a float number)
  Tensor tf = Tensor::from_vector(std::vector<bool>{true, false}, {2, 1}), ft = logical_not(tf);
  check_close(lt(tf, reshape(ft, {1, 2})), {0, 0, 0, 1});
  check_close(le(tf, reshape(ft, {1, 2})), {0, 1, 1, 1});
  check_close(gt(c, logical_not(c)), {1, 0, 1});
  check_close(ge(transpose(tf, 0, 1), reshape(tf, {1, 2})), {1, 1});
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

TEST_CASE("in-place writes from memory they overlap read it as it was - an expand()ed destination is refused") {
  // NumPy's results: the source is read before any of it is overwritten (the kernels would otherwise
  // read values they already wrote: before, t[1:] += t[:4] gave 0 1 3 6 10)
  Tensor a = t32({0, 1, 2, 3, 4}, {5});
  Tensor tail = narrow(a, 0, 1, 4);
  add_(tail, narrow(a, 0, 0, 4));
  check_close(a, {0, 1, 3, 5, 7});
  Tensor m = t32({0, 1, 2, 3}, {2, 2});
  add_(m, transpose(m, 0, 1));  // t += t.T
  check_close(m, {0, 3, 3, 6});
  Tensor c = t32({0, 1, 2, 3}, {2, 2});
  copy_(c, transpose(c, 0, 1));
  check_close(c, {0, 2, 1, 3});
  Tensor r = t64({1, 2, 3, 4}, {2, 2});
  add_(r, narrow(r, 0, 0, 1));  // every row plus the first, broadcast
  check_close(r, {2, 4, 4, 6});
  Tensor s = t32({0, 1, 2, 3, 4}, {5});
  Tensor right = narrow(s, 0, 1, 4);
  copy_(right, narrow(s, 0, 0, 4));  // t[1:] = t[:4]
  check_close(s, {0, 0, 1, 2, 3});
  Tensor same = t32({1, 2}, {2});
  add_(same, same);  // the very same view: no copy needed, and right
  check_close(same, {2, 4});
  Tensor z = Tensor::zeros({3});
  Tensor first = expand(narrow(z, 0, 0, 1), {3});
  CHECK_THROWS_MSG(add_(first, Tensor::ones({3})), ValueError, "[add_]", "share memory", "stride 0 along axis 0");
  CHECK_THROWS_MSG(mul_(first, 2.0), ValueError, "[mul_]", "expand()");
  CHECK_THROWS_MSG(copy_(first, t32({1, 2, 3}, {3})), ValueError, "[copy_]", "share memory");
  check_close(z, {0, 0, 0});  // refused before any write
  fill_(first, 5.0);  // one value into every element: harmless
  check_close(z, {5, 0, 0});
}

GRADCHECK_CASE(exp) { check_grad("exp", [](auto& x) { return exp(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE(log) { check_grad("log", [](auto& x) { return log(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE(sqrt) { check_grad("sqrt", [](auto& x) { return sqrt(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE(rsqrt) { check_grad("rsqrt", [](auto& x) { return rsqrt(x[0]); }, {leaf64({2, 3}, 1, 0.5, 2)}); }
GRADCHECK_CASE(sin) { check_grad("sin", [](auto& x) { return sin(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE(cos) { check_grad("cos", [](auto& x) { return cos(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE(tanh) { check_grad("tanh", [](auto& x) { return tanh(x[0]); }, {leaf64({2, 3})}); }
GRADCHECK_CASE(sigmoid) { check_grad("sigmoid", [](auto& x) { return sigmoid(x[0]); }, {leaf64({2, 3}, 1, -4, 4)}); }
GRADCHECK_CASE(relu) {
  // Values kept away from the kink at 0.
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad("relu", [](auto& v) { return relu(v[0]); }, {x});
}
GRADCHECK_CASE(leaky_relu) {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad("leaky_relu", [](auto& v) { return leaky_relu(v[0], 0.2); }, {x});
}
GRADCHECK_CASE(gelu) { check_grad("gelu", [](auto& x) { return gelu(x[0]); }, {leaf64({2, 3}, 1, -3, 3)}); }
GRADCHECK_CASE(abs) {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9}, {4}).set_requires_grad(true);
  check_grad("abs", [](auto& v) { return abs(v[0]); }, {x});
}
GRADCHECK_CASE(neg) { check_grad("neg", [](auto& x) { return neg(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE(square) { check_grad("square", [](auto& x) { return square(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE(reciprocal) {
  check_grad("reciprocal", [](auto& x) { return reciprocal(x[0]); }, {leaf64({3}, 1, 0.5, 2)});
}
GRADCHECK_CASE(log1p) { check_grad("log1p", [](auto& x) { return log1p(x[0]); }, {leaf64({3}, 1, 0, 2)}); }
GRADCHECK_CASE(expm1) { check_grad("expm1", [](auto& x) { return expm1(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE(erf) { check_grad("erf", [](auto& x) { return erf(x[0]); }, {leaf64({3})}); }
GRADCHECK_CASE(clamp) {
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7}, {5}).set_requires_grad(true);
  check_grad("clamp", [](auto& v) { return clamp(v[0], -1.0, 1.0); }, {x});
  // At a bound the gradient passes (PyTorch's rule: min <= x <= max); an infinite bound is no bound;
  // low == high clamps everything to it and passes the gradient only where x equals it.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor b = t64({-1.0, 1.0, -1.5, 1.5}, {4}).set_requires_grad(true);
  sum(clamp(b, -1.0, 1.0)).backward();
  CHECK(b.grad().to_vector<double>() == std::vector<double>{1, 1, 0, 0});
  Tensor c = t64({-3.0, 0.0, 1e300}, {3}).set_requires_grad(true);
  Tensor yc = clamp(c, 0.0, inf);
  CHECK(yc.to_vector<double>() == std::vector<double>{0, 0, 1e300});
  sum(yc).backward();
  CHECK(c.grad().to_vector<double>() == std::vector<double>{0, 1, 1});
  Tensor d = t64({-1.0, 2.0, 3.0}, {3}).set_requires_grad(true);
  Tensor yd = clamp(d, 2.0, 2.0);
  CHECK(yd.to_vector<double>() == std::vector<double>{2, 2, 2});
  sum(yd).backward();
  CHECK(d.grad().to_vector<double>() == std::vector<double>{0, 1, 0});
}
GRADCHECK_CASE(sub) {
  check_grad("sub", [](auto& x) { return sub(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
  check_grad("sub", [](auto& x) { return sub(x[0], x[1]); }, {leaf64({1, 3}, 1), leaf64({2, 1}, 2)});
}
GRADCHECK_CASE(pow) {
  check_grad("pow", [](auto& x) { return pow(x[0], x[1]); }, {leaf64({2, 3}, 1, 0.5, 2), leaf64({3}, 2)});
  check_grad("pow", [](auto& x) { return pow(x[0], 2.5); }, {leaf64({2, 3}, 1, 0.5, 2)});
  check_grad("pow", [](auto& x) { return pow(x[0], x[1]); }, {leaf64({2, 1}, 1, 0.5, 2), leaf64({1, 3}, 2)});
  // At a zero base the gradients are PyTorch's limits, not NaN (one NaN poisons every later
  // gradient): d(a^b)/da is 0 where b = 0; d(a^b)/db is 0 where a = 0 and b >= 0; d(x^0)/dx is 0.
  Tensor a = t64({0.0, 0.0, 0.0, 2.0}, {4}).set_requires_grad(true);
  Tensor b = t64({2.0, 0.5, 0.0, 0.0}, {4}).set_requires_grad(true);
  sum(pow(a, b)).backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{0.0, std::numeric_limits<double>::infinity(), 0.0, 0.0});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{0.0, 0.0, 0.0, std::log(2.0)});
  Tensor x = t64({0.0, 2.0}, {2}).set_requires_grad(true);
  sum(pow(x, 0.0)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0.0, 0.0});
  // A NaN arriving in the gradient stays NaN through the masked factor (PyTorch masks the factor too).
  Tensor a2 = t64({0.0}, {1}).set_requires_grad(true), b2 = t64({1.0}, {1}).set_requires_grad(true);
  sum(mul(pow(a2, b2), std::numeric_limits<double>::quiet_NaN())).backward();
  CHECK(std::isnan(b2.grad().to_vector<double>()[0]));
  Tensor e = t64({1.0, 2.0}, {2}).set_requires_grad(true);  // 0 ** e from Python
  sum(pow(Tensor::zeros({2}, kFloat64), e)).backward();
  CHECK(e.grad().to_vector<double>() == std::vector<double>{0.0, 0.0});
}
GRADCHECK_CASE(maximum) {
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {a, b});
  // broadcast (random values: no ties, so away from the kink)
  check_grad("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
  check_grad("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {leaf64({2, 1}, 3), leaf64({1, 3}, 4)});
}
GRADCHECK_CASE(minimum) {
  Tensor a = t64({1, 5, 3, -2}, {4}).set_requires_grad(true);
  Tensor b = t64({2, 4, 0, -1}, {4}).set_requires_grad(true);
  check_grad("minimum", [](auto& x) { return minimum(x[0], x[1]); }, {a, b});
  check_grad("minimum", [](auto& x) { return minimum(x[0], x[1]); }, {leaf64({3}, 1), leaf64({2, 3}, 2)});
  check_grad("minimum", [](auto& x) { return minimum(x[0], x[1]); }, {leaf64({2, 1}, 3), leaf64({1, 3}, 4)});
}
GRADCHECK_CASE(where) {
  Tensor c = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  check_grad("where", [c](auto& x) { return where(c, x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
  const Tensor c2 = Tensor::from_vector(std::vector<bool>{true, false}, {2, 1});
  check_grad("where", [c2](auto& x) { return where(c2, x[0], x[1]); }, {leaf64({1, 3}, 1), leaf64({2, 1}, 2)});
}
GRADCHECK_CASE(to) {
  check_grad("to", [](auto& x) { return to(to(x[0], kFloat32), kFloat64); }, {leaf64({3})},
             GradcheckOptions{1e-3, 1e-4, 1e-2});  // the float32 round trip limits precision
  // The finite differences above see the cast's rounding; its gradient itself is exact: the incoming
  // gradient cast back, bit for bit, whenever it is representable in the narrow dtype.
  for (DType dt : {kFloat32, kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    Tensor x = t64({0.3, -1.7, 2.2, 5.0}, {4}).set_requires_grad(true);
    const std::vector<double> w = {0.25, -1.5, 3.0, -0.0078125};
    sum(mul(to(to(x, dt), kFloat64), t64(w, {4}))).backward();
    CHECK(x.grad().to_vector<double>() == w);
  }
}
GRADCHECK_CASE(clone) {
  check_grad("clone", [](auto& x) { return clone(transpose(x[0], 0, 1)); }, {leaf64({2, 3})});
}

}

// ---------------------------------------------------------------- CUDA parity
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

TEST_SUITE("ops/elementwise") {

// ---------------------------------------------------------------- binary arithmetic

PARITY_CASE(add) {
  binary_case("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  check_parity("add", [](const Inputs& x) { return add(x[0], 1.5) + 2.0; }, {leaf32({1000}, 1)});
  check_parity("add", [](const Inputs& x) { return add(x[0], x[1]); }, {random_ints({4, 1, 3}, -9, 9, 1), random_ints({5, 1}, -9, 9, 2)});
  specials_binary("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  check_grad_cuda("add", [](const Inputs& x) { return add(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({3}, 2)});
}
PARITY_CASE(sub) {
  binary_case("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
  check_parity("sub", [](const Inputs& x) { return 1.0 - x[0]; }, {leaf32({1000}, 2)});
  check_parity("sub", [](const Inputs& x) { return sub(x[0], x[1]); }, {random_ints({7}, -9, 9, 3), random_ints({7}, -9, 9, 4)});
  check_grad_cuda("sub", [](const Inputs& x) { return sub(x[0], x[1]); }, {leaf64({2, 3}, 1), leaf64({2, 1}, 2)});
}
PARITY_CASE(mul) {
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
PARITY_CASE(floor_divide) {
  ParityOptions fwd;
  fwd.backward = false;  // no graph (a step function)
  binary_case("floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); }, -20, 20, 0.1, 3, fwd);
  binary_case("floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); }, -20, 20, -3, -0.1, fwd);
  check_parity("floor_divide", [](const Inputs& x) { return floor_divide(x[0], x[1]); },
               {ti64({7, -7, 7, -7, 0, 9, -1}, {7}), ti64({2, 2, -2, -2, 3, 10, 3}, {7})});
  specials_binary("floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); });
  Tensor a = ti64({1, 2, 3}, {3}), z = ti64({1, 0, 2}, {3});
  CHECK(error_of([&] { floor_divide(cuda0(a), cuda0(z)).cpu(); }) == error_of([&] { floor_divide(a, z); }));
}
PARITY_CASE(remainder) {
  binary_case("remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, -20, 20, 0.1, 3);
  binary_case("remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, -20, 20, -3, -0.1);
  check_parity("remainder", [](const Inputs& x) { return remainder(x[0], x[1]); },
               {ti64({7, -7, 7, -7, 0, 9, -1}, {7}), ti64({2, 2, -2, -2, 3, 10, 3}, {7})});
  specials_binary("remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); });
  check_grad_cuda("remainder", [](const Inputs& x) { return remainder(x[0], x[1]); },
                  {t64({0.3, 1.7, -2.2, 5.1, -4.4, 0.05}, {2, 3}).set_requires_grad(true),
                   t64({0.7, -0.9, 1.3}, {3}).set_requires_grad(true)});
  Tensor a = ti64({1, 2, 3}, {3}), z = ti64({1, 0, 2}, {3});
  CHECK(error_of([&] { remainder(cuda0(a), cuda0(z)).cpu(); }) == error_of([&] { remainder(a, z); }));
}
PARITY_CASE(div) {
  binary_case("div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, -2, 2, 0.5, 2);
  check_parity("div", [](const Inputs& x) { return div(x[0], 4.0); }, {leaf32({1000}, 3)});
  // int64: C++ truncation toward zero for every sign combination.
  check_parity("div", [](const Inputs& x) { return div(x[0], x[1]); },
               {ti64({7, -7, 7, -7, 0, 9, -1}, {7}), ti64({2, 2, -2, -2, 3, 10, 3}, {7})});
  specials_binary("div", [](const Tensor& a, const Tensor& b) { return div(a, b); });
  // A zero int64 divisor: the CPU's ValueError, same message, on CUDA at the next
  // host read (a deferred check, core/cuda.h).
  Tensor a = ti64({1, 2, 3}, {3}), z = ti64({1, 0, 2}, {3});
  const std::string cpu = error_of([&] { div(a, z); });
  const std::string gpu = error_of([&] { div(cuda0(a), cuda0(z)).cpu(); });
  CHECK(!cpu.empty());
  CHECK(gpu == cpu);
  CHECK_THROWS_MSG(div(cuda0(a), cuda0(z)).cpu(), ValueError, "[div]", "division by zero");
  CHECK(div(cuda0(a), cuda0(a)).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});  // nothing left pending
  check_grad_cuda("div", [](const Inputs& x) { return div(x[0], x[1]); },
                  {leaf64({2, 3}, 1), leaf64({3}, 2, 0.5, 2.0)});
}
PARITY_CASE(pow) {
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
PARITY_CASE(maximum) {
  binary_case("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  // NaN propagates from either operand, ties send the gradient to a: forward on specials,
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
PARITY_CASE(minimum) {
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

PARITY_CASE(where) {
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

PARITY_CASE(neg) {
  unary_case("neg", [](const Tensor& x) { return neg(x); });
  check_parity("neg", [](const Inputs& x) { return -x[0]; }, {random_ints({4, 5}, -100, 100, 1)});
  specials_unary("neg", [](const Tensor& x) { return neg(x); });
  grad_unary("neg", [](const Tensor& x) { return neg(x); });
}
PARITY_CASE(abs) {
  unary_case("abs", [](const Tensor& x) { return abs(x); });
  check_parity("abs", [](const Inputs& x) { return abs(transpose(x[0], 0, 1)); }, {random_ints({4, 5}, -100, 100, 2)});
  specials_unary("abs", [](const Tensor& x) { return abs(x); });
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9}, {4}).set_requires_grad(true);
  check_grad_cuda("abs", [](const Inputs& v) { return abs(v[0]); }, {x});
}
PARITY_CASE(square) {
  unary_case("square", [](const Tensor& x) { return square(x); });
  check_parity("square", [](const Inputs& x) { return square(x[0]); }, {random_ints({4, 5}, -1000, 1000, 3)});
  grad_unary("square", [](const Tensor& x) { return square(x); });
}
PARITY_CASE(sign) {
  ParityOptions fwd;
  fwd.backward = false;  // sign records no graph (zero gradient almost everywhere)
  unary_case("sign", [](const Tensor& x) { return sign(x); }, -2, 2, fwd);
  check_parity("sign", [](const Inputs& x) { return sign(x[0]); }, {random_ints({4, 5}, -2, 2, 4)});
  specials_unary("sign", [](const Tensor& x) { return sign(x); });
}
// floor, ceil, round and trunc record no graph (zero gradient almost everywhere), as sign
void rounding_case(const char* op, Tensor (*f)(const Tensor&), uint32_t seed) {
  ParityOptions fwd;
  fwd.backward = false;
  unary_case(op, f, -4, 4, fwd);
  // exact halves (k / 2): the device rounds them as the CPU (round: to even)
  check_parity(op, [f](const Inputs& x) { return f(x[0] * 0.5); }, {to(random_ints({64}, -40, 40, seed), kFloat32)});
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {random_ints({4, 5}, -9, 9, seed)});  // int64 as it is
  specials_unary(op, f);
}
PARITY_CASE(floor) { rounding_case("floor", floor, 5); }
PARITY_CASE(ceil) { rounding_case("ceil", ceil, 6); }
PARITY_CASE(round) { rounding_case("round", round, 7); }
PARITY_CASE(trunc) { rounding_case("trunc", trunc, 8); }
PARITY_CASE(exp) {
  unary_case("exp", [](const Tensor& x) { return exp(x); });
  specials_unary("exp", [](const Tensor& x) { return exp(x); });
  grad_unary("exp", [](const Tensor& x) { return exp(x); });
}
PARITY_CASE(log) {
  unary_case("log", [](const Tensor& x) { return log(x); }, 0.1, 3);
  specials_unary("log", [](const Tensor& x) { return log(x); });
  grad_unary("log", [](const Tensor& x) { return log(x); }, 0.5, 2);
}
PARITY_CASE(sqrt) {
  unary_case("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 3);
  specials_unary("sqrt", [](const Tensor& x) { return sqrt(x); });
  grad_unary("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.5, 2);
}
PARITY_CASE(rsqrt) {
  unary_case("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 3);
  grad_unary("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.5, 2);
}
PARITY_CASE(sin) {
  unary_case("sin", [](const Tensor& x) { return sin(x); });
  grad_unary("sin", [](const Tensor& x) { return sin(x); });
}
PARITY_CASE(cos) {
  unary_case("cos", [](const Tensor& x) { return cos(x); });
  grad_unary("cos", [](const Tensor& x) { return cos(x); });
}
PARITY_CASE(tanh) {
  unary_case("tanh", [](const Tensor& x) { return tanh(x); });
  specials_unary("tanh", [](const Tensor& x) { return tanh(x); });
  grad_unary("tanh", [](const Tensor& x) { return tanh(x); });
}
PARITY_CASE(sigmoid) {
  unary_case("sigmoid", [](const Tensor& x) { return sigmoid(x); }, -8, 8);
  check_parity("sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, {t32({-200.0f, 200.0f, -90.0f}, {3})});
  specials_unary("sigmoid", [](const Tensor& x) { return sigmoid(x); });
  grad_unary("sigmoid", [](const Tensor& x) { return sigmoid(x); }, -4, 4);
}
PARITY_CASE(relu) {
  unary_case("relu", [](const Tensor& x) { return relu(x); });
  specials_unary("relu", [](const Tensor& x) { return relu(x); });  // relu(NaN) = NaN as on the CPU
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("relu", [](const Inputs& v) { return relu(v[0]); }, {x});
}
PARITY_CASE(gelu) {
  // Forward is UnaryOp::Gelu, backward UnaryOp::GeluGrad: both compared here.
  unary_case("gelu", [](const Tensor& x) { return gelu(x); }, -4, 4);
  specials_unary("gelu", [](const Tensor& x) { return gelu(x); });
  grad_unary("gelu", [](const Tensor& x) { return gelu(x); }, -3, 3);
}
PARITY_CASE(leaky_relu) {
  unary_case("leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); });
  specials_unary("leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); });
  Tensor x = t64({-1.5, -0.3, 0.2, 0.9, 1.7, -2.2}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("leaky_relu", [](const Inputs& v) { return leaky_relu(v[0], 0.2); }, {x});
}
PARITY_CASE(reciprocal) {
  unary_case("reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.2, 3);
  specials_unary("reciprocal", [](const Tensor& x) { return reciprocal(x); });
  grad_unary("reciprocal", [](const Tensor& x) { return reciprocal(x); }, 0.5, 2);
}
PARITY_CASE(log1p) {
  unary_case("log1p", [](const Tensor& x) { return log1p(x); }, -0.5, 3);
  grad_unary("log1p", [](const Tensor& x) { return log1p(x); }, 0, 2);
}
PARITY_CASE(expm1) {
  unary_case("expm1", [](const Tensor& x) { return expm1(x); });
  grad_unary("expm1", [](const Tensor& x) { return expm1(x); });
}
PARITY_CASE(erf) {
  unary_case("erf", [](const Tensor& x) { return erf(x); });
  grad_unary("erf", [](const Tensor& x) { return erf(x); });
}
PARITY_CASE(clamp) {
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

PARITY_CASE(eq) {
  comparison_case("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); });
  check_parity("eq", [](const Inputs& x) { return eq(x[0], x[1]); }, {bools({4, 1, 3}, 1), bools({5, 1}, 2)});
  check_parity("eq", [](const Inputs& x) { return eq(x[0], 0.0); }, {ties32({100}, 15)});
}
PARITY_CASE(ne) {
  comparison_case("ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); });
  check_parity("ne", [](const Inputs& x) { return ne(x[0], x[1]); }, {bools({40}, 3), bools({40}, 4)});
}
PARITY_CASE(lt) {
  comparison_case("lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); });
  check_parity("lt", [](const Inputs& x) { return lt(x[0], x[1]); }, {bools({4, 1, 3}, 5), bools({5, 1}, 6)});
}
PARITY_CASE(le) {
  comparison_case("le", [](const Tensor& a, const Tensor& b) { return le(a, b); });
  check_parity("le", [](const Inputs& x) { return le(x[0], x[1]); }, {bools({40}, 7), bools({40}, 8)});
}
PARITY_CASE(gt) { comparison_case("gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }); }
PARITY_CASE(ge) {
  comparison_case("ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); });
  check_parity("ge", [](const Inputs& x) { return ge(x[0], 0.0); }, {ties32({100}, 16)});
}
PARITY_CASE(logical_and) {
  auto g = [](const Inputs& x) { return logical_and(x[0], x[1]); };
  check_parity("logical_and", g, {bools({6, 7}, 1), bools({6, 7}, 2)});
  check_parity("logical_and", g, {bools({4, 1, 3}, 3), bools({5, 1}, 4)});
  check_parity("logical_and", [](const Inputs& x) { return logical_and(transpose(x[0], 0, 1), x[1]); },
               {bools({5, 4}, 5), bools({1}, 6)});
  check_parity("logical_and", g, {bools({1 << 20}, 7), bools({1 << 20}, 8)});
  check_parity("logical_and", g, {bools({0}, 9), bools({0}, 10)});
}
PARITY_CASE(logical_or) {
  auto g = [](const Inputs& x) { return logical_or(x[0], x[1]); };
  check_parity("logical_or", g, {bools({6, 7}, 1), bools({6, 7}, 2)});
  check_parity("logical_or", g, {bools({4, 1, 3}, 3), bools({5, 1}, 4)});
  check_parity("logical_or", [](const Inputs& x) { return logical_or(slice(x[0], 0, 1, 41, 2), x[1]); },
               {bools({41}, 5), bools({20}, 6)});
  check_parity("logical_or", g, {bools({1 << 20}, 7), bools({1}, 8)});
}
PARITY_CASE(logical_not) {
  auto g = [](const Inputs& x) { return logical_not(x[0]); };
  check_parity("logical_not", g, {bools({6, 7}, 1)});
  check_parity("logical_not", [](const Inputs& x) { return logical_not(transpose(x[0], 0, 1)); }, {bools({5, 4}, 2)});
  check_parity("logical_not", g, {bools({1 << 20}, 3)});
  check_parity("logical_not", g, {bools({0, 2}, 4)});
  check_parity("logical_not", [](const Inputs& x) { return logical_not(gt(x[0], 0.0)); }, {leaf32({100}, 5)});
}

// ---------------------------------------------------------------- copies, casts, moves

PARITY_CASE(to) {
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
PARITY_CASE(clone) {
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
    // int64 takes integral factors only (the number takes the tensor's dtype)
    double alpha = dt == kInt64 ? -3.0 : -0.37, big_alpha = dt == kInt64 ? 2.0 : 0.125;
    add_(h, o, alpha);
    add_(d, cuda0(o), alpha);
    check_equal(d, h);  // products and sums rounded separately on both devices: bit-identical
    Tensor big_h = to(leaf64({1 << 20}, 3).detach(), dt), big_o = to(leaf64({1 << 20}, 4).detach(), dt);
    Tensor big_d = cuda0(big_h);
    add_(big_h, big_o, big_alpha);
    add_(big_d, cuda0(big_o), big_alpha);
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

}  // TEST_SUITE
