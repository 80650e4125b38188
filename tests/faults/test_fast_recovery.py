"""Warm restart (the local option ``warm_restart``): a retried or interrupted job wakes standby runtimes whose
ranks were started ahead with torch imported, ends bitwise equal to a straight run, records its recovery
phases, and leaves no standby or spare behind (``-m faults``; real jobs, torch on CPU)."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.resume_bench import load_params, local_scheduler, run_interrupted, run_straight
from smddp_sdk.runtime.logs import Console
from smddp_sdk.runtime.plan import RankSlot
from smddp_sdk.runtime.procs import drop_spares, reap_groups, spawn_rank, start_spare
from smddp_sdk.runtime.usercode import BOOTSTRAP_MODULE
from smddp_sdk.specs import events
from smddp_sdk.specs.status import JobState

pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]


def test_a_warm_restart_wakes_standbys_and_ends_bitwise_equal_to_a_straight_run(tmp_path: Path) -> None:
    straight = run_straight(tmp_path / "straight")
    interrupted = run_interrupted(tmp_path / "warm", scheduler=local_scheduler(tmp_path / "warm", warm=True), warm=True)
    assert straight.status.state is JobState.SUCCEEDED, straight.status
    assert interrupted.status.state is JobState.SUCCEEDED, interrupted.status
    assert [item.outcome for item in interrupted.status.attempts] == ["Restarting", "Interrupted", "Completed"]
    expected, got = load_params(straight.params), load_params(interrupted.params)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert tensor.numpy().tobytes() == got[name].numpy().tobytes(), name

    job_dir = tmp_path / "warm" / "jobs" / "resume-interrupted"
    supervised = events.read(job_dir / events.FILE_NAME)
    assert [(e["event"], e["attempt"]) for e in supervised] == [
        ("hosts_started", 1), ("fault", 1), ("restart", 1), ("hosts_started", 2), ("fault", 2), ("restart", 2), ("hosts_started", 3)
    ]
    assert [e["warm"] for e in supervised if e["event"] == "hosts_started"] == [False, True, True]
    assert [e["kind"] for e in supervised if e["event"] == "fault"] == ["host_failed", "interrupted"]
    for attempt, tree in ((1, job_dir / "attempt-1"), (2, job_dir / "attempt-2"), (3, job_dir)):
        for host in ("algo-1", "algo-2"):
            phases = events.read(tree / host / "output" / events.FILE_NAME)
            started = [e for e in phases if e["event"] == "ranks_started"]
            assert [(e["attempt"], e["warm"]) for e in started] == [(attempt, attempt > 1)], (tree, host, phases)
            formed = [e for e in phases if e["event"] == "process_group_formed"]
            assert len(formed) == 1 and formed[0]["world_size"] == 2 and formed[0]["time"] >= started[0]["time"]
            if attempt > 1 and host == "algo-1":  # rank 0 restored a checkpoint, then stepped (its first collective in the step)
                names = [e["event"] for e in phases if e["rank"] == 0]
                assert names == ["process_group_formed", "state_restored", "first_collective", "first_step"], phases
    console = (job_dir / "console.log").read_text().splitlines()
    woken = [line for line in console if "in spares started ahead" in line]
    assert [line.split("]")[0] for line in woken] == ["[algo-1", "[algo-1"], woken  # the master host says it for the job
    starts = [line for line in console if line.startswith("[algo-2/rank1]") and "starting at epoch" in line]
    assert len(starts) == 3, console[-60:]  # a rank's output in a spare is the job's, as a cold rank's
    deadline = time.monotonic() + 10  # the last standby's spares die with it (PR_SET_PDEATHSIG), a moment later
    while _processes_of(job_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_of(job_dir) == [], "a standby or spare outlived its job"


def _processes_of(job_dir: Path) -> list[int]:
    """Processes whose environment names one of the job's host trees."""
    marker = f"={job_dir}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_spare_becomes_the_rank_it_is_handed(tmp_path: Path) -> None:
    """The rank sees its own argv, environment, directory, import path and /dev/null as stdin; its exit code is the rank's."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text("VALUE = 'from the rank dir'\n")
    (code / "train.py").write_text(textwrap.dedent("""
        import os, sys, helper
        print("argv", sys.argv[1:], "env", os.environ["ONLY_THE_RANK"], "cwd", os.getcwd(), helper.VALUE, "stdin", repr(sys.stdin.read()), flush=True)
        sys.exit(3)
    """))
    spare = start_spare(sys.executable, {**os.environ, "ONLY_THE_RANK": "no"})
    assert spare.wait_ready()
    env = {**os.environ, "ONLY_THE_RANK": "yes", "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", BOOTSTRAP_MODULE, "train.py", "--epochs", "2"]
    log = open(tmp_path / "rank-0.log", "ab")  # noqa: SIM115 - the pump closes it
    proc = spawn_rank(RankSlot(rank=0, local_rank=0, host="algo-1", node_rank=0), argv, env, code, log, tmp_path / "errors" / "rank-0.json", Console(), spare)
    assert proc.warm and proc.popen.pid == spare.popen.pid
    assert proc.popen.wait(timeout=60) == 3
    reap_groups([proc])
    text = (tmp_path / "rank-0.log").read_text()
    assert f"argv ['--epochs', '2'] env yes cwd {code} from the rank dir stdin ''" in text, text


def test_a_spare_for_another_interpreter_is_not_used(tmp_path: Path) -> None:
    spare = start_spare(sys.executable, dict(os.environ))
    try:
        assert not spare.can_run(["/opt/venv/bin/python", "-m", BOOTSTRAP_MODULE, "train.py"])
        assert not spare.can_run([sys.executable, "train.py"])  # only the bootstrap
        assert spare.can_run([sys.executable, "-m", BOOTSTRAP_MODULE, "train.py"])
    finally:
        drop_spares([spare])
    assert spare.popen.returncode is not None
