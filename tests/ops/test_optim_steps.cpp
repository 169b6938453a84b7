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

// n parameters of varied sizes (an empty one among them), with gradients, moments and per-parameter
// constants (steps, lrs, decays, both Adam forms), on dev.
std::vector<kernels::AdamTensors> adam_batch(int n, DType dt, Device dev) {
  Generator gen(17);
  std::vector<kernels::AdamTensors> out;
  for (int i = 0; i < n; ++i) {
    const Shape shape = i == 3 ? Shape{0, 4} : Shape{1 + (i * 7) % 13, 1 + i % 5};
    kernels::AdamTensors t;
    t.p = rand(shape, dt, gen, -1, 1).to(dev);
    t.g = rand(shape, dt, gen, -1, 1).to(dev);
    t.m = rand(shape, dt, gen, -0.1, 0.1).to(dev);
    t.v = rand(shape, dt, gen, 0, 0.01).to(dev);
    t.s = adam_args(i % 2 == 0);
    t.s.step = 1 + i % 4;
    t.s.lr = 0.01 * (1 + i % 3);
    t.s.weight_decay = i % 5 == 0 ? 0.0 : 0.05;
    out.push_back(t);
  }
  return out;
}

// n SGD steps of varied sizes (an empty one among them), with and without a momentum buffer,
// first and later steps, Nesterov, on dev.
std::vector<kernels::SgdTensors> sgd_batch(int n, DType dt, Device dev) {
  Generator gen(19);
  std::vector<kernels::SgdTensors> out;
  for (int i = 0; i < n; ++i) {
    const Shape shape = i == 2 ? Shape{4, 0} : Shape{1 + (i * 5) % 11, 1 + i % 3};
    kernels::SgdTensors t;
    t.p = rand(shape, dt, gen, -1, 1).to(dev);
    t.g = rand(shape, dt, gen, -1, 1).to(dev);
    if (i % 4 != 1) t.buf = rand(shape, dt, gen, -0.5, 0.5).to(dev);
    t.s.lr = 0.05 * (1 + i % 3);
    t.s.weight_decay = i % 5 == 0 ? 0.0 : 0.01;
    t.s.momentum = t.buf.defined() ? 0.9 : 0.0;
    t.s.dampening = i % 3 == 0 ? 0.1 : 0.0;
    t.s.nesterov = t.buf.defined() && t.s.dampening == 0 && i % 2 == 0;
    t.s.first = i % 6 == 0;
    out.push_back(t);
  }
  return out;
}

// A 16-bit parameter (dt) of `shape` with its gradient, and the float32 master it was rounded from
// (extra bits below the 16-bit parameter's, as a master has after steps).
struct LowParam {
  Tensor master, low, g;
};
LowParam low_param(const Shape& shape, DType dt, Generator& gen, Device dev = Device::cpu()) {
  LowParam l;
  l.master = rand(shape, kFloat32, gen, -1, 1).to(dev);
  l.low = to(l.master, dt);
  l.g = to(rand(shape, kFloat32, gen, -1, 1), dt).to(dev);
  return l;
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

TEST_CASE("adam_steps_: each parameter gets adam_step_'s bits, all in one kernel call") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dt);
    std::vector<kernels::AdamTensors> batch = adam_batch(21, dt, Device::cpu()), each = adam_batch(21, dt, Device::cpu());
    const KernelCalls before = kernel_calls();
    ops::adam_steps_(batch);
    CHECK((kernel_calls() - before).cpu == 1);
    for (kernels::AdamTensors& t : each) ops::adam_step_(t.p, t.g, t.m, t.v, t.s);
    for (size_t i = 0; i < batch.size(); ++i)
      for (auto pick : {&kernels::AdamTensors::p, &kernels::AdamTensors::m, &kernels::AdamTensors::v})
        CHECK(values(batch[i].*pick) == values(each[i].*pick));
  }
  // A strided gradient is taken (as adam_step_ takes it); a float64 parameter between float32 ones is a
  // run of its own (three kernel calls), each as adam_step_.
  std::vector<kernels::AdamTensors> mixed = adam_batch(3, kFloat32, Device::cpu()), one = adam_batch(3, kFloat32, Device::cpu());
  for (auto* b : {&mixed, &one}) {
    (*b)[2].g = transpose(contiguous(transpose((*b)[2].g, 0, 1)), 0, 1);
    for (Tensor* t : {&(*b)[1].p, &(*b)[1].g, &(*b)[1].m, &(*b)[1].v}) *t = to(*t, kFloat64);
  }
  CHECK(!mixed[2].g.is_contiguous());
  const KernelCalls before = kernel_calls();
  ops::adam_steps_(mixed);
  CHECK((kernel_calls() - before).cpu == 4);  // the strided gradient's copy, then the three runs
  for (kernels::AdamTensors& t : one) ops::adam_step_(t.p, t.g, t.m, t.v, t.s);
  for (size_t i = 0; i < mixed.size(); ++i) CHECK(values(mixed[i].p) == values(one[i].p));
  // A bad entry is named before anything is written.
  std::vector<kernels::AdamTensors> b = adam_batch(2, kFloat32, Device::cpu());
  const std::vector<double> p0 = values(b[0].p);
  b[1].m = to(b[1].m, kFloat64);
  CHECK_THROWS_MSG(ops::adam_steps_(b), ValueError, "[adam_step] exp_avg must be");
  CHECK(values(b[0].p) == p0);
}

