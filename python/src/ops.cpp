// Every op of the registry (autograd/registry.cpp) as a function of cf, the
// helpers beside them in autograd/ops/*.h, the factories, the operators of
// cf.Tensor, and Tensor methods that mirror the functions (x.sum(), x.exp(), ...).
// Docstrings are the header comments of autograd/ops/*.h. Every kernel call runs
// with the GIL released.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <variant>

#include <nanobind/stl/function.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include "autograd/ops/common.h"
#include "common.h"

namespace cfpy {
// cf.ValuesIndices: what max/min with an axis, sort and topk return, a named tuple (values, indices) as
// PyTorch's return types (t.max(dim=1).values; unpacking as a pair works as before). Made in bind_ops.
PyObject* g_values_indices = nullptr;
}  // namespace cfpy

namespace nanobind::detail {
template <>
struct type_caster<cf::ValuesIndices> {
  NB_TYPE_CASTER(cf::ValuesIndices, const_name("tuple[cf._cf.Tensor, cf._cf.Tensor]"))
  bool from_python(handle, uint8_t, cleanup_list*) noexcept { return false; }  // (a result only)
  static handle from_cpp(const cf::ValuesIndices& v, rv_policy, cleanup_list*) noexcept {
    try {
      nb::object values = nb::cast(v.values), indices = nb::cast(v.indices);
      return PyObject_CallFunctionObjArgs(cfpy::g_values_indices, values.ptr(), indices.ptr(), nullptr);
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError, "[ValuesIndices] could not convert the result");
      return handle();
    }
  }
};
}  // namespace nanobind::detail

namespace cfpy {

bool is_complex_number(PyObject* o) noexcept {
  if (PyComplex_Check(o)) return true;
  // NumPy's complex scalars, by the name of their common base in the type's MRO (no Python call: numbers.Complex
  // isinstance checks cost about 0.5 us per NumPy scalar argument)
  PyObject* mro = Py_TYPE(o)->tp_mro;
  if (!mro || !PyTuple_Check(mro)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
    const char* name = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_name;
    if (name && std::strcmp(name, "numpy.complexfloating") == 0) return true;
  }
  return false;
}

namespace {

using cf::Tensor;
using Pair = std::pair<Tensor, Tensor>;
using TensorCls = nb::class_<Tensor>;

const cf::ValuesIndices& vi(const cf::ValuesIndices& r) { return r; }

// Register f as cf.<name>(x, ...) and as the method x.<name>(...).
template <typename F, typename... Extra>
void fn_and_method(nb::module_& m, TensorCls& cls, const char* name, F f, const char* doc, const Extra&... extra) {
  m.def(name, f, nb::arg("x"), extra..., doc, release_gil());
  cls.def(name, f, extra..., doc, release_gil());
}

// f(x, other) as cf.<name> and x.<name> for a number or NumPy operand (registered after the tensor overload),
// called with the GIL held: f reads the Python object (with_number), then releases it. (A macro: nb::sig keeps
// the pointer it is given, so the signature must be a literal.)
#define CF_NUMBER_FN_AND_METHOD(name, f, doc)                                                                 \
  m.def(name, f, nb::arg("x"), nb::arg("other").none(),                                                      \
        nb::sig("def " name "(x: cf._cf.Tensor, other: float) -> cf._cf.Tensor"), doc);                          \
  cls.def(name, f, nb::arg("other").none(), nb::sig("def " name "(self, other: float) -> cf._cf.Tensor"), doc);

// PyTorch's promotion by a float number: a Python float (or a NumPy floating scalar) beside an integer or bool
// tensor in arithmetic makes it compute in float32, PyTorch's default dtype (i * 2.5, i // 2.0 and 2.0 ** i
// are float32 there; i * 2 stays int64). C++ keeps cf's rule (a number takes the tensor's dtype, one it cannot
// hold refused): its doubles do not say whether they were written 2 or 2.0; Python's numbers do.
Tensor promoted_for_float(const Tensor& t) { return cf::is_floating(t.dtype()) ? t : cf::to(t, cf::kFloat32); }

// The dtype kind of a NumPy value h (an object with __array_interface__) when it is 0-d (np.float32(2), np.True_,
// np.array(3)): 'b', 'i', 'u', 'f', 'c', ...; 0 for an array with axes.
char numpy_scalar_kind(nb::handle h) {
  if (!nb::hasattr(h, "dtype") || nb::len(nb::object(h.attr("shape"))) != 0) return 0;
  const std::string kind = nb::cast<std::string>(nb::str(nb::object(h.attr("dtype").attr("kind"))));
  return kind.size() == 1 ? kind[0] : 0;
}

// A failed __index__ / __float__ conversion that says "not a number" (TypeError, ValueError) is cleared; any other
// error (KeyboardInterrupt, MemoryError) propagates.
void clear_conversion_error() {
  if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError)) throw nb::python_error();
  PyErr_Clear();
}

// Whether h has axes (a shape of length > 0): a one-element torch tensor of shape (1, 1) is no number.
bool has_axes(nb::handle h) {
  PyObject* shape = PyObject_GetAttrString(h.ptr(), "shape");
  if (!shape) {  // (no such attribute; any other error raised by a property propagates)
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();
    PyErr_Clear();
    return false;
  }
  const Py_ssize_t n = PyObject_Length(nb::steal(shape).ptr());
  if (n < 0) clear_conversion_error();
  return n > 0;
}

// The other operand of an operator, a function form (cf.add(t, 2.5)) or an in-place operator when it is not a
// cf.Tensor: a Python or NumPy number is a number (an int taking the tensor's dtype, cf's rule; exactly, as a 0-d
// int64 tensor, beyond 2^53 for an int64 tensor); a bool, Python's or NumPy's, is 0 or 1; a NumPy array
// becomes a tensor on the tensor's device (its values copied, NumPy's dtype); any other object with
// __index__ or __float__ and no axes (a 0-d torch tensor, a Fraction) is an int or a float number.
struct Operand {
  std::variant<Tensor, double> value;
  bool float_number = false;  // a float: promotes an integer or bool tensor in arithmetic (promoted_for_float)
  bool array = false;         // a NumPy array (value a tensor of NumPy's dtype)
};

// h as an Operand beside like (GIL held); nothing for what is none of the above (an operator answers
// NotImplemented, a function form a TypeError naming op). A complex number is a TypeError naming op (cf has
// no complex dtype; a NumPy complex scalar lost its imaginary part without a word), or nothing with
// complex_is_other (comparisons: t == 1j is False, as it was).
std::optional<Operand> number_operand(nb::handle h, const Tensor& like, const char* op, bool complex_is_other = false) {
  auto complex = [&](const std::string& what) -> std::optional<Operand> {
    if (complex_is_other) return std::nullopt;
    throw nb::type_error(cf::str("[", op, "] cf has no complex dtype: got ", what).c_str());
  };
  auto number = [&](nb::handle n, bool is_float) -> Operand {
    if (!is_float)
      if (auto exact = exact_int64_operand(n, like, op)) return {*exact, false};
    return {nb::cast<double>(nb::float_(n)), is_float};
  };
  if (PyLong_Check(h.ptr())) return number(h, false);  // (bool too: a PyLong)
  if (PyFloat_Check(h.ptr())) return number(h, true);   // (NumPy's float64 scalar too: a float subclass)
  if (nb::isinstance<Tensor>(h)) return std::nullopt;
  if (nb::hasattr(h, "__array_interface__")) {
    switch (numpy_scalar_kind(h)) {
      case 0: return Operand{tensor_from_python(h, std::nullopt, like.device()), false, true};  // an array
      case 'b': return number(PyObject_IsTrue(h.ptr()) == 1 ? Py_True : Py_False, false);  // np.True_ as True
      case 'i': case 'u': return number(nb::int_(h), false);  // np.int64(2**53 + 1) exactly
      case 'f': return number(h, true);
      case 'c':
        return complex(cf::str(nb::cast<std::string>(nb::str(h)), " of ",
                               nb::cast<std::string>(nb::str(nb::object(h.attr("dtype"))))));
      default: return std::nullopt;  // (a 0-d datetime, string, object array)
    }
  }
  if (PyComplex_Check(h.ptr())) return complex(nb::cast<std::string>(nb::repr(h)));
  const bool index = PyIndex_Check(h.ptr()), to_float = nb::hasattr(h, "__float__");
  if ((!index && !to_float) || has_axes(h)) return std::nullopt;
  if (index) {  // (a float torch tensor has __index__ too, which refuses it: then __float__)
    if (PyObject* i = PyNumber_Index(h.ptr())) return number(nb::steal(i), false);
    clear_conversion_error();
  }
  if (to_float) {
    const double v = PyFloat_AsDouble(h.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
      clear_conversion_error();
      return std::nullopt;
    }
    return Operand{v, true};
  }
  return std::nullopt;
}

// A NumPy array operand of an in-place operator, in t's dtype when it is bool or integer and t is numeric (an int
// array into a float tensor, int32 into int64), as NumPy stores an in-place result; a float array keeps its dtype
// (into a float t the write computes in the wider one; into an integer t it is refused, as by NumPy and PyTorch).
Tensor stored_as(const Tensor& t, const Tensor& array) {
  if (array.dtype() == t.dtype() || cf::is_floating(array.dtype()) || t.dtype() == cf::kBool) return array;
  return cf::to(array, t.dtype());
}

// f(t, b) for an operand taken by number_operand, with the GIL released; t promoted first when the operand is a
// float number and promote is set (arithmetic; comparisons compare exactly: cf::ops::compare_operand).
template <typename F>
Tensor apply_operand(const Tensor& t, const Operand& o, bool promote, F f) {
  nb::gil_scoped_release g;
  const Tensor a = promote && o.float_number ? promoted_for_float(t) : t;
  return std::visit([&](const auto& b) { return Tensor(f(a, b)); }, o.value);
}

// The TypeError of a function form or an in-place operator for an operand number_operand does not take.
[[noreturn]] void refuse_operand(const char* op, nb::handle h) {
  throw nb::type_error(cf::str("[", op, "] other must be a cf.Tensor, a number or a NumPy operand, got ",
                               nb::type_name(h.type()).c_str()).c_str());
}

// f(t, b) for the other operand h of a function form (cf.add(t, 3), cf.div(t, 2.5)), taken as the operators take
// it (number_operand), t promoted by a float number; anything else a TypeError naming the op.
template <typename F>
Tensor with_number(const char* op, const Tensor& t, nb::handle h, F f) {
  auto o = number_operand(h, t, op);
  if (!o) refuse_operand(op, h);
  return apply_operand(t, *o, true, f);
}

// PyTorch refuses subtraction with a bool tensor (~ or logical_not inverts a mask); cf's sub refuses bool
// tensors too, but a float number would first promote one to float32 (b - 1.5 ran): checked on t as given.
void check_sub_not_bool(const Tensor& t, const char* op = "sub") {
  CF_CHECK(t.dtype() != cf::kBool, DTypeError, "[", op, "] subtraction with a bool tensor (", t.describe(),
           ") is not supported, as in PyTorch: ~ or cf.logical_not inverts a mask");
}
template <typename A, typename B>
Tensor subtract(const Tensor& t, const A& a, const B& b) {
  check_sub_not_bool(t);
  return a - b;
}

