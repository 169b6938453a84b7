// Mixed precision: the autocast policy per op, float32 master weights for low-precision
// parameters, the dynamic loss scaler, checkpoints of both, and an autocast training run that
// tracks the float32 run.
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>

#include "tests/test_files.h"
#include "autograd/ops/attention.h"
#include "kernels/matmul/bf16_amx.h"
#include "kernels/matmul/bf16_dot.h"
#include "nn/attention/chunked.h"
#include "tests/test_util.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {
Tensor rnd(const Shape& s, uint64_t seed, DType dt = kFloat32) {
  Generator g(seed);
  return to(randn(s, kFloat32, g), dt);
}
// The bfloat16 GEMM kernels off in a scope (on a CPU with AMX, or AMD's vdpbf16ps, bfloat16 flash attention
// takes them under autocast instead of the float32 copies): for the tests of the float32 route, bit for bit.
struct Bf16ArmOff {
  Bf16ArmOff() {
    kernels::set_bf16_amx_enabled(false);
    kernels::set_bf16_dot_enabled(false);
  }
  ~Bf16ArmOff() {
    kernels::set_bf16_amx_enabled(true);
    kernels::reset_bf16_dot_enabled();
  }
  Bf16ArmOff(const Bf16ArmOff&) = delete;
  Bf16ArmOff& operator=(const Bf16ArmOff&) = delete;
};
// Whether bfloat16 attention under autocast takes the bfloat16 arm here (AMX tiles or vdpbf16ps).
bool bf16_arm_here() { return kernels::bf16_amx_available() || kernels::bf16_dot_available(); }
}  // namespace

TEST_CASE("autocast: matmul and Linear run in the low dtype, statistics and losses in float32") {
  Tensor a = rnd({4, 8}, 1), b = rnd({8, 3}, 2);
  CHECK(!autocast_dtype());
  {
    AutocastGuard guard(kBFloat16);
    REQUIRE(autocast_dtype() == kBFloat16);
    Tensor y = matmul(a, b);
    CHECK(y.dtype() == kBFloat16);
    // the product is the bfloat16 product of the rounded operands
    check_close(y, to(matmul(to(a, kBFloat16), to(b, kBFloat16)), kFloat32), 0);
    CHECK(softmax(y, -1).dtype() == kFloat32);
    CHECK(log_softmax(y, -1).dtype() == kFloat32);
    CHECK(sum(y).dtype() == kFloat32);
    CHECK(mean(y, {0}).dtype() == kFloat32);
    CHECK(var(y, {1}).dtype() == kFloat32);
    CHECK(logsumexp(y, {1}).dtype() == kFloat32);
    CHECK(layer_norm(y, {3}).dtype() == kFloat32);
    CHECK(cross_entropy(y, ti64({0, 1, 2, 0}, {4})).dtype() == kFloat32);
    // Regression and binary losses too, with float32 targets beside a 16-bit prediction (they were
    // refused: "must have the same dtype"); their values are the float32 losses of the rounded input.
    Tensor target = rnd({4, 3}, 3), yf = to(y, kFloat32);
    CHECK(nn::mse_loss(y, target).dtype() == kFloat32);
    check_close(nn::mse_loss(y, target), nn::mse_loss(yf, target), 0);
    nn::BCEWithLogitsOptions bo;
    bo.weight = to(rnd({3}, 4), kBFloat16);
    Tensor bce = nn::binary_cross_entropy_with_logits(y, sigmoid(target), bo);
    CHECK(bce.dtype() == kFloat32);
    bo.weight = to(bo.weight, kFloat32);
    check_close(bce, nn::binary_cross_entropy_with_logits(yf, sigmoid(target), bo), 0);
    CHECK(nn::chamfer_distance(reshape(y, {1, 4, 3}), reshape(target, {1, 4, 3})).dtype() == kFloat32);
    CHECK(relu(y).dtype() == kBFloat16);  // unlisted ops keep their input's dtype
    CHECK(matmul(t64({1, 2}, {1, 2}), t64({3, 4}, {2, 1})).dtype() == kFloat64);  // float64 not eligible
    nn::Linear lin(8, 5);
    Tensor o = lin.forward(a);
    CHECK(o.dtype() == kBFloat16);
    nn::Linear lin2(5, 2);  // a bfloat16 input meets float32 weights: allowed under autocast
    CHECK(lin2.forward(o).dtype() == kBFloat16);
    {
      AutocastGuard inner(kFloat16);
      CHECK(matmul(a, b).dtype() == kFloat16);
      AutocastGuard off(std::nullopt);
      CHECK(matmul(a, b).dtype() == kFloat32);
    }
    CHECK(autocast_dtype() == kBFloat16);
  }
  CHECK(!autocast_dtype());
  CHECK(matmul(a, b).dtype() == kFloat32);
  CHECK_THROWS_MSG(AutocastGuard{kFloat32}, DTypeError, "[AutocastGuard]", "float32");
}

TEST_CASE("autocast casts a permuted dense tensor in its own layout, others contiguous, with gradients either way") {
  // nn::Linear multiplies by its weight transposed: the cast keeps that layout (the copy runs in memory order)
  Tensor w = rnd({5, 8}, 7).set_requires_grad(true);
  Tensor x = rnd({2, 3, 4}, 8).set_requires_grad(true);
  const Tensor expanded = expand(rnd({1, 4}, 9), {3, 4});
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    AutocastGuard guard(dt);
    Tensor wt = transpose(w, 0, 1), xp = permute(x, {2, 0, 1});
    Tensor lw = autocast::to_low(wt), lx = autocast::to_low(xp), le = autocast::to_low(expanded);
    CHECK(lw.strides() == wt.strides());
    CHECK(lx.strides() == xp.strides());
    CHECK(le.is_contiguous());  // a broadcast view has no dense order: to()'s contiguous copy
    CHECK(values(lw) == values(to(contiguous(wt), dt)));
    CHECK(values(lx) == values(to(contiguous(xp), dt)));
    CHECK(values(le) == values(to(contiguous(expanded), dt)));
    // back to float32 (the float32 ops' inputs) keeps the layout too, and the values are exact
    Tensor back = autocast::to_float32(lw);
    CHECK(back.dtype() == kFloat32);
    CHECK(back.strides() == wt.strides());
    CHECK(values(back) == values(to(lw, kFloat32)));
    // gradients reach the float32 tensors through the permutations: d sum(c * cast(t)) / dt = c in float32
    w.zero_grad();
    x.zero_grad();
    Tensor cw = to(reshape(Tensor::arange(40, kFloat32), {8, 5}), dt);
    Tensor cx = to(reshape(Tensor::arange(24, kFloat32), {4, 2, 3}), dt);  // integers: exact in both dtypes
    sum(mul(lw, cw)).backward();
    sum(mul(lx, cx)).backward();
    CHECK(w.grad().dtype() == kFloat32);
    CHECK(values(w.grad()) == values(transpose(to(cw, kFloat32), 0, 1)));
    CHECK(values(x.grad()) == values(permute(to(cx, kFloat32), {1, 2, 0})));
  }
}

