"""The link benchmark between shaped simulated hosts: results verified, the link well used, nothing left."""

import json
import subprocess
import sys
import time

import pytest

from benchmarks.simhosts import available
from tests.collectives.cluster import PROJECT_ROOT

pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(available()), reason=available() or "available")]


def test_smddp_and_gloo_run_verified_over_three_shaped_hosts(tmp_path):
    out = tmp_path / "link.json"
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    run = subprocess.run(
        [sys.executable, "benchmarks/link_bench.py", "--hosts", "3", "--rate-mbit", "200", "--sizes", "64K,1M",
         "--repeats", "1", "--seconds", "0.2", "--timeout", "240", "--json", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr  # non-zero when a result check fails
    rows = json.loads(out.read_text())
    assert {(r["op"], r["size"]) for r in rows} == {(op, s) for op in ("allgather", "allreduce") for s in (64 << 10, 1 << 20)}
    for row in rows:
        # per-link bytes/s can exceed the rate only by the token bucket's burst (10 ms of traffic)
        assert 0 < row["smddp"]["utilisation"] < 1.3, row
        if row["size"] >= 1 << 20:
            assert row["smddp"]["utilisation"] > 0.5, row  # loose: the machine is shared; docs hold the real numbers
    time.sleep(0.5)
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    assert not {ns for ns in after - before if ns.startswith("smddp")}, "namespaces left behind"
