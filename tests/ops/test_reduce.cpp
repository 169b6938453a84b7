#include <cmath>
#include <limits>

#include "test_util.h"
#include "cuda/cuda_test_util.h"
#include <functional>
#include <random>
#include <string>

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
  // A NaN gives NaN, as in PyTorch (it was skipped by the maximum: [NaN, NaN] gave -inf).
  for (const std::vector<double>& row : std::vector<std::vector<double>>{{nan, nan}, {nan, -inf}, {inf, nan}, {1, nan}})
    CHECK(std::isnan(logsumexp(t64(row, {2})).item()));
  CHECK(logsumexp(t64({inf, inf}, {2})).item() == inf);
  CHECK(std::isnan(logsumexp(to(t64({1, nan, 2}, {3}), kBFloat16)).item()));
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

TEST_CASE("short reductions over many outputs of a strided view, split over threads, match a naive loop") {
  // Each thread's chunk of outputs starts inside the kept axes' index space, and the offsets of the
  // outputs after it are stepped, not recomputed: a wrong step shows up here.
  Generator gen(9);
  const Tensor base = randn({7, 4, 61, 47}, kFloat32, gen);
  const Tensor x = permute(base, {2, 0, 3, 1});  // (61, 7, 47, 4), reduced over its last axis (stride 2867)
  const std::vector<float> v = base.to_vector<float>();
  std::vector<float> want_max, want_min;
  std::vector<int64_t> want_imax;
  std::vector<double> want_sum;
  // 20,069 outputs of 4, a grain of 8,192 outputs: on two threads the second chunk starts at
  // output 10,035 = (30, 3, 24), inside every kept axis
  for (int64_t a = 0; a < 61; ++a)
    for (int64_t b = 0; b < 7; ++b)
      for (int64_t c = 0; c < 47; ++c) {
        float mx = 0, mn = 0;
        int64_t imax = 0;
        double s = 0;
        for (int64_t d = 0; d < 4; ++d) {
          const float e = v[size_t(((b * 4 + d) * 61 + a) * 47 + c)];
          if (d == 0 || e > mx) { mx = e; imax = d; }
          if (d == 0 || e < mn) mn = e;
          s += double(e);
        }
        want_max.push_back(mx);
        want_min.push_back(mn);
        want_imax.push_back(imax);
        want_sum.push_back(s);
      }
  for (int threads : {1, 2, 3}) {
    NumThreadsGuard count(threads);
    CAPTURE(threads);
    const ValuesIndices m = max(x, -1);
    CHECK(m.values.to_vector<float>() == want_max);
    CHECK(m.indices.to_vector<int64_t>() == want_imax);
    CHECK(min(x, -1).values.to_vector<float>() == want_min);
    check_close(sum(x, {-1}), want_sum, 1e-6);
  }
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
  const double one = (NumThreadsGuard(1), sum(x).item());
  const double two = (NumThreadsGuard(2), sum(x).item());
  CHECK(one == two);
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
  CHECK_THROWS_MSG(argmax(x, 3), IndexError, "[argmax]", "axis 3");
  CHECK_THROWS_MSG(sum_to(x, {3, 3}), ShapeError, "[sum_to]", "(2,3)", "(3,3)");
  CHECK_THROWS_MSG(sum(Tensor()), ValueError, "[sum]", "undefined");
  CHECK_THROWS_MSG(var(x, {0}, -1), ValueError, "[var] correction must be >= 0, got -1");
  // A 0-d tensor takes axis 0 or -1, reducing nothing (PyTorch's rule); any other axis is out of range.
  Tensor s = Tensor::scalar(2.5, kFloat64);
  CHECK(sum(s, {0}).dim() == 0);
  CHECK(values(sum(s, {-1}))[0] == 2.5);
  CHECK(values(logsumexp(s, {0}))[0] == 2.5);
  CHECK(values(amax(s, {0}, true))[0] == 2.5);
  CHECK(values(var(s, {0}, 0))[0] == 0.0);
  CHECK_THROWS_MSG(sum(s, {1}), IndexError, "[sum] axis 1 is out of range for a tensor of 0 dimensions");
  CHECK_THROWS_MSG(mean(s, {0, -1}), IndexError, "[mean] repeated axis");
  CHECK_THROWS_MSG(mean(s, {0, 2}), IndexError, "[mean] axis 2 is out of range");
}

