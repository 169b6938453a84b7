#include <cmath>
#include <limits>

#include "nn/losses.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// PyTorch's F.cross_entropy with class weights, in plain doubles. Logits (N, C, inner)
// with the class axis 1; returns the per-target losses and the weight sum.
struct CeRef {
  std::vector<double> losses;
  double wsum = 0;
};
CeRef ce_ref(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& t,
             const std::vector<double>& w, int64_t ignore, double eps) {
  int64_t N = s[0], C = s[1], inner = 1;
  for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  CeRef r;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t y = t[size_t(n * inner + i)];
      if (y == ignore) {
        r.losses.push_back(0);
        continue;
      }
      auto at = [&](int64_t c) { return x[size_t((n * C + c) * inner + i)]; };
      double m = -INFINITY;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, at(c));
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += std::exp(at(c) - m);
      auto logp = [&](int64_t c) { return at(c) - m - std::log(z); };
      double nll = -w[size_t(y)] * logp(y), smooth = 0;
      for (int64_t c = 0; c < C; ++c) smooth -= w[size_t(c)] * logp(c);
      r.losses.push_back((1 - eps) * nll + eps / double(C) * smooth);
      r.wsum += w[size_t(y)];
    }
  return r;
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e;
  return s;
}

Tensor rnd(const Shape& s, DType dt, uint64_t seed, double lo = -2, double hi = 2) {
  Generator g(seed);
  return rand(s, dt, g, lo, hi);
}

void expect_grad_ok(const GradcheckFn& f, const std::vector<Tensor>& inputs) {
  GradcheckResult r = gradcheck(f, inputs);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.entries_checked > 0);
}

}  // namespace

TEST_SUITE("nn/losses") {

// ---------------- cross_entropy ----------------

TEST_CASE("cross_entropy with class weights, ignore_index and label smoothing matches PyTorch's formula") {
  const std::vector<double> w = {0.5, 2.0, 1.0, 0.25};
  struct Case {
    Shape shape;
    std::vector<int64_t> targets;
  };
  for (const Case& c : {Case{{5, 4}, {1, 3, -100, 0, 1}}, Case{{2, 4, 3}, {0, 2, 3, -100, 1, 1}}}) {
    for (DType dt : {kFloat64, kFloat32}) {
      for (double eps : {0.0, 0.2}) {
        INFO("shape ", shape_str(c.shape), " dtype ", dt, " label_smoothing ", eps);
        Tensor x = rnd(c.shape, dt, 3);
        Tensor t = ti64(c.targets, c.shape.size() == 2 ? Shape{c.shape[0]} : Shape{c.shape[0], c.shape[2]});
        CeRef ref = ce_ref(values(x), c.shape, c.targets, w, -100, eps);
        nn::CrossEntropyLossOptions o;
        o.weight = make(dt, w, {4});
        o.label_smoothing = eps;
        double tol = dt == kFloat64 ? 1e-12 : 1e-5;
        o.reduction = Reduction::None;
        check_close(nn::cross_entropy(x, t, o), ref.losses, tol);
        o.reduction = Reduction::Sum;
        check_close(nn::cross_entropy(x, t, o), {total(ref.losses)}, tol);
        o.reduction = Reduction::Mean;
        Tensor m = nn::cross_entropy(x, t, o);
        CHECK(m.dim() == 0);
        check_close(m, {total(ref.losses) / ref.wsum}, tol);
      }
    }
  }
}

TEST_CASE("cross_entropy by hand") {
  // Two samples, logits (0, ln 3): p = (1/4, 3/4). Weights (1, 3).
  Tensor x = t64({0, std::log(3.0), 0, std::log(3.0)}, {2, 2});
  Tensor t = ti64({0, 1}, {2});
  nn::CrossEntropyLossOptions o;
  o.weight = t64({1, 3}, {2});
  // nll: 1 * ln 4 and 3 * ln(4/3); weighted mean divides by 1 + 3.
  double l0 = std::log(4.0), l1 = 3 * std::log(4.0 / 3.0);
  check_close(nn::cross_entropy(x, t, o), {(l0 + l1) / 4}, 1e-14);
  // Label smoothing 0.5: smooth_i = -(1 ln(1/4) + 3 ln(3/4)) for both samples.
  o.label_smoothing = 0.5;
  double sm = std::log(4.0) + 3 * std::log(4.0 / 3.0);
  check_close(nn::cross_entropy(x, t, o), {0.5 * (l0 + l1) / 4 + 0.25 * (2 * sm) / 4}, 1e-14);
  // An ignored row whose logits hold -inf, inf or NaN (masked vocabulary in a padding row) adds nothing:
  // its log p (-inf or NaN) was multiplied by its 0 weight, a NaN loss.
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {-inf, inf, std::nan("")}) {
    INFO("bad logit ", bad);
    Tensor xb = t64({bad, 0, 1, 0, 1, 2}, {2, 3}).set_requires_grad(true);
    nn::CrossEntropyLossOptions ob;
    ob.weight = t64({0.5, 2, 1}, {3});
    for (double eps : {0.0, 0.1}) {
      ob.label_smoothing = eps;
      ob.reduction = Reduction::None;
      std::vector<double> none = values(nn::cross_entropy(xb, ti64({-100, 2}, {2}), ob));
      CHECK(none[0] == 0.0);
      CHECK(std::isfinite(none[1]));
      ob.reduction = Reduction::Mean;
      Tensor loss = nn::cross_entropy(xb, ti64({-100, 2}, {2}), ob);
      CHECK(values(loss)[0] == doctest::Approx(none[1]).epsilon(1e-14));  // weight sum 1: the one real row
      if (bad != -inf) continue;  // (an inf or NaN row's softmax is NaN: its gradient is NaN times 0, as in PyTorch)
      loss.backward();
      for (double g : values(xb.grad())) CHECK(std::isfinite(g));
      xb.zero_grad();
    }
  }
}

