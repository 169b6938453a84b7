// Sorting ops: sort/argsort/topk against a naive stable sort of each line, ties and
// NaN order, gradchecks and bad input.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

struct Ref {
  std::vector<double> values;
  std::vector<int64_t> indices;
};

// Stable sort of every line along `axis` of a row-major tensor, NaN as the largest
// value; keeps the first k of each line.
Ref ref_sort(const std::vector<double>& x, const Shape& shape, int64_t axis, bool descending,
             int64_t k = -1) {
  const int64_t len = shape[size_t(axis)];
  if (k < 0) k = len;
  int64_t inner = 1, outer = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (int64_t(d) < axis) outer *= shape[d];
    if (int64_t(d) > axis) inner *= shape[d];
  }
  auto less = [](double a, double b) { return !std::isnan(a) && (std::isnan(b) || a < b); };
  Ref r;
  r.values.resize(size_t(outer * k * inner));
  r.indices.resize(r.values.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t n = 0; n < inner; ++n) {
      std::vector<int64_t> perm(static_cast<size_t>(len));
      std::iota(perm.begin(), perm.end(), int64_t(0));
      auto at = [&](int64_t j) { return x[size_t((o * len + j) * inner + n)]; };
      std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
        return descending ? less(at(b), at(a)) : less(at(a), at(b));
      });
      for (int64_t j = 0; j < k; ++j) {
        size_t p = size_t((o * k + j) * inner + n);
        r.values[p] = at(perm[size_t(j)]);
        r.indices[p] = perm[size_t(j)];
      }
    }
  return r;
}

std::vector<double> ints(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<double> v(n);
  for (double& e : v) e = d(rng);
  return v;
}

std::vector<double> as_double(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

const DType kAllNumeric[] = {kFloat32, kFloat64, kInt64};

// make() for the floating dtypes, the 16-bit ones too (values exact in each).
Tensor make_float(DType dt, const std::vector<double>& v, const Shape& s) {
  return dt == kFloat64 ? t64(v, s) : to(t32(std::vector<float>(v.begin(), v.end()), s), dt);
}

}  // namespace

TEST_SUITE("ops/sort") {

TEST_CASE("sort and argsort match a naive stable sort on every axis, dtype and layout") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, 0, 4, 1);  // many ties: stability matters
  for (DType dt : kAllNumeric)
    for (const Tensor& x : layouts(make(dt, xv, xs)))
      for (int64_t axis = 0; axis < 3; ++axis)
        for (bool desc : {false, true}) {
          CAPTURE(axis);
          CAPTURE(desc);
          Ref want = ref_sort(xv, xs, axis, desc);
          ValuesIndices r = sort(x, axis, desc);
          CHECK(r.values.dtype() == dt);
          CHECK(r.indices.dtype() == kInt64);
          CHECK(r.values.shape() == xs);
          CHECK(r.indices.shape() == xs);
          check_close(r.values, want.values, 0.0);
          check_close(r.indices, as_double(want.indices), 0.0);
          check_close(argsort(x, axis - 3, desc), as_double(want.indices), 0.0);
        }
}

TEST_CASE("topk matches the head of a naive stable sort") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, 0, 4, 2);
  for (DType dt : kAllNumeric)
    for (const Tensor& x : layouts(make(dt, xv, xs)))
      for (int64_t axis = 0; axis < 3; ++axis)
        for (int64_t k : {int64_t(0), int64_t(1), int64_t(2), xs[size_t(axis)]})
          for (bool largest : {true, false}) {
            CAPTURE(axis);
            CAPTURE(k);
            CAPTURE(largest);
            Ref want = ref_sort(xv, xs, axis, largest, k);
            ValuesIndices r = topk(x, k, axis, largest);
            Shape os = xs;
            os[size_t(axis)] = k;
            CHECK(r.values.shape() == os);
            CHECK(r.indices.shape() == os);
            check_close(r.values, want.values, 0.0);
            check_close(r.indices, as_double(want.indices), 0.0);
          }
}