GRADCHECK_CASE(sum) {
  check_grad("sum", [](auto& x) { return sum(x[0], {0, 2}); }, {leaf64({2, 3, 2})});
  check_grad("sum", [](auto& x) { return sum(x[0], {1}, true); }, {leaf64({2, 3})});
}
GRADCHECK_CASE(mean) {
  check_grad("mean", [](auto& x) { return mean(x[0], {1}); }, {leaf64({2, 3})});
  check_grad("mean", [](auto& x) { return mean(x[0]); }, {leaf64({2, 3})});  // every axis
  check_grad("mean", [](auto& x) { return mean(x[0], {0, 2}, true); }, {leaf64({2, 3, 2})});
}
GRADCHECK_CASE(var) {
  check_grad("var", [](auto& x) { return var(x[0], {1}); }, {leaf64({2, 4})});
  check_grad("var", [](auto& x) { return var(x[0], {}, 0); }, {leaf64({2, 4})});
  check_grad("var", [](auto& x) { return var(x[0], {0, 2}, 1, true); }, {leaf64({3, 2, 4})});
}
GRADCHECK_CASE(logsumexp) {
  check_grad("logsumexp", [](auto& x) { return logsumexp(x[0], {0}); }, {leaf64({3, 2})});
  check_grad("logsumexp", [](auto& x) { return logsumexp(x[0]); }, {leaf64({3, 2})});
  check_grad("logsumexp", [](auto& x) { return logsumexp(x[0], {0, 2}, true); }, {leaf64({2, 3, 2})});
  // A masked row (-inf next to finite scores, as attention's scores): the gradient is the finite
  // entries' softmax and exactly 0 at -inf, no NaN.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor m = t64({-inf, 0.0, std::log(3.0)}, {3}).set_requires_grad(true);
  logsumexp(m).backward();
  const std::vector<double> gm = m.grad().to_vector<double>();
  CHECK(gm[0] == 0.0);
  CHECK(gm[1] == doctest::Approx(0.25).epsilon(1e-15));
  CHECK(gm[2] == doctest::Approx(0.75).epsilon(1e-15));
}
GRADCHECK_CASE(amax) {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("amax", [](auto& v) { return amax(v[0], {1}); }, {x});
  check_grad("amax", [](auto& v) { return amax(v[0], {0}, true); }, {x});
}
GRADCHECK_CASE(amin) {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("amin", [](auto& v) { return amin(v[0], {0, 1}); }, {x});
}
GRADCHECK_CASE(max) {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("max", [](auto& v) { return max(v[0], 1).values; }, {x});
}
GRADCHECK_CASE(min) {
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad("min", [](auto& v) { return min(v[0], 0, true).values; }, {x});
}

TEST_CASE("amax shares the gradient between tied maxima") {
  Tensor x = t64({3, 3, 1}, {3}).set_requires_grad(true);
  amax(x).backward();
  check_close(x.grad(), {0.5, 0.5, 0});
}

}

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of the reductions (kernels/reduce/reduce_cuda.cu) and of the fused
// row ops softmax, log_softmax, layer_norm and cross_entropy against the CPU:
// contiguous and strided inputs (views made inside f, so both devices see the same
// strides), every axis choice, keepdim, long reductions (100000 elements, 1M,
// chunked multi-block paths) and many short rows, ties and NaN for max/min,
// int64 and bool where the CPU accepts them, empty reductions, float64 gradchecks
// on CUDA mirroring tests/ops, and the cross_entropy bad-target error.
//
// Tolerances: every kernel here accumulates float32 in double on both devices, so
// even the 1M-element sums round to within an ulp of each other and the default
// float32 tolerances (DESIGN.md section 4) hold; none is loosened.

