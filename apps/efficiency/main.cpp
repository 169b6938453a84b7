// cf-efficiency: training and inference time and peak memory versus sequence
// length for every registered attention variant, in one model: the ClusterFormer
// paper's Figures 3-4 and Table 7 (Wang et al., "Neural clustering attention":
// time per batch and memory versus length on 20NEWS classification) and the
// speed/memory benchmark of Fast Transformers with Clustered Attention (Vyas et
// al. 2020, supplementary). Each (variant, N) builds the same Transformer encoder
// classifier as `cf-bench model` (apps/common/attention_bench.h: the same
// per-variant options scaled by N, the same timing and memory guard) and
// measures one training step (forward, backward, AdamW) and one inference step
// (forward under NoGradGuard): median wall time over --repeat calls after
// --warmup calls, and the allocator's peak bytes. Ratios to full attention are
// taken within the same seed and run. Output: JSON lines on stdout, a final
// summary line, Markdown tables on stderr, CSV files, a gnuplot script and (when
// gnuplot is installed) PNG plots in --out-dir.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cf.h"
#include "common/attention_bench.h"
#include "common/cli.h"
#include "common/options.h"
#include "common/precision.h"
#include "common/report.h"
#include "nn/train/progress.h"

using json = nlohmann::ordered_json;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-efficiency [options]

Training and inference time and peak memory versus sequence length for every
attention variant (ClusterFormer paper, Figures 3-4 and Table 7; Fast
Transformers with Clustered Attention, speed/memory benchmark). For each
sequence length N and variant it builds a Transformer encoder classifier on
random tokens (token embedding + sinusoidal positions, post-LN layers, ReLU,
mean pooling, linear head, cross-entropy; the model of 'cf-bench model') and
measures
  train: one step of forward, backward and AdamW (auxiliary clustering losses
         included with weight 1), and
  infer: one forward in eval mode under no-grad,
Peak memory: the peak bytes of cf's allocator on the device during one step
of each mode, with that model the only one alive: parameters, gradients,
AdamW state and activations for train, as a GPU memory figure would count
them; parameters and activations for infer (the train step's gradients and
AdamW state are freed first).
Time: the median wall time of --repeat calls after --warmup calls, with the
models of every variant at that N alive and their calls interleaved
round-robin, so that a change in the machine's load hits every variant alike.
Every variant's time and peak memory is also given as a ratio to full
attention at the same N and seed, measured in the same run.
--precision bf16|fp16 runs both steps under autocast (matmuls in that dtype,
softmax, norms and the loss in float32, parameters and AdamW state in float32;
no loss scaling: a step's time is measured, not its convergence). A variant
with a part that has no 16-bit path yet is reported as skipped with the
error's message; the others still run.

Variant options follow the papers' efficiency settings, scaled by N (shared
with 'cf-bench attention'): lsh 8 hashes, buckets of 64 (2N/64 buckets);
routing sqrt(N) clusters; clustered C = 100; improved-clustered C = 100, top-32
keys; cluster-former 64 clusters, chunks of 256, a bank of 16384 states (no
K-Means inside the timing); neural-clustering k = sqrt(N) (ClusterFormer App. E).

Output: one JSON line per measurement on stdout ("event": "measure" or
"skip"), a final {"event": "summary", ...} line, Markdown tables of the ratios
on stderr, and in --out-dir:
  efficiency.csv        one row per (seed, variant, N, mode), skipped rows noted
  efficiency_summary.csv  mean and spread over the seeds, ratios to full
  plot_data.csv         the means in wide form, one column per variant
  efficiency.gp         gnuplot script: time and memory versus N (log-log)
  efficiency_time.png, efficiency_memory.png  when gnuplot is installed (else
                        a note; run 'gnuplot efficiency.gp' in --out-dir later;
                        Debian package gnuplot-nox)
Files are written to a temporary name and renamed: a rerun into the same folder
replaces them whole, never leaves half a file. A benchmark has no training state
worth keeping, so there are no checkpoints and no resume (DESIGN.md's checkpoint
rule is for training apps): a run repeats every measurement.
)";
// The variant list is the registry's (--variants defaults to it), kept on one
// line: app_test.cmake reads it back from --help.
std::string exit_status() {
  std::string out;
  for (const std::string& v : cf::nn::attention_types()) out += (out.empty() ? "" : ", ") + v;
  return "--variants defaults to every registered one: " + out +
         ".\n\nExit status: 0 done, 1 failure, 2 bad command line.\n";
}

