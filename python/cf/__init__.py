"""cf: a C++17 tensor library with an eager autograd engine, CPU and CUDA
backends, and the models of four clustered-attention papers, from Python.

    import cf
    x = cf.randn([2, 3], requires_grad=True)
    y = (cf.tanh(x) * x).sum()
    y.backward()
    print(x.grad)

The functions and classes are cf's own (a thin nanobind layer over cf.h):
cf.Tensor, every op of the registry (cf.op_registry()), cf.nn (layers, attention
variants, losses, optimizers, checkpoints, configs), cf.models (the papers'
models), cf.data (datasets, loader, tokenizers, readers), cf.kmeans. cf.torch
holds cf's attentions as torch.nn.Modules (it imports torch). Errors are
cf.Error subclasses whose message starts with "[op]".
"""
import builtins as _builtins
import functools as _functools
import sys as _sys
from types import ModuleType as _types_module

from . import _cf
from ._cf import *  # noqa: F401,F403  (the extension's public names)
from ._cf import nn, models, data, cuda, autograd, dist  # noqa: F401

__version__ = "0.1.0"

# `import cf.nn`, `from cf.nn import Linear`, ...: the extension's submodules
# under their package names.
for _name in ("nn", "nn.init", "models", "data", "cuda", "autograd", "dist"):
    _mod = _cf
    for _part in _name.split("."):
        _mod = getattr(_mod, _part)
    _sys.modules[__name__ + "." + _name] = _mod
del _name, _mod, _part


def _check_module_subclass(cls, **kwargs):
    """What a Python class deriving from a cf.nn module may do. From cf.nn.Module or cf.nn.UnaryModule (the
    Python bases): anything, forward included (a UnaryModule's forward is what Sequential and cf's C++ code
    call). From one of cf's C++ modules (cf.nn.Linear, a model): add attributes and methods, but not override
    forward or __call__, which __call__, Sequential and the models would not use (m.forward(x) and m(x) would
    disagree). From an abstract binding without a constructor (cf.nn.Attention): nothing, it cannot be built."""
    python_bases = (_cf.nn.Module, _cf.nn.UnaryModule)
    # the most derived cf class: the C++ type the instance is
    cf_base = next(k for k in cls.__mro__ if k.__module__.startswith("cf._cf"))
    if cf_base not in python_bases:
        if type(cf_base.__dict__.get("__init__")).__name__ != "nb_method":
            # (nanobind would run an ancestor's constructor on storage laid out for this class)
            raise TypeError("%s derives from %s, an abstract cf module that a Python class cannot build: derive "
                            "from cf.nn.Module (or cf.nn.UnaryModule) and hold cf's modules as attributes"
                            % (cls.__qualname__, cf_base.__qualname__))
        own = [k for k in cls.__mro__ if not k.__module__.startswith("cf._cf") and k is not object]
        if any("forward" in k.__dict__ or "__call__" in k.__dict__ for k in own):  # a mixin's counts too
            raise TypeError("%s overrides forward/__call__ of %s, a C++ module whose forward runs in C++ "
                            "(__call__ and Sequential would not use the override): derive from cf.nn.Module, hold "
                            "the cf module as an attribute and call it from your forward instead"
                            % (cls.__qualname__, cf_base.__qualname__))
    elif cf_base is _cf.nn.UnaryModule and any("__call__" in k.__dict__ for k in cls.__mro__
                                              if not k.__module__.startswith("cf._cf")):
        raise TypeError("%s overrides __call__ of cf.nn.UnaryModule, which Sequential would not use: define "
                        "forward(self, x) instead" % cls.__qualname__)
    init = cls.__dict__.get("__init__")
    if init is not None:
        # A subclass whose __init__ never called super().__init__() made an instance with no C++ module in it:
        # every later use failed with nanobind's "std::bad_cast" or an argument dump.
        @_functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            # checked by the outermost __init__ only (the one the instance's class resolves to, inherited too)
            if type(self).__init__ is __init__ and not _cf.nn._initialized(self):
                raise TypeError("[Module] %s.__init__ did not call super().__init__(), so no cf module was built "
                                "under it: call super().__init__(...) first in __init__" % cls.__qualname__)

        cls.__init__ = __init__
    super(_cf.nn.Module, cls).__init_subclass__(**kwargs)