namespace {
// Reduction cases shared by sum / mean / var / logsumexp / amax / amin.
void reduce_cases(const char* op, const std::function<Tensor(const Tensor&, const Axes&, bool)>& r) {
  uint64_t seed = 10;
  for (const Axes& axes : axis_sets())
    for (bool keep : {false, true})
      parity_layouts(op, [r, axes, keep](const Tensor& x) { return r(x, axes, keep); }, {4, 5, 6}, seed += 3);
  // Long rows: one block per output (100000 contiguous), chunked over several
  // blocks (one output), strided reduced axis with few outputs (column kernel, chunked).
  check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({100000}, 1)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({3, 100000}, 2)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {0}, true); }, {leaf32({100000, 3}, 3)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({1 << 20}, 4)});
  // Many short rows (thread per output), and rows of 33..1023 (warp per output).
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({20000, 5}, 5)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({3000, 300}, 6)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {0, 2}, false); }, {leaf32({7, 3000, 9}, 7)});
  // A scalar (var of one element needs correction 0: the var cases pass it separately).
  if (std::string(op) != "var")
    check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({}, 8)});
}

}  // namespace

TEST_SUITE("ops/reduce") {

PARITY_CASE(sum) {
  reduce_cases("sum", [](const Tensor& x, const Axes& a, bool k) { return sum(x, a, k); });
  // int64 (the CPU accumulates in int64) and bool (counted as int64).
  Tensor xi = ti64({3, -7, 12, 5, 0, 9, -2, 4, 8, 1, 1, 6}, {3, 4});
  for (const Axes& a : std::vector<Axes>{{}, {0}, {1}})
    check_parity("sum", [a](const Inputs& x) { return sum(x[0], a); }, {xi});
  check_parity("sum", [](const Inputs& x) { return sum(gt(x[0], 0.0), {1}); }, {leaf32({50, 7000}, 9)});
  check_parity("sum", [](const Inputs& x) { return sum(transpose(x[0], 0, 1), {0}); },
               {Tensor::full({1000, 300}, 3.0, kInt64)});
  // Empty reductions: an empty reduced axis gives zeros; an empty kept axis nothing.
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {1}); }, {leaf32({3, 0}, 10)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {0}); }, {leaf32({0, 3}, 11)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {1}); }, {leaf32({0, 3}, 12)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0]); }, {leaf32({0}, 13)});
  check_grad_cuda("sum", [](auto& x) { return sum(x[0], {0, 2}); }, {leaf64({2, 3, 2})});
  check_grad_cuda("sum", [](auto& x) { return sum(x[0], {1}, true); }, {leaf64({2, 3})});
}

PARITY_CASE(mean) {
  reduce_cases("mean", [](const Tensor& x, const Axes& a, bool k) { return mean(x, a, k); });
  check_grad_cuda("mean", [](auto& x) { return mean(x[0], {1}); }, {leaf64({2, 3})});
}

PARITY_CASE(var) {
  reduce_cases("var", [](const Tensor& x, const Axes& a, bool k) { return var(x, a, 1, k); });
  reduce_cases("var", [](const Tensor& x, const Axes& a, bool k) { return var(x, a, 0, k); });
  // Large mean against a small spread (where a one-pass E[x^2] - E[x]^2 would cancel).
  check_parity("var", [](const Inputs& x) { return var(add(x[0], 1000.0), {1}); }, {leaf32({4, 5000}, 14)});
  check_parity("var", [](const Inputs& x) { return var(x[0], {}, 0); }, {leaf32({}, 23)});
  check_grad_cuda("var", [](auto& x) { return var(x[0], {1}); }, {leaf64({2, 4})});
  check_grad_cuda("var", [](auto& x) { return var(x[0], {}, 0); }, {leaf64({2, 4})});
}

PARITY_CASE(logsumexp) {
  reduce_cases("logsumexp", [](const Tensor& x, const Axes& a, bool k) { return logsumexp(x, a, k); });
  // Large values (stability), -inf rows / entries, +inf and NaN (forward: the CPU's rules).
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(mul(x[0], 500.0), {1}); },
               {leaf32({6, 2000}, 15)});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = t32({-inf, -inf, -inf, -inf, 1, 2, -inf, 0, inf, 1, nan, 2, nan, nan, nan, 3, 4, 5, 6, nan,
                        inf, inf, 1, 2, nan, -inf, -inf, -inf},
                       {7, 4});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(x[0], {1}); }, {special}, fwd);
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(x[0], {0}); }, {special}, fwd);
  check_grad_cuda("logsumexp", [](auto& x) { return logsumexp(x[0], {0}); }, {leaf64({3, 2})});
}

