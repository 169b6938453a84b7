"""PyTorch interop: zero-copy DLPack both ways, and cf.torch.Attention as a
torch.nn.Module whose forward and backward run cf's kernels. Skipped, by name,
when torch does not import."""
import os
import sys
import time

import pytest

import cf

torch = pytest.importorskip("torch", reason="torch not importable: PyTorch interop tests skipped")
import cf.torch  # noqa: E402


def test_torch_from_dlpack_shares_memory():
    t = cf.arange(6, dtype=cf.float32).reshape([2, 3])
    tt = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    assert tt.data_ptr() == t.data_ptr() and tt.shape == (2, 3)
    tt[0, 0] = 9.0  # torch writes, cf sees
    assert t[0, 0].item() == 9.0
    t[1, 2] = -3.0  # cf writes, torch sees
    assert tt[1, 2].item() == -3.0
    tv = torch.from_dlpack(t.T)  # the protocol path, on a strided view
    assert tv.stride() == (1, 3) and tv[2, 1].item() == -3.0


def test_cf_tensor_of_a_torch_tensor_copies_its_values():
    # as torch.tensor(t) copies (before: torch's own "only one element tensors can be converted")
    x = torch.tensor([[1.5, 2.5]])
    c = cf.tensor(x)
    x[0, 0] = 9.0
    assert c.tolist() == [[1.5, 2.5]] and c.dtype == cf.float32
    assert cf.tensor(torch.tensor([1, 2]), dtype=cf.float64).tolist() == [1.0, 2.0]
    assert cf.tensor([torch.tensor(1.5), torch.tensor(2.0)]).tolist() == [1.5, 2.0]
    p = torch.nn.Parameter(torch.ones(2))  # requires grad: read through detach(), as torch.tensor(p) reads it
    assert cf.tensor(p).tolist() == [1.0, 1.0] and not cf.tensor(p).requires_grad


def test_cf_from_dlpack_of_torch_tensor_shares_memory():
    a = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    t = cf.from_dlpack(a)
    assert t.dtype == cf.float64 and t.data_ptr() == a.data_ptr()
    t[2, 3] = 100.0
    assert a[2, 3].item() == 100.0
    a[0, 0] = -1.0
    assert t[0, 0].item() == -1.0
    assert cf.from_dlpack(a[:, 1]).strides == (4,)
    try:
        assert cf.from_dlpack(torch.tensor([True, False])).dtype == cf.bool
    except RuntimeError as e:  # PyTorch 1.x: "Bool type is not supported by dlpack"
        assert "Bool" in str(e)
    del a
    assert t[2, 3].item() == 100.0  # cf keeps torch's memory alive


def make_pair(variant, **options):
    torch.manual_seed(0)
    layer = cf.torch.Attention(variant, d_model=16, n_heads=2, seed=3, aux_weights={}, **options)
    twin = cf.nn.MultiHeadAttention(variant, d_model=16, n_heads=2, generator=cf.Generator(3), **options)
    return layer, twin


@pytest.mark.parametrize("variant,options", [("full", {}), ("neural-clustering", {"clusters": 3})])
def test_attention_matches_cf_forward_and_gradients(variant, options):
    layer, twin = make_pair(variant, **options)
    x = torch.randn(2, 10, 16, requires_grad=True)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 8:] = True
    y = layer(x, key_padding_mask=mask)
    xc = cf.from_dlpack(x.detach()).detach().requires_grad_()
    mc = cf.tensor(mask.tolist())
    yc = twin(xc, key_padding_mask=mc)
    assert torch.allclose(y, torch.from_dlpack(yc.detach()), atol=1e-6)
    g = torch.randn(2, 10, 16)
    (y * g).sum().backward()
    cf.sum(yc * cf.from_dlpack(g)).backward()
    assert torch.allclose(x.grad, torch.from_dlpack(xc.grad), atol=1e-5)
    for (name, p), (cname, cp) in zip(layer.named_parameters(), twin.named_parameters()):
        if cp.grad is None:  # neural clustering's C and W^C learn only from the auxiliary losses (off here)
            assert p.grad is None, name
        else:
            assert torch.allclose(p.grad, torch.from_dlpack(cp.grad), atol=1e-5), (name, cname)


