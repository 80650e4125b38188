"""`smddp-launch list` across schedulers, against real local jobs and SageMaker jobs in moto: newest first with
`-n`, the state and scheduler filters, start time and duration, one short line for a job that cannot be
described, and `clean` forgetting what only this machine's index remembers."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import botocore.exceptions
import pytest

from smddp_sdk import PyTorch, job_index
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.specs.status import JobHandle, JobState, JobStatus
from tests.cli.test_run_local import TRAIN
from tests.slurm.test_slurm_plan import FakeSlurm, spec_for

REGION = "us-west-2"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"  # moto's account
ROW = re.compile(r"^(?P<handle>\S+)\s+(?P<state>[A-Z]+)\s+(?P<started>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|-)\s+(?P<duration>\S+)\s*(?P<message>.*)$")


@pytest.fixture
def job_root(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A job root, fake AWS credentials and moto (SageMaker, S3) for the whole test."""
    from moto import mock_aws

    (isolated / "train.py").write_text(TRAIN)
    root = isolated.parent / "jobs"
    monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", REGION),
                        ("AWS_EC2_METADATA_DISABLED", "true"), ("AWS_CONFIG_FILE", str(isolated / "no-aws-config")),
                        ("AWS_SHARED_CREDENTIALS_FILE", str(isolated / "no-aws-credentials"))):
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield root


def rows(output: str) -> list[dict[str, str]]:
    """The listing's rows (after its header), parsed."""
    lines = output.splitlines()
    assert lines[0].split() == ["HANDLE", "STATE", "STARTED", "DURATION", "MESSAGE"], output
    parsed = [ROW.match(line) for line in lines[1:]]
    assert all(parsed), output
    return [match.groupdict() for match in parsed if match]


def run_local(invoke, name: str, *args: str, code: int = 0) -> str:
    result = invoke("--job-name", name, *args)
    assert result.exit_code == code, result.output
    return name


def submit_to_sagemaker(isolated: Path) -> str:
    """A training job created in moto through the estimator, as a notebook would (it lands in the index)."""
    job = PyTorch(entry_point="train.py", source_dir=str(isolated / "src"), role=ROLE, instance_count=1, instance_type="ml.p4d.24xlarge",
                  framework_version="2.2.0", py_version="py310", scheduler_options={"region": REGION, "poll": 0.0})
    job.fit(wait=False)
    return job.latest_training_job.name


