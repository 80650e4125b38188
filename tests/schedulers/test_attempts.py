"""SageMaker's retry rule, the timeline of attempts and the interruption request (``hosttree.attempts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.hosttree.attempts import INTERRUPT_FILE, Interruption, Timeline, request_interrupt, retry_reason, take_interrupt
from smddp_sdk.schedulers.local import LocalScheduler
from smddp_sdk.schedulers.options import interrupt_times
from smddp_sdk.specs.failure import SOURCE_ERROR_FILE, SOURCE_RUNTIME, SOURCE_SUPERVISOR, FailureRecord
from smddp_sdk.specs.job import JobSpec, RetryPolicy

KILLED_RUNTIME = FailureRecord("algo-2", None, 137, "the runtime was killed by SIGKILL", error_type="Signal", source=SOURCE_SUPERVISOR, signal="SIGKILL")
LOST_HOST = FailureRecord("algo-2", None, 1, "algo-2 stopped answering", error_type="LostPeer", source=SOURCE_RUNTIME)
SCRIPT_RAISED = FailureRecord("algo-1", 0, 1, "bad value", error_type="ValueError", source=SOURCE_ERROR_FILE)
BAD_SETUP = FailureRecord("algo-1", None, 2, "requirements.txt failed", error_type="SetupError", source=SOURCE_RUNTIME)


@pytest.mark.parametrize(
    ("root", "script_errors", "retried"),
    [
        (KILLED_RUNTIME, False, True),
        (LOST_HOST, False, True),
        (SCRIPT_RAISED, False, False),
        (SCRIPT_RAISED, True, True),
        (BAD_SETUP, False, False),
        (None, True, False),
    ],
)
def test_the_platforms_failures_are_retried_not_the_scripts(root: FailureRecord | None, script_errors: bool, retried: bool) -> None:
    assert bool(retry_reason(root, RetryPolicy(1, script_errors), retries_left=1)) is retried


def test_no_retry_is_left_after_max_retry_attempts() -> None:
    assert retry_reason(KILLED_RUNTIME, RetryPolicy(1, script_errors=True), retries_left=0) == ""
    assert "algo-2 exited with code 137" in retry_reason(KILLED_RUNTIME, RetryPolicy(1), retries_left=1)


def test_training_seconds_span_the_job_and_billable_seconds_leave_out_the_wait_for_capacity() -> None:
    timeline = Timeline({})
    for status, at in [("Starting", 0), ("Training", 2), ("Interrupted", 10), ("Starting", 40), ("Training", 41), ("Completed", 50)]:
        timeline.enter(status, now=at)
    timeline.close(now=50)
    assert (timeline.state["training_seconds"], timeline.state["billable_seconds"]) == (48, 20)


def test_an_interruption_request_is_taken_once_and_a_garbled_one_is_ignored(tmp_path: Path) -> None:
    request_interrupt(tmp_path, Interruption("algo-2", 1.5))
    assert take_interrupt(tmp_path) == Interruption("algo-2", 1.5)
    assert take_interrupt(tmp_path) is None
    (tmp_path / INTERRUPT_FILE).write_text("{not json")
    assert take_interrupt(tmp_path) is None
    assert not (tmp_path / INTERRUPT_FILE).exists()


@pytest.mark.parametrize(("value", "times"), [(None, ()), (60, (60.0,)), ([150, 60.5], (60.5, 150.0)), ("random:7-7", (7.0,))])
def test_interrupt_after_takes_seconds_a_list_or_a_random_range(value: object, times: tuple[float, ...]) -> None:
    assert LocalScheduler(interrupt_after=value).interrupt_after == times


def test_interrupt_after_draws_a_random_time_in_its_range() -> None:
    [drawn] = interrupt_times("random:30-120")
    assert 30 <= drawn <= 120


@pytest.mark.parametrize("value", [0, -5, "soon", "random:9-3", [], [1, "x"], True, float("nan")])
def test_interrupt_after_refuses_what_is_no_time(value: object) -> None:
    with pytest.raises(SpecError, match="interrupt_after"):
        LocalScheduler(interrupt_after=value)


def test_interrupt_after_needs_spot_instances(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    spec = JobSpec.from_mapping({"entry_point": str(script), "instance_type": "local"})
    with pytest.raises(SpecError, match="does not use spot instances"):
        LocalScheduler(job_root=tmp_path / "jobs", interrupt_after=30).dryrun(spec)
