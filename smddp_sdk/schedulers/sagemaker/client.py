"""The AWS side: the only module of the project that imports boto3 and botocore.

``AwsClients`` hands out the SageMaker, S3, CloudWatch Logs and STS clients (tests inject their own
through the constructor) and turns every AWS failure into a ``SmddpError`` that carries AWS's own
message plus what to do about it. Missing credentials or region are ``UnavailableError`` (exit 3).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
import boto3.exceptions
import botocore.config
import botocore.exceptions

from smddp_sdk import __version__
from smddp_sdk.errors import EXIT_JOB_FAILED, EXIT_SPEC, EXIT_UNAVAILABLE, SmddpError, UnavailableError
from smddp_sdk.schedulers.sagemaker.errors import CREDENTIALS_HINT, REGION_HINT, AwsError

T = TypeVar("T")


# AWS error codes -> (exit code, what the user should do). AWS's own message is always shown too.
_ADVICE: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("AccessDenied", "AccessDeniedException"), (EXIT_UNAVAILABLE, "the credentials in use lack this permission; ask for it (e.g. AmazonSageMakerFullAccess) or use another profile")),
    **dict.fromkeys(("UnrecognizedClientException", "InvalidClientTokenId"), (EXIT_UNAVAILABLE, "the access key is not valid; " + CREDENTIALS_HINT)),
    "SignatureDoesNotMatch": (EXIT_UNAVAILABLE, "the secret key does not match the access key; " + CREDENTIALS_HINT),
    **dict.fromkeys(("ExpiredToken", "ExpiredTokenException"), (EXIT_UNAVAILABLE, "the session credentials expired; refresh them (e.g. `aws sso login`)")),
    "ResourceLimitExceeded": (
        EXIT_UNAVAILABLE,
        "an account quota is reached; request an increase in the Service Quotas console (SageMaker, '<instance type> for training job usage') or use a smaller instance_count/instance_type",
    ),
    "ThrottlingException": (EXIT_UNAVAILABLE, "AWS is throttling requests; wait a minute and retry"),
    "ResourceInUse": (EXIT_SPEC, "a training job with this name exists; set another job_name or base_job_name"),
    "ResourceNotFound": (EXIT_SPEC, "no such training job in this region; check the job name and region (sagemaker://<region>/<job>)"),
    "ValidationException": (EXIT_SPEC, "SageMaker rejected the request; fix the field it names"),
    "NoSuchBucket": (EXIT_SPEC, "the bucket does not exist; create it or point output_path/code_location at one that does"),
    "BucketAlreadyExists": (EXIT_SPEC, "another account owns that bucket name; pass bucket=... or set code_location and output_path"),
}


def translate(exc: BaseException, action: str) -> SmddpError:
    """The SmddpError to raise for an exception from boto3 while doing ``action`` (others are re-raised)."""
    if isinstance(exc, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)):
        return UnavailableError(f"cannot {action}: no AWS credentials found ({exc}); {CREDENTIALS_HINT}")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return UnavailableError(f"cannot {action}: no AWS region configured; {REGION_HINT}")
    if isinstance(exc, botocore.exceptions.ProfileNotFound):
        return UnavailableError(f"cannot {action}: {exc}; run `aws configure --profile <name>` or unset AWS_PROFILE")
    if isinstance(exc, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)):
        return UnavailableError(f"cannot {action}: AWS is unreachable ({exc}); check the network, proxy and region")
    inner = exc.__cause__ or exc.__context__
    if isinstance(exc, boto3.exceptions.Boto3Error) and isinstance(inner, botocore.exceptions.ClientError):
        return translate(inner, action)  # e.g. S3UploadFailedError around the PutObject error
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", "")) or str(exc)
        exit_code, advice = _advice(code, message)
        return AwsError(f"cannot {action}: AWS said {code}: {message}\n  what to do: {advice}", code=code, exit_code=exit_code)
    if isinstance(exc, (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error)):
        return AwsError(f"cannot {action}: {exc}")
    raise exc


def job_not_found(code: str, message: str) -> bool:
    """Whether AWS's answer means "no such job": AWS says "Requested resource not found.", moto "Could not find"."""
    return code in ("ValidationException", "ResourceNotFound") and bool(re.search(r"resource not found|could not find", message, re.IGNORECASE))


def _advice(code: str, message: str) -> tuple[int, str]:
    if job_not_found(code, message):
        return _ADVICE["ResourceNotFound"]
    if code == "ValidationException" and "role" in message.lower():
        return EXIT_SPEC, "the role must exist, be in this account and trust sagemaker.amazonaws.com (see docs/sagemaker.md, 'The execution role')"
    return _ADVICE.get(code, (EXIT_JOB_FAILED, "see AWS's message"))


def error_code(exc: BaseException) -> str:
    """AWS's error code of a ClientError (``""`` for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


class AwsClients:
    """Lazily built AWS clients for one region; pass ``sagemaker=``/``s3=``/``logs=``/``sts=`` to inject."""

    def __init__(self, *, region: str | None = None, profile: str | None = None, session: Any = None, sagemaker: Any = None, s3: Any = None, logs: Any = None, sts: Any = None) -> None:
        self._session = session
        self._profile = profile
        self._region = region
        self._clients: dict[str, Any] = {"sagemaker": sagemaker, "s3": s3, "logs": logs, "sts": sts}
        self._account: str | None = None

    @property
    def session(self) -> Any:
        if self._session is None:
            try:
                self._session = boto3.Session(profile_name=self._profile, region_name=self._region)
            except botocore.exceptions.BotoCoreError as exc:
                raise translate(exc, "open an AWS session") from None
        return self._session

    @property
    def region(self) -> str:
        region = self._region or _injected_region(self._clients) or self.session.region_name
        if not region:
            raise UnavailableError(f"no AWS region configured; {REGION_HINT}")
        self._region = region
        return region

    def require_credentials(self) -> None:
        """Fail early, before anything is built or uploaded, when no credentials can be found."""
        if all(client is not None for client in self._clients.values()):
            return  # fully injected (tests): the clients carry their own credentials
        if self.session.get_credentials() is None:
            raise UnavailableError(f"no AWS credentials found; {CREDENTIALS_HINT}")

    def client(self, service: str) -> Any:
        if self._clients.get(service) is None:
            config = botocore.config.Config(user_agent_extra=f"smddp-sdk/{__version__}", retries={"max_attempts": 15 if service == "logs" else 5, "mode": "standard"})
            self._clients[service] = self.session.client(service, region_name=self.region, config=config)
        return self._clients[service]

    @property
    def sagemaker(self) -> Any:
        return self.client("sagemaker")

    @property
    def s3(self) -> Any:
        return self.client("s3")

    @property
    def logs(self) -> Any:
        return self.client("logs")

    def account_id(self) -> str:
        if self._account is None:
            identity = call("look up the AWS account (sts:GetCallerIdentity)", self.client("sts").get_caller_identity)
            self._account = str(identity["Account"])
        return self._account


def call(action: str, function: Callable[..., T], /, **kwargs: Any) -> T:
    """Run one AWS call, turning its failures into SmddpErrors that say what to do."""
    try:
        return function(**kwargs)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, boto3.exceptions.Boto3Error) as exc:
        raise translate(exc, action) from None


def is_not_found(exc: BaseException) -> bool:
    return error_code(exc) in ("404", "NoSuchBucket", "NotFound", "ResourceNotFoundException")


def _injected_region(clients: dict[str, Any]) -> str | None:
    """An injected client already knows its region."""
    return next((str(client.meta.region_name) for client in clients.values() if client is not None), None)
