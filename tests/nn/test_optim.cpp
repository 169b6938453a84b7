#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "nn/optim/adam.h"
#include "nn/optim/clip.h"
#include "nn/optim/schedule.h"
#include "nn/optim/sgd.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;
using cf::nn::StateDict;

namespace {

// The tiny problem: L(p) = sum(0.5 * c * p^2 + d * p), so dL/dp = c * p + d.
const std::vector<double> kC = {1.0, 2.5, 0.5, 4.0};
const std::vector<double> kD = {0.3, -1.0, 2.0, 0.7};
const std::vector<double> kP0 = {0.5, -1.5, 1.0, 2.0};

Tensor quad_loss(const Tensor& p) {
  Tensor c = make(p.dtype(), kC, {4}), d = make(p.dtype(), kD, {4});
  return sum(add(mul(mul(c, square(p)), 0.5), mul(d, p)));
}

// Reference update rules in plain doubles: one call = one step on p (with its state).
struct RefState {
  std::vector<double> buf, m, v;
  int64_t t = 0;
};
using RefStep = std::function<void(std::vector<double>& p, const std::vector<double>& g, RefState& s)>;

RefStep ref_sgd(double lr, double mom, double damp, bool nesterov, double wd) {
  return [=](std::vector<double>& p, const std::vector<double>& g, RefState& s) {
    ++s.t;
    if (s.buf.empty()) s.buf.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (mom != 0) {
        s.buf[i] = s.t == 1 ? d : mom * s.buf[i] + (1 - damp) * d;
        d = nesterov ? d + mom * s.buf[i] : s.buf[i];
      }
      p[i] -= lr * d;
    }
  };
}

RefStep ref_adam(double lr, double b1, double b2, double eps, double wd, bool decoupled) {
  return [=](std::vector<double>& p, const std::vector<double>& g0, RefState& s) {
    ++s.t;
    if (s.m.empty()) s.m.assign(p.size(), 0.0), s.v.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = g0[i];
      if (decoupled) p[i] *= 1 - lr * wd;
      else g += wd * p[i];
      s.m[i] = b1 * s.m[i] + (1 - b1) * g;
      s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
      double bc1 = 1 - std::pow(b1, double(s.t)), bc2 = 1 - std::pow(b2, double(s.t));
      p[i] -= lr / bc1 * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + eps);
    }
  };
}

std::vector<double> quad_grad(const std::vector<double>& p) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = kC[i] * p[i] + kD[i];
  return g;
}

Tensor param(DType dt, const std::vector<double>& v, const Shape& s) {
  Tensor p = make(dt, v, s);
  p.set_requires_grad(true);
  return p;
}

using OptFactory = std::function<std::unique_ptr<nn::Optimizer>(const StateDict&)>;

// Runs `steps` optimizer steps on the quadratic and compares with the reference after each.
void compare_with_reference(const OptFactory& make_opt, const RefStep& ref, int steps) {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO("dtype ", dt);
    Tensor p = param(dt, kP0, {4});
    auto opt = make_opt({{"w", p}});
    std::vector<double> rp = kP0;
    RefState rs;
    double tol = dt == kFloat64 ? 1e-12 : 2e-5;
    for (int s = 0; s < steps; ++s) {
      INFO("step ", s + 1);
      opt->zero_grad();
      quad_loss(p).backward();
      opt->step();
      ref(rp, quad_grad(rp), rs);
      check_close(p, rp, tol);
    }
    CHECK(opt->step_count() == steps);
  }
}

}  // namespace

