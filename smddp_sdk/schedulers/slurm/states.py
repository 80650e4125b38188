"""Slurm's job states as the project's, with a message that says what happened in the user's terms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smddp_sdk.schedulers.slurm.client import NEVER_STARTS, JobInfo
from smddp_sdk.specs.job import RetryPolicy
from smddp_sdk.specs.status import JobState

_STATES = {
    **dict.fromkeys(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"), JobState.PENDING),
    "CONFIGURING": JobState.STARTING,
    **dict.fromkeys(("RUNNING", "COMPLETING", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED"), JobState.RUNNING),
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    **dict.fromkeys(("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"), JobState.FAILED),
}
_STOPPED_CODES = (128 + 15, 128 + 2)  # how a step stopped by SIGTERM or SIGINT ends
ENDINGS = {
    "NODE_FAIL": "a node of the job failed and Slurm ended the job",
    "TIMEOUT": "the job reached its time limit (max_run)",
    "OUT_OF_MEMORY": "a node ran out of memory",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job reached its deadline",
    "PREEMPTED": "the job was preempted",
}


def job_state(info: JobInfo | None, result: Mapping[str, Any] | None, *, cancel_requested: bool, retry: RetryPolicy) -> tuple[JobState, str]:
    """The job's state and a one-line message, from Slurm (when it still knows the job) and result.json."""
    if info is None:
        if result is not None:
            code = int(result.get("exit_code", 1))
            if cancel_requested and code in _STOPPED_CODES:  # the step's end by the cancel's signal is no failure
                return JobState.CANCELLED, "cancelled (smddp-launch cancel)"
            return (JobState.SUCCEEDED, "") if code == 0 else (JobState.FAILED, f"the job step ended with exit code {code}")
        if cancel_requested:
            return JobState.CANCELLED, "cancelled"
        return JobState.UNKNOWN, "Slurm no longer knows this job and it left no result (was the batch script killed?)"
    state = _STATES.get(info.state.rstrip("+"), JobState.UNKNOWN)
    if state is JobState.PENDING:
        return state, _pending_message(info)
    if state is JobState.FAILED and info.state in ENDINGS:
        requeue = "; not requeued (no max_retry_attempts)" if not retry.max_retry_attempts else f" after {info.restarts} restarts"
        return state, f"{ENDINGS[info.state]} (Slurm {info.state}{', ' + info.reason if info.reason not in ('', 'None') else ''}){requeue}"
    if state is JobState.FAILED:
        return state, f"the job failed (Slurm {info.state}, exit code {info.exit_code})"
    if state is JobState.CANCELLED:
        return state, "cancelled" + (" (smddp-launch cancel)" if cancel_requested else " (scancel)")
    if state is JobState.UNKNOWN:
        return state, f"Slurm state {info.state}"
    return state, ""


def _pending_message(info: JobInfo) -> str:
    restarted = f"requeued (restart {info.restarts}); " if info.restarts else ""
    reason = info.reason if info.reason not in ("", "None") else "queued"
    if reason in NEVER_STARTS:
        return f"{restarted}waiting for {reason}: it will never start as asked; cancel it and ask for fewer nodes or another partition"
    return f"{restarted}waiting in the queue ({reason})"
