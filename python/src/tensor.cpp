// cf.Tensor: metadata, autograd fields, conversion to and from Python values,
// indexing and slicing (views, as cf's shape ops), operators, NumPy's array
// interface. The op functions and the Tensor methods that mirror them are in ops.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "autograd/ops/common.h"
#include "kernels/index/index.h"
#include "common.h"

namespace cfpy {

// ---------------------------------------------------------------- helpers

namespace {
std::string type_of(nb::handle h) { return nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(h.ptr())))); }
}  // namespace

bool index_value(nb::handle h, const char* op, const char* what, int64_t& out) {
  if (PyBool_Check(h.ptr()) || PyFloat_Check(h.ptr()) || PyUnicode_Check(h.ptr()) || PyBytes_Check(h.ptr()) ||
      !PyIndex_Check(h.ptr()))
    return false;
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) {  // (a 0-d float array or tensor has __index__ and refuses)
    PyErr_Clear();
    return false;
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0)
    throw cf::ValueError(cf::str("[", op, "] ", what, " ", nb::cast<std::string>(nb::str(i)), " is outside int64"));
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  out = int64_t(v);
  return true;
}

namespace {
// The items of an iterable that is not a string (a list, a tuple, a 1-d array or tensor), or null.
nb::object items_of(nb::handle h) {
  if (PyUnicode_Check(h.ptr()) || PyBytes_Check(h.ptr())) return nb::object();
  PyObject* seq = PySequence_Fast(h.ptr(), "");
  if (!seq) {
    PyErr_Clear();
    return nb::object();
  }
  return nb::steal(seq);
}
}  // namespace

std::optional<bool> optional_bool_arg(nb::handle h, const char* op, const char* what) {
  if (h.is_none()) return std::nullopt;
  if (PyBool_Check(h.ptr())) return h.ptr() == Py_True;
  const std::string type = type_of(h);
  if (type == "<class 'numpy.bool_'>" || type == "<class 'numpy.bool'>") {
    const int v = PyObject_IsTrue(h.ptr());
    if (v < 0) throw nb::python_error();
    return v == 1;
  }
  throw cf::ValueError(cf::str("[", op, "] ", what, " must be None, True or False, got ", type));
}

int64_t int64_arg(nb::handle h, const char* op, const char* what) {
  int64_t v = 0;
  if (!index_value(h, op, what, v))
    throw cf::ValueError(cf::str("[", op, "] ", what, " must be an int, got ", type_of(h)));
  return v;
}

std::vector<int64_t> int64_list_arg(nb::handle h, const char* op, const char* what) {
  nb::object seq = items_of(h);
  if (!seq.is_valid())
    throw cf::ValueError(cf::str("[", op, "] ", what, " must be a sequence of ints, got ", type_of(h)));
  std::vector<int64_t> out;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  for (Py_ssize_t k = 0; k < n; ++k) out.push_back(int64_arg(PySequence_Fast_GET_ITEM(seq.ptr(), k), op, what));
  return out;
}

std::vector<int64_t> int64_or_list_arg(nb::handle h, const char* op, const char* what) {
  int64_t v = 0;
  if (index_value(h, op, what, v)) return {v};
  nb::object seq = items_of(h);
  if (!seq.is_valid())
    throw cf::ValueError(cf::str("[", op, "] ", what, " must be an int or a sequence of ints, got ", type_of(h)));
  return int64_list_arg(seq, op, what);
}

std::vector<int64_t> to_axes(nb::handle h, const char* op) {
  if (h.is_none()) return {};
  // a bool is an int to Python: t.mean(True) (keepdim meant) reduced axis 1
  CF_CHECK(!PyBool_Check(h.ptr()), ValueError, "[", op, "] axes must be None, an int or a sequence of ints, got a "
           "bool (keepdim is a keyword: keepdim=True)");
  return int64_or_list_arg(h, op, "axes");
}

cf::Reduction parse_reduction(const std::string& s, const char* op) {
  if (s == "mean") return cf::Reduction::Mean;
  if (s == "sum") return cf::Reduction::Sum;
  if (s == "none") return cf::Reduction::None;
  throw cf::ValueError(cf::str("[", op, "] reduction must be 'mean', 'sum' or 'none', got '", s, "'"));
}

namespace {

std::string py_type_name(nb::handle h) { return nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(h.ptr())))); }

cf::Tensor copy_tensor(const cf::Tensor& t, const char* op = "deepcopy") {
  CF_CHECK(!(t.requires_grad() && t.grad_fn() != nullptr), AutogradError,
           "[", op, "] only leaf tensors (made by the user, not by an op that records history) can be copied "
           "this way; copy t.detach() instead");
  nb::gil_scoped_release g;
  cf::NoGradGuard ng;
  cf::Tensor c = cf::clone(t.detach());
  if (t.requires_grad()) c.set_requires_grad(true);
  if (t.grad().defined()) c.set_grad(cf::clone(t.grad()));  // as PyTorch's deepcopy keeps .grad
  return c;
}

// A double as int64 where it fits (a C++ cast of inf, NaN or a huge value is undefined), else 0.
int64_t int64_t_or_zero(double v) { return v > -9223372036854775808.0 && v < 9223372036854775808.0 ? int64_t(v) : 0; }

// ---- tensors from Python data ----

struct Gathered {
  std::vector<double> f;
  std::vector<int64_t> i;
  bool all_bool = true, all_int = true;
};

void gather_nested(nb::handle h, size_t depth, cf::Shape& shape, Gathered& g) {
  // A NumPy scalar that is not a Python number (np.float32, np.bool_, np.int32): its Python value, so
  // np.bool_ stays a bool and np.float32(1.5) is taken (they were int64 and an error).
  if (!nb::isinstance<cf::Tensor>(h))  // (a 0-d cf tensor has its own branch below)
    if (nb::object v = scalar_item(h); v.is_valid()) {
      gather_nested(v, depth, shape, g);
      return;
    }
  if (PyBool_Check(h.ptr())) {
    CF_CHECK(depth == shape.size(), ValueError, "[tensor] ragged nested sequence at depth ", depth);
    bool b = h.ptr() == Py_True;
    g.f.push_back(b);
    g.i.push_back(b);
    return;
  }
  if (PyLong_Check(h.ptr()) || PyFloat_Check(h.ptr()) || (PyIndex_Check(h.ptr()) && !PySequence_Check(h.ptr()))) {
    CF_CHECK(depth == shape.size(), ValueError, "[tensor] ragged nested sequence at depth ", depth);
    g.all_bool = false;
    if (PyFloat_Check(h.ptr())) {
      g.all_int = false;
      double v = PyFloat_AS_DOUBLE(h.ptr());
      g.f.push_back(v);
      g.i.push_back(int64_t_or_zero(v));  // (unused: a float makes the tensor floating)
    } else {
      nb::int_ as_int(h);
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(as_int.ptr(), &overflow);
      if (overflow != 0)
        throw cf::ValueError(cf::str("[tensor] the integer ", nb::cast<std::string>(nb::str(as_int)),
                                     " does not fit in int64 (give it as a float for a floating tensor)"));
      if (v == -1 && PyErr_Occurred()) throw nb::python_error();
      g.f.push_back(double(v));
      g.i.push_back(int64_t(v));
    }
    return;
  }
  if (nb::isinstance<cf::Tensor>(h)) {  // a 0-d tensor inside a list
    cf::Tensor t = nb::cast<cf::Tensor>(h);
    CF_CHECK(t.numel() == 1 && depth == shape.size(), ValueError,
             "[tensor] a tensor inside a nested list must hold one value, got ", t.describe());
    g.all_bool = g.all_bool && t.dtype() == cf::kBool;
    g.all_int = g.all_int && (t.dtype() == cf::kInt64 || t.dtype() == cf::kBool);
    g.f.push_back(t.item());
    g.i.push_back(t.dtype() == cf::kInt64 ? t.item<int64_t>() : int64_t_or_zero(t.item()));
    return;
  }
  if (!PySequence_Check(h.ptr()) || PyUnicode_Check(h.ptr()))
    throw cf::ValueError(cf::str("[tensor] cannot make a tensor from ", py_type_name(h)));
  // (a list that contains itself, or one nested beyond any tensor's rank, recursed until the stack overflowed)
  CF_CHECK(depth < size_t(cf::kMaxDims), ShapeError, "[tensor] sequences nest deeper than ", cf::kMaxDims,
           " levels, the most dimensions a tensor has (or a list contains itself)");
  nb::object seq = nb::steal(PySequence_Fast(h.ptr(), "sequence"));
  if (!seq.is_valid()) throw nb::python_error();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  if (depth == shape.size()) {
    CF_CHECK(g.f.empty() || depth > 0, ValueError, "[tensor] ragged nested sequence at depth ", depth);
    if (!g.f.empty())
      throw cf::ValueError(cf::str("[tensor] ragged nested sequence: a sequence where a number was expected at depth ",
                                   depth));
    shape.push_back(n);
  } else {
    CF_CHECK(depth < shape.size() && shape[depth] == n, ValueError,
             "[tensor] ragged nested sequence: length ", n, " at depth ", depth, " where ",
             depth < shape.size() ? shape[depth] : -1, " was expected");
  }
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  for (Py_ssize_t k = 0; k < n; ++k) gather_nested(items[k], depth + 1, shape, g);
}

// An integer buffer element: `width` bytes (1, 2, 4 or 8), signed or not, widened to int64.
struct IntSource {
  int width = 8;
  bool is_signed = true;
};

