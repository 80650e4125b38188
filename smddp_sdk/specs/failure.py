"""One failure record for the whole product, the rule that picks a job's root cause, and its summary.

Ranks (through the bootstrap's error file), runtimes (``output/failures.json`` and the coordinator),
the host supervisor (a runtime or container that died) and every scheduler's ``status`` speak of a
failure with the same ``FailureRecord``; ``decide`` names the root cause and ``render_summary`` prints it
in torchrun's layout. Stdlib only: the node runtime imports it inside any user image.

The root-cause rule (``decide``) follows torch elastic's "first failure in time", with one correction that
matters for collectives: the first *error file* is often written by a victim. When a rank is SIGKILLed,
exits early or hangs, its peers raise within milliseconds ("connection closed", "timed out waiting for
rank 3") and their error files can carry earlier timestamps than the moment anyone saw the culprit go.
So records are ranked by kind first and by time second:

1. culprits: a rank that raised an error of its own, exited non-zero, or died by a signal nobody sent it;
   a runtime or container that died or failed by itself; a host that never joined or vanished;
2. ranks the victims blame, when no culprit record exists: a rank they timed out waiting for (a hang, in or
   outside a collective) or whose exit they saw (an early ``exit 0``) -- named even without an error file;
3. victims: errors that only report a lost peer or a stop from elsewhere;
4. stops: ranks and runtimes stopped because of another failure (never the root cause unless alone).

A job that has seen only victims waits ``SETTLE_SECONDS`` before it stops anyone (``must_stop``): the rank
a victim blames may itself be a victim still waiting for the culprit (a host's leader waits for the hung
rank beside it while the other host times out waiting for the leader), and stopping it at once would
lose the one record that names the culprit. Any culprit record stops the job at once.
"""

from __future__ import annotations

import dataclasses
import re
import signal as signals
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smddp_sdk.specs.contract import FAILURE_REASON_LIMIT, RootCause, number_or_none, parse_root_cause

# Where a record comes from (``FailureRecord.source``).
SOURCE_ERROR_FILE = "error_file"  # the rank's bootstrap wrote output/errors/rank-N.json
SOURCE_EXIT = "exit"  # the runtime saw a rank exit non-zero (or by a signal) without an error file
SOURCE_EARLY_EXIT = "early_exit"  # a rank exited 0 while its peers were still running
SOURCE_RUNTIME = "runtime"  # the runtime itself failed (bad input, setup, a lost peer)
SOURCE_SUPERVISOR = "supervisor"  # the host supervisor saw a runtime or container die
SOURCE_HANG = "hang"  # named by its peers: they timed out waiting for it
SOURCE_STOPPED = "stopped"  # stopped because of another failure, or by a cancel
SOURCE_TIMEOUT = "timeout"  # max_run passed

_MESSAGE_LIMIT = 300
BORDER = "=" * 60
# Errors that only say a peer went away or that the job is stopping: the symptom, not the cause.
_OBSERVED_LOSS = frozenset({"LostPeer", "HostNeverJoined"})
_VICTIM_TYPES = frozenset({"LostCoordinator", "SupervisorGone", "Stopped"})
_VICTIM_TEXT = re.compile(
    r"closed the connection|connection reset|connection refused|broken pipe|connection to .* broke|"
    r"exited before completing|timed out waiting for|did not arrive|did not connect|aborted|"
    r"connections to the other hosts are closed|unusable after an earlier failure|peer .*(gone|exited|closed)|"
    r"Connection closed by peer|NCCL communicator was aborted|socket timed out",
    re.IGNORECASE,
)
SETTLE_SECONDS = 2.0  # longer than the spread of peers' process-group timeouts around one collective


@dataclass(frozen=True)
class PeerRank:
    """A rank a failed collective names as data: its rank and its host ("" for the reporting rank's own
    host). Its text is how collectives name a peer in their messages."""

    rank: int
    host: str = ""

    def __str__(self) -> str:
        return f"rank {self.rank} (host {self.host})" if self.host else f"rank {self.rank} (same host)"

    @classmethod
    def from_json(cls, data: Any) -> PeerRank | None:
        """A peer from its JSON object; None for anything else (records cross processes and versions)."""
        rank = number_or_none(int, data.get("rank")) if isinstance(data, Mapping) else None
        return None if rank is None else cls(rank, str(data.get("host") or ""))


