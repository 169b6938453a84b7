// Indexing ops: forward against naive loops (contiguous and strided inputs, several
// dtypes), determinism of the accumulating ops, gradchecks and bad input.
#include <cstring>
#include <deque>
#include <random>

#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// ---- naive references over row-major vectors ----

Shape unravel(int64_t pos, const Shape& shape) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = pos % shape[d];
    pos /= shape[d];
  }
  return c;
}
int64_t ravel(const Shape& c, const Shape& shape) {
  int64_t p = 0;
  for (size_t d = 0; d < shape.size(); ++d) p = p * shape[d] + c[d];
  return p;
}

std::vector<double> ref_gather(const std::vector<double>& x, const Shape& xs, int64_t axis,
                               const std::vector<int64_t>& idx, const Shape& is) {
  std::vector<double> out(idx.size());
  for (size_t p = 0; p < idx.size(); ++p) {
    Shape c = unravel(int64_t(p), is);
    c[size_t(axis)] = idx[p];
    out[p] = x[size_t(ravel(c, xs))];
  }
  return out;
}

std::vector<double> ref_scatter_add(std::vector<double> x, const Shape& xs, int64_t axis,
                                    const std::vector<int64_t>& idx, const Shape& is,
                                    const std::vector<double>& src, const Shape& ss) {
  for (size_t p = 0; p < idx.size(); ++p) {
    Shape c = unravel(int64_t(p), is);
    double v = src[size_t(ravel(c, ss))];
    c[size_t(axis)] = idx[p];
    x[size_t(ravel(c, xs))] += v;
  }
  return x;
}

// Assignments in row-major order of index: of several sent to one element the last stays.
std::vector<double> ref_scatter(std::vector<double> x, const Shape& xs, int64_t axis, const std::vector<int64_t>& idx,
                                const Shape& is, const std::vector<double>& src, const Shape& ss) {
  for (size_t p = 0; p < idx.size(); ++p) {
    Shape c = unravel(int64_t(p), is);
    double v = src[size_t(ravel(c, ss))];
    c[size_t(axis)] = idx[p];
    x[size_t(ravel(c, xs))] = v;
  }
  return x;
}

std::vector<double> ref_index_select(const std::vector<double>& x, const Shape& xs, int64_t axis,
                                     const std::vector<int64_t>& idx) {
  Shape os = xs;
  os[size_t(axis)] = int64_t(idx.size());
  std::vector<double> out(size_t(numel_of(os)));
  for (size_t p = 0; p < out.size(); ++p) {
    Shape c = unravel(int64_t(p), os);
    c[size_t(axis)] = idx[size_t(c[size_t(axis)])];
    out[p] = x[size_t(ravel(c, xs))];
  }
  return out;
}

std::vector<double> ref_index_add(std::vector<double> x, const Shape& xs, int64_t axis,
                                  const std::vector<int64_t>& idx, const std::vector<double>& src,
                                  const Shape& ss) {
  for (size_t p = 0; p < src.size(); ++p) {
    Shape c = unravel(int64_t(p), ss);
    c[size_t(axis)] = idx[size_t(c[size_t(axis)])];
    x[size_t(ravel(c, xs))] += src[p];
  }
  return x;
}

// ---- inputs ----

std::vector<double> ints(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<double> v(n);
  for (double& e : v) e = d(rng);
  return v;
}
std::vector<int64_t> indices(size_t n, int64_t limit, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, limit - 1);
  std::vector<int64_t> v(n);
  for (int64_t& e : v) e = d(rng);
  return v;
}

const DType kAllNumeric[] = {kFloat32, kFloat64, kInt64};

}  // namespace

TEST_SUITE("ops/index") {

TEST_CASE("gather matches a naive loop on every axis, dtype and layout") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, -9, 9, 1);
  for (DType dt : kAllNumeric) {
    for (int64_t axis = 0; axis < 3; ++axis) {
      Shape is = xs;
      for (int64_t d = 0; d < 3; ++d) is[size_t(d)] = d == axis ? 6 : xs[size_t(d)] - 1;
      auto iv = indices(size_t(numel_of(is)), xs[size_t(axis)], uint32_t(10 + axis));
      auto want = ref_gather(xv, xs, axis, iv, is);
      for (const Tensor& x : layouts(make(dt, xv, xs)))
        for (const Tensor& ix : layouts(ti64(iv, is))) {
          CAPTURE(axis);
          Tensor out = gather(x, axis, ix);
          CHECK(out.dtype() == dt);
          CHECK(out.shape() == is);
          check_close(out, want, 0.0);
          check_close(gather(x, axis - 3, ix), want, 0.0);  // negative axis
        }
    }
  }
}

TEST_CASE("index data checks: one scan per index, none again in the backward or in a KnownGoodIndices scope") {
  Tensor x = leaf64({4, 5}, 1);
  const Tensor idx = ti64({3, 0, 1, 3, 2, 2, 0, 1, 0, 0}, {2, 5});
  auto calls = [](const std::function<void()>& f) {
    const KernelCalls before = kernel_calls();
    f();
    return (kernel_calls() - before).cpu;
  };
  Tensor y;
  CHECK(calls([&] { y = gather(x, 0, idx); }) == 2);  // the scan, the gather
  // backward: the saved index added into zeros (a fill, the scatter), without a second scan or a copy
  const Tensor gy = leaf64({2, 5}, 2).detach();
  CHECK(calls([&] { y.backward(gy); }) == 2);
  {
    ops::KnownGoodIndices built_here;
    CHECK(calls([&] { gather(x.detach(), 0, idx); }) == 1);
    {
      ops::KnownGoodIndices nested;
    }
    CHECK(ops::indices_known_good());  // a nested scope restores, not clears
  }
  CHECK_FALSE(ops::indices_known_good());
  // Outside the scope a bad index is still named, in the forward and for a saved index changed in place
  CHECK_THROWS_MSG(gather(x, 0, ti64({4}, {1, 1})), IndexError, "[gather] index 4 is out of range for axis 0");
  Tensor i2 = ti64({1, 2}, {1, 2});
  Tensor z = gather(x, 0, i2);
  fill_(i2, 9.0);
  CHECK_THROWS_MSG(z.backward(leaf64({1, 2}, 3).detach()), Error, "saved by 'gather' for backward was modified in place");
  // A write no version counter sees (a NumPy or DLPack view of the index; here its raw pointer) before the
  // backward, which does not rescan: the kernels' own bounds test names it, no write lands past the axis.
  Tensor i3 = ti64({1, 2}, {1, 2});
  Tensor z3 = gather(x, 0, i3);
  i3.data<int64_t>()[1] = int64_t(1) << 40;
  CHECK_THROWS_MSG(z3.backward(leaf64({1, 2}, 3).detach()), IndexError,
                   "[scatter_add] index 1099511627776 is out of range for an axis of length 4");
  CHECK_THROWS_MSG(gather(x.detach(), 0, i3), IndexError, "[gather] index 1099511627776 is out of range");
  {
    ops::KnownGoodIndices built_here;  // (a wrong use of the scope: still no read past the axis)
    CHECK_THROWS_MSG(gather(x.detach(), 0, i3), IndexError,
                     "[gather] index 1099511627776 is out of range for an axis of length 4");
  }
}

TEST_CASE("gather on a large transposed input (parallel path)") {
  Generator g(7);
  Tensor base = rand({200, 300}, kFloat32, g);
  Tensor x = transpose(base, 0, 1);  // (300, 200)
  auto iv = indices(300 * 500, 200, 3);
  Tensor out = gather(x, 1, ti64(iv, {300, 500}));
  check_close(out, ref_gather(values(x), {300, 200}, 1, iv, {300, 500}), 0.0);
}

