"""Functions written in Python over cf's ops, with PyTorch's names: einsum, multinomial, from_numpy, and the
in-place initialisers Tensor.normal_ and uniform_. Each composes cf's differentiable ops, so it runs on
any device and autograd sees it as those ops."""
import numbers as _numbers
import string as _string

from . import _cf
from ._functional import _broadcast_shape

__all__ = ["einsum", "multinomial", "from_numpy", "is_tensor", "numel", "as_tensor", "empty_like", "randn_like",
           "rand_like", "broadcast_to", "isclose", "count_nonzero", "outer", "dot", "masked_select", "nonzero",
           "bincount", "repeat_interleave", "clip"]

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
        b = _cf.full([], float(b), dtype=_cf.float64, device=a.device)
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
    if x.dim() == 0:
        mask = mask.reshape([1])
    flat = mask.reshape([-1])
    coords = []
    for axis, size in enumerate(mask.shape):
        shape = [1] * mask.dim()
        shape[axis] = size
        grid = _cf.expand(_cf.arange(size, device=x.device).reshape(shape), list(mask.shape))
        coords.append(grid.reshape([-1])[flat])
    if x.dim() == 0:
        coords = []
    if as_tuple:
        return tuple(coords) if coords else (_cf.zeros([int(flat.sum())], dtype=_cf.int64, device=x.device),)
    if not coords:
        return _cf.zeros([int(flat.sum()), 0], dtype=_cf.int64, device=x.device)
    return _cf.stack(coords, 1)


nonzero._stub_overloads = [  # (the stub's method form: as_tuple picks the return type)
    ("self, as_tuple: typing.Literal[False] = False", "cf._cf.Tensor"),
    ("self, as_tuple: typing.Literal[True]", "builtins.tuple[cf._cf.Tensor, ...]")]


def bincount(x: "_cf.Tensor", weights: "_cf.Tensor | None" = None, minlength: int = 0) -> "_cf.Tensor":
    """Counts of each value of a 1-d non-negative int64 tensor (torch.bincount): length max(x) + 1 (at least
    minlength); with weights (x's length) their sums per value instead, in weights' dtype. max(x) is read back."""
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
        src, dtype = weights, weights.dtype
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
    Tensor.new_tensor)."""
    return _cf.tensor(data, dtype=self.dtype if dtype is None else dtype,
                      device=self.device if device is None else device, requires_grad=requires_grad)


def _where(self, condition: "_cf.Tensor", other: "_cf.Tensor | float") -> "_cf.Tensor":
    """cf.where(condition, self, other) (torch's Tensor.where)."""
    return _cf.where(condition, self, other)


def _scatter_add_(self, dim: int, index: "_cf.Tensor", src: "_cf.Tensor") -> "_cf.Tensor":
    """In place: self[..., index[i], ...] += src[i] along dim (cf.scatter_add written back through copy_, cf's
    in-place rule); returns self."""
    return self.copy_(_cf.scatter_add(self, dim, index, src))


for _n, _f in (("stride", _stride), ("element_size", _element_size), ("new_tensor", _new_tensor), ("where", _where),
               ("scatter_add_", _scatter_add_), ("masked_select", masked_select), ("nonzero", nonzero),
               ("repeat_interleave", repeat_interleave), ("bincount", bincount), ("outer", outer), ("dot", dot),
               ("isclose", isclose), ("count_nonzero", count_nonzero), ("broadcast_to", broadcast_to)):
    setattr(_cf.Tensor, _n, _f)
_cf.Tensor.clip = _cf.Tensor.clamp  # torch's aliases
_cf.Tensor.clip_ = _cf.Tensor.clamp_
clip = _cf.clamp
