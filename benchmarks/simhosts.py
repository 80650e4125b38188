"""Simulated hosts: network namespaces joined by a private bridge, each with its own address and an
optionally shaped link, so that traffic between "hosts" crosses a real (virtual) network on one machine.

Needs root and iproute2. Nothing is routed outside the bridge: the bridge has no address in the root
namespace, so the hosts reach only each other. Everything is removed on exit, also after errors.

    with SimHosts(2, rate_mbit=1000, delay_ms=0.5) as hosts:
        hosts.run(0, ["python3", "-c", "print('hello from algo-1')"])

A host's link is a veth pair, or, with ``delay_ms``, two TAP devices joined by a delaylink process
(benchmarks/delaylink/delaylink.c, compiled with cc on first use): this kernel has no netem, so the
one-way delay is added in user space, on each host's sends (host to host: ``delay_ms`` one way, twice
that round trip). Delayed links carry large frames (DELAY_LINK_MTU) so that the process copies few.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_instances = itertools.count()
SUBNET = "10.221.0"  # hosts get SUBNET.1 .. SUBNET.N inside their namespaces only
DELAY_LINK_SOURCE = Path(__file__).with_name("delaylink") / "delaylink.c"
# Frames through the delaylink process: 64000-byte frames cost it ~half the CPU of 9000-byte ones and carry
# TCP at 99.9% payload (measured: 998 against 878 mbit/s of payload at 1000 mbit, 0.5 ms).
DELAY_LINK_MTU = 64000


def available() -> str:
    """ "" when simulated hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"simulated hosts need iproute2 ({', '.join(missing)} not found)"
    return ""


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
        """A token bucket on both ends of the host's veth: egress inside is its upload, outside its download.
        (tbf is what this kernel offers; netem is not built in, hence the delaylink process for delay.)"""
        if self.rate_mbit is None:
            return
        frame = (DELAY_LINK_MTU if self.delay_ms else 1500) + 14
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


def _check(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
