#include <cmath>
#include <limits>

#include "kernels/common/row_math.h"
#include "kernels/dropout/dropout.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"
#include <functional>
#include <random>
#include <string>

using namespace cf;
using namespace cf::test;

namespace {

// Naive references over logical (row-major) values.

// Sizes before, along and after `axis`.
void split_at(const Shape& s, int64_t axis, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[size_t(d)];
  n = s[size_t(axis)];
  for (size_t d = size_t(axis) + 1; d < s.size(); ++d) inner *= s[d];
}

std::vector<double> softmax_ref(const std::vector<double>& v, const Shape& s, int64_t axis, bool log) {
  int64_t outer, n, inner;
  split_at(s, axis, outer, n, inner);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return size_t((o * n + k) * inner + i); };
      double m = -INFINITY;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, v[at(k)]);
      double z = 0;
      for (int64_t k = 0; k < n; ++k) z += std::exp(v[at(k)] - m);
      for (int64_t k = 0; k < n; ++k)
        out[at(k)] = log ? v[at(k)] - m - std::log(z) : std::exp(v[at(k)] - m) / z;
    }
  return out;
}

std::vector<double> layer_norm_ref(const std::vector<double>& x, int64_t n,
                                   const std::vector<double>& w, const std::vector<double>& b,
                                   double eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    double mu = 0, var = 0;
    for (int64_t k = 0; k < n; ++k) mu += x[r * size_t(n) + size_t(k)];
    mu /= double(n);
    for (int64_t k = 0; k < n; ++k) var += std::pow(x[r * size_t(n) + size_t(k)] - mu, 2);
    var /= double(n);
    for (int64_t k = 0; k < n; ++k) {
      double y = (x[r * size_t(n) + size_t(k)] - mu) / std::sqrt(var + eps);
      if (!w.empty()) y *= w[size_t(k)];
      if (!b.empty()) y += b[size_t(k)];
      out[r * size_t(n) + size_t(k)] = y;
    }
  }
  return out;
}

// Per-sample losses of logits (N, C, inner...) with class axis 1, as PyTorch defines them.
std::vector<double> ce_ref(const std::vector<double>& x, const Shape& s,
                           const std::vector<int64_t>& t, int64_t ignore, double ls) {
  int64_t N = s[0], C = s[1], inner = 1;
  for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t tt = t[size_t(n * inner + i)];
      if (tt == ignore) {
        out.push_back(0);
        continue;
      }
      auto at = [&](int64_t c) { return x[size_t((n * C + c) * inner + i)]; };
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += std::exp(at(c));
      double nll = -std::log(std::exp(at(tt)) / z), smooth = 0;
      for (int64_t c = 0; c < C; ++c) smooth += -std::log(std::exp(at(c)) / z) / double(C);
      out.push_back((1 - ls) * nll + ls * smooth);
    }
  return out;
}

double mean_over(const std::vector<double>& l, const std::vector<int64_t>& t, int64_t ignore) {
  double s = 0;
  int64_t c = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (t[i] != ignore) {
      s += l[i];
      ++c;
    }
  return s / double(c);
}

Tensor rand32(const Shape& s, uint64_t seed, double lo = -3, double hi = 3) {
  Generator g(seed);
  return rand(s, kFloat32, g, lo, hi);
}
Tensor rand64(const Shape& s, uint64_t seed, double lo = -3, double hi = 3) {
  Generator g(seed);
  return rand(s, kFloat64, g, lo, hi);
}

}  // namespace

TEST_SUITE("ops/nn_functional") {

// ---------------- softmax / log_softmax ----------------

TEST_CASE("softmax and log_softmax match naive loops on every axis") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = dt == kFloat32 ? rand32({3, 4, 5}, 7) : rand64({3, 4, 5}, 7);
    double tol = dt == kFloat32 ? 2e-6 : 1e-12;
    for (int64_t axis : {0, 1, 2, -1}) {
      int64_t a = axis < 0 ? axis + 3 : axis;
      INFO("dtype ", dt, " axis ", axis);
      check_close(softmax(x, axis), softmax_ref(values(x), x.shape(), a, false), tol);
      check_close(log_softmax(x, axis), softmax_ref(values(x), x.shape(), a, true), tol * 4);
    }
  }
}

TEST_CASE("softmax on non-contiguous and broadcast views") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor base = dt == kFloat32 ? rand32({4, 6}, 3) : rand64({4, 6}, 3);
    double tol = dt == kFloat32 ? 2e-6 : 1e-12;
    Tensor xt = transpose(base, 0, 1);  // (6,4), strides (1,6)
    REQUIRE_FALSE(xt.is_contiguous());
    check_close(softmax(xt, -1), softmax_ref(values(xt), xt.shape(), 1, false), tol);
    check_close(log_softmax(xt, 0), softmax_ref(values(xt), xt.shape(), 0, true), tol * 4);
    Tensor xs = slice(base, 1, 0, 6, 2);  // (4,3), every other column
    check_close(softmax(xs, 1), softmax_ref(values(xs), xs.shape(), 1, false), tol);
    Tensor xe = expand(slice(base, 0, 0, 1), {3, 6});  // stride 0 rows
    check_close(softmax(xe, 0), std::vector<double>(18, 1.0 / 3.0), tol);
  }
}

TEST_CASE("softmax is numerically stable") {
  Tensor x = t32({1000, 1001}, {2});
  Tensor y = softmax(x);
  double e = std::exp(-1.0);
  check_close(y, {e / (1 + e), 1 / (1 + e)}, 1e-6);
  check_close(log_softmax(x), {-std::log1p(std::exp(1.0)), -std::log1p(e)}, 1e-5);
  Tensor neg = t64({-1000, -1001, -2000}, {3});
  for (double v : values(softmax(neg))) CHECK(std::isfinite(v));
  for (double v : values(log_softmax(neg))) CHECK(std::isfinite(v));
  // Rows sum to 1 on a large float32 tensor (the parallel path).
  Tensor big = rand32({512, 300}, 5, -20, 20);
  auto s = values(sum(softmax(big, 1), {1}));
  for (double v : s) REQUIRE(std::fabs(v - 1.0) < 1e-5);
}

TEST_CASE("softmax of a scalar and of an empty tensor") {
  check_close(softmax(Tensor::scalar(3.0, kFloat64)), {1.0});
  check_close(log_softmax(Tensor::scalar(3.0, kFloat64)), {0.0});
  CHECK(softmax(Tensor::zeros({0, 3})).shape() == Shape{0, 3});
}

