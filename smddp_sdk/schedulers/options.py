"""Scheduler options, each declared once (torchx's ``runopts``): name, type, default, help and check.

A scheduler lists its options as ``options = SchedulerOptions(...)`` on its class. From that one list
come the constructor's checks and defaults (``Scheduler.__init__``), the job file's checks
(``config.job_file``), ``smddp-launch options`` and the scheduler reference in the docs.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from smddp_sdk.errors import SpecError, SpecIssue, did_you_mean
from smddp_sdk.specs import limits

# What is wrong with a value, or "" when nothing is: (value, issue path) -> issues.
Check = Callable[[Any, str], list[SpecIssue]]


@dataclass(frozen=True)
class Option:
    """One scheduler option. ``code_only`` options are Python objects (clients, callbacks) that a job file
    cannot hold; ``convert`` turns a checked value (or the default) into what the scheduler keeps."""

    name: str
    type: str
    default: Any
    help: str
    check: Check | None = None
    convert: Callable[[Any], Any] | None = None
    code_only: bool = False

    def issues(self, value: Any) -> list[SpecIssue]:
        if self.check is None or (value is None and self.default is None):
            return []
        return self.check(value, f"scheduler_options.{self.name}")

    def value(self, given: Mapping[str, Any]) -> Any:
        value = given.get(self.name, self.default)
        return self.convert(value) if self.convert is not None else value


@dataclass(frozen=True)
class SchedulerOptions:
    """The options one scheduler accepts, in the order ``smddp-launch options`` lists them."""

    scheduler: str = ""
    declared: tuple[Option, ...] = field(default=())
    not_taken: Mapping[str, str] = field(default_factory=dict)  # names it refuses with what to do: retired, or only other schedulers'

    @classmethod
    def of(cls, scheduler: str, *declared: Option, not_taken: Mapping[str, str] | None = None) -> SchedulerOptions:
        return cls(scheduler, declared, dict(not_taken or {}))

    def __iter__(self) -> Iterator[Option]:
        return iter(self.declared)

    def names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.declared)

    def issues(self, given: Mapping[str, Any], *, unknown: bool = True) -> list[SpecIssue]:
        """Every problem at once: unknown names first (with ``unknown``), then bad values in declared order."""
        return [*(self._unknown_names(given, self.names()) if unknown else []), *self._value_issues(given)]

    def file_issues(self, given: Mapping[str, Any]) -> list[SpecIssue]:
        """What a job file or user config may not say: the issues above, and Python-only options."""
        return [*self.name_issues(given), *self._value_issues(given)]

    def name_issues(self, given: Mapping[str, Any]) -> list[SpecIssue]:
        """Only the names a file may not use (for another scheduler's section, whose values are its own business until it runs)."""
        code_only = [
            SpecIssue(f"scheduler_options.{option.name}", "can only be given from Python (it is an object, not a value)") for option in self.declared if option.code_only and option.name in given
        ]
        return [*self._unknown_names(given, tuple(option.name for option in self.declared if not option.code_only)), *code_only]

    def _unknown_names(self, given: Mapping[str, Any], expected: tuple[str, ...]) -> list[SpecIssue]:
        """Names not declared, each with a did-you-mean among ``expected`` (what the caller can give) or their list."""
        declared = self.names()
        listed = f"expected one of {', '.join(expected)}" if expected else f"the {self.scheduler} scheduler takes no options"
        return [
            SpecIssue(f"scheduler_options.{key}", f"is not an option of the {self.scheduler} scheduler", self.not_taken[key]) if key in self.not_taken
            else SpecIssue(f"scheduler_options.{key}", f"unknown option of the {self.scheduler} scheduler", did_you_mean(key, expected) or listed)
            for key in given if key not in declared
        ]

    def _value_issues(self, given: Mapping[str, Any]) -> list[SpecIssue]:
        return [issue for option in self.declared if option.name in given for issue in option.issues(given[option.name])]

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Checked values with defaults filled in and converted; raises SpecError with every problem."""
        issues = self.issues(given)
        if issues:
            raise SpecError(issues)
        return {option.name: option.value(given) for option in self.declared}


# --- checks ------------------------------------------------------------------------------------


def boolean(value: Any, path: str) -> list[SpecIssue]:
    return [] if isinstance(value, bool) else [SpecIssue(path, f"must be true or false, got {value!r}")]


def seconds(value: Any, path: str) -> list[SpecIssue]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return [SpecIssue(path, f"must be a number of seconds >= 0, got {value!r}")]
    return []


def is_text(value: Any, path: str) -> list[SpecIssue]:
    return [] if isinstance(value, str) else [SpecIssue(path, f"must be text, got {value!r}")]


def path_like(value: Any, path: str) -> list[SpecIssue]:
    return [] if isinstance(value, (str, os.PathLike)) else [SpecIssue(path, f"must be a path, got {value!r}")]


def one_of(*choices: str) -> Check:
    def check(value: Any, path: str) -> list[SpecIssue]:
        if value in choices:
            return []
        return [SpecIssue(path, f"must be one of {', '.join(choices)}, got {value!r}", did_you_mean(str(value), choices))]

    return check


def matching(pattern: str, what: str) -> Check:
    def check(value: Any, path: str) -> list[SpecIssue]:
        return [] if re.fullmatch(pattern, str(value)) else [SpecIssue(path, f"must be {what}, got {value!r}")]

    return check


def absolute_path(default: Callable[[], Path]) -> Callable[[Any], Path]:
    """A path option's value: the given path (``~`` expanded) or ``default()``, made absolute."""
    return lambda value: Path(value).expanduser().absolute() if value else default().expanduser().absolute()


# --- options several schedulers share ------------------------------------------------------------

PROCESSES_PER_HOST = Option("processes_per_host", "int", None, "ranks per host (default: the instance type's GPU count, else 1)", check=limits.processes_per_host_issues)
RETRY_SCRIPT_ERRORS = Option("retry_script_errors", "bool", False, "with max_retry_attempts, also retry a job whose script failed (SageMaker retries only its own failures; torchrun's --max-restarts)", check=boolean)
WARM_RESTART = Option("warm_restart", "bool", False, "keep a standby runtime per host, its ranks started ahead with torch imported, so a retry or an interruption restarts in seconds (docs/resuming.md)", check=boolean)
STOP_GRACE_PERIOD = Option("stop_grace_period", "float", 10.0, "seconds between SIGTERM and SIGKILL on cancel", check=seconds, convert=float)


def interrupt_times(value: Any) -> tuple[float, ...] | None:
    """``interrupt_after`` as seconds since the job's start, sorted: a number, a list of numbers, or
    ``random:LO-HI`` (one time drawn now, so the dry run shows it); None when the value is none of these."""
    if value is None:
        return ()
    if isinstance(value, str):
        drawn = re.fullmatch(r"random:(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)", value.strip())
        low, high = (float(drawn[1]), float(drawn[2])) if drawn else (1.0, 0.0)
        return (round(random.uniform(low, high), 1),) if low <= high else None
    times = value if isinstance(value, (list, tuple)) else [value]
    if not times or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf for t in times):
        return None
    return tuple(sorted(float(t) for t in times))


def _interrupt_after_issues(value: Any, path: str) -> list[SpecIssue]:
    if interrupt_times(value) is not None:
        return []
    return [SpecIssue(path, f"must be seconds after the start (a number > 0), a list of them, or random:LO-HI, got {value!r}", "e.g. 60, [60, 150] or random:30-120")]


INTERRUPT_AFTER = Option(
    "interrupt_after",
    "seconds, list or random:LO-HI",
    None,
    "rehearse spot interruptions (with use_spot_instances): every instance is reclaimed this many seconds after the job started, once at each time of a list, or once at a random time between LO and HI seconds",
    check=_interrupt_after_issues,
    convert=interrupt_times,
)


def job_root(description: str, default: Callable[[], Path]) -> Option:
    return Option("job_root", "path", None, description, check=path_like, convert=absolute_path(default))


def with_default(option: Option, default: Any, description: str | None = None) -> Option:
    """A shared option with this scheduler's own default (and help)."""
    return replace(option, default=default, help=description or option.help)
