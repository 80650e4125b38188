"""Survivors stay up (docs/resuming.md, "Survivors stay up"): a 2 hosts x 2 ranks job with ``survive_host_loss``
loses algo-2's runtime mid-training; algo-1's ranks keep running, re-form the smddp group with algo-2's
replacement, send it their state and go on from the interrupted step, ending bitwise equal to a straight run
(``-m faults``; real jobs, torch on CPU)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import tarfile
from pathlib import Path

import pytest

from benchmarks.resume_bench import checkpointless_spec
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.specs import events, goodput
from smddp_sdk.specs.status import JobState
from tests.faults.test_checkpointless import DONE, _log, _wait

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

STEPS = 60
HYPERPARAMETERS = {"steps": STEPS, "pause": 0.1, "ddp": "smddp"}


def start(workdir: Path, name: str, *, survive: bool) -> tuple[LocalScheduler, object, Path]:
    scheduler = LocalScheduler(job_root=workdir / "jobs", processes_per_host=2, stop_grace_period=3, warm_restart=survive, survive_host_loss=survive)
    spec = checkpointless_spec(f"survivors-{name}", HYPERPARAMETERS)
    handle = scheduler.submit(spec)
    return scheduler, handle, workdir / "jobs" / handle.job_id


def finish(scheduler: LocalScheduler, handle: object, job_dir: Path) -> tuple[JobState, str, dict]:
    _wait(lambda: scheduler.status(handle).state.is_terminal, "the job's end")
    status = scheduler.status(handle)
    params = {}
    if status.state is JobState.SUCCEEDED and status.model_data:
        with tarfile.open(status.model_data) as archive:
            member = archive.extractfile("params.pt")
            params = torch.load(io.BytesIO(member.read())) if member is not None else {}
    return status.state, f"{status.message}\n{_log(job_dir)[-4000:]}", params


def host_pid(job_dir: Path, host: str) -> int:
    return int(json.loads((job_dir / "state.json").read_text())["hosts"][host]["pid"])


def children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def kill_after_step(job_dir: Path, host: str, step: int, *, what: str = "runtime") -> None:
    """SIGKILL the host's runtime (``runtime``) or one of its ranks (``rank``) once rank 0 has done ``step``."""
    _wait(lambda: any(int(done) >= step for done in DONE.findall(_log(job_dir))), f"step {step}")
    runtime = host_pid(job_dir, host)
    os.kill(min(children(runtime)) if what == "rank" else runtime, signal.SIGKILL)


def host_events(job_dir: Path, host: str, name: str) -> list[dict]:
    return [e for e in events.read(job_dir / host / "output" / events.FILE_NAME) if e["event"] == name]


def assert_bitwise(straight: dict, other: dict) -> None:
    assert straight and straight.keys() == other.keys()
    for name, tensor in straight.items():
        assert tensor.numpy().tobytes() == other[name].numpy().tobytes(), name


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict:
    state, message, params = finish(*start(tmp_path_factory.mktemp("straight"), "straight", survive=False))
    assert state is JobState.SUCCEEDED, message
    return params


@pytest.mark.parametrize("what", ["runtime", "rank"])
def test_the_survivors_stay_up_and_the_replaced_host_rejoins_bitwise_equal_to_a_straight_run(tmp_path: Path, straight: dict, what: str) -> None:
    scheduler, handle, job_dir = start(tmp_path, f"killed-{what}", survive=True)
    _wait(lambda: len(DONE.findall(_log(job_dir))) >= 2, "training")
    survivor = host_pid(job_dir, "algo-1")
    ranks_before = children(survivor)
    lost = host_pid(job_dir, "algo-2")
    kill_after_step(job_dir, "algo-2", 20, what=what)
    state, message, params = finish(scheduler, handle, job_dir)
    assert state is JobState.SUCCEEDED, message
    assert_bitwise(straight, params)

    # the survivors stayed up: algo-1's runtime and ranks are the ones from before, and they re-formed the group
    assert host_pid(job_dir, "algo-1") == survivor and host_pid(job_dir, "algo-2") != lost, message
    reformed = host_events(job_dir, "algo-1", events.GROUP_REFORMED)
    assert sorted(e["rank"] for e in reformed) == [0, 1] and {e["pid"] for e in reformed} <= ranks_before, (reformed, ranks_before)
    assert {e["generation"] for e in reformed} == {1}, reformed
    assert len(host_events(job_dir, "algo-1", events.RANKS_STARTED)) == 1  # never restarted
    # the replaced host rejoined: the supervisor said so, its new ranks started (warm) and received the state
    assert [(e["host"], e["generation"]) for e in events.read(job_dir / events.FILE_NAME) if e["event"] == events.PEER_LOST] == [("algo-2", 1)]
    assert "algo-2 was lost" in message and "replacing it alone" in message and events.RESTART not in {e["event"] for e in events.read(job_dir / events.FILE_NAME)}
    assert len(host_events(job_dir, "algo-2", events.RANKS_STARTED)) == 2
    if what == "rank":  # its runtime wrote why it failed: set aside, not the replacement's
        assert (job_dir / "replaced-1" / "algo-2" / "failures.json").is_file() and not (job_dir / "algo-2" / "output" / "failures.json").exists()
    restored = [e for host in ("algo-1", "algo-2") for e in host_events(job_dir, host, events.STATE_RESTORED)]
    assert sorted(e["rank"] for e in restored) == [0, 1, 2, 3] and len({e["step"] for e in restored}) == 1, restored
    resumed = restored[0]["step"]
    assert resumed >= 20 and all(e["attempt"] == 1 for e in restored), restored
    # no completed step ran again, and none was skipped
    done = [int(step) for step in DONE.findall(_log(job_dir))]
    assert sorted(done) == list(range(STEPS)), done
    # status shows the recovery's phases
    shown = goodput.render(scheduler.status(handle).goodput)
    assert any(re.fullmatch(r"algo-2 replaced alone in attempt 1, the others training on: [\d.]+ s to training again "
                            r"\(detect [\d.]+ s, rejoin [\d.]+ s, state transfer [\d.]+ s\); no completed step redone", line) for line in shown), shown


def test_losing_the_host_that_serves_the_store_restarts_every_host_and_says_why(tmp_path: Path, straight: dict) -> None:
    scheduler, handle, job_dir = start(tmp_path, "fallback", survive=True)
    kill_after_step(job_dir, "algo-1", 20)
    state, message, params = finish(scheduler, handle, job_dir)
    assert state is JobState.SUCCEEDED, message
    # The parameters are bitwise a straight run's; BatchNorm's running statistics are the sender's (rank 2's):
    # each rank's differ (its own batches since rank 0's broadcast), and rank 0's were lost with algo-1.
    assert_bitwise({k: v for k, v in straight.items() if "running" not in k}, {k: v for k, v in params.items() if "running" not in k})
    assert "algo-1 was lost (exited with code 137 (SIGKILL)); every host restarts: algo-1 served the rendezvous store and the coordinator" in message
    assert [e["event"] for e in events.read(job_dir / events.FILE_NAME)].count(events.RESTART) == 1
