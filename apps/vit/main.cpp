// cf-vit: a small vision transformer on Fashion-MNIST with and without a
// centroid attention block: the Centroid Transformers paper's ImageNet experiment
// (Wu et al., section 3.4, Tables 5 and 6: DeiT against "centroid @ layer"
// models, top-1 accuracy against MACs) rerun at CPU scale. Every variant is a
// cf::models::CentroidViT (models/centroid_transformer.h); the plain ViT is the
// same model with no centroid block (centroid_at = 0), so the variants share
// every other piece. Optional: the paper's overlapping patch embedding for the
// centroid models (more tokens for the same depth, Table 6 "Ours").
//
// One JSON line per event on stdout, a final JSON summary; the table in Markdown
// on stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "common/options.h"
#include "common/report.h"
#include "common/train_run.h"
#include "models/centroid_transformer.h"
#include "nn/data/idx.h"

using json = nlohmann::ordered_json;
using cf::apps::emit;
using cf::apps::fmt;
using cf::apps::fmt_pct;
using cf::apps::seconds_since;
using cf::apps::Stats;
using cf::apps::stats_of;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-vit [options]

Image classification on Fashion-MNIST (Debian package dataset-fashion-mnist)
with a vision transformer, with and without a centroid attention block: the
Centroid Transformers paper's ViT experiment (section 3.4, Table 6: DeiT
against models whose self-attention block at layer "centroid @" is replaced by
a centroid attention block that shortens the sequence to N/4 tokens). Every
variant is the same pre-LN ViT (patch embedding, learned positions, mean
pooling over the last tokens); the plain ViT has no centroid block. It prints
each variant's test accuracy, forward MACs per image, parameters, training
time and peak memory.

Output: one JSON line per event on stdout (start, data, variants, train, val,
result), a final {"event": "summary", ...} line with mean and spread over the
seeds; the table in Markdown on stderr.

Data: the first --train-size training images; the validation images are the
last --val-size of the 60000 training images, disjoint from them; the first
--test-size test images; pixels scaled to [0, 1], then normalised with the
data set's mean 0.286 and std 0.353.
)";
const char* kExitStatus = R"(Exit status: 0 done, 1 failure (no Fashion-MNIST, bad checkpoint, ...), 2 bad command line,
3 stopped by --stop-after.
)";

constexpr int64_t kImage = 28, kClasses = 10, kTrainTotal = 60000, kTestTotal = 10000;
constexpr float kMean = 0.286f, kStd = 0.353f;

struct Config {
  std::string data_dir = cf::data::kFashionMnistDir;
  int64_t train_size = 10000, val_size = 1000, test_size = 2000;
  int64_t patch_kernel = 4, patch_stride = 0, patch_padding = 0;
  int64_t d_model = 64, n_heads = 4, d_ff = 128, n_layers = 4;
  double dropout = 0.0;
  std::vector<int64_t> centroid_at = {0, 1, 2};
  std::vector<int64_t> overlap;
  cf::apps::TrainSettings train;
  int64_t batch_size = 64, eval_batch_size = 250;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
};

std::string str(int64_t v) { return std::to_string(v); }