TEST_CASE("sgd_steps_: each parameter gets sgd_step_'s bits, all in one kernel call") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dt);
    std::vector<kernels::SgdTensors> batch = sgd_batch(19, dt, Device::cpu()), each = sgd_batch(19, dt, Device::cpu());
    std::vector<int64_t> versions;
    for (const kernels::SgdTensors& t : batch) versions.push_back(t.p.version());
    const KernelCalls before = kernel_calls();
    ops::sgd_steps_(batch);
    CHECK((kernel_calls() - before).cpu == 1);
    for (kernels::SgdTensors& t : each) ops::sgd_step_(t.p, t.g, t.buf, t.s);
    for (size_t i = 0; i < batch.size(); ++i) {
      INFO(i);
      CHECK(values(batch[i].p) == values(each[i].p));
      CHECK(batch[i].buf.defined() == each[i].buf.defined());
      if (batch[i].buf.defined()) CHECK(values(batch[i].buf) == values(each[i].buf));
      CHECK(batch[i].p.version() > versions[i]);
    }
  }
  // A bad entry is named before anything is written.
  std::vector<kernels::SgdTensors> b = sgd_batch(4, kFloat32, Device::cpu());
  const std::vector<double> p0 = values(b[0].p);
  b[3].buf = transpose(b[3].buf, 0, 1);
  CHECK_THROWS_MSG(ops::sgd_steps_(b), ValueError, "[sgd_step] momentum must be");
  b[3].buf = Tensor();
  b[2].g = to(b[2].g, kFloat64);
  CHECK_THROWS_MSG(ops::sgd_steps_(b), ValueError, "[sgd_step] the gradient must have the parameter's shape, dtype");
  CHECK(values(b[0].p) == p0);
}

