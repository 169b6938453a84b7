"""Functions written in Python over cf's ops, with PyTorch's names: einsum, multinomial, from_numpy, and the
in-place initialisers Tensor.normal_ and uniform_. Each composes cf's differentiable ops, so it runs on
any device and autograd sees it as those ops."""
import numbers as _numbers
import operator as _operator
import string as _string

from . import _cf
from ._functional import _broadcast_shape, _check_tensor, _real

__all__ = ["einsum", "multinomial", "from_numpy", "is_tensor", "numel", "as_tensor", "empty_like", "randn_like",
           "rand_like", "broadcast_to", "isclose", "count_nonzero", "outer", "dot", "masked_select", "nonzero",
           "bincount", "repeat_interleave", "clip", "lerp", "logical_xor", "log2", "log10", "exp2", "true_divide",
           "addmm", "baddbmm", "addmv", "diag", "diagonal", "trace", "meshgrid", "cdist", "tensordot", "inner", "kron",
           "unique", "median", "kthvalue", "quantile", "index_copy", "index_fill", "index_put", "take", "put",
           "masked_scatter"]

_LETTERS = frozenset(_string.ascii_letters)
_FLOATS = (_cf.float32, _cf.float64, _cf.bfloat16, _cf.float16)


# ---------------------------------------------------------------- einsum
def _parse_einsum(equation, operands):
    """(input label lists, output label list): one label per axis; an ellipsis becomes private labels, right
    aligned across the operands (fewer ellipsis axes in one operand broadcast against more in another)."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise _cf.ValueError("[einsum] %r has more than one '->'" % equation)
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise _cf.ValueError("[einsum] %r names %d operands, got %d tensors" % (equation, len(terms), len(operands)))
    for term in terms + ([rhs] if arrow else []):
        bad = set(term.replace("...", "")) - _LETTERS
        if bad or term.count("...") > 1:
            raise _cf.ValueError("[einsum] %r: subscripts are letters with at most one '...' per operand, got %r"
                                 % (equation, term))
    n_ell = 0
    for term, t in zip(terms, operands):
        named = len(term.replace("...", ""))
        if ("..." in term and t.dim() < named) or ("..." not in term and t.dim() != named):
            raise _cf.ShapeError("[einsum] operand %r has %d axes for subscripts %r" % (t.shape, t.dim(), term))
        if "..." in term:
            n_ell = max(n_ell, t.dim() - named)
    ell = ["\x00%d" % i for i in range(n_ell)]  # labels no letter can collide with

    def expand(term, ndim):
        if "..." not in term:
            return list(term)
        head, _, tail = term.partition("...")
        k = ndim - len(head) - len(tail)
        return list(head) + ell[n_ell - k:] + list(tail)

    inputs = [expand(term, t.dim()) for term, t in zip(terms, operands)]
    if arrow:
        if "..." in rhs:
            head, _, tail = rhs.partition("...")
            output = list(head) + ell + list(tail)
        else:
            output = list(rhs)
        seen = [label for labels in inputs for label in labels]
        for label in output:
            if label not in seen:
                raise _cf.ValueError("[einsum] %r: output subscript %r is in no operand" % (equation, label))
        if len(set(output)) != len(output):
            raise _cf.ValueError("[einsum] %r: an output subscript appears twice" % equation)
    else:  # implicit: the ellipsis, then the letters seen once, in alphabetical order (NumPy's rule)
        counts = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = ell + sorted(label for label, c in counts.items() if c == 1 and label in _LETTERS)
    return inputs, output


def _take_diagonals(t, labels):
    """t with every label repeated inside one operand ('ii') reduced to its diagonal: one axis per label, last.
    The diagonal is picked by index (the two axes flattened, every (n + 1)-th entry), so entries off it never
    enter the result (an inf there stays out)."""
    labels = list(labels)
    while len(set(labels)) != len(labels):
        label = next(l for l in labels if labels.count(l) > 1)
        a = labels.index(label)
        b = labels.index(label, a + 1)
        n = t.shape[a]
        if t.shape[b] != n:
            raise _cf.ShapeError("[einsum] subscript %r repeats over axes of sizes %d and %d" % (label, n, t.shape[b]))
        rest = [i for i in range(t.dim()) if i not in (a, b)]
        t = _cf.permute(t, rest + [a, b])
        t = _cf.reshape(t, [t.shape[i] for i in range(len(rest))] + [n * n])
        t = _cf.index_select(t, t.dim() - 1, _cf.arange(n, device=t.device) * (n + 1))
        labels = [labels[i] for i in rest] + [label]
    return t, labels


def _sum_labels(t, labels, drop):
    axes = [i for i, label in enumerate(labels) if label in drop]
    if not axes:
        return t, labels
    return _cf.sum(t, axes), [label for label in labels if label not in drop]


def _contract(a, la, b, lb, keep):
    """The product of a (labels la) and b (labels lb) summed over their shared labels not in keep: one batched
    matmul after the shared kept labels (batch), a's own, b's own and the summed ones are grouped."""
    batch = [l for l in la if l in lb and l in keep]
    summed = [l for l in la if l in lb and l not in keep]
    a_own = [l for l in la if l not in lb]
    b_own = [l for l in lb if l not in la]
    size = {}
    for t, labels in ((a, la), (b, lb)):
        for i, l in enumerate(labels):
            n, prev = t.shape[i], size.get(l)
            if prev is None or prev == 1:
                size[l] = n  # (a size 1 broadcasts; 0 is a size like any other)
            elif n != 1 and n != prev:
                what = "an axis of '...'" if l.startswith("\x00") else "subscript %r" % l
                raise _cf.ShapeError("[einsum] %s has sizes %d and %d" % (what, prev, n))

    def arrange(t, labels, order):
        t = _cf.permute(t, [labels.index(l) for l in order])
        return _cf.expand(t, [size[l] for l in order])  # (ellipsis axes of size 1 broadcast)

    def prod(ls):
        p = 1
        for l in ls:
            p *= size[l]
        return p

    a3 = _cf.reshape(arrange(a, la, batch + a_own + summed), [prod(batch), prod(a_own), prod(summed)])
    b3 = _cf.reshape(arrange(b, lb, batch + summed + b_own), [prod(batch), prod(summed), prod(b_own)])
    if a3.dtype in _FLOATS:
        out = _cf.matmul(a3, b3)
    else:  # int64 / bool (matmul is for floats): products broadcast over (batch, M, K, N), summed over K
        out = _cf.sum(_cf.unsqueeze(a3, 3) * _cf.unsqueeze(b3, 1), [2])
    return _cf.reshape(out, [size[l] for l in batch + a_own + b_own]), batch + a_own + b_own


def einsum(equation, *operands):
    """Einstein summation, as torch.einsum: cf.einsum("bhnd,bhmd->bhnm", q, k). Subscripts are letters; '...'
    stands for broadcast axes; without '->' the output is the ellipsis then the letters seen once,
    alphabetically. A letter repeated in one operand takes its diagonal ('ii->i'). The operands may also come
    as one list. Runs as permutes, reshapes, sums and one batched matmul per pair of operands (left to right),
    all differentiable."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError("[einsum] the equation must be a string, got %s" % type(equation).__name__)
    if not operands:
        raise _cf.ValueError("[einsum] needs at least one operand")
    for t in operands:
        if not isinstance(t, _cf.Tensor):
            raise TypeError("[einsum] operands must be cf.Tensors, got %s" % type(t).__name__)
    if len({t.dtype for t in operands}) > 1:
        raise _cf.DTypeError("[einsum] operands must share one dtype, got %s"
                             % ", ".join(str(t.dtype) for t in operands))
    inputs, output = _parse_einsum(equation, operands)
    terms = []
    for t, labels in zip(operands, inputs):
        terms.append(_take_diagonals(t, labels))
    # labels summed as early as possible: those of one operand that no other operand and not the output have
    for i, (t, labels) in enumerate(terms):
        elsewhere = set(output).union(*(set(l) for j, (_, l) in enumerate(terms) if j != i))
        terms[i] = _sum_labels(t, labels, {l for l in labels if l not in elsewhere})
    t, labels = terms[0]
    for i in range(1, len(terms)):
        b, lb = terms[i]
        keep = set(output).union(*(set(l) for _, l in terms[i + 1:]))
        t, labels = _contract(t, labels, b, lb, keep)
    t, labels = _sum_labels(t, labels, {l for l in labels if l not in output})
    # always a new tensor object (torch returns a view even for "ij->ij"): a permute is a view of t
    return _cf.permute(t, [labels.index(l) for l in output])


# ---------------------------------------------------------------- sampling
def multinomial(input, num_samples, replacement=False, generator=None):
    """Indices (int64) of num_samples categories drawn from each row of input (1-d or 2-d non-negative weights,
    not necessarily summing to 1), as torch.multinomial. With replacement: inverse-CDF sampling (a running sum in
    float64, one uniform draw and one binary search per sample). Without: the Gumbel top-k trick (the k largest of
    log(w) - log(-log(u)) are distributed as k draws without replacement), so num_samples must not exceed the
    number of categories of positive weight. The weights are checked (finite, >= 0, a positive sum per row)
    with one read of four numbers, a wait on the device for a CUDA input."""
    if not isinstance(input, _cf.Tensor):
        raise TypeError("[multinomial] input must be a cf.Tensor, got %s" % type(input).__name__)
    if input.dim() not in (1, 2) or input.shape[-1] == 0:
        raise _cf.ShapeError("[multinomial] input must be 1-d or 2-d with at least one category, got %s"
                             % (input.shape,))
    if input.dtype not in _FLOATS:
        raise _cf.DTypeError("[multinomial] input must hold float weights, got %s" % input.dtype)
    if not isinstance(num_samples, _numbers.Integral) or isinstance(num_samples, bool) or num_samples < 1:
        raise _cf.ValueError("[multinomial] num_samples must be an integer >= 1, got %r" % (num_samples,))
    k = input.shape[-1]
    if not replacement and num_samples > k:
        raise _cf.ValueError("[multinomial] cannot draw %d of %d categories without replacement" % (num_samples, k))
    w = _cf.reshape(_cf.to(input.detach(), _cf.float64), [-1, k])  # (rows, k)
    rows = w.shape[0]
    if rows == 0:
        return _cf.zeros([0, num_samples], dtype=_cf.int64, device=input.device)
    # (w is detached: nothing below records a graph)
    positive = _cf.sum(w > 0, [1])
    stats = _cf.stack([_cf.amin(w), _cf.to(_cf.sum(~_cf.isfinite(w)), _cf.float64),
                       _cf.amin(_cf.sum(w, [1])), _cf.to(_cf.amin(positive), _cf.float64)]).tolist()
    if stats[1] > 0 or stats[0] < 0:
        raise _cf.ValueError("[multinomial] weights must be finite and >= 0")
    if stats[2] <= 0:
        raise _cf.ValueError("[multinomial] every row needs a positive total weight")
    if not replacement and num_samples > stats[3]:
        raise _cf.ValueError("[multinomial] cannot draw %d categories without replacement from a row with %d "
                             "of positive weight" % (num_samples, int(stats[3])))
    if replacement:
        cdf = _cf.cumsum(w, 1)  # (rows, k)
        u = _cf.rand([rows, num_samples], dtype=_cf.float64, generator=generator, device=w.device)
        u = u * _cf.narrow(cdf, 1, k - 1, 1)
        # the number of cumulative weights at or below u is the drawn category (a zero-weight one spans an
        # empty interval and is never drawn), a binary search per sample; a u rounded up to the row's total is
        # kept at its last category of positive weight
        picked = _cf.searchsorted(cdf, u, right=True)
        last = _cf.amax(_cf.to(w > 0, _cf.int64) * _cf.arange(k, device=w.device), [1], keepdim=True)
        picked = _cf.minimum(picked, last)
    else:
        u = _cf.rand([rows, k], dtype=_cf.float64, generator=generator, device=w.device, low=1e-300)
        keys = _cf.log(w) - _cf.log(-_cf.log(u))  # log(0) = -inf: never among the top
        picked = _cf.topk(keys, num_samples, 1)[1]
    return picked.reshape([num_samples] if input.dim() == 1 else [rows, num_samples])


