"""Import rules: the CLI never imports torch or the collectives; config never imports click."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = {
    "smddp_sdk.cli.main": ("torch", "smddp_sdk.collectives", "boto3", "botocore", "docker"),
    "smddp_sdk.config.job_file": ("click", "torch", "boto3"),
    "smddp_sdk.config.schema": ("click", "torch", "boto3"),
    "smddp_sdk.config.docs": ("click", "torch", "boto3"),
}


@pytest.mark.parametrize(("module", "blocked"), sorted(CASES.items()))
def test_module_imports_without_forbidden_modules(module: str, blocked: tuple[str, ...]):
    code = f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\nimport {module}\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_running_a_command_loads_no_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom smddp_sdk.cli.main import cli\n"
            "CliRunner().invoke(cli, ['schema'])\nCliRunner().invoke(cli, ['env'])\n"
            "print(sorted(m for m in ('torch', 'smddp_sdk.collectives', 'boto3') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
