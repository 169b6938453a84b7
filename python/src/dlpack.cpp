// Zero-copy exchange with NumPy, PyTorch and any other DLPack producer or
// consumer (https://dmlc.github.io/dlpack/latest/python_spec.html):
//   t.__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)
//   t.__dlpack_device__()
//   cf.from_dlpack(obj)   obj: anything with __dlpack__, or a "dltensor" capsule
// Exported tensors keep their cf storage alive until the consumer lets go;
// imported ones wrap the producer's memory in a cf Storage whose release calls
// the producer's deleter (core/storage.h), so both sides see each other's writes.
//
// Streams (CUDA): cf queues all its work on the legacy default stream. A consumer
// that passes another stream to __dlpack__ gets an event recorded on cf's stream
// that its stream waits for (no host synchronisation); when cf imports, it asks the
// producer for the legacy default stream (stream=1), as the protocol defines.
#include <cstring>

#include "common.h"

#ifdef CF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cfpy {

namespace {

// ---- the DLPack ABI (dlpack.h v1.0; the unversioned struct is v0.x) ----
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = 1;
constexpr uint64_t kFlagIsCopied = 2;
const char* const kCapsule = "dltensor";
const char* const kUsedCapsule = "used_dltensor";
const char* const kCapsuleVersioned = "dltensor_versioned";
const char* const kUsedCapsuleVersioned = "used_dltensor_versioned";

DLDataType dl_dtype(cf::DType d) {
  switch (d) {
    case cf::DType::Float32: return {kDLFloat, 32, 1};
    case cf::DType::Float64: return {kDLFloat, 64, 1};
    case cf::DType::Int64: return {kDLInt, 64, 1};
    case cf::DType::Bool: return {kDLBool, 8, 1};
    case cf::DType::BFloat16: return {kDLBfloat, 16, 1};
    case cf::DType::Float16: return {kDLFloat, 16, 1};
  }
  return {};
}

cf::DType cf_dtype(DLDataType t, bool uint8_as_bool) {
  if (uint8_as_bool && t.code == kDLUInt && t.bits == 8 && t.lanes == 1) return cf::kBool;
  CF_CHECK(t.lanes == 1, DTypeError, "[from_dlpack] vector dtypes (lanes ", t.lanes, ") are not supported");
  if (t.code == kDLFloat && t.bits == 32) return cf::kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return cf::kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return cf::kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return cf::kBFloat16;
  if (t.code == kDLInt && t.bits == 64) return cf::kInt64;
  if (t.code == kDLBool && t.bits == 8) return cf::kBool;
  throw cf::DTypeError(cf::str("[from_dlpack] dtype code ", int(t.code), " with ", int(t.bits),
                               " bits is not float32, float64, float16, bfloat16, int64 or bool: convert it first"));
}

// What an exported DLManagedTensor(Versioned) owns: the tensor handle (keeps the
// storage alive) and the shape and stride arrays DLTensor points to.
struct ExportCtx {
  cf::Tensor tensor;
  std::vector<int64_t> shape, strides;
};

template <typename M>
void fill_export(M* mt, ExportCtx* ctx) {
  const cf::Tensor& t = ctx->tensor;
  DLTensor& dl = mt->dl_tensor;
  dl.data = t.numel() ? t.raw_data() : nullptr;
  dl.device = t.device().is_cuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  dl.ndim = int32_t(t.dim());
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  mt->manager_ctx = ctx;
}

void delete_export(DLManagedTensor* mt) {
  delete static_cast<ExportCtx*>(mt->manager_ctx);
  delete mt;
}
void delete_export_versioned(DLManagedTensorVersioned* mt) {
  delete static_cast<ExportCtx*>(mt->manager_ctx);
  delete mt;
}

// Capsule destructors: a capsule that no consumer took (still named "dltensor")
// frees what it holds; a consumed one was renamed and is the consumer's.
void capsule_destructor(PyObject* cap) {
  if (PyCapsule_IsValid(cap, kCapsule)) {
    auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsule));
    if (mt && mt->deleter) mt->deleter(mt);
  }
}
void capsule_destructor_versioned(PyObject* cap) {
  if (PyCapsule_IsValid(cap, kCapsuleVersioned)) {
    auto* mt = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kCapsuleVersioned));
    if (mt && mt->deleter) mt->deleter(mt);
  }
}

