#include "nn/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/optim.h"
#include "core/cuda_graph.h"

namespace cf {
namespace nn {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// A 0-d scalar entry ("step", "lr", "step.<name>") as a double; "" when fine,
// else what is wrong with it.
std::string scalar_problem(const Tensor& t, bool integral, double& value) {
  if (!t.defined()) return "is an undefined tensor";
  if (t.numel() != 1 || t.dim() > 1)
    return str("must be a 0-d scalar, got ", t.describe());
  if (!t.device().is_cpu()) return str("must be a CPU tensor, got ", t.describe());
  if (t.dtype() == kInt64) {
    value = double(t.item<int64_t>());
  } else if (t.dtype() == kFloat64 || t.dtype() == kFloat32) {
    value = t.item();
  } else {
    return str("must be int64 or float64, got ", t.describe());
  }
  if (!std::isfinite(value)) return str("is not finite (", value, ")");
  if (integral && (value < 0 || value != std::floor(value)))
    return str("must be a non-negative integer, got ", value);
  return "";
}

}  // namespace

std::vector<ParamGroup> single_group(const StateDict& params) {
  ParamGroup g;
  g.params = params;
  return {g};
}

std::string Optimizer::where(const char* fn) const { return str("[", name_, ".", fn, "]"); }

void Optimizer::check_hyper(bool ok, const std::string& where, const std::string& what) {
  if (!ok) throw ValueError(str(where, " ", what));
}

// A step writes the parameter in place: an expand() view, whose elements share memory, cannot take it. Checked
// for every parameter before anything is written (the step refused it half way, after updating the others).
void Optimizer::check_writable(const Tensor& p, const std::string& where, const std::string& pname) {
  CF_CHECK(!p.has_internal_overlap(), ValueError, where, " parameter '", pname, "' ", p.describe(),
           " has elements that share memory (an expand() view), and a step writes it in place; make it a copy "
           "(contiguous()) before optimizing it");
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double lr,
                     double weight_decay, std::vector<std::string> slot_names)
    : name_(std::move(name)),
      groups_(std::move(groups)),
      slot_names_(std::move(slot_names)),
      lr_(lr),
      weight_decay_(weight_decay) {
  const std::string w = str("[", name_, "]");
  check_hyper(std::isfinite(lr) && lr >= 0, w, str("learning rate must be finite and >= 0, got ", lr));
  check_hyper(std::isfinite(weight_decay) && weight_decay >= 0, w,
              str("weight_decay must be finite and >= 0, got ", weight_decay));
  std::set<std::string> names;
  std::set<const TensorImpl*> seen;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    check_hyper(std::isfinite(g.lr_scale) && g.lr_scale >= 0, w,
                str("parameter group ", gi, ": lr_scale must be finite and >= 0, got ", g.lr_scale));
    if (g.weight_decay)
      check_hyper(std::isfinite(*g.weight_decay) && *g.weight_decay >= 0, w,
                  str("parameter group ", gi, ": weight_decay must be finite and >= 0, got ",
                      *g.weight_decay));
    for (const auto& [pname, p] : g.params) {
      CF_CHECK(p.defined(), ValueError, w, " parameter '", pname, "' is an undefined tensor");
      CF_CHECK(is_floating(p.dtype()), DTypeError, w, " parameter '", pname,
               "' must be floating, got ", p.describe());
      CF_CHECK(p.is_leaf(), ValueError, w, " parameter '", pname,
               "' is not a leaf tensor (it has autograd history); optimize the leaf it came from");
      CF_CHECK(names.insert(pname).second, ValueError, w, " parameter name '", pname,
               "' appears twice");
      CF_CHECK(seen.insert(p.impl_ptr()).second, ValueError, w, " parameter '", pname,
               "' is the same tensor as an earlier parameter");
      check_writable(p, w, pname);
      Entry e;
      e.name = pname;
      e.param = p;
      e.group = gi;
      if (is_low_precision(p.dtype())) {
        NoGradGuard ng;
        e.master = to(p.detach(), kFloat32);
        e.master_version = p.version();
        e.master_storage = p.impl_ptr()->storage;
      }
      const DType sdt = e.master.defined() ? kFloat32 : p.dtype();
      for (size_t s = 0; s < slot_names_.size(); ++s)
        e.slots.push_back(Tensor::zeros(p.shape(), sdt, p.device()));
      entries_.push_back(std::move(e));
    }
  }
  CF_CHECK(!entries_.empty(), ValueError, w, " got an empty parameter list");
}