int64_t read_int(const char* p, const IntSource& in, size_t at) {
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (in.width) {
    case 1: return in.is_signed ? int64_t(get(int8_t())) : int64_t(get(uint8_t()));
    case 2: return in.is_signed ? int64_t(get(int16_t())) : int64_t(get(uint16_t()));
    case 4: return in.is_signed ? int64_t(get(int32_t())) : int64_t(get(uint32_t()));
    default: break;
  }
  if (in.is_signed) return get(int64_t());
  const uint64_t v = get(uint64_t());
  CF_CHECK(v <= uint64_t(std::numeric_limits<int64_t>::max()), DTypeError, "[tensor] uint64 value ", v,
           " at element ", at, " is beyond int64 (largest 2^63 - 1)");
  return int64_t(v);
}

// The values of a buffer of T (float, double, Half, bool) or of integers (T = int64_t, read as `in` says).
// big_endian: the buffer's elements are stored most significant byte first ('>' or '!' formats; NumPy's
// '>f4' arrays): each is read reversed (cf runs on little-endian hosts only).
template <typename T>
cf::Tensor from_buffer_typed(const Py_buffer& b, const cf::Shape& shape, bool big_endian, IntSource in = {}) {
  std::vector<T> out(size_t(cf::numel_of(shape)));
  const char* base = static_cast<const char*>(b.buf);
  // Walk the strided buffer in row-major order.
  cf::Shape strides(size_t(b.ndim));
  for (int d = 0; d < b.ndim; ++d) strides[size_t(d)] = b.strides ? b.strides[d] : 0;
  if (!b.strides) {
    int64_t s = b.itemsize;
    for (int d = b.ndim - 1; d >= 0; --d) {
      strides[size_t(d)] = s;
      s *= b.shape[d];
    }
  }
  size_t k = 0;
  cf::for_each_offset(shape, strides, 0, [&](int64_t off) {
    const char* p = base + off;
    char swapped[8];
    if (big_endian && b.itemsize > 1) {
      std::reverse_copy(p, p + b.itemsize, swapped);
      p = swapped;
    }
    if constexpr (std::is_same_v<T, bool>) {
      out[k] = *reinterpret_cast<const bool*>(p);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      out[k] = read_int(p, in, k);
    } else {
      std::memcpy(&out[k], p, sizeof(T));
    }
    ++k;
  });
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<bool> vb(out.begin(), out.end());
    return cf::Tensor::from_vector(vb, shape);
  } else {
    return cf::Tensor::from_vector(out, shape);
  }
}

