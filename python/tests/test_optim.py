"""cf.optim (torch.optim's names) and cf.optim.lr_scheduler: schedulers bound to an optimizer."""
import math

import pytest

import cf
import cf.optim as optim
from cf.optim import lr_scheduler


def make_opt(lr=0.1):
    w = cf.randn([3], requires_grad=True)
    return w, optim.SGD([w], lr=lr)


def rates(sched, n):
    out = [sched.get_last_lr()[0]]
    for _ in range(n):
        sched.optimizer.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_cf_optim_names_are_cf_nn_classes():
    assert optim.SGD is cf.nn.SGD and optim.Adam is cf.nn.Adam and optim.AdamW is cf.nn.AdamW
    assert optim.Optimizer is cf.nn.Optimizer
    import cf.optim.lr_scheduler as ls
    assert ls is lr_scheduler


def test_schedulers_follow_pytorchs_epoch_formulas():
    _, opt = make_opt(0.1)
    got = rates(lr_scheduler.StepLR(opt, step_size=3, gamma=0.5), 7)
    assert got == pytest.approx([0.1 * 0.5 ** (e // 3) for e in range(8)])
    assert opt.lr == pytest.approx(got[-1])
    _, opt = make_opt(0.2)
    assert rates(lr_scheduler.ExponentialLR(opt, 0.9), 4) == pytest.approx([0.2 * 0.9 ** e for e in range(5)])
    _, opt = make_opt(1.0)
    assert rates(lr_scheduler.MultiStepLR(opt, [2, 5], 0.1), 6) == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.01, 0.01])
    _, opt = make_opt(1.0)
    got = rates(lr_scheduler.CosineAnnealingLR(opt, T_max=8, eta_min=0.1), 10)
    want = [0.1 + 0.9 * (1 + math.cos(math.pi * e / 8)) / 2 for e in range(9)] + [0.1, 0.1]
    assert got == pytest.approx(want)  # PyTorch climbs back after T_max; cf stays at eta_min
    _, opt = make_opt(0.5)
    assert rates(lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (e + 1)), 3) == pytest.approx([0.5, 0.25, 0.5 / 3, 0.125])


def test_a_cf_schedule_stepped_per_update_gives_the_rates_apply_gives():
    schedule = cf.nn.WarmupCosineLR(0.01, 3, 10, 0.001)
    _, opt = make_opt(0.01)
    sched = lr_scheduler.LRScheduler(opt, schedule)
    _, opt2 = make_opt(0.01)
    for _ in range(12):
        assert opt.lr == pytest.approx(schedule.apply(opt2))  # the rate update number step_count + 1 gets
        opt.step()
        opt2.step()
        sched.step()


def test_scheduler_state_resumes_and_bad_input_is_named():
    _, opt = make_opt(0.1)
    sched = lr_scheduler.StepLR(opt, 2, 0.5)
    for _ in range(5):
        sched.step()
    state = sched.state_dict()
    assert state == {"last_epoch": 5, "base_lr": 0.1}
    _, opt2 = make_opt(0.1)
    resumed = lr_scheduler.StepLR(opt2, 2, 0.5)
    resumed.load_state_dict(state)
    assert resumed.last_epoch == 5 and opt2.lr == pytest.approx(0.1 * 0.25)
    resumed.step()
    sched.step()
    assert opt2.lr == pytest.approx(opt.lr)
    with pytest.raises(KeyError, match=r"\[StepLR.load_state_dict\] missing key 'base_lr'"):
        resumed.load_state_dict({"last_epoch": 1})
    _, opt3 = make_opt(0.3)
    with pytest.raises(cf.ValueError, match=r"^\[StepLR.load_state_dict\] saved with base lr 0.1, this scheduler"):
        lr_scheduler.StepLR(opt3, 2).load_state_dict(state)
    with pytest.raises(TypeError, match=r"^\[StepLR\] takes a cf optimizer \(cf.nn.SGD, Adam, AdamW\), got list"):
        lr_scheduler.StepLR([], 2)
    with pytest.raises(TypeError, match=r"^\[LRScheduler\] schedule must be a cf.nn.LRSchedule or a function"):
        lr_scheduler.LRScheduler(opt, 3)
    with pytest.raises(cf.ValueError, match=r"^\[MultiStepLR\] a milestone must be an integer >= 0, got 2.5"):
        lr_scheduler.MultiStepLR(opt, [5, 2.5])
    with pytest.raises(cf.ValueError, match=r"^\[LambdaLR\] last_epoch must be an integer >= -1"):
        lr_scheduler.LambdaLR(opt, lambda e: 1.0, last_epoch=-2)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingLR\] T_max must be an integer >= 1, got 0"):
        lr_scheduler.CosineAnnealingLR(opt, 0)