Tensor Optimizer::current_master(const Entry& e) {
  if (!e.master.defined() ||
      (e.param.version() == e.master_version && e.master_storage.lock() == e.param.impl_ptr()->storage))
    return e.master;
  // The parameter was written since the master was (load_state_dict, an init, fill_ under
  // no_grad): elements that no longer equal the master's rounding take the new value, or a
  // step would write the stale master back over them. Elements still equal keep the master's
  // extra bits (a model reloaded from the checkpoint its optimizer came from). Elementwise on
  // the device: no host read.
  NoGradGuard no_grad;
  return cf::where(eq(to(e.master, e.param.dtype()), e.param), e.master, to(e.param, kFloat32));
}

void Optimizer::follow_param(Entry& e) {
  const Tensor& p = e.param;
  const bool low = is_low_precision(p.dtype());
  if ((!e.slots.empty() && e.slots[0].shape() != p.shape()) || (e.master.defined() && e.master.shape() != p.shape())) {
    // set_data gave the parameter another shape: its state no longer describes it, so it starts
    // over, as for a parameter the optimizer had just been given
    NoGradGuard no_grad;
    e.master = low ? to(p.detach(), kFloat32) : Tensor();
    e.master_version = p.version();
    e.master_storage = p.impl_ptr()->storage;
    for (Tensor& s : e.slots) s = Tensor::zeros(p.shape(), low ? kFloat32 : p.dtype(), p.device());
    e.step = 0;
    return;
  }
  if (low == e.master.defined() && (!low || e.master.device() == p.device()) &&
      std::all_of(e.slots.begin(), e.slots.end(), [&](const Tensor& s) {
        return s.device() == p.device() && s.dtype() == (low ? kFloat32 : p.dtype());
      }))
    return;
  NoGradGuard no_grad;
  if (low && !e.master.defined()) {
    e.master = to(p.detach(), kFloat32);
    e.master_version = p.version();
    e.master_storage = p.impl_ptr()->storage;
  } else if (!low) {
    e.master = Tensor();
  } else if (e.master.device() != p.device()) {
    e.master = to(e.master, p.device());  // current_master compares it with the parameter there
  }
  const DType sdt = low ? kFloat32 : p.dtype();
  for (Tensor& s : e.slots) {
    if (s.dtype() != sdt) s = to(s, sdt);
    if (s.device() != p.device()) s = to(s, p.device());
  }
}

void Optimizer::set_lr(double lr) {
  CF_CHECK(std::isfinite(lr) && lr >= 0, ValueError, where("set_lr"),
           " learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::set_group_lr_scale(size_t group, double lr_scale) {
  const std::string w = where("set_group_lr_scale");
  CF_CHECK(group < groups_.size(), IndexError, w, " group ", group, " does not exist (", groups_.size(), " groups)");
  check_hyper(std::isfinite(lr_scale) && lr_scale >= 0, w,
              str("parameter group ", group, ": lr_scale must be finite and >= 0, got ", lr_scale));
  groups_[group].lr_scale = lr_scale;
}

void Optimizer::set_group_weight_decay(size_t group, std::optional<double> weight_decay) {
  const std::string w = where("set_group_weight_decay");
  CF_CHECK(group < groups_.size(), IndexError, w, " group ", group, " does not exist (", groups_.size(), " groups)");
  if (weight_decay)
    check_hyper(std::isfinite(*weight_decay) && *weight_decay >= 0, w,
                str("parameter group ", group, ": weight_decay must be finite and >= 0, got ", *weight_decay));
  groups_[group].weight_decay = weight_decay;
}

void Optimizer::step() {
  // (a graph holds the part past this object's life: it checks before calling it again)
  cuda::replayable([this, alive = std::weak_ptr<const bool>(alive_)] {
    CF_CHECK(!alive.expired(), DeviceError,
             "[Optimizer::step] a CUDA graph replays the step of an optimizer that was destroyed");
    step_now();
  });
}

void Optimizer::step_now() {
  NoGradGuard no_grad;
  // (before follow_param, which may start a reshaped parameter's state over: set_data may have made it a view)
  for (const Entry& e : entries_) check_writable(e.param, where("step"), e.name);
  for (Entry& e : entries_) follow_param(e);
  std::vector<Tensor> grads(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    Tensor g = e.param.grad();
    if (!g.defined()) continue;
    CF_CHECK(g.shape() == e.param.shape() && g.dtype() == e.param.dtype() &&
                 g.device() == e.param.device(),
             ValueError, where("step"), " gradient of '", e.name, "' is ", g.describe(),
             " but the parameter is ", e.param.describe());
    grads[i] = g;
  }
  ++step_count_;
  std::vector<Entry*> stepped;
  std::vector<Tensor> stepped_grads;
  std::vector<double> lrs, wds;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!grads[i].defined()) continue;
    Entry& e = entries_[i];
    const ParamGroup& grp = groups_[e.group];
    if (e.master.defined()) e.master = current_master(e);
    stepped.push_back(&e);
    stepped_grads.push_back(grads[i]);
    lrs.push_back(lr_ * grp.lr_scale);
    wds.push_back(grp.weight_decay ? *grp.weight_decay : weight_decay_);
  }
  // Their steps count this update only while it runs: a failed update_all (its checks come before
  // any write) leaves them as they were, so the step can be tried again (GradScaler's retry).
  for (Entry* e : stepped) ++e->step;
  try {
    update_all(stepped, stepped_grads, lrs, wds);
  } catch (...) {
    for (Entry* e : stepped) --e->step;
    throw;
  }
  for (Entry* e : stepped)
    if (e->master.defined()) {  // the parameter now holds the master's rounding
      e->master_version = e->param.version();
      e->master_storage = e->param.impl_ptr()->storage;
    }
}

