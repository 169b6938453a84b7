#include "test_util.h"
#include "cuda/cuda_test_util.h"
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

using namespace cf;
using namespace cf::test;

namespace {
Tensor seq64(const Shape& s, double start = 0) {
  std::vector<double> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + double(i);
  return t64(v, s);
}
Tensor seq32(const Shape& s, float start = 0) {
  std::vector<float> v(size_t(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + float(i);
  return t32(v, s);
}
}  // namespace

TEST_SUITE("ops/join") {

// ---------------- cat ----------------

TEST_CASE("cat matches naive concatenation on every axis") {
  Tensor a = seq32({2, 3}), b = seq32({2, 3}, 100);
  check_close(cat({a, b}, 0), {0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105});
  Tensor c = seq32({2, 1}, 50);
  Tensor r = cat({a, c, b}, -1);
  CHECK(r.shape() == Shape{2, 7});
  check_close(r, {0, 1, 2, 50, 100, 101, 102, 3, 4, 5, 51, 103, 104, 105});
  // float64, int64 and bool.
  check_close(cat({seq64({1, 2}), seq64({2, 2}, 10)}, 0), {0, 1, 10, 11, 12, 13});
  CHECK(cat({ti64({1, 2}, {2}), ti64({3}, {1})}, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  Tensor m = cat({Tensor::from_vector(std::vector<bool>{true}, {1}),
                  Tensor::from_vector(std::vector<bool>{false, true}, {2})}, 0);
  CHECK(m.to_vector<bool>() == std::vector<bool>{true, false, true});
  // A single tensor and zero-length pieces.
  check_close(cat({a}, 1), values(a));
  check_close(cat({Tensor::zeros({2, 0}), a, Tensor::zeros({2, 0})}, 1), values(a));
}

TEST_CASE("cat of non-contiguous inputs") {
  Tensor base = seq64({3, 4});
  Tensor t = transpose(base, 0, 1);                // (4,3)
  Tensor s = slice(seq64({4, 6}, 100), 1, 0, 6, 2);  // (4,3) every other column
  Tensor e = expand(seq64({1, 3}, 200), {4, 3});     // stride 0
  Tensor r = cat({t, s, e}, 1);
  CHECK(r.shape() == Shape{4, 9});
  std::vector<double> want;
  auto tv = values(t), sv = values(s), ev = values(e);
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 3; ++j) want.push_back(tv[i * 3 + j]);
    for (size_t j = 0; j < 3; ++j) want.push_back(sv[i * 3 + j]);
    for (size_t j = 0; j < 3; ++j) want.push_back(ev[i * 3 + j]);
  }
  check_close(r, want);
  check_close(cat({t, s}, 0), [&] {
    std::vector<double> w = tv;
    w.insert(w.end(), sv.begin(), sv.end());
    return w;
  }());
}

TEST_CASE("cat backward slices the gradient") {
  Tensor a = leaf64({2, 2}, 1), b = leaf64({2, 3}, 2);
  Tensor g = seq64({2, 5});
  cat({a, b}, 1).backward(g);
  check_close(a.grad(), {0, 1, 5, 6});
  check_close(b.grad(), {2, 3, 4, 7, 8, 9});
  // Inputs that do not require grad get nothing; the rest still do.
  Tensor c = leaf64({1, 2}, 3);
  Tensor d = seq64({1, 2});
  cat({d, c}, 0).backward(seq64({2, 2}));
  check_close(c.grad(), {2, 3});
}

TEST_CASE("cat and stack promote floating dtypes as PyTorch does, gradients back in each input's dtype") {
  // (they refused them: under autocast amax keeps bfloat16 while mean gives float32, and a
  // point-cloud model concatenating the two failed at its first bf16 step)
  Tensor a = seq32({2, 3}), b = seq64({1, 3}), h = to(seq32({1, 3}), kBFloat16);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor c = cat({a, b}, 0);
  CHECK(c.dtype() == kFloat64);
  CHECK(values(c) == values(cat({to(a, kFloat64), b}, 0)));
  sum(c * 2.0).backward();
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(values(b.grad()) == std::vector<double>{2, 2, 2});
  CHECK(cat({h, seq32({1, 3})}, 0).dtype() == kFloat32);
  CHECK(stack({h, to(seq32({1, 3}), kFloat16)}, 0).dtype() == kFloat32);  // bfloat16 with float16: float32
}

TEST_CASE("cat bad input") {
  CHECK_THROWS_MSG(cat({}, 0), ValueError, "[cat]", "empty");
  Tensor a = seq32({2, 3});
  CHECK_THROWS_MSG(cat({a, seq32({3, 3})}, 1), ShapeError, "[cat]", "(2,3)", "(3,3)");
  CHECK_THROWS_MSG(cat({a, seq32({2, 3, 1})}, 0), ShapeError, "[cat]", "rank", "(2,3,1)");
  CHECK_THROWS_MSG(cat({a, Tensor::zeros({2, 3}, kInt64)}, 0), DTypeError, "[cat]", "float32", "int64");
  CHECK_THROWS_MSG(cat({a, fake_cuda({2, 3})}, 0), DeviceError, "[cat]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(cat({a, a}, 2), IndexError, "[cat]", "axis 2");
  CHECK_THROWS_MSG(cat({a, a}, -3), IndexError, "[cat]", "-3");
  CHECK_THROWS_MSG(cat({Tensor::scalar(1.0), Tensor::scalar(2.0)}, 0), ShapeError, "[cat]", "0-d");
  CHECK_THROWS_MSG(cat({a, Tensor()}, 0), ValueError, "[cat]", "undefined");
}

GRADCHECK_CASE(cat) {
  check_grad("cat",
             [](const std::vector<Tensor>& x) { return cat({x[0], x[1], x[2]}, 1); },
             {leaf64({2, 3}, 1), leaf64({2, 1}, 2), leaf64({2, 2}, 3)});
  check_grad("cat",
             [](const std::vector<Tensor>& x) { return cat({transpose(x[0], 0, 1), x[1]}, 0); },
             {leaf64({3, 2}, 4), leaf64({1, 3}, 5)});
}

// ---------------- stack ----------------

TEST_CASE("stack matches naive stacking on every axis") {
  Tensor a = seq32({2, 3}), b = seq32({2, 3}, 10);
  Tensor s0 = stack({a, b}, 0);
  CHECK(s0.shape() == Shape{2, 2, 3});
  check_close(s0, {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  Tensor s1 = stack({a, b}, 1);
  CHECK(s1.shape() == Shape{2, 2, 3});
  check_close(s1, {0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15});
  Tensor s2 = stack({a, b}, -1);
  CHECK(s2.shape() == Shape{2, 3, 2});
  check_close(s2, {0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15});
  // Scalars stack into a vector; non-contiguous inputs.
  check_close(stack({Tensor::scalar(1.0, kFloat64), Tensor::scalar(2.0, kFloat64)}, 0), {1, 2});
  Tensor t = transpose(seq64({3, 2}), 0, 1);  // (2,3): 0 2 4 / 1 3 5
  check_close(stack({t, seq64({2, 3}, 10)}, 2), {0, 10, 2, 11, 4, 12, 1, 13, 3, 14, 5, 15});
}

TEST_CASE("stack backward selects the gradient") {
  Tensor a = leaf64({3}, 1), b = leaf64({3}, 2);
  stack({a, b}, 1).backward(seq64({3, 2}));
  check_close(a.grad(), {0, 2, 4});
  check_close(b.grad(), {1, 3, 5});
}

TEST_CASE("stack bad input") {
  CHECK_THROWS_MSG(stack({}, 0), ValueError, "[stack]", "empty");
  Tensor a = seq32({2, 3});
  CHECK_THROWS_MSG(stack({a, seq32({3, 2})}, 0), ShapeError, "[stack]", "(2,3)", "(3,2)");
  CHECK_THROWS_MSG(stack({a, seq32({6})}, 0), ShapeError, "[stack]", "rank", "(6)");
  CHECK_THROWS_MSG(stack({a, Tensor::zeros({2, 3}, kBool)}, 0), DTypeError, "[stack]", "float32", "bool");
  CHECK_THROWS_MSG(stack({fake_cuda({2, 3}), a}, 0), DeviceError, "[stack]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(stack({a, a}, 3), IndexError, "[stack]", "axis 3");
}

GRADCHECK_CASE(stack) {
  for (int64_t axis : {0, 1, 2}) {
    check_grad("stack",
               [axis](const std::vector<Tensor>& x) { return stack({x[0], x[1], x[2]}, axis); },
               {leaf64({2, 3}, 1), leaf64({2, 3}, 2), leaf64({2, 3}, 3)});
  }
}

// ---------------- pad ----------------

TEST_CASE("pad follows PyTorch F.pad order") {
  Tensor x = seq32({2, 3}, 1);  // 1 2 3 / 4 5 6
  Tensor p1 = pad(x, {1, 2});   // last axis: one before, two after
  CHECK(p1.shape() == Shape{2, 6});
  check_close(p1, {0, 1, 2, 3, 0, 0, 0, 4, 5, 6, 0, 0});
  Tensor p2 = pad(x, {0, 1, 1, 0}, -1.0);  // last axis (0,1), then first axis (1,0)
  CHECK(p2.shape() == Shape{3, 4});
  check_close(p2, {-1, -1, -1, -1, 1, 2, 3, -1, 4, 5, 6, -1});
  check_close(pad(x, {}), values(x));
  // Negative pads crop.
  Tensor c = pad(x, {-1, 1, 0, -1}, 9.0);
  CHECK(c.shape() == Shape{1, 3});
  check_close(c, {2, 3, 9});
  // Cropping an axis away completely.
  CHECK(pad(x, {-3, 0}).shape() == Shape{2, 0});
  CHECK(pad(x, {-4, 1}).shape() == Shape{2, 0});
  // float64, int64 and a non-contiguous input.
  check_close(pad(ti64({1, 2}, {2}), {2, 0}, 7.0), {7, 7, 1, 2});
  Tensor t = transpose(seq64({2, 2}), 0, 1);  // 0 2 / 1 3
  check_close(pad(t, {1, 0, 0, 1}), {0, 0, 2, 0, 1, 3, 0, 0, 0});
}

TEST_CASE("pad backward") {
  Tensor x = leaf64({2, 2}, 1);
  pad(x, {1, 0, 0, 1}).backward(seq64({3, 3}));
  check_close(x.grad(), {1, 2, 4, 5});
  Tensor y = leaf64({3}, 2);
  pad(y, {-1, 2}).backward(seq64({4}));
  check_close(y.grad(), {0, 0, 1});
}

TEST_CASE("pad bad input") {
  Tensor x = seq32({2, 3});
  CHECK_THROWS_MSG(pad(x, {1}), ValueError, "[pad]", "even", "(2,3)");
  CHECK_THROWS_MSG(pad(x, {1, 1, 1, 1, 1, 1}), ValueError, "[pad]", "6", "(2,3)");
  CHECK_THROWS_MSG(pad(x, {-2, -2}), ShapeError, "[pad]", "size 3", "-1", "(2,3)");
  CHECK_THROWS_MSG(pad(x, {0, 0, -3, 0}), ShapeError, "[pad]", "axis 0", "(2,3)");
  CHECK_THROWS_MSG(pad(Tensor(), {1, 1}), ValueError, "[pad]", "undefined");
}

GRADCHECK_CASE(pad) {
  check_grad("pad", [](const std::vector<Tensor>& x) { return pad(x[0], {1, 2, 0, 1}, 0.5); },
             {leaf64({2, 3}, 1)});
  // Cropping pads and a non-contiguous input.
  check_grad("pad",
             [](const std::vector<Tensor>& x) { return pad(transpose(x[0], 0, 1), {-1, 1, 1, -1}); },
             {leaf64({3, 4}, 2)});
}

// ---------------- split ----------------

TEST_CASE("split into equal pieces and by sizes") {
  Tensor x = seq64({5, 2});
  auto p = split(x, 2, 0);
  REQUIRE(p.size() == 3);
  check_close(p[0], {0, 1, 2, 3});
  check_close(p[1], {4, 5, 6, 7});
  check_close(p[2], {8, 9});
  CHECK(p[2].shape() == Shape{1, 2});
  CHECK(p[0].shares_storage(x));  // views, not copies
  auto q = split(x, std::vector<int64_t>{1, 0, 1}, -1);
  REQUIRE(q.size() == 3);
  check_close(q[0], {0, 2, 4, 6, 8});
  CHECK(q[1].shape() == Shape{5, 0});
  check_close(q[2], {1, 3, 5, 7, 9});
  CHECK(split(x, 10, 0).size() == 1);
  CHECK(split(Tensor::zeros({0, 3}), 2, 0).size() == 1);
  // cat undoes split.
  Tensor t = transpose(seq64({3, 4}), 0, 1);
  check_close(cat(split(t, 3, 0), 0), values(t));
}

TEST_CASE("split pieces are differentiable views") {
  check_grad("slice",
             [](const std::vector<Tensor>& x) {
               auto p = split(x[0], std::vector<int64_t>{1, 3}, 1);
               return cat({mul(p[1], 2.0), p[0]}, 1);
             },
             {leaf64({2, 4}, 1)});
  Tensor x = leaf64({4}, 2);
  auto p = split(x, 3, 0);
  sum(mul(p[1], 5.0)).backward();
  check_close(x.grad(), {0, 0, 0, 5});
}

TEST_CASE("split bad input") {
  Tensor x = seq32({4, 3});
  CHECK_THROWS_MSG(split(x, 0, 0), ValueError, "[split]", "0", "(4,3)");
  CHECK_THROWS_MSG(split(x, 2, 2), IndexError, "[split]", "axis 2");
  CHECK_THROWS_MSG(split(x, std::vector<int64_t>{1, 2}, 0), ShapeError, "[split]", "(1,2)", "3",
                   "4", "(4,3)");
  CHECK_THROWS_MSG(split(x, std::vector<int64_t>{5, -1}, 0), ValueError, "[split]", "negative");
  CHECK_THROWS_MSG(split(Tensor::scalar(1.0), 1, 0), ShapeError, "[split]", "0-d");
}

}

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of cat, stack and pad (copy_cuda): strided and large sources,
// empty tensors, int64, float64 gradchecks on CUDA.

TEST_SUITE("ops/join") {

PARITY_CASE(cat) {
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
PARITY_CASE(stack) {
  for (int64_t axis : {0, 1, 2}) {
    check_parity("stack", [axis](const Inputs& x) { return stack({x[0], transpose(x[1], 0, 1), x[2]}, axis); },
                 {leaf32({2, 3}, 1), leaf32({3, 2}, 2), leaf32({2, 3}, 3)});
    check_grad_cuda("stack", [axis](const Inputs& x) { return stack({x[0], x[1], x[2]}, axis); },
                    {leaf64({2, 3}, 1), leaf64({2, 3}, 2), leaf64({2, 3}, 3)});
  }
  check_parity("stack", [](const Inputs& x) { return stack({x[0], x[1]}, 1); }, {leaf32({1 << 19}, 4), leaf32({1 << 19}, 5)});
  check_parity("stack", [](const Inputs& x) { return stack({x[0], x[1]}, 0); }, {leaf32({0, 2}, 6), leaf32({0, 2}, 7)});
}
PARITY_CASE(pad) {
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }, {leaf32({2, 3}, 1)});
  check_parity("pad", [](const Inputs& x) { return pad(transpose(x[0], 0, 1), {-1, 1, 1, -1}); }, {leaf32({3, 4}, 2)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {3, 5}, -1.0); }, {leaf32({1024, 1024}, 3)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {1, 1}); }, {leaf32({0, 2}, 4)});
  check_parity("pad", [](const Inputs& x) { return pad(x[0], {2, 0}, 7.0); }, {random_ints({3, 2}, -9, 9, 5)});
  check_grad_cuda("pad", [](const Inputs& x) { return pad(x[0], {1, 2, 0, 1}, 0.5); }, {leaf64({2, 3}, 1)});
  check_grad_cuda("pad", [](const Inputs& x) { return pad(transpose(x[0], 0, 1), {-1, 1, 1, -1}); }, {leaf64({3, 4}, 2)});
}

}  // TEST_SUITE