TEST_CASE("scatter_add matches a naive loop, with duplicates, larger src, every layout") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, -9, 9, 2);
  for (DType dt : kAllNumeric) {
    for (int64_t axis = 0; axis < 3; ++axis) {
      Shape is = xs, ss;
      for (int64_t d = 0; d < 3; ++d) is[size_t(d)] = d == axis ? 7 : xs[size_t(d)] - 1;
      for (int64_t d : is) ss.push_back(d + 1);  // src may be larger than index
      auto iv = indices(size_t(numel_of(is)), xs[size_t(axis)], uint32_t(20 + axis));
      auto sv = ints(size_t(numel_of(ss)), -5, 5, uint32_t(30 + axis));
      auto want = ref_scatter_add(xv, xs, axis, iv, is, sv, ss);
      for (const Tensor& x : layouts(make(dt, xv, xs)))
        for (const Tensor& ix : layouts(ti64(iv, is)))
          for (const Tensor& src : layouts(make(dt, sv, ss))) {
            CAPTURE(axis);
            Tensor out = scatter_add(x, axis, ix, src);
            CHECK(out.dtype() == dt);
            CHECK(out.shape() == xs);
            check_close(out, want, 0.0);
            for (Tensor y : layouts(make(dt, xv, xs))) {  // in place, into every layout
              CHECK(&scatter_add_(y, axis, ix, src) == &y);
              check_close(y, want, 0.0);
            }
          }
      // The input is not modified.
      check_close(make(dt, xv, xs), xv, 0.0);
    }
  }
}

TEST_CASE("scatter matches a naive loop: the last of duplicates stays, larger src, every dtype and layout") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, -9, 9, 2);
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool, kBFloat16}) {
    for (int64_t axis = 0; axis < 3; ++axis) {
      Shape is = xs, ss;
      for (int64_t d = 0; d < 3; ++d) is[size_t(d)] = d == axis ? 7 : xs[size_t(d)] - 1;
      for (int64_t d : is) ss.push_back(d + 1);
      auto iv = indices(size_t(numel_of(is)), xs[size_t(axis)], uint32_t(40 + axis));
      auto sv = ints(size_t(numel_of(ss)), 10, 60, uint32_t(50 + axis));  // distinct from x's values
      if (dt == kBool)
        for (double& v : sv) v = double(int64_t(v) % 2);
      std::vector<double> x0 = xv;
      if (dt == kBool)
        for (double& v : x0) v = v > 0;
      const auto want = ref_scatter(x0, xs, axis, iv, is, sv, ss);
      auto as = [dt](const std::vector<double>& v, const Shape& s) {
        if (dt == kBool) return ne(make(kInt64, v, s), 0.0);
        if (dt == kBFloat16) return to(make(kFloat32, v, s), dt);
        return make(dt, v, s);
      };
      for (const Tensor& x : layouts(as(x0, xs)))
        for (const Tensor& ix : layouts(ti64(iv, is)))
          for (const Tensor& src : layouts(as(sv, ss))) {
            CAPTURE(axis);
            Tensor out = scatter(x, axis, ix, src);
            CHECK(out.dtype() == dt);
            CHECK(out.shape() == xs);
            check_close(out, want, 0.0);
            for (Tensor y : layouts(as(x0, xs))) {  // in place, into every layout
              CHECK(&scatter_(y, axis, ix, src) == &y);
              check_close(y, want, 0.0);
            }
          }
      check_close(as(x0, xs), x0, 0.0);  // the input is not modified
    }
  }
}

TEST_CASE("scatter moves bits: -0.0 and NaN payloads arrive as they were sent") {
  const float nan_payload = [] {
    uint32_t bits = 0x7fc12345u;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }();
  Tensor src = t32({-0.0f, nan_payload, 1.5f}, {3});
  Tensor out = scatter(Tensor::ones({4}, kFloat32), 0, ti64({2, 0, 3}, {3}), src);
  const std::vector<float> got = out.to_vector<float>();
  uint32_t b0, b2;
  std::memcpy(&b0, &got[0], 4);
  std::memcpy(&b2, &got[2], 4);
  CHECK(b0 == 0x7fc12345u);
  CHECK(b2 == 0x80000000u);
  CHECK(got[1] == 1.0f);
  CHECK(got[3] == 1.5f);
}

TEST_CASE("scatter's gradient: overwritten x elements get none, only the kept one of duplicates gets it") {
  // Row 0 sends positions 1, 3, 1: the first 1 is overwritten by the third (the last along the axis).
  Tensor x = leaf64({2, 4}, 1);
  Tensor src = leaf64({2, 3}, 2);
  Tensor idx = ti64({1, 3, 1, 0, 0, 2}, {2, 3});
  Tensor out = scatter(x, 1, idx, src);
  CHECK(std::string(out.grad_fn()->name) == "scatter");
  const std::vector<double> xv = x.to_vector<double>(), sv = src.to_vector<double>();
  check_close(out, {xv[0], sv[2], xv[2], sv[1], sv[4], xv[5], sv[5], xv[7]}, 0.0);
  sum(mul(out, t64({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}))).backward();
  check_close(x.grad(), {1, 0, 3, 0, 0, 6, 0, 8}, 0.0);
  check_close(src.grad(), {0, 4, 2, 0, 5, 7}, 0.0);
}

TEST_CASE("scatter_add and index_add are deterministic with many duplicates") {
  // Two output elements receive 100000 terms each: the result must equal the serial
  // ascending-order sum bit for bit, run after run.
  const int64_t n = 100000;
  Generator g(11);
  Tensor src = rand({n, 2}, kFloat64, g, -1.0, 1.0);
  auto iv = indices(size_t(2 * n), 2, 5);
  Tensor idx = ti64(iv, {n, 2});
  Tensor x = Tensor::zeros({2, 2}, kFloat64);
  auto want = ref_scatter_add(values(x), {2, 2}, 0, iv, {n, 2}, values(src), {n, 2});
  Tensor a = scatter_add(x, 0, idx, src);
  Tensor b = scatter_add(x, 0, idx, src);
  check_close(a, want, 0.0);
  CHECK(values(a) == values(b));

  auto lv = indices(size_t(n), 7, 6);
  Tensor rows = rand({n, 64}, kFloat64, g, -1.0, 1.0);
  Tensor acc = Tensor::zeros({7, 64}, kFloat64);
  auto want2 = ref_index_add(values(acc), {7, 64}, 0, lv, values(rows), {n, 64});
  Tensor c = index_add(acc, 0, ti64(lv, {n}), rows);
  Tensor d = index_add(acc, 0, ti64(lv, {n}), rows);
  check_close(c, want2, 0.0);
  CHECK(values(c) == values(d));
}

TEST_CASE("index_select matches a naive loop") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, -9, 9, 3);
  for (DType dt : kAllNumeric) {
    for (int64_t axis = 0; axis < 3; ++axis) {
      auto iv = indices(6, xs[size_t(axis)], uint32_t(40 + axis));
      auto want = ref_index_select(xv, xs, axis, iv);
      for (const Tensor& x : layouts(make(dt, xv, xs)))
        for (const Tensor& ix : layouts(ti64(iv, {6}))) {
          CAPTURE(axis);
          Tensor out = index_select(x, axis, ix);
          Shape os = xs;
          os[size_t(axis)] = 6;
          CHECK(out.shape() == os);
          CHECK(out.dtype() == dt);
          check_close(out, want, 0.0);
        }
    }
  }
  // An empty index selects nothing.
  CHECK(index_select(t64({1, 2, 3, 4}, {2, 2}), 0, ti64({}, {0})).shape() == Shape{0, 2});
}

TEST_CASE("index_add matches a naive loop") {
  const Shape xs{3, 4, 5};
  auto xv = ints(60, -9, 9, 4);
  for (DType dt : kAllNumeric) {
    for (int64_t axis = 0; axis < 3; ++axis) {
      auto iv = indices(6, xs[size_t(axis)], uint32_t(50 + axis));
      Shape ss = xs;
      ss[size_t(axis)] = 6;
      auto sv = ints(size_t(numel_of(ss)), -5, 5, uint32_t(60 + axis));
      auto want = ref_index_add(xv, xs, axis, iv, sv, ss);
      for (const Tensor& x : layouts(make(dt, xv, xs)))
        for (const Tensor& ix : layouts(ti64(iv, {6})))
          for (const Tensor& src : layouts(make(dt, sv, ss))) {
            CAPTURE(axis);
            Tensor out = index_add(x, axis, ix, src);
            CHECK(out.shape() == xs);
            check_close(out, want, 0.0);
          }
    }
  }
}