// A copy of a buffer-protocol object (NumPy array, memoryview, array.array).
bool tensor_from_buffer(nb::handle data, cf::Tensor& out) {
  if (!PyObject_CheckBuffer(data.ptr())) return false;
  // bytes are text more often than numbers (NumPy makes a string array of them): asked for, say so
  CF_CHECK(!PyBytes_Check(data.ptr()) && !PyByteArray_Check(data.ptr()), DTypeError,
           "[tensor] bytes are not numbers: decode them, or read them as integers with np.frombuffer(b, np.uint8)");
  Py_buffer b;
  if (PyObject_GetBuffer(data.ptr(), &b, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  struct Release {
    Py_buffer* b;
    ~Release() { PyBuffer_Release(b); }
  } release{&b};
  cf::Shape shape;
  for (int d = 0; d < b.ndim; ++d) shape.push_back(b.shape[d]);
  std::string fmt = b.format ? b.format : "B";
  // One element code after an optional byte-order prefix ('@', '=', '<' native or little-endian, '>', '!'
  // big-endian: swapped as read, as torch.tensor does); a repeat count or a struct ('2i', 'T{...}') is no
  // element type of cf's.
  const bool big_endian = !fmt.empty() && (fmt[0] == '>' || fmt[0] == '!');
  const size_t prefix = !fmt.empty() && (big_endian || fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<') ? 1 : 0;
  const char code = fmt.size() == prefix + 1 ? fmt.back() : '\0';
  // Integers of any width and signedness become int64 (the width is the buffer's itemsize: '@l' is 8 bytes
  // here, '<l' 4; a uint64 beyond int64 is refused, not wrapped).
  const bool int_code = code != '\0' && std::strchr("bBhHiIlLqQnN", code) != nullptr;
  const bool int_width = b.itemsize == 1 || b.itemsize == 2 || b.itemsize == 4 || b.itemsize == 8;
  if (code == 'f' && b.itemsize == 4) out = from_buffer_typed<float>(b, shape, big_endian);
  else if (code == 'd' && b.itemsize == 8) out = from_buffer_typed<double>(b, shape, big_endian);
  else if (code == 'e' && b.itemsize == 2) out = from_buffer_typed<cf::Half>(b, shape, big_endian);
  else if (int_code && int_width)
    out = from_buffer_typed<int64_t>(b, shape, big_endian, IntSource{int(b.itemsize), std::islower(code) != 0});
  else if (code == '?' && b.itemsize == 1) out = from_buffer_typed<bool>(b, shape, big_endian);
  else
    throw cf::DTypeError(cf::str("[tensor] buffer format '", fmt, "' (itemsize ", b.itemsize,
                                 ") is not float16/32/64, an integer of 8 to 64 bits or bool"));
  return true;
}

}  // namespace

cf::Tensor tensor_from_python(nb::handle data, std::optional<cf::DType> dtype, cf::Device device) {
  cf::Tensor t;
  if (nb::isinstance<cf::Tensor>(data)) {
    t = cf::clone(nb::cast<cf::Tensor>(data).detach());
  } else if (!tensor_from_buffer(data, t) && nb::hasattr(data, "__dlpack__") && !nb::isinstance<nb::list>(data)) {
    // another framework's tensor (PyTorch's, a CUDA array): its values copied, as torch.tensor(t) copies;
    // one that requires grad (a torch Parameter) is read through detach(), which DLPack export asks for
    const bool attached = nb::hasattr(data, "requires_grad") && nb::hasattr(data, "detach") &&
                          nb::cast<bool>(nb::bool_(data.attr("requires_grad")));
    t = cf::clone(from_dlpack_object(attached ? nb::object(data.attr("detach")()) : nb::borrow(data), false));
  } else if (!t.defined()) {
    cf::Shape shape;
    Gathered g;
    gather_nested(data, 0, shape, g);
    cf::DType dt = dtype ? *dtype : (g.all_bool && !g.f.empty()) ? cf::kBool : (g.all_int && !g.f.empty()) ? cf::kInt64 : cf::kFloat32;
    switch (dt) {
      case cf::DType::Float32:
        if (g.all_int && !g.f.empty())  // exact ints rounded once (past 2^53 a double has rounded them)
          t = cf::Tensor::from_vector(g.i, shape);
        else
          t = cf::Tensor::from_vector(std::vector<float>(g.f.begin(), g.f.end()), shape);
        break;
      case cf::DType::BFloat16:  // rounded once by the cast below, from the exact ints or the doubles
      case cf::DType::Float16:   // (through float32 first, 65519.999 became inf in float16 and not 65504)
        t = g.all_int && !g.f.empty() ? cf::Tensor::from_vector(g.i, shape) : cf::Tensor::from_vector(g.f, shape);
        break;
      case cf::DType::Float64: t = cf::Tensor::from_vector(g.f, shape); break;
      case cf::DType::Int64:
        CF_CHECK(g.all_int, DTypeError, "[tensor] float values cannot make an int64 tensor (cast after with .to)");
        t = cf::Tensor::from_vector(g.i, shape);
        break;
      case cf::DType::Bool: {
        std::vector<bool> vb;
        for (double v : g.f) vb.push_back(v != 0);
        t = cf::Tensor::from_vector(vb, shape);
        break;
      }
    }
  }
  if (dtype && t.dtype() != *dtype) t = cf::to(t, *dtype);
  if (device != t.device()) t = cf::to(t, device);
  return t;
}

namespace {

// ---- Python values out ----

nb::object scalar_to_python(const cf::Tensor& t) {
  switch (t.dtype()) {
    case cf::DType::Float32: return nb::float_(double(t.item<float>()));
    case cf::DType::Float64: return nb::float_(t.item<double>());
    case cf::DType::Int64: return nb::int_(t.item<int64_t>());
    case cf::DType::Bool: return nb::bool_(t.item<bool>());
    case cf::DType::BFloat16:
    case cf::DType::Float16: return nb::float_(t.item());
  }
  return nb::none();
}

template <typename T>
nb::object nested_list(const std::vector<T>& v, const cf::Shape& shape, size_t d, size_t& k) {
  if (d == shape.size()) {
    if constexpr (std::is_same_v<T, bool>) return nb::bool_(v[k++]);
    else if constexpr (std::is_same_v<T, int64_t>) return nb::int_(v[k++]);
    else return nb::float_(double(v[k++]));
  }
  nb::list l;
  for (int64_t i = 0; i < shape[d]; ++i) l.append(nested_list(v, shape, d + 1, k));
  return l;
}

nb::object tolist(const cf::Tensor& t) {
  size_t k = 0;
  switch (t.dtype()) {
    case cf::DType::Float32: return nested_list(t.to_vector<float>(), t.shape(), 0, k);
    case cf::DType::Float64: return nested_list(t.to_vector<double>(), t.shape(), 0, k);
    case cf::DType::Int64: return nested_list(t.to_vector<int64_t>(), t.shape(), 0, k);
    case cf::DType::Bool: {
      std::vector<bool> v = t.to_vector<bool>();
      return nested_list(v, t.shape(), 0, k);
    }
    case cf::DType::BFloat16:
    case cf::DType::Float16: {
      cf::NoGradGuard ng;
      return nested_list(cf::to(t.detach(), cf::kFloat32).to_vector<float>(), t.shape(), 0, k);
    }
  }
  return nb::none();
}

const char* typestr(cf::DType d) {
  switch (d) {
    case cf::DType::Float32: return "<f4";
    case cf::DType::Float64: return "<f8";
    case cf::DType::Int64: return "<i8";
    case cf::DType::Bool: return "|b1";
    case cf::DType::Float16: return "<f2";
    case cf::DType::BFloat16:
      throw cf::DTypeError("[__array__] NumPy has no bfloat16; convert with t.to(cf.float32) first");
  }
  return "";
}

// NumPy's __array_interface__ (version 3) of an _ArrayView: np.asarray(t) is a view of a CPU
// tensor's memory, kept alive by the _ArrayView NumPy holds as the base (t.__array__ below).
nb::dict array_interface(const cf::Tensor& t) {
  refuse_grad_export(t, "__array_interface__");
  CF_CHECK(t.device().is_cpu(), DeviceError, "[__array__] tensor is on ", t.device(),
           ": NumPy reads CPU memory only; copy it first with t.cpu()");
  nb::dict d;
  nb::list shape, strides;
  const int64_t es = int64_t(cf::dtype_size(t.dtype()));
  for (size_t i = 0; i < t.shape().size(); ++i) {
    shape.append(t.shape()[i]);
    strides.append(t.strides()[i] * es);
  }
  d["shape"] = nb::tuple(shape);
  d["strides"] = nb::tuple(strides);
  d["typestr"] = typestr(t.dtype());
  // NumPy refuses a null address (it then read the view as a sequence: a bare TypeError), and a tensor
  // with no element may have one (torch hands empty tensors over DLPack with data 0): any address serves,
  // since no element is read or written there
  alignas(16) static char no_element[16];
  const void* data = t.numel() == 0 && t.raw_data() == nullptr ? no_element : t.raw_data();
  d["data"] = nb::make_tuple(reinterpret_cast<uintptr_t>(data), false);
  d["version"] = 3;
  return d;
}

// ---- indexing ----

struct IndexItem {
  enum Kind { Int, Slice, None, Ellipsis, Tensor } kind;
  int64_t i = 0;
  nb::handle slice;
  cf::Tensor index;
  std::vector<int64_t> positions;  // a list's (or NumPy array's) values: negative ones count from the end
  int64_t axis = 0;                // a Tensor item's axis in the tensor the other items leave
  int64_t x_axis = 0;              // the axis of the indexed tensor it applies to (for errors)
  bool applied = false;            // a 0-d index tensor, applied as an int in place
};

// A flat or nested list of positions (ints), refusing bools: [True, False, True] is a mask in NumPy and
// PyTorch, and read as positions 1, 0, 1 it would select the wrong rows without a word.
// A Python int index (or anything with __index__) as int64; one beyond int64 is out of range of any
// axis (nanobind's cast reported it as a bare std::bad_cast).
int64_t index_int(nb::handle h, const char* op) {
  nb::int_ as_int(h);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(as_int.ptr(), &overflow);
  if (overflow != 0)
    throw cf::IndexError(cf::str("[", op, "] index ", nb::cast<std::string>(nb::str(as_int)),
                                 " is out of range (beyond int64)"));
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return int64_t(v);
}

void list_positions(nb::handle h, std::vector<int64_t>& out, cf::Shape& shape, size_t depth, const char* op) {
  const Py_ssize_t n = PyList_GET_SIZE(h.ptr());
  if (shape.size() <= depth) shape.push_back(int64_t(n));
  CF_CHECK(shape[depth] == int64_t(n), IndexError, "[", op, "] a list index must be rectangular");
  for (Py_ssize_t i = 0; i < n; ++i) {
    nb::handle e = PyList_GET_ITEM(h.ptr(), i);
    CF_CHECK(!PyBool_Check(e.ptr()), IndexError,
             "[", op, "] a list of bools is a mask, which cf's indexing does not take; use cf.where or masked_fill, "
             "or a list of positions");
    if (PyList_Check(e.ptr())) {
      CF_CHECK(out.empty() || shape.size() > depth + 1, IndexError, "[", op, "] a list index must be rectangular");
      list_positions(e, out, shape, depth + 1, op);
    } else {
      CF_CHECK(PyIndex_Check(e.ptr()), IndexError, "[", op, "] a list index holds ints, got ", py_type_name(e));
      CF_CHECK(shape.size() == depth + 1, IndexError, "[", op, "] a list index must be rectangular");
      out.push_back(index_int(e, op));
    }
  }
}

std::vector<IndexItem> parse_key(nb::handle key, const cf::Tensor& x, const char* op) {
  std::vector<IndexItem> items;
  auto one = [&](nb::handle h) {
    IndexItem it{};
    it.kind = IndexItem::Int;
    if (h.is_none()) {
      it.kind = IndexItem::None;
    } else if (h.ptr() == Py_Ellipsis) {
      it.kind = IndexItem::Ellipsis;
    } else if (PySlice_Check(h.ptr())) {
      it.kind = IndexItem::Slice;
      it.slice = h;
    } else if (nb::isinstance<cf::Tensor>(h)) {
      it.kind = IndexItem::Tensor;
      it.index = nb::cast<cf::Tensor>(h);
      CF_CHECK(it.index.dtype() == cf::kInt64, IndexError, "[", op, "] index tensors must be int64, got ",
               it.index.describe(), " (a boolean mask is taken as the whole key only: x[mask]; else cf.where or "
               "cf.masked_fill)");
    } else if (PyList_Check(h.ptr()) || (!PyLong_Check(h.ptr()) && nb::hasattr(h, "__array_interface__") &&
                                         nb::hasattr(h, "tolist") &&
                                         nb::len(nb::object(h.attr("shape"))) > 0)) {
      // a list, or a NumPy array of positions (its tolist(); a 0-d one is an int below)
      nb::object l = PyList_Check(h.ptr()) ? nb::borrow(h) : h.attr("tolist")();
      it.kind = IndexItem::Tensor;
      cf::Shape shape;
      list_positions(l, it.positions, shape, 0, op);
      if (shape.empty()) shape.push_back(0);
      it.index = cf::Tensor::from_vector(it.positions, shape);  // wrapped and moved to x's device where used
    } else if (PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
      it.i = index_int(h, op);
    } else {
      throw cf::IndexError(cf::str("[", op, "] unsupported index of type ", py_type_name(h),
                                   ": use ints, slices, None, ..., int64 tensors or lists of ints"));
    }
    items.push_back(std::move(it));
  };
  if (PyTuple_Check(key.ptr())) {
    for (nb::handle h : nb::borrow<nb::tuple>(key)) one(h);
  } else {
    one(key);
  }
  return items;
}

// An index item's positions as an int64 tensor on y's device, -n <= p < 0 counted from the end of the axis
// (of size n), as for a list; anything further out is left for the range check of whoever uses it. A CPU
// index is scanned in place and copied only when it holds such a position; a CUDA index stays on its
// device (tensor ops, no host read).
cf::Tensor wrapped_index(IndexItem& it, int64_t n, const cf::Device& device) {
  if (!it.positions.empty()) {  // from a list
    for (int64_t& p : it.positions)
      if (p < 0 && p >= -n) p += n;
    return cf::Tensor::from_vector(it.positions, it.index.shape()).to(device);
  }
  cf::Tensor index = it.index.device() == device ? it.index : it.index.to(device);
  if (index.device().is_cpu()) {
    cf::Tensor c = cf::contiguous(index);
    const int64_t* p = c.data<int64_t>();
    const int64_t count = c.numel();
    if (!std::any_of(p, p + count, [n](int64_t v) { return v < 0 && v >= -n; })) return index;
    std::vector<int64_t> w(p, p + count);
    for (int64_t& v : w) v += (v < 0 && v >= -n) ? n : 0;
    return cf::Tensor::from_vector(w, c.shape());
  }
  cf::Tensor wrap = cf::logical_and(cf::lt(index, 0.0), cf::ge(index, -double(n)));
  return cf::where(wrap, cf::add(index, double(n)), index);
}

// wrapped_index for axis `axis` of y, range-checked against it (on a GPU a deferred check: no host read).
cf::Tensor checked_index(IndexItem& it, const cf::Tensor& y, int64_t axis, const char* op) {
  const int64_t n = y.shape()[size_t(axis)];
  cf::Tensor index = wrapped_index(it, n, y.device());
  cf::kernels::check_index_range(op, index, n, [op, x_axis = it.x_axis, n, shape = index.shape()](int64_t at,
                                                                                                  int64_t v) {
    throw cf::IndexError(cf::str("[", op, "] index ", v, " (at flat position ", at, " of the index of shape ",
                                 cf::shape_str(shape), ") is out of range for axis ", x_axis, " of size ", n));
  });
  return index;
}

// advanced_index's selection (b's positions, then y's other axes) read through a view of y's memory, when no
// gradient is recorded (index_select through make_view records none): its axis 0 runs over storage offsets,
// which the indexed axes' offsets sum to, and its other axes keep y's strides. The general path's
// reshape(permute(y)) copies all of y unless the indexed axes are one run of memory (x[i, j] of a large tensor;
// key_positions' stride-0 coordinates, which it made as large as x). Undefined when a gradient is recorded
// or the view's element count would not fit int64.
cf::Tensor select_without_copy(const cf::Tensor& y, const std::vector<cf::Tensor>& index,
                               const std::vector<int64_t>& axes, const cf::Shape& b, const cf::Shape& rows) {
  if ((cf::grad_enabled() && y.requires_grad()) || y.numel() == 0) return cf::Tensor();
  cf::Tensor offsets;
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t len = y.shape()[size_t(axes[i])], st = y.strides()[size_t(axes[i])];
    const cf::Tensor term = cf::mul(cf::expand(index[i], b), double(st));
    offsets = offsets.defined() ? cf::add(offsets, term) : term;
    ((len - 1) * st < 0 ? lo : hi) += (len - 1) * st;
  }
  cf::Shape shape{hi - lo + 1}, strides{1};
  double count = double(hi - lo + 1);
  for (int64_t a = 0, r = 1; a < y.dim(); ++a)
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) {
      shape.push_back(rows[size_t(r++)]);
      strides.push_back(y.strides()[size_t(a)]);
      count *= double(y.shape()[size_t(a)]);
    }
  if (count * double(cf::dtype_size(y.dtype())) > 9.0e18) return cf::Tensor();
  const cf::Tensor memory = cf::make_view(y, shape, strides, y.offset() + lo);
  return cf::index_select(memory, 0, cf::reshape(lo == 0 ? offsets : cf::sub(offsets, double(lo)), {-1}));
}

// Several index tensors (PyTorch's and NumPy's advanced indexing; ints count as basic indexing, as in
// PyTorch): the indices broadcast together to a shape B, and out[b, ...] = y[i1[b], i2[b], ..., ...]. B
// takes the indexed axes' place when they are adjacent, else it comes first. One index_select over the
// indexed axes flattened into one (row-major positions), so the gradient is index_select's.
cf::Tensor advanced_index(const cf::Tensor& y, const std::vector<IndexItem*>& tensors, const char* op) {
  const size_t k = tensors.size();
  std::vector<int64_t> axes;
  std::vector<bool> indexed(size_t(y.dim()), false);
  cf::Shape b;
  std::vector<cf::Tensor> index(k);
  for (size_t i = 0; i < k; ++i) {
    const int64_t axis = tensors[i]->axis;
    axes.push_back(axis);
    indexed[size_t(axis)] = true;
    // Each index against its own axis: in the flattened positions an out-of-range one would select
    // another element without a word
    index[i] = checked_index(*tensors[i], y, axis, op);
    b = i == 0 ? index[i].shape() : cf::broadcast_shapes(b, index[i].shape(), op);
  }
  // Row-major position over the indexed axes: sum of i_j * (product of the later indexed axes' sizes)
  cf::Tensor linear;
  int64_t stride = 1;
  for (size_t i = k; i-- > 0;) {
    cf::Tensor term = stride == 1 ? cf::expand(index[i], b) : cf::mul(cf::expand(index[i], b), double(stride));
    linear = linear.defined() ? cf::add(linear, term) : term;
    stride *= y.shape()[size_t(axes[i])];
  }
  std::vector<int64_t> perm = axes;
  cf::Shape rows{stride};
  for (int64_t a = 0; a < y.dim(); ++a)
    if (!indexed[size_t(a)]) {
      perm.push_back(a);
      rows.push_back(y.shape()[size_t(a)]);
    }
  cf::Tensor sel = select_without_copy(y, index, axes, b, rows);
  if (!sel.defined()) {
    cf::Tensor flat = cf::reshape(cf::permute(y, perm), rows);  // (a copy of y unless the axes are one run)
    sel = cf::index_select(flat, 0, cf::reshape(linear, {-1}));
  }
  cf::Shape s = b;
  s.insert(s.end(), rows.begin() + 1, rows.end());
  cf::Tensor out = cf::reshape(sel, s);
  bool adjacent = true;
  for (size_t i = 1; i < k; ++i) adjacent = adjacent && axes[i] == axes[i - 1] + 1;
  if (!adjacent || axes[0] == 0) return out;
  // adjacent: B moves to where the first indexed axis was (after the axes before it)
  const int64_t nb_ = int64_t(b.size()), before = axes[0];
  std::vector<int64_t> order;
  for (int64_t a = 0; a < before; ++a) order.push_back(nb_ + a);
  for (int64_t a = 0; a < nb_; ++a) order.push_back(a);
  for (int64_t a = nb_ + before; a < out.dim(); ++a) order.push_back(a);
  return cf::permute(out, order);
}

// x[key] for a key of basic items and index tensors (not a bool mask); op names the caller in errors.
cf::Tensor index_tensor(const cf::Tensor& x, nb::handle key, const char* op) {
  std::vector<IndexItem> items = parse_key(key, x, op);
  int64_t consuming = 0, ellipses = 0;
  for (auto& it : items) {
    if (it.kind == IndexItem::Ellipsis) ++ellipses;
    else if (it.kind != IndexItem::None) ++consuming;
  }
  CF_CHECK(ellipses <= 1, IndexError, "[", op, "] an index can only have a single ellipsis ('...')");
  CF_CHECK(consuming <= x.dim(), IndexError, "[", op, "] too many indices (", consuming, ") for ",
           x.describe());
  cf::Tensor y = x;
  int64_t d = 0;   // the axis of y the next item applies to
  int64_t xa = 0;  // and of x (for errors)
  int tensor_items = 0;
  for (auto& it : items) {
    switch (it.kind) {
      case IndexItem::None: y = cf::unsqueeze(y, d++); break;
      case IndexItem::Ellipsis: {
        // The ellipsis stands for the axes that the items after it leave over:
        // those apply to the last axes of y.
        int64_t consuming_after = 0;
        bool after = false;
        for (auto& jt : items) {
          if (&jt == &it) after = true;
          else if (after && (jt.kind == IndexItem::Int || jt.kind == IndexItem::Slice || jt.kind == IndexItem::Tensor))
            ++consuming_after;
        }
        d = y.dim() - consuming_after;
        xa = x.dim() - consuming_after;
        break;
      }
      case IndexItem::Int: {
        int64_t n = y.shape()[size_t(d)];
        int64_t i = it.i < 0 ? it.i + n : it.i;
        CF_CHECK(i >= 0 && i < n, IndexError, "[", op, "] index ", it.i, " is out of range for axis ", xa,
                 " of size ", n, " in ", x.describe());
        y = cf::squeeze(cf::narrow(y, d, i, 1), d);
        ++xa;
        break;
      }
      case IndexItem::Slice: {
        Py_ssize_t start, stop, step;
        // A zero step as cf's error naming the op (Python's own is "slice step cannot be zero")
        nb::object step_value = nb::borrow(it.slice).attr("step");
        if (PyLong_Check(step_value.ptr()) && PyObject_Not(step_value.ptr()) == 1)
          throw cf::IndexError(cf::str("[", op, "] slice steps must be positive, got 0"));
        if (PySlice_Unpack(it.slice.ptr(), &start, &stop, &step) != 0) throw nb::python_error();
        CF_CHECK(step > 0, IndexError, "[", op, "] slice steps must be positive, got ", step);
        int64_t n = y.shape()[size_t(d)];
        Py_ssize_t len = PySlice_AdjustIndices(Py_ssize_t(n), &start, &stop, step);
        if (!(start == 0 && len == n && step == 1))
          y = cf::slice(y, d, start, len > 0 ? start + (len - 1) * step + 1 : start, step);
        ++d;
        ++xa;
        break;
      }
      case IndexItem::Tensor:
        it.x_axis = xa++;
        if (it.index.dim() == 0 && it.positions.empty()) {
          // A 0-d index tensor is an int, as PyTorch's (its axis goes; an int64 NumPy 0-d array already is one),
          // selected on its device without reading it back
          const cf::Tensor index = checked_index(it, y, d, op);
          y = cf::squeeze(cf::index_select(y, d, cf::reshape(index, {1})), d);
          it.applied = true;
          break;
        }
        // Applied after the other items (below): they see this axis where it is now.
        it.axis = d++;
        ++tensor_items;
        break;
    }
  }
  if (tensor_items == 0) return y;
  std::vector<IndexItem*> tensors;
  for (auto& it : items)
    if (it.kind == IndexItem::Tensor && !it.applied) tensors.push_back(&it);
  if (tensors.size() == 1) {  // one index: its dims take the axis's place
    IndexItem& it = *tensors[0];
    const int64_t axis = it.axis;
    const cf::Tensor index = checked_index(it, y, axis, op);
    cf::Tensor sel = cf::index_select(y, axis, cf::reshape(index, {-1}));
    cf::Shape s = y.shape();
    s.erase(s.begin() + axis);
    s.insert(s.begin() + axis, index.shape().begin(), index.shape().end());
    return cf::reshape(sel, s);
  }
  return advanced_index(y, tensors, op);
}

// A value with more dims than the selection loses its leading size-1 dims, as NumPy and PyTorch drop them
// (x[0] = ones(1, 3) for a (2, 3) x); the rest broadcasts as copy_ does.
cf::Tensor drop_leading_ones(cf::Tensor src, int64_t dims) {
  int64_t drop = 0;
  while (src.dim() - drop > dims && src.shape()[size_t(drop)] == 1) ++drop;
  if (drop == 0) return src;
  return cf::reshape(src, cf::Shape(src.shape().begin() + drop, src.shape().end()));
}

// A bool tensor as the whole key (PyTorch's x[mask]): its shape is x's or x's leading dims'. Reading selects the
// true positions' elements (or rows) into a new (K, ...) tensor, which needs K: the mask is read back (a device
// synchronisation on a GPU, as PyTorch's), then one index_select (differentiable). Writing a number fills them.
bool is_mask_key(nb::handle key) {
  return nb::isinstance<cf::Tensor>(key) && nb::cast<const cf::Tensor&>(key).dtype() == cf::kBool;
}
void check_mask(const cf::Tensor& x, const cf::Tensor& mask, const char* op) {
  bool fits = mask.dim() <= x.dim();
  for (int64_t i = 0; fits && i < mask.dim(); ++i) fits = mask.shape()[size_t(i)] == x.shape()[size_t(i)];
  CF_CHECK(fits, IndexError, "[", op, "] a boolean mask ", mask.describe(), " must have the shape of ",
           x.describe(), " or of its leading dimensions");
}
cf::Tensor masked_select(const cf::Tensor& x, const cf::Tensor& mask) {
  check_mask(x, mask, "getitem");
  const std::vector<bool> keep = cf::reshape(mask, {mask.numel()}).to_vector<bool>();
  std::vector<int64_t> positions;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) positions.push_back(int64_t(i));
  cf::Shape rows{mask.numel()};
  for (int64_t i = mask.dim(); i < x.dim(); ++i) rows.push_back(x.shape()[size_t(i)]);
  const cf::Tensor index = cf::Tensor::from_vector(positions, {int64_t(positions.size())}).to(x.device());
  return cf::index_select(cf::reshape(x, rows), 0, index);
}
// A NumPy scalar or 0-d array (or another library's 0-d value) as the Python number it holds (np.int64 beyond
// 2^53 exactly); a cf tensor or anything else as it is.
nb::object python_value(nb::handle value) {
  if (!nb::isinstance<cf::Tensor>(value))
    if (nb::object item = scalar_item(value); item.is_valid()) return item;
  return nb::borrow(value);
}

