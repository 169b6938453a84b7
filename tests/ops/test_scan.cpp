// cumsum (kernels/scan) against a plain running sum, and the composites flip, roll and
// repeat (autograd/ops/shape.cpp) against index arithmetic; float64 gradchecks; CUDA parity.
#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// Running sums of v (row-major, shape s) along axis a, in long double.
std::vector<double> naive_cumsum(const std::vector<double>& v, const Shape& s, int64_t a, bool reverse = false) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < int64_t(s.size()); ++d) {
    if (d < a) outer *= s[size_t(d)];
    if (d > a) inner *= s[size_t(d)];
  }
  const int64_t n = s[size_t(a)];
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      long double acc = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = reverse ? n - 1 - k : k;
        const size_t at = size_t((o * n + i) * inner + j);
        acc += v[at];
        out[at] = double(acc);
      }
    }
  return out;
}

// The element of x (row-major, shape s) at multi-index idx.
int64_t flat_index(const Shape& s, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < s.size(); ++d) f = f * s[d] + idx[d];
  return f;
}
std::vector<int64_t> multi_index(const Shape& s, int64_t f) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = f % s[d];
    f /= s[d];
  }
  return idx;
}

}  // namespace

TEST_SUITE("ops/scan") {

TEST_CASE("cumsum matches a running sum along every axis, for views too") {
  const Shape s{3, 4, 5};
  Tensor x = leaf64(s, 3).detach();
  const std::vector<double> v = values(x);
  for (int64_t a = 0; a < 3; ++a) {
    check_close(cumsum(x, a), naive_cumsum(v, s, a), 1e-12);
    check_close(cumsum(x, a - 3), naive_cumsum(v, s, a), 1e-12);  // negative axes count from the end
  }
  // a transposed view: the running sum of what the view shows
  Tensor xt = transpose(x, 0, 2);  // (5, 4, 3)
  const std::vector<double> vt = values(contiguous(xt));
  check_close(cumsum(xt, 2), naive_cumsum(vt, {5, 4, 3}, 2), 1e-12);
  check_close(cumsum(xt, 0), naive_cumsum(vt, {5, 4, 3}, 0), 1e-12);
  // float32 accumulates in double: 2^24 + 1 + 1 ... stays exact until the rounding of each output
  Tensor f = Tensor::full({3000}, 1.0, kFloat32);
  CHECK(values(cumsum(f, 0)).back() == 3000.0);
  CHECK(cumsum(f, 0).dtype() == kFloat32);
  // long lines on several threads, and one long column block
  Tensor big = leaf64({2, 70000}, 4).detach();
  check_close(cumsum(big, 1), naive_cumsum(values(big), {2, 70000}, 1), 1e-9);
  Tensor wide = leaf64({50, 3000}, 5).detach();
  check_close(cumsum(wide, 0), naive_cumsum(values(wide), {50, 3000}, 0), 1e-11);
}

TEST_CASE("cumsum of int64 and bool counts in int64, and bfloat16 rounds each running sum once") {
  Tensor i = ti64({3, -1, 4, 1, -5, 9}, {2, 3});
  Tensor ci = cumsum(i, 1);
  CHECK(ci.dtype() == kInt64);
  CHECK(ci.to_vector<int64_t>() == std::vector<int64_t>{3, 2, 6, 1, -4, 5});
  Tensor big = ti64({int64_t(1) << 60, int64_t(1) << 60, 1}, {3});  // int64 all the way: no double rounding
  CHECK(cumsum(big, 0).to_vector<int64_t>()[2] == (int64_t(1) << 61) + 1);
  Tensor m = Tensor::from_vector(std::vector<bool>{true, false, true, true}, {4});
  Tensor cm = cumsum(m, 0);
  CHECK(cm.dtype() == kInt64);
  CHECK(cm.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2, 3});
  // 256 + 1 + 1 in bfloat16: the running sum (258) rounds once to 258, where adding in bfloat16
  // would have stayed at 256 (257 rounds to even)
  Tensor b = to(t64({256, 1, 1}, {3}), kBFloat16);
  Tensor cb = cumsum(b, 0);
  CHECK(cb.dtype() == kBFloat16);
  CHECK(values(cb) == std::vector<double>{256, 256, 258});
}

