#include "core/cuda.h"
#include "nn/module.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "core/error.h"

namespace cf {
namespace nn {

void Module::check_new_name(const std::string& name, const char* what) const {
  CF_CHECK(!name.empty(), ValueError, "[Module] ", what, " name must not be empty");
  CF_CHECK(name.find('.') == std::string::npos, ValueError, "[Module] ", what, " name '", name,
           "' must not contain '.' (dots separate the levels of a qualified name)");
  auto taken = [&](const auto& v) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.name == name; });
  };
  bool child = std::any_of(children_.begin(), children_.end(),
                           [&](const auto& c) { return c.first == name; });
  CF_CHECK(!taken(params_) && !taken(buffers_) && !child, ValueError, "[Module] ", what, " name '",
           name, "' is already taken in this module");
}

void Module::register_parameter(const std::string& name, Tensor* slot) {
  check_new_name(name, "parameter");
  CF_CHECK(slot != nullptr, ValueError, "[Module] parameter '", name, "' has a null slot");
  if (slot->defined()) {
    CF_CHECK(is_floating(slot->dtype()), DTypeError, "[Module] parameter '", name,
             "' must be floating (float32, float64, bfloat16, float16), got ", slot->dtype());
    *slot = slot->detach();
    slot->set_requires_grad(true);
  }
  params_.push_back({name, slot, true});
}

void Module::register_buffer(const std::string& name, Tensor* slot, bool persistent) {
  check_new_name(name, "buffer");
  CF_CHECK(slot != nullptr, ValueError, "[Module] buffer '", name, "' has a null slot");
  buffers_.push_back({name, slot, persistent});
}

void Module::keep_float32_under_16bit(const Tensor* slot) {
  CF_CHECK(std::any_of(buffers_.begin(), buffers_.end(), [&](const Slot& b) { return b.tensor == slot; }), ValueError,
           "[Module] keep_float32_under_16bit: the slot is not a registered buffer of this module");
  float32_buffers_.push_back(slot);
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  CF_CHECK(module != nullptr, ValueError, "[Module] submodule '", name, "' is null");
  check_no_cycle(name, *module);
  children_.emplace_back(name, std::move(module));
}

bool Module::reaches(const Module* target) const {
  if (this == target) return true;
  for (const auto& c : children_)
    if (c.second->reaches(target)) return true;
  return false;
}

void Module::check_no_cycle(const std::string& name, const Module& child) const {
  // Every walk (parameters, state_dict, train, to) recursed without end on a cycle until the stack
  // overflowed; trees stay acyclic because each insertion is checked.
  CF_CHECK(!child.reaches(this), ValueError, "[Module] adding submodule '", name,
           "' would make a cycle: it is this module or contains it");
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  CF_CHECK(module != nullptr, ValueError, "[Module] replacement for submodule '", name, "' is null");
  check_no_cycle(name, *module);
  for (auto& c : children_)
    if (c.first == name) {
      c.second = std::move(module);
      return;
    }
  throw ValueError(str("[Module] replace_module: no submodule named '", name, "'"));
}

// Calls f(qualified_name, slot, is_parameter, persistent) for every tensor slot,
// this module's parameters then buffers, then each child in order.
template <class F>
void Module::visit(const std::string& prefix, F&& f) const {
  for (const auto& s : params_) f(prefix + s.name, s.tensor, true, true);
  for (const auto& s : buffers_) f(prefix + s.name, s.tensor, false, s.persistent);
  for (const auto& c : children_) c.second->visit(prefix + c.first + ".", f);
}

// The distinct tensors of one kind (parameters or buffers) in registration order,
// each under its first name with every slot that holds it: a tensor reached twice
// (a shared submodule, tied weights) is listed once, so an optimizer steps it once
// and a replacement reaches all its slots.
struct Module::Distinct {
  std::string name;
  std::vector<Tensor*> slots;
  bool persistent;
};

std::vector<Module::Distinct> Module::distinct(bool params) const {
  std::vector<Distinct> out;
  std::vector<const TensorImpl*> seen;
  visit("", [&](const std::string& n, Tensor* t, bool is_param, bool persistent) {
    if (is_param != params || !t->defined()) return;
    auto it = std::find(seen.begin(), seen.end(), t->impl_ptr());
    if (it != seen.end()) {
      Distinct& d = out[size_t(it - seen.begin())];
      d.slots.push_back(t);
      d.persistent = d.persistent || persistent;  // in the state dict under any persistent name
      return;
    }
    seen.push_back(t->impl_ptr());
    out.push_back({n, {t}, persistent});
  });
  return out;
}

StateDict Module::named_parameters() const {
  StateDict out;
  for (auto& d : distinct(true)) out.emplace_back(d.name, *d.slots[0]);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& e : named_parameters()) out.push_back(e.second);
  return out;
}