TEST_CASE("autocast: float32 weights get float32 gradients, and backward ignores the policy") {
  nn::Linear lin(6, 4);
  Tensor x = rnd({5, 6}, 4);
  Tensor loss;
  {
    AutocastGuard guard(kBFloat16);
    loss = cross_entropy(lin.forward(x), ti64({0, 1, 2, 3, 0}, {5}));
    CHECK(loss.dtype() == kFloat32);
    loss.backward();  // inside the scope: the engine turns autocast off for backward
  }
  CHECK(lin.weight.grad().dtype() == kFloat32);
  CHECK(lin.bias.grad().dtype() == kFloat32);
  // against the float32 gradient on the same values: within bfloat16's chained-rounding bound (R3)
  Tensor g16 = lin.weight.grad();
  lin.zero_grad();
  cross_entropy(lin.forward(x), ti64({0, 1, 2, 3, 0}, {5})).backward();
  std::vector<double> a = values(g16), r = values(lin.weight.grad());
  double m = 0, e = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(r[i])), e = std::max(e, std::fabs(a[i] - r[i]));
  CHECK(e <= 8.0 / 256 * m);
}

TEST_CASE("optimizers keep float32 master weights and state for low-precision parameters") {
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor p = Tensor::full({4}, 1.0, dt).set_requires_grad(true);
    nn::SGD sgd({{"p", p}}, nn::SGDOptions{1e-4});
    CHECK(sgd.master("p").dtype() == kFloat32);
    for (int s = 0; s < 10; ++s) {
      p.set_grad(Tensor::full({4}, 1.0, dt));
      sgd.step();
    }
    // 1 - 1e-4 rounds back to 1 in either type every single step; the master accumulates.
    CHECK(std::fabs(values(sgd.master("p"))[0] - (1.0 - 1e-3)) < 1e-6);
    CHECK(p.dtype() == dt);
    CHECK(values(p)[0] == double(float(dt == kBFloat16 ? float(BFloat16(float(1.0 - 1e-3)))
                                                       : float(Half(float(1.0 - 1e-3))))));
    Tensor q = Tensor::full({3}, 0.5, dt).set_requires_grad(true);
    nn::Adam adam({{"q", q}}, nn::AdamOptions{});
    q.set_grad(Tensor::full({3}, 0.25, dt));
    adam.step();
    nn::StateDict sd = adam.state_dict();
    REQUIRE(nn::find_entry(sd, "exp_avg.q"));
    CHECK(nn::find_entry(sd, "exp_avg.q")->dtype() == kFloat32);
    REQUIRE(nn::find_entry(sd, "master.q"));
    // A state without masters (saved from float32 parameters: a run resumed in 16 bits) loads, the master
    // taken from the parameter; a 16-bit master is refused, naming it.
    nn::StateDict no_master;
    for (auto& kv : sd)
      if (kv.first != "master.q") no_master.push_back(kv);
    {
      NoGradGuard ng;
      Tensor qw = q;
      fill_(qw, 0.375);  // exact in both 16-bit dtypes
    }
    adam.load_state_dict(no_master);
    CHECK(values(adam.master("q")) == std::vector<double>{0.375, 0.375, 0.375});
    nn::StateDict narrow_master = no_master;
    narrow_master.emplace_back("master.q", Tensor::full({3}, 0.5, dt));
    CHECK_THROWS_MSG(adam.load_state_dict(narrow_master), ValueError, "'master.q' is ", dtype_name(dt),
                     "but the master of 'q' is float32");
    // The other way: a 16-bit run's state (masters included) into float32 parameters is refused with the
    // reason; its slots alone load.
    Tensor wide = Tensor::full({3}, 0.5, kFloat32).set_requires_grad(true);
    nn::Adam adam32({{"q", wide}}, nn::AdamOptions{});
    CHECK_THROWS_MSG(adam32.load_state_dict(sd), ValueError,
                     "'master.q' is the float32 master of a 16-bit parameter, but parameter 'q' is float32 (3)",
                     "keeps none");
    adam32.load_state_dict(no_master);
    const nn::StateDict sd32 = adam32.state_dict();
    CHECK(values(*nn::find_entry(sd32, "exp_avg.q")) == values(*nn::find_entry(sd, "exp_avg.q")));
  }
}

TEST_CASE("a low-precision parameter written after the optimizer was built keeps the new values") {
  // The float32 master was copied once, at construction: a step after load_state_dict, an init or
  // a fill_ wrote the stale master back over the parameter.
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dt);
    nn::Linear lin(4, 2);
    lin.to(dt);
    nn::SGD sgd(lin.named_parameters(), nn::SGDOptions{0.1});
    nn::StateDict loaded;
    for (auto& [name, t] : lin.state_dict()) loaded.emplace_back(name, Tensor::full(t.shape(), 0.5, dt));
    lin.load_state_dict(loaded);
    sum(to(lin.forward(Tensor::zeros({3, 4}, dt)), kFloat32)).backward();  // weight's gradient is 0
    sgd.step();
    for (double v : values(lin.weight)) CHECK(v == 0.5);
    CHECK(values(sgd.master("weight"))[0] == 0.5);
    // Elements still equal to the master's rounding keep its extra bits (a model reloaded from the
    // checkpoint its optimizer state came from): 1 - 1e-4 rounds to 1 in both types.
    Tensor p = Tensor::full({2}, 1.0, dt).set_requires_grad(true);
    nn::SGD small({{"p", p}}, nn::SGDOptions{1e-4});
    p.set_grad(Tensor::full({2}, 1.0, dt));
    small.step();
    {
      NoGradGuard ng;
      Tensor first = narrow(p, 0, 0, 1);
      copy_(first, Tensor::full({1}, 4.0, dt));  // element 0 written; element 1 untouched
    }
    p.set_grad(Tensor::zeros({2}, dt));
    small.step();
    std::vector<double> m = values(small.master("p"));
    CHECK(m[0] == 4.0);
    CHECK(std::fabs(m[1] - (1.0 - 1e-4)) < 1e-7);
  }
}