TEST_CASE("softmax backward matches the dense Jacobian") {
  Tensor x = leaf64({2, 3}, 4);
  Tensor g = rand64({2, 3}, 9);
  Tensor y = softmax(x, 1);
  y.backward(g);
  auto yv = values(y), gv = values(g), gx = values(x.grad());
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) {
      double want = 0;
      for (int j = 0; j < 3; ++j)
        want += gv[size_t(r * 3 + j)] * yv[size_t(r * 3 + j)] * ((i == j) - yv[size_t(r * 3 + i)]);
      CHECK(gx[size_t(r * 3 + i)] == doctest::Approx(want).epsilon(1e-12));
    }
}

TEST_CASE("softmax backward with a broadcast (stride 0) gradient") {
  // sum() hands back an expanded gradient; softmax rows sum to 1, so the gradient is 0.
  Tensor x = leaf64({3, 4}, 5);
  sum(softmax(x, 1)).backward();
  for (double v : values(x.grad())) CHECK(std::fabs(v) < 1e-15);
  Tensor z = leaf64({3, 4}, 6);
  sum(log_softmax(z, 0)).backward();  // d/dx sum_k log p_k = 1 - n * p
  auto p = softmax_ref(values(z.detach()), {3, 4}, 0, false), gz = values(z.grad());
  for (size_t i = 0; i < p.size(); ++i) CHECK(gz[i] == doctest::Approx(1 - 3 * p[i]).epsilon(1e-12));
}

TEST_CASE("softmax bad input") {
  CHECK_THROWS_MSG(softmax(ti64({1, 2}, {2})), DTypeError, "[softmax]", "int64");
  CHECK_THROWS_MSG(log_softmax(ti64({1, 2}, {2})), DTypeError, "[log_softmax]", "int64");
  CHECK_THROWS_MSG(softmax(t32({1, 2}, {2}), 1), IndexError, "[softmax]", "axis 1");
  CHECK_THROWS_MSG(log_softmax(t32({1, 2, 3, 4}, {2, 2}), -3), IndexError, "[log_softmax]", "-3");
  CHECK_THROWS_MSG(softmax(Tensor(), 0), ValueError, "[softmax]", "undefined");
}

GRADCHECK_CASE(softmax) {
  for (int64_t axis : {0, 1, -1}) {
    check_grad("softmax", [axis](const std::vector<Tensor>& x) { return softmax(x[0], axis); },
               {leaf64({3, 4, 2}, 11, -2, 2)});
  }
  // Non-contiguous input and gradient (the transpose makes both strided).
  check_grad("softmax",
             [](const std::vector<Tensor>& x) { return transpose(softmax(transpose(x[0], 0, 1), 1), 0, 1); },
             {leaf64({5, 3}, 12, -2, 2)});
}

GRADCHECK_CASE(log_softmax) {
  for (int64_t axis : {0, 1}) {
    check_grad("log_softmax", [axis](const std::vector<Tensor>& x) { return log_softmax(x[0], axis); },
               {leaf64({4, 3}, 13, -2, 2)});
  }
  check_grad("log_softmax",
             [](const std::vector<Tensor>& x) { return log_softmax(transpose(x[0], 0, 1), 0); },
             {leaf64({3, 5}, 14, -2, 2)});
}

// ---------------- layer_norm ----------------

TEST_CASE("layer_norm matches a hand computation") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    Tensor x = dt == kFloat32 ? rand32({2, 3, 4}, 21) : rand64({2, 3, 4}, 21);
    Tensor w = dt == kFloat32 ? rand32({4}, 22) : rand64({4}, 22);
    Tensor b = dt == kFloat32 ? rand32({4}, 23) : rand64({4}, 23);
    check_close(layer_norm(x, {4}, w, b), layer_norm_ref(values(x), 4, values(w), values(b), 1e-5), tol);
    check_close(layer_norm(x, {4}), layer_norm_ref(values(x), 4, {}, {}, 1e-5), tol);
    check_close(layer_norm(x, {4}, w), layer_norm_ref(values(x), 4, values(w), {}, 1e-5), tol);
    check_close(layer_norm(x, {4}, Tensor(), b), layer_norm_ref(values(x), 4, {}, values(b), 1e-5), tol);
    Tensor w2 = dt == kFloat32 ? rand32({3, 4}, 24) : rand64({3, 4}, 24);
    check_close(layer_norm(x, {3, 4}, w2, Tensor(), 0.1),
                layer_norm_ref(values(x), 12, values(w2), {}, 0.1), tol);
    // Non-contiguous x and weight.
    Tensor xt = transpose(x, 0, 2);  // (4,3,2)
    Tensor wt = slice(dt == kFloat32 ? rand32({4}, 25) : rand64({4}, 25), 0, 0, 4, 2);  // (2)
    check_close(layer_norm(xt, {2}, wt), layer_norm_ref(values(xt), 2, values(wt), {}, 1e-5), tol);
  }
}

TEST_CASE("layer_norm is stable for a large mean and constant rows") {
  // |mean| >> std: a one-pass E[x^2] - E[x]^2 in float32 would lose every digit.
  std::vector<float> v;
  for (int i = 0; i < 64; ++i) v.push_back(10000.0f + float(i % 4) * 0.01f);
  Tensor x = t32(v, {16, 4});
  std::vector<double> xd(v.begin(), v.end());
  check_close(layer_norm(x, {4}), layer_norm_ref(xd, 4, {}, {}, 1e-5), 2e-3);
  // A constant row normalises to zeros (var 0, eps keeps rstd finite).
  check_close(layer_norm(t64({5, 5, 5}, {1, 3}), {3}), {0, 0, 0});
}

TEST_CASE("layer_norm backward of a large tensor is parallel-safe") {
  // Enough rows for the parallel paths; compare with the same computation done twice.
  Tensor x = rand64({300, 130}, 26);
  x.set_requires_grad(true);
  Tensor w = rand64({130}, 27);
  w.set_requires_grad(true);
  Tensor g = rand64({300, 130}, 28);
  layer_norm(x, {130}, w).backward(g);
  // dbias-like check: sum over rows of g * xhat equals dweight.
  Tensor xhat = layer_norm(x.detach(), {130});
  check_close(w.grad(), values(sum(mul(g, xhat), {0})), 1e-9);
  // dx rows are orthogonal to 1 (sum of dx over the row is zero).
  for (double v : values(sum(x.grad(), {1}))) REQUIRE(std::fabs(v) < 1e-9);
}