CAUSAL_VARIANTS = [("full", {}), ("neural-clustering", {"clusters": 3}), ("sparse", {"block_size": 4})]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant,options", CAUSAL_VARIANTS)
def test_attention_causal_matches_cf_forward_and_gradients(variant, options, causal):
    layer, twin = make_pair(variant, **options)
    params, cf_params = list(layer.named_parameters()), list(twin.named_parameters())
    # the same parameters, in the same order, and some: the zip below compares every one
    assert len(params) == len(cf_params) > 0
    assert [n for n, _ in params] == [n.replace(".", "_") for n, _ in cf_params]
    x = torch.randn(2, 10, 16, requires_grad=True)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 7:] = True
    y = layer(x, key_padding_mask=mask, causal=causal)
    xc = cf.from_dlpack(x.detach()).detach().requires_grad_()
    mc = cf.tensor(mask.tolist())
    yc = twin(xc, key_padding_mask=mc, causal=causal)
    assert torch.allclose(y, torch.from_dlpack(yc.detach()), atol=1e-6)
    with torch.no_grad():  # the flag reached cf: the other setting gives other outputs
        assert not torch.allclose(layer(x, key_padding_mask=mask, causal=not causal), y, atol=1e-3)
    g = torch.randn(2, 10, 16)
    (y * g).sum().backward()
    cf.sum(yc * cf.from_dlpack(g)).backward()
    assert torch.allclose(x.grad, torch.from_dlpack(xc.grad), atol=1e-5)
    compared = 0
    for (name, p), (cname, cp) in zip(params, cf_params):
        if cp.grad is None:  # neural clustering's C and W^C learn only from the auxiliary losses (off here)
            assert p.grad is None, name
        else:
            assert p.grad is not None and torch.allclose(p.grad, torch.from_dlpack(cp.grad), atol=1e-5), (name, cname)
            compared += 1
    assert compared >= 8  # at least the four projections' weights and biases


@pytest.mark.parametrize("variant,options", [("full", {}), ("sparse", {"block_size": 4})])
def test_causal_attention_reads_no_later_position(variant, options):
    # full attention and fixed sparse attention are strictly causal (README: a later token moves no earlier
    # output); LSH, routing, Cluster-Former and neural clustering choose an earlier query's keys from the
    # whole sequence, so a later token may change which past keys it reads: not probed here
    layer = cf.torch.Attention(variant, d_model=16, n_heads=2, seed=0, **options).eval()
    torch.manual_seed(1)
    x = torch.randn(2, 12, 16)
    y = layer(x, causal=True)
    y_open = layer(x)
    for j in (1, 5, 11):
        x2 = x.clone()
        x2[:, j] = 3.0 * torch.randn(2, 16)
        y2 = layer(x2, causal=True)
        assert torch.allclose(y2[:, :j], y[:, :j], rtol=0, atol=1e-6), j  # the past did not see position j
        assert not torch.allclose(y2[:, j], y[:, j], atol=1e-3), j  # position j itself did
        if j < 11:  # without causal, an earlier position sees the change (so the probe can tell)
            assert not torch.allclose(layer(x2)[:, :j], y_open[:, :j], atol=1e-4), j
        # and backward: the outputs before j send no gradient to positions j and later
        xg = x.clone().requires_grad_()
        layer(xg, causal=True)[:, :j].square().sum().backward()
        assert torch.count_nonzero(xg.grad[:, j:]) == 0, j
        assert xg.grad[:, :j].abs().sum() > 0, j


@pytest.mark.parametrize("variant,options", [("full", {}), ("neural-clustering", {"clusters": 2})])
def test_attention_gradcheck_in_float64_with_padding_and_causal(variant, options):
    layer = cf.torch.Attention(variant, d_model=8, n_heads=2, seed=1, **options).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 4:] = True
    mask[0, 0] = True  # query 0 of row 0 then has no key it may read under causal: zeros, still differentiable
    # tolerances tight enough that a gradient off by 0.1% fails (gradcheck's defaults let that pass)
    assert torch.autograd.gradcheck(lambda inp: layer(inp, key_padding_mask=mask), (x,), eps=1e-6, atol=1e-7,
                                    rtol=1e-5)
    assert torch.autograd.gradcheck(lambda inp: layer(inp, key_padding_mask=mask, causal=True), (x,), eps=1e-6,
                                    atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("variant,options,aux_params", [
    ("full", {}, set()),
    ("neural-clustering", {"clusters": 2, "mu": 0.5, "nu": 0.5}, {"attention_centroids", "attention_w_c"})])
def test_weight_gradients_match_finite_differences(variant, options, aux_params):
    # gradcheck above covers x; the parameters' gradients by central differences of a few entries of each
    # matrix, including the auxiliary losses' share (neural clustering: mu * L1 + nu * L2 enter the backward,
    # their value is last_aux_loss, so the loss differenced is the output's plus it; C and W^C learn from
    # them alone, and large weights make their share visible in the projections too)
    layer = cf.torch.Attention(variant, d_model=8, n_heads=2, seed=2, **options).double()
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 5:] = True
    g = torch.randn(2, 6, 8, dtype=torch.float64)

    def loss():
        return (layer(x, key_padding_mask=mask, causal=True) * g).sum().item() + layer.last_aux_loss

    (layer(x, key_padding_mask=mask, causal=True) * g).sum().backward()
    assert (layer.last_aux_loss != 0.0) == bool(aux_params)
    checked = []
    for name, p in layer.named_parameters():
        if p.dim() != 2:
            continue
        assert p.grad is not None, name
        for idx in ((0, 1), (p.shape[0] - 1, p.shape[1] - 2)):
            eps = 1e-6
            with torch.no_grad():
                orig = p[idx].item()
                p[idx] = orig + eps
                up = loss()
                p[idx] = orig - eps
                down = loss()
                p[idx] = orig
            fd = (up - down) / (2 * eps)
            assert abs(fd - p.grad[idx].item()) <= 1e-8 + 1e-5 * abs(fd), (name, idx, fd, p.grad[idx].item())
        checked.append(name)
    assert set(checked) == {"w_q_weight", "w_k_weight", "w_v_weight", "w_o_weight"} | aux_params, checked


