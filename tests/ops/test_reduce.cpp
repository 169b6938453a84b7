#include <cmath>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/reduce") {

// Naive reference: reduce a (2,3,4) tensor over `axes` with fold f.
static std::vector<double> naive(const std::vector<double>& v, const Shape& shape, const Axes& axes,
                                 const std::function<double(const std::vector<double>&)>& f) {
  Shape out_shape = shape;
  for (int64_t a : axes) out_shape[size_t(a)] = 1;
  std::vector<std::vector<double>> groups(size_t(numel_of(out_shape)));
  Shape st = contiguous_strides(shape), ost = contiguous_strides(out_shape);
  for (int64_t i = 0; i < numel_of(shape); ++i) {
    int64_t rem = i, o = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t idx = rem / st[d];
      rem %= st[d];
      if (out_shape[d] != 1) o += idx * ost[d];
    }
    groups[size_t(o)].push_back(v[size_t(i)]);
  }
  std::vector<double> r;
  for (auto& g : groups) r.push_back(f(g));
  return r;
}

TEST_CASE("reductions match a naive reference on every axis set") {
  Generator gen(3);
  Shape shape{2, 3, 4};
  Tensor x = randn(shape, kFloat64, gen);
  auto v = x.to_vector<double>();
  auto fsum = [](const std::vector<double>& g) { double s = 0; for (double a : g) s += a; return s; };
  auto fmean = [&](const std::vector<double>& g) { return fsum(g) / double(g.size()); };
  auto fmax = [](const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); };
  auto fmin = [](const std::vector<double>& g) { return *std::min_element(g.begin(), g.end()); };
  auto fvar = [&](const std::vector<double>& g) {
    double m = fmean(g), s = 0;
    for (double a : g) s += (a - m) * (a - m);
    return s / double(g.size() - 1);
  };
  auto flse = [&](const std::vector<double>& g) {
    double m = fmax(g), s = 0;
    for (double a : g) s += std::exp(a - m);
    return m + std::log(s);
  };
  for (Axes axes : {Axes{0}, Axes{1}, Axes{2}, Axes{0, 2}, Axes{1, 2}, Axes{0, 1, 2}}) {
    INFO("axes size ", axes.size(), " first ", axes[0]);
    check_close(sum(x, axes), naive(v, shape, axes, fsum), 1e-12);
    check_close(mean(x, axes), naive(v, shape, axes, fmean), 1e-12);
    check_close(amax(x, axes), naive(v, shape, axes, fmax), 0);
    check_close(amin(x, axes), naive(v, shape, axes, fmin), 0);
    check_close(var(x, axes), naive(v, shape, axes, fvar), 1e-12);
    check_close(logsumexp(x, axes), naive(v, shape, axes, flse), 1e-12);
  }
  // On a permuted (non-contiguous) view.
  Tensor p = permute(x, {2, 0, 1});
  check_close(sum(p, {0}), naive(v, shape, {2}, fsum), 1e-12);
  // keepdim and negative axes.
  CHECK(sum(x, {-1}, true).shape() == Shape{2, 3, 1});
  CHECK(sum(x).dim() == 0);
  // float32 and int64 inputs.
  check_close(sum(ti64({1, 2, 3, 4}, {2, 2}), {1}), {3, 7});
  CHECK(sum(ti64({1, 2}, {2})).dtype() == kInt64);
  CHECK(sum(Tensor::from_vector(std::vector<bool>{true, false, true}, {3})).item() == 2.0);
  check_close(mean(t32({1, 2, 3, 4}, {4})), {2.5});
}

TEST_CASE("max/min with indices, argmax, NaN and infinities") {
  Tensor x = t64({1, 7, 7, 2, -1, -5}, {2, 3});
  ValuesIndices m = max(x, 1);
  check_close(m.values, {7, 2});
  CHECK(m.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0});  // first maximum wins
  CHECK(min(x, 1).indices.to_vector<int64_t>() == std::vector<int64_t>{0, 2});
  CHECK(argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
  CHECK(argmin(x, 0, true).shape() == Shape{1, 3});
  double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor n = t64({1, nan, 3}, {3});
  CHECK(std::isnan(amax(n).item()));
  CHECK(std::isnan(max(n, 0).values.item()));
  CHECK(logsumexp(t64({-inf, -inf}, {2})).item() == -inf);
  CHECK(std::fabs(logsumexp(t64({1000, 1000}, {2})).item() - (1000 + std::log(2.0))) < 1e-9);
}

