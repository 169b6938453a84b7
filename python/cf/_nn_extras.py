"""torch.nn's loss and activation modules and torch.nn.utils, written in Python over cf.nn.functional (the
layers with parameters are cf's own C++ modules)."""
import math as _math
import types as _types
import typing as _typing

from . import _cf
from . import _functional as F


class _Loss(_cf.nn.Module):
    """A loss module: forward(input, target) calls the cf.nn.functional loss with the constructor's options."""

    _reductions = ("mean", "sum", "none")

    def __init__(self, reduction="mean"):
        """reduction: 'mean', 'sum' or 'none'."""
        super().__init__()
        if reduction not in self._reductions:
            raise _cf.ValueError("[%s] reduction must be %s or %r, got %r"
                                 % (type(self).__name__, ", ".join(repr(r) for r in self._reductions[:-1]),
                                    self._reductions[-1], reduction))
        self.reduction = reduction

    def _buffer(self, name, t):
        if t is None:
            object.__setattr__(self, name, None)  # (a tensor assigned later is used: _get reads the attribute)
            return
        if not isinstance(t, _cf.Tensor):
            raise TypeError("[%s] %s must be a cf.Tensor or None, got %s" % (type(self).__name__, name,
                                                                            type(t).__name__))
        self.register_buffer(name, t)

    def _get(self, name):
        return getattr(self, name, None)


class CrossEntropyLoss(_Loss):
    """F.cross_entropy as a module (class indices or class probabilities; weight a buffer)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        """F.cross_entropy's options; weight (one per class) is kept as a buffer."""
        super().__init__(reduction)
        self._buffer("weight", weight)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self._get("weight"), self.ignore_index, self.reduction,
                               self.label_smoothing)


class NLLLoss(_Loss):
    """F.nll_loss as a module."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        """F.nll_loss's options; weight (one per class) is kept as a buffer."""
        super().__init__(reduction)
        self._buffer("weight", weight)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, self._get("weight"), self.ignore_index, self.reduction)


class MSELoss(_Loss):
    """F.mse_loss as a module."""

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    """F.l1_loss as a module."""

    def forward(self, input, target):
        return F.l1_loss(input, target, self.reduction)


class BCELoss(_Loss):
    """F.binary_cross_entropy as a module."""

    def __init__(self, weight=None, reduction="mean"):
        """F.binary_cross_entropy's options; weight is kept as a buffer."""
        super().__init__(reduction)
        self._buffer("weight", weight)

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self._get("weight"), self.reduction)


class BCEWithLogitsLoss(_Loss):
    """F.binary_cross_entropy_with_logits as a module (weight and pos_weight buffers)."""

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        """F.binary_cross_entropy_with_logits's options; weight and pos_weight are kept as buffers."""
        super().__init__(reduction)
        self._buffer("weight", weight)
        self._buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self._get("weight"), self.reduction,
                                                  self._get("pos_weight"))


class SmoothL1Loss(_Loss):
    """F.smooth_l1_loss as a module."""

    def __init__(self, reduction="mean", beta=1.0):
        """reduction, and beta >= 0 (the width of the quadratic part; 0: L1)."""
        super().__init__(reduction)
        if not beta >= 0:
            raise _cf.ValueError("[SmoothL1Loss] beta must be >= 0, got %r" % (beta,))
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    """F.huber_loss as a module."""

    def __init__(self, reduction="mean", delta=1.0):
        """reduction, and delta > 0 (where the loss turns from quadratic to linear)."""
        super().__init__(reduction)
        if not delta > 0:
            raise _cf.ValueError("[HuberLoss] delta must be > 0, got %r" % (delta,))
        self.delta = delta

    def forward(self, input, target):
        return F.huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(_Loss):
    """F.kl_div as a module: forward(input, target) with input log-probabilities (reduction 'batchmean' gives the
    divergence per sample)."""

    _reductions = ("mean", "batchmean", "sum", "none")

    def __init__(self, reduction="mean", log_target=False):
        """reduction: 'mean', 'batchmean', 'sum' or 'none'; log_target: target holds log-probabilities."""
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return F.kl_div(input, target, self.reduction, self.log_target)


