"""Goodput: how much of a job's time trained, and what each recovery from a fault cost. Pure (stdlib only).

The marks come from the job directory, the one record of a job: each attempt's entry in ``state.json``
(local and docker: the supervisor writes ``started``, ``ended``, ``outcome`` and the marks below; Slurm: the
batch script's ``attempts.jsonl``) and each host's ``output/events.jsonl``, where rank 0's smddp process
group notes ``process_group_formed`` (``init_process_group`` returned) and ``first_collective`` (``specs.events``:
the file and the event format of docs/resuming.md's recovery phases). The rule:

- **training again** is the script's first collective after its start (``first_collective``): by then it
  imported torch, joined the process group and, as resuming scripts do, loaded its state. A script whose
  first collective was not noted (no smddp group) has none: what depends on it is unknown (None);
- an attempt **trains** from its first collective until it ends, or until its ``fault`` when one ended it;
- a fault **loses the work since the last checkpoint**: ``redone`` = ``fault`` - the newest checkpoint file
  the attempt wrote (its modification time; the attempt's first collective when it wrote none after it). A
  checkpoint written after the fault (on SIGTERM, before the hosts stopped) loses nothing;
- **productive** time is every attempt's training less its redone work; **goodput** is productive time over
  the job's wall time (its start to its end, or to now while it runs);
- a **recovery** runs from a fault to the next attempt's first collective, in the phases of ``PHASES``
  (named as docs/resuming.md names the recovery events that bound them):

  ============== ==================================================================================
  ``detect``     the fault -> the job noticed it (``fault``): a host's runtime ended, or the
                 supervisor stopped the hosts (an interruption is noticed as it happens)
  ``stop``       noticed -> every host stopped and the last checkpoint pass done: the attempt ended
                 (``restart``)
  ``restart``    the attempt ended -> the next attempt's hosts started (``hosts_started``): waiting
                 for capacity, archiving the attempt, restoring the checkpoints onto every host
  ``cold_start`` hosts started -> the process group formed (``process_group_formed``): the script's
                 start, torch import, rendezvous and mesh
  ``restore``    the process group formed -> training again: the script loads its state
  ============== ==================================================================================

  A phase whose marks are missing is None (shown as unknown), never guessed.

- a host **replaced alone** (``survive_host_loss``: the others trained on) is a recovery inside an attempt,
  from its ``fault`` (the lost host's runtime ended) to training again (the replaced ranks' ``first_step``),
  in the phases of ``REPLACEMENT_PHASES``; it redoes no completed step, and its total is not productive:

  ============== ==================================================================================
  ``detect``     the fault -> the supervisor noticed it and started the host again (``peer_lost``)
  ``rejoin``     noticed -> the group re-formed with the new ranks (``group_reformed``): the host's
                 start (warm from a standby, or cold) and the new rendezvous
  ``transfer``   re-formed -> every rank holds the state sent by a survivor (``state_restored``),
                 then the interrupted step runs again (``first_step``)
  ============== ==================================================================================
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("detect", "stop", "restart", "cold_start", "restore")
REPLACEMENT_PHASES = ("detect", "rejoin", "transfer")


def event_times(texts: Iterable[str], event: str) -> list[float]:
    """The times of ``event`` in the hosts' event files, sorted (bad lines are skipped: a container wrote them)."""
    found = []
    for text in texts:
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and item.get("event") == event and isinstance(item.get("time"), (int, float)):
                found.append(float(item["time"]))
    return sorted(found)


def first_between(times: Sequence[float], start: float, end: float | None) -> float | None:
    """The first of ``times`` within an attempt (from ``start`` up to ``end``, or on while it runs)."""
    return next((when for when in times if when >= start and (end is None or when <= end)), None)


