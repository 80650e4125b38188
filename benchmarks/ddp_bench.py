"""DDP end-to-end benchmark: steps/s and scaling efficiency against one process, smddp against gloo.

    python benchmarks/ddp_bench.py --world-sizes 2 --steps 20 --repeat 7

Each configuration is BACKEND:DDP, where DDP is `smddp` (smddp_sdk.collectives.ddp.DistributedDataParallel)
or `torch` (torch.nn.parallel.DistributedDataParallel); the default compares smddp's DDP and torch's DDP
over smddp with torch's DDP over gloo. Two configurations without gradient exchange show what the machine
allows: `local:none` runs n processes side by side, independently; `gloo:none` runs them in lockstep
(each step ends with a tiny exchange, as DDP steps do), so that every rank's memory-bound phases (the
optimizer, say) coincide and share the memory bandwidth. No backend can beat `gloo:none`'s efficiency.

The model is an MLP (512 -> hidden x layers -> 512, 10.5M parameters by default), SGD with momentum,
`--batch-size` samples per rank, one torch thread per rank. The one-process baseline trains the same model
without DDP.

Step time is the median over the timed steps of the slowest rank's step. Efficiency = samples/s at n ranks
/ (n x samples/s of one process). `--repeat` runs every configuration and the baseline again, round after
round, so that each round's ratios come from neighbouring runs; the table shows medians over rounds and
the range of the efficiency. After training, every rank's parameter digest must match (checked over a
separate gloo group), or the benchmark fails.

Every process (baseline included) runs with glibc's malloc keeping freed memory, as the runtime sets it
up for every rank (GLIBC_TUNABLES, see docs/runtime.md): otherwise the allocator hands multi-MB gradient
buffers back to the kernel after each step and the next step pays ~10k page faults for them.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smddp_sdk.runtime.env import MALLOC_KEEPS_MEMORY  # noqa: E402 - what the runtime gives every rank

DDP_IMPLEMENTATIONS = ("smddp", "torch", "none")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2")
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts the ranks are split over")
    parser.add_argument("--configs", default="local:none,gloo:none,smddp:smddp,smddp:torch,gloo:torch",
                        help="comma-separated BACKEND:DDP pairs; DDP is smddp, torch or none (see above)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every configuration and the baseline")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--bucket-cap-mb", type=float, default=25)
    parser.add_argument("--gradient-as-bucket-view", action="store_true")
    parser.add_argument("--json", help="append results to this file")
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace):
    import torch
    from torch import nn

    torch.manual_seed(0)
    dims = [512] + [args.hidden] * args.layers + [512]
    layers: list[nn.Module] = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def train(model, args: argparse.Namespace, rank: int, sync) -> list[float]:
    """Step times in seconds (timed steps only); sync() returns the slowest rank's time for a step."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch_size, 512, generator=gen)
        y = torch.randn(args.batch_size, 512, generator=gen)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(sync(elapsed))
    return times


def digest(model) -> str:
    from smddp_sdk.collectives.memory import memview

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(memview(p.detach().contiguous()))
    return h.hexdigest()


def rank_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    if args.backend == "local":  # no communication: the baseline, or n independent processes side by side
        times = train(build_model(args), args, 0, lambda t: t)
        Path(f"{args.result_file}.{os.environ.get('RANK', '0')}").write_text(json.dumps({"times": times}))
        return
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401

    dist.init_process_group(args.backend)
    side = dist.new_group(backend="gloo")  # step-time and digest exchange, off the measured path
    if args.ddp == "none":  # steps in lockstep (the timing exchange below), no gradient exchange
        model = build_model(args)
    elif args.ddp == "smddp":
        from smddp_sdk.collectives.ddp import DistributedDataParallel

        model = DistributedDataParallel(build_model(args), bucket_cap_mb=args.bucket_cap_mb)
    else:
        model = torch.nn.parallel.DistributedDataParallel(
            build_model(args), bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.gradient_as_bucket_view)

    def slowest(elapsed: float) -> float:
        box = [None] * dist.get_world_size()
        dist.all_gather_object(box, elapsed, group=side)
        return max(box)

    times = train(model, args, dist.get_rank(), slowest)
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest(getattr(model, "module", model)), group=side)
    identical = len(set(digests)) == 1 if args.ddp != "none" else None  # nothing keeps them equal
    if dist.get_rank() == 0:
        Path(args.result_file).write_text(json.dumps({"times": times, "identical": identical}))
    dist.destroy_process_group()