TEST_CASE("take_along_dim broadcasts index against x") {
  // x (3,1,5), index (1,4,6) along axis 2 -> (3,4,6).
  auto xv = ints(15, -9, 9, 5);
  auto iv = indices(24, 5, 6);
  std::vector<double> want;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 6; ++k) want.push_back(xv[size_t(i * 5 + iv[size_t(j * 6 + k)])]);
  for (DType dt : kAllNumeric)
    for (const Tensor& x : layouts(make(dt, xv, {3, 1, 5})))
      for (const Tensor& ix : layouts(ti64(iv, {1, 4, 6}))) {
        Tensor out = take_along_dim(x, ix, 2);
        CHECK(out.shape() == Shape{3, 4, 6});
        check_close(out, want, 0.0);
      }
  // Without broadcasting it is gather.
  Tensor x = make(kFloat64, ints(20, -9, 9, 7), {4, 5});
  Tensor ix = ti64(indices(15, 4, 8), {3, 5});
  Tensor ixt = ti64(indices(12, 5, 9), {4, 3});
  check_close(take_along_dim(x, ix, 0), gather(x, 0, ix), 0.0);
  check_close(take_along_dim(x, ixt, -1), gather(x, 1, ixt), 0.0);
  // argsort + take_along_dim sorts.
  check_close(take_along_dim(x, argsort(x, 1), 1), sort(x, 1).values, 0.0);
}

TEST_CASE("masked_fill with a broadcast mask") {
  auto xv = ints(12, -9, 9, 9);
  std::vector<bool> mrow{true, false, false, true};
  std::vector<bool> mfull;
  for (int i = 0; i < 12; ++i) mfull.push_back(i % 5 == 0);
  for (DType dt : kAllNumeric) {
    double value = dt == kInt64 ? 7.0 : 7.5;
    for (const Tensor& x : layouts(make(dt, xv, {3, 4}))) {
      std::vector<double> want_row = xv, want_full = xv;
      for (size_t i = 0; i < 12; ++i) {
        if (mrow[i % 4]) want_row[i] = value;
        if (mfull[i]) want_full[i] = value;
      }
      Tensor out = masked_fill(x, Tensor::from_vector(mrow, {4}), value);
      CHECK(out.dtype() == dt);
      check_close(out, want_row, 0.0);
      for (const Tensor& m : layouts(Tensor::from_vector(mfull, {3, 4})))
        check_close(masked_fill(x, m, value), want_full, 0.0);
    }
  }
  Tensor neg_inf = masked_fill(t32({1, 2}, {2}), Tensor::from_vector(std::vector<bool>{false, true}, {2}),
                               -INFINITY);
  check_close(neg_inf, {1, -INFINITY});
}

TEST_CASE("one_hot is a 0/1 tensor and not differentiable") {
  std::vector<int64_t> lv{2, 0, 3, 1, 1, 3};
  for (DType dt : kAllNumeric)
    for (const Tensor& labels : layouts(ti64(lv, {2, 3}))) {
      Tensor oh = one_hot(labels, 4, dt);
      CHECK(oh.shape() == Shape{2, 3, 4});
      CHECK(oh.dtype() == dt);
      std::vector<double> want(24, 0.0);
      for (size_t i = 0; i < 6; ++i) want[i * 4 + size_t(lv[i])] = 1.0;
      check_close(oh, want, 0.0);
      CHECK_FALSE(oh.requires_grad());
      CHECK(oh.grad_fn() == nullptr);
    }
  CHECK(one_hot(ti64({1}, {1}), 3).dtype() == kFloat32);
  Tensor scalar = one_hot(Tensor::scalar(2, kInt64), 3);
  CHECK(scalar.shape() == Shape{3});
  check_close(scalar, {0, 0, 1});
}

TEST_CASE("masked_fill_ writes in place, through a strided view, and refuses what masked_fill refuses") {
  Tensor x = Tensor::zeros({3, 2});
  Tensor col = slice(x, 1, 1, 2);  // (3, 1), stride 2
  Tensor mask = Tensor::from_vector(std::vector<bool>{true, false, true}, {3, 1});
  const int64_t v = x.version();
  CHECK(&masked_fill_(col, mask, 4.0) == &col);
  CHECK(values(x) == std::vector<double>{0, 4, 0, 0, 0, 4});
  CHECK(x.version() > v);
  CHECK_THROWS_WITH_AS(masked_fill_(x, Tensor::from_vector(std::vector<bool>{true, false, true}, {3}), 1.0),
                       "[masked_fill_] shapes (3,2) and (3) cannot be broadcast together", ShapeError);
  CHECK_THROWS_WITH_AS(masked_fill_(x, Tensor::zeros({3, 2}), 1.0),
                       "[masked_fill_] argument 'mask' must be bool, got float32 (3,2) on cpu", DTypeError);
  Tensor ints = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_WITH_AS(masked_fill_(ints, Tensor::from_vector(std::vector<bool>{true, false}, {2}), std::nan("")),
                       doctest::Contains("[masked_fill_] value nan cannot be stored in"), ValueError);
  Tensor row = t32({1, 2, 3}, {3});
  Tensor wide = expand(row, {2, 3});  // one element under several mask entries: refused before any write
  CHECK_THROWS_WITH_AS(masked_fill_(wide, Tensor::from_vector(std::vector<bool>{true, false, false, false, true, false},
                                                              {2, 3}), 9.0),
                       doctest::Contains("[masked_fill_]"), ValueError);
  CHECK(values(row) == std::vector<double>{1, 2, 3});
  Tensor leaf = leaf64({2});
  CHECK_THROWS_WITH_AS(masked_fill_(leaf, Tensor::from_vector(std::vector<bool>{true, false}, {2}), 1.0),
                       doctest::Contains("[masked_fill_] in-place change of a tensor that requires grad"), AutogradError);
}

TEST_CASE("scatter_ and scatter_add_ write through a view, record nothing, and refuse what they must") {
  Tensor x = Tensor::zeros({3, 4});
  Tensor col = slice(x, 1, 1, 2);  // (3, 1), stride 4: a view of x's second column
  const int64_t v = x.version();
  CHECK(&scatter_(col, 0, ti64({2, 0}, {2, 1}), t32({5, 6}, {2, 1})) == &col);
  CHECK(values(x) == std::vector<double>{0, 6, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0});
  CHECK(x.version() > v);
  scatter_add_(col, 0, ti64({2, 2}, {2, 1}), t32({1, 2}, {2, 1}));
  CHECK(values(col) == std::vector<double>{6, 0, 8});
  // an index or src that is x itself (or shares its memory) is read before anything is written
  Tensor ids = ti64({1, 0, 1}, {3});
  scatter_(ids, 0, ids, ti64({7, 8, 9}, {3}));
  CHECK(values(ids) == std::vector<double>{8, 9, 1});
  Tensor r = t32({1, 2, 3}, {3});
  scatter_add_(r, 0, ti64({2, 1, 0}, {3}), r);
  CHECK(values(r) == std::vector<double>{4, 4, 4});
  // the checks of scatter and of every in-place op, under these names, before any write
  Tensor y = t32({1, 2, 3}, {3});
  CHECK_THROWS_WITH_AS(scatter_(y, 0, ti64({3}, {1}), t32({9}, {1})),
                       doctest::Contains("[scatter_] index 3 is out of range"), IndexError);
  CHECK_THROWS_WITH_AS(scatter_add_(y, 0, ti64({0}, {1}), t64({9}, {1})),
                       doctest::Contains("[scatter_add_]"), DTypeError);
  CHECK_THROWS_WITH_AS(scatter_(y, 1, ti64({0}, {1}), t32({9}, {1})), doctest::Contains("[scatter_]"), IndexError);
  Tensor flags = Tensor::zeros({2}, kBool);
  CHECK_THROWS_WITH_AS(scatter_add_(flags, 0, ti64({0}, {1}), Tensor::zeros({1}, kBool)),
                       doctest::Contains("[scatter_add_]"), DTypeError);
  Tensor wide = expand(t32({1, 2}, {1, 2}), {3, 2});
  CHECK_THROWS_WITH_AS(scatter_(wide, 0, ti64({0}, {1, 1}), t32({9}, {1, 1})),
                       doctest::Contains("[scatter_] the tensor"), ValueError);
  Tensor leaf = leaf64({2});
  CHECK_THROWS_WITH_AS(scatter_(leaf, 0, ti64({0}, {1}), t64({9}, {1})),
                       doctest::Contains("[scatter_] in-place change of a tensor that requires grad"), AutogradError);
  Tensor plain = t64({1, 2}, {2});
  CHECK_THROWS_WITH_AS(scatter_add_(plain, 0, ti64({0}, {1}), leaf64({1})),
                       doctest::Contains("[scatter_add_] the value written requires grad"), AutogradError);
  CHECK(values(y) == std::vector<double>{1, 2, 3});
  CHECK(values(plain) == std::vector<double>{1, 2});
  {
    NoGradGuard g;  // with recording off, both are allowed, as every in-place op
    scatter_(leaf, 0, ti64({1}, {1}), t64({4}, {1}));
    CHECK(values(leaf)[1] == 4.0);
  }
}

