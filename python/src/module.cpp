// The extension module cf._cf: errors, dtypes, devices, generators, grad mode,
// memory and CUDA controls, the op registry; the other files add the rest.
#include <cstring>

#include <nanobind/stl/function.h>

#include "common.h"

namespace cfpy {

namespace {

// cf::Error family -> Python classes of matching names. Each also derives from the
// closest built-in exception (ShapeError is a ValueError, DTypeError a TypeError,
// IOError an OSError, ...) so code that catches built-ins keeps working; the
// message is cf's, starting with "[op]".
struct ErrorTypes {
  nb::object error, shape, dtype, device, index, value, io, autograd, not_implemented, kmeans_too_few, dist;
};
ErrorTypes* g_errors = nullptr;

nb::object make_exception(nb::module_& m, const char* name, std::initializer_list<nb::handle> bases,
                          const char* doc) {
  nb::list b;
  for (nb::handle h : bases) b.append(h);
  nb::dict ns;
  ns["__module__"] = "cf";
  ns["__doc__"] = doc;
  nb::object type = nb::borrow(reinterpret_cast<PyObject*>(&PyType_Type))(name, nb::tuple(b), ns);
  m.attr(name) = type;
  return type;
}

// The message as a Python str: bytes that are not UTF-8 (a file's bad bytes quoted by a parser)
// become U+FFFD, where PyErr_SetString would lose the whole message.
nb::object message(const std::exception& e) {
  const char* m = e.what();
  return nb::steal(PyUnicode_DecodeUTF8(m, Py_ssize_t(std::strlen(m)), "replace"));
}

void raise(const nb::object& type, const std::exception& e) { PyErr_SetObject(type.ptr(), message(e).ptr()); }

// A seed no uint64 holds (cf's Philox key is 64 bits): refused by name, not with nanobind's signature dump.
[[noreturn]] void refuse_seed(nb::handle seed, const char* op, const char* what) {
  throw cf::ValueError(
      cf::str("[", op, "] ", what, " must be an int in [0, 2^64), got ", nb::cast<std::string>(nb::str(seed))));
}

// A seed (or a generator offset, `what`) from any Python integer (NumPy's too; anything else is
// Python's TypeError), one outside [0, 2^64) refused naming op (not nanobind's signature dump).
uint64_t seed_of(nb::handle seed, const char* op, const char* what = "seed") {
  PyObject* index = PyNumber_Index(seed.ptr());
  if (!index) throw nb::python_error();
  nb::object as_int = nb::steal(index);
  uint64_t v = 0;
  if (!nb::try_cast<uint64_t>(as_int, v, false)) refuse_seed(as_int, op, what);
  return v;
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_errors = new ErrorTypes();  // lives as long as the process: the translator uses it
  nb::handle runtime(PyExc_RuntimeError), value(PyExc_ValueError), type(PyExc_TypeError),
      index(PyExc_IndexError), os(PyExc_OSError), notimpl(PyExc_NotImplementedError);
  ErrorTypes& e = *g_errors;
  e.error = make_exception(m, "Error", {runtime}, "Base of every cf error (C++ cf::Error); the message starts with \"[op]\".");
  e.shape = make_exception(m, "ShapeError", {e.error, value}, "Shapes that do not fit (cf::ShapeError).");
  e.dtype = make_exception(m, "DTypeError", {e.error, type}, "A dtype the op does not take (cf::DTypeError).");
  e.device = make_exception(m, "DeviceError", {e.error}, "Mixed devices, or a device this build or machine lacks (cf::DeviceError).");
  e.index = make_exception(m, "IndexError", {e.error, index}, "An index or axis out of range (cf::IndexError).");
  e.value = make_exception(m, "ValueError", {e.error, value}, "A bad argument value (cf::ValueError).");
  e.io = make_exception(m, "IOError", {e.error, os}, "A file that cannot be read or written, or is corrupt (cf::IOError).");
  e.autograd = make_exception(m, "AutogradError", {e.error}, "Misuse of autograd: backward twice, in-place change of a saved tensor, ... (cf::AutogradError).");
  e.not_implemented = make_exception(m, "NotImplementedError", {e.error, notimpl}, "A feature this build lacks (cf::NotImplementedError).");
  e.dist = make_exception(m, "DistError", {e.error},
                          "A collective that failed: ranks that disagree, a peer that timed out, a backend this build "
                          "lacks (cf::dist::DistError).");
  e.kmeans_too_few = make_exception(m, "KMeansTooFewPointsError", {e.value},
                                    "K-Means on data with fewer distinct points (or groups of points its distances tell apart) than k; "
                                    ".at_most bounds them: retry with at most that many clusters.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    ErrorTypes& t = *g_errors;
    try {
      std::rethrow_exception(p);
    } catch (const cf::nn::KMeansTooFewPointsError& ex) {
      nb::object inst = t.kmeans_too_few(message(ex));
      inst.attr("at_most") = ex.at_most();
      PyErr_SetObject(t.kmeans_too_few.ptr(), inst.ptr());
    } catch (const cf::ShapeError& ex) {
      raise(t.shape, ex);
    } catch (const cf::DTypeError& ex) {
      raise(t.dtype, ex);
    } catch (const cf::DeviceError& ex) {
      raise(t.device, ex);
    } catch (const cf::IndexError& ex) {
      raise(t.index, ex);
    } catch (const cf::ValueError& ex) {
      raise(t.value, ex);
    } catch (const cf::IOError& ex) {
      raise(t.io, ex);
    } catch (const cf::AutogradError& ex) {
      raise(t.autograd, ex);
    } catch (const cf::NotImplementedError& ex) {
      raise(t.not_implemented, ex);
    } catch (const cf::dist::DistError& ex) {
      raise(t.dist, ex);
    } catch (const cf::Error& ex) {
      raise(t.error, ex);
    }
  });
}

}  // namespace cfpy

