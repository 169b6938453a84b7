#pragma once
// Shared pieces of the cf Python bindings (python/src/*.cpp): type casters for
// Shape and the argument helpers every binding file uses. The bindings are a
// thin layer over the public header cf.h: no kernel or autograd code lives here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

// Every double parameter of the bindings (scalars such as mul_'s, fill values, options) takes what nanobind's float caster
// takes, except a complex number. Python's complex has no __float__ and is refused already; NumPy's complex
// scalars (numpy.complexfloating: complex64, complex128, which subclasses complex, clongdouble) convert through
// __float__ with a ComplexWarning and lost their imaginary part (t.mul_(np.complex128(1 + 2j)) multiplied by
// 1). Refused the same way: a TypeError listing the signatures. Declared before any binding instantiates the
// caster (every binding file includes this header first).
namespace cfpy {
// A number with an imaginary part: a complex (or subclass: NumPy's complex128) or a NumPy complex scalar
// (numpy.complexfloating: complex64, clongdouble). Needs the GIL; calls no Python code, never raises.
bool is_complex_number(PyObject* o) noexcept;
}  // namespace cfpy
namespace nanobind::detail {
template <>
struct type_caster<double> {
  NB_INLINE bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    // (only in the converting pass: the first one takes exact floats alone)
    if ((flags & uint32_t(cast_flags::convert)) && !PyFloat_Check(src.ptr()) && !PyLong_Check(src.ptr()) &&
        cfpy::is_complex_number(src.ptr()))
      return false;
    return NB_CALL(load_f64)(NB_CTX_C(cleanup), src.ptr(), flags, &value);
  }
  NB_INLINE static handle from_cpp(double src, rv_policy, cleanup_list*) noexcept { return PyFloat_FromDouble(src); }
  NB_TYPE_CASTER(double, const_name("float"))
};
}  // namespace nanobind::detail

#include <cf.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <string>
#include <vector>

namespace nb = nanobind;

// Kernels run with the GIL released, so other Python threads go on meanwhile.
using release_gil = nb::call_guard<nb::gil_scoped_release>;
// Every path argument: str or any os.PathLike (pathlib.Path), as open() takes; the C++ API takes the string.
using FsPath = std::filesystem::path;

namespace cfpy {
// One Python object per leaf tensor that requires grad or is held in C++ too (a module's parameters and
// buffers, a gradient), as in PyTorch: `m.weight is m.weight`, a set or dict of parameters work (each access
// made a new object before, so `m.weight in set(m.parameters())` was False without a word). Fresh op results
// and views get their own object. The registry (tensor.cpp) maps the TensorImpl to its object: weakly, and
// for a parameter (a leaf that requires grad) held by others too, strongly as well, so that its object
// survives while C++ holds it, as PyTorch preserves it: an id() stays the parameter's while its module
// lives. The GIL guards the registry.
// The live object of t, as a new reference, or null.
PyObject* known_wrapper(const cf::Tensor& t) noexcept;
// Remember h as t's object when t is a leaf that requires grad or whose TensorImpl is `shared` (held by
// others: a module's frozen parameter, a buffer, a gradient). take_over: h replaces an object already
// remembered for t (the one the user marked with requires_grad_, over an alias returned earlier).
void remember_wrapper(const cf::Tensor& t, nb::handle h, bool shared, bool take_over) noexcept;
// A C++ holder took t from Python (a module's slot): keep its object, if it has one and t is a parameter,
// while C++ holds t.
void keep_wrapper(const cf::Tensor& t) noexcept;
// Lets go of the objects kept for parameters that only their own object still holds (a dropped module's:
// their memory is freed once Python holds them no more); returns how many. Runs after every
// garbage collection, when the registry has doubled since the last sweep, and in cf.empty_cache.
size_t sweep_wrappers() noexcept;
// The live object wrapping exactly this C++ tensor (nanobind's instance registry), as a new reference, or null.
// Only for a tensor that is some cf.Tensor object's own value (self in a method): nanobind's policy none
// makes a new object for an address another type's object holds (a struct whose first field is a tensor).
PyObject* nb_inst_find(const cf::Tensor* t) noexcept;
}  // namespace cfpy