struct Config {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048, 4096};
  std::vector<std::string> variants;  // empty: every registered one
  int64_t batch_size = 1;
  int64_t d_model = 64, n_heads = 2, n_layers = 2, d_ff = 128, vocab = 1000, classes = 10;
  int64_t repeat = 5, warmup = 1, threads = 0;
  double max_gib = 0;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
  std::string out_dir = "efficiency-out";
  bool plots = true;
  std::string precision = "fp32";  // fp32 | bf16 | fp16: the autocast dtype of the timed steps
};

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Parses argv (and --config); false for --help. Cross-field rules are UsageErrors.
bool parse_config(int argc, char** argv, Config& c) {
  cf::apps::Options opts(kUsage, exit_status());
  opts.section("Sizes");
  opts.add_int_list("sizes", &c.sizes, 2, "sequence lengths N", /*distinct=*/true);
  opts.add_string_list("variants", &c.variants,
                       "attention variants, comma-separated (default: every registered one, below); full is "
                       "measured first at each N (ratios need it)", /*distinct=*/true);
  opts.add_int("batch_size", &c.batch_size, 1, "sequences per step");
  opts.section("Model");
  opts.add_int("d_model", &c.d_model, 1, "model width");
  opts.add_int("n_heads", &c.n_heads, 1, "attention heads");
  opts.add_int("n_layers", &c.n_layers, 1, "encoder layers");
  opts.add_int("d_ff", &c.d_ff, 1, "feed-forward width");
  opts.add_int("vocab", &c.vocab, 2, "token vocabulary of the random sequences");
  opts.add_int("classes", &c.classes, 2, "classes of the linear head");
  opts.section("Measurement");
  opts.add_int("repeat", &c.repeat, 1, "timed calls per measurement; the median is reported");
  opts.add_int("warmup", &c.warmup, 0, "untimed calls before them");
  opts.add_int("threads", &c.threads, 0,
               "threads of cf's OpenMP team, at most 1024; 0: the runtime's choice. On a machine shared with "
               "other busy processes, 1 gives far steadier times (a preempted thread stalls a whole team)",
               /*max_value=*/1024);
  opts.add_string("precision", &c.precision,
                  "fp32, or bf16 / fp16: the training and inference steps run under autocast (matmuls in that "
                  "dtype, softmax, norms and the loss in float32, float32 parameters); a variant without a "
                  "16-bit path is reported as skipped");
  opts.add_number("max_gib", &c.max_gib,
                  "skip a dense-attention measurement whose score matrices would need more than X GiB (about 6 "
                  "per layer of (B, H, N, N) float32 matrices to train, 3 to infer); 0: half of this machine's "
                  "memory. No registered variant builds them any more (full attention runs the fused kernel, "
                  "O(N d) memory), so it skips nothing today; it stays for configs that set it");
  opts.section("Runs");
  opts.add_seeds(&c.seeds, "weights and tokens");
  opts.add_string("device", &c.device,
                  "cpu or cuda[:i]; a variant that fails there is reported as skipped with its error");
  opts.add_string("out_dir", &c.out_dir, "where the CSV, script and plots go");
  opts.add_bool("plots", &c.plots, "run gnuplot when it is installed");
  if (!opts.parse(argc, argv)) return false;

  if (c.sizes.empty()) throw UsageError("--sizes must list at least one sequence length");
  const std::vector<std::string> known = cf::nn::attention_types();
  if (c.variants.empty()) c.variants = known;
  std::vector<std::string> ordered;  // full first (the ratios' baseline), then the given order, no duplicates
  for (const std::string& v : c.variants) {
    if (std::find(known.begin(), known.end(), v) == known.end())
      throw UsageError("--variants: unknown attention variant '" + v + "' (known: " + join(known, ", ") + ")");
    if (std::find(ordered.begin(), ordered.end(), v) == ordered.end() && v != "full") ordered.push_back(v);
  }
  if (std::find(c.variants.begin(), c.variants.end(), "full") != c.variants.end())
    ordered.insert(ordered.begin(), "full");
  c.variants = ordered;
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + std::to_string(c.d_model) + ") must be divisible by --n-heads (" +
                     std::to_string(c.n_heads) + ")");
  if (c.max_gib < 0) throw UsageError("--max-gib must be positive, or 0 for half of this machine's memory");
  if (c.out_dir.empty()) throw UsageError("--out-dir must not be empty");
  cf::apps::check_precision(c.precision);
  return true;
}

