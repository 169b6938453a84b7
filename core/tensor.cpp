#include "core/tensor.h"

#include <cmath>

#include "core/cuda.h"
#include "core/kernel_calls.h"
#include <iomanip>

namespace cf {

namespace {
void check_shape(const Shape& shape, const char* op) {
  CF_CHECK(shape.size() <= size_t(kMaxDims), ShapeError, "[", op, "] shape ", shape_str(shape),
           " has more than ", kMaxDims, " dimensions");
  for (int64_t d : shape)
    CF_CHECK(d >= 0, ShapeError, "[", op, "] negative dimension in shape ", shape_str(shape));
}
// check_shape plus the element and byte counts fitting int64 (issue 27: a wrapped
// count allocated 0 bytes for a (2^62) float tensor, which was then written past).
int64_t checked_bytes_for(const Shape& shape, DType dtype, const char* op) {
  check_shape(shape, op);
  return checked_nbytes(shape, dtype_size(dtype), op);
}

template <typename T>
void fill_raw(void* p, int64_t n, double v) {
  T* q = static_cast<T*>(p);
  T x = static_cast<T>(v);
  for (int64_t i = 0; i < n; ++i) q[i] = x;
}
}  // namespace

Tensor Tensor::on_device(const Tensor& host, Device device, const char* op) {
  // host is a fresh contiguous CPU tensor: one byte copy (core cannot call
  // kernels; cf::to is the general, differentiable device move).
  cuda::check_device(device, op);
  Tensor t = empty(host.shape(), host.dtype(), device);
  copy_bytes(t.raw_data(), device, host.raw_data(), host.device(), host.nbytes(), op);
  return t;
}

void Tensor::read_span(std::vector<unsigned char>& bytes, int64_t& base) const {
  // The elements of a strided view lie in [offset, offset + sum((size-1)*stride)]:
  // copy that span of the storage to the host once.
  int64_t lo = offset(), hi = offset();
  for (size_t d = 0; d < shape().size(); ++d) {
    if (shape()[d] == 0) { lo = hi = offset(); bytes.clear(); base = offset(); return; }
    const int64_t reach = (shape()[d] - 1) * strides()[d];
    if (reach > 0) hi += reach; else lo += reach;
  }
  const size_t es = dtype_size(dtype());
  bytes.resize(size_t(hi - lo + 1) * es);
  copy_bytes(bytes.data(), Device::cpu(), static_cast<const char*>(impl().storage->data) + lo * int64_t(es),
             device(), bytes.size(), "to_vector");
  base = lo;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const size_t nbytes = size_t(checked_bytes_for(shape, dtype, "empty"));
  auto impl = std::make_shared<TensorImpl>();
  impl->strides = contiguous_strides(shape);
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::move(impl));
}

