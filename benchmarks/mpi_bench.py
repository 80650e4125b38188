"""Open MPI anchor for collectives_bench.py: the same ops, sizes and timing rule, through mpi4py on numpy.

    benchmarks/setup-mpi.sh        # once: Debian's Open MPI and pip's mpi4py (benchmark only)
    mpirun --allow-run-as-root --oversubscribe -n 2 python3 benchmarks/mpi_bench.py --ops allreduce --json out.json

Inputs are the values collectives_bench uses; every result is checked against a reference before and
after timing. Time per size: barrier, time one call, the slowest rank's time (MAX over ranks), median.
Rows carry the result under the key "mpi" so collectives_bench can merge them with smddp and gloo.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.collectives_bench import BUS_FACTOR, SIZES, fmt_time, human, parse_size, time_calls  # noqa: E402

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}


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


def measure(comm, op: str, size: int, dtype, args) -> dict:
    from mpi4py import MPI

    run, check, reset = make_case(comm, op, size, dtype)
    reset = reset or (lambda: None)
    reset()
    run()
    check()

    def slowest(times: list[float]) -> list[float]:
        over_ranks = np.empty(len(times))
        comm.Allreduce(np.array(times), over_ranks, op=MPI.MAX)
        return over_ranks.tolist()

    result = time_calls(run, reset, comm.Barrier, slowest, args, BUS_FACTOR.get(op, lambda n: 1.0)(comm.Get_size()), size)
    reset()
    run()
    check()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="allreduce,allgather")
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--dtype", default="float32", choices=sorted(NUMPY_DTYPES))
    parser.add_argument("--min-iters", type=int, default=5)
    parser.add_argument("--max-iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json", help="append the rows to this file")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    dtype = NUMPY_DTYPES[args.dtype]
    rows = []
    for op in args.ops.split(","):
        for size in map(parse_size, args.sizes.split(",")) if op != "barrier" else [0]:
            result = measure(comm, op, size, dtype, args)
            rows.append({"op": op, "n": comm.Get_size(), "size": size, "dtype": args.dtype, "mpi": result})
            if comm.Get_rank() == 0:
                print(f"mpi {op} n={comm.Get_size()} {human(size):>6} {fmt_time(result['time_s']):>10} "
                      f"busbw {result['busbw']:.3f} GB/s", flush=True)
    if comm.Get_rank() == 0 and args.json:
        path = Path(args.json)
        existing = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(existing + rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
