// cf-kmeans: clusters the rows of a matrix read from a file (.npy, IDX images, raw
// float32) with cf's K-Means engine (nn/clustering/kmeans.h), prints one JSON line
// per Lloyd iteration and a final JSON summary, and writes the centroids and the
// assignments as .npy files. Without --input it clusters generated data with
// planted clusters and checks that they are recovered.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cf.h"
#include "core/json.h"
#include "common/distributed.h"
#include "common/cli.h"
#include "common/options.h"
#include "common/report.h"
#include "nn/clustering/kmeans.h"
#include "nn/data/npy.h"

using json = nlohmann::ordered_json;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-kmeans [--input FILE] [options]

Clusters the rows of a matrix with K-Means (Lloyd's algorithm, k-means++ or
random initialisation, L2 or cosine metric) and writes the centroids and the
cluster of each row. Prints one JSON line per iteration on stdout and a final
JSON summary (inertia, iterations, converged, ...). Without --input it clusters
generated data (--demo-n points around --k planted centres in --demo-d
dimensions) and reports the adjusted Rand index against the planted labels.

Input formats (--input):
  .npy   float32 or float64 (integer and float16 data are converted to --dtype), C order,
         little endian; an array of rank > 2 is flattened to (N, rest), rank 1
         is (N, 1)
  IDX    MNIST-format files (e.g. Fashion-MNIST images, plain or .gz), each
         item flattened to one row
  raw    little-endian float32 in C order, with --shape
)";
const char* kExitStatus = R"(Exit status: 0 done (demo: the planted clusters were recovered, ARI > 0.99),
1 failure (unreadable file, bad data, k > N, ...), 2 bad command line.
)";

struct Config {
  std::string input, format, dtype, labels, centroids, assignments, save_data, save_labels;
  std::vector<int64_t> shape;
  double scale = 1;
  int64_t k = 8, max_iter = 100, seed = 0, block_rows = 8192;
  double tol = 1e-4;
  std::string init = "kmeans++", metric = "l2", device = "cpu", algorithm = "lloyd";
  int64_t demo_n = 20000, demo_d = 16;
  bool distributed = false;
};

// Whether two paths name one file: equal after making them absolute and
// normalised, or the same inode when both exist.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea);
  return fs::absolute(a, ea).lexically_normal() == fs::absolute(b, eb).lexically_normal();
}

// The option table (--help lists the options in this order).
void add_options(cf::apps::Options& o, Config& c) {
  o.section("Input");
  o.add_string("input", &c.input, "the vectors, one per row (formats above)");
  o.add_string("format", &c.format,
               "npy | idx | raw (empty: from the name: .npy -> npy; .gz, .idx or a name containing \"-ubyte\" -> "
               "idx; else raw)");
  o.add_int_list("shape", &c.shape, 1, "raw: rows and columns, N,D");
  o.add_string("dtype", &c.dtype,
               "float32 | float64: the precision of the clustering (empty: a float32 or float64 .npy file's own; "
               "otherwise float32)");
  o.add_number("scale", &c.scale, "multiply the data by X first (e.g. 0.00392156862745098 for 8-bit images)");
  o.add_string("labels", &c.labels,
               "true labels (.npy or IDX integers, N of them): the summary adds their adjusted Rand index against "
               "the clusters");
  o.section("Clustering");
  o.add_int("k", &c.k, 1, "clusters");
  o.add_int("max_iter", &c.max_iter, 1, "Lloyd iterations at most");
  o.add_number("tol", &c.tol,
               "stop when an iteration lowers the inertia by less than this fraction, or nothing moves");
  o.add_string("init", &c.init, "kmeans++ | random");
  o.add_string("metric", &c.metric, "l2 | cosine");
  o.add_int("seed", &c.seed, 0, "seed of the initialisation");
  o.add_int("block_rows", &c.block_rows, 1, "rows per assignment block, bounding the (R, k) distance buffer");
  o.add_string("algorithm", &c.algorithm,
               "lloyd | elkan: how the nearest centroids are found; the same clustering either way (lloyd: "
               "blocked GEMM; elkan: triangle-inequality bounds, N x k doubles of memory)");
  o.add_string("device", &c.device,
               "cpu | cuda[:N]: where the data and the clustering live (--algorithm elkan is a CPU speed-up: on "
               "CUDA the GEMM assignment runs, with the same result)");
  o.section("Output (written atomically: a temporary file, then rename)");
  o.add_string("centroids", &c.centroids, ".npy (k, d), dtype of the clustering");
  o.add_string("assignments", &c.assignments, ".npy (N,) int64");
  o.add_string("save_data", &c.save_data, "demo only: the generated data as .npy (N, d) float32");
  o.add_string("save_labels", &c.save_labels, "demo only: the planted labels as .npy (N,) int64");
  o.section("Demo (no --input)");
  o.add_int("demo_n", &c.demo_n, 1, "points");
  o.add_int("demo_d", &c.demo_d, 1, "dimensions");
  o.section("Other");
  o.add_flag("distributed", &c.distributed,
             "data-parallel over the processes mpirun started (mpirun -np W ...): every rank reads the data and "
             "keeps its 1/W of the rows; distributed K-Means (all-reduced sums, k-means++ across ranks) gives the "
             "clustering of one process; rank 0 prints and writes the outputs");
}

