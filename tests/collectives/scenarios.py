"""Whole-program scenarios run by worker.py in every rank; each reports to the test through the store.

Reports go through the test's TCPStore, never through the backend under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from smddp_sdk.collectives.ddp import DistributedDataParallel
from smddp_sdk.collectives.memory import memview

STEPS = 5
GLOBAL_BATCH = 16


def _report(store: dist.TCPStore, name: str, value: object) -> None:
    store.set(f"report/{name}/{dist.get_rank()}", json.dumps(value))


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL_BATCH, 16, generator=gen), torch.randn(GLOBAL_BATCH, 4, generator=gen)) for _ in range(STEPS)]


def _train(model: nn.Module, batches, shard: slice | None, set_to_none: bool = True) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        if shard is not None:
            x, y = x[shard], y[shard]
        opt.zero_grad(set_to_none=set_to_none)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(memview(p.detach().contiguous()))
    return h.hexdigest()


def ddp(store: dist.TCPStore) -> None:
    """DDP over smddp for some steps == single-process training on the same global batch."""
    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.001)  # several buckets
    _train(model, _batches(), slice(rank * per_rank, (rank + 1) * per_rank))
    reference = _model()
    _train(reference, _batches(), None)
    diff = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), reference.parameters()))
    _report(store, "ddp", {"digest": _digest(model.module), "max_diff": diff})


def fsdp2(store: dist.TCPStore) -> None:
    """FSDP2 fully_shard on CPU over smddp trains and matches single-process training."""
    from torch.distributed.fsdp import fully_shard

    rank, size = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // size
    model = _model()
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    losses = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[rank * per_rank : (rank + 1) * per_rank]), y[rank * per_rank : (rank + 1) * per_rank])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    full = [p.full_tensor() for p in model.parameters()]  # DTensor -> all_gather_single_coalesced
    reference = _model()
    _train(reference, _batches(), None)
    diff = max((a - b).abs().max().item() for a, b in zip(full, reference.parameters()))
    moved = max((a - b).abs().max().item() for a, b in zip(full, _model().parameters()))
    _report(store, "fsdp2", {"max_diff": diff, "moved": moved, "losses": losses})
    dist.destroy_process_group()


def ddp_then_fsdp2(store: dist.TCPStore) -> None:
    """Both training scenarios in one group (one process start-up instead of two)."""
    ddp(store)
    fsdp2(store)


def killed_rank(store: dist.TCPStore) -> None:
    """The victim rank SIGKILLs itself mid-job; the others must fail with a clear error, not hang.

    SMDDP_TEST_FAILING_CALL picks what the survivors run: a blocking all_reduce, an async one they wait
    on, or a backward pass of smddp's DistributedDataParallel."""
    victim = int(os.environ["SMDDP_TEST_VICTIM"])
    call = os.environ.get("SMDDP_TEST_FAILING_CALL", "blocking")
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    model = DistributedDataParallel(nn.Linear(300, 300)) if call == "smddp_ddp" else None
    store.set(f"mapped-all/{dist.get_rank()}", "1")
    if dist.get_rank() == victim:
        store.wait([f"mapped-all/{r}" for r in range(dist.get_world_size())])
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # the victim is gone by now
    calls = {
        "blocking": lambda: dist.all_reduce(torch.ones(100_000)),
        "async": lambda: dist.all_reduce(torch.ones(100_000), async_op=True).wait(),
        "smddp_ddp": lambda: model(torch.ones(4, 300)).sum().backward(),
    }
    _expect_failure(store, "killed", calls[call])


def hung_rank(store: dist.TCPStore) -> None:
    """The victim never joins the collective (SMDDP_TEST_FAILING_CALL: broadcast or all_reduce); the
    others hit the process-group timeout."""
    victim = int(os.environ["SMDDP_TEST_VICTIM"])
    if dist.get_rank() == victim:
        store.wait(["hung/release"])  # stays alive, never calls the collective
        os._exit(0)
    calls = {"broadcast": lambda: dist.broadcast(torch.ones(10), src=0), "all_reduce": lambda: dist.all_reduce(torch.ones(10))}
    _expect_failure(store, "hung", calls[os.environ.get("SMDDP_TEST_FAILING_CALL", "broadcast")])


