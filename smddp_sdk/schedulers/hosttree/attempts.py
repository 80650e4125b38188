"""Attempts of a host-tree job: which failures are retried, spot interruptions, and what ``status`` shows.

SageMaker's rule ("Retry a training job", RetryStrategy), the job's ``RetryPolicy`` in its plan: a job is
retried, up to ``max_retry_attempts`` times, when the platform failed it -- an instance lost, a container or
runtime killed -- never when the script raised (``retry_script_errors`` widens that, for rehearsing a flaky
script, and is what torchrun's ``--max-restarts`` asks for). The supervisor counts the retries left down
from the policy's bound, as torch elastic's agent keeps ``_remaining_restarts``. A managed spot
interruption restarts the job whatever ``max_retry_attempts`` says, until ``max_wait`` (all attempts
together) passes: MaxWaitTimeExceeded. Each attempt keeps the job's name and restores the checkpoints
synced so far on every host.

What ``status`` shows comes from ``state.json``, the one record of the job: ``attempt``, ``attempts``
(one entry per attempt, with how it ended and its goodput marks: when its hosts started, its process group
formed and its first collective came, the fault and when it was noticed, its newest checkpoint; ``marks`` while it runs;
``specs.goodput``), ``transitions`` (SageMaker's SecondaryStatusTransitions: status, start, end,
message), and ``training_seconds``/``billable_seconds`` computed as SageMaker's TrainingTimeInSeconds
(first Training to the end) and BillableTimeInSeconds (the time the hosts ran).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smddp_sdk.specs.failure import SOURCE_SUPERVISOR, FailureRecord
from smddp_sdk.specs.job import RetryPolicy

INTERRUPT_FILE = "interrupt-requested"  # written by ``smddp-launch interrupt``, taken by the supervisor
# What a runtime reports when a host went away: the platform's failure, not the script's.
_LOST_HOST = frozenset({"HostNeverJoined", "LostPeer", "LostCoordinator", "SupervisorGone"})

# SageMaker's secondary statuses used here.
STARTING, DOWNLOADING, TRAINING, UPLOADING = "Starting", "Downloading", "Training", "Uploading"
INTERRUPTED, RESTARTING = "Interrupted", "Restarting"
COMPLETED, FAILED, STOPPED = "Completed", "Failed", "Stopped"
LIMITS_EXCEEDED = ("MaxRuntimeExceeded", "MaxWaitTimeExceeded")  # final statuses named by the job's message


@dataclass(frozen=True)
class Interruption:
    """A spot-style interruption asked for on demand: which host loses its instance (None: every host),
    and how long capacity takes to come back before the job restarts."""

    host: str | None = None
    wait: float = 0.0

    @property
    def what(self) -> str:
        return f"the instance of {self.host}" if self.host else "every instance"


def request_interrupt(job_path: Path, interruption: Interruption) -> None:
    target = job_path / INTERRUPT_FILE
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps({"host": interruption.host, "wait": interruption.wait}), encoding="utf-8")
    partial.replace(target)  # the supervisor never reads half a request


def take_interrupt(job_path: Path) -> Interruption | None:
    """The pending interruption request, removed as it is taken; None when there is none."""
    target = job_path / INTERRUPT_FILE
    try:
        text = target.read_text(encoding="utf-8")
    except OSError:
        return None
    target.unlink(missing_ok=True)
    try:
        data = json.loads(text)
    except ValueError:
        return None
    host = data.get("host") if isinstance(data, dict) else None
    wait = data.get("wait") if isinstance(data, dict) else 0
    return Interruption(host if isinstance(host, str) else None, float(wait) if isinstance(wait, (int, float)) else 0.0)


def is_platform_failure(root: FailureRecord) -> bool:
    """A failure SageMaker retries: a host's runtime or container that died by itself, or a host lost."""
    return root.rank is None and (root.source == SOURCE_SUPERVISOR or root.error_type in _LOST_HOST)


def retry_reason(root: FailureRecord | None, policy: RetryPolicy, *, retries_left: int) -> str:
    """Why the failed attempt is retried under ``policy``, with ``retries_left`` of its retries left, or ""
    when it is not (the job then fails with ``root``)."""
    if root is None or retries_left <= 0:
        return ""
    if is_platform_failure(root):
        return f"the platform failed it ({root.summary()})"
    if policy.script_errors:
        return f"the script failed and retry_script_errors is set ({root.summary()})"
    return ""


class Timeline:
    """The transitions and attempts of one job, kept in (and written back to) the supervisor's state."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        state.setdefault("attempt", 1)
        state.setdefault("attempts", [])
        state.setdefault("transitions", [])

    @property
    def attempt(self) -> int:
        return int(self.state["attempt"])

    def enter(self, status: str, message: str = "", now: float | None = None) -> None:
        """Close the current transition and open ``status`` (the last one stays open until the job ends)."""
        now = time.time() if now is None else now
        transitions: list[dict[str, Any]] = self.state["transitions"]
        if transitions and transitions[-1].get("end") is None:
            transitions[-1]["end"] = now
        transitions.append({"status": status, "start": now, "end": None, "message": message})

    def close(self, now: float | None = None) -> None:
        transitions = self.state["transitions"]
        if transitions and transitions[-1].get("end") is None:
            transitions[-1]["end"] = time.time() if now is None else now
        self.state["training_seconds"] = self.training_seconds()
        self.state["billable_seconds"] = self.billable_seconds()

    def end_attempt(self, outcome: str, reason: str, started: float, now: float | None = None) -> None:
        """Close the attempt with how it ended and its goodput marks (``specs.goodput``), kept in ``marks``
        while it ran."""
        now = time.time() if now is None else now
        marks = self.state.pop("marks", None) or {}
        self.state["attempts"].append({**marks, "attempt": self.attempt, "started": started, "ended": now, "outcome": outcome, "reason": reason})
        self.state["interruptions"] = sum(1 for item in self.state["attempts"] if item["outcome"] == INTERRUPTED)

    def mark(self, name: str, when: float, *, earliest: bool = False) -> bool:
        """Note a goodput mark of the running attempt (the first one stays; ``earliest``: the earliest one);
        True when it changed."""
        marks = self.state.setdefault("marks", {})
        if name in marks and (not earliest or marks[name] <= when):
            return False
        marks[name] = when
        return True

    def next_attempt(self) -> int:
        self.state["attempt"] = self.attempt + 1
        return self.attempt

    def training_seconds(self) -> int:
        """SageMaker's TrainingTimeInSeconds: from the first Training to the end, interruptions included."""
        starts = [t["start"] for t in self.state["transitions"] if t["status"] == TRAINING]
        ends = [t["end"] for t in self.state["transitions"] if t.get("end") is not None]
        return int(round(max(ends) - starts[0])) if starts and ends else 0

    def billable_seconds(self) -> int:
        """SageMaker's BillableTimeInSeconds (per instance): the wall-clock time the hosts existed, every
        attempt counted, the wait for capacity after an interruption not."""
        running = [t for t in self.state["transitions"] if t["status"] not in (INTERRUPTED,) and t.get("end") is not None]
        return int(round(sum(t["end"] - t["start"] for t in running)))
