#pragma once
// What `cf-bench attention|model` and `cf-efficiency` measure the same way: the
// options each attention variant is benchmarked with at sequence length N, the
// memory guard for dense attention, median wall time with warm-up and device
// synchronisation, peak bytes from the device's allocator, and one training /
// inference step of a Transformer encoder classifier with any attention.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cf.h"

namespace cf::apps {

// Total memory of this machine in GiB (8 when it cannot be read).
inline double physical_gib() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) / double(1 << 30) : 8.0;
}

// A benchmarked variant is a registry name, optionally followed by option overrides
// after colons: "improved-clustered:centroid_path=dense:topk=16". A value that reads
// as a JSON number, true or false is one; anything else is a string.
inline std::string variant_type(const std::string& variant) { return variant.substr(0, variant.find(':')); }

// The overrides of `variant` as a JSON object (empty without a colon); throws
// std::invalid_argument naming the variant for an entry that is not key=value.
inline nlohmann::json variant_overrides(const std::string& variant) {
  nlohmann::json out = nlohmann::json::object();
  size_t at = variant.find(':');
  while (at != std::string::npos) {
    const size_t next = variant.find(':', at + 1);
    const std::string item = variant.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    const size_t eq = item.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == item.size())
      throw std::invalid_argument("variant '" + variant + "': expected name:key=value[:key=value...], got '" +
                                  item + "'");
    const std::string key = item.substr(0, eq), text = item.substr(eq + 1);
    if (key == "type")
      throw std::invalid_argument("variant '" + variant + "': the type is the name before the first colon, not an "
                                  "option");
    nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    out[key] = value.is_number() || value.is_boolean() ? value : nlohmann::json(text);
    at = next;
  }
  return out;
}

// The defaults each variant type is benchmarked with at sequence length n: the
// settings its paper's efficiency claims are stated for. One entry per type that needs
// any; a type not listed runs with its defaults.
inline nlohmann::json bench_type_options(const std::string& variant, int64_t n) {
  // Reformer: LSH-8 (its best setting, section 5) with chunks of 64, the defaults of the reformer-pytorch port the
  // ClusterFormer comparison used; n_buckets follows from N (2N/64). Fixed rotations: every repeat times the same work.
  if (variant == "lsh") return {{"n_hashes", 8}, {"bucket_size", 64}, {"seed", 0}};
  // Routing Transformer: sqrt(N) clusters of sqrt(N) tokens, the setting of its O(N^1.5 d) complexity (section 4.1).
  if (variant == "routing") return {{"n_clusters", int64_t(std::lround(std::sqrt(double(n))))}};
  // Vyas et al. 2020 benchmark clustered attention with C = 100 (and top-32 keys).
  if (variant == "clustered") return {{"clusters", 100}};
  if (variant == "improved-clustered") return {{"clusters", 100}, {"topk", 32}};
  // Cluster-Former (paper section 4.2: 64-512 clusters, chunks of the stride m = 224
  // for QA, 128 for LM); the bank only receives the states here (no K-Means in the timing).
  if (variant == "cluster-former") return {{"num_clusters", 64}, {"chunk_size", 256}, {"memory_size", 16384}};
  // ClusterFormer appendix E: k = sqrt(max length).
  if (variant == "neural-clustering") return {{"clusters", std::max<int64_t>(1, std::llround(std::sqrt(double(n))))}};
  return nlohmann::json::object();
}

// The options `variant` (type and overrides, above) is benchmarked with at length n.
inline nlohmann::json bench_attention_options(const std::string& variant, int64_t n) {
  nlohmann::json o = bench_type_options(variant_type(variant), n);
  const nlohmann::json overrides = variant_overrides(variant);  // alive while items() walks it
  for (auto& [key, value] : overrides.items()) o[key] = value;
  return o;
}

// GiB of one float32 score matrix (batch_heads, n, n): a dense variant holds about
// 3 of them in the forward and 6 with the backward (per layer); rows that would
// need more than --max-gib are skipped rather than swapped.
inline double dense_scores_gib(int64_t batch_heads, int64_t n) {
  return double(batch_heads) * double(n) * double(n) * 4.0 / double(1 << 30);
}