Tensor with_grad(Tensor t, bool requires_grad) {
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// A fill value (full, scalar, full_like, fill_, masked_fill): a Python int arrives as int64, anything else as a
// double. cf's fill takes a double; an int64 target gets an integer a double cannot hold (|v| > 2^53) exactly,
// through a 0-d int64 tensor (cf.full([1], 2**62 + 1, dtype=cf.int64) held 2**62, where cf.tensor and t[i] = v
// were exact).
using FillValue = std::variant<int64_t, double>;
std::optional<Tensor> exact_int64_fill(const FillValue& v, cf::DType dtype, cf::Device device) {
  if (dtype != cf::kInt64 || !std::holds_alternative<int64_t>(v)) return std::nullopt;
  return exact_int64_tensor(std::get<int64_t>(v), device);
}
double fill_double(const FillValue& v) { return std::visit([](auto x) { return double(x); }, v); }
Tensor full_of(const cf::Shape& shape, const FillValue& v, cf::DType dtype, cf::Device device) {
  if (auto exact = exact_int64_fill(v, dtype, device)) {
    Tensor t = Tensor::full(shape, 0.0, dtype, device);  // (full's checks and errors)
    cf::copy_(t, *exact);
    return t;
  }
  return Tensor::full(shape, fill_double(v), dtype, device);
}

#define CF_UNARY(name, doc) fn_and_method(m, cls, #name, [](const Tensor& x) { return cf::name(x); }, doc)

// (defined with the operators below)
Tensor true_divide(const Tensor& a, double b);
Tensor py_floor_divide(const Tensor& a, const Tensor& b);
Tensor py_remainder(const Tensor& a, const Tensor& b);
Tensor div_rounded(const Tensor& a, const Tensor& b, const std::optional<std::string>& mode);
Tensor integer_operand(const Tensor& like, const Tensor& b, const char* op);
Tensor integer_operand(const Tensor& like, double b, const char* op);
Tensor power(const Tensor& a, double p, const char* op = "pow");
Tensor power(const Tensor& a, const Tensor& p);
void check_int_power(const Tensor& t, nb::handle h, const char* op);

void bind_elementwise(nb::module_& m, TensorCls& cls) {
  // ---- binary arithmetic: tensor (op) tensor, tensor (op) number ----
#define CF_BINARY(name, doc)                                                                            \
  m.def(#name, [](const Tensor& a, const Tensor& b) { return cf::name(a, b); }, nb::arg("a"), nb::arg("b"), \
        doc, release_gil());                                                                            \
  m.def(#name, [](const Tensor& a, double b) { return cf::name(a, b); }, nb::arg("a"), nb::arg("b"), doc,  \
        release_gil());
  // Arithmetic with a number or NumPy operand, as the operators take it (with_number): an int takes a's dtype
  // (exactly beyond 2^53 for int64), a float promotes an integer or bool a to float32 (PyTorch's rule)
#define CF_ARITH(name, expr, doc)                                                                       \
  m.def(#name, [](const Tensor& a, const Tensor& b) { return cf::name(a, b); }, nb::arg("a"), nb::arg("b"), \
        doc, release_gil());                                                                            \
  m.def(#name, [](const Tensor& t, nb::handle h) {                                                       \
          return with_number(#name, t, h, [&](const Tensor& a, const auto& b) { return expr; });          \
        }, nb::arg("a"), nb::arg("b").none(), nb::sig("def " #name "(a: cf._cf.Tensor, b: float) -> cf._cf.Tensor"), doc);
  CF_ARITH(add, cf::add(a, b), "a + b with NumPy broadcasting; both operands of one dtype and device (a number b: an "
                "int takes a's dtype, a float promotes an integer or bool a to float32, as PyTorch).")
  CF_ARITH(sub, subtract(t, a, b), "a - b with broadcasting (a bool tensor refused, as PyTorch).")
  CF_ARITH(mul, cf::mul(a, b), "a * b with broadcasting.")
#undef CF_ARITH
  const char* pow_doc = "a ** b with broadcasting (an integer tensor to an int power stays integral, a bool one "
                        "becomes int64, a negative int power is refused, as PyTorch).";
  m.def("pow", [](const Tensor& a, const Tensor& b) { return cf::pow(a, b); }, nb::arg("a"), nb::arg("b"), pow_doc,
        release_gil());
  m.def("pow", [](const Tensor& t, nb::handle h) {
          check_int_power(t, h, "pow");  // (on the Python number, with the GIL: with_number lets it go)
          return with_number("pow", t, h, [](const Tensor& a, const auto& b) { return power(a, b); });
        }, nb::arg("a"), nb::arg("b").none(), nb::sig("def pow(a: cf._cf.Tensor, b: float) -> cf._cf.Tensor"), pow_doc);
  CF_BINARY(eq, "a == b elementwise, bool (never differentiable).")
  CF_BINARY(ne, "a != b elementwise, bool.")
  CF_BINARY(lt, "a < b elementwise, bool.")
  CF_BINARY(le, "a <= b elementwise, bool.")
  CF_BINARY(gt, "a > b elementwise, bool.")
  CF_BINARY(ge, "a >= b elementwise, bool.")
#undef CF_BINARY
  // torch.div: exact unless rounding_mode says otherwise (integer tensors give float32, as /); C++'s cf::div
  // truncates integer tensors, which rounding_mode="trunc" gives here
  const char* div_doc = "a / b with broadcasting, divided exactly (integer tensors give float32), as Python's / and "
                        "torch.div; rounding_mode='trunc' rounds the quotient toward zero (integer tensors exactly, "
                        "as C++'s cf::div), 'floor' down (as //). Integer division by zero is an error.";
  m.def("div", [](const Tensor& a, const Tensor& b, std::optional<std::string> mode) { return div_rounded(a, b, mode); },
        nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("rounding_mode") = nb::none(), div_doc, release_gil());
  // a number b: an int against an integer tensor stays an integer division (exactly); a float divides in floats
  m.def("div", [](const Tensor& a, nb::handle b, std::optional<std::string> mode) {
          return with_number("div", a, b, [&](const Tensor& x, const auto& y) {
            return div_rounded(x, integer_operand(x, y, "div"), mode);
          });
        }, nb::arg("a"), nb::arg("b").none(), nb::kw_only(), nb::arg("rounding_mode") = nb::none(),
        nb::sig("def div(a: cf._cf.Tensor, b: float, *, rounding_mode: str | None = None) -> cf._cf.Tensor"), div_doc);
  // torch.round(x, decimals=): halves to even; decimals != 0 rounds x * 10^decimals and divides back (PyTorch's
  // formula, so round(2.675, decimals=2) is 2.67 there too: 267.49999... in binary)
  fn_and_method(m, cls, "round", [](const Tensor& x, int64_t decimals) {
                  if (decimals == 0) return cf::round(x);
                  CF_CHECK(cf::is_floating(x.dtype()), DTypeError, "[round] decimals= takes a float tensor, got ",
                           x.describe());
                  const double scale = std::pow(10.0, double(decimals < 0 ? -decimals : decimals));
                  return decimals > 0 ? cf::round(x * scale) / scale : cf::round(x / scale) * scale;
                }, "x rounded to the nearest integer value, halves to even (torch.round; int64 as it is); decimals "
                   "rounds to that many decimal places. Not differentiable: no graph.", nb::kw_only(),
                nb::arg("decimals") = 0);
  // (and a number as the divisor: an int takes a's dtype, a float promotes an integer a to float32, as PyTorch)
  const char* floor_divide_doc = "a // b: the quotient rounded down (torch.floor_divide).";
  const char* remainder_doc = "a % b: the remainder with the divisor's sign (torch.remainder).";
  fn_and_method(m, cls, "floor_divide", [](const Tensor& a, const Tensor& b) { return py_floor_divide(a, b); },
                floor_divide_doc, nb::arg("other"));
  auto floor_divide_number = [](const Tensor& a, nb::handle b) {
    return with_number("floor_divide", a, b, [](const Tensor& x, const auto& y) {
      return py_floor_divide(x, integer_operand(x, y, "floor_divide"));
    });
  };
  CF_NUMBER_FN_AND_METHOD("floor_divide", floor_divide_number, floor_divide_doc)
  fn_and_method(m, cls, "remainder", [](const Tensor& a, const Tensor& b) { return py_remainder(a, b); },
                remainder_doc, nb::arg("other"));
  auto remainder_number = [](const Tensor& a, nb::handle b) {
    return with_number("remainder", a, b, [](const Tensor& x, const auto& y) {
      return py_remainder(x, integer_operand(x, y, "remainder"));
    });
  };
  CF_NUMBER_FN_AND_METHOD("remainder", remainder_number, remainder_doc)
  m.def(cf::opname::maximum, &cf::maximum, nb::arg("a"), nb::arg("b"), "Elementwise max; ties send the gradient to a.", release_gil());
  m.def(cf::opname::minimum, &cf::minimum, nb::arg("a"), nb::arg("b"), "Elementwise min; ties send the gradient to a.", release_gil());
  m.def(cf::opname::logical_and, &cf::logical_and, nb::arg("a"), nb::arg("b"), "a AND b of bool tensors, broadcast.", release_gil());
  m.def(cf::opname::logical_or, &cf::logical_or, nb::arg("a"), nb::arg("b"), "a OR b of bool tensors, broadcast.", release_gil());
  m.def(cf::opname::logical_not, &cf::logical_not, nb::arg("x"), "NOT x of a bool tensor.", release_gil());
  cls.def(cf::opname::maximum, &cf::maximum, nb::arg("other"), "Elementwise max; ties send the gradient to self.", release_gil());
  cls.def(cf::opname::minimum, &cf::minimum, nb::arg("other"), "Elementwise min; ties send the gradient to self.", release_gil());
  cls.def(cf::opname::logical_not, &cf::logical_not, "NOT of a bool tensor.", release_gil());
  m.def(cf::opname::where, nb::overload_cast<const Tensor&, const Tensor&, const Tensor&>(&cf::where), nb::arg("cond"),
        nb::arg("a"), nb::arg("b"), "cond ? a : b, broadcasting all three; differentiable in a and b.", release_gil());
  m.def(cf::opname::where, nb::overload_cast<const Tensor&, const Tensor&, double>(&cf::where), nb::arg("cond"), nb::arg("a"),
        nb::arg("b"), release_gil());

  // ---- unary ----
  CF_UNARY(neg, "-x.");
  CF_UNARY(abs, "|x|.");
  CF_UNARY(sign, "Sign of x (not differentiable: no graph).");
  CF_UNARY(floor, "The largest integer value <= x (int64 as it is; not differentiable: no graph).");
  CF_UNARY(ceil, "The smallest integer value >= x (int64 as it is; not differentiable: no graph).");
  CF_UNARY(trunc, "x rounded toward zero (int64 as it is; not differentiable: no graph).");
  CF_UNARY(square, "x * x.");
  CF_UNARY(exp, "e^x.");
  CF_UNARY(log, "Natural logarithm.");
  CF_UNARY(sqrt, "Square root.");
  CF_UNARY(rsqrt, "1 / sqrt(x).");
  CF_UNARY(sin, "Sine.");
  CF_UNARY(cos, "Cosine.");
  CF_UNARY(tanh, "Hyperbolic tangent.");
  CF_UNARY(sigmoid, "1 / (1 + e^-x).");
  CF_UNARY(relu, "max(x, 0).");
  CF_UNARY(gelu, "GELU, exact (erf) form.");
  CF_UNARY(reciprocal, "1 / x.");
  CF_UNARY(log1p, "log(1 + x).");
  CF_UNARY(expm1, "e^x - 1.");
  CF_UNARY(erf, "The error function.");
  fn_and_method(m, cls, cf::opname::leaky_relu, [](const Tensor& x, double s) { return cf::leaky_relu(x, s); },
                "x where x > 0, else negative_slope * x.", nb::arg("negative_slope") = 0.01);
  fn_and_method(m, cls, cf::opname::clamp,
                [](const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
                  CF_CHECK(lo || hi, ValueError, "[clamp] give low (min), high (max) or both (", x.describe(), ")");
                  constexpr double kInf = std::numeric_limits<double>::infinity();
                  return cf::clamp(x, lo ? *lo : -kInf, hi ? *hi : kInf);
                },
                "x limited to [low, high]; None leaves that side open.", nb::arg("low") = nb::none(),
                nb::arg("high") = nb::none());

  // ---- copies and casts ----
  m.def(cf::opname::to, nb::overload_cast<const Tensor&, cf::DType>(&cf::to), nb::arg("x"), nb::arg("dtype"),
        "A new tensor with the dtype converted; differentiable between float dtypes.", release_gil());
  m.def(cf::opname::to, nb::overload_cast<const Tensor&, cf::Device>(&cf::to), nb::arg("x"), nb::arg("device"),
        "A copy on device (x itself when it is there already); differentiable.", release_gil());
  cls.def("to", [](const Tensor& x, cf::DType d) { return cf::to(x, d); }, nb::arg("dtype"), release_gil(),
          "Convert the dtype (differentiable between float dtypes).");
  cls.def("to", [](const Tensor& x, cf::Device d) { return cf::to(x, d); }, nb::arg("device"), release_gil(),
          "Move to a device (\"cpu\", \"cuda:0\", ...); differentiable.");
  // A string names a dtype ("float64") or a device ("cuda:0"): before, a dtype's name went to the device
  // parser through nanobind's implicit conversion, which printed a warning and raised a bare TypeError.
  // (After the DType and Device overloads: nanobind tries those first without conversions.)
  auto to_named = [](const Tensor& x, const std::string& name) {
    for (cf::DType d : {cf::kFloat32, cf::kFloat64, cf::kInt64, cf::kBool, cf::kBFloat16, cf::kFloat16})
      if (name == cf::dtype_name(d)) return cf::to(x, d);
    CF_CHECK(name.rfind("cpu", 0) == 0 || name.rfind("cuda", 0) == 0, ValueError, "[to] '", name,
             "' names no dtype (float32, float64, int64, bool, bfloat16, float16) and no device (cpu, cuda, cuda:N)");
    return cf::to(x, cf::Device::parse(name));
  };
  const char* to_named_doc = "Convert to a dtype or move to a device, named by a string.";
  cls.def("to", to_named, nb::arg("dtype"), release_gil(), to_named_doc);
  cls.def("to", to_named, nb::arg("device"), release_gil(), to_named_doc);
  m.def(cf::opname::to, to_named, nb::arg("x"), nb::arg("dtype"), release_gil(), to_named_doc);
  m.def(cf::opname::to, to_named, nb::arg("x"), nb::arg("device"), release_gil(), to_named_doc);
  cls.def("cpu", &Tensor::cpu, release_gil(), "A copy on the CPU (self when already there).");
  cls.def("cuda", &Tensor::cuda, nb::arg("index") = 0, release_gil(), "A copy on cuda:index.");
  cls.def("float", [](const Tensor& x) { return cf::to(x, cf::kFloat32); }, release_gil());
  cls.def("double", [](const Tensor& x) { return cf::to(x, cf::kFloat64); }, release_gil());
  cls.def("long", [](const Tensor& x) { return cf::to(x, cf::kInt64); }, release_gil());
  CF_UNARY(contiguous, "x itself when contiguous, else a contiguous copy (differentiable).");
  CF_UNARY(clone, "Always a new contiguous copy (differentiable).");
  m.def("zeros_like", &cf::zeros_like, nb::arg("x"), "Zeros of x's shape, dtype and device.", release_gil());
  m.def("ones_like", &cf::ones_like, nb::arg("x"), "Ones of x's shape, dtype and device.", release_gil());
  m.def("full_like", [](const Tensor& x, const FillValue& v) {
          if (auto exact = exact_int64_fill(v, x.dtype(), x.device())) {
            Tensor t = cf::full_like(x, 0.0);
            return cf::copy_(t, *exact);
          }
          return cf::full_like(x, fill_double(v));
        },
        nb::arg("x"), nb::arg("value"), "value in x's shape, dtype and device.", release_gil());

  // ---- in place (bump the version counter; refused on tensors that require
  // grad while grad mode is on: use cf.no_grad(), as optimizers do) ----
  auto inplace = [&](const char* name, auto f, const char* doc, auto... extra) {
    m.def(name, f, nb::arg("t"), extra..., nb::rv_policy::reference, doc, release_gil());
    cls.def(name, f, extra..., nb::rv_policy::reference, doc, release_gil());
  };
  inplace("add_", [](Tensor& t, const Tensor& o, double alpha) -> Tensor& { return cf::add_(t, o, alpha); },
          "t += alpha * other, in place; returns t.", nb::arg("other"), nb::arg("alpha") = 1.0);
  inplace("mul_", [](Tensor& t, double s) -> Tensor& { return cf::mul_(t, s); }, "t *= s, in place.", nb::arg("s"));
  inplace("fill_", [](Tensor& t, const FillValue& v) -> Tensor& {
            if (auto exact = exact_int64_fill(v, t.dtype(), t.device())) return cf::copy_(t, *exact);
            return cf::fill_(t, fill_double(v));
          }, "Set every element to value.", nb::arg("value"));
  inplace("zero_", [](Tensor& t) -> Tensor& { return cf::zero_(t); }, "Set every element to 0.");
  inplace("masked_fill_", [](Tensor& t, const Tensor& mask, const FillValue& v) -> Tensor& {
            if (auto exact = exact_int64_fill(v, t.dtype(), t.device())) {  // (an int64 beyond 2^53 is not a double)
              cf::masked_fill_(t, mask, 0.0);  // every check, under this op's name
              return cf::copy_(t, cf::where(mask, *exact, t));
            }
            return cf::masked_fill_(t, mask, fill_double(v));
          }, "Set the elements where mask (bool, broadcast to t) is true to value, in place; returns t.",
          nb::arg("mask"), nb::arg("value"));
  inplace("copy_", [](Tensor& t, const Tensor& src) -> Tensor& { return cf::copy_(t, src); },
          "Copy src (broadcast to t's shape, dtype converted) into t.", nb::arg("src"));
}

// The other operand of & | ^ as a tensor: a number takes the tensor's dtype (True for a bool tensor: t | True),
// and the logical ops refuse what is not bool, naming it.
Tensor logical_operand(const Tensor&, const Tensor& b, const char*) { return b; }
Tensor logical_operand(const Tensor& a, double b, const char* op) { return cf::ops::number_like(a, b, op); }
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&a, &b})
    CF_CHECK(t->dtype() == cf::kBool, DTypeError, "[logical_xor] argument '", t == &a ? "a" : "b",
             "' must be bool, got ", t->describe());
  return cf::ne(a, b);
}

