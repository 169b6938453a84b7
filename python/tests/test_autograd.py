"""Autograd from Python: backward, grad, requires_grad, detach, no_grad, gradcheck."""
import math

import pytest

import cf


def test_backward_fills_leaf_grads():
    x = cf.tensor([0.5, -1.0, 2.0], dtype=cf.float64, requires_grad=True)
    y = cf.sum(cf.tanh(x) * x)
    assert y.grad_fn == "sum" and x.grad is None
    y.backward()
    expected = [float(cf.tanh(cf.tensor(v, dtype=cf.float64)).item() + v * (1 - cf.tanh(cf.tensor(v, dtype=cf.float64)).item() ** 2))
                for v in (0.5, -1.0, 2.0)]
    assert x.grad.tolist() == pytest.approx(expected, rel=1e-12)
    # gradients accumulate across backward calls, until dropped
    cf.sum(x * 2.0).backward()
    assert x.grad.tolist() == pytest.approx([e + 2 for e in expected], rel=1e-12)
    x.grad = None
    assert x.grad is None


def test_backward_with_grad_output_and_retain_graph():
    x = cf.ones([2, 2], requires_grad=True)
    y = x * 3.0
    y.backward(cf.full([2, 2], 2.0), retain_graph=True)
    y.backward(cf.ones([2, 2]))
    assert x.grad.tolist() == [[9, 9], [9, 9]]
    with pytest.raises(cf.AutogradError, match=r"^\[backward\] the graph through 'mul' was already freed by an earlier "
                                              r"backward"):
        y.backward(cf.ones([2, 2]))  # the graph was freed by the last backward