PARITY_CASE(amax) {
  reduce_cases("amax", [](const Tensor& x, const Axes& a, bool k) { return amax(x, a, k); });
  // Ties (the gradient is shared between them) and NaN.
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {1}); }, {tied_leaf32({40, 30}, 16)});
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0, 1}); }, {tied_leaf32({40, 30}, 17)});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {1}); }, {with_nan32({4, 3000}, 18)}, fwd);
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0}); }, {with_nan32({4, 30}, 19)}, fwd);
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0}); },
               {ti64({3, -7, 12, 5, 0, 9, -2, 4, 8, 1, 1, 6}, {3, 4})});
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("amax", [](auto& v) { return amax(v[0], {1}); }, {x});
}

PARITY_CASE(amin) {
  reduce_cases("amin", [](const Tensor& x, const Axes& a, bool k) { return amin(x, a, k); });
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {1}); }, {tied_leaf32({40, 30}, 20)});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {1}); }, {with_nan32({4, 3000}, 21)}, fwd);
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {}); }, {with_nan32({300, 30}, 22)}, fwd);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("amin", [](auto& v) { return amin(v[0], {0, 1}); }, {x});
}


namespace {

// max/min/argmax/argmin along one axis: values (with gradient) and indices, every
// layout and axis, ties (first index wins), NaN (first NaN wins), int64, long rows.
void extremum_cases(const char* op, bool values, bool is_max) {
  auto run = [values, is_max](const Tensor& x, int64_t axis, bool keep) {
    if (values) return is_max ? max(x, axis, keep).values : min(x, axis, keep).values;
    return is_max ? argmax(x, axis, keep) : argmin(x, axis, keep);
  };
  auto idx = [is_max](const Tensor& x, int64_t axis, bool keep) {
    return is_max ? max(x, axis, keep).indices : min(x, axis, keep).indices;
  };
  uint64_t seed = 40;
  for (int64_t axis : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      parity_layouts(op, [run, axis, keep](const Tensor& x) { return run(x, axis, keep); }, {4, 5, 6}, seed += 3);
      if (values)  // the index output of the same call
        parity_layouts(op, [idx, axis, keep](const Tensor& x) { return idx(x, axis, keep); }, {4, 5, 6}, seed += 3);
    }
  ParityOptions fwd;
  fwd.backward = false;
  for (int64_t axis : {0, 1}) {
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); }, {tied_leaf32({64, 50}, 60)});
    check_parity(op, [idx, axis](const Inputs& x) { return idx(x[0], axis, false); }, {tied_leaf32({64, 50}, 61)});
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); }, {with_nan32({5, 2000}, 62)},
                 fwd);
    check_parity(op, [idx, axis](const Inputs& x) { return idx(x[0], axis, false); }, {with_nan32({5, 2000}, 63)},
                 fwd);
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); },
                 {ti64({3, -7, 12, 5, 12, 9, -7, 4, 8, 1, 1, 6}, {3, 4})});
  }
  // Long rows (block per output, chunked) and many short ones.
  check_parity(op, [run](const Inputs& x) { return run(x[0], 0, false); }, {leaf32({100000}, 64)});
  check_parity(op, [idx](const Inputs& x) { return idx(x[0], 1, false); }, {leaf32({2, 100000}, 65)});
  check_parity(op, [idx](const Inputs& x) { return idx(x[0], 0, false); }, {tied_leaf32({100000, 2}, 66, 50)});
  check_parity(op, [run](const Inputs& x) { return run(x[0], 1, true); }, {leaf32({30000, 3}, 67)});
}

}  // namespace

PARITY_CASE(max) {
  extremum_cases("max", true, true);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("max", [](auto& v) { return max(v[0], 1).values; }, {x});
}
PARITY_CASE(min) {
  extremum_cases("min", true, false);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("min", [](auto& v) { return min(v[0], 0, true).values; }, {x});
}
PARITY_CASE(argmax) { extremum_cases("argmax", false, true); }
PARITY_CASE(argmin) { extremum_cases("argmin", false, false); }


// ---------------- signed_argmax (LSH's hash) ----------------

// The two-reduction form it replaces: the larger of max(x) and -min(x), the x half on a tie.
Tensor signed_argmax_reference(const Tensor& x) {
  const int64_t n = x.shape().back();
  ValuesIndices hi = max(x, -1), lo = min(x, -1);
  return where(ge(hi.values, -lo.values), hi.indices, lo.indices + double(n));
}