TEST_CASE("GradScaler unscales float16 gradients in float32") {
  // 1 / scale taken in float16 is 0 above 2^24 (every gradient zeroed, no inf found) and 19% off at 1e7.
  for (double scale : {std::ldexp(1.0, 25), 1e7, 1e6}) {
    CAPTURE(scale);
    Tensor p = Tensor::full({2}, 1.0, kFloat16).set_requires_grad(true);
    nn::SGD sgd({{"p", p}}, nn::SGDOptions{0.5});
    nn::GradScalerOptions o;
    o.init_scale = scale;
    nn::GradScaler scaler(o);
    Tensor w = Tensor::from_vector(std::vector<float>{1e-4f, 2e-4f}, {2});
    scaler.scale(sum(mul(to(p, kFloat32), w))).backward();
    scaler.unscale_(sgd);
    std::vector<double> g = values(p.grad());
    // float16 keeps 11 bits: the unscaled gradient is within its rounding of the true one
    CHECK(std::fabs(g[0] - 1e-4) < 1e-4 * 2e-3);
    CHECK(std::fabs(g[1] - 2e-4) < 2e-4 * 2e-3);
    CHECK(scaler.step(sgd));
    scaler.update();
  }
}

TEST_CASE("GradScaler refuses options outside their range, naming the option and the value") {
  auto with = [](auto set) {
    nn::GradScalerOptions o;
    set(o);
    return o;
  };
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.init_scale = 0; })), ValueError,
                   "[GradScaler] init_scale must be finite and > 0, got 0");
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.init_scale = std::nan(""); })), ValueError,
                   "[GradScaler] init_scale must be finite and > 0, got nan");
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.growth_factor = 1; })), ValueError,
                   "[GradScaler] growth_factor must be > 1, got 1");
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.backoff_factor = 1; })), ValueError,
                   "[GradScaler] backoff_factor must be in (0, 1), got 1");
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.backoff_factor = 0; })), ValueError,
                   "[GradScaler] backoff_factor must be in (0, 1), got 0");
  CHECK_THROWS_MSG(nn::GradScaler(with([](nn::GradScalerOptions& o) { o.growth_interval = 0; })), ValueError,
                   "[GradScaler] growth_interval must be > 0, got 0");
}

TEST_CASE("GradScaler: an optimizer step that failed may be tried again") {
  Tensor p = Tensor::full({3}, 1.0, kFloat32).set_requires_grad(true);
  nn::SGD sgd({{"p", p}}, nn::SGDOptions{0.5});
  nn::GradScalerOptions o;
  o.init_scale = 4;
  nn::GradScaler scaler(o);
  scaler.scale(sum(p)).backward();
  p.set_data(expand(Tensor::full({1}, 1.0), {3}));  // refused by the step
  CHECK_THROWS_MSG(scaler.step(sgd), ValueError, "[SGD.step]", "parameter 'p'");
  p.set_data(Tensor::full({3}, 1.0));
  CHECK(scaler.step(sgd));  // was refused as "already called" (the failed step counted as taken)
  check_close(p, {0.5, 0.5, 0.5}, 0);  // the gradient was unscaled once: 1 - 0.5 * 1
  scaler.update();
}

