"""The whole flow against moto (S3, STS, SageMaker, CloudWatch Logs): submit, status, logs, attach."""

from __future__ import annotations

import io
import tarfile
import time

import boto3
import pytest

from smddp_sdk.errors import SpecError, UnavailableError
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.sagemaker import AwsError
from smddp_sdk.schedulers.sagemaker.logs import LOG_GROUP
from smddp_sdk.specs.status import JobHandle, JobState
from tests.sagemaker.conftest import ACCOUNT, REGION, Recorder

pytestmark = pytest.mark.usefixtures("moto_aws")


def scheduler(echo: Recorder | None = None, logs: Recorder | None = None, **options):
    return get_scheduler("sagemaker", region=REGION, echo=echo or Recorder(), log_sink=logs or Recorder(),
                         poll=0.0, sleep=lambda _: None, **options)


def write_host_logs(job_name: str, hosts: int, lines_per_host: int = 2) -> None:
    """What SageMaker writes: one stream per host, here with interleaved timestamps."""
    logs = boto3.client("logs", region_name=REGION)
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    start = int(time.time() * 1000) - 60_000
    for host in range(1, hosts + 1):
        stream = f"{job_name}/algo-{host}-1763780000"
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        events = [{"timestamp": start + line * 1000 + host, "message": f"[algo-{host}/rank{(host - 1) * 8}]: step {line}"}
                  for line in range(lines_per_host)]
        logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events)


def test_submit_creates_bucket_uploads_code_and_creates_the_job(make_spec) -> None:
    echo = Recorder()
    sched = scheduler(echo)
    dry = sched.dryrun(make_spec(hyperparameters={"epochs": 3}))
    handle = sched.schedule(dry)
    assert handle == JobHandle("sagemaker", f"{REGION}/{dry.job_name}")

    bucket = f"sagemaker-{REGION}-{ACCOUNT}"
    s3 = boto3.client("s3", region_name=REGION)
    assert s3.get_bucket_location(Bucket=bucket)["LocationConstraint"] == REGION
    key = f"{dry.job_name}/source/sourcedir.tar.gz"
    obj = s3.get_object(Bucket=bucket, Key=key)
    assert obj["ServerSideEncryption"] == "aws:kms"
    with tarfile.open(fileobj=io.BytesIO(obj["Body"].read())) as archive:
        assert {"train.py", "requirements.txt", "utils/helpers.py"} <= set(archive.getnames())

    job = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=dry.job_name)
    assert job["RoleArn"].endswith(":role/SageMakerRole")
    assert job["HyperParameters"]["sagemaker_submit_directory"] == f'"s3://{bucket}/{key}"'
    assert job["HyperParameters"]["epochs"] == "3"
    assert f"Submitted {handle}" in echo.text
    assert f"smddp-launch logs --follow {handle}" in echo.text
    assert any(line.startswith("  100%") for line in echo.lines)


def test_status_reports_success_and_model_data(make_spec) -> None:
    sched = scheduler()
    handle = sched.submit(make_spec())
    status = sched.status(handle)
    assert status.state is JobState.SUCCEEDED
    assert status.model_data == f"s3://sagemaker-{REGION}-{ACCOUNT}/{handle.job_id.split('/')[1]}/output/model.tar.gz"
    assert [host.host for host in status.hosts] == ["algo-1", "algo-2"]


def test_logs_read_every_stream_past_fifty_merged_by_time(make_spec) -> None:
    sched = scheduler()
    handle = sched.submit(make_spec(instance_count=60))
    job_name = handle.job_id.split("/", 1)[1]
    write_host_logs(job_name, hosts=60)
    lines = list(sched.logs(handle))
    assert len(lines) == 120
    assert {line.host for line in lines} == {f"algo-{i}" for i in range(1, 61)}
    assert [line.timestamp for line in lines] == sorted(line.timestamp for line in lines)
    first = lines[0]
    assert (first.host, first.rank, first.text, first.prefix) == ("algo-1", 0, "step 0", "[algo-1/rank0]:")
    only = list(sched.logs(handle, hosts=["algo-55"]))
    assert [line.text for line in only] == ["step 0", "step 1"] and {line.rank for line in only} == {432}


