// Modules written in Python (python_module.h): cf.nn.Parameter, the constructors of cf.nn.Module and
// cf.nn.UnaryModule, and the attribute rules that register what a Python module's code assigns, as
// torch.nn.Module's do: `self.fc = cf.nn.Linear(...)` a submodule, `self.w = cf.nn.Parameter(t)` a
// parameter, `self.register_buffer("b", t)` a buffer; every other value stays a plain attribute.
#include "python_module.h"

#include <algorithm>
#include <optional>
#include <typeinfo>

namespace cfpy {

using cf::Tensor;
namespace cnn = cf::nn;

namespace {

// cf.nn.Parameter: marks a tensor to be registered as a parameter by the module attribute it is assigned to.
struct ParameterMarker {
  Tensor data;
  bool requires_grad = true;
};

std::string type_name_of(nb::handle h) { return user_type_name(h); }

// The Python-module side of self: null for a C++ module (cf.nn.Linear, a model, a Python subclass of one) and
// for an instance whose __init__ has not run yet.
PythonModule* python_module(nb::handle self) {
  if (!nb::inst_ready(self)) return nullptr;
  return dynamic_cast<PythonModule*>(&nb::cast<cnn::Module&>(self));
}

// The Python module that may register `what` under `name`, or a clear error.
PythonModule& registering_module(nb::handle self, const std::string& name, const char* what) {
  if (!nb::inst_ready(self))
    throw nb::attribute_error(cf::str("[Module] cannot register ", what, " '", name, "' before cf.nn.Module.__init__() "
                                      "ran: call super().__init__() first in ", type_name_of(self), ".__init__")
                                  .c_str());
  PythonModule* pm = python_module(self);
  if (!pm)
    throw nb::type_error(cf::str("[Module] cannot register ", what, " '", name, "' in a ", type_name_of(self),
                                 ": its parameters and submodules are fixed in C++; a Python class registers its own "
                                 "by deriving from cf.nn.Module (or cf.nn.UnaryModule) and holding this one as a "
                                 "submodule")
                             .c_str());
  // A name the class itself has (a method, a property, `training`) would hide the registered value: attribute
  // lookup finds the class's first and never asks __getattr__.
  if (pm->kind_of(name) == PythonModule::Kind::kNone && PyObject_HasAttrString(self.type().ptr(), name.c_str()))
    throw cf::ValueError(cf::str("[Module] cannot register ", what, " '", name, "' in ", type_name_of(self),
                                 ": the class has an attribute of that name (", name,
                                 " would still read the class's), choose another name"));
  // A plain attribute of that name gives way, as in PyTorch (self.x = None, then self.x = cf.nn.Linear(...)).
  if (nb::inst_python_derived(self)) {
    nb::object d = nb::steal(PyObject_GenericGetDict(self.ptr(), nullptr));
    if (!d.is_valid()) throw nb::python_error();
    if (PyDict_Contains(d.ptr(), nb::str(name.c_str()).ptr()) == 1 && PyDict_DelItemString(d.ptr(), name.c_str()) != 0)
      throw nb::python_error();
  }
  return *pm;
}

Tensor tensor_or_none(nb::handle value, const std::string& name, const char* what) {
  if (value.is_none()) return Tensor();
  Tensor t;
  if (!nb::try_cast<Tensor>(value, t))
    throw nb::type_error(cf::str("[Module] ", what, " '", name, "' takes a cf.Tensor or None, got ",
                                 type_name_of(value))
                             .c_str());
  return t;
}

void set_parameter(nb::handle self, const std::string& name, nb::handle value) {
  PythonModule& pm = registering_module(self, name, "parameter");
  if (nb::isinstance<ParameterMarker>(value)) {
    const ParameterMarker& p = nb::cast<const ParameterMarker&>(value);
    pm.set_parameter(name, p.data, p.requires_grad);
  } else {
    pm.set_parameter(name, tensor_or_none(value, name, "parameter"), true);
  }
}

void set_buffer(nb::handle self, const std::string& name, nb::handle value, std::optional<bool> persistent) {
  PythonModule& pm = registering_module(self, name, "buffer");
  pm.set_buffer(name, tensor_or_none(value, name, "buffer"), persistent);
}

void set_module(nb::handle self, const std::string& name, nb::handle value) {
  PythonModule& pm = registering_module(self, name, "submodule");
  if (!nb::isinstance<cnn::Module>(value))
    throw nb::type_error(cf::str("[Module] submodule '", name, "' takes a cf.nn.Module, got ",
                                 type_name_of(value))
                             .c_str());
  if (!nb::inst_ready(value))
    throw nb::type_error(cf::str("[Module] submodule '", name, "': its __init__ has not run (", type_name_of(value),
                                 ")").c_str());
  pm.set_module(name, nb::cast<std::shared_ptr<cnn::Module>>(value));
}

void module_setattr(nb::handle self, nb::str name_obj, nb::handle value) {
  const std::string name = nb::cast<std::string>(name_obj);
  if (nb::isinstance<ParameterMarker>(value)) return set_parameter(self, name, value);
  if (nb::isinstance<cnn::Module>(value)) {
    // a C++ module keeps its plain attributes (a Python subclass of cf.nn.Linear holding another module);
    // only a Python module registers
    if (!nb::inst_ready(self) || python_module(self)) return set_module(self, name, value);
  } else if (PythonModule* pm = python_module(self)) {
    switch (pm->kind_of(name)) {
      case PythonModule::Kind::kParameter:
        if (!value.is_none())
          throw nb::type_error(cf::str("[Module] '", name, "' is a parameter of ", type_name_of(self),
                                       ": assign cf.nn.Parameter(tensor) (or None), not a ",
                                       type_name_of(value))
                                   .c_str());
        return pm->set_parameter(name, Tensor(), true);
      case PythonModule::Kind::kBuffer:
        return pm->set_buffer(name, tensor_or_none(value, name, "buffer"), std::nullopt);
      case PythonModule::Kind::kModule:
        throw nb::type_error(cf::str("[Module] '", name, "' is a submodule of ", type_name_of(self),
                                     ": assign another cf.nn.Module, not a ", type_name_of(value))
                                 .c_str());
      case PythonModule::Kind::kNone:
        break;
    }
  }
  if (PyObject_GenericSetAttr(self.ptr(), name_obj.ptr(), value.ptr()) != 0) throw nb::python_error();
}

nb::object module_getattr(nb::handle self, const std::string& name) {
  if (PythonModule* pm = python_module(self)) {
    switch (pm->kind_of(name)) {
      case PythonModule::Kind::kParameter:
      case PythonModule::Kind::kBuffer: {
        const Tensor& t = pm->tensor(name);
        return t.defined() ? nb::cast(t) : nb::none();
      }
      case PythonModule::Kind::kModule:
        return nb::cast(pm->module(name));
      case PythonModule::Kind::kNone:
        break;
    }
  }
  throw nb::attribute_error(cf::str("'", type_name_of(self), "' object has no attribute '", name, "'").c_str());
}

void module_delattr(nb::handle self, nb::str name_obj) {
  const std::string name = nb::cast<std::string>(name_obj);
  if (PythonModule* pm = python_module(self); pm && pm->kind_of(name) != PythonModule::Kind::kNone)
    throw cf::ValueError(cf::str("[Module] cannot delete '", name, "' of ", type_name_of(self),
                                 ": registered entries stay (the state dict's names are fixed); assign None to empty a "
                                 "parameter or buffer"));
  if (PyObject_GenericSetAttr(self.ptr(), name_obj.ptr(), nullptr) != 0) throw nb::python_error();
}

// The direct submodules of a module, in order (named_submodules lists the whole tree).
std::vector<std::pair<std::string, std::shared_ptr<cnn::Module>>> children_of(const cnn::Module& m) {
  std::vector<std::pair<std::string, std::shared_ptr<cnn::Module>>> out;
  for (auto& [name, sub] : m.named_submodules())
    if (name.find('.') == std::string::npos) out.emplace_back(name, sub);
  return out;
}

void append_module(cnn::ModuleList& list, nb::handle m) {
  if (!nb::isinstance<cnn::Module>(m) || !nb::inst_ready(m))
    throw nb::type_error(cf::str("[ModuleList] takes cf.nn modules (built: their __init__ ran), got ",
                                 type_name_of(m)).c_str());
  auto module = nb::cast<std::shared_ptr<cnn::Module>>(m);
  if (auto* own = dynamic_cast<PythonModuleList*>(&list))
    own->append(std::move(module));
  else
    list.push_back(std::move(module));  // a C++ model's list
}

// Module.apply: the submodules first (each once), then the module, as PyTorch's.
void apply_to_tree(nb::handle self, nb::handle fn) {
  std::vector<std::shared_ptr<cnn::Module>> subs;
  for (auto& [name, sub] : children_of(nb::cast<const cnn::Module&>(self))) subs.push_back(sub);
  std::vector<const cnn::Module*> seen;
  for (const auto& sub : subs) {
    if (std::find(seen.begin(), seen.end(), sub.get()) != seen.end()) continue;
    seen.push_back(sub.get());
    apply_to_tree(nb::cast(sub), fn);
  }
  fn(self);
}

// The Python objects of modules, each once, in order (a module held under two names is one object).
nb::list distinct_objects(const std::vector<std::shared_ptr<cnn::Module>>& modules) {
  nb::list out;
  std::vector<const cnn::Module*> seen;
  for (const auto& m : modules) {
    if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
    seen.push_back(m.get());
    out.append(nb::cast(m));
  }
  return out;
}

// "(8, 4)", with the dtype when not float32 and the device when not the CPU; "None" for an empty slot.
std::string describe_slot(const Tensor& t) {
  if (!t.defined()) return "None";
  std::string out = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) out += (i ? ", " : "") + std::to_string(t.shape()[i]);
  out += t.shape().size() == 1 ? ",)" : ")";
  if (t.dtype() != cf::kFloat32) out += cf::str(" ", t.dtype());
  if (!t.device().is_cpu()) out += " " + t.device().str();
  return out;
}

// PyTorch's module tree, with each module's own parameters and buffers by shape:
//   Net(
//     scale (2,)
//     (fc): Linear(weight (8, 4), bias (8,))
//   )
std::string module_repr(nb::handle self, const std::string& indent) {
  const cnn::Module& m = nb::cast<const cnn::Module&>(self);
  std::vector<std::string> own;
  for (const auto& [name, t] : m.named_parameters())
    if (name.find('.') == std::string::npos) own.push_back(name + " " + describe_slot(t));
  const std::vector<std::string> persistent = m.persistent_buffer_names();
  for (const auto& [name, t] : m.named_buffers())
    if (name.find('.') == std::string::npos)
      own.push_back("buffer " + name + " " + describe_slot(t) +
                    (std::find(persistent.begin(), persistent.end(), name) == persistent.end() ? " (not saved)" : ""));
  // (named_parameters skips an empty slot: a Python module's own are listed from its registry)
  if (PythonModule* pm = python_module(self)) {
    own.clear();
    for (const std::string& name : pm->names(PythonModule::Kind::kParameter))
      own.push_back(name + " " + describe_slot(pm->tensor(name)));
    for (const std::string& name : pm->names(PythonModule::Kind::kBuffer))
      own.push_back("buffer " + name + " " + describe_slot(pm->tensor(name)) +
                    (std::find(persistent.begin(), persistent.end(), name) == persistent.end() ? " (not saved)" : ""));
  }
  const std::string type = nb::cast<std::string>(self.type().attr("__qualname__"));
  const auto children = children_of(m);
  if (children.empty()) {
    std::string out = type + "(";
    for (size_t i = 0; i < own.size(); ++i) out += (i ? ", " : "") + own[i];
    return out + ")";
  }
  const std::string inner = indent + "  ";
  std::string out = type + "(\n";
  for (const std::string& o : own) out += inner + o + "\n";
  for (const auto& [name, sub] : children) out += inner + "(" + name + "): " + module_repr(nb::cast(sub), inner) + "\n";
  return out + indent + ")";
}

// Refuses `self` unless its C++ class is exactly Base, before anything is built in it: nanobind accepts an instance
// of any subclass as `self`, so cf.nn.Module.__init__(self) called on a cf.nn.Linear (or on a Python subclass of the
// abstract cf.nn.Attention) would build the trampoline in storage laid out for another class.
template <class Base>
void check_own_class(nb::pointer_and_handle<Base> v, const char* base_name) {
  if (nb::type_info(v.h.type()) != typeid(Base)) {
    std::string cpp_class = "another cf class";
    for (nb::handle k : nb::borrow<nb::tuple>(v.h.type().attr("__mro__"))) {
      const std::string mod = nb::cast<std::string>(k.attr("__module__"));
      if (mod.rfind("cf._cf", 0) == 0) {
        cpp_class = "cf" + mod.substr(6) + "." + nb::cast<std::string>(k.attr("__qualname__"));
        break;
      }
    }
    throw nb::type_error(cf::str("[Module] ", base_name, ".__init__ called on a ", type_name_of(v.h), ", which is a ",
                                 cpp_class, ": call ", cpp_class, ".__init__ (super().__init__(...))")
                             .c_str());
  }
}

// __init__ of a cf base that Python classes derive from: the trampoline.
template <class Base, class Trampoline>
void init_python_module(nb::pointer_and_handle<Base> v, const char* base_name) {
  check_own_class(v, base_name);
  new (v.p) Trampoline();
}

// Every submodule Python handed to a Python module (set_module) or a Python-built ModuleList went through
// nanobind's shared_ptr caster, which made a new shared_ptr owning one reference to the module's Python object (its
// py_deleter); that shared_ptr stays inside this module (its own map, or list, and Module::children_), so visiting
// each such reference once is exact. A submodule built in C++ holds no Python reference: nothing to visit.
int module_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));  // (a heap type's instances own a reference to it)
  if (!nb::inst_ready(self)) return 0;
  const cnn::Module* m = nb::inst_ptr<cnn::Module>(self);
  auto held = [&](const std::shared_ptr<cnn::Module>& sp) -> int {
    if (const auto* d = std::get_deleter<nb::detail::py_deleter>(sp)) Py_VISIT(d->o);
    return 0;
  };
  if (const auto* pm = dynamic_cast<const PythonModule*>(m)) {
    for (const auto* sp : pm->held_modules())
      if (int r = held(*sp)) return r;
  } else if (const auto* list = dynamic_cast<const PythonModuleList*>(m)) {
    for (const auto& sp : list->held())
      if (int r = held(sp)) return r;
  }
  return 0;
}

}  // namespace

