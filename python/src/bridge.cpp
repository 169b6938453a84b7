// The C++ half of cf.torch.Attention (python/cf/torch.py): one cf
// MultiHeadAttention driven from a torch.autograd.Function through DLPack
// capsules, so the per-call work outside cf's kernels is a few capsule
// conversions and no Python loop over parameters.
//
// The module's parameters live in memory that PyTorch's nn.Parameters share
// (they are created from cf's tensors through DLPack, and rebound after
// PyTorch moves them, see bind); so do its buffers. Each forward records its own graph
// (a "tape"); backward runs it, hands the gradient of the input and of every
// parameter to PyTorch as capsules (PyTorch accumulates them into .grad, as for
// any of its own layers) and clears cf's side at once, so the gradients of
// separate calls never mix: one backward at a time per layer (a mutex; Python
// threads may run backward passes concurrently). bind, set_requires_grad and
// on_train_step are not serialised against a backward in another thread.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include <nanobind/stl/map.h>

#include "common.h"
#include "nn/clustering/memory_bank.h"

namespace cfpy {

nb::object to_capsule(const cf::Tensor& t, bool versioned);

namespace {

namespace cnn = cf::nn;
using cf::Tensor;

nb::object capsule_or_none(const Tensor& t) { return t.defined() ? to_capsule(t, false) : nb::none(); }

struct Tape {
  Tensor input, output, aux_total;
  // The parameter tensors this call read: its backward hands over their gradients, whatever was bound since
  // (functional_call with other parameters, or a load, between a call and its backward: reading the bound
  // ones then lost this call's parameter gradients without a word).
  std::vector<Tensor> params;
};

class AttentionBridge {
 public:
  AttentionBridge(std::shared_ptr<cnn::MultiHeadAttention> mha, std::map<std::string, double> aux_weights)
      : mha_(std::move(mha)), aux_weights_(std::move(aux_weights)), params_(mha_->parameters()) {}

  // The parameters as capsules, in named_parameters order (PyTorch wraps them once).
  nb::list parameter_capsules() const {
    nb::list out;
    for (auto& [name, t] : mha_->named_parameters()) out.append(nb::make_tuple(name, to_capsule(t, false)));
    return out;
  }

  // The buffers as (name, capsule, persistent, rank_local), in named_buffers order. torch.py
  // registers the shared ones (routing's centroids, a memory bank's centroids) as torch buffers
  // aliasing cf's memory, so DistributedDataParallel broadcasts them and every rank attends with
  // rank 0's. A memory bank's stored states and their counters are rank-local: each rank keeps
  // its own (as cf's own DistributedDataParallel does), and broadcasting the bank (capacity x d,
  // 100000 x d by default) every step would cost far more than the step; torch.py keeps them in
  // state_dict only.
  nb::list buffer_capsules() const {
    const std::vector<std::string> persistent = mha_->persistent_buffer_names();
    const std::vector<std::string> local = rank_local_buffers();
    auto has = [](const std::vector<std::string>& v, const std::string& n) {
      return std::find(v.begin(), v.end(), n) != v.end();
    };
    nb::list out;
    for (auto& [name, t] : mha_->named_buffers())
      out.append(nb::make_tuple(name, to_capsule(t, false), has(persistent, name), has(local, name)));
    return out;
  }