// Writes `text` to `path` through a temporary file in the same folder and a
// rename, so that `path` is always either the old file or the whole new one.
void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw cf::IOError("[cf-efficiency] cannot write '" + tmp + "'");
    f << text;
    f.flush();
    if (!f) throw cf::IOError("[cf-efficiency] writing '" + tmp + "' failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw cf::IOError("[cf-efficiency] cannot rename '" + tmp + "' to '" + path + "'");
  }
}

// True when an executable `name` is on PATH.
bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string p = path;
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    if (colon == std::string::npos) colon = p.size();
    std::string dir = p.substr(start, colon - start);
    if (dir.empty()) dir = ".";
    if (::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    start = colon + 1;
  }
  return false;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}


// A CSV number: empty when not measured.
std::string csv_num(double x, const char* f = "%.6g") { return std::isfinite(x) ? cf::apps::fmt(x, f) : ""; }

std::string csv_text(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch == '\n' ? ' ' : ch);
  return out + "\"";
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// One measurement (or the reason there is none).
struct Row {
  int64_t seed = 0, n = 0;
  std::string variant, mode;  // mode: train | infer
  bool ok = false;
  std::string note;  // why skipped
  double time_s = kNaN, peak_bytes = kNaN;
  double time_ratio = kNaN, peak_ratio = kNaN;  // to full at the same (seed, N, mode)
  std::vector<double> samples;
};

// The gnuplot script: two PNGs (time and peak memory versus N, train and infer
// side by side, log-log), each drawn to a temporary name that the app renames.
std::string gnuplot_script(const std::vector<std::string>& variants, const std::string& tmp_suffix) {
  std::ostringstream g;
  g << "# cf-efficiency: time and peak memory versus sequence length (run in the output folder:\n"
       "#   gnuplot efficiency.gp). Data: plot_data.csv (written by cf-efficiency).\n"
       "variants = \""
    << join(variants, " ") << "\"\n"
    << "V = words(variants)\n"
       "suffix = \""
    << tmp_suffix << "\"  # cf-efficiency renames the PNGs when done; empty when run by hand\n"
       "set datafile separator \",\"\n"
       "set datafile missing \"NaN\"\n"
       "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
       "  set terminal pngcairo size 1200,480 enhanced font \",10\"\n"
       "} else {\n"
       "  set terminal png size 1200,480\n"
       "}\n"
       "set logscale x 2\n"
       "set logscale y 10\n"
       "set format y \"%g\"\n"
       "set key top left\n"
       "set grid\n"
       "set xlabel \"sequence length N\"\n"
       "# plot_data.csv columns: n, then V columns each of train_time_s, infer_time_s, train_peak_mib, infer_peak_mib\n"
       "set output \"efficiency_time.png\".suffix\n"
       "set multiplot layout 1,2 title \"cf-efficiency: time per step versus N\"\n"
       "set ylabel \"train step time (s)\"\n"
       "plot for [i=1:V] \"plot_data.csv\" using 1:(column(1+i)) skip 1 with linespoints title word(variants,i)\n"
       "set ylabel \"inference step time (s)\"\n"
       "plot for [i=1:V] \"plot_data.csv\" using 1:(column(1+V+i)) skip 1 with linespoints title word(variants,i)\n"
       "unset multiplot\n"
       "set output \"efficiency_memory.png\".suffix\n"
       "set multiplot layout 1,2 title \"cf-efficiency: peak memory versus N\"\n"
       "set ylabel \"train peak memory (MiB)\"\n"
       "plot for [i=1:V] \"plot_data.csv\" using 1:(column(1+2*V+i)) skip 1 with linespoints title word(variants,i)\n"
       "set ylabel \"inference peak memory (MiB)\"\n"
       "plot for [i=1:V] \"plot_data.csv\" using 1:(column(1+3*V+i)) skip 1 with linespoints title word(variants,i)\n"
       "unset multiplot\n"
       "set output\n";
  return g.str();
}

// One variant at one (seed, N): its train and infer rows, its attention
// options and, during the timing pass, its model.
struct Slot {
  std::string variant;
  nlohmann::json options;
  Row rows[2];  // train, infer
  std::unique_ptr<cf::apps::EncoderBench> model;
};