TEST_CASE("ties keep index order and NaN sorts as the largest value") {
  Tensor t = t64({2, 1, 2, 1, 2}, {5});
  check_close(sort(t).indices, {1, 3, 0, 2, 4}, 0.0);
  check_close(sort(t, -1, true).indices, {0, 2, 4, 1, 3}, 0.0);
  check_close(topk(t, 2).indices, {0, 2}, 0.0);
  check_close(topk(t, 3, 0, false).indices, {1, 3, 0}, 0.0);

  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    CAPTURE(dt);
    Tensor n = make_float(dt, {3, NAN, 1, NAN, 2}, {5});
    ValuesIndices up = sort(n);
    check_close(up.values, {1, 2, 3, NAN, NAN}, 0.0);
    check_close(up.indices, {2, 4, 0, 1, 3}, 0.0);
    ValuesIndices down = sort(n, 0, true);
    check_close(down.values, {NAN, NAN, 3, 2, 1}, 0.0);
    check_close(down.indices, {1, 3, 0, 4, 2}, 0.0);
    check_close(topk(n, 3).indices, {1, 3, 0}, 0.0);
    check_close(topk(n, 2, 0, false).values, {1, 2}, 0.0);
    check_close(sort(make_float(dt, {INFINITY, NAN, -INFINITY, 0}, {4})).values,
                {-INFINITY, 0, INFINITY, NAN}, 0.0);
    // -0 and +0 are equal: index order decides, and each keeps its sign
    ValuesIndices z = sort(make_float(dt, {0.0, -0.0, 0.0, -1.0}, {4}), 0, true);
    check_close(z.indices, {0, 1, 2, 3}, 0.0);
    CHECK(std::signbit(values(z.values)[1]));
  }
}

TEST_CASE("topk and sort of long lines: the sampled filter, its fallback, every floating dtype") {
  // Lines of n >= 256 with k <= n / 8 first keep the keys under a strided sample's order
  // statistic (kernels/sort/sort_cpu.cpp, head_of_keys). Values: quarters in [-10, 10]
  // (many ties, exact in bfloat16 and float16), NaNs of both signs and with a payload
  // (x86's default NaN is negative), and -0.
  for (int64_t n : {int64_t(300), int64_t(512), int64_t(1000)}) {
    const Shape xs{6, n};
    std::vector<double> xv = ints(size_t(6 * n), -40, 40, uint32_t(5 + n));
    for (double& e : xv) e /= 4;
    for (int64_t i : {int64_t(7), n + 88, n + 89, 3 * n + 100}) xv[size_t(i)] = NAN;
    xv[size_t(11)] = -std::numeric_limits<double>::quiet_NaN();
    xv[size_t(2 * n + 5)] = std::nan("291");
    for (int64_t i : {int64_t(9), n + 188, 2 * n + 476}) xv[size_t(i)] = -0.0;
    // Line 4 rises (the order that made a heap slow); on line 5 the sampled positions
    // (every (n / 64)-th) hold the smallest value, so in ascending order the sample's
    // pivot keeps fewer than k = 32 keys and the whole line is selected instead.
    const int64_t stride = n / 64;
    for (int64_t j = 0; j < n; ++j) xv[size_t(4 * n + j)] = double(j * 64 / n) / 4;  // <= 63.75: exact in bfloat16
    for (int64_t j = 0; j < n; ++j) xv[size_t(5 * n + j)] = j % stride == 0 ? -30.0 : double(j % 16);
    for (DType dt : {kFloat32, kBFloat16, kFloat16, kFloat64})
      for (const Tensor& x : layouts(make_float(dt, xv, xs)))
        for (int64_t k : {int64_t(1), int64_t(32), n / 8, n / 8 + 1, int64_t(100), n})
          for (bool largest : {true, false}) {
            CAPTURE(n);
            CAPTURE(dt);
            CAPTURE(k);
            CAPTURE(largest);
            Ref want = ref_sort(xv, xs, 1, largest, k);
            ValuesIndices r = topk(x, k, 1, largest);
            check_close(r.indices, as_double(want.indices), 0.0);
            check_close(r.values, want.values, 0.0);
          }
  }
}

