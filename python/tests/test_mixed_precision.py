"""Mixed precision from Python: cf.autocast (as torch.autocast) and cf.nn.GradScaler."""
import math

import pytest

import cf


def test_autocast_runs_matmul_in_16_bits_and_statistics_in_float32():
    a = cf.randn([4, 8], generator=cf.Generator(0))
    b = cf.randn([8, 3], generator=cf.Generator(1))
    assert cf.autocast_dtype() is None
    with cf.autocast(cf.bfloat16):
        assert cf.autocast_dtype() == cf.bfloat16
        y = cf.matmul(a, b)
        assert y.dtype == cf.bfloat16
        assert cf.softmax(y, -1).dtype == cf.float32  # statistics in float32
        with cf.autocast(enabled=False):  # nested: off inside, restored after
            assert cf.matmul(a, b).dtype == cf.float32
        assert cf.autocast_dtype() == cf.bfloat16
        with cf.autocast(cf.float16):
            assert cf.matmul(a, b).dtype == cf.float16
    assert cf.autocast_dtype() is None
    # float64 work keeps its precision (PyTorch's rule)
    with cf.autocast():
        assert cf.matmul(cf.to(a, cf.float64), cf.to(b, cf.float64)).dtype == cf.float64
    ref = cf.matmul(a, b).tolist()
    got = cf.to(y, cf.float32).tolist()
    assert all(abs(g - r) <= 0.02 * (1 + abs(r)) for gr, rr in zip(got, ref) for g, r in zip(gr, rr))


def test_autocast_decorator_and_errors():
    @cf.autocast(cf.float16)
    def f(a, b):
        return cf.matmul(a, b)

    assert f(cf.ones([2, 2]), cf.ones([2, 2])).dtype == cf.float16
    assert cf.autocast_dtype() is None
    with pytest.raises(cf.DTypeError, match=r"\[autocast\] autocast runs in bfloat16 or float16"):
        with cf.autocast(cf.float32):
            pass
    assert cf.autocast_dtype() is None  # a refused dtype changes nothing
    # torch.autocast's spelling: the device type first (it picks the default dtype: float16 for cuda, as torch's)
    for ctx, want in ((cf.autocast("cuda"), cf.float16), (cf.autocast("cpu"), cf.bfloat16),
                      (cf.autocast(device_type="cpu", dtype=cf.float16), cf.float16),
                      (cf.autocast("cuda", enabled=False), None), (cf.autocast("cpu", dtype=cf.float16), cf.float16),
                      (cf.autocast("cuda", cf.bfloat16), cf.bfloat16), (cf.autocast(cf.float16, True), cf.float16),
                      (cf.autocast(cf.float16, False), None), (cf.autocast(dtype=cf.float16), cf.float16)):
        with ctx:
            assert cf.autocast_dtype() == want
    with pytest.raises(ValueError, match=r'^\[autocast\] device_type must be "cpu" or "cuda", got \'gpu\''):
        cf.autocast("gpu")
    with pytest.raises(TypeError, match=r"^\[autocast\] dtype given twice"):
        cf.autocast(cf.float16, cf.bfloat16)
    # torch.amp's names
    from cf.amp import GradScaler, autocast
    assert autocast is cf.autocast
    s = GradScaler("cuda", init_scale=1024.0)
    assert isinstance(s, cf.nn.GradScaler) and s.get_scale() == 1024.0 and GradScaler().get_scale() == 65536.0
    with pytest.raises(cf.ValueError, match=r"^\[GradScaler\] device must be \"cuda\" or \"cpu\""):
        GradScaler(1024.0)


