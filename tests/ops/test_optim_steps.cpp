// Fused optimizer steps (autograd/ops/optim.h): against the update composed from
// elementwise ops (the path strided parameters take), their errors, and CUDA
// parity (the kernel may fuse a multiply-add, so a float64-scale tolerance).
#include "autograd/ops/optim.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

struct State {
  Tensor p, g, m, v;
};

State adam_state(DType dt, Device dev = Device::cpu()) {
  Generator gen(5);
  State s{rand({7, 9}, dt, gen, -1, 1), rand({7, 9}, dt, gen, -1, 1), rand({7, 9}, dt, gen, -0.1, 0.1),
          rand({7, 9}, dt, gen, 0, 0.01)};
  for (Tensor* t : {&s.p, &s.g, &s.m, &s.v}) *t = t->to(dev);
  return s;
}

// The same update from elementwise ops (nn/optim/adam.cpp's strided path).
void adam_composed(State& s, const ops::AdamStep& a) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, double(a.step)));
  Tensor g = s.g;
  if (!a.decoupled && a.weight_decay != 0) g = add(g, mul(s.p, a.weight_decay));
  if (a.decoupled && a.weight_decay != 0) s.p = mul(s.p, 1.0 - a.lr * a.weight_decay);
  s.m = add(mul(s.m, a.beta1), mul(g, 1.0 - a.beta1));
  s.v = add(mul(s.v, a.beta2), mul(mul(g, g), 1.0 - a.beta2));
  s.p = add(s.p, mul(div(s.m, add(div(sqrt(s.v), bc2_sqrt), a.eps)), -(a.lr / bc1)));
}

ops::AdamStep adam_args(bool decoupled) {
  ops::AdamStep a;
  a.lr = 0.01;
  a.weight_decay = 0.1;
  a.step = 3;
  a.decoupled = decoupled;
  return a;
}

}  // namespace

TEST_SUITE("ops/optim") {

TEST_CASE("adam_step_ equals the update composed from elementwise ops (Adam and AdamW, float32 and float64)") {
  for (DType dt : {kFloat64, kFloat32})
    for (bool decoupled : {false, true}) {
      INFO(dt, decoupled ? " AdamW" : " Adam");
      State fused = adam_state(dt), ref = adam_state(dt);
      const ops::AdamStep a = adam_args(decoupled);
      const int64_t version = fused.p.version();
      ops::adam_step_(fused.p, fused.g, fused.m, fused.v, a);
      adam_composed(ref, a);
      CHECK(fused.p.version() > version);
      const double tol = dt == kFloat64 ? 1e-15 : 1e-6;
      check_close(fused.p, ref.p, tol);
      check_close(fused.m, ref.m, tol);
      check_close(fused.v, ref.v, tol);
    }
}

TEST_CASE("sgd_step_: plain, momentum (first and later steps) and Nesterov against the formulas") {
  Generator gen(2);
  const Tensor p0 = rand({10}, kFloat64, gen, -1, 1), g = rand({10}, kFloat64, gen, -1, 1);
  const Tensor b0 = rand({10}, kFloat64, gen, -1, 1);
  ops::SgdStep s;
  s.lr = 0.1;
  s.weight_decay = 0.01;
  s.momentum = 0.9;
  s.dampening = 0.2;
  const Tensor d = add(g, mul(p0, 0.01));
  for (bool first : {true, false})
    for (bool nesterov : {false, true}) {
      if (nesterov && s.dampening != 0) s.dampening = 0;
      INFO("first ", first, " nesterov ", nesterov);
      s.first = first;
      s.nesterov = nesterov;
      Tensor p = clone(p0), buf = clone(b0);
      ops::sgd_step_(p, g, buf, s);
      const Tensor b = first ? d : add(mul(b0, s.momentum), mul(d, 1.0 - s.dampening));
      check_close(buf, b, 1e-15);
      check_close(p, sub(p0, mul(nesterov ? add(d, mul(b, s.momentum)) : b, s.lr)), 1e-15);
    }
  Tensor p = clone(p0);
  ops::sgd_step_(p, g, Tensor(), s);  // no momentum buffer
  check_close(p, sub(p0, mul(d, s.lr)), 1e-15);
}

TEST_CASE("sum_squares: index-order double sum on the CPU, the reduction elsewhere") {
  const Tensor g = t32({1.5f, -2.0f, 0.25f}, {3});
  CHECK(ops::sum_squares(g) == 2.25 + 4.0 + 0.0625);
  CHECK(ops::sum_squares(transpose(t64({1, 2, 3, 4}, {2, 2}), 0, 1)) == 30.0);  // strided
}

TEST_CASE("the fused steps refuse tensors they cannot write in place, naming the problem") {
  State s = adam_state(kFloat32);
  const ops::AdamStep a = adam_args(false);
  CHECK_THROWS_MSG(ops::adam_step_(s.p, s.g, to(s.m, kFloat64), s.v, a), ValueError, "[adam_step] exp_avg must be",
                   "float64 (7,9)");
  CHECK_THROWS_MSG(ops::adam_step_(s.p, s.g, s.m, transpose(s.v, 0, 1), a), ValueError, "[adam_step] exp_avg_sq");
  CHECK_THROWS_MSG(ops::adam_step_(transpose(s.p, 0, 1), s.g, s.m, s.v, a), ValueError,
                   "[adam_step] the parameter must be a contiguous float32 or float64 tensor");
  CHECK_THROWS_MSG(ops::adam_step_(s.p, reshape(s.g, {9, 7}), s.m, s.v, a), ValueError,
                   "[adam_step] the gradient must have the parameter's shape");
  ops::AdamStep bad = a;
  bad.step = 0;
  CHECK_THROWS_MSG(ops::adam_step_(s.p, s.g, s.m, s.v, bad), ValueError, "[adam_step] step must be >= 1, got 0");
  CHECK_THROWS_MSG(ops::sgd_step_(s.p, s.g, fake_cuda({7, 9}), ops::SgdStep{}), ValueError, "[sgd_step] momentum",
                   "cuda:0");
  CHECK_THROWS_MSG(ops::sum_squares(Tensor()), ValueError, "[sum_squares]");
}

CUDA_TEST_CASE("adam_step_ and sgd_step_ on CUDA equal the CPU's") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    const double tol = dt == kFloat64 ? 1e-14 : 1e-6;
    State cpu = adam_state(dt), gpu = adam_state(dt, Device::cuda(0));
    const ops::AdamStep a = adam_args(true);
    for (int i = 0; i < 3; ++i) {
      ops::adam_step_(cpu.p, cpu.g, cpu.m, cpu.v, a);
      ops::adam_step_(gpu.p, gpu.g, gpu.m, gpu.v, a);
    }
    check_close(gpu.p.cpu(), cpu.p, tol);
    check_close(gpu.v.cpu(), cpu.v, tol);
    ops::SgdStep s;
    s.lr = 0.1;
    s.momentum = 0.9;
    s.nesterov = true;
    Tensor bc = Tensor::zeros({7, 9}, dt), bg = Tensor::zeros({7, 9}, dt, Device::cuda(0));
    ops::sgd_step_(cpu.p, cpu.g, bc, s);
    ops::sgd_step_(gpu.p, gpu.g, bg, s);
    check_close(gpu.p.cpu(), cpu.p, tol);
    check_close(bg.cpu(), bc, tol);
  }
}

}  // TEST_SUITE
