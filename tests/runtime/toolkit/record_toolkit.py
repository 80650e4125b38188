"""Record what AWS's sagemaker-training toolkit computes for the job in job.json (writes toolkit_output.json).

Not run by the tests (the toolkit is not a dependency). To re-record, as root on Linux:

    pip download --no-deps sagemaker-training==5.1.4 && tar xzf sagemaker_training-5.1.4.tar.gz
    PYTHONPATH=sagemaker_training-5.1.4/src:. python3 tests/runtime/toolkit/record_toolkit.py

(it needs boto3 and six). The job's tree is bound on a private /opt/ml (the runtime's own
``optml_mount``), so the toolkit reads and reports the literal /opt/ml paths it has on SageMaker.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_tree(base: Path, job: dict) -> None:
    config = base / "input" / "config"
    config.mkdir(parents=True)
    for name in ("resourceconfig.json", "hyperparameters.json", "inputdataconfig.json"):
        (config / name).write_text(json.dumps(job[name]))
    for channel in job["inputdataconfig.json"]:
        (base / "input" / "data" / channel).mkdir(parents=True)
    for sub in ("model", "output/data", "code"):
        (base / sub).mkdir(parents=True, exist_ok=True)


def main() -> int:
    from smddp_sdk.runtime.optml_mount import bind_host_tree

    job = json.loads((HERE / "job.json").read_text())
    with tempfile.TemporaryDirectory() as scratch:
        write_tree(Path(scratch), job)
        bind_host_tree(Path(scratch))
        os.environ.update(job["environment"])
        os.environ.pop("SAGEMAKER_BASE_DIR", None)
        from sagemaker_training import environment

        env = environment.Environment()
        record = {
            "toolkit": "sagemaker-training 5.1.4",
            "to_env_vars": env.to_env_vars(),
            "properties": json.loads(json.dumps(dict(env))),
            "to_cmd_args": env.to_cmd_args(),
        }
    (HERE / "toolkit_output.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