// The checks no single option makes, and the values derived from several.
void check(Config& c) {
  if (!c.shape.empty() && c.shape.size() != 2) throw UsageError("--shape expects N,D (two integers)");
  if (c.init != "kmeans++" && c.init != "random")
    throw UsageError("--init must be kmeans++ or random, got '" + c.init + "'");
  if (c.metric != "l2" && c.metric != "cosine")
    throw UsageError("--metric must be l2 or cosine, got '" + c.metric + "'");
  if (c.algorithm != "lloyd" && c.algorithm != "elkan")
    throw UsageError("--algorithm must be lloyd or elkan, got '" + c.algorithm + "'");
  if (!c.dtype.empty() && c.dtype != "float32" && c.dtype != "float64")
    throw UsageError("--dtype must be float32 or float64, got '" + c.dtype + "'");
  if (!(c.tol >= 0) || !std::isfinite(c.tol)) throw UsageError("--tol must be a non-negative number");
  if (!std::isfinite(c.scale) || c.scale == 0) throw UsageError("--scale must be finite and non-zero");
  // Two options naming one file: the later write would replace the earlier
  // output, or the input (issue 27: --assignments equal to --input overwrote the
  // data and lost the centroids). Compared as absolute, normalised paths, and by
  // inode where the files exist (links, "./x" vs "x").
  {
    const std::vector<std::pair<const char*, const std::string*>> files = {
        {"--input", &c.input},         {"--labels", &c.labels},       {"--centroids", &c.centroids},
        {"--assignments", &c.assignments}, {"--save-data", &c.save_data}, {"--save-labels", &c.save_labels}};
    for (size_t i = 0; i < files.size(); ++i)
      for (size_t j = i + 1; j < files.size(); ++j) {
        const std::string &a = *files[i].second, &b = *files[j].second;
        if (a.empty() || b.empty()) continue;
        const bool is_output = j >= 2;  // every pair has an output except --input/--labels
        if (is_output && same_file(a, b))
          throw UsageError(std::string(files[i].first) + " and " + files[j].first + " name the same file '" +
                           b + "': the output would overwrite the other file");
      }
  }
  if (c.input.empty()) {
    if (!c.format.empty() || !c.shape.empty() || !c.labels.empty() || c.scale != 1)
      throw UsageError("--format, --shape, --labels and --scale need --input (the demo's data is generated)");
  } else {
    if (!c.save_data.empty() || !c.save_labels.empty())
      throw UsageError("--save-data and --save-labels are for the demo (no --input)");
    if (c.format.empty()) {
      const std::string& p = c.input;
      auto ends = [&](const std::string& s) {
        return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0;
      };
      c.format = ends(".npy") ? "npy" : ends(".gz") || ends(".idx") || p.find("-ubyte") != std::string::npos ? "idx" : "raw";
    }
    if (c.format != "npy" && c.format != "idx" && c.format != "raw")
      throw UsageError("--format must be npy, idx or raw, got '" + c.format + "'");
    if (c.format == "raw" && c.shape.empty())
      throw UsageError("raw input '" + c.input + "' needs --shape N,D (or name it .npy / use --format)");
    if (c.format != "raw" && !c.shape.empty()) throw UsageError("--shape is for raw input only");
  }
}

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  cf::apps::Options o(kUsage, kExitStatus);
  add_options(o, c);
  if (!o.parse(argc, argv)) return false;
  check(c);
  return true;
}

// Any tensor of rank >= 1 as an (N, rest) matrix.
cf::Tensor as_matrix(const cf::Tensor& t, const std::string& path) {
  if (t.dim() == 0) throw cf::ValueError("[cf-kmeans] '" + path + "' holds a single value, not vectors");
  // The row length is the product of the other sizes, not numel / n: with 0 rows
  // that gave (0,0) and an error showing the wrong shape.
  const int64_t n = t.size(0);
  const int64_t d = cf::numel_of(cf::Shape(t.shape().begin() + 1, t.shape().end()));
  if (n == 0)
    throw cf::ValueError("[cf-kmeans] '" + path + "' holds no vectors: it is " + t.describe() +
                         ", rows of length " + std::to_string(d));
  return cf::reshape(t, {n, d});
}

