// cf-pointcloud: point-cloud classification with the Centroid Transformer
// (Wu et al., "Centroid Transformers", section 3.2, Figure 5) on a generated data
// set of parametric 3-D shapes, comparing the centroid initialisations farthest
// point sampling, random sampling and K-Means (after the paper's Table 3: accuracy
// and MACs per initialisation; with --iterations 0 the down-sampling baselines).
//
// One JSON line per event on stdout, a final JSON summary; the table in Markdown
// on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/options.h"
#include "common/report.h"
#include "common/train_run.h"
#include "models/centroid_transformer.h"
#include "nn/cost.h"
#include "pointcloud/shapes.h"

using json = nlohmann::ordered_json;
using cf::apps::emit;
using cf::apps::fmt;
using cf::apps::fmt_pct;
using cf::apps::seconds_since;
using cf::apps::Stats;
using cf::apps::stats_of;
using cf::apps::UsageError;
namespace pc = cf::apps::pointcloud;

namespace {

const char* kUsage = R"(usage: cf-pointcloud [options]

Point-cloud classification with the Centroid Transformer (section 3.2 of the
Centroid Transformers paper, Figure 5: self-attention and centroid attention
blocks, KNN masks, features of every block fused, max + mean pooling, MLP head)
on a generated set of 12 parametric shapes: sphere, ellipsoid, cube, cylinder,
cone, torus, square pyramid, square sheet, helix tube, capsule, dumbbell and
tetrahedron. Points are sampled on each surface, every axis is stretched by a
random factor, Gaussian noise is added, the cloud is turned by a uniform random
rotation and normalised into the unit sphere. One model is trained per centroid
initialisation (farthest point sampling, random sampling, K-Means) and the test
accuracy and forward MACs per cloud are compared. The paper's Table 3 compares
down-sampling by those initialisations alone against centroid attention started
from FPS ("Ours"): with the default --iterations 1 the fps row is "Ours" and the
other rows are centroid attention from other starts; --iterations 0 gives Table
3's sampling rows (a second run).

Output: one JSON line per event on stdout (start, data, train, val, result), a
final {"event": "summary", ...} line with mean and spread over the seeds; the
table in Markdown on stderr.
)";
const char* kExitStatus = R"(Exit status: 0 done, 1 failure (bad checkpoint, ...), 2 bad command line,
3 stopped by --stop-after.
)";

const std::vector<std::string> kInits = {"fps", "random", "kmeans"};

struct Config {
  pc::ShapeDataConfig data;
  std::vector<int64_t> widths = {32, 64, 64, 128};
  std::vector<std::string> blocks = {"self", "centroid", "self", "centroid"};
  std::vector<int64_t> downsample = {1, 2, 1, 4};
  int64_t n_heads = 4, ff_mult = 2, knn = 16, iterations = 1, fuse_dim = 256, kmeans_iters = 3;
  std::vector<int64_t> head = {128, 64};
  double dropout = 0.0;
  std::vector<std::string> inits = kInits;
  cf::apps::TrainSettings train;
  int64_t batch_size = 16, eval_batch_size = 64;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
};

cf::models::PointCloudOptions model_options(const Config& c, int64_t classes) {
  cf::models::PointCloudOptions o;
  o.num_classes = classes;
  o.widths = c.widths;
  o.blocks = c.blocks;
  o.downsample.assign(c.downsample.begin(), c.downsample.end());
  o.n_heads = c.n_heads;
  o.ff_mult = c.ff_mult;
  o.knn = c.knn;
  o.iterations = c.iterations;
  o.init = "fps";  // each run sets its own
  o.kmeans_iters = c.kmeans_iters;
  o.fuse_dim = c.fuse_dim;
  o.head = c.head;
  o.dropout = c.dropout;
  return o;
}

