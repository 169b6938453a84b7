"""cf.nn and cf.models from Python: layers, every attention variant by name, losses,
optimizers and schedules, checkpoints, configs, the papers' models."""
import pytest

import cf

# Options that make each variant work on the small inputs below.
VARIANT_OPTIONS = {
    "full": {},
    "lsh": {"n_hashes": 2, "bucket_size": 4, "seed": 1},
    "routing": {"n_clusters": 2, "seed": 1},
    "clustered": {"clusters": 3, "bits": 16, "iterations": 3},
    "improved-clustered": {"clusters": 3, "bits": 16, "iterations": 3, "topk": 4},
    "cluster-former": {"chunk_size": 4, "num_clusters": 2, "memory_size": 64},
    "neural-clustering": {"clusters": 3},
    "sparse": {"block_size": 4, "summary": 1},
}


def test_every_registered_variant_has_options_here():
    assert sorted(cf.nn.attention_types()) == sorted(VARIANT_OPTIONS)


@pytest.mark.parametrize("variant", sorted(VARIANT_OPTIONS))
def test_multi_head_attention_by_name(variant):
    g = cf.Generator(0)
    mha = cf.nn.MultiHeadAttention(variant, d_model=16, n_heads=2, generator=g, **VARIANT_OPTIONS[variant])
    assert mha.attention.type == variant and isinstance(mha.attention, cf.nn.Attention)
    x = cf.randn([2, 12, 16], generator=g, requires_grad=True)
    mask = cf.zeros([2, 12], dtype=cf.bool)
    mask[1, 10:] = True
    y = mha(x, key_padding_mask=mask)
    assert y.shape == (2, 12, 16)
    cf.sum(y * y).backward()
    assert x.grad is not None and all(p.grad is not None for p in (mha.w_q.weight, mha.w_o.weight))
    names = [n for n, _ in mha.named_parameters()]
    assert "w_q.weight" in names and "w_o.bias" in names


def test_make_attention_and_specific_classes():
    a = cf.nn.make_attention("neural-clustering", 16, 2, clusters=4)
    assert isinstance(a, cf.nn.NeuralClusteringAttention) and a.centroids.shape == (4, 16)
    c = cf.nn.make_attention("clustered", 16, 2, clusters=2, bits=8)
    assert isinstance(c, cf.nn.ClusteredAttention) and c.type == "clustered"
    q = cf.randn([1, 2, 6, 8])
    aux = cf.nn.AuxLosses()
    out = a(q, q, q, query_input=cf.randn([1, 6, 16]), aux=aux)
    assert out.shape == (1, 2, 6, 8) and aux.names() == [cf.nn.CLUSTERING_LOSS, cf.nn.CENTROID_SORTING_LOSS]
    with pytest.raises(cf.ValueError, match="required key 'attention.clusters'"):
        cf.nn.make_attention("neural-clustering", 16, 2)
    s = cf.nn.make_attention("sparse", 16, 2, summary=2)
    assert isinstance(s, cf.nn.SparseAttention) and s.block_for(10) == 4 and s.summary_for(4) == 2
    with pytest.raises(cf.ValueError, match=r"summary \(c = 5\) must be <= block_size \(l = 4\)"):
        cf.nn.make_attention("sparse", 16, 2, block_size=4, summary=5)


def test_linear_matches_the_formula_and_layers_compose():
    lin = cf.nn.Linear(3, 2, generator=cf.Generator(1))
    x = cf.randn([4, 3])
    ref = x @ lin.weight.T + lin.bias
    assert cf.amax(cf.abs(lin(x) - ref)).item() < 1e-6
    seq = cf.nn.Sequential([lin, cf.nn.ReLU(), cf.nn.Linear(2, 1)])
    assert seq(x).shape == (4, 1) and len(seq) == 3 and isinstance(seq[1], cf.nn.ReLU)
    assert isinstance(seq[-2], cf.nn.ReLU) and seq[-3].weight.data_ptr() == lin.weight.data_ptr()
    with pytest.raises(cf.IndexError, match=r"\[Sequential\] index -4 out of range for 3 layers"):
        seq[-4]
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    enc = cf.nn.TransformerEncoderLayer(d_model=8, n_heads=2, d_ff=16, dropout=0.0,
                                        attention={"type": "neural-clustering", "clusters": 2})
    assert enc(cf.randn([2, 5, 8])).shape == (2, 5, 8)
    with pytest.raises(cf.ValueError, match="unknown option .d_fff."):
        cf.nn.TransformerEncoderLayer(d_model=8, d_fff=3)
    opts = cf.nn.CentroidAttentionOptions(d_model=8, n_heads=2, init="mean", downsample=2)
    block = cf.nn.CentroidAttentionBlock(opts, d_ff=16)
    u, mask, idx, pos = block(cf.randn([2, 6, 8]))
    assert u.shape == (2, 3, 8)
    with pytest.raises(cf.ValueError, match="unknown option 'dmodel'"):
        cf.nn.CentroidAttentionOptions(dmodel=8)


def test_training_with_adamw_and_a_schedule_lowers_the_loss():
    g = cf.Generator(3)
    x = cf.randn([64, 4], generator=g)
    w_true = cf.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ w_true
    model = cf.nn.Sequential([cf.nn.Linear(4, 16, generator=g), cf.nn.Tanh(), cf.nn.Linear(16, 1, generator=g)])
    opt = cf.nn.AdamW(model, lr=1e-2, weight_decay=0.0)
    sched = cf.nn.WarmupCosineLR(1e-2, warmup=10, total=200)
    losses = []
    for _ in range(200):
        sched.apply(opt)
        loss = cf.nn.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        cf.nn.clip_grad_norm(model, 10.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])
    assert opt.step_count == 200 and opt.name == "AdamW" and sched.lr_at(10) == pytest.approx(1e-2)
    sd = opt.state_dict()
    assert "step" in sd and any(k.startswith("exp_avg.") for k in sd)


def test_clip_grad_norm_tensor_matches_clip_grad_norm():
    # gradients whose squares sum exactly in any order: the tensor form gives clip_grad_norm's numbers
    def model():
        p = cf.zeros([4], requires_grad=True)
        q = cf.zeros([2], requires_grad=True)
        p.grad = cf.tensor([0.5, -1.5, 2.0, 0.25])
        q.grad = cf.tensor([3.0, -0.75])
        return [p, q]
    a, b = model(), model()
    n = cf.nn.clip_grad_norm_tensor(a, 1.0)
    assert isinstance(n, cf.Tensor) and n.dim() == 0 and n.dtype == cf.float64
    assert n.item() == cf.nn.clip_grad_norm(b, 1.0) == cf.nn.grad_norm_tensor(model()).item()
    assert [x.grad.tolist() for x in a] == [x.grad.tolist() for x in b]
    with pytest.raises(cf.ValueError, match=r"^\[clip_grad_norm_tensor\] max_norm must be > 0, got 0"):
        cf.nn.clip_grad_norm_tensor(a, 0.0)
    with pytest.raises(cf.ValueError, match=r"^\[grad_norm_tensor\] norm_type must be > 0"):
        cf.nn.grad_norm_tensor(a, -1.0)