def from_numpy(array):
    """A cf tensor sharing the memory of the NumPy array (torch.from_numpy): writes through either are seen by
    the other. The array must be writeable, of a dtype cf holds (float32, float64, int64, float16; bool where the
    installed NumPy exports it through DLPack, 1.25+) and without negative strides."""
    import numpy as np
    if not isinstance(array, np.ndarray):
        raise TypeError("[from_numpy] expects a numpy.ndarray, got %s" % type(array).__name__)
    if not array.flags.writeable:
        raise _cf.ValueError("[from_numpy] the array is read-only: a cf tensor would let its memory be written "
                             "(copy it first: cf.tensor(array) or array.copy())")
    try:
        return _cf.from_dlpack(array)
    except (BufferError, TypeError, _cf.Error) as e:  # (NumPy's exporter refuses some dtypes and layouts)
        raise type(e)("[from_numpy] cannot share the memory of a %s array of shape %s and strides %s (%s); "
                      "cf.tensor(array) makes a copy" % (array.dtype, array.shape, array.strides, e)) from e


# ---------------------------------------------------------------- in-place initialisers
def _fill_from(self, op, draw):
    """Writes draw() into self in place, through copy_ (version counter, views, dtype), after cf's in-place
    rule: a tensor that requires grad is refused while grad mode is on (as fill_ refuses it; initialise under
    cf.no_grad(), as cf.nn.init does)."""
    if self.requires_grad and _cf.grad_enabled():
        raise _cf.AutogradError("[%s] in-place change of a tensor that requires grad (its gradient would miss "
                                "the write): do it under cf.no_grad(), or use cf.nn.init.%s" % (op, op))
    return self.copy_(draw())


def _draw_dtype(t):
    # drawn in t's own dtype where the generator has one (a float32 draw below b stays below b), else float64
    return t.dtype if t.dtype in (_cf.float32, _cf.float64) else _cf.float64


def _normal_(self, mean: float = 0.0, std: float = 1.0, *, generator: "_cf.Generator | None" = None) -> "_cf.Tensor":
    """Fills self in place with draws from N(mean, std^2); returns self. Refused for a tensor that requires
    grad while grad mode is on (cf's in-place rule)."""
    return _fill_from(self, "normal_", lambda: _cf.randn(list(self.shape), dtype=_draw_dtype(self),
                                                         generator=generator, mean=mean, std=std, device=self.device))


def _uniform_(self, a: float = 0.0, b: float = 1.0, *, generator: "_cf.Generator | None" = None) -> "_cf.Tensor":
    """Fills self in place with draws from U(a, b); returns self. PyTorch's keywords are from= and to= (not
    Python names here: pass them by position). Refused for a tensor that requires grad while grad mode is on."""
    return _fill_from(self, "uniform_", lambda: _cf.rand(list(self.shape), dtype=_draw_dtype(self),
                                                         generator=generator, low=a, high=b, device=self.device))


_cf.Tensor.normal_ = _normal_  # type: ignore[attr-defined]
_cf.Tensor.uniform_ = _uniform_  # type: ignore[attr-defined]


# ---- PyTorch's tensor conveniences, composed of cf's ops (autograd and devices as theirs)

def is_tensor(obj) -> bool:
    """Whether obj is a cf.Tensor (torch.is_tensor)."""
    return isinstance(obj, _cf.Tensor)


def numel(t: "_cf.Tensor") -> int:
    """The number of elements of t (torch.numel)."""
    return t.numel()


def as_tensor(data, dtype=None, device=None) -> "_cf.Tensor":
    """data as a tensor without a copy where it can be (torch.as_tensor): a cf.Tensor of that dtype and device is
    returned as is (else converted), a writeable CPU NumPy array of a dtype cf holds shares its memory
    (cf.from_numpy), anything else is copied (cf.tensor)."""
    if isinstance(data, _cf.Tensor):
        out = data if dtype is None or data.dtype == dtype else data.to(dtype)
        return out if device is None else out.to(device)
    on_cpu = device is None or (isinstance(device, str) and device == "cpu") or \
        (isinstance(device, _cf.Device) and device.is_cpu)
    if type(data).__module__ == "numpy" and type(data).__name__ == "ndarray" and on_cpu and \
            data.flags.writeable and all(s >= 0 for s in data.strides):
        try:
            out = from_numpy(data)
        except (TypeError, BufferError, _cf.Error):  # a dtype or layout DLPack does not share: copied below
            out = None
        if out is not None:
            return out if dtype is None or out.dtype == dtype else out.to(dtype)
    kwargs = {} if device is None else {"device": device}
    return _cf.tensor(data, dtype=dtype, **kwargs)


def _like(x, dtype, device):
    return list(x.shape), (x.dtype if dtype is None else dtype), (x.device if device is None else device)


def empty_like(x: "_cf.Tensor", dtype=None, device=None) -> "_cf.Tensor":
    """A tensor of x's shape (dtype and device x's unless given) with unspecified values (torch.empty_like)."""
    shape, dt, dev = _like(x, dtype, device)
    return _cf.empty(shape, dtype=dt, device=dev)


def randn_like(x: "_cf.Tensor", dtype=None, device=None, generator=None) -> "_cf.Tensor":
    """Standard normal draws of x's shape, dtype and device (torch.randn_like); a float dtype."""
    shape, dt, dev = _like(x, dtype, device)
    return _cf.randn(shape, dtype=dt, device=dev, generator=generator)


def rand_like(x: "_cf.Tensor", dtype=None, device=None, generator=None) -> "_cf.Tensor":
    """Uniform [0, 1) draws of x's shape, dtype and device (torch.rand_like); a float dtype."""
    shape, dt, dev = _like(x, dtype, device)
    return _cf.rand(shape, dtype=dt, device=dev, generator=generator)


def broadcast_to(x: "_cf.Tensor", shape: "list[int] | tuple[int, ...]") -> "_cf.Tensor":
    """torch.broadcast_to: a broadcast view of x (cf.expand)."""
    return _cf.expand(x, list(shape))