// The model measured at (seed, N), its shape, batch and device from the options.
std::unique_ptr<cf::apps::EncoderBench> make_model(const Config& cfg, cf::Device dev, int64_t seed, int64_t n,
                                                   const std::string& variant) {
  cf::apps::EncoderBenchConfig bc;
  bc.variant = variant;
  bc.n = n;
  bc.batch = cfg.batch_size;
  bc.layers = cfg.n_layers;
  bc.d_model = cfg.d_model;
  bc.heads = cfg.n_heads;
  bc.d_ff = cfg.d_ff;
  bc.vocab = cfg.vocab;
  bc.classes = cfg.classes;
  bc.seed = uint64_t(seed) * 1000003u + uint64_t(n);
  bc.device = dev;
  return std::make_unique<cf::apps::EncoderBench>(bc);
}

void emit_start(const Config& cfg, cf::Device dev, double max_gib) {
  cf::apps::emit({{"event", "start"},
                  {"sizes", cfg.sizes},
                  {"variants", cfg.variants},
                  {"seeds", cfg.seeds},
                  {"batch_size", cfg.batch_size},
                  {"model",
                   {{"d_model", cfg.d_model}, {"n_heads", cfg.n_heads}, {"n_layers", cfg.n_layers},
                    {"d_ff", cfg.d_ff}, {"vocab", cfg.vocab}, {"classes", cfg.classes}}},
                  {"repeat", cfg.repeat},
                  {"warmup", cfg.warmup},
                  {"precision", cfg.precision},
                  {"max_gib", max_gib},
                  {"device", dev.str()},
                  {"machine", cf::apps::machine_record()},
                  {"out_dir", cfg.out_dir}});
}

// Pass 1, memory: one model alive at a time, one step per mode; peak bytes
// counted from before the step (train: parameters, gradients, AdamW state,
// activations; infer: parameters and activations). Also where the memory guard, CUDA refusals and, under
// --precision bf16|fp16, variants without a 16-bit path are found.
void measure_memory(const Config& cfg, cf::Device dev, int64_t seed, int64_t n, double max_gib,
                    const std::string& variant, Slot& s) {
  s.variant = variant;
  s.options = cf::apps::bench_attention_options(s.variant, n);
  for (int k = 0; k < 2; ++k) {
    s.rows[k].seed = seed;
    s.rows[k].n = n;
    s.rows[k].variant = s.variant;
    s.rows[k].mode = k == 0 ? "train" : "infer";
  }
  // The memory guard of `cf-bench attention`, per layer for training (saved scores).
  if (cf::apps::is_dense_attention(s.variant)) {
    const double gib = cf::apps::dense_scores_gib(cfg.batch_size * cfg.n_heads, n);
    const double need[2] = {6 * gib * double(cfg.n_layers), 3 * gib};
    for (int k = 0; k < 2; ++k)
      if (need[k] > max_gib)
        s.rows[k].note = std::string(k == 0 ? "training" : "inference") + " needs about " +
                         cf::apps::fmt(need[k], "%.2f") + " GiB of attention scores > --max-gib " + cf::apps::fmt(max_gib,
                                       "%.2f");
  }
  try {
    if (s.rows[0].note.empty() || s.rows[1].note.empty()) {
      std::unique_ptr<cf::apps::EncoderBench> model = make_model(cfg, dev, seed, n, s.variant);
      const std::optional<cf::DType> low = cf::apps::precision_dtype(cfg.precision);
      cf::AutocastGuard autocast(low);
      for (int k = 0; k < 2; ++k) {
        if (!s.rows[k].note.empty()) continue;
        cf::apps::Measurement m;
        const std::optional<std::string> no_16bit = cf::apps::skip_without_16bit(
            low.has_value(), [&] { m = k == 0 ? model->measure_train(1, 0) : model->measure_infer(1, 0); });
        if (no_16bit) {
          s.rows[k].note = "no " + cfg.precision + " path: " + *no_16bit;
          continue;
        }
        s.rows[k].peak_bytes = double(m.peak_bytes);
        s.rows[k].ok = true;
      }
    }
  } catch (const std::exception& e) {
    // On CUDA, variants with CPU-only parts refuse with a clear error: a
    // skipped row, not a failed run. On the CPU an error is a failure.
    if (!dev.is_cuda()) throw;
    for (Row& r : s.rows) {
      r.ok = false;
      r.note = std::string("not available on ") + dev.str() + ": " + e.what();
    }
  }
}