// The option table (--help lists the options in this order).
void add_options(cf::apps::Options& o, Config& c) {
  o.section("Data (train, validation and test sets drawn from --data-seed)");
  o.add_int("points", &c.data.points, 1, "points per cloud (small for CPU speed; the paper's setting is 1024)");
  o.add_int("train_per_class", &c.data.train_per_class, 1, "training clouds per shape");
  o.add_int("val_per_class", &c.data.val_per_class, 0, "validation clouds per shape");
  o.add_int("test_per_class", &c.data.test_per_class, 1, "test clouds per shape");
  o.add_number("noise", &c.data.noise, "Gaussian noise std before normalisation");
  o.add_number("scale_jitter", &c.data.scale_jitter, "each axis stretched by a factor in [1-X, 1+X]");
  o.add_int("data_seed", &c.data.data_seed, 0, "seed of the generated data set");
  o.add_string("rotation", &c.data.rotation,
               "so3: a uniform random 3-D rotation per cloud; z: about the z axis only; none");
  o.add_string("align", &c.data.align,
               "pca: after normalising, turn each cloud onto its principal axes (largest variance first, signs "
               "by the third moment), which undoes the random rotation up to the shape's symmetries; none: keep "
               "the rotated cloud (a much harder task for a small model)");
  o.section(
      "Model (defaults are small for the CPU; the paper's: --widths 64,128,128,512 --knn 40 --points 1024;\n"
      "the paper gives no widths for its fused layer and 3-layer head: --fuse-dim 1024 --head 512,256 are this\n"
      "project's choice)");
  o.add_int_list("widths", &c.widths, 1, "width of each block");
  o.add_string_list("blocks", &c.blocks, "self or centroid per block");
  o.add_int_list("downsample", &c.downsample, 1, "N/M of each block, used by centroid blocks");
  o.add_int("n_heads", &c.n_heads, 1, "attention heads");
  o.add_int("ff_mult", &c.ff_mult, 1, "feed-forward width / block width");
  o.add_int("knn", &c.knn, 0, "K of the KNN masks, 0 = every input");
  o.add_int("iterations", &c.iterations, 0,
            "centroid update steps T; 0: no attention step, the sampled (or K-Means) centroids pass through "
            "(Table 3's down-sampling baselines)");
  o.add_int("fuse_dim", &c.fuse_dim, 1, "the layer after concatenating every block");
  o.add_int_list("head", &c.head, 1, "the two hidden widths of the MLP head");
  o.add_number("dropout", &c.dropout,
               "dropout of the MLP head (0: with a few hundred steps the paper's 0.5 slows learning down a lot)");
  o.add_int("kmeans_iters", &c.kmeans_iters, 1, "Lloyd steps of the K-Means initialisation (the paper's)");
  o.add_string_list("inits", &c.inits, "from fps, random, kmeans");
  o.section("Training (AdamW, warmup + cosine, gradient clipping 1, cross-entropy)");
  cf::apps::add_train_options(o, c.train);
  o.add_int("batch_size", &c.batch_size, 1, "training batch size");
  o.add_int("eval_batch_size", &c.eval_batch_size, 1, "evaluation batch size");
  o.section("Runs");
  o.add_seeds(&c.seeds, "model initialisation, dropout, batch order, random sampling");
  o.add_string("device", &c.device, "cpu | cuda");
}