TEST_CASE("layer_norm bad input") {
  Tensor x = t32({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  CHECK_THROWS_MSG(layer_norm(x, {5}), ShapeError, "[layer_norm]", "(5)", "(2,4)");
  CHECK_THROWS_MSG(layer_norm(x, {2, 2, 4}), ShapeError, "[layer_norm]", "(2,2,4)");
  CHECK_THROWS_MSG(layer_norm(x, {}), ShapeError, "[layer_norm]", "()");
  CHECK_THROWS_MSG(layer_norm(x, {4}, Tensor::ones({3})), ShapeError, "[layer_norm]", "weight", "(3)");
  CHECK_THROWS_MSG(layer_norm(x, {4}, Tensor(), Tensor::ones({2, 2})), ShapeError, "[layer_norm]",
                   "bias", "(2,2)");
  CHECK_THROWS_MSG(layer_norm(x, {4}, Tensor::ones({4}, kFloat64)), DTypeError, "[layer_norm]",
                   "float32", "float64");
  CHECK_THROWS_MSG(layer_norm(x, {4}, fake_cuda({4})), DeviceError, "[layer_norm]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(layer_norm(ti64({1, 2}, {1, 2}), {2}), DTypeError, "[layer_norm]", "int64");
  CHECK_THROWS_MSG(layer_norm(x, {4}, Tensor(), Tensor(), -1.0), ValueError, "[layer_norm]", "eps");
}

GRADCHECK_CASE(layer_norm) {
  // weight and bias: all three gradients.
  check_grad("layer_norm",
             [](const std::vector<Tensor>& x) { return layer_norm(x[0], {4}, x[1], x[2]); },
             {leaf64({3, 4}, 31), leaf64({4}, 32), leaf64({4}, 33)});
  // Two normalised axes, weight only.
  check_grad("layer_norm",
             [](const std::vector<Tensor>& x) { return layer_norm(x[0], {2, 3}, x[1], Tensor(), 1e-3); },
             {leaf64({2, 2, 3}, 34), leaf64({2, 3}, 35)});
  // Neither weight nor bias, non-contiguous input.
  check_grad("layer_norm",
             [](const std::vector<Tensor>& x) { return layer_norm(transpose(x[0], 0, 1), {3}); },
             {leaf64({3, 4}, 36)});
  // x fixed, only the affine parameters require grad.
  Tensor xc = rand64({5, 3}, 37);
  check_grad("layer_norm",
             [xc](const std::vector<Tensor>& x) { return layer_norm(xc, {3}, x[0], x[1]); },
             {leaf64({3}, 38), leaf64({3}, 39)});
}

// ---------------- cross_entropy ----------------

TEST_CASE("cross_entropy matches a hand computation") {
  std::vector<int64_t> tv = {2, 0, -100, 4, 1, 3};
  Tensor t = ti64(tv, {6});
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    Tensor x = dt == kFloat32 ? rand32({6, 5}, 41) : rand64({6, 5}, 41);
    for (double ls : {0.0, 0.1, 0.5}) {
      INFO("dtype ", dt, " label_smoothing ", ls);
      auto ref = ce_ref(values(x), x.shape(), tv, -100, ls);
      CrossEntropyOptions o;
      o.label_smoothing = ls;
      o.reduction = Reduction::None;
      Tensor none = cross_entropy(x, t, o);
      CHECK(none.shape() == Shape{6});
      check_close(none, ref, tol);
      o.reduction = Reduction::Sum;
      double total = 0;
      for (double v : ref) total += v;
      check_close(cross_entropy(x, t, o), {total}, tol);
      o.reduction = Reduction::Mean;
      Tensor m = cross_entropy(x, t, o);
      CHECK(m.dim() == 0);
      check_close(m, {mean_over(ref, tv, -100)}, tol);
    }
  }
}

TEST_CASE("cross_entropy with spatial axes, custom ignore_index and strided logits") {
  // logits (N, C, d1) = (2, 3, 4), targets (2, 4).
  std::vector<int64_t> tv = {0, 1, 2, 7, 2, 2, 7, 0};
  Tensor t = ti64(tv, {2, 4});
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    Tensor x = dt == kFloat32 ? rand32({2, 3, 4}, 42) : rand64({2, 3, 4}, 42);
    CrossEntropyOptions o;
    o.ignore_index = 7;
    o.label_smoothing = 0.2;
    o.reduction = Reduction::None;
    auto ref = ce_ref(values(x), x.shape(), tv, 7, 0.2);
    check_close(cross_entropy(x, t, o), ref, tol);
    o.reduction = Reduction::Mean;
    check_close(cross_entropy(x, t, o), {mean_over(ref, tv, 7)}, tol);
    // The same logits stored class-last and permuted into (N, C, d1): a strided view.
    Tensor xl = contiguous(permute(x, {0, 2, 1}));  // (2,4,3)
    Tensor xv = permute(xl, {0, 2, 1});
    REQUIRE_FALSE(xv.is_contiguous());
    check_close(cross_entropy(xv, t, o), {mean_over(ref, tv, 7)}, tol);
    // Strided targets too.
    Tensor tt = transpose(ti64({0, 2, 1, 2, 2, 7, 7, 0}, {4, 2}), 0, 1);
    check_close(cross_entropy(xv, tt, o), {mean_over(ref, tv, 7)}, tol);
  }
}

TEST_CASE("cross_entropy is stable for large logits") {
  Tensor x = t32({1000, 0, -1000, 2000, 2001, 1999}, {2, 3});
  CrossEntropyOptions o;
  o.reduction = Reduction::None;
  Tensor l = cross_entropy(x, ti64({1, 1}, {2}), o);
  auto v = values(l);
  CHECK(v[0] == doctest::Approx(1000.0));
  CHECK(v[1] == doctest::Approx(std::log(std::exp(-1.0) + 1 + std::exp(-2.0))));
}

TEST_CASE("cross_entropy mean over all-ignored targets is zero with zero gradient") {
  // cf chooses 0 where PyTorch gives NaN (0/0): a fully padded batch must not poison training.
  Tensor x = leaf64({3, 4}, 43);
  Tensor l = cross_entropy(x, ti64({-100, -100, -100}, {3}));
  check_close(l, {0.0});
  l.backward();
  check_close(x.grad(), std::vector<double>(12, 0.0));
  CrossEntropyOptions o;
  o.reduction = Reduction::Sum;
  check_close(cross_entropy(x, ti64({-100, -100, -100}, {3}), o), {0.0});
  // An empty batch is the same case.
  check_close(cross_entropy(Tensor::zeros({0, 4}), Tensor::zeros({0}, kInt64)), {0.0});
}

TEST_CASE("cross_entropy gradient is softmax minus the smoothed target") {
  Tensor x = leaf64({2, 3}, 44);
  CrossEntropyOptions o;
  o.label_smoothing = 0.3;
  o.ignore_index = 0;
  Tensor t = ti64({2, 0}, {2});  // second sample ignored
  cross_entropy(x, t, o).backward();  // mean over 1 sample
  auto p = softmax_ref(values(x.detach()), {2, 3}, 1, false);
  auto g = values(x.grad());
  for (int c = 0; c < 3; ++c) {
    CHECK(g[size_t(c)] == doctest::Approx(p[size_t(c)] - 0.1 - (c == 2 ? 0.7 : 0.0)).epsilon(1e-12));
    CHECK(g[size_t(3 + c)] == 0.0);
  }
}

TEST_CASE("cross_entropy on a large batch (parallel path)") {
  const int64_t N = 3000, C = 40;
  Tensor x = rand32({N, C}, 45);
  Generator g(46);
  Tensor t = randint(-1, C, {N}, g);  // -1 serves as ignore_index
  std::vector<int64_t> tv = t.to_vector<int64_t>();
  CrossEntropyOptions o;
  o.ignore_index = -1;
  o.label_smoothing = 0.05;
  o.reduction = Reduction::None;
  check_close(cross_entropy(x, t, o), ce_ref(values(x), x.shape(), tv, -1, 0.05), 1e-4);
  Tensor xl = x.detach();
  xl.set_requires_grad(true);
  o.reduction = Reduction::Sum;
  cross_entropy(xl, t, o).backward();
  // Every gradient row sums to zero (softmax and smoothed target both sum to 1).
  auto rs = values(sum(xl.grad(), {1}));
  for (double v : rs) REQUIRE(std::fabs(v) < 1e-5);
}

TEST_CASE("cross_entropy bad input") {
  Tensor x = t32({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK_THROWS_MSG(cross_entropy(x, ti64({0, 3}, {2})), IndexError, "[cross_entropy]", "target 3",
                   "3 classes");
  CHECK_THROWS_MSG(cross_entropy(x, ti64({-1, 0}, {2})), IndexError, "[cross_entropy]", "target -1");
  CHECK_THROWS_MSG(cross_entropy(x, t32({0, 1}, {2})), DTypeError, "[cross_entropy]", "targets",
                   "float32");
  CHECK_THROWS_MSG(cross_entropy(x, ti64({0, 1, 2}, {3})), ShapeError, "[cross_entropy]", "(3)",
                   "(2,3)", "expected targets of shape (2)");
  CHECK_THROWS_MSG(cross_entropy(t32({1, 2, 3}, {3}), ti64({0}, {1})), ShapeError, "[cross_entropy]",
                   "(3)");
  CHECK_THROWS_MSG(cross_entropy(ti64({1, 2}, {1, 2}), ti64({0}, {1})), DTypeError, "[cross_entropy]",
                   "logits", "int64");
  CHECK_THROWS_MSG(cross_entropy(x, fake_cuda({2}, kInt64)), DeviceError, "[cross_entropy]", "cpu",
                   "cuda:0");
  CrossEntropyOptions o;
  o.label_smoothing = 1.0;
  CHECK_THROWS_MSG(cross_entropy(x, ti64({0, 1}, {2}), o), ValueError, "[cross_entropy]",
                   "label_smoothing", "1");
  o.label_smoothing = -0.1;
  CHECK_THROWS_MSG(cross_entropy(x, ti64({0, 1}, {2}), o), ValueError, "[cross_entropy]", "-0.1");
}

GRADCHECK_CASE(cross_entropy) {
  Tensor t = ti64({2, 0, -100, 4, 1}, {5});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double ls : {0.0, 0.15}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = ls;
      check_grad("cross_entropy",
                 [t, o](const std::vector<Tensor>& x) { return cross_entropy(x[0], t, o); },
                 {leaf64({5, 5}, 51, -2, 2)});
    }
  }
  // (N, C, d1) with a custom ignore_index, through a non-contiguous view.
  Tensor t3 = ti64({0, 3, 2, 1, 3, 0}, {2, 3});
  CrossEntropyOptions o;
  o.ignore_index = 3;
  o.label_smoothing = 0.25;
  check_grad("cross_entropy",
             [t3, o](const std::vector<Tensor>& x) {
               return cross_entropy(permute(x[0], {0, 2, 1}), t3, o);
             },
             {leaf64({2, 3, 4}, 52, -2, 2)});
}

// ---------------- dropout ----------------

TEST_CASE("dropout is the identity when not training or p == 0") {
  Tensor x = rand32({4, 5}, 61);
  Generator g(1);
  CHECK(dropout(x, 0.5, false, g).is_same(x));
  CHECK(dropout(x, 0.0, true, g).is_same(x));
  CHECK(g.offset() == 0);  // no counters used
}

TEST_CASE("dropout keeps about 1-p, scales by 1/(1-p), and repeats with the seed") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO("dtype ", dt);
    const double p = 0.3;
    Tensor x = Tensor::full({200, 500}, 2.0, dt);
    Generator g1(123), g2(123);
    Tensor a = dropout(x, p, true, g1), b = dropout(x, p, true, g2);
    auto av = values(a), bv = values(b);
    REQUIRE(av == bv);
    int64_t kept = 0;
    for (double v : av) {
      if (v != 0) {
        ++kept;
        REQUIRE(v == doctest::Approx(2.0 / (1 - p)));
      }
    }
    double frac = double(kept) / double(av.size());
    CHECK(frac == doctest::Approx(1 - p).epsilon(0.01));  // 1e5 draws: sd ~ 0.0015
    // The generator moved on: the next mask differs.
    CHECK(values(dropout(x, p, true, g1)) != av);
    CHECK(g1.offset() == 2 * uint64_t(x.numel()));
  }
}

