"""cf.nn.functional: torch.nn.functional's names over cf's ops, checked against NumPy formulas (and
float64 gradchecks for the functions composed in Python)."""
import math

import numpy as np
import pytest

import cf
import cf.nn.functional as F


def rnd(shape, seed, dtype=cf.float64, requires_grad=False):
    return cf.randn(list(shape), dtype=dtype, generator=cf.Generator(seed), requires_grad=requires_grad)


def a(t):
    return np.asarray(t.detach())


def gradcheck_ok(fn, inputs):
    r = cf.gradcheck(lambda xs: fn(*xs), inputs)
    assert r.ok, r


def test_import_paths():
    import cf.nn.functional as G
    from cf.nn import functional as H
    assert G is F and H is F and cf.nn.functional is F


def test_activations_match_their_formulas():
    x = rnd([3, 7], 1) * 4.0
    xv = a(x)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(a(F.relu(x)), np.maximum(xv, 0))
    np.testing.assert_allclose(a(F.gelu(x)), 0.5 * xv * (1 + erf(xv / math.sqrt(2))), rtol=1e-12, atol=1e-12)
    tanh_form = 0.5 * xv * (1 + np.tanh(math.sqrt(2 / math.pi) * (xv + 0.044715 * xv ** 3)))
    np.testing.assert_allclose(a(F.gelu(x, approximate="tanh")), tanh_form, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a(F.silu(x)), xv / (1 + np.exp(-xv)), rtol=1e-12)
    np.testing.assert_allclose(a(F.sigmoid(x)), 1 / (1 + np.exp(-xv)), rtol=1e-12)
    np.testing.assert_allclose(a(F.tanh(x)), np.tanh(xv), rtol=1e-12)
    np.testing.assert_allclose(a(F.leaky_relu(x, 0.2)), np.where(xv > 0, xv, 0.2 * xv))
    np.testing.assert_allclose(a(F.softplus(x, beta=2.0)), np.log1p(np.exp(2 * xv)) / 2, rtol=1e-12)
    # above the threshold softplus is x itself; far below it no overflow or underflow to -inf
    big = cf.tensor([30.0, -800.0, 800.0], dtype=cf.float64)
    np.testing.assert_allclose(a(F.softplus(big)), [30.0, 0.0, 800.0], atol=1e-300)
    with pytest.raises(cf.ValueError, match=r"^\[gelu\] approximate must be 'none' or 'tanh'"):
        F.gelu(x, approximate="fast")
    with pytest.raises(cf.ValueError, match=r"^\[relu\] inplace=True is not supported"):
        F.relu(x, inplace=True)
    for fn in (lambda t: F.gelu(t, approximate="tanh"), F.silu, lambda t: F.softplus(t, 0.5)):
        gradcheck_ok(fn, [rnd([2, 3], 2, requires_grad=True)])


