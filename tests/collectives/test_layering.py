"""The collectives layer imports torch and nothing else heavy; registration happens at import."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")
from tests.collectives.cluster import PROJECT_ROOT  # noqa: E402

BLOCKED = ("boto3", "botocore", "docker", "click", "yaml", "numpy")


def test_collectives_import_needs_only_torch_and_registers_smddp():
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
        "import torch.distributed as dist\n"
        "assert 'smddp' not in dist.Backend.backend_list\n"
        "import smddp_sdk.collectives\n"
        "print(dist.Backend.SMDDP, 'smddp' in dist.Backend.backend_list)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["smddp", "True"]
