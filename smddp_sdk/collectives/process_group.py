"""The `smddp` ProcessGroup: torch's method names mapped onto the Communicator's four primitives.

torch 2.13 cannot subclass the C++ Backend from Python, so the group is a ProcessGroup subclass that torch
uses directly. Its base is the native core (native/core/) where that builds: blocking
collectives of a one-host group, and all_reduce, reduce, all_gather, gather, broadcast, scatter,
reduce_scatter_tensor and reduce_scatter (a list, even or uneven), all_to_all and barrier across hosts,
then run in C++ without entering Python, and everything else comes back to the methods here under
`_python_<name>`. Without the core the base is torch's ProcessGroup and these methods are called directly.
Both dispatch paths reach them: `dist.*` with Python arguments, C++ callers (DDP's reducer, functional
collectives) through the trampoline, so names and signatures mirror the C++ binding exactly.

Every collective runs on one communication thread per group (call order is the cross-rank order) and
returns a Work over a torch Future whose value is the tensor list (DDP's reducer reads it). A blocking
call with nothing queued runs inline, saving the thread hand-off on small messages.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from smddp_sdk.collectives import native, profile, progress, sagemaker_compat
from smddp_sdk.collectives.algorithms import forced_algorithm
from smddp_sdk.collectives.calls import Call
from smddp_sdk.collectives.communicator import Communicator
from smddp_sdk.collectives.errors import CollectiveError
from smddp_sdk.collectives.local import SINGLE_COPY_FROM, STREAMED_FROM, OwnSource, shard_bounds, symmetric_limit
from smddp_sdk.collectives.memory import as_bytes
from smddp_sdk.collectives.p2p import ANY_SOURCE, PointToPoint
from smddp_sdk.collectives.reduce import RedOpType, check_supported, red_op_type
from smddp_sdk.collectives.shm import CHECK_EVERY_S
from smddp_sdk.collectives.store_values import KEY_PREFIX
from smddp_sdk.collectives.topology import build
from smddp_sdk.specs.contract import GROUP_GENERATION_ENV

BACKEND_NAME = "smddp"

# Groups whose communication thread runs: stopped at interpreter exit (see _stop_workers_at_exit).
_SERVING: weakref.WeakSet[SmddpProcessGroup] = weakref.WeakSet()
_P2P_SETUP = threading.Lock()  # a group's point-to-point engine is made once, whichever thread calls first


class FutureWork(dist.Work):
    """A Work over a torch Future whose wait() raises the collective's error.

    torch's own wrapper (_create_work_from_future) returns normally from wait() when the future failed,
    which would let a caller (or DDP) go on with half-reduced tensors.
    """

    def __init__(self, future: torch.futures.Future) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:  # noqa: ARG002 - the group timeout applies
        self._future.wait()  # raises the CollectiveError of a failed collective
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def get_future(self) -> torch.futures.Future:
        return self._future


def completed_work(value: object) -> dist.Work:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(value)
    return FutureWork(future)


def _address(function: ctypes._CFuncPtr) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def _tensors_in(args: Sequence[object]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found += _tensors_in(arg)
    return found


def cuda_goes_to_nccl(method: Callable[..., dist.Work]) -> Callable[..., dist.Work]:
    """CUDA tensors are handed to NCCL (same method name on ProcessGroupNCCL); CPU ones stay here."""

    @functools.wraps(method)
    def dispatch(self: SmddpProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        tensors = _tensors_in(args)
        sagemaker_compat.check_call(method.__name__, tensors, args)  # would AWS's SMDDP accept it?
        if self._core_waits_for_check and sagemaker_compat.quiet_for_sum():
            self._set_core_mode()
        if any(t.device.type == "cuda" for t in tensors):
            return getattr(self._nccl(), method.__name__)(*args, **kwargs)
        for tensor in tensors:
            if tensor.device.type != "cpu":
                raise CollectiveError(f"smddp {method.__name__}: tensors on {tensor.device} are not supported (CPU and CUDA only)")
        return method(self, *args, **kwargs)

    return dispatch


_BARRIER_CALL = Call("barrier")


def _call(op: str, tensors: Sequence[torch.Tensor], reduce_op: RedOpType | None = None, root: int = -1) -> Call:
    """The record ranks compare: dtype of the first tensor, total elements, reduce op and root."""
    return Call(op, tensors[0].dtype if tensors else None, sum(t.numel() for t in tensors), root,
                reduce_op.name if reduce_op is not None else "")


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _write_back(target: torch.Tensor, work: torch.Tensor) -> None:
    if work.data_ptr() != target.data_ptr() or not target.is_contiguous():
        target.copy_(work.view(target.shape))


def _split_sizes(splits: Sequence[int], tensor: torch.Tensor, parts: int, what: str) -> list[int]:
    """Rows per peer for all_to_all_single: the given splits, or an equal split of dim 0."""
    if splits:
        if len(splits) != parts or sum(splits) != (tensor.shape[0] if tensor.dim() else 1):
            raise CollectiveError(f"smddp {what}: split sizes {list(splits)} do not match {parts} ranks and dim 0 of size {tensor.shape[0]}")
        return list(splits)
    rows = tensor.shape[0] if tensor.dim() else 1
    if rows % parts:
        raise CollectiveError(f"smddp {what}: dim 0 ({rows}) is not divisible by the group size {parts}; pass split sizes")
    return [rows // parts] * parts


class SmddpProcessGroup:
    """torch.distributed ProcessGroup for backend "smddp": shared memory within a host, TCP between hosts.

    The implementation; the group's class (``group_class()``) combines it with its base, the native core
    or torch's ProcessGroup."""

    _monitored = 0  # monitored barriers called so far (they are numbered in the store)

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # the (store, rank, size) constructor fails for Python subclasses in 2.13
        self._store = store
        self._timeout = timeout
        self._group_name = ""
        self._group_desc = ""
        self._generation = group_generation()  # > 0 in the ranks of a replaced host: they join a re-formed group
        self._comm = self._connect()
        self._exec = threading.Lock()  # one collective at a time, in call order
        self._core_waits_for_check = False
        self._core_attached = False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._in_collective = False  # the worker is inside a collective (not merely completing a future)
        self._nccl_group: dist.ProcessGroup | None = None
        self._p2p: PointToPoint | None = None
        self._attach_core()
        progress.watch(self)  # specs.goodput: the group formed, then its first collective

    # identity (functional collectives need the name stored on the Python side) ------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def _connect(self) -> Communicator:
        """Rendezvous for this generation (each under a store prefix of its own): arena and mesh."""
        store = self._store if self._generation == 0 else dist.PrefixStore(f"smddp-generation-{self._generation}/", self._store)
        topo, local, mesh = build(store, self.rank(), self.size(), self._timeout)
        return Communicator(topo, local, mesh, self._timeout.total_seconds())

    def reform(self) -> int:
        """Re-form the group in place after a peer was lost (collective with the replaced ranks, which
        start in the next generation): the old arena and mesh go, a new rendezvous makes new ones, and
        this object -- the one torch and DDP hold -- carries on. Returns the new generation."""
        if hasattr(self, "_core_mode"):
            self._core_mode(0)  # nothing runs on the old transports meanwhile
        self._stop_worker(timeout=5)
        if self._p2p is not None:
            self._p2p.close()
            self._p2p = None
        self._comm.close()
        self._generation += 1
        self._comm = self._connect()
        self._core_attached = False
        self._attach_core()
        return self._generation

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def topology(self):  # for tests and diagnostics
        return self._comm.topo

    # the native core -----------------------------------------------------------------------------------
    def _attach_core(self) -> None:
        """Hand the group's arena and, across hosts, its connections to the core (a no-op on the Python base)."""
        comm, arena = self._comm, self._comm.local.arena
        if not hasattr(self, "_core_attach"):
            return
        local = arena is not None and arena.native and (comm.multi_node or arena.index == self.rank())
        if not local and not comm.multi_node:
            return  # one rank alone, or local indices that are not group ranks: the one-host calls need them
        kernels = native.library()
        try:
            forced = forced_algorithm()
        except CollectiveError:
            forced = "auto"  # the core stays off (_set_core_mode): Python reports the setting
        if comm.multi_node:
            self._core_attach_hosts(comm.topo.nodes, comm.topo.node, comm.topo.is_leader,
                                    comm.mesh.fds() if comm.mesh else [], ctypes.addressof(comm.mesh.header) if comm.mesh else 0,
                                    _address(kernels.smddp_exchange),
                                    _address(kernels.smddp_reduce), *comm.inter_host_rules(forced), int(CHECK_EVERY_S * 1e9))
        if local:
            # local.py's rule: symmetric up to symmetric_limit, always where oneshot is forced, never where another is
            symmetric_up_to = {"auto": symmetric_limit(arena), "oneshot": 1 << 62}.get(forced, -1)
            self._core_attach(arena.base_address, arena.n, arena.index, arena.slot_bytes,
                              *(ctypes.addressof(slots) for slots in arena.slot_addresses), ctypes.addressof(arena.counters),
                              arena.record_address, *(_address(kernel) for kernel in
                                                      (kernels.smddp_barrier, kernels.smddp_allreduce_small, kernels.smddp_reduce)),
                              *(int(budget * 1e9) for budget in arena.spin_budgets()), arena.cores, int(CHECK_EVERY_S * 1e9),
                              symmetric_up_to, SINGLE_COPY_FROM, STREAMED_FROM)
        self._core_attached = True
        self._set_core_mode()
        method = weakref.WeakMethod(self._set_core_mode)  # the profiler's listener must not keep the group
        profile.on_start(lambda: (set_mode := method()) and set_mode())

    def _set_core_mode(self) -> None:
        """What the core may run: nothing while a call must come through Python (profiling, an invalid
        SMDDP_ALLREDUCE_ALGO, SageMaker checks that have not yet spoken), all_reduce with SUM only while
        SageMaker's rules apply, else everything it handles."""
        self._core_waits_for_check = False
        try:
            forced_algorithm()
            valid = True
        except CollectiveError:
            valid = False  # every all_reduce goes to Python, which reports it
        if not self._core_attached or profile.recorder() is not None or not valid:
            self._core_mode(0)
        elif not sagemaker_compat.enabled():
            self._core_mode(1)
        elif sagemaker_compat.quiet_for_sum():
            self._core_mode(2)
        else:
            self._core_mode(0)
            self._core_waits_for_check = True

    def _finish_barrier(self, what: str, status: int, generation: int) -> None:
        """The core's call found a peer late or different: wait with the slow path's checks and errors."""
        self._guarded(what, lambda: self._comm.local.arena.finish_barrier(status, generation, what, self._comm.deadline()))

    def _single_copy_refused(self, what: str, error: int) -> None:  # noqa: ARG002 - the core names its call
        """The core's single-copy read was refused on this host: the arena copies through its slots now."""
        self._comm.local.arena.refuse_single_copy(error)

    def _exchange_stalled(self, what: str, node: int, receiving: bool, waited_s: float) -> None:
        """The core's exchange with other hosts still waits on node after a check slice: past the
        deadline, the error of the Python path (the group fails, as there). Signal handlers run here; one
        that raises leaves the connections to the core, which cuts them."""
        deadline = time.monotonic() - waited_s + self._comm.timeout_s
        self._guarded(what, lambda: self._comm.mesh.stalled(what, node, receiving, deadline, waited_s))

    def _exchange_failed(self, what: str, node: int, receiving: bool, error: int) -> None:
        """A transfer of the core's exchange with node failed (error: an errno, or -1: the peer closed)."""
        def fail() -> None:
            raise self._comm.mesh.failure(what, node, error)

        self._guarded(what, fail)

    def _exchange_mismatch(self, what: str, node: int, theirs: bytes, mine: bytes) -> None:
        """The core's exchange received a call header from node that differs from this rank's."""
        def fail() -> None:
            raise self._comm.mesh.mismatch(what, node, theirs, mine)

        self._guarded(what, fail)

    # execution ----------------------------------------------------------------------------------------
    def _submit(self, call: Call, job: Callable[[], None], value: object, opts: object) -> dist.Work:
        self._comm.check_usable(call.op)
        job = profile.wrap(call.op, value, job, self.size())  # SMDDP_PROFILE: sizes and timings (the job itself when off)
        if not getattr(opts, "asyncOp", True) and self._claim_inline():
            try:
                with self._exec:
                    self._execute(call, job)
            finally:
                self._end_job()
            return completed_work(value)
        future: torch.futures.Future = torch.futures.Future()
        self._add_pending()
        self._start_worker()
        self._jobs.put((call, job, value, future))
        return FutureWork(future)

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name=f"smddp-comm-{self.rank()}", daemon=True)
            self._worker.start()
            _SERVING.add(self)

    def _serve(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            call, job, value, future = item
            try:
                with self._exec:
                    self._in_collective = True
                    try:
                        self._execute(call, job)
                    finally:
                        self._in_collective = False
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                future.set_exception(exc)
            else:
                future.set_result(value)  # runs the future's callbacks (DDP's reducer) on this thread
            finally:
                self._end_job()

    def _execute(self, call: Call, job: Callable[[], None]) -> None:
        """The one place every collective runs (in call order): numbered, tagged for the cross-rank check."""
        self._comm.check_usable(call.op)
        self._comm.begin(call)
        self._guarded(call.op, job)

    def _guarded(self, what: str, job: Callable[[], None]) -> None:
        """Run part of a collective; a failure marks the group unusable and tells the peers."""
        try:
            job()
        except CollectiveError as exc:
            self._fail(str(exc))
            raise
        except Exception as exc:
            message = f"smddp {what} failed on rank {self.rank()}: {type(exc).__name__}: {exc}"
            self._fail(message)
            raise CollectiveError(message) from exc

    def _fail(self, message: str) -> None:
        if hasattr(self, "_core_mode"):
            self._core_mode(0)  # every later call goes through Python, which raises the recorded failure
        self._comm.fail(message)

    def _nccl(self) -> dist.ProcessGroup:
        """NCCL for CUDA tensors, created on first use (collectively: every rank reaches the same call)."""
        if self._nccl_group is None:
            if not dist.is_nccl_available():
                raise CollectiveError("smddp: CUDA tensors need NCCL, which this torch build does not include")
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            self._nccl_group = dist.ProcessGroupNCCL(dist.PrefixStore("smddp-nccl/", self._store), self.rank(), self.size(), options)
        return self._nccl_group

    def shutdown(self) -> None:
        self._stop_worker(timeout=5)
        if self._p2p is not None:
            self._p2p.close()
        self._comm.close()

    def _stop_worker(self, timeout: float) -> None:
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout=timeout)
            self._worker = None
        _SERVING.discard(self)

    def abort(self) -> None:
        self._fail("the process group was aborted")
        self.shutdown()

    def _stop_at_exit(self) -> None:
        """Let the worker finish what it is doing unless that is a collective (a peer may never come)."""
        if not self._in_collective:
            self._stop_worker(timeout=30)

    # validation ---------------------------------------------------------------------------------------
    def _reduce_op(self, reduce_op: object, tensors: Sequence[torch.Tensor], what: str) -> RedOpType:
        op = red_op_type(reduce_op)
        for tensor in tensors:
            try:
                check_supported(tensor.dtype, op, what)
            except (TypeError, ValueError) as exc:
                raise CollectiveError(str(exc)) from exc
        return op

    def _rank_list(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        if len(tensors) != self.size():
            raise CollectiveError(f"smddp {what}: expected one tensor per rank ({self.size()}), got {len(tensors)}")

    # monitored barrier -----------------------------------------------------------------------------------
    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier, through the group's store rather than its transports, so that a rank
        that never comes fails the barrier, not the group: rank 0 waits for every other rank, names the
        first (or, wait_all_ranks, every) one missing after timeout, and releases or fails them all.
        Messages as gloo's, which torch's tests match; every value is signed (StoreValues)."""
        timeout = self._timeout if timeout is None else timeout
        self._monitored += 1
        key = f"monitored_barrier/{self._monitored}"
        if self.rank() != 0:
            self._comm.topo.values.set(f"{key}/arrived/{self.rank()}", True)
            verdict = self._signed_value(f"{key}/released", timeout.total_seconds())
            if verdict != "":
                raise CollectiveError(f"Rank {self.rank()} successfully reached monitoredBarrier, but received errors while waiting for "
                                      f"send/recv from rank 0. Please check rank 0 logs for faulty rank. ({verdict or 'no answer in time'})")
            return
        failure = self._missing_from_monitored_barrier(key, timeout, wait_all_ranks)
        self._comm.topo.values.set(f"{key}/released", failure)
        if failure:
            raise CollectiveError(failure)

    def _missing_from_monitored_barrier(self, key: str, timeout: timedelta, wait_all_ranks: bool) -> str:
        """Rank 0's wait for the others: "" when all came, else gloo's error."""
        ms, deadline = int(timeout.total_seconds() * 1000), time.monotonic() + timeout.total_seconds()
        missing = []
        for rank in range(1, self.size()):
            left = deadline - time.monotonic()
            if left <= 0 and not wait_all_ranks:
                return f"Rank 0 timed out in monitoredBarrier after {ms} ms."
            if self._signed_value(f"{key}/arrived/{rank}", max(left, 0.001)) is None:
                missing.append(rank)
                if not wait_all_ranks:
                    return f"[Rank 0]: Rank {rank} failed to pass monitoredBarrier in {ms} ms"
        return f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms" if missing else ""

    def _signed_value(self, key: str, seconds: float) -> object | None:
        """The key's value once a rank of this group has set it, or None after seconds; a value someone
        else wrote raises (StoreValues.forged)."""
        values = self._comm.topo.values
        try:
            values.store.wait([KEY_PREFIX + key], timedelta(seconds=seconds))
        except RuntimeError:  # torch's DistStoreError: not set in time
            return None
        return values.get(key)

    # allreduce ----------------------------------------------------------------------------------------
    @cuda_goes_to_nccl
    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions = None) -> dist.Work:
        opts = opts or dist.AllreduceOptions()
        op = self._reduce_op(opts.reduceOp, tensors, "all_reduce")
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, op, opts)

        def job() -> None:
            for tensor in tensors:
                if self._core_allreduce(tensor, int(op)):
                    continue
                work = _contiguous(tensor)
                self._comm.allreduce(work.view(-1), op, "all_reduce")
                _write_back(tensor, work)

        return self._submit(_call("all_reduce", tensors, op), job, tensors, opts)

    def _sparse_allreduce(self, tensors: list[torch.Tensor], op: RedOpType, opts: object) -> dist.Work:
        """Sparse COO tensors, summed as gloo sums them: every rank's indices and values to all, then
        coalesced; each tensor is replaced in place by the sum (AVG: divided by the group size)."""
        if op not in (RedOpType.SUM, RedOpType.AVG) or not all(t.is_sparse for t in tensors):
            raise CollectiveError(f"smddp all_reduce: sparse tensors reduce with SUM or AVG only, one call for sparse tensors alone (got {op.name})")

        def job() -> None:
            for tensor in tensors:
                total = self._gathered_sparse(tensor.coalesce())
                tensor.copy_(total / self.size() if op == RedOpType.AVG else total)

        return self._submit(_call("all_reduce", tensors, op), job, tensors, opts)

    def _gathered_sparse(self, mine: torch.Tensor) -> torch.Tensor:
        """The coalesced sum of every rank's coalesced sparse tensor: first each rank's number of entries,
        then its indices and values in one buffer, padded to the largest so that every rank sends alike."""
        indices, values = mine.indices().contiguous(), mine.values().contiguous()
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size())]
        self._comm.allgather(as_bytes(torch.tensor([indices.shape[1]])), [as_bytes(c) for c in counts], "all_reduce (sparse)")
        entries = [int(c) for c in counts]
        row = math.prod(values.shape[1:])  # elements per entry (its dense dimensions)
        nbytes = [n * (indices.shape[0] * 8 + row * values.element_size()) for n in entries]
        blobs = [torch.empty(max(1, *nbytes), dtype=torch.uint8) for _ in range(self.size())]
        own = blobs[self.rank()]
        own[: nbytes[self.rank()]] = torch.cat([as_bytes(indices), as_bytes(values)])
        self._comm.allgather(own, blobs, "all_reduce (sparse)")
        parts = [blob[:size].split([n * indices.shape[0] * 8, size - n * indices.shape[0] * 8]) for blob, size, n in zip(blobs, nbytes, entries)]
        all_indices = torch.cat([i.view(torch.int64).view(indices.shape[0], n) for (i, _), n in zip(parts, entries)], dim=1)
        all_values = torch.cat([v.view(values.dtype).view(n, *values.shape[1:]) for (_, v), n in zip(parts, entries)])
        return torch.sparse_coo_tensor(all_indices, all_values, mine.shape).coalesce()

    def shared_buffers(self, nbytes: int) -> list[torch.Tensor] | None:
        """Collective: nbytes per rank in shared memory that the host's ranks all map, for zero-copy
        reductions with allreduce_shared. Returns the host's buffers (uint8, local rank order; this
        rank's is at ``local_index``), or None where the host has no shared memory (one rank, TCP)."""
        result: list[list[torch.Tensor] | None] = []
        self._submit(Call("shared_buffers", count=nbytes), lambda: result.append(self._comm.shared_region(nbytes, "shared_buffers")), [], None).wait()
        return result[0]

    @property
    def local_index(self) -> int:
        return self._comm.local.index

    def shard_range(self, numel: int) -> tuple[int, int]:
        """The elements of a shared tensor of numel that this rank reduces for its host (allreduce_shared)."""
        return shard_bounds(numel, self._comm.local.n, self._comm.local.index)

    def allreduce_shared(self, buffers: Sequence[torch.Tensor], op: object = dist.ReduceOp.AVG,
                         own: Sequence[OwnSource] = ()) -> dist.Work:
        """Asynchronous in-place allreduce of this host's copies of one tensor, each a same-offset slice
        of the buffers from shared_buffers: no staging copies within a host. ``own`` lists parts of this
        rank's shard (``shard_range``) that are still elsewhere: (start, stop, tensor)."""
        red_op = self._reduce_op(op, buffers, "all_reduce")
        job = functools.partial(self._comm.allreduce_shared, buffers, red_op, "all_reduce (shared buffer)", own,
                                self._core_between_hosts)
        return self._submit(_call("all_reduce", [buffers[self.local_index]], red_op), job, [buffers[self.local_index]], None)

    @cuda_goes_to_nccl
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: dist.AllreduceCoalescedOptions = None) -> dist.Work:
        opts = opts or dist.AllreduceCoalescedOptions()
        op = self._reduce_op(opts.reduceOp, tensors, "all_reduce_coalesced")

        def job() -> None:
            for dtype in dict.fromkeys(t.dtype for t in tensors):
                group = [t for t in tensors if t.dtype == dtype]
                flat = torch.cat([t.reshape(-1) for t in group])
                self._comm.allreduce(flat, op, "all_reduce_coalesced")
                for tensor, part in zip(group, flat.split([t.numel() for t in group])):
                    tensor.copy_(part.view(tensor.shape))

        return self._submit(_call("all_reduce_coalesced", tensors, op), job, tensors, opts)

    @cuda_goes_to_nccl
    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions = None) -> dist.Work:
        opts = opts or dist.ReduceOptions()
        op = self._reduce_op(opts.reduceOp, tensors, "reduce")
        is_root = opts.rootRank == self.rank()

        def job() -> None:
            self._comm.check_between_hosts("reduce")
            for tensor in tensors:
                work = _contiguous(tensor) if is_root else tensor.contiguous().clone()
                self._comm.allreduce(work.view(-1), op, "reduce")
                if is_root:
                    _write_back(tensor, work)

        return self._submit(_call("reduce", tensors, op, opts.rootRank), job, tensors, opts)

    # broadcast / scatter ------------------------------------------------------------------------------
    @cuda_goes_to_nccl
    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions = None) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank

        def job() -> None:
            works = [_contiguous(t) for t in tensors]
            self._comm.broadcast(root, [as_bytes(w) for w in works], "broadcast")
            for tensor, work in zip(tensors, works):
                _write_back(tensor, work)

        return self._submit(_call("broadcast", tensors, root=root), job, tensors, opts)

    @cuda_goes_to_nccl
    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: dist.ScatterOptions = None) -> dist.Work:
        opts = opts or dist.ScatterOptions()
        root, out = opts.rootRank, output_tensors[0]
        if self.rank() == root:
            self._rank_list(input_tensors[0], "scatter")

        def job() -> None:
            if self.rank() == root:
                whole = torch.cat([t.reshape(-1) for t in input_tensors[0]])
            else:
                whole = torch.empty(out.numel() * self.size(), dtype=out.dtype)
            self._comm.broadcast(root, [as_bytes(whole)], "scatter")
            out.copy_(whole.view(self.size(), -1)[self.rank()].view(out.shape))

        return self._submit(_call("scatter", output_tensors, root=root), job, output_tensors, opts)

    # allgather / gather -------------------------------------------------------------------------------
    def _gather_into(self, outs: Sequence[torch.Tensor], tensor: torch.Tensor, what: str) -> None:
        works = [_contiguous(o) for o in outs]
        self._comm.allgather(as_bytes(_contiguous(tensor)), [as_bytes(w) for w in works], what)
        for out, work in zip(outs, works):
            _write_back(out, work)

    @cuda_goes_to_nccl
    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: dist.AllgatherOptions = None) -> dist.Work:
        opts = opts or dist.AllgatherOptions()
        for outs in output_tensors:
            self._rank_list(outs, "all_gather")

        def job() -> None:
            for outs, tensor in zip(output_tensors, input_tensors):
                self._gather_into(outs, tensor, "all_gather")

        return self._submit(_call("all_gather", input_tensors), job, output_tensors, opts)

    @cuda_goes_to_nccl
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: dist.AllgatherOptions = None) -> dist.Work:
        opts = opts or dist.AllgatherOptions()

        def job() -> None:
            mine = torch.cat([t.reshape(-1).view(torch.uint8) for t in map(_contiguous, input_list)]) if input_list else torch.empty(0, dtype=torch.uint8)
            blobs = [torch.empty_like(mine) for _ in range(self.size())]
            self._comm.allgather(mine, blobs, "all_gather_coalesced")
            sizes = [t.numel() * t.element_size() for t in input_list]
            for outs, blob in zip(output_lists, blobs):
                for out, part in zip(outs, blob.split(sizes)):
                    out.copy_(part.view(out.dtype).view(out.shape))

        return self._submit(_call("all_gather_coalesced", input_list), job, output_lists, opts)

    def _gather_single(self, output: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
        if output.numel() != tensor.numel() * self.size():
            raise CollectiveError(f"smddp {what}: output has {output.numel()} elements, expected {self.size()} x {tensor.numel()}")
        work = _contiguous(output)
        parts = list(as_bytes(work).chunk(self.size())) if work.numel() else [as_bytes(work)] * self.size()
        self._comm.allgather(as_bytes(_contiguous(tensor)), parts, what)
        _write_back(output, work)

    @cuda_goes_to_nccl
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: dist.AllgatherOptions = None) -> dist.Work:  # noqa: A002
        opts = opts or dist.AllgatherOptions()
        if output.numel() != input.numel() * self.size():
            raise CollectiveError(f"smddp all_gather_into_tensor: output has {output.numel()} elements, expected {self.size()} x {input.numel()}")
        return self._submit(_call("all_gather_into_tensor", [input]), lambda: self._gather_single(output, input, "all_gather_into_tensor"), [output], opts)

    _allgather_base = all_gather_single

    @cuda_goes_to_nccl
    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.AllgatherOptions = None) -> dist.Work:
        opts = opts or dist.AllgatherOptions()

        def job() -> None:
            for output, tensor in zip(outputs, inputs):
                self._gather_single(output, tensor, "all_gather_into_tensor_coalesced")

        return self._submit(_call("all_gather_into_tensor_coalesced", inputs), job, outputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @cuda_goes_to_nccl
    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: dist.GatherOptions = None) -> dist.Work:
        opts = opts or dist.GatherOptions()
        is_root = opts.rootRank == self.rank()
        tensor = input_tensors[0]
        if is_root:
            self._rank_list(output_tensors[0], "gather")

        def job() -> None:
            self._comm.check_between_hosts("gather")
            outs = output_tensors[0] if is_root else [torch.empty_like(tensor) for _ in range(self.size())]
            self._gather_into(outs, tensor, "gather")

        return self._submit(_call("gather", input_tensors, root=opts.rootRank), job, output_tensors, opts)

    # reduce_scatter -----------------------------------------------------------------------------------
    def _reduce_scatter_flat(self, output: torch.Tensor, flat: torch.Tensor, counts: list[int], op: RedOpType, what: str) -> None:
        if len(set(counts)) == 1:
            work = _contiguous(output)
            self._comm.reduce_scatter(flat, work.view(-1), op, what)
            _write_back(output, work)
            return
        self._comm.allreduce(flat, op, what)  # uneven segments: reduce everything, keep ours
        start = sum(counts[: self.rank()])
        output.copy_(flat[start:start + counts[self.rank()]].view(output.shape))

    @cuda_goes_to_nccl
    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: dist.ReduceScatterOptions = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        op = self._reduce_op(opts.reduceOp, output_tensors, "reduce_scatter")
        for ins in input_tensors:
            self._rank_list(ins, "reduce_scatter")

        def job() -> None:
            for output, ins in zip(output_tensors, input_tensors):
                flat = torch.cat([t.reshape(-1) for t in ins])
                self._reduce_scatter_flat(output, flat, [t.numel() for t in ins], op, "reduce_scatter")

        # the record counts the inputs, the same on every rank; outputs may differ in size (uneven segments)
        return self._submit(_call("reduce_scatter", [t for ins in input_tensors for t in ins], op), job, output_tensors, opts)

    def _reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, op: RedOpType, what: str) -> None:
        if tensor.numel() != output.numel() * self.size():
            raise CollectiveError(f"smddp {what}: input has {tensor.numel()} elements, expected {self.size()} x {output.numel()}")
        flat = _contiguous(tensor).view(-1)  # read-only on one host; copied below where it would be clobbered
        if self._comm.multi_node:
            flat = flat.clone()
        self._reduce_scatter_flat(output, flat, [output.numel()] * self.size(), op, what)

    @cuda_goes_to_nccl
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: dist.ReduceScatterOptions = None) -> dist.Work:  # noqa: A002
        opts = opts or dist.ReduceScatterOptions()
        op = self._reduce_op(opts.reduceOp, [input], "reduce_scatter_tensor")
        if input.numel() != output.numel() * self.size():
            raise CollectiveError(f"smddp reduce_scatter_tensor: input has {input.numel()} elements, expected {self.size()} x {output.numel()}")
        return self._submit(_call("reduce_scatter_tensor", [output], op), lambda: self._reduce_scatter_single(output, input, op, "reduce_scatter_tensor"), [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    @cuda_goes_to_nccl
    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: dist.ReduceScatterOptions = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        op = self._reduce_op(opts.reduceOp, inputs, "reduce_scatter_tensor_coalesced")

        def job() -> None:
            for output, tensor in zip(outputs, inputs):
                self._reduce_scatter_single(output, tensor, op, "reduce_scatter_tensor_coalesced")

        return self._submit(_call("reduce_scatter_tensor_coalesced", outputs, op), job, outputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # all-to-all ---------------------------------------------------------------------------------------
    def _all_to_all(self, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], what: str) -> None:
        """Every rank's sizes (what it sends to each rank, what it expects from each) to all, so that every
        rank checks every pair alike; then the bytes (Communicator.all_to_all)."""
        size = self.size()
        sizes = torch.tensor([t.numel() * t.element_size() for t in (*ins, *outs)], dtype=torch.int64)
        rows = [torch.empty_like(sizes) for _ in range(size)]
        self._comm.allgather(as_bytes(sizes), [as_bytes(row) for row in rows], what)
        table = torch.stack(rows).tolist()
        for source, target in ((s, t) for s in range(size) for t in range(size)):
            if table[source][target] != table[target][size + source]:
                self._all_to_all_mismatch(what, source, target, table[source][target], table[target][size + source])
        works = [_contiguous(o) for o in outs]
        self._comm.all_to_all([row[:size] for row in table], [as_bytes(_contiguous(t)) for t in ins], [as_bytes(w) for w in works], what)
        for out, work in zip(outs, works):
            _write_back(out, work)

    def _all_to_all_mismatch(self, what: str, source: int, target: int, sent: int, expected: int) -> None:
        """An all_to_all whose ranks disagree on a size fails the group on every rank alike (the core's too)."""
        def fail() -> None:
            raise CollectiveError(f"smddp {what}: rank {source} sends {sent} bytes to rank {target}, which expects {expected}; "
                                  "every rank's output split sizes must match what the other ranks send it")

        self._guarded(what, fail)

    @cuda_goes_to_nccl
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: dist.AllToAllOptions = None) -> dist.Work:
        opts = opts or dist.AllToAllOptions()
        self._rank_list(output_tensors, "all_to_all")
        self._rank_list(input_tensors, "all_to_all")
        return self._submit(Call("all_to_all"), lambda: self._all_to_all(output_tensors, input_tensors, "all_to_all"), output_tensors, opts)

    @cuda_goes_to_nccl
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], opts: dist.AllToAllOptions = None) -> dist.Work:  # noqa: A002
        opts = opts or dist.AllToAllOptions()
        outs = list(output.split(_split_sizes(output_split_sizes, output, self.size(), "all_to_all_single")))
        ins = list(input.split(_split_sizes(input_split_sizes, input, self.size(), "all_to_all_single")))

        return self._submit(Call("all_to_all_single"), lambda: self._all_to_all(outs, ins, "all_to_all_single"), [output], opts)

    alltoall_base = all_to_all_single

    # barrier and point-to-point -----------------------------------------------------------------------
    def barrier(self, opts: dist.BarrierOptions = None) -> dist.Work:
        opts = opts or dist.BarrierOptions()
        return self._submit(_BARRIER_CALL, lambda: self._comm.barrier("barrier"), [], opts)

    # point-to-point (p2p.py) ------------------------------------------------------------------------
    def _point_to_point(self, what: str, tensors: Sequence[torch.Tensor], peer: int) -> PointToPoint:
        """The group's point-to-point engine, made on first use; checks what torch leaves to the backend."""
        self._comm.check_usable(what)
        if len(tensors) != 1:
            raise CollectiveError(f"smddp {what}: expected one tensor, got {len(tensors)}")
        if not 0 <= peer < self.size() and peer != ANY_SOURCE:
            raise CollectiveError(f"smddp {what}: rank {peer} is not in this group of {self.size()} ranks")
        with _P2P_SETUP:
            if self._p2p is None:
                topo = self._comm.topo
                self._p2p = PointToPoint(topo, topo.values, topo.pids, self._comm.timeout_s, self._fail)
        return self._p2p

    @cuda_goes_to_nccl
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:  # noqa: N803 - torch's names
        return self._point_to_point("send", tensors, dstRank).send(tensors[0], dstRank, tag)

    @cuda_goes_to_nccl
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:  # noqa: N803
        return self._point_to_point("recv", tensors, srcRank).recv(tensors[0], srcRank, tag)

    # the core's fast path for a send or receive over a ring (p2p.py's fast_send, fast_recv)
    def _fast_engine(self, peer: int) -> PointToPoint | None:
        usable = self._p2p is not None and not self._comm._failure and 0 <= peer < self.size()
        return self._p2p if usable else None

    def _p2p_fast_send(self, tensor: torch.Tensor, dst: int, tag: int) -> tuple[int, int, bytes] | None:
        engine = self._fast_engine(dst)
        return engine.fast_send(tensor, dst, tag) if engine is not None else None

    def _p2p_fast_recv(self, tensor: torch.Tensor, src: int, tag: int) -> tuple[int, int, bytes, float, Callable[[bool], None]] | None:
        engine = self._fast_engine(src)
        return engine.fast_recv(tensor, src, tag) if engine is not None else None

    @cuda_goes_to_nccl
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        return self._point_to_point("recv", tensors, ANY_SOURCE).recv(tensors[0], ANY_SOURCE, tag)