def _expect_failure(store: dist.TCPStore, name: str, collective) -> None:
    start = time.monotonic()
    try:
        collective()
    except RuntimeError as exc:
        _report(store, name, {"error": str(exc), "type": type(exc).__name__, "elapsed": time.monotonic() - start})
        os._exit(1)
    _report(store, name, {"error": None, "elapsed": time.monotonic() - start})
    os._exit(0)


def mismatch(store: dist.TCPStore) -> None:
    """Rank 1 calls all_reduce with float64 where the others use float32: every rank must raise."""
    dist.all_reduce(torch.ones(10))  # agree once first, so the sequence numbers are past the start
    dtype = torch.float64 if dist.get_rank() == 1 else torch.float32
    _expect_failure(store, "mismatch", lambda: dist.all_reduce(torch.ones(1000, dtype=dtype)))


MISMATCH_COUNT = 16384


def _mismatched_call(kind: str) -> None:
    """What the last host calls where the others call all_reduce(SUM, float32, MISMATCH_COUNT)."""
    x = torch.ones(MISMATCH_COUNT)
    if kind == "reduce_op":
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    elif kind == "dtype":
        dist.all_reduce(x.int())
    elif kind == "size":
        dist.all_reduce(torch.ones(2 * MISMATCH_COUNT))
    elif kind == "op":
        dist.all_gather([torch.empty(MISMATCH_COUNT) for _ in range(dist.get_world_size())], x)
    elif kind == "count":
        dist.destroy_process_group()  # this host has run one collective fewer: it is done
        os._exit(0)
    else:
        raise ValueError(f"unknown SMDDP_TEST_MISMATCH {kind!r}")


def mismatch_between_hosts(store: dist.TCPStore) -> None:
    """The last host's ranks call another collective than the others (SMDDP_TEST_MISMATCH says how)."""
    dist.all_reduce(torch.ones(10))  # agree once first, so the sequence numbers are past the start
    last_host = os.environ["SM_CURRENT_HOST"] == os.environ["SMDDP_TEST_LAST_HOST"]
    kind = os.environ["SMDDP_TEST_MISMATCH"]
    _expect_failure(store, "mismatch", lambda: _mismatched_call(kind) if last_host else dist.all_reduce(torch.ones(MISMATCH_COUNT)))


def hung_after_a_call(store: dist.TCPStore) -> None:
    """The victim does one all_reduce, then never joins the next collective (hang warnings name it)."""
    dist.all_reduce(torch.ones(7))
    hung_rank(store)


