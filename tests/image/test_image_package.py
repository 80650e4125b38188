"""The image build ships with the package: its files equal the checkout's, and its context builds a wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from smddp_sdk import image
from smddp_sdk.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
COPIES = {"Dockerfile": "Dockerfile", "train": "container/train", "build-image.sh": "scripts/build-image.sh", "dockerignore": ".dockerignore", "image-requirements.txt": "container/image-requirements.txt"}


@pytest.mark.parametrize(("shipped", "original"), COPIES.items())
def test_shipped_files_equal_the_checkouts(shipped: str, original: str) -> None:
    assert (image.HERE / shipped).read_bytes() == (ROOT / original).read_bytes(), f"copy {original} to smddp_sdk/image/{shipped}"


@pytest.mark.parametrize("path", ["scripts/build-image.sh", "container/train", "smddp_sdk/image/build-image.sh", "smddp_sdk/image/train"])
def test_scripts_are_executable_in_git(path: str) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    mode = subprocess.run(["git", "ls-files", "-s", path], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()[0]
    assert mode == "100755", f"git update-index --chmod=+x {path}"


def test_the_context_of_an_installed_package_builds_a_wheel_with_the_image_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["image", "context", str(tmp_path / "ctx")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    context = Path(result.stdout.strip())
    assert {p.name for p in context.iterdir()} >= {"Dockerfile", ".dockerignore", "container", "scripts", "smddp_sdk", "pyproject.toml"}
    assert os.access(context / "scripts" / "build-image.sh", os.X_OK) and os.access(context / "container" / "train", os.X_OK)
    assert (context / "container" / "image-requirements.txt").is_file()
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "out"), "."],
                          cwd=context, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "out").glob("smddp_sdk-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"smddp_sdk/image/{name}" for name in COPIES} <= set(names)
    assert "smddp_sdk/_compat/smdistributed/__init__.py" in names


def test_build_without_an_engine_is_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("docker") is None or shutil.which("bash") is None:
        pytest.skip("needs the docker CLI and bash")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    result = subprocess.run([sys.executable, "-m", "smddp_sdk.cli", "image", "build", "--quiet"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 3, result.stderr
    assert "no Docker engine answers" in result.stderr