cf::Tensor read_data(const Config& c) {
  cf::Tensor t;
  if (c.format == "npy") t = cf::data::read_npy(c.input);
  else if (c.format == "idx") t = cf::data::read_idx(c.input, cf::kFloat32);
  else t = cf::data::read_raw_float32(c.input, {c.shape[0], c.shape[1]});
  t = as_matrix(t, c.input);
  cf::DType want = c.dtype == "float64" ? cf::kFloat64
                   : c.dtype == "float32" ? cf::kFloat32
                   : t.dtype() == cf::kFloat64 ? cf::kFloat64 : cf::kFloat32;  // (K-Means takes no float16)
  if (t.dtype() != want) t = cf::to(t, want);
  if (c.scale != 1) t = cf::mul(t, c.scale);
  return cf::contiguous(t);
}

cf::Tensor read_labels(const std::string& path, int64_t n) {
  auto ends = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  cf::Tensor l = ends(".npy") ? cf::data::read_npy(path) : cf::data::read_idx(path, cf::kInt64);
  if (l.dtype() != cf::kInt64)
    throw cf::DTypeError("[cf-kmeans] labels '" + path + "' must hold integers, got " + l.describe());
  if (l.dim() != 1 || l.size(0) != n)
    throw cf::ShapeError("[cf-kmeans] labels '" + path + "' must be (" + std::to_string(n) +
                         ",) to match the data, got " + l.describe());
  // Checked here, before the fit and before any output is written (the adjusted Rand index refused them
  // after both, naming no file).
  const std::vector<int64_t> v = l.to_vector<int64_t>();
  const auto bad = std::find_if(v.begin(), v.end(), [](int64_t x) { return x < 0; });
  if (bad != v.end())
    throw cf::ValueError("[cf-kmeans] labels '" + path + "' must be non-negative class ids, got " +
                         std::to_string(*bad) + " at position " + std::to_string(bad - v.begin()));
  return l;
}

struct Demo {
  cf::Tensor x, labels;
};

// Planted clusters: k centres uniform in [-10, 10]^d, unit Gaussian noise.
Demo make_demo(const Config& c) {
  cf::Generator g(uint64_t(c.seed) + 1000);
  const int64_t n = c.demo_n, d = c.demo_d, k = c.k;
  cf::Tensor centres = cf::rand({k, d}, cf::kFloat32, g, -10.0, 10.0);
  cf::Tensor labels = cf::to(cf::mul(cf::rand({n}, cf::kFloat64, g), double(k)), cf::kInt64);
  cf::Tensor x = cf::add(cf::index_select(centres, 0, labels), cf::randn({n, d}, cf::kFloat32, g));
  return {cf::contiguous(x), labels};
}

// --distributed: every rank computes the same lines; rank 0 prints them.
void say(const json& j) {
  if (cf::dist::rank() == 0) std::cout << cf::io::json_line(j) << std::endl;
}

// The clustering settings from the options.
cf::nn::KMeansOptions kmeans_options(const Config& cfg) {
  cf::nn::KMeansOptions o;
  o.k = cfg.k;
  o.max_iter = cfg.max_iter;
  o.tol = cfg.tol;
  o.init = cfg.init == "random" ? cf::nn::KMeansInit::random : cf::nn::KMeansInit::kmeans_plus_plus;
  o.metric = cfg.metric == "cosine" ? cf::nn::KMeansMetric::cosine : cf::nn::KMeansMetric::l2;
  o.seed = uint64_t(cfg.seed);
  o.block_rows = cfg.block_rows;
  o.algorithm = cfg.algorithm == "elkan" ? cf::nn::KMeansAlgorithm::elkan : cf::nn::KMeansAlgorithm::lloyd;
  return o;
}

// K-Means on x (this rank's share of the rows with --distributed, the
// assignments gathered back), an "iteration" line and a progress bar step per
// Lloyd iteration.
cf::nn::KMeansResult fit(const Config& cfg, const cf::Tensor& x, cf::Device dev, cf::nn::KMeansOptions o) {
  auto t1 = std::chrono::steady_clock::now();
  cf::nn::ProgressBarOptions po;
  po.total = cfg.max_iter;
  po.desc = "kmeans";
  static std::ostream silent(nullptr);
  if (cf::dist::rank() != 0) po.out = &silent;
  cf::nn::ProgressBar bar(po);
  o.on_iteration = [&](int64_t it, double inertia) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    say(json{{"event", "iteration"}, {"iteration", it}, {"inertia", inertia}, {"elapsed_s", el}});
    bar.set_field("inertia", inertia);
    bar.update();
  };
  cf::nn::KMeansResult r;
  if (cf::apps::distributed()) {
    // Rank r clusters rows [N r / W, N (r + 1) / W); the assignments are gathered
    // back (padded to equal shares with -1 for the all-gather) for the outputs.
    const int64_t N = x.size(0), W = cf::dist::world_size(), rk = cf::dist::rank();
    const int64_t lo = N * rk / W, hi = N * (rk + 1) / W, share = (N + W - 1) / W;
    r = cf::nn::kmeans_distributed(cf::contiguous(cf::narrow(x, 0, lo, hi - lo)), o);
    std::vector<int64_t> mine = r.assignments.to_vector<int64_t>();
    mine.resize(size_t(share), -1);
    std::vector<int64_t> all = cf::dist::all_gather(cf::Tensor::from_vector(mine, {share})).to_vector<int64_t>();
    std::vector<int64_t> full;
    for (int64_t a : all)
      if (a >= 0) full.push_back(a);
    r.assignments = cf::Tensor::from_vector(full, {N}).to(dev);
  } else {
    r = cf::nn::kmeans(x, o);
  }
  bar.finish();
  return r;
}

