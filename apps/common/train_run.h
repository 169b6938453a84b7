#pragma once
// One model trained the way every app trains (DESIGN.md section 9): AdamW with
// linear warmup and cosine decay to 5% of the peak rate, gradient clipping at 1,
// "train" and "val" JSON lines, a progress bar, the peak memory of training,
// and safetensors checkpoints: an unfinished checkpoint written with the same
// settings resumes, a finished one is reused without training, and one written
// with other settings is refused, naming the file.
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cf.h"
#include "core/json.h"
#include "common/distributed.h"
#include "common/options.h"
#include "common/precision.h"
#include "common/report.h"
#include "nn/checkpoint.h"

namespace cf::apps {

struct TrainSettings {
  int64_t steps = 300, warmup = 30, eval_every = 100, log_every = 25;
  double lr = 3e-3, weight_decay = 0.01;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t stop_after = 0;  // > 0: end the run after this many steps of one model (see TrainingStopped)
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (autocast; fp16 with dynamic loss scaling)
  bool cuda_graph = false;         // steps replayed as a CUDA graph (train_loop's cuda_graph; apps with a load hook)
};

// Registers steps, warmup, eval_every, log_every, lr, weight_decay,
// checkpoint_dir, checkpoint_every and stop_after.
inline void add_train_options(Options& o, TrainSettings& c) {
  o.add_int("steps", &c.steps, 1, "optimizer steps per model");
  o.add_int("warmup", &c.warmup, 0, "linear warmup steps before the cosine decay");
  o.add_int("eval_every", &c.eval_every, 0, "validate every N steps (0: only at the end)");
  o.add_int("log_every", &c.log_every, 0, "a train line every N steps (the mean loss since the last one), and at the end");
  o.add_number("lr", &c.lr, "peak learning rate (AdamW)");
  o.add_number("weight_decay", &c.weight_decay, "AdamW weight decay");
  o.add_string("checkpoint_dir", &c.checkpoint_dir,
               "save each trained model there (<run>-seed<S>.safetensors) and reuse it on the next run with the "
               "same settings: a finished model is not retrained, an unfinished one resumes");
  o.add_int("checkpoint_every", &c.checkpoint_every, 0, "also checkpoint every N steps (0: at the end only)");
  o.add_string("precision", &c.precision,
               "fp32, or bf16 / fp16: the training steps' forward passes run under autocast (matmuls in that "
               "dtype, softmax, norms and losses in float32, parameters in float32), fp16 with dynamic loss "
               "scaling");
  o.add_int("stop_after", &c.stop_after, 0,
            "end this run after N training steps of a model, its checkpoint written (exit status 3); the same "
            "command continues from there (0: run to the end)");
}

// --cuda-graph, for the apps whose TrainHooks have a load hook (the data split from the loss).
inline void add_cuda_graph_option(Options& o, TrainSettings& c) {
  o.add_flag("cuda_graph", &c.cuda_graph,
             "with --device cuda: each training step after the second replays a CUDA graph of the second (one "
             "launch a step instead of hundreds: nn::train_loop's cuda_graph); batches are padded to the longest "
             "text so every step has the same shapes; not with --precision fp16 or --distributed");
}

inline void check_train_settings(const TrainSettings& c) {
  if (!(c.lr > 0)) throw UsageError("--lr must be positive");
  if (c.weight_decay < 0) throw UsageError("--weight-decay must be non-negative");
  if (c.stop_after > 0 && c.checkpoint_dir.empty())
    throw UsageError("--stop-after needs --checkpoint-dir (the next run continues from the checkpoint)");
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty())  // (it was ignored without a word)
    throw UsageError("--checkpoint-every needs --checkpoint-dir (where the checkpoints go)");
  check_precision(c.precision);
  if (c.warmup >= c.steps)
    throw UsageError("--warmup (" + std::to_string(c.warmup) + ") must be less than --steps (" +
                     std::to_string(c.steps) + ")");
}

// --cuda-graph's requirements a command line shows (train_model checks that the app loads its data apart).
inline void check_cuda_graph_settings(const TrainSettings& c, const std::string& device, bool distributed) {
  if (!c.cuda_graph) return;
  if (device.rfind("cuda", 0) != 0) throw UsageError("--cuda-graph needs --device cuda, got --device " + device);
  if (c.precision == "fp16")
    throw UsageError("--cuda-graph does not take --precision fp16 (the loss scaler skips steps on the host); use bf16");
  if (distributed) throw UsageError("--cuda-graph does not take --distributed (collectives run inside the backward)");
}