TEST_CASE("sort of large inputs (parallel path) and of 0-d and empty tensors") {
  Generator g(3);
  Tensor x = rand({2000, 40}, kFloat32, g);
  auto xv = values(x);
  for (int64_t axis : {0, 1}) {
    Ref want = ref_sort(xv, {2000, 40}, axis, false);
    ValuesIndices r = sort(x, axis);
    check_close(r.values, want.values, 0.0);
    check_close(r.indices, as_double(want.indices), 0.0);
  }
  Tensor s = Tensor::scalar(4.0, kFloat64);
  ValuesIndices rs = sort(s);
  CHECK(rs.values.shape() == Shape{});
  CHECK(rs.values.item() == 4.0);
  CHECK(rs.indices.item<int64_t>() == 0);
  CHECK(topk(s, 1).values.item() == 4.0);
  ValuesIndices re = sort(Tensor::zeros({3, 0}));
  CHECK(re.values.shape() == Shape{3, 0});
  CHECK(topk(Tensor::zeros({0, 4}), 2).indices.shape() == Shape{0, 2});
}

TEST_CASE("sort and topk values are differentiable, indices and argsort are not") {
  Tensor x = leaf64({3, 4});
  ValuesIndices r = sort(x, 1);
  REQUIRE(r.values.grad_fn() != nullptr);
  CHECK(std::string(r.values.grad_fn()->name) == "sort");
  CHECK(r.indices.grad_fn() == nullptr);
  CHECK_FALSE(r.indices.requires_grad());
  CHECK_THROWS_MSG(r.indices.backward(), AutogradError, "[backward]", "are not differentiable");
  ValuesIndices t = topk(x, 2, 0);
  CHECK(std::string(t.values.grad_fn()->name) == "topk");
  CHECK(t.indices.grad_fn() == nullptr);
  Tensor a = argsort(x);
  CHECK(a.grad_fn() == nullptr);
  CHECK_FALSE(a.requires_grad());
  CHECK(a.dtype() == kInt64);
  // The gradient lands where each value came from.
  Tensor v = t64({3, 1, 2}, {3});
  v.set_requires_grad(true);
  sort(v).values.backward(t64({10, 20, 30}, {3}));
  check_close(v.grad(), {30, 10, 20}, 0.0);
  Tensor w = t64({3, 1, 2}, {3});
  w.set_requires_grad(true);
  topk(w, 2).values.backward(t64({10, 20}, {2}));
  check_close(w.grad(), {10, 0, 20}, 0.0);
}

GRADCHECK_CASE(sort) {
  check_grad("sort", [](const std::vector<Tensor>& x) { return sort(x[0], 1).values; },
             {leaf64({3, 5})});
  check_grad("sort", [](const std::vector<Tensor>& x) { return sort(x[0], 0, true).values; },
             {leaf64({4, 3}, 2)});
}
GRADCHECK_CASE(topk) {
  check_grad("topk", [](const std::vector<Tensor>& x) { return topk(x[0], 2, 1).values; },
             {leaf64({3, 5})});
  check_grad("topk", [](const std::vector<Tensor>& x) { return topk(x[0], 3, 0, false).values; },
             {leaf64({4, 3}, 2)});
}

