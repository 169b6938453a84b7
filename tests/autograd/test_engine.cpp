#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("autograd") {

TEST_CASE("diamond graph sums both paths") {
  // y = (x*2) * (x+1)  ->  dy/dx = 2(x+1) + 2x = 4x + 2
  Tensor x = t64({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor a = x * 2.0, b = x + 1.0;
  Tensor y = sum(a * b);
  y.backward();
  check_close(x.grad(), {6, 10, 14});
}

TEST_CASE("reusing a tensor many times and accumulation across calls") {
  Tensor x = t64({2}, {1}).set_requires_grad(true);
  Tensor y = sum(x * x * x);  // 3x^2 = 12
  y.backward();
  check_close(x.grad(), {12});
  sum(x * 5.0).backward();  // accumulates: 12 + 5
  check_close(x.grad(), {17});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a leaf's first gradient is the backward's own tensor when no one else holds it, else a copy") {
  // Taken as it is: the gradient x * 3 makes is fresh, so backward runs that one kernel and no copy.
  Tensor x = t64({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = x * 3.0;
  Tensor g = t64({1, 1, 1}, {3});
  const KernelCalls before = kernel_calls();
  y.backward(g);
  CHECK((kernel_calls() - before).cpu == 1);
  check_close(x.grad(), {3, 3, 3});
  // The caller's grad_output reaching a leaf directly is copied: writing it later leaves .grad alone.
  Tensor w = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor gw = t64({5, 6}, {2});
  w.backward(gw);
  mul_(gw, 0.0);
  check_close(w.grad(), {5, 6});
  // One fresh gradient reaching two leaves (add's backward hands both the same tensor): each its own.
  Tensor a = t64({1, 2}, {2}).set_requires_grad(true), b = t64({3, 4}, {2}).set_requires_grad(true);
  sum((a + b) * 7.0).backward();
  Tensor ag = a.grad();
  mul_(ag, 0.0);
  check_close(b.grad(), {7, 7});
  // A retained gradient that flows on unchanged to a leaf (add's backward passes it through): the
  // retained .grad and the leaf's stay apart.
  Tensor h = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor mid = h + 1.0;
  autograd::retain_grad(mid);
  sum(mid * 3.0).backward();
  Tensor mg = mid.grad();
  mul_(mg, 0.0);
  check_close(h.grad(), {3, 3});
  // A view of a larger buffer (narrow's backward pads into a zero tensor of the input's size: fresh and
  // whole; a strided slice of a gradient would not be) and a later accumulation stay correct.
  Tensor v = t64({1, 2, 3, 4}, {4}).set_requires_grad(true);
  sum(narrow(v, 0, 1, 2) * 2.0).backward();
  check_close(v.grad(), {0, 2, 2, 0});
  Tensor first = v.grad();
  sum(v).backward();  // out of place: the gradient handed out before is unchanged
  check_close(v.grad(), {1, 3, 3, 1});
  check_close(first, {0, 2, 2, 0});
}

TEST_CASE("autograd::grad returns the gradients of leaves and non-leaves and accumulates nothing") {
  // y = sum(h * h) with h = 3 x: dy/dx = 18 x, dy/dh = 2 h = 6 x; w is used too (y2 = sum(w * x))
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor w = t64({5, 7}, {2}).set_requires_grad(true);
  Tensor unused = t64({1}, {1}).set_requires_grad(true);
  Tensor h = x * 3.0;
  Tensor y = sum(h * h) + sum(w * x);
  std::vector<Tensor> g = autograd::grad({y}, {x, h}, {}, /*retain_graph=*/true);
  check_close(g[0], {18 + 5, 36 + 7});
  check_close(g[1], {6, 12});
  CHECK_FALSE(x.grad().defined());  // nothing accumulated
  CHECK_FALSE(w.grad().defined());
  // weighted outputs: two roots, grad_outputs given for a non-scalar one
  Tensor z = h * 2.0;
  std::vector<Tensor> g2 = autograd::grad({y, z}, {x}, {Tensor(), t64({1, 10}, {2})}, true);
  check_close(g2[0], {23 + 6, 43 + 60});
  // the same graph still backpropagates (retained), and the result agrees
  y.backward(Tensor(), true);
  check_close(x.grad(), {23, 43});
  CHECK_THROWS_MSG(autograd::grad({y}, {unused}), AutogradError, "[grad] input 0", "received no gradient");
  std::vector<Tensor> g3 = autograd::grad({y}, {unused, x}, {}, true, /*allow_unused=*/true);
  CHECK_FALSE(g3[0].defined());
  check_close(g3[1], {23, 43});
  // an input given twice gets the same gradient twice, as torch.autograd.grad, in storage of its own
  std::vector<Tensor> g4 = autograd::grad({y}, {x, h, x}, {}, true);
  check_close(g4[0], {23, 43});
  check_close(g4[2], {23, 43});
  CHECK_FALSE(g4[0].shares_storage(g4[2]));
  CHECK_THROWS_MSG(autograd::grad({y}, {t64({1}, {1})}), AutogradError, "[grad] input 0", "does not require grad");
  CHECK_THROWS_MSG(autograd::grad({z}, {x}), AutogradError, "[grad] grad_output may be omitted only for a one-element");
  CHECK_THROWS_MSG(autograd::grad({y, z}, {x}, {Tensor()}), AutogradError, "[grad] 1 grad_outputs for 2 outputs");
  // without retain_graph the graph it ran is freed
  Tensor a = sum(exp(x));
  autograd::grad({a}, {x});
  CHECK_THROWS_MSG(a.backward(), AutogradError, "already freed by an earlier backward (or autograd::grad)");
}

TEST_CASE("autograd::grad: roots above roots, a root twice, outputs as inputs, and only the needed nodes run") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor s = sum(x * 3.0);  // 9
  Tensor y = s * s;         // 81, above s
  // d(y + s)/dx = (2 s + 1) * 3 = 57 each; the same root twice counts twice
  check_close(autograd::grad({y, s}, {x}, {}, true)[0], {57, 57});
  check_close(autograd::grad({s, s}, {x}, {}, true)[0], {6, 6});
  check_close(autograd::grad({y}, {s}, {}, true)[0], {18});  // a captured non-leaf above the leaf
  check_close(autograd::grad({s}, {s}, {}, true)[0], {1});   // an output as its own input
  Tensor c = t64({4}, {}).set_requires_grad(true);
  check_close(autograd::grad({c}, {c})[0], {1});  // a leaf output
  // the same tensor as grad_output and as result: the result is a copy (add passes its gradient on)
  Tensor v = t64({1, 10}, {2});
  Tensor u = x + x * 0.0;
  std::vector<Tensor> gu = autograd::grad({u}, {u}, {v}, true);
  CHECK_FALSE(gu[0].shares_storage(v));
  check_close(gu[0], {1, 10});
  // a branch that leads to no input does not run, so it is not freed: its own backward still works
  Tensor w = t64({0, 1}, {2}).set_requires_grad(true);
  Tensor z = sum(exp(w));
  Tensor total = sum(x * w) + z;
  check_close(autograd::grad({total}, {x})[0], {0, 1});
  z.backward();
  check_close(w.grad(), {1, std::exp(1.0)});
  CHECK_THROWS_MSG(autograd::grad({total}, {x}), AutogradError, "already freed");
  CHECK_THROWS_MSG(autograd::grad({sum(x * 2.0)}, {}), AutogradError, "[grad] no inputs given");
  CHECK_THROWS_MSG(autograd::grad({x * 2.0}, {x}), AutogradError, "grad_output may be omitted", "(output 0)");
}

TEST_CASE("retain_grad keeps a non-leaf's gradient, accumulated across backward passes") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor h = x * 3.0;
  autograd::retain_grad(h);
  autograd::retain_grad(x);  // a leaf: nothing to do
  Tensor y = sum(h * h);
  y.backward(Tensor(), true);
  check_close(h.grad(), {6, 12});
  check_close(x.grad(), {18, 36});
  y.backward();
  check_close(h.grad(), {12, 24});
  Tensor other = x * 2.0;  // not retained: no gradient kept
  sum(other).backward();
  CHECK_FALSE(other.grad().defined());
  CHECK_THROWS_MSG(autograd::retain_grad(t64({1}, {1})), AutogradError, "[retain_grad]", "does not require grad");
}

TEST_CASE("retain_graph allows a second backward - otherwise the graph is freed") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor y = sum(exp(x));
  y.backward(Tensor(), true);
  Tensor g1 = x.grad();
  y.backward();
  check_close(x.grad(), mul(g1, 2.0));
  CHECK_THROWS_MSG(y.backward(), AutogradError, "[backward]", "already freed", "retain_graph");
}

TEST_CASE("in-place change of a saved tensor is an error at backward time") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor h = x * 3.0;   // non-leaf
  Tensor y = sum(exp(h));  // exp saves its output, mul saves h? exp saves x=h and y
  Tensor hd = h.detach();
  fill_(hd, 0.0);  // same storage as h: bumps its version
  CHECK_THROWS_MSG(y.backward(), AutogradError, "[backward]", "exp", "modified in place");
  // autograd::grad names itself
  Tensor e2 = exp(x * 3.0);
  Tensor y2 = sum(e2);
  Tensor e2d = e2.detach();
  fill_(e2d, 0.0);
  CHECK_THROWS_MSG(autograd::grad({y2}, {x}), AutogradError, "[grad]", "exp", "modified in place");
}