void check_patches(const char* what, int64_t k, int64_t s, int64_t p) {
  if (kImage + 2 * p < k)
    throw UsageError(std::string(what) + ": the patch kernel " + str(k) + " is larger than the image (28 + 2 * " +
                     str(p) + " padding)");
  if ((kImage + 2 * p - k) % s != 0)
    throw UsageError(std::string(what) + ": patches of kernel " + str(k) + ", stride " + str(s) + ", padding " +
                     str(p) + " do not tile the 28 x 28 image ((28 + 2 * padding - kernel) must be a multiple of "
                     "the stride)");
}

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  c.train.steps = 300;
  c.train.warmup = 30;
  c.train.lr = 2e-3;
  c.train.weight_decay = 0.05;
  cf::apps::Options o(kUsage, kExitStatus);
  o.section("Data");
  o.add_string("data_dir", &c.data_dir, "Fashion-MNIST IDX files");
  o.add_int("train_size", &c.train_size, 1, "training images (at most 60000 - val-size)");
  o.add_int("val_size", &c.val_size, 1, "validation images");
  o.add_int("test_size", &c.test_size, 1, "test images (at most 10000)");
  o.section("Model (28 x 28 x 1 images)");
  o.add_int("patch_kernel", &c.patch_kernel, 1, "patch embedding kernel (4: 7 x 7 = 49 tokens)");
  o.add_int("patch_stride", &c.patch_stride, 0, "patch embedding stride (0: the kernel)");
  o.add_int("patch_padding", &c.patch_padding, 0,
            "patch embedding padding; (28 + 2 padding - kernel) must be a multiple of the stride: the patches "
            "tile the image");
  o.add_int("d_model", &c.d_model, 1, "model width");
  o.add_int("n_heads", &c.n_heads, 1, "attention heads");
  o.add_int("d_ff", &c.d_ff, 1, "feed-forward width");
  o.add_int("n_layers", &c.n_layers, 1, "layers");
  o.add_number("dropout", &c.dropout, "dropout rate");
  o.section("Variants");
  o.add_int_list("centroid_at", &c.centroid_at, 0,
                 "one model per entry: 0 is the plain ViT, L (1-based) the ViT whose layer L is the centroid "
                 "block", /*distinct=*/true);
  o.add_int_list("overlap", &c.overlap, 0,
                 "kernel,stride,padding of an overlapping patch embedding (the paper's 16,14,1): the centroid "
                 "variants are also trained with it");
  o.section("Training (AdamW, warmup + cosine, gradient clipping 1, cross-entropy)");
  cf::apps::add_train_options(o, c.train);
  o.add_int("batch_size", &c.batch_size, 1, "training batch size");
  o.add_int("eval_batch_size", &c.eval_batch_size, 1, "evaluation batch size");
  o.section("Runs");
  o.add_seeds(&c.seeds, "initialisation, dropout, batch order");
  o.add_string("device", &c.device, "cpu | cuda");
  if (!o.parse(argc, argv)) return false;

  cf::apps::check_train_settings(c.train);
  if (c.train_size + c.val_size > kTrainTotal)
    throw UsageError("--train-size + --val-size (" + str(c.train_size + c.val_size) +
                     ") exceeds the 60000 training images");
  if (c.test_size > kTestTotal)
    throw UsageError("--test-size (" + str(c.test_size) + ") exceeds the 10000 test images");
  if (c.patch_stride == 0) c.patch_stride = c.patch_kernel;
  check_patches("--patch-kernel/--patch-stride/--patch-padding", c.patch_kernel, c.patch_stride, c.patch_padding);
  if (!c.overlap.empty()) {
    if (c.overlap.size() != 3 || c.overlap[0] < 1 || c.overlap[1] < 1)
      throw UsageError("--overlap must be kernel,stride,padding with a positive kernel and stride");
    check_patches("--overlap", c.overlap[0], c.overlap[1], c.overlap[2]);
  }
  if (c.dropout < 0 || c.dropout >= 1) throw UsageError("--dropout must be in [0, 1)");
  if (c.d_model % c.n_heads != 0)
    throw UsageError("--d-model (" + str(c.d_model) + ") must be divisible by --n-heads (" + str(c.n_heads) + ")");
  if (c.centroid_at.empty()) throw UsageError("--centroid-at needs at least one entry");
  if (!c.overlap.empty() && std::find_if(c.centroid_at.begin(), c.centroid_at.end(), [](int64_t l) { return l > 0; }) ==
                                c.centroid_at.end())
    throw UsageError("--overlap applies to the centroid variants, and --centroid-at lists none (only 0)");
  for (int64_t l : c.centroid_at)
    if (l > c.n_layers)
      throw UsageError("--centroid-at: layer " + str(l) + " out of range (0: no centroid block, 1.." +
                       str(c.n_layers) + ": the layer replaced)");
  return true;
}

struct Variant {
  std::string name;  // "plain", "centroid@2", "centroid@2 overlap"
  std::string file;  // checkpoint stem: "plain", "centroid2", "centroid2-overlap"
  cf::models::CentroidViTOptions opts;
  int64_t tokens = 0, macs = 0, params = 0;
};

json options_json(const cf::models::CentroidViTOptions& o) {
  return {{"image_size", o.image_size}, {"in_channels", o.in_channels}, {"patch_kernel", o.patch_kernel},
          {"patch_stride", o.patch_stride}, {"patch_padding", o.patch_padding}, {"d_model", o.d_model},
          {"n_heads", o.n_heads}, {"d_ff", o.d_ff}, {"n_layers", o.n_layers}, {"centroid_at", o.centroid_at},
          {"num_classes", o.num_classes}, {"dropout", o.dropout}};
}

