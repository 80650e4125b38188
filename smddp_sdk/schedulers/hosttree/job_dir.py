"""The on-disk state of one host-tree job, shared by its scheduler and its per-job supervisor.

Everything another process needs to answer ``status``, ``logs`` and ``cancel`` lives in the job directory
(``<job_root>/<job_name>/``, drawn in docs/local-mode.md), so a job started by one Python process can be
watched or stopped from any other.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from smddp_sdk.schedulers.hosttree.plan import HostTreePlan
from smddp_sdk.specs import processes
from smddp_sdk.specs.contract import Below
from smddp_sdk.specs.json_files import read_json_object, write_json_atomic
from smddp_sdk.specs.status import JobState


@dataclass(frozen=True)
class JobDir:
    """Paths and atomic reads/writes of one local job's directory."""

    path: Path

    record_file = Below("path", "job.json")
    state_file = Below("path", "state.json")
    cancel_file = Below("path", "cancel-requested")
    console_log = Below("path", "console.log")
    supervisor_log = Below("path", "supervisor.log")
    code_dir = Below("path", "code")

    def host_dir(self, host: str) -> Path:
        return self.path / host

    def exists(self) -> bool:
        return self.record_file.is_file()

    def read_record(self) -> dict[str, Any]:
        return json.loads(self.record_file.read_text(encoding="utf-8"))

    @cached_property
    def record(self) -> dict[str, Any] | None:
        """``job.json``, read once per ``JobDir`` (None when it cannot be read)."""
        return read_json_object(self.record_file)

    @cached_property
    def plan(self) -> HostTreePlan:
        """The job's plan from its record, read once per ``JobDir``: once per process for the supervisor,
        once per call for the scheduler's ``status``, ``cancel`` and ``interrupt``."""
        return HostTreePlan.from_record(self.record or {})

    def write_record(self, record: Mapping[str, Any]) -> None:
        write_json_atomic(self.record_file, record)

    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"state": JobState.PENDING.value}

    def write_state(self, state: Mapping[str, Any]) -> None:
        write_json_atomic(self.state_file, state)

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_file.exists()

    def request_cancel(self) -> None:
        self.cancel_file.touch()


# --- processes ----------------------------------------------------------------------------------


def is_supervisor_of(pid: int | None, job_dir: Path) -> bool:
    """True when ``pid`` is alive and is this job's supervisor (guards against a recycled pid)."""
    if not processes.pid_alive(pid):
        return False
    args = processes.command_line(pid) if pid else None
    if args is None:
        return True  # no /proc (macOS): trust the pid
    # ... -m smddp_sdk.schedulers.hosttree.supervisor <job dir>; the root may be spelt another way (a symlink)
    return len(args) >= 2 and args[-2].endswith("supervisor") and Path(args[-1]).resolve() == job_dir.resolve()


# --- ports --------------------------------------------------------------------------------------


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int, address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def pick_free_ports(count: int, *, exclude: Iterable[int] = (), address: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free now and unlikely to be taken before the job binds them.

    They come from outside the kernel's ephemeral range, so no outgoing connection or ``bind(0)`` on this
    machine can be handed one of them meanwhile; ``exclude`` keeps other live jobs' ports out.
    """
    low, high = _ephemeral_range()
    candidates = list(range(20000, low)) if low > 21000 else list(range(high + 1, 65536))
    taken = set(exclude)
    rng = random.Random()
    rng.shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        if port not in taken and _bindable(port, address):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise OSError(f"no {count} free TCP ports found on {address}")


def ports_of_live_jobs(job_root: Path, *, skip: Path | None = None) -> set[int]:
    """Ports held by the other unfinished jobs under ``job_root`` (cheap: one small file per job)."""
    taken: set[int] = set()
    for job in job_root.iterdir() if job_root.is_dir() else ():
        if job == skip:
            continue
        try:
            state = JobDir(job).read_state() if (job / "state.json").is_file() else {}
        except (OSError, ValueError):
            continue  # another job's broken state must not stop this one from starting (`list` shows it)
        if isinstance(state, dict) and state.get("state") in (JobState.STARTING.value, JobState.RUNNING.value):
            taken.update(int(port) for port in (state.get("ports") or {}).values())
    return taken


# --- logs ---------------------------------------------------------------------------------------


def follow_lines(path: Path, finished: Any, *, poll: float = 0.1) -> Iterator[str]:
    """Complete lines of a growing file until ``finished()`` is true and the file is drained. Only
    ``\n`` ends a line: a progress bar's ``\r`` redraws stay in their line (and keep its prefix)."""
    while not path.exists():
        if finished():
            return
        time.sleep(poll)
    with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
        pending = ""
        while True:
            chunk = handle.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
                continue
            if finished():
                rest = handle.read()
                pending += rest
                yield from (line for line in pending.split("\n") if line)
                return
            time.sleep(poll)
