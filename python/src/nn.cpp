// cf.nn: Module and the layers, the attention family (every variant by name, its
// options as keyword arguments), losses, optimizers and schedules, gradient
// clipping, initialisers, checkpoints, safetensors files and checked configs.
// Docstrings follow the header comments of nn/.
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/tuple.h>

#include <set>

#include "common.h"
#include "core/json.h"
#include "python_module.h"

namespace cfpy {

using cf::Tensor;
namespace cnn = cf::nn;

// ---------------------------------------------------------------- JSON

namespace {
// depth: the nesting so far. A config nests a few levels; a list or dict that contains itself (or one
// 100,000 levels deep) recursed until the stack overflowed.
nlohmann::json to_json_at(nb::handle h, const std::string& where, int depth) {
  CF_CHECK(depth <= cf::io::kMaxJsonDepth, ValueError, "[", where.size() > 60 ? where.substr(0, 60) + "..." : where,
           "] lists and dicts nest deeper than ", cf::io::kMaxJsonDepth, " levels (or contain themselves)");
  if (h.is_none()) return nullptr;
  if (PyBool_Check(h.ptr())) return h.ptr() == Py_True;
  if (PyLong_Check(h.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    CF_CHECK(overflow == 0, ValueError, "[", where, "] the integer ", nb::cast<std::string>(nb::str(h)),
             " does not fit int64");
    return int64_t(v);
  }
  if (PyFloat_Check(h.ptr())) return nb::cast<double>(h);
  if (PyUnicode_Check(h.ptr())) return nb::cast<std::string>(h);
  // A NumPy scalar (np.int64, np.float32, np.bool_): its Python value.
  if (nb::object v = scalar_item(h); v.is_valid()) return to_json_at(v, where, depth);
  if (PyDict_Check(h.ptr())) {
    nlohmann::json j = nlohmann::json::object();
    for (auto [k, v] : nb::borrow<nb::dict>(h)) {
      CF_CHECK(PyUnicode_Check(k.ptr()), ValueError, "[", where, "] keys must be strings");
      std::string key = nb::cast<std::string>(k);
      j[key] = to_json_at(v, where + "." + key, depth + 1);
    }
    return j;
  }
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    nlohmann::json j = nlohmann::json::array();
    for (nb::handle v : h) j.push_back(to_json_at(v, where, depth + 1));
    return j;
  }
  throw cf::ValueError(cf::str("[", where, "] cannot store a ",
                               nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(h.ptr())))),
                               " in a config (numbers, strings, bools, None, lists and dicts only)"));
}
}  // namespace

nlohmann::json to_json(nb::handle h, const std::string& where) { return to_json_at(h, where, 0); }

nb::object from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return nb::none();
    case nlohmann::json::value_t::boolean: return nb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return nb::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return nb::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float: return nb::float_(j.get<double>());
    case nlohmann::json::value_t::string: {
      const std::string& v = j.get_ref<const std::string&>();
      return nb::str(v.data(), v.size());  // (a NUL inside is kept)
    }
    case nlohmann::json::value_t::array: {
      nb::list l;
      for (auto& v : j) l.append(from_json(v));
      return l;
    }
    case nlohmann::json::value_t::object: {
      nb::dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d[nb::str(it.key().data(), it.key().size())] = from_json(it.value());
      return d;
    }
    default: return nb::none();
  }
}

// ---------------------------------------------------------------- state dicts

namespace {
// A dict's or list's entry that must be a tensor, or a clear error naming the op and the entry (a bare
// nanobind cast gave "RuntimeError: std::bad_cast").
Tensor tensor_entry(nb::handle v, const char* op, const std::string& key) {
  if (!nb::isinstance<Tensor>(v))
    throw nb::type_error(cf::str("[", op, "] '", key, "' is a ", nb::type_name(v.type()).c_str(),
                                 ", not a cf.Tensor (cf.tensor(...) or cf.from_dlpack(...) makes one)")
                             .c_str());
  return nb::cast<Tensor>(v);
}
}  // namespace

cf::nn::StateDict module_state_or_dict(nb::handle h, const char* op) {
  // (to_state_dict takes a module's parameters alone, which is what an optimizer or a norm wants: here that
  // dropped the buffers silently, a file without routing's centroids)
  if (nb::isinstance<cnn::Module>(h)) return nb::cast<cnn::Module&>(h).state_dict();
  // cf.load_safetensors returns (tensors, metadata), where safetensors.torch.load_file returns the dict: said
  // plainly (the list reading blamed the dict for not being a (name, tensor) pair)
  if (PyTuple_Check(h.ptr()) && nb::len(h) == 2 && PyDict_Check(h[0].ptr()) && PyDict_Check(h[1].ptr()))
    throw nb::type_error(cf::str("[", op, "] got a pair of dicts, as cf.load_safetensors returns (tensors, "
                                 "metadata): pass its first item").c_str());
  return to_state_dict(h, op);
}

cf::nn::StateDict to_state_dict(nb::handle h, const char* op, const std::string& positional_prefix) {
  if (nb::isinstance<cnn::Module>(h)) return nb::cast<cnn::Module&>(h).named_parameters();
  cnn::StateDict out;
  if (nb::object items = iterable_as_list(h, op); items.is_valid()) return to_state_dict(items, op, positional_prefix);
  if (PyDict_Check(h.ptr())) {
    for (auto [k, v] : nb::borrow<nb::dict>(h)) {
      if (!nb::isinstance<nb::str>(k))
        throw nb::type_error(cf::str("[", op, "] keys must be str, got a ", nb::type_name(k.type()).c_str()).c_str());
      const std::string key = nb::cast<std::string>(k);
      out.emplace_back(key, tensor_entry(v, op, key));
    }
    return out;
  }
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    int64_t i = 0;
    for (nb::handle item : h) {
      if (nb::isinstance<Tensor>(item)) {
        out.emplace_back(positional_prefix + std::to_string(i++), nb::cast<Tensor>(item));
        continue;
      }
      const bool pair = (PyTuple_Check(item.ptr()) || PyList_Check(item.ptr())) && nb::len(item) == 2 &&
                        nb::isinstance<nb::str>(item[0]);
      if (!pair)
        throw nb::type_error(cf::str("[", op, "] a list holds tensors or (name, tensor) pairs, got a ",
                                     nb::type_name(item.type()).c_str())
                                 .c_str());
      const std::string key = nb::cast<std::string>(item[0]);
      out.emplace_back(key, tensor_entry(item[1], op, key));
    }
    return out;
  }
  throw cf::ValueError(cf::str("[", op, "] expects a Module, a dict name -> Tensor, a list (or any iterable) of "
                               "tensors or of (name, Tensor) pairs; got a ", nb::type_name(h.type()).c_str()));
}

nb::object iterable_as_list(nb::handle h, const char* op) {
  PyObject* o = h.ptr();
  if (PyList_Check(o) || PyTuple_Check(o) || PyDict_Check(o) || PyUnicode_Check(o) || PyBytes_Check(o) ||
      nb::isinstance<Tensor>(h) || nb::isinstance<cnn::Module>(h))
    return nb::object();
  // Parameters are named by their position (an optimizer's state, a checkpoint's keys), and a set's order
  // changes from run to run, as PyTorch says refusing them.
  if (PyAnySet_Check(o))
    throw nb::type_error(cf::str("[", op, "] got a set of tensors, whose order changes between runs (they are "
                                 "named by position): pass a list").c_str());
  PyObject* it = PyObject_GetIter(o);
  if (!it) {
    PyErr_Clear();
    return nb::object();
  }
  PyObject* list = PySequence_List(it);  // (a generator is consumed here, once)
  Py_DECREF(it);
  if (!list) throw nb::python_error();  // the iterable's own error
  return nb::steal(list);
}

nb::dict state_dict_to_python(const cnn::StateDict& d) {
  nb::dict out;
  for (auto& [k, v] : d) out[nb::str(k.data(), k.size())] = nb::cast(v);  // (a NUL in a name is kept)
  return out;
}

namespace {

nb::list named_list(const cnn::StateDict& d) {
  nb::list out;
  for (auto& [k, v] : d) out.append(nb::make_tuple(k, v));
  return out;
}

// Keyword arguments as the JSON options object of a variant ({"clusters": 8, ...}).
cnn::Config options_config(const nb::kwargs& kw, const std::string& name) {
  return cnn::Config(to_json(kw, name), name);
}

cnn::AttentionSpec attention_spec(const std::string& type, int64_t d_model, int64_t n_heads, cf::Generator* gen,
                                  const nb::kwargs& options) {
  cnn::AttentionSpec spec;
  spec.type = type;
  spec.d_model = d_model;
  spec.n_heads = n_heads;
  spec.options = options_config(options, "attention");
  spec.gen = gen;
  return spec;
}

// TransformerLayerOptions from keyword arguments: d_model, n_heads, d_ff, dropout,
// activation, norm_first, attention={"type": ..., options}, cross_attention={...},
// read (types checked, attention options included) by the models' config reader.
cnn::TransformerLayerOptions layer_options(const nb::kwargs& kw) {
  static const char* const keys[] = {"d_model", "n_heads", "d_ff", "dropout", "activation", "norm_first",
                                     "attention", "cross_attention"};
  nlohmann::json j = to_json(kw, "layer");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    CF_CHECK(known, ValueError, "[layer] unknown option '", it.key(), "' (known: d_model, n_heads, d_ff, dropout, "
             "activation, norm_first, attention, cross_attention)");
  }
  j["vocab_size"] = 1;  // the model-level keys keep their defaults
  return cf::models::TransformerConfig::from_json(j).layer;
}

cnn::AttentionArgs attention_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::optional<Tensor>& key_padding_mask,
                                  const std::optional<Tensor>& query_padding_mask, bool causal,
                                  const std::optional<Tensor>& query_input, cnn::AuxLosses* aux) {
  cnn::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  if (key_padding_mask) a.key_padding_mask = *key_padding_mask;
  if (query_padding_mask) a.query_padding_mask = *query_padding_mask;
  a.causal = causal;
  if (query_input) a.query_input = *query_input;
  a.aux = aux;
  return a;
}

// zero_grad(set_to_none): drop the gradients (cf's and PyTorch's default), or zero them in place.
void zero_grads(const std::vector<Tensor>& params, bool set_to_none) {
  for (const Tensor& p : params) {
    if (set_to_none) {
      p.zero_grad();
      continue;
    }
    Tensor g = p.grad();
    if (!g.defined()) continue;
    cf::NoGradGuard no_grad;
    cf::fill_(g, 0.0);
  }
}

// What load_state_dict returns, as PyTorch's: (missing_keys, unexpected_keys) of the dict against the module's
// state dict (both empty after a strict load, which raises otherwise).
nb::object incompatible_keys(const cnn::StateDict& module_dict, const cnn::StateDict& given) {
  static PyObject* type = nullptr;  // (made once, held for the process's life)
  if (!type)
    type = nb::module_::import_("collections")
               .attr("namedtuple")("IncompatibleKeys", nb::make_tuple("missing_keys", "unexpected_keys"),
                                   nb::arg("module") = "cf.nn")
               .release()
               .ptr();
  std::set<std::string> have, want;
  for (const auto& e : module_dict) have.insert(e.first);
  for (const auto& e : given) want.insert(e.first);
  nb::list missing, unexpected;
  for (const auto& e : module_dict)
    if (!want.count(e.first)) missing.append(nb::str(e.first.data(), e.first.size()));
  for (const auto& e : given)
    if (!have.count(e.first)) unexpected.append(nb::str(e.first.data(), e.first.size()));
  return nb::borrow(type)(missing, unexpected);
}