TEST_CASE("cross_entropy without weights is the fused op - with unit weights it agrees") {
  Tensor x = rnd({6, 5}, kFloat64, 8);
  Tensor t = ti64({4, -1, 0, 2, -1, 3}, {6});
  for (double eps : {0.0, 0.1}) {
    for (Reduction r : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
      nn::CrossEntropyLossOptions o;
      o.ignore_index = -1;
      o.label_smoothing = eps;
      o.reduction = r;
      CrossEntropyOptions f;
      f.ignore_index = -1;
      f.label_smoothing = eps;
      f.reduction = r;
      Tensor fused = cf::cross_entropy(x, t, f);
      check_close(nn::cross_entropy(x, t, o), fused, 0);
      o.weight = Tensor::ones({5}, kFloat64);
      check_close(nn::cross_entropy(x, t, o), fused, 1e-12);
    }
  }
}

TEST_CASE("cross_entropy with every target ignored is 0 with a zero gradient") {
  Tensor x = leaf64({3, 4}, 2);
  nn::CrossEntropyLossOptions o;
  o.weight = t64({1, 2, 3, 4}, {4});
  o.label_smoothing = 0.1;
  Tensor l = nn::cross_entropy(x, ti64({-100, -100, -100}, {3}), o);
  check_close(l, {0.0}, 0);
  l.backward();
  check_close(x.grad(), std::vector<double>(12, 0.0), 0);
}

TEST_CASE("gradcheck cross_entropy with class weights") {
  Tensor w = t64({0.5, 2.0, 1.0}, {3});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double eps : {0.0, 0.3}) {
      INFO("label_smoothing ", eps);
      nn::CrossEntropyLossOptions o;
      o.weight = w;
      o.label_smoothing = eps;
      o.reduction = r;
      Tensor t2 = ti64({2, -100, 0, 1}, {4});
      expect_grad_ok([o, t2](const std::vector<Tensor>& in) { return nn::cross_entropy(in[0], t2, o); },
                     {leaf64({4, 3}, 5, -2, 2)});
      Tensor t3 = ti64({0, 2, -100, 1, 1, 0}, {2, 3});
      expect_grad_ok([o, t3](const std::vector<Tensor>& in) { return nn::cross_entropy(in[0], t3, o); },
                     {leaf64({2, 3, 3}, 6, -2, 2)});
    }
  }
}

