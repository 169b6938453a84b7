"""cf.nn.functional: torch.nn.functional's names and signatures over cf's ops, so that a
PyTorch model ported to cf keeps its `F.` calls (`import cf.nn.functional as F`).

Each function is cf's registry ops composed (autograd through them, CPU and CUDA alike);
where cf has the op itself (cf.softmax, cf.layer_norm, cf.nn.cross_entropy, cf.flash_attention)
the function calls it. Differences from PyTorch are said in each docstring; the common ones:
`inplace=True` is refused (cf's in-place ops refuse tensors that require grad), and softmax over a
row with every entry masked gives zeros where PyTorch gives NaN (cf's documented rule).
"""
import math as _math
import numbers as _numbers
import operator as _operator

from . import _cf

__all__ = ["relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "softplus", "elu", "logsigmoid", "hardtanh",
           "mish", "glu", "softmax", "log_softmax", "dropout", "linear", "layer_norm", "embedding", "one_hot", "pad",
           "normalize", "cosine_similarity", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
           "huber_loss", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "scaled_dot_product_attention"]

_REDUCTIONS = ("mean", "sum", "none")


def _no_inplace(inplace, op):
    if inplace:
        raise _cf.ValueError("[%s] inplace=True is not supported: cf's in-place ops refuse tensors that take part "
                             "in autograd; use the result (x = F.%s(x))" % (op, op))


def _reduce(loss, reduction, op):
    if reduction not in _REDUCTIONS:
        raise _cf.ValueError("[%s] reduction must be 'mean', 'sum' or 'none', got %r" % (op, reduction))
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _check_tensor(x, what, op):
    if not isinstance(x, _cf.Tensor):
        raise TypeError("[%s] %s must be a cf.Tensor, got %s" % (op, what, type(x).__name__))


def _real(x, what, op):
    """float(x), refusing a complex number as the bindings' float parameters do: float() of a NumPy complex scalar
    keeps its real part with only a ComplexWarning."""
    if isinstance(x, complex) or (isinstance(x, _numbers.Complex) and not isinstance(x, _numbers.Real)):
        raise TypeError("[%s] %s must be a real number (cf has no complex dtype), got %r" % (op, what, x))
    return float(x)


def relu(input, inplace=False):
    """max(x, 0)."""
    _no_inplace(inplace, "relu")
    return _cf.relu(input)


def gelu(input, approximate="none"):
    """GELU: exact (erf) form, or approximate="tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    if approximate == "none":
        return _cf.gelu(input)
    if approximate != "tanh":
        raise _cf.ValueError("[gelu] approximate must be 'none' or 'tanh', got %r" % (approximate,))
    inner = (input + input * input * input * 0.044715) * _math.sqrt(2.0 / _math.pi)
    return input * (_cf.tanh(inner) + 1.0) * 0.5


def silu(input, inplace=False):
    """x sigmoid(x) (swish)."""
    _no_inplace(inplace, "silu")
    return input * _cf.sigmoid(input)


def sigmoid(input):
    """1 / (1 + exp(-x))."""
    return _cf.sigmoid(input)


def tanh(input):
    """tanh(x)."""
    return _cf.tanh(input)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """x where x > 0, negative_slope x elsewhere."""
    _no_inplace(inplace, "leaky_relu")
    return _cf.leaky_relu(input, negative_slope)


def _log1p_exp(x):
    """log(1 + exp(x)) without overflow, as max(x, 0) + log1p(exp(-|x|)), with the gradient sigmoid(x) at every x:
    both pieces split at one comparison, so x = 0 gets 1/2 (relu's and abs's zero gradients there gave 0)."""
    pos = x > 0
    return _cf.where(pos, x, 0.0) + _cf.log1p(_cf.exp(_cf.where(pos, -x, x)))


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch, for overflow)."""
    if beta <= 0:
        raise _cf.ValueError("[softplus] beta must be > 0, got %r" % (beta,))
    bx = input * beta
    # the threshold keeps PyTorch's values above it
    return _cf.where(bx > threshold, input, _log1p_exp(bx) * (1.0 / beta))