def test_softmax_family_takes_dim_and_dtype():
    x = rnd([2, 3, 4], 3)
    xv = a(x)
    e = np.exp(xv - xv.max(1, keepdims=True))
    np.testing.assert_allclose(a(F.softmax(x, dim=1)), e / e.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(a(F.log_softmax(x, 1)), np.log(e / e.sum(1, keepdims=True)), rtol=1e-12)
    assert F.softmax(cf.to(x, cf.float32), -1, dtype=cf.float64).dtype == cf.float64
    with pytest.raises(cf.ValueError, match=r"^\[softmax\] give dim="):
        F.softmax(x)
    with pytest.raises(cf.ValueError, match=r"^\[log_softmax\] give dim="):
        F.log_softmax(x)


def test_linear_layer_norm_dropout():
    x, w, b = rnd([4, 5], 4), rnd([3, 5], 5), rnd([3], 6)
    np.testing.assert_allclose(a(F.linear(x, w, b)), a(x) @ a(w).T + a(b), rtol=1e-12)
    np.testing.assert_allclose(a(F.linear(x, w)), a(x) @ a(w).T, rtol=1e-12)
    with pytest.raises(cf.ShapeError, match=r"^\[linear\] weight must be 2-d"):
        F.linear(x, b)
    y = F.layer_norm(x, 5, eps=1e-5)
    xv = a(x)
    ref = (xv - xv.mean(1, keepdims=True)) / np.sqrt(xv.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(a(y), ref, rtol=1e-10, atol=1e-12)
    assert cf.equal(F.dropout(x, 0.5, training=False), x)
    cf.manual_seed(7)
    d = a(F.dropout(cf.ones([1000], dtype=cf.float64), 0.25))
    assert set(np.unique(d)) <= {0.0, 1 / 0.75} and 0.15 < (d == 0).mean() < 0.35
    gradcheck_ok(lambda x_, w_, b_: F.linear(x_, w_, b_),
                 [rnd([2, 3], 7, requires_grad=True), rnd([4, 3], 8, requires_grad=True), rnd([4], 9, requires_grad=True)])


def test_embedding_and_padding_idx_gets_no_gradient():
    weight = rnd([4, 3], 10, requires_grad=True)
    idx = cf.tensor([[0, 2, 2], [3, 0, 1]])
    out = F.embedding(idx, weight, padding_idx=0)
    assert out.shape == (2, 3, 3)
    np.testing.assert_allclose(a(out), a(weight)[a(idx)])  # the padding row's value is still there
    out.sum().backward()
    np.testing.assert_allclose(a(weight.grad), np.array([[0.0] * 3, [1.0] * 3, [2.0] * 3, [1.0] * 3]))
    with pytest.raises(cf.IndexError, match=r"^\[embedding\] padding_idx 4 is out of range for 4 embeddings"):
        F.embedding(idx, weight, padding_idx=4)
    with pytest.raises(cf.ShapeError, match=r"^\[embedding\] weight must be 2-d"):
        F.embedding(idx, cf.ones([4]))
    with pytest.raises(TypeError, match=r"^\[embedding\] input must be a cf.Tensor, got list"):
        F.embedding([0, 1], weight)


def test_one_hot_pad_normalize_cosine_similarity():
    h = F.one_hot(cf.tensor([0, 3, 1]))
    assert h.dtype == cf.int64 and h.tolist() == [[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]]
    assert F.one_hot(cf.tensor([1]), num_classes=3).tolist() == [[0, 1, 0]]
    x = cf.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=cf.float64)
    assert F.pad(x, (1, 0, 0, 1), value=9).tolist() == [[9, 1, 2], [9, 3, 4], [9, 9, 9]]
    # reflect / replicate / circular: one index_select per padded axis (torch's values in the comparison below)
    assert F.pad(x, (1, 1), mode="reflect").tolist() == [[2, 1, 2, 1], [4, 3, 4, 3]]
    assert F.pad(x, (2, 0, 0, 1), mode="replicate").tolist() == [[1, 1, 1, 2], [3, 3, 3, 4], [3, 3, 3, 4]]
    assert F.pad(x, (0, 2), mode="circular").tolist() == [[1, 2, 1, 2], [3, 4, 3, 4]]
    for kwargs, message in ((dict(pad=(2, 0), mode="reflect"), r"mode='reflect' needs each pad below the axis's length: pads \(2, 0\) "
                             r"for axis 1 of length 2"),
                            (dict(pad=(3, 0), mode="circular"), r"mode='circular' needs each pad at most the axis's length"),
                            (dict(pad=(-1, 1), mode="replicate"), r"mode='replicate' takes pads >= 0, got \(-1, 1\) for axis 1"),
                            (dict(pad=(1, 1), mode="reflect", value=0.5), r"mode='reflect' takes no value"),
                            (dict(pad=(1,), mode="circular"), r"pad must hold a \(before, after\) pair for each of at most"),
                            (dict(pad=(1, 1, 1, 1, 1, 1), mode="replicate"), r"pad must hold .* at most input.dim\(\) = 2 trailing"),
                            (dict(pad=(1, 1), mode="symmetric"), r"mode must be 'constant', 'reflect', 'replicate' or "
                             r"'circular', got 'symmetric'")):
        with pytest.raises(cf.ValueError, match=r"^\[pad\] " + message):
            F.pad(x, **kwargs)
    # replicate repeats the edge as often as asked (a length-1 axis too), NumPy ints and 0-d tensors are pads, a
    # value of 0 is accepted (as torch's), and the result is a new tensor even when nothing is padded
    assert F.pad(x[:, :1], (3, 2), mode="replicate").tolist() == [[1] * 6, [3] * 6]
    assert F.pad(x, (np.int64(1), cf.tensor(0)), mode="reflect", value=0).tolist() == [[2, 1, 2], [4, 3, 4]]
    same = F.pad(x, (0, 0), mode="circular")
    assert same is not x and same.tolist() == x.tolist()
    same.add_(1)
    assert x.tolist() == [[1, 2], [3, 4]]
    for bad in ((1.5, 0), (True, 0)):
        with pytest.raises(TypeError, match=r"^\[pad\] pads must be ints"):
            F.pad(x, bad, mode="replicate")
    xv = a(x)
    np.testing.assert_allclose(a(F.normalize(x)), xv / np.linalg.norm(xv, axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(a(F.normalize(x, p=1.0, dim=0)), xv / np.abs(xv).sum(0, keepdims=True), rtol=1e-12)
    assert a(F.normalize(cf.zeros([2, 3], dtype=cf.float64))).tolist() == [[0.0] * 3] * 2  # eps, no NaN
    y = rnd([2, 2], 11)
    yv = a(y)
    cos = (xv * yv).sum(1) / (np.linalg.norm(xv, axis=1) * np.linalg.norm(yv, axis=1))
    np.testing.assert_allclose(a(F.cosine_similarity(x, y)), cos, rtol=1e-12)
    gradcheck_ok(lambda u: F.normalize(u), [rnd([3, 4], 12, requires_grad=True)])
    gradcheck_ok(lambda u, v: F.cosine_similarity(u, v, dim=-1),
                 [rnd([3, 4], 13, requires_grad=True), rnd([3, 4], 14, requires_grad=True)])


def softmax_np(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def test_cross_entropy_with_class_indices_and_with_probabilities():
    logits = rnd([5, 4], 15)
    target = cf.tensor([0, 3, 1, -100, 2])
    assert cf.allclose(F.cross_entropy(logits, target), cf.nn.cross_entropy(logits, target))
    lv = a(logits)
    logp = np.log(softmax_np(lv, 1))
    keep = [0, 1, 2, 4]
    np.testing.assert_allclose(a(F.cross_entropy(logits, target)).item(),
                               -np.mean([logp[i, [0, 3, 1, -100, 2][i]] for i in keep]), rtol=1e-12)
    # soft labels (class axis 1, also with trailing axes), class weights, smoothing, reductions
    probs = cf.softmax(rnd([5, 4], 16), 1)
    pv = a(probs)
    np.testing.assert_allclose(a(F.cross_entropy(logits, probs)).item(), -(pv * logp).sum(1).mean(), rtol=1e-12)
    w = cf.tensor([1.0, 2.0, 0.5, 1.0], dtype=cf.float64)
    np.testing.assert_allclose(a(F.cross_entropy(logits, probs, weight=w, reduction="sum")).item(),
                               -(pv * logp * a(w)).sum(), rtol=1e-12)
    smooth = pv * 0.8 + 0.2 / 4
    np.testing.assert_allclose(a(F.cross_entropy(logits, probs, label_smoothing=0.2, reduction="none")),
                               -(smooth * logp).sum(1), rtol=1e-12)
    x3 = rnd([2, 3, 4], 17)
    p3 = cf.softmax(rnd([2, 3, 4], 18), 1)
    ref3 = -(a(p3) * np.log(softmax_np(a(x3), 1))).sum(1).mean()
    np.testing.assert_allclose(a(F.cross_entropy(x3, p3)).item(), ref3, rtol=1e-12)
    with pytest.raises(cf.ShapeError, match=r"^\[cross_entropy\] class probabilities \(a floating target\) must"):
        F.cross_entropy(logits, probs[0:4])
    with pytest.raises(cf.ValueError, match=r"^\[cross_entropy\] reduction must be"):
        F.cross_entropy(logits, probs, reduction="avg")
    gradcheck_ok(lambda x_, p_: F.cross_entropy(x_, p_, label_smoothing=0.1),
                 [rnd([3, 4], 19, requires_grad=True), cf.softmax(rnd([3, 4], 20), 1).requires_grad_(True)])


def test_nll_loss_weights_and_ignore_index():
    logp = cf.log_softmax(rnd([6, 3], 21), 1)
    target = cf.tensor([0, 2, -100, 1, 1, 2])
    w = cf.tensor([0.5, 2.0, 1.0], dtype=cf.float64)
    lv, tv, wv = a(logp), [0, 2, -100, 1, 1, 2], a(w)
    rows = [i for i in range(6) if tv[i] != -100]
    num = -sum(wv[tv[i]] * lv[i, tv[i]] for i in rows)
    den = sum(wv[tv[i]] for i in rows)
    np.testing.assert_allclose(a(F.nll_loss(logp, target, weight=w)).item(), num / den, rtol=1e-12)
    np.testing.assert_allclose(a(F.nll_loss(logp, target, reduction="sum")).item(), -sum(lv[i, tv[i]] for i in rows),
                               rtol=1e-12)
    none = a(F.nll_loss(logp, target, reduction="none"))
    assert none[2] == 0.0 and none.shape == (6,)
    assert cf.allclose(F.nll_loss(logp, target), F.cross_entropy(rnd([6, 3], 21), target))
    with pytest.raises(cf.ShapeError, match=r"^\[nll_loss\] input \(N, C, d1, ...\) and target \(N, d1, ...\) do not"):
        F.nll_loss(logp, cf.tensor([0, 1]))
    gradcheck_ok(lambda x_: F.nll_loss(x_, cf.tensor([0, 2, -100, 1]), weight=w),
                 [rnd([4, 3], 22, requires_grad=True)])


def test_regression_and_binary_losses():
    x, y = rnd([3, 4], 23), rnd([3, 4], 24)
    np.testing.assert_allclose(a(F.mse_loss(x, y)).item(), ((a(x) - a(y)) ** 2).mean(), rtol=1e-12)
    np.testing.assert_allclose(a(F.l1_loss(x, y, reduction="sum")).item(), np.abs(a(x) - a(y)).sum(), rtol=1e-12)
    p = cf.sigmoid(x)
    t = cf.to(cf.gt(y, 0), cf.float64)
    pv, tv = a(p), a(t)
    bce = -(tv * np.log(pv) + (1 - tv) * np.log(1 - pv))
    np.testing.assert_allclose(a(F.binary_cross_entropy(p, t)).item(), bce.mean(), rtol=1e-12)
    np.testing.assert_allclose(a(F.binary_cross_entropy_with_logits(x, t)).item(), bce.mean(), rtol=1e-10)
    # log(0) is clamped at -100, as PyTorch
    edge = F.binary_cross_entropy(cf.tensor([0.0, 1.0], dtype=cf.float64), cf.tensor([1.0, 1.0], dtype=cf.float64),
                                  reduction="none")
    assert a(edge).tolist() == [100.0, 0.0]
    with pytest.raises(cf.ValueError, match=r"^\[l1_loss\] reduction must be"):
        F.l1_loss(x, y, reduction="max")


def attention_np(q, k, v, allowed=None, additive=None, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if additive is not None:
        s = s + additive
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    den = e.sum(-1, keepdims=True)
    return (np.where(den > 0, e / np.where(den > 0, den, 1), 0.0)) @ v


def test_scaled_dot_product_attention_fused_and_dense_paths():
    q, k, v = rnd([2, 3, 5, 4], 25), rnd([2, 3, 7, 4], 26), rnd([2, 3, 7, 6], 27)
    qv, kv, vv = a(q), a(k), a(v)
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v)), attention_np(qv, kv, vv), rtol=1e-10)
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, scale=0.3)),
                               attention_np(qv, kv, vv, scale=0.3), rtol=1e-10)
    # causal with L != S: query i sees keys j <= i (PyTorch's top-left alignment), 4-d and 3-d
    causal = np.tril(np.ones((5, 7), bool))
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                               attention_np(qv, kv, vv, allowed=causal), rtol=1e-10)
    q3, k3, v3 = (cf.reshape(t, [6] + list(t.shape[2:])) for t in (q, k, v))
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q3, k3, v3, is_causal=True)),
                               attention_np(qv, kv, vv, allowed=causal).reshape(6, 5, 6), rtol=1e-10)
    # a key-only boolean mask (True = attend) takes the fused kernel; per-query masks and float masks the dense path
    keys = np.array([[True] * 5 + [False] * 2, [True] * 7])
    key_mask = cf.tensor(keys.reshape(2, 1, 1, 7).tolist())
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)),
                               attention_np(qv, kv, vv, allowed=keys.reshape(2, 1, 1, 7)), rtol=1e-10)
    one_row = cf.tensor(keys[:1].reshape(1, 1, 1, 7).tolist())  # broadcast over the batch
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, attn_mask=one_row)),
                               attention_np(qv, kv, vv, allowed=keys[:1].reshape(1, 1, 1, 7)), rtol=1e-10)
    per_query = np.random.default_rng(0).random((5, 7)) > 0.3
    per_query[3] = False  # a query with every key masked: zeros (PyTorch: NaN)
    out = a(F.scaled_dot_product_attention(q, k, v, attn_mask=cf.tensor(per_query.tolist())))
    np.testing.assert_allclose(out, attention_np(qv, kv, vv, allowed=per_query), rtol=1e-10)
    assert (out[:, :, 3] == 0).all()
    bias = rnd([5, 7], 28)
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, attn_mask=bias)),
                               attention_np(qv, kv, vv, additive=a(bias)), rtol=1e-10)
    # causal with L == S takes the fused kernel; its answer is the dense one
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k[:, :, 0:5], v[:, :, 0:5], is_causal=True)),
                               attention_np(qv, kv[:, :, 0:5], vv[:, :, 0:5], allowed=np.tril(np.ones((5, 5), bool))),
                               rtol=1e-10)
    # a float32 mask on float64 scores is cast, a non-tensor mask named
    np.testing.assert_allclose(a(F.scaled_dot_product_attention(q, k, v, attn_mask=cf.to(bias, cf.float32))),
                               attention_np(qv, kv, vv, additive=a(cf.to(cf.to(bias, cf.float32), cf.float64))),
                               rtol=1e-10)
    with pytest.raises(TypeError, match=r"^\[scaled_dot_product_attention\] attn_mask must be a cf.Tensor, got list"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=[[True]])
    with pytest.raises(cf.ValueError, match=r"^\[scaled_dot_product_attention\] give attn_mask or is_causal"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=True)
    gradcheck_ok(lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=bias[0:3, 0:4]),
                 [rnd([1, 3, 4], 29, requires_grad=True), rnd([1, 4, 4], 30, requires_grad=True),
                  rnd([1, 4, 2], 31, requires_grad=True)])