TEST_CASE("cross_entropy bad input") {
  Tensor x = rnd({3, 4}, kFloat32, 1);
  Tensor t = ti64({0, 1, 2}, {3});
  nn::CrossEntropyLossOptions o;
  o.weight = Tensor::ones({5});
  CHECK_THROWS_MSG(nn::cross_entropy(x, t, o), ShapeError, "[cross_entropy]", "class weights float32 (5)",
                   "logits float32 (3,4)", "(4)");
  o.weight = Tensor::ones({4}, kFloat64);
  CHECK_THROWS_MSG(nn::cross_entropy(x, t, o), DTypeError, "[cross_entropy]", "float64 (4)", "float32 (3,4)");
  o.weight = Tensor::ones({4});
  CHECK_THROWS_MSG(nn::cross_entropy(x, ti64({0, 4, 1}, {3}), o), IndexError, "[cross_entropy]",
                   "target 4", "4 classes");
  CHECK_THROWS_MSG(nn::cross_entropy(x, ti64({0, -3, 1}, {3}), o), IndexError, "[cross_entropy]",
                   "target -3");
  CHECK_THROWS_MSG(nn::cross_entropy(x, ti64({0, 1}, {2}), o), ShapeError, "[cross_entropy]", "int64 (2)",
                   "float32 (3,4)");
  CHECK_THROWS_MSG(nn::cross_entropy(x, t32({0, 1, 2}, {3}), o), DTypeError, "[cross_entropy]", "targets",
                   "float32 (3)");
  CHECK_THROWS_MSG(nn::cross_entropy(ti64({0, 1, 2}, {3, 1}), t, o), DTypeError, "[cross_entropy]", "int64");
  CHECK_THROWS_MSG(nn::cross_entropy(rnd({4}, kFloat32, 1), ti64({1}, {}), o), ShapeError,
                   "[cross_entropy]", "(4)");
  o.label_smoothing = 1.0;
  CHECK_THROWS_MSG(nn::cross_entropy(x, t, o), ValueError, "[cross_entropy]", "label_smoothing");
  // Without weights the fused op validates with the same names.
  nn::CrossEntropyLossOptions plain;
  CHECK_THROWS_MSG(nn::cross_entropy(x, ti64({0, 1}, {2}), plain), ShapeError, "[cross_entropy]",
                   "(3,4)");
  CHECK_THROWS_MSG(nn::cross_entropy(x, Tensor(), o), ValueError, "[cross_entropy]", "targets");
}

// ---------------- binary_cross_entropy_with_logits ----------------

namespace {
double bce_ref(double x, double y, double pw, double w) {
  double lw = 1 + (pw - 1) * y;
  return w * ((1 - y) * x + lw * (std::log1p(std::exp(-std::fabs(x))) + std::max(-x, 0.0)));
}
}  // namespace

TEST_CASE("binary_cross_entropy_with_logits values, pos_weight and weight") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO("dtype ", dt);
    Tensor x = rnd({3, 4}, dt, 2, -4, 4);
    Tensor y = rnd({3, 4}, dt, 3, 0, 1);
    std::vector<double> pw = {1.0, 2.0, 0.5, 3.0}, w = {0.5, 1.0, 2.0};
    auto xv = values(x), yv = values(y);
    std::vector<double> plain, weighted;
    for (size_t i = 0; i < xv.size(); ++i) {
      plain.push_back(bce_ref(xv[i], yv[i], 1, 1));
      weighted.push_back(bce_ref(xv[i], yv[i], pw[i % 4], w[i / 4]));
    }
    double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    nn::BCEWithLogitsOptions o;
    o.reduction = Reduction::None;
    check_close(nn::binary_cross_entropy_with_logits(x, y, o), plain, tol);
    o.reduction = Reduction::Sum;
    check_close(nn::binary_cross_entropy_with_logits(x, y, o), {total(plain)}, tol * 10);
    o.reduction = Reduction::Mean;
    check_close(nn::binary_cross_entropy_with_logits(x, y, o), {total(plain) / 12}, tol);
    o.pos_weight = make(dt, pw, {4});
    o.weight = make(dt, w, {3, 1});
    o.reduction = Reduction::None;
    check_close(nn::binary_cross_entropy_with_logits(x, y, o), weighted, tol);
  }
  // By hand: x = 0 gives ln 2 for any target; x = ln 3, y = 1 gives ln(4/3).
  check_close(nn::binary_cross_entropy_with_logits(t64({0, 0, std::log(3.0)}, {3}), t64({0, 1, 1}, {3}),
                                                   {Tensor(), Tensor(), Reduction::None}),
              {std::log(2.0), std::log(2.0), std::log(4.0 / 3.0)}, 1e-15);
}