TEST_CASE("sort bad input") {
  Tensor x = t32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector(std::vector<bool>{true, false}, {2});
  CHECK_THROWS_MSG(sort(b), DTypeError, "[sort]", "bool", "(2)");
  CHECK_THROWS_MSG(argsort(b), DTypeError, "[argsort]", "bool");
  CHECK_THROWS_MSG(topk(b, 1), DTypeError, "[topk]", "bool");
  CHECK_THROWS_MSG(sort(x, 2), IndexError, "[sort]", "axis 2", "2 dimensions");
  CHECK_THROWS_MSG(argsort(x, -3), IndexError, "[argsort]", "axis -3");
  CHECK_THROWS_MSG(topk(x, 1, 5), IndexError, "[topk]", "axis 5");
  CHECK_THROWS_MSG(topk(x, 4, 1), ValueError, "[topk]", "k = 4", "axis 1", "length 3", "(2,3)");
  CHECK_THROWS_MSG(topk(x, -1, 1), ValueError, "[topk]", "k = -1");
  CHECK_THROWS_MSG(sort(Tensor()), ValueError, "[sort]", "undefined");
  if (!cuda_built()) {
    CHECK_THROWS_MSG(sort(fake_cuda({2, 3})), NotImplementedError, "[sort]", "no CUDA implementation");
    CHECK_THROWS_MSG(topk(fake_cuda({2, 3}), 1), NotImplementedError, "[topk]",
                     "no CUDA implementation");
  }
}

}  // TEST_SUITE

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of sort / argsort / topk (CUB radix sort, kernels/sort/sort_cuda.cu)
// against the CPU.

namespace {



// float32 values in [lo, hi] as small integers (many ties), with NaN, -0.0 and
// +0.0 sprinkled in at fixed positions.
Tensor tied(const Shape& s, int lo, int hi, uint32_t seed, bool nan = true) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<float> v(size_t(numel_of(s)));
  for (float& e : v) e = float(d(rng));
  for (size_t i = 0; i < v.size(); ++i) {
    if (nan && i % 7 == 3) v[i] = NAN;
    if (i % 11 == 5) v[i] = -0.0f;
    if (i % 13 == 6) v[i] = 0.0f;
  }
  return Tensor::from_vector(v, s);
}

// Exact equality of the indices of f on both devices (ties must resolve alike),
// and of the values where f returns them (NaN == NaN).
void check_same_order(const std::function<ValuesIndices(const Tensor&)>& f, const Tensor& x) {
  ValuesIndices c = f(x), g = f(x.to(Device::cuda(0)));
  REQUIRE(g.indices.device().is_cuda());
  CHECK(g.indices.shape() == c.indices.shape());
  CHECK(values(g.indices) == values(c.indices));
  if (c.values.defined()) {
    std::vector<double> gv = values(g.values), cv = values(c.values);
    REQUIRE(gv.size() == cv.size());
    size_t bad = 0;
    for (size_t i = 0; i < gv.size(); ++i)
      if (!(gv[i] == cv[i] || (std::isnan(gv[i]) && std::isnan(cv[i])))) ++bad;
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_SUITE("ops/sort") {

PARITY_CASE(sort) {
  auto s1 = [](const Inputs& x) { return sort(x[0], 1).values; };
  check_parity("sort", s1, {leaf32({3, 5})});
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 0, true).values; }, {leaf32({4, 3}, 2)});
  // Non-contiguous input along a strided axis.
  check_parity("sort", [](const Inputs& x) { return sort(transpose(x[0], 0, 1), 1, true).values; },
               {leaf32({6, 4}, 3)});
  check_parity("sort", [](const Inputs& x) { return sort(slice(x[0], 1, 0, 10, 2), -1).values; },
               {leaf32({3, 10}, 4)});
  // int64 and float64 forward.
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 1).values; },
               {Tensor::from_vector(std::vector<int64_t>{5, -3, 5, 0, INT64_MIN, INT64_MAX, -3, 2}, {2, 4})});
  check_parity("sort", s1, {to(leaf32({3, 5}, 5), kFloat64)});
  // Empty: no lines, and zero-length lines.
  check_parity("sort", s1, {leaf32({0, 5}, 6)});
  check_parity("sort", s1, {leaf32({3, 0}, 7)});
  // One line longer than 4096 (device-wide sort), several long lines, many short lines.
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 0).values; }, {leaf32({10000}, 8)});
  check_parity("sort", s1, {leaf32({3, 5000}, 9)});
  check_parity("sort", s1, {leaf32({20000, 7}, 10)});
  // Ties, NaN and signed zeros: indices and values exactly as on the CPU.
  for (bool desc : {false, true}) {
    for (const Shape& s : {Shape{4, 37}, Shape{2, 6000}, Shape{30000, 5}}) {
      check_same_order([desc](const Tensor& t) { return sort(t, -1, desc); }, tied(s, -3, 3, 1));
      check_same_order([desc](const Tensor& t) { return sort(t, 0, desc); }, tied(s, -3, 3, 2));
    }
    check_same_order([desc](const Tensor& t) { return sort(t, -1, desc); }, to(tied({5, 40}, -2, 2, 3), kFloat64));
    check_same_order([desc](const Tensor& t) { return sort(t, 1, desc); }, to(tied({5, 40}, -2, 2, 4, false), kInt64));
  }
  check_grad_cuda("sort", s1, {leaf64({3, 5})});
  check_grad_cuda("sort", [](const Inputs& x) { return sort(x[0], 0, true).values; }, {leaf64({4, 3}, 2)});
}

