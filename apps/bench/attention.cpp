// cf-bench attention (apps/bench/bench.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "nn/attention/centroid.h"
#include "nn/attention/chunked.h"

namespace cf::bench {

// ---- centroid attention (Centroid Transformers, eq. 4): N inputs -> M = N/4 centroids.
// It maps x (B, N, D) to (B, M, D) and builds its own queries, so it does not fit the
// (q, k, v) -> same-length Attention interface and is not in the registry. Its rows
// run the whole layer (mean-pooling init, K/V/Q/O projections, T = 1 step of eq. 4,
// with or without the KNN approximation, K = 40 as in section 3.2) on x (B, N, 256),
// and report the same fields and ratios against the full-attention row of the same
// N (which gets pre-projected q, k, v: the centroid rows include work full does not).
bool is_centroid_variant(const std::string& v) { return v == "centroid" || v == "centroid-knn"; }

// "full-dense": full attention with the (B, H, N, N) scores materialised
// (nn::dense_attention, what FullAttention ran before the fused kernel), so one
// run reports the fused kernel's time and memory against it.
bool is_full_dense(const std::string& v) { return v == "full-dense"; }
// "block": the gathered block attention alone (nn::chunked_attention, the fused
// block_attention kernel) for a fixed random order cut into k = sqrt(N) blocks,
// each block seeing itself and the one before (ClusterFormer eqs. 8-10 without
// the clustering): the computation apps/bench/peers.py writes in plain PyTorch.
bool is_block(const std::string& v) { return v == "block"; }
bool is_bench_only(const std::string& v) { return is_full_dense(v) || is_block(v); }

namespace {

// ---------------------------------------------------------------- attention
// physical_gib(), bench_attention_options(variant, n) and the dense memory guard
// live in apps/common/attention_bench.h, shared with cf-efficiency.


json bench_centroid_row(const BenchOptions& o, const std::string& variant, int64_t n, const cf::Tensor& x,
                        int64_t heads, int64_t reps, double full_fwd, double full_bwd) {
  cf::nn::CentroidAttentionOptions co;
  co.d_model = x.shape()[2];
  co.n_heads = heads;
  co.init = "mean";
  co.downsample = 4;
  co.iterations = 1;
  co.knn = variant == "centroid-knn" ? 40 : 0;
  cf::Generator gen(1);
  cf::nn::CentroidInit init(co, gen);
  cf::nn::CentroidAttention layer(co, gen);
  init.to(x.device());
  layer.to(x.device());
  json r;
  r["name"] = variant + "_" + std::to_string(n);
  r["params"] = {{"variant", variant}, {"n", n}, {"m", init.num_centroids(n)}, {"batch", x.shape()[0]},
                 {"heads", heads}, {"d_model", co.d_model}, {"knn", co.knn}, {"iterations", co.iterations},
                 {"init", co.init}, {"dtype", "float32"}, {"repeat", reps}};
  if (low_dtype(o)) r["params"]["autocast"] = dtype_label(o);  // float32 x and weights, 16-bit matmuls
  // The centroid layers have no causal form and no attention dropout: a row of other work would get a
  // ratio against a causal or dropout full row, so it says why it did not run.
  if (o.causal) {
    r["skipped"] = "[CentroidAttention] has no causal form (the centroids summarise the whole sequence): not run "
                   "under --causal";
    return r;
  }
  if (o.attention_dropout > 0) {
    r["skipped"] = "[CentroidAttention] has no attention dropout: not run under --attention-dropout";
    return r;
  }
  auto run = [&](const cf::Tensor& in) { return layer.forward(in, init.forward(in).u); };
  cf::Tensor out;
  cf::reset_peak_memory(g_device);
  double t_fwd = 0;
  {
    cf::NoGradGuard ng;
    // A part without a 16-bit path (--precision bf16|fp16) gives a skipped row (apps/common/precision.h).
    const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(low_dtype(o).has_value(), [&] {
      t_fwd = time_median(reps, [&] {
        out = cf::Tensor();
        out = run(x);
      });
    });
    if (no_16bit) {
      r["skipped"] = *no_16bit;
      return r;
    }
  }
  out = cf::Tensor();
  r["forward_time_s"] = t_fwd;
  r["forward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (full_fwd > 0) r["forward_ratio_vs_full"] = t_fwd / full_fwd;
  cf::Tensor xg = x.detach();
  xg.set_requires_grad(true);
  cf::reset_peak_memory(g_device);
  double t_bwd = 0;
  const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(low_dtype(o).has_value(), [&] {
    t_bwd = time_median(reps, [&] {
      xg.zero_grad();
      layer.zero_grad();
      cf::sum(run(xg)).backward();
    });
  });
  if (no_16bit) {
    r["backward_skipped"] = *no_16bit;
    return r;
  }
  r["forward_backward_time_s"] = t_bwd;
  r["forward_backward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (full_bwd > 0) r["forward_backward_ratio_vs_full"] = t_bwd / full_bwd;
  return r;
}

// The forward+backward time and peak bytes of one attention row (the inputs
// detached, requiring gradients).
template <class Forward, class Args>
void time_backward(json& r, const std::string& variant, int64_t reps, Forward& forward, Args& args,
                   const cf::Tensor& q, const cf::Tensor& k, const cf::Tensor& v, double& full_bwd) {
  cf::Tensor qg = q.detach(), kg = k.detach(), vg = v.detach();
  qg.set_requires_grad(true);
  kg.set_requires_grad(true);
  vg.set_requires_grad(true);
  cf::reset_peak_memory(g_device);
  double t_bwd = time_median(reps, [&] {
    qg.zero_grad();
    kg.zero_grad();
    vg.zero_grad();
    cf::sum(forward(args(qg, kg, vg))).backward();
  });
  r["forward_backward_time_s"] = t_bwd;
  r["forward_backward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (variant == "full") full_bwd = t_bwd;
  if (full_bwd > 0) r["forward_backward_ratio_vs_full"] = t_bwd / full_bwd;
}

// One row of cf-bench attention: `variant` on q, k, v (x: the layer input, for
// variants that cluster hidden states) at sequence length n, or the reason it
// was skipped. full_fwd / full_bwd: full attention's times at this n, once measured.
json attention_row(const BenchOptions& o, const std::string& variant, int64_t n, const cf::Tensor& q,
                   const cf::Tensor& k, const cf::Tensor& v, const cf::Tensor& x, double max_gib, double& full_fwd,
                   double& full_bwd) {
  const int64_t B = 1, H = 4, Dh = 64;
  cf::nn::AttentionSpec spec;
  spec.type = is_bench_only(variant) ? "full" : cf::apps::variant_type(variant);
  spec.d_model = H * Dh;
  spec.n_heads = H;
  nlohmann::json options = bench_attention_options(variant, n);
  // Attention-weight dropout in every variant (the modules are in training mode; the bench-only block row
  // passes the rate to chunked_attention itself).
  const bool drops = o.attention_dropout > 0;
  // (A variant's own "dropout=" override wins.)
  if (drops && !is_bench_only(variant) && !options.contains("dropout")) options["dropout"] = o.attention_dropout;
  spec.options = cf::nn::Config(options, "attention");
  std::shared_ptr<cf::nn::Attention> att = cf::nn::make_attention(spec);
  att->to(g_device);  // variants with parameters or buffers (neural clustering, routing, Cluster-Former)
  json r;
  r["name"] = variant + "_" + std::to_string(n);
  r["params"] = {{"variant", variant}, {"n", n}, {"batch", B}, {"heads", H}, {"head_dim", Dh},
                 {"causal", o.causal}, {"dtype", dtype_label(o)}, {"options", options}};
  if (drops)
    r["params"]["attention_dropout"] = is_bench_only(variant) ? o.attention_dropout : options["dropout"].get<double>();
  // A dense variant holds a few (B, H, N, N) float32 matrices: about 3 in the
  // forward, 6 with the backward. Skip rows that would not fit rather than swap.
  const double nn_gib = cf::apps::dense_scores_gib(B * H, n);
  const bool dense = cf::apps::is_dense_attention(variant);
  cf::Tensor members;
  if (is_block(variant)) {
    const int64_t blocks = std::max<int64_t>(1, std::llround(std::sqrt(double(n))));
    cf::Generator order_gen{uint64_t(n) + 7};
    cf::Tensor order = cf::argsort(cf::rand({B, 1, n}, cf::kFloat32, order_gen), -1);
    members = cf::nn::chunk_order(order, (n + blocks - 1) / blocks).to(g_device);
    r["params"]["blocks"] = members.shape()[2];
    r["params"]["block_size"] = members.shape()[3];
  }
  auto forward = [&](const cf::nn::AttentionArgs& a) {
    if (is_block(variant)) {
      cf::nn::ChunkedAttentionOptions co;
      co.look_back = 1;
      co.causal = a.causal;
      co.dropout = drops ? o.attention_dropout : 0.0;
      return cf::nn::chunked_attention(a.q, a.k, a.v, members, cf::Tensor(), co).out;
    }
    if (!is_full_dense(variant)) return att->forward(a);
    return cf::nn::dense_attention(a.q, a.k, a.v, cf::nn::dense_block_mask(a), 1.0 / std::sqrt(double(Dh)),
                                   drops ? o.attention_dropout : 0.0, drops);
  };
  auto args = [&](const cf::Tensor& qq, const cf::Tensor& kk, const cf::Tensor& vv) {
    cf::nn::AttentionArgs a;
    a.q = qq;
    a.k = att->shares_qk() ? qq : kk;  // shared-QK variants (LSH) take the queries as keys
    a.v = vv;
    a.query_input = x;
    a.causal = o.causal;
    return a;
  };
  const int64_t reps = o.repeat > 0 ? o.repeat : (n >= 8192 ? 1 : 3);
  r["params"]["repeat"] = reps;
  if (dense && 3 * nn_gib > max_gib) {
    r["skipped"] = "forward needs about " + std::to_string(3 * nn_gib) + " GiB > --max-gib";
    return r;
  }
  cf::Tensor out;
  cf::reset_peak_memory(g_device);
  double t_fwd;
  {
    cf::NoGradGuard ng;
    // A variant that refuses these arguments (plain clustered attention takes no
    // causal mask) gets a row that says so; the other variants still run.
    // A variant without 16-bit kernels yet (--precision bf16|fp16) is skipped the same way
    // (apps/common/precision.h, shared with cf-efficiency).
    try {
      const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(low_dtype(o).has_value(), [&] {
        t_fwd = time_median(reps, [&] {
          out = cf::Tensor();
          out = forward(args(q, k, v));
        });
      });
      if (no_16bit) {
        r["skipped"] = *no_16bit;
        return r;
      }
    } catch (const cf::NotImplementedError& e) {
      r["skipped"] = e.what();
      return r;
    }
  }
  out = cf::Tensor();
  r["forward_time_s"] = t_fwd;
  r["forward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (variant == "full") full_fwd = t_fwd;
  if (full_fwd > 0) r["forward_ratio_vs_full"] = t_fwd / full_fwd;
  if (dense && 6 * nn_gib > max_gib) {
    r["backward_skipped"] = "forward+backward needs about " + std::to_string(6 * nn_gib) + " GiB > --max-gib";
    return r;
  }
  const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(
      low_dtype(o).has_value(), [&] { time_backward(r, variant, reps, forward, args, q, k, v, full_bwd); });
  if (no_16bit) r["backward_skipped"] = *no_16bit;
  return r;
}

}  // namespace

json bench_attention(const BenchOptions& o) {
  const int64_t B = 1, H = 4, Dh = 64;
  const std::vector<int64_t>& sizes = o.sizes;
  const double max_gib = o.max_gib > 0 ? o.max_gib : cf::apps::physical_gib() / 2;
  json rows = json::array();
  for (int64_t n : sizes) {
    cf::Generator gen{uint64_t(n)};
    cf::Tensor q = cf::randn({B, H, n, Dh}, cf::kFloat32, gen).to(g_device),
               k = cf::randn({B, H, n, Dh}, cf::kFloat32, gen).to(g_device),
               v = cf::randn({B, H, n, Dh}, cf::kFloat32, gen).to(g_device);
    // The layer input before projection, for variants that cluster hidden states.
    cf::Tensor x = cf::randn({B, n, H * Dh}, cf::kFloat32, gen).to(g_device);
    const std::optional<cf::DType> low = low_dtype(o);
    if (low) {  // 16-bit q, k, v; the attention runs under autocast (softmax statistics in float32)
      q = cf::to(q, *low);
      k = cf::to(k, *low);
      v = cf::to(v, *low);
    }
    cf::AutocastGuard autocast(low);
    double full_fwd = -1, full_bwd = -1;
    for (const std::string& variant : o.variants) {
      if (is_centroid_variant(variant)) {
        rows.push_back(bench_centroid_row(o, variant, n, x, H, o.repeat > 0 ? o.repeat : (n >= 8192 ? 1 : 3), full_fwd,
                                          full_bwd));
        continue;
      }
      rows.push_back(attention_row(o, variant, n, q, k, v, x, max_gib, full_fwd, full_bwd));
    }
  }
  return report("attention", rows);
}

}  // namespace cf::bench