def peers_from_json(items: Any) -> tuple[PeerRank, ...]:
    return tuple(peer for peer in map(PeerRank.from_json, items if isinstance(items, (list, tuple)) else ()) if peer is not None)


@dataclass(frozen=True)
class FailureRecord:
    """One failure of a rank (``rank`` set) or of a host's runtime or container (``rank`` None)."""

    host: str
    rank: int | None
    exit_code: int
    message: str
    traceback: str = ""
    timestamp: float | None = None
    error_type: str = ""
    source: str = ""
    signal: str | None = None  # "SIGKILL" when it died by a signal
    local_rank: int | None = None
    pid: int | None = None
    log_tail: str = ""
    error_file: str = ""
    log_file: str = ""
    # The peers the failure names, as the collective that raised it knew them: ranks whose connection or
    # process went away (``lost``) and ranks it waited for in vain (``awaited``: a hang).
    lost: tuple[PeerRank, ...] = ()
    awaited: tuple[PeerRank, ...] = ()

    @property
    def who(self) -> str:
        return f"{self.host}/rank{self.rank}" if self.rank is not None else f"{self.host}/runtime"

    @property
    def error(self) -> str:
        """``ErrorType: message`` (trimmed so host, rank and code fit SageMaker's 1024 characters)."""
        message = self.message if len(self.message) <= _MESSAGE_LIMIT else self.message[:_MESSAGE_LIMIT] + "..."
        if self.error_type and message:
            return f"{self.error_type}: {message}"
        return self.error_type or message

    @property
    def cause(self) -> RootCause:
        """The first line of output/failure, which names host, rank and code where SageMaker shows it."""
        return RootCause(self.host, self.rank, self.exit_code, self.error)

    @property
    def headline(self) -> str:
        return self.cause.headline

    def summary(self) -> str:
        """One line for messages and ``status``: ``algo-2/rank3 exited with code 1: ValueError: bad``."""
        where = f"{self.host}/rank{self.rank}" if self.rank is not None else self.host
        return f"{where} exited with code {self.exit_code}: {self.error}"

    def replace(self, **changes: Any) -> FailureRecord:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureRecord:
        """Tolerant of extra and missing keys: records cross processes and versions."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        peers = {name: peers_from_json(data.get(name)) for name in ("lost", "awaited")}
        return cls(**{"host": "", "rank": None, "exit_code": 1, "message": "", **known, **peers})


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def from_error_file(data: Mapping[str, Any], *, host: str, path: str = "", exit_code: int | None = None) -> FailureRecord:
    """The record of a rank's bootstrap error file (keys of ``smddp_sdk.runtime.bootstrap``)."""
    return FailureRecord(
        host=str(data.get("host") or host),
        rank=number_or_none(int, data.get("rank")),
        exit_code=int(exit_code if exit_code is not None else data.get("exit_code") or 1),
        message=str(data.get("message") or ""),
        traceback=str(data.get("traceback") or ""),
        timestamp=number_or_none(float, data.get("timestamp")),
        error_type=str(data.get("error_type") or "Error"),
        source=SOURCE_ERROR_FILE,
        local_rank=number_or_none(int, data.get("local_rank")),
        pid=number_or_none(int, data.get("pid")),
        error_file=path,
        lost=peers_from_json(data.get("lost")),
        awaited=peers_from_json(data.get("awaited")),
    )


def from_death(*, host: str, rank: int | None, returncode: int, observed_at: float | None = None, **extra: Any) -> FailureRecord:
    """A process that ended without an error record: by a signal, or with a bare exit code."""
    subject = "the runtime" if rank is None else "the rank"
    name = signal_name(-returncode) if returncode < 0 else None
    if name:
        hint = " (sent by someone else, or the kernel's out-of-memory killer)" if -returncode == signals.SIGKILL else ""
        message, error_type = f"{subject} was killed by {name}{hint}", "Signal"
    else:
        message, error_type = f"{subject} exited with code {returncode} without an error record; see the log tail", "ExitCode"
    return FailureRecord(host, rank, exit_code_of(returncode), message, timestamp=observed_at or time.time(), error_type=error_type, signal=name, **{"source": SOURCE_EXIT, **extra})