NB_MODULE(_cf, m) {
  using namespace cfpy;
  m.doc() = "cf: a C++17 tensor library with eager autograd, CPU and CUDA backends, and the models of four "
            "clustered-attention papers. This extension is the thin layer over cf.h; import it as `cf`.";
  bind_errors(m);
  // cf objects are often still held by other frameworks' objects (a PyTorch
  // module, an autograd graph) when the interpreter shuts down; nanobind's
  // leak report would then list them on every exit.
  nb::set_leak_warnings(false);
  // Whether the extension carries its own hidden C++ runtime (python/CMakeLists.txt says why).
  m.attr("_private_cpp_runtime") = bool(CF_PY_PRIVATE_RUNTIME);

  nb::enum_<cf::DType>(m, "dtype",
                       "Element types: float32 (default), float64, int64 (indices), bool (masks), bfloat16 and "
                       "float16 (storage types: arithmetic in float32).")
      .value("float32", cf::DType::Float32)
      .value("float64", cf::DType::Float64)
      .value("int64", cf::DType::Int64)
      .value("bool", cf::DType::Bool)
      .value("bfloat16", cf::DType::BFloat16)
      .value("float16", cf::DType::Float16);
  m.attr("float32") = nb::cast(cf::kFloat32);
  m.attr("float64") = nb::cast(cf::kFloat64);
  m.attr("int64") = nb::cast(cf::kInt64);
  m.attr("bool") = nb::cast(cf::kBool);
  m.attr("bfloat16") = nb::cast(cf::kBFloat16);
  m.attr("float16") = nb::cast(cf::kFloat16);
  m.def("dtype_size", &cf::dtype_size, nb::arg("dtype"), "Bytes per element of a dtype.");
  m.def("is_floating", &cf::is_floating, nb::arg("dtype"), "True for float32, float64, bfloat16 and float16.");

  nb::class_<cf::Device>(m, "Device", "A device: cpu, or cuda:N. Anywhere a device is taken, a string works too.")
      .def(nb::init<>())
      .def("__init__", [](cf::Device* d, const std::string& s) { new (d) cf::Device(cf::Device::parse(s)); },
           nb::arg("spec"), "Parse \"cpu\", \"cuda\" or \"cuda:N\" (cf.ValueError otherwise).")
      .def_static("cpu", &cf::Device::cpu)
      .def_static("cuda", &cf::Device::cuda, nb::arg("index") = 0)
      .def_prop_ro("type", [](const cf::Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_ro("index", &cf::Device::index)
      .def_prop_ro("is_cpu", &cf::Device::is_cpu)
      .def_prop_ro("is_cuda", &cf::Device::is_cuda)
      .def("__eq__", [](const cf::Device& a, const cf::Device& b) { return a == b; })
      .def("__eq__", [](const cf::Device& a, const std::string& b) { return a == cf::Device::parse(b); })
      .def("__hash__", [](const cf::Device& d) { return int(d.type) * 1024 + d.index; })
      .def("__str__", &cf::Device::str)
      .def("__repr__", [](const cf::Device& d) { return "device('" + d.str() + "')"; })
      // pickle, copy and deepcopy (a module's or a tensor's device in a saved object)
      .def("__getstate__", &cf::Device::str)
      .def("__setstate__", [](cf::Device& d, const std::string& s) { new (&d) cf::Device(cf::Device::parse(s)); });
  nb::implicitly_convertible<std::string, cf::Device>();
  m.def("cuda_built", &cf::cuda_built, "True when this build has the CUDA backend.");

  nb::class_<cf::Generator>(m, "Generator",
                            "Counter-based Philox4x32-10 generator: a seed and a running offset. Element i of a "
                            "random op draws from (seed, offset + i), the same stream on CPU and CUDA.")
      // one signature (an int outside [0, 2^64) named, not nanobind's signature dump)
      .def("__init__", [](cf::Generator* self, nb::handle seed) { new (self) cf::Generator(seed_of(seed, "Generator")); },
           nb::arg("seed") = 0, nb::sig("def __init__(self, seed: typing.SupportsIndex = 0) -> None"))
      .def("manual_seed", [](cf::Generator& g, nb::handle seed) { g.manual_seed(seed_of(seed, "Generator.manual_seed")); },
           nb::arg("seed"), nb::sig("def manual_seed(self, seed: typing.SupportsIndex) -> None"), "Reset to seed, offset 0.")
      .def_prop_ro("seed", &cf::Generator::seed)
      .def_prop_ro("offset", &cf::Generator::offset)
      .def("set_state",
           [](cf::Generator& g, nb::handle seed, nb::handle offset) {
             g.set_state(seed_of(seed, "Generator.set_state"), seed_of(offset, "Generator.set_state", "offset"));
           },
           nb::arg("seed"), nb::arg("offset"),
           nb::sig("def set_state(self, seed: typing.SupportsIndex, offset: typing.SupportsIndex) -> None"),
           "Restore a state saved from seed and offset (training checkpoints).")
      .def("__repr__", [](const cf::Generator& g) {
        return "Generator(seed=" + std::to_string(g.seed()) + ", offset=" + std::to_string(g.offset()) + ")";
      });
  m.def("default_generator", &cf::default_generator, nb::rv_policy::reference,
        "The process-wide generator random ops use when given none.");
  m.def("manual_seed", [](nb::handle seed) { cf::manual_seed(seed_of(seed, "manual_seed")); }, nb::arg("seed"),
        nb::sig("def manual_seed(seed: typing.SupportsIndex) -> None"), "Reseed the process-wide generator.");

  m.def("autocast_dtype", &cf::autocast_dtype,
        "The autocast dtype of this thread (cf.bfloat16 or cf.float16), or None when autocast is off.");
  m.def("set_autocast_dtype",
        [](std::optional<cf::DType> dtype) {
          CF_CHECK(!dtype || cf::is_low_precision(*dtype), DTypeError,
                   "[autocast] autocast runs in bfloat16 or float16, got ", *dtype);
          cf::set_autocast_dtype(dtype);
        },
        nb::arg("dtype").none(),
        "Turn autocast on in a 16-bit dtype, or off with None, for this thread (cf.autocast() is the context "
        "manager): matmul runs in that dtype, softmax, norms, losses and sums in float32.");
  m.def("grad_enabled", &cf::grad_enabled, "Whether ops record autograd history on this thread.");
  m.def("is_grad_enabled", &cf::grad_enabled, "grad_enabled under PyTorch's name (torch.is_grad_enabled).");
  // Private: cf.set_grad_enabled is the Python class over it (a call and a context manager, as torch's); under
  // the public name the star import gave type checkers a second, plain-function cf.set_grad_enabled.
  m.def("_set_grad_enabled", &cf::set_grad_enabled, nb::arg("on"),
        "Turn history recording on or off for this thread (cf.set_grad_enabled and cf.no_grad() wrap it).");

  nb::class_<cf::MemoryStats>(m, "MemoryStats", "Allocator counters of one device.")
      .def_ro("live_bytes", &cf::MemoryStats::live_bytes)
      .def_ro("peak_bytes", &cf::MemoryStats::peak_bytes)
      .def_ro("cached_bytes", &cf::MemoryStats::cached_bytes)
      .def_ro("num_allocs", &cf::MemoryStats::num_allocs)
      .def("__repr__", [](const cf::MemoryStats& s) {
        return "MemoryStats(live_bytes=" + std::to_string(s.live_bytes) + ", peak_bytes=" +
               std::to_string(s.peak_bytes) + ", cached_bytes=" + std::to_string(s.cached_bytes) + ")";
      });
  m.def("memory_stats", &cf::memory_stats, nb::arg("device") = cf::Device::cpu(),
        "Live and peak bytes held by tensors on a device (memory borrowed through DLPack is not counted).");
  m.def("reset_peak_memory", &cf::reset_peak_memory, nb::arg("device") = cf::Device::cpu(),
        "Start a new peak: peak_bytes = live_bytes.");
  m.def("empty_cache",
        [](cf::Device device) {
          sweep_wrappers();  // first the objects kept for tensors nothing else holds now (a dropped model's)
          cf::empty_cache(device);
        },
        nb::arg("device") = cf::Device::cpu(),
        "Release the blocks a caching allocator keeps for reuse (after letting go of the Python objects of "
        "tensors that only Python could still hold, such as a deleted model's parameters).");

  m.def("set_num_threads", &cf::set_num_threads, nb::arg("n"),
        "CPU threads of every later cf kernel, whichever thread calls it (1 <= n <= 1024; 0: OpenMP's own count "
        "of the calling thread, the default). OpenMP's count is per thread, and importing torch sets the "
        "importing thread's to torch's: this one setting holds for all.");
  m.def("get_num_threads", &cf::get_num_threads,
        "CPU threads the next cf kernel called from this thread may use: cf.set_num_threads's n, else OpenMP's "
        "count of this thread.");

  nb::module_ cuda = m.def_submodule("cuda", "The CUDA runtime as cf sees it.");
  cuda.def("device_count", &cf::cuda::device_count, "CUDA devices visible (0 without the backend, driver or GPU).");
  cuda.def("is_available", &cf::cuda::is_available, "True when a CUDA device is visible to this build.");
  cuda.def("synchronize", &cf::cuda::synchronize, release_gil(),
           "Wait for all queued work on the device (and report a failed deferred check).");
  cuda.def("check_errors", &cf::cuda::check_errors, release_gil(),
           "Read the deferred data checks (an index out of range on CUDA is reported at the next host read): "
           "raises the first failed one's error; no-op when none is pending.");
  cuda.def("pending_checks", &cf::cuda::pending_checks, "Deferred data checks queued and not yet read.");
  cuda.def("set_allow_tf32", &cf::cuda::set_allow_tf32, nb::arg("on"),
           "TF32 tensor cores in float32 matmuls and in the float32 tensor-core attention kernels (one TF32 "
           "product instead of three; off by default).");
  cuda.def("allow_tf32", &cf::cuda::allow_tf32,
           "Whether float32 matmuls and the float32 tensor-core attention kernels may use one TF32 product.");
  cuda.def("set_sync_debug", &cf::cuda::set_sync_debug, nb::arg("on"),
           "Synchronise and check after every kernel launch, so an error names its op.");
  cuda.def("sync_debug", &cf::cuda::sync_debug, "Whether every kernel launch is followed by a synchronising check.");
  cuda.def("capturing", &cf::cuda::capturing, "True while this thread captures a cf.cuda.Graph.");
  // (the GIL is held throughout: capture and replay call Python functions)
  cuda.def("replayable", &cf::cuda::replayable, nb::arg("fn"),
           "Call fn; inside a cf.cuda.Graph capture its kernels become a part of their own, and fn is called "
           "again before every replay but the first to refresh their host-side arguments (an optimizer step's "
           "step counts and learning rate). fn must launch the same kernels each time and allocate nothing.");
  nb::class_<cf::cuda::Graph>(cuda, "Graph",
                              "A CUDA graph of a whole step (core/cuda_graph.h): capture(fn) records fn's CUDA "
                              "work without running it, replay() queues it again; inputs change by writing into "
                              "the tensors the capture read; random draws replay as the eager calls would. Host "
                              "reads and waits inside fn raise.")
      .def(nb::init<>())
      .def("capture", &cf::cuda::Graph::capture, nb::arg("fn"), nb::arg("device") = cf::Device::cuda(0),
           "Record fn's CUDA work on device (run fn eagerly once before, so its first-call state exists).")
      .def("replay", &cf::cuda::Graph::replay, "Queue the captured work once; returns without waiting.")
      .def("reset", &cf::cuda::Graph::reset, "Drop the captured work and return its private memory.")
      .def_prop_ro("captured", &cf::cuda::Graph::captured)
      .def_prop_ro("parts", &cf::cuda::Graph::parts, "Graph launches per replay.");

  nb::class_<cf::OpInfo>(m, "OpInfo", "One entry of the op registry.")
      .def_prop_ro("name", [](const cf::OpInfo& o) { return std::string(o.name); })
      .def_ro("differentiable", &cf::OpInfo::differentiable)
      .def_ro("cuda", &cf::OpInfo::cuda)
      .def("__repr__", [](const cf::OpInfo& o) {
        return std::string("OpInfo(") + o.name + (o.differentiable ? ", differentiable" : "") +
               (o.cuda ? ", cuda" : "") + ")";
      });
  m.def("op_registry", &cf::op_registry, nb::rv_policy::reference,
        "The one list of ops (autograd/registry.cpp); each is a function of this module.");

  nb::class_<cf::Tensor> tensor = bind_tensor_class(m);
  bind_dlpack(m, tensor);
  bind_ops(m, tensor);
  bind_torch_conveniences(m, tensor);
  nb::module_ nn = m.def_submodule("nn", "Modules, layers, attention variants, losses, optimizers, checkpoints.");
  bind_nn(m, nn);
  nb::module_ models = m.def_submodule("models", "The Transformer baselines and the papers' models.");
  bind_models(m, models);
  nb::module_ data = m.def_submodule("data", "Datasets, loaders, tokenizers and file readers.");
  bind_data(m, data);
  nb::module_ dist = m.def_submodule("dist", "Processes training together (mpirun): the process group, collectives.");
  bind_dist(m, dist, nn);
  nb::module_ autograd = m.def_submodule("autograd", "Gradients returned rather than accumulated.");
  autograd.def(
      "grad",
      // (None-or-bool arguments as handles: GCC 12 warned maybe-uninitialized in nanobind's optional<bool> casters)
      [](nb::handle outputs, nb::handle inputs, nb::handle grad_outputs, nb::handle retain_graph_arg,
         bool create_graph, nb::handle allow_unused_arg, bool materialize_grads) {
        auto flag = [](nb::handle h, const char* name, bool otherwise) {
          if (h.is_none()) return otherwise;
          if (!PyBool_Check(h.ptr()))
            throw nb::type_error(cf::str("[grad] ", name, " must be a bool or None, got ",
                                         nb::type_name(h.type()).c_str()).c_str());
          return h.ptr() == Py_True;
        };
        const bool retain_graph = flag(retain_graph_arg, "retain_graph", false);
        const bool allow_unused = flag(allow_unused_arg, "allow_unused", false) || materialize_grads;
        CF_CHECK(!create_graph, ValueError,
                 "[grad] create_graph=True is not supported: cf's backward records no graph, so its gradients "
                 "cannot be differentiated again");
        // one tensor or any iterable of them (a list, params.values(), a generator), as torch.autograd.grad
        auto tensors = [](nb::handle h, const char* what, bool nones) {
          std::vector<cf::Tensor> out;
          if (nb::isinstance<cf::Tensor>(h)) {
            out.push_back(nb::cast<cf::Tensor>(h));
            return out;
          }
          PyObject* it = PyUnicode_Check(h.ptr()) ? nullptr : PyObject_GetIter(h.ptr());
          if (!it) {
            PyErr_Clear();
            throw nb::type_error(cf::str("[grad] ", what, " must be a cf.Tensor or an iterable of them, got ",
                                         nb::type_name(h.type()).c_str()).c_str());
          }
          nb::object iter = nb::steal(it);
          while (PyObject* item = PyIter_Next(iter.ptr())) {
            nb::object x = nb::steal(item);
            if (nones && x.is_none()) {
              out.emplace_back();
              continue;
            }
            if (!nb::isinstance<cf::Tensor>(x))
              throw nb::type_error(cf::str("[grad] ", what, " must hold cf.Tensors, got ",
                                           nb::type_name(x.type()).c_str()).c_str());
            out.push_back(nb::cast<cf::Tensor>(x));
          }
          if (PyErr_Occurred()) throw nb::python_error();  // the iterable's own exception
          return out;
        };
        const std::vector<cf::Tensor> outs = tensors(outputs, "outputs", false);
        const std::vector<cf::Tensor> ins = tensors(inputs, "inputs", false);
        const std::vector<cf::Tensor> gouts =
            grad_outputs.is_none() ? std::vector<cf::Tensor>{} : tensors(grad_outputs, "grad_outputs", true);
        std::vector<cf::Tensor> grads;
        {
          nb::gil_scoped_release g;
          grads = cf::autograd::grad(outs, ins, gouts, retain_graph, allow_unused);
          if (materialize_grads)  // unused inputs get zeros, as torch's materialize_grads
            for (size_t i = 0; i < grads.size(); ++i)
              if (!grads[i].defined()) grads[i] = cf::zeros_like(ins[i]);
        }
        nb::list out;
        for (const cf::Tensor& t : grads) out.append(t.defined() ? nb::cast(t) : nb::none());
        return nb::tuple(out);
      },
      nb::arg("outputs"), nb::arg("inputs"), nb::arg("grad_outputs") = nb::none(),
      nb::arg("retain_graph") = nb::none(), nb::arg("create_graph") = false, nb::kw_only(),
      nb::arg("allow_unused") = nb::none(), nb::arg("materialize_grads") = false,
      nb::sig("def grad(outputs: cf._cf.Tensor | collections.abc.Iterable[cf._cf.Tensor], "
              "inputs: cf._cf.Tensor | collections.abc.Iterable[cf._cf.Tensor], "
              "grad_outputs: cf._cf.Tensor | collections.abc.Iterable[cf._cf.Tensor | None] | None = None, "
              "retain_graph: bool | None = None, create_graph: bool = False, *, allow_unused: bool | None = None, "
              "materialize_grads: bool = False) -> tuple[cf._cf.Tensor | None, ...]"),
      "The gradients of the outputs (weighted by grad_outputs; omitted for one-element outputs) with respect "
      "to each input, returned as a tuple instead of accumulated into .grad, as torch.autograd.grad. Only the "
      "part of the graph leading to the inputs runs. An input the outputs do not use is an error unless "
      "materialize_grads (zeros) or "
      "allow_unused (its gradient is then None). create_graph is not supported (cf's backward records no "
      "graph).");
  bind_bridge(m);
}