// Python's / divides exactly (3 / 2 is 1.5), as NumPy's and PyTorch's: an integer or bool operand becomes the
// other operand's float dtype, or float32 (PyTorch's default) when neither is floating. (With cf's truncating
// division, `correct / total` of integer counts was a silent 0: the most common bug of scripts ported from
// PyTorch.) cf.div and C++'s operator/ keep C++'s truncation.
Tensor floating(const Tensor& t, const Tensor& other) {
  if (cf::is_floating(t.dtype())) return t;
  return cf::to(t, cf::is_floating(other.dtype()) ? other.dtype() : cf::kFloat32);
}
Tensor true_divide(const Tensor& a, const Tensor& b) { return floating(a, b) / floating(b, a); }
// t in other's float dtype when t is an integer tensor and other a float one (else t as it is)
Tensor floating_if(const Tensor& t, const Tensor& other) {
  return cf::is_floating(other.dtype()) && !cf::is_floating(t.dtype()) ? cf::to(t, other.dtype()) : t;
}
Tensor true_divide(const Tensor& a, double b) { return promoted_for_float(a) / b; }
// t ** p for an int number p (a float p promoted t first): an integer tensor stays integral and a bool one becomes
// int64, as PyTorch (i ** 3 was refused while i ** cf.tensor(3) ran), through the tensor-exponent pow. A
// negative p is refused before, on the Python number (check_int_power).
// A bool tensor in a power counts as int64, base or exponent, as PyTorch's (b ** 2 and 3 ** b are int64).
Tensor bool_as_int64(const Tensor& t) { return t.dtype() == cf::kBool ? cf::to(t, cf::kInt64) : t; }
Tensor power(const Tensor& a, double p, const char* op) {
  if (cf::is_floating(a.dtype())) return cf::pow(a, p);
  const Tensor x = bool_as_int64(a);
  return cf::pow(x, cf::ops::number_like(x, p, op));
}
Tensor power(const Tensor& a, const Tensor& p) {  // (p: a NumPy array, or an int beyond 2^53 for an int64 a)
  return cf::pow(bool_as_int64(a), p);
}
// number ** t
template <typename B>
Tensor reflected_power(const Tensor& a, const B& b) {
  const Tensor e = bool_as_int64(a);
  return cf::pow(integer_operand(e, b, "pow"), e);
}

// PyTorch refuses an integer or bool tensor to a negative int power (a Python int or a NumPy integer; an array
// of powers runs, as a tensor of them does): checked on the number itself, with the GIL held, so that an int
// beyond 2^53 (which travels as a 0-d tensor) is refused too and the message shows it exactly.
void check_int_power(const Tensor& t, nb::handle h, const char* op) {
  if (cf::is_floating(t.dtype()) || PyBool_Check(h.ptr()) || PyFloat_Check(h.ptr())) return;
  bool is_int = PyLong_Check(h.ptr());
  if (!is_int && nb::hasattr(h, "__array_interface__")) {
    const char kind = numpy_scalar_kind(h);
    is_int = kind == 'i' || kind == 'u';
  } else if (!is_int) {
    is_int = PyIndex_Check(h.ptr()) && !has_axes(h);
  }
  if (!is_int) return;
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) {
    clear_conversion_error();
    return;
  }
  nb::object zero = nb::int_(0);
  CF_CHECK(PyObject_RichCompareBool(i.ptr(), zero.ptr(), Py_LT) != 1, ValueError, "[", op,
           "] integers to negative integer powers are not allowed (as in PyTorch): ", t.describe(), " ** ",
           nb::cast<std::string>(nb::str(i)), " (convert the tensor with .float() first)");
}
Tensor true_divide(double a, const Tensor& b) {
  const Tensor fb = promoted_for_float(b);
  return cf::ops::number_like(fb, a, "div") / fb;
}

// t /= u stores the exact quotient in t: an integer tensor cannot hold it (PyTorch refuses this too).
void check_exact_quotient_fits(const Tensor& a) {
  CF_CHECK(cf::is_floating(a.dtype()), DTypeError, "[div_] t /= u on ", a.describe(),
           ": / divides exactly and an integer tensor cannot hold the quotient; write t = t / u (a float result) "
           "or t //= u (rounded down)");
}

// Python's // and % (torch.floor_divide, torch.remainder) on tensors: cf::floor_divide and cf::remainder (the
// quotient rounded down and the remainder with the divisor's sign; int64 exactly, floats from fmod as Python
// and PyTorch); an integer operand beside a float one takes its float dtype, as /. Bool tensors are refused.
void check_not_bool(const Tensor& t, const char* op) {
  CF_CHECK(t.dtype() != cf::kBool, DTypeError, "[", op, "] is not defined for bool tensors: ", t.describe());
}
// t //= u and t %= u: the result must fit t (an integer t and a float u give a float, which PyTorch refuses
// too), and u must not require grad (the write is not recorded: its gradient would be lost without a word).
void check_inplace_quotient(const Tensor& a, const Tensor& b, const char* op, const char* sym) {
  CF_CHECK(cf::is_floating(a.dtype()) || !cf::is_floating(b.dtype()), DTypeError, "[", op, "] t ", sym, "= u on ",
           a.describe(), " with ", b.describe(), ": the result is floating and an integer tensor cannot hold it; "
           "write t = t ", sym, " u");
  cf::ops::check_inplace_source(b, op);
}
Tensor integer_operand(const Tensor& like, const Tensor& b, const char*) { return b; }
Tensor integer_operand(const Tensor& like, double b, const char* op) { return cf::ops::number_like(like, b, op); }
Tensor py_floor_divide(const Tensor& a, const Tensor& b) {
  check_not_bool(a, "floor_divide");
  check_not_bool(b, "floor_divide");
  return cf::floor_divide(floating_if(a, b), floating_if(b, a));
}
Tensor py_remainder(const Tensor& a, const Tensor& b) {
  check_not_bool(a, "remainder");
  check_not_bool(b, "remainder");
  return cf::remainder(floating_if(a, b), floating_if(b, a));
}

// torch.div's rounding_mode: None divides exactly (as /), "trunc" rounds the quotient toward zero (integer
// tensors through cf's own division, exact), "floor" down (as //).
Tensor div_rounded(const Tensor& a, const Tensor& b, const std::optional<std::string>& mode) {
  if (!mode) return true_divide(a, b);
  if (*mode == "floor") return py_floor_divide(a, b);
  CF_CHECK(*mode == "trunc", ValueError, "[div] rounding_mode must be None, 'trunc' or 'floor', got '", *mode, "'");
  check_not_bool(a, "div");
  check_not_bool(b, "div");
  if (a.dtype() == cf::kInt64 && b.dtype() == cf::kInt64) return cf::div(a, b);
  return cf::trunc(true_divide(a, b));
}

// t op= <float number> on an integer or bool t: a float number makes the result floating (promoted_for_float,
// PyTorch's rule), which t cannot hold: refused, as PyTorch refuses it, whatever the value (until stop 75 a
// whole-valued float such as i //= 2.0 ran in t's dtype, while i = i // 2.0 is float32).
void check_inplace_float_number(const Tensor& a, const char* op, const char* sym) {
  CF_CHECK(cf::is_floating(a.dtype()), DTypeError, "[", op, "] t ", sym, "= <a float number> on ", a.describe(),
           ": a float number makes the result floating (PyTorch's rule) and an integer tensor cannot hold it; "
           "write t = t ", sym, " x");
}

// t op= u in place for every operand u: a cf.Tensor (the first overload), or anything number_operand takes,
// as a tensor (a NumPy array, an int64 beyond 2^53) or a number (a float number refused for an integer t:
// check_inplace_float_number). write(t, u) takes both kinds. One mechanism for the seven operators (they had
// int, double and NumPy-scalar overloads each, and NumPy arrays were refused by some).
template <typename Write>
void bind_inplace(TensorCls& cls, const char* py, const char* op, const char* sym, Write write,
                  void (*check_number)(const Tensor&, nb::handle, const char*) = nullptr) {
  // (check_inplace first: the checks every in-place op makes, under this operator's name, before anything is
  // computed; one element at several positions (an expand() view) too, which the write would name otherwise)
  cls.def(py, [write, op](Tensor& a, const Tensor& b) -> Tensor& {
        cf::ops::check_inplace(a, op);
        cf::ops::check_no_internal_overlap(a, op);
        return write(a, b);
      }, nb::rv_policy::reference, release_gil())
      .def(py, [=](Tensor& a, nb::handle h) -> Tensor& {
        cf::ops::check_inplace(a, op);
        cf::ops::check_no_internal_overlap(a, op);
        auto o = number_operand(h, a, op);
        if (!o) refuse_operand(op, h);
        if (check_number) check_number(a, h, op);
        if (o->float_number) check_inplace_float_number(a, op, sym);
        nb::gil_scoped_release g;
        if (o->array) o->value = stored_as(a, std::get<Tensor>(o->value));
        return std::visit([&](const auto& b) -> Tensor& { return write(a, b); }, o->value);
      }, nb::arg("other").none(), nb::rv_policy::reference);
}

// The value of f(a, u), taken without recording a graph, written into a (u's gradient would be lost: refused
// when u requires grad).
// t op= u with a tensor u: one dtype, or two floating ones (the result in the promoted dtype, stored in t's), as
// the arithmetic ops take them; named under the in-place operator (the product's own check said [mul]).
void check_operand_dtype(const Tensor& a, const Tensor& b, const char* op) {
  CF_CHECK(a.dtype() == b.dtype() || (cf::is_floating(a.dtype()) && cf::is_floating(b.dtype())), DTypeError, "[", op,
           "] ", a.describe(), " and a ", b.dtype(),
           " operand: tensor operands take one dtype (floating ones of two mix); convert one with .to(dtype)");
}

template <typename F>
Tensor& write_result(Tensor& a, const Tensor& u, const char* op, F f) {
  cf::ops::check_inplace_source(u, op);
  Tensor r = [&] { cf::NoGradGuard g; return f(a, u); }();
  return cf::copy_(a, r);
}

// t //= u and t %= u, F being py_floor_divide or py_remainder (Python's fallback t = t // u rebinds the name: a
// view or an alias kept its old values); the result must fit t (check_inplace_quotient).
template <Tensor (*F)(const Tensor&, const Tensor&)>
void bind_inplace_rounded(TensorCls& cls, const char* py, const char* op, const char* sym) {
  bind_inplace(cls, py, op, sym, [op, sym](Tensor& a, const auto& b) -> Tensor& {
    const Tensor u = integer_operand(a, b, op);
    check_not_bool(a, op);  // (F would name floor_divide / remainder)
    check_not_bool(u, op);
    check_inplace_quotient(a, u, op, sym);
    return write_result(a, u, op, F);
  });
}

void bind_operators(TensorCls& cls) {
  // Python operators. An int operand takes the tensor's dtype (one it cannot hold is refused); a float number
  // promotes an integer or bool tensor to float32 (promoted_for_float, PyTorch's rule). (Numbers and NumPy
  // operands of the arithmetic operators and the comparisons: CF_NP_BINARY below.)
  cls.def("__add__", [](const Tensor& a, const Tensor& b) { return a + b; }, release_gil())
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return a - b; }, release_gil())
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return a * b; }, release_gil())
      .def("__truediv__", [](const Tensor& a, const Tensor& b) { return true_divide(a, b); }, release_gil())
      .def("__floordiv__", [](const Tensor& a, const Tensor& b) { return py_floor_divide(a, b); }, release_gil())
      .def("__mod__", [](const Tensor& a, const Tensor& b) { return py_remainder(a, b); }, release_gil())
      .def("__pow__", [](const Tensor& a, const Tensor& b) { return cf::pow(a, b); }, release_gil())
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return cf::matmul(a, b); }, release_gil())
      .def("__neg__", [](const Tensor& a) { return -a; }, release_gil())
      .def("__pos__", [](const Tensor& a) { return a; })
      .def("__abs__", [](const Tensor& a) { return cf::abs(a); }, release_gil())
      .def("__invert__", [](const Tensor& a) { return cf::logical_not(a); }, release_gil())
      .def("__and__", [](const Tensor& a, const Tensor& b) { return cf::logical_and(a, b); }, release_gil())
      .def("__or__", [](const Tensor& a, const Tensor& b) { return cf::logical_or(a, b); }, release_gil())
      .def("__xor__", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); }, release_gil());
  // (A number compared with an integer or bool tensor runs exactly, in float64 when it is not one of the
  // tensor's values: cf::ops::compare_operand.)
#define CF_CMP(py, fn) cls.def(py, [](const Tensor& a, const Tensor& b) { return cf::fn(a, b); }, release_gil());
  CF_CMP("__eq__", eq)
  CF_CMP("__ne__", ne)
  CF_CMP("__lt__", lt)
  CF_CMP("__le__", le)
  CF_CMP("__gt__", gt)
  CF_CMP("__ge__", ge)
