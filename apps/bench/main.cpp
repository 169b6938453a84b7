// cf-bench: micro-benchmarks of the cf CPU and CUDA backends. Each subcommand prints ONE
// JSON object {"bench": NAME, "machine": {...}, "results": [ROW, ...]} where a
// ROW has "name", "params" and numeric fields named with their unit (time_s,
// peak_bytes, gflops, gbps, ns_per_op, ...) and ratios ratio_vs_<baseline>
// measured in the same run (DESIGN.md section 7).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench/dist_bench.h"
#include "cf.h"
#include "common/attention_bench.h"
#include "common/cli.h"
#include "common/report.h"
#include "nn/attention/centroid.h"
#include "nn/attention/chunked.h"
#include "kernels/kmeans/kmeans.h"
#include "kernels/matmul/bf16_dot.h"
#include "nn/clustering/kmeans.h"
#ifdef CF_WITH_CUDA
#include "bench/cuda_baselines.h"
#endif

#ifndef CF_BUILD_TYPE
#define CF_BUILD_TYPE "unknown"
#endif
#ifndef CF_VERSION
#define CF_VERSION "unknown"
#endif

using json = nlohmann::ordered_json;
using cf::apps::UsageError;
using Clock = std::chrono::steady_clock;
using cf::apps::seconds_since;

