"""Link benchmark: smddp and gloo between simulated hosts joined by shaped links (needs root).

    sudo python3 benchmarks/link_bench.py --hosts 2 --rate-mbit 800
    sudo python3 benchmarks/link_bench.py --hosts 8 --rate-mbit 1000 --delay-ms 0.5
    sudo python3 benchmarks/link_bench.py --hosts 3 --rate-mbit 4000 --link encrypt --sizes 64K,1M,64M
    python3 benchmarks/link_bench.py --cpu-cost --sizes 64K,1M,64M   # no root: what each protection costs in CPU

Each host is a network namespace (benchmarks/simhosts.py) whose link is a token bucket of ``--rate-mbit``
in both directions, slow enough that the link and not the CPUs is the limit; ``--delay-ms`` adds a one-way
delay between hosts (a delaylink process per host, which costs CPU: docs/planning.md). One rank runs per host
(``--ranks-per-host`` for more); every rank joins the default group with smddp and a second group with gloo
(GLOO_SOCKET_IFNAME=eth0), so both backends move the same data over the same links in one run.
``--link`` chooses how smddp protects its frames between hosts (docs/security.md, "Links between hosts"):
plain, integrity (the default) or encrypt; gloo's frames are plain whatever it says, so it stays the
anchor across runs with different settings.

Every op is checked against a locally computed reference before and after timing. Timing is a loop of
back-to-back calls (no barrier in between, as nccl-tests does) long enough that the token bucket's burst
(``--burst-ms`` of traffic) is a small part of it: about ``--seconds`` of wire time, at most MAX_CALLS
calls; time per call = loop time / calls, slowest rank, median of ``--repeats`` loops. The bucket refills
while hosts compute between calls, so a loop can pass up to one burst more than the rate allows: 10 ms in
0.6 s of wire time (1.7%) from 256 KB at 4000 mbit, 6% at 64 KB (loops of 40 calls showed 105% at 256 KB).
A smaller bucket removes that credit but throttles large flows below the rate (1 ms: 66-84% at 16-64 MB).

Link utilisation = bytes each host must put on its link per call / time per call / link rate:
    all_reduce: 2(H-1)/H * S      (a host sends its (H-1)/H share out, and the reduced shares back)
    all_gather: (H-1)/H * S       (S = gathered output size; a host receives everyone else's part)
    broadcast:  S                 (every host but the root receives the whole message)
with H hosts and S the tensor size; that is nccl-tests' busbw over the shaped rate (rate_mbit * 1e6 / 8
bytes/s). TCP/IP headers take ~4% of the frames, so ~96% is the practical ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.collectives_bench import human, make_case, rank_sweep  # noqa: E402

SIZES = "64K,256K,1M,4M,16M,64M"
MAX_CALLS = 1000  # per timed loop: bounds the time slow backends take at small sizes
LINKS = {"plain": {"SMDDP_LINK_INTEGRITY": "0", "SMDDP_LINK_ENCRYPT": "0"}, "integrity": {"SMDDP_LINK_INTEGRITY": "1", "SMDDP_LINK_ENCRYPT": "0"}, "encrypt": {"SMDDP_LINK_ENCRYPT": "1"}}
PER_LINK_FACTOR = {"allreduce": lambda h: 2 * (h - 1) / h, "allgather": lambda h: (h - 1) / h, "broadcast": lambda h: 1.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=1)
    parser.add_argument("--rate-mbit", type=float, default=800.0, help="shaped rate of every host link, each direction")
    parser.add_argument("--burst-ms", type=float, default=10.0, help="token bucket size, in ms of traffic at the rate")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay between hosts (added on each host's sends)")
    parser.add_argument("--ops", default="allgather,allreduce")
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--seconds", type=float, default=0.6, help="rough length of one timed loop")
    parser.add_argument("--repeats", type=int, default=3, help="timed loops per op, size and backend (median reported)")
    parser.add_argument("--backends", default="smddp,gloo")
    parser.add_argument("--link", choices=LINKS, default="integrity", help="smddp's protection of frames between hosts")
    parser.add_argument("--timeout", type=float, default=900, help="the whole run is killed after this many seconds")
    parser.add_argument("--json", help="append results to this file")
    parser.add_argument("--cpu-cost", action="store_true", help="instead: CPU per byte of each --link setting, two mesh ends in this process over loopback")
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.ops.split(",")) - set(PER_LINK_FACTOR)
    if unknown:
        parser.error(f"unknown op(s) {sorted(unknown)}: choose from {sorted(PER_LINK_FACTOR)}")
    if args.delay_ms < 0:
        parser.error(f"--delay-ms is a one-way delay in milliseconds, 0 or more; got {args.delay_ms}")
    return args


# ----------------------------------------------------------------------------------------------- ranks
def rank_main(args: argparse.Namespace) -> None:
    rank_sweep(
        args,
        lambda op, size, group, rank, n: measure_loop(op, size, group, args, rank, n),
        print_row,
        hosts=args.hosts,
        rate_mbit=args.rate_mbit,
        delay_ms=args.delay_ms,
        link=args.link,
    )


def measure_loop(op: str, size: int, group, args: argparse.Namespace, rank: int, n: int) -> dict:
    import torch
    import torch.distributed as dist

    run, check, reset = make_case(op, size, torch.float32, rank, n)
    reset = reset or (lambda: None)
    reset()
    run(group)
    check()  # verified before anything is timed
    reset()
    wire_s = PER_LINK_FACTOR[op](args.hosts) * size / (args.rate_mbit * 1e6 / 8)
    latency_s = 2 * (args.hosts - 1) * args.delay_ms / 1e3  # a ring's, the most any algorithm pays
    calls = max(2, min(MAX_CALLS, round(args.seconds / (wire_s + latency_s))))
    per_call = []
    for _ in range(args.repeats):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            run(group)  # all_reduce sums keep growing inside the loop: fine in float32, and reset after
        elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        per_call.append(float(elapsed))
    reset()
    run(group)
    check()  # and again after timing
    seconds = statistics.median(per_call)
    link_bytes = PER_LINK_FACTOR[op](args.hosts) * size
    return {"time_s": seconds, "calls": calls, "repeats": per_call, "link_bytes_per_s": link_bytes / seconds, "utilisation": link_bytes / seconds / (args.rate_mbit * 1e6 / 8)}


def print_row(row: dict, backends: list[str], first: bool) -> None:
    if first:
        head = (
            f"\n{row['op']}: {row['hosts']} hosts x {row['n'] // row['hosts']} rank(s), links {row['rate_mbit']:g} mbit, "
            f"{row['delay_ms']:g} ms one way, smddp frames {row['link']} "
            f"(time per call, median of loops; util = per-link bytes/s / link rate)\n{'size':>6}"
        )
        for name in backends:
            head += f" | {name + ' time':>12} {'MB/s':>7} {'util':>6}"
        if len(backends) == 2:
            head += f" | {'speed-up':>8}"
        print(head, flush=True)
    line = f"{human(row['size']):>6}"
    for name in backends:
        r = row[name]
        line += f" | {r['time_s'] * 1e3:9.2f} ms {r['link_bytes_per_s'] / 1e6:7.1f} {r['utilisation']:6.1%}"
    if len(backends) == 2:
        a, b = (row[name] for name in backends)
        line += f" | {b['time_s'] / a['time_s']:7.2f}x"
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------- driver
def rank_env(rank: int, args: argparse.Namespace, names: list[str], addresses: dict[str, str]) -> dict[str, str]:
    host = names[rank // args.ranks_per_host]
    project_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(args.hosts * args.ranks_per_host),
            "LOCAL_RANK": str(rank % args.ranks_per_host),
            "LOCAL_WORLD_SIZE": str(args.ranks_per_host),
            "MASTER_ADDR": addresses[names[0]],
            "MASTER_PORT": "29511",
            "SM_CURRENT_HOST": host,
            "SMDDP_HOST_ADDRESSES": json.dumps(addresses),
            "GLOO_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [project_root, os.environ.get("PYTHONPATH")])),
            **LINKS[args.link],
        }
    )
    return env


def cpu_cost(args: argparse.Namespace) -> None:
    """Both ends of one link in this process (native loop) exchange size bytes each way, for each
    protection in turn (plain first: the anchor), checked before and after timing; CPU seconds of the
    process (both ends) per exchanged byte and wall time, median of --repeats loops."""
    import threading

    from benchmarks.collectives_bench import parse_size
    from smddp_sdk.collectives.calls import Call
    from smddp_sdk.collectives.tcp import TcpMesh

    describe = {0: "rank 0 (host a)", 1: "rank 1 (host b)"}
    print(f"load before: {os.getloadavg()[0]:.1f}\n{'size':>6} | {'link':>9} | {'CPU ns/byte':>11} | {'x plain':>7} | {'wall ms':>8}", flush=True)
    for size in map(parse_size, args.sizes.split(",")):
        data = [os.urandom(size), os.urandom(size)]
        anchor = None
        for link in LINKS:
            ends = [TcpMesh(node, "bench " + str(size), describe, "127.0.0.1", True, link) for node in (0, 1)]
            thread = threading.Thread(target=ends[0].connect, args=({1: ("127.0.0.1", 0)}, time.monotonic() + 30))
            thread.start()
            ends[1].connect({0: ("127.0.0.1", ends[0].port)}, time.monotonic() + 30)
            thread.join()
            into = [bytearray(size), bytearray(size)]

            def exchange(node: int) -> None:
                ends[node].begin(Call("all_gather"))
                ends[node].exchange({1 - node: [memoryview(data[node])]}, {1 - node: [memoryview(into[node])]}, "bench", time.monotonic() + 60)

            def both() -> None:
                other = threading.Thread(target=exchange, args=(1,))
                other.start()
                exchange(0)
                other.join()

            both()
            assert into == [data[1], data[0]], "the link corrupted the data"
            calls = max(3, min(200, (64 << 20) // size))
            samples = []
            for _ in range(args.repeats):
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    both()
                samples.append(((time.process_time() - cpu) / (calls * 2 * size), (time.perf_counter() - wall) / calls))
            into = [bytearray(size), bytearray(size)]
            both()
            assert into == [data[1], data[0]], "the link corrupted the data"
            for end in ends:
                end.close()
            cpu_s, wall_s = statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)
            anchor = anchor or cpu_s
            print(f"{human(size):>6} | {link:>9} | {cpu_s * 1e9:11.3f} | {cpu_s / anchor:7.2f} | {wall_s * 1e3:8.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}", flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.cpu_cost:
        cpu_cost(args)
        return 0
    if args.rank_process:
        rank_main(args)
        return 0
    from benchmarks.simhosts import SimHosts, available

    reason = available()
    if reason:
        print(f"link_bench: {reason}", file=sys.stderr)
        return 3
    forwarded = [a for a in argv if a != "--rank-process"]
    with SimHosts(args.hosts, rate_mbit=args.rate_mbit, burst_ms=args.burst_ms, delay_ms=args.delay_ms) as hosts:
        procs = [
            hosts.popen(rank // args.ranks_per_host, [sys.executable, __file__, "--rank-process", *forwarded], env=rank_env(rank, args, hosts.names, hosts.addresses))
            for rank in range(args.hosts * args.ranks_per_host)
        ]
        return wait_all(procs, time.monotonic() + args.timeout)


def wait_all(procs: list[subprocess.Popen], deadline: float) -> int:
    """Wait for every rank; past the deadline (or when one fails) the rest are killed, never left behind."""
    codes: list[int] = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            if codes[-1] != 0:
                break
    except subprocess.TimeoutExpired:
        print("link_bench: timed out; stopping the ranks", file=sys.stderr)
        codes.append(124)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return max(codes, key=abs) if codes else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
