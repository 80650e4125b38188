"""``status`` never contradicts itself: no host still RUNNING under an ended job, a timeline that ends with the
job, the root cause's real exit code, no "local_rank: None", and the files left out of the archives shown in the
human status as in ``--json``."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from smddp_sdk.runtime.coordination import Coordinator, CoordinatorClient
from smddp_sdk.schedulers.hosttree.job_dir import is_supervisor_of, pick_free_ports
from smddp_sdk.specs.failure import SOURCE_EARLY_EXIT, SOURCE_ERROR_FILE, FailureRecord, PeerRank, failure_reason, render_summary
from smddp_sdk.specs.status import HostStatus, JobHandle, JobState, JobStatus, Transition, settled

# Leaves a link out of its model directory (archived without it), says it is ready, then trains "forever".
LINGER = """
import os, pathlib, time
model = pathlib.Path(os.environ["SM_MODEL_DIR"])
(model / "weights.bin").write_bytes(b"w")
os.symlink("/etc/hostname", model / "outside")
pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"], "ready").touch()
time.sleep(600)
"""


def _wait(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.integration
def test_a_job_whose_supervisor_was_killed_reads_as_ended_everywhere(invoke, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (isolated / "train.py").write_text(LINGER)
    root = isolated.parent / "jobs"
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
    started = invoke("run", "--instance-count", "2", "--job-name", "killed", "--detach", "train.py")
    assert started.exit_code == 0, started.output
    job = root / "killed"
    _wait(lambda: all((job / host / "output" / "data" / "ready").exists() for host in ("algo-1", "algo-2")))
    running = json.loads(invoke("status", "killed", "--json").stdout)
    assert running["state"] == "RUNNING" and {host["state"] for host in running["hosts"]} == {"RUNNING"}

    supervisor = json.loads((job / "state.json").read_text())["supervisor_pid"]
    os.kill(supervisor, signal.SIGKILL)
    _wait(lambda: not is_supervisor_of(supervisor, job), timeout=30)  # SIGKILL lands a moment later, not at once
    shown = invoke("status", "killed")  # finds the supervisor gone: the job FAILED, its hosts stopped, archived
    as_json = json.loads(invoke("status", "killed", "--json").stdout)

    assert shown.exit_code == 0, shown.output
    assert as_json["state"] == "FAILED" and "supervisor" in as_json["message"]
    assert [(host["host"], host["state"]) for host in as_json["hosts"]] == [("algo-1", "FAILED"), ("algo-2", "FAILED")]
    assert "RUNNING" not in shown.stdout, shown.stdout
    assert as_json["transitions"][-1]["status"] == "Failed" and all(item["end"] for item in as_json["transitions"])
    skipped = as_json["archive_skipped"]
    assert len(skipped) == 2 and all("outside" in line and "not archived" in line for line in skipped), skipped
    assert all(f"left out of {line}" in shown.stdout for line in skipped), shown.stdout


def test_an_ended_status_has_no_live_host_and_a_closed_timeline() -> None:
    handle = JobHandle("local", "j")
    open_ended = JobStatus(handle, JobState.CANCELLED, "cancelled: the supervisor was gone", hosts=(HostStatus("algo-1", JobState.RUNNING), HostStatus("algo-2", JobState.SUCCEEDED, 0)),
                           ended=20.0, transitions=(Transition("Starting", 1.0, 2.0), Transition("Training", 2.0)))
    shown = settled(open_ended)
    assert shown.hosts == (HostStatus("algo-1", JobState.CANCELLED), HostStatus("algo-2", JobState.SUCCEEDED, 0))
    assert shown.transitions[-2:] == (Transition("Training", 2.0, 20.0), Transition("Stopped", 20.0, 20.0, "cancelled: the supervisor was gone"))
    running = JobStatus(handle, JobState.RUNNING, hosts=(HostStatus("algo-1", JobState.RUNNING),), transitions=(Transition("Training", 2.0),))
    assert settled(running) is running
    finished = JobStatus(handle, JobState.FAILED, transitions=(Transition("Training", 2.0, 5.0), Transition("MaxRuntimeExceeded", 5.0, 5.0)))
    assert settled(finished).transitions == finished.transitions


def test_a_rank_that_exited_0_is_the_verdict_on_every_host_with_its_own_exit_code() -> None:
    """What the runtimes tell each other through the coordinator (the text SageMaker shows as FailureReason):
    the early exit reaches the verdict, so no host writes "exit code 1: LostRank" for a rank that exited 0."""
    port = pick_free_ports(1)[0]
    coordinator = Coordinator(("algo-1", "algo-2"), "secret", port, log=lambda _: None, connect_timeout=5.0, verdict_timeout=5.0)
    coordinator.start()
    clients = {host: CoordinatorClient(host, "127.0.0.1", port, "secret", log=lambda _: None, on_stop=lambda _: None, connect_timeout=5.0) for host in ("algo-1", "algo-2")}
    try:
        for client in clients.values():
            client.start()
        now = time.time()
        early = FailureRecord("algo-1", 1, 0, "", timestamp=now, source=SOURCE_EARLY_EXIT, local_rank=1)
        lost = FailureRecord("algo-1", 0, 1, "smddp all_reduce failed: peer rank 1 (pid 5, same host) exited before completing it", timestamp=now + 0.1,
                             error_type="CollectiveError", source=SOURCE_ERROR_FILE, lost=(PeerRank(1),))
        closed = FailureRecord("algo-2", 2, 1, "smddp all_reduce failed: rank 0 (host algo-1) closed the connection", timestamp=now + 0.2,
                               error_type="CollectiveError", source=SOURCE_ERROR_FILE, lost=(PeerRank(0, "algo-1"),))
        clients["algo-1"].report_final("failed", [lost, early])
        clients["algo-2"].report_final("failed", [closed])
        verdicts = [client.wait_verdict(10) for client in clients.values()]
    finally:
        for client in clients.values():
            client.close()
        coordinator.close()
    for verdict in verdicts:
        assert verdict is not None
        cause, others = verdict
        assert (cause.host, cause.rank, cause.exit_code, cause.error_type) == ("algo-1", 1, 0, "EarlyExit")
        reason = failure_reason(cause, others)
        assert reason.splitlines()[1:3] == ["ExitCode 0", "ErrorMessage EarlyExit: the rank exited with code 0 while its peers were still in a collective with it"]
        assert "LostRank" not in reason and "exited with code 0" not in reason.split("Other failures")[-1]


def test_a_rank_named_only_by_its_peers_shows_no_unknown_local_rank() -> None:
    hung = FailureRecord("algo-2", 3, 1, "the rank stopped making progress", timestamp=1.0, error_type="Hang")
    summary = render_summary(hung)
    assert "  rank      : 3\n" in summary + "\n" and "None" not in summary
    assert "  rank      : 3 (local_rank: 1)" in render_summary(hung.replace(local_rank=1))