def test_state_dict_checkpoint_and_safetensors(tmp_path):
    g = cf.Generator(5)
    model = cf.nn.Linear(3, 2, generator=g)
    opt = cf.nn.SGD(model, lr=0.1, momentum=0.9)
    cf.nn.mse_loss(model(cf.ones([1, 3])), cf.zeros([1, 2])).backward()
    opt.step()
    path = str(tmp_path / "ckpt.safetensors")
    cf.nn.save_checkpoint(path, model=model, optimizer=opt, step=7, generators={"g": g}, extra={"note": "hi"})
    ck = cf.nn.load_checkpoint(path)
    assert ck.step == 7 and ck.extra == {"note": "hi"} and ck.generators["g"] == (g.seed, g.offset)
    other = cf.nn.Linear(3, 2, generator=cf.Generator(99))
    other.load_state_dict(ck.model)
    assert other.weight.tolist() == model.weight.tolist()
    opt2 = cf.nn.SGD(other, lr=0.1, momentum=0.9)
    opt2.load_state_dict(ck.optimizer)
    assert opt2.step_count == 1
    with pytest.raises(cf.ValueError, match=r"^\[load_state_dict\] state dict does not fit the module: missing keys: "
                                          r"bias; shape or dtype mismatch: weight \(expected \(2,3\), got \(3,3\)\)"):
        other.load_state_dict({"weight": cf.zeros([3, 3])})
    with pytest.raises(TypeError, match=r"\[save_checkpoint\] generators maps names \(str\) to cf.Generator"):
        cf.nn.save_checkpoint(path, model=model, generators={"g": 1})  # before: std::bad_cast
    with pytest.raises(TypeError, match=r"\[save_checkpoint\] generators must be a dict"):
        cf.nn.save_checkpoint(path, model=model, generators=[g])
    with pytest.raises(TypeError, match=r"^\[save_checkpoint\] optimizer is a cf.nn.Module"):
        cf.nn.save_checkpoint(path, model=model, optimizer=model)
    with pytest.raises(TypeError, match=r"^\[save_checkpoint\] model is a cf.nn optimizer"):
        cf.nn.save_checkpoint(path, model=opt)
    with pytest.raises(cf.ValueError, match=r"^\[save_checkpoint\] .*step must be >= 0, got -1"):
        cf.nn.save_checkpoint(path, model=model, step=-1)
    assert cf.nn.load_checkpoint(path).step == 7  # the refused saves left the checkpoint as it was
    st = str(tmp_path / "t.safetensors")
    cf.save_safetensors(st, {"a": cf.arange(3), "b": cf.ones([2, 2])}, {"k": "v"})
    # metadata problems are named (a lone surrogate was nanobind's bare "incompatible function arguments")
    with pytest.raises(cf.ValueError, match=r"^\[save_safetensors\] metadata value of 'k' is not valid UTF-8"):
        cf.save_safetensors(st, {"a": cf.arange(3)}, {"k": "\udcff"})
    with pytest.raises(TypeError, match=r"^\[save_safetensors\] metadata value of 'k' must be a str, got int"):
        cf.save_safetensors(st, {"a": cf.arange(3)}, {"k": 1})
    with pytest.raises(TypeError, match=r"^\[save_safetensors\] metadata must be a dict of str to str, got list"):
        cf.save_safetensors(st, {"a": cf.arange(3)}, [("k", "v")])
    tensors, meta = cf.load_safetensors(st)
    assert list(tensors) == ["a", "b"] and tensors["a"].tolist() == [0, 1, 2] and meta == {"k": "v"}


def test_set_parameters_and_set_buffers_use_the_given_tensors_and_check_them():
    mha = cf.nn.MultiHeadAttention("routing", d_model=8, n_heads=2, generator=cf.Generator(0))
    (name, old), = mha.named_buffers()
    assert name == "attention.centroids"
    new = cf.zeros(old.shape)
    mha.set_buffers([new])
    assert mha.named_buffers()[0][1].data_ptr() == new.data_ptr()  # used as given, no copy
    with pytest.raises(cf.ValueError, match=r"\[set_buffers\] module has 1 buffers, got 0 tensors"):
        mha.set_buffers([])
    with pytest.raises(cf.ValueError, match=r"\[set_buffers\] 'attention.centroids' is .*float64"):
        mha.set_buffers([cf.zeros(old.shape, dtype=cf.float64)])
    ps = [cf.ones(p.shape) for p in mha.parameters()]
    mha.set_parameters(ps)
    assert mha.parameters()[0].data_ptr() == ps[0].data_ptr()
    with pytest.raises(cf.ValueError, match=r"\[set_parameters\] 'w_q.weight' is"):
        mha.set_parameters([cf.ones([1])] + ps[1:])


def test_to_keeps_parameters_so_an_optimizer_built_before_trains_the_model():
    # PyTorch's module.to() assigns param.data; cf's to() made new tensors, so the optimizer
    # went on stepping the old ones and the converted model never moved.
    lin = cf.nn.Linear(2, 1, bias=False, generator=cf.Generator(0))
    w = lin.weight
    opt = cf.nn.SGD(lin, lr=0.1, momentum=0.9)
    lin.to(cf.float64)
    assert w.dtype == cf.float64 and w.data_ptr() == lin.weight.data_ptr()
    before = lin.weight.tolist()
    for _ in range(2):
        opt.zero_grad()
        lin(cf.ones([4, 2], dtype=cf.float64)).sum().backward()
        opt.step()
    g = 4.0  # d/dw of sum over 4 rows of w . (1, 1)
    expected = [b - 0.1 * g - 0.1 * (0.9 * g + g) for b in before[0]]
    assert lin.weight.tolist()[0] == pytest.approx(expected, abs=1e-12)
    assert opt.state_dict()["momentum.weight"].dtype == cf.float64
    # .data, as in PyTorch: the same tensor shows other data
    t = cf.zeros([2], requires_grad=True)
    t.data = cf.ones([3], dtype=cf.float64)
    assert t.shape == (3,) and t.requires_grad and t.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(cf.DTypeError, match=r"\[set_data\] .*requires grad.*int64"):
        t.data = cf.zeros([3], dtype=cf.int64)


def test_tensor_members_none_when_absent_and_assignments_checked():
    lin = cf.nn.Linear(3, 2, bias=False)
    assert lin.bias is None  # PyTorch's idiom: if m.bias is not None: ...
    norm = cf.nn.LayerNorm(4, affine=False)
    assert norm.weight is None and norm.bias is None
    with pytest.raises(cf.ValueError, match=r"^\[Linear.weight\] is float32 \(2,3\) on cpu, got float64 \(5,7\)"):
        lin.weight = cf.randn([5, 7], dtype=cf.float64)
    with pytest.raises(cf.ValueError, match=r"^\[Linear.bias\] this module was built without it"):
        lin.bias = cf.zeros([2])
    with pytest.raises(cf.ValueError, match=r"^\[Linear.weight\] cannot be removed"):
        lin.weight = None
    with pytest.raises(cf.ValueError, match=r"^\[Linear.weight\] requires grad and the given tensor does not"):
        lin.weight = cf.zeros([2, 3])  # it would freeze the layer without a word
    # tying: the same tensor in both modules, used as given
    emb, head = cf.nn.Embedding(10, 4), cf.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    assert head.weight.data_ptr() == emb.weight.data_ptr()
    assert head.named_parameters()[0][1].data_ptr() == emb.weight.data_ptr()