// Pass 2, time: every runnable model alive, the timed calls interleaved
// round-robin over the variants (warm-up first), so that a change in the
// machine's load during the run hits every variant alike and the ratios
// to full, taken within each N, stay meaningful on a shared machine.
void measure_time(const Config& cfg, cf::Device dev, int64_t seed, int64_t n, std::vector<Slot>& slots,
                  cf::nn::ProgressBar& bar) {
  for (Slot& s : slots)
    if (s.rows[0].ok || s.rows[1].ok) s.model = make_model(cfg, dev, seed, n, s.variant);
  cf::AutocastGuard autocast(cf::apps::precision_dtype(cfg.precision));  // --precision, as in the memory pass
  for (int k = 0; k < 2; ++k) {
    for (Slot& s : slots) {
      if (!s.rows[k].ok) continue;
      s.model->set_training(k == 0);
      for (int64_t w = 0; w < cfg.warmup; ++w)
        cf::apps::time_once(dev, [&] { k == 0 ? s.model->train_step() : s.model->infer_step(); });
      bar.update(cfg.warmup);
    }
    for (int64_t r = 0; r < cfg.repeat; ++r)
      for (Slot& s : slots) {
        if (!s.rows[k].ok) continue;
        s.rows[k].samples.push_back(
            cf::apps::time_once(dev, [&] { k == 0 ? s.model->train_step() : s.model->infer_step(); }));
        bar.update(1);
      }
  }
  for (Slot& s : slots) s.model.reset();
}

// Medians, ratios to full at this (seed, N), one JSON line per row; the rows
// join `rows`.
void emit_rows(const Config& cfg, int64_t seed, int64_t n, std::vector<Slot>& slots, std::vector<Row>& rows) {
  std::map<std::string, std::pair<double, double>> full;  // mode -> (time, peak)
  for (Slot& s : slots) {
    for (Row& r : s.rows) {
      if (r.ok) r.time_s = cf::apps::median(r.samples);
      if (r.ok && s.variant == "full") full[r.mode] = {r.time_s, r.peak_bytes};
      auto f = full.find(r.mode);
      if (r.ok && f != full.end()) {
        r.time_ratio = r.time_s / f->second.first;
        r.peak_ratio = r.peak_bytes / f->second.second;
      }
      json j = {{"event", r.ok ? "measure" : "skip"}, {"seed", seed}, {"variant", s.variant}, {"n", n},
                {"mode", r.mode}, {"batch_size", cfg.batch_size}};
      if (r.ok) {
        j["time_s"] = r.time_s;
        j["time_s_samples"] = r.samples;
        j["tokens_per_s"] = double(cfg.batch_size * n) / r.time_s;
        j["peak_bytes"] = int64_t(r.peak_bytes);
        if (std::isfinite(r.time_ratio)) {
          j["time_ratio_vs_full"] = r.time_ratio;
          j["peak_ratio_vs_full"] = r.peak_ratio;
        }
        j["options"] = s.options;
      } else {
        j["reason"] = r.note;
      }
      cf::apps::emit(j);
      rows.push_back(r);
    }
  }
}

// Every (seed, N, variant, mode) measured, in that order.
std::vector<Row> measure_all(const Config& cfg, cf::Device dev, double max_gib) {
  std::vector<Row> rows;
  // Work units of the progress bar: per (seed, N, variant) one memory pass and
  // warmup + repeat timed calls per mode.
  const int64_t units_per_variant = 1 + 2 * (cfg.warmup + cfg.repeat);
  cf::nn::ProgressBarOptions po;
  po.total = int64_t(cfg.seeds.size() * cfg.sizes.size() * cfg.variants.size()) * units_per_variant;
  po.desc = "efficiency";
  po.unit = "step";
  cf::nn::ProgressBar bar(po);
  int64_t done_units = 0;
  for (int64_t seed : cfg.seeds) {
    for (int64_t n : cfg.sizes) {
      bar.set_field("seed", double(seed));
      bar.set_field("N", double(n));
      std::vector<Slot> slots(cfg.variants.size());
      for (size_t i = 0; i < slots.size(); ++i) {
        measure_memory(cfg, dev, seed, n, max_gib, cfg.variants[i], slots[i]);
        bar.update(1);
        ++done_units;
      }
      measure_time(cfg, dev, seed, n, slots, bar);
      done_units += int64_t(slots.size()) * (units_per_variant - 1);
      bar.set_count(done_units);
      emit_rows(cfg, seed, n, slots, rows);
    }
  }
  bar.finish();
  return rows;
}