TEST_SUITE("nn/optim") {

TEST_CASE("SGD matches PyTorch's update rules step by step") {
  struct Cfg {
    double lr, mom, damp;
    bool nesterov;
    double wd;
  };
  for (Cfg c : {Cfg{0.1, 0, 0, false, 0}, Cfg{0.1, 0.9, 0, false, 0}, Cfg{0.05, 0.9, 0.3, false, 0},
                Cfg{0.1, 0.8, 0, true, 0}, Cfg{0.1, 0.9, 0, true, 0.01}, Cfg{0.2, 0, 0, false, 0.1}}) {
    INFO("lr ", c.lr, " momentum ", c.mom, " dampening ", c.damp, " nesterov ", c.nesterov, " wd ", c.wd);
    nn::SGDOptions o;
    o.lr = c.lr;
    o.momentum = c.mom;
    o.dampening = c.damp;
    o.nesterov = c.nesterov;
    o.weight_decay = c.wd;
    compare_with_reference([o](const StateDict& ps) { return std::make_unique<nn::SGD>(ps, o); },
                           ref_sgd(c.lr, c.mom, c.damp, c.nesterov, c.wd), 6);
  }
}

TEST_CASE("Adam and AdamW match PyTorch's update rules step by step") {
  for (double wd : {0.0, 0.05}) {
    INFO("weight decay ", wd);
    nn::AdamOptions o;
    o.lr = 0.05;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-6;
    o.weight_decay = wd;
    compare_with_reference([o](const StateDict& ps) { return std::make_unique<nn::Adam>(ps, o); },
                           ref_adam(0.05, 0.8, 0.95, 1e-6, wd, false), 6);
    nn::AdamWOptions ow;
    ow.lr = 0.05;
    ow.beta1 = 0.8;
    ow.beta2 = 0.95;
    ow.eps = 1e-6;
    ow.weight_decay = wd;
    compare_with_reference([ow](const StateDict& ps) { return std::make_unique<nn::AdamW>(ps, ow); },
                           ref_adam(0.05, 0.8, 0.95, 1e-6, wd, true), 6);
  }
  CHECK(nn::AdamWOptions().weight_decay == 1e-2);  // PyTorch's AdamW default
  CHECK(nn::AdamOptions().weight_decay == 0.0);
}

TEST_CASE("a learning rate changed between steps is used by the next step") {
  Tensor p = param(kFloat64, kP0, {4});
  nn::Adam opt({{"w", p}}, nn::AdamOptions{});
  std::vector<double> rp = kP0;
  RefState rs;
  for (int s = 1; s <= 4; ++s) {
    double lr = 0.01 * s;
    opt.set_lr(lr);
    CHECK(opt.lr() == lr);
    opt.zero_grad();
    quad_loss(p).backward();
    opt.step();
    ref_adam(lr, 0.9, 0.999, 1e-8, 0, false)(rp, quad_grad(rp), rs);
    check_close(p, rp, 1e-12);
  }
  CHECK_THROWS_MSG(opt.set_lr(-1), ValueError, "[Adam.set_lr]", "-1");
  CHECK_THROWS_MSG(opt.set_lr(std::nan("")), ValueError, "[Adam.set_lr] learning rate must be finite and >= 0, got nan");
}

TEST_CASE("non-contiguous and large parameters take the op path and agree with the fused loop") {
  // Same values: a contiguous (40, 1100) parameter (44000 elements: the OpenMP
  // loop) and a transposed view of a (1100, 40) tensor (the public-op path).
  for (DType dt : {kFloat64, kFloat32}) {
    INFO("dtype ", dt);
    Generator gen(3);
    Tensor base = rand({1100, 40}, dt, gen, -1, 1);
    Tensor a = contiguous(transpose(base, 0, 1)).detach();
    Tensor b = transpose(clone(base), 0, 1).detach();
    REQUIRE(a.is_contiguous());
    REQUIRE_FALSE(b.is_contiguous());
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor target = rand({40, 1100}, dt, gen, -1, 1);
    for (int kind = 0; kind < 3; ++kind) {
      INFO("optimizer ", kind);
      std::unique_ptr<nn::Optimizer> oa, ob;
      if (kind == 0) {
        nn::SGDOptions o;
        o.lr = 0.1, o.momentum = 0.9, o.nesterov = true, o.weight_decay = 0.01;
        oa = std::make_unique<nn::SGD>(StateDict{{"p", a}}, o);
        ob = std::make_unique<nn::SGD>(StateDict{{"p", b}}, o);
      } else if (kind == 1) {
        nn::AdamOptions o;
        o.lr = 0.01, o.weight_decay = 0.1;
        oa = std::make_unique<nn::Adam>(StateDict{{"p", a}}, o);
        ob = std::make_unique<nn::Adam>(StateDict{{"p", b}}, o);
      } else {
        nn::AdamWOptions o;
        o.lr = 0.01;
        oa = std::make_unique<nn::AdamW>(StateDict{{"p", a}}, o);
        ob = std::make_unique<nn::AdamW>(StateDict{{"p", b}}, o);
      }
      for (int s = 0; s < 3; ++s) {
        oa->zero_grad();
        ob->zero_grad();
        sum(square(sub(a, target))).backward();
        sum(square(sub(b, target))).backward();
        oa->step();
        ob->step();
      }
      check_close(b, a, dt == kFloat64 ? 1e-12 : 1e-6);
    }
  }
}

TEST_CASE("parameters without a gradient are skipped") {
  Tensor w = param(kFloat64, {1, 2}, {2});
  Tensor unused = param(kFloat64, {3, 4}, {2});
  nn::Adam opt({{"w", w}, {"unused", unused}}, nn::AdamOptions{});
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    sum(square(w)).backward();
    opt.step();
  }
  check_close(unused, {3, 4}, 0);
  StateDict sd = opt.state_dict();
  CHECK(nn::find_entry(sd, "step")->item<int64_t>() == 3);
  CHECK(nn::find_entry(sd, "step.w")->item<int64_t>() == 3);
  CHECK(nn::find_entry(sd, "step.unused")->item<int64_t>() == 0);
  check_close(*nn::find_entry(sd, "exp_avg.unused"), {0, 0}, 0);
  // A parameter that starts getting gradients later gets its first (bias-corrected) step.
  opt.zero_grad();
  sum(square(unused)).backward();
  opt.step();
  // Adam's first step moves each coordinate by lr * sign(g) (up to eps).
  check_close(unused, {3 - 1e-3, 4 - 1e-3}, 1e-9);
}

