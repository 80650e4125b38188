"""SageMaker's training job states, read as the product's JobState, FailureRecord and status lines."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from smddp_sdk.specs.failure import FailureRecord, parse_failure_reason
from smddp_sdk.specs.status import JobState, Transition
from smddp_sdk.specs.status import billing_lines as billing_lines_of

# TrainingJobStatus -> JobState; "InProgress" is refined by the secondary status below.
_PRIMARY = {"Completed": JobState.SUCCEEDED, "Failed": JobState.FAILED, "Stopped": JobState.CANCELLED, "Stopping": JobState.RUNNING}
_STARTING = frozenset({"Starting", "LaunchingMLInstances", "PreparingTrainingStack", "Downloading", "DownloadingTrainingImage", "Restarting", "Pending", "Updating", "Interrupted"})


def job_state(description: dict[str, Any]) -> JobState:
    primary = description.get("TrainingJobStatus", "")
    if primary in _PRIMARY:
        return _PRIMARY[primary]
    if primary != "InProgress":
        return JobState.UNKNOWN
    secondary = description.get("SecondaryStatus", "")
    if secondary in ("Starting", "Pending"):
        return JobState.PENDING
    return JobState.STARTING if secondary in _STARTING else JobState.RUNNING


def status_message(description: dict[str, Any]) -> str:
    transitions = description.get("SecondaryStatusTransitions") or []
    latest = transitions[-1].get("StatusMessage", "") if transitions else ""
    secondary = description.get("SecondaryStatus") or description.get("TrainingJobStatus", "")
    return f"{secondary} - {latest}" if latest else str(secondary)


def failure(description: dict[str, Any]) -> FailureRecord | None:
    """The root cause from FailureReason, which holds the text our runtime (or AWS's toolkit) wrote to
    /opt/ml/output/failure: host, rank, exit code, error and the traceback's tail."""
    if description.get("TrainingJobStatus") != "Failed":
        return None
    reason = str(description.get("FailureReason") or "the job failed without a reason; see its logs")
    return parse_failure_reason(reason, timestamp=_epoch(description.get("TrainingEndTime")))


def new_transitions(description: dict[str, Any], already_shown: int) -> list[tuple[float | None, str]]:
    """SageMaker's secondary status changes not shown yet, as (start time, v2-style line
    ``<time> <Status> - <message>``)."""
    transitions = description.get("SecondaryStatusTransitions") or []
    return [(_epoch(t.get("StartTime")), _transition_line(t)) for t in transitions[already_shown:]]


def _transition_line(transition: dict[str, Any]) -> str:
    start = transition.get("StartTime")
    stamp = start.strftime("%Y-%m-%d %H:%M:%S") if isinstance(start, datetime) else str(start or "")
    message = transition.get("StatusMessage", "")
    return f"{stamp} {transition.get('Status', '')}" + (f" - {message}" if message else "")


# Secondary statuses that end an attempt: a spot interruption, or a retry under RetryStrategy.
_NEW_ATTEMPT = frozenset({"Interrupted", "Restarting"})


def attempt_fields(description: dict[str, Any]) -> dict[str, Any]:
    """``JobStatus``' attempt, interruptions, transitions and seconds, in the shape local and docker jobs record
    them (``hosttree.attempts``): the attempt counts the Interrupted and Restarting transitions, as
    DescribeTrainingJob has no field for it."""
    transitions = tuple(
        Transition(item.get("Status", ""), _epoch(item.get("StartTime")), _epoch(item.get("EndTime")), item.get("StatusMessage", ""))
        for item in description.get("SecondaryStatusTransitions") or []
    )
    return {
        "attempt": 1 + sum(item.status in _NEW_ATTEMPT for item in transitions),
        "interruptions": sum(item.status == "Interrupted" for item in transitions),
        "transitions": transitions,
        "training_seconds": description.get("TrainingTimeInSeconds"),
        "billable_seconds": description.get("BillableTimeInSeconds"),
    }


def billing_lines(description: dict[str, Any]) -> list[str]:
    """The seconds SageMaker bills (per instance, times the instance count) and spot savings."""
    count = int(description.get("ResourceConfig", {}).get("InstanceCount", 1))
    return billing_lines_of(description.get("TrainingTimeInSeconds"), description.get("BillableTimeInSeconds"), instances=count, spot=bool(description.get("EnableManagedSpotTraining")))


def _epoch(value: Any) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else None
