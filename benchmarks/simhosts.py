"""Simulated hosts: network namespaces joined by a private bridge, each with its own address and an
optionally shaped link, so that traffic between "hosts" crosses a real (virtual) network on one machine.

Needs root and iproute2. Nothing is routed outside the bridge: the bridge has no address in the root
namespace, so the hosts reach only each other. Everything is removed on exit, also after errors.

    with SimHosts(2, rate_mbit=1000) as hosts:
        hosts.run(0, ["python3", "-c", "print('hello from algo-1')"])
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_instances = itertools.count()
SUBNET = "10.221.0"  # hosts get SUBNET.1 .. SUBNET.N inside their namespaces only


def available() -> str:
    """"" when simulated hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"simulated hosts need iproute2 ({', '.join(missing)} not found)"
    return ""


@dataclass
class SimHosts:
    """``count`` hosts named algo-1..N; ``rate_mbit`` shapes every host's link in both directions, with
    a token bucket that holds ``burst_ms`` of traffic at that rate."""

    count: int
    rate_mbit: float | None = None
    burst_ms: float = 10.0
    # Unique per instance: removed veth peers vanish asynchronously, so names are never reused at once.
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}{next(_instances) % 100}")
    _undo: list[list[str]] = field(default_factory=list, init=False)

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
            self._ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", outside, "master", bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._shape(outside, ns)

    def _shape(self, outside: str, ns: str) -> None:
        """A token bucket on both ends of the host's veth: egress inside is its upload, outside its download.
        (tbf is what this kernel offers; netem, and with it added delay, is not built in.)"""
        if self.rate_mbit is None:
            return
        burst = max(64_000, int(self.rate_mbit * 1e6 / 8 * self.burst_ms / 1000))
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
        """Remove everything made, newest first; veth peers go with their namespaces."""
        while self._undo:
            subprocess.run(self._undo.pop(), capture_output=True, check=False)

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host ``index``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index), *argv]

    def run(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(index, argv), env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def popen(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(index, argv), env=env, text=True, **kwargs)  # type: ignore[call-overload]


def _check(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
