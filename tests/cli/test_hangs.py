"""A hang between hosts is named within SMDDP_HANG_WARN_S, and `stacks` shows where every rank is."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from smddp_sdk.collectives import native

pytestmark = pytest.mark.integration
NATIVE_CACHE = str(native.cache_dir())  # the user's build cache, read before the isolated fixture moves HOME

HANG = """\
import os, time, torch, torch.distributed as dist
import smddp_sdk.collectives  # noqa: F401
dist.init_process_group("smddp")
release = os.environ["RELEASE_FILE"]
while dist.get_rank() == 1 and not os.path.exists(release):
    time.sleep(0.1)
t = torch.ones(3)
dist.all_reduce(t)
print("done", t.tolist(), flush=True)
"""


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def test_a_hang_between_hosts_is_named_and_stacks_show_every_rank(invoke, isolated: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(isolated.parent / "jobs"))
    monkeypatch.setenv(native.CACHE_ENV, NATIVE_CACHE)
    (isolated / "hang.py").write_text(HANG)
    release = isolated / "release"
    started = invoke("--hosts", "2", "--job-name", "hang", "--detach", "-e", "SMDDP_HANG_WARN_S=2", "-e", f"RELEASE_FILE={release}", "hang.py")
    assert started.exit_code == 0, started.output
    try:
        warning = re.compile(r"smddp: rank 0 \(host algo-1\) has waited 2 s in all_reduce #\d+ .* for rank 1 \(host algo-2.*\), which has not entered it")
        wait_for(lambda: warning.search(invoke("logs", "hang").stdout))
        assert "smddp-launch stacks hang" in invoke("logs", "hang", "--grep", "waited").stdout

        stacks = invoke("stacks", "hang")
        assert stacks.exit_code == 0, stacks.output
        rank0, rank1 = stacks.stdout.split("=== rank 1 (algo-2) ===")
        assert "rank 0: all_reduce" in rank0 and "=== rank 0 (algo-1) ===" in rank0 and 'hang.py", line 8' in rank0
        assert "rank 1: time.sleep(0.1) at hang.py:6" in rank0  # where each rank is, before the stacks
        assert 'hang.py", line 6' in rank1  # the sleeping rank, in its own script
        assert (isolated.parent / "jobs" / "hang" / "algo-2" / "output" / "stacks" / "rank-1.txt").read_text().count("hang.py") == 1
    finally:
        release.touch()
    wait_for(lambda: json.loads(invoke("status", "hang", "--json").stdout)["state"] == "SUCCEEDED")
    ended = invoke("stacks", "hang")
    assert ended.exit_code == 2 and "has ended" in ended.stderr


def test_stacks_of_a_sagemaker_job_is_a_clear_error(invoke, isolated: Path):
    result = invoke("stacks", "sagemaker://us-east-1/some-job")
    assert result.exit_code in (2, 3) and ("the sagemaker scheduler cannot show the ranks' Python stacks" in result.stderr or "boto3" in result.stderr)