  // After PyTorch moved or converted its parameters and buffers (Module._apply, a copy's
  // __setstate__, a load that assigned new tensors): make cf's parameters and the shared buffers
  // alias the given tensors; the rank-local buffers stay cf's own (converted or moved by cf).
  // Checked before anything is bound, so a refused binding changes nothing.
  void bind(const std::vector<Tensor>& params, const std::map<std::string, Tensor>& shared_buffers) {
    std::vector<Tensor> old = mha_->parameters();
    CF_CHECK(params.size() == old.size(), ValueError, "[cf.torch.Attention] ", params.size(),
             " parameters given for ", old.size());
    if (!params.empty()) {
      if (params[0].dtype() != old[0].dtype()) mha_->to(params[0].dtype());
      if (params[0].device() != old[0].device()) mha_->to(params[0].device());
    }
    std::vector<Tensor> buffers, old_buffers;
    size_t used = 0;
    for (auto& [name, t] : mha_->named_buffers()) {
      auto it = shared_buffers.find(name);
      used += it != shared_buffers.end();
      buffers.push_back(it != shared_buffers.end() ? it->second : t);
      old_buffers.push_back(t);
    }
    CF_CHECK(used == shared_buffers.size(), ValueError, "[cf.torch.Attention] ", shared_buffers.size() - used,
             " of the given buffers are not the module's");
    mha_->set_buffers(buffers);  // checks all, then binds
    try {
      mha_->set_parameters(params);
    } catch (...) {
      mha_->set_buffers(old_buffers);
      throw;
    }
    params_ = mha_->parameters();
  }

  // Which parameters cf computes gradients for: PyTorch's requires_grad flags, in parameters order
  // (torch.py passes them when they differ from the last ones passed: after a bind, whose imported
  // tensors carry no flag, and after requires_grad_() froze or thawed some).
  void set_requires_grad(const std::vector<bool>& flags) {
    CF_CHECK(flags.size() == params_.size(), ValueError, "[cf.torch.Attention] ", flags.size(),
             " requires_grad flags given for ", params_.size(), " parameters");
    for (size_t i = 0; i < flags.size(); ++i) params_[i].set_requires_grad(flags[i]);
  }

  // PyTorch wrote into these buffers (load_state_dict, a DistributedDataParallel broadcast):
  // cf's version counters did not see it, so mark them written; state cached from them (the
  // memory bank's host copy of its step count) is read again. Empty: every buffer.
  // PyTorch loaded these cf buffers (full names) into cf's tensors: each module's
  // on_state_loaded hook hears of its own, as after cf's load_state_dict.
  void state_loaded(const std::vector<std::string>& names) { mha_->notify_state_loaded(names); }

  void buffers_written(const std::vector<std::string>& names) {
    for (auto& [name, t] : mha_->named_buffers())
      if (names.empty() || std::find(names.begin(), names.end(), name) != names.end()) t.bump_version();
  }

  // One training step done: each memory bank counts it and re-clusters when due
  // (Cluster-Former's Algorithm 1, as the Cluster-Former models' on_train_step).
  // Returns how many banks re-clustered.
  int64_t on_train_step() { return cnn::step_memory_banks(*mha_); }

  // record: whether PyTorch may ask for this call's backward (its grad mode was on at the call);
  // under torch.no_grad() (inference) cf records no graph, so the call keeps no saved tensors.
  // autocast: PyTorch's autocast dtype for x's device when its autocast is on at the call;
  // the forward runs under cf's own autocast in it (cf's backward needs none: the casts are nodes).
  std::pair<nb::object, std::shared_ptr<Tape>> forward(const Tensor& x, std::optional<Tensor> mask, bool causal,
                                                       bool record, std::optional<cf::DType> autocast) {
    auto tape = std::make_shared<Tape>();
    {
      nb::gil_scoped_release g;
      cf::AutocastGuard cast(autocast);
      // PyTorch runs Function.forward under its own no_grad, which is not cf's;
      // cf's grad mode here is PyTorch's at the call, whatever the caller's cf grad mode.
      struct GradMode {
        bool prev = cf::grad_enabled();
        explicit GradMode(bool on) { cf::set_grad_enabled(on); }
        ~GradMode() { cf::set_grad_enabled(prev); }
      } mode(record);
      tape->input = x.detach();
      tape->params = params_;
      if (record && cf::is_floating(x.dtype())) tape->input.set_requires_grad(true);
      cnn::AuxLosses aux;
      tape->output = mha_->forward(tape->input, tape->input, tape->input, mask ? *mask : Tensor(), causal,
                                   aux_weights_.empty() ? nullptr : &aux);
      if (!aux.empty()) tape->aux_total = aux.total(aux_weights_);
    }
    return {to_capsule(tape->output.detach(), false), tape};
  }

