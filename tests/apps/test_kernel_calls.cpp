// Kernel calls per training step (core/kernel_calls.h): on the GPU each is a launch, and a small
// step's time is its launches (issue 25: every efficient attention within 1.5x of full
// attention's step at N = 512). The CPU's count is the same mechanism's, so the budget is guarded
// here, without a GPU, on cf-bench model's encoder (apps/common/attention_bench.h).
#include <string>
#include <utility>
#include <vector>

#include "common/attention_bench.h"
#include "test_util.h"

using namespace cf;

namespace {

// A small encoder of cf-bench model's kind.
cf::apps::EncoderBenchConfig small_encoder(const std::string& variant, int64_t n) {
  cf::apps::EncoderBenchConfig c;
  c.variant = variant;
  c.n = n;
  c.batch = 2;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.vocab = 50;
  c.seed = 3;
  return c;
}

// Kernel calls of one training step after two warm-up steps (the optimizer's state is made in the first).
int64_t train_step_calls(const std::string& variant) {
  cf::apps::EncoderBench bench(small_encoder(variant, 64));
  return bench.measure_train(2, 2).kernel_calls;
}

}  // namespace

TEST_CASE("kernel calls: a step's count is counted on the CPU and repeats step after step") {
  cf::apps::EncoderBench bench(small_encoder("full", 16));
  bench.train_step();
  const KernelCalls a = kernel_calls();
  bench.train_step();
  const KernelCalls b = kernel_calls();
  bench.train_step();
  const KernelCalls d = kernel_calls() - b;
  CHECK((b - a).cpu > 0);
  CHECK(d.cpu == (b - a).cpu);
  CHECK(d.cuda == 0);
}

TEST_CASE("kernel calls: neural clustering's training step stays within 1.5x of full attention's") {
  // Issue 25's bound on the step's time, taken for its launches. The fused losses (eqs. 6 and 11), the aux
  // total's products and the shared number constants took the count from 1.74x to 1.36x (N = 512); an
  // unfused composition creeping back shows here before a GPU sees it.
  const int64_t full = train_step_calls("full"), nc = train_step_calls("neural-clustering");
  INFO("full ", full, ", neural clustering ", nc);
  CHECK(full > 100);
  CHECK(double(nc) <= 1.5 * double(full));
}

TEST_CASE("kernel calls: every registered variant's training step within its budget over full attention's") {
  // Issue 25's bound is 1.5x for every variant (on this encoder at stop 80: neural clustering 1.41,
  // clustered 1.46, LSH 1.08, Cluster-Former 1.40, fixed sparse 1.22; at stop 81 improved clustered with
  // cluster_means and cluster_topk_attention, routing with the routed lists' token-order steps fused).
  const int64_t full = train_step_calls("full");
  const std::vector<std::pair<std::string, double>> budget = {
      {"neural-clustering", 1.5}, {"clustered", 1.5},         {"lsh", 1.5},     {"cluster-former", 1.5},
      {"sparse", 1.5},            {"improved-clustered", 1.5}, {"routing", 1.5}};
  for (const auto& [variant, bound] : budget) {
    const int64_t calls = train_step_calls(variant);
    INFO(variant, ": ", calls, " calls, full ", full, ", ratio ", double(calls) / double(full));
    CHECK(double(calls) <= bound * double(full));
  }
}

