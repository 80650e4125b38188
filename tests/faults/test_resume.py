"""The proof that a job interrupted twice resumes exactly: a lost host (its runtime SIGKILLed, retried under
max_retry_attempts) and a spot interruption, each resumed from the checkpoints synced so far, end with
parameters bitwise equal to an uninterrupted run's (``-m faults``; 2 hosts x 1 rank, torch on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.resume_bench import load_params, run_interrupted, run_straight
from smddp_sdk.specs.status import JobState

pytest.importorskip("torch")
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]


def test_a_job_interrupted_twice_ends_bitwise_equal_to_one_that_ran_straight(tmp_path: Path) -> None:
    straight = run_straight(tmp_path)
    interrupted = run_interrupted(tmp_path)
    assert straight.status.state is JobState.SUCCEEDED, straight.status
    assert interrupted.status.state is JobState.SUCCEEDED, interrupted.status
    assert [item.outcome for item in interrupted.status.attempts] == ["Restarting", "Interrupted", "Completed"]
    statuses = [item.status for item in interrupted.status.transitions]
    assert statuses[statuses.index("Interrupted") :] == ["Interrupted", "Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert len(interrupted.resumed_at) == 2 and all(epoch > 2 for epoch in interrupted.resumed_at), interrupted.resumed_at
    expected, got = load_params(straight.params), load_params(interrupted.params)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert tensor.numpy().tobytes() == got[name].numpy().tobytes(), name