TEST_CASE("cumsum of a 0-d tensor, of an empty one, and its errors") {
  Tensor z = Tensor::scalar(2.5, kFloat64);
  CHECK(cumsum(z, 0).dim() == 0);
  CHECK(cumsum(z, -1).item() == 2.5);
  CHECK(cumsum(Tensor::zeros({0, 3}, kFloat32), 0).shape() == Shape{0, 3});
  CHECK(cumsum(Tensor::zeros({2, 0}, kFloat32), 1).shape() == Shape{2, 0});
  CHECK_THROWS_MSG(cumsum(leaf64({2, 3}), 2), IndexError, "[cumsum]", "axis 2");
  CHECK_THROWS_MSG(cumsum(z, 1), IndexError, "[cumsum]", "axis 1");
  CHECK_THROWS_MSG(cumsum(Tensor(), 0), Error, "[cumsum]");
}

TEST_CASE("cumsum's gradient is the reverse running sum of the output's") {
  Tensor x = leaf64({2, 4}, 6);
  Tensor w = leaf64({2, 4}, 7).detach();
  sum(mul(cumsum(x, 1), w)).backward();
  check_close(x.grad(), naive_cumsum(values(w), {2, 4}, 1, true), 1e-12);
}

GRADCHECK_CASE(cumsum) {
  check_grad("cumsum", [](auto& x) { return cumsum(x[0], 1); }, {leaf64({3, 4})});
  check_grad("cumsum", [](auto& x) { return cumsum(x[0], 0); }, {leaf64({3, 2, 2})});
  check_grad("cumsum", [](auto& x) { return cumsum(transpose(x[0], 0, 1), -1); }, {leaf64({4, 3})});
  check_grad("cumsum", [](auto& x) { return cumsum(x[0], 0); }, {leaf64({}, 2)});
}

TEST_CASE("flip reverses each axis given, as a copy") {
  const Shape s{2, 3, 4};
  Tensor x = leaf64(s, 8).detach();
  const std::vector<double> v = values(x);
  for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {2}, {0, 2}, {-1, 1}, {0, 1, 2}}) {
    Tensor y = flip(x, axes);
    const std::vector<double> got = values(y);
    for (int64_t f = 0; f < numel_of(s); ++f) {
      std::vector<int64_t> idx = multi_index(s, f);
      for (int64_t a : axes) {
        const size_t d = size_t(a < 0 ? a + 3 : a);
        idx[d] = s[d] - 1 - idx[d];
      }
      CHECK(got[size_t(f)] == v[size_t(flat_index(s, idx))]);
    }
  }
  Tensor same = flip(x, {});
  CHECK(values(same) == v);
  fill_(same, 0.0);  // a copy: x is untouched
  CHECK(values(x) == v);
  Tensor single = Tensor::full({1, 3}, 1.0, kFloat64);
  Tensor fs = flip(single, {0});
  fill_(fs, 2.0);
  CHECK(values(single) == std::vector<double>{1, 1, 1});
  CHECK_THROWS_MSG(flip(x, {3}), IndexError, "[flip]", "axis 3");
  CHECK_THROWS_MSG(flip(x, {1, -2}), IndexError, "[flip]", "repeated axis");
  check_grad("index_select", [](auto& t) { return flip(t[0], {0, 1}); }, {leaf64({3, 2})});
}