#undef CF_CMP
  // Numbers and NumPy operands (number_operand), either side (with __array_priority__, NumPy's scalars and
  // arrays defer to these, as they do for PyTorch's tensors: np.float32(2) * t and np.ones(3) + t are tensors).
  // Registered after the tensor overloads, which nanobind tries first: these take any object (None too)
  // and answer NotImplemented for what is not a number, so t == None stays False. Arithmetic (arith true)
  // with a float number promotes an integer or bool tensor to float32 first (promoted_for_float: PyTorch's
  // rule); comparisons compare exactly (cf::ops::compare_operand).
#define CF_NP_BINARY(py, op, arith, expr)                                                          \
  cls.def(py, [](const Tensor& t, nb::handle h) -> nb::object {                                    \
    auto o = number_operand(h, t, op, /*complex_is_other=*/!(arith));                               \
    if (!o) return nb::borrow(Py_NotImplemented);                                                  \
    return nb::cast(apply_operand(t, *o, arith, [&](const Tensor& a, const auto& b) { return expr; })); \
  }, nb::arg("other").none(), nb::sig("def " py "(self, other: object | None) -> cf._cf.Tensor"));
  CF_NP_BINARY("__add__", "add", true, a + b)
  CF_NP_BINARY("__radd__", "add", true, b + a)
  CF_NP_BINARY("__sub__", "sub", true, subtract(t, a, b))
  CF_NP_BINARY("__rsub__", "sub", true, subtract(t, b, a))
  CF_NP_BINARY("__mul__", "mul", true, a * b)
  CF_NP_BINARY("__rmul__", "mul", true, b * a)
  CF_NP_BINARY("__truediv__", "div", true, true_divide(a, b))
  CF_NP_BINARY("__rtruediv__", "div", true, true_divide(b, a))
  CF_NP_BINARY("__floordiv__", "floor_divide", true, py_floor_divide(a, integer_operand(a, b, "floor_divide")))
  CF_NP_BINARY("__rfloordiv__", "floor_divide", true, py_floor_divide(integer_operand(a, b, "floor_divide"), a))
  CF_NP_BINARY("__mod__", "remainder", true, py_remainder(a, integer_operand(a, b, "remainder")))
  CF_NP_BINARY("__rmod__", "remainder", true, py_remainder(integer_operand(a, b, "remainder"), a))
  // (t ** p: below, with check_int_power)
  CF_NP_BINARY("__rpow__", "pow", true, reflected_power(a, b))
  CF_NP_BINARY("__eq__", "eq", false, cf::eq(a, b))  // (a reflected == or != is the same operator; < reflects to >)
  CF_NP_BINARY("__ne__", "ne", false, cf::ne(a, b))
  CF_NP_BINARY("__lt__", "lt", false, cf::lt(a, b))
  CF_NP_BINARY("__le__", "le", false, cf::le(a, b))
  CF_NP_BINARY("__gt__", "gt", false, cf::gt(a, b))
  CF_NP_BINARY("__ge__", "ge", false, cf::ge(a, b))
  // & | ^ with a number or NumPy operand (np.True_ | t is a cf tensor, not NumPy's array of t)
  CF_NP_BINARY("__and__", "logical_and", false, cf::logical_and(a, logical_operand(a, b, "logical_and")))
  CF_NP_BINARY("__rand__", "logical_and", false, cf::logical_and(logical_operand(a, b, "logical_and"), a))
  CF_NP_BINARY("__or__", "logical_or", false, cf::logical_or(a, logical_operand(a, b, "logical_or")))
  CF_NP_BINARY("__ror__", "logical_or", false, cf::logical_or(logical_operand(a, b, "logical_or"), a))
  CF_NP_BINARY("__xor__", "logical_xor", false, logical_xor(a, logical_operand(a, b, "logical_xor")))
  CF_NP_BINARY("__rxor__", "logical_xor", false, logical_xor(logical_operand(a, b, "logical_xor"), a))
#undef CF_NP_BINARY
  cls.def("__pow__", [](const Tensor& t, nb::handle h) -> nb::object {
    auto o = number_operand(h, t, "pow");
    if (!o) return nb::borrow(Py_NotImplemented);
    check_int_power(t, h, "pow");
    return nb::cast(apply_operand(t, *o, true, [](const Tensor& a, const auto& b) { return power(a, b); }));
  }, nb::arg("other").none(), nb::sig("def __pow__(self, other: object | None) -> cf._cf.Tensor"));
  // In place, as in NumPy and PyTorch (refused on a tensor that requires grad while grad mode is on), with a
  // tensor or any operand number_operand takes (bind_inplace): each write(a, b) takes a tensor or a number b.
  // t += u of another float dtype computes in the promoted dtype and stores in t's, as *= and /= do (and
  // PyTorch); add_ itself takes one dtype
  auto add_into = [](Tensor& a, const Tensor& b, double alpha, const char* op) -> Tensor& {
    // add_'s checks, under the operator's name (-= is sub_; cf::add_ would say add_); bind_inplace has run
    // check_inplace on a
    cf::ops::check_inplace_source(b, op);
    cf::ops::check_same_device(op, {&a, &b});
    CF_CHECK(cf::broadcast_shapes(a.shape(), b.shape(), op) == a.shape(), ShapeError, "[", op, "] cannot broadcast ",
             cf::shape_str(b.shape()), " into ", cf::shape_str(a.shape()));
    if (a.dtype() == b.dtype()) return cf::add_(a, b, alpha);
    check_operand_dtype(a, b, op);
    Tensor sum = [&] { cf::NoGradGuard g; return alpha == 1.0 ? a + b : a - b; }();
    return cf::copy_(a, sum);
  };
  auto add_write = [add_into](double alpha, const char* op) {
    return [add_into, alpha, op](Tensor& a, const auto& b) -> Tensor& {
      if (alpha < 0) check_sub_not_bool(a, op);
      if constexpr (std::is_same_v<std::decay_t<decltype(b)>, double>)
        return cf::add_(a, cf::ops::number_like(a, b, op), alpha);
      else
        return add_into(a, b, alpha, op);
    };
  };
  bind_inplace(cls, "__iadd__", "add_", "+", add_write(1.0, "add_"));
  bind_inplace(cls, "__isub__", "sub_", "-", add_write(-1.0, "sub_"));
  bind_inplace(cls, "__imul__", "mul_", "*", [](Tensor& a, const auto& b) -> Tensor& {
    if constexpr (std::is_same_v<std::decay_t<decltype(b)>, double>)
      return cf::mul_(a, b);  // in place, no temporary
    else
      return write_result(a, b, "mul_", [](const Tensor& x, const Tensor& y) {
        check_operand_dtype(x, y, "mul_");
        check_not_bool(x, "mul_");
        return x * y;
      });
  });
  // a /= b as a = a / b in a's dtype (before: a *= 1 / b, which zeroed an int64 tensor, as 1 / b
  // took its dtype, and rounded a float one differently from a / b)
  bind_inplace(cls, "__itruediv__", "div_", "/", [](Tensor& a, const auto& b) -> Tensor& {
    check_exact_quotient_fits(a);
    if constexpr (std::is_same_v<std::decay_t<decltype(b)>, double>) {
      Tensor q = [&] { cf::NoGradGuard g; return a / b; }();
      return cf::copy_(a, q);
    } else {
      return write_result(a, b, "div_", [](const Tensor& x, const Tensor& y) { return true_divide(x, y); });
    }
  });
  bind_inplace(cls, "__ipow__", "pow_", "**", [](Tensor& a, const auto& b) -> Tensor& {
    // a bool tensor to an int power is int64, which it cannot hold (PyTorch refuses it too)
    CF_CHECK(a.dtype() != cf::kBool, DTypeError, "[pow_] a power of a bool tensor (", a.describe(),
             ") is int64, which the bool tensor cannot hold in place (as in PyTorch); write b = b ** p");
    if constexpr (std::is_same_v<std::decay_t<decltype(b)>, double>) {
      Tensor p = [&] { cf::NoGradGuard g; return power(a, b, "pow_"); }();
      return cf::copy_(a, p);
    } else {
      return write_result(a, b, "pow_", [](const Tensor& x, const Tensor& y) {
        check_operand_dtype(x, y, "pow_");
        return cf::pow(x, y);
      });
    }
  }, check_int_power);
  bind_inplace_rounded<py_floor_divide>(cls, "__ifloordiv__", "floor_divide_", "//");
  bind_inplace_rounded<py_remainder>(cls, "__imod__", "remainder_", "%");
}

void bind_reductions(nb::module_& m, TensorCls& cls) {
  // axes: None (all axes), an int or a sequence; float inputs accumulate in double.
  auto axes_fn = [&](const char* name, Tensor (*f)(const Tensor&, const cf::Axes&, bool), const char* doc) {
    auto g = [f, name](const Tensor& x, nb::handle axes, bool keepdim) {
      cf::Axes a = to_axes(axes, name);
      nb::gil_scoped_release r;
      return f(x, a, keepdim);
    };
    m.def(name, g, nb::arg("x"), nb::arg("axes") = nb::none(), nb::arg("keepdim") = false, doc);
    cls.def(name, g, nb::arg("axes") = nb::none(), nb::arg("keepdim") = false, doc);
  };
  axes_fn(cf::opname::sum, &cf::sum, "Sum over axes (None: all); keepdim keeps them with size 1.");
  axes_fn(cf::opname::mean, &cf::mean, "Mean over axes (None: all).");
  axes_fn(cf::opname::logsumexp, &cf::logsumexp, "log(sum(exp(x))) over axes, computed stably.");
  axes_fn(cf::opname::amax, &cf::amax, "Max over several axes; the gradient is shared equally between tied maxima.");
  axes_fn(cf::opname::amin, &cf::amin, "Min over several axes; the gradient is shared equally between tied minima.");
  auto var = [](const Tensor& x, nb::handle axes, int64_t correction, bool keepdim) {
    cf::Axes a = to_axes(axes, "var");
    nb::gil_scoped_release r;
    return cf::var(x, a, correction, keepdim);
  };
  const char* var_doc = "Variance with `correction` subtracted from the count (1: unbiased).";
  m.def(cf::opname::var, var, nb::arg("x"), nb::arg("axes") = nb::none(), nb::arg("correction") = 1, nb::arg("keepdim") = false, var_doc);
  cls.def("var", var, nb::arg("axes") = nb::none(), nb::arg("correction") = 1, nb::arg("keepdim") = false, var_doc);

  // max/min: with an axis (values, indices) of the first extremum; without, the amax/amin of all.
  auto maxmin = [&](const char* name, cf::ValuesIndices (*f)(const Tensor&, int64_t, bool),
                    Tensor (*all)(const Tensor&, const cf::Axes&, bool)) {
    auto g = [f, all](const Tensor& x, std::optional<int64_t> axis, bool keepdim) -> nb::object {
      if (!axis) {
        Tensor t;
        {
          nb::gil_scoped_release r;
          t = all(x, {}, false);
        }
        return nb::cast(t);
      }
      cf::ValuesIndices v;
      {
        nb::gil_scoped_release r;
        v = f(x, *axis, keepdim);
      }
      return nb::cast(v);
    };
    const char* doc = "With an axis: (values, indices) of the first extremum along it (the gradient flows to that "
                      "index). Without: the extremum of all elements (as amax/amin).";
    const std::string result = " -> cf._cf.Tensor | tuple[cf._cf.Tensor, cf._cf.Tensor]";
    m.def(name, g, nb::arg("x"), nb::arg("axis") = nb::none(), nb::arg("keepdim") = false,
          nb::sig(("def " + std::string(name) + "(x: cf._cf.Tensor, axis: int | None = None, keepdim: bool = False)" +
                   result).c_str()),
          doc);
    cls.def(name, g, nb::arg("axis") = nb::none(), nb::arg("keepdim") = false,
            nb::sig(("def " + std::string(name) + "(self, axis: int | None = None, keepdim: bool = False)" + result)
                        .c_str()),
            doc);
  };
  maxmin(cf::opname::max, &cf::max, &cf::amax);
  maxmin(cf::opname::min, &cf::min, &cf::amin);
  // Without an axis: the index into the flattened tensor, as PyTorch's (keepdim: every axis kept with size 1).
  using ArgFn = Tensor (*)(const Tensor&, int64_t, bool);
  auto arg_extremum = [](ArgFn f) {
    return [f](const Tensor& x, std::optional<int64_t> a, bool k) {
      if (a) return f(x, *a, k);
      Tensor flat = f(cf::reshape(x, {-1}), 0, false);
      return k ? cf::reshape(flat, cf::Shape(size_t(x.dim()), 1)) : flat;
    };
  };
  fn_and_method(m, cls, cf::opname::argmax, arg_extremum([](const Tensor& x, int64_t a, bool k) { return cf::argmax(x, a, k); }),
                "Index (int64) of the first maximum along axis (None: of the flattened tensor).",
                nb::arg("axis") = nb::none(), nb::arg("keepdim") = false);
  fn_and_method(m, cls, cf::opname::argmin, arg_extremum([](const Tensor& x, int64_t a, bool k) { return cf::argmin(x, a, k); }),
                "Index (int64) of the first minimum along axis (None: of the flattened tensor).",
                nb::arg("axis") = nb::none(), nb::arg("keepdim") = false);
  m.def("sum_to", &cf::sum_to, nb::arg("g"), nb::arg("shape"),
        "Sum g down to shape (the inverse of broadcasting g from shape).", release_gil());
  m.def(cf::opname::matmul, &cf::matmul, nb::arg("a"), nb::arg("b"),
        "NumPy matmul: 1-d operands are promoted, leading batch axes broadcast; BLAS / cuBLAS underneath.",
        release_gil());
  cls.def("matmul", &cf::matmul, nb::arg("other"), release_gil());
  m.def(
      cf::opname::linear,
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) { return cf::linear(x, w, b ? *b : Tensor()); },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias") = nb::none(),
      "x W^T + b (torch.nn.functional.linear): weight (out_features, in_features), bias (out_features) or None; "
      "the weight's gradient comes in its own layout.",
      release_gil());
}