TEST_CASE("GradScaler: unscales, skips a step with inf/NaN gradients, backs off and grows back") {
  Tensor p = Tensor::full({2}, 1.0, kFloat16).set_requires_grad(true);
  nn::SGD sgd({{"p", p}}, nn::SGDOptions{0.5});
  nn::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  nn::GradScaler scaler(o);
  Tensor loss = sum(mul(p, 2.0));
  Tensor scaled = scaler.scale(loss);
  CHECK(values(scaled)[0] == 4.0 * 1024);
  scaled.backward();
  CHECK(values(p.grad())[0] == 2.0 * 1024);
  CHECK(scaler.step(sgd));
  CHECK(values(p.grad())[0] == 2.0);  // unscaled in place
  CHECK(values(sgd.master("p"))[0] == 0.0);  // 1 - 0.5 * 2
  scaler.update();
  CHECK(scaler.get_scale() == 1024);
  CHECK(scaler.growth_tracker() == 1);

  // overflow: an inf gradient skips the step and halves the scale
  const double before = values(sgd.master("p"))[1];
  p.set_grad(to(t32({1.0f, std::numeric_limits<float>::infinity()}, {2}), kFloat16));
  CHECK_FALSE(scaler.step(sgd));
  CHECK(scaler.found_inf());
  CHECK(values(sgd.master("p"))[1] == before);
  CHECK(sgd.step_count() == 1);
  scaler.update();
  CHECK(scaler.get_scale() == 512);
  CHECK(scaler.growth_tracker() == 0);
  p.set_grad(to(t32({std::nanf(""), 0.0f}, {2}), kFloat16));
  CHECK_FALSE(scaler.step(sgd));
  scaler.update();
  CHECK(scaler.get_scale() == 256);

  // three clean steps in a row grow it back
  for (int s = 0; s < 3; ++s) {
    p.set_grad(Tensor::full({2}, 0.0, kFloat16));
    CHECK(scaler.step(sgd));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 512);
  CHECK(scaler.growth_tracker() == 0);

  // unscale_ twice in one step is an error; so is update() without a step
  p.set_grad(Tensor::full({2}, 0.0, kFloat16));
  scaler.unscale_(sgd);
  CHECK_THROWS_MSG(scaler.unscale_(sgd), ValueError, "[GradScaler.unscale_]", "already");
  scaler.update();
  CHECK_THROWS_MSG(scaler.update(), ValueError, "[GradScaler.update] called without a step()");

  // state dict: round trip and strict checks
  nn::GradScaler other;
  other.load_state_dict(scaler.state_dict());
  CHECK(other.get_scale() == scaler.get_scale());
  CHECK(other.growth_tracker() == scaler.growth_tracker());
  CHECK_THROWS_MSG(other.load_state_dict({{"scale", Tensor::scalar(-1.0, kFloat64)}}), ValueError,
                   "[GradScaler.load_state_dict]", "'scale' must be finite and > 0", "growth_tracker");
  // The growth schedule travels too (as PyTorch's): a resumed scaler grows and backs off as the saved one.
  {
    nn::GradScalerOptions tuned;
    tuned.init_scale = 8.0;
    tuned.growth_factor = 3.0;
    tuned.backoff_factor = 0.25;
    tuned.growth_interval = 2;
    nn::GradScaler saved(tuned), resumed;
    const nn::StateDict sd = saved.state_dict();
    CHECK(sd.size() == 5);
    resumed.load_state_dict(sd);
    Tensor w = Tensor::full({1}, 1.0).set_requires_grad(true);
    nn::SGD step_opt({{"w", w}}, nn::SGDOptions{0.0});
    for (int i = 0; i < 2; ++i) {  // two clean steps: 8 * 3
      w.set_grad(Tensor::full({1}, 1.0));
      resumed.step(step_opt);
      resumed.update();
    }
    CHECK(resumed.get_scale() == 24.0);
    w.set_grad(Tensor::full({1}, std::numeric_limits<double>::infinity()));
    resumed.step(step_opt);
    resumed.update();
    CHECK(resumed.get_scale() == 6.0);  // backed off by 0.25
    // A state dict written before the schedule was saved keeps this scaler's schedule.
    nn::GradScaler old_format(tuned);
    old_format.load_state_dict({{"scale", Tensor::scalar(4.0, kFloat64)}, {"growth_tracker", Tensor::scalar(0.0, kInt64)}});
    CHECK(old_format.get_scale() == 4.0);
    nn::StateDict bad = sd;
    for (auto& kv : bad)
      if (kv.first == "growth_factor") kv.second = Tensor::scalar(0.5, kFloat64);
      else if (kv.first == "growth_interval") kv.second = Tensor::scalar(1.5, kFloat64);
    CHECK_THROWS_MSG(resumed.load_state_dict(bad), ValueError, "[GradScaler.load_state_dict]",
                     "'growth_factor' must be > 1, got 0.5", "'growth_interval' must be a CPU scalar of dtype int64");
    CHECK(resumed.get_scale() == 6.0);  // nothing changed
    // int64 entries exactly, up to INT64_MAX (through a double, 2^63 - 1 was refused at save and wrapped
    // to INT64_MIN at load)
    nn::GradScalerOptions never_grows;
    never_grows.growth_interval = std::numeric_limits<int64_t>::max();
    nn::GradScaler patient(never_grows), loaded;
    loaded.load_state_dict(patient.state_dict());
    for (const auto& kv : loaded.state_dict())
      if (kv.first == "growth_interval") CHECK(kv.second.item<int64_t>() == std::numeric_limits<int64_t>::max());
  }
  nn::GradScalerOptions shrinking;
  shrinking.growth_factor = 0.5;
  CHECK_THROWS_MSG(nn::GradScaler{shrinking}, ValueError, "growth_factor");
}

TEST_CASE("GradScaler with several optimizers: each unscaled and checked on its own, one step each per update") {
  // Before: one 'unscaled' flag for the scaler, so the second optimizer stepped with gradients still
  // multiplied by the scale, and its inf/NaN went unseen; a second step() without update() did the same.
  Tensor a = Tensor::full({1}, 1.0, kFloat64).set_requires_grad(true);
  Tensor b = Tensor::full({1}, 1.0, kFloat64).set_requires_grad(true);
  nn::SGD sa({{"a", a}}, nn::SGDOptions{0.1}), sb({{"b", b}}, nn::SGDOptions{0.1});
  nn::GradScaler scaler(nn::GradScalerOptions{1024.0, 2.0, 0.5, 100});
  scaler.scale(sum(a + b)).backward();
  CHECK(scaler.step(sa));
  CHECK(scaler.step(sb));
  CHECK(values(a)[0] == doctest::Approx(0.9));
  CHECK(values(b)[0] == doctest::Approx(0.9));  // was 1 - 0.1 * 1024
  CHECK_THROWS_MSG(scaler.step(sa), ValueError, "[GradScaler.step] already called for this optimizer");
  CHECK_THROWS_MSG(scaler.unscale_(sb), ValueError, "[GradScaler.unscale_] called after step()");
  scaler.update();
  CHECK(scaler.get_scale() == 1024);
  // b's gradient overflows: a steps, b does not, and update() backs off
  a.set_grad(Tensor::full({1}, 1024.0, kFloat64));
  b.set_grad(Tensor::full({1}, std::numeric_limits<double>::infinity(), kFloat64));
  CHECK(scaler.step(sa));
  CHECK_FALSE(scaler.step(sb));
  CHECK(scaler.found_inf());
  CHECK(values(b)[0] == doctest::Approx(0.9));
  scaler.update();
  CHECK(scaler.get_scale() == 512);
  CHECK_FALSE(scaler.found_inf());
  // disabled: a scale of 1, as PyTorch's
  nn::GradScalerOptions off;
  off.enabled = false;
  CHECK(nn::GradScaler(off).get_scale() == 1.0);
}