// efficiency.csv: one line per row.
std::string rows_csv(const Config& cfg, const std::vector<Row>& rows) {
  std::ostringstream csv;
  csv << "seed,variant,n,batch_size,mode,status,time_s,tokens_per_s,peak_bytes,time_ratio_vs_full,"
         "peak_ratio_vs_full,note\n";
  for (const Row& r : rows) {
    csv << r.seed << "," << r.variant << "," << r.n << "," << cfg.batch_size << "," << r.mode << ","
        << (r.ok ? "ok" : "skipped") << "," << csv_num(r.time_s) << ","
        << csv_num(r.ok ? double(cfg.batch_size * r.n) / r.time_s : kNaN) << "," << csv_num(r.peak_bytes, "%.0f")
        << "," << csv_num(r.time_ratio) << "," << csv_num(r.peak_ratio)
        << "," << csv_text(r.note) << "\n";
  }
  return csv.str();
}

// The rows of one (variant, N, mode) over the seeds.
struct Agg {
  std::vector<double> time, peak, time_ratio, peak_ratio;
  std::string note;
};
using Aggregates = std::map<std::string, std::map<int64_t, std::map<std::string, Agg>>>;  // variant -> N -> mode

Aggregates aggregate(const std::vector<Row>& rows) {
  Aggregates agg;
  for (const Row& r : rows) {
    Agg& a = agg[r.variant][r.n][r.mode];
    if (!r.ok) {
      a.note = r.note;
      continue;
    }
    a.time.push_back(r.time_s);
    a.peak.push_back(r.peak_bytes);
    if (std::isfinite(r.time_ratio)) {
      a.time_ratio.push_back(r.time_ratio);
      a.peak_ratio.push_back(r.peak_ratio);
    }
  }
  return agg;
}

double mean_or_nan(const std::vector<double>& v) { return v.empty() ? kNaN : cf::apps::stats_of(v).mean; }

// The summary's table (JSON, returned), efficiency_summary.csv (`scsv`) and
// the skipped cells.
json summary_table(const Config& cfg, Aggregates& agg, std::ostringstream& scsv, std::vector<json>& skipped) {
  scsv << "variant,n,mode,seeds,time_s_mean,time_s_std,peak_bytes_mean,time_ratio_vs_full_mean,"
          "time_ratio_vs_full_std,peak_ratio_vs_full_mean,peak_ratio_vs_full_std,note\n";
  json table = json::object();
  for (const std::string& v : cfg.variants) {
    for (int64_t n : cfg.sizes) {
      for (const char* mode : {"train", "infer"}) {
        const Agg& a = agg[v][n][mode];
        const cf::apps::Stats t = cf::apps::stats_of(a.time), tr = cf::apps::stats_of(a.time_ratio),
                              pr = cf::apps::stats_of(a.peak_ratio);
        json cell;
        if (a.time.empty()) {
          cell["skipped"] = a.note;
          skipped.push_back({{"variant", v}, {"n", n}, {"mode", mode}, {"reason", a.note}});
        } else {
          cell["time_s_mean"] = t.mean;
          cell["time_s_std"] = t.std;
          cell["peak_bytes_mean"] = int64_t(std::llround(mean_or_nan(a.peak)));
          if (!a.time_ratio.empty()) {
            cell["time_ratio_vs_full_mean"] = tr.mean;
            cell["time_ratio_vs_full_std"] = tr.std;
            cell["peak_ratio_vs_full_mean"] = pr.mean;
            cell["peak_ratio_vs_full_std"] = pr.std;
          }
          if (!a.note.empty()) cell["note"] = a.note;
        }
        table[v][std::to_string(n)][mode] = cell;
        scsv << v << "," << n << "," << mode << "," << a.time.size() << "," << csv_num(a.time.empty() ? kNaN : t.mean)
             << "," << csv_num(a.time.empty() ? kNaN : t.std) << "," << csv_num(mean_or_nan(a.peak), "%.0f") << ","
             << csv_num(a.time_ratio.empty() ? kNaN : tr.mean) << "," << csv_num(a.time_ratio.empty() ? kNaN : tr.std)
             << "," << csv_num(a.peak_ratio.empty() ? kNaN : pr.mean) << ","
             << csv_num(a.peak_ratio.empty() ? kNaN : pr.std) << "," << csv_text(a.note) << "\n";
      }
    }
  }
  return table;
}