TEST_CASE(
    "a master's step in the batch: the 16-bit gradient widened, the master stepped and rounded into the parameter") {
  // The reference is the path a strided 16-bit parameter takes (Optimizer::update_one): the gradient
  // widened with to(), the master stepped alone, then copy_ into the parameter.
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dt);
    Generator gen(31);
    std::vector<LowParam> adam_fused, adam_ref, sgd_fused, sgd_ref;
    for (int i = 0; i < 5; ++i) {
      const Shape shape{1 + i, 3};
      Generator g1(100 + i), g2(100 + i);
      adam_fused.push_back(low_param(shape, dt, g1));
      adam_ref.push_back(low_param(shape, dt, g2));
      Generator g3(200 + i), g4(200 + i);
      sgd_fused.push_back(low_param(shape, dt, g3));
      sgd_ref.push_back(low_param(shape, dt, g4));
    }
    // Adam: masters between plain float32 entries, one kernel call.
    std::vector<kernels::AdamTensors> batch = adam_batch(4, kFloat32, Device::cpu()),
                                      plain = adam_batch(4, kFloat32, Device::cpu());
    std::vector<Tensor> m_ref, v_ref;
    for (size_t i = 0; i < adam_fused.size(); ++i) {
      kernels::AdamTensors t;
      t.p = adam_fused[i].master;
      t.g = adam_fused[i].g;
      t.m = rand(t.p.shape(), kFloat32, gen, -0.1, 0.1);
      t.v = rand(t.p.shape(), kFloat32, gen, 0, 0.01);
      t.s = adam_args(i % 2 == 1);
      t.s.step = 2 + int64_t(i);
      t.low = adam_fused[i].low;
      m_ref.push_back(clone(t.m));
      v_ref.push_back(clone(t.v));
      batch.insert(batch.begin() + long(i), t);
    }
    const int64_t low_version = adam_fused[0].low.version();
    const KernelCalls before = kernel_calls();
    ops::adam_steps_(batch);
    CHECK((kernel_calls() - before).cpu == 1);
    CHECK(adam_fused[0].low.version() > low_version);
    for (size_t i = 0; i < adam_ref.size(); ++i) {
      INFO("adam ", i);
      LowParam& r = adam_ref[i];
      ops::adam_step_(r.master, to(r.g, kFloat32), m_ref[i], v_ref[i], batch[i].s);
      copy_(r.low, r.master);
      CHECK(values(batch[i].p) == values(r.master));
      CHECK(values(batch[i].m) == values(m_ref[i]));
      CHECK(values(batch[i].v) == values(v_ref[i]));
      CHECK(adam_fused[i].low.dtype() == dt);
      CHECK(values(adam_fused[i].low) == values(r.low));
      CHECK(values(adam_fused[i].low) != values(to(adam_fused[i].g, dt)));  // (the parameter moved)
    }
    for (kernels::AdamTensors& t : plain) ops::adam_step_(t.p, t.g, t.m, t.v, t.s);
    for (size_t i = 0; i < plain.size(); ++i) CHECK(values(batch[adam_fused.size() + i].p) == values(plain[i].p));
    // SGD, with and without momentum.
    std::vector<kernels::SgdTensors> sb;
    std::vector<Tensor> buf_ref;
    for (size_t i = 0; i < sgd_fused.size(); ++i) {
      kernels::SgdTensors t;
      t.p = sgd_fused[i].master;
      t.g = sgd_fused[i].g;
      if (i != 2) t.buf = rand(t.p.shape(), kFloat32, gen, -0.5, 0.5);
      t.s.lr = 0.1;
      t.s.weight_decay = 0.01;
      t.s.momentum = t.buf.defined() ? 0.9 : 0.0;
      t.s.nesterov = i == 3;
      t.s.first = i == 0;
      t.low = sgd_fused[i].low;
      buf_ref.push_back(t.buf.defined() ? clone(t.buf) : Tensor());
      sb.push_back(t);
    }
    ops::sgd_steps_(sb);
    for (size_t i = 0; i < sgd_ref.size(); ++i) {
      INFO("sgd ", i);
      LowParam& r = sgd_ref[i];
      ops::sgd_step_(r.master, to(r.g, kFloat32), buf_ref[i], sb[i].s);
      copy_(r.low, r.master);
      CHECK(values(sb[i].p) == values(r.master));
      if (buf_ref[i].defined()) CHECK(values(sb[i].buf) == values(buf_ref[i]));
      CHECK(values(sgd_fused[i].low) == values(r.low));
    }
    // Refused by name: a float64 master, a float32 "parameter", a gradient of the master's dtype.
    LowParam l = low_param({2, 2}, dt, gen);
    kernels::SgdTensors bad;
    bad.p = to(l.master, kFloat64);
    bad.g = l.g;
    bad.low = l.low;
    CHECK_THROWS_MSG(ops::sgd_steps_({bad}), ValueError,
                     "[sgd_step] a master (an entry with a 16-bit parameter) must be a "
                     "contiguous float32 tensor, got float64 (2,2)");
    bad.p = l.master;
    bad.low = to(l.low, kFloat32);
    CHECK_THROWS_MSG(ops::sgd_steps_({bad}), ValueError, "[sgd_step] the 16-bit parameter of master",
                     "must be a contiguous bfloat16 or float16 tensor");
    bad.low = l.low;
    bad.g = to(l.g, kFloat32);
    CHECK_THROWS_MSG(ops::sgd_steps_({bad}), ValueError,
                     "[sgd_step] the gradient must have the 16-bit parameter's shape, "
                     "dtype and device");
  }
}