TEST_CASE("binary_cross_entropy_with_logits is stable for large logits and exact at 0") {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor x = make(dt, {1000, -1000, 1000, -1000, 0, 0}, {6});
    x.set_requires_grad(true);
    Tensor y = make(dt, {0, 0, 1, 1, 0, 1}, {6});
    nn::BCEWithLogitsOptions o;
    o.reduction = Reduction::None;
    Tensor l = nn::binary_cross_entropy_with_logits(x, y, o);
    check_close(l, {1000, 0, 0, 1000, std::log(2.0), std::log(2.0)}, 1e-4);
    sum(l).backward();
    // d/dx = sigmoid(x) - y
    check_close(x.grad(), {1, 0, 0, -1, 0.5, -0.5}, 1e-6);
  }
}

TEST_CASE("gradcheck binary_cross_entropy_with_logits") {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    nn::BCEWithLogitsOptions o;
    o.reduction = r;
    expect_grad_ok([o](const std::vector<Tensor>& in) { return nn::binary_cross_entropy_with_logits(in[0], in[1], o); },
                   {leaf64({3, 4}, 4, -3, 3), leaf64({3, 4}, 5, 0, 1)});
    o.pos_weight = t64({1.0, 2.0, 0.5, 3.0}, {4});
    o.weight = t64({0.5, 1.5, 2.0}, {3, 1});
    expect_grad_ok([o](const std::vector<Tensor>& in) { return nn::binary_cross_entropy_with_logits(in[0], in[1], o); },
                   {leaf64({3, 4}, 6, -3, 3), leaf64({3, 4}, 7, 0, 1)});
  }
}

TEST_CASE("binary_cross_entropy_with_logits bad input") {
  const char* op = "[binary_cross_entropy_with_logits]";
  Tensor x = rnd({2, 3}, kFloat32, 1);
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(x, rnd({3, 2}, kFloat32, 1)), ShapeError, op,
                   "float32 (3,2)", "float32 (2,3)");
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(x, rnd({2, 3}, kFloat64, 1)), DTypeError, op,
                   "float64 (2,3)", "float32 (2,3)");
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(ti64({1, 0}, {2}), ti64({1, 0}, {2})), DTypeError,
                   op, "int64");
  nn::BCEWithLogitsOptions o;
  o.pos_weight = Tensor::ones({2});
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(x, rnd({2, 3}, kFloat32, 2), o), ShapeError, op,
                   "pos_weight float32 (2)", "(2,3)");
  o.pos_weight = Tensor::ones({3}, kFloat64);
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(x, rnd({2, 3}, kFloat32, 2), o), DTypeError, op,
                   "pos_weight float64 (3)");
  nn::BCEWithLogitsOptions ow;
  ow.weight = Tensor::ones({4, 2, 3});  // would enlarge the loss
  CHECK_THROWS_MSG(nn::binary_cross_entropy_with_logits(x, rnd({2, 3}, kFloat32, 2), ow), ShapeError, op,
                   "weight float32 (4,2,3)");
}

// ---------------- mse_loss ----------------