TEST_CASE("a dropout share draws its block of the masks of the concatenated batch, the generator in step") {
  // autograd/dropout_share.h: W data-parallel processes, each on a shard of a batch.
  const int64_t W = 3;
  Tensor x = rand32({W * 4, 5}, 62) + 1.0;
  Generator whole_gen(9);
  Tensor whole = dropout(x, 0.5, true, whole_gen);  // one process on the whole batch
  Tensor tiny = rand32({2, 2}, 63);
  for (int64_t r = 0; r < W; ++r) {
    INFO("share ", r, " of ", W);
    Generator g(9);
    set_dropout_share(r, W);
    Tensor mine = dropout(narrow(x, 0, r * 4, 4), 0.5, true, g);
    Tensor z = dropout(tiny, 0.5, true, g);  // any later draw: the generator moved by the whole batch's count
    set_dropout_share(0, 1);
    check_close(mine, narrow(whole, 0, r * 4, 4), 0);
    CHECK(g.offset() == whole_gen.offset() + uint64_t(W * tiny.numel()));
  }
  CHECK(dropout_share().index == 0);
  CHECK(dropout_share().count == 1);
  CHECK_THROWS_MSG(set_dropout_share(0, 0), ValueError, "[set_dropout_share]");
  CHECK_THROWS_MSG(set_dropout_share(-1, 2), ValueError, "[set_dropout_share]");
}

