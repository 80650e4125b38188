"""The parts of v2's ``sagemaker.Session`` and ``sagemaker.local.LocalSession`` notebooks commonly use.

    from smddp_sdk.session import Session, LocalSession, get_execution_role

    session = Session()                                  # region from AWS_REGION / ~/.aws/config
    bucket = session.default_bucket()                    # sagemaker-<region>-<account>, created if missing
    train = session.upload_data("data/train", key_prefix="data/train")
    PyTorch(..., sagemaker_session=session).fit({"train": train})

    local = LocalSession()                               # needs no AWS at all
    local.config = {"local": {"local_code": True}}        # accepted as in v2 (code is always local here)
    train = local.upload_data("data/train")              # stays on this machine: file://<absolute path>

An estimator given ``sagemaker_session=`` takes its region (and boto3 session) from it. Everything that
needs AWS imports boto3 on first use; without it the error says how to install it (exit 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from smddp_sdk.errors import NotOfferedAttributeError, SpecError, SpecIssue, UnavailableError

INSTALL_HINT = "pip install 'smddp-sdk[aws]'"


def _aws_module(name: str) -> Any:
    """``smddp_sdk.schedulers.sagemaker.<name>``; without boto3 an UnavailableError (exit 3) with the install command."""
    import importlib

    try:
        return importlib.import_module(f"smddp_sdk.schedulers.sagemaker.{name}")
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("smddp_sdk"):
            raise
        raise UnavailableError(f"this needs the Python package {err.name!r}: {INSTALL_HINT}") from None


def _call(action: str, function: Any, **kwargs: Any) -> Any:
    return _aws_module("client").call(action, function, **kwargs)


class Session:
    """v2's ``sagemaker.Session``: region, default bucket, data upload/download and job look-ups."""

    local_mode = False

    def __init__(
        self,
        boto_session: Any = None,
        sagemaker_client: Any = None,
        sagemaker_runtime_client: Any = None,
        sagemaker_featurestore_runtime_client: Any = None,
        default_bucket: str | None = None,
        sagemaker_config: dict[str, Any] | None = None,
        settings: Any = None,
        sagemaker_metrics_client: Any = None,
        default_bucket_prefix: str | None = None,
    ) -> None:
        self.boto_session = boto_session
        self.sagemaker_client = sagemaker_client
        self.sagemaker_config = sagemaker_config
        self._default_bucket_name = default_bucket
        self.default_bucket_prefix = default_bucket_prefix
        self._clients: Any = None
        self.config: dict[str, Any] | None = None

    # --- where -------------------------------------------------------------------------------------

    @property
    def boto_region_name(self) -> str:
        return str(self._given_region() or self.clients.region)

    def _given_region(self) -> str | None:
        return getattr(self.boto_session, "region_name", None) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")

    @property
    def clients(self) -> Any:
        """AwsClients from the SageMaker scheduler (the one module that imports boto3)."""
        if self._clients is None:
            self._clients = _aws_module("client").AwsClients(region=self._given_region(), session=self.boto_session, sagemaker=self.sagemaker_client)
        return self._clients

    def scheduler_options(self) -> dict[str, Any]:
        """What an estimator given this session passes to the SageMaker scheduler."""
        options: dict[str, Any] = {"region": self.boto_region_name}
        if self.boto_session is not None:
            options["session"] = self.boto_session
        if self.sagemaker_client is not None:
            options["sagemaker_client"] = self.sagemaker_client
        if self._default_bucket_name:
            options["bucket"] = self._default_bucket_name
        return options

    def account_id(self) -> str:
        return str(self.clients.account_id())

    def get_caller_identity_arn(self) -> str:
        identity = _call("look up the caller (sts:GetCallerIdentity)", self.clients.client("sts").get_caller_identity)
        return str(identity["Arn"])

    # --- data --------------------------------------------------------------------------------------

    def default_bucket(self) -> str:
        """``sagemaker-<region>-<account>`` (or the bucket given), created when it does not exist."""
        if self._default_bucket_name:
            return self._default_bucket_name
        account = self.account_id()
        name = f"sagemaker-{self.boto_region_name}-{account}"
        _aws_module("upload").ensure_bucket(self.clients, name, account=account)
        self._default_bucket_name = name
        return name

    def upload_data(self, path: str, bucket: str | None = None, key_prefix: str = "data", extra_args: dict[str, Any] | None = None, callback: Any = None) -> str:
        """Upload a file or a directory tree to ``s3://<bucket>/<key_prefix>/...``; return its S3 URI."""
        source = _existing(path)
        bucket = bucket or self.default_bucket()
        prefix = "/".join(part for part in (self.default_bucket_prefix if bucket == self._default_bucket_name else None, key_prefix) if part)
        from smddp_sdk import progress

        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        total = sum(file.stat().st_size for file in files)
        with progress.bar(total, f"uploading {path} to s3://{bucket}/{prefix}", unit_bytes=True) as advance:
            for file in files:
                key = f"{prefix}/{file.name}" if source.is_file() else f"{prefix}/{file.relative_to(source).as_posix()}"
                _call(f"upload {file} to s3://{bucket}/{key}", self.clients.s3.upload_file, Filename=str(file), Bucket=bucket, Key=key, ExtraArgs=extra_args, Callback=callback or advance)
        return f"s3://{bucket}/{prefix}/{source.name}" if source.is_file() else f"s3://{bucket}/{prefix}"

    def download_data(self, path: str, bucket: str, key_prefix: str = "", extra_args: dict[str, Any] | None = None) -> list[str]:
        """Download every object under ``s3://<bucket>/<key_prefix>`` into ``path``; return the local files."""
        s3 = self.clients.s3
        listed = _call(f"list s3://{bucket}/{key_prefix}", s3.list_objects_v2, Bucket=bucket, Prefix=key_prefix)
        written = []
        for item in listed.get("Contents", []):
            key = item["Key"]
            relative = key[len(key_prefix):].lstrip("/") or Path(key).name
            target = Path(path) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            _call(f"download s3://{bucket}/{key}", s3.download_file, Bucket=bucket, Key=key, Filename=str(target), ExtraArgs=extra_args)
            written.append(str(target))
        return written

    # --- jobs --------------------------------------------------------------------------------------

    def describe_training_job(self, job_name: str) -> dict[str, Any]:
        described: dict[str, Any] = _call(f"describe the training job {job_name}", self.clients.sagemaker.describe_training_job, TrainingJobName=job_name)
        return described

    def logs_for_job(self, job_name: str, wait: bool = False, poll: int = 10, log_type: str = "All", timeout: int | None = None) -> None:
        """Print the job's logs (and follow them until it ends with ``wait``)."""
        from smddp_sdk import launcher

        scheduler, handle = self._job(job_name)
        if wait:
            launcher.follow(scheduler, handle)
            return
        for line in scheduler.logs(handle):
            print(launcher.format_line(line), flush=True)

    def wait_for_job(self, job: str, poll: int = 5) -> dict[str, Any]:
        scheduler, handle = self._job(job)
        scheduler.wait(handle, poll=poll)
        return self.describe_training_job(job)

    def _job(self, job_name: str) -> tuple[Any, Any]:
        """The SageMaker scheduler with this session's options, and the job's handle."""
        from smddp_sdk.schedulers import get_scheduler
        from smddp_sdk.specs.status import JobHandle

        return get_scheduler("sagemaker", **self.scheduler_options()), JobHandle("sagemaker", f"{self.boto_region_name}/{job_name}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotOfferedAttributeError(f"Session.{name}", "this Session offers boto_region_name, default_bucket, upload_data, download_data, "
                              "describe_training_job, logs_for_job and wait_for_job; use boto3 directly for the rest")


