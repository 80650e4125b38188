"""Open MPI anchor of collectives_bench.py: the same ops, sizes and timing rule, through mpi4py on numpy.

    bash benchmarks/setup-mpi.sh       # once: Debian's Open MPI and pip's mpi4py (benchmark only)
    python3 benchmarks/collectives_bench.py --backends smddp,mpi

collectives_bench starts its ranks with mpirun when asked for `mpi`, and each rank measures Open MPI's
world here in turn with its torch groups, in the same processes (collectives_bench.rank_sweep). Inputs
are the values collectives_bench uses; every result is checked against a reference before and after
timing; calls are timed by collectives_bench.time_calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.collectives_bench import time_calls  # noqa: E402

NUMPY_DTYPES = {"float32": np.float32}  # collectives_bench refuses mpi with any other dtype


def values(rank: int, numel: int, dtype) -> np.ndarray:
    return ((np.arange(numel, dtype=np.int64) * 7 + rank * 3) % 11).astype(dtype)


def make_case(comm, op: str, size: int, dtype):
    """(run, check, reset) as in collectives_bench.make_case, on numpy buffers."""
    from mpi4py import MPI

    rank, n = comm.Get_rank(), comm.Get_size()
    count = max(n, size // np.dtype(dtype).itemsize // n * n)
    if op == "allreduce":
        base = values(rank, count, dtype)
        buf = base.copy()
        expected = sum(values(r, count, np.float64) for r in range(n)).astype(dtype)
        return (lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)), (lambda: _same(buf, expected)), (lambda: np.copyto(buf, base))
    if op == "allgather":
        inp = values(rank, count // n, dtype)
        out = np.empty(count, dtype=dtype)
        expected = np.concatenate([values(r, count // n, dtype) for r in range(n)])
        return (lambda: comm.Allgather(inp, out)), (lambda: _same(out, expected)), None
    if op == "reduce_scatter":
        inp = values(rank, count, dtype)
        out = np.empty(count // n, dtype=dtype)
        expected = np.split(sum(values(r, count, np.float64) for r in range(n)).astype(dtype), n)[rank]
        return (lambda: comm.Reduce_scatter_block(inp, out, op=MPI.SUM)), (lambda: _same(out, expected)), None
    if op == "broadcast":
        buf = values(rank, count, dtype)
        expected = values(0, count, dtype)
        return (lambda: comm.Bcast(buf, root=0)), (lambda: _same(buf, expected)), None
    if op == "barrier":
        return (lambda: comm.Barrier()), (lambda: None), None
    raise SystemExit(f"unknown op {op!r}")


def _same(got: np.ndarray, expected: np.ndarray) -> None:
    if not np.array_equal(got, expected):
        bad = int(np.argmax(got != expected))
        raise AssertionError(f"wrong result at element {bad}: {got[bad]} != {expected[bad]}")


def measure(comm, op: str, size: int, args: argparse.Namespace) -> list[float]:
    """One round (collectives_bench.measure's contract): each timed call's time on the slowest rank."""
    from mpi4py import MPI

    run, check, reset = make_case(comm, op, size, NUMPY_DTYPES[args.dtype])
    reset = reset or (lambda: None)
    reset()
    run()
    check()

    def slowest(times: list[float]) -> list[float]:
        over_ranks = np.empty(len(times))
        comm.Allreduce(np.array(times), over_ranks, op=MPI.MAX)
        return over_ranks.tolist()

    times = time_calls(run, reset, comm.Barrier, slowest, args)
    reset()
    run()
    check()
    return times
