"""cf.optim.lr_scheduler: learning-rate schedulers bound to an optimizer, as torch.optim.lr_scheduler's.

cf's schedules (cf.nn.StepLR, cf.nn.WarmupCosineLR, ...) are pure functions of the update number, applied
with schedule.apply(optimizer) before each optimizer.step(). A scheduler here holds an optimizer and a count
of its own step() calls instead, the way PyTorch scripts use them:

    sched = cf.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    for epoch in range(epochs):
        train_one_epoch(...)      # opt.step() inside
        sched.step()

At construction the optimizer's lr is the base rate (a later scheduler on the same optimizer takes the one the
first saw, as torch's "initial_lr"), and epoch 0 gets the schedule's first rate; each step() moves to the next epoch and sets the
optimizer's lr (cf's optimizer has one lr; each parameter group takes lr times its lr_scale). The classes
with a cf schedule behind them (StepLR, ExponentialLR, CosineAnnealingLR, and LRScheduler over any
cf.nn.LRSchedule) take their rates from it.
"""
import bisect as _bisect
import math as _math
import numbers as _numbers
import weakref as _weakref

from . import _cf

# The lr an optimizer had when its first scheduler was built (torch.optim's per-group "initial_lr"): a
# later scheduler on the same optimizer (warmup, then decay) starts from it, not from what the first left.
_initial_lrs = _weakref.WeakKeyDictionary()

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "CosineAnnealingWarmRestarts", "LinearLR", "ConstantLR", "PolynomialLR", "SequentialLR",
           "ReduceLROnPlateau", "OneCycleLR"]


def _lr_of(optimizer, scheduler):
    """The optimizer's initial lr (its lr when its first scheduler was built), after checking that it is a
    cf optimizer (scheduler: the class, for the message)."""
    if not isinstance(optimizer, _cf.nn.Optimizer):
        raise TypeError("[%s] takes a cf optimizer (cf.nn.SGD, Adam, AdamW), got %s"
                        % (scheduler.__name__, type(optimizer).__name__))
    return _initial_lrs.setdefault(optimizer, optimizer.lr)


def _integer(value, what, scheduler, low):
    if not isinstance(value, _numbers.Integral) or isinstance(value, bool) or value < low:
        raise _cf.ValueError("[%s] %s must be an integer >= %d, got %r" % (scheduler, what, low, value))
    return int(value)


def _finite(value, what, scheduler, low=-_math.inf):
    """value as a float, after checking that it is a finite real number >= low."""
    if not isinstance(value, _numbers.Real) or isinstance(value, bool) or not low <= value < _math.inf:
        raise _cf.ValueError("[%s] %s must be a finite number%s, got %r"
                             % (scheduler, what, "" if low == -_math.inf else " >= %g" % low, value))
    return float(value)