def test_grad_scaler_scales_skips_overflow_and_adapts():
    w = cf.tensor([1.0, -2.0], requires_grad=True)
    opt = cf.nn.SGD({"w": w}, lr=0.1)
    scaler = cf.nn.GradScaler(init_scale=1024.0, growth_interval=2)
    loss = cf.sum(w * w)
    scaled = scaler.scale(loss)
    assert scaled.item() == pytest.approx(1024.0 * 5.0)
    scaled.backward()
    assert scaler.step(opt)  # unscaled gradient 2w: w -= 0.1 * 2w
    assert w.tolist() == pytest.approx([0.8, -1.6])
    scaler.update()
    # An overflowing step is skipped and the scale backs off.
    opt.zero_grad()
    cf.sum(w * cf.tensor([math.inf, 1.0])).backward()
    assert not scaler.step(opt)
    assert scaler.found_inf
    assert w.tolist() == pytest.approx([0.8, -1.6])
    scaler.update()
    assert scaler.get_scale() == 512.0
    # Two clean steps in a row grow it again.
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(cf.sum(w * w)).backward()
        assert scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 1024.0 and scaler.growth_tracker == 0
    state = scaler.state_dict()
    # the growth schedule too, as torch.amp.GradScaler's state_dict
    assert sorted(state) == ["backoff_factor", "growth_factor", "growth_interval", "growth_tracker", "scale"]
    assert state["growth_interval"].item() == 2 and state["growth_factor"].item() == 2.0
    other = cf.nn.GradScaler(growth_interval=50)
    other.load_state_dict(state)
    assert other.get_scale() == 1024.0 and other.state_dict()["growth_interval"].item() == 2
    with pytest.raises(cf.ValueError, match="GradScaler"):
        other.load_state_dict({"scale": cf.tensor(-1.0, dtype=cf.float64)})
    # a second step() before update() is refused (before: it stepped with the gradient still x scale)
    opt.zero_grad()
    scaler.scale(cf.sum(w * w)).backward()
    scaler.step(opt)
    with pytest.raises(cf.ValueError, match=r"\[GradScaler.step\] already called for this optimizer"):
        scaler.step(opt)
    assert cf.nn.GradScaler(enabled=False).get_scale() == 1.0  # as torch's


def test_grad_scaler_pickles_and_copies_between_steps_only():
    import copy
    import pickle
    w = cf.tensor([1.0, -2.0], requires_grad=True)
    opt = cf.nn.SGD({"w": w}, lr=0.1)
    scaler = cf.nn.GradScaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    cf.sum(w * cf.tensor([math.inf, 1.0])).backward()
    scaler.step(opt)
    # mid-step (after unscale_ or step, before update) a copy would unscale again: refused, as torch's
    for f in (lambda: pickle.dumps(scaler), lambda: copy.deepcopy(scaler)):
        with pytest.raises(cf.ValueError, match=r"^\[GradScaler\] can be pickled or copied between steps only"):
            f()
    scaler.update()
    for twin in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert twin is not scaler and twin.get_scale() == 64.0 and twin.enabled
        assert {k: v.item() for k, v in twin.state_dict().items()} == {k: v.item() for k, v in scaler.state_dict().items()}
    off = pickle.loads(pickle.dumps(cf.nn.GradScaler(enabled=False)))
    assert not off.enabled and off.get_scale() == 1.0
    # a subclass's own attributes come along (they were dropped: only the state dict and `enabled` travelled)
    from cf import amp
    amp_scaler = amp.GradScaler("cpu", init_scale=8.0)
    amp_scaler.note = "kept"
    for twin in (pickle.loads(pickle.dumps(amp_scaler)), copy.deepcopy(amp_scaler)):
        assert type(twin) is amp.GradScaler and twin.note == "kept" and twin.get_scale() == 8.0
    # a state pickled before (two items) still loads; a wrong one is named
    old = cf.nn.GradScaler.__new__(cf.nn.GradScaler)
    old.__setstate__((scaler.state_dict(), True))
    assert old.get_scale() == 64.0 and old.enabled
    with pytest.raises(cf.ValueError, match=r"^\[GradScaler.__setstate__\] expected \(state_dict, enabled"):
        cf.nn.GradScaler.__new__(cf.nn.GradScaler).__setstate__((1,))