def test_every_function_matches_torch_nn_functional():
    """The same calls on the same float64 values through torch.nn.functional (skipped without torch)."""
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional

    def T(t):
        return torch.from_numpy(np.array(a(t)))

    x, y, w, b = rnd([4, 6], 40), rnd([4, 6], 41), rnd([3, 6], 42), rnd([3], 43)
    logits, probs = rnd([4, 5, 3], 44), cf.softmax(rnd([4, 5, 3], 45), 1)
    idx = cf.tensor([[1, 0, 4], [2, 2, 0], [4, 1, 3], [0, 0, 0]])
    cls_w = cf.tensor([1.0, 0.5, 2.0, 1.5, 0.7], dtype=cf.float64)
    logp = cf.log_softmax(logits, 1)
    q, k, v = rnd([2, 2, 4, 8], 46), rnd([2, 2, 6, 8], 47), rnd([2, 2, 6, 5], 48)
    key_mask = cf.tensor([[[[True] * 6]], [[[True] * 4 + [False] * 2]]])
    per_query = cf.tensor((np.random.default_rng(1).random((4, 6)) > 0.3).tolist())
    bias = rnd([4, 6], 49)
    p = cf.sigmoid(x)
    t01 = cf.to(cf.gt(y, 0), cf.float64)
    cases = [
        ("relu", F.relu(x), TF.relu(T(x))),
        ("gelu", F.gelu(x), TF.gelu(T(x))),
        ("gelu tanh", F.gelu(x, approximate="tanh"), TF.gelu(T(x), approximate="tanh")),
        ("silu", F.silu(x), TF.silu(T(x))),
        ("leaky_relu", F.leaky_relu(x, 0.1), TF.leaky_relu(T(x), 0.1)),
        ("softplus", F.softplus(x * 10, beta=2.0, threshold=5.0), TF.softplus(T(x) * 10, beta=2.0, threshold=5.0)),
        ("softmax", F.softmax(x, dim=0), TF.softmax(T(x), dim=0)),
        ("log_softmax", F.log_softmax(x, dim=1), TF.log_softmax(T(x), dim=1)),
        ("linear", F.linear(x, w, b), TF.linear(T(x), T(w), T(b))),
        ("linear without bias", F.linear(x, w), TF.linear(T(x), T(w))),
        # biases the fused op does not take, added after the product as torch's addmm broadcasts them
        ("linear 0-d bias", F.linear(x, w, cf.tensor(0.5, dtype=cf.float64)),
         TF.linear(T(x), T(w), torch.tensor(0.5, dtype=torch.float64))),
        ("linear broadcast bias", F.linear(x, w, cf.reshape(b, [1, -1])), TF.linear(T(x), T(w), T(b).reshape(1, -1))),
        ("layer_norm", F.layer_norm(x, [6], rnd([6], 50), rnd([6], 51)),
         TF.layer_norm(T(x), [6], T(rnd([6], 50)), T(rnd([6], 51)))),
        ("embedding", F.embedding(idx, rnd([5, 6], 52)),
         TF.embedding(torch.from_numpy(np.array(a(idx))), T(rnd([5, 6], 52)))),
        ("one_hot", F.one_hot(cf.tensor([2, 0, 1])), TF.one_hot(torch.tensor([2, 0, 1]))),
        ("pad", F.pad(x, (1, 2, 0, 1), value=-3.0), TF.pad(T(x), (1, 2, 0, 1), value=-3.0)),
        ("normalize", F.normalize(x, p=3.0, dim=0), TF.normalize(T(x), p=3.0, dim=0)),
        ("cosine_similarity", F.cosine_similarity(x, y), TF.cosine_similarity(T(x), T(y))),
        ("cross_entropy indices", F.cross_entropy(logits, cf.tensor([[0, 4, 1], [2, -100, 3], [1, 1, 0], [4, 2, 2]]),
                                                  weight=cls_w, label_smoothing=0.1),
         TF.cross_entropy(T(logits), torch.tensor([[0, 4, 1], [2, -100, 3], [1, 1, 0], [4, 2, 2]]), weight=T(cls_w),
                          label_smoothing=0.1)),
        ("cross_entropy probabilities", F.cross_entropy(logits, probs, weight=cls_w, label_smoothing=0.2),
         TF.cross_entropy(T(logits), T(probs), weight=T(cls_w), label_smoothing=0.2)),
        ("nll_loss", F.nll_loss(logp, cf.tensor([[0, 4, 1], [2, -100, 3], [1, 1, 0], [4, 2, 2]]), weight=cls_w),
         TF.nll_loss(T(logp), torch.tensor([[0, 4, 1], [2, -100, 3], [1, 1, 0], [4, 2, 2]]), weight=T(cls_w))),
        ("mse_loss", F.mse_loss(x, y, reduction="sum"), TF.mse_loss(T(x), T(y), reduction="sum")),
        ("l1_loss", F.l1_loss(x, y), TF.l1_loss(T(x), T(y))),
        ("binary_cross_entropy", F.binary_cross_entropy(p, t01), TF.binary_cross_entropy(T(p), T(t01))),
        ("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits(x, t01, pos_weight=b[0:1] * 0 + 2.0),
         TF.binary_cross_entropy_with_logits(T(x), T(t01), pos_weight=T(b[0:1] * 0 + 2.0))),
        ("sdpa", F.scaled_dot_product_attention(q, k, v), TF.scaled_dot_product_attention(T(q), T(k), T(v))
         if hasattr(TF, "scaled_dot_product_attention") else None),
    ]
    if hasattr(TF, "scaled_dot_product_attention"):  # torch >= 2.0
        cases += [
            ("sdpa causal", F.scaled_dot_product_attention(q, k[:, :, 0:4], v[:, :, 0:4], is_causal=True),
             TF.scaled_dot_product_attention(T(q), T(k)[:, :, 0:4], T(v)[:, :, 0:4], is_causal=True)),
            ("sdpa key mask", F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask),
             TF.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=torch.from_numpy(np.array(a(key_mask))))),
            ("sdpa per-query mask", F.scaled_dot_product_attention(q, k, v, attn_mask=per_query),
             TF.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=torch.from_numpy(np.array(a(per_query))))),
            ("sdpa float mask", F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.2),
             TF.scaled_dot_product_attention(T(q), T(k), T(v), attn_mask=T(bias), scale=0.2)),
        ]
    for name, ours, theirs in cases:
        if theirs is None:
            continue
        np.testing.assert_allclose(np.asarray(a(ours), dtype=np.float64), theirs.double().numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)