TEST_CASE("zero_grad drops every gradient") {
  Tensor w = param(kFloat32, {1, 2}, {2});
  nn::SGD opt({{"w", w}}, nn::SGDOptions{});
  sum(square(w)).backward();
  REQUIRE(w.grad().defined());
  opt.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("parameter groups: lr_scale and a per-group weight decay") {
  Tensor w = param(kFloat64, {1, -2}, {2});
  Tensor b = param(kFloat64, {0.5}, {1});
  Tensor frozen = param(kFloat64, {7}, {1});
  nn::ParamGroup g1{{{"w", w}}, 1.0, std::nullopt};
  nn::ParamGroup g2{{{"b", b}}, 0.5, 0.0};
  nn::ParamGroup g3{{{"frozen", frozen}}, 0.0, std::nullopt};
  nn::SGDOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.2;
  nn::SGD opt({g1, g2, g3}, o);
  CHECK(opt.param_groups().size() == 3);
  sum(mul(w, 1.0)).backward();  // g = 1
  sum(mul(b, 1.0)).backward();
  sum(mul(frozen, 1.0)).backward();
  opt.step();
  check_close(w, {1 - 0.1 * (1 + 0.2 * 1), -2 - 0.1 * (1 + 0.2 * -2)}, 1e-15);
  check_close(b, {0.5 - 0.05 * 1}, 1e-15);  // lr * 0.5, no decay
  check_close(frozen, {7}, 0);
}

TEST_CASE("parameter groups changed between steps: lr_scale and weight decay, and bad values named") {
  Tensor w = param(kFloat64, {1}, {1});
  Tensor b = param(kFloat64, {1}, {1});
  nn::SGDOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  nn::SGD opt({nn::ParamGroup{{{"w", w}}, 1.0, std::nullopt}, nn::ParamGroup{{{"b", b}}, 1.0, std::nullopt}}, o);
  CHECK(opt.weight_decay() == 0.5);
  opt.set_group_lr_scale(1, 2.0);
  opt.set_group_weight_decay(0, 0.0);
  sum(mul(w, 1.0)).backward();  // g = 1
  sum(mul(b, 1.0)).backward();
  opt.step();
  check_close(w, {1 - 0.1 * 1}, 1e-15);              // its own decay 0
  check_close(b, {1 - 0.2 * (1 + 0.5 * 1)}, 1e-15);  // lr 0.1 * 2, the optimizer's decay
  opt.set_group_weight_decay(0, std::nullopt);
  CHECK(!opt.param_groups()[0].weight_decay.has_value());
  CHECK_THROWS_WITH_AS(opt.set_group_lr_scale(2, 1.0), "[SGD.set_group_lr_scale] group 2 does not exist (2 groups)",
                       IndexError);
  CHECK_THROWS_WITH_AS(opt.set_group_lr_scale(0, -1.0),
                       "[SGD.set_group_lr_scale] parameter group 0: lr_scale must be finite and >= 0, got -1",
                       ValueError);
  CHECK_THROWS_WITH_AS(opt.set_group_weight_decay(1, std::nan("")),
                       "[SGD.set_group_weight_decay] parameter group 1: weight_decay must be finite and >= 0, got nan",
                       ValueError);
  CHECK_THROWS_WITH_AS(opt.set_group_weight_decay(5, 0.1), "[SGD.set_group_weight_decay] group 5 does not exist (2 groups)",
                       IndexError);
}

TEST_CASE("optimizers decrease a least-squares loss and the Rosenbrock function") {
  Generator gen(11);
  Tensor X = rand({32, 4}, kFloat32, gen, -1, 1);
  Tensor w_true = t32({1.5f, -2.0f, 0.5f, 3.0f}, {4, 1});
  Tensor y = matmul(X, w_true);
  for (int kind = 0; kind < 4; ++kind) {
    INFO("optimizer ", kind);
    Tensor w = Tensor::zeros({4, 1});
    w.set_requires_grad(true);
    std::unique_ptr<nn::Optimizer> opt;
    if (kind == 0) {
      nn::SGDOptions o;
      o.lr = 0.1;
      opt = std::make_unique<nn::SGD>(StateDict{{"w", w}}, o);
    } else if (kind == 1) {
      nn::SGDOptions o;
      o.lr = 0.05, o.momentum = 0.9, o.nesterov = true;
      opt = std::make_unique<nn::SGD>(StateDict{{"w", w}}, o);
    } else if (kind == 2) {
      nn::AdamOptions o;
      o.lr = 0.05;
      opt = std::make_unique<nn::Adam>(StateDict{{"w", w}}, o);
    } else {
      nn::AdamWOptions o;
      o.lr = 0.05, o.weight_decay = 1e-4;
      opt = std::make_unique<nn::AdamW>(StateDict{{"w", w}}, o);
    }
    double first = 0, last = 0;
    for (int s = 0; s < 300; ++s) {
      opt->zero_grad();
      Tensor loss = mean(square(sub(matmul(X, w), y)));
      if (s == 0) first = loss.item();
      last = loss.item();
      loss.backward();
      opt->step();
    }
    CHECK(last < 1e-3 * first);
  }
  // Rosenbrock (1 - x)^2 + 100 (y - x^2)^2 from (-1.5, 2); minimum 0 at (1, 1).
  Tensor xy = param(kFloat64, {-1.5, 2.0}, {2});
  nn::AdamOptions o;
  o.lr = 0.02;
  nn::Adam opt({{"xy", xy}}, o);
  auto rosen = [&]() {
    Tensor x = slice(xy, 0, 0, 1), yv = slice(xy, 0, 1, 2);
    return sum(add(square(1.0 - x), mul(square(sub(yv, square(x))), 100.0)));
  };
  double first = rosen().item(), last = first;
  for (int s = 0; s < 3000; ++s) {
    opt.zero_grad();
    Tensor l = rosen();
    last = l.item();
    l.backward();
    opt.step();
  }
  CHECK(last < 1e-3 * first);
  check_close(xy, {1.0, 1.0}, 0.05);
}

TEST_CASE("state_dict round trip: two optimizers continue bit-identically") {
  for (int kind = 0; kind < 3; ++kind) {
    INFO("optimizer ", kind);
    auto build = [kind](const StateDict& ps) -> std::unique_ptr<nn::Optimizer> {
      if (kind == 0) {
        nn::SGDOptions o;
        o.lr = 0.05, o.momentum = 0.9, o.dampening = 0.1;
        return std::make_unique<nn::SGD>(ps, o);
      }
      if (kind == 1) return std::make_unique<nn::Adam>(ps, nn::AdamOptions{});
      return std::make_unique<nn::AdamW>(ps, nn::AdamWOptions{});
    };
    Generator gen(5);
    Tensor w1 = rand({3, 2}, kFloat32, gen, -1, 1), b1 = rand({2}, kFloat64, gen, -1, 1);
    w1.set_requires_grad(true);
    b1.set_requires_grad(true);
    Tensor tw = rand({3, 2}, kFloat32, gen, -1, 1), tb = rand({2}, kFloat64, gen, -1, 1);
    auto train_step = [&](nn::Optimizer& opt, const Tensor& w, const Tensor& b) {
      opt.zero_grad();
      sum(square(sub(w, tw))).backward();
      sum(mul(square(sub(b, tb)), b)).backward();
      opt.step();
    };
    auto opt1 = build({{"layer.w", w1}, {"layer.b", b1}});
    opt1->set_lr(0.03);
    for (int s = 0; s < 3; ++s) train_step(*opt1, w1, b1);
    StateDict sd = opt1->state_dict();

    Tensor w2 = clone(w1).detach(), b2 = clone(b1).detach();
    w2.set_requires_grad(true);
    b2.set_requires_grad(true);
    auto opt2 = build({{"layer.w", w2}, {"layer.b", b2}});
    opt2->load_state_dict(sd);
    CHECK(opt2->step_count() == 3);
    CHECK(opt2->lr() == 0.03);
    for (int s = 0; s < 4; ++s) {
      train_step(*opt1, w1, b1);
      train_step(*opt2, w2, b2);
    }
    CHECK(w1.to_vector<float>() == w2.to_vector<float>());
    CHECK(b1.to_vector<double>() == b2.to_vector<double>());
    // The state dict is a snapshot: training on did not change sd.
    StateDict now = opt1->state_dict();
    CHECK(nn::find_entry(sd, "step")->item<int64_t>() == 3);
    CHECK(nn::find_entry(now, "step")->item<int64_t>() == 7);
  }
}

TEST_CASE("state_dict keys") {
  Tensor w = param(kFloat32, {1, 2}, {2});
  Tensor b = param(kFloat32, {1}, {1});
  auto keys = [](const StateDict& sd) {
    std::vector<std::string> k;
    for (const auto& e : sd) k.push_back(e.first);
    return k;
  };
  nn::SGD plain({{"w", w}, {"b", b}}, nn::SGDOptions{});
  CHECK(keys(plain.state_dict()) == std::vector<std::string>{"step", "lr"});
  nn::SGDOptions mo;
  mo.momentum = 0.9;
  nn::SGD mom({{"w", w}, {"b", b}}, mo);
  CHECK(keys(mom.state_dict()) ==
        std::vector<std::string>{"step", "lr", "momentum.w", "momentum.b", "step.w", "step.b"});
  nn::Adam adam({{"blocks.0.w", w}}, nn::AdamOptions{});
  CHECK(keys(adam.state_dict()) == std::vector<std::string>{"step", "lr", "exp_avg.blocks.0.w",
                                                            "exp_avg_sq.blocks.0.w", "step.blocks.0.w"});
  StateDict sd = adam.state_dict();
  CHECK(nn::find_entry(sd, "step")->dtype() == kInt64);
  CHECK(nn::find_entry(sd, "step")->dim() == 0);
  CHECK(nn::find_entry(sd, "lr")->dtype() == kFloat64);
  CHECK(nn::find_entry(sd, "exp_avg.blocks.0.w")->dtype() == kFloat32);
  // float64 step counts holding integers are accepted too.
  for (auto& e : sd)
    if (e.first == "step") e.second = Tensor::scalar(5.0, kFloat64);
  adam.load_state_dict(sd);
  CHECK(adam.step_count() == 5);
}

TEST_CASE("load_state_dict is strict and lists every problem") {
  Tensor w = param(kFloat32, {1, 2}, {2});
  Tensor b = param(kFloat32, {1}, {1});
  nn::Adam opt({{"w", w}, {"b", b}}, nn::AdamOptions{});
  sum(square(w)).backward();
  opt.step();
  StateDict good = opt.state_dict();

  StateDict bad;
  for (const auto& e : good) {
    if (e.first == "exp_avg.b") continue;  // missing
    if (e.first == "exp_avg_sq.w") {
      bad.emplace_back(e.first, Tensor::zeros({3}));  // wrong shape
      continue;
    }
    bad.push_back(e);
  }
  bad.emplace_back("exp_avg.bias", Tensor::zeros({1}));  // unexpected
  CHECK_THROWS_MSG(opt.load_state_dict(bad), ValueError, "[Adam.load_state_dict]",
                   "missing entries: exp_avg.b", "unexpected entries: exp_avg.bias",
                   "'exp_avg_sq.w' is float32 (3)", "parameter 'w' is float32 (2)");
  // Nothing changed by the failed load.
  CHECK(opt.step_count() == 1);
  StateDict after = opt.state_dict();
  for (size_t i = 0; i < good.size(); ++i) check_close(after[i].second, good[i].second, 0);

  StateDict wrong_dtype = good;
  for (auto& e : wrong_dtype)
    if (e.first == "exp_avg.w") e.second = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_MSG(opt.load_state_dict(wrong_dtype), ValueError, "'exp_avg.w' is int64 (2)");
  // Another floating dtype converts to the slot's (a float64 run's state resumed in float32, and back).
  {
    StateDict wide = good;
    for (auto& e : wide)
      if (e.first.rfind("exp_avg", 0) == 0) e.second = to(e.second, kFloat64);
    nn::Adam other({{"w", w}, {"b", b}}, nn::AdamOptions{});
    other.load_state_dict(wide);
    StateDict back = other.state_dict();
    for (size_t i = 0; i < good.size(); ++i) {
      CHECK(back[i].second.dtype() == good[i].second.dtype());
      check_close(back[i].second, good[i].second, 0);
    }
  }
  StateDict bad_step = good;
  for (auto& e : bad_step)
    if (e.first == "step") e.second = Tensor::scalar(1.5, kFloat64);
  CHECK_THROWS_MSG(opt.load_state_dict(bad_step), ValueError, "'step' must be a non-negative integer");
  StateDict bad_lr = good;
  for (auto& e : bad_lr)
    if (e.first == "lr") e.second = Tensor::zeros({2}, kFloat64);
  CHECK_THROWS_MSG(opt.load_state_dict(bad_lr), ValueError, "'lr' must be a 0-d scalar");
  StateDict twice = good;
  twice.push_back(good[0]);
  CHECK_THROWS_MSG(opt.load_state_dict(twice), ValueError, "repeated entries: step");
  CHECK_THROWS_MSG(opt.load_state_dict({}), ValueError, "missing entries: step, lr, exp_avg.w");
}

TEST_CASE("optimizer bad input") {
  Tensor w = param(kFloat32, {1, 2}, {2});
  CHECK_THROWS_MSG(nn::SGD(StateDict{}, nn::SGDOptions{}), ValueError, "[SGD]", "empty parameter list");
  CHECK_THROWS_MSG(nn::Adam(StateDict{{"w", w}, {"w", param(kFloat32, {1}, {1})}}, nn::AdamOptions{}),
                   ValueError, "[Adam]", "'w' appears twice");
  CHECK_THROWS_MSG(nn::Adam(StateDict{{"a", w}, {"b", w}}, nn::AdamOptions{}), ValueError, "[Adam]",
                   "'b' is the same tensor");
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"i", ti64({1}, {1})}}, nn::SGDOptions{}), DTypeError, "[SGD]",
                   "'i'", "int64");
  Tensor nonleaf = mul(w, 2.0);
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"x", nonleaf}}, nn::SGDOptions{}), ValueError, "[SGD]",
                   "'x' is not a leaf");
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"u", Tensor()}}, nn::SGDOptions{}), ValueError, "'u'", "undefined");
  nn::SGDOptions s;
  s.nesterov = true;
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"w", w}}, s), ValueError, "[SGD]", "Nesterov");
  s.momentum = 0.9;
  s.dampening = 0.1;
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"w", w}}, s), ValueError, "[SGD]", "dampening 0.1");
  nn::SGDOptions neg;
  neg.lr = -0.1;
  CHECK_THROWS_MSG(nn::SGD(StateDict{{"w", w}}, neg), ValueError, "[SGD]", "-0.1");
  nn::AdamOptions a;
  a.beta1 = 1.0;
  CHECK_THROWS_MSG(nn::Adam(StateDict{{"w", w}}, a), ValueError, "[Adam]", "beta1");
  nn::AdamWOptions aw;
  aw.beta2 = -0.5;
  CHECK_THROWS_MSG(nn::AdamW(StateDict{{"w", w}}, aw), ValueError, "[AdamW]", "beta2");
  nn::AdamOptions wd;
  wd.weight_decay = -1;
  CHECK_THROWS_MSG(nn::Adam(StateDict{{"w", w}}, wd), ValueError, "[Adam]", "weight_decay");
  nn::ParamGroup g{{{"w", w}}, -1.0, std::nullopt};
  CHECK_THROWS_MSG(nn::SGD(std::vector<nn::ParamGroup>{g}, nn::SGDOptions{}), ValueError, "[SGD]",
                   "lr_scale");
}