def test_review_findings_on_schedulers():
    import numpy as np
    # a second scheduler on the same optimizer starts from the first one's base lr (torch's initial_lr)
    _, opt = make_opt(0.1)
    warm = lr_scheduler.LambdaLR(opt, lambda e: min(1.0, e / 3))
    assert opt.lr == 0.0
    for _ in range(3):
        warm.step()
    main = lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    assert main.base_lr == 0.1 and opt.lr == pytest.approx(0.1)
    main.step()
    assert opt.lr == pytest.approx(0.05 * (1 + math.cos(math.pi / 6)))
    # unsorted (and NumPy) milestones, NumPy integers, step(epoch)
    _, opt = make_opt(1.0)
    sched = lr_scheduler.MultiStepLR(opt, np.array([5, 2]), gamma=0.5, last_epoch=np.int64(-1))
    sched.step(np.int64(6))
    assert sched.last_epoch == 6 and opt.lr == pytest.approx(0.25)
    # get_last_lr lists each group's rate
    w, b = cf.randn([2], requires_grad=True), cf.randn([2], requires_grad=True)
    opt = optim.SGD([{"params": [w]}, {"params": [b], "lr": 0.05}], lr=0.1)
    sched = lr_scheduler.StepLR(opt, 1, 0.5)
    sched.step()
    assert sched.get_last_lr() == pytest.approx([0.05, 0.025])


def test_param_groups_read_and_write_as_torch_optims():
    w, b = cf.randn([3], requires_grad=True), cf.randn([2], requires_grad=True)
    opt = optim.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0, "lr": 0.05}], lr=0.1,
                      weight_decay=0.01)
    groups = opt.param_groups
    assert len(groups) == 2 and isinstance(groups[0], cf.nn.ParamGroup)
    assert groups[0]["params"][0] is w and groups[1]["params"][0] is b
    assert groups[0]["lr"] == pytest.approx(0.1) and groups[1]["lr"] == pytest.approx(0.05)
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0 and opt.weight_decay == 0.01
    assert dict(groups[1])["lr_scale"] == pytest.approx(0.5) and set(groups[0]) == {"params", "lr", "lr_scale",
                                                                                    "weight_decay"}
    for g in opt.param_groups:  # the manual-warmup idiom
        g["lr"] = g["lr"] * 0.5
    assert opt.lr == 0.1 and [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.025])
    groups[0]["weight_decay"] = None  # back to the optimizer's
    groups[1]["weight_decay"] = 0.2
    assert groups[1]["weight_decay"] == 0.2
    # the written rates drive the update: SGD moves a parameter by exactly rate * gradient
    p = cf.zeros([1], dtype=cf.float64, requires_grad=True)
    sgd = optim.SGD([p], lr=0.1)
    sgd.param_groups[0]["lr"] = 0.3
    assert sgd.lr == pytest.approx(0.3)
    (p * 2.0).sum().backward()
    sgd.step()
    assert p.tolist() == pytest.approx([-0.6])
    with pytest.raises(KeyError, match=r"\[AdamW.param_groups\] a parameter group takes the keys params, lr, "
                                       r"lr_scale, weight_decay, not 'momentum'"):
        groups[0]["momentum"] = 0.9
    with pytest.raises(KeyError, match=r"\[AdamW.param_groups\] no key 'betas'"):
        groups[0]["betas"]
    with pytest.raises(TypeError, match=r"^\[AdamW.param_groups\] a group's params are fixed"):
        groups[0]["params"] = []
    with pytest.raises(cf.ValueError, match=r"^\[AdamW.set_group_lr_scale\] parameter group 1: lr_scale must be "
                                            r"finite and >= 0, got -1"):
        groups[1]["lr_scale"] = -1
    opt.lr = 0.0
    with pytest.raises(cf.ValueError, match=r"^\[AdamW.param_groups\] the optimizer's lr is 0"):
        groups[1]["lr"] = 0.1