// Images (first n from `start`) as a normalised (n, 1, 28, 28) tensor and labels (n,).
std::shared_ptr<cf::data::TensorDataset> subset(const cf::Tensor& images, const cf::Tensor& labels, int64_t start,
                                                int64_t n) {
  const std::vector<float> all = images.to_vector<float>();
  const std::vector<int64_t> all_y = labels.to_vector<int64_t>();
  const int64_t px = kImage * kImage;
  std::vector<float> x(size_t(n * px));
  for (int64_t i = 0; i < n * px; ++i) x[size_t(i)] = (all[size_t(start * px + i)] - kMean) / kStd;
  std::vector<int64_t> y(all_y.begin() + start, all_y.begin() + start + n);
  return std::make_shared<cf::data::TensorDataset>(cf::Tensor::from_vector(x, {n, 1, kImage, kImage}),
                                                   cf::Tensor::from_vector(y, {n}));
}

double evaluate(cf::models::CentroidViT& model, cf::data::DataLoader& loader, cf::Device dev, double* time_s) {
  model.eval();
  cf::NoGradGuard ng;
  loader.set_epoch(0);
  int64_t correct = 0, total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  cf::data::Batch b;
  while (loader.next(b)) {
    std::vector<int64_t> p = cf::argmax(model.forward(b.input.to(dev)), -1).to_vector<int64_t>();
    std::vector<int64_t> y = b.target.to_vector<int64_t>();
    for (size_t i = 0; i < p.size(); ++i) correct += p[i] == y[i];
    total += int64_t(p.size());
  }
  if (dev.is_cuda()) cf::cuda::synchronize();
  if (time_s) *time_s = seconds_since(t0);
  model.train();
  return total ? double(correct) / double(total) : 0.0;
}

struct VariantResult {
  std::vector<double> accuracy, train_s, train_cpu_s, peak_mib, infer_s;
};

// The variants: one per --centroid-at entry, and with --overlap the centroid
// ones again with the overlapping patch embedding; each with its cost per image.
std::vector<Variant> plan_variants(const Config& cfg) {
  std::vector<Variant> variants;
  auto add_variant = [&](int64_t at, bool overlap) {
  Variant v;
  cf::models::CentroidViTOptions& o = v.opts;
  o.image_size = kImage;
  o.in_channels = 1;
  o.patch_kernel = overlap ? cfg.overlap[0] : cfg.patch_kernel;
  o.patch_stride = overlap ? cfg.overlap[1] : cfg.patch_stride;
  o.patch_padding = overlap ? cfg.overlap[2] : cfg.patch_padding;
  o.d_model = cfg.d_model;
  o.n_heads = cfg.n_heads;
  o.d_ff = cfg.d_ff;
  o.n_layers = cfg.n_layers;
  o.centroid_at = at;
  o.num_classes = kClasses;
  o.dropout = cfg.dropout;
  v.name = at == 0 ? "plain" : "centroid@" + str(at);
  v.file = at == 0 ? "plain" : "centroid" + str(at);
  if (overlap) v.name += " overlap", v.file += "-overlap";
  for (const Variant& w : variants)
    if (w.file == v.file) return;
  cf::Generator g(0);
  cf::models::CentroidViT m(o, g);
  v.tokens = m.num_tokens();
  const cf::nn::Cost cost = m.cost(1);
  v.macs = cost.macs;
  v.params = cost.params;
  variants.push_back(v);
  };
  for (int64_t at : cfg.centroid_at) add_variant(at, false);
  if (!cfg.overlap.empty())
    for (int64_t at : cfg.centroid_at)
      if (at > 0) add_variant(at, true);
  return variants;
}

