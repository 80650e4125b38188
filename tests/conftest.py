"""Suite-wide fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_job_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs and the job index of a test never land in the user's ~/.smddp (tests that set their own keep it)."""
    if not os.environ.get("SMDDP_JOB_ROOT"):
        root: Path = tmp_path_factory.mktemp("job-root")
        monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
