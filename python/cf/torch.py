"""cf's attentions inside PyTorch models.

    import torch, cf.torch
    attn = cf.torch.Attention("neural-clustering", d_model=64, n_heads=4, clusters=8)
    y = attn(x)                       # x: torch tensor (B, N, 64), CPU or CUDA
    y.sum().backward()                # gradients reach x and attn's parameters

`Attention` is a torch.nn.Module wrapping one cf MultiHeadAttention (the
projections and the variant, built by name with its options as keyword
arguments, exactly as cf.nn.MultiHeadAttention). Its forward and backward run
cf's kernels on the tensors' own device through a torch.autograd.Function; the
data crosses by DLPack, without copies. Its parameters are torch Parameters
sharing memory with cf's: optimizers, state_dict, .to(device) and .double() work
as for any PyTorch layer. (Assigning `param.data = ...` by hand breaks the
sharing; use copy_ or load_state_dict, which write in place.) train() and eval()
reach the cf module: attention dropout and the variants' training-only steps
follow PyTorch's mode. cf's buffers that all ranks must share (routing's
centroids, a Cluster-Former memory bank's centroids) are torch buffers sharing
cf's memory in the same way, so state_dict(), .to() and DistributedDataParallel's
buffer broadcast see them: every rank attends with rank 0's centroids. A memory
bank's stored states and counters stay per rank (as with cf's own
DistributedDataParallel; broadcasting 100000 x d states each step would cost more
than the step), in state_dict() and load_state_dict() all the same; the K-Means
of ranks other than 0 is then overwritten by rank 0's at the next forward.
copy.deepcopy and torch.save / torch.load of the module work (the copy rebuilds
its cf module around the copied parameters and buffers). Under torch.no_grad()
or inference_mode, cf records no graph for the call.

Under torch.autocast (bfloat16 or float16, CPU or CUDA), the layer runs under
cf.autocast in the same dtype: its products in 16 bits, softmax statistics and
norms in float32, float32 parameters and their gradients (cf's policy, the
same as PyTorch's); the input may be float32 or the 16-bit dtype.

Cluster-Former's memory bank re-clusters every `update_every` training steps
(its Algorithm 1): call `attn.on_train_step()` once per optimizer step, as
cf's Cluster-Former models are stepped.

Auxiliary losses: neural clustering attention adds ClusterFormer's clustering
and centroid-sorting losses (eqs. 6 and 11), weighted by mu and nu (appendix C,
eq. 17; defaults 1e-3). `attn.aux_loss` is their weighted total of the last call,
a 0-d tensor on the autograd graph. Add it to the loss (loss = task + attn.aux_loss)
and its gradients follow the loss as any term's: scaled by a GradScaler, divided
with a loss divided for gradient accumulation. Left out of the loss, the backward
pass adds them itself at weight 1, as if `mu * L1 + nu * L2` were added to the
unscaled loss (a loss scaled by S then gave them 1/S of their weight after
unscaling). aux_loss is the last call's: a layer called several times in a step
adds the earlier calls' at weight 1, and it holds the call's graph until that
call's backward runs or the next call (a recorded forward whose backward never
runs keeps its cf graph that long). `attn.last_aux_loss` is the value as a
float. Pass aux_weights={} to
leave them out, or give the weights of other variants' losses (routing:
{"routing_commitment": w}).

CUDA streams: cf runs on the legacy default stream. When PyTorch's current
stream is another one, the two are ordered with events (no host wait).
"""
import torch as _torch
from torch._C import _functions as _torch_functions
from torch.utils import dlpack as _dlpack

from . import _cf

_bridge = _cf._bridge
# Capsule in, tensor out: the C entry points behind torch.utils.dlpack (its
# Python wrappers add checks this module does not need), when this PyTorch has them.
_from_capsule = getattr(_torch._C, "_from_dlpack", _dlpack.from_dlpack)
_to_capsule = getattr(_torch._C, "_to_dlpack", _dlpack.to_dlpack)

__all__ = ["Attention"]


def _cf_stream_enter(t):
    """When PyTorch's current CUDA stream is not the default one, make cf's stream
    (the legacy default) wait for it; returns the stream to order after cf, or None."""
    if not t.is_cuda:
        return None
    cur = _torch.cuda.current_stream(t.device)
    default = _torch.cuda.default_stream(t.device)
    if cur == default:
        return None
    default.wait_stream(cur)  # events, no host wait
    return cur