// One variant at one seed trained (or reused from its checkpoint) and tested:
// its "result" line, its numbers added to `results`.
void train_variant(const Config& cfg, cf::Device dev, const std::shared_ptr<cf::data::Dataset>& train_ds,
                   cf::data::DataLoader& val_loader, cf::data::DataLoader& test_loader, const json& data_sig,
                   int64_t seed, const Variant& v, std::map<std::string, VariantResult>& results) {
  const cf::apps::TrainSettings& tc = cfg.train;
  // The same seed gives every variant the same batch order.
  cf::manual_seed(uint64_t(seed));
  cf::Generator gen{uint64_t(seed)};
  auto model = std::make_shared<cf::models::CentroidViT>(v.opts, gen);
  model->to(dev);

  cf::apps::TrainRun run;
  run.app = "cf-vit";
  run.tags = {{"seed", seed}, {"run", v.file}};
  run.signature = {{"model", options_json(v.opts)}, {"seed", seed}, {"batch_size", cfg.batch_size},
                   {"train", cf::apps::train_signature(tc)}, {"data", data_sig}};
  if (!tc.checkpoint_dir.empty())
    run.checkpoint = tc.checkpoint_dir + "/" + v.file + "-seed" + str(seed) + ".safetensors";
  run.device = dev;

  cf::data::DataLoaderOptions to;
  to.batch_size = cfg.batch_size;
  to.shuffle = true;
  to.seed = uint64_t(seed);
  to.drop_last = true;
  to.prefetch = 2;
  cf::data::DataLoader train_loader(train_ds, to);
  cf::apps::TrainHooks hooks;
  hooks.resumed = [&](int64_t start_step) {
    const int64_t nb = train_loader.size();
    train_loader.set_state({start_step / nb, start_step % nb});
  };
  hooks.evaluate = [&] { return evaluate(*model, val_loader, dev, nullptr); };
  cf::data::Batch b;
  hooks.loss = [&](int64_t, cf::Tensor* task_loss) {
    if (!train_loader.next(b) && !train_loader.next(b))
      throw cf::ValueError("[cf-vit] the training loader delivered no batch");
    cf::Tensor loss = cf::cross_entropy(model->forward(b.input.to(dev)), b.target.to(dev));
    *task_loss = loss;
    return loss;
  };
  model->train();
  const std::clock_t cpu0 = std::clock();  // CPU time of the process (every thread): the machine may be shared
  const cf::apps::TrainResult tr = cf::apps::train_model(*model, tc, run, hooks);
  const double train_cpu_s = double(std::clock() - cpu0) / CLOCKS_PER_SEC;
  train_loader.stop();
  double infer_s = 0;
  const double acc = evaluate(*model, test_loader, dev, &infer_s);

  VariantResult& res = results[v.file];
  res.accuracy.push_back(acc);
  res.infer_s.push_back(infer_s);
  json line = {{"event", "result"}, {"seed", seed}, {"run", v.file}, {"test_accuracy", acc},
               {"macs", v.macs}, {"params", v.params}, {"inference_s", infer_s}, {"trained", tr.trained}};
  if (tr.trained) {  // a reused checkpoint has no training time or memory
    res.train_s.push_back(tr.time_s);
    res.train_cpu_s.push_back(train_cpu_s);
    res.peak_mib.push_back(double(tr.peak_bytes) / (1024.0 * 1024.0));
    line["train_s"] = tr.time_s;
    line["train_cpu_s"] = train_cpu_s;
    line["train_peak_bytes"] = tr.peak_bytes;
  }
  emit(line);
}