// The summary line (with the adjusted Rand index against `truth` when there is one).
json summary_of(const Config& cfg, const cf::Tensor& x, const cf::Tensor& truth, const cf::nn::KMeansResult& r,
                double fit_s) {
  std::vector<int64_t> sizes(size_t(cfg.k), 0);
  for (int64_t a : r.assignments.to_vector<int64_t>()) ++sizes[size_t(a)];
  json summary = {{"event", "summary"}, {"n", x.size(0)}, {"d", x.size(1)}, {"k", cfg.k},
                  {"inertia", r.inertia}, {"mean_inertia", r.inertia / double(x.size(0))},
                  {"iterations", r.iterations}, {"converged", r.converged},
                  {"reseeded_clusters", r.reseeded_clusters}, {"initial_inertia", r.inertia_history.front()},
                  {"cluster_sizes_min", *std::min_element(sizes.begin(), sizes.end())},
                  {"cluster_sizes_max", *std::max_element(sizes.begin(), sizes.end())},
                  {"fit_time_s", fit_s}, {"s_per_iteration", fit_s / double(std::max<int64_t>(1, r.iterations))},
                  {"peak_bytes", cf::memory_stats(x.device()).peak_bytes}};  // on the device the fit ran on
  if (truth.defined()) summary["adjusted_rand_index"] = cf::nn::adjusted_rand_index(r.assignments, truth);
  summary["centroids"] = cfg.centroids.empty() ? json(nullptr) : json(cfg.centroids);
  summary["assignments"] = cfg.assignments.empty() ? json(nullptr) : json(cfg.assignments);
  return summary;
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const bool demo = cfg.input.empty();
  auto t0 = std::chrono::steady_clock::now();
  cf::Tensor x, truth;
  if (demo) {
    Demo dm = make_demo(cfg);
    x = dm.x;
    truth = dm.labels;
    if (cfg.dtype == "float64") x = cf::to(x, cf::kFloat64);
    if (!cfg.save_data.empty() && cf::dist::rank() == 0) cf::data::save_npy(cfg.save_data, dm.x);
    if (!cfg.save_labels.empty() && cf::dist::rank() == 0) cf::data::save_npy(cfg.save_labels, dm.labels);
  } else {
    x = read_data(cfg);
    if (!cfg.labels.empty()) truth = read_labels(cfg.labels, x.size(0));
  }
  x = x.to(dev);  // start_device's: under --distributed a bare cuda is the local rank's GPU
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say(json{{"event", "start"}, {"input", demo ? "demo (planted clusters)" : cfg.input},
                    {"format", demo ? "generated" : cfg.format}, {"n", x.size(0)}, {"d", x.size(1)},
                    {"dtype", cf::dtype_name(x.dtype())}, {"k", cfg.k}, {"init", cfg.init},
                    {"metric", cfg.metric}, {"algorithm", cfg.algorithm}, {"device", cfg.device}, {"seed", cfg.seed}, {"read_time_s", read_s},
            {"processes", cf::dist::world_size()}});

  const cf::nn::KMeansOptions o = kmeans_options(cfg);
  auto t1 = std::chrono::steady_clock::now();
  const cf::nn::KMeansResult r = fit(cfg, x, dev, o);
  const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  // The summary first: an error in it (the adjusted Rand index) leaves no output behind.
  json summary = summary_of(cfg, x, truth, r, fit_s);
  if (cf::dist::rank() == 0) {
    if (!cfg.centroids.empty()) cf::data::save_npy(cfg.centroids, r.centroids.cpu());
    if (!cfg.assignments.empty()) cf::data::save_npy(cfg.assignments, r.assignments.cpu());
  }

  const double ari = truth.defined() ? summary["adjusted_rand_index"].get<double>() : -2;
  if (demo) summary["recovered_planted_clusters"] = ari > 0.99;
  say(summary);
  return demo && !(ari > 0.99) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-kmeans",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::start_device(cfg.device, cfg.distributed);
        return true;
      },
      [&] { return run(cfg, dev); });
}
