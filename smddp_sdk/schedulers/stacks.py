"""Every rank's stacks as the ranks write them into their hosts' trees, and where each rank is, read from
them: shared by the schedulers that show stacks (``hosttree.stacks`` for local and docker jobs, Slurm's)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from smddp_sdk.specs.call_record import read_call_file
from smddp_sdk.specs.contract import OptMl, rank_call_file_of

_RANK_FILE = re.compile(r"rank-(\d+)\.txt$")


@dataclass(frozen=True)
class RankStack:
    host: str
    rank: int
    text: str  # "" when the rank did not answer in time
    call: str = ""  # the collective it is in, or last began ('all_reduce #41 (SUM, ...)'), if any
    base: str = ""  # its host's /opt/ml tree here, to read the source lines its frames name


def stack_files_of(tree: OptMl, host: str) -> dict[Path, tuple[str, int]]:
    """The stacks files of one host's ranks: path -> (host, rank)."""
    stacks_dir = tree.rank_stacks_file(0).parent
    files = {}
    for path in stacks_dir.glob("rank-*.txt") if stacks_dir.is_dir() else ():
        match = _RANK_FILE.search(path.name)
        if match:
            files[path] = (host, int(match.group(1)))
    return files


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
            text = handle.read()
        stacks.append(RankStack(host, rank, text, read_call_file(rank_call_file_of(path)), str(path.parents[2])))
    return sorted(stacks, key=lambda stack: stack.rank)


# --- where each rank is ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+", re.M)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>\S+)', re.M)
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/smddp_sdk/", "/lib/python3")
_LAUNCH_FRAMES = ("<frozen runpy>", "/smddp_sdk/runtime/bootstrap.py")  # how every rank starts: shown by no stack
_C10D = "/torch/distributed/distributed_c10d.py"
_OPT_ML = "/opt/ml"  # where a rank sees its host's tree when it is bound there
_CODE_DIR = f"{_OPT_ML}/code/"


def threads(text: str) -> list[list[Frame]]:
    """Each thread's frames in a faulthandler dump, innermost first (as it writes them)."""
    return [_frames(block) for block in _THREAD.split(text)[1:]]


def _frames(block: str) -> list[Frame]:
    return [Frame(m["file"], int(m["line"]), m["function"]) for m in _FRAME.finditer(block)]


def _main_block(text: str) -> str:
    """The dump of the thread that runs the script: the one the launcher started (any thread can take the
    signal); the first where none is."""
    blocks = _THREAD.split(text)[1:]
    found = next((block for block in blocks if (frames := _frames(block)) and frames[-1].function == "_run_module_as_main"), blocks[0] if blocks else "")
    return f"Thread{found}" if found else ""


def main_thread(text: str) -> list[Frame]:
    """The frames of the thread that runs the script (``_main_block``)."""
    return _frames(_main_block(text))


def where(stack: RankStack) -> str:
    """Where a rank's script is, in a few words: 'all_reduce #41 (SUM, ...) at train.py:37' in a collective
    (the call's number where the rank wrote it), else the script's line: 'time.sleep(1) at train.py:30'."""
    frames = main_thread(stack.text)
    if not frames:
        return "no Python stack"
    user = next((i for i, frame in enumerate(frames) if not _library(frame.file)), None)
    if user is None:
        return f"{frames[0].function} at {_short(frames[0].file)}:{frames[0].line}"
    at = f"{_short(frames[user].file)}:{frames[user].line}"
    collective = next((frame.function for frame in frames[:user] if frame.file.endswith(_C10D)), "")
    if collective:
        return f"{stack.call if stack.call.split(' ')[0] == collective else collective} at {at}"
    source = _source_line(stack, frames[user])
    return f"{source} at {at}" if source else at


def grouped(stacks: list[RankStack]) -> tuple[list[tuple[str, list[RankStack]]], list[tuple[str, list[RankStack]]]]:
    """(where each group of ranks is, the distinct stacks of the script's thread with the ranks that share
    each), both in rank order: four ranks in one collective are one line and one stack, not four. Helper
    threads (the backend's, the data loader's) differ between ranks from moment to moment, so they do not
    split a group; the stacks files in the job's tree keep every thread."""
    answered = [stack for stack in stacks if stack.text]
    places: dict[str, list[RankStack]] = {}
    texts: dict[str, list[RankStack]] = {}
    for stack in sorted(answered, key=lambda s: s.rank):
        places.setdefault(where(stack), []).append(stack)
        texts.setdefault(_comparable(_main_block(stack.text)), []).append(stack)
    return list(places.items()), list(texts.items())


def ranks_text(stacks: list[RankStack]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2, 5-7'."""
    ranks = sorted(stack.rank for stack in stacks)
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    words = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {words}"


def _comparable(text: str) -> str:
    """A dump without what differs between identical stacks (thread ids) or says nothing (the launch frames)."""
    lines = [line for line in _THREAD.sub("Thread", text).splitlines() if not any(part in line for part in _LAUNCH_FRAMES)]
    return "\n".join(lines).strip("\n")


def _library(path: str) -> bool:
    return path.startswith("<") or any(part in path for part in _LIBRARY_PARTS)


def _short(path: str) -> str:
    return path[len(_CODE_DIR):] if path.startswith(_CODE_DIR) else Path(path).name


def _source_line(stack: RankStack, frame: Frame) -> str:
    """The frame's source line, read here (the rank's /opt/ml is its host's tree)."""
    path = Path(stack.base) / frame.file[len(_OPT_ML) + 1:] if stack.base and frame.file.startswith(f"{_OPT_ML}/") else Path(frame.file)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            line = next((text for number, text in enumerate(handle, 1) if number == frame.line), "")
    except OSError:
        return ""
    line = line.strip()
    return line if len(line) <= 60 else line[:57] + "..."
