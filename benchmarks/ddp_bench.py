"""DDP end-to-end benchmark: steps/s and scaling efficiency of smddp and gloo against one process.

    python benchmarks/ddp_bench.py --world-sizes 2 --backends smddp,gloo

The model is an MLP (512 -> hidden x layers -> 512, 10.5M parameters by default), SGD with momentum,
`--batch-size` samples per rank, one torch thread per rank. The one-process baseline trains the same model
without DDP. Step time is the median over the timed steps of the slowest rank's step. Efficiency =
samples/s at n ranks / (n x samples/s of one process). After training, every rank's parameter digest must
match (checked over a separate gloo group), or the run fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2")
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts the ranks are split over")
    parser.add_argument("--backends", default="smddp,gloo")
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
    if args.backend == "local":
        times = train(build_model(args), args, 0, lambda t: t)
        Path(args.result_file).write_text(json.dumps({"times": times}))
        return
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401

    dist.init_process_group(args.backend)
    side = dist.new_group(backend="gloo")  # step-time and digest exchange, off the measured path
    model = torch.nn.parallel.DistributedDataParallel(
        build_model(args), bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.gradient_as_bucket_view)

    def slowest(elapsed: float) -> float:
        box = [None] * dist.get_world_size()
        dist.all_gather_object(box, elapsed, group=side)
        return max(box)

    times = train(model, args, dist.get_rank(), slowest)
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest(model.module), group=side)
    if dist.get_rank() == 0:
        Path(args.result_file).write_text(json.dumps({"times": times, "identical": len(set(digests)) == 1}))
    dist.destroy_process_group()


def run(args: argparse.Namespace, argv: list[str], backend: str, n: int) -> dict:
    from benchmarks.launch import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        code = run_ranks(__file__, [*argv, "--backend", backend, "--result-file", result], n, hosts=min(args.hosts, n))
        if code != 0:
            raise SystemExit(f"{backend} with {n} ranks failed (exit {code})")
        data = json.loads(Path(result).read_text())
    step = statistics.median(data["times"])
    return {"backend": backend, "n": n, "step_s": step, "samples_s": n * args.batch_size / step, "identical": data.get("identical", True)}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    params = sum(p.numel() for p in build_model(args).parameters())
    print(f"MLP {params / 1e6:.1f}M parameters, batch {args.batch_size} per rank, {args.steps} timed steps, "
          f"bucket {args.bucket_cap_mb} MB, gradient_as_bucket_view={args.gradient_as_bucket_view}", flush=True)
    rows = [run(args, argv, "local", 1)]
    for n in map(int, args.world_sizes.split(",")):
        for backend in args.backends.split(","):
            rows.append(run(args, argv, backend, n))
    base = rows[0]["samples_s"]
    print(f"{'backend':>8} {'ranks':>5} {'step':>10} {'samples/s':>10} {'efficiency':>10} {'identical':>9}")
    for row in rows:
        row["efficiency"] = row["samples_s"] / (row["n"] * base)
        print(f"{row['backend']:>8} {row['n']:>5} {row['step_s'] * 1e3:8.1f} ms {row['samples_s']:10.0f} "
              f"{row['efficiency']:10.2f} {str(row['identical']):>9}", flush=True)
    if args.json:
        path = Path(args.json)
        path.write_text(json.dumps((json.loads(path.read_text()) if path.exists() else []) + rows, indent=1))
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