// cf::Shape <-> Python: any sequence of ints (or one int) in; a tuple out.
namespace nanobind::detail {
template <>
struct type_caster<cf::Shape> {
  NB_TYPE_CASTER(cf::Shape, const_name("collections.abc.Sequence[int]"))

  bool from_python(handle src, uint8_t flags, cleanup_list*) noexcept {
    if (PyLong_Check(src.ptr()) && !PyBool_Check(src.ptr())) {
      long long v = PyLong_AsLongLong(src.ptr());
      if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      value = cf::Shape{int64_t(v)};
      return true;
    }
    if (!PySequence_Check(src.ptr()) || PyUnicode_Check(src.ptr()) || PyBytes_Check(src.ptr())) return false;
    // A tensor is a sequence too (len + getitem): never read it as a shape.
    if (!PyList_Check(src.ptr()) && !PyTuple_Check(src.ptr())) return false;
    PyObject* fast = PySequence_Fast(src.ptr(), "");
    if (!fast) {
      PyErr_Clear();
      return false;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject** items = PySequence_Fast_ITEMS(fast);
    value.clear();
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) {
        // numpy integers and other __index__ objects
        PyObject* idx = PyNumber_Index(items[i]);
        if (!idx) {
          PyErr_Clear();
          Py_DECREF(fast);
          return false;
        }
        value.push_back(PyLong_AsLongLong(idx));
        Py_DECREF(idx);
      } else {
        value.push_back(PyLong_AsLongLong(items[i]));
      }
      if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_DECREF(fast);
        return false;
      }
    }
    Py_DECREF(fast);
    (void)flags;
    return true;
  }

  static handle from_cpp(const cf::Shape& s, rv_policy, cleanup_list*) noexcept {
    PyObject* t = PyTuple_New(Py_ssize_t(s.size()));
    if (!t) return handle();
    for (size_t i = 0; i < s.size(); ++i) PyTuple_SET_ITEM(t, Py_ssize_t(i), PyLong_FromLongLong(s[i]));
    return t;
  }
};

// A cf.dtype argument takes a cf.dtype only. nanobind's enum caster also converts a plain int to the
// member of that value, so cf.zeros(2, 3) made a bool tensor of shape (2,) (3 is bool's value) and
// cf.ones(2, 1) a float64 one, without a word.
template <>
struct type_caster<cf::DType> {
  NB_TYPE_CASTER(cf::DType, const_name<cf::DType>())

  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    int64_t v = 0;
    const uint32_t exact = uint32_t(flags) & ~uint32_t(cast_flags::convert);
    if (!NB_CALL(enum_from_python)(NB_CTX_C(cleanup), &typeid(cf::DType), src.ptr(), &v, exact)) return false;
    value = cf::DType(v);
    return true;
  }
  static handle from_cpp(cf::DType src, rv_policy, cleanup_list* cleanup) noexcept {
    return NB_CALL(enum_from_cpp)(NB_CTX_C(cleanup), &typeid(cf::DType), int64_t(src));
  }
};

