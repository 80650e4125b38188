"""DDP end-to-end benchmark: step time against the machine's bound for DDP, and against one process.

    python benchmarks/ddp_bench.py --world-sizes 2,4 --steps 20 --repeat 3
    sudo python benchmarks/ddp_bench.py --world-sizes 2,4,2x2 --link-mbit 4000 --repeat 3
    python benchmarks/ddp_bench.py --world-sizes 2 --configs smddp:smddp,smddp:torch --breakdown

Each configuration is BACKEND:DDP, where DDP is `smddp` (smddp_sdk.collectives.ddp.DistributedDataParallel)
or `torch` (torch.nn.parallel.DistributedDataParallel, which gets smddp's comm hook over an smddp group);
`none` trains without gradient exchange: `local:none` runs n processes side by side, independently, and
`smddp:none` runs them in lockstep (each step ends with a tiny exchange over a side gloo group, as DDP
steps end with the reduction), so that every rank's memory-bound phases (the optimizer, say) coincide
and share the memory bandwidth.

**The bound.** `smddp:none` also times the all_reduce of a tensor the size of the gradients alone
(AVG over smddp, barrier before each call, slowest rank, median). A DDP step cannot beat the lockstep
step plus that all_reduce by more than what overlap with backward hides, and on a CPU where every core
computes during backward little is hidden: `bound` = lockstep step + all_reduce, and each
configuration's `of bound` = bound / its step (1.00: at the bound). Both come from the same round.
The same in CPU seconds of all ranks per step (`CPU of bound`; every thread counts, the communication
thread's too) measures the work each configuration adds, which load from elsewhere stretches far less
than wall time.

The model is an MLP (512 -> hidden x layers -> 512, 10.5M parameters by default), SGD with momentum,
`--batch-size` samples per rank, one torch thread per rank. The one-process baseline trains the same model
without DDP; `efficiency` = samples/s at n ranks / (n x samples/s of one process).

Step time is the median over the timed steps of the slowest rank's step. `--repeat` runs every
configuration again, round after round, each round in a rotated order so that load from elsewhere hits
every configuration alike; the table shows medians over rounds and the range. After training, every
rank's parameter digest must match (checked over a separate gloo group), or the benchmark fails.

`--breakdown` instead trains each DDP configuration once more under torch.profiler and prints, per step
of rank 0: forward, backward, optimizer; within backward the copies into DDP's buckets, the copies back
into `param.grad`, allocations, and the time outside autograd's operators (mostly waiting for the last
bucket's reduction at the end of backward); and the reduction itself, timed on the communication thread
(it overlaps backward).

`--world-sizes` lists layouts: `N` is N ranks on one host, `HxR` is H simulated hosts of R ranks each. With
`--link-mbit RATE` the simulated hosts are network namespaces joined by links shaped to RATE in both
directions (benchmarks/simhosts.py, needs root); without it they talk TCP over loopback. Every layout
gets its own bound, measured in the same layout.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smddp_sdk.runtime.env import MALLOC_KEEPS_MEMORY  # noqa: E402 - what the runtime gives every rank

DDP_IMPLEMENTATIONS = ("smddp", "torch", "none")
BOUND_CONFIG = ("smddp", "none")  # lockstep without exchange, and the gradient all_reduce alone
PHASES = ("forward", "backward", "optimizer")
RUN_TIMEOUT_S = 900  # one configuration's processes, simulated hosts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2", help="comma-separated layouts: N (ranks on one host) or HxR (H simulated hosts of R ranks)")
    parser.add_argument("--link-mbit", type=float, help="shape the links between simulated hosts to this rate (network namespaces, needs root)")
    parser.add_argument("--configs", default="local:none,smddp:none,smddp:smddp,smddp:torch,gloo:torch", help="comma-separated BACKEND:DDP pairs; DDP is smddp, torch or none (see above)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every configuration and the baseline")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--bucket-cap-mb", type=float, default=25)
    parser.add_argument("--gradient-as-bucket-view", action=argparse.BooleanOptionalAction, help="torch's DDP option; left out: DDP's default (True over smddp, see ddp.install_default_hook)")
    parser.add_argument("--breakdown", action="store_true", help="profile each DDP configuration's step instead (see above)")
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


Sync = Callable[[float, float], tuple[float, float]]


def train(model, args: argparse.Namespace, rank: int, sync: Sync, steps: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each step after the warm-up steps; sync(wall, cpu) returns the slowest rank's
    wall time and the CPU time of all ranks together (every thread: the communication thread's too)."""
    import torch
    from torch.profiler import record_function

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(args.warmup + steps):
        x = torch.randn(args.batch_size, 512, generator=gen)
        y = torch.randn(args.batch_size, 512, generator=gen)
        start, cpu_start = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with record_function("forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        if step >= args.warmup:
            times.append(sync(elapsed, cpu))
    return times


def digest(model) -> str:
    from smddp_sdk.collectives.memory import memview

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(memview(p.detach().contiguous()))
    return h.hexdigest()


def time_allreduce(model, steps: int, slowest: Sync) -> tuple[float, float]:
    """Median (wall, CPU of all ranks) of the all_reduce (AVG) of one tensor the size of the model's
    gradients, alone."""
    import torch
    import torch.distributed as dist

    grads = torch.randn(sum(p.numel() for p in model.parameters()))
    times = []
    for _ in range(steps + 2):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        dist.all_reduce(grads, op=dist.ReduceOp.AVG)
        times.append(slowest(time.perf_counter() - start, time.process_time() - cpu_start))
    return statistics.median(t[0] for t in times[2:]), statistics.median(t[1] for t in times[2:])


class ReductionTimer:
    """Seconds the group's communication thread spends reducing (DDP buckets: the core's all_reduce, or
    the shared-buffer reduction of smddp's DDP), peer waits at its barriers included."""

    def __init__(self, group) -> None:
        self.seconds = 0.0
        self._wrap(group, "_core_allreduce", counts=bool)  # False: not run there, the Python path follows
        self._wrap(group._comm, "allreduce")
        self._wrap(group._comm, "allreduce_shared")

    def _wrap(self, owner: object, name: str, counts: Callable[[object], bool] = lambda _: True) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = inner(*args, **kwargs)
            if counts(result):
                self.seconds += time.perf_counter() - start
            return result

        setattr(owner, name, timed)


def breakdown(profile, steps: int, reduction_s: float) -> dict[str, float]:
    """Milliseconds per step of rank 0's main thread (see the module docstring)."""
    events = profile.events()
    by_phase = {name: [e for e in events if e.name == name] for name in PHASES}
    row = {name: sum(e.cpu_time_total for e in found) / 1e3 / steps for name, found in by_phase.items()}
    copy_in = copy_out = alloc = inside_ops = 0.0
    for phase in by_phase["backward"]:
        for event in _descendants(phase):
            names = [a.name for a in _ancestors(event)]
            if event.name in ("aten::copy_", "aten::mul") and any("AccumulateGrad" in n for n in names) and not any("copy_bucket_to_grad" in n for n in names):
                copy_in += event.cpu_time_total
            elif "copy_bucket_to_grad" in event.name:
                copy_out += event.cpu_time_total
            elif event.name in ("aten::empty", "aten::empty_strided", "aten::empty_like"):
                alloc += event.self_cpu_time_total
        inside_ops += sum(child.cpu_time_total for child in phase.cpu_children)
    row.update(
        {
            "copy_in": copy_in / 1e3 / steps,
            "copy_out": copy_out / 1e3 / steps,
            "alloc": alloc / 1e3 / steps,
            "outside_ops": row["backward"] - inside_ops / 1e3 / steps,
            "reduction": reduction_s * 1e3 / steps,
        }
    )
    return row


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _ancestors(event):
    while event.cpu_parent is not None:
        event = event.cpu_parent
        yield event


@dataclass(frozen=True)
class Layout:
    """hosts simulated hosts of per_host ranks each."""

    hosts: int
    per_host: int

    @property
    def n(self) -> int:
        return self.hosts * self.per_host

    def __str__(self) -> str:
        return str(self.per_host) if self.hosts == 1 else f"{self.hosts}x{self.per_host}"


ONE_PROCESS = Layout(1, 1)


def parse_layouts(text: str) -> list[Layout]:
    layouts = []
    for item in text.split(","):
        hosts, _, per_host = item.strip().rpartition("x")
        if not per_host.isdigit() or not (hosts or "1").isdigit() or int(per_host) < 1 or int(hosts or 1) < 1:
            raise SystemExit(f"--world-sizes: {item!r} is not N (ranks on one host) or HxR (H hosts of R ranks), e.g. 2,4,2x2")
        layouts.append(Layout(int(hosts or 1), int(per_host)))
    return layouts


def rank_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    if args.backend == "local":  # no communication: the baseline, or n independent processes side by side
        steps = train(build_model(args), args, 0, lambda wall, cpu: (wall, cpu), args.steps)
        Path(f"{args.result_file}.{os.environ.get('RANK', '0')}").write_text(json.dumps({"times": [wall for wall, _ in steps]}))
        return
    import torch.distributed as dist

    from smddp_sdk.collectives.ddp import DistributedDataParallel, smddp_backend

    dist.init_process_group(args.backend)
    side = dist.new_group(backend="gloo")  # step-time and digest exchange, off the measured path
    if args.ddp == "none":  # steps in lockstep (the timing exchange below), no gradient exchange
        model = build_model(args)
    elif args.ddp == "smddp":
        model = DistributedDataParallel(build_model(args), bucket_cap_mb=args.bucket_cap_mb)
    else:
        options = {} if args.gradient_as_bucket_view is None else {"gradient_as_bucket_view": args.gradient_as_bucket_view}
        model = torch.nn.parallel.DistributedDataParallel(build_model(args), bucket_cap_mb=args.bucket_cap_mb, **options)

    def slowest(elapsed: float, cpu: float) -> tuple[float, float]:
        box = [None] * dist.get_world_size()
        dist.all_gather_object(box, (elapsed, cpu), group=side)
        return max(wall for wall, _ in box), sum(used for _, used in box)

    result: dict = {}
    if args.breakdown:
        from torch.profiler import ProfilerActivity, profile

        group = smddp_backend(None)
        timer = ReductionTimer(group) if group is not None else None
        train(model, args, dist.get_rank(), slowest, 0)  # warm-up outside the profile
        args.warmup = 0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result["times"] = [wall for wall, _ in train(model, args, dist.get_rank(), slowest, args.steps)]
        result["breakdown"] = breakdown(prof, args.steps, timer.seconds if timer else float("nan"))
    else:
        steps = train(model, args, dist.get_rank(), slowest, args.steps)
        result["times"], result["cpu"] = [wall for wall, _ in steps], [cpu for _, cpu in steps]
        if args.ddp == "none" and args.backend == "smddp":
            result["allreduce_s"], result["allreduce_cpu_s"] = time_allreduce(model, args.steps, slowest)
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest(getattr(model, "module", model)), group=side)
    result["identical"] = len(set(digests)) == 1 if args.ddp != "none" else None  # nothing keeps them equal
    if dist.get_rank() == 0:
        Path(args.result_file).write_text(json.dumps(result))
    dist.destroy_process_group()