// What shapes training, for a checkpoint's signature.
inline nlohmann::ordered_json train_signature(const TrainSettings& c) {
  nlohmann::ordered_json j = {{"steps", c.steps}, {"warmup", c.warmup}, {"lr", c.lr}, {"weight_decay", c.weight_decay}};
  if (c.precision != "fp32") j["precision"] = c.precision;  // fp32 runs keep their old signature
  if (c.cuda_graph) j["cuda_graph"] = true;                 // (the app pads its batches to one length)
  return j;
}

// Where two checkpoint signatures differ, as "key.path (saved X, now Y)" entries (at most `limit`, then "...");
// a key one side lacks reads "absent". What the refusal of a checkpoint written with other settings names.
inline void signature_differences(const nlohmann::ordered_json& saved, const nlohmann::ordered_json& now,
                                  const std::string& path, std::vector<std::string>& out) {
  if (saved.is_object() && now.is_object()) {
    for (auto it = saved.begin(); it != saved.end(); ++it) {
      const std::string key = path.empty() ? it.key() : path + "." + it.key();
      if (now.contains(it.key())) signature_differences(it.value(), now.at(it.key()), key, out);
      else out.push_back(key + " (saved " + cf::io::json_line(it.value()) + ", now absent)");
    }
    for (auto it = now.begin(); it != now.end(); ++it)
      if (!saved.contains(it.key()))
        out.push_back((path.empty() ? it.key() : path + "." + it.key()) + " (saved absent, now " + cf::io::json_line(it.value()) + ")");
    return;
  }
  if (saved != now) out.push_back((path.empty() ? std::string("the settings") : path) + " (saved " + cf::io::json_line(saved) +
                                  ", now " + cf::io::json_line(now) + ")");
}
inline std::string signature_difference_text(const std::string& saved_text, const nlohmann::ordered_json& now) {
  nlohmann::ordered_json saved;
  try {
    saved = cf::io::parse_ordered_json(saved_text);
  } catch (const std::exception&) {
    return "";  // an unreadable signature: the refusal says no more
  }
  std::vector<std::string> diffs;
  signature_differences(saved, now, "", diffs);
  std::string text;
  for (size_t i = 0; i < diffs.size() && i < 4; ++i) text += (i ? "; " : "") + diffs[i];
  if (diffs.size() > 4) text += "; ...";
  return text;
}

// task + the weighted auxiliary losses the forward pass collected (ClusterFormer
// eq. 17: mu L1 + nu L2; routing's commitment loss). A loss added without a
// weight is an error: a typo must not drop a loss silently.
inline cf::Tensor total_loss(const cf::Tensor& task, const cf::nn::AuxLosses& aux,
                             const std::map<std::string, double>& weights) {
  if (aux.empty()) return task;
  std::map<std::string, double> used;
  for (const std::string& name : aux.names()) {
    auto it = weights.find(name);
    if (it == weights.end())
      throw cf::ValueError("[train] the model added the auxiliary loss '" + name + "', which has no weight");
    used[name] = it->second;
  }
  return task + aux.total(used);
}

struct TrainRun {
  std::string app;                  // names errors: "cf-textcls"
  nlohmann::ordered_json tags;      // put in every event line after "event" ({"seed": 0, "run": "full"})
  nlohmann::ordered_json signature; // what a reused checkpoint must have been written with
  std::string checkpoint;           // path, or empty: no checkpoints
  cf::Device device;
  std::string metric_name = "accuracy", metric_mode = "max";  // of evaluate()
  // Generators besides the global one whose state a checkpoint keeps (e.g. the
  // one that draws training windows).
  std::vector<std::pair<std::string, cf::Generator*>> generators;
};

struct TrainHooks {
  // The loss of step `step` (1-based); sets *task to the task loss alone (a one-element tensor, summed
  // on the device for the train lines and read when one is written).
  std::function<cf::Tensor(int64_t step, cf::Tensor* task)> loss;
  // Loads step's batch into the tensors `loss` reads (optional; needed by --cuda-graph): train_loop's
  // load_batch.
  std::function<void(int64_t step)> load;
  std::function<double()> evaluate;                  // the validation metric (optional)
  std::function<void(int64_t step)> after_step;      // e.g. memory-bank updates (optional)
  std::function<void(int64_t start_step)> resumed;   // e.g. move a data loader (optional)
};