// cf::Tensor -> Python: nanobind's class caster, with one object per parameter (cfpy::known_wrapper).
template <>
struct type_caster<cf::Tensor> : type_caster_base<cf::Tensor> {
  template <typename T>
  static handle from_cpp(T&& value, rv_policy policy, cleanup_list* cleanup) noexcept {
    using Base = type_caster_base<cf::Tensor>;
    const cf::Tensor* t;
    if constexpr (is_pointer_v<T>)
      t = value;
    else
      t = &value;
    if (!t || !t->defined()) return Base::from_cpp(std::forward<T>(value), policy, cleanup);
    // A plain reference (an in-place op or an initialiser returning its tensor): nanobind's own answer, the
    // object holding that very tensor, with no registry (asking the registry first answered an in-place op
    // with another object of the same TensorImpl).
    if (policy == rv_policy::reference) return Base::from_cpp(std::forward<T>(value), policy, cleanup);
    // A fresh result (the only handle) or a lone field of another object that does not require grad: no
    // object can be known for it (a known object would hold a handle too), and none is remembered. The
    // common case, kept cheap.
    const bool shared = t->impl_shared().use_count() > 1;
    if (!shared && !t->requires_grad()) return Base::from_cpp(std::forward<T>(value), policy, cleanup);
    if (PyObject* known = cfpy::known_wrapper(*t)) return known;
    // Held elsewhere too (a module's parameter or buffer, a gradient, an input returned as is) or requiring
    // grad: worth one object. It holds its own handle, a copy (a reference into a module's slot would show
    // whatever tensor the slot is given later, under the registry's entry for this one).
    const cf::Tensor same = *t;  // (a returned value is moved into its new object below)
    const rv_policy own = policy == rv_policy::reference_internal ? rv_policy::copy : policy;
    handle h = Base::from_cpp(std::forward<T>(value), own, cleanup);
    if (h.is_valid()) cfpy::remember_wrapper(same, h, shared, /*take_over=*/false);
    return h;
  }
};
}  // namespace nanobind::detail

