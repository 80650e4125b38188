"""What the call check between hosts costs: all_reduce (or broadcast) on 2 simulated hosts with the check on and off.

    python benchmarks/call_check_cost.py                      # 64 KB, 3 trials of each, interleaved
    python benchmarks/call_check_cost.py --size 1M --trials 5 --calls 5000
    python benchmarks/call_check_cost.py --op broadcast --size 4K   # a rooted call: the check goes both ways

Every exchange between host leaders carries a 32-byte call header that the receiver compares with its own
(docs/security.md); a rooted call's first exchange also carries a byte each way where no data goes, so the
root hears every other host's header. ``SMDDP_CHECK_CALLS=0`` turns both off on every rank of a trial, so the
same code runs with and without them. Each trial starts fresh rank processes (one rank per host, TCP between them),
checks the result, runs ``--warmup`` calls, then times ``--calls`` calls on rank 0; trials
alternate off and on, so a change in the machine's load hits both alike. Reported for wall-clock time
and for rank 0's CPU time (less swayed by other work on a shared machine): the median per call of each
setting over its trials, every trial's figure, and the cost of the check in percent.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.collectives_bench import human, parse_size  # noqa: E402

SETTINGS = {"off": "0", "on": "1"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=("all_reduce", "broadcast"), default="all_reduce",
                        help="the collective timed (broadcast: from rank 0; its check also exchanges a byte with the root)")
    parser.add_argument("--size", default="64K", help="bytes of the float32 tensor, with K/M suffixes")
    parser.add_argument("--trials", type=int, default=3, help="trials of each setting")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((parse_size(args.size) // 4,), float(rank + 1))
    call = dist.all_reduce if args.op == "all_reduce" else lambda x: dist.broadcast(x, src=0)
    call(tensor)
    expected = world * (world + 1) / 2 if args.op == "all_reduce" else 1.0
    if not torch.all(tensor == expected):
        raise SystemExit(f"rank {rank}: {args.op} gave {tensor[:4].tolist()}..., expected {expected}")
    for _ in range(args.warmup):
        call(tensor)
    dist.barrier()
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(args.calls):
        call(tensor)
    per_call = {"wall": (time.perf_counter() - started) / args.calls, "cpu": (time.process_time() - cpu_started) / args.calls}
    if rank == 0:
        Path(args.result).write_text(json.dumps(per_call))
    dist.destroy_process_group()


def trial(args: argparse.Namespace, argv: list[str], check: str, result: Path) -> dict[str, float]:
    from benchmarks.launch import run_ranks

    env = {"SMDDP_CHECK_CALLS": check, "SMDDP_MESH_SECRET": secrets.token_hex(32)}
    code = run_ranks(__file__, [*argv, "--result", str(result)], world_size=2, hosts=2, env=env)
    if code:
        raise SystemExit(f"a trial with SMDDP_CHECK_CALLS={check} failed (exit {code})")
    return json.loads(result.read_text())


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    load = os.getloadavg()
    print(f"{args.op} {human(parse_size(args.size))}B, 2 hosts x 1 rank, {args.calls} calls after {args.warmup}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    times: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="smddp-call-check-") as tmp:
        for index in range(args.trials):
            for name, check in SETTINGS.items():
                times[name].append(trial(args, argv, check, Path(tmp) / f"{name}-{index}.json"))
    for clock in ("wall", "cpu"):
        medians = {}
        for name, runs in times.items():
            values = [run[clock] for run in runs]
            medians[name] = statistics.median(values)
            trials = ", ".join(f"{value * 1e6:.1f}" for value in values)
            print(f"  {clock:<4} check {name:<3}  median {medians[name] * 1e6:8.1f} us per call  (trials: {trials})")
        print(f"  {clock:<4} cost of the check: {(medians['on'] - medians['off']) / medians['off'] * 100:+.1f} %")
    load = os.getloadavg()
    print(f"  load after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
