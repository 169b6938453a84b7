// cf-bench allreduce and ddp: run under mpirun (README "Distributed"). Every
// rank runs the same timed loops; the ranks start each sample together at a
// barrier and rank 0's time is reported (a collective ends on every rank within
// about one message latency of the others). Rank 0 prints the JSON.
#include "bench/dist_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#ifdef CF_BENCH_MPI
#include <mpi.h>
#endif

#include "common/attention_bench.h"

namespace cf::bench {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// Median seconds per call over `reps` samples of `iters` calls, ranks aligned at a barrier.
double timed(int64_t reps, int64_t iters, const std::function<void()>& f) {
  f();  // warm up (buffers, connections)
  std::vector<double> t;
  for (int64_t r = 0; r < reps; ++r) {
    cf::dist::barrier();
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) f();
    t.push_back(since(t0) / double(iters));
  }
  return cf::apps::median(t);
}
}  // namespace

nlohmann::json allreduce_rows(const std::vector<int64_t>& sizes_bytes, int64_t repeat) {
#ifndef CF_BENCH_MPI
  throw cf::dist::DistError("[cf-bench allreduce] cf-bench was built without MPI (CF_MPI=OFF or no libopenmpi-dev)");
#else
  const int W = cf::dist::world_size();
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes : sizes_bytes) {
    const int64_t n = std::max<int64_t>(1, bytes / 4);
    cf::Tensor t = cf::Tensor::ones({n}, cf::kFloat32);
    // Enough calls per sample for ~1 ms of small messages.
    const int64_t iters = std::max<int64_t>(1, std::min<int64_t>(200, (1 << 22) / std::max<int64_t>(bytes, 1)));
    const int64_t reps = repeat > 0 ? repeat : 7;
    const bool check = cf::dist::check_enabled();
    cf::dist::set_check(true);
    const double t_cf = timed(reps, iters, [&] { cf::dist::all_reduce(t, cf::dist::ReduceOp::sum); });
    cf::dist::set_check(false);
    const double t_nocheck = timed(reps, iters, [&] { cf::dist::all_reduce(t, cf::dist::ReduceOp::sum); });
    cf::dist::set_check(check);
    float* p = t.data<float>();
    const double t_mpi = timed(reps, iters, [&] {
      MPI_Allreduce(MPI_IN_PLACE, p, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    nlohmann::json r;
    r["name"] = "allreduce_" + std::to_string(n * 4) + "B";
    r["params"] = {{"bytes", n * 4}, {"dtype", "float32"}, {"op", "sum"}, {"processes", W},
                   {"calls_per_sample", iters}, {"repeat", reps}, {"backend", cf::dist::backend_name()}};
    // Algorithm bandwidth (message bytes per second) and bus bandwidth, the
    // ring all-reduce's per-link traffic 2 (W - 1) / W of it (NCCL's convention).
    auto put = [&](const std::string& key, double s) {
      r[key + "_time_s"] = s;
      r[key + "_gbps"] = double(n * 4) / s * 1e-9;
      r[key + "_bus_gbps"] = double(n * 4) / s * 1e-9 * 2.0 * double(W - 1) / double(W);
    };
    put("cf", t_cf);
    put("cf_nocheck", t_nocheck);
    put("mpi", t_mpi);
    r["ratio_vs_mpi"] = t_mpi / t_cf;
    r["nocheck_ratio_vs_mpi"] = t_mpi / t_nocheck;
    rows.push_back(r);
  }
  return rows;
#endif
}

nlohmann::json ddp_rows(const DdpBenchOptions& o) {
  const int W = cf::dist::world_size(), R = cf::dist::rank();
  nlohmann::json rows = nlohmann::json::array();
  if (o.batch_size % W != 0)
    throw cf::ValueError("[cf-bench ddp] --batch-size " + std::to_string(o.batch_size) +
                         " must be a multiple of the number of processes " + std::to_string(W));
  const int64_t reps = o.repeat > 0 ? o.repeat : 5;
  for (const std::string& variant : o.variants) {
    for (int64_t n : o.sizes) {
      nlohmann::json mj = {{"vocab_size", 1000}, {"max_len", n},   {"n_layers", 2},  {"d_model", o.d_model},
                           {"n_heads", 4},       {"d_ff", 4 * o.d_model}, {"dropout", 0.0}, {"num_classes", 4},
                           {"attention", {{"type", cf::apps::variant_type(variant)}}}};
      if (cf::apps::variant_type(variant) == "neural-clustering")
        mj["attention"]["clusters"] = std::max<int64_t>(1, int64_t(std::sqrt(double(n))));
      const nlohmann::json overrides = cf::apps::variant_overrides(variant);  // "type:key=value" (attention_bench.h)
      for (auto& [key, value] : overrides.items()) mj["attention"][key] = value;
      auto cfg = cf::models::TransformerConfig::from_json(mj);
      cf::Generator g(1);
      auto model = std::make_shared<cf::models::EncoderClassifier>(cfg, g);
      cf::Generator data(2);
      const int64_t B = o.batch_size, b = B / W;
      cf::Tensor ids = cf::randint(1, 1000, {B, n}, data), y = cf::randint(0, 4, {B}, data);
      cf::Tensor my_ids = cf::contiguous(cf::narrow(ids, 0, R * b, b)), my_y = cf::contiguous(cf::narrow(y, 0, R * b, b));
      cf::nn::AdamW opt(model->named_parameters(), {});
      auto step = [&](const cf::Tensor& x, const cf::Tensor& t) {
        opt.zero_grad();
        cf::nn::AuxLosses aux;
        cf::Tensor loss = cf::nn::cross_entropy(model->forward(x, {}, &aux), t);
        if (!aux.empty()) {
          std::map<std::string, double> w;
          for (const std::string& name : aux.names()) w[name] = 0.01;
          loss = loss + aux.total(w);
        }
        loss.backward();
        opt.step();
      };
      // One process on the whole batch: rank 0 alone, the others wait at the barrier.
      double t_one = 0;
      {
        std::vector<double> t;
        if (R == 0) step(ids, y);
        for (int64_t r = 0; r < reps; ++r) {
          cf::dist::barrier();
          if (R == 0) {
            auto t0 = Clock::now();
            step(ids, y);
            t.push_back(since(t0));
          }
        }
        cf::dist::barrier();
        t_one = R == 0 ? cf::apps::median(t) : 0;
      }
      cf::nn::DistributedDataParallel ddp(model);
      // W processes on B / W each, with gradient all-reduce; and without it (no_sync):
      // the difference is what communication costs beyond overlap.
      const double t_ddp = timed(reps, 1, [&] { step(my_ids, my_y); });
      double t_local = 0;
      {
        auto guard = ddp.no_sync();
        t_local = timed(reps, 1, [&] { step(my_ids, my_y); });
      }
      nlohmann::json r;
      r["name"] = "ddp_" + variant + "_n" + std::to_string(n);
      r["params"] = {{"variant", variant}, {"n", n}, {"global_batch", B}, {"processes", W},
                     {"d_model", o.d_model}, {"layers", 2}, {"parameters", model->num_parameters()},
                     {"gradient_bytes", model->num_parameters() * 4}, {"buckets", ddp.num_buckets()},
                     {"repeat", reps}};
      r["one_process_step_time_s"] = t_one;
      r["ddp_step_time_s"] = t_ddp;
      r["ddp_no_sync_step_time_s"] = t_local;
      r["one_process_tokens_per_s"] = double(B * n) / t_one;
      r["ddp_tokens_per_s"] = double(B * n) / t_ddp;
      // Strong scaling of the step on a fixed global batch: speedup / W.
      r["scaling_efficiency"] = t_one / (double(W) * t_ddp);
      r["ratio_vs_one_process"] = t_one / t_ddp;
      r["communication_fraction"] = std::max(0.0, (t_ddp - t_local) / t_ddp);
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace cf::bench