TEST_CASE("a step of 16-bit parameters allocates nothing once the first has run (a CUDA graph can capture it)") {
  // Each optimizer over bfloat16 and float16 parameters (and a float32 one): after the first step
  // made the state, a step is one kernel call and no allocation, and matches update_one's path
  // (the same optimizer over the same parameters, every one strided, which widens with to()).
  for (int which = 0; which < 3; ++which) {
    INFO("optimizer ", which);
    auto make = [&](const nn::StateDict& params) -> std::unique_ptr<nn::Optimizer> {
      if (which == 0) return std::make_unique<nn::AdamW>(params);
      if (which == 1) return std::make_unique<nn::Adam>(params, nn::AdamOptions{1e-2, 0.9, 0.999, 1e-8, 0.01});
      return std::make_unique<nn::SGD>(params, nn::SGDOptions{0.05, 0.9, 0.0, true, 0.01});
    };
    Generator gen(41);
    const Tensor a0 = rand({6, 5}, kFloat32, gen, -1, 1), b0 = rand({5, 6}, kFloat32, gen, -1, 1);
    const Tensor c0 = rand({7}, kFloat32, gen, -1, 1);
    // contiguous parameters; the reference's are transposed views of a contiguous tensor (strided)
    Tensor a = to(a0, kBFloat16), b = to(b0, kFloat16), c = clone(c0);
    Tensor a_base = contiguous(transpose(to(a0, kBFloat16), 0, 1)),
           b_base = contiguous(transpose(to(b0, kFloat16), 0, 1));
    Tensor ar = transpose(a_base, 0, 1), br = transpose(b_base, 0, 1), cr = clone(c0);
    for (Tensor* t : {&a, &b, &c, &ar, &br, &cr}) t->set_requires_grad(true);
    std::unique_ptr<nn::Optimizer> opt = make({{"a", a}, {"b", b}, {"c", c}});
    std::unique_ptr<nn::Optimizer> ref = make({{"a", ar}, {"b", br}, {"c", cr}});
    for (int step = 0; step < 4; ++step) {
      INFO("step ", step);
      Generator gg(50 + step);
      const Tensor ga = to(rand({6, 5}, kFloat32, gg, -1, 1), kBFloat16),
                   gb = to(rand({5, 6}, kFloat32, gg, -1, 1), kFloat16);
      const Tensor gc = rand({7}, kFloat32, gg, -1, 1);
      a.set_grad(clone(ga));
      b.set_grad(clone(gb));
      c.set_grad(clone(gc));
      ar.set_grad(clone(ga));
      br.set_grad(clone(gb));
      cr.set_grad(clone(gc));
      const int64_t allocs = memory_stats().num_allocs;
      const KernelCalls before = kernel_calls();
      opt->step();
      if (step > 0) {
        CHECK(memory_stats().num_allocs == allocs);
        CHECK((kernel_calls() - before).cpu == 1);
      }
      ref->step();
      CHECK(values(a) == values(ar));
      CHECK(values(b) == values(br));
      CHECK(values(c) == values(cr));
      CHECK(values(opt->master("a")) == values(ref->master("a")));
      CHECK(values(opt->master("b")) == values(ref->master("b")));
    }
    CHECK(values(a) != values(to(a0, kBFloat16)));
  }
}

TEST_CASE("Adam's single call leaves out what it cannot batch: strided and memory-sharing parameters") {
  // w0, w1: plain; w2: a view of w1's storage (stepped alone, in order); w3: bfloat16 (its float32 master
  // batched with w0); w4: no gradient (untouched, its step not counted).
  Generator gen(6);
  Tensor base = rand({10, 4}, kFloat32, gen, -1, 1);
  Tensor w0 = rand({3, 4}, kFloat32, gen, -1, 1), w1 = narrow(base, 0, 0, 5), w2 = narrow(base, 0, 5, 5);
  Tensor w3 = to(rand({2, 4}, kFloat32, gen, -1, 1), kBFloat16), w4 = rand({2, 2}, kFloat32, gen, -1, 1);
  nn::StateDict params{{"w0", w0}, {"w1", w1}, {"w2", w2}, {"w3", w3}, {"w4", w4}};
  for (auto& e : params) {
    e.second.set_requires_grad(true);
    if (e.first != "w4") e.second.set_grad(to(rand(e.second.shape(), kFloat32, gen, -1, 1), e.second.dtype()));
  }
  nn::AdamW opt(params);
  std::vector<std::vector<double>> before;
  for (auto& e : params) before.push_back(values(e.second));
  opt.step();
  opt.step();
  const nn::StateDict st = opt.state_dict();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    const Tensor* step = nn::find_entry(st, "step." + params[i].first);
    REQUIRE(step);
    CHECK(step->item<int64_t>() == (i == 4 ? 0 : 2));
    CHECK((values(params[i].second) == before[i]) == (i == 4));
  }
  // The plain ones as two adam_step_ each.
  for (size_t i : {size_t(0), size_t(1), size_t(2)}) {
    Tensor p = Tensor::from_vector(std::vector<float>(before[i].begin(), before[i].end()), params[i].second.shape());
    Tensor m = Tensor::zeros(p.shape()), v = Tensor::zeros(p.shape());
    for (int64_t t = 1; t <= 2; ++t) {
      ops::AdamStep a;
      a.lr = 1e-3;
      a.weight_decay = 1e-2;
      a.decoupled = true;
      a.step = t;
      ops::adam_step_(p, params[i].second.grad(), m, v, a);
    }
    CHECK(values(params[i].second) == values(p));
  }
}

