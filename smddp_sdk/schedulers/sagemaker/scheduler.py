"""``SageMakerScheduler``: run a JobSpec as a real SageMaker training job.

``dryrun`` and ``validate`` are pure (no credentials, no network): they check everything, including
the role and the image, and show the exact ``CreateTrainingJob`` request. What only AWS or the user can
supply is a placeholder there, said in the notes: ``<account-id>`` (from the credentials at submit), and,
when none is configured, the role and the region, which ``schedule`` requires before it contacts AWS.
``schedule`` fills the account in, creates the default bucket if needed, uploads ``sourcedir.tar.gz``
and creates the job. boto3 is loaded only when AWS is first called, through ``client.py``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from smddp_sdk.errors import SpecError, SpecIssue, UnavailableError
from smddp_sdk.schedulers.base import Capabilities, DryRun, Listed, Scheduler, newest
from smddp_sdk.schedulers.options import Option, SchedulerOptions, is_text, matching, seconds
from smddp_sdk.schedulers.sagemaker import request as req
from smddp_sdk.schedulers.sagemaker import request_v3 as req_v3
from smddp_sdk.schedulers.sagemaker import states, validation
from smddp_sdk.schedulers.sagemaker.errors import INSTALL_HINT, REGION_HINT, Detached
from smddp_sdk.specs.contract import decode_hyperparameter
from smddp_sdk.specs.job import JobSpec
from smddp_sdk.specs.status import HostStatus, JobHandle, JobState, JobStatus, LogLine

if TYPE_CHECKING:
    from smddp_sdk.schedulers.sagemaker.client import AwsClients

Echo = Callable[[str], None]
STATUS_HOST = "sagemaker"  # the pseudo-host of SageMaker's own status lines in a followed log
# Stand-ins a dry run shows where nothing says the region or the role; ``run`` refuses them.
PLACEHOLDER_REGION = "us-east-1"
PLACEHOLDER_ROLE = "<execution-role>"


def _text(name: str, description: str) -> Option:
    return Option(name, "str", None, description, check=is_text)


def _python(name: str, description: str, default: Any = None) -> Option:
    return Option(name, "object", default, description, code_only=True)


class SageMakerScheduler(Scheduler):
    """Runs a job as a SageMaker training job; its options are declared below (``smddp-launch options
    sagemaker``). Python callers may also inject boto3 clients or a session, and callbacks."""

    name: ClassVar[str] = "sagemaker"
    capabilities: ClassVar[Capabilities] = Capabilities(instead={
        "interrupt": "SageMaker interrupts spot jobs itself; `interrupt` rehearses that on a local or docker job",
        "stacks": "use py-spy dump --pid in the container (SSM) or the job's CloudWatch logs",
        "remove": "SageMaker keeps its jobs: `smddp-launch clean JOB` forgets it here",
    })
    options: ClassVar[SchedulerOptions] = SchedulerOptions.of(
        "sagemaker",
        _text("region", "AWS region (default AWS_REGION or ~/.aws/config)"),
        _text("role", "execution role ARN when the job has no role"),
        _text("bucket", "bucket for code and output instead of sagemaker-<region>-<account>"),
        _text("code_location", "where the code tarball goes when the job has none"),
        _text("output_path", "where model and output go when the job has none"),
        _text("profile", "AWS profile from ~/.aws/config"),
        # YAML reads 111122223333 as a number: taken as the 12 digits it spells.
        Option(
            "account_id", "str", None, "the account, to save an STS lookup", check=matching(r"\d{12}", "the 12-digit account id"), convert=lambda account: None if account is None else str(account)
        ),
        Option("poll", "float", 10.0, "seconds between DescribeTrainingJob calls while following", check=seconds),
        Option("min_poll", "float", 5.0, "the shortest poll allowed (DescribeTrainingJob is rate-limited)", check=seconds),
        _python("session", "a boto3 session to make the clients from"),
        *(_python(f"{service}_client", f"a boto3 {service} client") for service in ("sagemaker", "s3", "logs", "sts")),
        _python("echo", "called with upload progress and submit messages (default: stderr)", lambda text: print(text, file=sys.stderr, flush=True)),
        _python("log_sink", "called with the lines wait(logs=True) prints (default: stdout)", functools.partial(print, flush=True)),
        _python("sleep", "how to wait between polls", time.sleep),
        not_taken={"retry_script_errors": "SageMaker retries only its own failures (RetryStrategy), never the script's: "
                                          "drop it (torchrun's --max-restarts asks for it); max_retry_attempts alone is SageMaker's retry"},
    )
    region: str | None
    role: str | None
    bucket: str | None
    code_location: str | None
    output_path: str | None
    profile: str | None
    account_id: str | None
    poll: float
    min_poll: float
    echo: Echo
    log_sink: Echo
    sleep: Callable[[float], None]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        injected = ("session", "sagemaker_client", "s3_client", "logs_client", "sts_client")
        self._injected = {name.removesuffix("_client"): getattr(self, name) for name in injected}
        self._clients: dict[str, AwsClients] = {}

    # --- pure: validation and the request ---------------------------------------------------------

    def resolved_region(self) -> str:
        """The region from the option, AWS_REGION/AWS_DEFAULT_REGION, or the AWS config; reads no network."""
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            return region
        try:
            return self.clients(None).region
        except ImportError:
            raise UnavailableError(f"no AWS region configured; {REGION_HINT} (or {INSTALL_HINT} to read ~/.aws/config)") from None

    def planned_region(self) -> tuple[str, str]:
        """The region a dry run plans for, and why it is the placeholder ("" when it is not)."""
        try:
            return self.resolved_region(), ""
        except UnavailableError as err:  # none configured, boto3 missing to read ~/.aws/config, a bad profile
            return PLACEHOLDER_REGION, str(err)

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec with this scheduler's role/code_location/output_path filled in where it has none."""
        return spec.replace(role=spec.role or self.role, code_location=spec.code_location or self.code_location, output_path=spec.output_path or self.output_path)

    def validate(self, spec: JobSpec) -> list[SpecIssue]:
        spec = self.resolve(spec)  # also called directly, on a spec as written
        issues = validation.spec_issues(spec)
        if not spec.image_uri and spec.api == "v3":
            issues.append(SpecIssue("image_uri", "is required for a v3 (ModelTrainer) job on SageMaker",
                                    "pass training_image=... (v3 requires it too): the smddp-sdk image pushed to ECR, or an AWS PyTorch image"))
        elif not spec.image_uri:
            issues += req.resolve_image(spec, self.planned_region()[0])[1]
        return issues

    def plan(self, spec: JobSpec) -> DryRun:
        """The exact request, with placeholders where the account, the role or the region is not known
        (``run`` fills the account in and refuses the others)."""
        region, region_problem = self.planned_region()
        if spec.api == "v3":
            return self._plan_v3(spec, region, region_problem)
        image_uri, _ = req.resolve_image(spec, region)
        assert image_uri is not None  # validate() reported any image problem
        job_name = req.job_name_for(spec, image_uri)
        placement = self._placement(spec, job_name, region, image_uri, self.account_id)
        request = req.build_request(spec, job_name=job_name, placement=placement)
        return DryRun(self.name, spec, job_name, request, (*_placeholder_notes(spec, placement, region_problem), *_notes(spec, placement)))

    def _plan_v3(self, spec: JobSpec, region: str, region_problem: str) -> DryRun:
        """v3's request shape (``api: v3``): code and drivers as channels; the same spec, checks and notes."""
        job_name = req_v3.job_name_for(spec)
        placement = self._placement(spec, job_name, region, spec.image_uri or "", self.account_id)
        request = req_v3.build_request(spec, job_name=job_name, region=region, role=spec.role or PLACEHOLDER_ROLE,
                                       default_bucket=placement.default_bucket, account=self.account_id)
        uploads = [channel["DataSource"]["S3DataSource"]["S3Uri"] for channel in request["InputDataConfig"] if channel["ChannelName"] in (req_v3.CODE_CHANNEL, req_v3.DRIVERS_CHANNEL)]
        notes = [f"would upload {'the code directory and ' if spec.source_dir else ''}smddp-sdk's drivers to {' and '.join(uploads)}"]
        return DryRun(self.name, spec, job_name, request, (*_placeholder_notes(spec, placement, region_problem), *notes))

    def _placement(self, spec: JobSpec, job_name: str, region: str, image_uri: str, account: str | None) -> req.Placement:
        return req.plan_placement(spec, job_name=job_name, region=region, role=spec.role or PLACEHOLDER_ROLE, image_uri=image_uri, account=account, bucket=self.bucket)

    # --- AWS --------------------------------------------------------------------------------------

    def clients(self, region: str | None) -> AwsClients:
        """AWS clients for ``region`` (imports boto3 on first use)."""
        from smddp_sdk.schedulers.sagemaker.client import AwsClients

        key = region or self.region or ""
        if key not in self._clients:
            self._clients[key] = AwsClients(region=region or self.region, profile=self.profile, **self._injected)
        return self._clients[key]

    def run(self, dryrun: DryRun, *, owner_pid: int | None) -> JobHandle:
        """Upload the code and create the job the dry run shows, its account filled in."""
        from smddp_sdk.schedulers.sagemaker.client import call

        spec, job_name = dryrun.spec, dryrun.job_name
        if not spec.role:  # what a dry run may leave open and a submit may not: a role, then a region
            raise SpecError(req.role_issues(None))
        resolved = self.resolved_region()  # raises UnavailableError with what to set
        v3 = spec.api == "v3"  # a v3-shaped request names no region: the plan's is the resolved one
        region = resolved if v3 else decode_hyperparameter(dryrun.request["HyperParameters"]["sagemaker_region"])
        image_uri = dryrun.request["AlgorithmSpecification"]["TrainingImage"]
        aws = self.clients(region)
        aws.require_credentials()
        # The account is looked up only when the default bucket or a role given by name needs it.
        account = self.account_id or (aws.account_id() if self._placement(spec, job_name, region, image_uri, None).needs_account else None)
        placement = self._placement(spec, job_name, region, image_uri, account)
        if account is not None and not self.bucket:
            self._ensure_default_bucket(aws, placement, account)
        request = req.fill_account(dryrun.request, account) if account is not None else dryrun.request
        if v3:
            owner = account if not self.bucket else None
            self._upload_v3_inputs(aws, spec, request, region, owner if f"s3://{placement.default_bucket}/" in json.dumps(request) else None)
        elif placement.code is not None:
            owner = account if placement.code.bucket == placement.default_bucket and not self.bucket else None
            self._upload_code(aws, spec, placement.code, owner)
        call(f"create the training job {job_name}", aws.sagemaker.create_training_job, **request)
        handle = JobHandle(self.name, f"{region}/{job_name}")
        self.echo(_next_steps(handle, region, job_name))
        return handle

    def _ensure_default_bucket(self, aws: AwsClients, placement: req.Placement, account: str) -> None:
        from smddp_sdk.schedulers.sagemaker import upload

        if _uses_bucket(placement, placement.default_bucket) and upload.ensure_bucket(aws, placement.default_bucket, account=account):
            self.echo(f"created the default bucket s3://{placement.default_bucket}")

    def _upload_code(self, aws: AwsClients, spec: JobSpec, location: req.S3Location, owner: str | None) -> None:
        from smddp_sdk.schedulers.sagemaker import upload

        with tempfile.TemporaryDirectory(prefix="smddp-sourcedir-") as scratch:
            tarball = upload.build_sourcedir(spec, Path(scratch))
            warning = upload.big_tarball_warning(tarball)
            if warning:
                self.echo(warning)
            upload.upload(aws, tarball, location, expected_owner=owner, echo=self.echo)

    def _upload_v3_inputs(self, aws: AwsClients, spec: JobSpec, request: dict[str, Any], region: str, owner: str | None) -> None:
        """The code directory and smddp-sdk's drivers, file by file, under the channels' prefixes (v3's layout)."""
        from smddp_sdk.schedulers.sagemaker import upload

        prefixes = {channel["ChannelName"]: req.S3Location.parse(channel["DataSource"]["S3DataSource"]["S3Uri"]) for channel in request["InputDataConfig"]}
        with tempfile.TemporaryDirectory(prefix="smddp-drivers-") as scratch:
            drivers = Path(scratch)
            for name, text in req_v3.driver_files(spec, job_name=request["TrainingJobName"], region=region).items():
                (drivers / name).write_text(text)
            trees = [(drivers, prefixes[req_v3.DRIVERS_CHANNEL])]
            if spec.source_dir:
                trees.append((Path(spec.source_dir), prefixes[req_v3.CODE_CHANNEL]))
            for tree, prefix in trees:
                upload.upload_tree(aws, tree, prefix, expected_owner=owner, echo=self.echo)

    def describe(self, handle: JobHandle) -> dict[str, Any]:
        from smddp_sdk.schedulers.sagemaker.client import call

        region, job_name = _parse(handle)
        aws = self.clients(region)
        return call(f"describe the training job {job_name}", aws.sagemaker.describe_training_job, TrainingJobName=job_name)

    def attach(self, job: str) -> JobHandle:
        """The handle of an existing job, from ``sagemaker://<region>/<name>`` or a bare name (this region)."""
        handle = JobHandle.parse(job) if "://" in job else JobHandle(self.name, f"{self.resolved_region()}/{job}")
        self.describe(handle)  # fails with what to do when there is no such job
        return handle

    def status(self, handle: JobHandle) -> JobStatus:
        return _job_status(handle, self.describe(handle))

    def list_jobs(self, limit: int | None = None, states: Collection[JobState] = (), name_contains: str | None = None) -> list[JobStatus]:
        """This region's training jobs, newest first, from one ListTrainingJobs call: at most 100 (50 unless told),
        and with ``states`` only those of the region's newest 100 that are in them."""
        from smddp_sdk.schedulers.sagemaker.client import call

        region = self.resolved_region()
        query: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Descending", "MaxResults": 100 if states else max(1, min(limit or 50, 100))}
        if name_contains:
            query["NameContains"] = name_contains
        listed = call("list training jobs", self.clients(region).sagemaker.list_training_jobs, **query)
        summaries = listed.get("TrainingJobSummaries", [])
        # a summary has what a listing row shows: no describe per job
        return newest([Listed.of(_job_status(JobHandle(self.name, f"{region}/{item['TrainingJobName']}"), item)) for item in summaries], limit, states)

    def undescribed(self, err: Exception) -> str:
        """A few words for a listing row: a job SageMaker no longer has is gone; an AWS refusal is its code."""
        from smddp_sdk.schedulers.sagemaker.client import job_not_found

        code = getattr(err, "code", "")
        if job_not_found(code, str(err)):
            return "gone: SageMaker has no such job (any more)"
        if code:
            return f"cannot describe it: AWS said {code}"
        reason = str(err).splitlines()[0].split(": ", 1)[-1].split("; ")[0]  # the cause, without the job's name and the advice
        return textwrap.shorten(f"cannot describe it: {reason}", 100, placeholder=" ...")

    def logs(self, handle: JobHandle, *, hosts: Sequence[str] | None = None, ranks: Sequence[int] | None = None, follow: bool = False) -> Iterator[LogLine]:
        """Every host's CloudWatch lines merged by time. With ``follow``, also SageMaker's status lines and,
        at the end, the billed seconds (as lines of the pseudo-host ``sagemaker``), until the job ends."""
        from smddp_sdk.schedulers.sagemaker import logs as cloudwatch

        if follow:
            yield from self._follow(handle, hosts=hosts, ranks=ranks, poll=self.poll, deadline=None)
            return
        region, job_name = _parse(handle)
        yield from cloudwatch.read_all(cloudwatch.LogTail(self.clients(region).logs, job_name, hosts=hosts, ranks=ranks))

    def cancel(self, handle: JobHandle) -> None:
        from smddp_sdk.schedulers.sagemaker.client import error_code, translate

        region, job_name = _parse(handle)
        if self.describe(handle).get("TrainingJobStatus") != "InProgress":
            return  # finished, stopped or already stopping: nothing to do
        try:
            self.clients(region).sagemaker.stop_training_job(TrainingJobName=job_name)
        except Exception as exc:  # noqa: BLE001
            # It may have finished between the two calls; only a job still running is an error.
            if error_code(exc) != "ValidationException" or self.describe(handle).get("TrainingJobStatus") == "InProgress":
                raise translate(exc, f"stop the training job {job_name}") from None

    def wait(self, handle: JobHandle, *, poll: float | None = None, timeout: float | None = None, logs: bool = False) -> JobStatus:
        """Poll until the job ends (or ``timeout`` seconds pass); with ``logs`` print what ``logs(follow=True)``
        yields to ``log_sink``. Ctrl-C detaches: the job keeps running and ``Detached`` says how to come back."""
        poll = self.poll if poll is None else poll
        try:
            if logs:
                deadline = None if timeout is None else time.monotonic() + timeout
                return self._print_until_end(self._follow(handle, hosts=None, ranks=None, poll=poll, deadline=deadline))
            return super().wait(handle, poll=poll, timeout=timeout)
        except KeyboardInterrupt:
            raise Detached(
                f"detached from {handle}: the job keeps running on SageMaker (and keeps being billed)\n  reattach: smddp-launch logs --follow {handle}\n  stop it:  smddp-launch cancel {handle}"
            ) from None

    def _print_until_end(self, lines: Generator[LogLine, None, JobStatus]) -> JobStatus:
        while True:
            try:
                line = next(lines)
            except StopIteration as end:
                return end.value
            self.log_sink(f"{line.prefix} {line.text}")

    def _follow(self, handle: JobHandle, *, hosts: Sequence[str] | None, ranks: Sequence[int] | None, poll: float, deadline: float | None) -> Generator[LogLine, None, JobStatus]:
        """Status lines, log lines as they arrive, then billing; returns the final status."""
        from smddp_sdk.schedulers.sagemaker import logs as cloudwatch

        region, job_name = _parse(handle)
        tail = cloudwatch.LogTail(self.clients(region).logs, job_name, hosts=hosts, ranks=ranks)
        show_status = ranks is None and (hosts is None or STATUS_HOST in hosts)
        shown = 0
        while True:
            description = self.describe(handle)
            if show_status:
                yield from (LogLine(STATUS_HOST, text, timestamp=at) for at, text in states.new_transitions(description, shown))
            shown = len(description.get("SecondaryStatusTransitions") or [])
            yield from cloudwatch.read_all(tail)
            status = _job_status(handle, description)
            if status.state.is_terminal:
                self.sleep(min(poll, cloudwatch.LAST_LINES_DELAY))  # CloudWatch shows the last lines late
                yield from cloudwatch.read_all(tail)
                if show_status:
                    yield from _end_lines(status, description, region, job_name)
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            self._pause(poll)

    def _pause(self, poll: float) -> None:
        self.sleep(max(poll, self.min_poll))  # DescribeTrainingJob is rate-limited