TEST_CASE("checkpoints save and restore master weights, float32 state and the loss scaler bit-exactly") {
  TempDir tmp;
  std::string path = tmp.file("amp.ckpt");
  Tensor p = rnd({3, 4}, 5, kBFloat16).set_requires_grad(true);
  nn::AdamW opt({{"p", p}}, nn::AdamWOptions{});
  nn::GradScaler scaler(nn::GradScalerOptions{128.0, 2.0, 0.5, 1});
  for (int s = 0; s < 3; ++s) {
    p.set_grad(mul(rnd({3, 4}, 10 + uint64_t(s), kBFloat16), scaler.get_scale()));
    scaler.step(opt);
    scaler.update();
  }
  nn::TrainingCheckpoint ck;
  ck.model = {{"p", p.detach()}};
  ck.optimizer = opt.state_dict();
  ck.scaler = scaler.state_dict();
  ck.step = 3;
  nn::save_checkpoint(path, ck);
  nn::TrainingCheckpoint back = nn::load_checkpoint(path);
  Tensor p2 = back.model[0].second.detach().set_requires_grad(true);
  CHECK(p2.dtype() == kBFloat16);
  nn::AdamW opt2({{"p", p2}}, nn::AdamWOptions{});
  opt2.load_state_dict(back.optimizer);
  nn::GradScaler scaler2;
  scaler2.load_state_dict(back.scaler);
  CHECK(scaler2.get_scale() == scaler.get_scale());
  CHECK(values(opt2.master("p")) == values(opt.master("p")));
  // both continue identically
  for (auto* o : {&opt, &opt2}) {
    Tensor& q = o == &opt ? p : p2;
    nn::GradScaler& sc = o == &opt ? scaler : scaler2;
    q.set_grad(mul(rnd({3, 4}, 99, kBFloat16), sc.get_scale()));
    sc.step(*o);
    sc.update();
  }
  CHECK(values(p2) == values(p));
  CHECK(values(opt2.master("p")) == values(opt.master("p")));
}

TEST_CASE("an autocast training run tracks the float32 run's loss") {
  // A 2-layer MLP with layer norm on a fixed random classification task, trained with Adam from
  // the same initial weights in float32 and under bfloat16 / float16 (+ GradScaler) autocast.
  const int64_t N = 64, D = 16, H = 32, C = 4;
  Tensor x = rnd({N, D}, 7);
  Generator gy(8);
  Tensor y = randint(0, C, {N}, gy);
  auto run = [&](std::optional<DType> dt) {
    Generator g(9);
    nn::Linear l1(D, H, true, g), l2(H, C, true, g);
    nn::LayerNorm ln(H);
    nn::StateDict params;
    int mi = 0;
    for (auto* m : std::initializer_list<nn::Module*>{&l1, &ln, &l2}) {
      for (auto& kv : m->named_parameters()) params.emplace_back(std::to_string(mi) + "." + kv.first, kv.second);
      ++mi;
    }
    nn::Adam opt(params, nn::AdamOptions{1e-2});
    nn::GradScaler scaler(nn::GradScalerOptions{65536.0, 2.0, 0.5, 2000, dt == kFloat16});
    std::vector<double> losses;
    for (int step = 0; step < 60; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard guard(dt);
        loss = cross_entropy(l2.forward(gelu(ln.forward(l1.forward(x)))), y);
      }
      losses.push_back(loss.item());
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    }
    return losses;
  };
  std::vector<double> f32 = run(std::nullopt);
  CHECK(f32.back() < 0.3 * f32.front());  // it learns
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(std::string(dtype_name(dt)));
    std::vector<double> low = run(dt);
    double worst = 0;
    for (size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, std::fabs(low[i] - f32[i]));
    MESSAGE(std::string(dtype_name(dt)), ": max |loss - float32 loss| over 60 steps = ", worst, ", initial ",
            f32.front(), ", final ", low.back(), " vs ", f32.back());
    // bfloat16 rounds the products to 3 digits: the curves stay within 1% of the initial loss
    // (measured: bfloat16 0.0008, float16 0.00008 on an initial 1.37)
    CHECK_MESSAGE(worst < 0.01 * f32.front(), "max |loss difference| ", worst, " (initial ", f32.front(), ")");
    CHECK(low.back() < 0.3 * low.front());
  }
}

TEST_CASE("autocast: the fused attention ops run on float32 copies of 16-bit q, k, v") {
  const Bf16ArmOff arm_off;  // (the bfloat16 arm of flash attention: the next test case)
  // (B, H, N, D) = (1, 2, 6, 4); two blocks of three tokens for block_attention.
  Tensor q = rnd({1, 2, 6, 4}, 21, kBFloat16), k = rnd({1, 2, 6, 4}, 22, kBFloat16),
         v = rnd({1, 2, 6, 4}, 23, kBFloat16);
  Tensor members = expand(ti64({0, 2, 4, 1, 3, 5}, {1, 1, 2, 3}), {1, 2, 2, 3});
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(std::string(dtype_name(dt)));
    Tensor ql = to(to(q, kFloat32), dt), kl = to(to(k, kFloat32), dt), vl = to(to(v, kFloat32), dt);
    Tensor want = flash_attention(to(ql, kFloat32), to(kl, kFloat32), to(vl, kFloat32), Tensor(), 0.0, true);
    BlockAttentionOptions bo;
    bo.look_back = 1;
    Tensor want_block = block_attention(to(ql, kFloat32), to(kl, kFloat32), to(vl, kFloat32), members, Tensor(), bo).out;
    // nn::chunked_attention (neural clustering, LSH, Cluster-Former) calls the kernel past
    // block_attention's entry: it must take the float32 route itself. A mixed bfloat16 /
    // float32 triple (what LSH's float32 key normalisation gives) goes the same way.
    nn::ChunkedAttentionOptions co;
    co.look_back = 1;
    Tensor want_chunked =
        nn::chunked_attention(to(ql, kFloat32), to(kl, kFloat32), to(vl, kFloat32), members, Tensor(), co).out;
    // Without autocast a 16-bit input is a clear error; under it, the float32 kernel on the same values.
    CHECK_THROWS_MSG(flash_attention(ql, kl, vl), DTypeError, "[flash_attention]", "float32 or float64");
    CHECK_THROWS_MSG(nn::chunked_attention(ql, kl, vl, members, Tensor(), co), DTypeError, "[block_attention] expects float32 or float64, got");
    AutocastGuard guard(dt);
    Tensor got = flash_attention(ql, kl, vl, Tensor(), 0.0, true);
    CHECK(got.dtype() == kFloat32);
    check_close(got, want, 0);
    check_close(block_attention(ql, kl, vl, members, Tensor(), bo).out, want_block, 0);
    Tensor got_chunked = nn::chunked_attention(ql, kl, vl, members, Tensor(), co).out;
    CHECK(got_chunked.dtype() == kFloat32);
    check_close(got_chunked, want_chunked, 0);
    check_close(nn::chunked_attention(ql, to(kl, kFloat32), vl, members, Tensor(), co).out, want_chunked, 0);
  }
}