// PyTorch's factory keywords of a layer's constructor (cf.nn.Linear(4, 3, device="cuda", dtype=cf.float64)): the
// layer is built as usual, then converted and moved in place as module.to() does.
// device: a cf.Device, a name ("cuda:0"), an int (a CUDA device's index, as PyTorch) or an object whose str() is a
// name (a torch.device).
void apply_factory_kwargs(cnn::Module& mod, const char* layer, nb::handle device, std::optional<cf::DType> dtype) {
  if (dtype) mod.to(*dtype);
  if (device.is_none()) return;
  cf::Device d = cf::Device::cpu();
  if (nb::isinstance<cf::Device>(device)) {
    d = nb::cast<cf::Device>(device);
  } else if (int64_t index = 0; !nb::isinstance<nb::str>(device) && index_value(device, layer, "device", index)) {
    CF_CHECK(index >= 0, ValueError, "[", layer, "] device index must be >= 0, got ", index);
    d = cf::Device::cuda(int(index));
  } else if (nb::isinstance<nb::str>(device) || nb::hasattr(device, "type")) {
    d = cf::Device::parse(nb::cast<std::string>(nb::str(device)));
  } else {
    throw nb::type_error(cf::str("[", layer, "] device must be a cf.Device, a name such as \"cuda:0\" or an int, got ",
                                 nb::type_name(device.type()).c_str())
                             .c_str());
  }
  mod.to(d);
}
auto device_kwarg() { return nb::arg("device").none() = nb::none(); }
auto dtype_kwarg() { return nb::arg("dtype").none() = nb::none(); }

[[noreturn]] void refuse_module_copy(nb::handle self, const char* what) {
  const std::string t = user_type_name(self);
  throw nb::type_error(cf::str("[", what, "] a cf.nn module (", t, ") cannot be copied or pickled: build a new ",
                               t, " with the same arguments and copy the values with "
                               "new.load_state_dict(old.state_dict()); for files, cf.save_safetensors(path, "
                               "m.state_dict()) or cf.nn.save_checkpoint")
                           .c_str());
}

}  // namespace