// Rows with ties (small integers), signed zeros, NaN rows (first NaN at the start, the middle, the end),
// infinities, n = 1 and n = 37 (several rows per parallel chunk), a strided input.
std::vector<Tensor> signed_argmax_inputs(DType dt) {
  Generator g(5);
  std::vector<Tensor> xs;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(5), int64_t(37)}) {
    std::vector<double> v = to(randint(-2, 3, {3, 200, n}, g), kFloat64).to_vector<double>();
    const double nan = std::nan("");
    v[0] = nan;                              // row 0: NaN first
    if (n > 2) v[size_t(n + n / 2)] = nan;   // row 1: NaN in the middle
    v[size_t(3 * n - 1)] = nan;              // row 2: NaN last
    if (n > 1) {
      v[size_t(3 * n)] = -0.0;                // row 3: signed zeros only
      for (int64_t i = 1; i < n; ++i) v[size_t(3 * n + i)] = i % 2 ? 0.0 : -0.0;
      v[size_t(4 * n)] = INFINITY;             // row 4: +inf, row 5: -inf
      v[size_t(5 * n + 1)] = -INFINITY;
    }
    xs.push_back(to(Tensor::from_vector(v, {3, 200, n}), dt));
  }
  xs.push_back(transpose(to(randn({6, 9, 4}, kFloat64, g), dt), 1, 2));  // (6, 4, 9): strided rows of 9
  return xs;
}

TEST_CASE("signed_argmax equals the two-reduction hash: ties, signed zeros, NaN, infinities, strided rows") {
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dt);
    for (const Tensor& x : signed_argmax_inputs(dt)) {
      CAPTURE(x.describe());
      const Tensor got = ops::signed_argmax(x);
      CHECK(got.dtype() == kInt64);
      Shape s = x.shape();
      s.pop_back();
      CHECK(got.shape() == s);
      CHECK(got.to_vector<int64_t>() == signed_argmax_reference(x).to_vector<int64_t>());
    }
  }
  // By hand: [1, -3] -> -x's 3 at position 2 + 1; [3, -3] -> the tie to x's 3; a NaN at 1 -> 2 + 1.
  CHECK(ops::signed_argmax(t64({1.0, -3.0, 3.0, -3.0, 0.0, std::nan("")}, {3, 2})).to_vector<int64_t>() ==
        std::vector<int64_t>{3, 0, 3});
}

TEST_CASE("signed_argmax bad input") {
  CHECK_THROWS_MSG(ops::signed_argmax(Tensor()), ValueError, "[signed_argmax] argument 'x' is an undefined tensor");
  CHECK_THROWS_MSG(ops::signed_argmax(ti64({1, 2}, {2})), DTypeError, "[signed_argmax] expects a floating dtype, got int64");
  // 16-bit values are compared in float32, exactly (lsh_buckets under autocast: it refused them)
  const Tensor h = to(t64({1.0, -3.0, 3.0, -3.0, 0.0, 2.0}, {3, 2}), kBFloat16);
  CHECK(ops::signed_argmax(h).to_vector<int64_t>() == std::vector<int64_t>{3, 0, 1});
  CHECK_THROWS_MSG(ops::signed_argmax(Tensor::scalar(1.0, kFloat64)), ShapeError,
                   "[signed_argmax] needs a last axis of at least one entry");
  CHECK_THROWS_MSG(ops::signed_argmax(Tensor::zeros({3, 0}, kFloat64)), ShapeError, "(3,0)");
  CHECK(ops::signed_argmax(Tensor::zeros({0, 4}, kFloat32)).shape() == Shape{0});
}

CUDA_TEST_CASE("signed_argmax on CUDA gives the CPU's positions") {
  for (DType dt : {kFloat64, kFloat32})
    for (const Tensor& x : signed_argmax_inputs(dt)) {
      CAPTURE(x.describe());
      CHECK(ops::signed_argmax(x.to(Device::cuda(0))).to(Device::cpu()).to_vector<int64_t>() ==
            ops::signed_argmax(x).to_vector<int64_t>());
    }
}

}  // TEST_SUITE