// Values given as an array or (nested) list for x: in x's dtype, float data into an integer or bool x through
// float64 and then converted as copy_ converts (truncated, "nonzero"), as NumPy's and PyTorch's assignment
// (cf.tensor refuses float data for an integer dtype).
cf::Tensor values_from_python(nb::handle v, const cf::Tensor& x) {
  if (cf::is_floating(x.dtype())) return tensor_from_python(v, x.dtype(), x.device());
  const cf::Tensor inferred = tensor_from_python(v, std::nullopt, x.device());
  if (!cf::is_floating(inferred.dtype())) return inferred;
  return tensor_from_python(v, cf::kFloat64, x.device());
}

// A Python number (bool too) as a 0-d tensor of x's dtype, converted as basic setitem's fill_ (truncated into an
// integer x, "nonzero" into bool, an int64 beyond 2^53 exactly).
cf::Tensor number_value(nb::handle v, const cf::Tensor& x, const char* op) {
  if (auto exact = exact_int64_operand(v, x, op)) return *exact;
  cf::Tensor t = cf::Tensor::empty({}, x.dtype(), x.device());
  cf::fill_(t, nb::cast<double>(nb::float_(v)));
  return t;
}

// x seen flattened (row-major) with values (1-d, x's dtype, one per position) written at positions (1-d int64),
// or added to them (accumulate): the write of index setitem, put_, index_put_ and a boolean mask with tensor
// values. One cf::scatter_ (scatter_add_) into a 1-d view of x's memory at the positions' storage offsets (a
// strided x's from their coordinates): O(positions), no copy of x (it was rewritten whole per write; bfloat16 and
// float16 accumulation sums in a float32 scratch of the memory x spans). Of
// positions written more than once the last in the selection's row-major order stays (NumPy's rule; PyTorch
// leaves it open), values moved, never added (their bits kept: -0.0, NaN); accumulate adds them all. x's
// in-place checks under op's name (cf's rule: refused on an x that requires grad while recording, and for
// values that do); a position outside [0, numel) an IndexError naming op (on CUDA at the next host read).
void write_flat_(cf::Tensor& x, const cf::Tensor& positions, const cf::Tensor& values, bool accumulate,
                 const char* op) {
  cf::ops::check_inplace(x, op);
  cf::ops::check_inplace_source(values, op);
  cf::ops::check_no_internal_overlap(x, op);  // (an expand() view: one element, several positions)
  CF_CHECK(values.dtype() == x.dtype(), DTypeError, "[", op, "] the values must have x's dtype: ", values.describe(),
           " for ", x.describe());
  CF_CHECK(positions.dtype() == cf::kInt64 && positions.dim() == 1 && values.dim() == 1 &&
               values.numel() == positions.numel(),
           ShapeError, "[", op, "] ", values.describe(), " values for ", positions.describe(), " positions");
  const int64_t n = x.numel();
  cf::check_indices(op, positions, n, [&](int64_t, int64_t v) {
    throw cf::IndexError(cf::str("[", op, "] position ", v, " is out of range for the ", n, " elements of ",
                                 x.describe()));
  });
  if (positions.numel() == 0) {
    x.bump_version();  // (as scatter_ with an empty index: a write happened, of nothing)
    return;
  }
  cf::Tensor offsets = positions;
  int64_t lo = 0, hi = n - 1;  // x's elements' storage offsets, relative to its first element's
  if (!x.is_contiguous()) {  // the storage offset of each position: its coordinates times x's strides
    cf::Tensor rest = positions;
    offsets = cf::Tensor();
    hi = 0;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      const int64_t len = x.shape()[size_t(d)], stride = x.strides()[size_t(d)];
      const cf::Tensor divisor = cf::Tensor::full({}, double(len), cf::kInt64, x.device());
      const cf::Tensor coord = cf::remainder(rest, divisor);
      rest = cf::floor_divide(rest, divisor);
      const cf::Tensor part = coord * double(stride);
      offsets = offsets.defined() ? offsets + part : part;
      ((len - 1) * stride < 0 ? lo : hi) += (len - 1) * stride;
    }
    if (lo != 0) offsets = offsets - double(lo);
  }
  cf::Tensor flat = cf::make_view(x, {hi - lo + 1}, {1}, x.offset() + lo, op);
  if (accumulate) {  // (16-bit: cf::scatter_add_'s float32 scratch spans the view; it writes the targets only)
    cf::scatter_add_(flat, 0, offsets, values);
  } else {
    cf::scatter_(flat, 0, offsets, values);
  }
}

