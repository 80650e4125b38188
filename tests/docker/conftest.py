"""A real Docker engine and the real image for the docker-marked tests.

The engine: one that already answers (DOCKER_HOST or the default socket), else a private one started
with scripts/docker-engine.sh when running as root (and stopped afterwards); otherwise the tests skip
and say why. The image: built from this checkout with scripts/build-image.sh (seconds when cached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import smddp_sdk
from smddp_sdk.schedulers.docker import DEFAULT_IMAGE, LABEL_JOB

REPO = Path(smddp_sdk.__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0


def engine_script(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPTS / "docker-engine.sh"), command], capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    if engine_answers():
        yield
        return
    if engine_script("status").returncode == 0:
        # A private engine started earlier (by the script, outside this session): use it, leave it running.
        exports = [line for line in engine_script("start").stdout.splitlines() if line.startswith("export DOCKER_HOST=")]
        if exports:
            os.environ["DOCKER_HOST"] = exports[-1].split("=", 1)[1]
            yield
            return
    if os.geteuid() != 0:
        pytest.skip("no Docker engine answers and starting one needs root: run scripts/docker-engine.sh start as root, or start Docker")
    started = engine_script("start")
    exports = [line for line in started.stdout.splitlines() if line.startswith("export DOCKER_HOST=")]
    if started.returncode != 0 or not exports:
        pytest.skip(f"could not start a Docker engine: {started.stderr.strip()[-500:]}")
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = exports[-1].split("=", 1)[1]
    try:
        yield
    finally:
        engine_script("stop")
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous


@pytest.fixture(scope="session")
def smddp_image(docker_engine: None) -> str:
    for part in ("runtime", "collectives"):
        if not (REPO / "smddp_sdk" / part / "__init__.py").is_file():
            pytest.skip(f"this checkout has no smddp_sdk/{part} to put in the image")
    if os.environ.get("SMDDP_TEST_IMAGE_BUILT") == DEFAULT_IMAGE:
        return DEFAULT_IMAGE  # scripts/test.sh built it from this checkout moments ago
    build = subprocess.run(["bash", str(SCRIPTS / "build-image.sh"), "--quiet"], capture_output=True, text=True, check=False, timeout=900)
    assert build.returncode == 0, f"image build failed:\n{build.stderr[-3000:]}"
    assert build.stdout.strip().splitlines()[-1] == DEFAULT_IMAGE
    return DEFAULT_IMAGE


def leftovers(job_name: str) -> tuple[list[str], list[str]]:
    """Containers and networks a job left behind (both should be empty after it)."""
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_JOB}={job_name}"], capture_output=True, text=True, check=True).stdout.split()
    networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label={LABEL_JOB}={job_name}"], capture_output=True, text=True, check=True).stdout.split()
    return containers, networks