# --- a rank's failed collective, carried to its error file --------------------------------------------

_FIRST_FAILED_COLLECTIVE: list[BaseException] = []  # this process's first failed collective that named peers


def remember_failed_collective(error: BaseException) -> None:
    """Keep the first failed collective of this process that names peers (``lost``/``awaited``): torch
    re-raises an error that crossed its C++ (a DDP hook's future) as a bare RuntimeError of the same text,
    and later calls fail as "unusable after an earlier failure: <its text>"; both lose the peers."""
    if not _FIRST_FAILED_COLLECTIVE:
        _FIRST_FAILED_COLLECTIVE.append(error)


def blame_of(exc: BaseException) -> dict[str, list[dict[str, Any]]]:
    """The peers a rank's fatal exception names, as its error file keeps them (``lost``, ``awaited``): those of
    the first exception in its chain that carries peers, else those of this process's first failed collective
    when ``exc`` carries that failure's text; {} when it names none."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    named = [item for item in chain if getattr(item, "lost", ()) or getattr(item, "awaited", ())]
    named += [first for first in _FIRST_FAILED_COLLECTIVE if str(first) and str(first) in str(exc)]
    if not named:
        return {}
    return {name: [dataclasses.asdict(peer) for peer in getattr(named[0], name, ())] for name in ("lost", "awaited")}


# --- the rule ---------------------------------------------------------------------------------------


def is_victim(record: FailureRecord) -> bool:
    """Whether the record only reports someone else's failure (a lost peer, a stop from elsewhere)."""
    if record.source == SOURCE_STOPPED or record.error_type in _VICTIM_TYPES:
        return True
    if record.source in (SOURCE_SUPERVISOR, SOURCE_HANG, SOURCE_TIMEOUT):
        return False
    return bool(record.lost or record.awaited or _VICTIM_TEXT.search(f"{record.error_type}: {record.message}"))


def must_stop(records: Sequence[FailureRecord], first_seen: float, now: float) -> bool:
    """Whether failures first seen at ``first_seen`` (monotonic) should stop the job by ``now`` (an exit with
    code 0 among them is evidence for ``decide``, no failure)."""
    records = [r for r in records if not is_early_exit(r)]
    return bool(records) and (any(not is_victim(r) for r in records) or now - first_seen >= SETTLE_SECONDS)


def is_early_exit(record: FailureRecord) -> bool:
    """A rank that ended with code 0 while its peers ran: the culprit only when they blame it."""
    return record.source == SOURCE_EARLY_EXIT


def blamed_by(record: FailureRecord) -> list[tuple[str, int, bool]]:
    """(host, rank, hung) of every peer a victim's record names: lost, or awaited in vain (hung)."""
    return [(peer.host or record.host, peer.rank, hung) for peers, hung in ((record.lost, False), (record.awaited, True)) for peer in peers]


@dataclass(frozen=True)
class Verdict:
    """The root cause and every other failure, oldest first (the root cause is not among them)."""

    root: FailureRecord
    others: tuple[FailureRecord, ...]


def decide(records: Iterable[FailureRecord], *, early_exits: Iterable[FailureRecord] = ()) -> Verdict | None:
    """The job's root cause among ``records`` (see the module docstring), or None when there are none.

    ``early_exits`` are ranks that ended with code 0 while peers still ran (also taken from ``records``, where
    the runtimes pass them on): not failures by themselves, but the culprit when the victims blame them.
    """
    records = list(records)
    exits = {(r.host, r.rank): r for r in [*early_exits, *filter(is_early_exit, records)]}
    # Early exits are evidence only; a hang named by an earlier decide (a runtime's, written to its
    # failures.json) is a conclusion drawn from fewer records: both are drawn again from the victims here.
    records = [r for r in records if r.source not in (SOURCE_EARLY_EXIT, SOURCE_HANG)]
    # A runtime that saw a host vanish says less than the supervisor that saw how it ended.
    seen_dying = {r.host for r in records if r.source == SOURCE_SUPERVISOR and r.rank is None}
    records = [r for r in records if not (r.error_type in _OBSERVED_LOSS and r.host in seen_dying)]
    if not records:
        return None
    culprits = [r for r in records if not is_victim(r)]
    root = _earliest(culprits) if culprits else _blamed(records, exits) or _earliest(records)
    others = tuple(sorted((r for r in records if r is not root and r.source != SOURCE_STOPPED), key=_time))
    return Verdict(root, others)