PARITY_CASE(topk) {
  auto t2 = [](const Inputs& x) { return topk(x[0], 2, 1).values; };
  check_parity("topk", t2, {leaf32({3, 5})});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 3, 0, false).values; }, {leaf32({4, 3}, 2)});
  check_parity("topk", [](const Inputs& x) { return topk(transpose(x[0], 0, 1), 2, 0).values; },
               {leaf32({5, 3}, 3)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 2, 1).indices; },
               {Tensor::from_vector(std::vector<int64_t>{1, 9, 9, -4, 0, 0, 7, 7}, {2, 4})});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 0, 1).values; }, {leaf32({3, 5}, 4)});
  check_parity("topk", t2, {leaf32({0, 5}, 5)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 10, 1).values; }, {leaf32({4, 8192}, 6)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 3, 1, false).values; }, {leaf32({50000, 9}, 7)});
  for (bool largest : {true, false}) {
    for (const Shape& s : {Shape{4, 37}, Shape{2, 6000}, Shape{30000, 5}}) {
      check_same_order([largest](const Tensor& t) { return topk(t, 3, -1, largest); }, tied(s, -3, 3, 5));
      check_same_order([largest](const Tensor& t) { return topk(t, 2, 0, largest); }, tied(s, -3, 3, 6));
    }
  }
  check_grad_cuda("topk", t2, {leaf64({3, 5})});
  check_grad_cuda("topk", [](const Inputs& x) { return topk(x[0], 3, 0, false).values; }, {leaf64({4, 3}, 2)});
}

PARITY_CASE(argsort) {
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); }, {leaf32({3, 5})});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0], 0, true); }, {tied({6, 4}, -2, 2, 7)});
  check_parity("argsort", [](const Inputs& x) { return argsort(transpose(x[0], 0, 1), 1); }, {tied({9, 3}, -2, 2, 8)});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); },
               {Tensor::from_vector(std::vector<int64_t>{3, 1, 3, 1, 2, 2}, {6})});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); }, {leaf32({2, 0}, 9)});
  for (bool desc : {false, true}) {
    for (const Shape& s : {Shape{4, 37}, Shape{1, 9000}, Shape{30000, 5}}) {
      check_same_order([desc](const Tensor& t) { return ValuesIndices{Tensor(), argsort(t, -1, desc)}; },
                       tied(s, -3, 3, 9));
    }
  }
}

}  // TEST_SUITE

// ---------------------------------------------------------------- searchsorted
namespace {

// The reference: a linear count of the row's elements that sort before v (left) or not after it (right),
// NaN the largest value.
int64_t count_before(const std::vector<double>& row, double v, bool right) {
  auto before = [](double a, double b) { return std::isnan(a) ? false : (std::isnan(b) ? true : a < b); };
  int64_t n = 0;
  for (double e : row) n += right ? !before(v, e) : before(e, v);
  return n;
}

}  // namespace

