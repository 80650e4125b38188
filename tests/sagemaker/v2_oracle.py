"""Capture the CreateTrainingJob requests SageMaker SDK v2 builds (the parity test's oracle).

Runs inside the oracle virtualenv (scripts/setup-sagemaker-oracle.sh), never inside the project's own
environment: it imports ``sagemaker<3``. Reads a JSON list of cases on stdin, each
``{"region", "estimator": {...PyTorch kwargs...}, "inputs": {...channels...} | null}``, where a channel
is a URI string or a mapping of ``sagemaker.inputs.TrainingInput`` arguments. Writes a JSON list of
``{"request": <CreateTrainingJob params>}`` or ``{"error": "<exception>"}`` on stdout.

AWS is replaced by moto; v2's telemetry is switched off through its own config file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def _disable_telemetry() -> None:
    config = os.path.join(tempfile.mkdtemp(prefix="v2-oracle-"), "config.yaml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = config
    os.environ["SAGEMAKER_ADMIN_CONFIG_OVERRIDE"] = config


def _capture(case: dict, captured: list) -> dict:
    import boto3
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch
    from sagemaker.session import Session

    boto_session = boto3.Session(region_name=case["region"])
    session = Session(boto_session=boto_session)
    session.sagemaker_client.meta.events.register(
        "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: captured.append(params)
    )
    estimator = PyTorch(sagemaker_session=session, **case["estimator"])
    inputs = case.get("inputs")
    if isinstance(inputs, dict):
        inputs = {name: TrainingInput(**spec) if isinstance(spec, dict) else spec for name, spec in inputs.items()}
    estimator.fit(inputs, wait=False, logs=False)
    return {"request": captured[-1]}


def main() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.pop("AWS_PROFILE", None)
    _disable_telemetry()
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from moto import mock_aws

    results = []
    for case in json.load(sys.stdin):
        with mock_aws():
            try:
                results.append(_capture(case, []))
            except Exception as exc:  # the oracle's own rejections are results too
                results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    main()