def test_linear_sequential_and_plateau_schedulers_follow_torch():
    torch = pytest.importorskip("torch")

    def torch_rates(make, n, metrics=None):
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        sched = make(opt, torch.optim.lr_scheduler)
        out = [opt.param_groups[0]["lr"]]
        for e in range(n):
            opt.step()
            sched.step(metrics[e]) if metrics else sched.step()
            out.append(opt.param_groups[0]["lr"])
        return out

    def cf_rates(make, n, metrics=None):
        _, opt = make_opt(0.1)
        sched = make(opt, lr_scheduler)
        out = [opt.lr]
        for e in range(n):
            opt.step()
            sched.step(metrics[e]) if metrics else sched.step()
            out.append(opt.lr)
        return out

    linear = lambda opt, ls: ls.LinearLR(opt, start_factor=0.25, end_factor=1.0, total_iters=4)  # noqa: E731
    assert cf_rates(linear, 7) == pytest.approx(torch_rates(linear, 7))
    if hasattr(torch.optim.lr_scheduler, "SequentialLR"):
        seq = lambda opt, ls: ls.SequentialLR(  # noqa: E731
            opt, [ls.LinearLR(opt, 0.1, 1.0, 3), ls.ExponentialLR(opt, 0.5)], milestones=[3])
        assert cf_rates(seq, 8) == pytest.approx(torch_rates(seq, 8))
    metrics = [5, 4, 4, 4, 4, 3.99999, 4, 4, 4, 2, 2, 2, 2, 2, 2]
    plateau = lambda opt, ls: ls.ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1)  # noqa: E731
    assert cf_rates(plateau, len(metrics), metrics) == pytest.approx(torch_rates(plateau, len(metrics), metrics))
    up = lambda opt, ls: ls.ReduceLROnPlateau(opt, mode="max", patience=0, threshold=0.1,  # noqa: E731
                                              threshold_mode="abs", min_lr=0.02)
    ups = [1, 1.05, 1.2, 1.2, 1.2, 1.2, 1.2]
    assert cf_rates(up, len(ups), ups) == pytest.approx(torch_rates(up, len(ups), ups))


def test_new_schedulers_check_their_arguments_and_resume():
    _, opt = make_opt(0.1)
    with pytest.raises(cf.ValueError, match=r"^\[LinearLR\] start_factor must be in \(0, 1\]"):
        lr_scheduler.LinearLR(opt, start_factor=0.0)
    with pytest.raises(cf.ValueError, match=r"^\[SequentialLR\] 2 schedulers need 1 milestones, got 0"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 1), lr_scheduler.StepLR(opt, 1)], [])
    _, other = make_opt(0.1)
    with pytest.raises(cf.ValueError, match=r"^\[SequentialLR\] scheduler 0 is not an LRScheduler of this optimizer"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(other, 1)], [])
    with pytest.raises(cf.ValueError, match=r"^\[ReduceLROnPlateau\] factor must be in \(0, 1\), got 1.5"):
        lr_scheduler.ReduceLROnPlateau(opt, factor=1.5)
    plateau = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    plateau.step(cf.tensor(3.0))
    plateau.step(4.0)
    assert opt.lr == pytest.approx(0.01) and plateau.get_last_lr() == pytest.approx([0.01])
    again = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    again.load_state_dict(plateau.state_dict())
    assert again.best == 3.0 and again.last_epoch == 2
    with pytest.raises(KeyError, match=r"\[ReduceLROnPlateau.load_state_dict\] missing keys \['best'"):
        again.load_state_dict({})


def test_reduce_on_plateau_names_bad_modes():
    _, opt = make_opt(0.1)
    with pytest.raises(cf.ValueError, match=r"^\[ReduceLROnPlateau\] mode must be 'min' or 'max'"):
        lr_scheduler.ReduceLROnPlateau(opt, mode="lowest")
    with pytest.raises(cf.ValueError, match=r"^\[ReduceLROnPlateau\] patience must be an integer >= 0, got -1"):
        lr_scheduler.ReduceLROnPlateau(opt, patience=-1)


def test_one_cycle_lr_follows_torch():
    torch = pytest.importorskip("torch")

    def torch_rates(n, **kw):
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.5)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, cycle_momentum=False, **kw)
        out = [opt.param_groups[0]["lr"]]
        for _ in range(n):
            opt.step()
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return out

    def cf_rates(n, **kw):
        _, opt = make_opt(0.5)
        sched = lr_scheduler.OneCycleLR(opt, cycle_momentum=False, **kw)
        out = [opt.lr]
        for _ in range(n):
            opt.step()
            sched.step()
            out.append(opt.lr)
        return out

    for kw in ({"max_lr": 0.1, "total_steps": 20},
               {"max_lr": 0.1, "total_steps": 17, "anneal_strategy": "linear", "pct_start": 0.25},
               {"max_lr": 2.0, "epochs": 3, "steps_per_epoch": 5, "three_phase": True, "div_factor": 10.0,
                "final_div_factor": 100.0}):
        total = kw.get("total_steps") or kw["epochs"] * kw["steps_per_epoch"]
        assert cf_rates(total - 1, **kw) == pytest.approx(torch_rates(total - 1, **kw), rel=1e-12)


