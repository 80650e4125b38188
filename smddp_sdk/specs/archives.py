"""Tar archives that cannot reach outside their directory, in either direction.

``safe_extract`` unpacks a code tarball (sourcedir.tar.gz) that anyone may have made. It does not trust
path resolution on disk at all (CVE-2025-4517 passed Python's own ``data`` filter with a chain of
symlinks whose resolved path exceeds PATH_MAX, so ``realpath`` stopped resolving). Instead it checks the
whole archive first, as a tree of names, before writing a byte:

- names are relative, without ``..``, NUL or repeats; only files, directories, symlinks and hard links;
- no member lies beneath a symlink of the archive (a write through a link is how every escape works);
- every symlink's target, resolved through the archive's own links (at most 40 hops, as the kernel
  allows), stays inside the destination; a hard link names a regular file of the archive;
- member count and total size are bounded, and so is the decompressed stream itself while it is read:
  at most MAX_EXTRACTED_BYTES, and past RATIO_GRACE at most MAX_RATIO times the compressed bytes read so
  far (a gzip bomb is refused a few KB into it, before the header scan has skipped its first member);
- the archive is opened without blocking and must be a regular file (a FIFO is refused, not waited on);
  a truncated or damaged one is a ContractError saying so.

Then it writes files and directories with ``O_NOFOLLOW``/``O_EXCL`` into a directory it checked is empty,
copies hard links' contents, and makes the symlinks last, so no write ever passes through one.

``write_archive`` packs directories (a job's model and output data) without following a link out of
them: a symlink to a file inside the same directory is stored as that file's contents, anything else
(links that leave the directory, links to directories, FIFOs, sockets, devices) is left out and
reported, and files are opened with ``O_NOFOLLOW`` so a file swapped for a link meanwhile is not read.

Stdlib only: the runtime uses it inside any image.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import lzma
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from smddp_sdk.errors import ContractError, SpecIssue

MAX_MEMBERS = 200_000
MAX_EXTRACTED_BYTES = 4 * 1024**3  # a code tree past this is data: it belongs in an input channel
MAX_RATIO = 100  # decompressed bytes per compressed byte (Apache POI's zip-bomb default); source code gives 3-10
RATIO_GRACE = 64 * 1024**2  # the ratio is judged only past this much output: a small tar of empty files compresses well
MAX_LINK_HOPS = 40  # the kernel's own limit on symlinks in one path resolution
_READ_CHUNK = 1024 * 1024


class UnsafeArchiveError(ContractError):
    """An archive member could land outside the destination, or the archive is past a bound."""


# --- extracting ---------------------------------------------------------------------------------------


def safe_extract(archive: Path, destination: Path) -> None:
    """Extract ``archive`` into the empty (or new) directory ``destination``; nothing is written when
    any member is unsafe. Raises ``UnsafeArchiveError`` naming the member or the bound, or ``ContractError``
    when the file is not a regular file holding a readable tar archive."""
    destination.mkdir(parents=True, exist_ok=True)
    if any(destination.iterdir()):
        raise ContractError(f"{destination}: the directory to extract {archive.name} into is not empty")
    try:
        with open_regular(archive) as raw, _decompressed(raw, archive.name) as stream, tarfile.open(fileobj=stream, mode="r:") as tar:
            members = []
            for member in tar:  # headers only; counted as read so a flood of members stops early
                members.append(member)
                if len(members) > MAX_MEMBERS:
                    raise UnsafeArchiveError(f"{archive.name}: more than {MAX_MEMBERS} members")
            plan = check_members(members, archive.name)
            while stream.read(_READ_CHUNK):  # to the end, so gzip's CRC and length are checked before a byte is written
                pass
            _write(tar, plan, destination)
    except UnsafeArchiveError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise ContractError(f"{archive}: damaged or truncated archive ({exc or type(exc).__name__}); make it again (tar czf) and resubmit") from None
    except OSError as exc:
        raise ContractError(f"{archive}: cannot extract the archive: {exc.strerror or exc}") from None


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading only if it is a regular file: opened without blocking (a FIFO with no
    writer would block ``open`` forever) and checked with ``fstat`` before a byte is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ContractError(f"{path}: not a regular file ({_kind(mode)}); give a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a device", stat.S_ISBLK: "a device"}
    return next((word for test, word in kinds.items() if test(mode)), "not a file")


_COMPRESSIONS: dict[bytes, Callable[[BinaryIO], BinaryIO]] = {  # by magic number
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": lambda raw: bz2.BZ2File(raw),
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw),  # noqa: SIM115 - _BoundedStream.close closes it
}


def is_archive(path: Path) -> bool:
    """Whether the regular file ``path`` is a tar archive by its first bytes: compressed (gzip, bzip2, xz),
    or a plain tar's "ustar" magic. Decides nothing by decompressing: a damaged archive is still one."""
    with open_regular(path) as handle:
        head = handle.read(512)
    return any(head.startswith(magic) for magic in _COMPRESSIONS) or head[257:262] == b"ustar"