TEST_CASE("index ops record the registry name and differentiate only float inputs") {
  Tensor x = leaf64({3, 4});
  Tensor idx = ti64({0, 1, 1, 2, 3, 3}, {3, 2});
  Tensor y = gather(x, 1, idx);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(std::string(y.grad_fn()->name) == "gather");
  CHECK(std::string(index_select(x, 0, ti64({0, 0}, {2})).grad_fn()->name) == "index_select");
  CHECK(std::string(masked_fill(x, gt(x, 0.0), 0.0).grad_fn()->name) == "masked_fill");
  CHECK(std::string(take_along_dim(x, idx, 1).grad_fn()->name) == "take_along_dim");
  {
    NoGradGuard ng;
    CHECK(gather(x, 1, idx).grad_fn() == nullptr);
  }
  // scatter_add into a constant: only src gets a gradient; the x gradient is the identity.
  Tensor src = leaf64({3, 2}, 2);
  Tensor base = Tensor::zeros({3, 4}, kFloat64);
  Tensor s = scatter_add(base, 1, idx, src);
  CHECK(std::string(s.grad_fn()->name) == "scatter_add");
  sum(s).backward();
  check_close(src.grad(), std::vector<double>(6, 1.0));
  Tensor x2 = leaf64({3, 4}, 3);
  sum(scatter_add(x2, 1, idx, src)).backward();
  check_close(x2.grad(), std::vector<double>(12, 1.0));
  // index_add through x only.
  Tensor x3 = leaf64({3, 4}, 4);
  Tensor ia = index_add(x3, 0, ti64({2, 2}, {2}), Tensor::ones({2, 4}, kFloat64));
  CHECK(std::string(ia.grad_fn()->name) == "index_add");
  sum(mul(ia, ia)).backward();
  check_close(x3.grad(), values(mul(ia.detach(), 2.0)));
}

GRADCHECK_CASE(gather) {
  Tensor idx = ti64({0, 2, 2, 1, 3, 3, 3, 0, 1, 1, 2, 0, 3, 3, 0}, {3, 5});  // duplicates
  check_grad("gather", [idx](const std::vector<Tensor>& x) { return gather(x[0], 1, idx); },
             {leaf64({3, 4})});
  Tensor idx0 = ti64({0, 2, 2, 1, 1, 0}, {2, 3});  // smaller than x off the axis
  check_grad("gather", [idx0](const std::vector<Tensor>& x) { return gather(x[0], 0, idx0); },
             {leaf64({3, 4}, 2)});
}
GRADCHECK_CASE(scatter_add) {
  Tensor idx = ti64({0, 2, 2, 1, 3, 3, 3, 0, 1, 1, 2, 0, 3, 3, 0}, {3, 5});
  check_grad("scatter_add",
             [idx](const std::vector<Tensor>& x) { return scatter_add(x[0], 1, idx, x[1]); },
             {leaf64({3, 4}, 1), leaf64({3, 5}, 2)});
  // src larger than index: its extra entries get a zero gradient.
  check_grad("scatter_add",
             [idx](const std::vector<Tensor>& x) { return scatter_add(x[0], 1, idx, x[1]); },
             {leaf64({4, 4}, 3), leaf64({4, 6}, 4)});
}
GRADCHECK_CASE(scatter) {
  Tensor idx = ti64({0, 2, 2, 1, 3, 3, 3, 0, 1, 1, 2, 0, 3, 3, 0}, {3, 5});  // duplicates
  check_grad("scatter", [idx](const std::vector<Tensor>& x) { return scatter(x[0], 1, idx, x[1]); },
             {leaf64({3, 4}, 1), leaf64({3, 5}, 2)});
  // src larger than index, x larger than index off the axis
  check_grad("scatter", [idx](const std::vector<Tensor>& x) { return scatter(x[0], 1, idx, x[1]); },
             {leaf64({4, 4}, 3), leaf64({4, 6}, 4)});
  Tensor idx0 = ti64({2, 0, 2, 1, 1, 1}, {2, 3});
  check_grad("scatter", [idx0](const std::vector<Tensor>& x) { return scatter(x[0], 0, idx0, x[1]); },
             {leaf64({3, 3}, 5), leaf64({2, 3}, 6)});
}
GRADCHECK_CASE(index_select) {
  Tensor idx = ti64({0, 2, 2, 3, 0}, {5});
  check_grad("index_select",
             [idx](const std::vector<Tensor>& x) { return index_select(x[0], 0, idx); },
             {leaf64({4, 3})});
  check_grad("index_select",
             [idx](const std::vector<Tensor>& x) { return index_select(x[0], 1, idx); },
             {leaf64({2, 4}, 2)});
}
GRADCHECK_CASE(index_add) {
  Tensor idx = ti64({1, 1, 3, 0, 1}, {5});
  check_grad("index_add",
             [idx](const std::vector<Tensor>& x) { return index_add(x[0], 0, idx, x[1]); },
             {leaf64({4, 3}, 1), leaf64({5, 3}, 2)});
  check_grad("index_add",
             [idx](const std::vector<Tensor>& x) { return index_add(x[0], 1, idx, x[1]); },
             {leaf64({2, 4}, 3), leaf64({2, 5}, 4)});
}
GRADCHECK_CASE(take_along_dim) {
  Tensor idx = ti64({0, 3, 3, 1, 2, 2, 0, 1, 1, 3}, {1, 2, 5});  // broadcast on axis 0
  check_grad("take_along_dim",
             [idx](const std::vector<Tensor>& x) { return take_along_dim(x[0], idx, 2); },
             {leaf64({3, 1, 4})});
}
GRADCHECK_CASE(masked_fill) {
  Tensor mask = Tensor::from_vector(std::vector<bool>{true, false, false, true}, {4});
  check_grad("masked_fill",
             [mask](const std::vector<Tensor>& x) { return masked_fill(x[0], mask, 3.0); },
             {leaf64({3, 4})});
}

