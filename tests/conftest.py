"""Suite-wide fixtures and settings."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Started with SIGINT ignored (a script's background job: ``cmd &``, nohup, some CI runners), pytest
    would pass that on to every process a test starts, and the Ctrl-C tests send their SIGINT to a
    launcher that ignores it: it follows its job to the end, past the test's limit. A handler that does
    nothing keeps pytest deaf to SIGINT as it was started, and exec resets a handler to the default, so
    the launchers the tests start take SIGINT as a terminal's foreground process does."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _still_ignored)


def _still_ignored(_signum: int, _frame: object) -> None:
    pass


@pytest.fixture(autouse=True)
def _private_job_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs and the job index of a test never land in the user's ~/.smddp (tests that set their own keep it)."""
    if not os.environ.get("SMDDP_JOB_ROOT"):
        root: Path = tmp_path_factory.mktemp("job-root")
        monkeypatch.setenv("SMDDP_JOB_ROOT", str(root))