TEST_CASE("roll shifts with wrap-around along axes, or flattened") {
  Tensor x = t64({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  CHECK(values(roll(x, {1}, {1})) == std::vector<double>{3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10});
  CHECK(values(roll(x, {-1}, {0})) == std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3});
  CHECK(values(roll(x, {5}, {1})) == values(roll(x, {1}, {1})));  // shifts wrap modulo the length
  CHECK(values(roll(x, {-7}, {1})) == values(roll(x, {1}, {1})));
  CHECK(values(roll(x, {1, 2}, {0, 1})) == std::vector<double>{10, 11, 8, 9, 2, 3, 0, 1, 6, 7, 4, 5});
  Tensor flat = roll(x, {2});
  CHECK(flat.shape() == Shape{3, 4});
  CHECK(values(flat) == std::vector<double>{10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor zero = roll(x, {4}, {1});
  fill_(zero, 0.0);  // a copy even when nothing moves
  CHECK(values(x)[1] == 1.0);
  CHECK_THROWS_MSG(roll(x, {1, 2}, {0}), ValueError, "[roll]", "one shift per axis");
  CHECK_THROWS_MSG(roll(x, {1, 2}), ValueError, "[roll]", "one shift");
  CHECK_THROWS_MSG(roll(x, {1}, {2}), IndexError, "[roll]", "axis 2");
  check_grad("cat", [](auto& t) { return roll(t[0], {2, -1}, {1, 0}); }, {leaf64({3, 4})});
}

TEST_CASE("repeat tiles x, adding leading axes") {
  Tensor x = t64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = repeat(x, {2, 2});
  CHECK(r.shape() == Shape{4, 6});
  CHECK(values(r) == std::vector<double>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6,
                                         1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  Tensor lead = repeat(t64({1, 2}, {2}), {3, 1, 2});
  CHECK(lead.shape() == Shape{3, 1, 4});
  CHECK(values(lead) == std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2});
  CHECK(repeat(x, {0, 1}).shape() == Shape{0, 3});
  Tensor once = repeat(x, {1, 1});
  fill_(once, 0.0);  // never a view of x
  CHECK(values(x)[0] == 1.0);
  CHECK_THROWS_MSG(repeat(x, {2}), ShapeError, "[repeat]", "at least one count per axis");
  CHECK_THROWS_MSG(repeat(x, {1, -1}), ValueError, "[repeat]", ">= 0");
  check_grad("expand", [](auto& t) { return repeat(t[0], {2, 1, 3}); }, {leaf64({2, 3})});
}

}  // TEST_SUITE

// ---------------------------------------------------------------- CUDA parity
// cumsum's two launch shapes (a warp per line when the axis is the last: lines shorter and longer
// than a warp, one line of 100000; a thread per column otherwise), reverse through the backward,
// int64 and bfloat16; the composites on the device.
TEST_SUITE("ops/scan") {

PARITY_CASE(cumsum) {
  uint64_t seed = 30;
  for (int64_t a : {0, 1, 2, -1})
    parity_layouts("cumsum", [a](const Tensor& x) { return cumsum(x, a); }, {4, 5, 37}, seed += 3);
  check_parity("cumsum", [](const Inputs& x) { return cumsum(x[0], 0); }, {leaf32({100000}, 40)});
  check_parity("cumsum", [](const Inputs& x) { return cumsum(x[0], 1); }, {leaf32({3000, 7}, 41)});
  check_parity("cumsum", [](const Inputs& x) { return cumsum(x[0], 0); }, {leaf32({3000, 7}, 42)});
  check_parity("cumsum", [](const Inputs& x) { return cumsum(x[0], 0); }, {leaf32({}, 43)});
  check_parity("cumsum", [](const Inputs& x) { return cumsum(x[0], 1); },
               {ti64({int64_t(1) << 60, 3, -4, 7, 1, 1}, {2, 3})});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("cumsum", [](const Inputs& x) { return cumsum(to(x[0], kBFloat16), 1); }, {leaf32({6, 300}, 44)}, fwd);
  check_parity("cumsum", [](const Inputs& x) { return cumsum(gt(x[0], 0.0), 1); }, {leaf32({6, 300}, 45)}, fwd);
  check_grad_cuda("cumsum", [](auto& x) { return cumsum(x[0], 1); }, {leaf64({3, 40})});
  check_grad_cuda("cumsum", [](auto& x) { return cumsum(x[0], 0); }, {leaf64({5, 3})});
}

CUDA_TEST_CASE("parity flip, roll and repeat") {
  check_parity("flip", [](const Inputs& x) { return flip(x[0], {0, 2}); }, {leaf32({3, 4, 5}, 50)});
  check_parity("roll", [](const Inputs& x) { return roll(x[0], {3, -2}, {2, 0}); }, {leaf32({3, 4, 5}, 51)});
  check_parity("repeat", [](const Inputs& x) { return repeat(x[0], {2, 1, 3}); }, {leaf32({4, 5}, 52)});
}

}  // TEST_SUITE
