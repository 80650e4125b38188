"""Data parallelism over the smddp backend: our own DDP wrapper, and the comm hooks for torch's DDP.

``DistributedDataParallel`` keeps SMDDP's fusion buffers in memory the host's ranks share: each
gradient is copied into its bucket as soon as autograd produces it, and a full bucket is reduced in
place on the communication thread (rank i reduces shard i of every rank's bucket and writes the result
into all of them) while backward goes on. Compared with torch's DDP over the same backend this saves the
bucket's staging and copy-back passes, which on CPU compete with backward for the same cores.

    model = smddp_sdk.collectives.ddp.DistributedDataParallel(net, bucket_cap_mb=25)

torch's DDP over an smddp group (``dist.init_process_group("smddp")`` is enough) gets two defaults from
the backend (``install_default_hook``): ``gradient_as_bucket_view=True`` (the gradients are views into
DDP's buckets, so nothing is copied back after the reduction) unless the script passes False, and a hook
that averages each bucket in one pass, the division folded into the reduction: over two or more ranks
``shared_allreduce_hook``, which moves DDP's buckets into memory the host's ranks share and then works
like smddp's own DDP (SharedBuckets), else ``allreduce_hook``. A hook the script registers replaces it;
``register`` installs the compressing ones:

    model = DistributedDataParallel(net, bucket_cap_mb=25)         # torch.nn.parallel: the default hook
    smddp_sdk.collectives.ddp.register(model, compress="bf16")     # bf16 on the wire, fp32 accumulation

Low-precision buckets (fp16/bf16 models, or ``compress``) are summed in fp32 and rounded once, so the
result equals reducing the fp32 values and rounding at the end.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as live objects.
import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from smddp_sdk.collectives.local import OwnSource
from smddp_sdk.collectives.process_group import SmddpProcessGroup, smddp_backend
from smddp_sdk.collectives.reduce import HALF_TYPES

COMPRESS_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
TorchDDP = torch.nn.parallel.DistributedDataParallel
Hook = Callable[[object, dist.GradBucket], torch.futures.Future]


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _divided(size: int, fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0].div_(size)


def allreduce_hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in place over the group: AVG, whose division the native core folds into the
    reduction on one host (fp16/bf16 summed in fp32 and rounded once). Across hosts the core runs fp32
    and fp64 sums but not AVG, so those are summed there and divided once here."""
    buffer, backend = bucket.buffer(), smddp_backend(group)
    if backend is not None and len(backend.topology.nodes) > 1 and buffer.dtype not in HALF_TYPES:
        work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)
        return work.get_future().then(functools.partial(_divided, backend.size()))
    work = dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=group, async_op=True)
    return work.get_future().then(_first)


def _compressed_hook(dtype: torch.dtype) -> Hook:
    wires: dict[int, torch.Tensor] = {}  # bucket index -> its low-precision copy, kept between steps

    def hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        wire = wires.get(bucket.index())
        if wire is None or wire.numel() != buffer.numel():  # first step, or DDP rebuilt its buckets
            wire = wires[bucket.index()] = torch.empty(buffer.numel(), dtype=dtype)
        wire.copy_(buffer)
        work = dist.all_reduce(wire, op=dist.ReduceOp.AVG, group=group, async_op=True)

        def decompress(fut: torch.futures.Future) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return work.get_future().then(decompress)

    hook.__name__ = hook.__qualname__ = f"{dtype}_compress_hook".replace("torch.", "")
    return hook


def register(model: TorchDDP, group: dist.ProcessGroup | None = None, compress: str | None = None) -> None:
    """Install an smddp hook on a DDP model; ``compress`` is None (the averaging hook), "fp16" or "bf16"."""
    if compress is not None and compress not in COMPRESS_DTYPES:
        raise ValueError(f"compress={compress!r} is not supported: use None, " + ", ".join(repr(k) for k in COMPRESS_DTYPES))
    if compress is None:
        model.register_comm_hook(*averaging_hook(model, group))
    else:
        model.register_comm_hook(group, _compressed_hook(COMPRESS_DTYPES[compress]))