// An arm against the float32 kernel on the same values: the largest |a - r| within rel times the largest |r|
// (entries where both hold the same infinity skipped: the lse of a row with nothing to see). Where the bfloat16
// arm runs (AMX or vdpbf16ps) it must also differ from float32 somewhere, or it did not run.
namespace {
void check_within(const Tensor& a, const Tensor& r, double rel, bool arm, const char* what) {
  const std::vector<double> x = values(a), y = values(r);
  double mx = 0, e = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(y[i]) && x[i] == y[i]) continue;
    mx = std::max(mx, std::fabs(y[i])), e = std::max(e, std::fabs(x[i] - y[i]));
  }
  CHECK_MESSAGE(e <= rel * mx, what, ": max error ", e, " against max |value| ", mx);
  CHECK(mx > 0);
  if (arm) CHECK_MESSAGE(e > 0, what, ": bit-identical to float32, so the bfloat16 arm did not run");
}
}  // namespace

TEST_CASE("autocast: bfloat16 flash attention on AMX or vdpbf16ps matches the float32 kernel within bfloat16 rounding") {
  // The bfloat16 arm (kernels/attention/attention_cpu.cpp, flash_attention_*_bf16_cpu): bfloat16 q, k, v, every
  // product on AMX tiles (or vdpbf16ps, AMD) in float32, the probabilities and dS rounded to bfloat16 for the
  // products with V, dO, K and Q. Reference: the float32 kernel on the same (bfloat16-valued) inputs. Shapes cross the tile
  // sizes (128 queries x 512 keys) and the 32-wide AMX blocks (head sizes 40 and 64); causal with Nq != Nk;
  // a key padding mask, one batch row with every key padded (zeros, lse -inf). On a CPU with neither the
  // float32 copies run instead, within the same bounds.
  const bool arm = bf16_arm_here();
  const std::string path = kernels::bf16_amx_available() ? "AMX kernels"
                           : arm ? "vdpbf16ps kernels"
                                 : "neither AMX nor vdpbf16ps here: the float32 route is checked";
  MESSAGE(path);
  struct Case {
    int64_t Nq, Nk, D;
    bool causal, mask;
  };
  for (const Case& c : {Case{150, 600, 64, false, true}, Case{150, 600, 40, true, false},
                        Case{37, 37, 64, true, true}, Case{130, 129, 32, false, false}}) {
    INFO("Nq ", c.Nq, " Nk ", c.Nk, " D ", c.D, c.causal ? " causal" : "", c.mask ? " masked" : "");
    const int64_t B = 2, H = 2;
    Tensor q = to(rnd({B, H, c.Nq, c.D}, 51), kBFloat16), k = to(rnd({B, H, c.Nk, c.D}, 52), kBFloat16),
           v = to(rnd({B, H, c.Nk, c.D}, 53), kBFloat16), w = rnd({B, H, c.Nq, c.D}, 54);
    Tensor kpm;
    if (c.mask) {
      std::vector<bool> m(size_t(B * c.Nk), false);
      for (int64_t j = 0; j < c.Nk; ++j) m[size_t(j)] = j % 7 == 3;  // batch 0: some keys padded
      for (int64_t j = 0; j < c.Nk; ++j) m[size_t(c.Nk + j)] = true;  // batch 1: every key
      kpm = Tensor::from_vector(m, {B, c.Nk});
    }
    // float32 reference on the bfloat16 values
    Tensor q32 = to(q, kFloat32).set_requires_grad(true), k32 = to(k, kFloat32).set_requires_grad(true),
           v32 = to(v, kFloat32).set_requires_grad(true);
    Tensor ref = flash_attention(q32, k32, v32, kpm, 0.0, c.causal);
    sum(mul(ref, w)).backward();
    Tensor ql = q.detach().set_requires_grad(true), kl = k.detach().set_requires_grad(true),
           vl = v.detach().set_requires_grad(true);
    Tensor got;
    {
      AutocastGuard guard(kBFloat16);
      got = flash_attention(ql, kl, vl, kpm, 0.0, c.causal);
      sum(mul(got, w)).backward();
    }
    CHECK(got.dtype() == kFloat32);
    CHECK(ql.grad().dtype() == kBFloat16);
    check_within(got, ref, 0.01, arm, "out");
    check_within(ql.grad(), q32.grad(), 0.02, arm, "dq");
    check_within(kl.grad(), k32.grad(), 0.02, arm, "dk");
    check_within(vl.grad(), v32.grad(), 0.02, arm, "dv");
    if (c.mask) {  // batch 1 attends to nothing: zeros
      const std::vector<double> o = values(slice(got, 0, 1, 2));
      CHECK(std::all_of(o.begin(), o.end(), [](double x) { return x == 0.0; }));
    }
  }
  // Head size 0: every score is 0 (an empty sum; the default scale 1/sqrt(0) is infinite and must not meet it),
  // so every key weighs the same, as on the float32 route.
  Tensor q0 = to(rnd({1, 1, 3, 0}, 55), kBFloat16), k0 = to(rnd({1, 1, 4, 0}, 56), kBFloat16);
  Tensor v0 = to(reshape(to(Tensor::arange(8), kFloat32), {1, 1, 4, 2}), kBFloat16);
  AutocastGuard guard(kBFloat16);
  check_close(flash_attention(q0, k0, v0), std::vector<double>{3, 4, 3, 4, 3, 4}, 0);
}

TEST_CASE("autocast: a bfloat16 flash attention backward runs after the GEMM switches were turned off") {
  // The forward took the bfloat16 arm; a scope that turns the kernels off (a test's, cf-bench's path comparison)
  // before the backward must not make it fail (its guard asked whether a kernel was switched on: an internal
  // error), and gives the gradients of the kernel the CPU still has.
  if (!bf16_arm_here()) {
    MESSAGE("neither AMX nor vdpbf16ps here: the bfloat16 arm does not run");
    return;
  }
  const Tensor q = to(rnd({1, 2, 40, 32}, 61), kBFloat16), k = to(rnd({1, 2, 40, 32}, 62), kBFloat16),
               v = to(rnd({1, 2, 40, 32}, 63), kBFloat16);
  auto grads = [&](bool off_before_backward) {
    Tensor ql = q.detach().set_requires_grad(true), kl = k.detach().set_requires_grad(true),
           vl = v.detach().set_requires_grad(true);
    Tensor out;
    {
      AutocastGuard guard(kBFloat16);
      out = flash_attention(ql, kl, vl, Tensor(), 0.0, true);
    }
    std::optional<Bf16ArmOff> off;
    if (off_before_backward) off.emplace();
    sum(out).backward();
    return std::vector<Tensor>{ql.grad(), kl.grad(), vl.grad()};
  };
  const std::vector<Tensor> want = grads(false), got = grads(true);
  for (size_t i = 0; i < want.size(); ++i) {
    REQUIRE(got[i].defined());
    if (!kernels::bf16_amx_supported()) CHECK(values(got[i]) == values(want[i]));  // (vdpbf16ps both times)
  }
}

