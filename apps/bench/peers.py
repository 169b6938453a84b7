#!/usr/bin/env python3
"""cf beside its peers: the same computations on identical shapes in one run.

Runs `cf-bench` subcommands and their twins in PyTorch (CPU; with --device cuda
both cf and PyTorch run on the GPU, K-Means stays on the CPU), faiss and scikit-learn, then prints one table of time ratios
cf / peer (below 1: cf is faster) and writes it as JSON (--out).

It installs nothing. Peers that are missing are named with how to install them,
and skipped; with no peer at all it prints that and exits 0.

    python3 apps/bench/peers.py --cf-bench build/apps/cf-bench [--quick] [--out peers.json]

What is compared (docs/benchmarks.md explains each figure):
  matmul        float32 square GEMM: cf::matmul vs torch.mm
  softmax       rows of 1024, 16M floats: cf::softmax vs torch.softmax
  layer_norm    rows of 1024 with weight and bias: cf::layer_norm vs F.layer_norm
  chain3        per-op overhead: loss = sum(tanh(x * w)) on 1 element, backward
  attention     full attention (1, 4 heads, N, 64), forward and forward+backward,
                the same maths on both sides (softmax(q k^T / 8) v; cf's full is its
                fused flash kernel, the twin PyTorch's matmul-softmax-matmul)
  attention_variants
                every cf attention variant (1, 4 heads, N, 64, fp32, forward and
                forward+backward, non-causal and causal) beside PyTorch's
                scaled_dot_product_attention: math and memory-efficient fp32 and
                flash in bfloat16 (a different precision, shown for scale) on
                CUDA, math and flash fp32 on the CPU;
                cf's gathered block attention ("block": a random order in sqrt(N)
                blocks, each seeing itself and the previous one) beside the same
                computation in plain PyTorch (gather, cat with the rolled previous
                block, matmul, softmax, matmul, scatter). Peak bytes on CUDA.
  model         Transformer encoder classifier (2 post-LN layers, d 256, 4 heads,
                FFN 1024, batch 8): one training step (forward, backward, AdamW)
                and one inference step, vs the nn.TransformerEncoder twin
  kmeans        one Lloyd iteration (assignment + update) vs faiss.Kmeans,
                sklearn.cluster.KMeans (lloyd) and a plain PyTorch loop (GEMM,
                argmin, index_add, bincount; on --device): the same shape of
                standard normal data and k centres drawn from the points on every
                side (each side draws its own; random data converges no faster on
                one than another). Also on CUDA (cf and the PyTorch loop)
  python_add    per-call overhead from Python: `a + b` on 1-element tensors that
                require grad, cf's Python package vs PyTorch (target: cf <= 2x)
  torch_attention
                a cf attention inside a PyTorch training step (cf.torch.Attention:
                forward, backward into x and the parameters) vs the same
                MultiHeadAttention step timed in C++ (target: + <= 20 us per call);
                also reported: an empty torch.autograd.Function with the same
                parameters in the same step, PyTorch's own floor for such a layer
The last two need the Python package (--cf-python, default build/python: built by
scripts/demo.sh or `cmake --build build --target cf_python` with -DCF_PYTHON=ON).

--precision bf16|fp16 (attention and model only; the other benches stay float32):
cf-bench runs with --precision (autocast; attention's q, k, v in the 16-bit dtype)
and the PyTorch twin under torch.autocast(device, dtype) with the same inputs, so
both sides compute in the same precision. Where this torch has no autocast in that
dtype on that device (torch 1.13's CPU autocast takes only bfloat16), the rows keep
cf's time and say why the peer was skipped.
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

INSTALL_HINTS = {
    "torch": "pip install torch  (or: apt-get install python3-torch)",
    "faiss": "pip install faiss-cpu  (or: apt-get install python3-faiss)",
    "sklearn": "pip install scikit-learn  (or: apt-get install python3-sklearn)",
    "numpy": "pip install numpy  (or: apt-get install python3-numpy)",
}


def try_import(name):
    try:
        return __import__(name)
    except Exception:  # ImportError, or a broken install raising something else
        return None


def median_time(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_cf(cf_bench, args):
    cmd = [cf_bench] + args
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("'%s' failed (exit %d): %s" % (" ".join(cmd), proc.returncode, proc.stderr.strip()))
    return json.loads(proc.stdout)


def cf_rows(report):
    return {r["name"]: r for r in report["results"]}


class Table:
    def __init__(self):
        self.rows = []

    def skip(self, bench, case, what, cf_s, peer, reason):
        """A row whose peer did not run: cf's time and the reason."""
        self.rows.append({
            "bench": bench, "case": case, "what": what, "cf_time_s": cf_s, "peer": peer,
            "peer_time_s": None, "ratio_cf_over_peer": None, "peer_skipped": reason,
        })

    def add(self, bench, case, what, cf_s, peer, peer_s):
        self.rows.append({
            "bench": bench, "case": case, "what": what, "cf_time_s": cf_s, "peer": peer,
            "peer_time_s": peer_s, "ratio_cf_over_peer": cf_s / peer_s if peer_s > 0 else None,
        })

    def render(self):
        head = ["bench", "case", "peer", "cf time (s)", "peer time (s)", "cf/peer"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            if r.get("peer_skipped"):
                lines.append("| %s | %s | %s | %.4g | skipped: %s | - |" % (
                    r["bench"], r["case"], r["peer"], r["cf_time_s"], r["peer_skipped"]))
                continue
            lines.append("| %s | %s | %s | %.4g | %.4g | %.2f |" % (
                r["bench"], r["case"], r["peer"], r["cf_time_s"], r["peer_time_s"], r["ratio_cf_over_peer"]))
        return "\n".join(lines)


# ---------------------------------------------------------------- PyTorch twins
LOW_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def torch_autocast(torch, device, precision):
    """(a factory of the context the twin runs in, None), or (None, why this torch cannot run it): for fp32
    nothing, else torch.autocast(device, dtype) -- entered once here, because torch 1.13's CPU autocast
    accepts float16 when built and refuses it only on entry."""
    if precision == "fp32":
        return contextlib.nullcontext, None
    dtype = getattr(torch, LOW_DTYPES[precision])

    def make():
        return torch.autocast(device, dtype=dtype)
    try:
        with warnings.catch_warnings():  # torch 1.13 warns when built with float16 on the CPU, then raises
            warnings.simplefilter("ignore")
            with make():
                pass
    except (RuntimeError, ValueError) as e:
        return None, "torch %s has no %s autocast on the %s (%s)" % (
            torch.__version__, LOW_DTYPES[precision], device, str(e).splitlines()[0])
    return make, None


def torch_matmul(torch, n, reps, device):
    a = torch.rand(n, n, device=device) * 2 - 1
    b = torch.rand(n, n, device=device) * 2 - 1
    return median_time(lambda: sync(torch, device, torch.mm(a, b)), reps)


def sync(torch, device, x=None):
    if device == "cuda":
        torch.cuda.synchronize()
    return x


def torch_rowwise(torch, numel, reps, device, which):
    x = (torch.rand(numel // 1024, 1024, device=device) * 2 - 1)
    if which == "softmax":
        return median_time(lambda: sync(torch, device, torch.softmax(x, -1)), reps)
    w = torch.ones(1024, device=device)
    b = torch.zeros(1024, device=device)
    return median_time(lambda: sync(torch, device, torch.nn.functional.layer_norm(x, (1024,), w, b)), reps)


def torch_chain3(torch, iters, samples, device="cpu"):
    x = torch.full((1,), 0.5, requires_grad=True, device=device)
    w = torch.full((1,), 1.5, device=device)

    def step():
        loss = torch.tanh(x * w).sum()
        loss.backward()
        x.grad = None

    def sample():
        for _ in range(iters):
            step()
        sync(torch, device)
    return median_time(sample, samples) / iters


def torch_attention(torch, n, reps, device, autocast=contextlib.nullcontext, dtype=None):
    """Full attention's forward and forward+backward times; with `autocast` (torch_autocast) and `dtype`
    (q, k, v in it, as cf-bench --precision has them) the twin of cf's autocast row."""
    g = torch.Generator(device="cpu").manual_seed(n)
    q, k, v = (torch.randn(1, 4, n, 64, generator=g).to(device=device, dtype=dtype) for _ in range(3))

    def fwd(q, k, v):
        with autocast():
            return torch.matmul(torch.softmax(torch.matmul(q * 0.125, k.transpose(-2, -1)), -1), v)

    with torch.no_grad():
        t_fwd = median_time(lambda: sync(torch, device, fwd(q, k, v)), reps)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        fwd(qg, kg, vg).float().sum().backward()
        sync(torch, device)
    return t_fwd, median_time(fwd_bwd, reps)


def _peak_reset(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(torch, device):
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def _time_fwd_bwd(torch, fwd, qkv, reps, device):
    """Median forward and forward+backward times of fwd(q, k, v), and the peak bytes of the latter (CUDA)."""
    q, k, v = qkv
    with torch.no_grad():
        t_fwd = median_time(lambda: sync(torch, device, fwd(q, k, v)), reps)
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        fwd(qg, kg, vg).float().sum().backward()
        sync(torch, device)
    _peak_reset(torch, device)
    t_bwd = median_time(fwd_bwd, reps)
    return t_fwd, t_bwd, _peak(torch, device)


def torch_sdpa(torch, n, reps, device, backend, causal, dtype="float32"):
    """scaled_dot_product_attention on (1, 4, n, 64) with one backend forced ("math", "efficient",
    "flash"), or None when this torch or device lacks that backend for these inputs."""
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
    except ImportError:  # torch < 2.3
        print("peers: this torch (%s) has no torch.nn.attention.sdpa_kernel; skipping SDPA rows" % torch.__version__)
        return None
    which = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "flash": SDPBackend.FLASH_ATTENTION}[backend]
    g = torch.Generator(device="cpu").manual_seed(n)
    qkv = [torch.randn(1, 4, n, 64, generator=g).to(device=device, dtype=getattr(torch, dtype)) for _ in range(3)]
    F = torch.nn.functional

    def fwd(q, k, v):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    try:
        return _time_fwd_bwd(torch, fwd, qkv, reps, device)
    except RuntimeError as e:  # no kernel of that backend for these inputs, or out of memory
        print("peers: sdpa %s %s N=%d: %s" % (backend, dtype, n, str(e).splitlines()[0]))
        if device == "cuda":
            torch.cuda.empty_cache()
        return None


def torch_block_attention(torch, n, reps, device, causal, dtype="float32"):
    """Neural clustering's block attention (ClusterFormer eqs. 8-10) for a given order, as a user writes it in
    plain PyTorch: gather the sorted q, k, v into sqrt(N) blocks, each block's keys are its own and the previous
    block's (rolled), matmul, softmax, matmul, scatter back to token order. Mirrors cf-bench's "block" row.
    q, k, v in `dtype` (bfloat16 or float16: every step in that dtype, as such a user's code runs)."""
    blocks = max(1, round(math.sqrt(n)))
    if n % blocks:
        return None
    w, d = n // blocks, 64
    g = torch.Generator(device="cpu").manual_seed(n)
    qkv = [torch.randn(1, 4, n, d, generator=g).to(device=device, dtype=getattr(torch, dtype)) for _ in range(3)]
    order = torch.argsort(torch.rand(1, 1, n, generator=g), -1).to(device)
    gi = order.expand(1, 4, n).unsqueeze(-1).expand(1, 4, n, d)
    pos = order.view(1, 1, blocks, w)
    kpos = torch.cat([pos, pos.roll(1, dims=2)], -1)  # (1, 1, blocks, 2w)
    blocked = (kpos.unsqueeze(-2) > pos.unsqueeze(-1)) if causal else None

    def fwd(q, k, v):
        qs, ks, vs = (torch.gather(x, 2, gi).view(1, 4, blocks, w, d) for x in (q, k, v))
        kw, vw = (torch.cat([x, x.roll(1, dims=2)], 3) for x in (ks, vs))
        s = torch.matmul(qs * (1.0 / math.sqrt(d)), kw.transpose(-2, -1))
        if blocked is not None:
            s = s.masked_fill(blocked, float("-inf"))
        o = torch.matmul(torch.softmax(s, -1), vw).reshape(1, 4, n, d)
        return torch.zeros_like(q).scatter(2, gi, o)
    return _time_fwd_bwd(torch, fwd, qkv, reps, device)


def torch_model(torch, n, batch, reps, device, autocast=contextlib.nullcontext):
    """Train and inference step times of the encoder twin; with `autocast` (torch_autocast) the forward
    passes and the loss run under it, backward and AdamW outside (as cf's autocast model row)."""
    nn = torch.nn
    d, heads, ff, layers, vocab, classes = 256, 4, 1024, 2, 1000, 10

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            pos = torch.arange(n, dtype=torch.float32).unsqueeze(1)
            rate = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
            pe = torch.zeros(n, d)
            pe[:, 0::2] = torch.sin(pos * rate)
            pe[:, 1::2] = torch.cos(pos * rate)
            self.register_buffer("pe", pe)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="relu", batch_first=True,
                                               norm_first=False)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, classes)

        def forward(self, ids):
            return self.head(self.enc(self.emb(ids) + self.pe).mean(1))

    torch.manual_seed(1000 + n)
    model = Twin().to(device)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, vocab, (batch, n), device=device)
    labels = torch.randint(0, classes, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def train_step():
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model(ids), labels)
        loss.backward()
        opt.step()
        sync(torch, device)

    def infer_step():
        with autocast():
            return sync(torch, device, model(ids))

    model.train()
    t_train = median_time(train_step, reps)
    # The fused inference fast paths of torch 1.13's TransformerEncoderLayer and MultiheadAttention (eval mode)
    # ignore CPU autocast (they check only the CUDA flag) and fail on the mixed dtypes ("expected scalar type
    # BFloat16 but found Float"): under autocast the twin infers in train mode, which with dropout 0 computes
    # the same, through the layers' ordinary forward.
    model.train(autocast is not contextlib.nullcontext)
    with torch.no_grad():
        t_infer = median_time(infer_step, reps)
    return t_train, t_infer