class LocalSession(Session):
    """v2's ``sagemaker.local.LocalSession``: for ``instance_type="local"`` jobs. Needs no AWS: data stays
    on this machine (``upload_data`` returns a ``file://`` URI) and code is always used in place."""

    local_mode = True

    def __init__(self, boto_session: Any = None, default_bucket: str | None = None, s3_endpoint_url: str | None = None,
                 disable_local_code: bool = False, sagemaker_config: dict[str, Any] | None = None,
                 default_bucket_prefix: str | None = None) -> None:
        super().__init__(boto_session=boto_session, default_bucket=default_bucket, sagemaker_config=sagemaker_config,
                         default_bucket_prefix=default_bucket_prefix)
        self.s3_endpoint_url = s3_endpoint_url
        self.config = {"local": {"local_code": not disable_local_code}}

    def upload_data(self, path: str, bucket: str | None = None, key_prefix: str = "data", extra_args: dict[str, Any] | None = None, callback: Any = None) -> str:
        """Local jobs read local data directly: the ``file://`` URI of ``path`` (nothing is copied)."""
        return f"file://{_existing(path).resolve()}"

    def scheduler_options(self) -> dict[str, Any]:
        return {}


def get_execution_role(sagemaker_session: Session | None = None, use_default: bool = False) -> str:
    """v2's ``get_execution_role``: the role ARN in ``SMDDP_ROLE`` or ``SAGEMAKER_ROLE``, else the caller's
    own ARN when it is a SageMaker execution role (inside a SageMaker notebook)."""
    for name in ("SMDDP_ROLE", "SAGEMAKER_ROLE"):
        if os.environ.get(name):
            return os.environ[name]
    arn = (sagemaker_session or Session()).get_caller_identity_arn()
    if ":assumed-role/" in arn:  # arn:aws:sts::<acct>:assumed-role/<role>/<session>
        account = arn.split(":")[4]
        role = arn.split(":assumed-role/", 1)[1].split("/", 1)[0]
        return f"arn:aws:iam::{account}:role/{role}"
    if ":role/" in arn:
        return arn
    raise SpecError(SpecIssue("role", f"the caller {arn} is not a role, so there is no execution role to return", "pass role='arn:aws:iam::<account>:role/<name>' or set SMDDP_ROLE"))


def _existing(path: str) -> Path:
    source = Path(path).expanduser()
    if not source.exists():
        raise SpecError(SpecIssue("path", f"{path!r} does not exist", "pass an existing file or directory"))
    return source


__all__ = ["Session", "LocalSession", "get_execution_role"]