def core_usage(store: dist.TCPStore) -> None:
    """Small blocking collectives on one host (reduce, scatter and gather to and from rank 1 too), one of them
    with a peer 0.3 s late (past the native core's 50 ms check slice, so Python finishes the wait); reports
    the group class and the core's call count."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((100,), float(rank + 1))
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(0.3)
    late = torch.full((100,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    outs = [torch.empty(3) for _ in range(size)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    dist.barrier()
    reduced = torch.full((5,), float(rank + 1))
    dist.reduce(reduced, dst=1)
    mine = torch.empty(4)
    dist.scatter(mine, [torch.full((4,), float(r)) for r in range(size)] if rank == 1 else None, src=1)
    gathered = [torch.empty(2) for _ in range(size)]
    dist.gather(torch.full((2,), float(rank)), gathered if rank == 1 else None, dst=1)
    right = [(x == size * (size + 1) / 2).all(), (late == size).all(), *((o == i).all() for i, o in enumerate(outs)),
             (reduced == (size * (size + 1) / 2 if rank == 1 else rank + 1)).all(), (mine == rank).all(),
             *((g == i).all() for i, g in enumerate(gathered) if rank == 1)]
    group = dist.group.WORLD
    calls = group._core_calls() if hasattr(group, "_core_calls") else None
    _report(store, "core", {"class": type(group).__name__, "core_calls": calls, "right": bool(all(right))})


# (elements, dtype, op) chosen to take each inter-host algorithm (selection.allreduce_algorithm): with 3 hosts
# oneshot, sharded (its pipeline in several chunks with SMDDP_PIPELINE_CHUNK_BYTES=65536, exchanges in
# permutation rounds from 64 KB per peer) and the ring; with 4 hosts oneshot, recursive_doubling, sharded and
# halving_doubling; with 8 oneshot, sharded and halving_doubling; odd counts leave uneven shards; fp16 and bf16
# sums cross hosts in fp32 and are rounded once; AVG is that sum divided once by the group size before the
# rounding (integers: floor division)
ACROSS_HOSTS_CASES = [(1000, "float32", "SUM"), (15_000, "float32", "SUM"), (30_001, "float32", "SUM"), (100_003, "float64", "MAX"),
                      (400_001, "float32", "SUM"), (70_000, "int64", "PRODUCT"), (5000, "float16", "SUM"), (70_001, "bfloat16", "SUM"),
                      (30_001, "float32", "AVG"), (20_000, "bfloat16", "AVG"), (3001, "float16", "AVG"), (1000, "int64", "AVG")]
# (elements per rank, dtype, into one tensor?): all-to-all, in permutation rounds (>= 64 KB per peer) or bruck
# (from 4 hosts), the ring
ACROSS_HOSTS_GATHERS = [(100, "float32", True), (20_000, "int32", True), (300_001, "float32", False)]
# the other collectives across hosts: reduce to the last rank (float32 SUM) and to rank 1 (bf16 AVG, rounded
# once), scatter from rank 1 (large: scatter + all_gather between 3 hosts) and from the last rank, gather to
# rank 1 and to the last rank (large: the ring), broadcast from the last rank and from rank 1 (a binomial tree;
# from 5 hosts at 120 KB and from 3 at 1.2 MB scatter + all_gather), reduce_scatter_tensor and reduce_scatter
# (a list of inputs, even or rank r's part of count + 7r elements) of so many elements per rank,
# all_to_all_single and all_to_all with uneven parts (some empty), barrier
ROOTED = ("reduce_to_last", "reduce_avg_to_1", "scatter_from_1", "scatter_from_last", "gather_to_1", "gather_to_last")
ACROSS_HOSTS_OTHERS = [("reduce_to_last", 30_001), ("reduce_avg_to_1", 20_001), ("scatter_from_1", 300_001), ("scatter_from_last", 3_001),
                       ("gather_to_1", 2_001), ("gather_to_last", 300_001), ("broadcast", 30_000), ("broadcast_from_1", 300_001), ("reduce_scatter_tensor", 20_001),
                       ("reduce_scatter", 5_001), ("reduce_scatter_uneven", 5_001), ("reduce_scatter_tensor_avg", 10_001),
                       ("all_to_all_single", 20_000), ("all_to_all", 3), ("barrier", 0), ("all_to_all_mismatch", 3)]  # the last: it fails the group


def _seeded(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + count)
    if dtype == torch.int64:
        return torch.randint(1, 3, (count,), generator=gen)
    return torch.randn(count, generator=gen, dtype=torch.float64).to(dtype)


def _tensor_digest(x: torch.Tensor) -> str:
    return hashlib.sha256(memview(x)).hexdigest()


def _all_to_all(op: str, count: int) -> bool:
    """Rank s sends rank d count * ((s + 2d) % 3) + d elements that name both (rank 0 sends itself none)."""
    rank, size = dist.get_rank(), dist.get_world_size()

    def part(source: int, target: int) -> torch.Tensor:
        return torch.arange(count * ((source + 2 * target) % 3) + target, dtype=torch.float32).add(1000 * source + target)

    ins, expected = [part(rank, d) for d in range(size)], [part(s, rank) for s in range(size)]
    splits = [e.numel() for e in expected]
    if op == "all_to_all_mismatch":  # rank 0 expects an element too many from the last rank: every rank fails alike
        if rank == 0:
            splits[-1] += 1
        try:
            dist.all_to_all_single(torch.empty(sum(splits)), torch.cat(ins), splits, [i.numel() for i in ins])
        except RuntimeError as exc:
            sent = 4 * part(size - 1, 0).numel()
            return f"rank {size - 1} sends {sent} bytes to rank 0, which expects {sent + 4}" in str(exc)
        return False
    if op == "all_to_all_single":
        out = torch.empty(sum(splits))
        dist.all_to_all_single(out, torch.cat(ins), splits, [i.numel() for i in ins])
        return torch.equal(out, torch.cat(expected))
    outs = [torch.empty_like(e) for e in expected]
    dist.all_to_all(outs, ins)
    return all(torch.equal(o, e) for o, e in zip(outs, expected))


def _rooted(op: str, count: int) -> dict:
    """reduce, scatter or gather to or from rank 1 or the last rank: the root's result against a reference,
    every other rank's input untouched; a reduce's result is broadcast for the digest (the same bits everywhere)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    root = 1 if op.endswith("_1") else size - 1
    if op.startswith("reduce"):
        dtype, red = (torch.bfloat16, dist.ReduceOp.AVG) if "avg" in op else (torch.float32, dist.ReduceOp.SUM)
        x = _seeded(rank, count, dtype)
        dist.reduce(x, dst=root, op=red)
        every = torch.stack([_seeded(r, count, dtype).double() for r in range(size)])
        reference = every.mean(0) if "avg" in op else every.sum(0)
        right = bool(torch.allclose(x.double(), reference, rtol=1e-2, atol=1e-2)) if rank == root else torch.equal(x, _seeded(rank, count, dtype))
        dist.broadcast(x, src=root)
        return {"close": right, "digest": _tensor_digest(x), "calls": 2}
    parts = [torch.arange(count, dtype=torch.float64).mul(size).add(r).to(torch.int32 if op == "gather_to_last" else torch.float32) for r in range(size)]
    if op.startswith("scatter"):
        out = torch.empty(count)
        dist.scatter(out, parts if rank == root else None, src=root)
        return {"close": torch.equal(out, parts[rank]), "digest": ""}
    outs = [torch.empty_like(parts[0]) for _ in range(size)] if rank == root else None
    mine = parts[rank].clone()
    dist.gather(mine, outs, dst=root)
    return {"close": all(torch.equal(o, p) for o, p in zip(outs, parts)) if rank == root else torch.equal(mine, parts[rank]), "digest": ""}


