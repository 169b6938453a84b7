// PyTorch's tensor conveniences that scripts ported to cf reach for (a porting hunt's list), each built from
// cf's registry ops, so autograd and every device work through them unchanged: t.t(), t.mT, chunk, unbind,
// *_as, std, norm, all / any, isnan / isinf / isfinite, tril / triu, new_zeros & co., eye, linspace, randperm,
// bmm, allclose, equal. No kernel of their own: a new op of the registry would need the whole op anatomy
// (DESIGN.md).
#include <cmath>
#include <limits>

#include "autograd/ops/common.h"
#include "common.h"

namespace cfpy {

using cf::Tensor;

namespace {

int64_t wrap_axis(int64_t axis, int64_t dim, const char* op) {
  CF_CHECK(axis >= -std::max<int64_t>(dim, 1) && axis < std::max<int64_t>(dim, 1), IndexError, "[", op, "] dim ",
           axis, " out of range for a tensor of ", dim, " dimensions");
  return axis < 0 ? axis + std::max<int64_t>(dim, 1) : axis;
}

Tensor t2(const Tensor& x) {
  CF_CHECK(x.dim() <= 2, ShapeError, "[t] expects a tensor of at most 2 dimensions, got ", x.describe(),
           " (transpose(a, b) or mT for the last two)");
  return x.dim() == 2 ? cf::transpose(x, 0, 1) : x;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  CF_CHECK(chunks > 0, ValueError, "[chunk] chunks must be positive, got ", chunks);
  const int64_t d = wrap_axis(dim, x.dim(), "chunk");
  CF_CHECK(x.dim() > 0, ShapeError, "[chunk] expects a tensor of at least one dimension, got ", x.describe());
  const int64_t n = x.shape()[size_t(d)];
  const int64_t size = std::max<int64_t>(1, (n + chunks - 1) / chunks);  // PyTorch's: ceil(n / chunks) each
  return cf::split(x, size, d);
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  CF_CHECK(x.dim() > 0, ShapeError, "[unbind] expects a tensor of at least one dimension, got ", x.describe());
  const int64_t d = wrap_axis(dim, x.dim(), "unbind");
  std::vector<Tensor> out;
  for (int64_t i = 0; i < x.shape()[size_t(d)]; ++i) out.push_back(cf::squeeze(cf::narrow(x, d, i, 1), d));
  return out;
}

// Where x is NaN / +-inf (false everywhere for integer and bool tensors).
Tensor isnan(const Tensor& x) {
  if (!cf::is_floating(x.dtype())) return Tensor::zeros(x.shape(), cf::kBool, x.device());
  return cf::ne(x, x);
}
Tensor isinf(const Tensor& x) {
  if (!cf::is_floating(x.dtype())) return Tensor::zeros(x.shape(), cf::kBool, x.device());
  return cf::eq(cf::abs(x), std::numeric_limits<double>::infinity());
}
Tensor isfinite(const Tensor& x) {
  if (!cf::is_floating(x.dtype())) return Tensor::ones(x.shape(), cf::kBool, x.device());
  return cf::logical_not(cf::logical_or(isnan(x), isinf(x)));
}

// all / any: counts of the zero (false) elements, along dims or over all.
Tensor nonzero_mask(const Tensor& x) { return x.dtype() == cf::kBool ? x : cf::ne(x, 0.0); }
Tensor all(const Tensor& x, nb::handle dim, bool keepdim) {
  const Tensor zeros = cf::to(cf::logical_not(nonzero_mask(x)), cf::kInt64);
  return cf::eq(cf::sum(zeros, to_axes(dim, "all"), keepdim), 0.0);
}
Tensor any(const Tensor& x, nb::handle dim, bool keepdim) {
  const Tensor ones = cf::to(nonzero_mask(x), cf::kInt64);
  return cf::gt(cf::sum(ones, to_axes(dim, "any"), keepdim), 0.0);
}

Tensor std_dev(const Tensor& x, nb::handle dim, int64_t correction, bool keepdim) {
  return cf::sqrt(cf::var(x, to_axes(dim, "std"), correction, keepdim));
}

// The p-norm over dims (all: the whole tensor as one vector): 2, 1, inf, -inf or any p > 0.
Tensor norm(const Tensor& x, double p, nb::handle dim, bool keepdim) {
  CF_CHECK(cf::is_floating(x.dtype()), DTypeError, "[norm] takes a floating tensor, got ", x.describe());
  const cf::Axes axes = to_axes(dim, "norm");
  if (p == 2) {
    // Scaled by the largest |x| (a constant: the norm is homogeneous), so float16 squares do not overflow (300,
    // 400 gave inf); and 0 where the sum is 0, with a zero gradient there (sqrt's is infinite: 0 * inf gave NaN
    // for a zero vector, where PyTorch gives 0)
    const Tensor scale = cf::amax(cf::abs(x), axes, /*keepdim=*/true).detach();
    const Tensor safe_scale = cf::where(cf::eq(scale, 0.0), cf::ops::number_like(scale, 1.0, "norm"), scale);
    const Tensor s = cf::sum(cf::square(x / safe_scale), axes, /*keepdim=*/true);
    const Tensor zero = cf::eq(s, 0.0);
    const Tensor root = cf::sqrt(cf::where(zero, cf::ops::number_like(s, 1.0, "norm"), s));
    const Tensor n = cf::where(cf::logical_not(zero), root, 0.0) * safe_scale;
    return keepdim ? n : cf::sum(n, axes, false);  // (drops the size-1 reduced dims)
  }
  if (p == 1) return cf::sum(cf::abs(x), axes, keepdim);
  if (std::isinf(p)) return p > 0 ? cf::amax(cf::abs(x), axes, keepdim) : cf::amin(cf::abs(x), axes, keepdim);
  CF_CHECK(p > 0, ValueError, "[norm] p must be positive (or inf), got ", p);
  return cf::pow(cf::sum(cf::pow(cf::abs(x), p), axes, keepdim), 1.0 / p);
}

// tril / triu of the last two dims: keep col - row <= diagonal (tril) or >= diagonal (triu), zero the rest.
Tensor triangle(const Tensor& x, int64_t diagonal, bool lower, const char* op) {
  CF_CHECK(x.dim() >= 2, ShapeError, "[", op, "] expects a tensor of at least 2 dimensions, got ", x.describe());
  const int64_t rows = x.shape()[size_t(x.dim() - 2)], cols = x.shape()[size_t(x.dim() - 1)];
  const Tensor r = cf::unsqueeze(Tensor::arange(rows, cf::kInt64, x.device()), 1);
  const Tensor c = cf::unsqueeze(Tensor::arange(cols, cf::kInt64, x.device()), 0);
  const Tensor offset = c - r;  // (rows, cols)
  const Tensor keep = lower ? cf::le(offset, double(diagonal)) : cf::ge(offset, double(diagonal));
  return cf::where(keep, x, 0.0);
}

Tensor eye(int64_t n, std::optional<int64_t> m, cf::DType dtype, const cf::Device& device) {
  CF_CHECK(n >= 0 && m.value_or(0) >= 0, ValueError, "[eye] sizes must be >= 0, got ", n, " and ", m.value_or(n));
  const Tensor r = cf::unsqueeze(Tensor::arange(n, cf::kInt64, device), 1);
  const Tensor c = cf::unsqueeze(Tensor::arange(m.value_or(n), cf::kInt64, device), 0);
  return cf::to(cf::eq(r, c), dtype);
}

// steps values from start to end, both included, computed in float64 and converted once.
Tensor linspace(double start, double end, int64_t steps, cf::DType dtype, const cf::Device& device) {
  CF_CHECK(steps >= 0, ValueError, "[linspace] steps must be >= 0, got ", steps);
  CF_CHECK(cf::is_floating(dtype), DTypeError, "[linspace] dtype must be floating, got ", dtype);
  const double step = steps > 1 ? (end - start) / double(steps - 1) : 0.0;
  const Tensor i = cf::to(Tensor::arange(steps, cf::kInt64, device), cf::kFloat64);
  return cf::to(i * step + start, dtype);
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  const Tensor fa = cf::is_floating(a.dtype()) ? a : cf::to(a, cf::kFloat64);
  const Tensor fb = cf::is_floating(b.dtype()) ? b : cf::to(b, cf::kFloat64);
  // |a - b| <= atol + rtol |b| where the difference is finite (an infinite |b| makes the bound inf: 1 and inf
  // were "close"), or a == b (equal infinities, whose difference is NaN)
  const Tensor diff = cf::abs(fa - fb);
  Tensor close = cf::logical_and(isfinite(diff), cf::le(diff, cf::abs(fb) * rtol + atol));
  close = cf::logical_or(close, cf::eq(fa, fb));
  if (equal_nan) close = cf::logical_or(close, cf::logical_and(isnan(fa), isnan(fb)));
  return all(close, nb::none(), false).item<bool>();
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && all(cf::eq(a, b), nb::none(), false).item<bool>();
}

}  // namespace

void bind_torch_conveniences(nb::module_& m, nb::class_<Tensor>& cls) {
  cls.def("t", &t2, release_gil(), "The transpose of a 2-d tensor (a 0-d or 1-d one as it is), as PyTorch's t().");
  cls.def_prop_ro("mT", [](const Tensor& x) {
    CF_CHECK(x.dim() >= 2, ShapeError, "[mT] expects a tensor of at least 2 dimensions, got ", x.describe());
    return cf::transpose(x, -2, -1);
  }, "The last two dimensions swapped.");
  const char* chunk_doc = "chunks pieces along dim, each ceil(n / chunks) long but the last (PyTorch's chunk).";
  m.def("chunk", &chunk, nb::arg("x"), nb::arg("chunks"), nb::arg("dim") = 0, release_gil(), chunk_doc);
  cls.def("chunk", &chunk, nb::arg("chunks"), nb::arg("dim") = 0, release_gil(), chunk_doc);
  const char* unbind_doc = "The slices along dim, that dimension removed (PyTorch's unbind).";
  m.def("unbind", &unbind, nb::arg("x"), nb::arg("dim") = 0, release_gil(), unbind_doc);
  cls.def("unbind", &unbind, nb::arg("dim") = 0, release_gil(), unbind_doc);
  cls.def("expand_as", [](const Tensor& x, const Tensor& o) { return cf::expand(x, o.shape()); }, nb::arg("other"),
          "expand(other.shape).");
  cls.def("reshape_as", [](const Tensor& x, const Tensor& o) { return cf::reshape(x, o.shape()); }, nb::arg("other"),
          "reshape(other.shape).");
  cls.def("view_as", [](const Tensor& x, const Tensor& o) { return cf::view(x, o.shape()); }, nb::arg("other"),
          "view(other.shape).");
  cls.def("type_as", [](const Tensor& x, const Tensor& o) { return cf::to(x, o.dtype()); }, nb::arg("other"),
          "to(other.dtype).");
  for (auto [name, dtype] : {std::pair<const char*, cf::DType>{"bool", cf::kBool}, {"half", cf::kFloat16},
                             {"bfloat16", cf::kBFloat16}})
    cls.def(name, [dtype = dtype](const Tensor& x) { return cf::to(x, dtype); },
            (std::string("to(cf.") + (dtype == cf::kBool ? "bool" : dtype == cf::kFloat16 ? "float16" : "bfloat16") +
             ").").c_str());
  auto def_both = [&](const char* name, auto f, const char* doc, auto... args) {
    m.def(name, f, nb::arg("x"), args..., doc);
    cls.def(name, f, args..., doc);
  };
  def_both("std", &std_dev, "Standard deviation: sqrt(var) over dim (None: all), with `correction` (1: unbiased).",
           nb::arg("dim") = nb::none(), nb::arg("correction") = 1, nb::arg("keepdim") = false);
  def_both("norm", &norm, "The p-norm over dim (None: the whole tensor as one vector): p 2, 1, inf, -inf or > 0.",
           nb::arg("p") = 2.0, nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  // (methods only: a cf.all / cf.any would shadow Python's builtins under `from cf import *`)
  cls.def("all", &all, nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
          "Whether every element along dim (None: all) is true (non-zero); a bool tensor.");
  cls.def("any", &any, nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
          "Whether some element along dim (None: all) is true (non-zero); a bool tensor.");
  def_both("isnan", &isnan, "Where x is NaN (bool).");
  def_both("isinf", &isinf, "Where x is +-inf (bool).");
  def_both("isfinite", &isfinite, "Where x is neither NaN nor +-inf (bool).");
  def_both("tril", [](const Tensor& x, int64_t d) { return triangle(x, d, true, "tril"); },
           "The lower triangle of the last two dims (col - row <= diagonal), zeros above.", nb::arg("diagonal") = 0);
  def_both("triu", [](const Tensor& x, int64_t d) { return triangle(x, d, false, "triu"); },
           "The upper triangle of the last two dims (col - row >= diagonal), zeros below.", nb::arg("diagonal") = 0);
  cls.def("new_zeros", [](const Tensor& x, const cf::Shape& s) { return Tensor::zeros(s, x.dtype(), x.device()); },
          nb::arg("size"), "Zeros of x's dtype and device.");
  cls.def("new_ones", [](const Tensor& x, const cf::Shape& s) { return Tensor::ones(s, x.dtype(), x.device()); },
          nb::arg("size"), "Ones of x's dtype and device.");
  cls.def("new_full",
          [](const Tensor& x, const cf::Shape& s, double v) { return Tensor::full(s, v, x.dtype(), x.device()); },
          nb::arg("size"), nb::arg("fill_value"), "A tensor of x's dtype and device filled with fill_value.");
  m.def("eye", &eye, nb::arg("n"), nb::arg("m").none() = nb::none(), nb::arg("dtype") = cf::kFloat32,
        nb::arg("device") = cf::Device::cpu(), "The (n, m) identity (m None: n).");
  m.def("linspace", &linspace, nb::arg("start"), nb::arg("end"), nb::arg("steps"), nb::arg("dtype") = cf::kFloat32,
        nb::arg("device") = cf::Device::cpu(), "steps evenly spaced values from start to end, both included.");
  m.def(
      "randperm",
      [](int64_t n, cf::Generator* gen, const cf::Device& device) {
        CF_CHECK(n >= 0, ValueError, "[randperm] n must be >= 0, got ", n);
        // the order of n float64 uniforms (a tie, about n^2 / 2^54 likely, keeps index order: stable argsort)
        return cf::argsort(cf::rand({n}, cf::kFloat64, gen_or_default(gen), 0.0, 1.0, device), 0);
      },
      nb::arg("n"), generator_arg(), nb::arg("device") = cf::Device::cpu(), release_gil(),
      "A random permutation of 0 .. n-1 (int64), from the generator (the default one when None).");
  m.def(
      "bmm",
      [](const Tensor& a, const Tensor& b) {
        CF_CHECK(a.dim() == 3 && b.dim() == 3, ShapeError, "[bmm] expects two 3-d tensors (B, n, k) and (B, k, m), got ",
                 a.describe(), " and ", b.describe());
        CF_CHECK(a.shape()[0] == b.shape()[0], ShapeError, "[bmm] batch sizes differ: ", a.describe(), " and ",
                 b.describe());
        return cf::matmul(a, b);
      },
      nb::arg("a"), nb::arg("b"), release_gil(), "Batched matmul of (B, n, k) and (B, k, m) (no broadcasting).");
  m.def("allclose", &allclose, nb::arg("a"), nb::arg("b"), nb::arg("rtol") = 1e-5, nb::arg("atol") = 1e-8,
        nb::arg("equal_nan") = false,
        "Whether |a - b| <= atol + rtol |b| everywhere (broadcast), as PyTorch's (reads the answer back: a device "
        "synchronisation).");
  m.def("equal", &equal, nb::arg("a"), nb::arg("b"), "Same shape and equal elements (reads the answer back).");
}

}  // namespace cfpy