def test_copying_or_pickling_a_module_says_how_to_copy_it():
    import copy
    import pickle
    lin = cf.nn.Linear(3, 2)
    for what, f in (("copy", copy.copy), ("deepcopy", copy.deepcopy), ("pickle", pickle.dumps)):
        with pytest.raises(TypeError, match=r"^\[%s\] a cf.nn module \(.*Linear\) cannot be copied or pickled: "
                           r"build a new .*Linear with the same arguments.*load_state_dict\(old.state_dict\(\)\)"
                           % what):
            f(lin)
    twin = cf.nn.Linear(3, 2)  # the way the message gives
    twin.load_state_dict(lin.state_dict())
    assert twin.weight.tolist() == lin.weight.tolist() and twin.weight.data_ptr() != lin.weight.data_ptr()


def test_optimizer_parameter_groups_as_torch_optim_takes_them():
    lin = cf.nn.Linear(2, 2, generator=cf.Generator(0))
    # two groups of unnamed tensors (before: "parameter name '0' appears twice")
    opt = cf.nn.SGD([{"params": [lin.weight], "lr_scale": 0.1}, {"params": [lin.bias]}], lr=1.0, momentum=0.9)
    cf.sum(lin(cf.ones([1, 2]))).backward()
    opt.step()
    lin.zero_grad()
    assert {k for k in opt.state_dict() if k.startswith("momentum.")} == {"momentum.0.0",
                                                                         "momentum.1.0"}
    one = cf.nn.SGD([{"params": [lin.weight, lin.bias]}], lr=1.0, momentum=0.9)  # one group: names as before
    cf.sum(lin(cf.ones([1, 2]))).backward()
    one.step()
    lin.zero_grad()
    assert {k for k in one.state_dict() if k.startswith("momentum.")} == {"momentum.0",
                                                                       "momentum.1"}
    # a group's own "lr" (before: silently ignored, every group stepped at the optimizer's lr)
    opt = cf.nn.SGD([{"params": {"w": lin.weight}, "lr": 0.1}, {"params": {"b": lin.bias}}], lr=1.0)
    w0, b0 = lin.weight.tolist(), lin.bias.tolist()
    cf.sum(lin(cf.ones([1, 2]))).backward()  # every gradient is 1
    opt.step()
    assert all(abs(a - b - 0.1) < 1e-6 for r0, r1 in zip(w0, lin.weight.tolist()) for a, b in zip(r0, r1))
    assert all(abs(a - b - 1.0) < 1e-6 for a, b in zip(b0, lin.bias.tolist()))
    with pytest.raises(TypeError, match=r"\[SGD\] a list of parameter groups holds dicts .* group 1 is a"):
        cf.nn.SGD([{"params": [lin.weight]}, lin.bias])  # before: SystemError from the interpreter
    with pytest.raises(cf.ValueError, match=r"\[Adam\] parameter group 0: unknown key 'lr_sclae'"):
        cf.nn.Adam([{"params": [lin.weight], "lr_sclae": 0.1}])
    with pytest.raises(TypeError, match=r"\[AdamW\] parameter group 0: 'weight_decay' must be a number"):
        cf.nn.AdamW([{"params": [lin.weight], "weight_decay": "x"}])
    with pytest.raises(cf.ValueError, match=r"gives both lr and lr_scale"):
        cf.nn.SGD([{"params": [lin.weight], "lr": 0.1, "lr_scale": 2.0}])
    with pytest.raises(cf.ValueError, match=r'parameter group 0 has no "params"'):
        cf.nn.SGD([{"lr": 0.1}])
    import numpy as np
    # a value that is not a tensor is named (before: "RuntimeError: std::bad_cast")
    with pytest.raises(TypeError, match=r"\[load_state_dict\] 'weight' is a ndarray, not a cf.Tensor"):
        lin.load_state_dict({"weight": np.ones((2, 2), "f"), "bias": np.ones(2, "f")})
    with pytest.raises(TypeError, match=r"\[SGD\] a list holds tensors or \(name, tensor\) pairs, got a int"):
        cf.nn.SGD([lin.weight, 3])


def test_config_checks_types_and_unknown_keys(tmp_path):
    c = cf.nn.Config({"steps": 10, "lr": 0.5, "model": {"d": 4}}, "", "run.json")
    assert c.get("steps", 1) == 10 and c.get("lr", 0.1) == 0.5 and c.get("name", "x") == "x"
    assert c.child("model").require("d", int) == 4
    with pytest.raises(cf.ValueError, match="steps"):
        c.get("steps", "text")
    c2 = cf.nn.Config({"a": 1, "b": 2})
    c2.get("a", 0)
    with pytest.raises(cf.ValueError, match="unknown key 'b'"):
        c2.finish()
    p = tmp_path / "c.json"
    p.write_text('{"x": [1, 2], // comment\n "y": {"z": null}}')
    assert cf.nn.load_json_file(str(p)) == {"x": [1, 2], "y": {"z": None}}


def test_encoder_classifier_from_config_learns_a_token_rule():
    # class = whether token 3 occurs in the sequence
    g = cf.Generator(11)
    ids = cf.randint(4, 10, [64, 8], generator=g)
    labels = cf.bernoulli([64], 0.5, generator=g)
    for i, flag in enumerate(labels.tolist()):
        if flag:
            ids[i, i % 8] = 3
    labels = labels.to(cf.int64)
    model = cf.models.EncoderClassifier({"vocab_size": 10, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                                         "dropout": 0.0, "num_classes": 2, "max_len": 8, "pad_id": 0},
                                        generator=g)
    opt = cf.nn.AdamW(model, lr=3e-3)
    for _ in range(80):
        loss = cf.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    acc = cf.mean(cf.to(cf.eq(cf.argmax(model(ids), 1), labels), cf.float32)).item()
    assert acc > 0.9, acc


