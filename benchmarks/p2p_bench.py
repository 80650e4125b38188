"""Point-to-point benchmark: ping-pong between two ranks over smddp, gloo and Open MPI in the same run.

    bash benchmarks/setup-mpi.sh                 # once: Open MPI and mpi4py (the anchor)
    python3 benchmarks/p2p_bench.py              # 2 ranks on one host (smddp: shared-memory ring + single copy)
    python3 benchmarks/p2p_bench.py --hosts 2    # 2 simulated hosts (smddp: TCP with integrity records)

Rank 0 sends a buffer, rank 1 receives it and sends it back; one-way time = round trip / 2, bandwidth =
size / one-way time. Before timing every backend's round trip is checked (rank 1 verifies what arrived,
rank 0 verifies the echo). Each size runs --rounds rounds of ping-pongs; a round's time per message is its
mean, and the table gives the median over rounds. Open MPI runs through mpirun (mpi4py, numpy buffers,
shared memory with CMA on one host; with --hosts 2 it is pinned to TCP over loopback, as smddp's
simulated hosts are); smddp and gloo run in the same two processes, interleaved size by size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = "8,1K,64K,1M,16M,64M"
UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def pattern(nbytes: int, salt: int) -> bytes:
    return bytes((i * 7 + salt) % 251 for i in range(min(nbytes, 4096))) * (nbytes // 4096 + 1)


def iterations(nbytes: int) -> int:
    return max(3, min(200, (64 << 20) // max(nbytes, 1) // 4))


def ping_pong(rank: int, send, recv, buf, check, nbytes: int, rounds: int) -> list[float]:
    """Verify one round trip, then time rounds of ping-pongs; per round the one-way time of a message."""
    if rank == 0:
        send(buf)
        recv(buf)
        check(buf, "echo")
    else:
        recv(buf)
        check(buf, "ping")
        send(buf)
    times = []
    n = iterations(nbytes)
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            if rank == 0:
                send(buf)
                recv(buf)
            else:
                recv(buf)
                send(buf)
        times.append((time.perf_counter() - start) / n / 2)
    return times


def torch_rank(rank: int, store_port: int, sizes: list[int], rounds: int) -> None:
    import torch
    import torch.distributed as dist

    import smddp_sdk.collectives  # noqa: F401 - registers smddp

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("smddp", store=dist.PrefixStore("smddp/", store), rank=rank, world_size=2)
    gloo = dist.new_group(backend="gloo")
    peer = 1 - rank
    results: dict[str, dict[int, list[float]]] = {"smddp": {}, "gloo": {}}
    for nbytes in sizes:
        expected = torch.frombuffer(bytearray(pattern(nbytes, 3)[:nbytes]), dtype=torch.uint8)

        def check(buf, what: str) -> None:
            if not torch.equal(buf, expected):
                raise SystemExit(f"p2p_bench: {what} of {nbytes} bytes arrived wrong")

        for backend, group in (("smddp", None), ("gloo", gloo)):
            buf = expected.clone() if rank == 0 else torch.zeros(nbytes, dtype=torch.uint8)
            results[backend][nbytes] = ping_pong(rank, lambda b, g=group: dist.send(b, peer, group=g),
                                                 lambda b, g=group: dist.recv(b, peer, group=g), buf, check, nbytes, rounds)
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def mpi_rank(sizes: list[int], rounds: int) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    results: dict[int, list[float]] = {}
    for nbytes in sizes:
        expected = np.frombuffer(pattern(nbytes, 3)[:nbytes], dtype=np.uint8)

        def check(buf, what: str) -> None:
            if not np.array_equal(buf, expected):
                raise SystemExit(f"p2p_bench: MPI {what} of {nbytes} bytes arrived wrong")

        buf = expected.copy() if rank == 0 else np.zeros(nbytes, dtype=np.uint8)
        results[nbytes] = ping_pong(rank, lambda b: comm.Send(b, peer), lambda b: comm.Recv(b, peer), buf, check, nbytes, rounds)
    if rank == 0:
        print(json.dumps({"mpi": results}), flush=True)


def run_torch(args: argparse.Namespace, sizes: list[int]) -> dict:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    hosts = ["algo-1", "algo-2"] if args.hosts == 2 else ["algo-1", "algo-1"]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "SM_CURRENT_HOST": hosts[rank], "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        procs.append(subprocess.Popen([sys.executable, __file__, "--torch-rank", str(rank), "--store-port", str(store.port),
                                       "--sizes", args.sizes, "--rounds", str(args.rounds)], env=env, stdout=subprocess.PIPE, text=True))
    outs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"p2p_bench: a torch rank failed: {outs}")
    return json.loads(outs[0].strip().splitlines()[-1])


def run_mpi(args: argparse.Namespace) -> dict:
    if not shutil.which("mpirun"):
        print("p2p_bench: no mpirun (bash benchmarks/setup-mpi.sh): Open MPI left out", file=sys.stderr)
        return {"mpi": {}}
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2"]
    if args.hosts == 2:
        command += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
    command += [sys.executable, __file__, "--mpi-rank", "--sizes", args.sizes, "--rounds", str(args.rounds)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def fmt(seconds: float, nbytes: int) -> str:
    latency = f"{seconds * 1e6:.1f} us"
    return latency if nbytes < (64 << 10) else f"{latency} {nbytes / seconds / 1e9:.2f} GB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1, choices=[1, 2])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--torch-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mpi-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.torch_rank is not None:
        return torch_rank(args.torch_rank, args.store_port, sizes, args.rounds)
    if args.mpi_rank:
        return mpi_rank(sizes, args.rounds)
    load = os.getloadavg()
    results = {**run_torch(args, sizes), **run_mpi(args)}
    print(f"p2p ping-pong, 2 ranks, {'2 simulated hosts' if args.hosts == 2 else 'one host'}; median of {args.rounds} rounds "
          f"(one-way time, bandwidth); load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'bytes':>9} {'smddp':>22} {'gloo':>22} {'Open MPI':>22} {'smddp/MPI':>9} {'smddp/gloo':>10}")
    rows = []
    for nbytes in sizes:
        medians = {name: statistics.median(results[name][str(nbytes)]) if str(nbytes) in results[name] else None
                   for name in ("smddp", "gloo", "mpi")}
        rows.append({"bytes": nbytes, **medians})
        cells = [fmt(m, nbytes) if m else "-" for m in medians.values()]
        ratio_mpi = f"{medians['smddp'] / medians['mpi']:.2f}x" if medians["mpi"] else "-"
        print(f"{nbytes:>9} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} {ratio_mpi:>9} {medians['smddp'] / medians['gloo']:>9.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"hosts": args.hosts, "load": load, "rows": rows}, indent=1))
    return None


if __name__ == "__main__":
    main()