void check_fill_value(DType dtype, double value, const char* op) {
  CF_CHECK(dtype != kInt64 || (value >= -9223372036854775808.0 && value < 9223372036854775808.0), DTypeError,
           "[", op, "] value ", value, " cannot be converted to int64 without overflow");
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  checked_bytes_for(shape, dtype, "full");  // name the factory the user called, not "empty"
  check_fill_value(dtype, value, "full");
  Tensor t = empty(shape, dtype, device);
  // A fill is a kernel call like any other (a launch on CUDA): counted, so that the CPU count of a
  // step tracks its CUDA launches (core/kernel_calls.h).
  if (t.numel() > 0) detail::count_kernel_call(device.is_cuda());
  if (device.is_cuda()) {
    // The element converted on the host once, then written by a device kernel.
    alignas(8) unsigned char element[8] = {};
    CF_DISPATCH_ALL(dtype, "full", fill_raw<scalar_t>(element, 1, value));
    fill_device(t.raw_data(), device, element, dtype_size(dtype), t.numel(), "full");
    return t;
  }
  CF_DISPATCH_ALL(dtype, "full", fill_raw<scalar_t>(t.raw_data(), t.numel(), value));
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}
Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  CF_CHECK(n >= 0, ValueError, "[arange] length must be >= 0, got ", n);
  CF_CHECK(dtype != kBool, DTypeError, "[arange] cannot make a bool range");
  Tensor t = empty({n}, dtype, device);
  if (n > 0) detail::count_kernel_call(device.is_cuda());
  if (device.is_cuda()) {
    arange_device(t.raw_data(), device, dtype, n, "arange");
    return t;
  }
  CF_DISPATCH_NUMERIC(dtype, "arange", {
    scalar_t* p = t.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = scalar_t(i);
  });
  return t;
}
Tensor Tensor::from_vector(const std::vector<bool>& values, const Shape& shape, Device device) {
  CF_CHECK(int64_t(values.size()) == numel_of(shape), ShapeError, "[from_vector] ", values.size(),
           " values do not fill shape ", shape_str(shape));
  if (device.is_cuda()) return on_device(from_vector(values, shape), device, "from_vector");
  Tensor t = empty(shape, kBool, device);
  bool* p = t.data<bool>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  return shape()[size_t(normalize_axis(axis, dim(), "size"))];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace (PyTorch's rule too); zeros({3, 0}) said false
  int64_t expect = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expect) return false;
    expect *= shape()[i];
  }
  return true;
}

bool Tensor::has_internal_overlap() const {
  for (size_t i = 0; i < shape().size(); ++i)
    if (strides()[i] == 0 && shape()[i] > 1) return true;
  return false;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype(), " ", shape_str(shape()), " on ", device());
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl().storage->data) + offset() * int64_t(dtype_size(dtype()));
}

double Tensor::item() const {
  double v = 0;
  CF_DISPATCH_ALL(dtype(), "item", v = double(item<scalar_t>()));
  return v;
}

Tensor& Tensor::set_requires_grad(bool on) {
  CF_CHECK(!on || is_floating(dtype()), DTypeError,
           "[requires_grad] only float tensors can require grad, got ", describe());
  // A non-leaf already requires grad: asking for it again changes nothing (PyTorch's requires_grad_(True));
  // turning it off is refused (detach() is the non-leaf's way)
  if (on && !is_leaf()) return *this;
  CF_CHECK(is_leaf(), AutogradError,
           "[requires_grad] can only be turned off on a leaf tensor (this one has grad_fn: use detach())");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return impl().grad ? Tensor(impl().grad) : Tensor(); }

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    CF_CHECK(g.impl_ != impl_, ValueError, "[set_grad] a tensor cannot be its own gradient (", describe(),
             "): it would hold itself; pass a copy (clone())");
    CF_CHECK(g.shape() == shape(), ShapeError, "[set_grad] gradient ", g.describe(), " does not match tensor ",
             describe());
    CF_CHECK(g.dtype() == dtype(), DTypeError, "[set_grad] gradient ", g.describe(), " does not match tensor ",
             describe(), " (a graph recorded before the tensor was converted?)");
    CF_CHECK(g.device() == device(), DeviceError, "[set_grad] gradient ", g.describe(), " does not match tensor ",
             describe());
    // Optimizers, the grad scaler and DDP write gradients in place (backward's own are never such views)
    CF_CHECK(!g.has_internal_overlap(), ValueError, "[set_grad] gradient ", g.describe(),
             " has elements that share memory (an expand() view), and gradients are written in place; pass a "
             "copy (contiguous())");
  }
  // A gradient carries no graph (backward's never do): one that requires grad is kept detached. Kept as
  // given, w.grad = w * 2 held its graph, whose accumulator holds w: a cycle of owners never freed.
  impl().grad = g.defined() && g.requires_grad() ? g.detach().impl_ : g.impl_;
}

void Tensor::zero_grad() const { impl().grad.reset(); }