class LRScheduler:
    """Sets optimizer.lr to the rate of epoch e at every step(), where e counts this scheduler's step() calls
    (0 at construction). `schedule` is a cf.nn.LRSchedule, read as PyTorch reads its schedulers: epoch e gets
    schedule.lr_at(e + 1), the rate cf gives update e + 1 (one step() per update then matches
    schedule.apply(optimizer) before each optimizer.step()); or a function epoch -> rate."""

    def __init__(self, optimizer, schedule, last_epoch=-1):
        base_lr = _lr_of(optimizer, type(self))
        if isinstance(schedule, _cf.nn.LRSchedule):
            self._rate = lambda epoch, s=schedule: s.lr_at(epoch + 1)
        elif callable(schedule):
            self._rate = schedule
        else:
            raise TypeError("[%s] schedule must be a cf.nn.LRSchedule or a function epoch -> learning rate, got %s"
                            % (type(self).__name__, type(schedule).__name__))
        last_epoch = _integer(last_epoch, "last_epoch", type(self).__name__, -1)
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.last_epoch = last_epoch
        self._last_lr = optimizer.lr
        self.step()

    def get_last_lr(self):
        """Each parameter group's rate after the last step(): the optimizer's lr the step set, times the
        group's lr_scale."""
        return [self._last_lr * g["lr_scale"] for g in self.optimizer.param_groups]

    def step(self, epoch=None):
        """Moves to the next epoch (or to `epoch`, PyTorch's deprecated form) and sets the optimizer's lr to
        its rate."""
        if epoch is None:
            self.last_epoch += 1
        else:
            self.last_epoch = _integer(epoch, "epoch", type(self).__name__, 0)
        self._apply()

    def _apply(self):
        lr = float(self._rate(self.last_epoch))
        self.optimizer.lr = lr
        self._last_lr = lr

    def state_dict(self):
        """{"last_epoch": ..., "base_lr": ...}: what load_state_dict needs to resume (the rates are functions
        of the epoch)."""
        return {"last_epoch": self.last_epoch, "base_lr": self.base_lr}

    def load_state_dict(self, state_dict):
        """Resumes at the saved epoch and sets the optimizer's lr to its rate."""
        for key in ("last_epoch", "base_lr"):
            if key not in state_dict:
                raise KeyError("[%s.load_state_dict] missing key %r (has: %s)"
                               % (type(self).__name__, key, ", ".join(map(str, state_dict))))
        if state_dict["base_lr"] != self.base_lr:
            raise _cf.ValueError("[%s.load_state_dict] saved with base lr %r, this scheduler has %r: build it on an "
                                 "optimizer with the saved run's lr" % (type(self).__name__, state_dict["base_lr"],
                                                                         self.base_lr))
        self.last_epoch = int(state_dict["last_epoch"])
        self._apply()


class LambdaLR(LRScheduler):
    """lr of epoch e = base lr * lr_lambda(e)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        if not callable(lr_lambda):
            raise TypeError("[LambdaLR] lr_lambda must be a function epoch -> factor, got %s"
                            % type(lr_lambda).__name__)
        base = _lr_of(optimizer, LambdaLR)
        super().__init__(optimizer, lambda epoch: base * lr_lambda(epoch), last_epoch)


class StepLR(LRScheduler):
    """lr * gamma^floor(e / step_size) (cf.nn.StepLR)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        step_size = _integer(step_size, "step_size", "StepLR", 1)
        super().__init__(optimizer, _cf.nn.StepLR(_lr_of(optimizer, StepLR), step_size, gamma), last_epoch)


class ExponentialLR(LRScheduler):
    """lr * gamma^e (cf.nn.StepLR with step_size 1)."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        super().__init__(optimizer, _cf.nn.StepLR(_lr_of(optimizer, ExponentialLR), 1, gamma), last_epoch)


class MultiStepLR(LRScheduler):
    """lr * gamma^(number of milestones <= e); milestones are epochs, in any order (one repeated twice
    counts twice)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        milestones = sorted(_integer(m, "a milestone", "MultiStepLR", 0) for m in milestones)
        base = _lr_of(optimizer, MultiStepLR)
        super().__init__(optimizer, lambda epoch: base * gamma ** _bisect.bisect_right(milestones, epoch),
                         last_epoch)