def _other_across_hosts(op: str, count: int) -> dict:
    rank, size = dist.get_rank(), dist.get_world_size()
    if op in ROOTED:
        return _rooted(op, count)
    if op.startswith("broadcast"):
        root = 1 if op == "broadcast_from_1" else size - 1
        x = _seeded(rank, count, torch.float32)
        dist.broadcast(x, src=root)
        return {"close": torch.equal(x, _seeded(root, count, torch.float32)), "digest": _tensor_digest(x)}
    if op.startswith("all_to_all"):
        return {"close": _all_to_all(op, count), "digest": ""}
    if op in ("reduce_scatter_tensor", "reduce_scatter"):
        out, whole = torch.empty(count, dtype=torch.float32), _seeded(rank, count * size, torch.float32)
        if op == "reduce_scatter":
            dist.reduce_scatter(out, list(whole.chunk(size)))
        else:
            dist.reduce_scatter_tensor(out, whole)
        reference = torch.stack([_seeded(r, count * size, torch.float32).double() for r in range(size)]).sum(0)
        return {"close": bool(torch.allclose(out.double(), reference[rank * count:(rank + 1) * count], rtol=1e-5, atol=1e-4)), "digest": ""}
    if op == "reduce_scatter_uneven":  # rank r's segment has count + 7r elements: the ranks' outputs differ in size
        parts = [_seeded(rank * size + r, count + 7 * r, torch.float32) for r in range(size)]
        out = torch.empty(count + 7 * rank)
        dist.reduce_scatter(out, parts)
        reference = torch.stack([_seeded(r * size + rank, count + 7 * rank, torch.float32).double() for r in range(size)]).sum(0)
        return {"close": bool(torch.allclose(out.double(), reference, rtol=1e-5, atol=1e-4)), "digest": ""}
    if op == "reduce_scatter_tensor_avg":  # bf16, divided where it is rounded; every rank's part gathered for the digest
        out = torch.empty(count, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, _seeded(rank, count * size, torch.bfloat16), op=dist.ReduceOp.AVG)
        whole = torch.empty(count * size, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(whole, out)
        reference = torch.stack([_seeded(r, count * size, torch.bfloat16).double() for r in range(size)]).mean(0)
        return {"close": bool(torch.allclose(whole.double(), reference, rtol=1e-2, atol=1e-2)), "digest": _tensor_digest(whole), "calls": 2}
    dist.barrier()
    return {"close": True, "digest": ""}


def allreduce_across_hosts(store: dist.TCPStore) -> None:
    """all_reduce (AVG too) and all_gather across hosts by every algorithm, then reduce, scatter, gather,
    broadcast, reduce_scatter, all_to_all and barrier: each result against a reference, plus a digest of each
    all_reduce's, reduce's and broadcast's bytes (every rank must hold the same bits, whichever path each rank
    took), the calls made and the core's count."""
    rank = dist.get_rank()
    results = []
    for count, dtype_name, op_name in ACROSS_HOSTS_CASES:
        dtype, op = getattr(torch, dtype_name), getattr(dist.ReduceOp, op_name)
        x = _seeded(rank, count, dtype)
        dist.all_reduce(x, op=op)
        every = torch.stack([_seeded(r, count, dtype).double() for r in range(dist.get_world_size())])
        reference = {"SUM": every.sum(0), "MAX": every.amax(0), "PRODUCT": every.prod(0),
                     "AVG": every.sum(0).div(len(every), rounding_mode=None if dtype.is_floating_point else "floor")}[op_name]
        rtol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
        results.append({"close": bool(torch.allclose(x.double(), reference, rtol=rtol, atol=1e-4)), "digest": _tensor_digest(x)})
    for count, dtype_name, into_tensor in ACROSS_HOSTS_GATHERS:
        dtype, size = getattr(torch, dtype_name), dist.get_world_size()
        parts = [torch.arange(count, dtype=torch.float64).mul(size).add(r).to(dtype) for r in range(size)]
        if into_tensor:
            out = torch.empty(count * size, dtype=dtype)
            dist.all_gather_into_tensor(out, parts[rank])
            right = torch.equal(out, torch.cat(parts))
        else:
            outs = [torch.empty(count, dtype=dtype) for _ in range(size)]
            dist.all_gather(outs, parts[rank])
            right = all(torch.equal(o, p) for o, p in zip(outs, parts))
        results.append({"close": right, "digest": ""})
    results += [_other_across_hosts(op, count) for op, count in ACROSS_HOSTS_OTHERS]
    group = dist.group.WORLD
    calls = sum(result.pop("calls", 1) for result in results)
    _report(store, "across", {"results": results, "calls": calls, "core_calls": group._core_calls() if hasattr(group, "_core_calls") else None})


def sagemaker_check_across_hosts(store: dist.TCPStore) -> None:
    """Under SageMaker's check the core runs SUM reductions unasked, but reduce, gather, scatter and
    all_to_all (which AWS's SMDDP lacks) still come through Python, which names each call site."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.ones(8)
    dist.all_reduce(x)  # rank 0's note on CPU tensors: from here on the core may run SUM reductions
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.reduce(x, dst=1)
        dist.gather(x, [torch.empty(8) for _ in range(size)] if rank == 0 else None, dst=0)
        dist.scatter(x, [torch.ones(8)] * size if rank == 1 else None, src=1)
        dist.all_to_all_single(torch.empty(8), torch.ones(8))
    _report(store, "sagemaker", sorted(str(w.message).split(":")[0] for w in caught if type(w.message).__name__ == "SageMakerCompatibilityWarning"))


def interrupted_between_hosts(store: dist.TCPStore) -> None:
    """Rank 0 waits in an all_reduce that the other host never joins; a signal handler raises
    KeyboardInterrupt 0.3 s in: it must surface then (not at the timeout), and the group must refuse the
    next call instead of reusing connections left mid-message."""
    if dist.get_rank() != 0:
        store.wait(["interrupted/release"])
        os._exit(0)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
        interrupted = None
    except KeyboardInterrupt:
        interrupted = time.monotonic() - start
    try:
        dist.all_reduce(torch.ones(10))
        after = None
    except RuntimeError as exc:
        after = str(exc)
    _report(store, "interrupted", {"interrupted_after": interrupted, "next_call": after})
    os._exit(0)


def _deny_process_reads() -> None:
    """Make the kernel refuse process_vm_readv in this process, in every thread (EPERM), as Docker's default
    seccomp profile does without CAP_SYS_PTRACE: a seccomp filter (x86_64 and aarch64)."""
    import ctypes
    import errno
    import platform

    number, arch = {"x86_64": (310, 0xC000003E), "aarch64": (270, 0xC00000B7)}[platform.machine()]
    load, jump_if_equal, ret = 0x20, 0x15, 0x06
    program = [(load, 0, 0, 4), (jump_if_equal, 0, 3, arch), (load, 0, 0, 0), (jump_if_equal, 0, 1, number),
               (ret, 0, 0, 0x00050000 | errno.EPERM), (ret, 0, 0, 0x7FFF0000)]  # SECCOMP_RET_ERRNO, _ALLOW

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(program))(*program)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    seccomp = {"x86_64": 317, "aarch64": 277}[platform.machine()]
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: the communication thread too
    assert libc.syscall(seccomp, 1, 1, ctypes.byref(Program(len(program), instructions))) == 0, ctypes.get_errno()


# (call, root): large one-host gathers and broadcasts, blocking (the core where it is on) and async (always
# the Python group's path); the first broadcast's root is the last rank, whose memory the others may read
# even where SMDDP_TEST_DENY_READS denies that rank's own reads
SINGLE_COPY_CALLS = ["broadcast_from_last", "all_gather_into_tensor", "all_gather", "broadcast", "async_all_gather_into_tensor", "async_broadcast"]


STREAMED_CALLS = ["all_gather_into_tensor", "unaligned_output", "in_place", "all_gather"]


def streamed_gather(store: dist.TCPStore) -> None:
    """All_gathers of STREAMED_FROM bytes or more on one host copy through the slots (non-temporal stores
    in the core): each result against a reference, into an output 4 bytes off alignment and in place too,
    and the barrier generations each call took."""
    from smddp_sdk.collectives.local import STREAMED_FROM

    rank, size = dist.get_rank(), dist.get_world_size()
    arena = dist.group.WORLD._comm.local.arena
    count = STREAMED_FROM // 4 // size + 3  # a tail shorter than a 64-byte line
    parts = [_seeded(r, count, torch.float32) for r in range(size)]
    backing = torch.zeros(count * size + 1)
    results = []
    for call in STREAMED_CALLS:
        before = arena.counters[1]
        if call == "all_gather":
            outs = [torch.empty(count) for _ in range(size)]
            dist.all_gather(outs, parts[rank])
            right = all(torch.equal(o, p) for o, p in zip(outs, parts))
        else:
            out = backing[1:] if call == "unaligned_output" else backing[:-1]
            mine = out[rank * count : (rank + 1) * count].copy_(parts[rank]) if call == "in_place" else parts[rank]
            dist.all_gather_into_tensor(out, mine)
            right = torch.equal(out, torch.cat(parts))
        results.append({"call": call, "right": right, "barriers": arena.counters[1] - before})
    _report(store, "streamed_gather", {"results": results, "single_copy": arena.single_copy})


def single_copy(store: dist.TCPStore) -> None:
    """Large all_gathers and broadcasts on one host: each result against a reference, the barrier
    generations each call took (2 when it read the peers' memory, one per slot when it copied through
    the slots) and the warnings it raised. SMDDP_TEST_DENY_READS: the last rank's kernel refuses
    process_vm_readv."""
    import warnings

    rank, size = dist.get_rank(), dist.get_world_size()
    if os.environ.get("SMDDP_TEST_DENY_READS") and rank == size - 1:
        _deny_process_reads()
    group = dist.group.WORLD
    arena = group._comm.local.arena
    count = 300_001  # 1.2 MB per rank: above SINGLE_COPY_FROM, many 64 KB slots
    parts = [_seeded(r, count, torch.float32) for r in range(size)]
    results = []
    for call in SINGLE_COPY_CALLS:
        before = arena.counters[1]
        asynchronous = call.startswith("async_")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if call.endswith("broadcast") or call == "broadcast_from_last":
                root = size - 1 if call == "broadcast_from_last" else 0
                x = parts[rank].clone()
                work = dist.broadcast(x, src=root, async_op=asynchronous)
                work and work.wait()
                right = torch.equal(x, parts[root])
            elif call.endswith("into_tensor"):
                out = torch.empty(count * size)
                work = dist.all_gather_into_tensor(out, parts[rank], async_op=asynchronous)
                work and work.wait()
                right = torch.equal(out, torch.cat(parts))
            else:
                outs = [torch.empty(count) for _ in range(size)]
                dist.all_gather(outs, parts[rank])
                right = all(torch.equal(o, p) for o, p in zip(outs, parts))
        results.append({"call": call, "right": right, "barriers": arena.counters[1] - before,
                        "warnings": [str(w.message) for w in caught if "peer's memory" in str(w.message)]})
    _report(store, "single_copy", {"results": results, "single_copy": arena.single_copy,
                                   "core_calls": group._core_calls() if hasattr(group, "_core_calls") else None})


def _rooted_call(op: str, root: int, count: int, dtype: torch.dtype) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.ones(count, dtype=dtype)
    if op == "broadcast":
        dist.broadcast(x, src=root)
    elif op == "reduce":
        dist.reduce(x, dst=root)
    elif op == "scatter":
        dist.scatter(x, [torch.ones(count, dtype=dtype)] * size if rank == root else None, src=root)
    elif op == "gather":
        dist.gather(x, [torch.empty(count, dtype=dtype) for _ in range(size)] if rank == root else None, dst=root)
    else:
        raise ValueError(f"unknown rooted collective {op!r}")


def rooted_mismatch_between_hosts(store: dist.TCPStore) -> None:
    """Every rank calls a rooted collective (root 0, 10 float32 elements), but the last host's ranks with another
    root (the last rank), size (20) or dtype (float64): SMDDP_TEST_MISMATCH is "<op>_<root|size|dtype>"."""
    dist.all_reduce(torch.ones(10))  # agree once first, so the sequence numbers are past the start
    op, kind = os.environ["SMDDP_TEST_MISMATCH"].split("_")
    last_host = os.environ["SM_CURRENT_HOST"] == os.environ["SMDDP_TEST_LAST_HOST"]
    root = dist.get_world_size() - 1 if last_host and kind == "root" else 0
    count = 20 if last_host and kind == "size" else 10
    dtype = torch.float64 if last_host and kind == "dtype" else torch.float32
    _expect_failure(store, "rooted", lambda: _rooted_call(op, root, count, dtype))