TEST_SUITE("ops/sort") {

TEST_CASE("searchsorted counts the elements of the sorted row before each value, left and right") {
  // ties, +-inf and NaN (the largest value, as sort's order), for every numeric dtype
  const std::vector<double> row{-INFINITY, -2, -2, 0, 1, 1, 1, 3.5, INFINITY, NAN, NAN};
  const std::vector<double> probe{-INFINITY, -3, -2, -1, 0, 1, 2, 3.5, 4, INFINITY, NAN, -0.0};
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    Tensor s = to(t64(row, {int64_t(row.size())}), dt), v = to(t64(probe, {3, 4}), dt);
    for (bool right : {false, true}) {
      Tensor got = searchsorted(s, v, right);
      CHECK(got.dtype() == kInt64);
      CHECK(got.shape() == Shape{3, 4});
      const std::vector<int64_t> g = got.to_vector<int64_t>();
      for (size_t i = 0; i < probe.size(); ++i)
        CHECK_MESSAGE(g[i] == count_before(row, probe[i], right), dt, " right=", right, " value ", probe[i]);
    }
  }
  Tensor si = ti64({-5, 0, 0, 7, int64_t(1) << 60}, {5});
  CHECK(searchsorted(si, ti64({0, 7, -6, (int64_t(1) << 60) + 1}, {4})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 3, 0, 5});
  CHECK(searchsorted(si, ti64({0, 7, -6, (int64_t(1) << 60) + 1}, {4}), true).to_vector<int64_t>() ==
        std::vector<int64_t>{3, 4, 0, 5});
}

TEST_CASE("searchsorted with rows of their own, views, and random data against the linear count") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-20, 20);
  const int64_t B = 3, H = 2, M = 37, K = 50;
  std::vector<double> rows(size_t(B * H * M)), vals(size_t(B * H * K));
  for (double& e : vals) e = d(rng) * 0.5;
  for (int64_t r = 0; r < B * H; ++r) {
    for (int64_t j = 0; j < M; ++j) rows[size_t(r * M + j)] = d(rng);
    std::sort(rows.begin() + r * M, rows.begin() + (r + 1) * M);
  }
  Tensor s = t64(rows, {B, H, M}), v = t64(vals, {B, H, K});
  for (bool right : {false, true}) {
    const std::vector<int64_t> g = searchsorted(s, v, right).to_vector<int64_t>();
    for (int64_t r = 0; r < B * H; ++r) {
      const std::vector<double> row(rows.begin() + r * M, rows.begin() + (r + 1) * M);
      for (int64_t j = 0; j < K; ++j)
        CHECK(g[size_t(r * K + j)] == count_before(row, vals[size_t(r * K + j)], right));
    }
  }
  // non-contiguous operands give what their contiguous copies give
  Tensor st = transpose(contiguous(transpose(s, 0, 1)), 0, 1), vt = slice(t64(vals, {B, H, K}), 2, 0, K, 2);
  CHECK(!st.is_contiguous());
  CHECK(searchsorted(st, vt).to_vector<int64_t>() == searchsorted(s, contiguous(vt)).to_vector<int64_t>());
  // one 1-d row for values of any shape; an empty row puts everything at 0; no values give an empty result
  Tensor row = t64({1, 2, 3}, {3});
  CHECK(searchsorted(row, t64({2.5, 0, 9, 2}, {2, 1, 2})).shape() == Shape{2, 1, 2});
  CHECK(searchsorted(row, t64({2.5, 0, 9, 2}, {2, 1, 2})).to_vector<int64_t>() == std::vector<int64_t>{2, 0, 3, 1});
  CHECK(searchsorted(row, Tensor::scalar(2.0, kFloat64)).dim() == 0);
  CHECK(searchsorted(Tensor::zeros({0}, kFloat64), t64({1, 2}, {2})).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 0});
  CHECK(searchsorted(row, Tensor::zeros({0, 4}, kFloat64)).shape() == Shape{0, 4});
  CHECK(searchsorted(Tensor::zeros({2, 0}, kFloat64), Tensor::zeros({2, 3}, kFloat64)).to_vector<int64_t>() ==
        std::vector<int64_t>(6, 0));
  // never differentiable: an int64 result, no graph
  Tensor x = leaf64({4}, 1);
  CHECK(!searchsorted(row, x).requires_grad());
}

