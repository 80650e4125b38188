"""DDP benchmark: scaling efficiency of smddp and gloo against one process, parameters checked.

    python3 benchmarks/ddp_bench.py --repeats 3

Model: MLP 512-2048-2048-2048-512 (10.5M parameters, 42 MB of fp32 gradients), batch ``--batch-size`` per
rank, 1 torch thread per rank, SGD with momentum. Configurations run interleaved, ``--repeats`` times:
one process without DDP (the baseline), then world size 2 with each backend. Step time = median over the
timed steps of the slowest rank; efficiency = samples/s at world size 2 / (2 x samples/s of one process).

Checks (through files, not through the backend under test): every rank ends with bit-identical
parameters, and they match a single process trained on the same global batch (within float tolerance).
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
    parser.add_argument("--backends", default="smddp,gloo")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after 5 warm-up steps)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--hook", choices=["none", "smddp", "bf16", "fp16"], default="smddp",
                        help="comm hook for the smddp runs (smddp_sdk.collectives.ddp)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="append results to this file")
    parser.add_argument("--rank-process", help=argparse.SUPPRESS)  # "local" or a backend name
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


WARMUP = 5
LAYERS = [512, 2048, 2048, 2048, 512]


def build_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    parts: list[nn.Module] = []
    for a, b in zip(LAYERS, LAYERS[1:]):
        parts += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*parts[:-1])


def batches(steps: int, global_batch: int):
    import torch

    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(global_batch, LAYERS[0], generator=gen), torch.randn(global_batch, LAYERS[-1], generator=gen))
            for _ in range(steps)]


def train(model, data, shard: slice, opt) -> list[float]:
    import torch

    times = []
    for x, y in data:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = 1 if args.rank_process == "local" else args.world_size
    model = build_model()
    if args.rank_process != "local":
        import smddp_sdk.collectives  # noqa: F401
        from smddp_sdk.collectives import ddp

        dist.init_process_group(args.rank_process)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
        if args.rank_process == "smddp" and args.hook != "none":
            ddp.register(model, compress=None if args.hook == "smddp" else args.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = batches(WARMUP + args.steps, args.batch_size * world)
    shard = slice(rank * args.batch_size, (rank + 1) * args.batch_size)
    times = train(model, data, shard, opt)[WARMUP:]
    module = model.module if hasattr(model, "module") else model
    params = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    torch.save(params, f"{args.out}.params.{rank}")
    Path(f"{args.out}.{rank}").write_text(json.dumps({"times": times, "digest": digest(module)}))
    if args.rank_process != "local":
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- driver
def run_config(kind: str, args: argparse.Namespace, forwarded: list[str], workdir: str) -> dict:
    from benchmarks.launch import run_ranks

    out = os.path.join(workdir, kind)
    world = 1 if kind == "local" else args.world_size
    code = run_ranks(__file__, [*forwarded, "--rank-process", kind, "--out", out], world)
    if code != 0:
        raise SystemExit(f"ddp_bench: the {kind} run failed with exit code {code}")
    reports = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    slowest = [max(step) for step in zip(*(r["times"] for r in reports))]
    step = statistics.median(slowest)
    return {"kind": kind, "world": world, "step_s": step, "samples_per_s": world * args.batch_size / step,
            "digests": [r["digest"] for r in reports], "out": out}


def check(result: dict, reference_out: str, world: int) -> str:
    """"" when every rank holds identical parameters matching the reference, else what is wrong."""
    import torch

    if len(set(result["digests"])) != 1:
        return f"{result['kind']}: parameters differ between ranks"
    got = torch.load(f"{result['out']}.params.0")
    want = torch.load(f"{reference_out}.params.0")
    error = float((got - want).abs().max())
    return "" if error < 1e-4 else f"{result['kind']}: parameters differ from the single-process reference by {error:.3g}"


def reference_run(args: argparse.Namespace, forwarded: list[str], workdir: str) -> str:
    """One process trained on the global batch: what every DDP rank must end with."""
    from benchmarks.launch import run_ranks

    out = os.path.join(workdir, "reference")
    ref_args = [a for a in forwarded]
    code = run_ranks(__file__, [*ref_args, "--batch-size", str(args.batch_size * args.world_size), "--rank-process", "local", "--out", out], 1)
    if code != 0:
        raise SystemExit(f"ddp_bench: the reference run failed with exit code {code}")
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    forwarded = [a for a in argv]
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as workdir:
        reference = reference_run(args, forwarded, workdir)
        for repeat in range(args.repeats):
            base = run_config("local", args, forwarded, workdir)
            row = {"repeat": repeat, "local": base}
            for backend in args.backends.split(","):
                result = run_config(backend, args, forwarded, workdir)
                problem = check(result, reference, args.world_size)
                if problem:
                    print(f"ddp_bench: CHECK FAILED: {problem}", file=sys.stderr)
                    return 1
                result["efficiency"] = result["samples_per_s"] / (args.world_size * base["samples_per_s"])
                row[backend] = result
            rows.append(row)
            print(f"repeat {repeat}: 1 process {base['step_s'] * 1e3:.1f} ms/step " + " ".join(
                f"| {b} ws={args.world_size} {row[b]['step_s'] * 1e3:.1f} ms/step eff {row[b]['efficiency']:.2f}"
                for b in args.backends.split(",")), flush=True)
    print(f"load average after: {os.getloadavg()}")
    for backend in args.backends.split(","):
        effs = [r[backend]["efficiency"] for r in rows]
        print(f"{backend}: median efficiency {statistics.median(effs):.2f} (runs: {', '.join(f'{e:.2f}' for e in effs)}); "
              "parameters identical on all ranks and equal to the single-process reference")
    if args.json:
        path = Path(args.json)
        existing = json.loads(path.read_text()) if path.exists() else []
        for row in rows:
            for value in row.values():
                if isinstance(value, dict):
                    value.pop("out", None)
        path.write_text(json.dumps(existing + rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
