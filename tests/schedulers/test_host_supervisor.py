"""The one host-tree lifecycle (local and docker jobs) driven through a fake backend, in-process.

The real backends run in tests/integration (processes), tests/faults (faults) and tests/docker (engine);
here the supervisor's own rules are pinned: peer failure, root cause, cancel, max_run, artifacts.
"""

from __future__ import annotations

import json
import signal
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smddp_sdk.schedulers.hosttree.backend import HostBackend, HostExit, Output
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.schedulers.hosttree.supervisor import Supervisor
from smddp_sdk.specs import contract
from smddp_sdk.specs.failure import SOURCE_ERROR_FILE, FailureRecord, signal_name
from smddp_sdk.specs.status import JobHandle

HOSTS = ("algo-1", "algo-2")


@dataclass
class FakeHost:
    ends_after: float | None = None  # seconds after start; None: runs until signalled
    code: int = 0
    signal: int | None = None  # dies by this signal (no records written)
    records: tuple[FailureRecord, ...] = ()  # what its "runtime" writes to failures.json


class FakeBackend(HostBackend):
    """Hosts that end on a script; SIGTERM ends one like a runtime would (143, a 'stopped' record)."""

    name = "fake"

    def __init__(self, job_dir: JobDir, plan: HostTreePlan, hosts: dict[str, FakeHost]) -> None:
        super().__init__(job_dir, plan)
        self.hosts = hosts
        self.started: dict[str, float] = {}
        self.exits: dict[str, HostExit] = {}
        self.signals: list[tuple[str, int]] = []
        self.released = False

    def start(self, host: str, extra_env: Mapping[str, str], output: Output) -> dict[str, Any]:
        self.started[host] = time.time()
        output(host, f"[{host}/rank0]: hello\n".encode())
        output(host, b"no prefix\n")
        return {"fake": host}

    def poll(self, host: str) -> HostExit | None:
        plan = self.hosts[host]
        if host not in self.exits and plan.ends_after is not None and time.time() - self.started[host] >= plan.ends_after:
            self._end(host, plan.code, plan.signal, plan.records)
        return self.exits.get(host)

    def signal(self, host: str, sig: int) -> None:
        self.signals.append((host, sig))
        if host not in self.exits:
            self._end(host, 128 + int(sig), None, ())

    def release(self, *, keep: bool = False) -> None:
        self.released = True

    def _end(self, host: str, code: int, sig: int | None, records: tuple[FailureRecord, ...]) -> None:
        if records:
            contract.write_failure_records(contract.OptMl(self.job_dir.host_dir(host)), [r.to_json() for r in records])
        self.exits[host] = HostExit(128 + sig if sig else code, signal_name(sig) if sig else None, time.time())


def make_job(tmp_path: Path, **plan: Any) -> JobDir:
    job_dir = JobDir(tmp_path / "job")
    job_dir.path.mkdir(parents=True)
    for host in HOSTS:
        contract.OptMl(job_dir.host_dir(host)).make_dirs()
    artifacts = tmp_path / "out" / "job" / "output"
    job_dir.write_record(
        {
            "handle": "local://job",
            "plan": {
                "hosts": [{"host": host} for host in HOSTS],
                "stop_grace_period": 1,
                "artifacts": {"model_data": str(artifacts / "model.tar.gz"), "output_data": str(artifacts / "output.tar.gz")},
                **plan,
            },
        }
    )
    return job_dir


def supervise(job_dir: JobDir, hosts: dict[str, FakeHost], **attributes: Any) -> tuple[dict[str, Any], FakeBackend]:
    backend = FakeBackend(job_dir, job_dir.plan, hosts)
    supervisor = Supervisor(job_dir, backend)
    supervisor.peer_failure_grace = 0.3
    for name, value in attributes.items():
        setattr(supervisor, name, value)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    try:
        assert supervisor.run() == 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return job_dir.read_state(), backend


def victim(host: str, rank: int, at: float, text: str) -> FailureRecord:
    return FailureRecord(host, rank, 1, text, timestamp=at, error_type="CollectiveError", source=SOURCE_ERROR_FILE)