TEST_CASE("index ops bad input") {
  Tensor x = t32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor idx = ti64({0, 1, 2, 0}, {2, 2});
  Tensor fidx = t32({0, 1, 2, 0}, {2, 2});
  Tensor bad = ti64({0, 3, 1, 0}, {2, 2});
  Tensor negi = ti64({0, 1, -1, 0}, {2, 2});
  Tensor src = t32({1, 1, 1, 1}, {2, 2});

  // gather
  CHECK_THROWS_MSG(gather(x, 1, fidx), DTypeError, "[gather]", "index", "int64", "float32");
  CHECK_THROWS_MSG(gather(x, 1, bad), IndexError, "[gather]", "index 3", "axis 1", "length 3",
                   "(0,1)");
  CHECK_THROWS_MSG(gather(x, 1, negi), IndexError, "[gather]", "index -1", "axis 1", "length 3");
  CHECK_THROWS_MSG(gather(x, 2, idx), IndexError, "[gather]", "axis 2", "2 dimensions");
  CHECK_THROWS_MSG(gather(x, 1, ti64({0, 1}, {2})), ShapeError, "[gather]", "(2)", "(2,3)");
  CHECK_THROWS_MSG(gather(x, 1, ti64({0, 0, 0, 0, 0, 0}, {3, 2})), ShapeError, "[gather]", "(3,2)",
                   "(2,3)", "axis 0");
  CHECK_THROWS_MSG(gather(x, 1, fake_cuda({2, 2}, kInt64)), DeviceError, "[gather]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(gather(Tensor::scalar(1.0), 0, ti64({0}, {1})), ShapeError, "[gather]",
                   "at least one dimension");

  // scatter_add
  CHECK_THROWS_MSG(scatter_add(x, 1, fidx, src), DTypeError, "[scatter_add]", "index", "float32");
  CHECK_THROWS_MSG(scatter_add(x, 1, bad, src), IndexError, "[scatter_add]", "index 3", "axis 1",
                   "length 3");
  CHECK_THROWS_MSG(scatter_add(x, 0, bad, src), IndexError, "[scatter_add]", "index 3", "axis 0",
                   "length 2");
  CHECK_THROWS_MSG(scatter_add(x, -3, idx, src), IndexError, "[scatter_add]", "axis -3");
  CHECK_THROWS_MSG(scatter_add(x, 1, idx, t32({1, 1}, {2, 1})), ShapeError, "[scatter_add]",
                   "(2,2)", "(2,1)");
  CHECK_THROWS_MSG(scatter_add(x, 1, idx, t64({1, 1, 1, 1}, {2, 2})), DTypeError, "[scatter_add]",
                   "float32", "float64");
  CHECK_THROWS_MSG(scatter_add(x, 1, idx, fake_cuda({2, 2})), DeviceError, "[scatter_add]", "cpu",
                   "cuda:0");
  CHECK_THROWS_MSG(scatter_add(Tensor::from_vector(std::vector<bool>{true, false}, {2}), 0,
                               ti64({0}, {1}), Tensor::from_vector(std::vector<bool>{true}, {1})),
                   DTypeError, "[scatter_add]", "bool");

  // scatter: scatter_add's checks (one shared helper), bool allowed
  CHECK_THROWS_MSG(scatter(x, 1, fidx, src), DTypeError, "[scatter]", "index", "float32");
  CHECK_THROWS_MSG(scatter(x, 1, bad, src), IndexError, "[scatter]", "index 3", "axis 1", "length 3");
  CHECK_THROWS_MSG(scatter(x, -3, idx, src), IndexError, "[scatter]", "axis -3");
  CHECK_THROWS_MSG(scatter(x, 1, idx, t32({1, 1}, {2, 1})), ShapeError, "[scatter]", "(2,2)", "(2,1)");
  CHECK_THROWS_MSG(scatter(x, 1, ti64({0, 0, 0, 0, 0, 0}, {3, 2}), t32({1, 1, 1, 1, 1, 1}, {3, 2})), ShapeError,
                   "[scatter]", "larger than x", "axis 0");
  CHECK_THROWS_MSG(scatter(x, 1, ti64({0}, {1}), t32({1}, {1})), ShapeError, "[scatter]",
                   "same number of dimensions");
  CHECK_THROWS_MSG(scatter(x, 1, idx, t64({1, 1, 1, 1}, {2, 2})), DTypeError, "[scatter]", "float32", "float64");
  CHECK_THROWS_MSG(scatter(x, 1, idx, fake_cuda({2, 2})), DeviceError, "[scatter]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(scatter(Tensor(), 1, idx, src), Error, "[scatter]", "x");
  CHECK(values(scatter(Tensor::from_vector(std::vector<bool>{true, false}, {2}), 0, ti64({1}, {1}),
                       Tensor::from_vector(std::vector<bool>{true}, {1}))) == std::vector<double>{1, 1});

  // index_select
  CHECK_THROWS_MSG(index_select(x, 0, t64({0}, {1})), DTypeError, "[index_select]", "float64");
  CHECK_THROWS_MSG(index_select(x, 0, ti64({1, 2}, {2})), IndexError, "[index_select]", "index 2",
                   "axis 0", "length 2");
  CHECK_THROWS_MSG(index_select(x, 5, ti64({0}, {1})), IndexError, "[index_select]", "axis 5");
  CHECK_THROWS_MSG(index_select(x, 0, idx), ShapeError, "[index_select]", "1-d", "(2,2)");
  CHECK_THROWS_MSG(index_select(x, 0, fake_cuda({1}, kInt64)), DeviceError, "[index_select]", "cpu",
                   "cuda:0");

  // index_add
  Tensor row = t32({1, 1, 1}, {1, 3});
  CHECK_THROWS_MSG(index_add(x, 0, t32({0}, {1}), row), DTypeError, "[index_add]", "int64");
  CHECK_THROWS_MSG(index_add(x, 0, ti64({7}, {1}), row), IndexError, "[index_add]", "index 7",
                   "axis 0", "length 2");
  CHECK_THROWS_MSG(index_add(x, 2, ti64({0}, {1}), row), IndexError, "[index_add]", "axis 2");
  CHECK_THROWS_MSG(index_add(x, 0, ti64({0, 1}, {2}), row), ShapeError, "[index_add]", "(1,3)",
                   "(2,3)");
  CHECK_THROWS_MSG(index_add(x, 0, ti64({0}, {1}), fake_cuda({1, 3})), DeviceError, "[index_add]",
                   "cpu", "cuda:0");

  // take_along_dim
  CHECK_THROWS_MSG(take_along_dim(x, fidx, 1), DTypeError, "[take_along_dim]", "float32");
  CHECK_THROWS_MSG(take_along_dim(x, bad, 1), IndexError, "[take_along_dim]", "index 3", "axis 1",
                   "length 3");
  CHECK_THROWS_MSG(take_along_dim(x, idx, 3), IndexError, "[take_along_dim]", "axis 3");
  CHECK_THROWS_MSG(take_along_dim(x, ti64({0, 0, 0, 0, 0, 0}, {3, 2}), 1), ShapeError,
                   "[take_along_dim]", "(3,2)", "(2,3)", "axis 0");
  CHECK_THROWS_MSG(take_along_dim(x, fake_cuda({2, 2}, kInt64), 1), DeviceError, "[take_along_dim]",
                   "cpu", "cuda:0");

  // masked_fill
  Tensor m = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK_THROWS_MSG(masked_fill(x, ti64({1, 0, 1}, {3}), 0.0), DTypeError, "[masked_fill]", "mask",
                   "bool", "int64");
  CHECK_THROWS_MSG(masked_fill(x, Tensor::from_vector(std::vector<bool>{true, false}, {2}), 0.0),
                   ShapeError, "[masked_fill]", "(2,3)", "(2)");
  CHECK_THROWS_MSG(masked_fill(t32({1, 2, 3}, {3}), Tensor::from_vector(
                                   std::vector<bool>(6, true), {2, 3}), 0.0),
                   ShapeError, "[masked_fill]", "(2,3)", "(3)");
  CHECK_THROWS_MSG(masked_fill(x, fake_cuda({3}, kBool), 0.0), DeviceError, "[masked_fill]", "cpu",
                   "cuda:0");
  CHECK_THROWS_MSG(masked_fill(ti64({1, 2, 3}, {3}), m, NAN), ValueError, "[masked_fill]", "nan",
                   "int64");

  // one_hot
  CHECK_THROWS_MSG(one_hot(t32({1}, {1}), 3), DTypeError, "[one_hot]", "labels", "float32");
  CHECK_THROWS_MSG(one_hot(ti64({0, 3}, {2}), 3), IndexError, "[one_hot]", "label 3", "(1)",
                   "num_classes = 3");
  CHECK_THROWS_MSG(one_hot(ti64({-1}, {1}), 3), IndexError, "[one_hot]", "label -1");
  CHECK_THROWS_MSG(one_hot(ti64({0}, {1}), 0), ValueError, "[one_hot]", "num_classes", "0");

  // Devices that exist in the tensor but not in the build.
  if (!cuda_built()) {
    CHECK_THROWS_MSG(gather(fake_cuda({2, 3}), 1, fake_cuda({2, 2}, kInt64)), NotImplementedError,
                     "[gather]", "no CUDA implementation");
    CHECK_THROWS_MSG(one_hot(fake_cuda({2}, kInt64), 3), NotImplementedError, "[one_hot]",
                     "no CUDA implementation");
    CHECK_THROWS_MSG(masked_fill(fake_cuda({3}), fake_cuda({3}, kBool), 1.0), NotImplementedError,
                     "[masked_fill]", "no CUDA implementation");
  }
}

}  // TEST_SUITE

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of the indexing ops (kernels/index/index_cuda.cu) against the CPU:
// every layout the kernels see (transposed / sliced operands, stride-0 broadcast
// index views), duplicate indices, every dtype, empty and multi-block sizes, the
// short-line and sort-based scatter_add paths, float64 gradchecks on CUDA, and
// the out-of-range error (same message as the CPU).

