"""optimizer.param_groups: torch.optim's list of group dicts, as live views of a cf optimizer's groups."""
import collections.abc as _abc

from . import _cf
from ._functional import _real


class ParamGroup(_abc.MutableMapping):
    """One parameter group of a cf optimizer, read and written as a dict of torch.optim's param_groups:
    "params" (its tensors, fixed at construction), "lr" (the group's rate: the optimizer's lr times
    "lr_scale"), "lr_scale" and "weight_decay" (its own, or the optimizer's when it set none). Writing
    "lr" gives the group that rate: with one group it sets the optimizer's lr (lr_scale kept), with several
    it sets this group's lr_scale to rate / the optimizer's lr, leaving the others. A cf schedule's
    apply(optimizer) and the cf.optim.lr_scheduler classes set the optimizer's lr, which every group scales.
    Group settings are configuration: a checkpoint keeps the optimizer's lr and state, not them."""

    _KEYS = ("params", "lr", "lr_scale", "weight_decay")

    def __init__(self, optimizer, index):
        self._opt = optimizer
        self._index = index

    def _where(self):
        return "[%s.param_groups]" % self._opt.name

    def __getitem__(self, key):
        opt, i = self._opt, self._index
        if key == "params":
            return opt._group_params(i)
        if key == "lr":
            return opt.lr * opt._group_lr_scale(i)
        if key == "lr_scale":
            return opt._group_lr_scale(i)
        if key == "weight_decay":
            own = opt._group_weight_decay(i)
            return opt.weight_decay if own is None else own
        raise KeyError("%s no key %r in a parameter group (keys: %s)" % (self._where(), key, ", ".join(self._KEYS)))

    def __setitem__(self, key, value):
        opt, i = self._opt, self._index
        if key == "lr":
            value = _real(value, "lr", self._where()[1:-1])
            scale = opt._group_lr_scale(i)
            if opt._group_count() == 1:
                if scale == 0:
                    raise _cf.ValueError("%s group 0 has lr_scale 0, so no optimizer lr gives it rate %r"
                                         % (self._where(), value))
                opt.lr = value / scale
            else:
                if opt.lr == 0:
                    raise _cf.ValueError("%s the optimizer's lr is 0, so group %d's rate %r cannot be kept as a "
                                         "scale of it: set optimizer.lr first" % (self._where(), i, value))
                opt._set_group_lr_scale(i, value / opt.lr)
        elif key == "lr_scale":
            opt._set_group_lr_scale(i, _real(value, "lr_scale", self._where()[1:-1]))
        elif key == "weight_decay":
            opt._set_group_weight_decay(i, None if value is None else _real(value, "weight_decay", self._where()[1:-1]))
        elif key == "params":
            raise TypeError("%s a group's params are fixed when the optimizer is built: build a new optimizer "
                            "for other parameters" % self._where())
        else:
            raise KeyError("%s a parameter group takes the keys %s, not %r (extra per-group settings are not "
                           "kept)" % (self._where(), ", ".join(self._KEYS), key))

    def __delitem__(self, key):
        raise TypeError("%s keys of a parameter group cannot be removed (%r)" % (self._where(), key))

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self):
        return len(self._KEYS)

    def __repr__(self):
        return "{'params': [%d tensors], 'lr': %r, 'lr_scale': %r, 'weight_decay': %r}" % (
            len(self["params"]), self["lr"], self["lr_scale"], self["weight_decay"])


def param_groups(optimizer):
    """The optimizer's parameter groups, each a live ParamGroup view (torch.optim's param_groups)."""
    return [ParamGroup(optimizer, i) for i in range(optimizer._group_count())]