def _end_lines(status: JobStatus, description: dict[str, Any], region: str, job_name: str) -> Iterator[LogLine]:
    from smddp_sdk.schedulers.sagemaker.logs import console_url

    for text in states.billing_lines(description):
        yield LogLine(STATUS_HOST, text)
    if status.failure is not None:
        yield LogLine(STATUS_HOST, f"failed: {status.failure.message}")
        yield LogLine(STATUS_HOST, f"CloudWatch logs: {console_url(region, job_name)}")
    elif status.model_data:
        yield LogLine(STATUS_HOST, f"model artifacts: {status.model_data}")


def _parse(handle: JobHandle) -> tuple[str, str]:
    region, sep, job_name = handle.job_id.partition("/")
    if handle.scheduler != "sagemaker" or not sep or not region or not job_name:
        raise SpecError(SpecIssue("handle", f"{handle} is not a SageMaker job handle", "expected sagemaker://<region>/<training job name>"))
    return region, job_name


def _job_status(handle: JobHandle, description: dict[str, Any]) -> JobStatus:
    state = states.job_state(description)
    count = int(description.get("ResourceConfig", {}).get("InstanceCount", 0))
    details = {key: description[key] for key in ("TrainingJobStatus", "SecondaryStatus", "FailureReason", "CreationTime") if key in description}
    return JobStatus(
        handle=handle,
        state=state,
        message=states.status_message(description),
        failure=states.failure(description),
        hosts=tuple(HostStatus(f"algo-{i}", state) for i in range(1, count + 1)),
        model_data=description.get("ModelArtifacts", {}).get("S3ModelArtifacts"),
        scheduler_job_id=description.get("TrainingJobArn"),
        details=details,
        **states.attempt_fields(description),
        **_times(description),
    )