_cf.nn.Module.__init_subclass__ = classmethod(_check_module_subclass)  # type: ignore[method-assign,assignment]

# Written in Python on the bindings: cf.nn.ModuleDict, cf.nn.functional (torch.nn.functional's names),
# cf.optim and cf.optim.lr_scheduler (torch.optim's), optimizer.param_groups.
from ._containers import ModuleDict as _ModuleDict  # noqa: E402
from . import _functional, _lr_scheduler, optim  # noqa: E402,F401

from ._param_groups import ParamGroup as _ParamGroup  # noqa: E402

from . import _nn_extras  # noqa: E402
from . import _cuda_extras, _data_extras  # noqa: E402,F401  (torch.cuda's memory functions; Subset, random_split)
from ._ops_extras import *  # noqa: E402,F401,F403  (einsum, multinomial, ...: its __all__)

_cf.nn.ModuleDict = _ModuleDict
for _name in ("CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "BCELoss", "BCEWithLogitsLoss", "SmoothL1Loss",
              "HuberLoss", "KLDivLoss", "ELU", "Softplus", "Mish", "Hardtanh", "SiLU", "Softmax", "LogSoftmax",
              "Flatten", "RMSNorm", "MultiheadAttention", "utils"):
    setattr(_cf.nn, _name, getattr(_nn_extras, _name))
_sys.modules[__name__ + ".nn.utils"] = _nn_extras.utils
_sys.modules[__name__ + ".nn.utils.rnn"] = _nn_extras.utils.rnn
_cf.nn.ParamGroup = _ParamGroup  # (optimizer.param_groups, bound in C++, builds them)
_cf.nn.functional = _functional
_sys.modules[__name__ + ".nn.functional"] = _functional
_sys.modules[__name__ + ".optim.lr_scheduler"] = _lr_scheduler


def _rebuild_tensor(data, dtype, shape, device, requires_grad):
    """Unpickles a cf.Tensor (what its __reduce__ names)."""
    t = _cf._tensor_from_bytes(data, getattr(_cf, dtype), list(shape), _cf.Device(device))
    return t.requires_grad_(True) if requires_grad else t


def _run_under(fn, make_context):
    """fn wrapped so that its body runs inside make_context(); a generator function's body
    runs inside it at every resumption (a plain wrapper left the context before the first
    next(), so a @cf.no_grad() generator recorded graphs), as torch's decorators do."""
    import functools
    import inspect

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator_wrapper(*args, **kwargs):
            gen = fn(*args, **kwargs)
            try:
                with make_context():
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with make_context():
                            gen.close()
                        raise
                    except BaseException:
                        with make_context():
                            response = gen.throw(*_sys.exc_info())
                    else:
                        with make_context():
                            response = gen.send(request)
            except StopIteration as stop:
                return stop.value
        return generator_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with make_context():
            return fn(*args, **kwargs)
    return wrapper


class no_grad:
    """Context manager (and decorator) that turns off autograd recording on
    this thread: ops inside record no history, as under torch.no_grad().
    As a decorator, with or without parentheses (@cf.no_grad() or @cf.no_grad)."""

    def __new__(cls, *args):
        self = super().__new__(cls)
        if len(args) == 1 and callable(args[0]):  # @cf.no_grad without parentheses
            return self(args[0])
        if args:
            raise TypeError("%s takes no arguments (or, as a bare decorator, the function)" % cls.__name__)
        return self

    def __enter__(self):
        self._prev = _cf.grad_enabled()
        _cf._set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        _cf._set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        return _run_under(fn, self.__class__)


class enable_grad(no_grad):
    """Context manager (and decorator) that turns autograd recording back on."""

    def __enter__(self):
        self._prev = _cf.grad_enabled()
        _cf._set_grad_enabled(True)
        return self


