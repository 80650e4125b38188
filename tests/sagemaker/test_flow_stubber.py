"""Flows whose AWS answers must be scripted (botocore's Stubber, which also checks every request and
response against the service model): wait with status lines and a failure, stop, Ctrl-C, AWS errors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from smddp_sdk.errors import EXIT_INTERRUPTED
from smddp_sdk.schedulers import get_scheduler
from smddp_sdk.schedulers.sagemaker import AwsError, Detached
from smddp_sdk.schedulers.sagemaker.logs import LOG_GROUP
from smddp_sdk.specs.status import JobHandle, JobState
from tests.sagemaker.conftest import ACCOUNT, REGION, Recorder

JOB = "smddp-job-2026-11-22-01-00-00-000"
HANDLE = JobHandle("sagemaker", f"{REGION}/{JOB}")
T0 = datetime(2026, 11, 22, 1, 0, 0, tzinfo=timezone.utc)
TRANSITIONS = [("Starting", "Preparing the instances for training"), ("Downloading", "Downloading the training image"),
               ("Training", "Training image download completed. Training in progress."), ("Failed", "Training job failed")]
pytestmark = pytest.mark.usefixtures("aws_env")  # no real credentials or IMDS probe, whatever the machine has
REASON = "AlgorithmError: algo-2/rank11 exited with code 3: ZeroDivisionError: division by zero"


def client(service: str) -> tuple[Any, Stubber]:
    made = boto3.client(service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    return made, Stubber(made)


def describe(status: str, secondary: str, transitions: int, **extra: Any) -> dict[str, Any]:
    return {
        "TrainingJobName": JOB, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{JOB}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://bucket/{JOB}/output/model.tar.gz"},
        "TrainingJobStatus": status, "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img"},
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400}, "CreationTime": T0,
        "SecondaryStatusTransitions": [
            {"Status": name, "StartTime": T0 + timedelta(minutes=i), "StatusMessage": message}
            for i, (name, message) in enumerate(TRANSITIONS[:transitions])
        ],
        **extra,
    }


def scheduler(sagemaker: Any, logs: Any = None, **options: Any):
    options.setdefault("echo", Recorder())
    options.setdefault("log_sink", Recorder())
    options.setdefault("sleep", lambda _: None)
    return get_scheduler("sagemaker", region=REGION, account_id=ACCOUNT, sagemaker_client=sagemaker, logs_client=logs,
                         s3_client=client("s3")[0], sts_client=client("sts")[0], poll=0.0, **options)


def stream(name: str) -> dict[str, Any]:
    return {"logStreamName": f"{JOB}/{name}"}


def events(stub: Stubber, name: str, token: str | None, messages: list[tuple[int, str]], new_token: str) -> None:
    params: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": f"{JOB}/{name}", "startFromHead": True}
    if token:
        params["nextToken"] = token
    stub.add_response("get_log_events", {"events": [{"timestamp": ts, "message": text} for ts, text in messages],
                                         "nextForwardToken": new_token}, params)


def test_wait_prints_status_lines_logs_of_every_host_and_the_failure() -> None:
    sagemaker, sm_stub = client("sagemaker")
    logs, logs_stub = client("logs")
    by_job = {"TrainingJobName": JOB}
    streams = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{JOB}/"}
    # poll 1: starting, no log group yet
    sm_stub.add_response("describe_training_job", describe("InProgress", "Starting", 1), by_job)
    logs_stub.add_client_error("describe_log_streams", "ResourceNotFoundException", "The specified log group does not exist.")
    # poll 2: training; the streams come on two pages; each host has written a line
    sm_stub.add_response("describe_training_job", describe("InProgress", "Training", 3), by_job)
    logs_stub.add_response("describe_log_streams", {"logStreams": [stream("algo-1-1763780000")], "nextToken": "page-2"}, streams)
    logs_stub.add_response("describe_log_streams", {"logStreams": [stream("algo-2-1763780001")]}, {**streams, "nextToken": "page-2"})
    events(logs_stub, "algo-1-1763780000", None, [(2000, "[algo-1/rank0]: epoch 1")], "f1")
    events(logs_stub, "algo-1-1763780000", "f1", [], "f1")
    events(logs_stub, "algo-2-1763780001", None, [(1000, "[algo-2/rank11]: Traceback ..."), (3000, "no prefix here")], "f2")
    events(logs_stub, "algo-2-1763780001", "f2", [], "f2")
    # poll 3: failed; the last read finds nothing new
    failed = describe("Failed", "Failed", 4, FailureReason=REASON, TrainingTimeInSeconds=120, BillableTimeInSeconds=120)
    sm_stub.add_response("describe_training_job", failed, by_job)
    logs_stub.add_response("describe_log_streams", {"logStreams": [stream("algo-1-1763780000"), stream("algo-2-1763780001")]}, streams)
    events(logs_stub, "algo-1-1763780000", "f1", [], "f1")
    events(logs_stub, "algo-2-1763780001", "f2", [], "f2")
    # and once more a moment later: CloudWatch shows the last lines late
    logs_stub.add_response("describe_log_streams", {"logStreams": [stream("algo-1-1763780000"), stream("algo-2-1763780001")]}, streams)
    events(logs_stub, "algo-1-1763780000", "f1", [], "f1")
    events(logs_stub, "algo-2-1763780001", "f2", [(4000, "[algo-2/rank11]: ZeroDivisionError: division by zero")], "f3")
    events(logs_stub, "algo-2-1763780001", "f3", [], "f3")

    sink = Recorder()
    with sm_stub, logs_stub:
        status = scheduler(sagemaker, logs, log_sink=sink).wait(HANDLE, logs=True)
        sm_stub.assert_no_pending_responses()
        logs_stub.assert_no_pending_responses()

    assert status.state is JobState.FAILED
    assert (status.failure.host, status.failure.rank, status.failure.exit_code) == ("algo-2", 11, 3)
    assert sink.lines[:-2] == [
        "[sagemaker]: 2026-11-22 01:00:00 Starting - Preparing the instances for training",
        "[sagemaker]: 2026-11-22 01:01:00 Downloading - Downloading the training image",
        "[sagemaker]: 2026-11-22 01:02:00 Training - Training image download completed. Training in progress.",
        "[algo-2/rank11]: Traceback ...",
        "[algo-1/rank0]: epoch 1",
        "[algo-2]: no prefix here",
        "[sagemaker]: 2026-11-22 01:03:00 Failed - Training job failed",
        "[algo-2/rank11]: ZeroDivisionError: division by zero",
        "[sagemaker]: Training seconds: 240",
        "[sagemaker]: Billable seconds: 240",
    ]
    assert sink.lines[-2] == f"[sagemaker]: failed: {REASON}"
    assert sink.lines[-1].startswith("[sagemaker]: CloudWatch logs: https://us-west-2.console.aws.amazon.com/cloudwatch/")


def test_ctrl_c_detaches_and_says_how_to_reattach() -> None:
    sagemaker, stub = client("sagemaker")
    stub.add_response("describe_training_job", describe("InProgress", "Training", 3), {"TrainingJobName": JOB})

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    with stub, pytest.raises(Detached) as caught:
        scheduler(sagemaker, sleep=interrupted).wait(HANDLE)
    assert caught.value.exit_code == EXIT_INTERRUPTED
    message = str(caught.value)
    assert "keeps running on SageMaker" in message
    assert f"smddp-launch logs --follow sagemaker://{REGION}/{JOB}" in message
    assert f"smddp-launch cancel sagemaker://{REGION}/{JOB}" in message


def test_cancel_stops_a_running_job_once() -> None:
    sagemaker, stub = client("sagemaker")
    stub.add_response("describe_training_job", describe("InProgress", "Training", 3), {"TrainingJobName": JOB})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": JOB})
    stub.add_response("describe_training_job", describe("Stopping", "Stopping", 3), {"TrainingJobName": JOB})
    with stub:
        sched = scheduler(sagemaker)
        sched.cancel(HANDLE)
        sched.cancel(HANDLE)  # already stopping: no second StopTrainingJob
        stub.assert_no_pending_responses()


def test_cancel_racing_the_end_of_the_job_is_not_an_error() -> None:
    sagemaker, stub = client("sagemaker")
    stub.add_response("describe_training_job", describe("InProgress", "Uploading", 3), {"TrainingJobName": JOB})
    stub.add_client_error("stop_training_job", "ValidationException", "The request was rejected because the training job is in status Completed.")
    stub.add_response("describe_training_job", describe("Completed", "Completed", 3), {"TrainingJobName": JOB})
    with stub:
        scheduler(sagemaker).cancel(HANDLE)
        stub.assert_no_pending_responses()


def test_cancel_without_permission_shows_aws_message_and_advice() -> None:
    sagemaker, stub = client("sagemaker")
    stub.add_response("describe_training_job", describe("InProgress", "Training", 3), {"TrainingJobName": JOB})
    stub.add_client_error("stop_training_job", "AccessDeniedException", "User: arn:aws:iam::123456789012:user/me is not authorized to perform: sagemaker:StopTrainingJob")
    with stub, pytest.raises(AwsError) as caught:
        scheduler(sagemaker).cancel(HANDLE)
    message = str(caught.value)
    assert caught.value.exit_code == 3
    assert "not authorized to perform: sagemaker:StopTrainingJob" in message and "what to do:" in message


def s3_code_spec(make_spec, **overrides: Any):
    return make_spec(source_dir="s3://my-bucket/code/sourcedir.tar.gz", output_path="s3://my-bucket/out", **overrides)


def test_create_request_passes_the_service_model(make_spec) -> None:
    spec = s3_code_spec(make_spec, hyperparameters={"lr": 0.1, "layers": [1, 2]}, environment={"A": "1"}, max_run=3600,
                        use_spot_instances=True, max_wait=7200, checkpoint_s3_uri="s3://my-bucket/ckpt",
                        checkpoint_local_path="/opt/ml/checkpoints", keep_alive_period_in_seconds=600, max_retry_attempts=2,
                        tags=[{"Key": "team", "Value": "ml"}], subnets=["subnet-1"], security_group_ids=["sg-1"],
                        enable_network_isolation=True, encrypt_inter_container_traffic=True,
                        metric_definitions=[{"Name": "loss", "Regex": "loss=(.*)"}],
                        inputs={"train": {"s3_data": "s3://my-bucket/train", "distribution": "ShardedByS3Key", "compression": "Gzip",
                                          "content_type": "text/csv", "record_wrapping": "RecordIO", "input_mode": "Pipe"}})
    sagemaker, stub = client("sagemaker")
    sched = scheduler(sagemaker)
    dry = sched.dryrun(spec)
    stub.add_response("create_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{dry.job_name}"}, dry.request)
    with stub:
        assert sched.schedule(dry) == JobHandle("sagemaker", f"{REGION}/{dry.job_name}")
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("code", "message", "exit_code", "advice"),
    [
        ("ResourceLimitExceeded", "The account-level service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances", 3, "Service Quotas"),
        ("ValidationException", "Could not assume role arn:aws:iam::123456789012:role/SageMakerRole", 2, "trust sagemaker.amazonaws.com"),
        ("UnrecognizedClientException", "The security token included in the request is invalid.", 3, "AWS_ACCESS_KEY_ID"),
        ("ResourceInUse", "Training job names must be unique within an AWS account and region", 2, "set another job_name"),
    ],
)
def test_create_errors_show_the_aws_message_and_what_to_do(make_spec, code, message, exit_code, advice) -> None:
    sagemaker, stub = client("sagemaker")
    stub.add_client_error("create_training_job", code, message)
    sched = scheduler(sagemaker)
    with stub, pytest.raises(AwsError) as caught:
        sched.submit(s3_code_spec(make_spec))
    text = str(caught.value)
    assert caught.value.exit_code == exit_code
    assert f"AWS said {code}: {message}" in text and advice in text


def test_status_shows_attempts_and_interruptions_from_describe_training_job() -> None:
    sagemaker, stub = client("sagemaker")
    steps = ["Starting", "Training", "Interrupted", "Starting", "Training", "Restarting", "Starting", "Training", "Completed"]
    spot = describe(
        "Completed",
        "Completed",
        0,
        EnableManagedSpotTraining=True,
        TrainingTimeInSeconds=500,
        BillableTimeInSeconds=100,
        SecondaryStatusTransitions=[{"Status": name, "StartTime": T0 + timedelta(minutes=i), "EndTime": T0 + timedelta(minutes=i + 1), "StatusMessage": ""} for i, name in enumerate(steps)],
    )
    stub.add_response("describe_training_job", spot, {"TrainingJobName": JOB})
    with stub:
        status = scheduler(sagemaker).status(HANDLE)
    assert (status.attempt, status.interruptions) == (3, 1)
    assert [item.status for item in status.transitions] == steps
    assert status.transitions[2].start == (T0 + timedelta(minutes=2)).timestamp()
    assert (status.training_seconds, status.billable_seconds) == (500, 100)