TEST_CASE("dropout mask is the bernoulli stream of the generator") {
  // Same counters as bernoulli(p): dropped exactly where bernoulli says true. This is
  // the contract that makes the mask device-independent. 20,000 elements: several of the
  // kernel's parallel chunks, each starting its counters at its own first element.
  Generator g1(9), g2(9);
  Tensor x = Tensor::ones({20000}, kFloat64);
  auto d = values(dropout(x, 0.25, true, g1));
  auto m = bernoulli({20000}, 0.25, g2).to_vector<bool>();
  for (size_t i = 0; i < d.size(); ++i) REQUIRE((d[i] == 0.0) == bool(m[i]));
}

TEST_CASE("dropout on a non-contiguous input and its backward") {
  Tensor base = leaf64({6, 4}, 62, 0.5, 1.5);
  Generator g(5);
  Tensor y = dropout(transpose(base, 0, 1), 0.5, true, g);  // (4,6)
  Tensor go = rand64({4, 6}, 63);
  y.backward(go);
  auto yv = values(y), xv = values(transpose(base.detach(), 0, 1)), gv = values(go);
  auto gx = values(transpose(base.grad(), 0, 1));
  for (size_t i = 0; i < yv.size(); ++i) {
    bool kept = yv[i] != 0;
    CHECK(yv[i] == doctest::Approx(kept ? xv[i] * 2 : 0.0));
    CHECK(gx[i] == doctest::Approx(kept ? gv[i] * 2 : 0.0));
  }
}

TEST_CASE("dropout bad input") {
  Tensor x = t32({1, 2}, {2});
  CHECK_THROWS_MSG(dropout(x, 1.0, true), ValueError, "[dropout]", "[0, 1)", "1");
  CHECK_THROWS_MSG(dropout(x, -0.1, true), ValueError, "[dropout]", "-0.1");
  CHECK_THROWS_MSG(dropout(x, std::nan(""), false), ValueError, "[dropout]", "nan");
  CHECK_THROWS_MSG(dropout(ti64({1}, {1}), 0.5, true), DTypeError, "[dropout]", "int64");
}

// The drops dropout() gave entries of a (G, R, L) tensor, read at gathered columns (repeats
// too): a mid-stream generator's counters, rows enough for several parallel chunks.
std::vector<Tensor> dropout_scale_at_case(DType dt, Device device) {
  const int64_t G = 3, R = 700, L = 50, T = 9;
  Generator g1(31), g2(31);
  g1.reserve(4321);
  g2.reserve(4321);
  const Tensor full = dropout(Tensor::ones({G, R, L}, dt, device), 0.35, true, g1);
  Generator gc(32);  // the columns from a stream of their own
  const Tensor cols = randint(0, L, {G, R, T}, gc).to(device);
  // g2 is g1 before the dropout: its key and first counter are the ones dropout() drew from
  const Tensor got = ops::dropout_scale_at(cols, L, 0.35, g2.seed(), g2.offset(), dt);
  return {gather(full, 2, cols), got};
}

TEST_CASE("dropout_scale_at: the drops dropout() gave gathered entries, in every float dtype") {
  for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
    CAPTURE(dt);
    const std::vector<Tensor> r = dropout_scale_at_case(dt, Device::cpu());
    CHECK(r[1].dtype() == dt);
    CHECK(r[1].shape() == r[0].shape());
    CHECK(max_abs_diff(r[0], r[1]) == 0.0);
    const std::vector<double> got = values(r[1]);
    const auto dropped = std::count(got.begin(), got.end(), 0.0);
    CHECK(dropped > 0);
    CHECK(dropped < int64_t(got.size()));
  }
  // Rate 0: ones, nothing drawn; a strided cols reads its own elements.
  const Tensor cols = transpose(Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {2, 3}), 0, 1);
  CHECK(values(ops::dropout_scale_at(cols, 6, 0.0, 1, 0, kFloat32)) == std::vector<double>(6, 1.0));
  const std::vector<double> got = values(ops::dropout_scale_at(cols, 6, 0.5, 8, 0, kFloat64));
  // cols (3, 2) holds rows {0, 3}, {1, 4}, {2, 5}: row r of cols reads counters r * 6 + cols.
  Generator g4(8);
  const std::vector<double> three_rows = values(dropout(Tensor::ones({3, 6}, kFloat64), 0.5, true, g4));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t t = 0; t < 2; ++t) CHECK(got[size_t(r * 2 + t)] == three_rows[size_t(r * 6 + r + 3 * t)]);
}

TEST_CASE("dropout_scale_at bad input") {
  const Tensor cols = ti64({0, 1}, {2});
  CHECK_THROWS_MSG(ops::dropout_scale_at(Tensor(), 4, 0.5, 1, 0, kFloat32), ValueError,
                   "[dropout_scale_at] argument 'cols' is an undefined tensor");
  CHECK_THROWS_MSG(ops::dropout_scale_at(t32({0, 1}, {2}), 4, 0.5, 1, 0, kFloat32), DTypeError,
                   "[dropout_scale_at] cols must be int64, got float32");
  CHECK_THROWS_MSG(ops::dropout_scale_at(Tensor::scalar(0.0, kInt64), 4, 0.5, 1, 0, kFloat32), ShapeError,
                   "[dropout_scale_at] cols must have at least one axis (rows of columns), got int64 ()");
  {  // the kernels' own contract: a column map of out's shape
    kernels::DropoutParams dp;
    dp.cols = ti64({0, 1, 2}, {3});
    dp.row_len = 4;
    Tensor x = Tensor::ones({2}, kFloat32), out = Tensor::empty({2}, kFloat32);
    CHECK_THROWS_MSG(kernels::dropout(x, out, dp), Error,
                     "[dropout] internal error: cols must be contiguous int64 of out's shape and device");
  }
  CHECK_THROWS_MSG(ops::dropout_scale_at(cols, 4, 0.5, 1, 0, kInt64), DTypeError,
                   "[dropout_scale_at] dtype must be a float dtype, got int64");
  CHECK_THROWS_MSG(ops::dropout_scale_at(cols, 4, 1.0, 1, 0, kFloat32), ValueError,
                   "[dropout_scale_at] expected p in [0, 1) and row_len >= 0, got p 1");
  CHECK_THROWS_MSG(ops::dropout_scale_at(cols, -1, 0.5, 1, 0, kFloat32), ValueError, "row_len -1");
}