// plot_data.csv: n, then per variant train time, infer time, train MiB, infer MiB.
std::string plot_csv(const Config& cfg, Aggregates& agg) {
  std::ostringstream pcsv;
  pcsv << "n";
  for (const char* what : {"train_time_s", "infer_time_s", "train_peak_mib", "infer_peak_mib"})
    for (const std::string& v : cfg.variants) pcsv << "," << what << ":" << v;
  pcsv << "\n";
  for (int64_t n : cfg.sizes) {
    pcsv << n;
    for (int k = 0; k < 4; ++k)
      for (const std::string& v : cfg.variants) {
        const Agg& a = agg[v][n][k % 2 == 0 ? "train" : "infer"];
        double x = k < 2 ? mean_or_nan(a.time) : mean_or_nan(a.peak) / double(1 << 20);
        pcsv << "," << (std::isfinite(x) ? cf::apps::fmt(x, "%.6g") : std::string("NaN"));
      }
    pcsv << "\n";
  }
  return pcsv.str();
}

// The PNGs (when asked for and gnuplot is there), added to `files`; returns what
// happened, for the summary.
std::string draw_plots(const Config& cfg, const std::string& dir, std::vector<std::string>& files) {
  std::string plots;
  // PNGs of an earlier run in this folder would show other data: they go unless redrawn below.
  for (const char* png : {"efficiency_time.png", "efficiency_memory.png"}) std::remove((dir + png).c_str());
  if (!cfg.plots) {
    plots = "not drawn (--plots false); run 'gnuplot efficiency.gp' in " + cfg.out_dir;
  } else if (!on_path("gnuplot")) {
    plots = "gnuplot is not installed: no PNG plots; the CSV files and the script efficiency.gp are written; "
            "install gnuplot (Debian: apt-get install gnuplot-nox) and run 'gnuplot efficiency.gp' in " +
            cfg.out_dir;
    std::cerr << "cf-efficiency: note: " << plots << "\n";
  } else {
    const std::string suffix = ".tmp." + std::to_string(::getpid());
    write_atomic(dir + "plot.gp" + suffix, gnuplot_script(cfg.variants, suffix));
    const std::string cmd =
        "cd " + shell_quote(cfg.out_dir) + " && gnuplot " + shell_quote("plot.gp" + suffix) + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::remove((dir + "plot.gp" + suffix).c_str());
    bool ok = rc == 0;
    for (const char* png : {"efficiency_time.png", "efficiency_memory.png"}) {
      const std::string tmp = dir + png + suffix;
      if (ok && cf::apps::file_exists(tmp) && std::rename(tmp.c_str(), (dir + png).c_str()) == 0) {
        files.push_back(dir + png);
      } else {
        ok = false;
        std::remove(tmp.c_str());
      }
    }
    plots = ok ? "written" : "gnuplot failed (exit status " + std::to_string(rc) + "); the CSV files and efficiency.gp are written";
    if (!ok) std::cerr << "cf-efficiency: note: " << plots << "\n";
  }
  return plots;
}

