"""Errors and advice of the SageMaker scheduler that need no boto3 (client.py raises them too)."""

from __future__ import annotations

from smddp_sdk.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, SmddpError

CREDENTIALS_HINT = "set AWS credentials: AWS_PROFILE=<profile> (after `aws configure` or `aws sso login`), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary ones)"
REGION_HINT = "set AWS_REGION (e.g. export AWS_REGION=us-west-2), pass region=..., or set a region in ~/.aws/config"
INSTALL_HINT = "install the AWS extra: pip install 'smddp-sdk[aws]'"


class AwsError(SmddpError):
    """An AWS call failed; the message holds what was attempted, AWS's code and message, and advice."""

    def __init__(self, message: str, *, code: str = "", exit_code: int = EXIT_JOB_FAILED) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


class Detached(SmddpError):
    """Ctrl-C while waiting: the job keeps running on SageMaker; the message says how to reattach."""

    exit_code = EXIT_INTERRUPTED
