// Engine hooks (autograd/hooks.h): grad-accumulated hooks and end-of-backward callbacks.
#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_CASE("hooks: a grad-accumulated hook sees the new total, once per backward, in order") {
  Tensor w = leaf64({3}, 1);
  Tensor v = leaf64({3}, 2);
  std::vector<std::string> seen;
  std::vector<double> totals;
  int64_t h1 = autograd::add_grad_accumulated_hook(w, [&](const Tensor& t) {
    CHECK(t.is_same(w));
    seen.push_back("w1");
    totals.push_back(sum(t.grad()).item());
  });
  int64_t h2 = autograd::add_grad_accumulated_hook(w, [&](const Tensor&) { seen.push_back("w2"); });
  int callbacks = 0;
  int64_t h3 = autograd::add_grad_accumulated_hook(v, [&](const Tensor&) {
    seen.push_back("v");
    autograd::queue_callback([&] {
      ++callbacks;
      CHECK(w.grad().defined());  // the whole graph is done when callbacks run
    });
  });
  // w reaches the loss along two paths: still one hook call with the summed gradient.
  Tensor loss = sum(mul(w, v) + w);
  loss.backward();
  CHECK(callbacks == 1);
  CHECK(std::count(seen.begin(), seen.end(), "w1") == 1);
  auto i1 = std::find(seen.begin(), seen.end(), "w1"), i2 = std::find(seen.begin(), seen.end(), "w2");
  CHECK(i1 < i2);
  CHECK(totals.back() == doctest::Approx(sum(v).item() + 3.0));
  // Accumulation across backward calls: the hook sees the running total.
  sum(w).backward();
  CHECK(totals.back() == doctest::Approx(sum(v).item() + 6.0));
  autograd::remove_grad_hook(h1);
  autograd::remove_grad_hook(h2);
  autograd::remove_grad_hook(h3);
  seen.clear();
  sum(mul(w, v)).backward();
  CHECK(seen.empty());
}

TEST_CASE("hooks: a hook whose leaf died is dropped with its closure at the next registration") {
  // the table held every closure (and what it captured) until remove_grad_hook: a leak
  auto captured = std::make_shared<int>(0);
  {
    Tensor x = leaf64({2}, 3);
    autograd::add_grad_accumulated_hook(x, [captured](const Tensor&) { ++*captured; });
    sum(x * 2.0).backward();
  }
  CHECK(*captured == 1);
  CHECK(captured.use_count() == 2);  // the dead leaf's hook still holds it
  Tensor y = leaf64({2}, 4);
  const int64_t id = autograd::add_grad_accumulated_hook(y, [](const Tensor&) {});
  CHECK(captured.use_count() == 1);
  autograd::remove_grad_hook(id);
}

TEST_CASE("hooks: bad input") {
  Tensor x = leaf64({2}, 1);
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_MSG(autograd::add_grad_accumulated_hook(y, [](const Tensor&) {}), AutogradError,
                   "[add_grad_accumulated_hook]", "not a leaf");
  CHECK_THROWS_MSG(autograd::add_grad_accumulated_hook(Tensor::zeros({2}), [](const Tensor&) {}), AutogradError,
                   "requires grad");
  CHECK_THROWS_MSG(autograd::queue_callback([] {}), AutogradError, "[queue_callback]", "inside backward");
  autograd::remove_grad_hook(123456789);  // unknown id: nothing happens
}