def isclose(a: "_cf.Tensor", b: "_cf.Tensor | float", rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> "_cf.Tensor":
    """Elementwise |a - b| <= atol + rtol |b| (torch.isclose), a bool tensor: equal values (infinities too) are
    close, NaN is close to NaN only with equal_nan. A number b is taken as float64 (not in a's dtype); two int64
    tensors subtract exactly. Compared in float64 (bfloat16 and float16 widened)."""
    op = "isclose"
    if not isinstance(a, _cf.Tensor):
        raise TypeError("[isclose] a must be a cf.Tensor, got %s" % type(a).__name__)
    if not (rtol >= 0 and atol >= 0):
        raise _cf.ValueError("[isclose] rtol and atol must be >= 0, got %r and %r" % (rtol, atol))
    if not isinstance(b, _cf.Tensor):
        b = _cf.full([], _real(b, "b", op), dtype=_cf.float64, device=a.device)
    ints = a.dtype in (_cf.int64, _cf.bool) and b.dtype in (_cf.int64, _cf.bool)
    wide_a = a if ints else _cf.to(a, _cf.float64)
    wide_b = b if ints else _cf.to(b, _cf.float64)
    try:
        eq = wide_a == wide_b
        finite = _cf.logical_and(_cf.isfinite(a), _cf.isfinite(b))
        diff = _cf.to(_cf.abs(_cf.to(wide_a, _cf.int64) - _cf.to(wide_b, _cf.int64)), _cf.float64) if ints else \
            _cf.abs(wide_a - wide_b)
        near = _cf.logical_and(finite, diff <= _cf.abs(_cf.to(b, _cf.float64)) * rtol + atol)
    except _cf.Error as e:  # shapes, devices: named as isclose's
        raise type(e)("[%s] %s" % (op, e)) from None
    out = _cf.logical_or(eq, near)
    if equal_nan:
        out = _cf.logical_or(out, _cf.logical_and(_cf.isnan(a), _cf.isnan(b)))
    return out


def count_nonzero(x: "_cf.Tensor", dim: "int | list[int] | tuple[int, ...] | None" = None) -> "_cf.Tensor":
    """The number of nonzero elements (int64), over all of x or along dim (an int or a sequence) as
    torch.count_nonzero."""
    nz = x != 0
    if dim is None:
        return _cf.sum(nz)
    return _cf.sum(nz, [dim] if isinstance(dim, int) else list(dim))


def outer(a: "_cf.Tensor", b: "_cf.Tensor") -> "_cf.Tensor":
    """a[i] * b[j] for 1-d a and b (torch.outer)."""
    if a.dim() != 1 or b.dim() != 1:
        raise _cf.ShapeError("[outer] expects two 1-d tensors, got %s and %s" % (a.shape, b.shape))
    return a.reshape([-1, 1]) * b.reshape([1, -1])


def dot(a: "_cf.Tensor", b: "_cf.Tensor") -> "_cf.Tensor":
    """The sum of a * b for two 1-d tensors of one length (torch.dot), 0-d."""
    if a.dim() != 1 or b.dim() != 1 or a.shape[0] != b.shape[0]:
        raise _cf.ShapeError("[dot] expects two 1-d tensors of one length, got %s and %s" % (a.shape, b.shape))
    return _cf.sum(a * b)


def masked_select(x: "_cf.Tensor", mask: "_cf.Tensor") -> "_cf.Tensor":
    """The elements of x where mask (bool) holds, broadcast together, as a 1-d tensor (torch.masked_select);
    reading the mask back, as x[mask]. Differentiable in x."""
    if not isinstance(mask, _cf.Tensor) or mask.dtype != _cf.bool:
        raise _cf.DTypeError("[masked_select] mask must be a bool tensor, got %r" % (mask,))
    shape = _broadcast_shape(list(x.shape), list(mask.shape), "masked_select")
    xb = x if list(x.shape) == shape else _cf.expand(x, shape)
    mb = mask if list(mask.shape) == shape else _cf.expand(mask, shape)
    return xb.reshape([-1])[mb.reshape([-1])]


def nonzero(x: "_cf.Tensor", as_tuple: bool = False) -> "_cf.Tensor | tuple[_cf.Tensor, ...]":
    """The positions of x's nonzero elements (torch.nonzero): an int64 (count, x.dim()) tensor in row-major
    order, or with as_tuple=True one 1-d tensor per axis. The count is read back (a device synchronisation on a
    GPU, as PyTorch's)."""
    mask = x if x.dtype == _cf.bool else x != 0
    flat = mask.reshape([-1])
    # the flat positions of the nonzero elements (the mask read back once), then each axis's coordinate from
    # them on the device (before: one read of the mask per axis)
    positions = _cf.arange(flat.numel(), device=x.device)[flat]
    coords = []
    stride = 1
    for size in reversed(list(x.shape)):
        # (an axis of size 0 leaves no positions: max(.., 1) only keeps the empty division legal)
        coords.insert(0, positions % max(size, 1) if stride == 1 else (positions // stride) % max(size, 1))
        stride = max(stride * size, 1)
    if as_tuple:
        return tuple(coords) if coords else (_cf.zeros([positions.numel()], dtype=_cf.int64, device=x.device),)
    if not coords:
        return _cf.zeros([positions.numel(), 0], dtype=_cf.int64, device=x.device)
    return _cf.stack(coords, 1)


nonzero._stub_overloads = [  # (the stub's method form: as_tuple picks the return type)
    ("self, as_tuple: typing.Literal[False] = False", "cf._cf.Tensor"),
    ("self, as_tuple: typing.Literal[True]", "builtins.tuple[cf._cf.Tensor, ...]")]


def bincount(x: "_cf.Tensor", weights: "_cf.Tensor | None" = None, minlength: int = 0) -> "_cf.Tensor":
    """Counts of each value of a 1-d non-negative int64 tensor (torch.bincount): length max(x) + 1 (at least
    minlength); with weights (x's length) their sums per value instead: float32 weights sum in float32, any other
    dtype in float64 (PyTorch's rule). max(x) is read back."""
    if x.dim() != 1 or x.dtype != _cf.int64:
        raise _cf.ValueError("[bincount] expects a 1-d int64 tensor, got %s of %s" % (x.dtype, x.shape))
    if not isinstance(minlength, int) or minlength < 0:
        raise _cf.ValueError("[bincount] minlength must be an integer >= 0, got %r" % (minlength,))
    if x.numel() and int(_cf.amin(x)) < 0:
        raise _cf.ValueError("[bincount] values must be >= 0, got %d" % int(_cf.amin(x)))
    n = max(int(_cf.amax(x)) + 1 if x.numel() else 0, minlength)
    if weights is None:
        src, dtype = _cf.ones([x.shape[0]], dtype=_cf.int64, device=x.device), _cf.int64
    else:
        if weights.shape != x.shape:
            raise _cf.ShapeError("[bincount] weights %s must have x's shape %s" % (weights.shape, x.shape))
        dtype = _cf.float32 if weights.dtype == _cf.float32 else _cf.float64
        src = _cf.to(weights, dtype)
    return _cf.scatter_add(_cf.zeros([n], dtype=dtype, device=x.device), 0, x, src)


def repeat_interleave(x: "_cf.Tensor", repeats: "int | _cf.Tensor | None" = None, dim: "int | None" = None,
                      output_size: "int | None" = None) -> "_cf.Tensor":
    """Each element (slice along dim) repeated (torch.repeat_interleave): repeats an int, or int64 counts, one per
    element (or one for all); dim None flattens x first. Counts are checked (>= 0) with one host read of their
    minimum and total, against which output_size, when given, is checked too. repeat_interleave(counts) alone
    repeats arange(len(counts)). Differentiable in x (an index_select)."""
    op = "repeat_interleave"
    if not isinstance(x, _cf.Tensor):
        raise TypeError("[%s] x must be a cf.Tensor, got %s" % (op, type(x).__name__))
    if repeats is None:
        if x.dim() != 1:
            raise _cf.ShapeError("[%s] repeat_interleave(counts) takes 1-d counts, got %s" % (op, tuple(x.shape)))
        x, repeats = _cf.arange(x.shape[0], device=x.device), x
    if dim is None:
        x, dim = x.reshape([-1]), 0
    if not -x.dim() <= dim < max(x.dim(), 1):
        raise IndexError("[%s] dim %d is out of range for a tensor of %d dimensions" % (op, dim, x.dim()))
    if x.dim() == 0:
        x = x.reshape([1])
    dim = dim + x.dim() if dim < 0 else dim
    n = x.shape[dim]
    if isinstance(repeats, (list, tuple)) or type(repeats).__module__ == "numpy":
        repeats = _cf.tensor(repeats, dtype=_cf.int64) if not isinstance(repeats, _numbers.Integral) else int(repeats)
    if isinstance(repeats, _cf.Tensor):
        if repeats.dtype != _cf.int64:
            raise _cf.DTypeError("[%s] repeats must be int64 counts, got %s" % (op, repeats.dtype))
        repeats = repeats.to(x.device)
        if repeats.dim() == 0 or (repeats.numel() == 1 and n != 1):
            repeats = int(repeats.reshape([]).item())
    if isinstance(repeats, _numbers.Integral) and not isinstance(repeats, bool):
        if repeats < 0:
            raise _cf.ValueError("[%s] repeats must be >= 0, got %d" % (op, repeats))
        if output_size is not None and output_size != n * repeats:
            raise _cf.ValueError("[%s] output_size %r is not the output's length %d" % (op, output_size, n * repeats))
        index = _cf.expand(_cf.arange(n, device=x.device).reshape([n, 1]), [n, int(repeats)]).reshape([-1])
        return _cf.index_select(x, dim, index)
    if not isinstance(repeats, _cf.Tensor) or repeats.dim() != 1 or repeats.shape[0] != n:
        raise _cf.ShapeError("[%s] repeats must be an int or an int64 tensor of %d counts (x's length along dim %d), "
                             "got %r" % (op, n, dim, repeats if not isinstance(repeats, _cf.Tensor) else
                                         "%s of %s" % (repeats.dtype, tuple(repeats.shape))))
    if n == 0:
        return _cf.index_select(x, dim, _cf.zeros([0], dtype=_cf.int64, device=x.device))
    ends = _cf.cumsum(repeats, 0)
    low, total = (int(v) for v in _cf.stack([_cf.amin(repeats), ends[-1]]).tolist())
    if low < 0:
        raise _cf.ValueError("[%s] repeats must be >= 0, got %d" % (op, low))
    if output_size is not None and output_size != total:
        raise _cf.ValueError("[%s] output_size %r is not the output's length %d" % (op, output_size, total))
    index = _cf.searchsorted(ends, _cf.arange(total, device=x.device), right=True)  # the element of each output
    return _cf.index_select(x, dim, index)


def _stride(self, dim: "int | None" = None) -> "tuple[int, ...] | int":
    """The strides in elements (torch's Tensor.stride): a tuple, or one axis's."""
    return tuple(self.strides) if dim is None else self.strides[dim]


_stride._stub_overloads = [("self", "builtins.tuple[builtins.int, ...]"),
                           ("self, dim: builtins.int", "builtins.int")]


def _element_size(self) -> int:
    """Bytes per element (torch's Tensor.element_size)."""
    return _cf.dtype_size(self.dtype)


def _new_tensor(self, data: object, dtype: "_cf.dtype | None" = None, device: "_cf.Device | str | None" = None,
                requires_grad: bool = False) -> "_cf.Tensor":
    """A new tensor copied from data, in this tensor's dtype and on its device unless given (torch's
    Tensor.new_tensor: float data into an integer dtype truncates toward zero)."""
    target, dev = self.dtype if dtype is None else dtype, self.device if device is None else device
    if target in _FLOATS:
        t = _cf.tensor(data, dtype=target, device=dev)
    else:  # (float data into an integer dtype: through float64, then truncated)
        t = _cf.tensor(data, device=dev)
        if t.dtype in _FLOATS:
            t = _cf.to(_cf.tensor(data, dtype=_cf.float64, device=dev), target)
        elif t.dtype != target:
            t = _cf.to(t, target)
    if requires_grad:
        t.requires_grad = True
    return t


def _where(self, condition: "_cf.Tensor", other: "_cf.Tensor | float") -> "_cf.Tensor":
    """cf.where(condition, self, other) (torch's Tensor.where)."""
    return _cf.where(condition, self, other)


def _scatter_add_(self, dim: int, index: "_cf.Tensor", src: "_cf.Tensor") -> "_cf.Tensor":
    """In place: self[..., index[i], ...] += src[i] along dim (cf.scatter_add_: O(index), not recorded, cf's
    in-place rule); returns self."""
    return _cf.scatter_add_(self, dim, index, src)


# ---- the scatter family (PyTorch's names), over cf.scatter, scatter_add, index_add and index_select. Each
# in-place form writes through cf.scatter_ / scatter_add_ (or cf._write_flat_ for flat positions): O(the
# selection), no copy of self (accumulating into bool: a copy; into bfloat16 or float16: a float32 scratch), not recorded
# (cf's in-place rule: refused on a tensor that requires grad while recording, and for a source that does).

def _number_at(op, value, like, shape):
    """value (a number) in like's dtype on its device, seen at shape (a stride-0 view); errors named op."""
    if not isinstance(value, _numbers.Number):
        raise TypeError("[%s] the value must be a cf.Tensor or a number, got %s" % (op, type(value).__name__))
    return _cf.expand(_named(op, lambda: _cf.full([], value, dtype=like.dtype, device=like.device)), list(shape))


def _scatter_(self, dim: int, index: "_cf.Tensor", src: "_cf.Tensor | float | None" = None,
              value: "float | None" = None, *, reduce: "str | None" = None) -> "_cf.Tensor":
    """In place (torch's Tensor.scatter_): src (a tensor, or a number given as src or value=) at the positions
    index names along dim; of several sent to one position the last along dim stays. reduce='add' adds instead
    (scatter_add); PyTorch's 'multiply' is not supported. Returns self."""
    op = "scatter_"
    if (src is None) == (value is None):
        raise TypeError("[%s] takes src (a tensor or a number) or value= (a number): one of them" % op)
    given = src if src is not None else value
    if reduce not in (None, "add"):
        raise _cf.ValueError("[%s] reduce must be 'add' (or None), got %r" % (op, reduce))
    if not isinstance(given, _cf.Tensor):  # a number: at every position index names
        _check_tensor(index, "index", op)
        given = _number_at(op, given, self, index.shape)
    return (_cf.scatter_ if reduce is None else _cf.scatter_add_)(self, dim, index, given)


def _spread(op, input, dim, index):
    """(axis, the 1-d index seen at input's shape with the axis len(index) long): the form scatter takes."""
    _check_tensor(input, "input", op)
    _check_tensor(index, "index", op)
    if input.dim() == 0:
        raise _cf.ShapeError("[%s] needs input with at least one dimension, got a 0-d tensor" % op)
    d = _axis(op, dim, input.dim())
    if index.dim() > 1 or index.dtype != _cf.int64:
        raise _cf.IndexError("[%s] index must be a 1-d int64 tensor, got %s of shape %s"
                             % (op, index.dtype.name, tuple(index.shape)))
    n = index.numel()
    shape = list(input.shape)
    shape[d] = n
    lead = [1] * input.dim()
    lead[d] = n
    return d, shape, _cf.expand(_cf.reshape(index, lead), shape)


def _slices(op, input, dim, index, source):
    """(axis, index spread to source's shape) for source's slices i written at index[i] along dim (index_copy,
    index_add_): source has input's shape with dim len(index) long."""
    d, shape, spread = _spread(op, input, dim, index)
    _check_tensor(source, "source", op)
    if list(source.shape) != shape:
        raise _cf.ShapeError("[%s] source must have shape %s (input %s with dim %d of len(index) = %d), got %s"
                             % (op, tuple(shape), tuple(input.shape), d, index.numel(), tuple(source.shape)))
    return d, spread


def index_copy(input: "_cf.Tensor", dim: int, index: "_cf.Tensor", source: "_cf.Tensor") -> "_cf.Tensor":
    """input with its slices index[i] along dim replaced by source's slices i (torch.index_copy): source has
    input's shape with dim len(index) long. Of repeated indices the last stays. Differentiable in input and
    source (an overwritten slice of input gets no gradient)."""
    op = "index_copy"
    d, spread = _slices(op, input, dim, index, source)
    return _named(op, _cf.scatter, input, d, spread, source)


def index_fill(input: "_cf.Tensor", dim: int, index: "_cf.Tensor", value: "_cf.Tensor | float") -> "_cf.Tensor":
    """input with its slices index[i] along dim set to value, a number or a 0-d tensor (torch.index_fill).
    Differentiable in input (and in a 0-d tensor value)."""
    op = "index_fill"
    return _named(op, _cf.scatter, input, *_filled_slices(op, input, dim, index, value))


def _filled_slices(op, input, dim, index, value):
    """(axis, index spread, value at the spread index's shape) for index_fill and index_fill_."""
    _check_tensor(input, "input", op)
    _check_tensor(index, "index", op)
    if index.dtype == _cf.int64 and input.dim() > 0:  # negative indices count from the end (torch.index_fill)
        index = _wrap_negative(index, input.shape[_axis(op, dim, input.dim())])
    d, shape, spread = _spread(op, input, dim, index)
    if isinstance(value, _cf.Tensor):
        if value.dim() != 0:
            raise _cf.ShapeError("[%s] value must be a number or a 0-d tensor, got shape %s" % (op, tuple(value.shape)))
        src = _cf.expand(_cf.to(value, input.dtype), shape)
    elif isinstance(value, _numbers.Number):
        src = _number_at(op, value, input, shape)
    else:
        raise TypeError("[%s] value must be a number or a 0-d tensor, got %s" % (op, type(value).__name__))
    return d, spread, src


def _flat_positions(op, input, indices):
    """The flat positions (int64) input[indices] reads, in the selection's shape: O(the selection) for index
    tensors, slices and ints (cf._key_positions); a boolean mask reads a grid of input's size."""
    _check_tensor(input, "input", op)
    if not isinstance(indices, (tuple, list)):
        raise TypeError("[%s] indices must be a tuple of index tensors, got %s" % (op, type(indices).__name__))
    key = tuple(indices)
    if len(key) == 1 and isinstance(key[0], _cf.Tensor) and key[0].dtype == _cf.bool:
        grid = _cf.reshape(_cf.arange(input.numel(), device=input.device), list(input.shape))
        return _named(op, grid.__getitem__, key[0])  # (a boolean mask as the whole key)
    return _cf._key_positions(input, key, op)


def _values_at(op, input, values, shape):
    """values (a tensor of input's dtype, or a number) broadcast to shape, flattened."""
    if not isinstance(values, _cf.Tensor):
        if not isinstance(values, _numbers.Number):
            raise TypeError("[%s] values must be a cf.Tensor or a number, got %s" % (op, type(values).__name__))
        values = _cf.full([], values, dtype=input.dtype, device=input.device)
    if values.dtype != input.dtype:
        raise _cf.DTypeError("[%s] values must have input's dtype %s, got %s" % (op, input.dtype.name, values.dtype.name))
    return _cf.reshape(_named(op, _cf.expand, values, list(shape)), [-1])


def index_put(input: "_cf.Tensor", indices: "tuple[_cf.Tensor, ...]", values: "_cf.Tensor | float",
              accumulate: bool = False) -> "_cf.Tensor":
    """input with values written at input[indices] (torch.index_put): indices a tuple of index tensors (or
    slices, ints, None: any key getitem takes), values broadcast to the selection. Of positions selected more
    than once the last written stays (NumPy's rule); accumulate=True adds every value instead (bools: OR). Differentiable
    in input and values."""
    op = "index_put"
    return _write_flat(op, input, *_put_at(op, input, indices, values), accumulate)


def _put_at(op, input, indices, values):
    """(the flat positions input[indices] selects, values broadcast to them, flat) for index_put and index_put_."""
    positions = _flat_positions(op, input, indices)
    return _cf.reshape(positions, [-1]), _values_at(op, input, values, positions.shape)


def _index_put_(self, indices: "tuple[_cf.Tensor, ...]", values: "_cf.Tensor | float",
                accumulate: bool = False) -> "_cf.Tensor":
    """In place: cf.index_put's writes into self (torch's Tensor.index_put_), in O(the selection) (accumulating
    into bool or a 16-bit float tensor: O(self) too); returns self."""
    op = "index_put_"
    return _write_flat_(op, self, *_put_at(op, self, indices, values), accumulate)


def _wrap_negative(index, n):
    """index (int64) with its entries in [-n, 0) counted from the end (+ n). One below -n stays negative, so the
    range error shows it as given."""
    return _cf.where(_cf.logical_and(index < 0, index >= -n), index + n, index)


def _write_flat(op, input, where, values, accumulate):
    """input seen flattened with values (flat) written at the positions where (flat int64): the last of repeated
    positions stays (scatter), or every value is added (index_add); in input's shape."""
    x = _cf.reshape(input, [-1])
    if accumulate and x.dtype == _cf.bool and values.dtype == _cf.bool:
        # adding bools is OR, as PyTorch's accumulate on bool: a position any true value reaches becomes true
        hits = _named(op, _cf.index_add, _cf.zeros([x.numel()], dtype=_cf.int64, device=x.device), 0, where,
                      _cf.to(values, _cf.int64))
        out = _cf.logical_or(x, hits > 0)
    elif accumulate:
        out = _named(op, _cf.index_add, x, 0, where, values)
    else:
        out = _named(op, _cf.scatter, x, 0, where, values)
    return _cf.reshape(out, list(input.shape))


def _write_flat_(op, input, where, values, accumulate):
    """In place: _write_flat's result written into input, in O(len(where)) (cf._write_flat_; accumulating into
    bfloat16 or float16 there sums in a float32 scratch of input's size, and into bool (OR) here through
    _write_flat and copy_: O(input) too)."""
    if accumulate and input.dtype == _cf.bool and values.dtype == _cf.bool:
        return input.copy_(_write_flat(op, input, where, values, accumulate))
    return _cf._write_flat_(input, where, values, accumulate, op)


def _flat_index(op, input, index):
    """index (int64, any shape) as positions into input flattened; negative ones count from the end."""
    _check_tensor(input, "input", op)
    _check_tensor(index, "index", op)
    if index.dtype != _cf.int64:
        raise _cf.DTypeError("[%s] index must be int64, got %s" % (op, index.dtype.name))
    return _wrap_negative(_cf.reshape(index, [-1]), input.numel())


def take(input: "_cf.Tensor", index: "_cf.Tensor") -> "_cf.Tensor":
    """input's elements at index, input seen flattened (torch.take): the result has index's shape; negative
    indices count from the end. Differentiable in input."""
    op = "take"
    where = _flat_index(op, input, index)
    return _cf.reshape(_named(op, _cf.index_select, _cf.reshape(input, [-1]), 0, where), list(index.shape))


def put(input: "_cf.Tensor", index: "_cf.Tensor", source: "_cf.Tensor", accumulate: bool = False) -> "_cf.Tensor":
    """input (seen flattened) with source's elements written at index (torch.Tensor.put): source has index's
    number of elements; negative indices count from the end; of repeated indices the last stays, or with
    accumulate=True every value is added (bools: OR, as PyTorch's). Differentiable in input and source."""
    op = "put"
    where = _flat_index(op, input, index)
    _check_source(op, input, index, source)
    return _write_flat(op, input, where, _cf.reshape(source, [-1]), accumulate)


def _check_source(op, input, index, source):
    _check_tensor(source, "source", op)
    if source.dtype != input.dtype:
        raise _cf.DTypeError("[%s] source must have input's dtype %s, got %s" % (op, input.dtype.name, source.dtype.name))
    if source.numel() != index.numel():
        raise _cf.ShapeError("[%s] source must have as many elements as index (%d), got %d"
                             % (op, index.numel(), source.numel()))


def _put_(self, index: "_cf.Tensor", source: "_cf.Tensor", accumulate: bool = False) -> "_cf.Tensor":
    """In place: cf.put's writes into self (torch's Tensor.put_), in O(len(index)) (accumulating into bool
    or a 16-bit float tensor: O(self) too); returns self."""
    op = "put_"
    where = _flat_index(op, self, index)
    _check_source(op, self, index, source)
    return _write_flat_(op, self, where, _cf.reshape(source, [-1]), accumulate)


def _index_add_(self, dim: int, index: "_cf.Tensor", source: "_cf.Tensor", *, alpha: float = 1) -> "_cf.Tensor":
    """In place: self.select(dim, index[i]) += alpha * source.select(dim, i) (torch's Tensor.index_add_);
    returns self."""
    op = "index_add_"
    if alpha != 1 and self.dtype not in _FLOATS and not float(alpha).is_integer():  # (inf, nan too)
        raise _cf.DTypeError("[%s] alpha %r on a %s tensor: an integer tensor takes an integer alpha"
                             % (op, alpha, self.dtype.name))
    if alpha != 1:  # (an integral alpha as an int: a float would make an integer source float32)
        source = _named(op, _cf.mul, source, alpha if self.dtype in _FLOATS else int(alpha))
    d, spread = _slices(op, self, dim, index, source)
    return _named(op, _cf.scatter_add_, self, d, spread, source)


def _index_copy_(self, dim: int, index: "_cf.Tensor", source: "_cf.Tensor") -> "_cf.Tensor":
    """In place: cf.index_copy's writes into self (torch's Tensor.index_copy_), in O(source); returns self."""
    op = "index_copy_"
    d, spread = _slices(op, self, dim, index, source)
    return _named(op, _cf.scatter_, self, d, spread, source)


def _index_fill_(self, dim: int, index: "_cf.Tensor", value: "_cf.Tensor | float") -> "_cf.Tensor":
    """In place: cf.index_fill's writes into self (torch's Tensor.index_fill_), in O(the slices); returns self."""
    op = "index_fill_"
    return _named(op, _cf.scatter_, self, *_filled_slices(op, self, dim, index, value))


def masked_scatter(input: "_cf.Tensor", mask: "_cf.Tensor", source: "_cf.Tensor") -> "_cf.Tensor":
    """input with source's first k elements (row-major) written, in order, at the k true positions of mask
    (bool, broadcast to input) (torch.masked_scatter). No host read: the k-th true position takes source's
    element k through a running count, and a source with fewer elements than true positions is an index error
    (on CUDA at the next host read). Differentiable in input and source."""
    op = "masked_scatter"
    _check_tensor(input, "input", op)
    _check_tensor(mask, "mask", op)
    _check_tensor(source, "source", op)
    if mask.dtype != _cf.bool:
        raise _cf.DTypeError("[%s] mask must be bool, got %s" % (op, mask.dtype.name))
    if source.dtype != input.dtype:
        raise _cf.DTypeError("[%s] source must have input's dtype %s, got %s"
                             % (op, input.dtype.name, source.dtype.name))
    shape = _broadcast_shape(input.shape, mask.shape, op)  # (input and mask broadcast together)
    input = _cf.expand(input, list(shape))
    m = _cf.expand(mask, list(shape))
    flat = _cf.reshape(m, [-1])
    if source.numel() == 0:  # nothing to take from: only an all-false mask fits (one host read, this case only)
        if input.numel() and bool(_cf.amax(_cf.to(flat, _cf.int64)) > 0):
            raise _cf.IndexError("[%s] mask has true positions but source has no elements" % op)
        return _cf.clone(input)
    count = _cf.cumsum(_cf.to(flat, _cf.int64), 0) - 1
    taken = _named(op, _cf.index_select, _cf.reshape(source, [-1]), 0, _cf.where(flat, count, 0))
    return _cf.where(m, _cf.reshape(taken, list(input.shape)), input)


def _masked_scatter_(self, mask: "_cf.Tensor", source: "_cf.Tensor") -> "_cf.Tensor":
    """In place: cf.masked_scatter written back (torch's Tensor.masked_scatter_); returns self."""
    return self.copy_(masked_scatter(self, mask, source))


# ---- more of PyTorch's tensor functions (lerp ... quantile), composed of cf's ops

def _need_float(op, name, x):
    _check_tensor(x, name, op)
    if x.dtype not in _FLOATS:
        raise _cf.DTypeError("[%s] %s must be a float tensor, got %s" % (op, name, x.dtype.name))


def _same_dtype(op, *tensors):
    if len({t.dtype for t in tensors}) > 1:
        raise _cf.DTypeError("[%s] the tensors must share one dtype, got %s"
                             % (op, ", ".join(t.dtype.name for t in tensors)))


def _axis(op, dim, ndim):
    """dim as an axis in [0, ndim) (a 0-d tensor takes 0 and -1, as PyTorch's)."""
    if not isinstance(dim, _numbers.Integral) or isinstance(dim, bool):
        raise TypeError("[%s] dim must be an int, got %r" % (op, dim))
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise _cf.IndexError("[%s] dim %d is out of range for a tensor of %d dimensions" % (op, dim, ndim))
    return dim + n if dim < 0 else dim


def _named(op, fn, *args):
    """fn(*args) with cf's errors (shapes, devices) named as op's."""
    try:
        return fn(*args)
    except _cf.Error as e:
        raise type(e)("[%s] %s" % (op, e)) from None


def _to_float(x):
    # PyTorch's rule for log2 & co.: an integer or bool tensor gives float32 (its default dtype)
    return x if x.dtype in _FLOATS else _cf.to(x, _cf.float32)


def lerp(input: "_cf.Tensor", end: "_cf.Tensor", weight: "_cf.Tensor | float") -> "_cf.Tensor":
    """input + weight * (end - input), broadcast (torch.lerp), with PyTorch's formula: for |weight| >= 0.5 it is
    end - (end - input) * (1 - weight), exact at weight 1. Float tensors of one dtype (weight too, when a
    tensor). Differentiable in all three."""
    op = "lerp"
    _need_float(op, "input", input)
    _check_tensor(end, "end", op)
    _same_dtype(op, input, end)
    if isinstance(weight, _cf.Tensor):
        _same_dtype(op, input, weight)

        def f():
            diff = end - input
            return _cf.where(_cf.abs(weight) < 0.5, input + weight * diff, end - diff * (1 - weight))
        return _named(op, f)
    if not isinstance(weight, _numbers.Real) or isinstance(weight, bool):
        raise TypeError("[%s] weight must be a number or a cf.Tensor, got %s" % (op, type(weight).__name__))
    w = float(weight)
    diff = _named(op, _cf.sub, end, input)
    return input + diff * w if abs(w) < 0.5 else end - diff * (1.0 - w)


def logical_xor(input: "_cf.Tensor", other: "_cf.Tensor") -> "_cf.Tensor":
    """Elementwise XOR of the truth of input and other (nonzero is true), broadcast; a bool tensor
    (torch.logical_xor)."""
    op = "logical_xor"
    _check_tensor(input, "input", op)
    _check_tensor(other, "other", op)
    a = input if input.dtype == _cf.bool else input != 0
    b = other if other.dtype == _cf.bool else other != 0
    return _named(op, _cf.ne, a, b)


_LN2 = 0.6931471805599453
_LN10 = 2.302585092994046


def _log_base(op, input, base, ln_base):
    """log(x) / ln(base), exact where x is an integer power of base (as PyTorch's log2 and log10, so floor() of it
    counts digits and bits right): the quotient rounded to the nearest integer k replaces it where base ** k == x
    (k's value, the quotient's gradient)."""
    _check_tensor(input, "input", op)
    x = _to_float(input)
    y = _cf.log(x) / ln_base
    yd = y.detach()  # (the correction is computed from detached values: no graph)
    finite = _cf.isfinite(yd)
    safe = _cf.where(finite, yd, _cf.zeros_like(yd))
    k = _cf.to(_cf.to(safe + _cf.sign(safe) * 0.5, _cf.int64), _cf.float64)  # (round half away from zero)
    exact = _cf.logical_and(finite, _cf.pow(_cf.full([], float(base), dtype=_cf.float64, device=x.device), k)
                            == _cf.to(x, _cf.float64))
    return y + _cf.where(exact, _cf.to(k, y.dtype) - yd, _cf.zeros_like(yd))


def log2(input: "_cf.Tensor") -> "_cf.Tensor":
    """Base-2 logarithm (torch.log2): log(x) / ln 2, exact at powers of 2; an integer tensor gives float32."""
    return _log_base("log2", input, 2, _LN2)


def log10(input: "_cf.Tensor") -> "_cf.Tensor":
    """Base-10 logarithm (torch.log10): log(x) / ln 10, exact at powers of 10; an integer tensor gives float32."""
    return _log_base("log10", input, 10, _LN10)


def exp2(input: "_cf.Tensor") -> "_cf.Tensor":
    """2 ** input (torch.exp2), as cf.pow of 2 (exact at integers); an integer tensor gives float32."""
    _check_tensor(input, "input", "exp2")
    x = _to_float(input)
    return _cf.pow(_cf.full([], 2.0, dtype=x.dtype, device=x.device), x)


def true_divide(input: "_cf.Tensor", other: "_cf.Tensor | float") -> "_cf.Tensor":
    """input / other, true division (torch.true_divide, = torch.div and cf.div without rounding_mode): integer
    tensors give float32."""
    op = "true_divide"
    _check_tensor(input, "input", op)
    if not isinstance(other, (_cf.Tensor, _numbers.Real)):
        raise TypeError("[%s] other must be a number or a cf.Tensor, got %s" % (op, type(other).__name__))
    return _named(op, lambda: input / other)


# ---------------------------------------------------------------- matrix products
def _mm(a, b):
    """a @ b for (..., n, k) and (..., k, m) of one dtype: cf.matmul for floats, int64 by a broadcast product
    summed over k (matmul is for floats)."""
    if a.dtype in _FLOATS:
        return _cf.matmul(a, b)
    return _cf.sum(_cf.unsqueeze(a, a.dim()) * _cf.unsqueeze(b, b.dim() - 2), [a.dim() - 1])


def _add_product(op, input, prod, beta, alpha):
    """beta * input + alpha * prod (PyTorch's addmm & co.): input broadcasts to prod's shape; with beta 0 input
    is not read (a NaN there stays out, as PyTorch's; its gradient then stays None where PyTorch's is zeros).
    Integer tensors take integer beta and alpha."""
    for name, v in (("beta", beta), ("alpha", alpha)):
        if not isinstance(v, _numbers.Real) or isinstance(v, bool) or \
                (prod.dtype not in _FLOATS and not isinstance(v, _numbers.Integral)):
            raise _cf.ValueError("[%s] %s must be a number (an integer for %s tensors), got %r"
                                 % (op, name, prod.dtype.name, v))
    shape = list(prod.shape)
    try:
        fits = _broadcast_shape(list(input.shape), shape, op) == shape
    except _cf.ShapeError:
        fits = False
    if not fits:
        raise _cf.ShapeError("[%s] input of shape %s does not broadcast to the product's shape %s"
                             % (op, tuple(input.shape), tuple(shape)))
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return prod + (input if beta == 1 else input * beta)


def _check_mats(op, input, mats, ndims):
    _check_tensor(input, "input", op)
    for (name, t), nd in zip(mats, ndims):
        _check_tensor(t, name, op)
        if t.dim() != nd:
            raise _cf.ShapeError("[%s] %s must be %d-d, got shape %s" % (op, name, nd, tuple(t.shape)))
    _same_dtype(op, input, *(t for _, t in mats))
    if input.dtype == _cf.bool:
        raise _cf.DTypeError("[%s] is not defined for bool tensors" % op)


def addmm(input: "_cf.Tensor", mat1: "_cf.Tensor", mat2: "_cf.Tensor", beta: float = 1,
          alpha: float = 1) -> "_cf.Tensor":
    """beta * input + alpha * (mat1 @ mat2) (torch.addmm): mat1 (n, k), mat2 (k, m), input broadcast to (n, m);
    one dtype (float, or int64 with integer beta and alpha). Differentiable."""
    op = "addmm"
    _check_mats(op, input, (("mat1", mat1), ("mat2", mat2)), (2, 2))
    if mat1.shape[1] != mat2.shape[0]:
        raise _cf.ShapeError("[%s] mat1 %s and mat2 %s cannot be multiplied"
                             % (op, tuple(mat1.shape), tuple(mat2.shape)))
    return _add_product(op, input, _mm(mat1, mat2), beta, alpha)


def baddbmm(input: "_cf.Tensor", batch1: "_cf.Tensor", batch2: "_cf.Tensor", beta: float = 1,
            alpha: float = 1) -> "_cf.Tensor":
    """beta * input + alpha * (batch1 @ batch2) (torch.baddbmm): batch1 (b, n, k), batch2 (b, k, m), input
    broadcast to (b, n, m); one dtype (float, or int64 with integer beta and alpha). Differentiable."""
    op = "baddbmm"
    _check_mats(op, input, (("batch1", batch1), ("batch2", batch2)), (3, 3))
    if batch1.shape[0] != batch2.shape[0] or batch1.shape[2] != batch2.shape[1]:
        raise _cf.ShapeError("[%s] batch1 %s and batch2 %s cannot be multiplied batch by batch"
                             % (op, tuple(batch1.shape), tuple(batch2.shape)))
    return _add_product(op, input, _mm(batch1, batch2), beta, alpha)


def addmv(input: "_cf.Tensor", mat: "_cf.Tensor", vec: "_cf.Tensor", beta: float = 1, alpha: float = 1) -> "_cf.Tensor":
    """beta * input + alpha * (mat @ vec) (torch.addmv): mat (n, m), vec (m,), input broadcast to (n,); one
    dtype (float, or int64 with integer beta and alpha). Differentiable."""
    op = "addmv"
    _check_mats(op, input, (("mat", mat), ("vec", vec)), (2, 1))
    if mat.shape[1] != vec.shape[0]:
        raise _cf.ShapeError("[%s] mat %s and vec %s cannot be multiplied" % (op, tuple(mat.shape), tuple(vec.shape)))
    prod = _cf.reshape(_mm(mat, _cf.reshape(vec, [vec.shape[0], 1])), [mat.shape[0]])
    return _add_product(op, input, prod, beta, alpha)


# ---------------------------------------------------------------- diagonals
def _diagonal(op, input, offset, dim1, dim2):
    if not isinstance(offset, _numbers.Integral) or isinstance(offset, bool):
        raise TypeError("[%s] the offset must be an int, got %r" % (op, offset))
    nd = input.dim()
    if nd < 2:
        raise _cf.ShapeError("[%s] needs at least 2 dimensions, got shape %s" % (op, tuple(input.shape)))
    d1, d2 = _axis(op, dim1, nd), _axis(op, dim2, nd)
    if d1 == d2:
        raise _cf.ValueError("[%s] dim1 and dim2 must differ, both are %d" % (op, d1))
    rest = [i for i in range(nd) if i not in (d1, d2)]
    n, m = input.shape[d1], input.shape[d2]
    if offset >= 0:
        length, start = max(0, min(n, m - offset)), offset
    else:
        length, start = max(0, min(n + offset, m)), -offset * m
    t = _cf.reshape(_cf.permute(input, rest + [d1, d2]), [input.shape[i] for i in rest] + [n * m])
    index = _cf.arange(length, device=input.device) * (m + 1) + start
    return _cf.index_select(t, t.dim() - 1, index)


def diagonal(input: "_cf.Tensor", offset: int = 0, dim1: int = 0, dim2: int = 1) -> "_cf.Tensor":
    """The diagonal of input over axes dim1 and dim2 (offset > 0 above it, < 0 below), as the last axis, the
    others kept in order (torch.diagonal). A copy, not a view as PyTorch's: writing to it leaves input as it
    is. Differentiable (an index_select)."""
    _check_tensor(input, "input", "diagonal")
    return _diagonal("diagonal", input, offset, dim1, dim2)


def diag(input: "_cf.Tensor", diagonal: int = 0) -> "_cf.Tensor":
    """torch.diag: a 1-d input gives the square matrix with it on diagonal `diagonal` (> 0 above the main one,
    < 0 below) and zeros elsewhere; a 2-d input gives that diagonal as a 1-d copy. Differentiable."""
    op = "diag"
    _check_tensor(input, "input", op)
    if input.dim() == 2:
        return _diagonal(op, input, diagonal, 0, 1)
    if input.dim() != 1:
        raise _cf.ShapeError("[%s] expects a 1-d or 2-d tensor, got shape %s" % (op, tuple(input.shape)))
    if not isinstance(diagonal, _numbers.Integral) or isinstance(diagonal, bool):
        raise TypeError("[%s] the offset must be an int, got %r" % (op, diagonal))
    n = input.shape[0]
    size = n + abs(diagonal)
    start = diagonal if diagonal >= 0 else -diagonal * size
    src = _cf.to(input, _cf.int64) if input.dtype == _cf.bool else input
    index = _cf.arange(n, device=input.device) * (size + 1) + start
    out = _cf.scatter_add(_cf.zeros([size * size], dtype=src.dtype, device=input.device), 0, index, src)
    out = _cf.reshape(out, [size, size])
    return out != 0 if input.dtype == _cf.bool else out


def trace(input: "_cf.Tensor") -> "_cf.Tensor":
    """The sum of the main diagonal of a 2-d tensor (torch.trace), 0-d; integers sum as int64."""
    op = "trace"
    _check_tensor(input, "input", op)
    if input.dim() != 2:
        raise _cf.ShapeError("[%s] expects a 2-d tensor, got shape %s" % (op, tuple(input.shape)))
    return _cf.sum(_diagonal(op, input, 0, 0, 1))


def meshgrid(*tensors: "_cf.Tensor", indexing: str = "ij") -> "tuple[_cf.Tensor, ...]":
    """Coordinate grids from 1-d (or 0-d) tensors (torch.meshgrid): with indexing "ij" output i has shape
    (n1, n2, ...) and varies along axis i; "xy" swaps the first two axes (NumPy's and MATLAB's convention).
    The tensors may also come as one list. Broadcast views (cf.expand), differentiable."""
    op = "meshgrid"
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not tensors:
        raise _cf.ValueError("[%s] needs at least one tensor" % op)
    if indexing not in ("ij", "xy"):
        raise _cf.ValueError("[%s] indexing must be 'ij' or 'xy', got %r" % (op, indexing))
    for t in tensors:
        _check_tensor(t, "each input", op)
        if t.dim() > 1:
            raise _cf.ShapeError("[%s] expects 0-d or 1-d tensors, got shape %s" % (op, tuple(t.shape)))
    _same_dtype(op, *tensors)
    sizes = [t.numel() for t in tensors]
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        axes[0], axes[1] = 1, 0
    shape = [0] * len(tensors)
    for i, a in enumerate(axes):
        shape[a] = sizes[i]
    out = []
    for t, a in zip(tensors, axes):
        view = [1] * len(tensors)
        view[a] = t.numel()
        out.append(_cf.expand(_cf.reshape(t, view), shape))
    return tuple(out)


# ---------------------------------------------------------------- distances and products
def cdist(x1: "_cf.Tensor", x2: "_cf.Tensor", p: float = 2.0,
          compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> "_cf.Tensor":
    """The p-norm distances between the rows of x1 (..., P, M) and of x2 (..., R, M), batch axes broadcast: a
    (..., P, R) tensor (torch.cdist). p is 0 (the count of differing coordinates), 1, 2, inf or any p > 0.
    Computed from the differences of every pair (memory P * R * M per batch; compute_mode is accepted and
    ignored: never the matmul expansion), so identical points are exactly 0 apart, with gradient 0 there as
    PyTorch's. Differentiable (p = 0 is not)."""
    op = "cdist"
    _need_float(op, "x1", x1)
    _need_float(op, "x2", x2)
    _same_dtype(op, x1, x2)
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        raise _cf.ShapeError("[%s] expects x1 (..., P, M) and x2 (..., R, M) of one M, got %s and %s"
                             % (op, tuple(x1.shape), tuple(x2.shape)))
    if not isinstance(p, _numbers.Real) or isinstance(p, bool) or not p >= 0:
        raise _cf.ValueError("[%s] p must be a number >= 0, got %r" % (op, p))
    diff = _named(op, _cf.sub, _cf.unsqueeze(x1, x1.dim() - 1), _cf.unsqueeze(x2, x2.dim() - 2))  # (..., P, R, M)
    last = diff.dim() - 1
    if p == 0:  # (a NaN coordinate makes the count NaN, as PyTorch's)
        count = _cf.to(_cf.sum(diff != 0, [last]), x1.dtype)
        return _cf.where(_cf.sum(_cf.isnan(diff), [last]) > 0, _cf.full([], float("nan"), dtype=x1.dtype,
                                                                     device=x1.device), count)
    if p == 1:
        return _cf.sum(_cf.abs(diff), [last])
    if p == float("inf"):
        if diff.shape[last] == 0:
            return _cf.sum(diff, [last])
        return _cf.amax(_cf.abs(diff), [last])
    if p == 2:
        s = _cf.sum(diff * diff, [last])
    else:  # |d| ** p with 0 ** p kept off the graph (its derivative is infinite for p < 1)
        ad = _cf.abs(diff)
        nz = ad != 0
        s = _cf.sum(_cf.where(nz, _cf.pow(_cf.where(nz, ad, 1.0), float(p)), 0.0), [last])
    pos = s != 0  # the root only of positive sums: a zero distance has gradient 0 (as PyTorch's), not NaN
    root = _cf.sqrt(_cf.where(pos, s, 1.0)) if p == 2 else _cf.pow(_cf.where(pos, s, 1.0), 1.0 / float(p))
    return _cf.where(pos, root, 0.0)


def _dim_list(op, dims, nd):
    if isinstance(dims, _numbers.Integral) and not isinstance(dims, bool):
        dims = [dims]
    try:
        out = [_axis(op, int(d), nd) for d in dims]
    except TypeError:
        raise TypeError("[%s] dims must be an int or a pair of int lists, got %r" % (op, dims)) from None
    if len(set(out)) != len(out):
        raise _cf.ValueError("[%s] an axis is contracted twice: %r" % (op, dims))
    return out


def tensordot(a: "_cf.Tensor", b: "_cf.Tensor",
              dims: "int | tuple[list[int], list[int]] | list[list[int]]" = 2) -> "_cf.Tensor":
    """The sum over paired axes of a and b of their product (torch.tensordot): dims=d pairs a's last d axes with
    b's first d; dims=([a axes], [b axes]) pairs them explicitly. The result has a's free axes then b's. One
    dtype (float: one matmul; int64: a broadcast product). Differentiable."""
    op = "tensordot"
    _check_tensor(a, "a", op)
    _check_tensor(b, "b", op)
    _same_dtype(op, a, b)
    if a.dtype == _cf.bool:
        raise _cf.DTypeError("[%s] is not defined for bool tensors" % op)
    if isinstance(dims, _numbers.Integral) and not isinstance(dims, bool):
        if not 0 <= dims <= min(a.dim(), b.dim()):
            raise _cf.ValueError("[%s] dims=%d must be between 0 and %d (the fewer axes of a %s and b %s)"
                                 % (op, dims, min(a.dim(), b.dim()), tuple(a.shape), tuple(b.shape)))
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da, db = _dim_list(op, dims[0], a.dim()), _dim_list(op, dims[1], b.dim())
        if len(da) != len(db):
            raise _cf.ValueError("[%s] dims pairs %d axes of a with %d of b" % (op, len(da), len(db)))
    else:
        raise TypeError("[%s] dims must be an int or a pair of int lists, got %r" % (op, dims))
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise _cf.ShapeError("[%s] axis %d of a %s (size %d) and axis %d of b %s (size %d) differ"
                                 % (op, i, tuple(a.shape), a.shape[i], j, tuple(b.shape), b.shape[j]))
    fa = [i for i in range(a.dim()) if i not in da]
    fb = [j for j in range(b.dim()) if j not in db]
    k = _prod(a.shape[i] for i in da)
    a2 = _cf.reshape(_cf.permute(a, fa + da), [_prod(a.shape[i] for i in fa), k])
    b2 = _cf.reshape(_cf.permute(b, db + fb), [k, _prod(b.shape[j] for j in fb)])
    return _cf.reshape(_mm(a2, b2), [a.shape[i] for i in fa] + [b.shape[j] for j in fb])


def _prod(values):
    p = 1
    for v in values:
        p *= v
    return p


def inner(input: "_cf.Tensor", other: "_cf.Tensor") -> "_cf.Tensor":
    """The sum over the last axes of input and other of their product (torch.inner): shape input.shape[:-1] +
    other.shape[:-1]; a 0-d operand multiplies. Differentiable."""
    op = "inner"
    _check_tensor(input, "input", op)
    _check_tensor(other, "other", op)
    if input.dim() == 0 or other.dim() == 0:
        _same_dtype(op, input, other)
        return _named(op, _cf.mul, input, other)
    if input.shape[-1] != other.shape[-1]:
        raise _cf.ShapeError("[%s] the last axes of %s and %s differ" % (op, tuple(input.shape), tuple(other.shape)))
    return tensordot(input, other, ([input.dim() - 1], [other.dim() - 1]))


def kron(input: "_cf.Tensor", other: "_cf.Tensor") -> "_cf.Tensor":
    """The Kronecker product (torch.kron): the block tensor of input[i] * other, shape the products of the sizes
    (the fewer axes padded with leading 1s). One dtype; differentiable."""
    op = "kron"
    _check_tensor(input, "input", op)
    _check_tensor(other, "other", op)
    _same_dtype(op, input, other)
    nd = max(input.dim(), other.dim())
    sa = [1] * (nd - input.dim()) + list(input.shape)
    sb = [1] * (nd - other.dim()) + list(other.shape)
    va, vb = [], []
    for x, y in zip(sa, sb):
        va += [x, 1]
        vb += [1, y]
    a, b = _cf.reshape(input, va), _cf.reshape(other, vb)
    # (bool x bool is their logical and, as PyTorch's kron; cf's mul takes no bool)
    prod = _named(op, _cf.logical_and if input.dtype == _cf.bool and other.dtype == _cf.bool else _cf.mul, a, b)
    return _cf.reshape(prod, [x * y for x, y in zip(sa, sb)])


# ---------------------------------------------------------------- sort-based statistics
def unique(input: "_cf.Tensor", sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,
           dim: "int | None" = None) -> "_cf.Tensor | tuple[_cf.Tensor, ...]":
    """The distinct values of input, flattened, in ascending order (torch.unique with dim=None; sorted=False
    gives them sorted too, which PyTorch allows); with return_inverse also each element's position among them
    (input's shape), with return_counts how often each occurs, returned as (values[, inverse][, counts]). A
    sort and one host read of the count of values (a device synchronisation on a GPU, as PyTorch's). Each NaN
    is a value of its own, sorted last. Not differentiable. With dim, the distinct slices along dim in
    lexicographic order (torch.unique(dim=)): inverse and counts are per slice; a slice holding a NaN is one of
    its own."""
    op = "unique"
    _check_tensor(input, "input", op)
    if dim is not None:
        return _unique_slices(op, input, dim, return_inverse, return_counts)
    x = _cf.reshape(input.detach(), [-1])
    if x.dtype == _cf.bool:
        x = _cf.to(x, _cf.int64)
    n = x.shape[0]
    dev = input.device
    if n == 0:
        values = _cf.zeros([0], dtype=x.dtype, device=dev)
        inverse = _cf.zeros(list(input.shape), dtype=_cf.int64, device=dev)
        counts = _cf.zeros([0], dtype=_cf.int64, device=dev)
    else:
        s, perm = _cf.sort(x)
        first = _cf.cat([_cf.full([1], True, dtype=_cf.bool, device=dev),
                         _cf.narrow(s, 0, 1, n - 1) != _cf.narrow(s, 0, 0, n - 1)])  # (NaN != NaN: each its own)
        values = s[first]  # the host read
        group = _cf.cumsum(first, 0) - 1  # each sorted element's value
        inverse = _cf.reshape(_cf.scatter_add(_cf.zeros([n], dtype=_cf.int64, device=dev), 0, perm, group),
                              list(input.shape))
        counts = _cf.scatter_add(_cf.zeros([values.shape[0]], dtype=_cf.int64, device=dev), 0, group,
                                 _cf.ones([n], dtype=_cf.int64, device=dev))
    if input.dtype == _cf.bool:
        values = values != 0
    if not return_inverse and not return_counts:
        return values
    return (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())


def _unique_slices(op, input, dim, return_inverse, return_counts):
    """unique(dim=d): the slices along d as rows (n, m), sorted lexicographically by m stable sorts from the last
    column to the first (m sorts of n keys: O(m n log n)), a row starting a group where it differs from the one
    before (one host read: the count)."""
    if isinstance(dim, bool):
        raise TypeError("[%s] dim must be an int, got %r" % (op, dim))
    try:
        dim = _operator.index(dim)  # (NumPy ints too)
    except TypeError:
        raise TypeError("[%s] dim must be an int, got %r" % (op, dim)) from None
    if input.dim() == 0:
        raise _cf.IndexError("[%s] dim= needs a tensor with at least one dimension, got a 0-d tensor" % op)
    if not -input.dim() <= dim < input.dim():
        raise _cf.IndexError("[%s] dim %r is out of range for a tensor of %d dims" % (op, dim, input.dim()))
    d = dim % input.dim()
    shape = list(input.shape)
    if any(s == 0 for a, s in enumerate(shape) if a != d):
        raise _cf.ShapeError("[%s] the axes other than dim %d must not be empty (as PyTorch), got shape %s"
                             % (op, d, tuple(shape)))
    dev = input.device
    # the slices' elements in the order of input.transpose(dim, 0), as torch's unique_dim compares them (for
    # dim >= 2 of a 3-d tensor or more that order, not moveaxis's, decides which distinct slice comes first)
    to_front = list(range(input.dim()))
    to_front[0], to_front[d] = d, 0
    back = to_front  # (a swap undoes itself)
    moved = _cf.permute(input.detach(), to_front)
    n = shape[d]
    m = 1
    for s in moved.shape[1:]:
        m *= s
    rows = _cf.reshape(_cf.contiguous(moved), [n, m])
    keys = _cf.to(rows, _cf.int64) if rows.dtype == _cf.bool else rows
    order = _cf.arange(n, device=dev)
    for c in range(keys.shape[1] - 1, -1, -1):  # least significant column first: stable sorts keep the rest
        order = _cf.index_select(order, 0, _cf.argsort(_cf.index_select(keys[:, c], 0, order)))
    srt = _cf.index_select(keys, 0, order)
    if n > 0:
        differs = _cf.sum(_cf.narrow(srt, 0, 1, n - 1) != _cf.narrow(srt, 0, 0, n - 1), [1]) > 0  # (NaN != NaN)
        first = _cf.cat([_cf.full([1], True, dtype=_cf.bool, device=dev), differs])
    else:
        first = _cf.zeros([0], dtype=_cf.bool, device=dev)
    starts = _cf.arange(n, device=dev)[first]  # the groups' first rows (the host read)
    k = starts.shape[0]
    picked = _cf.index_select(_cf.index_select(rows, 0, order), 0, starts)  # (k, m) in input's dtype
    values = _cf.permute(_cf.reshape(picked, [k] + list(moved.shape[1:])), back)
    if not return_inverse and not return_counts:
        return values
    group = _cf.cumsum(_cf.to(first, _cf.int64), 0) - 1
    inverse = _cf.scatter_add(_cf.zeros([n], dtype=_cf.int64, device=dev), 0, order, group)
    counts = _cf.scatter_add(_cf.zeros([k], dtype=_cf.int64, device=dev), 0, group,
                             _cf.ones([n], dtype=_cf.int64, device=dev))
    return (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())


def _sorted_pick(op, input, dim, keepdim, k_of, nan_first):
    """cf.ValuesIndices of the element at sorted position k_of(n) along dim (NaN sorts last; with nan_first a
    row holding NaN gives its first NaN instead): the values taken from input by those indices, so the gradient
    goes to the picked element. On ties the index is that of the tied element at the picked sorted position (cf.sort is stable)."""
    _check_tensor(input, "input", op)
    if input.dtype == _cf.bool:
        raise _cf.DTypeError("[%s] is not defined for bool tensors" % op)
    d = _axis(op, dim, input.dim())
    x = input if input.dim() else _cf.reshape(input, [1])
    n = x.shape[d]
    if n == 0:
        raise _cf.IndexError("[%s] cannot pick from an empty dimension (dim %d of shape %s)"
                             % (op, d, tuple(input.shape)))
    order = _cf.sort(x.detach(), d)[1]
    pos = _cf.full([1 if i == d else s for i, s in enumerate(x.shape)], k_of(n), dtype=_cf.int64, device=x.device)
    if nan_first and x.dtype in _FLOATS:
        nans = _cf.sum(_cf.isnan(x.detach()), [d], keepdim=True)
        pos = _cf.where(nans > 0, n - nans, pos)  # the first NaN, sorted last
    index = _cf.take_along_dim(order, pos, d)
    values = _cf.take_along_dim(x, index, d)
    if not keepdim or input.dim() == 0:
        shape = list(input.shape) if input.dim() == 0 else [s for i, s in enumerate(x.shape) if i != d]
        values, index = _cf.reshape(values, shape), _cf.reshape(index, shape)
    return _cf.ValuesIndices(values, index)


def median(input: "_cf.Tensor", dim: "int | None" = None,
           keepdim: bool = False) -> "_cf.Tensor | tuple[_cf.Tensor, _cf.Tensor]":
    """The lower median (the element at sorted position (n - 1) // 2; torch.median): of all elements (0-d; NaN
    if any is NaN, NaN for an empty float tensor; the gradient shared evenly by the elements equal to it, as
    PyTorch's, none for an infinite or NaN median), or along dim as cf.ValuesIndices (values, indices) (a row
    holding NaN gives its first NaN; on ties the index is that of the tied element at the middle sorted position (cf.sort is stable), which PyTorch does not
    promise; the gradient goes to that element). Computed by a sort."""
    op = "median"
    _check_tensor(input, "input", op)
    half = lambda n: (n - 1) // 2  # noqa: E731
    if dim is not None:
        return _sorted_pick(op, input, dim, keepdim, half, True)
    if input.dtype == _cf.bool:
        raise _cf.DTypeError("[%s] is not defined for bool tensors" % op)
    if input.numel() == 0:
        if input.dtype not in _FLOATS:
            raise _cf.ValueError("[%s] an empty %s tensor has no median" % (op, input.dtype.name))
        return _cf.full([], float("nan"), dtype=input.dtype, device=input.device)
    x = _cf.reshape(input, [-1])
    xd = x.detach()
    med = _sorted_pick(op, xd, 0, False, half, True)[0]
    if input.dtype not in _FLOATS or not (input.requires_grad and _cf.grad_enabled()):
        return med
    # PyTorch's gradient: shared evenly by the elements equal to the median. med minus a sum of exact zeros
    # (x.detach() - x at those elements, the finite ones) carries it and keeps med's value (and sign of 0)
    equal = xd == med
    count = _cf.to(_cf.maximum(_cf.sum(equal), _cf.ones([], dtype=_cf.int64, device=x.device)), x.dtype)
    mask = _cf.logical_and(equal, _cf.isfinite(xd))
    return med - _cf.sum(_cf.where(mask, xd - x, 0.0)) / count


def kthvalue(input: "_cf.Tensor", k: int, dim: int = -1,
             keepdim: bool = False) -> "tuple[_cf.Tensor, _cf.Tensor]":
    """The k-th smallest element (k from 1) along dim as cf.ValuesIndices (values, indices)
    (torch.kthvalue): NaN sorts last; on ties the index is that of the tied element at the k-th sorted position (cf.sort is stable). Computed by a sort; the
    gradient goes to the picked element."""
    op = "kthvalue"
    _check_tensor(input, "input", op)
    if not isinstance(k, _numbers.Integral) or isinstance(k, bool):
        raise TypeError("[%s] k must be an int, got %r" % (op, k))
    d = _axis(op, dim, input.dim())
    n = input.shape[d] if input.dim() else 1
    if not 1 <= k <= n:
        raise _cf.IndexError("[%s] k=%d is out of range for a dimension of size %d" % (op, k, n))
    return _sorted_pick(op, input, dim, keepdim, lambda n: k - 1, False)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile(input: "_cf.Tensor", q: "_cf.Tensor | float", dim: "int | None" = None, keepdim: bool = False,
             interpolation: str = "linear") -> "_cf.Tensor":
    """The q-th quantiles of input (torch.quantile), of all elements (dim None) or along dim: q a number or a
    0-d or 1-d tensor in [0, 1] (a 1-d q puts its axis first in the result). Between sorted neighbours at rank
    q * (n - 1): interpolation "linear", "lower", "higher", "midpoint" or "nearest" (ties to even), as PyTorch's.
    A row holding NaN gives NaN. Float32/float64 input; a tensor q is checked with one host read of its range.
    Computed by a sort; differentiable in input (the gradient goes to the one or two picked elements)."""
    op = "quantile"
    _check_tensor(input, "input", op)
    if input.dtype not in (_cf.float32, _cf.float64):
        raise _cf.DTypeError("[%s] input must be float32 or float64, got %s" % (op, input.dtype.name))
    if interpolation not in _INTERPOLATIONS:
        raise _cf.ValueError("[%s] interpolation must be one of %s, got %r"
                             % (op, ", ".join(repr(i) for i in _INTERPOLATIONS), interpolation))
    scalar_q = not isinstance(q, _cf.Tensor) or q.dim() == 0
    if isinstance(q, _cf.Tensor):
        if q.dim() > 1 or q.dtype not in _FLOATS:
            raise _cf.ValueError("[%s] q must be a number or a 0-d or 1-d float tensor, got %s of shape %s"
                                 % (op, q.dtype.name, tuple(q.shape)))
        qs = _cf.to(_cf.reshape(q.detach(), [-1]), input.dtype).to(input.device)
        lo_hi = [0.0, 0.0]
        if qs.numel():  # one host read: the range of q and its count of NaN
            lo, hi, nans = _cf.stack([_cf.amin(qs), _cf.amax(qs), _cf.to(_cf.sum(_cf.isnan(qs)), qs.dtype)]).tolist()
            lo_hi = [lo, hi] if nans == 0 else [float("nan")] * 2
    elif isinstance(q, _numbers.Real) and not isinstance(q, bool):
        qs = _cf.full([1], float(q), dtype=input.dtype, device=input.device)
        lo_hi = [float(q)] * 2
    else:
        raise TypeError("[%s] q must be a number or a cf.Tensor, got %s" % (op, type(q).__name__))
    if not (0 <= lo_hi[0] and lo_hi[1] <= 1):
        raise _cf.ValueError("[%s] q must be in [0, 1], got %r" % (op, q if not isinstance(q, _cf.Tensor) else lo_hi))
    if dim is None:
        x, d = _cf.reshape(input, [-1]), 0
    else:
        d = _axis(op, dim, input.dim())
        x = input if input.dim() else _cf.reshape(input, [1])
    n = x.shape[d]
    if n == 0:
        raise _cf.ValueError("[%s] input must be non-empty along the reduced axes, got shape %s"
                             % (op, tuple(input.shape)))
    others = [i for i in range(x.dim()) if i != d]
    xl = _cf.permute(x, others + [d])  # (..., n)
    lead = [x.shape[i] for i in others]
    order = _cf.sort(xl.detach(), xl.dim() - 1)[1]
    nq = qs.shape[0]
    rank = _cf.expand(qs * (n - 1), lead + [nq])  # in input's dtype, as PyTorch's
    has_nan = _cf.sum(_cf.isnan(xl.detach()), [xl.dim() - 1], keepdim=True) > 0
    rank = _cf.where(~has_nan, rank, float(n - 1))  # a NaN row: its last sorted element, a NaN
    below = _cf.to(rank, _cf.int64)  # (rank >= 0: truncation is floor)
    frac = rank - _cf.to(below, rank.dtype)
    above = below + _cf.to(frac > 0, _cf.int64)

    def pick(pos):
        return _cf.take_along_dim(xl, _cf.take_along_dim(order, pos, xl.dim() - 1), xl.dim() - 1)
    if interpolation == "lower":
        out = pick(below)
    elif interpolation == "higher":
        out = pick(above)
    elif interpolation == "nearest":  # round half to even (torch.round)
        half = _cf.to(below, rank.dtype) * 0.5
        odd = half != _cf.to(_cf.to(half, _cf.int64), rank.dtype)
        up = _cf.logical_or(frac > 0.5, _cf.logical_and(frac == 0.5, odd))
        out = pick(below + _cf.to(up, _cf.int64))
    else:
        out = lerp(pick(below), pick(above), 0.5 if interpolation == "midpoint" else frac)
    # (..., nq) -> (nq, ...), keepdim's axes, a number's axis dropped
    out = _cf.permute(out, [out.dim() - 1] + list(range(out.dim() - 1)))
    if keepdim:
        kept = [1] * input.dim() if dim is None else \
            [1 if i == d else s for i, s in enumerate(input.shape)]
        out = _cf.reshape(out, [nq] + kept)
    elif dim is not None and input.dim() == 0:
        out = _cf.reshape(out, [nq])
    return _cf.reshape(out, list(out.shape)[1:]) if scalar_q else out


for _n, _f in (("stride", _stride), ("element_size", _element_size), ("new_tensor", _new_tensor), ("where", _where),
               ("scatter_add_", _scatter_add_), ("scatter_", _scatter_), ("index_copy", index_copy),
               ("index_copy_", _index_copy_), ("index_fill", index_fill), ("index_fill_", _index_fill_),
               ("index_put", index_put), ("index_put_", _index_put_), ("take", take), ("put", put), ("put_", _put_),
               ("index_add_", _index_add_), ("masked_scatter", masked_scatter),
               ("masked_scatter_", _masked_scatter_), ("masked_select", masked_select), ("nonzero", nonzero),
               ("repeat_interleave", repeat_interleave), ("bincount", bincount), ("outer", outer), ("dot", dot),
               ("isclose", isclose), ("count_nonzero", count_nonzero), ("broadcast_to", broadcast_to),
               ("lerp", lerp), ("logical_xor", logical_xor), ("log2", log2), ("log10", log10), ("exp2", exp2),
               ("true_divide", true_divide), ("addmm", addmm), ("baddbmm", baddbmm), ("addmv", addmv),
               ("diag", diag), ("diagonal", diagonal), ("trace", trace), ("inner", inner), ("kron", kron),
               ("unique", unique), ("median", median), ("kthvalue", kthvalue), ("quantile", quantile)):
    setattr(_cf.Tensor, _n, _f)
_cf.Tensor.clip = _cf.Tensor.clamp  # torch's aliases
_cf.Tensor.clip_ = _cf.Tensor.clamp_
clip = _cf.clamp
