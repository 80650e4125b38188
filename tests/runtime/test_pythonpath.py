"""Compat packages reach the ranks only where the real package is missing."""

from __future__ import annotations

import os
from pathlib import Path

from smddp_sdk.runtime.pythonpath import PACKAGE_ROOT, compat_entries, missing_packages, rank_python_path


def fake_compat(tmp_path: Path) -> Path:
    compat = tmp_path / "_compat"
    for name in ("smdistributed", "sagemaker_training"):
        (compat / name).mkdir(parents=True)
        (compat / name / "__init__.py").write_text(f"WHO = 'compat {name}'\n")
    return compat


def test_both_missing_puts_the_compat_folder_right_after_the_code_dir(tmp_path):
    compat = fake_compat(tmp_path)
    path = rank_python_path(tmp_path / "code", {"PYTHONPATH": "/inherited"}, compat_dir=compat, scratch=tmp_path)
    assert path[:2] == [str(tmp_path / "code"), str(compat)]
    assert path[-1] == "/inherited" and str(PACKAGE_ROOT) in path


def test_a_real_package_is_never_shadowed(tmp_path):
    compat = fake_compat(tmp_path)
    real = tmp_path / "site"
    (real / "smdistributed").mkdir(parents=True)
    (real / "smdistributed/__init__.py").write_text("WHO = 'real'\n")
    environ = {**os.environ, "PYTHONPATH": str(real)}
    assert missing_packages(["smdistributed", "sagemaker_training"], [str(real)], environ) == ["sagemaker_training"]
    path = rank_python_path(tmp_path / "code", environ, compat_dir=compat, scratch=tmp_path)
    shim = Path(path[1])
    assert shim != compat and sorted(p.name for p in shim.iterdir()) == ["sagemaker_training"]
    assert (shim / "sagemaker_training").resolve() == (compat / "sagemaker_training").resolve()


def test_nothing_is_added_without_a_compat_folder(tmp_path):
    path = rank_python_path(tmp_path / "code", {}, compat_dir=tmp_path / "absent")
    assert path[0] == str(tmp_path / "code") and str(tmp_path / "absent") not in path


def test_compat_entries_skip_packages_the_folder_lacks(tmp_path):
    compat = tmp_path / "_compat"
    compat.mkdir()
    assert compat_entries(compat, ["smdistributed"]) == []