// The summary line (JSON) and the Markdown table on stderr.
void summarise(const Config& cfg, const std::vector<Variant>& variants, std::map<std::string, VariantResult>& results,
               std::chrono::steady_clock::time_point t_start) {
  const cf::apps::TrainSettings& tc = cfg.train;
  const Variant* plain = nullptr;
  for (const Variant& v : variants)
    if (v.opts.centroid_at == 0) plain = &v;
  std::ostringstream md;
  json table = json::object();
  md << "\nFashion-MNIST test accuracy (%, mean ± sample std over " << cfg.seeds.size() << " seed(s), "
     << cfg.test_size << " test images) of ViTs with " << cfg.n_layers << " layers, d " << cfg.d_model << ", "
     << cfg.n_heads << " heads, trained " << tc.steps << " steps on " << cfg.train_size << " images; MACs per "
     << "image (forward; (x): relative to the plain ViT), parameters, training time (wall s / CPU s), peak "
     << "training memory (MiB)\n\n| model | tokens | accuracy | MACs (M) | params (K) | train time | peak memory |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const Variant& v : variants) {
    const VariantResult& r = results[v.file];
    const Stats acc = stats_of(r.accuracy), tr = stats_of(r.train_s), cpu = stats_of(r.train_cpu_s),
                mem = stats_of(r.peak_mib), inf = stats_of(r.infer_s);
    table[v.file] = {{"name", v.name},          {"centroid_at", v.opts.centroid_at}, {"tokens", v.tokens},
                     {"macs", v.macs},          {"params", v.params},     {"accuracy_mean", acc.mean},
                     {"accuracy_std", acc.std}, {"accuracy", r.accuracy}, {"train_s_mean", mean_or_null(tr)},
                     {"train_cpu_s_mean", mean_or_null(cpu)}, {"train_peak_mib_mean", mean_or_null(mem)},
                     {"inference_s_mean", inf.mean}};
    md << "| " << v.name << " | " << v.tokens << " | " << fmt_pct(acc) << " | " << fmt(double(v.macs) / 1e6, "%.2f")
       << (plain ? " (" + fmt(double(v.macs) / double(plain->macs), "%.2f") + "x)" : std::string()) << " | "
       << fmt(double(v.params) / 1e3, "%.1f") << " | " << fmt_mean_or_dash(tr, "%.1f") << " / "
       << fmt_mean_or_dash(cpu, "%.1f") << " | " << fmt_mean_or_dash(mem, "%.1f") << " |\n";
  }
  emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"train_size", cfg.train_size}, {"test_size", cfg.test_size},
        {"steps", tc.steps}, {"table", table}, {"total_time_s", seconds_since(t_start)}});
  std::cerr << md.str() << std::flush;
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  const cf::apps::TrainSettings& tc = cfg.train;
  const std::vector<Variant> variants = plan_variants(cfg);
  std::vector<std::string> names, runs;  // the runs' display names and the ids the result lines use
  for (const Variant& v : variants) names.push_back(v.name), runs.push_back(v.file);
  emit({{"event", "start"}, {"app", "cf-vit"}, {"device", dev.str()}, {"seeds", cfg.seeds},
        {"variants", names}, {"runs", runs}, {"steps", tc.steps}, {"machine", cf::apps::machine_record()}});
  for (const Variant& v : variants)
    emit({{"event", "variant"}, {"run", v.file}, {"name", v.name}, {"tokens", v.tokens}, {"macs", v.macs},
          {"params", v.params}, {"model", options_json(v.opts)}});

  // ---- data
  const cf::data::FashionMnist fm = cf::data::load_fashion_mnist(cfg.data_dir);
  // A folder other than the full data set (fewer images, another size) is refused by name: the subsets
  // below read the counts and the 28 x 28 layout asked for (they read past the end and crashed).
  const int64_t n_train = fm.train_images.shape()[0], n_test = fm.test_images.shape()[0];
  for (const cf::Tensor* t : {&fm.train_images, &fm.test_images})
    if (t->dim() != 3 || t->shape()[1] != kImage || t->shape()[2] != kImage)
      throw cf::ValueError(cfg.data_dir + ": images are " + cf::shape_str(t->shape()) +
                           ", the model takes 28 x 28 Fashion-MNIST images");
  if (cfg.train_size + cfg.val_size > n_train || cfg.test_size > n_test)
    throw cf::ValueError(cfg.data_dir + " holds " + str(n_train) + " training and " + str(n_test) +
                         " test images; --train-size + --val-size = " + str(cfg.train_size + cfg.val_size) +
                         " and --test-size = " + str(cfg.test_size) + " need more");
  auto train_ds = subset(fm.train_images, fm.train_labels, 0, cfg.train_size);
  // validation: the last val_size training images (images 60000 - val_size on of the full set)
  auto val_ds = subset(fm.train_images, fm.train_labels, n_train - cfg.val_size, cfg.val_size);
  auto test_ds = subset(fm.test_images, fm.test_labels, 0, cfg.test_size);
  emit({{"event", "data"}, {"dir", cfg.data_dir}, {"train", cfg.train_size}, {"val", cfg.val_size},
        {"test", cfg.test_size}, {"classes", kClasses}});
  if (train_ds->size() < cfg.batch_size)
    throw cf::ValueError("[cf-vit] the training set (" + str(train_ds->size()) +
                         " images) is smaller than one batch of " + str(cfg.batch_size));
  cf::data::DataLoaderOptions eo;
  eo.batch_size = cfg.eval_batch_size;
  cf::data::DataLoader val_loader(val_ds, eo), test_loader(test_ds, eo);
  if (!tc.checkpoint_dir.empty()) cf::apps::make_dir(tc.checkpoint_dir, "cf-vit", "--checkpoint-dir");
  const json data_sig = {{"dir", cfg.data_dir}, {"train", cfg.train_size}, {"val", cfg.val_size}};

  std::map<std::string, VariantResult> results;  // by Variant::file
  for (int64_t seed : cfg.seeds)
    for (const Variant& v : variants)
      train_variant(cfg, dev, train_ds, val_loader, test_loader, data_sig, seed, v, results);
  summarise(cfg, variants, results, t_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-vit",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::parse_device(cfg.device);
        return true;
      },
      [&] { return run(cfg, dev); });
}