// The Markdown tables for stderr: ratios to full per N.
std::string markdown(const Config& cfg, Aggregates& agg, const std::vector<json>& skipped) {
  std::ostringstream md;
  const bool have_full = std::find(cfg.variants.begin(), cfg.variants.end(), "full") != cfg.variants.end();
  auto header = [&](const std::string& title) {
    md << "\n" << title << "\n\n| variant |";
    for (int64_t n : cfg.sizes) md << " N=" << n << " |";
    md << "\n|---|";
    for (size_t i = 0; i < cfg.sizes.size(); ++i) md << "---:|";
    md << "\n";
  };
  const std::string spread = cfg.seeds.size() > 1 ? ", mean ± std over " + std::to_string(cfg.seeds.size()) + " seeds" : "";
  for (const char* mode : {"train", "infer"}) {
    const std::string what = (std::string(mode) == "train" ? "training step (forward + backward + AdamW)"
                                                            : "inference step (forward, no grad)") +
                             (cfg.precision == "fp32" ? std::string() : " under " + cfg.precision + " autocast");
    header("Time of one " + what + ": full in seconds, the others as a ratio to full" + spread);
    for (const std::string& v : cfg.variants) {
      md << "| " << v << " |";
      for (int64_t n : cfg.sizes) {
        const Agg& a = agg[v][n][mode];
        std::string cell = "skipped";
        if (!a.time.empty()) {
          if (v == "full") cell = cf::apps::fmt(cf::apps::stats_of(a.time).mean, "%.3g s");
          else if (!a.time_ratio.empty()) cell = cf::apps::fmt_stats(cf::apps::stats_of(a.time_ratio), "%.2f");
          else cell = cf::apps::fmt(cf::apps::stats_of(a.time).mean, "%.3g s");
        }
        md << " " << cell << " |";
      }
      md << "\n";
    }
    header("Peak memory of one " + what + ": full in MiB, the others as a ratio to full" + spread);
    for (const std::string& v : cfg.variants) {
      md << "| " << v << " |";
      for (int64_t n : cfg.sizes) {
        const Agg& a = agg[v][n][mode];
        std::string cell = "skipped";
        if (!a.peak.empty()) {
          if (v == "full") cell = cf::apps::fmt(mean_or_nan(a.peak) / double(1 << 20), "%.1f MiB");
          else if (!a.peak_ratio.empty()) cell = cf::apps::fmt_stats(cf::apps::stats_of(a.peak_ratio), "%.2f");
          else cell = cf::apps::fmt(mean_or_nan(a.peak) / double(1 << 20), "%.1f MiB");
        }
        md << " " << cell << " |";
      }
      md << "\n";
    }
  }
  if (!have_full) md << "\n(full attention was not in --variants: no ratios)\n";
  for (const json& s : skipped)
    md << "\nskipped: " << s["variant"].get<std::string>() << " N=" << s["n"].get<int64_t>() << " "
       << s["mode"].get<std::string>() << ": " << s["reason"].get<std::string>();
  if (!skipped.empty()) md << "\n";
  return md.str();
}

int run(const Config& cfg) {
  const auto t_start = std::chrono::steady_clock::now();
  const cf::Device dev = cf::apps::parse_device(cfg.device);
  if (cfg.threads > 0) cf::set_num_threads(cfg.threads);
  cf::apps::make_dir(cfg.out_dir, "cf-efficiency", "--out-dir");
  const double max_gib = cfg.max_gib > 0 ? cfg.max_gib : cf::apps::physical_gib() / 2;
  emit_start(cfg, dev, max_gib);
  const std::vector<Row> rows = measure_all(cfg, dev, max_gib);

  Aggregates agg = aggregate(rows);
  std::ostringstream scsv;
  std::vector<json> skipped;
  const json table = summary_table(cfg, agg, scsv, skipped);
  const std::string dir = cfg.out_dir + "/";
  write_atomic(dir + "efficiency.csv", rows_csv(cfg, rows));
  write_atomic(dir + "efficiency_summary.csv", scsv.str());
  write_atomic(dir + "plot_data.csv", plot_csv(cfg, agg));
  write_atomic(dir + "efficiency.gp", gnuplot_script(cfg.variants, ""));
  std::vector<std::string> files = {dir + "efficiency.csv", dir + "efficiency_summary.csv", dir + "plot_data.csv",
                                    dir + "efficiency.gp"};
  const std::string plots = draw_plots(cfg, dir, files);

  cf::apps::emit({{"event", "summary"},
                  {"sizes", cfg.sizes},
                  {"variants", cfg.variants},
                  {"seeds", cfg.seeds},
                  {"batch_size", cfg.batch_size},
                  {"device", dev.str()},
                  {"precision", cfg.precision},
                  {"table", table},
                  {"skipped", skipped},
                  {"files", files},
                  {"plots", plots},
                  {"total_time_s", cf::apps::seconds_since(t_start)}});
  std::cerr << markdown(cfg, agg, skipped) << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  return cf::apps::app_main(
      "cf-efficiency",
      [&] {
        if (!parse_config(argc, argv, cfg)) return false;
        cf::apps::parse_device(cfg.device);  // a bad device is a usage error (exit 2)
        return true;
      },
      [&] { return run(cfg); });
}