def test_attention_gradcheck_in_float64():
    layer = cf.torch.Attention("neural-clustering", d_model=8, n_heads=2, seed=1, clusters=2).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp: layer(inp), (x,), eps=1e-6, atol=1e-5, rtol=1e-3)
    assert layer.last_aux_loss != 0.0  # clustering losses were added (mu, nu default 1e-3)


def test_aux_loss_in_the_loss_scales_its_gradients_with_the_loss():
    # Left out of the loss, the auxiliary losses enter the backward at weight 1 whatever the loss's scale
    # (a loss scaled by 1024 and unscaled gave W^C, which only they reach, 1/1024 of its gradient); added to it
    # (loss = task + attn.aux_loss) they scale with it.
    torch.manual_seed(0)
    layer = cf.torch.Attention("neural-clustering", d_model=8, n_heads=2, seed=1, clusters=2, mu=0.5, nu=0.5)
    x, g = torch.randn(2, 6, 8), torch.randn(2, 6, 8)

    def grads(loss_of):
        layer.zero_grad()
        loss_of(layer(x)).backward()
        return {n: p.grad.clone() for n, p in layer.named_parameters()}

    auto = grads(lambda y: (y * g).sum())
    layer(x)
    assert float(layer.aux_loss) == pytest.approx(layer.last_aux_loss) and layer.aux_loss.requires_grad
    added = grads(lambda y: (y * g).sum() + layer.aux_loss)
    scaled = grads(lambda y: 1024.0 * ((y * g).sum() + layer.aux_loss))
    auto_scaled = grads(lambda y: 1024.0 * (y * g).sum())
    for n in auto:
        torch.testing.assert_close(added[n], auto[n], rtol=1e-5, atol=1e-7, msg=n)
        torch.testing.assert_close(scaled[n] / 1024.0, auto[n], rtol=1e-4, atol=1e-6, msg=n)
    assert auto["attention_w_c"].abs().max() > 0
    torch.testing.assert_close(auto_scaled["attention_w_c"], auto["attention_w_c"])  # weight 1, as documented
    # A loss of the auxiliary losses alone reaches C and W^C only
    only = grads(lambda y: layer.aux_loss)
    assert only["w_q_weight"].abs().max() == 0 and only["attention_w_c"].abs().max() > 0
    # A variant without auxiliary losses: a zero aux_loss off the graph
    full = cf.torch.Attention("full", d_model=8, n_heads=2, seed=1)
    full(x)
    assert float(full.aux_loss) == 0.0 and not full.aux_loss.requires_grad


def test_parameters_are_torch_parameters_sharing_cf_memory():
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=1)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["w_q_weight", "w_q_bias", "w_k_weight", "w_k_bias", "w_v_weight", "w_v_bias", "w_o_weight",
                     "w_o_bias"]
    cfw = layer.cf_module.w_q.weight
    assert layer.w_q_weight.data_ptr() == cfw.data_ptr()
    with torch.no_grad():
        layer.w_q_weight.add_(1.0)  # an optimizer's in-place update is what cf computes with
    assert cfw[0, 0].item() == layer.w_q_weight[0, 0].item()
    sd = layer.state_dict()
    other = cf.torch.Attention("full", d_model=8, n_heads=2, seed=2)
    other.load_state_dict(sd)
    x = torch.randn(1, 4, 8)
    assert torch.allclose(layer(x), other(x))


def test_train_and_eval_reach_the_cf_module():
    # attention dropout acts in training only: eval() (and train(False) from a parent module) must reach cf
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0, dropout=0.5)
    x = torch.randn(1, 5, 8)
    assert layer.training and layer.cf_module.training
    assert not torch.equal(layer(x), layer(x))  # fresh weights dropped each call
    parent = torch.nn.Sequential(layer)
    assert parent.eval() is parent
    assert not layer.training and not layer.cf_module.training
    y = layer(x)
    assert torch.equal(y, layer(x))
    twin = cf.nn.MultiHeadAttention("full", d_model=8, n_heads=2, generator=cf.Generator(0), dropout=0.5).train(False)
    assert torch.allclose(y, torch.from_dlpack(twin(cf.from_dlpack(x)).detach()), atol=1e-6)
    assert layer.train() is layer and layer.cf_module.training