def test_pad_modes_match_torch_values_and_gradients():
    """reflect, replicate and circular padding on 1 to 3 trailing axes against torch (skipped without torch)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for shape, pads in (((1, 2, 3), (2, 1)), ((2, 3, 5), (0, 4)), ((1, 2, 4, 5), (1, 2, 3, 0)),
                        ((2, 1, 3, 4, 5), (1, 1, 2, 0, 0, 2)), ((2, 4, 6), (3, 3)), ((2, 3, 2), (5, 4, 0, 3))):
        for mode in ("reflect", "replicate", "circular"):
            if shape == (2, 3, 2) and mode != "replicate":
                continue  # pads beyond the axis: replicate only
            x = rng.standard_normal(shape)
            xt = torch.tensor(x, requires_grad=True)
            want = torch.nn.functional.pad(xt, pads, mode=mode)
            w = rng.standard_normal(tuple(want.shape))
            (want * torch.tensor(w)).sum().backward()
            xc = cf.tensor(x.tolist(), dtype=cf.float64, requires_grad=True)
            got = F.pad(xc, pads, mode=mode)
            (got * cf.tensor(w.tolist(), dtype=cf.float64)).sum().backward()
            np.testing.assert_array_equal(a(got), want.detach().numpy(), err_msg="%s %s %s" % (shape, pads, mode))
            np.testing.assert_allclose(a(xc.grad), xt.grad.numpy(), rtol=1e-12, err_msg="%s %s %s" % (shape, pads, mode))


def test_review_findings_on_functional():
    # binary_cross_entropy at p exactly 0 or 1 (sigmoid(20) in float32): a finite gradient, PyTorch's
    z = cf.tensor([-20.0, 20.0, 0.0]).requires_grad_(True)
    F.binary_cross_entropy(cf.sigmoid(z), cf.tensor([0.0, 1.0, 1.0])).backward()
    g = a(z.grad)
    assert np.isfinite(g).all() and g[1] == 0.0 and abs(g[2] + 1 / 6) < 1e-6
    with pytest.raises(cf.ShapeError, match=r"^\[binary_cross_entropy\] input \[3, 1\] and target \[3, 4\] must"):
        F.binary_cross_entropy(cf.full([3, 1], 0.5), cf.ones([3, 4]))
    # nll_loss with every target ignored: 0 and a zero gradient, as cross_entropy (PyTorch: NaN)
    x = rnd([3, 4], 60, requires_grad=True)
    ignored = cf.full([3], -100, dtype=cf.int64)
    loss = F.nll_loss(x, ignored)
    loss.backward()
    assert loss.item() == 0.0 and (a(x.grad) == 0).all()
    assert F.cross_entropy(x, ignored).item() == 0.0
    with pytest.raises(cf.DTypeError, match=r"^\[nll_loss\] target must hold int64 class indices"):
        F.nll_loss(x, cf.zeros([3]))
    with pytest.raises(cf.ShapeError, match=r"^\[nll_loss\] weight must have one entry per class \(4\)"):
        F.nll_loss(x, cf.tensor([0, 1, 2]), weight=cf.ones([3], dtype=cf.float64))
    # one sample (C,) with a () target, for both losses and for class probabilities
    logits, target = rnd([5], 61), cf.tensor(3)
    assert cf.allclose(F.cross_entropy(logits, target), F.cross_entropy(cf.unsqueeze(logits, 0), cf.tensor([3])))
    assert cf.allclose(F.nll_loss(logits, target), -logits[3])
    assert F.cross_entropy(logits, target, reduction="none").shape == ()
    probs = cf.softmax(rnd([5], 62), 0)
    np.testing.assert_allclose(a(F.cross_entropy(logits, probs)).item(),
                               -(a(probs) * np.log(softmax_np(a(logits), 0))).sum(), rtol=1e-12)
    # cosine_similarity broadcasts operands of different ranks
    u, v = rnd([4], 63), rnd([3, 4], 64)
    want = (a(v) @ a(u)) / (np.linalg.norm(a(v), axis=1) * np.linalg.norm(a(u)))
    np.testing.assert_allclose(a(F.cosine_similarity(u, v)), want, rtol=1e-12)
    with pytest.raises(cf.ShapeError, match=r"^\[cosine_similarity\] shapes \[1, 4\] and \[3, 5\] cannot be"):
        F.cosine_similarity(u, rnd([3, 5], 65))
    # dropout with p = 1 drops everything
    assert a(F.dropout(rnd([4], 66), 1.0)).tolist() == [0.0] * 4


def test_dropout_p1_in_eval_is_the_identity():
    x = rnd([3], 70)
    assert cf.equal(F.dropout(x, 1.0, training=False), x)