struct TrainResult {
  bool trained = false;    // false: a finished checkpoint was reused
  // Wall time of the training steps and peak allocator bytes above what was live
  // before them; for a model resumed from a checkpoint, summed (time) and the
  // maximum (memory) over every run that trained it. 0 when a finished model was reused.
  double time_s = 0;
  int64_t peak_bytes = 0;
  double last_loss = std::nan("");
};

inline TrainResult train_model(cf::nn::Module& model, const TrainSettings& cfg, const TrainRun& run,
                               const TrainHooks& hooks) {
  using ojson = nlohmann::ordered_json;
  auto event = [&](const char* name) {
    ojson j = {{"event", name}};
    for (auto& [k, v] : run.tags.items()) j[k] = v;
    return j;
  };
  if (cfg.cuda_graph) {
    check_cuda_graph_settings(cfg, run.device.str(), distributed());
    if (!hooks.load)
      throw UsageError("--cuda-graph is not supported by " + run.app +
                       "'s training of this model (its data is not "
                       "loaded apart from the loss)");
  }
  // --distributed: DDP averages the gradients of the ranks' shards (the model is
  // the caller's: a non-owning pointer). Built before the optimizer reads the
  // parameters and before a checkpoint is loaded (every rank loads the same file).
  std::unique_ptr<cf::nn::DistributedDataParallel> ddp;
  if (distributed()) ddp = std::make_unique<cf::nn::DistributedDataParallel>(std::shared_ptr<cf::nn::Module>(
                         std::shared_ptr<cf::nn::Module>(), &model));
  cf::nn::AdamWOptions ao;
  ao.lr = cfg.lr;
  ao.weight_decay = cfg.weight_decay;
  cf::nn::AdamW opt(model.named_parameters(), ao);
  cf::nn::WarmupCosineLR schedule(cfg.lr, cfg.warmup, cfg.steps, cfg.lr * 0.05);
  // --precision: the autocast dtype of the training forward passes; fp16 also
  // scales the loss (its gradients would underflow), with the scaler's state in
  // the checkpoint.
  const std::optional<cf::DType> autocast = precision_dtype(cfg.precision);
  cf::nn::GradScaler scaler;

  TrainResult result;
  int64_t start_step = 0;
  // Training time and peak memory of the runs before this one (a model trained in
  // several runs, --stop-after or an interruption, reports their sum and maximum).
  double earlier_time_s = 0;
  int64_t earlier_peak_bytes = 0;
  if (!run.checkpoint.empty() && file_exists(run.checkpoint)) {
    cf::nn::TrainingCheckpoint ck = cf::nn::load_checkpoint(run.checkpoint);
    // Checked against the file, naming it: a bad value used to surface as a bare
    // "stod" or as "[DataLoader::set_state] batch -5 is outside ..." (issue 27).
    auto bad = [&](const std::string& what) {
      return cf::IOError("[" + run.app + "] checkpoint '" + run.checkpoint + "': " + what);
    };
    auto number = [&](const char* key) {
      auto v = ck.extra.find(key);
      if (v == ck.extra.end()) return 0.0;
      size_t used = 0;
      double x = 0;
      try {
        x = std::stod(v->second, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != v->second.size() || !std::isfinite(x) || x < 0)
        throw bad(std::string("metadata 'extra.") + key + "' = '" + v->second + "' is not a non-negative number");
      return x;
    };
    if (ck.step < 0 || ck.step > cfg.steps)
      throw bad("holds step " + std::to_string(ck.step) + ", outside [0, " + std::to_string(cfg.steps) +
                "] of this run's --steps");
    earlier_time_s = number("train_time_s");
    earlier_peak_bytes = int64_t(number("train_peak_bytes"));
    auto it = ck.extra.find("signature");
    if (it == ck.extra.end() || it->second != cf::io::json_line(run.signature)) {
      const std::string diff = it == ck.extra.end() ? "" : signature_difference_text(it->second, run.signature);
      throw cf::ValueError("[" + run.app + "] checkpoint '" + run.checkpoint +
                           "' was written with other settings (model, data or training options" +
                           (diff.empty() ? std::string() : ": " + diff) +
                           "); delete it or use another --checkpoint-dir");
    }
    // A state that does not load (a damaged tensor, a wrong entry) names the checkpoint file too.
    try {
      model.load_state_dict(ck.model);  // CPU tensors into the model's device
      opt.load_state_dict(ck.optimizer);
      if (!ck.scaler.empty()) scaler.load_state_dict(ck.scaler);
      for (auto& [name, g] : ck.generators) {
        if (name == "default") g.restore(cf::default_generator());
        for (auto& [own, gen] : run.generators)
          if (own == name) g.restore(*gen);
      }
    } catch (const cf::DeviceError&) {
      throw;  // the device's own failure (out of memory, a CUDA error), not the file's
    } catch (const cf::Error& e) {
      throw bad(e.what());
    }
    start_step = ck.step;
    if (hooks.resumed) hooks.resumed(start_step);
    ojson j = event("resume");
    j["checkpoint"] = run.checkpoint;
    j["step"] = start_step;
    emit(j);
  }
  if (cf::dist::world_size() > 1) {
    // Every rank decides to resume on its own (a checkpoint folder only rank 0 sees, a stale copy on one
    // node): ranks at different steps trained with wrong losses until a later collective failed, or hung.
    cf::Tensor steps = cf::Tensor::from_vector(std::vector<int64_t>{start_step, -start_step}, {2});
    cf::dist::all_reduce(steps, cf::dist::ReduceOp::max);
    const std::vector<int64_t> s = steps.to_vector<int64_t>();
    if (s[0] != -s[1])
      throw cf::ValueError("[" + run.app + "] the ranks resume from different steps (" + std::to_string(-s[1]) +
                           " to " + std::to_string(s[0]) + "; this rank, " + std::to_string(cf::dist::rank()) +
                           ", from " + std::to_string(start_step) + (run.checkpoint.empty() ? "" : " with '" +
                           run.checkpoint + "'" + (file_exists(run.checkpoint) ? "" : ", which it does not see")) +
                           "): every rank must see the same checkpoint");
  }
  if (start_step >= cfg.steps) return result;
  // Set when the steps start (below); read by save() and at the end.
  std::chrono::steady_clock::time_point t_train;
  int64_t live_before = 0;
  auto train_time_s = [&] { return earlier_time_s + seconds_since(t_train); };
  auto train_peak_bytes = [&] {
    return std::max(earlier_peak_bytes, cf::memory_stats(run.device).peak_bytes - live_before);
  };
  auto save = [&](int64_t step) {
    cf::nn::TrainingCheckpoint ck;
    ck.model = cf::nn::state_on_cpu(model.state_dict());  // a checkpoint holds CPU tensors (nn/checkpoint.h)
    ck.optimizer = cf::nn::state_on_cpu(opt.state_dict());
    if (cfg.precision == "fp16") ck.scaler = scaler.state_dict();
    ck.step = step;
    ck.generators = {{"default", cf::nn::GeneratorState::of(cf::default_generator())}};
    for (auto& [name, gen] : run.generators) ck.generators.emplace_back(name, cf::nn::GeneratorState::of(*gen));
    ck.extra["signature"] = cf::io::json_line(run.signature);  // (paths that are not UTF-8: U+FFFD, as in the events)
    ck.extra["train_time_s"] = std::to_string(train_time_s());
    ck.extra["train_peak_bytes"] = std::to_string(train_peak_bytes());
    cf::nn::save_checkpoint_rank0(run.checkpoint, ck);  // rank 0 writes; a single process just saves
  };

  cf::nn::TrainLoopOptions lo;
  lo.max_steps = cfg.steps;
  lo.start_step = start_step;
  lo.eval_every = hooks.evaluate ? cfg.eval_every : 0;
  lo.clip_norm = 1.0;
  lo.cuda_graph = cfg.cuda_graph;
  lo.metric_name = run.metric_name;
  lo.metric_mode = run.metric_mode;
  cf::nn::ProgressBarOptions po;
  po.total = cfg.steps;
  po.initial = start_step;
  po.desc = "train";
  for (auto& [k, v] : run.tags.items()) po.desc += " " + (v.is_string() ? v.get<std::string>() : k + " " + cf::io::json_line(v));
  po.unit = "step";
  static std::ostream silent(nullptr);  // ranks other than 0 draw no progress bar
  if (cf::dist::rank() != 0) po.out = &silent;
  cf::nn::ProgressBar bar(po);
  cf::nn::TrainLoopHooks loop_hooks;
  loop_hooks.model = &model;
  loop_hooks.schedule = &schedule;
  loop_hooks.progress = &bar;
  if (hooks.evaluate) loop_hooks.evaluate = hooks.evaluate;
  if (cfg.precision == "fp16") loop_hooks.scaler = &scaler;
  if (hooks.load) loop_hooks.load_batch = [&](int64_t step, int64_t) { hooks.load(step); };
  // The task losses since the last train line, summed on the device (a replayed step adds its own),
  // read when a line is written.
  cf::Tensor task_acc = cf::Tensor::zeros({}, cf::kFloat64, run.device);
  double loss_sum = 0, task_sum = 0;
  int64_t loss_n = 0;
  t_train = std::chrono::steady_clock::now();
  // The step's own model updates (cf-lm's memory banks) before its validation (the loop's order): a val
  // line measured the centroids of the step before, one re-clustering behind the model kept.
  if (hooks.after_step) loop_hooks.after_update = hooks.after_step;
  loop_hooks.on_step_end = [&](const cf::nn::TrainStepInfo& info) {
    loss_sum += info.loss;
    ++loss_n;
    const bool stop = !run.checkpoint.empty() && cfg.stop_after > 0 && info.step - start_step >= cfg.stop_after &&
                      info.step < cfg.steps;
    // every --log-every steps, and the last window however short (at the end of training or a --stop-after)
    if (cfg.log_every > 0 && (info.step % cfg.log_every == 0 || info.step == cfg.steps || stop)) {
      task_sum = task_acc.item();
      {
        cf::NoGradGuard ng;
        cf::fill_(task_acc, 0.0);
      }
      if (distributed()) {  // the loss of the global batch: the mean over ranks' shards
        cf::Tensor sums = cf::Tensor::from_vector(std::vector<double>{loss_sum, task_sum}, {2});
        cf::dist::all_reduce(sums, cf::dist::ReduceOp::mean);
        loss_sum = sums.to_vector<double>()[0];
        task_sum = sums.to_vector<double>()[1];
      }
      ojson j = event("train");
      j["step"] = info.step;
      j["loss"] = loss_sum / double(loss_n);  // what is minimised: task + weighted auxiliary losses
      j["task_loss"] = task_sum / double(loss_n);
      j["lr"] = info.lr;
      j["elapsed_s"] = seconds_since(t_train);
      emit(j);
      result.last_loss = loss_sum / double(loss_n);
      loss_sum = task_sum = 0;
      loss_n = 0;
    }
    if (info.evaluated) {
      ojson j = event("val");
      j["step"] = info.step;
      j[run.metric_name] = info.metric;
      emit(j);
    }
    if (!run.checkpoint.empty() &&
        ((cfg.checkpoint_every > 0 && info.step % cfg.checkpoint_every == 0) || info.step == cfg.steps || stop))
      save(info.step);
    if (stop) {
      ojson j = event("stopped");
      j["step"] = info.step;
      j["checkpoint"] = run.checkpoint;
      emit(j);
      throw TrainingStopped("stopped after " + std::to_string(info.step - start_step) +
                            " steps as --stop-after asked: '" + run.checkpoint + "' holds step " +
                            std::to_string(info.step) + " of " + std::to_string(cfg.steps) +
                            "; run the same command again to continue");
    }
  };
  cf::reset_peak_memory(run.device);
  live_before = cf::memory_stats(run.device).live_bytes;
  auto step_loss = [&](int64_t step, int64_t) {
    cf::AutocastGuard guard(autocast);
    cf::Tensor task;
    cf::Tensor loss = hooks.loss(step, &task);
    if (!task.defined() || task.numel() != 1 || task.device() != run.device)
      throw cf::ValueError("[" + run.app + "] the training loss hook set a task loss of " +
                           (task.defined() ? task.describe() : std::string("undefined")) + ", not one element on " +
                           run.device.str());
    cf::NoGradGuard ng;
    cf::add_(task_acc, cf::reshape(cf::to(task.detach(), cf::kFloat64), {}));
    return loss;
  };
  cf::nn::train_loop(opt, step_loss, lo, loop_hooks);
  if (run.device.is_cuda()) cf::cuda::synchronize();
  result.time_s = train_time_s();
  result.peak_bytes = train_peak_bytes();
  result.trained = true;
  return result;
}

}  // namespace cf::apps