@pytest.mark.parametrize("variant,buffers", [
    ("routing", ["attention_centroids"]),
    ("cluster-former", ["attention_bank_memory", "attention_bank_centroids", "attention_bank_counters"])])
def test_state_dict_holds_cf_buffers(variant, buffers):
    # routing's centroids and Cluster-Former's memory bank change in training forwards; a PyTorch
    # checkpoint must carry them, or a reloaded model routes and attends differently
    layer = cf.torch.Attention(variant, d_model=8, n_heads=2, seed=0)
    x = torch.randn(2, 16, 8)
    for _ in range(3):
        layer(x)
    sd = layer.state_dict()
    assert all(b in sd for b in buffers)
    fresh = cf.torch.Attention(variant, d_model=8, n_heads=2, seed=1)
    assert any(not torch.equal(fresh.state_dict()[b], sd[b]) for b in buffers)  # the training moved them
    fresh.load_state_dict(sd)
    for b in buffers:
        assert torch.equal(fresh.state_dict()[b], sd[b]), b
    layer.eval()
    fresh.eval()
    assert torch.equal(layer(x), fresh(x))
    # strict loading names a missing buffer, and a wrong shape
    partial = {k: v for k, v in sd.items() if k != buffers[0]}
    with pytest.raises(RuntimeError, match="Missing key.*%s" % buffers[0]):
        fresh.load_state_dict(partial)
    fresh.load_state_dict(partial, strict=False)
    bad = dict(sd)
    bad[buffers[0]] = torch.zeros(3)
    with pytest.raises(RuntimeError, match="size mismatch for %s" % buffers[0]):
        fresh.load_state_dict(bad)


class _TapeSpy:
    """Stands in for a layer's bridge and keeps the last call's cf tape (the layer keeps none)."""

    def __init__(self, bridge):
        self.bridge, self.last = bridge, None

    def forward(self, *args):
        out, tape = self.bridge.forward(*args)
        self.last = tape
        return out, tape

    def __getattr__(self, name):
        return getattr(self.bridge, name)


def test_no_grad_inference_records_no_cf_graph():
    # under torch.no_grad() PyTorch asks for no backward, so cf keeps no graph (no saved tensors) for the call
    layer = cf.torch.Attention("neural-clustering", d_model=8, n_heads=2, seed=0, clusters=2).eval()
    spy = layer.__dict__["_bridge"] = _TapeSpy(layer._bridge)
    x = torch.randn(2, 6, 8)
    y = layer(x)
    assert spy.last.recorded and y.requires_grad
    with torch.no_grad():
        y0 = layer(x)
    assert not spy.last.recorded and not y0.requires_grad
    assert torch.equal(y0, y.detach())
    with torch.inference_mode():
        assert torch.equal(layer(x), y.detach())
    assert not spy.last.recorded
    # nor for a frozen layer on an input that needs no gradient; an input that does needs the graph
    layer.requires_grad_(False)
    assert torch.equal(layer(x), y.detach()) and not spy.last.recorded
    xg = x.clone().requires_grad_()
    layer(xg).sum().backward()
    assert spy.last.recorded and xg.grad is not None and layer.w_q_weight.grad is None


def test_the_layer_keeps_no_cf_graph_after_backward():
    # it kept the last call's tape: the whole cf graph stayed alive after PyTorch freed the call's ctx
    layer = cf.torch.Attention("neural-clustering", d_model=16, n_heads=2, seed=0, clusters=2)
    x = torch.randn(2, 32, 16, requires_grad=True)
    layer(x).sum().backward()
    x.grad = None
    base = cf.memory_stats().live_bytes  # after one step: the parameters' gradients are held by torch
    y = layer(x)
    y.sum().backward()
    del y
    x.grad = None
    assert cf.memory_stats().live_bytes <= base
    assert isinstance(layer.last_aux_loss, float) and layer.last_aux_loss != 0.0
    # the aux_loss of a call whose backward ran holds no graph (it kept the call's cf graph until the next call)
    assert layer.aux_loss.grad_fn is None and float(layer.aux_loss) == 0.0