TEST_CASE("a gradient that does not fit its parameter never reaches step()") {
  // set_grad refuses it; step() checks again (shape, dtype, device) before any update.
  Tensor a = param(kFloat32, {1, 2}, {2});
  nn::SGD opt({{"a", a}}, nn::SGDOptions{});
  CHECK_THROWS_MSG(a.set_grad(t64({1, 1}, {2})), DTypeError, "[set_grad]", "float64 (2)", "float32 (2)");
  CHECK_THROWS_MSG(a.set_grad(t32({1, 1, 1}, {3})), ShapeError, "[set_grad]", "(3)");
  opt.step();  // no gradient: nothing changes, the step is still counted
  check_close(a, {1, 2}, 0);
  CHECK(opt.step_count() == 1);
}

TEST_CASE("an expand() view is refused as a parameter or a gradient before anything is written") {
  Tensor a = param(kFloat32, {1, 2}, {2});
  const Tensor shared = expand(Tensor::ones({1}), {3});  // three elements, one memory slot
  CHECK_THROWS_MSG(nn::Adam(StateDict{{"a", a}, {"e", shared}}, nn::AdamOptions{}), ValueError, "[Adam]",
                   "parameter 'e'", "share memory", "expand()");
  CHECK_THROWS_MSG(a.set_grad(expand(Tensor::ones({1}), {2})), ValueError, "[set_grad]", "share memory");
  // A parameter made such a view after construction: the step refuses it before it writes any parameter,
  // moment or count (Adam moved 'a' and wrote b's moments, then failed at b's update, under [add_])
  for (const std::string kind : {"adam", "adamw", "sgd-momentum"}) {
    CAPTURE(kind);
    Tensor p = param(kFloat32, {1, 2}, {2}), b = param(kFloat32, {0.5, 0.5, 0.5}, {3});
    std::unique_ptr<nn::Optimizer> opt;
    if (kind == "adam") opt = std::make_unique<nn::Adam>(StateDict{{"a", p}, {"b", b}}, nn::AdamOptions{});
    if (kind == "adamw") opt = std::make_unique<nn::AdamW>(StateDict{{"a", p}, {"b", b}}, nn::AdamWOptions{});
    if (kind == "sgd-momentum") {
      nn::SGDOptions so;
      so.momentum = 0.9;
      opt = std::make_unique<nn::SGD>(StateDict{{"a", p}, {"b", b}}, so);
    }
    const StateDict before = opt->state_dict();
    p.set_grad(t32({1, 1}, {2}));
    b.set_grad(t32({1, 1, 1}, {3}));
    b.set_data(expand(Tensor::ones({1}), {3}));  // same shape: b keeps its gradient
    CHECK_THROWS_MSG(opt->step(), ValueError, "step]", "parameter 'b'", "share memory");
    check_close(p, {1, 2}, 0);
    CHECK(opt->step_count() == 0);
    const StateDict after = opt->state_dict();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      CAPTURE(after[i].first);
      CHECK(values(after[i].second) == values(before[i].second));
    }
  }
}