StateDict Module::named_buffers() const {
  StateDict out;
  for (auto& d : distinct(false)) out.emplace_back(d.name, *d.slots[0]);
  return out;
}

std::vector<std::string> Module::persistent_buffer_names() const {
  std::vector<std::string> out;
  for (auto& d : distinct(false))
    if (d.persistent) out.push_back(d.name);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& c : children_)
    for (auto& sub : c.second->named_modules())
      out.emplace_back(sub.first.empty() ? c.first : c.first + "." + sub.first, sub.second);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_submodules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& c : children_) {
    out.emplace_back(c.first, c.second);
    for (auto& sub : c.second->named_submodules()) out.emplace_back(c.first + "." + sub.first, sub.second);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& e : named_parameters()) n += e.second.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out;
  visit("", [&](const std::string& n, Tensor* t, bool, bool persistent) {
    if (persistent && t->defined()) out.emplace_back(n, t->detach());
  });
  return out;
}

void copy_from_any_device(Tensor& dst, const Tensor& src) {
  copy_(dst, src.device() == dst.device() ? src : src.to(dst.device()));
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> duplicates;
  for (const auto& e : dict)
    if (!given.emplace(e.first, &e.second).second) duplicates.push_back(e.first);
  std::vector<std::string> missing, mismatched, unwritable;
  std::vector<std::pair<Tensor*, const Tensor*>> copies;
  std::vector<std::string> loaded;
  std::map<std::string, bool> used;
  visit("", [&](const std::string& n, Tensor* t, bool, bool persistent) {
    if (!persistent || !t->defined()) return;
    auto it = given.find(n);
    if (it == given.end()) {
      missing.push_back(n);
      return;
    }
    used[n] = true;
    const Tensor& src = *it->second;
    if (!src.defined() || src.shape() != t->shape()) {
      mismatched.push_back(n + " (expected " + shape_str(t->shape()) + ", got " +
                           (src.defined() ? shape_str(src.shape()) : std::string("undefined")) + ")");
      return;
    }
    // Floating values convert to the slot's floating dtype (a float64 checkpoint into a float32 model); a
    // bool or int64 entry for a floating slot, or the reverse, is another tensor (a bool mask loaded as
    // weights of 0 and 1 without a word before).
    if (is_floating(src.dtype()) != is_floating(t->dtype())) {
      mismatched.push_back(n + " (expected " + dtype_name(t->dtype()) + ", got " + dtype_name(src.dtype()) + ")");
      return;
    }
    // The copy writes the module's tensor in place: one whose elements share memory (an expand() view put
    // in by set_data or set_parameters) cannot take it, and finding that out at the copy left the entries
    // before it loaded
    if (t->has_internal_overlap()) {
      unwritable.push_back(n + " (" + t->describe() + ")");
      return;
    }
    copies.emplace_back(t, &src);
    loaded.push_back(n);
  });
  std::vector<std::string> unexpected;
  for (const auto& e : dict)
    if (!used.count(e.first)) unexpected.push_back(e.first);
  auto list = [](const std::vector<std::string>& v) {
    std::ostringstream os;
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    return os.str();
  };
  bool bad = !mismatched.empty() || !duplicates.empty() || !unwritable.empty() ||
             (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::ostringstream os;
    os << "[load_state_dict] state dict does not fit the module:";
    if (!missing.empty() && strict) os << " missing keys: " << list(missing) << ";";
    if (!unexpected.empty() && strict) os << " unexpected keys: " << list(unexpected) << ";";
    if (!mismatched.empty()) os << " shape or dtype mismatch: " << list(mismatched) << ";";
    if (!duplicates.empty()) os << " duplicate keys: " << list(duplicates) << ";";
    if (!unwritable.empty())
      os << " the module's tensors of " << list(unwritable)
         << " have elements that share memory (expand() views) and cannot be loaded into: make them copies "
            "(contiguous()) first;";
    throw ValueError(os.str());
  }
  // The modules' own checks of the values (check_state), each with its own entries.
  for (auto& [prefix, m] : named_modules()) {
    std::map<std::string, const Tensor*> own;
    for (const std::vector<Slot>* slots : {&m->params_, &m->buffers_})
      for (const Slot& s : *slots) {
        const std::string full = prefix.empty() ? s.name : prefix + "." + s.name;
        if (std::find(loaded.begin(), loaded.end(), full) == loaded.end()) continue;
        for (auto& c : copies)
          if (c.first == s.tensor) own[s.name] = c.second;
      }
    if (!own.empty()) m->check_state(own);
  }
  // Everything checked first, so a failed load changes nothing.
  NoGradGuard ng;
  // A value that is another slot's own tensor (state_dict() hands out the module's tensors, so a dict with
  // its keys remapped, two layers swapped, holds them) is read before any copy writes that slot: the
  // second layer of a swap got the first's new values, the old second's.
  std::vector<Tensor> read_first;
  read_first.reserve(copies.size());
  for (auto& c : copies)
    for (const auto& d : copies)
      if (d.first != c.first && c.second->shares_storage(*d.first)) {
        read_first.push_back(clone(*c.second));
        c.second = &read_first.back();
        break;
      }
  for (auto& c : copies) copy_from_any_device(*c.first, *c.second);  // converts dtype if they differ
  notify_state_loaded(loaded);
}