void Tensor::set_data(const Tensor& src) const {
  TensorImpl& me = impl();
  CF_CHECK(src.defined(), ValueError, "[set_data] the source is an undefined tensor (target ", describe(), ")");
  CF_CHECK(!me.requires_grad || is_floating(src.dtype()), DTypeError, "[set_data] ", describe(),
           " requires grad, so its data must be floating, got ", src.describe());
  if (src.impl_ptr() == &me) return;
  const TensorImpl& s = src.impl();
  // A leaf's cached accumulator records its dtype, device and shape: a new one only when they change.
  // (Dropped always, a graph recorded before and after x.data = ... had two accumulators: its
  // grad-accumulated hook ran twice in one backward, and autograd::grad found no path to x.)
  if (s.dtype != me.dtype || s.device != me.device || s.shape != me.shape) me.grad_accumulator.reset();
  me.shape = s.shape;
  me.strides = s.strides;
  me.offset = s.offset;
  me.dtype = s.dtype;
  me.device = s.device;
  me.storage = s.storage;
  if (me.grad && (me.grad->shape != me.shape || me.grad->dtype != me.dtype || me.grad->device != me.device))
    me.grad.reset();
}

Tensor Tensor::detach() const {
  auto v = std::make_shared<TensorImpl>();
  v->shape = shape();
  v->strides = strides();
  v->offset = offset();
  v->dtype = dtype();
  v->device = device();
  v->storage = impl().storage;
  return Tensor(std::move(v));
}

Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset,
                 const char* op) {
  // A view's shape comes from user input too (expand's target, reshape's sizes):
  // its element and byte counts must fit int64 so numel() and nbytes() are exact
  // for every tensor (issue 27: expand to (2^33, 2^31) summed to 0).
  checked_bytes_for(shape, t.dtype(), op);
  CF_CHECK(strides.size() == shape.size(), ShapeError, "[", op, "] ", strides.size(), " strides for shape ",
           shape_str(shape));
  Tensor v = t.detach();
  TensorImpl* p = v.impl_ptr();
  p->shape = shape;
  p->strides = strides;
  p->offset = offset;
  return v;
}

namespace {
template <typename T>
void print_value(std::ostream& os, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (is_low_precision_v<T>) {
    os << std::setprecision(4) << float(v);  // 8 or 11 significant bits: about 3 digits
  } else if constexpr (std::is_integral_v<T>) {
    os << v;
  } else {
    os << std::setprecision(std::is_same_v<T, float> ? 6 : 10) << v;
  }
}

template <typename T>
void print_rec(std::ostream& os, const Tensor& t, const T* base, int d, int64_t off) {
  if (d == t.dim()) {
    print_value(os, base[off]);
    return;
  }
  os << "[";
  int64_t n = t.shape()[size_t(d)];
  const int64_t kEdge = 3;  // elide long dimensions: first 3 ... last 3
  for (int64_t i = 0; i < n; ++i) {
    const char* sep = d + 1 == t.dim() ? ", " : ",\n ";
    if (n > 2 * kEdge + 1 && i == kEdge) {
      os << sep << "...";
      i = n - kEdge - 1;
      continue;
    }
    if (i) os << sep;
    print_rec(os, t, base, d + 1, off + i * t.strides()[size_t(d)]);
  }
  os << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  os << "tensor(";
  if (t.device().is_cpu()) {
    CF_DISPATCH_ALL(t.dtype(), "print", {
      const scalar_t* base = static_cast<const scalar_t*>(t.impl_ptr()->storage->data);
      print_rec(os, t, base, 0, t.offset());
    });
  } else {  // print from a host copy of the view's span of device memory
    std::vector<unsigned char> host;
    int64_t lo = 0;
    t.read_span(host, lo);
    CF_DISPATCH_ALL(t.dtype(), "print", {
      print_rec(os, t, reinterpret_cast<const scalar_t*>(host.data()), 0, t.offset() - lo);
    });
  }
  os << ", shape=" << shape_str(t.shape()) << ", dtype=" << t.dtype();
  if (!t.device().is_cpu()) os << ", device=" << t.device();
  if (t.requires_grad()) os << ", requires_grad=true";
  return os << ")";
}

}  // namespace cf