def elu(input, alpha=1.0, inplace=False):
    """x where x > 0, alpha (exp(x) - 1) elsewhere (expm1: exact near 0; the gradient at 0 is alpha, as PyTorch's)."""
    _no_inplace(inplace, "elu")
    _check_tensor(input, "input", "elu")
    pos = input > 0
    # exp of the non-positive part only: a large x overflowed in the branch where() drops, and its zero gradient
    # times exp(x) = inf gave NaN
    return _cf.where(pos, input, _cf.expm1(_cf.where(pos, _cf.zeros_like(input), input)) * alpha)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), computed as min(x, 0) - log1p(exp(-|x|)): no overflow for any x, and
    exact for large |x| (log(sigmoid(x)) gave -inf, or 0, there)."""
    _check_tensor(input, "input", "logsigmoid")
    return -_log1p_exp(-input)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """x clamped to [min_val, max_val]; the gradient is 1 strictly inside and 0 at and beyond the bounds, as
    PyTorch's (a plain clamp passes it at the bounds too)."""
    _no_inplace(inplace, "hardtanh")
    _check_tensor(input, "input", "hardtanh")
    if not min_val <= max_val:
        raise _cf.ValueError("[hardtanh] max_val (%r) must be >= min_val (%r)" % (max_val, min_val))
    outside = _cf.logical_or(input <= min_val, input >= max_val)  # (NaN is inside: it passes, as PyTorch's)
    return _cf.where(outside, _cf.clamp(input, min_val, max_val).detach(), input)


def mish(input, inplace=False):
    """x tanh(softplus(x)) (softplus without overflow: x for large x, 0 for very negative x)."""
    _no_inplace(inplace, "mish")
    _check_tensor(input, "input", "mish")
    return input * _cf.tanh(_log1p_exp(input))


def glu(input, dim=-1):
    """Gated linear unit: a sigmoid(b), a and b the first and second halves of input along dim (even size)."""
    _check_tensor(input, "input", "glu")
    n = input.dim()
    if n == 0:
        raise _cf.ShapeError("[glu] needs a tensor of at least 1 axis to halve, got a 0-d tensor")
    if not -n <= dim < n:
        raise _cf.IndexError("[glu] dim %d is out of range for shape %s" % (dim, list(input.shape)))
    dim %= n
    size = input.shape[dim]
    if size % 2:
        raise _cf.ShapeError("[glu] dim %d is halved, so its size must be even, got %d (shape %s)"
                             % (dim, size, list(input.shape)))
    half = size // 2
    return _cf.narrow(input, dim, 0, half) * _cf.sigmoid(_cf.narrow(input, dim, half, half))


def _with_dtype(input, dtype):
    return input if dtype is None else _cf.to(input, dtype)


def softmax(input, dim=None, dtype=None):
    """exp(x) / sum(exp(x)) along dim (required: PyTorch's implicit choice is deprecated). dtype: cast the
    input first. A row with every entry -inf gives zeros (PyTorch: NaN)."""
    if dim is None:
        raise _cf.ValueError("[softmax] give dim= (the axis to normalise)")
    return _cf.softmax(_with_dtype(input, dtype), dim)


def log_softmax(input, dim=None, dtype=None):
    """log(softmax(x)) along dim (required), computed stably. dtype: cast the input first."""
    if dim is None:
        raise _cf.ValueError("[log_softmax] give dim= (the axis to normalise)")
    return _cf.log_softmax(_with_dtype(input, dtype), dim)


def dropout(input, p=0.5, training=True, inplace=False):
    """Inverted dropout: zeros with probability p, the rest scaled by 1 / (1 - p); the identity when not
    training. The mask comes from cf's default generator (cf.manual_seed)."""
    _no_inplace(inplace, "dropout")
    if p == 1:  # every element dropped when training (cf.dropout takes p < 1): zeros, as PyTorch
        return input * 0.0 if training else input
    return _cf.dropout(input, p, training)