namespace {

const char* kUsage = R"(usage: cf-bench <subcommand> [options]

Subcommands (each prints one JSON object on stdout):
  overhead      median ns per tiny op: 1-element add without and with autograd,
                forward+backward of a 3-op chain
  matmul        GFLOP/s of cf::matmul (float32) vs a direct cblas_sgemm call on
                the same buffers, square sizes and a batched case
  elementwise   GB/s of add, mul, exp, softmax and layer_norm (rows of 1024) on
                float32 vs memcpy of the same bytes
  attention     forward and forward+backward time and peak bytes of attention
                variants on q, k, v of (1, 4 heads, N, 64), float32; each
                variant's ratio_vs_full is measured in the same run
  model         tokens/s and peak bytes of one training step (forward, backward,
                AdamW) and one inference step of a Transformer encoder classifier
                (2 post-LN layers, d 256, 4 heads, FFN 1024, vocab 1000) per
                attention variant; apps/bench/peers.py runs the PyTorch twin

Options:
  --repeat N    timed repetitions per row; the median is reported
                (default: overhead 201 samples, others 5)
  --threads N   threads of cf's OpenMP team and of the raw-BLAS baselines
                (default: the runtime's choice)
  --iters N     overhead: ops per timed sample (default 2000)
  --sizes LIST  matmul: square sizes, comma separated (default 256,512,1024,2048)
  --batch B,N   matmul: batched case B x (N x N x N) (default 64,128; 0,0 skips it)
  --numel N     elementwise: elements per tensor (default 16777216)
  --variants L  attention, model: comma-separated variant names, or all (default: full;
                --variant is the same option);
                known: )" "__VARIANTS__" R"(;
                and the N -> N/4 centroid attention layer (not a q, k, v variant):
                centroid, centroid-knn (K = 40), on x (1, N, 256);
                attention only: full-dense, full attention through the dense
                (B, H, N, N) path (nn::dense_attention), beside the fused "full";
                block, the gathered block attention alone (random order, sqrt(N)
                blocks, each seeing itself and the previous one)
  --sizes LIST  attention: sequence lengths (default 512,1024,2048,4096,8192,16384)
  --causal      attention: causal masking
  --sizes LIST  model: sequence lengths (default 128,512,2048)
  --batch-size B  model: sequences per step (default 8)
  --max-gib G   attention: skip a dense row whose score matrices would need more
                than G GiB (default: half of this machine's memory)
  kmeans        K-Means on N random float32 points: GFLOP/s of the assignment
                step (blocked GEMM + argmin, buffers reused as in Lloyd's loop)
                vs one cblas_sgemm of the same (N,d) x (d,k) product, and the
                time of one full Lloyd iteration (assignment + update)
  --n N         kmeans: points (default 100000)
  --dims LIST   kmeans: feature sizes d (default 64,256)
  --ks LIST     kmeans: cluster counts k (default 256,1024)
  --block-rows R  kmeans: rows per assignment block (default: KMeansOptions's)
  --iters M     kmeans: Lloyd iterations run; the median iteration time is
                reported (default 5)
  --elkan       kmeans: also time an iteration of Elkan's variant (N x k float64
                bounds in memory)
  --precision P matmul, attention, model: fp32 (default), bf16 or fp16. matmul: the
                operands are bfloat16/float16 (float32 accumulation); the CPU baseline
                stays cblas_sgemm on float32 copies (the ratio says what the 16-bit
                path costs against float32 sgemm), the CUDA baseline becomes a direct
                cublasGemmStridedBatchedEx in the same dtype. attention and model run
                under cf::AutocastGuard (q, k, v in the 16-bit dtype for attention)
  allreduce     under mpirun -np W: GB/s of cf::dist::all_reduce (float32 sum,
                with and without its cross-rank descriptor check) vs a raw
                MPI_Allreduce on the same buffer, in the same run
  --sizes LIST  allreduce: message sizes in bytes (default 8,1024,65536,1048576,16777216)
  ddp           under mpirun -np W: one training step (forward, backward, AdamW)
                of a 2-layer encoder classifier, one process on the global batch
                (rank 0 alone) vs W DDP processes on 1/W each, and DDP with
                no_sync (no communication); scaling_efficiency = t_one / (W t_ddp)
  --sizes LIST  ddp: sequence lengths (default 128)
  --batch-size B  ddp: global batch (default 16; a multiple of W)
  --variants L  ddp: attention variants (default full)
  --device D    cpu (default) or cuda[:i]. On CUDA, every timed call ends with
                a device synchronisation; the baselines become a direct cuBLAS
                strided-batched SGEMM (matmul, kmeans) and a device-to-device
                cudaMemcpy (elementwise), timed in the same run
  -h, --help    this text
)";

struct Options {
  std::string cmd;
  cf::Device device = cf::Device::cpu();
  std::vector<std::string> variants = {"full"};
  bool sizes_given = false;
  bool causal = false;
  double max_gib = -1;
  int64_t repeat = -1;
  int64_t threads = -1;
  int64_t iters = 2000;
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  std::vector<int64_t> batch = {64, 128};
  int64_t numel = int64_t(1) << 24;
  int64_t batch_size = 8;
  bool batch_size_given = false;
  int64_t kmeans_n = 100000;
  std::vector<int64_t> kmeans_dims = {64, 256};
  std::vector<int64_t> kmeans_ks = {256, 1024};
  int64_t block_rows = cf::nn::KMeansOptions{}.block_rows;
  int64_t lloyd_iters = 5;
  bool elkan = false;
  std::string precision = "fp32";
};

// --precision: the autocast / operand dtype, or nullopt for fp32.
std::optional<cf::DType> low_dtype(const Options& o) {
  if (o.precision == "bf16") return cf::kBFloat16;
  if (o.precision == "fp16") return cf::kFloat16;
  return std::nullopt;
}
const char* dtype_label(const Options& o) {
  return o.precision == "bf16" ? "bfloat16" : o.precision == "fp16" ? "float16" : "float32";
}

// The device every benchmark runs on (--device); timed calls end with a
// synchronisation there, so a time covers the work, not just its launch.
cf::Device g_device = cf::Device::cpu();
void device_sync() { cf::apps::device_sync(g_device); }

using cf::apps::bench_attention_options;
using cf::apps::median;

// Median wall time of `reps` calls of f, after one warm-up call
// (apps/common/attention_bench.h, shared with cf-efficiency).
double time_median(int64_t reps, const std::function<void()>& f) {
  return cf::apps::time_median(reps, g_device, f);
}

json machine_info() {
  json m;
  m["cpu"] = cf::apps::cpu_model();
  m["cores"] = std::thread::hardware_concurrency();
#ifdef _OPENMP
  m["openmp_threads"] = omp_get_max_threads();
#else
  m["openmp_threads"] = 1;
#endif
  // cf runs each BLAS call on one thread and parallelises GEMMs over its OpenMP
  // team (kernels/matmul); the raw-BLAS baselines below run OpenBLAS with as
  // many threads as that team.
  m["blas_threading"] = "cf: OpenMP team, 1-thread BLAS calls; raw-BLAS baselines: OpenBLAS threads = OpenMP threads";
  m["openblas_config"] = std::string(openblas_get_config());
#if defined(__clang__)
  m["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  m["compiler"] = std::string("gcc ") + __VERSION__;
#else
  m["compiler"] = "unknown";
#endif
  m["build_type"] = CF_BUILD_TYPE;
  m["cf_version"] = CF_VERSION;
  m["cuda_built"] = cf::cuda_built();
  m["device"] = g_device.str();
#ifdef CF_WITH_CUDA
  if (g_device.is_cuda()) {
    m["gpu"] = cf::bench::gpu_name(g_device.index);
    m["tf32"] = cf::cuda::allow_tf32();
  }
#endif
  return m;
}

json report(const std::string& name, json results) {
  json out;
  out["bench"] = name;
  out["machine"] = machine_info();
  out["results"] = std::move(results);
  return out;
}

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

json bench_overhead(const Options& o) {
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

// ---------------------------------------------------------------- matmul
// While alive, OpenBLAS runs with as many threads as cf's OpenMP team: the
// raw-BLAS baseline at its own best. cf's next matmul puts it back to 1 thread.
struct RawBlasThreads {
  RawBlasThreads() {
#ifdef _OPENMP
    openblas_set_num_threads(omp_get_max_threads());
#endif
  }
  ~RawBlasThreads() { openblas_set_num_threads(1); }
};

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

int64_t reps_for(const Options& o, double flops) {
  if (o.repeat > 0) return o.repeat;
  // Small problems run more often so that the median is stable.
  return flops < 1e9 ? 21 : flops < 1e10 ? 7 : 5;
}

// One row: cf::matmul on (bs, n, n) @ (bs, n, n) against cblas_sgemm called once per
// batch entry on the same buffers (bs = 0 means plain 2-d n x n operands).
json matmul_row(const Options& o, cf::Generator& gen, int64_t bs, int64_t n) {
  int64_t count = std::max<int64_t>(bs, 1);
  cf::Shape shape = bs > 0 ? cf::Shape{bs, n, n} : cf::Shape{n, n};
  const std::optional<cf::DType> low = low_dtype(o);
  cf::Tensor A = cf::rand(shape, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor B = cf::rand(shape, cf::kFloat32, gen, -1, 1).to(g_device);
  if (low) {  // 16-bit operands; the float32 baselines read their exact float32 values
    A = cf::to(A, *low);
    B = cf::to(B, *low);
  }
  cf::Tensor A32 = cf::to(A, cf::kFloat32), B32 = cf::to(B, cf::kFloat32);
  std::vector<float> C(size_t(count * n * n));
  double flops = 2.0 * double(count) * double(n) * double(n) * double(n);
  int64_t reps = reps_for(o, flops);

  cf::reset_peak_memory(g_device);
  cf::Tensor out;
  double t_cf = time_median(reps, [&] {
    out = cf::Tensor();  // free the previous result first: peak_bytes is one call's
    out = cf::matmul(A, B);
  });
  int64_t peak = cf::memory_stats(g_device).peak_bytes;
  json r;
  r["name"] = bs > 0 ? "bmm_" + std::to_string(bs) + "x" + std::to_string(n)
                     : "matmul_" + std::to_string(n);
  r["params"] = {{"m", n}, {"n", n}, {"k", n}, {"batch", count}, {"dtype", dtype_label(o)},
                 {"repeat", reps}};
  r["time_s"] = t_cf;
  r["gflops"] = flops / t_cf * 1e-9;
  r["peak_bytes"] = peak;
#ifdef CF_WITH_CUDA
  if (g_device.is_cuda() && low) {
    // Baseline: one cublasGemmStridedBatchedEx call in the same dtype on the same buffers.
    cf::Tensor Cd = cf::Tensor::empty(shape, *low, g_device);
    double t_cublas = time_median(reps, [&] {
      cf::bench::cublas_gemm_ex_strided_batched_16(A.raw_data(), B.raw_data(), Cd.raw_data(), count, n, n, n,
                                                   *low == cf::kBFloat16, g_device.index);
    });
    r["params"]["baseline"] = "cublasGemmStridedBatchedEx (16-bit, CUBLAS_COMPUTE_32F) on the same device buffers";
    r["cublas_time_s"] = t_cublas;
    r["cublas_gflops"] = flops / t_cublas * 1e-9;
    r["ratio_vs_cublas"] = t_cublas / t_cf;
    std::vector<float> got = cf::to(out, cf::kFloat32).to_vector<float>(),
                       want = cf::to(Cd, cf::kFloat32).to_vector<float>();
    r["max_abs_diff_vs_cublas"] = max_abs_diff(got.data(), want.data(), count * n * n);
    return r;
  }
  if (g_device.is_cuda()) {
    // Baseline: one cublasSgemmStridedBatched call on the same device buffers.
    cf::Tensor Cd = cf::Tensor::empty(shape, cf::kFloat32, g_device);
    double t_cublas = time_median(reps, [&] {
      cf::bench::cublas_sgemm_strided_batched(A.raw_data(), B.raw_data(), Cd.raw_data(), count, n, n, n,
                                              g_device.index);
    });
    r["params"]["baseline"] = "cublasSgemmStridedBatched on the same device buffers";
    r["cublas_time_s"] = t_cublas;
    r["cublas_gflops"] = flops / t_cublas * 1e-9;
    r["ratio_vs_cublas"] = t_cublas / t_cf;
    std::vector<float> got = out.to_vector<float>(), want = Cd.to_vector<float>();
    r["max_abs_diff_vs_cublas"] = max_abs_diff(got.data(), want.data(), count * n * n);
    return r;
  }
#endif
  const float* pa = A32.data<float>();
  const float* pb = B32.data<float>();
  RawBlasThreads raw_blas;
  double t_blas = time_median(reps, [&] {
    for (int64_t i = 0; i < count; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f,
                  pa + i * n * n, int(n), pb + i * n * n, int(n), 0.0f, C.data() + i * n * n,
                  int(n));
  });
  if (low == cf::kBFloat16 && cf::kernels::bf16_dot_available()) {
    // Which bfloat16 path won: the AVX-512 BF16 kernel (timed above) vs the converting
    // float32 + sgemm path, in the same run.
    cf::kernels::set_bf16_dot_enabled(false);
    double t_conv = time_median(reps, [&] { cf::Tensor tmp = cf::matmul(A, B); });
    cf::kernels::set_bf16_dot_enabled(true);
    r["params"]["kernel"] = "avx512_bf16 (vdpbf16ps)";
    r["converting_time_s"] = t_conv;
    r["ratio_vs_converting"] = t_conv / t_cf;
  }
  cf::Tensor outc = cf::contiguous(cf::to(out, cf::kFloat32));
  if (bs > 0) r["params"]["baseline"] = "loop of cblas_sgemm over the batch";
  if (low) r["params"]["baseline"] = "cblas_sgemm (float32) on float32 copies of the same values";
  r["cblas_time_s"] = t_blas;
  r["cblas_gflops"] = flops / t_blas * 1e-9;
  r["ratio_vs_cblas"] = t_blas / t_cf;
  r["max_abs_diff_vs_cblas"] = max_abs_diff(outc.data<float>(), C.data(), count * n * n);
  return r;
}

json bench_matmul(const Options& o) {
  json rows = json::array();
  cf::Generator gen(42);
  for (int64_t n : o.sizes) rows.push_back(matmul_row(o, gen, 0, n));
  if (o.batch.size() == 2 && o.batch[0] > 0 && o.batch[1] > 0)
    rows.push_back(matmul_row(o, gen, o.batch[0], o.batch[1]));
  return report("matmul", rows);
}

// ---------------------------------------------------------------- elementwise
json bench_elementwise(const Options& o) {
  int64_t n = o.numel;
  int64_t reps = o.repeat > 0 ? o.repeat : 5;
  double bytes1 = double(n) * sizeof(float);
  cf::Generator gen(7);
  cf::Tensor a = cf::rand({n}, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor b = cf::rand({n}, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor inplace = cf::clone(a);

  // Baseline: memcpy of one tensor's bytes into a buffer already touched (on
  // CUDA a device-to-device cudaMemcpy between two device buffers).
  double t_copy = 0;
  if (g_device.is_cuda()) {
#ifdef CF_WITH_CUDA
    cf::Tensor dst = cf::Tensor::zeros({n}, cf::kFloat32, g_device);
    t_copy = time_median(reps, [&] { cf::bench::device_copy(dst.raw_data(), a.raw_data(), size_t(bytes1)); });
#endif
  } else {
    std::vector<float> dst(size_t(n), 0.0f);
    t_copy = time_median(reps, [&] { std::memcpy(dst.data(), a.data<float>(), size_t(bytes1)); });
  }
  double gbps_copy = 2 * bytes1 / t_copy * 1e-9;  // read + write

  json rows = json::array();
  json base;
  base["name"] = g_device.is_cuda() ? "cudaMemcpy_d2d" : "memcpy";
  base["params"] = {{"numel", n}, {"dtype", "float32"}, {"repeat", reps},
                    {"bytes_moved", 2 * bytes1}};
  base["time_s"] = t_copy;
  base["gbps"] = gbps_copy;
  rows.push_back(base);

  struct Case {
    const char* name;
    int tensors_moved;  // inputs read + outputs written
    std::function<void()> f;
    const char* note;
  };
  cf::Tensor keep;
  // Row-wise ops over rows of 1024 (attention- and Transformer-like widths).
  const int64_t row = 1024;
  cf::Tensor rows2d = cf::reshape(a, {n / row, row});
  cf::Tensor ln_w = cf::Tensor::ones({row}, cf::kFloat32, g_device),
             ln_b = cf::Tensor::zeros({row}, cf::kFloat32, g_device);
  std::vector<Case> cases = {
      {"add", 3, [&] { keep = cf::Tensor(); keep = cf::add(a, b); }, "out = a + b (allocates out)"},
      {"mul", 3, [&] { keep = cf::Tensor(); keep = cf::mul(a, b); }, "out = a * b (allocates out)"},
      {"exp", 2, [&] { keep = cf::Tensor(); keep = cf::exp(a); }, "out = exp(a) (allocates out)"},
      {"softmax", 2, [&] { keep = cf::Tensor(); keep = cf::softmax(rows2d, -1); },
       "softmax over rows of 1024 (allocates out)"},
      {"layer_norm", 2, [&] { keep = cf::Tensor(); keep = cf::layer_norm(rows2d, {row}, ln_w, ln_b); },
       "layer_norm over rows of 1024 with weight and bias (allocates out)"},
      {"add_inplace", 3,
       [&] {
         cf::NoGradGuard ng;
         cf::add_(inplace, b);
       },
       "a += b in place (no allocation: the kernel's own bandwidth)"},
  };
  for (const Case& c : cases) {
    keep = cf::Tensor();
    cf::reset_peak_memory(g_device);
    double t = time_median(reps, c.f);
    double moved = c.tensors_moved * bytes1;
    json r;
    r["name"] = c.name;
    r["params"] = {{"numel", n}, {"dtype", "float32"}, {"repeat", reps}, {"bytes_moved", moved},
                   {"what", c.note}};
    r["time_s"] = t;
    r["gbps"] = moved / t * 1e-9;
    r["ratio_vs_memcpy"] = (moved / t * 1e-9) / gbps_copy;
    r["peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
    rows.push_back(r);
  }
  return report("elementwise", rows);
}

// ---------------------------------------------------------------- attention
// physical_gib(), bench_attention_options(variant, n) and the dense memory guard
// live in apps/common/attention_bench.h, shared with cf-efficiency.

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

json bench_centroid_row(const std::string& variant, int64_t n, const cf::Tensor& x, int64_t heads, int64_t reps,
                        double full_fwd, double full_bwd) {
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
  auto run = [&](const cf::Tensor& in) { return layer.forward(in, init.forward(in).u); };
  cf::Tensor out;
  cf::reset_peak_memory(g_device);
  double t_fwd;
  {
    cf::NoGradGuard ng;
    t_fwd = time_median(reps, [&] {
      out = cf::Tensor();
      out = run(x);
    });
  }
  out = cf::Tensor();
  r["forward_time_s"] = t_fwd;
  r["forward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (full_fwd > 0) r["forward_ratio_vs_full"] = t_fwd / full_fwd;
  cf::Tensor xg = x.detach();
  xg.set_requires_grad(true);
  cf::reset_peak_memory(g_device);
  double t_bwd = time_median(reps, [&] {
    xg.zero_grad();
    layer.zero_grad();
    cf::sum(run(xg)).backward();
  });
  r["forward_backward_time_s"] = t_bwd;
  r["forward_backward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
  if (full_bwd > 0) r["forward_backward_ratio_vs_full"] = t_bwd / full_bwd;
  return r;
}

json bench_attention(const Options& o) {
  const int64_t B = 1, H = 4, Dh = 64;
  std::vector<int64_t> sizes = o.sizes_given ? o.sizes : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
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
        rows.push_back(bench_centroid_row(variant, n, x, H, o.repeat > 0 ? o.repeat : (n >= 8192 ? 1 : 3), full_fwd,
                                          full_bwd));
        continue;
      }
      cf::nn::AttentionSpec spec;
      spec.type = is_bench_only(variant) ? "full" : variant;
      spec.d_model = H * Dh;
      spec.n_heads = H;
      nlohmann::json options = bench_attention_options(variant, n);
      spec.options = cf::nn::Config(options, "attention");
      std::shared_ptr<cf::nn::Attention> att = cf::nn::make_attention(spec);
      att->to(g_device);  // variants with parameters or buffers (neural clustering, routing, Cluster-Former)
      json r;
      r["name"] = variant + "_" + std::to_string(n);
      r["params"] = {{"variant", variant}, {"n", n}, {"batch", B}, {"heads", H}, {"head_dim", Dh},
                     {"causal", o.causal}, {"dtype", dtype_label(o)}, {"options", options}};
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
          return cf::nn::chunked_attention(a.q, a.k, a.v, members, cf::Tensor(), co).out;
        }
        if (!is_full_dense(variant)) return att->forward(a);
        return cf::nn::dense_attention(a.q, a.k, a.v, cf::nn::dense_block_mask(a), 1.0 / std::sqrt(double(Dh)));
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
        rows.push_back(r);
        continue;
      }
      cf::Tensor out;
      cf::reset_peak_memory(g_device);
      double t_fwd;
      {
        cf::NoGradGuard ng;
        // A variant that refuses these arguments (plain clustered attention takes no
        // causal mask) gets a row that says so; the other variants still run.
        try {
          t_fwd = time_median(reps, [&] {
            out = cf::Tensor();
            out = forward(args(q, k, v));
          });
        } catch (const cf::NotImplementedError& e) {
          r["skipped"] = e.what();
          rows.push_back(r);
          continue;
        } catch (const cf::DTypeError& e) {  // a variant without 16-bit kernels yet (--precision)
          r["skipped"] = e.what();
          rows.push_back(r);
          continue;
        }
      }
      out = cf::Tensor();
      r["forward_time_s"] = t_fwd;
      r["forward_peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
      if (variant == "full") full_fwd = t_fwd;
      if (full_fwd > 0) r["forward_ratio_vs_full"] = t_fwd / full_fwd;
      if (dense && 6 * nn_gib > max_gib) {
        r["backward_skipped"] = "forward+backward needs about " + std::to_string(6 * nn_gib) + " GiB > --max-gib";
        rows.push_back(r);
        continue;
      }
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
      rows.push_back(r);
    }
  }
  return report("attention", rows);
}

// ---------------------------------------------------------------- model
// One training step (forward, backward, AdamW) and one inference step of a
// Transformer encoder classifier: token embedding + sinusoidal positions, 2
// post-LN layers (d = 256, 4 heads, FFN 1024, ReLU, no dropout), mean pooling, a
// linear head and cross-entropy. apps/bench/peers.py builds the same model in
// PyTorch (nn.TransformerEncoder) for the side-by-side table.
json bench_model(const Options& o) {
  const int64_t B = o.batch_size, vocab = 1000, classes = 10;
  std::vector<int64_t> sizes = o.sizes_given ? o.sizes : std::vector<int64_t>{128, 512, 2048};
  json rows = json::array();
  for (int64_t n : sizes) {
    double full_train = -1, full_infer = -1;
    for (const std::string& variant : o.variants) {
      cf::apps::EncoderBenchConfig bc;  // apps/common/attention_bench.h, shared with cf-efficiency
      bc.variant = variant;
      bc.n = n;
      bc.batch = B;
      bc.layers = 2;
      bc.d_model = 256;
      bc.heads = 4;
      bc.d_ff = 1024;
      bc.vocab = vocab;
      bc.classes = classes;
      bc.seed = uint64_t(1000 + n);
      bc.device = g_device;
      cf::apps::EncoderBench model(bc);
      const int64_t reps = o.repeat > 0 ? o.repeat : (n >= 2048 ? 2 : 5);
      json r;
      r["name"] = "model_" + variant + "_" + std::to_string(n);
      r["params"] = {{"variant", variant}, {"n", n}, {"batch", B}, {"layers", 2}, {"d_model", 256},
                     {"heads", 4}, {"d_ff", 1024}, {"vocab", vocab}, {"classes", classes},
                     {"parameters", model.num_parameters()}, {"repeat", reps}, {"dtype", "float32"}};
      if (low_dtype(o)) r["params"]["autocast"] = dtype_label(o);  // float32 weights, 16-bit matmuls
      cf::AutocastGuard autocast(low_dtype(o));
      const cf::apps::Measurement train = model.measure_train(reps, 1);
      const double t_train = train.median_s;
      r["train_step_time_s"] = t_train;
      r["train_tokens_per_s"] = double(B * n) / t_train;
      r["train_peak_bytes"] = train.peak_bytes;
      const cf::apps::Measurement infer = model.measure_infer(reps, 1);
      const double t_infer = infer.median_s;
      r["infer_step_time_s"] = t_infer;
      r["infer_tokens_per_s"] = double(B * n) / t_infer;
      r["infer_peak_bytes"] = infer.peak_bytes;
      if (variant == "full") {
        full_train = t_train;
        full_infer = t_infer;
      }
      if (full_train > 0) r["train_ratio_vs_full"] = t_train / full_train;
      if (full_infer > 0) r["infer_ratio_vs_full"] = t_infer / full_infer;
      rows.push_back(r);
    }
  }
  return report("model", rows);
}

// ---------------------------------------------------------------- kmeans
json kmeans_row(const Options& o, int64_t n, int64_t d, int64_t k) {
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

  // Baseline: the same product in one raw BLAS call, (N, k) output. CPU: one
  // cblas_sgemm on as many OpenBLAS threads as cf's OpenMP team; CUDA: one
  // cuBLAS SGEMM on the same device buffers (c transposed once, outside the timing).
  double t_blas = 0;
  std::string baseline;
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
  auto lloyd_median = [&](cf::nn::KMeansOptions opts) {
    stamps.clear();
    t_start = Clock::now();
    iters = cf::nn::kmeans(x, c, opts).iterations;
    std::vector<double> dt;
    for (size_t i = 1; i < stamps.size(); ++i) dt.push_back(stamps[i] - stamps[i - 1]);
    if (dt.empty() && !stamps.empty()) dt.push_back(stamps[0]);  // M = 1: setup included
    return dt.empty() ? -1.0 : median(dt);
  };
  const double t_lloyd = lloyd_median(kM);
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
  r["lloyd_peak_bytes"] = peak;
  if (t_elkan > 0) {
    r["elkan_iteration_time_s"] = t_elkan;
    r["elkan_ratio_vs_lloyd"] = t_elkan / r["lloyd_iteration_time_s"].get<double>();
  }  // buffers of one kmeans() run (x was allocated before)
  return r;
}

json bench_kmeans(const Options& o) {
  json rows = json::array();
  for (int64_t d : o.kmeans_dims)
    for (int64_t k : o.kmeans_ks) rows.push_back(kmeans_row(o, o.kmeans_n, d, k));
  return report("kmeans", rows);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) throw UsageError("missing subcommand");
  o.cmd = argv[1];
  if (o.cmd == "-h" || o.cmd == "--help") {
    o.cmd = "help";
    return o;
  }
  if (o.cmd != "overhead" && o.cmd != "matmul" && o.cmd != "elementwise" && o.cmd != "attention" &&
      o.cmd != "model" && o.cmd != "kmeans" && o.cmd != "allreduce" && o.cmd != "ddp")
    throw UsageError("unknown subcommand '" + o.cmd + "'");
  cf::apps::ArgReader args(argc, argv, 2);
  while (!args.done()) {
    std::string opt = args.next();
    if (opt == "-h" || opt == "--help") {
      args.no_value(opt);
      o.cmd = "help";
      return o;
    } else if (opt == "--repeat") {
      o.repeat = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--device") {
      try {
        o.device = cf::Device::parse(args.value(opt));
      } catch (const cf::Error& e) {
        throw UsageError(std::string("--device: ") + e.what());
      }
    } else if (opt == "--threads") {
      o.threads = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--iters" && o.cmd == "overhead") {
      o.iters = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--sizes" && (o.cmd == "matmul" || o.cmd == "attention" || o.cmd == "model" ||
                                     o.cmd == "allreduce" || o.cmd == "ddp")) {
      o.sizes = cf::apps::parse_int_list(opt, args.value(opt), 1);
      o.sizes_given = true;
    } else if ((opt == "--variants" || opt == "--variant") &&
               (o.cmd == "attention" || o.cmd == "model" || o.cmd == "ddp")) {
      o.variants.clear();
      std::string list = args.value(opt), item;
      std::vector<std::string> known = cf::nn::attention_types();
      if (list == "all") {  // every registry variant, and for attention the centroid layers and bench-only rows
        o.variants = known;
        if (o.cmd == "attention")
          for (const char* extra : {"centroid", "centroid-knn", "full-dense", "block"}) o.variants.push_back(extra);
        continue;
      }
      for (size_t i = 0; i <= list.size(); ++i) {
        if (i < list.size() && list[i] != ',') {
          item += list[i];
          continue;
        }
        if (std::find(known.begin(), known.end(), item) == known.end() && !is_centroid_variant(item) &&
            !(is_bench_only(item) && o.cmd == "attention"))
          throw UsageError("--variants: unknown attention variant '" + item + "'");
        o.variants.push_back(item);
        item.clear();
      }
    } else if (opt == "--precision" && (o.cmd == "matmul" || o.cmd == "attention" || o.cmd == "model")) {
      o.precision = args.value(opt);
      if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp16")
        throw UsageError("--precision must be fp32, bf16 or fp16, got '" + o.precision + "'");
    } else if (opt == "--causal" && o.cmd == "attention") {
      args.no_value(opt);
      o.causal = true;
    } else if (opt == "--max-gib" && o.cmd == "attention") {
      o.max_gib = cf::apps::parse_double(opt, args.value(opt));
      if (!(o.max_gib > 0)) throw UsageError("--max-gib must be positive");
    } else if (opt == "--batch-size" && (o.cmd == "model" || o.cmd == "ddp")) {
      o.batch_size = cf::apps::parse_int(opt, args.value(opt), 1);
      o.batch_size_given = true;
    } else if (opt == "--batch" && o.cmd == "matmul") {
      o.batch = cf::apps::parse_int_list(opt, args.value(opt), 0);
      if (o.batch.size() != 2) throw UsageError("--batch expects B,N (two integers)");
    } else if (opt == "--n" && o.cmd == "kmeans") {
      o.kmeans_n = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--dims" && o.cmd == "kmeans") {
      o.kmeans_dims = cf::apps::parse_int_list(opt, args.value(opt), 1);
    } else if (opt == "--ks" && o.cmd == "kmeans") {
      o.kmeans_ks = cf::apps::parse_int_list(opt, args.value(opt), 1);
    } else if (opt == "--block-rows" && o.cmd == "kmeans") {
      o.block_rows = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--iters" && o.cmd == "kmeans") {
      o.lloyd_iters = cf::apps::parse_int(opt, args.value(opt), 1);
    } else if (opt == "--elkan" && o.cmd == "kmeans") {
      args.no_value(opt);
      o.elkan = true;
    } else if (opt == "--numel" && o.cmd == "elementwise") {
      o.numel = cf::apps::parse_int(opt, args.value(opt), 1024);
      if (o.numel % 1024 != 0) throw UsageError("--numel must be a multiple of 1024 (softmax rows)");
    } else {
      throw UsageError("unknown option '" + opt + "' for subcommand " + o.cmd);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "cf-bench: " << e.what() << "\n(run 'cf-bench --help' for usage)\n";
    return 2;
  }
  if (o.cmd == "help") {
    std::string usage = kUsage, known;
    for (const std::string& t : cf::nn::attention_types()) known += (known.empty() ? "" : ", ") + t;
    usage.replace(usage.find("__VARIANTS__"), std::string("__VARIANTS__").size(), known);
    std::cout << usage;
    return 0;
  }
  if (o.threads > 0) {
#ifdef _OPENMP
    omp_set_num_threads(int(o.threads));
#endif
  }
  try {
    cf::cuda::check_device(o.device, "cf-bench");
    g_device = o.device;
    if (o.cmd == "allreduce" || o.cmd == "ddp") {
      if (!o.device.is_cpu()) throw cf::ValueError("[cf-bench " + o.cmd + "] measures the CPU (MPI) path only");
      cf::dist::init();
      json rows;
      if (o.cmd == "allreduce") {
        rows = cf::bench::allreduce_rows(o.sizes_given ? o.sizes : std::vector<int64_t>{8, 1024, 65536, 1048576, 16777216},
                                         o.repeat);
      } else {
        cf::bench::DdpBenchOptions d;
        d.variants = o.variants;
        if (o.sizes_given) d.sizes = o.sizes;
        if (o.batch_size_given) d.batch_size = o.batch_size;
        d.repeat = o.repeat;
        rows = cf::bench::ddp_rows(d);
      }
      json out = report(o.cmd, rows);
      out["machine"]["processes"] = cf::dist::world_size();
      if (cf::dist::rank() == 0) std::cout << out.dump() << std::endl;
      cf::dist::finalize();
      return 0;
    }
    json out = o.cmd == "overhead"      ? bench_overhead(o)
               : o.cmd == "matmul"      ? bench_matmul(o)
               : o.cmd == "attention"   ? bench_attention(o)
               : o.cmd == "model"       ? bench_model(o)
               : o.cmd == "kmeans"      ? bench_kmeans(o)
                                        : bench_elementwise(o);
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "cf-bench " << o.cmd << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