void bind_shape(nb::module_& m, TensorCls& cls) {
  fn_and_method(m, cls, cf::opname::reshape, [](const Tensor& x, const cf::Shape& s) { return cf::reshape(x, s); },
                "A view with the new shape when the strides allow it, else a copy; one entry may be -1.",
                nb::arg("shape"));
  fn_and_method(m, cls, "view", [](const Tensor& x, const cf::Shape& s) { return cf::view(x, s); },
                "Like reshape but never copies (cf.ShapeError when the strides forbid a view).", nb::arg("shape"));
  fn_and_method(m, cls, "flatten", [](const Tensor& x, int64_t a, int64_t b) { return cf::flatten(x, a, b); },
                "Merge axes start_axis..end_axis into one.", nb::arg("start_axis") = 0, nb::arg("end_axis") = -1);
  fn_and_method(m, cls, cf::opname::permute, [](const Tensor& x, const std::vector<int64_t>& a) { return cf::permute(x, a); },
                "A view with the axes reordered.", nb::arg("axes"));
  fn_and_method(m, cls, "transpose", [](const Tensor& x, int64_t a, int64_t b) { return cf::transpose(x, a, b); },
                "A view with two axes swapped.", nb::arg("axis0"), nb::arg("axis1"));
  fn_and_method(m, cls, cf::opname::slice,
                [](const Tensor& x, int64_t a, int64_t s, int64_t e, int64_t st) { return cf::slice(x, a, s, e, st); },
                "Elements start, start+step, ... < end along axis (a view; negative start/end count from the end, "
                "both clamped).",
                nb::arg("axis"), nb::arg("start"), nb::arg("end"), nb::arg("step") = 1);
  fn_and_method(m, cls, "narrow", [](const Tensor& x, int64_t a, int64_t s, int64_t l) { return cf::narrow(x, a, s, l); },
                "length elements from start along axis (a view; out of range is an error).", nb::arg("axis"),
                nb::arg("start"), nb::arg("length"));
  fn_and_method(m, cls, cf::opname::expand, [](const Tensor& x, const cf::Shape& s) { return cf::expand(x, s); },
                "Broadcast view to shape (-1 keeps a dimension).", nb::arg("shape"));
  fn_and_method(m, cls, "squeeze",
                [](const Tensor& x, std::optional<int64_t> a) { return a ? cf::squeeze(x, *a) : cf::squeeze(x); },
                "Remove size-1 axes (all, or the one given, which must have size 1).", nb::arg("axis") = nb::none());
  fn_and_method(m, cls, "unsqueeze", [](const Tensor& x, int64_t a) { return cf::unsqueeze(x, a); },
                "Insert a size-1 axis.", nb::arg("axis"));
  m.def(cf::opname::cat, &cf::cat, nb::arg("tensors"), nb::arg("axis") = 0, "Join along an existing axis (a copy).", release_gil());
  m.def(cf::opname::stack, &cf::stack, nb::arg("tensors"), nb::arg("axis") = 0, "Join along a new axis (a copy).", release_gil());
  fn_and_method(m, cls, cf::opname::pad,
                [](const Tensor& x, const std::vector<int64_t>& p, double v) { return cf::pad(x, p, v); },
                "Constant padding; pads = (before_last, after_last, before_second_last, ...) as torch's F.pad.",
                nb::arg("pads"), nb::arg("value") = 0.0);
  auto split = [](const Tensor& x, nb::handle size, int64_t axis) {
    int64_t each = 0;
    if (index_value(size, "split", "size", each)) {  // pieces of `each`
      nb::gil_scoped_release r;
      return cf::split(x, each, axis);
    }
    std::vector<int64_t> sizes = int64_or_list_arg(size, "split", "size");  // the pieces' sizes
    nb::gil_scoped_release r;
    return cf::split(x, sizes, axis);
  };
  const char* split_doc = "Views of pieces along axis: of `size` each (the last may be shorter), or of the given "
                          "sizes (adding up to the axis length).";
  m.def("split", split, nb::arg("x"), nb::arg("size"), nb::arg("axis") = 0, split_doc);
  cls.def("split", split, nb::arg("size"), nb::arg("axis") = 0, split_doc);
  // ---- reordering, tiling and running sums (copies)
  m.def(cf::opname::cumsum,
        [](const Tensor& x, int64_t axis, std::optional<cf::DType> dtype) {
          return cf::cumsum(dtype ? cf::to(x, *dtype) : x, axis);
        },
        nb::arg("x"), nb::arg("axis"), nb::arg("dtype") = nb::none(), release_gil(),
        "Running sums along axis (torch.cumsum): int64 and bool give int64, floats keep their dtype (dtype= "
        "converts x first); float sums accumulate in double. Differentiable.");
  cls.def(cf::opname::cumsum,
          [](const Tensor& x, int64_t axis, std::optional<cf::DType> dtype) {
            return cf::cumsum(dtype ? cf::to(x, *dtype) : x, axis);
          },
          nb::arg("axis"), nb::arg("dtype") = nb::none(), release_gil(), "cf.cumsum(self, axis, dtype).");
  auto flip = [](const Tensor& x, nb::handle axes) {
    std::vector<int64_t> a = int64_or_list_arg(axes, "flip", "axes");
    nb::gil_scoped_release r;
    return cf::flip(x, a);
  };
  const char* flip_doc = "A copy with the elements in reverse order along each of axes (an int or a sequence; "
                         "torch.flip).";
  m.def("flip", flip, nb::arg("x"), nb::arg("axes"),
        nb::sig("def flip(x: cf._cf.Tensor, axes: int | collections.abc.Sequence[int]) -> cf._cf.Tensor"), flip_doc);
  cls.def("flip", flip, nb::arg("axes"),
          nb::sig("def flip(self, axes: int | collections.abc.Sequence[int]) -> cf._cf.Tensor"), flip_doc);
  cls.def("flip", [flip](const Tensor& x, nb::args axes) { return flip(x, axes); },  // t.flip(0, 1)
          nb::arg("axes"), nb::sig("def flip(self, *axes: int) -> cf._cf.Tensor"), "PyTorch's spelling: t.flip(0, 1).");
  auto roll = [](const Tensor& x, nb::handle shifts, nb::handle axes) {
    std::vector<int64_t> s = int64_or_list_arg(shifts, "roll", "shifts");
    std::vector<int64_t> a;
    if (!axes.is_none()) a = int64_or_list_arg(axes, "roll", "axes");
    nb::gil_scoped_release r;
    return cf::roll(x, s, a);
  };
  const char* roll_doc = "A copy with the elements shifted by shifts along axes, wrapping around (torch.roll); "
                         "axes=None rolls x as if flattened (one shift), keeping its shape.";
  const char* roll_types = "shifts: int | collections.abc.Sequence[int], axes: int | collections.abc.Sequence[int] | "
                           "None = None) -> cf._cf.Tensor";
  m.def("roll", roll, nb::arg("x"), nb::arg("shifts"), nb::arg("axes") = nb::none(),
        nb::sig((std::string("def roll(x: cf._cf.Tensor, ") + roll_types).c_str()), roll_doc);
  cls.def("roll", roll, nb::arg("shifts"), nb::arg("axes") = nb::none(),
          nb::sig((std::string("def roll(self, ") + roll_types).c_str()), roll_doc);
  cls.def("repeat", [](const Tensor& x, nb::args sizes) {
    std::vector<int64_t> r = sizes.size() == 1 ? int64_or_list_arg(sizes[0], "repeat", "repeats")
                                               : int64_list_arg(sizes, "repeat", "repeats");
    nb::gil_scoped_release g;
    return cf::repeat(x, r);
  }, nb::arg("repeats"), nb::sig("def repeat(self, *repeats: int | collections.abc.Sequence[int]) -> cf._cf.Tensor"),
          "x tiled repeats[i] times along axis i (torch's Tensor.repeat): t.repeat(2, 3) or t.repeat([2, 3]); more "
          "counts than axes add leading axes.");
  m.def("tile", [](const Tensor& x, nb::handle reps) {
    std::vector<int64_t> r = int64_or_list_arg(reps, "tile", "reps");
    // torch.tile / numpy.tile: fewer counts than axes are padded with leading 1s
    if (int64_t(r.size()) < x.dim()) r.insert(r.begin(), size_t(x.dim() - int64_t(r.size())), 1);
    nb::gil_scoped_release g;
    return cf::repeat(x, r);
  }, nb::arg("x"), nb::arg("reps"),
        nb::sig("def tile(x: cf._cf.Tensor, reps: int | collections.abc.Sequence[int]) -> cf._cf.Tensor"),
        "x tiled reps[i] times along axis i (torch.tile, numpy.tile): fewer counts than axes repeat the last axes.");
  cls.def_prop_ro("T", [](const Tensor& x) {
    CF_CHECK(x.dim() == 2, ShapeError, "[T] needs a 2-d tensor, got ", x.describe(), " (use transpose/permute)");
    return cf::transpose(x, 0, 1);
  }, "The transpose of a 2-d tensor (a view).");
}

void bind_index(nb::module_& m, TensorCls& cls) {
  m.def(cf::opname::gather, &cf::gather, nb::arg("x"), nb::arg("axis"), nb::arg("index"),
        "out[i][j][k] = x[i][index[i][j][k]][k] (axis = 1); index (int64) has x's rank.", release_gil());
  m.def(cf::opname::scatter, &cf::scatter, nb::arg("x"), nb::arg("axis"), nb::arg("index"), nb::arg("src"),
        "out = x; out[i][index[i][j][k]][k] = src[i][j][k] (axis = 1; torch.scatter). Of several elements sent to one "
        "position the last along the axis is kept (and alone gets its gradient). Differentiable in x and src.",
        release_gil());
  cls.def(cf::opname::scatter, &cf::scatter, nb::arg("axis"), nb::arg("index"), nb::arg("src"),
          "cf.scatter(self, axis, index, src).", release_gil());
  // torch.scatter(x, dim, index, value=v): v at every position index names (an int exact in int64)
  fn_and_method(m, cls, cf::opname::scatter,
                [](const Tensor& x, int64_t axis, const Tensor& index, const FillValue& v) {
                  const Tensor src = full_of(index.shape(), v, x.dtype(), x.device());
                  return cf::scatter(x, axis, index, src);
                },
                "x with value at the positions index names along axis (torch.scatter's value= form).", nb::arg("axis"),
                nb::arg("index"), nb::arg("value"));
  m.def(cf::opname::scatter_add, &cf::scatter_add, nb::arg("x"), nb::arg("axis"), nb::arg("index"), nb::arg("src"),
        "out = x; out[i][index[i][j][k]][k] += src[i][j][k] (axis = 1). Differentiable in x and src.", release_gil());
  // In place, in O(index) (Tensor.scatter_ / scatter_add_ and the rest of the in-place scatter family, index
  // setitem, run on them: python/cf/_ops_extras.py, tensor.cpp)
  m.def("scatter_", [](Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) -> Tensor& {
          return cf::scatter_(x, axis, index, src);
        }, nb::arg("x"), nb::arg("axis"), nb::arg("index"), nb::arg("src"), nb::rv_policy::reference,
        "In place: x[i][index[i][j][k]][k] = src[i][j][k] (axis = 1), x's other elements untouched, in O(index); the "
        "last of several sent to one position is kept. Not recorded (refused on a tensor that requires grad while "
        "recording, and for a src that does). Returns x.", release_gil());
  m.def("scatter_add_", [](Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) -> Tensor& {
          return cf::scatter_add_(x, axis, index, src);
        }, nb::arg("x"), nb::arg("axis"), nb::arg("index"), nb::arg("src"), nb::rv_policy::reference,
        "In place: x[i][index[i][j][k]][k] += src[i][j][k] (axis = 1), in O(index). Not recorded, as scatter_. "
        "Returns x.", release_gil());
  m.def(cf::opname::index_select, &cf::index_select, nb::arg("x"), nb::arg("axis"), nb::arg("index"),
        "Rows of x along axis picked by a 1-d int64 index.", release_gil());
  m.def(cf::opname::index_add, &cf::index_add, nb::arg("x"), nb::arg("axis"), nb::arg("index"), nb::arg("src"),
        "out = x; out.select(axis, index[i]) += src.select(axis, i). Differentiable in x and src.", release_gil());
  m.def(cf::opname::take_along_dim, &cf::take_along_dim, nb::arg("x"), nb::arg("index"), nb::arg("axis"),
        "gather with NumPy broadcasting of index against x on the other axes.", release_gil());
  cls.def(cf::opname::gather, &cf::gather, nb::arg("axis"), nb::arg("index"), "cf.gather(self, axis, index).", release_gil());
  cls.def(cf::opname::scatter_add, &cf::scatter_add, nb::arg("axis"), nb::arg("index"), nb::arg("src"),
          "cf.scatter_add(self, axis, index, src).", release_gil());
  cls.def(cf::opname::index_select, &cf::index_select, nb::arg("axis"), nb::arg("index"),
          "cf.index_select(self, axis, index).", release_gil());
  cls.def(cf::opname::index_add, &cf::index_add, nb::arg("axis"), nb::arg("index"), nb::arg("src"),
          "cf.index_add(self, axis, index, src).", release_gil());
  cls.def(cf::opname::take_along_dim, &cf::take_along_dim, nb::arg("index"), nb::arg("axis"),
          "cf.take_along_dim(self, index, axis).", release_gil());
  fn_and_method(m, cls, cf::opname::masked_fill,
                [](const Tensor& x, const Tensor& mask, const FillValue& v) {
                  if (auto exact = exact_int64_fill(v, x.dtype(), x.device()))  // (0: checks mask against x; the
                    return cf::where(mask, *exact, cf::masked_fill(x, mask, 0.0));  // double may overflow int64)
                  return cf::masked_fill(x, mask, fill_double(v));
                },
                "x with value where mask (bool, broadcast to x) is true. Differentiable in x.", nb::arg("mask"),
                nb::arg("value"));
  m.def(cf::opname::one_hot, &cf::one_hot, nb::arg("labels"), nb::arg("num_classes"), nb::arg("dtype") = cf::kFloat32,
        "int64 labels in [0, num_classes) -> (..., num_classes) of 0/1.", release_gil());
}

