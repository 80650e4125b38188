"""Simulated hosts: network namespaces joined by a private bridge, each with its own address and an
optionally shaped link, so that traffic between "hosts" crosses a real (virtual) network on one machine.

Needs root and iproute2. Nothing is routed outside the bridge: the bridge has no address in the root
namespace, so the hosts reach only each other. Everything is removed on exit, also after errors.

    with SimHosts(2, rate_mbit=1000, delay_ms=0.5) as hosts:
        hosts.run(0, ["python3", "-c", "print('hello from algo-1')"])

    sudo python3 benchmarks/simhosts.py --rate-mbit 1000 --delay-ms 0.5    # the link's RTT, rate and CPU cost

A host's link is a veth pair, or, with ``delay_ms``, two TAP devices joined by a delaylink process
(benchmarks/delaylink/delaylink.c, compiled with cc on first use): this kernel has no netem, so the
one-way delay is added in user space, on each host's sends (host to host: ``delay_ms`` one way, twice
that round trip). Delayed links carry large frames (DELAY_LINK_MTU) so that the process copies few.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Frames through the delaylink process: 64000-byte frames cost it ~half the CPU of 9000-byte ones and carry
# TCP at 99.9% payload (measured: 998 against 878 mbit/s of payload at 1000 mbit, 0.5 ms).
from smddp_sdk.planning.hardware import DELAY_LINK_MTU, VETH_MTU  # noqa: E402

_instances = itertools.count()
SUBNET = "10.221.0"  # hosts get SUBNET.1 .. SUBNET.N inside their namespaces only
DELAY_LINK_SOURCE = Path(__file__).with_name("delaylink") / "delaylink.c"


def available() -> str:
    """ "" when simulated hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"simulated hosts need iproute2 ({', '.join(missing)} not found)"
    return ""