def test_deepcopy_and_torch_save_of_the_module():
    import copy
    import io
    layer = cf.torch.Attention("routing", d_model=8, n_heads=2, seed=0)
    x = torch.randn(2, 16, 8)
    for _ in range(2):
        layer(x)  # moves the routing centroids (a cf buffer)
    layer.eval()
    twin = copy.deepcopy(layer)
    assert not twin.training and not twin.cf_module.training
    assert twin.w_q_weight.data_ptr() != layer.w_q_weight.data_ptr()
    assert twin.cf_module.w_q.weight.data_ptr() == twin.w_q_weight.data_ptr()  # cf aliases the copy's Parameters
    assert torch.equal(twin(x), layer(x))
    with torch.no_grad():
        twin.w_o_bias.add_(1.0)  # the copy is independent
    assert not torch.equal(twin(x), layer(x))
    buf = io.BytesIO()
    torch.save(layer.double(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)  # a whole module (PyTorch >= 2.6 loads weights only by default)
    assert loaded.w_q_weight.dtype == torch.float64
    assert torch.equal(loaded.state_dict()["attention_centroids"], layer.state_dict()["attention_centroids"])
    assert torch.equal(loaded(x.double()), layer(x.double()))


def test_parameters_get_gradients_after_to_double_deepcopy_and_requires_grad_changes():
    # before: PyTorch's conversions rebind cf to tensors imported without requires_grad, and every
    # parameter's .grad stayed None from then on (a model.to(device) froze the layer without a word)
    import copy
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    for made in (lambda: cf.torch.Attention("full", d_model=8, n_heads=2, seed=0).to("cpu").double(),
                 lambda: copy.deepcopy(cf.torch.Attention("full", d_model=8, n_heads=2, seed=0)).double()):
        layer = made()
        layer(x).sum().backward()
        twin = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0)
        twin.load_state_dict(layer.state_dict())
        twin = twin.double()  # the same weights through a second conversion
        for p in twin.parameters():
            p.grad = None
        twin(x).sum().backward()
        for (name, p), q in zip(layer.named_parameters(), twin.parameters()):
            assert p.grad is not None and torch.allclose(p.grad, q.grad), name
    # frozen, then thawed: cf follows PyTorch's flags at each call
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0).double()
    layer.w_q_weight.requires_grad_(False)
    layer(x.requires_grad_()).sum().backward()
    assert layer.w_q_weight.grad is None and layer.w_k_weight.grad is not None
    layer.w_q_weight.requires_grad_(True)
    layer(x).sum().backward()
    assert layer.w_q_weight.grad is not None


def test_a_second_derivative_through_the_layer_raises():
    # cf's backward is not recorded for a second one: with other layers on the path (a gradient
    # penalty), a double backward gave their part and silently a 0 for cf's; now it raises
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 6, 8, requires_grad=True)
    g, = torch.autograd.grad((lin(x) + layer(x)).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"\[cf.torch.Attention\] cf's backward is not differentiable"):
        g.square().sum().backward()
    # a loss linear in the layer's output: its incoming gradient needs no grad, and PyTorch's
    # once_differentiable then let the second derivative through with 0 for cf's part (wrong, silently)
    x = torch.randn(1, 3, 8, requires_grad=True)
    g, = torch.autograd.grad(layer(x).sum() + 0.5 * x.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"\[cf.torch.Attention\] cf's backward is not differentiable"):
        g.square().sum().backward()
    # create_graph alone, with no second derivative through cf's gradients, is fine
    g, = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    assert g.shape == x.shape and g.requires_grad


def _cf_buffer_views(layer):
    """cf's own buffer tensors (not the torch module's), as torch views."""
    return {name: torch.from_dlpack(t) for name, t in layer.cf_module.named_buffers()}


def test_cf_buffers_are_torch_buffers_sharing_cf_memory():
    layer = cf.torch.Attention("cluster-former", d_model=8, n_heads=2, seed=0, save_memory=False)
    # the bank's centroids are shared by all ranks: a torch buffer; its stored states and counters
    # are per rank: cf's own, in state_dict (the states only when save_memory)
    assert [n for n, _ in layer.named_buffers()] == ["attention_bank_centroids"]
    assert [k for k in layer.state_dict() if "bank" in k] == ["attention_bank_centroids", "attention_bank_counters"]
    for dtype_change in (None, "double"):
        if dtype_change:
            layer.double()
        cf_centroids = _cf_buffer_views(layer)["attention.bank.centroids"]
        assert layer.attention_bank_centroids.data_ptr() == cf_centroids.data_ptr()
    assert layer.attention_bank_centroids.dtype == torch.float64
    layer(torch.randn(2, 16, 8, dtype=torch.float64))  # a training forward stores 32 states
    assert layer.state_dict()["attention_bank_counters"][0].item() == 32
    # a tensor put in the buffer's slot (load_state_dict(assign=True), functional_call) is what cf reads
    routing = cf.torch.Attention("routing", d_model=8, n_heads=2, seed=0).eval()
    x = torch.randn(2, 16, 8)
    before = routing(x)
    routing.attention_centroids = torch.nn.functional.normalize(torch.randn_like(routing.attention_centroids), dim=-1)
    assert not torch.equal(routing(x), before)
    assert _cf_buffer_views(routing)["attention.centroids"].data_ptr() == routing.attention_centroids.data_ptr()


