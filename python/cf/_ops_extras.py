"""Functions written in Python over cf's ops, with PyTorch's names: einsum, multinomial, from_numpy, and the
in-place initialisers Tensor.normal_ and uniform_. Each composes cf's differentiable ops, so it runs on
any device and autograd sees it as those ops."""
import numbers as _numbers
import string as _string

from . import _cf

__all__ = ["einsum", "multinomial", "from_numpy"]

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