def test_paper_models_build_and_run():
    g = cf.Generator(2)
    cfg = cf.models.clusterformer_classifier_config(vocab_size=20, max_len=16, num_classes=3)
    assert cfg["attention"]["type"] == "neural-clustering" and cfg["d_model"] == 300
    cfg.update(d_model=16, n_heads=2, d_ff=32)
    clf = cf.models.EncoderClassifier(cfg, generator=g)
    ids = cf.randint(1, 20, [2, 16], generator=g)
    aux = cf.nn.AuxLosses()
    logits = clf(ids, aux=aux)
    loss = cf.models.clusterformer_loss(cf.cross_entropy(logits, cf.tensor([0, 2])), aux,
                                        cf.models.ClusterFormerLossWeights())
    loss.backward()
    lm = cf.models.ClusterFormerLM(vocab_size=12, max_len=32, n_layers=2, window=8, stride=6, cluster_layers=[1],
                                   d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                                   cluster_attention={"num_clusters": 2, "memory_size": 64, "update_every": 1},
                                   generator=g)
    assert lm(cf.randint(1, 12, [2, 20], generator=g)).shape == (2, 20, 12)
    assert lm.on_train_step() >= 0
    qa = cf.models.ClusterFormerQA(vocab_size=12, max_len=32, n_layers=2, window=8, stride=6, cluster_layers=[1],
                                   d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                                   cluster_attention={"num_clusters": 2, "memory_size": 64}, generator=g)
    assert len(qa.encoder.memory_banks()) == 1  # its banks reachable from Python (no encoder attribute before)
    enc = cf.models.ClusterFormerEncoder(vocab_size=20, max_len=32, n_layers=2, window=8, stride=6, cluster_layers=[1],
                                         d_model=8, n_heads=2, d_ff=16,
                                         cluster_attention={"num_clusters": 2, "memory_size": 32, "update_every": 1},
                                         generator=g)
    states = enc(cf.randint(1, 20, [2, 12], generator=g))
    assert states.context.shape == (2, 12, 8) and states.question is None  # (an undefined tensor before)
    pc = cf.models.PointCloudClassifier(cf.models.PointCloudOptions(num_classes=3, widths=[8, 8, 8, 16], knn=4,
                                                                     fuse_dim=16, head=[8, 8], n_heads=2),
                                        generator=g)
    assert pc(cf.randn([2, 32, 3], generator=g)).shape == (2, 3)
    vit = cf.models.CentroidViT(cf.models.CentroidViTOptions(image_size=8, in_channels=1, patch_kernel=2,
                                                            patch_stride=2, d_model=8, n_heads=2, d_ff=16,
                                                            n_layers=2, centroid_at=2, num_classes=4), generator=g)
    assert vit(cf.randn([2, 1, 8, 8], generator=g)).shape == (2, 4)
    assert cf.models.set_attention(clf, {"type": "full"}) == 2
    tok = cf.models.TokenClassifier({"vocab_size": 10, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1,
                                     "num_classes": 4, "max_len": 8}, generator=g)
    assert tok(cf.randint(1, 10, [3, 8], generator=g)).shape == (3, 8, 4)
    with pytest.raises(ValueError, match="num_classes must be positive"):
        cf.models.TokenClassifier(vocab_size=10, num_classes=0)


def test_commitment_loss_matches_its_composition_and_names_bad_input():
    x = cf.randn([2, 3, 5, 4]).requires_grad_()
    mu = cf.randn([3, 6, 4])
    assign = cf.randint(0, 6, [2, 3, 5])
    mask = cf.tensor([[False] * 5, [False] * 3 + [True] * 2])
    loss = cf.commitment_loss(x, mu, assign, mask, scale=0.5)
    loss.backward()
    target = cf.take_along_dim(cf.reshape(mu, [1, 3, 6, 4]), cf.reshape(assign, [2, 3, 5, 1]), 2)
    keep = cf.to(cf.reshape(cf.logical_not(mask), [2, 1, 5, 1]), cf.float32)
    want = cf.sum(cf.square(x.detach() - target) * keep) * 0.5
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    grad = (x.detach() - target) * keep
    got, expected = cf.reshape(x.grad, [-1]).tolist(), cf.reshape(grad, [-1]).tolist()
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5
    with pytest.raises(cf.AutogradError, match=r"\[commitment_loss\] the centroids are sg\(mu\)"):
        cf.commitment_loss(x, mu.requires_grad_(), assign)


def test_cluster_means_and_cluster_topk_attention_match_their_definitions():
    x = cf.randn([1, 2, 6, 3]).requires_grad_()
    ids = cf.tensor([[[0, 1, 0, -1, 2, 1], [2, 2, 0, 1, -1, -1]]])
    means = cf.cluster_means(x, ids, 3, scale=0.5)
    assert means.shape == (1, 2, 3, 3)
    xs, idl = x.detach().tolist(), ids.tolist()
    for h in range(2):
        for c in range(3):
            rows = [xs[0][h][i] for i in range(6) if idl[0][h][i] == c]
            for j in range(3):
                want = 0.5 * sum(r[j] for r in rows) / max(len(rows), 1)
                assert means[0, h, c, j].item() == pytest.approx(want, abs=1e-6)
    cf.sum(means).backward()
    assert x.grad[0, 0, 3, 0].item() == 0.0  # id -1: in no cluster
    assert x.grad[0, 0, 0, 0].item() == pytest.approx(0.25)  # cluster 0 of head 0 has 2 members
    # Each query attends to its cluster's top keys: with every key listed, plain softmax attention.
    q, k, v = cf.randn([1, 1, 4, 3]), cf.randn([1, 1, 5, 3]), cf.randn([1, 1, 5, 2])
    top = cf.reshape(cf.arange(5), [1, 1, 1, 5])
    out = cf.cluster_topk_attention(q, k, v, top, cf.zeros([1, 1, 4], dtype=cf.int64), scale=0.7)
    want = cf.matmul(cf.softmax(cf.matmul(q, cf.transpose(k, 2, 3)) * 0.7, -1), v)
    assert max(abs(a - b) for a, b in zip(cf.reshape(out, [-1]).tolist(), cf.reshape(want, [-1]).tolist())) < 1e-5
    with pytest.raises(cf.IndexError, match=r"\[cluster_topk_attention\] cluster id 1"):
        cf.cluster_topk_attention(q, k, v, top, cf.ones([1, 1, 4], dtype=cf.int64))
    with pytest.raises(cf.IndexError, match=r"\[cluster_means\] cluster id 2 at flat position 4"):
        cf.cluster_means(x, ids, 2)


def test_neural_clustering_losses_and_their_bounded_forms():
    x = cf.randn([2, 6, 4])
    u, c_hat, index, order = cf.nn.neural_clustering(x, cf.randn([3, 4]), cf.randn([4, 4]))
    assert u.shape == (2, 3, 6) and c_hat.shape == (2, 3, 4)
    # The paper's inner product scales with the centroids; the bounded forms do not.
    for form in ("cosine", "sphere"):
        l1 = cf.nn.clustering_loss(x, c_hat, index, form=form).item()
        l1_scaled = cf.nn.clustering_loss(x, c_hat * 100.0, index, form=form).item()
        assert abs(l1 - l1_scaled) < 1e-4 * max(1.0, abs(l1))
        l2 = cf.nn.centroid_sorting_loss(c_hat, form=form).item()
        assert -1.0 - 1e-6 <= l2 <= 1.0 + 1e-6
    inner = cf.nn.centroid_sorting_loss(c_hat).item()
    assert cf.nn.centroid_sorting_loss(c_hat * 10.0).item() == pytest.approx(100.0 * inner, rel=1e-4)
    with pytest.raises(ValueError, match=r'\[clustering_loss\] loss_form must be "inner", "cosine" or "sphere"'):
        cf.nn.clustering_loss(x, c_hat, index, form="unit")
    # The fused ops of the registry are the same functions at the top level, with their gradients.
    mask = cf.tensor([[False] * 6, [False] * 4 + [True] * 2])
    idx = cf.where(mask, cf.full_like(index, 3), index)
    for form in ("inner", "cosine", "sphere"):
        c = c_hat.detach().requires_grad_()
        loss = cf.clustering_loss(x, c, idx, mask, form=form) + cf.centroid_sorting_loss(c, form=form)
        assert loss.dim() == 0
        assert loss.item() == pytest.approx((cf.nn.clustering_loss(x, c_hat, idx, mask, form=form) +
                                             cf.nn.centroid_sorting_loss(c_hat, form=form)).item(), rel=1e-6)
        loss.backward()
        assert c.grad.shape == (2, 3, 4)
    with pytest.raises(ValueError, match=r'\[centroid_sorting_loss\] loss_form must be'):
        cf.centroid_sorting_loss(c_hat, form="euclid")
    with pytest.raises(cf.DTypeError, match=r"\[clustering_loss\] x and c_hat must share one float dtype"):
        cf.clustering_loss(x.double(), c_hat, index)