def test_each_call_backward_reaches_the_parameters_it_ran_with():
    # Two calls with different parameters (functional_call) before one backward: the bridge handed back the
    # gradients of the parameters bound at backward time, so the first call's parameters got none.
    from torch.nn.utils import stateless
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0)
    x = torch.randn(1, 3, 8)
    p1 = {k: v.detach().clone().requires_grad_() for k, v in layer.named_parameters()}
    p2 = {k: (2 * v.detach()).requires_grad_() for k, v in layer.named_parameters()}
    stateless.functional_call(layer, p1, (x,)).sum().backward()
    alone = {k: v.grad.clone() for k, v in p1.items()}
    for v in p1.values():
        v.grad = None
    y1 = stateless.functional_call(layer, p1, (x,))
    y2 = stateless.functional_call(layer, p2, (x,))
    (y1.sum() + y2.sum()).backward()
    for k, v in p1.items():
        assert v.grad is not None and torch.allclose(v.grad, alone[k]), k
    assert all(v.grad is not None for v in p2.values())
    assert all(p.grad is None for p in layer.parameters())  # the module's own took part in neither call


def test_an_inplace_write_between_forward_and_backward_is_refused():
    # cf reads x and the parameters through their PyTorch memory: a write after the forward (a reused input
    # buffer, an optimizer step between a retained forward and its backward) gave silently wrong gradients
    # (4.1 off for the parameters); PyTorch's version check refuses it now, as for its own layers
    layer = cf.torch.Attention("full", d_model=8, n_heads=2, seed=0).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    h = x * 1.0
    y = layer(h)
    with torch.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = layer(x)
    with torch.no_grad():
        layer.w_q_weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = layer(x)  # untouched: runs, and twice with retain_graph
    y.sum().backward(retain_graph=True)
    y.sum().backward()


def test_functional_call_and_construction_under_inference_mode():
    from torch.nn.utils import stateless
    layer = cf.torch.Attention("routing", d_model=8, n_heads=2, seed=0).eval()
    other = cf.torch.Attention("routing", d_model=8, n_heads=2, seed=1).eval()
    x = torch.randn(2, 16, 8)
    mine = layer(x)
    swapped = stateless.functional_call(layer, dict(other.named_parameters(), **dict(other.named_buffers())), (x,))
    assert torch.equal(swapped, other(x))  # cf ran with the given tensors
    assert torch.equal(layer(x), mine)  # and with the module's own again after
    import copy
    with torch.inference_mode():  # tensors made here have no version counter
        made = cf.torch.Attention("cluster-former", d_model=8, n_heads=2, seed=0)
        twin = copy.deepcopy(made)
        assert made.on_train_step() == 0 and twin.on_train_step() == 0
        assert torch.equal(made.eval()(x), twin.eval()(x))


def test_on_train_step_reclusters_the_memory_bank_and_counts_on_from_a_loaded_state():
    def make(seed):
        return cf.torch.Attention("cluster-former", d_model=8, n_heads=2, seed=seed, update_every=2, num_clusters=2,
                                  memory_size=64)
    x = torch.randn(2, 16, 8)
    a = make(0)
    centroids = a.attention_bank_centroids.clone()
    assert a(x) is not None and a.on_train_step() == 0  # step 1 of 2
    assert a(x) is not None and a.on_train_step() == 1  # step 2: K-Means on the stored states
    assert not torch.equal(a.attention_bank_centroids, centroids)
    for _ in range(3):
        a(x)
        a.on_train_step()
    assert a.state_dict()["attention_bank_counters"][2:].tolist() == [5, 2]  # steps, updates
    # a model that stepped twice loads a state of 5 steps: it counts on from 5 (before, from its
    # own cached 2, as PyTorch's write bypassed cf's version counters)
    b = make(1)
    for _ in range(2):
        b(x)
        b.on_train_step()
    b.load_state_dict(a.state_dict())
    assert b.on_train_step() == 1  # step 6: due
    assert b.state_dict()["attention_bank_counters"][2:].tolist() == [6, 3]
    assert cf.torch.Attention("routing", d_model=8, n_heads=2, seed=0).on_train_step() == 0  # no bank


def test_a_bank_without_saved_memory_resumes_through_torch_loads_and_copies():
    # PyTorch's load and deepcopy wrote cf's counters without the FIFO (save_memory=False): the bank
    # claimed zero rows and the next re-clustering failed in K-Means (Module::on_state_loaded)
    import copy

    def make(seed):
        return cf.torch.Attention("cluster-former", d_model=8, n_heads=2, seed=seed, update_every=1, num_clusters=2,
                                  memory_size=64, save_memory=False)
    x = torch.randn(2, 16, 8)
    a = make(0)
    a(x)
    assert a.on_train_step() == 1
    assert "attention_bank_memory" not in a.state_dict()
    loaded = make(1)
    loaded.load_state_dict(a.state_dict())
    for b in (loaded, copy.deepcopy(a)):  # a load, and a copy alone (__setstate__)
        assert b.state_dict()["attention_bank_counters"][0].item() == 0  # the FIFO restarts empty
        b(x)
        assert b.on_train_step() == 1  # K-Means on what was gathered since


