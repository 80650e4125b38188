"""Failures of ranks: what each one was, which is the root cause, and how to tell the user.

The root cause is the failure with the smallest timestamp (torchrun's rule): the rank's own error
file time when it wrote one, else the time the runtime saw it exit. Ranks stopped by the runtime are
never root causes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smddp_sdk.specs.contract import FAILURE_REASON_LIMIT, RootCause, error_record

_BORDER = "=" * 60
_MESSAGE_LIMIT = 300  # keeps host, rank and code inside the 1024 characters SageMaker shows


@dataclass(frozen=True)
class RankFailure:
    host: str
    rank: int | None  # None: the runtime itself failed (bad input, a signal, a lost peer)
    exit_code: int
    error_type: str
    message: str
    timestamp: float
    local_rank: int | None = None
    pid: int | None = None
    traceback: str = ""
    log_tail: str = ""
    error_file: str = ""

    @property
    def who(self) -> str:
        return f"{self.host}/rank{self.rank}" if self.rank is not None else f"{self.host}/runtime"

    @property
    def cause(self) -> RootCause:
        message = self.message if len(self.message) <= _MESSAGE_LIMIT else self.message[:_MESSAGE_LIMIT] + "..."
        error = f"{self.error_type}: {message}" if message else self.error_type
        return RootCause(self.host, self.rank, self.exit_code, error)

    @property
    def headline(self) -> str:
        return self.cause.headline

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankFailure:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def rank_failure(
    *,
    host: str,
    rank: int,
    local_rank: int,
    pid: int,
    returncode: int,
    error_file: Path,
    log_tail: str,
    observed_at: float | None = None,
) -> RankFailure:
    """Describe a failed rank from its error record (the bootstrap's, else torch's ``@record`` file), else
    from how it died."""
    found = error_record(error_file)
    code = exit_code_of(returncode)
    if found:
        source, record = found
        return RankFailure(
            host=host, rank=rank, local_rank=local_rank, pid=pid, exit_code=code,
            error_type=str(record.get("error_type") or "Error"), message=str(record.get("message") or ""),
            traceback=str(record.get("traceback") or ""),
            timestamp=float(record.get("timestamp") or observed_at or time.time()),
            log_tail=log_tail, error_file=str(source),
        )
    error_type, message = _death_description(returncode)
    return RankFailure(
        host=host, rank=rank, local_rank=local_rank, pid=pid, exit_code=code, error_type=error_type,
        message=message, timestamp=observed_at or time.time(), log_tail=log_tail,
    )


def _death_description(returncode: int) -> tuple[str, str]:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (often the kernel's out-of-memory killer)" if -returncode == signal.SIGKILL else ""
        return "Signal", f"killed by {name}{hint}"
    return "ExitCode", f"exited with code {returncode} without an error record; see the log tail"


def root_cause(failures: Iterable[RankFailure]) -> RankFailure | None:
    ordered = sorted(failures, key=lambda f: f.timestamp)
    return ordered[0] if ordered else None


def failure_reason(root: RankFailure, others: Sequence[RankFailure] = ()) -> str:
    """The text of output/failure: host, rank, exit code and error within the first 1024 characters."""
    details = root.traceback.strip() or root.log_tail.strip()
    lines = [
        root.cause.line,
        f"ExitCode {root.exit_code}",
        f"ErrorMessage {root.error_type}: {root.message[:_MESSAGE_LIMIT]}".rstrip(": "),
    ]
    if details:
        lines += ["", _last_chars(details, FAILURE_REASON_LIMIT // 2)]
    others = [f for f in others if f != root]
    if others:
        lines += ["", f"Other failures ({len(others)}):"] + [f"  {f.headline}" for f in others]
    return "\n".join(lines) + "\n"


def console_summary(root: RankFailure, others: Sequence[RankFailure] = ()) -> str:
    """torchrun's layout: other failures first, the root cause last (it is what the eye finds at the end)."""
    blocks = [_BORDER, "Job failed", _BORDER]
    for failure in [f for f in others if f != root]:
        blocks += ["Other failure:", *_describe(failure), "-" * 60]
    blocks += ["Root Cause (first observed failure):", *_describe(root), _BORDER]
    return "\n".join(blocks)


def _describe(failure: RankFailure) -> list[str]:
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(failure.timestamp))
    rows = [
        f"  time      : {when}",
        f"  host      : {failure.host}",
        f"  rank      : {failure.rank} (local_rank: {failure.local_rank})",
        f"  exitcode  : {failure.exit_code} (pid: {failure.pid})",
        f"  error_file: {failure.error_file or '<none>'}",
    ]
    body = failure.traceback.strip() or (f"{failure.error_type}: {failure.message}\n" + failure.log_tail).strip()
    return rows + ["  traceback :"] + [f"    {line}" for line in body.splitlines()[-40:]]


def _last_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
