"""source_dir trees made to break the code snapshot: links out of the tree, dangling links, link loops and
FIFOs are refused, every one named, before anything is copied (exit 2); links inside stay links."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smddp_sdk.errors import SpecError
from smddp_sdk.schedulers.job_files import stage_code
from smddp_sdk.specs.job import JobSpec


def _spec(source: Path) -> JobSpec:
    return JobSpec.from_mapping({"entry_point": "train.py", "source_dir": str(source), "instance_type": "local"})


def _hostile_tree(root: Path) -> Path:
    source = root / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text("print('hi')\n")
    (source / "passwd").symlink_to("/etc/passwd")
    (source / "pkg" / "up").symlink_to("../../outside")
    (source / "dangling").symlink_to("missing")
    (source / "loop").symlink_to("loop")
    os.mkfifo(source / "pipe")
    return source


def test_every_unsafe_entry_of_a_code_tree_is_named_before_anything_is_copied(tmp_path: Path) -> None:
    source = _hostile_tree(tmp_path)
    (tmp_path / "outside").write_text("a file of the machine")
    with pytest.raises(SpecError) as raised:
        stage_code(_spec(source), tmp_path / "code")
    message = str(raised.value)
    assert "5 problems" in message, message
    for name in ("passwd", "pkg/up", "dangling", "loop", "pipe"):
        assert str(source / name) in message, message
    assert list((tmp_path / "code").iterdir()) == []


def test_links_inside_the_tree_are_kept_as_links(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "data").mkdir(parents=True)
    (source / "train.py").write_text("print('hi')\n")
    (source / "data" / "real.txt").write_text("x")
    (source / "alias.txt").symlink_to("data/real.txt")
    (source / "linked").symlink_to("data")
    code = stage_code(_spec(source), tmp_path / "code")
    assert os.readlink(code / "alias.txt") == "data/real.txt" and (code / "alias.txt").read_text() == "x"
    assert os.readlink(code / "linked") == "data"


def test_the_cli_exits_2_with_one_line_per_problem_and_no_traceback(tmp_path: Path) -> None:
    source = _hostile_tree(tmp_path)
    (tmp_path / "job.yaml").write_text(f"entry_point: train.py\nsource_dir: {source}\ninstance_type: local\n")
    result = subprocess.run(
        [sys.executable, "-m", "smddp_sdk.cli", "run", "job.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "SMDDP_JOB_ROOT": str(tmp_path / "jobs")},
        timeout=120,
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and "dangling or looping link" in result.stderr, result.stderr
