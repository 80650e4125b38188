"""The new modules keep the import rules: schedulers never import torch or boto3 at import time (boto3
only when an s3:// location is used), specs stay stdlib-only."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = ("torch", "boto3", "botocore", "click", "yaml", "docker")


@pytest.mark.parametrize("module", ["smddp_sdk.schedulers.channels", "smddp_sdk.schedulers.hosttree.checkpoints",
                                    "smddp_sdk.schedulers.hosttree.fidelity", "smddp_sdk.schedulers.stores",
                                    "smddp_sdk.specs.smddp_support", "smddp_sdk.schedulers.sagemaker.validation"])
def test_imports_without_heavy_modules(module: str) -> None:
    code = f"import sys\nfor name in {BLOCKED!r}: sys.modules[name] = None\nimport {module}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