def test_one_cycle_lr_bounds_and_errors():
    _, opt = make_opt(0.5)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10, cycle_momentum=False)
    assert opt.lr == pytest.approx(1.0 / 25)  # starts at max_lr / div_factor
    for _ in range(10):
        sched.step()
    assert opt.lr == pytest.approx(1.0 / 25 / 1e4)  # the step past the last keeps the final rate
    with pytest.raises(cf.ValueError, match=r"\[OneCycleLR\] stepped 11 times, past total_steps 10"):
        sched.step()
    with pytest.raises(cf.ValueError, match=r"\[OneCycleLR\].*cycle_momentum=False"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    with pytest.raises(cf.ValueError, match=r"\[OneCycleLR\] give total_steps"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0, epochs=3, cycle_momentum=False)
    with pytest.raises(cf.ValueError, match=r"\[OneCycleLR\] max_lr must be one positive number"):
        lr_scheduler.OneCycleLR(opt, max_lr=[1.0, 2.0], total_steps=10, cycle_momentum=False)
    with pytest.raises(cf.ValueError, match=r"\[OneCycleLR\] anneal_strategy"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10, cycle_momentum=False, anneal_strategy="exp")


def test_constant_polynomial_and_warm_restarts_follow_torch_and_resume():
    torch = pytest.importorskip("torch")
    import warnings

    def torch_rates(make, epochs):
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        sched = make(opt, torch.optim.lr_scheduler)
        out = [opt.param_groups[0]["lr"]]
        for e in epochs:
            opt.step()
            sched.step() if e is None else sched.step(e)
            out.append(opt.param_groups[0]["lr"])
        return out

    def cf_rates(make, epochs, resume_at=None):
        _, opt = make_opt(0.1)
        sched = make(opt, lr_scheduler)
        out = [opt.lr]
        for i, e in enumerate(epochs):
            if i == resume_at:  # a fresh optimizer and scheduler, resumed from the state dict
                state = sched.state_dict()
                _, opt = make_opt(0.1)
                sched = make(opt, lr_scheduler)
                sched.load_state_dict(state)
            opt.step()
            sched.step() if e is None else sched.step(e)
            out.append(opt.lr)
        return out

    steps = [None] * 35
    cases = [
        (lambda opt, ls: ls.ConstantLR(opt, factor=0.5, total_iters=4), steps),
        (lambda opt, ls: ls.ConstantLR(opt), steps),
        (lambda opt, ls: ls.ConstantLR(opt, factor=0.1, total_iters=1), steps),
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, T_0=5), steps),
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, 3, T_mult=2, eta_min=0.01), [None] * 40),
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, 1, T_mult=3, eta_min=0.001), [None] * 40),
        # once per batch (4 a epoch), step(epoch + i / 4); then step() after a fractional or a jumping step(epoch)
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, 2, T_mult=2, eta_min=0.005),
         [e + i / 4 for e in range(10) for i in range(4)]),
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, 3), [e + i / 7 for e in range(5) for i in range(7)]),
        (lambda opt, ls: ls.CosineAnnealingWarmRestarts(opt, 4, T_mult=2, eta_min=0.01),
         [None] * 5 + [2.5] + [None] * 10 + [26, None, None, 13.3] + [None] * 15),
    ]
    if hasattr(torch.optim.lr_scheduler, "PolynomialLR"):
        cases += [(lambda opt, ls: ls.PolynomialLR(opt, total_iters=4, power=1.0), steps),
                  (lambda opt, ls: ls.PolynomialLR(opt, total_iters=30, power=0.9), steps),
                  (lambda opt, ls: ls.PolynomialLR(opt, total_iters=10, power=2), steps)]
    if hasattr(torch.optim.lr_scheduler, "SequentialLR"):
        cases.append((lambda opt, ls: ls.SequentialLR(
            opt, [ls.ConstantLR(opt, 0.1, 3), ls.CosineAnnealingWarmRestarts(opt, 4, T_mult=2, eta_min=0.01)],
            milestones=[3]), [None] * 30))
    for make, epochs in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's step(epoch) deprecation warning
            want = torch_rates(make, epochs)
        for resume_at in (None, 13, 20):
            # (PyTorch's ConstantLR and PolynomialLR multiply the previous rate: the last bits can differ)
            assert cf_rates(make, epochs, resume_at) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_constant_polynomial_and_warm_restarts_closed_forms_and_errors():
    _, opt = make_opt(1.0)
    assert rates(lr_scheduler.ConstantLR(opt, factor=0.0, total_iters=2), 3) == [0.0, 0.0, 1.0, 1.0]  # torch: 1 / 0
    _, opt = make_opt(1.0)
    assert rates(lr_scheduler.PolynomialLR(opt, total_iters=4, power=0.5), 5) == pytest.approx(
        [1.0, 0.75 ** 0.5, 0.5 ** 0.5, 0.25 ** 0.5, 0.0, 0.0])
    _, opt = make_opt(1.0)
    sched = lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=2, eta_min=0.1)
    cosine = lambda t_cur, t_i: 0.55 + 0.45 * math.cos(math.pi * t_cur / t_i)  # noqa: E731
    want = [cosine(0, 2), cosine(1, 2)] + [cosine(t, 4) for t in range(4)] + [cosine(0, 8), cosine(1, 8)]
    assert rates(sched, 7) == pytest.approx(want)  # cycles of 2, 4, 8 epochs
    assert (sched.last_epoch, sched.T_cur, sched.T_i) == (7, 1, 8)
    sched.step(2.5)
    assert (sched.last_epoch, sched.T_cur, sched.T_i) == (2, 0.5, 4)
    assert opt.lr == pytest.approx(cosine(0.5, 4))
    state = sched.state_dict()
    assert state == {"last_epoch": 2, "base_lr": 1.0, "epoch_fraction": 0.5}
    sched.step()
    assert sched.T_cur == 1.5 and opt.lr == pytest.approx(cosine(1.5, 4))
    sched.load_state_dict({"last_epoch": 2, "base_lr": 1.0})  # no fraction: a whole epoch
    assert sched.T_cur == 0 and opt.lr == pytest.approx(1.0)
    sched.load_state_dict(state)
    assert sched.T_cur == 0.5
    # whole epochs are counted exactly: PyTorch's step(121) takes a logarithm, gets cycle 4 and eta_min
    _, opt = make_opt(0.1)
    sched = lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=1, T_mult=3)
    sched.step(121)  # 1 + 3 + 9 + 27 + 81: a restart
    assert opt.lr == 0.1 and (sched.T_cur, sched.T_i) == (0, 243)
    # last_epoch: the cycle of epoch last_epoch + 1 (PyTorch's count wraps once only)
    _, opt = make_opt(0.1)
    sched = lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5, last_epoch=12)
    assert sched.last_epoch == 13 and sched.T_cur == 3
    with pytest.raises(cf.ValueError, match=r"^\[ConstantLR\] factor must be a number in \[0, 1\], got 1.5"):
        lr_scheduler.ConstantLR(opt, factor=1.5)
    with pytest.raises(cf.ValueError, match=r"^\[ConstantLR\] total_iters must be an integer >= 1, got 0"):
        lr_scheduler.ConstantLR(opt, total_iters=0)
    with pytest.raises(cf.ValueError, match=r"^\[PolynomialLR\] total_iters must be an integer >= 1, got 2.5"):
        lr_scheduler.PolynomialLR(opt, total_iters=2.5)
    with pytest.raises(cf.ValueError, match=r"^\[PolynomialLR\] power must be a finite number >= 0, got -1"):
        lr_scheduler.PolynomialLR(opt, power=-1)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingWarmRestarts\] T_0 must be an integer >= 1, got 0"):
        lr_scheduler.CosineAnnealingWarmRestarts(opt, 0)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingWarmRestarts\] T_mult must be an integer >= 1, "
                                            r"got 1.5"):
        lr_scheduler.CosineAnnealingWarmRestarts(opt, 2, T_mult=1.5)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingWarmRestarts\] eta_min must be a finite number, "
                                            r"got nan"):
        lr_scheduler.CosineAnnealingWarmRestarts(opt, 2, eta_min=float("nan"))
    sched = lr_scheduler.CosineAnnealingWarmRestarts(opt, 2)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingWarmRestarts\] epoch must be a finite number >= 0, "
                                            r"got -0.5"):
        sched.step(-0.5)
    with pytest.raises(cf.ValueError, match=r"^\[CosineAnnealingWarmRestarts.load_state_dict\] epoch_fraction must "
                                            r"be in \[0, 1\), got 1.5"):
        sched.load_state_dict({"last_epoch": 1, "base_lr": 0.1, "epoch_fraction": 1.5})
    with pytest.raises(KeyError, match=r"\[CosineAnnealingWarmRestarts.load_state_dict\] missing key 'base_lr'"):
        sched.load_state_dict({"last_epoch": 1, "epoch_fraction": 0.5})
    assert sched.state_dict() == {"last_epoch": 0, "base_lr": 0.1, "epoch_fraction": 0}  # (unchanged)