// ---------------- schedules ----------------

TEST_CASE("LR schedules at chosen steps") {
  nn::ConstantLR c(0.1);
  CHECK(c.lr_at(0) == 0.1);
  CHECK(c.lr_at(12345) == 0.1);

  nn::InverseSqrtLR inv(1e-3, 100);
  CHECK(inv.lr_at(0) == 0.0);
  CHECK(inv.lr_at(1) == doctest::Approx(1e-5).epsilon(1e-12));
  CHECK(inv.lr_at(50) == doctest::Approx(5e-4).epsilon(1e-12));
  CHECK(inv.lr_at(100) == doctest::Approx(1e-3).epsilon(1e-12));
  CHECK(inv.lr_at(400) == doctest::Approx(5e-4).epsilon(1e-12));
  CHECK(inv.lr_at(10000) == doctest::Approx(1e-4).epsilon(1e-12));
  CHECK(inv.multiplier(400) == doctest::Approx(0.5).epsilon(1e-12));
  // "Attention is all you need", eq. 3: d^-0.5 * min(s^-0.5, s * w^-1.5) with lr = d^-0.5 * w^-0.5.
  {
    double d = 512, w = 4000;
    nn::InverseSqrtLR vaswani(std::pow(d, -0.5) * std::pow(w, -0.5), 4000);
    for (int64_t s : {1, 100, 3999, 4000, 4001, 20000}) {
      double want = std::pow(d, -0.5) * std::min(std::pow(double(s), -0.5), double(s) * std::pow(w, -1.5));
      CHECK(vaswani.lr_at(s) == doctest::Approx(want).epsilon(1e-12));
    }
  }

  nn::WarmupCosineLR cos(1.0, 10, 110, 0.1);
  CHECK(cos.lr_at(0) == 0.0);
  CHECK(cos.lr_at(5) == doctest::Approx(0.5));
  CHECK(cos.lr_at(10) == doctest::Approx(1.0));
  CHECK(cos.lr_at(60) == doctest::Approx(0.1 + 0.9 * 0.5));  // half way: cos(pi/2) = 0
  CHECK(cos.lr_at(35) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(3.14159265358979 / 4))));
  CHECK(cos.lr_at(110) == doctest::Approx(0.1));
  CHECK(cos.lr_at(1000) == doctest::Approx(0.1));
  nn::WarmupCosineLR nowarm(2.0, 0, 4);
  CHECK(nowarm.lr_at(0) == 2.0);
  CHECK(nowarm.lr_at(2) == doctest::Approx(1.0));
  CHECK(nowarm.lr_at(4) == 0.0);

  nn::StepLR st(0.1, 3, 0.5);
  std::vector<double> want = {0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (int64_t s = 0; s < 8; ++s) CHECK(st.lr_at(s) == doctest::Approx(want[size_t(s)]).epsilon(1e-15));

  CHECK_THROWS_MSG(inv.lr_at(-1), ValueError, "[InverseSqrtLR]", "-1");
  CHECK_THROWS_MSG(nn::InverseSqrtLR(1e-3, 0), ValueError, "[InverseSqrtLR]", "warmup");
  CHECK_THROWS_MSG(nn::WarmupCosineLR(1.0, 10, 10), ValueError, "[WarmupCosineLR]", "total");
  CHECK_THROWS_MSG(nn::WarmupCosineLR(1.0, 1, 10, 2.0), ValueError, "[WarmupCosineLR]", "min_lr");
  CHECK_THROWS_MSG(nn::StepLR(0.1, 0), ValueError, "[StepLR]", "step_size");
  CHECK_THROWS_MSG(nn::StepLR(0.1, 2, 0.0), ValueError, "[StepLR]", "gamma");
  CHECK_THROWS_MSG(nn::ConstantLR(-1), ValueError, "[ConstantLR] learning rate must be finite and >= 0, got -1");
}

