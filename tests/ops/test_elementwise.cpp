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
  CHECK_THROWS_MSG(mul(t32({1}, {1}), t64({1}, {1})), DTypeError, "[mul]", "float32", "float64");
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