def test_handles_to_a_replaced_attention_stay_valid():
    # .attention and named_modules() returned borrowed pointers: after set_attention the old
    # module was freed and reading through the handle crashed
    m = cf.nn.MultiHeadAttention("clustered", 8, 2, clusters=3)
    old = m.attention
    named = dict(m.named_modules())["attention"]
    m.set_attention(cf.nn.make_attention("full", 8, 2))
    assert old.type == "clustered" and named.type == "clustered"
    assert m.attention.type == "full"
    assert dict(m.named_modules())[""] is m
    with pytest.raises(cf.ValueError, match=r"^\[MultiHeadAttention\] set_attention: attention is null"):
        m.set_attention(None)  # (was nanobind's signature dump)


def test_a_submodule_cycle_is_refused():
    s = cf.nn.Sequential([cf.nn.Identity()])
    with pytest.raises(cf.ValueError, match=r"would make a cycle"):
        s.append(s)
    assert len(s) == 1


def test_overriding_forward_of_a_cf_module_is_refused():
    # the C++ forward ran under __call__ and Sequential, the override only under m.forward(x)
    with pytest.raises(TypeError, match=r"overrides forward/__call__ of Linear, a C\+\+ module"):
        class MyLinear(cf.nn.Linear):  # noqa: F841
            def forward(self, x):
                return super().forward(x).relu()

    class Relu:
        def forward(self, x):
            return x.relu()

    with pytest.raises(TypeError, match=r"overrides forward"):  # a mixin's forward too
        class Mixed(Relu, cf.nn.Linear):  # noqa: F841
            pass

    class Tagged(cf.nn.Linear):  # adding attributes stays allowed
        tag = "head"

    t = Tagged(2, 2)
    assert t.tag == "head" and t(cf.ones([1, 2])).shape == (1, 2)
    # cf.nn.Attention is abstract with no Python base to build (it failed at construction: "no constructor
    # defined!"); cf.nn.Module and cf.nn.UnaryModule are the Python bases (test_python_modules.py)
    with pytest.raises(TypeError, match=r"derives from Attention, an abstract cf module.*derive from cf.nn.Module"):
        class Mine(cf.nn.Attention):  # noqa: F841
            pass

    class Deeper(Tagged):  # a subclass of a subclass of a concrete module stays allowed
        pass

    assert Deeper(2, 2)(cf.ones([1, 2])).shape == (1, 2)


def test_numpy_and_dlpack_views_keep_their_memory_when_the_tensor_gets_other_data():
    # the views held the tensor handle, whose storage Module.to / .data = replaced and freed: the
    # arrays then read and wrote the next tensor the allocator placed there
    np = pytest.importorskip("numpy")
    a = cf.ones([1000])
    n, d = np.asarray(a), np.from_dlpack(a)
    a.data = cf.zeros([7], dtype=cf.float64)
    junk = cf.full([1000], 123.0)
    assert n[:3].tolist() == [1.0, 1.0, 1.0] and d[:3].tolist() == [1.0, 1.0, 1.0]
    n[:] = -5.0
    assert junk.sum().item() == 123000.0 and d[0] == -5.0
    # np.array copies, np.asarray shares; copy= as NumPy 2 passes it
    t = cf.tensor([1.0, 2.0])
    c = np.array(t)
    c[0] = 9.0
    assert t.tolist() == [1.0, 2.0]
    assert t.__array__(copy=True).__array_interface__["data"][0] != np.asarray(t).__array_interface__["data"][0]
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match=r"\[__array__\].*needs a copy"):
        t.__array__(np.float64, copy=False)
    m = cf.nn.MultiHeadAttention("routing", 8, 2, n_clusters=2)
    buf = dict(m.named_buffers())["attention.centroids"]
    view = buf.numpy()
    before = view.copy()
    m.to(cf.float64)
    assert buf.dtype == cf.float64
    cf.full([4096], 7.0)
    assert (view == before).all()


def test_edges_found_by_a_model_side_bug_hunt():
    # A memory bank took loaded counters outside itself, and the next add() wrote outside its memory (segfault).
    b = cf.nn.MemoryBank(cf.nn.MemoryBankOptions(dim=3, capacity=5, num_clusters=2, update_every=1),
                         generator=cf.Generator(0))
    sd = {k: v.clone() for k, v in b.state_dict().items()}
    sd["counters"] = cf.tensor([0, 10**9, 0, 0])
    with pytest.raises(cf.ValueError, match=r"^\[MemoryBank\] loaded counters \[0, 1000000000, 0, 0\]"):
        b.load_state_dict(sd)
    b.add(cf.ones([1, 3]))  # the bank was emptied, and works
    assert b.size() == 1
    # Cluster-Former attention on a batch of 0 gives an empty result, as the other variants (was kmeans_assign's
    # "empty input" error)
    mha = cf.nn.MultiHeadAttention("cluster-former", 8, 2, chunk_size=2, num_clusters=2, memory_size=16)
    assert mha(cf.zeros([0, 5, 8])).shape == (0, 5, 8)
    # a centroid block's parts its initialisation does not make are None (were undefined tensors: repr raised)
    block = cf.nn.CentroidAttentionBlock(cf.nn.CentroidAttentionOptions(d_model=8, n_heads=2, init="mean",
                                                                          downsample=2.0), d_ff=16)
    u, mask, idx, pos = block(cf.randn([2, 6, 8]))
    assert u.shape == (2, 3, 8) and idx is None and pos is None
    # a NaN slope is refused, not a model of NaN outputs
    with pytest.raises(cf.ValueError, match=r"bad slope in 'leaky_relu:nan'"):
        cf.nn.make_activation("leaky_relu:nan")
    # a module moved to a device named badly: cf's message (was a warning and a bare TypeError)
    with pytest.raises(cf.ValueError, match=r"^\[device\] cannot parse device 'gpu'"):
        cf.nn.Linear(2, 2).to("gpu")