def linear(input, weight, bias=None):
    """x W^T + b, W of shape (out_features, in_features), as torch.nn.functional.linear."""
    _check_tensor(weight, "weight", "linear")
    if weight.dim() != 2:
        raise _cf.ShapeError("[linear] weight must be 2-d (out_features, in_features), got shape %s"
                             % (list(weight.shape),))
    if bias is None or (isinstance(bias, _cf.Tensor) and bias.dim() == 1 and weight.dim() == 2
                        and bias.shape[0] == weight.shape[0] and bias.dtype == weight.dtype):
        return _cf.linear(input, weight, bias)
    # Any other bias (0-d, a broadcastable shape, a number, another dtype) is added after the product,
    # with broadcasting and promotion, as before the fused op.
    return _cf.linear(input, weight) + bias


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing normalized_shape axes, then scale and shift."""
    if isinstance(normalized_shape, int):
        normalized_shape = [normalized_shape]
    return _cf.layer_norm(input, list(normalized_shape), weight, bias, eps)


def embedding(input, weight, padding_idx=None):
    """Rows of weight (num_embeddings, dim) picked by the int64 indices in input: shape input.shape + (dim,).
    padding_idx: that row's output gets no gradient (its value is still weight[padding_idx], as PyTorch)."""
    _check_tensor(input, "input", "embedding")
    _check_tensor(weight, "weight", "embedding")
    if weight.dim() != 2:
        raise _cf.ShapeError("[embedding] weight must be 2-d (num_embeddings, embedding_dim), got shape %s"
                             % (list(weight.shape),))
    rows = _cf.index_select(weight, 0, _cf.reshape(input, [-1]))
    out = _cf.reshape(rows, list(input.shape) + [weight.shape[1]])
    if padding_idx is None:
        return out
    n = weight.shape[0]
    if padding_idx < 0:
        padding_idx += n
    if not 0 <= padding_idx < n:
        raise _cf.IndexError("[embedding] padding_idx %d is out of range for %d embeddings" % (padding_idx, n))
    pad_rows = _cf.unsqueeze(_cf.eq(input, padding_idx), -1)
    return _cf.where(pad_rows, out.detach(), out)


def one_hot(tensor, num_classes=-1):
    """int64 one-hot vectors of the int64 labels in tensor: shape tensor.shape + (num_classes,). num_classes=-1
    takes max(label) + 1 (a read of the tensor's values)."""
    _check_tensor(tensor, "tensor", "one_hot")
    if num_classes == -1:
        num_classes = int(tensor.max().item()) + 1 if tensor.numel() > 0 else 0
    return _cf.one_hot(tensor, num_classes, _cf.int64)


def _pad_index(n, before, after, mode, device):
    """The source positions along an axis of length n of the padded axis's positions -before .. n + after - 1
    under torch's non-constant modes, computed on the device (no list built on the host)."""
    p = _cf.arange(before + n + after, device=device) - before
    if mode == "replicate":
        p = _cf.where(p >= 0, p, 0.0)
        return _cf.where(p <= n - 1, p, float(n - 1))
    if mode == "circular":
        return _cf.remainder(p, n)
    j = _cf.abs(p)  # reflect: about the edge element, which is not repeated
    return _cf.where(j < n, j, (2 * (n - 1)) - j)