# ---------------------------------------------------------------- cf from Python
def best_per_call(fn, iters, samples):
    fn()
    best = float("inf")
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def python_add_overhead(cf, torch, iters, samples):
    """Seconds per `a + b` on 1-element tensors requiring grad: (cf, torch), interleaved."""
    a, b = cf.ones([1], requires_grad=True), cf.ones([1], requires_grad=True)
    x, y = torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)
    t_cf, t_torch = float("inf"), float("inf")
    for _ in range(3):  # alternate, so both see the same machine
        t_cf = min(t_cf, best_per_call(lambda: a + b, iters, samples))
        t_torch = min(t_torch, best_per_call(lambda: x + y, iters, samples))
    return t_cf, t_torch


def torch_attention_overhead(cf, torch, variant, options, batch, n, d, heads, iters, samples):
    """Seconds per training-step call of one attention: (cf.torch.Attention inside
    PyTorch, the same MultiHeadAttention forward+backward timed in C++, an empty
    torch.autograd.Function with the same parameters in the same PyTorch step)."""
    import cf.torch as cft
    layer = cft.Attention(variant, d_model=d, n_heads=heads, seed=0, aux_weights={}, **options)
    params = list(layer.parameters())
    x = torch.randn(batch, n, d, requires_grad=True)
    g = torch.randn(batch, n, d)

    def step():
        layer(x).backward(g)
        x.grad = None
        for p in params:
            p.grad = None

    grads = [torch.zeros_like(p) for p in params]

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, *ps):
            return inp.clone()

        @staticmethod
        def backward(ctx, go):
            return (go,) + tuple(grads)

    def empty_step():
        Empty.apply(x, *params).backward(g)
        x.grad = None
        for p in params:
            p.grad = None

    xc, gc = cf.from_dlpack(x.detach()), cf.from_dlpack(g)
    t_torch, t_cpp, t_empty = float("inf"), float("inf"), float("inf")
    for _ in range(3):
        t_torch = min(t_torch, best_per_call(step, iters, samples))
        t_cpp = min(t_cpp, cf._cf._bridge.time_attention_step(layer.cf_module, xc, gc, iters, samples))
        t_empty = min(t_empty, best_per_call(empty_step, iters, samples))
    return t_torch, t_cpp, t_empty