void bind_sort(nb::module_& m, TensorCls& cls) {
  fn_and_method(m, cls, cf::opname::sort, [](const Tensor& x, int64_t a, bool d) { return vi(cf::sort(x, a, d)); },
                "Stable sort along axis: (values, indices); values differentiable, indices int64.",
                nb::arg("axis") = -1, nb::arg("descending") = false);
  fn_and_method(m, cls, cf::opname::argsort, [](const Tensor& x, int64_t a, bool d) { return cf::argsort(x, a, d); },
                "Indices of the stable sort along axis.", nb::arg("axis") = -1, nb::arg("descending") = false);
  fn_and_method(m, cls, cf::opname::topk, [](const Tensor& x, int64_t k, int64_t a, bool l) { return vi(cf::topk(x, k, a, l)); },
                "The k largest (or smallest) along axis in sorted order, (values, indices); ties keep index order.",
                nb::arg("k"), nb::arg("axis") = -1, nb::arg("largest") = true);
  // values: a tensor, or numbers / lists taken in sorted's dtype and device (torch takes a Python scalar too)
  auto search = [](const Tensor& sorted, nb::handle values, bool right, std::optional<std::string> side) {
    if (side) {
      CF_CHECK(*side == "left" || *side == "right", ValueError, "[searchsorted] side must be 'left' or 'right', got '",
               *side, "'");
      CF_CHECK(!right || *side == "right", ValueError, "[searchsorted] right=True and side='left' contradict each other");
      right = *side == "right";
    }
    Tensor v = nb::isinstance<Tensor>(values) ? nb::cast<Tensor>(values)
                                              : tensor_from_python(values, std::nullopt, sorted.device());
    // Python floats (a number, lists) as float64, the value they are (cf.tensor's default float32 rounds them)
    const bool python_values = PyFloat_Check(values.ptr()) || PyLong_Check(values.ptr()) ||
                               PyList_Check(values.ptr()) || PyTuple_Check(values.ptr());
    if (python_values && cf::is_floating(v.dtype())) v = tensor_from_python(values, cf::kFloat64, sorted.device());
    nb::gil_scoped_release r;
    return cf::searchsorted(sorted, v, right);  // (two dtypes compared in a common one: see cf::searchsorted)
  };
  m.def(cf::opname::searchsorted, search, nb::arg("sorted_sequence"), nb::arg("values"), nb::kw_only(),
        nb::arg("right") = false, nb::arg("side") = nb::none(),
        nb::sig("def searchsorted(sorted_sequence: cf._cf.Tensor, values: cf._cf.Tensor | float | "
                "collections.abc.Sequence[float], *, right: bool = False, side: str | None = None) -> cf._cf.Tensor"),
        "torch.searchsorted: int64 positions where values would be inserted into the sorted last axis of "
        "sorted_sequence (1-d for all values, or (..., m) with values (..., k)): the count of elements that sort "
        "before each value, or before or equal to it with right=True (side='right'). NaN sorts last. Two dtypes "
        "are compared in a common one (floats: the wider; an integer and a float: float64). Never "
        "differentiable.");
  m.def("bucketize",
        [search](nb::handle input, const Tensor& boundaries, bool right) {
          CF_CHECK(boundaries.dim() == 1, ShapeError, "[bucketize] boundaries must be 1-d, got ", boundaries.describe());
          return search(boundaries, input, right, std::nullopt);
        },
        nb::arg("input"), nb::arg("boundaries"), nb::kw_only(), nb::arg("right") = false,
        nb::sig("def bucketize(input: cf._cf.Tensor | float | collections.abc.Sequence[float], boundaries: "
                "cf._cf.Tensor, *, right: bool = False) -> cf._cf.Tensor"),
        "torch.bucketize: the bucket of each input among sorted 1-d boundaries, i with boundaries[i-1] < x <= "
        "boundaries[i] (right=True: boundaries[i-1] <= x < boundaries[i]); cf.searchsorted(boundaries, input).");
}

