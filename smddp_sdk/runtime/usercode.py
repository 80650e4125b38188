"""The user's code: fetch ``sagemaker_submit_directory`` into the code dir, install, build the command.

Fetching accepts a local directory, a local tarball, a ``file://`` URI, or ``s3://`` (through boto3,
imported only then). Tarballs are extracted by ``specs.archives.safe_extract``: absolute names, ``..``,
links that leave the code dir (through any chain of the archive's own links) and device files are
refused before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import unquote, urlparse

from smddp_sdk.errors import ContractError, SmddpError, did_you_mean
from smddp_sdk.specs.archives import code_tree_problems, is_archive, safe_extract
from smddp_sdk.specs.json_files import locked

BOOTSTRAP_MODULE = "smddp_sdk.runtime.bootstrap"


class EntryPointKind(str, Enum):
    """The toolkit's entry-point types, decided in its order."""

    COMMAND = "command"  # *.sh, or any other executable file
    PYTHON_PACKAGE = "python_package"  # setup.py in the code dir: run as ``python -m <module>``
    PYTHON_PROGRAM = "python_program"  # *.py


class InstallError(SmddpError):
    """pip could not install the user's requirements or package (a failure of the job, exit 1)."""


@dataclass(frozen=True)
class UserCommand:
    kind: EntryPointKind
    argv: tuple[str, ...]
    cwd: Path


# --- fetching ---------------------------------------------------------------------------------------


def fetch_code(submit_directory: str | None, code_dir: Path) -> bool:
    """Put the submitted code into ``code_dir``; False when skipped (nothing given, or code dir not empty)."""
    code_dir.mkdir(parents=True, exist_ok=True)
    if not submit_directory or any(code_dir.iterdir()):
        return False  # the toolkit's rule: a non-empty code dir is used as it is
    if submit_directory.startswith("s3://"):
        _fetch_s3(submit_directory, code_dir)
        return True
    source = _local_path(submit_directory)
    if source.is_dir():
        _copy_tree(source, code_dir)
    elif source.is_file() and is_archive(source):
        safe_extract(source, code_dir)
    elif source.is_file():
        shutil.copy2(source, code_dir / source.name)
    elif source.exists():
        raise ContractError(f"hyperparameters.json: field 'sagemaker_submit_directory' points to {str(source)!r}, which is not a directory, a file or an archive (a FIFO, socket or device)")
    else:
        raise ContractError(
            f"hyperparameters.json: field 'sagemaker_submit_directory' points to {str(source)!r}, which does not exist on this host; give a directory, a .tar.gz, a file:// URI or an s3:// URI"
        )
    return True