def launch(args: argparse.Namespace, rank_args: list[str], layout: Layout) -> int:
    from benchmarks.launch import run_ranks

    env = {"GLIBC_TUNABLES": MALLOC_KEEPS_MEMORY}
    if layout.hosts == 1 or args.link_mbit is None:
        return run_ranks(__file__, rank_args, layout.n, hosts=layout.hosts, env=env)
    from benchmarks.link_bench import rank_env, wait_all
    from benchmarks.simhosts import SimHosts

    placement = argparse.Namespace(hosts=layout.hosts, ranks_per_host=layout.per_host)
    argv = [sys.executable, __file__, "--rank-process", *rank_args]
    with SimHosts(layout.hosts, rate_mbit=args.link_mbit) as sim:
        procs = [sim.popen(rank // layout.per_host, argv, env={**rank_env(rank, placement, sim.names, sim.addresses), **env}) for rank in range(layout.n)]
        return wait_all(procs, time.monotonic() + RUN_TIMEOUT_S)


def run(args: argparse.Namespace, argv: list[str], config: tuple[str, str], layout: Layout) -> dict:
    backend, ddp = config
    n = layout.n
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        code = launch(args, [*argv, "--backend", backend, "--ddp", ddp, "--result-file", result], layout)
        if code != 0:
            raise SystemExit(f"{backend} with {ddp} DDP and {layout} ranks failed (exit {code})")
        if backend == "local":
            steps = [statistics.median(json.loads(Path(f"{result}.{r}").read_text())["times"]) for r in range(n)]
            data = {"times": [max(steps)]}
        else:
            data = json.loads(Path(result).read_text())
    step = statistics.median(data["times"])
    cpu = statistics.median(data["cpu"]) if data.get("cpu") else None
    return {
        "backend": backend,
        "ddp": ddp,
        "n": n,
        "layout": str(layout),
        "link_mbit": args.link_mbit if layout.hosts > 1 else None,
        "step_s": step,
        "cpu_s": cpu,
        "samples_s": n * args.batch_size / step,
        "identical": data.get("identical"),
        "allreduce_s": data.get("allreduce_s"),
        "allreduce_cpu_s": data.get("allreduce_cpu_s"),
        "breakdown": data.get("breakdown"),
    }


def parse_configs(text: str) -> list[tuple[str, str]]:
    configs = []
    for item in text.split(","):
        backend, _, ddp = item.partition(":")
        if ddp not in DDP_IMPLEMENTATIONS or (backend == "local" and ddp != "none"):
            raise SystemExit(f"--configs: {item!r} is not BACKEND:DDP with DDP one of {', '.join(DDP_IMPLEMENTATIONS)} (for example smddp:smddp, gloo:torch or local:none)")
        configs.append((backend, ddp))
    return configs


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def summarize(rounds: list[dict[tuple, dict]], keys: list[tuple]) -> list[dict]:
    """One row per configuration: medians over rounds; efficiency against the same round's one process,
    `of_bound` against the same round's bound (lockstep step + all_reduce alone, same layout), and
    `cpu_of_bound` the same in CPU time of all ranks (less sensitive to load from elsewhere)."""
    rows = []
    for key in keys:
        runs = [r[key] for r in rounds]
        base = [r[(("local", "none"), ONE_PROCESS)] for r in rounds]
        bounds = [r.get((BOUND_CONFIG, key[1])) for r in rounds]
        row = {
            **runs[0],
            "rounds": len(runs),
            "step_s": statistics.median(run["step_s"] for run in runs),
            "step_s_per_round": [run["step_s"] for run in runs],
            "samples_s": statistics.median(run["samples_s"] for run in runs),
            "efficiency": _spread([run["samples_s"] / (run["n"] * b["samples_s"]) for run, b in zip(runs, base)]),
            "identical": None if runs[0]["identical"] is None else all(run["identical"] for run in runs),
        }
        if all(b is not None for b in bounds):
            limit = [b["step_s"] + b["allreduce_s"] for b in bounds]
            row["bound_s"] = statistics.median(limit)
            row["of_bound"] = _spread([lim / run["step_s"] for lim, run in zip(limit, runs)])
            if runs[0]["cpu_s"] is not None:
                cpu_limit = [b["cpu_s"] + b["allreduce_cpu_s"] for b in bounds]
                row["cpu_s"] = statistics.median(run["cpu_s"] for run in runs)
                row["cpu_bound_s"] = statistics.median(cpu_limit)
                row["cpu_of_bound"] = _spread([lim / run["cpu_s"] for lim, run in zip(cpu_limit, runs)])
        if runs[0]["allreduce_s"] is not None:
            row["allreduce_s"] = statistics.median(run["allreduce_s"] for run in runs)
            row["allreduce_cpu_s"] = statistics.median(run["allreduce_cpu_s"] for run in runs)
        rows.append(row)
    return rows


def _with_range(spread: dict | None) -> str:
    return f"{spread['median']:5.2f} ({spread['range'][0]:.2f}-{spread['range'][1]:.2f})" if spread else f"{'-':>15}"


def _ms(row: dict, key: str) -> str:
    return f"{row[key] * 1e3:7.1f} ms" if row.get(key) is not None else f"{'-':>10}"


def print_rows(rows: list[dict]) -> None:
    print(f"{'backend':>8} {'ddp':>6} {'ranks':>5} {'step':>10} {'efficiency':>15} {'bound':>10} {'of bound':>15} {'CPU/step':>10} {'CPU bound':>10} {'CPU of bound':>15} {'identical':>9}")
    for row in rows:
        print(
            f"{row['backend']:>8} {row['ddp']:>6} {row['layout']:>5} {_ms(row, 'step_s')} {_with_range(row['efficiency'])} "
            f"{_ms(row, 'bound_s')} {_with_range(row.get('of_bound'))} {_ms(row, 'cpu_s')} {_ms(row, 'cpu_bound_s')} "
            f"{_with_range(row.get('cpu_of_bound'))} {'-' if row['identical'] is None else str(row['identical']):>9}"
            + (f"   all_reduce alone {row['allreduce_s'] * 1e3:.1f} ms, CPU {row['allreduce_cpu_s'] * 1e3:.1f} ms" if row.get("allreduce_s") is not None else ""),
            flush=True,
        )


def print_breakdown(results: list[dict]) -> None:
    columns = ("step", *PHASES, "copy_in", "copy_out", "alloc", "outside_ops", "reduction")
    print("ms per step (rank 0): " + " | ".join(columns))
    for r in results:
        values = {"step": r["step_s"] * 1e3, **r["breakdown"]}
        print(f"{r['backend']}:{r['ddp']} x{r['layout']}: " + " | ".join(f"{values[c]:.1f}" for c in columns), flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rank_process:
        rank_main(args)
        return 0
    configs = parse_configs(args.configs)
    layouts = parse_layouts(args.world_sizes)
    if args.link_mbit is not None and any(layout.hosts > 1 for layout in layouts):
        from benchmarks.simhosts import available

        if reason := available():
            print(f"ddp_bench: --link-mbit: {reason}", file=sys.stderr)
            return 2
    params = sum(p.numel() for p in build_model(args).parameters())
    print(
        f"MLP {params / 1e6:.1f}M parameters, batch {args.batch_size} per rank, {args.steps} timed steps, "
        f"bucket {args.bucket_cap_mb} MB, gradient_as_bucket_view={'default' if args.gradient_as_bucket_view is None else args.gradient_as_bucket_view} (torch DDP), "
        f"{args.repeat} round(s)"
        + (f", links between simulated hosts shaped to {args.link_mbit:g} mbit" if args.link_mbit else "")
        + f", load average {os.getloadavg()[0]:.1f}, GLIBC_TUNABLES={MALLOC_KEEPS_MEMORY}",
        flush=True,
    )
    if args.breakdown:
        print_breakdown([run(args, argv, config, layout) for config, layout in itertools.product(configs, layouts) if config[1] != "none"])
        return 0
    keys = [(("local", "none"), ONE_PROCESS)] + [(config, layout) for layout in layouts for config in configs]
    if any(key[0][1] != "none" for key in keys):
        keys += [(BOUND_CONFIG, layout) for layout in layouts if (BOUND_CONFIG, layout) not in keys]  # the bound is always measured
    rounds = []
    for index in range(args.repeat):
        order = keys[index % len(keys) :] + keys[: index % len(keys)]  # rotated: load hits every configuration alike
        rounds.append({(config, layout): run(args, argv, config, layout) for config, layout in order})
        print(
            f"round {index + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(f"{config[0]}/{config[1]} x{layout} {rounds[-1][(config, layout)]['step_s'] * 1e3:.1f} ms" for config, layout in keys),
            flush=True,
        )
    rows = summarize(rounds, keys)
    if args.json:  # first: the rounds are kept whatever the printing does
        path = Path(args.json)
        path.write_text(json.dumps((json.loads(path.read_text()) if path.exists() else []) + rows, indent=1))
    print_rows(rows)
    return 1 if any(row["identical"] is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