def _times(description: dict[str, Any]) -> dict[str, float | None]:
    """When the job was created (it starts there: SageMaker provisions, then trains) and ended, as the other
    schedulers give them (seconds since the epoch); also in ListTrainingJobs' summaries."""
    created, ended = (description.get(key) for key in ("CreationTime", "TrainingEndTime"))
    if ended is None and description.get("TrainingJobStatus") in ("Failed", "Stopped"):
        ended = description.get("LastModifiedTime")  # a job stopped before training has no TrainingEndTime
    created_s = created.timestamp() if hasattr(created, "timestamp") else None
    return {"submitted": created_s, "started": created_s, "ended": ended.timestamp() if hasattr(ended, "timestamp") else None}


def _next_steps(handle: JobHandle, region: str, job_name: str) -> str:
    console = f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/jobs/{job_name}"
    return f"Submitted {handle}\n  follow: smddp-launch logs --follow {handle}\n  status: smddp-launch status {handle}\n  stop:   smddp-launch cancel {handle}\n  console: {console}"


def _uses_bucket(placement: req.Placement, bucket: str) -> bool:
    output_bucket = req.S3Location.parse(placement.output_path).bucket
    return output_bucket == bucket or (placement.code is not None and placement.code.bucket == bucket)


def _placeholder_notes(spec: JobSpec, placement: req.Placement, region_problem: str) -> list[str]:
    """What the request shows in place of what is not known here, and where each comes from."""
    notes = []
    if region_problem:
        notes.append(f"placeholder: region {placement.region} (submitting needs a real one: {region_problem})")
    if not spec.role:
        notes.append(f"placeholder: role {placement.role_arn} (none is given; submitting needs one: role: in a job file, role= in Python, SMDDP_ROLE or the sagemaker option role)")
    bucket = placement.default_bucket if _uses_bucket(placement, placement.default_bucket) else ""
    where = [what for what, value in (("the role ARN", placement.role_arn), (f"the bucket s3://{bucket}", bucket)) if req.ACCOUNT_PLACEHOLDER in value]
    if where:
        notes.append(f"placeholder: {req.ACCOUNT_PLACEHOLDER} in {' and '.join(where)}, filled in from the credentials (sts:GetCallerIdentity) at submit")
    return notes


def _notes(spec: JobSpec, placement: req.Placement) -> list[str]:
    notes = []
    if placement.code is not None:
        parts = "source_dir" if spec.source_dir else "the entry point"
        extra = f" and {len(spec.dependencies)} dependencies" if spec.dependencies else ""
        notes.append(f"would upload sourcedir.tar.gz ({parts}{extra}) to {placement.code.uri}")
    if _uses_bucket(placement, placement.default_bucket):
        notes.append(f"would create s3://{placement.default_bucket} if it does not exist")
    return notes
