"""Where every rank of a running local or docker job is (``smddp-launch stacks NAME``).

The caller leaves a request file in the job directory; the job's supervisor sends ``STACKS_SIGNAL`` to
every host's runtime, which passes it on to its ranks; each rank appends all its threads' stacks to its
stacks file in its host's /opt/ml tree (``smddp_sdk.runtime.stacks``). The caller prints what was added.
"""

from __future__ import annotations

from pathlib import Path

from smddp_sdk.schedulers.stacks import RankStack, answers, sizes, stack_files_of
from smddp_sdk.specs.contract import STACKS_SIGNAL, OptMl

REQUEST_FILE = "stacks-requested"
SIGNAL_NAME = STACKS_SIGNAL.name


def request(job_dir: Path) -> None:
    (job_dir / REQUEST_FILE).touch()


def take_request(job_dir: Path) -> bool:
    """For the supervisor: True once per request."""
    try:
        (job_dir / REQUEST_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def stack_files(job_dir: Path) -> dict[Path, tuple[str, int]]:
    """Every rank's stacks file of a host-tree job (a tree per host, named after it): path -> (host, rank)."""
    files = {}
    for host_dir in sorted(p for p in job_dir.iterdir() if p.is_dir()):
        files.update(stack_files_of(OptMl(host_dir), host_dir.name))
    return files


def collect(job_dir: Path, timeout: float = 10.0, settle: float = 0.3) -> list[RankStack]:
    """Ask for every rank's stacks and return what each rank wrote, by rank."""
    files = stack_files(job_dir)
    before = sizes(files)
    request(job_dir)
    stacks = answers(files, before, timeout, settle)
    (job_dir / REQUEST_FILE).unlink(missing_ok=True)
    return stacks
