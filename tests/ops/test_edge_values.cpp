// Ops at the edges of their inputs' ranges, from a probe against PyTorch and NumPy (stop 59):
// each case failed before its fix (a crash, undefined behaviour or a silently wrong value).
#include "test_util.h"
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/edge values") {

TEST_CASE("narrow refuses a start near 2^63 (start + length overflowed into a heap write) - slice takes any step") {
  Tensor x = Tensor::zeros({4, 4});
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_MSG(narrow(x, 0, big, 1), IndexError, "[narrow] start 9223372036854775807 with length 1",
                   "out of bounds for axis 0 of size 4");
  CHECK_THROWS_MSG(narrow(x, 1, 2, big), IndexError, "[narrow]");
  CHECK(narrow(x, 1, 4, 0).shape() == Shape{4, 0});
  Tensor r = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4}, {5});
  CHECK(values(slice(r, 0, 0, 5, big)) == std::vector<double>{0});  // (end - start + step - 1) overflowed
  CHECK(values(slice(r, 0, 1, 5, 3)) == std::vector<double>{1, 4});
}

TEST_CASE("pad refuses pads that overflow int64 (they wrapped to a small size and the copy wrote out of bounds)") {
  Tensor x = t32({1, 2, 3, 4}, {4});
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_MSG(pad(x, {big, big}), ShapeError, "[pad] pads (9223372036854775807, 9223372036854775807)",
                   "overflow int64");
  CHECK_THROWS_MSG(pad(x, {std::numeric_limits<int64_t>::min(), 0}), ShapeError, "[pad]");
  CHECK(values(pad(x, {1, -2})) == std::vector<double>{0, 1, 2});
  Tensor m = Tensor::zeros({4, 4});  // a step far beyond the axis: one element, no stride overflow
  CHECK(slice(m, 0, 0, 4, int64_t(1) << 62).shape() == Shape{1, 4});
}

TEST_CASE("transpose of a 0-d tensor is itself (it wrote outside an empty permutation)") {
  Tensor s = Tensor::scalar(2.5);
  CHECK(transpose(s, 0, 0).dim() == 0);
  CHECK(transpose(s, -1, -1).item() == 2.5);
  CHECK_THROWS_MSG(transpose(s, 1, 0), IndexError, "[transpose]");
}

TEST_CASE("randint is exact over all of int64 (its bounds went through double: SIGFPE or values out of range)") {
  Generator g(3);
  const int64_t lo = (int64_t(1) << 53) + 1;
  std::vector<int64_t> v = randint(lo, lo + 2, {4000}, g).to_vector<int64_t>();
  int64_t seen_lo = 0, seen_hi = 0;
  for (int64_t x : v) {
    REQUIRE((x == lo || x == lo + 1));
    (x == lo ? seen_lo : seen_hi)++;
  }
  CHECK(seen_lo > 1500);
  CHECK(seen_hi > 1500);
  for (int64_t x : randint(int64_t(1) << 60, (int64_t(1) << 60) + 3, {100}, g).to_vector<int64_t>())
    CHECK((x >= (int64_t(1) << 60) && x < (int64_t(1) << 60) + 3));
  const int64_t mn = std::numeric_limits<int64_t>::min(), mx = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> wide = randint(mn, mx, {1000}, g).to_vector<int64_t>();
  CHECK(std::count_if(wide.begin(), wide.end(), [](int64_t x) { return x < 0; }) > 300);
  CHECK(std::count_if(wide.begin(), wide.end(), [&](int64_t x) { return x == mx; }) == 0);
}