def test_detach_and_requires_grad():
    x = cf.randn([3], requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.shares_storage(x)
    y = x.requires_grad_(False)
    assert y is x and not x.requires_grad
    with pytest.raises(cf.DTypeError, match=r"^\[requires_grad\] only float tensors can require grad, got int64"):
        cf.arange(3).requires_grad = True


def test_no_grad_context_manager_and_decorator():
    x = cf.ones([2], requires_grad=True)
    with cf.no_grad():
        assert not cf.grad_enabled()
        y = x * 2.0
        with cf.enable_grad():
            z = x * 2.0
    assert cf.grad_enabled()
    assert not y.requires_grad and y.grad_fn is None and z.grad_fn == "mul"

    @cf.no_grad()
    def f(t):
        return t + 1.0
    assert f(x).grad_fn is None and cf.grad_enabled()

    @cf.no_grad  # without parentheses too (it failed: "no_grad() takes no arguments")
    def g(t):
        return t + 1.0
    assert g(x).grad_fn is None and g.__name__ == "g"

    @cf.enable_grad
    def h(t):
        return t + 1.0
    with cf.no_grad():
        assert h(x).grad_fn == "add" and not cf.grad_enabled()
    with pytest.raises(TypeError, match="no_grad takes no arguments"):
        cf.no_grad(1)


def test_inplace_on_a_leaf_that_requires_grad_is_refused():
    x = cf.ones([2], requires_grad=True)
    with pytest.raises(cf.Error, match=r"^\[add_\]"):
        x += 1
    with cf.no_grad():
        x += 1
    assert x.tolist() == [2, 2]


def test_an_inplace_write_of_a_value_that_requires_grad_is_refused():
    # out[0] = w * 2, acc += w, acc *= w ... dropped w's gradient without a word.
    w = cf.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out, acc = cf.zeros([2, 3]), cf.zeros([3])
    with pytest.raises(cf.AutogradError, match=r"^\[copy_\] the value written requires grad"):
        out[0] = w * 2
    with pytest.raises(cf.AutogradError, match=r"^\[add_\] the value written requires grad"):
        acc += w
    with pytest.raises(cf.AutogradError, match=r"^\[sub_\] the value written requires grad"):
        acc -= w
    for op, name in [(lambda: acc.__imul__(w), "mul_"), (lambda: acc.__itruediv__(w), "div_"),
                     (lambda: acc.__ipow__(w), "pow_")]:
        with pytest.raises(cf.AutogradError, match=r"^\[" + name + r"\] the value written requires grad"):
            op()
    assert out.tolist() == [[0.0] * 3] * 2 and acc.tolist() == [0.0] * 3  # nothing written
    out[0] = (w * 2).detach()
    with cf.no_grad():
        acc += w
    assert out.tolist()[0] == [2.0, 4.0, 6.0] and acc.tolist() == [1.0, 2.0, 3.0]


def test_numpy_and_dlpack_views_of_a_tensor_that_requires_grad_are_refused():
    # A write through the view escaped the version counter: h.sum().backward() below gave a wrong
    # gradient. PyTorch refuses both too; detach() shares the memory and says so.
    np = pytest.importorskip("numpy")
    x = cf.tensor([0.0, 1.0, 2.0], requires_grad=True)
    h = x.sigmoid()
    for view in (h.numpy, lambda: np.asarray(h), h.__dlpack__, lambda: cf.to_dlpack(h), lambda: x.numpy()):
        with pytest.raises(cf.AutogradError, match="requires grad.*t.detach\\(\\)"):
            view()
    a = h.detach().numpy()
    assert a.tolist() == h.tolist()
    np.from_dlpack(h.detach())


def test_inplace_change_of_a_saved_tensor_is_an_error():
    x = cf.ones([2], requires_grad=True)
    h = x * 1.0
    y = cf.sum(h * h)
    with cf.no_grad():
        h.fill_(3.0)
    with pytest.raises(cf.AutogradError, match=r"^\[backward\] a tensor float32 \(2\) on cpu saved by 'mul' for "
                                              r"backward was modified in place afterwards \(version 1, saved at "
                                              r"version 0\)"):
        y.backward()


def softplus(x):
    return cf.log1p(cf.exp(x))


def test_gradcheck_of_a_python_composition():
    x = cf.rand([4, 5], dtype=cf.float64, generator=cf.Generator(1), low=-2, high=2, requires_grad=True)
    r = cf.gradcheck(lambda inputs: softplus(inputs[0]), [x])
    assert r.ok, r.message
    assert r.mode == "full-jacobian" and r.entries_checked > 0


def test_gradcheck_reports_a_wrong_gradient():
    # round-trips through a detached copy: the analytic gradient is zero, the numeric one is not
    x = cf.rand([3], dtype=cf.float64, generator=cf.Generator(2), requires_grad=True)
    r = cf.gradcheck(lambda inputs: inputs[0].detach() * inputs[0].detach() + inputs[0] * 0.0, [x])
    assert not r.ok and r.message


def test_gradcheck_keeps_grad_and_names_a_non_tensor_result():
    x = cf.rand([3], dtype=cf.float64, generator=cf.Generator(3), requires_grad=True)
    x.grad = cf.tensor([7.0, 8.0, 9.0], dtype=cf.float64)
    assert cf.gradcheck(lambda inputs: inputs[0] * inputs[0], [x]).ok
    assert x.grad.tolist() == [7.0, 8.0, 9.0]  # it was erased
    with pytest.raises(TypeError, match=r"^\[gradcheck\] f must return a cf.Tensor, got list"):
        cf.gradcheck(lambda inputs: [inputs[0]], [x])  # was "std::bad_cast"
    with pytest.raises(TypeError, match="got NoneType"):
        cf.gradcheck(lambda inputs: None, [x])


def test_sparse_products_and_query_clustering():
    q = cf.tensor([[[1.0, 2.0], [3.0, -1.0]]], dtype=cf.float64, requires_grad=True)  # (1, 2, 2)
    k = cf.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]], dtype=cf.float64)  # (1, 3, 2)
    idx = cf.tensor([[[2, 0], [1, 1]]], dtype=cf.int64)
    s = cf.sparse_dot(q, k, idx)
    assert s.tolist() == [[[6.0, 1.0], [-1.0, -1.0]]] and s.grad_fn == "sparse_dot"
    cf.sum(s).backward()
    assert q.grad.tolist() == [[[3.0, 2.0], [0.0, 2.0]]]  # row n: the sum of its gathered keys
    w = cf.sparse_weighted_sum(cf.ones([1, 2, 2], dtype=cf.float64), k, idx)
    assert w.tolist() == [[[3.0, 2.0], [0.0, 2.0]]]
    codes = cf.hash_codes(cf.tensor([[1.0, -1.0], [-1.0, 1.0]]), cf.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert codes.tolist() == [1, 2]
    ids = cf.hamming_kmeans(cf.tensor([[0, 1, 254, 255]], dtype=cf.int64), 2, 5, 8)
    assert ids.tolist() == [[0, 0, 1, 1]]
    with pytest.raises(cf.IndexError, match=r"\[sparse_dot\] idx value 3"):
        cf.sparse_dot(q, k, cf.tensor([[[3, 0], [1, 1]]], dtype=cf.int64))


def test_block_attention_rounds_read_one_q_k_v_and_combine_through_lse():
    # Two rounds over one head: the same as the head repeated per round; combined, the rounds' log-sum-exp rule.
    g = cf.Generator(5)
    q, k, v = (cf.rand([1, 1, 4, 3], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    members = cf.tensor([[[[0, 1], [2, 3]], [[3, 1], [0, 2]]]], dtype=cf.int64)  # (1, 2 rounds, 2 chunks, 2)
    out, lse = cf.block_attention(q, k, v, members, rounds=2)
    assert out.shape == (1, 2, 4, 3) and lse.shape == (1, 2, 4)
    rep = lambda t: cf.cat([t, t], 1)
    out_rep, lse_rep = cf.block_attention(rep(q), rep(k), rep(v), members)
    flat = lambda t: [x for a in t.tolist() for b in a for c in b for x in c]
    assert flat(out) == pytest.approx(flat(out_rep), rel=1e-12)
    both, lse_c = cf.block_attention(q, k, v, members, rounds=2, combine_rounds=True)
    assert both.shape == (1, 1, 4, 3)
    l0, l1 = lse.tolist()[0]
    o0, o1 = out.tolist()[0]
    for n in range(4):
        top = max(l0[n], l1[n])
        z = math.exp(l0[n] - top) + math.exp(l1[n] - top)
        assert lse_c.tolist()[0][0][n] == pytest.approx(top + math.log(z), rel=1e-12)
        w0 = math.exp(l0[n] - top) / z
        for c in range(3):
            assert both.tolist()[0][0][n][c] == pytest.approx(w0 * o0[n][c] + (1 - w0) * o1[n][c], rel=1e-12)
    with pytest.raises(cf.ShapeError, match=r"does not fit q \(1,1,4,3\) and rounds=3"):
        cf.block_attention(q, k, v, members, rounds=3)


def test_block_attention_dropout_drops_the_weights_dropout_drops_on_the_dense_weights():
    # One chunk holding every token is full attention: its dense weights, dropped by cf.dropout with the
    # same generator, give the kernel's output; lse is that of the weights before dropout.
    g = cf.Generator(9)
    q, k, v = (cf.rand([1, 2, 4, 3], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    members = cf.tensor([[[[2, 0, 3, 1]]]], dtype=cf.int64)
    flat = lambda t: [x for a in t.tolist() for b in a for c in b for x in c]
    out, lse = cf.block_attention(q, k, v, members, dropout=0.5, generator=cf.Generator(3))
    weights = cf.softmax(cf.matmul(q * (1 / math.sqrt(3)), cf.transpose(k, 2, 3)), -1)
    dense = cf.matmul(cf.dropout(weights, 0.5, generator=cf.Generator(3)), v)
    assert flat(out) == pytest.approx(flat(dense), rel=1e-12, abs=1e-15)
    plain, lse_plain = cf.block_attention(q, k, v, members)
    assert flat(out) != pytest.approx(flat(plain), rel=1e-3)
    assert lse.tolist() == lse_plain.tolist()
    with pytest.raises(cf.ValueError, match=r"\[block_attention\] dropout must be in \[0, 1\), got 1"):
        cf.block_attention(q, k, v, members, dropout=1.0)


def test_routed_attention_averages_a_position_over_its_lists():
    # One list of every position is full attention; the same list twice averages two equal outputs; a
    # position in no query list outputs zeros.
    g = cf.Generator(6)
    q, k, v = (cf.rand([1, 2, 5, 3], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    every = cf.tensor([[[[0, 1, 2, 3, 4]]]], dtype=cf.int64)
    flat = lambda t: [x for a in t.tolist() for b in a for c in b for x in c]
    full = cf.flash_attention(q, k, v)
    assert flat(cf.routed_attention(q, k, v, every, every)) == pytest.approx(flat(full), rel=1e-12)
    twice = cf.cat([every, every], 2)
    assert flat(cf.routed_attention(q, k, v, twice, twice)) == pytest.approx(flat(full), rel=1e-12)
    some = cf.tensor([[[[0, 2, -1, -1, -1]]]], dtype=cf.int64)
    q.requires_grad = True
    out = cf.routed_attention(q, k, v, some, every)
    assert out.grad_fn == "routed_attention"
    assert out.tolist()[0][1][1] == [0.0, 0.0, 0.0]
    cf.sum(out).backward()  # only positions 0 and 2 query: the other rows of q get no gradient
    assert q.grad.tolist()[0][0][1] == [0.0, 0.0, 0.0] and q.grad.tolist()[0][0][0] != [0.0, 0.0, 0.0]
    with pytest.raises(cf.IndexError, match=r"\[routed_attention\] member position 5 at flat position 1"):
        cf.routed_attention(q, k, v, cf.tensor([[[[0, 5]]]], dtype=cf.int64), every)


def test_routed_attention_dropout_with_one_list_of_every_position_is_flash_attention_dropout():
    # One list holding every position is full attention, and its dropout counters are list 0's: those of the
    # dense (B, H, N, N) weights, so flash_attention drops the same weights from the same generator state.
    g = cf.Generator(4)
    q, k, v = (cf.rand([1, 2, 5, 3], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    every = cf.tensor([[[[3, 0, 4, 1, 2]]]], dtype=cf.int64)
    flat = lambda t: [x for a in t.tolist() for b in a for c in b for x in c]
    routed = cf.routed_attention(q, k, v, every, every, dropout=0.5, generator=cf.Generator(6))
    flash = cf.flash_attention(q, k, v, dropout=0.5, generator=cf.Generator(6))
    assert flat(routed) == pytest.approx(flat(flash), rel=1e-12, abs=1e-15)
    assert flat(routed) != pytest.approx(flat(cf.routed_attention(q, k, v, every, every)), rel=1e-3)


def test_flash_attention_dropout_drops_the_weights_dropout_drops_on_the_dense_weights():
    g = cf.Generator(8)
    q, k, v = (cf.rand([1, 2, 4, 3], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    flat = lambda t: [x for a in t.tolist() for b in a for c in b for x in c]
    fused = cf.flash_attention(q, k, v, dropout=0.5, generator=cf.Generator(3))
    weights = cf.softmax(cf.matmul(q * (1 / math.sqrt(3)), cf.transpose(k, 2, 3)), -1)
    dense = cf.matmul(cf.dropout(weights, 0.5, generator=cf.Generator(3)), v)
    assert flat(fused) == pytest.approx(flat(dense), rel=1e-12, abs=1e-15)
    assert flat(fused) != pytest.approx(flat(cf.flash_attention(q, k, v)), rel=1e-3)
    with pytest.raises(cf.ValueError, match=r"\[flash_attention\] dropout must be in \[0, 1\), got 1"):
        cf.flash_attention(q, k, v, dropout=1.0)


def test_flash_attention_with_lse_returns_the_rows_log_sum_exp_and_its_gradient():
    g = cf.Generator(6)
    q, k, v = (cf.rand([1, 1, 3, 2], dtype=cf.float64, generator=g, low=-1, high=1) for _ in range(3))
    q.requires_grad = True
    out, lse = cf.flash_attention_with_lse(q, k, v, scale=1.0)
    assert out.tolist() == cf.flash_attention(q, k, v, scale=1.0).tolist()
    qs, ks = q.tolist()[0][0], k.tolist()[0][0]
    for i in range(3):
        s = [sum(a * b for a, b in zip(qs[i], ks[j])) for j in range(3)]
        assert lse.tolist()[0][0][i] == pytest.approx(math.log(sum(math.exp(x) for x in s)), rel=1e-12)
    # d lse_i / d q_i = sum_j P_ij k_j: the softmax-weighted mean of the keys
    cf.sum(lse).backward()
    for i in range(3):
        s = [sum(a * b for a, b in zip(qs[i], ks[j])) for j in range(3)]
        p = [math.exp(x) / sum(math.exp(y) for y in s) for x in s]
        want = [sum(p[j] * ks[j][d] for j in range(3)) for d in range(2)]
        assert q.grad.tolist()[0][0][i] == pytest.approx(want, rel=1e-12)
    with pytest.raises(cf.ShapeError, match=r"\[flash_attention\] inconsistent shapes"):
        cf.flash_attention_with_lse(q, cf.zeros([1, 1, 3, 5], dtype=cf.float64), v)
    # dropout: flash_attention's dropped output, lse of the weights before dropout
    dropped, lse_dropped = cf.flash_attention_with_lse(q, k, v, scale=1.0, dropout=0.5, generator=cf.Generator(4))
    assert dropped.tolist() == cf.flash_attention(q, k, v, scale=1.0, dropout=0.5, generator=cf.Generator(4)).tolist()
    assert dropped.tolist() != out.tolist()
    assert lse_dropped.tolist() == lse.tolist()
    with pytest.raises(cf.ValueError, match=r"\[flash_attention\] dropout must be in \[0, 1\), got 1"):
        cf.flash_attention_with_lse(q, k, v, dropout=1.0)


def test_no_grad_and_autocast_decorate_generators_for_their_whole_body():
    # the wrapper left the context before the generator's body ran: graphs were recorded
    w = cf.ones([2], requires_grad=True)

    @cf.no_grad()
    def steps(n):
        for _ in range(n):
            yield (w * 2).sum()

    outs = list(steps(2))
    assert [o.requires_grad for o in outs] == [False, False]
    assert cf.grad_enabled()

    @cf.autocast(cf.bfloat16)
    def products():
        yield cf.matmul(cf.ones([2, 2]), cf.ones([2, 2]))

    assert next(products()).dtype == cf.bfloat16
    assert cf.autocast_dtype() is None


def test_set_grad_enabled_is_a_call_and_a_context_manager():
    w = cf.ones([2], requires_grad=True)
    with cf.set_grad_enabled(False):
        assert not (w * 2).requires_grad
    assert cf.grad_enabled() and (w * 2).requires_grad
    cf.set_grad_enabled(False)
    try:
        assert not cf.grad_enabled()
    finally:
        cf.set_grad_enabled(True)

    @cf.set_grad_enabled(False)  # as a decorator: off inside only (it raised and left it off)
    def double(x):
        return x * 2

    assert cf.grad_enabled() and not double(w).requires_grad and cf.grad_enabled()


def test_autograd_grad_and_retain_grad_as_pytorch():
    x = cf.tensor([1.0, 2.0], dtype=cf.float64, requires_grad=True)
    h = x * 3.0
    h.retain_grad()
    y = (h * h).sum()
    gx, gh = cf.autograd.grad(y, [x, h], retain_graph=True)
    assert gx.tolist() == [18.0, 36.0] and gh.tolist() == [6.0, 12.0]
    assert x.grad is None and h.grad is None  # returned, not accumulated
    (gz,) = cf.autograd.grad([h * 2.0], x, grad_outputs=[cf.tensor([1.0, 10.0], dtype=cf.float64)], retain_graph=True)
    assert gz.tolist() == [6.0, 60.0]
    y.backward()
    assert x.grad.tolist() == [18.0, 36.0] and h.grad.tolist() == [6.0, 12.0]  # retain_grad kept h's
    w = cf.ones([1], requires_grad=True)
    u = (x * x).sum()
    assert cf.autograd.grad(u, [w, x], allow_unused=True, retain_graph=True)[0] is None
    with pytest.raises(cf.AutogradError, match=r"\[grad\] input 0 .* received no gradient"):
        cf.autograd.grad(u, w, retain_graph=True)
    assert cf.autograd.grad(u, w, retain_graph=True, materialize_grads=True)[0].tolist() == [0.0]
    params = {"x": x, "w": w}  # any iterable, as torch's (dict values, generators)
    gx2, gw2 = cf.autograd.grad(u, params.values(), allow_unused=True, retain_graph=True)
    assert gx2.tolist() == [2.0, 4.0] and gw2 is None
    assert cf.autograd.grad(u, (p for p in [x]), retain_graph=True)[0].tolist() == [2.0, 4.0]
    g1, g2 = cf.autograd.grad(u, [x, x], retain_graph=True)  # an input twice: its gradient twice, as torch
    assert g1.tolist() == g2.tolist() == [2.0, 4.0]
    g1.add_(1.0)
    assert g2.tolist() == [2.0, 4.0]  # each the caller's own
    with pytest.raises(cf.ValueError, match=r"\[grad\] create_graph=True is not supported"):
        cf.autograd.grad(u, x, create_graph=True)
    with pytest.raises(TypeError, match=r"\[grad\] inputs must hold cf.Tensors, got int"):
        cf.autograd.grad(u, [1])
    # the None-or-bool flags refuse truthy stand-ins (1, "yes") rather than reading them as bools
    with pytest.raises(TypeError, match=r"^\[grad\] retain_graph must be a bool or None, got int$"):
        cf.autograd.grad(u, x, retain_graph=1)
    with pytest.raises(TypeError, match=r"^\[grad\] allow_unused must be a bool or None, got str$"):
        cf.autograd.grad(u, [w, x], allow_unused="yes")
    # outputs (and inputs) are one tensor or an iterable of them: a number or a str (iterable, but of
    # characters) is named
    with pytest.raises(TypeError, match=r"^\[grad\] outputs must be a cf.Tensor or an iterable of them, got float$"):
        cf.autograd.grad(2.0, x)
    with pytest.raises(TypeError, match=r"^\[grad\] outputs must be a cf.Tensor or an iterable of them, got str$"):
        cf.autograd.grad("u", x)
    with pytest.raises(TypeError, match=r"^\[grad\] inputs must be a cf.Tensor or an iterable of them, got int$"):
        cf.autograd.grad(u, 3)
    assert cf.autograd.grad(u, x, retain_graph=True, allow_unused=None)[0].tolist() == [2.0, 4.0]
    from cf.autograd import grad  # importable as torch's

    assert grad(u, x)[0].tolist() == [2.0, 4.0]
    # retain_graph=None is the default (False): the graph is freed
    v = (x * x).sum()
    assert cf.autograd.grad(v, x, retain_graph=None)[0].tolist() == [2.0, 4.0]
    with pytest.raises(cf.AutogradError, match=r"^\[grad\] the graph through '\w+' was already freed"):
        cf.autograd.grad(v, x)  # (named [grad]: the entry point that ran into it)