@pytest.mark.integration
def test_list_shows_every_scheduler_newest_first_filters_and_forgets(invoke, job_root: Path, isolated: Path) -> None:
    done = run_local(invoke, "done", "train.py")
    run_local(invoke, "failed", "--nproc-per-host", "2", "train.py", "--fail", "3", code=1)
    (isolated / "src").mkdir()
    (isolated / "src" / "train.py").write_text("print('hello')\n")
    # Job directories an older version or a crash left: a state.json cut short, and an unknown state.
    made = (job_root / done / "job.json").stat().st_mtime
    for name, state, age in (("broken", "{oops", 100), ("old-format", '{"state": "DONE"}', 200)):
        shutil.copytree(job_root / done, job_root / name)
        (job_root / name / "state.json").write_text(state)
        os.utime(job_root / name / "job.json", (made - age, made - age))
    running = run_local(invoke, "running", "--detach", "train.py", "--sleep", "600")  # they stop no new job; cancelled below
    try:
        # a slurm job written by the real planner (its sbatch answered by a fake): no cluster answers for it here
        get_scheduler("slurm", client=FakeSlurm()).submit(spec_for(isolated / "src", job_name="on-slurm"))
        sagemaker = submit_to_sagemaker(isolated)
        job_index.record(JobHandle("sagemaker", f"{REGION}/gone-job"), name="gone-job", options={"region": REGION})
        job_index.record(JobHandle("sagemaker", f"{REGION}/elsewhere"), name="elsewhere", options={"profile": "no-such-profile"})

        listed = invoke("list")
        assert listed.exit_code == 0, listed.output
        table = rows(listed.stdout)
        assert [row["handle"] for row in table] == [
            f"sagemaker://{REGION}/elsewhere", f"sagemaker://{REGION}/gone-job", f"sagemaker://{REGION}/{sagemaker}",
            "slurm://on-slurm", "local://running", "local://failed", "local://done", "local://broken", "local://old-format"]
        by_handle = {row["handle"]: row for row in table}
        assert by_handle["local://done"]["state"] == "SUCCEEDED" and re.fullmatch(r"(\d+m)?\d+s", by_handle["local://done"]["duration"])
        assert by_handle["local://failed"]["state"] == "FAILED" and by_handle["local://failed"]["started"] != "-"
        assert by_handle["local://running"]["state"] in ("STARTING", "RUNNING") and by_handle["local://running"]["duration"] != "-", listed.stdout
        assert by_handle[f"sagemaker://{REGION}/{sagemaker}"]["started"] != "-"
        # what cannot be described is one short line that says why, never a traceback, never dropped
        assert by_handle[f"sagemaker://{REGION}/gone-job"]["message"] == "gone: SageMaker has no such job (any more)"
        assert by_handle[f"sagemaker://{REGION}/elsewhere"]["message"] == "cannot describe it: The config profile (no-such-profile) could not be found"
        assert by_handle["local://broken"]["message"] == "state.json is not valid JSON"
        assert by_handle["local://old-format"]["message"] == "ValueError: 'DONE' is not a valid JobState"
        assert all(len(row["message"]) <= 100 for row in table) and "Traceback" not in listed.output
        assert re.search(r"\b[45] jobs could not be described; `smddp-launch clean JOB...` forgets", listed.stderr)  # slurm: when no cluster answers

        assert [row["handle"] for row in rows(invoke("list", "-n", "2").stdout)] == [row["handle"] for row in table[:2]]
        assert [row["handle"] for row in rows(invoke("list", "--state", "failed,running", "--state", "STARTING").stdout)] == ["local://running", "local://failed"]
        assert [row["handle"] for row in rows(invoke("list", "--scheduler", "local", "--state", "unknown", "-n", "1").stdout)] == ["local://broken"]
        # the region's own listing and the index, each job once; -o goes to the schedulers that have the option
        region = invoke("list", "--scheduler", "sagemaker,local", "-o", f"region={REGION}", "-n", "4")
        assert [row["handle"] for row in rows(region.stdout)] == [*(row["handle"] for row in table[:3]), "local://running"]
        misspelt = invoke("list", "--scheduler", "sagemaker,local", "-o", f"regoin={REGION}")
        assert misspelt.exit_code == 2 and "did you mean 'region'?" in misspelt.stderr
        assert invoke("list", "--scheduler", "docker", "--state", "failed").stderr.startswith("No failed docker jobs")

        as_json = json.loads(invoke("list", "--json", "--scheduler", "local", "--state", "succeeded").stdout)
        assert [item["handle"] for item in as_json] == ["local://done"]
        assert as_json[0].keys() == json.loads(invoke("status", "done", "--json").stdout).keys()
        assert isinstance(as_json[0]["duration"], float) and as_json[0]["started"] <= as_json[0]["ended"]
        status = invoke("status", "done").stdout.splitlines()
        assert re.fullmatch(r"  started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, ran (\d+m)?\d+s", status[1]), status

        for args, wrong, hint in ((("--state", "failed,runing"), "'runing' is not a state", "did you mean 'RUNNING'?"),
                                  (("--scheduler", "sagemkr"), "'sagemkr' is not a scheduler", "did you mean 'sagemaker'?")):
            bad = invoke("list", *args)
            assert bad.exit_code == 2 and wrong in bad.stderr and hint in bad.stderr, bad.output

        busy = invoke("clean", "running")
        assert busy.exit_code == 2 and "cancel it first" in busy.stderr
        cleaned = invoke("clean", "gone-job", "elsewhere", "broken")
        assert cleaned.exit_code == 0, cleaned.output
        assert "forgetting sagemaker://us-west-2/gone-job (gone: SageMaker has no such job (any more))" in cleaned.stderr
        assert cleaned.stderr.strip().endswith("Removed 1 job; forgot 2.") and not (job_root / "broken").exists()
        left = [row["handle"] for row in rows(invoke("list").stdout)]
        assert left == [f"sagemaker://{REGION}/{sagemaker}", "slurm://on-slurm", "local://running", "local://failed", "local://done", "local://old-format"]
    finally:
        invoke("cancel", running)



@pytest.mark.parametrize(("error", "row"), [
    (lambda: botocore.exceptions.NoCredentialsError(), "cannot describe it: no AWS credentials found (Unable to locate credentials)"),
    (lambda: botocore.exceptions.ClientError({"Error": {"Code": "ExpiredTokenException", "Message": "The security token included in the request is expired"}},
                                             "DescribeTrainingJob"), "cannot describe it: AWS said ExpiredTokenException"),
    (lambda: botocore.exceptions.ClientError({"Error": {"Code": "ValidationException", "Message": "Requested resource not found."}}, "DescribeTrainingJob"),
     "gone: SageMaker has no such job (any more)"),  # what AWS answers for a job it no longer has
    (lambda: botocore.exceptions.ClientError({"Error": {"Code": "ValidationException", "Message": "1 validation error detected"}}, "DescribeTrainingJob"),
     "cannot describe it: AWS said ValidationException"),
    (lambda: botocore.exceptions.ClientError({"Error": {"Code": "ValidationException", "Message": "Could not find training job 'x'"}}, "DescribeTrainingJob"),
     "gone: SageMaker has no such job (any more)"),
])
def test_a_sagemaker_job_that_cannot_be_described_says_why_in_a_few_words(error, row: str) -> None:
    from smddp_sdk.schedulers.sagemaker.client import translate

    scheduler = get_scheduler("sagemaker", region=REGION)
    assert scheduler.undescribed(translate(error(), "describe the training job pytorch-training-2026-11-26-01-57-01-505")) == row


@pytest.mark.parametrize(("started", "ended", "shown"), [(100.0, 100.4, "0s"), (100.0, 159.6, "1m00s"), (0.0, 3 * 3600 + 125, "3h02m"),
                                                         (0.0, 2 * 86400 + 7200, "2d02h"), (None, None, "-")])
def test_durations_read_at_a_glance(started, ended, shown: str) -> None:
    from smddp_sdk.cli.cmd_jobs import _duration

    assert _duration(JobStatus(JobHandle("local", "x"), JobState.SUCCEEDED, started=started, ended=ended)) == shown