TEST_CASE("mse_loss values, gradcheck and bad input") {
  for (DType dt : {kFloat64, kFloat32}) {
    Tensor a = make(dt, {1, 2, 3, 4}, {2, 2}), b = make(dt, {0, 2, 5, 1}, {2, 2});
    check_close(nn::mse_loss(a, b), {(1 + 0 + 4 + 9) / 4.0}, 0);
    check_close(nn::mse_loss(a, b, Reduction::Sum), {14}, 0);
    check_close(nn::mse_loss(a, b, Reduction::None), {1, 0, 4, 9}, 0);
  }
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    expect_grad_ok([r](const std::vector<Tensor>& in) { return nn::mse_loss(in[0], in[1], r); },
                   {leaf64({3, 2}, 1), leaf64({3, 2}, 2)});
  CHECK_THROWS_MSG(nn::mse_loss(Tensor::zeros({2, 3}), Tensor::zeros({3})), ShapeError, "[mse_loss]",
                   "float32 (2,3)", "float32 (3)");
  CHECK_THROWS_MSG(nn::mse_loss(Tensor::zeros({2}), Tensor::zeros({2}, kFloat64)), DTypeError, "[mse_loss]",
                   "float64 (2)");
  CHECK_THROWS_MSG(nn::mse_loss(ti64({1}, {1}), ti64({1}, {1})), DTypeError, "[mse_loss]", "int64");
  CHECK_THROWS_MSG(nn::mse_loss(Tensor(), Tensor::zeros({2})), ValueError, "[mse_loss]", "'a'");
  // Empty inputs: the mean is named by the loss (it said [mean]), the sum is 0.
  CHECK_THROWS_MSG(nn::mse_loss(Tensor::zeros({0, 2}), Tensor::zeros({0, 2})), ShapeError,
                   "[mse_loss] the mean over no elements", "reduction 'sum' gives 0");
  CHECK(nn::mse_loss(Tensor::zeros({0, 2}), Tensor::zeros({0, 2}), Reduction::Sum).item() == 0.0);
}

// ---------------- chamfer_distance ----------------

namespace {
// Brute force: per batch, mean over a of min over b of |a - b|^2 plus the converse.
std::vector<double> chamfer_ref(const Tensor& a, const Tensor& b) {
  auto av = values(a), bv = values(b);
  int64_t B = a.size(0), N = a.size(1), M = b.size(1), D = a.size(2);
  std::vector<double> out;
  for (int64_t k = 0; k < B; ++k) {
    auto dist = [&](int64_t i, int64_t j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) {
        double diff = av[size_t((k * N + i) * D + d)] - bv[size_t((k * M + j) * D + d)];
        s += diff * diff;
      }
      return s;
    };
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < N; ++i) {
      double m = INFINITY;
      for (int64_t j = 0; j < M; ++j) m = std::min(m, dist(i, j));
      sa += m;
    }
    for (int64_t j = 0; j < M; ++j) {
      double m = INFINITY;
      for (int64_t i = 0; i < N; ++i) m = std::min(m, dist(i, j));
      sb += m;
    }
    out.push_back(sa / double(N) + sb / double(M));
  }
  return out;
}
}  // namespace

TEST_CASE("chamfer_distance matches brute force") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO("dtype ", dt);
    Tensor a = rnd({2, 5, 3}, dt, 1), b = rnd({2, 7, 3}, dt, 2);
    std::vector<double> ref = chamfer_ref(a, b);
    double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    check_close(nn::chamfer_distance(a, b, Reduction::None), ref, tol);
    check_close(nn::chamfer_distance(a, b, Reduction::Sum), {ref[0] + ref[1]}, tol);
    check_close(nn::chamfer_distance(a, b), {(ref[0] + ref[1]) / 2}, tol);
  }
  // By hand: a = {(0,0), (2,0)}, b = {(0,1)}: a->b mean (1 + 5) / 2 = 3, b->a 1.
  check_close(nn::chamfer_distance(t64({0, 0, 2, 0}, {1, 2, 2}), t64({0, 1}, {1, 1, 2})), {4.0}, 1e-14);
  // Identical sets: 0.
  Tensor p = rnd({1, 4, 2}, kFloat64, 3);
  check_close(nn::chamfer_distance(p, p), {0.0}, 1e-12);
}

