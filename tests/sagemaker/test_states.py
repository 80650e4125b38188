"""SageMaker's states and failure reasons, read as JobState and Failure."""

from __future__ import annotations

import pytest

from smddp_sdk.schedulers.sagemaker import states
from smddp_sdk.specs.failure import FailureRecord, failure_reason
from smddp_sdk.specs.status import JobState


@pytest.mark.parametrize(
    ("primary", "secondary", "expected"),
    [
        ("InProgress", "Starting", JobState.PENDING),
        ("InProgress", "LaunchingMLInstances", JobState.STARTING),
        ("InProgress", "Downloading", JobState.STARTING),
        ("InProgress", "Training", JobState.RUNNING),
        ("InProgress", "Uploading", JobState.RUNNING),
        ("Stopping", "Stopping", JobState.RUNNING),
        ("Completed", "Completed", JobState.SUCCEEDED),
        ("Failed", "Failed", JobState.FAILED),
        ("Stopped", "MaxRuntimeExceeded", JobState.CANCELLED),
        ("Mystery", "", JobState.UNKNOWN),
    ],
)
def test_job_states(primary: str, secondary: str, expected: JobState) -> None:
    assert states.job_state({"TrainingJobStatus": primary, "SecondaryStatus": secondary}) is expected


def test_failure_reason_written_by_our_runtime() -> None:
    root = FailureRecord(host="algo-2", rank=3, exit_code=7, error_type="ZeroDivisionError", message="division by zero",
                       timestamp=1.0, traceback='Traceback (most recent call last):\n  File "train.py", line 9\nZeroDivisionError: division by zero')
    other = FailureRecord(host="algo-1", rank=0, exit_code=1, error_type="RuntimeError", message="peer lost", timestamp=2.0)
    reason = "AlgorithmError: " + failure_reason(root, [other])  # SageMaker prefixes the failure file's text
    failure = states.failure({"TrainingJobStatus": "Failed", "FailureReason": reason})
    assert (failure.host, failure.rank, failure.exit_code) == ("algo-2", 3, 7)
    assert failure.message == "ZeroDivisionError: division by zero"
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert "peer lost" not in failure.traceback


def test_failure_reason_of_aws_toolkit_and_of_a_runtime_failure() -> None:
    toolkit = "AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage \"RuntimeError: CUDA out of memory\"\nCommand \"/opt/conda/bin/python3.10 train.py\", exit code: 1"
    failure = states.failure({"TrainingJobStatus": "Failed", "FailureReason": toolkit})
    assert (failure.host, failure.rank, failure.exit_code) == ("", None, 1)
    assert failure.message == '"RuntimeError: CUDA out of memory"'
    runtime = "Root cause: the runtime on host algo-4 failed with exit code 137: Killed\nExitCode 137\n"
    failure = states.failure({"TrainingJobStatus": "Failed", "FailureReason": runtime})
    assert (failure.host, failure.rank, failure.exit_code) == ("algo-4", None, 137)
    assert states.failure({"TrainingJobStatus": "Completed"}) is None