namespace {



// The same error message on both devices for f(x, index) with x/index on that device.
template <typename F>
// On CUDA the range check is deferred (core/cuda.h): the op returns without a host
// round trip and the CPU's error, word for word, comes at the next host read.
void check_same_error(const Tensor& x, const Tensor& index, F&& f) {
  std::string cpu = error_of([&] { f(x, index); });
  const Tensor xg = cuda0(x), ig = cuda0(index);
  const cuda::TransferStats before = cuda::transfer_stats();
  const std::string at_op = error_of([&] { f(xg, ig); });
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  const std::string gpu = at_op.empty() ? error_of([] { cuda::check_errors(); }) : at_op;
  CHECK(!cpu.empty());
  CHECK(gpu == cpu);
  if (!cuda::sync_debug()) {
    CHECK(at_op.empty());
    CHECK(d.device_to_host == 0);
    CHECK(d.synchronizations == 0);
  }
  CHECK(cuda::pending_checks() == 0);
}

}  // namespace

TEST_SUITE("ops/index") {

PARITY_CASE(gather) {
  const Tensor idx = random_ints({3, 5}, 0, 3, 1);  // duplicates, larger than x on the axis
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); }, {leaf32({3, 4}), idx});
  // Index smaller than x off the axis, gathering along axis 0.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 0, x[1]); },
               {leaf32({3, 4}, 2), random_ints({2, 3}, 0, 2, 2)});
  // Non-contiguous x and index (transposed views made inside f).
  check_parity("gather", [](const Inputs& x) { return gather(transpose(x[0], 0, 1), 1, transpose(x[1], 0, 1)); },
               {leaf32({4, 3}, 3), random_ints({5, 3}, 0, 3, 3)});
  check_parity("gather", [](const Inputs& x) { return gather(slice(x[0], 1, 0, 8, 2), 1, x[1]); },
               {leaf32({3, 8}, 4), idx});
  // int64 and bool (forward only).
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {random_ints({3, 4}, -50, 50, 5), idx});
  check_parity("gather", [](const Inputs& x) { return gather(gt(x[0], 0.0), 1, x[1]); },
               {leaf32({3, 4}, 6), idx});
  // Empty index.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {leaf32({3, 4}, 7), Tensor::zeros({3, 0}, kInt64)});
  // 1M outputs: many blocks of the grid-stride loop; the backward is a large scatter_add.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {leaf32({1024, 512}, 8), random_ints({1024, 1024}, 0, 511, 8)});
  check_grad_cuda("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); }, {leaf64({3, 4}), idx});
  check_grad_cuda("gather", [](const Inputs& x) { return gather(x[0], 0, x[1]); },
                  {leaf64({3, 4}, 2), random_ints({2, 3}, 0, 2, 2)});
}

PARITY_CASE(scatter_add) {
  auto f1 = [](const Inputs& x) { return scatter_add(x[0], 1, x[2], x[1]); };
  const Tensor idx = random_ints({3, 5}, 0, 3, 11);
  check_parity("scatter_add", f1, {leaf32({3, 4}), leaf32({3, 5}, 2), idx});
  // src larger than index; x larger than index off the axis.
  check_parity("scatter_add", f1, {leaf32({4, 4}, 3), leaf32({4, 6}, 4), random_ints({3, 5}, 0, 3, 12)});
  // Non-contiguous x, src and index.
  check_parity("scatter_add",
               [](const Inputs& x) {
                 return scatter_add(transpose(x[0], 0, 1), 0, transpose(x[2], 0, 1), slice(x[1], 0, 0, 10, 2));
               },
               {leaf32({3, 4}, 5), leaf32({10, 3}, 6), random_ints({3, 5}, 0, 3, 13)});
  // int64.
  check_parity("scatter_add", f1, {random_ints({3, 4}, -9, 9, 14), random_ints({3, 5}, -9, 9, 15), idx});
  // Empty index: out == x.
  check_parity("scatter_add", f1, {leaf32({3, 4}, 7), leaf32({3, 2}, 8), Tensor::zeros({3, 0}, kInt64)});
  // Long lines with many duplicates: the sort-based path, per-line index (x rows
  // of 300, 4096 terms per line, 64 lines); exercised in float32 and int64.
  const Tensor big_idx = random_ints({64, 4096}, 0, 299, 16);
  check_parity("scatter_add", f1, {leaf32({64, 300}, 9), leaf32({64, 4096}, 10), big_idx});
  check_parity("scatter_add", f1,
               {random_ints({64, 300}, -5, 5, 17), random_ints({64, 4096}, -1000, 1000, 18), big_idx});
  check_grad_cuda("scatter_add", f1, {leaf64({3, 4}, 1), leaf64({3, 5}, 2), idx});
  check_grad_cuda("scatter_add", f1, {leaf64({4, 4}, 3), leaf64({4, 6}, 4), random_ints({3, 5}, 0, 3, 12)});
  // Long lines in float64 gradcheck (sort path in both forward and backward).
  check_grad_cuda("scatter_add", [](const Inputs& x) { return scatter_add(x[0], 0, x[2], x[1]); },
                  {leaf64({5, 2}, 5), leaf64({40, 2}, 6), random_ints({40, 2}, 0, 4, 19)});
}

PARITY_CASE(scatter) {
  auto f1 = [](const Inputs& x) { return scatter(x[0], 1, x[2], x[1]); };
  const Tensor idx = random_ints({3, 5}, 0, 3, 31);
  check_parity("scatter", f1, {leaf32({3, 4}), leaf32({3, 5}, 2), idx});
  check_parity("scatter", f1, {leaf32({4, 4}, 3), leaf32({4, 6}, 4), random_ints({3, 5}, 0, 3, 32)});
  check_parity("scatter",
               [](const Inputs& x) {
                 return scatter(transpose(x[0], 0, 1), 0, transpose(x[2], 0, 1), slice(x[1], 0, 0, 10, 2));
               },
               {leaf32({3, 4}, 5), leaf32({10, 3}, 6), random_ints({3, 5}, 0, 3, 33)});
  // int64, bool and bfloat16 (bits moved by element size)
  check_parity("scatter", f1, {random_ints({3, 4}, -9, 9, 34), random_ints({3, 5}, -9, 9, 35), idx});
  check_parity("scatter", [](const Inputs& x) { return scatter(gt(x[0], 0.0), 1, x[2], gt(x[1], 0.0)); },
               {leaf32({3, 4}, 7), leaf32({3, 5}, 8), idx});
  check_parity("scatter", [](const Inputs& x) { return scatter(to(x[0], kBFloat16), 1, x[2], to(x[1], kBFloat16)); },
               {leaf32({3, 4}, 9), leaf32({3, 5}, 10), idx});
  check_parity("scatter", f1, {leaf32({3, 4}, 11), leaf32({3, 2}, 12), Tensor::zeros({3, 0}, kInt64)});
  // Long lines with many duplicates (the sort path): the last of each run stays, as on the CPU
  const Tensor big_idx = random_ints({64, 4096}, 0, 299, 36);
  check_parity("scatter", f1, {leaf32({64, 300}, 13), leaf32({64, 4096}, 14), big_idx});
  check_parity("scatter", f1, {random_ints({64, 300}, -5, 5, 37), random_ints({64, 4096}, -1000, 1000, 38), big_idx});
  // A shared index line (stride 0 off the axis) on the sort path
  check_parity("scatter", [](const Inputs& x) { return scatter(x[0], 0, expand(x[2], {4000, 64}), x[1]); },
               {leaf32({50, 64}, 15), leaf32({4000, 64}, 16), random_ints({4000, 1}, 0, 49, 39)});
  check_grad_cuda("scatter", f1, {leaf64({3, 4}, 1), leaf64({3, 5}, 2), idx});
  check_grad_cuda("scatter", [](const Inputs& x) { return scatter(x[0], 0, x[2], x[1]); },
                  {leaf64({5, 2}, 5), leaf64({40, 2}, 6), random_ints({40, 2}, 0, 4, 40)});
}