void bind_fused(nb::module_& m, TensorCls& cls) {
  fn_and_method(m, cls, cf::opname::softmax, [](const Tensor& x, int64_t a) { return cf::softmax(x, a); },
                "Fused, numerically stable softmax along axis.", nb::arg("axis") = -1);
  fn_and_method(m, cls, cf::opname::log_softmax, [](const Tensor& x, int64_t a) { return cf::log_softmax(x, a); },
                "Fused log-softmax along axis.", nb::arg("axis") = -1);
  m.def(cf::opname::l2_normalize, &cf::l2_normalize, nb::arg("x"), nb::arg("eps") = 1e-12,
        "x scaled to unit length along its last axis: x / sqrt(sum x^2 + eps), one fused kernel each way "
        "(routing attention's normalisation of queries and keys).",
        release_gil());
  m.def(cf::opname::layer_norm,
        [](const Tensor& x, const cf::Shape& ns, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
          return cf::layer_norm(x, ns, w ? *w : Tensor(), b ? *b : Tensor(), eps);
        },
        nb::arg("x"), nb::arg("normalized_shape"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
        nb::arg("eps") = 1e-5,
        "Normalise over the last len(normalized_shape) axes; weight and bias optional, shaped like "
        "normalized_shape.",
        release_gil());
  m.def(cf::opname::cross_entropy,
        [](const Tensor& logits, const Tensor& targets, int64_t ignore_index, double label_smoothing,
           const std::string& reduction) {
          cf::CrossEntropyOptions o;
          o.ignore_index = ignore_index;
          o.label_smoothing = label_smoothing;
          o.reduction = parse_reduction(reduction, "cross_entropy");
          return cf::cross_entropy(logits, targets, o);
        },
        nb::arg("logits"), nb::arg("targets"), nb::arg("ignore_index") = -100, nb::arg("label_smoothing") = 0.0,
        nb::arg("reduction") = "mean",
        "Fused cross entropy: logits (N, C) or (N, C, d1, ...), int64 targets (N) or (N, d1, ...). The mean is over "
        "the non-ignored targets (0 with a zero gradient when all are ignored). Class weights: "
        "cf.nn.cross_entropy.",
        release_gil());
  m.def(cf::opname::dropout,
        [](const Tensor& x, double p, bool training, cf::Generator* gen) {
          return cf::dropout(x, p, training, gen_or_default(gen));
        },
        nb::arg("x"), nb::arg("p"), nb::arg("training") = true, nb::arg("generator").none() = nb::none(),
        "Inverted dropout: zero with probability p, survivors scaled by 1/(1-p); identity when not training.",
        release_gil());
  m.def(cf::opname::flash_attention,
        [](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> kpm, double scale, bool causal,
           double dropout, cf::Generator* gen) {
          return cf::flash_attention(q, k, v, kpm ? *kpm : Tensor(), scale, causal, dropout, gen_or_default(gen));
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("key_padding_mask") = nb::none(), nb::arg("scale") = 0.0,
        nb::arg("causal") = false, nb::arg("dropout") = 0.0, nb::arg("generator").none() = nb::none(),
        "Fused full attention softmax(scale q k^T) v (FlashAttention-2: no (Nq, Nk) matrix, O(N d) memory). q (B, H, "
        "Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv); key_padding_mask bool (B, Nk), True = padding; scale 0 means "
        "1/sqrt(Dk); causal: query i sees key j only when j <= i + Nk - Nq. A query with every key blocked outputs "
        "zeros. dropout > 0: inverted dropout of the attention weights, the weights dropout() would drop on the "
        "dense (B, H, Nq, Nk) weights with the same generator.",
        release_gil());
  m.def("flash_attention_with_lse",
        [](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> kpm, double scale, bool causal,
           double dropout, cf::Generator* gen) {
          cf::FlashAttentionResult r =
              cf::flash_attention_with_lse(q, k, v, kpm ? *kpm : Tensor(), scale, causal, dropout, gen_or_default(gen));
          return Pair{r.out, r.lse};
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("key_padding_mask") = nb::none(), nb::arg("scale") = 0.0,
        nb::arg("causal") = false, nb::arg("dropout") = 0.0, nb::arg("generator").none() = nb::none(),
        "flash_attention that also returns each query's log-sum-exp of its allowed scaled scores: (out (B, H, Nq, "
        "Dv), lse (B, H, Nq)), -inf where every key is blocked. Differentiable through both. dropout as "
        "flash_attention's: out from the dropped weights, lse from the weights before dropout.",
        release_gil());
  m.def(cf::opname::block_attention,
        [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members, std::optional<Tensor> kpm,
           int64_t look_back, int64_t look_ahead, bool causal, bool self_mask, double scale, int64_t rounds,
           bool combine_rounds, double dropout, cf::Generator* gen) {
          cf::BlockAttentionOptions o;
          o.look_back = look_back;
          o.look_ahead = look_ahead;
          o.causal = causal;
          o.self_mask = self_mask;
          o.scale = scale;
          o.rounds = rounds;
          o.combine_rounds = combine_rounds;
          o.dropout = dropout;
          o.generator = &gen_or_default(gen);
          cf::BlockAttentionResult r = cf::block_attention(q, k, v, members, kpm ? *kpm : Tensor(), o);
          return Pair{r.out, r.lse};
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("members"), nb::arg("key_padding_mask") = nb::none(),
        nb::arg("look_back") = 0, nb::arg("look_ahead") = 0, nb::arg("causal") = false, nb::arg("self_mask") = false,
        nb::arg("scale") = 0.0, nb::arg("rounds") = 1, nb::arg("combine_rounds") = false, nb::arg("dropout") = 0.0,
        nb::arg("generator").none() = nb::none(),
        "Fused attention within gathered blocks: members int64 (B, H * rounds or 1, C, w) holds the original "
        "position of each slot (-1 empty); chunk c's queries see the keys of chunks c - look_back .. c + look_ahead "
        "(cyclic). causal compares original positions; self_mask gives a query's own score -1e5 (Reformer). rounds "
        "R (LSH's hashing rounds): table head h * R + r over q, k, v head h, no copies of them. Returns (out "
        "(B, H * R, N, Dv), lse (B, H * R, N)); with combine_rounds the rounds combined through their log-sum-exp "
        "(B, H, N, Dv) and (B, H, N). Tokens in no slot or with nothing allowed get 0 and -inf. dropout > 0: "
        "inverted dropout of the attention weights, the weights dropout() would drop on the dense (B, H * R, N, N) "
        "weights with the same generator (lse stays that of the weights before dropout). Differentiable through "
        "both.",
        release_gil());
  m.def(cf::opname::routed_attention,
        [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members, const Tensor& key_members,
           std::optional<Tensor> kpm, double scale, bool causal, double dropout, cf::Generator* gen) {
          return cf::routed_attention(q, k, v, query_members, key_members, kpm ? *kpm : Tensor(), scale, causal,
                                      dropout, gen_or_default(gen));
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("query_members"), nb::arg("key_members"),
        nb::arg("key_padding_mask") = nb::none(), nb::arg("scale") = 0.0, nb::arg("causal") = false,
        nb::arg("dropout") = 0.0, nb::arg("generator").none() = nb::none(),
        "Fused attention within index lists (routing attention, fixed sparse patterns): query_members (B or 1, H or "
        "1, C, wq) and key_members (B or 1, H or 1, C, wk) int64 hold positions (-1 empty); list c's query slots "
        "attend to list c's key slots (causal compares positions). A position in several query lists gets the "
        "average of its outputs over the lists where it sees a key, zeros if none. Returns (B, H, N, Dv). dropout > 0: inverted "
        "dropout of the attention weights, those dropout() would drop on C successive dense (B, H, N, N) weight "
        "tensors, one per list, with the same generator. Differentiable in q, k, v.",
        release_gil());
  m.def(cf::opname::sparse_dot, &cf::sparse_dot, nb::arg("q"), nb::arg("k"), nb::arg("idx"),
        "out[g, n, t] = q[g, n] . k[g, idx[g, n, t]]: q (G, N, D), k (G, M, D), idx int64 (G, N, K) -> (G, N, K) "
        "(improved clustered attention's top-k scores). Differentiable in q and k.",
        release_gil());
  m.def(cf::opname::sparse_weighted_sum, &cf::sparse_weighted_sum, nb::arg("w"), nb::arg("v"), nb::arg("idx"),
        "out[g, n] = sum_t w[g, n, t] v[g, idx[g, n, t]]: w (G, N, K), v (G, M, Dv), idx int64 (G, N, K) -> "
        "(G, N, Dv). Differentiable in w and v.",
        release_gil());
  m.def(cf::opname::cluster_topk_attention,
        [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top, const Tensor& assignment,
           std::optional<Tensor> mass, std::optional<Tensor> rest, std::optional<Tensor> kpm, double scale,
           bool causal, double dropout, cf::Generator* gen) {
          return cf::cluster_topk_attention(q, k, v, top, assignment, opt(mass), opt(rest), opt(kpm), scale, causal,
                                            dropout, gen_or_default(gen));
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("top"), nb::arg("assignment"),
        nb::arg("mass").none() = nb::none(), nb::arg("rest").none() = nb::none(),
        nb::arg("key_padding_mask").none() = nb::none(), nb::arg("scale") = 1.0, nb::arg("causal") = false,
        nb::arg("dropout") = 0.0,
        generator_arg(),
        "Improved clustered attention's exact part, one fused op: query i of head (b, h) in cluster a = "
        "assignment[b, h, i] attends to the keys top[b, h, a, :] with the scores scale q_i . k_l, "
        "softmax over them, and out_i = mass[b, h, a] * (those weights) v + rest[b, h, a] (mass None: 1, rest "
        "None: 0); a query with a = -1 gets 0. q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv), top int64 (B, "
        "H, C, kk), assignment int64 (B, H, Nq), mass (B, H, C), rest (B, H, C, Dv); key_padding_mask bool (B, Nk), "
        "True = padding; causal: key l blocked for query i when l > i + Nk - Nq. dropout > 0: inverted dropout "
        "of the weights, those dropout() would drop on the (B, H, Nq, kk) weights with the same generator. "
        "Differentiable in q, k, v, mass and rest.",
        release_gil());
  m.def(cf::opname::farthest_point_sampling,
        [](const Tensor& points, int64_t m, std::optional<Tensor> mask) { return cf::farthest_point_sampling(points, m, opt(mask)); },
        nb::arg("points"), nb::arg("m"), nb::arg("mask").none() = nb::none(),
        "Indices int64 (B, m) of farthest point sampling over points (B, N, C): the first real point, then "
        "repeatedly the farthest from those taken (ties to the lowest index); mask bool (B, N), True = padding.",
        release_gil());
  m.def(cf::opname::group_max, &cf::group_max, nb::arg("src"), nb::arg("group"), nb::arg("groups"),
        "Each entry of src (..., E) gets the largest src of its row's entries in the same group (int64 (..., E) in "
        "[0, groups)); 0 where that is not finite.",
        release_gil());
  m.def(cf::opname::clustering_loss,
        [](const Tensor& x, const Tensor& c_hat, const Tensor& index, std::optional<Tensor> kpm, const std::string& form) {
          return cf::clustering_loss(x, c_hat, index, opt(kpm),
                                     cf::nn::cluster_loss_form_from_string(form, cf::opname::clustering_loss));
        },
        nb::arg("x"), nb::arg("c_hat"), nb::arg("index"), nb::arg("key_padding_mask").none() = nb::none(),
        nb::arg("form") = "inner",
        "Neural clustering's L1 (eq. 6), one fused op: the batch mean of -(1/n_b) sum_j phi(x_bj, c_hat[b, index_bj]) "
        "over the non-padding tokens (key_padding_mask bool (B, N), True = padding, where index holds k); x (B, N, "
        "D), c_hat (B, k, D); form \"inner\" (the paper's phi), \"cosine\" or \"sphere\". The same as cf.nn.clustering_loss.",
        release_gil());
  m.def(cf::opname::centroid_sorting_loss,
        [](const Tensor& c_hat, const std::string& form) {
          return cf::centroid_sorting_loss(c_hat,
                                           cf::nn::cluster_loss_form_from_string(form, cf::opname::centroid_sorting_loss));
        },
        nb::arg("c_hat"), nb::arg("form") = "inner",
        "Neural clustering's L2 (eq. 11, with its cyclic term), one fused op: the batch mean of -(1/k) sum_i "
        "phi(c_hat_i, c_hat_(i-1) mod k); form \"inner\", or \"cosine\"/\"sphere\" (both the cosine). The same as "
        "cf.nn.centroid_sorting_loss.",
        release_gil());
  m.def(cf::opname::cluster_means, &cf::cluster_means, nb::arg("x"), nb::arg("assignment"), nb::arg("clusters"),
        nb::arg("scale") = 1.0,
        "Clustered attention's centroids (eq. 3 of Vyas et al.), one fused op: out[..., c, :] = scale / max(n_c, 1) "
        "* the sum of the rows x[..., i, :] with assignment[..., i] == c (an empty cluster's centroid is 0, id -1 "
        "is no cluster); x (..., N, D), assignment int64 (..., N) -> (..., clusters, D). Differentiable in x.",
        release_gil());
  m.def(cf::opname::commitment_loss,
        [](const Tensor& x, const Tensor& centroids, const Tensor& assign, std::optional<Tensor> kpm, double scale) {
          return cf::commitment_loss(x, centroids, assign, opt(kpm), scale);
        },
        nb::arg("x"), nb::arg("centroids"), nb::arg("assign"), nb::arg("key_padding_mask").none() = nb::none(),
        nb::arg("scale") = 1.0,
        "Routing attention's commitment term, one fused op: scale * the sum over the non-padding tokens of "
        "|x_bhn - centroids[h, assign_bhn]|^2; x (B, H, N, D), centroids (H, C, D) without gradient (sg(mu)), "
        "assign int64 (B, H, N), key_padding_mask bool (B, N) (True = padding). Differentiable in x.",
        release_gil());
  m.def(cf::opname::hash_codes, &cf::hash_codes, nb::arg("x"), nb::arg("planes"),
        "int64 codes of x (..., D) under planes (bits, D), bits in [1, 63]: bit b is set when x . planes[b] > 0.",
        release_gil());
  m.def(cf::opname::hamming_kmeans,
        [](const Tensor& codes, int64_t clusters, int64_t iterations, int64_t bits, std::optional<Tensor> exclude) {
          return cf::hamming_kmeans(codes, clusters, iterations, bits, exclude ? *exclude : Tensor());
        },
        nb::arg("codes"), nb::arg("clusters"), nb::arg("iterations"), nb::arg("bits"),
        nb::arg("exclude") = nb::none(),
        "K-Means in Hamming space on int64 codes (G, N) of `bits` bits, one problem per row: farthest-point "
        "initialisation, majority-vote centroids. exclude bool (G, N), True = padding (cluster -1). Returns int64 "
        "(G, N) cluster ids.",
        release_gil());
}

void bind_factories(nb::module_& m) {
  const auto dev = nb::arg("device") = cf::Device::cpu();
  const auto rg = nb::arg("requires_grad") = false;
  m.def("tensor",
        [](nb::handle data, std::optional<cf::DType> dtype, cf::Device device, bool requires_grad) {
          return with_grad(tensor_from_python(data, dtype, device), requires_grad);
        },
        nb::arg("data"), nb::arg("dtype") = nb::none(), dev, rg,
        "A tensor copied from nested lists, numbers, a buffer (NumPy array) or a tensor. Unless dtype is given, "
        "an array or tensor keeps its dtype (integers of every width become int64) and nested lists and "
        "numbers give bool, int64, else float32.");
  m.def("empty", [](const cf::Shape& s, cf::DType d, cf::Device dv, bool g) { return with_grad(cf::Tensor::empty(s, d, dv), g); },
        nb::arg("shape"), nb::arg("dtype") = cf::kFloat32, dev, rg, "Uninitialised tensor.", release_gil());
  m.def("zeros", [](const cf::Shape& s, cf::DType d, cf::Device dv, bool g) { return with_grad(cf::Tensor::zeros(s, d, dv), g); },
        nb::arg("shape"), nb::arg("dtype") = cf::kFloat32, dev, rg, "Tensor of zeros.", release_gil());
  m.def("ones", [](const cf::Shape& s, cf::DType d, cf::Device dv, bool g) { return with_grad(cf::Tensor::ones(s, d, dv), g); },
        nb::arg("shape"), nb::arg("dtype") = cf::kFloat32, dev, rg, "Tensor of ones.", release_gil());
  m.def("full",
        [](const cf::Shape& s, const FillValue& v, cf::DType d, cf::Device dv, bool g) {
          return with_grad(full_of(s, v, d, dv), g);
        },
        nb::arg("shape"), nb::arg("value"), nb::arg("dtype") = cf::kFloat32, dev, rg, "Tensor filled with value.",
        release_gil());
  m.def("scalar", [](const FillValue& v, cf::DType d, cf::Device dv, bool g) { return with_grad(full_of({}, v, d, dv), g); },
        nb::arg("value"), nb::arg("dtype") = cf::kFloat32, dev, rg, "0-d tensor holding one value.", release_gil());
  m.def("arange", [](int64_t n, cf::DType d, cf::Device dv) { return cf::Tensor::arange(n, d, dv); }, nb::arg("n"),
        nb::arg("dtype") = cf::kInt64, dev, "[0, 1, ..., n-1].", release_gil());
  m.def(cf::opname::rand,
        [](const cf::Shape& s, cf::DType d, cf::Generator* gen, double lo, double hi, cf::Device dv, bool g) {
          return with_grad(cf::rand(s, d, gen_or_default(gen), lo, hi, dv), g);
        },
        nb::arg("shape"), nb::arg("dtype") = cf::kFloat32, nb::arg("generator").none() = nb::none(),
        nb::arg("low") = 0.0, nb::arg("high") = 1.0, dev, rg,
        "Uniform in [low, high) from a Philox generator (default: the process-wide one).", release_gil());
  m.def(cf::opname::randn,
        [](const cf::Shape& s, cf::DType d, cf::Generator* gen, double mean, double std, cf::Device dv, bool g) {
          return with_grad(cf::randn(s, d, gen_or_default(gen), mean, std, dv), g);
        },
        nb::arg("shape"), nb::arg("dtype") = cf::kFloat32, nb::arg("generator").none() = nb::none(),
        nb::arg("mean") = 0.0, nb::arg("std") = 1.0, dev, rg, "Normal(mean, std) from a Philox generator.",
        release_gil());
  m.def(cf::opname::randint,
        [](int64_t lo, int64_t hi, const cf::Shape& s, cf::Generator* gen, cf::Device dv) {
          return cf::randint(lo, hi, s, gen_or_default(gen), dv);
        },
        nb::arg("low"), nb::arg("high"), nb::arg("shape"), nb::arg("generator").none() = nb::none(), dev,
        "int64 uniform in [low, high).", release_gil());
  m.def(cf::opname::randint,  // torch.randint(high, size): low 0
        [](int64_t hi, const cf::Shape& s, cf::Generator* gen, cf::Device dv) {
          return cf::randint(0, hi, s, gen_or_default(gen), dv);
        },
        nb::arg("high"), nb::arg("shape"), nb::arg("generator").none() = nb::none(), dev,
        "PyTorch's randint(high, size): int64 uniform in [0, high).", release_gil());
  m.def(cf::opname::bernoulli,
        [](const cf::Shape& s, double p, cf::Generator* gen, cf::Device dv) {
          return cf::bernoulli(s, p, gen_or_default(gen), dv);
        },
        nb::arg("shape"), nb::arg("p"), nb::arg("generator").none() = nb::none(), dev,
        "bool, each element true with probability p.", release_gil());
}

void bind_gradcheck(nb::module_& m) {
  nb::class_<cf::GradcheckResult>(m, "GradcheckResult", "The outcome of cf.gradcheck.")
      .def_ro("ok", &cf::GradcheckResult::ok)
      .def_ro("message", &cf::GradcheckResult::message, "The first failure: op, input, index, analytic and numeric values.")
      .def_ro("max_abs_error", &cf::GradcheckResult::max_abs_error)
      .def_ro("entries_checked", &cf::GradcheckResult::entries_checked)
      .def_ro("mode", &cf::GradcheckResult::mode, "\"full-jacobian\" or \"weighted-gradient+projections\".")
      .def("__bool__", [](const cf::GradcheckResult& r) { return r.ok; })
      .def("__repr__", [](const cf::GradcheckResult& r) {
        return std::string("GradcheckResult(ok=") + (r.ok ? "True" : "False") + ", mode='" + r.mode +
               "', entries_checked=" + std::to_string(r.entries_checked) + (r.ok ? "" : ", message='" + r.message + "'") + ")";
      });
  // f runs Python code, so the GIL stays held.
  m.def("gradcheck",
        [](nb::callable py_f, const std::vector<Tensor>& inputs, double eps,
           double atol, double rtol, int64_t full_jacobian_max_entries, int64_t elementwise_max_inputs,
           int num_projections, uint64_t seed, bool check_repeat, bool check_zero_grad) {
          cf::GradcheckOptions o;
          o.eps = eps;
          o.atol = atol;
          o.rtol = rtol;
          o.full_jacobian_max_entries = full_jacobian_max_entries;
          o.elementwise_max_inputs = elementwise_max_inputs;
          o.num_projections = num_projections;
          o.seed = seed;
          o.check_repeat = check_repeat;
          o.check_zero_grad = check_zero_grad;
          // f's result is checked here: a non-tensor was nanobind's bare "std::bad_cast".
          auto f = [&py_f](const std::vector<Tensor>& xs) {
            nb::object y = py_f(nb::cast(xs));
            if (!nb::isinstance<Tensor>(y))
              throw nb::type_error(("[gradcheck] f must return a cf.Tensor, got " +
                                    std::string(nb::type_name(y.type()).c_str())).c_str());
            return nb::cast<Tensor>(y);
          };
          return cf::gradcheck(f, inputs, o);
        },
        nb::arg("f"), nb::arg("inputs"), nb::arg("eps") = 1e-6, nb::arg("atol") = 1e-5, nb::arg("rtol") = 1e-3,
        nb::arg("full_jacobian_max_entries") = 4096, nb::arg("elementwise_max_inputs") = 2048,
        nb::arg("num_projections") = 3, nb::arg("seed") = 1234, nb::arg("check_repeat") = true,
        nb::arg("check_zero_grad") = true,
        "Finite-difference check of d f(inputs) / d inputs (DESIGN.md section 4): float64 central differences, a "
        "random-weighted scalar loss, the full Jacobian for small problems and random projections for large ones; "
        "backward twice must give identical gradients and a zero upstream gradient zeros. f takes the list of "
        "inputs and returns one tensor; inputs that require grad must be float64.");
}

// ---- PyTorch's spellings, as fallback overloads ----
// nanobind tries a function's overloads in order, so each of these runs only after cf's own signature
// failed to match: calls written in cf's spelling pay nothing for them.

// t.reshape(4, 3), cf.zeros(2, 3), x.reshape(np.int64(12)): a shape given as separate ints, read as cf's own
// overload reads a list of them (a list, a tuple or one Python int takes that overload first).
cf::Shape shape_from_varargs(const nb::args& args) {
  nb::detail::make_caster<cf::Shape> shape;
  for (nb::handle h : args)  // cf.zeros(2, True): no size (a flag given positionally, more likely)
    if (PyBool_Check(h.ptr())) throw nb::next_overload();
  if (args.size() == 0 || !shape.from_python(args, 0, nullptr)) throw nb::next_overload();
  return shape.value;
}

// f(..., dim=1) for f(..., axis=1), and the like: one overload per PyTorch keyword, which that keyword must be
// given to (so nanobind passes over it, with no call, for any call without it); it renames the keywords and calls
// f again. A call naming both spellings, or one that fails the renamed call's signature, gets nanobind's
// signature error for what the user wrote.
struct Spelling {
  const char* torch;
  const char* cf;
  const char* type;  // for the stub
};
template <typename Scope>
void accept_torch_keywords(Scope& scope, const char* name, const std::vector<Spelling>& spellings, const char* result) {
  constexpr bool method = std::is_same_v<Scope, TensorCls>;
  for (size_t i = 0; i < spellings.size(); ++i) {
    const Spelling own = spellings[i];
    const std::vector<Spelling> rest(spellings.begin() + long(i) + 1, spellings.end());
    // The signature shows the later spellings that can go with this one: not another spelling of the same cf
    // keyword (dim= and NumPy's axis= both give axes=; the call refuses the two together).
    std::vector<Spelling> with;
    for (const Spelling& sp : rest)
      if (std::string(sp.cf) != own.cf) with.push_back(sp);
    std::string sig = std::string("def ") + name + (method ? "(self, *args, " : "(*args, ") + own.torch + ": " + own.type;
    for (const Spelling& sp : with) sig += std::string(", ") + sp.torch + ": " + sp.type + " = ...";
    sig += std::string(", **kwargs) -> ") + result;
    std::string doc = std::string("PyTorch's keyword ") + own.torch + "= for cf's " + own.cf + "=";
    for (const Spelling& sp : with) doc += std::string(", ") + sp.torch + "= for " + sp.cf + "=";
    doc += ": the same call in cf's spelling.";
    // f: the module's function, or the bound method of the tensor
    auto rename = [name, own, rest](nb::handle f, nb::args args, nb::object value, nb::kwargs kwargs) -> nb::object {
      nb::dict renamed;
      for (auto [key, v] : kwargs) renamed[key] = v;
      if (renamed.contains(own.cf)) throw nb::next_overload();
      renamed[own.cf] = value;
      for (const Spelling& sp : rest) {
        if (!renamed.contains(sp.torch)) continue;
        if (renamed.contains(sp.cf)) throw nb::next_overload();
        renamed[sp.cf] = renamed[sp.torch];
        nb::del(renamed[sp.torch]);
      }
      try {
        return f.attr(name)(*args, **renamed);
      } catch (nb::python_error& e) {
        // the renamed call's own signature mismatch: report the call as written (cf's errors pass)
        if (e.matches(PyExc_TypeError) && std::string(e.what()).find("incompatible function arguments") != std::string::npos)
          throw nb::next_overload();
        throw;
      }
    };
    if constexpr (method) {
      scope.def(name, [rename](nb::handle self, nb::args args, nb::object value, nb::kwargs kwargs) {
        return rename(self, args, value, kwargs);
      }, nb::arg("args"), nb::arg(own.torch).none(), nb::arg("kwargs"), nb::sig(sig.c_str()), doc.c_str());
    } else {
      nb::handle module = scope;
      scope.def(name, [rename, module](nb::args args, nb::object value, nb::kwargs kwargs) {
        return rename(module, args, value, kwargs);
      }, nb::arg("args"), nb::arg(own.torch).none(), nb::arg("kwargs"), nb::sig(sig.c_str()), doc.c_str());
    }
  }
}

void bind_torch_spellings(nb::module_& m, TensorCls& cls) {
  const char* kTensor = "cf._cf.Tensor";
  const char* kPair = "tuple[cf._cf.Tensor, cf._cf.Tensor]";
  const char* kAxis = "int";
  const char* kAxes = "int | collections.abc.Sequence[int] | None";
  auto both = [&](const char* name, const std::vector<Spelling>& sp, const char* result) {
    accept_torch_keywords(m, name, sp, result);
    accept_torch_keywords(cls, name, sp, result);
  };
  // (NumPy's axis= too, for the functions whose cf keyword is axes=)
  for (const char* name : {"sum", "mean", "logsumexp", "amax", "amin", "var"})
    both(name, {{"dim", "axes", kAxes}, {"axis", "axes", kAxes}}, kTensor);
  both("max", {{"dim", "axis", kAxis}}, "cf._cf.Tensor | tuple[cf._cf.Tensor, cf._cf.Tensor]");
  both("min", {{"dim", "axis", kAxis}}, "cf._cf.Tensor | tuple[cf._cf.Tensor, cf._cf.Tensor]");
  for (const char* name : {"argmax", "argmin", "squeeze", "unsqueeze", "argsort", "softmax", "log_softmax", "narrow",
                           "gather", "scatter", "scatter_add", "index_select", "index_add", "take_along_dim"})
    both(name, {{"dim", "axis", kAxis}}, kTensor);
  for (const char* name : {"sort", "topk"}) both(name, {{"dim", "axis", kAxis}}, kPair);
  both("split", {{"dim", "axis", kAxis}}, "list[cf._cf.Tensor]");
  both("cumsum", {{"dim", "axis", kAxis}}, kTensor);
  both("flip", {{"dims", "axes", "int | collections.abc.Sequence[int]"}}, kTensor);
  both("roll", {{"dims", "axes", "int | collections.abc.Sequence[int] | None"}}, kTensor);
  for (const char* name : {"cat", "stack"}) accept_torch_keywords(m, name, {{"dim", "axis", kAxis}}, kTensor);
  both("permute", {{"dims", "axes", "collections.abc.Sequence[int]"}}, kTensor);
  both("transpose", {{"dim0", "axis0", kAxis}, {"dim1", "axis1", kAxis}}, kTensor);
  both("flatten", {{"start_dim", "start_axis", kAxis}, {"end_dim", "end_axis", kAxis}}, kTensor);
  both("clamp", {{"min", "low", "float | None"}, {"max", "high", "float | None"}}, kTensor);

  // Methods of the operators: t.add(u) is t + u, with the operator's rules for numbers and NumPy operands
  // (t.div divides exactly, as / and PyTorch's div; rounding_mode= as cf.div's: an overload below).
  const std::pair<const char*, const char*> operators[] = {
      {"add", "__add__"}, {"sub", "__sub__"}, {"mul", "__mul__"}, {"div", "__truediv__"}, {"pow", "__pow__"},
      {"eq", "__eq__"},   {"ne", "__ne__"},   {"lt", "__lt__"},   {"le", "__le__"},       {"gt", "__gt__"},
      {"ge", "__ge__"}};
  for (const auto& [name, dunder] : operators) {
    const std::string doc = std::string("t.") + name + "(other) is the operator " + dunder +
                            ": the same rules for numbers and NumPy operands" +
                            (std::string(name) == "div" ? " (it divides exactly, as Python's / and PyTorch's div: "
                                                          "integer tensors give float32)."
                                                        : ".");
    cls.def(name,
            [name = name, dunder = dunder](nb::handle self, nb::handle other) -> nb::object {
              nb::object r = self.attr(dunder)(other);
              if (r.is(nb::handle(Py_NotImplemented)))
                throw nb::type_error((std::string("[") + name + "] other must be a cf.Tensor, a number or a NumPy "
                                      "operand, got " + nb::type_name(other.type()).c_str()).c_str());
              return r;
            },
            nb::arg("other").none(), nb::sig((std::string("def ") + name + "(self, other: object) -> cf._cf.Tensor").c_str()),
            doc.c_str());
  }
  cls.def("div", [](nb::handle self, nb::handle other, std::optional<std::string> mode) -> nb::object {
            return nb::module_::import_("cf").attr("div")(self, other, nb::arg("rounding_mode") = mode);
          }, nb::arg("other"), nb::kw_only(), nb::arg("rounding_mode").none(),
          nb::sig("def div(self, other: object, *, rounding_mode: str | None) -> cf._cf.Tensor"),
          "cf.div(self, other, rounding_mode=...).");

  // In place, as the in-place operators (t.sub_(u) is t -= u, returning t), and the operands PyTorch's
  // add_ and mul_ take beyond cf's own (a number for add_, a tensor for mul_).
  const std::pair<const char*, const char*> inplace_operators[] = {
      {"sub_", "__isub__"}, {"div_", "__itruediv__"}, {"pow_", "__ipow__"}};
  for (const auto& [name, dunder] : inplace_operators)
    cls.def(name,
            [dunder = dunder](nb::handle self, nb::handle other) -> nb::object { return self.attr(dunder)(other); },
            nb::arg("other"), nb::sig((std::string("def ") + name + "(self, other: object) -> cf._cf.Tensor").c_str()),
            (std::string("t.") + name + "(other) is the in-place operator " + dunder + " (returns t).").c_str());
  cls.def("add_",
          [](nb::handle self, nb::handle other, double alpha) -> nb::object {
            if (!PyLong_Check(other.ptr()) && !PyFloat_Check(other.ptr())) throw nb::next_overload();
            if (alpha == 1.0) return self.attr("__iadd__")(other);
            // an int times an integral alpha stays a Python int (exact with int64 tensors past 2^53)
            if (PyLong_Check(other.ptr()) && std::trunc(alpha) == alpha && std::fabs(alpha) < 9.2e18)
              return self.attr("__iadd__")(other * nb::int_(int64_t(alpha)));
            return self.attr("__iadd__")(nb::float_(alpha * nb::cast<double>(nb::float_(other))));
          },
          nb::arg("other"), nb::arg("alpha") = 1.0,
          nb::sig("def add_(self, other: int | float, alpha: float = 1.0) -> cf._cf.Tensor"),
          "t += alpha * other for a number other, in place; returns t.");
  cls.def("mul_", [](nb::handle self, const Tensor& other) -> nb::object { return self.attr("__imul__")(other); },
          nb::arg("other"), nb::sig("def mul_(self, other: cf._cf.Tensor) -> cf._cf.Tensor"), "t *= other (a tensor, broadcast to t), in place; returns t.");
  cls.def("clamp_",
          [](Tensor& t, std::optional<double> lo, std::optional<double> hi) -> Tensor& {
            CF_CHECK(lo || hi, ValueError, "[clamp_] give low (min), high (max) or both (", t.describe(), ")");
            constexpr double kInf = std::numeric_limits<double>::infinity();
            Tensor clamped = cf::clamp(t, lo ? *lo : -kInf, hi ? *hi : kInf);
            return cf::copy_(t, clamped);
          },
          nb::arg("low") = nb::none(), nb::arg("high") = nb::none(), nb::rv_policy::reference, release_gil(),
          "t limited to [low, high] in place (None leaves that side open); returns t.");
  accept_torch_keywords(cls, "clamp_", {{"min", "low", "float | None"}, {"max", "high", "float | None"}}, kTensor);

  // Shapes as separate ints. The GIL is released around the kernel, as in cf's own overloads.
  auto shape_method = [&](const char* name, Tensor (*f)(const Tensor&, const cf::Shape&), const char* doc) {
    cls.def(name,
            [f](const Tensor& x, nb::args shape) {
              cf::Shape s = shape_from_varargs(shape);
              nb::gil_scoped_release r;
              return f(x, s);
            },
            nb::arg("shape"), nb::sig((std::string("def ") + name + "(self, *shape: int) -> cf._cf.Tensor").c_str()), doc);
  };
  shape_method("reshape", [](const Tensor& x, const cf::Shape& s) { return cf::reshape(x, s); },
               "PyTorch's spelling: t.reshape(4, 3) is t.reshape([4, 3]).");
  shape_method("view", [](const Tensor& x, const cf::Shape& s) { return cf::view(x, s); },
               "PyTorch's spelling: t.view(4, 3) is t.view([4, 3]).");
  shape_method("expand", [](const Tensor& x, const cf::Shape& s) { return cf::expand(x, s); },
               "PyTorch's spelling: t.expand(2, 3, 4) is t.expand([2, 3, 4]).");
  shape_method("permute", [](const Tensor& x, const cf::Shape& s) { return cf::permute(x, s); },
               "PyTorch's spelling: t.permute(1, 0) is t.permute([1, 0]).");

  const auto dev = nb::arg("device") = cf::Device::cpu();
  const auto rg = nb::arg("requires_grad") = false;
  using Make = Tensor (*)(const cf::Shape&, cf::DType, cf::Device);
  auto plain = [&](const char* name, Make make) {
    m.def(name,
          [make](nb::args size, cf::DType d, cf::Device dv, bool g) {
            cf::Shape s = shape_from_varargs(size);
            Tensor t;
            {
              nb::gil_scoped_release r;
              t = make(s, d, dv);
            }
            return with_grad(t, g);
          },
          nb::arg("size"), nb::arg("dtype") = cf::kFloat32, dev, rg,
          "PyTorch's spelling: a shape as separate ints, cf.zeros(2, 3) for cf.zeros([2, 3]).");
  };
  plain("empty", [](const cf::Shape& s, cf::DType d, cf::Device dv) { return Tensor::empty(s, d, dv); });
  plain("zeros", [](const cf::Shape& s, cf::DType d, cf::Device dv) { return Tensor::zeros(s, d, dv); });
  plain("ones", [](const cf::Shape& s, cf::DType d, cf::Device dv) { return Tensor::ones(s, d, dv); });
  // rand(low, high) and randn(mean, std): the same form
  using Draw = Tensor (*)(const cf::Shape&, cf::DType, cf::Generator&, double, double, cf::Device);
  auto random = [&](const char* name, Draw draw, const char* a, double a0, const char* b, double b0, const char* doc) {
    m.def(name,
          [draw](nb::args size, cf::DType d, cf::Generator* gen, double x, double y, cf::Device dv, bool g) {
            cf::Shape s = shape_from_varargs(size);
            Tensor t;
            {
              nb::gil_scoped_release r;
              t = draw(s, d, gen_or_default(gen), x, y, dv);
            }
            return with_grad(t, g);
          },
          nb::arg("size"), nb::arg("dtype") = cf::kFloat32, nb::arg("generator").none() = nb::none(), nb::arg(a) = a0,
          nb::arg(b) = b0, dev, rg, doc);
  };
  random(cf::opname::rand, [](const cf::Shape& s, cf::DType d, cf::Generator& g, double lo, double hi, cf::Device dv) {
    return cf::rand(s, d, g, lo, hi, dv);
  }, "low", 0.0, "high", 1.0, "PyTorch's spelling: cf.rand(2, 3) for cf.rand([2, 3]).");
  random(cf::opname::randn, [](const cf::Shape& s, cf::DType d, cf::Generator& g, double mean, double std, cf::Device dv) {
    return cf::randn(s, d, g, mean, std, dv);
  }, "mean", 0.0, "std", 1.0, "PyTorch's spelling: cf.randn(2, 3) for cf.randn([2, 3]).");
}

}  // namespace

void bind_ops(nb::module_& m, TensorCls& cls) {
  {
    nb::object type = nb::module_::import_("collections")
                          .attr("namedtuple")("ValuesIndices", nb::make_tuple("values", "indices"),
                                              nb::arg("module") = "cf");
    type.attr("__doc__") = "(values, indices): what max/min with an axis, sort and topk return (PyTorch's "
                           "t.max(dim=1).values reads the same; unpacks as a pair).";
    m.attr("ValuesIndices") = type;
    g_values_indices = type.release().ptr();  // (held for the process's life, as the module holds it)
  }
  bind_elementwise(m, cls);
  bind_operators(cls);
  bind_reductions(m, cls);
  bind_shape(m, cls);
  bind_index(m, cls);
  bind_sort(m, cls);
  bind_fused(m, cls);
  bind_factories(m);
  bind_gradcheck(m);
  bind_torch_spellings(m, cls);  // last: the fallbacks follow cf's own overloads
}

}  // namespace cfpy
