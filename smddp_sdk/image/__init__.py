"""The training image's build, shipped with the package so that Docker mode works from an installed wheel.

The files beside this module are copies of the checkout's ``Dockerfile``, ``container/train``,
``container/image-requirements.txt``, ``.dockerignore`` and ``scripts/build-image.sh`` (a test keeps them
identical). ``build(args)`` runs the checkout's script when smddp-sdk runs from a source checkout; from
an installed package it first writes a build context (the Dockerfile, the ``train`` shim, this package's
own source and a ``pyproject.toml`` from its installed metadata) and runs the shipped script there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from smddp_sdk import __version__
from smddp_sdk.errors import UnavailableError

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
SCRIPT = "build-image.sh"
# The files shipped beside this module -> where a checkout keeps them (a test keeps the copies identical).
SHIPPED = {"Dockerfile": "Dockerfile", "dockerignore": ".dockerignore", "train": "container/train", "image-requirements.txt": "container/image-requirements.txt", SCRIPT: f"scripts/{SCRIPT}"}


def checkout_root() -> Path | None:
    """The source checkout this package runs from, if any (it has the build script and pyproject.toml)."""
    root = PACKAGE.parent
    if (root / "scripts" / SCRIPT).is_file() and (root / "pyproject.toml").is_file() and (root / "Dockerfile").is_file():
        return root
    return None


def write_context(target: Path) -> Path:
    """A build context for the shipped script: what a checkout would give it, from the installed package."""
    for shipped, place in SHIPPED.items():
        (target / place).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / shipped, target / place)
    for path in (target / "container" / "train", target / "scripts" / SCRIPT):
        path.chmod(0o755)
    shutil.copytree(PACKAGE, target / "smddp_sdk", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (target / "pyproject.toml").write_text(_pyproject(), encoding="utf-8")
    return target


def _pyproject() -> str:
    """pyproject.toml for rebuilding this package's wheel: name, version and dependencies as installed."""
    try:
        requires = [r for r in (metadata.requires("smddp-sdk") or []) if "extra ==" not in r]
    except metadata.PackageNotFoundError:
        requires = ["click>=8.1", "pyyaml>=6.0"]
    dependencies = "".join(f'    "{r}",\n' for r in requires)
    return (
        '[build-system]\nrequires = ["setuptools>=68", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "smddp-sdk"\nversion = "{__version__}"\nrequires-python = ">=3.10"\ndependencies = [\n{dependencies}]\n\n'
        '[project.scripts]\nsmddp-launch = "smddp_sdk.cli.main:main"\n\n'
        '[tool.setuptools.packages.find]\ninclude = ["smddp_sdk*"]\n\n'
        '[tool.setuptools.package-data]\nsmddp_sdk = ["py.typed", "schedulers/sagemaker/*.json", "collectives/native/*.c", "collectives/native/core/*.cpp", "collectives/native/core/*.hpp", "collectives/native/*.so", "image/Dockerfile", "image/train", "image/build-image.sh", "image/dockerignore", "image/image-requirements.txt", "_compat/**/*"]\n'
    )


def build(args: Sequence[str]) -> int:
    """Run the build script with ``args``; returns its exit code (3 when Docker or bash is missing)."""
    bash = shutil.which("bash")
    if bash is None:
        raise UnavailableError("building the image needs bash; install it, or build on a Linux or macOS machine")
    if shutil.which("docker") is None:
        raise UnavailableError("building the image needs the docker CLI and a running engine: install Docker (https://docs.docker.com/engine/install/)")
    from smddp_sdk import progress

    root = checkout_root()
    if root is not None:
        return progress.run_with_steps([bash, str(root / "scripts" / SCRIPT), *args], "building the image")
    with tempfile.TemporaryDirectory(prefix="smddp-image-") as scratch:
        context = write_context(Path(scratch))
        env = {**os.environ, "SMDDP_BUILD_CONTEXT": str(context)}
        return progress.run_with_steps([bash, str(context / "scripts" / SCRIPT), *args], "building the image", env=env)


__all__ = ["build", "checkout_root", "write_context"]
