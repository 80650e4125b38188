"""Recovery phases as typed events: one JSON object per line in an ``events.jsonl`` (docs/resuming.md).

The supervisor writes ``<job dir>/events.jsonl``; a host's runtime and ranks write ``output/events.jsonl``
in that host's tree. Every line is one ``write`` on a file opened for appending, so lines of several
writers never interleave. Stdlib only: the supervisor, the runtime and the ranks all use it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ATTEMPT_ENV = "SMDDP_ATTEMPT"  # the supervisor to the runtimes (and they to their ranks): which attempt runs
FILE_NAME = "events.jsonl"

# The names docs/resuming.md defines, in the order a recovery passes them.
FAULT, RESTART, HOSTS_STARTED = "fault", "restart", "hosts_started"
RANKS_STARTED, PROCESS_GROUP_FORMED, STATE_RESTORED, FIRST_STEP = "ranks_started", "process_group_formed", "state_restored", "first_step"
FIRST_COLLECTIVE = "first_collective"  # the group's first call: training again (specs/goodput.py)
PEER_LOST, GROUP_REFORMED = "peer_lost", "group_reformed"
NAMES = (FAULT, RESTART, HOSTS_STARTED, RANKS_STARTED, PROCESS_GROUP_FORMED, STATE_RESTORED, FIRST_STEP, FIRST_COLLECTIVE, PEER_LOST, GROUP_REFORMED)


def record(path: Path, event: str, *, attempt: int, host: str | None = None, rank: int | None = None, **fields: Any) -> None:
    """Append one event; a file that cannot be written loses the event, never the job."""
    line = event_line(event, time.time(), attempt=attempt, host=host, rank=rank, **fields)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def event_line(event: str, when: float, *, attempt: int | None, host: str | None = None, rank: int | None = None, **fields: Any) -> str:
    """One line of an events file."""
    if event not in NAMES:
        raise ValueError(f"unknown recovery event {event!r}; one of {', '.join(NAMES)}")
    return json.dumps({"event": event, "time": when, "attempt": attempt, "host": host, "rank": rank, **fields}, separators=(",", ":")) + "\n"


def read(path: Path) -> list[dict[str, Any]]:
    """The events of one file, in the order written; lines that are not an event object are skipped."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("event") in NAMES and isinstance(item.get("time"), (int, float)):
            found.append(item)
    return found


def attempt_of(environ: Mapping[str, str]) -> int:
    raw = environ.get(ATTEMPT_ENV, "1")
    return int(raw) if raw.isdigit() else 1


def record_from_rank(event: str, environ: Mapping[str, str] | None = None, **fields: Any) -> None:
    """A rank's event, into its host's ``output/events.jsonl`` (SM_OUTPUT_DIR); nothing outside a job."""
    environ = os.environ if environ is None else environ
    output = environ.get("SM_OUTPUT_DIR")
    if not output:
        return
    rank = environ.get("RANK", "")
    record(Path(output) / FILE_NAME, event, attempt=attempt_of(environ), host=environ.get("SM_CURRENT_HOST"), rank=int(rank) if rank.isdigit() else None, **fields)