PyType_Slot module_type_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(&module_traverse)}, {0, nullptr}};

cf::Tensor PyUnaryModule::forward(const cf::Tensor& x) {
  // NB_OVERRIDE_PURE's ticket, with cf's errors: no Python forward, or one that returns something else
  nb::detail::ticket t(nb_trampoline, "forward", nb::detail::str_hash("forward"), false);
  if (!t.key.is_valid()) {
    nb::gil_scoped_acquire gil;  // (the ticket let the GIL go when it found no override)
    nb::handle self = nb_trampoline.base();
    // No override, or this very forward called again from inside it: nanobind then dispatches to the base,
    // which a Python forward reaches only through super().forward (its __call__ runs the Python forward itself).
    if (nb::getattr(self.type(), "forward").is(nb::type<cnn::UnaryModule>().attr("forward")))
      throw cf::NotImplementedError(cf::str("[UnaryModule] ", type_name_of(self), " defines no forward(self, x)"));
    throw cf::NotImplementedError(cf::str("[UnaryModule] ", type_name_of(self), ".forward reached cf.nn.UnaryModule's "
                                          "forward, which is abstract (super().forward(x) has nothing to call)"));
  }
  nb::object out = nb_trampoline.base().attr(t.key)(x);
  Tensor y;
  if (!nb::try_cast<Tensor>(out, y))
    throw nb::type_error(cf::str("[UnaryModule] ", type_name_of(nb_trampoline.base()),
                                 ".forward must return a cf.Tensor, got ", type_name_of(out))
                             .c_str());
  return y;
}