# torch's DDP over smddp: its buckets in memory the host's ranks share -------------------------------------
DEFAULT_BUCKET_CAP_MB = 25.0  # torch's DDP's default; with it (only), a small first bucket,
FIRST_BUCKET_BYTES = 1 << 20  # as torch's DDP's rebuilt buckets have: a named cap holds for every bucket
ALIGN_BYTES = 64  # buckets start on their own cache line


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def _dense(tensor: torch.Tensor) -> bool:
    """Non-overlapping and dense (some order of its dimensions is contiguous): DDP's bucket views keep
    the parameter's strides then, else they are contiguous."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(tensor.stride(), tensor.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def stage_except_own(flat: torch.Tensor, begin: int, grad: torch.Tensor, own_range: tuple[int, int], own: list[OwnSource]) -> None:
    """Copy a gradient (flat, dense) into elements begin: of a bucket's shared copy, except the part in
    this rank's own range: the reduction reads that straight from the gradient (peers never read it),
    saving a pass over it; own gets (start, stop, the gradient's part)."""
    end = begin + grad.numel()
    view = flat[begin:end]
    lo, hi = max(begin, own_range[0]), min(end, own_range[1])
    if lo >= hi:
        view.copy_(grad)
        return
    view[: lo - begin].copy_(grad[: lo - begin])
    view[hi - begin :].copy_(grad[hi - begin :])
    own.append((lo, hi, grad[lo - begin : hi - begin]))


@dataclass(eq=False)
class _Place:
    """Where one bucket of torch's DDP lives in the shared region: the host's copies (local order), this
    rank's view of each parameter's gradient in its copy (DDP's layout) and where each starts."""

    views: list[torch.Tensor]
    grads: list[torch.Tensor]
    starts: list[int]
    own_range: tuple[int, int]  # the elements this rank reduces for the host
    own: list[OwnSource] = field(default_factory=list)  # of those, the ones still in the gradients

    def take_own(self) -> list[OwnSource]:
        own, self.own = self.own, []
        return own


@dataclass(eq=False)
class _Home:
    """A parameter's gradient in its bucket's place."""

    place: _Place
    index: int  # in the bucket
    settled: bool  # placed after DDP rebuilt its buckets (the layout it keeps)


@dataclass(eq=False)
class SharedBuckets:
    """The state of shared_allreduce_hook: a region of memory the host's ranks share, large enough for
    the model's gradients in any bucket layout. On first use a bucket moves there: DDP's bucket tensor
    and the gradient views into it are re-pointed in place (``set_``), so the reducer keeps using the same
    tensors, now in shared memory; from then on the host reduces each bucket in place
    (``allreduce_shared``: no staging copies) and the average stays folded into the reduction. Buckets
    are placed one after the other in index order, the order DDP launches them on every rank.

    Once DDP's buckets keep their layout (rebuilt after the first step), a fresh gradient (``set_to_none``)
    is staged as smddp's own DDP does it, before the reducer would copy all of it: the part this rank
    reduces stays where autograd put it and the reduction reads it there (``stage_except_own``), and
    ``param.grad`` becomes its view in the bucket, so the reducer copies nothing."""

    model: weakref.ref
    group: dist.ProcessGroup | None
    backend: SmddpProcessGroup
    nbytes: int
    region: list[torch.Tensor] | None = None
    places: dict[tuple[int, torch.dtype, tuple[int, ...]], _Place] = field(default_factory=dict)  # by layout
    homes: dict[torch.nn.Parameter, _Home] = field(default_factory=dict)
    staging: list[_Place] = field(default_factory=list)  # places with gradients staged this backward
    handles: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list)
    next_byte: int = 0  # where the next bucket starts
    unavailable: bool = False

    @classmethod
    def for_model(cls, model: TorchDDP, group: dist.ProcessGroup | None) -> "SharedBuckets | None":
        backend = smddp_backend(group)
        if backend is None or backend.size() == 1:
            return None
        params = [p for p in model.module.parameters() if p.requires_grad]
        # a bucket's aligned size is at most the sum of its parameters' aligned sizes
        state = cls(weakref.ref(model), group, backend, sum(_aligned(p.numel() * p.element_size()) for p in params))
        state.handles = [p.register_post_accumulate_grad_hook(state._stage) for p in params]
        return state

    def close(self) -> None:
        """Stop staging gradients (the script registered another hook)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def place(self, bucket: dist.GradBucket) -> _Place | None:
        """The bucket's place, with this rank's bucket and gradients in its copy; None where it cannot
        live in the region, which depends on the layout only (the same on every rank)."""
        buffer = bucket.buffer()
        start = 0 if bucket.index() == 0 else self.next_byte
        nbytes = buffer.numel() * buffer.element_size()
        self.next_byte = start + _aligned(nbytes)
        if self.next_byte > self.nbytes or not buffer.is_contiguous() or self._region() is None:
            return None
        params = bucket.parameters()
        key = (start, buffer.dtype, tuple(map(id, params)))  # DDP rebuilds its buckets after the first step
        place = self.places.get(key)
        if place is None:
            place = self.places[key] = self._cut(start, buffer, params)
        mine = place.views[self.backend.local_index]
        if buffer.data_ptr() != mine.data_ptr():
            _move(buffer, params, mine)
            settled = bool(getattr(self.model(), "_has_rebuilt_buckets", False))
            self.homes.update({param: _Home(place, index, settled) for index, param in enumerate(params)})
        for param, target in zip(params, place.grads):
            grad = param.grad
            if grad is None:  # unused here: counts as zeros
                target.zero_()
            elif grad.data_ptr() != target.data_ptr():  # a gradient the move did not reach: copied
                target.copy_(grad)
        return place

    def _region(self) -> list[torch.Tensor] | None:
        """Allocated by the first bucket (collective: every rank's hook starts with bucket 0); None on
        every rank if any host has none (one rank there, or no shared memory)."""
        if self.region is None and not self.unavailable:
            region = self.backend.shared_buffers(self.nbytes)
            everywhere = torch.tensor([region is not None], dtype=torch.int32)
            dist.all_reduce(everywhere, op=dist.ReduceOp.MIN, group=self.group)
            self.region, self.unavailable = (region, False) if everywhere.item() else (None, True)
        return self.region

    def _cut(self, start: int, buffer: torch.Tensor, params: list[torch.nn.Parameter]) -> _Place:
        nbytes = buffer.numel() * buffer.element_size()
        views = [host[start : start + nbytes].view(buffer.dtype) for host in self.region]
        mine, grads, starts, offset = views[self.backend.local_index], [], [], 0
        for param in params:
            at = mine.storage_offset() + offset
            grads.append(mine.as_strided(param.shape, param.stride(), at) if _dense(param) else mine[offset : offset + param.numel()].view(param.shape))
            starts.append(offset)
            offset += param.numel()
        return _Place(views, grads, starts, self.backend.shard_range(buffer.numel()))

    def _stage(self, param: torch.nn.Parameter) -> None:
        """Autograd accumulated param's gradient: stage a fresh one into its settled place (see above)."""
        home, grad = self.homes.get(param), param.grad
        if home is None or not home.settled or grad is None:
            return
        place = home.place
        target = place.grads[home.index]
        if grad.data_ptr() == target.data_ptr() or grad.stride() != target.stride() or not _dense(grad):
            return  # in place already (accumulated there), or a layout the reducer copies itself
        if not self.staging:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_staging)
        if place not in self.staging:
            self.staging.append(place)
        flat = grad.as_strided((grad.numel(),), (1,), grad.storage_offset())
        stage_except_own(place.views[self.backend.local_index], place.starts[home.index], flat, place.own_range, place.own)
        param.grad = target  # in the bucket: DDP's reducer leaves it there

    def _finish_staging(self) -> None:
        """End of backward: parts no reduction took (no_sync, say) go into the buckets after all."""
        for place in self.staging:
            mine = place.views[self.backend.local_index]
            for start, stop, source in place.take_own():
                mine[start:stop].copy_(source)
        self.staging = []


