"""Capture the CreateTrainingJob requests SageMaker SDK v2 builds (the parity test's oracle).

Runs inside the oracle virtualenv (scripts/setup-sagemaker-oracle.sh), never inside the project's own
environment: it imports ``sagemaker<3``. Reads a JSON list of cases on stdin, each
``{"region", "estimator": {...PyTorch kwargs...}, "inputs": {...channels...} | null, "job_name", "buckets"}``,
where a channel is a URI string or a mapping of ``sagemaker.inputs.TrainingInput`` arguments, or
``{"image": {...get_training_image_uri kwargs...}}``. Writes a JSON list of ``{"request": <CreateTrainingJob
params>}``, ``{"image": <uri>}`` or ``{"error": "<exception>"}`` on stdout.

AWS is replaced by moto; v2's telemetry call is replaced by a no-op.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def _disable_telemetry() -> None:
    """v2 phones home after each call; the oracle must not (and the machine has no network)."""
    from sagemaker.telemetry import telemetry_logging

    telemetry_logging._send_telemetry_request = lambda *args, **kwargs: None


_SESSIONS: dict = {}
_CAPTURED: list = []


def _session(region: str):
    """One v2 Session per region: building boto3 clients loads large service models each time."""
    if region not in _SESSIONS:
        import boto3
        from sagemaker.session import Session

        session = Session(boto_session=boto3.Session(region_name=region))
        session.sagemaker_client.meta.events.register(
            "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: _CAPTURED.append(params)
        )
        _SESSIONS[region] = session
    return _SESSIONS[region]


def _cache_endpoint_data() -> None:
    """v2 reloads botocore's endpoint data on every image lookup (a third of a second); same answer, cached."""
    import functools

    from sagemaker import utils

    utils._botocore_resolver = functools.cache(utils._botocore_resolver)


def _image(case: dict) -> dict:
    from sagemaker import image_uris

    return {"image": image_uris.get_training_image_uri(framework="pytorch", **case["image"])}


def _capture(case: dict) -> dict:
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch

    session = _session(case["region"])
    s3 = session.boto_session.client("s3", region_name="us-east-1")
    for bucket in case.get("buckets", ()):  # buckets the arguments name exist, as they would for a user
        s3.create_bucket(Bucket=bucket)
    estimator = PyTorch(sagemaker_session=session, **case["estimator"])
    inputs = case.get("inputs")
    if isinstance(inputs, dict):
        inputs = {name: TrainingInput(**spec) if isinstance(spec, dict) else spec for name, spec in inputs.items()}
    estimator.fit(inputs, wait=False, logs=False, job_name=case.get("job_name"))
    return {"request": _CAPTURED[-1]}


def main() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.pop("AWS_PROFILE", None)
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from moto import mock_aws

    _disable_telemetry()
    _cache_endpoint_data()
    results = []
    with mock_aws():
        for case in json.load(sys.stdin):
            try:
                results.append(_image(case) if "image" in case else _capture(case))
            except Exception as exc:  # noqa: BLE001 - the oracle's own rejections are results too
                results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="v2-oracle-home-") as home:
        os.environ["HOME"] = home  # no ~/.config/sagemaker defaults of this machine apply
        main()