TEST_CASE("searchsorted compares two dtypes in a common one, an integer and a float in float64") {
  // int64 rows against float values: 2.5 falls between 2 and 3 (through int64 it would be 2, left of 2's end)
  Tensor ints = ti64({1, 2, 2, 3, 9007199254740993}, {5});
  CHECK(searchsorted(ints, t32({2.5f, 2.0f, -1.0f}, {3}), true).to_vector<int64_t>() == std::vector<int64_t>{3, 3, 0});
  CHECK(searchsorted(t32({0.5f, 1.5f, 2.5f}, {3}), ti64({1, 2, 3}, {3})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 2, 3});
  // two floats in the wider: float64's 0.1 lies below float32's (0.10000000149...), 0.1000000015 above it
  Tensor f32 = t32({0.1f}, {1});
  CHECK(searchsorted(f32, t64({0.1}, {1})).to_vector<int64_t>() == std::vector<int64_t>{0});
  CHECK(searchsorted(f32, t64({0.1000000015}, {1})).to_vector<int64_t>() == std::vector<int64_t>{1});
}

TEST_CASE("searchsorted's errors name the op, shapes and dtypes") {
  Tensor row = t64({1, 2, 3}, {3});
  CHECK_THROWS_MSG(searchsorted(row, Tensor::from_vector(std::vector<bool>{true}, {1})), DTypeError, "[searchsorted]",
                   "bool");
  CHECK_THROWS_MSG(searchsorted(Tensor::scalar(1.0, kFloat64), row), ShapeError, "[searchsorted]",
                   "at least one dimension");
  CHECK_THROWS_MSG(searchsorted(t64({1, 2, 3, 4}, {2, 2}), t64({1, 2, 3}, {3, 1})), ShapeError, "[searchsorted]",
                   "leading dimensions");
  CHECK_THROWS_MSG(searchsorted(t64({1, 2, 3, 4}, {2, 2}), t64({1, 2}, {2})), ShapeError, "[searchsorted]",
                   "leading dimensions");
  Tensor b = Tensor::from_vector(std::vector<bool>{false, true}, {2});
  CHECK_THROWS_MSG(searchsorted(b, b), DTypeError, "[searchsorted]", "bool");
  CHECK_THROWS_MSG(searchsorted(Tensor(), row), Error, "[searchsorted]");
  CHECK_THROWS_MSG(searchsorted(row, fake_cuda({2}, kFloat64)), DeviceError, "[searchsorted]");
}

PARITY_CASE(searchsorted) {
  ParityOptions fwd;
  fwd.backward = false;
  auto left = [](const Inputs& x) { return searchsorted(sort(x[0], -1).values, x[1]); };
  auto right = [](const Inputs& x) { return searchsorted(sort(x[0], -1).values, x[1], true); };
  check_parity("searchsorted", left, {leaf32({1000}, 60), leaf32({7, 300}, 61)}, fwd);
  check_parity("searchsorted", right, {leaf32({3, 4, 100}, 62), leaf32({3, 4, 33}, 63)}, fwd);
  // ties and NaN: the positions exactly as on the CPU
  check_parity("searchsorted", left, {tied({2, 500}, -3, 3, 64), tied({2, 77}, -4, 4, 65)}, fwd);
  check_parity("searchsorted", right, {tied({2, 500}, -3, 3, 66), tied({2, 77}, -4, 4, 67)}, fwd);
  check_parity("searchsorted", [](const Inputs& x) { return searchsorted(x[0], x[1]); },
               {ti64({-5, 0, 0, 7}, {4}), ti64({0, 7, -6, 100, -5}, {5})}, fwd);
  check_parity("searchsorted", [](const Inputs& x) { return searchsorted(to(x[0], kBFloat16), to(x[1], kBFloat16)); },
               {t32({-1, 0, 0.5f, 2}, {4}), leaf32({50}, 68)}, fwd);
}

}  // TEST_SUITE
