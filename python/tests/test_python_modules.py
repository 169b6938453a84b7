"""Modules written in Python: classes deriving from cf.nn.Module or cf.nn.UnaryModule register what their
code assigns (python/src/python_module.cpp), as torch.nn.Module subclasses do."""
import gc
import threading
import weakref

import pytest

import cf
import cf.nn as nn


class Residual(nn.UnaryModule):
    def __init__(self, d, generator):
        super().__init__()
        self.fc = nn.Linear(d, d, generator=generator)
        self.gain = nn.Parameter(cf.full([d], 0.5))

    def forward(self, x):
        return x + cf.tanh(self.fc(x)) * self.gain


class Classifier(nn.Module):
    """Embeddings, a neural-clustering attention layer, residual blocks in a ModuleList, a learned scale, a
    running count (buffer) and a head: every kind of registration."""

    def __init__(self, vocab=12, d=8, classes=3, blocks=2, seed=0):
        super().__init__()
        g = cf.Generator(seed)
        self.embed = nn.Embedding(vocab, d, generator=g)
        self.attn = nn.MultiHeadAttention("neural-clustering", d_model=d, n_heads=2, clusters=2, generator=g)
        self.blocks = nn.ModuleList([Residual(d, g) for _ in range(blocks)])
        self.head = nn.Linear(d, classes, generator=g)
        self.temperature = nn.Parameter(cf.ones([1]))
        self.register_buffer("calls", cf.zeros([1]))
        self.register_buffer("scratch", cf.zeros([2]), persistent=False)
        self.name = "classifier"  # a plain attribute

    def forward(self, ids, mask=None):
        if self.training:
            self.calls = self.calls + 1  # a registered buffer takes a new value
        h = self.embed(ids)
        h = h + self.attn(h, key_padding_mask=mask)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(axis=1)) / self.temperature


def batch(seed=1, n=16, length=6):
    g = cf.Generator(seed)
    ids = cf.randint(0, 12, [n, length], generator=g)
    labels = cf.tensor([sum(row) % 3 for row in ids.tolist()], dtype=cf.int64)  # learnable from the tokens
    return ids, labels


def test_a_python_model_registers_what_it_assigns():
    m = Classifier()
    names = [n for n, _ in m.named_parameters()]
    # own parameters first, then each submodule in registration order (PyTorch's order)
    assert names[0] == "temperature" and names[1] == "embed.weight"
    assert names[-2:] == ["head.weight", "head.bias"]
    assert "blocks.1.gain" in names and "blocks.0.fc.weight" in names
    assert any(n.startswith("attn.") for n in names)
    keys = list(m.state_dict())
    assert keys[:2] == ["temperature", "calls"] and "scratch" not in keys
    assert [n for n, _ in m.named_buffers()][:2] == ["calls", "scratch"] and len(m.buffers()) >= 2
    assert [n for n, _ in m.named_children()] == ["embed", "attn", "blocks", "head"]
    assert m.children()[2] is m.blocks and m.modules()[0] is m and len(m.blocks) == 2
    assert m.blocks[0] is m.blocks[-2] and isinstance(m.blocks[1], Residual)
    assert [type(b) for b in m.blocks] == [Residual, Residual]
    # one object per parameter, read back from the module
    assert m.temperature is m.temperature and m.temperature.requires_grad and m.temperature.is_leaf
    assert set(map(id, m.parameters())) >= {id(m.temperature), id(m.blocks[0].gain)}
    assert m.name == "classifier" and not hasattr(m, "missing")
    assert m.num_parameters() == sum(p.numel() for p in m.parameters())


