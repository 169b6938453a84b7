#pragma once
// Tensor: a cheap handle (shared pointer) to a TensorImpl holding shape,
// strides, offset, dtype, device, storage and the autograd fields.
// Differentiable operations are free functions in namespace cf (autograd/ops/*.h);
// the members here only read or re-label what is already there.
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace cf {

namespace autograd {
struct Node;
}

constexpr int kMaxDims = 16;

struct TensorImpl {
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements, from the start of storage
  DType dtype = DType::Float32;
  Device device;
  std::shared_ptr<Storage> storage;

  // autograd fields
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;   // null for leaves
  std::weak_ptr<autograd::Node> grad_accumulator;  // cached edge target for leaves
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (never differentiable; set_requires_grad afterwards) ----
  static Tensor empty(Shape shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = kFloat32,
                     Device device = Device::cpu());
  // 0-d tensor holding one value.
  static Tensor scalar(double value, DType dtype = kFloat32, Device device = Device::cpu());
  // [0, 1, ..., n-1]
  static Tensor arange(int64_t n, DType dtype = kInt64, Device device = Device::cpu());
  // Copy a host vector into a new tensor of the given shape (dtype from T).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  static Tensor from_vector(const std::vector<bool>& values, const Shape& shape,
                            Device device = Device::cpu());

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t size(int64_t axis) const;
  int64_t numel() const { return numel_of(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  bool is_contiguous() const;
  // Whether it has a stride 0 over a size above 1 (an expand() view), whose elements share memory. In-place
  // writes into such a view are refused (they would write one element several times), so a parameter,
  // a gradient or a module's state cannot be one. (Other overlapping strides, which only DLPack imports
  // can carry, are not detected.)
  bool has_internal_overlap() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  // "float32 (2,3) on cpu", for error messages.
  std::string describe() const;

  // ---- data access (T must match dtype). data()/raw_data() give the address on
  // the tensor's own device; item() and to_vector() copy from any device. ----
  template <typename T>
  T* data() const;
  void* raw_data() const;  // address of the first element
  template <typename T>
  T item() const;
  double item() const;  // the single value as double
  template <typename T>
  std::vector<T> to_vector() const;  // elements in logical (row-major) order

  // ---- autograd ----
  bool requires_grad() const { return impl().requires_grad; }
  // Only float tensors can require grad; throws DTypeError otherwise.
  Tensor& set_requires_grad(bool on = true);
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  void zero_grad() const;  // drops the accumulated gradient
  // PyTorch's `t.data = src`: this tensor, through every handle to it, now shows src's storage,
  // shape, strides, offset, dtype and device (no copy). Its identity, requires_grad and history
  // flag stay; a gradient that no longer fits (shape, dtype, device) is dropped. Module::to
  // moves parameters with it, so an optimizer built before the move steps the moved tensors.
  // Floating src when this tensor requires grad; src must be defined.
  void set_data(const Tensor& src) const;
  std::shared_ptr<autograd::Node> grad_fn() const { return impl().grad_fn; }
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  // Defined in autograd/engine.cpp: backprop from this tensor into the leaves.
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false) const;
  // Same storage, no autograd history.
  Tensor detach() const;
  // Copies the span of storage that holds this view (any device) to the host;
  // base = the storage offset of bytes[0], in elements.
  void read_span(std::vector<unsigned char>& bytes, int64_t& base) const;
  // Device moves (cf::to(x, device); defined in autograd/ops/elementwise.cpp):
  // differentiable copies, or this tensor when it is on that device already.
  Tensor to(Device device) const;
  Tensor cpu() const;
  Tensor cuda(int index = 0) const;
  int64_t version() const { return impl().storage->version.load(); }
  void bump_version() const { impl().storage->version.fetch_add(1); }

  TensorImpl* impl_ptr() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_shared() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const {
    return defined() && o.defined() && impl().storage == o.impl().storage;
  }

 private:
  // A CUDA copy of a fresh contiguous CPU tensor (factories on CUDA).
  static Tensor on_device(const Tensor& host, Device device, const char* op);
  TensorImpl& impl() const {
    if (!impl_) throw ValueError("[tensor] use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// A number about to be written into a tensor of `dtype` (full, fill_, masked_fill, pad, t[...] = v):
// an int64 tensor takes only a finite value in [-2^63, 2^63), as PyTorch ("value cannot be converted
// to type int64_t without overflow"); NaN, inf and 1e30 were stored as INT64_MIN (a conversion C++
// leaves undefined). Fractions truncate, as in PyTorch. Throws DTypeError naming `op`.
void check_fill_value(DType dtype, double value, const char* op);

// A view of t's storage with new shape/strides/offset (no autograd; see cf::as_strided).
// Throws ShapeError naming `op` when the shape has a negative size, too many
// dimensions, or more elements or bytes than int64 can count.
Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset,
                 const char* op = "view");

// Print like "tensor([[1, 2], [3, 4]], dtype=int64)".
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Row-major walk over a strided shape: calls f(offset_in_elements) per element.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, F&& f) {
  int64_t n = numel_of(shape);
  if (n == 0) return;
  int nd = int(shape.size());
  int64_t idx[kMaxDims] = {0};
  int64_t off = base;
  for (int64_t i = 0; i < n; ++i) {
    f(off);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// ---- template definitions ----
template <typename T>
T* Tensor::data() const {
  CF_CHECK(dtype() == dtype_of<T>::value, DTypeError, "[data] tensor is ", dtype(),
           ", asked for ", dtype_of<T>::value);
  return static_cast<T*>(raw_data());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  CF_CHECK(int64_t(values.size()) == numel_of(shape), ShapeError, "[from_vector] ", values.size(),
           " values do not fill shape ", shape_str(shape));
  if (device.is_cuda()) return on_device(from_vector(values, shape), device, "from_vector");
  Tensor t = empty(shape, dtype_of<T>::value, device);
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  CF_CHECK(dtype() == dtype_of<T>::value, DTypeError, "[to_vector] tensor is ", dtype(),
           ", asked for ", dtype_of<T>::value);
  std::vector<T> out;
  out.reserve(size_t(numel()));
  const T* base = static_cast<const T*>(impl().storage->data);
  int64_t start = offset();
  std::vector<unsigned char> host;  // a device tensor's elements, copied once
  if (device().is_cuda()) {
    int64_t lo = 0;
    read_span(host, lo);
    base = reinterpret_cast<const T*>(host.data());
    start = offset() - lo;
  }
  for_each_offset(shape(), strides(), start, [&](int64_t o) { out.push_back(base[o]); });
  return out;
}

template <typename T>
T Tensor::item() const {
  CF_CHECK(numel() == 1, ShapeError, "[item] needs a tensor with one element, got shape ",
           shape_str(shape()));
  CF_CHECK(dtype() == dtype_of<T>::value, DTypeError, "[item] tensor is ", dtype(), ", asked for ",
           dtype_of<T>::value, " (item() without a type gives any dtype as a double)");
  return to_vector<T>()[0];
}

}  // namespace cf
