"""One exception tree and one exit-code table for the whole product.

Every user-facing failure is a ``SmddpError`` carrying the process exit code the CLI uses, so the
estimator, the CLI and the runtime agree on what each kind of failure means.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_SPEC = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130


class SmddpError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code: int = EXIT_JOB_FAILED


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a job description, located by a dotted path such as ``distribution.mpi.enabled``."""

    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"


class SpecError(SmddpError, ValueError):
    """The job description is invalid; lists every problem found, not just the first."""

    exit_code = EXIT_SPEC

    def __init__(self, issues: Sequence[SpecIssue] | SpecIssue | str) -> None:
        if isinstance(issues, str):
            issues = [SpecIssue("", issues)]
        elif isinstance(issues, SpecIssue):
            issues = [issues]
        self.issues: list[SpecIssue] = list(issues)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.issues) == 1:
            return str(self.issues[0])
        lines = [f"{len(self.issues)} problems in the job description:"]
        lines += [f"  - {issue}" for issue in self.issues]
        return "\n".join(lines)


class ContractError(SmddpError):
    """A file of the SageMaker training contract (/opt/ml) is missing or malformed."""

    exit_code = EXIT_SPEC


class UnavailableError(SmddpError):
    """Something the job needs is not available here: a Docker engine, AWS credentials, an image."""

    exit_code = EXIT_UNAVAILABLE


class NotOfferedError(SmddpError, NotImplementedError):
    """A SageMaker SDK feature (v2's, or v3's with ``sdk="v3"``) this project does not offer; the message
    says what to use instead."""

    exit_code = EXIT_SPEC

    def __init__(self, feature: str, instead: str, sdk: str = "v2") -> None:
        super().__init__(f"{feature} is a SageMaker SDK {sdk} feature smddp-sdk does not offer; {instead}")
        self.feature = feature
        self.instead = instead


class NotOfferedAttributeError(NotOfferedError, AttributeError):
    """A v2 method or attribute that is not offered: ``hasattr()`` says False, using it says why."""


class JobFailedError(SmddpError):
    """The job ran and failed (or was cancelled). ``exit_code`` is always 1: a rank's own code 2 or 3
    must not read as "bad job file" or "unavailable". The rank's code is ``rank_exit_code`` (None when
    no rank is to blame) and is named in the message and in ``status``."""

    exit_code = EXIT_JOB_FAILED

    def __init__(self, message: str, rank_exit_code: int | None = None, failure: object = None) -> None:
        super().__init__(message)
        self.rank_exit_code = rank_exit_code
        self.failure = failure


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ``did you mean 'x'?`` hint for a misspelt name, or "" when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""
