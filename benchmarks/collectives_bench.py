"""Collective benchmark: smddp and gloo side by side, every result checked before and after timing.

    python benchmarks/collectives_bench.py --world-sizes 2,4 --ops allreduce,allgather

Each world size runs as its own set of rank processes. Every rank joins the default group with smddp and
a second group with gloo (and Open MPI's world through mpi4py, the ranks then started by mpirun), so all
backends run in the same processes, on the same inputs. Each op and size runs --rounds rounds, every
backend in turn within a round, and each backend's times are pooled over its rounds: a slow spell of the
machine (another process, the hypervisor moving a vCPU) falls on every backend alike. Before timing, and
again after, each op's result is checked against a reference computed locally from seeded inputs. Time
per size is the median over calls of the slowest rank's time for one call, each call started together
after a barrier (p99: the 99th percentile of the same times); algbw = size / time; busbw follows
nccl-tests: allreduce algbw*2(n-1)/n, allgather and reduce_scatter algbw*(n-1)/n, broadcast algbw. Size
means the tensor for allreduce and broadcast, the gathered output for allgather and the input for
reduce_scatter.

Backend "fake" is torch's fake process group, which moves no data: its time is what torch's own
`dist.*` wrapper and binding cost, the floor under every backend's small-message time (not checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = "4K,64K,1M,16M,64M,256M"
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "barrier": lambda n: 1.0,
}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def human(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated, e.g. 2,4")
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts the ranks are split over (TCP between them)")
    parser.add_argument("--ops", default="allreduce,allgather", help="allreduce,allgather,reduce_scatter,broadcast or all")
    parser.add_argument("--sizes", default=SIZES, help=f"bytes with K/M/G suffixes (default {SIZES})")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--min-iters", type=int, default=5, help="timed calls per round, at least")
    parser.add_argument("--max-iters", type=int, default=1000, help="timed calls per round, at most")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per round (default 3)")
    parser.add_argument("--seconds", type=float, default=1.0, help="rough time budget per op, size and backend, all rounds")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per op and size, the backends in turn in each (default 3)")
    parser.add_argument("--backends", default="smddp,gloo",
                        help="smddp, gloo, mpi (Open MPI through mpi4py in the same processes, see "
                             "benchmarks/setup-mpi.sh) and/or fake (torch's wrapper over a group that moves nothing: the floor)")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ops == "all":
        args.ops = ",".join(BUS_FACTOR)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")
    if "mpi" in args.backends.split(",") and args.dtype != "float32":
        parser.error(f"--backends mpi measures float32 only (Open MPI 4 reduces no 16-bit floats): drop mpi for --dtype {args.dtype}")
    return args


# ----------------------------------------------------------------------------------------------- ranks
def rank_main(args: argparse.Namespace) -> None:
    import torch

    dtype = getattr(torch, args.dtype)
    rank_sweep(
        args,
        lambda op, size, group, rank, n: measure(op, size, dtype, group, args, rank, n),
        print_row,
        rounds=args.rounds,
        pool=lambda op, size, n, rounds: summary(sum(rounds, []), size, BUS_FACTOR[op](n)),
        dtype=args.dtype,
    )


def rank_sweep(args: argparse.Namespace, measure_one: Callable, print_one: Callable, *, rounds: int = 1,
               pool: Callable = lambda op, size, n, results: results[0], **row_fields: object) -> None:
    """What every rank of a benchmark does: join smddp, a gloo group (and Open MPI's world, under mpirun)
    in the same process, measure each op and size with each backend in turn, `rounds` times; pool(op,
    size, n, a backend's results) makes its entry of the row. Rank 0 prints the rows and appends them to
    ``--json``."""
    import torch
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401

    torch.set_num_threads(1)
    wanted = args.backends.split(",")
    mpi_world = None
    if "mpi" in wanted:  # started by mpirun: this rank's place comes from Open MPI (launch.py)
        try:
            from mpi4py import MPI
        except ImportError as missing:
            raise SystemExit(f"--backends mpi needs mpi4py ({missing}): run benchmarks/setup-mpi.sh first") from missing

        from benchmarks.launch import adopt_mpi_rank

        adopt_mpi_rank()
        mpi_world = MPI.COMM_WORLD
    dist.init_process_group("smddp")
    groups = {"smddp": dist.group.WORLD, "gloo": dist.new_group(backend="gloo"), "mpi": mpi_world}
    if "fake" in wanted:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers torch's "fake" backend

        groups["fake"] = dist.new_group(backend="fake")
    groups = {name: groups[name] for name in wanted}
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in args.ops.split(","):
        for size in map(parse_size, args.sizes.split(",")) if op != "barrier" else [0]:
            row = {"op": op, "n": n, "size": size, **row_fields}
            results: dict[str, list] = {name: [] for name in groups}
            for _ in range(rounds):
                for name, group in groups.items():
                    results[name].append(measure_one(op, size, group, rank, n))
            row.update({name: pool(op, size, n, got) for name, got in results.items()})
            rows.append(row)
            if rank == 0:
                print_one(row, [b for b in wanted if b in row], first=len(rows) == 1 or rows[-2]["op"] != op)
    if rank == 0 and args.json:
        path = Path(args.json)
        existing = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(existing + rows, indent=1))
    dist.destroy_process_group()


def make_case(op: str, size: int, dtype, rank: int, n: int):
    """(run, check, reset): run() does one collective; check() raises on a wrong result; reset() (or None)
    restores the inputs between calls, outside the timed region."""
    import torch
    import torch.distributed as dist

    elem = torch.empty(0, dtype=dtype).element_size()
    count = max(n, size // elem // n * n)  # divisible by n for allgather / reduce_scatter

    def values(r: int, numel: int) -> torch.Tensor:
        return ((torch.arange(numel, dtype=torch.int64) * 7 + r * 3) % 11).to(dtype)

    if op == "allreduce":
        base = values(rank, count)
        buf = base.clone()
        expected = sum(values(r, count).double() for r in range(n)).to(dtype)

        def run(group):
            dist.all_reduce(buf, group=group)

        def check():
            torch.testing.assert_close(buf, expected, rtol=0, atol=0)

        return run, check, (lambda: buf.copy_(base))  # reset outside the timed call: sums would overflow
    if op == "allgather":
        inp = values(rank, count // n)
        out = torch.empty(count, dtype=dtype)
        expected = torch.cat([values(r, count // n) for r in range(n)])
        return (lambda group: dist.all_gather_single(out, inp, group=group)), (lambda: torch.testing.assert_close(out, expected, rtol=0, atol=0)), None
    if op == "reduce_scatter":
        inp = values(rank, count)
        out = torch.empty(count // n, dtype=dtype)
        expected = sum(values(r, count).double() for r in range(n)).to(dtype).chunk(n)[rank]
        return (lambda group: dist.reduce_scatter_single(out, inp, group=group)), (lambda: torch.testing.assert_close(out, expected, rtol=0, atol=0)), None
    if op == "barrier":
        return (lambda group: dist.barrier(group=group)), (lambda: None), None
    if op == "broadcast":
        buf = values(rank, count)
        expected = values(0, count)
        return (lambda group: dist.broadcast(buf, src=0, group=group)), (lambda: torch.testing.assert_close(buf, expected, rtol=0, atol=0)), None
    raise SystemExit(f"unknown op {op!r}: use allreduce, allgather, reduce_scatter or broadcast")


def measure(op: str, size: int, dtype, group, args, rank: int, n: int) -> list[float]:
    """One round of one backend: each timed call's time on the slowest rank."""
    import torch
    import torch.distributed as dist

    if not isinstance(group, dist.ProcessGroup):  # Open MPI's communicator
        from benchmarks import mpi_bench

        return mpi_bench.measure(group, op, size, args)
    run, check, reset = make_case(op, size, dtype, rank, n)
    reset = reset or (lambda: None)
    if dist.get_backend(group) == "fake":
        check = lambda: None  # noqa: E731 - it moves no data: nothing to check
    reset()
    run(group)
    check()

    def slowest(times: list[float]) -> list[float]:
        over_ranks = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(over_ranks, op=dist.ReduceOp.MAX, group=group)
        return over_ranks.tolist()

    times = time_calls(lambda: run(group), reset, lambda: dist.barrier(group=group), slowest, args)
    reset()
    run(group)
    check()
    return times


def time_calls(run: Callable, reset: Callable, barrier: Callable, slowest: Callable, args: argparse.Namespace) -> list[float]:
    """The timing rule every backend shares (mpi_bench.py too), for one round: --warmup calls untimed,
    then iterations from the round's share of the time budget (agreed by all ranks: the slowest
    estimate), each call reset, started together after a barrier and timed; slowest(times) is each
    call's time on the slowest rank, which this returns."""
    for _ in range(args.warmup):  # first touches, lazy set-up, caches and the scheduler settle alike for all
        reset()
        barrier()
        run()
    reset()
    start = time.perf_counter()
    run()
    estimate = slowest([time.perf_counter() - start])[0]
    budget = args.seconds / args.rounds
    iters = int(min(args.max_iters, max(args.min_iters, budget / max(estimate, 1e-6))))
    times = []
    for _ in range(iters):
        reset()
        barrier()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return slowest(times)


def summary(over_ranks: list[float], size: int, bus_factor: float) -> dict:
    """Median, p10 and p99 of the slowest rank's call times, and the bandwidths of the median."""
    median = statistics.median(over_ranks)
    algbw = size / median / 1e9
    p10 = statistics.quantiles(over_ranks, n=10, method="inclusive")[0] if len(over_ranks) > 1 else median
    p99 = statistics.quantiles(over_ranks, n=100, method="inclusive")[98] if len(over_ranks) > 1 else median
    return {"time_s": median, "p10_s": p10, "p99_s": p99, "algbw": algbw, "busbw": algbw * bus_factor, "calls": len(over_ranks)}


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def print_row(row: dict, backends: list[str], first: bool) -> None:
    if first:
        head = f"\n{row['op']} n={row['n']} {row['dtype']} (time = median of per-call max over ranks; bw in GB/s)\n{'size':>6}"
        for name in backends:
            head += f" | {name + ' time':>12} {'p99':>8} {'algbw':>7} {'busbw':>7}"
        for other in backends[1:]:
            head += f" | {'time/' + other:>10}"
        print(head, flush=True)
    line = f"{human(row['size']):>6}"
    for name in backends:
        r = row[name]
        line += f" | {fmt_time(r['time_s']):>12} {fmt_time(r.get('p99_s', r['time_s'])):>8} {r['algbw']:7.3f} {r['busbw']:7.3f}"
    for other in backends[1:]:  # the first backend's time over each other's: below 1 means faster
        line += f" | {row[backends[0]]['time_s'] / row[other]['time_s']:10.2f}"
    print(line, flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    from benchmarks.launch import run_ranks

    forwarded = [a for a in argv if a != "--rank-process"]
    under_mpirun = "mpi" in args.backends.split(",")  # Open MPI's world needs its ranks started by mpirun
    worst = 0
    for n in map(int, args.world_sizes.split(",")):
        worst = worst or run_ranks(__file__, forwarded, n, hosts=min(args.hosts, n), mpirun=under_mpirun)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
