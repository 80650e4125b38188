"""Ctrl-C while following: local jobs are cancelled (see test_run_local), remote jobs keep running."""

from __future__ import annotations

import pytest

from smddp_sdk.cli.cmd_run import interrupted
from smddp_sdk.cli.output import Console
from smddp_sdk.specs.status import JobHandle


class MustNotCancel:
    """Stands in for a remote scheduler: being asked to cancel is the failure under test."""

    def cancel(self, handle: JobHandle) -> None:
        raise AssertionError(f"{handle} must keep running after Ctrl-C")


def test_remote_jobs_keep_running_and_the_reattach_command_is_printed(capsys: pytest.CaptureFixture[str]):
    handle = JobHandle("sagemaker", "us-west-2/mnist-1")
    interrupted(Console("never"), MustNotCancel(), handle)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "Interrupted. The job keeps running on sagemaker:" in err
    assert "smddp-launch logs sagemaker://us-west-2/mnist-1 --follow" in err
    assert "smddp-launch cancel sagemaker://us-west-2/mnist-1" in err