// The checks no single option makes, and the values derived from several.
void check(Config& c) {
  for (size_t i = 0; i < c.inits.size(); ++i) {
    if (std::find(kInits.begin(), kInits.end(), c.inits[i]) == kInits.end())
      throw UsageError("--inits: unknown init '" + c.inits[i] + "' (expected fps, random or kmeans)");
    if (std::find(c.inits.begin(), c.inits.begin() + long(i), c.inits[i]) != c.inits.begin() + long(i))
      throw UsageError("--inits: '" + c.inits[i] + "' listed twice");
  }
  cf::apps::check_train_settings(c.train);
  if (c.data.rotation != "so3" && c.data.rotation != "z" && c.data.rotation != "none")
    throw UsageError("--rotation must be so3, z or none, got '" + c.data.rotation + "'");
  if (c.data.align != "pca" && c.data.align != "none")
    throw UsageError("--align must be pca or none, got '" + c.data.align + "'");
  if (c.data.noise < 0) throw UsageError("--noise must be non-negative");
  if (c.data.scale_jitter < 0 || c.data.scale_jitter >= 1) throw UsageError("--scale-jitter must be in [0, 1)");
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (c.widths.size() != c.blocks.size() || c.downsample.size() != c.blocks.size())
    throw UsageError("--widths, --blocks and --downsample need one entry per block, got " +
                     std::to_string(c.widths.size()) + ", " + std::to_string(c.blocks.size()) + " and " +
                     std::to_string(c.downsample.size()));
  if (c.head.size() != 2) throw UsageError("--head needs two widths, got " + std::to_string(c.head.size()));
  try {
    model_options(c, 2).validate("cf-pointcloud");
  } catch (const cf::ValueError& e) {
    throw UsageError(e.what());
  }
  if (c.data.points < 8) throw UsageError("--points must be at least 8, got " + std::to_string(c.data.points));
  // Every centroid block needs at least one centroid and, with KNN masks (read by the update steps
  // only: none with --iterations 0), at least K inputs.
  int64_t n = c.data.points;
  for (size_t i = 0; i < c.blocks.size(); ++i) {
    if (c.blocks[i] != "centroid") continue;
    if (c.iterations > 0 && c.knn > n)
      throw UsageError("--points " + std::to_string(c.data.points) + " is too few: centroid block " +
                       std::to_string(i + 1) + " gets " + std::to_string(n) + " points, fewer than --knn " +
                       std::to_string(c.knn));
    n = (n + c.downsample[i] - 1) / c.downsample[i];
  }
}

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  c.train.lr = 2e-3;
  cf::apps::Options o(kUsage, kExitStatus);
  add_options(o, c);
  if (!o.parse(argc, argv)) return false;
  check(c);
  return true;
}

// Rows `idx` of a set as a (B, N, 3) tensor and their labels.
std::pair<cf::Tensor, cf::Tensor> batch_of(const pc::ShapeSet& s, const std::vector<int64_t>& idx, int64_t points,
                                           const cf::Device& dev) {
  std::vector<float> x;
  std::vector<int64_t> y;
  x.reserve(idx.size() * size_t(points) * 3);
  for (int64_t i : idx) {
    x.insert(x.end(), s.xyz.begin() + i * points * 3, s.xyz.begin() + (i + 1) * points * 3);
    y.push_back(s.labels[size_t(i)]);
  }
  const int64_t bsz = int64_t(idx.size());
  return {cf::Tensor::from_vector(x, {bsz, points, 3}).to(dev), cf::Tensor::from_vector(y, {bsz}).to(dev)};
}

struct InitResult {
  std::vector<double> accuracy, train_s;
  int64_t macs = 0, selection_macs = 0, params = 0;
};

// Batch order: a permutation of the training set per epoch, from the seed and
// the epoch alone, so a resumed run continues with the same batches.
std::vector<int64_t> batch_indices(int64_t count, int64_t batch_size, int64_t seed, int64_t step) {
  const int64_t batches = count / batch_size;
  const int64_t epoch = (step - 1) / batches, pos = (step - 1) % batches;
  std::vector<int64_t> perm(static_cast<size_t>(count));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(uint64_t(seed) * 1000003ull + uint64_t(epoch));
  std::shuffle(perm.begin(), perm.end(), rng);
  return std::vector<int64_t>(perm.begin() + pos * batch_size, perm.begin() + (pos + 1) * batch_size);
}

