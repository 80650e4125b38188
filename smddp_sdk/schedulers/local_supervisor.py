"""The per-job supervisor of the local scheduler: ``python -m smddp_sdk.schedulers.local_supervisor <job_dir>``.

One detached process per job. It reads ``job.json``, picks free ports, starts the runtime once per
simulated host (each in a session of its own, so every process of a host can be stopped together),
copies their output into ``console.log``, and keeps ``state.json`` current. It stops the job when asked
(SIGTERM/SIGINT or the ``cancel-requested`` file), when the process that owns the job goes away, when
``max_run`` passes, or when one host failed and the others are still running after a grace period (the
runtimes normally stop each other well before that). At the end it names the root cause (the earliest
rank error across all hosts, else the first host that failed) and collects the artifacts.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from smddp_sdk.schedulers.host_trees import collect_artifacts
from smddp_sdk.schedulers.local import JOB_TOKEN_ENV, PORT_PLACEHOLDER, remove_host_trees
from smddp_sdk.schedulers.local_job import (
    JobDir,
    host_prefixed,
    pick_free_ports,
    pid_alive,
    port_lock,
    ports_of_live_jobs,
    signal_session,
)
from smddp_sdk.specs import contract
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.status import JobState

POLL_SECONDS = 0.1
# How long the other hosts may keep running after one host failed; the runtimes' own failure
# propagation stops them in seconds, this only catches a runtime that missed it.
PEER_FAILURE_GRACE = 30.0
_PORT_ENVS = (contract.MASTER_PORT_ENV, contract.SERVER_PORT_ENV, contract.AGENT_PORT_ENV)


class Supervisor:
    def __init__(self, job_dir: JobDir) -> None:
        self.job_dir = job_dir
        self.record = job_dir.read_record()
        self.request: dict[str, Any] = self.record["request"]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.readers: list[threading.Thread] = []
        self.console_lock = threading.Lock()
        self.signalled = threading.Event()
        self.state: dict[str, Any] = {}
        self.stop_reason: tuple[JobState, str] | None = None
        self.kill_at: float | None = None
        self.console: IO[str] | None = None
        self.first_parent = os.getppid()

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.signalled.set())
        self.state = {"state": JobState.STARTING.value, "message": "", "supervisor_pid": os.getpid(), "started": time.time(), "hosts": {}}
        self.save()
        if self.cancel_wanted():
            return self.finish(JobState.CANCELLED, "cancelled before it started")
        try:
            self.start_runtimes()
        except OSError as exc:
            self.stop_all()
            self.wait_all()
            return self.finish(JobState.FAILED, f"could not start the runtimes: {exc}")
        self.update(state=JobState.RUNNING.value)
        self.watch()
        for reader in self.readers:
            reader.join(timeout=5)
        if self.console is not None:
            self.console.close()
        return self.conclude()

    def start_runtimes(self) -> None:
        job_root = Path(self.record["job_root"])
        with port_lock(job_root):
            ports = dict(zip(_PORT_ENVS, pick_free_ports(len(_PORT_ENVS), exclude=ports_of_live_jobs(job_root, skip=self.job_dir.path))))
            self.update(ports=ports)
        token = secrets.token_hex(16)
        console = self.console = open(self.job_dir.console_log, "a", encoding="utf-8")
        for host in self.request["hosts"]:
            env = self.runtime_env(host["environment"], ports, token)
            process = subprocess.Popen(
                host["command"], env=env, cwd=host["base_dir"], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
            self.processes[host["host"]] = process
            self.state["hosts"][host["host"]] = {"pid": process.pid, "state": JobState.RUNNING.value, "exit_code": None}
            reader = threading.Thread(target=self.copy_output, args=(host["host"], process.stdout, console), daemon=True)
            reader.start()
            self.readers.append(reader)
        self.save()

    @staticmethod
    def runtime_env(planned: dict[str, str], ports: dict[str, int], token: str) -> dict[str, str]:
        env = inherited_env(os.environ)
        env.update({key: str(ports[key]) if value == PORT_PLACEHOLDER else value for key, value in planned.items()})
        env[JOB_TOKEN_ENV] = token
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [planned.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))
        return env

    def copy_output(self, host: str, stream: IO[bytes], console: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", errors="replace")
            if not text.endswith("\n"):
                text += "\n"
            with self.console_lock:
                console.write(host_prefixed(host, text))
                console.flush()
        stream.close()

    # --- watching -------------------------------------------------------------------------------

    def watch(self) -> None:
        deadline = self.state["started"] + int(self.request.get("max_run") or 86_400)
        first_failure: float | None = None
        while self.running():
            self.record_exits()
            if self.stop_reason is None:
                first_failure = first_failure or self.first_failure_time()
                self.check_stop_conditions(deadline, first_failure)
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self.kill_all()
            time.sleep(POLL_SECONDS)
        self.record_exits()
        for process in self.processes.values():
            signal_session(process.pid, signal.SIGKILL)  # anything a rank left behind in its host's session

    def check_stop_conditions(self, deadline: float, first_failure: float | None) -> None:
        owner = self.record.get("owner_pid")
        if self.cancel_wanted():
            self.stop(JobState.CANCELLED, "cancelled")
        elif owner and self.owner_gone(owner):
            self.stop(JobState.CANCELLED, f"cancelled: the process that started it (pid {owner}) exited")
        elif time.time() > deadline:
            self.stop(JobState.FAILED, f"MaxRuntimeExceeded: the job ran longer than max_run={self.request.get('max_run')} seconds")
        elif first_failure is not None and time.time() - first_failure > PEER_FAILURE_GRACE:
            self.stop(JobState.FAILED, "")  # the root cause decides the message

    def owner_gone(self, owner: int) -> bool:
        """The owner started us: it is gone once we are re-parented (no pid-reuse doubt); otherwise poll it."""
        if self.first_parent == owner:
            return os.getppid() != owner
        return not pid_alive(owner)

    def cancel_wanted(self) -> bool:
        return self.signalled.is_set() or self.job_dir.cancel_requested

    def stop(self, state: JobState, message: str) -> None:
        self.stop_reason = (state, message)
        self.stop_all()

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                signal_session(process.pid, signal.SIGTERM)
        self.kill_at = time.monotonic() + float(self.request.get("stop_grace_period", 10.0))

    def kill_all(self) -> None:
        for process in self.processes.values():
            signal_session(process.pid, signal.SIGKILL)

    def wait_all(self) -> None:
        for process in self.processes.values():
            process.wait()

    def running(self) -> bool:
        return any(process.poll() is None for process in self.processes.values())

    def record_exits(self) -> None:
        changed = False
        for host, process in self.processes.items():
            entry = self.state["hosts"][host]
            if entry["exit_code"] is None and process.returncode is not None:
                code = process.returncode
                entry.update(exit_code=code if code >= 0 else 128 - code, ended=time.time(), state=(JobState.SUCCEEDED if code == 0 else JobState.FAILED).value)
                changed = True
        if changed:
            self.save()

    def first_failure_time(self) -> float | None:
        ends = [entry["ended"] for entry in self.state["hosts"].values() if entry.get("exit_code") not in (None, 0)]
        return min(ends) if ends else None

    # --- the outcome ----------------------------------------------------------------------------

    def conclude(self) -> int:
        if self.stop_reason is not None and self.stop_reason[0] is JobState.CANCELLED:
            return self.finish(JobState.CANCELLED, self.stop_reason[1])
        failed = [entry for entry in self.state["hosts"].values() if entry["exit_code"] != 0]
        self.collect()
        if self.stop_reason is not None and self.stop_reason[1]:
            return self.finish(*self.stop_reason)  # e.g. max_run: the ranks were stopped, none is to blame
        if not failed:
            if not self.request.get("keep_job_dir", True):
                remove_host_trees(self.job_dir, list(self.processes))
            return self.finish(JobState.SUCCEEDED, "")
        failure = self.root_cause()
        return self.finish(JobState.FAILED, _failure_line(failure), failure=failure)

    def collect(self) -> None:
        """Artifacts are collected whether the job succeeded or failed, as SageMaker uploads both."""
        artifacts = self.request["artifacts"]
        trees = [OptMl(Path(host["base_dir"])) for host in self.request["hosts"]]
        try:
            model, output = collect_artifacts(trees, Path(artifacts["model_data"]).parent)
        except OSError as exc:
            self.update(message=f"could not collect the artifacts: {exc}")
            return
        self.update(model_data=str(model), output_data=str(output))

    def root_cause(self) -> dict[str, Any] | None:
        """The earliest rank error across all hosts (torchelastic's rule), else the first host that failed."""
        errors = sorted(self.rank_errors(), key=lambda error: error.get("timestamp") or float("inf"))
        if errors:
            first = errors[0]
            self.state["other_failures"] = [_brief(error) for error in errors[1:]]
            self.state["error_file"] = first["_path"]
            self.state["rank_log"] = str(OptMl(Path(first["_base_dir"])).rank_log_file(first["rank"])) if first.get("rank") is not None else None
            message = f"{first.get('error_type')}: {first.get('message')}" if first.get("error_type") else str(first.get("message", ""))
            return {"host": first["host"], "rank": first.get("rank"), "exit_code": int(first.get("exit_code") or 1), "message": message, "traceback": first.get("traceback", ""), "timestamp": first.get("timestamp")}
        return self.runtime_verdict()

    def runtime_verdict(self) -> dict[str, Any] | None:
        """No rank left an error file (it was killed, or the runtime itself failed): use the root cause the
        runtimes agreed on in their failure files, else the first host whose runtime failed."""
        failed = sorted((entry["ended"], name) for name, entry in self.state["hosts"].items() if entry.get("exit_code") not in (None, 0))
        for _, name in failed:
            reason = contract.read_failure(OptMl(Path(self.host_request(name)["base_dir"]))) or ""
            verdict = parse_failure_reason(reason)
            if verdict is not None:
                return verdict
        if not failed:
            return None
        ended, name = failed[0]
        entry = self.state["hosts"][name]
        reason = contract.read_failure(OptMl(Path(self.host_request(name)["base_dir"]))) or ""
        first_line = reason.strip().splitlines()[0] if reason.strip() else f"the runtime exited with code {entry['exit_code']}"
        return {"host": name, "rank": None, "exit_code": entry["exit_code"], "message": first_line, "traceback": reason, "timestamp": ended}

    def rank_errors(self) -> list[dict[str, Any]]:
        found = []
        for host in self.request["hosts"]:
            errors_dir = OptMl(Path(host["base_dir"])).errors_dir
            for path in sorted(glob.glob(str(errors_dir / "*.json"))):
                try:
                    error = json.loads(Path(path).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if isinstance(error, dict):
                    error.setdefault("host", host["host"])
                    error["host"] = error["host"] or host["host"]
                    error["_base_dir"], error["_path"] = host["base_dir"], path
                    found.append(error)
        return found

    def host_request(self, name: str) -> dict[str, Any]:
        return next(host for host in self.request["hosts"] if host["host"] == name)

    def finish(self, state: JobState, message: str, failure: dict[str, Any] | None = None) -> int:
        self.update(state=state.value, message=message or self.state.get("message", ""), failure=failure, ended=time.time())
        return 0

    def update(self, **changes: Any) -> None:
        self.state.update(changes)
        self.save()

    def save(self) -> None:
        self.job_dir.write_state(self.state)


# Variables that say which job and rank a process belongs to. A job launched from inside another one
# (a notebook on SageMaker, a rank) must not inherit them; the runtime sets its own.
_IDENTITY_PREFIXES = ("SM_", "SMDATAPARALLEL_", "TORCHELASTIC_")
_IDENTITY_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "NODE_RANK", "ROLE_RANK", "TRAINING_JOB_NAME", contract.ERROR_FILE_ENV, contract.BASE_DIR_ENV,
})


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without another job's identity (the spec's ``environment`` is added after)."""
    return {key: value for key, value in environ.items() if key not in _IDENTITY_NAMES and not key.startswith(_IDENTITY_PREFIXES)}


def parse_failure_reason(reason: str) -> dict[str, Any] | None:
    """The root cause a runtime wrote to ``output/failure`` (see contract.RootCause), with the rest of the
    text as its traceback, or None when the text names none."""
    cause = contract.parse_root_cause(reason)
    if cause is None:
        return None
    lines = reason.strip().splitlines()
    return {
        "host": cause.host,
        "rank": cause.rank,
        "exit_code": cause.exit_code,
        "message": cause.message,
        "traceback": "\n".join(lines[1:]).strip(),
        "timestamp": None,
    }


def _brief(error: dict[str, Any]) -> dict[str, Any]:
    return {key: error.get(key) for key in ("host", "rank", "exit_code", "error_type", "message", "timestamp")}


def _failure_line(failure: dict[str, Any] | None) -> str:
    if failure is None:
        return "a host failed"
    where = f"{failure['host']}/rank{failure['rank']}" if failure.get("rank") is not None else failure["host"]
    return f"{where} exited with code {failure['exit_code']}: {failure['message']}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m smddp_sdk.schedulers.local_supervisor <job_dir>", file=sys.stderr)
        return 2
    supervisor = Supervisor(JobDir(Path(argv[0])))
    try:
        return supervisor.run()
    except BaseException as exc:  # noqa: BLE001 - whatever stops the supervisor must end up in state.json
        supervisor.kill_all()
        supervisor.finish(JobState.FAILED, f"the local supervisor crashed: {type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
