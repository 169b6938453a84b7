// cf-bench: micro-benchmarks of the cf CPU and CUDA backends, one subcommand
// each (one file each: overhead.cpp, matmul.cpp, ...; allreduce and ddp in
// dist_bench.cpp), every one printing one JSON report (bench.h). This file
// reads the command line: the shared option table (so --config works as in
// every app), each subcommand declaring the options it reads.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/dist_bench.h"
#include "kernels/common/cpu_isa.h"
#include "common/options.h"
#include "common/report.h"

using cf::bench::BenchOptions;
using cf::bench::json;
using cf::apps::UsageError;

namespace {

const char* kOverview = R"(usage: cf-bench <subcommand> [options]

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
  kmeans        K-Means on N random float32 points: GFLOP/s of the assignment
                step (blocked GEMM + argmin, buffers reused as in Lloyd's loop)
                vs one cblas_sgemm of the same (N,d) x (d,k) product, and the
                time of one full Lloyd iteration (assignment + update)
  select        clustered attention's selection steps: top-k of k float32 scores
                among N per line (random and rising lines) vs std::partial_sort
                of (value, position) pairs, and Hamming K-Means of N 63-bit codes
                per row (10 steps) vs the CPU kernel's scalar form
  cpu-isa       the CPU instruction tiers of the row helpers (baseline SSE2, avx2,
                avx512: those this CPU runs) on softmax rows of N and flash
                attention forward + backward (N tokens, 4 heads of 16) and the
                sparse top-32 products of improved clustered attention, each
                against the baseline tier, with same_bits_as_baseline
  allreduce     under mpirun -np W: GB/s of cf::dist::all_reduce (float32 sum,
                with and without its cross-rank descriptor check) vs a raw
                MPI_Allreduce on the same buffer, in the same run
  ddp           under mpirun -np W: one training step (forward, backward, AdamW)
                of a 2-layer encoder classifier, one process on the global batch
                (rank 0 alone) vs W DDP processes on 1/W each, and DDP with
                no_sync (no communication); scaling_efficiency = t_one / (W t_ddp)

Attention variants (--variants): comma-separated names, or all; the registered
ones, known: __VARIANTS__;
and, in cf-bench attention only (skipped under --causal and --attention-dropout),
the N -> N/4 centroid attention layer (not a q, k, v variant): centroid,
centroid-knn (K = 40), on x (1, N, 256); attention only too: full-dense, full
attention through the dense (B, H, N, N) path (nn::dense_attention), beside the
fused "full"; block, the gathered block attention alone (random order, sqrt(N)
blocks, each seeing itself and the previous one). A registered name takes option
overrides after colons, on top of the benchmark's defaults for it, e.g.
improved-clustered:centroid_path=dense or clustered:clusters=200:bits=32: the
options its header lists under Options, numbers and true/false read as such,
anything else as a string.

--precision bf16|fp16: matmul: the operands are bfloat16/float16 (float32
accumulation); the CPU baseline stays cblas_sgemm on float32 copies (the ratio
says what the 16-bit path costs against float32 sgemm), the CUDA baseline
becomes a direct cublasGemmStridedBatchedEx in the same dtype. attention and
model run under cf::AutocastGuard (q, k, v in the 16-bit dtype for attention);
a variant with a part that has no 16-bit path yet gets a row whose "skipped"
(attention: "backward_skipped" when only its backward lacks one) is the error's
message, and the other variants still run.

On CUDA (--device cuda), every timed call ends with a device synchronisation;
the baselines become a direct cuBLAS strided-batched SGEMM (matmul, kmeans) and
a device-to-device cudaMemcpy (elementwise), timed in the same run.
)";

// The options every subcommand reads.
void add_common(cf::apps::Options& o, BenchOptions& b, std::string& device) {
  o.add_int("repeat", &b.repeat, 1,
            "timed repetitions per row; the median is reported (default: overhead 201 samples, attention 3 "
            "(1 at N >= 8192), model 5 (2 at N >= 2048), matmul 21 / 7 / 5 by size, allreduce 7, others 5)");
  o.add_int("threads", &b.threads, 1,
            "threads of cf's OpenMP team and of the raw-BLAS baselines, at most 1024 (default: the runtime's "
            "choice)",
            /*max_value=*/1024);
  o.add_string("device", &device, "cpu or cuda[:i]");
  o.add_string("cpu_isa", &b.cpu_isa,
               "CPU instruction tier of cf's vectorised loops (softmax and attention rows, sparse products): auto "
               "(the best this CPU runs), baseline, avx2 or avx512 "
               "(default: CF_CPU_ISA's, else auto)");
}
void add_precision(cf::apps::Options& o, BenchOptions& b) {
  o.add_string("precision", &b.precision, "fp32, bf16 or fp16 (see cf-bench --help)");
}
void add_variants(cf::apps::Options& o, BenchOptions& b) {
  o.add_string_list("variants", &b.variants, "attention variants, comma-separated, or all (see cf-bench --help)",
                    /*distinct=*/true);
  o.add_alias("variant", "variants");
}

struct Subcommand {
  const char* name;
  void (*add)(cf::apps::Options&, BenchOptions&);  // its own options, defaults set
  json (*run)(const BenchOptions&);                // nullptr: allreduce and ddp (MPI, below)
};

const std::vector<Subcommand> kSubcommands = {
    {"overhead",
     [](cf::apps::Options& o, BenchOptions& b) { o.add_int("iters", &b.iters, 1, "ops per timed sample"); },
     cf::bench::bench_overhead},
    {"matmul",
     [](cf::apps::Options& o, BenchOptions& b) {
       o.add_int_list("sizes", &b.sizes, 1, "square sizes");
       o.add_int_list("batch", &b.batch, 0, "the batched case B,N: B x (N x N x N); 0,0 skips it");
       add_precision(o, b);
     },
     cf::bench::bench_matmul},
    {"elementwise",
     [](cf::apps::Options& o, BenchOptions& b) {
       o.add_int("numel", &b.numel, 1024, "elements per tensor, a multiple of 1024 (softmax rows)");
     },
     cf::bench::bench_elementwise},
    {"attention",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = {512, 1024, 2048, 4096, 8192, 16384};
       add_variants(o, b);
       o.add_int_list("sizes", &b.sizes, 1, "sequence lengths");
       o.add_flag("causal", &b.causal, "causal masking");
       o.add_number("attention_dropout", &b.attention_dropout,
                    "attention-weight dropout in [0, 1) inside every variant's attention, timed in training mode "
                    "(default 0)");
       o.add_number("max_gib", &b.max_gib,
                    "skip a dense row whose score matrices would need more than X GiB (default: half of this "
                    "machine's memory)");
       add_precision(o, b);
     },
     cf::bench::bench_attention},
    {"model",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = {128, 512, 2048};
       add_variants(o, b);
       o.add_int_list("sizes", &b.sizes, 1, "sequence lengths");
       o.add_int("batch_size", &b.batch_size, 1, "sequences per step");
       add_precision(o, b);
       o.add_flag("cuda_graph", &b.cuda_graph,
                  "also time the training and inference steps captured once as CUDA graphs and replayed "
                  "(core/cuda_graph.h; --device cuda only): train_graph_* and infer_graph_* fields, or *_skipped "
                  "with the reason");
     },
     cf::bench::bench_model},
    {"kmeans",
     [](cf::apps::Options& o, BenchOptions& b) {
       o.add_int("n", &b.kmeans_n, 1, "points");
       o.add_int_list("dims", &b.kmeans_dims, 1, "feature sizes d");
       o.add_int_list("ks", &b.kmeans_ks, 1, "cluster counts k");
       o.add_int("block_rows", &b.block_rows, 1, "rows per assignment block (KMeansOptions's default)");
       o.add_int("iters", &b.lloyd_iters, 2,
                 "Lloyd iterations run, at least 2 (the first interval holds the setup); the median iteration "
                 "time is reported");
       o.add_flag("elkan", &b.elkan, "also time an iteration of Elkan's variant (N x k float64 bounds in memory)");
     },
     cf::bench::bench_kmeans},
    {"select",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = {512, 4096};
       o.add_int_list("sizes", &b.sizes, 1, "scores per top-k line and codes per K-Means row (N)");
       o.add_int("topk", &b.topk, 1, "k of the top-k rows");
       o.add_int("clusters", &b.clusters, 1, "clusters of the Hamming K-Means rows");
     },
     cf::bench::bench_select},
    {"cpu-isa",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = {512, 2048};
       o.add_int_list("sizes", &b.sizes, 1, "softmax row length and attention sequence length (N)");
     },
     cf::bench::bench_cpu_isa},
    {"allreduce",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = {8, 1024, 65536, 1048576, 16777216};
       o.add_int_list("sizes", &b.sizes, 1, "message sizes in bytes");
     },
     nullptr},
    {"ddp",
     [](cf::apps::Options& o, BenchOptions& b) {
       b.sizes = cf::bench::DdpBenchOptions{}.sizes;
       b.batch_size = cf::bench::DdpBenchOptions{}.batch_size;
       o.add_int_list("sizes", &b.sizes, 1, "sequence lengths");
       o.add_int("batch_size", &b.batch_size, 1, "global batch, a multiple of W");
       add_variants(o, b);
     },
     nullptr},
};

