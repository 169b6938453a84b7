// cf-bench overhead (apps/bench/bench.h).
#include <algorithm>
#include <functional>
#include <vector>

#include "bench/bench.h"

namespace cf::bench {

namespace {

// ---------------------------------------------------------------- overhead
// ns per call of f, median over `samples` samples of `iters` calls each.
double ns_per_call(int64_t samples, int64_t iters, const std::function<void()>& f) {
  for (int64_t i = 0; i < std::min<int64_t>(iters, 1000); ++i) f();  // warm up
  device_sync();
  std::vector<double> ns;
  for (int64_t s = 0; s < samples; ++s) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) f();
    device_sync();
    ns.push_back(seconds_since(t0) * 1e9 / double(iters));
  }
  return median(ns);
}

}  // namespace

json bench_overhead(const BenchOptions& o) {
  int64_t samples = o.repeat > 0 ? o.repeat : 201;
  json rows = json::array();
  const cf::Device dev = g_device;
  cf::Tensor a = cf::Tensor::ones({1}, cf::kFloat32, dev);
  cf::Tensor b = cf::Tensor::ones({1}, cf::kFloat32, dev);
  cf::Tensor ag = cf::Tensor::ones({1}, cf::kFloat32, dev);
  ag.set_requires_grad(true);

  auto row = [&](const char* name, const char* desc, double ns, int64_t ops, int64_t iters) {
    json r;
    r["name"] = name;
    r["params"] = {{"what", desc}, {"numel", 1}, {"dtype", "float32"},
                   {"ops_per_iter", ops}, {"iters_per_sample", iters}, {"samples", samples}};
    r["ns_per_iter"] = ns;
    r["ns_per_op"] = ns / double(ops);
    return r;
  };

  cf::reset_peak_memory(dev);
  double t_plain = ns_per_call(samples, o.iters, [&] { cf::Tensor c = cf::add(a, b); });
  json r0 = row("add_no_autograd", "add of two 1-element tensors, no input requires grad", t_plain, 1, o.iters);
  r0["peak_bytes"] = cf::memory_stats(dev).peak_bytes;
  rows.push_back(r0);

  cf::reset_peak_memory(dev);
  double t_grad = ns_per_call(samples, o.iters, [&] { cf::Tensor c = cf::add(ag, b); });
  json r1 = row("add_autograd", "add recording a graph node (first input requires grad)", t_grad, 1, o.iters);
  r1["peak_bytes"] = cf::memory_stats(dev).peak_bytes;
  r1["ratio_vs_no_autograd"] = t_grad / t_plain;
  rows.push_back(r1);

  cf::Tensor x = cf::Tensor::full({1}, 0.5, cf::kFloat32, dev);
  x.set_requires_grad(true);
  cf::Tensor w = cf::Tensor::full({1}, 1.5, cf::kFloat32, dev);
  cf::reset_peak_memory(dev);
  const int64_t chain_iters = std::max<int64_t>(1, o.iters / 4);
  double t_chain = ns_per_call(samples, chain_iters, [&] {
    cf::Tensor loss = cf::sum(cf::tanh(cf::mul(x, w)));
    loss.backward();
    x.zero_grad();
  });
  json r2 = row("chain3_forward_backward",
                "loss = sum(tanh(x * w)) on 1 element, loss.backward(), x.zero_grad()", t_chain, 3,
                chain_iters);
  r2["peak_bytes"] = cf::memory_stats(dev).peak_bytes;
  rows.push_back(r2);

  double t_chain_fwd;
  {
    cf::NoGradGuard ng;
    t_chain_fwd = ns_per_call(samples, o.iters,
                              [&] { cf::Tensor l = cf::sum(cf::tanh(cf::mul(x, w))); });
  }
  json r3 = row("chain3_forward_no_grad", "the same 3-op forward under NoGradGuard", t_chain_fwd, 3, o.iters);
  rows.push_back(r3);
  rows.back()["ratio_vs_forward_backward"] = t_chain_fwd / t_chain;
  return report("overhead", rows);
}

}  // namespace cf::bench
