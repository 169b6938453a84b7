// cf-bench cpu-isa (apps/bench/bench.h): the CPU instruction tiers of the row helpers
// (kernels/common/cpu_isa.h) timed against the baseline (SSE2) tier in one run, on the kernels
// that use them: softmax over float32 rows and flash attention forward + backward at the
// cf-approx per-token model's head shape (4 heads of 16), improved clustered attention's sparse
// products (32 keys per query), LSH-style gathered block attention (its score mask) and dropout.
// Each tier must give the baseline's bits.
#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops/attention.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/sparse.h"
#include "bench/bench.h"
#include "kernels/common/cpu_isa.h"

namespace cf::bench {

namespace {

using cf::kernels::CpuIsa;

std::vector<CpuIsa> tiers_run_here() {
  std::vector<CpuIsa> t;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (cf::kernels::cpu_isa_runs(isa)) t.push_back(isa);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One case timed at every tier: rows named <name>_<tier>, each with ratio_vs_baseline and
// same_bits_as_baseline. run() computes (timed); values() flattens what the last run() computed, for
// the bit check only (untimed: copying the outputs out cost as much as the avx512 softmax itself and
// pulled every ratio towards 1).
void tier_rows(json& rows, const std::string& name, const json& params, int64_t reps, const std::function<void()>& run,
               const std::function<std::vector<float>()>& values) {
  double t_base = 0;
  std::vector<float> base;
  for (CpuIsa isa : tiers_run_here()) {
    cf::kernels::set_cpu_isa(isa);
    const double t = time_median(reps, run);
    run();
    const std::vector<float> got = values();
    if (isa == CpuIsa::kBaseline) {
      t_base = t;
      base = got;
    }
    json r;
    r["name"] = name + "_" + cf::kernels::cpu_isa_name(isa);
    r["params"] = params;
    r["params"]["cpu_isa"] = cf::kernels::cpu_isa_name(isa);
    r["params"]["repeat"] = reps;
    r["time_s"] = t;
    r["ratio_vs_baseline"] = t_base / t;
    r["same_bits_as_baseline"] = same_bits(got, base);
    rows.push_back(r);
  }
}

}  // namespace

json bench_cpu_isa(const BenchOptions& o) {
  if (!g_device.is_cpu()) throw cf::ValueError("[cf-bench cpu-isa] measures the CPU kernels only");
  const CpuIsa before = cf::kernels::cpu_isa();
  const int64_t reps = o.repeat > 0 ? o.repeat : 5;
  json rows = json::array();
  for (int64_t n : o.sizes) {
    cf::Generator gen{uint64_t(n)};
    // softmax: 3,276,800 scores in rows of n (the per-token model's 16 x 4 x 512 x 100 at n = 100)
    const cf::Tensor x = cf::randn({std::max<int64_t>(1, 3276800 / n), n}, cf::kFloat32, gen);
    cf::Tensor y;
    auto y_values = [&] { return y.to_vector<float>(); };
    tier_rows(rows, "softmax_n" + std::to_string(n), {{"rows", x.shape()[0]}, {"n", n}, {"dtype", "float32"}},
              reps, [&] { y = cf::softmax(x, -1); }, y_values);
    // flash attention forward + backward: B x 4 heads x n x 16, B n = 8192 tokens
    const int64_t B = std::max<int64_t>(1, 8192 / n), H = 4, D = 16;
    auto leaf = [&] {
      cf::Tensor t = cf::randn({B, H, n, D}, cf::kFloat32, gen);
      t.set_requires_grad(true);
      return t;
    };
    const cf::Tensor q = leaf(), k = leaf(), v = leaf();
    const cf::Tensor w = cf::randn({B, H, n, D}, cf::kFloat32, gen);
    // the output and the gradients of the last run, flattened
    auto with_grads = [](const std::vector<cf::Tensor>& outs, const std::vector<const cf::Tensor*>& leaves) {
      std::vector<float> all;
      for (const cf::Tensor& t : outs) {
        const std::vector<float> v = t.to_vector<float>();
        all.insert(all.end(), v.begin(), v.end());
      }
      for (const cf::Tensor* t : leaves) {
        const std::vector<float> g = t->grad().to_vector<float>();
        all.insert(all.end(), g.begin(), g.end());
      }
      return all;
    };
    cf::Tensor out;
    tier_rows(
        rows, "flash_attention_fwd_bwd_n" + std::to_string(n),
        {{"batch", B}, {"heads", H}, {"n", n}, {"head_size", D}, {"dtype", "float32"}}, reps,
        [&] {
          for (const cf::Tensor* t : {&q, &k, &v}) t->zero_grad();
          out = cf::flash_attention(q, k, v);
          cf::sum(out * w).backward();
        },
        [&] { return with_grads({out}, {&q, &k, &v}); });
    // improved clustered attention's sparse products (eq. 11's top-k terms), forward + backward:
    // 32 keys per query, the per-token model's 4 heads of 16, B n = 8192 tokens
    const int64_t G = B * H, K = std::min<int64_t>(32, n);
    cf::Tensor qs = cf::randn({G, n, D}, cf::kFloat32, gen), ks = cf::randn({G, n, D}, cf::kFloat32, gen);
    cf::Tensor ws = cf::randn({G, n, K}, cf::kFloat32, gen);
    const cf::Tensor idx = cf::randint(0, n, {G, n, K}, gen);
    for (cf::Tensor* t : {&qs, &ks, &ws}) t->set_requires_grad(true);
    cf::Tensor sc, so;
    tier_rows(
        rows, "sparse_products_fwd_bwd_n" + std::to_string(n),
        {{"groups", G}, {"n", n}, {"keys_per_query", K}, {"head_size", D}, {"dtype", "float32"}}, reps,
        [&] {
          for (const cf::Tensor* t : {&qs, &ks, &ws}) t->zero_grad();
          sc = cf::sparse_dot(qs, ks, idx);
          so = cf::sparse_weighted_sum(ws, ks, idx);
          (cf::sum(sc * sc) + cf::sum(so * so)).backward();
        },
        [&] { return with_grads({sc, so}, {&qs, &ks, &ws}); });
    // gathered block attention forward + backward as LSH attention runs it: the queries are the
    // keys, chunks of 32 tokens in a random order, each seeing itself and the chunk before, the
    // query's own key under the Reformer rule, causal by position (the mask's causal and own-key
    // cases; padded keys and empty slots are left to the kernel tests)
    if (n % 32 == 0) {
      const cf::Tensor order = cf::argsort(cf::rand({B, H, n}, cf::kFloat32, gen), -1);
      const cf::Tensor members = cf::reshape(order, {B, H, n / 32, 32});
      cf::BlockAttentionOptions bo;
      bo.look_back = 1;
      bo.self_mask = true;
      bo.causal = true;
      tier_rows(
          rows, "block_attention_fwd_bwd_n" + std::to_string(n),
          {{"batch", B}, {"heads", H}, {"n", n}, {"head_size", D}, {"chunk", 32}, {"look_back", 1},
           {"self_mask", true}, {"causal", true}, {"dtype", "float32"}},
          reps,
          [&] {
            for (const cf::Tensor* t : {&q, &v}) t->zero_grad();
            out = cf::block_attention(q, q, v, members, cf::Tensor(), bo).out;
            cf::sum(out * w).backward();
          },
          [&] { return with_grads({out}, {&q, &v}); });
    }
    // dropout (p = 0.1) of the softmax case's 3,276,800 floats: its forward (the backward reruns it)
    tier_rows(
        rows, "dropout_n" + std::to_string(n), {{"elements", x.numel()}, {"p", 0.1}, {"dtype", "float32"}}, reps,
        [&] {
          cf::Generator dg{7};  // the same masks at every tier
          y = cf::dropout(x, 0.1, true, dg);
        },
        y_values);
  }
  cf::kernels::set_cpu_isa(before);
  return report("cpu-isa", rows);
}

}  // namespace cf::bench
