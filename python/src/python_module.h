#pragma once
// Modules written in Python: the C++ side of a Python class deriving from cf.nn.Module or
// cf.nn.UnaryModule. nanobind builds such an instance as one of the trampolines below. A C++ module
// registers its parameters and buffers by the address of a member (nn/module.h); a Python module has
// no members, so the trampoline owns the tensors its Python code registers, in a deque (whose elements
// never move), and the cf::nn::Module base sees them as any other slots: named_parameters, state_dict,
// load_state_dict, to(), optimizers and checkpoints work unchanged. Module attribute assignment
// (nn.cpp: __setattr__ / __getattr__) calls the methods of PythonModule.
#include <algorithm>
#include <deque>
#include <optional>
#include <map>
#include <memory>
#include <string>

#include <nanobind/trampoline.h>

#include "common.h"

namespace cfpy {

class PythonModule {
 public:
  enum class Kind { kNone, kParameter, kBuffer, kModule };
  virtual ~PythonModule() = default;
  // What `name` is registered as in this module itself (not below it).
  virtual Kind kind_of(const std::string& name) const = 0;
  // Registers a parameter (value undefined: an empty slot, as a Linear without bias), or gives a registered one a
  // new value. A defined value is stored detached, as a leaf with the given requires_grad.
  virtual void set_parameter(const std::string& name, const cf::Tensor& value, bool requires_grad) = 0;
  // Registers a buffer (persistent: in the state dict), or gives a registered one a new value (as is); persistent
  // unset: true for a new buffer, the registered one's own for an old one (which cannot change it).
  virtual void set_buffer(const std::string& name, const cf::Tensor& value, std::optional<bool> persistent) = 0;
  // Registers a submodule, or puts another in a registered one's place.
  virtual void set_module(const std::string& name, std::shared_ptr<cf::nn::Module> module) = 0;
  // The tensor of a registered parameter or buffer (kind_of says it is one).
  virtual const cf::Tensor& tensor(const std::string& name) const = 0;
  virtual std::shared_ptr<cf::nn::Module> module(const std::string& name) const = 0;
  // This module's own entries, each kind in registration order.
  virtual std::vector<std::string> names(Kind kind) const = 0;
  // The submodules registered from Python, each as the shared_ptr made for it (module_type_slots).
  virtual std::vector<const std::shared_ptr<cf::nn::Module>*> held_modules() const = 0;
};

// The trampoline of a cf base (cf::nn::Module or cf::nn::UnaryModule) for Python subclasses.
template <class Base>
class PythonModuleOf : public Base, public PythonModule {
 public:
  NB_TRAMPOLINE(Base);

  Kind kind_of(const std::string& name) const override {
    auto it = kinds_.find(name);
    return it == kinds_.end() ? Kind::kNone : it->second;
  }

  // A leaf that already requires grad, for a parameter that does, is kept as it is (the caller's tensor, its
  // Python object too, is the parameter: an optimizer built on it steps the module's); any other tensor is
  // stored detached (the caller's keeps its requires_grad).
  void set_parameter(const std::string& name, const cf::Tensor& value, bool requires_grad) override {
    const Kind k = kind_of(name);
    if (k == Kind::kNone) {
      slots_.push_back(value);
      try {
        this->register_parameter(name, &slots_.back());  // checks the name and the dtype; detaches
      } catch (...) {
        slots_.pop_back();
        throw;
      }
      add(name, Kind::kParameter, &slots_.back());
    } else {
      check_kind(name, k, Kind::kParameter);
      CF_CHECK(!value.defined() || cf::is_floating(value.dtype()), DTypeError, "[Module] parameter '", name,
               "' must be floating (float32, float64, bfloat16, float16), got ", value.dtype());
    }
    cf::Tensor& slot = *tensors_.at(name);
    if (!value.defined()) {
      slot = cf::Tensor();
      return;
    }
    slot = value.is_leaf() && value.requires_grad() && requires_grad ? value : value.detach();
    slot.set_requires_grad(requires_grad);
  }

  void set_buffer(const std::string& name, const cf::Tensor& value, std::optional<bool> persistent) override {
    const Kind k = kind_of(name);
    if (k == Kind::kNone) {
      slots_.push_back(value);
      try {
        this->register_buffer(name, &slots_.back(), persistent.value_or(true));
      } catch (...) {
        slots_.pop_back();
        throw;
      }
      add(name, Kind::kBuffer, &slots_.back());
      if (!persistent.value_or(true)) transient_.push_back(name);
      return;
    }
    check_kind(name, k, Kind::kBuffer);
    const bool was = std::find(transient_.begin(), transient_.end(), name) == transient_.end();
    CF_CHECK(!persistent || *persistent == was, ValueError, "[Module] buffer '", name, "' is registered ",
             was ? "persistent (in the state dict)" : "not persistent (outside the state dict)",
             ": its persistence cannot change (the state dict's names are fixed once made)");
    *tensors_.at(name) = value;
  }