// The registered attention variants, as --help lists them.
std::string known_variants() {
  std::string known;
  for (const std::string& t : cf::nn::attention_types()) known += (known.empty() ? "" : ", ") + t;
  return known;
}

// cf-bench --help: the overview, then every subcommand's options.
std::string overview() {
  std::string text = kOverview;
  const std::string key = "__VARIANTS__";
  text.replace(text.find(key), key.size(), known_variants());
  BenchOptions defaults;
  std::string device = "cpu";
  cf::apps::Options common;
  add_common(common, defaults, device);
  text += "\nOptions of every subcommand:\n" + common.table();
  for (const Subcommand& s : kSubcommands) {
    BenchOptions b;
    cf::apps::Options o;
    s.add(o, b);
    text += "\ncf-bench " + std::string(s.name) + " options:\n" + o.table();
  }
  return text + "\nEvery subcommand also takes --config FILE (a JSON object with any of its options, '-' as\n'_'; "
                "the command line wins; unknown keys are errors) and -h, --help.\n";
}

// Full attention first when listed: every other row's ratio_vs_full divides by its time in the same
// run (listed after them, 'all' in the registry's alphabetical order, cluster-former and clustered got
// no ratio).
void full_first(std::vector<std::string>& variants) {
  std::stable_partition(variants.begin(), variants.end(), [](const std::string& v) { return v == "full"; });
}