def pad(input, pad, mode="constant", value=None):
    """torch.nn.functional.pad: pad = (before_last, after_last, before_second_last, ...). mode "constant" fills with
    value (default 0; negative pads crop); "reflect" mirrors about the edge element (each pad below the axis's
    length), "replicate" repeats the edge element, "circular" wraps around (each pad at most the axis's length):
    those three are one differentiable index_select per padded axis (gradients summed where positions repeat),
    take no value but 0 (as torch), pads >= 0 (torch crops with negative ones; refused here), on any number of
    trailing axes, and always return a new tensor."""
    if mode == "constant":
        return _cf.pad(input, list(pad), 0.0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise _cf.ValueError("[pad] mode must be 'constant', 'reflect', 'replicate' or 'circular', got %r" % (mode,))
    _check_tensor(input, "input", "pad")
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > input.dim():
        raise _cf.ValueError("[pad] pad must hold a (before, after) pair for each of at most input.dim() = %d trailing "
                             "axes, got %r" % (input.dim(), tuple(pad)))
    if value is not None and value != 0:
        raise _cf.ValueError("[pad] mode=%r takes no value (got %r): it pads with the input's own elements"
                             % (mode, value))
    sizes = []
    for v in pad:  # ints, NumPy ints and 0-d integer tensors, as constant mode takes them; not bools
        if isinstance(v, bool):
            raise TypeError("[pad] pads must be ints, got %r" % (v,))
        try:
            sizes.append(_operator.index(v))
        except TypeError:
            raise TypeError("[pad] pads must be ints, got %r" % (v,)) from None
    out = input
    for k in range(len(sizes) // 2):
        axis = input.dim() - 1 - k
        before, after, n = sizes[2 * k], sizes[2 * k + 1], input.shape[axis]
        if before < 0 or after < 0:
            raise _cf.ValueError("[pad] mode=%r takes pads >= 0, got %r for axis %d" % (mode, (before, after), axis))
        if before == 0 and after == 0:
            continue
        # reflect mirrors within the axis, circular wraps it once; replicate repeats the edge as often as asked
        limit = {"reflect": n - 1, "circular": n}.get(mode)
        if n == 0 or (limit is not None and (before > limit or after > limit)):
            raise _cf.ValueError("[pad] mode=%r needs %s: pads %r for axis %d of length %d in %s"
                                 % (mode, "a non-empty axis" if mode == "replicate" else
                                    "each pad below the axis's length" if mode == "reflect" else
                                    "each pad at most the axis's length", (before, after), axis, n, tuple(input.shape)))
        out = _cf.index_select(out, axis, _pad_index(n, before, after, mode, input.device))
    return out if out is not input else input.clone()  # (a new tensor, as torch's, also when nothing is padded)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """x / max(||x||_p, eps) along dim."""
    n = _cf.norm(input, p, dim, True)
    return input / _cf.clamp(n, eps, None)


def _broadcast_shape(a, b, op):
    """NumPy's broadcast of two shapes, or a ShapeError naming op."""
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        raise _cf.ShapeError("[%s] shapes %s and %s cannot be broadcast together" % (op, a, b))
    return [max(x, y) if 0 not in (x, y) else 0 for x, y in zip(a, b)]


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 x2) / max(||x1|| ||x2||, eps) along dim, after broadcasting x1 and x2 to one shape."""
    _check_tensor(x1, "x1", "cosine_similarity")
    _check_tensor(x2, "x2", "cosine_similarity")
    shape = _broadcast_shape(x1.shape, x2.shape, "cosine_similarity")
    if not -len(shape) <= dim < len(shape):
        raise _cf.IndexError("[cosine_similarity] dim %d is out of range for shape %s" % (dim, shape))
    x1, x2 = _cf.expand(x1, shape), _cf.expand(x2, shape)
    dot = (x1 * x2).sum(dim)
    return dot / _cf.clamp(_cf.norm(x1, 2.0, dim) * _cf.norm(x2, 2.0, dim), eps, None)


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross entropy of logits (N, C) or (N, C, d1, ...) (class axis 1), or (C,) for one sample, against int64
    class indices (N, d1, ...) with ignore_index (every target ignored: 0, PyTorch NaN), class weights and label smoothing (cf.nn.cross_entropy), or against class
    probabilities of the input's shape (a floating target: soft labels, as PyTorch 1.10+; ignore_index does
    not apply there). reduction 'mean' over soft labels divides by the number of samples, as PyTorch."""
    _check_tensor(input, "input", "cross_entropy")
    _check_tensor(target, "target", "cross_entropy")
    if input.dim() == 1:  # one sample (C,): as a batch of one, and its loss back without the batch axis
        loss = cross_entropy(_cf.unsqueeze(input, 0), _cf.unsqueeze(target, 0), weight, ignore_index, reduction,
                             label_smoothing)
        return _cf.squeeze(loss, 0) if reduction == "none" else loss
    if not _cf.is_floating(target.dtype):
        return _cf.nn.cross_entropy(input, target, ignore_index, label_smoothing, weight, reduction)
    if list(target.shape) != list(input.shape):
        raise _cf.ShapeError("[cross_entropy] class probabilities (a floating target) must have the input's "
                             "shape %s, got %s" % (list(input.shape), list(target.shape)))
    if input.dim() < 2:
        raise _cf.ShapeError("[cross_entropy] input must be (N, C, ...) with the classes on axis 1, got shape %s"
                             % (list(input.shape),))
    if reduction not in _REDUCTIONS:
        raise _cf.ValueError("[cross_entropy] reduction must be 'mean', 'sum' or 'none', got %r" % (reduction,))
    if not 0.0 <= label_smoothing <= 1.0:
        raise _cf.ValueError("[cross_entropy] label_smoothing must be in [0, 1], got %r" % (label_smoothing,))
    classes = input.shape[1]
    if label_smoothing > 0:
        target = target * (1.0 - label_smoothing) + label_smoothing / classes
    terms = -(target * _cf.log_softmax(input, 1))
    if weight is not None:  # class weights on axis 1
        _check_tensor(weight, "weight", "cross_entropy")
        if list(weight.shape) != [classes]:
            raise _cf.ShapeError("[cross_entropy] weight must have one entry per class (%d), got shape %s"
                                 % (classes, list(weight.shape)))
        terms = terms * _cf.reshape(weight, [classes] + [1] * (input.dim() - 2))
    loss = terms.sum(1)
    return _reduce(loss, reduction, "cross_entropy")


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log likelihood of log-probabilities (N, C) or (N, C, d1, ...) (class axis 1) at int64 targets
    (N, d1, ...), or (C,) at a () target: -input[n, target[n]] times the class weight; 'mean' divides by the
    summed weights of the targets that are not ignore_index, as PyTorch, and gives 0 when every target is
    ignored (PyTorch: NaN), as cf.nn.cross_entropy does."""
    _check_tensor(input, "input", "nll_loss")
    _check_tensor(target, "target", "nll_loss")
    if input.dim() == 1:  # one sample (C,)
        loss = nll_loss(_cf.unsqueeze(input, 0), _cf.unsqueeze(target, 0), weight, ignore_index, reduction)
        return _cf.squeeze(loss, 0) if reduction == "none" else loss
    if target.dtype != _cf.int64:
        raise _cf.DTypeError("[nll_loss] target must hold int64 class indices, got %s" % (target.dtype,))
    if input.dim() < 2 or [input.shape[0]] + list(input.shape[2:]) != list(target.shape):
        raise _cf.ShapeError("[nll_loss] input (N, C, d1, ...) and target (N, d1, ...) do not match: %s and %s"
                             % (list(input.shape), list(target.shape)))
    if reduction not in _REDUCTIONS:
        raise _cf.ValueError("[nll_loss] reduction must be 'mean', 'sum' or 'none', got %r" % (reduction,))
    keep = _cf.ne(target, ignore_index)
    safe = _cf.where(keep, target, _cf.zeros_like(target))  # an ignored target still indexes a valid class
    picked = _cf.squeeze(_cf.take_along_dim(input, _cf.unsqueeze(safe, 1), 1), 1)
    w = _cf.to(keep, input.dtype)
    if weight is not None:
        _check_tensor(weight, "weight", "nll_loss")
        if list(weight.shape) != [input.shape[1]]:
            raise _cf.ShapeError("[nll_loss] weight must have one entry per class (%d), got shape %s"
                                 % (input.shape[1], list(weight.shape)))
        w = w * _cf.index_select(weight, 0, _cf.reshape(safe, [-1])).reshape(list(target.shape))
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    total = w.sum()
    # every target ignored (or none): 0 with a zero gradient, as cf.nn.cross_entropy (PyTorch: NaN)
    return loss.sum() / _cf.where(total == 0, _cf.ones_like(total), total)


def mse_loss(input, target, reduction="mean"):
    """(input - target)^2, reduced."""
    return _cf.nn.mse_loss(input, target, reduction)


def l1_loss(input, target, reduction="mean"):
    """|input - target|, reduced."""
    return _reduce(_cf.abs(input - target), reduction, "l1_loss")


def _check_pointwise_loss(input, target, reduction, op, reductions=_REDUCTIONS):
    """The arguments of an elementwise loss checked before its ops run (tensors, shapes that broadcast, the
    reduction's name), so that a bad one is named by the loss."""
    _check_tensor(input, "input", op)
    _check_tensor(target, "target", op)
    _broadcast_shape(input.shape, target.shape, op)
    if reduction not in reductions:
        raise _cf.ValueError("[%s] reduction must be %s or %r, got %r"
                             % (op, ", ".join(repr(r) for r in reductions[:-1]), reductions[-1], reduction))


def smooth_l1_loss(input, target, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where d = |input - target| < beta, d - 0.5 beta elsewhere, reduced (beta = 0: l1_loss). The
    gradient is PyTorch's: (input - target) / beta inside, its sign outside. Shapes broadcast (PyTorch warns)."""
    _check_pointwise_loss(input, target, reduction, "smooth_l1_loss")
    if not beta >= 0:
        raise _cf.ValueError("[smooth_l1_loss] beta must be >= 0, got %r" % (beta,))
    diff = input - target
    d = _cf.abs(diff)
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    inside = _cf.logical_not(d >= beta)  # (NaN is inside: its gradient is NaN, as PyTorch's)
    q = _cf.where(inside, diff, 0.0)  # (the square of the branch where() drops: an infinite d gave 0 * inf = NaN)
    return _reduce(_cf.where(inside, q * q * (0.5 / beta), d - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d^2 where d = |input - target| < delta, delta (d - 0.5 delta) elsewhere, reduced: smooth_l1_loss with
    beta = delta, times delta. Shapes broadcast (PyTorch warns)."""
    _check_pointwise_loss(input, target, reduction, "huber_loss")
    if not delta > 0:
        raise _cf.ValueError("[huber_loss] delta must be > 0, got %r" % (delta,))
    diff = input - target
    d = _cf.abs(diff)
    inside = _cf.logical_not(d >= delta)
    q = _cf.where(inside, diff, 0.0)
    return _reduce(_cf.where(inside, q * q * 0.5, (d - 0.5 * delta) * delta), reduction, "huber_loss")


def kl_div(input, target, reduction="mean", log_target=False):
    """Kullback-Leibler divergence of log-probabilities input from target, pointwise target (log target - input)
    (0 where target = 0, NaN where it is negative, as PyTorch's xlogy), or exp(target) (target - input) with
    log_target. reduction "batchmean" divides the sum by input.shape[0] (the divergence per sample, what the
    mathematical definition gives); "mean" divides by the number of elements (PyTorch warns that this is not
    the divergence; cf does not warn)."""
    _check_pointwise_loss(input, target, reduction, "kl_div", ("mean", "batchmean", "sum", "none"))
    if log_target:
        loss = _cf.exp(target) * (target - input)
    else:
        zero = target == 0
        # xlogy(target, target): 0 where target = 0, with a zero gradient there (log(0) stays out of the graph)
        safe = _cf.where(zero, _cf.ones_like(target), target)
        t_log_t = _cf.where(zero, _cf.zeros_like(target), target * _cf.log(safe))
        loss = t_log_t - target * input
    if reduction == "batchmean":
        total = loss.sum()
        return total / input.shape[0] if input.dim() > 0 else total
    return _reduce(loss, reduction, "kl_div")


def _clamped_log(p):
    """max(log p, -100), with a zero gradient where p = 0 (a plain clamp(log p) gave 0 * inf = NaN there)."""
    positive = _cf.gt(p, 0)
    safe = _cf.where(positive, p, _cf.ones_like(p))
    return _cf.where(positive, _cf.clamp(_cf.log(safe), -100.0, None), _cf.full_like(p, -100.0))


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """-(t log(p) + (1 - t) log(1 - p)) of probabilities p, each log clamped at -100 as PyTorch. Prefer
    binary_cross_entropy_with_logits (stable, and safe under autocast)."""
    _check_tensor(input, "input", "binary_cross_entropy")
    _check_tensor(target, "target", "binary_cross_entropy")
    if list(input.shape) != list(target.shape):
        raise _cf.ShapeError("[binary_cross_entropy] input %s and target %s must have the same shape"
                             % (list(input.shape), list(target.shape)))
    loss = -(target * _clamped_log(input) + (1.0 - target) * _clamped_log(1.0 - input))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """Binary cross entropy of logits, computed stably (cf.nn.binary_cross_entropy_with_logits)."""
    return _cf.nn.binary_cross_entropy_with_logits(input, target, pos_weight, weight, reduction)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(q k^T scale + mask) v for q (..., L, E), k (..., S, E), v (..., S, Ev), scale 1/sqrt(E) by default.

    is_causal: query i sees keys j <= i (PyTorch's top-left alignment; cf.flash_attention's own causal flag
    aligns bottom-right, j <= i + S - L). 4-d inputs without a mask, with a causal one and L == S, or with a
    boolean attn_mask that only masks keys (shape (B, 1, 1, S) or (1, 1, 1, S), True = attend, as PyTorch's)
    run cf's fused kernel (cf.flash_attention: no (L, S) matrix). Any other attn_mask (boolean, True = attend; or floating, added to the scores) and
    other ranks take the dense path. dropout_p drops attention weights from cf's default generator. A query
    with every key masked outputs zeros (PyTorch: NaN)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(t, name, "scaled_dot_product_attention")
    if attn_mask is not None:
        _check_tensor(attn_mask, "attn_mask", "scaled_dot_product_attention")
    if is_causal and attn_mask is not None:
        raise _cf.ValueError("[scaled_dot_product_attention] give attn_mask or is_causal, not both")
    e = query.shape[-1]
    length, s = query.shape[-2], key.shape[-2]
    scale_value = 1.0 / _math.sqrt(e) if scale is None else _real(scale, "scale", "scaled_dot_product_attention")
    if query.dim() == 4 and key.dim() == 4 and value.dim() == 4:
        # (cf.flash_attention's causal mask is aligned bottom-right, PyTorch's top-left: the same when L == S)
        if attn_mask is None and (not is_causal or length == s):
            return _cf.flash_attention(query, key, value, None, scale_value, is_causal, dropout_p)
        if (attn_mask is not None and attn_mask.dtype == _cf.bool and attn_mask.dim() == 4 and attn_mask.shape[1] == 1
                and attn_mask.shape[2] == 1 and attn_mask.shape[3] == s
                and attn_mask.shape[0] in (1, query.shape[0])):
            padding = _cf.logical_not(_cf.reshape(attn_mask, [attn_mask.shape[0], s]))
            if attn_mask.shape[0] != query.shape[0]:
                padding = _cf.contiguous(_cf.expand(padding, [query.shape[0], s]))
            return _cf.flash_attention(query, key, value, padding, scale_value, False, dropout_p)
    scores = _cf.matmul(query, _cf.transpose(key, -1, -2)) * scale_value
    if is_causal:  # query i sees key j <= i (PyTorch's top-left tril)
        allowed = _cf.tril(_cf.ones([length, s], dtype=_cf.bool, device=query.device))
        scores = _cf.masked_fill(scores, _cf.logical_not(allowed), float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == _cf.bool:
            scores = _cf.masked_fill(scores, _cf.logical_not(attn_mask), float("-inf"))
        else:
            scores = scores + _cf.to(attn_mask, scores.dtype)
    weights = _cf.softmax(scores, -1)
    if dropout_p > 0:
        weights = _cf.dropout(weights, dropout_p, True)
    return _cf.matmul(weights, value)