// The model with centroid initialisation `init` at one seed, trained (or reused
// from its checkpoint) and tested: its "result" line, its numbers in `results`.
void train_init(const Config& cfg, cf::Device dev, const pc::ShapeSet& train, const pc::ShapeSet& val,
                const pc::ShapeSet& test, const cf::models::PointCloudOptions& mo, const json& model_json,
                const json& data_sig, int64_t seed, const std::string& init,
                std::map<std::string, InitResult>& results) {
  const pc::ShapeDataConfig& dc = cfg.data;
  // The same seed gives every init the same initial weights and batch order.
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)};
  cf::models::PointCloudOptions mi = mo;
  mi.init = init;
  auto model = std::make_shared<cf::models::PointCloudClassifier>(mi, gen);
  model->to(dev);
  cf::Generator sampler{uint64_t(seed) * 7919u + 11u};  // random-sampling init during training
  auto forward = [&](const cf::Tensor& x, cf::Generator* s) {
    return model->forward(x, init == "random" ? s : nullptr);
  };

  InitResult& res = results[init];
  if (res.macs == 0) {
    cf::nn::Cost cost = model->cost(1, dc.points);
    res.macs = cost.macs;
    res.selection_macs = cost.selection_macs;
    res.params = cost.params;
  }

  auto accuracy = [&](const pc::ShapeSet& s, uint64_t draw_seed) {
    cf::NoGradGuard ng;
    cf::Generator g{draw_seed};
    int64_t correct = 0;
    for (int64_t start = 0; start < s.count(); start += cfg.eval_batch_size) {
      std::vector<int64_t> idx;
      for (int64_t i = start; i < std::min(s.count(), start + cfg.eval_batch_size); ++i) idx.push_back(i);
      auto [x, y] = batch_of(s, idx, dc.points, dev);
      std::vector<int64_t> p = cf::argmax(forward(x, &g), -1).cpu().to_vector<int64_t>();
      std::vector<int64_t> t = y.cpu().to_vector<int64_t>();
      for (size_t i = 0; i < p.size(); ++i) correct += p[i] == t[i];
    }
    return s.count() ? double(correct) / double(s.count()) : 0.0;
  };

  cf::apps::TrainRun run;
  run.app = "cf-pointcloud";
  run.tags = {{"seed", seed}, {"run", init}};
  run.signature = {{"model", model_json},      {"init", init},
                   {"kmeans_iters", init == "kmeans" ? cfg.kmeans_iters : 0},
                   {"seed", seed},             {"batch_size", cfg.batch_size},
                   {"train", cf::apps::train_signature(cfg.train)},
                   {"data", data_sig}};
  if (!cfg.train.checkpoint_dir.empty())
    run.checkpoint = cfg.train.checkpoint_dir + "/" + init + "-seed" + std::to_string(seed) + ".safetensors";
  run.device = dev;
  run.generators = {{"sampler", &sampler}};
  cf::apps::TrainHooks hooks;
  hooks.loss = [&](int64_t step, cf::Tensor* task) {
    auto [x, y] = batch_of(train, batch_indices(train.count(), cfg.batch_size, seed, step), dc.points, dev);
    cf::Tensor loss = cf::cross_entropy(forward(x, &sampler), y);
    *task = loss;
    return loss;
  };
  if (val.count() > 0) hooks.evaluate = [&] { return accuracy(val, uint64_t(seed) + 777); };
  const cf::apps::TrainResult tr = cf::apps::train_model(*model, cfg.train, run, hooks);
  model->eval();
  const double acc = accuracy(test, uint64_t(seed) + 999);
  res.accuracy.push_back(acc);
  json line = {{"event", "result"}, {"seed", seed}, {"run", init}, {"test_accuracy", acc},
               {"macs", res.macs}, {"trained", tr.trained}};
  if (tr.trained) {
    res.train_s.push_back(tr.time_s);
    line["train_s"] = tr.time_s;
    line["train_peak_bytes"] = tr.peak_bytes;
  }
  emit(line);
}