def _exit_on_sigterm() -> None:
    """SIGTERM (kill, timeout) ends the process through SystemExit, so that ``close`` still removes the
    namespaces, bridge and links; by default it would end it at once and leave them behind."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def delay_link_binary() -> Path:
    """delaylink.c compiled with cc into the user's cache, keyed by the source's hash (write, then rename)."""
    source = DELAY_LINK_SOURCE.read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smddp-sdk"
    binary = cache / f"delaylink-{hashlib.sha256(source).hexdigest()[:16]}"
    if binary.exists():
        return binary
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("delayed simulated links need a C compiler (cc) to build benchmarks/delaylink/delaylink.c")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        built = Path(tmp) / binary.name
        _check([compiler, "-O2", "-Wall", "-o", str(built), str(DELAY_LINK_SOURCE)])
        built.replace(binary)
    return binary


@dataclass
class SimHosts:
    """``count`` hosts named algo-1..N; ``rate_mbit`` shapes every host's link in both directions, with
    a token bucket that holds ``burst_ms`` of traffic at that rate; ``delay_ms`` delays every host's sends."""

    count: int
    rate_mbit: float | None = None
    burst_ms: float = 10.0
    delay_ms: float = 0.0
    # Unique per instance: removed veth peers vanish asynchronously, so names are never reused at once.
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}{next(_instances) % 100}")
    _undo: list[list[str]] = field(default_factory=list, init=False)
    _links: list[subprocess.Popen[str]] = field(default_factory=list, init=False)

    @property
    def names(self) -> list[str]:
        return [f"algo-{i}" for i in range(1, self.count + 1)]

    @property
    def addresses(self) -> dict[str, str]:
        return {name: f"{SUBNET}.{i}" for i, name in enumerate(self.names, start=1)}

    def namespace(self, index: int) -> str:
        return f"smddp{self.tag}-{index + 1}"

    def __enter__(self) -> SimHosts:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms is a one-way delay in milliseconds, 0 or more; got {self.delay_ms}")
        _exit_on_sigterm()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        bridge = f"smbr{self.tag}"
        self._ip("link", "add", bridge, "type", "bridge", undo=["ip", "link", "del", bridge])
        self._ip("link", "set", bridge, "up")
        self._allow_forwarding(bridge)
        for index, address in enumerate(self.addresses.values()):
            ns, outside = self.namespace(index), f"smv{self.tag}h{index + 1}"
            self._ip("netns", "add", ns, undo=["ip", "netns", "del", ns])
            if self.delay_ms:
                self._delay_link(outside, ns)
                self._ip("link", "set", outside, "mtu", str(DELAY_LINK_MTU))
                self._ip("-n", ns, "link", "set", "eth0", "mtu", str(DELAY_LINK_MTU))
            else:
                self._ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", outside, "master", bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._shape(outside, ns)

    def _delay_link(self, outside: str, ns: str) -> None:
        """TAP ``outside`` here and eth0 in ``ns``, joined by a delaylink process; they vanish with it."""
        up_us = str(round(self.delay_ms * 1000))
        link = subprocess.Popen([str(delay_link_binary()), outside, f"/run/netns/{ns}", "eth0", up_us, "0"], stdout=subprocess.PIPE, text=True)
        self._links.append(link)
        if link.stdout is None or link.stdout.readline().strip() != "ready":
            raise RuntimeError(f"delaylink for {ns} did not start (exit {link.wait()})")

    def _shape(self, outside: str, ns: str) -> None:
        """A token bucket on both ends of the host's link: egress inside is its upload, outside its download.
        (tbf is what this kernel offers; netem is not built in, hence the delaylink process for delay.)"""
        if self.rate_mbit is None:
            return
        frame = (DELAY_LINK_MTU if self.delay_ms else VETH_MTU) + 14
        burst = max(64_000, 2 * frame, int(self.rate_mbit * 1e6 / 8 * self.burst_ms / 1000))
        tbf = ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "20ms"]
        _check(["tc", "qdisc", "add", "dev", outside, "root", *tbf])
        _check(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf])

    def _allow_forwarding(self, bridge: str) -> None:
        """Bridged frames pass iptables' FORWARD chain when br_netfilter is on; Docker sets its policy
        to DROP. Accept our bridge's own traffic (and nothing else) while it exists."""
        if shutil.which("iptables") is None:
            return
        rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
        if subprocess.run(["iptables", "-I", *rule], capture_output=True, check=False).returncode == 0:
            self._undo.append(["iptables", "-D", *rule])

    def _ip(self, *args: str, undo: list[str] | None = None) -> None:
        _check(["ip", *args])
        if undo:
            self._undo.append(undo)

    def close(self) -> None:
        """Remove everything made, newest first; veth peers go with their namespaces, TAPs with their process."""
        while self._links:
            link = self._links.pop()
            link.kill()
            link.wait()
        while self._undo:
            subprocess.run(self._undo.pop(), capture_output=True, check=False)

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host ``index``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index), *argv]

    def run(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(index, argv), env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def popen(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(index, argv), env=env, text=True, **kwargs)  # type: ignore[call-overload]

    def links_cpu_s(self) -> float:
        """CPU seconds the delaylink processes have used so far."""
        ticks = 0
        for link in self._links:
            fields = Path(f"/proc/{link.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")


# Probes of a link between two hosts, for the measurements in docs/planning.md and the tests.
PING_PONG = textwrap.dedent(
    """
    import socket, sys, time
    address, role, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "server":
        conn, _ = socket.create_server((address, 5002)).accept()
        while data := conn.recv(64):
            conn.sendall(data)
    else:
        for _ in range(50):
            try:
                conn = socket.create_connection((address, 5002)); break
            except OSError:
                time.sleep(0.1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            start = time.perf_counter(); conn.sendall(b"p"); conn.recv(64); print(time.perf_counter() - start)
    """
)
RECEIVER = textwrap.dedent(
    """
    import socket, sys, time
    server = socket.create_server((sys.argv[1], 5001))
    conn, _ = server.accept()
    got, start = 0, time.monotonic()
    while chunk := conn.recv(1 << 20):
        got += len(chunk)
    print(got, got / (time.monotonic() - start))
    """
)
SENDER = textwrap.dedent(
    """
    import socket, sys, time
    for _ in range(50):
        try:
            conn = socket.create_connection((sys.argv[1], 5001)); break
        except OSError:
            time.sleep(0.1)
    for _ in range(int(sys.argv[2])):
        conn.sendall(b"x" * (1 << 20))
    conn.close()
    """
)


def round_trips(hosts: SimHosts, count: int = 200) -> list[float]:
    """TCP round trips (1 byte each way, no Nagle) from algo-2 to algo-1, in seconds."""
    target = hosts.addresses["algo-1"]
    server = hosts.popen(0, [sys.executable, "-c", PING_PONG, target, "server", "0"])
    client = hosts.run(1, [sys.executable, "-c", PING_PONG, target, "client", str(count)])
    server.wait(timeout=30)
    if client.returncode != 0:
        raise RuntimeError(f"round trip probe failed: {client.stderr}")
    return [float(line) for line in client.stdout.split()]


def transfer(hosts: SimHosts, megabytes: int) -> tuple[int, float]:
    """One bulk TCP flow from algo-2 to algo-1: (bytes received, payload bytes/s)."""
    target = hosts.addresses["algo-1"]
    receiver = hosts.popen(0, [sys.executable, "-c", RECEIVER, target], stdout=subprocess.PIPE)
    sender = hosts.run(1, [sys.executable, "-c", SENDER, target, str(megabytes)])
    out, _ = receiver.communicate(timeout=120)
    if sender.returncode != 0:
        raise RuntimeError(f"transfer probe failed: {sender.stderr}")
    received, rate = out.split()
    return int(received), float(rate)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Measure a simulated link: TCP round trip, bulk rate, delaylink CPU.")
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--delay-ms", type=float, default=0.5)
    parser.add_argument("--megabytes", type=int, default=400, help="size of the bulk transfer")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    reason = available()
    if reason:
        print(f"simhosts: {reason}", file=sys.stderr)
        return 3
    with SimHosts(2, rate_mbit=args.rate_mbit, delay_ms=args.delay_ms) as hosts:
        for _ in range(args.repeats):
            rtts = sorted(round_trips(hosts))
            cpu, start = hosts.links_cpu_s(), time.monotonic()
            _, rate = transfer(hosts, args.megabytes)
            cpu, wall = hosts.links_cpu_s() - cpu, time.monotonic() - start
            print(
                f"rtt min {rtts[0] * 1e3:.3f} ms, median {statistics.median(rtts) * 1e3:.3f} ms, p90 "
                f"{rtts[len(rtts) * 9 // 10] * 1e3:.3f} ms; bulk {rate * 8 / 1e6:.0f} mbit/s of payload "
                f"({rate * 8 / 1e6 / args.rate_mbit:.1%} of the rate); delaylink CPU {cpu:.2f} s in {wall:.2f} s "
                f"({cpu / wall:.0%} of a core, both links); load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return 0


def _check(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