// Make the consumer's stream wait for the work cf queued on its own (legacy
// default) stream; nothing to do when the consumer uses that stream too.
void sync_for_consumer(const cf::Tensor& t, nb::handle stream) {
  if (!t.device().is_cuda() || stream.is_none()) return;
  int64_t s = nb::cast<int64_t>(stream);
  CF_CHECK(s != 0, ValueError, "[__dlpack__] stream 0 is ambiguous for CUDA (the protocol forbids it): pass 1 "
           "for the legacy default stream, 2 for the per-thread one, or a stream handle");
  if (s == -1 || s == 1) return;  // -1: no synchronisation asked; 1: cf's own stream
#ifdef CF_WITH_CUDA
  cudaStream_t consumer = s == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, cudaStreamLegacy);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(consumer, ev, 0);
  cudaEventDestroy(ev);
  CF_CHECK(e == cudaSuccess, DeviceError, "[__dlpack__] CUDA stream handshake failed: ", cudaGetErrorString(e));
#endif
}

// A (major, minor) version or (device type, device id) pair, each an int: a ValueError naming op and
// `what` for anything else (nanobind's casts escaped as "std::bad_cast").
std::pair<int, int> int_pair(nb::handle h, const char* op, const char* what) {
  const bool ok = PyTuple_Check(h.ptr()) && PyTuple_GET_SIZE(h.ptr()) == 2;
  int a = 0, b = 0;
  if (!ok || !nb::try_cast(nb::handle(PyTuple_GET_ITEM(h.ptr(), 0)), a) ||
      !nb::try_cast(nb::handle(PyTuple_GET_ITEM(h.ptr(), 1)), b))
    throw cf::ValueError(cf::str("[", op, "] ", what, " must be a tuple of two ints, got ",
                                 nb::cast<std::string>(nb::repr(h)).substr(0, 200)));
  return {a, b};
}

}  // namespace