TEST_CASE("autocast: bfloat16 block attention on AMX or vdpbf16ps matches the float32 kernel within bfloat16 rounding") {
  // The block kernel's bfloat16 arm (block_attention_*_bf16_cpu; neural clustering, LSH with one round, Cluster-Former
  // and sliding windows reach it through chunked_attention): rows gathered through a member table with empty
  // slots (-1), chunks of 16 seeing look_back 1 (and look_ahead 1), causal by original position, a key padding
  // mask, self_mask (Reformer's rule); the float32 kernel on the same bfloat16 values as the reference.
  const bool arm = bf16_arm_here();
  const int64_t B = 2, H = 2, N = 70, w = 16, C = (N + w - 1) / w;
  std::mt19937 rng(7);
  std::vector<int64_t> table;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    std::vector<int64_t> perm(size_t(C * w), -1);
    std::iota(perm.begin(), perm.begin() + N, 0);
    std::shuffle(perm.begin(), perm.end(), rng);  // empty slots scattered among the chunks
    table.insert(table.end(), perm.begin(), perm.end());
  }
  const Tensor members = Tensor::from_vector(table, {B, H, C, w});
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t j = 0; j < N; ++j) m[size_t(j)] = j % 5 == 2;
  const Tensor kpm = Tensor::from_vector(m, {B, N});
  struct Case {
    int64_t D, look_ahead;
    bool causal, self_mask, mask;
  };
  for (const Case& c : {Case{64, 0, false, false, true}, Case{40, 1, true, false, false}, Case{32, 0, false, true, true}}) {
    INFO("D ", c.D, " look_ahead ", c.look_ahead, c.causal ? " causal" : "", c.self_mask ? " self_mask" : "");
    BlockAttentionOptions bo;
    bo.look_back = 1;
    bo.look_ahead = c.look_ahead;
    bo.causal = c.causal;
    bo.self_mask = c.self_mask;
    const Tensor mask = c.mask ? kpm : Tensor();
    Tensor q = to(rnd({B, H, N, c.D}, 61), kBFloat16), k = c.self_mask ? q : to(rnd({B, H, N, c.D}, 62), kBFloat16),
           v = to(rnd({B, H, N, c.D}, 63), kBFloat16), w_out = rnd({B, H, N, c.D}, 64), w_lse = rnd({B, H, N}, 65);
    Tensor q32 = to(q, kFloat32).set_requires_grad(true), k32 = to(k, kFloat32).set_requires_grad(true),
           v32 = to(v, kFloat32).set_requires_grad(true);
    BlockAttentionResult ref = block_attention(q32, k32, v32, members, mask, bo);
    // (lse's gradient too: it joins through D = dO . O - dlse)
    add(sum(mul(ref.out, w_out)), sum(mul(where(lt(abs(ref.lse), INFINITY), ref.lse, 0.0), w_lse))).backward();
    Tensor ql = q.detach().set_requires_grad(true), kl = k.detach().set_requires_grad(true),
           vl = v.detach().set_requires_grad(true);
    BlockAttentionResult got;
    {
      AutocastGuard guard(kBFloat16);
      got = block_attention(ql, kl, vl, members, mask, bo);
      add(sum(mul(got.out, w_out)), sum(mul(where(lt(abs(got.lse), INFINITY), got.lse, 0.0), w_lse))).backward();
    }
    CHECK(got.out.dtype() == kFloat32);
    check_within(got.out, ref.out, 0.01, arm, "out");
    check_within(got.lse, ref.lse, 0.01, arm, "lse");
    check_within(ql.grad(), q32.grad(), 0.02, arm, "dq");
    check_within(kl.grad(), k32.grad(), 0.02, arm, "dk");
    check_within(vl.grad(), v32.grad(), 0.02, arm, "dv");
  }
  // LSH's rounds: 2 rounds over one q, k, v (a table of H * 2 heads), combined through their lse
  {
    INFO("2 rounds, combined");
    std::vector<int64_t> t2;
    for (int64_t bh = 0; bh < B * H * 2; ++bh) {
      std::vector<int64_t> perm(size_t(C * w), -1);
      std::iota(perm.begin(), perm.begin() + N, 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      t2.insert(t2.end(), perm.begin(), perm.end());
    }
    const Tensor members2 = Tensor::from_vector(t2, {B, H * 2, C, w});
    BlockAttentionOptions bo;
    bo.look_back = 1;
    bo.rounds = 2;
    bo.combine_rounds = true;
    Tensor q = to(rnd({B, H, N, 32}, 71), kBFloat16), k = to(rnd({B, H, N, 32}, 72), kBFloat16),
           v = to(rnd({B, H, N, 32}, 73), kBFloat16), w_out = rnd({B, H, N, 32}, 74);
    Tensor q32 = to(q, kFloat32).set_requires_grad(true), k32 = to(k, kFloat32).set_requires_grad(true),
           v32 = to(v, kFloat32).set_requires_grad(true);
    BlockAttentionResult ref = block_attention(q32, k32, v32, members2, kpm, bo);
    sum(mul(ref.out, w_out)).backward();
    Tensor ql = q.detach().set_requires_grad(true), kl = k.detach().set_requires_grad(true),
           vl = v.detach().set_requires_grad(true);
    BlockAttentionResult got;
    {
      AutocastGuard guard(kBFloat16);
      got = block_attention(ql, kl, vl, members2, kpm, bo);
      sum(mul(got.out, w_out)).backward();
    }
    CHECK(got.out.dtype() == kFloat32);
    CHECK(got.out.shape() == Shape{B, H, N, 32});
    check_within(got.out, ref.out, 0.01, arm, "out");
    check_within(ql.grad(), q32.grad(), 0.02, arm, "dq");
    check_within(kl.grad(), k32.grad(), 0.02, arm, "dk");
    check_within(vl.grad(), v32.grad(), 0.02, arm, "dv");
  }
}