def _decompressed(raw: BinaryIO, label: str) -> _BoundedStream:
    head = raw.read(8)
    raw.seek(0)
    opener = next((make for magic, make in _COMPRESSIONS.items() if head.startswith(magic)), None)
    return _BoundedStream(opener(raw) if opener else raw, raw, label)


class _BoundedStream(io.RawIOBase):
    """The decompressed bytes of an archive, read (and skipped) in chunks, each checked as it comes:
    refused past MAX_EXTRACTED_BYTES, or past RATIO_GRACE when more than MAX_RATIO times the compressed
    bytes consumed to make them. Positions are compared, so tarfile's two passes count once."""

    def __init__(self, inner: BinaryIO, raw: BinaryIO, label: str) -> None:
        super().__init__()
        self.inner, self.raw, self.label = inner, raw, label

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self.inner is not self.raw:
            self.inner.close()  # the decompressor; the caller closes the file
        super().close()

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.inner.tell()

    def read(self, size: int | None = -1) -> bytes:
        wanted = size if size is not None and size >= 0 else MAX_EXTRACTED_BYTES + 1
        parts = []
        while wanted > 0 and (chunk := self.inner.read(min(wanted, _READ_CHUNK))):
            self._check()
            parts.append(chunk)
            wanted -= len(chunk)
        return b"".join(parts)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("seek from the end of a compressed stream")
        target = offset if whence == io.SEEK_SET else self.tell() + offset
        if target <= self.tell():
            return self.inner.seek(target)  # back over what was already checked
        while self.tell() < target and self.inner.read(min(target - self.tell(), _READ_CHUNK)):
            self._check()  # skipping a member's data decompresses it: checked like a read
        return self.tell()

    def _check(self) -> None:
        produced, consumed = self.inner.tell(), max(self.raw.tell(), 1)
        if produced > MAX_EXTRACTED_BYTES:
            raise UnsafeArchiveError(f"{self.label}: decompresses to more than {MAX_EXTRACTED_BYTES} bytes; the limit is {MAX_EXTRACTED_BYTES} for a code archive: keep data out of source_dir and read it from an input channel")
        if produced > RATIO_GRACE and produced > MAX_RATIO * consumed:
            raise UnsafeArchiveError(f"{self.label}: {consumed} compressed bytes expand to {produced} (over {MAX_RATIO}:1): a decompression bomb, refused; "
                                     "a code archive that compresses this well holds padding, not code")


def check_members(members: Sequence[tarfile.TarInfo], label: str) -> list[tuple[tarfile.TarInfo, tuple[str, ...]]]:
    """Each member with its normalised name parts, or ``UnsafeArchiveError`` for the first unsafe one."""
    if len(members) > MAX_MEMBERS:
        raise UnsafeArchiveError(f"{label}: {len(members)} members; the limit is {MAX_MEMBERS}")
    total = sum(member.size for member in members if member.isfile())
    if total > MAX_EXTRACTED_BYTES:
        raise UnsafeArchiveError(f"{label}: extracts to {total} bytes; the limit is {MAX_EXTRACTED_BYTES}")
    plan: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    kinds: dict[tuple[str, ...], tarfile.TarInfo] = {}
    for member in members:
        parts = _name_parts(member, label)
        if not parts:
            continue  # "." or "./": the destination itself
        if parts in kinds:
            raise _refuse(label, member, "the name appears twice in the archive")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise _refuse(label, member, "device files, FIFOs and other special members are not allowed")
        if member.islnk():
            _check_hardlink(member, kinds, label)  # against the members before it, as tar links only back
        kinds[parts] = member
        plan.append((member, parts))
    links = {parts: member for parts, member in kinds.items() if member.issym()}
    for member, parts in plan:
        for depth in range(1, len(parts)):
            if parts[:depth] in links:
                raise _refuse(label, member, f"it lies beneath the symlink {'/'.join(parts[:depth])!r}")
        if member.issym():
            _check_symlink(member, parts, links, label)
    return plan


