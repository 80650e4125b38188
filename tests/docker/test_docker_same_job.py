"""The same job file on the docker scheduler and in local mode: the same model archive (files and
trained weights), as tests/slurm checks for Slurm. Needs the engine and the image (``-m docker``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import assert_same_archives, run_same_job

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]


def test_the_same_job_file_gives_the_same_model_archive_as_local_mode(tmp_path: Path, smddp_image: str) -> None:
    local = run_same_job("local", tmp_path / "local")
    docker = run_same_job("docker", tmp_path / "docker", "-o", f"image={smddp_image}")
    assert_same_archives(local, docker)