def test_pytorch_training_idioms():
    # from a bug hunt that ported PyTorch training loops
    nn = cf.nn
    m = nn.Linear(3, 2)
    m(cf.randn(4, 3)).sum().backward()
    # generators, filter(...) and single tensors where PyTorch takes them
    norm = nn.clip_grad_norm((p for p in m.parameters()), 1e9)
    assert norm == pytest.approx(nn.grad_norm(m.parameters()))
    assert nn.grad_norm(m.weight) == pytest.approx(nn.grad_norm([m.weight]))
    assert isinstance(nn.AdamW(filter(lambda p: p.requires_grad, m.parameters()), lr=0.1), nn.AdamW)
    nn.SGD(({"params": [p]} for p in m.parameters()), lr=0.1)
    with pytest.raises(cf.ValueError, match=r"^\[clip_grad_norm\] expects .* got a int"):
        nn.clip_grad_norm(3, 1.0)
    # betas=(b1, b2) is beta1/beta2
    g = cf.tensor([2.0, -1.0])

    def step(**kw):  # after one step: exp_avg = (1 - beta1) g, exp_avg_sq = (1 - beta2) g^2
        p = cf.ones([2], requires_grad=True)
        opt = nn.Adam([p], **kw)
        p.grad = g
        opt.step()
        d = opt.state_dict()
        return d["exp_avg.0"].tolist(), d["exp_avg_sq.0"].tolist()
    assert step(betas=(0.8, 0.95)) == step(beta1=0.8, beta2=0.95) != step()
    assert step(betas=(0.8, 0.95))[0] == pytest.approx([0.4, -0.2])
    with pytest.raises(cf.ValueError, match=r"\[AdamW\] give betas"):
        nn.AdamW(m.parameters(), betas=(0.8, 0.9), beta1=0.5)
    # initialisers return their tensor; normal_ defaults to N(0, 1)
    w = cf.empty(3, 3)
    assert nn.init.xavier_uniform_(w) is w and nn.init.normal_(w) is w and nn.init.zeros_(w) is w
    # Embedding's padding_idx counts from the end when negative, None is no padding row
    e = nn.Embedding(10, 4, padding_idx=-1)
    assert e.weight[9].tolist() == [0.0] * 4
    assert nn.Embedding(10, 4, padding_idx=-10).weight[0].tolist() == [0.0] * 4
    assert any(v != 0 for v in nn.Embedding(10, 4).weight[9].tolist())
    with pytest.raises(cf.ValueError, match=r"\[Embedding\] padding_idx 10 out of range for 10"):
        nn.Embedding(10, 4, padding_idx=10)
    assert nn.Dropout().p == 0.5
    # f"{loss:.4f}" on a 0-d tensor
    loss = cf.tensor(1.23456)
    assert f"{loss:.3f}" == "1.235" and f"{loss}" == str(loss)
    with pytest.raises(TypeError, match=r"\[__format__\] the format spec '.2f' needs a 0-d tensor"):
        f"{cf.ones([2]):.2f}"
    # clamp with one side, argmax of the flattened tensor
    t = cf.tensor([[-1.0, 3.0], [5.0, 0.5]])
    assert t.clamp(min=0.0).tolist() == [[0.0, 3.0], [5.0, 0.5]]
    assert cf.clamp(t, high=1.0).tolist() == [[-1.0, 1.0], [1.0, 0.5]]
    with pytest.raises(cf.ValueError, match=r"\[clamp\] give low \(min\), high \(max\) or both"):
        t.clamp()
    assert t.argmax().item() == 2 and t.argmin(keepdim=True).shape == (1, 1)


def test_sequential_takes_layers_as_arguments_or_a_list_and_names_what_it_refuses():
    nn = cf.nn
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    x = cf.randn(4, 2)
    s = nn.Sequential(a, b, c)
    assert s(x).tolist() == nn.Sequential([a, b, c])(x).tolist() == c(b(a(x))).tolist()
    assert len(nn.Sequential()) == 0
    head = s[0:2]  # a Sequential of the same layer objects, as PyTorch's
    assert len(head) == 2 and head[0] is a and head(x).tolist() == b(a(x)).tolist()
    assert s[::2](x).tolist() == c(a(x)).tolist()
    with pytest.raises(TypeError, match=r"^\[Sequential\] layer 0 is a cf._cf.nn.Embedding, not a one-tensor layer"):
        nn.Sequential([nn.Embedding(6, 4), nn.Linear(4, 6)])
    with pytest.raises(TypeError, match=r"^\[Sequential\] layer 3 is a cf._cf.nn.MultiHeadAttention"):
        s.append(nn.MultiHeadAttention("full", d_model=4, n_heads=1))
    assert nn.Sequential(layers=[a, b, c])(x).tolist() == c(b(a(x))).tolist()
    assert nn.Sequential(layers=(a, b))(x).tolist() == b(a(x)).tolist()
    with pytest.raises(TypeError,
                       match=r"^\[Sequential\] give the layers as arguments or as layers=\[\.\.\.\], not both$"):
        nn.Sequential(a, layers=[b])
    with pytest.raises(TypeError, match=r"^\[Sequential\] layers must be a list of layers, got a cf._cf.nn.ReLU$"):
        nn.Sequential(layers=b)  # one layer, not a list of them
    with pytest.raises(TypeError, match=r"^\[Sequential\] layers must be a list of layers, got a "):
        nn.Sequential(layers=iter([a, b]))  # an iterator is not taken either


def test_parameter_iterables_refuse_sets_and_keep_their_own_errors():
    nn = cf.nn
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"^\[SGD\] got a set of tensors, whose order changes between runs"):
        nn.SGD(set(m.parameters()), lr=0.1)

    def broken():
        yield m.weight
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        nn.Adam(broken())
    with pytest.raises(RuntimeError, match="boom"):
        nn.clip_grad_norm(broken(), 1.0)
    assert len(nn.Sequential(layers=[nn.ReLU(), nn.Tanh()])) == 2
    with pytest.raises(TypeError, match=r"\[Sequential\] give the layers as arguments or as layers="):
        nn.Sequential(nn.ReLU(), layers=[nn.Tanh()])


def test_one_tensor_is_no_state_dict(tmp_path):
    # clip_grad_norm and grad_norm take one tensor (PyTorch's do); the file and state-dict functions do not
    with pytest.raises(cf.ValueError, match=r"^\[save_safetensors\] expects a Module, a dict"):
        cf.save_safetensors(str(tmp_path / "x.safetensors"), cf.ones([2]))
    with pytest.raises(cf.ValueError, match=r"^\[SGD\] expects a Module"):
        cf.nn.SGD(cf.ones([2], requires_grad=True), lr=0.1)


def test_a_module_given_as_a_state_dict_brings_its_buffers(tmp_path):
    # routing's centroids are a persistent buffer, not a parameter: a module passed where a state dict is
    # expected gave its parameters alone (a file without the centroids; a load that left them behind)
    import numpy as np
    cfg = dict(vocab_size=50, max_len=32, n_layers=1, d_model=16, n_heads=2, d_ff=32,
               attention=dict(type="routing", n_clusters=2))
    m = cf.models.EncoderClassifier(cfg, generator=cf.Generator(1))
    m2 = cf.models.EncoderClassifier(cfg, generator=cf.Generator(2))
    names = set(m.state_dict())
    buffers = names - {n for n, _ in m.named_parameters()}
    assert buffers and any("centroids" in n for n in buffers)
    path = str(tmp_path / "m.safetensors")
    cf.save_safetensors(path, m)
    tensors, _ = cf.load_safetensors(path)
    assert set(tensors) == names
    m2.load_state_dict(m)
    for k, v in m.state_dict().items():
        assert np.array_equal(np.asarray(m2.state_dict()[k]), np.asarray(v)), k


def test_optional_generators_and_masks_take_none():
    # generator=None is the default generator for every module (nine constructors refused None, and their
    # documented default was a snapshot of the default generator's seed and offset at import)
    cf.manual_seed(5)
    a = cf.nn.Linear(3, 2, generator=None).weight.tolist()
    cf.manual_seed(5)
    assert cf.nn.Linear(3, 2).weight.tolist() == a
    for make in (lambda g: cf.nn.Embedding(4, 3, generator=g), lambda g: cf.nn.Dropout(0.1, generator=g),
                 lambda g: cf.nn.FeedForward(4, 8, generator=g), lambda g: cf.nn.LearnedPositionalEncoding(4, 3, generator=g),
                 lambda g: cf.nn.DepthwiseConv1d(3, 3, generator=g)):
        make(None)
    assert "Generator(seed=" not in cf.nn.Linear.__init__.__doc__
    # masks: None is no mask (they refused None beside 21 key_padding_mask arguments that take it)
    p = cf.randn([1, 5, 3])
    assert cf.farthest_point_sampling(p, 2, mask=None).tolist() == cf.farthest_point_sampling(p, 2).tolist()
    assert cf.nn.knn_indices(p, p, 2, mask=None).shape == (1, 5, 2)
    ds = cf.data.TensorDataset(cf.randn([4, 2]), None)
    assert len(ds) == 4