TEST_CASE("autocast: full attention (the fused kernel, float32 out, AMX or vdpbf16ps products) matches float32") {
  nn::AttentionSpec spec;
  spec.type = "full";
  spec.d_model = 32;
  spec.n_heads = 2;
  std::shared_ptr<nn::Attention> att = nn::make_attention(spec);
  nn::AttentionArgs a;
  a.q = rnd({1, 2, 24, 16}, 31);
  a.k = rnd({1, 2, 24, 16}, 32);
  a.v = rnd({1, 2, 24, 16}, 33);
  a.causal = true;
  Tensor ref = att->forward(a);
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor low;
    {
      AutocastGuard guard(dt);
      low = att->forward(a);
    }
    // FullAttention runs flash_attention, whose out is float32 under autocast (on float32 copies,
    // or bfloat16 products on AMX: docs/design-notes.md "Autocast"); the bound below is what 16 bits
    // must meet.
    CHECK(low.dtype() == kFloat32);
    std::vector<double> l = values(low), r = values(ref);
    double m = 0, e = 0;
    for (size_t i = 0; i < l.size(); ++i) m = std::max(m, std::fabs(r[i])), e = std::max(e, std::fabs(l[i] - r[i]));
    const double u = dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
    CHECK_MESSAGE(e <= 8 * u * m, std::string(dtype_name(dt)), ": max error ", e, " vs bound ", 8 * u * m);
  }
}

TEST_CASE("a layer converted to 16 bits trains under autocast with every variant - EMA centroids and banks stay float32") {
  // Module::to(bfloat16) made routing's EMA centroids and a memory bank's FIFO 16-bit: routing
  // refused its float32 island's q, K-Means refused the bank, and neural clustering's island
  // refused its 16-bit C and W^C.
  const int64_t B = 2, H = 2, N = 16, D = 4;
  for (const std::string& type : nn::attention_types()) {
    for (DType dt : {kBFloat16, kFloat16}) {
      const std::string what = type + " " + dtype_name(dt);
      INFO(what);
      nn::AttentionSpec spec = small_attention_spec(type, H * D, H);
      auto m = std::make_shared<nn::MultiHeadAttention>(H * D, H, nn::make_attention(spec));
      m->to(dt);
      for (auto& [name, b] : m->named_buffers())
        if (name.find("centroids") != std::string::npos || name.find("memory") != std::string::npos)
          CHECK(b.dtype() == kFloat32);
      for (auto& [name, p] : m->named_parameters()) CHECK(p.dtype() == dt);
      m->train();
      Tensor x = rnd({B, N, H * D}, 5, dt);
      Tensor y;
      {
        AutocastGuard guard(dt);
        y = m->forward(x, x, x);
      }
      sum(to(y, kFloat32)).backward();
      for (auto& [name, p] : m->named_parameters())
        if (name.find("centroids") == std::string::npos && name.find("w_c") == std::string::npos)
          CHECK(p.grad().defined());
    }
  }
  nn::MemoryBankOptions o;
  o.dim = 4;
  o.num_clusters = 2;
  o.capacity = 64;
  o.update_every = 1;
  nn::MemoryBank bank(o);
  bank.to(kBFloat16);
  CHECK(bank.memory.dtype() == kFloat32);
  bank.add(rnd({20, 4}, 6, kBFloat16));
  CHECK(bank.step());  // K-Means on the float32 FIFO
  CHECK(bank.centroids.dtype() == kFloat32);
}

TEST_CASE("autocast: every registered attention variant takes 16-bit q, k, v and equals its float32 run") {
  const Bf16ArmOff arm_off;  // (full attention's bfloat16 arm: its own test case above)
  // Issue 26. Under autocast a variant gets what 16-bit projections give it: bfloat16 / float16
  // q, k, v (neural clustering also a float32 layer input). On the CPU none has 16-bit kernels
  // (the tensor-core arms are CUDA's): full attention runs flash_attention on float32 copies;
  // clustered, improved clustered, routing, fixed sparse and LSH run as float32 islands
  // (nn::autocast_float32_args); neural clustering clusters in float32 and Cluster-Former reaches
  // the gathered block kernel through chunked_attention, which take the same float32 route. Reference: the same module (eval mode, fixed hash rotations) on the
  // widened values without autocast: the same clusters and the same float32 arithmetic, so the
  // outputs are equal and float32.
  const int64_t B = 2, H = 2, N = 32, D = 8;
  for (const std::string& type : nn::attention_types()) {
    for (DType dt : {kBFloat16, kFloat16}) {
      const std::string what = type + " " + dtype_name(dt);
      INFO(what);
      nn::AttentionSpec spec = small_attention_spec(type, H * D, H);
      std::shared_ptr<nn::Attention> att = nn::make_attention(spec);
      att->eval();
      nn::AttentionArgs a;
      a.q = rnd({B, H, N, D}, 41, dt);
      a.k = att->shares_qk() ? a.q : rnd({B, H, N, D}, 42, dt);
      a.v = rnd({B, H, N, D}, 43, dt);
      a.query_input = rnd({B, N, H * D}, 44);
      nn::AttentionArgs r = a;
      r.q = to(a.q, kFloat32);
      r.k = att->shares_qk() ? r.q : to(a.k, kFloat32);
      r.v = to(a.v, kFloat32);
      Tensor ref = att->forward(r), low;
      // Without autocast a 16-bit q, k, v is refused by the layer, which names itself and autocast
      // (each variant failed deep inside, naming a kernel: [hash_codes], [block_attention], ...).
      const std::string refused = std::string("Attention] q, k, v are ") + dtype_name(dt);
      CHECK_THROWS_MSG(att->forward(a), DTypeError, refused.c_str(),
                       "only under autocast");
      {
        AutocastGuard guard(dt);
        low = att->forward(a);
      }
      CHECK(low.dtype() == kFloat32);
      check_close(low, ref, 0);
    }
  }
}
