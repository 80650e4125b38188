"""Hostile code tarballs and model directories: nothing is written or read outside the tree.

The corpus is built here from TarInfo records (as an attacker would), each archive with a decoy file
beside it; a refused archive must leave the code directory empty and the decoy's directory unchanged.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from smddp_sdk.errors import ContractError
from smddp_sdk.specs import archives
from smddp_sdk.specs.archives import UnsafeArchiveError, safe_extract, write_archive

PAYLOAD = b"pwned\n"


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def build(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info in members:
            if info.isfile():
                info.size = len(PAYLOAD)
                tar.addfile(info, io.BytesIO(PAYLOAD))
            else:
                tar.addfile(info)
    return path


def d(name: str) -> tarfile.TarInfo:
    return member(name, tarfile.DIRTYPE, mode=0o755)


def sym(name: str, target: str) -> tarfile.TarInfo:
    return member(name, tarfile.SYMTYPE, target)


def hard(name: str, target: str) -> tarfile.TarInfo:
    return member(name, tarfile.LNKTYPE, target)


def cve_2025_4517() -> list[tarfile.TarInfo]:
    """The published pattern: directories with long names, each reached through a one-letter symlink, so
    the resolved path of the chain exceeds PATH_MAX and realpath() stops resolving; then a link through
    the chain that climbs out, and a file written through that link."""
    component = "d" * 247
    steps = "abcdefghijklmnop"
    members, path = [], ""
    for step in steps:
        members += [d(os.path.join(path, component)), sym(os.path.join(path, step), component)]
        path = os.path.join(path, component)
    long_link = os.path.join(*steps, "l" * 254)
    members.append(sym(long_link, os.path.join(*[".."] * len(steps))))
    members.append(sym("escape", long_link + "/../.."))
    members.append(member("escape/outside.txt"))
    return members


CORPUS: dict[str, tuple[Callable[[], list[tarfile.TarInfo]], str]] = {
    "absolute name": (lambda: [member("/tmp/smddp-hostile-absolute.txt")], "absolute path"),
    "dot-dot name": (lambda: [member("../outside.txt")], "contains '..'"),
    "dot-dot inside name": (lambda: [member("pkg/../../outside.txt")], "contains '..'"),
    "windows drive": (lambda: [member("C:/outside.txt")], "absolute path"),
    "symlink absolute": (lambda: [sym("etc", "/etc")], "absolute path"),
    "symlink dot-dot": (lambda: [sym("pkg/up", "../../outside")], "points outside"),
    "symlink then write through it": (lambda: [d("sub"), sym("link", "sub"), member("link/x.py")], "beneath the symlink 'link'"),
    "symlink out then write through it": (lambda: [sym("evil", ".."), member("evil/outside.txt")], "points outside"),
    "chained links climb out": (lambda: [d("a"), sym("a/up", ".."), sym("a/out", "up/..")], "points outside"),
    "link through link to absolute": (lambda: [sym("abs", "/tmp"), sym("via", "abs/x")], "absolute path"),
    "symlink loop": (lambda: [sym("x", "y"), sym("y", "x")], "more than 40 symlinks"),
    "CVE-2025-4517 PATH_MAX chain": (cve_2025_4517, "beneath the symlink"),
    "hard link absolute": (lambda: [hard("passwd", "/etc/passwd")], "hard link to absolute path"),
    "hard link dot-dot": (lambda: [hard("h", "../outside.txt")], "contains '..'"),
    "hard link to a missing file": (lambda: [hard("h", "nothere")], "does not name a regular file"),
    "hard link to a symlink": (lambda: [sym("s", "/etc/passwd"), hard("h", "s")], "does not name a regular file"),
    "hard link before its target": (lambda: [hard("h", "later.py"), member("later.py")], "regular file earlier in the archive"),
    "character device": (lambda: [member("tty", tarfile.CHRTYPE)], "special members"),
    "block device": (lambda: [member("disk", tarfile.BLKTYPE)], "special members"),
    "fifo": (lambda: [member("pipe", tarfile.FIFOTYPE)], "special members"),
    "name twice (file, then link)": (lambda: [member("train.py"), sym("train.py", "/etc/passwd")], "appears twice"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_hostile_tarball_is_refused_and_writes_nothing(tmp_path: Path, case: str) -> None:
    make, reason = CORPUS[case]
    job = tmp_path / "job"
    job.mkdir()
    archive = build(tmp_path / "sourcedir.tar.gz", [member("train.py"), *make()])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UnsafeArchiveError) as caught:
        safe_extract(archive, job / "code")
    assert reason in str(caught.value)
    assert list((job / "code").iterdir()) == []  # nothing at all is written when one member is unsafe
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not Path("/tmp/smddp-hostile-absolute.txt").exists()


def test_python_data_filter_alone_lets_the_cve_chain_out_on_this_python(tmp_path: Path) -> None:
    """Why the archive checks do not rely on the stdlib filter: on an unpatched Python the PATH_MAX chain
    passes the ``data`` filter and writes beside the destination. Patched Pythons refuse it (then skip)."""
    archive = build(tmp_path / "cve.tar.gz", cve_2025_4517())
    dest = tmp_path / "a" / "code"
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError):
        pytest.skip("this Python's data filter refuses the CVE-2025-4517 chain (patched)")
    escaped = (tmp_path / "a" / "outside.txt").exists() or (tmp_path / "outside.txt").exists()
    if not escaped:
        pytest.skip("the chain did not escape on this file system")
    assert escaped


def test_a_friendly_archive_extracts_with_links_and_safe_modes(tmp_path: Path) -> None:
    members = [
        d("pkg"),
        member("pkg/mod.py", mode=0o4777),
        member("run.sh", mode=0o755),
        sym("alias.py", "pkg/mod.py"),
        sym("pkg/self", "."),
        hard("copy.py", "pkg/mod.py"),
        member("./top.py"),
    ]
    archive = build(tmp_path / "ok.tar.gz", members)
    code = tmp_path / "code"
    safe_extract(archive, code)
    assert (code / "alias.py").read_bytes() == PAYLOAD and (code / "alias.py").is_symlink()
    assert (code / "copy.py").read_bytes() == PAYLOAD and not (code / "copy.py").is_symlink()
    assert (code / "top.py").is_file()
    assert oct((code / "pkg/mod.py").stat().st_mode & 0o7777) == oct(0o755)  # setuid and o+w dropped
    assert os.access(code / "run.sh", os.X_OK)


def test_extraction_needs_an_empty_directory(tmp_path: Path) -> None:
    archive = build(tmp_path / "ok.tar.gz", [member("a.py")])
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").symlink_to("/etc/passwd")
    with pytest.raises(ContractError, match="not empty"):
        safe_extract(archive, tmp_path / "code")


def test_member_and_size_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = build(tmp_path / "many.tar.gz", [member(f"f{i}") for i in range(50)])
    monkeypatch.setattr(archives, "MAX_MEMBERS", 10)
    with pytest.raises(UnsafeArchiveError, match="more than 10 members"):
        safe_extract(archive, tmp_path / "code")
    monkeypatch.setattr(archives, "MAX_MEMBERS", 1000)
    monkeypatch.setattr(archives, "MAX_EXTRACTED_BYTES", 100)
    with pytest.raises(UnsafeArchiveError, match="the limit is 100"):
        safe_extract(archive, tmp_path / "code2")


def test_not_a_tarball_is_a_contract_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(ContractError, match="damaged or truncated archive"):
        safe_extract(bad, tmp_path / "code")


def test_runtime_refuses_the_cve_tarball_and_writes_nothing_outside(tmp_path: Path) -> None:
    """End to end: the runtime fetches a hostile sourcedir.tar.gz, exits 2 and names the member."""
    from smddp_sdk.specs import contract

    archive = build(tmp_path / "sourcedir.tar.gz", [member("train.py"), *cve_2025_4517()])
    opt_ml = contract.OptMl(tmp_path / "host")
    contract.write_config_files(
        opt_ml,
        resource=contract.resource_config("algo-1", ["algo-1"], "ml.c5.xlarge"),
        hyperparameters=contract.encode_hyperparameters({"sagemaker_program": "train.py", "sagemaker_submit_directory": f"file://{archive}"}),
        input_data={},
    )
    base = opt_ml.base
    env = {**os.environ, contract.BASE_DIR_ENV: str(base), contract.HOST_ADDRESSES_ENV: '{"algo-1": "127.0.0.1"}', "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "smddp_sdk.runtime"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusing to extract member" in done.stdout + done.stderr
    assert not any(p.name == "outside.txt" for p in tmp_path.rglob("outside.txt"))


# --- archiving model directories --------------------------------------------------------------------


def test_model_archive_leaves_out_links_that_leave_the_tree(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "weights.bin").write_bytes(b"w" * 10)
    (model / "sub" / "inside.txt").write_text("in\n")
    (model / "leak.txt").symlink_to(secret)
    (model / "abs").symlink_to("/etc/hostname")
    (model / "rootdir").symlink_to("/")
    (model / "alias.txt").symlink_to("sub/inside.txt")
    (model / "dangling").symlink_to("nowhere")
    os.mkfifo(model / "pipe")  # reading it would block the artifact collection forever
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(model / "sock"))
        notes: list[str] = []
        skipped = write_archive(tmp_path / "model.tar.gz", [model], on_skip=notes.append)
    assert skipped == notes
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert set(names) == {"weights.bin", "sub/inside.txt", "alias.txt"}
        assert all(m.isfile() for m in names.values())
        assert tar.extractfile("alias.txt").read() == b"in\n"
        data = b"".join(tar.extractfile(m).read() for m in names.values())
    assert b"host secret" not in data
    for name in ("leak.txt", "abs", "rootdir", "dangling", "pipe", "sock"):
        assert any(line.startswith(name + ":") for line in skipped), (name, skipped)


def test_model_archive_merges_hosts_last_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "h1", tmp_path / "h2"
    first.mkdir()
    second.mkdir()
    (first / "a.txt").write_text("one")
    (second / "a.txt").write_text("two")
    (first / "only1").write_text("1")
    write_archive(tmp_path / "out.tar.gz", [first, second, tmp_path / "missing"])
    with tarfile.open(tmp_path / "out.tar.gz") as tar:
        assert tar.extractfile("a.txt").read() == b"two"
        assert sorted(tar.getnames()) == ["a.txt", "only1"]
    assert not (tmp_path / "out.tar.gz.partial").exists()


# --- reading what a job wrote ------------------------------------------------------------------------


def test_failure_file_is_read_without_following_links(tmp_path: Path) -> None:
    from smddp_sdk.specs import contract

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    opt_ml = contract.OptMl(tmp_path / "host")
    opt_ml.output_dir.mkdir(parents=True)
    opt_ml.failure_file.symlink_to(secret)
    assert contract.read_failure(opt_ml) is None
    opt_ml.failure_file.unlink()
    os.mkfifo(opt_ml.failure_file)  # would block a plain read forever
    assert contract.read_failure(opt_ml) is None
    opt_ml.failure_file.unlink()
    opt_ml.output_dir.rename(tmp_path / "real-output")
    (tmp_path / "real-output" / "failure").write_text("through a linked directory\n")
    opt_ml.output_dir.symlink_to(tmp_path / "real-output")
    assert contract.read_failure(opt_ml) is None
    opt_ml.output_dir.unlink()
    opt_ml.output_dir.mkdir()
    opt_ml.failure_file.write_text("x" * 100_000)
    assert contract.read_failure(opt_ml) == "x" * contract.FAILURE_REASON_LIMIT


def test_failure_records_are_read_without_following_links(tmp_path: Path) -> None:
    from smddp_sdk.specs import contract

    secret = tmp_path / "secret.json"
    secret.write_text('[{"host": "from a file of the machine"}]')
    opt_ml = contract.OptMl(tmp_path / "host")
    opt_ml.output_dir.mkdir(parents=True)
    opt_ml.failures_file.symlink_to(secret)
    assert contract.read_failure_records(opt_ml) is None
    opt_ml.failures_file.unlink()
    opt_ml.failures_file.write_text("[" * 100_000 + "]" * 100_000)
    assert contract.read_failure_records(opt_ml) is None  # too deep: None, not a RecursionError
    opt_ml.failures_file.write_text('[{"host": "algo-1"}, 3]')
    assert contract.read_failure_records(opt_ml) == [{"host": "algo-1"}]


def test_a_directory_reached_through_a_link_in_any_component_is_left_out_and_named(tmp_path: Path) -> None:
    tree, machine = tmp_path / "algo-1", tmp_path / "machine"
    (machine / "data").mkdir(parents=True)
    (machine / "data" / "secret.txt").write_text("a file of the machine")
    tree.mkdir()
    (tree / "output").symlink_to(machine)  # output/data itself is no link: its parent is
    skipped = write_archive(tmp_path / "output.tar.gz", [tree / "output" / "data"], trees=[tree])
    with tarfile.open(tmp_path / "output.tar.gz") as archive:
        assert archive.getnames() == []
    assert len(skipped) == 1 and str(tree / "output") in skipped[0], skipped
    assert not (tmp_path / "output.tar.gz.partial").exists()


def test_the_runtime_writes_no_success_or_failure_file_through_a_link(tmp_path: Path) -> None:
    from smddp_sdk.specs.contract import OptMl, write_failure, write_success

    machine = tmp_path / "machine"
    machine.mkdir()
    opt_ml = OptMl(tmp_path / "algo-1")
    opt_ml.base.mkdir()
    (opt_ml.base / "output").symlink_to(machine)
    with pytest.raises(OSError):
        write_success(opt_ml)
    with pytest.raises(OSError):
        write_failure(opt_ml, "reason")
    assert list(machine.iterdir()) == []
    (opt_ml.base / "output").unlink()
    write_success(opt_ml)  # the same call in a tree without links
    assert opt_ml.success_file.exists()


def test_an_archive_that_cannot_be_finished_leaves_no_partial_file(tmp_path: Path) -> None:
    """A file size limit stands in for a full disk: the write fails midway, and nothing half-made stays."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(os.urandom(1 << 20))  # incompressible: past the limit
    script = (
        "import resource, signal, sys\nfrom pathlib import Path\nfrom smddp_sdk.specs.archives import write_archive\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nroot = Path(sys.argv[1])\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "try:\n    write_archive(root / 'model.tar.gz', [root / 'model'])\nexcept OSError as exc:\n    print('failed', exc.errno)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("failed"), result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