def _blamed(records: Sequence[FailureRecord], early_exits: Mapping[tuple[str, int | None], FailureRecord]) -> FailureRecord | None:
    """The rank most victims blame that has no record of its own, as a record of what happened to it."""
    failed = {(r.host, r.rank) for r in records}
    votes: Counter[tuple[str, int]] = Counter()
    hung: set[tuple[str, int]] = set()
    first_seen: dict[tuple[str, int], float] = {}
    for record in records:
        for host, rank, waited in blamed_by(record):
            peer = (host, rank)
            if peer in failed:
                continue  # it failed too; its own record says more
            votes[peer] += 1
            first_seen[peer] = min(first_seen.get(peer, float("inf")), _time(record))
            if waited:
                hung.add(peer)
    if not votes:
        return None
    (host, rank), _ = min(votes.items(), key=lambda item: (-item[1], first_seen[item[0]], item[0]))
    if (host, rank) in early_exits:
        early = early_exits[(host, rank)]
        return early.replace(message=f"the rank exited with code 0 while its peers still needed it ({early.message})" if early.message else
                             "the rank exited with code 0 while its peers were still in a collective with it", error_type="EarlyExit")
    if (host, rank) in hung:
        return FailureRecord(host, rank, 1, "the rank stopped making progress: its peers timed out waiting for it in a collective "
                             "(hung inside or outside a collective, or on another code path)", timestamp=first_seen[(host, rank)],
                             error_type="Hang", source=SOURCE_HANG)
    return FailureRecord(host, rank, 1, "its peers lost it in a collective and it left no error record", timestamp=first_seen[(host, rank)],
                         error_type="LostRank", source=SOURCE_HANG)


def _earliest(records: Sequence[FailureRecord]) -> FailureRecord:
    # At equal times a rank's own record beats its runtime's, and a record with a signal beats one without.
    return min(records, key=lambda r: (_time(r), r.rank is None, r.signal is None))


def _time(record: FailureRecord) -> float:
    return record.timestamp if record.timestamp is not None else float("inf")


# --- the failure file (output/failure, SageMaker's FailureReason) -----------------------------------

EXIT_CODE_LABEL = "ExitCode"
ERROR_MESSAGE_LABEL = "ErrorMessage"
OTHER_FAILURES_LABEL = "Other failures"
# Read back from our own text and, as far as they say it, other toolkits' (SageMaker prefixes "AlgorithmError: ").
_HOST = re.compile(r"\b(algo-\d+)(?:/rank(\d+))?")
_EXIT_CODE = re.compile(r"exit(?:ed with)?[ _]?code[:=]?\s*(\d+)", re.IGNORECASE)
_ERROR_MESSAGE = re.compile(rf"^(?:AlgorithmError: )?{ERROR_MESSAGE_LABEL} (.+)$", re.MULTILINE)