TEST_CASE("int64 arithmetic: INT64_MIN / -1 wraps, pow is exact, abs and neg wrap at INT64_MIN") {
  const int64_t mn = std::numeric_limits<int64_t>::min();
  Tensor m = ti64({mn, 7, -7}, {3});
  CHECK((m / ti64({-1, -1, 2}, {3})).to_vector<int64_t>() == std::vector<int64_t>{mn, -7, -3});  // SIGFPE before
  CHECK(pow(ti64({3, 5, 2, -3}, {4}), ti64({39, 27, 62, 3}, {4})).to_vector<int64_t>() ==
        std::vector<int64_t>{4052555153018976267LL, 7450580596923828125LL, int64_t(1) << 62, -27});
  // negative exponents as PyTorch's integer pow: 1, +-1, else 0 (0 ** -1 was INT64_MIN from a double cast)
  CHECK(pow(ti64({1, -1, -1, 0, 5}, {5}), ti64({-3, -3, -2, -1, -1}, {5})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, -1, 1, 0, 0});
  CHECK(abs(ti64({mn, -4}, {2})).to_vector<int64_t>() == std::vector<int64_t>{mn, 4});
  CHECK(neg(ti64({mn}, {1})).to_vector<int64_t>() == std::vector<int64_t>{mn});
}

TEST_CASE("int64 add, sub, mul wrap (signed overflow is undefined in C++) - float to int64 is defined") {
  const int64_t mx = std::numeric_limits<int64_t>::max(), mn = std::numeric_limits<int64_t>::min();
  CHECK((ti64({mx}, {1}) + ti64({1}, {1})).to_vector<int64_t>() == std::vector<int64_t>{mn});
  CHECK((ti64({mn}, {1}) - ti64({1}, {1})).to_vector<int64_t>() == std::vector<int64_t>{mx});
  CHECK((ti64({int64_t(1) << 62}, {1}) * ti64({4}, {1})).to_vector<int64_t>() == std::vector<int64_t>{0});
  CHECK(square(ti64({int64_t(1) << 32}, {1})).to_vector<int64_t>() == std::vector<int64_t>{0});
  // NaN, inf and values beyond int64 convert to INT64_MIN on both devices (C++ leaves it undefined,
  // CUDA saturates); others truncate toward zero
  for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
    Tensor f = to(t64({std::nan(""), INFINITY, -INFINITY, 1e30, -2.7, 3.9}, {6}), dt);
    CHECK(to(f, kInt64).to_vector<int64_t>() == std::vector<int64_t>{mn, mn, mn, mn, -2, 3});
  }
}

TEST_CASE("logsumexp's gradient is the softmax also beside large values (its lse was rounded to the dtype)") {
  Tensor x = t32({1e6f, 1e6f, 1e6f}, {3});
  x.set_requires_grad(true);
  logsumexp(x, {0}).backward();
  for (double g : values(x.grad())) CHECK(g == doctest::Approx(1.0 / 3).epsilon(1e-6));
  // a row holding +inf: NaN at the +inf and 0 elsewhere, as PyTorch (not NaN everywhere)
  Tensor r = t64({INFINITY, 1.0, 2.0, -INFINITY, -INFINITY, -INFINITY}, {2, 3});
  r.set_requires_grad(true);
  sum(logsumexp(r, {1})).backward();
  const std::vector<double> g = values(r.grad());
  CHECK(std::isnan(g[0]));
  CHECK(g[1] == 0.0);
  CHECK(g[2] == 0.0);
  CHECK(std::isnan(g[3]));  // an all -inf row: NaN, as PyTorch
  // large finite entries beside +inf: 0, not exp overflowing to inf / inf
  Tensor big = t64({INFINITY, 1000.0, 2.0}, {3});
  big.set_requires_grad(true);
  logsumexp(big, {0}).backward();
  CHECK(values(big.grad())[1] == 0.0);
}

TEST_CASE("abs(-0.0) is +0.0 in every float dtype") {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    const double z = to(abs(to(t64({-0.0}, {1}), dt)), kFloat64).item();
    CHECK(z == 0.0);
    CHECK(!std::signbit(z));
  }
}

