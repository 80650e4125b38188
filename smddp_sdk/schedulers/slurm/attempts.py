"""The attempts of a Slurm job (each requeue is one) and their goodput marks, from its job directory: the batch
script's ``attempts.jsonl`` (a line as each attempt starts, and one with its exit code as it ends), the nodes'
``output/events.jsonl`` (the process group formed, the first collective), their failure records and the times of the checkpoint files.

What Slurm cannot tell is left unknown, never guessed: when a failure was noticed (``detected``), so a Slurm
recovery's ``detect`` and ``stop`` phases are unknown and its ``restart`` runs from the failed attempt's end to
the next attempt's start (Slurm's requeue, the checkpoint restore); the fault is the earliest failure record
of the attempt, or its end when no node left one.
"""

from __future__ import annotations

import json
from typing import Any

from smddp_sdk.specs import contract, events, goodput
from smddp_sdk.specs.archives import read_inside
from smddp_sdk.specs.contract import OptMl
from smddp_sdk.specs.slurm_job import SlurmJobDir


def attempt_lines(job_dir: SlurmJobDir) -> dict[int, dict[str, Any]]:
    """Attempt number -> what its lines say (started; ended and code once it ended)."""
    attempts: dict[int, dict[str, Any]] = {}
    try:
        text = job_dir.attempts_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return attempts
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("attempt"), int):
            attempts.setdefault(item["attempt"], {}).update({key: value for key, value in item.items() if isinstance(value, (int, float))})
    return attempts


def goodput_record(job_dir: SlurmJobDir, ended: float | None) -> dict[str, Any]:
    """The record ``specs.goodput.from_record`` reads, for a job that ended at ``ended`` (None: it runs)."""
    lines = attempt_lines(job_dir)
    numbers = sorted(number for number, item in lines.items() if "started" in item)
    if not numbers:
        return {}
    trees = [OptMl(path) for path in job_dir.node_trees()]
    texts = [(read_inside(tree.base, "output/events.jsonl", 1024 * 1024) or b"").decode("utf-8", "replace") for tree in trees]
    formed, firsts = (goodput.event_times(texts, event) for event in (events.PROCESS_GROUP_FORMED, events.FIRST_COLLECTIVE))
    failures = sorted(float(item["timestamp"]) for tree in trees for item in contract.read_failure_records(tree) or []
                      if isinstance(item, dict) and isinstance(item.get("timestamp"), (int, float)) and item["timestamp"] > 0)
    checkpoints = sorted(path.stat().st_mtime for path in job_dir.checkpoint_dir.rglob("*") if path.is_file()) if job_dir.checkpoint_dir.is_dir() else []
    record: dict[str, Any] = {"started": lines[numbers[0]]["started"], "ended": ended, "attempts": []}
    for index, number in enumerate(numbers):
        item = lines[number]
        start, end = item["started"], item.get("ended")
        later = index + 1 < len(numbers)
        marks = {"attempt": number, "started": start, "hosts_started": start, events.PROCESS_GROUP_FORMED: goodput.first_between(formed, start, end),
                 events.FIRST_COLLECTIVE: goodput.first_between(firsts, start, end)}
        if end is None and not later:
            record.update(attempt=number, attempt_started=start, marks=marks)
            continue
        failed = item.get("code", 1) != 0
        fault = next((when for when in failures if start <= when <= (end or when)), end) if failed else None
        newest = [when for when in checkpoints if start <= when <= (fault or end or when)]
        outcome = "Completed" if not failed else "Restarting" if later else "Failed"
        record["attempts"].append({**marks, "ended": end, "outcome": outcome, "fault": fault, "last_checkpoint": max(newest, default=None)})
    return record