TEST_CASE("a schedule drives an optimizer through apply()") {
  Tensor w = param(kFloat64, {1.0}, {1});
  nn::SGD opt({{"w", w}}, nn::SGDOptions{});
  nn::StepLR sched(0.1, 2, 0.5);
  std::vector<double> lrs;
  for (int s = 0; s < 5; ++s) {
    lrs.push_back(sched.apply(opt));
    CHECK(opt.lr() == lrs.back());
    opt.zero_grad();
    sum(w).backward();  // g = 1
    opt.step();
  }
  CHECK(lrs == std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025});
  check_close(w, {1.0 - 0.325}, 1e-15);
}

// ---------------- clipping and accumulation ----------------

TEST_CASE("clip_grad_norm returns the global norm and scales the gradients") {
  Tensor a = param(kFloat32, {0, 0}, {2});
  Tensor b = param(kFloat64, {0}, {1});
  Tensor none = param(kFloat32, {0}, {1});  // no gradient: skipped
  a.set_grad(t32({3, 0}, {2}));
  b.set_grad(t64({4}, {1}));
  StateDict ps = {{"a", a}, {"b", b}, {"none", none}};
  CHECK(nn::grad_norm(ps) == doctest::Approx(5.0).epsilon(1e-15));
  Tensor held = a.grad();
  double n = nn::clip_grad_norm(ps, 1.0);
  CHECK(n == doctest::Approx(5.0).epsilon(1e-15));
  double c = 1.0 / (5.0 + 1e-6);
  check_close(a.grad(), {3 * c, 0}, 1e-7);
  check_close(b.grad(), {4 * c}, 1e-15);
  check_close(held, {3, 0}, 0);  // the gradient handed out before was not changed
  CHECK(nn::grad_norm(ps) == doctest::Approx(1.0).epsilon(1e-6));
  // Below the threshold: unchanged.
  double n2 = nn::clip_grad_norm(std::vector<Tensor>{a, b}, 10.0);
  CHECK(n2 == doctest::Approx(1.0).epsilon(1e-6));
  check_close(b.grad(), {4 * c}, 1e-15);
  CHECK(nn::grad_norm(std::vector<Tensor>{none}) == 0.0);
  CHECK(std::isinf(nn::clip_grad_norm(std::vector<Tensor>{a}, std::numeric_limits<double>::infinity())) == false);
}

TEST_CASE("clip_grad_norm with a non-finite gradient leaves the gradients alone") {
  Tensor a = param(kFloat64, {0, 0}, {2});
  a.set_grad(t64({1, std::nan("")}, {2}));
  double n = nn::clip_grad_norm(std::vector<Tensor>{a}, 1.0);
  CHECK(std::isnan(n));
  check_close(a.grad(), {1, std::nan("")}, 0);
  a.set_grad(t64({1, INFINITY}, {2}));
  CHECK(std::isinf(nn::clip_grad_norm(std::vector<Tensor>{a}, 1.0)));
  CHECK_THROWS_MSG(nn::clip_grad_norm(std::vector<Tensor>{a}, 1.0, true), ValueError, "[clip_grad_norm]",
                   "inf");
  CHECK_THROWS_MSG(nn::clip_grad_norm(std::vector<Tensor>{a}, 0.0), ValueError, "[clip_grad_norm]",
                   "max_norm");
  CHECK_THROWS_MSG(nn::scale_grads(std::vector<Tensor>{a}, std::nan("")), ValueError, "[scale_grads] factor must be finite, got nan");
}