// The summary line (JSON) and the Markdown table on stderr.
void summarise(const Config& cfg, int64_t classes, int64_t train_size, int64_t test_size,
               std::map<std::string, InitResult>& results, std::chrono::steady_clock::time_point t_start) {
  const pc::ShapeDataConfig& dc = cfg.data;
  std::ostringstream md;
  json table = json::object();
  md << "\nCentroid initialisations (after Table 3; " << (cfg.iterations > 0 ? "each followed by centroid attention, T = " + std::to_string(cfg.iterations) + ": the fps row is the paper's \"Ours\"" : std::string("T = 0: the down-sampling baselines")) << "): test accuracy (%, mean ± sample std over "
     << cfg.seeds.size() << " seed(s)), forward MACs per cloud of " << dc.points
     << " points (M; in brackets the selection part: FPS / K-Means distances, KNN masks, up-sampling), "
     << "parameters, training time (s) of "
     << cfg.train.steps << " steps\n\n| init | accuracy | MACs (M) | params | train time |\n|---|---|---|---|---|\n";
  for (const std::string& init : cfg.inits) {
    const InitResult& r = results[init];
    const Stats acc = stats_of(r.accuracy), ts = stats_of(r.train_s);
    table[init] = {{"accuracy_mean", acc.mean},         {"accuracy_std", acc.std},
                   {"accuracy", r.accuracy},            {"macs", r.macs},
                   {"selection_macs", r.selection_macs}, {"params", r.params},
                   {"train_s_mean", mean_or_null(ts)}};
    md << "| " << (init == "fps" ? "FPS" : init == "kmeans" ? "K-Means" : "random") << " | " << fmt_pct(acc)
       << " | " << fmt(double(r.macs) / 1e6, "%.2f") << " (" << fmt(double(r.selection_macs) / 1e6, "%.3f")
       << ") | " << r.params << " | " << fmt_mean_or_dash(ts, "%.1f") << " |\n";
  }
  emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"classes", classes}, {"points", dc.points},
        {"train_size", train_size}, {"test_size", test_size}, {"table", table},
        {"total_time_s", seconds_since(t_start)}});
  std::cerr << md.str() << std::flush;
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  const pc::ShapeDataConfig& dc = cfg.data;
  const int64_t classes = int64_t(pc::shape_names().size());
  const pc::ShapeSet train = pc::make_shapes(dc, dc.train_per_class, 0);
  const pc::ShapeSet val = pc::make_shapes(dc, dc.val_per_class, 1);
  const pc::ShapeSet test = pc::make_shapes(dc, dc.test_per_class, 2);
  const int64_t batches = train.count() / cfg.batch_size;
  if (batches == 0)
    throw cf::ValueError("[cf-pointcloud] the training set (" + std::to_string(train.count()) +
                         " clouds) is smaller than one batch of " + std::to_string(cfg.batch_size));

  const json data_sig = {{"points", dc.points},
                         {"noise", dc.noise},
                         {"scale_jitter", dc.scale_jitter},
                         {"train_per_class", dc.train_per_class},
                         {"data_seed", dc.data_seed},
                         {"rotation", dc.rotation},
                         {"align", dc.align},
                         {"classes", pc::shape_names()}};
  emit({{"event", "start"}, {"app", "cf-pointcloud"}, {"device", dev.str()}, {"seeds", cfg.seeds},
        {"inits", cfg.inits}, {"points", dc.points}, {"steps", cfg.train.steps},
        {"machine", cf::apps::machine_record()}});
  emit({{"event", "data"}, {"classes", pc::shape_names()}, {"points", dc.points}, {"train", train.count()},
        {"val", val.count()}, {"test", test.count()}, {"data_seed", dc.data_seed}, {"rotation", dc.rotation},
        {"align", dc.align}});
  if (!cfg.train.checkpoint_dir.empty())
    cf::apps::make_dir(cfg.train.checkpoint_dir, "cf-pointcloud", "--checkpoint-dir");

  const cf::models::PointCloudOptions mo = model_options(cfg, classes);
  const json model_json = {{"widths", cfg.widths},       {"blocks", cfg.blocks},     {"downsample", cfg.downsample},
                           {"n_heads", cfg.n_heads},     {"ff_mult", cfg.ff_mult},   {"knn", cfg.knn},
                           {"iterations", cfg.iterations}, {"fuse_dim", cfg.fuse_dim}, {"head", cfg.head},
                           {"dropout", cfg.dropout},     {"classes", classes}};

  std::map<std::string, InitResult> results;
  for (int64_t seed : cfg.seeds)
    for (const std::string& init : cfg.inits)
      train_init(cfg, dev, train, val, test, mo, model_json, data_sig, seed, init, results);
  summarise(cfg, classes, train.count(), test.count(), results, t_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-pointcloud",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::parse_device(cfg.device);
        return true;
      },
      [&] { return run(cfg, dev); });
}
