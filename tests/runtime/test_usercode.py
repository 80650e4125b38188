"""Fetching the user's code safely, entry-point kinds and the commands built for them."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from smddp_sdk.errors import ContractError
from smddp_sdk.runtime.usercode import (
    EntryPointKind,
    check_entry_point,
    entry_point_kind,
    fetch_code,
    safe_extract,
    user_command,
)


def make_tar(path: Path, members: list[tarfile.TarInfo], payload: bytes = b"print('hi')\n") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            if member.isfile():
                member.size = len(payload)
                tar.addfile(member, io.BytesIO(payload))
            else:
                tar.addfile(member)
    return path


def file_member(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def link_member(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, target
    return member


def test_a_clean_tarball_is_extracted(tmp_path):
    archive = make_tar(tmp_path / "src.tar.gz", [file_member("train.py"), file_member("pkg/mod.py"), link_member("alias.py", "train.py")])
    fetch_code(str(archive), tmp_path / "code")
    assert (tmp_path / "code/train.py").read_text() == "print('hi')\n"
    assert (tmp_path / "code/pkg/mod.py").exists() and (tmp_path / "code/alias.py").is_symlink()


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (file_member("/etc/evil.py"), "absolute path"),
        (file_member("../evil.py"), "'..'"),
        (file_member("pkg/../../evil.py"), "'..'"),
        (link_member("escape", "/etc/passwd"), "absolute path"),
        (link_member("pkg/escape", "../../outside"), "points outside the directory"),
        (link_member("hard", "../outside", tarfile.LNKTYPE), "contains '..'"),
    ],
)
def test_unsafe_members_are_refused_before_anything_is_written(tmp_path, member, reason):
    archive = make_tar(tmp_path / "bad.tar.gz", [file_member("train.py"), member])
    with pytest.raises(ContractError) as caught:
        safe_extract(archive, tmp_path / "code")
    assert reason in str(caught.value) and member.name in str(caught.value)
    assert not (tmp_path / "code/train.py").exists()
    assert not (tmp_path / "evil.py").exists()


def test_device_members_are_refused(tmp_path):
    device = tarfile.TarInfo("dev")
    device.type = tarfile.CHRTYPE
    archive = make_tar(tmp_path / "bad.tar.gz", [device])
    with pytest.raises(ContractError, match="special members"):
        safe_extract(archive, tmp_path / "code")


def test_directory_and_file_uri_are_copied(tmp_path):
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "train.py").write_text("x = 1\n")
    (source / "sub/helper.py").write_text("y = 2\n")
    assert fetch_code(f"file://{source}", tmp_path / "code")
    assert (tmp_path / "code/sub/helper.py").read_text() == "y = 2\n"


def test_a_non_empty_code_dir_is_left_as_it_is(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("mine\n")
    assert not fetch_code(str(tmp_path / "does-not-matter"), code)
    assert (code / "train.py").read_text() == "mine\n"


def test_missing_source_and_unknown_scheme_are_contract_errors(tmp_path):
    with pytest.raises(ContractError, match="does not exist"):
        fetch_code(str(tmp_path / "nope"), tmp_path / "code")
    with pytest.raises(ContractError, match="scheme 'http'"):
        fetch_code("http://example.com/src.tar.gz", tmp_path / "code2")


def test_entry_point_kinds_follow_the_toolkit(tmp_path):
    assert entry_point_kind("train.sh", tmp_path) is EntryPointKind.COMMAND
    assert entry_point_kind("train.py", tmp_path) is EntryPointKind.PYTHON_PROGRAM
    assert entry_point_kind("train", tmp_path) is EntryPointKind.COMMAND
    (tmp_path / "setup.py").write_text("")
    assert entry_point_kind("train.py", tmp_path) is EntryPointKind.PYTHON_PACKAGE
    assert entry_point_kind("train.sh", tmp_path) is EntryPointKind.COMMAND


def test_unknown_entry_point_suggests_the_closest_file(tmp_path):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ContractError) as caught:
        check_entry_point("trian.py", tmp_path, EntryPointKind.PYTHON_PROGRAM)
    assert "did you mean 'train.py'?" in str(caught.value) and "sagemaker_program" in str(caught.value)


def test_commands_never_go_through_a_shell_string(tmp_path):
    args = ["-x", "a b; echo INJECTED"]
    program = user_command("train.py", EntryPointKind.PYTHON_PROGRAM, tmp_path, args)
    assert program.argv == (sys.executable, "-m", "smddp_sdk.runtime.bootstrap", "train.py", *args)
    package = user_command("train.py", EntryPointKind.PYTHON_PACKAGE, tmp_path, args)
    assert package.argv[3:5] == ("--module", "train")
    (tmp_path / "run.sh").write_text("echo $1\n")
    (tmp_path / "run2.sh").write_text("#!/bin/bash\necho $1\n")
    assert user_command("run.sh", EntryPointKind.COMMAND, tmp_path, args).argv == ("/bin/sh", "run.sh", *args)
    assert user_command("run2.sh", EntryPointKind.COMMAND, tmp_path, args).argv == ("./run2.sh", *args)
    assert (tmp_path / "run2.sh").stat().st_mode & 0o100