TEST_CASE("an operand no requested gradient needs may change in place before the backward (PyTorch's rule)") {
  // mul, div and matmul saved both operands (and div its output) and refused the backward once any of
  // them changed, though the gradients asked for do not read it
  Tensor w = t64({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor x = t64({2, 2, 2}, {3});
  Tensor y = sum(mul(w, x));
  {
    NoGradGuard ng;
    add_(w, Tensor::ones({3}, kFloat64));  // dy/dw = x: w is not read
  }
  y.backward();
  check_close(w.grad(), {2, 2, 2}, 0);
  Tensor a = t64({1, 2, 3, 4}, {2, 2}).set_requires_grad(true), W = t64({1, 1, 1, 1}, {2, 2});
  Tensor z = sum(matmul(a, W));  // a's gradient reads W, not a
  Tensor frozen = t64({1, 2, 3, 4}, {2, 2});
  Tensor b = t64({1, 1, 1, 1}, {2, 2}).set_requires_grad(true);
  Tensor z2 = sum(matmul(frozen, b));  // dz2/db = frozen^T G: b is not read
  {
    NoGradGuard ng;
    mul_(b, 0.5);  // an optimizer step between the forward and the backward
  }
  z2.backward();
  check_close(b.grad(), {4, 4, 6, 6}, 0);
  z.backward();
  check_close(a.grad(), {2, 2, 2, 2}, 0);
  Tensor c = t64({1, 2}, {2}), v = t64({3, 4}, {2}).set_requires_grad(true);
  Tensor q = div(v, c);
  {
    NoGradGuard ng;
    mul_(q, 2.0);  // div's output: only b's gradient reads it
  }
  sum(q).backward();
  check_close(v.grad(), {1, 0.5}, 0);
  // what a requested gradient does read is still checked
  Tensor w2 = t64({1, 2}, {2}).set_requires_grad(true), x2 = t64({3, 4}, {2});
  Tensor y2 = sum(mul(w2, x2));
  {
    NoGradGuard ng;
    add_(x2, Tensor::ones({2}, kFloat64));
  }
  CHECK_THROWS_MSG(y2.backward(), AutogradError, "saved by 'mul'", "modified in place");
}

TEST_CASE("set_data of the same shape, dtype and device keeps the leaf's place in graphs recorded before it") {
  // It always dropped the leaf's accumulator: autograd::grad found no path from a graph recorded before
  // x.data = ..., and a graph recorded on both sides of it had two accumulators (a grad-accumulated hook ran
  // twice in one backward)
  Tensor x = t64({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor before = sum(mul(x, x));
  x.set_data(Tensor::full({3}, 5.0, kFloat64));
  Tensor after = sum(mul(x, 3.0));
  int calls = 0;
  autograd::add_grad_accumulated_hook(x, [&](const Tensor&) { ++calls; });
  add(before, after).backward(Tensor(), /*retain_graph=*/true);
  CHECK(calls == 1);
  check_close(x.grad(), {5, 7, 9}, 0);  // 2 x (as saved) + 3
  const std::vector<Tensor> g = autograd::grad({before}, {x});
  check_close(g[0], {2, 4, 6}, 0);
}

TEST_CASE("requires_grad on a non-leaf: asking again changes nothing, turning it off is refused") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor y = mul(x, 2.0);
  CHECK(y.set_requires_grad(true).requires_grad());  // was an AutogradError (PyTorch: a no-op)
  CHECK_THROWS_MSG(y.set_requires_grad(false), AutogradError, "[requires_grad]", "detach()");
}

TEST_CASE("a gradient set by hand holds no graph, and a tensor is not its own gradient") {
  Tensor w = t64({1, 2}, {2}).set_requires_grad(true);
  CHECK_THROWS_MSG(w.set_grad(w), ValueError, "[set_grad]", "its own gradient");
  w.set_grad(mul(w, 2.0));  // kept as given, its graph (whose accumulator holds w) held w: never freed
  CHECK(w.grad().is_leaf());
  CHECK_FALSE(w.grad().requires_grad());
  check_close(w.grad(), {2, 4}, 0);
  Tensor v = t64({3, 4}, {2}).set_requires_grad(true);
  w.set_grad(v);  // another leaf: its values, detached (it shares v's memory)
  CHECK_FALSE(w.grad().requires_grad());
  CHECK(w.grad().shares_storage(v));
}

TEST_CASE("a backward that fails part way: a second try names the failed pass") {
  // loss = sum(w * 2) + sum(exp(x)): the add node runs first and is freed, then exp's saved output was
  // modified. As in PyTorch the pass is not undone (w may already hold its gradient); the retry used to
  // blame "an earlier backward" as if one had succeeded, and tell the user to pass retain_graph.
  Tensor w = t64({1, 2}, {2}).set_requires_grad(true), x = t64({0.5, 1.5}, {2}).set_requires_grad(true);
  Tensor e = exp(x);
  Tensor loss = add(sum(mul(w, 2.0)), sum(e));
  Tensor ed = e.detach();
  fill_(ed, 0.0);
  CHECK_THROWS_MSG(loss.backward(), AutogradError, "[backward]", "exp", "modified in place");
  CHECK_THROWS_MSG(loss.backward(), AutogradError, "[backward]", "freed by an earlier backward",
                   "that failed", "run the forward again");
  CHECK_FALSE(x.grad().defined());
  // a pass that fails at its first node frees nothing: the graph is whole and refused for the same reason
  Tensor s = t64({0.5}, {}).set_requires_grad(true);
  Tensor e2 = exp(s);
  Tensor e2d = e2.detach();
  fill_(e2d, 1.0);
  CHECK_THROWS_MSG(e2.backward(), AutogradError, "modified in place");
  CHECK_THROWS_MSG(e2.backward(), AutogradError, "modified in place");
}

TEST_CASE("in-place ops on tensors that require grad are refused") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  CHECK_THROWS_MSG(fill_(x, 1.0), AutogradError, "[fill_]", "requires grad");
  {
    NoGradGuard ng;
    add_(x, t64({1, 1}, {2}), 2.0);
  }
  check_close(x, {3, 4});
  CHECK(x.version() == 1);
}

TEST_CASE("an in-place write of a value that requires grad is refused: its gradient would be lost") {
  // out[0] = w * 2 or acc += w dropped w's gradient without a word (in-place ops are not recorded).
  Tensor w = t64({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor out = Tensor::zeros({2, 3}, kFloat64), acc = Tensor::zeros({3}, kFloat64);
  Tensor row = narrow(out, 0, 0, 1);
  CHECK_THROWS_MSG(copy_(row, w * 2.0), AutogradError, "[copy_]", "the value written requires grad",
                   "gradient would be lost", "detach()");
  CHECK_THROWS_MSG(add_(acc, w), AutogradError, "[add_]", "the value written requires grad");
  CHECK(out.version() == 0);  // refused before writing
  CHECK(acc.version() == 0);
  // Its value alone: detach() says so; with grad recording off, nothing is recorded anyway.
  copy_(row, (w * 2.0).detach());
  {
    NoGradGuard ng;
    add_(acc, w);
  }
  check_close(out, {2, 4, 6, 0, 0, 0});
  check_close(acc, {1, 2, 3});
}

TEST_CASE("a leaf frozen after the forward gets no gradient") {
  // As in PyTorch: an optimizer would otherwise still move a parameter frozen before backward.
  Tensor w = t64({1, 2, 3}, {3}).set_requires_grad(true), v = t64({1, 1, 1}, {3}).set_requires_grad(true);
  Tensor loss = sum(w * w + v * w);
  w.set_requires_grad(false);
  loss.backward();
  CHECK_FALSE(w.grad().defined());
  check_close(v.grad(), {1, 2, 3});
}

TEST_CASE("freeing a long chain of recorded ops does not recurse") {
  // A running total kept with its history: 300k nested shared_ptr releases overflowed the stack
  // (SIGSEGV from about 150k on an 8 MiB stack).
  Tensor w = t64({1.0}, {1}).set_requires_grad(true);
  {
    Tensor total = Tensor::zeros({1}, kFloat64);
    for (int i = 0; i < 300000; ++i) total = total + w;
    CHECK(total.grad_fn() != nullptr);
  }  // the chain is freed here
  // Each step's input used twice (t + t, h + tanh(h)): two edges hold it, and the second must
  // still free it without recursing.
  {
    Tensor t = w * 1.0, h = w * 1.0;
    for (int i = 0; i < 150000; ++i) {
      t = t + t;
      h = h + tanh(h);
    }
  }
  // A chain a second tensor still shares is released only as far as it is not held.
  Tensor y = w * 1.0, z = y;
  for (int i = 0; i < 1000; ++i) z = z * 1.0;
  z = Tensor();
  CHECK(y.grad_fn() != nullptr);
  sum(y).backward();
  check_close(w.grad(), {1.0});
}

TEST_CASE("no-grad guard and detach stop recording") {
  Tensor x = t64({1}, {1}).set_requires_grad(true);
  {
    NoGradGuard ng;
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK_FALSE(grad_enabled());
  }
  CHECK(grad_enabled());
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.shares_storage(x));
  Tensor z = x * 2.0 + d;
  z.backward();
  check_close(x.grad(), {2});
}

TEST_CASE("gradients of non-differentiable outputs are errors, never zeros") {
  Tensor x = t64({3, 1, 2}, {3}).set_requires_grad(true);
  Tensor idx = argmax(x, 0);
  CHECK(idx.dtype() == kInt64);
  CHECK_FALSE(idx.requires_grad());
  CHECK_THROWS_MSG(idx.backward(), AutogradError, "[backward]", "int64", "not differentiable");
  Tensor c = t64({1}, {1});
  CHECK_THROWS_MSG(c.backward(), AutogradError, "[backward]", "does not require grad");
  Tensor y = x * 2.0;
  CHECK_THROWS_MSG(y.backward(), AutogradError, "[backward]", "one-element", "(3)");
  CHECK_THROWS_MSG(y.backward(t64({1, 1}, {2})), AutogradError, "[backward]", "(2)", "(3)");
  CHECK_THROWS_MSG(y.set_requires_grad(false), AutogradError, "[requires_grad]", "leaf");
}

TEST_CASE("gradients flow only to inputs that require them") {
  Tensor a = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor b = t64({3, 4}, {2});
  sum(a * b).backward();
  check_close(a.grad(), {3, 4});
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("graph node names expose the recorded ops") {
  Tensor a = leaf64({2, 2});
  Tensor y = sum(matmul(a, a));
  auto names = autograd::graph_node_names(y);
  std::set<std::string> s(names.begin(), names.end());
  CHECK(s.count("sum") == 1);
  CHECK(s.count("matmul") == 1);
  CHECK(s.count("accumulate_grad") == 1);
  for (const char* n : names)
    if (std::string(n) != "accumulate_grad") CHECK_MESSAGE(find_op(n), n, " is not in the op registry");
}

TEST_CASE("a deep chain backpropagates without recursion limits") {
  Tensor x = t64({1.0}, {1}).set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 20000; ++i) y = y * 1.0;
  sum(y).backward();
  check_close(x.grad(), {1.0});
}

TEST_CASE("backward: a node whose function throws frees nothing, and the graph runs again") {
  Tensor x = t64({1, 2}, {2}).set_requires_grad(true);
  Tensor h = x * 3.0;
  Tensor y = sum(h.detach());  // the root: a node that has not run before the failure
  auto fail = std::make_shared<bool>(true);
  autograd::record("flaky", {h}, y, [fail](const Tensor& g) -> std::vector<Tensor> {
    if (*fail) {
      *fail = false;
      throw ValueError("[flaky] failed once");
    }
    return {expand(g, {2})};
  });
  CHECK_THROWS_MSG(y.backward(), ValueError, "[flaky] failed once");
  y.backward();  // (the failed pass took the node's function and gave it back)
  check_close(x.grad(), {3, 3});
  CHECK_THROWS_MSG(y.backward(), AutogradError, "already freed");
}

TEST_CASE("gradcheck catches a wrong gradient and reports it") {
  // A deliberately wrong op: forward x^2, backward claims 3x.
  auto bad = [](const std::vector<Tensor>& in) {
    Tensor y = square(in[0].detach());
    Tensor out = y;
    if (in[0].requires_grad()) {
      autograd::SavedTensor sx(in[0]);
      autograd::record("square", {in[0]}, out, [sx](const Tensor& g) -> std::vector<Tensor> {
        return {mul(g, mul(sx.unpack("square"), 3.0))};
      });
    }
    return out;
  };
  GradcheckResult r = gradcheck(bad, {leaf64({3})});
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("analytic") != std::string::npos);
  CHECK(r.mode == "full-jacobian");
  // Large inputs switch to the weighted gradient and projections and still catch it.
  GradcheckResult r2 = gradcheck(bad, {leaf64({100, 50})});
  CHECK_FALSE(r2.ok);
  CHECK(r2.mode == "weighted-gradient+projections");
  GradcheckResult good = gradcheck([](const std::vector<Tensor>& in) { return square(in[0]); },
                                   {leaf64({100, 50})});
  CHECK_MESSAGE(good.ok, good.message);
}

TEST_CASE("gradcheck catches a backward that differs between runs, one that answers a zero gradient, and an f that reaches no input") {
  // y = 2 x with a backward that drifts by 1e-3 per call: the first analytic pass would agree with
  // the finite differences to 1e-3 only, so the repeat check is what must name it.
  auto calls = std::make_shared<int>(0);
  auto drifting = [calls](const std::vector<Tensor>& in) {
    Tensor out = mul(in[0].detach(), 2.0);
    autograd::record("drift", {in[0]}, out, [calls](const Tensor& g) -> std::vector<Tensor> {
      return {mul(g, 2.0 * (1.0 + 1e-3 * double((*calls)++)))};
    });
    return out;
  };
  const GradcheckResult r = gradcheck(drifting, {leaf64({3})});
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("[gradcheck] backward run twice gave different gradients for input 0") != std::string::npos);
  // A backward that adds a constant: right for no weighting, caught by the zero grad_output pass.
  auto offset = [](const std::vector<Tensor>& in) {
    Tensor out = mul(in[0].detach(), 2.0);
    autograd::record("offset", {in[0]}, out, [](const Tensor& g) -> std::vector<Tensor> { return {add(mul(g, 2.0), 1.0)}; });
    return out;
  };
  const GradcheckResult z = gradcheck(offset, {leaf64({3})});
  CHECK_FALSE(z.ok);
  CHECK(z.message.find("[gradcheck] a zero grad_output gave gradient 1 for input 0 at flat index 0") != std::string::npos);
  // With the zero-gradient pass off, the finite differences still see the constant (the pass names it first).
  GradcheckOptions loose;
  loose.check_zero_grad = false;
  CHECK_FALSE(gradcheck(offset, {leaf64({3})}, loose).ok);
  CHECK_THROWS_MSG(gradcheck([](const std::vector<Tensor>& in) { return mul(in[0].detach(), 2.0); }, {leaf64({3})}),
                   AutogradError, "[gradcheck] f's output does not depend on any input that requires grad");
}

TEST_CASE("the engine refuses a backward that returns the wrong number or shape of gradients, naming the node") {
  Tensor x = leaf64({3});
  Tensor y = sum(x.detach());
  autograd::record("too_many", {x}, y, [](const Tensor& g) -> std::vector<Tensor> {
    return {expand(g, {3}), expand(g, {3})};
  });
  CHECK_THROWS_MSG(y.backward(), AutogradError, "[backward] node 'too_many' returned 2 gradients for 1 inputs");
  Tensor y2 = sum(x.detach());
  autograd::record("wrong_shape", {x}, y2, [](const Tensor& g) -> std::vector<Tensor> { return {expand(g, {2})}; });
  CHECK_THROWS_MSG(y2.backward(), AutogradError,
                   "[backward] node 'wrong_shape' returned a gradient of shape (2) for input 0 of shape (3)");
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("gradcheck leaves the inputs' .grad as it found them") {
  // It runs backward into them: the caller's gradient was erased (torch's gradcheck keeps it).
  Tensor x = leaf64({3}), y = leaf64({2});
  x.set_grad(t64({7, 8, 9}, {3}));
  auto f = [](const std::vector<Tensor>& in) { return square(in[0]) * sum(in[1]); };
  CHECK(gradcheck(f, {x, y}).ok);
  check_close(x.grad(), {7, 8, 9});
  CHECK_FALSE(y.grad().defined());
}

TEST_CASE("gradcheck bad input") {
  auto f = [](const std::vector<Tensor>& in) { return in[0] * 2.0; };
  Tensor x32 = t32({1}, {1}).set_requires_grad(true);
  CHECK_THROWS_MSG(gradcheck(f, {x32}), DTypeError, "[gradcheck]", "float32", "float64");
  CHECK_THROWS_MSG(gradcheck(f, {t64({1}, {1})}), ValueError, "[gradcheck]", "no input requires grad");
  auto g32 = [](const std::vector<Tensor>& in) { return to(in[0], kFloat32); };
  CHECK_THROWS_MSG(gradcheck(g32, {leaf64({2})}), DTypeError, "[gradcheck]", "float64");
}

}