def test_logs_follow_ends_with_the_job_and_wait_prints_everything(make_spec) -> None:
    sink = Recorder()
    sched = scheduler(logs=sink)
    handle = sched.submit(make_spec())
    write_host_logs(handle.job_id.split("/", 1)[1], hosts=2)
    followed = list(sched.logs(handle, follow=True))
    assert [line.text for line in followed if line.host != "sagemaker"] == ["step 0", "step 0", "step 1", "step 1"]
    status_lines = [line.text for line in followed if line.host == "sagemaker"]
    assert status_lines[0].endswith("Starting - Preparing the instances for training")
    assert status_lines[-1].startswith("model artifacts: s3://")
    assert sched.wait(handle).state is JobState.SUCCEEDED and sink.lines == []  # quiet unless logs=True
    assert sched.wait(handle, logs=True).state is JobState.SUCCEEDED
    assert sink.lines[1:3] == ["[algo-1/rank0]: step 0", "[algo-2/rank8]: step 0"]


def test_launcher_follow_prints_each_line_once(make_spec) -> None:
    from smddp_sdk import launcher

    sched = scheduler()
    handle = sched.submit(make_spec())
    write_host_logs(handle.job_id.split("/", 1)[1], hosts=2)
    out = io.StringIO()
    status = launcher.follow(sched, handle, out=out, color=False)
    lines = out.getvalue().splitlines()
    assert status.state is JobState.SUCCEEDED
    assert lines.count("[algo-2/rank8]: step 1") == 1
    assert sum("Starting - Preparing the instances for training" in line for line in lines) == 1


def test_attach_by_name_and_by_handle(make_spec) -> None:
    sched = scheduler()
    handle = sched.submit(make_spec())
    assert sched.attach(handle.job_id.split("/", 1)[1]) == handle
    assert sched.attach(str(handle)) == handle
    with pytest.raises(AwsError) as caught:
        sched.attach("no-such-job")
    assert "Could not find training job" in str(caught.value) and "check the job name and region" in str(caught.value)
    assert caught.value.exit_code == 2


def test_cancel_of_a_finished_job_does_nothing(make_spec) -> None:
    sched = scheduler()
    handle = sched.submit(make_spec())
    sched.cancel(handle)
    sched.cancel(handle)
    assert sched.status(handle).state is JobState.SUCCEEDED


def test_user_bucket_that_does_not_exist_shows_aws_message_and_advice(make_spec) -> None:
    sched = scheduler()
    with pytest.raises(AwsError) as caught:
        sched.submit(make_spec(code_location="s3://no-such-bucket-here/code"))
    message = str(caught.value)
    assert "NoSuchBucket" in message and "what to do:" in message and "create it" in message


def test_no_credentials_is_unavailable_before_anything_is_uploaded(make_spec, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    sched = scheduler()
    dry = sched.dryrun(make_spec())  # pure: works without credentials
    with pytest.raises(UnavailableError) as caught:
        sched.schedule(dry)
    assert caught.value.exit_code == 3
    assert "AWS_ACCESS_KEY_ID" in str(caught.value) and "AWS_PROFILE" in str(caught.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert boto3.client("s3", region_name=REGION).list_buckets()["Buckets"] == []


@pytest.mark.parametrize("overrides", [{"role": None}, {"framework_version": "9.9"}, {"image_uri": "docker.io/me/img:1"},
                                       {"inputs": {"train": "s3://bucket/ok", "val": "/tmp"}}])
def test_invalid_spec_uploads_and_creates_nothing(make_spec, overrides) -> None:
    with pytest.raises(SpecError):
        scheduler().submit(make_spec(**overrides))
    assert boto3.client("s3", region_name=REGION).list_buckets()["Buckets"] == []
    assert boto3.client("sagemaker", region_name=REGION).list_training_jobs()["TrainingJobSummaries"] == []