def test_a_job_whose_hosts_succeed_collects_its_artifacts(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    (job_dir.host_dir("algo-2") / "model" / "weights.bin").write_bytes(b"w")
    state, backend = supervise(job_dir, {host: FakeHost(ends_after=0.1) for host in HOSTS})
    assert state["state"] == "SUCCEEDED", state
    assert Path(state["model_data"]).is_file() and backend.released
    assert job_dir.console_log.read_text().splitlines()[:2] == ["[algo-1/rank0]: hello", "[algo-1]: no prefix"]
    assert not (job_dir.path / "lifeline").exists() and not (job_dir.path / "heartbeat").exists()


def test_a_container_killed_without_a_word_is_named_over_its_victims(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    now = time.time()
    lost = victim("algo-1", 0, now, "smddp allreduce failed: rank 2 (host algo-2) closed the connection (the peer exited or failed)")
    hosts = {"algo-1": FakeHost(ends_after=0.3, code=1, records=(lost,)), "algo-2": FakeHost(ends_after=0.2, signal=signal.SIGKILL)}
    state, _ = supervise(job_dir, hosts)
    assert state["state"] == "FAILED"
    failure = state["failure"]
    assert (failure["host"], failure["rank"], failure["signal"], failure["exit_code"]) == ("algo-2", None, "SIGKILL", 137)
    assert state["message"].startswith("algo-2 exited with code 137: Signal: the runtime was killed by SIGKILL")
    assert [other["rank"] for other in state["other_failures"]] == [0]


def test_a_host_that_hangs_on_after_a_peer_failed_is_stopped_and_not_blamed(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    error = FailureRecord("algo-2", 3, 1, "bad batch", timestamp=time.time(), error_type="ValueError", source=SOURCE_ERROR_FILE)
    state, backend = supervise(job_dir, {"algo-1": FakeHost(), "algo-2": FakeHost(ends_after=0.1, code=1, records=(error,))})
    assert ("algo-1", signal.SIGTERM) in backend.signals
    assert (state["failure"]["host"], state["failure"]["rank"]) == ("algo-2", 3)
    assert state["hosts"]["algo-1"]["exit_code"] == 143


def test_cancel_stops_every_host_and_ends_cancelled(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    job_dir.request_cancel()
    state, backend = supervise(job_dir, {host: FakeHost() for host in HOSTS})
    assert state["state"] == "CANCELLED" and backend.started == {}  # asked before it started: nothing ran
    job_dir2 = make_job(tmp_path / "2")
    model = contract.OptMl(job_dir2.host_dir("algo-1")).model_dir
    model.mkdir(parents=True, exist_ok=True)
    (model / "weights.bin").write_bytes(b"w")  # what the job wrote before it was stopped
    (model / "leak").symlink_to("/etc/hostname")
    backend2 = FakeBackend(job_dir2, job_dir2.plan, {host: FakeHost() for host in HOSTS})
    supervisor = Supervisor(job_dir2, backend2)
    supervisor.peer_failure_grace = 0.3
    original = supervisor.tick
    supervisor.tick = lambda: (original(), job_dir2.request_cancel())  # type: ignore[method-assign]
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
    try:
        supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    state2 = job_dir2.read_state()
    assert state2["state"] == "CANCELLED"
    with tarfile.open(state2["model_data"]) as archive:  # as SageMaker uploads a stopped job's model
        assert archive.getnames() == ["weights.bin"]
    assert len(state2["archive_skipped"]) == 1 and "model.tar.gz: leak: a link" in state2["archive_skipped"][0], state2
    assert "warning: left out of model.tar.gz: leak" in job_dir2.console_log.read_text()
    assert sorted(host for host, sig in backend2.signals if sig == signal.SIGTERM) == list(HOSTS)


def test_max_run_fails_the_job_without_blaming_a_rank(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path, max_run=1)
    state, _ = supervise(job_dir, {host: FakeHost() for host in HOSTS})
    assert state["state"] == "FAILED" and state["message"].startswith("MaxRuntimeExceeded")
    assert state["failure"] is None


def test_a_failed_artifact_collection_fails_the_job(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    (tmp_path / "out").write_text("a file where the artifacts' directory should go")
    state, _ = supervise(job_dir, {host: FakeHost(ends_after=0.1) for host in HOSTS})
    assert state["state"] == "FAILED"
    assert state["message"].startswith("ArtifactCollectionFailed: could not collect the artifacts")
    assert "model_data" not in state


def test_before_collect_is_the_last_step_before_artifacts(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    seen: list[Any] = []
    state, _ = supervise(job_dir, {host: FakeHost(ends_after=0.1) for host in HOSTS}, before_collect=lambda verdict: seen.append(verdict))
    assert seen == [None] and state["state"] == "SUCCEEDED"


def test_records_are_read_from_every_host(tmp_path: Path) -> None:
    job_dir = make_job(tmp_path)
    error_file = contract.OptMl(job_dir.host_dir("algo-2")).rank_error_file(3)
    error_file.parent.mkdir(parents=True, exist_ok=True)
    error_file.write_text(json.dumps({"rank": 3, "error_type": "KeyError", "message": "x", "timestamp": time.time(), "exit_code": 1}))
    state, _ = supervise(job_dir, {"algo-1": FakeHost(ends_after=0.1), "algo-2": FakeHost(ends_after=0.1, code=1)})
    assert (state["failure"]["host"], state["failure"]["rank"], state["failure"]["error_type"]) == ("algo-2", 3, "KeyError")
    assert state["error_file"] == str(error_file)


def test_a_long_dead_supervisors_job_gets_its_archives_and_no_process_is_signalled(tmp_path: Path) -> None:
    """Found long after its supervisor died (a reboot, a kill): its recorded pids may be other processes'
    by now, so status only makes the archives."""
    import os
    import subprocess

    from smddp_sdk.schedulers.local import LocalScheduler

    job_dir = make_job(tmp_path)
    (job_dir.host_dir("algo-1") / "model" / "weights.bin").write_bytes(b"w")
    gone = subprocess.Popen(["true"])
    gone.wait()
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads a session, as a runtime did
    try:
        job_dir.write_state({"state": "RUNNING", "supervisor_pid": gone.pid, "hosts": {"algo-1": {"pid": bystander.pid}}})
        (job_dir.path / "heartbeat").touch()
        long_ago = time.time() - 3600
        for path in (job_dir.state_file, job_dir.path / "heartbeat"):
            os.utime(path, (long_ago, long_ago))
        status = LocalScheduler(job_root=tmp_path).status(JobHandle.parse("local://job"))
        assert status.state.value == "FAILED" and "supervisor" in status.message
        assert status.model_data and tarfile.open(status.model_data).getnames() == ["weights.bin"]
        assert bystander.poll() is None  # not swept
    finally:
        bystander.kill()
        bystander.wait()


def test_a_record_without_archive_paths_collects_nothing_into_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    from smddp_sdk.schedulers.hosttree.supervisor import collect_job_artifacts

    monkeypatch.chdir(tmp_path)
    plan = HostTreePlan.from_json({"hosts": [{"host": "algo-1", "opt_ml": str(tmp_path / "algo-1")}], "process": {"command": ["python3"]}})
    entries, problem = collect_job_artifacts(JobDir(tmp_path / "job"), plan)
    assert entries == {} and problem.startswith("ArtifactCollectionFailed: the job's record names no place")
    assert list(tmp_path.iterdir()) == []