void Optimizer::update_all(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads,
                           const std::vector<double>& lrs, const std::vector<double>& weight_decays) {
  for (size_t i = 0; i < entries.size(); ++i) update_one(*entries[i], grads[i], lrs[i], weight_decays[i]);
}

void Optimizer::update_one(Entry& e, const Tensor& grad, double lr, double weight_decay) {
  if (!e.master.defined()) {
    update(e, grad, lr, weight_decay);
    return;
  }
  // float32 update of the master, then one rounding into the low-precision parameter
  Tensor param = e.param;
  e.param = e.master;
  try {
    update(e, to(grad, kFloat32), lr, weight_decay);
  } catch (...) {
    e.param = param;
    throw;
  }
  e.param = param;
  copy_(e.param, e.master);
}

std::vector<bool> Optimizer::batchable(const std::vector<Entry*>& entries, const std::vector<Tensor>& grads) {
  std::unordered_map<const void*, size_t> owner;  // storage -> the first entry using it
  std::vector<bool> ok(entries.size(), true);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = *entries[i];
    std::vector<const Tensor*> tensors{&e.param, &grads[i], &e.master};
    for (const Tensor& s : e.slots) tensors.push_back(&s);
    ok[i] = ops::fused_step_supported(e.master.defined() ? e.master : e.param) &&
            (!e.master.defined() || e.param.is_contiguous()) &&
            std::all_of(e.slots.begin(), e.slots.end(), [](const Tensor& s) { return s.is_contiguous(); });
    for (const Tensor* t : tensors) {
      if (!t->defined()) continue;
      auto it = owner.emplace(t->impl_ptr()->storage.get(), i).first;
      if (it->second != i) ok[i] = ok[it->second] = false;
    }
  }
  return ok;
}

Tensor Optimizer::master(const std::string& name) const {
  for (Entry e : entries_)
    if (e.name == name) {
      follow_param(e);
      return current_master(e);
    }
  return Tensor();
}

void Optimizer::zero_grad() {
  for (const Entry& e : entries_) e.param.zero_grad();
}