# ---------------------------------------------------------------- K-Means twins
def kmeans_data(np, n, d, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d), dtype=np.float32)
    init = x[rng.choice(n, k, replace=False)].copy()
    return x, init


def per_iteration(run, iters, reps):
    """Time of one Lloyd iteration: (T(2m) - T(m)) / m, so set-up costs (copies,
    norms, index building) cancel, as cf-bench reports the median interval
    between iterations of one run."""
    t1 = median_time(lambda: run(iters), reps)
    t2 = median_time(lambda: run(2 * iters), reps)
    return max(t2 - t1, 1e-9) / iters


def faiss_lloyd_iteration(faiss, np, n, d, k, iters, reps):
    x, init = kmeans_data(np, n, d, k, 0)

    def run(m):
        km = faiss.Kmeans(d, k, niter=m, seed=1, verbose=False, max_points_per_centroid=n)
        km.train(x, init_centroids=init)
    return per_iteration(run, iters, reps)


def sklearn_lloyd_iteration(sklearn_cluster, np, n, d, k, iters, reps):
    x, init = kmeans_data(np, n, d, k, 0)

    def run(m):
        sklearn_cluster.KMeans(n_clusters=k, init=init, n_init=1, max_iter=m, tol=0.0,
                               algorithm="lloyd").fit(x)
    return per_iteration(run, iters, reps)