def _refuse_inplace(inplace, name):
    if inplace:
        raise _cf.ValueError("[%s] inplace=True is not supported: cf's in-place ops refuse tensors that take part "
                             "in autograd; the module returns a new tensor" % name)


class ELU(_cf.nn.UnaryModule):
    """F.elu as a module: x where x > 0, alpha (exp(x) - 1) elsewhere."""

    def __init__(self, alpha=1.0, inplace=False):
        """alpha: the value approached for x -> -inf is -alpha. inplace=True is refused."""
        super().__init__()
        _refuse_inplace(inplace, "ELU")
        self.alpha, self.inplace = alpha, False

    def forward(self, x):
        return F.elu(x, self.alpha)


class Softplus(_cf.nn.UnaryModule):
    """F.softplus as a module: log(1 + exp(beta x)) / beta, x itself where beta x > threshold."""

    def __init__(self, beta=1.0, threshold=20.0):
        """beta > 0; threshold: above it (of beta x) the identity."""
        super().__init__()
        if not beta > 0:
            raise _cf.ValueError("[Softplus] beta must be > 0, got %r" % (beta,))
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)


class Mish(_cf.nn.UnaryModule):
    """F.mish as a module: x tanh(softplus(x))."""

    def __init__(self, inplace=False):
        """inplace=True is refused."""
        super().__init__()
        _refuse_inplace(inplace, "Mish")
        self.inplace = False

    def forward(self, x):
        return F.mish(x)


class Hardtanh(_cf.nn.UnaryModule):
    """F.hardtanh as a module: x clamped to [min_val, max_val]."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        """The bounds (min_val <= max_val). inplace=True is refused."""
        super().__init__()
        _refuse_inplace(inplace, "Hardtanh")
        if not min_val <= max_val:
            raise _cf.ValueError("[Hardtanh] max_val (%r) must be >= min_val (%r)" % (max_val, min_val))
        self.min_val, self.max_val, self.inplace = min_val, max_val, False

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val)


class SiLU(_cf.nn.UnaryModule):
    """x sigmoid(x), as a module (goes into Sequential)."""

    def forward(self, x):
        return F.silu(x)


class Softmax(_cf.nn.UnaryModule):
    """softmax along dim, as a module."""

    def __init__(self, dim=None):
        """dim: the axis to normalise (required)."""
        super().__init__()
        if dim is None:
            raise _cf.ValueError("[%s] give dim= (the axis to normalise)" % type(self).__name__)
        self.dim = dim

    def forward(self, x):
        return _cf.softmax(x, self.dim)


class LogSoftmax(Softmax):
    """log_softmax along dim, as a module."""

    def forward(self, x):
        return _cf.log_softmax(x, self.dim)


class Flatten(_cf.nn.UnaryModule):
    """Axes start_dim..end_dim merged into one (default: all but the batch axis), as torch.nn.Flatten."""

    def __init__(self, start_dim=1, end_dim=-1):
        """The first and last axes to merge."""
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return _cf.flatten(x, self.start_dim, self.end_dim)


class RMSNorm(_cf.nn.UnaryModule):
    """Root-mean-square normalisation over the last len(normalized_shape) axes (torch.nn.RMSNorm):
    x / sqrt(mean(x^2) + eps) * weight, with weight (normalized_shape) of ones when elementwise_affine. eps None:
    the machine epsilon of x's dtype, as PyTorch's. Composed of cf's ops (the mean of squares in float32 or wider
    under autocast, as cf's reductions)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
        if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
            raise _cf.ValueError("[RMSNorm] normalized_shape must be a positive size or sizes, got %r"
                                 % (normalized_shape,))
        if eps is not None and not (isinstance(eps, (int, float)) and eps >= 0):
            raise _cf.ValueError("[RMSNorm] eps must be a number >= 0 or None, got %r" % (eps,))
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(shape), eps, elementwise_affine
        if elementwise_affine:
            self.weight = _cf.nn.Parameter(_cf.ones(shape, dtype=dtype or _cf.float32, device=device or "cpu"))
        else:
            self.weight = None

    def forward(self, x):
        n = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - n:]) != self.normalized_shape:
            raise _cf.ShapeError("[RMSNorm] expects input ending in %s, got %s"
                                 % (self.normalized_shape, tuple(x.shape)))
        eps = self.eps if self.eps is not None else _MACHINE_EPS.get(x.dtype, 1.1920928955078125e-07)
        ms = _cf.mean(x * x, list(range(x.dim() - n, x.dim())), keepdim=True)
        y = x * _cf.rsqrt(ms + eps)
        return y * self.weight if self.weight is not None else y


