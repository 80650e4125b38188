"""Slurm jobs sync ``checkpoint_s3_uri`` as local and docker jobs do: restored into the job's checkpoints/ folder
before the step, copied back beside it and after it; and their goodput comes from the batch script's attempt
lines. The batch script and the sync run here as real processes; the tests marked ``slurm`` run a real cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.slurm import SlurmScheduler
from smddp_sdk.schedulers.slurm.attempts import goodput_record
from smddp_sdk.schedulers.slurm.script import render
from smddp_sdk.specs import goodput
from smddp_sdk.specs.events import event_line
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.slurm_job import SlurmJobDir
from smddp_sdk.specs.status import JobState
from tests.slurm.test_slurm_plan import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 240


def spec_for(tmp_path: Path, script: str, name: str, **extra) -> JobSpec:
    source = tmp_path / f"src-{name}"
    source.mkdir(exist_ok=True)
    (source / "train.py").write_text(script)
    return JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(source), "instance_type": "local", "instance_count": 2,
                                 "job_name": name, "max_run": 600, "checkpoint_s3_uri": f"file://{tmp_path / 'location'}", **extra})


def test_the_batch_script_restores_before_the_step_and_syncs_beside_it(tmp_path: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm())
    dryrun = scheduler.dryrun(spec_for(tmp_path, "print('hi')\n", "synced"))
    script = render(dryrun.request).splitlines()
    restore = next(i for i, line in enumerate(script) if "checkpoint_sync restore" in line)
    follow = next(i for i, line in enumerate(script) if "checkpoint_sync follow" in line)
    step = next(i for i, line in enumerate(script) if line.startswith("srun "))
    stop = next(i for i, line in enumerate(script) if line.startswith('kill -TERM "$checkpoint_sync"'))
    assert restore < follow < step < stop, script
    assert script[restore].endswith("|| exit 1") and script[follow].endswith("&")
    assert any("is restored into the job's checkpoints/ folder" in note for note in dryrun.notes)
    assert not any("not synced" in note for note in dryrun.notes)



def test_the_batch_scripts_attempt_lines_are_json(tmp_path: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), client=FakeSlurm())
    script = render(scheduler.dryrun(spec_for(tmp_path, "print('hi')\n", "lines")).request).splitlines()
    recording = [line for line in script if line.startswith(("attempt=", "printf "))]
    (tmp_path / "jobs" / "lines").mkdir(parents=True)
    subprocess.run(["bash", "-c", "\n".join(["code=3", *recording])], check=True, env={**os.environ, "SLURM_RESTART_COUNT": "1"})
    lines = [json.loads(line) for line in (tmp_path / "jobs" / "lines" / "attempts.jsonl").read_text().splitlines()]
    assert [(line["attempt"], sorted(line)) for line in lines] == [(2, ["attempt", "started"]), (2, ["attempt", "code", "ended"])]
    assert lines[1]["code"] == 3 and lines[1]["ended"] >= lines[0]["started"]


def stage(tmp_path: Path, uri: str) -> SlurmJobDir:
    job_dir = SlurmJobDir(tmp_path / "job")
    job_dir.checkpoint_dir.mkdir(parents=True)
    job_dir.record_file.write_text(json.dumps({"plan": {"checkpoint_s3_uri": uri}}))
    return job_dir


def sync(command: str, job_dir: SlurmJobDir) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "smddp_sdk.schedulers.slurm.checkpoint_sync", command, str(job_dir.path)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_restore_then_follow_bring_back_identical_files_and_copy_out_only_new_ones(tmp_path: Path) -> None:
    location = tmp_path / "location"
    location.mkdir()
    old = location / "epoch-1.pt"
    old.write_bytes(b"one")
    os.utime(old, ns=(1_700_000_000_123_456_789,) * 2)
    job_dir = stage(tmp_path, f"file://{location}")
    restored = sync("restore", job_dir)
    assert restored.wait(timeout=120) == 0, restored.stdout.read()  # type: ignore[union-attr]
    copy = job_dir.checkpoint_dir / "epoch-1.pt"
    assert copy.read_bytes() == b"one" and copy.stat().st_mtime_ns == 1_700_000_000_123_456_789
    inode = old.stat().st_ino
    follower = sync("follow", job_dir)
    assert "syncing" in follower.stdout.readline()  # type: ignore[union-attr] # it runs (its first pass after 5 s, the last at SIGTERM)
    (job_dir.checkpoint_dir / "epoch-2.pt").write_bytes(b"two")
    follower.send_signal(signal.SIGTERM)
    output = follower.communicate(timeout=120)[0]
    assert follower.returncode == 0, output
    assert (location / "epoch-2.pt").read_bytes() == b"two"
    assert old.stat().st_ino == inode  # what was restored was not copied out again


def test_a_restore_that_cannot_reach_its_location_fails_before_the_step(tmp_path: Path) -> None:
    job_dir = stage(tmp_path, "s3://no-such-bucket-smddp/x")
    restored = sync("restore", job_dir)
    output = restored.communicate(timeout=120)[0]
    assert restored.returncode != 0 and "checkpoint_s3_uri" in output, output


def test_goodput_of_a_requeued_job_comes_from_its_attempt_lines_and_leaves_what_slurm_cannot_tell_unknown(tmp_path: Path) -> None:
    job_dir = SlurmJobDir(tmp_path / "job")
    node = job_dir.node_tree(0)
    (node / "output").mkdir(parents=True)
    job_dir.checkpoint_dir.mkdir()
    checkpoint = job_dir.checkpoint_dir / "step.txt"
    checkpoint.write_text("5")
    os.utime(checkpoint, (115, 115))
    (node / "output" / "events.jsonl").write_text("".join(event_line(event, when, attempt=None, host="n1", rank=0) for event, when in (
        ("process_group_formed", 108), ("first_collective", 110), ("process_group_formed", 146), ("first_collective", 150))))
    job_dir.attempts_file.write_text("\n".join(json.dumps(line) for line in (
        {"attempt": 1, "started": 100.0}, {"attempt": 1, "ended": 120.0, "code": 3},
        {"attempt": 2, "started": 140.0}, {"attempt": 2, "ended": 170.0, "code": 0})) + "\n")
    result = goodput.from_record(goodput_record(job_dir, 171.0), now=200)
    assert result is not None
    assert [(row.outcome, row.productive) for row in result.attempts] == [("Restarting", 5), ("Completed", 20)]
    (recovery,) = result.recoveries
    assert (recovery.detect, recovery.stop, recovery.restart, recovery.cold_start, recovery.restore, recovery.total) == (None, None, 20, 6, 4, 30)


RESUMING = textwrap.dedent(
    """
    import os, sys
    checkpoint = "/opt/ml/checkpoints/step.txt"
    resumed = open(checkpoint).read() if os.path.exists(checkpoint) else None
    print(f"resumed from {resumed}", flush=True)
    if os.environ["RANK"] == "0":
        open(checkpoint, "w").write("step-5")
        open("/opt/ml/model/resumed.txt", "w").write(str(resumed))
    """
)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_rerun_on_slurm_restores_what_the_first_run_synced_to_checkpoint_s3_uri(tmp_path: Path) -> None:
    scheduler = get_scheduler("slurm", job_root=str(tmp_path / "jobs"), processes_per_host=1)
    assert isinstance(scheduler, SlurmScheduler)
    for name, expected in (("first", b"None"), ("rerun", b"step-5")):
        handle = scheduler.submit(spec_for(tmp_path, RESUMING, name))
        status = scheduler.wait(handle, poll=0.5, timeout=JOB_TIMEOUT)
        assert status.state is JobState.SUCCEEDED, status
        with tarfile.open(status.model_data) as archive:
            assert archive.extractfile("resumed.txt").read() == expected  # type: ignore[union-attr]
        assert status.goodput is not None and [row.outcome for row in status.goodput.attempts] == ["Completed"]
    assert (tmp_path / "location" / "step.txt").read_text() == "step-5"