@dataclass(frozen=True)
class AttemptMarks:
    """What the job directory knows of one attempt (seconds since the epoch; None: not recorded)."""

    attempt: int
    started: float  # the attempt began (its hosts were about to start)
    ended: float | None = None  # every host stopped; None while it runs
    outcome: str = ""  # the secondary status it ended in: Restarting, Interrupted, Completed, Failed, Stopped
    hosts_started: float | None = None  # its hosts were started (its Training transition)
    process_group_formed: float | None = None  # rank 0's init_process_group returned
    first_collective: float | None = None  # the script's first collective: training again
    fault: float | None = None  # the fault that ended it (None: it ended by itself)
    detected: float | None = None  # the job noticed the fault
    last_checkpoint: float | None = None  # the newest checkpoint file it wrote

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> AttemptMarks:
        def number(key: str) -> float | None:
            value = item.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(int(item.get("attempt", 1)), number("started") or 0.0, number("ended"), str(item.get("outcome", "")),
                   number("hosts_started"), number("process_group_formed"), number("first_collective"), number("fault"),
                   number("detected"), number("last_checkpoint"))

    def redone(self) -> float | None:
        """Seconds of training this attempt's fault threw away (0 without a fault)."""
        if self.fault is None:
            return 0.0
        if self.first_collective is None:
            return None
        saved = max(self.first_collective, self.last_checkpoint or self.first_collective)
        return max(0.0, self.fault - saved)

    def trained(self, now: float) -> float | None:
        """Seconds from the first collective to the fault, the end, or now."""
        if self.first_collective is None:
            return None
        until = self.fault if self.fault is not None else self.ended if self.ended is not None else now
        return max(0.0, until - self.first_collective)


@dataclass(frozen=True)
class Recovery:
    """From the fault that ended ``attempt`` until the next attempt trained again; None: not recorded."""

    attempt: int
    outcome: str
    detect: float | None
    stop: float | None
    restart: float | None
    cold_start: float | None
    restore: float | None
    total: float | None  # the fault -> training again
    redone: float | None  # the training since the last checkpoint, lost to the fault

    def phases(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in PHASES}


@dataclass(frozen=True)
class Replacement:
    """A host replaced alone while the others trained on (seconds since the epoch; None: not recorded)."""

    attempt: int
    host: str
    fault: float | None = None  # the lost host's runtime ended
    detected: float | None = None  # the supervisor started it again
    reformed: float | None = None  # the last rank's ``group_reformed`` of this re-formation
    training: float | None = None  # the first ``first_step`` of the replaced ranks

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> Replacement:
        def number(key: str) -> float | None:
            value = item.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(int(item.get("attempt", 1)), str(item.get("host", "")), number("fault"), number("detected"), number("reformed"), number("training"))

    def phases(self) -> dict[str, float | None]:
        return {"detect": _span(self.fault, self.detected), "rejoin": _span(self.detected, self.reformed), "transfer": _span(self.reformed, self.training)}

    @property
    def total(self) -> float | None:
        return _span(self.fault, self.training)


@dataclass(frozen=True)
class AttemptGoodput:
    attempt: int
    outcome: str
    trained: float | None
    redone: float | None
    productive: float | None


@dataclass(frozen=True)
class Goodput:
    """A job's goodput and its recoveries, as ``status`` shows them (seconds; ``ratio`` from 0 to 1)."""

    wall: float
    productive: float | None
    ratio: float | None
    attempts: tuple[AttemptGoodput, ...] = ()
    recoveries: tuple[Recovery, ...] = ()
    replacements: tuple[Replacement, ...] = ()


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(0.0, end - start)


def recovery(faulted: AttemptMarks, following: AttemptMarks | None) -> Recovery:
    """The phases from ``faulted``'s fault until ``following`` trained (None where a mark is missing)."""
    started = following.hosts_started if following else None
    formed = following.process_group_formed if following else None
    first = following.first_collective if following else None
    return Recovery(
        faulted.attempt, faulted.outcome,
        detect=_span(faulted.fault, faulted.detected),
        stop=_span(faulted.detected, faulted.ended),
        restart=_span(faulted.ended, started),
        cold_start=_span(started, formed),
        restore=_span(formed, first),
        total=_span(faulted.fault, first),
        redone=faulted.redone(),
    )


