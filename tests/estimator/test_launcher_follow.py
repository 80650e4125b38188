"""launcher.follow_lines: a broken or early-ended log stream is reconnected without printing a line twice."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from smddp_sdk import launcher
from smddp_sdk.schedulers.base import DryRun, Scheduler
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus, LogLine

HANDLE = JobHandle("local", "flaky")


class FlakyStream(Scheduler):
    """A scheduler whose follow stream breaks (or ends early) at the given points: what a killed `docker
    logs` process or a dropped connection looks like from the caller's side."""

    name = "local"

    def __init__(self, lines: int, breaks: Sequence[int], error: bool) -> None:
        self.lines = [LogLine("algo-1", f"line {i}", rank=0) for i in range(lines)]
        self.breaks = list(breaks)
        self.error = error
        self.opened = 0
        self.served_all = False  # the job ends once a stream has carried its last line

    def logs(self, handle: JobHandle, *, hosts=None, ranks=None, follow: bool = False) -> Iterator[LogLine]:
        self.opened += 1
        stop = self.breaks.pop(0) if follow and self.breaks else len(self.lines)
        yield from self.lines[:stop]
        self.served_all = self.served_all or stop >= len(self.lines)
        if stop < len(self.lines) and self.error:
            raise OSError("connection reset")

    def status(self, handle: JobHandle) -> JobStatus:
        return JobStatus(handle, JobState.SUCCEEDED if self.served_all else JobState.RUNNING)

    def plan(self, spec) -> DryRun:  # pragma: no cover - not used
        raise NotImplementedError

    def run(self, dryrun: DryRun, *, owner_pid: int | None) -> JobHandle:  # pragma: no cover - not used
        raise NotImplementedError

    def list_jobs(self, limit: int | None = None) -> list[JobStatus]:  # pragma: no cover - not used
        return []

    def cancel(self, handle: JobHandle) -> None:  # pragma: no cover - not used
        pass


def texts(lines: Iterator[LogLine]) -> list[str]:
    return [line.text for line in lines]


def test_a_broken_stream_is_reopened_and_no_line_repeats(capsys) -> None:
    flaky = FlakyStream(10, breaks=[3, 7], error=True)
    assert texts(launcher.follow_lines(flaky, HANDLE, pause=0)) == [f"line {i}" for i in range(10)]
    assert flaky.opened >= 3
    assert capsys.readouterr().err.count("reconnecting") == 2


def test_a_stream_that_ends_before_the_job_is_reopened(capsys) -> None:
    flaky = FlakyStream(6, breaks=[2], error=False)
    assert texts(launcher.follow_lines(flaky, HANDLE, pause=0)) == [f"line {i}" for i in range(6)]


def test_lines_already_shown_are_skipped() -> None:
    assert texts(launcher.follow_lines(FlakyStream(5, breaks=[], error=False), HANDLE, skip=3, pause=0)) == ["line 3", "line 4"]


def test_end_summary_and_durations() -> None:
    status = JobStatus(JobHandle("sagemaker", "us-west-2/job-1"), JobState.SUCCEEDED, model_data="s3://b/job-1/output/model.tar.gz")
    assert launcher.end_summary(status, 125) == [
        "sagemaker://us-west-2/job-1 SUCCEEDED in 2 min 05 s", "  model:   s3://b/job-1/output/model.tar.gz",
        "  status:  smddp-launch status job-1", "  logs:    smddp-launch logs job-1", "  metrics: smddp-launch metrics job-1"]
    assert launcher.format_duration(4.25) == "4.2 s" and launcher.format_duration(7322) == "2 h 02 min"