_MACHINE_EPS = {_cf.float64: 2.220446049250313e-16, _cf.float32: 1.1920928955078125e-07, _cf.bfloat16: 0.0078125,
                _cf.float16: 0.0009765625}  # torch.finfo(dtype).eps


class MultiheadAttention(_cf.nn.Module):
    """torch.nn.MultiheadAttention: softmax(q k^T / sqrt(head_dim) + masks) v over num_heads heads, with its
    parameter names (in_proj_weight (3E, E) and in_proj_bias, or q/k/v_proj_weight when kdim or vdim differ from
    embed_dim; out_proj), so a PyTorch state_dict loads into it. forward(query, key, value, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False) -> (output, weights or None):
    inputs (L, N, E) or with batch_first=True (N, L, E), or unbatched (L, E); key_padding_mask (N, S), True (or a
    float added) for keys to ignore; attn_mask (L, S) or (N * num_heads, L, S), True where attention is NOT
    allowed (PyTorch's convention here, the reverse of scaled_dot_product_attention's) or a float added. Without
    need_weights, key padding alone or is_causal run cf's fused kernel (cf.flash_attention); weights come from
    the dense path, averaged over heads unless average_attn_weights=False. A query with every key masked outputs
    zeros (PyTorch: NaN), cf's rule. Not supported: add_bias_kv, add_zero_attn (refused). cf.nn.MultiHeadAttention
    (capital H) is cf's own layer that runs any attention variant by name."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if not (isinstance(embed_dim, int) and isinstance(num_heads, int) and embed_dim > 0 and num_heads > 0
                and embed_dim % num_heads == 0):
            raise _cf.ValueError("[MultiheadAttention] embed_dim (%r) must be a positive multiple of num_heads (%r)"
                                 % (embed_dim, num_heads))
        if add_bias_kv or add_zero_attn:
            raise _cf.ValueError("[MultiheadAttention] add_bias_kv and add_zero_attn are not supported")
        if not 0.0 <= dropout < 1.0:
            raise _cf.ValueError("[MultiheadAttention] dropout must be in [0, 1), got %r" % (dropout,))
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, float(dropout), batch_first
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        dt, dev = dtype or _cf.float32, device or "cpu"
        init = _cf.nn.init  # (PyTorch's initialisation: xavier_uniform_ projections, zero biases)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _cf.nn.Parameter(
                init.xavier_uniform_(_cf.empty([3 * embed_dim, embed_dim], dtype=dt, device=dev)))
        else:
            for name, d in (("q_proj_weight", embed_dim), ("k_proj_weight", self.kdim), ("v_proj_weight", self.vdim)):
                setattr(self, name, _cf.nn.Parameter(init.xavier_uniform_(_cf.empty([embed_dim, d], dtype=dt,
                                                                                      device=dev))))
        self.in_proj_bias = _cf.nn.Parameter(_cf.zeros([3 * embed_dim], dtype=dt, device=dev)) if bias else None
        self.out_proj = _cf.nn.Linear(embed_dim, embed_dim, bias=bias, device=dev, dtype=dt)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _projections(self):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = [_cf.narrow(self.in_proj_weight, 0, i * e, e) for i in range(3)]
        else:
            w = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        b = [None] * 3 if self.in_proj_bias is None else [_cf.narrow(self.in_proj_bias, 0, i * e, e) for i in range(3)]
        return w, b

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        op = "MultiheadAttention"
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = (_cf.unsqueeze(t, 1 if not self.batch_first else 0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _cf.unsqueeze(key_padding_mask, 0)
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise _cf.ShapeError("[%s] expects query, key and value of 3 dims (or 2, unbatched), got %s, %s and %s"
                                 % (op, tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        if not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (_cf.transpose(t, 0, 1) for t in (query, key, value))
        n, length, e = query.shape
        s = key.shape[1]
        if e != self.embed_dim or key.shape[2] != self.kdim or value.shape[2] != self.vdim or \
                key.shape[0] != n or value.shape[:2] != key.shape[:2]:
            raise _cf.ShapeError("[%s] query (N, L, %d), key (N, S, %d) and value (N, S, %d) expected (batch first), "
                                 "got %s, %s and %s" % (op, self.embed_dim, self.kdim, self.vdim, tuple(query.shape),
                                                        tuple(key.shape), tuple(value.shape)))
        h, hd = self.num_heads, self.head_dim
        w, b = self._projections()
        heads = []
        for x, wi, bi, m in ((query, w[0], b[0], length), (key, w[1], b[1], s), (value, w[2], b[2], s)):
            heads.append(_cf.transpose(_cf.reshape(F.linear(x, wi, bi), [n, m, h, hd]), 1, 2))  # (N, H, m, hd)
        q, k, v = heads
        p = self.dropout if self.training else 0.0
        scale = 1.0 / float(hd) ** 0.5
        # the masks as one additive (N, H, L, S) float term, or as cf.flash_attention's key padding
        padding = None
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (n, s):
                raise _cf.ShapeError("[%s] key_padding_mask must be (N, S) = (%d, %d), got %s"
                                     % (op, n, s, tuple(key_padding_mask.shape)))
            padding = key_padding_mask
        if attn_mask is not None:
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) != (length, s) or attn_mask.dim() == 3 and \
                    tuple(attn_mask.shape) != (n * h, length, s) or attn_mask.dim() not in (2, 3):
                raise _cf.ShapeError("[%s] attn_mask must be (L, S) = (%d, %d) or (N * num_heads, L, S), got %s"
                                     % (op, length, s, tuple(attn_mask.shape)))
        fused = not need_weights and attn_mask is None and (padding is None or padding.dtype == _cf.bool) and \
            (not is_causal or length == s)
        if fused:
            out = _cf.flash_attention(q, k, v, padding, scale, bool(is_causal), p)
            weights = None
        else:
            scores = _cf.matmul(q, _cf.transpose(k, -1, -2)) * scale  # (N, H, L, S)
            if is_causal and attn_mask is None:
                attn_mask = _cf.logical_not(_cf.tril(_cf.ones([length, s], dtype=_cf.bool, device=q.device)))
            for m, shape in ((attn_mask, None), (padding, [n, 1, 1, s])):
                if m is None:
                    continue
                if m.dim() == 3:
                    m = _cf.reshape(m, [n, h, length, s])
                elif shape is not None:
                    m = _cf.reshape(m, shape)
                if m.dtype == _cf.bool:
                    scores = _cf.masked_fill(scores, m, float("-inf"))
                else:
                    scores = scores + _cf.to(m, scores.dtype)
            attn = _cf.softmax(scores, -1)
            if p > 0:
                attn = _cf.dropout(attn, p, True)
            weights = attn  # (after dropout, as PyTorch returns them)
            out = _cf.matmul(attn, v)
            if not need_weights:
                weights = None
            elif average_attn_weights:
                weights = _cf.mean(weights, [1])
        out = self.out_proj(_cf.reshape(_cf.transpose(out, 1, 2), [n, length, e]))  # (N, L, E)
        if not self.batch_first:
            out = _cf.transpose(out, 0, 1)
        if unbatched:
            out = _cf.squeeze(out, 1 if not self.batch_first else 0)
            if weights is not None:
                weights = _cf.squeeze(weights, 0)
        return out, weights


for _cls in (CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCELoss, BCEWithLogitsLoss, SmoothL1Loss, HuberLoss,
             KLDivLoss, ELU, Softplus, Mish, Hardtanh, SiLU, Softmax, LogSoftmax, Flatten, RMSNorm, MultiheadAttention):
    _cls.__module__ = "cf.nn"
del _cls


def pad_sequence(sequences, batch_first=False, padding_value=0.0):
    """Tensors of shapes (L_i, *) padded with padding_value to the longest and stacked: (L, B, *), or (B, L, *)
    with batch_first, as torch.nn.utils.rnn.pad_sequence (differentiable, any device)."""
    sequences = list(sequences)
    if not sequences:
        raise _cf.ValueError("[pad_sequence] needs at least one tensor")
    for i, s in enumerate(sequences):
        if not isinstance(s, _cf.Tensor) or s.dim() < 1:
            raise TypeError("[pad_sequence] item %d must be a cf.Tensor of at least 1 axis, got %r" % (i, s))
        if list(s.shape[1:]) != list(sequences[0].shape[1:]):
            raise _cf.ShapeError("[pad_sequence] item %d has trailing shape %s, item 0 %s"
                                 % (i, list(s.shape[1:]), list(sequences[0].shape[1:])))
    longest = max(s.shape[0] for s in sequences)
    rest = sequences[0].dim() - 1
    padded = [_cf.pad(s, [0, 0] * rest + [0, longest - s.shape[0]], padding_value) for s in sequences]
    return _cf.stack(padded, 0 if batch_first else 1)


# cf.nn.utils and cf.nn.utils.rnn: torch.nn.utils's module paths for what cf has
utils = _types.ModuleType("cf.nn.utils", "torch.nn.utils's names: clip_grad_norm_, and rnn.pad_sequence.")
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """torch.nn.utils.clip_grad_norm_: scales the gradients so that their joint norm of norm_type (2, another
    p > 0, or inf / "inf": the largest magnitude) is at most max_norm and returns the norm before clipping, as a 0-d
    float64 tensor (cf.nn.clip_grad_norm_ returns a float)."""
    if isinstance(norm_type, str) and norm_type == "inf":
        norm_type = _math.inf
    total = _cf.nn.clip_grad_norm_(parameters, max_norm, error_if_nonfinite,
                                   F._real(norm_type, "norm_type", "clip_grad_norm_"))
    return _cf.tensor(total, dtype=_cf.float64)


utils.clip_grad_norm_ = clip_grad_norm_
utils.rnn = _types.ModuleType("cf.nn.utils.rnn", "torch.nn.utils.rnn's names: pad_sequence.")
utils.rnn.pad_sequence = pad_sequence
utils.__all__ = ["clip_grad_norm_"]
utils.rnn.__all__ = ["pad_sequence"]


def _embedding_from_pretrained(embeddings: "_cf.Tensor", freeze: bool = True,
                                padding_idx: "int | None" = None) -> "_cf.nn.Embedding":
    """A cf.nn.Embedding holding a copy of embeddings ((num, dim), its dtype and device), as
    torch.nn.Embedding.from_pretrained: freeze=True keeps the table out of training (its weight does not require
    grad); padding_idx names the row that gets no gradient (its pretrained values are kept)."""
    if not isinstance(embeddings, _cf.Tensor) or embeddings.dim() != 2:
        raise _cf.ShapeError("[Embedding.from_pretrained] embeddings must be a 2-d cf.Tensor (num, dim), got %s"
                             % (embeddings.shape if isinstance(embeddings, _cf.Tensor) else type(embeddings).__name__,))
    num, dim = embeddings.shape
    # (the table built first is overwritten: its own generator leaves the default one's sequence alone)
    e = _cf.nn.Embedding(num, dim, padding_idx=padding_idx, generator=_cf.Generator(0), dtype=embeddings.dtype,
                         device=embeddings.device)
    e.weight.requires_grad_(False)
    e.weight.copy_(embeddings.detach())
    e.weight.requires_grad_(not freeze)
    return e


_cf.nn.Embedding.from_pretrained = staticmethod(_embedding_from_pretrained)


_SQRT2 = _math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * _math.log(2.0 * _math.pi)


def _truncated_standard_normal(n, alpha, beta, generator, device):
    """n float64 draws of a standard normal conditioned on [alpha, beta] (alpha < beta, either may be infinite), exact:
    proposals from whichever of three samplers accepts most often (Robert 1995), the accepted ones kept in the
    order drawn until there are n (they are independent, so any n of them are a sample). N(0, 1) kept inside the
    interval suits a wide one around 0, a uniform proposal on [alpha, beta] accepted with probability
    exp((z*^2 - z^2) / 2) (z* the point of the interval nearest 0) a narrow one, and alpha + Exp(lam) accepted with
    probability exp(-(z - lam)^2 / 2) a tail (alpha > 0); the one picked accepts about half its proposals or more,
    whatever the interval, and a round draws enough for all that are missing, so one or two rounds do."""
    flip = alpha + beta < 0  # the tail on the right: draw for [-beta, -alpha] and negate
    if flip:
        alpha, beta = -beta, -alpha
    lam = gap = None  # the exponential's rate (alpha + sqrt(alpha^2 + 4)) / 2, and lam - alpha, without overflow
    if alpha > 0:
        gap = 2.0 / (alpha + (alpha * _math.sqrt(1.0 + 4.0 / (alpha * alpha)) if alpha > 1 else
                              _math.sqrt(alpha * alpha + 4.0)))
        lam = alpha + gap
    width, nearest = beta - alpha, max(alpha, 0.0)
    mass = 0.5 * (_math.erfc(alpha / _SQRT2) - _math.erfc(beta / _SQRT2))  # P(alpha <= Z <= beta), alpha + beta >= 0
    if mass > 0:  # the log of each sampler's acceptance rate
        rates = {"normal": _math.log(mass)}
        if _math.isfinite(width):
            rates["uniform"] = _math.log(mass) - _math.log(width) + nearest * nearest / 2.0 + _LOG_SQRT_2PI
        if lam is not None:
            rates["exponential"] = _math.log(lam) + _LOG_SQRT_2PI + lam * alpha - lam * lam / 2.0 + _math.log(mass)
        method = max(rates, key=rates.get)
        rate = min(max(_math.exp(rates[method]), 0.25), 1.0)
    else:  # (the mass underflows: an interval far out in the tail, or one narrower than rounding)
        method = "uniform" if alpha <= 0 or width * alpha < 1.0 else "exponential"
        rate = 0.5
    f64 = _cf.float64
    parts, missing = [], n
    while missing > 0:
        k = int(missing / rate * 1.05) + 16  # (a few more than expected: rarely a second round)
        if method == "normal":
            z = _cf.randn([k], dtype=f64, generator=generator, device=device)
            ok = _cf.logical_and(z >= alpha, z <= beta)
        elif method == "uniform":
            z = _cf.rand([k], dtype=f64, generator=generator, low=alpha, high=beta, device=device)
            u = _cf.rand([k], dtype=f64, generator=generator, device=device)
            ok = u < _cf.exp((z - nearest) * (z + nearest) * -0.5)
        else:
            e = -_cf.log1p(-_cf.rand([k], dtype=f64, generator=generator, device=device)) * (1.0 / lam)
            z = e + alpha
            u = _cf.rand([k], dtype=f64, generator=generator, device=device)
            ok = _cf.logical_and(z <= beta, u < _cf.exp(-0.5 * (e - gap) * (e - gap)))  # (e - gap = z - lam)
        kept = z[ok]
        if kept.numel() > missing:
            kept = _cf.narrow(kept, 0, 0, missing)
        parts.append(kept)
        missing -= kept.numel()
    out = parts[0] if len(parts) == 1 else _cf.cat(parts, 0)
    return -out if flip else out


def trunc_normal_(tensor: _cf.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: _typing.Optional[_cf.Generator] = None) -> _cf.Tensor:
    """Fills tensor in place (no grad, as cf.nn.init's other functions) with N(mean, std^2) values truncated to
    [a, b] and returns it, as torch.nn.init.trunc_normal_: a and b are values (not numbers of std), either may be
    infinite. The values are drawn from the generator (None: the default one, cf.manual_seed) and redrawn until
    inside the bounds (cf has no erfinv for PyTorch's inverse-CDF method), exact wherever [a, b] lies, far from
    the mean too (where PyTorch's is not, and warns); then cast to the tensor's dtype and clamped to [a, b]."""
    op = "init::trunc_normal_"
    if not isinstance(tensor, _cf.Tensor):
        raise TypeError("[%s] tensor must be a cf.Tensor, got %s" % (op, type(tensor).__name__))
    if not _cf.is_floating(tensor.dtype):
        raise _cf.DTypeError("[%s] needs a float tensor, got %s" % (op, tensor.dtype.name))
    mean, std, a, b = (F._real(v, name, op) for v, name in ((mean, "mean"), (std, "std"), (a, "a"), (b, "b")))
    if not (_math.isfinite(mean) and _math.isfinite(std) and std > 0):
        raise _cf.ValueError("[%s] needs a finite mean and a finite std > 0, got mean %r std %r" % (op, mean, std))
    if not a <= b or a == b and _math.isinf(a):
        raise _cf.ValueError("[%s] needs bounds a <= b that hold a value (either may be infinite), got a %r b %r"
                             % (op, a, b))
    if any(st == 0 and size > 1 for st, size in zip(tensor.stride(), tensor.shape)):
        raise _cf.ValueError("[%s] the tensor (shape %s) has elements that share memory (an expand() view): it "
                             "cannot take one drawn value per element; initialize a copy (contiguous())"
                             % (op, list(tensor.shape)))
    n = tensor.numel()
    if n == 0:
        return tensor
    shape, alpha, beta = list(tensor.shape), (a - mean) / std, (b - mean) / std
    if a == b:
        values = _cf.full(shape, a, dtype=tensor.dtype, device=tensor.device)
    elif alpha == beta and _math.isinf(alpha):  # ([a, b] so many std from the mean that the bound nearer it is all)
        values = _cf.full(shape, a if alpha > 0 else b, dtype=tensor.dtype, device=tensor.device)
    elif alpha == beta:  # (an interval too narrow for the standardised bounds to differ: the density is flat on it)
        values = _cf.rand(shape, dtype=tensor.dtype, generator=generator, low=a, high=b, device=tensor.device)
    else:
        z = _truncated_standard_normal(n, alpha, beta, generator, tensor.device)
        values = _cf.to(_cf.reshape(z * std + mean, shape), tensor.dtype)
    # (mean + std z can round past a bound, and so can the cast to a narrower dtype)
    if _math.isfinite(a) or _math.isfinite(b):
        values = _cf.clamp(values, a if _math.isfinite(a) else None, b if _math.isfinite(b) else None)
    recording = _cf.grad_enabled()
    _cf._set_grad_enabled(False)
    try:
        tensor.copy_(values)
    finally:
        _cf._set_grad_enabled(recording)
    return tensor


_cf.nn.init.trunc_normal_ = trunc_normal_


class _Parameters(list):
    """What Module.parameters() returns: the parameter tensors as a list (len, indexing, and cf's optimizers take
    it as before), that is also an iterator as PyTorch's generator is, so next(model.parameters()) gives the
    first parameter (a fresh call starts again from the first). Iterating it (for, list()) goes over the
    parameters next() has not given yet, as a generator would, without using them up: a second loop sees them
    again, as a list's would (where a generator would be empty)."""

    __slots__ = ("_next",)

    def __init__(self, items):
        super().__init__(items)
        self._next = 0

    def __iter__(self):
        return iter(self[self._next:]) if self._next else super().__iter__()

    def __next__(self):
        if self._next >= len(self):
            raise StopIteration
        self._next += 1
        return self[self._next - 1]


_module_parameters = _cf.nn.Module.parameters


def _parameters(self, recurse: bool = True) -> "_Parameters":
    """The parameter tensors in registration order: a list that is also an iterator (next(model.parameters())
    works, as with PyTorch's generator). recurse=False: this module's own, without its submodules'."""
    if recurse:
        return _Parameters(_module_parameters(self))
    return _Parameters(p for name, p in self.named_parameters() if "." not in name)


_cf.nn.Module.parameters = _parameters