// --variants after the table: 'all' expanded, every name checked, full first.
void check_variants(const std::string& cmd, BenchOptions& b) {
  const std::vector<std::string> known = cf::nn::attention_types();
  if (b.variants.size() == 1 && b.variants[0] == "all") {
    // every registry variant, and for attention the centroid layers and bench-only rows
    b.variants = known;
    if (cmd == "attention")
      for (const char* extra : {"centroid", "centroid-knn", "full-dense", "block"}) b.variants.push_back(extra);
    full_first(b.variants);
    return;
  }
  for (const std::string& v : b.variants) {
    if (v.find(':') != std::string::npos) {  // a registered type with option overrides
      if (std::find(known.begin(), known.end(), cf::apps::variant_type(v)) == known.end())
        throw UsageError("--variants: unknown attention variant '" + cf::apps::variant_type(v) + "' in '" + v + "'");
      try {
        cf::apps::variant_overrides(v);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string("--variants: ") + e.what());
      }
      continue;
    }
    if (std::find(known.begin(), known.end(), v) == known.end() &&
        !((cf::bench::is_centroid_variant(v) || cf::bench::is_bench_only(v)) && cmd == "attention"))
      throw UsageError("--variants: unknown attention variant '" + v + "'" +
                       (cf::bench::is_centroid_variant(v) || cf::bench::is_bench_only(v)
                            ? " for cf-bench " + cmd + " (only cf-bench attention runs it)"
                            : std::string()));
  }
  full_first(b.variants);
}