TEST_CASE("gradcheck chamfer_distance") {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    expect_grad_ok([r](const std::vector<Tensor>& in) { return nn::chamfer_distance(in[0], in[1], r); },
                   {leaf64({2, 4, 3}, 11, -2, 2), leaf64({2, 5, 3}, 12, -2, 2)});
}

TEST_CASE("chamfer_distance bad input") {
  const char* op = "[chamfer_distance]";
  CHECK_THROWS_MSG(nn::chamfer_distance(Tensor::zeros({2, 4, 3}), Tensor::zeros({2, 5, 2})), ShapeError, op,
                   "float32 (2,4,3)", "float32 (2,5,2)");
  CHECK_THROWS_MSG(nn::chamfer_distance(Tensor::zeros({2, 4, 3}), Tensor::zeros({3, 5, 3})), ShapeError, op,
                   "(3,5,3)");
  CHECK_THROWS_MSG(nn::chamfer_distance(Tensor::zeros({4, 3}), Tensor::zeros({5, 3})), ShapeError, op,
                   "(B, N, D)", "(4,3)");
  CHECK_THROWS_MSG(nn::chamfer_distance(Tensor::zeros({1, 0, 3}), Tensor::zeros({1, 5, 3})), ShapeError, op,
                   "empty");
  CHECK_THROWS_MSG(nn::chamfer_distance(Tensor::zeros({1, 2, 3}), Tensor::zeros({1, 2, 3}, kFloat64)),
                   DTypeError, op, "float64 (1,2,3)");
  CHECK_THROWS_MSG(nn::chamfer_distance(ti64({1}, {1, 1, 1}), ti64({1}, {1, 1, 1})), DTypeError, op, "int64");
}

// ---------------- AuxLosses ----------------

TEST_CASE("AuxLosses sums named losses with per-name weights") {
  Tensor x = leaf64({3}, 1);
  nn::AuxLosses aux;
  CHECK(aux.empty());
  aux.add("l1", sum(x));
  aux.add("l2", sum(square(x)));
  aux.add("l1", reshape(mean(x), {1}));  // one-element tensors are accepted
  CHECK(aux.names() == std::vector<std::string>{"l1", "l2"});
  CHECK(aux.get("l1").size() == 2);
  CHECK(aux.get("nothing").empty());
  Tensor t = aux.total({{"l1", 0.5}, {"l2", 2.0}});
  CHECK(t.dim() == 0);
  auto xv = values(x.detach());
  double s = xv[0] + xv[1] + xv[2], sq = xv[0] * xv[0] + xv[1] * xv[1] + xv[2] * xv[2];
  check_close(t, {0.5 * (s + s / 3) + 2.0 * sq}, 1e-14);
  t.backward();
  for (size_t i = 0; i < 3; ++i) CHECK(values(x.grad())[i] == doctest::Approx(0.5 * (1 + 1.0 / 3) + 4 * xv[i]));

  CHECK_THROWS_MSG(aux.total({{"l1", 1.0}}), ValueError, "[AuxLosses::total]", "no weight for aux loss 'l2'",
                   "l1");
  CHECK_THROWS_MSG(aux.total({{"l1", 1.0}, {"l2", 1.0}, {"l3", 1.0}}), ValueError, "[AuxLosses::total]",
                   "unknown aux loss 'l3'", "collected: l1, l2");
  aux.clear();
  CHECK(aux.empty());
  CHECK_THROWS_MSG(aux.total({}), ValueError, "[AuxLosses::total]", "no auxiliary loss");
  CHECK_THROWS_MSG(aux.add("v", Tensor::zeros({2})), ValueError, "[AuxLosses::add]", "'v'", "float32 (2)");
  CHECK_THROWS_MSG(aux.add("", Tensor::scalar(1.0)), ValueError, "[AuxLosses::add]", "empty");
  aux.add("a", Tensor::scalar(1.0, kFloat32));
  aux.add("b", Tensor::scalar(1.0, kFloat64));
  CHECK_THROWS_MSG(aux.total({{"a", 1.0}, {"b", 1.0}}), DTypeError, "[AuxLosses::total]", "'b'", "float64");
}

}  // TEST_SUITE