TEST_CASE("a large reduction runs in parallel and matches the serial sum") {
  Generator gen(5);
  Tensor x = rand({512, 1024}, kFloat64, gen);
  auto v = x.to_vector<double>();
  std::vector<double> rows(512, 0.0);
  for (size_t i = 0; i < 512; ++i)
    for (size_t j = 0; j < 1024; ++j) rows[i] += v[i * 1024 + j];
  check_close(sum(x, {1}), rows, 1e-9);
  std::vector<double> cols(1024, 0.0);
  for (size_t i = 0; i < 512; ++i)
    for (size_t j = 0; j < 1024; ++j) cols[j] += v[i * 1024 + j];
  check_close(sum(x, {0}), cols, 1e-9);
}

TEST_CASE("a whole-tensor sum splits the region over threads, same bits at any thread count") {
  Generator gen(8);
  Tensor x = rand({300, 700}, kFloat64, gen);  // 210000 elements: the chunked path
  auto v = x.to_vector<double>();
  double serial = 0;
  for (double a : v) serial += a;
  CHECK(std::fabs(sum(x).item() - serial) < 1e-8);
  CHECK(std::fabs(mean(x).item() - serial / double(v.size())) < 1e-12);
  // A permuted view walks a two-axis reduced region with strides.
  CHECK(std::fabs(sum(transpose(x, 0, 1)).item() - serial) < 1e-8);
  // Two outputs, each a large region.
  Tensor y = reshape(x, {2, 150, 700});
  std::vector<double> halves(2, 0.0);
  for (size_t i = 0; i < v.size(); ++i) halves[i / 105000] += v[i];
  check_close(sum(y, {1, 2}), halves, 1e-8);
  Tensor xi = randint(-5, 5, {200000}, gen);
  int64_t isum = 0;
  for (int64_t a : xi.to_vector<int64_t>()) isum += a;
  CHECK(sum(xi).item<int64_t>() == isum);
#ifdef _OPENMP
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  double one = sum(x).item();
  omp_set_num_threads(2);
  double two = sum(x).item();
  omp_set_num_threads(threads);
  CHECK(one == two);
#endif
}

TEST_CASE("reduce bad input") {
  Tensor x = Tensor::zeros({2, 3});
  CHECK_THROWS_MSG(sum(x, {2}), IndexError, "[sum]", "axis 2");
  CHECK_THROWS_MSG(sum(x, {1, -1}), IndexError, "[sum]", "repeated");
  CHECK_THROWS_MSG(mean(ti64({1}, {1})), DTypeError, "[mean]", "int64");
  CHECK_THROWS_MSG(var(x, {0}, 2), ShapeError, "[var]", "2 elements");
  CHECK_THROWS_MSG(max(Tensor::zeros({0, 3}), 0), ShapeError, "[max]", "empty", "(0,3)");
  CHECK_THROWS_MSG(amax(Tensor::from_vector(std::vector<bool>{true}, {1})), DTypeError, "[amax]", "bool");
  CHECK_THROWS_MSG(logsumexp(x, {5}), IndexError, "[logsumexp]", "axis 5");
  CHECK_THROWS_MSG(argmax(x, 3), IndexError, "[max]", "axis 3");
  CHECK_THROWS_MSG(sum_to(x, {3, 3}), ShapeError, "[sum_to]", "(2,3)", "(3,3)");
  CHECK_THROWS_MSG(sum(Tensor()), ValueError, "[sum]", "undefined");
}

GRADCHECK_CASE("sum") {
  check_grad("sum", [](auto& x) { return sum(x[0], {0, 2}); }, {leaf64({2, 3, 2})});
  check_grad("sum", [](auto& x) { return sum(x[0], {1}, true); }, {leaf64({2, 3})});
}
GRADCHECK_CASE("mean") { check_grad("mean", [](auto& x) { return mean(x[0], {1}); }, {leaf64({2, 3})}); }
GRADCHECK_CASE("var") {
  check_grad("var", [](auto& x) { return var(x[0], {1}); }, {leaf64({2, 4})});
  check_grad("var", [](auto& x) { return var(x[0], {}, 0); }, {leaf64({2, 4})});
}
GRADCHECK_CASE("logsumexp") {
  check_grad("logsumexp", [](auto& x) { return logsumexp(x[0], {0}); }, {leaf64({3, 2})});
}
GRADCHECK_CASE("amax") {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("amax", [](auto& v) { return amax(v[0], {1}); }, {x});
}
GRADCHECK_CASE("amin") {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("amin", [](auto& v) { return amin(v[0], {0, 1}); }, {x});
}
GRADCHECK_CASE("max") {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("max", [](auto& v) { return max(v[0], 1).values; }, {x});
}
GRADCHECK_CASE("min") {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("min", [](auto& v) { return min(v[0], 0, true).values; }, {x});
}

TEST_CASE("amax shares the gradient between tied maxima") {
  Tensor x = t64({3, 3, 1}, {3}).set_requires_grad(true);
  amax(x).backward();
  check_close(x.grad(), {0.5, 0.5, 0});
}

}
