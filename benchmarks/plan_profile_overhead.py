"""What SMDDP_PROFILE costs: per collective, in isolation and in a small-message loop of 2 ranks on one host.

    python3 benchmarks/plan_profile_overhead.py --calls 3000 --rounds 5

1. The recorder's own cost: ``profile.wrap(...)`` plus the timed call around a job that does nothing,
   against calling the job directly (one process; median of rounds, ns per call).
2. In place: 2 ranks (one simulated host, shared memory) run ``--calls`` back-to-back 4-byte all_reduces,
   alternating rounds with the recorder off and on in the same processes (so the machine's load hits both
   alike); time per call is the slowest rank's, median over rounds. Small messages are where a fixed cost
   per call shows most; bigger collectives hide it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def isolated(calls: int, rounds: int) -> tuple[float, float]:
    import torch

    from smddp_sdk.collectives import profile

    rec = profile.Recorder(Path(tempfile.mkdtemp()))
    value = [torch.zeros(1)]

    def job() -> None:
        return None

    plain, recorded = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            job()
        plain.append((time.perf_counter() - start) / calls)
        start = time.perf_counter()
        for _ in range(calls):
            rec.wrap("all_reduce", value, job, 2)()
        recorded.append((time.perf_counter() - start) / calls)
        rec.events.clear()
    return statistics.median(plain), statistics.median(recorded)


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401
    from smddp_sdk.collectives import profile

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    tensor = torch.ones(1)
    rec = profile.Recorder(Path(tempfile.mkdtemp()))
    results: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(100):
        dist.all_reduce(tensor)  # warm-up
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            profile._recorder = rec if mode == "on" else None  # noqa: SLF001 - the switch SMDDP_PROFILE flips at import
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                dist.all_reduce(tensor)
            elapsed = torch.tensor([(time.perf_counter() - start) / args.calls], dtype=torch.float64)
            profile._recorder = None  # noqa: SLF001
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            results[mode].append(float(elapsed))
            rec.events.clear()
    if dist.get_rank() == 0:
        Path(args.result_file).write_text(json.dumps(results))
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    plain, recorded = isolated(args.calls * 10, args.rounds)
    print(f"load {os.getloadavg()[0]:.1f}; recorder alone: {(recorded - plain) * 1e9:.0f} ns per collective "
          f"(bare call {plain * 1e9:.0f} ns, wrapped and recorded {recorded * 1e9:.0f} ns)", flush=True)
    from benchmarks.launch import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        os.environ.pop("SMDDP_PROFILE", None)
        code = run_ranks(__file__, ["--calls", str(args.calls), "--rounds", str(args.rounds), "--result-file", result], 2)
        if code != 0:
            print(f"rank processes failed (exit {code})", file=sys.stderr)
            return 1
        data = json.loads(Path(result).read_text())
    off, on = statistics.median(data["off"]), statistics.median(data["on"])
    print(f"2 ranks, one host, 4-byte all_reduce x {args.calls}, {args.rounds} rounds: off {off * 1e6:.1f} us/call, "
          f"on {on * 1e6:.1f} us/call ({(on - off) / off:+.1%}); rounds off {[round(x * 1e6, 1) for x in data['off']]}, "
          f"on {[round(x * 1e6, 1) for x in data['on']]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