TEST_CASE("a number an int64 tensor cannot hold is refused by every write (it was stored as INT64_MIN)") {
  Tensor t = ti64({1, 2, 3}, {3});
  const double nan = std::nan("");
  CHECK_THROWS_MSG(fill_(t, nan), DTypeError, "[fill_] value nan cannot be converted to int64 without overflow");
  CHECK_THROWS_MSG(fill_(t, 1e30), DTypeError, "[fill_]", "1e+30");
  CHECK_THROWS_MSG(fill_(t, 9223372036854775808.0), DTypeError, "[fill_]");
  CHECK_THROWS_MSG(Tensor::full({2}, INFINITY, kInt64), DTypeError, "[full]", "inf");
  CHECK_THROWS_MSG(full_like(t, -1e19), DTypeError, "[full_like]");
  CHECK_THROWS_MSG(masked_fill(t, Tensor::ones({3}, kBool), 1e30), DTypeError, "[masked_fill]");
  CHECK_THROWS_MSG(pad(t, {1, 1}, 1e30), DTypeError, "[pad]");
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  fill_(t, -9223372036854775808.0);  // the bounds themselves: -2^63 fits
  CHECK(t.to_vector<int64_t>()[0] == std::numeric_limits<int64_t>::min());
  fill_(t, 2.7);  // a fraction truncates, as in PyTorch
  CHECK(t.to_vector<int64_t>()[0] == 2);
  CHECK(values(Tensor::full({1}, nan)).size() == 1);  // floats take anything
}

TEST_CASE("argmax, argmin and clamp name the problem the user made") {
  CHECK_THROWS_MSG(argmax(Tensor::zeros({2, 0}), 1), ShapeError, "[argmax]");
  CHECK_THROWS_MSG(argmin(Tensor::zeros({3}, kBool), 0), DTypeError, "[argmin]");
  CHECK_THROWS_MSG(clamp(Tensor::zeros({2}), std::nan(""), 1.0), ValueError, "[clamp] the bounds must not be NaN");
}

TEST_CASE("empty tensors are contiguous - item names itself") {
  Tensor e = Tensor::zeros({3, 0});
  CHECK(e.is_contiguous());
  CHECK(contiguous(e).is_same(e));
  CHECK(make_view(Tensor::zeros({2, 3}), {2, 0}, {1, 7}, 0).is_contiguous());
  CHECK_THROWS_MSG(Tensor::scalar(1.0).item<double>(), DTypeError, "[item] tensor is float32, asked for float64");
}

TEST_CASE("cross_entropy keeps its precision beside large logits (max and log-sum kept apart)") {
  // float32 logits c + (0, 1, 2), target 0: the lse rounded to float32 made the gradient 3% off at
  // 1e6 and (0, 1, 1) at 1e8; PyTorch is exact there
  const double p0 = 1.0 / (1.0 + std::exp(1.0) + std::exp(2.0));
  for (double c : {1e4, 1e6, 1e7}) {
    Tensor x = t32({float(c), float(c + 1), float(c + 2)}, {1, 3});
    x.set_requires_grad(true);
    Tensor loss = cross_entropy(x, ti64({0}, {1}));
    CHECK(loss.item() == doctest::Approx(-std::log(p0)).epsilon(1e-6));
    loss.backward();
    std::vector<double> g = values(x.grad());
    CHECK(g[0] == doctest::Approx(p0 - 1).epsilon(1e-5));
    CHECK(g[2] == doctest::Approx(std::exp(2.0) * p0).epsilon(1e-5));
    CHECK(std::fabs(g[0] + g[1] + g[2]) < 1e-6);
  }
  for (DType dt : {kFloat32, kFloat64}) {
    // uniform logits of -1e30: the loss is log 3 (it was 0), label smoothing too (it was 1.4e13)
    Tensor u = to(t64({-1e30, -1e30, -1e30}, {1, 3}), dt);
    u.set_requires_grad(true);
    CrossEntropyOptions o;
    CHECK(cross_entropy(u, ti64({1}, {1})).item() == doctest::Approx(std::log(3.0)).epsilon(1e-6));
    o.label_smoothing = 0.1;
    Tensor l = cross_entropy(u, ti64({1}, {1}), o);
    CHECK(l.item() == doctest::Approx(std::log(3.0)).epsilon(1e-6));
    l.backward();
    std::vector<double> g = values(u.grad());
    CHECK(g[0] == doctest::Approx(1.0 / 3 - 0.1 / 3).epsilon(1e-6));
    CHECK(g[1] == doctest::Approx(1.0 / 3 - 0.9 - 0.1 / 3).epsilon(1e-6));
  }
  // 16-bit logits: statistics in float32 (they were rounded to the logits' dtype)
  Tensor h = to(t32({200.f, 201.f, 202.f}, {1, 3}), kBFloat16);
  h.set_requires_grad(true);
  cross_entropy(h, ti64({0}, {1})).backward();
  CHECK(to(h.grad(), kFloat64).to_vector<double>()[0] == doctest::Approx(p0 - 1).epsilon(1e-2));
}