  // The Python train(on) of a subclass that overrides it, for the C++ walk of a parent's train() / eval() too
  // (as torch's parent.train() calls each child's train).
  void train(bool on) override {
    nb::detail::ticket t(this->nb_trampoline, "train", nb::detail::str_hash("train"), false);
    if (t.key.is_valid()) {
      this->nb_trampoline.base().attr(t.key)(on);
      return;
    }
    Base::train(on);
  }

  void set_module(const std::string& name, std::shared_ptr<cf::nn::Module> module) override {
    const Kind k = kind_of(name);
    if (k == Kind::kNone) {
      this->register_module(name, module);
      add(name, Kind::kModule, nullptr);
    } else {
      check_kind(name, k, Kind::kModule);
      this->replace_module(name, module);
    }
    modules_[name] = std::move(module);
  }

  const cf::Tensor& tensor(const std::string& name) const override { return *tensors_.at(name); }
  std::shared_ptr<cf::nn::Module> module(const std::string& name) const override { return modules_.at(name); }
  std::vector<const std::shared_ptr<cf::nn::Module>*> held_modules() const override {
    std::vector<const std::shared_ptr<cf::nn::Module>*> out;
    for (const auto& entry : modules_) out.push_back(&entry.second);
    return out;
  }
  std::vector<std::string> names(Kind kind) const override {
    std::vector<std::string> out;
    for (const auto& [name, k] : order_)
      if (k == kind) out.push_back(name);
    return out;
  }

 protected:
  static const char* kind_name(Kind k) {
    return k == Kind::kParameter ? "a parameter" : k == Kind::kBuffer ? "a buffer" : "a submodule";
  }
  // PyTorch's rule: a registered name keeps its kind (assigning a module where a parameter was is a mistake).
  static void check_kind(const std::string& name, Kind have, Kind want) {
    CF_CHECK(have == want, ValueError, "[Module] '", name, "' is ", kind_name(have), " of this module, not ",
             kind_name(want), ": give it a new value of its kind, or use another name");
  }
  void add(const std::string& name, Kind k, cf::Tensor* slot) {
    kinds_[name] = k;
    order_.emplace_back(name, k);
    if (slot) tensors_[name] = slot;
  }

  std::deque<cf::Tensor> slots_;  // the registered tensors; Module holds their addresses
  std::map<std::string, Kind> kinds_;
  std::vector<std::pair<std::string, Kind>> order_;
  std::vector<std::string> transient_;  // buffers outside the state dict
  std::map<std::string, cf::Tensor*> tensors_;
  std::map<std::string, std::shared_ptr<cf::nn::Module>> modules_;
};

// cf.nn.Module's Python subclasses: their forward is Python's, called by their __call__ (any arguments).
class PyModule final : public PythonModuleOf<cf::nn::Module> {
 public:
  using PythonModuleOf::PythonModuleOf;
};

// cf.nn.UnaryModule's Python subclasses: one tensor in, one out, so Sequential and the C++ code that takes a
// UnaryModule call their Python forward (the GIL is taken for it).
class PyUnaryModule final : public PythonModuleOf<cf::nn::UnaryModule> {
 public:
  using PythonModuleOf::PythonModuleOf;
  cf::Tensor forward(const cf::Tensor& x) override;  // nn.cpp
};

// A ModuleList built from Python: it remembers the modules Python handed it (each shared_ptr holds a reference to
// its module's Python object), for the garbage collector's walk (module_type_slots).
class PythonModuleList final : public cf::nn::ModuleList {
 public:
  void append(std::shared_ptr<cf::nn::Module> module) {
    push_back(module);
    held_.push_back(std::move(module));
  }
  const std::vector<std::shared_ptr<cf::nn::Module>>& held() const { return held_; }

 private:
  std::vector<std::shared_ptr<cf::nn::Module>> held_;
};

// cf.nn.Module's type slots: its tp_traverse (inherited by every module class), which shows the garbage collector
// the Python objects a module's registered submodules hold, so a cycle through them (a child module keeping its
// parent, or a bound method of it, as an attribute) is collected.
extern PyType_Slot module_type_slots[];

// cf.nn.Parameter, and what makes cf.nn.Module and cf.nn.UnaryModule Python bases: their constructors, the
// attribute rules, register_parameter / register_buffer / register_module, children, modules, buffers
// (python_module.cpp; nn.cpp binds the rest of both classes).
void bind_python_modules(nb::module_& nn, nb::class_<cf::nn::Module, PyModule>& module,
                         nb::class_<cf::nn::UnaryModule, cf::nn::Module, PyUnaryModule>& unary);

}  // namespace cfpy