TEST_CASE("Adam's step updates a model's parameters in one kernel call, as one adam_step_ each") {
  Generator gen(4);
  nn::StateDict params;
  for (int i = 0; i < 5; ++i) {
    Tensor w = rand({3 + i, 4}, kFloat32, gen, -1, 1);
    w.set_requires_grad(true);
    w.set_grad(rand({3 + i, 4}, kFloat32, gen, -1, 1));
    params.emplace_back(str("w", i), w);
  }
  nn::AdamW opt(params);
  std::vector<Tensor> p0, m, v;
  for (auto& e : params) p0.push_back(clone(e.second.detach()));
  const KernelCalls before = kernel_calls();
  opt.step();
  CHECK((kernel_calls() - before).cpu == 1);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = p0[i], mm = Tensor::zeros(p.shape()), vv = Tensor::zeros(p.shape());
    ops::AdamStep a;
    a.lr = 1e-3;
    a.weight_decay = 1e-2;
    a.decoupled = true;
    ops::adam_step_(p, params[i].second.grad(), mm, vv, a);
    CHECK(values(params[i].second) == values(p));
  }
}

CUDA_TEST_CASE("adam_steps_ on CUDA: each parameter as the CPU's, over several launches") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    const double tol = dt == kFloat64 ? 1e-14 : 1e-6;
    std::vector<kernels::AdamTensors> cpu = adam_batch(37, dt, Device::cpu()), gpu = adam_batch(37, dt, Device::cuda(0));
    // empty first and last entries, and one larger than a grid-stride loop's first pass (65536 blocks of 256)
    for (auto* b : {&cpu, &gpu}) {
      const Device dev = b->front().p.device();
      kernels::AdamTensors e = b->front(), big = b->front();
      for (Tensor* t : {&e.p, &e.g, &e.m, &e.v}) *t = Tensor::zeros({0}, dt, dev);
      Generator g(21);
      for (Tensor* t : {&big.p, &big.g, &big.m}) *t = rand({(int64_t(1) << 24) + 5}, dt, g, -1, 1).to(dev);
      big.v = rand({(int64_t(1) << 24) + 5}, dt, g, 0, 0.01).to(dev);
      b->insert(b->begin(), e);
      b->push_back(big);
      b->push_back(e);
    }
    const cuda::TransferStats before = cuda::transfer_stats();
    ops::adam_steps_(gpu);
    CHECK((cuda::transfer_stats() - before).kernel_launches == 3);  // 16 + 16 + 8 entries
    std::vector<kernels::AdamTensors> empty{cpu.front(), cpu.back()};
    for (kernels::AdamTensors& t : empty)
      for (Tensor* x : {&t.p, &t.g, &t.m, &t.v}) *x = x->to(Device::cuda(0));
    const cuda::TransferStats none = cuda::transfer_stats();
    ops::adam_steps_(empty);
    CHECK((cuda::transfer_stats() - none).kernel_launches == 0);  // nothing to update: no launch
    ops::adam_steps_(cpu);
    // relative too: a tiny v makes updates of 10-100, where a contracted multiply-add's last bit is above 1e-6
    for (size_t i = 0; i < cpu.size(); ++i) {
      check_close_rel(gpu[i].p.cpu(), cpu[i].p, tol, tol, "adam p");
      check_close_rel(gpu[i].m.cpu(), cpu[i].m, tol, tol, "adam m");
      check_close_rel(gpu[i].v.cpu(), cpu[i].v, tol, tol, "adam v");
    }
  }
}

