"""Check the planner's predictions against runs measured here, and set them beside published figures.

    sudo python3 benchmarks/plan_validate.py collectives --configs 2x800,3x400,4x100 --json out.json
    sudo python3 benchmarks/plan_validate.py collectives --configs 8x1000,16x1000 --delay-ms 0.5 --json out.json
    sudo python3 benchmarks/plan_validate.py ddp --configs 2x100,3x400,4x800 --json out.json
    python3 benchmarks/plan_validate.py published
    python3 benchmarks/plan_validate.py report out.json      # the Markdown tables of docs/planning.md

``collectives`` runs benchmarks/link_bench.py (H simulated hosts, one rank each, every link shaped to R
mbit: "HxR", ``--delay-ms`` one way between hosts) and compares each measured time per call, smddp's and
gloo's, with the model's smddp and stock predictions for topology ``sim:<R>mbit[+<D>ms]``, for the
algorithms the runtime in this checkout implements.

``ddp`` trains an MLP with torch's DistributedDataParallel over smddp on H simulated hosts three times:
on unshaped links with SMDDP_PROFILE on (the local profile: compute per step and every bucket's size and
ready moment, on the same CPUs and the same number of processes), then on links shaped to R mbit, also
profiled, then unshaped again. The planner predicts the shaped step from each local profile alone (their
mean is reported, the two show how far the machine's load moved the compute); the measurement is the
median step (rank 0, optimizer step to optimizer step) of the shaped run.

Error = (predicted - measured) / measured. Nothing here is fitted to the measurements: the model's only
inputs are the shaped rate, TCP's payload share of a frame and fixed per-message costs (hardware.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from smddp_sdk.planning.costmodel import collective_cost, collective_seconds  # noqa: E402
from smddp_sdk.planning.hardware import simulated, topology  # noqa: E402
from smddp_sdk.planning.profile_io import read_step_profile  # noqa: E402
from smddp_sdk.planning.step import from_figures, predict  # noqa: E402

OPS = {"allreduce": "all_reduce", "allgather": "all_gather"}


def parse_configs(text: str) -> list[tuple[int, float, int]]:
    """ "3x400" (3 hosts, 400 mbit links, one rank each) or "2x400x2" (two ranks per host)."""
    configs = []
    for item in text.split(","):
        parts = item.split("x")
        ok = len(parts) in (2, 3) and parts[0].isdigit() and int(parts[0]) >= 2 and parts[1].replace(".", "", 1).isdigit()
        if not ok or (len(parts) == 3 and not parts[2].isdigit()):
            raise SystemExit(f"--configs: {item!r} is not HOSTSxMBIT[xRANKS] with 2 or more hosts (like 3x400 or 2x400x2)")
        configs.append((int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) == 3 else 1))
    return configs


def load_note() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


# ------------------------------------------------------------------------------------------ collectives
def run_collectives(args: argparse.Namespace) -> list[dict]:
    results = []
    for hosts, rate, ranks in parse_configs(args.configs):
        sizes = args.sizes or ("64K,256K,1M,4M" if rate < 200 else "64K,256K,1M,4M,16M")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "link.json"
            note = load_note()
            cmd = [
                sys.executable,
                str(ROOT / "benchmarks/link_bench.py"),
                "--hosts",
                str(hosts),
                "--rate-mbit",
                f"{rate:g}",
                "--ranks-per-host",
                str(ranks),
                "--sizes",
                sizes,
                "--repeats",
                "3",
                "--seconds",
                "0.5",
                "--json",
                str(out),
                "--delay-ms",
                f"{args.delay_ms:g}",
            ]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
            if run.returncode != 0:
                raise SystemExit(f"link_bench failed for {hosts}x{rate:g}:\n{run.stdout}\n{run.stderr}")
            rows = json.loads(out.read_text())
        topo = simulated(rate, ranks, args.delay_ms)
        for row in rows:
            for backend, library in (("smddp", "smddp"), ("gloo", "stock")):
                cost = collective_cost(OPS[row["op"]], row["size"], hosts, topo, library)
                predicted, measured = cost.seconds, row[backend]["time_s"]
                results.append(
                    {
                        "kind": "collective",
                        "hosts": hosts,
                        "rate_mbit": rate,
                        "ranks_per_host": ranks,
                        "delay_ms": args.delay_ms,
                        "op": OPS[row["op"]],
                        "bytes": row["size"],
                        "backend": backend,
                        "algorithm": cost.algorithm,
                        "measured_s": measured,
                        "predicted_s": predicted,
                        "error": (predicted - measured) / measured,
                        "load": note,
                    }
                )
                print(
                    f"{config_name(results[-1])} {row['op']:>9} {row['size']:>9} {backend:>5} ({cost.algorithm}): measured "
                    f"{measured * 1e3:8.2f} ms, predicted {predicted * 1e3:8.2f} ms ({(predicted - measured) / measured:+.1%})",
                    flush=True,
                )
    return results


def config_name(row: dict) -> str:
    """3x400x1, or 8x1000x1+0.5ms with a delay."""
    delay = row.get("delay_ms", 0)
    return f"{row['hosts']}x{row['rate_mbit']:g}x{row.get('ranks_per_host', 1)}" + (f"+{delay:g}ms" if delay else "")


# -------------------------------------------------------------------------------------------------- ddp
def build_model(hidden: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    dims = [256] + [hidden] * layers + [256]
    mods: list[nn.Module] = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def ddp_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401 - registers smddp (and, with SMDDP_PROFILE, the recorder)

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.hidden, args.layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x, y = torch.randn(args.batch, 256, generator=gen), torch.randn(args.batch, 256, generator=gen)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


def ddp_once(args: argparse.Namespace, hosts: int, rate: float | None, profile_dir: Path, delay_ms: float = 0.0) -> None:
    from benchmarks.link_bench import rank_env, wait_all
    from benchmarks.simhosts import SimHosts

    forwarded = ["ddp", "--rank-process", "--hidden", str(args.hidden), "--layers", str(args.layers), "--bucket-mb", str(args.bucket_mb), "--steps", str(args.steps), "--batch", str(args.batch)]
    layout = argparse.Namespace(hosts=hosts, ranks_per_host=1)
    with SimHosts(hosts, rate_mbit=rate, delay_ms=delay_ms) as sim:
        procs = []
        for rank in range(hosts):
            env = rank_env(rank, layout, sim.names, sim.addresses)
            env.update({"SMDDP_PROFILE": str(profile_dir), "MASTER_PORT": "29533"})
            procs.append(sim.popen(rank, [sys.executable, __file__, *forwarded], env=env))
        code = wait_all(procs, time.monotonic() + 600)
    if code != 0:
        raise SystemExit(f"ddp run on {hosts} hosts at {rate} mbit failed (exit {code})")


def run_ddp(args: argparse.Namespace) -> list[dict]:
    results = []
    params = sum(p.numel() for p in build_model(args.hidden, args.layers).parameters())
    for hosts, rate, _ranks in parse_configs(args.configs):  # one rank per host
        with tempfile.TemporaryDirectory() as tmp:
            before, shaped, after = Path(tmp) / "before", Path(tmp) / "shaped", Path(tmp) / "after"
            note = load_note()
            # The local profile is taken just before and just after the shaped run, and the prediction uses
            # each: on a shared machine the compute per step drifts with the load, and the spread shows it.
            ddp_once(args, hosts, None, before)
            ddp_once(args, hosts, rate, shaped, args.delay_ms)
            ddp_once(args, hosts, None, after)
            profiles = [read_step_profile(before), read_step_profile(after)]
            measured = read_step_profile(shaped).measured_step_s
        topo = simulated(rate, 1, args.delay_ms)
        predictions = [predict(p, hosts, topo, "smddp").step_s for p in profiles]
        predicted = statistics.mean(predictions)
        profile = profiles[0]
        # The same prediction without overlap (comm after compute) shows what the overlap model contributes.
        compute = statistics.mean(p.compute_s for p in profiles)
        serial = compute + sum(collective_seconds(e.op, e.nbytes, hosts, topo) for e in profile.events)
        row = {
            "kind": "ddp",
            "hosts": hosts,
            "rate_mbit": rate,
            "delay_ms": args.delay_ms,
            "params": params,
            "buckets": len(profile.events),
            "bytes": profile.bytes_per_step,
            "compute_s": compute,
            "compute_range_s": [p.compute_s for p in profiles],
            "measured_s": measured,
            "predicted_s": predicted,
            "predicted_range_s": predictions,
            "serial_s": serial,
            "error": (predicted - measured) / measured,
            "load": note,
        }
        results.append(row)
        print(
            f"ddp {config_name(row)}: {len(profile.events)} collectives, {profile.bytes_per_step / 1e6:.1f} MB, compute "
            f"{profiles[0].compute_s * 1e3:.1f}/{profiles[1].compute_s * 1e3:.1f} ms; measured {measured * 1e3:.1f} ms, "
            f"predicted {predicted * 1e3:.1f} ms ({row['error']:+.1%}; from each profile "
            f"{predictions[0] * 1e3:.1f}/{predictions[1] * 1e3:.1f} ms); no-overlap {serial * 1e3:.1f} ms",
            flush=True,
        )
    return results


# -------------------------------------------------------------------------------------------- published
# Published: docs.aws.amazon.com/sagemaker/latest/dg/data-parallel-intro.html (PyTorch 1.6, ml.p3dn.24xlarge):
# SMDDP's speed-up over PyTorch DDP at 2 / 4 / 8 nodes. Model inputs are the architectures' parameter counts
# (BERT-large 340M, Mask R-CNN ResNet-50-FPN ~44M) in fp32 gradients with 25 MB buckets; the compute per
# step on a V100 is NOT published with the figures, so it is an assumption, and the doc shows how the
# prediction moves with it.
PUBLISHED = [
    {"model": "BERT-large", "params": 340e6, "speedup": {2: 0.41, 4: 0.52, 8: 0.13}},
    {"model": "Mask R-CNN", "params": 44e6, "speedup": {2: 0.04, 4: 0.19, 8: 0.15}},
]


def run_published(args: argparse.Namespace) -> list[dict]:
    topo = topology("ml.p3dn.24xlarge")
    results = []
    for case in PUBLISHED:
        for compute_ms in (150.0, 300.0, 600.0):
            step = from_figures(compute_ms / 1e3, int(case["params"] * 4))
            for nodes, published in case["speedup"].items():
                smddp = predict(step, nodes, topo, "smddp").step_s
                stock = predict(step, nodes, topo, "stock").step_s
                results.append(
                    {
                        "kind": "published",
                        "model": case["model"],
                        "nodes": nodes,
                        "compute_ms": compute_ms,
                        "smddp_s": smddp,
                        "stock_s": stock,
                        "predicted_speedup": stock / smddp - 1,
                        "published_speedup": published,
                    }
                )
                print(
                    f"{case['model']:>10} {nodes} nodes, compute {compute_ms:.0f} ms: smddp {smddp * 1e3:.0f} ms, stock "
                    f"{stock * 1e3:.0f} ms -> predicted {stock / smddp - 1:+.0%}, published {published:+.0%}",
                    flush=True,
                )
    results.append(run_fsdp_published())
    return results


def run_fsdp_published() -> dict:
    """Llama 2 13B with FSDP on 64 ml.p4d.24xlarge (AWS ML blog "Enable faster training with Amazon SageMaker
    data parallel library", Dec 2023): 97.89 model TFLOPS/GPU with NCCL, 121.85 with SMDDP. Step times follow
    from 6 x parameters x tokens per step (attention FLOPs left out); the model predicts the time of each
    step's FSDP traffic (bf16 parameters gathered in forward and in backward, gradients reduce-scattered)."""
    params, tokens, gpus = 13e9, 4 * 2**20, 512
    flops_per_gpu = 6 * params * tokens / gpus
    topo = topology("ml.p4d.24xlarge")
    size = params * 2
    comm = {lib: 2 * collective_seconds("all_gather", size, 64, topo, lib) + collective_seconds("reduce_scatter", size, 64, topo, lib) for lib in ("smddp", "stock")}
    published = {"smddp": flops_per_gpu / 121.85e12, "stock": flops_per_gpu / 97.89e12}
    row = {
        "kind": "published_fsdp",
        "model": "Llama 2 13B FSDP",
        "nodes": 64,
        "comm_smddp_s": comm["smddp"],
        "comm_stock_s": comm["stock"],
        "step_smddp_s": published["smddp"],
        "step_stock_s": published["stock"],
    }
    print(
        f"Llama 2 13B FSDP, 64 p4d: published steps smddp {published['smddp']:.2f} s, NCCL {published['stock']:.2f} s "
        f"(gap {published['stock'] - published['smddp']:.2f} s); predicted FSDP traffic smddp {comm['smddp']:.2f} s, "
        f"stock {comm['stock']:.2f} s (gap {comm['stock'] - comm['smddp']:.2f} s)",
        flush=True,
    )
    return row


# ---------------------------------------------------------------------------------------------- report
def report(path: str) -> None:
    rows = json.loads(Path(path).read_text())
    coll = [r for r in rows if r["kind"] == "collective"]
    if coll:
        print("| hosts x mbit x ranks (+delay) | op | size | backend (algorithm) | measured | predicted | error | load |\n|---|---|---|---|---|---|---|---|")
        for r in coll:
            algorithm = f" ({r['algorithm']})" if "algorithm" in r else ""
            print(
                f"| {config_name(r)} | {r['op']} | {r['bytes'] >> 10} KiB | {r['backend']}{algorithm} | "
                f"{r['measured_s'] * 1e3:.2f} ms | {r['predicted_s'] * 1e3:.2f} ms | {r['error']:+.1%} | {r['load']} |"
            )
        big = [abs(r["error"]) for r in coll if r["bytes"] >= 1 << 20]
        print(
            f"\n|error| over all {len(coll)} cells: median {statistics.median(abs(r['error']) for r in coll):.1%}, "
            f"max {max(abs(r['error']) for r in coll):.1%}; at >= 1 MiB: median {statistics.median(big):.1%}, max {max(big):.1%}\n"
            if big
            else ""
        )
    ddp = [r for r in rows if r["kind"] == "ddp"]
    if ddp:
        print(
            "| hosts x mbit x ranks (+delay) | collectives | MB/step | compute (before/after) | measured step | predicted (before/after) | error | "
            "without overlap | load |\n|---|---|---|---|---|---|---|---|---|"
        )
        for r in ddp:
            c, p = r["compute_range_s"], r["predicted_range_s"]
            print(
                f"| {config_name(r)} | {r['buckets']} | {r['bytes'] / 1e6:.1f} | {c[0] * 1e3:.1f}/{c[1] * 1e3:.1f} ms | "
                f"{r['measured_s'] * 1e3:.1f} ms | {r['predicted_s'] * 1e3:.1f} ({p[0] * 1e3:.1f}/{p[1] * 1e3:.1f}) ms | "
                f"{r['error']:+.1%} | {r['serial_s'] * 1e3:.1f} ms | {r['load']} |"
            )
        print()
    pub = [r for r in rows if r["kind"] == "published"]
    if pub:
        print("| model | nodes | assumed compute/step | smddp step | stock step | predicted speed-up | published |\n|---|---|---|---|---|---|---|")
        for r in pub:
            print(
                f"| {r['model']} | {r['nodes']} | {r['compute_ms']:.0f} ms | {r['smddp_s'] * 1e3:.0f} ms | {r['stock_s'] * 1e3:.0f} ms | "
                f"{r['predicted_speedup']:+.0%} | {r['published_speedup']:+.0%} |"
            )
    for r in (r for r in rows if r["kind"] == "published_fsdp"):
        print(
            f"\n{r['model']}, {r['nodes']} x p4d.24xlarge: published step (from model TFLOPS) smddp {r['step_smddp_s']:.2f} s, "
            f"NCCL {r['step_stock_s']:.2f} s, gap {r['step_stock_s'] - r['step_smddp_s']:.2f} s; predicted FSDP traffic per step "
            f"smddp {r['comm_smddp_s']:.2f} s, stock {r['comm_stock_s']:.2f} s, gap {r['comm_stock_s'] - r['comm_smddp_s']:.2f} s"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["collectives", "ddp", "published", "report"])
    parser.add_argument("path", nargs="?", help="report: the JSON written by --json")
    parser.add_argument("--configs", default="2x800,3x400,4x100")
    parser.add_argument("--sizes", help="collectives: sizes for link_bench (default by rate)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay between the simulated hosts")
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", help="append results to this file")
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error(f"--delay-ms is a one-way delay in milliseconds, 0 or more; got {args.delay_ms}")
    if args.rank_process:
        ddp_rank(args)
        return 0
    if args.what == "report":
        if not args.path:
            parser.error("report needs the JSON file")
        report(args.path)
        return 0
    if args.what in ("collectives", "ddp"):
        from benchmarks.simhosts import available

        if available():
            print(f"plan_validate: {available()}", file=sys.stderr)
            return 3
    results = {"collectives": run_collectives, "ddp": run_ddp, "published": run_published}[args.what](args)
    if args.json:
        path = Path(args.json)
        path.write_text(json.dumps((json.loads(path.read_text()) if path.exists() else []) + results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