def _copy_tree(source: Path, code_dir: Path) -> None:
    """A code directory copied as the schedulers stage one: only after the same check (no FIFO to block
    the copy, no link out of the tree), every problem named at once."""
    problems = code_tree_problems(source)
    if problems:
        raise ContractError(f"sagemaker_submit_directory {str(source)!r} holds what a code directory cannot: {'; '.join(problems[:5])}" + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
    shutil.copytree(source, code_dir, dirs_exist_ok=True, symlinks=True)


def _local_path(uri: str) -> Path:
    if uri.startswith("file://"):
        parsed = urlparse(uri)
        return Path(unquote(parsed.netloc + parsed.path))
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise ContractError(f"hyperparameters.json: field 'sagemaker_submit_directory' uses scheme {scheme!r}; use a local path, file:// or s3://")
    return Path(uri)


def _fetch_s3(uri: str, code_dir: Path) -> None:
    try:
        import boto3  # only on SageMaker-style jobs whose code lives in S3
    except ImportError:
        raise ContractError(f"sagemaker_submit_directory is {uri!r} but boto3 is not installed in this image; install boto3 or pass the code as a local directory") from None
    parsed = urlparse(uri)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "sourcedir.tar.gz"
        boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL")).download_file(parsed.netloc, parsed.path.lstrip("/"), str(archive))
        safe_extract(archive, code_dir)


# --- entry point ------------------------------------------------------------------------------------


def entry_point_kind(entry_point: str, code_dir: Path) -> EntryPointKind:
    if entry_point.endswith(".sh"):
        return EntryPointKind.COMMAND
    if (code_dir / "setup.py").is_file():
        return EntryPointKind.PYTHON_PACKAGE
    if entry_point.endswith(".py"):
        return EntryPointKind.PYTHON_PROGRAM
    return EntryPointKind.COMMAND


def check_entry_point(entry_point: str, code_dir: Path, kind: EntryPointKind) -> None:
    """Fail early, naming close matches, when the entry point is not in the code dir."""
    if kind is EntryPointKind.PYTHON_PACKAGE:
        return  # a module of the installed package; pip decides whether it exists
    if (code_dir / entry_point).is_file():
        return
    present = sorted(str(p.relative_to(code_dir)) for p in code_dir.rglob("*") if p.is_file())[:2000]
    hint = did_you_mean(entry_point, present)
    listing = ", ".join(present[:10]) or "nothing"
    raise ContractError(f"hyperparameters.json: field 'sagemaker_program' names {entry_point!r}, which is not in the code directory {code_dir} (it holds: {listing}){'; ' + hint if hint else ''}")


def user_command(entry_point: str, kind: EntryPointKind, code_dir: Path, args: Sequence[str], python: str = sys.executable) -> UserCommand:
    """The argv of one rank. Python runs through the bootstrap; nothing goes through a shell."""
    if kind is EntryPointKind.PYTHON_PROGRAM:
        argv = [python, "-m", BOOTSTRAP_MODULE, entry_point, *args]
    elif kind is EntryPointKind.PYTHON_PACKAGE:
        module = entry_point.removesuffix(".py")
        argv = [python, "-m", BOOTSTRAP_MODULE, "--module", module.replace("/", "."), *args]
    else:
        script = code_dir / entry_point
        script.chmod(script.stat().st_mode | 0o111)
        with open(script, "rb") as handle:
            has_shebang = handle.read(2) == b"#!"
        # Scripts without a "#!" line cannot be exec'd directly; the toolkit runs them with /bin/sh too.
        argv = [f"./{entry_point}", *args] if has_shebang else ["/bin/sh", entry_point, *args]
    return UserCommand(kind, tuple(argv), code_dir)


# --- installing -------------------------------------------------------------------------------------

_COMPLETE = ".smddp-complete"  # written last: a virtualenv without it is a broken attempt


@dataclass(frozen=True)
class Interpreter:
    """The Python the ranks run: this one, or a virtualenv over its site-packages made for the job."""

    python: str = sys.executable
    venv: Path | None = None

    def apply(self, environ: dict[str, str]) -> None:
        """What activating the virtualenv does, for a rank's environment (``python`` in scripts finds it)."""
        if self.venv is not None:
            environ["VIRTUAL_ENV"] = str(self.venv)
            environ["PATH"] = os.pathsep.join(filter(None, [str(self.venv / "bin"), environ.get("PATH")]))


def install(code_dir: Path, kind: EntryPointKind, emit: Callable[[str], None], *, cache: Path | None = None, job_key: str = "") -> Interpreter:
    """pip-install requirements.txt (and the package itself for a setup.py entry point).

    Without ``cache`` (a container, as on SageMaker) into this interpreter. With it (local mode) into a
    virtualenv under ``cache`` over this interpreter's site-packages, named by a hash of what is installed:
    the first host of a job builds it under a file lock, the others (and later jobs with the same
    requirements) reuse it, and the user's own interpreter is never changed.
    """
    targets: list[str] = []
    if kind is EntryPointKind.PYTHON_PACKAGE:
        targets.append(".")
    if (code_dir / "requirements.txt").is_file():
        targets += ["-r", "requirements.txt"]
    if not targets:
        return Interpreter()
    if cache is None:
        _pip(code_dir, kind, [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *targets], emit)
        return Interpreter()
    venv = cache / _environment_key(code_dir, kind, job_key)
    with locked(cache / f"{venv.name}.lock"):  # the other hosts of the job wait here, then reuse the result
        if (venv / _COMPLETE).is_file():
            emit(f"requirements already installed in {venv} (shared by the job's hosts and by jobs with the same file)")
            return Interpreter(str(venv / "bin" / "python"), venv)
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted job
        emit(f"creating {venv} (a virtualenv over this Python's packages, for requirements.txt)")
        _run_quietly([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
        python = str(venv / "bin" / "python")
        command = [sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check", *targets]
        try:
            _pip(code_dir, kind, command, emit)
        except InstallError:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / _COMPLETE).touch()
    return Interpreter(python, venv)


def _environment_key(code_dir: Path, kind: EntryPointKind, job_key: str) -> str:
    """Same requirements, same interpreter: same virtualenv. A setup.py package is the job's own code."""
    digest = hashlib.sha256()
    digest.update(os.path.realpath(sys.executable).encode())
    digest.update(sys.version.encode())
    requirements = code_dir / "requirements.txt"
    digest.update(requirements.read_bytes() if requirements.is_file() else b"")
    if kind is EntryPointKind.PYTHON_PACKAGE:
        digest.update(f"package of job {job_key}".encode())
    return "req-" + digest.hexdigest()[:16]


def _run_quietly(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise InstallError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def _pip(code_dir: Path, kind: EntryPointKind, command: list[str], emit: Callable[[str], None]) -> None:
    emit(f"installing {'the package and ' if kind is EntryPointKind.PYTHON_PACKAGE else ''}requirements.txt of the code: " + " ".join(command))
    process = subprocess.Popen(command, cwd=code_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    tail: list[str] = []
    for line in process.stdout:
        emit(line.rstrip("\n"))
        tail = (tail + [line.rstrip("\n")])[-20:]
    if process.wait() != 0:
        what = "the package and requirements.txt" if kind is EntryPointKind.PYTHON_PACKAGE else "requirements.txt"
        raise InstallError(pip_failure(what, code_dir, process.returncode, tail))


# pip's words when it could not reach an index (it retries first, then gives up)
_OFFLINE_SIGNS = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable", "No matching distribution found")


def pip_failure(what: str, code_dir: Path, code: int, tail: list[str]) -> str:
    """pip's error first (not its first retry warning), then its last lines; where it found no index, how
    to install without network."""
    errors = [line for line in tail if line.startswith("ERROR:")]
    headline = errors[-1].removeprefix("ERROR:").strip() if errors else f"exit {code}"
    message = f"pip could not install {what} in {code_dir}: {headline}"
    if any(sign in line for line in tail for sign in _OFFLINE_SIGNS):
        message += ("; without network, install from wheels: `pip download -r requirements.txt -d wheels` where there is network, then "
                    "the docker scheduler's `wheelhouse` option (-o wheelhouse=wheels), or PIP_FIND_LINKS=wheels and PIP_NO_INDEX=1 in the environment")
    return message + f"\npip's last lines (exit {code}):\n" + "\n".join(tail)