def failure_reason(root: FailureRecord, others: Sequence[FailureRecord] = ()) -> str:
    """The text of output/failure: host, rank, exit code and error within the first 1024 characters
    (all SageMaker shows), then the traceback's tail and the other failures."""
    details = root.traceback.strip() or root.log_tail.strip()
    lines = [
        root.cause.line,
        f"{EXIT_CODE_LABEL} {root.exit_code}",
        f"{ERROR_MESSAGE_LABEL} {root.error}".rstrip(),
    ]
    if details:
        lines += ["", _last_chars(details, FAILURE_REASON_LIMIT // 2)]
    others = [f for f in others if f != root and not is_early_exit(f)]
    if others:
        lines += ["", f"{OTHER_FAILURES_LABEL} ({len(others)}):"] + [f"  {f.headline}" for f in others]
    return "\n".join(lines) + "\n"


def parse_failure_reason(reason: str, *, timestamp: float | None = None) -> FailureRecord:
    """The root cause named by a failure reason: ``failure_reason``'s text, or another toolkit's as far
    as it names a host (``algo-2``, ``algo-2/rank3``), an exit code and an ``ErrorMessage``."""
    host, rank = _where(reason)
    code = _EXIT_CODE.search(reason)
    message = _ERROR_MESSAGE.search(reason)
    return FailureRecord(
        host=host,
        rank=rank,
        exit_code=int(code.group(1)) if code else 1,
        message=message.group(1).strip() if message else reason.strip(),
        traceback=_details(reason),
        timestamp=timestamp,
    )


def _where(reason: str) -> tuple[str, int | None]:
    """Host and rank: ``rank 3 on host algo-2`` (our runtime), ``algo-2/rank3``, or a bare ``algo-2``."""
    cause = parse_root_cause(reason)
    if cause is not None:
        return cause.host, cause.rank
    short = _HOST.search(reason)
    if short:
        return short.group(1), int(short.group(2)) if short.group(2) else None
    return "", None


def _details(reason: str) -> str:
    """The block after the headline lines, up to the list of other failures."""
    _, blank, rest = reason.partition("\n\n")
    return rest.split(f"\n{OTHER_FAILURES_LABEL}", 1)[0].strip() if blank else ""


def _last_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


# --- the summary -------------------------------------------------------------------------------------


def render_summary(root: FailureRecord, others: Sequence[FailureRecord] = (), *, title: str = "Job failed", hints: Sequence[str] = ()) -> str:
    """torchrun's layout: other failures first, the root cause last (it is what the eye finds at the end)."""
    blocks = [BORDER, title, BORDER]
    others = [f for f in others if f != root and not is_early_exit(f)]
    if others:
        blocks.append("Other failures:")
        blocks += [f"  {f.summary()}" for f in others[-20:]]
        blocks.append("-" * 60)
    blocks += ["Root cause (first failure in time):", *_describe(root), BORDER, *hints]
    return "\n".join(blocks)


def _describe(failure: FailureRecord) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(failure.timestamp)) if failure.timestamp else "<unknown>"
    local = f" (local_rank: {failure.local_rank})" if failure.local_rank is not None else ""  # unknown for a rank named only by its peers
    rank = f"{failure.rank}{local}" if failure.rank is not None else "<runtime, no rank>"
    rows = [
        f"  time      : {when}",
        f"  host      : {failure.host}",
        f"  rank      : {rank}",
        f"  exit code : {failure.exit_code}" + (f" ({failure.signal})" if failure.signal else ""),
        f"  error     : {failure.error}",
    ]
    if failure.error_file:
        rows.append(f"  error_file: {failure.error_file}")
    body = _shortened([line for line in (failure.traceback.strip() or failure.log_tail.strip()).splitlines() if line.strip()])
    if body:
        rows += [f"  traceback : {body[0]}", *(" " * 14 + line for line in body[1:])]
    return rows


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+')
_LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python3", "<frozen")


def _shortened(body: list[str], keep: int = 20) -> list[str]:
    """The last ``keep`` lines, and above them the user's innermost frame (the deepest one outside
    installed packages and the standard library) when the tail has none: a long FSDP or transformers
    traceback ends in library code."""
    if len(body) <= keep:
        return body
    tail = body[-keep:]
    users = [i for i, line in enumerate(body) if (m := _FRAME.match(line)) and not any(part in m["file"] for part in _LIBRARY_PARTS)]
    if not users or users[-1] >= len(body) - keep:
        return [f"... ({len(body) - keep} lines above)", *tail]
    start = users[-1]
    above = body[:start] if start <= 1 else [f"... ({start} lines above)"]  # "Traceback (most recent call last):"
    return [*above, *body[start:start + 2], f"... ({len(body) - keep - start - 2} lines)", *tail]