def test_float16_training_with_autocast_and_scaler_lowers_the_loss():
    gen = cf.Generator(3)
    model = cf.nn.Linear(8, 1, generator=gen)
    x = cf.randn([64, 8], generator=gen)
    y = cf.matmul(x, cf.randn([8, 1], generator=gen))
    opt = cf.nn.Adam(model, lr=0.05)
    scaler = cf.nn.GradScaler(init_scale=2.0 ** 12)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        with cf.autocast(cf.float16):
            pred = model(x)
            loss = cf.mean(cf.square(cf.to(pred, cf.float32) - y))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses[::10]


def test_the_loss_scaler_goes_into_a_training_checkpoint(tmp_path):
    # the C++ checkpoint had a slot for it; from Python it could be neither written nor read,
    # so a float16 run resumed at the initial scale
    scaler = cf.nn.GradScaler(init_scale=256.0, growth_interval=3)
    w = cf.tensor([1.0], requires_grad=True)
    opt = cf.nn.SGD({"w": w}, lr=0.1)
    scaler.scale(cf.sum(w * w)).backward()
    scaler.step(opt)
    scaler.update()
    path = str(tmp_path / "run.ckpt")
    cf.nn.save_checkpoint(path, model={"w": w}, optimizer=opt, step=1, scaler=scaler)
    ck = cf.nn.load_checkpoint(path)
    resumed = cf.nn.GradScaler()
    resumed.load_state_dict(ck.scaler)
    assert resumed.get_scale() == 256.0 and resumed.growth_tracker == 1
    cf.nn.save_checkpoint(path, model={"w": w}, scaler=scaler.state_dict())
    assert cf.nn.load_checkpoint(path).scaler["growth_tracker"].item() == 1
    cf.nn.save_checkpoint(path, model={"w": w})
    assert cf.nn.load_checkpoint(path).scaler == {}


def test_16_bit_losses_lists_and_gradient_scaling_round_once():
    # (from a bug hunt) a float16 loss was scaled in float16, where the default scale 65536 is inf; it is
    # scaled in float32 now, as PyTorch's float32 scale tensor promotes it
    m = cf.nn.Linear(4, 3)
    m.to(cf.float16)
    loss = cf.mean(cf.square(m(cf.randn(5, 4).to(cf.float16))))
    scaled = cf.nn.GradScaler().scale(loss)
    assert scaled.dtype == cf.float32 and abs(scaled.item() - 65536.0 * loss.item()) <= 1e-6 * scaled.item()
    scaled.backward()  # into the float16 graph: 65536 * dloss, inf in float16 (PyTorch's first step skips too)
    assert m.weight.grad.dtype == cf.float16
    # lists rounded once from their float64 (or exact int) values: through float32 65519.999 became inf
    assert cf.tensor([65519.999], dtype=cf.float16).tolist() == [65504.0]
    assert cf.tensor([1 + 2 ** -8 + 2 ** -30], dtype=cf.bfloat16).tolist() == [1.0078125]
    assert cf.tensor([2 ** 24 + 2 ** 16 + 1], dtype=cf.bfloat16).tolist() == [16908288.0]
    assert cf.tensor([2 ** 60 + 1], dtype=cf.float32).tolist() == [float(2 ** 60)]
    t = cf.zeros([2], dtype=cf.float16)
    t[0:2] = [65519.999, 1.0]
    assert t.tolist() == [65504.0, 1.0]
    # scale_grads scales 16-bit gradients in float32 (1e5 is inf in float16)
    p = cf.zeros([2], dtype=cf.float16, requires_grad=True)
    (p * cf.tensor([1e-4, 2e-4]).to(cf.float16)).sum().backward()
    cf.nn.scale_grads([p], 1e5)
    assert p.grad.dtype == cf.float16 and [round(v, 1) for v in p.grad.tolist()] == [10.0, 20.0]