CUDA_TEST_CASE("scatter_add and index_add with duplicates match the CPU exactly and repeat bit for bit") {
  // Every output element gets its terms in ascending position on both devices
  // (index_cuda.cu), in the storage type: the results are bit-identical to the CPU.
  struct Case {
    Tensor x, src, idx;
    int64_t axis;
    bool index_add;
  };
  Generator g(21);
  std::vector<Case> cases = {
      {randn({4, 8}, kFloat32, g), randn({4, 20}, kFloat32, g), random_ints({4, 20}, 0, 2, 22), 1, false},
      {randn({4, 100}, kFloat32, g), randn({4, 5000}, kFloat32, g), random_ints({4, 5000}, 0, 3, 23), 1, false},
      {randn({1000, 64}, kFloat32, g), randn({20000, 64}, kFloat32, g), random_ints({20000}, 0, 999, 24), 0, true},
      {randn({7, 64}, kFloat64, g), randn({3000, 64}, kFloat64, g), random_ints({3000}, 0, 6, 25), 0, true},
      {randn({64, 9}, kFloat32, g), randn({64, 33}, kFloat32, g), random_ints({33}, 0, 8, 26), 1, true},
  };
  for (const Case& c : cases) {
    auto run = [&](Device d) {
      Tensor x = c.x.to(d), s = c.src.to(d), i = c.idx.to(d);
      return c.index_add ? index_add(x, c.axis, i, s) : scatter_add(x, c.axis, i, s);
    };
    Tensor cpu = run(Device::cpu()), g1 = run(Device::cuda(0)), g2 = run(Device::cuda(0));
    CHECK(values(g1) == values(g2));
    CHECK(values(g1) == values(cpu));
  }
}

PARITY_CASE(index_select) {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 2, 2, 3, 0}, {5});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); }, {leaf32({4, 3}), idx});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 1, x[1]); },
               {leaf32({2, 4}, 2), idx});
  check_parity("index_select",
               [](const Inputs& x) { return index_select(transpose(x[0], 0, 1), 1, slice(x[1], 0, 0, 10, 2)); },
               {leaf32({4, 3}, 3), random_ints({10}, 0, 3, 31)});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {random_ints({4, 3}, -9, 9, 32), idx});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {leaf32({4, 3}, 4), Tensor::zeros({0}, kInt64)});
  // Embedding-style lookup: 4096 rows of 256 from a table of 1000 (1M outputs);
  // the backward is an index_add of many rows into the table (sort path).
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {leaf32({1000, 256}, 5), random_ints({4096}, 0, 999, 33)});
  check_grad_cuda("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
                  {leaf64({4, 3}), idx});
  check_grad_cuda("index_select", [](const Inputs& x) { return index_select(x[0], 1, x[1]); },
                  {leaf64({2, 4}, 2), idx});
}

PARITY_CASE(index_add) {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 1, 3, 0, 1}, {5});
  auto f0 = [](const Inputs& x) { return index_add(x[0], 0, x[2], x[1]); };
  auto f1 = [](const Inputs& x) { return index_add(x[0], 1, x[2], x[1]); };
  check_parity("index_add", f0, {leaf32({4, 3}), leaf32({5, 3}, 2), idx});
  check_parity("index_add", f1, {leaf32({2, 4}, 3), leaf32({2, 5}, 4), idx});
  check_parity("index_add",
               [](const Inputs& x) { return index_add(transpose(x[0], 0, 1), 0, x[2], transpose(x[1], 0, 1)); },
               {leaf32({3, 4}, 5), leaf32({3, 5}, 6), idx});
  check_parity("index_add", f0, {random_ints({4, 3}, -9, 9, 41), random_ints({5, 3}, -9, 9, 42), idx});
  check_parity("index_add", f0, {leaf32({4, 3}, 7), Tensor::zeros({0, 3}), Tensor::zeros({0}, kInt64)});
  // Embedding backward shape: 20000 rows of 64 into a table of 1000 (1.28M terms).
  check_parity("index_add", f0, {leaf32({1000, 64}, 8), leaf32({20000, 64}, 9), random_ints({20000}, 0, 999, 43)});
  check_grad_cuda("index_add", f0, {leaf64({4, 3}, 1), leaf64({5, 3}, 2), idx});
  check_grad_cuda("index_add", f1, {leaf64({2, 4}, 3), leaf64({2, 5}, 4), idx});
}

PARITY_CASE(take_along_dim) {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 3, 3, 1, 2, 2, 0, 1, 1, 3}, {1, 2, 5});
  auto f = [](const Inputs& x) { return take_along_dim(x[0], x[1], 2); };
  check_parity("take_along_dim", f, {leaf32({3, 1, 4}), idx});  // broadcast both ways
  check_parity("take_along_dim", f, {leaf32({3, 2, 4}, 2), random_ints({3, 2, 6}, 0, 3, 51)});
  check_parity("take_along_dim",
               [](const Inputs& x) { return take_along_dim(transpose(x[0], 0, 2), x[1], 0); },
               {leaf32({4, 1, 3}, 3), random_ints({5, 2, 1}, 0, 2, 52)});
  check_parity("take_along_dim", f, {random_ints({3, 1, 4}, -9, 9, 53), idx});
  check_parity("take_along_dim", f, {leaf32({3, 1, 4}, 4), Tensor::zeros({1, 2, 0}, kInt64)});
  // Cross-entropy-like pick of one entry per row over many rows.
  check_parity("take_along_dim", [](const Inputs& x) { return take_along_dim(x[0], x[1], 1); },
               {leaf32({1 << 16, 32}, 5), random_ints({1 << 16, 1}, 0, 31, 54)});
  check_grad_cuda("take_along_dim", f, {leaf64({3, 1, 4}), idx});
}

PARITY_CASE(masked_fill) {
  const Tensor mask = Tensor::from_vector(std::vector<bool>{true, false, false, true}, {4});
  auto f = [](const Inputs& x) { return masked_fill(x[0], x[1], 3.0); };
  check_parity("masked_fill", f, {leaf32({3, 4}), mask});  // broadcast mask
  Generator g(3);
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(transpose(x[0], 0, 1), x[1], -2.5); },
               {leaf32({4, 3}, 2), gt(rand({3, 1}, kFloat32, g), 0.5)});
  check_parity("masked_fill", f, {random_ints({3, 4}, -9, 9, 61), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(gt(x[0], 0.0), x[1], 1.0); },
               {leaf32({3, 4}, 4), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(x[0], x[1], -INFINITY); },
               {leaf32({3, 4}, 5), mask});
  check_parity("masked_fill", f, {leaf32({0, 4}, 6), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(x[0], gt(x[1], 0.0), 0.0); },
               {leaf32({1024, 1024}, 7), rand({1024, 1}, kFloat32, g, -1.0, 1.0)});
  check_grad_cuda("masked_fill", f, {leaf64({3, 4}), mask});
}

PARITY_CASE(one_hot) {
  const Tensor labels = random_ints({2, 3}, 0, 4, 71);
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(transpose(x[0], 0, 1), 5, kFloat64); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5, kInt64); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5, kBool); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 3); }, {Tensor::zeros({0, 2}, kInt64)});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 7); }, {Tensor::scalar(4, kInt64)});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 1000); }, {random_ints({4096}, 0, 999, 72)});
}

CUDA_TEST_CASE("scatter_ and scatter_add_ on CUDA write the CPU's values through a strided view") {
  Generator g(31);
  const Tensor x = randn({6, 40}, kFloat32, g), src = randn({6, 900}, kFloat32, g);
  const Tensor idx = random_ints({6, 900}, 0, 19, 32);  // duplicates: the last kept / every term added
  for (bool add : {false, true}) {
    auto run = [&](Device d) {
      Tensor base = x.to(d);
      Tensor view = slice(base, 1, 0, 40, 2);  // (6, 20), stride 2
      Tensor i = idx.to(d), s = src.to(d);
      if (add) scatter_add_(view, 1, i, s);
      else scatter_(view, 1, i, s);
      return base;
    };
    Tensor cpu = run(Device::cpu()), gpu = run(Device::cuda(0));
    CHECK(values(gpu) == values(cpu));
  }
}