TEST_CASE("clip_grad_norm of float64 gradients whose squares overflow is finite and clips") {
  // |g| near 1e200: the sum of squares is inf in double; the norm was inf and the gradients were left unclipped
  Tensor a = param(kFloat64, {0, 0}, {2}), b = param(kFloat64, {0}, {1});
  a.set_grad(t64({3e200, -4e200}, {2}));
  b.set_grad(t64({0}, {1}));
  CHECK(nn::grad_norm(std::vector<Tensor>{a, b}) == doctest::Approx(5e200).epsilon(1e-14));
  const double n = nn::clip_grad_norm(std::vector<Tensor>{a, b}, 2.0);
  CHECK(n == doctest::Approx(5e200).epsilon(1e-14));
  check_close(a.grad(), {1.2, -1.6}, 1e-12);
  a.set_grad(t64({3e200, INFINITY}, {2}));  // a true inf stays inf
  CHECK(std::isinf(nn::grad_norm(std::vector<Tensor>{a, b})));
}

TEST_CASE("grad_norm and clip_grad_norm take PyTorch's norm_type: 1, 3, inf, and refuse p <= 0 by name") {
  Tensor a = param(kFloat64, {0, 0}, {2}), b = param(kFloat32, {0}, {1});
  a.set_grad(t64({3, -4}, {2}));
  b.set_grad(t32({-12}, {1}));
  const std::vector<Tensor> ps{a, b};
  CHECK(nn::grad_norm(ps, 1.0) == doctest::Approx(19.0).epsilon(1e-15));
  CHECK(nn::grad_norm(ps, 3.0) == doctest::Approx(std::cbrt(27.0 + 64.0 + 1728.0)).epsilon(1e-15));
  CHECK(nn::grad_norm(ps, INFINITY) == 12.0);
  CHECK(nn::grad_norm(ps, 2.0) == doctest::Approx(13.0).epsilon(1e-15));
  // clipped by the norm of its type: max |g| = 12 scaled to 6
  const double n = nn::clip_grad_norm(ps, 6.0, false, INFINITY);
  CHECK(n == 12.0);
  const double c = 6.0 / (12.0 + 1e-6);
  check_close(a.grad(), {3 * c, -4 * c}, 1e-15);
  check_close(b.grad(), {-12 * c}, 1e-6);
  // |g|^p beyond double: taken over the gradients divided by the largest, finite; inf and NaN stay so
  a.set_grad(t64({3e200, -4e200}, {2}));
  b.set_grad(t32({0}, {1}));
  CHECK(nn::grad_norm(ps, 3.0) == doctest::Approx(std::cbrt(91.0) * 1e200).epsilon(1e-13));
  a.set_grad(t64({1e-4, 2e-4}, {2}));  // (1e-4)^100 underflows to 0: the norm must not
  CHECK(nn::grad_norm(ps, 100.0) == doctest::Approx(2e-4 * std::pow(1.0 + std::pow(0.5, 100), 0.01)).epsilon(1e-13));
  a.set_grad(t64({1e-4, 0}, {2}));  // (1e-4)^80.8 is a subnormal with few digits: retaken too
  CHECK(nn::grad_norm(ps, 80.8) == doctest::Approx(1e-4).epsilon(1e-13));
  a.set_grad(t64({0, 0}, {2}));
  CHECK(nn::grad_norm(ps, 3.0) == 0.0);  // zero gradients: 0
  a.set_grad(t64({1, INFINITY}, {2}));
  CHECK(std::isinf(nn::grad_norm(ps, 1.0)));
  CHECK(std::isinf(nn::grad_norm(ps, INFINITY)));
  a.set_grad(t64({1, std::nan("")}, {2}));
  CHECK(std::isnan(nn::grad_norm(ps, 3.0)));
  CHECK(std::isnan(nn::grad_norm(ps, INFINITY)));
  CHECK(nn::grad_norm(std::vector<Tensor>{param(kFloat32, {0}, {1})}, INFINITY) == 0.0);  // no gradient
  for (double p : {0.0, -1.0, std::nan("")}) {
    CHECK_THROWS_MSG(nn::grad_norm(ps, p), ValueError, "[grad_norm] norm_type must be > 0");
    CHECK_THROWS_MSG(nn::clip_grad_norm(ps, 1.0, false, p), ValueError, "[clip_grad_norm] norm_type must be > 0");
  }
}