  // Gradients of the input and of every parameter (None where there is none).
  // The cf graph is kept (retain_graph) for as long as PyTorch keeps the call's
  // context, which owns the tape: PyTorch may run backward through one call
  // several times (retain_graph=True, torch.autograd.gradcheck).
  // aux_weight: d loss / d (the call's aux total) when the caller's loss holds attn.aux_loss (a 0-d tensor
  // on the output's device: no host read), else undefined: the auxiliary losses then enter at weight 1.
  nb::list backward(Tape& tape, const Tensor& grad_output, const Tensor& aux_weight) {
    CF_CHECK(tape.output.defined(), AutogradError, "[cf.torch.Attention] backward after the call's graph was freed");
    std::vector<Tensor> grads;
    grads.reserve(tape.params.size() + 1);
    {
      nb::gil_scoped_release g;
      // One backward at a time per layer: the calls share the parameter leaves, whose .grad each backward
      // fills, hands over and clears (two Python threads running backward through one layer could hand
      // over each other's sums).
      std::lock_guard<std::mutex> one_at_a_time(backward_mutex_);
      // A failed backward (an error in a kernel, a freed graph) clears what it accumulated, so the next
      // call hands over its own gradients only.
      struct ClearOnError {
        Tape& tape;
        bool armed = true;
        ~ClearOnError() {
          if (!armed) return;
          if (tape.input.requires_grad()) tape.input.zero_grad();
          for (auto& p : tape.params) p.zero_grad();
        }
      } clear_on_error{tape};
      if (tape.aux_total.defined()) {
        // d/dtheta of (sum(out * g) + w aux): PyTorch's gradient of the task loss plus
        // the auxiliary losses' own (ClusterFormer eq. 17), in one cf backward; w follows
        // the loss's scale (GradScaler, a loss divided for accumulation) when it holds aux.
        const Tensor aux = aux_weight.defined()
                               ? tape.aux_total * cf::to(cf::reshape(aux_weight.detach(), {}), tape.aux_total.dtype())
                               : tape.aux_total;
        Tensor root = cf::sum(tape.output * grad_output.detach()) + aux;
        root.backward(Tensor(), /*retain_graph=*/true);
      } else {
        tape.output.backward(grad_output, /*retain_graph=*/true);
      }
      // Hand the gradients over and clear cf's side, ready for the next call.
      grads.push_back(tape.input.requires_grad() ? tape.input.grad() : Tensor());
      if (tape.input.requires_grad()) tape.input.zero_grad();
      for (auto& p : tape.params) {
        grads.push_back(p.grad());
        p.zero_grad();
      }
      clear_on_error.armed = false;
    }
    nb::list out;
    for (auto& g : grads) out.append(capsule_or_none(g));
    return out;
  }

  // The value of the auxiliary losses of the last call on this tape (0 when none).
  static double aux_value(const Tape& t) { return t.aux_total.defined() ? t.aux_total.item() : 0.0; }

  std::shared_ptr<cnn::MultiHeadAttention> module() const { return mha_; }

 private:
  // The stored states and counters of each memory bank (see buffer_capsules).
  std::vector<std::string> rank_local_buffers() const {
    std::vector<std::string> out;
    for (auto& [name, m] : mha_->named_modules())
      if (dynamic_cast<cnn::MemoryBank*>(m))
        for (const char* b : {"memory", "counters"}) out.push_back(name.empty() ? b : name + "." + b);
    return out;
  }

