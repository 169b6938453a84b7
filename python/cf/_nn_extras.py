"""torch.nn's loss and activation modules and torch.nn.utils, written in Python over cf.nn.functional (the
layers with parameters are cf's own C++ modules)."""
import types as _types

from . import _cf
from . import _functional as F


class _Loss(_cf.nn.Module):
    """A loss module: forward(input, target) calls the cf.nn.functional loss with the constructor's options."""

    def __init__(self, reduction="mean"):
        """reduction: 'mean', 'sum' or 'none'."""
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise _cf.ValueError("[%s] reduction must be 'mean', 'sum' or 'none', got %r"
                                 % (type(self).__name__, reduction))
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


for _cls in (CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCELoss, BCEWithLogitsLoss, SiLU, Softmax, LogSoftmax,
             Flatten):
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
    """torch.nn.utils.clip_grad_norm_: scales the gradients so that their joint L2 norm is at most max_norm and
    returns the norm before clipping, as a 0-d float64 tensor (cf.nn.clip_grad_norm_ returns a float). Only
    norm_type 2."""
    if float(norm_type) != 2.0:
        raise _cf.NotImplementedError("[clip_grad_norm_] only norm_type 2 (the L2 norm) is supported, got %r"
                                      % (norm_type,))
    total = _cf.nn.clip_grad_norm_(parameters, max_norm, error_if_nonfinite)
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
