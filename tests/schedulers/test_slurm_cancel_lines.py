"""A cancelled Slurm job's logs read as a stop (schedulers/slurm/logs.py): Slurm's lines after its cancel mark,
as a real cluster wrote them (scripts/slurm-cluster.sh, srun --quiet), go; a real failure's stay."""

from __future__ import annotations

from pathlib import Path

from smddp_sdk.schedulers.slurm.logs import job_lines

CANCELLED_BATCH = """\
slurmstepd-n1: error: *** JOB 170 ON n1 CANCELLED AT 2026-11-28T13:48:51 ***
srun: error: n2: task 1: Exited with exit code 143
slurmstepd-n1: error: *** STEP 170.0 ON n1 CANCELLED AT 2026-11-28T13:48:51 ***
srun: error: n1: task 0: Terminated
"""
FAILED_BATCH = """\
srun: error: n2: task 1: Exited with exit code 1
srun: error: Node failure on n2
"""


def lines_of(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str]]:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, text in files.items():
        (logs / name).write_text(text)
    return [(line.host, line.text) for line in job_lines(logs, lambda: True)]


def test_a_cancel_keeps_one_line_saying_so_and_none_of_slurms_exit_codes(tmp_path: Path) -> None:
    node = "[n1/rank0]: training\n[n1]: stopped by SIGTERM\nslurmstepd-n1: error: *** STEP 170.0 ON n1 CANCELLED AT 2026-11-28T13:48:51 ***\n"
    shown = lines_of(tmp_path, {"batch.log": CANCELLED_BATCH, "vm.log": node})
    assert shown == [("batch", "cancelled at 2026-11-28T13:48:51"), ("n1", "training"), ("n1", "stopped by SIGTERM"),
                     ("vm", "cancelled at 2026-11-28T13:48:51")]


def test_a_real_failures_srun_lines_stay_before_and_without_a_cancel(tmp_path: Path) -> None:
    then_cancelled = FAILED_BATCH + CANCELLED_BATCH
    shown = [text for _, text in lines_of(tmp_path, {"batch.log": then_cancelled})]
    assert shown == ["srun: error: n2: task 1: Exited with exit code 1", "srun: error: Node failure on n2", "cancelled at 2026-11-28T13:48:51"]


def test_other_endings_are_no_cancel(tmp_path: Path) -> None:
    timed_out = ("slurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-28T13:48:51 DUE TO TIME LIMIT ***\n"
                 "srun: error: n1: task 0: Exited with exit code 143\n")
    shown = [text for _, text in lines_of(tmp_path, {"batch.log": timed_out})]
    assert shown == timed_out.splitlines()


def test_the_scripts_own_words_are_never_taken_for_slurms(tmp_path: Path) -> None:
    script = "[n1/rank0]: srun: error: something the script printed\n[n1/rank0]: exit code 143 in my own message\n"
    shown = lines_of(tmp_path, {"batch.log": CANCELLED_BATCH, "n1.log": script})
    assert ("n1", "srun: error: something the script printed") in shown and ("n1", "exit code 143 in my own message") in shown
