// cf-bench kmeans (apps/bench/bench.h).
#include <algorithm>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "kernels/kmeans/kmeans.h"
#include "nn/clustering/kmeans.h"
#ifdef CF_WITH_CUDA
#include "bench/cuda_baselines.h"
#endif

namespace cf::bench {

namespace {

// ---------------------------------------------------------------- kmeans
// Baseline of cf-bench kmeans: the same product in one raw BLAS call, (N, k) output. CPU: one
// cblas_sgemm on as many OpenBLAS threads as cf's OpenMP team; CUDA: one
// cuBLAS SGEMM on the same device buffers (c transposed once, outside the timing).
// Returns its time; *baseline says what it is.
double blas_baseline(const cf::Tensor& x, const cf::Tensor& c, int64_t n, int64_t d, int64_t k, int64_t reps,
                     std::string* baseline_out) {
  double t_blas = 0;
  std::string& baseline = *baseline_out;
  if (g_device.is_cuda()) {
#ifdef CF_WITH_CUDA
    cf::Tensor ct = cf::contiguous(cf::transpose(c, 0, 1));
    cf::Tensor full = cf::Tensor::empty({n, k}, cf::kFloat32, g_device);
    t_blas = time_median(reps, [&] {
      cf::bench::cublas_sgemm_strided_batched(x.raw_data(), ct.raw_data(), full.raw_data(), 1, n, k, d,
                                              g_device.index);
    });
    baseline = "one cuBLAS SGEMM (N,d) x (d,k) into an (N,k) device buffer";
#endif
  } else {
    std::vector<float> full(size_t(n * k));
    const float* px = x.data<float>();
    const float* pc = c.data<float>();
    RawBlasThreads raw_blas;
    t_blas = time_median(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(k), int(d), -2.0f, px, int(d),
                  pc, int(d), 0.0f, full.data(), int(k));
    });
    baseline = "one cblas_sgemm (N,d) x (d,k) into an (N,k) buffer";
  }
  return t_blas;
}

json kmeans_row(const BenchOptions& o, int64_t n, int64_t d, int64_t k) {
  cf::Generator gen{uint64_t(n * 131 + d * 7 + k)};
  cf::Tensor x = cf::randn({n, d}, cf::kFloat32, gen);
  cf::nn::KMeansOptions ko;
  ko.k = k;
  ko.init = cf::nn::KMeansInit::random;
  ko.block_rows = o.block_rows;
  ko.tol = 0;
  cf::Tensor c = cf::nn::kmeans_init(x, ko);
  x = x.to(g_device);
  c = c.to(g_device);
  const double flops = 2.0 * double(n) * double(d) * double(k);
  const int64_t reps = o.repeat > 0 ? o.repeat : 5;

  // Baseline: the same product in one raw BLAS call (blas_baseline).
  std::string baseline;
  const double t_blas = blas_baseline(x, c, n, d, k, reps, &baseline);

  // The assignment step as Lloyd's loop runs it: buffers allocated once.
  const int64_t rows = std::min(ko.block_rows, n);
  cf::Tensor ws = cf::Tensor::empty({(rows + 1) * k}, cf::kFloat32, g_device);
  cf::Tensor labels = cf::Tensor::empty({n}, cf::kInt64, g_device),
             dist = cf::Tensor::empty({n}, cf::kFloat64, g_device);
  double t_assign = time_median(reps, [&] {
    cf::kernels::kmeans_assign(x, c, false, rows, ws, labels, dist);
  });
  // The public call (validation, finiteness scan and its own buffers included).
  double t_public = time_median(reps, [&] { cf::Tensor l = cf::nn::kmeans_assign(x, c); });

  // One Lloyd iteration (update + assignment + bookkeeping), timed between the
  // on_iteration callbacks of one run of M iterations; the median is reported.
  const int64_t M = o.lloyd_iters;
  cf::nn::KMeansOptions kM = ko;
  kM.max_iter = M;
  std::vector<double> stamps;
  auto t_start = Clock::now();
  kM.on_iteration = [&](int64_t, double) { stamps.push_back(seconds_since(t_start)); };
  cf::reset_peak_memory(g_device);
  int64_t iters = 0;
  bool setup_included = false;  // (of the run lloyd_median made last)
  auto lloyd_median = [&](cf::nn::KMeansOptions opts) {
    setup_included = false;
    stamps.clear();
    t_start = Clock::now();
    iters = cf::nn::kmeans(x, c, opts).iterations;
    std::vector<double> dt;
    for (size_t i = 1; i < stamps.size(); ++i) dt.push_back(stamps[i] - stamps[i - 1]);
    if (dt.empty() && !stamps.empty()) {  // converged after one iteration: its interval holds the setup
      dt.push_back(stamps[0]);
      setup_included = true;
    }
    return dt.empty() ? -1.0 : median(dt);
  };
  const double t_lloyd = lloyd_median(kM);
  const bool lloyd_setup_included = setup_included;
  int64_t peak = cf::memory_stats(g_device).peak_bytes;
  double t_elkan = -1;
  if (o.elkan && g_device.is_cpu()) {  // Elkan's bounds are a CPU speed-up
    kM.algorithm = cf::nn::KMeansAlgorithm::elkan;
    t_elkan = lloyd_median(kM);
  }

  json r;
  r["name"] = "kmeans_n" + std::to_string(n) + "_d" + std::to_string(d) + "_k" + std::to_string(k);
  r["params"] = {{"n", n}, {"d", d}, {"k", k}, {"block_rows", rows}, {"dtype", "float32"},
                 {"repeat", reps}, {"lloyd_iters_run", iters},
                 {"baseline", baseline}};
  // Keys name the baseline as cf-bench matmul does: cblas on the CPU, cublas on CUDA.
  const std::string blas = g_device.is_cuda() ? "cublas" : "cblas";
  r[blas + "_time_s"] = t_blas;
  r[blas + "_gflops"] = flops / t_blas * 1e-9;
  r["assign_time_s"] = t_assign;
  r["assign_gflops"] = flops / t_assign * 1e-9;
  r["ratio_vs_" + blas] = t_blas / t_assign;
  r["kmeans_assign_call_time_s"] = t_public;
  r["kmeans_assign_call_ratio_vs_" + blas] = t_blas / t_public;
  r["lloyd_iteration_time_s"] = t_lloyd;
  if (lloyd_setup_included) r["lloyd_iteration_setup_included"] = true;  // one iteration ran: no interval without it
  r["lloyd_peak_bytes"] = peak;
  if (t_elkan > 0) {
    r["elkan_iteration_time_s"] = t_elkan;
    r["elkan_ratio_vs_lloyd"] = t_elkan / r["lloyd_iteration_time_s"].get<double>();
    if (setup_included) r["elkan_iteration_setup_included"] = true;
  }  // buffers of one kmeans() run (x was allocated before)
  return r;
}

}  // namespace

json bench_kmeans(const BenchOptions& o) {
  json rows = json::array();
  for (int64_t d : o.kmeans_dims)
    for (int64_t k : o.kmeans_ks) rows.push_back(kmeans_row(o, o.kmeans_n, d, k));
  return report("kmeans", rows);
}

}  // namespace cf::bench