def _ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    layer = cf.torch.Attention("cluster-former", d_model=8, n_heads=2, seed=rank, update_every=2, num_clusters=2,
                               memory_size=64)
    x = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(rank))  # each rank its own data
    for _ in range(3 if rank == 0 else 1):  # rank 0 has trained 3 steps, rank 1 one
        layer(x)
        layer.on_train_step()
    ddp = torch.nn.parallel.DistributedDataParallel(layer)  # broadcasts rank 0's parameters and buffers
    at_start = {n: t.clone() for n, t in _cf_buffer_views(layer).items()}
    for _ in range(2):
        ddp(x).square().mean().backward()  # the forward first broadcasts rank 0's buffers again
        layer.on_train_step()
    at_end = {n: t.clone() for n, t in _cf_buffer_views(layer).items()}
    torch.save({"start": at_start, "end": at_end}, os.path.join(out_dir, "rank%d.pt" % rank))
    dist.barrier()
    # Leave without tearing DDP down: PyTorch 1.13's ~Reducer joins gloo's worker thread while holding the
    # GIL, and that thread may be freeing a tensor with a Python object, which takes the GIL: a deadlock
    # (seen once in CI: rank 0 hung at exit after both ranks had saved their results).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with gloo not available")
def test_distributed_data_parallel_broadcasts_the_shared_cf_buffers(tmp_path):
    # before, cf's buffers were not torch buffers: DDP left each rank attending with its own bank
    # centroids (and routing centroids)
    workers = torch.multiprocessing.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                                          join=False)
    deadline = time.monotonic() + 300  # a hung rank fails the test instead of the whole suite
    while not workers.join(timeout=5):
        if time.monotonic() > deadline:
            for p in workers.processes:
                p.kill()
            pytest.fail("the DDP workers did not finish within 300 s")
    r0, r1 = (torch.load(tmp_path / ("rank%d.pt" % r)) for r in (0, 1))
    c = "attention.bank.centroids"
    assert torch.equal(r1["start"][c], r0["start"][c])  # cf's own tensor got rank 0's values
    # the stored states and counters stay each rank's own (not broadcast)
    assert r0["start"]["attention.bank.counters"].tolist() == [64, 32, 3, 1]  # held, next row, steps, updates
    assert r1["start"]["attention.bank.counters"].tolist() == [32, 32, 1, 0]
    assert not torch.equal(r0["start"]["attention.bank.memory"], r1["start"]["attention.bank.memory"])
    # two more steps each: rank 0 re-clusters at its step 4, rank 1 at its step 2
    assert r0["end"]["attention.bank.counters"].tolist() == [64, 32, 5, 2]
    assert r1["end"]["attention.bank.counters"].tolist() == [64, 32, 3, 1]
    # rank 1's K-Means result was replaced by rank 0's centroids at the last forward's broadcast
    assert torch.equal(r0["end"][c], r1["end"][c])


@pytest.mark.parametrize("variant,options", [("full", {}), ("neural-clustering", {"clusters": 2}),
                                             ("clustered", {"clusters": 3, "hash_seed": 1})])
def test_under_torch_autocast_the_layer_runs_cf_autocast(variant, options):
    # before, a float32 layer under torch.autocast failed on the 16-bit input ("[Linear] input is
    # bfloat16 but weights are float32"), and a float32 input ran in float32, ignoring autocast
    layer = cf.torch.Attention(variant, d_model=8, n_heads=2, seed=0, aux_weights={}, **options).eval()
    twin = cf.nn.MultiHeadAttention(variant, d_model=8, n_heads=2, generator=cf.Generator(0), **options).train(False)
    x = torch.randn(2, 12, 8)
    y32 = layer(x)
    twin(cf.from_dlpack(x))  # the same calls on both (a variant may draw from its generator per call)
    for x_in in (x, x.bfloat16()):  # float32 input, or the 16-bit output of an autocast layer before it
        x_in = x_in.detach().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x_in)
        with cf.autocast(cf.bfloat16):
            y_cf = torch.from_dlpack(twin(cf.from_dlpack(x_in.detach())).detach())
        assert y.dtype == y_cf.dtype and torch.equal(y, y_cf)  # exactly cf's own autocast
        assert not torch.equal(y.float(), y32) and torch.allclose(y.float(), y32, atol=0.05)  # 16-bit products ran
        y.float().square().sum().backward()
        assert x_in.grad.dtype == x_in.dtype and layer.w_q_weight.grad.dtype == torch.float32
        assert torch.isfinite(x_in.grad.float()).all() and layer.w_q_weight.grad.abs().sum() > 0
        layer.zero_grad()


class Classifier(torch.nn.Module):
    """Token embedding (torch) -> cf attention -> mean pool -> linear head (torch)."""

    def __init__(self, vocab, d, classes, length):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(0.5 * torch.randn(length, d))
        self.attn = cf.torch.Attention("neural-clustering", d_model=d, n_heads=2, seed=0, clusters=2)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, ids):
        h = self.emb(ids) + self.pos
        h = self.norm(h + self.attn(h))
        return self.head(h.mean(1))