StateDict Optimizer::state_dict() const {
  NoGradGuard no_grad;
  std::vector<Entry> entries = entries_;  // as the parameters now are (follow_param), this object unchanged
  for (Entry& e : entries) follow_param(e);
  StateDict out;
  out.emplace_back("step", Tensor::scalar(double(step_count_), kInt64));
  out.emplace_back("lr", Tensor::scalar(lr_, kFloat64));
  for (size_t s = 0; s < slot_names_.size(); ++s)
    for (const Entry& e : entries) out.emplace_back(slot_names_[s] + "." + e.name, clone(e.slots[s]));
  if (!slot_names_.empty())
    for (const Entry& e : entries)
      out.emplace_back("step." + e.name, Tensor::scalar(double(e.step), kInt64));
  for (const Entry& e : entries)
    if (e.master.defined()) out.emplace_back("master." + e.name, clone(current_master(e)));
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  const std::string w = where("load_state_dict");
  for (Entry& e : entries_) follow_param(e);  // the entries' dtypes are checked against the parameters' own
  std::unordered_map<std::string, const Tensor*> given;
  std::vector<std::string> duplicated;
  for (const auto& [k, t] : dict)
    if (!given.emplace(k, &t).second) duplicated.push_back(k);

  std::vector<std::string> missing, bad;
  std::set<std::string> expected;
  auto lookup = [&](const std::string& key) -> const Tensor* {
    expected.insert(key);
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(key);
      return nullptr;
    }
    return it->second;
  };

  double step_v = 0, lr_v = 0;
  if (const Tensor* t = lookup("step")) {
    std::string p = scalar_problem(*t, true, step_v);
    if (!p.empty()) bad.push_back("'step' " + p);
  }
  if (const Tensor* t = lookup("lr")) {
    std::string p = scalar_problem(*t, false, lr_v);
    if (p.empty() && lr_v < 0) p = str("must be >= 0, got ", lr_v);
    if (!p.empty()) bad.push_back("'lr' " + p);
  }
  // Slot buffers: (entry, slot) -> source tensor.
  std::vector<std::vector<const Tensor*>> src(entries_.size(),
                                              std::vector<const Tensor*>(slot_names_.size()));
  std::vector<double> steps(entries_.size(), 0);
  for (size_t s = 0; s < slot_names_.size(); ++s)
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      std::string key = slot_names_[s] + "." + e.name;
      const Tensor* t = lookup(key);
      if (!t) continue;
      if (!t->defined()) {
        bad.push_back("'" + key + "' is an undefined tensor");
      } else if (t->shape() != e.param.shape() || is_floating(t->dtype()) != is_floating(e.slots[s].dtype())) {
        // (a floating entry converts to the slot's dtype, as Module::load_state_dict converts parameters and
        // PyTorch casts optimizer state to its parameter's: a float32 run resumes in float64 and back)
        bad.push_back(str("'", key, "' is ", t->describe(), " but parameter '", e.name, "' is ",
                          e.param.describe(), e.master.defined() ? " (float32 master state)" : ""));
      } else {
        src[i][s] = t;
      }
    }
  if (!slot_names_.empty())
    for (size_t i = 0; i < entries_.size(); ++i) {
      std::string key = "step." + entries_[i].name;
      if (const Tensor* t = lookup(key)) {
        std::string p = scalar_problem(*t, true, steps[i]);
        if (!p.empty()) bad.push_back("'" + key + "' " + p);
      }
    }
  // Float32 masters exist for 16-bit parameters only. A state saved from float32 or float64 parameters
  // has none: the master is then taken from the loaded parameter (a run resumed in 16 bits). A master
  // given for a parameter of 32 or 64 bits is refused with the reason (a 16-bit run resumed wider: the
  // master holds that run's weights; load it into the model instead).
  std::vector<const Tensor*> masters(entries_.size(), nullptr);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    std::string key = "master." + e.name;
    expected.insert(key);
    auto it = given.find(key);
    if (it == given.end()) continue;
    const Tensor* t = it->second;
    if (!e.master.defined())
      bad.push_back(str("'", key, "' is the float32 master of a 16-bit parameter, but parameter '", e.name, "' is ",
                        e.param.describe(), " and keeps none (load the master into the model instead)"));
    else if (!t->defined() || t->shape() != e.master.shape() || (t->dtype() != kFloat32 && t->dtype() != kFloat64))
      bad.push_back(str("'", key, "' is ", t->defined() ? t->describe() : std::string("undefined"),
                        " but the master of '", e.name, "' is ", e.master.describe()));
    else
      masters[i] = t;
  }
  std::vector<std::string> unexpected;
  for (const auto& kv : dict)
    if (!expected.count(kv.first)) unexpected.push_back(kv.first);

  if (!missing.empty() || !unexpected.empty() || !bad.empty() || !duplicated.empty()) {
    std::string msg = w + " state dict does not fit this " + name_ + " optimizer:";
    if (!missing.empty()) msg += " missing entries: " + join(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected entries: " + join(unexpected) + ";";
    if (!duplicated.empty()) msg += " repeated entries: " + join(duplicated) + ";";
    if (!bad.empty()) msg += " wrong entries: " + join(bad) + ";";
    msg.pop_back();
    throw ValueError(msg);
  }

  NoGradGuard no_grad;
  step_count_ = int64_t(step_v);
  lr_ = lr_v;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    for (size_t s = 0; s < slot_names_.size(); ++s) copy_from_any_device(e.slots[s], *src[i][s]);
    if (masters[i]) {
      copy_from_any_device(e.master, *masters[i]);
    } else if (e.master.defined()) {  // none saved (a float32 run resumed in 16 bits): the loaded parameter's
      e.master = to(e.param.detach(), kFloat32);
      e.master_version = e.param.version();
      e.master_storage = e.param.impl_ptr()->storage;
    }
    e.step = int64_t(steps[i]);
  }
}

}  // namespace nn
}  // namespace cf
