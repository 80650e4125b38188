"""Capture the CreateTrainingJob requests SageMaker SDK v3's ``ModelTrainer`` builds (the v3 parity oracle).

Runs inside the v3 oracle virtualenv (scripts/setup-sagemaker-v3-oracle.sh), never in the project's own
environment: it imports ``sagemaker.train`` (the sagemaker-train package). Reads a JSON list of cases on
stdin, each ``{"region", "trainer": {...}, "inputs": [...] | null, "with": {...}, "buckets": [...]}``, where
``trainer`` holds ModelTrainer's keyword arguments with every configuration object written as a mapping of
its fields (``distributed`` as ``{"Torchrun": {...}}`` or ``{"MPI": {...}}``), ``inputs`` the channels given
to ``train`` and ``with`` the ``with_*`` builders to call. Writes a JSON list of ``{"request": <params>}``
or ``{"error": "<exception>"}`` on stdout.

AWS is replaced by moto; telemetry by a no-op.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from v3_case_objects import train_inputs, trainer_arguments, with_builders  # beside this file: the same objects as the test builds

_CAPTURED: list = []


def _record_requests() -> None:
    """Keep the parameters of every CreateTrainingJob call (moto answers it); IAM's policy simulation,
    which moto lacks, says the role may write the default bucket (a usual execution role may)."""
    from botocore.client import BaseClient

    original = BaseClient._make_api_call

    def recording(self, operation, params):
        if operation == "CreateTrainingJob":
            _CAPTURED.append(params)
        if operation == "SimulatePrincipalPolicy":
            return {"EvaluationResults": [{"EvalActionName": name, "EvalDecision": "allowed"} for name in params["ActionNames"]]}
        return original(self, operation, params)

    BaseClient._make_api_call = recording


def _quiet_telemetry() -> None:
    from sagemaker.core.telemetry import telemetry_logging

    telemetry_logging._send_telemetry_request = lambda *args, **kwargs: None


def _capture(case: dict) -> dict:
    import boto3
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.train import ModelTrainer, configs, distributed

    boto_session = boto3.Session(region_name=case["region"])
    s3 = boto_session.client("s3", region_name="us-east-1")
    for bucket in case.get("buckets", ()):  # buckets the arguments name exist, as they would for a user
        s3.create_bucket(Bucket=bucket)
    role = case["trainer"].get("role")
    if role:  # v3 reads the role's trust policy: an execution role SageMaker may assume
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
        iam = boto_session.client("iam")
        name = role.rsplit("/", 1)[-1]
        if name not in {existing["RoleName"] for existing in iam.list_roles()["Roles"]}:
            iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    trainer = ModelTrainer(sagemaker_session=Session(boto_session=boto_session), **trainer_arguments(case["trainer"], configs, distributed))
    trainer = with_builders(trainer, case.get("with"), configs)
    trainer.train(input_data_config=train_inputs(case, configs), wait=False, logs=False)
    return {"request": _CAPTURED[-1]}


def main() -> None:
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "SAGEMAKER_TELEMETRY_OPT_OUT": "true"})
    os.environ.pop("AWS_PROFILE", None)
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from moto import mock_aws

    with mock_aws():
        _record_requests()
        _quiet_telemetry()
        results = []
        for case in json.load(sys.stdin):
            try:
                results.append(_capture(case))
            except Exception as exc:  # noqa: BLE001 - the oracle's own rejections are results too
                results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="v3-oracle-home-") as home:
        os.environ["HOME"] = home  # no ~/.config/sagemaker defaults of this machine apply
        main()
