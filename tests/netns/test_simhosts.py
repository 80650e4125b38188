"""The simulated-hosts tooling the multi-host tests and link benchmarks stand on."""

import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks.simhosts import SimHosts, available

pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(available()), reason=available() or "available")]

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


def _transfer(hosts: SimHosts, megabytes: int) -> tuple[int, float]:
    target = hosts.addresses["algo-1"]
    receiver = hosts.popen(0, [sys.executable, "-c", RECEIVER, target], stdout=subprocess.PIPE)
    sender = hosts.run(1, [sys.executable, "-c", SENDER, target, str(megabytes)])
    out, _ = receiver.communicate(timeout=60)
    assert sender.returncode == 0, sender.stderr
    received, rate = out.split()
    return int(received), float(rate)


def test_hosts_reach_each_other_and_the_link_is_shaped():
    with SimHosts(3, rate_mbit=200) as hosts:
        assert hosts.addresses == {"algo-1": "10.221.0.1", "algo-2": "10.221.0.2", "algo-3": "10.221.0.3"}
        received, rate = _transfer(hosts, 10)
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


PING_PONG = textwrap.dedent(
    """
    import socket, statistics, sys, time
    address, role = sys.argv[1], sys.argv[2]
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
        rtts = []
        for _ in range(50):
            start = time.perf_counter(); conn.sendall(b"p"); conn.recv(64); rtts.append(time.perf_counter() - start)
        print(min(rtts), statistics.median(rtts))
    """
)


def test_a_delayed_link_adds_its_one_way_delay_each_way_and_keeps_its_rate():
    with SimHosts(2, rate_mbit=400, delay_ms=2.0) as hosts:
        target = hosts.addresses["algo-1"]
        server = hosts.popen(0, [sys.executable, "-c", PING_PONG, target, "server"])
        client = hosts.run(1, [sys.executable, "-c", PING_PONG, target, "client"])
        server.wait(timeout=30)
        assert client.returncode == 0, client.stderr
        fastest, median = map(float, client.stdout.split())
        assert fastest >= 2 * 2.0e-3  # a round trip crosses the delay twice, never less
        assert median < 2 * 2.0e-3 + 5e-3  # plus the machine's own scheduling, a few ms at most when busy
        received, rate = _transfer(hosts, 20)
        assert received == 20 << 20 and rate < 1.1 * 400e6 / 8
        links = [f"smv{hosts.tag}h{i}" for i in (1, 2)]
    listed = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert not any(link in listed for link in links)  # the TAP devices went with their delaylink processes