void bind_nn(nb::module_& m, nb::module_& nn) {
  // ---------------------------------------------------------------- Module
  nb::class_<cnn::Module, PyModule> module(
      nn, "Module",
      "Base of every layer and model: named parameters, buffers and submodules in registration order (names like "
      "\"layers.0.self_attn.w_q.weight\"). A Python class derives from it as from torch.nn.Module: it assigns "
      "cf.nn modules and cf.nn.Parameter(tensor) to its attributes (or calls register_buffer) and defines forward; "
      "state_dict, load_state_dict, to(), train() and the optimizers then see them. cf's own modules are C++: a Python "
      "subclass of one (cf.nn.Linear, ...) may add methods but not override forward.",
      nb::type_slots(module_type_slots));
  module.def("parameters", &cnn::Module::parameters, "The parameter tensors, recursively, in order.")
      .def("named_parameters", [](const cnn::Module& mod) { return named_list(mod.named_parameters()); },
           "[(name, tensor), ...] in registration order.")
      .def("named_buffers", [](const cnn::Module& mod) { return named_list(mod.named_buffers()); })
      .def("named_modules", [](nb::handle self) {
             // owned handles: one taken before set_attention replaced its module pointed at freed memory
             nb::list out;
             out.append(nb::make_tuple("", self));
             for (auto& [name, sub] : nb::cast<cnn::Module&>(self).named_submodules())
               out.append(nb::make_tuple(name, nb::cast(sub)));
             return out;
           },
           "[(name, module), ...], this one first as \"\".")
      .def("num_parameters", &cnn::Module::num_parameters, "Number of scalar parameters.")
      .def("state_dict", [](const cnn::Module& mod) { return state_dict_to_python(mod.state_dict()); },
           "Parameters and persistent buffers, name -> tensor (the module's own tensors, not copies).")
      .def("load_state_dict",
           [](cnn::Module& mod, nb::handle dict, bool strict) {
             cnn::StateDict d = module_state_or_dict(dict, "load_state_dict");
             {
               nb::gil_scoped_release g;
               mod.load_state_dict(d, strict);
             }
             return incompatible_keys(mod.state_dict(), d);
           },
           nb::arg("state_dict"), nb::arg("strict") = true,
           "Copy values into the registered tensors (a dict, (name, tensor) pairs, or another module: its "
           "state_dict(), buffers included). Strict: one error lists every missing, unexpected and "
           "mis-shaped key; a failed load changes nothing. Returns (missing_keys, unexpected_keys), as PyTorch's "
           "(what a non-strict load left out).")
      .def("train",
           [](cnn::Module& mod, bool on) -> cnn::Module& {
             // A Python module's override reached here through super().train(): run the base's (the virtual call
             // would dispatch to that override once more, nanobind taking the first call for no override)
             if (dynamic_cast<PythonModule*>(&mod))
               mod.cnn::Module::train(on);
             else
               mod.train(on);
             return mod;
           },
           nb::arg("on") = true, nb::rv_policy::reference, "Training mode (dropout on); returns self.")
      .def("eval", [](cnn::Module& mod) -> cnn::Module& { mod.eval(); return mod; }, nb::rv_policy::reference,
           "Evaluation mode; returns self.")
      .def_prop_ro("training", &cnn::Module::is_training)
      // (the GIL stays held: to() rewrites tensors that Python handles share, Tensor::set_data)
      .def("to", [](cnn::Module& mod, cf::DType d) -> cnn::Module& { mod.to(d); return mod; }, nb::arg("dtype"),
           nb::rv_policy::reference,
           "Convert float parameters and buffers in place, as PyTorch's .to(): each tensor keeps its identity, so "
           "an optimizer built before steps the converted ones (its state follows at its next step); returns self.")
      .def("to", [](cnn::Module& mod, cf::Device d) -> cnn::Module& { mod.to(d); return mod; }, nb::arg("device"),
           nb::rv_policy::reference,
           "Move parameters and buffers in place, as PyTorch's .to(): each tensor keeps its identity, so an "
           "optimizer built before steps the moved ones (its state follows at its next step); returns self.")
      // a device's name parsed here: through nanobind's implicit conversion a bad one printed a warning and
      // raised a bare TypeError
      .def("to", [](cnn::Module& mod, const std::string& device) -> cnn::Module& {
        mod.to(cf::Device::parse(device));
        return mod;
      }, nb::arg("device"), nb::rv_policy::reference, "Move parameters and buffers to the named device.")
      .def("zero_grad", [](cnn::Module& mod, bool set_to_none) { zero_grads(mod.parameters(), set_to_none); },
           nb::arg("set_to_none") = true,
           "Drop every parameter's gradient (set_to_none=False: fill the existing ones with zeros instead).")
      .def("set_parameters",
           [](cnn::Module& mod, const std::vector<Tensor>& values) {
             mod.set_parameters(values);
             for (const Tensor& t : values) keep_wrapper(t);
           },
           nb::arg("values"),
           "Replace the parameter tensors (named_parameters order) by values, used as given: no copy, no detach.")
      .def("set_buffers",
           [](cnn::Module& mod, const std::vector<Tensor>& values) {
             mod.set_buffers(values);
             for (const Tensor& t : values) keep_wrapper(t);
           },
           nb::arg("values"),
           "Replace the buffer tensors (named_buffers order) by values, used as given: no copy.")
      // copy.copy, copy.deepcopy and pickle reach these: a module is a C++ object graph that Python
      // cannot rebuild, so each says how to make a copy instead of Python's bare "cannot pickle".
      .def("__copy__", [](nb::handle self) { refuse_module_copy(self, "copy"); },
           nb::sig("def __copy__(self) -> typing.NoReturn"))
      .def("__deepcopy__", [](nb::handle self, nb::handle) { refuse_module_copy(self, "deepcopy"); },
           nb::arg("memo"), nb::sig("def __deepcopy__(self, memo: object) -> typing.NoReturn"))
      .def("__reduce__", [](nb::handle self) { refuse_module_copy(self, "pickle"); },
           nb::sig("def __reduce__(self) -> typing.NoReturn"));

  nb::class_<cnn::UnaryModule, cnn::Module, PyUnaryModule> unary(
      nn, "UnaryModule",
      "A module mapping one tensor to one tensor (what Sequential chains). A Python subclass defines forward(self, x).");
  bind_python_modules(nn, module, unary);
  // (no __call__ of its own: cf's layers bind theirs, and a Python subclass's is Module's, which calls its Python
  // forward with any arguments)
  unary.def("forward", [](cnn::UnaryModule& mod, const Tensor& x) { return mod.forward(x); }, nb::arg("x"),
            "forward(x)", release_gil());

  // ---------------------------------------------------------------- layers
  nb::class_<cnn::Linear, cnn::UnaryModule> linear(nn, "Linear",
                                            "y = x W^T + b; W is (out, in) as in PyTorch. Init U(-1/sqrt(in), 1/sqrt(in)).");
  linear.def("__init__",
             [](cnn::Linear* self, int64_t in, int64_t out, bool bias, cf::Generator* g, nb::handle device,
                std::optional<cf::DType> dtype) {
               new (self) cnn::Linear(in, out, bias, gen_or_default(g));
               apply_factory_kwargs(*self, "Linear", device, dtype);
             },
             nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true, generator_arg(), device_kwarg(),
             dtype_kwarg(),
             nb::sig("def __init__(self, in_features: int, out_features: int, bias: bool = True, generator: "
                     "cf._cf.Generator | None = None, device: cf._cf.Device | str | None = None, dtype: "
                     "cf._cf.dtype | None = None) -> None"),
             "device= and dtype= (PyTorch's factory keywords) move and convert the new layer.")
      .def_prop_ro("in_features", &cnn::Linear::in_features)
      .def_prop_ro("out_features", &cnn::Linear::out_features);
  def_tensor_member(linear, "weight", &cnn::Linear::weight, Member::kAlways);
  def_tensor_member(linear, "bias", &cnn::Linear::bias);
  nb::class_<cnn::Embedding, cnn::Module> emb(nn, "Embedding",
                                              "Rows of a (num, dim) table picked by int64 ids of any shape -> (..., dim). "
                                              "The padding row starts at zero and gets no gradient.");
  // padding_idx as PyTorch's: None for none, a negative index counts from the end (C++'s -1 means none, so
  // padding_idx=-1 gave no padding row where PyTorch pads the last).
  emb.def("__init__",
          [](cnn::Embedding* self, int64_t num, int64_t dim, std::optional<int64_t> padding_idx, cf::Generator* g,
             nb::handle device, std::optional<cf::DType> dtype) {
            int64_t pad = -1;
            if (padding_idx) {
              CF_CHECK(*padding_idx >= -num && *padding_idx < num, ValueError, "[Embedding] padding_idx ",
                       *padding_idx, " out of range for ", num, " embeddings (None: no padding row)");
              pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
            }
            new (self) cnn::Embedding(num, dim, pad, gen_or_default(g));
            apply_factory_kwargs(*self, "Embedding", device, dtype);
          },
          nb::arg("num_embeddings"), nb::arg("dim"), nb::arg("padding_idx") = nb::none(),
          generator_arg(), device_kwarg(), dtype_kwarg(),
          nb::sig("def __init__(self, num_embeddings: int, dim: int, padding_idx: int | None = None, generator: "
                  "cf._cf.Generator | None = None, device: cf._cf.Device | str | None = None, dtype: cf._cf.dtype | "
                  "None = None) -> None"),
          "device= and dtype= (PyTorch's factory keywords) move and convert the new layer.")
      .def_prop_ro("num_embeddings", &cnn::Embedding::num_embeddings)
      .def_prop_ro("dim", &cnn::Embedding::dim);
  def_tensor_member(emb, "weight", &cnn::Embedding::weight, Member::kAlways);
  def_forward(emb, [](cnn::Embedding& e, const Tensor& ids) { return e.forward(ids); }, "forward(ids)", nb::arg("ids"));
  nb::class_<cnn::LayerNorm, cnn::UnaryModule> norm(nn, "LayerNorm",
                                                    "Layer normalisation over the last axis, learned scale and shift.");
  // normalized_shape as PyTorch's: an int or a one-entry sequence (cf normalises over the last axis only);
  // elementwise_affine= is PyTorch's name of affine=
  norm.def("__init__",
           [](cnn::LayerNorm* self, nb::handle normalized_shape, double eps, std::optional<bool> affine,
              std::optional<bool> elementwise_affine, nb::handle device, std::optional<cf::DType> dtype) {
             const std::vector<int64_t> shape = int64_or_list_arg(normalized_shape, "LayerNorm", "normalized_shape");
             CF_CHECK(shape.size() == 1, ValueError, "[LayerNorm] normalises over the last axis only: normalized_shape "
                      "must be one size, got ", shape.size(), " (flatten the normalised axes into one first)");
             CF_CHECK(!(affine && elementwise_affine && *affine != *elementwise_affine), ValueError,
                      "[LayerNorm] affine and elementwise_affine are one setting, given as ", *affine, " and ",
                      *elementwise_affine);
             new (self) cnn::LayerNorm(shape[0], eps, affine.value_or(elementwise_affine.value_or(true)));
             apply_factory_kwargs(*self, "LayerNorm", device, dtype);
           },
           nb::arg("normalized_shape"), nb::arg("eps") = 1e-5, nb::arg("affine").none() = nb::none(),
           nb::arg("elementwise_affine").none() = nb::none(), device_kwarg(), dtype_kwarg(),
           nb::sig("def __init__(self, normalized_shape: int | collections.abc.Sequence[int], eps: float = 1e-05, "
                   "affine: bool | "
                   "None = None, elementwise_affine: bool | None = None, device: cf._cf.Device | str | None = None, "
                   "dtype: cf._cf.dtype | None = None) -> None"),
           "normalized_shape: the size of the last axis, an int or one entry as PyTorch's; affine (default True, "
           "PyTorch's elementwise_affine) adds the learned scale and shift.");
  def_tensor_member(norm, "weight", &cnn::LayerNorm::weight);
  def_tensor_member(norm, "bias", &cnn::LayerNorm::bias);
  nb::class_<cnn::Dropout, cnn::UnaryModule>(nn, "Dropout", "Inverted dropout in training mode, identity in eval mode.")
      .def("__init__", init_with_generator<cnn::Dropout, double>(), nb::arg("p") = 0.5,
           generator_arg(),
           nb::keep_alive<1, 3>())
      .def_prop_ro("p", &cnn::Dropout::p);
  nb::class_<cnn::ReLU, cnn::UnaryModule>(nn, "ReLU").def(nb::init<>());
  nb::class_<cnn::GELU, cnn::UnaryModule>(nn, "GELU", "GELU, exact erf form.").def(nb::init<>());
  nb::class_<cnn::LeakyReLU, cnn::UnaryModule>(nn, "LeakyReLU").def(nb::init<double>(), nb::arg("negative_slope") = 0.01);
  nb::class_<cnn::Tanh, cnn::UnaryModule>(nn, "Tanh").def(nb::init<>());
  nb::class_<cnn::Sigmoid, cnn::UnaryModule>(nn, "Sigmoid").def(nb::init<>());
  nb::class_<cnn::Identity, cnn::UnaryModule>(nn, "Identity").def(nb::init<>());
  nn.def("make_activation", &cnn::make_activation, nb::arg("name"),
         "\"relu\", \"gelu\", \"leaky_relu\" (or \"leaky_relu:0.2\"), \"tanh\", \"sigmoid\", \"identity\".");
  // A layer of a Sequential: a one-tensor module (anything else is named, not a signature dump).
  auto sequential_layer = [](nb::handle h, size_t i) {
    if (!nb::isinstance<cnn::UnaryModule>(h))
      throw nb::type_error(cf::str("[Sequential] layer ", i, " is a ", nb::type_name(h.type()).c_str(),
                                   ", not a one-tensor layer (a cf.nn.UnaryModule: Linear, LayerNorm, Dropout, the "
                                   "activations, FeedForward, Sequential, ...); call it from your own code instead")
                               .c_str());
    return nb::cast<std::shared_ptr<cnn::UnaryModule>>(h);
  };
  nb::class_<cnn::Sequential, cnn::UnaryModule>(nn, "Sequential", "Applies its layers in order; named \"0\", \"1\", ...")
      .def("__init__",
           [sequential_layer](cnn::Sequential* self, nb::args args, std::optional<nb::object> layers) {
             // Sequential([a, b]), Sequential(layers=[a, b]) or PyTorch's Sequential(a, b)
             if (layers && args.size() > 0)
               throw nb::type_error("[Sequential] give the layers as arguments or as layers=[...], not both");
             nb::handle given = layers ? nb::handle(*layers) : nb::handle(args);
             if (!layers && args.size() == 1 && (PyList_Check(args[0].ptr()) || PyTuple_Check(args[0].ptr())))
               given = args[0];
             if (layers && !PyList_Check(given.ptr()) && !PyTuple_Check(given.ptr()))
               throw nb::type_error(cf::str("[Sequential] layers must be a list of layers, got a ",
                                            nb::type_name(given.type()).c_str()).c_str());
             std::vector<std::shared_ptr<cnn::UnaryModule>> list;
             size_t i = 0;
             for (nb::handle h : given) list.push_back(sequential_layer(h, i++));
             new (self) cnn::Sequential(std::move(list));
           },
           nb::arg("args"), nb::arg("layers") = nb::none(),
           nb::sig("def __init__(self, *args: UnaryModule | collections.abc.Sequence[UnaryModule], "
                   "layers: collections.abc.Sequence[UnaryModule] | None = None) -> None"),
           "Sequential([a, b, c]), Sequential(layers=[a, b, c]) or Sequential(a, b, c).")
      .def("append",
           [sequential_layer](cnn::Sequential& s, nb::handle l) { s.push_back(sequential_layer(l, s.size())); },
           nb::arg("layer"), nb::sig("def append(self, layer: UnaryModule) -> None"))
      .def("__len__", &cnn::Sequential::size)
      .def("__getitem__", [](cnn::Sequential& s, int64_t i) -> cnn::UnaryModule& {
        const int64_t n = int64_t(s.size());  // a negative index counts from the end, as in Python
        CF_CHECK(i >= -n && i < n, IndexError, "[Sequential] index ", i, " out of range for ", n, " layers");
        return s[size_t(i < 0 ? i + n : i)];
      }, nb::rv_policy::reference_internal)
      .def("__getitem__", [](cnn::Sequential& s, nb::slice sl) {
        // a new Sequential of the same layer objects, as PyTorch's
        auto [start, stop, step, count] = sl.compute(s.size());
        std::map<std::string, std::shared_ptr<cnn::UnaryModule>> children;  // the layers are children "0", "1", ...
        for (auto& [name, child] : s.named_submodules())
          if (name.find('.') == std::string::npos) children[name] = std::dynamic_pointer_cast<cnn::UnaryModule>(child);
        std::vector<std::shared_ptr<cnn::UnaryModule>> layers;
        for (size_t k = 0; k < count; ++k)
          layers.push_back(children.at(std::to_string(int64_t(start) + int64_t(k) * int64_t(step))));
        return std::make_shared<cnn::Sequential>(std::move(layers));
      }, nb::arg("index"));
  nb::class_<cnn::FeedForward, cnn::UnaryModule>(nn, "FeedForward",
                                                 "Linear(d, d_ff) -> activation -> dropout -> Linear(d_ff, d).")
      .def("__init__", init_with_generator<cnn::FeedForward, int64_t, int64_t, const std::string&, double>(), nb::arg("d_model"),
           nb::arg("d_ff"), nb::arg("activation") = "relu", nb::arg("dropout") = 0.0,
           generator_arg(),
           nb::keep_alive<1, 6>())
      .def_ro("fc1", &cnn::FeedForward::fc1)
      .def_ro("fc2", &cnn::FeedForward::fc2);
  nb::class_<cnn::SinusoidalPositionalEncoding, cnn::UnaryModule>(
      nn, "SinusoidalPositionalEncoding", "x + PE[:N], the fixed sinusoids of Vaswani et al. (2017), section 3.5.")
      .def(nb::init<int64_t, int64_t>(), nb::arg("max_len"), nb::arg("dim"));
  nb::class_<cnn::LearnedPositionalEncoding, cnn::UnaryModule> lpe(nn, "LearnedPositionalEncoding",
                                                                   "x + P[:N] with a learned table P ~ N(0, 0.02^2).");
  lpe.def("__init__", init_with_generator<cnn::LearnedPositionalEncoding, int64_t, int64_t>(), nb::arg("max_len"), nb::arg("dim"),
          generator_arg());
  def_tensor_member(lpe, "weight", &cnn::LearnedPositionalEncoding::weight, Member::kAlways);
  nb::class_<cnn::DepthwiseConv1d, cnn::UnaryModule> dwconv(
      nn, "DepthwiseConv1d",
      "Depthwise convolution along the sequence axis of (B, N, C); N_out = floor((N + 2p - k) / s) + 1.");
  dwconv.def("__init__", init_with_generator<cnn::DepthwiseConv1d, int64_t, int64_t, int64_t, int64_t, bool>(), nb::arg("channels"),
           nb::arg("kernel_size"), nb::arg("stride") = 1, nb::arg("padding") = 0, nb::arg("bias") = true,
           generator_arg())
      .def("output_length", &cnn::DepthwiseConv1d::output_length, nb::arg("n"));
  def_tensor_member(dwconv, "weight", &cnn::DepthwiseConv1d::weight, Member::kAlways);
  def_tensor_member(dwconv, "bias", &cnn::DepthwiseConv1d::bias);

  // ---------------------------------------------------------------- attention
  nb::class_<cnn::AuxLosses>(nn, "AuxLosses",
                             "Collects named auxiliary losses during a forward pass (e.g. neural clustering's L1, L2).")
      .def(nb::init<>())
      .def("add", &cnn::AuxLosses::add, nb::arg("name"), nb::arg("loss"))
      .def("get", &cnn::AuxLosses::get, nb::arg("name"))
      .def("names", &cnn::AuxLosses::names)
      .def("empty", &cnn::AuxLosses::empty)
      .def("clear", &cnn::AuxLosses::clear)
      .def("total", &cnn::AuxLosses::total, nb::arg("weights"), release_gil(),
           "sum over names of weights[name] * (that name's losses); a missing or unknown name is an error.");

  nb::class_<cnn::Attention, cnn::Module> att(
      nn, "Attention",
      "One attention variant on per-head q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv) -> (B, H, Nq, Dv). "
      "key_padding_mask: bool (B, Nk), True = padding. Build one with cf.nn.make_attention(type, ...).");
  att.def_prop_ro("type", &cnn::Attention::type, "The name this variant is configured by.")
      .def_prop_ro("shares_qk", &cnn::Attention::shares_qk, "True when keys are the queries' projection (LSH always; any variant built with shared_qk=True).");
  auto att_forward = [](cnn::Attention& a, const Tensor& q, const Tensor& k, const Tensor& v,
                        std::optional<Tensor> kpm, std::optional<Tensor> qpm, bool causal,
                        std::optional<Tensor> query_input, cnn::AuxLosses* aux) {
    return a.forward(attention_args(q, k, v, kpm, qpm, causal, query_input, aux));
  };
  def_forward(att, att_forward, "Per-head attention (see the class doc).", nb::arg("q"), nb::arg("k"), nb::arg("v"),
              nb::arg("key_padding_mask") = nb::none(), nb::arg("query_padding_mask") = nb::none(),
              nb::arg("causal") = false, nb::arg("query_input") = nb::none(), nb::arg("aux").none() = nb::none());
  nb::class_<cnn::FullAttention, cnn::Attention>(nn, "FullAttention", "Softmax attention (options: dropout, scale).");
  nb::class_<cnn::LSHAttention, cnn::Attention>(nn, "LSHAttention",
                                                "Reformer's LSH attention (options: n_hashes, bucket_size, n_buckets, seed, scale).")
      .def("buckets_for", &cnn::LSHAttention::buckets_for, nb::arg("n"))
      .def("hash", &cnn::LSHAttention::hash, nb::arg("q"), release_gil());
  nb::class_<cnn::RoutingAttention, cnn::Attention>(
      nn, "RoutingAttention", "Routing Transformer attention: EMA K-Means centroids, local heads (see routing.h).")
      .def_prop_ro("n_clusters", &cnn::RoutingAttention::n_clusters)
      .def_prop_ro("local_heads", &cnn::RoutingAttention::local_heads)
      .def_prop_ro("centroids", &cnn::RoutingAttention::centroids);
  nb::class_<cnn::SparseAttention, cnn::Attention>(
      nn, "SparseAttention",
      "Fixed sparse attention (Child et al. 2019): blocks of block_size tokens, each query attending to its block "
      "and the last `summary` tokens of every block (options: block_size, summary, scale; see sparse.h).")
      .def("block_for", &cnn::SparseAttention::block_for, nb::arg("n"), "The block l used for n positions.")
      .def("summary_for", &cnn::SparseAttention::summary_for, nb::arg("block"),
           "The summary positions c used with blocks of `block`.");
  nb::class_<cnn::ClusteredAttention, cnn::Attention>(
      nn, "ClusteredAttention",
      "Clustered / improved clustered attention (Vyas et al. 2020): hashed queries, Hamming K-Means, centroid "
      "attention; improved adds exact top-k products. Options: clusters, bits, iterations, topk (improved), hash_seed, "
      "centroid_path, scale, dropout.")
      .def("cluster", [](cnn::ClusteredAttention& a, const Tensor& q, std::optional<Tensor> m) { return a.cluster(q, opt(m)); },
           nb::arg("q"), nb::arg("query_padding_mask").none() = nb::none(),
           release_gil(), "Cluster ids int64 (B, H, Nq) of q (-1 for padded queries).")
      .def("set_assignment", &cnn::ClusteredAttention::set_assignment, nb::arg("assignment"))
      .def("clear_assignment", &cnn::ClusteredAttention::clear_assignment)
      .def_prop_ro("last_assignment", &cnn::ClusteredAttention::last_assignment);
  nb::class_<cnn::MemoryBankOptions> mbo(nn, "MemoryBankOptions", "Options of a Cluster-Former memory bank (Algorithm 1).");
  def_kwargs_init(mbo, "MemoryBankOptions");
  mbo.def_rw("dim", &cnn::MemoryBankOptions::dim)
      .def_rw("num_clusters", &cnn::MemoryBankOptions::num_clusters)
      .def_rw("capacity", &cnn::MemoryBankOptions::capacity)
      .def_rw("update_every", &cnn::MemoryBankOptions::update_every)
      .def_rw("kmeans_iters", &cnn::MemoryBankOptions::kmeans_iters)
      .def_rw("seed", &cnn::MemoryBankOptions::seed)
      .def_rw("save_memory", &cnn::MemoryBankOptions::save_memory);
  nb::class_<cnn::MemoryBank, cnn::Module> bank(
      nn, "MemoryBank", "FIFO of hidden states re-clustered by K-Means every update_every steps (Cluster-Former, Alg. 1).");
  bank.def("__init__", init_with_generator<cnn::MemoryBank, const cnn::MemoryBankOptions&>(), nb::arg("options"),
           generator_arg())
      .def("add", [](cnn::MemoryBank& b, const Tensor& states, std::optional<Tensor> m) { b.add(states, opt(m)); },
           nb::arg("states"), nb::arg("padding_mask").none() = nb::none(), release_gil())
      .def("step", &cnn::MemoryBank::step, release_gil(), "Count one training step; recluster when due. True if it did.")
      .def("update_centroids", &cnn::MemoryBank::update_centroids, release_gil())
      .def("contents", &cnn::MemoryBank::contents)
      .def("size", &cnn::MemoryBank::size)
      .def("steps", &cnn::MemoryBank::steps)
      .def("updates", &cnn::MemoryBank::updates);
  def_tensor_member(bank, "centroids", &cnn::MemoryBank::centroids, Member::kAlways);
  nn.def("step_memory_banks", &cnn::step_memory_banks, nb::arg("model"), release_gil(),
         "One training step of every memory bank in model (MemoryBank.step of each); returns how many "
         "recomputed their centroids. Call it once per optimizer step for a model whose attention is "
         "cluster-former (a ClusterFormer model's on_train_step does), or its centroids stay the random initial "
         "ones.");
  nb::class_<cnn::ClusterFormerAttention, cnn::Attention>(
      nn, "ClusterFormerAttention",
      "Cluster-Former's cluster layer attention (eqs. 5-9): tokens sorted by nearest memory-bank centroid, attended in "
      "chunks. Options: chunk_size, scale, dropout, num_clusters, memory_size (the bank's capacity), update_every, "
      "kmeans_iters, seed, save_memory. Its memory bank re-clusters through cf.nn.step_memory_banks(model), once "
      "per optimizer step.")
      .def("assign", [](const cnn::ClusterFormerAttention& a, const Tensor& x, std::optional<Tensor> m) { return a.assign(x, opt(m)); },
           nb::arg("x"), nb::arg("padding_mask").none() = nb::none(), release_gil())
      .def("set_fixed_assignments", &cnn::ClusterFormerAttention::set_fixed_assignments, nb::arg("ids"))
      .def_prop_ro("last_assignments", &cnn::ClusterFormerAttention::last_assignments)
      .def_prop_ro("chunk_size", &cnn::ClusterFormerAttention::chunk_size)
      .def_ro("bank", &cnn::ClusterFormerAttention::bank);
  nb::class_<cnn::NeuralClusteringAttention, cnn::Attention> nca(
      nn, "NeuralClusteringAttention",
      "ClusterFormer's neural clustering attention (eqs. 2-11; masked variant of appendix B). Options: clusters "
      "(required), look_back, scale, tie_order, losses_reach_input, loss_form, dropout. Self-attention only (needs "
      "query_input).");
  def_tensor_member(nca, "centroids", &cnn::NeuralClusteringAttention::centroids);
  def_tensor_member(nca, "w_c", &cnn::NeuralClusteringAttention::w_c, Member::kAlways);
  nca.def_prop_ro("d_model", &cnn::NeuralClusteringAttention::d_model)
      .def_prop_ro("chain_index", &cnn::NeuralClusteringAttention::chain_index)
      .def("current_centroids", &cnn::NeuralClusteringAttention::current_centroids);
  nn.attr("CLUSTERING_LOSS") = cnn::kClusteringLossName;
  nn.attr("CENTROID_SORTING_LOSS") = cnn::kCentroidSortingLossName;

  nn.def("make_attention",
         [](const std::string& type, int64_t d_model, int64_t n_heads, cf::Generator* gen, nb::kwargs options) {
           return cnn::make_attention(attention_spec(type, d_model, n_heads, gen, options));
         },
         nb::arg("type"), nb::arg("d_model"), nb::arg("n_heads") = 1, nb::arg("generator").none() = nb::none(),
         nb::arg("options"),
         "Build the attention variant named `type` (cf.nn.attention_types()) with its options as keyword arguments, "
         "e.g. make_attention(\"neural-clustering\", 64, 4, clusters=8). Unknown or mistyped options are errors "
         "naming the key.");
  nn.def("attention_types", &cnn::attention_types, "The variant names make_attention takes.");

  nb::class_<cnn::MultiHeadAttention, cnn::Module> mha(
      nn, "MultiHeadAttention",
      "Multi-head attention around any variant: project q, k, v (w_q, w_k, w_v), split heads, run the variant, merge, "
      "project back (w_o). MultiHeadAttention(\"clustered\", d_model=64, n_heads=4, clusters=16) builds the variant by "
      "name with its options as keyword arguments.");
  mha.def("__init__",
          [](cnn::MultiHeadAttention* self, const std::string& type, int64_t d_model, int64_t n_heads,
             cf::Generator* gen, bool bias, nb::kwargs options) {
            cf::Generator& g = gen_or_default(gen);
            auto a = cnn::make_attention(attention_spec(type, d_model, n_heads, &g, options));
            new (self) cnn::MultiHeadAttention(d_model, n_heads, a, g, bias);
          },
          nb::arg("type"), nb::arg("d_model"), nb::arg("n_heads") = 1, nb::arg("generator").none() = nb::none(),
          nb::arg("bias") = true, nb::arg("options"))
      .def("__init__",
           [](cnn::MultiHeadAttention* self, std::shared_ptr<cnn::Attention> a, int64_t d_model, int64_t n_heads,
              cf::Generator* gen, bool bias) {
             new (self) cnn::MultiHeadAttention(d_model, n_heads, std::move(a), gen_or_default(gen), bias);
           },
           nb::arg("attention"), nb::arg("d_model"), nb::arg("n_heads") = 1, nb::arg("generator").none() = nb::none(),
           nb::arg("bias") = true)
      .def_prop_ro("d_model", &cnn::MultiHeadAttention::d_model)
      .def_prop_ro("n_heads", &cnn::MultiHeadAttention::n_heads)
      .def_prop_ro("attention", &cnn::MultiHeadAttention::attention_ptr)  // owned: valid after set_attention
      .def("set_attention", &cnn::MultiHeadAttention::set_attention, nb::arg("attention").none(),  // (None: cf's error)
           "Switch the variant, keeping the projections.")
      .def_ro("w_q", &cnn::MultiHeadAttention::w_q)
      .def_ro("w_k", &cnn::MultiHeadAttention::w_k)
      .def_ro("w_v", &cnn::MultiHeadAttention::w_v)
      .def_ro("w_o", &cnn::MultiHeadAttention::w_o);
  def_forward(mha,
              [](cnn::MultiHeadAttention& a, const Tensor& query, std::optional<Tensor> key, std::optional<Tensor> value,
                 std::optional<Tensor> kpm, bool causal, cnn::AuxLosses* aux, std::optional<Tensor> qpm) {
                Tensor k = key ? *key : query, v = value ? *value : k;
                return a.forward(query, k, v, opt(kpm), causal, aux, opt(qpm));
              },
              "query (B, Nq, D), key/value (B, Nk, D) (default: self-attention) -> (B, Nq, D). key_padding_mask "
              "bool (B, Nk), True = padding.",
              nb::arg("query"), nb::arg("key") = nb::none(), nb::arg("value") = nb::none(),
              nb::arg("key_padding_mask") = nb::none(), nb::arg("causal") = false, nb::arg("aux").none() = nb::none(),
              nb::arg("query_padding_mask") = nb::none());

  // ---- transformer layers ----
  nb::class_<cnn::TransformerEncoderLayer, cnn::Module> enc(
      nn, "TransformerEncoderLayer",
      "Self-attention + feed-forward, pre-LN (norm_first) or post-LN. Keyword options: d_model, n_heads, d_ff, "
      "dropout, activation, norm_first, attention={\"type\": ..., options}.");
  enc.def("__init__",
          [](cnn::TransformerEncoderLayer* self, cf::Generator* gen, nb::kwargs kw) {
            new (self) cnn::TransformerEncoderLayer(layer_options(kw), gen_or_default(gen));
          },
          nb::arg("generator").none() = nb::none(), nb::arg("options"), nb::keep_alive<1, 2>())
      .def_ro("self_attn", &cnn::TransformerEncoderLayer::self_attn)
      .def_ro("ff", &cnn::TransformerEncoderLayer::ff)
      .def_ro("norm1", &cnn::TransformerEncoderLayer::norm1)
      .def_ro("norm2", &cnn::TransformerEncoderLayer::norm2);
  def_forward(enc,
              [](cnn::TransformerEncoderLayer& l, const Tensor& x, std::optional<Tensor> kpm, bool causal,
                 cnn::AuxLosses* aux) { return l.forward(x, opt(kpm), causal, aux); },
              "x (B, N, D) -> (B, N, D).", nb::arg("x"), nb::arg("key_padding_mask") = nb::none(),
              nb::arg("causal") = false, nb::arg("aux").none() = nb::none());
  nb::class_<cnn::TransformerDecoderLayer, cnn::Module> dec(
      nn, "TransformerDecoderLayer", "Causal self-attention, cross-attention to memory, feed-forward.");
  dec.def("__init__",
          [](cnn::TransformerDecoderLayer* self, cf::Generator* gen, nb::kwargs kw) {
            new (self) cnn::TransformerDecoderLayer(layer_options(kw), gen_or_default(gen));
          },
          nb::arg("generator").none() = nb::none(), nb::arg("options"), nb::keep_alive<1, 2>())
      .def_ro("self_attn", &cnn::TransformerDecoderLayer::self_attn)
      .def_ro("cross_attn", &cnn::TransformerDecoderLayer::cross_attn)
      .def_ro("ff", &cnn::TransformerDecoderLayer::ff);
  def_forward(dec,
              [](cnn::TransformerDecoderLayer& l, const Tensor& x, const Tensor& memory, std::optional<Tensor> tpm,
                 std::optional<Tensor> mpm, cnn::AuxLosses* aux) {
                return l.forward(x, memory, opt(tpm), opt(mpm), aux);
              },
              "x (B, Nt, D) attends causally to itself and fully to memory (B, Ns, D).", nb::arg("x"),
              nb::arg("memory"), nb::arg("tgt_padding_mask") = nb::none(), nb::arg("memory_padding_mask") = nb::none(),
              nb::arg("aux").none() = nb::none());

  // ---- centroid attention (Centroid Transformers, eqs. 3-4) ----
  nb::class_<cnn::CentroidAttentionOptions> cao(nn, "CentroidAttentionOptions",
                                               "Options of centroid attention (nn/attention/centroid.h).");
  def_kwargs_init(cao, "CentroidAttentionOptions");
  cao.def_rw("d_model", &cnn::CentroidAttentionOptions::d_model)
      .def_rw("n_heads", &cnn::CentroidAttentionOptions::n_heads)
      .def_rw("iterations", &cnn::CentroidAttentionOptions::iterations)
      .def_rw("eps", &cnn::CentroidAttentionOptions::eps)
      .def_rw("normalize", &cnn::CentroidAttentionOptions::normalize)
      .def_rw("knn", &cnn::CentroidAttentionOptions::knn)
      .def_rw("scale", &cnn::CentroidAttentionOptions::scale)
      .def_rw("norm", &cnn::CentroidAttentionOptions::norm)
      .def_rw("bias", &cnn::CentroidAttentionOptions::bias)
      .def_rw("init", &cnn::CentroidAttentionOptions::init)
      .def_rw("num_centroids", &cnn::CentroidAttentionOptions::num_centroids)
      .def_rw("downsample", &cnn::CentroidAttentionOptions::downsample)
      .def_rw("kmeans_iters", &cnn::CentroidAttentionOptions::kmeans_iters)
      .def_rw("seq_len", &cnn::CentroidAttentionOptions::seq_len)
      .def_rw("conv_kernel", &cnn::CentroidAttentionOptions::conv_kernel)
      .def_rw("conv_stride", &cnn::CentroidAttentionOptions::conv_stride)
      .def_rw("conv_padding", &cnn::CentroidAttentionOptions::conv_padding);
  nb::class_<cnn::CentroidAttention, cnn::Module> ca(
      nn, "CentroidAttention", "N inputs -> M centroids by T steps of eq. 4 (Centroid Transformers).");
  ca.def("__init__", init_with_generator<cnn::CentroidAttention, const cnn::CentroidAttentionOptions&>(), nb::arg("options"),
         generator_arg());
  def_forward(ca,
              [](cnn::CentroidAttention& a, const Tensor& x, const Tensor& u0, std::optional<Tensor> kpm,
                 std::optional<Tensor> cm) { return a.forward(x, u0, opt(kpm), opt(cm)); },
              "x (B, N, D), initial centroids u0 (B, M, D) -> (B, M, D).", nb::arg("x"), nb::arg("u0"),
              nb::arg("key_padding_mask") = nb::none(), nb::arg("centroid_mask") = nb::none());
  nb::class_<cnn::CentroidAttentionBlock, cnn::Module> cab(
      nn, "CentroidAttentionBlock", "Centroid initialisation, centroid attention and a feed-forward block.");
  cab.def("__init__", init_with_generator<cnn::CentroidAttentionBlock, const cnn::CentroidAttentionOptions&, int64_t, const std::string&, double>(),
          nb::arg("options"), nb::arg("d_ff"), nb::arg("activation") = "relu", nb::arg("dropout") = 0.0,
          generator_arg(),
          nb::keep_alive<1, 6>());
  def_forward(cab,
              [](cnn::CentroidAttentionBlock& b, const Tensor& x, std::optional<Tensor> kpm,
                 std::optional<Tensor> sample_space, cf::Generator* sampler) {
                cnn::CentroidBlockOutput o = b.forward(x, opt(kpm), opt(sample_space), sampler);
                // the parts an initialisation does not make are None, as a Linear without bias (they were
                // undefined tensors: even repr() raised)
                auto maybe = [](const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
                return std::make_tuple(o.u, maybe(o.mask), maybe(o.indices), maybe(o.positions));
              },
              "x (B, N, D) -> (centroids (B, M, D), mask, indices, positions); the parts this initialisation does "
              "not make are None.",
              nb::arg("x"), nb::arg("key_padding_mask") = nb::none(), nb::arg("sample_space") = nb::none(),
              nb::arg("sampler").none() = nb::none());
  nn.def("knn_indices",
         [](const Tensor& q, const Tensor& x, int64_t k, std::optional<Tensor> m) { return cnn::knn_indices(q, x, k, opt(m)); },
         nb::arg("queries"), nb::arg("inputs"), nb::arg("k"), nb::arg("mask").none() = nb::none(),
         release_gil(), "Indices int64 (B, M, k) of each query's k nearest inputs.");

  // ---- neural clustering (ClusterFormer eqs. 2-6, 11) as functions ----
  nn.def("neural_clustering",
         [](const Tensor& x, const Tensor& c, const Tensor& w_c, std::optional<Tensor> kpm) {
           cnn::NeuralClusteringResult r = cnn::neural_clustering(x, c, w_c, opt(kpm));
           return std::make_tuple(r.u, r.c_hat, r.index, r.order);
         },
         nb::arg("x"), nb::arg("c"), nb::arg("w_c"), nb::arg("key_padding_mask") = nb::none(), release_gil(),
         "Eqs. 2-5: (U (B, k, N), C^ (B, k, D), cluster index (B, N), sort order (B, N)).");
  nn.def("clustering_loss",
         [](const Tensor& x, const Tensor& c_hat, const Tensor& index, std::optional<Tensor> kpm, const std::string& form) {
           return cnn::clustering_loss(x, c_hat, index, opt(kpm), cnn::cluster_loss_form_from_string(form, "clustering_loss"));
         },
         nb::arg("x"), nb::arg("c_hat"), nb::arg("index"), nb::arg("key_padding_mask").none() = nb::none(),
         nb::arg("form") = "inner", release_gil(),
         "L1 of eq. 6; form: \"inner\" (the paper's phi), \"cosine\" or \"sphere\" (the bounded forms).");
  nn.def("centroid_sorting_loss",
         [](const Tensor& c_hat, const std::string& form) {
           return cnn::centroid_sorting_loss(c_hat, cnn::cluster_loss_form_from_string(form, "centroid_sorting_loss"));
         },
         nb::arg("c_hat"), nb::arg("form") = "inner", release_gil(),
         "L2 of eq. 11; form: \"inner\", or \"cosine\"/\"sphere\" (both the cosine between centroids).");

  // ---------------------------------------------------------------- losses
  nn.def("cross_entropy",
         [](const Tensor& logits, const Tensor& targets, int64_t ignore_index, double label_smoothing,
            std::optional<Tensor> weight, const std::string& reduction) {
           cnn::CrossEntropyLossOptions o;
           o.ignore_index = ignore_index;
           o.label_smoothing = label_smoothing;
           o.weight = opt(weight);
           o.reduction = parse_reduction(reduction, "cross_entropy");
           return cnn::cross_entropy(logits, targets, o);
         },
         nb::arg("logits"), nb::arg("targets"), nb::arg("ignore_index") = -100, nb::arg("label_smoothing") = 0.0,
         nb::arg("weight") = nb::none(), nb::arg("reduction") = "mean", release_gil(),
         "PyTorch's F.cross_entropy: ignore_index, label smoothing, class weights; class axis 1.");
  nn.def("binary_cross_entropy_with_logits",
         [](const Tensor& logits, const Tensor& targets, std::optional<Tensor> pos_weight, std::optional<Tensor> weight,
            const std::string& reduction) {
           cnn::BCEWithLogitsOptions o;
           o.pos_weight = opt(pos_weight);
           o.weight = opt(weight);
           o.reduction = parse_reduction(reduction, "binary_cross_entropy_with_logits");
           return cnn::binary_cross_entropy_with_logits(logits, targets, o);
         },
         nb::arg("logits"), nb::arg("targets"), nb::arg("pos_weight") = nb::none(), nb::arg("weight") = nb::none(),
         nb::arg("reduction") = "mean", release_gil(), "Stable BCE on logits, PyTorch's semantics.");
  nn.def("mse_loss",
         [](const Tensor& a, const Tensor& b, const std::string& r) {
           return cnn::mse_loss(a, b, parse_reduction(r, "mse_loss"));
         },
         nb::arg("a"), nb::arg("b"), nb::arg("reduction") = "mean", release_gil(), "(a - b)^2, reduced.");
  nn.def("chamfer_distance",
         [](const Tensor& a, const Tensor& b, const std::string& r) {
           return cnn::chamfer_distance(a, b, parse_reduction(r, "chamfer_distance"));
         },
         nb::arg("a"), nb::arg("b"), nb::arg("reduction") = "mean", release_gil(),
         "Chamfer distance of point sets (B, N, D) and (B, M, D), squared Euclidean.");

  // ---------------------------------------------------------------- optimizers
  // A list of dicts {"params": ..., "lr" or "lr_scale": ..., "weight_decay": ...} is a list of groups, as
  // torch.optim takes them ("lr": the group's own rate, kept as lr_scale = lr / the optimizer's lr, so
  // schedules scale every group alike). With several groups, a group's unnamed tensors are named
  // "<group>.<position>".
  auto groups = [](nb::handle given, double lr, const char* op) {
    std::vector<cnn::ParamGroup> out;
    nb::object listed = iterable_as_list(given, op);  // a generator or filter(...) of tensors or of group dicts
    nb::handle params = listed.is_valid() ? nb::handle(listed) : given;
    const bool list = PyList_Check(params.ptr()) || PyTuple_Check(params.ptr());
    bool any_dict = false;
    if (list)
      for (nb::handle g : params) any_dict = any_dict || PyDict_Check(g.ptr());
    if (!any_dict) return cnn::single_group(to_state_dict(params, op));
    // positional names get the group's number only when there are several groups (one group's names,
    // and so the keys of checkpoints saved with it, stay "0", "1", ...)
    const bool several = nb::len(params) > 1;
    int64_t i = 0;
    for (nb::handle g : params) {
      if (!PyDict_Check(g.ptr()))
        throw nb::type_error(cf::str("[", op, "] a list of parameter groups holds dicts {\"params\": ...} only; "
                                     "group ", i, " is a ", nb::type_name(g.type()).c_str())
                                 .c_str());
      nb::dict d = nb::borrow<nb::dict>(g);
      for (auto [k, v] : d) {
        const std::string key = nb::isinstance<nb::str>(k) ? nb::cast<std::string>(k) : std::string("?");
        CF_CHECK(key == "params" || key == "lr" || key == "lr_scale" || key == "weight_decay", ValueError, "[", op,
                 "] parameter group ", i, ": unknown key '", key, "' (known: params, lr, lr_scale, weight_decay)");
      }
      CF_CHECK(d.contains("params"), ValueError, "[", op, "] parameter group ", i, " has no \"params\"");
      auto number = [&](const char* key) {
        nb::handle v = d[key];
        if (!PyFloat_Check(v.ptr()) && !PyLong_Check(v.ptr()))
          throw nb::type_error(cf::str("[", op, "] parameter group ", i, ": '", key, "' must be a number, got a ",
                                       nb::type_name(v.type()).c_str())
                                   .c_str());
        return nb::cast<double>(v);
      };
      cnn::ParamGroup pg;
      pg.params = to_state_dict(d["params"], op, several ? std::to_string(i) + "." : std::string());
      CF_CHECK(!(d.contains("lr") && d.contains("lr_scale")), ValueError, "[", op, "] parameter group ", i,
               " gives both lr and lr_scale");
      if (d.contains("lr")) {
        CF_CHECK(lr > 0, ValueError, "[", op, "] parameter group ", i,
                 " gives an lr, which is kept relative to the optimizer's lr, and that is ", lr);
        pg.lr_scale = number("lr") / lr;
      }
      if (d.contains("lr_scale")) pg.lr_scale = number("lr_scale");
      if (d.contains("weight_decay")) pg.weight_decay = number("weight_decay");
      out.push_back(std::move(pg));
      ++i;
    }
    return out;
  };
  nb::class_<cnn::Optimizer>(nn, "Optimizer", nb::is_weak_referenceable(),  // (lr_scheduler's initial lrs)
                             "Base of SGD, Adam, AdamW: step(), zero_grad(), lr, and a strict state dict keyed by "
                             "parameter name (a checkpoint resumes bit-identically).")
      .def("step", &cnn::Optimizer::step, release_gil(), "One update of every parameter that has a gradient.")
      .def("zero_grad",
           [](cnn::Optimizer& opt, bool set_to_none) {
             if (set_to_none) return opt.zero_grad();
             std::vector<Tensor> params;
             for (const cnn::ParamGroup& g : opt.param_groups())
               for (const auto& [name, p] : g.params) params.push_back(p);
             zero_grads(params, false);
           },
           nb::arg("set_to_none") = true,
           "Drop every parameter's gradient (set_to_none=False: fill the existing ones with zeros instead).")
      .def_prop_rw("lr", &cnn::Optimizer::lr, &cnn::Optimizer::set_lr)
      .def_prop_ro("step_count", &cnn::Optimizer::step_count)
      .def_prop_ro("weight_decay", &cnn::Optimizer::weight_decay,
                   "The weight decay of the parameter groups that set none of their own.")
      .def_prop_ro("param_groups",
                   [](cnn::Optimizer& o) {
                     return nb::module_::import_("cf._param_groups").attr("param_groups")(nb::find(&o));
                   },
                   nb::sig("def param_groups(self) -> list[cf.nn.ParamGroup]"),
                   "torch.optim's param_groups: one live cf.nn.ParamGroup view per group, read and written as a dict "
                   "(\"params\", \"lr\", \"lr_scale\", \"weight_decay\").")
      // for param_groups (cf/_param_groups.py): group i's tensors, lr_scale and weight decay
      .def("_group_count", [](const cnn::Optimizer& o) { return o.param_groups().size(); })
      .def("_group_params",
           [](const cnn::Optimizer& o, size_t i) {
             CF_CHECK(i < o.param_groups().size(), IndexError, "[", o.name(), ".param_groups] group ", i,
                      " does not exist (", o.param_groups().size(), " groups)");
             std::vector<Tensor> out;
             for (const auto& [name, p] : o.param_groups()[i].params) out.push_back(p);
             return out;
           })
      .def("_group_lr_scale", [](const cnn::Optimizer& o, size_t i) { return o.param_groups().at(i).lr_scale; })
      .def("_group_weight_decay",
           [](const cnn::Optimizer& o, size_t i) { return o.param_groups().at(i).weight_decay; })
      .def("_set_group_lr_scale", &cnn::Optimizer::set_group_lr_scale)
      .def("_set_group_weight_decay", &cnn::Optimizer::set_group_weight_decay, nb::arg("group"),
           nb::arg("weight_decay").none())
      .def_prop_ro("name", &cnn::Optimizer::name)
      .def("state_dict", [](const cnn::Optimizer& o) { return state_dict_to_python(o.state_dict()); })
      .def("load_state_dict",
           [](cnn::Optimizer& o, nb::handle d) { o.load_state_dict(to_state_dict(d, "Optimizer.load_state_dict")); },
           nb::arg("state_dict"));
  nb::class_<cnn::SGD, cnn::Optimizer>(nn, "SGD", "torch.optim.SGD's update: momentum, dampening, Nesterov, L2 decay.")
      .def("__init__",
           [groups](cnn::SGD* self, nb::handle params, double lr, double momentum, double dampening, bool nesterov,
                    double weight_decay) {
             cnn::SGDOptions o{lr, momentum, dampening, nesterov, weight_decay};
             new (self) cnn::SGD(groups(params, lr, "SGD"), o);
           },
           nb::arg("params"), nb::arg("lr") = 1e-2, nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0,
           nb::arg("nesterov") = false, nb::arg("weight_decay") = 0.0,
           "params: a Module, named parameters, a dict, tensors, or a list of group dicts "
           "{\"params\", \"lr\" or \"lr_scale\", \"weight_decay\"}.");
  // beta1 and beta2 (default 0.9 and 0.999), or PyTorch's betas=(beta1, beta2)
  using Betas = std::optional<std::pair<double, double>>;
  auto betas_of = [](std::optional<double> b1, std::optional<double> b2, const Betas& betas, const char* op) {
    CF_CHECK(!betas || (!b1 && !b2), ValueError, "[", op, "] give betas=(beta1, beta2) or beta1/beta2, not both");
    return betas ? *betas : std::make_pair(b1.value_or(0.9), b2.value_or(0.999));
  };
  nb::class_<cnn::Adam, cnn::Optimizer>(nn, "Adam", "torch.optim.Adam's update (L2 decay into the gradient).")
      .def("__init__",
           [groups, betas_of](cnn::Adam* self, nb::handle params, double lr, std::optional<double> beta1,
                              std::optional<double> beta2, double eps, double wd, const Betas& betas) {
             const auto [b1, b2] = betas_of(beta1, beta2, betas, "Adam");
             cnn::AdamOptions o{lr, b1, b2, eps, wd};
             new (self) cnn::Adam(groups(params, lr, "Adam"), o);
           },
           nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("beta1") = nb::none(), nb::arg("beta2") = nb::none(),
           nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.0, nb::arg("betas") = nb::none(),
           "beta1 = 0.9 and beta2 = 0.999 unless given (or PyTorch's betas=(beta1, beta2)).");
  nb::class_<cnn::AdamW, cnn::Adam>(nn, "AdamW", "torch.optim.AdamW's update (decoupled weight decay, default 1e-2).")
      .def("__init__",
           [groups, betas_of](cnn::AdamW* self, nb::handle params, double lr, std::optional<double> beta1,
                              std::optional<double> beta2, double eps, double wd, const Betas& betas) {
             cnn::AdamWOptions o;
             o.lr = lr;
             std::tie(o.beta1, o.beta2) = betas_of(beta1, beta2, betas, "AdamW");
             o.eps = eps;
             o.weight_decay = wd;
             new (self) cnn::AdamW(groups(params, lr, "AdamW"), o);
           },
           nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("beta1") = nb::none(), nb::arg("beta2") = nb::none(),
           nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 1e-2, nb::arg("betas") = nb::none(),
           "beta1 = 0.9 and beta2 = 0.999 unless given (or PyTorch's betas=(beta1, beta2)).");

  nb::class_<cnn::LRSchedule>(nn, "LRSchedule",
                              "step -> learning rate; step is the 1-based number of the update about to be applied.")
      .def("lr_at", &cnn::LRSchedule::lr_at, nb::arg("step"))
      .def("multiplier", &cnn::LRSchedule::multiplier, nb::arg("step"))
      .def_prop_ro("base_lr", &cnn::LRSchedule::base_lr)
      .def("apply", &cnn::LRSchedule::apply, nb::arg("optimizer"),
           "Set the optimizer's lr for its next step (lr_at(step_count + 1)); returns it.");
  nb::class_<cnn::ConstantLR, cnn::LRSchedule>(nn, "ConstantLR").def(nb::init<double>(), nb::arg("lr"));
  nb::class_<cnn::InverseSqrtLR, cnn::LRSchedule>(nn, "InverseSqrtLR",
                                                  "lr * min(step / warmup, sqrt(warmup / step)).")
      .def(nb::init<double, int64_t>(), nb::arg("lr"), nb::arg("warmup"));
  nb::class_<cnn::WarmupCosineLR, cnn::LRSchedule>(nn, "WarmupCosineLR", "Linear warmup, then cosine decay to min_lr.")
      .def(nb::init<double, int64_t, int64_t, double>(), nb::arg("lr"), nb::arg("warmup"), nb::arg("total"),
           nb::arg("min_lr") = 0.0);
  nb::class_<cnn::StepLR, cnn::LRSchedule>(nn, "StepLR", "lr * gamma^floor((step - 1) / step_size).")
      .def(nb::init<double, int64_t, double>(), nb::arg("lr"), nb::arg("step_size"), nb::arg("gamma") = 0.1);

  nb::class_<cnn::GradScaler>(nn, "GradScaler",
                              "Dynamic loss scaling for float16 training (torch.amp.GradScaler): scale(loss)."
                              "backward(), step(opt) (unscale, skip on inf/NaN), update() (back off or grow).")
      .def("__init__",
           [](cnn::GradScaler* self, double init_scale, double growth_factor, double backoff_factor,
              int64_t growth_interval, bool enabled) {
             cnn::GradScalerOptions o;
             o.init_scale = init_scale;
             o.growth_factor = growth_factor;
             o.backoff_factor = backoff_factor;
             o.growth_interval = growth_interval;
             o.enabled = enabled;
             new (self) cnn::GradScaler(o);
           },
           nb::arg("init_scale") = 65536.0, nb::arg("growth_factor") = 2.0, nb::arg("backoff_factor") = 0.5,
           nb::arg("growth_interval") = 2000, nb::arg("enabled") = true)
      .def("scale", &cnn::GradScaler::scale, nb::arg("loss"), "loss * scale (differentiable).")
      .def("unscale_", &cnn::GradScaler::unscale_, nb::arg("optimizer"),
           "Divide the optimizer's gradients by the scale in place (before clipping); at most once per optimizer "
           "per update().")
      .def("step", &cnn::GradScaler::step, nb::arg("optimizer"), release_gil(),
           "optimizer.step() unless its unscaled gradients hold an inf/NaN; True when it stepped. Once per "
           "optimizer per update(); several optimizers are each unscaled and checked on their own.")
      .def("update", &cnn::GradScaler::update, "Back off after an overflow, or grow after growth_interval clean steps.")
      .def("get_scale", &cnn::GradScaler::get_scale, "The current loss scale (1.0 when disabled).")
      .def_prop_ro("growth_tracker", &cnn::GradScaler::growth_tracker)
      .def_prop_ro("found_inf", &cnn::GradScaler::found_inf,
                   "Whether an optimizer unscaled since the last update() had an inf/NaN gradient.")
      .def_prop_ro("enabled", &cnn::GradScaler::enabled)
      .def("state_dict", [](const cnn::GradScaler& s) { return state_dict_to_python(s.state_dict()); },
           "{'scale', 'growth_factor', 'backoff_factor': float64 tensors, 'growth_tracker', 'growth_interval': "
           "int64 tensors}: torch.amp.GradScaler's entries (its '_growth_tracker' named 'growth_tracker') as "
           "0-d tensors.")
      .def("load_state_dict",
           [](cnn::GradScaler& s, nb::handle d) { s.load_state_dict(to_state_dict(d, "GradScaler.load_state_dict")); },
           nb::arg("state_dict"), "Strict: 'scale' (finite, > 0), 'growth_tracker' (integer >= 0), and where present "
           "'growth_factor' (> 1), 'backoff_factor' (in (0, 1)), 'growth_interval' (> 0); nothing else.")
      // pickle, copy.deepcopy: the state dict and whether it is enabled, between steps only (a copy made
      // after unscale_ would unscale again: PyTorch refuses it too)
      // A Python subclass's own attributes (its instance __dict__) travel too, as pickle keeps them for any
      // class; a 2-tuple (pickled before they did) still loads.
      .def("__getstate__",
           [](nb::handle self) {
             const cnn::GradScaler& s = nb::cast<const cnn::GradScaler&>(self);
             CF_CHECK(!s.step_in_progress(), ValueError, "[GradScaler] can be pickled or copied between steps only "
                      "(before unscale_ or step, or after update()), as PyTorch's");
             nb::object attributes = nb::getattr(self, "__dict__", nb::none());
             return nb::make_tuple(state_dict_to_python(s.state_dict()), s.enabled(), attributes);
           })
      .def("__setstate__",
           [](cnn::GradScaler* self, const nb::tuple& state) {
             CF_CHECK(state.size() == 2 || state.size() == 3, ValueError,
                      "[GradScaler.__setstate__] expected (state_dict, enabled[, attributes]), got ", state.size(),
                      " items");
             cnn::GradScalerOptions o;
             o.enabled = nb::cast<bool>(state[1]);
             new (self) cnn::GradScaler(o);
             self->load_state_dict(to_state_dict(state[0], "GradScaler.__setstate__"));
             if (state.size() == 3 && !state[2].is_none()) {
               nb::handle py = nb::find(self);
               if (py.is_valid() && nb::hasattr(py, "__dict__")) py.attr("__dict__").attr("update")(state[2]);
             }
           });

  auto tensors_of = [](nb::handle params, const char* op) {
    std::vector<Tensor> out;
    if (nb::isinstance<Tensor>(params)) {  // one tensor, as PyTorch's clip_grad_norm_ takes (not a state dict)
      out.push_back(nb::cast<Tensor>(params));
      return out;
    }
    for (auto& [k, v] : to_state_dict(params, op)) out.push_back(v);
    return out;
  };
  nn.def("grad_norm", [tensors_of](nb::handle p, double norm_type) {
           return cnn::grad_norm(tensors_of(p, "grad_norm"), norm_type);
         },
         nb::arg("params"), nb::arg("norm_type") = 2.0,
         "Global norm of the gradients taken as one vector (parameters without one are skipped): L2 by default, "
         "another p > 0, or inf (the largest magnitude).");
  nn.def("clip_grad_norm",
         [tensors_of](nb::handle p, double max_norm, bool err, double norm_type) {
           return cnn::clip_grad_norm(tensors_of(p, "clip_grad_norm"), max_norm, err, norm_type);
         },
         nb::arg("params"), nb::arg("max_norm"), nb::arg("error_if_nonfinite") = false, nb::arg("norm_type") = 2.0,
         "Scale gradients by max_norm / (norm + 1e-6) when below 1 (PyTorch's rule; the norm of norm_type, as "
         "grad_norm); returns the norm before. Unlike PyTorch: a non-finite norm (an inf/NaN gradient) leaves the "
         "gradients unchanged and is returned, so the step can be skipped (error_if_nonfinite raises instead), and "
         "max_norm must be > 0 (inf: measure only).");
  // PyTorch's name (torch.nn.utils.clip_grad_norm_: it changes the gradients in place)
  nn.def("clip_grad_norm_",
         [tensors_of](nb::handle p, double max_norm, bool err, double norm_type) {
           return cnn::clip_grad_norm(tensors_of(p, "clip_grad_norm_"), max_norm, err, norm_type);
         },
         nb::arg("params"), nb::arg("max_norm"), nb::arg("error_if_nonfinite") = false, nb::arg("norm_type") = 2.0,
         "clip_grad_norm under PyTorch's name (torch.nn.utils.clip_grad_norm_).");
  nn.def("grad_norm_tensor", [tensors_of](nb::handle p, double norm_type) {
           return cnn::grad_norm_tensor(tensors_of(p, "grad_norm_tensor"), norm_type);
         },
         nb::arg("params"), nb::arg("norm_type") = 2.0,
         "grad_norm as a 0-d float64 tensor on the gradients' device, without a host read (a CUDA step, or one a "
         "cuda.Graph captures).");
  nn.def("clip_grad_norm_tensor",
         [tensors_of](nb::handle p, double max_norm, double norm_type) {
           return cnn::clip_grad_norm_tensor(tensors_of(p, "clip_grad_norm_tensor"), max_norm, norm_type);
         },
         nb::arg("params"), nb::arg("max_norm"), nb::arg("norm_type") = 2.0,
         "clip_grad_norm without a host read: the factor applied on the device (1 for a non-finite norm), the norm "
         "returned as a 0-d float64 tensor (PyTorch's clip_grad_norm_ returns a tensor likewise).");
  nn.def("scale_grads", [tensors_of](nb::handle p, double f) { cnn::scale_grads(tensors_of(p, "scale_grads"), f); },
         nb::arg("params"), nb::arg("factor"), "Multiply every gradient by factor (gradient accumulation).");

  // ---------------------------------------------------------------- init
  nb::module_ init = nn.def_submodule("init", "Seeded initialisers; each overwrites a tensor in place (no grad) and returns it.");
  init.def("zeros_", [](Tensor& t) -> Tensor& { cnn::init::zeros_(t); return t; }, nb::arg("t"), nb::rv_policy::reference, "Fill with 0.");
  init.def("ones_", [](Tensor& t) -> Tensor& { cnn::init::ones_(t); return t; }, nb::arg("t"), nb::rv_policy::reference, "Fill with 1.");
  init.def("constant_", [](Tensor& t, double v) -> Tensor& { cnn::init::constant_(t, v); return t; }, nb::arg("t"), nb::arg("value"),
           nb::rv_policy::reference, "Fill with value.");
  init.def("uniform_", [](Tensor& t, double a, double b, cf::Generator* g) -> Tensor& { cnn::init::uniform_(t, a, b, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("low"), nb::arg("high"), generator_arg(), nb::rv_policy::reference, "U(low, high) from the generator.");
  init.def("normal_", [](Tensor& t, double a, double b, cf::Generator* g) -> Tensor& { cnn::init::normal_(t, a, b, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("mean") = 0.0, nb::arg("std") = 1.0, generator_arg(), nb::rv_policy::reference, "N(mean, std^2) from the generator.");
  init.def("xavier_uniform_", [](Tensor& t, double gain, cf::Generator* g) -> Tensor& { cnn::init::xavier_uniform_(t, gain, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("gain") = 1.0, generator_arg(), nb::rv_policy::reference, "Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).");
  init.def("xavier_normal_", [](Tensor& t, double gain, cf::Generator* g) -> Tensor& { cnn::init::xavier_normal_(t, gain, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("gain") = 1.0, generator_arg(), nb::rv_policy::reference, "Glorot normal: std = gain * sqrt(2 / (fan_in + fan_out)).");
  init.def("kaiming_uniform_", [](Tensor& t, double a, cf::Generator* g) -> Tensor& { cnn::init::kaiming_uniform_(t, a, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("a") = 0.0, generator_arg(), nb::rv_policy::reference, "He uniform, fan_in mode, gain sqrt(2 / (1 + a^2)) (leaky ReLU slope a).");
  init.def("kaiming_normal_", [](Tensor& t, double a, cf::Generator* g) -> Tensor& { cnn::init::kaiming_normal_(t, a, gen_or_default(g)); return t; },
           nb::arg("t"), nb::arg("a") = 0.0, generator_arg(), nb::rv_policy::reference, "He normal, fan_in mode, gain sqrt(2 / (1 + a^2)).");

  // ---------------------------------------------------------------- files
  m.def("save_safetensors",
        [](const FsPath& path, nb::handle tensors, nb::handle metadata) {
          cnn::StateDict d = module_state_or_dict(tensors, "save_safetensors");
          std::map<std::string, std::string> meta;
          if (!metadata.is_none()) {
            // read here, each entry named: a str that is not valid UTF-8 (a lone surrogate from a file name)
            // or a value that is no str failed as nanobind's bare "incompatible function arguments"
            if (!PyDict_Check(metadata.ptr()))
              throw nb::type_error(cf::str("[save_safetensors] metadata must be a dict of str to str, got ",
                                           nb::type_name(metadata.type()).c_str()).c_str());
            auto utf8 = [](nb::handle h, const std::string& what) {
              if (!PyUnicode_Check(h.ptr()))
                throw nb::type_error(cf::str("[save_safetensors] metadata ", what, " must be a str, got ",
                                             nb::type_name(h.type()).c_str()).c_str());
              Py_ssize_t n = 0;
              const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
              if (!s) {
                PyErr_Clear();
                throw cf::ValueError(cf::str("[save_safetensors] metadata ", what,
                                             " is not valid UTF-8 (a lone surrogate?); safetensors headers are JSON"));
              }
              return std::string(s, size_t(n));
            };
            for (auto [k, v] : nb::borrow<nb::dict>(metadata)) {
              const std::string key = utf8(k, "key");
              meta[key] = utf8(v, "value of '" + key + "'");
            }
          }
          nb::gil_scoped_release g;
          cf::save_safetensors(path.string(), d, meta);
        },
        nb::arg("path"), nb::arg("tensors"), nb::arg("metadata") = nb::none(),
        "Write tensors (dict, (name, tensor) pairs, or a module: its state_dict(); CPU) and string metadata as a safetensors file, atomically.");
  m.def("load_safetensors",
        [](const FsPath& path) {
          cf::SafetensorsFile f;
          {
            nb::gil_scoped_release g;
            f = cf::load_safetensors(path.string());
          }
          return std::make_pair(state_dict_to_python(f.tensors), f.metadata);
        },
        nb::arg("path"), "(tensors dict, metadata dict) of a safetensors file; corrupt files are cf.IOError naming the file.");
  nb::class_<cnn::TrainingCheckpoint>(nn, "TrainingCheckpoint",
                                      "Model and optimizer state, step, generator states and extra strings.")
      .def_prop_ro("model", [](const cnn::TrainingCheckpoint& c) { return state_dict_to_python(c.model); })
      .def_prop_ro("optimizer", [](const cnn::TrainingCheckpoint& c) { return state_dict_to_python(c.optimizer); })
      .def_prop_ro("scaler", [](const cnn::TrainingCheckpoint& c) { return state_dict_to_python(c.scaler); },
                   "The GradScaler's state ({} when none was saved): scaler.load_state_dict(ckpt.scaler).")
      .def_ro("step", &cnn::TrainingCheckpoint::step)
      .def_prop_ro("generators", [](const cnn::TrainingCheckpoint& c) {
        nb::dict d;
        for (auto& [name, s] : c.generators) d[nb::str(name.data(), name.size())] = nb::make_tuple(s.seed, s.offset);
        return d;
      }, "name -> (seed, offset).")
      .def_ro("extra", &cnn::TrainingCheckpoint::extra)
      .def("restore_generator", [](const cnn::TrainingCheckpoint& c, const std::string& name, cf::Generator& g) {
        for (auto& [n, s] : c.generators)
          if (n == name) return s.restore(g);
        throw cf::ValueError(cf::str("[load_checkpoint] no generator named '", name, "' in the checkpoint"));
      }, nb::arg("name"), nb::arg("generator"));
  nn.def("save_checkpoint",
         [](const FsPath& path, nb::handle model, nb::handle optimizer, int64_t step, nb::handle generators,
            std::optional<std::map<std::string, std::string>> extra, nb::handle scaler) {
           cnn::TrainingCheckpoint c;
           // each argument its kind: a Module given as the optimizer saved its parameters where the
           // optimizer's state belongs, and loading them into an optimizer failed only later
           if (nb::isinstance<cnn::Optimizer>(model))
             throw nb::type_error("[save_checkpoint] model is a cf.nn optimizer; pass it as optimizer=");
           if (nb::isinstance<cnn::Module>(optimizer))
             throw nb::type_error("[save_checkpoint] optimizer is a cf.nn.Module; pass it as model=, and the "
                                  "optimizer (or its state_dict()) as optimizer=");
           if (!model.is_none())
             c.model = module_state_or_dict(model, "save_checkpoint");
           if (!optimizer.is_none())
             c.optimizer = nb::isinstance<cnn::Optimizer>(optimizer) ? nb::cast<cnn::Optimizer&>(optimizer).state_dict()
                                                                     : to_state_dict(optimizer, "save_checkpoint");
           c.step = step;
           if (!generators.is_none() && !PyDict_Check(generators.ptr()))
             throw nb::type_error(cf::str("[save_checkpoint] generators must be a dict name -> cf.Generator, got a ",
                                          nb::type_name(generators.type()).c_str())
                                      .c_str());
           if (!generators.is_none())
             for (auto [k, v] : nb::borrow<nb::dict>(generators)) {
               if (!nb::isinstance<nb::str>(k) || !nb::isinstance<cf::Generator>(v))
                 throw nb::type_error(cf::str("[save_checkpoint] generators maps names (str) to cf.Generator, got ",
                                              nb::type_name(k.type()).c_str(), " -> ", nb::type_name(v.type()).c_str())
                                          .c_str());
               c.generators.emplace_back(nb::cast<std::string>(k), cnn::GeneratorState::of(nb::cast<cf::Generator&>(v)));
             }
           if (extra) c.extra = *extra;
           // the dynamic loss scale of a float16 run: without it a resume restarted at the initial scale
           // (the C++ TrainingCheckpoint always had the slot; Python could not fill or read it)
           if (!scaler.is_none())
             c.scaler = nb::isinstance<cnn::GradScaler>(scaler) ? nb::cast<cnn::GradScaler&>(scaler).state_dict()
                                                               : to_state_dict(scaler, "save_checkpoint");
           nb::gil_scoped_release g;
           cnn::save_checkpoint(path.string(), c);
         },
         nb::arg("path"), nb::arg("model") = nb::none(), nb::arg("optimizer") = nb::none(), nb::arg("step") = 0,
         nb::arg("generators") = nb::none(), nb::arg("extra") = nb::none(), nb::arg("scaler") = nb::none(),
         "Write a training checkpoint (one safetensors file, atomically). model/optimizer/scaler: a Module / "
         "Optimizer / GradScaler or a state dict; generators: name -> cf.Generator; extra: str -> str.");
  nn.def("load_checkpoint",
         [](const FsPath& path) {
           nb::gil_scoped_release g;
           return cnn::load_checkpoint(path.string());
         },
         nb::arg("path"), "Read a checkpoint written by save_checkpoint (errors name the file and the problem).");

  // ---------------------------------------------------------------- configs
  nn.def("load_json_file", [](const FsPath& path) { return from_json(cnn::load_json_file(path.string())); }, nb::arg("path"),
         "Parse a JSON file (comments allowed); errors name the file, line and column.");
  nb::class_<cnn::Config>(nn, "Config",
                          "Checked configuration over a JSON object: get/require read keys with type checks, "
                          "finish() refuses keys that were never read (a misspelt key is an error).")
      .def("__init__",
           [](cnn::Config* self, nb::handle json, const std::string& name, const std::string& source) {
             new (self) cnn::Config(to_json(json, "config"), name, source);
           },
           nb::arg("json"), nb::arg("name") = "", nb::arg("source") = "")
      .def_static("from_file", [](const FsPath& path, const std::string& name) { return cnn::Config::from_file(path.string(), name); },
                  nb::arg("path"), nb::arg("name") = "")
      .def("has", &cnn::Config::has, nb::arg("key"))
      .def("get",
           [](const cnn::Config& c, const std::string& key, nb::handle def) -> nb::object {
             if (PyBool_Check(def.ptr())) return nb::bool_(c.get<bool>(key, def.ptr() == Py_True));
             if (PyLong_Check(def.ptr())) {
               int64_t d = 0;
               if (!nb::try_cast(def, d))
                 throw cf::ValueError(cf::str("[config] get(\"", key, "\"): the default ",
                                              nb::str(def).c_str(), " is outside int64"));
               return nb::int_(c.get<int64_t>(key, d));
             }
             if (PyFloat_Check(def.ptr())) return nb::float_(c.get<double>(key, nb::cast<double>(def)));
             if (PyUnicode_Check(def.ptr())) {
               const std::string v = c.get<std::string>(key, nb::cast<std::string>(def));
               return nb::str(v.data(), v.size());
             }
             throw cf::ValueError("[config] get() takes a bool, int, float or str default (its type is the key's type)");
           },
           nb::arg("key"), nb::arg("default"),
           "The value of key with the type of default (bool, int, float, str), or default when absent.")
      .def("require",
           [](const cnn::Config& c, const std::string& key, nb::handle type) -> nb::object {
             if (type.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return nb::bool_(c.require<bool>(key));
             if (type.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return nb::int_(c.require<int64_t>(key));
             if (type.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return nb::float_(c.require<double>(key));
             if (type.ptr() == reinterpret_cast<PyObject*>(&PyUnicode_Type))
             {
               const std::string v = c.require<std::string>(key);
               return nb::str(v.data(), v.size());
             }
             throw cf::ValueError("[config] require() takes the type bool, int, float or str");
           },
           nb::arg("key"), nb::arg("type"), "The value of key as type; an error when absent.")
      .def("child", &cnn::Config::child, nb::arg("key"))
      .def("optional_child", &cnn::Config::optional_child, nb::arg("key"))
      .def("keys", &cnn::Config::keys)
      .def("path_of", &cnn::Config::path_of, nb::arg("key"))
      .def("raw", [](const cnn::Config& c) { return from_json(c.raw()); })
      .def("finish", &cnn::Config::finish, "cf.ValueError listing every key present but never read.");
}

}  // namespace cfpy