CUDA_TEST_CASE("dropout_scale_at on CUDA gives the CPU's drops") {
  for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
    CAPTURE(dt);
    const std::vector<Tensor> cpu = dropout_scale_at_case(dt, Device::cpu());
    const std::vector<Tensor> gpu = dropout_scale_at_case(dt, Device::cuda(0));
    CHECK(max_abs_diff(gpu[1].to(Device::cpu()), cpu[1]) == 0.0);
    CHECK(max_abs_diff(gpu[1].to(Device::cpu()), gpu[0].to(Device::cpu())) == 0.0);
  }
}

GRADCHECK_CASE(dropout) {
  // A fresh generator per call: every evaluation of f draws the same mask.
  check_grad("dropout",
             [](const std::vector<Tensor>& x) {
               Generator g(77);
               return dropout(x[0], 0.4, true, g);
             },
             {leaf64({4, 5}, 71)});
}

}

TEST_CASE("softmax's vectorised exp matches std::exp to float32 rounding over its whole range") {
  // exp_shifted serves rows shifted by their maximum: arguments in [-inf, 0].
  std::vector<float> x;
  for (int i = 0; i <= 200000; ++i) x.push_back(-100.0f * float(i) / 200000.0f);
  x.push_back(-INFINITY);
  x.push_back(NAN);
  x.push_back(-0.0f);
  std::vector<float> y(x.size());
  kernels::exp_shifted(x.data(), y.data(), int64_t(x.size()), 0.0f);
  double worst = 0;
  for (size_t i = 0; i + 3 < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    if (x[i] < -87.0f) {
      CHECK(y[i] == 0.0f);  // below the normal range: 0, documented
    } else {
      worst = std::max(worst, std::fabs(double(y[i]) - want) / want);
    }
  }
  CHECK(worst < 3e-7);
  CHECK(y[x.size() - 3] == 0.0f);
  CHECK(std::isnan(y[x.size() - 2]));
  CHECK(y[x.size() - 1] == 1.0f);
  // max_row (vector and tail paths) skips NaN like the scalar loop it replaced.
  std::vector<float> row(21);
  for (int i = 0; i < 21; ++i) row[size_t(i)] = float((i * 7) % 11) - 5.0f;
  row[3] = NAN;
  CHECK(kernels::max_row(row.data(), 21, -INFINITY) == 5.0f);
  row[20] = 9.0f;  // in the scalar tail
  CHECK(kernels::max_row(row.data(), 21, -INFINITY) == 9.0f);
  std::vector<float> masked(9, -INFINITY);
  CHECK(kernels::max_row(masked.data(), 9, -INFINITY) == -INFINITY);
  // The shift is subtracted first: exp(x - 3) with x = 3 is 1 exactly.
  float three = 3.0f, out = 0;
  kernels::exp_shifted(&three, &out, 1, 3.0f);
  CHECK(out == 1.0f);
}

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of dropout (kernels/dropout/dropout_cuda.cu): the same Philox
// mask as the CPU for the same seed, forward and backward.

