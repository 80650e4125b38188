"""A hang names the rank that has not entered the collective, on every rank and across hosts: rank 3 (on
algo-2) sleeps before an all_reduce, and ranks 0, 1 and 2 each name rank 3, never a rank that waits too
(before, rank 0 blamed algo-2's leader and rank 1 blamed rank 0). ``stacks`` then groups the ranks by
where they are."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.jobs

HANG = """\
import os, time, torch, torch.distributed as dist
import smddp_sdk.collectives  # noqa: F401
dist.init_process_group("smddp")
t = torch.ones(3)
dist.all_reduce(t)
release = os.environ["RELEASE_FILE"]
while dist.get_rank() == 3 and not os.path.exists(release):
    time.sleep(0.1)
dist.all_reduce(t)
print("done", t.tolist(), flush=True)
"""
WARNING = re.compile(r"^\[algo-\d/rank(\d)\]: smddp: rank (\d) \(host (algo-\d)\) has waited \d+ s in all_reduce #(\d+) .* for (.*), which has not entered it", re.M)


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smddp_sdk.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def test_every_waiting_rank_names_the_rank_that_has_not_arrived(tmp_path: Path) -> None:
    env = {**os.environ, "SMDDP_JOB_ROOT": str(tmp_path / "jobs")}
    (tmp_path / "hang.py").write_text(HANG)
    release = tmp_path / "release"
    started = cli("--hosts", "2", "--nproc-per-host", "2", "--job-name", "blame", "--detach", "-e", "SMDDP_HANG_WARN_S=3",
                  "-e", f"RELEASE_FILE={release}", "hang.py", cwd=tmp_path, env=env)
    assert started.returncode == 0, started.stderr
    console = tmp_path / "jobs" / "blame" / "console.log"
    warnings = lambda: {int(m.group(1)): m for m in WARNING.finditer(console.read_text() if console.exists() else "")}  # noqa: E731
    try:
        wait_for(lambda: set(warnings()) == {0, 1, 2})
        for rank, match in warnings().items():
            assert int(match.group(2)) == rank and match.group(3) == ("algo-1" if rank < 2 else "algo-2")
            assert match.group(5).startswith("rank 3 (host algo-2"), match.group(0)  # only rank 3, on every rank
            assert "rank 0 " not in match.group(5) and "rank 2 " not in match.group(5)
        assert len({match.group(4) for match in warnings().values()}) == 1  # the same call on every rank

        stacks = cli("stacks", "blame", cwd=tmp_path, env=env)
        assert stacks.returncode == 0, stacks.stderr
        where = stacks.stdout.split("===")[0]  # one line per place, then each distinct stack once
        place = re.search(r"^  ranks 0-2: all_reduce #(\d+) \(SUM, float32, 3 elements\) at hang\.py:9$", where, re.M)
        assert place and place.group(1) == warnings()[0].group(4), stacks.stdout  # the call the warnings name
        assert re.search(r"^  rank 3: +time\.sleep\(0\.1\) at hang\.py:8$", where, re.M), stacks.stdout
        assert stacks.stdout.count("hang.py\", line 9") <= 2 and "<frozen runpy>" not in stacks.stdout  # grouped, launcher frames left out
    finally:
        release.touch()
    wait_for(lambda: json.loads(cli("status", "blame", "--json", cwd=tmp_path, env=env).stdout)["state"] == "SUCCEEDED")
    assert "not entered" not in console.read_text().split("done", 1)[1]  # no warning after the release
