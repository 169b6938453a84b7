#pragma once
// Optimizer base: parameter groups built from named parameters, step(),
// zero_grad(), a settable learning rate, and a strict state dict holding every
// per-parameter buffer keyed by parameter name, so a checkpoint restores the
// optimizer and training resumes bit-identically.
//
// State dict layout (all entries are snapshots, i.e. copies):
//   "step"                 0-d int64: number of step() calls so far
//   "lr"                   0-d float64: the current base learning rate
//   "<slot>.<param name>"  one buffer per slot and parameter, the parameter's
//                          shape and dtype (slots: SGD "momentum"; Adam/AdamW
//                          "exp_avg", "exp_avg_sq")
//   "step.<param name>"    0-d int64: how many updates this parameter received
//                          (present when the optimizer has per-parameter slots)
//   "master.<param name>"  float32 master copy of a bfloat16/float16 parameter
//
// Low-precision parameters (mixed precision, docs/design-notes.md): the optimizer keeps a
// float32 master copy of each bfloat16/float16 parameter and float32 slots; step() widens the
// gradient, updates the master with the float32 formulas and rounds it back into the
// parameter, so small updates accumulate in the master instead of vanishing below the
// parameter's precision (a bfloat16 weight near 1 cannot move by less than 2^-8).
// load_state_dict is strict: it lists every missing, unexpected or wrongly
// shaped entry in one error and changes nothing unless everything fits. "step"
// and the per-parameter steps may be int64 or float64 holding an integer. Slots and
// masters may sit on any device (a CPU checkpoint resumes a CUDA run): each is copied
// to its parameter's device.
//
// Parameters without a gradient are skipped by step() (as in PyTorch): their
// buffers and their per-parameter step stay as they are. Updates run under
// NoGradGuard. On the CPU a contiguous parameter is updated by one fused loop
// (OpenMP above 32768 elements); other parameters (non-contiguous, or on another
// device) go through the public in-place ops, with the same formulas.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/state_dict.h"