def run(args: argparse.Namespace, argv: list[str], config: tuple[str, str], n: int) -> dict:
    from benchmarks.launch import run_ranks

    backend, ddp = config
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        rank_args = [*argv, "--backend", backend, "--ddp", ddp, "--result-file", result]
        code = run_ranks(__file__, rank_args, n, hosts=min(args.hosts, n), env={"GLIBC_TUNABLES": MALLOC_KEEPS_MEMORY})
        if code != 0:
            raise SystemExit(f"{backend} with {ddp} DDP and {n} ranks failed (exit {code})")
        if backend == "local":
            steps = [statistics.median(json.loads(Path(f"{result}.{r}").read_text())["times"]) for r in range(n)]
            data = {"times": [max(steps)]}
        else:
            data = json.loads(Path(result).read_text())
    step = statistics.median(data["times"])
    return {"backend": backend, "ddp": ddp, "n": n, "step_s": step, "samples_s": n * args.batch_size / step,
            "identical": data.get("identical")}


def parse_configs(text: str) -> list[tuple[str, str]]:
    configs = []
    for item in text.split(","):
        backend, _, ddp = item.partition(":")
        if ddp not in DDP_IMPLEMENTATIONS or (backend == "local" and ddp != "none"):
            raise SystemExit(f"--configs: {item!r} is not BACKEND:DDP with DDP one of {', '.join(DDP_IMPLEMENTATIONS)} "
                             "(for example smddp:smddp, gloo:torch or local:none)")
        configs.append((backend, ddp))
    return configs


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """One row per configuration: medians over rounds, efficiency against the same round's baseline."""
    rows = []
    for position in range(len(rounds[0])):
        runs = [r[position] for r in rounds]
        efficiencies = [run["samples_s"] / (run["n"] * r[0]["samples_s"]) for run, r in zip(runs, rounds)]
        rows.append({**runs[0], "step_s": statistics.median(run["step_s"] for run in runs),
                     "step_s_per_round": [run["step_s"] for run in runs],
                     "samples_s": statistics.median(run["samples_s"] for run in runs),
                     "efficiency": statistics.median(efficiencies), "efficiency_range": [min(efficiencies), max(efficiencies)],
                     "identical": None if runs[0]["identical"] is None else all(run["identical"] for run in runs),
                     "rounds": len(runs)})
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    configs = parse_configs(args.configs)
    params = sum(p.numel() for p in build_model(args).parameters())
    print(f"MLP {params / 1e6:.1f}M parameters, batch {args.batch_size} per rank, {args.steps} timed steps, "
          f"bucket {args.bucket_cap_mb} MB, gradient_as_bucket_view={args.gradient_as_bucket_view} (torch DDP), "
          f"{args.repeat} round(s), GLIBC_TUNABLES={MALLOC_KEEPS_MEMORY}", flush=True)
    plan = [(("local", "none"), 1)] + list(itertools.product(configs, map(int, args.world_sizes.split(","))))
    rounds = []
    for index in range(args.repeat):
        rounds.append([run(args, argv, config, n) for config, n in plan])
        print(f"round {index + 1}: " + ", ".join(f"{r['backend']}/{r['ddp']} x{r['n']} {r['step_s'] * 1e3:.1f} ms"
                                                  for r in rounds[-1]), flush=True)
    rows = summarize(rounds)
    print(f"{'backend':>8} {'ddp':>6} {'ranks':>5} {'step':>10} {'samples/s':>10} {'efficiency':>10} {'range':>11} {'identical':>9}")
    for row in rows:
        low, high = row["efficiency_range"]
        print(f"{row['backend']:>8} {row['ddp']:>6} {row['n']:>5} {row['step_s'] * 1e3:8.1f} ms {row['samples_s']:10.0f} "
              f"{row['efficiency']:10.2f} {low:5.2f}-{high:4.2f} {'-' if row['identical'] is None else str(row['identical']):>9}",
              flush=True)
    if args.json:
        path = Path(args.json)
        path.write_text(json.dumps((json.loads(path.read_text()) if path.exists() else []) + rows, indent=1))
    return 1 if any(row["identical"] is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