namespace cfpy {

// Axes from None (all axes), an int, or a sequence of ints.
std::vector<int64_t> to_axes(nb::handle h, const char* op);
// An int argument (a Python int or anything with __index__: np.int64) as int64; a ValueError naming op and
// `what` for other types and for ints outside int64 (nanobind's own cast escaped as "std::bad_cast").
int64_t int64_arg(nb::handle h, const char* op, const char* what);
// h as an int when it is one (a Python int, or anything with __index__: np.int64, a 0-d integer array or
// tensor), in out; false for anything else (bools, floats and strings included). Ints outside int64 are
// ValueErrors naming op and what.
bool index_value(nb::handle h, const char* op, const char* what, int64_t& out);
// None, or a bool (Python's or NumPy's np.bool_); a ValueError naming op and what for anything else.
std::optional<bool> optional_bool_arg(nb::handle h, const char* op, const char* what);
// A sequence of such ints (any iterable but a string: a list, a tuple, a 1-d array or tensor).
std::vector<int64_t> int64_list_arg(nb::handle h, const char* op, const char* what);
// One such int (as a list of one) or a sequence of them.
std::vector<int64_t> int64_or_list_arg(nb::handle h, const char* op, const char* what);

// Tensor from nested Python sequences / numbers / buffer objects (a copy).
cf::Tensor tensor_from_python(nb::handle data, std::optional<cf::DType> dtype, cf::Device device);

// Python <-> JSON (configs and attention options given as keyword arguments).
nlohmann::json to_json(nb::handle h, const std::string& where);
nb::object from_json(const nlohmann::json& j);

// "mean" | "sum" | "none" -> cf::Reduction.
cf::Reduction parse_reduction(const std::string& s, const char* op);

// The generator argument of a binding: the given one, or the process-wide default.
inline cf::Generator& gen_or_default(cf::Generator* g) { return g ? *g : cf::default_generator(); }
// `generator: Generator | None = None`, read by gen_or_default (a default naming the default generator's
// object printed its seed and offset at import time as if they were a constant).
inline auto generator_arg() { return nb::arg("generator").none() = nb::none(); }
// __init__ of a module class T whose constructor takes Args... then a Generator&: the generator argument as
// generator_arg() (None: the default generator).
template <typename T, typename... Args>
auto init_with_generator() {
  return [](T* self, Args... args, cf::Generator* g) { new (self) T(std::forward<Args>(args)..., gen_or_default(g)); };
}

// Named parameters from a Python object: a Module (its named parameters), a dict name -> Tensor, or a list of tensors (named by position, after
// positional_prefix) or (name, Tensor) pairs; anything else is a TypeError naming op and the entry.
cf::nn::StateDict to_state_dict(nb::handle h, const char* op, const std::string& positional_prefix = "");
// A module's whole state (parameters and persistent buffers: routing's centroids, a memory bank) where a state
// dict is expected (save_safetensors, load_state_dict, save_checkpoint's model); anything else as to_state_dict.
cf::nn::StateDict module_state_or_dict(nb::handle h, const char* op);
nb::dict state_dict_to_python(const cf::nn::StateDict& d);
// A generator, filter(...), dict view or other iterable (not a list, tuple, dict, str, tensor or module) as a list,
// else an invalid object; a set is refused (its order changes between runs), the iterable's own error passes.
nb::object iterable_as_list(nb::handle h, const char* op);

// A tensor sharing the memory of an object with __dlpack__ (or a DLPack capsule) - dlpack.cpp.
cf::Tensor from_dlpack_object(nb::handle obj, bool uint8_as_bool);
// NumPy and DLPack views of a tensor that requires grad are refused, as PyTorch refuses them: a
// write through the view bypasses the version counter, so a gradient computed from the tensor
// afterwards would be silently wrong. t.detach() shares the memory and says so.
inline void refuse_grad_export(const cf::Tensor& t, const char* op) {
  CF_CHECK(!t.requires_grad(), AutogradError, "[", op, "] cannot view a tensor that requires grad (",
           t.describe(), ") from NumPy or DLPack: writes through the view would escape autograd; use "
           "t.detach() (shares memory) or t.detach().clone()");
}

// A 0-d value of an array library (a NumPy scalar such as np.float32 or np.bool_, a 0-d tensor) as its
// Python value (item()), or an invalid object for anything else. Python's own numbers, strings and
// containers are passed over before any attribute lookup (each failed lookup raises internally).
inline nb::object scalar_item(nb::handle h) {
  PyObject* o = h.ptr();
  if (o == Py_None || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o) || PyList_Check(o) ||
      PyTuple_Check(o) || PyDict_Check(o))
    return nb::object();
  if (nb::hasattr(h, "dtype") && nb::hasattr(h, "item") && nb::hasattr(h, "shape") &&
      nb::len(nb::object(h.attr("shape"))) == 0)
    return h.attr("item")();
  return nb::object();
}

// v as a 0-d int64 tensor when a double cannot hold it exactly (|v| > 2^53), else nothing (a double does).
inline std::optional<cf::Tensor> exact_int64_tensor(int64_t v, cf::Device device) {
  constexpr int64_t kExact = int64_t(1) << 53;
  if (v >= -kExact && v <= kExact) return std::nullopt;
  return cf::Tensor::from_vector(std::vector<int64_t>{v}, cf::Shape{}, device);
}

// A Python int operand of an int64 tensor that a double cannot hold exactly (|v| > 2^53), as a 0-d
// int64 tensor on like's device, so the operator or write runs exactly in int64 (through a double,
// t == 2**53 + 1 was True for t = [2**53]); an int beyond int64 is a DTypeError, as in PyTorch.
// Nothing for any other operand (those take cf's number rules).
inline std::optional<cf::Tensor> exact_int64_operand(nb::handle h, const cf::Tensor& like, const char* op) {
  if (like.dtype() != cf::kInt64 || !PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) return std::nullopt;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0)
    throw cf::DTypeError(cf::str("[", op, "] the integer ", nb::cast<std::string>(nb::str(h)), " does not fit ",
                                 like.describe(), " (int64)"));
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return exact_int64_tensor(int64_t(v), like.device());
}

