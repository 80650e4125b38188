"""Import rules: `import smddp_sdk` stays cheap, and each layer imports only what it may."""

import subprocess
import sys

import pytest

# layer -> modules it must never import (see DESIGN.md, "Import direction")
FORBIDDEN = {
    "smddp_sdk": ("torch", "boto3", "botocore", "docker", "click", "yaml"),
    "smddp_sdk.specs.contract": ("torch", "boto3", "botocore", "click", "yaml"),
    "smddp_sdk.specs.job": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
    "smddp_sdk.schedulers": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
    # only client.py imports boto3; the request builder and the scheduler's dryrun must work without it
    "smddp_sdk.schedulers.sagemaker.request": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
    "smddp_sdk.schedulers.sagemaker": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
    "smddp_sdk.runtime.__main__": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
    "smddp_sdk.runtime.bootstrap": ("torch", "boto3", "botocore", "click", "yaml", "docker"),
}


def _import_with_blocked(module: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        f"import {module}\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("module", "blocked"), sorted(FORBIDDEN.items()))
def test_layer_imports_without_forbidden_modules(module, blocked):
    result = _import_with_blocked(module, blocked)
    assert result.returncode == 0, result.stderr


def test_package_import_pulls_in_nothing_heavy():
    code = "import sys, smddp_sdk; print(' '.join(sorted(m for m in ('torch','boto3','botocore','docker') if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
