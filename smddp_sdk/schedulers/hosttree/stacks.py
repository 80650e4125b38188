"""Where every rank of a running local or docker job is (``smddp-launch stacks NAME``).

The caller leaves a request file in the job directory; the job's supervisor sends ``STACKS_SIGNAL`` to
every host's runtime, which passes it on to its ranks; each rank appends all its threads' stacks to its
stacks file in its host's /opt/ml tree (``smddp_sdk.runtime.stacks``). The caller prints what was added.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.specs.contract import STACKS_SIGNAL, OptMl

REQUEST_FILE = "stacks-requested"
SIGNAL_NAME = STACKS_SIGNAL.name
_RANK_FILE = re.compile(r"rank-(\d+)\.txt$")


@dataclass(frozen=True)
class RankStack:
    host: str
    rank: int
    text: str  # "" when the rank did not answer in time


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
    """Every rank's stacks file: path -> (host, rank)."""
    files = {}
    for host_dir in sorted(p for p in job_dir.iterdir() if p.is_dir()):
        stacks_dir = OptMl(host_dir).rank_stacks_file(0).parent
        for path in stacks_dir.glob("rank-*.txt") if stacks_dir.is_dir() else ():
            match = _RANK_FILE.search(path.name)
            if match:
                files[path] = (host_dir.name, int(match.group(1)))
    return files


def collect(job_dir: Path, timeout: float = 10.0, settle: float = 0.3) -> list[RankStack]:
    """Ask for every rank's stacks and return what each rank wrote, by rank."""
    files = stack_files(job_dir)
    before = sizes(files)
    request(job_dir)
    stacks = answers(files, before, timeout, settle)
    (job_dir / REQUEST_FILE).unlink(missing_ok=True)
    return stacks


def sizes(files: dict[Path, tuple[str, int]]) -> dict[Path, int]:
    """How much each stacks file holds before a request (what a rank writes after it is its answer)."""
    return {path: path.stat().st_size for path in files}


def answers(files: dict[Path, tuple[str, int]], before: dict[Path, int], timeout: float, settle: float, every: bool = True) -> list[RankStack]:
    """What each rank wrote since ``before``, once every rank answered (``every``) or, without ``every``,
    once some did and nothing was added for ``settle`` seconds (ranks that ended never answer)."""
    deadline = time.monotonic() + timeout
    last, last_change = dict(before), time.monotonic()
    while time.monotonic() < deadline:
        now = sizes(files)
        if now != last:
            last, last_change = now, time.monotonic()
        answered = [now[path] > size for path, size in before.items()]
        quiet = time.monotonic() - last_change >= settle
        if (all(answered) if every else any(answered) and quiet) or not answered:
            break
        time.sleep(0.1)
    time.sleep(settle if every else 0)  # a rank with many threads may still be writing
    stacks = []
    for path, (host, rank) in files.items():
        with open(path, encoding="utf-8", errors="replace") as handle:
            handle.seek(before[path])
            stacks.append(RankStack(host, rank, handle.read()))
    return sorted(stacks, key=lambda stack: stack.rank)