// An optional tensor argument (None) as cf's undefined Tensor.
inline cf::Tensor opt(const std::optional<cf::Tensor>& t) { return t ? *t : cf::Tensor(); }

// A module's tensor member as a property: None where the module holds none (a Linear built
// without bias, a later layer of a centroid chain), as PyTorch's None bias. Assignment takes a
// tensor of the same shape, dtype and device, used as given (no copy), so weights tie
// (head.weight = emb.weight); anything else is a cf.ValueError naming the slot (before, a
// mis-shaped tensor was taken and failed later in the forward, and an optimizer built earlier
// kept stepping the old one, as it still does in PyTorch). A member every module of the class
// holds (Linear.weight) is read as a Tensor, so type checkers need no None check on it.
enum class Member { kOptional, kAlways };
template <typename Cls, typename M>
void def_tensor_member(Cls& cls, const char* name, cf::Tensor M::*member, Member kind = Member::kOptional) {
  const std::string label = nb::cast<std::string>(cls.attr("__name__")) + "." + name;
  auto setter = [member, label](M& m, std::optional<cf::Tensor> v) {
    cf::Tensor& t = m.*member;
    CF_CHECK(t.defined(), ValueError, "[", label, "] this module was built without it");
    CF_CHECK(v && v->defined(), ValueError, "[", label, "] cannot be removed (set to None)");
    CF_CHECK(v->shape() == t.shape() && v->dtype() == t.dtype() && v->device() == t.device(), ValueError, "[",
             label, "] is ", t.describe(), ", got ", v->describe(),
             " (assign a tensor like it, used as given; load_state_dict copies values)");
    CF_CHECK(v->requires_grad() == t.requires_grad(), ValueError, "[", label, "] ",
             t.requires_grad() ? "requires grad and the given tensor does not (it would freeze the slot)"
                               : "does not require grad and the given tensor does",
             "; set requires_grad on it first");
    t = *v;
    cfpy::keep_wrapper(t);
  };
  if (kind == Member::kAlways)
    cls.def_prop_rw(
        name,
        [member, label](M& m) -> cf::Tensor {
          const cf::Tensor& t = m.*member;
          CF_CHECK(t.defined(), ValueError, "[", label, "] is missing");  // (every constructor makes it)
          return t;
        },
        setter, nb::for_setter(nb::arg("value").none()));
  else
    cls.def_prop_rw(
        name,
        [member](M& m) -> std::optional<cf::Tensor> {
          const cf::Tensor& t = m.*member;
          return t.defined() ? std::optional<cf::Tensor>(t) : std::nullopt;
        },
        setter, nb::for_setter(nb::arg("value").none()));
}

// Module.forward and Module.__call__ from one function, run without the GIL.
template <typename Cls, typename F, typename... Extra>
void def_forward(Cls& cls, F f, const char* doc, const Extra&... extra) {
  cls.def("forward", f, extra..., doc, release_gil());
  cls.def("__call__", f, extra..., doc, release_gil());
}

// The Python type name of h as users import it ("cf.nn.Linear", not "cf._cf.nn.Linear"; a Python class's as is).
inline std::string user_type_name(nb::handle h) {
  std::string t = nb::type_name(h.type()).c_str();
  if (t.rfind("cf._cf.", 0) == 0) t = "cf." + t.substr(7);
  return t;
}

// Sets one field of an options struct; a value of the wrong type is a TypeError naming the struct, the field and
// both types (nanobind's setter printed its signature: "(self, arg: int, /) -> None").
inline void set_option(nb::handle self, const char* name, const std::string& key, nb::handle value) {
  try {
    nb::setattr(self, key.c_str(), value);
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    nb::object current = nb::getattr(self, key.c_str());
    throw nb::type_error(cf::str("[", name, "] option '", key, "' takes ", nb::type_name(current.type()).c_str(),
                                 " (like its value ", nb::cast<std::string>(nb::repr(current)), "), got ",
                                 nb::type_name(value.type()).c_str(), " ", nb::cast<std::string>(nb::repr(value)))
                             .c_str());
  }
}