def test_step_memory_banks_reclusters_a_model_with_cluster_former_attention():
    clf = cf.models.EncoderClassifier({"vocab_size": 10, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1,
                                       "attention": {"type": "cluster-former", "num_clusters": 2, "chunk_size": 4,
                                                     "memory_size": 64, "update_every": 2, "kmeans_iters": 3}})
    clf.train()
    clf(cf.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [9, 1, 3, 5, 7, 9, 2, 4]], dtype=cf.int64))
    assert cf.nn.step_memory_banks(clf) == 0
    assert cf.nn.step_memory_banks(clf) == 1  # one layer, one bank: re-clustered at step 2


def test_options_structs_pickle_copy_compare_and_print():
    # they could not be pickled ("cannot pickle 'MemoryBankOptions' object"), so a config holding one could not
    # cross to a worker process
    import copy
    import pickle
    cases = [cf.nn.MemoryBankOptions(dim=3, capacity=50), cf.nn.CentroidAttentionOptions(d_model=16, num_centroids=4),
             cf.models.PointCloudOptions(num_classes=5, widths=[8, 16]), cf.models.CentroidViTOptions(n_layers=2)]
    for o in cases:
        for other in (pickle.loads(pickle.dumps(o)), copy.deepcopy(o), copy.copy(o)):
            assert other is not o and other == o and type(other) is type(o)
    again = copy.copy(cases[0])
    again.dim = 4
    assert again != cases[0] and cases[0].dim == 3
    assert repr(cases[0]) == ("MemoryBankOptions(capacity=50, dim=3, kmeans_iters=50, num_clusters=64, "
                              "save_memory=True, seed=0, update_every=1000)")
    assert "widths=[8, 16]" in repr(cases[2])
    with pytest.raises(cf.ValueError, match=r"^\[MemoryBankOptions\] unknown option 'dims'"):
        cf.nn.MemoryBankOptions(dims=3)


def test_transformer_config_round_trips_through_to_json_and_pickle():
    import copy
    import pickle
    c = cf.models.TransformerConfig.from_json({"vocab_size": 10, "n_layers": 3,
                                               "attention": {"type": "neural-clustering", "clusters": 3}})
    j = c.to_json()
    assert j["n_layers"] == 3 and j["attention"] == {"type": "neural-clustering", "clusters": 3}
    assert j["cross_attention"] == {"type": "full"} and j["d_model"] == 128  # the defaults too
    assert cf.models.TransformerConfig.from_json(j) == c
    for other in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c)):
        assert other == c and other is not c
    assert c != cf.models.TransformerConfig.from_json({"vocab_size": 11})
    assert repr(c).startswith('TransformerConfig({"activation":"relu","attention":{"clusters":3,')


def test_misspelt_options_and_option_types_are_named():
    with pytest.raises(cf.ValueError, match=r"^\[config\] missing required key 'attention.clusters' \(given: "
                                            r"'attention.clusterz', misspelt\?\)"):
        cf.nn.MultiHeadAttention("neural-clustering", 16, 2, clusterz=2)
    with pytest.raises(TypeError, match=r"^\[CentroidAttentionOptions\] option 'num_centroids' takes int \(like its "
                                        r"value 0\), got str '3'"):
        cf.nn.CentroidAttentionOptions(num_centroids="3")
    with pytest.raises(TypeError, match=r"^\[PointCloudOptions\] option 'widths' takes list"):
        cf.models.PointCloudOptions(widths=5)


def test_a_causal_model_refuses_clustered_attention_when_built_or_switched():
    # (it was accepted and refused at the first forward)
    cfg = {"vocab_size": 6, "max_len": 8, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1}
    with pytest.raises(cf.NotImplementedError, match=r"^\[CausalLM\] attention 'clustered' cannot mask causally"):
        cf.models.CausalLM(dict(cfg, attention={"type": "clustered", "clusters": 2}))
    lm = cf.models.CausalLM(cfg)
    with pytest.raises(cf.NotImplementedError, match=r"^\[set_attention\] 'clustered' cannot mask causally.*"
                                                     r"\(nothing was switched\)"):
        cf.models.set_attention(lm, {"type": "clustered"})
    assert cf.models.set_attention(lm, {"type": "improved-clustered", "clusters": 2}) == 1
    assert lm(cf.randint(1, 6, [1, 5])).shape == (1, 5, 6)