TEST_SUITE("ops/nn_functional") {

// ---------------------------------------------------------------- dropout

PARITY_CASE(dropout) {
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

}  // TEST_SUITE

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of the fused row ops softmax, log_softmax, layer_norm and
// cross_entropy: every layout and axis, long and short rows, float64 gradchecks
// on CUDA and the bad-target error; float32 accumulates in double on both
// devices, so the default tolerances hold.

TEST_SUITE("ops/nn_functional") {

namespace {
void softmax_cases(const char* op, bool log) {
  auto f = [log](const Tensor& x, int64_t axis) { return log ? log_softmax(x, axis) : softmax(x, axis); };
  uint64_t seed = 70;
  for (int64_t axis : {0, 1, 2, -1})
    parity_layouts(op, [f, axis](const Tensor& x) { return f(x, axis); }, {3, 4, 5}, seed += 3);
  // Strided gradient too: the output is transposed back, so the incoming g is a view.
  check_parity(op, [f](const Inputs& x) { return transpose(f(transpose(x[0], 0, 1), 1), 0, 1); },
               {leaf32({50, 30}, 80)});
  // Every row-length regime: warp kernels (VPT 1..32), block kernels cached
  // (<= 4096, the attention range) and uncached (5000), many short rows; large logits.
  // Contiguous float rows with n % 4 == 0 take the float4 slots (100, 132, 500 and
  // 1500 with a partly filled last slot group), the others the scalar slots.
  for (int64_t n : {1, 7, 32, 64, 100, 128, 130, 132, 256, 500, 1024, 1026, 1500, 2048, 4096, 5000})
    check_parity(op, [f](const Inputs& x) { return f(mul(x[0], 4.0), -1); }, {leaf32({16, n}, 81 + uint64_t(n))});
  // A contiguous view at an odd element offset: rows not 16-byte aligned, scalar slots.
  check_parity(op, [f](const Inputs& x) { return f(reshape(slice(x[0], 0, 1, 1 + 16 * 128), {16, 128}), -1); },
               {leaf32({1 + 16 * 128}, 79)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {leaf32({4096, 8}, 82)});  // strided rows
  check_parity(op, [f](const Inputs& x) { return f(x[0], -1); }, {leaf32({20000, 7}, 83)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {leaf32({8, 3000, 4}, 84)});
  // Masked rows (all -inf: zeros for softmax), partly masked rows, NaN; forward only.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = t32({-inf, -inf, -inf, -inf, 1, -inf, 2, 0, 1, nan, 2, 3, -inf, nan, -inf, -inf}, {4, 4});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {special}, fwd);
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {special}, fwd);
  for (int64_t n : {256, 3000}) {  // fully masked rows in the float4 warp and block kernels
    Tensor masked = Tensor::full({2, n}, -double(inf), kFloat32);
    check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {masked}, fwd);
  }
  // A scalar and an empty tensor.
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {leaf32({}, 85)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {leaf32({0, 5}, 86)});
}
}  // namespace

PARITY_CASE(softmax) {
  softmax_cases("softmax", false);
  for (int64_t axis : {0, 1, -1})
    check_grad_cuda("softmax", [axis](const std::vector<Tensor>& x) { return softmax(x[0], axis); },
                    {leaf64({3, 4, 2}, 11, -2, 2)});
  check_grad_cuda("softmax",
                  [](const std::vector<Tensor>& x) { return transpose(softmax(transpose(x[0], 0, 1), 1), 0, 1); },
                  {leaf64({5, 3}, 12, -2, 2)});
}

PARITY_CASE(log_softmax) {
  softmax_cases("log_softmax", true);
  for (int64_t axis : {0, 1})
    check_grad_cuda("log_softmax", [axis](const std::vector<Tensor>& x) { return log_softmax(x[0], axis); },
                    {leaf64({4, 3}, 13, -2, 2)});
  check_grad_cuda("log_softmax",
                  [](const std::vector<Tensor>& x) { return log_softmax(transpose(x[0], 0, 1), 0); },
                  {leaf64({3, 5}, 14, -2, 2)});
}

PARITY_CASE(layer_norm) {
  using V = std::vector<Tensor>;
  // Row lengths across the warp / block / uncached regimes; every weight/bias combination.
  uint64_t seed = 100;
  // (100, 768, 1024, 3000: float4 slots; 4, 32, 130: scalar; 5000: uncached rows.)
  for (int64_t n : {4, 32, 100, 130, 768, 1024, 3000, 5000}) {
    const int64_t rows = n >= 1000 ? 6 : 37;
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, x[1], x[2]); },
                 {leaf32({rows, n}, seed), leaf32({n}, seed + 1), leaf32({n}, seed + 2)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, x[1]); },
                 {leaf32({rows, n}, seed + 3), leaf32({n}, seed + 4)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, Tensor(), x[1]); },
                 {leaf32({rows, n}, seed + 5), leaf32({n}, seed + 6)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}); }, {leaf32({rows, n}, seed + 7)});
    seed += 10;
  }
  // Two normalised axes; non-contiguous x (copied by the op); offset mean.
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {3, 5}, x[1], x[2], 1e-3); },
               {leaf32({4, 3, 5}, 200), leaf32({3, 5}, 201), leaf32({3, 5}, 202)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(transpose(x[0], 0, 1), {7}, x[1], x[2]); },
               {leaf32({7, 9}, 203), leaf32({7}, 204), leaf32({7}, 205)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(add(x[0], 100.0), {64}, x[1]); },
               {leaf32({9, 64}, 206), leaf32({64}, 207)});
  // A contiguous x at an odd element offset: unaligned rows take the scalar slots.
  check_parity("layer_norm",
               [](const V& x) { return layer_norm(reshape(slice(x[0], 0, 1, 1 + 9 * 128), {9, 128}), {128}, x[1]); },
               {leaf32({1 + 9 * 128}, 220), leaf32({128}, 221)});
  // Many rows: the weight/bias column sums split into row chunks (two-stage), and
  // many columns with few rows (one stage).
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {64}, x[1], x[2]); },
               {leaf32({20000, 64}, 208), leaf32({64}, 209), leaf32({64}, 210)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {256}, x[1], x[2]); },
               {leaf32({4096, 256}, 211), leaf32({256}, 212), leaf32({256}, 213)});
  // Only the affine parameters require grad; an empty batch.
  Tensor xc = leaf32({50, 3}, 214).detach();
  check_parity("layer_norm", [xc](const V& x) { return layer_norm(xc.to(x[0].device()), {3}, x[0], x[1]); },
               {leaf32({3}, 215), leaf32({3}, 216)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {5}, x[1], x[2]); },
               {leaf32({0, 5}, 217), leaf32({5}, 218), leaf32({5}, 219)});
  // float64 gradchecks of tests/ops/test_nn_functional.cpp.
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(x[0], {4}, x[1], x[2]); },
                  {leaf64({3, 4}, 31), leaf64({4}, 32), leaf64({4}, 33)});
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(x[0], {2, 3}, x[1], Tensor(), 1e-3); },
                  {leaf64({2, 2, 3}, 34), leaf64({2, 3}, 35)});
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(transpose(x[0], 0, 1), {3}); },
                  {leaf64({3, 4}, 36)});
  Tensor x64 = leaf64({5, 3}, 37).detach().to(Device::cuda(0));
  check_grad_cuda("layer_norm", [x64](const V& x) { return layer_norm(x64, {3}, x[0], x[1]); },
                  {leaf64({3}, 38), leaf64({3}, 39)});
}