// Options structs take keyword arguments: Options(k=v, ...) starts from the
// defaults and sets each field; an unknown name is a cf.ValueError listing the known ones. They also pickle and
// copy (by their fields), compare by their fields and print them.
template <typename T>
void def_kwargs_init(nb::class_<T>& cls, const char* name) {
  cls.def("__init__", [name](T* p, nb::kwargs kw) {
    new (p) T();
    nb::handle self = nb::find(p);
    nb::inst_mark_ready(self);
    for (auto [k, v] : kw) {
      std::string key = nb::cast<std::string>(k);
      if (!nb::hasattr(self, key.c_str()) || key.rfind("_", 0) == 0) {
        nb::list known;
        for (nb::handle a : nb::steal(PyObject_Dir(self.ptr())))
          if (nb::cast<std::string>(a).rfind("_", 0) != 0) known.append(a);
        throw cf::ValueError(cf::str("[", name, "] unknown option '", key, "' (known: ",
                                     nb::cast<std::string>(nb::str(", ").attr("join")(known)), ")"));
      }
      set_option(self, name, key, v);
    }
  }, "Defaults, then each keyword argument set (unknown names are an error).");
  // Its fields are the writable properties the binding defines (def_rw, after this call): read at each use.
  auto fields = [](nb::handle self) {
    nb::dict out;
    nb::handle type = self.type();
    for (nb::handle name : nb::steal(PyObject_Dir(type.ptr()))) {
      if (nb::cast<std::string>(name).rfind("_", 0) == 0) continue;
      nb::object attr = nb::getattr(type, name);
      if (PyObject_TypeCheck(attr.ptr(), &PyProperty_Type) && !attr.attr("fset").is_none())
        out[name] = nb::getattr(self, name);
    }
    return out;
  };
  // pickle and copy: the fields by name (every field is a number, string, list or nested options)
  cls.def("__getstate__", [fields](nb::handle self) { return fields(self); }, "The fields, name -> value.");
  cls.def("__setstate__",
          [](T* p, nb::dict state) {
            new (p) T();
            nb::handle self = nb::find(p);
            nb::inst_mark_ready(self);
            for (auto [k, v] : state) set_option(self, "setstate", nb::cast<std::string>(k), v);
          },
          nb::arg("state"));
  cls.def("__repr__", [fields, name](nb::handle self) {
    std::string out = std::string(name) + "(";
    bool first = true;
    for (auto [k, v] : fields(self)) {
      out += (first ? "" : ", ") + nb::cast<std::string>(nb::str(k)) + "=" + nb::cast<std::string>(nb::repr(v));
      first = false;
    }
    return out + ")";
  });
  cls.def("__eq__", [fields](nb::handle self, nb::handle other) {
    return self.type().is(other.type()) && fields(self).equal(fields(other));
  }, nb::arg("other"), nb::sig("def __eq__(self, other: object) -> bool"));
  cls.attr("__hash__") = nb::none();  // mutable and compared by value: unhashable, as a dataclass (eq=True)
}

// Binding entry points, one per file.
void bind_errors(nb::module_& m);
nb::class_<cf::Tensor> bind_tensor_class(nb::module_& m);
void bind_ops(nb::module_& m, nb::class_<cf::Tensor>& cls);
void bind_dlpack(nb::module_& m, nb::class_<cf::Tensor>& cls);
void bind_nn(nb::module_& m, nb::module_& nn);
void bind_models(nb::module_& m, nb::module_& models);
void bind_data(nb::module_& m, nb::module_& data);
void bind_dist(nb::module_& m, nb::module_& dist, nb::module_& nn);
void bind_torch_conveniences(nb::module_& m, nb::class_<cf::Tensor>& cls);
void bind_bridge(nb::module_& m);

}  // namespace cfpy