// A "dltensor" capsule for t (the versioned one when versioned is true).
nb::object to_capsule(const cf::Tensor& t, bool versioned) {
  // t.detach(): a handle of its own on t's storage, so Module.to or t.data = ... giving t other data
  // later does not free the memory under the consumer (the handle t itself follows such changes)
  auto* ctx = new ExportCtx{t.detach(), std::vector<int64_t>(t.shape().begin(), t.shape().end()),
                            std::vector<int64_t>(t.strides().begin(), t.strides().end())};
  if (versioned) {
    auto* mt = new DLManagedTensorVersioned{};
    mt->version = {1, 0};
    mt->flags = 0;
    mt->deleter = &delete_export_versioned;
    fill_export(mt, ctx);
    PyObject* cap = PyCapsule_New(mt, kCapsuleVersioned, &capsule_destructor_versioned);
    if (!cap) {
      delete_export_versioned(mt);
      throw nb::python_error();
    }
    return nb::steal(cap);
  }
  auto* mt = new DLManagedTensor{};
  mt->deleter = &delete_export;
  fill_export(mt, ctx);
  PyObject* cap = PyCapsule_New(mt, kCapsule, &capsule_destructor);
  if (!cap) {
    delete_export(mt);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

namespace {

// Wrap a DLTensor's memory as a cf tensor; `release` gives it back to the producer.
cf::Tensor wrap(const DLTensor& dl, std::function<void()> release, bool uint8_as_bool) {
  cf::Device device;
  if (dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost) {
    device = cf::Device::cpu();
  } else if (dl.device.device_type == kDLCUDA || dl.device.device_type == kDLCUDAManaged) {
    device = cf::Device::cuda(dl.device.device_id);
    CF_CHECK(cf::cuda_built(), DeviceError,
             "[from_dlpack] the tensor is on cuda:", dl.device.device_id, " but this cf build has no CUDA backend");
  } else {
    throw cf::DeviceError(cf::str("[from_dlpack] DLPack device type ", dl.device.device_type,
                                  " is not supported (cpu, cuda)"));
  }
  CF_CHECK(dl.ndim >= 0 && dl.ndim <= cf::kMaxDims, ShapeError, "[from_dlpack] ", dl.ndim,
           " dimensions (cf takes at most ", cf::kMaxDims, ")");
  cf::DType dtype = cf_dtype(dl.dtype, uint8_as_bool);
  const int64_t es = int64_t(cf::dtype_size(dtype));
  CF_CHECK(dl.byte_offset % uint64_t(es) == 0, ValueError, "[from_dlpack] byte_offset ", dl.byte_offset,
           " is not a multiple of the element size ", es);
  cf::Shape shape(dl.shape, dl.shape + dl.ndim);
  cf::Shape strides = dl.strides ? cf::Shape(dl.strides, dl.strides + dl.ndim) : cf::contiguous_strides(shape);
  int64_t numel = cf::numel_of(shape);
  int64_t span = 1;  // elements from the first one to the last one reachable
  for (int d = 0; d < dl.ndim; ++d) {
    CF_CHECK(strides[size_t(d)] >= 0 || shape[size_t(d)] <= 1, ValueError,
             "[from_dlpack] negative strides are not supported (stride ", strides[size_t(d)], " on axis ", d,
             "): make the array contiguous first");
    if (shape[size_t(d)] > 1) span += (shape[size_t(d)] - 1) * strides[size_t(d)];
  }
  if (numel == 0) span = 0;
  char* base = static_cast<char*>(dl.data) + dl.byte_offset;
  auto impl = std::make_shared<cf::TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = 0;
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<cf::Storage>(base, size_t(span * es), device, std::move(release));
  return cf::Tensor(std::move(impl));
}

// The producer's deleter runs when the last cf view goes away. It may touch
// Python objects (NumPy's does), so it runs with the GIL held, unless the
// interpreter is already gone.
template <typename M>
std::function<void()> releaser(M* mt) {
  return [mt] {
    if (!mt->deleter) return;
    if (!nb::is_alive()) return;  // (Py_IsInitialized turns false while module globals are still cleared)
    nb::gil_scoped_acquire g;
    mt->deleter(mt);
  };
}

cf::Tensor from_capsule(nb::handle cap, bool uint8_as_bool) {
  PyObject* c = cap.ptr();
  if (PyCapsule_IsValid(c, kCapsuleVersioned)) {
    auto* mt = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, kCapsuleVersioned));
    CF_CHECK(mt->version.major == 1, ValueError, "[from_dlpack] DLPack version ", mt->version.major, ".",
             mt->version.minor, " is not supported (1.x)");
    CF_CHECK(!(mt->flags & kFlagReadOnly), ValueError,
             "[from_dlpack] the producer marked the tensor read-only, and cf tensors are writable: copy it first "
             "(e.g. cf.tensor(x))");
    cf::Tensor t = wrap(mt->dl_tensor, releaser(mt), uint8_as_bool);
    PyCapsule_SetName(c, kUsedCapsuleVersioned);
    return t;
  }
  if (PyCapsule_IsValid(c, kCapsule)) {
    auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kCapsule));
    cf::Tensor t = wrap(mt->dl_tensor, releaser(mt), uint8_as_bool);
    PyCapsule_SetName(c, kUsedCapsule);
    return t;
  }
  throw cf::ValueError("[from_dlpack] expected an object with __dlpack__ or an unused 'dltensor' capsule");
}

}  // namespace