def torch_lloyd_iteration(torch, np, n, d, k, iters, reps, device):
    """The plain PyTorch loop issue 25 measured: squared distances through one GEMM,
    argmin, the per-cluster sums (index_add) and counts (bincount); an empty cluster
    keeps its centre."""
    x_np, init_np = kmeans_data(np, n, d, k, 0)
    x = torch.from_numpy(x_np).to(device)
    init = torch.from_numpy(init_np).to(device)
    x2 = (x * x).sum(1, keepdim=True)

    def run(m):
        c = init.clone()
        for _ in range(m):
            dist = x2 - 2.0 * (x @ c.t()) + (c * c).sum(1)
            a = dist.argmin(1)
            sums = torch.zeros_like(c).index_add_(0, a, x)
            counts = torch.bincount(a, minlength=k).to(x.dtype).unsqueeze(1)
            c = torch.where(counts > 0, sums / counts.clamp(min=1.0), c)
        sync(torch, device)
    return per_iteration(run, iters, reps)


# ---------------------------------------------------------------- main
def use_one_blas_kernel_family(root):
    """Makes cf-bench and torch run OpenBLAS's kernels of one family, and returns its name.

    Both read OPENBLAS_CORETYPE when OpenBLAS loads (Debian's torch calls the system BLAS,
    OpenBLAS here). Unset, Debian 12's OpenBLAS runs its Prescott kernels on the recent Xeons it
    does not know, and a float32 GEMM is several times slower on whichever side loaded it so
    (torch.mm at 2048 on one core: 28 against 126 GFLOP/s). So, before torch is imported, an
    unset variable takes the value scripts/openblas-env.sh gives it, the rule of the README's
    commands; "" when that rule names none (OpenBLAS's own choice on both sides).
    """
    if not os.environ.get("OPENBLAS_CORETYPE"):
        script = os.path.join(root, "scripts", "openblas-env.sh")
        r = subprocess.run(["bash", "-c", '. "$1" && printf %s "${OPENBLAS_CORETYPE:-}"', "peers", script],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("peers: %s failed: %s" % (script, r.stderr.strip()))
        if r.stdout:
            os.environ["OPENBLAS_CORETYPE"] = r.stdout
    return os.environ.get("OPENBLAS_CORETYPE", "")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cf-bench", default=os.path.join(root, "build", "apps", "cf-bench"),
                    help="path to the cf-bench binary (default: build/apps/cf-bench)")
    ap.add_argument("--out", default="peers.json", help="where to write the JSON table (default: peers.json)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for every side (default: all cores)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="device of cf and PyTorch (K-Means peers stay on the CPU)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    ap.add_argument("--only", default="", help="comma-separated benches to run (default: all): matmul, softmax, "
                    "layer_norm, chain3, attention, attention_variants, model, kmeans, python_add, torch_attention")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="attention and model rows: cf-bench --precision (autocast) beside the PyTorch twin "
                         "under torch.autocast(device, dtype); the other benches stay float32 (default: fp32)")
    ap.add_argument("--cf-python", default=os.path.join(root, "build", "python"),
                    help="folder holding the built cf Python package (default: build/python)")
    args = ap.parse_args()

    blas_family = use_one_blas_kernel_family(root)  # before torch loads OpenBLAS
    print("peers: OpenBLAS kernels of both sides: %s" % (
        blas_family + " (OPENBLAS_CORETYPE)" if blas_family else "OpenBLAS's own choice (OPENBLAS_CORETYPE unset)"))
    mods = {name: try_import(name) for name in ("numpy", "torch", "faiss", "sklearn")}
    missing = [name for name, m in mods.items() if m is None]
    for name in missing:
        print("peers: %s is missing; skipping what needs it. Install: %s" % (name, INSTALL_HINTS[name]))
    if mods["torch"] is None and mods["faiss"] is None and mods["sklearn"] is None:
        print("peers: no peer installed (torch, faiss, scikit-learn); nothing to compare")
        return 0
    if not (os.path.isfile(args.cf_bench) and os.access(args.cf_bench, os.X_OK)):
        print("peers: cf-bench not found at %s (build it: cmake --build build --target cf-bench, or pass "
              "--cf-bench)" % args.cf_bench, file=sys.stderr)
        return 2
    only = set(filter(None, args.only.split(",")))
    benches = ("matmul", "softmax", "layer_norm", "chain3", "attention", "attention_variants", "model", "kmeans",
               "python_add", "torch_attention")
    unknown = sorted(only - set(benches))
    if unknown:
        print("peers: --only names unknown benches: %s (known: %s)" % (",".join(unknown), ",".join(benches)),
              file=sys.stderr)
        return 2
    want = lambda name: not only or name in only

    torch, np = mods["torch"], mods["numpy"]
    threads = ["--threads", str(args.threads)]
    on_dev = ["--device", args.device]  # cf-bench's device for the GPU-capable benches
    if torch is not None:
        torch.set_num_threads(args.threads)
        if args.device == "cuda" and not torch.cuda.is_available():
            print("peers: --device cuda but torch sees no GPU", file=sys.stderr)
            return 2
    if mods["faiss"] is not None:
        mods["faiss"].omp_set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    quick = args.quick
    dev = args.device
    table = Table()
    precision = ["--precision", args.precision]  # cf-bench attention and model
    low = args.precision != "fp32"
    prec_tag = "" if not low else ", %s autocast" % args.precision
    autocast, no_autocast = (torch_autocast(torch, dev, args.precision) if torch is not None
                             else (None, None))
    if no_autocast:
        print("peers: %s; the attention and model rows keep cf's time without a peer" % no_autocast)

    if torch is not None and want("matmul"):
        sizes = [256, 512, 1024] if quick else [256, 512, 1024, 2048]
        cf = cf_rows(run_cf(args.cf_bench, ["matmul", "--sizes", ",".join(map(str, sizes)), "--batch", "0,0"]
                            + threads + on_dev))
        for n in sizes:
            t = torch_matmul(torch, n, 5 if n >= 1024 else 11, dev)
            table.add("matmul", "n=%d" % n, "float32 GEMM", cf["matmul_%d" % n]["time_s"], "torch", t)

    if torch is not None and (want("softmax") or want("layer_norm")):
        numel = 1 << (22 if quick else 24)
        cf = cf_rows(run_cf(args.cf_bench, ["elementwise", "--numel", str(numel)] + threads + on_dev))
        for which in ("softmax", "layer_norm"):
            if want(which):
                t = torch_rowwise(torch, numel, 5, dev, which)
                table.add(which, "%d x 1024" % (numel // 1024), "row-wise, float32", cf[which]["time_s"], "torch", t)

    if torch is not None and want("chain3"):
        cf = cf_rows(run_cf(args.cf_bench, ["overhead", "--repeat", "51"] + threads + on_dev))
        t = torch_chain3(torch, 500, 51, dev)
        table.add("chain3", "1 element", "3 ops forward + backward + zero_grad",
                  cf["chain3_forward_backward"]["ns_per_iter"] * 1e-9, "torch", t)

    if torch is not None and want("attention"):
        sizes = [512, 1024] if quick else [512, 1024, 2048]
        cf = cf_rows(run_cf(args.cf_bench, ["attention", "--variants", "full", "--sizes",
                                            ",".join(map(str, sizes))] + precision + threads + on_dev))
        for n in sizes:
            row = cf["full_%d" % n]
            cases = (("N=%d fwd" % n, "full attention forward" + prec_tag, row["forward_time_s"]),
                     ("N=%d fwd+bwd" % n, "full attention forward+backward" + prec_tag,
                      row["forward_backward_time_s"]))
            if no_autocast:
                for case, what, cf_s in cases:
                    table.skip("attention", case, what, cf_s, "torch", no_autocast)
                continue
            dtype = getattr(torch, LOW_DTYPES[args.precision]) if low else None
            times = torch_attention(torch, n, 3, dev, autocast, dtype)
            for (case, what, cf_s), t in zip(cases, times):
                table.add("attention", case, what, cf_s, "torch", t)

    if torch is not None and want("attention_variants"):
        # --precision bf16|fp16 (CUDA): cf's variants on 16-bit q, k, v under autocast beside SDPA's flash and
        # memory-efficient kernels and the gather version in that dtype; --quick then takes the sizes of
        # issue 26's targets, non-causal only.
        low_dtype = LOW_DTYPES.get(args.precision)
        if low_dtype and dev == "cuda":
            sizes = [4096, 16384] if quick else [1024, 4096, 16384, 65536]
            backends = [("efficient", low_dtype), ("flash", low_dtype)]
            ref = "sdpa flash %s" % low_dtype
        else:
            sizes = ([1024, 4096] if quick else [1024, 4096, 16384, 65536]) if dev == "cuda" else \
                    ([512, 1024] if quick else [512, 1024, 2048])
            # On CUDA the fp32 reference is the memory-efficient kernel (flash needs half precision: shown in
            # bf16); on the CPU PyTorch's flash kernel takes fp32 and the memory-efficient one does not exist.
            backends = [("math", "float32"), ("efficient", "float32"), ("flash", "bfloat16")] if dev == "cuda" \
                else [("math", "float32"), ("flash", "float32")]
            ref = "sdpa efficient float32" if dev == "cuda" else "sdpa flash float32"
        low_cuda = bool(low_dtype) and dev == "cuda"
        shape_tag = "%s (1, 4, N, 64)" % (args.precision if low_cuda else "fp32")
        variants = ["full", "neural-clustering", "clustered", "improved-clustered", "lsh", "routing",
                    "cluster-former", "block"]
        for causal in ((False,) if low_cuda and quick else (False, True)):
            tag = " causal" if causal else ""
            cf = cf_rows(run_cf(args.cf_bench, ["attention", "--variants", ",".join(variants), "--sizes",
                                                ",".join(map(str, sizes)), "--repeat", "3"]
                                + (["--causal"] if causal else []) + (precision if low_cuda else [])
                                + threads + on_dev))
            for n in sizes:
                reps = 3
                peers = {}
                for backend, dtype in backends:
                    # math materialises (1, 4, N, N) scores and their gradients: skip it where they would
                    # take over a quarter of the memory (65536 on an 80 GB GPU).
                    if backend == "math" and 6 * 4 * n * n * 4 > (20 << 30):
                        continue
                    r = torch_sdpa(torch, n, reps, dev, backend, causal, dtype)
                    if r is not None:
                        peers["sdpa %s %s" % (backend, dtype)] = r
                block_peer = torch_block_attention(torch, n, reps, dev, causal, low_dtype if low_cuda else "float32")

                def add(row, peer, p):
                    for mode, key, i in (("fwd", "forward_time_s", 0), ("fwd+bwd", "forward_backward_time_s", 1)):
                        if key not in row:
                            continue
                        table.add("attention_variants", "%s N=%d %s%s" % (row["params"]["variant"], n, mode, tag),
                                  shape_tag, row[key], peer, p[i])
                        if mode == "fwd+bwd":
                            table.rows[-1].update(cf_peak_bytes=row.get("forward_backward_peak_bytes"),
                                                  peer_peak_bytes=p[2])
                for variant in variants:
                    row = cf.get("%s_%d" % (variant, n))
                    if row is None or "skipped" in row:
                        continue
                    if variant == "block":
                        if block_peer is not None:
                            add(row, "torch gather+matmul block", block_peer)
                    elif variant == "full":
                        for name, p in peers.items():
                            add(row, name, p)
                    elif ref in peers:
                        add(row, ref, peers[ref])

    if torch is not None and want("model"):
        sizes = [128, 512] if quick else [128, 512, 2048]
        cf = cf_rows(run_cf(args.cf_bench, ["model", "--variants", "full", "--sizes", ",".join(map(str, sizes)),
                                            "--batch-size", "8"] + precision + threads + on_dev))
        for n in sizes:
            reps = 2 if n >= 2048 else 5
            row = cf["model_full_%d" % n]
            cases = (("N=%d train step" % n, "fwd+bwd+AdamW, batch 8" + prec_tag, row["train_step_time_s"]),
                     ("N=%d inference" % n, "forward, batch 8" + prec_tag, row["infer_step_time_s"]))
            if no_autocast:
                for case, what, cf_s in cases:
                    table.skip("model", case, what, cf_s, "torch", no_autocast)
                continue
            times = torch_model(torch, n, 8, reps, dev, autocast)
            for (case, what, cf_s), t in zip(cases, times):
                table.add("model", case, what, cf_s, "torch", t)

    if ((mods["faiss"] is not None or mods["sklearn"] is not None or torch is not None) and np is not None
            and want("kmeans")):
        n, d, k, iters = (20000, 64, 256, 5) if quick else (100000, 64, 256, 5)
        try:
            cf = cf_rows(run_cf(args.cf_bench, ["kmeans", "--n", str(n), "--dims", str(d), "--ks", str(k),
                                                "--iters", str(iters)] + threads + on_dev))
            cf_iter = cf["kmeans_n%d_d%d_k%d" % (n, d, k)]["lloyd_iteration_time_s"]
        except (RuntimeError, KeyError) as e:
            print("peers: cf-bench kmeans unavailable (%s); skipping kmeans" % e)
            cf_iter = None
        if cf_iter is not None and torch is not None:
            t = torch_lloyd_iteration(torch, np, n, d, k, iters, 3, dev)
            table.add("kmeans", "%dx%d k=%d" % (n, d, k), "one Lloyd iteration (%s)" % dev, cf_iter, "torch", t)
        if cf_iter is not None and dev == "cpu":  # faiss and sklearn run on the CPU only
            if mods["faiss"] is not None:
                t = faiss_lloyd_iteration(mods["faiss"], np, n, d, k, iters, 3)
                table.add("kmeans", "%dx%d k=%d" % (n, d, k), "one Lloyd iteration", cf_iter, "faiss", t)
            if mods["sklearn"] is not None:
                import sklearn.cluster
                t = sklearn_lloyd_iteration(sklearn.cluster, np, n, d, k, iters, 3)
                table.add("kmeans", "%dx%d k=%d" % (n, d, k), "one Lloyd iteration", cf_iter, "sklearn", t)

    if torch is not None and (want("python_add") or want("torch_attention")):
        sys.path.insert(0, args.cf_python)
        try:
            import cf as cfpy
        except ImportError as e:
            print("peers: the cf Python package is not importable from %s (%s); skipping python_add and "
                  "torch_attention (build it: scripts/demo.sh)" % (args.cf_python, e))
            cfpy = None
        if cfpy is not None and want("python_add"):
            t_cf, t_torch = python_add_overhead(cfpy, torch, 20000 if quick else 100000, 5)
            table.add("python_add", "1 element", "a + b with autograd, from Python", t_cf, "torch", t_torch)
        if cfpy is not None and want("torch_attention") and dev == "cpu":
            cases = [("full", {}, 1, 16, 32, 4), ("neural-clustering", {"clusters": 4}, 1, 16, 32, 4),
                     ("full", {}, 2, 128, 64, 4), ("neural-clustering", {"clusters": 8}, 2, 128, 64, 4)]
            for variant, options, b, n, d, h in cases:
                iters = 200 if n <= 16 else 20
                t_torch, t_cpp, t_empty = torch_attention_overhead(cfpy, torch, variant, options, b, n, d, h,
                                                                   iters // (4 if quick else 1), 5)
                table.add("torch_attention", "%s B=%d N=%d d=%d" % (variant, b, n, d),
                          "fwd+bwd in a PyTorch step vs from C++", t_torch, "cf C++", t_cpp)
                table.rows[-1].update(overhead_us=(t_torch - t_cpp) * 1e6, torch_empty_function_us=t_empty * 1e6)
                print("peers: torch_attention %s B=%d N=%d: %.1f us per call over C++; an empty "
                      "torch.autograd.Function with the same %d parameters costs %.1f us in the same step"
                      % (variant, b, n, (t_torch - t_cpp) * 1e6, len(list(cfpy.nn.MultiHeadAttention(
                          variant, d, h, **options).parameters())), t_empty * 1e6))

    versions = {name: getattr(m, "__version__", "?") for name, m in mods.items() if m is not None}
    machine = run_cf(args.cf_bench, ["overhead", "--repeat", "1", "--iters", "1"] + on_dev)["machine"]
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine, "python": platform.python_version(), "peer_versions": versions,
        "threads": args.threads, "device": dev, "precision": args.precision, "missing": missing,
        "openblas_coretype": blas_family,  # both sides' OPENBLAS_CORETYPE; "" = OpenBLAS's own choice
        "rows": table.rows,
    }
    print("cf vs peers, %s, %s (%d threads)%s, %s" % (out["date"], machine.get("cpu", "?"), args.threads,
                                                        "" if not low else ", attention and model in " +
                                                        args.precision,
                                                        ", ".join("%s %s" % kv for kv in versions.items())))
    print(table.render())
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, args.out)
    print("peers: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