class CosineAnnealingLR(LRScheduler):
    """eta_min + (lr - eta_min) (1 + cos(pi e / T_max)) / 2 for e <= T_max, then eta_min (cf.nn.WarmupCosineLR
    without warmup). PyTorch's rate climbs back along the cosine after T_max; cf's stays at eta_min. With
    several parameter groups eta_min is the optimizer's lr floor, which each group scales by its lr_scale."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        T_max = _integer(T_max, "T_max", "CosineAnnealingLR", 1)
        schedule = _cf.nn.WarmupCosineLR(_lr_of(optimizer, CosineAnnealingLR), 0, T_max, eta_min)
        # epoch e is the cosine's step e (its step 0 is the peak), not update e + 1 as LRScheduler reads cf's
        super().__init__(optimizer, lambda epoch: schedule.lr_at(epoch), last_epoch)


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR's cosine with warm restarts, as PyTorch's CosineAnnealingWarmRestarts: eta_min + (lr - eta_min)
    (1 + cos(pi T_cur / T_i)) / 2, where T_cur counts the epochs since the last restart (back at lr) and the
    cycles last T_i = T_0, T_0 T_mult, T_0 T_mult^2, ... epochs. step(epoch) also takes a fractional epoch,
    to step once per batch (step(epoch + i / batches_per_epoch)); a step() after it moves one epoch on from
    there, and last_epoch is the epoch's floor. With several parameter groups eta_min is the optimizer's lr
    floor, which each group scales by its lr_scale."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        T_0 = _integer(T_0, "T_0", "CosineAnnealingWarmRestarts", 1)
        T_mult = _integer(T_mult, "T_mult", "CosineAnnealingWarmRestarts", 1)
        eta_min = _finite(eta_min, "eta_min", "CosineAnnealingWarmRestarts")
        base = _lr_of(optimizer, CosineAnnealingWarmRestarts)
        self.T_0, self.T_mult, self.eta_min = T_0, T_mult, eta_min
        self._fraction = 0  # the epoch past last_epoch, in [0, 1), that a fractional step(epoch) left

        def rate(epoch):
            t_cur, t_i = self._cycle(epoch)
            return eta_min + (base - eta_min) * (1 + _math.cos(_math.pi * t_cur / t_i)) / 2

        super().__init__(optimizer, rate, last_epoch)

    def _cycle(self, epoch):
        """(T_cur, T_i) of an epoch >= 0, the closed form of PyTorch's count (exact for whole epochs, where
        PyTorch's step(epoch) takes the cycle from a floating-point logarithm)."""
        if self.T_mult == 1:
            return epoch % self.T_0, self.T_0
        start, length = 0, self.T_0
        while epoch >= start + length:
            start, length = start + length, length * self.T_mult
        return epoch - start, length

    def _epoch(self):
        return self.last_epoch + self._fraction if self._fraction else self.last_epoch

    @property
    def T_cur(self):
        """The epochs since the last restart (fractional after a fractional step(epoch))."""
        return self._cycle(self._epoch())[0]

    @property
    def T_i(self):
        """The length in epochs of the current cycle."""
        return self._cycle(self._epoch())[1]

    def step(self, epoch=None):
        """Moves one epoch on (from where a fractional step(epoch) left it too), or to `epoch`: a whole or
        fractional number >= 0, as PyTorch's (step(epoch + i / batches_per_epoch) once per batch); then sets the
        optimizer's lr to its rate."""
        if epoch is None:
            self.last_epoch += 1
        else:
            _finite(epoch, "epoch", "CosineAnnealingWarmRestarts", 0)
            if isinstance(epoch, _numbers.Integral):
                self.last_epoch, self._fraction = int(epoch), 0
            else:
                epoch = float(epoch)
                whole = _math.floor(epoch)
                self.last_epoch, self._fraction = int(whole), epoch - whole
        self._apply()

    def _apply(self):
        lr = float(self._rate(self._epoch()))
        self.optimizer.lr = lr
        self._last_lr = lr

    def state_dict(self):
        """{"last_epoch": ..., "base_lr": ..., "epoch_fraction": ...}: the fraction (0 unless the last
        step(epoch) was fractional) is the epoch past last_epoch."""
        state = super().state_dict()
        state["epoch_fraction"] = self._fraction
        return state

    def load_state_dict(self, state_dict):
        """Resumes at the saved epoch (an epoch_fraction missing from state_dict is 0) and sets the optimizer's lr
        to its rate."""
        fraction = state_dict.get("epoch_fraction", 0)
        if not isinstance(fraction, _numbers.Real) or isinstance(fraction, bool) or not 0 <= fraction < 1:
            raise _cf.ValueError("[CosineAnnealingWarmRestarts.load_state_dict] epoch_fraction must be in [0, 1), "
                                 "got %r" % (fraction,))
        saved, self._fraction = self._fraction, fraction
        try:
            super().load_state_dict(state_dict)
        except BaseException:
            self._fraction = saved
            raise


