"""scripts/build-image.sh's ways to add packages: bad arguments are refused before anything is built."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import smddp_sdk

SCRIPT = Path(smddp_sdk.__file__).resolve().parent.parent / "scripts" / "build-image.sh"


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False)


def test_help_documents_the_extra_package_options():
    out = build("--help").stdout
    assert "--extra-requirements FILE" in out and "--extra-wheels DIR" in out
    assert "container/image-requirements.txt" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--extra-requirements", "no-such-file.txt"), "--extra-requirements no-such-file.txt is not a file"),
        (("--extra-wheels", "no-such-dir"), "--extra-wheels no-such-dir is not a directory"),
    ],
)
def test_missing_extra_sources_are_usage_errors(args, message):
    result = build(*args)
    assert result.returncode == 2 and message in result.stderr


def test_a_wheel_folder_without_wheels_is_refused(tmp_path):
    result = build("--extra-wheels", str(tmp_path))
    assert result.returncode == 2 and "holds no .whl file" in result.stderr


def test_every_image_requirement_is_a_plain_requirement_line():
    lines = [line.split("#")[0].strip() for line in (SCRIPT.parent.parent / "container" / "image-requirements.txt").read_text().splitlines()]
    names = [line for line in lines if line]
    assert "packaging" in names and all(not name.startswith("-") for name in names)
