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

TEST_CASE("gradcheck bad input") {
  auto f = [](const std::vector<Tensor>& in) { return in[0] * 2.0; };
  Tensor x32 = t32({1}, {1}).set_requires_grad(true);
  CHECK_THROWS_MSG(gradcheck(f, {x32}), DTypeError, "[gradcheck]", "float32", "float64");
  CHECK_THROWS_MSG(gradcheck(f, {t64({1}, {1})}), ValueError, "[gradcheck]", "no input requires grad");
  auto g32 = [](const std::vector<Tensor>& in) { return to(in[0], kFloat32); };
  CHECK_THROWS_MSG(gradcheck(g32, {leaf64({2})}), DTypeError, "[gradcheck]", "float64");
}

}