PARITY_CASE(cross_entropy) {
  using V = std::vector<Tensor>;
  // Every reduction with and without label smoothing, (N, C) warp-per-sample path.
  const Tensor t = rand_targets({300}, 10, 1);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double ls : {0.0, 0.15}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = ls;
      check_parity("cross_entropy", [o](const V& x) { return cross_entropy(x[0], x[1], o); },
                   {leaf32({300, 10}, 300, -3, 3), t});
    }
  // (N, C, d1, d2) with a custom ignore_index and smoothing (thread-per-sample path),
  // through a permuted view (copied by the op).
  CrossEntropyOptions o3;
  o3.ignore_index = 3;
  o3.label_smoothing = 0.25;
  const Tensor t3 = rand_targets({4, 6, 5}, 7, 2, 3);
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(x[0], x[1], o3); },
               {leaf32({4, 7, 6, 5}, 301, -3, 3), t3});
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(permute(x[0], {0, 3, 1, 2}), x[1], o3); },
               {leaf32({4, 6, 5, 7}, 302, -3, 3), t3});
  o3.reduction = Reduction::None;
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(x[0], x[1], o3); },
               {leaf32({4, 7, 6, 5}, 303, -3, 3), t3});
  // Large C (block per sample), many samples, one sample, an empty batch, all ignored.
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({6, 30000}, 304, -5, 5), rand_targets({6}, 30000, 3)});
  CrossEntropyOptions ls;
  ls.label_smoothing = 0.1;
  check_parity("cross_entropy", [ls](const V& x) { return cross_entropy(x[0], x[1], ls); },
               {leaf32({50000, 10}, 305, -3, 3), rand_targets({50000}, 10, 4)});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({1, 5}, 306), ti64({4}, {1})});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({0, 5}, 307), Tensor::zeros({0}, kInt64)});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({3, 5}, 308), ti64({-100, -100, -100}, {3})});
  // A bad target: the CPU's IndexError, same message (first bad position), at the
  // next host read (a deferred check, core/cuda.h).
  for (const Tensor& bad : {ti64({1, 7, -100, -3}, {4}), ti64({-100, -100, 0, 5}, {4})}) {
    Tensor x = leaf32({4, 5}, 309).detach();
    const std::string cpu = error_of([&] { cross_entropy(x, bad); });
    const std::string gpu = error_of([&] { cross_entropy(cuda0(x), cuda0(bad)).cpu(); });
    CHECK(cpu.find("out of range") != std::string::npos);
    CHECK(gpu == cpu);
    CHECK_THROWS_AS(cross_entropy(cuda0(x), cuda0(bad)).cpu(), IndexError);
  }
  // The mean's divisor stays on the device: a training step's loss and gradient make
  // no host round trip (the count of non-ignored samples used to be read back).
  {
    Tensor x = cuda0(leaf32({6, 5}, 310).detach()).set_requires_grad(true);
    const Tensor t = cuda0(ti64({0, -100, 4, 2, -100, 1}, {6}));
    cuda::synchronize();
    const cuda::TransferStats before = cuda::transfer_stats();
    cross_entropy(x, t).backward();
    const cuda::TransferStats d = cuda::transfer_stats() - before;
    CHECK(d.device_to_host == 0);
    CHECK(d.synchronizations == 0);
    Tensor xc = x.cpu().detach().set_requires_grad(true);
    Tensor lc = cross_entropy(xc, t.cpu());
    lc.backward();
    CHECK(std::abs(cross_entropy(x.detach(), t).item<float>() - lc.item<float>()) < 1e-6f);
    check_close_rel(x.grad(), xc.grad(), 1e-6, 1e-5, "cross_entropy grad");
    // Every target ignored: cf's mean is 0 (not PyTorch's NaN), on both devices.
    const Tensor none = cuda0(ti64({-100, -100}, {2}));
    CHECK(cross_entropy(cuda0(leaf32({2, 5}, 311).detach()), none).item<float>() == 0.0f);
  }
  // float64 gradchecks of tests/ops/test_nn_functional.cpp.
  const Tensor tg = cuda0(ti64({2, 0, -100, 4, 1}, {5}));
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double s : {0.0, 0.15}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = s;
      check_grad_cuda("cross_entropy", [tg, o](const V& x) { return cross_entropy(x[0], tg, o); },
                      {leaf64({5, 5}, 51, -2, 2)});
    }
  const Tensor tg3 = cuda0(ti64({0, 3, 2, 1, 3, 0}, {2, 3}));
  CrossEntropyOptions og;
  og.ignore_index = 3;
  og.label_smoothing = 0.25;
  check_grad_cuda("cross_entropy",
                  [tg3, og](const V& x) { return cross_entropy(permute(x[0], {0, 2, 1}), tg3, og); },
                  {leaf64({2, 3, 4}, 52, -2, 2)});
}


TEST_CASE("l2_normalize equals x / sqrt(sum x^2 + eps) composed of tensor ops, values and gradients") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    const double tol = dt == kFloat64 ? 1e-13 : 2e-6;
    Generator gen(3);
    Tensor x0 = rand({3, 5, 37}, dt, gen, -2, 2);
    // a zero row, and a transposed (strided) input
    x0 = cat({x0, Tensor::zeros({1, 5, 37}, dt)}, 0);
    for (bool strided : {false, true}) {
      auto run = [&](bool fused) {
        Tensor x = x0.detach();
        x.set_requires_grad(true);
        const Tensor xin = strided ? transpose(x, 0, 2) : x;
        Tensor y = fused ? l2_normalize(xin) : xin * rsqrt(sum(square(xin), {-1}, true) + 1e-12);
        Generator gw(9);
        sum(y * rand(y.shape(), dt, gw, -1, 1)).backward();
        return std::vector<Tensor>{y, x.grad()};
      };
      const std::vector<Tensor> f = run(true), r = run(false);
      check_close(f[0], r[0], tol);
      check_close(f[1], r[1], tol);
    }
  }
  // eps, 16-bit inputs, autocast, one kernel call each way
  check_close(l2_normalize(t64({3, 4}, {1, 2}), 11.0), {0.5, 4.0 / 6.0}, 1e-15);
  Tensor h = to(t64({3, 4, 0, 0}, {2, 2}), kBFloat16);
  CHECK(l2_normalize(h).dtype() == kBFloat16);
  check_close(l2_normalize(h), {0.6, 0.8, 0, 0}, 4e-3);
  {
    AutocastGuard guard(kBFloat16);
    CHECK(l2_normalize(h).dtype() == kFloat32);
  }
  Tensor x = leaf64({4, 6}, 3);
  const KernelCalls before = kernel_calls();
  Tensor y = l2_normalize(x);
  CHECK((kernel_calls() - before).cpu == 1);
  CHECK_THROWS_MSG(l2_normalize(Tensor::scalar(1.0)), ShapeError, "[l2_normalize] x needs an axis");
  CHECK_THROWS_MSG(l2_normalize(ti64({1, 2}, {2})), DTypeError, "[l2_normalize]");
  CHECK_THROWS_MSG(l2_normalize(x, -1.0), ValueError, "[l2_normalize] eps must be finite and > 0");
  CHECK_THROWS_MSG(l2_normalize(x, 0.0), ValueError, "[l2_normalize] eps must be finite and > 0, got 0");
}

GRADCHECK_CASE(l2_normalize) {
  check_grad("l2_normalize", [](const std::vector<Tensor>& in) { return l2_normalize(in[0]); }, {leaf64({3, 4, 5}, 31)});
  check_grad("l2_normalize", [](const std::vector<Tensor>& in) { return l2_normalize(transpose(in[0], 0, 1), 0.5); },
             {leaf64({4, 3}, 32, -0.1, 0.1)});
}

PARITY_CASE(l2_normalize) {
  check_parity("l2_normalize", [](const Inputs& in) { return l2_normalize(in[0]); }, {leaf32({2, 4, 300, 64}, 41)});
  check_parity("l2_normalize", [](const Inputs& in) { return l2_normalize(in[0]); }, {leaf32({7, 1000}, 42)});
  check_parity("l2_normalize", [](const Inputs& in) { return l2_normalize(transpose(in[0], 0, 1), 1e-3); },
               {leaf32({5, 3}, 43)});
  check_parity("l2_normalize", [](const Inputs& in) { return l2_normalize(in[0]); }, {leaf32({0, 8}, 44)});
  check_grad_cuda("l2_normalize", [](const std::vector<Tensor>& in) { return l2_normalize(in[0]); },
                  {leaf64({3, 4, 5}, 45)});
}

}  // TEST_SUITE