// x[key] = value or x[mask] = value with tensor values: value (a tensor, NumPy array, list or number) broadcast to
// the selection's shape (positions' shape) in x's dtype, written by write_flat_. Numbers convert as basic
// setitem's fill_, arrays and lists through cf.tensor in x's dtype.
void write_positions(cf::Tensor& x, const cf::Tensor& positions, nb::handle value, const char* op) {
  const cf::Shape& selected = positions.shape();
  nb::object v = python_value(value);
  cf::Tensor src;
  if (PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr())) {
    src = number_value(v, x, op);
  } else {
    src = nb::isinstance<cf::Tensor>(v) ? nb::cast<cf::Tensor>(v) : values_from_python(v, x);
    CF_CHECK(src.device() == x.device(), DeviceError, "[", op, "] the value ", src.describe(),
             " is on another device than ", x.describe());
    src = drop_leading_ones(src, int64_t(selected.size()));
    CF_CHECK(cf::broadcasts_to(src.shape(), selected), ShapeError, "[", op, "] a value of shape ",
             cf::shape_str(src.shape()), " cannot be broadcast to the selection's shape ", cf::shape_str(selected));
    cf::ops::check_inplace_source(src, op);  // (before the conversion below, which records)
  }
  nb::gil_scoped_release g;
  cf::Tensor values;
  {
    cf::NoGradGuard no_grad;
    // The values in x's dtype (as copy_ converts them), in the selection's row-major order
    values = cf::reshape(cf::expand(cf::to(src, x.dtype()), selected), {-1});
  }
  write_flat_(x, cf::reshape(positions, {-1}), values, false, op);
}

// x's flat positions (int64, x's shape) on x's device: indexing them with a key gives the positions the key
// selects, without touching x. (O(numel): for a mask, which is as large; a key goes through key_positions.)
cf::Tensor flat_positions(const cf::Tensor& x) {
  return cf::reshape(cf::Tensor::arange(x.numel(), cf::kInt64, x.device()), x.shape());
}

// The flat positions x[key] selects, in the selection's shape: the sum over x's axes of the key applied to
// that axis's coordinates (an arange seen at x's shape through a stride-0 view, so nothing of x's size is made:
// advanced_index reads it through select_without_copy) times the axis's row-major stride. O(sum of x's axis
// lengths + rank x selection).
cf::Tensor key_positions(const cf::Tensor& x, nb::handle key, const char* op) {
  if (x.dim() == 0) return index_tensor(flat_positions(x), key, op);  // (its errors)
  cf::Tensor positions;
  int64_t stride = 1;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    const int64_t len = x.shape()[size_t(d)];
    cf::Shape along(size_t(x.dim()), 1);
    along[size_t(d)] = len;
    const cf::Tensor coords =
        cf::expand(cf::reshape(cf::Tensor::arange(len, cf::kInt64, x.device()), along), x.shape());
    cf::Tensor part = index_tensor(coords, key, op);
    if (stride != 1) part = part * double(stride);
    positions = positions.defined() ? positions + part : part;
    stride *= len;
  }
  return positions;
}