void bind_python_modules(nb::module_& nn, nb::class_<cnn::Module, PyModule>& module,
                         nb::class_<cnn::UnaryModule, cnn::Module, PyUnaryModule>& unary) {
  nb::class_<ParameterMarker>(
      nn, "Parameter",
      "Marks a tensor as a parameter for the module attribute it is assigned to: `self.w = cf.nn.Parameter(t)` in a "
      "Python subclass of cf.nn.Module registers w (named_parameters, state_dict, optimizers, to()). The module "
      "keeps t itself when it is a leaf that requires grad, else stores it detached as such a leaf; self.w then "
      "reads that tensor. Unlike torch.nn.Parameter it "
      "is a marker, not a tensor: use it in the assignment (or register_parameter).")
      .def("__init__",
           [](ParameterMarker* p, nb::handle data, bool requires_grad) {
             Tensor t;
             if (!nb::try_cast<Tensor>(data, t) || !t.defined())
               throw nb::type_error(cf::str("[Parameter] data must be a cf.Tensor, got ", type_name_of(data),
                                            " (cf.tensor(...) makes one from numbers or a NumPy array)")
                                        .c_str());
             new (p) ParameterMarker{t, requires_grad};
           },
           nb::arg("data").none(), nb::arg("requires_grad") = true,
           nb::sig("def __init__(self, data: cf._cf.Tensor, requires_grad: bool = True) -> None"))
      .def_ro("data", &ParameterMarker::data, "The tensor to register.")
      .def_ro("requires_grad", &ParameterMarker::requires_grad)
      .def("__repr__", [](const ParameterMarker& p) {
        return cf::str("cf.nn.Parameter(shape ", cf::shape_str(p.data.shape()), ", ", p.data.dtype(), ", requires_grad=",
                       p.requires_grad ? "True" : "False", ")");
      });

  module
      .def("__init__", [](nb::pointer_and_handle<cnn::Module> v) { init_python_module<cnn::Module, PyModule>(v, "cf.nn.Module"); },
           "A module whose parameters, buffers and submodules its Python code registers (derive from it as from "
           "torch.nn.Module).")
      .def("__setattr__", &module_setattr, nb::arg("name"), nb::arg("value").none(),
           "In a Python module: a cf.nn.Module value registers a submodule and a cf.nn.Parameter a parameter; a "
           "registered name takes a value of its kind (None empties a parameter or buffer); anything else is a plain "
           "attribute.")
      .def("__getattr__", &module_getattr, nb::arg("name"),
           nb::sig("def __getattr__(self, name: str) -> typing.Any"),
           "The registered parameter, buffer or submodule of that name (Python modules).")
      .def("__delattr__", &module_delattr, nb::arg("name"))
      .def("__call__",
           [](nb::handle self, nb::args args, nb::kwargs kwargs) -> nb::object {
             if (!nb::hasattr(self, "forward"))
               throw cf::NotImplementedError(cf::str("[Module] ", type_name_of(self), " defines no forward"));
             return self.attr("forward")(*args, **kwargs);
           },
           nb::sig("def __call__(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any"),
           "self.forward(*args, **kwargs) (the C++ modules bind their own).")
      .def("register_parameter", &set_parameter, nb::arg("name"), nb::arg("value").none(),
           nb::sig("def register_parameter(self, name: str, value: cf._cf.Tensor | Parameter | None) -> None"),
           "Registers (or gives a new value to) the parameter `name` of this Python module: a tensor (stored detached, "
           "requiring grad), a cf.nn.Parameter, or None (an empty slot).")
      .def("register_buffer",
           [](nb::handle self, const std::string& name, nb::handle tensor, bool persistent) {
             set_buffer(self, name, tensor, persistent);
           },
           nb::arg("name"), nb::arg("tensor").none(), nb::arg("persistent") = true,
           nb::sig("def register_buffer(self, name: str, tensor: cf._cf.Tensor | None, persistent: bool = True) -> None"),
           "Registers (or gives a new value to) the buffer `name` of this Python module: in the state dict when "
           "persistent; moved and converted by to(); no gradient.")
      .def("register_module", &set_module, nb::arg("name"), nb::arg("module").none(),
           nb::sig("def register_module(self, name: str, module: Module) -> None"),
           "Registers (or replaces) the submodule `name` of this Python module (as `self.name = module`).")
      .def("add_module", &set_module, nb::arg("name"), nb::arg("module").none(),
           nb::sig("def add_module(self, name: str, module: Module) -> None"), "register_module's other name.")
      .def("named_children",
           [](const cnn::Module& m) {
             nb::list out;
             for (auto& [name, sub] : children_of(m)) out.append(nb::make_tuple(name, nb::cast(sub)));
             return out;
           },
           "[(name, module), ...] of the direct submodules, in registration order.")
      .def("children",
           [](const cnn::Module& m) {
             std::vector<std::shared_ptr<cnn::Module>> subs;
             for (auto& [name, sub] : children_of(m)) subs.push_back(sub);
             return distinct_objects(subs);
           },
           "The direct submodules, in registration order, each once (one held under two names too).")
      .def("modules",
           [](nb::handle self) {
             std::vector<std::shared_ptr<cnn::Module>> subs;
             for (auto& [name, sub] : nb::cast<cnn::Module&>(self).named_submodules()) subs.push_back(sub);
             nb::list out = distinct_objects(subs);
             out.insert(0, self);
             return out;
           },
           "This module, then every module below it (named_modules() order), each once.")
      .def("__dir__",
           [](nb::handle self) {
             nb::list out = nb::steal<nb::list>(PyObject_CallMethod(nb::handle((PyObject*)&PyBaseObject_Type).ptr(),
                                                                      "__dir__", "O", self.ptr()));
             if (PythonModule* pm = python_module(self))
               for (auto kind : {PythonModule::Kind::kParameter, PythonModule::Kind::kBuffer, PythonModule::Kind::kModule})
                 for (const std::string& name : pm->names(kind)) out.append(nb::str(name.c_str()));
             return out;
           },
           "The attributes, the registered parameters, buffers and submodules of a Python module among them.")
      .def("__repr__", [](nb::handle self) { return module_repr(self, ""); },
           "The module tree (as PyTorch prints it), with each module's own parameters and buffers by shape.")
      .def("apply",
           [](nb::handle self, nb::handle fn) {
             apply_to_tree(self, fn);
             return nb::borrow(self);
           },
           nb::arg("fn"), nb::sig("def apply(self, fn: collections.abc.Callable[[Module], object]) -> Module"),
           "fn(module) for every submodule, then for this one (PyTorch's order: self.apply(init_weights)); returns "
           "self.")
      .def("requires_grad_",
           [](nb::handle self, bool requires_grad) {
             for (const Tensor& p : nb::cast<cnn::Module&>(self).parameters()) Tensor(p).set_requires_grad(requires_grad);
             return nb::borrow(self);
           },
           nb::arg("requires_grad") = true, nb::sig("def requires_grad_(self, requires_grad: bool = True) -> Module"),
           "Sets requires_grad on every parameter (False freezes them: optimizers skip parameters without a "
           "gradient); returns self.")
      .def("double", [](nb::handle self) { return self.attr("to")(cf::kFloat64); },
           nb::sig("def double(self) -> Module"), "to(cf.float64).")
      .def("float", [](nb::handle self) { return self.attr("to")(cf::kFloat32); },
           nb::sig("def float(self) -> Module"), "to(cf.float32).")
      .def("half", [](nb::handle self) { return self.attr("to")(cf::kFloat16); },
           nb::sig("def half(self) -> Module"), "to(cf.float16).")
      .def("bfloat16", [](nb::handle self) { return self.attr("to")(cf::kBFloat16); },
           nb::sig("def bfloat16(self) -> Module"), "to(cf.bfloat16).")
      .def("cpu", [](nb::handle self) { return self.attr("to")(cf::Device::cpu()); },
           nb::sig("def cpu(self) -> Module"), "to(\"cpu\").")
      .def("cuda",
           [](nb::handle self, std::optional<int> index) { return self.attr("to")(cf::Device::cuda(index.value_or(0))); },
           nb::arg("device").none() = nb::none(), nb::sig("def cuda(self, device: int | None = None) -> Module"),
           "to(\"cuda:N\") (device None: cuda:0).")
      .def("buffers",
           [](const cnn::Module& m) {
             std::vector<Tensor> out;
             for (auto& [name, t] : m.named_buffers()) out.push_back(t);
             return out;
           },
           "The buffer tensors, recursively, in order (persistent and not).");

  // The container a Python module keeps a variable number of submodules in (a Python list of modules is a plain
  // attribute: its parameters would reach no optimizer, as in PyTorch).
  nb::class_<cnn::ModuleList, cnn::Module, PythonModuleList>(
      nn, "ModuleList",
      "An ordered list of submodules named \"0\", \"1\", ... (as torch.nn.ModuleList): a Python module holds its "
      "layers in one so that they are registered (a plain list's modules would not be).")
      .def("__init__",
           [](nb::pointer_and_handle<cnn::ModuleList> v, nb::handle modules) {
             check_own_class(v, "cf.nn.ModuleList");
             auto* list = new (v.p) PythonModuleList();
             if (modules.is_none()) return;
             for (nb::handle h : modules) append_module(*list, h);
           },
           nb::arg("modules").none() = nb::none(),
           nb::sig("def __init__(self, modules: collections.abc.Iterable[Module] | None = None) -> None"))
      .def("append", [](cnn::ModuleList& self, nb::handle m) { append_module(self, m); }, nb::arg("module").none(),
           nb::sig("def append(self, module: Module) -> None"), "Adds a module at the end (named by its position).")
      .def("extend",
           [](cnn::ModuleList& self, nb::handle modules) {
             for (nb::handle m : modules) append_module(self, m);
           },
           nb::arg("modules"), nb::sig("def extend(self, modules: collections.abc.Iterable[Module]) -> None"),
           "Adds each module at the end, in order.")
      .def("__len__", [](const cnn::ModuleList& self) { return self.size(); })
      .def("__getitem__",
           [](const cnn::ModuleList& self, int64_t i) {
             const int64_t n = int64_t(self.size());
             if (i < -n || i >= n)
               throw nb::index_error(cf::str("[ModuleList] index ", i, " out of range for ", n, " modules").c_str());
             const std::string name = std::to_string(i < 0 ? i + n : i);
             for (auto& [child, sub] : children_of(self))
               if (child == name) return sub;
             throw cf::ValueError(cf::str("[ModuleList] no module named '", name, "'"));  // (unreachable)
           },
           nb::arg("index"))
      .def("__getitem__",
           [](const cnn::ModuleList& self, nb::slice slice) {
             const auto children = children_of(self);
             auto [start, stop, step, count] = slice.compute(children.size());
             (void)stop;
             nb::list out;
             for (size_t i = 0; i < count; ++i) out.append(nb::cast(children[size_t(start + Py_ssize_t(i) * step)].second));
             return out;
           },
           nb::arg("index"), "A slice: the modules as a list.")
      .def("__iter__", [](const cnn::ModuleList& self) {
        nb::list out;
        for (auto& [name, sub] : children_of(self)) out.append(nb::cast(sub));
        return nb::iter(out);
      }, nb::sig("def __iter__(self) -> collections.abc.Iterator[Module]"));

  // (cf/__init__.py checks with it that a subclass's __init__ built the C++ module: called super().__init__())
  nn.def("_initialized", [](nb::handle module) { return nb::inst_ready(module); }, nb::arg("module"));

  unary.def("__init__",
            [](nb::pointer_and_handle<cnn::UnaryModule> v) {
              init_python_module<cnn::UnaryModule, PyUnaryModule>(v, "cf.nn.UnaryModule");
            },
            "A one-tensor module written in Python: define forward(self, x); Sequential and cf's C++ code call it.");
}

}  // namespace cfpy