void Module::notify_state_loaded(const std::vector<std::string>& loaded) {
  for (auto& [prefix, m] : named_modules()) {
    std::vector<std::string> own;
    for (const std::vector<Slot>* slots : {&m->params_, &m->buffers_})
      for (const Slot& s : *slots) {
        const std::string full = prefix.empty() ? s.name : prefix + "." + s.name;
        if (std::find(loaded.begin(), loaded.end(), full) != loaded.end()) own.push_back(s.name);
      }
    m->on_state_loaded(own);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

// Replaces each distinct tensor by f(it) in all its slots (f returns an undefined
// tensor to keep one), so aliases (a shared submodule) stay aliases.
void Module::convert(const std::function<Tensor(const Tensor&, bool)>& f) {
  NoGradGuard ng;
  std::vector<const Tensor*> keep32;
  for (auto& m : named_modules()) keep32.insert(keep32.end(), m.second->float32_buffers_.begin(), m.second->float32_buffers_.end());
  // Each tensor keeps its identity and takes the converted data (PyTorch's module.to assigns
  // param.data): every handle to a parameter sees the move, an optimizer built before it among
  // them, which used to go on stepping the old tensors while the model trained the new ones.
  // Tied slots share one tensor, so they stay tied. A gradient is converted with its tensor.
  for (bool params : {true, false})
    for (auto& d : distinct(params)) {
      const Tensor& t = *d.slots[0];
      const bool keeps_float32 = !params && std::any_of(d.slots.begin(), d.slots.end(), [&](const Tensor* slot) {
        return std::find(keep32.begin(), keep32.end(), slot) != keep32.end();
      });
      Tensor v = f(t, keeps_float32);
      if (!v.defined()) continue;
      if (!t.is_leaf()) {  // a buffer holding a result with history: its node describes the old data
        for (Tensor* slot : d.slots) *slot = v;
        continue;
      }
      const Tensor g = t.grad();
      const Tensor gv = g.defined() ? f(g, keeps_float32) : Tensor();
      t.set_data(v);
      if (gv.defined()) t.set_grad(gv);
    }
}

void Module::to(DType dtype) {
  CF_CHECK(is_floating(dtype), DTypeError, "[Module::to] parameters can only be floating (float32, float64, bfloat16, float16), got ",
           dtype);
  convert([&](const Tensor& t, bool keeps_float32) {
    const DType want = keeps_float32 && is_low_precision(dtype) ? kFloat32 : dtype;
    return !is_floating(t.dtype()) || t.dtype() == want ? Tensor() : cf::to(t, want);
  });
}

void Module::to(Device device) {
  cuda::check_device(device, "Module::to");
  convert([&](const Tensor& t, bool) { return t.device() == device ? Tensor() : cf::to(t, device); });
}

void Module::replace(bool params, const std::vector<Tensor>& values, const char* op) {
  const std::vector<Distinct> slots = distinct(params);
  CF_CHECK(values.size() == slots.size(), ValueError, "[", op, "] module has ", slots.size(),
           params ? " parameters" : " buffers", ", got ", values.size(), " tensors");
  for (size_t i = 0; i < slots.size(); ++i) {
    const Tensor& v = values[i];
    const Tensor& t = *slots[i].slots[0];
    CF_CHECK(v.defined() && v.shape() == t.shape() && v.dtype() == t.dtype() && v.device() == t.device(),
             ValueError, "[", op, "] '",
             slots[i].name, "' is ", t.describe(), ", got ", v.defined() ? v.describe() : std::string("undefined"));
  }
  for (size_t i = 0; i < slots.size(); ++i)
    for (Tensor* t : slots[i].slots) *t = values[i];
}

void Module::set_parameters(const std::vector<Tensor>& values) { replace(true, values, "set_parameters"); }

void Module::set_buffers(const std::vector<Tensor>& values) { replace(false, values, "set_buffers"); }

void Module::zero_grad() {
  visit("", [&](const std::string&, Tensor* t, bool is_param, bool) {
    if (is_param && t->defined()) t->zero_grad();
  });
}

}  // namespace nn
}  // namespace cf