def group_generation(environ: Mapping[str, str] | None = None) -> int:
    """Which re-formation of the job's group a new rank joins (GROUP_GENERATION_ENV; 0: the first)."""
    raw = (os.environ if environ is None else environ).get(GROUP_GENERATION_ENV, "0")
    if not raw.isdigit():
        raise CollectiveError(f"{GROUP_GENERATION_ENV}={raw!r} must be a number (the supervisor sets it for a replaced host)")
    return int(raw)


def smddp_backend(group: dist.ProcessGroup | None) -> SmddpProcessGroup | None:
    """The smddp implementation behind a group (None: another backend)."""
    group = group or dist.group.WORLD
    if isinstance(group, SmddpProcessGroup):
        return group
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    return backend if isinstance(backend, SmddpProcessGroup) else None


def install_monitored_barrier() -> None:
    """Make ``dist.monitored_barrier`` run SmddpProcessGroup.monitored_barrier on an smddp group: torch
    refuses every backend but gloo by name before it reaches the group. Other groups keep torch's."""
    original = dist.distributed_c10d.monitored_barrier
    if getattr(original, "smddp", False):
        return

    @functools.wraps(original)
    def monitored_barrier(group: dist.ProcessGroup | None = None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
        backend = None if dist.distributed_c10d._rank_not_in_group(group) else smddp_backend(group)
        if backend is None:
            return original(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)  # torch converts seconds too (with a warning)
        return backend.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.smddp = True
    dist.distributed_c10d.monitored_barrier = dist.monitored_barrier = monitored_barrier


@atexit.register
def _stop_workers_at_exit() -> None:
    """A script that never calls destroy_process_group (most SageMaker examples) must not leave the daemon
    worker running torch code, such as the callbacks of the future it just completed, into interpreter
    shutdown: the thread is then killed inside C++ and the process aborts ("terminate called without an
    active exception") after the script's last line."""
    for group in list(_SERVING):
        group._stop_at_exit()


class PythonProcessGroup(SmddpProcessGroup, dist.ProcessGroup):
    """The group without the native core: every call runs the Python methods."""

    def __init__(self, *args: Any) -> None:
        self._state = threading.Lock()  # guards _pending, the calls queued or running
        self._pending = 0
        super().__init__(*args)

    def _claim_inline(self) -> bool:
        """Run the caller's call on its own thread: only when nothing is queued (call order)."""
        with self._state:
            if self._pending:
                return False
            self._pending = 1
            return True

    def _add_pending(self) -> None:
        with self._state:
            self._pending += 1

    def _end_job(self) -> None:
        with self._state:
            self._pending -= 1

    def _core_allreduce(self, tensor: torch.Tensor, op: int) -> bool:
        return False  # no core: the Python path runs every all_reduce

    def _core_between_hosts(self, tensor: torch.Tensor, op: int) -> bool:
        return False  # no core: the Python path runs the step between hosts


# Collectives the core may run itself; it calls `_python_<name>` for what it leaves to Python.
CORE_METHODS = ("allreduce", "reduce", "broadcast", "scatter", "allgather", "all_gather_single", "gather", "reduce_scatter",
                "reduce_scatter_single", "alltoall", "all_to_all_single", "barrier", "send", "recv")


@functools.cache
def group_class() -> type:
    """The group's class: on the native core when it loads (native.core()), else PythonProcessGroup."""
    core = native.core()
    if core is None:
        return PythonProcessGroup
    routed: dict[str, object] = {name: getattr(core, name) for name in CORE_METHODS}
    routed.update({f"_python_{name}": getattr(SmddpProcessGroup, name) for name in CORE_METHODS})
    for alias in ("_allgather_base", "_reduce_scatter_base", "alltoall_base"):  # torch's deprecated names, aliases in C++
        if hasattr(core, alias):
            routed[alias] = getattr(core, alias)
    routed["__doc__"] = SmddpProcessGroup.__doc__
    return type(core)("CoreProcessGroup", (SmddpProcessGroup, core), routed)