CUDA_TEST_CASE("sgd_steps_ and masters' steps on CUDA: each as the CPU's, in one launch per 16 entries") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    const double tol = dt == kFloat64 ? 1e-14 : 1e-6;
    std::vector<kernels::SgdTensors> cpu = sgd_batch(19, dt, Device::cpu()), gpu = sgd_batch(19, dt, Device::cuda(0));
    const cuda::TransferStats before = cuda::transfer_stats();
    ops::sgd_steps_(gpu);
    CHECK((cuda::transfer_stats() - before).kernel_launches == 2);  // 16 + 3 entries
    ops::sgd_steps_(cpu);
    for (size_t i = 0; i < cpu.size(); ++i) {
      INFO(i);
      check_close(gpu[i].p.cpu(), cpu[i].p, tol);
      if (cpu[i].buf.defined()) check_close(gpu[i].buf.cpu(), cpu[i].buf, tol);
    }
  }
  // Masters of bfloat16 and float16 parameters between float32 entries, Adam and SGD: the masters
  // within float32 tolerance of the CPU's (a fused multiply-add may differ in the last bit), the
  // 16-bit parameters the rounding of the CUDA masters (the same function on both).
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dt);
    Generator gen(61);
    std::vector<kernels::AdamTensors> ac = adam_batch(3, kFloat32, Device::cpu()),
                                      ag = adam_batch(3, kFloat32, Device::cuda(0));
    std::vector<kernels::SgdTensors> sc = sgd_batch(3, kFloat32, Device::cpu()),
                                     sg = sgd_batch(3, kFloat32, Device::cuda(0));
    for (int i = 0; i < 4; ++i) {
      Generator g1(300 + i), g2(300 + i);
      LowParam lc = low_param({3 + i, 5}, dt, g1), lg = low_param({3 + i, 5}, dt, g2, Device::cuda(0));
      kernels::AdamTensors a;
      a.p = lc.master;
      a.g = lc.g;
      a.m = rand(a.p.shape(), kFloat32, gen, -0.1, 0.1);
      a.v = rand(a.p.shape(), kFloat32, gen, 0, 0.01);
      a.s = adam_args(i % 2 == 0);
      a.low = lc.low;
      kernels::AdamTensors b = a;
      b.p = lg.master;
      b.g = lg.g;
      b.m = a.m.to(Device::cuda(0));
      b.v = a.v.to(Device::cuda(0));
      b.low = lg.low;
      ac.insert(ac.begin() + 1, a);
      ag.insert(ag.begin() + 1, b);
      Generator g3(400 + i), g4(400 + i);
      LowParam mc = low_param({5, 2 + i}, dt, g3), mg = low_param({5, 2 + i}, dt, g4, Device::cuda(0));
      kernels::SgdTensors s;
      s.p = mc.master;
      s.g = mc.g;
      s.buf = rand(s.p.shape(), kFloat32, gen, -0.5, 0.5);
      s.s.lr = 0.1;
      s.s.momentum = 0.9;
      s.low = mc.low;
      kernels::SgdTensors t = s;
      t.p = mg.master;
      t.g = mg.g;
      t.buf = s.buf.to(Device::cuda(0));
      t.low = mg.low;
      sc.push_back(s);
      sg.push_back(t);
    }
    const cuda::TransferStats before = cuda::transfer_stats();
    ops::adam_steps_(ag);
    ops::sgd_steps_(sg);
    CHECK((cuda::transfer_stats() - before).kernel_launches == 2);
    ops::adam_steps_(ac);
    ops::sgd_steps_(sc);
    for (size_t i = 0; i < ac.size(); ++i) {
      INFO("adam ", i);
      check_close_rel(ag[i].p.cpu(), ac[i].p, 1e-6, 1e-6, "adam p");
      check_close_rel(ag[i].v.cpu(), ac[i].v, 1e-6, 1e-6, "adam v");
      if (ag[i].low.defined()) CHECK(values(ag[i].low.cpu()) == values(to(ag[i].p.cpu(), dt)));
    }
    for (size_t i = 0; i < sc.size(); ++i) {
      INFO("sgd ", i);
      check_close_rel(sg[i].p.cpu(), sc[i].p, 1e-6, 1e-6, "sgd p");
      if (sg[i].low.defined()) CHECK(values(sg[i].low.cpu()) == values(to(sg[i].p.cpu(), dt)));
    }
  }
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