  std::shared_ptr<cnn::MultiHeadAttention> mha_;
  std::map<std::string, double> aux_weights_;
  std::vector<Tensor> params_;  // the module's parameter tensors (leaves that require grad)
  std::mutex backward_mutex_;
};

// The same attention step timed from C++: forward + backward of sum(out * g) on x
// (requires grad), `iters` times; seconds per call (the minimum of `repeats` runs).
double time_attention_step(cnn::MultiHeadAttention& mha, const Tensor& x, const Tensor& g, int64_t iters,
                           int64_t repeats) {
  double best = 1e300;
  Tensor xin = x.detach().set_requires_grad(true);
  for (int64_t r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      Tensor out = mha(xin);
      out.backward(g);
      xin.zero_grad();
      mha.zero_grad();
    }
    cf::cuda::synchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(iters);
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

void bind_bridge(nb::module_& m) {
  nb::module_ b = m.def_submodule("_bridge", "Internals of cf.torch (not a public API).");
  nb::class_<Tape>(b, "Tape")
      .def_prop_ro("aux_loss", &AttentionBridge::aux_value)
      .def_prop_ro("aux_detached", [](const Tape& t) -> std::optional<Tensor> {
        return t.aux_total.defined() ? std::optional<Tensor>(t.aux_total.detach()) : std::nullopt;
      }, "The auxiliary losses' total without its graph (None when none): what the module keeps of a call.")
      .def_prop_ro("aux_capsule", [](const Tape& t) { return capsule_or_none(t.aux_total.defined() ? t.aux_total.detach() : Tensor()); },
                   "The auxiliary losses' total as a DLPack capsule (None when none): the value of the call's aux_loss output.")
      .def_prop_ro("recorded", [](const Tape& t) { return t.output.defined() && t.output.grad_fn() != nullptr; },
                   "Whether cf recorded this call's graph (PyTorch's grad mode was on).");
  nb::class_<AttentionBridge>(b, "AttentionBridge")
      .def(nb::init<std::shared_ptr<cnn::MultiHeadAttention>, std::map<std::string, double>>(), nb::arg("module"),
           nb::arg("aux_weights"))
      .def("parameter_capsules", &AttentionBridge::parameter_capsules)
      .def("buffer_capsules", &AttentionBridge::buffer_capsules)
      .def("bind",
           [](AttentionBridge& br, nb::list params, nb::dict buffers) {
             std::vector<Tensor> ps;
             std::map<std::string, Tensor> bs;
             for (nb::handle c : params) ps.push_back(from_dlpack_object(c, false));
             for (auto [name, c] : buffers) bs[nb::cast<std::string>(name)] = from_dlpack_object(c, false);
             br.bind(ps, bs);
           },
           nb::arg("params"), nb::arg("buffers"))
      .def("set_requires_grad", &AttentionBridge::set_requires_grad, nb::arg("flags"))
      .def("buffers_written", &AttentionBridge::buffers_written, nb::arg("names") = std::vector<std::string>())
      .def("state_loaded", &AttentionBridge::state_loaded, nb::arg("names"))
      .def("on_train_step", &AttentionBridge::on_train_step, release_gil())
      .def("forward",
           [](AttentionBridge& br, nb::handle x, nb::handle mask, bool causal, bool record,
              std::optional<cf::DType> autocast) {
             Tensor xt = from_dlpack_object(x, false);
             std::optional<Tensor> mt;
             if (!mask.is_none()) mt = from_dlpack_object(mask, true);  // a bool mask viewed as uint8
             return br.forward(xt, mt, causal, record, autocast);
           },
           nb::arg("x"), nb::arg("mask").none(), nb::arg("causal"), nb::arg("record") = true,
           nb::arg("autocast").none() = nb::none())
      .def("backward",
           [](AttentionBridge& br, Tape& tape, nb::handle g, nb::handle aux_weight) {
             return br.backward(tape, from_dlpack_object(g, false),
                                aux_weight.is_none() ? Tensor() : from_dlpack_object(aux_weight, false));
           },
           nb::arg("tape"), nb::arg("grad_output"), nb::arg("aux_weight").none() = nb::none())
      .def_prop_ro("module", &AttentionBridge::module);
  b.def("time_attention_step", &time_attention_step, nb::arg("module"), nb::arg("x"), nb::arg("grad_output"),
        nb::arg("iters"), nb::arg("repeats") = 5, release_gil(),
        "Seconds per forward+backward of a MultiHeadAttention, timed in C++ (the baseline of the cf.torch overhead "
        "benchmark).");
}

}  // namespace cfpy