def _cf_stream_leave(cur, t):
    if cur is not None:
        cur.wait_stream(_torch.cuda.default_stream(t.device))


def _to_cf(t):
    # torch's to_dlpack needs a contiguous-or-strided tensor without grad history.
    return _to_capsule(t.detach())


_CF_LOW = {_torch.bfloat16: _cf.bfloat16, _torch.float16: _cf.float16}
_AUTOCAST_BY_DEVICE_TYPE = hasattr(_torch, "get_autocast_dtype")  # PyTorch >= 2.4's form of the queries


def _autocast_dtype(t):
    """cf's dtype for PyTorch's autocast at this call on t's device (CPU or CUDA), or None when it is off."""
    cuda = t.is_cuda
    if _AUTOCAST_BY_DEVICE_TYPE:
        kind = "cuda" if cuda else "cpu"
        return _CF_LOW.get(_torch.get_autocast_dtype(kind)) if _torch.is_autocast_enabled(kind) else None
    if cuda:
        return _CF_LOW.get(_torch.get_autocast_gpu_dtype()) if _torch.is_autocast_enabled() else None
    return _CF_LOW.get(_torch.get_autocast_cpu_dtype()) if _torch.is_autocast_cpu_enabled() else None


class _AttentionFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, x, mask, causal, record, autocast, *params):
        # a bool mask crosses as its bytes (PyTorch 1.x has no bool in DLPack)
        out, tape = module._bridge.forward(_to_cf(x), None if mask is None else _to_cf(mask.view(_torch.uint8)), causal,
                                           record, autocast)
        ctx.tape = tape
        # cf's tape reads x, the mask and the parameters through their PyTorch memory (DLPack views, no copy):
        # saved here (aliases, no memory) so that PyTorch's version check refuses a backward after an in-place
        # write to any of them, as its own layers do (an optimizer step between a retained forward and its
        # backward gave silently wrong gradients)
        ctx.save_for_backward(x, mask, *params)
        ctx.module = module
        ctx.x_requires_grad = x.requires_grad
        # Only the aux total, detached: keeping the tape held the call's whole cf graph (25 MB for four
        # layers at (8, 512, 64)) until the next call, after PyTorch had freed ctx. (__dict__: Module.__setattr__ is slow)
        module.__dict__["_last_aux"] = tape.aux_detached
        y = _from_capsule(out)
        aux = tape.aux_capsule
        if aux is None:
            aux = _torch.zeros((), dtype=y.dtype, device=y.device)
            ctx.mark_non_differentiable(aux)
        else:
            aux = _from_capsule(aux)
        # Unused outputs get None in backward: an aux_loss left out of the loss is told from one in it
        ctx.set_materialize_grads(False)
        ctx.out_meta = (y.shape, y.dtype, y.device)
        return y, aux

    @staticmethod
    def backward(ctx, grad_out, grad_aux):
        if grad_out is None:  # (set_materialize_grads(False): a loss of aux_loss alone)
            shape, dtype, device = ctx.out_meta
            grad_out = _torch.zeros(shape, dtype=dtype, device=device)
        if not _torch.is_grad_enabled():
            return _AttentionFunction._backward(ctx, grad_out, grad_aux)
        # create_graph=True: cf's backward is not recorded, so the gradients it returns depend on x and the
        # parameters in a way PyTorch cannot differentiate. They go through an error node, so that a second
        # derivative through them raises rather than silently taking 0 for cf's part. (once_differentiable
        # attaches that node only when grad_out requires grad: a loss linear in the output, such as a sum,
        # gave a silently wrong gradient penalty.)
        with _torch.no_grad():
            grads = _AttentionFunction._backward(ctx, grad_out, grad_aux)
        err = _torch_functions.DelayedError(
            b"[cf.torch.Attention] cf's backward is not differentiable: a second derivative through "
            b"cf.torch.Attention (create_graph=True, then a backward through its gradients) is not supported",
            len(grads))
        return err(*[None if g is None else g.detach().requires_grad_() for g in grads])

    @staticmethod
    def _backward(ctx, grad_out, grad_aux):
        # ctx.tape (the cf graph of this call) lives as long as PyTorch keeps ctx
        ctx.saved_tensors  # PyTorch's check: raises if x, the mask or a parameter was written since the forward
        cur = _cf_stream_enter(grad_out)
        # grad_aux: d loss / d aux_loss when the loss holds it (None: the auxiliary losses at weight 1)
        grads = ctx.module._bridge.backward(ctx.tape, _to_cf(grad_out.contiguous()),
                                            None if grad_aux is None else _to_cf(grad_aux.contiguous()))
        # The module's aux_loss of this call holds its node, hence ctx and the call's cf graph: let go of it
        # once the call's backward ran (it kept the graph alive until the next call)
        held = ctx.module.__dict__.get("_aux_loss")
        if held is not None and held.grad_fn is ctx:
            ctx.module.__dict__["_aux_loss"] = None
        _cf_stream_leave(cur, grad_out)
        out = [None, None, None, None, None, None]
        gx = grads[0]
        out[1] = _from_capsule(gx) if gx is not None and ctx.x_requires_grad else None
        out.extend(_from_capsule(g) if g is not None else None for g in grads[1:])
        return tuple(out)


