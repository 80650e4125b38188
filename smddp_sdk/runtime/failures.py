"""Failures of ranks as the runtime sees them, on top of the one record type (``specs.failure``).

A rank's failure comes from its error file when the bootstrap wrote one, else from how it died. The
root cause is ``specs.failure.decide``'s: culprits before victims, then the first in time. Ranks the
runtime stopped itself are never root causes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from smddp_sdk.specs.contract import FAILURE_REASON_LIMIT, error_record
from smddp_sdk.specs.failure import FailureRecord, decide, exit_code_of, from_death, from_error_file, render_summary

RankFailure = FailureRecord  # the runtime's name for the one failure record type
_MESSAGE_LIMIT = 300  # keeps host, rank and code inside the 1024 characters SageMaker shows

__all__ = ["RankFailure", "rank_failure", "root_cause", "failure_reason", "console_summary", "exit_code_of"]


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
) -> FailureRecord:
    """Describe a failed rank from its error file when the bootstrap wrote one, else from how it died."""
    found = error_record(error_file)  # the bootstrap's own file, else the one torch's @record wrote
    if found:
        source, record = found
        failure = from_error_file(record, host=host, path=str(source), exit_code=exit_code_of(returncode))
        return failure.replace(rank=rank, local_rank=local_rank, pid=pid, log_tail=log_tail, timestamp=failure.timestamp or observed_at)
    return from_death(host=host, rank=rank, returncode=returncode, observed_at=observed_at, local_rank=local_rank, pid=pid, log_tail=log_tail)


def root_cause(failures: Iterable[FailureRecord]) -> FailureRecord | None:
    verdict = decide(failures)
    return verdict.root if verdict else None


def failure_reason(root: FailureRecord, others: Sequence[FailureRecord] = ()) -> str:
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


def console_summary(root: FailureRecord, others: Sequence[FailureRecord] = ()) -> str:
    """torchrun's layout: other failures first, the root cause last (it is what the eye finds at the end)."""
    return render_summary(root, others)


def _last_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]
