"""torchrun's launcher flags on ``run``, and what a torchrun-style run ships as its code.

The rule: a flag torchrun has means here what it means to torchrun, translated into the job's own
settings (``--nnodes 2`` is ``instance_count: 2``); a flag whose meaning has no counterpart here (an
elastic range, an etcd rendezvous) is refused with what to use instead, never ignored in silence.
The code of ``smddp-launch train.py`` is the current directory when the script lies in it (torchrun
runs the script from there: its relative paths and imports resolve as they would under torchrun),
else the script's own directory; a size guard stops a working directory full of data from being
copied to every host.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from smddp_sdk.cli.params import GroupedOption
from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.schedulers import scheduler_class
from smddp_sdk.specs import contract
from smddp_sdk.specs.archives import code_ignore

TORCHRUN_GROUP = "torchrun's flags (before the script)"
CODE_LIMIT_BYTES = 100 * 1024 * 1024  # an implicit code directory above this is refused (name it to ship it)
CODE_LIMIT_FILES = 10_000  # ... and one with more files (a home directory): the walk stops there
LARGEST_SHOWN = 5
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")  # noqa: S104 - names, nothing is bound
_RDZV_BACKENDS = ("c10d", "static")


def _option(*names: str, **kwargs: Any) -> Callable[[Any], Any]:
    return click.option(*names, cls=GroupedOption, help_group=TORCHRUN_GROUP, **kwargs)


def underscores_as_dashes(token: str) -> str:
    """torchrun takes ``--nproc_per_node`` and ``--nproc-per-node`` alike; so does ``run`` (click hands it
    option names, and choices, which have no underscores that matter: torch_distributed still matches)."""
    return token.replace("_", "-")


def torchrun_options(func: Any) -> Any:
    """``run``'s torchrun flags, with torchrun's spellings (``underscores_as_dashes``)."""
    decorators = [
        _option("--hosts", "--nnodes", "nnodes", metavar="N", help="Hosts (instance_count); torchrun's N:N is N. An elastic range N:M (N<M) is refused: hosts here are a fixed number."),
        _option("--nproc-per-host", "--nproc-per-node", "nproc", metavar="N|auto|gpu|cpu",
                help="Ranks per host (the processes_per_host option): gpu = one per GPU; cpu = this machine's CPUs; auto = gpu on a machine with a GPU, else cpu (torchrun's rule; on Slurm each node counts its own)."),
        _option("--max-restarts", "max_restarts", type=click.IntRange(0), metavar="N",
                help="Run the whole job again up to N times after any failure, the script's own included (max_retry_attempts with retry_script_errors); 0 = none."),
        _option("--standalone", is_flag=True, help="One host on this machine (torchrun's single-node rendezvous); same as --hosts 1."),
        _option("-m", "--module", "module", metavar="MODULE", help="Run MODULE (a module under the code directory, e.g. pkg.train) as `python -m` would; arguments after it go to it."),
        _option("--rdzv-backend", "rdzv_backend", metavar="NAME", help="c10d or static: the hosts always meet at the first host's c10d store; others are refused."),
        _option("--rdzv-endpoint", "rdzv_endpoint", metavar="HOST:PORT", help="Only this machine (localhost:PORT) is accepted: the first host serves the rendezvous on a port the scheduler picks."),
        _option("--rdzv-id", "rdzv_id", metavar="ID", help="Accepted and not needed: every job has its own rendezvous, named by the job (TORCHELASTIC_RUN_ID)."),
        _option("--rdzv-conf", "rdzv_conf", metavar="K=V,...", help="Refused: the runtime's rendezvous waits SMDDP_AGENT_TIMEOUT seconds for the hosts (-e SMDDP_AGENT_TIMEOUT=900)."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


TORCHRUN_PARAMS = ("nnodes", "nproc", "max_restarts", "standalone", "module", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf")


def apply_torchrun_flags(params: dict[str, Any]) -> list[str]:
    """Turn the torchrun flags in ``params`` (popped) into job settings in place; returns notes for the
    person (what an accepted flag means here). Flags with no meaning here are one usage error, all named."""
    flags = {name: params.pop(name, None) for name in TORCHRUN_PARAMS}
    notes: list[str] = []
    problems: list[str] = []

    def checked(read: Callable[[], Any]) -> Any:
        try:
            return read()
        except click.UsageError as err:
            problems.append(err.format_message())
            return None

    hosts = checked(lambda: _hosts(flags["nnodes"]))
    if flags["standalone"]:
        if hosts not in (None, 1):
            problems.append(f"--standalone is one host; --nnodes {flags['nnodes']} asks for {hosts}: give one of them")
        hosts = 1
    if hosts is not None and params.get("instance_count") not in (None, hosts):
        problems.append(f"--nnodes/--hosts {hosts} and --instance-count {params['instance_count']} disagree: give one of them")
    elif hosts is not None:
        params["instance_count"] = hosts
    per_host = checked(lambda: _per_host(flags["nproc"], params))
    if per_host is not None:
        params["scheduler_option"] = [*params.get("scheduler_option", ()), ("processes_per_host", str(per_host))]
    if flags["max_restarts"]:  # torchrun's default 0 is no retry policy at all
        params["settings"] = [*params.get("settings", ()), ("max_retry_attempts", str(flags["max_restarts"]))]
        params["scheduler_option"] = [*params.get("scheduler_option", ()), ("retry_script_errors", "true")]
    backend = flags["rdzv_backend"]
    if backend is not None and backend not in _RDZV_BACKENDS:
        problems.append(f"--rdzv-backend {backend}: the hosts here meet at the first host's c10d store (MASTER_ADDR/MASTER_PORT in every rank); leave the flag out or give c10d")
    endpoint = flags["rdzv_endpoint"]
    if endpoint is not None:
        host = endpoint.rpartition(":")[0] if ":" in endpoint else endpoint
        if host.strip("[]") in (*_LOCAL_HOSTS, os.uname().nodename):
            notes.append(f"--rdzv-endpoint {endpoint}: the ranks meet at the first host's store on a free port (MASTER_ADDR, MASTER_PORT), not at that port")
        else:
            problems.append(f"--rdzv-endpoint {endpoint}: the first host (algo-1) serves the rendezvous here, on a port the scheduler picks; leave the flag out")
    if flags["rdzv_conf"] is not None:
        problems.append(f"--rdzv-conf {flags['rdzv_conf']}: the rendezvous is the runtime's; how long a host waits for the others is -e {contract.AGENT_TIMEOUT_ENV}=SECONDS (default 600)")
    if problems:
        raise click.UsageError("\n".join(problems))
    if flags["module"] is not None:
        params["module"] = flags["module"]
    return notes


def _hosts(value: str | None) -> int | None:
    if value is None:
        return None
    low, sep, high = value.partition(":")
    try:
        count, top = int(low), int(high) if sep else int(low)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number of hosts, e.g. 2 (or torchrun's 2:2)", param_hint="'--nnodes'") from None
    if count != top:
        raise click.UsageError(
            f"--nnodes {value} is an elastic range (start with {count} hosts, admit up to {top}); hosts here are a fixed number, "
            f"as on SageMaker: give --nnodes {top} (what torchrun settles on when every node joins)"
        )
    return count


def _per_host(value: str | None, params: dict[str, Any]) -> int | str | None:
    """torchrun's ``--nproc-per-node``: a number, ``gpu`` (None: one rank per GPU, the scheduler's own
    rule), ``cpu`` (this machine's CPUs) or ``auto`` (gpu where this machine has one, else cpu; ``auto``
    itself to a scheduler that counts it on each host, Slurm's)."""
    if value is None or value == "gpu":
        return None
    if value == "auto":
        scheduler = params.get("scheduler") or "local"
        if _counts_on_hosts(scheduler):
            return "auto"
        return os.cpu_count() or 1 if _runs_here(scheduler) and not shutil.which("nvidia-smi") else None
    if value == "cpu":
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise click.BadParameter(f"{value!r}: give a number of ranks per host (1 or more), auto, gpu or cpu", param_hint="'--nproc-per-node'")
    return count


# --- what ships ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeDir:
    """The directory a torchrun-style run ships, and why it is that one."""

    path: Path
    reason: str  # "the current directory" or "the script's directory"
    files: int
    size: int
    largest: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return f"{self.reason} {self.path} ({self.files} file{'s' if self.files != 1 else ''}, {megabytes(self.size)}; .git, __pycache__ and virtual environments left out)"


def code_dir_for(script: Path) -> tuple[Path, str]:
    """torchrun's working directory: the current one when the script lies in it, else the script's own."""
    cwd, resolved = Path.cwd().resolve(), script.resolve()
    if cwd in resolved.parents:
        return cwd, "the current directory"
    return resolved.parent, "the script's directory"


def measure(path: Path, reason: str, job_root: Path | None) -> CodeDir:
    """Count what a snapshot of ``path`` copies (the snapshot's own ignore rule)."""
    sizes = dict(itertools.islice(_files(path, code_ignore(job_root) if job_root else code_ignore(path / ".smddp-none")), CODE_LIMIT_FILES + 1))
    largest = tuple(sorted(sizes.items(), key=lambda item: -item[1])[:LARGEST_SHOWN])
    return CodeDir(path, reason, len(sizes), sum(sizes.values()), largest)


def _files(root: Path, ignore: Callable[[str, list[str]], set[str]]) -> Iterator[tuple[str, int]]:
    for directory, dirnames, filenames in os.walk(root):
        skipped = ignore(directory, [*dirnames, *filenames])
        dirnames[:] = [name for name in dirnames if name not in skipped]
        for name in filenames:
            if name not in skipped:
                path = Path(directory, name)
                try:
                    yield str(path.relative_to(root)), path.lstat().st_size
                except OSError:
                    continue


def check_size(code: CodeDir, limit: int = CODE_LIMIT_BYTES) -> None:
    """Refuse an implicitly chosen code directory over ``limit`` bytes or CODE_LIMIT_FILES files, naming its biggest files."""
    if code.size <= limit and code.files <= CODE_LIMIT_FILES:
        return
    biggest = ", ".join(f"{name} ({megabytes(size)})" for name, size in code.largest)
    held = f"{megabytes(code.size)} in {code.files} files" if code.files <= CODE_LIMIT_FILES else f"more than {CODE_LIMIT_FILES} files"
    raise SpecError(SpecIssue(
        "source_dir",
        f"{code.reason} {code.path} holds {held}, over the {megabytes(limit)} or {CODE_LIMIT_FILES} files a torchrun-style run ships "
        f"to every host without being asked; the biggest: {biggest}",
        "pass large data as a channel (-i train=data/) and read SM_CHANNEL_TRAIN, run from a smaller directory, or name the directory "
        f"to ship it anyway (--source-dir {os.path.relpath(code.path)})",
    ))


def megabytes(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB" if size >= 100 * 1024 else f"{size / 1024:.1f} kB"


def module_file(module: str, code_dir: Path) -> str:
    """``pkg.train`` -> ``pkg/train.py`` (or ``pkg/train/__main__.py``) relative to the code directory."""
    base = Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if (code_dir / candidate).is_file():
            return candidate.as_posix()
    raise SpecError(SpecIssue(
        "entry_point", f"-m {module}: neither {base.with_suffix('.py')} nor {base / '__main__.py'} is in {code_dir}",
        "-m runs a module of the code directory (the current one); run from the directory that holds the package",
    ))


def _counts_on_hosts(scheduler: str) -> bool:
    """Whether the scheduler's processes_per_host takes ``auto`` (its hosts count their own GPUs and CPUs)."""
    try:
        options = scheduler_class(scheduler).options
    except SpecError:
        return False
    return any(option.name == "processes_per_host" and not option.issues("auto") for option in options)


def _runs_here(scheduler: str) -> bool:
    """Whether the scheduler's ranks run on this machine, so that its CPUs are theirs (an unknown name
    is reported by the scheduler option's own check)."""
    try:
        return scheduler_class(scheduler).capabilities.runs_here
    except SpecError:
        return False
