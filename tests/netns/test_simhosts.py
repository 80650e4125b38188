"""The simulated-hosts tooling the multi-host tests and link benchmarks stand on."""

import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.simhosts import SimHosts, available, round_trips, transfer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(available()), reason=available() or "available")]


def test_hosts_reach_each_other_and_the_link_is_shaped():
    with SimHosts(3, rate_mbit=200) as hosts:
        assert hosts.addresses == {"algo-1": "10.221.0.1", "algo-2": "10.221.0.2", "algo-3": "10.221.0.3"}
        received, rate = transfer(hosts, 10)
        assert received == 10 << 20
        # A shaped link can be slower on a busy machine, never faster than its rate (25 MB/s here).
        assert rate < 1.1 * 200e6 / 8
        namespaces = [hosts.namespace(i) for i in range(3)]
    time.sleep(0.5)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(ns in listed for ns in namespaces)


def test_nothing_is_reachable_outside_the_bridge():
    with SimHosts(1) as hosts:
        result = hosts.run(0, ["ip", "route", "get", "1.1.1.1"])
        assert result.returncode != 0  # no default route: traffic cannot leave the simulated network


def test_a_delayed_link_adds_its_one_way_delay_each_way_and_keeps_its_rate():
    with SimHosts(2, rate_mbit=400, delay_ms=2.0) as hosts:
        rtts = round_trips(hosts, 50)
        fastest, median = min(rtts), statistics.median(rtts)
        assert fastest >= 2 * 2.0e-3  # a round trip crosses the delay twice, never less
        assert median < 2 * 2.0e-3 + 5e-3  # plus the machine's own scheduling, a few ms at most when busy
        received, rate = transfer(hosts, 20)
        assert received == 20 << 20 and rate < 1.1 * 400e6 / 8
        links = [f"smv{hosts.tag}h{i}" for i in (1, 2)]
    listed = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert not any(link in listed for link in links)  # the TAP devices went with their delaylink processes


def test_a_terminated_process_still_removes_its_hosts():
    """kill or timeout sends SIGTERM: the namespaces, bridge and delay links must not outlive the process."""
    script = "import sys, time\nfrom benchmarks.simhosts import SimHosts\nwith SimHosts(2, delay_ms=0.5) as hosts:\n    print(hosts.namespace(0), hosts.namespace(1), flush=True)\n    time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    namespaces = proc.stdout.readline().split()
    assert len(namespaces) == 2
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(ns in listed for ns in namespaces)
    assert not [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines() if namespaces[0] in line]