// x[mask] = value. A number fills the true positions without reading the mask back (cf.where); anything else
// (a tensor, array or list of K values or rows, K the number of true positions, or one broadcast to them) is
// written as PyTorch's index_put_ with the mask: the mask is read back once (as getitem's, a device
// synchronisation on a GPU) for the positions it selects.
void masked_setitem(cf::Tensor& x, const cf::Tensor& mask, nb::handle item) {
  check_mask(x, mask, "setitem");
  const nb::object value = python_value(item);
  const bool number = PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr());  // (bool is an int)
  if (!number) return write_positions(x, masked_select(flat_positions(x), mask), value, "setitem");
  cf::Tensor m = mask;
  while (m.dim() < x.dim()) m = cf::unsqueeze(m, m.dim());  // a mask of the leading dims covers their rows
  const cf::Tensor v = number_value(value, x, "setitem");
  nb::gil_scoped_release g;
  cf::Tensor filled = [&] {
    cf::NoGradGuard no_grad;
    return cf::where(m, cf::expand(v, x.shape()), x);
  }();
  cf::copy_(x, filled);
}

// x[key] = value where key holds index tensors: the positions t[key] reads (key_positions, on x's device, no
// host read), then written in O(selection).
void index_setitem(cf::Tensor& x, nb::handle key, nb::handle value) {
  write_positions(x, key_positions(x, key, "setitem"), value, "setitem");
}

void setitem(cf::Tensor& x, nb::handle key, nb::handle value) {
  if (is_mask_key(key)) return masked_setitem(x, nb::cast<const cf::Tensor&>(key), value);
  for (const IndexItem& it : parse_key(key, x, "setitem"))
    if (it.kind == IndexItem::Tensor) return index_setitem(x, key, value);
  cf::Tensor view = index_tensor(x, key, "setitem");
  if (nb::isinstance<cf::Tensor>(value)) {
    cf::Tensor src = nb::cast<cf::Tensor>(value);
    nb::gil_scoped_release g;
    cf::copy_(view, drop_leading_ones(src, view.dim()));
  } else if (auto exact = exact_int64_operand(value, view, "setitem")) {
    nb::gil_scoped_release g;
    cf::copy_(view, *exact);
  } else if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    double v = nb::cast<double>(value);
    nb::gil_scoped_release g;
    cf::fill_(view, v);
  } else {
    cf::Tensor src = values_from_python(value, view);
    nb::gil_scoped_release g;
    cf::copy_(view, drop_leading_ones(src, view.dim()));
  }
}

std::string describe_repr(const cf::Tensor& t) {
  std::ostringstream os;
  os << t;
  std::string s = os.str();
  if (t.device().is_cuda()) s.insert(s.size() - 1, ", device='" + t.device().str() + "'");
  if (t.grad_fn()) s.insert(s.size() - 1, std::string(", grad_fn=") + t.grad_fn()->name);  // (cf prints requires_grad)
  return s;
}

}  // namespace

nb::class_<cf::Tensor> bind_tensor_class(nb::module_& m);

static const double kArrayPriority = 1000.0;

// What np.asarray(t) views: a detached handle on t's storage, kept by NumPy as the array's base. With
// the tensor itself as the base, giving the tensor other data later (Module.to, t.data = ...) freed
// the storage under the array, which then read and wrote whatever the allocator put there next.
struct ArrayView {
  cf::Tensor tensor;
};

namespace {
// TensorImpl -> its Python object (see common.h). Touched with the GIL held only. Every entry holds a weak
// reference, whose callback forgets the entry when the object dies. For a leaf that requires grad (a
// parameter) held by others too (a module's slot, an optimizer), the entry holds the object itself as well,
// as PyTorch preserves a parameter's object while C++ holds it: ids stay stable and a weak reference to a
// parameter lives as long as its module. sweep_wrappers() drops that strong reference once the object's
// own handle is the TensorImpl's last (the object then lives as long as Python holds it, no longer).
// Only parameters: "held by others" is a use count, which a brief second handle also raises (an op that
// returned its input, a batch's field read twice, a gradient slot until zero_grad), and holding such
// tensors until the next sweep kept hundreds of batches alive in a review's loops.
struct WrapperEntry {
  PyObject* weakref = nullptr;  // owned
  PyObject* strong = nullptr;   // owned while held by others too, else null
};
std::unordered_map<const void*, WrapperEntry>& wrapper_registry() {
  static auto* registry = new std::unordered_map<const void*, WrapperEntry>();  // never destroyed (exit order)
  return *registry;
}
// Entries after the last sweep: a sweep also runs when the registry doubles past that (besides each
// garbage collection), so a loop creating and dropping parameters never grows it without bound.
size_t swept_size = 0;
// Young collections since the last sweep (the gc callback sweeps after registry.size() / 256 of them).
size_t young_since_sweep = 0;

// Whether t's object is kept while others hold t: a parameter (a leaf that requires grad) held elsewhere.
bool worth_keeping(const cf::Tensor& t) noexcept {
  return t.is_leaf() && t.requires_grad() && t.impl_shared().use_count() > 1;
}

// The live object of an entry (borrowed), or null once it is gone.
PyObject* entry_object(const WrapperEntry& e) noexcept {
  if (e.strong) return e.strong;
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* obj = nullptr;  // a new reference, or null once the object is gone
  if (PyWeakref_GetRef(e.weakref, &obj) != 1) {
    PyErr_Clear();
    return nullptr;
  }
  Py_DECREF(obj);  // (alive: held by whoever held it before this call)
  return obj;
#else
  PyObject* obj = PyWeakref_GetObject(e.weakref);  // borrowed; None once the object is gone
  if (obj == nullptr || obj == Py_None) {
    PyErr_Clear();
    return nullptr;
  }
  return obj;
#endif
}

// The C++ tensor an object of the registry holds.
const cf::Tensor& object_tensor(PyObject* obj) noexcept { return *nb::inst_ptr<cf::Tensor>(obj); }

// Drops an entry's references after it left the registry (a dying object's callback then finds no entry).
void drop_entry(const WrapperEntry& e) noexcept {
  Py_XDECREF(e.weakref);
  Py_XDECREF(e.strong);
}
}  // namespace

size_t sweep_wrappers() noexcept {
  static bool sweeping = false;  // (a release's deallocation may start a collection, whose callback sweeps)
  if (sweeping) return 0;
  sweeping = true;
  auto& registry = wrapper_registry();
  size_t released = 0;
  // A released object may hold the last handle on another entry's TensorImpl holder (a parameter's
  // gradient): a few passes free such chains.
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<PyObject*> release;
    std::vector<WrapperEntry> stale;
    for (auto it = registry.begin(); it != registry.end();) {
      WrapperEntry& e = it->second;
      PyObject* obj = entry_object(e);
      if (!obj) {  // dead: its callback is due (or was lost); forget it now
        stale.push_back(e);
        it = registry.erase(it);
        continue;
      }
      const cf::Tensor& t = object_tensor(obj);
      if (t.impl_ptr() != it->first) {  // (an object never changes its TensorImpl; a guard all the same)
        stale.push_back(e);
        it = registry.erase(it);
        continue;
      }
      const bool held_elsewhere = worth_keeping(t);
      if (e.strong && !held_elsewhere) {
        release.push_back(e.strong);  // the object now lives as long as Python holds it
        e.strong = nullptr;
      } else if (!e.strong && held_elsewhere) {
        Py_INCREF(obj);
        e.strong = obj;
      }
      ++it;
    }
    // after the walk: a dying object's weak-reference callback edits the registry
    for (const WrapperEntry& e : stale) drop_entry(e);
    for (PyObject* obj : release) Py_DECREF(obj);
    released += release.size();
    if (release.empty()) break;
  }
  swept_size = registry.size();
  young_since_sweep = 0;
  sweeping = false;
  return released;
}

PyObject* nb_inst_find(const cf::Tensor* t) noexcept {
  // nanobind's own caster with policy none: the existing object (a new reference) or null, never a new one
  // (nb::find would come back through the Tensor caster above)
  return nb::detail::type_caster_base<cf::Tensor>::from_cpp(t, nb::rv_policy::none, nullptr).ptr();
}

PyObject* known_wrapper(const cf::Tensor& t) noexcept {
  auto& registry = wrapper_registry();
  if (registry.empty()) return nullptr;
  auto it = registry.find(t.impl_ptr());
  if (it == registry.end()) return nullptr;
  WrapperEntry& e = it->second;
  PyObject* obj = entry_object(e);
  if (!obj || object_tensor(obj).impl_ptr() != it->first) return nullptr;
  // (No upgrade to a strong entry here: t is often the caller's own copy, which counts as a second holder
  // for a moment; a user's leaf returned by an op as is was then kept after its del. The sweep, which sees
  // no such copies, and keep_wrapper upgrade parameters.)
  Py_INCREF(obj);
  return obj;
}

void keep_wrapper(const cf::Tensor& t) noexcept {
  if (!t.defined() || !worth_keeping(t)) return;
  auto& registry = wrapper_registry();
  auto it = registry.find(t.impl_ptr());
  if (it == registry.end() || it->second.strong) return;
  PyObject* obj = entry_object(it->second);
  if (!obj || object_tensor(obj).impl_ptr() != it->first) return;
  Py_INCREF(obj);
  it->second.strong = obj;
}

