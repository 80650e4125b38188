"""launcher.follow / failure_summary / raise_for_status, over a finished local job directory."""

import io

import pytest

from smddp_sdk import launcher
from smddp_sdk.errors import JobFailedError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.hosttree.job_dir import JobDir
from smddp_sdk.specs.failure import FailureRecord
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus

CONSOLE = """[algo-1]: job j: launch shape smdistributed
[algo-1/rank0]: epoch 1 loss 2.30
[algo-2/rank3]: epoch 1 loss 2.29
[algo-2/rank3]: Traceback (most recent call last):
[algo-2]: rank 3 failed
"""
FAILURE = {
    "host": "algo-2",
    "rank": 3,
    "exit_code": 7,
    "message": "ValueError: bad batch",
    "traceback": 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad batch\n',
    "timestamp": 1_700_000_000.0,
}


@pytest.fixture()
def finished_job(tmp_path):
    job = JobDir(tmp_path / "j")
    job.path.mkdir()
    job.write_record({"handle": "local://j", "plan": {"stop_grace_period": 1, "artifacts": {"model_data": str(job.path / "model.tar.gz"), "output_data": str(job.path / "output.tar.gz")}}})
    job.console_log.write_text(CONSOLE)
    job.write_state(
        {
            "state": "FAILED",
            "message": "algo-2/rank3 exited with code 7",
            "failure": FAILURE,
            "hosts": {"algo-1": {"state": "FAILED", "exit_code": 143}, "algo-2": {"state": "FAILED", "exit_code": 7}},
            "other_failures": [{"host": "algo-1", "rank": 0, "exit_code": 130, "error_type": "KeyboardInterrupt", "message": ""}],
            "rank_log": "/jobs/j/algo-2/output/logs/rank-3.log",
            "error_file": "/jobs/j/algo-2/output/errors/rank-3.json",
        }
    )
    return get_scheduler("local", job_root=str(tmp_path)), JobHandle("local", "j")


def test_follow_prints_prefixed_lines_and_returns_the_final_status(finished_job):
    scheduler, handle = finished_job
    out = io.StringIO()
    status = launcher.follow(scheduler, handle, out=out)
    assert out.getvalue() == CONSOLE
    assert status.state is JobState.FAILED and status.failure.rank == 3
    assert [(host.host, host.exit_code) for host in status.hosts] == [("algo-1", 143), ("algo-2", 7)]


def test_follow_filters_hosts_and_ranks(finished_job):
    scheduler, handle = finished_job
    out = io.StringIO()
    launcher.follow(scheduler, handle, out=out, ranks=[3])
    assert out.getvalue().splitlines() == ["[algo-2/rank3]: epoch 1 loss 2.29", "[algo-2/rank3]: Traceback (most recent call last):"]
    out = io.StringIO()
    launcher.follow(scheduler, handle, out=out, hosts=["algo-1"])
    assert out.getvalue().splitlines() == ["[algo-1]: job j: launch shape smdistributed", "[algo-1/rank0]: epoch 1 loss 2.30"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(finished_job, monkeypatch):
    scheduler, handle = finished_job
    monkeypatch.delenv("NO_COLOR", raising=False)
    terminal = _Terminal()
    launcher.follow(scheduler, handle, out=terminal)
    assert "\033[36m[algo-1/rank0]:\033[0m epoch 1 loss 2.30" in terminal.getvalue()
    assert "\033[33m[algo-2/rank3]:" in terminal.getvalue()  # each host its own colour
    assert launcher.use_colour(io.StringIO()) is False
    assert launcher.use_colour(io.StringIO(), color=True) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert launcher.use_colour(_Terminal()) is False
    assert launcher.use_colour(_Terminal(), color=True) is False


def test_failure_summary_puts_the_root_cause_last(finished_job):
    scheduler, handle = finished_job
    summary = launcher.failure_summary(scheduler.status(handle))
    lines = summary.splitlines()
    assert lines[1] == "j FAILED"
    assert lines.index("Other failures:") < lines.index("Root cause (first failure in time):")
    assert "  algo-1/rank0 exited with code 130: KeyboardInterrupt" in summary
    root = summary[summary.index("Root cause") :]
    for expected in ("host      : algo-2", "rank      : 3", "exit code : 7", "error     : ValueError: bad batch", "traceback : Traceback (most recent call last):", "ValueError: bad batch"):
        assert expected in root
    assert lines[-3:] == [
        "Error file: /jobs/j/algo-2/output/errors/rank-3.json",
        "Rank log: /jobs/j/algo-2/output/logs/rank-3.log",
        "Logs: smddp-launch logs local://j --rank 3",
    ]


def test_long_tracebacks_keep_their_tail():
    failure = FailureRecord("algo-1", 0, 1, "E: x", traceback="\n".join(f"line {i}" for i in range(100)))
    summary = launcher.failure_summary(JobStatus(JobHandle("local", "j"), JobState.FAILED, failure=failure))
    assert "(80 lines above)" in summary and "line 99" in summary and "line 79" not in summary


def test_raise_for_status_names_the_root_cause_host_and_rank(finished_job):
    scheduler, handle = finished_job
    with pytest.raises(JobFailedError) as info:
        launcher.raise_for_status(scheduler.status(handle))
    assert info.value.exit_code == 1  # the launcher's code for a failed job; never a rank's 2 or 3
    assert info.value.rank_exit_code == 7
    assert "rank 3 on host algo-2 exited with code 7: ValueError: bad batch" in str(info.value)
    assert info.value.failure.host == "algo-2"


def test_raise_for_status_passes_success_and_reports_other_ends():
    handle = JobHandle("local", "j")
    ok = JobStatus(handle, JobState.SUCCEEDED)
    assert launcher.raise_for_status(ok) is ok
    with pytest.raises(JobFailedError, match="cancelled") as info:
        launcher.raise_for_status(JobStatus(handle, JobState.CANCELLED, "cancelled"))
    assert info.value.exit_code == 1
    runtime_failure = FailureRecord("algo-1", None, 2, "ContractError: bad resourceconfig.json")
    with pytest.raises(JobFailedError, match="host algo-1 \\(its runtime\\) exited with code 2") as info:
        launcher.raise_for_status(JobStatus(handle, JobState.FAILED, failure=runtime_failure))
    assert (info.value.exit_code, info.value.rank_exit_code) == (1, 2)  # 2 is "bad job file" for the launcher
    with pytest.raises(JobFailedError) as info:
        launcher.raise_for_status(JobStatus(handle, JobState.FAILED, failure=FailureRecord("algo-1", 0, 137, "killed")))
    assert (info.value.exit_code, info.value.rank_exit_code) == (1, 137)