def _name_parts(member: tarfile.TarInfo, label: str) -> tuple[str, ...]:
    name = member.name
    if "\0" in name:
        raise _refuse(label, member, "the name contains a NUL character")
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise _refuse(label, member, "absolute path")
    parts = tuple(part for part in name.replace("\\", "/").split("/") if part not in ("", "."))
    if ".." in parts:
        raise _refuse(label, member, "path contains '..'")
    return parts


def _check_symlink(member: tarfile.TarInfo, parts: tuple[str, ...], links: dict[tuple[str, ...], tarfile.TarInfo], label: str) -> None:
    target = member.linkname
    if not target or "\0" in target:
        raise _refuse(label, member, "the link has an empty or invalid target")
    if target.startswith("/") or PurePosixPath(target).is_absolute():
        raise _refuse(label, member, f"link to absolute path {target!r}")
    problem = _resolve(parts[:-1], target, links)
    if problem:
        raise _refuse(label, member, f"link {target!r} {problem}")


def _resolve(directory: tuple[str, ...], target: str, links: dict[tuple[str, ...], tarfile.TarInfo]) -> str:
    """Follow ``target`` from ``directory`` through the archive's own symlinks, as the kernel would once
    everything is extracted; "" when it stays inside, else why not."""
    pending = [part for part in target.split("/") if part not in ("", ".")]
    current = list(directory)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not current:
                return "points outside the directory"
            current.pop()
            continue
        current.append(part)
        link = links.get(tuple(current))
        if link is None:
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return f"resolves through more than {MAX_LINK_HOPS} symlinks"
        if link.linkname.startswith("/"):
            return f"resolves through {'/'.join(current)!r}, a link to an absolute path"
        current.pop()
        pending = [p for p in link.linkname.split("/") if p not in ("", ".")] + pending
    return ""


def _check_hardlink(member: tarfile.TarInfo, earlier: dict[tuple[str, ...], tarfile.TarInfo], label: str) -> None:
    target = member.linkname
    if target.startswith("/") or PurePosixPath(target).is_absolute():
        raise _refuse(label, member, f"hard link to absolute path {target!r}")
    parts = tuple(part for part in target.split("/") if part not in ("", "."))
    if ".." in parts:
        raise _refuse(label, member, f"hard link {target!r} contains '..'")
    linked = earlier.get(parts)
    if linked is None or not linked.isfile():
        raise _refuse(label, member, f"hard link {target!r} does not name a regular file earlier in the archive")


def _refuse(label: str, member: tarfile.TarInfo, reason: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"{label}: refusing to extract member {member.name!r}: {reason}")