TEST_CASE("binary_cross_entropy_with_logits: the gradient of a very negative logit with target 0 is sigmoid(x)") {
  // (1 - y) x + softplus(-x) gave it as 1 - sigmoid(-x): 0 at x = -15 in float32 (PyTorch: 3.06e-7)
  for (double x0 : {-15.0, -10.0, 0.0, 3.0}) {
    for (double y0 : {0.0, 1.0, 0.25}) {
      Tensor x = t32({float(x0)}, {1});
      x.set_requires_grad(true);
      nn::BCEWithLogitsOptions o;
      o.reduction = Reduction::Sum;
      nn::binary_cross_entropy_with_logits(x, t32({float(y0)}, {1}), o).backward();
      const double want = 1.0 / (1.0 + std::exp(-x0)) - y0;
      CHECK(x.grad().item() == doctest::Approx(want).epsilon(1e-6).scale(0));
      o.pos_weight = t32({3.f}, {1});  // lw sigmoid(x) - pos_weight y, lw = 1 + 2y
      x.zero_grad();
      nn::binary_cross_entropy_with_logits(x, t32({float(y0)}, {1}), o).backward();
      const double lw = 1 + 2 * y0;
      CHECK(x.grad().item() == doctest::Approx(lw / (1.0 + std::exp(-x0)) - 3 * y0).epsilon(1e-6).scale(1e-7));
    }
  }
  // infinite logits: the loss is +inf where y < 1 at x = +inf (PyTorch's value; relu(x) - x y gave NaN),
  // and the gradients are finite, with pos_weight too (its softplus term gave NaN at x = -inf)
  Tensor x = t32({INFINITY, INFINITY, -INFINITY, -INFINITY}, {4});
  x.set_requires_grad(true);
  nn::BCEWithLogitsOptions o;
  o.reduction = Reduction::None;
  const Tensor y = t32({0.f, 0.5f, 0.f, 1.f}, {4});
  const std::vector<double> l = values(nn::binary_cross_entropy_with_logits(x, y, o));
  CHECK(l[0] == INFINITY);
  CHECK(l[1] == INFINITY);
  o.reduction = Reduction::Sum;
  nn::binary_cross_entropy_with_logits(x, y, o).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, 0.5, 0, -1});
  // the targets' gradient there is -x, as PyTorch (the unpicked branch of a where gave 0 * inf = NaN)
  Tensor xi = t32({INFINITY, -INFINITY}, {2}), yi = t32({0.5f, 0.5f}, {2});
  yi.set_requires_grad(true);
  nn::binary_cross_entropy_with_logits(xi, yi, o).backward();
  CHECK(values(yi.grad()) == std::vector<double>{-INFINITY, INFINITY});
  for (float pw : {1.f, 0.5f, 3.f}) {  // with pos_weight p: -x p, no (p - 1) * inf
    nn::BCEWithLogitsOptions op = o;
    op.pos_weight = t32({pw}, {1});
    yi.zero_grad();
    nn::binary_cross_entropy_with_logits(xi, yi, op).backward();
    CHECK(values(yi.grad())[1] == INFINITY);
  }
  x.zero_grad();
  o.pos_weight = t32({2.f}, {1});
  nn::binary_cross_entropy_with_logits(x, y, o).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, 0.5, 0, -2});
}

}  // TEST_SUITE