def compute(attempts: Sequence[AttemptMarks], *, started: float, ended: float | None, now: float | None = None,
            replacements: Sequence[Replacement] = ()) -> Goodput:
    """The goodput of a job that began at ``started`` (and ended at ``ended``, or runs) from its attempts,
    oldest first, and its hosts replaced alone, by the rule of this module's docstring."""
    now = time.time() if now is None else now
    wall = max(0.0, (ended if ended is not None else now) - started)
    rows = []
    for marks in attempts:
        trained, redone = marks.trained(now), marks.redone()
        paused = [item.total for item in replacements if item.attempt == marks.attempt]
        redone = None if redone is None or None in paused else redone + sum(value for value in paused if value is not None)
        productive = None if trained is None or redone is None else max(0.0, trained - redone)
        rows.append(AttemptGoodput(marks.attempt, marks.outcome, trained, redone, productive))
    known = [row.productive for row in rows]
    productive = sum(value for value in known if value is not None) if rows and None not in known else None
    ratio = productive / wall if productive is not None and wall > 0 else None
    recoveries = tuple(recovery(marks, following) for marks, following in zip(attempts, attempts[1:]) if marks.fault is not None)
    return Goodput(wall, productive, ratio, tuple(rows), recoveries, tuple(replacements))


def seconds(value: float | None) -> str:
    """``12.3 s``, or ``unknown`` for a mark that was not recorded."""
    return "unknown" if value is None else f"{value:.1f} s"


def render(goodput: Goodput) -> list[str]:
    """The lines ``status`` shows: the goodput, then one line per recovery with its phases; none when nothing
    is known (a job whose script has no smddp process group, and no recovery)."""
    if goodput.productive is None and not goodput.recoveries and not goodput.replacements:
        return []
    ratio = "unknown" if goodput.ratio is None else f"{goodput.ratio * 100:.1f} %"
    lines = [f"goodput {ratio}: productive training {seconds(goodput.productive)} of {seconds(goodput.wall)}"]
    for item in goodput.recoveries:
        phases = ", ".join(f"{name.replace('_', ' ')} {seconds(value)}" for name, value in item.phases().items())
        lines.append(f"recovery after attempt {item.attempt} ({item.outcome}): {seconds(item.total)} to training again "
                     f"({phases}); work redone {seconds(item.redone)}")
    for replaced in goodput.replacements:
        phases = ", ".join(f"{'state transfer' if name == 'transfer' else name} {seconds(value)}" for name, value in replaced.phases().items())
        lines.append(f"{replaced.host} replaced alone in attempt {replaced.attempt}, the others training on: {seconds(replaced.total)} "
                     f"to training again ({phases}); no completed step redone")
    return lines


def from_record(record: Mapping[str, Any], now: float | None = None) -> Goodput | None:
    """The goodput of a job from its record: ``started`` and ``ended`` (None while it runs), ``attempts``
    (the ended ones, each an ``AttemptMarks`` as JSON) and, while one runs, ``attempt``, ``attempt_started``
    and ``marks``: ``state.json`` of a local or docker job, or what the Slurm scheduler reads alike. None
    before the job started."""
    started = record.get("started")
    if not isinstance(started, (int, float)):
        return None
    items = [AttemptMarks.from_json(item) for item in record.get("attempts") or () if isinstance(item, Mapping)]
    running = record.get("attempt_started")
    if record.get("ended") is None and isinstance(running, (int, float)) and not any(item.attempt == record.get("attempt") for item in items):
        marks = record.get("marks") if isinstance(record.get("marks"), Mapping) else {}
        items.append(AttemptMarks.from_json({**marks, "attempt": record.get("attempt", len(items) + 1), "started": running, "ended": None}))
    ended = record.get("ended")
    replaced = [Replacement.from_json(item) for item in record.get("replacements") or () if isinstance(item, Mapping)]
    return compute(items, started=float(started), ended=float(ended) if isinstance(ended, (int, float)) else None, now=now, replacements=replaced)