// cf.from_dlpack: a cf.Tensor as is, a capsule, or any object with __dlpack__.
// uint8_as_bool: read uint8 bytes (0/1) as bool, for masks of producers whose
// DLPack has no bool (PyTorch before 2.0).
cf::Tensor from_dlpack_object(nb::handle obj, bool uint8_as_bool) {
  if (nb::isinstance<cf::Tensor>(obj)) return nb::cast<cf::Tensor>(obj);
  if (PyCapsule_CheckExact(obj.ptr())) return from_capsule(obj, uint8_as_bool);
  if (!nb::hasattr(obj, "__dlpack__"))
    throw cf::ValueError(cf::str("[from_dlpack] ", nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(obj.ptr())))),
                                 " has no __dlpack__ method"));
  nb::object stream = nb::none();
  if (nb::hasattr(obj, "__dlpack_device__")) {
    const int type = int_pair(obj.attr("__dlpack_device__")(), "from_dlpack", "__dlpack_device__()").first;
    if (type == kDLCUDA || type == kDLCUDAManaged) stream = nb::int_(1);  // cf works on the legacy default stream
  }
  nb::object cap;
  try {
    try {
      cap = obj.attr("__dlpack__")(nb::arg("stream") = stream, nb::arg("max_version") = nb::make_tuple(1, 0));
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      cap = obj.attr("__dlpack__")(nb::arg("stream") = stream);  // a producer older than DLPack 1.0
    }
  } catch (nb::python_error& e) {
    // The producer cannot export this object (NumPy: a read-only, byte-swapped or datetime array): its
    // BufferError, saying which op and object it was.
    if (!e.matches(PyExc_BufferError)) throw;
    throw nb::buffer_error(cf::str("[from_dlpack] ", nb::cast<std::string>(nb::str(nb::handle(Py_TYPE(obj.ptr())))),
                                   " cannot be exported: ", e.what()).c_str());
  }
  return from_capsule(cap, uint8_as_bool);
}

void bind_dlpack(nb::module_& m, nb::class_<cf::Tensor>& cls) {
  cls.def("__dlpack__",
          [](const cf::Tensor& t, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
            if (!dl_device.is_none()) {
              const auto [type, id] = int_pair(dl_device, "__dlpack__", "dl_device");
              bool same = t.device().is_cuda() ? (type == kDLCUDA && id == t.device().index) : type == kDLCPU;
              CF_CHECK(same, DeviceError, "[__dlpack__] tensor is on ", t.device(), "; export to another device "
                       "is not supported (move it with .to first)");
            }
            CF_CHECK(optional_bool_arg(copy, "__dlpack__", "copy") != true, ValueError,
                     "[__dlpack__] copy=True is not supported: cf exports without copying (clone first)");
            refuse_grad_export(t, "__dlpack__");
            sync_for_consumer(t, stream);
            bool versioned = false;
            if (!max_version.is_none()) versioned = int_pair(max_version, "__dlpack__", "max_version").first >= 1;
            return to_capsule(t, versioned);
          },
          nb::kw_only(), nb::arg("stream") = nb::none(), nb::arg("max_version") = nb::none(),
          nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none(),
          "A DLPack capsule viewing this tensor's memory (no copy): torch.from_dlpack(t), np.from_dlpack(t). "
          "The consumer's CUDA stream waits for cf's work. Refused for a tensor that requires grad: export t.detach().")
      .def("__dlpack_device__",
           [](const cf::Tensor& t) {
             return t.device().is_cuda() ? nb::make_tuple(int(kDLCUDA), t.device().index) : nb::make_tuple(int(kDLCPU), 0);
           },
           "(device type, index) as DLPack numbers: (1, 0) for the CPU, (2, i) for cuda:i.");
  m.def("from_dlpack", [](nb::handle x) { return from_dlpack_object(x, false); }, nb::arg("x"),
        "A cf tensor viewing the memory of x (no copy): a NumPy array, a PyTorch tensor, anything with "
        "__dlpack__, or a DLPack capsule. Writes through either side are seen by the other (the other side's "
        "writes bump no cf version counter: change no tensor a cf backward still needs that way). CPU and CUDA.");
  m.def("to_dlpack", [](const cf::Tensor& t) {
          refuse_grad_export(t, "to_dlpack");
          return to_capsule(t, false);
        }, nb::arg("x"),
        "A legacy 'dltensor' capsule for x (for consumers that take capsules, e.g. torch.utils.dlpack.from_dlpack).");
}

}  // namespace cfpy