def _write(tar: tarfile.TarFile, plan: list[tuple[tarfile.TarInfo, tuple[str, ...]]], destination: Path) -> None:
    root = os.open(destination, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for member, parts in plan:
            if member.isdir():
                _make_dirs(root, parts)
        for member, parts in plan:
            if member.isfile() or member.islnk():
                _write_file(tar, member, root, parts)
        for member, parts in plan:
            if member.issym():
                parent = _make_dirs(root, parts[:-1])
                try:
                    os.symlink(member.linkname, parts[-1], dir_fd=parent)
                finally:
                    os.close(parent)
        for member, parts in reversed(plan):  # deepest first, so a read-only directory is set last
            if member.isdir():
                os.chmod(os.path.join(destination, *parts), _mode(member.mode, directory=True))
    finally:
        os.close(root)


def _make_dirs(root: int, parts: Sequence[str], mode: int | None = 0o700) -> int:
    """Open ``parts`` under the directory ``root`` (creating them with ``mode`` unless None) without following
    any symlink; returns its fd. A link of a part's name is refused by O_NOFOLLOW (OSError)."""
    fd = os.dup(root)
    for part in parts:
        if mode is not None:
            with suppress(FileExistsError):
                os.mkdir(part, mode, dir_fd=fd)
        try:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, root: int, parts: tuple[str, ...]) -> None:
    source = tar.extractfile(member)  # for a hard link, the linked file's data
    if source is None:
        raise UnsafeArchiveError(f"cannot read member {member.name!r}")
    parent = _make_dirs(root, parts[:-1])
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(parts[-1], flags, 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    with os.fdopen(fd, "wb") as out, source:
        while chunk := source.read(_READ_CHUNK):
            out.write(chunk)
        os.fchmod(out.fileno(), _mode(member.mode, directory=False))
        os.utime(out.fileno(), (member.mtime, member.mtime))


def _mode(mode: int, *, directory: bool) -> int:
    """The member's permissions without setuid/setgid/sticky or write for others; always owner-usable."""
    return (mode & 0o755) | (0o700 if directory else 0o600)


# --- code directories ---------------------------------------------------------------------------------


# Never part of a code snapshot: they are large, machine-specific, or both.
CODE_IGNORE = (".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache", ".pytest_cache", ".ipynb_checkpoints")


def code_ignore(dest: Path) -> Callable[[str, list[str]], set[str]]:
    """CODE_IGNORE, virtual environments (directories holding ``pyvenv.cfg``), and the directory holding ``dest`` when the code directory contains it (a snapshot in
    ``SMDDP_JOB_ROOT=./jobs`` with ``source_dir: .``): the snapshot must not copy itself without end, nor
    the check walk other jobs' directories."""
    patterns = shutil.ignore_patterns(*CODE_IGNORE)
    target = dest.resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(patterns(directory, names))
        skipped |= {name for name in names if os.path.isfile(os.path.join(directory, name, "pyvenv.cfg"))}  # a virtualenv by any name
        here = Path(directory).resolve()
        if here in target.parents:  # one resolve per directory; names only where the snapshot lies below
            skipped |= {name for name in names if (here / name) == target or (here / name) in target.parents}
        return skipped

    return ignore


def code_tree_issues(trees: Mapping[str, Path], ignore: Callable[[str, list[str]], set[str]]) -> list[SpecIssue]:
    """``code_tree_problems`` of each tree, as problems of the field that names it (``source_dir``,
    ``dependencies[0]``): what validation, the dry run and the snapshot report alike."""
    hint = "code directories hold files, directories and relative links that stay inside them"
    return [SpecIssue(where, problem, hint) for where, tree in trees.items() if tree.is_dir() for problem in code_tree_problems(tree, ignore)]


def code_tree_problems(tree: Path, ignore: Callable[[str, list[str]], set[str]] | None = None) -> list[str]:
    """What a code directory must not hold, one line each: links that leave it, dangle or loop (copied as
    they are they would read a file of the machine, or break the copy), FIFOs (a copy would block on
    one), sockets and devices. The one check of a code tree: validation, the dry run, the schedulers'
    snapshot and the runtime's copy all call it. ``ignore`` is shutil.copytree's (names not copied)."""
    problems = []
    real_tree = tree.resolve()
    for directory, dirnames, filenames in os.walk(tree):
        skipped = ignore(directory, [*dirnames, *filenames]) if ignore else set()
        dirnames[:] = [name for name in dirnames if name not in skipped]
        for name in [*dirnames, *filenames]:
            path = Path(directory, name)
            if name in skipped:
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    problems.append(f"{path}: a dangling or looping link ({os.readlink(path)!r})")
                    continue
                if os.path.isabs(os.readlink(path)) or (target != real_tree and real_tree not in target.parents):
                    problems.append(f"{path}: a link to {os.readlink(path)!r}, outside {tree} or absolute")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                problems.append(f"{path}: not a file, directory or link (a FIFO, socket or device)")
    return problems


# --- reading one file a job wrote ------------------------------------------------------------------------


def _open_leaf(root: Path, relative: str, flags: int, make_dirs: bool = False) -> int:
    """``root/relative`` opened with flags, following no symlink in any component (a container can make
    ``output`` or ``output/failure`` a link to a place of the machine); OSError when one is a link."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts:
        raise IsADirectoryError(f"{root}: no file named")
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _make_dirs(root_fd, parts[:-1], 0o755 if make_dirs else None)
    finally:
        os.close(root_fd)
    try:
        return os.open(parts[-1], flags | os.O_NOFOLLOW, 0o644, dir_fd=fd)
    finally:
        os.close(fd)


def open_inside(root: Path, relative: str) -> BinaryIO | None:
    """The regular file ``root/relative`` opened for reading, following no symlink on the way; None when
    it is missing, not a regular file, or reached through a link. For logs that are followed as they grow."""
    try:
        leaf = _open_leaf(root, relative, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        return None
    return os.fdopen(leaf, "rb")


def write_inside(root: Path, relative: str, data: bytes, *, exclusive: bool = False) -> None:
    """Write ``root/relative`` (its directories made as needed), following no symlink on the way, so a
    job cannot point the runtime's writes (``output/success``, ``output/failure``) at a file of the
    machine. OSError when a component is a link (or, with exclusive, when the file exists)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    with os.fdopen(_open_leaf(root, relative, flags, make_dirs=True), "wb") as handle:
        handle.write(data)


def append_inside(root: Path, relative: str) -> BinaryIO:
    """``root/relative`` opened to append (made, with its directories, if missing), following no symlink on
    the way and only if it is a regular file: a log the job replaced with a FIFO would block the open, a
    link would point the runtime's writes at a file of the machine. OSError otherwise."""
    fd = _open_leaf(root, relative, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, make_dirs=True)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{root / relative}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def read_inside(root: Path, relative: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``root/relative`` as ``open_inside`` finds it, or None."""
    handle = open_inside(root, relative)
    if handle is None:
        return None
    with handle:
        return handle.read(limit)


# --- archiving ------------------------------------------------------------------------------------------


def write_archive(archive: Path, roots: Sequence[Path], *, trees: Sequence[Path] = (), on_skip: Callable[[str], None] | None = None) -> list[str]:
    """One gzip tar of several directories laid over each other (the last root wins on equal names).

    ``trees[i]``, where given, is the tree that ``roots[i]`` lies in: a root reached from it through a
    link in any component (``output`` made a link to a directory of the machine) is left out whole.
    Returns what was left out, one line each (also passed to ``on_skip``); written to ``<archive>.partial``
    first so a reader never sees half an archive, and no ``.partial`` stays when writing fails.
    """
    skipped: list[str] = []

    def skip(text: str) -> None:
        skipped.append(text)
        if on_skip is not None:
            on_skip(text)

    members: dict[str, tuple[Path, Path]] = {}
    for root, tree in itertools.zip_longest(roots, trees[: len(roots)]):
        link = _first_link(root, tree or root)
        if link is not None:
            skip(f"{link}: a link ({os.readlink(link)!r}), so nothing under {root} is archived")
        elif root.is_dir():
            for name, path in _tree_files(root, skip):
                members[name] = (root, path)
    partial = archive.with_name(archive.name + ".partial")
    try:
        with tarfile.open(partial, "w:gz") as tar:
            for name, (root, path) in sorted(members.items()):
                _add_file(tar, name, root, path, skip)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)  # ENOSPC and the like: no half archive stays behind
    return skipped


def _first_link(root: Path, tree: Path) -> Path | None:
    """The first of tree's components down to root (root itself included) that is a symlink, or None."""
    parts = root.relative_to(tree).parts
    for depth in range(len(parts) + 1):
        path = tree.joinpath(*parts[:depth])
        if path.is_symlink():
            return path
    return None


def _tree_files(root: Path, skip: Callable[[str], None]) -> list[tuple[str, Path]]:
    """Regular files and in-tree file links under ``root``, never descending through a link."""
    found = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames):
            path = Path(directory, name)
            if path.is_symlink():
                skip(f"{path.relative_to(root).as_posix()}: a link to a directory is not archived")
        for name in sorted(filenames):
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                found.append((relative, path))
            elif stat.S_ISLNK(info.st_mode):
                if _link_stays_inside(path, root):
                    found.append((relative, path))
                else:
                    skip(f"{relative}: a link to {os.readlink(path)!r}, outside the directory, is not archived")
            else:
                skip(f"{relative}: not a regular file (FIFO, socket or device), not archived")
    return found


def _link_stays_inside(path: Path, root: Path) -> bool:
    try:
        target = path.resolve(strict=True)
        real_root = root.resolve(strict=True)
    except (OSError, RuntimeError):
        return False  # dangling, a loop, or too long
    return real_root in target.parents and target.is_file()


def _add_file(tar: tarfile.TarFile, name: str, root: Path, path: Path, skip: Callable[[str], None]) -> None:
    """Add one file by an fd opened without following links, so a swap for a link meanwhile is refused."""
    target = path
    if path.is_symlink():
        if not _link_stays_inside(path, root):
            skip(f"{name}: a link that now leaves the directory, not archived")
            return
        target = path.resolve()
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        skip(f"{name}: cannot be read ({exc.strerror}), not archived")
        return
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            skip(f"{name}: not a regular file, not archived")
            return
        member = tarfile.TarInfo(name)
        member.size = info.st_size
        member.mtime = int(info.st_mtime)
        member.mode = stat.S_IMODE(info.st_mode) & 0o755
        tar.addfile(member, handle)