namespace cf {
namespace nn {

// A set of parameters sharing hyperparameters. The group's learning rate is the
// optimizer's lr() times lr_scale (so a schedule that sets lr() moves every
// group); weight_decay, when set, replaces the optimizer's weight decay (the
// usual use: no decay for biases and norm weights).
struct ParamGroup {
  StateDict params;
  double lr_scale = 1.0;
  std::optional<double> weight_decay;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient. Every gradient is checked
  // (shape, dtype, device) before any parameter changes. Inside a cuda::Graph capture the
  // update is a replayable part (core/cuda_graph.h): each replay after the first runs the host
  // half again (step counts, bias corrections, the learning rate set then) without allocating.
  // That holds for low-precision parameters too (their masters step in the multi-tensor kernel)
  // unless one is strided or shares memory with another (update_one widens its gradient with a
  // new tensor), or was written outside the optimizer since the last step (current_master). The
  // first replay is the captured step itself: an lr set between the capture and it does not reach it.
  void step();
  // Drops every parameter's gradient (PyTorch's set_to_none=True).
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  // Number of step() calls so far (restored by load_state_dict).
  int64_t step_count() const { return step_count_; }
  // The float32 master copy of a low-precision parameter called `name`, or an undefined tensor.
  Tensor master(const std::string& name) const;
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Changes group `group`'s lr_scale, or its weight decay (nullopt: the optimizer's), between
  // steps (PyTorch's param_groups[i]["lr"] = ...). Not in the state dict: groups are configuration.
  void set_group_lr_scale(size_t group, double lr_scale);
  void set_group_weight_decay(size_t group, std::optional<double> weight_decay);
  // The weight decay of the groups that set none.
  double weight_decay() const { return weight_decay_; }
  // "SGD", "Adam", "AdamW".
  const std::string& name() const { return name_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

 protected:
  void step_now();  // step()'s work
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);  // (step's graph part checks it)
  struct Entry {
    std::string name;
    Tensor param;
    size_t group = 0;
    int64_t step = 0;            // updates applied to this parameter
    std::vector<Tensor> slots;   // one per slot_names(), shaped like param (float32 when master)
    Tensor master;               // float32 copy of a low-precision param (else undefined)
    int64_t master_version = 0;  // param.version() when the master was last written into it
    // ... and the storage that version counts: Tensor::set_data (PyTorch's .data =) gives the
    // parameter another storage whose counter may read the same number
    std::weak_ptr<Storage> master_storage;
  };
  // e.master, refreshed where the parameter was written since the master was last rounded into it.
  static Tensor current_master(const Entry& e);
  // Brings e's master and slots to its parameter's current dtype and device: Module::to (and
  // Tensor::set_data) convert a parameter in place after the optimizer was built. A parameter
  // now in bfloat16/float16 gets a float32 master made from it, one now wider drops its master;
  // slots are converted and moved. No work when nothing changed.
  static void follow_param(Entry& e);
  // slot_names: the per-parameter buffers this optimizer keeps ("momentum", ...).
  Optimizer(std::string name, std::vector<ParamGroup> groups, double lr,
            double weight_decay, std::vector<std::string> slot_names);
  // Apply one update to e (e.step already counts this update). grad has the
  // parameter's shape, dtype and device. Runs under NoGradGuard.
  virtual void update(Entry& e, const Tensor& grad, double lr, double weight_decay) = 0;
  // One step's updates of every parameter with a gradient, in entry order, each as update_one
  // would apply it (entries[i] with grads[i], lrs[i], weight_decays[i]). The default calls
  // update_one on each; an optimizer with a multi-tensor kernel updates the batchable ones in one
  // call (one CUDA launch per 16 parameters, where each update was a launch, and a master's
  // widening and rounding in the same pass: no allocation, so a CUDA graph can capture the step).
  virtual void update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads,
                          const std::vector<double>& lrs, const std::vector<double>& weight_decays);
  // update() on e, or for a low-precision parameter on its float32 master with the widened
  // gradient, the master then rounded into the parameter.
  void update_one(Entry& e, const Tensor& grad, double lr, double weight_decay);
  // Which entries a multi-tensor kernel may take: contiguous float32/float64 tensors (the master's
  // when there is one, and a contiguous 16-bit parameter), sharing memory with no other entry (a
  // batch updates its entries at once). The others go through update_one, in order.
  static std::vector<bool> batchable(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads);
  // update_all for an optimizer with a multi-tensor call: the batchable entries as make(entry, grad,
  // lr, weight_decay) -> Step, all handed to run(std::vector<Step>) at once (it checks every entry
  // before writing any); the others through update_one, in order.
  template <typename Step, typename Make, typename Run>
  void update_batched(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads,
                      const std::vector<double>& lrs, const std::vector<double>& weight_decays, Make make, Run run) {
    const std::vector<bool> fast = batchable(entries, grads);
    std::vector<Step> steps;
    for (size_t i = 0; i < entries.size(); ++i)
      if (fast[i]) steps.push_back(make(*entries[i], grads[i], lrs[i], weight_decays[i]));
    run(std::move(steps));
    for (size_t i = 0; i < entries.size(); ++i)
      if (!fast[i]) update_one(*entries[i], grads[i], lrs[i], weight_decays[i]);
  }
  // What a multi-tensor step updates for e: its float32 master when it has one, else the parameter;
  // and the 16-bit parameter the master is rounded into (undefined without a master).
  static const Tensor& step_target(const Entry& e) { return e.master.defined() ? e.master : e.param; }
  static Tensor low_param(const Entry& e) { return e.master.defined() ? e.param : Tensor(); }
  // "[<name>.<fn>]" for error messages.
  std::string where(const char* fn) const;
  static void check_hyper(bool ok, const std::string& where, const std::string& what);
  static void check_writable(const Tensor& p, const std::string& where, const std::string& pname);

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<Entry> entries_;
  std::vector<std::string> slot_names_;
  double lr_ = 0;
  double weight_decay_ = 0;
  int64_t step_count_ = 0;
};

// The same parameters as one group.
std::vector<ParamGroup> single_group(const StateDict& params);

}  // namespace nn
}  // namespace cf