void remember_wrapper(const cf::Tensor& t, nb::handle h, bool shared, bool take_over) noexcept {
  if (!t.defined() || !t.is_leaf() || !(shared || t.requires_grad())) return;
  const void* key = t.impl_ptr();
  auto& registry = wrapper_registry();
  if (auto it = registry.find(key); it != registry.end()) {
    if (!take_over) return;
    const WrapperEntry old = it->second;
    registry.erase(it);  // (a dying object's callback then finds another entry, or none, and leaves it)
    drop_entry(old);
  }
  if (registry.size() >= 2 * swept_size + 64) sweep_wrappers();
  // The weak reference's callback forgets the entry when the object dies (while the object lives, it holds
  // the TensorImpl, so the key cannot be reused by another tensor meanwhile).
  static PyMethodDef forget_def = {
      "_forget_tensor_wrapper",
      [](PyObject* key_capsule, PyObject* weakref) -> PyObject* {
        const void* k = PyCapsule_GetPointer(key_capsule, nullptr);
        auto& reg = wrapper_registry();
        auto it = reg.find(k);
        if (it != reg.end() && it->second.weakref == weakref) {
          const WrapperEntry gone = it->second;
          reg.erase(it);
          drop_entry(gone);
        }
        Py_RETURN_NONE;
      },
      METH_O, nullptr};
  PyObject* capsule = PyCapsule_New(const_cast<void*>(key), nullptr, nullptr);
  PyObject* forget = capsule ? PyCFunction_New(&forget_def, capsule) : nullptr;
  PyObject* weakref = forget ? PyWeakref_NewRef(h.ptr(), forget) : nullptr;
  Py_XDECREF(forget);
  Py_XDECREF(capsule);
  if (!weakref) {  // (no entry: the object works, only without the identity)
    PyErr_Clear();
    return;
  }
  WrapperEntry e;
  e.weakref = weakref;  // the registry owns the weak reference
  if (shared && t.requires_grad()) {  // a parameter held elsewhere (worth_keeping)
    Py_INCREF(h.ptr());
    e.strong = h.ptr();
  }
  // The calls above may have run Python code (a collection, a weak reference's callback) that registered
  // this tensor meanwhile: the newer entry stays unless this one takes over, never both (an entry left
  // out of the map would hold its object forever).
  auto [it, inserted] = registry.emplace(key, e);
  if (!inserted) {
    if (take_over) {
      const WrapperEntry old = it->second;
      it->second = e;
      drop_entry(old);
    } else {
      drop_entry(e);
    }
  }
}