@pytest.mark.parametrize("autocast", [False, True])
def test_small_pytorch_classifier_trains_with_cf_attention(autocast):
    # label: does token 1 occur before token 2 in the sequence (order matters, so attention is needed)
    torch.manual_seed(0)
    n, length = 256, 12
    ids = torch.randint(3, 10, (n, length))
    labels = torch.randint(0, 2, (n,))
    for i in range(n):
        a, b = torch.randperm(length)[:2].sort().values.tolist()
        first, second = (1, 2) if labels[i] == 1 else (2, 1)
        ids[i, a], ids[i, b] = first, second
    model = Classifier(10, 16, 2, length)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.attn.parameters()]
    first_loss = None
    for step in range(150):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # bf16 products, float32 weights
            loss = torch.nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first_loss = first_loss if first_loss is not None else loss.item()
    acc = (model(ids).argmax(1) == labels).float().mean().item()
    assert loss.item() < 0.5 * first_loss and acc > 0.85, (first_loss, loss.item(), acc)
    # the optimizer moved the cf parameters (they are the torch parameters)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.attn.parameters()))
    assert model.attn.cf_module.w_o.weight.data_ptr() == model.attn.w_o_weight.data_ptr()


requires_both_cuda = pytest.mark.skipif(not (cf.cuda.is_available() and torch.cuda.is_available()),
                                        reason="needs a CUDA device visible to both cf and torch")


@requires_both_cuda
def test_cuda_dlpack_with_torch_shares_memory():
    t = cf.arange(6, dtype=cf.float32, device="cuda")
    tt = torch.from_dlpack(t)
    assert tt.is_cuda and tt.data_ptr() == t.data_ptr()
    tt[2] = -7.0
    assert t[2].item() == -7.0
    a = torch.ones(4, device="cuda")
    c = cf.from_dlpack(a)
    assert c.device == cf.Device("cuda:0") and c.data_ptr() == a.data_ptr()
    c[1] = 5.0
    torch.cuda.synchronize()
    assert a[1].item() == 5.0


@requires_both_cuda
def test_attention_on_cuda_matches_cpu():
    layer = cf.torch.Attention("full", d_model=16, n_heads=2, seed=3)
    x = torch.randn(2, 10, 16)
    y_cpu = layer(x)
    layer.cuda()
    y = layer(x.cuda())
    assert y.is_cuda and torch.allclose(y.cpu(), y_cpu, atol=1e-5)
    y.sum().backward()
    assert layer.w_q_weight.grad.is_cuda


@requires_both_cuda
def test_cuda_buffers_memory_bank_autocast_and_a_side_stream():
    # cf's buffers follow .cuda() and stay aliased; the memory bank steps on the device; under
    # torch.autocast("cuda") the layer gives cf's own CUDA autocast result; a call on a side stream
    # is ordered with it
    layer = cf.torch.Attention("cluster-former", d_model=16, n_heads=2, seed=0, update_every=1, num_clusters=2,
                               memory_size=64).cuda()
    cf_centroids = _cf_buffer_views(layer)["attention.bank.centroids"]
    assert cf_centroids.is_cuda and cf_centroids.data_ptr() == layer.attention_bank_centroids.data_ptr()
    x = torch.randn(2, 16, 16, device="cuda")
    layer(x)
    assert layer.on_train_step() == 1
    assert layer.state_dict()["attention_bank_counters"].tolist() == [32, 32, 1, 1]
    full = cf.torch.Attention("full", d_model=16, n_heads=2, seed=0).cuda().eval()
    twin = cf.nn.MultiHeadAttention("full", d_model=16, n_heads=2, generator=cf.Generator(0)).train(False)
    twin.to(cf.Device("cuda:0"))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = full(x)
    with cf.autocast(cf.bfloat16):
        y_cf = torch.from_dlpack(twin(cf.from_dlpack(x)).detach())
    assert y.dtype == y_cf.dtype and torch.equal(y, y_cf)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y_side = full(x * 1.0)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y_side.float(), full(x).float())


def test_the_variants_own_seed_option_is_reachable():
    # The wrapper's seed (its generator) took the name: LSH drew fresh rotations on every forward,
    # in eval mode too, and seed= could not reach the variant. options={"seed": ...} does.
    x = torch.randn(2, 16, 8)
    fixed = cf.torch.Attention("lsh", d_model=8, n_heads=2, seed=1, options={"seed": 5}, n_buckets=4).eval()
    assert torch.equal(fixed(x), fixed(x))
    twin = cf.torch.Attention("lsh", d_model=8, n_heads=2, seed=1, options={"seed": 5, "n_buckets": 4}).eval()
    assert torch.equal(twin(x), fixed(x))
    with pytest.raises(TypeError, match="'n_buckets' given both as a keyword and in options"):
        cf.torch.Attention("lsh", d_model=8, n_heads=2, options={"n_buckets": 4}, n_buckets=4)