// Reads argv: false after --help (printed).
bool parse(int argc, char** argv, std::string& cmd, BenchOptions& b) {
  if (argc < 2) throw UsageError("missing subcommand");
  cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") {
    std::cout << overview();
    return false;
  }
  const Subcommand* sub = nullptr;
  for (const Subcommand& s : kSubcommands)
    if (cmd == s.name) sub = &s;
  if (!sub) throw UsageError("unknown subcommand '" + cmd + "'");
  std::string device = "cpu";
  cf::apps::Options o("usage: cf-bench " + cmd + " [options]\n\n(cf-bench --help describes every subcommand)\n");
  add_common(o, b, device);
  sub->add(o, b);
  try {
    if (!o.parse(argc, argv, 2)) return false;
  } catch (const UsageError& e) {
    // Name the subcommand: the option may well belong to another one.
    const std::string what = e.what();
    if (what.rfind("unknown option", 0) == 0) throw UsageError(what + " for subcommand " + cmd);
    throw;
  }
  b.device = cf::apps::parse_device(device);  // a usage error (status 2) as in every app, GPU absent too
  if (!b.cpu_isa.empty()) {
    try {
      cf::kernels::set_cpu_isa(cf::kernels::parse_cpu_isa(b.cpu_isa, "--cpu-isa"));
    } catch (const cf::Error& e) {
      throw UsageError(e.what());
    }
  }
  if (cmd == "attention" || cmd == "model" || cmd == "ddp") check_variants(cmd, b);
  if (b.cuda_graph && !b.device.is_cuda()) throw UsageError("--cuda-graph needs --device cuda");
  if (b.precision != "fp32" && b.precision != "bf16" && b.precision != "fp16")
    throw UsageError("--precision must be fp32, bf16 or fp16, got '" + b.precision + "'");
  if (!std::isnan(b.max_gib) && !(b.max_gib > 0)) throw UsageError("--max-gib must be positive");
  if (!(b.attention_dropout >= 0 && b.attention_dropout < 1))
    throw UsageError("--attention-dropout must be in [0, 1), got " + cf::apps::fmt(b.attention_dropout, "%g"));
  if (b.batch.size() != 2) throw UsageError("--batch expects B,N (two integers)");
  if (b.numel % 1024 != 0) throw UsageError("--numel must be a multiple of 1024 (softmax rows)");
  return true;
}

// allreduce and ddp: MPI, one JSON line from rank 0.
int run_distributed(const std::string& cmd, const BenchOptions& b) {
  if (!b.device.is_cpu()) throw cf::ValueError("[cf-bench " + cmd + "] measures the CPU (MPI) path only");
  cf::dist::init();
  json rows;
  if (cmd == "allreduce") {
    rows = cf::bench::allreduce_rows(b.sizes, b.repeat);
  } else {
    cf::bench::DdpBenchOptions d;
    d.variants = b.variants;
    d.sizes = b.sizes;
    d.batch_size = b.batch_size;
    d.repeat = b.repeat;
    rows = cf::bench::ddp_rows(d);
  }
  json out = cf::bench::report(cmd, rows);
  out["machine"]["processes"] = cf::dist::world_size();
  if (cf::dist::rank() == 0) std::cout << out.dump() << std::endl;
  cf::dist::finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cmd;
  BenchOptions b;
  const int rc = cf::apps::parse_command_line("cf-bench", [&] { return parse(argc, argv, cmd, b); });
  if (rc >= 0) return rc;
  if (b.threads > 0) cf::set_num_threads(b.threads);  // (1024 at most: parse checked)
  try {
    cf::cuda::check_device(b.device, "cf-bench");
    cf::bench::g_device = b.device;
    if (cmd == "allreduce" || cmd == "ddp") return run_distributed(cmd, b);
    for (const Subcommand& s : kSubcommands)
      if (cmd == s.name) std::cout << s.run(b).dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "cf-bench " << cmd << ": " << e.what() << "\n";
    return 1;
  }
  if (!std::cout) {  // the JSON is the product: a failed write (full disk, closed pipe) is an error
    std::cerr << "cf-bench " << cmd << ": writing the results to stdout failed\n";
    return 1;
  }
  return 0;
}