def train(m, ids, labels, steps):
    """Adam steps of m on one batch; the losses."""
    opt = nn.Adam(m, lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.cross_entropy(m(ids), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_python_model_trains_and_its_loss_falls():
    m = Classifier()
    ids, labels = batch()
    losses = train(m, ids, labels, 40)
    assert losses[-1] < 0.5 * losses[0], losses
    assert m.calls.item() == 40.0
    # every parameter was reached, the Python ones included
    assert m.temperature.grad is not None and m.blocks[1].gain.grad is not None


def test_state_dict_to_eval_and_checkpoints_see_python_modules(tmp_path):
    a, b = Classifier(seed=0), Classifier(seed=1)
    ids, _ = batch()
    a.eval()
    b.eval()
    assert not a.blocks[0].training and not a.blocks[0].fc.training and not a.attn.training
    assert a(ids).tolist() != b(ids).tolist()
    b.load_state_dict(a.state_dict())
    assert a(ids).tolist() == b(ids).tolist()
    path = str(tmp_path / "python_model.safetensors")
    nn.save_checkpoint(path, model=a, step=3)
    c = Classifier(seed=2).eval()
    c.load_state_dict(nn.load_checkpoint(path).model)
    assert c(ids).tolist() == a(ids).tolist()
    gain = a.blocks[0].gain
    a.to(cf.float64)
    assert a.blocks[0].gain is gain and gain.dtype == cf.float64 and a.calls.dtype == cf.float64
    assert a.head.weight.dtype == cf.float64


def test_gradients_through_a_python_forward_match_float64_finite_differences():
    block = Residual(3, cf.Generator(4))
    block.to(cf.float64)
    seq = nn.Sequential(block, nn.Tanh())  # Sequential (C++) calls the Python forward
    x = cf.randn([2, 3], dtype=cf.float64, generator=cf.Generator(5), requires_grad=True)
    params = seq.parameters()

    def f(inputs):
        seq.set_parameters(inputs[1:])
        try:
            return seq(inputs[0])
        finally:
            seq.set_parameters(params)

    r = cf.gradcheck(f, [x] + [p.detach().requires_grad_(True) for p in params])
    assert r.ok, r


def test_reassigning_registered_names():
    m = Classifier()
    old_head = m.head
    m.head = nn.Linear(8, 5)  # replaces the submodule, same name
    assert m.head is not old_head and m.head.out_features == 5
    assert [n for n, _ in m.named_children()][-1] == "head"
    m.temperature = nn.Parameter(cf.full([1], 2.0), requires_grad=False)
    assert m.temperature.tolist() == [2.0] and not m.temperature.requires_grad
    assert "temperature" in dict(m.named_parameters())
    m.temperature = None  # an empty slot, as a Linear without bias
    assert m.temperature is None and "temperature" not in dict(m.named_parameters())
    m.calls = cf.full([1], 7.0)
    assert m.state_dict()["calls"].tolist() == [7.0]
    # a plain attribute gives way to a registration of the same name (PyTorch's rule)
    m.extra = None
    m.extra = nn.Identity()
    assert "extra" in dict(m.named_children())
    m.register_parameter("bias", cf.zeros([3]))  # a plain tensor is taken as the parameter's value
    assert m.bias.requires_grad and "bias" in dict(m.named_parameters())
    m.layers = [nn.Linear(2, 2)]  # a plain list is a plain attribute, as in PyTorch: use ModuleList
    assert not any(n.startswith("layers") for n, _ in m.named_parameters())


def test_a_bare_module_is_a_container():
    m = nn.Module()
    m.fc = nn.Linear(2, 2)
    m.w = nn.Parameter(cf.ones([2]))
    assert [n for n, _ in m.named_parameters()] == ["w", "fc.weight", "fc.bias"]
    with pytest.raises(cf.NotImplementedError, match=r"^\[Module\] cf.nn.Module defines no forward"):
        m(cf.ones([2]))


def test_python_modules_are_freed_with_their_model():
    m = Classifier()
    block = weakref.ref(m.blocks[0])
    param = weakref.ref(m.blocks[0].gain)
    seq = nn.Sequential(Residual(2, cf.Generator(0)))
    inner = weakref.ref(seq[0])
    del m, seq
    gc.collect()
    cf.empty_cache()
    assert block() is None and param() is None and inner() is None


def test_a_python_forward_called_from_cpp_in_threads():
    # __call__ lets the GIL go; the C++ Sequential takes it back for the Python forward
    seq = nn.Sequential(Residual(4, cf.Generator(0)), nn.ReLU(), Residual(4, cf.Generator(1)))
    x = cf.randn([3, 4], generator=cf.Generator(2))
    want = seq(x).tolist()
    got, errors = [], []

    def run():
        try:
            for _ in range(20):
                got.append(seq(x).tolist())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 80 and all(g == want for g in got)


def test_bad_registrations_say_what_to_do():
    m = Classifier()
    with pytest.raises(TypeError, match=r"^\[Module\] 'temperature' is a parameter of .*Classifier: assign "
                                        r"cf.nn.Parameter\(tensor\) \(or None\), not a cf.Tensor"):
        m.temperature = cf.ones([1])
    with pytest.raises(TypeError, match=r"^\[Module\] 'head' is a submodule of .*: assign another cf.nn.Module"):
        m.head = cf.ones([1])
    with pytest.raises(cf.ValueError, match=r"^\[Module\] 'head' is a submodule of this module, not a parameter"):
        m.head = nn.Parameter(cf.ones([1]))
    with pytest.raises(cf.ValueError, match=r"^\[Module\] 'calls' is a buffer of this module, not a submodule"):
        m.calls = nn.Linear(1, 1)
    with pytest.raises(cf.ValueError, match=r"^\[Module\] cannot delete 'temperature'.*assign None"):
        del m.temperature
    with pytest.raises(cf.ValueError, match=r"^\[Module\] cannot register parameter 'forward' in .*Classifier: the "
                                            r"class has an attribute of that name"):
        m.forward = nn.Parameter(cf.ones([1]))
    with pytest.raises(cf.ValueError, match=r"^\[Module\] parameter name 'a.b' must not contain '.'"):
        m.register_parameter("a.b", cf.ones([1]))
    with pytest.raises(cf.DTypeError, match=r"^\[Module\] parameter 'ids' must be floating"):
        m.ids = nn.Parameter(cf.zeros([2], dtype=cf.int64))
    with pytest.raises(TypeError, match=r"^\[Module\] buffer 'b' takes a cf.Tensor or None, got list"):
        m.register_buffer("b", [1.0])
    with pytest.raises(TypeError, match=r"^\[Module\] submodule 's' takes a cf.nn.Module, got int"):
        m.register_module("s", 3)
    with pytest.raises(cf.ValueError, match=r"would make a cycle"):
        m.blocks[0].loop = m
    with pytest.raises(AttributeError, match=r"^'.*Classifier' object has no attribute 'nothing'"):
        m.nothing
    # the state dict's names are unchanged by the refusals above
    assert list(Classifier().state_dict()) == list(m.state_dict())


def test_what_a_python_class_cannot_do():
    class NoInit(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(1, 1)

    with pytest.raises(AttributeError, match=r"^\[Module\] cannot register submodule 'fc' before "
                                             r"cf.nn.Module.__init__\(\) ran: call super\(\).__init__\(\) first"):
        NoInit()

    class Head(nn.Linear):  # a C++ module's subclass adds methods, registers nothing
        def extra(self):
            return 1

    h = Head(2, 2)
    with pytest.raises(TypeError, match=r"^\[Module\] cannot register parameter 'p' in a .*Head: its parameters "
                                        r"and submodules are fixed in C\+\+"):
        h.p = nn.Parameter(cf.ones([1]))

    class WrongInit(nn.Linear):
        def __init__(self):
            nn.Module.__init__(self)  # would build the Python base in a Linear's storage

    with pytest.raises(TypeError, match=r"^\[Module\] cf.nn.Module.__init__ called on a .*WrongInit, which is a "
                                        r"cf.nn.Linear: call cf.nn.Linear.__init__"):
        WrongInit()

    class NoForward(nn.UnaryModule):
        pass

    with pytest.raises(cf.NotImplementedError, match=r"^\[UnaryModule\] .*NoForward defines no forward\(self, x\)"):
        nn.Sequential(NoForward())(cf.ones([1]))

    class NotATensor(nn.UnaryModule):
        def forward(self, x):
            return 3

    with pytest.raises(TypeError, match=r"^\[UnaryModule\] .*NotATensor.forward must return a cf.Tensor, got int"):
        nn.Sequential(NotATensor())(cf.ones([1]))

    class Raises(nn.UnaryModule):
        def forward(self, x):
            raise KeyError("from forward")

    with pytest.raises(KeyError, match=r"from forward"):  # the Python error crosses the C++ Sequential as it is
        nn.Sequential(Raises())(cf.ones([1]))

    with pytest.raises(TypeError, match=r"overrides __call__ of cf.nn.UnaryModule.*define forward"):
        class Called(nn.UnaryModule):  # noqa: F841
            def __call__(self, x):
                return x

    with pytest.raises(TypeError, match=r"^\[ModuleList\] takes cf.nn modules .*got int"):
        nn.ModuleList([nn.Identity(), 1])
    with pytest.raises(IndexError, match=r"^\[ModuleList\] index 2 out of range for 2 modules"):
        nn.ModuleList([nn.Identity(), nn.Identity()])[2]
    with pytest.raises(TypeError, match=r"cannot be copied or pickled"):
        import copy
        copy.deepcopy(Classifier())


def test_repr_prints_the_module_tree_with_shapes():
    m = Classifier(blocks=1)
    m.temperature = None
    text = repr(m)
    assert text.startswith("Classifier(\n  temperature None\n  buffer calls (1,)\n  buffer scratch (2,) (not saved)\n"
                           "  (embed): Embedding(weight (12, 8))\n  (attn): MultiHeadAttention(\n"), text
    assert "    (attention): NeuralClusteringAttention(centroids (2, 8), w_c (8, 8))\n  )\n" in text
    assert ("  (blocks): ModuleList(\n    (0): Residual(\n      gain (8,)\n"
            "      (fc): Linear(weight (8, 8), bias (8,))\n    )\n  )\n") in text
    assert text.endswith("  (head): Linear(weight (3, 8), bias (3,))\n)")
    assert repr(nn.Linear(2, 3, bias=False).to(cf.float64)) == "Linear(weight (3, 2) float64)"
    assert repr(nn.ReLU()) == "ReLU()"


def test_forward_recursion_extra_arguments_and_super_forward():
    class Recur(nn.UnaryModule):  # self(...) inside forward: nanobind took it for a call of the base
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2, generator=cf.Generator(0))
            self.depth = 0

        def forward(self, x, times=2):
            self.depth += 1
            if self.depth < times:
                x = self(self.fc(x), times=times)
            self.depth -= 1
            return x

    r = Recur()
    x = cf.ones([1, 2])
    assert r(x).tolist() == r.fc(x).tolist()
    assert r(x, times=3).tolist() == r.fc(r.fc(x)).tolist()  # extra arguments reach forward
    assert nn.Sequential(r)(x).tolist() == r(x).tolist()

    class Super(nn.UnaryModule):
        def forward(self, x):
            return super().forward(x)

    with pytest.raises(cf.NotImplementedError, match=r"^\[UnaryModule\] .*Super.forward reached "
                                                     r"cf.nn.UnaryModule's forward, which is abstract"):
        Super()(x)


def test_a_python_train_override_runs_under_its_parents_train():
    class Frozen(nn.UnaryModule):  # stays in eval mode (as torch's parent.train() calls each child's train)
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def train(self, on=True):
            return super().train(False)

        def forward(self, x):
            return self.drop(x)

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.frozen = Frozen()
            self.other = nn.Dropout(0.5)

    t = Top()
    t.train()
    assert t.training and t.other.training and not t.frozen.training and not t.frozen.drop.training
    t.eval()
    t.frozen.train()
    assert not t.frozen.training
    x = cf.ones([100])
    assert nn.Sequential(t.frozen).train()(x).tolist() == x.tolist()


def test_init_without_super_init_is_named_at_construction():
    class NoSuper(nn.UnaryModule):
        def __init__(self, k):
            self.k = k

        def forward(self, x):
            return x * self.k

    with pytest.raises(TypeError, match=r"^\[Module\] .*NoSuper.__init__ did not call super\(\).__init__\(\)"):
        NoSuper(2)

    class Fine(NoSuper):  # its own __init__ builds it; the base's then runs on a built instance
        def __init__(self):
            nn.UnaryModule.__init__(self)
            NoSuper.__init__(self, 3)

    assert Fine()(cf.ones([1])).tolist() == [3.0]


def test_buffers_keep_their_persistence_and_containers_take_what_they_should():
    m = nn.Module()
    m.register_buffer("transient", cf.zeros([1]), persistent=False)
    m.transient = cf.ones([1])  # a new value keeps the buffer outside the state dict
    assert "transient" not in m.state_dict() and m.transient.tolist() == [1.0]
    with pytest.raises(cf.ValueError, match=r"^\[Module\] buffer 'transient' is registered not persistent.*cannot "
                                            r"change"):
        m.register_buffer("transient", cf.zeros([1]))
    m.register_buffer("transient", cf.zeros([2]), persistent=False)
    assert m.transient.shape == (2,)
    with pytest.raises(TypeError, match=r"^\[Module\] submodule 'x' takes a cf.nn.Module, got NoneType"):
        m.register_module("x", None)
    ml = nn.ModuleList()
    with pytest.raises(TypeError, match=r"^\[ModuleList\] takes cf.nn modules .*got int"):
        ml.append(3)
    ml.extend([nn.Identity(), nn.ReLU(), nn.Tanh()])
    assert [type(x).__name__ for x in ml[1:]] == ["ReLU", "Tanh"] and len(ml[::2]) == 2
    with pytest.raises(TypeError, match=r"^\[Parameter\] data must be a cf.Tensor, got list"):
        nn.Parameter([1.0])
    with pytest.raises(TypeError, match=r"^\[Parameter\] data must be a cf.Tensor, got NoneType"):
        nn.Parameter(None)


def test_dir_children_and_modules_list_each_module_once():
    m = Classifier(blocks=1)
    names = dir(m)
    assert {"temperature", "calls", "blocks", "head", "forward", "name"} <= set(names)
    shared = nn.Linear(2, 2)
    m.a = shared
    m.b = shared
    assert [n for n, _ in m.named_children()][-2:] == ["a", "b"]
    assert sum(c is shared for c in m.children()) == 1 and sum(c is shared for c in m.modules()) == 1


def test_a_cycle_through_registered_submodules_is_collected():
    # the shared_ptrs holding a Python module's (and a Python-built ModuleList's) submodules were invisible to the
    # garbage collector: a child keeping its parent (or a bound method of it) was never freed
    class Child(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(cf.ones([256, 256]))

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.child = Child()
            self.child.on_step = self.forward  # child -> parent
            self.layers = nn.ModuleList([Child()])
            self.layers[0].owner = [self]  # through the ModuleList too

        def forward(self, x):
            return x

    refs = []
    for _ in range(3):
        p = Parent()
        refs += [weakref.ref(p), weakref.ref(p.child), weakref.ref(p.layers[0]),
                 weakref.ref(p.child.w)]
        del p
    gc.collect()
    cf.empty_cache()
    assert all(r() is None for r in refs)
    # a module still held from outside the cycle is kept, with its submodules
    p = Parent()
    child = p.child
    del p
    gc.collect()
    assert child.w.shape == (256, 256) and child.on_step.__self__.child is child


def test_a_leaf_that_requires_grad_is_the_parameter_itself():
    m = nn.Module()
    p = cf.randn([3], requires_grad=True, generator=cf.Generator(0))
    m.w = nn.Parameter(p)
    assert m.w is p  # an optimizer built on p steps the module's parameter
    opt = nn.SGD([p], lr=1.0)
    (m.w * 2).sum().backward()
    opt.step()
    assert m.state_dict()["w"].tolist() == p.tolist()
    q = cf.zeros([2])
    m.u = nn.Parameter(q)  # not a parameter yet: stored detached, q itself unchanged
    assert m.u is not q and m.u.requires_grad and not q.requires_grad
    m.f = nn.Parameter(p, requires_grad=False)  # a frozen copy: p keeps requiring grad
    assert p.requires_grad and not m.f.requires_grad
    m.register_parameter("v", p * 2)  # not a leaf: detached
    assert m.v.is_leaf and m.v.requires_grad


def test_pytorch_module_conveniences():
    m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert seen == ["Linear", "ReLU", "Linear", "Sequential"]  # children first, as PyTorch's
    assert m.double() is m and m[0].weight.dtype == cf.float64 and m.float()[2].bias.dtype == cf.float32
    assert m.cpu() is m and m.bfloat16()[0].weight.dtype == cf.bfloat16 and m.half()[0].weight.dtype == cf.float16
    m.float()
    assert m.requires_grad_(False) is m and not any(p.requires_grad for p in m.parameters())
    m.requires_grad_()
    m(cf.ones([1, 2])).sum().backward()
    m.zero_grad(set_to_none=False)  # zeroed in place
    assert m[0].weight.grad.tolist() == [[0.0, 0.0]] * 3
    m.zero_grad()
    assert m[0].weight.grad is None
    opt = nn.SGD(m, lr=0.1)
    m(cf.ones([1, 2])).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert m[2].bias.grad.tolist() == [0.0]
    keys = m.load_state_dict({"0.weight": cf.zeros([3, 2]), "extra": cf.ones([1])}, strict=False)
    assert keys.missing_keys == ["0.bias", "2.weight", "2.bias"] and keys.unexpected_keys == ["extra"]
    assert m.load_state_dict(m.state_dict()) == ([], [])
    with pytest.raises(TypeError, match=r"^\[load_state_dict\] got a pair of dicts, as cf.load_safetensors returns"):
        m.load_state_dict(({}, {}))
    r = cf.tensor([[1.0, 5.0], [7.0, 0.0]]).max(dim=1)  # PyTorch's named results
    assert r.values.tolist() == [5.0, 7.0] and r.indices.tolist() == [1, 0] and isinstance(r, cf.ValuesIndices)
    values, indices = cf.tensor([3.0, 1.0]).sort()
    assert values.tolist() == [1.0, 3.0] and cf.tensor([3.0, 1.0]).topk(1).indices.tolist() == [0]
    assert cf.is_grad_enabled() and nn.clip_grad_norm_(m, 1.0) >= 0.0


def test_review_findings_on_python_modules():
    calls = []

    class Logged(nn.UnaryModule):
        def train(self, on=True):
            calls.append(on)
            return super().train(on)

        def forward(self, x):
            return x

    m = Logged()
    m.train(False)  # the override ran twice: super().train dispatched to it once more
    m.eval()
    nn.Sequential(m).train()
    assert calls == [False, False, True] and m.training

    class SkipsInit(nn.Module):
        def __init__(self):
            pass

    class Inherits(SkipsInit):  # no __init__ of its own: the inherited one is checked too
        pass

    with pytest.raises(TypeError, match=r"did not call super\(\).__init__\(\)"):
        Inherits()
    o = nn.MemoryBankOptions(dim=3)
    with pytest.raises(TypeError, match="unhashable"):
        hash(o)
    c = cf.models.TransformerConfig.from_json({"vocab_size": 5})
    assert hash(c) == hash(cf.models.TransformerConfig.from_json({"vocab_size": 5}))


@pytest.mark.skipif(not cf.cuda.is_available(), reason="no CUDA device visible (cf.cuda.is_available() is False)")
def test_a_python_model_trains_on_cuda_as_on_the_cpu():
    cpu, gpu = Classifier(seed=3), Classifier(seed=3)
    assert gpu.cuda() is gpu and gpu.blocks[0].gain.device == cf.Device("cuda:0") and gpu.calls.device.is_cuda
    ids, labels = batch()
    on_cpu = train(cpu, ids, labels, 5)
    on_gpu = train(gpu, ids.to("cuda"), labels.to("cuda"), 5)
    assert on_gpu == pytest.approx(on_cpu, rel=1e-4, abs=1e-5)
    y = cf.tensor([1.0, -2.0], device="cuda")
    assert y[y > 0].tolist() == [1.0]  # the mask read back from the device


def test_module_dict_registers_its_entries_as_submodules():
    class Heads(cf.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = cf.nn.Linear(3, 4)
            self.heads = cf.nn.ModuleDict({"cls": cf.nn.Linear(4, 2), "reg": cf.nn.Linear(4, 1)})

        def forward(self, x, task):
            return self.heads[task](cf.relu(self.body(x)))

    m = Heads()
    keys = list(m.state_dict())
    assert keys == ["body.weight", "body.bias", "heads.cls.weight", "heads.cls.bias", "heads.reg.weight",
                    "heads.reg.bias"]
    d = m.heads
    assert len(d) == 2 and list(d) == ["cls", "reg"] and "cls" in d and "x" not in d
    assert d.keys() == ["cls", "reg"] and [n for n, _ in d.items()] == ["cls", "reg"]
    assert d["cls"] is d.values()[0]
    d.update([("aux", cf.nn.Linear(4, 3))])
    assert "heads.aux.weight" in m.state_dict() and len(list(m.parameters())) == 8
    d["aux"] = cf.nn.Linear(4, 5)  # replaced: the new module's parameters
    assert m.state_dict()["heads.aux.weight"].shape == (5, 4)
    # the entries train with the model
    opt = cf.nn.SGD(m.parameters(), lr=0.1)
    before = cf.clone(d["reg"].weight.detach())
    m(cf.randn([5, 3]), "reg").sum().backward()
    opt.step()
    assert not cf.equal(before, d["reg"].weight.detach())
    assert "ModuleDict" in repr(m) and "(cls): Linear" in repr(m)
    with pytest.raises(KeyError, match=r"\[ModuleDict\] no module named 'nope' \(names: cls, reg, aux\)"):
        d["nope"]
    with pytest.raises(TypeError, match=r"^\[ModuleDict\] an entry cannot be removed \('cls'\)"):
        del d["cls"]
    with pytest.raises(TypeError, match=r"^\[ModuleDict\] an entry cannot be removed"):
        d.pop("cls")
    with pytest.raises(KeyError, match=r"\[ModuleDict\] 'forward' names an attribute of ModuleDict"):
        d["forward"] = cf.nn.Linear(1, 1)
    with pytest.raises(TypeError, match=r"^\[ModuleDict\] names are strings, got int"):
        d[3] = cf.nn.Linear(1, 1)
    with pytest.raises(TypeError, match=r"^\[ModuleDict\] update takes a dict or \(name, module\) pairs; item 0"):
        d.update(["abc"])
    # a round trip through a state dict
    m2 = Heads()
    m2.heads["aux"] = cf.nn.Linear(4, 5)
    m2.load_state_dict(m.state_dict())
    assert cf.equal(m2.heads["aux"].weight, d["aux"].weight)