nb::class_<cf::Tensor> bind_tensor_class(nb::module_& m) {
  nb::class_<ArrayView>(m, "_ArrayView", "The base NumPy keeps for np.asarray(t): t's memory, not t.")
      .def_prop_ro("__array_interface__", [](const ArrayView& v) { return array_interface(v.tensor); });
  // (python/cf/_ops_extras.py: put_ and index_put_ write through these)
  m.def("_key_positions",
        [](const cf::Tensor& x, nb::handle key, const std::string& op) { return key_positions(x, key, op.c_str()); },
        nb::arg("x"), nb::arg("key").none(), nb::arg("op"),
        "The flat (row-major) positions x[key] selects, in the selection's shape, in O(selection).");
  m.def("_write_flat_",
        [](cf::Tensor& x, const cf::Tensor& positions, const cf::Tensor& values, bool accumulate,
           const std::string& op) -> cf::Tensor& {
          write_flat_(x, positions, values, accumulate, op.c_str());
          return x;
        },
        nb::arg("x"), nb::arg("positions"), nb::arg("values"), nb::arg("accumulate"), nb::arg("op"),
        nb::rv_policy::reference, release_gil(),
        "x seen flattened with values written (or added) at positions, in place, in O(positions); returns x.");
  m.def("_tensor_from_bytes",
        [](nb::bytes data, cf::DType dtype, std::vector<int64_t> shape, cf::Device device) {
          cf::Shape s(shape.begin(), shape.end());
          cf::Tensor t = cf::Tensor::empty(s, dtype);
          CF_CHECK(size_t(t.numel()) * cf::dtype_size(dtype) == data.size(), ValueError, "[unpickle] ", data.size(),
                   " bytes for a ", t.describe());
          if (data.size()) std::memcpy(t.raw_data(), data.c_str(), data.size());
          return device.is_cpu() ? t : t.to(device);
        },
        nb::arg("data"), nb::arg("dtype"), nb::arg("shape"), nb::arg("device"),
        "A tensor from its values' bytes (what pickling a cf.Tensor stores; cf._rebuild_tensor).");
  m.def("_tensor_objects_known", [] { return wrapper_registry().size(); },
        "How many tensors' Python objects the identity registry holds (a test's leak check).");
  m.def("_sweep_tensor_objects", [] { return sweep_wrappers(); },
        "Lets go of the tensor objects the identity registry kept for C++ holders that have since dropped "
        "their tensors; returns how many (also run after every garbage collection and by cf.empty_cache).");
  // After garbage collections (the gc module calls its callbacks with a phase and an info dict): after
  // every full one (gc.collect()), and after the young ones often enough that a sweep costs about one
  // entry in 256 per collection (25 ns an entry: 10k parameters' objects would cost 250 us at each of
  // the many young collections of a Python loop).
  nb::module_::import_("gc").attr("callbacks").attr("append")(nb::cpp_function(
      [](nb::handle phase, nb::handle info) {
        if (!PyUnicode_Check(phase.ptr()) || PyUnicode_CompareWithASCIIString(phase.ptr(), "stop") != 0) return;
        PyObject* gen = PyDict_Check(info.ptr()) ? PyDict_GetItemString(info.ptr(), "generation") : nullptr;
        const bool full = gen && PyLong_Check(gen) && PyLong_AsLong(gen) >= 2;
        if (full || ++young_since_sweep >= wrapper_registry().size() / 256) {
          sweep_wrappers();
        }
      },
      nb::arg("phase"), nb::arg("info")));
  auto cls = nb::class_<cf::Tensor>(
      m, "Tensor",
      "A cheap handle to strided storage (float32, float64, int64, bool, bfloat16 or float16) on the CPU or a CUDA device, with "
      "autograd fields. Views (slicing, reshape, transpose, ...) share storage. Build one with cf.tensor, the "
      "factories (cf.zeros, cf.randn, ...) or cf.from_dlpack.",
      nb::is_weak_referenceable());
  cls.def("__init__",
          [](cf::Tensor* t, nb::handle data, std::optional<cf::DType> dtype, cf::Device device, bool requires_grad) {
            new (t) cf::Tensor(tensor_from_python(data, dtype, device));
            if (requires_grad) {
              t->set_requires_grad(true);
              nb::object self = nb::steal(nb_inst_find(t));
              if (self.is_valid()) remember_wrapper(*t, self, false, true);
            }
          },
          nb::arg("data"), nb::arg("dtype") = nb::none(), nb::arg("device") = cf::Device::cpu(),
          nb::arg("requires_grad") = false,
          "A tensor copied from data: nested lists of numbers, a buffer (NumPy array), or another tensor. "
          "dtype: inferred (bool, int64, else float32) unless given.")
      // ---- metadata ----
      .def_prop_ro("dtype", &cf::Tensor::dtype)
      .def_prop_ro("device", &cf::Tensor::device)
      .def_prop_ro("shape", [](const cf::Tensor& t) { return t.shape(); }, "The dimensions, a tuple.")
      .def_prop_ro("strides", [](const cf::Tensor& t) { return t.strides(); }, "Strides in elements, a tuple.")
      .def_prop_ro("storage_offset", &cf::Tensor::offset, "Offset of the first element in its storage, in elements.")
      .def_prop_ro("ndim", &cf::Tensor::dim)
      .def("dim", &cf::Tensor::dim, "Number of dimensions.")
      .def("numel", &cf::Tensor::numel, "Number of elements.")
      .def("size", [](const cf::Tensor& t, std::optional<int64_t> axis) -> nb::object {
             if (axis) return nb::int_(t.size(*axis));
             return nb::cast(t.shape());
           }, nb::arg("axis") = nb::none(), nb::sig("def size(self, axis: int | None = None) -> int | tuple[int, ...]"),
           "The shape, or the size of one axis.")
      .def_prop_ro("nbytes", [](const cf::Tensor& t) { return int64_t(t.nbytes()); })
      .def("is_contiguous", &cf::Tensor::is_contiguous)
      .def("data_ptr", [](const cf::Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()); },
           "Address of the first element on the tensor's device.")
      .def("shares_storage", &cf::Tensor::shares_storage, nb::arg("other"), "True when both view one storage.")
      .def_prop_ro("version", &cf::Tensor::version, "The storage's version counter (bumped by in-place writes).")
      .def("_bump_version", &cf::Tensor::bump_version,
           "Counts a write made outside cf (NumPy's out= through a view: cf.Tensor.__array_function__).")
      // ---- autograd ----
      .def_prop_rw("requires_grad", &cf::Tensor::requires_grad,
                   [](cf::Tensor& t, bool on) {
                     t.set_requires_grad(on);
                     nb::object self = nb::steal(nb_inst_find(&t));
                     remember_wrapper(t, self, t.impl_shared().use_count() > 1, true);
                   },
                   "Whether ops on this tensor record history. Only float tensors can require grad.")
      .def("requires_grad_",
           [](cf::Tensor& t, bool on) -> cf::Tensor& {
             t.set_requires_grad(on);
             nb::object self = nb::steal(nb_inst_find(&t));
             remember_wrapper(t, self, t.impl_shared().use_count() > 1, true);
             return t;
           },
           nb::arg("requires_grad") = true, nb::rv_policy::reference, "Set requires_grad in place; returns self.")
      .def_prop_rw("grad",
                   [](const cf::Tensor& t) -> std::optional<cf::Tensor> {
                     cf::Tensor g = t.grad();
                     if (!g.defined()) return std::nullopt;
                     return g;
                   },
                   [](const cf::Tensor& t, std::optional<cf::Tensor> g) {
                     if (g) t.set_grad(*g);
                     else t.zero_grad();
                   },
                   nb::arg("grad").none(),
                   "The accumulated gradient (None before backward reaches this tensor). Setting None drops it.")
      .def_prop_ro("grad_fn", [](const cf::Tensor& t) -> std::optional<std::string> {
                     if (!t.grad_fn()) return std::nullopt;
                     return std::string(t.grad_fn()->name);
                   }, "The registry name of the op that produced this tensor, or None for a leaf.")
      .def_prop_ro("is_leaf", &cf::Tensor::is_leaf)
      .def("backward",
           [](const cf::Tensor& t, std::optional<cf::Tensor> grad, bool retain_graph) {
             nb::gil_scoped_release g;
             t.backward(grad ? *grad : cf::Tensor(), retain_graph);
           },
           nb::arg("grad") = nb::none(), nb::arg("retain_graph") = false,
           "Backpropagate from this tensor into the leaves' .grad (accumulating). grad may be omitted for a "
           "one-element tensor. The graph is freed unless retain_graph.")
      .def("retain_grad",
           [](const cf::Tensor& t) { cf::autograd::retain_grad(t); },
           "Keep this non-leaf tensor's gradient in .grad at later backward passes, as PyTorch's retain_grad "
           "(a leaf keeps its own anyway).")
      .def("detach", &cf::Tensor::detach, "Same storage, no autograd history.")
      .def_prop_rw("data", &cf::Tensor::detach, [](cf::Tensor& t, const cf::Tensor& src) { t.set_data(src); },
                   "Read: detach(). Assign: this tensor (every reference to it) shows src's storage, shape, "
                   "dtype and device without a copy, keeping its identity and requires_grad, as PyTorch's "
                   "t.data = src; a gradient that no longer fits is dropped.")
      .def("zero_grad", &cf::Tensor::zero_grad, "Drop the accumulated gradient.")
      // ---- values ----
      .def("item", &scalar_to_python, nb::sig("def item(self) -> float | int | bool"),
           "The single value as a Python float, int or bool.")
      .def("tolist", &tolist, nb::sig("def tolist(self) -> typing.Any"), "Nested Python lists (a number for a 0-d tensor).")
      .def("__float__", [](const cf::Tensor& t) { return t.item(); })
      // int64 exactly (not through a double); a float as Python's int(float) takes it: truncated,
      // OverflowError for an infinity, ValueError for NaN (a C++ cast of those is undefined)
      .def("__int__", [](const cf::Tensor& t) -> nb::object {
        if (t.dtype() == cf::kInt64) return nb::int_(t.item<int64_t>());
        return nb::int_(nb::float_(t.item()));
      }, nb::sig("def __int__(self) -> int"))
      .def("__index__", [](const cf::Tensor& t) -> int64_t {
        CF_CHECK(t.dtype() == cf::kInt64 || t.dtype() == cf::kBool, DTypeError,
                 "[__index__] only integer tensors can be used as an index, got ", t.describe());
        return t.dtype() == cf::kInt64 ? t.item<int64_t>() : int64_t(t.item());
      })
      .def("__bool__", [](const cf::Tensor& t) {
        CF_CHECK(t.numel() == 1, ValueError, "[__bool__] the truth value of a tensor with ", t.numel(),
                 " elements is ambiguous; use cf.amax / cf.amin or compare elements");
        return t.item() != 0.0;
      })
      .def("__len__", [](const cf::Tensor& t) {
        CF_CHECK(t.dim() > 0, ShapeError, "[__len__] len() of a 0-d tensor");
        return t.shape()[0];
      })
      // copy.copy / copy.deepcopy: a new tensor with its own memory, as PyTorch's deepcopy of a leaf
      // (same dtype and device; a leaf that requires grad gives one that does; no autograd history)
      // pickle: (cf._rebuild_tensor, (bytes of the values, dtype name, shape, device, requires_grad)); a
      // CUDA tensor comes back on its device; a non-leaf is refused as by deepcopy
      .def("__reduce__", [](const cf::Tensor& t) {
        const cf::Tensor c = copy_tensor(t, "pickle").detach().to(cf::Device::cpu());
        nb::bytes data(static_cast<const char*>(c.raw_data()), size_t(c.numel()) * cf::dtype_size(c.dtype()));
        nb::list shape;
        for (int64_t n : c.shape()) shape.append(n);
        return nb::make_tuple(nb::module_::import_("cf").attr("_rebuild_tensor"),
                              nb::make_tuple(data, cf::dtype_name(t.dtype()), nb::tuple(shape), t.device().str(),
                                             t.requires_grad()));
      })
      .def("__copy__", [](const cf::Tensor& t) { return copy_tensor(t); })
      .def("__deepcopy__", [](const cf::Tensor& t, nb::handle) { return copy_tensor(t); }, nb::arg("memo"))
      .def("__repr__", &describe_repr)
      // f"{loss:.4f}": a format spec formats a 0-d tensor's value, as PyTorch's; an empty one is str(t)
      .def("__format__",
           [](nb::handle self, const std::string& spec) -> nb::object {
             if (spec.empty()) return nb::str(self);
             const cf::Tensor& t = nb::cast<const cf::Tensor&>(self);
             if (t.dim() != 0)
               throw nb::type_error(("[__format__] the format spec '" + spec + "' needs a 0-d tensor (its value), got " +
                                     t.describe())
                                        .c_str());
             return nb::module_::import_("builtins").attr("format")(scalar_to_python(t), spec);
           },
           nb::arg("format_spec"))
      // identity, as object's: the address rotated by 4 bits (its low bits are always 0)
      .def("__hash__", [](nb::handle self) {
        const uintptr_t p = reinterpret_cast<uintptr_t>(self.ptr());
        const intptr_t h = intptr_t((p >> 4) | (p << (8 * sizeof(p) - 4)));
        return h == -1 ? intptr_t(-2) : h;
      })
      // np.asarray(t), t.numpy(): NumPy views the memory through an _ArrayView (see there)
      // NumPy >= 2 passes copy= and then trusts it: copy=True must copy (np.array(t)), copy=False must
      // not (a dtype change is then a ValueError, NumPy's rule), None copies only to change the dtype.
      .def("__array__", [](const cf::Tensor& t, nb::handle dtype, nb::handle copy) {
        refuse_grad_export(t, "__array__");
        nb::object np = nb::module_::import_("numpy");
        nb::object a = np.attr("asarray")(nb::cast(ArrayView{t.detach()}));
        const std::optional<bool> copy_asked = optional_bool_arg(copy, "__array__", "copy");
        const bool want_copy = copy_asked == true;
        const bool no_copy = copy_asked == false;
        if (!dtype.is_none() && !nb::cast<bool>(a.attr("dtype").attr("__eq__")(np.attr("dtype")(dtype)))) {
          if (no_copy)
            throw nb::value_error(cf::str("[__array__] ", t.describe(), " as ", nb::cast<std::string>(nb::str(dtype)),
                                          " needs a copy, and copy=False was asked").c_str());
          return nb::object(a.attr("astype")(dtype));  // a new array
        }
        return want_copy ? nb::object(a.attr("copy")()) : a;
      }, nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      // NumPy's scalars and arrays defer to the tensor's operators, which take them (ops.cpp), as they do
      // for PyTorch's tensors: np.float32(2) * t and np.ones(3) + t are tensors
      .def_ro_static("__array_priority__", &kArrayPriority)
      .def("numpy", [](nb::handle self) { return nb::module_::import_("numpy").attr("asarray")(self); },
           "A NumPy array sharing this CPU tensor's memory (no copy). Refused for a tensor that requires grad "
           "(as in PyTorch): use t.detach().numpy().")
      // ---- indexing ----
      .def("__getitem__",
           [](const cf::Tensor& t, nb::handle key) {
             if (is_mask_key(key)) return masked_select(t, nb::cast<const cf::Tensor&>(key));
             return index_tensor(t, key, "getitem");
           },
           nb::arg("key").none(),
           "Basic indexing gives views: ints, slices (positive steps), None, Ellipsis. An int64 tensor or a list "
           "of ints selects a copy (index_select); negative positions count from the end. Several of them index "
           "together as PyTorch's advanced indexing: broadcast to one shape, which takes the indexed axes' place "
           "when they are adjacent and comes first otherwise (ints are basic indexing, as in PyTorch). A bool "
           "tensor of t's shape (or of its leading dims) selects the true positions' elements (rows) into a new "
           "tensor, reading the mask back (a device synchronisation on a GPU, as PyTorch's).")
      .def("__setitem__", &setitem, nb::arg("key").none(), nb::arg("value"),
           "Write a tensor (broadcast, dtype converted) or a number into the view t[key], in place; with a bool "
           "mask as the key (t[mask] = 0.0), a number into the true positions. With index tensors or lists in "
           "the key (PyTorch's index_put_), into the positions t[key] reads; a position selected more than once "
           "keeps the last value written (as NumPy's assignment).");
  return cls;
}

}  // namespace cfpy