class Attention(_torch.nn.Module):
    """A cf attention layer as a torch.nn.Module: cf.nn.MultiHeadAttention(type,
    d_model, n_heads, **options) run by cf's kernels inside PyTorch's autograd.

    forward(x, key_padding_mask=None, causal=False): self-attention on x
    (B, N, d_model), float32 or float64 (or 16-bit under torch.autocast), CPU or
    CUDA; key_padding_mask bool (B, N), True = padding. Returns (B, N, d_model).

    seed seeds the generator of the layer's initial weights only: dropout and the
    variants' per-call draws (LSH rotations, clustered attention's hash planes) come
    from cf's global generator (cf.manual_seed; save cf.default_generator()'s seed and
    offset beside torch's RNG state for an exact resume), unless the variant takes a
    seed option of its own (LSH's "seed" fixes its rotations). The
    variant's own options are keyword arguments, or the dict `options` for a name
    this constructor takes itself (seed): Attention("lsh", 64, 4, seed=0,
    options={"seed": 5}) fixes LSH's rotations (its option "seed") too.
    """

    def __init__(self, type, d_model, n_heads=1, *, seed=None, bias=True, aux_weights=None, mu=1e-3, nu=1e-3,
                 options=None, **more_options):
        super().__init__()
        options = dict(options or {})
        for key in more_options:
            if key in options:
                raise TypeError(f"cf.torch.Attention: option {key!r} given both as a keyword and in options")
        options.update(more_options)
        if aux_weights is None:
            aux_weights = ({_cf.nn.CLUSTERING_LOSS: mu, _cf.nn.CENTROID_SORTING_LOSS: nu}
                           if type == "neural-clustering" else {})
        self.type = type
        # what rebuilds the cf side of a copy (copy.deepcopy, pickling: __setstate__)
        self._cf_args = dict(type=type, d_model=d_model, n_heads=n_heads, seed=seed, bias=bias,
                             aux_weights=dict(aux_weights), options=dict(options))
        self._build_cf()
        self._param_names = []
        for name, cap in self._bridge.parameter_capsules():
            pname = name.replace(".", "_")
            self.register_parameter(pname, _torch.nn.Parameter(_from_capsule(cap)))
            self._param_names.append(pname)
        # cf's shared buffers become torch buffers aliasing cf's memory; the rank-local ones (a memory
        # bank's stored states and counters) stay cf's, in state_dict only (bridge.cpp, buffer_capsules)
        self._buffer_names = {}  # torch buffer name -> cf name
        for name, cap, persistent, local in self._bridge.buffer_capsules():
            if not local:
                self.register_buffer(name.replace(".", "_"), _from_capsule(cap), persistent=persistent)
                self._buffer_names[name.replace(".", "_")] = name
        self._params, self._bound_buffers = self._slots()
        self._grad_flags = None
        self._buffer_versions = self._torch_buffer_versions()

    def _build_cf(self):
        a = self._cf_args
        gen = _cf.Generator(a["seed"]) if a["seed"] is not None else None
        self.cf_module = _cf.nn.MultiHeadAttention(a["type"], a["d_model"], a["n_heads"], generator=gen,
                                                   bias=a["bias"], **a["options"])
        self._last_aux = None
        self._bridge = _bridge.AttentionBridge(self.cf_module, a["aux_weights"])

    # copy.deepcopy and pickling (torch.save of the module): PyTorch's state without cf's objects;
    # __setstate__ rebuilds the cf module and makes its parameters and buffers alias the copied
    # torch tensors, in their dtype and on their device.
    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("cf_module", "_bridge", "_params", "_bound_buffers", "_last_aux", "_aux_loss"):
            state.pop(k, None)
        state["_cf_local_values"] = {name: t.clone() for name, t, _ in self._cf_local_buffers()}
        return state

    def __setstate__(self, state):
        local = state.pop("_cf_local_values", {})
        super().__setstate__(state)  # PyTorch's, which fills in what a pickle of an older PyTorch lacks
        self._build_cf()
        self._bind()
        written = []
        with _torch.no_grad():
            for name, t, cf_name in self._cf_local_buffers():
                if name in local:
                    t.copy_(local[name])
                    written.append(cf_name)
        self._bridge.state_loaded(written)  # as cf's load_state_dict: Module::on_state_loaded
        self.cf_module.train(self.training)

    def _slots(self):
        """The tensors in the module's parameter and shared-buffer slots now: (params, buffers)."""
        if "_attr_to_path" in self.__dict__:  # PyTorch 1.x's functional_call swaps them by attribute
            return [getattr(self, n) for n in self._param_names], [getattr(self, n) for n in self._buffer_names]
        return [self._parameters[n] for n in self._param_names], [self._buffers[n] for n in self._buffer_names]

    def _bind(self):
        """Make cf's parameters and shared buffers alias the tensors in the module's slots."""
        params, buffers = self._slots()
        self._bridge.bind([_to_capsule(p.detach()) for p in params],
                          {cf_name: _to_capsule(b) for cf_name, b in zip(self._buffer_names.values(), buffers)})
        self._params, self._bound_buffers = params, buffers
        self._grad_flags = None  # the imported tensors carry no requires_grad: forward passes PyTorch's
        self._buffer_versions = self._torch_buffer_versions()

    def _rebind_if_replaced(self):
        # load_state_dict(assign=True), functional_call and the like put other tensors in the
        # module's slots: cf must read those (one identity test per tensor, each call)
        if "_attr_to_path" not in self.__dict__:  # the common case, in a loop without lists (about 0.4 us)
            slots = self._parameters
            for n, t in zip(self._param_names, self._params):
                if slots[n] is not t:
                    return self._bind()
            slots = self._buffers
            for n, t in zip(self._buffer_names, self._bound_buffers):
                if slots[n] is not t:
                    return self._bind()
            return None
        params, buffers = self._slots()
        if any(a is not b for a, b in zip(self._params + self._bound_buffers, params + buffers)):
            self._bind()

    @property
    def aux_loss(self):
        """The weighted auxiliary losses of the last call as a 0-d tensor on the autograd graph (zero, without a
        graph, when none, and once the call's backward ran): add it to the loss to scale its gradients with the
        loss's (see the module's doc)."""
        aux = self.__dict__.get("_aux_loss")
        return aux if aux is not None else _torch.zeros(())

    @property
    def last_aux_loss(self):
        """The weighted auxiliary losses of the last call (0.0 when none)."""
        return self._last_aux.item() if self._last_aux is not None else 0.0

    def _cf_local_buffers(self):
        """(state-dict name, torch view of cf's tensor, cf's name) of each persistent rank-local cf buffer."""
        return [(name.replace(".", "_"), _from_capsule(cap), name)
                for name, cap, persistent, local in self._bridge.buffer_capsules() if local and persistent]

    def _torch_buffer_versions(self):
        # (a tensor made under inference_mode has no version counter: None, read as "maybe written")
        return tuple(None if b.is_inference() else b._version for b in self._bound_buffers)

    def _note_torch_writes(self):
        # PyTorch's in-place writes into the shared buffers (load_state_dict, DistributedDataParallel's
        # broadcast, a user's copy_) bump PyTorch's version counters, not cf's: pass them on, so
        # that what cf caches from its buffers is read again.
        versions = self._torch_buffer_versions()
        written = [cf_name for cf_name, v, seen in zip(self._buffer_names.values(), versions, self._buffer_versions)
                   if v is None or v != seen]
        if written:
            self._bridge.buffers_written(written)
            self._buffer_versions = versions

    # The rank-local buffers are state too: state_dict holds copies, load_state_dict writes into cf's
    # tensors (and tells cf they were written: the memory bank's cached step count is read again).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, t, _ in self._cf_local_buffers():
            destination[prefix + name] = t.clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self._rebind_if_replaced()  # a load that assigned new tensors (PyTorch >= 2.1's assign=True)
        written = []
        for name, t, cf_name in self._cf_local_buffers():
            key = prefix + name
            if key in unexpected_keys:  # PyTorch's own check does not know them
                unexpected_keys.remove(key)
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if value.shape != t.shape:
                error_msgs.append("size mismatch for %s: copying a param with shape %s from checkpoint, the shape "
                                  "in current model is %s." % (key, tuple(value.shape), tuple(t.shape)))
                continue
            with _torch.no_grad():
                t.copy_(value)
            written.append(cf_name)
        self._bridge.state_loaded(written)  # as cf's load_state_dict: Module::on_state_loaded
        self._note_torch_writes()
        local = [name for name, _, _, is_local in self._bridge.buffer_capsules() if is_local]
        if local:
            self._bridge.buffers_written(local)

    def on_train_step(self):
        """Count one training step (call it once per optimizer step): a Cluster-Former memory bank
        re-clusters its stored states by K-Means every `update_every` steps (Cluster-Former,
        Algorithm 1). Returns how many banks re-clustered (0 for the variants without one)."""
        self._rebind_if_replaced()
        self._note_torch_writes()
        anchor = self._params[0]
        cur = _cf_stream_enter(anchor)
        n = self._bridge.on_train_step()
        _cf_stream_leave(cur, anchor)
        return n

    def train(self, mode=True):
        """PyTorch's train()/eval(), passed on to the cf module: attention dropout and the
        variants' training-only behaviour (auxiliary losses, centroid updates) follow it."""
        super().train(mode)
        self.cf_module.train(mode)
        return self

    def _apply(self, fn, *args, **kwargs):
        # .to(device), .double(), .cuda(): PyTorch makes new parameter and buffer tensors;
        # cf's must alias them again.
        super()._apply(fn, *args, **kwargs)
        # cf keeps its statistics buffers (routing's EMA centroids, a memory bank's centroids) float32
        # in a 16-bit model (Module::keep_float32_under_16bit); PyTorch's .to(bfloat16) converted them
        for name in self._buffer_names:
            b = self._buffers.get(name)
            if b is not None and b.dtype in (_torch.bfloat16, _torch.float16):
                self._buffers[name] = b.float()
        self._bind()
        return self

    def forward(self, x, key_padding_mask=None, causal=False):
        if key_padding_mask is not None and key_padding_mask.dtype != _torch.bool:
            raise TypeError("[cf.torch.Attention] key_padding_mask must be bool (True = padding), got %s"
                            % key_padding_mask.dtype)
        self._rebind_if_replaced()
        cur = _cf_stream_enter(x)
        # Under torch.no_grad() (inference) cf records no graph for the call (PyTorch will ask for no backward).
        # Under torch.autocast, cf's autocast in the same dtype (its per-op policy is PyTorch's: products in
        # 16 bits, softmax statistics and norms in float32); the parameters stay float32 master weights.
        # With nothing that requires grad (a frozen layer on a constant input) there is no backward either.
        flags = tuple(p.requires_grad for p in self._params)
        if flags != self._grad_flags:  # cf computes the gradients PyTorch's flags ask for, no more, no less
            self._bridge.set_requires_grad(flags)
            self._grad_flags = flags
        record = _torch.is_grad_enabled() and (x.requires_grad or any(flags))
        y, aux = _AttentionFunction.apply(self, x, key_padding_mask, bool(causal), record, _autocast_dtype(x),
                                          *self._params)
        _cf_stream_leave(cur, x)
        self.__dict__["_aux_loss"] = aux  # (__dict__: Module.__setattr__ is slow)
        return y

    def extra_repr(self):
        return "type=%r, d_model=%d, n_heads=%d" % (self.type, self.cf_module.d_model, self.cf_module.n_heads)
