#pragma once
// Module: the base of every layer and model. A module owns named parameters,
// buffers and submodules, each in registration order, and names them
// recursively as "blocks.0.attn.w_q.weight".
//
// Parameters and buffers are Tensor members of the derived class, registered by
// address (register_parameter("weight", &weight_)). The module writes through
// that address when it loads a state dict or changes dtype, so the member and
// the registry never disagree. For that reason modules are neither copyable nor
// movable: hold them by std::shared_ptr.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "nn/state_dict.h"

namespace cf {
namespace nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- what the module holds, recursively, in registration order ----
  std::vector<Tensor> parameters() const;
  StateDict named_parameters() const;
  StateDict named_buffers() const;  // persistent and non-persistent
  std::vector<std::string> persistent_buffer_names() const;  // those of named_buffers() in the state dict
  std::vector<std::pair<std::string, Module*>> named_modules();  // this one first, as ""
  // Those below this one, in named_modules() order, owned: a handle stays valid after the module
  // replaces the submodule (set_attention), as the Python binding needs.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_submodules() const;
  int64_t num_parameters() const;  // number of scalar parameters

  // ---- state dict: parameters, then persistent buffers, of each module before
  // its children (PyTorch's order) ----
  StateDict state_dict() const;
  // Copies values into the registered tensors (their identity is kept), from any device (a CPU
  // checkpoint into a CUDA model: each entry crosses on its own, so at most one extra tensor). Strict:
  // missing, unexpected and wrongly shaped entries are all listed in one error. Values are converted
  // to each tensor's dtype between floating dtypes (rounded: a float64 1e300 becomes inf in float32);
  // a bool or int64 entry for a floating tensor, or the reverse, is a mismatch. (int64 and bool convert
  // to each other.) Non-strict: missing and unexpected entries are ignored, shapes and dtypes still checked.
  void load_state_dict(const StateDict& dict, bool strict = true);
  // Called on every module of the tree after load_state_dict copied the values, with the names of
  // this module's own parameters and buffers it wrote ("counters", ...): state outside the dict
  // can then be made to agree with what was loaded (a memory bank whose counters were loaded
  // without its FIFO restarts the FIFO empty). Nothing by default.
  virtual void on_state_loaded(const std::vector<std::string>& /*loaded*/) {}
  // Called by load_state_dict on every module before anything is copied, with this module's own entries
  // of the dict it would load (name -> value, as given): values that fit the shapes yet not the module (a
  // memory bank's counters past its capacity) are refused here, so a refused load changes nothing. Nothing
  // by default.
  virtual void check_state(const std::map<std::string, const Tensor*>& /*own*/) const {}
  // Calls on_state_loaded on every module with its share of `loaded` (full names, as in
  // state_dict()): load_state_dict does, and a loader that wrote tensors itself (cf.torch) must.
  void notify_state_loaded(const std::vector<std::string>& loaded);

  // ---- mode and placement ----
  virtual void train(bool on = true);
  // DistributedDataParallel calls this on every module of the model it wraps. A module whose state
  // learns from its inputs outside of gradients (a memory bank's K-Means, routing attention's
  // online centroids) then combines every rank's shard, so the replicas agree and equal one
  // process on the whole batch (and a rank-0 checkpoint holds all of it). Nothing by default.
  virtual void set_distributed(bool /*on*/) {}
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Converts float parameters and buffers (int64/bool buffers keep their dtype), each keeping
  // its identity (Tensor::set_data), so handles taken before (an optimizer's) see the new data;
  // gradients are converted too. Parameters stay leaves and keep their requires_grad.
  void to(DType dtype);
  void to(Device device);
  void zero_grad();
  // Replaces the parameter tensors, in named_parameters() order, by `values`
  // (same count, shapes, dtypes and devices), used as given: no copy, no detach. This
  // evaluates the module at other parameter values (gradcheck does so); restore
  // the old ones with set_parameters(old) where old = parameters().
  void set_parameters(const std::vector<Tensor>& values);
  // The same for the buffers, in named_buffers() order (a binding that makes the
  // module use memory another framework owns, cf.torch.Attention's).
  void set_buffers(const std::vector<Tensor>& values);

 protected:
  // `slot` must be a member of the derived module (it outlives the registration).
  // A defined parameter is made a leaf that requires grad.
  void register_parameter(const std::string& name, Tensor* slot);
  void register_buffer(const std::string& name, Tensor* slot, bool persistent = true);
  // A registered float buffer of running statistics that small updates must reach (routing's EMA
  // centroids, a memory bank's states and centroids): to(bfloat16 / float16) makes it float32
  // instead, as optimizers keep float32 masters of 16-bit parameters (an EMA step of 1e-3 is
  // below bfloat16's precision near 1). Its users convert it to their inputs' dtype.
  void keep_float32_under_16bit(const Tensor* slot);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }
  // Swap the submodule registered as `name` for another (a model switching its
  // attention variant); the name must already be registered.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Slot {
    std::string name;
    Tensor* tensor;
    bool persistent;
  };
  struct Distinct;
  std::vector<Distinct> distinct(bool params) const;
  void replace(bool params, const std::vector<Tensor>& values, const char* op);
  // f(tensor, keeps_float32): the converted tensor, or undefined to leave it.
  void convert(const std::function<Tensor(const Tensor&, bool)>& f);
  void check_new_name(const std::string& name, const char* what) const;
  bool reaches(const Module* target) const;  // target is this module or one below it
  void check_no_cycle(const std::string& name, const Module& child) const;
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);
  template <class F>
  void visit(const std::string& prefix, F&& f) const;

  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  std::vector<const Tensor*> float32_buffers_;  // keep_float32_under_16bit
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A module that maps one tensor to one tensor; what Sequential chains.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// An ordered list of submodules named "0", "1", ... (so names read "layers.3.ff.fc1.weight").
class ModuleList : public Module {
 public:
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(size_), module);  // may throw: count only after it succeeded
    ++size_;
    return module;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

}  // namespace nn
}  // namespace cf
