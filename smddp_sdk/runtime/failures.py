"""Failures of ranks as the runtime sees them, on top of the one record type (``specs.failure``).

A rank's failure comes from its error file when the bootstrap wrote one, else from how it died. The
root cause is ``specs.failure.decide``'s: culprits before victims, then the first in time. Ranks the
runtime stopped itself are never root causes. The failure file's text (``failure_reason``) and the
console summary (``render_summary``) are ``specs.failure``'s, shared with every scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from smddp_sdk.specs.contract import error_record
from smddp_sdk.specs.failure import FailureRecord, decide, exit_code_of, from_death, from_error_file

__all__ = ["rank_failure", "root_cause"]


def rank_failure(*, host: str, rank: int, local_rank: int, pid: int, returncode: int, error_file: Path, log_tail: str, observed_at: float | None = None) -> FailureRecord:
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
