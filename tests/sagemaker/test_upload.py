"""sourcedir.tar.gz is built as v2 builds it, and a big one gets a warning naming its largest files."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from smddp_sdk.schedulers.sagemaker import upload
from smddp_sdk.specs.job import JobSpec


def test_source_dir_contents_sit_at_the_root_with_dependencies_beside(make_spec, code_dir: Path, tmp_path: Path) -> None:
    dep = tmp_path / "dep_lib"
    dep.mkdir()
    (dep / "dep.py").write_text("Y = 2\n")
    outside = tmp_path / "shared.py"
    outside.write_text("SHARED = 1\n")
    os.symlink(outside, code_dir / "linked.py")  # followed, as v2 does (dereference)
    spec = make_spec(dependencies=[str(dep)])
    scratch = tmp_path / "out"
    scratch.mkdir()
    tarball = upload.build_sourcedir(spec, scratch)
    with tarfile.open(tarball.path) as archive:
        names = set(archive.getnames())
        linked = archive.getmember("linked.py")
        assert linked.isfile() and archive.extractfile(linked).read() == b"SHARED = 1\n"
    assert names == {"linked.py", "requirements.txt", "train.py", "utils", "utils/helpers.py", "dep_lib", "dep_lib/dep.py"}
    assert tarball.size == tarball.path.stat().st_size


def test_without_source_dir_only_the_entry_point_is_packed(tmp_path: Path) -> None:
    script = tmp_path / "solo.py"
    script.write_text("print(1)\n")
    (tmp_path / "big.bin").write_bytes(b"0" * 1000)  # a neighbour that must stay out
    spec = JobSpec.from_mapping({"entry_point": str(script), "instance_type": "ml.c5.xlarge"})
    tarball = upload.build_sourcedir(spec, tmp_path)
    assert tarball.members == ("solo.py",)


def test_big_tarball_warning_names_the_largest_files(make_spec, code_dir: Path, tmp_path: Path) -> None:
    (code_dir / "data").mkdir()
    (code_dir / "data" / "weights.bin").write_bytes(os.urandom(300_000))
    (code_dir / "data" / "small.bin").write_bytes(os.urandom(20_000))
    tarball = upload.build_sourcedir(make_spec(), tmp_path)
    assert upload.big_tarball_warning(tarball) is None  # under the default limit
    warning = upload.big_tarball_warning(tarball, limit=100_000)
    assert warning is not None
    lines = warning.splitlines()
    assert "sourcedir.tar.gz is 0.3 MB" in lines[0]
    assert lines[1].strip().endswith("data/weights.bin") and lines[2].strip().endswith("data/small.bin")
    assert "input channel" in lines[-1]


def test_progress_reports_in_steps() -> None:
    seen: list[str] = []
    progress = upload.Progress(1000, "uploading", seen.append)
    for _ in range(10):
        progress(100)
    progress.done()
    assert seen[0] == "uploading"
    assert [line.split("%")[0].strip() for line in seen[1:]] == ["10", "20", "30", "40", "50", "60", "70", "80", "90", "100"]