TEST_CASE("grad_norm_tensor and clip_grad_norm_tensor: clip_grad_norm's numbers as device tensors, no host read") {
  // Gradients whose powers and sums are exact in double (multiples of 1/4): any summation order gives the
  // same norm, so the tensor forms must give clip_grad_norm's bits, float32, float64 and 16-bit gradients.
  auto setup = [](std::vector<Tensor>& ps) {
    ps = {param(kFloat32, std::vector<double>(6, 0.0), {2, 3}), param(kFloat64, {0, 0, 0}, {3}),
          param(kFloat32, {0, 0}, {2}), to(param(kFloat32, {0, 0, 0, 0}, {4}), kBFloat16).set_requires_grad(true)};
    ps[0].set_grad(t32({0.25f, -1.5f, 3.0f, 0.5f, 2.0f, -0.75f}, {2, 3}));
    ps[1].set_grad(t64({4.0, -2.25, 1.0}, {3}));
    // ps[2]: no gradient (skipped)
    ps[3].set_grad(to(t32({1.0f, -0.5f, 2.5f, 0.125f}, {4}), kBFloat16));
  };
  for (double norm_type : {2.0, 1.0, 3.0, double(INFINITY)}) {
    for (double max_norm : {1.0, 1e6}) {  // clipped, and below the threshold (unchanged)
      INFO("norm_type ", norm_type, ", max_norm ", max_norm);
      std::vector<Tensor> a, b;
      setup(a);
      setup(b);
      CHECK(nn::grad_norm_tensor(a, norm_type).item() == nn::grad_norm(a, norm_type));
      const Tensor n = nn::clip_grad_norm_tensor(a, max_norm, norm_type);
      CHECK(n.dim() == 0);
      CHECK(n.dtype() == kFloat64);
      CHECK(n.item() == nn::clip_grad_norm(b, max_norm, false, norm_type));
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("parameter ", i);
        CHECK(a[i].grad().defined() == b[i].grad().defined());
        if (!a[i].grad().defined()) continue;
        CHECK(a[i].grad().dtype() == b[i].grad().dtype());
        CHECK(values(a[i].grad()) == values(b[i].grad()));
      }
      if (max_norm == 1.0) CHECK(values(a[0].grad()) != std::vector<double>{0.25, -1.5, 3.0, 0.5, 2.0, -0.75});
    }
  }
  // Random float32 gradients (sums in another order than sum_squares's): the same within rounding.
  Generator gen(12);
  std::vector<Tensor> r, q;
  for (int i = 0; i < 3; ++i) {
    Tensor g = rand({257 + i * 100}, kFloat32, gen, -1, 1);
    r.push_back(param(kFloat32, std::vector<double>(size_t(g.numel()), 0.0), g.shape()));
    q.push_back(param(kFloat32, std::vector<double>(size_t(g.numel()), 0.0), g.shape()));
    r.back().set_grad(clone(g));
    q.back().set_grad(clone(g));
  }
  const double nt = nn::clip_grad_norm_tensor(r, 0.5).item(), nd = nn::clip_grad_norm(q, 0.5);
  CHECK(nt == doctest::Approx(nd).epsilon(1e-14));
  for (size_t i = 0; i < r.size(); ++i) check_close(r[i].grad(), q[i].grad(), 1e-6);
  // Non-finite norms leave the gradients alone (the caller reads the norm to stop).
  Tensor w = param(kFloat64, {0, 0}, {2});
  for (double bad : {std::nan(""), double(INFINITY)}) {
    w.set_grad(t64({1, bad}, {2}));
    const Tensor nb = nn::clip_grad_norm_tensor(std::vector<Tensor>{w}, 1.0);
    CHECK(std::isnan(bad) ? std::isnan(nb.item()) : std::isinf(nb.item()));
    CHECK(values(w.grad())[0] == 1.0);
  }
  // No gradient at all: 0 on the parameters' device.
  const Tensor zero = nn::grad_norm_tensor(std::vector<Tensor>{param(kFloat32, {0}, {1})});
  CHECK(zero.item() == 0.0);
  CHECK(zero.device() == Device::cpu());
  // Bad input, named.
  CHECK_THROWS_MSG(nn::grad_norm_tensor(std::vector<Tensor>{w}, 0.0), ValueError,
                   "[grad_norm_tensor] norm_type must be > 0");
  CHECK_THROWS_MSG(nn::clip_grad_norm_tensor(std::vector<Tensor>{w}, -1.0), ValueError,
                   "[clip_grad_norm_tensor] max_norm must be > 0, got -1");
  CHECK_THROWS_MSG(nn::clip_grad_norm_tensor(std::vector<Tensor>{w}, 1.0, -2.0), ValueError,
                   "[clip_grad_norm_tensor] norm_type must be > 0");
  CHECK_THROWS_MSG(nn::grad_norm_tensor(std::vector<Tensor>{w, Tensor()}), ValueError,
                   "[grad_norm_tensor] a parameter is an undefined tensor");
}

TEST_CASE("clip_grad_norm on a broadcast gradient from the engine") {
  Tensor w = param(kFloat64, {1, 2, 3, 4}, {4});
  sum(w).backward();  // the engine may hand back an expanded (stride 0) gradient
  double n = nn::clip_grad_norm(std::vector<Tensor>{w}, 1.0);
  CHECK(n == doctest::Approx(2.0).epsilon(1e-15));
  check_close(w.grad(), std::vector<double>(4, 0.5 / (1 + 5e-7)), 1e-12);
}

TEST_CASE("accumulating two half-batches equals one full batch") {
  Generator gen(21);
  Tensor X = rand({8, 3}, kFloat64, gen, -1, 1);
  Tensor y = rand({8, 1}, kFloat64, gen, -1, 1);
  Tensor w0 = rand({3, 1}, kFloat64, gen, -1, 1);
  auto loss_of = [](const Tensor& w, const Tensor& x, const Tensor& t) {
    return mean(square(sub(matmul(x, w), t)));
  };
  Tensor wf = clone(w0).detach().set_requires_grad(true);
  loss_of(wf, X, y).backward();
  // Two micro-batches, each mean loss, summed by the engine, then scaled by 1/2.
  Tensor wa = clone(w0).detach().set_requires_grad(true);
  loss_of(wa, slice(X, 0, 0, 4), slice(y, 0, 0, 4)).backward();
  loss_of(wa, slice(X, 0, 4, 8), slice(y, 0, 4, 8)).backward();
  nn::scale_grads(StateDict{{"w", wa}}, 0.5);
  check_close(wa.grad(), wf.grad(), 1e-14);
  // The other pattern: scale each micro-batch loss by 1/2 before backward.
  Tensor wb = clone(w0).detach().set_requires_grad(true);
  mul(loss_of(wb, slice(X, 0, 0, 4), slice(y, 0, 0, 4)), 0.5).backward();
  mul(loss_of(wb, slice(X, 0, 4, 8), slice(y, 0, 4, 8)), 0.5).backward();
  check_close(wb.grad(), wf.grad(), 1e-14);
  // And the optimizer steps agree.
  nn::SGD of({{"w", wf}}, nn::SGDOptions{});
  nn::SGD oa({{"w", wa}}, nn::SGDOptions{});
  of.step();
  oa.step();
  check_close(wa, wf, 1e-14);
}

}  // TEST_SUITE