// Variants that build an (N x N) score matrix (the memory guard applies to them):
// cf-bench's "full-dense" row. "full" runs the fused kernel (O(N d) memory).
inline bool is_dense_attention(const std::string& variant) { return variant == "full-dense"; }

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline void device_sync(cf::Device dev) {
  if (dev.is_cuda()) cf::cuda::synchronize();
}

// One timed measurement: `warmup` untimed calls, then `reps` timed calls, each
// ending with a synchronisation of `dev` (a time covers the work, not its launch).
// Peak bytes are counted from before the warm-up (so one-time allocations such as
// optimizer state are in it); base_bytes is what was live once the warm-up ended.
struct Measurement {
  double median_s = 0;
  std::vector<double> samples_s;
  int64_t peak_bytes = 0;
  int64_t base_bytes = 0;
  // Host round trips inside one call of f (the last timed one; the timing's own
  // synchronisation excluded): 0 on the CPU.
  cf::cuda::TransferStats transfers;
  // Kernel calls of that call on `dev` (core/kernel_calls.h; on CUDA about its launches).
  int64_t kernel_calls = 0;
};

inline Measurement measure(int64_t reps, int64_t warmup, cf::Device dev, const std::function<void()>& f) {
  using Clock = std::chrono::steady_clock;
  Measurement m;
  cf::reset_peak_memory(dev);
  for (int64_t i = 0; i < warmup; ++i) f();
  device_sync(dev);
  m.base_bytes = cf::memory_stats(dev).live_bytes;
  for (int64_t r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const cf::cuda::TransferStats before = cf::cuda::transfer_stats();
    const cf::KernelCalls calls_before = cf::kernel_calls();
    f();
    m.transfers = cf::cuda::transfer_stats() - before;
    const cf::KernelCalls calls = cf::kernel_calls() - calls_before;
    m.kernel_calls = dev.is_cuda() ? calls.cuda : calls.cpu;
    device_sync(dev);
    m.samples_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  m.median_s = median(m.samples_s);
  m.peak_bytes = cf::memory_stats(dev).peak_bytes;
  return m;
}

// Wall time of one call of f (ending with a synchronisation of `dev`).
inline double time_once(cf::Device dev, const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  device_sync(dev);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median wall time of `reps` calls of f after one warm-up call.
inline double time_median(int64_t reps, cf::Device dev, const std::function<void()>& f) {
  using Clock = std::chrono::steady_clock;
  f();
  device_sync(dev);
  std::vector<double> t;
  for (int64_t r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    f();
    device_sync(dev);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

// A Transformer encoder classifier with attention `variant` (options from
// bench_attention_options) on random tokens: token embedding + sinusoidal
// positions, post-LN layers (ReLU, no dropout), mean pooling, a linear head and
// cross-entropy, trained with AdamW. apps/bench/peers.py builds the same model
// in PyTorch for cf-bench's side-by-side table.
struct EncoderBenchConfig {
  std::string variant = "full";
  int64_t n = 128, batch = 8, layers = 2, d_model = 256, heads = 4, d_ff = 1024;
  int64_t vocab = 1000, classes = 10;
  uint64_t seed = 0;
  cf::Device device = cf::Device::cpu();
  double dropout = 0.0;  // the layers' dropout (the benchmarks time without: 0)
  // The parameters' dtype: bfloat16/float16 parameters train on AdamW's float32 masters (tests)
  cf::DType param_dtype = cf::kFloat32;
};

class EncoderBench {
 public:
  explicit EncoderBench(const EncoderBenchConfig& cfg) : cfg_(cfg), gen_(cfg.seed) {
    cf::models::TransformerConfig c;
    c.vocab_size = cfg.vocab;
    c.max_len = cfg.n;
    c.n_layers = cfg.layers;
    c.num_classes = cfg.classes;
    c.pad_id = -1;  // random tokens: none of them is padding
    c.layer.d_model = cfg.d_model;
    c.layer.n_heads = cfg.heads;
    c.layer.d_ff = cfg.d_ff;
    c.layer.dropout = cfg.dropout;
    c.layer.activation = "relu";
    c.layer.norm_first = false;
    c.layer.attention.type = variant_type(cfg.variant);
    c.layer.attention.options = cf::nn::Config(bench_attention_options(cfg.variant, cfg.n), "attention");
    model_ = std::make_unique<cf::models::EncoderClassifier>(c, gen_);
    model_->to(cfg.device);
    if (cfg.param_dtype != cf::kFloat32) model_->to(cfg.param_dtype);
    ids_ = cf::randint(0, cfg.vocab, {cfg.batch, cfg.n}, gen_).to(cfg.device);
    labels_ = cf::randint(0, cfg.classes, {cfg.batch}, gen_).to(cfg.device);
  }

  int64_t num_parameters() const { return model_->num_parameters(); }
  const cf::models::EncoderClassifier& model() const { return *model_; }
  cf::models::EncoderClassifier& model() { return *model_; }
  cf::nn::AdamW* optimizer() { return opt_.get(); }  // null before the first train_step
  cf::Tensor& ids() { return ids_; }                 // the step's input, (batch, n) token ids

  // Forward, backward and an AdamW step (train mode). Variants with auxiliary
  // losses (clustering, commitment) add them with weight 1 each.
  void train_step() {
    if (!opt_) opt_ = std::make_unique<cf::nn::AdamW>(model_->named_parameters());
    opt_->zero_grad();
    loss(ids_).backward();
    opt_->step();
  }

  // The training loss of the model on token ids (batch, n) of the model's device and the bench's
  // labels: cross-entropy plus the auxiliary losses, weight 1 each.
  cf::Tensor loss(const cf::Tensor& ids) {
    cf::nn::AuxLosses aux;
    cf::Tensor loss = cf::nn::cross_entropy(model_->forward(ids, cf::Tensor(), &aux), labels_);
    if (!aux.empty()) {
      std::map<std::string, double> weights;
      for (const std::string& name : aux.names()) weights[name] = 1.0;
      loss = loss + aux.total(weights);
    }
    return loss;
  }

  // One forward in eval mode under NoGradGuard (the logits of the previous call
  // are freed first, so a peak is one call's). What training holds (gradients, the
  // optimizer and its state, made by the first train_step) is freed by
  // measure_infer and set_training(false): an inference peak is parameters and
  // activations (it counted a train step's gradients and AdamW's two moments).
  void infer_step() {
    cf::NoGradGuard ng;
    logits_ = cf::Tensor();
    logits_ = model_->forward(ids_);
  }

  // Train / eval mode for callers that time single steps themselves.
  void set_training(bool on) {
    if (on) {
      model_->train();
    } else {
      model_->eval();
      free_training_state();
    }
  }

  Measurement measure_train(int64_t reps, int64_t warmup) {
    model_->train();
    return measure(reps, warmup, cfg_.device, [&] { train_step(); });
  }
  // The training step captured once as a CUDA graph (core/cuda_graph.h) after an eager step made
  // the optimizer's state, then timed as replays (each one step: the optimizer's step counts and
  // learning rate refreshed). DeviceError for a step a graph cannot hold (random draws).
  Measurement measure_train_graph(int64_t reps) {
    model_->train();
    train_step();
    cf::cuda::Graph graph;
    graph.capture([&] { train_step(); }, cfg_.device);
    return measure(reps, 1, cfg_.device, [&] { graph.replay(); });
  }
  // The inference step (eval mode, no gradients) captured once after an eager call, timed as replays.
  Measurement measure_infer_graph(int64_t reps) {
    model_->eval();
    free_training_state();
    infer_step();
    cf::cuda::Graph graph;
    graph.capture([&] { infer_step(); }, cfg_.device);
    return measure(reps, 1, cfg_.device, [&] { graph.replay(); });
  }
  Measurement measure_infer(int64_t reps, int64_t warmup) {
    model_->eval();
    free_training_state();
    return measure(reps, warmup, cfg_.device, [&] { infer_step(); });
  }

 private:
  void free_training_state() {
    model_->zero_grad();
    opt_.reset();
  }
  EncoderBenchConfig cfg_;
  cf::Generator gen_;
  std::unique_ptr<cf::models::EncoderClassifier> model_;
  std::unique_ptr<cf::nn::AdamW> opt_;
  cf::Tensor ids_, labels_, logits_;
};

}  // namespace cf::apps
