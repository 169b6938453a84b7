"""torch.cuda's memory and seeding functions under cf.cuda (set on the extension's cf.cuda by cf/__init__.py).
cf has no current device: a tensor's device is named where it is made or moved ("cuda:1"), and "cuda" is cuda:0,
so current_device() is 0 and set_device takes 0 only."""
from . import _cf

__all__ = ["manual_seed", "manual_seed_all", "empty_cache", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "reset_peak_memory_stats", "current_device", "set_device"]


def _cuda(device, op):
    """device (None, an index, "cuda[:i]" or a cf.Device) as a CUDA cf.Device."""
    import numbers
    given = device
    if device is None:
        device = 0
    if isinstance(device, numbers.Integral) and not isinstance(device, bool) and device >= 0:
        device = "cuda:%d" % device
    try:
        d = _cf.Device(device) if isinstance(device, str) else device
    except _cf.Error:
        d = None
    if not isinstance(d, _cf.Device) or not d.is_cuda:
        raise _cf.DeviceError("[cuda.%s] expects a CUDA device (an index, \"cuda:i\" or a cf.Device), got %r"
                              % (op, given))
    if d.index >= _cf.cuda.device_count():
        raise _cf.DeviceError("[cuda.%s] %s is not a visible device (%d CUDA devices)"
                              % (op, d, _cf.cuda.device_count()))
    return d


def manual_seed(seed: int) -> None:
    """cf.manual_seed: cf has one process-wide generator for every device, so this reseeds it."""
    _cf.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """cf.manual_seed (one generator for every device)."""
    _cf.manual_seed(seed)


def empty_cache() -> None:
    """Returns the CUDA caching allocator's unused blocks of every GPU to the driver (cf.empty_cache)."""
    for i in range(_cf.cuda.device_count()):
        _cf.empty_cache(_cf.Device("cuda:%d" % i))


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors on the device (cf.memory_stats(device).live_bytes)."""
    return _cf.memory_stats(_cuda(device, "memory_allocated")).live_bytes


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated since the start or reset_peak_memory_stats (cf.memory_stats(device).peak_bytes)."""
    return _cf.memory_stats(_cuda(device, "max_memory_allocated")).peak_bytes


def memory_reserved(device=None) -> int:
    """Bytes the caching allocator holds on the device: live tensors' and its unused cache."""
    s = _cf.memory_stats(_cuda(device, "memory_reserved"))
    return s.live_bytes + s.cached_bytes


def reset_peak_memory_stats(device=None) -> None:
    """Starts a new peak: max_memory_allocated() = memory_allocated() (cf.reset_peak_memory)."""
    _cf.reset_peak_memory(_cuda(device, "reset_peak_memory_stats"))


def current_device() -> int:
    """0: cf has no current device ("cuda" is cuda:0; name another where tensors are made or moved)."""
    return 0


def set_device(device) -> None:
    """Accepts device 0 only: cf has no current device to change. Name the device where tensors are made or moved
    (t.to("cuda:1"), device="cuda:1"), one process per GPU as with torch.distributed."""
    d = _cuda(device, "set_device") if device not in (0, "cuda", "cuda:0") else None
    if d is not None and d.index != 0:
        raise _cf.DeviceError("[cuda.set_device] cf has no current device, so cuda:%d cannot become the default; "
                              "name it where tensors are made or moved (device=\"cuda:%d\", t.to(\"cuda:%d\"))"
                              % (d.index, d.index, d.index))


for _name in __all__:
    setattr(_cf.cuda, _name, globals()[_name])