def test_torch_nn_loss_and_activation_modules_and_utils():
    import cf.nn.functional as F
    logits, target = cf.randn([4, 3], dtype=cf.float64), cf.tensor([0, 2, 1, -100])
    w = cf.tensor([1.0, 2.0, 0.5], dtype=cf.float64)
    crit = cf.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)
    assert cf.allclose(crit(logits, target), F.cross_entropy(logits, target, weight=w, label_smoothing=0.1))
    assert list(crit.state_dict()) == ["weight"] and cf.equal(crit.weight, w)
    assert cf.allclose(cf.nn.NLLLoss(reduction="sum")(cf.log_softmax(logits, 1), target),
                       F.nll_loss(cf.log_softmax(logits, 1), target, reduction="sum"))
    y = cf.randn([4, 3], dtype=cf.float64)
    assert cf.allclose(cf.nn.MSELoss()(logits, y), F.mse_loss(logits, y))
    assert cf.allclose(cf.nn.L1Loss(reduction="none")(logits, y), cf.abs(logits - y))
    t01 = cf.to(cf.gt(y, 0), cf.float64)
    assert cf.allclose(cf.nn.BCEWithLogitsLoss(pos_weight=cf.full([3], 2.0, dtype=cf.float64))(logits, t01),
                       F.binary_cross_entropy_with_logits(logits, t01, pos_weight=cf.full([3], 2.0, dtype=cf.float64)))
    assert cf.allclose(cf.nn.BCELoss()(cf.sigmoid(logits), t01), F.binary_cross_entropy(cf.sigmoid(logits), t01))
    assert list(cf.nn.BCEWithLogitsLoss().state_dict()) == []
    with pytest.raises(cf.ValueError, match=r"^\[MSELoss\] reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        cf.nn.MSELoss(reduction="avg")
    with pytest.raises(TypeError, match=r"^\[CrossEntropyLoss\] weight must be a cf.Tensor or None, got list"):
        cf.nn.CrossEntropyLoss(weight=[1.0, 2.0])
    seq = cf.nn.Sequential([cf.nn.Flatten(), cf.nn.Linear(6, 4), cf.nn.SiLU(), cf.nn.LogSoftmax(dim=-1)])
    out = seq(cf.randn([5, 2, 3]))
    assert out.shape == (5, 4) and cf.allclose(cf.exp(out).sum(1), cf.ones([5]), 1e-5)
    assert cf.allclose(cf.nn.Softmax(dim=0)(y), cf.softmax(y, 0))
    with pytest.raises(cf.ValueError, match=r"^\[Softmax\] give dim="):
        cf.nn.Softmax()
    assert "CrossEntropyLoss" in repr(cf.nn.CrossEntropyLoss()) and cf.nn.SiLU.__module__ == "cf.nn"
    # torch.nn.utils's paths
    import importlib
    from cf.nn.utils.rnn import pad_sequence
    assert callable(importlib.import_module("cf.nn.utils").clip_grad_norm_)  # (torch's signature: tested below)
    a, b = cf.tensor([1, 2, 3]), cf.tensor([4])
    assert pad_sequence([a, b], batch_first=True, padding_value=-1).tolist() == [[1, 2, 3], [4, -1, -1]]
    assert pad_sequence([a, b]).tolist() == [[1, 4], [2, 0], [3, 0]]
    x = cf.randn([2, 3], dtype=cf.float64, requires_grad=True)
    pad_sequence([x, x[0:1]]).sum().backward()
    assert x.grad.tolist() == [[2.0] * 3, [1.0] * 3]
    with pytest.raises(cf.ShapeError, match=r"^\[pad_sequence\] item 1 has trailing shape \[2\], item 0 \[3\]"):
        pad_sequence([x, cf.randn([1, 2])])


def test_save_load_and_torch_names(tmp_path):
    m = cf.nn.Linear(3, 2)
    opt = cf.optim.AdamW(m.parameters(), lr=0.01)
    m(cf.randn([4, 3])).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    cf.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, path)
    back = cf.load(path)
    assert back["epoch"] == 3 and cf.equal(back["model"]["weight"], m.weight)
    m2 = cf.nn.Linear(3, 2)
    m2.load_state_dict(back["model"])
    assert cf.equal(m2.weight, m.weight)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        cf.save({"x": Unpicklable()}, tmp_path / "half.pt")
    with pytest.raises(RuntimeError, match="no"):  # an existing file stays whole
        cf.save({"x": Unpicklable()}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no half file, no temporary left
    assert cf.load(path)["epoch"] == 3
    import os
    import stat
    os.chmod(path, 0o640)
    cf.save({"epoch": 4}, path)  # overwritten: its permissions kept
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640 and cf.load(path)["epoch"] == 4
    link = tmp_path / "latest.pt"
    os.symlink(path, link)
    cf.save({"epoch": 5}, link)  # through a symlink: the target is replaced, the link stays
    assert os.path.islink(link) and cf.load(path)["epoch"] == 5
    with pytest.raises(FileNotFoundError, match=r"^\[save\] cannot write .*missing/x.pt: the directory"):
        cf.save(1, tmp_path / "missing" / "x.pt")
    import io
    buf = io.BytesIO()
    cf.save([cf.ones([2])], buf)
    buf.seek(0)
    assert cf.load(buf)[0].tolist() == [1.0, 1.0]
    assert cf.long is cf.int64 and cf.float is cf.float32 and cf.double is cf.float64 and cf.half is cf.float16
    assert cf.device is cf.Device and cf.zeros([2], dtype=cf.long).dtype == cf.int64
    import importlib
    assert importlib.import_module("cf.utils.data") is cf.data and cf.utils.data.DataLoader is cf.data.DataLoader


def test_review_findings_on_the_torch_names():
    import importlib
    import math

    import numpy as np
    import os
    # a loss weight assigned after construction is used
    x, y = cf.randn([4, 3], dtype=cf.float64), cf.tensor([0, 1, 2, 1])
    w = cf.tensor([1.0, 3.0, 0.5], dtype=cf.float64)
    ce = cf.nn.CrossEntropyLoss()
    ce.weight = w
    assert cf.allclose(ce(x, y), cf.nn.cross_entropy(x, y, weight=w))
    with pytest.raises(cf.ValueError, match=r"^\[LogSoftmax\] give dim="):
        cf.nn.LogSoftmax()
    from cf.nn.utils.rnn import pad_sequence
    with pytest.raises(cf.ValueError, match=r"^\[pad_sequence\] needs at least one tensor"):
        pad_sequence([])
    # torch.nn.utils.clip_grad_norm_'s signature and result
    p = cf.tensor([3.0, 4.0], dtype=cf.float64, requires_grad=True)
    (p * p).sum().backward()  # grad (6, 8): norm 10
    norm = importlib.import_module("cf.nn.utils").clip_grad_norm_([p], 5.0, norm_type=2)
    assert norm.item() == pytest.approx(10.0) and p.grad.tolist() == pytest.approx([3.0, 4.0])
    # other norm types as torch's: 1, 3, inf and "inf" (they were NotImplementedError)
    utils = importlib.import_module("cf.nn.utils")
    for norm_type, want in ((1, 14.0), (3, (6.0 ** 3 + 8.0 ** 3) ** (1 / 3)), (math.inf, 8.0), ("inf", 8.0)):
        q = cf.tensor([3.0, 4.0], dtype=cf.float64, requires_grad=True)
        (q * q).sum().backward()
        norm = utils.clip_grad_norm_([q], 2.0, norm_type=norm_type)
        assert norm.item() == pytest.approx(want)
        assert q.grad.tolist() == pytest.approx([6.0 * 2.0 / (want + 1e-6), 8.0 * 2.0 / (want + 1e-6)])
    with pytest.raises(cf.ValueError, match=r"^\[clip_grad_norm\] norm_type must be > 0"):  # (as max_norm's)
        utils.clip_grad_norm_([p], 5.0, norm_type=0)
    torch = pytest.importorskip("torch")
    for norm_type in (0.5, 1, 2, 3, math.inf):
        g = np.random.default_rng(1).standard_normal(7)
        tp = torch.tensor(g, requires_grad=True)
        (tp * tp).sum().backward()
        cp = cf.tensor(g.tolist(), dtype=cf.float64, requires_grad=True)
        (cp * cp).sum().backward()
        tn = torch.nn.utils.clip_grad_norm_([tp], 1.0, norm_type=norm_type)
        cn = utils.clip_grad_norm_([cp], 1.0, norm_type=norm_type)
        assert cn.item() == pytest.approx(tn.item(), rel=1e-12)
        np.testing.assert_allclose(np.array(cp.grad.tolist()), tp.grad.numpy(), rtol=1e-12)
    # `from cf import *` leaves Python's bool and float alone
    scope = {}
    exec("from cf import *", scope)
    assert "float" not in scope and "bool" not in scope and scope["long"] is cf.int64 and "F" not in scope
    assert os.path.basename(cf.__file__) == "__init__.py"


def test_set_attention_checks_every_layer_before_switching_any():
    cfg = {"vocab_size": 6, "max_len": 8, "d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1,
           "attention": {"type": "lsh", "bucket_size": 4}}
    ed = cf.models.EncoderDecoder(cfg)
    before = [m.attention for n, m in ed.named_modules() if n.endswith("_attn")]
    with pytest.raises(cf.ValueError, match=r"disagree on sharing queries and keys"):
        cf.models.set_attention(ed, {"type": "lsh", "bucket_size": 2}, include_cross=True)
    after = [m.attention for n, m in ed.named_modules() if n.endswith("_attn")]
    assert all(a is b for a, b in zip(before, after))  # nothing was switched