class inference_mode:
    """torch.inference_mode: cf has one no-history mode, so this is cf.no_grad under PyTorch's name (a context
    manager and decorator, with or without parentheses); inference_mode(False) turns recording on inside, as
    PyTorch's does. Tensors made inside are ordinary tensors (PyTorch's inference tensors refuse later use in
    autograd; cf's do not need to)."""

    def __new__(cls, mode=True):
        self = super().__new__(cls)
        if callable(mode) and not isinstance(mode, _builtins.bool):  # @cf.inference_mode without parentheses
            self._mode = True
            return self(mode)
        if not isinstance(mode, _builtins.bool):
            raise TypeError("[inference_mode] mode must be a bool, got %r" % (mode,))
        self._mode = mode
        return self

    def __enter__(self):
        self._prev = _cf.grad_enabled()
        _cf._set_grad_enabled(not self._mode)
        return self

    def __exit__(self, *exc):
        _cf._set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        mode = self._mode
        return _run_under(fn, lambda: inference_mode(mode))


class set_grad_enabled:
    """Sets autograd recording on this thread at once (cf.set_grad_enabled(False)), and as a
    context manager restores the previous setting on leaving, as torch.set_grad_enabled:
    `with cf.set_grad_enabled(training): ...`."""

    def __init__(self, mode):
        self._prev = _cf.grad_enabled()
        self._mode = True if mode else False  # (bool is cf.bool here)
        _cf._set_grad_enabled(self._mode)

    def __call__(self, fn):
        # @cf.set_grad_enabled(False): the mode applies inside fn only; decorating leaves this
        # thread's mode as it was (torch 2's rule)
        _cf._set_grad_enabled(self._prev)
        mode = self._mode
        return _run_under(fn, lambda: set_grad_enabled(mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _cf._set_grad_enabled(self._prev)
        return False


class autocast:
    """Context manager (and decorator) for mixed precision on this thread, as
    torch.autocast: matmul (Linear, attention products) runs in dtype
    (cf.bfloat16 or cf.float16), softmax, layer_norm, losses and sums in
    float32, other ops by dtype promotion. enabled=False turns autocast off
    inside; leaving restores the outer setting. PyTorch's spelling works too:
    cf.autocast("cuda") (float16 by default there, as torch's) or
    cf.autocast("cpu", dtype=cf.bfloat16); cf's autocast covers every
    device, so the device type only picks that default."""

    def __init__(self, device_type=None, dtype=None, enabled=True, cache_enabled=None):
        # torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None), and cf's own spelling with the
        # dtype first: cf.autocast(cf.bfloat16) or cf.autocast(cf.bfloat16, False)
        if isinstance(device_type, _cf.dtype):
            if isinstance(dtype, _builtins.bool):
                dtype, enabled = None, dtype
            if dtype is not None:
                raise TypeError("[autocast] dtype given twice (%r and %r)" % (device_type, dtype))
            device_type, dtype = None, device_type
        if not isinstance(enabled, _builtins.bool):
            raise TypeError("[autocast] enabled must be a bool, got %r" % (enabled,))
        if device_type is not None:
            if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cpu", "cuda"):
                raise ValueError("[autocast] device_type must be \"cpu\" or \"cuda\", got %r" % (device_type,))
            if dtype is None and device_type.startswith("cuda"):
                dtype = _cf.float16  # torch.autocast("cuda")'s default
        self._dtype = (dtype if dtype is not None else _cf.bfloat16) if enabled else None

    def __enter__(self):
        self._prev = _cf.autocast_dtype()
        _cf.set_autocast_dtype(self._dtype)
        return self

    def __exit__(self, *exc):
        _cf.set_autocast_dtype(self._prev)
        return False

    def __call__(self, fn):
        return _run_under(fn, lambda: autocast(dtype=self._dtype, enabled=self._dtype is not None))


def numpy(t):
    """A NumPy array sharing the memory of the CPU tensor t (no copy)."""
    import numpy as _np
    return _np.asarray(t)


def _numpy_views(x):
    """x with every cf.Tensor in it (at the top, or in a list or tuple) as a NumPy view."""
    import numpy as _np
    if isinstance(x, _cf.Tensor):
        return _np.asarray(x)
    if type(x) in (list, tuple):
        return type(x)(_numpy_views(y) for y in x)
    return x


def _array_function(self, func, types, args, kwargs):
    """NumPy's functions on cf tensors (np.sum(t), np.mean(t, axis=0), np.concatenate([t, a]),
    out=t) run on NumPy views of the tensors, as on any array-like, and give NumPy's results.
    Without this NumPy called the tensor's own method for a reduction with NumPy's keywords
    (t.sum(axis=None, out=None)) and failed. Like np.asarray(t), the view is refused for a CUDA
    tensor, a bfloat16 one and one that requires grad, with cf's message.
      np.shape, np.ndim, np.squeeze read the tensor's own attributes, as before (any tensor; squeeze
        gives a cf.Tensor).
      NumPy's implementation is called directly (func._implementation): a tensor left inside another
        container (a deque, a namedtuple) is then converted by NumPy through __array__, where calling
        func again would dispatch back here without end.
      out=t: NumPy writes through the view; t's version counter is bumped, as an in-place cf op bumps
        it (a tensor saved for a backward then refuses it, not a silently wrong gradient), and t is
        what the call returns."""
    import numpy as _np
    impl = getattr(func, "_implementation", func)
    if func in (_np.shape, _np.ndim, _np.squeeze):
        return impl(*args, **kwargs)
    result = impl(*_numpy_views(args), **{k: _numpy_views(v) for k, v in kwargs.items()})
    out = kwargs.get("out")
    outs = out if type(out) is tuple else (out,)
    for o in outs:
        if isinstance(o, _cf.Tensor):
            o._bump_version()
    if isinstance(out, _cf.Tensor):
        return out
    return result


_cf.Tensor.__array_function__ = _array_function  # type: ignore[attr-defined]


def save(obj, f):
    """Writes obj (tensors, state dicts, lists and dicts of them, numbers: what pickle takes) to the path or
    binary file f, as torch.save: cf.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, path).
    A path is written whole or not at all (a temporary file, then renamed). The format is pickle: load only
    files you trust (cf.load runs what the file says, as torch.load(weights_only=False))."""
    import os
    import pickle
    import tempfile
    if hasattr(f, "write"):
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        return
    path = os.path.realpath(os.fspath(f))  # (through a symlink: its target is replaced, not the link)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError("[save] cannot write %s: the directory %s does not exist" % (path, directory))
    try:
        mode = os.stat(path).st_mode & 0o7777  # an existing file keeps its permissions
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # a new one gets open()'s
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".cf-save-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            pickle.dump(obj, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: the old file or the new one after a crash
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load(f):
    """Reads what cf.save wrote (a path or a binary file). Pickle: only files you trust."""
    import os
    import pickle
    if hasattr(f, "read"):
        return pickle.load(f)
    with open(os.fspath(f), "rb") as src:
        return pickle.load(src)


from . import amp  # noqa: E402,F401  (torch.amp's names: autocast and GradScaler, defined above)

# PyTorch's other names: dtypes (torch.long, ...), cf.device, and torch.utils.data's path for cf.data. (From
# here on `float` in this module is cf.float32: nothing below may call the builtin.)
long, double, half, device = int64, float64, float16, Device  # noqa: F405
float = float32  # noqa: F405,A001
utils = _types_module("cf.utils", "torch.utils's path: cf.utils.data is cf.data.")
utils.data = data
_sys.modules[__name__ + ".utils"] = utils
_sys.modules[__name__ + ".utils.data"] = data

# `from cf import *` gives every public name but the two that would replace Python's builtins (bool, float:
# use cf.bool and cf.float32), as torch's star import leaves them.
__all__ = [_n for _n in dir() if not _n.startswith("_") and _n not in ("bool", "float")]