def _move(buffer: torch.Tensor, params: list[torch.nn.Parameter], mine: torch.Tensor) -> None:
    """Re-point DDP's bucket tensor and the gradients that are views into it at mine, contents included."""
    old, esize = buffer.data_ptr(), buffer.element_size()
    end = old + buffer.numel() * esize
    mine.copy_(buffer)
    storage = mine.untyped_storage()
    for param in params:
        grad = param.grad
        if grad is not None and old <= grad.data_ptr() < end:
            grad.set_(storage, mine.storage_offset() + (grad.data_ptr() - old) // esize, grad.shape, grad.stride())
    buffer.set_(storage, mine.storage_offset(), buffer.shape, buffer.stride())


def shared_allreduce_hook(state: SharedBuckets, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """allreduce_hook for buckets in shared memory (SharedBuckets): each averaged in place by the host."""
    place = state.place(bucket)
    if place is None:
        return allreduce_hook(state.group, bucket)
    work = state.backend.allreduce_shared(place.views, dist.ReduceOp.AVG, place.take_own())
    return work.get_future().then(_first)


def averaging_hook(model: TorchDDP, group: dist.ProcessGroup | None) -> tuple[object, Hook]:
    """The state and hook that average DDP's buckets best over the group: in shared memory over smddp
    (two or more ranks), else allreduce_hook."""
    shared = SharedBuckets.for_model(model, group)
    return (group, allreduce_hook) if shared is None else (shared, shared_allreduce_hook)


@dataclass
class _DefaultHook:
    """The hook torch's DDP calls: the averaging hook, until the script registers its own in its place."""

    state: object
    hook: Hook
    replaceable: bool = True


def _default_hook(default: _DefaultHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return default.hook(default.state, bucket)


def _over_smddp(arguments: inspect.BoundArguments) -> bool:
    """DDP's constructor arguments name an smddp group (or leave the default group, which is one)."""
    given = arguments.arguments
    if given.get("device_mesh") is not None or not dist.is_initialized():
        return False
    return smddp_backend(given.get("process_group")) is not None


def _takes_default_hook(model: TorchDDP) -> bool:
    """A CPU model with DDP's C++ reducer and no hook yet (mixed precision installs one)."""
    return getattr(model, "reducer", None) is not None and not model._comm_hooks and model.device_type == "cpu" and not getattr(model, "_use_python_reducer", False)


def install_default_hook() -> None:
    """Make torch's DDP over an smddp group keep gradients in its buckets and average them with allreduce_hook.

    Unless the script says otherwise, ``gradient_as_bucket_view`` defaults to True over smddp (torch's
    option: ``param.grad`` is a view into DDP's bucket, so nothing is copied back after the reduction,
    and a gradient accumulated without ``set_to_none`` lands in the bucket directly); pass False to keep
    separate gradient tensors. The script's ``register_comm_hook`` (or ``_register_builtin_comm_hook``)
    replaces allreduce_hook, once, as torch allows one registration. A model saved (torch.save) or copied
    (copy.deepcopy) leaves the hook behind, as torch's DDP leaves its group and reducer, and gets a new one
    over the default group when it is loaded. Idempotent."""
    if getattr(TorchDDP.__init__, "smddp_default_hook", False):
        return
    init, register_hook, register_builtin = TorchDDP.__init__, TorchDDP.register_comm_hook, TorchDDP._register_builtin_comm_hook
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: TorchDDP, *args: object, **kwargs: object) -> None:  # noqa: N807 - the wrapped method
        arguments = signature.bind(self, *args, **kwargs)
        over_smddp = _over_smddp(arguments)
        if over_smddp and "gradient_as_bucket_view" not in arguments.arguments:
            kwargs["gradient_as_bucket_view"] = True
        init(self, *args, **kwargs)
        if over_smddp:
            _install_default(self)

    @functools.wraps(register_hook)
    def register_comm_hook(self: TorchDDP, state: object, hook: Hook) -> None:
        default: _DefaultHook | None = getattr(self, "_smddp_hook", None)
        if default is None or not default.replaceable:
            register_hook(self, state, hook)  # not ours, or replaced already: torch's checks and errors
            return
        self._check_comm_hook(hook)
        if isinstance(default.state, SharedBuckets):
            default.state.close()
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        default.hook, default.state, default.replaceable = hook, state, False

    @functools.wraps(register_builtin)
    def _register_builtin_comm_hook(self: TorchDDP, comm_hook_type: dist.BuiltinCommHookType) -> None:
        if getattr(self, "_smddp_hook", None) is None or comm_hook_type not in (dist.BuiltinCommHookType.ALLREDUCE, dist.BuiltinCommHookType.FP16_COMPRESS):
            register_builtin(self, comm_hook_type)
        elif comm_hook_type == dist.BuiltinCommHookType.ALLREDUCE:
            register_comm_hook(self, *averaging_hook(self, self.process_group))
        else:
            register_comm_hook(self, self.process_group, _compressed_hook(torch.float16))

    getstate, setstate = TorchDDP.__getstate__, TorchDDP.__setstate__

    @functools.wraps(getstate)
    def __getstate__(self: TorchDDP) -> dict:  # noqa: N807
        state = getstate(self)
        state.pop("_smddp_hook", None)  # bound to the group and its shared memory, as torch's reducer is
        return state

    @functools.wraps(setstate)
    def __setstate__(self: TorchDDP, state: dict) -> None:  # noqa: N807
        setstate(self, state)  # torch's: over the default group, with a new reducer
        _install_default(self)

    __init__.smddp_default_hook = True
    TorchDDP.__init__, TorchDDP.register_comm_hook = __init__, register_comm_hook
    TorchDDP._register_builtin_comm_hook = _register_builtin_comm_hook
    TorchDDP.__getstate__, TorchDDP.__setstate__ = __getstate__, __setstate__


def _install_default(model: TorchDDP) -> None:
    """The averaging hook on a DDP model over smddp that takes it, held where register_comm_hook finds it."""
    if smddp_backend(model.process_group) is not None and _takes_default_hook(model):
        model._smddp_hook = _DefaultHook(*averaging_hook(model, model.process_group))
        dist._register_comm_hook(model.reducer, model._smddp_hook, _default_hook)


@dataclass(eq=False)
class _Bucket:
    """Parameters whose gradients are reduced together, and this rank's fused buffer for them."""

    params: list[torch.nn.Parameter]
    offsets: list[int]  # element offset of each parameter's gradient in flat
    flat: torch.Tensor = field(init=False)
    shared: list[torch.Tensor] | None = None  # the host's copies of flat (this rank's included), if any
    own_range: tuple[int, int] = (0, 0)  # the elements this rank reduces for the host: never staged
    own_sources: list[OwnSource] = field(default_factory=list)  # their gradients
    staged: set[int] = field(default_factory=set)  # params whose gradient is ready this backward
    work: dist.Work | None = None

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.params[-1].numel() if self.params else 0

    def grad_view(self, index: int) -> torch.Tensor:
        param = self.params[index]
        return self.flat[self.offsets[index] : self.offsets[index] + param.numel()].view(param.shape)


def _weak_hook(method: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
    """A parameter hook that calls method while its object lives. A bound method would make a cycle
    (wrapper -> module -> parameter -> hook -> wrapper): the wrapper and its group would then go only in
    the interpreter's last collection, where a gloo group's threads, joined as Python shuts down, abort
    the process ("terminate called without an active exception")."""
    ref = weakref.WeakMethod(method)

    def hook(param: torch.Tensor) -> None:
        bound = ref()
        if bound is not None:
            bound(param)

    return hook


class DistributedDataParallel(torch.nn.Module):
    """Wrap a CPU model for data-parallel training; gradients are averaged over the group in backward.

    Same contract as ``torch.nn.parallel.DistributedDataParallel`` for the common case: parameters and
    buffers are broadcast from rank 0 at construction, buffers again before each training forward
    (``broadcast_buffers``), gradients are averaged over the group by the end of ``backward()``, and
    ``no_sync()`` skips the reduction while gradients accumulate locally. After a synchronised backward
    each ``param.grad`` is a view into the fusion buffer (like torch's ``gradient_as_bucket_view``). A
    parameter that got no gradient on a rank contributes zeros, and every parameter ends with a gradient.
    Buckets are laid out as torch's DDP lays out its own after the first step: ``bucket_cap_mb`` left
    out, 25 MB with a 1 MB first bucket; named, that cap for every bucket.

    Over an smddp group the buffers live in shared memory and each host reduces them without copies; over
    any other group (gloo, say) they are ordinary tensors reduced with ``all_reduce``.
    """

    def __init__(self, module: torch.nn.Module, process_group: dist.ProcessGroup | None = None, bucket_cap_mb: float | None = None, broadcast_buffers: bool = True) -> None:
        super().__init__()
        if bucket_cap_mb is not None and bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb} must be positive (torch's DDP default is 25)")
        tensors = [*module.parameters(), *module.buffers()]
        elsewhere = sorted({str(t.device) for t in tensors if t.device.type != "cpu"})
        if elsewhere:
            raise ValueError(
                f"smddp's DistributedDataParallel is for CPU models; this one has tensors on {', '.join(elsewhere)}: use torch.nn.parallel.DistributedDataParallel (smddp hands CUDA tensors to NCCL)"
            )
        self.module = module
        self.process_group = process_group or dist.group.WORLD
        self.broadcast_buffers = broadcast_buffers
        self._world = dist.get_world_size(self.process_group)
        self._source = dist.get_global_rank(self.process_group, 0)  # parameters and buffers come from here
        self._sync = True
        self._callback_queued = False
        self._launched = 0  # buckets launched this backward, always in index order (the same on every rank)
        params = [p for p in module.parameters() if p.requires_grad]
        cap_bytes = int((bucket_cap_mb or DEFAULT_BUCKET_CAP_MB) * (1 << 20))
        self._buckets = _plan_buckets(params, cap_bytes, FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap_bytes)
        self._place = {p: (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        self._join(keep=False)
        ready = _weak_hook(self._gradient_ready)
        for param in params:
            param.register_post_accumulate_grad_hook(ready)

    def _join(self, *, keep: bool) -> None:
        """The construction's collectives: parameters and buffers from rank 0 (``keep``: received into
        copies, this rank's own left as they are), then the fusion buffers."""
        with torch.no_grad():
            for tensor in [*self.module.parameters(), *self.module.buffers()]:
                into = tensor.clone() if keep and dist.get_rank() != self._source else tensor
                dist.broadcast(into, src=self._source, group=self.process_group)
        self._allocate()

    def rejoin(self) -> None:
        """After the group re-formed in place (``SmddpProcessGroup.reform``): the collectives a replaced
        rank's new wrapper runs at construction, matched here without changing this rank's parameters,
        and fusion buffers in the new arena. A backward cut short leaves nothing behind: every gradient is
        dropped (the old buffers are gone)."""
        self._callback_queued, self._launched = False, 0
        for bucket in self._buckets:
            bucket.staged.clear()
            bucket.own_sources, bucket.work = [], None
            for param in bucket.params:
                param.grad = None
        self._join(keep=True)

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.training and self._world > 1:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, src=self._source, group=self.process_group)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the next one outside reduces them."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # buffers ------------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        starts, total = [], 0
        for bucket in self._buckets:
            starts.append(total)
            total += -(-bucket.numel * bucket.params[0].element_size() // ALIGN_BYTES) * ALIGN_BYTES
        smddp = self._smddp = smddp_backend(self.process_group)
        shared = smddp.shared_buffers(total) if smddp is not None and self._world > 1 else None
        for bucket, start in zip(self._buckets, starts):
            dtype, nbytes = bucket.params[0].dtype, bucket.numel * bucket.params[0].element_size()
            if shared is None:
                bucket.flat = torch.zeros(bucket.numel, dtype=dtype)
                continue
            bucket.shared = [buffer[start : start + nbytes].view(dtype) for buffer in shared]
            bucket.flat = bucket.shared[smddp.local_index]
            bucket.own_range = smddp.shard_range(bucket.numel)

    # backward -----------------------------------------------------------------------------------------
    def _gradient_ready(self, param: torch.nn.Parameter) -> None:
        if not self._sync or self._world == 1:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket, index = self._place[param]
        view = bucket.grad_view(index)
        if param.grad.data_ptr() != view.data_ptr():
            stage_except_own(bucket.flat, bucket.offsets[index], param.grad.reshape(-1), bucket.own_range, bucket.own_sources)
            param.grad = view  # autograd's fresh tensor goes now (bar the part the reduction reads), as in SharedBuckets
        bucket.staged.add(index)
        while self._launched < len(self._buckets) and self._is_full(self._buckets[self._launched]):
            self._launch(self._buckets[self._launched])

    @staticmethod
    def _is_full(bucket: _Bucket) -> bool:
        return len(bucket.staged) == len(bucket.params)

    def _launch(self, bucket: _Bucket) -> None:
        self._launched += 1
        if bucket.shared is not None:
            bucket.work = self._smddp.allreduce_shared(bucket.shared, dist.ReduceOp.AVG, bucket.own_sources)
        else:
            bucket.work = dist.all_reduce(bucket.flat, group=self.process_group, async_op=True)

    def _finish_backward(self) -> None:
        """At the end of backward: reduce what is left (unused parameters count as zeros), then wait."""
        self._callback_queued = False
        try:
            for bucket in self._buckets[self._launched :]:
                for index in set(range(len(bucket.params))) - bucket.staged:
                    bucket.grad_view(index).zero_()
                self._launch(bucket)
            for bucket in self._buckets:
                bucket.work.wait()
                if bucket.shared is None:
                    bucket.flat.div_(self._world)
                for index, param in enumerate(bucket.params):
                    view = bucket.grad_view(index)
                    if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                        param.grad = view  # the fusion buffer holds the gradient from now on
        finally:
            self._launched = 0
            for bucket in self._buckets:
                bucket.staged.clear()
                bucket.own_sources = []
                bucket.work = None


def _plan_buckets(params: list[torch.nn.Parameter], cap_bytes: int, first_cap_bytes: int) -> list[_Bucket]:
    """Buckets in reverse registration order (roughly the order backward produces gradients), one dtype
    each: the first up to first_cap_bytes, the others up to cap_bytes; each closes at the parameter that
    reaches its cap. The layout torch's DDP rebuilds its buckets to after its first step, given the same
    order and caps."""
    buckets: list[_Bucket] = []
    open_buckets: dict[torch.dtype, _Bucket] = {}
    for param in reversed(params):
        bucket = open_buckets.get(param.dtype)
        if bucket is None:
            bucket = open_buckets[param.dtype] = _Bucket([], [])
            buckets.append(bucket)
        bucket.offsets.append(bucket.numel)
        bucket.params.append(param)
        limit = first_cap_bytes if len(buckets) == 1 else cap_bytes
        if bucket.numel * param.element_size() >= limit:
            del open_buckets[param.dtype]
    return buckets
