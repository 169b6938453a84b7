#pragma once
// cf-bench's shared pieces (apps/bench/main.cpp reads the command line; one
// file per subcommand measures): the options, the device every timed call
// synchronises with, and the report every subcommand prints: ONE JSON object
// {"bench": NAME, "machine": {...}, "results": [ROW, ...]} where a ROW has
// "name", "params" and numeric fields named with their unit (time_s,
// peak_bytes, gflops, gbps, ns_per_op, ...) and ratios ratio_vs_<baseline>
// measured in the same run (../shared/DESIGN.md, benchmarks; README "Benchmarks:
// cf-bench" says which way each ratio reads).
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cf.h"
#include "common/attention_bench.h"
#include "common/cli.h"
#include "common/precision.h"
#include "common/report.h"
#include "nn/clustering/kmeans.h"

namespace cf::bench {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using cf::apps::bench_attention_options;
using cf::apps::median;
using cf::apps::seconds_since;
using cf::apps::UsageError;

// Every subcommand's options (each reads its own; main.cpp declares which).
// repeat and threads: -1 is the subcommand's / the runtime's choice; max_gib:
// NaN is half of this machine's memory.
struct BenchOptions {
  std::string cmd;
  cf::Device device = cf::Device::cpu();
  std::vector<std::string> variants = {"full"};
  bool causal = false;
  double max_gib = std::numeric_limits<double>::quiet_NaN();
  int64_t repeat = -1;
  int64_t threads = -1;
  int64_t iters = 2000;
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  std::vector<int64_t> batch = {64, 128};
  int64_t numel = int64_t(1) << 24;
  int64_t batch_size = 8;
  int64_t kmeans_n = 100000;
  std::vector<int64_t> kmeans_dims = {64, 256};
  std::vector<int64_t> kmeans_ks = {256, 1024};
  int64_t block_rows = cf::nn::KMeansOptions{}.block_rows;
  int64_t lloyd_iters = 5;
  bool elkan = false;
  std::string precision = "fp32";
  std::string cpu_isa;     // --cpu-isa: empty leaves CF_CPU_ISA's (or auto)
  int64_t topk = 32;       // select: k of the top-k rows
  int64_t clusters = 100;  // select: clusters of the Hamming K-Means rows
  double attention_dropout = 0.0;  // attention: weight dropout of the variants that have it, in training
  bool cuda_graph = false;         // model: also time the training step captured as a CUDA graph
};

// While alive, OpenBLAS runs with as many threads as cf's kernels: the
// raw-BLAS baseline at its own best. cf's next matmul puts it back to 1 thread.
// (matmul and kmeans baselines)
struct RawBlasThreads {
  RawBlasThreads() {
    openblas_set_num_threads(cf::get_num_threads());
  }
  ~RawBlasThreads() { openblas_set_num_threads(1); }
};

// --precision: the autocast / operand dtype, or nullopt for fp32.
std::optional<cf::DType> low_dtype(const BenchOptions& o);
const char* dtype_label(const BenchOptions& o);

// The device every benchmark runs on (--device); timed calls end with a
// synchronisation there, so a time covers the work, not just its launch.
extern cf::Device g_device;
void device_sync();

// Median wall time of `reps` calls of f, after one warm-up call
// (apps/common/attention_bench.h, shared with cf-efficiency).
double time_median(int64_t reps, const std::function<void()>& f);

// {"bench": name, "machine": {...}, "results": results}
json report(const std::string& name, json results);

// cf-bench attention's rows beyond the registry's variants (attention.cpp):
// the centroid attention layer (centroid, centroid-knn) and the bench-only
// full-dense and block rows.
bool is_centroid_variant(const std::string& v);
bool is_bench_only(const std::string& v);

// The subcommands, one file each.
json bench_overhead(const BenchOptions& o);
json bench_matmul(const BenchOptions& o);
json bench_elementwise(const BenchOptions& o);
json bench_attention(const BenchOptions& o);
json bench_model(const BenchOptions& o);
json bench_kmeans(const BenchOptions& o);
json bench_select(const BenchOptions& o);
json bench_cpu_isa(const BenchOptions& o);

}  // namespace cf::bench