class LinearLR(LRScheduler):
    """lr * factor(e), the factor moving linearly from start_factor at epoch 0 to end_factor at total_iters and
    staying there (a linear warmup with the defaults' shape)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise _cf.ValueError("[LinearLR] start_factor must be in (0, 1] and end_factor in [0, 1], got %r and %r"
                                 % (start_factor, end_factor))
        total = _integer(total_iters, "total_iters", "LinearLR", 1)
        base = _lr_of(optimizer, LinearLR)
        super().__init__(optimizer, lambda epoch: base * (start_factor + (end_factor - start_factor)
                                                           * min(epoch, total) / total), last_epoch)


class ConstantLR(LRScheduler):
    """lr * factor for the first total_iters epochs, then lr (PyTorch's ConstantLR: a constant warmup)."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not isinstance(factor, _numbers.Real) or isinstance(factor, bool) or not 0 <= factor <= 1:
            raise _cf.ValueError("[ConstantLR] factor must be a number in [0, 1], got %r" % (factor,))
        total = _integer(total_iters, "total_iters", "ConstantLR", 1)
        base = _lr_of(optimizer, ConstantLR)
        self.factor, self.total_iters = factor, total
        super().__init__(optimizer, lambda epoch: base * (factor + (epoch >= total) * (1 - factor)), last_epoch)


class PolynomialLR(LRScheduler):
    """lr * (1 - min(e, total_iters) / total_iters)^power: down to 0 at epoch total_iters, then 0 (PyTorch's
    PolynomialLR; power may be fractional)."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        total = _integer(total_iters, "total_iters", "PolynomialLR", 1)
        power = _finite(power, "power", "PolynomialLR", 0)
        base = _lr_of(optimizer, PolynomialLR)
        self.total_iters, self.power = total, power
        super().__init__(optimizer, lambda epoch: base * (1.0 - min(total, epoch) / total) ** power, last_epoch)


class SequentialLR(LRScheduler):
    """schedulers[0] until epoch milestones[0], then schedulers[1] from its own epoch 0, and so on (PyTorch's
    SequentialLR; call this one's step() only). The schedulers must hold this optimizer."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        schedulers, milestones = list(schedulers), [_integer(m, "a milestone", "SequentialLR", 1) for m in milestones]
        if len(schedulers) != len(milestones) + 1:
            raise _cf.ValueError("[SequentialLR] %d schedulers need %d milestones, got %d"
                                 % (len(schedulers), len(schedulers) - 1, len(milestones)))
        if milestones != sorted(milestones):
            raise _cf.ValueError("[SequentialLR] milestones must increase, got %r" % (milestones,))
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler) or s.optimizer is not optimizer:
                raise _cf.ValueError("[SequentialLR] scheduler %d is not an LRScheduler of this optimizer" % i)
        starts = [0] + milestones

        def rate(epoch):
            k = _bisect.bisect_right(milestones, epoch)
            return schedulers[k]._rate(epoch - starts[k])

        self.schedulers, self.milestones = schedulers, milestones
        super().__init__(optimizer, rate, last_epoch)


class ReduceLROnPlateau:
    """Multiplies the optimizer's lr by factor when the metric given to step(metric) has not improved for
    patience epochs (PyTorch's ReduceLROnPlateau: mode "min" or "max", threshold relative or absolute,
    cooldown, min_lr; a reduction smaller than eps is skipped). min_lr floors the optimizer's one lr, which
    each group scales: a group with lr_scale < 1 goes below it (PyTorch floors each group)."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0.0, eps=1e-8):
        _lr_of(optimizer, ReduceLROnPlateau)
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise _cf.ValueError("[ReduceLROnPlateau] mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                                 "got %r and %r" % (mode, threshold_mode))
        if not 0 < factor < 1:
            raise _cf.ValueError("[ReduceLROnPlateau] factor must be in (0, 1), got %r" % (factor,))
        self.optimizer, self.mode, self.factor, self.threshold = optimizer, mode, factor, threshold
        self.patience = _integer(patience, "patience", "ReduceLROnPlateau", 0)
        self.cooldown = _integer(cooldown, "cooldown", "ReduceLROnPlateau", 0)
        self.threshold_mode, self.min_lr, self.eps = threshold_mode, min_lr, eps
        self.best = float("inf") if mode == "min" else float("-inf")
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0

    def _better(self, a):
        if self.mode == "min":
            return a < (self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold)
        return a > (self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold)

    def step(self, metrics):
        """Records one epoch's metric (a number or a one-element tensor) and reduces the lr on a plateau."""
        current = float(metrics.item() if isinstance(metrics, _cf.Tensor) else metrics)
        self.last_epoch += 1
        if self._better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            new_lr = max(self.optimizer.lr * self.factor, self.min_lr)
            if self.optimizer.lr - new_lr > self.eps:
                self.optimizer.lr = new_lr
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def get_last_lr(self):
        """Each parameter group's current rate."""
        return [g["lr"] for g in self.optimizer.param_groups]

    _STATE = ("best", "num_bad_epochs", "cooldown_counter", "last_epoch")

    def state_dict(self):
        """What resumes it: best, num_bad_epochs, cooldown_counter, last_epoch (the lr is the optimizer's)."""
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state_dict):
        """Resumes from state_dict()."""
        missing = [k for k in self._STATE if k not in state_dict]
        if missing:
            raise KeyError("[ReduceLROnPlateau.load_state_dict] missing keys %s" % missing)
        for k in self._STATE:
            setattr(self, k, state_dict[k])


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith and Topin), as PyTorch's OneCycleLR, stepped once per batch: from
    max_lr / div_factor up to max_lr over the first pct_start of total_steps, then down to
    max_lr / div_factor / final_div_factor (three_phase: back to the start first, then down), along a cosine
    (anneal_strategy "cos") or a line ("linear"). total_steps, or epochs and steps_per_epoch. The optimizer's
    own lr is replaced (max_lr sets the scale). cf's optimizers cannot change their momentum while they run,
    so PyTorch's default cycle_momentum=True is refused: pass cycle_momentum=False (the rates are then
    PyTorch's; its momentum would have cycled between base_momentum and max_momentum against them)."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        _lr_of(optimizer, OneCycleLR)
        if cycle_momentum:
            raise _cf.ValueError("[OneCycleLR] cf's optimizers keep their momentum (betas) fixed: pass "
                                 "cycle_momentum=False")
        if not isinstance(max_lr, _numbers.Real) or isinstance(max_lr, bool) or not max_lr > 0:
            raise _cf.ValueError("[OneCycleLR] max_lr must be one positive number (cf's optimizer has one lr; "
                                 "groups scale it by lr_scale), got %r" % (max_lr,))
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise _cf.ValueError("[OneCycleLR] give total_steps, or epochs and steps_per_epoch")
            total_steps = (_integer(epochs, "epochs", "OneCycleLR", 1)
                           * _integer(steps_per_epoch, "steps_per_epoch", "OneCycleLR", 1))
        total = _integer(total_steps, "total_steps", "OneCycleLR", 1)
        if not 0 <= pct_start <= 1:
            raise _cf.ValueError("[OneCycleLR] pct_start must be in [0, 1], got %r" % (pct_start,))
        if anneal_strategy not in ("cos", "linear"):
            raise _cf.ValueError("[OneCycleLR] anneal_strategy must be 'cos' or 'linear', got %r"
                                 % (anneal_strategy,))
        initial = max_lr / div_factor
        final = initial / final_div_factor
        if three_phase:
            phases = [(float(pct_start * total) - 1, initial, max_lr),
                      (float(2 * pct_start * total) - 2, max_lr, initial),
                      (total - 1.0, initial, final)]
        else:
            phases = [(float(pct_start * total) - 1, initial, max_lr), (total - 1.0, max_lr, final)]

        def anneal(start, end, pct):
            if anneal_strategy == "cos":
                return end + (start - end) / 2.0 * (_math.cos(_math.pi * pct) + 1)
            return (end - start) * pct + start

        def rate(step):
            if step > total:  # (PyTorch's bound: one step() past the last step is still allowed)
                raise _cf.ValueError("[OneCycleLR] stepped %d times, past total_steps %d" % (step, total))
            begin = 0.0
            for i, (end_step, start_lr, end_lr) in enumerate(phases):
                if step <= end_step or i == len(phases) - 1:
                    span = end_step - begin
                    # (min: the one step() PyTorch allows past the last step keeps the final rate, where its
                    # extrapolation can go below zero)
                    return anneal(start_lr, end_lr, min((step - begin) / span, 1.0) if span != 0 else 1.0)
                begin = end_step

        self.total_steps = total
        super().__init__(optimizer, rate, last_epoch)