CUDA_TEST_CASE("out-of-range indices give the CPU's error on CUDA") {
  const Tensor x = Tensor::zeros({3, 3});
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, -1}, {2, 3});
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { gather(a, 1, i); });
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { scatter_add(a, 1, i, a); });
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { take_along_dim(a, i, 0); });
  const Tensor bad1 = Tensor::from_vector(std::vector<int64_t>{0, 2, 7, -4}, {4});
  check_same_error(x, bad1, [](const Tensor& a, const Tensor& i) { index_select(a, 0, i); });
  check_same_error(x, bad1, [](const Tensor& a, const Tensor& i) {
    index_add(a, 1, i, Tensor::zeros({3, 4}, kFloat32, a.device()));
  });
  check_same_error(x, bad1, [](const Tensor&, const Tensor& i) { one_hot(i, 3); });
  // Many bad entries over many blocks: the first in row-major order is reported,
  // also when the index is a transposed view (row-major order != memory order).
  std::vector<int64_t> v(size_t(1) << 20, 1);
  v[700000] = 9;
  v[300001] = -3;
  v[900000] = 5;
  const Tensor big = Tensor::from_vector(v, {1024, 1024});
  const Tensor wide = Tensor::zeros({1024, 4});
  check_same_error(wide, big, [](const Tensor& a, const Tensor& i) { gather(a, 1, i); });
  check_same_error(wide, big, [](const Tensor& a, const Tensor& i) { gather(a, 1, transpose(i, 0, 1)); });
  CHECK_THROWS_MSG(gather(cuda0(wide), 1, cuda0(big)).cpu(), IndexError, "[gather] index -3", "(292,993)");
}

// ring_append against a FIFO written out by hand: rounds of rows with random keep
// masks (the 9-row round keeps all 9, more than the ring holds), on `device` in
// `dtype`; returns the memory and counters after each round, checked against the
// FIFO on the way.
std::vector<std::pair<Tensor, Tensor>> ring_rounds(Device device, DType dtype = kFloat32) {
  const int64_t cap = 5, d = 3;
  Tensor memory = Tensor::zeros({cap, d}, dtype, device);
  Tensor counters = Tensor::from_vector(std::vector<int64_t>{0, 0, 41, 42}, {4}).to(device);
  std::deque<std::vector<float>> fifo;  // oldest first
  std::mt19937 rng(7);
  std::vector<std::pair<Tensor, Tensor>> out;
  float value = 0;
  for (int64_t n : {int64_t(3), int64_t(0), int64_t(4), int64_t(9), int64_t(2), int64_t(1)}) {
    std::vector<float> rv;
    std::vector<uint8_t> kv;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> row;
      for (int64_t j = 0; j < d; ++j) row.push_back(value++);
      rv.insert(rv.end(), row.begin(), row.end());
      const bool k = n == 9 || rng() % 3 != 0;
      kv.push_back(k);
      if (k) fifo.push_back(row);
      if (fifo.size() > size_t(cap)) fifo.pop_front();
    }
    Tensor rows = to(Tensor::from_vector(rv, {n, d}), dtype).to(device);
    std::vector<bool> kb(kv.begin(), kv.end());
    Tensor keep = Tensor::from_vector(kb, {n}).to(device);
    ring_append(memory, counters, rows, keep, 0, 1);
    const std::vector<int64_t> c = counters.to_vector<int64_t>();
    CHECK(c[0] == int64_t(fifo.size()));
    CHECK(c[2] == 41);  // other counters untouched
    CHECK(c[3] == 42);
    // The FIFO read out of the ring: oldest at next when full, at 0 before.
    const std::vector<double> m = values(memory);
    const int64_t start = c[0] < cap ? 0 : c[1];
    for (int64_t r = 0; r < c[0]; ++r)
      for (int64_t j = 0; j < d; ++j)
        CHECK(m[size_t(((start + r) % cap) * d + j)] == double(fifo[size_t(r)][size_t(j)]));
    if (c[0] < cap) CHECK(c[1] == c[0]);
    out.emplace_back(clone(memory).cpu(), clone(counters).cpu());  // copies: on the CPU .cpu() is the tensor itself
  }
  return out;
}

TEST_CASE("ring_append keeps the newest capacity kept rows in order, wraps, and advances the counters") {
  for (DType dt : {kFloat32, kFloat64, kFloat16}) {  // 4-, 8- and 2-byte rows
    INFO(dt);
    const auto rounds = ring_rounds(Device::cpu(), dt);
    // The 9-row round overwrote the whole ring: full, and the write row went once around.
    CHECK(rounds[3].second.to_vector<int64_t>()[0] == 5);
    CHECK(rounds[3].second.to_vector<int64_t>()[1] == rounds[2].second.to_vector<int64_t>()[1]);
  }
}

TEST_CASE("check_indices raises the caller's error for the first bad id, allows one value, and checks its input") {
  auto raise = [](int64_t at, int64_t v) { throw IndexError(str("[mine] id ", v, " at ", at)); };
  check_indices("mine", Tensor::from_vector(std::vector<int64_t>{0, 2, -1}, {3}), 3, raise, -1);  // -1 allowed
  CHECK_THROWS_MSG(check_indices("mine", Tensor::from_vector(std::vector<int64_t>{0, -1, 5, 7}, {2, 2}), 3, raise),
                   IndexError, "[mine] id -1 at 1");
  CHECK_THROWS_MSG(check_indices("mine", Tensor::from_vector(std::vector<int64_t>{0, -1, 5, 7}, {2, 2}), 3, raise, -1),
                   IndexError, "[mine] id 5 at 2");
  check_indices("mine", Tensor::zeros({0}, kInt64), 0, raise);  // nothing to check
  CHECK_THROWS_MSG(check_indices("mine", Tensor::zeros({2}), 3, raise), DTypeError, "[mine]", "ids");
  CHECK_THROWS_MSG(check_indices("mine", Tensor(), 3, raise), ValueError, "[mine]", "ids");
}

TEST_CASE("ring_append bad input") {
  Tensor memory = Tensor::zeros({4, 2}), counters = Tensor::zeros({4}, kInt64);
  Tensor rows = Tensor::zeros({3, 2});
  const Tensor keep = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  CHECK_THROWS_MSG(ring_append(memory, counters, rows, to(keep, kInt64), 0, 1), ShapeError,
                   "[ring_append] keep must be bool (3,), got");
  CHECK_THROWS_MSG(ring_append(memory, counters, Tensor::zeros({3, 5}), keep, 0, 1), ShapeError,
                   "[ring_append] rows must be (n, 2) of memory's dtype float32, got");
  CHECK_THROWS_MSG(ring_append(memory, counters, to(rows, kFloat64), keep, 0, 1), ShapeError, "rows must be (n, 2)");
  CHECK_THROWS_MSG(ring_append(memory, counters, rows, keep, 1, 1), ShapeError,
                   "[ring_append] counters must be contiguous int64 (k,) holding the size at 1 and the next row at 1");
  CHECK_THROWS_MSG(ring_append(memory, Tensor::zeros({4}), rows, keep, 0, 1), ShapeError, "counters must be");
  CHECK_THROWS_MSG(ring_append(transpose(Tensor::zeros({2, 4}), 0, 1), counters, rows, keep, 0, 1), ShapeError,
                   "[ring_append] memory must be contiguous (cap, d)");
  CHECK_THROWS_MSG(ring_append(memory, counters, rows, Tensor(), 0, 1), ValueError, "[ring_append]", "keep");
}

CUDA_TEST_CASE("ring_append on CUDA writes the CPU's rows and counters without a host round trip") {
  for (DType dt : {kFloat32, kFloat64, kFloat16}) {
    INFO(dt);
    const auto cpu = ring_rounds(Device::cpu(), dt), gpu = ring_rounds(Device::cuda(0), dt);
    REQUIRE(cpu.size() == gpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      CHECK(values(gpu[i].first) == values(cpu[i].first));
      CHECK(gpu[i].second.to_vector<int64_t>() == cpu[i].second.to_vector<int64_t>());
    }
  }
  Tensor memory = Tensor::zeros({4, 2}, kFloat32, Device::cuda(0));
  Tensor counters = Tensor::zeros({4}, kInt64, Device::cuda(0));
  Tensor rows = cuda0(Tensor::ones({6, 2})), keep = cuda0(Tensor::from_vector(std::vector<bool>(6, true), {6}));
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  ring_append(memory, counters, rows, keep, 0, 1);
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.host_to_device == 0);
  CHECK(d.synchronizations == 0);
  CHECK(counters.to_vector<int64_t>() == std::vector<int64_t>{4, 0, 0, 0});  // 4 of 6 written from row 0
  CHECK(values(memory) == std::vector<double>(8, 1.0));
}

}  // TEST_SUITE
