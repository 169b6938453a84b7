// Consumer smoke test: build a tensor, run a backward, print, check.
// y = sum(tanh(x) * x) for x = [0.5, -1, 2]; dy/dx = tanh(x) + x * (1 - tanh(x)^2).
#include <cf.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::vector<double> xs = {0.5, -1.0, 2.0};
  cf::Tensor x = cf::Tensor::from_vector(xs, {3});
  x.set_requires_grad(true);
  cf::Tensor y = cf::sum(cf::tanh(x) * x);
  y.backward();
  std::vector<double> g = x.grad().to_vector<double>();

  double want_y = 0;
  bool ok = true;
  for (size_t i = 0; i < xs.size(); ++i) {
    double t = std::tanh(xs[i]);
    want_y += t * xs[i];
    double want_g = t + xs[i] * (1 - t * t);
    std::printf("dy/dx[%zu] = %.6f (want %.6f)\n", i, g[i], want_g);
    ok = ok && std::fabs(g[i] - want_g) < 1e-9;
  }
  std::printf("y = %.6f (want %.6f)\n", y.item(), want_y);
  ok = ok && std::fabs(y.item() - want_y) < 1e-9;
  std::printf("%s\n", ok ? "consumer: OK" : "consumer: WRONG");
  return ok ? 0 : 1;
}
